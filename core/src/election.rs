//! Fenced leader election on any fenced lock service: the term is the leadership lease's fence.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::error::Result;
use crate::{
    Fence, Fenced, FencedStore, FencedStoreExt, Lease, LockOptions, LockService, LockServiceExt, Progress, Renewal,
    ResourceKey, WriteBatch,
};

/// A leader election on resource `key`, on any fenced lock service.
///
/// - [`campaign`](Election::campaign) waits to lead and returns a [`Leadership`]: the lock on
///   `key`, kept alive on a timer of the leader's own runtime (renewed every third of the
///   TTL while the runtime runs: a frozen or killed leader stops renewing and loses the lead
///   within a TTL).
/// - The **term** is the leadership lease's fence: it grows with every new leader. Writes the
///   leader makes under [`Leadership::lease`] are judged by the store under `key`, so a deposed
///   leader that wakes up after a newer leader wrote is refused with `StaleFence`.
/// - [`Leadership::proclaim`] records who leads (a value of yours) in a store, fenced by the
///   term; [`observe`](Election::observe) follows that record: the current leader's value and
///   term, as a [`watch`] channel that changes when a new leader proclaims.
/// - Loss of leadership is the lease's lost signal ([`Leadership::lost`]);
///   [`resign`](Leadership::resign) releases the lead at once.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use palisade_core::{Election, LockOptions, MemoryFencedStore, MemoryLockService, ResourceKey};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> palisade_core::Result<()> {
/// let locks = Arc::new(MemoryLockService::new());
/// let store = Arc::new(MemoryFencedStore::new());
/// let election = Election::new(locks, ResourceKey::new("relay", "orders")?, Duration::from_secs(10));
/// let leader = election.campaign(Duration::from_secs(5)).await?;
/// leader.proclaim(&*store, "relay-1").await?;
/// let observed = election.observe(Arc::clone(&store), Duration::from_millis(50));
/// # tokio::time::sleep(Duration::from_millis(100)).await;
/// let now = observed.borrow().clone().expect("a leader proclaimed");
/// assert_eq!((now.value.as_slice(), now.term), (&b"relay-1"[..], leader.term()));
/// leader.resign().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Election<S: LockService<Fencing = Fenced> + ?Sized> {
    service: Arc<S>,
    key: ResourceKey,
    ttl: Duration,
}

impl<S: LockService<Fencing = Fenced> + ?Sized> Clone for Election<S> {
    fn clone(&self) -> Self {
        Election { service: Arc::clone(&self.service), key: self.key.clone(), ttl: self.ttl }
    }
}

/// What [`Election::observe`] sees: the value the current leader proclaimed, and its term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// What the leader proclaimed.
    pub value: Vec<u8>,
    /// Its term (the fence it proclaimed with).
    pub term: Fence,
}

impl<S: LockService<Fencing = Fenced> + ?Sized> Election<S> {
    /// An election on `key` whose leaders hold the lead for `ttl` between renewals.
    pub fn new(service: Arc<S>, key: ResourceKey, ttl: Duration) -> Self {
        Election { service, key, ttl }
    }

    /// The election's resource (also the resource a leader's writes are judged under).
    pub fn key(&self) -> &ResourceKey {
        &self.key
    }

    /// The store record [`Leadership::proclaim`] writes and [`observe`](Election::observe) reads.
    pub fn record(&self) -> String {
        format!("palisade/election/{}", self.key)
    }

    /// Waits up to `wait` to lead (zero: one attempt); [`ErrorKind::Timeout`](crate::ErrorKind::Timeout)
    /// if another leader kept the lead that long.
    pub async fn campaign(&self, wait: Duration) -> Result<Leadership<S>> {
        let lease = self.service.lock(&self.key, LockOptions::ttl(self.ttl).wait(wait)).await?;
        Ok(Leadership::start(lease, self.record(), None))
    }

    /// [`campaign`](Election::campaign), with the lead renewed only while `progress` moves
    /// (the incident's rule): a leader whose work hangs, though its process runs, loses the lead
    /// within a TTL. Tick `progress` as the leader's work advances.
    pub async fn campaign_on_progress(&self, wait: Duration, progress: &Progress) -> Result<Leadership<S>> {
        let lease = self.service.lock(&self.key, LockOptions::ttl(self.ttl).wait(wait)).await?;
        Ok(Leadership::start(lease, self.record(), Some(progress.clone())))
    }

    /// Follows the leader `store` knows: every `every`, reads the proclaimed record and sends it
    /// when it changed (`None` until someone proclaims). The polling task ends when every
    /// receiver is dropped; a read that fails is retried at the next tick.
    pub fn observe<T: FencedStore + ?Sized>(
        &self,
        store: Arc<T>,
        every: Duration,
    ) -> watch::Receiver<Option<Observed>> {
        let (tx, rx) = watch::channel(None);
        let record = self.record();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every.max(Duration::from_millis(1)));
            loop {
                tokio::select! {
                    () = tx.closed() => return,
                    _ = tick.tick() => {}
                }
                if let Ok(read) = store.read(&record).await {
                    let seen = read.and_then(|r| Some(Observed { term: r.fence?, value: r.value }));
                    tx.send_if_modified(|current| {
                        let changed = *current != seen;
                        if changed {
                            current.clone_from(&seen);
                        }
                        changed
                    });
                }
            }
        });
        rx
    }
}

/// The lead, held until [`resign`](Leadership::resign), drop, or its loss.
#[derive(Debug)]
pub struct Leadership<S: LockService<Fencing = Fenced> + ?Sized> {
    lease: Lease<S>,
    renewal: Renewal,
    record: String,
}

impl<S: LockService<Fencing = Fenced> + ?Sized> Leadership<S> {
    fn start(lease: Lease<S>, record: String, gated: Option<Progress>) -> Self {
        let renewal = match gated {
            Some(progress) => lease.renew_on_progress(&progress),
            // Renewed on a timer of the leader's own runtime: a frozen process stops it, and
            // loses the lead within a TTL.
            None => lease.keep_alive(),
        };
        Leadership { lease, renewal, record }
    }

    /// The term: the lease's fence, higher for every newer leader.
    pub fn term(&self) -> Fence {
        self.lease.fence()
    }

    /// The leadership lease: carry it into the leader's fenced writes.
    pub fn lease(&self) -> &Lease<S> {
        &self.lease
    }

    /// Resolves when the lead is lost (a renewal failed, the TTL passed without one).
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.lease.lost()
    }

    /// Whether the lead is lost.
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// Records `value` (who leads: an address, a name) in `store` under the term: a fenced write
    /// of [`Election::record`], refused with `StaleFence` once a newer leader proclaimed.
    pub async fn proclaim<T: FencedStore + ?Sized>(&self, store: &T, value: impl Into<Vec<u8>>) -> Result<()> {
        store.write(&self.lease, &WriteBatch::new().put(self.record.clone(), value)).await
    }

    /// Gives up the lead: stops renewing and releases the lock, so the next campaigner leads at
    /// once. `NotHolder` if the lead had already been lost.
    pub async fn resign(self) -> Result<()> {
        let Leadership { lease, renewal, .. } = self;
        renewal.stop().await;
        lease.release().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ErrorKind, MemoryFencedStore, MemoryLockService};

    #[tokio::test]
    async fn one_leader_at_a_time_and_terms_grow() {
        let locks = Arc::new(MemoryLockService::new());
        let store = Arc::new(MemoryFencedStore::new());
        let election =
            Election::new(Arc::clone(&locks), ResourceKey::new("elect", "t").unwrap(), Duration::from_millis(200));
        let first = election.campaign(Duration::ZERO).await.unwrap();
        first.proclaim(&*store, "a").await.unwrap();
        let err = election.campaign(Duration::from_millis(50)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout, "the lead is renewed past its TTL");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!first.is_lost(), "the heartbeat kept it");
        let term = first.term();
        first.resign().await.unwrap();
        let second = election.campaign(Duration::from_secs(1)).await.unwrap();
        assert!(second.term() > term);
        second.proclaim(&*store, "b").await.unwrap();
        let mut observed = election.observe(Arc::clone(&store), Duration::from_millis(10));
        observed.wait_for(|o| o.as_ref().is_some_and(|o| o.value == b"b")).await.unwrap();
        assert_eq!(observed.borrow().as_ref().map(|o| o.term), Some(second.term()));
        second.resign().await.unwrap();
    }
}
