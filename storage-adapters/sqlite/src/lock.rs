//! The SQLite lock service: locks and their fence counters in the same file as the data.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use palisade_core::spi::{
    Backoff, distinct_keys, first_of, poll_acquire_woken, storable_fence, timeout_of_any, try_each,
};
use palisade_core::{
    AllOrNone, Capabilities, Deployment, Error, ErrorKind, Fence, FenceSource, Fenced, Grant, GrantId, InspectLocks,
    Listing, LockService, LockView, MAX_LISTED, MultiAcquire, OwnerToken, ResourceKey, Result, Ttl, Waiting,
};
use sqlx::Row;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::warn;

use crate::db::map_err;
use crate::lock_table::{ACQUIRE, ADVANCE, EXTEND, LIST, Now, RELEASE, VIEW, migrate};
use crate::store::SqliteStore;

use crate::db::BACKEND;

/// How long one acquire attempt waits for this process's other writers: a few ordinary
/// statements' worth, not the busy timeout.
const ONE_ATTEMPT: Duration = Duration::from_millis(100);

/// A fenced lock service in a SQLite database file: the embedded default's locks.
///
/// Locks, their fence counters and (through [`SqliteStore`]) the data they protect live in one
/// file, so:
/// - **fences never regress across runs**: the counter is as durable as the data (a backup
///   restores both together), where an in-process counter starts again at 1 with every process;
/// - **processes on one machine coordinate**: every process that opens the file shares its locks.
///
/// Each acquire, extend and release is one statement. Expiry is judged by the machine's
/// monotonic clock in the current boot (every process on one machine reads the same one, and
/// nobody steps it): a wall clock stepped ahead or back neither ends a hold early nor keeps an
/// expired one. A row from an earlier boot is expired. Processes sharing a file must share a
/// Linux time namespace. A row written by an earlier version (which knew only the wall clock)
/// is judged by the wall clock, as that version judges it; so is every row on a machine that
/// tells no boot id (not Linux). A release by a lock service of this process on
/// the same file wakes this process's waiters for the key at once; releases by other processes,
/// and expiries, are found by polling with backoff (2 ms doubling to 250 ms). A file shared
/// over a network file system is not supported (SQLite's own locking is unreliable there).
///
/// **One writer at a time.** SQLite lets one transaction write the file at a time, and every
/// acquire, extend and release writes. So while a fenced transaction ([`SqliteStore::begin_fenced`],
/// [`SqliteStore::begin`]) is open, nobody can take, renew or release any lock of the file — its
/// own holder included: keep fenced transactions well inside the TTL (renew before, not during).
/// Each operation stays bounded meanwhile: one acquire attempt waits at most 100 ms for this
/// process's other writers and then fails as `Unavailable` (retryable: a zero wait answers at
/// once; a longer wait tries again until it runs out, then `Timeout`); extend and release wait
/// at most the busy timeout (5 s by default) and then fail as `Unavailable` (retryable).
/// Another process's writer is met the same way: an acquire attempt gives up on the file after
/// 100 ms, extend and release after the busy timeout. A process frozen (or stopped in a
/// debugger) inside a write transaction keeps the whole file from every writer until it is
/// thawed or dies — no server can end its transaction — so lock operations answer within their
/// bounds, with `Unavailable`, and nothing is granted meanwhile.
///
/// **Repairs** ([`advance_fence`](LockService::advance_fence)) move the counter's floor, never
/// the holder's fence: the holder keeps, extends and releases its lock as before.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use palisade_core::{FencedStoreExt, LockOptions, LockServiceExt, ResourceKey, WriteBatch};
/// use palisade_sqlite::{SqliteLockService, SqliteStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> palisade_core::Result<()> {
/// let dir = std::env::temp_dir().join(format!("palisade-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).ok();
/// let url = format!("sqlite://{}/app.db", dir.display());
/// let store = SqliteStore::connect(&url).await?;
/// let locks = Arc::new(SqliteLockService::new(&store).await?);   // the same file
///
/// let key = ResourceKey::new("alloc", "WH-01")?;
/// let lease = locks.lock(&key, LockOptions::ttl(Duration::from_secs(30)).wait(Duration::from_secs(5))).await?;
/// store.write(&lease, &WriteBatch::new().put("stock/WH-01", b"9".to_vec())).await?;
/// lease.release().await?;
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteLockService {
    store: SqliteStore,
    /// Connections to the same file whose busy handler gives up after one attempt's bound:
    /// what an acquire attempt runs on, so that another process's long write transaction (a
    /// holder frozen inside its fenced transaction) makes it a retryable refusal in 100 ms,
    /// not a wait of the whole busy timeout. The store's own pool for an in-memory database,
    /// which no other process can reach.
    attempts: sqlx::SqlitePool,
}

impl SqliteLockService {
    /// Opens the lock service on the database at `url` (`sqlite://PATH[?…]`, as for
    /// [`SqliteStore::connect`]), creating its table if missing. `sqlite::memory:` gives a
    /// private in-memory database: one process only, no durability.
    pub async fn connect(url: &str) -> Result<Self> {
        SqliteLockService::new(&SqliteStore::connect(url).await?).await
    }

    /// The lock service on `store`'s database: the same file, pool and writer queue, so a lock
    /// and the fenced writes it protects share one database.
    pub async fn new(store: &SqliteStore) -> Result<Self> {
        let options = store.pool().connect_options();
        let in_memory = crate::db::is_in_memory(options.get_filename());
        let attempts = if in_memory {
            store.pool().clone()
        } else {
            sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(2)
                .min_connections(0)
                .connect_lazy_with((*options).clone().busy_timeout(ONE_ATTEMPT))
        };
        let service = SqliteLockService { store: store.clone(), attempts };
        service.make_table().await?;
        Ok(service)
    }

    /// The store whose file the locks are in (for `doctor`).
    pub(crate) fn store(&self) -> &SqliteStore {
        &self.store
    }

    /// The lock service on an existing database file opened read-only
    /// ([`SqliteStore::open_read_only`]), as `palisade inspect` does: only its
    /// [`InspectLocks`] view works; a lock table missing from the file shows as nothing
    /// locked and no counter kept.
    pub async fn open_read_only(url: &str) -> Result<Self> {
        let store = SqliteStore::open_read_only(url).await?;
        let attempts = store.pool().clone();
        Ok(SqliteLockService { store, attempts })
    }

    /// Makes the lock table if it is missing (and adds the columns later versions added).
    async fn make_table(&self) -> Result<()> {
        let _writer = self.store.writer().await?;
        let mut tx = self.store.pool().begin_with("BEGIN IMMEDIATE").await.map_err(map_err)?;
        migrate(&mut tx).await?;
        tx.commit().await.map_err(map_err)
    }

    /// Runs `op`; if it finds the lock table gone (dropped, or a file restored without it:
    /// every lock and fence counter lost), makes the table again and runs `op` once more.
    /// Grants then start from an empty table, and `lock_checked` and the store's watermark put
    /// their fences above every earlier one; without this, the service would refuse every
    /// call until it was opened again.
    async fn with_table<T, F>(&self, op: impl Fn() -> F) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        match op().await {
            // Planted bug (tests only): the table is not made again.
            Err(e) if table_missing(&e) && !palisade_core::spi::planted_bug("sqlite-lock-table-not-remade") => {
                warn!("the lock table is gone (its data lost); making it again");
                self.make_table().await?;
                op().await
            }
            other => other,
        }
    }

    /// Runs one write statement under this process's writer queue.
    async fn execute(&self, statement: &'static str, grant: &Grant<Fenced>, ttl: Option<Ttl>) -> Result<u64> {
        self.with_table(|| self.execute_once(statement, grant, ttl)).await
    }

    async fn execute_once(&self, statement: &'static str, grant: &Grant<Fenced>, ttl: Option<Ttl>) -> Result<u64> {
        let _writer = self.store.writer().await?;
        let now = Now::read();
        let result = sqlx::query(statement)
            .bind(grant.key().to_string())
            .bind(grant.grant_id().as_bytes().as_slice())
            .bind(now.wall_ms)
            .bind(ttl.map_or(0, |t| millis(t.get())))
            .bind(storable_fence(BACKEND, grant.fence())?)
            .bind(now.boot_id())
            .bind(now.monotonic_ms())
            .execute(self.store.pool())
            .await
            .map_err(map_err)?;
        Ok(result.rows_affected())
    }

    async fn try_acquire_once(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Fenced>>> {
        let token = OwnerToken::generate()?;
        let requested_at = Instant::now();
        let _writer = self.one_attempts_writer().await?;
        let now = Now::read();
        let row = sqlx::query(ACQUIRE)
            .bind(key.to_string())
            .bind(GrantId::of(&token).as_bytes().as_slice())
            .bind(now.wall_ms)
            .bind(millis(ttl.get()))
            .bind(now.boot_id())
            .bind(now.monotonic_ms())
            .fetch_optional(&self.attempts)
            .await
            .map_err(busy_past_one_attempt)?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(Grant::new(key.clone(), token, fence_of(&row)?, ttl, requested_at)))
    }

    async fn try_acquire_all_once(&self, keys: &[ResourceKey], ttl: Ttl) -> Result<AllOrNone<Grant<Fenced>>> {
        let tokens = keys.iter().map(|_| OwnerToken::generate()).collect::<Result<Vec<_>>>()?;
        let requested_at = Instant::now();
        let _writer = self.one_attempts_writer().await?;
        let mut tx = self.attempts.begin_with("BEGIN IMMEDIATE").await.map_err(busy_past_one_attempt)?;
        let now = Now::read();
        let mut grants = Vec::with_capacity(keys.len());
        for (i, (key, token)) in keys.iter().zip(tokens).enumerate() {
            let row = sqlx::query(ACQUIRE)
                .bind(key.to_string())
                .bind(GrantId::of(&token).as_bytes().as_slice())
                .bind(now.wall_ms)
                .bind(millis(ttl.get()))
                .bind(now.boot_id())
                .bind(now.monotonic_ms())
                .fetch_optional(&mut *tx)
                .await
                .map_err(busy_past_one_attempt)?;
            let Some(row) = row else {
                tx.rollback().await.map_err(map_err)?;
                return Ok(AllOrNone::Held(i));
            };
            grants.push(Grant::new(key.clone(), token, fence_of(&row)?, ttl, requested_at));
        }
        tx.commit().await.map_err(busy_past_one_attempt)?;
        Ok(AllOrNone::Granted(grants))
    }

    fn not_holder(grant: &Grant<Fenced>) -> Error {
        Error::new(ErrorKind::NotHolder, BACKEND, format!("lock {} is not held by this owner token", grant.key()))
    }

    /// This process's writer queue within one attempt's bound. One attempt answers at once: a
    /// writer of this process that keeps the file longer (an open fenced transaction) makes it
    /// a retryable refusal, not "held" (the key may well be free), and the caller's own wait
    /// decides whether to try again.
    async fn one_attempts_writer(&self) -> Result<tokio::sync::OwnedMutexGuard<()>> {
        self.store.writer_within(ONE_ATTEMPT).await.ok_or_else(|| {
            Error::new(
                ErrorKind::Unavailable,
                BACKEND,
                format!(
                    "the database is busy: another writer of this process (an open transaction) kept it for over {ONE_ATTEMPT:?}"
                ),
            )
            .with_retryable(true)
        })
    }
}

/// Whether `e` is SQLite saying the lock table does not exist.
fn table_missing(e: &Error) -> bool {
    std::error::Error::source(e).and_then(|source| source.downcast_ref::<sqlx::Error>()).is_some_and(
        |e| matches!(e, sqlx::Error::Database(db) if db.message().starts_with("no such table: palisade_locks")),
    )
}

/// An attempt's error: another process that held the file past one attempt's bound is said
/// so, retryably.
fn busy_past_one_attempt(e: sqlx::Error) -> Error {
    let e = map_err(e);
    if e.kind() == ErrorKind::Unavailable {
        Error::new(
            ErrorKind::Unavailable,
            BACKEND,
            format!("the database is busy: another writer kept the file for over {ONE_ATTEMPT:?}"),
        )
        .with_retryable(true)
        .with_source(e)
    } else {
        e
    }
}

/// The fence an acquire statement returned.
fn fence_of(row: &sqlx::sqlite::SqliteRow) -> Result<Fence> {
    let fence: i64 = row.try_get(0).map_err(map_err)?;
    u64::try_from(fence)
        .map(Fence::new)
        .map_err(|_| Error::new(ErrorKind::Backend, BACKEND, format!("negative fence {fence} in palisade_locks")))
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// This process's waiters for the locks of one file, by key, woken when a lock service of this
/// process releases the key. Releases by other processes, and expiries, are met by polling:
/// SQLite has no way to tell another process that a row changed.
#[derive(Debug, Default)]
pub(crate) struct Releases {
    /// Each key's notifier and how many subscriptions hold it; empty while nobody waits, so an
    /// uncontended release looks no further.
    by_key: Mutex<HashMap<String, (Arc<Notify>, usize)>>,
}

impl Releases {
    /// Wakes this process's waiters for `key` (a lock of the key was just released).
    fn released(&self, key: &ResourceKey) {
        let by_key = self.lock();
        if by_key.is_empty() {
            return;
        }
        if let Some((notify, _)) = by_key.get(&key.to_string()) {
            notify.notify_waiters();
        }
    }

    /// A waiter's subscription to `key`'s releases, until it is dropped.
    fn subscribe(&self, key: &ResourceKey) -> Subscription<'_> {
        let key = key.to_string();
        let mut by_key = self.lock();
        let (notify, subscribed) = by_key.entry(key.clone()).or_insert_with(|| (Arc::new(Notify::new()), 0));
        *subscribed += 1;
        let notify = Arc::clone(notify);
        Subscription { releases: self, key, notify }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Arc<Notify>, usize)>> {
        self.by_key.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One waiter's subscription to a key's releases (see [`Releases`]).
struct Subscription<'a> {
    releases: &'a Releases,
    key: String,
    notify: Arc<Notify>,
}

impl std::ops::Deref for Subscription<'_> {
    type Target = Notify;

    fn deref(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Subscription<'_> {
    fn drop(&mut self) {
        let mut by_key = self.releases.lock();
        // Counted under the map's lock, so the key's last subscription, and only it, removes it.
        if let Some((_, subscribed)) = by_key.get_mut(&self.key) {
            *subscribed = subscribed.saturating_sub(1);
            if *subscribed == 0 {
                by_key.remove(&self.key);
            }
        }
    }
}

#[async_trait]
impl LockService for SqliteLockService {
    type Fencing = Fenced;

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fence_source: FenceSource::Counter,
            fences_survive_release: true,
            fences_survive_restart: true,
            gap_free: true,
            waiting: Waiting::Polling,
            // One file, opened by every process on this machine: no network in between.
            deployment: Deployment::Embedded,
            multi_acquire: MultiAcquire::OneRequest,
            ..Capabilities::default()
        }
    }

    async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Fenced>>> {
        self.with_table(|| self.try_acquire_once(key, ttl)).await
    }

    /// One `BEGIN IMMEDIATE` transaction: the acquire statement for each key in order, rolled
    /// back at the first key held.
    async fn try_acquire_all(&self, keys: &[ResourceKey], ttl: Ttl) -> Result<AllOrNone<Grant<Fenced>>> {
        distinct_keys(BACKEND, keys)?;
        self.with_table(|| self.try_acquire_all_once(keys, ttl)).await
    }

    async fn acquire(&self, key: &ResourceKey, ttl: Ttl, wait: Duration) -> Result<Grant<Fenced>> {
        // SQLITE_BUSY from another process's long transaction is retryable: keep waiting. A
        // release in this process wakes the wait at once; other processes' are polled for.
        let subscribe = || Some(self.store.releases().subscribe(key));
        poll_acquire_woken(BACKEND, key, wait, Backoff::new(), true, subscribe, || self.try_acquire(key, ttl)).await
    }

    async fn acquire_any(&self, keys: &[ResourceKey], ttl: Ttl, wait: Duration) -> Result<Grant<Fenced>> {
        let first = first_of(BACKEND, keys)?;
        // As `acquire`, over every key: a release of any of them in this process wakes the wait.
        let subscribe = || keys.iter().map(|key| self.store.releases().subscribe(key)).collect::<Vec<_>>();
        let round = || try_each(self, keys, ttl);
        poll_acquire_woken(BACKEND, first, wait, Backoff::new(), true, subscribe, round)
            .await
            .map_err(|e| timeout_of_any(e, BACKEND, keys, wait))
    }

    async fn extend(&self, grant: &Grant<Fenced>, ttl: Ttl) -> Result<Ttl> {
        match self.execute(EXTEND, grant, Some(ttl)).await? {
            1 => Ok(ttl),
            _ => Err(Self::not_holder(grant)),
        }
    }

    async fn release(&self, grant: &Grant<Fenced>) -> Result<()> {
        match self.execute(RELEASE, grant, None).await? {
            1 => {
                self.store.releases().released(grant.key());
                Ok(())
            }
            _ => Err(Self::not_holder(grant)),
        }
    }

    async fn advance_fence(&self, key: &ResourceKey, floor: Fence) -> Result<()> {
        let floor = storable_fence(BACKEND, floor)?;
        self.with_table(|| async {
            let _writer = self.store.writer().await?;
            sqlx::query(ADVANCE).bind(key.to_string()).bind(floor).execute(self.store.pool()).await.map_err(map_err)
        })
        .await?;
        Ok(())
    }
}

/// `palisade inspect`'s view of the lock table: reads only. [`SqliteLockService::open_read_only`]
/// opens a file for it without changing the file.
#[async_trait]
impl InspectLocks for SqliteLockService {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn resources(&self, prefix: &str) -> Result<Listing<ResourceKey>> {
        let limit = i64::try_from(MAX_LISTED + 1).unwrap_or(i64::MAX);
        let rows: Result<Vec<String>> =
            sqlx::query_scalar(LIST).bind(prefix).bind(limit).fetch_all(self.store.pool()).await.map_err(map_err);
        match rows {
            Ok(rows) => Ok(Listing::of_names(rows.iter().map(String::as_str))),
            Err(e) if table_missing(&e) => Ok(Listing::of(Vec::new())),
            Err(e) => Err(e),
        }
    }

    async fn lock_view(&self, key: &ResourceKey) -> Result<LockView> {
        let now = Now::read();
        let row = sqlx::query(VIEW)
            .bind(key.to_string())
            .bind(now.wall_ms)
            .bind(now.boot_id())
            .bind(now.monotonic_ms())
            .fetch_optional(self.store.pool())
            .await
            .map_err(map_err);
        // No table, or no row: nothing was ever locked here, or the table was lost with every
        // counter (the next grant's fence is 1).
        let nothing = || LockView::free(key.clone()).with_counter(Some(Fence::new(0)));
        let row = match row {
            Ok(row) => row,
            Err(e) if table_missing(&e) => return Ok(nothing()),
            Err(e) => return Err(e),
        };
        let Some(row) = row else { return Ok(nothing()) };
        let view = palisade_core::spi::sql::lock_view_at(key, &row, map_err)?;
        Ok(view)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Subscriptions to one key, ended in any order, leave nothing behind, and a release wakes
    /// the subscriptions alive when it comes.
    #[tokio::test]
    async fn the_waiters_table_keeps_only_live_subscriptions() {
        let releases = Arc::new(Releases::default());
        let key = ResourceKey::new("alloc", "WH-01").unwrap_or_else(|e| panic!("{e}"));
        {
            let (a, b) = (releases.subscribe(&key), releases.subscribe(&key));
            let woken = b.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            drop(a);
            releases.released(&key);
            tokio::time::timeout(Duration::from_secs(1), woken).await.unwrap_or_else(|_| panic!("not woken"));
        }
        assert!(releases.lock().is_empty());
        // Two ends at once on two threads, many times: no entry survives its subscriptions.
        for _ in 0..200 {
            let subs: Vec<_> = (0..2).map(|_| Arc::clone(&releases)).collect();
            let handles: Vec<_> = subs
                .into_iter()
                .map(|r| {
                    let key = key.clone();
                    std::thread::spawn(move || drop(r.subscribe(&key)))
                })
                .collect();
            for h in handles {
                h.join().unwrap_or_else(|_| panic!("thread"));
            }
        }
        assert!(releases.lock().is_empty(), "entries left: {:?}", releases.lock().keys().collect::<Vec<_>>());
    }
}
