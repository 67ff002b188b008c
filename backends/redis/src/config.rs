//! Connection settings.

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
    /// Accept a `maxmemory-policy` that may evict keys without a TTL (fence keys). Default:
    /// false. Set it only if this Redis never reaches `maxmemory`.
    pub allow_eviction: bool,
}

impl RedisConfig {
    /// Settings for `url` with the defaults above.
    pub fn new(url: impl Into<String>) -> Self {
        RedisConfig {
            url: url.into(),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(5),
            allow_eviction: false,
        }
    }

    /// The URL with any password replaced by `***`, for logs and errors.
    pub fn redacted_url(&self) -> String {
        palisade_core::redact_url(&self.url)
    }

    pub(crate) fn check_scheme(&self) -> Result<()> {
        if self.url.starts_with("redis://") {
            return Ok(());
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
            format!("not a Redis URL: {} (expected redis://host:port)", self.redacted_url()),
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
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        let c = RedisConfig::new("redis://app:s3cret@10.0.0.1:6379/2?x=y");
        assert_eq!(c.redacted_url(), "redis://app:***@10.0.0.1:6379/2");
        assert!(!format!("{c:?}").contains("s3cret"));
        assert_eq!(RedisConfig::new("redis://:s3cret@h:1").redacted_url(), "redis://:***@h:1");
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
    }
}
