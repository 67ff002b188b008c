//! The SQLite fenced store.

use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use palisade_core::spi::sql;
use palisade_core::spi::{canonical_fences, conflict_error, explain_refusal, lock_not_live, storable_fence};
use palisade_core::{
    Error, ErrorKind, Fence, Fenced, FencedRow, FencedStore, GrantFence, GrantId, InspectStore, Lease, Listing,
    LockService, MultiLease, Record, ResourceKey, Result, WatermarkView, WriteBatch, WriteOp,
};
use sqlx::query::Query;
use sqlx::sqlite::{SqliteArguments, SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{AssertSqlSafe, Sqlite, SqliteConnection, SqlitePool};
use tracing::debug;

use crate::config::{SqliteConfig, Synchronous, quote_ident, shown_path};
use crate::db::BACKEND;
pub use crate::db::map_err;
use crate::lock::Releases;
use crate::transaction::{FencedTransaction, WriteTransaction};

/// The SQL for a configured pair of tables, built once.
#[derive(Debug)]
pub(crate) struct Statements {
    create_fences: String,
    /// Adds the grant column to a watermark table created before grants were recorded.
    add_grant_column: String,
    has_grant_column: String,
    /// The watermark table's name, unquoted (what `pragma_table_info` takes).
    fences_name: String,
    create_records: String,
    pub(crate) raise_watermark: String,
    pub(crate) read_watermark: String,
    /// `palisade inspect`'s listing of watermarks (`?1` prefix, `?2` how many at most).
    list_watermarks: String,
    /// With `require_live_lock`: the lock table's DDL, and the check that the writer's lock is
    /// live (`?1` resource, `?2` grant id, `?3` fence, `?4` now in ms).
    live_lock: Option<&'static str>,
    put: String,
    create: String,
    delete: String,
    read: String,
    list: String,
}

impl Statements {
    fn new(fences: &str, records: &str, require_live_lock: bool) -> Result<Self> {
        let f = quote_ident(fences)?;
        let r = quote_ident(records)?;
        Ok(Statements {
            create_fences: format!(
                "CREATE TABLE IF NOT EXISTS {f} (resource TEXT PRIMARY KEY NOT NULL, fence INTEGER NOT NULL, grant_id BLOB) WITHOUT ROWID"
            ),
            add_grant_column: format!("ALTER TABLE {f} ADD COLUMN grant_id BLOB"),
            has_grant_column: "SELECT count(*) FROM pragma_table_info(?1) WHERE name = 'grant_id'".to_string(),
            fences_name: fences.to_string(),
            create_records: format!(
                "CREATE TABLE IF NOT EXISTS {r} (key TEXT PRIMARY KEY NOT NULL, value BLOB NOT NULL, fence INTEGER) WITHOUT ROWID"
            ),
            // Rule 2: higher, or equal from the grant that set it (or from any grant when the
            // row predates recorded grants); zero rows changed is a rejection.
            raise_watermark: format!(
                "INSERT INTO {f} (resource, fence, grant_id) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence, grant_id = excluded.grant_id \
                 WHERE {f}.fence < excluded.fence OR ({f}.fence = excluded.fence \
                   AND ({f}.grant_id IS NULL OR {f}.grant_id = excluded.grant_id))"
            ),
            read_watermark: format!("SELECT fence, grant_id FROM {f} WHERE resource = ?1"),
            list_watermarks: format!(
                "SELECT resource, fence, grant_id FROM {f} WHERE substr(resource, 1, length(?1)) = ?1 \
                 ORDER BY resource LIMIT ?2"
            ),
            live_lock: require_live_lock.then_some(crate::lock_table::LIVE),
            put: format!(
                "INSERT INTO {r} (key, value, fence) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value, fence = excluded.fence"
            ),
            create: format!("INSERT INTO {r} (key, value, fence) VALUES (?1, ?2, ?3) ON CONFLICT (key) DO NOTHING"),
            delete: format!("DELETE FROM {r} WHERE key = ?1"),
            read: format!("SELECT value, fence FROM {r} WHERE key = ?1"),
            list: format!(
                "SELECT key, value, fence FROM {r} WHERE key >= ?1 AND substr(key, 1, length(?1)) = ?1 ORDER BY key"
            ),
        })
    }
}

fn sql(s: &str) -> AssertSqlSafe<String> {
    // Table names are validated and quoted by `quote_ident`; values are always bound.
    AssertSqlSafe(s.to_string())
}

/// A fenced store in a SQLite database.
///
/// Cheap to clone (it is a pool handle). See the crate docs for the two write APIs.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    statements: Arc<Statements>,
    shared: Arc<SharedFile>,
    busy_timeout: Duration,
}

/// What every store opened on the same file in this process shares.
#[derive(Debug, Default)]
pub(crate) struct SharedFile {
    /// SQLite admits one writer at a time, and a writer that finds the database locked sleeps
    /// in the busy handler (up to 100 ms a try) however soon the lock frees. Writers of this
    /// process therefore queue here first, in arrival order, and meet the busy handler only
    /// when another process holds the lock.
    writers: Arc<tokio::sync::Mutex<()>>,
    /// This process's lock waiters, woken by this process's releases.
    releases: Releases,
}

/// A file's name for [`shared_file`]: its real path, or for a file not created yet (a store
/// opening a new file looks it up before the file exists), its directory's real path and its
/// name, so that every spelling of one file (relative, through a symbolic link) is one name.
fn file_identity(path: &std::path::Path) -> PathBuf {
    if let Ok(real) = std::fs::canonicalize(path) {
        return real;
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    match (std::fs::canonicalize(dir), path.file_name()) {
        (Ok(dir), Some(name)) => dir.join(name),
        _ => std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
    }
}

/// The file's shared state: one per file in this process (by canonical path), and one per
/// store for an in-memory database (`None`), which no other store reaches.
fn shared_file(path: Option<&std::path::Path>) -> Arc<SharedFile> {
    static FILES: std::sync::LazyLock<Mutex<HashMap<PathBuf, std::sync::Weak<SharedFile>>>> =
        std::sync::LazyLock::new(Mutex::default);
    let Some(path) = path else { return Arc::default() };
    let path = file_identity(path);
    let mut files = FILES.lock().unwrap_or_else(PoisonError::into_inner);
    files.retain(|_, file| file.strong_count() > 0);
    if let Some(file) = files.get(&path).and_then(std::sync::Weak::upgrade) {
        return file;
    }
    let file = Arc::<SharedFile>::default();
    files.insert(path, Arc::downgrade(&file));
    file
}

impl SqliteStore {
    /// Opens the store at a URL (`sqlite::memory:`, `sqlite://PATH[?synchronous=…]`), creating
    /// the database file and the tables if missing.
    pub async fn connect(url: &str) -> Result<Self> {
        SqliteStore::open(SqliteConfig::from_url(url)?).await
    }

    /// Opens the store with explicit settings, creating the database file and tables if missing.
    pub async fn open(config: SqliteConfig) -> Result<Self> {
        let statements = Statements::new(&config.fences_table, &config.records_table, config.require_live_lock)?;
        let synchronous = sqlite_synchronous(config.synchronous);
        if let Some(path) = &config.path
            && !config.create_if_missing
            && !path.is_file()
        {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                BACKEND,
                format!("no SQLite database at {} (mode=rw opens an existing file only)", shown_path(path)),
            ));
        }
        let (options, pool_options) = match &config.path {
            Some(path) => (
                SqliteConnectOptions::new()
                    .filename(path)
                    .create_if_missing(config.create_if_missing)
                    .journal_mode(SqliteJournalMode::Wal),
                SqlitePoolOptions::new().max_connections(config.max_connections.max(1)),
            ),
            // An in-memory database lives and dies with its one connection: never recycle it.
            None => (
                SqliteConnectOptions::from_str("sqlite::memory:").map_err(map_err)?,
                SqlitePoolOptions::new().max_connections(1).min_connections(1).idle_timeout(None).max_lifetime(None),
            ),
        };
        let options = options.synchronous(synchronous).busy_timeout(config.busy_timeout);
        let statements = Arc::new(statements);
        // Several processes opening one new file at once contend for the switch to WAL and the
        // schema creation, and SQLite reports some of that contention as SQLITE_BUSY at once
        // instead of through the busy handler: retry it for as long as the busy timeout allows.
        let give_up = tokio::time::Instant::now() + config.busy_timeout;
        let mut backoff =
            palisade_core::spi::Backoff::with_bounds(Duration::from_millis(5), Duration::from_millis(200));
        loop {
            let shared = shared_file(config.path.as_deref());
            match open_once(pool_options.clone(), options.clone(), Arc::clone(&statements), shared, config.busy_timeout)
                .await
            {
                Ok(store) => {
                    debug!(path = ?config.path, "sqlite fenced store open");
                    return Ok(store);
                }
                Err(e)
                    if e.kind() == ErrorKind::Unavailable && tokio::time::Instant::now() < give_up && is_busy(&e) =>
                {
                    tokio::time::sleep(backoff.next_delay()).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Opens an existing database file read-only, as `palisade inspect` does: nothing is
    /// created, migrated or switched (the journal mode stays as it is), and every write fails.
    /// Only reads work on it: a watermark table missing from the file shows as no watermarks.
    ///
    /// Errors: an in-memory database (it belongs to the process that made it) or a path with
    /// no file is [`ErrorKind::InvalidConfig`].
    pub async fn open_read_only(url: &str) -> Result<Self> {
        let config = SqliteConfig::from_url(url)?;
        let Some(path) = &config.path else {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                BACKEND,
                "an in-memory SQLite database belongs to the process that made it: there is nothing to open read-only",
            ));
        };
        if !path.is_file() {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                BACKEND,
                format!("no SQLite database at {} (a read-only open never creates one)", shown_path(path)),
            ));
        }
        let statements = Statements::new(&config.fences_table, &config.records_table, config.require_live_lock)?;
        // This URL's `synchronous`, so that `doctor` reads back how the URL commits.
        let options = SqliteConnectOptions::new()
            .filename(path)
            .read_only(true)
            .synchronous(sqlite_synchronous(config.synchronous))
            .busy_timeout(config.busy_timeout);
        let pool = SqlitePoolOptions::new().max_connections(1).connect_with(options).await.map_err(map_err)?;
        Ok(SqliteStore {
            pool,
            statements: Arc::new(statements),
            shared: shared_file(Some(path.as_path())),
            busy_timeout: config.busy_timeout,
        })
    }

    /// Creates the watermark and record tables if they do not exist. [`open`](Self::open)
    /// and [`from_pool`](Self::from_pool) run it.
    pub async fn migrate(&self) -> Result<()> {
        // IMMEDIATE: take the write lock first (through the busy handler) rather than upgrade a
        // read of the schema, which SQLite refuses at once when another writer got there first.
        let _writer = self.writer().await?;
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(map_err)?;
        sqlx::query(sql(&self.statements.create_fences)).execute(&mut *tx).await.map_err(map_err)?;
        let has_grant: i64 = sqlx::query_scalar(sql(&self.statements.has_grant_column))
            .bind(&self.statements.fences_name)
            .fetch_one(&mut *tx)
            .await
            .map_err(map_err)?;
        if has_grant == 0 {
            sqlx::query(sql(&self.statements.add_grant_column)).execute(&mut *tx).await.map_err(map_err)?;
        }
        sqlx::query(sql(&self.statements.create_records)).execute(&mut *tx).await.map_err(map_err)?;
        if self.statements.live_lock.is_some() {
            crate::lock_table::migrate(&mut tx).await?;
        }
        tx.commit().await.map_err(map_err)
    }

    /// The store on a pool your application already has (default table names), creating its
    /// tables if missing. Your pool's settings apply; writes of this store queue behind the
    /// other writers of this process on the same file, as with [`open`](Self::open).
    pub async fn from_pool(pool: SqlitePool) -> Result<Self> {
        let c = SqliteConfig::default();
        let path = pool.connect_options().get_filename().to_path_buf();
        let in_memory = crate::db::is_in_memory(&path);
        let store = SqliteStore {
            shared: shared_file((!in_memory).then_some(path.as_path())),
            pool,
            statements: Arc::new(Statements::new(&c.fences_table, &c.records_table, false)?),
            busy_timeout: c.busy_timeout,
        };
        store.migrate().await?;
        Ok(store)
    }

    /// This process's turn to write if it comes within `bound`; `None` if another writer of
    /// the process (an open transaction) keeps it longer.
    pub(crate) async fn writer_within(&self, bound: Duration) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        tokio::time::timeout(bound, Arc::clone(&self.shared.writers).lock_owned()).await.ok()
    }

    /// Waits for this process's turn to write, as long as the busy timeout allows (a
    /// transaction left open elsewhere in the process must not hang every writer forever).
    pub(crate) async fn writer(&self) -> Result<tokio::sync::OwnedMutexGuard<()>> {
        tokio::time::timeout(self.busy_timeout, Arc::clone(&self.shared.writers).lock_owned()).await.map_err(|_| {
            Error::new(
                ErrorKind::Unavailable,
                BACKEND,
                format!(
                    "another writer of this process held the database for the whole busy timeout ({:?})",
                    self.busy_timeout
                ),
            )
            .with_retryable(true)
        })
    }

    /// The connection pool, for your own reads and schema.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// This process's waiters for the file's locks, woken by this process's releases.
    pub(crate) fn releases(&self) -> &Releases {
        &self.shared.releases
    }

    /// Starts a transaction for your own statements under `lease`'s fence.
    ///
    /// Behavior:
    /// - The transaction is `BEGIN IMMEDIATE` (it holds SQLite's write lock from the start, so
    ///   no other writer can slip in between the fence check and your statements).
    /// - Its first statement checks and raises the watermark of the lease's resource. If the
    ///   fence is lower than the watermark the transaction is rolled back and the result is
    ///   [`ErrorKind::StaleFence`]; if it equals a watermark another grant set,
    ///   [`ErrorKind::DuplicateFence`] (fencing rule 2). None of your statements run.
    /// - Nothing is written unless you call [`FencedTransaction::commit`]; dropping the
    ///   transaction rolls it back, watermark raise included.
    /// - Only a fenced lease can be passed: a lease of an efficiency lock has no fence.
    ///
    /// Already in a transaction of your own? Use [`check_fence_in`](Self::check_fence_in).
    pub async fn begin_fenced<S>(&self, lease: &Lease<S>) -> Result<FencedTransaction>
    where
        S: LockService<Fencing = Fenced> + ?Sized,
    {
        self.begin_with_fence(lease.key(), lease.grant_fence()).await
    }

    /// [`begin_fenced`](Self::begin_fenced) for a fence without its lease (handed over from
    /// another process, for example): the same checks, under `fence` for `resource`.
    pub async fn begin_with_fence(&self, resource: &ResourceKey, fence: GrantFence) -> Result<FencedTransaction> {
        self.begin_all(&[(resource.clone(), fence)]).await
    }

    /// [`begin_fenced`](Self::begin_fenced) for several resources held as one
    /// ([`MultiLease`](palisade_core::MultiLease)): the transaction's first statements check and
    /// raise **every** member's watermark, in canonical order. One stale or duplicate fence
    /// refuses the whole transaction (rolled back, none of your statements run) with the error
    /// naming that member ([`Error::resource`](palisade_core::Error::resource)). Write each
    /// resource's rows under its own fence ([`FencedTransaction::fence_of`]), with
    /// [`update_row_fenced_in`](Self::update_row_fenced_in) on a [`FencedRow`] if they carry one.
    pub async fn begin_fenced_all<S>(&self, locks: &MultiLease<S>) -> Result<FencedTransaction>
    where
        S: LockService<Fencing = Fenced> + ?Sized,
    {
        self.begin_all(&canonical_fences(BACKEND, &locks.fences())?).await
    }

    /// A `BEGIN IMMEDIATE` transaction whose first statements raise each watermark of `fences`
    /// (canonical order, not empty).
    async fn begin_all(&self, fences: &[(ResourceKey, GrantFence)]) -> Result<FencedTransaction> {
        let Some(((first, first_fence), _)) = fences.split_first() else {
            return Err(Error::new(ErrorKind::InvalidArgument, BACKEND, "a fenced transaction needs a fence"));
        };
        let writer = self.writer().await?;
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(map_err)?;
        for (resource, fence) in fences {
            counted(raise_watermark(&mut tx, &self.statements, resource, *fence).await)?;
        }
        let rest = fences.iter().skip(1).map(|(r, f)| (r.clone(), f.fence())).collect();
        Ok(FencedTransaction::new(tx, (first.clone(), first_fence.fence()), rest, writer))
    }

    /// A write transaction for your own statements (`BEGIN IMMEDIATE`, holding SQLite's write
    /// lock from the start), queued behind this process's other writers of the file as the
    /// store's own writes are. Run [`check_fence_in`](Self::check_fence_in) or
    /// [`update_row_fenced_in`](Self::update_row_fenced_in) on its [`conn`](WriteTransaction::conn)
    /// beside your statements.
    pub async fn begin(&self) -> Result<WriteTransaction> {
        let writer = self.writer().await?;
        let tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(map_err)?;
        Ok(WriteTransaction::new(tx, writer))
    }

    /// The fence on one row of your own table, as a
    /// [`WatermarkSource`](palisade_core::WatermarkSource) for
    /// [`lock_checked`](palisade_core::LockServiceExt::lock_checked): what to check a fresh grant
    /// against when the row is written with [`update_row_fenced`](Self::update_row_fenced), which
    /// never raises the store's watermark. A missing row or a NULL fence reads as "never
    /// written under a fence".
    pub fn row_watermark<'a, K>(&'a self, row: &FencedRow<'a>, key: K) -> RowWatermark<'a, K>
    where
        K: RowKey<'a>,
    {
        RowWatermark { store: self, row: *row, key }
    }

    /// Runs the fence check inside a transaction you already opened (`&mut *tx`): the
    /// watermark rule of [`begin_fenced`](Self::begin_fenced), on `conn`.
    ///
    /// Behavior:
    /// - Accepted: the resource's watermark is raised in your transaction; your commit makes it
    ///   and your writes durable together, your rollback undoes both.
    /// - Refused: [`ErrorKind::StaleFence`] or [`ErrorKind::DuplicateFence`], nothing written
    ///   by the check: roll your transaction back.
    /// - Open your transaction with [`begin`](Self::begin) (or `pool.begin_with("BEGIN
    ///   IMMEDIATE")`): a deferred `BEGIN` that has read first cannot always upgrade to a write
    ///   (SQLite answers `SQLITE_BUSY` at once when another connection wrote in between).
    pub async fn check_fence_in<S>(&self, conn: &mut SqliteConnection, lease: &Lease<S>) -> Result<()>
    where
        S: LockService<Fencing = Fenced> + ?Sized,
    {
        counted(raise_watermark(conn, &self.statements, lease.key(), lease.grant_fence()).await)
    }

    /// The incident's single-statement form on a row of your own table with a fence column, in a
    /// transaction of its own (see [`FencedRow`] for the statement):
    /// `UPDATE {table} SET {set}, {fence} = $1 WHERE {key} = $2 AND ({fence} IS NULL OR {fence} <= $1)`.
    ///
    /// `fence` is the lease (`&lease`) or a [`Fence`] handed over from its holder; `key` is any
    /// value sqlx binds for your key column (`i64`, `&str`, …); `set` is your SQL fragment with
    /// placeholders from `$3` on, bound by `bind` (never build it from user input). Zero rows
    /// means the row's fence is higher ([`ErrorKind::StaleFence`]) or there is no such row
    /// ([`ErrorKind::InvalidArgument`]); either way nothing changed. Like PostgreSQL's, this
    /// form checks only the row's own fence: no watermark, no grant id (see
    /// `palisade_postgres::PostgresStore::update_row_fenced` for what that means).
    pub async fn update_row_fenced<'q, K>(
        &self,
        row: &FencedRow<'_>,
        key: K,
        fence: impl Into<Fence> + Send,
        set: &str,
        bind: impl FnOnce(Query<'q, Sqlite, SqliteArguments>) -> Query<'q, Sqlite, SqliteArguments> + Send,
    ) -> Result<()>
    where
        K: RowKey<'q>,
    {
        let _writer = self.writer().await?;
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        update_row(&mut conn, row, key, fence.into(), set, bind).await
    }

    /// [`update_row_fenced`](Self::update_row_fenced) on `conn`, inside a transaction you
    /// already opened: the update and your other statements commit together. A refusal
    /// changes no row and leaves your transaction usable.
    pub async fn update_row_fenced_in<'q, K>(
        &self,
        conn: &mut SqliteConnection,
        row: &FencedRow<'_>,
        key: K,
        fence: impl Into<Fence> + Send,
        set: &str,
        bind: impl FnOnce(Query<'q, Sqlite, SqliteArguments>) -> Query<'q, Sqlite, SqliteArguments> + Send,
    ) -> Result<()>
    where
        K: RowKey<'q>,
    {
        update_row(conn, row, key, fence.into(), set, bind).await
    }

    /// Applies `batch` under `fences` (canonical order; none: unfenced) in one `BEGIN
    /// IMMEDIATE` transaction: every watermark is checked and raised before any operation.
    async fn apply_batch(&self, fences: &[(ResourceKey, GrantFence)], batch: &WriteBatch) -> Result<()> {
        batch.validate()?;
        // Records remember the last resource's fence (see `FencedStore::apply_all`).
        let mut fence_i64 = None;
        for (_, f) in fences {
            fence_i64 = Some(storable_fence(BACKEND, f.fence())?);
        }
        let _writer = self.writer().await?;
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(map_err)?;
        for (resource, f) in fences {
            raise_watermark(&mut tx, &self.statements, resource, *f).await?;
        }
        // Conditions see the state before the batch, so all checks run before any write.
        // On error `tx` is dropped, which rolls everything back: all or nothing.
        let is_check = |op: &&WriteOp| matches!(op, WriteOp::Check { .. });
        for op in batch.ops().iter().filter(is_check).chain(batch.ops().iter().filter(|op| !is_check(op))) {
            apply_op(&mut tx, &self.statements, op, fence_i64).await?;
        }
        tx.commit().await.map_err(map_err)
    }
}

/// The driver's name for a `synchronous` setting.
fn sqlite_synchronous(synchronous: Synchronous) -> SqliteSynchronous {
    match synchronous {
        Synchronous::Full => SqliteSynchronous::Full,
        Synchronous::Normal => SqliteSynchronous::Normal,
        Synchronous::Off => SqliteSynchronous::Off,
    }
}

async fn open_once(
    pool_options: SqlitePoolOptions,
    options: SqliteConnectOptions,
    statements: Arc<Statements>,
    shared: Arc<SharedFile>,
    busy_timeout: Duration,
) -> Result<SqliteStore> {
    let path = options.get_filename().to_path_buf();
    let pool = pool_options.connect_with(options).await.map_err(|e| {
        // SQLITE_CANTOPEN (14): a missing directory, no permission, a directory where the file
        // should be. Retrying cannot fix it: it is the configuration, so say which path.
        if let sqlx::Error::Database(db) = &e
            && db.code().and_then(|c| c.parse::<i32>().ok()).is_some_and(|c| c & 0xff == 14)
        {
            return Error::new(
                ErrorKind::InvalidConfig,
                BACKEND,
                format!("cannot open the SQLite database {}: {}", shown_path(path.as_ref()), db.message()),
            );
        }
        let err = map_err(e);
        if err.kind() == ErrorKind::Backend {
            return Error::new(ErrorKind::Unavailable, BACKEND, "cannot open the SQLite database").with_source(err);
        }
        err
    })?;
    let store = SqliteStore { pool, statements, shared, busy_timeout };
    store.migrate().await?;
    Ok(store)
}

/// Whether an error is SQLite's "database is busy/locked" (as opposed to, say, a missing
/// directory, which retrying cannot fix).
fn is_busy(e: &Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(sqlx::Error::Database(db)) = s.downcast_ref::<sqlx::Error>() {
            return db.code().and_then(|c| c.parse::<i32>().ok()).is_some_and(|c| matches!(c & 0xff, 5 | 6));
        }
        source = s.source();
    }
    false
}

/// The native paths (`begin_fenced`, `check_fence_in`) bypass `FencedStoreExt`, so they count
/// their own rejections.
fn counted(checked: Result<()>) -> Result<()> {
    if let Err(e) = &checked
        && matches!(e.kind(), ErrorKind::StaleFence { .. } | ErrorKind::DuplicateFence { .. })
    {
        palisade_core::metrics::record_fence_rejected(BACKEND);
    }
    checked
}

/// Raises the watermark inside `conn`'s transaction, or reports why not (stale or duplicate).
pub(crate) async fn raise_watermark(
    conn: &mut SqliteConnection,
    statements: &Statements,
    resource: &ResourceKey,
    fence: GrantFence,
) -> Result<()> {
    let fence_i64 = storable_fence(BACKEND, fence.fence())?;
    if let Some(live) = statements.live_lock {
        // Inside the write transaction, which holds the file's write lock: no grant can be
        // made between this check and the commit.
        let now = crate::lock_table::Now::read();
        let live: Option<i64> = sqlx::query_scalar(live)
            .bind(resource.to_string())
            .bind(fence.grant().as_bytes().as_slice())
            .bind(fence_i64)
            .bind(now.wall_ms)
            .bind(now.boot_id())
            .bind(now.monotonic_ms())
            .fetch_optional(&mut *conn)
            .await
            .map_err(map_err)?;
        if live.is_none() {
            return Err(not_live(conn, resource, fence).await);
        }
    }
    let changed = sqlx::query(sql(&statements.raise_watermark))
        .bind(resource.to_string())
        .bind(fence_i64)
        .bind(fence.grant().as_bytes().as_slice())
        .execute(&mut *conn)
        .await
        .map_err(map_err)?
        .rows_affected();
    // Planted bug (tests only): a refusal is ignored and the write goes ahead.
    if changed == 1 || palisade_core::spi::planted_bug("sqlite-store-accepts-stale-fences") {
        return Ok(());
    }
    let (current, grant): (i64, Option<Vec<u8>>) = sqlx::query_as(sql(&statements.read_watermark))
        .bind(resource.to_string())
        .fetch_one(&mut *conn)
        .await
        .map_err(map_err)?;
    let current = sql::fence_from_column(Some(current)).unwrap_or_default();
    Err(explain_refusal(BACKEND, resource, fence, current, grant.as_deref().and_then(GrantId::from_slice)))
}

/// The refusal of a write whose lock is not live in this file (`require_live_lock`), from the
/// lock's own row.
async fn not_live(conn: &mut SqliteConnection, resource: &ResourceKey, fence: GrantFence) -> Error {
    type LockRow = (i64, Option<Vec<u8>>);
    let lock: Option<LockRow> =
        match sqlx::query_as(crate::lock_table::LOCK_ROW).bind(resource.to_string()).fetch_optional(&mut *conn).await {
            Ok(lock) => lock,
            Err(e) => return map_err(e),
        };
    let lock = lock.and_then(|(current, grant)| {
        Some((sql::fence_from_column(Some(current))?, grant.as_deref().and_then(GrantId::from_slice)))
    });
    lock_not_live(BACKEND, "this file's lock table", Some((resource, fence)), lock)
}

/// A value sqlx binds for the key column of your table (`i64`, `&str`, `String`, …):
/// implemented for every such type.
pub trait RowKey<'q>:
    sqlx::Encode<'q, Sqlite> + sqlx::Type<Sqlite> + Clone + Send + Sync + std::fmt::Debug + 'q
{
}

impl<'q, T> RowKey<'q> for T where
    T: sqlx::Encode<'q, Sqlite> + sqlx::Type<Sqlite> + Clone + Send + Sync + std::fmt::Debug + 'q
{
}

/// The fence column of one row, read as a watermark: see [`SqliteStore::row_watermark`].
#[derive(Debug, Clone)]
pub struct RowWatermark<'a, K> {
    store: &'a SqliteStore,
    row: FencedRow<'a>,
    key: K,
}

#[async_trait]
impl<'a, K: RowKey<'a>> palisade_core::WatermarkSource for RowWatermark<'a, K> {
    fn source_name(&self) -> &'static str {
        BACKEND
    }

    /// The row's fence; the resource is the row, whatever `resource` the lock is taken on.
    async fn highest_fence(&self, _resource: &ResourceKey) -> Result<Option<Fence>> {
        let mut conn = self.store.pool.acquire().await.map_err(map_err)?;
        Ok(row_fence(&mut conn, &self.row, self.key.clone()).await?.flatten())
    }
}

/// The fence column of `key`'s row: `None` if there is no such row, `Some(None)` if its fence
/// is NULL.
async fn row_fence<'q, K: RowKey<'q>>(
    conn: &mut SqliteConnection,
    row: &FencedRow<'_>,
    key: K,
) -> Result<Option<Option<Fence>>> {
    let current: Option<Option<i64>> = sqlx::query_scalar(AssertSqlSafe(row.fence_sql(BACKEND)?))
        .bind(key)
        .fetch_optional(conn)
        .await
        .map_err(map_err)?;
    Ok(current.map(sql::fence_from_column))
}

/// The single-row fenced update on `conn`, and on zero rows the reason (stale or missing).
async fn update_row<'q, K: RowKey<'q>>(
    conn: &mut SqliteConnection,
    row: &FencedRow<'_>,
    key: K,
    fence: Fence,
    set: &str,
    bind: impl FnOnce(Query<'q, Sqlite, SqliteArguments>) -> Query<'q, Sqlite, SqliteArguments> + Send,
) -> Result<()> {
    let update = row.update_sql(BACKEND, set)?;
    let fence_i64 = storable_fence(BACKEND, fence)?;
    let rows = bind(sqlx::query(AssertSqlSafe(update)).bind(fence_i64).bind(key.clone()))
        .execute(&mut *conn)
        .await
        .map_err(map_err)?
        .rows_affected();
    if rows > 0 {
        return Ok(());
    }
    let current = row_fence(conn, row, key.clone()).await?;
    Err(row.refusal(BACKEND, &key, fence, current))
}

async fn apply_op(conn: &mut SqliteConnection, s: &Statements, op: &WriteOp, fence: Option<i64>) -> Result<()> {
    match op {
        WriteOp::Put { key, value } => {
            sqlx::query(sql(&s.put)).bind(key).bind(value).bind(fence).execute(&mut *conn).await.map_err(map_err)?;
        }
        WriteOp::Create { key, value } => {
            let created = sqlx::query(sql(&s.create))
                .bind(key)
                .bind(value)
                .bind(fence)
                .execute(&mut *conn)
                .await
                .map_err(map_err)?
                .rows_affected();
            if created == 0 {
                return Err(conflict_error(BACKEND, op));
            }
        }
        WriteOp::Delete { key } => {
            sqlx::query(sql(&s.delete)).bind(key).execute(&mut *conn).await.map_err(map_err)?;
        }
        WriteOp::Check { key, expected } => {
            let actual: Option<Vec<u8>> =
                sqlx::query_scalar(sql(&s.read)).bind(key).fetch_optional(&mut *conn).await.map_err(map_err)?;
            if actual.as_ref() != expected.as_ref() {
                return Err(conflict_error(BACKEND, op));
            }
        }
    }
    Ok(())
}

#[async_trait]
impl FencedStore for SqliteStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// With [`SqliteConfig::require_live_lock`](crate::SqliteConfig::require_live_lock).
    fn requires_live_lock(&self) -> bool {
        self.statements.live_lock.is_some()
    }

    async fn apply(&self, resource: &ResourceKey, fence: GrantFence, batch: &WriteBatch) -> Result<()> {
        self.apply_batch(&[(resource.clone(), fence)], batch).await
    }

    /// One `BEGIN IMMEDIATE` transaction: each watermark in resource order, then the records.
    async fn apply_all(&self, fences: &[(ResourceKey, GrantFence)], batch: &WriteBatch) -> Result<()> {
        self.apply_batch(&canonical_fences(BACKEND, fences)?, batch).await
    }

    async fn apply_unfenced(&self, batch: &WriteBatch) -> Result<()> {
        self.apply_batch(&[], batch).await
    }

    async fn watermark(&self, resource: &ResourceKey) -> Result<Option<Fence>> {
        sql::read_watermark(&self.pool, &self.statements.read_watermark, resource, map_err).await
    }

    async fn read(&self, key: &str) -> Result<Option<Record>> {
        sql::read_record(&self.pool, &self.statements.read, key, map_err).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Record)>> {
        sql::list_records(&self.pool, &self.statements.list, prefix, map_err).await
    }
}

/// `palisade inspect`'s view of the watermark table: reads only.
#[async_trait]
impl InspectStore for SqliteStore {
    async fn watermarks(&self, prefix: &str) -> Result<Listing<(ResourceKey, WatermarkView)>> {
        match sql::list_watermarks(&self.pool, &self.statements.list_watermarks, prefix, map_err).await {
            Err(e) if crate::db::no_such_table(&e) => Ok(Listing::of(Vec::new())),
            other => other,
        }
    }

    async fn watermark_view(&self, resource: &ResourceKey) -> Result<Option<WatermarkView>> {
        match sql::watermark_view(&self.pool, &self.statements.read_watermark, resource, map_err).await {
            Err(e) if crate::db::no_such_table(&e) => Ok(None),
            other => other,
        }
    }

    async fn records(&self, prefix: &str) -> Result<Vec<(String, Record)>> {
        match self.list(prefix).await {
            Err(e) if crate::db::no_such_table(&e) => Ok(Vec::new()),
            other => other,
        }
    }

    async fn record(&self, name: &str) -> Result<Option<Record>> {
        match self.read(name).await {
            Err(e) if crate::db::no_such_table(&e) => Ok(None),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file not created yet is known by its directory's real path and its name, so two
    /// spellings of it (here through a symbolic link to its directory), and the file once
    /// created, share one writer gate and one table of waiters.
    #[test]
    #[cfg(unix)]
    fn spellings_of_a_file_not_yet_created_share_its_state() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap_or_else(|e| panic!("mkdir: {e}"));
        std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap_or_else(|e| panic!("symlink: {e}"));
        let plain = real.join("new.db");
        let linked = dir.path().join("link").join("new.db");
        let first = shared_file(Some(&plain));
        assert!(Arc::ptr_eq(&first, &shared_file(Some(&linked))), "two spellings, two gates");
        std::fs::write(&plain, b"").unwrap_or_else(|e| panic!("create: {e}"));
        assert!(Arc::ptr_eq(&first, &shared_file(Some(&linked))), "the file once created, another gate");
    }
}
