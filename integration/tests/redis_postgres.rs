//! Redis + PostgreSQL, the incident's architecture, against real servers (started by
//! `scripts/test`): the end-to-end conformance suite, the incident's SIGSTOP and SIGKILL chaos tests on real `warehouse allocate` processes, and a Redis restart that loses
//! every fence counter.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

mod common;

use palisade::LockOptions;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Allocator, last_json, run, setup_sku, unique_sku};
use nix::sys::signal::{Signal, kill};
use palisade::postgres::PostgresStore;
use palisade::redis::RedisLockService;
use palisade::{ErrorKind, FencedStore, FencedStoreExt, LockServiceExt, REGRESSION_GAP, ResourceKey, WriteBatch};
use palisade_conformance::{FencedStoreFactory, LockServiceFactory, require_env};
use palisade_lab::servers::LoopbackServer;

fn redis() -> impl LockServiceFactory<Service = RedisLockService> {
    palisade_redis::conformance::service()
}

fn postgres() -> impl FencedStoreFactory<Store = PostgresStore> {
    palisade_postgres::conformance::store()
}

palisade_conformance::certify!(redis_with_postgres: pairing, lock_service = redis(), store = postgres());

fn urls() -> (String, String) {
    (require_env("PALISADE_REDIS_URL"), require_env("PALISADE_POSTGRES_URL"))
}

/// The incident's chaos test: a real holder process is frozen with SIGSTOP past its TTL; a second
/// process allocates; the first is thawed and its write is refused (exit 3). Inventory shows
/// exactly one decrement and the audit table no duplicate.
#[test]
fn sigstop_holder_is_refused_after_it_thaws() {
    let (lock, store) = urls();
    let sku = unique_sku("STOP");
    setup_sku(&lock, &store, &sku, "10");

    let mut a = Allocator::start(&lock, &store, &sku, 1000, 3000);
    let acquired = a.next_event();
    assert_eq!(acquired["event"], "acquired");
    kill(a.pid(), Signal::SIGSTOP).unwrap();
    std::thread::sleep(Duration::from_millis(1300));

    let b = run(&["allocate", "--lock", &lock, "--store", &store, "--sku", &sku, "--ttl-ms", "5000"]);
    assert_eq!(b.status.code(), Some(0), "{}", String::from_utf8_lossy(&b.stderr));
    assert!(last_json(&b)["fence"].as_u64() > acquired["fence"].as_u64());

    kill(a.pid(), Signal::SIGCONT).unwrap();
    let wrote = a.next_event();
    let status = a.child.wait().unwrap();
    assert_eq!(status.code(), Some(3), "the thawed holder must be refused: {wrote}");
    assert_eq!(wrote["applied"], false);
    assert_eq!(wrote["reason"], "stale_fence");

    let shown = last_json(&run(&["show", "--store", &store, "--sku", &sku]));
    assert_eq!(shown["qty"], 9, "exactly one decrement: {shown}");
    assert_eq!(shown["allocations"], 1, "{shown}");
    assert_eq!(shown["duplicate_jobs"], 0, "{shown}");
}

/// SIGKILL of the holder: the next process completes within the TTL plus one acquisition.
#[test]
fn sigkill_holder_is_replaced_within_ttl() {
    let (lock, store) = urls();
    let sku = unique_sku("KILL");
    setup_sku(&lock, &store, &sku, "10");
    let mut a = Allocator::start(&lock, &store, &sku, 1000, 30_000);
    assert_eq!(a.next_event()["event"], "acquired");
    let killed = Instant::now();
    kill(a.pid(), Signal::SIGKILL).unwrap();
    let _ = a.child.wait();
    let b = run(&["allocate", "--lock", &lock, "--store", &store, "--sku", &sku, "--ttl-ms", "5000"]);
    let took = killed.elapsed();
    assert_eq!(b.status.code(), Some(0), "{}", String::from_utf8_lossy(&b.stderr));
    // TTL 1 s, plus process start-up and one acquisition; generous for a loaded CI machine.
    assert!(took < Duration::from_millis(1000 + 2000), "next holder took {took:?}");
    let shown = last_json(&run(&["show", "--store", &store, "--sku", &sku]));
    assert_eq!(shown["qty"], 9);
}

/// A Redis of the test's own, restarted without persistence between two grants: every fence
/// counter restarts at 1. The store refuses the low fences; `lock_checked` notices the
/// regression, moves the counter past the watermark plus the gap, and writes succeed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_without_persistence_is_detected_and_repaired() {
    let mut redis_server = LoopbackServer::redis(&require_env("PALISADE_REDIS_SERVER"), &[]).unwrap();
    let url = redis_server.redis_url();
    let store = PostgresStore::connect(&require_env("PALISADE_POSTGRES_URL")).await.unwrap();
    let key = ResourceKey::new("regress", unique_sku("R")).unwrap();
    let record = format!("regress/{}", key.id());
    let ttl = Duration::from_secs(5);

    let locks = Arc::new(RedisLockService::connect(&url).await.unwrap());
    for _ in 0..3 {
        let lease = locks.lock_checked(&store, &key, LockOptions::ttl(ttl).wait(ttl)).await.unwrap();
        store.write(&lease, &WriteBatch::new().put(record.clone(), lease.fence().to_string())).await.unwrap();
        lease.release().await.unwrap();
    }
    let watermark = store.watermark(&key).await.unwrap().unwrap();
    assert_eq!(watermark.get(), 3);

    // Restart without persistence: the counter is gone.
    redis_server.restart().unwrap();
    let locks = Arc::new(RedisLockService::connect(&url).await.unwrap());

    let naive = locks.lock(&key, LockOptions::ttl(ttl).wait(ttl)).await.unwrap();
    assert_eq!(naive.fence().get(), 1, "the counter restarted");
    let err = store.write(&naive, &WriteBatch::new().put(record.clone(), b"stale".to_vec())).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::StaleFence { .. }), "no stale write is accepted: {err}");
    naive.release().await.unwrap();

    let lease = locks.lock_checked(&store, &key, LockOptions::ttl(ttl).wait(ttl)).await.unwrap();
    assert!(lease.fence().get() > watermark.get() + REGRESSION_GAP, "fence {} after repair", lease.fence());
    store.write(&lease, &WriteBatch::new().put(record.clone(), b"after".to_vec())).await.unwrap();
    assert_eq!(store.read(&record).await.unwrap().unwrap().value, b"after");
    lease.release().await.unwrap();
}

/// Issue 16.2 against real servers: Redis loses only the tail of a counter (a failover to a
/// lagging replica, `appendfsync everysec`). Grants 2–5 were issued and not written; the counter
/// comes back at 2, so the next grant is 3 again, above the watermark 1: `lock_checked` cannot
/// see it. The old holder of 3 writes first; PostgreSQL refuses the new holder's 3 as a
/// duplicate (another grant), the write moves the counter past the gap, and the next grant
/// outranks the old 5 that is still in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_losing_the_tail_of_a_counter_is_refused_as_a_duplicate_and_repaired() {
    let url = require_env("PALISADE_REDIS_URL");
    let store = PostgresStore::connect(&require_env("PALISADE_POSTGRES_URL")).await.unwrap();
    let key = ResourceKey::new("regress", unique_sku("TAIL")).unwrap();
    let record = format!("regress/{}", key.id());
    let (short, ttl) = (Duration::from_millis(50), Duration::from_secs(5));
    let locks = Arc::new(RedisLockService::connect(&url).await.unwrap());

    let first = locks.lock_checked(&store, &key, LockOptions::ttl(short).wait(ttl)).await.unwrap();
    assert_eq!(first.fence().get(), 1);
    store.write(&first, &WriteBatch::new().put(record.clone(), b"1".to_vec())).await.unwrap();
    let mut in_flight = Vec::new();
    for _ in 2..=5 {
        tokio::time::sleep(short * 2).await; // the previous holder paused past its TTL
        in_flight.push(locks.lock(&key, LockOptions::ttl(short).wait(ttl)).await.unwrap());
    }
    assert_eq!(in_flight.iter().map(|l| l.fence().get()).collect::<Vec<_>>(), [2, 3, 4, 5]);
    tokio::time::sleep(short * 2).await;

    // The counter loses its tail: back at 2.
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("SET").arg(key.fence_key()).arg(2).query_async(&mut raw).await.unwrap();

    let new_3 = locks.lock_checked(&store, &key, LockOptions::ttl(ttl).wait(ttl)).await.unwrap();
    assert_eq!(new_3.fence().get(), 3, "above the watermark 1: no check at acquire time can see it");
    store.write(&in_flight[1], &WriteBatch::new().put(record.clone(), b"old 3".to_vec())).await.unwrap();
    let err = store.write(&new_3, &WriteBatch::new().put(record.clone(), b"new 3".to_vec())).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DuplicateFence { fence: new_3.fence() }, "{err}");
    assert_eq!(store.read(&record).await.unwrap().unwrap().value, b"old 3");
    new_3.release().await.unwrap();

    let fresh = locks.lock_checked(&store, &key, LockOptions::ttl(ttl).wait(ttl)).await.unwrap();
    assert!(fresh.fence().get() > 3 + REGRESSION_GAP, "fence {} after the repair", fresh.fence());
    store.write(&fresh, &WriteBatch::new().put(record.clone(), b"fresh".to_vec())).await.unwrap();
    let err = store.write(&in_flight[3], &WriteBatch::new().put(record.clone(), b"old 5".to_vec())).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::StaleFence { .. }), "the old grant 5 is stale now: {err}");
    assert_eq!(store.read(&record).await.unwrap().unwrap().value, b"fresh");
    fresh.release().await.unwrap();
}
