//! The lock service contract that every backend implements.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::{Error, ErrorKind, Result};
use crate::ttl::validate_wait;
use crate::{Capabilities, Fenced, Fencing, Grant, ResourceKey, Ttl};

/// A distributed lock service: grants exclusive, expiring leases on resources.
///
/// This is the small surface a backend author implements. Users normally go through
/// [`LockServiceExt`](crate::LockServiceExt) (`try_lock`, `lock`), which wraps grants in a
/// [`Lease`](crate::Lease) with a lost signal, local deadlines, renewal and metrics.
///
/// `Arc<dyn LockService<Fencing = Fenced>>` (alias [`DynLockService`]) works wherever a
/// concrete service does.
///
/// Every method's "Behavior" list is a contract that `palisade-conformance` checks.
///
/// # Implementing
///
/// ```
/// use async_trait::async_trait;
/// use palisade_core::{Capabilities, Error, ErrorKind, Fenced, Grant, LockService, ResourceKey, Result, Ttl};
///
/// struct MyService;
///
/// fn sketch() -> Error {
///     Error::new(ErrorKind::Unsupported, "mine", "a sketch")
/// }
///
/// #[async_trait]
/// impl LockService for MyService {
///     type Fencing = Fenced;
///     fn backend(&self) -> &'static str { "mine" }
///     fn capabilities(&self) -> Capabilities { Capabilities::default() }
///     async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Fenced>>> {
///         // One atomic round trip: take the lock if free and issue the next fence.
///         Err(sketch())
///     }
///     async fn extend(&self, grant: &Grant<Fenced>, ttl: Ttl) -> Result<Ttl> { Err(sketch()) }
///     async fn release(&self, grant: &Grant<Fenced>) -> Result<()> { Err(sketch()) }
/// }
/// ```
#[async_trait]
pub trait LockService: Send + Sync + 'static {
    /// [`Fenced`] if grants carry a fence, [`Unfenced`](crate::Unfenced) otherwise.
    type Fencing: Fencing;

    /// The backend's short name (`"memory"`, `"redis"`), used in errors, logs and metric labels.
    fn backend(&self) -> &'static str;

    /// The guarantees this service makes.
    fn capabilities(&self) -> Capabilities;

    /// Takes the lock on `key` for `ttl` if nobody holds it; returns `Ok(None)` at once if
    /// somebody does.
    ///
    /// Behavior:
    /// - At most one unexpired grant of a key exists at any time (mutual exclusion).
    /// - A fenced service issues, in the same atomic step as the grant, a fence strictly greater
    ///   than every fence it issued earlier for `key`. There is never a grant without a fence,
    ///   nor a fence spent without a grant.
    /// - The grant's owner token is fresh and unguessable.
    /// - The grant's `requested_at` was taken before the request was sent.
    /// - A holder that neither extends nor releases loses the lock after `ttl` (plus the
    ///   backend's documented expiry margin); then another caller can take it.
    /// - A reply lost after the server applied the request (a dropped connection) leaves no
    ///   orphan: the service resends the same request idempotently and returns the one grant,
    ///   or returns an error and removes what it may have created, promptly (well before the
    ///   TTL), whenever the server is reachable again.
    async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Self::Fencing>>>;

    /// Takes the lock on `key`, waiting up to `wait` for the holder to release it or to expire.
    ///
    /// Behavior:
    /// - Everything `try_acquire` guarantees.
    /// - A `wait` of zero makes exactly one attempt (the lock if free, else
    ///   [`ErrorKind::Timeout`] at once, leaving no queue entry behind); above 24 h it is
    ///   [`ErrorKind::InvalidArgument`].
    /// - When the lock does not come free within `wait`: [`ErrorKind::Timeout`] (retryable).
    /// - The default implementation retries `try_acquire` with exponential backoff and full
    ///   jitter (2 ms doubling up to 250 ms); backends with native queues override it.
    async fn acquire(&self, key: &ResourceKey, ttl: Ttl, wait: Duration) -> Result<Grant<Self::Fencing>> {
        poll_acquire(self.backend(), key, wait, Backoff::new(), false, || self.try_acquire(key, ttl)).await
    }

    /// Takes the lock on whichever of `keys` is free first, waiting up to `wait` for one of them
    /// to be released or to expire; the grant's [`key`](Grant::key) says which. This is how a
    /// [`Semaphore`](crate::Semaphore) waits for any of its permits.
    ///
    /// Behavior:
    /// - Everything `acquire` guarantees, for the key granted. One grant at most: a call leaves
    ///   no other of its keys held, and no queue entry behind.
    /// - Every round tries the keys in the order given and takes the first one free.
    /// - A `wait` of zero makes exactly one round; an empty `keys` is
    ///   [`ErrorKind::InvalidArgument`]; a `wait` above 24 h too.
    /// - When none comes free within `wait`: [`ErrorKind::Timeout`] (retryable).
    /// - A service that declares native waiting ([`Waiting::Native`](crate::Waiting::Native) or
    ///   [`NativeFifo`](crate::Waiting::NativeFifo)) wakes the waiter when any of the keys is
    ///   released, as its `acquire` does for one key (no order among these waiters).
    /// - The default implementation polls rounds of `try_acquire` with exponential backoff and
    ///   full jitter (2 ms doubling up to 250 ms): right for a polling service, and what a
    ///   native one must override.
    async fn acquire_any(&self, keys: &[ResourceKey], ttl: Ttl, wait: Duration) -> Result<Grant<Self::Fencing>> {
        let first = first_of(self.backend(), keys)?;
        poll_acquire(self.backend(), first, wait, Backoff::new(), false, || try_each(self, keys, ttl))
            .await
            .map_err(|e| timeout_of_any(e, self.backend(), keys, wait))
    }

    /// Takes the locks on every key of `keys` for `ttl` if none is held, or none of them:
    /// what [`lock_all`](crate::LockServiceExt::lock_all) tries first, and again for the keys
    /// left after each one it had to wait for.
    ///
    /// Behavior:
    /// - All or nothing: [`AllOrNone::Granted`] with one grant per key, at the key's index, each
    ///   as [`try_acquire`](LockService::try_acquire) guarantees it; or
    ///   [`AllOrNone::Held`] with the index of a key found held (the first in the order given,
    ///   where the service can tell), and no key of the set left held by this call.
    /// - Never waits: a held key answers at once.
    /// - `keys` empty, naming a key twice, or longer than
    ///   [`MAX_FENCES_PER_WRITE`](crate::spi::MAX_FENCES_PER_WRITE) (what one fenced write
    ///   carries) is [`ErrorKind::InvalidArgument`], and nothing is sent.
    /// - A reply lost after the server applied the request leaves no orphan, as for
    ///   `try_acquire`: the whole set is granted, or every member the request may have taken is
    ///   released promptly.
    /// - [`Capabilities::multi_acquire`] says how many requests it takes:
    ///   [`MultiAcquire::OneRequest`](crate::MultiAcquire::OneRequest) is one request for the
    ///   set, which the conformance suite counts.
    /// - The default implementation calls `try_acquire` for each key in order and releases the
    ///   members it took when one is held or fails
    ///   ([`MultiAcquire::PerKey`](crate::MultiAcquire::PerKey)). A service that wraps another
    ///   (a decorator adding metrics, latency, bounds) forwards this method too, or the wrapped
    ///   service's one request becomes one per key.
    async fn try_acquire_all(&self, keys: &[ResourceKey], ttl: Ttl) -> Result<AllOrNone<Grant<Self::Fencing>>> {
        try_acquire_each(self, keys, ttl).await
    }

    /// Extends the grant so it expires `ttl` from now, and returns the TTL actually granted,
    /// counted from when the request was sent.
    ///
    /// Behavior:
    /// - Only the holder of the grant's owner token can extend it; anyone else, or a grant that
    ///   has expired or been released, gets [`ErrorKind::NotHolder`] and nothing changes.
    /// - The returned TTL is at most `ttl`. A backend whose locks live in a session (etcd's
    ///   lease, ZooKeeper's session) caps it at what the session is known to have left, so the
    ///   holder's local deadline never outlives the server's.
    async fn extend(&self, grant: &Grant<Self::Fencing>, ttl: Ttl) -> Result<Ttl>;

    /// Releases the grant so another caller can take the lock.
    ///
    /// Behavior:
    /// - Only the holder of the grant's owner token can release it; a grant that has expired,
    ///   been taken over, or already been released gets [`ErrorKind::NotHolder`] and the
    ///   current holder (if any) keeps the lock.
    /// - A fenced service never reuses or lowers a fence because of a release.
    /// - A release whose reply was lost may be resent; when the resend finds the lock no longer
    ///   held by this grant (the first send deleted it), it reports success. A caller repeating
    ///   a release it could not confirm gets `NotHolder`, and the next holder keeps the lock.
    async fn release(&self, grant: &Grant<Self::Fencing>) -> Result<()>;

    /// Moves `key`'s fence counter so that the next grant's fence is above `floor`; never lowers
    /// it. This is the recovery from a fence regression (fencing rule 5): the service lost its
    /// counter, and a store holds a watermark above what it now issues.
    ///
    /// Behavior:
    /// - Atomic with respect to grants: no grant issued after it returns has a fence ≤ `floor`.
    /// - Every fenced service in this repository implements it: counters are moved (Redis,
    ///   the SQL services), and revision or zxid fences carry an epoch that is raised (etcd,
    ///   ZooKeeper). A fenced service that lost its counter and cannot move it leaves the
    ///   resource stuck until an operator acts: its certification's restart scenario (with a
    ///   `restartable` factory) fails for it.
    /// - Default: [`ErrorKind::Unsupported`].
    async fn advance_fence(&self, key: &ResourceKey, floor: crate::Fence) -> Result<()> {
        let _ = floor;
        Err(Error::new(
            ErrorKind::Unsupported,
            self.backend(),
            format!("cannot move the fence counter of {key}; restore the lock service's data instead"),
        ))
    }
}

/// What [`LockService::try_acquire_all`] did: every key taken, or none.
#[derive(Debug)]
#[non_exhaustive]
pub enum AllOrNone<G> {
    /// Every key was taken: one grant per key, at the key's index.
    Granted(Vec<G>),
    /// The key at this index was found held; none of the set was taken.
    Held(usize),
}

/// The default [`LockService::try_acquire_all`]: `try_acquire` of each key in order, and the
/// members taken released (in reverse order) when one is held or fails. For a service that
/// takes some sets in one request and others not (the shards of a cluster).
pub async fn try_acquire_each<S: LockService + ?Sized>(
    service: &S,
    keys: &[ResourceKey],
    ttl: Ttl,
) -> Result<AllOrNone<Grant<S::Fencing>>> {
    distinct_keys(service.backend(), keys)?;
    let mut taken = Vec::with_capacity(keys.len());
    for (i, key) in keys.iter().enumerate() {
        let got = service.try_acquire(key, ttl).await;
        if let Ok(Some(grant)) = got {
            taken.push(grant);
            continue;
        }
        // Given back before the answer: a member left held would be an orphan until its TTL.
        for grant in taken.iter().rev() {
            let _ = service.release(grant).await;
        }
        return got.map(|_| AllOrNone::Held(i));
    }
    Ok(AllOrNone::Granted(taken))
}

/// [`ErrorKind::InvalidArgument`] for a set of more keys than one fenced write carries
/// ([`MAX_FENCES_PER_WRITE`](crate::spi::MAX_FENCES_PER_WRITE)), naming `what` was given them.
pub(crate) fn set_within_limit(backend: &'static str, what: &str, keys: usize) -> Result<()> {
    if keys > crate::store::MAX_FENCES_PER_WRITE {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            backend,
            format!(
                "{what} was given {keys} keys; a set has at most {} (what one fenced write carries)",
                crate::store::MAX_FENCES_PER_WRITE
            ),
        ));
    }
    Ok(())
}

/// [`ErrorKind::InvalidArgument`] unless `keys` is a non-empty set of distinct keys: what
/// every [`LockService::try_acquire_all`] checks before it sends anything.
pub fn distinct_keys(backend: &'static str, keys: &[ResourceKey]) -> Result<()> {
    if keys.is_empty() {
        return Err(Error::new(ErrorKind::InvalidArgument, backend, "try_acquire_all needs at least one key"));
    }
    set_within_limit(backend, "try_acquire_all", keys.len())?;
    for (i, key) in keys.iter().enumerate() {
        if keys[..i].contains(key) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                backend,
                format!("try_acquire_all was given {key} twice: a set names each key once"),
            ));
        }
    }
    Ok(())
}

/// A fenced lock service behind a pointer: what `palisade::connect_lock` returns.
pub type DynLockService = dyn LockService<Fencing = Fenced>;

/// An unfenced lock service (an efficiency lock such as Redlock) behind a pointer. Its leases
/// have no fence and cannot feed a [`FencedStore`](crate::FencedStore).
pub type DynUnfencedLockService = dyn LockService<Fencing = crate::Unfenced>;

#[async_trait]
impl<S: LockService + ?Sized> LockService for Arc<S> {
    type Fencing = S::Fencing;
    fn backend(&self) -> &'static str {
        (**self).backend()
    }
    fn capabilities(&self) -> Capabilities {
        (**self).capabilities()
    }
    async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Self::Fencing>>> {
        (**self).try_acquire(key, ttl).await
    }
    async fn acquire(&self, key: &ResourceKey, ttl: Ttl, wait: Duration) -> Result<Grant<Self::Fencing>> {
        (**self).acquire(key, ttl, wait).await
    }
    async fn acquire_any(&self, keys: &[ResourceKey], ttl: Ttl, wait: Duration) -> Result<Grant<Self::Fencing>> {
        (**self).acquire_any(keys, ttl, wait).await
    }
    async fn try_acquire_all(&self, keys: &[ResourceKey], ttl: Ttl) -> Result<AllOrNone<Grant<Self::Fencing>>> {
        (**self).try_acquire_all(keys, ttl).await
    }
    async fn extend(&self, grant: &Grant<Self::Fencing>, ttl: Ttl) -> Result<Ttl> {
        (**self).extend(grant, ttl).await
    }
    async fn release(&self, grant: &Grant<Self::Fencing>) -> Result<()> {
        (**self).release(grant).await
    }
    async fn advance_fence(&self, key: &ResourceKey, floor: crate::Fence) -> Result<()> {
        (**self).advance_fence(key, floor).await
    }
}

/// What one attempt of [`wait_for_release`] found.
#[derive(Debug)]
pub enum AttemptOutcome<G> {
    /// The lock was granted.
    Granted(G),
    /// Somebody holds it for about `remaining` more (the holder's TTL left, as the service
    /// knows it; waiters wake then at the latest).
    Held {
        /// Time left on the holder's grant.
        remaining: Duration,
    },
}

/// The waiting loop of a service that can wake waiters when a lock is released (an
/// `acquire` override for [`Waiting::Native`](crate::Waiting::Native) backends).
///
/// The first attempt runs bare: an uncontended acquire costs one attempt and nothing else
/// (no notifier, no subscription). Only when the lock is held does it ask `released` for the
/// notifier; from then on it registers before each attempt, so a release between the attempt
/// and the wait is not missed, and sleeps until the notifier fires, the holder's grant runs
/// out, or `max_step` passes (a bound on latency when notifications can be lost), whichever
/// is first. It validates `wait` and gives up with [`ErrorKind::Timeout`] when it runs out.
pub async fn wait_for_release<G, F, Fut, N>(
    backend: &'static str,
    key: &ResourceKey,
    wait: Duration,
    released: N,
    max_step: Option<Duration>,
    attempt: F,
) -> Result<G>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<AttemptOutcome<G>>>,
    N: FnOnce() -> Arc<Notify>,
{
    wait_for_any_release(backend, key, wait, || [released()], max_step, attempt).await
}

/// [`wait_for_release`] for several keys at once (an
/// [`acquire_any`](LockService::acquire_any) override): `attempt` makes one round over the
/// keys and reports, when all are held, the soonest any holder runs out; `released` returns a
/// notifier per key (any handle that derefs to a [`Notify`]), and a release of any of them
/// wakes the waiter. `key` names the wait in the [`ErrorKind::Timeout`] it gives up with.
pub async fn wait_for_any_release<G, F, Fut, N, I, W>(
    backend: &'static str,
    key: &ResourceKey,
    wait: Duration,
    released: N,
    max_step: Option<Duration>,
    mut attempt: F,
) -> Result<G>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<AttemptOutcome<G>>>,
    N: FnOnce() -> I,
    I: IntoIterator<Item = W>,
    W: std::ops::Deref<Target = Notify>,
{
    validate_wait(wait)?;
    let give_up = Instant::now() + wait;
    if let AttemptOutcome::Granted(grant) = attempt().await? {
        return Ok(grant);
    }
    if wait.is_zero() {
        return Err(timeout_error(backend, key, wait));
    }
    let released: Vec<W> = released().into_iter().collect();
    loop {
        let mut notified = registered(&released);
        let remaining = match attempt().await? {
            AttemptOutcome::Granted(grant) => return Ok(grant),
            AttemptOutcome::Held { remaining } => remaining,
        };
        let now = Instant::now();
        if now >= give_up {
            return Err(timeout_error(backend, key, wait));
        }
        // A millisecond past the holder's expiry, so the next attempt finds it expired.
        let mut step = remaining.saturating_add(Duration::from_millis(1));
        if let Some(max) = max_step {
            step = step.min(max);
        }
        let wake = now.checked_add(step).map_or(give_up, |t| t.min(give_up));
        tokio::select! {
            () = any_fired(&mut notified) => {}
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// A wait on each notifier, registered at once: a release from now on is not missed.
fn registered<W: std::ops::Deref<Target = Notify>>(
    notifiers: &[W],
) -> Vec<std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>>> {
    notifiers
        .iter()
        .map(|n| {
            let mut notified = Box::pin(n.notified());
            notified.as_mut().enable();
            notified
        })
        .collect()
}

/// Completes when any of the registered waits does; never, when there are none.
async fn any_fired(notified: &mut [std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>>]) {
    std::future::poll_fn(|cx| {
        if notified.iter_mut().any(|n| n.as_mut().poll(cx).is_ready()) {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
}

/// The waiting loop of a service that polls (the default [`LockService::acquire`], and
/// overrides that poll with their own pacing, such as Redlock's retry delay).
///
/// Runs `attempt` until it grants, sleeping `backoff`'s next delay between attempts and never
/// past the end of `wait`. An error from `attempt` is returned at once, unless
/// `retry_retryable` is set and the error [is retryable](crate::Error::is_retryable): then it
/// counts as "not granted", and if the wait runs out right after it, that error is returned
/// instead of [`ErrorKind::Timeout`]. It validates `wait` first.
pub async fn poll_acquire<G, F, Fut>(
    backend: &'static str,
    key: &ResourceKey,
    wait: Duration,
    backoff: Backoff,
    retry_retryable: bool,
    attempt: F,
) -> Result<G>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<G>>>,
{
    poll_acquire_woken(backend, key, wait, backoff, retry_retryable, || None::<Arc<Notify>>, attempt).await
}

/// [`poll_acquire`] that some releases can also wake: a service that hears of a part of its
/// releases (those of its own process, say) but must still poll for the others.
///
/// The first attempt runs bare, as in [`poll_acquire`]. Only when it is not granted does it
/// ask `released` for its notifiers (none, as `None`: plain polling; one per key when the
/// attempt is a round over several keys); from then on it registers before each attempt, so
/// a release between the attempt and the sleep is not missed, and sleeps until a notifier
/// fires or `backoff`'s next delay passes, whichever is first. The notifiers (any handle that
/// derefs to a [`Notify`], so that it can end a subscription when dropped) are kept until the
/// wait ends.
pub async fn poll_acquire_woken<G, F, Fut, N, I, W>(
    backend: &'static str,
    key: &ResourceKey,
    wait: Duration,
    mut backoff: Backoff,
    retry_retryable: bool,
    released: N,
    mut attempt: F,
) -> Result<G>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<G>>>,
    N: FnOnce() -> I,
    I: IntoIterator<Item = W>,
    W: std::ops::Deref<Target = Notify>,
{
    validate_wait(wait)?;
    let give_up = Instant::now() + wait;
    let mut released = Some(released);
    let mut notifiers: Vec<W> = Vec::new();
    loop {
        // Until the first attempt fails there is no notifier: then `unheard` is the delay to
        // sleep if no notifier comes either.
        let unheard = {
            let mut notified = registered(&notifiers);
            let last_error = match attempt().await {
                Ok(Some(grant)) => return Ok(grant),
                Ok(None) => None,
                Err(e) if retry_retryable && e.is_retryable() => Some(e),
                Err(e) => return Err(e),
            };
            let now = Instant::now();
            if now >= give_up {
                return Err(last_error.unwrap_or_else(|| timeout_error(backend, key, wait)));
            }
            let delay = backoff.next_delay().min(give_up - now);
            if notified.is_empty() {
                Some(delay)
            } else {
                tokio::select! {
                    () = any_fired(&mut notified) => {}
                    () = tokio::time::sleep(delay) => {}
                }
                None
            }
        };
        if let Some(delay) = unheard {
            // Subscribe, and try again at once if a notifier came: a release may have passed
            // unheard since the attempt.
            if let Some(subscribe) = released.take() {
                notifiers = subscribe().into_iter().collect();
            }
            if notifiers.is_empty() {
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// The first of `keys`, which names an [`acquire_any`](LockService::acquire_any) wait; none
/// is [`ErrorKind::InvalidArgument`].
pub fn first_of<'k>(backend: &'static str, keys: &'k [ResourceKey]) -> Result<&'k ResourceKey> {
    keys.first().ok_or_else(|| Error::new(ErrorKind::InvalidArgument, backend, "acquire_any needs at least one key"))
}

/// One round of `try_acquire` over `keys`, in order: the first grant, or `None` when every
/// key is held (the round of a polling [`acquire_any`](LockService::acquire_any)).
pub async fn try_each<S: LockService + ?Sized>(
    service: &S,
    keys: &[ResourceKey],
    ttl: Ttl,
) -> Result<Option<Grant<S::Fencing>>> {
    for key in keys {
        if let Some(grant) = service.try_acquire(key, ttl).await? {
            return Ok(Some(grant));
        }
    }
    Ok(None)
}

/// One round of `attempt` over `count` keys (by index), in order: the first grant, or, when
/// every key is held, the soonest any holder runs out (the round of an
/// [`acquire_any`](LockService::acquire_any) that [`wait_for_any_release`] drives).
pub async fn first_granted<G, F, Fut>(count: usize, mut attempt: F) -> Result<AttemptOutcome<G>>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<AttemptOutcome<G>>>,
{
    let mut soonest = Duration::MAX;
    for i in 0..count {
        match attempt(i).await? {
            AttemptOutcome::Granted(grant) => return Ok(AttemptOutcome::Granted(grant)),
            AttemptOutcome::Held { remaining } => soonest = soonest.min(remaining),
        }
    }
    Ok(AttemptOutcome::Held { remaining: soonest })
}

/// An [`acquire_any`](LockService::acquire_any) wait's timeout names every key it waited
/// for (the loops name the first); any other error passes unchanged.
pub fn timeout_of_any(e: Error, backend: &'static str, keys: &[ResourceKey], wait: Duration) -> Error {
    if e.kind() != ErrorKind::Timeout || keys.len() < 2 {
        return e;
    }
    let (first, last) = (&keys[0], &keys[keys.len() - 1]);
    Error::new(
        ErrorKind::Timeout,
        backend,
        format!("none of the {} locks {first} … {last} was free within {wait:?}", keys.len()),
    )
}

/// The [`ErrorKind::Timeout`] error for a wait that ran out.
pub fn timeout_error(backend: &'static str, key: &ResourceKey, wait: Duration) -> Error {
    Error::new(ErrorKind::Timeout, backend, format!("lock {key} was not free within {wait:?}"))
}

/// Exponential backoff with full jitter, for polling acquisition and reconnects.
///
/// Delays start at 2 ms and double up to 250 ms; each delay is drawn uniformly from
/// `[0, ceiling]` so that contending clients spread out instead of retrying in lockstep.
#[derive(Debug, Clone)]
pub struct Backoff {
    ceiling: Duration,
    max: Duration,
    /// The jitter's state; 0 until the first delay is drawn (xorshift never reaches 0).
    rng: u64,
}

impl Backoff {
    /// Backoff from 2 ms to 250 ms.
    pub fn new() -> Self {
        Backoff::with_bounds(Duration::from_millis(2), Duration::from_millis(250))
    }

    /// Backoff from `first` doubling up to `max`.
    ///
    /// Costs nothing until the first delay: the jitter is seeded from the operating system then,
    /// so a request that answers at once (most do) makes no system call for a backoff it never
    /// used.
    pub fn with_bounds(first: Duration, max: Duration) -> Self {
        Backoff { ceiling: first, max, rng: 0 }
    }

    /// The next delay to sleep.
    pub fn next_delay(&mut self) -> Duration {
        if self.rng == 0 {
            let mut seed = [0u8; 8];
            // A failed seed only makes the jitter predictable; it never affects safety.
            let _ = getrandom::fill(&mut seed);
            self.rng = u64::from_le_bytes(seed) | 1;
        }
        // xorshift64: fast, seeded from the OS, good enough for jitter.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        // Saturating: bounds near `Duration::MAX` must not overflow (a property test found the
        // `+ 1` and the doubling panicking there).
        let ceiling_ns = u64::try_from(self.ceiling.as_nanos()).unwrap_or(u64::MAX).max(1);
        let delay = Duration::from_nanos(self.rng % ceiling_ns.saturating_add(1));
        self.ceiling = self.ceiling.saturating_mul(2).min(self.max);
        delay
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_stays_within_its_ceiling() {
        let mut b = Backoff::with_bounds(Duration::from_millis(2), Duration::from_millis(16));
        let mut ceiling = Duration::from_millis(2);
        for _ in 0..50 {
            let d = b.next_delay();
            assert!(d <= ceiling, "{d:?} > {ceiling:?}");
            ceiling = (ceiling * 2).min(Duration::from_millis(16));
        }
    }
}
