//! # Invoice numbering: gap-free numbers per tenant, never one number twice
//!
//! ```sh
//! cargo run --example invoice-numbering                      # embedded default (SQLite)
//! cargo run --features redis,postgres,palisade-examples/postgres --example invoice-numbering -- --lock redis://… --store postgres://…
//! ```
//!
//! **What goes wrong without a fence.** Invoice numbers must be consecutive per tenant (tax law in
//! many countries). A worker locks the tenant, reads the next number, and writes the invoice and
//! the incremented counter. If it freezes between the read and the write, its lock expires, a
//! second worker reads the *same* next number and issues it; then the first wakes and issues it
//! again: two invoices with one number, or a counter that went backwards.
//!
//! **How this example prevents it.** The application's data is in tables of its own, on SQLite
//! or PostgreSQL (`--store`; other stores are refused, exit 2):
//!
//! ```sql
//! CREATE TABLE invoice_counters (tenant TEXT PRIMARY KEY, next_number BIGINT NOT NULL);
//! CREATE TABLE invoices (tenant TEXT NOT NULL, number BIGINT NOT NULL, order_id TEXT NOT NULL,
//!                        fence BIGINT NOT NULL, PRIMARY KEY (tenant, number));
//! ```
//!
//! - The number comes from the counter row, not from the fence (fences may have gaps; the
//!   counter does not).
//! - The worker opens **its own transaction** and runs the store's fence check in it first
//!   (`store.check_fence_in(tx.conn(), &lease)`), then advances the counter only if it is still
//!   the number it read, and inserts the invoice. A frozen worker wakes with a lower fence than
//!   the worker that issued a number after it: the check refuses it with `StaleFence`, and the
//!   rollback leaves no invoice and no counter change. Its order goes back to the queue and
//!   gets the next free number.
//! - Accepted, the check keeps the lock's watermark row locked until the commit, so no newer
//!   holder's transaction interleaves with this one.
//!
//! Orders 5 and 18 freeze their first worker for 2 × TTL + 50 ms, and on until another worker
//! has issued the number it read (at most 60 s more): the incident's order of events, whatever
//! the machine's load. A frozen worker that woke first would find its fence still the newest and
//! issue the number itself; the newer holder would then find the counter moved and read again.
//! A worker freezes only where another can take over: with `--workers` above 1, and while
//! another order of its tenant waits for a number.

use palisade_examples::{common, sql::Db, with_db};

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use palisade::prelude::*;
use serde_json::json;
use tokio::sync::Mutex;

/// Gap-free invoice numbers under a fenced lock.
#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    common: common::Common,
    /// Invoices per tenant.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    invoices: u64,
    /// Concurrent workers.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    workers: u64,
}

const TENANTS: [&str; 2] = ["acme", "globex"];
/// Orders whose first worker freezes between reading the counter and writing the invoice.
const FROZEN_ORDERS: [u64; 2] = [5, 18];
/// The longest a frozen worker stays frozen, past its pause, waiting for another worker to issue
/// the number it read (the lock's own wait is 60 s).
const TAKEOVER_WAIT: Duration = Duration::from_secs(60);

/// The application's tables and statements (PostgreSQL and SQLite read the same text).
mod tables {
    pub const CREATE: [&str; 2] = [
        "CREATE TABLE IF NOT EXISTS invoice_counters (tenant TEXT PRIMARY KEY, next_number BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS invoices (tenant TEXT NOT NULL, number BIGINT NOT NULL, \
         order_id TEXT NOT NULL, fence BIGINT NOT NULL, PRIMARY KEY (tenant, number))",
    ];
    pub const OPEN_TENANT: &str = "INSERT INTO invoice_counters (tenant, next_number) VALUES ($1, 1)";
    pub const NEXT: &str = "SELECT next_number FROM invoice_counters WHERE tenant = $1";
    /// Advances the counter only from the number the worker read.
    pub const ADVANCE: &str =
        "UPDATE invoice_counters SET next_number = next_number + 1 WHERE tenant = $1 AND next_number = $2";
    pub const INSERT: &str = "INSERT INTO invoices (tenant, number, order_id, fence) VALUES ($1, $2, $3, $4)";
    pub const LIST: &str = "SELECT number, order_id FROM invoices WHERE tenant = $1";
}

/// What one attempt at an invoice came to.
enum Attempt {
    Issued(u64),
    /// The fence check refused the worker: a newer holder issued a number meanwhile.
    Stale,
    /// The counter moved since it was read (a stale holder woke and wrote before the new
    /// holder did, so its fence still passed): read again.
    CounterMoved,
}

struct Books {
    db: Db,
    run: String,
    ttl: Duration,
    pause: Duration,
    stale_refused: AtomicU64,
    /// Workers that froze (each is refused once another has issued its number).
    frozen: AtomicU64,
    /// Each tenant's orders not yet issued (in `TENANTS` order).
    pending: [AtomicU64; 2],
}

impl Books {
    /// The tenant's key in the shared tables (runs against one server keep apart).
    fn tenant(&self, tenant: &str) -> String {
        format!("{}.{tenant}", self.run)
    }

    /// `tenant`'s orders not yet issued.
    fn pending(&self, tenant: &str) -> &AtomicU64 {
        &self.pending[TENANTS.iter().position(|t| *t == tenant).unwrap_or(0)]
    }

    /// Issues one invoice for `order`; `Ok(None)` if the write was refused (requeue it).
    async fn issue(
        &self,
        locks: &Arc<DynLockService>,
        tenant: &str,
        order: &str,
        freeze: bool,
    ) -> palisade::Result<Option<u64>> {
        let lease = locks
            .lock(
                &ResourceKey::new("invoice", self.tenant(tenant))?,
                LockOptions::ttl(self.ttl).wait(Duration::from_secs(60)),
            )
            .await?;
        let attempt = self.write_invoice(&lease, tenant, order, freeze).await;
        let _ = lease.release().await; // NotHolder after a freeze is expected
        match attempt? {
            Attempt::Issued(number) => Ok(Some(number)),
            Attempt::Stale => {
                println!("{order}: the frozen worker's invoice was refused (stale fence); order requeued");
                self.stale_refused.fetch_add(1, Ordering::SeqCst);
                Ok(None)
            }
            Attempt::CounterMoved => Ok(None),
        }
    }

    /// Reads the next number, then writes it in the application's own transaction, fenced.
    async fn write_invoice(
        &self,
        lease: &Lease<DynLockService>,
        tenant: &str,
        order: &str,
        freeze: bool,
    ) -> palisade::Result<Attempt> {
        let tenant_key = self.tenant(tenant);
        let fence = i64::try_from(lease.fence().get())
            .map_err(|_| Error::new(ErrorKind::InvalidArgument, "example", "fence past i64::MAX"))?;
        with_db!(&self.db, |store| {
            let (number,): (i64,) =
                sqlx::query_as(tables::NEXT).bind(&tenant_key).fetch_one(store.pool()).await.map_err(sql_err)?;
            // Freeze only where another worker can take over: another order of this tenant
            // still waits for its number (workers take the lock in no set order, so a later
            // order may have been issued already).
            if freeze && self.pending(tenant).load(Ordering::SeqCst) > 1 {
                println!("{order}: worker (fence {fence}) read number {number} for {tenant}, then froze");
                self.frozen.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(self.pause).await;
                // The incident's pause ended after the takeover; on a loaded machine the next
                // worker may need longer than the pause to acquire and write, so stay frozen
                // until it has issued the number read here (or TAKEOVER_WAIT has passed).
                let deadline = tokio::time::Instant::now() + TAKEOVER_WAIT;
                loop {
                    let (next,): (i64,) = sqlx::query_as(tables::NEXT)
                        .bind(&tenant_key)
                        .fetch_one(store.pool())
                        .await
                        .map_err(sql_err)?;
                    if next > number || tokio::time::Instant::now() >= deadline {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            // The application's transaction: the fence check first, then its own statements.
            // Returning early drops `tx`, which rolls everything back.
            let mut tx = store.begin().await?;
            if let Err(e) = store.check_fence_in(tx.conn(), lease).await {
                return if e.stale_fence_details().is_some() { Ok(Attempt::Stale) } else { Err(e) };
            }
            let advanced = sqlx::query(tables::ADVANCE)
                .bind(&tenant_key)
                .bind(number)
                .execute(tx.conn())
                .await
                .map_err(sql_err)?
                .rows_affected();
            if advanced == 0 {
                return Ok(Attempt::CounterMoved);
            }
            sqlx::query(tables::INSERT)
                .bind(&tenant_key)
                .bind(number)
                .bind(order)
                .bind(fence)
                .execute(tx.conn())
                .await
                .map_err(sql_err)?;
            tx.commit().await?;
            // Counted before the lease is released, so the next holder sees it.
            self.pending(tenant).fetch_sub(1, Ordering::SeqCst);
            Ok(Attempt::Issued(u64::try_from(number).unwrap_or(0)))
        })
    }

    /// Each tenant's counter row, before any worker runs.
    async fn open_tenants(&self) -> palisade::Result<()> {
        for tenant in TENANTS {
            let key = self.tenant(tenant);
            with_db!(&self.db, |store| {
                sqlx::query(tables::OPEN_TENANT).bind(&key).execute(store.pool()).await.map_err(sql_err)?;
            });
        }
        Ok(())
    }

    /// The tenant's invoices: (number, order id).
    async fn invoices(&self, tenant: &str) -> palisade::Result<Vec<(i64, String)>> {
        let key = self.tenant(tenant);
        with_db!(&self.db, |store| {
            sqlx::query_as(tables::LIST).bind(&key).fetch_all(store.pool()).await.map_err(sql_err)
        })
    }
}

async fn run(args: Args) -> palisade::Result<ExitCode> {
    let db = Db::connect(&args.common.store, "invoice-numbering", &tables::CREATE).await?;
    let books = Arc::new(Books {
        db,
        run: common::run_id()?,
        ttl: args.common.ttl(),
        pause: args.common.pause(),
        stale_refused: AtomicU64::new(0),
        frozen: AtomicU64::new(0),
        pending: [AtomicU64::new(args.invoices), AtomicU64::new(args.invoices)],
    });
    books.open_tenants().await?;
    // Orders alternate between tenants; each is (order number, first attempt?).
    let queue: Arc<Mutex<Vec<(u64, bool)>>> =
        Arc::new(Mutex::new((0..args.invoices * 2).rev().map(|o| (o, true)).collect()));
    let mut workers = Vec::new();
    let workers_n = args.workers;
    for _ in 0..args.workers {
        let (books, queue, locks) = (Arc::clone(&books), Arc::clone(&queue), args.common.lock_client().await?);
        workers.push(tokio::spawn(async move {
            loop {
                let Some((order, first)) = queue.lock().await.pop() else { return Ok::<(), Error>(()) };
                let tenant = TENANTS[usize::try_from(order % 2).unwrap_or(0)];
                // One worker has nobody to take over from it (see also `write_invoice`).
                let freeze = first && FROZEN_ORDERS.contains(&order) && workers_n > 1;
                let name = format!("order-{order:05}");
                if books.issue(&locks, tenant, &name, freeze).await?.is_none() {
                    queue.lock().await.push((order, false));
                }
            }
        }));
    }
    for w in workers {
        w.await.map_err(|e| Error::new(ErrorKind::Backend, "example", format!("a worker panicked: {e}")))??;
    }

    let mut per_tenant = BTreeMap::new();
    let mut orders_seen = BTreeMap::<String, u64>::new();
    let (mut gaps, mut total) = (0u64, 0u64);
    for tenant in TENANTS {
        let rows = books.invoices(tenant).await?;
        let numbers: BTreeSet<u64> = rows.iter().filter_map(|(n, _)| u64::try_from(*n).ok()).collect();
        for (_, order) in &rows {
            *orders_seen.entry(order.clone()).or_default() += 1;
        }
        let expected: BTreeSet<u64> = (1..=args.invoices).collect();
        gaps += expected.difference(&numbers).count() as u64;
        total += rows.len() as u64;
        per_tenant.insert(tenant, numbers.len());
        println!("{tenant}: invoices {:?}..={:?}, {} numbers", numbers.first(), numbers.last(), numbers.len());
    }
    let invoiced_twice = orders_seen.values().filter(|&&n| n > 1).count();
    let stale = books.stale_refused.load(Ordering::SeqCst);
    // Each frozen worker stays frozen until another has issued the number it read, so its write
    // is refused; where nobody could take over, nobody froze. Either way no number is
    // used twice and none is skipped.
    let held = gaps == 0 && invoiced_twice == 0 && total == args.invoices * 2;
    Ok(common::finish(
        json!({
            "example": "invoice-numbering",
            "tenants": TENANTS.len(),
            "orders": args.invoices * 2,
            "invoices": total,
            "per_tenant": per_tenant,
            "gaps": gaps,
            "orders_invoiced_twice": invoiced_twice,
            "stale_refused": stale,
            "frozen": books.frozen.load(Ordering::SeqCst),
            "ok": held,
        }),
        held,
    ))
}

fn main() -> ExitCode {
    let args = Args::parse();
    common::main_with(|| run(args))
}
