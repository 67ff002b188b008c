//! # palisade-etcd
//!
//! Palisade's etcd lock service: consensus-backed locks whose fence is etcd's own revision.
//!
//! - **One session lease per client**, granted at connect and kept alive in the background
//!   (every third of its TTL), shared by every lock the client holds. An uncontended acquire
//!   is therefore **one txn**: "if no key exists under the resource's prefix, put mine on the
//!   session lease".
//! - **Fence = the service's epoch over the create revision of the holder's key**
//!   (`epoch × 2⁴⁴ + revision`): strictly increasing for each resource, but not gap-free
//!   (every write to the cluster moves it). The epoch is 0, and the fence the revision itself, until
//!   the cluster loses its data (below).
//! - **FIFO, push-based waiting** (the etcd lock recipe): a waiter puts its own key under the
//!   resource's prefix and watches the key created just before it; when that key is deleted it
//!   checks again, in one txn that also re-reads its own key, so a session that expired while
//!   waiting is never taken for ownership (the bug Jepsen found in etcd 3.4.3, #11456).
//! - **Loss**: when the keep-alive fails past the session's deadline, or the server says the
//!   lease is gone, every grant's lost signal fires. A grant's TTL is capped at what the
//!   session is known to have left, so a lease's `safe_until` never outlives the server's.
//! - **A stopped process** (SIGSTOP, GC pause, crash) stops its keep-alive: the server expires
//!   the lease after `session_ttl` and the next waiter gets the lock with a higher fence.
//! - **A silent but live holder** (neither extends nor releases): its grant expires locally at
//!   its TTL and this client deletes the key, exactly like a TTL lock.
//!
//! ## Key layout
//!
//! `<prefix>lock:{domain:id}/<owner token>` with the default prefix `palisade/`, for
//! example `palisade/lock:{alloc:WH-01}/8c1e…`, and the service's epoch, `<prefix>epoch`
//! (absent until a data loss is repaired): a role scoped to the prefix covers both. Resource ids cannot contain `/` or `}`, so one
//! resource's prefix never matches another's.
//!
//! ## Run etcd with auto-compaction
//!
//! Every acquire checks the resource's key prefix, and until etcd compacts its history its
//! index keeps every deleted contender key under that prefix: a resource locked 20,000 times
//! without a compaction took 10× as long per acquire + release as a freshly compacted one
//! (`docs/benchmarks/etcd.md`). etcd's own lock recipe has the same cost. Run the cluster with
//! auto-compaction (`--auto-compaction-mode=periodic --auto-compaction-retention=5m`, or
//! revision mode), as production etcd should be anyway, and bound its memory with
//! `--snapshot-count 10000` (etcd 3.4 keeps the raft log of the last 100,000 writes in memory:
//! the million-job run's etcd peaked at 512 MiB resident without it, 442 MiB with it, in
//! `docs/benchmarks/warehouse-1m/etcd-postgres/report.md`). Releases delete the holder's key by
//! name (the name carries the grant's fresh owner token, which is the owner check), one plain
//! delete.
//!
//! ## Fence regressions, repaired without an operator
//!
//! Revisions survive restarts and leader changes. They move **backwards** when the cluster
//! loses its data: its data directory wiped, a restore from an older snapshot, a new cluster in
//! its place. Stores keep refusing the low
//! fences (safety holds), and
//! [`LockServiceExt::lock_checked`](palisade_core::LockServiceExt::lock_checked) detects the
//! regression (error log, `palisade_lock_fence_regression_total`) and repairs it: a revision
//! cannot be moved by a client, but the **epoch** can.
//! [`advance_fence`](palisade_core::LockService::advance_fence) raises the key
//! `<prefix>epoch` to the first epoch whose fences are above the store's watermark, and every
//! acquire reads the epoch in the txn that finds it first in the queue (the one that creates its
//! key, when nobody is ahead): from the next grant on, every
//! resource's fences start above everything the stores accepted, still derived from the
//! revision. The same repair answers a `DuplicateFence` (a partial loss: a restore from an
//! older snapshot hands out revisions a paused holder still carries).
//!
//! Limits: the revision has 44 bits (2⁴⁴ ≈ 1.8 × 10¹³ revisions: 55 years of 10,000 writes a
//! second), the epoch 19 (524,287 recoveries), so that every fence fits the 63 bits of a SQL
//! `BIGINT`. Beyond either an acquire fails with a `Backend` error (a revision) or the repair
//! with `Unsupported` (an epoch), never a fence that wrapped. A grant whose key was created
//! before a raise keeps its lower fence: the store refuses its writes, and `lock_checked`
//! acquires again.
//!
//! ## Connecting
//!
//! `etcd://[user:password@]host:port[,host:port…][?session_ttl_s=N&prefix=P]`; `etcds://`
//! (with this crate's `tls` feature) for TLS, with [`EtcdConfig::with_tls_root_cert`] for a
//! private CA and [`EtcdConfig::with_tls_client_identity`] for mutual TLS.
//!
//! ```no_run
//! # async fn demo() -> palisade_core::Result<()> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use palisade_core::{LockOptions, LockServiceExt, ResourceKey};
//! use palisade_etcd::EtcdLockService;
//!
//! let locks = Arc::new(EtcdLockService::connect("etcd://127.0.0.1:2379?session_ttl_s=5").await?);
//! let key = ResourceKey::new("alloc", "WH-01")?;
//! let lease = locks.lock(&key, LockOptions::ttl(Duration::from_secs(5)).wait(Duration::from_secs(10))).await?;
//! println!("fence {}", lease.fence());
//! lease.release().await?;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
#[cfg(feature = "conformance")]
pub mod conformance;
mod diagnose;
mod errors;
mod inspect;
mod reply;
mod service;
mod session;

pub use config::EtcdConfig;
pub use service::EtcdLockService;

/// The pure parts that the fuzz targets (`fuzz/`) check: behind the `fuzzing` feature, with
/// no stability promise.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::reply::TxnReply;
}

/// The backend name in errors, logs and metrics.
pub const BACKEND: &str = "etcd";
