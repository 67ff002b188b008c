//! # palisade-history
//!
//! Histories of what clients of a lock service and a fenced store did, and a checker that
//! judges a history alone, the way Jepsen judges a database: it knows nothing of the code that
//! produced the history, only what each client asked, when, and what it was told.
//!
//! - [`model`]: the events a run records ([`Event`], one JSON line each) and the operations
//!   they pair into ([`History`]).
//! - [`mod@check`]: what a correct system's history never shows ([`check()`], [`AnomalyKind`]),
//!   per resource: fences applied out of order or from two grants, two holders' writes
//!   interleaved, two grants that both wrote while both leases were safe, a register that is not linearizable (writes of unknown outcome taken as
//!   Jepsen takes `:info`), no progress after the last fault healed, and calls that outlive
//!   their bound.
//!
//! Why not an existing checker: the Rust linearizability checkers at hand either cannot take
//! operations of unknown outcome (`todc-utils`' WGL checker) or drive the code under test
//! themselves (`lincheck`, on loom); Porcupine and Knossos are Go and Clojure. A register
//! whose values are written once has an exact O(n log n) test (the zone test, in [`mod@check`]),
//! so a small checker of its own is both exact and fast, and its tests below are histories
//! each known to be bad.
//!
//! ```
//! use palisade_history::{Bounds, Call, Event, History, Outcome, check};
//!
//! let write = |p, at, value: &str| Event::Invoke {
//!     process: p, op: at, at, within_ms: 1000,
//!     call: Call::Write { resource: "r".into(), grant: format!("g{p}"), fence: p.into(), value: value.into() },
//! };
//! let done = |p, op, at| Event::Complete { process: p, op, at, outcome: Outcome::Accepted };
//! // Fence 2 is applied, then fence 1: the store let a stale holder write.
//! let history = History::from_events([write(2, 10, "b"), done(2, 10, 20), write(1, 30, "a"), done(1, 30, 40)])?;
//! let verdict = check(&history, Bounds { progress_ms: 10_000, allowance_ms: 2_000 });
//! assert_eq!(verdict.anomalies[0].kind, palisade_history::AnomalyKind::FenceOrder);
//! # Ok::<(), palisade_history::MalformedHistory>(())
//! ```

pub mod check;
pub mod model;

pub use check::{Anomaly, AnomalyKind, Bounds, Verdict, check};
pub use model::{Call, Event, FaultWindow, History, MalformedHistory, Operation, Outcome, Process, Time};
