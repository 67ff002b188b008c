//! The PostgreSQL fenced store.

use std::sync::Arc;

use async_trait::async_trait;
use palisade_core::{
    Error, ErrorKind, Fence, FencedStore, GrantFence, GrantId, Record, ResourceKey, Result, WatermarkSource,
    WriteBatch, WriteOp, conflict_error, explain_refusal, storable_fence, validate_record_key,
};
use sqlx::postgres::{PgArguments, PgPoolOptions};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Postgres, Row};
use tracing::debug;

use crate::config::{PostgresConfig, quote_ident};
use crate::transaction::PgFencedTransaction;

pub(crate) const BACKEND: &str = "postgres";

/// Maps a sqlx error: pool and connection trouble is [`ErrorKind::Unavailable`] (retryable),
/// serialization failures and deadlocks too; everything else [`ErrorKind::Backend`].
pub fn map_err(e: sqlx::Error) -> Error {
    let kind = match &e {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) | sqlx::Error::Tls(_) => {
            ErrorKind::Unavailable
        }
        // 40001 serialization_failure, 40P01 deadlock_detected, 57P01 admin_shutdown.
        sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("40001" | "40P01" | "57P01")) => {
            ErrorKind::Unavailable
        }
        _ => ErrorKind::Backend,
    };
    Error::new(kind, BACKEND, "PostgreSQL operation failed").with_source(e)
}

/// A failed COMMIT whose reply never arrived may have committed: say so instead of guessing.
pub(crate) fn map_commit_err(e: sqlx::Error) -> Error {
    if matches!(e, sqlx::Error::Io(_) | sqlx::Error::Protocol(_)) {
        return Error::new(
            ErrorKind::OutcomeUnknown,
            BACKEND,
            "COMMIT was sent but not acknowledged; re-read before retrying",
        )
        .with_source(e)
        .with_retryable(false);
    }
    map_err(e)
}

#[derive(Debug)]
struct Statements {
    schema: String,
    raise_watermark: String,
    read_watermark: String,
    put: String,
    create: String,
    delete: String,
    read_for_update: String,
    read: String,
    list: String,
    claim_absent: String,
}

impl Statements {
    fn new(config: &PostgresConfig) -> Result<Self> {
        let f = quote_ident(&config.fences_table)?;
        let r = quote_ident(&config.records_table)?;
        Ok(Statements {
            schema: config.schema_sql()?,
            // Rule 2: higher, or equal from the grant that set it (or from any grant when the
            // row predates recorded grants); zero rows is a rejection.
            raise_watermark: format!(
                "INSERT INTO {f} (resource, fence, grant_id) VALUES ($1, $2, $3) \
                 ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence, grant_id = EXCLUDED.grant_id \
                 WHERE {f}.fence < EXCLUDED.fence OR ({f}.fence = EXCLUDED.fence \
                   AND ({f}.grant_id IS NULL OR {f}.grant_id = EXCLUDED.grant_id))"
            ),
            read_watermark: format!("SELECT fence, grant_id FROM {f} WHERE resource = $1"),
            put: format!(
                "INSERT INTO {r} (key, value, fence) VALUES ($1, $2, $3) \
                 ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, fence = EXCLUDED.fence"
            ),
            create: format!("INSERT INTO {r} (key, value, fence) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING"),
            delete: format!("DELETE FROM {r} WHERE key = $1"),
            read_for_update: format!("SELECT value FROM {r} WHERE key = $1 FOR UPDATE"),
            // A placeholder row for a "must be absent" check: the insert waits for any other
            // transaction's uncommitted row with this key and then conflicts with it, and once
            // in, blocks every other writer of the key until this transaction ends.
            claim_absent: format!(
                "INSERT INTO {r} (key, value, fence) VALUES ($1, ''::bytea, NULL) ON CONFLICT (key) DO NOTHING"
            ),
            read: format!("SELECT value, fence FROM {r} WHERE key = $1"),
            // `starts_with` keeps LIKE wildcards in the prefix literal.
            list: format!("SELECT key, value, fence FROM {r} WHERE starts_with(key, $1) ORDER BY key COLLATE \"C\""),
        })
    }
}

fn sql(s: &str) -> AssertSqlSafe<String> {
    // Identifiers are validated and quoted by `quote_ident`; values are always bound.
    AssertSqlSafe(s.to_string())
}

/// Where [`PostgresStore::update_row_fenced`] finds a row and its fence.
#[derive(Debug, Clone, Copy)]
pub struct FencedRow<'a> {
    /// Your table.
    pub table: &'a str,
    /// Its key column.
    pub key_column: &'a str,
    /// Its fence column (`BIGINT`).
    pub fence_column: &'a str,
}

/// The fence column of one row, read as a watermark: see [`PostgresStore::row_watermark`].
#[derive(Debug, Clone, Copy)]
pub struct RowWatermark<'a> {
    store: &'a PostgresStore,
    row: FencedRow<'a>,
    key: &'a str,
}

#[async_trait]
impl WatermarkSource for RowWatermark<'_> {
    fn source_name(&self) -> &'static str {
        BACKEND
    }

    /// The row's fence; the resource is the row, whatever `resource` the lock is taken on.
    async fn highest_fence(&self, _resource: &ResourceKey) -> Result<Option<Fence>> {
        Ok(self.store.row_fence(&self.row, self.key).await?.flatten())
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
    pub async fn connect(url: &str) -> Result<Self> {
        PostgresStore::open(PostgresConfig::new(url)).await
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
        let pool = PgPoolOptions::new()
            .max_connections(config.max_connections.max(1))
            .acquire_timeout(config.acquire_timeout)
            .connect(&config.url)
            .await
            .map_err(|e| {
                Error::new(ErrorKind::Unavailable, BACKEND, format!("cannot connect to {}", config.redacted_url()))
                    .with_source(e)
                    .with_retryable(true)
            })?;
        let store = PostgresStore { pool, statements: Arc::new(statements) };
        if config.migrate {
            store.migrate().await?;
        }
        debug!(url = %config.redacted_url(), "postgres fenced store connected");
        Ok(store)
    }

    /// Creates the watermark and record tables if they do not exist.
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

    /// Starts a transaction for your own statements under `fence` for `resource`.
    ///
    /// Behavior:
    /// - Its first statement checks and raises the watermark (and keeps the watermark row locked
    ///   until the transaction ends). If the fence is lower, the transaction is rolled back and
    ///   the result is [`ErrorKind::StaleFence`]; if it equals a watermark another grant set,
    ///   [`ErrorKind::DuplicateFence`] (fencing rule 2). None of your statements run.
    /// - Nothing is written unless you call [`PgFencedTransaction::commit`].
    pub async fn begin_fenced(&self, resource: &ResourceKey, fence: GrantFence) -> Result<PgFencedTransaction> {
        let fence_i64 = storable_fence(BACKEND, fence.fence())?;
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        if let Err(e) = raise_watermark(&mut tx, &self.statements, resource, fence, fence_i64).await {
            // This native path bypasses `FencedStoreExt`, so it counts its own rejections.
            if matches!(e.kind(), ErrorKind::StaleFence { .. } | ErrorKind::DuplicateFence { .. }) {
                palisade_core::metrics::record_fence_rejected(BACKEND);
            }
            return Err(e);
        }
        Ok(PgFencedTransaction::new(tx, resource.clone(), fence.fence()))
    }

    /// The seed's single-statement form, on a row of your own table that carries its own fence
    /// column:
    ///
    /// ```sql
    /// UPDATE {table} SET {set}, {fence_column} = $1
    ///   WHERE {key_column} = $2 AND ({fence_column} IS NULL OR {fence_column} <= $1)
    /// ```
    ///
    /// A row whose fence column is NULL has never been written under a fence: any fence may
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
    /// or the row does not exist ([`ErrorKind::InvalidArgument`]). Identifiers are validated and
    /// quoted; `set` is yours, so never build it from user input.
    pub async fn update_row_fenced<'q>(
        &self,
        row: &FencedRow<'_>,
        key: &'q str,
        fence: Fence,
        set: &str,
        bind: impl FnOnce(Query<'q, Postgres, PgArguments>) -> Query<'q, Postgres, PgArguments>,
    ) -> Result<()> {
        let FencedRow { table, key_column, fence_column } = *row;
        let (t, k, f) = (quote_ident(table)?, quote_ident(key_column)?, quote_ident(fence_column)?);
        let fence_i64 = storable_fence(BACKEND, fence)?;
        let update = format!("UPDATE {t} SET {set}, {f} = $1 WHERE {k} = $2 AND ({f} IS NULL OR {f} <= $1)");
        let rows = bind(sqlx::query(AssertSqlSafe(update)).bind(fence_i64).bind(key))
            .execute(&self.pool)
            .await
            .map_err(map_err)?
            .rows_affected();
        if rows > 0 {
            return Ok(());
        }
        match self.row_fence(row, key).await? {
            Some(current) => {
                palisade_core::metrics::record_fence_rejected(BACKEND);
                Err(Error::stale_fence(BACKEND, fence, current.unwrap_or_default()))
            }
            None => Err(Error::new(
                ErrorKind::InvalidArgument,
                BACKEND,
                format!("no row with {key_column} = {key:?} in {table}"),
            )),
        }
    }

    /// The fence column of `key`'s row: `None` if there is no such row, `Some(None)` if its
    /// fence is NULL.
    async fn row_fence(&self, row: &FencedRow<'_>, key: &str) -> Result<Option<Option<Fence>>> {
        let FencedRow { table, key_column, fence_column } = *row;
        let (t, k, f) = (quote_ident(table)?, quote_ident(key_column)?, quote_ident(fence_column)?);
        let current: Option<Option<i64>> =
            sqlx::query_scalar(AssertSqlSafe(format!("SELECT {f} FROM {t} WHERE {k} = $1")))
                .bind(key)
                .fetch_optional(&self.pool)
                .await
                .map_err(map_err)?;
        Ok(current.map(fence_from))
    }

    /// The fence on one row of your own table, as a
    /// [`WatermarkSource`](palisade_core::WatermarkSource) for
    /// [`lock_checked`](palisade_core::LockServiceExt::lock_checked): what to check a fresh
    /// grant against when that row is written with [`update_row_fenced`](Self::update_row_fenced),
    /// which never raises the store's watermark. One `SELECT` of the fence column per check; a
    /// missing row or a NULL fence reads as "never written under a fence".
    pub fn row_watermark<'a>(&'a self, row: &FencedRow<'a>, key: &'a str) -> RowWatermark<'a> {
        RowWatermark { store: self, row: *row, key }
    }

    async fn apply_batch(&self, fence: Option<(&ResourceKey, GrantFence)>, batch: &WriteBatch) -> Result<()> {
        batch.validate()?;
        let fence_i64 = match fence {
            Some((_, f)) => Some(storable_fence(BACKEND, f.fence())?),
            None => None,
        };
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        if let (Some((resource, f)), Some(fi)) = (fence, fence_i64) {
            raise_watermark(&mut tx, &self.statements, resource, f, fi).await?;
        }
        // Conditions see the state before the batch, so all checks run before any write.
        // On error `tx` is dropped, which rolls everything back: all or nothing.
        let is_check = |op: &&WriteOp| matches!(op, WriteOp::Check { .. });
        // Keys held by a "must be absent" placeholder row until a write of the batch replaces it.
        let mut claimed: Vec<&str> = Vec::new();
        for op in batch.ops().iter().filter(is_check).chain(batch.ops().iter().filter(|op| !is_check(op))) {
            match op {
                WriteOp::Check { key, expected: None } => {
                    let inserted = sqlx::query(sql(&self.statements.claim_absent))
                        .bind(key)
                        .execute(&mut *tx)
                        .await
                        .map_err(map_err)?
                        .rows_affected();
                    if inserted == 0 {
                        return Err(conflict_error(BACKEND, op));
                    }
                    claimed.push(key);
                }
                // Our own placeholder is not a conflict: the create takes its place.
                WriteOp::Create { key, value } if claimed.contains(&key.as_str()) => {
                    claimed.retain(|k| k != key);
                    let put = WriteOp::Put { key: key.clone(), value: value.clone() };
                    apply_op(&mut tx, &self.statements, &put, fence_i64).await?;
                }
                _ => {
                    claimed.retain(|k| *k != op.key());
                    apply_op(&mut tx, &self.statements, op, fence_i64).await?;
                }
            }
        }
        for key in claimed {
            sqlx::query(sql(&self.statements.delete)).bind(key).execute(&mut *tx).await.map_err(map_err)?;
        }
        tx.commit().await.map_err(map_commit_err)
    }
}

async fn raise_watermark(
    conn: &mut PgConnection,
    s: &Statements,
    resource: &ResourceKey,
    fence: GrantFence,
    fence_i64: i64,
) -> Result<()> {
    let changed = sqlx::query(sql(&s.raise_watermark))
        .bind(resource.to_string())
        .bind(fence_i64)
        .bind(fence.grant().as_bytes().as_slice())
        .execute(&mut *conn)
        .await
        .map_err(map_err)?
        .rows_affected();
    if changed == 1 {
        return Ok(());
    }
    let (current, grant): (i64, Option<Vec<u8>>) = sqlx::query_as(sql(&s.read_watermark))
        .bind(resource.to_string())
        .fetch_one(&mut *conn)
        .await
        .map_err(map_err)?;
    let current = fence_from(Some(current)).unwrap_or_default();
    Err(explain_refusal(BACKEND, resource, fence, current, grant.as_deref().and_then(GrantId::from_slice)))
}

async fn apply_op(conn: &mut PgConnection, s: &Statements, op: &WriteOp, fence: Option<i64>) -> Result<()> {
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
        // `expected: None` is claimed by `apply_batch` with a placeholder row (a `SELECT … FOR
        // UPDATE` locks nothing when the row is missing); this path checks a present value.
        WriteOp::Check { key, expected } => {
            let actual: Option<Vec<u8>> = sqlx::query_scalar(sql(&s.read_for_update))
                .bind(key)
                .fetch_optional(&mut *conn)
                .await
                .map_err(map_err)?;
            if actual.as_ref() != expected.as_ref() {
                return Err(conflict_error(BACKEND, op));
            }
        }
    }
    Ok(())
}

fn fence_from(v: Option<i64>) -> Option<Fence> {
    v.and_then(|v| u64::try_from(v).ok()).map(Fence::new)
}

#[async_trait]
impl FencedStore for PostgresStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn apply(&self, resource: &ResourceKey, fence: GrantFence, batch: &WriteBatch) -> Result<()> {
        self.apply_batch(Some((resource, fence)), batch).await
    }

    async fn apply_unfenced(&self, batch: &WriteBatch) -> Result<()> {
        self.apply_batch(None, batch).await
    }

    async fn watermark(&self, resource: &ResourceKey) -> Result<Option<Fence>> {
        let v: Option<i64> = sqlx::query_scalar(sql(&self.statements.read_watermark))
            .bind(resource.to_string())
            .fetch_optional(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(fence_from(v))
    }

    async fn read(&self, key: &str) -> Result<Option<Record>> {
        validate_record_key(key)?;
        let row =
            sqlx::query(sql(&self.statements.read)).bind(key).fetch_optional(&self.pool).await.map_err(map_err)?;
        row.map(|row| {
            Ok(Record { value: row.try_get(0).map_err(map_err)?, fence: fence_from(row.try_get(1).map_err(map_err)?) })
        })
        .transpose()
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Record)>> {
        let rows = sqlx::query(sql(&self.statements.list)).bind(prefix).fetch_all(&self.pool).await.map_err(map_err)?;
        rows.into_iter()
            .map(|row| {
                Ok((
                    row.try_get(0).map_err(map_err)?,
                    Record {
                        value: row.try_get(1).map_err(map_err)?,
                        fence: fence_from(row.try_get(2).map_err(map_err)?),
                    },
                ))
            })
            .collect()
    }
}
