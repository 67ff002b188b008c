//! DynamoDB at a private `https://` endpoint, and credentials from the AWS SDK's standard chain,
//! against a real DynamoDB-API server behind TLS (started by `scripts/test`: moto behind the
//! lab's TLS terminator at `PALISADE_DYNAMODB_TLS_ENDPOINT`, its throwaway certificates in
//! `PALISADE_DYNAMODB_TLS_CERTS`; the terminator appends each access key id that signs a request
//! to `PALISADE_DYNAMODB_TLS_SIGNERS`). Every refusal is a configuration error naming its cause.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use palisade_conformance::{assert_config_error, require_env};
use palisade_core::{Fence, FencedStore, GrantFence, GrantId, ResourceKey, WriteBatch};
use palisade_dynamodb::{DynamoConfig, DynamoStore};

fn certs() -> PathBuf {
    PathBuf::from(require_env("PALISADE_DYNAMODB_TLS_CERTS"))
}

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap()
}

/// The table `table` (one per test process) at `endpoint`, trusting `ca`; no credentials: they
/// come from the chain.
fn config(endpoint: &str, ca: &[u8], table: &str) -> DynamoConfig {
    DynamoConfig {
        endpoint: Some(endpoint.to_string()),
        region: Some("us-east-1".into()),
        // A refusal must not wait out the SDK's patience.
        attempt_timeout: Duration::from_secs(10),
        operation_timeout: Duration::from_secs(20),
        ..DynamoConfig::new(format!("{table}-{}", std::process::id()))
    }
    .with_tls_root_cert(ca.to_vec())
}

fn https() -> String {
    require_env("PALISADE_DYNAMODB_TLS_ENDPOINT")
}

async fn refusal(config: DynamoConfig) -> palisade_core::Error {
    match DynamoStore::open(config).await {
        Ok(_) => panic!("opened"),
        Err(e) => e,
    }
}

fn signers() -> String {
    std::fs::read_to_string(require_env("PALISADE_DYNAMODB_TLS_SIGNERS")).unwrap_or_default()
}

/// Opens the store over HTTPS with credentials from nowhere but the process's environment and
/// the files it names (the SDK's standard chain), writes through it, and checks which access
/// key signed: `PALISADE_EXPECT_SIGNER`, or the lab's `AWS_ACCESS_KEY_ID`. With
/// `PALISADE_EXPECT_NO_CREDENTIALS` set, the chain must find none and say so.
/// [`credentials_come_from_a_profile_file`] runs it again in a child process with a profile
/// file and no credentials in the environment.
#[tokio::test]
async fn the_standard_chain_signs_requests_over_https() {
    let store = DynamoStore::open(config(&https(), &read(&certs(), "ca.crt"), "chain")).await;
    if std::env::var_os("PALISADE_EXPECT_NO_CREDENTIALS").is_some() {
        let e = store.expect_err("opened without credentials");
        assert_config_error(&e, "credentials");
        return;
    }
    let store = store.unwrap();
    let key = ResourceKey::new("tls", "chain").unwrap();
    let grant = GrantFence::new(Fence::new(7), GrantId::from_bytes([0xa1; 16]));
    store.apply(&key, grant, &WriteBatch::new().put("tls/chain", b"A".to_vec())).await.unwrap();
    assert_eq!(store.read("tls/chain").await.unwrap().map(|r| r.value), Some(b"A".to_vec()));
    let expected = std::env::var("PALISADE_EXPECT_SIGNER").unwrap_or_else(|_| require_env("AWS_ACCESS_KEY_ID"));
    assert!(signers().lines().any(|id| id == expected), "{expected} never signed a request: {:?}", signers());
}

/// The same test in a child process whose environment holds no credentials, only
/// `AWS_PROFILE` and the files of a profile: the chain takes that profile's key.
#[test]
fn credentials_come_from_a_profile_file() {
    let dir = std::env::temp_dir().join(format!("palisade-aws-profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key_id = format!("PALISADEPROFILE{}", std::process::id());
    std::fs::write(
        dir.join("credentials"),
        format!("[palisade-profile]\naws_access_key_id = {key_id}\naws_secret_access_key = profile-secret\n"),
    )
    .unwrap();
    std::fs::write(dir.join("config"), "[profile palisade-profile]\nregion = us-east-1\n").unwrap();
    let output = chain_child(&[
        ("AWS_SHARED_CREDENTIALS_FILE", dir.join("credentials").display().to_string()),
        ("AWS_CONFIG_FILE", dir.join("config").display().to_string()),
        ("AWS_PROFILE", "palisade-profile".to_string()),
        ("PALISADE_EXPECT_SIGNER", key_id),
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(output.0, "the child failed:\n{}", output.1);
}

/// With no credentials anywhere in the chain, opening the store is a configuration error
/// that says so (not an outage retried).
#[test]
fn no_credentials_anywhere_is_a_configuration_error() {
    let dir = std::env::temp_dir().join(format!("palisade-aws-none-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let output = chain_child(&[
        ("AWS_SHARED_CREDENTIALS_FILE", dir.join("none").display().to_string()),
        ("AWS_CONFIG_FILE", dir.join("none").display().to_string()),
        ("PALISADE_EXPECT_NO_CREDENTIALS", "1".to_string()),
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(output.0, "the child failed:\n{}", output.1);
}

/// Runs [`the_standard_chain_signs_requests_over_https`] alone in a child process of this
/// test binary, without the AWS variables of this environment and with `env`; whether it
/// passed, and what it printed.
fn chain_child(env: &[(&str, String)]) -> (bool, String) {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap());
    child.args(["the_standard_chain_signs_requests_over_https", "--exact", "--nocapture", "--test-threads=1"]);
    for name in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION"] {
        child.env_remove(name);
    }
    // This machine is no EC2 instance: do not wait for its metadata service.
    child.env("AWS_EC2_METADATA_DISABLED", "true");
    for (name, value) in env {
        child.env(name, value);
    }
    let out = child.output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success() && said.contains("1 passed"), said)
}

#[tokio::test]
async fn an_unknown_ca_is_refused() {
    let e = refusal(config(&https(), &read(&certs(), "other-ca.crt"), "unknown-ca")).await;
    assert_config_error(&e, "does not trust");
}

#[tokio::test]
async fn a_wrong_host_name_is_refused() {
    let terminator: SocketAddr = https().trim_start_matches("https://").parse().unwrap();
    let relay = palisade_lab::tls::relay("127.0.0.2".parse().unwrap(), terminator).await.unwrap();
    let e = refusal(config(&format!("https://{relay}"), &read(&certs(), "ca.crt"), "wrong-name")).await;
    assert_config_error(&e, "not valid for the host name");
}

#[tokio::test]
async fn a_plaintext_endpoint_is_refused_when_https_is_asked() {
    let plain = require_env("PALISADE_DYNAMODB_ENDPOINT").replace("http://", "https://");
    let e = refusal(config(&plain, &read(&certs(), "ca.crt"), "plaintext")).await;
    assert_config_error(&e, "does not speak TLS");
}

#[tokio::test]
async fn an_expired_server_certificate_is_refused_with_its_date() {
    // A terminator of this test's own, showing the expired certificate, in front of the plain
    // endpoint's server.
    let dir = std::env::temp_dir().join(format!("palisade-dynamodb-expired-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    palisade_lab::tls::material(&dir).unwrap();
    std::fs::copy(dir.join("expired.crt"), dir.join("server.crt")).unwrap();
    let upstream: SocketAddr = require_env("PALISADE_DYNAMODB_ENDPOINT").trim_start_matches("http://").parse().unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let served = dir.clone();
    std::thread::spawn(move || palisade_lab::tls::terminate(listener, upstream, &served, None));
    let e = refusal(config(&format!("https://{addr}"), &read(&dir, "ca.crt"), "expired")).await;
    assert_config_error(&e, "expired on 2024-01-02 00:00:00 UTC");
    let _ = std::fs::remove_dir_all(&dir);
}
