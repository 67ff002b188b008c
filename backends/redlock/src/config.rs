//! Settings: the masters, the per-node timeout, the drift allowance, the retry jitter.

use std::fmt;
use std::time::Duration;

use palisade_core::{Error, ErrorKind, Result, Ttl, redact_url};

use crate::service::BACKEND;

/// The most masters one service talks to. Redlock deployments use 1, 3 or 5.
pub const MAX_NODES: usize = 63;

/// How to reach the masters and how the algorithm is tuned.
///
/// Build it from a URL ([`RedlockConfig::parse`]) or from a list of `redis://` URLs
/// ([`RedlockConfig::from_nodes`]), then adjust the public fields.
#[derive(Clone)]
pub struct RedlockConfig {
    /// One `redis://[user:password@]host:port[/db]` URL per **independent** master (not
    /// replicas of each other: replication is asynchronous and would break the majority
    /// argument).
    pub nodes: Vec<String>,
    /// How long one master may take to answer one command before it counts as failed for
    /// this attempt. Keep it small against the TTL (the authors suggest 5–50 ms for a 10 s
    /// TTL): a master that hangs must not eat the validity. Default: 50 ms.
    pub node_timeout: Duration,
    /// How long [`RedlockService::connect`](crate::RedlockService::connect) waits for each
    /// master. Default: 1 s.
    pub connect_timeout: Duration,
    /// The clock-drift allowance proportional to the TTL. Default: 0.01 (1 %).
    pub drift_factor: f64,
    /// The fixed part of the clock-drift allowance. Default: 2 ms.
    pub drift_fixed: Duration,
    /// The upper bound of the random delay between attempts while waiting for a lock, so that
    /// contending clients do not retry in lockstep. Default: 50 ms.
    pub retry_delay: Duration,
}

impl RedlockConfig {
    /// Settings for the given masters with the defaults above.
    pub fn from_nodes<I, S>(nodes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedlockConfig {
            nodes: nodes.into_iter().map(Into::into).collect(),
            node_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(1),
            drift_factor: 0.01,
            drift_fixed: Duration::from_millis(2),
            retry_delay: Duration::from_millis(50),
        }
    }

    /// Parses `redlock://[user:password@]host:port[,host:port…][/db][?options]`.
    ///
    /// Every master gets the same credentials and database. Options (all optional):
    /// `node_timeout_ms`, `connect_timeout_ms`, `drift_factor`, `drift_ms`, `retry_delay_ms`.
    /// A host without a port means 6379. Errors are [`ErrorKind::InvalidConfig`] and never
    /// show the password.
    ///
    /// ```
    /// use palisade_redlock::RedlockConfig;
    ///
    /// let c = RedlockConfig::parse("redlock://app:pw@10.0.0.1:6379,10.0.0.2:6379,10.0.0.3/2?node_timeout_ms=20")?;
    /// assert_eq!(c.nodes, ["redis://app:pw@10.0.0.1:6379/2", "redis://app:pw@10.0.0.2:6379/2", "redis://app:pw@10.0.0.3:6379/2"]);
    /// assert_eq!(c.node_timeout.as_millis(), 20);
    /// assert_eq!(c.quorum(), 2);
    /// # Ok::<(), palisade_core::Error>(())
    /// ```
    pub fn parse(url: &str) -> Result<Self> {
        let bad = |why: String| {
            Error::new(ErrorKind::InvalidConfig, BACKEND, format!("bad Redlock URL {}: {why}", redact_url(url)))
        };
        let parsed = palisade_core::spi::ConnectionUrl::parse(url).map_err(bad)?;
        if parsed.scheme != "redlock" {
            return Err(bad("expected redlock://host:port[,host:port…]".into()));
        }
        let db = parsed.path.trim_start_matches('/').trim_end_matches('/');
        if !db.is_empty() && db.parse::<u32>().is_err() {
            return Err(bad("the database is not a number".into()));
        }
        // Each master's URL carries the credentials percent-encoded again, so the Redis client
        // decodes them to exactly what this parser decoded.
        let auth = parsed.encoded_userinfo();
        let db = if db.is_empty() { String::new() } else { format!("/{db}") };
        let nodes: Vec<String> = parsed
            .hosts
            .iter()
            .map(|(host, port)| format!("redis://{auth}{host}:{}{db}", port.unwrap_or(6379)))
            .collect();
        let mut config = RedlockConfig::from_nodes(nodes);
        for (name, value) in &parsed.query {
            let (name, value) = (name.as_str(), value.as_str());
            let millis = || {
                value
                    .parse::<u64>()
                    .map(Duration::from_millis)
                    .map_err(|_| bad(format!("{name}={value:?} is not a whole number of milliseconds")))
            };
            match name {
                "node_timeout_ms" => config.node_timeout = millis()?,
                "connect_timeout_ms" => config.connect_timeout = millis()?,
                "drift_ms" => config.drift_fixed = millis()?,
                "retry_delay_ms" => config.retry_delay = millis()?,
                "drift_factor" => {
                    config.drift_factor =
                        value.parse().map_err(|_| bad(format!("drift_factor={value:?} is not a number")))?;
                }
                _ => {
                    return Err(bad(format!(
                        "unknown option {name:?} (known: node_timeout_ms, connect_timeout_ms, drift_factor, drift_ms, retry_delay_ms)"
                    )));
                }
            }
        }
        config.validate()?;
        Ok(config)
    }

    /// The majority: `N / 2 + 1` masters must grant.
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// The clock-drift allowance for a TTL: `ttl × drift_factor + drift_fixed`.
    pub fn drift(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.drift_factor) + self.drift_fixed
    }

    /// Checks the settings: 1 to [`MAX_NODES`] `redis://` masters, no duplicates, non-zero
    /// timeouts, a drift factor in `[0, 0.5)`. Errors are [`ErrorKind::InvalidConfig`].
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Error::new(ErrorKind::InvalidConfig, BACKEND, why);
        if self.nodes.is_empty() || self.nodes.len() > MAX_NODES {
            return Err(bad(format!("Redlock needs 1 to {MAX_NODES} masters, got {}", self.nodes.len())));
        }
        for (i, node) in self.nodes.iter().enumerate() {
            if !node.starts_with("redis://") {
                return Err(bad(format!("master {} is not a redis:// URL: {}", i + 1, redact_url(node))));
            }
            if self.nodes[..i].contains(node) {
                return Err(bad(format!(
                    "master {} is listed twice ({}): a duplicate would count twice toward the majority",
                    i + 1,
                    redact_url(node)
                )));
            }
        }
        if self.node_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(bad("node_timeout and connect_timeout must be above zero".into()));
        }
        if !(0.0..0.5).contains(&self.drift_factor) {
            return Err(bad(format!("drift_factor {} is outside [0, 0.5)", self.drift_factor)));
        }
        Ok(())
    }

    /// The TTL a grant reports so that a [`Lease`](palisade_core::Lease)'s `safe_until` is
    /// exactly the end of Redlock's validity (`request time + ttl − drift`); `None` when the
    /// drift leaves no validity at all.
    pub(crate) fn reported_ttl(&self, ttl: Ttl) -> Option<Ttl> {
        let drift = self.drift(ttl.get());
        let validity = ttl.get().checked_sub(drift).filter(|v| !v.is_zero())?;
        // The lease puts safe_until at `reported − reported.drift_margin()` (1 % + 2 ms, at most
        // half). Report the TTL that makes that the validity's end, rounded down by a
        // microsecond so it errs early; never above the TTL asked for.
        let end = |x: Duration| Ttl::new(x).map(|t| x - t.drift_margin()).unwrap_or(Duration::ZERO);
        let nanos = (validity.as_nanos() + 2_000_000) * 100 / 99;
        let mut reported =
            Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)).saturating_sub(Duration::from_micros(1));
        if end(reported) > validity {
            // Tiny TTLs, where the margin is half the TTL.
            reported = validity * 2;
        }
        Ttl::new(reported.min(ttl.get())).ok()
    }
}

impl fmt::Debug for RedlockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockConfig")
            .field("nodes", &self.nodes.iter().map(|n| redact_url(n)).collect::<Vec<_>>())
            .field("node_timeout", &self.node_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("drift_factor", &self.drift_factor)
            .field("drift_fixed", &self.drift_fixed)
            .field("retry_delay", &self.retry_delay)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_masters() {
        let c = RedlockConfig::parse("redlock://127.0.0.1:7001").unwrap();
        assert_eq!(c.nodes, ["redis://127.0.0.1:7001"]);
        assert_eq!(c.quorum(), 1);
        let c = RedlockConfig::parse("REDLOCK://a:1,b,[::1]:3,[::1]?drift_factor=0.02&drift_ms=5&retry_delay_ms=10")
            .unwrap();
        assert_eq!(c.nodes, ["redis://a:1", "redis://b:6379", "redis://[::1]:3", "redis://[::1]:6379"]);
        assert_eq!(c.quorum(), 3);
        assert_eq!(c.drift(Duration::from_secs(10)), Duration::from_millis(205));
        assert_eq!(c.retry_delay, Duration::from_millis(10));
    }

    #[test]
    fn bad_urls_are_invalid_config_without_passwords() {
        for url in [
            "redis://a:1",
            "redlock://",
            "redlock://a:1,,b:2",
            "redlock://a:x",
            "redlock://a:1/zero",
            "redlock://u:s3cret@a:1?node_timeout_ms=soon",
            "redlock://u:s3cret@a:1?colour=blue",
            "redlock://u:s3cret@a:1,a:1",
            "redlock://a:1?node_timeout_ms=0",
            "redlock://a:1?drift_factor=0.7",
        ] {
            let err = RedlockConfig::parse(url).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}: {err}");
            assert!(!err.to_string().contains("s3cret"), "{err}");
        }
        let c = RedlockConfig::parse("redlock://u:s3cret@a:1").unwrap();
        assert!(!format!("{c:?}").contains("s3cret"));
        // The multi-host form goes through the core's redaction (user-info and query dropped).
        assert_eq!(redact_url("redlock://u:s3cret@a:1,b:2/0?x=1"), "redlock://a:1,b:2/0");
        // Credentials are percent-decoded once, then encoded again for each master.
        let c = RedlockConfig::parse("redlock://u:p%40ss%2F@a:1").unwrap();
        assert_eq!(c.nodes, ["redis://u:p%40ss%2F@a:1"]);
    }

    #[test]
    fn validity_ends_where_the_authors_say() {
        let c = RedlockConfig::from_nodes(["redis://a:1"]);
        let end = |t: Ttl| t.get() - t.drift_margin();
        let ttl = Ttl::from_millis(10_000).unwrap();
        let validity = Duration::from_millis(10_000 - 100 - 2);
        // Default drift = the core's margin: the lease's arithmetic is already Redlock's.
        let reported = c.reported_ttl(ttl).unwrap();
        assert!(reported <= ttl && ttl.get() - reported.get() < Duration::from_micros(5), "{reported:?}");
        assert!(end(reported) <= validity && validity - end(reported) < Duration::from_micros(5));
        let mut wide = c.clone();
        wide.drift_fixed = Duration::from_millis(500);
        let validity = Duration::from_millis(10_000 - 100 - 500);
        let reported = wide.reported_ttl(ttl).unwrap();
        assert!(end(reported) <= validity && validity - end(reported) < Duration::from_micros(5), "{reported:?}");
        for ms in [3, 4, 5, 8, 50] {
            let ttl = Ttl::from_millis(ms).unwrap();
            let validity = ttl.get() - c.drift(ttl.get());
            let reported = c.reported_ttl(ttl).unwrap();
            assert!(end(reported) <= validity && reported <= ttl, "{ms}: {reported:?}");
        }
        assert_eq!(c.reported_ttl(Ttl::from_millis(2).unwrap()), None);
    }
}
