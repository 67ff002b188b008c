//! Connection settings and the `etcd://` URL.

use std::fmt;
use std::time::Duration;

use palisade_core::{Error, ErrorKind, Result};

use crate::BACKEND;

/// How to reach etcd, how patient to be, and how long a session survives silence.
#[derive(Clone)]
pub struct EtcdConfig {
    /// `host:port` of each member; the client balances over them and fails over.
    pub endpoints: Vec<String>,
    /// TLS to every member (`etcds://`; needs this crate's `tls` feature).
    pub tls: bool,
    /// User name for etcd's authentication, if enabled.
    pub user: Option<String>,
    /// Password for `user`. Never logged or printed.
    pub password: Option<String>,
    /// TTL of the client's session lease: how long after this process stops (crash, SIGSTOP,
    /// partition) the server gives its locks away. Whole seconds, at least 1. Default: 10 s.
    /// Every grant's TTL is capped at what the session is known to have left.
    pub session_ttl: Duration,
    /// How long one connection attempt may take. Default: 2 s.
    pub connect_timeout: Duration,
    /// How long one request may take before it fails (as `OutcomeUnknown` for writes).
    /// Default: 5 s.
    pub request_timeout: Duration,
    /// Prefix of every key Palisade writes (so it can share a cluster). Default: `palisade/`.
    pub key_prefix: String,
    /// For `etcds://`: the CA certificate(s), PEM, to trust instead of the platform roots.
    pub tls_root_cert: Option<Vec<u8>>,
    /// For `etcds://`: a client certificate and key, PEM, for mutual TLS.
    pub tls_client_identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl EtcdConfig {
    /// Settings for these endpoints (`host:port` each) with the defaults above.
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            tls: false,
            user: None,
            password: None,
            session_ttl: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            key_prefix: "palisade/".to_string(),
            tls_root_cert: None,
            tls_client_identity: None,
        }
    }

    /// Parses `etcd://[user:password@]host:port[,host:port…][?session_ttl_s=N&prefix=P]`
    /// (`etcds://` for TLS). User and password are percent-decoded
    /// ([`ConnectionUrl`](palisade_core::spi::ConnectionUrl)): a password with `/`, `?`, `#` or `%`
    /// is written `%2F`, `%3F`, `%23`, `%25`.
    pub fn from_url(url: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::new(
                ErrorKind::InvalidConfig,
                BACKEND,
                format!("{why}: {} (expected etcd://host:port[,host:port…])", palisade_core::redact_url(url)),
            )
        };
        let parsed = palisade_core::spi::ConnectionUrl::parse(url).map_err(|why| bad(&why))?;
        let tls = match parsed.scheme.as_str() {
            "etcd" => false,
            "etcds" => true,
            _ => return Err(bad("not an etcd URL")),
        };
        if !parsed.path.trim_end_matches('/').is_empty() {
            return Err(bad("an etcd URL has no path (use ?prefix= for a key prefix)"));
        }
        let mut config = EtcdConfig::new(Vec::<String>::new());
        config.tls = tls;
        if let Some(user) = parsed.user {
            if user.is_empty() {
                return Err(bad("empty user name"));
            }
            config.user = Some(user);
            config.password = Some(parsed.password.unwrap_or_default());
        }
        for (host, port) in &parsed.hosts {
            let Some(port) = port else { return Err(bad("every endpoint needs host:port")) };
            config.endpoints.push(format!("{host}:{port}"));
        }
        for (name, value) in &parsed.query {
            match (name.as_str(), value.as_str()) {
                ("session_ttl_s", v) => {
                    let secs: u64 = v.parse().map_err(|_| bad("session_ttl_s must be whole seconds"))?;
                    config.session_ttl = Duration::from_secs(secs);
                }
                ("prefix", v) if !v.is_empty() => config.key_prefix = v.to_string(),
                _ => return Err(bad(&format!("unknown or malformed parameter `{name}`"))),
            }
        }
        config.validate()?;
        Ok(config)
    }

    /// Trusts the CA certificate(s) in `pem` for `etcds://` instead of the platform roots.
    pub fn with_tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_cert = Some(pem.into());
        self
    }

    /// Presents a client certificate (mutual TLS) on `etcds://` connections.
    pub fn with_tls_client_identity(
        mut self,
        certificate: impl Into<Vec<u8>>,
        private_key: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls_client_identity = Some((certificate.into(), private_key.into()));
        self
    }

    /// The endpoints as a URL without user or password, for logs and errors.
    pub fn redacted_url(&self) -> String {
        let scheme = if self.tls { "etcds" } else { "etcd" };
        format!("{scheme}://{}", self.endpoints.join(","))
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let invalid = |m: String| Err(Error::new(ErrorKind::InvalidConfig, BACKEND, m));
        if self.endpoints.is_empty() {
            return invalid("no etcd endpoints".to_string());
        }
        if self.session_ttl < Duration::from_secs(1) || self.session_ttl.subsec_nanos() != 0 {
            return invalid(format!("session TTL must be whole seconds ≥ 1 s, got {:?}", self.session_ttl));
        }
        if self.session_ttl > Duration::from_secs(24 * 3600) {
            return invalid(format!("session TTL above 24 h: {:?}", self.session_ttl));
        }
        if self.connect_timeout.is_zero() || self.request_timeout.is_zero() {
            return invalid("timeouts must be above zero".to_string());
        }
        if self.key_prefix.is_empty() {
            return invalid("empty key prefix".to_string());
        }
        if !self.tls && (self.tls_root_cert.is_some() || self.tls_client_identity.is_some()) {
            return invalid(format!("TLS certificates are set but {} is not etcds://", self.redacted_url()));
        }
        if self.tls && !cfg!(feature = "tls") {
            return Err(Error::new(
                ErrorKind::Unsupported,
                BACKEND,
                "etcds:// (TLS) needs the `tls` feature of palisade-etcd (palisade feature `etcd-tls`)",
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("url", &self.redacted_url())
            .field("session_ttl", &self.session_ttl)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("key_prefix", &self.key_prefix)
            .field("tls_root_cert", &self.tls_root_cert.as_ref().map(|_| "<set>"))
            .field("tls_client_identity", &self.tls_client_identity.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        let c = EtcdConfig::from_url("etcd://127.0.0.1:2379").unwrap();
        assert_eq!(c.endpoints, ["127.0.0.1:2379"]);
        assert!(!c.tls && c.user.is_none());
        let c = EtcdConfig::from_url("etcd://app:s3cret@a:1,b:2,c:3/?session_ttl_s=3&prefix=x/").unwrap();
        assert_eq!(c.endpoints, ["a:1", "b:2", "c:3"]);
        assert_eq!((c.user.as_deref(), c.password.as_deref()), (Some("app"), Some("s3cret")));
        assert_eq!(c.session_ttl, Duration::from_secs(3));
        assert_eq!(c.key_prefix, "x/");
        assert_eq!(c.redacted_url(), "etcd://a:1,b:2,c:3");
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn bad_urls_are_config_errors() {
        for url in [
            "http://a:1",
            "etcd://",
            "etcd://a",
            "etcd://a:x",
            "etcd://a:1,",
            "etcd://a:0",
            "etcd://:1",
            "etcd://a:1?session_ttl_s=0",
            "etcd://a:1?session_ttl_s=-1",
            "etcd://a:1?bogus=1",
            "etcd://:pw@a:1",
        ] {
            let err = EtcdConfig::from_url(url).err().map(|e| e.kind());
            assert_eq!(err, Some(ErrorKind::InvalidConfig), "{url}");
        }
        let err = EtcdConfig::from_url("etcd://u:hunter2@a:1?bogus=1").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn tls_without_the_feature_is_unsupported() {
        let result = EtcdConfig::from_url("etcds://a:1");
        if cfg!(feature = "tls") {
            assert!(result.unwrap().tls);
        } else {
            assert_eq!(result.unwrap_err().kind(), ErrorKind::Unsupported);
        }
    }
}
