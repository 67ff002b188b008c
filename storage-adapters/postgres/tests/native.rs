//! The PostgreSQL store's native APIs: your own statements in a fenced transaction, and the
//! incident's single-statement form on your own rows.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use palisade_conformance::require_env;
use palisade_core::{ErrorKind, Fence, FencedStore, GrantFence, GrantId, LockOptions, ResourceKey, WatermarkSource};
use palisade_postgres::{FencedRow, PostgresConfig, PostgresStore, map_err};

async fn store() -> PostgresStore {
    PostgresStore::connect(&require_env("PALISADE_POSTGRES_URL")).await.unwrap()
}

/// A table name no other test run uses: the process id and the clock's nanoseconds.
fn unique(tag: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{tag}_{}_{nanos}", std::process::id())
}

#[tokio::test]
async fn own_statements_commit_with_the_watermark_or_not_at_all() {
    let s = store().await;
    let table = unique("inv");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE TABLE {table} (sku TEXT PRIMARY KEY, qty BIGINT NOT NULL)")))
        .execute(s.pool())
        .await
        .map_err(map_err)
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("INSERT INTO {table} VALUES ('S1', 10)"))).execute(s.pool()).await.unwrap();
    let qty = |s: PostgresStore, table: String| async move {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!("SELECT qty FROM {table} WHERE sku = 'S1'")))
            .fetch_one(s.pool())
            .await
            .unwrap()
    };
    let res = ResourceKey::new("native", table.clone()).unwrap();
    {
        let mut tx = s.begin_with_fence(&res, gf(5)).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("UPDATE {table} SET qty = qty - 1"))).execute(tx.conn()).await.unwrap();
        // Dropped without commit.
    }
    assert_eq!(qty(s.clone(), table.clone()).await, 10);
    assert_eq!(s.watermark(&res).await.unwrap(), None);

    let mut tx = s.begin_with_fence(&res, gf(5)).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("UPDATE {table} SET qty = qty - 1"))).execute(tx.conn()).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(qty(s.clone(), table.clone()).await, 9);
    let err = s.begin_with_fence(&res, gf(4)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StaleFence { presented: Fence::new(4), current: Fence::new(5) });
    assert_eq!(qty(s.clone(), table.clone()).await, 9);
}

/// A fresh table `(sku, qty, <fence column>)` holding SKU `S1` with 10 units (fence left to the
/// column's default).
async fn inventory_table(s: &PostgresStore, tag: &str, fence_column: &str) -> String {
    let table = unique(tag);
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (sku TEXT PRIMARY KEY, qty BIGINT NOT NULL, {fence_column})"
    )))
    .execute(s.pool())
    .await
    .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("INSERT INTO {table} (sku, qty) VALUES ('S1', 10)")))
        .execute(s.pool())
        .await
        .unwrap();
    table
}

#[tokio::test]
async fn the_incidents_single_statement_form_accepts_equal_and_refuses_lower() {
    let s = store().await;
    let table = inventory_table(&s, "rows", "fence BIGINT NOT NULL DEFAULT 0").await;
    let row = FencedRow { table: &table, key_column: "sku", fence_column: "fence" };
    for _ in 0..2 {
        // Equal fences: one grant writes twice (the incident's `fence < @fence` would refuse the second).
        s.update_row_fenced(&row, "S1", Fence::new(42), "qty = qty + $3", |q| q.bind(-1i64)).await.unwrap();
    }
    let err = s.update_row_fenced(&row, "S1", Fence::new(41), "qty = qty + $3", |q| q.bind(-1i64)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StaleFence { presented: Fence::new(41), current: Fence::new(42) });
    let (qty, fence): (i64, i64) =
        sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT qty, fence FROM {table} WHERE sku = 'S1'")))
            .fetch_one(s.pool())
            .await
            .unwrap();
    assert_eq!((qty, fence), (8, 42));
    let err = s.update_row_fenced(&row, "NOPE", Fence::new(50), "qty = qty + $3", |q| q.bind(-1i64)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    let bad = FencedRow { table: "x; DROP TABLE y", key_column: "sku", fence_column: "fence" };
    let err = s.update_row_fenced(&bad, "S1", Fence::new(50), "qty = 1", |q| q).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
}

/// A row whose fence column is NULL (an existing table that just gained the column, a row
/// inserted without it) is writable by any fence: `fence <= $1` alone is NULL there, and the
/// row could never be written (`StaleFence { current: 0 }` forever).
#[tokio::test]
async fn a_row_with_a_null_fence_is_writable() {
    let s = store().await;
    let table = inventory_table(&s, "nullfence", "fence BIGINT").await;
    let row = FencedRow { table: &table, key_column: "sku", fence_column: "fence" };
    s.update_row_fenced(&row, "S1", Fence::new(7), "qty = qty + $3", |q| q.bind(-1i64)).await.unwrap();
    let err = s.update_row_fenced(&row, "S1", Fence::new(6), "qty = qty + $3", |q| q.bind(-1i64)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StaleFence { presented: Fence::new(6), current: Fence::new(7) });
    let (qty, fence): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT qty, fence FROM {table}")))
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!((qty, fence), (9, 7));
}

#[tokio::test]
async fn configurable_tables_and_bad_urls() {
    let url = require_env("PALISADE_POSTGRES_URL");
    let fences = unique("f");
    let records = unique("r");
    let config = PostgresConfig {
        fences_table: fences.clone(),
        records_table: records.clone(),
        ..PostgresConfig::new(url.clone())
    };
    let s = PostgresStore::open(config).await.unwrap();
    let res = ResourceKey::new("cfg", "x").unwrap();
    s.apply(&res, gf(3), &palisade_core::WriteBatch::new().put("k", b"v".to_vec())).await.unwrap();
    let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {fences}")))
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(n, 1);
    let bad = PostgresConfig { records_table: "no good".into(), ..PostgresConfig::new(url) };
    assert_eq!(PostgresStore::open(bad).await.unwrap_err().kind(), ErrorKind::InvalidConfig);
    assert_eq!(PostgresStore::connect("mysql://x").await.unwrap_err().kind(), ErrorKind::InvalidConfig);
    let err = PostgresStore::connect("postgres://nobody:pw@127.0.0.1:1/none").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(!err.to_string().contains(":pw@"), "{err}");
}

/// PostgreSQL answers COMMIT of a transaction that a failed statement aborted with ROLLBACK
/// and no error: a statement error the caller ignored must not turn into `Ok` from `commit`
/// when nothing, not even the watermark, was written.
#[tokio::test]
async fn commit_after_an_ignored_failed_statement_is_an_error() {
    let s = store().await;
    let res = ResourceKey::new("aborted", unique("tx")).unwrap();
    let mut tx = s.begin_with_fence(&res, gf(5)).await.unwrap();
    let failed = sqlx::query("SELECT 1 / 0").execute(tx.conn()).await;
    assert!(failed.is_err(), "division by zero must fail");
    let err = tx.commit().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Backend, "{err:?}");
    assert!(!err.is_retryable(), "{err:?}");
    assert_eq!(s.watermark(&res).await.unwrap(), None, "the watermark raise was rolled back with the rest");
}

/// `Check { expected: None }` ("must be absent") must hold at commit: a row another transaction
/// inserted but had not committed when the check ran must make the batch a `Conflict`, not be
/// overwritten or ignored. A raw connection holds the uncommitted insert.
#[tokio::test]
async fn a_must_be_absent_check_sees_an_uncommitted_insert() {
    let s = store().await;
    let key = format!("absent/{}", unique("k"));
    let mut raw = s.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO palisade_records (key, value, fence) VALUES ($1, 'theirs', NULL)")
        .bind(&key)
        .execute(&mut *raw)
        .await
        .unwrap();
    let batch = palisade_core::WriteBatch::new().check(key.clone(), None).put(key.clone(), b"ours".to_vec());
    let res = ResourceKey::new("absent", unique("r")).unwrap();
    let apply = {
        let s = s.clone();
        tokio::spawn(async move { s.apply(&res, gf(1), &batch).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    raw.commit().await.unwrap();
    let result = apply.await.unwrap();
    let err = result.expect_err("the key exists once the other transaction commits");
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err:?}");
    assert_eq!(s.read(&key).await.unwrap().unwrap().value, b"theirs", "their row was overwritten");

    // The claim is the batch's own business: a create of the checked key takes its place, and
    // a check alone leaves no row behind.
    let (fresh, alone) = (format!("absent/{}", unique("c")), format!("absent/{}", unique("a")));
    let res = ResourceKey::new("absent", unique("r2")).unwrap();
    let batch = palisade_core::WriteBatch::new().check(fresh.clone(), None).create(fresh.clone(), b"v".to_vec());
    s.apply(&res, gf(1), &batch).await.unwrap();
    assert_eq!(s.read(&fresh).await.unwrap().unwrap().value, b"v");
    let batch = palisade_core::WriteBatch::new().check(alone.clone(), None).put(format!("{alone}-x"), b"x".to_vec());
    s.apply(&res, gf(1), &batch).await.unwrap();
    assert!(s.read(&alone).await.unwrap().is_none(), "the placeholder row was left behind");
}

/// `fence` as the test's one grant presents it.
fn gf(fence: u64) -> GrantFence {
    GrantFence::new(Fence::new(fence), GrantId::from_bytes([0xa1; 16]))
}

/// Rule 2 on both paths: the fence another grant set the watermark with is refused as a
/// duplicate (`begin_fenced` and `apply`), nothing is written, and the first grant goes on.
#[tokio::test]
async fn an_equal_fence_from_another_grant_is_refused_as_a_duplicate() {
    let s = store().await;
    let res = ResourceKey::new("native", unique("dup")).unwrap();
    let record = format!("native/{}", res.id());
    let batch = |v: &str| palisade_core::WriteBatch::new().put(record.clone(), v.as_bytes().to_vec());
    s.apply(&res, gf(5), &batch("first")).await.unwrap();
    let other = GrantFence::new(Fence::new(5), GrantId::from_bytes([0xb2; 16]));
    let err = s.apply(&res, other, &batch("second")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DuplicateFence { fence: Fence::new(5) }, "{err}");
    assert!(!err.is_retryable());
    let err = s.begin_with_fence(&res, other).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DuplicateFence { fence: Fence::new(5) }, "{err}");
    assert_eq!(s.read(&record).await.unwrap().unwrap().value, b"first");
    s.apply(&res, gf(5), &batch("again")).await.unwrap();
    s.begin_with_fence(&res, gf(5)).await.unwrap().commit().await.unwrap();
}

/// A watermark table created before grant ids were recorded gets the column at connect; its
/// old watermark accepts an equal fence once and then remembers that grant.
#[tokio::test]
async fn a_watermark_table_without_grant_ids_is_migrated() {
    let url = require_env("PALISADE_POSTGRES_URL");
    let (fences, records) = (unique("legacy_fences"), unique("legacy_records"));
    let s = store().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {fences} (resource TEXT PRIMARY KEY, fence BIGINT NOT NULL); \
         INSERT INTO {fences} VALUES ('native:legacy', 7)"
    )))
    .execute(s.pool())
    .await
    .unwrap();
    let config = PostgresConfig { fences_table: fences, records_table: records, ..PostgresConfig::new(url) };
    let s = PostgresStore::open(config).await.unwrap();
    let res = ResourceKey::new("native", "legacy").unwrap();
    assert_eq!(s.watermark(&res).await.unwrap(), Some(Fence::new(7)));
    s.apply(&res, gf(7), &palisade_core::WriteBatch::new()).await.unwrap();
    let other = GrantFence::new(Fence::new(7), GrantId::from_bytes([0xb2; 16]));
    let err = s.apply(&res, other, &palisade_core::WriteBatch::new()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DuplicateFence { fence: Fence::new(7) }, "{err}");
}

/// Issue 16.7b: a team that writes only through `update_row_fenced` never raises the store's
/// watermark, so `lock_checked` against the store cannot see a lock service that lost its
/// counter. Against `row_watermark` it can: it repairs the counter, and the row is writable
/// again with a fence above the gap.
#[tokio::test]
async fn lock_checked_against_a_row_sees_a_regression_the_store_watermark_cannot() {
    use std::sync::Arc;
    use std::time::Duration;

    use palisade_core::{LockServiceExt, MemoryLockService, REGRESSION_GAP};

    let s = store().await;
    let table = inventory_table(&s, "rowcheck", "fence BIGINT").await;
    let row = FencedRow { table: &table, key_column: "sku", fence_column: "fence" };
    let res = ResourceKey::new("native", table.clone()).unwrap();
    let ttl = Duration::from_secs(30);
    let locks = Arc::new(MemoryLockService::new());
    for _ in 0..3 {
        let lease =
            locks.lock_checked(&s.row_watermark(&row, "S1"), &res, LockOptions::ttl(ttl).wait(ttl)).await.unwrap();
        s.update_row_fenced(&row, "S1", lease.fence(), "qty = qty + $3", |q| q.bind(-1i64)).await.unwrap();
        lease.release().await.unwrap();
    }
    assert_eq!(s.row_watermark(&row, "S1").highest_fence(&res).await.unwrap(), Some(Fence::new(3)));

    locks.forget_fences(); // the lock service lost its counter
    let blind = locks.lock_checked(&s, &res, LockOptions::ttl(ttl).wait(ttl)).await.unwrap();
    assert_eq!(blind.fence(), Fence::new(1), "the store's watermark knows nothing of the row's fence");
    let err = s.update_row_fenced(&row, "S1", blind.fence(), "qty = qty + $3", |q| q.bind(-1i64)).await.unwrap_err();
    assert!(err.stale_fence_details().is_some(), "{err}");
    blind.release().await.unwrap();

    let checked =
        locks.lock_checked(&s.row_watermark(&row, "S1"), &res, LockOptions::ttl(ttl).wait(ttl)).await.unwrap();
    assert!(checked.fence().get() > 3 + REGRESSION_GAP, "fence {} after the repair", checked.fence());
    s.update_row_fenced(&row, "S1", checked.fence(), "qty = qty + $3", |q| q.bind(-1i64)).await.unwrap();
    let missing = s.row_watermark(&row, "NOPE").highest_fence(&res).await.unwrap();
    assert_eq!(missing, None, "a missing row was never written under a fence");
}

/// A TCP relay to PostgreSQL that forwards the first message containing `marker` (`COMMIT`, or
/// a value bound to an already prepared statement) to the server and then cuts the client
/// off, so the statement runs and its reply is lost. Returns the URL to connect through it.
async fn reply_cutter(url: &str, marker: &'static [u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let upstream = url.split('@').nth(1).and_then(|rest| rest.split('/').next()).unwrap().to_string();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else { return };
            let server = tokio::net::TcpStream::connect(&upstream).await.unwrap();
            let (mut client_rd, mut client_wr) = client.into_split();
            let (mut server_rd, mut server_wr) = server.into_split();
            let cut = std::sync::Arc::new(tokio::sync::Notify::new());
            let cut_up = std::sync::Arc::clone(&cut);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = client_rd.read(&mut buf).await.unwrap_or(0);
                    if n == 0 || server_wr.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                    if buf[..n].windows(marker.len()).any(|w| w == marker) {
                        cut_up.notify_one();
                        // Keep the server side open until the COMMIT has been processed.
                        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                        return;
                    }
                }
            });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    tokio::select! {
                        () = cut.notified() => return, // drops the client's write half: reply lost
                        read = server_rd.read(&mut buf) => {
                            let n = read.unwrap_or(0);
                            if n == 0 || client_wr.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    let (scheme_user, rest) = url.split_once('@').unwrap();
    let path = rest.split_once('/').map_or("", |(_, p)| p);
    format!("{scheme_user}@{addr}/{path}?sslmode=disable")
}

/// Issue 16.5b: a COMMIT whose reply is lost may have committed. It must be `OutcomeUnknown`
/// (re-read before retrying), not the retryable `Unavailable` that invites a blind second
/// attempt. Here it did commit: the watermark moved.
#[tokio::test]
async fn a_commit_whose_reply_is_lost_is_outcome_unknown() {
    let url = require_env("PALISADE_POSTGRES_URL");
    let direct = store().await;
    // No migration through the relay: its COMMIT would be cut too (the direct store ran it).
    let config = PostgresConfig {
        max_connections: 1,
        migrate: false,
        ..PostgresConfig::new(reply_cutter(&url, b"COMMIT").await)
    };
    let s = PostgresStore::open(config).await.unwrap();
    let res = ResourceKey::new("lostreply", unique("tx")).unwrap();
    let tx = s.begin_with_fence(&res, gf(9)).await.unwrap();
    let err = tx.commit().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err:?}");
    assert!(!err.is_retryable(), "{err:?}");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(direct.watermark(&res).await.unwrap(), Some(Fence::new(9)), "the COMMIT did happen");
}

/// A record batch is one statement, its own transaction: a lost reply may have committed, so
/// it is `OutcomeUnknown` as a lost COMMIT reply is. Here it did: the record is there.
#[tokio::test]
async fn a_batch_whose_reply_is_lost_is_outcome_unknown() {
    let url = require_env("PALISADE_POSTGRES_URL");
    let direct = store().await;
    let config = PostgresConfig {
        max_connections: 1,
        migrate: false,
        ..PostgresConfig::new(reply_cutter(&url, b"cut-after-this").await)
    };
    let s = PostgresStore::open(config).await.unwrap();
    let res = ResourceKey::new("lostreply", unique("batch")).unwrap();
    // The first call prepares the statement; the second sends only its values, the marker
    // among them, in one flight.
    let first = palisade_core::WriteBatch::new().put(format!("lostreply/{}", unique("p")), b"p".to_vec());
    s.apply(&res, gf(2), &first).await.unwrap();
    let record = format!("lostreply/cut-after-this-{}", unique("r"));
    let batch = palisade_core::WriteBatch::new().put(record.clone(), b"v".to_vec());
    let err = s.apply(&res, gf(3), &batch).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err:?}");
    assert!(!err.is_retryable(), "{err:?}");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(direct.read(&record).await.unwrap().map(|r| r.value), Some(b"v".to_vec()), "it did commit");
    assert_eq!(direct.watermark(&res).await.unwrap(), Some(Fence::new(3)));
}

/// Issue 19: the store on the application's own pool, the fenced statement in the
/// application's own transaction beside its own statements, a key column of another type
/// than text, and the fence taken from the lease.
#[tokio::test]
async fn fenced_writes_join_the_callers_transaction_on_the_callers_pool() {
    use std::sync::Arc;
    use std::time::Duration;

    use palisade_core::{LockServiceExt, MemoryLockService};

    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&require_env("PALISADE_POSTGRES_URL"))
        .await
        .unwrap();
    let s = PostgresStore::from_pool(pool.clone()).await.unwrap();
    let (table, audit) = (unique("items"), unique("audit"));
    for ddl in [
        format!("CREATE TABLE {table} (id BIGINT PRIMARY KEY, qty BIGINT NOT NULL, fence BIGINT)"),
        format!("CREATE TABLE {audit} (id BIGINT NOT NULL, note TEXT NOT NULL)"),
        format!("INSERT INTO {table} VALUES (7, 10, NULL)"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(ddl)).execute(&pool).await.unwrap();
    }
    let row = FencedRow { table: &table, key_column: "id", fence_column: "fence" };
    let locks = Arc::new(MemoryLockService::new());
    let key = ResourceKey::new("items", table.as_str()).unwrap(); // watermarks outlive a run: a key of its own
    let old = locks.lock(&key, LockOptions::ttl(Duration::from_millis(20))).await.unwrap();
    tokio::time::sleep(Duration::from_millis(40)).await; // paused past its TTL
    let new = locks.lock(&key, LockOptions::ttl(Duration::from_secs(30))).await.unwrap();

    let state = || async {
        let qty: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT qty FROM {table} WHERE id = 7")))
            .fetch_one(&pool)
            .await
            .unwrap();
        let notes: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {audit}")))
            .fetch_one(&pool)
            .await
            .unwrap();
        (qty, notes)
    };
    let insert_note = format!("INSERT INTO {audit} VALUES (7, 'shipped')");

    // The new holder: update and audit row commit together; an i64 key binds as BIGINT.
    let mut tx = pool.begin().await.unwrap();
    s.update_row_fenced_in(&mut tx, &row, 7_i64, &new, "qty = qty - $3", |q| q.bind(1_i64)).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(insert_note.clone())).execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(state().await, (9, 1));

    // The stale holder: refused, no row changed, its transaction still usable and rolled back.
    let mut tx = pool.begin().await.unwrap();
    let err =
        s.update_row_fenced_in(&mut tx, &row, 7_i64, &old, "qty = qty - $3", |q| q.bind(1_i64)).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::StaleFence { .. }), "{err}");
    sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(state().await, (9, 1));

    // The watermark check in the caller's transaction: accepted for the new lease and
    // committed with the caller's statement; refused for the old one, nothing written.
    let mut tx = pool.begin().await.unwrap();
    s.check_fence_in(&mut tx, &new).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(insert_note.clone())).execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(s.watermark(&key).await.unwrap(), Some(new.fence()));
    let mut tx = pool.begin().await.unwrap();
    let err = s.check_fence_in(&mut tx, &old).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::StaleFence { .. }), "{err}");
    drop(tx);
    assert_eq!(state().await, (9, 2));

    // begin_fenced takes the lease: its resource and fence.
    let tx = s.begin_fenced(&new).await.unwrap();
    assert_eq!((tx.resource(), tx.fence()), (&key, new.fence()));
    tx.rollback().await.unwrap();
    assert!(s.begin_fenced(&old).await.is_err());
}

/// The lock service and a store with `require_live_lock` in one database.
async fn one_database(
    require_live_lock: bool,
) -> (PostgresStore, std::sync::Arc<palisade_postgres::PostgresLockService>) {
    let config = PostgresConfig {
        require_live_lock,
        ..PostgresConfig::from_url(&require_env("PALISADE_POSTGRES_URL")).unwrap()
    };
    let store = PostgresStore::open(config).await.unwrap();
    let locks = std::sync::Arc::new(palisade_postgres::PostgresLockService::new(&store).await.unwrap());
    (store, locks)
}

/// With `require_live_lock`, a fenced transaction holds its lock's row until it ends: a holder
/// whose TTL passes while its transaction is open still commits before anyone else is granted
/// the lock. The same store without the option lets a contender in while the stale holder's
/// transaction is still open (the control: the test tells the two apart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_lock_transaction_commits_before_the_lock_is_granted_again() {
    use palisade_core::LockServiceExt;
    use std::time::{Duration, Instant};
    for require in [true, false] {
        let (store, locks) = one_database(require).await;
        let key = ResourceKey::new("live", unique("tx")).unwrap();
        let ttl = Duration::from_millis(300);
        let lease = locks.lock(&key, LockOptions::ttl(ttl)).await.unwrap();
        let mut tx = store.begin_fenced(&lease).await.unwrap();
        // Expired while the transaction is open and busy (not silent: a transaction silent
        // for a TTL is ended by the server, see a_frozen_holders_transaction_ends_…).
        sqlx::query("SELECT pg_sleep(0.6)").execute(tx.conn()).await.unwrap();
        let contender = {
            let (locks, key) = (std::sync::Arc::clone(&locks), key.clone());
            tokio::spawn(async move {
                let lease = locks.lock(&key, LockOptions::ttl(ttl).wait(Duration::from_secs(10))).await.unwrap();
                let granted = Instant::now();
                lease.release().await.unwrap();
                granted
            })
        };
        sqlx::query("SELECT pg_sleep(2)").execute(tx.conn()).await.unwrap();
        let committing = Instant::now();
        tx.commit().await.unwrap();
        let granted = contender.await.unwrap();
        if require {
            assert!(granted > committing, "granted {:?} before the holder's commit", committing - granted);
        } else {
            assert!(
                granted < committing,
                "without the option the contender waits for nothing: granted {:?} after the commit",
                granted - committing
            );
        }
    }
}

/// With `require_live_lock`, the check in the caller's own transaction refuses a lease whose
/// lock expired with nobody after it (`NotHolder`, nothing written) and a lease from another
/// lock service (no row here); without it, fencing alone accepts the expired holder.
#[tokio::test]
async fn a_live_lock_check_refuses_expired_and_foreign_leases() {
    use palisade_core::LockServiceExt;
    use std::time::Duration;
    let (store, locks) = one_database(true).await;
    let key = ResourceKey::new("live", unique("expired")).unwrap();
    let lease = locks.lock(&key, LockOptions::ttl(Duration::from_millis(100))).await.unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    store.check_fence_in(&mut tx, &lease).await.unwrap();
    tx.rollback().await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let mut tx = store.pool().begin().await.unwrap();
    let err = store.check_fence_in(&mut tx, &lease).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHolder, "{err}");
    drop(tx);
    assert_eq!(store.watermark(&key).await.unwrap(), None, "nothing written by the refused check");

    let foreign = std::sync::Arc::new(palisade_core::MemoryLockService::new());
    let other = foreign.lock(&key, LockOptions::ttl(Duration::from_secs(5))).await.unwrap();
    let err = store.begin_fenced(&other).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHolder, "a lease from another lock service has no row here: {err}");

    let (plain, _) = one_database(false).await;
    let mut tx = plain.pool().begin().await.unwrap();
    plain.check_fence_in(&mut tx, &lease).await.unwrap();
    tx.rollback().await.unwrap();
}

/// A fenced transaction under `require_live_lock` keeps its lock's row locked until it ends.
/// Every lock operation still answers within its wait meanwhile: a contender's zero-wait try
/// at once ("held"), a 300 ms wait as `Timeout` soon after 300 ms, and the holder's own extend
/// and release on other connections of its pool (they used to wait on the row inside one
/// statement, with no bound, and the holder's own renewal deadlocked with its transaction).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_operations_answer_within_their_wait_while_a_fenced_transaction_is_open() {
    use palisade_core::LockServiceExt;
    use std::time::{Duration, Instant};
    let (store, locks) = one_database(true).await;
    let (_, contender) = one_database(true).await;
    let key = ResourceKey::new("live", unique("bounded")).unwrap();
    let ttl = Duration::from_secs(10); // also the idle bound: well above the test's pauses
    let bound = Duration::from_secs(1);
    let never = Duration::from_secs(10);
    let lease = locks.lock(&key, LockOptions::ttl(ttl)).await.unwrap();
    let mut tx = store.begin_fenced(&lease).await.unwrap();
    sqlx::query("SELECT 1").execute(tx.conn()).await.unwrap();

    let started = Instant::now();
    let tried = tokio::time::timeout(never, contender.try_lock(&key, ttl)).await;
    let took = started.elapsed();
    let tried = tried.unwrap_or_else(|_| panic!("a zero-wait try_lock did not answer in {never:?}"));
    assert!(tried.unwrap().is_none(), "granted while the holder holds the lock");
    assert!(took < bound, "a zero-wait try_lock took {took:?}");

    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let waited = tokio::time::timeout(never, contender.lock(&key, LockOptions::ttl(ttl).wait(wait))).await;
    let took = started.elapsed();
    let err = waited.unwrap_or_else(|_| panic!("a {wait:?} wait did not answer in {never:?}")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(took < wait + bound, "a {wait:?} wait took {took:?}");

    let renewed = tokio::time::timeout(never, lease.extend(ttl)).await;
    renewed
        .unwrap_or_else(|_| panic!("the holder's extend during its own transaction did not answer in {never:?}"))
        .unwrap();
    sqlx::query("SELECT 1").execute(tx.conn()).await.unwrap();
    tx.commit().await.unwrap();
    tokio::time::timeout(never, lease.release()).await.expect("release did not answer").unwrap();
    let next = contender.try_lock(&key, ttl).await.unwrap().expect("free after the release");
    next.release().await.unwrap();
}

/// A holder frozen (or cut off) inside its fenced transaction cannot keep the lock's row
/// locked for long: the transaction's idle bound is the lease's TTL, so PostgreSQL ends its
/// session at most one TTL after its last statement. A contender waiting meanwhile is granted
/// within TTL (expiry) + TTL (idle bound) + the polling step and a margin, and only once the
/// frozen transaction is over (its commit then fails: nothing it wrote lands).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holders_transaction_ends_within_its_ttl_of_silence() {
    use palisade_core::LockServiceExt;
    use std::time::{Duration, Instant};
    let (store, locks) = one_database(true).await;
    let (_, contender) = one_database(true).await;
    let key = ResourceKey::new("live", unique("frozen")).unwrap();
    let ttl = Duration::from_secs(1);
    let lease = locks.lock(&key, LockOptions::ttl(ttl)).await.unwrap();
    let mut tx = store.begin_fenced(&lease).await.unwrap();
    // Before the last statement is sent: the server's idle clock starts when it has answered.
    let frozen_at = Instant::now();
    sqlx::query("SELECT 1").execute(tx.conn()).await.unwrap();
    // The holder is frozen from here on: its transaction stays open, silent.
    let granted = tokio::time::timeout(
        Duration::from_secs(20),
        contender.lock(&key, LockOptions::ttl(ttl).wait(Duration::from_secs(15))),
    )
    .await
    .expect("the contender was never granted while the frozen holder's transaction stayed open")
    .unwrap();
    let waited = frozen_at.elapsed();
    assert!(waited < ttl * 2 + Duration::from_millis(1500), "granted {waited:?} after the holder froze");
    assert!(waited >= ttl, "granted {waited:?} after the holder froze: before its TTL");
    let late = tx.commit().await;
    assert!(late.is_err(), "the frozen holder's transaction still committed after the lock was granted again");
    granted.release().await.unwrap();
}

/// A refused check in the caller's own transaction aborts it, always: a caller that logs the
/// error and carries on cannot commit writes that no fence check covered (the live-lock
/// refusal used to answer as a row, leaving the transaction usable).
#[tokio::test]
async fn a_refused_check_aborts_the_callers_transaction() {
    use palisade_core::LockServiceExt;
    use std::time::Duration;
    let (store, locks) = one_database(true).await;
    let table = unique("aborted");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE TABLE {table} (id BIGINT PRIMARY KEY)")))
        .execute(store.pool())
        .await
        .unwrap();
    let key = ResourceKey::new("live", table.clone()).unwrap();
    let lease = locks.lock(&key, LockOptions::ttl(Duration::from_millis(100))).await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await; // expired: not live any more
    // The live-lock check answers a refusal as a row; the plain store's watermark check raises
    // it (PF001): both must leave the transaction aborted.
    let (plain, _) = one_database(false).await;
    for (refused_by, store) in [("live-lock check", &store), ("stale fence", &plain)] {
        if refused_by == "stale fence" {
            let newer = locks.lock(&key, LockOptions::ttl(Duration::from_secs(5))).await.unwrap();
            let tx = store.begin_fenced(&newer).await.unwrap();
            tx.commit().await.unwrap();
            newer.release().await.unwrap();
        }
        let mut tx = store.pool().begin().await.unwrap();
        let err = store.check_fence_in(&mut tx, &lease).await.unwrap_err();
        let expected = if refused_by == "stale fence" {
            matches!(err.kind(), ErrorKind::StaleFence { .. })
        } else {
            err.kind() == ErrorKind::NotHolder
        };
        assert!(expected, "{refused_by}: {err}");
        // The caller ignores the refusal and goes on.
        let insert =
            sqlx::query(sqlx::AssertSqlSafe(format!("INSERT INTO {table} VALUES (1)"))).execute(&mut *tx).await;
        let _ = tx.commit().await;
        let rows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(rows, 0, "after a {refused_by} refusal the caller's insert ({insert:?}) committed");
    }
}

/// `PostgresLockService::new(&store)` uses the store's lock table: with a lock table of its
/// own and `require_live_lock`, the store's writes under the service's leases are accepted.
#[tokio::test]
async fn the_lock_service_of_a_store_uses_its_lock_table() {
    use palisade_core::{FencedStoreExt, LockServiceExt, WriteBatch};
    use std::time::Duration;
    let config = PostgresConfig {
        require_live_lock: true,
        locks_table: unique("locks"),
        ..PostgresConfig::from_url(&require_env("PALISADE_POSTGRES_URL")).unwrap()
    };
    let store = PostgresStore::open(config).await.unwrap();
    let locks = std::sync::Arc::new(palisade_postgres::PostgresLockService::new(&store).await.unwrap());
    let key = ResourceKey::new("live", unique("own-table")).unwrap();
    let lease = locks.lock(&key, LockOptions::ttl(Duration::from_secs(5))).await.unwrap();
    store.write(&lease, &WriteBatch::new().put(format!("{}/r", unique("rec")), b"1".to_vec())).await.unwrap();
    lease.release().await.unwrap();
}

/// A client that connects (and migrates) while a fenced transaction is open stalls nobody:
/// its migration used `ALTER TABLE … ADD COLUMN IF NOT EXISTS`, which queues for the table's
/// exclusive lock behind the open transaction even when the column exists, and every later
/// statement on the lock table then queued behind it: one process starting during a long (or
/// frozen) fenced transaction stopped every lock of the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_during_a_fenced_transaction_stalls_no_lock() {
    use palisade_core::LockServiceExt;
    use std::time::{Duration, Instant};
    let (store, locks) = one_database(true).await;
    let key = ResourceKey::new("live", unique("migrating")).unwrap();
    let ttl = Duration::from_secs(30); // also the idle bound: longer than the test
    let lease = locks.lock(&key, LockOptions::ttl(ttl)).await.unwrap();
    let mut tx = store.begin_fenced(&lease).await.unwrap();
    sqlx::query("SELECT 1").execute(tx.conn()).await.unwrap();
    let never = Duration::from_secs(4);
    let (opened, others) = tokio::time::timeout(never, one_database(true))
        .await
        .expect("a new client could not connect while a fenced transaction was open");
    let other = ResourceKey::new("live", unique("elsewhere")).unwrap();
    let started = Instant::now();
    let tried = tokio::time::timeout(never, others.try_lock(&other, ttl)).await.expect("a lock elsewhere stalled");
    assert!(started.elapsed() < Duration::from_secs(1), "a lock elsewhere took {:?}", started.elapsed());
    tried.unwrap().expect("a free key").release().await.unwrap();
    tx.commit().await.unwrap();
    lease.release().await.unwrap();
    drop(opened);
}

/// A transfer between two rows of your own table under a multi-lease: `begin_fenced_all`
/// raises both watermarks, each row is written under its own member's fence. A holder of the
/// set paused past its TTL, after a new holder of one member wrote, is refused as a whole
/// (the error names that member) and neither row changes.
#[tokio::test]
async fn a_transfer_under_a_multi_lease_is_fenced_on_both_rows_or_refused_whole() {
    use std::sync::Arc;
    use std::time::Duration;

    use palisade_core::{LockServiceExt, MemoryLockService};
    let s = store().await;
    let table = unique("transfer");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (sku TEXT PRIMARY KEY, qty BIGINT NOT NULL, fence BIGINT)"
    )))
    .execute(s.pool())
    .await
    .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("INSERT INTO {table} (sku, qty) VALUES ('SKU-1', 10), ('SKU-2', 0)")))
        .execute(s.pool())
        .await
        .unwrap();
    let row = FencedRow { table: &table, key_column: "sku", fence_column: "fence" };
    let (from, to) =
        (ResourceKey::new(table.clone(), "SKU-1").unwrap(), ResourceKey::new(table.clone(), "SKU-2").unwrap());
    let locks = Arc::new(MemoryLockService::new());
    let stock = || async {
        sqlx::query_as::<_, (String, i64)>(sqlx::AssertSqlSafe(format!("SELECT sku, qty FROM {table} ORDER BY sku")))
            .fetch_all(s.pool())
            .await
            .unwrap()
    };

    let paused =
        locks.lock_all(&[to.clone(), from.clone()], LockOptions::ttl(Duration::from_millis(50))).await.unwrap();
    let mut tx = s.begin_fenced_all(&paused).await.unwrap();
    assert_eq!(tx.resource(), &from, "canonical order");
    let (f_from, f_to) = (tx.fence_of(&from).unwrap(), tx.fence_of(&to).unwrap());
    s.update_row_fenced_in(tx.conn(), &row, "SKU-1", f_from, "qty = qty - $3", |q| q.bind(3i64)).await.unwrap();
    s.update_row_fenced_in(tx.conn(), &row, "SKU-2", f_to, "qty = qty + $3", |q| q.bind(3i64)).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(stock().await, [("SKU-1".to_string(), 7), ("SKU-2".to_string(), 3)]);

    tokio::time::sleep(Duration::from_millis(120)).await; // past the TTL
    let newer = locks.lock(&to, LockOptions::ttl(Duration::from_secs(30))).await.unwrap();
    let mut tx = s.begin_fenced(&newer).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("UPDATE {table} SET qty = qty + 1 WHERE sku = 'SKU-2'")))
        .execute(tx.conn())
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let err = s.begin_fenced_all(&paused).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::StaleFence { .. }), "{err}");
    assert_eq!(err.resource(), Some(&to), "{err}");
    assert_eq!(stock().await, [("SKU-1".to_string(), 7), ("SKU-2".to_string(), 4)], "nothing half applied");
    newer.release().await.unwrap();
}

/// A lock table dropped under a running lock service (its data lost while it runs: every lock
/// and fence counter gone, what `palisade torture` does to a store-native service) is made
/// again by the service itself: the next acquire answers within its wait and is granted, with
/// no restart and no operator, and `lock_checked` puts the new fence above the store's
/// watermark.
#[tokio::test]
async fn a_lock_table_dropped_under_a_running_service_is_made_again() {
    use palisade_core::{FencedStoreExt, LockServiceExt, WriteBatch};
    use std::time::Duration;
    let url = require_env("PALISADE_POSTGRES_URL");
    let locks_table = unique("dropped_locks");
    let store = PostgresStore::open(PostgresConfig { locks_table: locks_table.clone(), ..PostgresConfig::new(url) })
        .await
        .unwrap();
    let locks = std::sync::Arc::new(palisade_postgres::PostgresLockService::new(&store).await.unwrap());
    let key = ResourceKey::new("dropped", unique("k")).unwrap();
    let options = || LockOptions::ttl(Duration::from_secs(10)).wait(Duration::from_secs(2));
    let lease = locks.lock_checked(&store, &key, options()).await.unwrap();
    store.write(&lease, &WriteBatch::new().put(unique("rec"), b"before".to_vec())).await.unwrap();
    let before = lease.fence();
    lease.release().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {locks_table}"))).execute(store.pool()).await.unwrap();
    for attempt in 0..2 {
        let lease = tokio::time::timeout(Duration::from_secs(5), locks.lock_checked(&store, &key, options()))
            .await
            .expect("the acquire answers within its wait")
            .unwrap_or_else(|e| panic!("attempt {attempt}: not granted after the table was dropped: {e:?}"));
        assert!(lease.fence() > before, "{} after {before}", lease.fence());
        store.write(&lease, &WriteBatch::new().put(unique("rec"), b"after".to_vec())).await.unwrap();
        lease.release().await.unwrap();
    }
}
