//! Running scenarios: a runtime, a local metrics recorder, reports and failures.

pub mod bounds;
pub(crate) mod child;

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::time::Instant;

use crate::bounds::{CallBounds, DEFAULT_ROUND_TRIP};

/// What a passing scenario measured (timings, counts), for the test log.
#[derive(Debug, Clone)]
pub struct Report {
    /// The scenario's name.
    pub scenario: &'static str,
    /// How long it ran.
    pub elapsed: Duration,
    /// Figures worth reading (handoff latency, achieved rate, …).
    pub notes: Vec<String>,
    /// What the pass means: the guarantee checked, its documented refusal checked, or
    /// nothing to check for what the service and store declare.
    pub status: Status,
}

/// What a passing scenario checked, for the certification report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Status {
    /// The guarantee was checked and holds.
    #[default]
    Checked,
    /// The service does not declare the guarantee; its documented refusal was checked instead.
    RefusalChecked,
    /// Nothing to check for what was declared (a store that lives in one process has no
    /// process-level scenario; a service without FIFO has no order to check).
    NotApplicable,
}

impl Status {
    /// The status's name in reports (`checked`, `refusal checked`, `not applicable`).
    pub fn name(self) -> &'static str {
        match self {
            Status::Checked => "checked",
            Status::RefusalChecked => "refusal checked",
            Status::NotApplicable => "not applicable",
        }
    }
}

/// A broken guarantee: which scenario, and what was observed.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The scenario's name.
    pub scenario: &'static str,
    /// What went wrong, naming the guarantee.
    pub message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conformance scenario `{}` failed: {}", self.scenario, self.message)
    }
}

impl std::error::Error for Failure {}

/// A scenario's result.
pub type Outcome = Result<Report, Failure>;

/// Fails the scenario with a formatted message unless the condition holds. (Crate-private:
/// it stays out of the namespace of the backend authors who use this crate.)
macro_rules! ensure {
    ($ctx:expr, $cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err($ctx.fail(format!($($msg)+)));
        }
    };
}

/// Unwraps a `Result`, failing the scenario with context on `Err`.
macro_rules! attempt {
    ($ctx:expr, $result:expr, $what:expr) => {
        match $result {
            Ok(v) => v,
            Err(e) => return Err($ctx.fail(format!("{}: {}", $what, e))),
        }
    };
}

pub(crate) use {attempt, ensure};

/// What a scenario knows about the run it is part of.
pub struct Ctx {
    scenario: &'static str,
    test_name: String,
    started: Instant,
    notes: Mutex<Vec<String>>,
    status: Mutex<Status>,
    declared: Mutex<Declared>,
    metrics: Option<Snapshotter>,
    bounds: CallBounds,
}

/// What a scenario learned about what it certifies: the backends' names and declarations, and
/// which hooks the factories provided.
#[derive(Debug, Clone, Default)]
pub struct Declared {
    /// The lock service's backend name and its `Capabilities` (debug form), once a client was made.
    pub service: Option<(String, String)>,
    /// The store's backend name, once a client was made.
    pub store: Option<String>,
    /// Each hook the scenario asked for, and whether the factory provided it.
    pub hooks: Vec<(&'static str, bool)>,
}

impl Ctx {
    /// A context for `scenario`, re-executable as the libtest test `test_name` (the child role
    /// of process-level scenarios runs by re-executing the test binary on that name).
    pub fn new(scenario: &'static str, test_name: impl Into<String>) -> Self {
        Ctx {
            scenario,
            test_name: test_name.into(),
            started: Instant::now(),
            notes: Mutex::new(Vec::new()),
            status: Mutex::new(Status::Checked),
            declared: Mutex::new(Declared::default()),
            metrics: None,
            bounds: CallBounds::new(DEFAULT_ROUND_TRIP),
        }
    }

    fn with_metrics(mut self, snapshotter: Snapshotter) -> Self {
        self.metrics = Some(snapshotter);
        self
    }

    fn with_bounds(mut self, bounds: CallBounds) -> Self {
        self.bounds = bounds;
        self
    }

    /// The log of the calls of this scenario's clients that outlived their bounds: the suite
    /// macros wrap the factories with it ([`BoundedLockFactory::declared`]), and
    /// [`within_bounds`] fails the scenario on any entry.
    ///
    /// [`BoundedLockFactory::declared`]: crate::bounds::BoundedLockFactory::declared
    pub fn bounds(&self) -> &CallBounds {
        &self.bounds
    }

    /// The scenario's name.
    pub fn scenario(&self) -> &'static str {
        self.scenario
    }

    /// The libtest name of the test running this scenario.
    pub fn test_name(&self) -> &str {
        &self.test_name
    }

    /// A failure of this scenario.
    pub fn fail(&self, message: impl Into<String>) -> Failure {
        Failure { scenario: self.scenario, message: message.into() }
    }

    /// Records a figure for the report.
    pub fn note(&self, note: impl Into<String>) {
        self.notes.lock().unwrap_or_else(PoisonError::into_inner).push(note.into());
    }

    /// Records that the guarantee is not declared and its documented refusal was checked
    /// (`what` says which refusal), for the certification report.
    pub fn refusal_checked(&self, what: impl Into<String>) {
        *self.status.lock().unwrap_or_else(PoisonError::into_inner) = Status::RefusalChecked;
        self.note(what);
    }

    /// Records that nothing applies to what was declared (`why` says what), for the
    /// certification report.
    pub fn not_applicable(&self, why: impl Into<String>) {
        *self.status.lock().unwrap_or_else(PoisonError::into_inner) = Status::NotApplicable;
        self.note(why);
    }

    /// Records the lock service under test (its backend name and declarations).
    pub fn saw_service(&self, backend: &str, capabilities: &palisade_core::Capabilities) {
        let mut declared = self.declared.lock().unwrap_or_else(PoisonError::into_inner);
        if declared.service.is_none() {
            declared.service = Some((backend.to_string(), format!("{capabilities:?}")));
        }
    }

    /// Records the store under test.
    pub fn saw_store(&self, backend: &str) {
        let mut declared = self.declared.lock().unwrap_or_else(PoisonError::into_inner);
        if declared.store.is_none() {
            declared.store = Some(backend.to_string());
        }
    }

    /// Records that the scenario asked the factory for `hook` and whether it was provided.
    pub fn saw_hook(&self, hook: &'static str, provided: bool) {
        let mut declared = self.declared.lock().unwrap_or_else(PoisonError::into_inner);
        if !declared.hooks.iter().any(|(h, _)| *h == hook) {
            declared.hooks.push((hook, provided));
        }
    }

    /// What the scenario learned about what it certifies.
    pub fn declared(&self) -> Declared {
        self.declared.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The scenario's report so far.
    pub fn report(&self) -> Report {
        Report {
            scenario: self.scenario,
            elapsed: self.started.elapsed(),
            notes: self.notes.lock().unwrap_or_else(PoisonError::into_inner).clone(),
            status: *self.status.lock().unwrap_or_else(PoisonError::into_inner),
        }
    }

    /// How much the counter `name` (all labels summed) went up since the last call, or `None`
    /// when the scenario runs without the harness's recorder.
    pub fn take_counter(&self, name: &str) -> Option<u64> {
        let snapshotter = self.metrics.as_ref()?;
        Some(
            snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .filter(|(k, _, _, _)| k.key().name() == name)
                .map(|(_, _, _, v)| if let DebugValue::Counter(c) = v { c } else { 0 })
                .sum(),
        )
    }
}

/// Runs one scenario the way the suite macros do: on a multi-thread Tokio runtime (two
/// workers) inside a local `metrics` recorder (so counters are this scenario's own), printing the report and
/// panicking with the failure. `make` builds the scenario future from its context.
pub fn run<F, Fut>(scenario: &'static str, test_name: &str, make: F)
where
    F: FnOnce(Arc<Ctx>) -> Fut,
    Fut: Future<Output = Outcome>,
{
    let (outcome, _) = run_outcome(scenario, test_name, make);
    finish(scenario, outcome);
}

/// Ends a test with its scenario's outcome: the report printed for the test log under `label`,
/// or a panic with the failure.
pub(crate) fn finish(label: &str, outcome: Outcome) {
    match outcome {
        Ok(report) => {
            let notes = if report.notes.is_empty() { String::new() } else { format!(" [{}]", report.notes.join("; ")) };
            println!("conformance: {label} {} in {:.3} s{notes}", report.status.name(), report.elapsed.as_secs_f64());
        }
        Err(failure) => panic!("{failure}"),
    }
}

/// Runs one scenario like [`run`] and returns its outcome and what it learned about what it
/// certifies, instead of printing and panicking.
pub fn run_outcome<F, Fut>(scenario: &'static str, test_name: &str, make: F) -> (Outcome, Declared)
where
    F: FnOnce(Arc<Ctx>) -> Fut,
    Fut: Future<Output = Outcome>,
{
    let recorder = DebuggingRecorder::new();
    // The holder process is frozen with SIGSTOP on purpose: its calls are slow because of the
    // test, and the parent judges what the holder reports.
    let bounds = if crate::is_child_process() { CallBounds::unenforced() } else { CallBounds::new(DEFAULT_ROUND_TRIP) };
    let ctx = Arc::new(Ctx::new(scenario, test_name).with_metrics(recorder.snapshotter()).with_bounds(bounds));
    let outcome = metrics::with_local_recorder(&recorder, || {
        // Two workers: tasks race for real (a store's check and write, a waiter and a
        // release). The scenario itself runs on this thread, inside the local recorder.
        let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
            Ok(rt) => rt,
            Err(e) => return Err(ctx.fail(format!("cannot build a Tokio runtime: {e}"))),
        };
        runtime.block_on(make(Arc::clone(&ctx)))
    });
    (within_bounds(&ctx, outcome), ctx.declared())
}

/// `outcome`, unless a call of the scenario's bounded clients outlived its bound (logged in
/// [`Ctx::bounds`]): then the scenario fails, even if it passed, naming the first few calls.
/// The violation is the root cause, so it leads the message; what the scenario failed with
/// afterwards (often the error the abandoned call answered with) follows it.
pub fn within_bounds(ctx: &Ctx, outcome: Outcome) -> Outcome {
    let Some(violations) = ctx.bounds().take_failure() else { return outcome };
    let message = match outcome {
        Ok(_) => violations,
        Err(failure) => format!("{violations} (and then: {})", failure.message),
    };
    Err(ctx.fail(message))
}

/// The libtest name of a test generated at `module_path` (which starts with the crate name,
/// which libtest leaves out).
pub fn test_name(module_path: &str, function: &str) -> String {
    match module_path.split_once("::") {
        Some((_, rest)) => format!("{rest}::{function}"),
        None => function.to_string(),
    }
}

/// Reads the environment variable naming a backend's server.
///
/// A missing variable **fails** the test, in CI and out of it: a backend test that skips when
/// its server is absent reports green without having run. Start the servers with the
/// project's test command (`scripts/test`) or `scripts/services up`.
pub fn require_env(name: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!(
            "environment variable {name} is not set: this test needs its server. Run `scripts/test` \
             (which starts every server on loopback) or `scripts/services up` and export the printed variables"
        ),
    }
}

/// Checks that `error` is a refusal the caller must fix, not retry: an
/// [`ErrorKind::InvalidConfig`](palisade_core::ErrorKind::InvalidConfig), not retryable, whose
/// message says `cause` (case aside). What every backend's connection tests check of a refused
/// TLS handshake, login or setting.
///
/// # Panics
///
/// When it is not: that is the failure it reports.
pub fn assert_config_error(error: &palisade_core::Error, cause: &str) {
    assert_eq!(error.kind(), palisade_core::ErrorKind::InvalidConfig, "{error:?}");
    assert!(!error.is_retryable(), "a configuration error marked retryable: {error:?}");
    let said = error.to_string();
    assert!(said.to_lowercase().contains(&cause.to_lowercase()), "{said:?} does not say {cause:?}");
}
