//! Waiting on etcd: what a wait given up by its caller leaves on the server.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::net::SocketAddr;
use std::time::Duration;

use palisade_conformance::{FaultProxy, require_env};
use palisade_core::{LockService, ResourceKey, Ttl};
use palisade_etcd::EtcdLockService;
use tokio::time::Instant;

/// `acquire_any` dropped while the reply to its round's txn is on its way (a semaphore's wait
/// under a caller's timeout): the put landed on a free key, nobody holds the grant, and the key
/// must come free within its TTL, not stay held on the session lease for as long as the client
/// lives.
#[tokio::test]
async fn an_acquire_any_dropped_while_its_reply_is_late_leaves_no_key_behind() {
    let url = require_env("PALISADE_ETCD_URL");
    let upstream: SocketAddr = url.trim_start_matches("etcd://").split(',').next().unwrap().parse().unwrap();
    let proxy = FaultProxy::start(upstream).await.unwrap();
    let slow = EtcdLockService::connect(&format!("etcd://{}", proxy.addr())).await.unwrap();
    let fast = EtcdLockService::connect(&url).await.unwrap();
    let run = std::process::id();
    let keys = [
        ResourceKey::new("wait", format!("late-a-{run}")).unwrap(),
        ResourceKey::new("wait", format!("late-b-{run}")).unwrap(),
    ];
    let ttl = Ttl::new(Duration::from_secs(1)).unwrap();

    proxy.delay_replies(Duration::from_millis(1500));
    let gave_up =
        tokio::time::timeout(Duration::from_millis(500), slow.acquire_any(&keys, ttl, Duration::from_secs(5))).await;
    assert!(gave_up.is_err(), "the reply was due 1.5 s late, yet acquire_any answered: {gave_up:?}");
    proxy.no_delay();

    // The TTL, the session's expiry margin is not needed: nobody holds a grant.
    let deadline = Instant::now() + ttl.get() * 3;
    loop {
        if let Some(grant) = fast.try_acquire(&keys[0], ttl).await.unwrap() {
            fast.release(&grant).await.unwrap();
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} is still held {:?} after the acquire_any that took it was dropped: its put stays on the client's session lease",
            keys[0],
            ttl.get() * 3
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(slow);
}
