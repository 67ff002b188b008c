//! `palisade inspect` against the real servers: a lock held through each lock service shows
//! its holder's grant id and fence, the store's watermark shows the grant that set it, and a
//! release shows the lock free with its counter kept; a counter below a watermark is a
//! warning (exit 1); bad usage is exit 2, a store that cannot be read exit 3.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)] // tests: a panic is the failure report

use std::process::Command;
use std::time::Duration;

use palisade::{FencedStoreExt, GrantFence, LockOptions, LockServiceExt, ResourceKey, WriteBatch};
mod common;
#[path = "common/webdriver.rs"]
mod webdriver;

use palisade_conformance::require_env;
use serde_json::Value;

/// Runs `palisade inspect ARGS --json`: its exit code, its JSON and what it said on stderr.
fn inspect(args: &[&str]) -> (Option<i32>, Value, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_palisade")).arg("inspect").args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let json = stdout.lines().last().and_then(|l| serde_json::from_str(l).ok()).unwrap_or(Value::Null);
    (output.status.code(), json, format!("{stdout}{stderr}"))
}

/// A domain of this test process's own, so that runs never see each other's locks.
fn domain(tag: &str) -> String {
    format!("insp{tag}{}", std::process::id())
}

/// Holds `WH-01` of a fresh domain through `lock`, writes under it to `store`, and checks what
/// inspect shows while it is held and after its release. `fence_beside_holder`: whether the
/// service keeps the holder's fence (Redis keeps only the counter).
async fn shows_holder_and_watermark(tag: &str, lock: &str, store: &str, fence_beside_holder: bool) {
    let key = ResourceKey::new(domain(tag), "WH-01").unwrap();
    let locks = palisade::connect_lock(lock).await.unwrap();
    let fenced = palisade::connect_store(store).await.unwrap();
    let lease = locks
        .lock_checked(&*fenced, &key, LockOptions::ttl(Duration::from_secs(30)).wait(Duration::from_secs(10)))
        .await
        .unwrap();
    fenced.write(&lease, &WriteBatch::new().put(format!("{key}/stock"), b"9".to_vec())).await.unwrap();
    let fence = lease.fence().get();
    let grant = lease.grant_fence().grant().to_string();

    let (code, view, said) = inspect(&["--lock", lock, "--store", store, &key.to_string(), "--json"]);
    assert_eq!(code, Some(0), "{said}");
    let row = &view["resources"][0];
    assert_eq!(row["resource"], key.to_string(), "{said}");
    assert_eq!(row["held"], true, "{said}");
    assert_eq!(row["holder"]["grant"], grant.as_str(), "{said}");
    if fence_beside_holder {
        assert_eq!(row["holder"]["fence"], fence, "{said}");
    } else {
        assert_eq!(row["holder"]["fence"], Value::Null, "{said}");
    }
    let counter = row["fence_counter"].as_u64().unwrap_or_else(|| panic!("no counter: {said}"));
    assert!(counter >= fence, "the counter {counter} is below the holder's fence {fence}: {said}");
    if let Some(left) = row["holder"]["expires_in_ms"].as_u64() {
        assert!(left <= 30_000, "{said}");
    }
    let mark = &row["watermarks"][0];
    assert_eq!(
        (&mark["fence"], &mark["grant"], &mark["set_by_holder"]),
        (&fence.into(), &grant.as_str().into(), &true.into()),
        "{said}"
    );
    assert_eq!(row["warnings"].as_array().map(Vec::len), Some(0), "{said}");
    assert!(!said.contains(&lease.token().to_string()), "the owner token was printed: {said}");

    // The listing finds it, by the lock service and by the store.
    let prefix = format!("{}:", key.domain());
    let (code, listed, said) = inspect(&["--lock", lock, "--store", store, "--prefix", &prefix, "--json"]);
    assert_eq!(code, Some(0), "{said}");
    let names: Vec<&str> =
        listed["resources"].as_array().unwrap().iter().filter_map(|r| r["resource"].as_str()).collect();
    assert_eq!(names, [key.to_string().as_str()], "{said}");
    // The listing's watermarks are the store's, read once with the listing.
    let listed_mark = &listed["resources"][0]["watermarks"][0];
    assert_eq!((&listed_mark["fence"], &listed_mark["grant"]), (&fence.into(), &grant.as_str().into()), "{said}");

    // Inspecting changed nothing: the holder still extends, and writes.
    lease.extend(Duration::from_secs(30)).await.unwrap();
    fenced.write(&lease, &WriteBatch::new().put(format!("{key}/stock"), b"8".to_vec())).await.unwrap();
    lease.release().await.unwrap();

    let (code, view, said) = inspect(&["--lock", lock, "--store", store, &key.to_string(), "--json"]);
    assert_eq!(code, Some(0), "{said}");
    let row = &view["resources"][0];
    assert_eq!((&row["held"], &row["holder"]), (&false.into(), &Value::Null), "{said}");
    assert!(row["fence_counter"].as_u64().is_some_and(|c| c >= fence), "{said}");
    assert_eq!(row["watermarks"][0]["fence"], fence, "{said}");
    // The text form says the same to a person.
    let (code, _, text) = inspect(&["--lock", lock, "--store", store, &key.to_string()]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&format!("{key}\n  free")), "{text}");
    assert!(text.contains(&format!("watermark: {fence}, set by grant {grant}")), "{text}");
}

#[tokio::test]
async fn sqlite_lock_and_store() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/wh.db", dir.path().display());
    shows_holder_and_watermark("sq", &url, &url, true).await;
}

#[tokio::test]
async fn postgres_lock_and_store() {
    let url = require_env("PALISADE_POSTGRES_URL");
    shows_holder_and_watermark("pg", &url, &url, true).await;
}

#[tokio::test]
async fn redis_lock_with_dynamodb() {
    let store = format!(
        "dynamodb://inspect-{}?endpoint={}&region=us-east-1",
        std::process::id(),
        require_env("PALISADE_DYNAMODB_ENDPOINT")
    );
    shows_holder_and_watermark("rd", &require_env("PALISADE_REDIS_URL"), &store, false).await;
}

#[tokio::test]
async fn redis_cluster_lock_with_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}/wh.db", dir.path().display());
    shows_holder_and_watermark("rc", &require_env("PALISADE_REDIS_CLUSTER_URL"), &store, false).await;
}

#[tokio::test]
async fn etcd_lock_with_postgres() {
    shows_holder_and_watermark("et", &require_env("PALISADE_ETCD_URL"), &require_env("PALISADE_POSTGRES_URL"), true)
        .await;
}

#[tokio::test]
async fn zookeeper_lock_with_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}/wh.db", dir.path().display());
    shows_holder_and_watermark("zk", &require_env("PALISADE_ZK_URL"), &store, true).await;
}

/// A caller waiting for a held lock shows as the backend keeps it: in the queue (etcd,
/// ZooKeeper) or as the mark that asks the release to notify (PostgreSQL, Redis).
async fn shows_a_waiter(tag: &str, lock: &str, kind: &str) {
    let key = ResourceKey::new(domain(tag), "WH-02").unwrap();
    let locks = palisade::connect_lock(lock).await.unwrap();
    let holder = locks.lock(&key, LockOptions::ttl(Duration::from_secs(30))).await.unwrap();
    let (other, waiting_key) = (palisade::connect_lock(lock).await.unwrap(), key.clone());
    let waiter = tokio::spawn(async move {
        other.lock(&waiting_key, LockOptions::ttl(Duration::from_secs(30)).wait(Duration::from_secs(20))).await
    });
    // The waiter's mark or place lands within a few of its attempts: look for up to 10 s.
    let mut seen = Value::Null;
    for _ in 0..100 {
        let (code, view, said) = inspect(&["--lock", lock, &key.to_string(), "--json"]);
        assert_eq!(code, Some(0), "{said}");
        seen = view["resources"][0]["waiters"].clone();
        if seen["kind"] == kind && (kind != "queued" || seen["count"] == 1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen["kind"], kind, "{seen}");
    if kind == "queued" {
        assert_eq!(seen["count"], 1, "{seen}");
    }
    holder.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(20), waiter).await.unwrap().unwrap().unwrap();
    let (_, view, said) = inspect(&["--lock", lock, &key.to_string(), "--json"]);
    assert_eq!(view["resources"][0]["holder"]["grant"], next.grant_fence().grant().to_string(), "{said}");
    next.release().await.unwrap();
}

#[tokio::test]
async fn waiters_in_etcd_queue() {
    shows_a_waiter("etw", &require_env("PALISADE_ETCD_URL"), "queued").await;
}

#[tokio::test]
async fn waiters_in_zookeeper_queue() {
    shows_a_waiter("zkw", &require_env("PALISADE_ZK_URL"), "queued").await;
}

#[tokio::test]
async fn waiters_marked_in_postgres() {
    shows_a_waiter("pgw", &require_env("PALISADE_POSTGRES_URL"), "marked").await;
}

#[tokio::test]
async fn waiters_marked_in_redis() {
    shows_a_waiter("rdw", &require_env("PALISADE_REDIS_URL"), "marked").await;
}

/// A repair that raises etcd's or ZooKeeper's epoch while a lock is held: the holder's fence
/// was composed with the epoch read at its grant, which the view cannot tell, so it shows none
/// rather than a fence the holder does not write with. The next grant's is above the repair.
async fn a_repair_under_a_holder_leaves_its_fence_unknown(tag: &str, lock: &str) {
    use palisade::LockService as _;
    let key = ResourceKey::new(domain(tag), "WH-03").unwrap();
    let locks = palisade::connect_lock(lock).await.unwrap();
    let lease = locks.lock(&key, LockOptions::ttl(Duration::from_secs(30))).await.unwrap();
    let (_, view, said) = inspect(&["--lock", lock, &key.to_string(), "--json"]);
    assert_eq!(view["resources"][0]["holder"]["fence"], lease.fence().get(), "{said}");
    let floor = palisade::Fence::new(lease.fence().get() + palisade::REGRESSION_GAP);
    locks.advance_fence(&key, floor).await.unwrap();
    let (code, view, said) = inspect(&["--lock", lock, &key.to_string(), "--json"]);
    assert_eq!(code, Some(0), "{said}");
    let row = &view["resources"][0];
    assert_eq!((&row["held"], &row["holder"]["fence"]), (&true.into(), &Value::Null), "{said}");
    lease.release().await.unwrap();
    let next = locks.lock(&key, LockOptions::ttl(Duration::from_secs(30))).await.unwrap();
    assert!(next.fence() > floor);
    let (_, view, said) = inspect(&["--lock", lock, &key.to_string(), "--json"]);
    assert_eq!(view["resources"][0]["holder"]["fence"], next.fence().get(), "{said}");
    next.release().await.unwrap();
}

/// `url` with the query parameter `name=value` added.
fn with_param(url: &str, name: &str, value: &str) -> String {
    let join = if url.contains('?') { '&' } else { '?' };
    format!("{url}{join}{name}={value}")
}

// The epoch is the service's, for every resource under its key prefix or root: raised on the
// shared servers' default one, it would change the holder fences every other test sees.
#[tokio::test]
async fn etcd_repair_under_a_holder() {
    let url =
        with_param(&require_env("PALISADE_ETCD_URL"), "prefix", &format!("inspect-repair-{}/", std::process::id()));
    a_repair_under_a_holder_leaves_its_fence_unknown("etr", &url).await;
}

#[tokio::test]
async fn zookeeper_repair_under_a_holder() {
    let root = format!("/palisade-inspect-{}/locks", std::process::id());
    a_repair_under_a_holder_leaves_its_fence_unknown(
        "zkr",
        &with_param(&require_env("PALISADE_ZK_URL"), "root", &root),
    )
    .await;
}

/// A store's watermark above the service's counter (a counter that lost its tail): the next
/// grant would be refused, and inspect says so and exits 1.
#[tokio::test]
async fn a_counter_below_a_watermark_is_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/wh.db", dir.path().display());
    let key = ResourceKey::new("alloc", "WH-01").unwrap();
    let locks = palisade::connect_lock(&url).await.unwrap();
    let store = palisade::connect_store(&url).await.unwrap();
    let lease = locks.lock(&key, LockOptions::ttl(Duration::from_secs(30))).await.unwrap();
    let ahead = GrantFence::new(palisade::Fence::new(lease.fence().get() + 100), lease.grant_fence().grant());
    store.write_fenced(&key, ahead, &WriteBatch::new().put("stock", b"1".to_vec())).await.unwrap();
    lease.release().await.unwrap();

    let (code, view, said) = inspect(&["--lock", &url, "--store", &url, "--json"]);
    assert_eq!(code, Some(1), "{said}");
    let warnings = view["resources"][0]["warnings"].as_array().unwrap();
    assert!(warnings.iter().any(|w| w.as_str().is_some_and(|w| w.starts_with("FENCE REGRESSION"))), "{said}");
    assert_eq!(view["warnings"], 1, "{said}");
}

/// The lock table dropped (the service's data lost) under a store's watermark: the next grant
/// would get fence 1, and inspect says so.
#[tokio::test]
async fn a_lost_lock_table_under_a_watermark_is_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/wh.db", dir.path().display());
    let key = ResourceKey::new("alloc", "WH-01").unwrap();
    let locks = palisade::connect_lock(&url).await.unwrap();
    let store = palisade::connect_store(&url).await.unwrap();
    let lease = locks.lock(&key, LockOptions::ttl(Duration::from_secs(30))).await.unwrap();
    store.write(&lease, &WriteBatch::new().put("stock", b"1".to_vec())).await.unwrap();
    lease.release().await.unwrap();
    let mut conn = <sqlx::SqliteConnection as sqlx::Connection>::connect(&url).await.unwrap();
    sqlx::query("DROP TABLE palisade_locks").execute(&mut conn).await.unwrap();

    let (code, view, said) = inspect(&["--lock", &url, "--store", &url, "--json"]);
    assert_eq!(code, Some(1), "{said}");
    let row = &view["resources"][0];
    assert_eq!((&row["resource"], &row["fence_counter"]), (&"alloc:WH-01".into(), &0.into()), "{said}");
    assert!(row["warnings"][0].as_str().is_some_and(|w| w.starts_with("FENCE REGRESSION")), "{said}");
    // Inspecting did not make the table again.
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM sqlite_master WHERE name = 'palisade_locks'")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(tables, 0);
}

/// Inspecting a database changes nothing in it: no table made, no journal mode switched.
#[tokio::test]
async fn inspecting_sqlite_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/app.db", dir.path().display());
    let options = url.parse::<sqlx::sqlite::SqliteConnectOptions>().unwrap().create_if_missing(true);
    let mut conn: sqlx::SqliteConnection = sqlx::ConnectOptions::connect(&options).await.unwrap();
    sqlx::query("CREATE TABLE orders (id INTEGER)").execute(&mut conn).await.unwrap();
    let before: String = sqlx::query_scalar("PRAGMA journal_mode").fetch_one(&mut conn).await.unwrap();

    let (code, view, said) = inspect(&["--lock", &url, "--store", &url, "--json"]);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(view["resources"], Value::Array(vec![]), "{said}");
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table'").fetch_all(&mut conn).await.unwrap();
    assert_eq!(tables, ["orders"]);
    let after: String = sqlx::query_scalar("PRAGMA journal_mode").fetch_one(&mut conn).await.unwrap();
    assert_eq!((before.as_str(), after.as_str()), ("delete", "delete"));
}

/// Inspecting a PostgreSQL database makes no table and no function in it.
#[tokio::test]
async fn inspecting_postgres_changes_nothing() {
    let admin = require_env("PALISADE_POSTGRES_URL");
    let name = format!("inspect_ro_{}", std::process::id());
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}"))).execute(&mut conn).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut conn).await.unwrap();
    let url = common::database_url(&admin, &name);

    let (code, view, said) = inspect(&["--lock", &url, "--store", &url, "--json"]);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(view["resources"], Value::Array(vec![]), "{said}");
    let (code, view, said) = inspect(&["--lock", &url, "--store", &url, "alloc:WH-01", "--json"]);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(view["resources"][0]["held"], false, "{said}");
    let mut db = <sqlx::PgConnection as sqlx::Connection>::connect(&url).await.unwrap();
    let made: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM pg_tables WHERE schemaname = 'public') \
         + (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public')",
    )
    .fetch_one(&mut db)
    .await
    .unwrap();
    drop(db);
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {name} WITH (FORCE)"))).execute(&mut conn).await.unwrap();
    assert_eq!(made, 0, "inspect made tables or functions");
}

/// A DynamoDB table that does not exist is an error, never a table made.
#[tokio::test]
async fn inspecting_a_missing_dynamodb_table_makes_none() {
    let endpoint = require_env("PALISADE_DYNAMODB_ENDPOINT");
    let store = format!("dynamodb://inspect-missing-{}?endpoint={endpoint}&region=us-east-1", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let lock = format!("sqlite://{}/wh.db", dir.path().display());
    let _ = palisade::connect_lock(&lock).await.unwrap();
    let (code, _, said) = inspect(&["--lock", &lock, "--store", &store, "--json"]);
    assert_eq!(code, Some(3), "{said}");
    let (code, _, said) = inspect(&["--lock", &lock, "--store", &store, "--json"]);
    assert_eq!(code, Some(3), "the first inspect made the table: {said}");
}

#[test]
fn bad_usage_is_2_and_an_unreadable_store_3() {
    let (code, _, said) = inspect(&["--lock", "sqlite://x.db", "no-colon"]);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("domain:id"), "{said}");
    let (code, _, said) = inspect(&["--lock", "sqlite:///nonexistent/dir/wh.db"]);
    assert_eq!(code, Some(3), "{said}");
    assert!(said.contains("no SQLite database at"), "{said}");
    let (code, _, said) = inspect(&["--lock", "redlock://127.0.0.1:1"]);
    assert_eq!(code, Some(3), "{said}");
    let (code, _, said) = inspect(&["--lock", "sqlite://x.db", "--watch", "0"]);
    assert_eq!(code, Some(2), "{said}");
}

/// A password in a URL is never printed.
#[tokio::test]
async fn credentials_are_never_shown() {
    let url = require_env("PALISADE_POSTGRES_URL");
    let (code, view, said) = inspect(&["--lock", &url, "--store", &url, "--prefix", "never-used-domain:", "--json"]);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(view["lock"]["url"], palisade::redact_url(&url), "{said}");
    if let Some(password) =
        url.split_once("://").and_then(|(_, r)| r.split_once('@')).and_then(|(u, _)| u.split_once(':')).map(|(_, p)| p)
    {
        assert!(!said.contains(password), "{said}");
    }
}

/// `palisade inspect --serve` running as a process, killed when dropped.
struct Served {
    child: std::process::Child,
    port: u16,
}

impl Served {
    /// Starts `palisade inspect ARGS --serve 127.0.0.1:0` and waits for the address it prints.
    fn start(args: &[&str]) -> Served {
        use std::io::BufRead;
        let mut child = Command::new(env!("CARGO_BIN_EXE_palisade"))
            .arg("inspect")
            .args(args)
            .args(["--serve", "127.0.0.1:0"])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (send, said) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
        let mut lines = Vec::new();
        let port = loop {
            match said.recv_timeout(Duration::from_secs(30)) {
                Ok(line) => {
                    let port = line
                        .split_once("serving http://127.0.0.1:")
                        .and_then(|(_, rest)| rest.split('/').next())
                        .and_then(|p| p.parse::<u16>().ok());
                    lines.push(line);
                    if let Some(port) = port {
                        break port;
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    panic!("inspect --serve did not say where it serves: {lines:?}");
                }
            }
        };
        Served { child, port }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The page of `inspect --serve`, in a real browser against the real PostgreSQL: it shows a
/// held lock with its holder's grant and the store's watermark, then its release, refreshing
/// itself (the page is never reloaded); the server answers only reads.
#[tokio::test(flavor = "multi_thread")]
async fn the_page_shows_a_held_lock_then_its_release_in_a_browser() {
    let url = require_env("PALISADE_POSTGRES_URL");
    let key = ResourceKey::new(domain("page"), "WH-01").unwrap();
    let locks = palisade::connect_lock(&url).await.unwrap();
    let fenced = palisade::connect_store(&url).await.unwrap();
    let lease = locks
        .lock_checked(&*fenced, &key, LockOptions::ttl(Duration::from_secs(60)).wait(Duration::from_secs(10)))
        .await
        .unwrap();
    fenced.write(&lease, &WriteBatch::new().put(format!("{key}/stock"), b"9".to_vec())).await.unwrap();
    let grant = lease.grant_fence().grant().to_string();
    let fence = lease.fence().get();

    let prefix = format!("{}:", key.domain());
    let served = Served::start(&["--lock", &url, "--store", &url, "--prefix", &prefix, "--watch", "0.5"]);
    let browser = webdriver::Browser::open();
    browser.go(&format!("http://127.0.0.1:{}/", served.port));
    // The row's classes and text, or null while it is not on the page.
    let row = "const r = document.querySelector(`tr[data-resource=\"${arguments[0]}\"]`); \
               return r ? { classes: r.className, text: r.innerText } : null;";
    let name = serde_json::json!(key.to_string());
    let held = browser.wait_until(Duration::from_secs(20), row, std::slice::from_ref(&name), |r| {
        r["classes"].as_str().is_some_and(|c| c.split(' ').any(|c| c == "held"))
    });
    let text = held["text"].as_str().unwrap();
    assert!(text.contains(&format!("held by grant {grant}")), "{held}");
    assert!(text.contains(&format!("postgres: {fence} by the holder")), "{held}");
    assert!(!text.contains(&lease.token().to_string()), "the owner token is on the page: {held}");
    // A mark that a reload would wipe.
    browser.run("window.palisadeTestMark = 'kept';", &[]);

    lease.release().await.unwrap();
    let free = browser.wait_until(Duration::from_secs(20), row, std::slice::from_ref(&name), |r| {
        r["classes"].as_str().is_some_and(|c| c.split(' ').any(|c| c == "free"))
    });
    assert!(free["text"].as_str().unwrap().contains(&format!("postgres: {fence} by")), "{free}");
    assert_eq!(browser.run("return window.palisadeTestMark;", &[]), "kept", "the page was reloaded, not refreshed");

    // The JSON beside it, and nothing but reads.
    let (status, body) = webdriver::http(served.port, "GET", "/view.json", None);
    assert_eq!(status, 200, "{body}");
    let view: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(view["resources"][0]["resource"], key.to_string(), "{view}");
    assert_eq!(view["resources"][0]["held"], false, "{view}");
    let (status, _) = webdriver::http(served.port, "POST", "/", Some(&serde_json::json!({})));
    assert_eq!(status, 405, "the page's server accepted a POST");
}

/// `--serve` refuses an address it cannot bind (exit 2), and `--json` with it.
#[test]
fn serve_usage() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/wh.db", dir.path().display());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["inspect", "--lock", &url, "--serve", &addr])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot serve on"));
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["inspect", "--lock", &url, "--serve", "127.0.0.1:0", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The primitives, seen whole against the real PostgreSQL: a semaphore's permits, a read-write
/// lock's reader inside and last writer, an election's leader, term and proclaimed value; in
/// the listing, in one resource's view and in the text.
#[tokio::test(flavor = "multi_thread")]
async fn semaphore_rwlock_and_election_are_shown_whole() {
    use std::sync::Arc;
    let url = require_env("PALISADE_POSTGRES_URL");
    let d = domain("prim");
    let locks = palisade::connect_lock(&url).await.unwrap();
    let store = palisade::connect_store(&url).await.unwrap();
    let opts = LockOptions::ttl(Duration::from_secs(60)).wait(Duration::from_secs(10));

    let semaphore = palisade::Semaphore::new(Arc::clone(&locks), ResourceKey::new(&d, "pool").unwrap(), 3).unwrap();
    let (p1, p2) = (semaphore.acquire(opts).await.unwrap(), semaphore.acquire(opts).await.unwrap());
    let rw = palisade::RwLock::new(Arc::clone(&locks), Arc::clone(&store), ResourceKey::new(&d, "prices").unwrap(), 4)
        .unwrap();
    let writer = rw.write(opts).await.unwrap();
    let writer_fence = writer.fence().get();
    writer.release().await.unwrap();
    let reader = rw.read(opts).await.unwrap();
    let election =
        palisade::Election::new(Arc::clone(&locks), ResourceKey::new(&d, "relay").unwrap(), Duration::from_secs(60));
    let leader = election.campaign(Duration::from_secs(10)).await.unwrap();
    leader.proclaim(&*store, b"node-a".to_vec()).await.unwrap();
    let term = leader.term().get();

    let (code, listed, said) = inspect(&["--lock", &url, "--store", &url, "--prefix", &format!("{d}:"), "--json"]);
    assert_eq!(code, Some(0), "{said}");
    let primitives = listed["primitives"].as_array().unwrap_or_else(|| panic!("{said}"));
    let find = |kind: &str| {
        primitives.iter().find(|p| p["kind"] == kind).unwrap_or_else(|| panic!("no {kind} in {said}")).clone()
    };
    let sem = find("semaphore");
    assert_eq!((&sem["resource"], &sem["permits_held"]), (&format!("{d}:pool").into(), &2.into()), "{said}");
    let held_grants: Vec<&str> =
        sem["permits"].as_array().unwrap().iter().filter_map(|p| p["holder"]["grant"].as_str()).collect();
    for lease in [&p1, &p2] {
        assert!(held_grants.contains(&lease.grant_fence().grant().to_string().as_str()), "{said}");
    }
    let rwl = find("rwlock");
    assert_eq!(rwl["resource"], format!("{d}:prices"), "{said}");
    assert_eq!(rwl["readers_inside"], 1, "{said}");
    assert_eq!(rwl["gate"], Value::Null, "{said}");
    assert_eq!(rwl["last_writer_fence"], writer_fence, "{said}");
    let el = find("election");
    assert_eq!(el["resource"], format!("{d}:relay"), "{said}");
    assert_eq!(el["leader"]["grant"], leader.lease().grant_fence().grant().to_string(), "{said}");
    assert_eq!((&el["term"], &el["proclaimed"]["term"]), (&term.into(), &term.into()), "{said}");
    assert_eq!(el["proclaimed"]["value"], "node-a", "{said}");

    // In words: a prefix lists the locks a semaphore is made of; one resource's view shows an
    // election whole.
    let (code, _, text) = inspect(&["--lock", &url, "--store", &url, "--prefix", &format!("{d}:pool")]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&format!("semaphore {d}:pool: 2 of the 2 permits seen held")), "{text}");
    let (code, _, text) = inspect(&["--lock", &url, "--store", &url, &format!("{d}:prices")]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&format!("readers not listed (--prefix {d}:prices lists them)")), "{text}");
    let (code, _, text) = inspect(&["--lock", &url, "--store", &url, &format!("{d}:relay")]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&format!("election {d}:relay: leader grant")), "{text}");
    assert!(text.contains(&format!("proclaimed \"node-a\" at term {term}")), "{text}");

    reader.release().await.unwrap();
    leader.resign().await.unwrap();
    p1.release().await.unwrap();
    p2.release().await.unwrap();
    let (_, after, said) = inspect(&["--lock", &url, "--store", &url, "--prefix", &format!("{d}:"), "--json"]);
    let el = after["primitives"].as_array().unwrap().iter().find(|p| p["kind"] == "election").cloned().unwrap();
    assert_eq!(el["leader"], Value::Null, "a resigned leader is gone: {said}");
}

/// Redlock: a lock held on a majority of the five masters shows its holder's grant id, with no
/// fence and no counter (Redlock issues none); released, it shows free.
#[tokio::test(flavor = "multi_thread")]
async fn redlock_shows_the_majority_holder() {
    let url = require_env("PALISADE_REDLOCK_URL");
    let key = ResourceKey::new(domain("rl"), "WH-01").unwrap();
    let palisade::AnyLockService::Unfenced(locks) = palisade::connect_any_lock(&url).await.unwrap() else {
        panic!("redlock connected as a fenced service");
    };
    let ttl = palisade::Ttl::new(Duration::from_secs(30)).unwrap();
    let grant = locks.try_acquire(&key, ttl).await.unwrap().expect("a fresh key is free");
    let (code, view, said) = inspect(&["--lock", &url, &key.to_string(), "--json"]);
    assert_eq!(code, Some(0), "{said}");
    let row = &view["resources"][0];
    assert_eq!(row["holder"]["grant"], grant.grant_id().to_string(), "{said}");
    assert_eq!((&row["holder"]["fence"], &row["fence_counter"]), (&Value::Null, &Value::Null), "{said}");
    assert!(row["holder"]["expires_in_ms"].as_u64().is_some_and(|ms| ms <= 30_000), "{said}");
    assert!(!said.contains(&grant.token().to_string()), "the owner token was printed: {said}");
    let (code, listed, said) = inspect(&["--lock", &url, "--prefix", &format!("{}:", key.domain()), "--json"]);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(listed["resources"][0]["resource"], key.to_string(), "{said}");
    locks.release(&grant).await.unwrap();
    let (_, view, said) = inspect(&["--lock", &url, &key.to_string(), "--json"]);
    assert_eq!(view["resources"][0]["held"], false, "{said}");
}
