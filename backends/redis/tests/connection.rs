//! Connecting to Redis servers of the test's own: passwords, eviction policies, bad URLs.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use palisade_conformance::require_env;
use palisade_conformance::servers::LoopbackServer;
use palisade_core::{ErrorKind, LockService, ResourceKey, Ttl};
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

    let volatile = own_redis(&["--maxmemory-policy", "volatile-lru"]);
    RedisLockService::connect(&volatile.redis_url()).await.unwrap();
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
