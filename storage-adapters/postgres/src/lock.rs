//! The PostgreSQL lock service: locks and their fence counters in a table of the database that
//! holds the data, expiry by the server's clock, waiters woken by `LISTEN`/`NOTIFY`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use palisade_core::spi::{
    AttemptOutcome, Backoff, distinct_keys, first_granted, first_of, storable_fence, timeout_of_any,
    wait_for_any_release, wait_for_release,
};
use palisade_core::{
    AllOrNone, Capabilities, Error, ErrorKind, Fence, FenceSource, Fenced, Grant, GrantId, InspectLocks, Listing,
    LockService, LockView, MAX_LISTED, MultiAcquire, OwnerToken, ResourceKey, Result, Ttl, Waiters, Waiting,
};
use sqlx::postgres::PgListener;
use sqlx::{AssertSqlSafe, PgPool, Row};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::config::PostgresConfig;
use crate::db::{BACKEND, map_err, reply_lost};
use crate::lock_table::LockStatements;
use crate::store::PostgresStore;

/// The longest a waiter sleeps without a notification before it tries again: the bound on a
/// handoff when a notification is lost (the listener's connection dropped and came back), and
/// on how late a waiter notices that the last holder's fenced transaction has ended.
const MAX_STEP: Duration = Duration::from_millis(250);

/// How often a request whose reply was lost (the connection broke after it was sent) is sent
/// again, with the same grant id, before the caller is told the outcome is unknown.
const RESENDS: usize = 2;

/// A fenced lock service in a PostgreSQL database: for teams whose only server is PostgreSQL.
///
/// - **One statement per operation**: extend and release are one round trip each, and so is
///   the acquire of a known resource that is free or expired (a take-over of its row); an
///   acquire that takes nothing that way (the resource's first, a held lock, a waiter's
///   attempt) sends a second statement that answers every case.
/// - **The server's clock**: a lock expires when the server's clock passes its expiry; clients'
///   clocks are never compared with it (a grant's client-side deadline starts before the
///   statement ran, so it ends no later than the server's). The statements read
///   `clock_timestamp()`, not `now()`: `now()` is the time the statement *started*, and one
///   that waited on the row's lock (behind another operation's statement on the same row)
///   would grant an expiry already partly spent, or judge a lock by a moment long gone.
/// - **Fences from a per-resource counter** in the lock's row (`palisade_locks`, one row per
///   resource ever locked, kept after release and expiry): it never goes back, has no gaps,
///   and is as durable as the database.
/// - **Answers within its wait**: no statement ever waits for a fenced transaction (only, at
///   most, for another lock statement on the same row to finish). A lock whose row a fenced
///   transaction of the last holder still locks (a store with `require_live_lock`) reads as
///   held until that transaction ends, however long ago the lock expired — and the server ends
///   that transaction once it has sat idle for its lease's TTL, at least 1 s (30 s when opened
///   with a bare fence; see [`PostgresStore::begin_fenced`]). The holder can extend and
///   release during it. (A server that cannot be reached at all is bounded by the pool's
///   acquire timeout and TCP's, not by the wait.)
/// - **Lost replies**: acquire is idempotent per grant, so a request whose reply was lost is
///   sent again (twice at most) and answers with the grant it made; when a resend does not end
///   in that grant, the grant the first send may have made is released in the background
///   (retried until it would have expired anyway) and the caller gets "held" or a retryable
///   `Unavailable`. Extend and release are resent the same way (a resent release that finds
///   the grant gone reports success, as [`LockService::release`] says, even if the first send
///   came too late to release anything).
/// - **Repairs**: [`advance_fence`](LockService::advance_fence) moves the counter's floor, not
///   the holder's fence: the holder keeps, extends and releases its lock as before.
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
    /// Whether the service makes its table (the config's `migrate`): then it also makes it
    /// again when it finds it gone.
    migrate: bool,
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
    /// The pool and the lock table's unquoted name (for `doctor`).
    pub(crate) fn pool_and_table(&self) -> (&PgPool, &str) {
        (&self.inner.pool, &self.inner.statements.name)
    }

    /// Connects to the database at `url` (as [`PostgresStore::connect`]) and creates the lock
    /// table if missing.
    pub async fn connect(url: &str) -> Result<Self> {
        PostgresLockService::new(&PostgresStore::connect(url).await?).await
    }

    /// The lock service on `store`'s database and pool, with the store's lock table (its
    /// config's `locks_table`: the table its `require_live_lock` check reads), creating the
    /// table if missing.
    pub async fn new(store: &PostgresStore) -> Result<Self> {
        let config =
            PostgresConfig { locks_table: store.locks_table().to_string(), ..PostgresConfig::new(String::new()) };
        PostgresLockService::with_config(store.pool().clone(), &config).await
    }

    /// The lock service on a pool your application already has, with `config`'s `locks_table`
    /// and `migrate` setting (its URL and pool settings are not used).
    pub async fn with_config(pool: PgPool, config: &PostgresConfig) -> Result<Self> {
        let statements = LockStatements::new(&config.locks_table)?;
        if config.migrate {
            make_table(&pool, &statements.schema).await?;
        }
        Ok(PostgresLockService {
            inner: Arc::new(Inner {
                pool,
                statements,
                migrate: config.migrate,
                waiters: Mutex::new(HashMap::new()),
                listener: Mutex::new(None),
            }),
        })
    }

    /// One acquire attempt, under a grant id of its own: the fence if granted, else the
    /// holder's time left. `waiting`: the caller will wait for a release (it listens), so a
    /// held lock is marked.
    ///
    /// A cheap take-over of an existing free row goes first; when it takes nothing, the full
    /// statement decides (a new row, a holder, a waiter's mark).
    ///
    /// The full statement is idempotent per grant, so a request whose reply was lost is sent again
    /// with the same grant id and answers with the grant the first one made, if it made one.
    /// Whenever a resend does not end in that grant (it answered "held" — the first send may
    /// still have been running, its row locked — or it failed), the grant the first send may
    /// have made is released in the background, and the caller gets no grant: "held", or a
    /// retryable [`ErrorKind::Unavailable`]. Every attempt has a grant id of its own, so that
    /// clean-up can never release a later attempt's grant.
    async fn attempt(&self, key: &ResourceKey, ttl: Ttl, waiting: bool) -> Result<AttemptOutcome<Grant<Fenced>>> {
        self.with_table(|| self.attempt_once(key, ttl, waiting)).await
    }

    /// Runs `op`; if it finds the lock table gone (dropped, or a restore that did not bring
    /// it back: every lock and fence counter lost), makes the table again, when the service
    /// makes its table at all, and runs `op` once more. Grants then start from an empty table,
    /// and `lock_checked` and the store's watermark put their fences above every earlier one;
    /// without this, the service would refuse every call until someone made the table.
    async fn with_table<T, F>(&self, op: impl Fn() -> F) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        match op().await {
            Err(e) if self.inner.migrate && table_missing(&e) => {
                warn!(table = %self.inner.statements.channel, "the lock table is gone (its data lost); making it again");
                make_table(&self.inner.pool, &self.inner.statements.schema).await?;
                op().await
            }
            other => other,
        }
    }

    async fn attempt_once(&self, key: &ResourceKey, ttl: Ttl, waiting: bool) -> Result<AttemptOutcome<Grant<Fenced>>> {
        let token = OwnerToken::generate()?;
        // The first send's time: a resend's reply may carry the expiry the first one set.
        let requested_at = Instant::now();
        let grant_id = GrantId::of(&token);
        let mut sends = 0;
        let taken = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.inner.statements.take)))
            .bind(key.to_string())
            .bind(&grant_id.as_bytes()[..])
            .bind(millis(ttl.get()))
            .fetch_optional(&self.inner.pool)
            .await;
        match taken {
            Ok(Some(fence)) => return Self::granted(key, token, fence, ttl, requested_at),
            Ok(None) => {}
            // The take-over may have been made: the full statement is idempotent per grant and
            // answers with it, and whatever else it answers is handled as a resend's answer.
            Err(e) if reply_lost(&e) => {
                sends += 1;
                debug!(key = %key, error = %e, "take-over reply lost; asking again with the same grant");
            }
            Err(e) => return Err(map_err(e)),
        }
        let (fence, left, locked): (Option<i64>, Option<i64>, bool) = loop {
            let sent = sqlx::query_as(AssertSqlSafe(Arc::clone(&self.inner.statements.acquire)))
                .bind(key.to_string())
                .bind(&grant_id.as_bytes()[..])
                .bind(millis(ttl.get()))
                .bind(waiting)
                .fetch_one(&self.inner.pool)
                .await;
            match sent {
                Ok(row) => break row,
                Err(e) if reply_lost(&e) && sends < RESENDS => {
                    sends += 1;
                    debug!(key = %key, error = %e, "acquire reply lost; sending it again with the same grant");
                }
                Err(e) if sends > 0 || reply_lost(&e) => {
                    self.release_orphan(key, grant_id, ttl, requested_at);
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        BACKEND,
                        format!(
                            "no reply to the acquire of {key}: not granted (a grant it may have made is being released)"
                        ),
                    )
                    .with_source(e));
                }
                Err(e) => return Err(map_err(e)),
            }
        };
        if fence.is_none() && sends > 0 {
            self.release_orphan(key, grant_id, ttl, requested_at);
        }
        match fence {
            Some(fence) => Self::granted(key, token, fence, ttl, requested_at),
            // Free, but a transaction keeps the row locked: the last holder's live-lock write
            // has not ended. Held until it does; its end sends no notification, so look again.
            None if locked => Ok(AttemptOutcome::Held { remaining: MAX_STEP }),
            // No row in the statement's snapshot: a grant committed meanwhile; look again soon.
            None => Ok(AttemptOutcome::Held {
                remaining: Duration::from_millis(left.and_then(|l| u64::try_from(l).ok()).unwrap_or(0)),
            }),
        }
    }

    /// [`try_acquire_all`](LockService::try_acquire_all), under a grant id per member: the cheap
    /// take-over of a set whose rows exist and are free goes first; when it takes nothing, the
    /// full statement decides (new rows, a holder), sent again with the same ids after a lost
    /// reply (it is idempotent per grant, as the single acquire is). Whenever the answer is not
    /// the whole set granted, what the sends may have taken is released in the background.
    async fn attempt_all(&self, keys: &[ResourceKey], ttl: Ttl) -> Result<AllOrNone<Grant<Fenced>>> {
        self.with_table(|| self.attempt_all_once(keys, ttl)).await
    }

    async fn attempt_all_once(&self, keys: &[ResourceKey], ttl: Ttl) -> Result<AllOrNone<Grant<Fenced>>> {
        let tokens = keys.iter().map(|_| OwnerToken::generate()).collect::<Result<Vec<_>>>()?;
        let requested_at = Instant::now();
        let resources: Vec<String> = keys.iter().map(ToString::to_string).collect();
        let grant_ids: Vec<Vec<u8>> = tokens.iter().map(|t| GrantId::of(t).as_bytes().to_vec()).collect();
        let release_all = |why: &str| {
            debug!(keys = keys.len(), why, "releasing what an unconfirmed set acquire may have taken");
            for (key, token) in keys.iter().zip(&tokens) {
                self.release_orphan(key, GrantId::of(token), ttl, requested_at);
            }
        };
        let mut sends = 0;
        let mut take = sqlx::query_as(AssertSqlSafe(self.inner.statements.take_all(keys.len())?));
        for resource in &resources {
            take = take.bind(resource);
        }
        for grant_id in &grant_ids {
            take = take.bind(grant_id);
        }
        let taken: std::result::Result<Vec<(String, i64)>, sqlx::Error> =
            take.bind(millis(ttl.get())).fetch_all(&self.inner.pool).await;
        match taken {
            Ok(rows) if rows.len() == keys.len() => {
                let fence_of = |resource: &String| rows.iter().find(|(r, _)| r == resource).map(|&(_, fence)| fence);
                let fences: Option<Vec<i64>> = resources.iter().map(fence_of).collect();
                if let Some(fences) = fences {
                    return Self::granted_all(keys, &tokens, fences, ttl, requested_at, &release_all);
                }
                release_all("a take-over that answered for other rows");
                return Err(Error::new(ErrorKind::Backend, BACKEND, "the set's take-over answered for other rows"));
            }
            // Some row missing, held or locked: the full statement decides.
            Ok(_) => {}
            // The take-over may have been made: the full statement is idempotent per grant and
            // answers with it, and whatever else it answers is handled as a resend's answer.
            Err(e) if reply_lost(&e) => {
                sends += 1;
                debug!(keys = keys.len(), error = %e, "set take-over reply lost; asking again with the same grants");
            }
            Err(e) => return Err(map_err(e)),
        }
        let (blocked, fences): (Option<i64>, Vec<Option<i64>>) = loop {
            let sent = sqlx::query_as(AssertSqlSafe(Arc::clone(&self.inner.statements.acquire_all)))
                .bind(&resources)
                .bind(&grant_ids)
                .bind(millis(ttl.get()))
                .fetch_one(&self.inner.pool)
                .await;
            match sent {
                Ok(row) => break row,
                Err(e) if reply_lost(&e) && sends < RESENDS => {
                    sends += 1;
                    debug!(keys = keys.len(), error = %e, "set acquire reply lost; sending it again with the same grants");
                }
                Err(e) if sends > 0 || reply_lost(&e) => {
                    release_all("no reply");
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        BACKEND,
                        format!(
                            "no reply to the acquire of a set of {} from {}: not granted (what it may have taken is \
                             being released)",
                            keys.len(),
                            keys[0]
                        ),
                    )
                    .with_source(e));
                }
                Err(e) => return Err(map_err(e)),
            }
        };
        let index = |i: i64| usize::try_from(i - 1).ok().filter(|&i| i < keys.len());
        if let Some(at) = blocked {
            if sends > 0 {
                release_all("held after a resend");
            }
            let at = index(at).ok_or_else(|| {
                Error::new(ErrorKind::Backend, BACKEND, format!("the set acquire named member {at} of {}", keys.len()))
            })?;
            return Ok(AllOrNone::Held(at));
        }
        if fences.len() != keys.len() {
            release_all("a malformed answer");
            return Err(Error::new(
                ErrorKind::Backend,
                BACKEND,
                format!("the set acquire answered {} fences for {} keys", fences.len(), keys.len()),
            ));
        }
        if let Some(missing) = fences.iter().position(Option::is_none) {
            // Another acquire inserted that member's row meanwhile: held now.
            release_all("a member inserted by another acquire meanwhile");
            return Ok(AllOrNone::Held(missing));
        }
        Self::granted_all(keys, &tokens, fences.into_iter().flatten().collect(), ttl, requested_at, &release_all)
    }

    /// The grants of a set answered with `fences`, one per key; `release_all` when a fence is
    /// out of range.
    fn granted_all(
        keys: &[ResourceKey],
        tokens: &[OwnerToken],
        fences: Vec<i64>,
        ttl: Ttl,
        requested_at: Instant,
        release_all: &dyn Fn(&str),
    ) -> Result<AllOrNone<Grant<Fenced>>> {
        let mut grants = Vec::with_capacity(keys.len());
        for ((key, &token), fence) in keys.iter().zip(tokens).zip(fences) {
            match Self::grant_of(key, token, fence, ttl, requested_at) {
                Ok(grant) => grants.push(grant),
                Err(e) => {
                    release_all("a fence out of range");
                    return Err(e);
                }
            }
        }
        Ok(AllOrNone::Granted(grants))
    }

    /// The grant of an attempt answered with `fence`.
    fn granted(
        key: &ResourceKey,
        token: OwnerToken,
        fence: i64,
        ttl: Ttl,
        requested_at: Instant,
    ) -> Result<AttemptOutcome<Grant<Fenced>>> {
        Self::grant_of(key, token, fence, ttl, requested_at).map(AttemptOutcome::Granted)
    }

    /// A grant of `key` with the lock table's `fence`, which must not be negative.
    fn grant_of(
        key: &ResourceKey,
        token: OwnerToken,
        fence: i64,
        ttl: Ttl,
        requested_at: Instant,
    ) -> Result<Grant<Fenced>> {
        let fence = u64::try_from(fence).map_err(|_| {
            Error::new(ErrorKind::Backend, BACKEND, format!("negative fence {fence} in the lock table"))
        })?;
        Ok(Grant::new(key.clone(), token, Fence::new(fence), ttl, requested_at))
    }

    /// Releases whatever `grant_id` holds on `key`, in the background: the clean-up of an
    /// acquire whose sends never confirmed a grant. Its statement waits for a first send still
    /// running (the row lock), and it is tried again with backoff while the server cannot be
    /// reached, until the grant it may have made has expired by itself (its `ttl` from
    /// `requested_at`).
    fn release_orphan(&self, key: &ResourceKey, grant_id: GrantId, ttl: Ttl, requested_at: Instant) {
        let inner = Arc::clone(&self.inner);
        let resource = key.to_string();
        let expired = requested_at + ttl.get();
        tokio::spawn(async move {
            let mut backoff = Backoff::with_bounds(Duration::from_millis(50), Duration::from_secs(2));
            loop {
                let released = sqlx::query(AssertSqlSafe(Arc::clone(&inner.statements.release_grant)))
                    .bind(&resource)
                    .bind(&grant_id.as_bytes()[..])
                    .bind(&inner.statements.channel)
                    .fetch_all(&inner.pool)
                    .await;
                let Err(e) = released else { return };
                let delay = backoff.next_delay();
                if Instant::now() + delay >= expired {
                    debug!(resource, error = %e, "gave up releasing the grant of an unconfirmed acquire: it expires with its TTL");
                    return;
                }
                debug!(resource, error = %e, "could not release the grant of an unconfirmed acquire yet");
                tokio::time::sleep(delay).await;
            }
        });
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

    /// Runs a statement on `grant`'s row; the number of rows it changed (or returned), and
    /// whether it was sent again after a lost reply. Extend and release are idempotent on the
    /// row (an expiry set again, a grant cleared again), so a lost reply is resent.
    async fn on_grant(&self, statement: &Arc<str>, grant: &Grant<Fenced>, third: Option<i64>) -> Result<(u64, bool)> {
        self.with_table(|| self.on_grant_once(statement, grant, third)).await
    }

    async fn on_grant_once(
        &self,
        statement: &Arc<str>,
        grant: &Grant<Fenced>,
        third: Option<i64>,
    ) -> Result<(u64, bool)> {
        let grant_id = grant.grant_id();
        let fence = storable_fence(BACKEND, grant.fence())?;
        let mut sends = 0;
        loop {
            let mut query = sqlx::query(AssertSqlSafe(Arc::clone(statement)))
                .bind(grant.key().to_string())
                .bind(&grant_id.as_bytes()[..]);
            query = match third {
                Some(ms) => query.bind(ms),
                None => query.bind(&self.inner.statements.channel),
            };
            match query.bind(fence).fetch_all(&self.inner.pool).await {
                Ok(rows) => return Ok((rows.len() as u64, sends > 0)),
                Err(e) if reply_lost(&e) && sends < RESENDS => {
                    sends += 1;
                    debug!(key = %grant.key(), error = %e, "reply lost; sending the request again");
                }
                Err(e) => return Err(map_err(e)),
            }
        }
    }

    fn not_holder(grant: &Grant<Fenced>) -> Error {
        Error::new(ErrorKind::NotHolder, BACKEND, format!("lock {} is not held by this grant", grant.key()))
    }
}

/// Makes the lock table if it is missing, under the store's migration lock (concurrent
/// `CREATE TABLE IF NOT EXISTS` collide).
async fn make_table(pool: &PgPool, schema: &str) -> Result<()> {
    let mut tx = pool.begin().await.map_err(map_err)?;
    sqlx::query("SELECT pg_advisory_xact_lock(7243010045)").execute(&mut *tx).await.map_err(map_err)?;
    sqlx::raw_sql(AssertSqlSafe(schema.to_string())).execute(&mut *tx).await.map_err(map_err)?;
    tx.commit().await.map_err(map_err)
}

/// Whether `e` is PostgreSQL saying a table does not exist (42P01 `undefined_table`): the lock
/// service's statements name one table only, its own.
fn table_missing(e: &Error) -> bool {
    crate::db::undefined_table(e)
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
            multi_acquire: MultiAcquire::OneRequest,
            ..Capabilities::default()
        }
    }

    async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Fenced>>> {
        match self.attempt(key, ttl, false).await? {
            AttemptOutcome::Granted(grant) => Ok(Some(grant)),
            AttemptOutcome::Held { .. } => Ok(None),
        }
    }

    /// One statement for the whole set (see `attempt_all`).
    async fn try_acquire_all(&self, keys: &[ResourceKey], ttl: Ttl) -> Result<AllOrNone<Grant<Fenced>>> {
        distinct_keys(BACKEND, keys)?;
        self.attempt_all(keys, ttl).await
    }

    async fn acquire(&self, key: &ResourceKey, ttl: Ttl, wait: Duration) -> Result<Grant<Fenced>> {
        // The first attempt runs bare; once it found the lock held, the waiter listens and
        // every later attempt marks the row.
        let listening = std::sync::atomic::AtomicBool::new(false);
        let notifier = || {
            listening.store(true, std::sync::atomic::Ordering::Relaxed);
            self.notifier(key)
        };
        let attempt = || self.attempt(key, ttl, listening.load(std::sync::atomic::Ordering::Relaxed));
        wait_for_release(BACKEND, key, wait, notifier, Some(MAX_STEP), attempt).await
    }

    async fn acquire_any(&self, keys: &[ResourceKey], ttl: Ttl, wait: Duration) -> Result<Grant<Fenced>> {
        let first = first_of(BACKEND, keys)?;
        // As `acquire`, over every key: once a round found them all held, the waiter listens
        // on each and every later round marks the rows it finds held.
        let listening = std::sync::atomic::AtomicBool::new(false);
        let notifiers = || {
            listening.store(true, std::sync::atomic::Ordering::Relaxed);
            keys.iter().map(|key| self.notifier(key)).collect::<Vec<_>>()
        };
        let round = || {
            let waiting = listening.load(std::sync::atomic::Ordering::Relaxed);
            first_granted(keys.len(), move |i| self.attempt(&keys[i], ttl, waiting))
        };
        wait_for_any_release(BACKEND, first, wait, notifiers, Some(MAX_STEP), round)
            .await
            .map_err(|e| timeout_of_any(e, BACKEND, keys, wait))
    }

    async fn extend(&self, grant: &Grant<Fenced>, ttl: Ttl) -> Result<Ttl> {
        match self.on_grant(&self.inner.statements.extend, grant, Some(millis(ttl.get()))).await? {
            (1, _) => Ok(ttl),
            _ => Err(Self::not_holder(grant)),
        }
    }

    async fn release(&self, grant: &Grant<Fenced>) -> Result<()> {
        match self.on_grant(&self.inner.statements.release, grant, None).await? {
            (1, _) => Ok(()),
            // Resent after a lost reply and the grant is gone: the first send released it
            // (`LockService::release`).
            (_, true) => Ok(()),
            _ => Err(Self::not_holder(grant)),
        }
    }

    async fn advance_fence(&self, key: &ResourceKey, floor: Fence) -> Result<()> {
        let floor = storable_fence(BACKEND, floor)?;
        self.with_table(|| async {
            sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.statements.advance)))
                .bind(key.to_string())
                .bind(floor)
                .execute(&self.inner.pool)
                .await
                .map_err(map_err)
        })
        .await?;
        Ok(())
    }
}

/// `palisade inspect`'s view of the lock table: reads only (connect with `migrate` off, as
/// `palisade::inspect_locks` does, to change nothing at all).
#[async_trait]
impl InspectLocks for PostgresLockService {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn resources(&self, prefix: &str) -> Result<Listing<ResourceKey>> {
        let limit = i64::try_from(MAX_LISTED + 1).unwrap_or(i64::MAX);
        let rows: Result<Vec<String>> = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.inner.statements.list)))
            .bind(prefix)
            .bind(limit)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map_err);
        match rows {
            Ok(rows) => Ok(Listing::of_names(rows.iter().map(String::as_str))),
            Err(e) if table_missing(&e) => Ok(Listing::of(Vec::new())),
            Err(e) => Err(e),
        }
    }

    async fn lock_view(&self, key: &ResourceKey) -> Result<LockView> {
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.statements.view)))
            .bind(key.to_string())
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(map_err);
        // No table, or no row: nothing was ever locked here, or the table was lost with every
        // counter (the next grant's fence is 1).
        let nothing = || LockView::free(key.clone()).with_counter(Some(Fence::new(0))).with_waiters(Waiters::None);
        let row = match row {
            Ok(row) => row,
            Err(e) if table_missing(&e) => return Ok(nothing()),
            Err(e) => return Err(e),
        };
        let Some(row) = row else { return Ok(nothing()) };
        let view = palisade_core::spi::sql::lock_view_at(key, &row, map_err)?;
        let waiting: bool = row.try_get(5).map_err(map_err)?;
        Ok(view.with_waiters(if waiting { Waiters::Marked } else { Waiters::None }))
    }
}
