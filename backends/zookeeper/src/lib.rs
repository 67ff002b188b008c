//! # palisade-zookeeper
//!
//! Palisade's ZooKeeper lock service: the classic lock recipe (Chubby/Curator lineage) with a
//! fence that cannot go backwards.
//!
//! - **Acquire**: create an `EPHEMERAL_SEQUENTIAL` node `lock-<owner token>-<sequence>` under the
//!   resource's parent `<root>/<domain>/<id>` (default root `/palisade/locks`; parents are
//!   container nodes, created on demand). The lowest sequence holds the lock.
//! - **Fence = the service's epoch over the lock node's `czxid`** (`epoch × 2⁴⁸ + czxid`):
//!   the ensemble-wide transaction id of its creation, monotonic across leader changes. Not
//!   the sequence suffix: a parent deleted and recreated (or a container garbage-collected)
//!   restarts that. The epoch is 0, and the fence the `czxid` itself, until the ensemble loses
//!   its data.
//! - **Data loss is repaired without an operator**: an ensemble whose data is wiped or restored
//!   from an old snapshot issues zxids below what the stores accepted. Stores refuse them, and
//!   [`lock_checked`](palisade_core::LockServiceExt::lock_checked) (or `FencedStoreExt::write`
//!   on `DuplicateFence`) calls [`advance_fence`](palisade_core::LockService::advance_fence),
//!   which raises the persistent node `<root>.epoch` (outside the root: container nodes go when
//!   empty) to the first epoch above the store's watermark. Every grant reads the epoch once
//!   nobody is ahead of it, pipelined with the reads it makes anyway. Limits: a `czxid` below
//!   2⁴⁸ (65,536 leader elections in the ensemble's life), 32,767 recoveries, every fence within
//!   63 bits; beyond them an acquire fails (`Backend`) or the repair does (`Unsupported`), never
//!   a fence that wrapped.
//! - **Waiting is FIFO** and herd-free: a waiter watches only the node just ahead of its own and
//!   re-checks on every event. Before declaring the lock held it re-reads its own node and
//!   requires the **ephemeral owner to be this session** (CURATOR-604: a node of an expired
//!   session must never be taken for ours).
//! - **Loss**: session expiry, close, or a disconnect longer than the session's proven life
//!   fires every grant's lost signal. A grant's TTL is capped at two thirds of the session
//!   timeout (the server may not have heard from us for a third of it); a live holder that
//!   neither extends nor releases has its node deleted by its own client at the grant's TTL.
//!   A stopped process (SIGSTOP) stops heartbeating: the ensemble expires its session after the
//!   timeout and deletes its node, and the next waiter gets the lock.
//! - **ACL**: with a digest identity (`zk://user:password@…`) lock nodes get the `creator_all`
//!   ACL, so only that identity can delete them; without one they are open.
//! - **Release** deletes our node (the name carries our owner token, so no other holder's node can
//!   match); closing the client closes the session.
//!
//! - **TLS** (feature `tls`): `zks://` speaks TLS to every server, trusting
//!   [`ZkConfig::with_tls_root_cert`] and presenting [`ZkConfig::with_tls_client_identity`]. A
//!   refused handshake (unknown CA, wrong host name, expired certificate, refused client
//!   certificate, a plaintext port) is [`InvalidConfig`](palisade_core::ErrorKind::InvalidConfig)
//!   at once: the service makes a handshake of its own beside the client's, which would retry it
//!   as an outage.
//! - **SASL** (feature `sasl`): `?auth=sasl` logs in with DIGEST-MD5 as the URL's user.
//!
//! `zk[s]://[user:password@]host:port[,host:port…][/chroot][?session_timeout_ms=N&root=/path&auth=digest|sasl]`.

#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
#[cfg(feature = "conformance")]
pub mod conformance;
mod diagnose;
mod inspect;
mod service;
#[cfg(feature = "tls")]
mod tls;

pub use config::ZkConfig;
pub use service::ZkLockService;
pub use zookeeper_client;

/// The pure parts that the fuzz targets (`fuzz/`) check: behind the `fuzzing` feature, with
/// no stability promise.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::service::{fence_of, node_prefix, precedes, queue_order, sequence_of};
}

/// The backend name in errors, logs and metrics.
pub const BACKEND: &str = "zookeeper";
