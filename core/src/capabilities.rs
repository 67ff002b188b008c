//! What a lock service promises, declared so that users and the conformance suite can check it.

/// Where a lock service's fences come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FenceSource {
    /// A per-resource counter incremented with every grant (Redis `INCR`, the in-memory service).
    Counter,
    /// A cluster-wide revision (etcd's create revision of the lock key).
    Revision,
    /// A cluster-wide transaction id (ZooKeeper's `czxid` of the lock node).
    Zxid,
    /// No fence at all (Redlock): an efficiency lock, not a safety lock.
    #[default]
    None,
}

/// How `acquire` waits for a held lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Waiting {
    /// Retries `try_acquire` with backoff and jitter (the trait's default `acquire`).
    #[default]
    Polling,
    /// Waiters are woken when the lock is released, in no particular order.
    Native,
    /// Waiters are queued and granted in arrival order.
    NativeFifo,
}

/// The guarantees a lock service declares. The conformance suite checks each one it declares,
/// and checks the documented refusal for each one it does not.
///
/// Construct with struct-update syntax so new fields keep their defaults:
///
/// ```
/// use palisade_core::{Capabilities, FenceSource, Waiting};
///
/// let caps = Capabilities {
///     fence_source: FenceSource::Counter,
///     fences_survive_release: true,
///     gap_free: true,
///     waiting: Waiting::Native,
///     ..Capabilities::default()
/// };
/// assert!(caps.issues_fences());
/// assert!(!caps.fences_survive_restart);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Capabilities {
    /// Where fences come from. Default: [`FenceSource::None`].
    pub fence_source: FenceSource,
    /// Fences keep increasing across release, expiry and takeover of a resource. Default: false.
    pub fences_survive_release: bool,
    /// Fences keep increasing across a restart of the lock service (its state is durable).
    /// Default: false.
    pub fences_survive_restart: bool,
    /// Consecutive grants of one resource get consecutive fences (no gaps). Default: false.
    pub gap_free: bool,
    /// How waiting works. Default: [`Waiting::Polling`].
    pub waiting: Waiting,
    /// How long beyond a grant's TTL the service may keep the lock of a holder that stopped
    /// (crashed, froze): the session timeout where locks live in a session (etcd, ZooKeeper),
    /// zero where the server expires the lock at its TTL. The conformance suite refuses a test
    /// timing whose expiry margin this does not explain. Default: zero.
    pub expiry_delay: std::time::Duration,
}

impl Capabilities {
    /// Whether the service issues fences at all.
    pub fn issues_fences(&self) -> bool {
        self.fence_source != FenceSource::None
    }
}
