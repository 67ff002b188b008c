//! The PostgreSQL fenced store.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use std::fmt;

use palisade_core::spi::sql;
use palisade_core::spi::{
    canonical_fences, conflict_error, explain_refusal, lock_not_live, storable_fence, validate_record_key,
};
use palisade_core::{
    Error, ErrorKind, Fence, Fenced, FencedRow, FencedStore, GrantFence, GrantId, InspectStore, Lease, Listing,
    LockService, MultiLease, Record, ResourceKey, Result, WatermarkSource, WatermarkView, WriteBatch, WriteOp,
};
use sqlx::postgres::{PgArguments, PgPoolOptions};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Postgres, Row};
use tracing::debug;

use crate::config::PostgresConfig;
use crate::db::{BACKEND, connect_error, map_commit_err, map_err, quote_ident};
use crate::lock_table::live_check_sql;
use crate::transaction::PgFencedTransaction;

#[derive(Debug)]
struct Statements {
    schema: String,
    /// The watermark and record tables' names, unquoted (what the catalogue shows).
    pub(crate) fences_table: String,
    pub(crate) records_table: String,
    /// The lock table a live-lock check reads, and the lock service on this store uses.
    locks_table: String,
    apply: String,
    /// `apply` under the live-lock check (`require_live_lock`): called only if the writer's
    /// lock row is live, after locking it `FOR KEY SHARE`.
    apply_held: Option<String>,
    read_watermark: String,
    /// `palisade inspect`'s listing of watermarks (`$1` prefix, `$2` how many at most).
    list_watermarks: String,
    read: String,
    read_many: String,
    list: String,
}

/// Bounds an open fenced transaction (`$7`, milliseconds as text; NULL: a statement in a
/// transaction of its own, nothing to bound): if its client goes silent for that long (frozen,
/// cut off), PostgreSQL ends its session, and with it the row locks it holds.
const IDLE_BOUND: &str = ", (SELECT set_config('idle_in_transaction_session_timeout', $7, true) WHERE $7 IS NOT NULL)";

impl Statements {
    fn new(config: &PostgresConfig) -> Result<Self> {
        let f = quote_ident(&config.fences_table)?;
        let r = quote_ident(&config.records_table)?;
        let apply = format!("{}($1, $2, $3, $4, $5, $6)", config.apply_function()?);
        let apply_held = match config.require_live_lock {
            // Refused: the lock row's fence and grant, to say why (a newer grant: StaleFence).
            true => Some(live_check_sql(&config.locks_table, &apply, IDLE_BOUND)?),
            false => None,
        };
        Ok(Statements {
            schema: config.schema_sql()?,
            fences_table: config.fences_table.clone(),
            records_table: config.records_table.clone(),
            locks_table: config.locks_table.clone(),
            apply: format!("SELECT {apply}{IDLE_BOUND}"),
            apply_held,
            read_watermark: format!("SELECT fence, grant_id FROM {f} WHERE resource = $1"),
            list_watermarks: format!(
                "SELECT resource, fence, grant_id FROM {f} WHERE starts_with(resource, $1) \
                 ORDER BY resource COLLATE \"C\" LIMIT $2"
            ),
            read: format!("SELECT value, fence FROM {r} WHERE key = $1"),
            read_many: format!("SELECT key, value, fence FROM {r} WHERE key = ANY($1)"),
            // `starts_with` keeps LIKE wildcards in the prefix literal.
            list: format!("SELECT key, value, fence FROM {r} WHERE starts_with(key, $1) ORDER BY key COLLATE \"C\""),
        })
    }
}

fn sql(s: &str) -> AssertSqlSafe<String> {
    // Identifiers are validated and quoted by `quote_ident`; values are always bound.
    AssertSqlSafe(s.to_string())
}

/// A value sqlx binds for the key column of your table (`i64`, `uuid::Uuid`, `&str`,
/// `String`, …): implemented for every such type.
pub trait RowKey<'q>:
    sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres> + Clone + Send + Sync + fmt::Debug + 'q
{
}

impl<'q, T> RowKey<'q> for T where
    T: sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres> + Clone + Send + Sync + fmt::Debug + 'q
{
}

/// The fence column of one row, read as a watermark: see [`PostgresStore::row_watermark`].
#[derive(Debug, Clone)]
pub struct RowWatermark<'a, K> {
    store: &'a PostgresStore,
    row: FencedRow<'a>,
    key: K,
}

#[async_trait]
impl<'a, K: RowKey<'a>> WatermarkSource for RowWatermark<'a, K> {
    fn source_name(&self) -> &'static str {
        BACKEND
    }

    /// The row's fence; the resource is the row, whatever `resource` the lock is taken on.
    async fn highest_fence(&self, _resource: &ResourceKey) -> Result<Option<Fence>> {
        let mut conn = self.store.pool.acquire().await.map_err(map_err)?;
        Ok(row_fence(&mut conn, &self.row, self.key.clone()).await?.flatten())
    }
}

/// A fenced store in a PostgreSQL database. Cheap to clone (a pool handle).
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
    statements: Arc<Statements>,
}

impl PostgresStore {
    /// Connects with default settings and creates the tables if missing.
    /// `url` may carry `?require_live_lock=true` ([`PostgresConfig::from_url`]).
    pub async fn connect(url: &str) -> Result<Self> {
        PostgresStore::open(PostgresConfig::from_url(url)?).await
    }

    /// Connects with explicit settings.
    pub async fn open(config: PostgresConfig) -> Result<Self> {
        if !(config.url.starts_with("postgres://") || config.url.starts_with("postgresql://")) {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                BACKEND,
                format!("not a PostgreSQL URL: {}", config.redacted_url()),
            ));
        }
        let statements = Statements::new(&config)?;
        let options = config.connect_options()?;
        let pool = PgPoolOptions::new()
            .max_connections(config.max_connections.max(1))
            .acquire_timeout(config.acquire_timeout)
            .connect_with(options)
            .await
            .map_err(|e| connect_error(e, &config.redacted_url()))?;
        let store = PostgresStore { pool, statements: Arc::new(statements) };
        if config.migrate {
            store.migrate().await?;
        }
        debug!(url = %config.redacted_url(), "postgres fenced store connected");
        Ok(store)
    }

    /// The store on a pool your application already has (default table names), creating its
    /// tables and batch function if missing. Your pool's size, timeouts and connection
    /// settings apply; the store's statements share its connections with yours.
    pub async fn from_pool(pool: PgPool) -> Result<Self> {
        PostgresStore::from_pool_with(pool, &PostgresConfig::new(String::new())).await
    }

    /// [`from_pool`](Self::from_pool) with the table names and `migrate` setting of `config`
    /// (its URL and pool settings are not used: the pool is yours).
    pub async fn from_pool_with(pool: PgPool, config: &PostgresConfig) -> Result<Self> {
        let store = PostgresStore { pool, statements: Arc::new(Statements::new(config)?) };
        if config.migrate {
            store.migrate().await?;
        }
        Ok(store)
    }

    /// Creates the watermark and record tables if they do not exist, and (re)creates the batch
    /// function that applies a record batch in one statement.
    ///
    /// Runs under a transaction-scoped advisory lock: `CREATE TABLE IF NOT EXISTS` is not safe
    /// against itself in concurrent sessions (two clients starting at once collide on the
    /// catalog's unique index).
    pub async fn migrate(&self) -> Result<()> {
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        sqlx::query("SELECT pg_advisory_xact_lock(7243010045)").execute(&mut *tx).await.map_err(map_err)?;
        sqlx::raw_sql(sql(&self.statements.schema)).execute(&mut *tx).await.map_err(map_err)?;
        tx.commit().await.map_err(map_err)
    }

    /// The connection pool, for your own reads and schema.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Starts a transaction for your own statements under `lease`'s fence.
    ///
    /// Behavior:
    /// - Its first statement checks and raises the watermark of the lease's resource (and keeps
    ///   the watermark row locked until the transaction ends). If the fence is lower, the
    ///   transaction is rolled back and the result is [`ErrorKind::StaleFence`]; if it equals a
    ///   watermark another grant set, [`ErrorKind::DuplicateFence`] (fencing rule 2). None of
    ///   your statements run.
    /// - Nothing is written unless you call [`PgFencedTransaction::commit`].
    /// - Only a fenced lease can be passed: a lease of an efficiency lock (Redlock) has no fence.
    /// - **Bounded**: if the transaction then sits idle (no statement running) for the lease's
    ///   TTL (at least 1 s), PostgreSQL ends its session (`idle_in_transaction_session_timeout`, set for this
    ///   transaction only) and nothing of it commits. A holder frozen or cut off inside it
    ///   therefore keeps the rows it locked (the watermark's, and under `require_live_lock` the
    ///   lock's) at most one TTL after its last statement. Keep statements flowing, or keep the
    ///   transaction shorter than the TTL.
    /// - While it is open the holder may [`extend`](palisade_core::Lease::extend) (and renew)
    ///   and even release its lease on another connection: the live-lock check's row lock does
    ///   not block them.
    ///
    /// Already in a transaction of your own? Use [`check_fence_in`](Self::check_fence_in).
    pub async fn begin_fenced<S>(&self, lease: &Lease<S>) -> Result<PgFencedTransaction>
    where
        S: LockService<Fencing = Fenced> + ?Sized,
    {
        self.begin(lease.key(), lease.grant_fence(), idle_bound(lease.ttl().get())).await
    }

    /// [`begin_fenced`](Self::begin_fenced) for a fence without its lease (handed over from
    /// another process, for example): the same checks, under `fence` for `resource`. Without
    /// the lease its TTL is unknown, so the idle bound is 30 s.
    pub async fn begin_with_fence(&self, resource: &ResourceKey, fence: GrantFence) -> Result<PgFencedTransaction> {
        self.begin(resource, fence, DEFAULT_IDLE_BOUND).await
    }

    /// [`begin_fenced`](Self::begin_fenced) for several resources held as one
    /// ([`MultiLease`](palisade_core::MultiLease)): the transaction's first statements check and
    /// raise **every** member's watermark, in canonical order, and keep each watermark row
    /// locked until it ends. One stale or duplicate fence refuses the whole transaction (rolled
    /// back, none of your statements run) with the error naming that member
    /// ([`Error::resource`](palisade_core::Error::resource)). Write each resource's rows under
    /// its own fence ([`PgFencedTransaction::fence_of`]), with
    /// [`update_row_fenced_in`](Self::update_row_fenced_in) on a [`FencedRow`] if they carry
    /// one. Bounded like `begin_fenced`, by the shortest member TTL.
    ///
    /// ```no_run
    /// # async fn f(store: &palisade_postgres::PostgresStore,
    /// #            both: &palisade_core::MultiLease<palisade_core::DynLockService>,
    /// #            from: &palisade_core::ResourceKey) -> palisade_core::Result<()> {
    /// use palisade_postgres::map_err;
    ///
    /// let mut tx = store.begin_fenced_all(both).await?;   // every member's fence, or nothing
    /// sqlx::query("UPDATE stock SET qty = qty - 5 WHERE sku = 'SKU-1'").execute(tx.conn()).await.map_err(map_err)?;
    /// sqlx::query("UPDATE stock SET qty = qty + 5 WHERE sku = 'SKU-2'").execute(tx.conn()).await.map_err(map_err)?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn begin_fenced_all<S>(&self, locks: &MultiLease<S>) -> Result<PgFencedTransaction>
    where
        S: LockService<Fencing = Fenced> + ?Sized,
    {
        let ttl = locks.leases().iter().map(|lease| lease.ttl().get()).min().unwrap_or(DEFAULT_IDLE_BOUND);
        let fences = canonical_fences(BACKEND, &locks.fences())?;
        self.begin_all(&fences, idle_bound(ttl)).await
    }

    async fn begin(
        &self,
        resource: &ResourceKey,
        fence: GrantFence,
        idle_bound: Duration,
    ) -> Result<PgFencedTransaction> {
        self.begin_all(&[(resource.clone(), fence)], idle_bound).await
    }

    /// A transaction whose first statements raise each watermark of `fences` (canonical order,
    /// not empty).
    async fn begin_all(
        &self,
        fences: &[(ResourceKey, GrantFence)],
        idle_bound: Duration,
    ) -> Result<PgFencedTransaction> {
        let Some(((first, first_fence), _)) = fences.split_first() else {
            return Err(Error::new(ErrorKind::InvalidArgument, BACKEND, "a fenced transaction needs a fence"));
        };
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        for (resource, fence) in fences {
            raise_watermark(&mut tx, &self.statements, resource, *fence, idle_bound).await?;
        }
        let rest = fences.iter().skip(1).map(|(r, f)| (r.clone(), f.fence())).collect();
        Ok(PgFencedTransaction::new(tx, (first.clone(), first_fence.fence()), rest))
    }

    /// The lock table this store's live-lock check reads (its config's `locks_table`).
    pub(crate) fn locks_table(&self) -> &str {
        &self.statements.locks_table
    }

    /// The watermark and record tables' names, unquoted.
    pub(crate) fn data_tables(&self) -> (&str, &str) {
        (&self.statements.fences_table, &self.statements.records_table)
    }

    /// Runs the fence check inside a transaction you already opened (a `sqlx::Transaction`
    /// passed as `&mut *tx`, or a connection in a transaction block): the watermark rule of
    /// [`begin_fenced`](Self::begin_fenced), as one statement on `conn`.
    ///
    /// Behavior:
    /// - Accepted: the resource's watermark is raised to the lease's fence and its row stays
    ///   locked until your transaction ends, so no other fence can be accepted for the resource
    ///   before you commit or roll back. Your commit makes your writes and the raise durable
    ///   together; your rollback undoes both.
    /// - Refused: [`ErrorKind::StaleFence`], [`ErrorKind::DuplicateFence`], or (with
    ///   `require_live_lock`) [`ErrorKind::NotHolder`], and your transaction is aborted, always
    ///   (any other error of the check too): every later statement fails and its commit writes
    ///   nothing. Roll it back. Inside a savepoint (a nested `sqlx` transaction) it is the
    ///   savepoint that is aborted: roll back the outer transaction too, or your other
    ///   statements commit without a fence check.
    /// - Bounded as [`begin_fenced`](Self::begin_fenced)'s: idle for the lease's TTL, the
    ///   transaction's session is ended by the server.
    /// - Run it before your writes (the earlier the row is locked, the less work a stale holder
    ///   wastes); it is correct anywhere before the commit.
    /// - Outside a transaction block `conn` runs it as a transaction of its own: the watermark
    ///   is raised and nothing protects your later statements. Open one first.
    ///
    /// ```no_run
    /// # async fn f(store: &palisade_postgres::PostgresStore,
    /// #            lease: &palisade_core::Lease<palisade_core::DynLockService>) -> palisade_core::Result<()> {
    /// use palisade_postgres::map_err;
    ///
    /// let mut tx = store.pool().begin().await.map_err(map_err)?;   // your transaction
    /// store.check_fence_in(&mut tx, lease).await?;
    /// sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 7")
    ///     .execute(&mut *tx).await.map_err(map_err)?;
    /// tx.commit().await.map_err(map_err)?;
    /// # Ok(()) }
    /// ```
    pub async fn check_fence_in<S>(&self, conn: &mut PgConnection, lease: &Lease<S>) -> Result<()>
    where
        S: LockService<Fencing = Fenced> + ?Sized,
    {
        raise_watermark(conn, &self.statements, lease.key(), lease.grant_fence(), idle_bound(lease.ttl().get())).await
    }

    /// The incident's single-statement form, on a row of your own table that carries its own fence
    /// column, in a transaction of its own:
    ///
    /// ```sql
    /// UPDATE {table} SET {set}, {fence_column} = $1
    ///   WHERE {key_column} = $2 AND ({fence_column} IS NULL OR {fence_column} <= $1)
    /// ```
    ///
    /// `fence` is the lease (`&lease`; a lease of an efficiency lock has no fence and does not
    /// compile) or a [`Fence`] handed over from its holder. `key` is any value sqlx binds for
    /// your key column (`i64`, `uuid::Uuid`, `&str`, …). A
    /// row whose fence column is NULL has never been written under a fence: any fence may
    /// write it. This form checks only the row's own fence: it does not raise the resource's
    /// watermark, so [`lock_checked`](palisade_core::LockServiceExt::lock_checked) against the
    /// store cannot see a regressed lock counter through it; check against the row instead,
    /// with [`row_watermark`](Self::row_watermark). Your row has no grant column either, so an
    /// equal fence from another grant (a counter that lost its tail, fencing rule 2) passes
    /// here: use [`begin_fenced`](Self::begin_fenced) when the lock service can lose part of
    /// its counter.
    ///
    /// `set` is your SQL fragment (placeholders from `$3` on, bound by `bind`). Zero rows means
    /// the row's fence is higher ([`ErrorKind::StaleFence`], with the row's fence as `current`)
    /// or the row does not exist ([`ErrorKind::InvalidArgument`]); either way nothing changed.
    /// Identifiers are validated and quoted; `set` is yours, so never build it from user input.
    pub async fn update_row_fenced<'q, K>(
        &self,
        row: &FencedRow<'_>,
        key: K,
        fence: impl Into<Fence> + Send,
        set: &str,
        bind: impl FnOnce(Query<'q, Postgres, PgArguments>) -> Query<'q, Postgres, PgArguments> + Send,
    ) -> Result<()>
    where
        K: RowKey<'q>,
    {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        update_row(&mut conn, row, key, fence.into(), set, bind).await
    }

    /// [`update_row_fenced`](Self::update_row_fenced) on `conn`, inside a transaction you
    /// already opened (`&mut *tx`): the update and your other statements commit together. A
    /// refusal leaves your transaction usable (the update changed no row); roll back or go
    /// on as your logic needs.
    pub async fn update_row_fenced_in<'q, K>(
        &self,
        conn: &mut PgConnection,
        row: &FencedRow<'_>,
        key: K,
        fence: impl Into<Fence> + Send,
        set: &str,
        bind: impl FnOnce(Query<'q, Postgres, PgArguments>) -> Query<'q, Postgres, PgArguments> + Send,
    ) -> Result<()>
    where
        K: RowKey<'q>,
    {
        update_row(conn, row, key, fence.into(), set, bind).await
    }

    /// The fence on one row of your own table, as a
    /// [`WatermarkSource`](palisade_core::WatermarkSource) for
    /// [`lock_checked`](palisade_core::LockServiceExt::lock_checked): what to check a fresh
    /// grant against when that row is written with [`update_row_fenced`](Self::update_row_fenced),
    /// which never raises the store's watermark. One `SELECT` of the fence column per check; a
    /// missing row or a NULL fence reads as "never written under a fence".
    pub fn row_watermark<'a, K>(&'a self, row: &FencedRow<'a>, key: K) -> RowWatermark<'a, K>
    where
        K: RowKey<'a>,
    {
        RowWatermark { store: self, row: *row, key }
    }

    /// One statement, one round trip: the batch function (see `schema_sql`) raises the
    /// watermark, checks, writes, or raises and undoes it all.
    async fn apply_batch(&self, fence: Option<(&ResourceKey, GrantFence)>, batch: &WriteBatch) -> Result<()> {
        batch.validate()?;
        call_apply(&self.pool, &self.statements, fence, batch.ops(), None).await
    }

    /// A transaction of one call of the batch function per resource, in canonical order: the
    /// watermark rule alone for each but the last, the last with the operations. Each call
    /// locks its watermark row, so two writes over overlapping sets queue in the same order.
    async fn apply_batch_all(&self, fences: &[(ResourceKey, GrantFence)], batch: &WriteBatch) -> Result<()> {
        batch.validate()?;
        let fences = canonical_fences(BACKEND, fences)?;
        // `canonical_fences` refused an empty set.
        let Some(((last, last_fence), rest)) = fences.split_last() else { return Ok(()) };
        if rest.is_empty() {
            return self.apply_batch(Some((last, *last_fence)), batch).await;
        }
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        for (resource, fence) in rest {
            call_apply(&mut *tx, &self.statements, Some((resource, *fence)), &[], Some(MULTI_WRITE_IDLE_BOUND)).await?;
        }
        call_apply(&mut *tx, &self.statements, Some((last, *last_fence)), batch.ops(), Some(MULTI_WRITE_IDLE_BOUND))
            .await?;
        // A reply lost on the way may have committed.
        tx.commit().await.map_err(map_commit_err)
    }
}

/// Calls the batch function with `ops` (none: only the watermark rule) on `exec`: on the pool
/// (`idle_bound` None) the call is a transaction of its own; in an open transaction
/// (`idle_bound` Some) one statement of it, which also bounds how long the transaction may
/// then sit idle (see `IDLE_BOUND`).
async fn call_apply<'c, E>(
    exec: E,
    s: &Statements,
    fence: Option<(&ResourceKey, GrantFence)>,
    ops: &[WriteOp],
    idle_bound: Option<Duration>,
) -> Result<()>
where
    E: sqlx::Executor<'c, Database = Postgres>,
{
    let fence_i64 = match fence {
        Some((_, f)) => Some(storable_fence(BACKEND, f.fence())?),
        None => None,
    };
    let (kinds, keys, values) = encode_ops(ops);
    let held = s.apply_held.as_deref().filter(|_| fence.is_some());
    let called = sqlx::query(sql(held.unwrap_or(&s.apply)))
        .bind(fence.map(|(resource, _)| resource.to_string()))
        .bind(fence_i64)
        .bind(fence.map(|(_, f)| f.grant().as_bytes().to_vec()))
        .bind(&kinds)
        .bind(&keys)
        .bind(&values)
        .bind(idle_bound.map(|d| d.as_millis().clamp(1, i64::MAX as u128).to_string()))
        .fetch_one(exec)
        .await;
    let e = match called {
        Ok(row) if held.is_some() => {
            let applied: i64 = row.try_get(0).map_err(map_err)?;
            if applied > 0 {
                return Ok(());
            }
            // The live-lock check found no live lock of this grant, and nothing ran.
            let lock_fence: Option<i64> = row.try_get(1).map_err(map_err)?;
            let lock_grant: Option<Vec<u8>> = row.try_get(2).map_err(map_err)?;
            let lock =
                sql::fence_from_column(lock_fence).map(|f| (f, lock_grant.as_deref().and_then(GrantId::from_slice)));
            return Err(lock_not_live(BACKEND, "this database's lock table", fence, lock));
        }
        Ok(_) => return Ok(()),
        Err(e) => e,
    };
    let raised = match &e {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("PF001") => Some(Ok(db.message().to_string())),
            Some("PF002") => Some(Err(db.message().to_string())),
            _ => None,
        },
        _ => None,
    };
    match (raised, fence) {
        (Some(Ok(current)), Some((resource, f))) => {
            let (current, grant) = decode_refusal(&current);
            Err(explain_refusal(BACKEND, resource, f, current, grant))
        }
        (Some(Err(index)), _) => match failed_check(&index, ops) {
            Some(op) => Err(conflict_error(BACKEND, op)),
            None => Err(map_err(e)),
        },
        // Its own transaction: a reply lost on the way may have committed.
        _ if idle_bound.is_none() => Err(map_commit_err(e)),
        _ => Err(map_err(e)),
    }
}

/// A batch as the apply function takes it: parallel arrays of op kinds (1 put, 2 create,
/// 3 delete, 4 check that the key holds the value, 5 check that it is absent), keys and values
/// (empty where the op has none).
pub fn encode_ops(ops: &[WriteOp]) -> (Vec<i16>, Vec<&str>, Vec<&[u8]>) {
    let (mut kinds, mut keys, mut values) =
        (Vec::with_capacity(ops.len()), Vec::with_capacity(ops.len()), Vec::with_capacity(ops.len()));
    for op in ops {
        let (kind, value): (i16, &[u8]) = match op {
            WriteOp::Put { value, .. } => (1, value),
            WriteOp::Create { value, .. } => (2, value),
            WriteOp::Delete { .. } => (3, &[]),
            WriteOp::Check { expected: Some(value), .. } => (4, value),
            WriteOp::Check { expected: None, .. } => (5, &[]),
        };
        kinds.push(kind);
        keys.push(op.key());
        values.push(value);
    }
    (kinds, keys, values)
}

/// The watermark that a refusal (`PF001`, message `<fence> <grant hex>` or `<fence> -`) names.
/// A message that is not of that form reads as fence 0 and no grant: the refusal still stands,
/// only its explanation is poorer.
pub fn decode_refusal(message: &str) -> (Fence, Option<GrantId>) {
    let (fence_text, grant_text) = message.split_once(' ').unwrap_or((message, "-"));
    let current = fence_text.parse::<i64>().ok().and_then(|v| sql::fence_from_column(Some(v))).unwrap_or_default();
    (current, decode_hex(grant_text).as_deref().and_then(GrantId::from_slice))
}

/// The op whose check failed (`PF002`, message: its 1-based index), if the message names one
/// of `ops`.
pub fn failed_check<'a>(message: &str, ops: &'a [WriteOp]) -> Option<&'a WriteOp> {
    message.parse::<usize>().ok().and_then(|i| ops.get(i.checked_sub(1)?))
}

/// The single-row fenced update on `conn`, and on zero rows the reason (stale or missing).
async fn update_row<'q, K: RowKey<'q>>(
    conn: &mut PgConnection,
    row: &FencedRow<'_>,
    key: K,
    fence: Fence,
    set: &str,
    bind: impl FnOnce(Query<'q, Postgres, PgArguments>) -> Query<'q, Postgres, PgArguments> + Send,
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

/// The fence column of `key`'s row: `None` if there is no such row, `Some(None)` if its fence
/// is NULL.
async fn row_fence<'q, K: RowKey<'q>>(
    conn: &mut PgConnection,
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

/// Lower-case hex (as PostgreSQL's `encode(…, 'hex')` writes it) to bytes; `None` for `-` or
/// anything malformed.
fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

/// Checks and raises the watermark as the first statement of `conn`'s transaction (the
/// watermark row, and under `require_live_lock` the lock row, stay locked until it ends), and
/// bounds how long the transaction may then sit idle to `idle_bound`.
///
/// A refusal always aborts the transaction: a raised refusal aborts it by itself, and a
/// live-lock refusal (answered as a row, so that it can say why) is followed by a statement
/// that raises, so that no caller can go on to commit writes that no fence check covers.
async fn raise_watermark(
    conn: &mut PgConnection,
    s: &Statements,
    resource: &ResourceKey,
    fence: GrantFence,
    idle_bound: Duration,
) -> Result<()> {
    let checked = call_apply(&mut *conn, s, Some((resource, fence)), &[], Some(idle_bound)).await;
    if let Err(e) = &checked {
        // These native paths bypass `FencedStoreExt`, so they count their own rejections.
        if matches!(e.kind(), ErrorKind::StaleFence { .. } | ErrorKind::DuplicateFence { .. } | ErrorKind::NotHolder) {
            palisade_core::metrics::record_fence_rejected(BACKEND);
        }
        // Whatever failed (a refusal, a reply that could not be read), nothing may commit
        // unchecked. Its own error is the point: the transaction is aborted (or already was).
        let _ = sqlx::raw_sql(sql(ABORT)).execute(&mut *conn).await;
    }
    checked
}

/// A statement that fails on purpose, to abort the transaction it runs in.
const ABORT: &str =
    "DO $$BEGIN RAISE EXCEPTION 'fence check refused: this transaction is aborted' USING ERRCODE = 'PF003'; END$$";

/// How long a fenced transaction may sit idle when its lease's TTL is not known (a fence
/// handed over without its lease): the default TTL of the examples and the README.
pub(crate) const DEFAULT_IDLE_BOUND: Duration = Duration::from_secs(30);

/// How long a multi-resource write's transaction may sit idle: its statements follow one
/// another at once, so only a frozen or cut-off writer idles, and the watermark rows it
/// locked must not stall other writers of those resources for long.
const MULTI_WRITE_IDLE_BOUND: Duration = Duration::from_secs(2);

/// How long a fenced transaction under a lease of `ttl` may sit idle: the TTL, so that a
/// frozen holder keeps its rows at most one TTL past its last statement, but never under a
/// second (a sub-second TTL would end transactions between two ordinary statements).
fn idle_bound(ttl: Duration) -> Duration {
    ttl.max(Duration::from_secs(1))
}

#[async_trait]
impl FencedStore for PostgresStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// With [`PostgresConfig::require_live_lock`].
    fn requires_live_lock(&self) -> bool {
        self.statements.apply_held.is_some()
    }

    async fn apply(&self, resource: &ResourceKey, fence: GrantFence, batch: &WriteBatch) -> Result<()> {
        self.apply_batch(Some((resource, fence)), batch).await
    }

    /// One transaction: a call of the batch function per resource (see `apply_batch_all`),
    /// `BEGIN` and `COMMIT` included, N + 2 round trips for N resources; one resource is
    /// [`apply`](FencedStore::apply)'s one round trip.
    async fn apply_all(&self, fences: &[(ResourceKey, GrantFence)], batch: &WriteBatch) -> Result<()> {
        self.apply_batch_all(fences, batch).await
    }

    async fn apply_unfenced(&self, batch: &WriteBatch) -> Result<()> {
        self.apply_batch(None, batch).await
    }

    async fn watermark(&self, resource: &ResourceKey) -> Result<Option<Fence>> {
        sql::read_watermark(&self.pool, &self.statements.read_watermark, resource, map_err).await
    }

    async fn read(&self, key: &str) -> Result<Option<Record>> {
        if palisade_core::spi::planted_bug("postgres-store-serves-stale-reads") {
            return planted::cached_read(key, sql::read_record(&self.pool, &self.statements.read, key, map_err)).await;
        }
        sql::read_record(&self.pool, &self.statements.read, key, map_err).await
    }

    /// One statement for every key.
    async fn read_many(&self, keys: &[&str]) -> Result<Vec<Option<Record>>> {
        for key in keys {
            validate_record_key(key)?;
        }
        let rows =
            sqlx::query(sql(&self.statements.read_many)).bind(keys).fetch_all(&self.pool).await.map_err(map_err)?;
        let mut found = std::collections::HashMap::with_capacity(rows.len());
        for row in rows {
            let key: String = row.try_get(0).map_err(map_err)?;
            let record = sql::record_at(&row, 1, map_err)?;
            found.insert(key, record);
        }
        Ok(keys.iter().map(|k| found.get(*k).cloned()).collect())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Record)>> {
        sql::list_records(&self.pool, &self.statements.list, prefix, map_err).await
    }
}

/// `palisade inspect`'s view of the watermark table: reads only.
#[async_trait]
impl InspectStore for PostgresStore {
    async fn watermarks(&self, prefix: &str) -> Result<Listing<(ResourceKey, WatermarkView)>> {
        match sql::list_watermarks(&self.pool, &self.statements.list_watermarks, prefix, map_err).await {
            Err(e) if crate::db::undefined_table(&e) => Ok(Listing::of(Vec::new())),
            other => other,
        }
    }

    async fn watermark_view(&self, resource: &ResourceKey) -> Result<Option<WatermarkView>> {
        match sql::watermark_view(&self.pool, &self.statements.read_watermark, resource, map_err).await {
            Err(e) if crate::db::undefined_table(&e) => Ok(None),
            other => other,
        }
    }

    async fn records(&self, prefix: &str) -> Result<Vec<(String, Record)>> {
        match self.list(prefix).await {
            Err(e) if crate::db::undefined_table(&e) => Ok(Vec::new()),
            other => other,
        }
    }

    async fn record(&self, name: &str) -> Result<Option<Record>> {
        match self.read(name).await {
            Err(e) if crate::db::undefined_table(&e) => Ok(None),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal's message names the watermark; a grant only from plain hex (found by
    /// fuzz/postgres_replies: `u8::from_str_radix` also takes a sign, so `+f` read as 0x0f).
    #[test]
    fn refusals_decode_only_well_formed_grants() {
        let grant = GrantId::from_bytes([0xab; 16]);
        assert_eq!(decode_refusal(&format!("42 {}", "ab".repeat(16))), (Fence::new(42), Some(grant)));
        assert_eq!(decode_refusal("42 -"), (Fence::new(42), None));
        assert_eq!(decode_refusal(&format!("42 {}", "+f".repeat(16))), (Fence::new(42), None));
        assert_eq!(decode_refusal("not a message"), (Fence::default(), None));
    }
}

/// Planted bug (tests only, `postgres-store-serves-stale-reads`): a read cache in front of the
/// store that keeps an answer for a second, as a cache or a lagging replica would, so a read
/// after another process's accepted write can return the value before it.
mod planted {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use palisade_core::{Record, Result};

    type Cache = Mutex<HashMap<String, (Instant, Option<Record>)>>;

    pub(super) async fn cached_read(
        key: &str,
        read: impl Future<Output = Result<Option<Record>>>,
    ) -> Result<Option<Record>> {
        static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
        let cache = CACHE.get_or_init(Cache::default);
        let hit = cache
            .lock()
            .ok()
            .and_then(|c| c.get(key).filter(|(at, _)| at.elapsed() < Duration::from_secs(1)).map(|(_, r)| r.clone()));
        if let Some(record) = hit {
            return Ok(record);
        }
        let record = read.await?;
        if let Ok(mut c) = cache.lock() {
            c.insert(key.to_string(), (Instant::now(), record.clone()));
        }
        Ok(record)
    }
}
