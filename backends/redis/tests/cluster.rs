//! Redis Cluster (`redis+cluster://`): three primaries with a replica each, of the test's own
//! on loopback. The lock suite passes through the cluster client (each script sent to its
//! resource's slot), and a primary killed during a workload is replaced by its replica without
//! a stale write accepted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // tests

mod common;

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::servers::RedisCluster;
use palisade_conformance::{Timing, lock_factory, require_env};
use palisade_core::{LockOptions, LockServiceExt, ResourceKey};
use palisade_redis::RedisLockService;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_suite_passes_on_a_cluster_and_a_killed_primary_is_replaced() {
    let mut cluster = RedisCluster::start(&require_env("PALISADE_REDIS_SERVER")).expect("a 3-primary cluster");
    let url = cluster.url();

    // Resources spread over every primary's slots.
    let svc = Arc::new(RedisLockService::connect(&url).await.unwrap());
    let options = LockOptions::ttl(Duration::from_secs(5)).wait(Duration::ZERO);
    let mut fences = Vec::new();
    for i in 0..30 {
        let lease = svc.lock(&ResourceKey::new("cluster", format!("r{i}")).unwrap(), options).await.unwrap();
        fences.push(lease.fence().get());
        lease.release().await.unwrap();
    }
    assert!(fences.iter().all(|f| *f == 1), "each resource's first fence: {fences:?}");

    let factory = {
        let url = url.clone();
        lock_factory(Timing::new(Duration::from_millis(200), Duration::from_millis(50)), move || {
            let url = url.clone();
            async move { Ok(Arc::new(RedisLockService::connect(&url).await?)) }
        })
    };
    let reports = palisade_conformance::run_lock_scenarios(&factory).await.unwrap_or_else(|f| panic!("{f}"));
    println!("cluster: {} lock scenarios passed", reports.len());

    let key = ResourceKey::new("cluster", "stock").unwrap();
    let lock_key = key.lock_key();
    let mut killed = None;
    let recovered = common::allocations_survive(&url, &key, || killed = Some(cluster.kill_primary_of(&lock_key))).await;
    assert!(killed.as_ref().is_some_and(Result::is_ok), "the primary was killed: {killed:?}");
    assert!(cluster.ok(), "the cluster is ok again without the killed primary");
    println!("cluster: allocations resumed {:.2} s after the resource's primary was killed", recovered.as_secs_f64());
}
