//! The connection a service sends its scripts on: one server's (the master's, behind
//! Sentinel), or a Redis Cluster's, which sends each script to the primary of its keys' slot
//! and follows `MOVED` / `ASK` redirections. The hash tag in every key (`lock:{d:id}`,
//! `fence:{d:id}`) puts a resource's lock and fence in one slot, so each script is legal on a
//! cluster.

use std::collections::{BTreeMap, HashMap};

use palisade_core::spi::{ConnectionUrl, encode_userinfo};
use palisade_core::{Error, ErrorKind, Result};
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::NodeAddress;
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

/// Where to dial instead of an announced address ([`RedisConfig::address_map`], parsed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct AddressMap(HashMap<(String, u16), (String, u16)>);

impl AddressMap {
    /// Parses the configured map; an entry that is not `host:port` on both sides is
    /// [`ErrorKind::InvalidConfig`], naming it (addresses are not secrets).
    /// Entries are never quoted: one that is not an address may be a pasted URL with a password.
    pub(crate) fn parse(entries: &BTreeMap<String, String>) -> Result<Self> {
        let mut map = HashMap::new();
        for (i, (announced, reachable)) in entries.iter().enumerate() {
            let (Some(from), Some(to)) = (host_port(announced), host_port(reachable)) else {
                return Err(Error::new(
                    ErrorKind::InvalidConfig,
                    BACKEND,
                    format!(
                        "address map entry {} (in the map's order) is not `host:port` -> `host:port` (an IPv6 host \
                         in brackets)",
                        i + 1
                    ),
                ));
            };
            map.insert(from, to);
        }
        Ok(AddressMap(map))
    }

    /// The address to dial for the one announced as `host:port`.
    pub(crate) fn dial<'a>(&'a self, host: &'a str, port: u16) -> (&'a str, u16) {
        match self.0.get(&(host.to_string(), port)) {
            Some((host, port)) => (host.as_str(), *port),
            None => (host, port),
        }
    }

    /// The map in the cluster client's terms.
    fn for_cluster(&self) -> HashMap<NodeAddress, NodeAddress> {
        self.0
            .iter()
            .map(|((host, port), (to_host, to_port))| {
                (NodeAddress::new(host.as_str(), *port), NodeAddress::new(to_host.as_str(), *to_port))
            })
            .collect()
    }
}

/// `host:port` (`[v6]:port` for IPv6) as its parts: a host name or address, nothing else (no
/// scheme, user-info, path or spaces).
fn host_port(address: &str) -> Option<(String, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.strip_suffix(']').filter(|h| h.contains(':'))?,
        None => host,
    };
    let port = port.parse().ok().filter(|p| *p != 0)?;
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '%');
    let bracketed = address.starts_with('[');
    let plausible = !host.is_empty() && host.chars().all(allowed) && (bracketed || !host.contains(':'));
    plausible.then(|| (host.to_string(), port))
}

/// `host:port` for a URL (IPv6 hosts in brackets).
pub(crate) fn url_address(host: &str, port: u16) -> String {
    if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

/// `redis+cluster://[user:password@]host:port[,host:port…]`: the seed nodes of a cluster (any
/// of its nodes; the client learns the rest), with the cluster's credentials. A cluster has
/// database 0 only, so the URL has no path; it takes no parameters.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterTarget {
    /// Each seed's host and port, as the URL names them.
    pub(crate) seeds: Vec<(String, u16)>,
    user: Option<String>,
    password: Option<String>,
    /// How the URL reads without secrets, for logs and errors.
    pub(crate) redacted: String,
    /// Where to dial instead of the addresses the nodes announce.
    pub(crate) address_map: AddressMap,
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
        // Hosts as dialled (`url_address` brackets an IPv6 host again).
        let seeds = parsed
            .hosts
            .iter()
            .map(|(host, port)| (host.trim_start_matches('[').trim_end_matches(']').to_string(), port.unwrap_or(6379)))
            .collect();
        Ok(ClusterTarget {
            seeds,
            user: parsed.user.clone(),
            password: parsed.password.clone(),
            redacted: parsed.redacted(),
            address_map: AddressMap::default(),
        })
    }

    /// Each seed's `redis://` URL (without credentials), at the address it is dialled at.
    pub(crate) fn seed_urls(&self) -> Vec<String> {
        self.seeds
            .iter()
            .map(|(host, port)| {
                let (host, port) = self.address_map.dial(host, *port);
                format!("redis://{}", url_address(host, port))
            })
            .collect()
    }

    /// Connects to the cluster with the service's timeouts.
    pub(crate) async fn connect(&self, config: &RedisConfig) -> Result<ClusterConnection> {
        let mut builder = redis::cluster::ClusterClientBuilder::new(self.seed_urls())
            .connection_timeout(config.connect_timeout)
            .response_timeout(config.response_timeout)
            .node_address_map(self.address_map.for_cluster());
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
        self.seed_urls()
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
    fn announced_addresses_map_to_the_dialled_ones_and_bad_entries_are_refused() {
        let entries: BTreeMap<String, String> = [
            ("10.0.0.1:7000".to_string(), "127.0.0.1:17000".to_string()),
            ("[fd00::1]:7001".to_string(), "proxy.internal:17001".to_string()),
        ]
        .into();
        let map = AddressMap::parse(&entries).unwrap();
        assert_eq!(map.dial("10.0.0.1", 7000), ("127.0.0.1", 17000));
        assert_eq!(map.dial("fd00::1", 7001), ("proxy.internal", 17001));
        assert_eq!(map.dial("10.0.0.1", 7002), ("10.0.0.1", 7002), "an address not in the map is dialled as named");
        let mut t = ClusterTarget::parse("redis+cluster://10.0.0.1:7000,10.0.0.2:7000").unwrap();
        t.address_map = map;
        assert_eq!(t.seed_urls(), ["redis://127.0.0.1:17000", "redis://10.0.0.2:7000"]);
        for (from, to) in [
            ("10.0.0.1", "h:1"),
            ("h:1", "h"),
            ("h:0", "h:1"),
            (":7000", "h:1"),
            ("h:1", "h:x"),
            ("h:1", "redis://h:2"),
            ("h:1", "user:s3cret@h:2"),
            ("h:1", " h:2"),
            ("fe80::1", "h:2"),
            ("[h]:1", "h:2"),
        ] {
            let bad: BTreeMap<String, String> = [(from.to_string(), to.to_string())].into();
            let e = AddressMap::parse(&bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{from} -> {to}");
            assert!(e.to_string().contains("host:port") && !e.to_string().contains("s3cret"), "{e}");
        }
        // IPv6 seeds dial as bracketed URLs, and the map finds them.
        let mut v6 = ClusterTarget::parse("redis+cluster://[::1]:7000,[fd00::2]:7001").unwrap();
        assert_eq!(v6.seed_urls(), ["redis://[::1]:7000", "redis://[fd00::2]:7001"]);
        v6.address_map =
            AddressMap::parse(&[("[::1]:7000".to_string(), "127.0.0.1:17000".to_string())].into()).unwrap();
        assert_eq!(v6.seed_urls(), ["redis://127.0.0.1:17000", "redis://[fd00::2]:7001"]);
    }

    #[test]
    fn seeds_and_credentials_parse_and_never_show() {
        let t = ClusterTarget::parse("redis+cluster://app:s3cret@10.0.0.1:7000,10.0.0.2").unwrap();
        assert_eq!(t.seed_urls(), ["redis://10.0.0.1:7000", "redis://10.0.0.2:6379"]);
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
