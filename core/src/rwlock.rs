//! A fenced read-write lock on any fenced lock service: many readers or one writer, one fence
//! sequence for both.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{ErrorKind, Result};
use crate::gate;
use crate::service::timeout_error;
use crate::ttl::validate_wait;
use crate::{
    Error, Fence, Fenced, FencedStore, FencedStoreExt, Lease, LockOptions, LockService, LockServiceExt, ResourceKey,
    Semaphore, WriteBatch,
};

/// A read-write lock on resource `key`: up to `max_readers` readers at once, or one writer.
///
/// **How it works.** Three kinds of lock on the lock service, and one store:
/// - the **gate**, the lock on `key` itself. A writer holds it for as long as it writes; a
///   reader holds it only for the moment it enters. Every entry, read or write, takes one
///   grant of the gate, so readers and writers draw their fences from **one sequence**, in
///   the order they entered: the fence is the entry's **generation**.
/// - `max_readers` **reader slots** (a [`Semaphore`] on `key` with `~rw-read` appended, a
///   key no user can name: [`SUB_KEY_SEPARATOR`](crate::SUB_KEY_SEPARATOR)): a
///   reader holds a slot for as long as it reads.
/// - A writer, once it holds the gate, takes and releases every reader slot in turn: it waits
///   for the readers inside to leave, and none can enter, as entering needs the gate. A
///   reader confirms, after taking its slot, that it still holds the gate (an extension of the
///   gate's grant, refused once a writer took the gate); otherwise it leaves and enters again.
///
/// **Writers are not starved.** Readers hold the gate only while they enter, never while they
/// read, so a waiting writer competes with entering readers alone, never with readers that
/// keep overlapping; once it has the gate no new reader enters and the readers inside drain.
/// Who gets the gate next is the lock service's waiting order: arrival order on services that
/// queue ([`Waiting::NativeFifo`](crate::Waiting::NativeFifo): etcd, ZooKeeper), otherwise
/// whoever asks first after a release.
///
/// **What the fence orders.** Every entry records its generation in `store` before it returns:
/// a reader with a fenced write of nothing under `key` (it raises the watermark), a writer with
/// a fenced write of [`RwLock::record`]. Then:
/// - a writer's writes are judged under `key` like a mutex holder's (the writer's lease is the
///   gate's): a writer paused past its TTL is refused with `StaleFence` as soon as any newer
///   generation entered, **reader or writer**, even before that one wrote anything;
/// - a reader's [`ReadLease::check`] compares its generation with the last writer's: it is
///   refused with `StaleFence` once a writer entered after it (the data it read may have
///   changed), which is how a reader paused past its TTL learns it.
///
/// Readers take fences too: concurrent readers hold different generations, and the watermark of
/// `key` is the newest entry's. A reader never writes under `key` (a read lock protects
/// reading); what it writes elsewhere takes a lock of its own.
///
/// Cost: a read entry is 4 lock operations (gate, slot, confirm, gate release) and one store
/// write; a write entry is 2 + 2 × `max_readers` lock operations and one store write, plus one
/// extension of the gate per third of its TTL the entry lasts (the gate is renewed on a timer
/// while the writer drains the slots, so a drain longer than the TTL keeps it). Every
/// client of the lock must use the same `key`, store and `max_readers`, and take `key` only
/// through the `RwLock`.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use palisade_core::{
///     ErrorKind, FencedStoreExt, LockOptions, MemoryFencedStore, MemoryLockService, ResourceKey, RwLock,
///     WriteBatch,
/// };
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> palisade_core::Result<()> {
/// let locks = Arc::new(MemoryLockService::new());
/// let store = Arc::new(MemoryFencedStore::new());
/// let prices = RwLock::new(locks, store.clone(), ResourceKey::new("catalog", "prices")?, 8)?;
/// let opts = LockOptions::ttl(Duration::from_secs(30)).wait(Duration::from_secs(5));
///
/// let writer = prices.write(opts).await?;
/// store.write(&writer, &WriteBatch::new().put("price/sku-1", b"9.99".to_vec())).await?;
/// writer.release().await?;
///
/// let (r1, r2) = (prices.read(opts).await?, prices.read(opts).await?); // readers share
/// assert!(r2.generation() > r1.generation());
/// r1.check().await?; // no writer entered since r1 did
/// let busy = prices.write(opts.wait(Duration::from_millis(50))).await.unwrap_err();
/// assert_eq!(busy.kind(), ErrorKind::Timeout, "readers are inside");
/// # r1.release().await?; r2.release().await?;
/// # Ok(()) }
/// ```
pub struct RwLock<S: LockService<Fencing = Fenced> + ?Sized> {
    service: Arc<S>,
    store: Arc<dyn FencedStore>,
    key: ResourceKey,
    readers: Semaphore<S>,
}

impl<S: LockService<Fencing = Fenced> + ?Sized> std::fmt::Debug for RwLock<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RwLock")
            .field("key", &self.key)
            .field("max_readers", &self.readers.permits())
            .field("store", &self.store.backend())
            .finish_non_exhaustive()
    }
}

impl<S: LockService<Fencing = Fenced> + ?Sized> Clone for RwLock<S> {
    fn clone(&self) -> Self {
        RwLock {
            service: Arc::clone(&self.service),
            store: Arc::clone(&self.store),
            key: self.key.clone(),
            readers: self.readers.clone(),
        }
    }
}

impl<S: LockService<Fencing = Fenced> + ?Sized> RwLock<S> {
    /// A read-write lock on `key` for up to `max_readers` readers at once (1 to
    /// [`MAX_PERMITS`](crate::MAX_PERMITS)), recording generations in `store`. A count out of
    /// range is [`ErrorKind::InvalidArgument`]; a key too long for its slot keys is
    /// [`ErrorKind::InvalidKey`].
    pub fn new(service: Arc<S>, store: Arc<dyn FencedStore>, key: ResourceKey, max_readers: u32) -> Result<Self> {
        let slots = key.sub_key("rw-read")?;
        let readers = Semaphore::new(Arc::clone(&service), slots, max_readers)?;
        Ok(RwLock { service, store, key, readers })
    }

    /// The lock's resource: the gate, and what writers' writes are judged under.
    pub fn key(&self) -> &ResourceKey {
        &self.key
    }

    /// How many readers may read at once.
    pub fn max_readers(&self) -> u32 {
        self.readers.permits()
    }

    /// The store record every writer's entry writes under its fence (the last writer's
    /// generation, which [`ReadLease::check`] compares with).
    pub fn record(&self) -> String {
        format!("palisade/rwlock/{}", self.key)
    }

    /// Enters as the writer for `options.ttl`, waiting up to `options.wait` (zero: one attempt)
    /// for the gate and for the readers inside to leave; [`ErrorKind::Timeout`] otherwise.
    ///
    /// The result is the gate's lease: write under it as under a mutex's
    /// ([`FencedStoreExt::write`]); extend and release it the same way. Before it returns, the
    /// entry is recorded in the store, so every older writer is refused from then on.
    pub async fn write(&self, options: LockOptions) -> Result<Lease<S>> {
        validate_wait(options.wait)?;
        let give_up = Instant::now() + options.wait;
        loop {
            let gate = self.gate(options, give_up).await?;
            match self.enter_as_writer(&gate, options.ttl, give_up).await {
                Ok(true) => return Ok(gate),
                Ok(false) => {
                    let _ = gate.release().await;
                    self.retry_or_give_up(options, give_up)?;
                }
                Err(e) => {
                    let _ = gate.release().await;
                    return Err(self.as_timeout(e, options));
                }
            }
        }
    }

    /// Enters as a reader for `options.ttl`, waiting up to `options.wait` (zero: one attempt)
    /// for the gate (a writer holds it while it writes) and for a free reader slot;
    /// [`ErrorKind::Timeout`] otherwise.
    pub async fn read(&self, options: LockOptions) -> Result<ReadLease<S>> {
        validate_wait(options.wait)?;
        let give_up = Instant::now() + options.wait;
        loop {
            let gate = self.gate(options, give_up).await?;
            let entered = self.enter_as_reader(&gate, options.ttl, give_up).await;
            let generation = gate.fence();
            // The gate is held only for the entry.
            let _ = gate.release().await;
            match entered {
                Ok(Some(slot)) => {
                    return Ok(ReadLease {
                        slot,
                        generation,
                        key: self.key.clone(),
                        record: self.record(),
                        store: Arc::clone(&self.store),
                    });
                }
                Ok(None) => self.retry_or_give_up(options, give_up)?,
                Err(e) => return Err(self.as_timeout(e, options)),
            }
        }
    }

    async fn gate(&self, options: LockOptions, give_up: Instant) -> Result<Lease<S>> {
        let left = give_up.saturating_duration_since(Instant::now());
        self.service.lock(&self.key, LockOptions::ttl(options.ttl).wait(left)).await
    }

    /// Drains the readers and records the entry; `Ok(false)` when the gate was lost meanwhile.
    async fn enter_as_writer(&self, gate: &Lease<S>, ttl: Duration, give_up: Instant) -> Result<bool> {
        // Kept alive by time while the slots drain: 2 × max_readers operations may well
        // outlast the TTL even when none of them waits.
        let held = gate::Held::new(gate, ttl);
        for i in 0..self.readers.permits() {
            let Some(slot) = self.readers.slot(i) else { continue };
            let taken =
                held.wait_for(give_up, |wait| self.service.lock(slot, LockOptions::ttl(ttl).wait(wait))).await?;
            let Some(drained) = taken else { return Ok(false) };
            // Released at once: no reader can enter while the gate is ours.
            let _ = drained.release().await;
        }
        if !held.confirm().await? {
            return Ok(false);
        }
        let entry = WriteBatch::new().put(self.record(), gate.fence().get().to_string().into_bytes());
        match self.store.write(gate, &entry).await {
            Ok(()) => Ok(true),
            // A newer generation recorded itself: the gate was taken from under us.
            Err(e) if e.stale_fence_details().is_some() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Takes a reader slot, confirms the gate, records the entry; `Ok(None)` when the gate was
    /// lost meanwhile (a writer may have drained the slots before this reader took its own).
    async fn enter_as_reader(&self, gate: &Lease<S>, ttl: Duration, give_up: Instant) -> Result<Option<Lease<S>>> {
        let held = gate::Held::new(gate, ttl);
        let taken = held.wait_for(give_up, |wait| self.readers.acquire(LockOptions::ttl(ttl).wait(wait))).await?;
        let Some(slot) = taken else { return Ok(None) };
        let recorded = match held.confirm().await {
            Ok(true) => self.store.write(gate, &WriteBatch::new()).await.map(|()| true),
            other => other,
        };
        match recorded {
            Ok(true) => Ok(Some(slot)),
            Ok(false) => {
                let _ = slot.release().await;
                Ok(None)
            }
            Err(e) if e.stale_fence_details().is_some() => {
                let _ = slot.release().await;
                Ok(None)
            }
            Err(e) => {
                let _ = slot.release().await;
                Err(e)
            }
        }
    }

    fn retry_or_give_up(&self, options: LockOptions, give_up: Instant) -> Result<()> {
        if Instant::now() >= give_up {
            return Err(timeout_error(self.service.backend(), &self.key, options.wait));
        }
        Ok(())
    }

    /// A timeout waiting for a slot is the lock's timeout.
    fn as_timeout(&self, e: Error, options: LockOptions) -> Error {
        if e.kind() == ErrorKind::Timeout { timeout_error(self.service.backend(), &self.key, options.wait) } else { e }
    }
}

/// A reader's hold on a [`RwLock`]: its reader slot's lease and its generation.
pub struct ReadLease<S: LockService<Fencing = Fenced> + ?Sized> {
    slot: Lease<S>,
    generation: Fence,
    key: ResourceKey,
    record: String,
    store: Arc<dyn FencedStore>,
}

impl<S: LockService<Fencing = Fenced> + ?Sized> std::fmt::Debug for ReadLease<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadLease")
            .field("key", &self.key)
            .field("generation", &self.generation)
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

impl<S: LockService<Fencing = Fenced> + ?Sized> ReadLease<S> {
    /// The reader's generation: the fence of the gate grant it entered with, from the same
    /// sequence as writers' fences.
    pub fn generation(&self) -> Fence {
        self.generation
    }

    /// The read-write lock's resource.
    pub fn key(&self) -> &ResourceKey {
        &self.key
    }

    /// Whether the data may still be read as this reader found it: `Ok(())` when no writer
    /// entered after this reader (the last writer's recorded generation is older), otherwise
    /// [`ErrorKind::StaleFence`] with the reader's generation and the newer writer's. The
    /// store is the judge: a reader paused past its TTL while a writer entered is refused
    /// whatever its clock says. `Ok` holds for the moment of the read; check after reading to
    /// know that what was read was not being rewritten.
    pub async fn check(&self) -> Result<()> {
        let last_writer = self.store.read(&self.record).await?.and_then(|r| r.fence);
        match last_writer {
            Some(writer) if writer > self.generation => Err(Error::new(
                ErrorKind::StaleFence { presented: self.generation, current: writer },
                self.store.backend(),
                format!("read lock on {} is stale: a writer entered after this reader", self.key),
            )),
            _ => Ok(()),
        }
    }

    /// The reader slot's lease (its TTL, its lost signal).
    pub fn slot(&self) -> &Lease<S> {
        &self.slot
    }

    /// When the read lock may have expired, by the local clock (a hint; [`check`](Self::check)
    /// is the judge).
    pub fn safe_until(&self) -> Instant {
        self.slot.safe_until()
    }

    /// Whether the read lock is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.slot.is_lost()
    }

    /// Resolves when the read lock is lost.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.slot.lost()
    }

    /// Extends the read lock so it expires `ttl` from now (as [`Lease::extend`]).
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        self.slot.extend(ttl).await
    }

    /// Leaves: releases the reader slot (as [`Lease::release`]).
    pub async fn release(self) -> Result<()> {
        self.slot.release().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryFencedStore, MemoryLockService};

    fn opts(ttl_ms: u64, wait_ms: u64) -> LockOptions {
        LockOptions::ttl(Duration::from_millis(ttl_ms)).wait(Duration::from_millis(wait_ms))
    }

    #[tokio::test]
    async fn readers_share_writers_exclude_and_generations_order_both() {
        let locks = Arc::new(MemoryLockService::new());
        let store = Arc::new(MemoryFencedStore::new());
        let rw = RwLock::new(locks, store.clone(), ResourceKey::new("rw", "t").unwrap(), 2).unwrap();
        let (r1, r2) = (rw.read(opts(5000, 100)).await.unwrap(), rw.read(opts(5000, 100)).await.unwrap());
        assert_eq!(rw.read(opts(5000, 30)).await.unwrap_err().kind(), ErrorKind::Timeout, "2 readers at most");
        assert_eq!(rw.write(opts(5000, 30)).await.unwrap_err().kind(), ErrorKind::Timeout, "readers inside");
        r1.release().await.unwrap();
        let writer = {
            let rw = rw.clone();
            tokio::spawn(async move { rw.write(opts(5000, 2000)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            rw.read(opts(5000, 30)).await.unwrap_err().kind(),
            ErrorKind::Timeout,
            "a waiting writer holds the gate: no new reader enters"
        );
        r2.check().await.unwrap();
        let r2_generation = r2.generation();
        r2.release().await.unwrap();
        let writer = writer.await.unwrap().unwrap();
        assert!(writer.fence() > r2_generation);
        let late = rw.read(opts(5000, 2000));
        tokio::pin!(late);
        assert!(tokio::time::timeout(Duration::from_millis(50), &mut late).await.is_err(), "the writer excludes");
        writer.release().await.unwrap();
        let r3 = late.await.unwrap();
        r3.check().await.unwrap();
        r3.release().await.unwrap();
        for bad in [0, crate::MAX_PERMITS + 1] {
            let e = RwLock::new(Arc::new(MemoryLockService::new()), store.clone(), rw.key().clone(), bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        }
    }

    #[tokio::test]
    async fn stale_writers_and_readers_are_refused_by_the_store() {
        let locks = Arc::new(MemoryLockService::new());
        let store = Arc::new(MemoryFencedStore::new());
        let rw = RwLock::new(locks, store.clone(), ResourceKey::new("rw", "s").unwrap(), 4).unwrap();
        let w1 = rw.write(opts(50, 100)).await.unwrap();
        store.write(&w1, &WriteBatch::new().put("rw-data", b"1".to_vec())).await.unwrap();
        tokio::time::sleep(Duration::from_millis(80)).await;
        // A reader enters after W1's TTL: W1 is refused before anyone else wrote data.
        let r = rw.read(opts(50, 1000)).await.unwrap();
        let late = store.write(&w1, &WriteBatch::new().put("rw-data", b"stale".to_vec())).await.unwrap_err();
        assert_eq!(late.stale_fence_details(), Some((w1.fence(), r.generation())));
        // The reader pauses past its TTL; a writer enters: the reader's check is refused.
        tokio::time::sleep(Duration::from_millis(80)).await;
        let w2 = rw.write(opts(5000, 1000)).await.unwrap();
        assert_eq!(r.check().await.unwrap_err().stale_fence_details(), Some((r.generation(), w2.fence())));
        assert_eq!(store.read("rw-data").await.unwrap().unwrap().value, b"1");
        w2.release().await.unwrap();
    }
}
