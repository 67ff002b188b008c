//! What a backend author supplies: factories of independent clients, and their timing.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use palisade_core::{FencedStore, GrantFence, LockService, ResourceKey, Result};

use crate::e2e::LoadSettings;
use crate::proxy::FaultProxy;
pub use palisade_lab::servers::Restart;

/// The fencing of a factory's service (`Fenced` or `Unfenced`).
pub type FencingOf<F> = <<F as LockServiceFactory>::Service as LockService>::Fencing;

/// A client whose connections pass through fault proxies, one per server it talks to (from
/// [`LockServiceFactory::faulty_client`]).
pub struct FaultyClient<G: palisade_core::Fencing> {
    /// The client. Its type may differ from the factory's service (an in-process service is
    /// reached over the loopback relay), so it is behind a pointer.
    pub service: Arc<dyn LockService<Fencing = G>>,
    /// The proxies, in the order of the servers the client talks to.
    pub proxies: Vec<FaultProxy>,
    keep: Vec<Box<dyn std::any::Any + Send + Sync>>,
}

impl<G: palisade_core::Fencing> FaultyClient<G> {
    /// A client and the proxies its connections pass through.
    pub fn new(service: Arc<dyn LockService<Fencing = G>>, proxies: Vec<FaultProxy>) -> Self {
        FaultyClient { service, proxies, keep: Vec::new() }
    }

    /// Keeps `guard` alive as long as the client (a relay the proxy forwards to, a server).
    pub fn keeping(mut self, guard: impl std::any::Any + Send + Sync) -> Self {
        self.keep.push(Box::new(guard));
        self
    }

    /// Arms a lost reply on every proxy ([`FaultProxy::lose_next_reply`]) and returns how many
    /// replies they had lost before, for [`lost_since`](Self::lost_since).
    pub fn lose_next_replies(&self) -> usize {
        self.lose_replies_to(0)
    }

    /// Like [`lose_next_replies`](Self::lose_next_replies), for the request after the next
    /// `skip` ones on each proxy ([`FaultProxy::lose_reply_to`]).
    pub fn lose_replies_to(&self, skip: usize) -> usize {
        let before = self.lost_replies();
        for p in &self.proxies {
            p.lose_reply_to(skip);
        }
        before
    }

    /// Disarms every proxy's pending lost reply.
    pub fn disarm(&self) {
        for p in &self.proxies {
            p.disarm();
        }
    }

    /// Replies lost by all proxies together.
    pub fn lost_replies(&self) -> usize {
        self.proxies.iter().map(FaultProxy::lost_replies).sum()
    }

    /// Replies lost since `before` (a value of [`lost_replies`](Self::lost_replies)).
    pub fn lost_since(&self, before: usize) -> usize {
        self.lost_replies().saturating_sub(before)
    }

    /// How many requests the client has sent through its proxies so far
    /// ([`FaultProxy::requests`]).
    pub fn requests(&self) -> usize {
        self.proxies.iter().map(FaultProxy::requests).sum()
    }

    /// Closes every connection of every proxy.
    pub fn cut_connections(&self) {
        for p in &self.proxies {
            p.cut_connections();
        }
    }

    /// Partitions the client from every server.
    pub fn partition(&self) {
        for p in &self.proxies {
            p.partition();
        }
    }

    /// Heals every partition.
    pub fn heal(&self) {
        for p in &self.proxies {
            p.heal();
        }
    }
}

impl<G: palisade_core::Fencing> std::fmt::Debug for FaultyClient<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyClient").field("proxies", &self.proxies).finish_non_exhaustive()
    }
}

/// The timing a lock service's scenarios use.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// The TTL scenarios acquire with. Short keeps the suite fast; it must be above the
    /// backend's minimum (etcd raises TTLs below about 2 s).
    pub ttl: Duration,
    /// How long after the TTL the backend may take to let another client in (server-side
    /// expiry resolution, session timeouts, polling intervals).
    pub expiry_margin: Duration,
    round_trip: Duration,
}

impl Timing {
    /// Timing with `ttl` and `expiry_margin`, and the default round-trip allowance
    /// ([`DEFAULT_ROUND_TRIP`](crate::bounds::DEFAULT_ROUND_TRIP), 5 s).
    pub fn new(ttl: Duration, expiry_margin: Duration) -> Self {
        Timing { ttl, expiry_margin, round_trip: crate::bounds::DEFAULT_ROUND_TRIP }
    }

    /// The same timing with the round-trip allowance `round_trip`: what one call to the service
    /// may take beyond its own wait and the declared expiry delay before the suite fails the
    /// scenario (see [`bounds`](crate::bounds)). Declare more for a service whose test server
    /// is remote or slow to answer under load; never to cover a call that hangs.
    pub fn with_round_trip(mut self, round_trip: Duration) -> Self {
        self.round_trip = round_trip;
        self
    }

    /// The round-trip allowance of every call: default 5 s, generous on purpose (CI runs the
    /// suite on two cores shared with the servers), see [`with_round_trip`](Self::with_round_trip).
    pub fn round_trip(&self) -> Duration {
        self.round_trip
    }

    /// TTL plus margin: by then a holder that stopped must have lost the lock.
    pub fn expiry_bound(&self) -> Duration {
        self.ttl + self.expiry_margin
    }
}

/// How a child process (the holder the process-level scenarios freeze with `SIGSTOP`) reaches
/// the same lock service as the parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessAccess {
    /// The child builds its own client with the same factory (any service behind a server).
    Direct,
    /// The service lives in the parent's memory; the parent serves it to the child over a
    /// loopback relay ([`relay`](crate::relay)).
    Relay,
}

/// Hands out independent clients of one lock service.
///
/// "Independent" means what a separate process would have: its own connection or session, so
/// one client's pause or crash does not take the others with it.
///
/// A factory need not be `'static` (a borrowed factory is one too), but its clients are.
#[async_trait]
pub trait LockServiceFactory: Send + Sync {
    /// The service type.
    type Service: LockService;

    /// A new, independent client.
    async fn client(&self) -> Result<Arc<Self::Service>>;

    /// The TTL and expiry margin scenarios use.
    fn timing(&self) -> Timing;

    /// How a child process reaches the same service. Default: [`ProcessAccess::Direct`].
    fn process_access(&self) -> ProcessAccess {
        ProcessAccess::Direct
    }

    /// Deletes `key`'s lock on the server behind its holder's back (what an operator, an
    /// eviction or a failover can do), so the suite can check that the holder learns of the
    /// loss from the backend, not from its own clock. **Required** of every factory:
    /// certification fails naming this hook without it. Default: [`ErrorKind::Unsupported`].
    ///
    /// [`ErrorKind::Unsupported`]: palisade_core::ErrorKind::Unsupported
    async fn break_lock(&self, key: &ResourceKey) -> Result<()> {
        Err(palisade_core::Error::new(
            palisade_core::ErrorKind::Unsupported,
            "conformance",
            format!("this factory cannot break the lock of {key} on the server"),
        ))
    }

    /// The service's read-only view ([`InspectLocks`](palisade_core::InspectLocks)) over the
    /// same server as [`client`](Self::client)'s, so the suite can check its contract: a held
    /// lock shows its holder's grant id (never its token) and fence, a released one no holder,
    /// and reading changes nothing. `palisade inspect` reads every backend through it.
    /// **Required** of every factory: certification fails naming this hook without it.
    /// Default: [`ErrorKind::Unsupported`].
    ///
    /// [`ErrorKind::Unsupported`]: palisade_core::ErrorKind::Unsupported
    async fn view(&self) -> Result<Arc<dyn palisade_core::InspectLocks>> {
        Err(palisade_core::Error::new(
            palisade_core::ErrorKind::Unsupported,
            "conformance",
            "this factory gives no read-only view of its service",
        ))
    }

    /// A new, independent client whose every connection to the server passes through a
    /// [`FaultProxy`] of its own (start one per server with [`FaultProxy::start`] and dial its
    /// address), so the suite can lose replies, cut connections and partition the client.
    /// **Required** when the service declares [`Deployment::Network`]: certification fails
    /// naming this hook without it. Default: [`ErrorKind::Unsupported`].
    ///
    /// [`Deployment::Network`]: palisade_core::Deployment::Network
    ///
    /// [`ErrorKind::Unsupported`]: palisade_core::ErrorKind::Unsupported
    async fn faulty_client(&self) -> Result<FaultyClient<FencingOf<Self>>> {
        Err(palisade_core::Error::new(
            palisade_core::ErrorKind::Unsupported,
            "conformance",
            "this factory cannot make a client behind a fault proxy",
        ))
    }

    /// A new, independent client whose clock runs `ahead` of everyone else's (an NTP step, a
    /// VM resumed with a stale clock), for a service whose clients read a clock that could
    /// matter (a lock kept in a table with a client-computed expiry). Default:
    /// [`ErrorKind::Unsupported`], right for services that judge expiry by the server's clock.
    ///
    /// [`ErrorKind::Unsupported`]: palisade_core::ErrorKind::Unsupported
    async fn skewed_client(&self, ahead: Duration) -> Result<Arc<Self::Service>> {
        let _ = ahead;
        Err(palisade_core::Error::new(
            palisade_core::ErrorKind::Unsupported,
            "conformance",
            "this factory's clients read no clock of their own",
        ))
    }

    /// Restarts the service's server(s) as `how` says, and returns once they accept
    /// connections again; clients made before may have to reconnect:
    /// - [`Restart::KeepData`]: with their data (a restart, a failover to an up-to-date replica);
    /// - [`Restart::LoseData`]: without it (a restart without persistence, a new machine);
    /// - [`Restart::Snapshot`]: with their data, after copying it aside (a backup);
    /// - [`Restart::FromSnapshot`]: from that copy, losing every write since (a restore from
    ///   a backup taken some grants ago).
    ///
    /// Only a factory over a server of the test's own can do this (pass it to
    /// [`certify!`](macro@crate::certify) as `restartable`); `palisade_lab`'s servers do each
    /// (`restart_as`).
    ///
    /// **Required** when the service declares `fences_survive_restart`: certification fails
    /// naming this hook otherwise. Default: [`ErrorKind::Unsupported`].
    ///
    /// [`ErrorKind::Unsupported`]: palisade_core::ErrorKind::Unsupported
    async fn restart_server(&self, how: Restart) -> Result<()> {
        let _ = how;
        Err(palisade_core::Error::new(
            palisade_core::ErrorKind::Unsupported,
            "conformance",
            "this factory cannot restart its server",
        ))
    }

    /// Kills the service's current leader (waiting for one to be elected if need be) and
    /// returns its name, for the report. Only a factory over a cluster of the test's own can
    /// do this (pass it to [`certify!`](macro@crate::certify) as `cluster`).
    ///
    /// **Required** when the service declares [`Replication::LeaderQuorum`]: certification
    /// fails naming this hook otherwise. Default: [`ErrorKind::Unsupported`].
    ///
    /// [`Replication::LeaderQuorum`]: palisade_core::Replication::LeaderQuorum
    /// [`ErrorKind::Unsupported`]: palisade_core::ErrorKind::Unsupported
    async fn kill_leader(&self) -> Result<String> {
        Err(palisade_core::Error::new(
            palisade_core::ErrorKind::Unsupported,
            "conformance",
            "this factory has no leader to kill",
        ))
    }
}

/// Hands out independent clients of one fenced store.
///
/// A child process builds its own client with the same factory, so the store must be
/// reachable from another process (a server, or a file such as SQLite's).
#[async_trait]
pub trait FencedStoreFactory: Send + Sync {
    /// The store type.
    type Store: FencedStore;

    /// A new, independent client.
    async fn client(&self) -> Result<Arc<Self::Store>>;

    /// What the `load` scenario asks of this store. A store whose test server cannot take the
    /// default (an emulator that serves one request at a time) declares less; the scenario
    /// reports the rate it reached either way. Default: [`LoadSettings::from_env`].
    fn load(&self) -> LoadSettings {
        LoadSettings::from_env()
    }

    /// Whether another process can reach the same store through this factory (a server, a
    /// file): the process-level scenarios (a holder frozen with `SIGSTOP`, killed with
    /// `SIGKILL`) need it, and are reported as not applicable to a store that lives in one
    /// process's memory. Default: true.
    fn shared_across_processes(&self) -> bool {
        true
    }

    /// Opens a fenced transaction of the store's own API under `fence` for `resource` (what a
    /// holder's `begin_fenced` does: the fence check first, whatever it locks kept locked until
    /// the transaction ends) and keeps it open, idle, until the returned guard is dropped
    /// (which rolls it back). The suite checks that lock operations keep their bounds
    /// meanwhile. Default: [`ErrorKind::Unsupported`] (a store without transactions of its
    /// own; the scenario then says so).
    ///
    /// [`ErrorKind::Unsupported`]: palisade_core::ErrorKind::Unsupported
    async fn hold_transaction(&self, resource: &ResourceKey, fence: GrantFence) -> Result<HeldTransaction> {
        let _ = (resource, fence);
        Err(palisade_core::Error::new(
            palisade_core::ErrorKind::Unsupported,
            "conformance",
            "this factory cannot hold a fenced transaction of the store open",
        ))
    }

    /// What one call to the store may take before the suite fails the scenario (see
    /// [`bounds`](crate::bounds)): a store call waits for nobody, so this is its whole bound.
    /// Default: 5 s ([`DEFAULT_ROUND_TRIP`](crate::bounds::DEFAULT_ROUND_TRIP)), generous on
    /// purpose (CI runs the suite on two cores shared with the servers). Declare more for a
    /// store whose test server is remote or slow under load; never to cover a call that hangs.
    fn round_trip(&self) -> Duration {
        crate::bounds::DEFAULT_ROUND_TRIP
    }
}

/// An open fenced transaction (and whatever keeps it alive), from
/// [`FencedStoreFactory::hold_transaction`]; dropping it rolls the transaction back.
pub type HeldTransaction = Box<dyn std::any::Any + Send>;

/// A fresh random namespace: scenarios never see each other's keys, records or fences.
#[derive(Debug, Clone)]
pub struct Namespace {
    domain: String,
}

impl Namespace {
    /// A namespace with a random 8-hex-digit name.
    pub fn new() -> Self {
        let mut bytes = [0u8; 4];
        // A weak name only risks a collision between scenarios, which then fail loudly.
        let _ = getrandom::fill(&mut bytes);
        Namespace { domain: format!("cf{:02x}{:02x}{:02x}{:02x}", bytes[0], bytes[1], bytes[2], bytes[3]) }
    }

    /// Rebuilds a namespace from its name (in a child process).
    pub fn from_name(name: &str) -> Self {
        Namespace { domain: name.to_string() }
    }

    /// The namespace's name (the resource keys' domain).
    pub fn name(&self) -> &str {
        &self.domain
    }

    /// A resource key in this namespace.
    pub fn key(&self, id: &str) -> Result<ResourceKey> {
        ResourceKey::new(self.domain.clone(), id)
    }

    /// A record key in this namespace.
    pub fn record(&self, name: &str) -> String {
        format!("{}/{name}", self.domain)
    }
}

impl Default for Namespace {
    fn default() -> Self {
        Namespace::new()
    }
}
