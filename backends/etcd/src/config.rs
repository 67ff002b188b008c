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
    /// (`etcds://` for TLS).
    pub fn from_url(url: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::new(
                ErrorKind::InvalidConfig,
                BACKEND,
                format!("{why}: {} (expected etcd://host:port[,host:port…])", palisade_core::redact_url(url)),
            )
        };
        let (tls, rest) = if let Some(rest) = url.strip_prefix("etcd://") {
            (false, rest)
        } else if let Some(rest) = url.strip_prefix("etcds://") {
            (true, rest)
        } else {
            return Err(bad("not an etcd URL"));
        };
        let (authority, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let authority = authority.trim_end_matches('/');
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let mut config = EtcdConfig::new(Vec::<String>::new());
        config.tls = tls;
        if let Some(userinfo) = userinfo {
            let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            if user.is_empty() {
                return Err(bad("empty user name"));
            }
            config.user = Some(user.to_string());
            config.password = Some(password.to_string());
        }
        for host in hosts.split(',') {
            let valid = host
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && !h.contains('/') && p.parse::<u16>().is_ok_and(|p| p > 0));
            if !valid {
                return Err(bad("every endpoint needs host:port"));
            }
            config.endpoints.push(host.to_string());
        }
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("session_ttl_s", v)) => {
                    let secs: u64 = v.parse().map_err(|_| bad("session_ttl_s must be whole seconds"))?;
                    config.session_ttl = Duration::from_secs(secs);
                }
                Some(("prefix", v)) if !v.is_empty() => config.key_prefix = v.to_string(),
                _ => return Err(bad(&format!("unknown or malformed parameter `{pair}`"))),
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

    /// The endpoints as a URL with any password replaced by `***`, for logs and errors.
    pub fn redacted_url(&self) -> String {
        let scheme = if self.tls { "etcds" } else { "etcd" };
        let user = match (&self.user, &self.password) {
            (Some(u), Some(_)) => format!("{u}:***@"),
            (Some(u), None) => format!("{u}@"),
            _ => String::new(),
        };
        format!("{scheme}://{user}{}", self.endpoints.join(","))
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
        assert_eq!(c.redacted_url(), "etcd://app:***@a:1,b:2,c:3");
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
