//! The warehouse's data in a fenced store, and one allocation done right (or, with
//! `Mode::Unfenced`, done the seed's naive way).
//!
//! Records (all under a prefix, `wh` for the CLI, `sim/RUN` for a simulation):
//! - `PREFIX/inventory/SKU`: stock level, decimal text; the record remembers the writing fence.
//! - `PREFIX/done/JOB`: exists once the job has been applied.
//! - `PREFIX/audit/JOB/ATTEMPT`: one record per applied allocation. Two records under one job
//!   are a duplicate shipment.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use palisade::prelude::*;
use palisade::{Fence, Record};

/// Whether writes go through the fence check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Check the fence and the "already done?" condition in the store, atomically (rules 1–3).
    Fenced,
    /// The seed's naive lock: check "done" before the pause, write blindly after it.
    Unfenced,
}

/// What one allocation attempt came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The stock was decremented and the job recorded.
    Applied,
    /// The store refused the write: a newer holder had already written.
    StaleFence { presented: Fence, current: Fence },
    /// Somebody else had already applied this job.
    AlreadyDone,
    /// Not enough stock.
    InsufficientStock { available: i64 },
    /// The SKU has no stock record (run `setup` first).
    UnknownSku,
}

/// How many times an allocation re-reads after a condition failed before giving up. Each
/// conflict means another writer landed in between; under a valid lock only a stale holder
/// can, so a handful is plenty.
const MAX_CONFLICT_RETRIES: u32 = 16;

/// A warehouse in a fenced store.
#[derive(Clone)]
pub struct Warehouse {
    store: Arc<DynFencedStore>,
    prefix: String,
}

/// One allocation request: which SKU, how many, for which job, and a unique attempt id (the
/// audit record's key, so a job applied twice shows up as two records).
#[derive(Debug, Clone, Copy)]
pub struct Order<'a> {
    pub sku: &'a str,
    pub job: &'a str,
    pub attempt: &'a str,
    pub qty: i64,
}

/// A stock level and the fence that last wrote it.
#[derive(Debug, Clone, Copy)]
pub struct Stock {
    pub qty: i64,
    pub fence: Option<Fence>,
}

impl Warehouse {
    pub fn new(store: Arc<DynFencedStore>, prefix: impl Into<String>) -> Self {
        Warehouse { store, prefix: prefix.into() }
    }

    pub fn store(&self) -> &Arc<DynFencedStore> {
        &self.store
    }

    /// The lock resource for a SKU: `alloc:SKU` (validated, so a bad SKU is a typed error).
    pub fn resource(sku: &str) -> palisade::Result<ResourceKey> {
        ResourceKey::new("alloc", sku)
    }

    fn inventory_key(&self, sku: &str) -> String {
        format!("{}/inventory/{sku}", self.prefix)
    }

    fn done_key(&self, job: &str) -> String {
        format!("{}/done/{job}", self.prefix)
    }

    fn audit_prefix(&self) -> String {
        format!("{}/audit/", self.prefix)
    }

    pub async fn stock(&self, sku: &str) -> palisade::Result<Option<Stock>> {
        Ok(self.store.read(&self.inventory_key(sku)).await?.map(|r| Stock { qty: parse_qty(&r), fence: r.fence }))
    }

    /// Sets the stock level under a lease (fenced: a stale admin cannot overwrite newer stock).
    pub async fn set_stock(&self, lease: &Lease<DynLockService>, sku: &str, qty: i64) -> palisade::Result<()> {
        self.store.write(lease, &WriteBatch::new().put(self.inventory_key(sku), qty.to_string())).await
    }

    /// Seeds stock with no lock, before any worker runs (simulation set-up only).
    pub async fn seed_stock(&self, sku: &str, qty: i64) -> palisade::Result<()> {
        self.store.apply_unfenced(&WriteBatch::new().put(self.inventory_key(sku), qty.to_string())).await
    }

    /// Audit entries per job, of one SKU or of all.
    pub async fn audit(&self, sku: Option<&str>) -> palisade::Result<BTreeMap<String, usize>> {
        let prefix = self.audit_prefix();
        let wanted = sku.map(|s| format!("sku={s} "));
        let mut per_job = BTreeMap::new();
        for (key, record) in self.store.list(&prefix).await? {
            if let Some(wanted) = &wanted
                && !record.value.starts_with(wanted.as_bytes())
            {
                continue;
            }
            let rest = &key[prefix.len()..];
            let job = rest.split_once('/').map_or(rest, |(job, _)| job);
            *per_job.entry(job.to_string()).or_insert(0) += 1;
        }
        Ok(per_job)
    }

    /// Allocates `n` units of `sku` for `job` while holding `lease`, pausing `pause` between the
    /// read and the write (the window in which a GC pause or SIGSTOP hits).
    ///
    /// Fenced: the write carries the lease's fence and, in the same atomic batch, the
    /// conditions "stock is still what I read" and "job not yet done" (fencing rule 3). A
    /// condition that fails because another write slipped in is re-read and retried.
    ///
    /// An unfenced lease (Redlock) can only run `Mode::Unfenced`; `Mode::Fenced` refuses it.
    pub async fn allocate<S: LockService + ?Sized>(
        &self,
        lease: &Lease<S>,
        mode: Mode,
        order: &Order<'_>,
        pause: Duration,
    ) -> palisade::Result<Outcome> {
        let Order { sku, job, attempt, qty: n } = *order;
        let inventory_key = self.inventory_key(sku);
        let done_key = self.done_key(job);
        let audit_key = format!("{}{job}/{attempt}", self.audit_prefix());
        let fence = lease.fence_if_any();
        if mode == Mode::Fenced && fence.is_none() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "warehouse",
                format!("the {} lock issues no fence: a fenced allocation needs one", lease.service().backend()),
            ));
        }
        let fence_text = fence.map_or_else(|| "none".to_string(), |f| f.to_string());
        let mut paused = false;
        for _ in 0..=MAX_CONFLICT_RETRIES {
            // Both reads in one request (one statement on PostgreSQL).
            let mut read = self.store.read_many(&[&done_key, &inventory_key]).await?.into_iter();
            let (done, stock) = (read.next().flatten(), read.next().flatten());
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
            let result = match (mode, fence) {
                (Mode::Fenced, Some(fence)) => {
                    let batch = WriteBatch::new()
                        .check(inventory_key.clone(), Some(record.value.clone()))
                        .put(inventory_key.clone(), (available - n).to_string())
                        .create(done_key.clone(), attempt.as_bytes().to_vec())
                        .put(audit_key.clone(), audit_value.into_bytes());
                    self.store
                        .write_fenced(lease.key(), palisade::GrantFence::new(fence, lease.grant().grant_id()), &batch)
                        .await
                }
                (Mode::Unfenced, _) | (Mode::Fenced, None) => {
                    let batch = WriteBatch::new()
                        .put(inventory_key.clone(), (available - n).to_string())
                        .put(done_key.clone(), attempt.as_bytes().to_vec())
                        .put(audit_key.clone(), audit_value.into_bytes());
                    self.store.apply_unfenced(&batch).await
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
                    // A stale holder's write landed between our read and our write (it woke
                    // up before we wrote, so its fence still passed). Re-read: we will see
                    // its work, or the stock it left.
                }
            }
        }
        Err(Error::new(
            ErrorKind::Conflict,
            "warehouse",
            format!("job {job}: stock of {sku} kept changing under the lock ({MAX_CONFLICT_RETRIES} retries)"),
        ))
    }
}

fn parse_qty(record: &Record) -> i64 {
    std::str::from_utf8(&record.value).ok().and_then(|s| s.parse().ok()).unwrap_or(0)
}
