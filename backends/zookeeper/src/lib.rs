//! # palisade-zookeeper
//!
//! Palisade's ZooKeeper lock service: the classic lock recipe (Chubby/Curator lineage) with a
//! fence that cannot go backwards.
//!
//! - **Acquire**: create an `EPHEMERAL_SEQUENTIAL` node `lock-<owner token>-<sequence>` under the
//!   resource's parent `<root>/<domain>/<id>` (default root `/palisade/locks`; parents are
//!   container nodes, created on demand). The lowest sequence holds the lock.
//! - **Fence = the lock node's `czxid`**: the ensemble-wide transaction id of its creation,
//!   monotonic across leader changes. Not the sequence suffix: a parent deleted and recreated
//!   (or a container garbage-collected) restarts that.
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
//! `zk://[user:password@]host:port[,host:port…][/chroot][?session_timeout_ms=N&root=/path]`.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod config;
#[cfg(feature = "conformance")]
pub mod conformance;
mod service;

pub use config::ZkConfig;
pub use service::ZkLockService;
pub use zookeeper_client;

/// The pure parts that the fuzz targets (`fuzz/`) check: reachable only in a `cargo fuzz` build.
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::service::{czxid_fence, node_prefix, precedes, queue_order, sequence_of};
}

/// The backend name in errors, logs and metrics.
pub const BACKEND: &str = "zookeeper";
