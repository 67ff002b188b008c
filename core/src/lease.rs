//! The lease a caller holds: a grant plus its local lifecycle.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, warn};

use crate::error::{Error, ErrorKind, Result};
use crate::renewal::{Progress, Renewal};
use crate::{Fence, Fenced, Grant, LockService, OwnerToken, ResourceKey, Ttl, metrics};

/// A held lock: the grant, its fence, its local deadline, and a signal that fires if it is lost.
///
/// Get one from [`LockServiceExt::try_lock`](crate::LockServiceExt::try_lock) or
/// [`lock`](crate::LockServiceExt::lock). Carry [`Lease::fence`] into every write the lock
/// protects ([`FencedStoreExt::write`](crate::FencedStoreExt::write) does it for you).
///
/// # The local deadline is a hint, not safety
///
/// [`safe_until`](Lease::safe_until) and [`lost`](Lease::lost) are computed from the local
/// monotonic clock and whatever the backend reports. They save wasted work; they cannot
/// stop a paused process from waking up and writing. Only the fenced store can, which is why
/// writes go through it.
///
/// # Release on drop is not immediate!
///
/// Dropping a lease without calling [`release`](Lease::release) spawns a best-effort release
/// on the current Tokio runtime and returns at once: the lock may stay held for a moment
/// after the drop, or until its TTL if the runtime is shutting down or the release fails.
/// Call `release().await` when you want to know that the lock is free.
pub struct Lease<S: LockService + ?Sized> {
    shared: Arc<LeaseShared<S>>,
    released: bool,
}

/// What the lease, its watchdog and its renewal task share.
pub(crate) struct LeaseShared<S: LockService + ?Sized> {
    pub(crate) service: Arc<S>,
    pub(crate) grant: Grant<S::Fencing>,
    timing: Mutex<Timing>,
    changed: Notify,
    /// Fires when the lease is lost; never fires after a release.
    lost: CancellationToken,
    /// Fires when the lease is released (or dropped): stops the watchdog and renewals.
    done: CancellationToken,
    /// Whether the deadline watchdog runs. It starts when somebody can observe the lost signal
    /// (`lost`, `lost_token`, a renewal): a lease nobody watches costs no task, and its loss is
    /// found when it is looked at (`is_lost`, `extend`, `release`, drop).
    watching: AtomicBool,
}

#[derive(Clone, Copy)]
struct Timing {
    deadline: Instant,
    /// What the backend granted last (it may cap an extension below what was asked).
    ttl: Ttl,
    /// What the holder asked for last: what renewal asks for again, so that one capped
    /// extension does not shrink the lease for good.
    requested: Ttl,
}

impl<S: LockService + ?Sized> LeaseShared<S> {
    fn timing(&self) -> Timing {
        *self.timing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn ttl(&self) -> Ttl {
        self.timing().ttl
    }

    pub(crate) fn requested_ttl(&self) -> Ttl {
        self.timing().requested
    }

    pub(crate) fn done(&self) -> &CancellationToken {
        &self.done
    }

    pub(crate) fn lost_token(&self) -> &CancellationToken {
        &self.lost
    }

    /// Marks the lease lost if the backend reported the loss or the deadline passed: the
    /// watchdog's check, for a lease without one (and before a release, so that a lease that
    /// ran out unobserved is still counted and logged as lost).
    pub(crate) fn check_lost(&self) {
        if self.done.is_cancelled() || self.lost.is_cancelled() {
            return;
        }
        if self.grant.lost_token().is_cancelled() {
            self.mark_lost("backend reported the lease lost");
        } else if Instant::now() >= self.timing().deadline {
            self.mark_lost("TTL elapsed without a successful extension");
        }
    }

    /// Starts the deadline watchdog once (see `watching`).
    pub(crate) fn watch(self: &Arc<Self>) {
        if !self.watching.swap(true, Ordering::AcqRel) {
            tokio::spawn(watchdog(Arc::clone(self)));
        }
    }

    /// Fires the lost signal once, with a reason for the log.
    pub(crate) fn mark_lost(&self, why: &str) {
        if self.done.is_cancelled() || self.lost.is_cancelled() {
            return;
        }
        warn!(
            backend = self.service.backend(),
            key = %self.grant.key(),
            reason = why,
            "lock lease lost"
        );
        metrics::record_lost(self.service.backend());
        self.lost.cancel();
    }

    /// Extends on the backend and moves the local deadline. Refuses locally once lost.
    pub(crate) async fn extend(&self, ttl: Ttl) -> Result<()> {
        let backend = self.service.backend();
        self.check_lost();
        if self.lost.is_cancelled() {
            return Err(Error::new(ErrorKind::LeaseLost, backend, "lease already lost; not extending"));
        }
        if self.done.is_cancelled() {
            return Err(Error::new(ErrorKind::NotHolder, backend, "lease already released"));
        }
        let sent_at = Instant::now();
        if sent_at >= self.timing().deadline {
            self.mark_lost("deadline passed before extend");
            return Err(Error::new(ErrorKind::LeaseLost, backend, "lease deadline passed; not extending"));
        }
        let span = tracing::debug_span!("lock.extend", backend, key = %self.grant.key());
        match self.service.extend(&self.grant, ttl).instrument(span).await {
            Ok(granted) => {
                // Never trust a backend to stay within what was asked.
                let granted = if granted.get() <= ttl.get() { granted } else { ttl };
                {
                    let mut t = self.timing.lock().unwrap_or_else(PoisonError::into_inner);
                    t.deadline = sent_at + granted.get();
                    t.ttl = granted;
                    t.requested = ttl;
                }
                self.changed.notify_one();
                Ok(())
            }
            Err(e) => {
                if e.kind() == ErrorKind::NotHolder {
                    self.mark_lost("backend says we no longer hold the lock");
                }
                Err(e)
            }
        }
    }
}

/// Fires `lost` at the local deadline (moved by extensions) or when the backend reports loss.
async fn watchdog<S: LockService + ?Sized>(shared: Arc<LeaseShared<S>>) {
    let backend_lost = shared.grant.lost_token().clone();
    loop {
        let deadline = shared.timing().deadline;
        tokio::select! {
            _ = shared.done.cancelled() => return,
            _ = shared.lost.cancelled() => return,
            _ = backend_lost.cancelled() => {
                shared.mark_lost("backend reported the lease lost");
                return;
            }
            _ = shared.changed.notified() => continue,
            _ = tokio::time::sleep_until(deadline) => {
                if Instant::now() >= shared.timing().deadline {
                    shared.mark_lost("TTL elapsed without a successful extension");
                    return;
                }
            }
        }
    }
}

impl<S: LockService + ?Sized> Lease<S> {
    /// Wraps a fresh grant in a lease. Its deadline watchdog starts when the lost signal is
    /// first asked for ([`lost`](Lease::lost), [`lost_token`](Lease::lost_token), a renewal).
    ///
    /// Must be called inside a Tokio runtime. Users get leases from
    /// [`LockServiceExt`](crate::LockServiceExt); backend authors rarely call this directly.
    pub fn new(service: Arc<S>, grant: Grant<S::Fencing>) -> Self {
        let timing =
            Timing { deadline: grant.requested_at() + grant.ttl().get(), ttl: grant.ttl(), requested: grant.ttl() };
        let shared = Arc::new(LeaseShared {
            service,
            grant,
            timing: Mutex::new(timing),
            changed: Notify::new(),
            lost: CancellationToken::new(),
            done: CancellationToken::new(),
            watching: AtomicBool::new(false),
        });
        Lease { shared, released: false }
    }

    /// The locked resource.
    pub fn key(&self) -> &ResourceKey {
        self.shared.grant.key()
    }

    /// The holder's owner token.
    pub fn token(&self) -> OwnerToken {
        self.shared.grant.token()
    }

    /// The underlying grant.
    pub fn grant(&self) -> &Grant<S::Fencing> {
        &self.shared.grant
    }

    /// The service that granted the lease.
    pub fn service(&self) -> &Arc<S> {
        &self.shared.service
    }

    /// The TTL of the latest successful acquisition or extension.
    pub fn ttl(&self) -> Ttl {
        self.shared.ttl()
    }

    /// When the lease expires by the local monotonic clock: the time the last acquire or
    /// extend request was *sent*, plus its TTL. The server's own expiry is no earlier.
    pub fn deadline(&self) -> Instant {
        self.shared.timing().deadline
    }

    /// The deadline minus a clock-drift margin ([`Ttl::drift_margin`]): finish or abandon
    /// protected work before this instant. Once the lease is lost it is the moment of loss
    /// at the latest.
    pub fn safe_until(&self) -> Instant {
        let t = self.shared.timing();
        t.deadline.checked_sub(t.ttl.drift_margin()).unwrap_or(t.deadline)
    }

    /// How long until [`safe_until`](Lease::safe_until); zero once lost or past it.
    pub fn time_left(&self) -> Duration {
        if self.is_lost() {
            return Duration::ZERO;
        }
        self.safe_until().saturating_duration_since(Instant::now())
    }

    /// Whether the lease is known to be lost (deadline passed, backend reported loss, or a
    /// renewal failed).
    pub fn is_lost(&self) -> bool {
        self.shared.check_lost();
        self.shared.lost.is_cancelled()
    }

    /// A future that completes when the lease is lost. It never completes after a release.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.shared.watch();
        self.shared.lost.clone().cancelled_owned()
    }

    /// A token cancelled when the lease is lost (a child token: cancelling it does not mark
    /// the lease lost).
    pub fn lost_token(&self) -> CancellationToken {
        self.shared.watch();
        self.shared.lost.child_token()
    }

    /// Extends the lease so it expires `ttl` from now.
    ///
    /// Refuses with [`ErrorKind::LeaseLost`] without contacting the backend once the lease is
    /// known to be lost; a [`ErrorKind::NotHolder`] from the backend marks it lost.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        self.shared.extend(Ttl::new(ttl)?).await
    }

    /// Releases the lock and waits for the backend to confirm.
    ///
    /// Returns [`ErrorKind::NotHolder`] if the lock was no longer ours (it expired and maybe
    /// was taken over): whatever the lease protected may have been done by someone else. A
    /// failed release is counted in `palisade_lock_release_failed_total`.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        self.shared.check_lost();
        self.shared.done.cancel();
        let backend = self.shared.service.backend();
        let span = tracing::debug_span!("lock.release", backend, key = %self.key());
        let released = self.shared.service.release(&self.shared.grant).instrument(span).await;
        if released.is_err() {
            metrics::record_release_failed(backend);
        }
        released
    }

    /// Keeps the lease alive while `progress` keeps moving: the incident's "extend only when a
    /// heartbeat proves forward progress; never renew on a timer alone".
    ///
    /// Every third of the TTL the renewal task compares `progress` with what it saw last time.
    /// If it moved, it extends the lease by the TTL last asked for (not a TTL the backend
    /// capped once), and the next check comes within a third of what was granted. If it
    /// stalled, it does not extend, so a hung handler loses the lease within one TTL. A failed extension is logged at error
    /// level, counted in `palisade_lock_renew_failed_total`, and fires the lost signal.
    ///
    /// The task stops when the returned [`Renewal`] is stopped or dropped, the lease is
    /// released, or the lease is lost.
    pub fn renew_on_progress(&self, progress: &Progress) -> Renewal {
        let every = (self.shared.requested_ttl().get() / 3).max(Duration::from_millis(1));
        self.renew_on_progress_every(progress, every)
    }

    /// [`renew_on_progress`](Lease::renew_on_progress) with an explicit check interval
    /// (it should be well under the TTL); a check still comes within a third of the TTL last
    /// granted when that is shorter.
    pub fn renew_on_progress_every(&self, progress: &Progress, every: Duration) -> Renewal {
        // A stalled renewal loses the lease at its deadline: that needs the watchdog.
        self.shared.watch();
        Renewal::start(Arc::clone(&self.shared), Some(progress.clone()), every)
    }

    /// Keeps the lease alive on a timer: extends it every third of its TTL for as long as the
    /// returned [`Renewal`] runs (stopped, dropped, the lease released or lost), whatever the
    /// holder does meanwhile. A failed extension fires the lost signal, as for
    /// [`renew_on_progress`](Lease::renew_on_progress).
    ///
    /// Not for users' work (that renews on progress, so a hung handler loses its lease): for
    /// the primitives' own locks, held while their runtime does a bounded series of lock
    /// operations (a read-write lock's gate while the writer drains the readers, a queued
    /// semaphore's head while it polls the permits, a leader's lead while its runtime runs).
    /// The task runs on the holder's runtime: a frozen process stops renewing.
    pub(crate) fn keep_alive(&self) -> Renewal {
        self.shared.watch();
        let every = (self.shared.requested_ttl().get() / 3).max(Duration::from_millis(1));
        Renewal::start(Arc::clone(&self.shared), None, every)
    }
}

impl<S: LockService + ?Sized> Lease<S> {
    /// The fence if the service issues them, `None` for an efficiency lock (for code generic over
    /// both; fenced code calls [`fence`](Lease::fence)).
    pub fn fence_if_any(&self) -> Option<Fence> {
        self.shared.grant.fence_if_any()
    }
}

impl<S: LockService<Fencing = Fenced> + ?Sized> Lease<S> {
    /// The fence issued with this grant: carry it into every write the lock protects.
    ///
    /// Only leases of fenced services have one. An efficiency lock's lease does not, so it
    /// cannot be used for a fenced write:
    ///
    /// ```compile_fail
    /// use palisade_core::{Lease, LockService, Unfenced};
    /// fn fence_of<S: LockService<Fencing = Unfenced>>(lease: &Lease<S>) {
    ///     let _ = lease.fence(); // no method `fence` on a lease of an unfenced service
    /// }
    /// ```
    pub fn fence(&self) -> Fence {
        self.shared.grant.fence()
    }

    /// The fence with the id of this grant: what a write presents to a store
    /// ([`FencedStore::apply`](crate::FencedStore::apply)), so the store can refuse the same
    /// fence from another grant (fencing rule 2).
    pub fn grant_fence(&self) -> crate::GrantFence {
        self.shared.grant.grant_fence()
    }
}

impl<S: LockService + ?Sized> Drop for Lease<S> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.shared.check_lost();
        self.shared.done.cancel();
        let shared = Arc::clone(&self.shared);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    if let Err(e) = shared.service.release(&shared.grant).await {
                        debug!(key = %shared.grant.key(), error = %e.report(), "release on drop failed");
                    }
                });
            }
            Err(_) => debug!(key = %self.key(), "lease dropped outside a runtime; it will expire at its TTL"),
        }
    }
}

impl<S: LockService + ?Sized> fmt::Debug for Lease<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("backend", &self.shared.service.backend())
            .field("grant", &self.shared.grant)
            .field("lost", &self.shared.lost.is_cancelled())
            .finish_non_exhaustive()
    }
}

/// A fenced lease gives its fence wherever a [`Fence`] is asked for (`store.update_row_fenced(…,
/// &lease, …)`); a lease of an efficiency lock has none, so it cannot be passed.
impl<S: LockService<Fencing = Fenced> + ?Sized> From<&Lease<S>> for Fence {
    fn from(lease: &Lease<S>) -> Fence {
        lease.fence()
    }
}

/// A fenced lease gives its fence and grant wherever a [`GrantFence`](crate::GrantFence) is
/// asked for (`store.update_item_fenced(update, &lease)`).
impl<S: LockService<Fencing = Fenced> + ?Sized> From<&Lease<S>> for crate::GrantFence {
    fn from(lease: &Lease<S>) -> crate::GrantFence {
        lease.grant_fence()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::{LockServiceExt, MemoryLockService};

    /// Issue 18: a lease nobody watches costs no task (the `Lease` path ran at 0.77× the
    /// trait level with a watchdog spawned per lease); asking for the lost signal starts one,
    /// and a loss nobody watched is still found when the lease is looked at.
    #[tokio::test(flavor = "current_thread")]
    async fn the_watchdog_starts_only_when_the_lost_signal_is_watched() {
        let locks = Arc::new(MemoryLockService::new());
        let key = ResourceKey::new("lazy", "watchdog").unwrap();
        let tasks = || tokio::runtime::Handle::current().metrics().num_alive_tasks();
        let before = tasks();
        let lease = locks.try_lock(&key, Duration::from_millis(30)).await.unwrap().unwrap();
        assert_eq!(tasks(), before, "a lease nobody watches spawned a task");
        assert!(!lease.is_lost());
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(lease.is_lost(), "the deadline passed unwatched, and looking at the lease did not see it");
        assert_eq!(lease.extend(Duration::from_secs(1)).await.unwrap_err().kind(), ErrorKind::LeaseLost);
        drop(lease);
        tokio::time::sleep(Duration::from_millis(10)).await; // the release the drop spawned
        let before = tasks();
        let watched = locks.try_lock(&key, Duration::from_millis(30)).await.unwrap().unwrap();
        let lost = watched.lost();
        assert_eq!(tasks(), before + 1, "asking for the lost signal starts the watchdog");
        tokio::time::timeout(Duration::from_millis(500), lost).await.unwrap();
        watched.release().await.unwrap_err(); // expired: NotHolder
    }
}
