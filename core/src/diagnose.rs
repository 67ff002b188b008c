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

/// The check of a group that decides by majority (etcd's voting members, ZooKeeper's voting
/// servers, Redlock's masters): `count` of them, each called `noun`. One or two warn (the
/// loss of one stops everything; `alone` says what a lone member's loss costs besides), an
/// even count warns (it tolerates no more losses than one fewer), an odd count of three or
/// more passes. `name` is the check's name (`"cluster size"`).
pub fn majority_group(name: &str, count: usize, noun: &str, alone: &str, protects: &'static str) -> Check {
    let majority = count / 2 + 1;
    let tolerated = count.saturating_sub(majority);
    match count {
        0..=2 => Check::new(
            name,
            Verdict::Warn,
            format!(
                "{count} {noun}{}, a majority of {majority}: while {} down, nothing is granted; {alone}; run 3 or 5",
                if count == 1 { "" } else { "s" },
                if count <= 1 { "it is" } else { "either is" }
            ),
            protects,
        ),
        n if n % 2 == 0 => Check::new(
            name,
            Verdict::Warn,
            format!(
                "{n} {noun}s, a majority of {majority}: an even count survives no more losses ({tolerated}) than {} \
                 would, and needs more of them to agree; run an odd number",
                n - 1
            ),
            protects,
        ),
        n => Check::new(
            name,
            Verdict::Pass,
            format!("{n} {noun}s, a majority of {majority}: grants go on with {tolerated} of them down"),
            protects,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn majority_groups_of_every_size() {
        let verdict = |n| majority_group("size", n, "member", "a lost disk loses the counters", "p").verdict;
        assert_eq!(
            [0, 1, 2, 3, 4, 5, 6, 7].map(verdict),
            [
                Verdict::Warn,
                Verdict::Warn,
                Verdict::Warn,
                Verdict::Pass,
                Verdict::Warn,
                Verdict::Pass,
                Verdict::Warn,
                Verdict::Pass
            ]
        );
        let one = majority_group("size", 1, "member", "a lost disk loses the counters", "p");
        assert!(one.found.contains("1 member, a majority of 1: while it is down"), "{}", one.found);
        assert!(majority_group("size", 5, "server", "", "p").found.contains("with 2 of them down"));
    }
}
