//! Factories for the in-memory reference implementations.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use palisade_core::{Fenced, LockService, MemoryFencedStore, MemoryLockService, ResourceKey, Result};

use crate::relay::{Relay, RelayLockService};
use crate::{FaultProxy, FaultyClient, FencedStoreFactory, LockServiceFactory, ProcessAccess, Timing};

/// Clients of one shared [`MemoryLockService`]; child processes reach it through the relay.
#[derive(Debug, Clone, Default)]
pub struct MemoryLockFactory {
    service: Arc<MemoryLockService>,
}

impl MemoryLockFactory {
    /// A factory over a fresh service.
    pub fn new() -> Self {
        MemoryLockFactory::default()
    }
}

#[async_trait]
impl LockServiceFactory for MemoryLockFactory {
    type Service = MemoryLockService;

    async fn client(&self) -> Result<Arc<MemoryLockService>> {
        Ok(Arc::clone(&self.service))
    }

    fn timing(&self) -> Timing {
        Timing::new(Duration::from_millis(200), Duration::from_millis(50))
    }

    fn process_access(&self) -> ProcessAccess {
        ProcessAccess::Relay
    }

    async fn break_lock(&self, key: &ResourceKey) -> Result<()> {
        self.service.break_lock(key);
        Ok(())
    }

    async fn view(&self) -> Result<Arc<dyn palisade_core::InspectLocks>> {
        Ok(Arc::clone(&self.service) as Arc<dyn palisade_core::InspectLocks>)
    }

    /// The shared service served over the loopback relay, its client dialing a fault proxy.
    async fn faulty_client(&self) -> Result<FaultyClient<Fenced>> {
        let relay = Relay::serve(Arc::clone(&self.service)).await?;
        let proxy = FaultProxy::start(relay.addr()).await?;
        let client = RelayLockService::<Fenced>::connect(proxy.addr(), self.service.capabilities()).await?;
        Ok(FaultyClient::new(Arc::new(client), vec![proxy]).keeping(relay))
    }
}

/// Clients of one shared [`MemoryFencedStore`] (in-process only: not for the process-level
/// end-to-end scenarios, whose child process needs its own path to the store).
#[derive(Debug, Clone, Default)]
pub struct MemoryStoreFactory {
    store: Arc<MemoryFencedStore>,
}

impl MemoryStoreFactory {
    /// A factory over a fresh store.
    pub fn new() -> Self {
        MemoryStoreFactory::default()
    }
}

#[async_trait]
impl FencedStoreFactory for MemoryStoreFactory {
    type Store = MemoryFencedStore;

    async fn client(&self) -> Result<Arc<MemoryFencedStore>> {
        Ok(Arc::clone(&self.store))
    }

    /// The store is this process's memory: no child process can write to it.
    fn shared_across_processes(&self) -> bool {
        false
    }
}
