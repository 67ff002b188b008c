//! SQLite store semantics: the fence check and the write are one transaction.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;

use palisade_core::{ErrorKind, Fence, FencedStore, GrantFence, GrantId, LockOptions, ResourceKey, WriteBatch};
use palisade_sqlite::{SqliteConfig, SqliteStore, Synchronous, map_err};

fn res() -> ResourceKey {
    ResourceKey::new("alloc", "WH-01").unwrap()
}

async fn file_store(dir: &tempfile::TempDir) -> SqliteStore {
    SqliteStore::connect(&format!("sqlite://{}/store.db", dir.path().display())).await.unwrap()
}

#[tokio::test]
async fn equal_fence_accepted_lower_rejected_data_byte_for_byte_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let s = file_store(&dir).await;
    assert_eq!(s.watermark(&res()).await.unwrap(), None);
    s.apply(&res(), gf(7), &WriteBatch::new().put("k", vec![1, 2, 3])).await.unwrap();
    s.apply(&res(), gf(7), &WriteBatch::new().put("k", vec![4, 5, 6])).await.unwrap();
    s.apply(&res(), gf(9), &WriteBatch::new().put("k", vec![7, 8, 9])).await.unwrap();
    let err = s.apply(&res(), gf(8), &WriteBatch::new().put("k", vec![0]).put("j", vec![0])).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StaleFence { presented: Fence::new(8), current: Fence::new(9) });
    let r = s.read("k").await.unwrap().unwrap();
    assert_eq!(r.value, vec![7, 8, 9]);
    assert_eq!(r.fence, Some(Fence::new(9)));
    assert!(s.read("j").await.unwrap().is_none());
    assert_eq!(s.watermark(&res()).await.unwrap(), Some(Fence::new(9)));
}

#[tokio::test]
async fn a_failed_condition_rolls_back_the_whole_batch() {
    let s = SqliteStore::connect("sqlite::memory:").await.unwrap();
    s.apply(&res(), gf(1), &WriteBatch::new().put("done/1", b"x".to_vec()).put("qty", b"10".to_vec())).await.unwrap();
    let batch = WriteBatch::new()
        .put("qty", b"9".to_vec())
        .delete("done/1")
        .create("new", b"n".to_vec())
        .check("absent", Some(b"v".to_vec()));
    let err = s.apply(&res(), gf(2), &batch).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict);
    assert_eq!(s.read("qty").await.unwrap().unwrap().value, b"10");
    assert!(s.read("done/1").await.unwrap().is_some());
    assert!(s.read("new").await.unwrap().is_none());
    assert_eq!(s.watermark(&res()).await.unwrap(), Some(Fence::new(1)), "watermark rolled back too");
    let err = s.apply(&res(), gf(2), &WriteBatch::new().create("done/1", b"y".to_vec())).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict);
    s.apply(&res(), gf(2), &WriteBatch::new().check("qty", Some(b"10".to_vec())).put("qty", b"9".to_vec()))
        .await
        .unwrap();
    assert_eq!(s.read("qty").await.unwrap().unwrap().value, b"9");
}

#[tokio::test]
async fn concurrent_writers_with_interleaved_fences_lose_no_update() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(file_store(&dir).await);
    // Fences 1..=120 presented in a scrambled order by 8 concurrent writers.
    let fences: Vec<u64> = (1..=120u64).map(|i| (i * 37) % 120 + 1).collect();
    let mut tasks = Vec::new();
    for chunk in fences.chunks(15) {
        let s = Arc::clone(&s);
        let chunk = chunk.to_vec();
        tasks.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for f in chunk {
                let batch = WriteBatch::new().put("value", f.to_string()).create(format!("log/{f:04}"), vec![]);
                outcomes.push((f, s.apply(&res(), gf(f), &batch).await));
            }
            outcomes
        }));
    }
    let mut accepted = Vec::new();
    for t in tasks {
        for (f, outcome) in t.await.unwrap() {
            match outcome {
                Ok(()) => accepted.push(f),
                Err(e) => {
                    let (presented, current) = e.stale_fence_details().expect("only stale-fence rejections");
                    assert_eq!(presented, Fence::new(f));
                    assert!(current > presented);
                }
            }
        }
    }
    accepted.sort_unstable();
    let logged: Vec<u64> = s.list("log/").await.unwrap().iter().map(|(k, _)| k[4..].parse().unwrap()).collect();
    assert_eq!(logged, accepted, "every accepted write is visible, no rejected one is");
    assert!(accepted.contains(&120), "the highest fence is always accepted");
    assert_eq!(s.read("value").await.unwrap().unwrap().value, b"120");
    assert_eq!(s.watermark(&res()).await.unwrap(), Some(Fence::new(120)));
}

#[tokio::test]
async fn own_statements_commit_with_the_watermark_or_not_at_all() {
    let s = SqliteStore::connect("sqlite::memory:").await.unwrap();
    sqlx::query("CREATE TABLE inventory (sku TEXT PRIMARY KEY, qty INTEGER NOT NULL)")
        .execute(s.pool())
        .await
        .map_err(map_err)
        .unwrap();
    sqlx::query("INSERT INTO inventory VALUES ('S1', 10)").execute(s.pool()).await.unwrap();
    let qty = |s: SqliteStore| async move {
        sqlx::query_scalar::<_, i64>("SELECT qty FROM inventory WHERE sku = 'S1'").fetch_one(s.pool()).await.unwrap()
    };

    // Dropped without commit: nothing happened, watermark included.
    {
        let mut tx = s.begin_with_fence(&res(), gf(5)).await.unwrap();
        sqlx::query("UPDATE inventory SET qty = qty - 1").execute(tx.conn()).await.unwrap();
    }
    assert_eq!(qty(s.clone()).await, 10);
    assert_eq!(s.watermark(&res()).await.unwrap(), None);

    let mut tx = s.begin_with_fence(&res(), gf(5)).await.unwrap();
    assert_eq!(tx.fence(), Fence::new(5));
    sqlx::query("UPDATE inventory SET qty = qty - 1").execute(tx.conn()).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(qty(s.clone()).await, 9);

    let err = s.begin_with_fence(&res(), gf(4)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StaleFence { presented: Fence::new(4), current: Fence::new(5) });
    assert_eq!(qty(s.clone()).await, 9);
}

#[tokio::test]
async fn watermarks_survive_reopening_and_tables_are_configurable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("custom.db");
    let config = || SqliteConfig {
        path: Some(path.clone()),
        synchronous: Synchronous::Full,
        fences_table: "my_fences".into(),
        records_table: "my_records".into(),
        ..SqliteConfig::default()
    };
    {
        let s = SqliteStore::open(config()).await.unwrap();
        s.apply(&res(), gf(42), &WriteBatch::new().put("k", b"v".to_vec())).await.unwrap();
        s.pool().close().await;
    }
    let s = SqliteStore::open(config()).await.unwrap();
    let err = s.apply(&res(), gf(41), &WriteBatch::new()).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::StaleFence { .. }));
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM my_fences").fetch_one(s.pool()).await.unwrap();
    assert_eq!(n, 1);
    let bad = SqliteConfig { fences_table: "x; DROP TABLE y".into(), ..config() };
    assert_eq!(SqliteStore::open(bad).await.unwrap_err().kind(), ErrorKind::InvalidConfig);
}

#[tokio::test]
async fn bad_input_is_typed() {
    let s = SqliteStore::connect("sqlite::memory:").await.unwrap();
    let err = s.apply(&res(), gf(u64::MAX), &WriteBatch::new()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!(s.read("").await.unwrap_err().kind(), ErrorKind::InvalidKey);
    // A path that cannot be opened is the configuration's fault, not the server's: typed as
    // such, not retryable, and the message names the path.
    let err = SqliteStore::connect("sqlite:///nonexistent-dir/x/y.db").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(!err.is_retryable() && err.to_string().contains("/nonexistent-dir/x/y.db"), "{err}");
    // mode=rw opens an existing file only, and never creates one.
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("typo.db");
    let err = SqliteStore::connect(&format!("sqlite://{}?mode=rw", missing.display())).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(err.to_string().contains("typo.db"), "{err}");
    assert!(!missing.exists(), "mode=rw created {}", missing.display());
    assert_eq!(SqliteStore::connect("sqlite://").await.unwrap_err().kind(), ErrorKind::InvalidConfig);
}

#[tokio::test]
async fn unfenced_writes_ignore_and_keep_watermarks() {
    let s = SqliteStore::connect("sqlite::memory:").await.unwrap();
    s.apply(&res(), gf(3), &WriteBatch::new().put("k", b"a".to_vec())).await.unwrap();
    s.apply_unfenced(&WriteBatch::new().put("k", b"b".to_vec())).await.unwrap();
    let r = s.read("k").await.unwrap().unwrap();
    assert_eq!((r.value.as_slice(), r.fence), (&b"b"[..], None));
    assert_eq!(s.watermark(&res()).await.unwrap(), Some(Fence::new(3)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_opening_one_new_file_at_once_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/fresh.db?synchronous=normal", dir.path().display());
    let opens: Vec<_> = (0..16)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { SqliteStore::connect(&url).await.map(|_| ()) })
        })
        .collect();
    for open in opens {
        open.await.unwrap().unwrap();
    }
}

/// The lock service's counter lives in the file: a new "process" (a fresh service and store
/// on the same file) continues the fences, so the store's watermark is never at or above the
/// next grant and `lock_checked` has nothing to repair.
#[tokio::test]
async fn lock_fences_continue_across_reopening_the_file() {
    use palisade_core::{FencedStoreExt, LockServiceExt, REGRESSION_GAP};
    use palisade_sqlite::SqliteLockService;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/one.db?synchronous=normal", dir.path().display());
    let ttl = std::time::Duration::from_secs(30);
    let mut last = 0;
    for run in 1..=3u64 {
        let store = SqliteStore::connect(&url).await.unwrap();
        let locks = Arc::new(SqliteLockService::new(&store).await.unwrap());
        let lease = locks.lock_checked(&store, &res(), LockOptions::ttl(ttl).wait(ttl)).await.unwrap();
        assert_eq!(lease.fence().get(), run, "consecutive fences across runs, no repair");
        assert!(lease.fence().get() < REGRESSION_GAP);
        store.write(&lease, &WriteBatch::new().put("rec", run.to_string().into_bytes())).await.unwrap();
        // Held: another client of the file (another process) cannot take it.
        let other = Arc::new(SqliteLockService::connect(&url).await.unwrap());
        assert!(other.try_lock(&res(), ttl).await.unwrap().is_none(), "run {run}: two holders");
        last = lease.fence().get();
        lease.release().await.unwrap();
    }
    assert_eq!(store_watermark(&url).await, last);
}

async fn store_watermark(url: &str) -> u64 {
    SqliteStore::connect(url).await.unwrap().watermark(&res()).await.unwrap().unwrap().get()
}

/// Rule 2 on the native path: `begin_fenced` with the fence another grant set the watermark
/// with is refused as a duplicate, and nothing of the transaction runs.
#[tokio::test]
async fn begin_fenced_refuses_an_equal_fence_from_another_grant() {
    let s = SqliteStore::connect("sqlite::memory:").await.unwrap();
    let mut tx = s.begin_with_fence(&res(), gf(5)).await.unwrap();
    sqlx::query("CREATE TABLE t (v INTEGER)").execute(tx.conn()).await.unwrap();
    tx.commit().await.unwrap();
    let other = GrantFence::new(Fence::new(5), GrantId::from_bytes([0xb2; 16]));
    let err = s.begin_with_fence(&res(), other).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DuplicateFence { fence: Fence::new(5) });
    let err = s.apply(&res(), other, &WriteBatch::new().put("k", b"v".to_vec())).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DuplicateFence { fence: Fence::new(5) });
    assert!(s.read("k").await.unwrap().is_none());
    s.begin_with_fence(&res(), gf(5)).await.unwrap().commit().await.unwrap();
}

/// A database whose watermark table predates grant ids gets the column at open, and its old
/// watermark accepts an equal fence once, from whichever grant comes first.
#[tokio::test]
async fn a_watermark_table_without_grant_ids_is_migrated() {
    let dir = std::env::temp_dir().join(format!("palisade-legacy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("legacy.db");
    let _ = std::fs::remove_file(&path);
    let url = format!("sqlite://{}", path.display());
    {
        let pool = sqlx::SqlitePool::connect(&format!("{url}?mode=rwc")).await.unwrap();
        sqlx::query(
            "CREATE TABLE palisade_fences (resource TEXT PRIMARY KEY NOT NULL, fence INTEGER NOT NULL) WITHOUT ROWID",
        )
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query("INSERT INTO palisade_fences VALUES (?1, 7)").bind(res().to_string()).execute(&pool).await.unwrap();
        pool.close().await;
    }
    let s = SqliteStore::connect(&url).await.unwrap();
    assert_eq!(s.watermark(&res()).await.unwrap(), Some(Fence::new(7)));
    s.apply(&res(), gf(7), &WriteBatch::new().put("k", b"a".to_vec())).await.unwrap();
    let other = GrantFence::new(Fence::new(7), GrantId::from_bytes([0xb2; 16]));
    let err = s.apply(&res(), other, &WriteBatch::new()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DuplicateFence { fence: Fence::new(7) });
    let err = s.apply(&res(), gf(6), &WriteBatch::new()).await.unwrap_err();
    assert!(err.stale_fence_details().is_some());
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `fence` as the test's one grant presents it.
fn gf(fence: u64) -> GrantFence {
    GrantFence::new(Fence::new(fence), GrantId::from_bytes([0xa1; 16]))
}

/// Issue 19: the store on the application's own pool, the fenced statement in a write
/// transaction beside the application's own statements, an integer key column, and the fence
/// taken from the lease.
#[tokio::test]
async fn fenced_writes_join_the_callers_transaction_on_the_callers_pool() {
    use std::time::Duration;

    use palisade_core::{FencedRow, LockServiceExt, MemoryLockService};

    let dir = tempfile::tempdir().unwrap();
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(
            sqlx::sqlite::SqliteConnectOptions::new()
                .filename(dir.path().join("app.db"))
                .create_if_missing(true)
                .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal),
        )
        .await
        .unwrap();
    let s = SqliteStore::from_pool(pool.clone()).await.unwrap();
    for ddl in [
        "CREATE TABLE items (id INTEGER PRIMARY KEY, qty INTEGER NOT NULL, fence INTEGER)",
        "CREATE TABLE audit (id INTEGER NOT NULL, note TEXT NOT NULL)",
        "INSERT INTO items VALUES (7, 10, NULL)",
    ] {
        sqlx::query(ddl).execute(&pool).await.unwrap();
    }
    let row = FencedRow { table: "items", key_column: "id", fence_column: "fence" };
    let locks = Arc::new(MemoryLockService::new());
    let key = ResourceKey::new("items", "7").unwrap();
    let old = locks.lock(&key, LockOptions::ttl(Duration::from_millis(20))).await.unwrap();
    tokio::time::sleep(Duration::from_millis(40)).await; // paused past its TTL
    let new = locks.lock(&key, LockOptions::ttl(Duration::from_secs(30))).await.unwrap();
    let state = || async {
        let qty: i64 = sqlx::query_scalar("SELECT qty FROM items WHERE id = 7").fetch_one(&pool).await.unwrap();
        let notes: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM audit").fetch_one(&pool).await.unwrap();
        (qty, notes)
    };

    let mut tx = s.begin().await.unwrap();
    s.update_row_fenced_in(tx.conn(), &row, 7_i64, &new, "qty = qty - $3", |q| q.bind(1_i64)).await.unwrap();
    sqlx::query("INSERT INTO audit VALUES (7, 'shipped')").execute(tx.conn()).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(state().await, (9, 1));

    let mut tx = s.begin().await.unwrap();
    let err =
        s.update_row_fenced_in(tx.conn(), &row, 7_i64, &old, "qty = qty - $3", |q| q.bind(1_i64)).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::StaleFence { .. }), "{err}");
    tx.rollback().await.unwrap();
    assert_eq!(state().await, (9, 1));
    // The row's own fence, as a watermark for `lock_checked`.
    let watermark = palisade_core::WatermarkSource::highest_fence(&s.row_watermark(&row, 7_i64), &key).await.unwrap();
    assert_eq!(watermark, Some(new.fence()));

    let mut tx = s.begin().await.unwrap();
    s.check_fence_in(tx.conn(), &new).await.unwrap();
    sqlx::query("INSERT INTO audit VALUES (7, 'checked')").execute(tx.conn()).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(s.watermark(&key).await.unwrap(), Some(new.fence()));
    let mut tx = s.begin().await.unwrap();
    let err = s.check_fence_in(tx.conn(), &old).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::StaleFence { .. }), "{err}");
    tx.rollback().await.unwrap();
    assert_eq!(state().await, (9, 2));

    let tx = s.begin_fenced(&new).await.unwrap();
    assert_eq!((tx.resource(), tx.fence()), (&key, new.fence()));
    tx.rollback().await.unwrap();
    assert!(s.begin_fenced(&old).await.is_err());
}

/// A fenced transaction holds the file's only write lock (and this process's writer queue)
/// until it ends. A zero-wait `try_lock` meanwhile answers at once (a retryable `Unavailable`:
/// the key itself is free) instead of queueing for the whole busy timeout; a 300 ms wait
/// answers `Timeout` soon after 300 ms. (The holder
/// cannot renew inside its own transaction on SQLite: one writer at a time; see the crate
/// docs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_operations_answer_within_their_wait_while_a_fenced_transaction_is_open() {
    use palisade_core::{ErrorKind, LockOptions, LockServiceExt};
    use palisade_sqlite::SqliteLockService;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let store = file_store(&dir).await;
    let locks = Arc::new(SqliteLockService::new(&store).await.unwrap());
    let held = ResourceKey::new("sqlite", "held").unwrap();
    let lease = locks.lock(&held, LockOptions::ttl(Duration::from_secs(30))).await.unwrap();
    let tx = store.begin_fenced(&lease).await.unwrap();
    let other = ResourceKey::new("sqlite", "other").unwrap();
    let started = Instant::now();
    let tried = locks.try_lock(&other, Duration::from_secs(30)).await;
    let took = started.elapsed();
    let err = tried.map(|l| l.is_some()).expect_err("a zero-wait try_lock behind an open transaction");
    assert!(err.kind() == ErrorKind::Unavailable && err.is_retryable(), "{err}");
    assert!(took < Duration::from_secs(1), "a zero-wait try_lock took {took:?}");
    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let err = locks.lock(&other, LockOptions::ttl(Duration::from_secs(30)).wait(wait)).await.unwrap_err();
    let took = started.elapsed();
    // Timeout, or the busy database's refusal that made each attempt fail (it says why).
    assert!(err.kind() == ErrorKind::Timeout || err.is_retryable(), "{err}");
    assert!(took < wait + Duration::from_secs(1), "a {wait:?} wait took {took:?}");
    tx.commit().await.unwrap();
    lease.release().await.unwrap();
    locks.try_lock(&other, Duration::from_secs(30)).await.unwrap().expect("free").release().await.unwrap();
}

/// A release wakes the waiters of this process at once, whichever of the process's lock
/// services on the file they wait on: the handoff does not wait out the polling backoff, which
/// by the time a holder of 0.7 s lets go has grown to delays of up to 250 ms (drawn at random
/// below its ceiling). Seven handoffs, the median judged against 50 ms, generous for a
/// notification and unlikely to be met by polling alone (each handoff would need the waiter's
/// next poll within 50 ms of the release: about one chance in five, for four handoffs of seven).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_waiters_of_its_process() {
    use palisade_core::LockServiceExt;
    use palisade_sqlite::SqliteLockService;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/handoff.db", dir.path().display());
    let holder = Arc::new(SqliteLockService::connect(&url).await.unwrap());
    let waiter = Arc::new(SqliteLockService::connect(&url).await.unwrap());
    let ttl = Duration::from_secs(30);
    let mut handoffs = Vec::new();
    for _ in 0..7 {
        let held = holder.try_lock(&res(), ttl).await.unwrap().expect("the key is free");
        let waiting = {
            let waiter = Arc::clone(&waiter);
            tokio::spawn(async move {
                let lease = waiter.lock(&res(), LockOptions::ttl(ttl).wait(Duration::from_secs(10))).await;
                (Instant::now(), lease)
            })
        };
        tokio::time::sleep(Duration::from_millis(700)).await;
        held.release().await.unwrap();
        let released = Instant::now();
        let (granted, lease) = waiting.await.unwrap();
        handoffs.push(granted.saturating_duration_since(released));
        lease.unwrap().release().await.unwrap();
    }
    handoffs.sort();
    assert!(
        handoffs[3] < Duration::from_millis(50),
        "handoffs (sorted) {handoffs:?}: the waiter polled, nobody woke it"
    );
}

/// A transfer between two rows of your own table under a multi-lease: `begin_fenced_all`
/// raises both watermarks, each row is written under its own member's fence. A holder of the
/// set paused past its TTL, after a new holder of one member wrote, is refused as a whole
/// (the error names that member) and neither row changes.
#[tokio::test]
async fn a_transfer_under_a_multi_lease_is_fenced_on_both_rows_or_refused_whole() {
    use palisade_core::{FencedRow, LockServiceExt, MemoryLockService};
    let dir = tempfile::tempdir().unwrap();
    let store = file_store(&dir).await;
    sqlx::query("CREATE TABLE stock (sku TEXT PRIMARY KEY, qty INTEGER NOT NULL, fence INTEGER)")
        .execute(store.pool())
        .await
        .unwrap();
    sqlx::query("INSERT INTO stock (sku, qty) VALUES ('SKU-1', 10), ('SKU-2', 0)").execute(store.pool()).await.unwrap();
    let row = FencedRow { table: "stock", key_column: "sku", fence_column: "fence" };
    let (from, to) = (ResourceKey::new("stock", "SKU-1").unwrap(), ResourceKey::new("stock", "SKU-2").unwrap());
    let locks = Arc::new(MemoryLockService::new());
    let stock = || async {
        sqlx::query_as::<_, (String, i64)>("SELECT sku, qty FROM stock ORDER BY sku")
            .fetch_all(store.pool())
            .await
            .unwrap()
    };

    let short = LockOptions::ttl(std::time::Duration::from_millis(50));
    let paused = locks.lock_all(&[to.clone(), from.clone()], short).await.unwrap();
    let mut tx = store.begin_fenced_all(&paused).await.unwrap();
    assert_eq!(tx.fences().len(), 2);
    assert_eq!(tx.resource(), &from, "canonical order");
    let (f_from, f_to) = (tx.fence_of(&from).unwrap(), tx.fence_of(&to).unwrap());
    store.update_row_fenced_in(tx.conn(), &row, "SKU-1", f_from, "qty = qty - $3", |q| q.bind(3i64)).await.unwrap();
    store.update_row_fenced_in(tx.conn(), &row, "SKU-2", f_to, "qty = qty + $3", |q| q.bind(3i64)).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(stock().await, [("SKU-1".to_string(), 7), ("SKU-2".to_string(), 3)]);

    tokio::time::sleep(std::time::Duration::from_millis(120)).await; // past the TTL
    let newer = locks.lock(&to, LockOptions::ttl(std::time::Duration::from_secs(30))).await.unwrap();
    let mut tx = store.begin_fenced(&newer).await.unwrap();
    sqlx::query("UPDATE stock SET qty = qty + 1 WHERE sku = 'SKU-2'").execute(tx.conn()).await.unwrap();
    tx.commit().await.unwrap();

    let err = store.begin_fenced_all(&paused).await.unwrap_err();
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
    use palisade_core::{FencedStoreExt, LockServiceExt};
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let store = file_store(&dir).await;
    let locks = Arc::new(palisade_sqlite::SqliteLockService::new(&store).await.unwrap());
    let options = || LockOptions::ttl(Duration::from_secs(10)).wait(Duration::from_secs(2));
    let lease = locks.lock_checked(&store, &res(), options()).await.unwrap();
    store.write(&lease, &WriteBatch::new().put("before", b"1".to_vec())).await.unwrap();
    let before = lease.fence();
    lease.release().await.unwrap();
    sqlx::query("DROP TABLE palisade_locks").execute(store.pool()).await.unwrap();
    for attempt in 0..2 {
        let lease = tokio::time::timeout(Duration::from_secs(5), locks.lock_checked(&store, &res(), options()))
            .await
            .expect("the acquire answers within its wait")
            .unwrap_or_else(|e| panic!("attempt {attempt}: not granted after the table was dropped: {e:?}"));
        assert!(lease.fence() > before, "{} after {before}", lease.fence());
        store.write(&lease, &WriteBatch::new().put("after", b"2".to_vec())).await.unwrap();
        lease.release().await.unwrap();
    }
}
