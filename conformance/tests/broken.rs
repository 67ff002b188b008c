//! The suite must be able to fail: deliberately broken lock services and stores, each failing
//! the scenarios that check the guarantee it breaks (while the reference implementations, in
//! `memory.rs` and in palisade-sqlite's tests, pass them all).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

// One module, so that the test command can run these apart: they wait on TTLs and bounds and
// use almost no CPU, so `scripts/test` runs them eight at a time (`--test-threads 8`) and skips
// `broken_twins::` in the run that keeps one test per core.
mod broken_twins {

    use std::collections::HashMap;
    use std::path::PathBuf;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use palisade_conformance::memory::MemoryStoreFactory;
    use palisade_conformance::relay::{Relay, RelayLockService, RelayRetry, RelayStore, StoreRelay};
    use palisade_conformance::{
        Ctx, FencedStoreFactory, LockServiceFactory, Outcome, ProcessAccess, Restart, Timing, e2e, harness,
    };
    use palisade_conformance::{FaultProxy, FaultyClient};
    use palisade_core::spi::async_trait;
    use palisade_core::{
        Capabilities, Error, ErrorKind, FenceSource, Fenced, Grant, LockService, OwnerToken, ResourceKey, Result, Ttl,
    };
    use tokio::time::Instant;

    // ---------------------------------------------------------------------------------------------
    // A lock service with one flaw at a time: palisade-broken-lock, which the torture's tests
    // use too.

    use palisade_broken_lock::{BrokenLock, LockFlaw};

    /// A broken service, and how its faulty client (over the relay) resends a request whose reply
    /// was lost.
    #[derive(Clone)]
    struct BrokenLockFactory(Arc<BrokenLock>, RelayRetry);

    impl BrokenLockFactory {
        fn new(flaw: LockFlaw) -> Self {
            BrokenLockFactory(Arc::new(BrokenLock::new(flaw).unwrap()), RelayRetry::SameRequest)
        }

        /// A client: the shared one, or for `TokenPerClient` one of its own (with its own token).
        fn lock(&self) -> Arc<BrokenLock> {
            if self.0.flaw == LockFlaw::TokenPerClient {
                Arc::new(self.0.sibling(Duration::ZERO).unwrap())
            } else {
                Arc::clone(&self.0)
            }
        }

        /// A correct service whose faulty client resends lost requests as `retry` says.
        fn retrying(retry: RelayRetry) -> Self {
            BrokenLockFactory(BrokenLockFactory::new(LockFlaw::None).0, retry)
        }
    }

    #[async_trait]
    impl LockServiceFactory for BrokenLockFactory {
        type Service = BrokenLock;
        async fn client(&self) -> Result<Arc<BrokenLock>> {
            Ok(self.lock())
        }
        fn timing(&self) -> Timing {
            let margin = if self.0.flaw == LockFlaw::UnexplainedMargin { 5000 } else { 50 };
            Timing::new(Duration::from_millis(200), Duration::from_millis(margin))
        }
        fn process_access(&self) -> ProcessAccess {
            ProcessAccess::Relay
        }
        async fn break_lock(&self, key: &ResourceKey) -> Result<()> {
            if let Some(slot) = self.0.slots.lock().unwrap().get_mut(key) {
                slot.holder = None;
            }
            Ok(())
        }
        async fn skewed_client(&self, ahead: Duration) -> Result<Arc<BrokenLock>> {
            Ok(Arc::new(self.0.sibling(ahead).unwrap()))
        }
        async fn view(&self) -> Result<Arc<dyn palisade_core::InspectLocks>> {
            if self.0.flaw == LockFlaw::NoView {
                return Err(Error::new(ErrorKind::Unsupported, "broken", "no view"));
            }
            Ok(Arc::clone(&self.0) as Arc<dyn palisade_core::InspectLocks>)
        }
        async fn faulty_client(&self) -> Result<FaultyClient<Fenced>> {
            let relay = Relay::serve(self.lock()).await?;
            let proxy = FaultProxy::start(relay.addr()).await?;
            let mut client =
                RelayLockService::<Fenced>::connect_with(proxy.addr(), self.0.capabilities(), self.1).await?;
            if self.0.flaw == LockFlaw::SetPerKeyDeclaredOneRequest {
                client = client.one_key_at_a_time();
            }
            Ok(FaultyClient::new(Arc::new(client), vec![proxy]).keeping(relay))
        }
        /// A restart keeps the state (the counters are durable) unless data is lost, or the flaw
        /// keeps them in memory; a snapshot is a copy of the state, which a restore brings back.
        async fn restart_server(&self, how: Restart) -> Result<()> {
            let mut slots = self.0.slots.lock().unwrap();
            match how {
                Restart::FromSnapshot => {
                    let saved = self.0.saved.lock().unwrap().clone();
                    *slots = saved.ok_or_else(|| Error::new(ErrorKind::Unavailable, "broken", "no snapshot"))?;
                }
                Restart::LoseData => slots.clear(),
                _ if self.0.flaw == LockFlaw::CounterNotDurable => slots.clear(),
                _ => {
                    if how == Restart::Snapshot {
                        *self.0.saved.lock().unwrap() = Some(slots.clone());
                    }
                }
            }
            // Nobody holds a lock across a restart: the server forgot who did (Redis's keys
            // expire by the same wall-clock, etcd's sessions end with their clients).
            for slot in slots.values_mut() {
                slot.holder = None;
            }
            Ok(())
        }
    }

    // ---------------------------------------------------------------------------------------------
    // A store with one flaw at a time: palisade-broken-store, which the torture's tests use
    // too.

    use palisade_broken_store::{BrokenStore, BrokenStoreClient, StoreFlaw};

    #[derive(Clone)]
    struct BrokenStoreFactory(BrokenStore);

    impl BrokenStoreFactory {
        fn new(flaw: StoreFlaw) -> Self {
            BrokenStoreFactory(BrokenStore::new(flaw))
        }
    }

    #[async_trait]
    impl FencedStoreFactory for BrokenStoreFactory {
        type Store = BrokenStoreClient;
        async fn client(&self) -> Result<Arc<BrokenStoreClient>> {
            Ok(Arc::new(self.0.client()))
        }
    }

    // ---------------------------------------------------------------------------------------------

    fn ctx(name: &'static str) -> Ctx {
        Ctx::new(name, "")
    }

    /// The scenario must fail, and its failure must name `because` (so it failed for the flaw's
    /// reason, not for a broken relay, a failed spawn or a harness bug).
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

    #[tokio::test]
    async fn no_exclusion_fails_mutual_exclusion() {
        lock_flaw_fails(
            LockFlaw::NoExclusion,
            &[
                ("mutual_exclusion", "while another held it"),
                ("owner_only_release_and_extend", "the holder lost the lock"),
                ("progress_gated_renewal", "another client took the lock"),
                ("stale_release_and_extend_after_takeover", "freed the new holder's lock"),
                ("lost_replies_leave_one_live_grant", "a double grant"),
                ("cut_connections_keep_the_grant_or_report_it", "another client got its lock"),
                ("partitioned_holder_loses_before_anyone_gains", "two holders"),
                ("keys_are_independent", "not re-entrant"),
                ("repair_keeps_the_holder", "another client got the lock its holder still holds"),
                ("resent_release_never_frees_a_new_grant", "no exclusion"),
                ("a_set_is_taken_all_or_nothing", "another client holds"),
            ],
            &[
                "overlapping_lock_sets_never_deadlock",
                "lock_all_leaves_no_orphan",
                "waits_are_bounded",
                "expiry_and_takeover",
                "wait_and_handoff",
                "cancelled_acquires_leave_no_residue",
                "fifo_when_declared",
                "fast_client_clock_takes_nothing_early",
                "dead_waiter_is_never_granted",
                // A held lock granted again to a zero-wait attempt: the same missing exclusion.
                "zero_wait_is_one_attempt",
                // The waiter is granted the held lock, so the holder's release finds it gone.
                "acquire_cancelled_as_the_lock_frees",
                // acquire_any takes the first key, held or not.
                "releases_wake_waiters",
                // Another client takes the key the view showed held.
                "view_shows_the_holder",
            ],
        )
        .await;
    }

    #[tokio::test]
    async fn release_ignoring_the_token_fails_owner_only() {
        lock_flaw_fails(
            LockFlaw::ReleaseIgnoresToken,
            &[
                ("owner_only_release_and_extend", "release with a foreign token"),
                ("stale_release_and_extend_after_takeover", "release of the expired grant after a takeover"),
                ("expiry_and_takeover", "release by the expired holder"),
                ("lost_replies_leave_one_live_grant", "bug class 6"),
                ("resent_release_never_frees_a_new_grant", "freed the same client's second grant"),
            ],
            &[],
        )
        .await;
    }

    #[tokio::test]
    async fn a_ttl_that_never_expires_fails_expiry() {
        lock_flaw_fails(
            LockFlaw::NeverExpires,
            &[
                ("expiry_and_takeover", "nobody could take the lock"),
                ("stale_release_and_extend_after_takeover", "never free"),
                ("dropped_client_lets_go", "no expiry at all"),
            ],
            &["fence_monotonicity"],
        )
        .await;
    }

    #[tokio::test]
    async fn a_fence_not_increased_after_expiry_fails_monotonicity_and_the_pause() {
        lock_flaw_fails(
            LockFlaw::FenceNotIncreasedAfterExpiry,
            &[
                ("fence_monotonicity", "not strictly increasing"),
                ("expiry_and_takeover", "not above the expired holder's"),
            ],
            &[],
        )
        .await;
        let f = BrokenLockFactory::new(LockFlaw::FenceNotIncreasedAfterExpiry);
        let outcome =
            e2e::paused_holder_in_process(&ctx("paused_holder_in_process"), &f, &MemoryStoreFactory::new()).await;
        assert_fails_because(outcome, "FenceNotIncreasedAfterExpiry", "is not above A's");
    }

    #[tokio::test]
    async fn an_extend_that_does_nothing_fails_renewal() {
        lock_flaw_fails(
            LockFlaw::ExtendDoesNothing,
            &[
                ("overlapping_lock_sets_never_deadlock", "while the other keys were waited for"),
                ("progress_gated_renewal", "while its holder was making progress"),
                ("partitioned_holder_loses_before_anyone_gains", "two holders"),
            ],
            &[],
        )
        .await;
    }

    #[tokio::test]
    async fn an_acquire_that_never_waits_fails_handoff_and_bad_input() {
        lock_flaw_fails(
            LockFlaw::AcquireNeverWaits,
            &[("wait_and_handoff", "did not get the released lock"), ("bad_input", "above 24 h")],
            &[
                "overlapping_lock_sets_never_deadlock",
                "lock_all_leaves_no_orphan",
                "mutual_exclusion",
                "fence_monotonicity",
                "fifo_when_declared",
                "cancelled_acquires_leave_no_residue",
                "partitioned_holder_loses_before_anyone_gains",
                // Its waiter's acquire answers Timeout at once instead of waiting.
                "acquire_cancelled_as_the_lock_frees",
            ],
        )
        .await;
    }

    #[tokio::test]
    async fn gaps_in_declared_gap_free_fences_fail_monotonicity_and_load() {
        lock_flaw_fails(
            LockFlaw::GapsDeclaredGapFree,
            &[
                ("fence_monotonicity", "declared gap-free"),
                ("lost_replies_leave_one_live_grant", "declared gap-free"),
                ("keys_are_independent", "declared gap-free"),
            ],
            &[],
        )
        .await;
        let f = BrokenLockFactory::new(LockFlaw::GapsDeclaredGapFree);
        assert_fails_because(
            e2e::load(&ctx("load"), &f, &MemoryStoreFactory::new()).await,
            "GapsDeclaredGapFree",
            "gaps",
        );
    }

    #[tokio::test]
    async fn a_store_accepting_lower_fences_fails_the_store_and_pause_scenarios() {
        store_flaw_fails(
            StoreFlaw::AcceptsLowerFence,
            &[
                ("equal_higher_lower", "below watermark 11 gave None"),
                ("stale_batches_of_every_shape", "gave None"),
                ("fence_comparison_matrix", "expected Err(StaleFence"),
                ("watermark_scope", "accepted fence 9"),
                ("atomicity", "a stale multi-operation write gave None"),
                ("multi_write_all_or_nothing", "one stale member"),
            ],
            &["concurrent_interleaved_fences", "store_race"],
        )
        .await;
        let s = BrokenStoreFactory::new(StoreFlaw::AcceptsLowerFence);
        let lf = palisade_conformance::memory::MemoryLockFactory::new();
        assert_fails_because(
            e2e::paused_holder_in_process(&ctx("paused_holder_in_process"), &lf, &s).await,
            "AcceptsLowerFence",
            "stale write gave None",
        );
        assert_fails_because(
            e2e::stale_write_before_new_holder_writes(&ctx("stale_write_before_new_holder_writes"), &lf, &s).await,
            "AcceptsLowerFence",
            "A's write after B's gave Ok",
        );
    }

    /// A store that says it requires a live lock but judges only the fence accepts a write from a
    /// holder whose lock expired, and a write from a holder whose lock was taken over but who
    /// wrote first: both scenarios fail for that reason.
    #[tokio::test]
    async fn a_store_claiming_a_live_lock_it_does_not_check_fails_the_live_lock_scenarios() {
        let s = BrokenStoreFactory::new(StoreFlaw::ClaimsLiveLock);
        let lf = palisade_conformance::memory::MemoryLockFactory::new();
        assert_fails_because(
            e2e::live_lock_when_declared(&ctx("live_lock_when_declared"), &lf, &s).await,
            "ClaimsLiveLock",
            "the expired holder's write gave Ok",
        );
        assert_fails_because(
            e2e::stale_write_before_new_holder_writes(&ctx("stale_write_before_new_holder_writes"), &lf, &s).await,
            "ClaimsLiveLock",
            "A's write while B holds the lock gave Ok",
        );
        // The same store without the claim passes both.
        let honest = BrokenStoreFactory::new(StoreFlaw::None);
        e2e::live_lock_when_declared(&ctx("live_lock_when_declared"), &lf, &honest).await.unwrap();
        e2e::stale_write_before_new_holder_writes(&ctx("stale_write_before_new_holder_writes"), &lf, &honest)
            .await
            .unwrap();
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
    /// Each of `must_fail` must have failed with a message naming its reason, those in `may_fail`
    /// may have failed as a consequence, every other scenario must have passed: the flaw breaks one
    /// guarantee, and the suite says which.
    #[track_caller]
    fn judge(
        flaw: &str,
        outcomes: impl IntoIterator<Item = (&'static str, Outcome)>,
        must_fail: &[(&str, &str)],
        may_fail: &[&str],
    ) {
        for (name, outcome) in outcomes {
            if let Some((_, because)) = must_fail.iter().find(|(n, _)| *n == name) {
                assert_fails_because(outcome, flaw, because);
            } else if let Err(failure) = outcome
                && !may_fail.contains(&name)
            {
                panic!("{flaw} should fail only {must_fail:?} (and maybe {may_fail:?}), but also failed: {failure}");
            }
        }
    }

    /// Returns the failure message, or `None` if the scenario passed (or this is the child).
    fn process_scenario_failure(scenario: &'static str, test: &'static str, lf: BrokenLockFactory) -> Option<String> {
        let name = harness::test_name(module_path!(), test);
        let run = std::panic::catch_unwind(move || {
            harness::run(scenario, &name, |ctx| async move {
                match scenario {
                    "killed_holder" => e2e::killed_holder(&ctx, &lf, &SharedSqlite).await,
                    "semaphore_permit_holder_sigstop" => {
                        palisade_conformance::frozen::semaphore_permit_holder_sigstop(&ctx, &lf, &SharedSqlite).await
                    }
                    _ => e2e::paused_holder_process(&ctx, &lf, &SharedSqlite).await,
                }
            })
        });
        let payload = run.err()?;
        let message = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_string()))
            .unwrap_or_default();
        Some(message)
    }

    #[test]
    fn a_fence_not_increased_after_expiry_fails_the_sigstop_scenario() {
        let failure = process_scenario_failure(
            "paused_holder_process",
            "a_fence_not_increased_after_expiry_fails_the_sigstop_scenario",
            BrokenLockFactory::new(LockFlaw::FenceNotIncreasedAfterExpiry),
        );
        if !palisade_conformance::is_child_process() {
            let failure = failure.expect("the SIGSTOP scenario passed against a broken fence");
            assert!(failure.contains("is not above"), "the SIGSTOP scenario failed, but not for the fence: {failure}");
        }
    }

    /// The frozen permit holder (a process stopped with SIGSTOP) on a service whose fence does not
    /// grow on an expired takeover: the next holder of its slot has its fence.
    #[test]
    fn a_fence_not_increased_after_expiry_fails_the_frozen_permit_holder_scenario() {
        let failure = process_scenario_failure(
            "semaphore_permit_holder_sigstop",
            "a_fence_not_increased_after_expiry_fails_the_frozen_permit_holder_scenario",
            BrokenLockFactory::new(LockFlaw::FenceNotIncreasedAfterExpiry),
        );
        if !palisade_conformance::is_child_process() {
            let failure = failure.expect("the frozen permit holder scenario passed against a broken fence");
            assert!(failure.contains("is not above"), "it failed, but not for the fence: {failure}");
        }
    }

    #[test]
    fn a_ttl_that_never_expires_fails_the_sigkill_scenario() {
        let failure = process_scenario_failure(
            "killed_holder",
            "a_ttl_that_never_expires_fails_the_sigkill_scenario",
            BrokenLockFactory::new(LockFlaw::NeverExpires),
        );
        if !palisade_conformance::is_child_process() {
            let failure = failure.expect("the SIGKILL scenario passed against a lock that never expires");
            assert!(
                failure.contains("was not free within"),
                "the SIGKILL scenario failed, but not for the expiry: {failure}"
            );
        }
    }

    /// Runs every store scenario against one broken store with `flaw`, and [`judge`]s them.
    async fn store_flaw_fails(flaw: StoreFlaw, must_fail: &[(&str, &str)], may_fail: &[&str]) {
        let outcomes = palisade_conformance::store_outcomes(&BrokenStoreFactory::new(flaw)).await;
        judge(&format!("{flaw:?}"), outcomes, must_fail, may_fail);
    }

    /// Runs every store scenario against a broken store served by the store relay, each client
    /// on a connection (and a store client) of its own, as the torture's client processes
    /// reach one, and [`judge`]s them: the relay hides no flaw.
    async fn relayed_store_flaw_fails(flaw: StoreFlaw, must_fail: &[(&str, &str)], may_fail: &[&str]) {
        let relay = StoreRelay::serve(Arc::new(BrokenStoreFactory::new(flaw))).await.unwrap();
        let addr = relay.addr();
        let relayed =
            palisade_conformance::store_factory(move || async move { Ok(Arc::new(RelayStore::connect(addr).await?)) });
        let outcomes = palisade_conformance::store_outcomes(&relayed).await;
        judge(&format!("{flaw:?} through the store relay"), outcomes, must_fail, may_fail);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn broken_stores_fail_the_same_through_the_store_relay() {
        relayed_store_flaw_fails(
            StoreFlaw::AcceptsLowerFence,
            &[
                ("equal_higher_lower", "below watermark 11 gave None"),
                ("fence_comparison_matrix", "expected Err(StaleFence"),
                ("multi_write_all_or_nothing", "one stale member"),
            ],
            &[
                "stale_batches_of_every_shape",
                "watermark_scope",
                "atomicity",
                "concurrent_interleaved_fences",
                "store_race",
            ],
        )
        .await;
        // A client per connection: the watermark kept in the client is seen.
        relayed_store_flaw_fails(
            StoreFlaw::WatermarkInClient,
            &[("watermark_scope", "a new client")],
            &["store_race", "concurrent_interleaved_fences"],
        )
        .await;
        relayed_store_flaw_fails(StoreFlaw::None, &[], &[]).await;
    }

    #[tokio::test]
    async fn a_store_that_checks_then_writes_in_two_steps_fails_the_store_race() {
        store_flaw_fails(
            StoreFlaw::CheckThenWrite,
            &[("store_race", "not one step")],
            &["concurrent_interleaved_fences"],
        )
        .await;
    }

    #[tokio::test]
    async fn a_store_that_checks_only_puts_fails_stale_batches_of_every_shape() {
        store_flaw_fails(StoreFlaw::ChecksOnlyPuts, &[("stale_batches_of_every_shape", "Delete-only")], &[]).await;
    }

    #[tokio::test]
    async fn a_store_with_one_watermark_fails_watermark_scope() {
        store_flaw_fails(
            StoreFlaw::WatermarkPerDomain,
            &[
                ("watermark_scope", "watermarks are per resource"),
                ("equal_higher_lower", "another resource"),
                ("multi_write_all_or_nothing", "one stale member"),
            ],
            &["fence_comparison_matrix"],
        )
        .await;
    }

    #[tokio::test]
    async fn a_store_keeping_watermarks_in_the_client_fails_watermark_scope() {
        store_flaw_fails(
            StoreFlaw::WatermarkInClient,
            &[("watermark_scope", "a new client")],
            &["store_race", "concurrent_interleaved_fences"],
        )
        .await;
    }

    #[tokio::test]
    async fn a_store_accepting_fence_zero_fails_the_comparison_matrix() {
        store_flaw_fails(StoreFlaw::AcceptsZero, &[("fence_comparison_matrix", "fence 0")], &[]).await;
    }

    #[tokio::test]
    async fn a_store_answering_read_many_in_key_order_fails_read_many() {
        store_flaw_fails(
            StoreFlaw::ReadManyInKeyOrder,
            &[("read_many_answers_like_read", "not in the order asked")],
            &[],
        )
        .await;
    }

    #[tokio::test]
    async fn the_broken_store_without_a_flaw_passes_every_store_scenario() {
        // The control: each flaw test fails for its flaw, not for the harness.
        store_flaw_fails(StoreFlaw::None, &[], &[]).await;
    }

    #[tokio::test]
    async fn a_store_judging_only_the_first_fence_fails_the_multi_write() {
        store_flaw_fails(StoreFlaw::ChecksOnlyFirstFence, &[("multi_write_all_or_nothing", "stale member")], &[]).await;
    }

    #[tokio::test]
    async fn a_store_applying_partial_batches_fails_atomicity() {
        store_flaw_fails(
            StoreFlaw::PartialBatch,
            &[("atomicity", "left a partial write"), ("multi_write_all_or_nothing", "failed condition wrote records")],
            &[],
        )
        .await;
    }

    #[tokio::test]
    async fn a_store_reporting_rejections_as_success_fails() {
        store_flaw_fails(
            StoreFlaw::SilentRejection,
            &[
                ("equal_higher_lower", "below watermark 11 gave None"),
                ("stale_batches_of_every_shape", "gave None"),
                ("fence_comparison_matrix", "expected Err(StaleFence"),
                ("watermark_scope", "accepted fence 9"),
                ("concurrent_interleaved_fences", "but the log holds"),
                ("atomicity", "a stale multi-operation write gave None"),
                ("multi_write_all_or_nothing", "one stale member"),
            ],
            &["store_race"],
        )
        .await;
    }

    #[tokio::test]
    async fn a_store_without_validation_fails_bad_input() {
        store_flaw_fails(
            StoreFlaw::NoValidation,
            &[
                ("store_bad_input", "expected InvalidKey"),
                ("read_many_answers_like_read", "expected InvalidKey"),
                ("multi_write_all_or_nothing", "with no fence gave None"),
            ],
            &[],
        )
        .await;
    }

    #[tokio::test]
    async fn a_store_accepting_equal_fences_from_any_grant_fails_the_rule_2_scenarios() {
        store_flaw_fails(
            StoreFlaw::AcceptsEqualFromAnyGrant,
            &[
                ("equal_higher_lower", "from a second grant"),
                ("stale_batches_of_every_shape", "DuplicateFence"),
                ("fence_comparison_matrix", "DuplicateFence"),
                ("multi_write_all_or_nothing", "from another grant"),
            ],
            &[],
        )
        .await;
    }

    /// Runs every in-process lock scenario against one broken service with `flaw`, and [`judge`]s
    /// them.
    async fn lock_flaw_fails(flaw: LockFlaw, must_fail: &[(&str, &str)], may_fail: &[&str]) {
        let outcomes = palisade_conformance::lock_outcomes(&BrokenLockFactory::new(flaw)).await;
        judge(&format!("{flaw:?}"), outcomes, must_fail, may_fail);
    }

    #[tokio::test]
    async fn the_broken_lock_without_a_flaw_passes_every_lock_scenario() {
        lock_flaw_fails(LockFlaw::None, &[], &[]).await;
    }

    #[tokio::test]
    async fn an_extend_that_resurrects_an_expired_grant_fails_the_stale_extend_scenario() {
        lock_flaw_fails(
            LockFlaw::ExtendResurrects,
            &[("stale_release_and_extend_after_takeover", "must not come back to life")],
            &[],
        )
        .await;
    }

    #[tokio::test]
    async fn a_waiter_that_waits_for_the_expiry_fails_the_handoff_bound() {
        lock_flaw_fails(
            LockFlaw::WakesOnlyAtExpiry,
            &[("wait_and_handoff", "missed its wake-up")],
            &["fifo_when_declared"],
        )
        .await;
    }

    #[tokio::test]
    async fn a_service_declaring_native_waiting_whose_waiters_poll_fails_the_wake_up_bound() {
        lock_flaw_fails(
            LockFlaw::NativeDeclaredPolls,
            &[("releases_wake_waiters", "acquire: median handoff")],
            // A poll may come after the hold's first TTL.
            &["wait_and_handoff"],
        )
        .await;
    }

    #[tokio::test]
    async fn a_service_declaring_native_waiting_whose_acquire_any_polls_fails_the_wake_up_bound() {
        lock_flaw_fails(
            LockFlaw::NativeDeclaredAnyPolls,
            &[("releases_wake_waiters", "acquire_any (one of three keys released): median handoff")],
            &[],
        )
        .await;
    }

    #[tokio::test]
    async fn a_view_that_shows_the_last_grant_fails_the_view_scenario() {
        lock_flaw_fails(LockFlaw::ViewKeepsTheLastHolder, &[("view_shows_the_holder", "still shows a holder")], &[])
            .await;
    }

    #[tokio::test]
    async fn a_factory_without_a_view_fails_the_view_scenario_naming_the_hook() {
        lock_flaw_fails(LockFlaw::NoView, &[("view_shows_the_holder", "provides no `view`")], &[]).await;
    }

    #[tokio::test]
    async fn a_cancelled_waiter_that_keeps_its_place_fails_the_cancellation_scenario() {
        lock_flaw_fails(
            LockFlaw::CancelLeaksReservation,
            &[
                ("cancelled_acquires_leave_no_residue", "left residue"),
                // The waiter cancelled before the release keeps its place for good as well.
                ("acquire_cancelled_as_the_lock_frees", "that nobody owns"),
            ],
            &[],
        )
        .await;
    }

    #[tokio::test]
    async fn newest_first_declared_fifo_fails_the_fifo_scenario() {
        lock_flaw_fails(
            LockFlaw::NewestWaiterFirstDeclaredFifo,
            &[("fifo_when_declared", "declared FIFO")],
            // It declares native waiting but leaves acquire_any to the trait's default, which polls.
            &["releases_wake_waiters"],
        )
        .await;
    }

    #[tokio::test]
    async fn an_unexplained_expiry_margin_fails_the_timing_check() {
        lock_flaw_fails(LockFlaw::UnexplainedMargin, &[("declared_timing_is_explained", "is not explained")], &[])
            .await;
    }

    #[tokio::test]
    async fn a_client_resending_a_lost_acquire_as_a_new_request_fails_the_lost_reply_scenario() {
        let outcomes = palisade_conformance::lock_outcomes(&BrokenLockFactory::retrying(RelayRetry::NewRequest)).await;
        judge(
            "resend as a new request",
            outcomes,
            &[
                ("lost_replies_leave_one_live_grant", "its own first attempt holds"),
                ("lock_all_leaves_no_orphan", "an orphan"),
            ],
            // Its leftovers keep later sets waiting.
            &["overlapping_lock_sets_never_deadlock"],
        );
    }

    #[tokio::test]
    async fn a_release_resent_below_the_service_as_a_new_request_fails_the_lost_reply_scenario() {
        let outcomes =
            palisade_conformance::lock_outcomes(&BrokenLockFactory::retrying(RelayRetry::NewReleaseRequest)).await;
        judge(
            "release resent as a new request",
            outcomes,
            &[("lost_replies_leave_one_live_grant", "answered NotHolder")],
            &[],
        );
    }

    #[tokio::test]
    async fn a_client_giving_up_on_a_lost_acquire_reply_fails_the_lost_reply_scenario() {
        let outcomes = palisade_conformance::lock_outcomes(&BrokenLockFactory::retrying(RelayRetry::Never)).await;
        // It does not reconnect either: the first call after a cut connection is lost too.
        judge(
            "no resend",
            outcomes,
            &[("lost_replies_leave_one_live_grant", "an orphaned grant"), ("lock_all_leaves_no_orphan", "an orphan")],
            &["cut_connections_keep_the_grant_or_report_it"],
        );
    }

    #[tokio::test]
    async fn a_grant_overstating_its_ttl_fails_the_partition_scenario() {
        lock_flaw_fails(
            LockFlaw::OverstatesTtl,
            &[("partitioned_holder_loses_before_anyone_gains", "two holders")],
            &["overlapping_lock_sets_never_deadlock", "expiry_and_takeover", "progress_gated_renewal"],
        )
        .await;
    }

    #[tokio::test]
    async fn a_counter_deleted_with_the_lock_fails_fence_monotonicity() {
        lock_flaw_fails(
            LockFlaw::CounterDeletedWithLock,
            &[
                ("fence_monotonicity", "not strictly increasing"),
                ("keys_are_independent", "not increasing"),
                ("lost_replies_leave_one_live_grant", "not increasing"),
                ("repair_keeps_the_holder", "is not above the repair's floor"),
                ("idle_key_keeps_its_counter", "forgotten with the idle key"),
                ("resent_release_never_frees_a_new_grant", "is not above the first's"),
                ("a_set_is_taken_all_or_nothing", "not above the"),
            ],
            &[],
        )
        .await;
    }

    #[tokio::test]
    async fn a_repair_that_moves_the_holders_fence_fails_the_repair_scenario() {
        lock_flaw_fails(
            LockFlaw::RepairStrandsTheHolder,
            &[("repair_keeps_the_holder", "the repair stranded the holder: its extend after advance_fence gave")],
            &[],
        )
        .await;
    }

    #[tokio::test]
    async fn a_wait_that_ignores_its_bound_fails_the_bounded_wait_scenario() {
        lock_flaw_fails(
            LockFlaw::WaitIgnoresItsBound,
            &[("waits_are_bounded", "it ignored its wait")],
            // wait_and_handoff checks a wait that runs out as well.
            &[
                "lock_all_leaves_no_orphan",
                "wait_and_handoff",
                "cancelled_acquires_leave_no_residue",
                "with_lock_releases_on_every_path",
                "bad_input",
            ],
        )
        .await;
    }

    #[tokio::test]
    async fn a_keep_alive_nothing_stops_fails_the_dropped_client_scenario() {
        lock_flaw_fails(
            LockFlaw::RenewsForever,
            &[
                ("dropped_client_lets_go", "bug class 14"),
                ("progress_gated_renewal", "stalled holder still had the lock"),
            ],
            &[
                "expiry_and_takeover",
                "stale_release_and_extend_after_takeover",
                "fence_monotonicity",
                "partitioned_holder_loses_before_anyone_gains",
            ],
        )
        .await;
    }

    #[tokio::test]
    async fn expiry_by_the_client_clock_fails_the_clock_scenario() {
        lock_flaw_fails(LockFlaw::ClientClockExpiry, &[("fast_client_clock_takes_nothing_early", "bug class 9")], &[])
            .await;
    }

    /// The restart scenario (shape `restart`, not in `lock_outcomes`) on a broken lock.
    async fn restart_outcome(flaw: LockFlaw) -> Outcome {
        let name = "fences_survive_restart_or_are_repaired";
        let (lf, sf) = (BrokenLockFactory::new(flaw), MemoryStoreFactory::new());
        palisade_conformance::lock::fences_survive_restart_or_are_repaired(&ctx(name), &lf, &sf).await
    }

    #[tokio::test]
    async fn the_broken_lock_without_a_flaw_keeps_and_repairs_fences_across_restarts() {
        restart_outcome(LockFlaw::None).await.unwrap();
    }

    #[tokio::test]
    async fn a_counter_that_cannot_be_moved_fails_the_restart_scenario() {
        assert_fails_because(restart_outcome(LockFlaw::CannotAdvance).await, "CannotAdvance", "until an operator acts");
    }

    #[tokio::test]
    async fn a_repair_of_missing_counters_only_fails_the_restore_from_a_snapshot() {
        assert_fails_because(
            restart_outcome(LockFlaw::RepairsOnlyAMissingCounter).await,
            "RepairsOnlyAMissingCounter",
            "after a restore from an older snapshot lock_checked refused key `written`",
        );
    }

    #[tokio::test]
    async fn counters_in_memory_declared_durable_fail_the_restart_scenario() {
        assert_fails_because(restart_outcome(LockFlaw::CounterNotDurable).await, "CounterNotDurable", "bug class 4");
    }

    #[tokio::test]
    async fn an_extend_that_recreates_a_deleted_lock_fails_the_lost_signal_scenario() {
        lock_flaw_fails(
            LockFlaw::ExtendRecreates,
            &[
                ("lost_signal_from_the_backend", "had not fired"),
                ("owner_only_release_and_extend", "extend after release"),
            ],
            &[],
        )
        .await;
    }

    // ---------------------------------------------------------------------------------------------
    // A quorum lock over five in-memory services (Redlock's shape), with one flaw at a time.

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum QuorumFlaw {
        /// None: the control.
        None,
        /// Grants when any one server said yes (bug class 17: a minority counted as success).
        MinorityCounts,
        /// A failed round leaves its partial grants in place (bug class 17: no rollback).
        NoRollback,
    }

    type Node = Arc<dyn LockService<Fencing = Fenced>>;

    /// Whose each server's grant is: the quorum grant's id by the server grant's id, shared by
    /// a factory's clients and its view (as one token on every master shows it in Redlock).
    type Owners = Arc<Mutex<HashMap<palisade_core::GrantId, palisade_core::GrantId>>>;

    struct Quorum {
        flaw: QuorumFlaw,
        nodes: Vec<Node>,
        /// Each grant's per-server grants, by the quorum grant's token.
        held: Mutex<HashMap<OwnerToken, Vec<Option<Grant<Fenced>>>>>,
        owners: Owners,
    }

    const NODE_TIMEOUT: Duration = Duration::from_millis(100);

    impl Quorum {
        fn majority(&self) -> usize {
            self.nodes.len() / 2 + 1
        }

        async fn on_each<T, Fut>(&self, op: impl Fn(usize, Node) -> Fut) -> Vec<Option<T>>
        where
            Fut: std::future::Future<Output = Result<T>>,
        {
            let mut out = Vec::new();
            for (i, node) in self.nodes.iter().enumerate() {
                out.push(tokio::time::timeout(NODE_TIMEOUT, op(i, Arc::clone(node))).await.ok().and_then(Result::ok));
            }
            out
        }

        /// Releases the grants on their servers; how many servers still held them.
        async fn release_all(&self, grants: &[Option<Grant<Fenced>>]) -> usize {
            let mut released = 0;
            for (node, grant) in self.nodes.iter().zip(grants) {
                if let Some(g) = grant
                    && let Ok(Ok(())) = tokio::time::timeout(NODE_TIMEOUT, node.release(g)).await
                {
                    released += 1;
                }
            }
            released
        }
    }

    #[async_trait]
    impl LockService for Quorum {
        type Fencing = palisade_core::Unfenced;

        fn backend(&self) -> &'static str {
            "broken-quorum"
        }

        fn capabilities(&self) -> Capabilities {
            Capabilities {
                fence_source: FenceSource::None,
                replication: palisade_core::Replication::ClientMajority,
                ..Capabilities::default()
            }
        }

        async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<palisade_core::Unfenced>>> {
            let requested_at = Instant::now();
            // Each server's answer is awaited for the node timeout; one that comes later (held up
            // by a partition) is released by its own task, unless the flaw forgets rollbacks.
            let mut answers = Vec::new();
            for node in &self.nodes {
                let (tx, rx) = tokio::sync::oneshot::channel();
                let (node, key, forget) = (Arc::clone(node), key.clone(), self.flaw == QuorumFlaw::NoRollback);
                tokio::spawn(async move {
                    if let Err(Ok(Some(late))) = tx.send(node.try_acquire(&key, ttl).await)
                        && !forget
                    {
                        let _ = node.release(&late).await;
                    }
                });
                answers.push(rx);
            }
            let mut grants: Vec<Option<Grant<Fenced>>> = Vec::new();
            for rx in answers {
                let answer = tokio::time::timeout_at(requested_at + NODE_TIMEOUT, rx).await;
                grants.push(answer.ok().and_then(|r| r.ok()).and_then(|r| r.ok()).flatten());
            }
            let yes = grants.iter().filter(|g| g.is_some()).count();
            let needed = if self.flaw == QuorumFlaw::MinorityCounts { 1 } else { self.majority() };
            if yes >= needed {
                let token = OwnerToken::generate()?;
                let mut owners = self.owners.lock().unwrap();
                for grant in grants.iter().flatten() {
                    owners.insert(grant.grant_id(), palisade_core::GrantId::of(&token));
                }
                drop(owners);
                self.held.lock().unwrap().insert(token, grants);
                return Ok(Some(Grant::new(key.clone(), token, (), ttl, requested_at)));
            }
            if self.flaw != QuorumFlaw::NoRollback {
                let _ = self.release_all(&grants).await;
            }
            Ok(None)
        }

        async fn extend(&self, grant: &Grant<palisade_core::Unfenced>, ttl: Ttl) -> Result<Ttl> {
            let grants = self.held.lock().unwrap().get(&grant.token()).cloned();
            let Some(grants) = grants else {
                return Err(Error::new(ErrorKind::NotHolder, "broken-quorum", "not held"));
            };
            let extended = self
                .on_each(|i, node| {
                    let g = grants[i].clone();
                    async move {
                        match g {
                            Some(g) => node.extend(&g, ttl).await,
                            None => Err(Error::new(ErrorKind::NotHolder, "broken-quorum", "no grant here")),
                        }
                    }
                })
                .await;
            if extended.iter().filter(|e| e.is_some()).count() >= self.majority() {
                Ok(ttl)
            } else {
                Err(Error::new(ErrorKind::NotHolder, "broken-quorum", "no majority extended"))
            }
        }

        async fn release(&self, grant: &Grant<palisade_core::Unfenced>) -> Result<()> {
            let grants = self.held.lock().unwrap().remove(&grant.token());
            let Some(grants) = grants else {
                return Err(Error::new(ErrorKind::NotHolder, "broken-quorum", "not held"));
            };
            if self.release_all(&grants).await > 0 {
                Ok(())
            } else {
                Err(Error::new(ErrorKind::NotHolder, "broken-quorum", "no server held it any more"))
            }
        }
    }

    /// Clients of one quorum of five in-memory services; the faulty client reaches each service
    /// over the relay through a fault proxy of its own.
    struct QuorumFactory {
        flaw: QuorumFlaw,
        services: Vec<Arc<palisade_core::MemoryLockService>>,
        owners: Owners,
    }

    impl QuorumFactory {
        fn new(flaw: QuorumFlaw) -> Self {
            QuorumFactory {
                flaw,
                services: (0..5).map(|_| Arc::new(palisade_core::MemoryLockService::new())).collect(),
                owners: Owners::default(),
            }
        }

        fn quorum(&self, nodes: Vec<Node>) -> Quorum {
            Quorum { flaw: self.flaw, nodes, held: Mutex::default(), owners: Arc::clone(&self.owners) }
        }
    }

    /// The quorum's read-only view: the holder is the quorum grant whose server grants a
    /// majority of the servers show.
    struct QuorumView {
        services: Vec<Arc<palisade_core::MemoryLockService>>,
        owners: Owners,
    }

    #[async_trait]
    impl palisade_core::InspectLocks for QuorumView {
        fn backend(&self) -> &'static str {
            "broken-quorum"
        }

        async fn resources(&self, prefix: &str) -> Result<palisade_core::Listing<ResourceKey>> {
            let mut names = Vec::new();
            for service in &self.services {
                let listed = palisade_core::InspectLocks::resources(&**service, prefix).await?;
                names.extend(listed.entries.iter().map(ToString::to_string));
            }
            Ok(palisade_core::Listing::of_names(names.iter().map(String::as_str)))
        }

        async fn lock_view(&self, key: &ResourceKey) -> Result<palisade_core::LockView> {
            let mut shown: HashMap<palisade_core::GrantId, usize> = HashMap::new();
            for service in &self.services {
                if let Some(holder) = palisade_core::InspectLocks::lock_view(&**service, key).await?.holder
                    && let Some(owner) = self.owners.lock().unwrap().get(&holder.grant)
                {
                    *shown.entry(*owner).or_default() += 1;
                }
            }
            let view = palisade_core::LockView::free(key.clone());
            Ok(match shown.into_iter().find(|(_, n)| *n > self.services.len() / 2) {
                Some((owner, _)) => view.held_by(palisade_core::HolderView::new(owner, None, None)),
                None => view,
            })
        }
    }

    #[async_trait]
    impl LockServiceFactory for QuorumFactory {
        type Service = Quorum;
        async fn client(&self) -> Result<Arc<Quorum>> {
            Ok(Arc::new(self.quorum(self.services.iter().map(|s| Arc::clone(s) as Node).collect())))
        }
        fn timing(&self) -> Timing {
            Timing::new(Duration::from_millis(500), Duration::from_millis(50))
        }
        fn process_access(&self) -> ProcessAccess {
            ProcessAccess::Relay
        }
        /// The lock deleted on every server, as an operator flushing them would.
        async fn break_lock(&self, key: &ResourceKey) -> Result<()> {
            for service in &self.services {
                service.break_lock(key);
            }
            Ok(())
        }
        async fn view(&self) -> Result<Arc<dyn palisade_core::InspectLocks>> {
            Ok(Arc::new(QuorumView { services: self.services.clone(), owners: Arc::clone(&self.owners) }))
        }
        async fn faulty_client(&self) -> Result<FaultyClient<palisade_core::Unfenced>> {
            let (mut nodes, mut proxies, mut relays) = (Vec::new(), Vec::new(), Vec::new());
            for service in &self.services {
                let relay = Relay::serve(Arc::clone(service)).await?;
                let proxy = FaultProxy::start(relay.addr()).await?;
                nodes
                    .push(Arc::new(RelayLockService::<Fenced>::connect(proxy.addr(), service.capabilities()).await?)
                        as Node);
                proxies.push(proxy);
                relays.push(relay);
            }
            Ok(FaultyClient::new(Arc::new(self.quorum(nodes)), proxies).keeping(relays))
        }
    }

    /// Runs every lock scenario against the quorum with `flaw`, and [`judge`]s them.
    async fn quorum_flaw_fails(flaw: QuorumFlaw, must_fail: &[(&str, &str)]) {
        // A quorum that counts a minority as success may also let a healed holder's extend succeed
        // on the minority that still has its grant: that is the same flaw, seen by the partition
        // scenario when the new holder's majority left one of the old holder's servers alone.
        let may_fail: &[&str] =
            if flaw == QuorumFlaw::MinorityCounts { &["partitioned_holder_loses_before_anyone_gains"] } else { &[] };
        let outcomes = palisade_conformance::lock_outcomes(&QuorumFactory::new(flaw)).await;
        judge(&format!("{flaw:?}"), outcomes, must_fail, may_fail);
    }

    #[tokio::test]
    async fn the_quorum_without_a_flaw_passes_every_lock_scenario() {
        quorum_flaw_fails(QuorumFlaw::None, &[]).await;
    }

    #[tokio::test]
    async fn a_quorum_counting_a_minority_fails_the_quorum_scenario() {
        quorum_flaw_fails(
            QuorumFlaw::MinorityCounts,
            &[("quorum_faults_never_grant_a_minority", "a minority counted as a quorum")],
        )
        .await;
    }

    #[tokio::test]
    async fn a_quorum_without_rollback_fails_the_quorum_scenario() {
        // Replies slower than the node timeout fail the acquire too, and its partial grants stay.
        quorum_flaw_fails(
            QuorumFlaw::NoRollback,
            &[
                ("quorum_faults_never_grant_a_minority", "not rolled back"),
                ("slow_replies_still_complete", "an orphaned grant"),
            ],
        )
        .await;
    }

    #[tokio::test]
    async fn a_set_sent_key_by_key_while_declared_one_request_fails_the_set_scenario() {
        lock_flaw_fails(
            LockFlaw::SetPerKeyDeclaredOneRequest,
            &[("a_set_is_taken_all_or_nothing", "free keys sent")],
            &[],
        )
        .await;
    }

    #[tokio::test]
    async fn a_set_that_keeps_its_taken_members_fails_the_set_scenario() {
        lock_flaw_fails(
            LockFlaw::SetKeepsTakenMembers,
            &[("a_set_is_taken_all_or_nothing", "not all or nothing"), ("lock_all_leaves_no_orphan", "an orphan")],
            // Its leftovers keep later sets waiting.
            &["overlapping_lock_sets_never_deadlock"],
        )
        .await;
    }

    #[tokio::test]
    async fn a_zero_wait_that_stays_queued_fails_the_zero_wait_scenario() {
        lock_flaw_fails(LockFlaw::ZeroWaitStaysQueued, &[("zero_wait_is_one_attempt", "left a queue entry")], &[])
            .await;
    }

    /// The semaphore scenarios on broken lock services: a service without exclusion gives more
    /// holders than permits, one whose fence does not grow on an expired takeover gives the
    /// paused permit holder's slot to the next holder with the same fence, and one that declares
    /// FIFO but serves the newest waiter first serves a queued semaphore's waiters out of order.
    /// The flawless control passes all three.
    #[tokio::test]
    async fn broken_locks_fail_the_semaphore_scenarios() {
        use palisade_conformance::semaphore;
        let store = BrokenStoreFactory::new(StoreFlaw::None);
        assert_fails_because(
            semaphore::semaphore_count_limit(
                &ctx("semaphore_count_limit"),
                &BrokenLockFactory::new(LockFlaw::NoExclusion),
            )
            .await,
            "NoExclusion",
            "count limit broken",
        );
        assert_fails_because(
            semaphore::semaphore_stale_permit_refused(
                &ctx("semaphore_stale_permit_refused"),
                &BrokenLockFactory::new(LockFlaw::FenceNotIncreasedAfterExpiry),
                &store,
            )
            .await,
            "FenceNotIncreasedAfterExpiry",
            "after A's",
        );
        assert_fails_because(
            semaphore::semaphore_fifo_when_declared(
                &ctx("semaphore_fifo_when_declared"),
                &BrokenLockFactory::new(LockFlaw::NewestWaiterFirstDeclaredFifo),
            )
            .await,
            "NewestWaiterFirstDeclaredFifo",
            "declares FIFO",
        );
        let control = BrokenLockFactory::new(LockFlaw::None);
        semaphore::semaphore_fifo_when_declared(&ctx("semaphore_fifo_when_declared"), &control).await.unwrap();
        semaphore::semaphore_count_limit(&ctx("semaphore_count_limit"), &control).await.unwrap();
        semaphore::semaphore_stale_permit_refused(&ctx("semaphore_stale_permit_refused"), &control, &store)
            .await
            .unwrap();
    }

    /// The election scenario on broken lock services: without a fence that grows on an expired
    /// takeover the new leader's term is not above the frozen one's; without exclusion the second
    /// campaign does not wait for the first leader. The flawless control passes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn broken_locks_fail_the_election_scenario() {
        use palisade_conformance::election;
        let store = BrokenStoreFactory::new(StoreFlaw::None);
        assert_fails_because(
            election::election_frozen_leader_is_deposed(
                &ctx("election_frozen_leader_is_deposed"),
                &BrokenLockFactory::new(LockFlaw::FenceNotIncreasedAfterExpiry),
                &store,
            )
            .await,
            "FenceNotIncreasedAfterExpiry",
            "is not above A's",
        );
        assert_fails_because(
            election::election_frozen_leader_is_deposed(
                &ctx("election_frozen_leader_is_deposed"),
                &BrokenLockFactory::new(LockFlaw::NoExclusion),
                &store,
            )
            .await,
            "NoExclusion",
            "expected Timeout",
        );
        let control = BrokenLockFactory::new(LockFlaw::None);
        election::election_frozen_leader_is_deposed(&ctx("election_frozen_leader_is_deposed"), &control, &store)
            .await
            .unwrap();
    }

    /// The read-write lock scenarios on broken lock services: without exclusion a writer shares
    /// the lock with readers (or another writer); with a fence that does not grow on an expired
    /// takeover, the reader entering after a stale writer presents the writer's own fence, which
    /// the store refuses as issued twice. The flawless control passes both.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn broken_locks_fail_the_rwlock_scenarios() {
        use palisade_conformance::rwlock;
        let store = BrokenStoreFactory::new(StoreFlaw::None);
        assert_fails_because(
            rwlock::rwlock_readers_share_writers_exclude(
                &ctx("rwlock_readers_share_writers_exclude"),
                &BrokenLockFactory::new(LockFlaw::NoExclusion),
                &store,
            )
            .await,
            "NoExclusion",
            "at once",
        );
        assert_fails_because(
            rwlock::rwlock_stale_holders_refused(
                &ctx("rwlock_stale_holders_refused"),
                &BrokenLockFactory::new(LockFlaw::FenceNotIncreasedAfterExpiry),
                &store,
            )
            .await,
            "FenceNotIncreasedAfterExpiry",
            "issued it twice",
        );
        let control = BrokenLockFactory::new(LockFlaw::None);
        rwlock::rwlock_readers_share_writers_exclude(&ctx("rwlock_readers_share_writers_exclude"), &control, &store)
            .await
            .unwrap();
        rwlock::rwlock_stale_holders_refused(&ctx("rwlock_stale_holders_refused"), &control, &store).await.unwrap();
    }

    /// A counter that expires once its key has been free for two TTLs survives every release and
    /// takeover the other scenarios make, and is gone after the idle time.
    #[tokio::test]
    async fn a_counter_forgotten_when_the_key_idles_fails_the_idle_key_scenario() {
        lock_flaw_fails(
            LockFlaw::CounterForgottenWhenIdle,
            &[("idle_key_keeps_its_counter", "the counter was forgotten with the idle key")],
            &[],
        )
        .await;
    }

    #[tokio::test]
    async fn an_owner_token_per_client_fails_the_resent_release_scenario() {
        lock_flaw_fails(
            LockFlaw::TokenPerClient,
            &[("resent_release_never_frees_a_new_grant", "the owner token is the client's")],
            &[],
        )
        .await;
    }

    /// The lost-signal scenario passed this service before it compared the loss with the lease's
    /// own deadline: the watchdog fired at a deadline the service's "success" had moved.
    #[tokio::test]
    async fn an_extend_answering_success_for_a_deleted_lock_fails_the_lost_signal_scenario() {
        lock_flaw_fails(
            LockFlaw::ExtendAnswersWhatIsLeft,
            &[
                ("lost_signal_from_the_backend", "the service never reported the loss"),
                ("owner_only_release_and_extend", "extend after release"),
            ],
            &[],
        )
        .await;
    }

    #[tokio::test]
    async fn a_cancelled_acquire_whose_grant_lives_on_fails_the_cancel_scenario() {
        lock_flaw_fails(
            LockFlaw::CancelledGrantKeptAlive,
            &[("acquire_cancelled_as_the_lock_frees", "that nobody owns")],
            &[],
        )
        .await;
    }

    #[tokio::test]
    async fn a_zero_wait_that_blocks_on_a_held_lock_fails_the_bounded_wait_scenarios() {
        lock_flaw_fails(
            LockFlaw::ZeroWaitBlocks,
            &[
                ("waits_are_bounded", "it waited"),
                ("zero_wait_is_one_attempt", "it waited instead of making one attempt"),
            ],
            // A probe of a held lock blocks past its holder's grant (4 × 200 ms in most scenarios)
            // and comes back with the lock: the scenarios that probe then see a second holder, or
            // a holder that can no longer renew.
            &[
                "lock_all_leaves_no_orphan",
                "overlapping_lock_sets_never_deadlock",
                "owner_only_release_and_extend",
                "progress_gated_renewal",
                "keys_are_independent",
                "stale_release_and_extend_after_takeover",
                "lost_replies_leave_one_live_grant",
                "cut_connections_keep_the_grant_or_report_it",
                "partitioned_holder_loses_before_anyone_gains",
                "fast_client_clock_takes_nothing_early",
                "repair_keeps_the_holder",
                "resent_release_never_frees_a_new_grant",
                // The zero-wait round blocks until its first key comes free, then takes it.
                "releases_wake_waiters",
                // So does a set's try_acquire of its held member.
                "a_set_is_taken_all_or_nothing",
                // And the view scenario's probe of the held key, after the view.
                "view_shows_the_holder",
            ],
        )
        .await;
    }

    /// The duplicate-fence repair (a primitive-shaped scenario, not in `lock_outcomes`) on a
    /// broken lock, with the memory store.
    async fn duplicate_repair_outcome(flaw: LockFlaw) -> Outcome {
        let name = "duplicate_fence_repair_keeps_the_holder";
        let (lf, sf) = (BrokenLockFactory::new(flaw), MemoryStoreFactory::new());
        palisade_conformance::liveness::duplicate_fence_repair_keeps_the_holder(&ctx(name), &lf, &sf).await
    }

    #[tokio::test]
    async fn the_broken_lock_without_a_flaw_keeps_the_holder_through_a_duplicate_fence_repair() {
        duplicate_repair_outcome(LockFlaw::None).await.unwrap();
    }

    #[tokio::test]
    async fn a_repair_that_moves_the_holders_fence_fails_the_duplicate_fence_repair_scenario() {
        assert_fails_because(
            duplicate_repair_outcome(LockFlaw::RepairStrandsTheHolder).await,
            "RepairStrandsTheHolder",
            "the holder's extend after the repair",
        );
    }
}
