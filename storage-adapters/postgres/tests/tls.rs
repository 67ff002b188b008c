//! PostgreSQL over TLS against a real TLS-only server (started by `scripts/test`:
//! `PALISADE_POSTGRES_TLS_URL`; its `pg_hba.conf` has `hostssl` lines only; a throwaway CA in
//! `PALISADE_POSTGRES_TLS_CA`, one that signed nothing in `PALISADE_POSTGRES_TLS_OTHER_CA`, a
//! client identity in `PALISADE_POSTGRES_TLS_CLIENT_CERT` / `_KEY`). The store and the lock
//! service connect with `verify-full`; every refusal is a configuration error that names its
//! cause and never the password.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::time::Duration;

use palisade_conformance::{assert_config_error, require_env};
use palisade_core::{ErrorKind, FencedStoreExt, LockOptions, LockService, LockServiceExt, ResourceKey, WriteBatch};
use palisade_postgres::{PostgresConfig, PostgresLockService, PostgresStore, PostgresTls, SslMode};

/// The TLS server's URL with `query` (`sslmode=…&…`) and `host` in place of 127.0.0.1.
fn url_on(host: &str, query: &str) -> String {
    let url = require_env("PALISADE_POSTGRES_TLS_URL").replace("127.0.0.1", host);
    format!("{url}?{query}")
}

fn url(query: &str) -> String {
    url_on("127.0.0.1", query)
}

fn ca() -> String {
    require_env("PALISADE_POSTGRES_TLS_CA")
}

/// The store and the lock service over `verify-full`, end to end: the pairing's scenarios,
/// the holder frozen with `SIGSTOP` in a process of its own included.
fn verified() -> String {
    url(&format!("sslmode=verify-full&sslrootcert={}", ca()))
}

palisade_conformance::certify!(
    postgres_over_tls: pairing,
    lock_service = palisade_postgres::conformance::service_at(verified()),
    store = palisade_postgres::conformance::store_at(verified())
);

async fn refusal(url: &str) -> palisade_core::Error {
    match PostgresStore::connect(url).await {
        Ok(_) => panic!("{url} connected"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn verify_full_carries_the_store_and_the_lock_service() {
    let store = PostgresStore::connect(&verified()).await.unwrap();
    let tls: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(tls, "the session is not encrypted");
    let locks = std::sync::Arc::new(PostgresLockService::new(&store).await.unwrap());
    let key = ResourceKey::new("tls", format!("k{}", std::process::id())).unwrap();
    let lease = locks.lock(&key, LockOptions::ttl(Duration::from_secs(5))).await.unwrap();
    store.write(&lease, &WriteBatch::new().put(format!("tls/{key}"), b"A".to_vec())).await.unwrap();
    // A waiter is woken by the release's notification, which comes over the listener's own
    // TLS connection.
    let waiter = {
        let (locks, key) = (std::sync::Arc::clone(&locks), key.clone());
        tokio::spawn(async move {
            locks.acquire(&key, palisade_core::Ttl::from_millis(5000).unwrap(), Duration::from_secs(5)).await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = std::time::Instant::now();
    lease.release().await.unwrap();
    let grant = waiter.await.unwrap().unwrap();
    assert!(released.elapsed() < Duration::from_millis(200), "the waiter polled: {:?}", released.elapsed());
    locks.release(&grant).await.unwrap();
}

#[tokio::test]
async fn the_typed_settings_override_the_url() {
    let mut config = PostgresConfig::from_url(&url("sslmode=disable")).unwrap();
    let mut tls = PostgresTls::default();
    tls.mode = Some(SslMode::VerifyFull);
    tls.root_cert = Some(ca().into());
    config.tls = tls;
    let store = PostgresStore::open(config).await.unwrap();
    let tls: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(tls);
}

#[tokio::test]
async fn a_host_name_the_certificate_does_not_name_is_refused_by_verify_full_only() {
    // The server listens on 127.0.0.2 too; its certificate names 127.0.0.1 and localhost.
    let e = refusal(&url_on("127.0.0.2", &format!("sslmode=verify-full&sslrootcert={}", ca()))).await;
    assert_config_error(&e, "not valid for the host name");
    PostgresStore::connect(&url_on("127.0.0.2", &format!("sslmode=verify-ca&sslrootcert={}", ca()))).await.unwrap();
}

#[tokio::test]
async fn a_certificate_from_an_unknown_ca_is_refused() {
    let other = require_env("PALISADE_POSTGRES_TLS_OTHER_CA");
    let e = refusal(&url(&format!("sslmode=verify-full&sslrootcert={other}"))).await;
    assert_config_error(&e, "does not trust");
    let e = refusal(&url(&format!("sslmode=verify-ca&sslrootcert={other}"))).await;
    assert_config_error(&e, "does not trust");
}

#[tokio::test]
async fn require_refuses_a_server_without_tls() {
    let plain = format!("{}?sslmode=require", require_env("PALISADE_POSTGRES_URL"));
    let e = refusal(&plain).await;
    assert_config_error(&e, "does not support TLS");
}

#[tokio::test]
async fn plaintext_is_refused_by_a_tls_only_server() {
    let e = refusal(&url("sslmode=disable")).await;
    assert_config_error(&e, "no encryption");
}

#[tokio::test]
async fn a_missing_root_certificate_file_is_a_configuration_error() {
    let e = refusal(&url("sslmode=verify-full&sslrootcert=/nonexistent/ca.crt")).await;
    assert_config_error(&e, "sslrootcert");
}

#[tokio::test]
async fn a_client_certificate_is_presented_when_the_server_demands_one() {
    // The role the server admits only with a client certificate its CA signed.
    let admin = PostgresStore::connect(&url(&format!("sslmode=verify-full&sslrootcert={}", ca()))).await.unwrap();
    sqlx::query(
        "DO $$BEGIN CREATE ROLE palisade_cert LOGIN SUPERUSER; EXCEPTION WHEN duplicate_object THEN NULL; END$$",
    )
    .execute(admin.pool())
    .await
    .unwrap();
    let as_cert = |query: String| url(&query).replacen("postgres@", "palisade_cert@", 1);
    let (cert, key) =
        (require_env("PALISADE_POSTGRES_TLS_CLIENT_CERT"), require_env("PALISADE_POSTGRES_TLS_CLIENT_KEY"));
    let with = as_cert(format!("sslmode=verify-full&sslrootcert={}&sslcert={cert}&sslkey={key}", ca()));
    let store = PostgresStore::connect(&with).await.unwrap();
    let user: String = sqlx::query_scalar("SELECT current_user::text").fetch_one(store.pool()).await.unwrap();
    assert_eq!(user, "palisade_cert");
    let e = refusal(&as_cert(format!("sslmode=verify-full&sslrootcert={}", ca()))).await;
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e:?}");
    assert!(!e.is_retryable(), "{e:?}");
}

#[tokio::test]
async fn no_refusal_carries_the_password() {
    let other = require_env("PALISADE_POSTGRES_TLS_OTHER_CA");
    let with_password =
        url(&format!("sslmode=verify-full&sslrootcert={other}")).replacen("postgres@", "postgres:s3cret-pw@", 1);
    let e = refusal(&with_password).await;
    let said = format!("{e} {e:?}");
    assert!(!said.contains("s3cret-pw"), "{said}");
}

/// A TLS-only server of this test's own that shows `cert` (from its TLS material) as its
/// certificate, and the material's directory.
fn own_server(cert: &str) -> (palisade_lab::servers::PostgresServer, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("palisade-pg-tls-{cert}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    palisade_lab::tls::material(&dir).unwrap();
    std::fs::copy(dir.join(cert), dir.join("server.crt")).unwrap();
    (palisade_lab::servers::PostgresServer::start_tls(&dir).unwrap(), dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_server_certificate_is_refused_with_its_date() {
    let (server, dir) = tokio::task::spawn_blocking(|| own_server("expired.crt")).await.unwrap();
    let url = format!("{}?sslmode=verify-full&sslrootcert={}", server.url(), dir.join("ca.crt").display());
    let e = refusal(&url).await;
    assert_config_error(&e, "expired on 2024-01-02 00:00:00 UTC");
    // verify-ca checks the dates as well: only the host name is not checked.
    let e = refusal(&url.replace("verify-full", "verify-ca")).await;
    assert_config_error(&e, "expired on 2024-01-02");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
