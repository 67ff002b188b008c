//! Convenience for users: leases instead of raw grants, fenced writes from a lease, metrics
//! and tracing around both.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tracing::{Instrument, error, warn};

use crate::error::{ErrorKind, Result};
use crate::{
    Fence, Fenced, FencedStore, GrantFence, Lease, LockService, ResourceKey, Ttl, WatermarkSource, WriteBatch, metrics,
};

/// What users call on a lock service: leases with a lifecycle, plus metrics and tracing.
///
/// Implemented for every `Arc<S>` where `S: LockService`, including
/// `Arc<dyn LockService<Fencing = Fenced>>`.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use palisade_core::{LockServiceExt, MemoryLockService, ResourceKey};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> palisade_core::Result<()> {
/// let locks = Arc::new(MemoryLockService::new());
/// let key = ResourceKey::new("alloc", "WH-01")?;
/// let lease = locks.lock(&key, Duration::from_secs(30), Duration::from_secs(5)).await?;
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
    /// `ttl` is validated ([`Ttl::new`]).
    async fn try_lock(&self, key: &ResourceKey, ttl: Duration) -> Result<Option<Lease<Self::Service>>>;

    /// Takes the lock, waiting up to `wait`; [`ErrorKind::Timeout`] if it does not come free.
    /// `ttl` and `wait` are validated.
    async fn lock(&self, key: &ResourceKey, ttl: Duration, wait: Duration) -> Result<Lease<Self::Service>>;

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
    /// `lock_fence_regression_total`; the grant is released; the service's counter is moved to
    /// the watermark plus [`REGRESSION_GAP`] ([`LockService::advance_fence`]), far enough to
    /// outrank grants issued before the loss that have not written yet; and the lock is taken
    /// again. No stale write is ever accepted on the way. A service that cannot move its
    /// counter gives [`ErrorKind::FenceRegression`].
    ///
    /// A counter that lost only its tail (watermark 990, grants up to 1000 issued, the service
    /// back at 992) issues fences above the watermark that earlier grants also hold: no read
    /// can see that. The store does, at the second write with such a fence
    /// ([`ErrorKind::DuplicateFence`]), and [`FencedStoreExt::write`] repairs the counter then,
    /// the same way.
    async fn lock_checked<T>(
        &self,
        store: &T,
        key: &ResourceKey,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lease<Self::Service>>
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

    async fn lock(&self, key: &ResourceKey, ttl: Duration, wait: Duration) -> Result<Lease<S>> {
        let ttl = Ttl::new(ttl)?;
        crate::validate_wait(wait)?;
        let backend = self.backend();
        let started = Instant::now();
        let span = tracing::debug_span!("lock.acquire", backend, key = %key);
        match (**self).acquire(key, ttl, wait).instrument(span).await {
            Ok(grant) => {
                metrics::record_acquire(backend, "acquired", Some(started.elapsed()));
                Ok(Lease::new(Arc::clone(self), grant))
            }
            Err(e) => {
                let outcome = if e.kind() == ErrorKind::Timeout { "timeout" } else { "error" };
                metrics::record_acquire(backend, outcome, None);
                Err(e)
            }
        }
    }

    async fn lock_checked<T>(&self, store: &T, key: &ResourceKey, ttl: Duration, wait: Duration) -> Result<Lease<S>>
    where
        T: WatermarkSource + ?Sized,
        S: LockService<Fencing = Fenced>,
    {
        let lease = checked(self, store, key, || async { self.lock(key, ttl, wait).await.map(Some) }).await?;
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

/// Logs a fence regression at error level and counts it in `lock_fence_regression_total`.
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
/// use palisade_core::{ErrorKind, FencedStore, FencedStoreExt, LockServiceExt, MemoryFencedStore,
///                     MemoryLockService, ResourceKey, WriteBatch};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> palisade_core::Result<()> {
/// let locks = Arc::new(MemoryLockService::new());
/// let store = MemoryFencedStore::new();
/// let key = ResourceKey::new("alloc", "WH-01")?;
///
/// let old = locks.lock(&key, Duration::from_millis(20), Duration::from_secs(1)).await?;
/// tokio::time::sleep(Duration::from_millis(40)).await;             // a "GC pause" past the TTL
/// let new = locks.lock(&key, Duration::from_secs(30), Duration::from_secs(1)).await?;
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
    /// `lock_fence_rejected_total` and logged.
    ///
    /// An [`ErrorKind::DuplicateFence`] (another grant already wrote with this very fence: the
    /// lock service lost part of its counter) is a fence regression: it is logged at error
    /// level, counted in `lock_fence_regression_total`, and repaired the way
    /// [`LockServiceExt::lock_checked`] repairs one: the service's counter is moved to the fence
    /// plus [`REGRESSION_GAP`]. The error is still returned, since this lease can never write;
    /// release it and lock again, and the new grant outranks every fence issued before the loss.
    /// If the counter cannot be moved, the error is [`ErrorKind::FenceRegression`].
    async fn write<S>(&self, lease: &Lease<S>, batch: &WriteBatch) -> Result<()>
    where
        S: LockService<Fencing = Fenced> + ?Sized,
    {
        let result = self.write_fenced(lease.key(), lease.grant_fence(), batch).await;
        if let Err(e) = &result
            && let ErrorKind::DuplicateFence { fence } = e.kind()
        {
            let service = lease.service();
            report_regression(service.backend(), self.backend(), lease.key(), fence, fence, "to two grants");
            repair_counter(&**service, lease.key(), fence).await?;
        }
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
        if let Err(e) = &result {
            match e.kind() {
                ErrorKind::StaleFence { presented, current } => {
                    metrics::record_fence_rejected(store);
                    warn!(store, resource = %resource, %presented, %current, "stale fence rejected");
                }
                ErrorKind::DuplicateFence { fence } => {
                    metrics::record_fence_rejected(store);
                    error!(store, resource = %resource, %fence, "duplicate fence rejected: the lock service issued it to two grants");
                }
                _ => {}
            }
        }
        result
    }
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
        let a = before.lock_checked(&store, &key, ttl, ttl).await.unwrap();
        store.write(&a, &WriteBatch::new().put("rec", b"A".to_vec())).await.unwrap();

        // "Restarted": a fresh service's counter starts again at the fence A holds.
        let naive = Arc::new(MemoryLockService::new()).lock(&key, ttl, ttl).await.unwrap();
        assert_eq!(naive.fence(), a.fence(), "the counter restarts at A's fence");
        naive.release().await.unwrap();

        let after = Arc::new(MemoryLockService::new());
        let b = after.lock_checked(&store, &key, ttl, ttl).await.unwrap();
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
        let w = locks.lock_checked(&store, &key, short, ttl).await.unwrap();
        store.write(&w, &WriteBatch::new().put("rec", b"990".to_vec())).await.unwrap();
        w.release().await.unwrap();
        let mut in_flight = Vec::new();
        for _ in 991..=1000 {
            let lease = locks.lock(&key, short, ttl).await.unwrap();
            tokio::time::sleep(short * 2).await; // its holder pauses past the TTL
            in_flight.push(lease);
        }
        let old_993 = in_flight.iter().find(|l| l.fence() == Fence::new(993)).unwrap();
        let old_995 = in_flight.iter().find(|l| l.fence() == Fence::new(995)).unwrap();

        locks.rewind_fence(&key, Fence::new(992));
        let new_993 = locks.lock_checked(&store, &key, ttl, ttl).await.unwrap();
        assert_eq!(new_993.fence(), Fence::new(993), "above the watermark: the check at acquire passes");
        store.write(old_993, &WriteBatch::new().put("rec", b"old 993".to_vec())).await.unwrap();
        let err = store.write(&new_993, &WriteBatch::new().put("rec", b"new 993".to_vec())).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::DuplicateFence { fence: Fence::new(993) }, "{err}");
        assert_eq!(store.read("rec").await.unwrap().unwrap().value, b"old 993");
        new_993.release().await.unwrap();

        let fresh = locks.lock_checked(&store, &key, ttl, ttl).await.unwrap();
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
}
