//! The suite must be able to fail: deliberately broken lock services and stores, each failing
//! the scenarios that check the guarantee it breaks (while the reference implementations, in
//! `memory.rs` and in palisade-sqlite's tests, pass them all).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_conformance::memory::MemoryStoreFactory;
use palisade_conformance::{
    Ctx, FencedStoreFactory, LockServiceFactory, Outcome, ProcessAccess, Timing, e2e, harness, lock, store,
};
use palisade_core::{
    Capabilities, Error, ErrorKind, Fence, FenceSource, Fenced, FencedStore, Grant, GrantFence, LockService,
    OwnerToken, Record, ResourceKey, Result, Ttl, WriteBatch, WriteOp, async_trait, conflict_error,
};
use tokio::time::Instant;

// ---------------------------------------------------------------------------------------------
// A lock service with one flaw at a time.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LockFlaw {
    /// Grants whether or not the key is held.
    NoExclusion,
    /// Release removes whoever holds the lock, whatever the token.
    ReleaseIgnoresToken,
    /// Grants never expire.
    NeverExpires,
    /// A takeover after expiry reuses the expired holder's fence.
    FenceNotIncreasedAfterExpiry,
    /// Extend says yes and does nothing.
    ExtendDoesNothing,
    /// `acquire` gives up at once (and does not validate its wait).
    AcquireNeverWaits,
    /// Fences jump by two while the service declares them gap-free.
    GapsDeclaredGapFree,
}

#[derive(Default)]
struct Slot {
    holder: Option<(OwnerToken, Instant)>,
    last_fence: u64,
}

struct BrokenLock {
    flaw: LockFlaw,
    slots: Mutex<HashMap<ResourceKey, Slot>>,
}

#[async_trait]
impl LockService for BrokenLock {
    type Fencing = Fenced;

    fn backend(&self) -> &'static str {
        "broken"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fence_source: FenceSource::Counter,
            fences_survive_release: true,
            gap_free: true,
            ..Capabilities::default()
        }
    }

    async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Fenced>>> {
        let now = Instant::now();
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(key.clone()).or_default();
        let held = slot.holder.is_some_and(|(_, expires)| expires > now);
        if held && self.flaw != LockFlaw::NoExclusion {
            return Ok(None);
        }
        let expired_takeover = slot.holder.is_some() && !held;
        slot.last_fence += match self.flaw {
            LockFlaw::FenceNotIncreasedAfterExpiry if expired_takeover => 0,
            LockFlaw::GapsDeclaredGapFree => 2,
            _ => 1,
        };
        let token = OwnerToken::generate()?;
        let expires =
            if self.flaw == LockFlaw::NeverExpires { now + Duration::from_secs(3600) } else { now + ttl.get() };
        slot.holder = Some((token, expires));
        Ok(Some(Grant::new(key.clone(), token, Fence::new(slot.last_fence), ttl, now)))
    }

    async fn acquire(&self, key: &ResourceKey, ttl: Ttl, wait: Duration) -> Result<Grant<Fenced>> {
        if self.flaw == LockFlaw::AcquireNeverWaits {
            return self.try_acquire(key, ttl).await?.ok_or_else(|| palisade_core::timeout_error("broken", key, wait));
        }
        palisade_core::validate_wait(wait)?;
        let give_up = Instant::now() + wait;
        loop {
            if let Some(g) = self.try_acquire(key, ttl).await? {
                return Ok(g);
            }
            if Instant::now() >= give_up {
                return Err(palisade_core::timeout_error("broken", key, wait));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    async fn extend(&self, grant: &Grant<Fenced>, ttl: Ttl) -> Result<Ttl> {
        let now = Instant::now();
        let mut slots = self.slots.lock().unwrap();
        match slots.get_mut(grant.key()).and_then(|s| s.holder.as_mut()) {
            Some((token, expires)) if *token == grant.token() && *expires > now => {
                if self.flaw != LockFlaw::ExtendDoesNothing {
                    *expires = now + ttl.get();
                }
                Ok(ttl)
            }
            _ => Err(Error::new(ErrorKind::NotHolder, "broken", "not held")),
        }
    }

    async fn release(&self, grant: &Grant<Fenced>) -> Result<()> {
        let now = Instant::now();
        let mut slots = self.slots.lock().unwrap();
        let Some(slot) = slots.get_mut(grant.key()) else {
            return Err(Error::new(ErrorKind::NotHolder, "broken", "not held"));
        };
        let ours = slot.holder.is_some_and(|(t, e)| t == grant.token() && e > now);
        if ours || (self.flaw == LockFlaw::ReleaseIgnoresToken && slot.holder.is_some()) {
            slot.holder = None;
            Ok(())
        } else {
            Err(Error::new(ErrorKind::NotHolder, "broken", "not held"))
        }
    }
}

#[derive(Clone)]
struct BrokenLockFactory(Arc<BrokenLock>);

impl BrokenLockFactory {
    fn new(flaw: LockFlaw) -> Self {
        BrokenLockFactory(Arc::new(BrokenLock { flaw, slots: Mutex::default() }))
    }
}

#[async_trait]
impl LockServiceFactory for BrokenLockFactory {
    type Service = BrokenLock;
    async fn client(&self) -> Result<Arc<BrokenLock>> {
        Ok(Arc::clone(&self.0))
    }
    fn timing(&self) -> Timing {
        Timing::new(Duration::from_millis(200), Duration::from_millis(50))
    }
    fn process_access(&self) -> ProcessAccess {
        ProcessAccess::Relay
    }
}

// ---------------------------------------------------------------------------------------------
// A store with one flaw at a time.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoreFlaw {
    /// Applies writes whatever their fence (the watermark only goes up).
    AcceptsLowerFence,
    /// Applies operations one by one and stops at a failed condition, keeping what it wrote.
    PartialBatch,
    /// Reports a stale write as success (the seed's "zero rows updated" bug).
    SilentRejection,
    /// Does not validate batches.
    NoValidation,
    /// Accepts a fence equal to the watermark from any grant (the rule before rule 2 knew grants).
    AcceptsEqualFromAnyGrant,
}

#[derive(Default)]
struct StoreState {
    watermarks: HashMap<ResourceKey, GrantFence>,
    records: BTreeMap<String, Record>,
}

struct BrokenStore {
    flaw: StoreFlaw,
    state: Mutex<StoreState>,
}

impl BrokenStore {
    fn apply_ops(&self, fence: Option<(&ResourceKey, GrantFence)>, batch: &WriteBatch) -> Result<()> {
        if self.flaw != StoreFlaw::NoValidation {
            batch.validate()?;
        }
        let mut state = self.state.lock().unwrap();
        if let Some((res, presented)) = fence {
            let f = presented.fence();
            let current = state.watermarks.get(res).copied();
            if let Some(c) = current.filter(|c| f < c.fence()) {
                match self.flaw {
                    StoreFlaw::AcceptsLowerFence => {}
                    StoreFlaw::SilentRejection => return Ok(()),
                    _ => return Err(Error::stale_fence("broken", f, c.fence())),
                }
            } else if current.is_some_and(|c| c.fence() == f && c.grant() != presented.grant())
                && self.flaw != StoreFlaw::AcceptsEqualFromAnyGrant
            {
                return Err(Error::duplicate_fence("broken", f));
            } else {
                state.watermarks.insert(res.clone(), presented);
            }
        }
        let record_fence = fence.map(|(_, f)| f.fence());
        let holds = |state: &StoreState, op: &WriteOp| match op {
            WriteOp::Create { key, .. } => !state.records.contains_key(key),
            WriteOp::Check { key, expected } => state.records.get(key).map(|r| &r.value) == expected.as_ref(),
            _ => true,
        };
        if self.flaw != StoreFlaw::PartialBatch
            && let Some(op) = batch.ops().iter().find(|op| !holds(&state, op))
        {
            return Err(conflict_error("broken", op));
        }
        for op in batch.ops() {
            if !holds(&state, op) {
                return Err(conflict_error("broken", op));
            }
            match op {
                WriteOp::Put { key, value } | WriteOp::Create { key, value } => {
                    state.records.insert(key.clone(), Record { value: value.clone(), fence: record_fence });
                }
                WriteOp::Delete { key } => {
                    state.records.remove(key);
                }
                WriteOp::Check { .. } => {}
            }
        }
        Ok(())
    }
}

#[async_trait]
impl FencedStore for BrokenStore {
    fn backend(&self) -> &'static str {
        "broken"
    }
    async fn apply(&self, resource: &ResourceKey, fence: GrantFence, batch: &WriteBatch) -> Result<()> {
        self.apply_ops(Some((resource, fence)), batch)
    }
    async fn apply_unfenced(&self, batch: &WriteBatch) -> Result<()> {
        self.apply_ops(None, batch)
    }
    async fn watermark(&self, resource: &ResourceKey) -> Result<Option<Fence>> {
        Ok(self.state.lock().unwrap().watermarks.get(resource).map(GrantFence::fence))
    }
    async fn read(&self, key: &str) -> Result<Option<Record>> {
        Ok(self.state.lock().unwrap().records.get(key).cloned())
    }
    async fn list(&self, prefix: &str) -> Result<Vec<(String, Record)>> {
        let state = self.state.lock().unwrap();
        Ok(state.records.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(k, r)| (k.clone(), r.clone())).collect())
    }
}

#[derive(Clone)]
struct BrokenStoreFactory(Arc<BrokenStore>);

impl BrokenStoreFactory {
    fn new(flaw: StoreFlaw) -> Self {
        BrokenStoreFactory(Arc::new(BrokenStore { flaw, state: Mutex::default() }))
    }
}

#[async_trait]
impl FencedStoreFactory for BrokenStoreFactory {
    type Store = BrokenStore;
    async fn client(&self) -> Result<Arc<BrokenStore>> {
        Ok(Arc::clone(&self.0))
    }
}

// ---------------------------------------------------------------------------------------------

fn ctx(name: &'static str) -> Ctx {
    Ctx::new(name, "")
}

/// Like `assert_fails`, and the failure must name `because` (so it failed for the flaw's reason).
#[track_caller]
fn assert_fails_because(outcome: Outcome, what: &str, because: &str) {
    match outcome {
        Ok(report) => panic!("{what}: scenario `{}` passed against a broken implementation", report.scenario),
        Err(failure) => {
            let text = failure.to_string();
            assert!(text.contains(because), "{what}: failed, but not because of {because:?}: {text}");
            println!("{what}: failed as it must: {text}");
        }
    }
}

#[track_caller]
fn assert_fails(outcome: Outcome, what: &str) {
    match outcome {
        Ok(report) => panic!("{what}: scenario `{}` passed against a broken implementation", report.scenario),
        Err(failure) => println!("{what}: failed as it must: {failure}"),
    }
}

#[tokio::test]
async fn no_exclusion_fails_mutual_exclusion() {
    let f = BrokenLockFactory::new(LockFlaw::NoExclusion);
    assert_fails(lock::mutual_exclusion(&ctx("mutual_exclusion"), &f).await, "NoExclusion");
    assert_fails(lock::owner_only_release_and_extend(&ctx("owner_only_release_and_extend"), &f).await, "NoExclusion");
}

#[tokio::test]
async fn release_ignoring_the_token_fails_owner_only() {
    let f = BrokenLockFactory::new(LockFlaw::ReleaseIgnoresToken);
    assert_fails(
        lock::owner_only_release_and_extend(&ctx("owner_only_release_and_extend"), &f).await,
        "ReleaseIgnoresToken",
    );
}

#[tokio::test]
async fn a_ttl_that_never_expires_fails_expiry() {
    let f = BrokenLockFactory::new(LockFlaw::NeverExpires);
    assert_fails(lock::expiry_and_takeover(&ctx("expiry_and_takeover"), &f).await, "NeverExpires");
}

#[tokio::test]
async fn a_fence_not_increased_after_expiry_fails_monotonicity_and_the_pause() {
    let f = BrokenLockFactory::new(LockFlaw::FenceNotIncreasedAfterExpiry);
    assert_fails(lock::fence_monotonicity(&ctx("fence_monotonicity"), &f).await, "FenceNotIncreasedAfterExpiry");
    assert_fails(lock::expiry_and_takeover(&ctx("expiry_and_takeover"), &f).await, "FenceNotIncreasedAfterExpiry");
    let outcome = e2e::paused_holder_in_process(&ctx("paused_holder_in_process"), &f, &MemoryStoreFactory::new()).await;
    assert_fails(outcome, "FenceNotIncreasedAfterExpiry");
}

#[tokio::test]
async fn an_extend_that_does_nothing_fails_renewal() {
    let f = BrokenLockFactory::new(LockFlaw::ExtendDoesNothing);
    assert_fails(lock::progress_gated_renewal(&ctx("progress_gated_renewal"), &f).await, "ExtendDoesNothing");
}

#[tokio::test]
async fn an_acquire_that_never_waits_fails_handoff_and_bad_input() {
    let f = BrokenLockFactory::new(LockFlaw::AcquireNeverWaits);
    assert_fails(lock::wait_and_handoff(&ctx("wait_and_handoff"), &f).await, "AcquireNeverWaits");
    assert_fails(lock::bad_input(&ctx("bad_input"), &f).await, "AcquireNeverWaits");
}

#[tokio::test]
async fn gaps_in_declared_gap_free_fences_fail_monotonicity_and_load() {
    let f = BrokenLockFactory::new(LockFlaw::GapsDeclaredGapFree);
    assert_fails(lock::fence_monotonicity(&ctx("fence_monotonicity"), &f).await, "GapsDeclaredGapFree");
    assert_fails(e2e::load(&ctx("load"), &f, &MemoryStoreFactory::new()).await, "GapsDeclaredGapFree");
}

#[tokio::test]
async fn a_store_accepting_lower_fences_fails_the_store_and_pause_scenarios() {
    let s = BrokenStoreFactory::new(StoreFlaw::AcceptsLowerFence);
    assert_fails(store::equal_higher_lower(&ctx("equal_higher_lower"), &s).await, "AcceptsLowerFence");
    assert_fails(
        store::concurrent_interleaved_fences(&ctx("concurrent_interleaved_fences"), &s).await,
        "AcceptsLowerFence",
    );
    let lf = palisade_conformance::memory::MemoryLockFactory::new();
    assert_fails(e2e::paused_holder_in_process(&ctx("paused_holder_in_process"), &lf, &s).await, "AcceptsLowerFence");
    assert_fails(
        e2e::stale_write_before_new_holder_writes(&ctx("stale_write_before_new_holder_writes"), &lf, &s).await,
        "AcceptsLowerFence",
    );
}

#[tokio::test]
async fn a_store_applying_partial_batches_fails_atomicity() {
    let s = BrokenStoreFactory::new(StoreFlaw::PartialBatch);
    assert_fails(store::atomicity(&ctx("atomicity"), &s).await, "PartialBatch");
}

#[tokio::test]
async fn a_store_reporting_rejections_as_success_fails() {
    let s = BrokenStoreFactory::new(StoreFlaw::SilentRejection);
    assert_fails(store::equal_higher_lower(&ctx("equal_higher_lower"), &s).await, "SilentRejection");
    assert_fails(
        store::concurrent_interleaved_fences(&ctx("concurrent_interleaved_fences"), &s).await,
        "SilentRejection",
    );
}

#[tokio::test]
async fn a_store_without_validation_fails_bad_input() {
    let s = BrokenStoreFactory::new(StoreFlaw::NoValidation);
    assert_fails(store::store_bad_input(&ctx("store_bad_input"), &s).await, "NoValidation");
}

/// The SQLite file every process of this test binary can open.
#[derive(Clone)]
struct SharedSqlite;

#[async_trait]
impl FencedStoreFactory for SharedSqlite {
    type Store = palisade_sqlite::SqliteStore;
    async fn client(&self) -> Result<Arc<palisade_sqlite::SqliteStore>> {
        let path: PathBuf = [env!("CARGO_TARGET_TMPDIR"), "palisade-broken.db"].iter().collect();
        let url = format!("sqlite://{}?synchronous=normal&busy_timeout_ms=30000", path.display());
        Ok(Arc::new(palisade_sqlite::SqliteStore::connect(&url).await?))
    }
}

/// Runs a process-level scenario by hand (it re-executes this test) and returns whether it
/// failed; in the child it just plays the holder.
fn process_scenario_fails(scenario: &'static str, test: &'static str, lf: BrokenLockFactory) -> bool {
    let name = harness::test_name(module_path!(), test);
    let run = std::panic::catch_unwind(move || {
        harness::run(scenario, &name, |ctx| async move {
            match scenario {
                "killed_holder" => e2e::killed_holder(&ctx, &lf, &SharedSqlite).await,
                _ => e2e::paused_holder_process(&ctx, &lf, &SharedSqlite).await,
            }
        })
    });
    run.is_err()
}

#[test]
fn a_fence_not_increased_after_expiry_fails_the_sigstop_scenario() {
    let failed = process_scenario_fails(
        "paused_holder_process",
        "a_fence_not_increased_after_expiry_fails_the_sigstop_scenario",
        BrokenLockFactory::new(LockFlaw::FenceNotIncreasedAfterExpiry),
    );
    assert!(palisade_conformance::is_child_process() || failed, "the SIGSTOP scenario passed against a broken fence");
}

#[test]
fn a_ttl_that_never_expires_fails_the_sigkill_scenario() {
    let failed = process_scenario_fails(
        "killed_holder",
        "a_ttl_that_never_expires_fails_the_sigkill_scenario",
        BrokenLockFactory::new(LockFlaw::NeverExpires),
    );
    assert!(
        palisade_conformance::is_child_process() || failed,
        "the SIGKILL scenario passed against a lock that never expires"
    );
}

#[tokio::test]
async fn a_store_accepting_an_equal_fence_from_any_grant_fails_equal_higher_lower() {
    let s = BrokenStoreFactory::new(StoreFlaw::AcceptsEqualFromAnyGrant);
    assert_fails_because(
        store::equal_higher_lower(&ctx("equal_higher_lower"), &s).await,
        "AcceptsEqualFromAnyGrant",
        "from a second grant",
    );
}
