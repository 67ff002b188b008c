//! # palisade-backend-template
//!
//! A lock service of your own, in the shape Palisade expects, certified from its first build.
//! Copy this crate, rename it, and replace each method's body with your server's calls; the
//! certification (`tests/certify.rs`) tells you which guarantee each change keeps or breaks.
//!
//! As shipped, every call is answered by the in-memory reference service, so the template is
//! green from the start: it shows the structure, not a backend.
//!
//! ```
//! use palisade_backend_template::TemplateLockService;
//! use palisade_core::{LockServiceExt, ResourceKey};
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> palisade_core::Result<()> {
//! let service = std::sync::Arc::new(TemplateLockService::new());
//! let lease = service.try_lock(&ResourceKey::new("orders", "42")?, Duration::from_secs(5)).await?.expect("free");
//! assert!(lease.fence().get() >= 1);
//! lease.release().await?;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

use std::time::Duration;

use async_trait::async_trait;
use palisade_core::{
    Capabilities, Deployment, Fence, Fenced, Grant, InspectLocks, Listing, LockService, LockView, MemoryLockService,
    ResourceKey, Result, Ttl,
};

#[cfg(feature = "conformance")]
pub mod conformance;

/// The backend's name in errors, metrics and reports.
pub const BACKEND: &str = "template";

/// A lock service: replace the in-memory state with your server.
#[derive(Debug, Default)]
pub struct TemplateLockService {
    // Your connection (pool, session) goes here.
    state: MemoryLockService,
}

impl TemplateLockService {
    /// A new service. Yours connects: `async fn connect(url: &str) -> Result<Self>`.
    pub fn new() -> Self {
        TemplateLockService::default()
    }

    /// Deletes `key`'s lock behind its holder's back: what an operator can do on your server,
    /// and the `break_lock` hook certification requires of every service.
    pub fn break_lock(&self, key: &ResourceKey) {
        self.state.break_lock(key);
    }
}

#[async_trait]
impl LockService for TemplateLockService {
    type Fencing = Fenced;

    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// Declare only what you can keep: certification checks each declared guarantee and the
    /// documented refusal of each one you leave out. A server-backed service keeps the
    /// default `Deployment::Network` and must then give certification a faulty client.
    fn capabilities(&self) -> Capabilities {
        Capabilities { deployment: Deployment::InProcess, ..self.state.capabilities() }
    }

    async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Fenced>>> {
        self.state.try_acquire(key, ttl).await
    }

    async fn acquire(&self, key: &ResourceKey, ttl: Ttl, wait: Duration) -> Result<Grant<Fenced>> {
        self.state.acquire(key, ttl, wait).await
    }

    /// A service that notifies releases wakes these waiters too (a semaphore's); the trait's
    /// default polls, and certification fails it where native waiting is declared.
    async fn acquire_any(&self, keys: &[ResourceKey], ttl: Ttl, wait: Duration) -> Result<Grant<Fenced>> {
        self.state.acquire_any(keys, ttl, wait).await
    }

    async fn extend(&self, grant: &Grant<Fenced>, ttl: Ttl) -> Result<Ttl> {
        self.state.extend(grant, ttl).await
    }

    async fn release(&self, grant: &Grant<Fenced>) -> Result<()> {
        self.state.release(grant).await
    }

    async fn advance_fence(&self, key: &ResourceKey, floor: Fence) -> Result<()> {
        self.state.advance_fence(key, floor).await
    }
}

/// What `palisade inspect` shows of your service, and what certification's `view` hook hands
/// to the suite: who holds a key (its grant id, never its token), with which fence, read
/// without changing anything. Read it from your server's own records.
#[async_trait]
impl InspectLocks for TemplateLockService {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn resources(&self, prefix: &str) -> Result<Listing<ResourceKey>> {
        self.state.resources(prefix).await
    }

    async fn lock_view(&self, key: &ResourceKey) -> Result<LockView> {
        self.state.lock_view(key).await
    }
}
