//! How to take a lock, by name: how long to hold it and how long to wait for it.

use std::time::Duration;

/// How long a lock is held and how long to wait for it, named so they cannot be swapped.
///
/// Two positional durations invite a silent swap when code is ported from a library with the
/// other order (Redisson's `tryLock(wait, lease)`); here each has its name:
///
/// ```
/// use std::time::Duration;
/// use palisade_core::LockOptions;
///
/// let options = LockOptions::ttl(Duration::from_secs(30)).wait(Duration::from_secs(5));
/// assert_eq!(options.ttl, Duration::from_secs(30));
/// assert_eq!(options.wait, Duration::from_secs(5));
///
/// // Without a wait: one attempt, a `Timeout` error at once if the lock is held.
/// assert_eq!(LockOptions::ttl(Duration::from_secs(30)).wait, Duration::ZERO);
/// assert_eq!(LockOptions::default(), LockOptions::ttl(LockOptions::DEFAULT_TTL));
/// ```
///
/// Both are validated when the lock is taken: a TTL of zero or above 24 h and a wait above
/// 24 h are [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct LockOptions {
    /// How long the lock is held unless extended: the lease's TTL. The holder must finish (or
    /// extend) within it; after it, another caller may take the lock, and the fence is what
    /// keeps a late holder's writes out.
    pub ttl: Duration,
    /// How long to wait for a held lock to come free. Zero (the default) makes exactly one
    /// attempt: the lock if it is free, [`ErrorKind::Timeout`](crate::ErrorKind::Timeout) at
    /// once if it is held.
    pub wait: Duration,
}

impl LockOptions {
    /// The TTL of [`LockOptions::default`]: 30 s, long enough for most critical sections and
    /// short enough that a crashed holder does not block others for long.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

    /// Hold the lock for `ttl`, making one attempt (no wait).
    pub const fn ttl(ttl: Duration) -> Self {
        LockOptions { ttl, wait: Duration::ZERO }
    }

    /// Wait up to `wait` for the lock to come free (zero: one attempt).
    #[must_use]
    pub const fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }
}

impl Default for LockOptions {
    /// A TTL of [`DEFAULT_TTL`](LockOptions::DEFAULT_TTL), no wait.
    fn default() -> Self {
        LockOptions::ttl(LockOptions::DEFAULT_TTL)
    }
}
