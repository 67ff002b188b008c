//! # Palisade
//!
//! Distributed locks that are *safe*, not theatre. Every lock Palisade grants carries a
//! **fencing token**, an integer that only ever grows; every write the lock protects goes
//! through a **fenced store** that rejects a token lower than one it has already accepted. A
//! holder that sleeps past its TTL and wakes up still believing it owns the lock gets a typed
//! [`ErrorKind::StaleFence`], and the data stays untouched.
//!
//! This is the facade crate: it re-exports [`palisade_core`] and, behind cargo features, each
//! backend and store, and it connects to them by URL.
//!
//! | feature | default | gives |
//! |---|---|---|
//! | `memory` | yes | `memory://[NAME]` lock service and store (one process) |
//! | `sqlite` | yes | `sqlite://PATH`, `sqlite::memory:` fenced store and lock service (`palisade::sqlite`): give both the same file and locks, fences and data share it |
//! | `redis` | no | `redis://` lock service (`palisade::redis`); `redis-tls` adds `rediss://` |
//! | `postgres` | no | `postgres://` fenced store and lock service (`palisade::postgres`), TLS included (`sslmode=require\|verify-ca\|verify-full`) |
//! | `redlock` | no | `redlock://h1:p1,h2:p2,…` (`palisade::redlock`): an efficiency lock without fences, via [`connect_any_lock`] |
//! | `etcd` | no | `etcd://` lock service (`palisade::etcd`; needs `protoc` to build); `etcd-tls` adds `etcds://` |
//! | `zookeeper` | no | `zk://` lock service (`palisade::zookeeper`) |
//! | `dynamodb` | no | `dynamodb://TABLE` fenced store (`palisade::dynamodb`; the AWS SDK) |
//! | `full` | no | everything available in this release |
//!
//! ```
//! use std::time::Duration;
//! use palisade::prelude::*;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> palisade::Result<()> {
//! let locks = palisade::connect_lock("memory://").await?;
//! let store = palisade::connect_store("sqlite::memory:").await?;
//! let key = ResourceKey::new("alloc", "WH-01")?;
//!
//! let lease = locks.lock(&key, LockOptions::ttl(Duration::from_secs(30)).wait(Duration::from_secs(5))).await?;
//! store.write(&lease, &WriteBatch::new().put("stock/WH-01/SKU-1", b"99".to_vec())).await?;
//! lease.release().await?;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod connect;

pub use connect::{
    AnyLockService, connect_any_lock, connect_lock, connect_store, diagnose_lock, diagnose_store, inspect_locks,
    inspect_store,
};
pub use palisade_core::{
    AllOrNone, BoxError, BoxFuture, CancellationToken, Capabilities, Check, Diagnose, DynDiagnose, DynFencedStore,
    DynInspectLocks, DynInspectStore, DynLockService, DynUnfencedLockService, Election, Error, ErrorKind, Fence,
    FenceSource, Fenced, FencedRow, FencedStore, FencedStoreExt, Fencing, Grant, GrantFence, GrantId, HolderView,
    InspectLocks, InspectStore, Leadership, Lease, Listing, LockOptions, LockService, LockServiceExt, LockView,
    MAX_DOMAIN_LEN, MAX_ID_LEN, MAX_LISTED, MAX_PERMITS, MAX_RECORD_KEY_LEN, MAX_RECORD_VALUE_LEN, MemoryFencedStore,
    MemoryLockService, MultiAcquire, MultiLease, Observed, OwnerToken, Primitive, Progress, REGRESSION_GAP, ReadLease,
    Record, Renewal, ResourceKey, Result, RwLock, Semaphore, Ttl, Unfenced, Verdict, Waiters, Waiting, WatermarkSource,
    WatermarkView, WriteBatch, WriteOp, metrics, redact_url,
};

/// For backend and store authors (waiting loops, SQL quoting, refusal errors, session
/// deadlines): see [`palisade_core::spi`]. Application code does not need it.
pub use palisade_core::spi;

/// The embedded SQLite fenced store.
#[cfg(feature = "sqlite")]
pub use palisade_sqlite as sqlite;

/// The Redis lock service.
#[cfg(feature = "redis")]
pub use palisade_redis as redis;

/// The PostgreSQL fenced store.
#[cfg(feature = "postgres")]
pub use palisade_postgres as postgres;

/// The Redlock lock service (no fence: an efficiency lock).
#[cfg(feature = "redlock")]
pub use palisade_redlock as redlock;

/// The etcd lock service.
#[cfg(feature = "etcd")]
pub use palisade_etcd as etcd;

/// The ZooKeeper lock service.
#[cfg(feature = "zookeeper")]
pub use palisade_zookeeper as zookeeper;

/// The DynamoDB fenced store.
#[cfg(feature = "dynamodb")]
pub use palisade_dynamodb as dynamodb;

/// The names most programs need: `use palisade::prelude::*;`.
pub mod prelude {
    pub use palisade_core::{
        DynFencedStore, DynLockService, DynUnfencedLockService, Election, Error, ErrorKind, Fence, FencedStore,
        FencedStoreExt, Lease, LockOptions, LockService, LockServiceExt, MultiLease, Progress, ReadLease, ResourceKey,
        RwLock, Semaphore, WriteBatch,
    };
}
