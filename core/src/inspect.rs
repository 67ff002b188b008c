//! What a lock service and a store hold right now, read without changing anything. This is
//! for the person on call (`palisade inspect`), and never on a lock's path.
//!
//! Backends implement [`InspectLocks`] and stores [`InspectStore`] on the same types that
//! implement [`LockService`](crate::LockService) and [`FencedStore`](crate::FencedStore).
//! Each method's contract is the same on every backend; `palisade inspect`'s tests check every
//! implementation in this repository against its real server.
//! A view never shows an owner token: a holder shows as its [`GrantId`], the same id a store
//! records beside the watermark that holder's writes set. So one id connects a held lock to
//! the writes it made.

use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::{Fence, GrantId, ResourceKey};

/// How many resources one [`InspectLocks::resources`] or [`InspectStore::watermarks`] call
/// returns at most. Larger listings stop here and say they were cut (`truncated`).
pub const MAX_LISTED: usize = 10_000;

/// One resource's lock, as the lock service held it when it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockView {
    /// The resource.
    pub key: ResourceKey,
    /// The live holder, or `None` when the lock is free (never held, released or expired).
    pub holder: Option<HolderView>,
    /// What the next grant's fence is above: the highest fence the service has issued for
    /// the resource, or the floor a repair moved the counter to (`advance_fence`), whichever
    /// is higher. A service that counts (SQLite, PostgreSQL, Redis) shows 0 when it keeps no
    /// counter for the resource: none issued, or the counter lost with the service's data (a
    /// watermark above it is then a regression waiting to happen). A service whose fences
    /// are its cluster's revisions shows the revision now (etcd), or the last change to the
    /// resource's queue (ZooKeeper). `None` when the service cannot tell (ZooKeeper, for a
    /// resource nobody holds or waits for).
    pub fence_counter: Option<Fence>,
    /// Who waits for the lock, as far as the backend can tell.
    pub waiters: Waiters,
}

/// Who waits for a lock, as far as its backend can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Waiters {
    /// The backend keeps nothing that shows its waiters (they poll, or wait in their own
    /// process).
    #[default]
    Unknown,
    /// This many callers are queued (etcd's and ZooKeeper's queues of keys or nodes). A lower
    /// bound: a caller waiting for any of several resources (`acquire_any`) joins no queue.
    Queued(u64),
    /// At least one caller has waited since the lock was last granted: a mark, not a count
    /// (PostgreSQL's `waiting` column and Redis's mark on the lock, which ask the release to
    /// notify).
    Marked,
    /// The backend shows its waiters, and there are none.
    None,
}

impl LockView {
    /// A free lock of `key` with no counter and no visible waiters: where a backend starts.
    pub fn free(key: ResourceKey) -> Self {
        LockView { key, holder: None, fence_counter: None, waiters: Waiters::Unknown }
    }

    /// The view with `holder` as the live holder.
    pub fn held_by(mut self, holder: HolderView) -> Self {
        self.holder = Some(holder);
        self
    }

    /// The view with the service's fence counter at `counter`.
    pub fn with_counter(mut self, counter: Option<Fence>) -> Self {
        self.fence_counter = counter;
        self
    }

    /// The view with its `waiters`.
    pub fn with_waiters(mut self, waiters: Waiters) -> Self {
        self.waiters = waiters;
        self
    }
}

/// The live holder of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderView {
    /// The holder's grant id: what a store records beside the watermarks this grant set.
    pub grant: GrantId,
    /// The fence issued with the grant. `None` where the service keeps no fence beside the
    /// holder (Redis keeps only the counter, the holder's fence unless a repair moved it
    /// since), or cannot tell which epoch the grant was made under (etcd and ZooKeeper, when
    /// a repair raised the epoch after the holder queued).
    pub fence: Option<Fence>,
    /// How long until the lock expires on the service's own clock, if the holder does not
    /// extend it (for etcd, its session lease's time left). `None` when there is no expiry to
    /// show: a lock bound to its holder's session (ZooKeeper), which lasts as long as the
    /// session does, or one whose expiry the service no longer keeps.
    pub expires_in: Option<Duration>,
}

impl HolderView {
    /// The holder of grant `grant`, with `fence`, expiring in `expires_in`.
    pub fn new(grant: GrantId, fence: Option<Fence>, expires_in: Option<Duration>) -> Self {
        HolderView { grant, fence, expires_in }
    }
}

/// A listing that may have been cut at [`MAX_LISTED`] entries.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Listing<T> {
    /// The entries, in key order.
    pub entries: Vec<T>,
    /// Whether more matched than [`MAX_LISTED`]: narrow the prefix to see the rest.
    pub truncated: bool,
}

impl Listing<ResourceKey> {
    /// The resources named by `names` (each `domain:id`, as a key prints), in key order and
    /// each once, cut at [`MAX_LISTED`]. Names this version cannot parse are left out.
    pub fn of_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        let mut keys: Vec<ResourceKey> =
            names.into_iter().filter_map(|n| crate::key::parse_any_resource_key(n).ok()).collect();
        keys.sort_by_cached_key(ToString::to_string);
        keys.dedup();
        Listing::of(keys)
    }
}

impl<T> Listing<T> {
    /// Keeps the first [`MAX_LISTED`] of `entries` (which must be in key order) and says
    /// whether any were left out.
    pub fn of(mut entries: Vec<T>) -> Self {
        let truncated = entries.len() > MAX_LISTED;
        entries.truncate(MAX_LISTED);
        Listing { entries, truncated }
    }
}

/// The read-only view of a lock service: who holds which lock, with which fence.
///
/// Contract:
/// - nothing is changed: no lock is taken, extended, released or expired early, and no fence
///   counter moves;
/// - a resource held through this service shows its holder's [`GrantId`] and fence. A
///   released resource shows no holder, and the counter is still at the fence it issued;
/// - no owner token appears anywhere in a view.
#[async_trait]
pub trait InspectLocks: Send + Sync + 'static {
    /// The backend's short name (`"redis"`, `"sqlite"`), as its lock service gives it.
    fn backend(&self) -> &'static str;

    /// The resources the service keeps anything for (a held lock, a fence counter), whose
    /// `domain:id` text starts with `prefix` (`""`: all), in key order. Cut at
    /// [`MAX_LISTED`]. Resources whose key this version cannot parse are left out.
    async fn resources(&self, prefix: &str) -> Result<Listing<ResourceKey>>;

    /// The lock of `key` now. A resource the service has never seen is a free
    /// [`LockView`] with no counter, not an error.
    async fn lock_view(&self, key: &ResourceKey) -> Result<LockView>;
}

/// The watermark a store keeps for a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WatermarkView {
    /// The highest fence the store has accepted for the resource.
    pub fence: Fence,
    /// The grant whose write set it. `None` for a watermark older than recorded grants.
    pub grant: Option<GrantId>,
}

impl WatermarkView {
    /// A watermark at `fence`, set by `grant`.
    pub fn new(fence: Fence, grant: Option<GrantId>) -> Self {
        WatermarkView { fence, grant }
    }
}

/// The read-only view of a fenced store's watermarks: which fence each resource's writes are
/// now held to, and which grant set it. A view is of a [`FencedStore`](crate::FencedStore),
/// whose [`read`](crate::FencedStore::read) and [`list`](crate::FencedStore::list) show the
/// records beside it (an election's proclaimed value, a read-write lock's last writer).
///
/// Contract: nothing is changed. After a
/// fenced write of `resource` by a grant, [`watermark_view`](InspectStore::watermark_view)
/// shows that grant's fence and id (until a higher fence is accepted). A resource never
/// written under a fence has no watermark.
#[async_trait]
pub trait InspectStore: crate::FencedStore {
    /// Every resource with a watermark whose `domain:id` text starts with `prefix` (`""`:
    /// all), in key order, cut at [`MAX_LISTED`].
    async fn watermarks(&self, prefix: &str) -> Result<Listing<(ResourceKey, WatermarkView)>>;

    /// The watermark of `resource`, or `None` if nothing was written under a fence for it.
    async fn watermark_view(&self, resource: &ResourceKey) -> Result<Option<WatermarkView>>;

    /// The records whose name starts with `prefix`, in name order, as
    /// [`list`](crate::FencedStore::list) gives them; a store whose tables were never made
    /// has none (not an error), as for the watermarks.
    async fn records(&self, prefix: &str) -> Result<Vec<(String, crate::Record)>> {
        self.list(prefix).await
    }

    /// The record `name`, as [`read`](crate::FencedStore::read) gives it; `None` also when the
    /// store's tables were never made.
    async fn record(&self, name: &str) -> Result<Option<crate::Record>> {
        self.read(name).await
    }
}

/// A lock service's read-only view behind a pointer: what `palisade::inspect_locks` returns.
pub type DynInspectLocks = dyn InspectLocks;

/// A store's read-only view behind a pointer: what `palisade::inspect_store` returns.
pub type DynInspectStore = dyn InspectStore;
