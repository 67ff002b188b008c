//! Certification: what [`certify!`](macro@crate::certify) runs for each scenario, and the record it
//! leaves for the certification report.
//!
//! Whether a scenario checks its guarantee, checks the documented refusal of an undeclared
//! one, or fails for a missing hook is decided here and in the scenarios from what the
//! service and store declare, never by which macro the author stamped.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use palisade_core::{Fenced, LockService, Primitive, Replication, Unfenced};

use crate::harness::{self, Ctx, Declared, Outcome};
use crate::{FencedStoreFactory, LockServiceFactory, cluster, election, frozen, lock, primitives, rwlock, semaphore};

/// A scenario future borrowed from its context and factories.
pub type ScenarioFuture<'a> = Pin<Box<dyn Future<Output = Outcome> + 'a>>;

/// The scenarios that need a fenced service, dispatched on the service's fencing: a fenced
/// service runs them, an unfenced one (Redlock) has its refusal checked — the primitives
/// require `LockService<Fencing = Fenced>`, so the type refuses them, and the service must
/// not claim them in its capabilities.
pub trait FencedScenarios: palisade_core::Fencing {
    /// Runs the fenced scenario `scenario` (a registry name of shape primitive, frozen
    /// primitive, restart or cluster) over `lf` and `sf`.
    fn run<'a, L, S>(scenario: &'static str, ctx: &'a Ctx, lf: &'a L, sf: &'a S) -> ScenarioFuture<'a>
    where
        L: LockServiceFactory,
        L::Service: LockService<Fencing = Self>,
        S: FencedStoreFactory;
}

impl FencedScenarios for Fenced {
    fn run<'a, L, S>(scenario: &'static str, ctx: &'a Ctx, lf: &'a L, sf: &'a S) -> ScenarioFuture<'a>
    where
        L: LockServiceFactory,
        L::Service: LockService<Fencing = Fenced>,
        S: FencedStoreFactory,
    {
        match scenario {
            "semaphore_count_limit" => Box::pin(semaphore::semaphore_count_limit(ctx, lf)),
            "semaphore_stale_permit_refused" => Box::pin(semaphore::semaphore_stale_permit_refused(ctx, lf, sf)),
            "semaphore_fifo_when_declared" => Box::pin(semaphore::semaphore_fifo_when_declared(ctx, lf)),
            "primitive_keys_are_their_own" => Box::pin(semaphore::primitive_keys_are_their_own(ctx, lf, sf)),
            "rwlock_readers_share_writers_exclude" => {
                Box::pin(rwlock::rwlock_readers_share_writers_exclude(ctx, lf, sf))
            }
            "rwlock_stale_holders_refused" => Box::pin(rwlock::rwlock_stale_holders_refused(ctx, lf, sf)),
            "election_frozen_leader_is_deposed" => Box::pin(election::election_frozen_leader_is_deposed(ctx, lf, sf)),
            "primitives_enter_over_a_slow_service" => {
                Box::pin(primitives::primitives_enter_over_a_slow_service(ctx, lf, sf))
            }
            "semaphore_permit_holder_sigstop" => Box::pin(frozen::semaphore_permit_holder_sigstop(ctx, lf, sf)),
            "rwlock_reader_sigstop" => Box::pin(frozen::rwlock_reader_sigstop(ctx, lf, sf)),
            "rwlock_writer_sigstop" => Box::pin(frozen::rwlock_writer_sigstop(ctx, lf, sf)),
            "election_leader_sigstop" => Box::pin(frozen::election_leader_sigstop(ctx, lf, sf)),
            "fences_survive_restart_or_are_repaired" => {
                Box::pin(lock::fences_survive_restart_or_are_repaired(ctx, lf, sf))
            }
            "leader_killed" => Box::pin(cluster::leader_killed(ctx, lf, sf)),
            "duplicate_fence_repair_keeps_the_holder" => {
                Box::pin(crate::liveness::duplicate_fence_repair_keeps_the_holder(ctx, lf, sf))
            }
            other => Box::pin(async move { Err(ctx.fail(format!("no fenced scenario is named `{other}`"))) }),
        }
    }
}

impl FencedScenarios for Unfenced {
    fn run<'a, L, S>(scenario: &'static str, ctx: &'a Ctx, lf: &'a L, _sf: &'a S) -> ScenarioFuture<'a>
    where
        L: LockServiceFactory,
        L::Service: LockService<Fencing = Unfenced>,
        S: FencedStoreFactory,
    {
        Box::pin(async move {
            let svc = lock::client(ctx, lf).await?;
            let caps = svc.capabilities();
            let primitive = match scenario {
                s if s.starts_with("semaphore") || s == "primitive_keys_are_their_own" => Some(Primitive::Semaphore),
                s if s.starts_with("rwlock") => Some(Primitive::ReadWriteLock),
                s if s.starts_with("election") => Some(Primitive::Election),
                "primitives_enter_over_a_slow_service" => Some(Primitive::ReadWriteLock),
                _ => None,
            };
            if let Some(primitive) = primitive {
                if caps.offers(primitive) {
                    return Err(ctx.fail(format!(
                        "an unfenced service claims to offer {primitive:?}, which requires `LockService<Fencing = Fenced>`"
                    )));
                }
                ctx.refusal_checked(format!(
                    "no fences: {primitive:?} requires `LockService<Fencing = Fenced>` (refused by the type) and the \
                     service does not offer it"
                ));
            } else {
                if caps.issues_fences() || caps.fences_survive_restart {
                    return Err(ctx.fail("an unfenced service declares fences"));
                }
                ctx.refusal_checked(match scenario {
                    "duplicate_fence_repair_keeps_the_holder" => {
                        "no fences, as declared: no fence to be issued twice, no counter to repair"
                    }
                    _ => "no fences, as declared: nothing to keep across a restart or a leader's death",
                });
            }
            Ok(ctx.report())
        })
    }
}

/// The restart scenario of a certification given no `restartable` factory: fails when the
/// service declares `fences_survive_restart` (the hook that would test it is missing), and is
/// not applicable otherwise.
pub async fn without_restart_server<L: LockServiceFactory>(ctx: &Ctx, lf: &L) -> Outcome {
    ctx.saw_hook("restart_server", false);
    let caps = lock::client(ctx, lf).await?.capabilities();
    if caps.fences_survive_restart {
        return Err(ctx.fail(
            "declares `fences_survive_restart` but provides no `restart_server`: give certify! a \
             `restartable = …` factory over a server of the test's own, or declare less",
        ));
    }
    ctx.not_applicable("declares no fences that survive a restart, and provides no `restart_server`");
    Ok(ctx.report())
}

/// The cluster scenario of a certification given no `cluster` factory: fails when the service
/// declares [`Replication::LeaderQuorum`] (the hook that would test it is missing), and is not
/// applicable otherwise.
pub async fn without_kill_leader<L: LockServiceFactory>(ctx: &Ctx, lf: &L) -> Outcome {
    ctx.saw_hook("kill_leader", false);
    let caps = lock::client(ctx, lf).await?.capabilities();
    if caps.replication == Replication::LeaderQuorum {
        return Err(ctx.fail(
            "declares `Replication::LeaderQuorum` but provides no `kill_leader`: give certify! a `cluster = …` \
             factory over a cluster of the test's own, or declare less",
        ));
    }
    ctx.not_applicable(format!("declares {:?} replication: no leader to kill", caps.replication));
    Ok(ctx.report())
}

/// A process-level scenario over a store that lives in one process: not applicable (the
/// store declares so with [`FencedStoreFactory::shared_across_processes`]).
///
/// A lock service's certification may not be given such a store: its process-level scenarios
/// (a holder frozen with `SIGSTOP`, killed with `SIGKILL`) are what it is certified for, so the
/// scenario fails, naming what to give instead.
pub fn store_in_one_process(ctx: &Ctx, kind: Kind) -> Outcome {
    if kind == Kind::LockService {
        return Err(ctx.fail(
            "a lock service is certified with a store another process can reach (its holders are frozen and killed \
             in processes of their own): give certify! `store = …` a server or a file (SQLite's \
             `palisade_sqlite::conformance::store`), not one that lives in this process",
        ));
    }
    ctx.not_applicable("the store lives in this process's memory: no other process can write to it");
    Ok(ctx.report())
}

/// Where certification records go: `PALISADE_CERTIFICATION_DIR`, else
/// `<target_tmpdir>/palisade-certification` (the test crate's `CARGO_TARGET_TMPDIR`), else the
/// system's temporary directory.
pub fn record_dir(target_tmpdir: Option<&str>) -> PathBuf {
    if let Some(dir) = std::env::var_os("PALISADE_CERTIFICATION_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    match target_tmpdir {
        Some(dir) => PathBuf::from(dir).join("palisade-certification"),
        None => std::env::temp_dir().join("palisade-certification"),
    }
}

/// What a certification certifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A lock service (with the store its end-to-end and primitive scenarios write through).
    LockService,
    /// A fenced store (with the lock service its end-to-end scenarios take leases from).
    FencedStore,
    /// A lock service and a store, both certified elsewhere: their end-to-end scenarios.
    Pairing,
}

impl Kind {
    /// The kind from [`certify!`](macro@crate::certify)'s internal name for it.
    #[doc(hidden)]
    pub fn from_macro(name: &str) -> Kind {
        match name {
            "service" => Kind::LockService,
            "store" => Kind::FencedStore,
            _ => Kind::Pairing,
        }
    }

    /// The kind's name in reports (`lock service`, `fenced store`, `pairing`).
    pub fn name(self) -> &'static str {
        match self {
            Kind::LockService => "lock service",
            Kind::FencedStore => "fenced store",
            Kind::Pairing => "pairing",
        }
    }
}

/// Runs one certified scenario (what each test stamped by [`certify!`](macro@crate::certify) does):
/// runs it like [`harness::run`], writes its record to
/// `<record_dir>/<certification>/<scenario>.json` for the certification report, then prints
/// the report or panics with the failure.
pub fn run<F, Fut>(
    kind: Kind,
    certification: &'static str,
    scenario: &'static str,
    test_name: &str,
    target_tmpdir: Option<&str>,
    make: F,
) where
    F: FnOnce(Arc<Ctx>) -> Fut,
    Fut: Future<Output = Outcome>,
{
    CURRENT.with(|c| c.set(Some((certification, scenario))));
    let (outcome, declared) = harness::run_outcome(scenario, test_name, make);
    CURRENT.with(|c| c.set(None));
    let dir = record_dir(target_tmpdir).join(certification);
    let record = record_json(kind, certification, scenario, &outcome, &declared);
    // A record that cannot be written costs the report, not the verdict: say so and go on.
    if let Err(e) =
        std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(dir.join(format!("{scenario}.json")), record))
    {
        eprintln!("conformance: cannot write the certification record of {scenario} under {}: {e}", dir.display());
    }
    harness::finish(&format!("{certification}::{scenario}"), outcome);
}

thread_local! {
    static CURRENT: std::cell::Cell<Option<(&'static str, &'static str)>> = const { std::cell::Cell::new(None) };
}

/// The certification and scenario a test stamped by [`certify!`](macro@crate::certify) is
/// running, when called from the test's own thread (where its factory expressions are
/// evaluated), in the test process and in a scenario's holder child alike: for factories that
/// give each scenario resources of its own (a database file, a table) that the child must find
/// too. `None` elsewhere.
pub fn current() -> Option<(&'static str, &'static str)> {
    CURRENT.with(std::cell::Cell::get)
}

/// One scenario's record, as JSON.
fn record_json(kind: Kind, certification: &str, scenario: &str, outcome: &Outcome, declared: &Declared) -> String {
    let (status, seconds, notes, failure) = match outcome {
        Ok(report) => (report.status.name(), report.elapsed.as_secs_f64(), report.notes.clone(), None),
        Err(failure) => ("failed", 0.0, Vec::new(), Some(failure.message.clone())),
    };
    let (service, capabilities) = declared.service.clone().unzip();
    let hooks: Vec<serde_json::Value> =
        declared.hooks.iter().map(|(h, provided)| serde_json::json!([h, provided])).collect();
    serde_json::json!({
        "certification": certification,
        "kind": kind.name(),
        "scenario": scenario,
        "status": status,
        "seconds": (seconds * 1e3).round() / 1e3,
        "notes": notes,
        "failure": failure,
        "service": service,
        "capabilities": capabilities,
        "store": declared.store,
        "hooks": hooks,
    })
    .to_string()
}

/// Runs the fenced scenario `scenario` over `lf` and `sf`, or checks its refusal on an
/// unfenced service ([`FencedScenarios`]).
pub fn fenced<'a, L, S>(scenario: &'static str, ctx: &'a Ctx, lf: &'a L, sf: &'a S) -> ScenarioFuture<'a>
where
    L: LockServiceFactory,
    crate::FencingOf<L>: FencedScenarios,
    S: FencedStoreFactory,
{
    <crate::FencingOf<L> as FencedScenarios>::run(scenario, ctx, lf, sf)
}
