//! etcd + PostgreSQL against real servers (started by `scripts/test`): the end-to-end
//! conformance suite, SIGSTOP and SIGKILL of real `warehouse allocate` processes holding an
//! etcd lock, and an etcd that lost its data (revisions restart low).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

mod common;

use palisade::LockOptions;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Allocator, last_json, run, setup_sku, unique_sku};
use nix::sys::signal::{Signal, kill};
use palisade::etcd::EtcdLockService;
use palisade::postgres::PostgresStore;
use palisade::{ErrorKind, FencedStore, FencedStoreExt, LockServiceExt, ResourceKey, WriteBatch};
use palisade_conformance::{FencedStoreFactory, LockServiceFactory, require_env};
use palisade_lab::servers::{LoopbackServer, Restart};

fn etcd() -> impl LockServiceFactory<Service = EtcdLockService> {
    palisade_etcd::conformance::service()
}

fn postgres() -> impl FencedStoreFactory<Store = PostgresStore> {
    palisade_postgres::conformance::store()
}

palisade_conformance::certify!(etcd_with_postgres: pairing, lock_service = etcd(), store = postgres());

/// The session TTL the warehouse processes use: how long after a process stops its lock goes.
const SESSION_S: u64 = 2;

fn urls() -> (String, String) {
    (format!("{}?session_ttl_s={SESSION_S}", require_env("PALISADE_ETCD_URL")), require_env("PALISADE_POSTGRES_URL"))
}

/// The incident's chaos test on etcd: a frozen holder stops its keep-alive, the server expires its
/// session, a second process allocates; the first is thawed and its write is refused (exit 3).
#[test]
fn sigstop_holder_is_refused_after_it_thaws() {
    let (lock, store) = urls();
    let sku = unique_sku("ESTOP");
    setup_sku(&lock, &store, &sku, "10");

    let mut a = Allocator::start(&lock, &store, &sku, 1000, 3000);
    let acquired = a.next_event();
    assert_eq!(acquired["event"], "acquired");
    kill(a.pid(), Signal::SIGSTOP).unwrap();
    let frozen = Instant::now();

    // B waits for the lock: it comes free when A's session expires on the server.
    let b =
        run(&["allocate", "--lock", &lock, "--store", &store, "--sku", &sku, "--ttl-ms", "5000", "--wait-ms", "15000"]);
    let waited = frozen.elapsed();
    assert_eq!(b.status.code(), Some(0), "{}", String::from_utf8_lossy(&b.stderr));
    assert!(last_json(&b)["fence"].as_u64() > acquired["fence"].as_u64());
    assert!(waited >= Duration::from_millis(900), "B got the lock {waited:?} after A froze: before its grant ran out");

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

/// SIGKILL of the holder: its session stops; the next process completes within the session
/// TTL plus etcd's expiry check plus one acquisition.
#[test]
fn sigkill_holder_is_replaced_within_the_session_ttl() {
    let (lock, store) = urls();
    let sku = unique_sku("EKILL");
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
    // Session 2 s + etcd's 500 ms expiry sweep + process start-up and one acquisition;
    // generous for a loaded CI machine.
    assert!(took < Duration::from_millis(SESSION_S * 1000 + 500 + 2500), "next holder took {took:?}");
    let shown = last_json(&run(&["show", "--store", &store, "--sku", &sku]));
    assert_eq!(shown["qty"], 9);
}

/// An etcd of the test's own loses its data (as a cluster restored from a snapshot without
/// `--bump-revision` would): revisions restart low. The store refuses the low fences, and
/// `lock_checked` repairs the regression by itself: it raises the service's epoch past the
/// store's watermark, and the next grant writes (issue 35: no operator action).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_losing_its_data_is_repaired_and_no_stale_write_is_accepted() {
    let mut server = LoopbackServer::etcd(&require_env("PALISADE_ETCD_SERVER")).unwrap();
    let url = format!("{}?session_ttl_s=5", server.etcd_url());
    let store = PostgresStore::connect(&require_env("PALISADE_POSTGRES_URL")).await.unwrap();
    let key = ResourceKey::new("eregress", unique_sku("R")).unwrap();
    let record = format!("eregress/{}", key.id());
    let ttl = Duration::from_secs(3);

    let locks = Arc::new(EtcdLockService::connect(&url).await.unwrap());
    // Move the revision well up, as a busy cluster would.
    let mut kv = locks.client().kv_client();
    for i in 0..60 {
        kv.put(format!("filler/{i}"), "x", None).await.unwrap();
    }
    for _ in 0..3 {
        let lease = locks.lock_checked(&store, &key, LockOptions::ttl(ttl).wait(ttl)).await.unwrap();
        store.write(&lease, &WriteBatch::new().put(record.clone(), lease.fence().to_string())).await.unwrap();
        lease.release().await.unwrap();
    }
    let watermark = store.watermark(&key).await.unwrap().unwrap();
    assert!(watermark.get() > 60, "watermark {watermark}");
    drop(locks);

    server.wipe_and_restart().unwrap();
    server.wait_etcd_healthy().unwrap();
    let locks = Arc::new(EtcdLockService::connect(&url).await.unwrap());

    let naive = locks.lock(&key, LockOptions::ttl(ttl).wait(ttl)).await.unwrap();
    assert!(naive.fence() < watermark, "revisions restarted low: {} vs {watermark}", naive.fence());
    let err = store.write(&naive, &WriteBatch::new().put(record.clone(), b"stale".to_vec())).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::StaleFence { .. }), "no stale write is accepted: {err}");
    naive.release().await.unwrap();

    let repaired_at = std::time::Instant::now();
    let lease = locks.lock_checked(&store, &key, LockOptions::ttl(ttl).wait(ttl)).await.unwrap();
    assert!(lease.fence() > watermark, "the repaired fence {} is above the watermark {watermark}", lease.fence());
    store.write(&lease, &WriteBatch::new().put(record.clone(), b"after".to_vec())).await.unwrap();
    println!("etcd wiped: a holder wrote {:?} after lock_checked began", repaired_at.elapsed());
    assert_eq!(store.read(&record).await.unwrap().unwrap().value, b"after");
    lease.release().await.unwrap();
}

/// An etcd of the test's own restored from a snapshot taken a few writes ago (a partial loss):
/// its revisions go back a little, still above the store's watermark for grants that never
/// wrote, so `lock_checked` sees nothing wrong, and the first grant after the restore reuses
/// the revision of a grant made before it (P's, which holds on, paused, and has not written).
/// The store refuses the second writer of that fence (`DuplicateFence`), `FencedStoreExt::write`
/// raises the service's epoch, and the next holder's fence is above every accepted one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restored_from_an_older_snapshot_reuses_no_accepted_fence() {
    let mut server = LoopbackServer::etcd(&require_env("PALISADE_ETCD_SERVER")).unwrap();
    let url = format!("{}?session_ttl_s=5", server.etcd_url());
    let store = PostgresStore::connect(&require_env("PALISADE_POSTGRES_URL")).await.unwrap();
    let key = ResourceKey::new("erestore", unique_sku("R")).unwrap();
    let record = format!("erestore/{}", key.id());
    let ttl = Duration::from_secs(20);
    let options = LockOptions::ttl(ttl).wait(Duration::from_secs(10));

    let locks = Arc::new(EtcdLockService::connect(&url).await.unwrap());
    let first = locks.lock_checked(&store, &key, options).await.unwrap();
    store.write(&first, &WriteBatch::new().put(record.clone(), b"first".to_vec())).await.unwrap();
    first.release().await.unwrap();
    drop(locks);

    server.restart_as(Restart::Snapshot).unwrap();
    server.wait_etcd_healthy().unwrap();
    // P: the first grant after the snapshot; it holds on without writing (paused).
    let p_locks = Arc::new(EtcdLockService::connect(&url).await.unwrap());
    let p = p_locks.lock_checked(&store, &key, options).await.unwrap();

    server.restart_as(Restart::FromSnapshot).unwrap();
    server.wait_etcd_healthy().unwrap();
    // N: the first grant after the restore, at the same revision as P's.
    let n_locks = Arc::new(EtcdLockService::connect(&url).await.unwrap());
    let started = Instant::now();
    let n = n_locks.lock_checked(&store, &key, options).await.unwrap();
    assert_eq!(n.fence(), p.fence(), "the restore hands out P's revision again (the shape under test)");
    store.write(&n, &WriteBatch::new().put(record.clone(), b"N".to_vec())).await.unwrap();

    // P wakes: its fence equals the watermark but another grant set it.
    let err = store.write(&p, &WriteBatch::new().put(record.clone(), b"P".to_vec())).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::DuplicateFence { .. }), "{err}");
    assert_eq!(store.read(&record).await.unwrap().unwrap().value, b"N");
    let n_fence = n.fence();
    let n_grant = n.grant_fence();
    n.release().await.unwrap();

    // The repair `FencedStoreExt::write` made: the next holder is above every accepted fence.
    let next = n_locks.lock_checked(&store, &key, options).await.unwrap();
    assert!(next.fence() > n_fence, "{} after {n_fence}", next.fence());
    assert!(next.fence().get() >= 1 << 44, "the epoch was raised: {}", next.fence());
    store.write(&next, &WriteBatch::new().put(record.clone(), b"next".to_vec())).await.unwrap();
    println!("etcd restored from a snapshot: the next holder wrote {:?} after the restore", started.elapsed());
    assert!(store.write(&p, &WriteBatch::new().put(record.clone(), b"P2".to_vec())).await.is_err());
    let n_again = store.write_fenced(&key, n_grant, &WriteBatch::new().put(record.clone(), b"N2".to_vec())).await;
    assert!(n_again.is_err(), "N's fence after the next holder's write: {n_again:?}");
    assert_eq!(store.read(&record).await.unwrap().unwrap().value, b"next");
    next.release().await.unwrap();
    drop(p);
}
