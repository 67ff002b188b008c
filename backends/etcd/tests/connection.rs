//! Connecting to etcd: authentication, bad URLs and unreachable clusters (TLS: `tls.rs`). Each test that needs an unusual server starts its own etcd
//! on loopback (`PALISADE_ETCD_SERVER` is the binary `scripts/test` found or installed).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::time::{Duration, Instant};

use palisade_conformance::require_env;
use palisade_core::{ErrorKind, LockService, LockServiceExt, ResourceKey};
use palisade_etcd::{EtcdConfig, EtcdLockService};
use palisade_lab::servers::LoopbackServer;

fn key(id: &str) -> ResourceKey {
    ResourceKey::new("conn", format!("{id}-{}", std::process::id())).unwrap()
}

#[tokio::test]
async fn user_and_password_authenticate_and_a_wrong_password_is_a_config_error() {
    let server = LoopbackServer::etcd(&require_env("PALISADE_ETCD_SERVER")).unwrap();
    let port = server.port();
    // Turn authentication on: a root user with a password.
    let mut admin = etcd_client::Client::connect([format!("http://127.0.0.1:{port}")], None).await.unwrap();
    admin.user_add("root", "s3cret-pw", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();

    let locks = EtcdLockService::connect(&format!("etcd://root:s3cret-pw@127.0.0.1:{port}")).await.unwrap();
    let lease =
        std::sync::Arc::new(locks).try_lock(&key("auth"), Duration::from_secs(2)).await.unwrap().expect("a free key");
    lease.release().await.unwrap();

    let Err(err) = EtcdLockService::connect(&format!("etcd://root:wrong@127.0.0.1:{port}")).await else {
        panic!("a wrong password must not connect")
    };
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err:?}");
    assert!(!format!("{err} {err:?}").contains("wrong"), "the password leaked: {err:?}");

    let Err(err) = EtcdLockService::connect(&format!("etcd://127.0.0.1:{port}")).await else {
        panic!("no credentials must not connect when auth is on")
    };
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err:?}");
}

#[tokio::test]
async fn an_unreachable_cluster_fails_within_the_timeouts() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut config = EtcdConfig::from_url(&format!("etcd://127.0.0.1:{port}")).unwrap();
    config.connect_timeout = Duration::from_millis(300);
    config.request_timeout = Duration::from_millis(500);
    let started = Instant::now();
    let Err(err) = EtcdLockService::connect_with(config).await else { panic!("nothing listens there") };
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err:?}");
    assert!(err.is_retryable());
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
}

#[tokio::test]
async fn bad_urls_and_settings_are_config_errors() {
    for url in ["etcd://", "etcd://host", "redis://127.0.0.1:1", "etcd://127.0.0.1:1?session_ttl_s=0"] {
        let Err(err) = EtcdLockService::connect(url).await else { panic!("{url} must fail") };
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}: {err:?}");
    }
    let mut config = EtcdConfig::from_url("etcd://127.0.0.1:1").unwrap();
    config.session_ttl = Duration::from_millis(1500);
    let Err(err) = EtcdLockService::connect_with(config).await else { panic!("fractional session TTL") };
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err:?}");
}

#[tokio::test]
async fn closing_revokes_the_session_and_frees_its_locks_at_once() {
    let url = format!("{}?session_ttl_s=30", require_env("PALISADE_ETCD_URL"));
    let a = EtcdLockService::connect(&url).await.unwrap();
    let b = EtcdLockService::connect(&url).await.unwrap();
    let k = key("close");
    let ttl = palisade_core::Ttl::from_millis(20_000).unwrap();
    // A holder that never releases: only its session holds the key.
    let held = a.try_acquire(&k, ttl).await.unwrap().expect("free");
    a.close().await.unwrap();
    assert!(held.lost_token().is_cancelled(), "the closed client's grant was not marked lost");
    let started = Instant::now();
    let grant = b.try_acquire(&k, palisade_core::Ttl::from_millis(2000).unwrap()).await.unwrap();
    assert!(grant.is_some(), "the closed client's lock was not freed");
    assert!(started.elapsed() < Duration::from_secs(2));
    b.release(&grant.unwrap()).await.unwrap();
}
