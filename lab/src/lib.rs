//! # palisade-lab
//!
//! Real servers for tests and benchmarks, in one place: what Palisade's certification
//! (`palisade-conformance`), its backend tests and `palisade compare --local` start.
//!
//! - [`servers`]: a server process of the caller's own on a free loopback port with a data
//!   directory of its own, which it can kill, restart with or without its data, and removes on
//!   drop: Redis ([`servers::LoopbackServer::redis`]), a Sentinel group
//!   ([`servers::RedisSentinels`]), a Redis Cluster ([`servers::RedisCluster`]), etcd and
//!   ZooKeeper clusters whose leader can be killed ([`servers::EtcdCluster`],
//!   [`servers::ZkEnsemble`]), PostgreSQL ([`servers::PostgresServer`]); and each networked
//!   server speaking only TLS ([`servers::LoopbackServer::redis_tls`],
//!   [`servers::LoopbackServer::etcd_tls`], [`servers::ZkEnsemble::start_tls`],
//!   [`servers::PostgresServer::start_tls`]).
//! - [`tls`]: throwaway certificates, questions over TLS and a TLS terminator, for the
//!   TLS-only servers.
//! - [`netns`]: a bridge of network namespaces on this machine (root and iproute2), whose
//!   hosts can be cut off in silence and healed: partitions a proxy cannot fake.
//!
//! The programs come from the machine (Debian's packages; the test command installs them): a
//! missing program is an error that says so, never a skip.

#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod claims;
pub mod netns;
pub mod servers;
pub mod services;
pub mod tls;
