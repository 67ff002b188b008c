//! Connection settings.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use palisade_core::{Error, ErrorKind, Result};

use crate::service::BACKEND;

/// How to reach Redis and how patient to be.
#[derive(Clone)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]` or `rediss://…` (TLS, with the `tls` feature).
    pub url: String,
    /// How long one connection attempt may take. Default: 2 s.
    pub connect_timeout: Duration,
    /// How long a command may take before it is reported as failed with an unknown outcome.
    /// Default: 5 s (never the client library's 500 ms).
    pub response_timeout: Duration,
    /// Accept a `maxmemory-policy` other than `noeviction`. Default: false. Set it only if this
    /// Redis never reaches `maxmemory`: once it does, `volatile-*` policies evict held locks
    /// (a second client is granted the lock inside the first one's TTL; only the fenced store
    /// still orders their writes) and `allkeys-*` policies also evict fence keys (fences
    /// restart low: a regression `lock_checked` must repair).
    pub allow_eviction: bool,
    /// For `rediss://` only: the CA certificate(s), PEM, to trust instead of the platform's
    /// root store (a private CA, a self-signed server). Default: none (platform roots).
    pub tls_root_cert: Option<Vec<u8>>,
    /// For `rediss://` only: a client certificate and key for mutual TLS
    /// (`tls-auth-clients yes`). Default: none.
    pub tls_client_identity: Option<TlsClientIdentity>,
    /// Wait for replicas to acknowledge every grant (`WAIT`) before returning it. Default:
    /// none (a `redis+sentinel://` URL's `wait_replicas` / `wait_timeout_ms` set it).
    pub replica_acks: Option<ReplicaAcks>,
    /// Where to connect instead of an address a server announces, `"host:port"` to
    /// `"host:port"`, for `redis+sentinel://` (the master the Sentinels name) and
    /// `redis+cluster://` (the seeds and every node the cluster names): for clients that reach
    /// the servers through NAT, a port forward or a TCP proxy, where the addresses the servers
    /// know themselves by do not route (Lettuce's `MappingSocketAddressResolver`, ioredis'
    /// `natMap`). An address not in the map is dialled as announced. Default: empty. Refused
    /// on `redis://` and `rediss://` URLs, where the URL already is the address dialled.
    pub address_map: BTreeMap<String, String>,
}

/// Replica acknowledgement of grants: `WAIT replicas timeout` right behind the acquire
/// script, in one pipeline on one connection (one round trip; `WAIT` counts what its own
/// connection wrote, so it must travel with the script, or after a failover followed in
/// between it would measure another master). It is sent behind every acquire attempt, also
/// one that finds the lock held (its answer is then ignored): while fewer replicas than
/// `replicas` are connected, every attempt takes up to `timeout`. A grant acknowledged by
/// fewer replicas is released and the acquire fails with
/// [`ErrorKind::Unavailable`] (retryable), naming how many acknowledged: a failover to a
/// replica that had not received it would hand out its fence again (a regression the store
/// catches and `lock_checked` repairs). Acknowledgement narrows that window; it does not make
/// Redis replication synchronous (a replica may still be promoted before applying it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaAcks {
    /// How many replicas must acknowledge.
    pub replicas: u32,
    /// How long to wait for them.
    pub timeout: Duration,
}

/// A client certificate and its private key, both PEM, for mutual TLS. Never printed.
#[derive(Clone)]
pub struct TlsClientIdentity {
    /// The client certificate chain, PEM.
    pub certificate: Vec<u8>,
    /// The client's private key, PEM.
    pub private_key: Vec<u8>,
}

impl fmt::Debug for TlsClientIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TlsClientIdentity(<redacted>)")
    }
}

impl RedisConfig {
    /// Settings for `url` with the defaults above.
    pub fn new(url: impl Into<String>) -> Self {
        RedisConfig {
            url: url.into(),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(5),
            allow_eviction: false,
            tls_root_cert: None,
            tls_client_identity: None,
            replica_acks: None,
            address_map: BTreeMap::new(),
        }
    }

    /// Waits for `replicas` replicas to acknowledge every grant, up to `timeout` ([`ReplicaAcks`]).
    pub fn with_replica_acks(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_acks = (replicas > 0).then_some(ReplicaAcks { replicas, timeout });
        self
    }

    /// Connects to `reachable` wherever a Sentinel or a cluster node names `announced` (both
    /// `"host:port"`; see [`address_map`](Self::address_map)).
    pub fn with_address_mapped(mut self, announced: impl Into<String>, reachable: impl Into<String>) -> Self {
        self.address_map.insert(announced.into(), reachable.into());
        self
    }

    /// Trusts the CA certificate(s) in `pem` for `rediss://` instead of the platform roots.
    pub fn with_tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_cert = Some(pem.into());
        self
    }

    /// Presents a client certificate (mutual TLS) on `rediss://` connections.
    pub fn with_tls_client_identity(
        mut self,
        certificate: impl Into<Vec<u8>>,
        private_key: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls_client_identity =
            Some(TlsClientIdentity { certificate: certificate.into(), private_key: private_key.into() });
        self
    }

    /// Whether TLS certificates were configured (they only make sense with `rediss://`).
    pub(crate) fn has_tls_material(&self) -> bool {
        self.tls_root_cert.is_some() || self.tls_client_identity.is_some()
    }

    /// The URL without user, password or query ([`redact_url`](palisade_core::redact_url)), for logs and errors.
    pub fn redacted_url(&self) -> String {
        palisade_core::redact_url(&self.url)
    }

    pub(crate) fn check_scheme(&self) -> Result<()> {
        if self.url.starts_with("redis+sentinel://") || self.url.starts_with("redis+cluster://") {
            return if self.has_tls_material() {
                Err(Error::new(
                    ErrorKind::Unsupported,
                    BACKEND,
                    "TLS through Sentinel or to a cluster is not supported: use them on a private network",
                ))
            } else {
                Ok(())
            };
        }
        if !self.address_map.is_empty() && (self.url.starts_with("redis://") || self.url.starts_with("rediss://")) {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                BACKEND,
                format!(
                    "an address map applies to redis+sentinel:// and redis+cluster:// URLs only, not {}",
                    self.redacted_url()
                ),
            ));
        }
        if self.url.starts_with("redis://") {
            // Certificates on a plain connection mean the URL or the settings are wrong; a
            // silent plain-text connection would be the worst way to find out.
            return if self.has_tls_material() {
                Err(Error::new(
                    ErrorKind::InvalidConfig,
                    BACKEND,
                    format!("TLS certificates are set but {} is not a rediss:// URL", self.redacted_url()),
                ))
            } else {
                Ok(())
            };
        }
        if self.url.starts_with("rediss://") {
            return if cfg!(feature = "tls") {
                Ok(())
            } else {
                Err(Error::new(
                    ErrorKind::Unsupported,
                    BACKEND,
                    "rediss:// (TLS) needs the `tls` feature of palisade-redis (palisade feature `redis-tls`)",
                ))
            };
        }
        Err(Error::new(
            ErrorKind::InvalidConfig,
            BACKEND,
            format!(
                "not a Redis URL: {} (expected redis://host:port, redis+sentinel://host:port,…/MASTER_NAME or \
                 redis+cluster://host:port,…)",
                self.redacted_url()
            ),
        ))
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.redacted_url())
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("allow_eviction", &self.allow_eviction)
            .field("tls_root_cert", &self.tls_root_cert.as_ref().map(|_| "<set>"))
            .field("tls_client_identity", &self.tls_client_identity)
            .field("replica_acks", &self.replica_acks)
            .field("address_map", &self.address_map)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        let c = RedisConfig::new("redis://app:s3cret@10.0.0.1:6379/2?x=y");
        assert_eq!(c.redacted_url(), "redis://10.0.0.1:6379/2");
        assert!(!format!("{c:?}").contains("s3cret"));
        assert_eq!(RedisConfig::new("redis://:s3cret@h:1").redacted_url(), "redis://h:1");
        assert_eq!(RedisConfig::new("redis://h:1").redacted_url(), "redis://h:1");
        assert_eq!(RedisConfig::new("nonsense").redacted_url(), "<malformed URL>");
    }

    #[test]
    fn schemes_are_checked() {
        assert!(RedisConfig::new("redis://h:1").check_scheme().is_ok());
        assert_eq!(RedisConfig::new("http://h:1").check_scheme().unwrap_err().kind(), ErrorKind::InvalidConfig);
        if !cfg!(feature = "tls") {
            assert_eq!(RedisConfig::new("rediss://h:1").check_scheme().unwrap_err().kind(), ErrorKind::Unsupported);
        }
        let plain_with_ca = RedisConfig::new("redis://h:1").with_tls_root_cert(b"pem".to_vec());
        assert_eq!(plain_with_ca.check_scheme().unwrap_err().kind(), ErrorKind::InvalidConfig);
        // An address map on a URL that names the one server dialled is a mistake, said at once.
        let mapped = RedisConfig::new("redis://h:1").with_address_mapped("10.0.0.1:6379", "127.0.0.1:16379");
        let e = mapped.check_scheme().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig);
        assert!(e.to_string().contains("redis+sentinel:// and redis+cluster://"), "{e}");
        let cluster = RedisConfig::new("redis+cluster://h:1").with_address_mapped("10.0.0.1:6379", "127.0.0.1:16379");
        assert!(cluster.check_scheme().is_ok());
    }

    #[test]
    fn keys_never_show() {
        let c = RedisConfig::new("rediss://h:1").with_tls_client_identity(b"CERT".to_vec(), b"SECRETKEY".to_vec());
        let shown = format!("{c:?}");
        assert!(!shown.contains("SECRETKEY") && !shown.contains("CERT"), "{shown}");
    }
}
