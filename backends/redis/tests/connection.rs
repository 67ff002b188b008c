//! Connecting to Redis servers of the test's own: passwords, eviction policies, bad URLs; and
//! what the scripts do on the server (exact fences, failed increments, release notifications).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade_conformance::require_env;
use palisade_core::{ErrorKind, LockService, ResourceKey, Ttl};
use palisade_lab::servers::LoopbackServer;
use palisade_redis::{RedisConfig, RedisLockService};

/// A redis-server of the test's own, with extra arguments.
fn own_redis(extra: &[&str]) -> LoopbackServer {
    LoopbackServer::redis(&require_env("PALISADE_REDIS_SERVER"), extra).unwrap()
}

#[tokio::test]
async fn password_auth_works_and_a_wrong_password_is_refused_without_leaking_it() {
    let server = own_redis(&["--requirepass", "s3cret-pw"]);
    let good = RedisLockService::connect(&format!("redis://:s3cret-pw@127.0.0.1:{}", server.port())).await.unwrap();
    let key = ResourceKey::new("auth", "k").unwrap();
    let grant = good.try_acquire(&key, Ttl::from_millis(5000).unwrap()).await.unwrap().unwrap();
    good.release(&grant).await.unwrap();
    assert!(!format!("{good:?}").contains("s3cret-pw"));

    let err = RedisLockService::connect(&format!("redis://:wrong-pw@127.0.0.1:{}", server.port())).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(!err.to_string().contains("wrong-pw"), "the password leaked into the error: {err}");
}

#[tokio::test]
async fn an_eviction_policy_that_can_evict_fence_keys_is_refused_unless_allowed() {
    let server = own_redis(&["--maxmemory-policy", "allkeys-lru"]);
    let url = server.redis_url();
    let err = RedisLockService::connect(&url).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    assert!(err.to_string().contains("allkeys-lru"), "{err}");
    let config = RedisConfig { allow_eviction: true, ..RedisConfig::new(url) };
    RedisLockService::connect_with(config).await.unwrap();

    let noeviction = own_redis(&["--maxmemory-policy", "noeviction"]);
    RedisLockService::connect(&noeviction.redis_url()).await.unwrap();
}

/// Lock keys carry a PX expiry, so every `volatile-*` policy may evict a *held* lock
/// (`volatile-lru` picks the oldest untouched one): refused at connect. With `allow_eviction`
/// the consequence the doc warns about is real: a second client is granted the lock while the
/// first is inside its TTL (the fence key has no TTL and survives, so the store still orders
/// their writes).
#[tokio::test]
async fn volatile_policies_can_evict_held_locks_and_are_refused() {
    let server = own_redis(&["--maxmemory", "2mb", "--maxmemory-policy", "volatile-lru"]);
    let url = server.redis_url();
    let err = RedisLockService::connect(&url).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(err.to_string().contains("volatile-lru"), "{err}");

    let allowed = RedisConfig { allow_eviction: true, ..RedisConfig::new(url.clone()) };
    let first = RedisLockService::connect_with(allowed.clone()).await.unwrap();
    let second = RedisLockService::connect_with(allowed).await.unwrap();
    let key = ResourceKey::new("evict", "held").unwrap();
    let ttl = Ttl::from_millis(60_000).unwrap();
    let held = first.try_acquire(&key, ttl).await.unwrap().expect("free");

    // Fill memory with expiring keys until Redis evicts the held lock.
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let value = vec![b'x'; 16 * 1024];
    let mut evicted = false;
    for i in 0..2_000 {
        let _: () = redis::cmd("SET")
            .arg(format!("filler:{i}"))
            .arg(&value)
            .arg("PX")
            .arg(600_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        let exists: i64 = redis::cmd("EXISTS").arg(key.lock_key()).query_async(&mut conn).await.unwrap();
        if exists == 0 {
            evicted = true;
            break;
        }
    }
    assert!(evicted, "volatile-lru never evicted the held lock");
    let fence_kept: i64 = redis::cmd("EXISTS").arg(key.fence_key()).query_async(&mut conn).await.unwrap();
    assert_eq!(fence_kept, 1, "the fence key has no TTL and must survive");
    let double = second.try_acquire(&key, ttl).await.unwrap().expect("the evicted lock is free again");
    assert!(double.fence() > held.fence(), "fences still order the two holders");
}

#[tokio::test]
async fn bad_urls_and_absent_servers_are_typed() {
    assert_eq!(RedisLockService::connect("http://127.0.0.1:1").await.unwrap_err().kind(), ErrorKind::InvalidConfig);
    assert_eq!(
        RedisLockService::connect("redis://127.0.0.1:notaport").await.unwrap_err().kind(),
        ErrorKind::InvalidConfig
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let err = RedisLockService::connect(&format!("redis://127.0.0.1:{port}")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(err.is_retryable());
}

#[tokio::test]
async fn fence_keys_have_no_ttl_and_survive_release() {
    let url = require_env("PALISADE_REDIS_URL");
    let svc = RedisLockService::connect(&url).await.unwrap();
    let key = ResourceKey::new("ttlcheck", format!("k{}", std::process::id())).unwrap();
    let grant = svc.try_acquire(&key, Ttl::from_millis(5000).unwrap()).await.unwrap().unwrap();
    svc.release(&grant).await.unwrap();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let pttl: i64 = redis::cmd("PTTL").arg(key.fence_key()).query_async(&mut conn).await.unwrap();
    assert_eq!(pttl, -1, "the fence key must never expire");
    let lock_exists: i64 = redis::cmd("EXISTS").arg(key.lock_key()).query_async(&mut conn).await.unwrap();
    assert_eq!(lock_exists, 0, "release deletes the lock key");
}

/// Fences stay exact above 2⁵³ (Lua numbers are doubles): after the counter is moved to
/// 2⁵³ + 1, grants get 2⁵³ + 2 and 2⁵³ + 3, never a rounded value at or below the floor.
#[tokio::test]
async fn fences_are_exact_above_two_to_the_53() {
    let server = own_redis(&[]);
    let svc = RedisLockService::connect(&server.redis_url()).await.unwrap();
    let key = ResourceKey::new("big", "fence").unwrap();
    let floor = (1u64 << 53) + 1;
    svc.advance_fence(&key, palisade_core::Fence::new(floor)).await.unwrap();
    let ttl = Ttl::from_millis(5_000).unwrap();
    let first = svc.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert_eq!(first.fence().get(), floor + 1);
    svc.release(&first).await.unwrap();
    let second = svc.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert_eq!(second.fence().get(), floor + 2);
    svc.release(&second).await.unwrap();
    // Moving to a floor below the counter keeps the counter (an exact integer comparison).
    svc.advance_fence(&key, palisade_core::Fence::new(floor + 1)).await.unwrap();
    let third = svc.try_acquire(&key, ttl).await.unwrap().unwrap();
    assert_eq!(third.fence().get(), floor + 3);
}

/// A fence counter Redis cannot increment (not an integer) fails the acquire, and leaves no
/// lock behind: a held lock without a grant would block everyone for its TTL.
#[tokio::test]
async fn a_failed_increment_leaves_no_lock_held() {
    let server = own_redis(&[]);
    let svc = RedisLockService::connect(&server.redis_url()).await.unwrap();
    let key = ResourceKey::new("bad", "counter").unwrap();
    let client = redis::Client::open(server.redis_url().as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SET").arg(key.fence_key()).arg("not-a-number").query_async(&mut conn).await.unwrap();
    let err = svc.try_acquire(&key, Ttl::from_millis(60_000).unwrap()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    let held: i64 = redis::cmd("EXISTS").arg(key.lock_key()).query_async(&mut conn).await.unwrap();
    assert_eq!(held, 0, "the lock stayed held after a failed grant");
}

/// Fences on both sides of 2⁵³, where a Lua number stops being exact: the script returns the
/// `INCR` reply itself below it and reads the counter back as text from it on.
#[tokio::test]
async fn fences_are_exact_across_two_to_the_53() {
    let server = own_redis(&[]);
    let svc = RedisLockService::connect(&server.redis_url()).await.unwrap();
    let key = ResourceKey::new("edge", "fence").unwrap();
    let start = (1u64 << 53) - 3;
    svc.advance_fence(&key, palisade_core::Fence::new(start)).await.unwrap();
    let ttl = Ttl::from_millis(5_000).unwrap();
    for step in 1..=4 {
        let grant = svc.try_acquire(&key, ttl).await.unwrap().unwrap();
        assert_eq!(grant.fence().get(), start + step, "grant {step} after {start}");
        svc.release(&grant).await.unwrap();
    }
}

/// How many `PUBLISH` commands the server ran, scripts' included (`INFO commandstats`).
async fn publishes(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_publish:calls="))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// A release notifies only when someone waits. Uncontended cycles (`try_acquire`, and an
/// `acquire` that is granted at once) and a release that a `try_acquire` found held send no
/// `PUBLISH`: on the server a publish is matched against every client's pattern subscription,
/// and on a cluster sent to every node. A waiter marks the lock with the attempt that finds it
/// held, so the release that follows publishes, and the waiter holds the lock.
#[tokio::test]
async fn a_release_publishes_only_when_someone_waits() {
    let server = own_redis(&[]);
    let url = server.redis_url();
    let svc = RedisLockService::connect(&url).await.unwrap();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let key = ResourceKey::new("quiet", "release").unwrap();
    let ttl = Ttl::from_millis(30_000).unwrap();
    for _ in 0..20 {
        let grant = svc.try_acquire(&key, ttl).await.unwrap().unwrap();
        svc.release(&grant).await.unwrap();
    }
    let grant = svc.acquire(&key, ttl, Duration::from_secs(5)).await.unwrap();
    let other = RedisLockService::connect(&url).await.unwrap();
    assert!(other.try_acquire(&key, ttl).await.unwrap().is_none(), "held");
    svc.release(&grant).await.unwrap();
    assert_eq!(publishes(&mut conn).await, 0, "releases nobody waited for published");

    let holder = svc.try_acquire(&key, ttl).await.unwrap().unwrap();
    let waiter = Arc::new(RedisLockService::connect(&url).await.unwrap());
    let waiting = {
        let (waiter, key) = (Arc::clone(&waiter), key.clone());
        tokio::spawn(async move { waiter.acquire(&key, ttl, Duration::from_secs(30)).await })
    };
    let looked = Instant::now();
    loop {
        let value: Option<String> = redis::cmd("GET").arg(key.lock_key()).query_async(&mut conn).await.unwrap();
        if value.is_some_and(|v| v.ends_with(palisade_redis::scripts::WAITED_ON)) {
            break;
        }
        assert!(looked.elapsed() < Duration::from_secs(10), "the waiter left no mark on {}", key.lock_key());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The marked holder still renews, and a `try_acquire` (which will not wait) marks nothing.
    svc.extend(&holder, ttl).await.unwrap();
    svc.release(&holder).await.unwrap();
    let granted = waiting.await.unwrap().unwrap();
    assert!(granted.fence() > holder.fence());
    assert_eq!(publishes(&mut conn).await, 1, "the release with a waiter published once");
    waiter.release(&granted).await.unwrap();
}
