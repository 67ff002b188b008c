use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::{Error, ErrorKind, Result};
use crate::spi::{
    AttemptOutcome, distinct_keys, first_granted, first_of, timeout_of_any, wait_for_any_release, wait_for_release,
};
use crate::{
    AllOrNone, Capabilities, Deployment, Fence, FenceSource, Fenced, Grant, GrantId, HolderView, InspectLocks, Listing,
    LockService, LockView, MultiAcquire, OwnerToken, ResourceKey, Ttl, Waiters, Waiting,
};

const BACKEND: &str = "memory";

/// An in-process lock service: a mutex-protected table of holders and per-resource fence
/// counters.
///
/// Fences are gap-free per resource and survive release and expiry, but not the process.
/// Waiters are woken on release (not FIFO). Share one instance (behind an `Arc`) among the
/// tasks that contend.
#[derive(Debug, Default)]
pub struct MemoryLockService {
    slots: Mutex<HashMap<ResourceKey, Slot>>,
}

#[derive(Debug, Default)]
struct Slot {
    holder: Option<Holder>,
    last_fence: u64,
    released: Arc<Notify>,
}

#[derive(Debug, Clone, Copy)]
struct Holder {
    token: OwnerToken,
    /// The fence issued with the grant (the counter may have moved since: a repair, a rewind).
    fence: Fence,
    expires: Instant,
}

enum Attempt {
    Granted(Grant<Fenced>),
    Held { until: Instant },
}

impl MemoryLockService {
    /// An empty service.
    pub fn new() -> Self {
        MemoryLockService::default()
    }

    /// Forgets every fence counter, as a Redis restarted without persistence would: the next
    /// grants start again from 1 (for fence-regression tests).
    pub fn forget_fences(&self) {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        for slot in slots.values_mut() {
            slot.last_fence = 0;
        }
    }

    /// Drops `key`'s holder, as an operator deleting the lock would: the holder is not told,
    /// and its next extend finds the lock gone (for lost-signal tests).
    pub fn break_lock(&self, key: &ResourceKey) {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = slots.get_mut(key) {
            slot.holder = None;
            slot.released.notify_waiters();
        }
    }

    /// Moves `key`'s counter back so the next grant gets `last + 1`, as a failover to a lagging
    /// replica or an `appendfsync everysec` crash would: the counter loses its tail, and fences
    /// already issued are issued again (for fence-regression tests).
    pub fn rewind_fence(&self, key: &ResourceKey, last: Fence) {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        slots.entry(key.clone()).or_default().last_fence = last.get();
    }

    /// The last fence issued for `key`, if any (for tests and diagnostics).
    pub fn last_fence(&self, key: &ResourceKey) -> Option<Fence> {
        let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        slots.get(key).filter(|s| s.last_fence > 0).map(|s| Fence::new(s.last_fence))
    }

    fn released_notify(&self, key: &ResourceKey) -> Arc<Notify> {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(&slots.entry(key.clone()).or_default().released)
    }

    fn attempt(&self, key: &ResourceKey, ttl: Ttl) -> Result<Attempt> {
        let requested_at = Instant::now();
        let token = OwnerToken::generate()?;
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = slots.entry(key.clone()).or_default();
        let now = Instant::now();
        if let Some(holder) = slot.holder.filter(|h| h.expires > now) {
            return Ok(Attempt::Held { until: holder.expires });
        }
        let fence = slot
            .last_fence
            .checked_add(1)
            .ok_or_else(|| Error::new(ErrorKind::Backend, BACKEND, "fence counter exhausted"))?;
        slot.last_fence = fence;
        slot.holder = Some(Holder { token, fence: Fence::new(fence), expires: now + ttl.get() });
        Ok(Attempt::Granted(Grant::new(key.clone(), token, Fence::new(fence), ttl, requested_at)))
    }

    /// Every key of `keys` in one step under the mutex, or none: the first key found held.
    fn attempt_all(&self, keys: &[ResourceKey], ttl: Ttl) -> Result<AllOrNone<Grant<Fenced>>> {
        distinct_keys(BACKEND, keys)?;
        let requested_at = Instant::now();
        let tokens = keys.iter().map(|_| OwnerToken::generate()).collect::<Result<Vec<_>>>()?;
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let held = |key: &ResourceKey| slots.get(key).and_then(|s| s.holder).is_some_and(|h| h.expires > now);
        if let Some(i) = keys.iter().position(held) {
            return Ok(AllOrNone::Held(i));
        }
        if keys.iter().any(|key| slots.get(key).is_some_and(|s| s.last_fence == u64::MAX)) {
            return Err(Error::new(ErrorKind::Backend, BACKEND, "fence counter exhausted"));
        }
        let grants = keys
            .iter()
            .zip(tokens)
            .map(|(key, token)| {
                let slot = slots.entry(key.clone()).or_default();
                slot.last_fence += 1;
                slot.holder = Some(Holder { token, fence: Fence::new(slot.last_fence), expires: now + ttl.get() });
                Grant::new(key.clone(), token, Fence::new(slot.last_fence), ttl, requested_at)
            })
            .collect();
        Ok(AllOrNone::Granted(grants))
    }

    /// [`attempt`](Self::attempt) as a waiting loop reads it: held for how much longer.
    fn outcome(&self, key: &ResourceKey, ttl: Ttl) -> Result<AttemptOutcome<Grant<Fenced>>> {
        Ok(match self.attempt(key, ttl)? {
            Attempt::Granted(grant) => AttemptOutcome::Granted(grant),
            Attempt::Held { until } => {
                AttemptOutcome::Held { remaining: until.saturating_duration_since(Instant::now()) }
            }
        })
    }

    fn with_own_slot<T>(&self, grant: &Grant<Fenced>, f: impl FnOnce(&mut Slot, Instant) -> T) -> Result<T> {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        match slots.get_mut(grant.key()) {
            Some(slot) if slot.holder.is_some_and(|h| h.token == grant.token() && h.expires > now) => Ok(f(slot, now)),
            _ => Err(Error::new(
                ErrorKind::NotHolder,
                BACKEND,
                format!("lock {} is not held by this owner token", grant.key()),
            )),
        }
    }
}

#[async_trait]
impl LockService for MemoryLockService {
    type Fencing = Fenced;

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fence_source: FenceSource::Counter,
            fences_survive_release: true,
            fences_survive_restart: false,
            gap_free: true,
            waiting: Waiting::Native,
            deployment: Deployment::InProcess,
            multi_acquire: MultiAcquire::OneRequest,
            ..Capabilities::default()
        }
    }

    async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Fenced>>> {
        match self.attempt(key, ttl)? {
            Attempt::Granted(grant) => Ok(Some(grant)),
            Attempt::Held { .. } => Ok(None),
        }
    }

    async fn acquire(&self, key: &ResourceKey, ttl: Ttl, wait: Duration) -> Result<Grant<Fenced>> {
        // No notification is ever lost in one process, so no polling bound is needed.
        wait_for_release(
            BACKEND,
            key,
            wait,
            || self.released_notify(key),
            None,
            || std::future::ready(self.outcome(key, ttl)),
        )
        .await
    }

    async fn try_acquire_all(&self, keys: &[ResourceKey], ttl: Ttl) -> Result<AllOrNone<Grant<Fenced>>> {
        self.attempt_all(keys, ttl)
    }

    async fn acquire_any(&self, keys: &[ResourceKey], ttl: Ttl, wait: Duration) -> Result<Grant<Fenced>> {
        let first = first_of(BACKEND, keys)?;
        wait_for_any_release(
            BACKEND,
            first,
            wait,
            || keys.iter().map(|key| self.released_notify(key)).collect::<Vec<_>>(),
            None,
            || first_granted(keys.len(), |i| std::future::ready(self.outcome(&keys[i], ttl))),
        )
        .await
        .map_err(|e| timeout_of_any(e, BACKEND, keys, wait))
    }

    async fn extend(&self, grant: &Grant<Fenced>, ttl: Ttl) -> Result<Ttl> {
        self.with_own_slot(grant, |slot, now| {
            slot.holder = Some(Holder { token: grant.token(), fence: grant.fence(), expires: now + ttl.get() });
        })
        .map(|()| ttl)
    }

    async fn release(&self, grant: &Grant<Fenced>) -> Result<()> {
        self.with_own_slot(grant, |slot, _| {
            slot.holder = None;
            slot.released.notify_waiters();
        })
    }

    async fn advance_fence(&self, key: &ResourceKey, floor: Fence) -> Result<()> {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = slots.entry(key.clone()).or_default();
        slot.last_fence = slot.last_fence.max(floor.get());
        Ok(())
    }
}

#[async_trait]
impl InspectLocks for MemoryLockService {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn resources(&self, prefix: &str) -> Result<Listing<ResourceKey>> {
        let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let mut keys: Vec<ResourceKey> = slots.keys().filter(|k| k.to_string().starts_with(prefix)).cloned().collect();
        keys.sort_by_cached_key(ToString::to_string);
        Ok(Listing::of(keys))
    }

    async fn lock_view(&self, key: &ResourceKey) -> Result<LockView> {
        let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let view = LockView::free(key.clone()).with_waiters(Waiters::Unknown);
        let Some(slot) = slots.get(key) else { return Ok(view.with_counter(Some(Fence::new(0)))) };
        let now = Instant::now();
        let view = view.with_counter(Some(Fence::new(slot.last_fence)));
        Ok(match slot.holder {
            Some(h) if h.expires > now => view.held_by(HolderView::new(
                GrantId::of(&h.token),
                Some(h.fence),
                Some(h.expires.saturating_duration_since(now)),
            )),
            _ => view,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ResourceKey {
        ResourceKey::new("alloc", "WH-01").unwrap()
    }

    #[tokio::test]
    async fn grants_exclusively_with_gap_free_fences() {
        let svc = MemoryLockService::new();
        let ttl = Ttl::from_millis(10_000).unwrap();
        let g1 = svc.try_acquire(&key(), ttl).await.unwrap().unwrap();
        assert!(svc.try_acquire(&key(), ttl).await.unwrap().is_none());
        svc.release(&g1).await.unwrap();
        let g2 = svc.try_acquire(&key(), ttl).await.unwrap().unwrap();
        assert_eq!(g1.fence().get() + 1, g2.fence().get());
        assert_eq!(svc.last_fence(&key()), Some(g2.fence()));
    }

    #[tokio::test]
    async fn the_view_shows_the_holder_then_the_free_lock_with_its_counter() {
        let svc = MemoryLockService::new();
        let other = ResourceKey::new("audit", "x").unwrap();
        assert_eq!(svc.lock_view(&key()).await.unwrap(), LockView::free(key()).with_counter(Some(Fence::new(0))));
        let g = svc.try_acquire(&key(), Ttl::from_millis(10_000).unwrap()).await.unwrap().unwrap();
        let _ = svc.try_acquire(&other, Ttl::from_millis(10_000).unwrap()).await.unwrap().unwrap();
        let view = svc.lock_view(&key()).await.unwrap();
        let holder = view.holder.unwrap();
        assert_eq!((holder.grant, holder.fence, view.fence_counter), (g.grant_id(), Some(g.fence()), Some(g.fence())));
        assert!(holder.expires_in.is_some_and(|d| d <= Duration::from_secs(10)));
        let listed = svc.resources("alloc:").await.unwrap();
        assert_eq!((listed.entries, listed.truncated), (vec![key()], false));
        assert_eq!(svc.resources("").await.unwrap().entries, vec![key(), other]);
        // A repair moves the counter, not the holder's fence.
        svc.advance_fence(&key(), Fence::new(50)).await.unwrap();
        let view = svc.lock_view(&key()).await.unwrap();
        assert_eq!((view.holder.map(|h| h.fence), view.fence_counter), (Some(Some(g.fence())), Some(Fence::new(50))));
        svc.release(&g).await.unwrap();
        let view = svc.lock_view(&key()).await.unwrap();
        assert_eq!((view.holder, view.fence_counter), (None, Some(Fence::new(50))));
    }

    #[tokio::test]
    async fn only_the_owner_releases_or_extends() {
        let svc = MemoryLockService::new();
        let ttl = Ttl::from_millis(10_000).unwrap();
        let mine = svc.try_acquire(&key(), ttl).await.unwrap().unwrap();
        let forged = Grant::<Fenced>::new(key(), OwnerToken::generate().unwrap(), mine.fence(), ttl, Instant::now());
        assert_eq!(svc.release(&forged).await.unwrap_err().kind(), ErrorKind::NotHolder);
        assert_eq!(svc.extend(&forged, ttl).await.unwrap_err().kind(), ErrorKind::NotHolder);
        svc.release(&mine).await.unwrap();
        assert_eq!(svc.release(&mine).await.unwrap_err().kind(), ErrorKind::NotHolder);
    }

    #[tokio::test]
    async fn expiry_lets_another_in_and_old_holder_cannot_extend() {
        let svc = MemoryLockService::new();
        let short = Ttl::from_millis(20).unwrap();
        let old = svc.try_acquire(&key(), short).await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        let new = svc.try_acquire(&key(), short).await.unwrap().unwrap();
        assert!(new.fence() > old.fence());
        assert_eq!(svc.extend(&old, short).await.unwrap_err().kind(), ErrorKind::NotHolder);
    }

    #[tokio::test]
    async fn waiters_wake_on_release_and_time_out_otherwise() {
        let svc = Arc::new(MemoryLockService::new());
        let ttl = Ttl::from_millis(10_000).unwrap();
        let held = svc.try_acquire(&key(), ttl).await.unwrap().unwrap();
        let waiter = {
            let svc = Arc::clone(&svc);
            tokio::spawn(async move { svc.acquire(&key(), ttl, Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        svc.release(&held).await.unwrap();
        let got = waiter.await.unwrap().unwrap();
        assert!(got.fence() > held.fence());
        let err = svc.acquire(&key(), ttl, Duration::from_millis(20)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout);
        assert!(err.is_retryable());
        // A zero wait: one attempt (the lock is held by `got`).
        let err = svc.acquire(&key(), ttl, Duration::ZERO).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout);
    }
}
