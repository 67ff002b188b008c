//! Convenience for users: leases instead of raw grants, fenced writes from a lease, metrics
//! and tracing around both.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tracing::{Instrument, error, warn};

use crate::error::{ErrorKind, Result};
use crate::{
    Error, Fence, Fenced, FencedStore, GrantFence, Lease, LockOptions, LockService, MultiLease, ResourceKey, Ttl,
    WatermarkSource, WriteBatch, metrics,
};

/// What users call on a lock service: leases with a lifecycle, plus metrics and tracing.
///
/// Implemented for every `Arc<S>` where `S: LockService`, including
/// `Arc<dyn LockService<Fencing = Fenced>>`.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use palisade_core::{LockOptions, LockServiceExt, MemoryLockService, ResourceKey};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> palisade_core::Result<()> {
/// let locks = Arc::new(MemoryLockService::new());
/// let key = ResourceKey::new("alloc", "WH-01")?;
/// let lease = locks.lock(&key, LockOptions::ttl(Duration::from_secs(30)).wait(Duration::from_secs(5))).await?;
/// assert!(locks.try_lock(&key, Duration::from_secs(30)).await?.is_none()); // held
/// let fence = lease.fence();
/// lease.release().await?;
/// let next = locks.try_lock(&key, Duration::from_secs(30)).await?.expect("free again");
/// assert!(next.fence() > fence);
/// # Ok(()) }
/// ```
#[async_trait]
pub trait LockServiceExt {
    /// The service the leases come from.
    type Service: LockService + ?Sized;

    /// Takes the lock if it is free, without waiting; `Ok(None)` if it is held.
    /// `ttl` is validated ([`Ttl::new`]). Inside [`with_lock`](LockServiceExt::with_lock) on
    /// the same key and service: [`ErrorKind::Reentrant`].
    async fn try_lock(&self, key: &ResourceKey, ttl: Duration) -> Result<Option<Lease<Self::Service>>>;

    /// Takes the lock for `options.ttl`, waiting up to `options.wait` for it to come free;
    /// [`ErrorKind::Timeout`] if it does not. A zero wait makes one attempt. Both durations
    /// are validated ([`LockOptions`]).
    ///
    /// Locks are not re-entrant. Inside [`with_lock`](LockServiceExt::with_lock) on the same
    /// key and service (`Arc`), it is refused at once with [`ErrorKind::Reentrant`] instead
    /// of waiting for ourselves until the wait runs out. A task holding an explicit [`Lease`]
    /// is not tracked (the lease may have been handed to another task): a second `lock` there
    /// waits like any other caller.
    async fn lock(&self, key: &ResourceKey, options: LockOptions) -> Result<Lease<Self::Service>>;

    /// Runs `work` while holding the lock on `key`, and releases it on every path.
    ///
    /// Takes the lock as [`lock`](LockServiceExt::lock) does, hands `work` the lease (carry
    /// it into fenced writes: [`FencedStoreExt::write`], a store's `begin_fenced`), then
    /// releases it and returns what `work` returned. The closure returns a boxed future, as
    /// sqlx's `Connection::transaction` does, so it can borrow the lease:
    /// `|lease| Box::pin(async move { … })`. As there, the future may borrow only the lease:
    /// move in what else it uses (an `Arc` of the store, owned values).
    ///
    /// Behavior — what it returns tells whether `work` ran, and nothing it returns after
    /// `work` may have taken effect invites a retry:
    ///
    /// | what happened | returns | did `work` run? |
    /// |---|---|---|
    /// | the lock was not taken (held past the wait, bad input, backend down, re-entry) | `Err` of the lock's error ([`ErrorKind::Timeout`], [`ErrorKind::Unavailable`], …; retryable as marked) | no, never started |
    /// | `work` returned `Ok(v)`; released | `Ok(v)` | yes, to its end |
    /// | `work` returned `Ok(v)`; the release failed | `Ok(v)` all the same; the failure is logged and counted (below) | yes, to its end |
    /// | `work` returned `Err(e)` | `Err(e)`, unchanged, after the release | as `work`'s own error says |
    /// | the lease was lost while `work` ran | `Err` of [`ErrorKind::WorkCancelled`], not retryable | partly: cancelled at an await, what it did before may have taken effect |
    ///
    /// - A release that fails never replaces the work's result: the work is done, and an
    ///   error there (a retryable `Unavailable` from a dropped connection) would invite a retry
    ///   that does it twice. The lock is freed at its TTL at the latest. The failure is logged
    ///   (at error level when it is [`ErrorKind::NotHolder`]: the lock was gone before `work`
    ///   finished, so its fenced writes were judged by the store and anything else it did may
    ///   have overlapped another holder) and counted in `palisade_lock_release_failed_total`.
    ///   To act on the release yourself, use [`lock`](LockServiceExt::lock) and
    ///   [`Lease::release`].
    /// - When the lease is lost while `work` runs (its TTL passed without an extension, the
    ///   backend reported the loss), `work` is cancelled (its future dropped at its next
    ///   await) and the result is [`ErrorKind::WorkCancelled`]. Extend from inside `work`
    ///   ([`Lease::extend`], [`Lease::renew_on_progress`]) to run longer than the TTL.
    /// - Inside `work`, taking the same key from the same service again is
    ///   [`ErrorKind::Reentrant`], not a wait on ourselves. Tasks `work` spawns are other
    ///   holders: they wait.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use palisade_core::{FencedStore, FencedStoreExt, LockOptions, LockServiceExt, MemoryFencedStore,
    ///                     MemoryLockService, ResourceKey, WriteBatch};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> palisade_core::Result<()> {
    /// let locks = Arc::new(MemoryLockService::new());
    /// let store = Arc::new(MemoryFencedStore::new());
    /// let key = ResourceKey::new("invoice", "2026")?;
    /// let options = LockOptions::ttl(Duration::from_secs(10)).wait(Duration::from_secs(2));
    ///
    /// let number = locks
    ///     .with_lock(&key, options, |lease| {
    ///         let store = Arc::clone(&store);
    ///         Box::pin(async move {
    ///             let last = store.read("invoice/2026/last").await?.map_or(0, |r| r.value[0]);
    ///             store.write(lease, &WriteBatch::new().put("invoice/2026/last", vec![last + 1])).await?;
    ///             Ok::<_, palisade_core::Error>(last + 1)
    ///         })
    ///     })
    ///     .await?;
    /// assert_eq!(number, 1);
    /// assert!(locks.try_lock(&key, Duration::from_secs(1)).await?.is_some(), "released");
    /// # Ok(()) }
    /// ```
    async fn with_lock<F, T, E>(&self, key: &ResourceKey, options: LockOptions, work: F) -> Result<T, E>
    where
        F: for<'l> FnOnce(&'l Lease<Self::Service>) -> crate::BoxFuture<'l, Result<T, E>> + Send,
        T: Send,
        E: From<Error> + Send;

    /// Takes the locks on every key of `keys` as one [`MultiLease`](crate::MultiLease): several
    /// resources held together (a transfer between two accounts, stock moved between two SKUs).
    ///
    /// Behavior (checked by the tests of `palisade-core`'s `multi` module):
    /// - **Free keys at once**: the set is first asked for whole
    ///   ([`LockService::try_acquire_all`]: one request where the service declares
    ///   [`MultiAcquire::OneRequest`](crate::MultiAcquire::OneRequest)). When a key is held,
    ///   the keys below it are taken at once, that key is waited for, and the keys above it are
    ///   asked for at once again.
    /// - Keys are only ever waited for in their **canonical order** (sorted; a key given twice
    ///   is taken once), holding only keys below them, whatever order `keys` lists them in:
    ///   callers whose sets overlap never deadlock.
    /// - **One wait** for the set: `options.wait` bounds the whole call, each member waiting
    ///   for what is left of it; zero makes exactly one `try_acquire_all`. Every member gets
    ///   `options.ttl`.
    /// - **All or nothing**: when a member cannot be taken (held past the wait:
    ///   [`ErrorKind::Timeout`]; an error), the members already taken are released before the
    ///   error returns, with the same kind and retryability, naming the key. A lost reply is
    ///   each member's own acquire's business: a service's acquire resolves it (the grant, or
    ///   the orphan released), so none is left behind.
    /// - **Members wait alive**: while a later member is waited for, the members already taken
    ///   are extended whenever one has less than half its TTL left (a TTL shorter than the
    ///   wait does not let them expire and go to another client meanwhile). Taking keys in
    ///   order means holding the first while waiting for the next: that is the price of no
    ///   deadlock, so keep sets small and waits short.
    /// - **The set starts whole**: a member taken early that has less than half its TTL left
    ///   once the last is taken is extended to the full TTL; one that was lost meanwhile (its
    ///   lock broken or taken over on the server) gives the set up as soon as it is found lost,
    ///   without waiting on for the later keys: everything is released and the result is
    ///   [`ErrorKind::LeaseLost`], retryable, naming that key.
    /// - No keys, or more than [`MAX_FENCES_PER_WRITE`](crate::spi::MAX_FENCES_PER_WRITE) (64):
    ///   [`ErrorKind::InvalidArgument`]. A key this task holds in an enclosing
    ///   `with_lock`/`with_locks`: [`ErrorKind::Reentrant`].
    async fn lock_all(&self, keys: &[ResourceKey], options: LockOptions) -> Result<crate::MultiLease<Self::Service>>;

    /// Runs `work` while holding every lock of `keys` ([`lock_all`](LockServiceExt::lock_all)),
    /// and releases them all on every path: [`with_lock`](LockServiceExt::with_lock) for a set,
    /// with the same table of outcomes. `work` is cancelled, and the result is
    /// [`ErrorKind::WorkCancelled`], when **any** member's lease is lost while it runs.
    async fn with_locks<F, T, E>(&self, keys: &[ResourceKey], options: LockOptions, work: F) -> Result<T, E>
    where
        F: for<'l> FnOnce(&'l crate::MultiLease<Self::Service>) -> crate::BoxFuture<'l, Result<T, E>> + Send,
        T: Send,
        E: From<Error> + Send;

    /// [`lock`](LockServiceExt::lock), then checks the grant against `store`'s watermark for
    /// the resource (fencing rule 5), at the cost of one watermark read.
    ///
    /// `store` is any [`WatermarkSource`]: a [`FencedStore`], or where your writes keep their
    /// fence (a row written by a single-row helper, read by the store's `row_watermark`).
    ///
    /// A fresh grant's fence must be strictly above the watermark: every fence the store has
    /// seen belonged to an earlier grant. A fence at or below it means the lock service lost
    /// its counter (a restart without persistence, a failover to a lagging replica, `FLUSHALL`,
    /// a restore). Below, every write under it would be refused; **equal** is worse, because
    /// it is the very fence an earlier holder may still write with, and equal fences are
    /// accepted only from the grant that set the watermark. The regression is logged at error level and counted in
    /// `palisade_lock_fence_regression_total`; the grant is released; the service's counter is moved to
    /// the watermark plus [`REGRESSION_GAP`] ([`LockService::advance_fence`]), far enough to
    /// outrank grants issued before the loss that have not written yet (the gap is relative to
    /// the watermark, the only fence the store knows: if the counter is lost again before a
    /// repaired grant writes, the next repair can issue its fence again, and the store refuses
    /// the second of the two writers as a duplicate; the model in `model/` finds exactly this
    /// run); and the lock is taken
    /// again. No stale write is ever accepted on the way. A service that cannot move its
    /// counter gives [`ErrorKind::FenceRegression`].
    ///
    /// A counter that lost only its tail (watermark 990, grants up to 1000 issued, the service
    /// back at 992) issues fences above the watermark that earlier grants also hold: no read
    /// can see that. The store does, at the second write with such a fence
    /// ([`ErrorKind::DuplicateFence`]), and [`FencedStoreExt::write`] repairs the counter then,
    /// the same way.
    async fn lock_checked<T>(&self, store: &T, key: &ResourceKey, options: LockOptions) -> Result<Lease<Self::Service>>
    where
        T: WatermarkSource + ?Sized,
        Self::Service: LockService<Fencing = Fenced>;

    /// [`try_lock`](LockServiceExt::try_lock) with the check of
    /// [`lock_checked`](LockServiceExt::lock_checked): takes the lock if it is free, without
    /// waiting (`Ok(None)` if it is held), and makes sure the grant's fence is above `store`'s
    /// watermark, repairing a regressed counter the same way.
    async fn try_lock_checked<T>(
        &self,
        store: &T,
        key: &ResourceKey,
        ttl: Duration,
    ) -> Result<Option<Lease<Self::Service>>>
    where
        T: WatermarkSource + ?Sized,
        Self::Service: LockService<Fencing = Fenced>;
}

/// How far [`LockServiceExt::lock_checked`] moves a regressed fence counter above the store's
/// watermark: 2³⁰, about a billion, as etcd advises for `--bump-revision` after a restore.
pub const REGRESSION_GAP: u64 = 1 << 30;

#[async_trait]
impl<S: LockService + ?Sized> LockServiceExt for Arc<S> {
    type Service = S;

    async fn try_lock(&self, key: &ResourceKey, ttl: Duration) -> Result<Option<Lease<S>>> {
        let ttl = Ttl::new(ttl)?;
        refuse_reentry(self, key)?;
        let backend = self.backend();
        let started = Instant::now();
        let span = tracing::debug_span!("lock.try_acquire", backend, key = %key);
        match (**self).try_acquire(key, ttl).instrument(span).await {
            Ok(Some(grant)) => {
                metrics::record_acquire(backend, "acquired", Some(started.elapsed()));
                Ok(Some(Lease::new(Arc::clone(self), grant)))
            }
            Ok(None) => {
                metrics::record_acquire(backend, "busy", None);
                Ok(None)
            }
            Err(e) => {
                metrics::record_acquire(backend, "error", None);
                Err(e)
            }
        }
    }

    async fn lock(&self, key: &ResourceKey, options: LockOptions) -> Result<Lease<S>> {
        let LockOptions { ttl, wait } = options;
        let ttl = Ttl::new(ttl)?;
        crate::spi::validate_wait(wait)?;
        refuse_reentry(self, key)?;
        let backend = self.backend();
        let started = Instant::now();
        let span = tracing::debug_span!("lock.acquire", backend, key = %key);
        let acquired = (**self).acquire(key, ttl, wait).instrument(span).await;
        leased(self, started, acquired)
    }

    async fn with_lock<F, T, E>(&self, key: &ResourceKey, options: LockOptions, work: F) -> Result<T, E>
    where
        F: for<'l> FnOnce(&'l Lease<S>) -> crate::BoxFuture<'l, Result<T, E>> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        let lease = self.lock(key, options).await?;
        let outcome = run_scoped(self, std::slice::from_ref(key), lease.lost(), work(&lease)).await;
        let released = lease.release().await;
        settle(self.backend(), &format!("the lease on {key}"), outcome, released)
    }

    async fn lock_all(&self, keys: &[ResourceKey], options: LockOptions) -> Result<crate::MultiLease<S>> {
        crate::multi::lock_all(
            self,
            keys,
            options,
            |key, options| async move { self.lock(&key, options).await },
            |keys| take_free(self, keys, options.ttl),
        )
        .await
    }

    async fn with_locks<F, T, E>(&self, keys: &[ResourceKey], options: LockOptions, work: F) -> Result<T, E>
    where
        F: for<'l> FnOnce(&'l crate::MultiLease<S>) -> crate::BoxFuture<'l, Result<T, E>> + Send,
        T: Send,
        E: From<Error> + Send,
    {
        let locks = self.lock_all(keys, options).await?;
        let taken: Vec<ResourceKey> = locks.keys().cloned().collect();
        let outcome = run_scoped(self, &taken, locks.lost(), work(&locks)).await;
        let released = locks.release().await;
        settle(self.backend(), &format!("a lease of the set {taken:?}"), outcome, released)
    }

    async fn lock_checked<T>(&self, store: &T, key: &ResourceKey, options: LockOptions) -> Result<Lease<S>>
    where
        T: WatermarkSource + ?Sized,
        S: LockService<Fencing = Fenced>,
    {
        let lease = checked(self, store, key, || async { self.lock(key, options).await.map(Some) }).await?;
        lease.ok_or_else(|| {
            crate::Error::new(ErrorKind::Backend, self.backend(), "an acquire that waits returned no lease")
        })
    }

    async fn try_lock_checked<T>(&self, store: &T, key: &ResourceKey, ttl: Duration) -> Result<Option<Lease<S>>>
    where
        T: WatermarkSource + ?Sized,
        S: LockService<Fencing = Fenced>,
    {
        checked(self, store, key, || self.try_lock(key, ttl)).await
    }
}

/// Logs a release that failed after `with_lock`'s work ended (counted by [`Lease::release`]).
fn report_failed_release(backend: &'static str, what: &str, e: &Error, work_succeeded: bool) {
    if e.kind() == ErrorKind::NotHolder {
        error!(
            backend,
            lease = what,
            work_succeeded,
            error = %e.report(),
            "the lock was no longer held when with_lock's work ended: its fenced writes were judged by the \
             store, anything else it did may have overlapped another holder"
        );
    } else {
        warn!(
            backend,
            lease = what,
            work_succeeded,
            error = %e.report(),
            "with_lock's release failed after its work ended; the lock is freed at its TTL"
        );
    }
}

tokio::task_local! {
    /// The locks the current task holds in `with_lock` scopes: (service `Arc`'s address, key).
    /// A task-local, not a lease registry: only inside a scope do we know that the lease stays
    /// with this task, so that a second acquire here would wait for ourselves.
    static SCOPED: Arc<Vec<(usize, ResourceKey)>>;
}

/// The identity of a service handle: clones of one `Arc` share it.
fn service_id<S: ?Sized>(service: &Arc<S>) -> usize {
    Arc::as_ptr(service).cast::<()>().addr()
}

/// [`LockServiceExt::lock`] on whichever of `keys` is free first
/// ([`LockService::acquire_any`]): a semaphore's permit. The same validation, re-entry
/// refusal, span and metrics as `lock`.
pub(crate) async fn lock_any<S: LockService + ?Sized>(
    service: &Arc<S>,
    keys: &[ResourceKey],
    options: LockOptions,
) -> Result<Lease<S>> {
    let LockOptions { ttl, wait } = options;
    let ttl = Ttl::new(ttl)?;
    crate::spi::validate_wait(wait)?;
    for key in keys {
        refuse_reentry(service, key)?;
    }
    let backend = service.backend();
    let started = Instant::now();
    let span = tracing::debug_span!("lock.acquire_any", backend, keys = keys.len());
    let acquired = service.acquire_any(keys, ttl, wait).instrument(span).await;
    leased(service, started, acquired)
}

/// A waiting acquisition's grant as a lease, its outcome counted (`lock`, `lock_any`).
fn leased<S: LockService + ?Sized>(
    service: &Arc<S>,
    started: Instant,
    acquired: Result<crate::Grant<S::Fencing>>,
) -> Result<Lease<S>> {
    let backend = service.backend();
    match acquired {
        Ok(grant) => {
            metrics::record_acquire(backend, "acquired", Some(started.elapsed()));
            Ok(Lease::new(Arc::clone(service), grant))
        }
        Err(e) => {
            let outcome = if e.kind() == ErrorKind::Timeout { "timeout" } else { "error" };
            metrics::record_acquire(backend, outcome, None);
            Err(e)
        }
    }
}

/// The service's [`try_acquire_all`](LockService::try_acquire_all) of `keys` for `ttl`, each
/// grant a [`Lease`]: what `lock_all` takes at once.
async fn take_free<S: LockService + ?Sized>(
    service: &Arc<S>,
    keys: Vec<ResourceKey>,
    ttl: Duration,
) -> Result<crate::AllOrNone<Lease<S>>> {
    let ttl = Ttl::new(ttl)?;
    for key in &keys {
        refuse_reentry(service, key)?;
    }
    let backend = service.backend();
    let started = Instant::now();
    let span = tracing::debug_span!("lock.try_acquire_all", backend, keys = keys.len());
    match (**service).try_acquire_all(&keys, ttl).instrument(span).await {
        Ok(crate::AllOrNone::Granted(grants)) => {
            let took = started.elapsed();
            Ok(crate::AllOrNone::Granted(
                grants
                    .into_iter()
                    .map(|grant| {
                        metrics::record_acquire(backend, "acquired", Some(took));
                        Lease::new(Arc::clone(service), grant)
                    })
                    .collect(),
            ))
        }
        Ok(crate::AllOrNone::Held(i)) => {
            metrics::record_acquire(backend, "busy", None);
            Ok(crate::AllOrNone::Held(i))
        }
        Err(e) => {
            metrics::record_acquire(backend, "error", None);
            Err(e)
        }
    }
}

/// [`ErrorKind::Reentrant`] if an enclosing `with_lock` of this task holds `key` from `service`.
fn refuse_reentry<S: LockService + ?Sized>(service: &Arc<S>, key: &ResourceKey) -> Result<()> {
    let id = service_id(service);
    let held = SCOPED.try_with(|held| held.iter().any(|(s, k)| *s == id && k == key)).unwrap_or(false);
    if held {
        return Err(Error::new(
            ErrorKind::Reentrant,
            service.backend(),
            format!("this task already holds {key} (in with_lock): locks are not re-entrant"),
        ));
    }
    Ok(())
}

/// What `with_lock` and `with_locks` run: `work` in a scope that holds `keys` of `service`
/// besides the enclosing scopes' locks (so taking one of them again is re-entry, not a wait on
/// ourselves), cancelled when `lost` fires first (`None`).
async fn run_scoped<S: ?Sized, R>(
    service: &Arc<S>,
    keys: &[ResourceKey],
    lost: impl std::future::Future<Output = ()>,
    work: impl std::future::Future<Output = R>,
) -> Option<R> {
    let mut held = SCOPED.try_with(|held| held.as_ref().clone()).unwrap_or_default();
    held.extend(keys.iter().map(|key| (service_id(service), key.clone())));
    tokio::select! {
        biased;
        () = lost => None,
        result = SCOPED.scope(Arc::new(held), work) => Some(result),
    }
}

/// The outcome table of `with_lock` and `with_locks`, once the release was tried: a failed
/// release never replaces the work's result (or error), which stands (the lock is freed at its
/// TTL at the latest; the failure is logged); work cancelled because `what` (the lease, or one
/// of the set) was lost is [`ErrorKind::WorkCancelled`].
fn settle<T, E: From<Error>>(
    backend: &'static str,
    what: &str,
    outcome: Option<Result<T, E>>,
    released: Result<()>,
) -> Result<T, E> {
    match outcome {
        Some(result) => {
            if let Err(e) = released {
                report_failed_release(backend, what, &e, result.is_ok());
            }
            result
        }
        None => Err(Error::new(
            ErrorKind::WorkCancelled,
            backend,
            format!(
                "{what} was lost while the work ran; the work was cancelled at its next await, and what it did \
                 before may have taken effect"
            ),
        )
        .with_retryable(false)
        .into()),
    }
}

/// The check behind `lock_checked` and `try_lock_checked`: acquires with `acquire`, compares the
/// grant's fence with the store's watermark, and repairs a regressed counter once.
async fn checked<S, T, F, Fut>(
    service: &Arc<S>,
    store: &T,
    key: &ResourceKey,
    mut acquire: F,
) -> Result<Option<Lease<S>>>
where
    S: LockService<Fencing = Fenced> + ?Sized,
    T: WatermarkSource + ?Sized,
    F: FnMut() -> Fut + Send,
    Fut: std::future::Future<Output = Result<Option<Lease<S>>>> + Send,
{
    let backend = service.backend();
    // Two rounds: the first may find and repair a regression, the second must be clean.
    for _ in 0..2 {
        let Some(lease) = acquire().await? else { return Ok(None) };
        let Some(watermark) = store.highest_fence(key).await? else { return Ok(Some(lease)) };
        // Strictly above: an equal fence was already spent by an earlier grant.
        if lease.fence() > watermark {
            return Ok(Some(lease));
        }
        report_regression(
            backend,
            store.source_name(),
            key,
            lease.fence(),
            watermark,
            "at or below the store's watermark",
        );
        // Give the useless grant back before moving the counter; a failed release only
        // delays the next grant until the TTL.
        let _ = lease.release().await;
        repair_counter(&**service, key, watermark).await?;
    }
    Err(crate::Error::new(
        ErrorKind::FenceRegression,
        backend,
        format!("fence regression on {key}: still not above the store's watermark after moving the counter"),
    ))
}

/// Logs a fence regression at error level and counts it in `palisade_lock_fence_regression_total`.
fn report_regression(
    backend: &'static str,
    store: &'static str,
    key: &ResourceKey,
    fence: Fence,
    watermark: Fence,
    how: &str,
) {
    metrics::record_fence_regression(backend);
    error!(
        backend,
        store,
        key = %key,
        fence = fence.get(),
        watermark = watermark.get(),
        "FENCE REGRESSION: the lock service issued a fence {how}; it lost its counter"
    );
}

/// The repair of fencing rule 5: moves `key`'s counter to `watermark` plus [`REGRESSION_GAP`],
/// above every fence issued before the loss that may not have been written yet.
async fn repair_counter<S>(service: &S, key: &ResourceKey, watermark: Fence) -> Result<()>
where
    S: LockService<Fencing = Fenced> + ?Sized,
{
    let backend = service.backend();
    let floor = Fence::new(watermark.get().saturating_add(REGRESSION_GAP));
    service.advance_fence(key, floor).await.map_err(|e| {
        crate::Error::new(
            ErrorKind::FenceRegression,
            backend,
            format!(
                "fence regression on {key}: issued at or below watermark {watermark}, and the counter cannot be moved"
            ),
        )
        .with_source(e)
    })
}

/// What users call on a fenced store: writes that take their fence from a lease.
///
/// Implemented for every [`FencedStore`], including `dyn FencedStore` and `Arc`s of them.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use palisade_core::{ErrorKind, FencedStore, FencedStoreExt, LockOptions, LockServiceExt, MemoryFencedStore,
///                     MemoryLockService, ResourceKey, WriteBatch};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> palisade_core::Result<()> {
/// let locks = Arc::new(MemoryLockService::new());
/// let store = MemoryFencedStore::new();
/// let key = ResourceKey::new("alloc", "WH-01")?;
///
/// let old = locks.lock(&key, LockOptions::ttl(Duration::from_millis(20)).wait(Duration::from_secs(1))).await?;
/// tokio::time::sleep(Duration::from_millis(40)).await;             // a "GC pause" past the TTL
/// let new = locks.lock(&key, LockOptions::ttl(Duration::from_secs(30)).wait(Duration::from_secs(1))).await?;
/// store.write(&new, &WriteBatch::new().put("stock/WH-01", b"9".to_vec())).await?;
///
/// let err = store.write(&old, &WriteBatch::new().put("stock/WH-01", b"8".to_vec())).await.unwrap_err();
/// assert!(matches!(err.kind(), ErrorKind::StaleFence { .. }));
/// assert_eq!(store.read("stock/WH-01").await?.unwrap().value, b"9");
/// # Ok(()) }
/// ```
///
/// A lease of an unfenced service (Redlock) cannot be written with:
///
/// ```compile_fail
/// use palisade_core::{FencedStoreExt, Lease, LockService, MemoryFencedStore, Unfenced, WriteBatch};
/// async fn stale<S: LockService<Fencing = Unfenced>>(store: &MemoryFencedStore, lease: &Lease<S>) {
///     store.write(lease, &WriteBatch::new()).await; // expected `Fenced`, found `Unfenced`
/// }
/// ```
#[async_trait]
pub trait FencedStoreExt: FencedStore {
    /// Applies `batch` under the lease's resource, fence and grant (see [`FencedStore::apply`]).
    ///
    /// The write goes to the store even if the lease is known to be lost: the store, not
    /// the local clock, is the judge (fencing rule 6). A stale fence is counted in
    /// `palisade_lock_fence_rejected_total` and logged.
    ///
    /// An [`ErrorKind::DuplicateFence`] (another grant already wrote with this very fence: the
    /// lock service lost part of its counter) is a fence regression: it is logged at error
    /// level, counted in `palisade_lock_fence_regression_total`, and repaired the way
    /// [`LockServiceExt::lock_checked`] repairs one: the service's counter is moved to the fence
    /// plus [`REGRESSION_GAP`]. The error is still returned, since this lease can never write;
    /// release it and lock again, and the new grant outranks every fence issued before the loss.
    /// If the counter cannot be moved, the error is [`ErrorKind::FenceRegression`].
    async fn write<S>(&self, lease: &Lease<S>, batch: &WriteBatch) -> Result<()>
    where
        S: LockService<Fencing = Fenced> + ?Sized,
    {
        let result = self.write_fenced(lease.key(), lease.grant_fence(), batch).await;
        repair_duplicate(self.backend(), &result, |_| Some(lease)).await?;
        result
    }

    /// [`FencedStore::apply`] with metrics and tracing, for callers holding a raw fence and
    /// grant id (passed to another process, for example).
    ///
    /// Without the lease it cannot move the lock service's counter on an
    /// [`ErrorKind::DuplicateFence`]: it only logs it. Whoever holds the service repairs it
    /// with [`LockService::advance_fence`] (the fence plus [`REGRESSION_GAP`]).
    async fn write_fenced(&self, resource: &ResourceKey, fence: GrantFence, batch: &WriteBatch) -> Result<()> {
        let store = self.backend();
        let span = tracing::debug_span!("store.fenced_write", store, resource = %resource, fence = fence.fence().get());
        let result = self.apply(resource, fence, batch).instrument(span).await;
        observe_refusal(store, Some(resource), &result);
        result
    }

    /// Applies `batch` under every member's fence of `locks`, all or nothing
    /// ([`FencedStore::apply_all`]): the write of a job over several resources, such as a
    /// transfer from one to another.
    ///
    /// A stale or duplicate fence on **any** member refuses the whole batch; the error names
    /// that member ([`Error::resource`](crate::Error::resource)), is counted and logged as
    /// [`write`](Self::write)'s is, and a duplicate is repaired on that member's lock service
    /// the same way.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use palisade_core::{FencedStore, FencedStoreExt, LockOptions, LockServiceExt, MemoryFencedStore,
    ///                     MemoryLockService, ResourceKey, WriteBatch};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> palisade_core::Result<()> {
    /// let locks = Arc::new(MemoryLockService::new());
    /// let store = MemoryFencedStore::new();
    /// let (from, to) = (ResourceKey::new("stock", "SKU-1")?, ResourceKey::new("stock", "SKU-2")?);
    /// let both = locks.lock_all(&[from, to], LockOptions::ttl(Duration::from_secs(30))).await?;
    /// let transfer = WriteBatch::new().put("stock/SKU-1", b"7".to_vec()).put("stock/SKU-2", b"3".to_vec());
    /// store.write_all(&both, &transfer).await?; // both sides, or neither
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    async fn write_all<S>(&self, locks: &MultiLease<S>, batch: &WriteBatch) -> Result<()>
    where
        S: LockService<Fencing = Fenced> + ?Sized,
    {
        let result = self.write_all_fenced(&locks.fences(), batch).await;
        let named = |resource: Option<&ResourceKey>| match resource {
            Some(resource) => locks.lease(resource),
            None if locks.leases().len() == 1 => locks.leases().first(),
            // A store that did not say which member: no counter is moved blindly.
            None => None,
        };
        repair_duplicate(self.backend(), &result, named).await?;
        result
    }

    /// [`FencedStore::apply_all`] with metrics and tracing, for callers holding raw fences and
    /// grant ids. Like [`write_fenced`](Self::write_fenced), it only logs a duplicate fence.
    async fn write_all_fenced(&self, fences: &[(ResourceKey, GrantFence)], batch: &WriteBatch) -> Result<()> {
        let store = self.backend();
        let span = tracing::debug_span!("store.fenced_write_all", store, resources = fences.len());
        let result = self.apply_all(fences, batch).instrument(span).await;
        observe_refusal(store, None, &result);
        result
    }
}

/// Counts and logs a store's fence refusal. `resource` is the write's own, for a store that
/// did not name it in the error.
fn observe_refusal(store: &'static str, resource: Option<&ResourceKey>, result: &Result<()>) {
    let Err(e) = result else { return };
    let resource = e.resource().or(resource).map_or_else(|| String::from("?"), ToString::to_string);
    match e.kind() {
        ErrorKind::StaleFence { presented, current } => {
            metrics::record_fence_rejected(store);
            warn!(store, %resource, %presented, %current, "stale fence rejected");
        }
        ErrorKind::DuplicateFence { fence } => {
            metrics::record_fence_rejected(store);
            error!(store, %resource, %fence, "duplicate fence rejected: the lock service issued it to two grants");
        }
        _ => {}
    }
}

/// On a [`ErrorKind::DuplicateFence`] (the lock service lost part of its counter), reports the
/// regression and moves the counter of the refused resource's lease (`lease_of` the
/// resource the error names) past the fence.
async fn repair_duplicate<'a, S>(
    store: &'static str,
    result: &Result<()>,
    lease_of: impl FnOnce(Option<&ResourceKey>) -> Option<&'a Lease<S>> + Send,
) -> Result<()>
where
    S: LockService<Fencing = Fenced> + ?Sized + 'a,
{
    let Err(e) = result else { return Ok(()) };
    let ErrorKind::DuplicateFence { fence } = e.kind() else { return Ok(()) };
    let Some(lease) = lease_of(e.resource()) else { return Ok(()) };
    let service = lease.service();
    report_regression(service.backend(), store, lease.key(), fence, fence, "to two grants");
    repair_counter(&**service, lease.key(), fence).await
}

impl<T: FencedStore + ?Sized> FencedStoreExt for T {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryFencedStore, MemoryLockService};

    /// A lock service that lost its counter hands out the very fence an earlier holder still
    /// writes with. `lock_checked` must treat that equal fence as a regression too.
    #[tokio::test]
    async fn an_equal_fence_after_a_counter_loss_is_a_regression() {
        let store = MemoryFencedStore::new();
        let key = ResourceKey::new("regress", "equal").unwrap();
        let ttl = Duration::from_secs(30);
        let before = Arc::new(MemoryLockService::new());
        let a = before.lock_checked(&store, &key, LockOptions::ttl(ttl).wait(ttl)).await.unwrap();
        store.write(&a, &WriteBatch::new().put("rec", b"A".to_vec())).await.unwrap();

        // "Restarted": a fresh service's counter starts again at the fence A holds.
        let naive = Arc::new(MemoryLockService::new()).lock(&key, LockOptions::ttl(ttl).wait(ttl)).await.unwrap();
        assert_eq!(naive.fence(), a.fence(), "the counter restarts at A's fence");
        naive.release().await.unwrap();

        let after = Arc::new(MemoryLockService::new());
        let b = after.lock_checked(&store, &key, LockOptions::ttl(ttl).wait(ttl)).await.unwrap();
        assert!(b.fence().get() > a.fence().get() + REGRESSION_GAP, "fence {} after repair", b.fence());
        store.write(&b, &WriteBatch::new().put("rec", b"B".to_vec())).await.unwrap();
        let err = store.write(&a, &WriteBatch::new().put("rec", b"A again".to_vec())).await.unwrap_err();
        assert!(err.stale_fence_details().is_some(), "{err}");
        assert_eq!(store.read("rec").await.unwrap().unwrap().value, b"B");
    }

    /// Issue 16.2: the counter loses only its tail. Watermark 990, grants 991–1000 issued and
    /// not written, the service comes back at 992. Grant 993 is above the watermark, so no
    /// check at acquire time can see it; the old holder of 993 writes first. The new holder's
    /// write with the same fence must be refused, and after the repair a new grant must outrank
    /// the old grants still in flight (995 here).
    #[tokio::test]
    async fn a_counter_that_lost_its_tail_is_caught_at_the_second_write_and_repaired() {
        let store = MemoryFencedStore::new();
        let key = ResourceKey::new("regress", "tail").unwrap();
        let short = Duration::from_millis(5);
        let ttl = Duration::from_secs(30);
        let locks = Arc::new(MemoryLockService::new());
        locks.rewind_fence(&key, Fence::new(989));
        let w = locks.lock_checked(&store, &key, LockOptions::ttl(short).wait(ttl)).await.unwrap();
        store.write(&w, &WriteBatch::new().put("rec", b"990".to_vec())).await.unwrap();
        w.release().await.unwrap();
        let mut in_flight = Vec::new();
        for _ in 991..=1000 {
            let lease = locks.lock(&key, LockOptions::ttl(short).wait(ttl)).await.unwrap();
            tokio::time::sleep(short * 2).await; // its holder pauses past the TTL
            in_flight.push(lease);
        }
        let old_993 = in_flight.iter().find(|l| l.fence() == Fence::new(993)).unwrap();
        let old_995 = in_flight.iter().find(|l| l.fence() == Fence::new(995)).unwrap();

        locks.rewind_fence(&key, Fence::new(992));
        let new_993 = locks.lock_checked(&store, &key, LockOptions::ttl(ttl).wait(ttl)).await.unwrap();
        assert_eq!(new_993.fence(), Fence::new(993), "above the watermark: the check at acquire passes");
        store.write(old_993, &WriteBatch::new().put("rec", b"old 993".to_vec())).await.unwrap();
        let err = store.write(&new_993, &WriteBatch::new().put("rec", b"new 993".to_vec())).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::DuplicateFence { fence: Fence::new(993) }, "{err}");
        assert_eq!(store.read("rec").await.unwrap().unwrap().value, b"old 993");
        new_993.release().await.unwrap();

        let fresh = locks.lock_checked(&store, &key, LockOptions::ttl(ttl).wait(ttl)).await.unwrap();
        assert!(fresh.fence().get() > 993 + REGRESSION_GAP, "fence {} after the repair", fresh.fence());
        store.write(&fresh, &WriteBatch::new().put("rec", b"fresh".to_vec())).await.unwrap();
        let err = store.write(old_995, &WriteBatch::new().put("rec", b"old 995".to_vec())).await.unwrap_err();
        assert!(err.stale_fence_details().is_some(), "{err}");
        assert_eq!(store.read("rec").await.unwrap().unwrap().value, b"fresh");
    }

    #[tokio::test]
    async fn try_lock_checked_tries_once_and_repairs_a_regression() {
        let store = MemoryFencedStore::new();
        let key = ResourceKey::new("regress", "try").unwrap();
        let ttl = Duration::from_secs(30);
        let before = Arc::new(MemoryLockService::new());
        let a = before.try_lock_checked(&store, &key, ttl).await.unwrap().expect("free");
        store.write(&a, &WriteBatch::new().put("rec", b"A".to_vec())).await.unwrap();
        assert!(before.try_lock_checked(&store, &key, ttl).await.unwrap().is_none(), "held: no wait, no lease");
        let a_fence = a.fence();
        a.release().await.unwrap();

        let after = Arc::new(MemoryLockService::new());
        let b = after.try_lock_checked(&store, &key, ttl).await.unwrap().expect("free");
        assert!(b.fence().get() > a_fence.get() + REGRESSION_GAP, "fence {} after repair", b.fence());
    }

    fn opts(ttl: Duration, wait: Duration) -> LockOptions {
        LockOptions::ttl(ttl).wait(wait)
    }

    #[tokio::test]
    async fn with_lock_releases_after_success_and_after_error() {
        let locks = Arc::new(MemoryLockService::new());
        let key = ResourceKey::new("scoped", "paths").unwrap();
        let ttl = Duration::from_secs(30);
        let fence = locks
            .with_lock(&key, opts(ttl, ttl), |lease| Box::pin(async move { Ok::<_, Error>(lease.fence()) }))
            .await
            .unwrap();
        let next = locks.try_lock(&key, ttl).await.unwrap().expect("released after success");
        assert!(next.fence() > fence);
        next.release().await.unwrap();

        #[derive(Debug)]
        enum AppError {
            #[allow(dead_code)] // carried for the caller's report
            Lock(Error),
            Rejected,
        }
        impl From<Error> for AppError {
            fn from(e: Error) -> Self {
                AppError::Lock(e)
            }
        }
        let failed: std::result::Result<(), AppError> =
            locks.with_lock(&key, opts(ttl, ttl), |_| Box::pin(async { Err(AppError::Rejected) })).await;
        assert!(matches!(failed, Err(AppError::Rejected)), "{failed:?}");
        assert!(locks.try_lock(&key, ttl).await.unwrap().is_some(), "released after the work's error");
    }

    #[tokio::test]
    async fn a_reentrant_acquire_inside_with_lock_is_refused_at_once() {
        let locks = Arc::new(MemoryLockService::new());
        let key = ResourceKey::new("scoped", "reentry").unwrap();
        let other_key = ResourceKey::new("scoped", "other").unwrap();
        let ttl = Duration::from_secs(30);
        let (inner, k, ok) = (Arc::clone(&locks), key.clone(), other_key.clone());
        let (lock, try_lock, other) = locks
            .with_lock(&key, opts(ttl, ttl), |_| {
                Box::pin(async move {
                    let lock = inner.lock(&k, opts(ttl, ttl)).await.err().map(|e| e.kind());
                    let try_lock = inner.try_lock(&k, ttl).await.err().map(|e| e.kind());
                    // Another key, and the same key from a spawned task, are ordinary acquires.
                    let other = inner.lock(&ok, opts(ttl, Duration::ZERO)).await?;
                    other.release().await?;
                    let spawned = tokio::spawn({
                        let (inner, k) = (Arc::clone(&inner), k.clone());
                        async move { inner.try_lock(&k, ttl).await.map(|l| l.is_none()) }
                    });
                    let busy = spawned.await.map_err(|e| Error::new(ErrorKind::Backend, "test", e.to_string()))??;
                    Ok::<_, Error>((lock, try_lock, busy))
                })
            })
            .await
            .unwrap();
        assert_eq!(lock, Some(ErrorKind::Reentrant));
        assert_eq!(try_lock, Some(ErrorKind::Reentrant));
        assert!(other, "a spawned task sees the lock held (busy), not a re-entry");
    }

    #[tokio::test]
    async fn with_lock_cancels_its_work_when_the_lease_is_lost() {
        let locks = Arc::new(MemoryLockService::new());
        let key = ResourceKey::new("scoped", "lost").unwrap();
        let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&finished);
        let result = locks
            .with_lock(&key, opts(Duration::from_millis(50), Duration::ZERO), |_| {
                Box::pin(async move {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    flag.store(true, std::sync::atomic::Ordering::SeqCst);
                    Ok::<_, Error>(())
                })
            })
            .await;
        let cancelled = result.unwrap_err();
        assert_eq!(
            cancelled.kind(),
            ErrorKind::WorkCancelled,
            "work cancelled midway (its effects may have committed) was reported as {:?}: {cancelled}",
            cancelled.kind()
        );
        assert!(!cancelled.is_retryable(), "cancelled work whose effects may have committed is not retryable");
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert!(!finished.load(std::sync::atomic::Ordering::SeqCst), "the work went on after the loss");
    }

    /// A memory service whose releases fail with a retryable `Unavailable` (a connection that
    /// dropped at the wrong moment).
    struct ReleaseFails(MemoryLockService);

    #[async_trait]
    impl LockService for ReleaseFails {
        type Fencing = Fenced;
        fn backend(&self) -> &'static str {
            "release-fails"
        }
        fn capabilities(&self) -> crate::Capabilities {
            self.0.capabilities()
        }
        async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<crate::Grant<Fenced>>> {
            self.0.try_acquire(key, ttl).await
        }
        async fn extend(&self, grant: &crate::Grant<Fenced>, ttl: Ttl) -> Result<Ttl> {
            self.0.extend(grant, ttl).await
        }
        async fn release(&self, _: &crate::Grant<Fenced>) -> Result<()> {
            Err(Error::new(ErrorKind::Unavailable, "release-fails", "connection reset"))
        }
    }

    #[tokio::test]
    async fn with_lock_returns_the_work_result_when_only_the_release_failed() {
        let locks = Arc::new(ReleaseFails(MemoryLockService::new()));
        let key = ResourceKey::new("scoped", "release").unwrap();
        let ttl = Duration::from_secs(30);
        let committed = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let count = Arc::clone(&committed);
        let result = locks
            .with_lock(&key, opts(ttl, ttl), |_| {
                Box::pin(async move { Ok::<_, Error>(count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1) })
            })
            .await;
        assert_eq!(committed.load(std::sync::atomic::Ordering::SeqCst), 1);
        match result {
            Ok(number) => assert_eq!(number, 1, "the work's own result"),
            Err(e) => panic!(
                "the work committed, only the release failed, yet with_lock returned {:?} (retryable: {}): \
                 a retry would do the work twice",
                e.kind(),
                e.is_retryable()
            ),
        }
    }

    #[tokio::test]
    async fn a_zero_wait_is_one_attempt() {
        let locks = Arc::new(MemoryLockService::new());
        let key = ResourceKey::new("zero", "wait").unwrap();
        let ttl = Duration::from_secs(30);
        let held = locks.lock(&key, LockOptions::ttl(ttl)).await.unwrap();
        let started = Instant::now();
        let err = locks.lock(&key, LockOptions::ttl(ttl)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout);
        assert!(started.elapsed() < Duration::from_secs(1));
        held.release().await.unwrap();
        let too_long = LockOptions::ttl(ttl).wait(Ttl::MAX + Duration::from_secs(1));
        assert_eq!(locks.lock(&key, too_long).await.unwrap_err().kind(), ErrorKind::InvalidArgument);
    }
}
