//! Redis Cluster (`redis+cluster://`): three primaries with a replica each, of the test's own
//! on loopback. A primary killed during a workload is replaced by its replica without a stale
//! write accepted. (The lock service's scenarios run on the shared cluster, through its
//! certification in `conformance.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // tests

mod common;

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::require_env;
use palisade_core::{LockOptions, LockServiceExt, ResourceKey};
use palisade_lab::servers::RedisCluster;
use palisade_redis::RedisLockService;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_replaced_without_a_stale_write() {
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

    let key = ResourceKey::new("cluster", "stock").unwrap();
    let lock_key = key.lock_key();
    let mut killed = None;
    let recovered = common::allocations_survive(&url, &key, || killed = Some(cluster.kill_primary_of(&lock_key))).await;
    assert!(killed.as_ref().is_some_and(Result::is_ok), "the primary was killed: {killed:?}");
    assert!(cluster.ok(), "the cluster is ok again without the killed primary");
    println!("cluster: allocations resumed {:.2} s after the resource's primary was killed", recovered.as_secs_f64());
}

/// Release notifications survive the death of the node they were heard on (issue 33, item 9):
/// the first seed, where a service subscribed, is killed and its address black-holed; the
/// waiter's service subscribes on another node, and handoffs go by notification instead of
/// each contended acquire waiting for a subscription to the dead seed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_notifications_survive_the_first_seeds_death() {
    let mut cluster = RedisCluster::start(&require_env("PALISADE_REDIS_SERVER")).expect("a 3-primary cluster");
    let url = cluster.url();
    let seeds: Vec<std::net::SocketAddr> =
        url.trim_start_matches("redis+cluster://").split(',').map(|s| s.parse().unwrap()).collect();
    let holder = RedisLockService::connect(&url).await.unwrap();
    let waiter = Arc::new(RedisLockService::connect(&url).await.unwrap());
    // A key on the first primary's slots (0 to 5460): killing its primary kills the first seed.
    let key = (0..)
        .map(|i| ResourceKey::new("cluster", format!("handoff{i}")).unwrap())
        .find(|k| {
            let reply = std::process::Command::new("redis-cli")
                .args(["-p", &seeds[0].port().to_string(), "CLUSTER", "KEYSLOT", &k.lock_key()])
                .output()
                .unwrap();
            String::from_utf8_lossy(&reply.stdout).trim().parse::<u32>().unwrap() < 5461
        })
        .unwrap();
    common::handoff(&holder, &waiter, &key).await; // the waiter's service subscribes on the first seed
    assert_eq!(cluster.kill_primary_of(&key.lock_key()).unwrap(), seeds[0].port());
    let hole = common::black_hole(seeds[0]).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !cluster.ok() {
        assert!(tokio::time::Instant::now() < deadline, "the cluster did not recover in 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    common::handoff(&holder, &waiter, &key).await; // both services follow the promoted replica

    let mut handoffs = Vec::new();
    for _ in 0..3 {
        handoffs.push(common::handoff(&holder, &waiter, &key).await);
    }
    let mut patterns = 0;
    for seed in &seeds[1..] {
        let client = redis::Client::open(format!("redis://{seed}")).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        patterns += redis::cmd("PUBSUB").arg("NUMPAT").query_async::<i64>(&mut conn).await.unwrap();
    }
    hole.abort();
    println!("after the first seed's death: handoffs took {handoffs:?} from release to grant");
    assert_eq!(patterns, 1, "the waiter's release subscription is on no live seed");
    let total: Duration = handoffs.iter().sum();
    assert!(total < Duration::from_millis(1500), "three handoffs took {handoffs:?} from release to grant");
}
