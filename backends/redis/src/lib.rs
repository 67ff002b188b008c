//! # palisade-redis
//!
//! Palisade's Redis lock service: the incident's fix (a fenced lock), done atomically.
//!
//! - **Acquire is one round trip**: one Lua script runs `SET lock:{d:id} TOKEN NX PX ttl` and,
//!   when it took the lock, `INCR fence:{d:id}`, returning the fence (read back as the key's
//!   decimal string from 2⁵³ on, where Lua's doubles are not exact). There is never a lock
//!   without a fence nor a fence spent without a lock: a counter that cannot be incremented fails
//!   the script, which deletes the lock it just set. The braces are a Redis Cluster hash tag:
//!   the keys live in one slot, so the script is legal on a cluster too.
//! - **Fence keys never expire** and the library never deletes them.
//! - **Release and extend** are compare-token scripts: only the holder's 128-bit owner token
//!   can release or extend. A release publishes on `palisade:released:lock:{d:id}`, which wakes
//!   waiters at once, but only for a lock a waiter marked: the attempt that finds the lock held,
//!   from a caller that will wait, appends `+` to the holder's token in the same script, so an
//!   uncontended release (a compare-and-delete) publishes nothing. Waiters also wake when the
//!   holder's remaining TTL (returned by the acquire script) runs out, and every 250 ms at the
//!   latest.
//! - **Eviction guard**: at connect, `maxmemory-policy` must be `noeviction`: `volatile-*`
//!   policies evict held locks (their keys carry a PX expiry) and `allkeys-*` ones fence keys.
//!   Anything else fails the connection unless [`RedisConfig::allow_eviction`] is set.
//! - **Fence regression** (Redis restarted without persistence, failover to a lagging replica,
//!   `FLUSHALL`): the counter restarts low. Acquire with
//!   [`LockServiceExt::lock_checked`](palisade_core::LockServiceExt::lock_checked), which
//!   compares the grant with the store's watermark and moves the counter above it
//!   ([`LockService::advance_fence`](palisade_core::LockService::advance_fence)) before
//!   granting again. Stores reject the low fences meanwhile: safety never depends on Redis.
//!
//! ## Durability settings that avoid regressions
//!
//! | setting | what survives | cost (see the README's benchmark) |
//! |---|---|---|
//! | none (`--save '' --appendonly no`) | nothing: a restart loses every fence counter | baseline |
//! | `appendonly yes`, `appendfsync everysec` | a crash loses up to 1 s of increments | small |
//! | `appendonly yes`, `appendfsync always` | every acknowledged increment | one fsync per acquire |
//! | `WAIT 1 100` after acquire on a replicated primary | failover to that replica | a replica round trip |
//!
//! With any of them, keep `lock_checked` (or your own watermark check) in place: it is what
//! turns a lost counter into a logged, repaired incident instead of a stuck system.
//!
//! ## Connecting
//!
//! `redis://[user:password@]host:port[/db]`; `rediss://` needs this crate's `tls` feature
//! and verifies the server against the platform's root certificates, or against the CA you
//! give [`RedisConfig::with_tls_root_cert`] (a private CA); mutual TLS via
//! [`RedisConfig::with_tls_client_identity`].
//! Connect and response timeouts are explicit ([`RedisConfig`]): the client's own 500 ms
//! default response timeout would make a slow server look like a lost lock.
//!
//! ## Behind Sentinel
//!
//! `redis+sentinel://[user:password@]host:port[,host:port…]/MASTER_NAME`: the hosts are the
//! Sentinels (port 26379 when omitted), the user-info is the **master's** credentials as in a
//! `redis://` URL, and the query takes `sentinel_username`, `sentinel_password` (the
//! Sentinels' own), `db`, and `wait_replicas` / `wait_timeout_ms` ([`ReplicaAcks`]). The
//! service asks the Sentinels in order for the master, and again whenever a command fails
//! without an answer or the old master answers `READONLY` (demoted to a replica): after a
//! failover it moves to the promoted replica within the Sentinels' failover time, resending
//! the idempotent scripts as it does for a lost reply.
//!
//! **Release notifications** follow the master too: the subscription is made on the master
//! the Sentinels name at that moment, made again on the new master as soon as the service
//! follows a failover, and left when its server stops answering (a `PING` every second,
//! answered within the response timeout). What remains: between the old master's death and
//! the new subscription (the Sentinels' failover time, then one connection), releases are not
//! heard and waiters poll every 250 ms; a contended acquire waits for a subscription at most
//! `min(wait, 1 s)`, and only while the first subscription on a master the service has just
//! connected to is being made (bounded by the connect timeout); while no subscription can be
//! made (the Sentinels name an address that does not answer) it does not wait for one at all.
//!
//! **What a failover can lose.** Replication is asynchronous: a replica promoted before it
//! received the last grants hands their fences out again, and locks granted on the old master
//! may be missing on the new one (a second holder inside the first one's TTL). Both are fence
//! regressions in the sense of the rules: the store refuses the duplicate or lower fence, and
//! [`lock_checked`](palisade_core::LockServiceExt::lock_checked) moves the counter past the
//! store's watermark. [`ReplicaAcks`] narrows the window (a grant is returned only once
//! `wait_replicas` replicas acknowledged it); nothing closes it but the store's check. Tested
//! against a master, a replica and three Sentinels of the test's own, the master killed
//! mid-workload (`tests/sentinel.rs`), and certified against the shared group, its faulty
//! client's master behind a fault proxy (`tests/conformance.rs`; the report is the
//! repository's `docs/conformance/redis.md`).
//!
//! ## On a Redis Cluster
//!
//! `redis+cluster://[user:password@]host:port[,host:port…]` (seed nodes; the client learns the
//! rest). Every key of a resource carries the hash tag `{d:id}`, so its lock and fence live in
//! one slot and each script runs on that slot's primary; the cluster client follows `MOVED`
//! and `ASK` when slots move and when a replica is promoted. A primary's failover can lose
//! what it had not replicated, exactly as behind Sentinel: the store refuses the regression,
//! `lock_checked` repairs it. Release notifications are published cluster-wide and heard
//! through one node's subscription: the first seed that accepts it, the next seed when it dies
//! or stops answering `PING`. What remains: until then (and while no seed answers) waiters
//! poll every 250 ms, and no acquire waits for a subscription to a dead seed. Nodes the
//! client learned that are not seeds are not used for notifications: list more than one seed.
//!
//! **A release resent by the cluster client.** The cluster client resends a request whose
//! connection dropped by itself, so the service cannot know that a release it sent twice was
//! applied by the first send. On a cluster each release call therefore names a marker,
//! `released:{d:id}:<nonce>` (in the lock's slot; a random nonce per call), which the release
//! that deletes the lock sets for twice the response timeout plus the connect timeout and a
//! second (12 s with the defaults): a resend of the same call that finds the lock gone finds
//! its marker and answers success, even if another holder took and released the lock in
//! between; a caller's own repeat is a new call and gets `NotHolder`, as everywhere. Budget
//! one small key per release in that window (about 100 bytes), and allow `released:*` in ACL
//! key patterns next to `lock:*` and `fence:*`.
//!
//! Tested against three primaries with a replica each, a resource's primary killed
//! mid-workload (`tests/cluster.rs`), and certified against the shared cluster
//! (`tests/conformance.rs`), its faulty client's six nodes each behind a fault proxy.
//!
//! ## Behind NAT or a proxy
//!
//! Sentinels name the master, and cluster nodes name each other, by the addresses the servers
//! know themselves by. A client that reaches them some other way (NAT, a port forward, a TCP
//! proxy) maps each announced `host:port` to the one it can dial:
//! [`RedisConfig::with_address_mapped`] ([`RedisConfig::address_map`]). The certification's
//! faulty clients use it to put a fault proxy in front of every server.

#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
#[cfg(feature = "conformance")]
pub mod conformance;
mod connection;
mod diagnose;
mod errors;
mod inspect;
pub mod scripts;
mod sentinel;
pub mod server;
mod service;
mod waiters;

pub use config::{RedisConfig, ReplicaAcks, TlsClientIdentity};
pub use service::RedisLockService;

/// The pure parts that the fuzz targets (`fuzz/`) check: behind the `fuzzing` feature, with
/// no stability promise.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::connection::ClusterTarget;
    pub use crate::sentinel::SentinelTarget;
}
