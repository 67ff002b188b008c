//! Factories from closures, so a backend's test needs no factory type of its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use palisade_core::{FencedStore, Fencing, GrantFence, InspectLocks, LockService, ResourceKey, Result};

use crate::{
    FaultyClient, FencedStoreFactory, HeldTransaction, LoadSettings, LockServiceFactory, ProcessAccess, Timing,
};

/// What [`FnLockFactory::with_break_lock`] calls.
type BreakLock = Arc<dyn Fn(ResourceKey) -> Pin<Box<dyn Future<Output = Result<()>> + Send>> + Send + Sync>;

/// What [`FnLockFactory::with_faulty_client`] calls.
type MakeFaulty<G> = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<FaultyClient<G>>> + Send>> + Send + Sync>;

/// What [`FnLockFactory::with_view`] calls.
type MakeView = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<Arc<dyn InspectLocks>>> + Send>> + Send + Sync>;

/// A [`LockServiceFactory`] that calls a closure for each client (`G`: the service's fencing).
pub struct FnLockFactory<F, G: Fencing = palisade_core::Fenced> {
    make: F,
    timing: Timing,
    access: ProcessAccess,
    break_lock: Option<BreakLock>,
    faulty: Option<MakeFaulty<G>>,
    view: Option<MakeView>,
}

/// A lock service factory from `make` (called once per client), reached directly by child
/// processes.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use palisade_conformance::{Timing, lock_factory};
/// use palisade_core::MemoryLockService;
///
/// let shared = Arc::new(MemoryLockService::new());
/// let factory = lock_factory(Timing::new(Duration::from_millis(200), Duration::from_millis(50)), move || {
///     let shared = Arc::clone(&shared);
///     async move { Ok(shared) }
/// });
/// # let _ = factory;
/// ```
pub fn lock_factory<S, F, Fut>(timing: Timing, make: F) -> FnLockFactory<F, S::Fencing>
where
    S: LockService,
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Arc<S>>> + Send,
{
    FnLockFactory { make, timing, access: ProcessAccess::Direct, break_lock: None, faulty: None, view: None }
}

impl<F, G: Fencing> FnLockFactory<F, G> {
    /// Child processes reach the service through the relay (for in-process services).
    pub fn via_relay(mut self) -> Self {
        self.access = ProcessAccess::Relay;
        self
    }

    /// How to delete a key's lock on the server behind its holder's back (see
    /// [`LockServiceFactory::break_lock`]).
    pub fn with_break_lock<B, BFut>(mut self, break_lock: B) -> Self
    where
        B: Fn(ResourceKey) -> BFut + Send + Sync + 'static,
        BFut: Future<Output = Result<()>> + Send + 'static,
    {
        self.break_lock = Some(Arc::new(move |key| Box::pin(break_lock(key))));
        self
    }

    /// How to open the service's read-only view (see [`LockServiceFactory::view`]): for a
    /// service that is its own view, the same closure as the clients'
    /// (`.with_view(|| async { Ok(service().await? as Arc<dyn InspectLocks>) })`).
    pub fn with_view<V, VFut>(mut self, view: V) -> Self
    where
        V: Fn() -> VFut + Send + Sync + 'static,
        VFut: Future<Output = Result<Arc<dyn InspectLocks>>> + Send + 'static,
    {
        self.view = Some(Arc::new(move || Box::pin(view())));
        self
    }

    /// The service is its own read-only view ([`LockServiceFactory::view`]): the view is a
    /// client made as [`client`](LockServiceFactory::client) makes one, seen as
    /// [`InspectLocks`].
    pub fn viewed<S, Fut>(self) -> Self
    where
        S: InspectLocks,
        F: Fn() -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Arc<S>>> + Send + 'static,
    {
        let make = self.make.clone();
        self.with_view(move || {
            let client = make();
            async move {
                let view: Arc<dyn InspectLocks> = client.await?;
                Ok(view)
            }
        })
    }

    /// How to make a client behind fault proxies (see [`LockServiceFactory::faulty_client`]).
    pub fn with_faulty_client<M, MFut>(mut self, make: M) -> Self
    where
        M: Fn() -> MFut + Send + Sync + 'static,
        MFut: Future<Output = Result<FaultyClient<G>>> + Send + 'static,
    {
        self.faulty = Some(Arc::new(move || Box::pin(make())));
        self
    }
}

#[async_trait]
impl<S, F, Fut> LockServiceFactory for FnLockFactory<F, S::Fencing>
where
    S: LockService,
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Arc<S>>> + Send,
{
    type Service = S;
    async fn client(&self) -> Result<Arc<S>> {
        (self.make)().await
    }
    fn timing(&self) -> Timing {
        self.timing
    }
    fn process_access(&self) -> ProcessAccess {
        self.access
    }
    async fn break_lock(&self, key: &ResourceKey) -> Result<()> {
        match &self.break_lock {
            Some(b) => b(key.clone()).await,
            None => Err(palisade_core::Error::new(
                palisade_core::ErrorKind::Unsupported,
                "conformance",
                format!("this factory cannot break the lock of {key} on the server"),
            )),
        }
    }
    async fn view(&self) -> Result<Arc<dyn InspectLocks>> {
        match &self.view {
            Some(view) => view().await,
            None => Err(palisade_core::Error::new(
                palisade_core::ErrorKind::Unsupported,
                "conformance",
                "this factory gives no read-only view of its service",
            )),
        }
    }
    async fn faulty_client(&self) -> Result<FaultyClient<S::Fencing>> {
        match &self.faulty {
            Some(make) => make().await,
            None => Err(palisade_core::Error::new(
                palisade_core::ErrorKind::Unsupported,
                "conformance",
                "this factory cannot make a client behind a fault proxy",
            )),
        }
    }
}

/// What [`FnStoreFactory::with_held_transaction`] calls.
type HoldFn =
    Arc<dyn Fn(ResourceKey, GrantFence) -> Pin<Box<dyn Future<Output = Result<HeldTransaction>> + Send>> + Send + Sync>;

/// A [`FencedStoreFactory`] that calls a closure for each client.
pub struct FnStoreFactory<F> {
    make: F,
    load: Option<LoadSettings>,
    hold: Option<HoldFn>,
}

impl<F> FnStoreFactory<F> {
    /// Declares the load this store's test server takes (see [`FencedStoreFactory::load`]).
    pub fn with_load(mut self, load: LoadSettings) -> Self {
        self.load = Some(load);
        self
    }

    /// Provides [`FencedStoreFactory::hold_transaction`]: `hold` opens a fenced transaction
    /// (on a client of its own) and returns it, with whatever keeps it alive, as the guard.
    pub fn with_held_transaction<H, HFut>(mut self, hold: H) -> Self
    where
        H: Fn(ResourceKey, GrantFence) -> HFut + Send + Sync + 'static,
        HFut: Future<Output = Result<HeldTransaction>> + Send + 'static,
    {
        self.hold = Some(Arc::new(move |resource, fence| Box::pin(hold(resource, fence))));
        self
    }
}

/// A fenced store factory from `make` (called once per client, in this process or a child).
pub fn store_factory<S, F, Fut>(make: F) -> FnStoreFactory<F>
where
    S: FencedStore,
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Arc<S>>> + Send,
{
    FnStoreFactory { make, load: None, hold: None }
}

#[async_trait]
impl<S, F, Fut> FencedStoreFactory for FnStoreFactory<F>
where
    S: FencedStore,
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Arc<S>>> + Send,
{
    type Store = S;
    async fn client(&self) -> Result<Arc<S>> {
        (self.make)().await
    }
    fn load(&self) -> LoadSettings {
        self.load.unwrap_or_else(LoadSettings::from_env)
    }
    async fn hold_transaction(&self, resource: &ResourceKey, fence: GrantFence) -> Result<HeldTransaction> {
        match &self.hold {
            Some(hold) => hold(resource.clone(), fence).await,
            None => Err(palisade_core::Error::new(
                palisade_core::ErrorKind::Unsupported,
                "conformance",
                "this factory cannot hold a fenced transaction of the store open",
            )),
        }
    }
}
