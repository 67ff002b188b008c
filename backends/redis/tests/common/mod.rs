//! What the Sentinel and Cluster tests share: a workload through a failover, a handoff from
//! holder to waiter, a black-holed address.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout, dead_code)] // tests

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use palisade_core::{
    ErrorKind, FencedStore, FencedStoreExt, LockOptions, LockService, LockServiceExt, MemoryFencedStore, ResourceKey,
    Ttl, WriteBatch,
};
use palisade_redis::RedisLockService;
use tokio::time::Instant;

fn stock(record: Option<palisade_core::Record>) -> u64 {
    record.map_or(0, |r| String::from_utf8_lossy(&r.value).parse().unwrap())
}

/// Three workers allocate from one resource through `url` (each a read-modify-write under
/// `lock_checked`, the store the judge) while a paused holder A keeps a grant from before;
/// `kill` kills the primary that holds the resource once the workload runs. Asserts that
/// allocations resume and go on, that A's write after the failover is refused, and that every
/// accepted write was counted once; returns how long after the kill they resumed.
pub async fn allocations_survive(url: &str, key: &ResourceKey, kill: impl FnOnce()) -> Duration {
    let store = Arc::new(MemoryFencedStore::new());
    let killed = Arc::new(AtomicBool::new(false));
    let (accepted, refused, after_kill) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let first_after_kill: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();

    // A holds the lock before the kill and never renews: it is the paused holder.
    let a = Arc::new(RedisLockService::connect(url).await.unwrap());
    let lease_a = a.lock(key, LockOptions::ttl(Duration::from_secs(1)).wait(Duration::from_secs(5))).await.unwrap();

    let mut workers = Vec::new();
    for _ in 0..3 {
        let svc = Arc::new(RedisLockService::connect(url).await.unwrap());
        let (store, key) = (Arc::clone(&store), key.clone());
        let (killed, accepted, refused, after_kill) =
            (Arc::clone(&killed), Arc::clone(&accepted), Arc::clone(&refused), Arc::clone(&after_kill));
        let first_after_kill = Arc::clone(&first_after_kill);
        workers.push(tokio::spawn(async move {
            let give_up = Instant::now() + Duration::from_secs(60);
            let mut failures = Vec::new();
            while after_kill.load(Ordering::SeqCst) < 20 && Instant::now() < give_up {
                let options = LockOptions::ttl(Duration::from_secs(2)).wait(Duration::from_secs(10));
                let lease = match svc.lock_checked(&*store, &key, options).await {
                    Ok(lease) => lease,
                    Err(e) => {
                        // The master is gone until the Sentinels promote the replica.
                        failures.push(e.kind().as_str().to_string());
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let current = store.read("stock").await.unwrap();
                let next = stock(current.clone()) + 1;
                let batch = WriteBatch::new().check("stock", current.map(|r| r.value)).put("stock", next.to_string());
                match store.write(&lease, &batch).await {
                    Ok(()) => {
                        accepted.fetch_add(1, Ordering::SeqCst);
                        if killed.load(Ordering::SeqCst) {
                            first_after_kill.lock().unwrap().get_or_insert_with(Instant::now);
                            after_kill.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    // A grant the failover lost or handed out twice: the store orders it away.
                    Err(e)
                        if matches!(
                            e.kind(),
                            ErrorKind::StaleFence { .. } | ErrorKind::DuplicateFence { .. } | ErrorKind::Conflict
                        ) =>
                    {
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) => panic!("a worker's write: {e}"),
                }
                let _ = lease.release().await;
            }
            failures
        }));
    }
    // A's lock expires (it never renews), then the workers take turns for a while.
    let running = Instant::now() + Duration::from_secs(10);
    while accepted.load(Ordering::SeqCst) < 10 && Instant::now() < running {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(accepted.load(Ordering::SeqCst) >= 10, "the workload runs before the kill");
    kill();
    let kill = Instant::now();
    killed.store(true, Ordering::SeqCst);
    let mut failures = Vec::new();
    for w in workers {
        failures.extend(w.await.unwrap());
    }
    let recovered = first_after_kill.lock().unwrap().map(|t| t.duration_since(kill));
    let recovered = recovered.expect("no allocation succeeded after the master was killed");
    assert!(after_kill.load(Ordering::SeqCst) >= 20, "allocations resumed and went on");

    // The paused holder wakes long after its TTL and a failover: refused.
    let late = store.write(&lease_a, &WriteBatch::new().put("stock", "999".to_string())).await.unwrap_err();
    assert!(matches!(late.kind(), ErrorKind::StaleFence { .. } | ErrorKind::DuplicateFence { .. }), "{late}");
    let accepted = accepted.load(Ordering::SeqCst);
    assert_eq!(stock(store.read("stock").await.unwrap()), accepted, "every accepted write counted once, none lost");
    println!(
        "failover: allocations resumed {:.2} s after the primary was killed; {accepted} writes accepted, \
         {} refused by the store, {} acquisitions failed while no master answered ({failures:?})",
        recovered.as_secs_f64(),
        refused.load(Ordering::SeqCst),
        failures.len()
    );
    assert!(recovered < Duration::from_secs(30), "recovery took {recovered:?}");
    recovered
}

/// `holder` takes `key`, `waiter` starts waiting for it, and `holder` releases it 200 ms
/// later: returns how long after the release `waiter` was granted the lock. Retries the
/// holder's acquire while no master answers (a failover in progress).
pub async fn handoff(holder: &RedisLockService, waiter: &Arc<RedisLockService>, key: &ResourceKey) -> Duration {
    let ttl = Ttl::from_millis(30_000).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let held = loop {
        match holder.try_acquire(key, ttl).await {
            Ok(Some(grant)) => break grant,
            Ok(None) => panic!("{key} is held by someone else"),
            Err(e) => assert!(tokio::time::Instant::now() < deadline, "no master answers: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let waiting = {
        let (waiter, key) = (Arc::clone(waiter), key.clone());
        tokio::spawn(async move { waiter.acquire(&key, ttl, Duration::from_secs(20)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = tokio::time::Instant::now();
    holder.release(&held).await.unwrap();
    let granted = waiting.await.unwrap().expect("the waiter gets the released lock");
    let took = released.elapsed();
    waiter.release(&granted).await.unwrap();
    took
}

/// A listener on `addr` that accepts connections and never answers: a black-holed address.
pub async fn black_hole(addr: std::net::SocketAddr) -> tokio::task::JoinHandle<()> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket.bind(addr).unwrap();
    let listener = socket.listen(64).unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((connection, _)) = listener.accept().await {
            held.push(connection);
        }
    })
}
