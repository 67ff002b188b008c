//! Connection settings and the `zk://` URL.

use std::fmt;
use std::time::Duration;

use palisade_core::{Error, ErrorKind, Result};

use crate::BACKEND;

/// How to reach ZooKeeper and how long a session survives silence.
#[derive(Clone)]
pub struct ZkConfig {
    /// `host:port` of each server of the ensemble.
    pub servers: Vec<String>,
    /// A chroot for every path (`/app`), or none.
    pub chroot: Option<String>,
    /// The session timeout: how long after this process stops (crash, SIGSTOP, partition) the
    /// ensemble expires its session and deletes its lock nodes. The server clamps it to
    /// [2, 20] × its `tickTime`. Default: 10 s.
    pub session_timeout: Duration,
    /// How long one connection attempt may take. Default: 2 s.
    pub connect_timeout: Duration,
    /// How long one request may take. Default: 5 s.
    pub request_timeout: Duration,
    /// Where lock nodes live: `<root>/<domain>/<id>/lock-<owner token>-<sequence>`.
    /// Default: `/palisade/locks`.
    pub root: String,
    /// Digest identity (`user`, `password`): lock nodes are created with the `creator_all`
    /// ACL, so only this identity can delete them. Without it nodes are open to anyone.
    pub digest: Option<(String, String)>,
    /// Log in with SASL DIGEST-MD5 as [`digest`](Self::digest)'s user (`?auth=sasl`; needs this
    /// crate's `sasl` feature) instead of adding it as a `digest` identity: what an ensemble
    /// that enforces SASL (`enforce.auth.schemes=sasl`) demands. Lock nodes get the
    /// `creator_all` ACL for the SASL identity the same way.
    pub sasl: bool,
    /// TLS to every server (`zks://`; needs this crate's `tls` feature). ZooKeeper ensembles
    /// are signed by private CAs: `zks://` needs [`tls_root_cert`](Self::tls_root_cert).
    pub tls: bool,
    /// PEM of the CA certificate(s) that signed the servers' certificates.
    pub tls_root_cert: Option<Vec<u8>>,
    /// PEM of a client certificate chain and its private key, for ensembles that demand one
    /// (`ssl.clientAuth=need`).
    pub tls_client_identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl ZkConfig {
    /// Settings for these servers (`host:port` each) with the defaults above.
    pub fn new<I, S>(servers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ZkConfig {
            servers: servers.into_iter().map(Into::into).collect(),
            chroot: None,
            session_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            root: "/palisade/locks".to_string(),
            digest: None,
            sasl: false,
            tls: false,
            tls_root_cert: None,
            tls_client_identity: None,
        }
    }

    /// Parses `zk://[user:password@]host:port[,host:port…][/chroot][?session_timeout_ms=N&root=/path&auth=digest|sasl]`,
    /// or `zks://…` for TLS to every server (the scheme-with-`s` convention of `rediss://`
    /// and `etcds://`; give the CA with [`with_tls_root_cert`](Self::with_tls_root_cert)).
    /// `user:password` is a digest identity, or a SASL DIGEST-MD5 login with `auth=sasl`;
    /// percent-decoded as every backend's is ([`ConnectionUrl`](palisade_core::spi::ConnectionUrl)).
    pub fn from_url(url: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::new(
                ErrorKind::InvalidConfig,
                BACKEND,
                format!(
                    "{why}: {} (expected zk:// or zks://host:port[,host:port…][/chroot])",
                    palisade_core::redact_url(url)
                ),
            )
        };
        let parsed = palisade_core::spi::ConnectionUrl::parse(url).map_err(|why| bad(&why))?;
        let tls = match parsed.scheme.as_str() {
            "zk" => false,
            "zks" => true,
            _ => return Err(bad("not a ZooKeeper URL")),
        };
        let mut config = ZkConfig::new(Vec::<String>::new());
        config.tls = tls;
        if let Some(user) = parsed.user {
            let Some(password) = parsed.password.filter(|_| !user.is_empty()) else {
                return Err(bad("a digest identity needs user:password"));
            };
            config.digest = Some((user, password));
        }
        for (host, port) in &parsed.hosts {
            let Some(port) = port else { return Err(bad("every server needs host:port")) };
            config.servers.push(format!("{host}:{port}"));
        }
        let chroot = parsed.path.as_str();
        config.chroot = (!chroot.is_empty() && chroot != "/").then(|| chroot.trim_end_matches('/').to_string());
        for (name, value) in &parsed.query {
            match name.as_str() {
                "session_timeout_ms" => {
                    let ms: u64 = value.parse().map_err(|_| bad("session_timeout_ms must be whole milliseconds"))?;
                    config.session_timeout = Duration::from_millis(ms);
                }
                "root" => config.root = value.clone(),
                "auth" => match value.as_str() {
                    "digest" => config.sasl = false,
                    "sasl" => config.sasl = true,
                    _ => return Err(bad("auth must be digest or sasl")),
                },
                _ => return Err(bad(&format!("unknown or malformed parameter `{name}`"))),
            }
        }
        config.validate()?;
        Ok(config)
    }

    /// Trusts the CA certificate(s) in `pem` (PEM) for `zks://`.
    pub fn with_tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_cert = Some(pem.into());
        self
    }

    /// Presents a client certificate (mutual TLS) on `zks://` connections: the PEM of the
    /// certificate chain and of its private key.
    pub fn with_tls_client_identity(
        mut self,
        certificate: impl Into<Vec<u8>>,
        private_key: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls_client_identity = Some((certificate.into(), private_key.into()));
        self
    }

    /// The servers as a URL without user or password, for logs and errors.
    pub fn redacted_url(&self) -> String {
        let scheme = if self.tls { "zks" } else { "zk" };
        format!("{scheme}://{}{}", self.servers.join(","), self.chroot.as_deref().unwrap_or(""))
    }

    /// [`validate`](Self::validate), and what only a config ready to connect has: the CA of a
    /// `zks://` URL (which [`with_tls_root_cert`](Self::with_tls_root_cert) gives after
    /// [`from_url`](Self::from_url)).
    pub(crate) fn validate_complete(&self) -> Result<()> {
        self.validate()?;
        if self.tls && self.tls_root_cert.is_none() {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                BACKEND,
                "zks:// needs the CA that signed the servers' certificates (ZkConfig::with_tls_root_cert)",
            ));
        }
        Ok(())
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let invalid = |m: String| Err(Error::new(ErrorKind::InvalidConfig, BACKEND, m));
        if self.servers.is_empty() {
            return invalid("no ZooKeeper servers".to_string());
        }
        if self.session_timeout < Duration::from_millis(100) || self.session_timeout > Duration::from_secs(3600) {
            return invalid(format!("session timeout {:?} outside 100 ms..1 h", self.session_timeout));
        }
        if self.connect_timeout.is_zero() || self.request_timeout.is_zero() {
            return invalid("timeouts must be above zero".to_string());
        }
        if !self.tls && (self.tls_root_cert.is_some() || self.tls_client_identity.is_some()) {
            return invalid("a TLS certificate was given for a plaintext zk:// URL (use zks://)".to_string());
        }
        if self.tls && !cfg!(feature = "tls") {
            return invalid(
                "zks:// (TLS) needs the `tls` feature of palisade-zookeeper (palisade feature `zookeeper-tls`)"
                    .to_string(),
            );
        }
        if self.sasl && !cfg!(feature = "sasl") {
            return invalid(
                "auth=sasl needs the `sasl` feature of palisade-zookeeper (palisade feature `zookeeper-sasl`)"
                    .to_string(),
            );
        }
        if self.sasl && self.digest.is_none() {
            return invalid("auth=sasl needs user:password in the URL".to_string());
        }
        let path_ok = |p: &str| p.starts_with('/') && p.len() > 1 && !p.ends_with('/') && !p.contains("//");
        if !path_ok(&self.root) {
            return invalid(format!("root {:?} must be an absolute path like /palisade/locks", self.root));
        }
        if let Some(c) = &self.chroot
            && !path_ok(c)
        {
            return invalid(format!("chroot {c:?} must be an absolute path"));
        }
        Ok(())
    }
}

impl fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkConfig")
            .field("url", &self.redacted_url())
            .field("session_timeout", &self.session_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("root", &self.root)
            .field("sasl", &self.sasl)
            .field("tls_root_cert", &self.tls_root_cert.as_ref().map(|_| "<set>"))
            .field("tls_client_identity", &self.tls_client_identity.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        let c = ZkConfig::from_url("zk://127.0.0.1:2181").unwrap();
        assert_eq!(c.servers, ["127.0.0.1:2181"]);
        assert!(c.chroot.is_none() && c.digest.is_none());
        let c = ZkConfig::from_url("zk://app:pw@a:1,b:2/apps/x?session_timeout_ms=3000&root=/l").unwrap();
        assert_eq!(c.servers, ["a:1", "b:2"]);
        assert_eq!(c.chroot.as_deref(), Some("/apps/x"));
        assert_eq!(c.session_timeout, Duration::from_secs(3));
        assert_eq!(c.root, "/l");
        assert_eq!(c.redacted_url(), "zk://a:1,b:2/apps/x");
        assert!(!format!("{c:?}").contains("pw"));
        assert!(!c.tls && !c.sasl);
    }

    #[test]
    fn tls_and_sasl_need_their_features_and_a_ca() {
        let tls = ZkConfig::from_url("zks://a:1");
        assert_eq!(tls.as_ref().map(|c| c.tls).ok(), cfg!(feature = "tls").then_some(true));
        if let Ok(c) = tls {
            assert!(c.validate_complete().is_err(), "zks:// without a CA");
            assert!(c.with_tls_root_cert(b"pem".to_vec()).validate_complete().is_ok());
        }
        let mut c = ZkConfig::new(["a:1"]).with_tls_root_cert(b"pem".to_vec());
        assert!(c.validate().is_err(), "a CA for a plaintext URL");
        c.tls = true;
        assert_eq!(c.validate().is_ok(), cfg!(feature = "tls"));
        assert_eq!(c.redacted_url(), "zks://a:1");
        let sasl = ZkConfig::from_url("zk://u:p@a:1?auth=sasl");
        assert_eq!(sasl.map(|c| c.sasl).ok(), cfg!(feature = "sasl").then_some(true));
    }

    #[test]
    fn bad_urls_are_config_errors() {
        for url in [
            "http://a:1",
            "zk://",
            "zk://a",
            "zk://a:0",
            "zk://a:1?session_timeout_ms=5",
            "zk://a:1?root=relative",
            "zk://a:1?x=1",
            "zk://:pw@a:1",
            "zk://a:1//double",
            "zk://a:1?auth=kerberos",
            "zk://a:1?auth=sasl",
        ] {
            assert_eq!(ZkConfig::from_url(url).err().map(|e| e.kind()), Some(ErrorKind::InvalidConfig), "{url}");
        }
    }
}
