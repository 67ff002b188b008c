//! # palisade-core
//!
//! The contracts of [Palisade](https://example.invalid/palisade): distributed locks whose
//! every grant carries a **fencing token**, and stores that refuse writes carrying a token
//! lower than one they have already accepted.
//!
//! A holder that sleeps past its TTL (GC pause, VM freeze, `SIGSTOP`) and wakes up still
//! believing it owns the lock gets a typed [`ErrorKind::StaleFence`] from the store, and the
//! data stays untouched.
//!
//! ## The pieces
//!
//! | piece | what it is |
//! |---|---|
//! | [`LockService`] | the small trait a lock backend implements: `try_acquire`, `acquire`, `extend`, `release` |
//! | [`LockServiceExt`] | what users call: `try_lock` / `lock` ([`LockOptions`]) return a [`Lease`]; `with_lock` runs a future under one |
//! | [`Lease`] | a held lock: fence, deadline, `safe_until`, lost signal, renewal, release |
//! | [`FencedStore`] | the trait a store implements: apply a [`WriteBatch`] only if the fence is ≥ the watermark |
//! | [`FencedStoreExt`] | what users call: `write(&lease, &batch)` |
//! | [`Fenced`] / [`Unfenced`] | type-level markers: only fenced leases can feed a fenced store |
//! | [`MemoryLockService`] / [`MemoryFencedStore`] | the in-process reference semantics |
//! | [`Semaphore`], [`RwLock`], [`Election`] | permits, readers and writers, leaders: built on any fenced lock service, each fenced |
//! | [`spi`] | helpers for backend and store authors (waiting loops, SQL quoting, refusal errors) |
//!
//! ## The flow
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use palisade_core::{FencedStore, FencedStoreExt, LockOptions, LockServiceExt, MemoryFencedStore,
//!                     MemoryLockService, ResourceKey, WriteBatch};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> palisade_core::Result<()> {
//! let locks = Arc::new(MemoryLockService::new());
//! let store = MemoryFencedStore::new();
//! let key = ResourceKey::new("alloc", "WH-01")?;
//!
//! let lease = locks.lock(&key, LockOptions::ttl(Duration::from_secs(30)).wait(Duration::from_secs(5))).await?;
//! store.write(&lease, &WriteBatch::new().put("stock/WH-01/SKU-1", b"99".to_vec())).await?;
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## The rules
//!
//! 1. The store decides, atomically: check and raise the watermark in the same statement or
//!    transaction as the write.
//! 2. Equal is accepted from the same grant, lower is rejected; zero rows affected is a
//!    rejection. An equal fence from another grant is refused ([`ErrorKind::DuplicateFence`]):
//!    the store keeps the [`GrantId`] that set its watermark.
//! 3. A fence orders writes; it does not make a job run once: put the "already done?" check in
//!    the fenced write ([`WriteOp::Create`]).
//! 4. Fences come from the lock service, only with a grant.
//! 5. Fences must never go backwards; when they do, it must be noticed
//!    ([`ErrorKind::FenceRegression`]).
//! 6. The store, not the clock, is the judge: [`Lease::safe_until`] and [`Lease::lost`] are hints.
//! 7. A lock service without fences is an efficiency lock ([`Unfenced`]).

#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod capabilities;
mod connection_url;
mod date;
mod diagnose;
mod election;
mod epoch;
mod error;
mod ext;
mod fence;
mod gate;
mod grant;
mod held;
mod inspect;
mod key;
mod lease;
pub mod memory;
pub mod metrics;
mod multi;
mod options;
mod renewal;
mod row;
mod rwlock;
mod semaphore;
mod service;
#[cfg(feature = "sql")]
mod sql;
mod store;
#[cfg(feature = "tls")]
mod tls;
mod token;
mod ttl;

pub use capabilities::{Capabilities, Deployment, FenceSource, MultiAcquire, Primitive, Replication, Waiting};
pub use connection_url::redact_url;
pub use diagnose::{Check, Diagnose, DynDiagnose, Verdict};
pub use election::{Election, Leadership, Observed};
pub use error::{BoxError, Error, ErrorKind, Result};
pub use ext::{FencedStoreExt, LockServiceExt, REGRESSION_GAP};
pub use fence::{Fence, GrantFence, GrantId};
pub use grant::{Fenced, Fencing, Grant, Unfenced};
pub use inspect::{
    DynInspectLocks, DynInspectStore, HolderView, InspectLocks, InspectStore, Listing, LockView, MAX_LISTED, Waiters,
    WatermarkView,
};
pub use key::{MAX_DOMAIN_LEN, MAX_ID_LEN, ResourceKey, SUB_KEY_SEPARATOR};
pub use lease::Lease;
pub use memory::{MemoryFencedStore, MemoryLockService};
pub use multi::MultiLease;
pub use options::LockOptions;
pub use renewal::{Progress, Renewal};
pub use row::FencedRow;
pub use rwlock::{ReadLease, RwLock};
pub use semaphore::{MAX_PERMITS, Semaphore};
pub use service::{AllOrNone, DynLockService, DynUnfencedLockService, LockService};
pub use store::{
    DynFencedStore, FencedStore, MAX_RECORD_KEY_LEN, MAX_RECORD_VALUE_LEN, Record, WatermarkSource, WriteBatch, WriteOp,
};
pub use token::OwnerToken;
pub use tokio_util::sync::CancellationToken;
pub use ttl::Ttl;

/// A boxed, `Send` future borrowing for `'a`: what a
/// [`with_lock`](LockServiceExt::with_lock) body returns (`Box::pin(async move { … })`).
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// For backend and store authors: the pieces a [`LockService`] or [`FencedStore`]
/// implementation is built from. Application code does not need them.
///
/// - waiting loops: [`poll_acquire`](spi::poll_acquire) (polling with [`Backoff`](spi::Backoff)),
///   [`poll_acquire_woken`](spi::poll_acquire_woken) (polling that some releases also wake),
///   [`wait_for_release`](spi::wait_for_release) (woken by release notifications),
///   [`wait_for_any_release`](spi::wait_for_any_release) (the same for several keys at once),
///   [`timeout_error`](spi::timeout_error), [`validate_wait`](spi::validate_wait),
///   [`first_of`](spi::first_of), [`first_granted`](spi::first_granted),
///   [`try_each`](spi::try_each) and [`timeout_of_any`](spi::timeout_of_any) (for `acquire_any`);
/// - local deadlines for session-based locks: [`HeldGrants`](spi::HeldGrants);
/// - stores: [`storable_fence`](spi::storable_fence), [`fence_refusal`](spi::fence_refusal),
///   [`explain_refusal`](spi::explain_refusal), [`lock_not_live`](spi::lock_not_live),
///   [`conflict_error`](spi::conflict_error),
///   [`validate_record_key`](spi::validate_record_key),
///   [`quote_sql_identifier`](spi::quote_sql_identifier);
/// - URLs: [`ConnectionUrl`](spi::ConnectionUrl);
/// - [`async_trait`](spi::async_trait), re-exported so implementations name the version core uses;
/// - with the `sql` feature, `spi::sql`: the SQL stores' row reading, generic over the driver.
pub mod spi {
    pub use crate::connection_url::{ConnectionUrl, encode_userinfo};
    pub use crate::date::utc_timestamp;
    pub use crate::diagnose::majority_group;
    pub use crate::epoch::EpochFence;
    pub use crate::held::{GiveUp, HeldGrants};
    pub use crate::key::parse_any_resource_key;
    pub use crate::service::{
        AttemptOutcome, Backoff, distinct_keys, first_granted, first_of, poll_acquire, poll_acquire_woken,
        timeout_error, timeout_of_any, try_acquire_each, try_each, wait_for_any_release, wait_for_release,
    };
    pub use crate::store::{
        MAX_FENCES_PER_WRITE, canonical_fences, conflict_error, explain_refusal, fence_refusal, lock_not_live,
        quote_sql_identifier, storable_fence, validate_record_key,
    };
    pub use crate::ttl::validate_wait;
    pub use async_trait::async_trait;

    /// Whether the bug `name` is planted in this process: test fixtures that re-introduce a
    /// known bug in a real backend, so that `palisade torture` can show it finds each one from
    /// its history alone. Only with the feature `planted-bugs` (tests; never a release build)
    /// and when the environment variable `PALISADE_PLANTED_BUG` names the bug; without the
    /// feature, a constant `false` the compiler removes.
    #[cfg(feature = "planted-bugs")]
    pub fn planted_bug(name: &str) -> bool {
        static PLANTED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        PLANTED.get_or_init(|| std::env::var("PALISADE_PLANTED_BUG").ok()).as_deref() == Some(name)
    }

    /// Whether the bug `name` is planted in this process: never, in a build without the
    /// feature `planted-bugs`.
    #[cfg(not(feature = "planted-bugs"))]
    pub const fn planted_bug(_name: &str) -> bool {
        false
    }

    /// What the SQL stores share, generic over the sqlx driver (feature `sql`).
    #[cfg(feature = "sql")]
    pub mod sql {
        pub use crate::sql::*;
    }

    /// What the TLS backends share (feature `tls`).
    #[cfg(feature = "tls")]
    pub mod tls {
        pub use crate::tls::*;
    }
}
