//! # Invoice numbering: gap-free numbers per tenant, never one number twice
//!
//! ```sh
//! cargo run --example invoice-numbering                      # embedded default
//! cargo run --features redis,postgres --example invoice-numbering -- --lock redis://… --store postgres://…
//! ```
//!
//! **What goes wrong without a fence.** Invoice numbers must be consecutive per tenant (tax law in
//! many countries). A worker locks the tenant, reads the next number, and writes the invoice and
//! the incremented counter. If it freezes between the read and the write, its lock expires, a
//! second worker reads the *same* next number and issues it; then the first wakes and issues it
//! again: two invoices with one number, or a counter that went backwards.
//!
//! **How this example prevents it.**
//! - The number comes from a counter record in the store, not from the fence (fences may have
//!   gaps; the counter does not).
//! - The invoice row and the counter are written in **one fenced transaction** that also checks
//!   the counter is still what was read. A frozen worker's transaction carries a lower fence than
//!   the worker that issued the number after it, so it is refused with `StaleFence` as a whole:
//!   no invoice, no counter change. Its order goes back to the queue and gets the next free number.

use palisade_examples::common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use palisade::DynFencedStore;
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

struct Books {
    store: Arc<DynFencedStore>,
    run: String,
    ttl: Duration,
    pause: Duration,
    stale_refused: AtomicU64,
}

impl Books {
    fn counter(&self, tenant: &str) -> String {
        format!("inv/{}/{tenant}/next", self.run)
    }
    fn invoice_prefix(&self, tenant: &str) -> String {
        format!("inv/{}/{tenant}/invoice/", self.run)
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
                &ResourceKey::new("invoice", format!("{}-{tenant}", self.run))?,
                LockOptions::ttl(self.ttl).wait(Duration::from_secs(60)),
            )
            .await?;
        let current = self.store.read(&self.counter(tenant)).await?.map(|r| r.value);
        let number = current.as_deref().and_then(|v| std::str::from_utf8(v).ok()?.parse().ok()).unwrap_or(1u64);
        if freeze {
            println!("{order}: worker (fence {}) read number {number} for {tenant}, then froze", lease.fence());
            tokio::time::sleep(self.pause).await;
        }
        let batch = WriteBatch::new()
            .check(self.counter(tenant), current)
            .put(self.counter(tenant), (number + 1).to_string())
            .create(format!("{}{number:08}", self.invoice_prefix(tenant)), order.as_bytes().to_vec());
        let result = self.store.write(&lease, &batch).await;
        let _ = lease.release().await; // NotHolder after a freeze is expected
        match result {
            Ok(()) => Ok(Some(number)),
            Err(e) if e.stale_fence_details().is_some() => {
                println!("{order}: the frozen worker's invoice {number} was refused ({e}); order requeued");
                self.stale_refused.fetch_add(1, Ordering::SeqCst);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

async fn run(args: Args) -> palisade::Result<ExitCode> {
    let store = args.common.store().await?;
    let books = Arc::new(Books {
        store,
        run: common::run_id()?,
        ttl: args.common.ttl(),
        pause: args.common.pause(),
        stale_refused: AtomicU64::new(0),
    });
    // Orders alternate between tenants; each is (order number, first attempt?).
    let queue: Arc<Mutex<Vec<(u64, bool)>>> =
        Arc::new(Mutex::new((0..args.invoices * 2).rev().map(|o| (o, true)).collect()));
    let mut workers = Vec::new();
    for _ in 0..args.workers {
        let (books, queue, locks) = (Arc::clone(&books), Arc::clone(&queue), args.common.lock_client().await?);
        workers.push(tokio::spawn(async move {
            loop {
                let Some((order, first)) = queue.lock().await.pop() else { return Ok::<(), Error>(()) };
                let tenant = TENANTS[usize::try_from(order % 2).unwrap_or(0)];
                let freeze = first && FROZEN_ORDERS.contains(&order);
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
        let rows = books.store.list(&books.invoice_prefix(tenant)).await?;
        let numbers: BTreeSet<u64> = rows.iter().filter_map(|(k, _)| k.rsplit('/').next()?.parse().ok()).collect();
        for (_, r) in &rows {
            *orders_seen.entry(String::from_utf8_lossy(&r.value).to_string()).or_default() += 1;
        }
        let expected: BTreeSet<u64> = (1..=args.invoices).collect();
        gaps += expected.difference(&numbers).count() as u64;
        total += rows.len() as u64;
        per_tenant.insert(tenant, numbers.len());
        println!("{tenant}: invoices {:?}..={:?}, {} numbers", numbers.first(), numbers.last(), numbers.len());
    }
    let invoiced_twice = orders_seen.values().filter(|&&n| n > 1).count();
    let stale = books.stale_refused.load(Ordering::SeqCst);
    // A frozen worker's write is refused only if someone issued a number meanwhile (the default
    // sizes make sure of it); either way no number is used twice and none is skipped.
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
            "ok": held,
        }),
        held,
    ))
}

fn main() -> ExitCode {
    let args = Args::parse();
    common::main_with(|| run(args))
}
