//! `palisade doctor` against real servers configured to fail each check, then to pass it: a
//! Redis of the test's own per configuration, a PostgreSQL database of the test's own, an
//! SQLite file. Exit 0 all pass, 1 a warning, 2 a failure or a server that cannot be read.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::process::Command;

mod common;

use palisade_conformance::require_env;
use palisade_lab::servers::LoopbackServer;
use serde_json::Value;

/// Runs `palisade doctor ARGS --json`: its exit code, its JSON and what it printed.
fn doctor(args: &[&str]) -> (Option<i32>, Value, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_palisade")).arg("doctor").args(args).arg("--json").output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let said = format!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    (output.status.code(), serde_json::from_str(stdout.trim()).unwrap_or(Value::Null), said)
}

/// The verdict of the check named `name` (without a node suffix) of the `i`th target.
fn verdict<'a>(view: &'a Value, i: usize, name: &str) -> &'a str {
    view["targets"][i]["checks"]
        .as_array()
        .and_then(|checks| checks.iter().find(|c| c["name"].as_str().is_some_and(|n| n.starts_with(name))))
        .and_then(|c| c["verdict"].as_str())
        .unwrap_or_else(|| panic!("no check {name} in {view}"))
}

fn redis(extra: &[&str]) -> LoopbackServer {
    LoopbackServer::redis(&require_env("PALISADE_REDIS_SERVER"), extra).unwrap()
}

#[test]
fn redis_that_evicts_and_keeps_nothing_fails() {
    let server = redis(&["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]);
    let (code, view, said) = doctor(&["--lock", &server.redis_url()]);
    assert_eq!(code, Some(2), "{said}");
    assert_eq!(verdict(&view, 0, "maxmemory-policy"), "fail", "{said}");
    assert_eq!(verdict(&view, 0, "persistence"), "fail", "{said}");
    assert_eq!(verdict(&view, 0, "replication"), "pass", "{said}");
    assert_eq!(view["verdict"], "fail", "{said}");
}

#[test]
fn redis_that_syncs_every_second_or_may_evict_later_warns() {
    let server = redis(&["--appendonly", "yes", "--appendfsync", "everysec", "--maxmemory-policy", "volatile-lru"]);
    let (code, view, said) = doctor(&["--lock", &server.redis_url()]);
    assert_eq!(code, Some(1), "{said}");
    assert_eq!(verdict(&view, 0, "maxmemory-policy"), "warn", "no memory limit: {said}");
    assert_eq!(verdict(&view, 0, "persistence"), "warn", "{said}");
}

#[test]
fn redis_with_a_replica_grants_do_not_wait_for_warns() {
    let primary = redis(&["--appendonly", "yes", "--appendfsync", "always"]);
    let port = primary.port().to_string();
    let _replica = redis(&["--replicaof", "127.0.0.1", &port]);
    // The replica shows once it has connected: wait for that on the primary itself (up to
    // 20 s), then ask the doctor once.
    let client = redis::Client::open(primary.redis_url()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let info: String = redis::cmd("INFO").arg("replication").query(&mut conn).unwrap();
        if info.lines().any(|l| l.trim() == "connected_slaves:1") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the replica never connected: {info}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (code, view, said) = doctor(&["--lock", &primary.redis_url()]);
    assert_eq!(code, Some(1), "{said}");
    assert_eq!(verdict(&view, 0, "replication"), "warn", "{said}");
}

#[test]
fn redis_that_skips_fsync_while_rewriting_warns() {
    let server = redis(&["--appendonly", "yes", "--appendfsync", "always", "--no-appendfsync-on-rewrite", "yes"]);
    let (code, view, said) = doctor(&["--lock", &server.redis_url()]);
    assert_eq!(code, Some(1), "{said}");
    assert_eq!(verdict(&view, 0, "persistence"), "warn", "{said}");
    assert!(said.contains("no-appendfsync-on-rewrite"), "{said}");
}

#[test]
fn redis_configured_for_locks_passes() {
    let server = redis(&["--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction"]);
    let (code, view, said) = doctor(&["--lock", &server.redis_url()]);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(view["verdict"], "pass", "{said}");
}

/// A database of this test's own: commits not durable and no Palisade tables fail; then,
/// with the tables made and commits durable, every check passes.
#[tokio::test]
async fn postgres_fails_until_durable_and_migrated() {
    let admin = require_env("PALISADE_POSTGRES_URL");
    let name = format!("doctor_{}", std::process::id());
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin).await.unwrap();
    let run = |sql: String| sqlx::query(sqlx::AssertSqlSafe(sql));
    run(format!("DROP DATABASE IF EXISTS {name}")).execute(&mut conn).await.unwrap();
    run(format!("CREATE DATABASE {name}")).execute(&mut conn).await.unwrap();
    run(format!("ALTER DATABASE {name} SET synchronous_commit = off")).execute(&mut conn).await.unwrap();
    run(format!("ALTER DATABASE {name} SET idle_in_transaction_session_timeout = 0")).execute(&mut conn).await.unwrap();
    let url = common::database_url(&admin, &name);

    let (code, view, said) = doctor(&["--lock", &url, "--store", &url]);
    assert_eq!(code, Some(2), "{said}");
    assert_eq!(verdict(&view, 0, "synchronous_commit"), "fail", "{said}");
    assert_eq!(verdict(&view, 0, "idle_in_transaction_session_timeout"), "warn", "{said}");
    assert_eq!(verdict(&view, 0, "table palisade_locks"), "fail", "{said}");
    assert_eq!(verdict(&view, 1, "table palisade_fences"), "fail", "{said}");

    // Made by the service and the store as they connect; then durable and bounded.
    drop(palisade::connect_lock(&url).await.unwrap());
    drop(palisade::connect_store(&url).await.unwrap());
    run(format!("ALTER DATABASE {name} SET synchronous_commit = on")).execute(&mut conn).await.unwrap();
    run(format!("ALTER DATABASE {name} SET idle_in_transaction_session_timeout = '10min'"))
        .execute(&mut conn)
        .await
        .unwrap();
    let (code, view, said) = doctor(&["--lock", &url, "--store", &url]);
    run(format!("DROP DATABASE {name} WITH (FORCE)")).execute(&mut conn).await.unwrap();
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(view["verdict"], "pass", "{said}");
}

/// A file in rollback-journal mode warns; the same file once a store has opened it (WAL)
/// passes; and the doctor switched nothing itself.
#[tokio::test]
async fn sqlite_warns_until_wal() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/app.db", dir.path().display());
    let options = url.parse::<sqlx::sqlite::SqliteConnectOptions>().unwrap().create_if_missing(true);
    let mut conn: sqlx::SqliteConnection = sqlx::ConnectOptions::connect(&options).await.unwrap();
    sqlx::query("CREATE TABLE orders (id INTEGER)").execute(&mut conn).await.unwrap();

    let (code, view, said) = doctor(&["--lock", &url, "--store", &url]);
    assert_eq!(code, Some(1), "{said}");
    assert_eq!(verdict(&view, 0, "journal_mode"), "warn", "{said}");
    assert_eq!(verdict(&view, 1, "file system"), "pass", "{said}");
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode").fetch_one(&mut conn).await.unwrap();
    assert_eq!(mode, "delete", "the doctor switched the journal mode");
    drop(conn);

    drop(palisade::connect_store(&url).await.unwrap());
    let (code, view, said) = doctor(&["--lock", &url, "--store", &url]);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(view["verdict"], "pass", "{said}");

    // How the URL commits: synchronous=normal warns, off fails.
    let (code, view, said) = doctor(&["--lock", &format!("{url}?synchronous=normal")]);
    assert_eq!((code, verdict(&view, 0, "synchronous")), (Some(1), "warn"), "{said}");
    let (code, view, said) = doctor(&["--lock", &format!("{url}?synchronous=off")]);
    assert_eq!((code, verdict(&view, 0, "synchronous")), (Some(2), "fail"), "{said}");
}

/// A server that cannot be reached fails; a backend without checks says so and warns.
#[test]
fn unreachable_fails_and_unchecked_warns() {
    let (code, view, said) = doctor(&["--lock", "redis://127.0.0.1:1"]);
    assert_eq!(code, Some(2), "{said}");
    assert_eq!(verdict(&view, 0, "connect"), "fail", "{said}");
    // Refused before any connection: nothing listens on port 1.
    let (code, view, said) = doctor(&["--lock", "etcd://127.0.0.1:1"]);
    assert_eq!(code, Some(1), "{said}");
    assert_eq!(verdict(&view, 0, "connect"), "warn", "{said}");
    assert!(said.contains("no configuration checks yet"), "{said}");
}
