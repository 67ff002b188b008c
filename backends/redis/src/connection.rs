//! The connection a service sends its scripts on: one server's (the master's, behind
//! Sentinel), or a Redis Cluster's, which sends each script to the primary of its keys' slot
//! and follows `MOVED` / `ASK` redirections. The hash tag in every key (`lock:{d:id}`,
//! `fence:{d:id}`) puts a resource's lock and fence in one slot, so each script is legal on a
//! cluster.

use palisade_core::spi::{ConnectionUrl, encode_userinfo};
use palisade_core::{Error, ErrorKind, Result};
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::config::RedisConfig;
use crate::service::BACKEND;

/// A cheap handle on the service's multiplexed connection.
#[derive(Clone)]
pub(crate) enum Conn {
    /// One server (or the master the Sentinels name), reconnecting by itself.
    Server(ConnectionManager),
    /// A cluster: a connection per primary, routed by slot.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Server(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Server(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Server(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// `redis+cluster://[user:password@]host:port[,host:port…]`: the seed nodes of a cluster (any
/// of its nodes; the client learns the rest), with the cluster's credentials. A cluster has
/// database 0 only, so the URL has no path; it takes no parameters.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterTarget {
    /// `redis://host:port` of each seed.
    pub(crate) seeds: Vec<String>,
    user: Option<String>,
    password: Option<String>,
    /// How the URL reads without secrets, for logs and errors.
    pub(crate) redacted: String,
}

impl std::fmt::Debug for ClusterTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterTarget").field("url", &self.redacted).finish_non_exhaustive()
    }
}

impl ClusterTarget {
    /// Parses a `redis+cluster://` URL. Errors never quote the URL (it may hold a password).
    pub fn parse(url: &str) -> Result<Self> {
        let bad = |why: String| {
            Error::new(
                ErrorKind::InvalidConfig,
                BACKEND,
                format!("bad Redis Cluster URL {}: {why}", palisade_core::redact_url(url)),
            )
        };
        let parsed = ConnectionUrl::parse(url).map_err(bad)?;
        if parsed.scheme != "redis+cluster" {
            return Err(bad("expected redis+cluster://host:port[,host:port…]".into()));
        }
        if !parsed.path.is_empty() && parsed.path != "/" {
            return Err(bad("a cluster has database 0 only: no path".into()));
        }
        if let Some((name, _)) = parsed.query.first() {
            return Err(bad(format!("unknown parameter `{name}`")));
        }
        let seeds =
            parsed.hosts.iter().map(|(host, port)| format!("redis://{host}:{}", port.unwrap_or(6379))).collect();
        Ok(ClusterTarget {
            seeds,
            user: parsed.user.clone(),
            password: parsed.password.clone(),
            redacted: parsed.redacted(),
        })
    }

    /// Connects to the cluster with the service's timeouts.
    pub(crate) async fn connect(&self, config: &RedisConfig) -> Result<ClusterConnection> {
        let mut builder = redis::cluster::ClusterClientBuilder::new(self.seeds.iter().map(String::as_str))
            .connection_timeout(config.connect_timeout)
            .response_timeout(config.response_timeout);
        if let Some(user) = &self.user {
            builder = builder.username(user);
        }
        if let Some(password) = &self.password {
            builder = builder.password(password);
        }
        let client = builder.build().map_err(|e| {
            Error::new(ErrorKind::InvalidConfig, BACKEND, format!("bad Redis Cluster URL {}", self.redacted))
                .with_source(e)
        })?;
        client.get_async_connection().await.map_err(|e| {
            Error::new(ErrorKind::Unavailable, BACKEND, format!("cannot connect to the cluster {}", self.redacted))
                .with_source(e)
                .with_retryable(true)
        })
    }

    /// A client for each seed with the cluster's credentials: release notifications are
    /// published cluster-wide, so one node's subscription hears them all, and the seeds are
    /// tried in turn when the one subscribed to dies.
    pub(crate) fn notification_clients(&self) -> Result<Vec<redis::Client>> {
        let userinfo = encode_userinfo(self.user.as_deref(), self.password.as_deref());
        self.seeds
            .iter()
            .map(|seed| {
                let address = seed.trim_start_matches("redis://");
                redis::Client::open(format!("redis://{userinfo}{address}").as_str()).map_err(|e| {
                    Error::new(ErrorKind::InvalidConfig, BACKEND, format!("bad Redis Cluster URL {}", self.redacted))
                        .with_source(e)
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn seeds_and_credentials_parse_and_never_show() {
        let t = ClusterTarget::parse("redis+cluster://app:s3cret@10.0.0.1:7000,10.0.0.2").unwrap();
        assert_eq!(t.seeds, ["redis://10.0.0.1:7000", "redis://10.0.0.2:6379"]);
        assert_eq!((t.user.as_deref(), t.password.as_deref()), (Some("app"), Some("s3cret")));
        assert_eq!(t.redacted, "redis+cluster://10.0.0.1:7000,10.0.0.2");
        assert!(!format!("{t:?}").contains("s3cret"));
        for bad in ["redis+cluster://:pw@h:1/2", "redis+cluster://:pw@h:1?x=1", "redis://:pw@h:1"] {
            let e = ClusterTarget::parse(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{bad}");
            assert!(!e.to_string().contains("pw"), "{e}");
        }
    }
}
