//! etcd over TLS against a real TLS-only etcd (started by `scripts/test`: `PALISADE_ETCD_TLS_URL`,
//! an `etcds://` URL of a member whose client URL is `https://` only and which demands a client
//! certificate; its throwaway certificates in `PALISADE_ETCD_TLS_CERTS`, as
//! `palisade_lab::tls::material` makes them). Every refusal is a configuration error that names
//! its cause.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::{assert_config_error, require_env};
use palisade_core::{ErrorKind, LockServiceExt, ResourceKey};
use palisade_etcd::{EtcdConfig, EtcdLockService};
use palisade_lab::servers::LoopbackServer;

fn certs() -> PathBuf {
    PathBuf::from(require_env("PALISADE_ETCD_TLS_CERTS"))
}

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap()
}

/// `url` trusting `dir/ca.crt` and presenting `dir/client.crt`, with a short request timeout.
fn config_for(url: &str, dir: &Path) -> EtcdConfig {
    let mut config = EtcdConfig::from_url(url)
        .unwrap()
        .with_tls_root_cert(read(dir, "ca.crt"))
        .with_tls_client_identity(read(dir, "client.crt"), read(dir, "client.key"));
    config.request_timeout = Duration::from_secs(3);
    config
}

fn complete() -> EtcdConfig {
    config_for(&require_env("PALISADE_ETCD_TLS_URL"), &certs())
}

async fn refusal(config: EtcdConfig) -> palisade_core::Error {
    match EtcdLockService::connect_with(config).await {
        Ok(_) => panic!("connected"),
        Err(e) => e,
    }
}

fn key(id: &str) -> ResourceKey {
    ResourceKey::new("etcd-tls", format!("{id}-{}", std::process::id())).unwrap()
}

#[tokio::test]
async fn a_private_ca_and_a_client_certificate_carry_the_lock() {
    let locks = Arc::new(EtcdLockService::connect_with(complete()).await.unwrap());
    let lease = locks.try_lock(&key("carries"), Duration::from_secs(2)).await.unwrap().expect("free");
    assert!(lease.fence().to_i64().is_some_and(|f| f > 0));
    lease.release().await.unwrap();
}

#[tokio::test]
async fn an_unknown_ca_is_refused() {
    let config = complete().with_tls_root_cert(read(&certs(), "other-ca.crt"));
    assert_config_error(&refusal(config).await, "does not trust");
}

#[tokio::test]
async fn a_wrong_host_name_is_refused() {
    let server: SocketAddr = require_env("PALISADE_ETCD_TLS_URL").trim_start_matches("etcds://").parse().unwrap();
    let relay = palisade_lab::tls::relay("127.0.0.2".parse().unwrap(), server).await.unwrap();
    let e = refusal(config_for(&format!("etcds://{relay}"), &certs())).await;
    assert_config_error(&e, "not valid for the host name");
}

#[tokio::test]
async fn a_missing_client_certificate_is_refused() {
    let mut config = complete();
    config.tls_client_identity = None;
    assert_config_error(&refusal(config).await, "refused this client's certificate");
}

#[tokio::test]
async fn a_plaintext_server_is_refused_when_tls_is_asked() {
    let plain = require_env("PALISADE_ETCD_URL").replace("etcd://", "etcds://");
    let e = refusal(config_for(&plain, &certs())).await;
    assert_config_error(&e, "does not speak TLS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_server_certificate_is_refused_with_its_date() {
    let dir = std::env::temp_dir().join(format!("palisade-etcd-expired-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    palisade_lab::tls::material(&dir).unwrap();
    // The server starts (and the lab sees it healthy) with a valid certificate, then restarts
    // showing the expired one.
    let program = require_env("PALISADE_ETCD_SERVER");
    let made = dir.clone();
    let mut server =
        tokio::task::spawn_blocking(move || LoopbackServer::etcd_tls(&program, &made).unwrap()).await.unwrap();
    std::fs::copy(dir.join("expired.crt"), dir.join("server.crt")).unwrap();
    let server = tokio::task::spawn_blocking(move || {
        server.restart_as(palisade_lab::servers::Restart::KeepData).unwrap();
        server
    })
    .await
    .unwrap();
    let url = format!("etcds://{}", server.addr());
    // The restarted member may still be starting: a refusal is what we wait for.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let e = loop {
        let e = refusal(config_for(&url, &dir)).await;
        if e.kind() == ErrorKind::InvalidConfig || std::time::Instant::now() > deadline {
            break e;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_config_error(&e, "expired on 2024-01-02 00:00:00 UTC");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
