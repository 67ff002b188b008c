//! Redis behind Sentinel (`redis+sentinel://`): a master, a replica and three Sentinels of the
//! test's own on loopback. The master is killed during a workload: the service follows the
//! failover, no stale write is accepted, and allocations resume.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // tests

mod common;

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::require_env;
use palisade_conformance::servers::RedisSentinels;
use palisade_core::{ErrorKind, LockOptions, LockService, LockServiceExt, ResourceKey};
use palisade_redis::RedisLockService;

fn sentinels() -> RedisSentinels {
    RedisSentinels::start(&require_env("PALISADE_REDIS_SERVER")).expect("master, replica and three sentinels")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_is_replaced_and_no_stale_write_is_accepted() {
    let mut group = sentinels();
    let old_master = group.master_port();
    let key = ResourceKey::new("sentinel", "stock").unwrap();
    let recovered = common::allocations_survive(&group.url(), &key, || group.kill_master()).await;
    assert_ne!(group.master_port(), old_master, "the Sentinels promoted the replica");
    println!("sentinel: allocations resumed {:.2} s after the master was killed", recovered.as_secs_f64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acknowledgement_is_waited_for_and_reported_when_missing() {
    let group = sentinels();
    let key = ResourceKey::new("sentinel", "acks").unwrap();
    let options = LockOptions::ttl(Duration::from_secs(5)).wait(Duration::ZERO);
    let one = Arc::new(
        RedisLockService::connect(&format!("{}?wait_replicas=1&wait_timeout_ms=2000", group.url())).await.unwrap(),
    );
    let lease = one.lock(&key, options).await.expect("one replica acknowledges");
    lease.release().await.unwrap();
    let two = Arc::new(
        RedisLockService::connect(&format!("{}?wait_replicas=2&wait_timeout_ms=200", group.url())).await.unwrap(),
    );
    let e = two.lock(&key, options).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("reached 1 of 2 replicas"), "{e}");
    assert!(e.is_retryable());
    // The unacknowledged grant was released: the lock is free at once.
    let again = one.lock(&key, options).await.expect("the unacknowledged grant was released");
    again.release().await.unwrap();
    assert_eq!(two.backend(), "redis");
}
