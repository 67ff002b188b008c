//! ZooKeeper over TLS against a real TLS-only server (started by `scripts/test`:
//! `PALISADE_ZK_TLS_URL`, a `zks://` URL of a server with a `secureClientPort`, Netty and no
//! plaintext port, which demands a client certificate and a SASL DIGEST-MD5 login; its throwaway
//! certificates in `PALISADE_ZK_TLS_CERTS`, as `palisade_lab::tls::material` makes them). Every
//! refusal is a configuration error that names its cause, arrives well before the connect
//! timeout runs out, and never carries the password.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade_conformance::require_env;
use palisade_core::{ErrorKind, LockOptions, LockServiceExt, ResourceKey};
use palisade_lab::servers::{ZK_SASL_PASSWORD, ZK_SASL_USER, ZkEnsemble};
use palisade_zookeeper::{ZkConfig, ZkLockService};

fn certs() -> PathBuf {
    PathBuf::from(require_env("PALISADE_ZK_TLS_CERTS"))
}

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap()
}

/// `url` (a `zks://host:port`) with the SASL login as `password` and a short connect timeout.
fn config_for(url: &str, password: &str, certs: &Path) -> ZkConfig {
    let url = url.replace("zks://", &format!("zks://{ZK_SASL_USER}:{password}@"));
    let mut config = ZkConfig::from_url(&format!("{url}?auth=sasl&session_timeout_ms=4000")).unwrap();
    config.connect_timeout = Duration::from_secs(3);
    config
        .with_tls_root_cert(read(certs, "ca.crt"))
        .with_tls_client_identity(read(certs, "client.crt"), read(certs, "client.key"))
}

/// Everything the shared TLS server demands, given.
fn complete() -> ZkConfig {
    config_for(&require_env("PALISADE_ZK_TLS_URL"), ZK_SASL_PASSWORD, &certs())
}

async fn refusal(config: ZkConfig) -> palisade_core::Error {
    let started = Instant::now();
    let within = config.connect_timeout * 2;
    match ZkLockService::connect_with(config).await {
        Ok(_) => panic!("connected"),
        Err(e) => {
            // A configuration error is reported, not retried until the connect timeout.
            if e.kind() == ErrorKind::InvalidConfig {
                assert!(started.elapsed() < within, "refused only after {:?}: {e}", started.elapsed());
            }
            e
        }
    }
}

/// A refusal the caller must fix, not retry, saying `cause` and never the password.
fn assert_misconfigured(e: &palisade_core::Error, cause: &str) {
    palisade_conformance::assert_config_error(e, cause);
    let said = format!("{e} {e:?}");
    assert!(!said.contains(ZK_SASL_PASSWORD), "{said:?} shows the password");
}

fn key(name: &str) -> ResourceKey {
    ResourceKey::new("zk-tls", format!("{name}-{}", std::process::id())).unwrap()
}

#[tokio::test]
async fn tls_with_a_client_certificate_and_a_sasl_login_carries_the_lock() {
    let locks = Arc::new(ZkLockService::connect_with(complete()).await.unwrap());
    let key = key("carries");
    let lease = locks.lock(&key, LockOptions::ttl(Duration::from_secs(2))).await.unwrap();
    assert!(lease.fence().to_i64().is_some_and(|f| f > 0));
    // Exclusion holds over TLS as in plaintext: a second client waits, then gets a higher fence.
    let other = Arc::new(ZkLockService::connect_with(complete()).await.unwrap());
    let busy = other.try_lock(&key, Duration::from_secs(2)).await.unwrap();
    assert!(busy.is_none(), "a held lock was granted again");
    let fence = lease.fence();
    lease.release().await.unwrap();
    let next = other.lock(&key, LockOptions::ttl(Duration::from_secs(2))).await.unwrap();
    assert!(next.fence() > fence);
    next.release().await.unwrap();
}

#[tokio::test]
async fn an_unknown_ca_is_refused() {
    let config = complete().with_tls_root_cert(read(&certs(), "other-ca.crt"));
    assert_misconfigured(&refusal(config).await, "does not trust");
}

#[tokio::test]
async fn a_wrong_host_name_is_refused() {
    // The same server reached at 127.0.0.2, an address its certificate does not name.
    let url = require_env("PALISADE_ZK_TLS_URL");
    let upstream: std::net::SocketAddr = url.trim_start_matches("zks://").parse().unwrap();
    let addr = palisade_lab::tls::relay("127.0.0.2".parse().unwrap(), upstream).await.unwrap();
    let config = config_for(&format!("zks://{addr}"), ZK_SASL_PASSWORD, &certs());
    assert_misconfigured(&refusal(config).await, "not valid for the host name");
}

#[tokio::test]
async fn a_plaintext_server_is_refused_when_tls_is_asked() {
    let plain = require_env("PALISADE_ZK_URL").replace("zk://", "zks://");
    let mut config = config_for(&plain, ZK_SASL_PASSWORD, &certs());
    config.sasl = false;
    config.digest = None;
    assert_misconfigured(&refusal(config).await, "does not speak TLS");
}

#[tokio::test]
async fn a_missing_client_certificate_is_refused() {
    let mut config = complete();
    config.tls_client_identity = None;
    assert_misconfigured(&refusal(config).await, "refused this client's certificate");
}

#[tokio::test]
async fn a_wrong_sasl_password_is_refused() {
    let config = config_for(&require_env("PALISADE_ZK_TLS_URL"), "not-the-password", &certs());
    let e = refusal(config).await;
    assert_misconfigured(&e, "auth");
    assert!(!format!("{e} {e:?}").contains("not-the-password"));
}

#[tokio::test]
async fn tls_needs_a_ca() {
    let mut config = complete();
    config.tls_root_cert = None;
    assert_misconfigured(&refusal(config).await, "with_tls_root_cert");
}

/// A TLS-only server of this test's own, whose `server.pem` is the server key with `cert`.
fn own_server(cert: &str) -> (ZkEnsemble, PathBuf) {
    let dir = std::env::temp_dir().join(format!("palisade-zk-tls-{cert}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    palisade_lab::tls::material(&dir).unwrap();
    serve(&dir, cert);
    let classpath = require_env("PALISADE_ZK_CLASSPATH");
    (ZkEnsemble::start_tls(&classpath, &dir).unwrap(), dir)
}

/// Makes the server in `dir` present `cert` (from its next start).
fn serve(dir: &Path, cert: &str) {
    std::fs::write(dir.join("server.pem"), [read(dir, "server.key"), read(dir, cert)].concat()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_server_certificate_is_refused_with_its_date() {
    let (zookeeper, dir) = tokio::task::spawn_blocking(|| own_server("expired.crt")).await.unwrap();
    let e = refusal(config_for(&zookeeper.url(), ZK_SASL_PASSWORD, &dir)).await;
    assert_misconfigured(&e, "expired on 2024-01-02 00:00:00 UTC");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_server_certificate_is_taken_on_reconnect() {
    let (mut zookeeper, dir) = tokio::task::spawn_blocking(|| own_server("server.crt")).await.unwrap();
    let locks =
        Arc::new(ZkLockService::connect_with(config_for(&zookeeper.url(), ZK_SASL_PASSWORD, &dir)).await.unwrap());
    let first = locks.lock(&key("renewed-1"), LockOptions::ttl(Duration::from_secs(2))).await.unwrap();
    let fence = first.fence();
    first.release().await.unwrap();
    // The server restarts with a new certificate from the same CA: the client reconnects
    // (the session outlives the restart) and verifies the new one.
    serve(&dir, "renewed.crt");
    let zookeeper = tokio::task::spawn_blocking(move || {
        zookeeper.restart_member(0).unwrap();
        zookeeper
    })
    .await
    .unwrap();
    let second = locks.lock(&key("renewed-2"), LockOptions::ttl(Duration::from_secs(2))).await.unwrap();
    assert!(second.fence() > fence);
    second.release().await.unwrap();
    drop(zookeeper);
    let _ = std::fs::remove_dir_all(&dir);
}
