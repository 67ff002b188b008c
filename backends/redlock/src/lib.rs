//! # palisade-redlock
//!
//! Redlock over N independent Redis masters, as its authors specify it, and honest about what
//! it is: an **efficiency lock**. It issues **no fence**.
//!
//! ## The algorithm
//!
//! 1. Take the time from the **monotonic** clock (`tokio::time::Instant`; wall-clock jumps
//!    cannot stretch or shrink a validity).
//! 2. Send `SET redlock:{domain:id} TOKEN NX PX ttl` to every master **in parallel**, each
//!    bounded by a short per-node timeout ([`RedlockConfig::node_timeout`], default 50 ms), so
//!    a dead or hung master costs at most that, not the TTL. `TOKEN` is a fresh 128-bit owner
//!    token.
//! 3. The lock is acquired when a **majority** (`N/2 + 1`) said yes **and** the validity
//!    `TTL − elapsed − drift` is still positive, where `drift = TTL × drift_factor +
//!    drift_fixed` (default 1 % + 2 ms, configurable). The lease's
//!    [`safe_until`](palisade_core::Lease::safe_until) is then exactly the end of that validity.
//! 4. Otherwise the key is deleted on **every** master (also those that did not answer: their
//!    `SET` may have landed), and the caller retries after a random delay (up to
//!    [`RedlockConfig::retry_delay`]) so contenders do not retry in lockstep.
//! 5. Release and extend are compare-token scripts run on every master: only the holder's
//!    token deletes or re-expires the key; they count as done when a majority did them.
//!
//! A single master (N = 1) is the default deployment and what most copies of the blog post
//! run. `redlock://h1:p1,h2:p2,h3:p3` lists the masters ([`RedlockConfig::parse`]); they must
//! be independent (not replicas of each other).
//!
//! ## No fence, and the types say so
//!
//! The service's `Fencing` is [`Unfenced`](palisade_core::Unfenced) and its capabilities say
//! fence source [`None`](palisade_core::FenceSource::None). Its lease has no `fence()`, so it
//! cannot be passed to a fenced store:
//!
//! ```compile_fail
//! use std::sync::Arc;
//! use std::time::Duration;
//! use palisade_core::{FencedStoreExt, LockServiceExt, MemoryFencedStore, ResourceKey, WriteBatch};
//! use palisade_redlock::RedlockService;
//!
//! async fn write(locks: Arc<RedlockService>, store: MemoryFencedStore) -> palisade_core::Result<()> {
//!     let key = ResourceKey::new("alloc", "WH-01")?;
//!     let Some(lease) = locks.try_lock(&key, Duration::from_secs(10)).await? else { return Ok(()) };
//!     store.write(&lease, &WriteBatch::new()).await // expected `Fenced`, found `Unfenced`
//! }
//! ```
//!
//! The conformance suite runs on it like on every backend: mutual exclusion, owner-only
//! release and extend, expiry and takeover, progress-gated renewal pass; in the paused-holder
//! scenarios the suite asserts the documented outcome instead: **the stale holder's write goes
//! through**.
//!
//! ## What it assumes (Kleppmann 2016; antirez's reply)
//!
//! Martin Kleppmann's "How to do distributed locking" (2016) shows that Redlock's safety rests
//! on timing: a client paused (GC, VM freeze, `SIGSTOP`) or delayed on the network after it
//! got the lock keeps acting after its validity ran out, and nothing in Redlock stops its
//! writes, because it produces no fencing token; and the masters expire keys by their own
//! clocks, so a master whose clock jumps forward lets a key go early. Salvatore Sanfilippo
//! (antirez) replied ("Is Redlock safe?", 2016) that the algorithm assumes **bounded clock
//! drift** between the masters (clocks that advance at about the same rate, kept by
//! `adjtime`-style slewing, never stepped), that the client checks the elapsed time **after**
//! acquiring (which bounds delays *before* the grant), and that masters restarted without
//! persistence must stay down for one TTL before rejoining (**delayed restarts**); he agrees
//! that a pause *after* the check cannot be caught by the lock itself.
//!
//! This crate follows the client side of those rules (monotonic clock, validity check after
//! the round, drift allowance) and cannot enforce the server side. Concretely:
//! - a master restarted without persistence (and without a delayed restart) while a lock is
//!   held can give the same lock to two clients at once: `tests/faults.rs` demonstrates it;
//! - a holder paused past its validity still writes: only a fence checked by the store
//!   stops that, and Redlock has none.
//!
//! ## When to use it
//!
//! **Acceptable** where a rare double grant costs only duplicated effort: avoiding two
//! workers recomputing the same cache entry or sending the same harmless notification. **Not
//! acceptable** where a double grant corrupts data or money (allocations, invoice numbers,
//! ledger writes, leader-only side effects): use a fenced service (Redis, etcd, ZooKeeper
//! backends) with a fenced store instead.

#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
#[cfg(feature = "conformance")]
pub mod conformance;
mod node;
mod scripts;
mod service;
mod view;

pub use config::{MAX_NODES, RedlockConfig};
pub use service::RedlockService;
