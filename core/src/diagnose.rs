//! Whether a deployment's servers are configured for the guarantees Palisade claims, as far as
//! a client can read their configuration: for the person who deploys (`palisade doctor`), never
//! on a lock's path.

use std::fmt;

use async_trait::async_trait;

use crate::error::Result;

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Verdict {
    /// The setting gives the guarantee.
    Pass,
    /// The guarantee holds only under conditions the check cannot see (a setting that
    /// matters only once memory fills, a crash inside a second), or the setting could not be
    /// read.
    Warn,
    /// The setting breaks the guarantee.
    Fail,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "pass",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        })
    }
}

/// One check of a server's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Check {
    /// What was checked, as the server names it (`maxmemory-policy`, `synchronous_commit`).
    pub name: String,
    /// How it came out.
    pub verdict: Verdict,
    /// What was found, and why it passes or not.
    pub found: String,
    /// The guarantee the setting protects.
    pub protects: &'static str,
}

impl Check {
    /// A check of `name` that came out `verdict`, having found `found`, protecting `protects`.
    pub fn new(name: impl Into<String>, verdict: Verdict, found: impl Into<String>, protects: &'static str) -> Self {
        Check { name: name.into(), verdict, found: found.into(), protects }
    }
}

/// A backend's checks of its servers' configuration.
///
/// Contract: the checks change nothing a lock or a store relies on. They read, but for what a
/// backend must make to see a setting that shows only in how the server answers (etcd raises a
/// lease's TTL to its minimum without a word: its check grants one lease and revokes it). A
/// setting the client may not read (a command disabled, a permission missing) is a
/// [`Verdict::Warn`] that says so, not an error; an error is a server that cannot be reached
/// at all.
#[async_trait]
pub trait Diagnose: Send + Sync + 'static {
    /// The backend's short name.
    fn backend(&self) -> &'static str;

    /// Reads the servers' configuration and judges each setting that a guarantee depends on.
    async fn diagnose(&self) -> Result<Vec<Check>>;
}

/// A backend's checks behind a pointer: what `palisade::diagnose_lock` returns.
pub type DynDiagnose = dyn Diagnose;
