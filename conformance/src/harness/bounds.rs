//! A time bound on every call a scenario makes.
//!
//! A scenario checks what a service answers; without a bound on *when*, a `try_acquire` that
//! blocks for minutes, or an `acquire` that ignores its wait, still passes (the test just runs
//! long). The suite macros therefore hand each scenario its factories wrapped in
//! [`BoundedLockFactory`] and [`BoundedStoreFactory`]: every client they make answers each
//! call within its bound or the scenario fails, naming the call.
//!
//! The bound of a call is what the contract lets it take:
//! - lock service calls: the call's own wait (`acquire` only) + the service's declared
//!   [`expiry_delay`](palisade_core::Capabilities::expiry_delay) + the factory's round-trip
//!   allowance ([`Timing::round_trip`]);
//! - store calls: the store factory's round-trip allowance
//!   ([`FencedStoreFactory::round_trip`]): a store call never waits for anyone.
//!
//! A call still running at its bound is abandoned: the wrapper records a [`Violation`] in the
//! scenario's [`CallBounds`] and returns a non-retryable [`ErrorKind::Backend`] error ("call
//! outlived its bound"), so the scenario fails at once instead of hanging. The harness then
//! reports the violation, the root cause, ahead of whatever the scenario saw next.
//!
//! Clients behind fault proxies ([`LockServiceFactory::faulty_client`]) are not bounded: the
//! fault scenarios lose replies and partition clients on purpose, and check their own timing.
//!
//! ```
//! use std::time::Duration;
//! use palisade_conformance::LockServiceFactory;
//! use palisade_conformance::bounds::{BoundedLockFactory, CallBounds};
//! use palisade_conformance::memory::MemoryLockFactory;
//! use palisade_core::{LockService, ResourceKey, Ttl};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> palisade_core::Result<()> {
//! let bounds = CallBounds::new(Duration::from_secs(2));
//! let factory = BoundedLockFactory::new(MemoryLockFactory::new(), bounds.clone());
//! let client = factory.client().await?;
//! let key = ResourceKey::new("demo", "bounded")?;
//! let grant = client.try_acquire(&key, Ttl::new(Duration::from_secs(1))?).await?.expect("free");
//! client.release(&grant).await?;
//! assert_eq!(bounds.take_failure(), None, "the memory service answers at once");
//! # Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use palisade_core::{
    AllOrNone, Capabilities, Error, ErrorKind, Fence, FencedStore, Grant, GrantFence, LockService, MultiAcquire,
    Record, ResourceKey, Result, Ttl, WriteBatch,
};
use tokio::time::Instant;

use crate::e2e::LoadSettings;
use crate::{
    FaultyClient, FencedStoreFactory, FencingOf, HeldTransaction, LockServiceFactory, ProcessAccess, Restart, Timing,
};

/// The round-trip allowance a factory declares unless it says otherwise: generous, because CI
/// runs the suite on two shared cores next to the servers and another test binary, and a bound
/// is there to catch calls that hang or ignore their wait, not slow ones. (2 s was once too
/// little: a TLS `try_acquire` answered after 2.4 s while two binaries shared the cores.) The
/// scenarios that judge how *long* a call took measure a warm round trip first and allow a
/// multiple of it, so this allowance does not loosen them.
pub const DEFAULT_ROUND_TRIP: Duration = Duration::from_secs(5);

/// How many violations a failure message names; the rest are counted.
const NAMED_VIOLATIONS: usize = 3;

/// What one call was allowed to take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// The call's own wait (`acquire`), `None` for calls that do not wait.
    pub wait: Option<Duration>,
    /// The lock service's declared expiry delay (zero for store calls).
    pub expiry_delay: Duration,
    /// The factory's round-trip allowance.
    pub round_trip: Duration,
}

impl Bound {
    /// The whole bound: wait + expiry delay + round-trip allowance (saturating: a wait of
    /// `Duration::MAX`, which a service must refuse, still has a bound).
    pub fn total(&self) -> Duration {
        self.wait.unwrap_or_default().saturating_add(self.expiry_delay).saturating_add(self.round_trip)
    }
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (", Seconds(self.total()))?;
        if let Some(wait) = self.wait {
            write!(f, "wait {} + ", Seconds(wait))?;
        }
        write!(f, "expiry delay {} + round-trip allowance {})", Seconds(self.expiry_delay), Seconds(self.round_trip))
    }
}

/// A call that outlived its bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The call, with what identifies it (`acquire(cf12ab34:k, wait 300 ms)`).
    pub call: String,
    /// How long it took when it answered late (an implementation that blocks its thread
    /// cannot be interrupted), `None` when it was abandoned at its bound without an answer.
    pub took: Option<Duration>,
    /// Its bound.
    pub bound: Bound,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.took {
            None => write!(f, "`{}` did not answer within its bound {}", self.call, self.bound),
            Some(took) => write!(f, "`{}` answered after {}, past its bound {}", self.call, Seconds(took), self.bound),
        }
    }
}

/// The bound settings of one scenario's clients and the log of the calls that broke them.
///
/// Cheap to clone: clones share the log and the declared expiry delay. A lock factory and a
/// store factory may declare different round-trip allowances; give each its own handle with
/// [`with_round_trip`](Self::with_round_trip), the log stays one.
#[derive(Debug, Clone)]
pub struct CallBounds {
    round_trip: Duration,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    enforced: bool,
    expiry_delay: Mutex<Duration>,
    violations: Mutex<Vec<Violation>>,
}

impl CallBounds {
    /// Bounds with the round-trip allowance `round_trip`, an expiry delay of zero until a
    /// service declares one, and an empty log.
    pub fn new(round_trip: Duration) -> Self {
        CallBounds::build(round_trip, true)
    }

    /// Bounds that bound nothing: every call passes straight through and nothing is logged.
    /// The holder process of the process-level scenarios runs with these: it is frozen with
    /// `SIGSTOP` on purpose, and a call that spans the freeze is slow because of the test.
    pub fn unenforced() -> Self {
        CallBounds::build(DEFAULT_ROUND_TRIP, false)
    }

    fn build(round_trip: Duration, enforced: bool) -> Self {
        CallBounds {
            round_trip,
            shared: Arc::new(Shared {
                enforced,
                expiry_delay: Mutex::new(Duration::ZERO),
                violations: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The same log and expiry delay with another round-trip allowance.
    pub fn with_round_trip(&self, round_trip: Duration) -> Self {
        CallBounds { round_trip, shared: Arc::clone(&self.shared) }
    }

    /// The round-trip allowance.
    pub fn round_trip(&self) -> Duration {
        self.round_trip
    }

    /// Whether calls are bounded (false for [`unenforced`](Self::unenforced) bounds).
    pub fn is_enforced(&self) -> bool {
        self.shared.enforced
    }

    /// The lock service's declared expiry delay (the largest declared so far; zero before any).
    pub fn expiry_delay(&self) -> Duration {
        *self.shared.expiry_delay.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Declares the service's expiry delay ([`Capabilities::expiry_delay`]); the largest
    /// declaration counts, so a client declaring less never tightens another's bound.
    pub fn declare_expiry_delay(&self, expiry_delay: Duration) {
        let mut current = self.shared.expiry_delay.lock().unwrap_or_else(PoisonError::into_inner);
        *current = (*current).max(expiry_delay);
    }

    /// The bound of a lock service call with `wait` (`Some` for `acquire` only).
    pub fn lock_bound(&self, wait: Option<Duration>) -> Bound {
        Bound { wait, expiry_delay: self.expiry_delay(), round_trip: self.round_trip }
    }

    /// The bound of a store call.
    pub fn store_bound(&self) -> Bound {
        Bound { wait: None, expiry_delay: Duration::ZERO, round_trip: self.round_trip }
    }

    /// Logs a violation.
    pub fn record(&self, violation: Violation) {
        self.shared.violations.lock().unwrap_or_else(PoisonError::into_inner).push(violation);
    }

    /// The violations logged so far, oldest first.
    pub fn violations(&self) -> Vec<Violation> {
        self.shared.violations.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Takes the violations logged so far (the log is empty afterwards), oldest first.
    pub fn take_violations(&self) -> Vec<Violation> {
        std::mem::take(&mut *self.shared.violations.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Takes the violations and makes them one failure message, naming the first few calls;
    /// `None` when every call kept its bound.
    pub fn take_failure(&self) -> Option<String> {
        let violations = self.take_violations();
        let first = violations.first()?;
        if violations.len() == 1 {
            return Some(first.to_string());
        }
        let named: Vec<String> = violations.iter().take(NAMED_VIOLATIONS).map(Violation::to_string).collect();
        let mut message = format!("{} calls outlived their bounds: {}", violations.len(), named.join("; "));
        if violations.len() > NAMED_VIOLATIONS {
            message.push_str(&format!("; and {} more", violations.len() - NAMED_VIOLATIONS));
        }
        Some(message)
    }

    /// Runs `call` within `bound`: logs a violation and answers with an error when it is
    /// still running at its bound, logs one (and passes the answer on) when it answered late.
    async fn run<T>(
        &self,
        bound: Bound,
        name: impl FnOnce() -> String,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        if !self.is_enforced() {
            return call.await;
        }
        let started = Instant::now();
        match tokio::time::timeout(bound.total(), call).await {
            Ok(answer) => {
                // A call that blocks its thread cannot be interrupted: it answers, late.
                let took = started.elapsed();
                if took > bound.total() {
                    self.record(Violation { call: name(), took: Some(took), bound });
                }
                answer
            }
            Err(_) => {
                let call = name();
                let message = format!("conformance: call outlived its bound: `{call}` had not answered after {bound}");
                self.record(Violation { call, took: None, bound });
                // Not retryable and not a Timeout: a scenario must neither retry it nor take it
                // for a wait that ran out.
                Err(Error::new(ErrorKind::Backend, "conformance", message).with_retryable(false))
            }
        }
    }
}

/// A duration as the failure messages print it: `300 ms`, `2 s`, `2.3 s`.
struct Seconds(Duration);

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.is_zero() {
            return f.write_str("0 s");
        }
        if d < Duration::from_secs(1) {
            return write!(f, "{} ms", d.as_millis());
        }
        let text = format!("{:.3}", d.as_secs_f64());
        write!(f, "{} s", text.trim_end_matches('0').trim_end_matches('.'))
    }
}

/// A lock service whose every call answers within its bound, or is abandoned and logged.
///
/// Behavior:
/// - `try_acquire`, `acquire`, `extend`, `release` and `advance_fence` call the wrapped
///   service's same method and return its answer, if it comes within the call's bound: its
///   wait (`acquire` only) + the declared expiry delay + the round-trip allowance.
/// - A call still running at its bound is dropped (cancelled), logged in the [`CallBounds`],
///   and answered with a non-retryable [`ErrorKind::Backend`] error whose message says
///   "conformance: call outlived its bound".
/// - A call that answers past its bound (it blocked its thread) is logged; its answer is
///   passed on.
/// - `backend` and `capabilities` are the wrapped service's.
pub struct BoundedLockService<S: LockService + ?Sized> {
    inner: Arc<S>,
    bounds: CallBounds,
}

impl<S: LockService + ?Sized> BoundedLockService<S> {
    /// `inner` with its calls bounded by `bounds`; declares `inner`'s expiry delay to them.
    pub fn new(inner: Arc<S>, bounds: CallBounds) -> Self {
        bounds.declare_expiry_delay(inner.capabilities().expiry_delay);
        BoundedLockService { inner, bounds }
    }

    /// The wrapped service.
    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }

    /// The bounds and log of this service's calls.
    pub fn bounds(&self) -> &CallBounds {
        &self.bounds
    }
}

impl<S: LockService + ?Sized> fmt::Debug for BoundedLockService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundedLockService")
            .field("backend", &self.inner.backend())
            .field("bounds", &self.bounds)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<S: LockService + ?Sized> LockService for BoundedLockService<S> {
    type Fencing = S::Fencing;

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Self::Fencing>>> {
        let name = || format!("try_acquire({key})");
        self.bounds.run(self.bounds.lock_bound(None), name, self.inner.try_acquire(key, ttl)).await
    }

    async fn acquire(&self, key: &ResourceKey, ttl: Ttl, wait: Duration) -> Result<Grant<Self::Fencing>> {
        let name = || format!("acquire({key}, wait {})", Seconds(wait));
        self.bounds.run(self.bounds.lock_bound(Some(wait)), name, self.inner.acquire(key, ttl, wait)).await
    }

    async fn acquire_any(&self, keys: &[ResourceKey], ttl: Ttl, wait: Duration) -> Result<Grant<Self::Fencing>> {
        let first = keys.first().map(ToString::to_string).unwrap_or_default();
        let name = || format!("acquire_any({first} and {} more, wait {})", keys.len().saturating_sub(1), Seconds(wait));
        // A round tries every key: one round trip each.
        let mut bound = self.bounds.lock_bound(Some(wait));
        bound.round_trip = bound.round_trip.saturating_mul(u32::try_from(keys.len().max(1)).unwrap_or(u32::MAX));
        self.bounds.run(bound, name, self.inner.acquire_any(keys, ttl, wait)).await
    }

    async fn try_acquire_all(&self, keys: &[ResourceKey], ttl: Ttl) -> Result<AllOrNone<Grant<Self::Fencing>>> {
        let first = keys.first().map(ToString::to_string).unwrap_or_default();
        let name = || format!("try_acquire_all({first} and {} more)", keys.len().saturating_sub(1));
        // One request for the set where the service says so; else a try_acquire per key and a
        // release of each taken when one is held.
        let mut bound = self.bounds.lock_bound(None);
        if self.inner.capabilities().multi_acquire != MultiAcquire::OneRequest {
            let requests = u32::try_from(keys.len().max(1).saturating_mul(2)).unwrap_or(u32::MAX);
            bound.round_trip = bound.round_trip.saturating_mul(requests);
        }
        self.bounds.run(bound, name, self.inner.try_acquire_all(keys, ttl)).await
    }

    async fn extend(&self, grant: &Grant<Self::Fencing>, ttl: Ttl) -> Result<Ttl> {
        let name = || format!("extend({}, ttl {})", grant.key(), Seconds(ttl.get()));
        self.bounds.run(self.bounds.lock_bound(None), name, self.inner.extend(grant, ttl)).await
    }

    async fn release(&self, grant: &Grant<Self::Fencing>) -> Result<()> {
        let name = || format!("release({})", grant.key());
        self.bounds.run(self.bounds.lock_bound(None), name, self.inner.release(grant)).await
    }

    async fn advance_fence(&self, key: &ResourceKey, floor: Fence) -> Result<()> {
        let name = || format!("advance_fence({key}, floor {floor})");
        self.bounds.run(self.bounds.lock_bound(None), name, self.inner.advance_fence(key, floor)).await
    }
}

/// A fenced store whose every call answers within the round-trip allowance, or is abandoned
/// and logged.
///
/// Behavior: `apply`, `apply_unfenced`, `watermark`, `read`, `read_many` and `list` behave as
/// [`BoundedLockService`]'s calls do, with the round-trip allowance as their bound (a store
/// call waits for nobody). `backend` and `requires_live_lock` are the wrapped store's.
pub struct BoundedStore<S: FencedStore + ?Sized> {
    inner: Arc<S>,
    bounds: CallBounds,
}

impl<S: FencedStore + ?Sized> BoundedStore<S> {
    /// `inner` with its calls bounded by `bounds`.
    pub fn new(inner: Arc<S>, bounds: CallBounds) -> Self {
        BoundedStore { inner, bounds }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }

    /// The bounds and log of this store's calls.
    pub fn bounds(&self) -> &CallBounds {
        &self.bounds
    }
}

impl<S: FencedStore + ?Sized> fmt::Debug for BoundedStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundedStore")
            .field("backend", &self.inner.backend())
            .field("bounds", &self.bounds)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<S: FencedStore + ?Sized> FencedStore for BoundedStore<S> {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn apply(&self, resource: &ResourceKey, fence: GrantFence, batch: &WriteBatch) -> Result<()> {
        let name = || format!("apply({resource}, fence {}, {} operations)", fence.fence(), batch.len());
        self.bounds.run(self.bounds.store_bound(), name, self.inner.apply(resource, fence, batch)).await
    }

    async fn apply_all(&self, fences: &[(ResourceKey, GrantFence)], batch: &WriteBatch) -> Result<()> {
        let name = || format!("apply_all({} resources, {} operations)", fences.len(), batch.len());
        self.bounds.run(self.bounds.store_bound(), name, self.inner.apply_all(fences, batch)).await
    }

    fn requires_live_lock(&self) -> bool {
        self.inner.requires_live_lock()
    }

    async fn apply_unfenced(&self, batch: &WriteBatch) -> Result<()> {
        let name = || format!("apply_unfenced({} operations)", batch.len());
        self.bounds.run(self.bounds.store_bound(), name, self.inner.apply_unfenced(batch)).await
    }

    async fn watermark(&self, resource: &ResourceKey) -> Result<Option<Fence>> {
        let name = || format!("watermark({resource})");
        self.bounds.run(self.bounds.store_bound(), name, self.inner.watermark(resource)).await
    }

    async fn read(&self, key: &str) -> Result<Option<Record>> {
        let name = || format!("read({key})");
        self.bounds.run(self.bounds.store_bound(), name, self.inner.read(key)).await
    }

    async fn read_many(&self, keys: &[&str]) -> Result<Vec<Option<Record>>> {
        let name = || format!("read_many({} keys)", keys.len());
        self.bounds.run(self.bounds.store_bound(), name, self.inner.read_many(keys)).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Record)>> {
        let name = || format!("list({prefix})");
        self.bounds.run(self.bounds.store_bound(), name, self.inner.list(prefix)).await
    }
}

/// A lock service factory whose clients are [`BoundedLockService`]s; every other method is
/// the wrapped factory's.
///
/// `faulty_client` is passed on unwrapped: the fault scenarios make calls that are slow on
/// purpose (a lost reply, a partition) and bound them themselves. `skewed_client` is wrapped.
#[derive(Debug, Clone)]
pub struct BoundedLockFactory<F> {
    inner: F,
    bounds: CallBounds,
}

impl<F: LockServiceFactory> BoundedLockFactory<F> {
    /// `inner`'s clients bounded by `bounds` as given (its round-trip allowance included).
    pub fn new(inner: F, bounds: CallBounds) -> Self {
        BoundedLockFactory { inner, bounds }
    }

    /// `inner`'s clients bounded with the round-trip allowance `inner` declares
    /// ([`Timing::round_trip`]), logging into `log`'s log.
    pub fn declared(inner: F, log: &CallBounds) -> Self {
        let bounds = log.with_round_trip(inner.timing().round_trip());
        BoundedLockFactory { inner, bounds }
    }

    /// The wrapped factory.
    pub fn inner(&self) -> &F {
        &self.inner
    }

    /// The bounds and log of the clients' calls.
    pub fn bounds(&self) -> &CallBounds {
        &self.bounds
    }
}

#[async_trait]
impl<F: LockServiceFactory> LockServiceFactory for BoundedLockFactory<F> {
    type Service = BoundedLockService<F::Service>;

    async fn client(&self) -> Result<Arc<Self::Service>> {
        let client = self.inner.client().await?;
        Ok(Arc::new(BoundedLockService::new(client, self.bounds.clone())))
    }

    fn timing(&self) -> Timing {
        self.inner.timing()
    }

    fn process_access(&self) -> ProcessAccess {
        self.inner.process_access()
    }

    async fn break_lock(&self, key: &ResourceKey) -> Result<()> {
        self.inner.break_lock(key).await
    }

    async fn view(&self) -> Result<Arc<dyn palisade_core::InspectLocks>> {
        self.inner.view().await
    }

    async fn faulty_client(&self) -> Result<FaultyClient<FencingOf<Self>>> {
        self.inner.faulty_client().await
    }

    async fn skewed_client(&self, ahead: Duration) -> Result<Arc<Self::Service>> {
        let client = self.inner.skewed_client(ahead).await?;
        Ok(Arc::new(BoundedLockService::new(client, self.bounds.clone())))
    }

    async fn restart_server(&self, how: Restart) -> Result<()> {
        self.inner.restart_server(how).await
    }

    async fn kill_leader(&self) -> Result<String> {
        self.inner.kill_leader().await
    }
}

/// A fenced store factory whose clients are [`BoundedStore`]s; every other method is the
/// wrapped factory's.
#[derive(Debug, Clone)]
pub struct BoundedStoreFactory<S> {
    inner: S,
    bounds: CallBounds,
}

impl<S: FencedStoreFactory> BoundedStoreFactory<S> {
    /// `inner`'s clients bounded by `bounds` as given (its round-trip allowance included).
    pub fn new(inner: S, bounds: CallBounds) -> Self {
        BoundedStoreFactory { inner, bounds }
    }

    /// `inner`'s clients bounded with the round-trip allowance `inner` declares
    /// ([`FencedStoreFactory::round_trip`]), logging into `log`'s log.
    pub fn declared(inner: S, log: &CallBounds) -> Self {
        let bounds = log.with_round_trip(inner.round_trip());
        BoundedStoreFactory { inner, bounds }
    }

    /// The wrapped factory.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The bounds and log of the clients' calls.
    pub fn bounds(&self) -> &CallBounds {
        &self.bounds
    }
}

#[async_trait]
impl<S: FencedStoreFactory> FencedStoreFactory for BoundedStoreFactory<S> {
    type Store = BoundedStore<S::Store>;

    async fn client(&self) -> Result<Arc<Self::Store>> {
        let client = self.inner.client().await?;
        Ok(Arc::new(BoundedStore::new(client, self.bounds.clone())))
    }

    fn load(&self) -> LoadSettings {
        self.inner.load()
    }

    fn shared_across_processes(&self) -> bool {
        self.inner.shared_across_processes()
    }

    async fn hold_transaction(&self, resource: &ResourceKey, fence: GrantFence) -> Result<HeldTransaction> {
        self.inner.hold_transaction(resource, fence).await
    }

    fn round_trip(&self) -> Duration {
        self.inner.round_trip()
    }
}

/// A borrowed factory is a factory: [`lock_outcomes`](crate::lock_outcomes) wraps the factory
/// its caller lends it without taking it.
#[async_trait]
impl<F: LockServiceFactory + ?Sized> LockServiceFactory for &F {
    type Service = F::Service;

    async fn client(&self) -> Result<Arc<Self::Service>> {
        (**self).client().await
    }

    fn timing(&self) -> Timing {
        (**self).timing()
    }

    fn process_access(&self) -> ProcessAccess {
        (**self).process_access()
    }

    async fn break_lock(&self, key: &ResourceKey) -> Result<()> {
        (**self).break_lock(key).await
    }

    async fn view(&self) -> Result<Arc<dyn palisade_core::InspectLocks>> {
        (**self).view().await
    }

    async fn faulty_client(&self) -> Result<FaultyClient<FencingOf<Self>>> {
        (**self).faulty_client().await
    }

    async fn skewed_client(&self, ahead: Duration) -> Result<Arc<Self::Service>> {
        (**self).skewed_client(ahead).await
    }

    async fn restart_server(&self, how: Restart) -> Result<()> {
        (**self).restart_server(how).await
    }

    async fn kill_leader(&self) -> Result<String> {
        (**self).kill_leader().await
    }
}

/// A borrowed store factory is a store factory (see the lock factory's).
#[async_trait]
impl<S: FencedStoreFactory + ?Sized> FencedStoreFactory for &S {
    type Store = S::Store;

    async fn client(&self) -> Result<Arc<Self::Store>> {
        (**self).client().await
    }

    fn load(&self) -> LoadSettings {
        (**self).load()
    }

    fn shared_across_processes(&self) -> bool {
        (**self).shared_across_processes()
    }

    async fn hold_transaction(&self, resource: &ResourceKey, fence: GrantFence) -> Result<HeldTransaction> {
        (**self).hold_transaction(resource, fence).await
    }

    fn round_trip(&self) -> Duration {
        (**self).round_trip()
    }
}
