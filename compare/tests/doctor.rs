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
    // Configured as a master should be: only the grants' not waiting for it is wrong.
    let _replica = redis(&["--replicaof", "127.0.0.1", &port, "--appendonly", "yes", "--appendfsync", "always"]);
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
    let (code, view, said) = doctor(&["--lock", "etcd://127.0.0.1:1"]);
    assert_eq!(code, Some(2), "{said}");
    assert_eq!(verdict(&view, 0, "connect"), "fail", "{said}");
    let (code, view, said) = doctor(&["--lock", "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"]);
    assert_eq!(code, Some(2), "{said}");
    assert_eq!(verdict(&view, 0, "connect"), "fail", "{said}");
}

/// Redlock: its masters are counted (five pass) and each is judged as a Redis server is; the
/// test's masters keep nothing on disk, so persistence fails on each.
#[test]
fn redlock_masters_are_counted_and_each_judged() {
    let url = require_env("PALISADE_REDLOCK_URL");
    let (code, view, said) = doctor(&["--lock", &url]);
    assert_eq!(code, Some(2), "{said}");
    assert_eq!(verdict(&view, 0, "masters"), "pass", "{said}");
    let checks = view["targets"][0]["checks"].as_array().unwrap();
    let persistence: Vec<&Value> =
        checks.iter().filter(|c| c["name"].as_str().is_some_and(|n| n.starts_with("persistence on master"))).collect();
    assert_eq!(persistence.len(), 5, "{said}");
    assert!(persistence.iter().all(|c| c["verdict"] == "fail"), "{said}");
}

fn etcd(extra: &[&str]) -> LoopbackServer {
    LoopbackServer::etcd_with(&require_env("PALISADE_ETCD_SERVER"), extra).unwrap()
}

/// etcd: one member, never compacted, whose minimum lease TTL (one and a half election
/// timeouts, 7.5 s here) is above the session's 2 s: three warnings.
#[test]
fn etcd_alone_uncompacted_and_raising_the_lease_warns() {
    let server =
        etcd(&["--heartbeat-interval", "500", "--election-timeout", "5000", "--auto-compaction-retention", "0"]);
    let url = format!("{}?session_ttl_s=2", server.etcd_url());
    let (code, view, said) = doctor(&["--lock", &url]);
    assert_eq!(code, Some(1), "{said}");
    assert_eq!(verdict(&view, 0, "cluster size"), "warn", "{said}");
    assert_eq!(verdict(&view, 0, "compaction"), "warn", "{said}");
    assert_eq!(verdict(&view, 0, "session lease TTL"), "warn", "{said}");
    assert!(said.contains("asked for 2 s, granted 8 s"), "{said}");
    assert_eq!(verdict(&view, 0, "alarms"), "pass", "{said}");
}

/// etcd out of space (a 1 MiB quota, filled): the NOSPACE alarm fails, and the doctor still
/// reads the rest (it needs no lease to connect).
#[tokio::test(flavor = "multi_thread")]
async fn etcd_out_of_space_fails() {
    let server = etcd(&["--quota-backend-bytes", "1048576"]);
    let mut client = etcd_client::Client::connect([server.addr().to_string()], None).await.unwrap();
    let value = vec![b'x'; 60_000];
    let mut refused = false;
    for i in 0..100 {
        if client.put(format!("fill/{i}"), value.clone(), None).await.is_err() {
            refused = true;
            break;
        }
    }
    assert!(refused, "a 1 MiB quota took 6 MB of writes");
    let (code, view, said) = doctor(&["--lock", &server.etcd_url()]);
    assert_eq!(code, Some(2), "{said}");
    assert_eq!(verdict(&view, 0, "alarms"), "fail", "{said}");
    assert!(said.contains("NOSPACE"), "{said}");
    assert_eq!(verdict(&view, 0, "session lease TTL"), "warn", "{said}");
}

/// etcd as it should run: three members, history compacted, a lease TTL the cluster keeps.
#[tokio::test(flavor = "multi_thread")]
async fn etcd_cluster_compacted_passes() {
    let cluster = palisade_lab::servers::EtcdCluster::start(&require_env("PALISADE_ETCD_SERVER"), 3).unwrap();
    let endpoints: Vec<String> = cluster.client_ports().iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut client = etcd_client::Client::connect(endpoints, None).await.unwrap();
    let put = client.put("doctor/compact-me", "1", None).await.unwrap();
    let revision = put.header().unwrap().revision();
    client.compact(revision, None).await.unwrap();
    let (code, view, said) = doctor(&["--lock", &cluster.url()]);
    assert_eq!(code, Some(0), "{said}");
    for check in ["cluster size", "alarms", "compaction", "session lease TTL"] {
        assert_eq!(verdict(&view, 0, check), "pass", "{check}: {said}");
    }
}

/// ZooKeeper: one server, and a session timeout (100 ms) below the servers' minimum (two
/// ticks of 500 ms): both warn.
#[test]
fn zookeeper_alone_raising_the_session_warns() {
    let url = format!("{}?session_timeout_ms=100", require_env("PALISADE_ZK_URL"));
    let (code, view, said) = doctor(&["--lock", &url]);
    assert_eq!(code, Some(1), "{said}");
    assert_eq!(verdict(&view, 0, "ensemble size"), "warn", "{said}");
    assert_eq!(verdict(&view, 0, "session timeout"), "warn", "{said}");
    assert!(said.contains("asked for 100 ms, the servers agreed to 1000 ms"), "{said}");
}

/// ZooKeeper as it should run: three servers, a session timeout within their bounds.
#[test]
fn zookeeper_ensemble_passes() {
    let ensemble = palisade_lab::servers::ZkEnsemble::start(&require_env("PALISADE_ZK_CLASSPATH"), 3).unwrap();
    let url = format!("{}?session_timeout_ms=4000", ensemble.url());
    let (code, view, said) = doctor(&["--lock", &url]);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(verdict(&view, 0, "ensemble size"), "pass", "{said}");
    assert_eq!(verdict(&view, 0, "session timeout"), "pass", "{said}");
}

/// A DynamoDB table of this test's own, `dynamodb://NAME?endpoint=…`.
fn dynamodb_url(tag: &str) -> String {
    format!(
        "dynamodb://doctor-{tag}-{}?endpoint={}&region=us-east-1",
        std::process::id(),
        require_env("PALISADE_DYNAMODB_ENDPOINT")
    )
}

/// A table keyed otherwise than the store needs fails, before any write.
#[tokio::test(flavor = "multi_thread")]
async fn dynamodb_table_keyed_otherwise_fails() {
    use palisade::dynamodb::aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    // A store of the right shape, only for its client.
    let helper = palisade::dynamodb::DynamoStore::connect(&dynamodb_url("helper")).await.unwrap();
    let table = format!("doctor-keyed-{}", std::process::id());
    helper
        .client()
        .create_table()
        .table_name(&table)
        .attribute_definitions(
            AttributeDefinition::builder().attribute_name("id").attribute_type(ScalarAttributeType::N).build().unwrap(),
        )
        .key_schema(KeySchemaElement::builder().attribute_name("id").key_type(KeyType::Hash).build().unwrap())
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .unwrap();
    let url = format!("dynamodb://{table}?endpoint={}&region=us-east-1", require_env("PALISADE_DYNAMODB_ENDPOINT"));
    let (code, view, said) = doctor(&["--lock", "memory://", "--store", &url]);
    assert_eq!(code, Some(2), "{said}");
    assert_eq!(verdict(&view, 1, "key schema"), "fail", "{said}");
}

/// DynamoDB's item expiry on the fence attribute, and a watermark whose fence is a string,
/// both fail; with expiry off, deletion protection on and the store's own watermarks, every
/// check passes.
#[tokio::test(flavor = "multi_thread")]
async fn dynamodb_expiring_fences_fail_and_a_protected_table_passes() {
    use palisade::dynamodb::aws_sdk_dynamodb::types::{AttributeValue, TimeToLiveSpecification};
    use palisade::{FencedStoreExt, LockServiceExt, ResourceKey, WriteBatch};
    let url = dynamodb_url("ttl");
    let store = palisade::dynamodb::DynamoStore::connect(&url).await.unwrap();
    let table = store.config().table.clone();
    let locks = std::sync::Arc::new(palisade::MemoryLockService::new());
    let key = ResourceKey::new("alloc", "WH-01").unwrap();
    let lease = locks.lock(&key, palisade::LockOptions::ttl(std::time::Duration::from_secs(30))).await.unwrap();
    store.write(&lease, &WriteBatch::new().put("alloc:WH-01/stock", b"9".to_vec())).await.unwrap();
    lease.release().await.unwrap();

    let ttl = |on: bool| {
        let spec = TimeToLiveSpecification::builder().attribute_name("fence").enabled(on).build().unwrap();
        store.client().update_time_to_live().table_name(&table).time_to_live_specification(spec).send()
    };
    ttl(true).await.unwrap();
    store
        .client()
        .put_item()
        .table_name(&table)
        .item("pk", AttributeValue::S("fence#alloc:WH-02".to_string()))
        .item("fence", AttributeValue::S("7".to_string()))
        .send()
        .await
        .unwrap();
    let (code, view, said) = doctor(&["--lock", "memory://", "--store", &url]);
    assert_eq!(code, Some(2), "{said}");
    assert_eq!(verdict(&view, 1, "key schema"), "pass", "{said}");
    assert_eq!(verdict(&view, 1, "item expiry"), "fail", "{said}");
    assert_eq!(verdict(&view, 1, "fence attributes"), "fail", "{said}");
    assert!(said.contains("fence#alloc:WH-02"), "{said}");
    assert_eq!(verdict(&view, 1, "deletion protection"), "warn", "{said}");

    ttl(false).await.unwrap();
    store
        .client()
        .delete_item()
        .table_name(&table)
        .key("pk", AttributeValue::S("fence#alloc:WH-02".to_string()))
        .send()
        .await
        .unwrap();
    store.client().update_table().table_name(&table).deletion_protection_enabled(true).send().await.unwrap();
    let (code, view, said) = doctor(&["--lock", "memory://", "--store", &url]);
    for check in ["key schema", "table status", "deletion protection", "item expiry", "fence attributes"] {
        assert_eq!(verdict(&view, 1, check), "pass", "{check}: {said}");
    }
    // The lock service is the in-process one: its one check warns.
    assert_eq!(verdict(&view, 0, "in-process"), "warn", "{said}");
    assert_eq!(code, Some(1), "{said}");
}

/// A replica is the next master: one that would evict fence keys and keep nothing fails the
/// doctor of a master configured for locks.
#[test]
fn redis_replica_that_evicts_fails() {
    let primary = redis(&["--appendonly", "yes", "--appendfsync", "always", "--no-appendfsync-on-rewrite", "no"]);
    let port = primary.port().to_string();
    let replica =
        redis(&["--replicaof", "127.0.0.1", &port, "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]);
    let client = redis::Client::open(primary.redis_url()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !redis::cmd("INFO").arg("replication").query::<String>(&mut conn).unwrap().contains("connected_slaves:1") {
        assert!(std::time::Instant::now() < deadline, "the replica never connected");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (code, view, said) = doctor(&["--lock", &primary.redis_url()]);
    assert_eq!(code, Some(2), "{said}");
    let on = format!("maxmemory-policy on replica 127.0.0.1:{}", replica.port());
    assert_eq!(verdict(&view, 0, &on), "fail", "{said}");
    assert_eq!(verdict(&view, 0, "maxmemory-policy"), "pass", "the master's own: {said}");
}

/// Sentinel's quorum: three Sentinels with a quorum of 2 pass; a quorum of 1 (a minority
/// marks the master down) warns; a quorum of 4 (never reached: no failover ever) fails.
#[test]
fn redis_sentinel_quorum_is_judged() {
    let group = palisade_lab::servers::RedisSentinels::start(&require_env("PALISADE_REDIS_SERVER")).unwrap();
    let url = group.url();
    let quorum_of = |view: &Value| verdict(view, 0, "sentinel quorum").to_string();
    let (_, view, said) = doctor(&["--lock", &url]);
    assert_eq!(quorum_of(&view), "pass", "{said}");
    assert!(said.contains("3 Sentinels watch"), "{said}");
    let replica_port = group.servers().1.port();
    assert!(said.contains(&format!("on replica 127.0.0.1:{replica_port}")), "the replica is judged too: {said}");
    let sentinels: Vec<String> = url
        .trim_start_matches("redis+sentinel://")
        .split('/')
        .next()
        .unwrap()
        .split(',')
        .map(|h| format!("redis://{h}"))
        .collect();
    let name = url.rsplit('/').next().unwrap().to_string();
    let set_quorum = |q: u32| {
        for sentinel in &sentinels {
            let mut conn = redis::Client::open(sentinel.as_str()).unwrap().get_connection().unwrap();
            let _: () = redis::cmd("SENTINEL").arg("SET").arg(&name).arg("quorum").arg(q).query(&mut conn).unwrap();
        }
    };
    set_quorum(1);
    let (_, view, said) = doctor(&["--lock", &url]);
    assert_eq!(quorum_of(&view), "warn", "{said}");
    set_quorum(4);
    let (code, view, said) = doctor(&["--lock", &url]);
    assert_eq!(quorum_of(&view), "fail", "{said}");
    assert_eq!(code, Some(2), "{said}");
}
