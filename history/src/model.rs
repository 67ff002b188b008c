//! What a history is made of: the events clients and the nemesis record, and the operations
//! they pair into.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// A client process of the run. A process that is killed and started again comes back as a
/// new process (its unfinished operation stays unfinished: its outcome is unknown forever).
pub type Process = u32;

/// Nanoseconds on the machine's monotonic clock (`CLOCK_MONOTONIC`), which every process on
/// one machine shares: comparable across processes, and never jumps with the wall clock.
pub type Time = u64;

/// One line of a history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Event {
    /// A process began an operation. `within_ms` is the bound it promises to answer within
    /// (its wait, plus the time an answer may take), when nothing is faulted.
    Invoke {
        /// Who.
        process: Process,
        /// The operation's number, unique within its process.
        op: u64,
        /// When.
        at: Time,
        /// The bound the process promises to answer within.
        within_ms: u64,
        /// What it asked for.
        call: Call,
    },
    /// The operation `op` of `process` ended.
    Complete {
        /// Who.
        process: Process,
        /// The number its invocation gave.
        op: u64,
        /// When.
        at: Time,
        /// How it ended.
        outcome: Outcome,
    },
    /// The nemesis began a fault (`id` pairs it with its [`Event::Healed`]).
    Fault {
        /// When.
        at: Time,
        /// The fault's number in the schedule.
        id: u64,
        /// What it is, in words (`pause client 3 for 2400 ms`).
        what: String,
        /// Whether the lock service loses its locks in this fault (restarted empty, its lock
        /// table dropped): holds granted before it may overlap holds granted after it, which
        /// only the store's fence check then keeps apart.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        loses_locks: bool,
    },
    /// The fault `id` ended: the paused process runs again, the partition heals, the server
    /// is back.
    Healed {
        /// When.
        at: Time,
        /// The fault's number.
        id: u64,
    },
    /// The nemesis killed `process`: none of its unfinished operations will complete.
    Crashed {
        /// When.
        at: Time,
        /// Who.
        process: Process,
    },
}

impl Event {
    /// When the event happened.
    pub fn at(&self) -> Time {
        match self {
            Event::Invoke { at, .. }
            | Event::Complete { at, .. }
            | Event::Fault { at, .. }
            | Event::Healed { at, .. }
            | Event::Crashed { at, .. } => *at,
        }
    }
}

/// What an operation asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "snake_case")]
pub enum Call {
    /// Take the lock of `resource` for `ttl_ms`.
    Acquire {
        /// The resource.
        resource: String,
        /// The lease's time to live.
        ttl_ms: u64,
    },
    /// Extend the grant `grant`.
    Extend {
        /// The resource.
        resource: String,
        /// The grant, as its acquire named it.
        grant: String,
    },
    /// Give the grant back.
    Release {
        /// The resource.
        resource: String,
        /// The grant, as its acquire named it.
        grant: String,
    },
    /// Write `value` to the resource's register through the fenced store, under `grant`,
    /// whose fence is `fence`. Every value is written at most once in a history.
    Write {
        /// The resource.
        resource: String,
        /// The grant written under.
        grant: String,
        /// The grant's fence.
        fence: u64,
        /// The value, unique in the history.
        value: String,
    },
    /// Read the resource's register.
    Read {
        /// The resource.
        resource: String,
    },
    /// Allocate `qty` units of the SKU `resource` for `job`, under `grant`, whose fence is
    /// `fence`: the warehouse's allocation, one fenced write of the stock and the job's audit
    /// row, applied only if the job has no audit row yet. `attempt` is unique in a history, and
    /// is what the audit row names.
    Allocate {
        /// The SKU (its lock is this resource's).
        resource: String,
        /// The grant written under.
        grant: String,
        /// The grant's fence.
        fence: u64,
        /// The job: many attempts may name one job, at most one may be applied.
        job: String,
        /// This attempt, unique in the history.
        attempt: String,
        /// Units taken from the stock.
        qty: i64,
    },
    /// Set the SKU's stock, before any client runs: where the stock check starts from.
    Restock {
        /// The SKU.
        resource: String,
        /// Units in stock.
        qty: i64,
    },
    /// Read the SKU's stock.
    Stock {
        /// The SKU.
        resource: String,
    },
    /// Read the SKU's audit: which attempts were applied, per job. Recorded once the clients
    /// have stopped, it is the last word on which allocations landed.
    Audit {
        /// The SKU.
        resource: String,
    },
}

impl Call {
    /// The resource the call is about.
    pub fn resource(&self) -> &str {
        match self {
            Call::Acquire { resource, .. }
            | Call::Extend { resource, .. }
            | Call::Release { resource, .. }
            | Call::Write { resource, .. }
            | Call::Read { resource }
            | Call::Allocate { resource, .. }
            | Call::Restock { resource, .. }
            | Call::Stock { resource }
            | Call::Audit { resource } => resource,
        }
    }
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// An acquire was granted: `grant` names the lease in later calls.
    Granted {
        /// The name later calls give the lease.
        grant: String,
        /// The grant's fencing token.
        fence: u64,
        /// Until when the holder was told its lease is safe to act under (its `safe_until`,
        /// on the history's clock); `None` where the recorder does not know.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        safe_until: Option<Time>,
    },
    /// An acquire found the lock held for its whole wait.
    Refused,
    /// An extend or a release succeeded.
    Done {
        /// For an extend: until when the lease is now safe to act under (as for
        /// [`Outcome::Granted`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        safe_until: Option<Time>,
    },
    /// An extend or a release found the grant gone (expired, taken over).
    Lost,
    /// The store accepted a write.
    Accepted,
    /// The store refused a write: its fence was below the resource's watermark.
    Stale,
    /// The store refused a write: its fence equalled the watermark but came from another grant.
    Duplicate,
    /// The operation certainly did not take effect (an error the callee guarantees left
    /// nothing behind).
    Failed {
        /// The error, as displayed.
        error: String,
    },
    /// A read's answer.
    Value {
        /// `None`: the register was empty.
        value: Option<String>,
    },
    /// An allocation found its job already applied (by another attempt), and left the stock
    /// alone.
    AlreadyDone,
    /// A stock read's answer.
    Units {
        /// `None`: the SKU has no stock record.
        qty: Option<i64>,
    },
    /// An audit read's answer: the attempts applied, per job.
    Audited {
        /// Job → the attempts of it the audit holds (more than one is a job applied twice).
        jobs: BTreeMap<String, Vec<String>>,
    },
    /// The operation may or may not have taken effect (a timeout, a lost connection): Jepsen's
    /// `:info`.
    Unknown {
        /// The error, as displayed (or why there was no answer).
        error: String,
    },
}

/// An operation: its call paired with its outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Operation {
    /// Who.
    pub process: Process,
    /// Its number within the process.
    pub op: u64,
    /// What it asked for.
    pub call: Call,
    /// When it began.
    pub invoked: Time,
    /// The bound it promised to answer within.
    pub within_ms: u64,
    /// `None`: it never completed (its process was killed, or the run ended first).
    pub completed: Option<Time>,
    /// How it ended; `None` as for `completed`.
    pub outcome: Option<Outcome>,
}

impl Operation {
    /// The time it completed, or the end of time if it never did (its effect, if any, may land
    /// at any moment after its invocation).
    pub fn completed_or_never(&self) -> Time {
        self.completed.unwrap_or(Time::MAX)
    }

    /// The time by which its effect, if it had one, certainly took place: its completion,
    /// or the end of time if its outcome is unknown (an unanswered write may still land).
    pub fn effect_by(&self) -> Time {
        if self.is_indeterminate() { Time::MAX } else { self.completed_or_never() }
    }

    /// Whether the outcome is unknown: it may have taken effect or not.
    pub fn is_indeterminate(&self) -> bool {
        matches!(self.outcome, None | Some(Outcome::Unknown { .. }))
    }
}

impl Operation {
    /// The operation in one line, its times in milliseconds after `origin` (a report's start).
    pub fn describe(&self, origin: Time) -> String {
        Shown { op: self, origin }.to_string()
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Shown { op: self, origin: 0 }.fmt(f)
    }
}

struct Shown<'a> {
    op: &'a Operation,
    origin: Time,
}

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let origin = self.origin;
        let t = |ns: Time| ns.saturating_sub(origin) as f64 / 1e6;
        let this = self.op;
        write!(f, "p{} #{} [{:.3} ms → ", this.process, this.op, t(this.invoked))?;
        match this.completed {
            Some(c) => write!(f, "{:.3} ms] ", t(c))?,
            None => f.write_str("never] ")?,
        }
        match &this.call {
            Call::Acquire { resource, ttl_ms } => write!(f, "acquire {resource} ttl {ttl_ms} ms")?,
            Call::Extend { resource, grant } => write!(f, "extend {resource} {grant}")?,
            Call::Release { resource, grant } => write!(f, "release {resource} {grant}")?,
            Call::Write { resource, grant, fence, value } => {
                write!(f, "write {resource} {value:?} fence {fence} ({grant})")?
            }
            Call::Read { resource } => write!(f, "read {resource}")?,
            Call::Allocate { resource, grant, fence, job, attempt, qty } => {
                write!(f, "allocate {qty} of {resource} for {job} (attempt {attempt}) fence {fence} ({grant})")?
            }
            Call::Restock { resource, qty } => write!(f, "restock {resource} to {qty}")?,
            Call::Stock { resource } => write!(f, "stock of {resource}")?,
            Call::Audit { resource } => write!(f, "audit of {resource}")?,
        }
        match &this.outcome {
            None => f.write_str(" → no answer"),
            Some(Outcome::Granted { grant, fence, .. }) => write!(f, " → granted {grant} fence {fence}"),
            Some(Outcome::Value { value: Some(v) }) => write!(f, " → {v:?}"),
            Some(Outcome::Value { value: None }) => f.write_str(" → empty"),
            Some(Outcome::Failed { error }) => write!(f, " → failed: {error}"),
            Some(Outcome::Unknown { error }) => write!(f, " → unknown: {error}"),
            Some(Outcome::Units { qty: Some(qty) }) => write!(f, " → {qty} units"),
            Some(Outcome::Units { qty: None }) => f.write_str(" → no stock record"),
            Some(Outcome::Audited { jobs }) => {
                let attempts: usize = jobs.values().map(Vec::len).sum();
                write!(f, " → {} jobs, {attempts} attempts applied", jobs.len())
            }
            Some(other) => write!(f, " → {}", outcome_name(other)),
        }
    }
}

fn outcome_name(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Granted { .. } => "granted",
        Outcome::Refused => "refused",
        Outcome::Done { .. } => "done",
        Outcome::Lost => "lost",
        Outcome::Accepted => "accepted",
        Outcome::Stale => "stale fence",
        Outcome::Duplicate => "duplicate fence",
        Outcome::Failed { .. } => "failed",
        Outcome::Value { .. } => "value",
        Outcome::AlreadyDone => "already done",
        Outcome::Units { .. } => "units",
        Outcome::Audited { .. } => "audited",
        Outcome::Unknown { .. } => "unknown",
    }
}

/// A fault window the nemesis recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FaultWindow {
    /// The fault's number.
    pub id: u64,
    /// What it was.
    pub what: String,
    /// Whether the lock service lost its locks in it.
    pub loses_locks: bool,
    /// When it began.
    pub began: Time,
    /// `None`: never healed (the run ended inside it).
    pub healed: Option<Time>,
}

/// A history, its events paired into operations.
#[derive(Debug, Clone, Default, Serialize)]
pub struct History {
    /// In order of invocation.
    pub operations: Vec<Operation>,
    /// The nemesis's faults, in the order they began.
    pub faults: Vec<FaultWindow>,
    /// When each killed process was killed.
    pub crashed: BTreeMap<Process, Time>,
    /// The last event's time.
    pub end: Time,
}

/// A history that cannot be read: the recorder broke its own rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedHistory(pub String);

impl fmt::Display for MalformedHistory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed history: {}", self.0)
    }
}

impl std::error::Error for MalformedHistory {}

impl History {
    /// Pairs events into operations. Every completion needs its invocation, an operation
    /// completes at most once, and a process runs one operation at a time.
    pub fn from_events(events: impl IntoIterator<Item = Event>) -> Result<History, MalformedHistory> {
        let mut history = History::default();
        let mut open: BTreeMap<(Process, u64), usize> = BTreeMap::new();
        let mut running: BTreeMap<Process, u64> = BTreeMap::new();
        let mut faults: BTreeMap<u64, usize> = BTreeMap::new();
        let mut events: Vec<Event> = events.into_iter().collect();
        // Stable: events of one process keep their order even at the same nanosecond.
        events.sort_by_key(Event::at);
        for event in events {
            history.end = history.end.max(event.at());
            match event {
                Event::Invoke { process, op, at, within_ms, call } => {
                    if let Some(other) = running.insert(process, op) {
                        return Err(MalformedHistory(format!(
                            "process {process} invoked #{op} while #{other} was still running"
                        )));
                    }
                    if open.insert((process, op), history.operations.len()).is_some() {
                        return Err(MalformedHistory(format!("process {process} invoked #{op} twice")));
                    }
                    history.operations.push(Operation {
                        process,
                        op,
                        call,
                        invoked: at,
                        within_ms,
                        completed: None,
                        outcome: None,
                    });
                }
                Event::Complete { process, op, at, outcome } => {
                    let Some(i) = open.remove(&(process, op)) else {
                        return Err(MalformedHistory(format!(
                            "process {process} completed #{op}, which it never invoked or completed already"
                        )));
                    };
                    running.remove(&process);
                    let operation = &mut history.operations[i];
                    operation.completed = Some(at);
                    operation.outcome = Some(outcome);
                }
                Event::Fault { at, id, what, loses_locks } => {
                    faults.insert(id, history.faults.len());
                    history.faults.push(FaultWindow { id, what, loses_locks, began: at, healed: None });
                }
                Event::Healed { at, id } => {
                    let Some(&i) = faults.get(&id) else {
                        return Err(MalformedHistory(format!("fault {id} healed but never began")));
                    };
                    history.faults[i].healed = Some(at);
                }
                Event::Crashed { at, process } => {
                    history.crashed.insert(process, at);
                    running.remove(&process);
                }
            }
        }
        Ok(history)
    }

    /// Reads a history written as JSON lines, one [`Event`] per line.
    pub fn from_json_lines(text: &str) -> Result<History, MalformedHistory> {
        let events = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .enumerate()
            .map(|(n, line)| {
                serde_json::from_str::<Event>(line).map_err(|e| MalformedHistory(format!("line {}: {e}", n + 1)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        History::from_events(events)
    }

    /// When the last fault healed (`None` if no fault ever began; a fault never healed counts
    /// as healing at the end).
    pub fn last_heal(&self) -> Option<Time> {
        self.faults.iter().map(|f| f.healed.unwrap_or(self.end)).max()
    }
}
