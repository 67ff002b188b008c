//! # palisade-conformance
//!
//! The certification every Palisade lock service and fenced store must pass, as a library. A
//! backend author certifies a backend with one line per thing certified:
//!
//! ```
//! // In a test file, e.g. tests/conformance.rs, with your own factories in place of these:
//! use palisade_conformance::memory::MemoryLockFactory;
//!
//! // The store a lock service's holders write through: one other processes reach (its holders
//! // are frozen and killed in processes of their own), here a SQLite file.
//! fn store() -> impl palisade_conformance::FencedStoreFactory {
//!     palisade_conformance::store_factory(|| async {
//!         let url = format!("sqlite://{}/my-cert.db", std::env::temp_dir().display());
//!         Ok(std::sync::Arc::new(palisade_sqlite::SqliteStore::connect(&url).await?))
//!     })
//! }
//!
//! palisade_conformance::certify!(my_service: lock_service = MemoryLockFactory::new(), store = store());
//! # fn main() {}
//! ```
//!
//! [`certify!`] stamps one `#[test]` per scenario of the [registry](registry::SCENARIOS) (in a
//! module named after the certification), so a failure names the scenario and the guarantee it
//! checks, and records each outcome for the certification report (`docs/conformance/`). What
//! runs is decided by what the service and store **declare**
//! ([`Capabilities`](palisade_core::Capabilities): fencing, FIFO, durability, expiry delay,
//! deployment, replication; [`FencedStoreFactory::shared_across_processes`]), never by the
//! author's choice of macros: a declared guarantee whose hook the factory does not provide
//! fails naming the hook, and a guarantee not declared has its documented refusal checked.
//!
//! The factory expressions are evaluated inside each scenario's own runtime and hand out
//! **independent clients** (their own connection or session) of one backend; every scenario
//! works in a fresh random [`Namespace`]. A factory declares its [`Timing`] (the TTL to use and
//! how long the backend may take to notice expiry) and, for in-process services, that a child
//! process must reach it through the loopback [`relay`].
//!
//! Nothing is skipped for lack of a server: a backend's test reads its server's address with
//! [`require_env`], which fails when the variable is missing.
//!
//! ## Scenarios
//!
//! The registry, generated into `conformance/SCENARIOS.md` (a test fails when it drifts):
//!
#![doc = include_str!("../SCENARIOS.md")]
//!
//! ## Servers of a test's own (`palisade-lab`)
//!
//! [`palisade_lab::servers::LoopbackServer`] starts a server process on a free loopback port with a data
//! directory of its own, and can kill or restart it: what a `restartable` factory needs.
//! [`palisade_lab::servers::EtcdCluster`] and [`palisade_lab::servers::ZkEnsemble`] are 3-member clusters whose leader a test
//! can kill: what a `cluster` factory needs ([`LockServiceFactory::kill_leader`]);
//! [`cluster::leader_killed_under_contention`] is the same run for callers with their own
//! clients (`palisade compare`).
//!
//! ## Real network partitions
//!
//! [`palisade_lab::netns::Lab`] is a bridge of network namespaces on this machine (root and iproute2): a
//! [`palisade_lab::netns::Host`] is a machine of its own as far as the network goes, [`Host::cut`] drops its
//! packets in silence and [`Host::heal`] brings it back. Servers go on the lab with
//! [`palisade_lab::servers::Site`] (bound to the lab's gateway, or one member per host); clients with
//! [`Host::runtime`]. [`partition::holder_cut_off`] cuts a renewing holder off from the service
//! and its store past its TTL; [`partition::leader_cut_off_under_contention`] cuts an ensemble's
//! leader off from the majority while clients contend. Both take the backend's own factory or
//! clients, so a backend author runs them as the project's tests do
//! (`integration/tests/partitions.rs`).
//!
//! [`Host::cut`]: palisade_lab::netns::Host::cut
//! [`Host::heal`]: palisade_lab::netns::Host::heal
//! [`Host::runtime`]: palisade_lab::netns::Host::runtime
//!
//! ## Without the macro
//!
//! [`run_lock_scenarios`], [`run_store_scenarios`] and [`run_end_to_end_scenarios`] run the
//! in-process scenarios from any async test, and [`lock_outcomes`] / [`store_outcomes`] return
//! every outcome (what the broken twins in this crate's tests inspect). The process-level ones
//! re-execute the test binary on the running test's name, so they need the macro; and the
//! metric check of the paused-holder scenario needs the macro's local recorder.

#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The source tree by role: contract/ (what an author supplies and runs), harness/ (running a
// scenario, its bounds, its child process), scenarios/, faults/. The public modules stay flat.
mod contract;
mod faults;
pub mod harness;
mod scenarios;

pub use contract::{certify, memory, registry, report};
pub(crate) use contract::{factory, fn_factory};
pub use faults::{latency, proxy, relay};
pub use harness::bounds;
pub(crate) use harness::child;
pub use scenarios::{
    cluster, e2e, election, frozen, liveness, lock, multi, partition, primitives, rwlock, semaphore, store,
};

pub use bounds::{BoundedLockFactory, BoundedStoreFactory, CallBounds};
pub use e2e::LoadSettings;
pub use factory::{
    FaultyClient, FencedStoreFactory, FencingOf, HeldTransaction, LockServiceFactory, Namespace, ProcessAccess,
    Restart, Timing,
};
pub use fn_factory::{FnLockFactory, FnStoreFactory, lock_factory, store_factory};
pub use harness::{Ctx, Failure, Outcome, Report, Status, assert_config_error, require_env};
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
    let bound = |ctx: &Ctx| BoundedLockFactory::declared(factory, ctx.bounds());
    crate::__registry!(__push_outcomes(lock, outcomes, bound));
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
    let bound = |ctx: &Ctx| BoundedStoreFactory::declared(factory, ctx.bounds());
    crate::__registry!(__push_outcomes(store, outcomes, bound));
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

/// Pushes the outcome of each registry entry of shape `$want` (a callback of
/// [`__registry!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __push_outcomes {
    (($want:ident, $outcomes:ident, $factory:ident) $($shape:ident $module:ident :: $name:ident $guarantee:literal;)*) => {
        $( $crate::__push_outcome!($want $shape $module $name $outcomes $factory); )*
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __push_outcome {
    (lock lock $module:ident $name:ident $outcomes:ident $bound:ident) => {
        $crate::__push_outcome!(@run $module $name $outcomes $bound);
    };
    (store store $module:ident $name:ident $outcomes:ident $bound:ident) => {
        $crate::__push_outcome!(@run $module $name $outcomes $bound);
    };
    (@run $module:ident $name:ident $outcomes:ident $bound:ident) => {{
        let ctx = $crate::Ctx::new(stringify!($name), "");
        let factory = $bound(&ctx);
        let outcome = $crate::$module::$name(&ctx, &factory).await;
        $outcomes.push((stringify!($name), $crate::harness::within_bounds(&ctx, outcome)));
    }};
    ($want:ident $shape:ident $module:ident $name:ident $outcomes:ident $factory:ident) => {};
}

/// Certifies a lock service, a fenced store, or a pairing of the two: stamps one `#[test]`
/// per scenario of the [registry](registry::SCENARIOS) that applies, in a module named after
/// the certification, and records each outcome for the certification report
/// (`docs/conformance/<name>.md`).
///
/// ```
/// // In a test file, e.g. tests/conformance.rs, with your own factories in place of these:
/// use palisade_conformance::memory::{MemoryLockFactory, MemoryStoreFactory};
///
/// fn sqlite_file() -> impl palisade_conformance::FencedStoreFactory {
///     palisade_conformance::store_factory(|| async {
///         let url = format!("sqlite://{}/my-cert.db", std::env::temp_dir().display());
///         Ok(std::sync::Arc::new(palisade_sqlite::SqliteStore::connect(&url).await?))
///     })
/// }
///
/// // A lock service, with the store its end-to-end and primitive scenarios write through: one
/// // that other processes reach (a server, a file), since its holders are frozen and killed in
/// // processes of their own.
/// // `restartable = …` (a factory over a server of the test's own) and `cluster = …` (over a
/// // cluster whose leader it can kill) are required when the service declares
/// // `fences_survive_restart` or `Replication::LeaderQuorum`.
/// palisade_conformance::certify!(memory: lock_service = MemoryLockFactory::new(), store = sqlite_file());
/// // A fenced store, with the lock service its end-to-end scenarios take leases from.
/// palisade_conformance::certify!(memory_store: fenced_store = MemoryStoreFactory::new(), lock_service = MemoryLockFactory::new());
/// // Only the end-to-end scenarios of a service with a store, both certified elsewhere.
/// palisade_conformance::certify!(memory_pair: pairing, lock_service = MemoryLockFactory::new(), store = MemoryStoreFactory::new());
/// # fn main() {}
/// ```
///
/// What runs is decided by the registry and by what the service and store **declare**, not
/// by the author: every scenario of the certification's kind is stamped. A declared guarantee
/// whose hook the factories do not provide **fails**, naming the hook (`break_lock` always;
/// `faulty_client` for `Deployment::Network`; `restart_server` for `fences_survive_restart`;
/// `kill_leader` for `Replication::LeaderQuorum`); a guarantee not declared has its documented
/// refusal checked. Every factory expression is evaluated inside each scenario's own runtime.
#[macro_export]
macro_rules! certify {
    ($cert:ident : lock_service = $lock:expr, store = $store:expr
        $(, restartable = $restart:expr)? $(, cluster = $cluster:expr)? $(,)?) => {
        mod $cert {
            #[allow(unused_imports)]
            use super::*;
            $crate::__registry!(__certify_entries (service $cert [$lock] [$store] [$($restart)?] [$($cluster)?]));
        }
    };
    ($cert:ident : fenced_store = $store:expr, lock_service = $lock:expr $(,)?) => {
        mod $cert {
            #[allow(unused_imports)]
            use super::*;
            $crate::__registry!(__certify_entries (store $cert [$lock] [$store] [] []));
        }
    };
    ($cert:ident : pairing, lock_service = $lock:expr, store = $store:expr $(,)?) => {
        mod $cert {
            #[allow(unused_imports)]
            use super::*;
            $crate::__registry!(__certify_entries (pairing $cert [$lock] [$store] [] []));
        }
    };
}

/// Stamps each registry entry that the certification covers (a callback of [`__registry!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __certify_entries {
    ($cfg:tt $($shape:ident $module:ident :: $name:ident $guarantee:literal;)*) => {
        $( $crate::__certify_entry!($cfg $shape $module $name); )*
    };
}

/// One registry entry: which certifications stamp it, and how its test runs.
#[doc(hidden)]
#[macro_export]
macro_rules! __certify_entry {
    // Lock services: everything but the store scenarios.
    ((service $cert:ident [$lock:expr] $store:tt $restart:tt $cluster:tt) lock $module:ident $name:ident) => {
        $crate::__certify_test!(service $cert $name |ctx| {
            let lf = $crate::BoundedLockFactory::declared($lock, ctx.bounds());
            $crate::$module::$name(&ctx, &lf).await
        });
    };
    ((service $($rest:tt)*) store $module:ident $name:ident) => {};
    ((service $cert:ident [$lock:expr] [$store:expr] $restart:tt $cluster:tt) primitive $module:ident $name:ident) => {
        $crate::__certify_test!(service $cert $name |ctx| {
            let (lf, sf) = ($crate::BoundedLockFactory::declared($lock, ctx.bounds()), $crate::BoundedStoreFactory::declared($store, ctx.bounds()));
            $crate::certify::fenced(stringify!($name), &ctx, &lf, &sf).await
        });
    };
    ((service $cert:ident [$lock:expr] [$store:expr] $restart:tt $cluster:tt) frozen_primitive $module:ident $name:ident) => {
        $crate::__certify_test!(service $cert $name |ctx| {
            let (lf, sf) = ($crate::BoundedLockFactory::declared($lock, ctx.bounds()), $crate::BoundedStoreFactory::declared($store, ctx.bounds()));
            if !$crate::FencedStoreFactory::shared_across_processes(&sf) {
                return $crate::certify::store_in_one_process(&ctx, $crate::certify::Kind::LockService);
            }
            $crate::certify::fenced(stringify!($name), &ctx, &lf, &sf).await
        });
    };
    ((service $cert:ident [$lock:expr] [$store:expr] [$restart:expr] $cluster:tt) restart $module:ident $name:ident) => {
        $crate::__certify_test!(service $cert $name |ctx| {
            let (rf, sf) = ($crate::BoundedLockFactory::declared($restart, ctx.bounds()), $crate::BoundedStoreFactory::declared($store, ctx.bounds()));
            $crate::certify::fenced(stringify!($name), &ctx, &rf, &sf).await
        });
    };
    ((service $cert:ident [$lock:expr] [$store:expr] [] $cluster:tt) restart $module:ident $name:ident) => {
        $crate::__certify_test!(service $cert $name |ctx| {
            let lf = $crate::BoundedLockFactory::declared($lock, ctx.bounds());
            $crate::certify::without_restart_server(&ctx, &lf).await
        });
    };
    ((service $cert:ident [$lock:expr] [$store:expr] $restart:tt [$cluster:expr]) cluster $module:ident $name:ident) => {
        $crate::__certify_test!(service $cert $name |ctx| {
            let (cf, sf) = ($crate::BoundedLockFactory::declared($cluster, ctx.bounds()), $crate::BoundedStoreFactory::declared($store, ctx.bounds()));
            $crate::certify::fenced(stringify!($name), &ctx, &cf, &sf).await
        });
    };
    ((service $cert:ident [$lock:expr] [$store:expr] $restart:tt []) cluster $module:ident $name:ident) => {
        $crate::__certify_test!(service $cert $name |ctx| {
            let lf = $crate::BoundedLockFactory::declared($lock, ctx.bounds());
            $crate::certify::without_kill_leader(&ctx, &lf).await
        });
    };
    // Stores: the store scenarios.
    ((store $cert:ident $lock:tt [$store:expr] $restart:tt $cluster:tt) store $module:ident $name:ident) => {
        $crate::__certify_test!(store $cert $name |ctx| {
            let sf = $crate::BoundedStoreFactory::declared($store, ctx.bounds());
            $crate::$module::$name(&ctx, &sf).await
        });
    };
    // Every kind: the end-to-end scenarios, in process and across processes.
    (($kind:ident $cert:ident [$lock:expr] [$store:expr] $restart:tt $cluster:tt) pair $module:ident $name:ident) => {
        $crate::__certify_test!($kind $cert $name |ctx| {
            let (lf, sf) = ($crate::BoundedLockFactory::declared($lock, ctx.bounds()), $crate::BoundedStoreFactory::declared($store, ctx.bounds()));
            $crate::$module::$name(&ctx, &lf, &sf).await
        });
    };
    (($kind:ident $cert:ident [$lock:expr] [$store:expr] $restart:tt $cluster:tt) process $module:ident $name:ident) => {
        $crate::__certify_test!($kind $cert $name |ctx| {
            let (lf, sf) = ($crate::BoundedLockFactory::declared($lock, ctx.bounds()), $crate::BoundedStoreFactory::declared($store, ctx.bounds()));
            if !$crate::FencedStoreFactory::shared_across_processes(&sf) {
                return $crate::certify::store_in_one_process(
                    &ctx,
                    $crate::certify::Kind::from_macro(stringify!($kind)),
                );
            }
            $crate::$module::$name(&ctx, &lf, &sf).await
        });
    };
    // Everything else is not this certification's.
    ($cfg:tt $shape:ident $module:ident $name:ident) => {};
}

/// One `#[test]` running one certified scenario through [`certify::run`].
#[doc(hidden)]
#[macro_export]
macro_rules! __certify_test {
    ($kind:ident $cert:ident $name:ident |$ctx:ident| $body:block) => {
        #[test]
        fn $name() {
            let test = $crate::harness::test_name(module_path!(), stringify!($name));
            $crate::certify::run(
                $crate::certify::Kind::from_macro(stringify!($kind)),
                stringify!($cert),
                stringify!($name),
                &test,
                option_env!("CARGO_TARGET_TMPDIR"),
                |$ctx| async move { $body },
            );
        }
    };
}
