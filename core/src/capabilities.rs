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
/// assert!(caps.offers(palisade_core::Primitive::ReadWriteLock));
/// assert!(!caps.fifo(palisade_core::Primitive::Mutex), "woken, not queued");
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
    /// Where the service runs, which decides the faults it must be tested against: a
    /// networked service must survive lost replies, cut connections and partitions (its
    /// certification needs a client behind a fault proxy). Default: [`Deployment::Network`],
    /// the strictest.
    pub deployment: Deployment,
    /// How the service is replicated, which decides the failures it must be tested against:
    /// a leader-based quorum must keep its promises when its leader dies (its certification
    /// needs a cluster whose leader it can kill). Default: [`Replication::None`].
    pub replication: Replication,
    /// How [`LockService::try_acquire_all`](crate::LockService::try_acquire_all) takes a set of
    /// keys, which decides how many requests an uncontended
    /// [`lock_all`](crate::LockServiceExt::lock_all) costs. Default: [`MultiAcquire::PerKey`].
    pub multi_acquire: MultiAcquire,
}

impl Capabilities {
    /// Whether the service issues fences at all.
    pub fn issues_fences(&self) -> bool {
        self.fence_source != FenceSource::None
    }

    /// Whether the service can carry `primitive`. Every coordination primitive is built on the
    /// service's fenced mutex and is fenced itself, so a service without fences (Redlock)
    /// offers none of them; the types say so too: [`Semaphore`](crate::Semaphore),
    /// [`RwLock`](crate::RwLock) and [`Election`](crate::Election) require
    /// `LockService<Fencing = Fenced>`.
    pub fn offers(&self, primitive: Primitive) -> bool {
        match primitive {
            Primitive::Mutex => true,
            Primitive::Semaphore | Primitive::ReadWriteLock | Primitive::Election => self.issues_fences(),
        }
    }

    /// Whether waiters for `primitive` are served in arrival order: on a service that queues
    /// waiters ([`Waiting::NativeFifo`]), the mutex, the read-write lock's gate, an election's
    /// candidates and a [queued](crate::Semaphore::queued) semaphore's waiters (a plain
    /// semaphore's waiters poll the permit slots in no order, on any service).
    pub fn fifo(&self, primitive: Primitive) -> bool {
        self.offers(primitive) && self.waiting == Waiting::NativeFifo
    }
}

/// The coordination primitives a lock service may carry ([`Capabilities::offers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Primitive {
    /// The lock itself ([`LockServiceExt::lock`](crate::LockServiceExt::lock)).
    Mutex,
    /// N permits, each a fenced lease ([`Semaphore`](crate::Semaphore)).
    Semaphore,
    /// Many readers or one writer, one fence sequence ([`RwLock`](crate::RwLock)).
    ReadWriteLock,
    /// One leader, its term the fence ([`Election`](crate::Election)).
    Election,
}

/// Where a lock service runs ([`Capabilities::deployment`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Deployment {
    /// In the application's own memory: nothing between the client and the state can fail on
    /// its own (the in-memory service).
    InProcess,
    /// A file on this machine that every process opens itself (SQLite): no network between a
    /// client and the state.
    Embedded,
    /// One or more servers reached over the network: replies can be lost, connections cut,
    /// clients partitioned.
    #[default]
    Network,
}

/// How a lock service's state is replicated ([`Capabilities::replication`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Replication {
    /// One copy (one server, one file), or copies the service does not rely on for its
    /// promises (Redis replicas, which replicate asynchronously).
    #[default]
    None,
    /// A consensus cluster with a leader (etcd's Raft, ZooKeeper's Zab): grants survive the
    /// loss of the leader or of any minority.
    LeaderQuorum,
    /// Independent servers the client itself asks for a majority (Redlock): a grant needs a
    /// majority, so a minority down or partitioned still grants.
    ClientMajority,
}

/// How a lock service takes a set of keys at once ([`Capabilities::multi_acquire`]): what
/// [`LockService::try_acquire_all`](crate::LockService::try_acquire_all) costs. Every service
/// takes a set all or nothing; this says in how many requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum MultiAcquire {
    /// One request per key, in order, and the keys taken given back when one is held (the
    /// trait's default `try_acquire_all`).
    #[default]
    PerKey,
    /// One request for the whole set, applied atomically by the server (a Redis script, an
    /// etcd transaction, one SQL statement). The conformance suite counts the requests.
    OneRequest,
    /// One atomic request per shard the keys fall in (Redis Cluster's hash slots), the shards'
    /// grants given back when one is held. Each resource has a hash tag of its own, so two
    /// resources share a slot only by chance: in practice one request per key.
    PerShard,
}
