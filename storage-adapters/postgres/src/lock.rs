//! The PostgreSQL lock service: locks and their fence counters in a table of the database that
//! holds the data, expiry by the server's clock, waiters woken by `LISTEN`/`NOTIFY`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use palisade_core::spi::{AttemptOutcome, Backoff, storable_fence, wait_for_release};
use palisade_core::{
    Capabilities, Error, ErrorKind, Fence, FenceSource, Fenced, Grant, GrantId, LockService, OwnerToken, ResourceKey,
    Result, Ttl, Waiting,
};
use sqlx::postgres::PgListener;
use sqlx::{AssertSqlSafe, PgPool};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::debug;

use crate::config::{PostgresConfig, quote_ident};
use crate::store::{BACKEND, PostgresStore, map_err};

/// The longest a waiter sleeps without a notification before it tries again: the bound on a
/// handoff when a notification is lost (the listener's connection dropped and came back).
const MAX_STEP: Duration = Duration::from_millis(250);

#[derive(Debug)]
struct LockStatements {
    schema: String,
    /// The channel releases are announced on (the table's name), payload the resource.
    channel: String,
    // Shared, not copied, into every query (the hot path).
    acquire: Arc<str>,
    extend: Arc<str>,
    release: Arc<str>,
    advance: Arc<str>,
}

impl LockStatements {
    fn new(config: &PostgresConfig) -> Result<Self> {
        let l = quote_ident(&config.locks_table)?;
        let ms = "$3::float8 * interval '1 millisecond'";
        Ok(LockStatements {
            schema: config.locks_schema_sql()?,
            channel: config.locks_table.clone(),
            // Takes a free or expired lock and issues the next fence; otherwise no fence, and
            // the holder's time left (a hint for the waiter). A lock the statement's snapshot
            // shows held is answered from the read alone: woken waiters that lose the race do
            // not queue on the row's lock ahead of the holder's release. A waiter (`$4`) that
            // finds it held marks the row `waiting`, once, so that its release sends a `NOTIFY`;
            // a grant clears the mark (the waiters still waiting set it again on their next
            // attempt, which the release that made the grant possible woke them for).
            acquire: format!(
                "WITH held AS (SELECT expires_at, waiting FROM {l} \
                 WHERE resource = $1 AND grant_id IS NOT NULL AND expires_at > clock_timestamp()), \
                 taken AS (INSERT INTO {l} AS l (resource, grant_id, expires_at, fence) \
                 SELECT $1, $2, clock_timestamp() + {ms}, 1 WHERE NOT EXISTS (SELECT 1 FROM held) \
                 ON CONFLICT (resource) DO UPDATE SET grant_id = EXCLUDED.grant_id, \
                 expires_at = clock_timestamp() + {ms}, fence = l.fence + 1, waiting = false \
                 WHERE l.grant_id IS NULL OR l.expires_at <= clock_timestamp() RETURNING l.fence), \
                 marked AS (UPDATE {l} SET waiting = true WHERE resource = $1 AND $4 AND NOT waiting \
                 AND EXISTS (SELECT 1 FROM held WHERE NOT held.waiting)) \
                 SELECT (SELECT fence FROM taken), \
                 (SELECT greatest(0, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000))::BIGINT FROM held)"
            ).into(),
            extend: format!(
                "UPDATE {l} SET expires_at = clock_timestamp() + {ms} \
                 WHERE resource = $1 AND grant_id = $2 AND fence = $4 AND expires_at > clock_timestamp() RETURNING 1"
            ).into(),
            // The notification, only when a waiter marked the row, is delivered when the
            // statement commits: waiters wake to a free row. (PostgreSQL serialises notifying
            // commits, so an uncontended release sends none.) One row back: released.
            release: format!(
                "WITH released AS (UPDATE {l} SET grant_id = NULL, expires_at = clock_timestamp() \
                 WHERE resource = $1 AND grant_id = $2 AND fence = $4 AND expires_at > clock_timestamp() \
                 RETURNING resource, waiting) \
                 SELECT CASE WHEN waiting THEN pg_notify($3, resource) END FROM released"
            ).into(),
            advance: format!(
                "INSERT INTO {l} AS l (resource, grant_id, expires_at, fence) VALUES ($1, NULL, clock_timestamp(), $2) \
                 ON CONFLICT (resource) DO UPDATE SET fence = greatest(l.fence, EXCLUDED.fence)"
            ).into(),
        })
    }
}

/// A fenced lock service in a PostgreSQL database: for teams whose only server is PostgreSQL.
///
/// - **One statement per operation**: acquire, extend and release are one round trip each.
/// - **The server's clock**: a lock expires when the server's clock passes its expiry; clients'
///   clocks are never compared with it (a grant's client-side deadline starts before the
///   statement ran, so it ends no later than the server's). The statements read
///   `clock_timestamp()`, not `now()`: `now()` is the time the statement *started*, and one
///   that waited on the row's lock (behind a release, or a write holding a live lock) would
///   grant an expiry already partly spent, or judge a lock by a moment long gone.
/// - **Fences from a per-resource counter** in the lock's row (`palisade_locks`, one row per
///   resource ever locked, kept after release and expiry): it never goes back, has no gaps,
///   and is as durable as the database.
/// - **Waiting**: a waiter that finds the lock held marks its row, and the release of a marked
///   row sends `NOTIFY` on the table's channel with the resource (an uncontended release sends
///   none: PostgreSQL serialises notifying commits); waiters listen (one connection per
///   service, opened on the first wait) and try again at once, or at the holder's expiry, and at
///   least every 250 ms in case a notification was lost. Waiters are not served in order.
///
/// Why not session advisory locks (`pg_advisory_lock`)? They issue no fence, so a paused holder
/// cannot be refused; and they live in a connection, so they vanish silently when it drops (a
/// pooler, a network blip), while the holder goes on believing it holds them.
///
/// **Failover**: the counter is as durable as the database. A synchronous replica promoted after
/// a failover has every committed grant; an asynchronous one can lose the latest grants and
/// hand out their fences again, which a store checked with
/// [`lock_checked`](palisade_core::LockServiceExt::lock_checked) repairs, and a store in this
/// database (same failover) loses the same writes with them.
///
/// When the data is in the same database, open the store with
/// [`require_live_lock`](PostgresConfig::require_live_lock): each fenced write then commits only
/// while its lock is live.
///
/// ```no_run
/// use std::sync::Arc;
/// use std::time::Duration;
/// use palisade_core::{FencedStoreExt, LockOptions, LockServiceExt, ResourceKey, WriteBatch};
/// use palisade_postgres::{PostgresLockService, PostgresStore};
///
/// # async fn demo() -> palisade_core::Result<()> {
/// let store = PostgresStore::connect("postgres://app@127.0.0.1/app?require_live_lock=true").await?;
/// let locks = Arc::new(PostgresLockService::new(&store).await?);   // the same database and pool
/// let key = ResourceKey::new("alloc", "WH-01")?;
/// let lease = locks.lock(&key, LockOptions::ttl(Duration::from_secs(30)).wait(Duration::from_secs(5))).await?;
/// store.write(&lease, &WriteBatch::new().put("stock/WH-01", b"9".to_vec())).await?;
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PostgresLockService {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: PgPool,
    statements: LockStatements,
    /// Waiters per resource; entries die with the last waiter.
    waiters: Mutex<HashMap<String, Weak<Notify>>>,
    /// The task that listens for releases, started by the first wait.
    listener: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(mut listener) = self.listener.lock()
            && let Some(task) = listener.take()
        {
            task.abort();
        }
    }
}

impl PostgresLockService {
    /// Connects to the database at `url` (as [`PostgresStore::connect`]) and creates the lock
    /// table if missing.
    pub async fn connect(url: &str) -> Result<Self> {
        PostgresLockService::new(&PostgresStore::connect(url).await?).await
    }

    /// The lock service on `store`'s database and pool, with the store's `locks_table`
    /// (default), creating the table if missing.
    pub async fn new(store: &PostgresStore) -> Result<Self> {
        PostgresLockService::with_config(store.pool().clone(), &PostgresConfig::new(String::new())).await
    }

    /// The lock service on a pool your application already has, with `config`'s `locks_table`
    /// and `migrate` setting (its URL and pool settings are not used).
    pub async fn with_config(pool: PgPool, config: &PostgresConfig) -> Result<Self> {
        let statements = LockStatements::new(config)?;
        if config.migrate {
            let mut tx = pool.begin().await.map_err(map_err)?;
            // The store's migration lock: concurrent CREATE TABLE IF NOT EXISTS collide.
            sqlx::query("SELECT pg_advisory_xact_lock(7243010045)").execute(&mut *tx).await.map_err(map_err)?;
            sqlx::raw_sql(AssertSqlSafe(statements.schema.clone())).execute(&mut *tx).await.map_err(map_err)?;
            tx.commit().await.map_err(map_err)?;
        }
        Ok(PostgresLockService {
            inner: Arc::new(Inner {
                pool,
                statements,
                waiters: Mutex::new(HashMap::new()),
                listener: Mutex::new(None),
            }),
        })
    }

    /// One acquire statement: the fence if granted, else the holder's time left.
    /// `waiting`: the caller will wait for a release (it listens), so a held lock is marked.
    async fn attempt(
        &self,
        key: &ResourceKey,
        ttl: Ttl,
        token: OwnerToken,
        waiting: bool,
    ) -> Result<AttemptOutcome<Grant<Fenced>>> {
        let requested_at = Instant::now();
        let (fence, left): (Option<i64>, Option<i64>) =
            sqlx::query_as(AssertSqlSafe(Arc::clone(&self.inner.statements.acquire)))
                .bind(key.to_string())
                .bind(&GrantId::of(&token).as_bytes()[..])
                .bind(millis(ttl.get()))
                .bind(waiting)
                .fetch_one(&self.inner.pool)
                .await
                .map_err(map_err)?;
        match fence {
            Some(fence) => {
                let fence = u64::try_from(fence).map_err(|_| {
                    Error::new(ErrorKind::Backend, BACKEND, format!("negative fence {fence} in the lock table"))
                })?;
                Ok(AttemptOutcome::Granted(Grant::new(key.clone(), token, Fence::new(fence), ttl, requested_at)))
            }
            // No row in the statement's snapshot: a grant committed meanwhile; look again soon.
            None => Ok(AttemptOutcome::Held {
                remaining: Duration::from_millis(left.and_then(|l| u64::try_from(l).ok()).unwrap_or(0)),
            }),
        }
    }

    /// The notifier of `key`'s waiters, and the listener started if it is not running.
    fn notifier(&self, key: &ResourceKey) -> Arc<Notify> {
        let resource = key.to_string();
        let notify = {
            let mut waiters = self.inner.waiters.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(live) = waiters.get(&resource).and_then(Weak::upgrade) {
                live
            } else {
                waiters.retain(|_, w| w.strong_count() > 0);
                let notify = Arc::new(Notify::new());
                waiters.insert(resource, Arc::downgrade(&notify));
                notify
            }
        };
        let mut listener = self.inner.listener.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if listener.as_ref().is_none_or(JoinHandle::is_finished) {
            *listener = Some(tokio::spawn(listen(Arc::downgrade(&self.inner))));
        }
        notify
    }

    /// Runs a statement on `grant`'s row; the number of rows it changed (or returned).
    async fn on_grant(&self, statement: &Arc<str>, grant: &Grant<Fenced>, third: Option<i64>) -> Result<u64> {
        let grant_id = grant.grant_id();
        let mut query = sqlx::query(AssertSqlSafe(Arc::clone(statement)))
            .bind(grant.key().to_string())
            .bind(&grant_id.as_bytes()[..]);
        query = match third {
            Some(ms) => query.bind(ms),
            None => query.bind(&self.inner.statements.channel),
        };
        let rows =
            query.bind(storable_fence(BACKEND, grant.fence())?).fetch_all(&self.inner.pool).await.map_err(map_err)?;
        Ok(rows.len() as u64)
    }

    fn not_holder(grant: &Grant<Fenced>) -> Error {
        Error::new(ErrorKind::NotHolder, BACKEND, format!("lock {} is not held by this grant", grant.key()))
    }
}

/// Listens for releases and wakes the waiters of each released resource; after (re)connecting,
/// wakes every waiter, since releases may have been missed meanwhile. Ends with the service.
async fn listen(service: Weak<Inner>) {
    let mut backoff = Backoff::with_bounds(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        let (pool, channel) = match service.upgrade() {
            Some(inner) => (inner.pool.clone(), inner.statements.channel.clone()),
            None => return,
        };
        let listening = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(&channel).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = match listening.await {
            Ok(listener) => listener,
            Err(e) => {
                debug!(error = %e, "lock listener cannot listen; retrying");
                tokio::time::sleep(backoff.next_delay()).await;
                continue;
            }
        };
        wake(&service, None);
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) => {
                    if !wake(&service, Some(notification.payload())) {
                        return;
                    }
                }
                // The connection dropped and the next call reconnects: releases may be lost.
                Ok(None) => {
                    if !wake(&service, None) {
                        return;
                    }
                }
                Err(e) => {
                    debug!(error = %e, "lock listener failed; reconnecting");
                    break;
                }
            }
        }
    }
}

/// Wakes the waiters of `resource` (all waiters for `None`); false once the service is gone.
fn wake(service: &Weak<Inner>, resource: Option<&str>) -> bool {
    let Some(inner) = service.upgrade() else { return false };
    let waiters = inner.waiters.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let woken: Vec<Arc<Notify>> = match resource {
        Some(resource) => waiters.get(resource).and_then(Weak::upgrade).into_iter().collect(),
        None => waiters.values().filter_map(Weak::upgrade).collect(),
    };
    drop(waiters);
    for notify in woken {
        notify.notify_waiters();
    }
    true
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[async_trait]
impl LockService for PostgresLockService {
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
            waiting: Waiting::Native,
            ..Capabilities::default()
        }
    }

    async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Fenced>>> {
        match self.attempt(key, ttl, OwnerToken::generate()?, false).await? {
            AttemptOutcome::Granted(grant) => Ok(Some(grant)),
            AttemptOutcome::Held { .. } => Ok(None),
        }
    }

    async fn acquire(&self, key: &ResourceKey, ttl: Ttl, wait: Duration) -> Result<Grant<Fenced>> {
        let token = OwnerToken::generate()?;
        // The first attempt runs bare; once it found the lock held, the waiter listens and
        // every later attempt marks the row.
        let listening = std::sync::atomic::AtomicBool::new(false);
        let notifier = || {
            listening.store(true, std::sync::atomic::Ordering::Relaxed);
            self.notifier(key)
        };
        let attempt = || self.attempt(key, ttl, token, listening.load(std::sync::atomic::Ordering::Relaxed));
        wait_for_release(BACKEND, key, wait, notifier, Some(MAX_STEP), attempt).await
    }

    async fn extend(&self, grant: &Grant<Fenced>, ttl: Ttl) -> Result<Ttl> {
        match self.on_grant(&self.inner.statements.extend, grant, Some(millis(ttl.get()))).await? {
            1 => Ok(ttl),
            _ => Err(Self::not_holder(grant)),
        }
    }

    async fn release(&self, grant: &Grant<Fenced>) -> Result<()> {
        match self.on_grant(&self.inner.statements.release, grant, None).await? {
            1 => Ok(()),
            _ => Err(Self::not_holder(grant)),
        }
    }

    async fn advance_fence(&self, key: &ResourceKey, floor: Fence) -> Result<()> {
        sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.statements.advance)))
            .bind(key.to_string())
            .bind(storable_fence(BACKEND, floor)?)
            .execute(&self.inner.pool)
            .await
            .map_err(map_err)?;
        Ok(())
    }
}
