//! Redis Sentinel: finding the master a group of Sentinels names, again after a failover.
//!
//! `redis+sentinel://[user:password@]host:port[,host:port…]/MASTER_NAME[?…]`: the hosts are
//! Sentinels; the user-info is the **master's** credentials (as in a `redis://` URL), and the
//! Sentinels' own go in `sentinel_username` / `sentinel_password`. `db` selects the database.
//! The service asks the Sentinels, in order, `SENTINEL get-master-addr-by-name`, connects to the
//! answer, and asks again whenever the master stops answering or answers `READONLY` (it was
//! demoted): a failover is followed within the Sentinels' own failover time.

use palisade_core::spi::{ConnectionUrl, encode_userinfo};
use palisade_core::{Error, ErrorKind, Result};
use tracing::{debug, warn};

use crate::config::ReplicaAcks;
use crate::connection::{AddressMap, url_address};
use crate::service::BACKEND;

/// Where the Sentinels are and what they are asked.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelTarget {
    /// `redis://[sentinel credentials@]host:port` of each Sentinel, in the URL's order.
    sentinels: Vec<String>,
    /// The master group's name.
    pub(crate) master_name: String,
    /// The master's credentials, percent-encoded as `user:password@` (or empty).
    master_userinfo: String,
    /// The database on the master.
    db: i64,
    /// How the URL reads without secrets, for logs and errors.
    pub(crate) redacted: String,
    /// `wait_replicas` / `wait_timeout_ms`: the replica acknowledgement asked after acquire.
    pub(crate) replica_acks: Option<ReplicaAcks>,
    /// Where to dial instead of the address the Sentinels name.
    pub(crate) address_map: AddressMap,
}

impl std::fmt::Debug for SentinelTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelTarget").field("url", &self.redacted).finish_non_exhaustive()
    }
}

impl SentinelTarget {
    /// Parses a `redis+sentinel://` URL. Errors never quote the URL (it may hold passwords).
    pub fn parse(url: &str) -> Result<Self> {
        let bad = |why: String| {
            Error::new(
                ErrorKind::InvalidConfig,
                BACKEND,
                format!("bad Sentinel URL {}: {why}", palisade_core::redact_url(url)),
            )
        };
        let parsed = ConnectionUrl::parse(url).map_err(bad)?;
        if parsed.scheme != "redis+sentinel" {
            return Err(bad("expected redis+sentinel://host:port[,host:port…]/MASTER_NAME".into()));
        }
        let master_name = parsed.path.trim_start_matches('/').to_string();
        if master_name.is_empty() || master_name.contains('/') {
            return Err(bad("the path must be the master group's name: …/MASTER_NAME".into()));
        }
        let (mut sentinel_user, mut sentinel_password, mut db) = (None, None, 0i64);
        let (mut wait_replicas, mut wait_timeout_ms) = (None, None);
        for (name, value) in &parsed.query {
            match name.as_str() {
                "sentinel_username" => sentinel_user = Some(value.clone()),
                "sentinel_password" => sentinel_password = Some(value.clone()),
                "db" => db = value.parse().map_err(|_| bad("db must be a number".into()))?,
                "wait_replicas" => {
                    wait_replicas =
                        Some(value.parse::<u32>().map_err(|_| bad("wait_replicas must be a count".into()))?);
                }
                "wait_timeout_ms" => {
                    let ms = value.parse::<u64>().ok().filter(|ms| (1..=60_000).contains(ms));
                    wait_timeout_ms = Some(ms.ok_or_else(|| bad("wait_timeout_ms must be 1 to 60000".into()))?);
                }
                other => return Err(bad(format!("unknown parameter `{other}`"))),
            }
        }
        let sentinel_userinfo = encode_userinfo(sentinel_user.as_deref(), sentinel_password.as_deref());
        let mut sentinels = Vec::new();
        for (host, port) in &parsed.hosts {
            sentinels.push(format!("redis://{sentinel_userinfo}{host}:{}", port.unwrap_or(26379)));
        }
        let replica_acks = match (wait_replicas, wait_timeout_ms) {
            (None, None) | (Some(0), _) => None,
            (Some(replicas), ms) => {
                Some(ReplicaAcks { replicas, timeout: std::time::Duration::from_millis(ms.unwrap_or(100)) })
            }
            (None, Some(_)) => return Err(bad("wait_timeout_ms without wait_replicas".into())),
        };
        Ok(SentinelTarget {
            replica_acks,
            sentinels,
            master_name,
            master_userinfo: parsed.encoded_userinfo(),
            db,
            redacted: parsed.redacted(),
            address_map: AddressMap::default(),
        })
    }

    /// The master's `redis://` URL, with its credentials, as the first Sentinel that answers
    /// names it (at the address the address map gives for it), and the address the Sentinel
    /// named. `Unavailable` (retryable) when none does.
    pub(crate) async fn master_url(&self, timeout: std::time::Duration) -> Result<(String, String)> {
        let mut last = String::from("no Sentinel listed");
        for sentinel in &self.sentinels {
            match ask(sentinel, &self.master_name, timeout).await {
                Ok(Some((host, port))) => {
                    let address = url_address(&host, port);
                    let (dial_host, dial_port) = self.address_map.dial(&host, port);
                    let dial = url_address(dial_host, dial_port);
                    debug!(master = %address, dialled = %dial, name = %self.master_name, "sentinel named the master");
                    let url = format!("redis://{}{dial}/{}", self.master_userinfo, self.db);
                    return Ok((url, address));
                }
                Ok(None) => last = format!("a Sentinel does not know the master group `{}`", self.master_name),
                Err(e) => {
                    warn!(sentinel = %palisade_core::redact_url(sentinel), error = %e, "a sentinel did not answer");
                    last = e;
                }
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            BACKEND,
            format!("no Sentinel of {} named the master: {last}", self.redacted),
        )
        .with_retryable(true))
    }
}

impl SentinelTarget {
    /// `SENTINEL MASTER` of the group, as the first Sentinel that answers gives it (field by
    /// field), with how many of the listed Sentinels answered and how many are listed.
    pub(crate) async fn master_state(
        &self,
        timeout: std::time::Duration,
    ) -> (Option<std::collections::HashMap<String, String>>, usize, usize) {
        let mut state = None;
        let mut answered = 0;
        for sentinel in &self.sentinels {
            let asked = async {
                let client = redis::Client::open(sentinel.as_str())?;
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("SENTINEL")
                    .arg("MASTER")
                    .arg(&self.master_name)
                    .query_async::<std::collections::HashMap<String, String>>(&mut conn)
                    .await
            };
            if let Ok(Ok(fields)) = tokio::time::timeout(timeout, asked).await {
                answered += 1;
                state.get_or_insert(fields);
            }
        }
        (state, answered, self.sentinels.len())
    }

    /// The `redis://` URL of a data node (a replica the master lists) at `host:port`, with the
    /// master's credentials and database, at the address the address map gives for it.
    pub(crate) fn data_node_url(&self, host: &str, port: u16) -> String {
        let (dial_host, dial_port) = self.address_map.dial(host, port);
        format!("redis://{}{}/{}", self.master_userinfo, url_address(dial_host, dial_port), self.db)
    }
}

/// One Sentinel's answer: the master's address, or `None` if it does not know the name.
async fn ask(
    sentinel: &str,
    name: &str,
    timeout: std::time::Duration,
) -> std::result::Result<Option<(String, u16)>, String> {
    let client = redis::Client::open(sentinel).map_err(|e| e.to_string())?;
    let asked = async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(name)
            .query_async::<Option<(String, u16)>>(&mut conn)
            .await
    };
    match tokio::time::timeout(timeout, asked).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer in {timeout:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn master_and_sentinel_credentials_are_kept_apart_and_never_shown() {
        let t = SentinelTarget::parse(
            "redis+sentinel://app:m%40ster@10.0.0.1:26379,10.0.0.2/orders?sentinel_password=s3nt&db=2",
        )
        .unwrap();
        assert_eq!(t.master_name, "orders");
        assert_eq!(t.sentinels, ["redis://:s3nt@10.0.0.1:26379", "redis://:s3nt@10.0.0.2:26379"]);
        assert_eq!(t.master_userinfo, "app:m%40ster@");
        assert_eq!(t.db, 2);
        assert_eq!(t.redacted, "redis+sentinel://10.0.0.1:26379,10.0.0.2/orders");
        assert_eq!(t.replica_acks, None);
        let acks = SentinelTarget::parse("redis+sentinel://h/m?wait_replicas=1&wait_timeout_ms=250").unwrap();
        assert_eq!(
            acks.replica_acks,
            Some(ReplicaAcks { replicas: 1, timeout: std::time::Duration::from_millis(250) })
        );
        let shown = format!("{t:?}");
        assert!(!shown.contains("s3nt") && !shown.contains("m%40ster") && !shown.contains("m@ster"), "{shown}");
    }

    #[test]
    fn malformed_urls_are_refused_without_quoting_secrets() {
        for url in [
            "redis+sentinel://:pw@h:1",
            "redis+sentinel://:pw@h:1/",
            "redis+sentinel://:pw@h:1/a/b",
            "redis+sentinel://:pw@h:1/m?db=x",
            "redis+sentinel://:pw@h:1/m?nope=1",
            "redis+sentinel://:pw@h:1/m?wait_timeout_ms=5",
            "redis+sentinel://:pw@h:1/m?wait_replicas=1&wait_timeout_ms=0",
            "redis://:pw@h:1/m",
        ] {
            let e = SentinelTarget::parse(url).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{url}");
            assert!(!e.to_string().contains("pw"), "{e}");
        }
    }
}
