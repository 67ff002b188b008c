//! A deliberately slow lock service: a decorator that adds a fixed latency to every operation
//! of the real service it wraps.
//!
//! A lock service is fast on a developer's loopback and slow in production (a remote region, a
//! loaded cluster, a slow fsync). Code that does many lock operations in a row — a read-write
//! lock's writer drains `max_readers` reader slots, a queued semaphore's head polls every
//! permit slot — must keep working when each of them costs milliseconds. [`SlowLockService`]
//! makes that cost real without touching the network: the operations still reach the real
//! server, each one a fixed time later.
//!
//! Backend authors use it as the suite does (see
//! [`primitives_enter_over_a_slow_service`](crate::primitives::primitives_enter_over_a_slow_service)):
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use palisade_conformance::latency::SlowLockService;
//! use palisade_core::{LockServiceExt, MemoryLockService, ResourceKey};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> palisade_core::Result<()> {
//! let slow = Arc::new(SlowLockService::new(Arc::new(MemoryLockService::new()), Duration::from_millis(5)));
//! let started = tokio::time::Instant::now();
//! let lease = slow.try_lock(&ResourceKey::new("demo", "slow")?, Duration::from_secs(1)).await?.expect("free");
//! lease.release().await?;
//! assert!(started.elapsed() >= Duration::from_millis(10), "two operations, 5 ms each");
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use palisade_core::{AllOrNone, Capabilities, Fence, Grant, LockService, MultiAcquire, ResourceKey, Result, Ttl};

/// A lock service that sleeps `latency` before passing each operation on to the service it
/// wraps.
///
/// Behavior:
/// - `try_acquire`, `acquire`, `extend`, `release` and `advance_fence` each wait `latency`,
///   then call the wrapped service's same method and return its answer unchanged. An
///   `acquire` is one operation: its wait is the wrapped service's own (the latency is added
///   once, before it starts).
/// - `backend` and `capabilities` are the wrapped service's, answered at once.
/// - Cancelling an operation during its latency sends nothing to the wrapped service.
/// - Grants carry the wrapped service's timing: a grant's `requested_at` is taken by the
///   wrapped service after the latency, before its request is sent, so the holder's local
///   deadline stays no later than the server's.
#[derive(Debug)]
pub struct SlowLockService<S: LockService + ?Sized> {
    inner: Arc<S>,
    latency: Duration,
}

impl<S: LockService + ?Sized> SlowLockService<S> {
    /// `inner` with `latency` added to every operation.
    pub fn new(inner: Arc<S>, latency: Duration) -> Self {
        SlowLockService { inner, latency }
    }

    /// The latency added to each operation.
    pub fn latency(&self) -> Duration {
        self.latency
    }

    /// The wrapped service, for operations that must not be slowed.
    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }
}

#[async_trait]
impl<S: LockService + ?Sized> LockService for SlowLockService<S> {
    type Fencing = S::Fencing;

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Self::Fencing>>> {
        tokio::time::sleep(self.latency).await;
        self.inner.try_acquire(key, ttl).await
    }

    async fn acquire(&self, key: &ResourceKey, ttl: Ttl, wait: Duration) -> Result<Grant<Self::Fencing>> {
        tokio::time::sleep(self.latency).await;
        self.inner.acquire(key, ttl, wait).await
    }

    async fn acquire_any(&self, keys: &[ResourceKey], ttl: Ttl, wait: Duration) -> Result<Grant<Self::Fencing>> {
        // A round tries every key: the latency of each (as a round of `try_acquire` would pay).
        tokio::time::sleep(self.latency.saturating_mul(u32::try_from(keys.len()).unwrap_or(u32::MAX))).await;
        self.inner.acquire_any(keys, ttl, wait).await
    }

    async fn try_acquire_all(&self, keys: &[ResourceKey], ttl: Ttl) -> Result<AllOrNone<Grant<Self::Fencing>>> {
        // One request for the set where the service says so; else one per key.
        let requests = if self.inner.capabilities().multi_acquire == MultiAcquire::OneRequest { 1 } else { keys.len() };
        tokio::time::sleep(self.latency.saturating_mul(u32::try_from(requests).unwrap_or(u32::MAX))).await;
        self.inner.try_acquire_all(keys, ttl).await
    }

    async fn extend(&self, grant: &Grant<Self::Fencing>, ttl: Ttl) -> Result<Ttl> {
        tokio::time::sleep(self.latency).await;
        self.inner.extend(grant, ttl).await
    }

    async fn release(&self, grant: &Grant<Self::Fencing>) -> Result<()> {
        tokio::time::sleep(self.latency).await;
        self.inner.release(grant).await
    }

    async fn advance_fence(&self, key: &ResourceKey, floor: Fence) -> Result<()> {
        tokio::time::sleep(self.latency).await;
        self.inner.advance_fence(key, floor).await
    }
}
