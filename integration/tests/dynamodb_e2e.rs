//! The DynamoDB store end to end against real servers (started by `scripts/test`): with the
//! Redis and the etcd lock services through the end-to-end suite, the incident's SIGSTOP test on
//! real `warehouse allocate --store dynamodb://…` processes, and the warehouse `simulate`
//! fenced vs unfenced.
//!
//! The DynamoDB-API server is moto, one request at a time (`scripts/lib/moto_serial.py`):
//! slow, so each test uses a table of its own and the load scenario asks less of it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Allocator, last_json, run, setup_sku, unique_sku};
use nix::sys::signal::{Signal, kill};
use palisade::dynamodb::DynamoStore;
use palisade::etcd::EtcdLockService;
use palisade::redis::RedisLockService;
use palisade_conformance::{FencedStoreFactory, LockServiceFactory, Timing, lock_factory, require_env};

fn endpoint() -> String {
    require_env("PALISADE_DYNAMODB_ENDPOINT")
}

fn dynamodb(tag: &str) -> impl FencedStoreFactory<Store = DynamoStore> + use<> {
    palisade_dynamodb::conformance::store(format!("e2e-{tag}-{}", palisade_conformance::test_process_id()))
}

/// 500 ms grants: moto answers one request at a time.
fn redis() -> impl LockServiceFactory<Service = RedisLockService> {
    let url = require_env("PALISADE_REDIS_URL");
    lock_factory(Timing::new(Duration::from_millis(500), Duration::from_millis(50)), move || {
        let url = url.clone();
        async move { Ok(Arc::new(RedisLockService::connect(&url).await?)) }
    })
}

fn etcd() -> impl LockServiceFactory<Service = EtcdLockService> {
    palisade_etcd::conformance::service()
}

palisade_conformance::certify!(redis_with_dynamodb: pairing, lock_service = redis(), store = dynamodb("redis"));
palisade_conformance::certify!(etcd_with_dynamodb: pairing, lock_service = etcd(), store = dynamodb("etcd"));

fn store_url(tag: &str) -> String {
    format!("dynamodb://wh-{tag}-{}?endpoint={}&region=us-east-1", std::process::id(), endpoint())
}

/// The incident's chaos test with DynamoDB as the store: a real holder process frozen past its TTL
/// (Redis lock), a second process allocates, the thawed one is refused (exit 3); one decrement,
/// no duplicate.
#[test]
fn sigstop_holder_is_refused_by_dynamodb_after_it_thaws() {
    let (lock, store) = (require_env("PALISADE_REDIS_URL"), store_url("stop"));
    let sku = unique_sku("DSTOP");
    setup_sku(&lock, &store, &sku, "10");
    let mut a = Allocator::start(&lock, &store, &sku, 1000, 3000);
    let acquired = a.next_event();
    assert_eq!(acquired["event"], "acquired");
    let pid = a.pid();
    kill(pid, Signal::SIGSTOP).unwrap();
    std::thread::sleep(Duration::from_millis(1300));

    let b = run(&["allocate", "--lock", &lock, "--store", &store, "--sku", &sku, "--ttl-ms", "10000"]);
    assert_eq!(b.status.code(), Some(0), "{}", String::from_utf8_lossy(&b.stderr));
    assert!(last_json(&b)["fence"].as_u64() > acquired["fence"].as_u64());

    kill(pid, Signal::SIGCONT).unwrap();
    let wrote = a.next_event();
    let status = a.child.wait().unwrap();
    assert_eq!(status.code(), Some(3), "the thawed holder must be refused: {wrote}");
    assert_eq!(wrote["reason"], "stale_fence");

    let shown = last_json(&run(&["show", "--store", &store, "--sku", &sku]));
    assert_eq!(shown["qty"], 9, "exactly one decrement: {shown}");
    assert_eq!(shown["allocations"], 1, "{shown}");
    assert_eq!(shown["duplicate_jobs"], 0, "{shown}");
}

/// The warehouse benchmark on DynamoDB: pauses past the TTL, fenced vs `--unfenced`.
#[test]
fn simulate_on_dynamodb_fenced_has_no_duplicates_and_unfenced_does() {
    let simulate = |tag: &str, extra: &[&str]| {
        let store = store_url(tag);
        let mut args = vec!["simulate", "--store", &store, "--jobs", "160", "--workers", "4", "--skus", "4"];
        args.extend_from_slice(&["--ttl-ms", "1000", "--pause-every", "20", "--pause-ms", "2100", "--json"]);
        args.extend_from_slice(extra);
        let out = run(&args);
        (out.status.code(), last_json(&out))
    };
    let (code, fenced) = simulate("simf", &[]);
    assert_eq!(code, Some(0), "{fenced}");
    assert_eq!(fenced["duplicates"], 0, "{fenced}");
    assert!(fenced["fence_rejected"].as_u64().unwrap() > 0, "pauses past the TTL must be refused: {fenced}");
    let (code, unfenced) = simulate("simu", &["--unfenced"]);
    assert_eq!(code, Some(0), "{unfenced}");
    assert!(unfenced["duplicates"].as_u64().unwrap() > 0, "the naive lock ships twice: {unfenced}");
    eprintln!("dynamodb simulate: fenced {fenced}\nunfenced {unfenced}");
}
