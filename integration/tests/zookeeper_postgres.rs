//! ZooKeeper + PostgreSQL against real servers (started by `scripts/test`): the end-to-end
//! scenarios (a pairing certification) and SIGSTOP and SIGKILL of real `warehouse allocate
//! --lock zk://…` processes. The leader-kill scenario is ZooKeeper's own certification's.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

mod common;

use std::time::{Duration, Instant};

use common::{Allocator, last_json, run, setup_sku, unique_sku};
use nix::sys::signal::{Signal, kill};
use palisade::postgres::PostgresStore;
use palisade::zookeeper::ZkLockService;
use palisade_conformance::{FencedStoreFactory, LockServiceFactory, require_env};

fn zookeeper() -> impl LockServiceFactory<Service = ZkLockService> {
    palisade_zookeeper::conformance::service()
}

fn postgres() -> impl FencedStoreFactory<Store = PostgresStore> {
    palisade_postgres::conformance::store()
}

palisade_conformance::certify!(zookeeper_with_postgres: pairing, lock_service = zookeeper(), store = postgres());

/// The warehouse processes' session timeout: how long after a process stops its lock goes.
const SESSION_MS: u64 = 2000;

fn urls() -> (String, String) {
    (
        format!("{}?session_timeout_ms={SESSION_MS}", require_env("PALISADE_ZK_URL")),
        require_env("PALISADE_POSTGRES_URL"),
    )
}

/// A frozen holder stops heartbeating, the ensemble expires its session and deletes its node,
/// a second process allocates; the thawed one is refused (exit 3).
#[test]
fn sigstop_holder_is_refused_after_it_thaws() {
    let (lock, store) = urls();
    let sku = unique_sku("ZSTOP");
    setup_sku(&lock, &store, &sku, "10");
    let mut a = Allocator::start(&lock, &store, &sku, 1000, 3000);
    let acquired = a.next_event();
    assert_eq!(acquired["event"], "acquired");
    let pid = a.pid();
    kill(pid, Signal::SIGSTOP).unwrap();
    let b =
        run(&["allocate", "--lock", &lock, "--store", &store, "--sku", &sku, "--ttl-ms", "5000", "--wait-ms", "15000"]);
    assert_eq!(b.status.code(), Some(0), "{}", String::from_utf8_lossy(&b.stderr));
    assert!(last_json(&b)["fence"].as_u64() > acquired["fence"].as_u64());
    kill(pid, Signal::SIGCONT).unwrap();
    let wrote = a.next_event();
    assert_eq!(a.child.wait().unwrap().code(), Some(3), "the thawed holder must be refused: {wrote}");
    assert_eq!(wrote["reason"], "stale_fence");
    let shown = last_json(&run(&["show", "--store", &store, "--sku", &sku]));
    assert_eq!(shown["qty"], 9, "exactly one decrement: {shown}");
    assert_eq!(shown["duplicate_jobs"], 0, "{shown}");
}

/// SIGKILL of the holder: the next process completes within the session timeout plus the
/// server's expiry tick plus start-up and one acquisition.
#[test]
fn sigkill_holder_is_replaced_within_the_session_timeout() {
    let (lock, store) = urls();
    let sku = unique_sku("ZKILL");
    setup_sku(&lock, &store, &sku, "10");
    let mut a = Allocator::start(&lock, &store, &sku, 1000, 30_000);
    assert_eq!(a.next_event()["event"], "acquired");
    let killed = Instant::now();
    kill(a.pid(), Signal::SIGKILL).unwrap();
    let _ = a.child.wait();
    let b =
        run(&["allocate", "--lock", &lock, "--store", &store, "--sku", &sku, "--ttl-ms", "5000", "--wait-ms", "15000"]);
    let took = killed.elapsed();
    assert_eq!(b.status.code(), Some(0), "{}", String::from_utf8_lossy(&b.stderr));
    assert!(took < Duration::from_millis(SESSION_MS + 500 + 3000), "next holder took {took:?}");
}
