//! A fenced store with one deliberate flaw at a time: the broken twins that show a checker can
//! fail. The conformance suite's own tests (`conformance/tests/broken.rs`) run its store
//! scenarios against each flaw and expect the scenarios that check the broken guarantee to
//! fail; the torture's tests (`compare/tests/torture.rs`) serve the flaws a history can show to
//! client processes through the conformance crate's store relay and expect the history checker
//! to find them.
//!
//! A test fixture, never published: the state lives in this process.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use palisade_core::spi::{async_trait, conflict_error};
use palisade_core::{
    Error, ErrorKind, Fence, FencedStore, GrantFence, Record, ResourceKey, Result, WriteBatch, WriteOp,
};

const BACKEND: &str = "broken";

/// The one flaw a [`BrokenStore`] has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreFlaw {
    /// None: the control, which passes every store scenario.
    None,
    /// Applies writes whatever their fence (the watermark only goes up).
    AcceptsLowerFence,
    /// Applies operations one by one and stops at a failed condition, keeping what it wrote.
    PartialBatch,
    /// Reports a stale write as success (the incident's "zero rows updated" bug).
    SilentRejection,
    /// Does not validate batches.
    NoValidation,
    /// Accepts a fence equal to the watermark from any grant (the rule before rule 2 knew grants).
    AcceptsEqualFromAnyGrant,
    /// Reads the watermark, then writes in a second step (bug class 18): another writer can
    /// slip in between.
    CheckThenWrite,
    /// Checks the fence only when the batch has a `Put` (and then sets the watermark
    /// unconditionally).
    ChecksOnlyPuts,
    /// One watermark per key domain (a table's worth) instead of one per resource.
    WatermarkPerDomain,
    /// Keeps watermarks in the client's memory: a new client starts with none.
    WatermarkInClient,
    /// Accepts fence 0 (an uninitialised fence).
    AcceptsZero,
    /// Answers `read_many` in key order, as a naive `WHERE key = ANY(…)` returns rows, instead
    /// of the order asked.
    ReadManyInKeyOrder,
    /// Declares that fenced writes require a live lock, and checks only the fence.
    ClaimsLiveLock,
    /// Judges only the first resource's fence of a multi-resource write (and raises every
    /// watermark): a transfer whose other side went stale lands anyway.
    ChecksOnlyFirstFence,
}

type Watermarks = Arc<Mutex<HashMap<ResourceKey, GrantFence>>>;
type Records = Arc<Mutex<BTreeMap<String, Record>>>;

/// The state a poisoned lock guards is a test fixture's: a panic elsewhere already failed the
/// test, so the state is used as it is.
fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A broken store's "server": the records every client shares, and the watermarks they share
/// unless the flaw keeps them in the client. Cloning it shares the state.
#[derive(Debug, Clone)]
pub struct BrokenStore {
    flaw: StoreFlaw,
    watermarks: Watermarks,
    records: Records,
}

impl BrokenStore {
    /// An empty store with `flaw`.
    pub fn new(flaw: StoreFlaw) -> Self {
        BrokenStore { flaw, watermarks: Watermarks::default(), records: Records::default() }
    }

    /// Its flaw.
    pub fn flaw(&self) -> StoreFlaw {
        self.flaw
    }

    /// A new client: the records are the store's; so are the watermarks, except with
    /// [`StoreFlaw::WatermarkInClient`], whose every client starts with none.
    pub fn client(&self) -> BrokenStoreClient {
        let watermarks = if self.flaw == StoreFlaw::WatermarkInClient {
            Watermarks::default()
        } else {
            Arc::clone(&self.watermarks)
        };
        BrokenStoreClient { flaw: self.flaw, watermarks, records: Arc::clone(&self.records) }
    }
}

/// One client of a [`BrokenStore`].
#[derive(Debug)]
pub struct BrokenStoreClient {
    flaw: StoreFlaw,
    watermarks: Watermarks,
    records: Records,
}

impl BrokenStoreClient {
    /// Whose watermark a write to `res` checks and raises.
    fn scope(&self, res: &ResourceKey) -> ResourceKey {
        if self.flaw == StoreFlaw::WatermarkPerDomain {
            ResourceKey::new(res.domain(), "all").unwrap_or_else(|_| res.clone())
        } else {
            res.clone()
        }
    }

    /// The fence check; `Ok(true)`: go on and raise the watermark, `Ok(false)`: report success
    /// without writing.
    fn check(&self, current: Option<GrantFence>, presented: GrantFence, batch: &WriteBatch) -> Result<bool> {
        let f = presented.fence();
        if (f.get() == 0 && self.flaw != StoreFlaw::AcceptsZero) || f > Fence::MAX_STORABLE {
            return Err(Error::new(ErrorKind::InvalidArgument, BACKEND, format!("fence {f} cannot be stored")));
        }
        if self.flaw == StoreFlaw::ChecksOnlyPuts && !batch.ops().iter().any(|op| matches!(op, WriteOp::Put { .. })) {
            return Ok(true);
        }
        if let Some(c) = current.filter(|c| f < c.fence()) {
            return match self.flaw {
                StoreFlaw::AcceptsLowerFence => Ok(true),
                StoreFlaw::SilentRejection => Ok(false),
                _ => Err(Error::stale_fence(BACKEND, f, c.fence())),
            };
        }
        if current.is_some_and(|c| c.fence() == f && c.grant() != presented.grant())
            && self.flaw != StoreFlaw::AcceptsEqualFromAnyGrant
        {
            return Err(Error::duplicate_fence(BACKEND, f));
        }
        Ok(true)
    }

    async fn apply_ops(&self, fences: &[(ResourceKey, GrantFence)], batch: &WriteBatch) -> Result<()> {
        if self.flaw != StoreFlaw::NoValidation {
            batch.validate()?;
        }
        // The members whose fence is judged: all, or the first alone.
        let judged = if self.flaw == StoreFlaw::ChecksOnlyFirstFence { &fences[..fences.len().min(1)] } else { fences };
        if self.flaw == StoreFlaw::CheckThenWrite {
            for (res, presented) in judged {
                let current = locked(&self.watermarks).get(&self.scope(res)).copied();
                if !self.check(current, *presented, batch).map_err(|e| e.with_resource(res.clone()))? {
                    return Ok(());
                }
            }
            tokio::task::yield_now().await; // the second round trip
        }
        let mut watermarks = locked(&self.watermarks);
        let mut records = locked(&self.records);
        if self.flaw != StoreFlaw::CheckThenWrite {
            for (res, presented) in judged {
                match self.check(watermarks.get(&self.scope(res)).copied(), *presented, batch) {
                    Ok(true) => {}
                    Ok(false) => return Ok(()),
                    Err(e) => return Err(e.with_resource(res.clone())),
                }
            }
        }
        let record_fence = fences.last().map(|(_, f)| f.fence());
        let holds = |records: &BTreeMap<String, Record>, op: &WriteOp| match op {
            WriteOp::Create { key, .. } => !records.contains_key(key),
            WriteOp::Check { key, expected } => records.get(key).map(|r| &r.value) == expected.as_ref(),
            _ => true,
        };
        if self.flaw != StoreFlaw::PartialBatch
            && let Some(op) = batch.ops().iter().find(|op| !holds(&records, op))
        {
            return Err(conflict_error(BACKEND, op));
        }
        for (res, presented) in fences {
            let scope = self.scope(res);
            let lower = watermarks.get(&scope).is_some_and(|c| presented.fence() < c.fence());
            if !lower || self.flaw == StoreFlaw::ChecksOnlyPuts || self.flaw == StoreFlaw::CheckThenWrite {
                watermarks.insert(scope, *presented);
            }
        }
        for op in batch.ops() {
            if !holds(&records, op) {
                return Err(conflict_error(BACKEND, op));
            }
            match op {
                WriteOp::Put { key, value } | WriteOp::Create { key, value } => {
                    records.insert(key.clone(), Record { value: value.clone(), fence: record_fence });
                }
                WriteOp::Delete { key } => {
                    records.remove(key);
                }
                WriteOp::Check { .. } => {}
            }
        }
        Ok(())
    }
}

#[async_trait]
impl FencedStore for BrokenStoreClient {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn requires_live_lock(&self) -> bool {
        self.flaw == StoreFlaw::ClaimsLiveLock
    }

    async fn apply(&self, resource: &ResourceKey, fence: GrantFence, batch: &WriteBatch) -> Result<()> {
        self.apply_ops(&[(resource.clone(), fence)], batch).await
    }

    async fn apply_all(&self, fences: &[(ResourceKey, GrantFence)], batch: &WriteBatch) -> Result<()> {
        let fences = if self.flaw == StoreFlaw::NoValidation {
            let mut sorted = fences.to_vec();
            sorted.sort_by(|a, b| a.0.cmp(&b.0));
            sorted
        } else {
            palisade_core::spi::canonical_fences(BACKEND, fences)?
        };
        self.apply_ops(&fences, batch).await
    }

    async fn apply_unfenced(&self, batch: &WriteBatch) -> Result<()> {
        self.apply_ops(&[], batch).await
    }

    async fn watermark(&self, resource: &ResourceKey) -> Result<Option<Fence>> {
        Ok(locked(&self.watermarks).get(&self.scope(resource)).map(GrantFence::fence))
    }

    async fn read(&self, key: &str) -> Result<Option<Record>> {
        if self.flaw != StoreFlaw::NoValidation {
            palisade_core::spi::validate_record_key(key)?;
        }
        Ok(locked(&self.records).get(key).cloned())
    }

    async fn read_many(&self, keys: &[&str]) -> Result<Vec<Option<Record>>> {
        let mut keys = keys.to_vec();
        if self.flaw == StoreFlaw::ReadManyInKeyOrder {
            keys.sort_unstable();
        }
        let mut out = Vec::new();
        for key in keys {
            out.push(self.read(key).await?);
        }
        Ok(out)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Record)>> {
        let records = locked(&self.records);
        Ok(records.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(k, r)| (k.clone(), r.clone())).collect())
    }
}
