//! `rediss://` against a real TLS-only Redis that demands client certificates (started by
//! `scripts/test`: `PALISADE_REDIS_TLS_URL`, a throwaway CA in `PALISADE_REDIS_TLS_CA`, a client
//! identity in `PALISADE_REDIS_TLS_CLIENT_CERT` / `_KEY`). The whole certification runs over TLS,
//! including release notifications, which use a second (pub/sub) connection.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::{LockServiceFactory, Timing, assert_config_error, lock_factory, require_env};
use palisade_core::{ErrorKind, LockService, ResourceKey, Ttl};
use palisade_redis::{RedisConfig, RedisLockService};

fn read(var: &str) -> Vec<u8> {
    let path = require_env(var);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{var}={path}: {e}"))
}

fn tls_config() -> RedisConfig {
    RedisConfig::new(require_env("PALISADE_REDIS_TLS_URL"))
        .with_tls_root_cert(read("PALISADE_REDIS_TLS_CA"))
        .with_tls_client_identity(read("PALISADE_REDIS_TLS_CLIENT_CERT"), read("PALISADE_REDIS_TLS_CLIENT_KEY"))
}

fn redis_tls() -> impl LockServiceFactory<Service = RedisLockService> {
    let config = tls_config();
    lock_factory(Timing::new(Duration::from_millis(200), Duration::from_millis(50)), move || {
        let config = config.clone();
        async move { Ok(Arc::new(RedisLockService::connect_with(config).await?)) }
    })
    // What `palisade inspect` reads: a client of its own, as the service is its own view.
    .viewed()
    // An operator's `DEL` over TLS, with the same certificates.
    .with_break_lock(|key| async move {
        let fail =
            |e: redis::RedisError| palisade_core::Error::new(ErrorKind::Backend, "test", format!("raw DEL: {e}"));
        let certificates = redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: read("PALISADE_REDIS_TLS_CLIENT_CERT"),
                client_key: read("PALISADE_REDIS_TLS_CLIENT_KEY"),
            }),
            root_cert: Some(read("PALISADE_REDIS_TLS_CA")),
        };
        let client =
            redis::Client::build_with_tls(require_env("PALISADE_REDIS_TLS_URL"), certificates).map_err(fail)?;
        let mut conn = client.get_multiplexed_async_connection().await.map_err(fail)?;
        let _: i64 = redis::cmd("DEL").arg(key.lock_key()).query_async(&mut conn).await.map_err(fail)?;
        Ok(())
    })
    // The proxies forward the TLS bytes untouched: the handshake is still with the server.
    .with_faulty_client(|| async {
        let (url, proxies) = palisade_conformance::proxy::proxy_url(&require_env("PALISADE_REDIS_TLS_URL")).await?;
        let config = RedisConfig::new(url)
            .with_tls_root_cert(read("PALISADE_REDIS_TLS_CA"))
            .with_tls_client_identity(read("PALISADE_REDIS_TLS_CLIENT_CERT"), read("PALISADE_REDIS_TLS_CLIENT_KEY"));
        Ok(palisade_conformance::FaultyClient::new(Arc::new(RedisLockService::connect_with(config).await?), proxies))
    })
}

fn sqlite() -> impl palisade_conformance::FencedStoreFactory<Store = palisade_sqlite::SqliteStore> {
    palisade_conformance::store_factory(|| async {
        let path = format!("{}/palisade-redis-tls-e2e.db", env!("CARGO_TARGET_TMPDIR"));
        let url = format!("sqlite://{path}?synchronous=normal&busy_timeout_ms=30000");
        Ok(Arc::new(palisade_sqlite::SqliteStore::connect(&url).await?))
    })
}

palisade_conformance::certify!(redis_tls: lock_service = redis_tls(), store = sqlite());

async fn refusal(config: RedisConfig) -> palisade_core::Error {
    match RedisLockService::connect_with(config).await {
        Ok(_) => panic!("connected"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn a_server_signed_by_an_unknown_ca_is_refused() {
    // Platform roots only: the throwaway CA is not among them, so the handshake must fail
    // (and say so) rather than fall back to anything unverified.
    let mut config = tls_config();
    config.tls_root_cert = None;
    assert_config_error(&refusal(config).await, "does not trust");
}

#[tokio::test]
async fn the_server_refuses_a_client_without_a_certificate() {
    let mut config = tls_config();
    config.tls_client_identity = None;
    assert_config_error(&refusal(config).await, "refused this client's certificate");
}

#[tokio::test]
async fn a_wrong_host_name_is_refused() {
    let server: std::net::SocketAddr =
        require_env("PALISADE_REDIS_TLS_URL").trim_start_matches("rediss://").parse().unwrap();
    let relay = palisade_lab::tls::relay("127.0.0.2".parse().unwrap(), server).await.unwrap();
    let mut config = tls_config();
    config.url = format!("rediss://{relay}");
    assert_config_error(&refusal(config).await, "not valid for the host name");
}

#[tokio::test]
async fn a_plaintext_server_is_refused_when_tls_is_asked() {
    let mut config = tls_config();
    config.url = require_env("PALISADE_REDIS_URL").replacen("redis://", "rediss://", 1);
    assert_config_error(&refusal(config).await, "does not speak TLS");
}

#[tokio::test]
async fn plain_text_to_the_tls_port_fails_cleanly() {
    let url = require_env("PALISADE_REDIS_TLS_URL").replacen("rediss://", "redis://", 1);
    let Err(err) = RedisLockService::connect_with(RedisConfig::new(url)).await else { panic!("no TLS, no service") };
    assert!(matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::OutcomeUnknown), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_server_certificate_is_refused_with_its_date() {
    let dir = std::env::temp_dir().join(format!("palisade-redis-expired-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    palisade_lab::tls::material(&dir).unwrap();
    std::fs::copy(dir.join("expired.crt"), dir.join("server.crt")).unwrap();
    let program = require_env("PALISADE_REDIS_SERVER");
    let made = dir.clone();
    let server = tokio::task::spawn_blocking(move || palisade_lab::servers::LoopbackServer::redis_tls(&program, &made))
        .await
        .unwrap()
        .unwrap();
    let file = |name: &str| std::fs::read(dir.join(name)).unwrap();
    let config = RedisConfig::new(format!("rediss://{}", server.addr()))
        .with_tls_root_cert(file("ca.crt"))
        .with_tls_client_identity(file("client.crt"), file("client.key"));
    assert_config_error(&refusal(config).await, "expired on 2024-01-02 00:00:00 UTC");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_grant_over_tls_carries_a_fence() {
    let service = RedisLockService::connect_with(tls_config()).await.unwrap();
    let key = ResourceKey::new("tls", format!("grant-{}", std::process::id())).unwrap();
    let ttl = Ttl::from_millis(5_000).unwrap();
    let first = service.try_acquire(&key, ttl).await.unwrap().expect("free key");
    service.release(&first).await.unwrap();
    let second = service.try_acquire(&key, ttl).await.unwrap().expect("released key");
    assert!(second.fence() > first.fence(), "{:?} then {:?}", first.fence(), second.fence());
    service.release(&second).await.unwrap();
}
