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
        }
    }

    /// Parses `zk://[user:password@]host:port[,host:port…][/chroot][?session_timeout_ms=N&root=/path]`
    /// (`user:password` is a digest identity, percent-decoded as every backend's is:
    /// [`ConnectionUrl`](palisade_core::spi::ConnectionUrl)).
    pub fn from_url(url: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::new(
                ErrorKind::InvalidConfig,
                BACKEND,
                format!("{why}: {} (expected zk://host:port[,host:port…][/chroot])", palisade_core::redact_url(url)),
            )
        };
        let parsed = palisade_core::spi::ConnectionUrl::parse(url).map_err(|why| bad(&why))?;
        if parsed.scheme != "zk" {
            return Err(bad("not a ZooKeeper URL"));
        }
        let mut config = ZkConfig::new(Vec::<String>::new());
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
                _ => return Err(bad(&format!("unknown or malformed parameter `{name}`"))),
            }
        }
        config.validate()?;
        Ok(config)
    }

    /// The servers as a URL without user or password, for logs and errors.
    pub fn redacted_url(&self) -> String {
        format!("zk://{}{}", self.servers.join(","), self.chroot.as_deref().unwrap_or(""))
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
        ] {
            assert_eq!(ZkConfig::from_url(url).err().map(|e| e.kind()), Some(ErrorKind::InvalidConfig), "{url}");
        }
    }
}
