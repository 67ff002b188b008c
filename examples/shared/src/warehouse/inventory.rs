//! The warehouse's data, and one allocation done right (or, with [`Mode::Unfenced`], done the
//! the incident's naive way).
//!
//! **On PostgreSQL and SQLite** the data is in tables of its own, as an application's is:
//!
//! ```sql
//! CREATE TABLE inventory   (sku TEXT PRIMARY KEY, qty BIGINT NOT NULL CHECK (qty >= 0), fence BIGINT);
//! CREATE TABLE allocations (job TEXT NOT NULL, attempt TEXT NOT NULL, sku TEXT NOT NULL,
//!                           qty BIGINT NOT NULL, fence BIGINT, PRIMARY KEY (job, attempt));
//! ```
//!
//! A fenced allocation is one transaction of two statements: the fix's single-row statement
//! on the stock (the store's `update_row_fenced_in`: `UPDATE inventory SET qty = qty - n,
//! fence = f WHERE sku = s AND (fence IS NULL OR fence <= f)`), then the audit row, inserted
//! only if the job has none yet (fencing rule 3: the "already done?" check is in the write).
//! The update locks the stock row first, so a stale holder whose fence still passes (it woke
//! before the new holder wrote) and the new holder take turns, and the second finds the job
//! done. Unfenced, the same transaction decrements and audits blindly. Runs keep apart by a
//! scope in the key values (`RUN.SKU-0001`, `RUN.job-000000001`).
//!
//! **On other stores** (DynamoDB, memory) it keeps records in the store's key-value table, under
//! a prefix (`wh` for the commands, `sim/RUN` for a simulation): `PREFIX/inventory/SKU` (the
//! stock, decimal text), `PREFIX/done/JOB`, `PREFIX/audit/JOB/ATTEMPT`, one batch per allocation.
//!
//! Either way two audit rows for one job are a duplicate shipment.
//!
//! **Transfers** move stock between two SKUs under both their locks at once (`lock_all`). The
//! tables gain `transfers (job, attempt, side, sku, qty, fence, PRIMARY KEY (job, attempt,
//! side))`, one `out` and one `in` row per applied transfer; records gain
//! `PREFIX/transfer/JOB/ATTEMPT/out|in`. Fenced, a transfer is one write that every member's
//! fence must pass (the tables: both fenced single-row statements in one transaction; records:
//! one `apply_all` batch). Unfenced, it is the naive way: both levels read before the pause,
//! then written blindly as two writes, one per side. A transfer whose `out` and `in` rows
//! differ in number was applied on one side only.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use palisade::prelude::*;
use palisade::{DynFencedStore, Fence, FencedRow, GrantFence, Record};

use crate::sql::Db;

/// Whether writes go through the fence check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Check the fence and the "already done?" condition in the store, atomically (rules 1–3).
    Fenced,
    /// The incident's naive lock: check "done" before the pause, write blindly after it.
    Unfenced,
}

/// What one allocation attempt came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The stock was decremented and the job recorded.
    Applied,
    /// The store refused the write: a newer holder had already written.
    StaleFence {
        /// The fence the write carried.
        presented: Fence,
        /// The fence the store had accepted.
        current: Fence,
    },
    /// Somebody else had already applied this job.
    AlreadyDone,
    /// Not enough stock.
    InsufficientStock {
        /// What there is.
        available: i64,
    },
    /// The SKU has no stock record (run `setup` first).
    UnknownSku,
}

/// How many times a record-store allocation re-reads after a condition failed before giving
/// up. Each conflict means another writer landed in between; under a valid lock only a stale
/// holder can, so a handful is plenty.
const MAX_CONFLICT_RETRIES: u32 = 16;

/// The stock row as the stores' single-row helpers see it.
pub const INVENTORY: FencedRow<'static> = FencedRow { table: "inventory", key_column: "sku", fence_column: "fence" };

/// One allocation request: which SKU, how many, for which job, and a unique attempt id (the
/// audit row's key with the job, so a job applied twice shows up as two rows).
#[derive(Debug, Clone, Copy)]
pub struct Order<'a> {
    /// The SKU.
    pub sku: &'a str,
    /// The job id.
    pub job: &'a str,
    /// This attempt's id.
    pub attempt: &'a str,
    /// Units to allocate.
    pub qty: i64,
}

/// One transfer request: move `qty` units from one SKU to another, for a job.
#[derive(Debug, Clone, Copy)]
pub struct Transfer<'a> {
    /// The SKU the units leave.
    pub from: &'a str,
    /// The SKU they arrive at.
    pub to: &'a str,
    /// The job id (shared with allocations: one "done" per job).
    pub job: &'a str,
    /// This attempt's id.
    pub attempt: &'a str,
    /// Units to move.
    pub qty: i64,
}

/// The transfers' audit, per job: how many times each side was applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferSides {
    /// `out` rows (units taken from the source).
    pub out: usize,
    /// `in` rows (units added to the destination).
    pub into: usize,
}

/// A stock level and the fence that last wrote it.
#[derive(Debug, Clone, Copy)]
pub struct Stock {
    /// Units in stock.
    pub qty: i64,
    /// The fence of the last fenced write (`None`: never written under a fence).
    pub fence: Option<Fence>,
}

/// Where the warehouse keeps its data.
#[derive(Clone)]
enum Data {
    #[cfg(feature = "postgres")]
    Postgres(palisade::postgres::PostgresStore),
    Sqlite(palisade::sqlite::SqliteStore),
    Records {
        store: Arc<DynFencedStore>,
        prefix: String,
    },
}

/// A warehouse: its tables on PostgreSQL or SQLite, records in any other fenced store.
#[derive(Clone)]
pub struct Warehouse {
    data: Data,
    /// Separates runs in shared tables: `SCOPE.SKU`, `SCOPE.JOB` (empty: the names as given).
    scope: String,
}

impl Warehouse {
    /// Connects to the store at `url`, creating the warehouse's tables if missing. `scope`
    /// separates runs sharing a database (`""` for the commands, the run id for a simulation).
    pub async fn connect(url: &str, scope: &str) -> palisade::Result<Self> {
        if !Self::keeps_tables(url) {
            return Ok(Self::on_records(palisade::connect_store(url).await?, scope));
        }
        let data = if url.starts_with("sqlite:") {
            let store = palisade::sqlite::SqliteStore::connect(url).await?;
            Db::Sqlite(store.clone()).create_tables(&sql::TABLES).await?;
            Data::Sqlite(store)
        } else {
            Self::postgres(url).await?
        };
        Ok(Warehouse { data, scope: scope.to_string() })
    }

    /// Whether the store at `url` keeps the warehouse in tables of its own (PostgreSQL with the
    /// `postgres` feature, SQLite); any other keeps it as records ([`on_records`](Self::on_records)).
    pub fn keeps_tables(url: &str) -> bool {
        url.starts_with("sqlite:")
            || (cfg!(feature = "postgres") && (url.starts_with("postgres://") || url.starts_with("postgresql://")))
    }

    /// A warehouse kept as records in `store` (a client already connected: a store of your
    /// own, or one served from another process). `scope` as for [`connect`](Self::connect).
    pub fn on_records(store: Arc<DynFencedStore>, scope: &str) -> Self {
        let prefix = if scope.is_empty() { "wh".to_string() } else { format!("sim/{scope}") };
        Warehouse { data: Data::Records { store, prefix }, scope: scope.to_string() }
    }

    #[cfg(feature = "postgres")]
    async fn postgres(url: &str) -> palisade::Result<Data> {
        let store = palisade::postgres::PostgresStore::connect(url).await?;
        Db::Postgres(store.clone()).create_tables(&sql::TABLES).await?;
        Ok(Data::Postgres(store))
    }

    #[cfg(not(feature = "postgres"))]
    async fn postgres(url: &str) -> palisade::Result<Data> {
        // Unreachable (the caller checks the feature); kept so both builds have one shape.
        Err(Error::new(
            ErrorKind::Unsupported,
            "warehouse",
            format!("{}: the postgres feature is off", palisade::redact_url(url)),
        ))
    }

    /// The store's name, for reports (`postgres`, `sqlite`, `dynamodb`, `memory`).
    pub fn backend(&self) -> &'static str {
        match &self.data {
            #[cfg(feature = "postgres")]
            Data::Postgres(_) => "postgres",
            Data::Sqlite(_) => "sqlite",
            Data::Records { store, .. } => store.backend(),
        }
    }

    /// The lock resource for a SKU: `alloc:SKU` (validated, so a bad SKU is a typed error).
    pub fn resource(sku: &str) -> palisade::Result<ResourceKey> {
        ResourceKey::new("alloc", sku)
    }

    fn scoped(&self, name: &str) -> String {
        if self.scope.is_empty() { name.to_string() } else { format!("{}.{name}", self.scope) }
    }

    /// Takes the SKU's lock (`alloc:SCOPE.SKU` in a scoped warehouse) and checks the grant
    /// against where its writes keep their fence (fencing rule 5): the stock row on the tables,
    /// the store's watermark for records. A zero wait tries once (`Ok(None)` when held).
    pub async fn lock_checked(
        &self,
        locks: &Arc<DynLockService>,
        sku: &str,
        options: LockOptions,
    ) -> palisade::Result<Option<Lease<DynLockService>>> {
        // The scope's own SKU, as a simulation's workers and a transfer's `lock_all` name it.
        let row = self.scoped(sku);
        let key = Self::resource(&row)?;
        macro_rules! checked {
            ($source:expr) => {
                if options.wait.is_zero() {
                    locks.try_lock_checked($source, &key, options.ttl).await
                } else {
                    locks.lock_checked($source, &key, options).await.map(Some)
                }
            };
        }
        match &self.data {
            #[cfg(feature = "postgres")]
            Data::Postgres(store) => checked!(&store.row_watermark(&INVENTORY, row)),
            Data::Sqlite(store) => checked!(&store.row_watermark(&INVENTORY, row)),
            Data::Records { store, .. } => checked!(&**store),
        }
    }

    /// The SKU's stock, if it has a row.
    pub async fn stock(&self, sku: &str) -> palisade::Result<Option<Stock>> {
        match &self.data {
            #[cfg(feature = "postgres")]
            Data::Postgres(store) => postgres::stock(store, &self.scoped(sku)).await,
            Data::Sqlite(store) => sqlite::stock(store, &self.scoped(sku)).await,
            Data::Records { store, prefix } => Ok(store
                .read(&format!("{prefix}/inventory/{sku}"))
                .await?
                .map(|r| Stock { qty: parse_qty(&r), fence: r.fence })),
        }
    }

    /// Sets the stock level under a lease (fenced: a stale admin cannot overwrite newer stock).
    pub async fn set_stock(&self, lease: &Lease<DynLockService>, sku: &str, qty: i64) -> palisade::Result<()> {
        match &self.data {
            #[cfg(feature = "postgres")]
            Data::Postgres(store) => postgres::set_stock(store, lease, &self.scoped(sku), qty).await,
            Data::Sqlite(store) => sqlite::set_stock(store, lease, &self.scoped(sku), qty).await,
            Data::Records { store, prefix } => {
                store.write(lease, &WriteBatch::new().put(format!("{prefix}/inventory/{sku}"), qty.to_string())).await
            }
        }
    }

    /// Puts a SKU's initial stock with no lock, before any worker runs (simulation set-up only).
    pub async fn initial_stock(&self, sku: &str, qty: i64) -> palisade::Result<()> {
        match &self.data {
            #[cfg(feature = "postgres")]
            Data::Postgres(store) => postgres::initial_stock(store, &self.scoped(sku), qty).await,
            Data::Sqlite(store) => sqlite::initial_stock(store, &self.scoped(sku), qty).await,
            Data::Records { store, prefix } => {
                store.apply_unfenced(&WriteBatch::new().put(format!("{prefix}/inventory/{sku}"), qty.to_string())).await
            }
        }
    }

    /// Audit rows per job, of one SKU or of all (of this warehouse's scope).
    pub async fn audit(&self, sku: Option<&str>) -> palisade::Result<BTreeMap<String, usize>> {
        let job_prefix = self.scoped("");
        let sku = sku.map(|s| self.scoped(s));
        match &self.data {
            #[cfg(feature = "postgres")]
            Data::Postgres(store) => postgres::audit(store, &job_prefix, sku.as_deref()).await,
            Data::Sqlite(store) => sqlite::audit(store, &job_prefix, sku.as_deref()).await,
            Data::Records { store, prefix } => {
                let audit_prefix = format!("{prefix}/audit/");
                let wanted = sku.map(|s| format!("sku={s} "));
                let mut per_job = BTreeMap::new();
                for (key, record) in store.list(&audit_prefix).await? {
                    if let Some(wanted) = &wanted
                        && !record.value.starts_with(wanted.as_bytes())
                    {
                        continue;
                    }
                    *per_job.entry(job_of(&key, &audit_prefix).to_string()).or_insert(0) += 1;
                }
                Ok(per_job)
            }
        }
    }

    /// Allocates `n` units of `sku` for `job` while holding `lease`, pausing `pause` between the
    /// read and the write (the window in which a GC pause or SIGSTOP hits).
    ///
    /// Fenced: the write carries the lease's fence and, atomically with it, the "job not yet
    /// done" condition (fencing rule 3). An unfenced lease (Redlock) can only run
    /// `Mode::Unfenced`; `Mode::Fenced` refuses it.
    pub async fn allocate<S: LockService + ?Sized>(
        &self,
        lease: &Lease<S>,
        mode: Mode,
        order: &Order<'_>,
        pause: Duration,
    ) -> palisade::Result<Outcome> {
        let fence = lease.fence_if_any();
        if mode == Mode::Fenced && fence.is_none() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "warehouse",
                format!("the {} lock issues no fence: a fenced allocation needs one", lease.service().backend()),
            ));
        }
        let fence = if mode == Mode::Fenced { fence } else { None };
        let (sku, job) = (self.scoped(order.sku), self.scoped(order.job));
        let scoped = Order { sku: &sku, job: &job, ..*order };
        match &self.data {
            #[cfg(feature = "postgres")]
            Data::Postgres(store) => postgres::allocate(store, fence, &scoped, pause).await,
            Data::Sqlite(store) => sqlite::allocate(store, fence, &scoped, pause).await,
            Data::Records { store, prefix } => {
                let fence = fence.map(|f| GrantFence::new(f, lease.grant().grant_id()));
                allocate_records(store, prefix, lease.key(), fence, order, pause).await
            }
        }
    }
}

impl Warehouse {
    /// The attempts each job of `sku` was applied by, from the audit (of this scope): one per
    /// job in a warehouse that never ships twice.
    pub async fn applied_attempts(&self, sku: &str) -> palisade::Result<BTreeMap<String, Vec<String>>> {
        let job_prefix = self.scoped("");
        match &self.data {
            #[cfg(feature = "postgres")]
            Data::Postgres(store) => postgres::applied_attempts(store, &job_prefix, &self.scoped(sku)).await,
            Data::Sqlite(store) => sqlite::applied_attempts(store, &job_prefix, &self.scoped(sku)).await,
            Data::Records { store, prefix } => {
                let audit_prefix = format!("{prefix}/audit/");
                let wanted = format!("sku={sku} ");
                let mut per_job: BTreeMap<String, Vec<String>> = BTreeMap::new();
                for (key, record) in store.list(&audit_prefix).await? {
                    if !record.value.starts_with(wanted.as_bytes()) {
                        continue;
                    }
                    let rest = key.strip_prefix(&audit_prefix).unwrap_or(&key);
                    if let Some((job, attempt)) = rest.split_once('/') {
                        per_job.entry(job.to_string()).or_default().push(attempt.to_string());
                    }
                }
                Ok(per_job)
            }
        }
    }

    /// Units shipped: the quantities of every allocation's audit rows (of this scope).
    pub async fn shipped(&self) -> palisade::Result<i64> {
        let job_prefix = self.scoped("");
        match &self.data {
            #[cfg(feature = "postgres")]
            Data::Postgres(store) => postgres::shipped(store, &job_prefix).await,
            Data::Sqlite(store) => sqlite::shipped(store, &job_prefix).await,
            Data::Records { store, prefix } => Ok(store
                .list(&format!("{prefix}/audit/"))
                .await?
                .iter()
                .map(|(_, record)| audit_qty(&record.value))
                .sum()),
        }
    }

    /// The transfers' audit rows per job (of this scope): how often each side was applied.
    pub async fn transfers(&self) -> palisade::Result<BTreeMap<String, TransferSides>> {
        let job_prefix = self.scoped("");
        match &self.data {
            #[cfg(feature = "postgres")]
            Data::Postgres(store) => postgres::transfers(store, &job_prefix).await,
            Data::Sqlite(store) => sqlite::transfers(store, &job_prefix).await,
            Data::Records { store, prefix } => {
                let transfer_prefix = format!("{prefix}/transfer/");
                let mut per_job: BTreeMap<String, TransferSides> = BTreeMap::new();
                for (key, _) in store.list(&transfer_prefix).await? {
                    let sides = per_job.entry(job_of(&key, &transfer_prefix).to_string()).or_default();
                    if key.ends_with("/out") {
                        sides.out += 1;
                    } else {
                        sides.into += 1;
                    }
                }
                Ok(per_job)
            }
        }
    }

    /// Moves `transfer.qty` units from one SKU to the other while holding both locks (`locks`,
    /// from `lock_all` over the two SKUs' resources), pausing `pause` between the reads and
    /// the write.
    ///
    /// Fenced: one write that **every** member's fence must pass, with the "job not yet done"
    /// condition in it: a holder of the pair paused past its TTL is refused whole
    /// ([`Outcome::StaleFence`]) as soon as either SKU has a newer holder's write, and nothing
    /// of it lands. Unfenced: the naive way (both levels read before the pause, each side
    /// written blindly after it, as two writes).
    pub async fn transfer<S: LockService + ?Sized>(
        &self,
        locks: &MultiLease<S>,
        mode: Mode,
        transfer: &Transfer<'_>,
        pause: Duration,
    ) -> palisade::Result<Outcome> {
        if transfer.from == transfer.to {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "warehouse",
                format!("a transfer needs two different SKUs (got {} twice)", transfer.from),
            ));
        }
        // The SKUs' lock resources, as `lock_all` was given them (scoped in a simulation).
        let keys = [Self::resource(&self.scoped(transfer.from))?, Self::resource(&self.scoped(transfer.to))?];
        let member = |key: &ResourceKey| -> palisade::Result<Option<GrantFence>> {
            let lease = locks.lease(key).ok_or_else(|| {
                Error::new(ErrorKind::InvalidArgument, "warehouse", format!("the locks held do not include {key}"))
            })?;
            Ok(lease.fence_if_any().map(|f| GrantFence::new(f, lease.grant().grant_id())))
        };
        let (from_fence, to_fence) = (member(&keys[0])?, member(&keys[1])?);
        let fences = match (mode, from_fence, to_fence) {
            (Mode::Fenced, Some(from), Some(to)) => Some((from, to)),
            (Mode::Fenced, _, _) => {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    "warehouse",
                    "the lock issues no fence: a fenced transfer needs one per SKU",
                ));
            }
            (Mode::Unfenced, _, _) => None,
        };
        let (from, to, job) = (self.scoped(transfer.from), self.scoped(transfer.to), self.scoped(transfer.job));
        let scoped = Transfer { from: &from, to: &to, job: &job, ..*transfer };
        match &self.data {
            #[cfg(feature = "postgres")]
            Data::Postgres(store) => {
                postgres::transfer(store, fences.map(|(f, t)| (f.fence(), t.fence())), &scoped, pause).await
            }
            Data::Sqlite(store) => {
                sqlite::transfer(store, fences.map(|(f, t)| (f.fence(), t.fence())), &scoped, pause).await
            }
            Data::Records { store, prefix } => {
                let [from_key, to_key] = keys;
                let fences = fences.map(|(f, t)| [(from_key, f), (to_key, t)]);
                transfer_records(store, prefix, fences.as_ref().map(|f| f.as_slice()), transfer, pause).await
            }
        }
    }
}

/// The job of a record-store audit or transfer key listed under `prefix`
/// (`<prefix><job>/<rest>`).
fn job_of<'k>(key: &'k str, prefix: &str) -> &'k str {
    let rest = key.strip_prefix(prefix).unwrap_or(key);
    rest.split_once('/').map_or(rest, |(job, _)| job)
}

/// The quantity in a record-store audit value (`sku=S qty=N fence=F`).
fn audit_qty(value: &[u8]) -> i64 {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.split(' ').find_map(|part| part.strip_prefix("qty=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The tables' statements: PostgreSQL and SQLite read the same text (`$N` placeholders).
mod sql {
    pub const CREATE_INVENTORY: &str = "CREATE TABLE IF NOT EXISTS inventory (\
         sku TEXT PRIMARY KEY, qty BIGINT NOT NULL CHECK (qty >= 0), fence BIGINT)";
    pub const CREATE_ALLOCATIONS: &str = "CREATE TABLE IF NOT EXISTS allocations (\
         job TEXT NOT NULL, attempt TEXT NOT NULL, sku TEXT NOT NULL, qty BIGINT NOT NULL, fence BIGINT, \
         PRIMARY KEY (job, attempt))";
    /// The stock and whether the job has an audit row, in one statement.
    pub const READ: &str =
        "SELECT qty, (SELECT COUNT(*) FROM allocations WHERE job = $2) FROM inventory WHERE sku = $1";
    pub const STOCK: &str = "SELECT qty, fence FROM inventory WHERE sku = $1";
    /// The audit row, only if the job has none: the "already done?" check inside the write.
    pub const AUDIT_ONCE: &str = "INSERT INTO allocations (job, attempt, sku, qty, fence) \
         SELECT $1, $2, $3, $4, $5 WHERE NOT EXISTS (SELECT 1 FROM allocations WHERE job = $1)";
    pub const AUDIT: &str = "INSERT INTO allocations (job, attempt, sku, qty, fence) VALUES ($1, $2, $3, $4, $5)";
    pub const DECREMENT_BLIND: &str = "UPDATE inventory SET qty = qty - $2 WHERE sku = $1";
    pub const INITIAL_STOCK: &str = "INSERT INTO inventory (sku, qty, fence) VALUES ($1, $2, NULL) \
         ON CONFLICT (sku) DO UPDATE SET qty = excluded.qty, fence = NULL";
    pub const ENSURE_ROW: &str =
        "INSERT INTO inventory (sku, qty, fence) VALUES ($1, 0, NULL) ON CONFLICT (sku) DO NOTHING";
    pub const AUDIT_COUNTS: &str = "SELECT job, COUNT(*) FROM allocations \
         WHERE substr(job, 1, length($1)) = $1 AND ($2 IS NULL OR sku = $2) GROUP BY job";
    pub const AUDIT_ATTEMPTS: &str = "SELECT job, attempt FROM allocations \
         WHERE sku = $1 AND substr(job, 1, length($2)) = $2 ORDER BY job, attempt";
    pub const CREATE_TRANSFERS: &str = "CREATE TABLE IF NOT EXISTS transfers (\
         job TEXT NOT NULL, attempt TEXT NOT NULL, side TEXT NOT NULL, sku TEXT NOT NULL, qty BIGINT NOT NULL, \
         fence BIGINT, PRIMARY KEY (job, attempt, side))";
    pub const TABLES: [&str; 3] = [CREATE_INVENTORY, CREATE_ALLOCATIONS, CREATE_TRANSFERS];
    pub const SHIPPED: &str =
        "SELECT CAST(COALESCE(SUM(qty), 0) AS BIGINT) FROM allocations WHERE substr(job, 1, length($1)) = $1";
    /// Both levels and whether the job is done (as an allocation or a transfer), in one statement.
    pub const READ_PAIR: &str = "SELECT (SELECT qty FROM inventory WHERE sku = $1), \
         (SELECT qty FROM inventory WHERE sku = $2), \
         (SELECT COUNT(*) FROM allocations WHERE job = $3) + (SELECT COUNT(*) FROM transfers WHERE job = $3)";
    /// A side's row; the `out` one only if the job has no transfer row yet (fencing rule 3).
    pub const TRANSFER_ONCE: &str = "INSERT INTO transfers (job, attempt, side, sku, qty, fence) \
         SELECT $1, $2, 'out', $3, $4, $5 WHERE NOT EXISTS (SELECT 1 FROM transfers WHERE job = $1)";
    pub const TRANSFER_SIDE: &str =
        "INSERT INTO transfers (job, attempt, side, sku, qty, fence) VALUES ($1, $2, $6, $3, $4, $5)";
    /// The naive write: the level read before the pause, minus or plus the units, set blindly.
    pub const SET_BLIND: &str = "UPDATE inventory SET qty = $2 WHERE sku = $1";
    pub const TRANSFER_COUNTS: &str = "SELECT job, side, COUNT(*) FROM transfers \
         WHERE substr(job, 1, length($1)) = $1 GROUP BY job, side";
}

/// One module per SQL store, from the same text: the stores' transaction types differ, the
/// statements and the logic do not.
macro_rules! sql_tables {
    ($module:ident, $store:ty, $map_err:path) => {
        mod $module {
            use std::collections::BTreeMap;
            use std::time::Duration;

            use palisade::prelude::*;
            use palisade::{DynLockService, Fence};

            use super::{INVENTORY, Order, Outcome, Stock, StoreDb, Transfer, TransferSides, sql};
            // `store.begin()` on PostgreSQL (SQLite's store has it).
            #[cfg(feature = "postgres")]
            #[allow(unused_imports)]
            use crate::sql::PgBegin as _;

            pub(super) async fn initial_stock(store: &$store, sku: &str, qty: i64) -> palisade::Result<()> {
                sqlx::query(sql::INITIAL_STOCK).bind(sku).bind(qty).execute(store.pool()).await.map_err($map_err)?;
                Ok(())
            }

            pub(super) async fn stock(store: &$store, sku: &str) -> palisade::Result<Option<Stock>> {
                let row: Option<(i64, Option<i64>)> =
                    sqlx::query_as(sql::STOCK).bind(sku).fetch_optional(store.pool()).await.map_err($map_err)?;
                Ok(row.map(|(qty, fence)| Stock {
                    qty,
                    fence: fence.and_then(|f| u64::try_from(f).ok()).map(Fence::new),
                }))
            }

            pub(super) async fn set_stock(
                store: &$store,
                lease: &Lease<DynLockService>,
                sku: &str,
                qty: i64,
            ) -> palisade::Result<()> {
                let mut tx = store.begin().await?;
                sqlx::query(sql::ENSURE_ROW).bind(sku).execute(tx.conn()).await.map_err($map_err)?;
                store.update_row_fenced_in(tx.conn(), &INVENTORY, sku, lease, "qty = $3", |q| q.bind(qty)).await?;
                tx.commit().await
            }

            pub(super) async fn audit(
                store: &$store,
                job_prefix: &str,
                sku: Option<&str>,
            ) -> palisade::Result<BTreeMap<String, usize>> {
                let rows: Vec<(String, i64)> = sqlx::query_as(sql::AUDIT_COUNTS)
                    .bind(job_prefix)
                    .bind(sku)
                    .fetch_all(store.pool())
                    .await
                    .map_err($map_err)?;
                Ok(rows
                    .into_iter()
                    .map(|(job, n)| (job[job_prefix.len()..].to_string(), usize::try_from(n).unwrap_or(0)))
                    .collect())
            }

            pub(super) async fn applied_attempts(
                store: &$store,
                job_prefix: &str,
                sku: &str,
            ) -> palisade::Result<BTreeMap<String, Vec<String>>> {
                let rows: Vec<(String, String)> = sqlx::query_as(sql::AUDIT_ATTEMPTS)
                    .bind(sku)
                    .bind(job_prefix)
                    .fetch_all(store.pool())
                    .await
                    .map_err($map_err)?;
                let mut per_job: BTreeMap<String, Vec<String>> = BTreeMap::new();
                for (job, attempt) in rows {
                    per_job.entry(job[job_prefix.len()..].to_string()).or_default().push(attempt);
                }
                Ok(per_job)
            }

            /// One allocation: the read, the pause, then one transaction (fenced: the
            /// single-row statement and the audit row if the job has none).
            pub(super) async fn allocate(
                store: &$store,
                fence: Option<Fence>,
                order: &Order<'_>,
                pause: Duration,
            ) -> palisade::Result<Outcome> {
                let Order { sku, job, attempt, qty } = *order;
                let read: Option<(i64, i64)> = sqlx::query_as(sql::READ)
                    .bind(sku)
                    .bind(job)
                    .fetch_optional(store.pool())
                    .await
                    .map_err($map_err)?;
                let Some((available, audits)) = read else { return Ok(Outcome::UnknownSku) };
                if audits > 0 {
                    return Ok(Outcome::AlreadyDone);
                }
                if available < qty {
                    return Ok(Outcome::InsufficientStock { available });
                }
                tokio::time::sleep(pause).await;
                let fence_column = fence.and_then(|f| i64::try_from(f.get()).ok());
                let mut tx = store.begin().await?;
                // Fenced: the fix's single-row statement (a stale fence changes no row), then
                // the audit row only if the job has none. Unfenced: the same, blind.
                let decremented = match fence {
                    Some(fence) => {
                        store
                            .update_row_fenced_in(tx.conn(), &INVENTORY, sku, fence, "qty = qty - $3", |q| q.bind(qty))
                            .await
                    }
                    None => sqlx::query(sql::DECREMENT_BLIND)
                        .bind(sku)
                        .bind(qty)
                        .execute(tx.conn())
                        .await
                        .map(drop)
                        .map_err($map_err),
                };
                if let Err(e) = decremented {
                    drop(tx);
                    if let Some((presented, current)) = e.stale_fence_details() {
                        return Ok(Outcome::StaleFence { presented, current });
                    }
                    return short_or(stock(store, sku).await?, qty, e);
                }
                let audit = if fence.is_some() { sql::AUDIT_ONCE } else { sql::AUDIT };
                let audited = sqlx::query(audit)
                    .bind(job)
                    .bind(attempt)
                    .bind(sku)
                    .bind(qty)
                    .bind(fence_column)
                    .execute(tx.conn())
                    .await
                    .map_err($map_err)?
                    .rows_affected();
                if audited == 0 {
                    // Another holder applied the job first: undo our decrement.
                    drop(tx);
                    return Ok(Outcome::AlreadyDone);
                }
                tx.commit().await?;
                Ok(Outcome::Applied)
            }

            pub(super) async fn shipped(store: &$store, job_prefix: &str) -> palisade::Result<i64> {
                sqlx::query_scalar(sql::SHIPPED).bind(job_prefix).fetch_one(store.pool()).await.map_err($map_err)
            }

            pub(super) async fn transfers(
                store: &$store,
                job_prefix: &str,
            ) -> palisade::Result<BTreeMap<String, TransferSides>> {
                let rows: Vec<(String, String, i64)> = sqlx::query_as(sql::TRANSFER_COUNTS)
                    .bind(job_prefix)
                    .fetch_all(store.pool())
                    .await
                    .map_err($map_err)?;
                let mut per_job: BTreeMap<String, TransferSides> = BTreeMap::new();
                for (job, side, n) in rows {
                    let sides = per_job.entry(job[job_prefix.len()..].to_string()).or_default();
                    let n = usize::try_from(n).unwrap_or(0);
                    if side == "out" {
                        sides.out += n;
                    } else {
                        sides.into += n;
                    }
                }
                Ok(per_job)
            }

            /// One transfer: both levels and the job's state in one read, the pause, then
            /// (fenced) one transaction of both fenced single-row statements and the two audit
            /// rows, or (unfenced) one blind transaction per side.
            pub(super) async fn transfer(
                store: &$store,
                fences: Option<(Fence, Fence)>,
                t: &Transfer<'_>,
                pause: Duration,
            ) -> palisade::Result<Outcome> {
                let read: (Option<i64>, Option<i64>, i64) = sqlx::query_as(sql::READ_PAIR)
                    .bind(t.from)
                    .bind(t.to)
                    .bind(t.job)
                    .fetch_one(store.pool())
                    .await
                    .map_err($map_err)?;
                let (Some(from_qty), Some(to_qty), done) = read else { return Ok(Outcome::UnknownSku) };
                if done > 0 {
                    return Ok(Outcome::AlreadyDone);
                }
                if from_qty < t.qty {
                    return Ok(Outcome::InsufficientStock { available: from_qty });
                }
                tokio::time::sleep(pause).await;
                let Some((from_fence, to_fence)) = fences else {
                    // The naive way: each side its own blind write of the level read before the pause.
                    for (sku, level, side) in [(t.from, from_qty - t.qty, "out"), (t.to, to_qty + t.qty, "in")] {
                        let mut tx = store.begin().await?;
                        sqlx::query(sql::SET_BLIND).bind(sku).bind(level).execute(tx.conn()).await.map_err($map_err)?;
                        side_row(tx.conn(), t, sku, None, side).await?;
                        tx.commit().await?;
                    }
                    return Ok(Outcome::Applied);
                };
                let mut tx = store.begin().await?;
                // Rows locked in SKU order, whatever the direction: two transfers between the
                // same SKUs in opposite directions (a stale holder's and the new holder's) queue
                // on PostgreSQL instead of deadlocking.
                let mut sides = [(t.from, from_fence, "qty = qty - $3"), (t.to, to_fence, "qty = qty + $3")];
                sides.sort_by_key(|(sku, _, _)| *sku);
                for (sku, fence, set) in sides {
                    let written =
                        store.update_row_fenced_in(tx.conn(), &INVENTORY, sku, fence, set, |q| q.bind(t.qty)).await;
                    if let Err(e) = written {
                        drop(tx); // neither side lands
                        if let Some((presented, current)) = e.stale_fence_details() {
                            return Ok(Outcome::StaleFence { presented, current });
                        }
                        return short_or(stock(store, t.from).await?, t.qty, e);
                    }
                }
                let first = sqlx::query(sql::TRANSFER_ONCE)
                    .bind(t.job)
                    .bind(t.attempt)
                    .bind(t.from)
                    .bind(t.qty)
                    .bind(i64::try_from(from_fence.get()).ok())
                    .execute(tx.conn())
                    .await
                    .map_err($map_err)?
                    .rows_affected();
                if first == 0 {
                    drop(tx); // another holder applied the job first: undo both sides
                    return Ok(Outcome::AlreadyDone);
                }
                side_row(tx.conn(), t, t.to, Some(to_fence), "in").await?;
                tx.commit().await?;
                Ok(Outcome::Applied)
            }

            async fn side_row(
                conn: &mut <<$store as StoreDb>::Db as sqlx::Database>::Connection,
                t: &Transfer<'_>,
                sku: &str,
                fence: Option<Fence>,
                side: &str,
            ) -> palisade::Result<()> {
                sqlx::query(sql::TRANSFER_SIDE)
                    .bind(t.job)
                    .bind(t.attempt)
                    .bind(sku)
                    .bind(t.qty)
                    .bind(fence.and_then(|f| i64::try_from(f.get()).ok()))
                    .bind(side)
                    .execute(conn)
                    .await
                    .map_err($map_err)?;
                Ok(())
            }

            /// A decrement that failed for want of stock (the `qty >= 0` check) is an outcome,
            /// anything else the error it was.
            fn short_or(stock: Option<Stock>, qty: i64, e: palisade::Error) -> palisade::Result<Outcome> {
                match stock {
                    Some(Stock { qty: available, .. }) if available < qty => {
                        Ok(Outcome::InsufficientStock { available })
                    }
                    _ => Err(e),
                }
            }
        }
    };
}

/// The sqlx database of each SQL store, so the shared statements name its connection type.
trait StoreDb {
    type Db: sqlx::Database;
}

#[cfg(feature = "postgres")]
impl StoreDb for palisade::postgres::PostgresStore {
    type Db = sqlx::Postgres;
}

impl StoreDb for palisade::sqlite::SqliteStore {
    type Db = sqlx::Sqlite;
}

#[cfg(feature = "postgres")]
sql_tables!(postgres, palisade::postgres::PostgresStore, palisade::postgres::map_err);
sql_tables!(sqlite, palisade::sqlite::SqliteStore, palisade::sqlite::map_err);

/// The record-store allocation: read the stock and the done marker in one request, pause,
/// then one batch (fenced: with the stock's value and the job's absence as conditions).
async fn allocate_records(
    store: &Arc<DynFencedStore>,
    prefix: &str,
    resource: &ResourceKey,
    fence: Option<GrantFence>,
    order: &Order<'_>,
    pause: Duration,
) -> palisade::Result<Outcome> {
    let Order { sku, job, attempt, qty: n } = *order;
    let inventory_key = format!("{prefix}/inventory/{sku}");
    let done_key = format!("{prefix}/done/{job}");
    let audit_key = format!("{prefix}/audit/{job}/{attempt}");
    let fence_text = fence.map_or_else(|| "none".to_string(), |f| f.fence().to_string());
    let mut paused = false;
    for _ in 0..=MAX_CONFLICT_RETRIES {
        // The stock first: not the keys' order, so a store that answers in key order is caught.
        let mut read = store.read_many(&[&inventory_key, &done_key]).await?.into_iter();
        let (stock, done) = (read.next().flatten(), read.next().flatten());
        if done.is_some() {
            return Ok(Outcome::AlreadyDone);
        }
        let Some(record) = stock else {
            return Ok(Outcome::UnknownSku);
        };
        let available = parse_qty(&record);
        if available < n {
            return Ok(Outcome::InsufficientStock { available });
        }
        if !paused {
            paused = true;
            tokio::time::sleep(pause).await;
        }
        let audit_value = format!("sku={sku} qty={n} fence={fence_text}");
        let result = match fence {
            Some(fence) => {
                let batch = WriteBatch::new()
                    .check(inventory_key.clone(), Some(record.value.clone()))
                    .put(inventory_key.clone(), (available - n).to_string())
                    .create(done_key.clone(), attempt.as_bytes().to_vec())
                    .put(audit_key.clone(), audit_value.into_bytes());
                store.write_fenced(resource, fence, &batch).await
            }
            None => {
                let batch = WriteBatch::new()
                    .put(inventory_key.clone(), (available - n).to_string())
                    .put(done_key.clone(), attempt.as_bytes().to_vec())
                    .put(audit_key.clone(), audit_value.into_bytes());
                store.apply_unfenced(&batch).await
            }
        };
        match result {
            Ok(()) => return Ok(Outcome::Applied),
            Err(e) => {
                if let Some((presented, current)) = e.stale_fence_details() {
                    return Ok(Outcome::StaleFence { presented, current });
                }
                if e.kind() != ErrorKind::Conflict {
                    return Err(e);
                }
                // A stale holder's write landed between our read and our write (it woke up
                // before we wrote, so its fence still passed). Re-read: we will see its work,
                // or the stock it left.
            }
        }
    }
    Err(Error::new(
        ErrorKind::Conflict,
        "warehouse",
        format!("job {job}: stock of {sku} kept changing under the lock ({MAX_CONFLICT_RETRIES} retries)"),
    ))
}

/// The record-store transfer: both levels and the done marker in one read, the pause, then
/// (fenced) one `apply_all` batch under both SKUs' fences, with both levels as read and the
/// job's absence as conditions, or (unfenced) one blind batch per side.
async fn transfer_records(
    store: &Arc<DynFencedStore>,
    prefix: &str,
    fences: Option<&[(ResourceKey, GrantFence)]>,
    t: &Transfer<'_>,
    pause: Duration,
) -> palisade::Result<Outcome> {
    let (from_key, to_key) = (format!("{prefix}/inventory/{}", t.from), format!("{prefix}/inventory/{}", t.to));
    let done_key = format!("{prefix}/done/{}", t.job);
    let side_key = |side: &str| format!("{prefix}/transfer/{}/{}/{side}", t.job, t.attempt);
    let mut paused = false;
    for _ in 0..=MAX_CONFLICT_RETRIES {
        let mut read = store.read_many(&[&done_key, &from_key, &to_key]).await?.into_iter();
        let (done, from, to) = (read.next().flatten(), read.next().flatten(), read.next().flatten());
        if done.is_some() {
            return Ok(Outcome::AlreadyDone);
        }
        let (Some(from), Some(to)) = (from, to) else { return Ok(Outcome::UnknownSku) };
        let (from_qty, to_qty) = (parse_qty(&from), parse_qty(&to));
        if from_qty < t.qty {
            return Ok(Outcome::InsufficientStock { available: from_qty });
        }
        if !paused {
            paused = true;
            tokio::time::sleep(pause).await;
        }
        let row = |sku: &str| format!("sku={sku} qty={}", t.qty).into_bytes();
        let Some(fences) = fences else {
            // The naive way: each side its own blind write of the level read before the pause.
            store
                .apply_unfenced(
                    &WriteBatch::new()
                        .put(from_key.clone(), (from_qty - t.qty).to_string())
                        .put(done_key.clone(), t.attempt.as_bytes().to_vec())
                        .put(side_key("out"), row(t.from)),
                )
                .await?;
            store
                .apply_unfenced(
                    &WriteBatch::new().put(to_key.clone(), (to_qty + t.qty).to_string()).put(side_key("in"), row(t.to)),
                )
                .await?;
            return Ok(Outcome::Applied);
        };
        let batch = WriteBatch::new()
            .check(from_key.clone(), Some(from.value.clone()))
            .put(from_key.clone(), (from_qty - t.qty).to_string())
            .check(to_key.clone(), Some(to.value.clone()))
            .put(to_key.clone(), (to_qty + t.qty).to_string())
            .create(done_key.clone(), t.attempt.as_bytes().to_vec())
            .put(side_key("out"), row(t.from))
            .put(side_key("in"), row(t.to));
        match store.write_all_fenced(fences, &batch).await {
            Ok(()) => return Ok(Outcome::Applied),
            Err(e) => {
                if let Some((presented, current)) = e.stale_fence_details() {
                    return Ok(Outcome::StaleFence { presented, current });
                }
                if e.kind() != ErrorKind::Conflict {
                    return Err(e);
                }
                // A stale holder's write landed between our read and our write: re-read.
            }
        }
    }
    Err(Error::new(
        ErrorKind::Conflict,
        "warehouse",
        format!("transfer {}: stock kept changing under the locks ({MAX_CONFLICT_RETRIES} retries)", t.job),
    ))
}

fn parse_qty(record: &Record) -> i64 {
    std::str::from_utf8(&record.value).ok().and_then(|s| s.parse().ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

    use super::*;

    #[tokio::test]
    async fn warehouses_of_two_scopes_lock_their_own_skus() {
        // Two runs sharing one lock service and one store (a simulation's run id, a torture's
        // namespace): each SKU's lock is its scope's, as its rows and records are.
        let locks = palisade::connect_lock("memory://wh-scopes").await.unwrap();
        let a = Warehouse::connect("memory://wh-scopes", "a").await.unwrap();
        let b = Warehouse::connect("memory://wh-scopes", "b").await.unwrap();
        let ttl = LockOptions::ttl(Duration::from_secs(10));
        let held = a.lock_checked(&locks, "SKU-1", ttl).await.unwrap().expect("a's SKU-1 is free");
        assert_eq!(held.key(), &Warehouse::resource("a.SKU-1").unwrap());
        let other = b.lock_checked(&locks, "SKU-1", ttl).await.unwrap();
        assert!(other.is_some(), "b's SKU-1 is another SKU than a's, and free");
    }

    #[tokio::test]
    async fn applied_attempts_name_each_job_s_attempts() {
        let locks = palisade::connect_lock("memory://wh-attempts").await.unwrap();
        let wh = Warehouse::connect("memory://wh-attempts", "run").await.unwrap();
        wh.initial_stock("SKU-1", 10).await.unwrap();
        wh.initial_stock("SKU-2", 10).await.unwrap();
        let ttl = LockOptions::ttl(Duration::from_secs(10));
        let lease = wh.lock_checked(&locks, "SKU-1", ttl).await.unwrap().expect("free");
        for (job, attempt) in [("j1", "x"), ("j1", "y"), ("j2", "z")] {
            let order = Order { sku: "SKU-1", job, attempt, qty: 2 };
            wh.allocate(&lease, Mode::Fenced, &order, Duration::ZERO).await.unwrap();
        }
        let applied = wh.applied_attempts("SKU-1").await.unwrap();
        let expected: BTreeMap<String, Vec<String>> =
            [("j1".to_string(), vec!["x".to_string()]), ("j2".to_string(), vec!["z".to_string()])].into();
        assert_eq!(applied, expected);
        assert!(wh.applied_attempts("SKU-2").await.unwrap().is_empty());
        assert_eq!(wh.stock("SKU-1").await.unwrap().map(|s| s.qty), Some(6));
    }
}
