//! A fenced counting semaphore on any fenced lock service: N permits, each a lock of its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{ErrorKind, Result};
use crate::gate;
use crate::service::timeout_error;
use crate::ttl::validate_wait;
use crate::{Error, Fenced, Lease, LockOptions, LockService, LockServiceExt, ResourceKey};

/// The most permits a [`Semaphore`] may have: each is a lock of its own, and a waiter tries
/// them all on every round.
pub const MAX_PERMITS: u32 = 1024;

/// A counting semaphore with `permits` permits on resource `key`, on any fenced lock service.
///
/// **How it works.** Permit `i` is the lock on its own **slot** resource, `key` with
/// `~permit-i` appended to its id ([`SUB_KEY_SEPARATOR`](crate::SUB_KEY_SEPARATOR): no user key
/// can name a slot, so a user's lock on `key.permit-0` is a lock of its own). Taking a permit takes the lock of a free slot (trying the
/// slots from a start drawn at random, so contenders spread out); at most `permits` slots are held at
/// once because each slot is a lock. Every guarantee of the lock service holds per slot: a
/// permit expires with its TTL, is extended and released like a lease, and fires its lost
/// signal.
///
/// **What the fence orders.** A permit is a [`Lease`] on its slot, and its fence is the slot's:
/// it orders the writes **of that slot**. A store judges a permit holder's writes against the
/// slot resource (`lease.key()`), so a holder paused past its TTL is refused once the next
/// holder of the same slot has written, exactly as a mutex holder is. Fences of different slots
/// are unrelated: up to `permits` holders write at once, each under its own slot, and no
/// store rule has to count them. Protect per-permit work with the permit's lease (a worker's
/// share of a job, its connection to a rate-limited API); data that all permit holders update
/// together needs a mutex, not a semaphore.
///
/// **Waiting** takes whichever slot is free first ([`LockService::acquire_any`]): on a service
/// that notifies releases ([`Waiting::Native`](crate::Waiting::Native) or
/// [`NativeFifo`](crate::Waiting::NativeFifo)) the release of any slot wakes the waiters at
/// once; on a polling service they poll every slot with backoff (2 ms doubling to 250 ms). No
/// order among waiters. [`queued`](Semaphore::queued) puts waiters in a queue first: the lock
/// on `key` with `~queue` appended, whose holder alone waits for the slots, so waiters are served in the queue
/// lock's order: **arrival order** on services that queue waiters
/// ([`Capabilities::fifo`](crate::Capabilities::fifo): etcd, ZooKeeper), at the cost of two
/// more lock operations per wait. [`try_acquire`](Semaphore::try_acquire) never queues. A
/// semaphore of 1 permit is a mutex on its slot.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use palisade_core::{LockOptions, MemoryLockService, ResourceKey, Semaphore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> palisade_core::Result<()> {
/// let locks = Arc::new(MemoryLockService::new());
/// let api = Semaphore::new(Arc::clone(&locks), ResourceKey::new("quota", "payments-api")?, 2)?;
/// let ttl = Duration::from_secs(30);
/// let a = api.try_acquire(ttl).await?.expect("2 permits free");
/// let b = api.try_acquire(ttl).await?.expect("1 permit free");
/// assert!(api.try_acquire(ttl).await?.is_none(), "both permits are held");
/// assert_ne!(a.key(), b.key(), "each permit is a slot of its own, with its own fence");
/// a.release().await?;
/// let c = api.acquire(LockOptions::ttl(ttl).wait(Duration::from_secs(1))).await?;
/// # c.release().await?; b.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Semaphore<S: LockService<Fencing = Fenced> + ?Sized> {
    service: Arc<S>,
    key: ResourceKey,
    slots: Vec<ResourceKey>,
    /// The waiters' queue lock, when [`queued`](Semaphore::queued).
    queue: Option<ResourceKey>,
    /// Where the next round over the slots starts: drawn once from the OS's randomness (so
    /// clients spread out), then moved on by one every round.
    next_start: Arc<AtomicUsize>,
}

impl<S: LockService<Fencing = Fenced> + ?Sized> Clone for Semaphore<S> {
    fn clone(&self) -> Self {
        Semaphore {
            service: Arc::clone(&self.service),
            key: self.key.clone(),
            slots: self.slots.clone(),
            queue: self.queue.clone(),
            next_start: Arc::clone(&self.next_start),
        }
    }
}

impl<S: LockService<Fencing = Fenced> + ?Sized> Semaphore<S> {
    /// A semaphore of `permits` permits (1 to [`MAX_PERMITS`]) on `key` (a user key, or a
    /// primitive's own: a read-write lock's reader slots are a semaphore). Every client that
    /// shares the semaphore must use the same `key` and the same `permits`. A count out of
    /// range is [`ErrorKind::InvalidArgument`]; slot keys that do not fit a [`ResourceKey`] (an
    /// id near the length limit) are [`ErrorKind::InvalidKey`].
    pub fn new(service: Arc<S>, key: ResourceKey, permits: u32) -> Result<Self> {
        if !(1..=MAX_PERMITS).contains(&permits) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                service.backend(),
                format!("a semaphore has 1 to {MAX_PERMITS} permits, not {permits}"),
            ));
        }
        let slots = (0..permits).map(|i| key.sub_key(&format!("permit-{i}"))).collect::<Result<Vec<_>>>()?;
        Ok(Semaphore { service, key, slots, queue: None, next_start: Arc::new(AtomicUsize::new(random_start())) })
    }

    /// The same semaphore with waiters served in order: [`acquire`](Semaphore::acquire) first
    /// takes its place in a queue (the lock on `key` with `~queue` appended), and only the head
    /// of the queue waits for the permit slots. Arrival order on a service that queues waiters
    /// (etcd, ZooKeeper); elsewhere the queue lock's own waiting order. Every waiter must use a
    /// queued semaphore for the order to hold. A key too long for the queue's key is
    /// [`ErrorKind::InvalidKey`].
    pub fn queued(mut self) -> Result<Self> {
        self.queue = Some(self.key.sub_key("queue")?);
        Ok(self)
    }

    /// The semaphore's resource.
    pub fn key(&self) -> &ResourceKey {
        &self.key
    }

    /// How many permits it has.
    pub fn permits(&self) -> u32 {
        u32::try_from(self.slots.len()).unwrap_or(MAX_PERMITS)
    }

    /// The waiters' queue lock when [`queued`](Semaphore::queued), `None` otherwise.
    pub fn queue(&self) -> Option<&ResourceKey> {
        self.queue.as_ref()
    }

    /// The slot resource of permit `i` (what a permit's writes are judged under).
    pub fn slot(&self, i: u32) -> Option<&ResourceKey> {
        self.slots.get(usize::try_from(i).ok()?)
    }

    /// Takes a free permit for `ttl`, without waiting; `Ok(None)` when all are held. The
    /// permit is a [`Lease`] on its slot: its fence, expiry, extension and release are the
    /// slot lock's.
    pub async fn try_acquire(&self, ttl: Duration) -> Result<Option<Lease<S>>> {
        let start = self.next_start.fetch_add(1, Ordering::Relaxed);
        for i in 0..self.slots.len() {
            let slot = &self.slots[start.wrapping_add(i) % self.slots.len()];
            if let Some(lease) = self.service.try_lock(slot, ttl).await? {
                return Ok(Some(lease));
            }
        }
        Ok(None)
    }

    /// Takes a permit for `options.ttl`, waiting up to `options.wait` for one to come free
    /// (woken by a release where the service notifies, polling the slots with backoff
    /// elsewhere; in the queue's order when [`queued`](Semaphore::queued));
    /// [`ErrorKind::Timeout`] if none does. A zero wait makes one round over the slots.
    pub async fn acquire(&self, options: LockOptions) -> Result<Lease<S>> {
        validate_wait(options.wait)?;
        let give_up = Instant::now() + options.wait;
        let Some(queue) = &self.queue else { return self.any_slot(options.ttl, options.wait).await };
        loop {
            let left = give_up.saturating_duration_since(Instant::now());
            // The head of the queue; the service's waiting order decides who is next.
            let head = self.service.lock(queue, LockOptions::ttl(options.ttl).wait(left)).await?;
            // Kept alive by time while it polls: one round over many slots may outlast the TTL.
            let held = gate::Held::new(&head, options.ttl);
            let polled = held.wait_for(give_up, |wait| self.any_slot(options.ttl, wait)).await;
            held.stop().await;
            let _ = head.release().await;
            match polled {
                Ok(Some(permit)) => return Ok(permit),
                // The queue's lock expired under us (a wait longer than its renewals): queue again.
                Ok(None) if Instant::now() < give_up => {}
                Ok(None) => return Err(timeout_error(self.service.backend(), &self.key, options.wait)),
                Err(e) if e.kind() == ErrorKind::Timeout => {
                    return Err(timeout_error(self.service.backend(), &self.key, options.wait));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Takes whichever slot is free first, waiting up to `wait`
    /// ([`LockService::acquire_any`]: woken by a release of any slot where the service
    /// notifies, polled elsewhere); a timeout names the semaphore.
    async fn any_slot(&self, ttl: Duration, wait: Duration) -> Result<Lease<S>> {
        let start = self.next_start.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let mut order = Vec::with_capacity(self.slots.len());
        order.extend_from_slice(&self.slots[start..]);
        order.extend_from_slice(&self.slots[..start]);
        crate::ext::lock_any(&self.service, &order, LockOptions::ttl(ttl).wait(wait)).await.map_err(|e| {
            if e.kind() == ErrorKind::Timeout { timeout_error(self.service.backend(), &self.key, wait) } else { e }
        })
    }
}

/// A start drawn from the OS's randomness (a failed draw starts at 0: fairness only).
fn random_start() -> usize {
    let mut seed = [0u8; 8];
    let _ = getrandom::fill(&mut seed);
    // Any value will do: the start is taken modulo the slot count.
    usize::try_from(u64::from_le_bytes(seed) >> 33).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryLockService;

    #[tokio::test]
    async fn permits_are_counted_slots_with_fences_of_their_own() {
        let locks = Arc::new(MemoryLockService::new());
        let sem = Semaphore::new(Arc::clone(&locks), ResourceKey::new("sem", "x").unwrap(), 3).unwrap();
        let ttl = Duration::from_secs(10);
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(sem.try_acquire(ttl).await.unwrap().unwrap());
        }
        assert!(sem.try_acquire(ttl).await.unwrap().is_none());
        let mut keys: Vec<_> = held.iter().map(|l| l.key().to_string()).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), 3, "three distinct slots");
        let err = sem.acquire(LockOptions::ttl(ttl).wait(Duration::from_millis(30))).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout);
        let freed = held.pop().unwrap();
        let (slot, fence) = (freed.key().clone(), freed.fence());
        freed.release().await.unwrap();
        let next = sem.acquire(LockOptions::ttl(ttl).wait(Duration::from_secs(1))).await.unwrap();
        assert_eq!(next.key(), &slot, "the freed slot");
        assert!(next.fence() > fence, "the slot's fence grows");
        for bad in [0, MAX_PERMITS + 1] {
            let e = Semaphore::new(Arc::clone(&locks), ResourceKey::new("sem", "y").unwrap(), bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        }
        let long = ResourceKey::new("sem", "z".repeat(crate::MAX_ID_LEN)).unwrap();
        assert_eq!(Semaphore::new(locks, long, 2).unwrap_err().kind(), ErrorKind::InvalidKey);
    }

    #[tokio::test]
    async fn a_release_wakes_the_permit_waiters() {
        let locks = Arc::new(MemoryLockService::new());
        let sem = Semaphore::new(Arc::clone(&locks), ResourceKey::new("sem", "wake").unwrap(), 2).unwrap();
        let ttl = Duration::from_secs(10);
        let mut handoffs = Vec::new();
        for _ in 0..5 {
            let (a, b) = (sem.try_acquire(ttl).await.unwrap().unwrap(), sem.try_acquire(ttl).await.unwrap().unwrap());
            let waiter = {
                let sem = sem.clone();
                tokio::spawn(async move {
                    let permit = sem.acquire(LockOptions::ttl(ttl).wait(Duration::from_secs(5))).await;
                    (permit, Instant::now())
                })
            };
            // Long enough for a polling waiter's backoff to reach its 250 ms ceiling.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let slot = b.key().clone();
            b.release().await.unwrap();
            let released = Instant::now();
            let (permit, got_at) = waiter.await.unwrap();
            let permit = permit.unwrap();
            assert_eq!(permit.key(), &slot, "the released slot");
            handoffs.push(got_at - released);
            permit.release().await.unwrap();
            a.release().await.unwrap();
        }
        handoffs.sort();
        assert!(
            handoffs[2] < Duration::from_millis(20),
            "handoffs (sorted) {handoffs:?}: the waiter polled, nobody woke it"
        );
    }

    #[tokio::test]
    async fn a_queued_semaphore_serves_its_waiters_behind_the_queue_lock() {
        let locks = Arc::new(MemoryLockService::new());
        let sem =
            Semaphore::new(Arc::clone(&locks), ResourceKey::new("sem", "q").unwrap(), 1).unwrap().queued().unwrap();
        let ttl = Duration::from_secs(10);
        let held = sem.try_acquire(ttl).await.unwrap().unwrap();
        let err = sem.acquire(LockOptions::ttl(ttl).wait(Duration::from_millis(30))).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout);
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire(LockOptions::ttl(ttl).wait(Duration::from_secs(5))).await })
        };
        tokio::time::sleep(Duration::from_millis(30)).await;
        let queue = sem.queue().unwrap().clone();
        assert!(locks.try_lock(&queue, ttl).await.unwrap().is_none(), "the waiter heads the queue");
        held.release().await.unwrap();
        let next = waiter.await.unwrap().unwrap();
        assert!(locks.try_lock(&queue, ttl).await.unwrap().is_some(), "the queue is left once served");
        next.release().await.unwrap();
    }
}
