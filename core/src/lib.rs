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
//! | [`LockServiceExt`] | what users call: `try_lock` / `lock` return a [`Lease`] |
//! | [`Lease`] | a held lock: fence, deadline, `safe_until`, lost signal, renewal, release |
//! | [`FencedStore`] | the trait a store implements: apply a [`WriteBatch`] only if the fence is ≥ the watermark |
//! | [`FencedStoreExt`] | what users call: `write(&lease, &batch)` |
//! | [`Fenced`] / [`Unfenced`] | type-level markers: only fenced leases can feed a fenced store |
//! | [`MemoryLockService`] / [`MemoryFencedStore`] | the in-process reference semantics |
//!
//! ## The flow
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use palisade_core::{FencedStore, FencedStoreExt, LockServiceExt, MemoryFencedStore,
//!                     MemoryLockService, ResourceKey, WriteBatch};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> palisade_core::Result<()> {
//! let locks = Arc::new(MemoryLockService::new());
//! let store = MemoryFencedStore::new();
//! let key = ResourceKey::new("alloc", "WH-01")?;
//!
//! let lease = locks.lock(&key, Duration::from_secs(30), Duration::from_secs(5)).await?;
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

mod capabilities;
mod connection_url;
mod error;
mod ext;
mod fence;
mod grant;
pub mod held;
mod key;
mod lease;
pub mod memory;
pub mod metrics;
mod renewal;
mod service;
mod store;
mod token;
mod ttl;

pub use capabilities::{Capabilities, FenceSource, Waiting};
pub use connection_url::{ConnectionUrl, redact_url};
pub use error::{BoxError, Error, ErrorKind, Result};
pub use ext::{FencedStoreExt, LockServiceExt, REGRESSION_GAP};
pub use fence::{Fence, GrantFence, GrantId};
pub use grant::{Fenced, Fencing, Grant, Unfenced};
pub use key::{MAX_DOMAIN_LEN, MAX_ID_LEN, ResourceKey};
pub use lease::Lease;
pub use memory::{MemoryFencedStore, MemoryLockService};
pub use renewal::{Progress, Renewal};
pub use service::{
    AttemptOutcome, Backoff, DynLockService, DynUnfencedLockService, LockService, poll_acquire, timeout_error,
    wait_for_release,
};
pub use store::{
    DynFencedStore, FencedStore, MAX_RECORD_KEY_LEN, MAX_RECORD_VALUE_LEN, Record, WatermarkSource, WriteBatch,
    WriteOp, conflict_error, explain_refusal, fence_refusal, quote_sql_identifier, storable_fence, validate_record_key,
};
pub use token::OwnerToken;
pub use ttl::{Ttl, validate_wait};

// Re-exported so backend authors name the same versions as core.
pub use async_trait::async_trait;
pub use tokio_util::sync::CancellationToken;
