//! # palisade-conformance
//!
//! The scenarios every Palisade lock service and fenced store must pass, as a library. A
//! backend author runs them with one line:
//!
//! ```
//! // In a test file, e.g. tests/conformance.rs, with your own factories in place of these:
//! use palisade_conformance::memory::{MemoryLockFactory, MemoryStoreFactory};
//!
//! palisade_conformance::lock_service_suite!(MemoryLockFactory::new());
//! palisade_conformance::fenced_store_suite!(MemoryStoreFactory::new());
//! // end_to_end_suite!(MyLockFactory::new(), MyStoreFactory::new()) pairs a service with a
//! // store that a child process can reach too (a server, or a file such as SQLite's).
//! # fn main() {}
//! ```
//!
//! Each macro stamps out one `#[test]` per scenario (in a module named after the suite), so a
//! failure names the scenario and the guarantee it checks. The factory expression is evaluated
//! inside each scenario's own runtime and hands out **independent clients** (their own
//! connection or session) of one backend; every scenario works in a fresh random
//! [`Namespace`]. A factory declares its [`Timing`] (the TTL to use and how long the backend
//! may take to notice expiry) and, for in-process services, that a child process must reach
//! it through the loopback [`relay`]. Capabilities come from the service itself.
//!
//! Nothing is skipped for lack of a server: a backend's test reads its server's address with
//! [`require_env`], which fails when the variable is missing. Scenarios that do not apply to a
//! service (a service without fences) assert the documented refusal instead.
//!
//! ## Scenarios
//!
//! | # | scenario | suite | the guarantee it checks |
//! |---|---|---|---|
//! | 1 | [`mutual_exclusion`](lock::mutual_exclusion) | lock | at most one holder; no lost update in the critical section |
//! | 2 | [`owner_only_release_and_extend`](lock::owner_only_release_and_extend) | lock | a foreign token cannot release or extend; no double release |
//! | 3 | [`expiry_and_takeover`](lock::expiry_and_takeover) | lock | a silent holder loses the lock after TTL (+ margin), not before; lost signal fired |
//! | 4 | [`fence_monotonicity`](lock::fence_monotonicity) | lock | fences strictly increase across release, expiry, takeover; gap-free if declared |
//! | 5 | [`progress_gated_renewal`](lock::progress_gated_renewal) | lock | progress keeps the lease past 3 TTLs; a stall loses it within TTL + margin |
//! | 6 | [`wait_and_handoff`](lock::wait_and_handoff) | lock | a waiter gets a released lock within one TTL; `Timeout` otherwise; handoff latency reported |
//! | 7 | [`bad_input`](lock::bad_input) | lock | bad keys, TTLs and waits are typed errors |
//! | – | [`zero_wait_is_one_attempt`](lock::zero_wait_is_one_attempt) | lock | a zero wait takes a free lock, answers `Timeout` at once on a held one, and leaves nothing queued |
//! | – | [`with_lock_releases_on_every_path`](lock::with_lock_releases_on_every_path) | lock | `with_lock` releases after success and error, refuses re-entry at once, cancels its work when the lease is lost |
//! | – | [`keys_are_independent`](lock::keys_are_independent) | lock | keys differing in case, prefix, domain or at the maximum length do not collide; no re-entrant grant; per-key counters |
//! | – | [`stale_release_and_extend_after_takeover`](lock::stale_release_and_extend_after_takeover) | lock | the service refuses release/extend of an expired grant; no resurrection |
//! | – | [`cancelled_acquires_leave_no_residue`](lock::cancelled_acquires_leave_no_residue) | lock | cancelled waiters block nobody |
//! | – | [`fifo_when_declared`](lock::fifo_when_declared) | lock | declared FIFO waiting is FIFO |
//! | – | [`declared_timing_is_explained`](lock::declared_timing_is_explained) | lock | the factory's expiry margin is explained by the declared expiry delay |
//! | – | [`lost_signal_from_the_backend`](lock::lost_signal_from_the_backend) | lock | a lock deleted on the server fires the holder's lost signal before its local deadline |
//! | – | [`lost_replies_leave_one_live_grant`](lock::lost_replies_leave_one_live_grant) | lock | a reply lost after the server applied acquire, release or extend leaves one live, releasable grant or none; a repeated release never frees the next holder |
//! | – | [`cut_connections_keep_the_grant_or_report_it`](lock::cut_connections_keep_the_grant_or_report_it) | lock | after every connection is cut the holder still holds (and nobody else does) or is told it lost the lock |
//! | – | [`partitioned_holder_loses_before_anyone_gains`](lock::partitioned_holder_loses_before_anyone_gains) | lock | a holder partitioned from the service is lost (`safe_until` past) before another client is granted the lock |
//! | – | [`quorum_faults_never_grant_a_minority`](lock::quorum_faults_never_grant_a_minority) | lock | over several servers: no grant from a minority, partial grants rolled back, a minority down still grants |
//! | – | [`dropped_client_lets_go`](lock::dropped_client_lets_go) | lock | a client dropped while holding lets the lock go within TTL + margin: nothing keeps renewing it |
//! | – | [`fast_client_clock_takes_nothing_early`](lock::fast_client_clock_takes_nothing_early) | lock | a client whose clock runs ten TTLs ahead cannot take a held lock |
//! | – | [`dead_waiter_is_never_granted`](lock::dead_waiter_is_never_granted) | lock | a waiter cut off past its session neither blocks the lock nor comes back holding it |
//! | – | [`repair_keeps_the_holder`](lock::repair_keeps_the_holder) | lock | a repair (`advance_fence`) while the lock is held leaves the holder holding, extending and releasing it |
//! | – | [`waits_are_bounded`](lock::waits_are_bounded) | lock | on a held lock a zero wait answers within a few round trips, a 300 ms wait soon after 300 ms |
//! | – | [`primitive_keys_are_their_own`](semaphore::primitive_keys_are_their_own) | semaphore | a semaphore's slots and queue and a read-write lock's reader slots are keys no user can name: user mutexes on `<id>.queue`, `<id>.permit-0` block nothing |
//! | – | [`primitives_enter_over_a_slow_service`](primitives::primitives_enter_over_a_slow_service) | rwlock | over a [`latency::SlowLockService`] (5 ms per operation, 128 slots): RwLock write/read, Semaphore plain/queued and Election enter within a bound derived from their operations |
//! | – | [`slow_replies_still_complete`](lock::slow_replies_still_complete) | lock | with every reply 1.5 s late, acquire, extend and release succeed (a resend never turns a release into `NotHolder`) and the lock is free at once |
//! | – | [`fences_survive_restart_or_are_repaired`](lock::fences_survive_restart_or_are_repaired) | restart | fences grow across a restart with data when declared; after a data loss `lock_checked` moves the counter on or refuses |
//! | 8 | [`equal_higher_lower`](store::equal_higher_lower) | store | equal fence accepted from the same grant, refused from another; higher raises the watermark; lower refused; data untouched |
//! | 9 | [`concurrent_interleaved_fences`](store::concurrent_interleaved_fences) | store | concurrent scrambled fences: exactly the writes ≥ the watermark land |
//! | 10 | [`atomicity`](store::atomicity) | store | multi-operation writes are all or nothing; conditions see the state before the batch |
//! | – | [`store_bad_input`](store::store_bad_input) | store | malformed batches refused; unfenced writes keep watermarks |
//! | – | [`stale_batches_of_every_shape`](store::stale_batches_of_every_shape) | store | stale Delete-only, Create-only, Check-only and empty batches refused too |
//! | – | [`fence_comparison_matrix`](store::fence_comparison_matrix) | store | w−1, w, w+1 × same/other grant; the watermark never decreases; fence 0 refused |
//! | – | [`watermark_scope`](store::watermark_scope) | store | watermarks per resource, kept in the store (a new client sees them) |
//! | – | [`store_race`](store::store_race) | store | two clients racing t1 < t2: t2's value always wins |
//! | 11a | [`paused_holder_in_process`](e2e::paused_holder_in_process) | end to end | a holder paused past TTL gets `StaleFence`; metric +1; lost fired |
//! | 11b | [`paused_holder_process`](e2e::paused_holder_process) | end to end | the same with a real process frozen by `SIGSTOP` and thawed by `SIGCONT` |
//! | 12 | [`killed_holder`](e2e::killed_holder) | end to end | after `SIGKILL` of the holder the next one proceeds within TTL + margin |
//! | – | [`stale_write_before_new_holder_writes`](e2e::stale_write_before_new_holder_writes) | end to end | fencing rule 3: a fence orders writes, the "done" check in the write stops the job running twice |
//! | – | [`waits_are_bounded_while_a_fenced_transaction_is_open`](e2e::waits_are_bounded_while_a_fenced_transaction_is_open) | end to end | with the holder's fenced transaction held open ([`FencedStoreFactory::hold_transaction`]), a zero wait and a 300 ms wait answer within their bound |
//! | 13 | [`load`](e2e::load) | end to end | sustained rate across keys: no overlapping holds with accepted writes; every job once; fences gap-free if declared |
//!
//! ## Servers of a test's own
//!
//! [`servers::LoopbackServer`] starts a server process on a free loopback port with a data
//! directory of its own, and can kill or restart it: for the chaos tests no shared server may
//! suffer (a Redis restarted without persistence, a killed cluster leader).
//! [`servers::EtcdCluster`] and [`servers::ZkEnsemble`] are 3-member clusters whose leader a test
//! can kill: a [`ClusterFactory`] over one gets [`cluster::leader_killed`] stamped by
//! [`cluster_suite!`]; [`cluster::leader_killed_under_contention`] is the same run for callers
//! with their own clients (`palisade compare`).
//!
//! ## Real network partitions
//!
//! [`netns::Lab`] is a bridge of network namespaces on this machine (root and iproute2): a
//! [`netns::Host`] is a machine of its own as far as the network goes, [`Host::cut`] drops its
//! packets in silence and [`Host::heal`] brings it back. Servers go on the lab with
//! [`servers::Site`] (bound to the lab's gateway, or one member per host); clients with
//! [`Host::runtime`]. [`partition::holder_cut_off`] cuts a renewing holder off from the service
//! and its store past its TTL; [`partition::leader_cut_off_under_contention`] cuts an ensemble's
//! leader off from the majority while clients contend. Both take the backend's own factory or
//! clients, so a backend author runs them as the project's tests do
//! (`integration/tests/partitions.rs`).
//!
//! [`Host::cut`]: netns::Host::cut
//! [`Host::heal`]: netns::Host::heal
//! [`Host::runtime`]: netns::Host::runtime
//!
//! ## Without the macros
//!
//! [`run_lock_scenarios`], [`run_store_scenarios`] and [`run_end_to_end_scenarios`] run the
//! in-process scenarios from any async test. The process-level ones (11b, 12) re-execute the
//! test binary on the running test's name, so they need the macros; and the metric check of
//! 11a needs the macros' local recorder (without it the scenario says so in its report).

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod child;
pub mod cluster;
pub mod e2e;
pub mod election;
mod factory;
mod fn_factory;
pub mod frozen;
pub mod harness;
pub mod latency;
pub mod liveness;
pub mod lock;
pub mod memory;
pub mod netns;
pub mod partition;
pub mod primitives;
pub mod proxy;
pub mod relay;
pub mod rwlock;
pub mod semaphore;
pub mod servers;
pub mod store;

pub use e2e::LoadSettings;
pub use factory::{
    ClusterFactory, FaultyClient, FencedStoreFactory, FencingOf, HeldTransaction, LockServiceFactory, Namespace,
    ProcessAccess, RestartableFactory, Timing,
};
pub use fn_factory::{FnLockFactory, FnStoreFactory, lock_factory, store_factory};
pub use harness::{Ctx, Failure, Outcome, Report, require_env};
use harness::{attempt, ensure};
pub use proxy::FaultProxy;

/// Whether this process is the holder child of a process-level scenario (tests that run such a
/// scenario by hand use it to skip their own assertions in the child).
pub fn is_child_process() -> bool {
    child::role().is_some()
}

/// The id of the test process that runs the scenarios: this process, or in a scenario's holder
/// child, its parent. Name per-run server resources (a table, a key prefix) after it, so the
/// child of a process-level scenario finds the same ones.
pub fn test_process_id() -> u32 {
    if is_child_process() { std::os::unix::process::parent_id() } else { std::process::id() }
}

/// Runs the in-process lock scenarios in the caller's runtime; the first failure, if any, is
/// the result.
pub async fn run_lock_scenarios<F: LockServiceFactory>(factory: &F) -> Result<Vec<Report>, Failure> {
    lock_outcomes(factory).await.into_iter().map(|(_, outcome)| outcome).collect()
}

/// Runs every in-process lock scenario (each in its own namespace) and returns each outcome by
/// name, failures included: what a test of a deliberately broken service inspects, to see that
/// the scenarios of the guarantee it breaks fail, for that reason, and the others pass.
pub async fn lock_outcomes<F: LockServiceFactory>(factory: &F) -> Vec<(&'static str, Outcome)> {
    let mut outcomes = Vec::new();
    crate::__lock_scenarios!(__push_outcomes(lock, outcomes, factory));
    outcomes
}

/// Runs the store scenarios (8–10, bad input, stale batch shapes, the comparison matrix,
/// watermark scope, the store race) in the caller's runtime; the first failure, if any, is the
/// result.
pub async fn run_store_scenarios<F: FencedStoreFactory>(factory: &F) -> Result<Vec<Report>, Failure> {
    store_outcomes(factory).await.into_iter().map(|(_, outcome)| outcome).collect()
}

/// Runs every store scenario (each in its own namespace) and returns each outcome by name,
/// failures included, like [`lock_outcomes`].
pub async fn store_outcomes<F: FencedStoreFactory>(factory: &F) -> Vec<(&'static str, Outcome)> {
    let mut outcomes = Vec::new();
    crate::__store_scenarios!(__push_outcomes(store, outcomes, factory));
    outcomes
}

/// Runs the in-process end-to-end scenarios (11a, rule 3, 13) in the caller's runtime.
pub async fn run_end_to_end_scenarios<L: LockServiceFactory, S: FencedStoreFactory>(
    lf: &L,
    sf: &S,
) -> Result<Vec<Report>, Failure> {
    let mut reports = Vec::new();
    macro_rules! go {
        ($($name:ident),*) => {$(
            reports.push(e2e::$name(&Ctx::new(stringify!($name), ""), lf, sf).await?);
        )*};
    }
    go!(paused_holder_in_process, stale_write_before_new_holder_writes, load);
    Ok(reports)
}

/// The lock service scenarios, in the order they run: the one list that
/// [`lock_service_suite!`] stamps and [`lock_outcomes`] runs. Calls `$crate::$callback!` with
/// `($args)` and the names.
#[doc(hidden)]
#[macro_export]
macro_rules! __lock_scenarios {
    ($callback:ident $args:tt) => {
        $crate::$callback!(
            $args
            mutual_exclusion,
            owner_only_release_and_extend,
            expiry_and_takeover,
            fence_monotonicity,
            progress_gated_renewal,
            wait_and_handoff,
            bad_input,
            zero_wait_is_one_attempt,
            with_lock_releases_on_every_path,
            keys_are_independent,
            stale_release_and_extend_after_takeover,
            cancelled_acquires_leave_no_residue,
            fifo_when_declared,
            declared_timing_is_explained,
            lost_signal_from_the_backend,
            lost_replies_leave_one_live_grant,
            cut_connections_keep_the_grant_or_report_it,
            partitioned_holder_loses_before_anyone_gains,
            quorum_faults_never_grant_a_minority,
            dropped_client_lets_go,
            fast_client_clock_takes_nothing_early,
            dead_waiter_is_never_granted,
            repair_keeps_the_holder,
            waits_are_bounded,
            slow_replies_still_complete,
            idle_key_keeps_its_counter,
            resent_release_never_frees_a_new_grant,
            acquire_cancelled_as_the_lock_frees
        );
    };
}

/// The fenced store scenarios: the one list that [`fenced_store_suite!`] stamps and
/// [`store_outcomes`] runs.
#[doc(hidden)]
#[macro_export]
macro_rules! __store_scenarios {
    ($callback:ident $args:tt) => {
        $crate::$callback!(
            $args
            equal_higher_lower,
            concurrent_interleaved_fences,
            atomicity,
            store_bad_input,
            stale_batches_of_every_shape,
            fence_comparison_matrix,
            watermark_scope,
            read_many_answers_like_read,
            store_race
        );
    };
}

/// One `#[test]` per named scenario.
#[doc(hidden)]
#[macro_export]
macro_rules! __stamp_tests {
    (($group:ident, $factories:tt) $($name:ident),*) => {
        $($crate::__scenario_test!($group, $name, $factories);)*
    };
}

/// Runs each named scenario in turn, pushing `(name, outcome)` onto `$outcomes`.
#[doc(hidden)]
#[macro_export]
macro_rules! __push_outcomes {
    (($group:ident, $outcomes:ident, $factory:ident) $($name:ident),*) => {
        $(
            $outcomes.push((
                stringify!($name),
                $crate::$group::$name(&$crate::Ctx::new(stringify!($name), ""), $factory).await,
            ));
        )*
    };
}

/// One `#[test]` running one scenario through [`harness::run`].
#[doc(hidden)]
#[macro_export]
macro_rules! __scenario_test {
    ($group:ident, $name:ident, ($($factory:expr),+)) => {
        #[test]
        fn $name() {
            let test = $crate::harness::test_name(module_path!(), stringify!($name));
            $crate::harness::run(stringify!($name), &test, |ctx| async move {
                $crate::__scenario_call!($group, $name, ctx, ($($factory),+))
            });
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __scenario_call {
    ($group:ident, $name:ident, $ctx:ident, ($factory:expr)) => {{
        let factory = $factory;
        $crate::$group::$name(&$ctx, &factory).await
    }};
    ($group:ident, $name:ident, $ctx:ident, ($lock:expr, $store:expr)) => {{
        let (lock_factory, store_factory) = ($lock, $store);
        $crate::$group::$name(&$ctx, &lock_factory, &store_factory).await
    }};
}

/// Stamps out one `#[test]` per lock service scenario in a module
/// (`lock_service_conformance`, or the name given first).
///
/// ```
/// use palisade_conformance::memory::MemoryLockFactory;
///
/// palisade_conformance::lock_service_suite!(MemoryLockFactory::new());
/// palisade_conformance::lock_service_suite!(second_instance, MemoryLockFactory::new());
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! lock_service_suite {
    ($factory:expr) => {
        $crate::lock_service_suite!(lock_service_conformance, $factory);
    };
    ($module:ident, $factory:expr) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            $crate::__lock_scenarios!(__stamp_tests(lock, ($factory)));
        }
    };
}

/// Stamps out one `#[test]` per fenced store scenario in a module
/// (`fenced_store_conformance`, or the name given first).
#[macro_export]
macro_rules! fenced_store_suite {
    ($factory:expr) => {
        $crate::fenced_store_suite!(fenced_store_conformance, $factory);
    };
    ($module:ident, $factory:expr) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            $crate::__store_scenarios!(__stamp_tests(store, ($factory)));
        }
    };
}

/// Stamps out one `#[test]` per end-to-end scenario (11a, 11b, 12, rule 3, 13) for a lock
/// service factory and a store factory, in a module (`end_to_end_conformance`, or the name
/// given first). The store must be reachable from a child process (a server or a file).
#[macro_export]
macro_rules! end_to_end_suite {
    ($lock:expr, $store:expr) => {
        $crate::end_to_end_suite!(end_to_end_conformance, $lock, $store);
    };
    ($module:ident, $lock:expr, $store:expr) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            $crate::__scenario_test!(e2e, paused_holder_in_process, ($lock, $store));
            $crate::__scenario_test!(e2e, paused_holder_process, ($lock, $store));
            $crate::__scenario_test!(e2e, killed_holder, ($lock, $store));
            $crate::__scenario_test!(e2e, stale_write_before_new_holder_writes, ($lock, $store));
            $crate::__scenario_test!(e2e, live_lock_when_declared, ($lock, $store));
            $crate::__scenario_test!(e2e, waits_are_bounded_while_a_fenced_transaction_is_open, ($lock, $store));
            $crate::__scenario_test!(e2e, load, ($lock, $store));
        }
    };
}

/// Stamps out the semaphore scenarios ([`semaphore::semaphore_count_limit`],
/// [`semaphore::semaphore_stale_permit_refused`], [`semaphore::semaphore_fifo_when_declared`],
/// [`semaphore::primitive_keys_are_their_own`]) for a **fenced** lock service factory and a
/// store factory, in a module (`semaphore_conformance`, or the name given first). An unfenced
/// service (Redlock) has no semaphore: `Semaphore` requires `LockService<Fencing = Fenced>`.
#[macro_export]
macro_rules! semaphore_suite {
    ($lock:expr, $store:expr) => {
        $crate::semaphore_suite!(semaphore_conformance, $lock, $store);
    };
    ($module:ident, $lock:expr, $store:expr) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            $crate::__scenario_test!(semaphore, semaphore_count_limit, ($lock));
            $crate::__scenario_test!(semaphore, semaphore_stale_permit_refused, ($lock, $store));
            $crate::__scenario_test!(semaphore, semaphore_fifo_when_declared, ($lock));
            $crate::__scenario_test!(semaphore, primitive_keys_are_their_own, ($lock, $store));
        }
    };
}

/// Stamps out the election scenario ([`election::election_frozen_leader_is_deposed`]) for a
/// **fenced** lock service factory and a store factory, in a module (`election_conformance`,
/// or the name given first).
#[macro_export]
macro_rules! election_suite {
    ($lock:expr, $store:expr) => {
        $crate::election_suite!(election_conformance, $lock, $store);
    };
    ($module:ident, $lock:expr, $store:expr) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            $crate::__scenario_test!(election, election_frozen_leader_is_deposed, ($lock, $store));
        }
    };
}

/// Stamps out the read-write lock scenarios ([`rwlock::rwlock_readers_share_writers_exclude`],
/// [`rwlock::rwlock_stale_holders_refused`]) and the slow-service scenario of every primitive
/// ([`primitives::primitives_enter_over_a_slow_service`]) for a **fenced** lock service factory and a store
/// factory, in a module (`rwlock_conformance`, or the name given first).
#[macro_export]
macro_rules! rwlock_suite {
    ($lock:expr, $store:expr) => {
        $crate::rwlock_suite!(rwlock_conformance, $lock, $store);
    };
    ($module:ident, $lock:expr, $store:expr) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            $crate::__scenario_test!(rwlock, rwlock_readers_share_writers_exclude, ($lock, $store));
            $crate::__scenario_test!(rwlock, rwlock_stale_holders_refused, ($lock, $store));
            $crate::__scenario_test!(primitives, primitives_enter_over_a_slow_service, ($lock, $store));
        }
    };
}

/// Stamps out the process-level scenarios of the coordination primitives
/// ([`frozen::semaphore_permit_holder_sigstop`], [`frozen::rwlock_reader_sigstop`],
/// [`frozen::rwlock_writer_sigstop`], [`frozen::election_leader_sigstop`]: a permit holder,
/// reader, writer or leader in a process of its own, frozen with `SIGSTOP`) for a **fenced**
/// lock service factory and a store that another process can reach, in a module
/// (`frozen_primitives_conformance`, or the name given first).
#[macro_export]
macro_rules! frozen_primitives_suite {
    ($lock:expr, $store:expr) => {
        $crate::frozen_primitives_suite!(frozen_primitives_conformance, $lock, $store);
    };
    ($module:ident, $lock:expr, $store:expr) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            $crate::__scenario_test!(frozen, semaphore_permit_holder_sigstop, ($lock, $store));
            $crate::__scenario_test!(frozen, rwlock_reader_sigstop, ($lock, $store));
            $crate::__scenario_test!(frozen, rwlock_writer_sigstop, ($lock, $store));
            $crate::__scenario_test!(frozen, election_leader_sigstop, ($lock, $store));
        }
    };
}

/// Stamps out the cluster scenario ([`cluster::leader_killed`]) for a [`ClusterFactory`] (a
/// replicated lock service of the test's own, whose leader it can kill) and a store factory, in
/// a module (`cluster_conformance`, or the name given first).
#[macro_export]
macro_rules! cluster_suite {
    ($lock:expr, $store:expr) => {
        $crate::cluster_suite!(cluster_conformance, $lock, $store);
    };
    ($module:ident, $lock:expr, $store:expr) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            $crate::__scenario_test!(cluster, leader_killed, ($lock, $store));
        }
    };
}

/// Stamps out the restart scenario ([`lock::fences_survive_restart_or_are_repaired`]) for a
/// [`RestartableFactory`] (a fenced service over a server of the test's own, which the suite
/// may restart with or without its data), in a module (`restart_conformance`, or the name given
/// first).
#[macro_export]
macro_rules! restart_suite {
    ($factory:expr) => {
        $crate::restart_suite!(restart_conformance, $factory);
    };
    ($module:ident, $factory:expr) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            $crate::__scenario_test!(lock, fences_survive_restart_or_are_repaired, ($factory));
        }
    };
}
