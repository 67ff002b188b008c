//! `palisade doctor`'s checks of a Redis deployment: eviction, persistence and replication, as
//! `CONFIG GET` and `INFO replication` show them on each primary. Reads only.

use std::collections::HashMap;

use async_trait::async_trait;
use palisade_core::{Check, Diagnose, Result, Verdict};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use crate::connection::{Conn, url_address};
use crate::errors::map;
use crate::inspect::{ScanRoute, primaries};
use crate::sentinel::SentinelTarget;
use crate::service::{BACKEND, RedisLockService};

const EXCLUSIVE: &str = "a lock has one holder for its TTL";
const DURABLE: &str = "fences never go back across a restart";
const FAILOVER: &str = "a failover keeps every acknowledged grant";

#[async_trait]
impl Diagnose for RedisLockService {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn diagnose(&self) -> Result<Vec<Check>> {
        let waits_for_replicas = self.config().replica_acks.as_ref().map_or(0, |acks| acks.replicas);
        match self.conn() {
            Conn::Server(mut conn) => {
                let mut checks = settings(&mut conn, None, "").await?;
                let replication = info_replication(&mut conn, None).await?;
                checks.push(replication_check(&replication, "", waits_for_replicas));
                // A replica is the next master: it must be configured as one.
                for (host, port) in replicas_of(&replication) {
                    checks.extend(self.replica_checks(&host, port).await);
                }
                if let Some(target) = self.sentinel_target() {
                    checks.push(sentinel_check(target, self.config().connect_timeout).await);
                }
                Ok(checks)
            }
            Conn::Cluster(mut conn) => {
                let mut checks = Vec::new();
                for (host, port) in primaries(&mut conn).await? {
                    let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host: host.clone(), port });
                    let on = format!(" on {host}:{port}");
                    checks.extend(settings(&mut conn, Some(node.clone()), &on).await?);
                    let replication = info_replication(&mut conn, Some(node)).await?;
                    checks.push(replication_check(&replication, &on, waits_for_replicas));
                }
                Ok(checks)
            }
        }
    }
}

impl RedisLockService {
    /// The eviction and persistence checks of the replica at `host:port`, reached with the
    /// master's credentials and database; a warning when it cannot be reached from here.
    async fn replica_checks(&self, host: &str, port: u16) -> Vec<Check> {
        let on = format!(" on replica {}", url_address(host, port));
        let url = match self.sentinel_target() {
            Some(target) => target.data_node_url(host, port),
            None => same_server_elsewhere(&self.config().url, host, port),
        };
        let timeout = self.config().connect_timeout;
        let connected = async {
            let client = redis::Client::open(url.as_str())?;
            client.get_multiplexed_async_connection().await
        };
        match tokio::time::timeout(timeout, connected).await {
            Ok(Ok(mut conn)) => match settings(&mut conn, None, &on).await {
                Ok(checks) => checks,
                Err(e) => vec![replica_unreachable(&on, &e.report().to_string())],
            },
            Ok(Err(e)) => vec![replica_unreachable(&on, &e.to_string())],
            Err(_) => vec![replica_unreachable(&on, &format!("no answer in {timeout:?}"))],
        }
    }
}

fn replica_unreachable(on: &str, why: &str) -> Check {
    Check::new(
        format!("replica{on}"),
        Verdict::Warn,
        format!(
            "cannot be reached from here ({why}): check by hand that it evicts nothing and persists every write, for a \
             failover promotes it"
        ),
        FAILOVER,
    )
}

/// `url` (a `redis://` or `rediss://` URL) with its host and port replaced: the same
/// credentials and database on another server.
fn same_server_elsewhere(url: &str, host: &str, port: u16) -> String {
    match palisade_core::spi::ConnectionUrl::parse(url) {
        Ok(parsed) => {
            format!("{}://{}{}{}", parsed.scheme, parsed.encoded_userinfo(), url_address(host, port), parsed.path)
        }
        Err(_) => format!("redis://{}", url_address(host, port)),
    }
}

/// The replicas a master's `INFO replication` lists (`slaveN:ip=…,port=…,state=…`).
fn replicas_of(replication: &HashMap<String, String>) -> Vec<(String, u16)> {
    let mut found: Vec<(String, (String, u16))> = replication
        .iter()
        .filter(|(k, _)| k.starts_with("slave") && k[5..].chars().all(|c| c.is_ascii_digit()) && k.len() > 5)
        .filter_map(|(k, v)| {
            let fields: HashMap<&str, &str> = v.split(',').filter_map(|f| f.split_once('=')).collect();
            Some((k.clone(), (fields.get("ip")?.to_string(), fields.get("port")?.parse().ok()?)))
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, addr)| addr).collect()
}

const SENTINELS: &str = "a failover happens when the master is lost, and only then";

/// Sentinel's view of the master group: how many Sentinels watch it and the quorum that
/// marks it down, as the first Sentinel that answers sees them.
async fn sentinel_check(target: &SentinelTarget, timeout: std::time::Duration) -> Check {
    let (state, answered, listed) = target.master_state(timeout).await;
    let Some(state) = state else {
        return Check::new(
            "sentinel quorum",
            Verdict::Warn,
            format!("no Sentinel of the {listed} listed answered SENTINEL MASTER: check the quorum by hand"),
            SENTINELS,
        );
    };
    let number = |name: &str| state.get(name).and_then(|v| v.parse::<u32>().ok());
    let (Some(quorum), Some(others)) = (number("quorum"), number("num-other-sentinels")) else {
        return Check::new("sentinel quorum", Verdict::Warn, "SENTINEL MASTER did not show the quorum", SENTINELS);
    };
    let sentinels = others + 1;
    let majority = sentinels / 2 + 1;
    let reached =
        if answered < listed { format!("; {answered} of the {listed} listed answered") } else { String::new() };
    let (verdict, why) = if quorum > sentinels {
        (
            Verdict::Fail,
            format!("the master is never marked down, so no failover ever happens; lower the quorum to {majority}"),
        )
    } else if sentinels < 3 {
        (
            Verdict::Warn,
            format!(
                "a failover needs a majority of the Sentinels ({majority} of {sentinels}) to elect the one that runs it: \
                 with fewer than 3, losing one Sentinel (or its machine, with the master's) stops failovers; run 3 or 5 \
                 on separate machines"
            ),
        )
    } else if quorum < majority {
        (
            Verdict::Warn,
            format!(
                "a minority ({quorum} of {sentinels}) marks the master down: Sentinels cut off from it with a partition \
                 start failovers the majority did not see the need for; a quorum of {majority} avoids it"
            ),
        )
    } else {
        (
            Verdict::Pass,
            format!("a failover needs {quorum} Sentinels to agree the master is down, and a majority to run it"),
        )
    };
    Check::new(
        "sentinel quorum",
        verdict,
        format!("{sentinels} Sentinels watch `{}`, quorum {quorum}{reached}: {why}", target.master_name),
        SENTINELS,
    )
}

/// The eviction and persistence checks of one server (`node` of a cluster; `on` names it in
/// the checks).
pub(crate) async fn settings<C: ScanRoute + Send>(
    conn: &mut C,
    node: Option<RoutingInfo>,
    on: &str,
) -> Result<Vec<Check>> {
    let names = ["maxmemory", "maxmemory-policy", "appendonly", "appendfsync", "no-appendfsync-on-rewrite", "save"];
    let settings = config_get(conn, node.clone(), &names).await?;
    let mut checks = Vec::new();
    let get = |name: &str| settings.as_ref().and_then(|s| s.get(name)).map(String::as_str);
    checks.push(match (get("maxmemory-policy"), get("maxmemory")) {
        (None, _) => unreadable("maxmemory-policy", on, EXCLUSIVE),
        (Some("noeviction"), _) => {
            Check::new(format!("maxmemory-policy{on}"), Verdict::Pass, "noeviction: no key is ever evicted", EXCLUSIVE)
        }
        (Some(policy), Some("0")) => Check::new(
            format!("maxmemory-policy{on}"),
            Verdict::Warn,
            format!(
                "{policy}, with no memory limit (maxmemory 0): nothing is evicted today, but a limit set later would \
                 evict {}; use noeviction",
                evicted(policy)
            ),
            EXCLUSIVE,
        ),
        (Some(policy), _) => Check::new(
            format!("maxmemory-policy{on}"),
            Verdict::Fail,
            format!("{policy}: once memory fills, Redis evicts {}; use noeviction", evicted(policy)),
            EXCLUSIVE,
        ),
    });
    checks.push(match (get("appendonly"), get("appendfsync"), get("save")) {
        (None, _, _) => unreadable("appendonly", on, DURABLE),
        (Some("yes"), Some("always"), _) if get("no-appendfsync-on-rewrite") == Some("yes") => Check::new(
            format!("persistence{on}"),
            Verdict::Warn,
            "appendonly yes, appendfsync always, but no-appendfsync-on-rewrite yes: while the file is rewritten or a \
             snapshot taken, grants are answered before they are on disk, and a machine crash then loses them; set \
             no-appendfsync-on-rewrite no",
            DURABLE,
        ),
        (Some("yes"), Some("always"), _) => Check::new(
            format!("persistence{on}"),
            Verdict::Pass,
            "appendonly yes, appendfsync always: every grant is on disk before its answer",
            DURABLE,
        ),
        (Some("yes"), fsync, _) => Check::new(
            format!("persistence{on}"),
            Verdict::Warn,
            format!(
                "appendonly yes, appendfsync {}: a crash of the machine (not of Redis alone) loses the grants of the \
                 last second or more, whose fences are then issued again (the stores refuse them, and lock_checked \
                 moves the counter past their watermarks)",
                fsync.unwrap_or("?")
            ),
            DURABLE,
        ),
        (Some(_), _, Some(save)) if !save.trim().is_empty() => Check::new(
            format!("persistence{on}"),
            Verdict::Warn,
            format!(
                "snapshots only (save \"{save}\"): a crash loses every grant since the last snapshot, whose fences are \
                 then issued again; use appendonly yes with appendfsync always"
            ),
            DURABLE,
        ),
        (Some(_), _, _) => Check::new(
            format!("persistence{on}"),
            Verdict::Fail,
            "none (appendonly no, no snapshots): a restart loses every lock and fence counter, and every resource's \
             fences start again at 1; use appendonly yes with appendfsync always",
            DURABLE,
        ),
    });
    Ok(checks)
}

/// Whether grants wait for every replica of a master (or primary), from its `INFO replication`.
fn replication_check(replication: &HashMap<String, String>, on: &str, waits_for_replicas: u32) -> Check {
    let replicas = replication.get("connected_slaves").and_then(|n| n.parse::<u32>().ok());
    match (replication.get("role").map(String::as_str), replicas) {
        (Some("master"), Some(0)) => Check::new(
            format!("replication{on}"),
            Verdict::Pass,
            "no replicas: nothing to fail over to (a restart is the failure to plan for: see persistence)",
            FAILOVER,
        ),
        (Some("master"), Some(n)) if waits_for_replicas >= n => Check::new(
            format!("replication{on}"),
            Verdict::Pass,
            format!(
                "{n} replica(s), and every grant waits for all of them to acknowledge it (wait_replicas {waits_for_replicas}; \
                 WAIT is best effort: a replica that acknowledged may still lose it in a crash of its own)"
            ),
            FAILOVER,
        ),
        (Some("master"), Some(n)) => Check::new(
            format!("replication{on}"),
            Verdict::Warn,
            format!(
                "{n} replica(s), and grants wait for {waits_for_replicas} of them: a failover can promote a replica \
                 without the last grants (two holders at once, one fence issued twice); wait for every replica \
                 (wait_replicas in a redis+sentinel:// URL, or RedisConfig::with_replica_acks, which a URL does not show)"
            ),
            FAILOVER,
        ),
        (Some("master"), None) => unreadable("replication", on, FAILOVER),
        (Some(role), _) => Check::new(
            format!("replication{on}"),
            Verdict::Fail,
            format!("the server is a {role}, not a master: grants on it are refused or lost"),
            FAILOVER,
        ),
        (None, _) => unreadable("replication", on, FAILOVER),
    }
}

/// What a `policy` other than `noeviction` evicts.
fn evicted(policy: &str) -> &'static str {
    if policy.starts_with("allkeys") {
        "any key, fence counters included (fences start again low)"
    } else {
        "held locks (keys with a TTL): a second holder is granted inside the first one's TTL"
    }
}

fn unreadable(name: &str, on: &str, protects: &'static str) -> Check {
    Check::new(
        format!("{name}{on}"),
        Verdict::Warn,
        "cannot be read (CONFIG or INFO disabled, renamed or not permitted): check it by hand",
        protects,
    )
}

/// `CONFIG GET` of `names`: `None` when the server refuses the command (disabled, renamed,
/// not permitted).
async fn config_get<C: ScanRoute + Send>(
    conn: &mut C,
    node: Option<RoutingInfo>,
    names: &[&str],
) -> Result<Option<HashMap<String, String>>> {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET");
    for name in names {
        cmd.arg(*name);
    }
    match conn.send_to(cmd, node).await {
        Ok(reply) => Ok(redis::FromRedisValue::from_redis_value(reply).ok()),
        Err(e) if is_refusal(&e) => Ok(None),
        Err(e) => Err(map(e, "doctor")),
    }
}

/// `INFO replication` as `field: value` (empty when the server refuses the command).
async fn info_replication<C: ScanRoute + Send>(
    conn: &mut C,
    node: Option<RoutingInfo>,
) -> Result<HashMap<String, String>> {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("replication");
    let text: String = match conn.send_to(cmd, node).await {
        Ok(reply) => redis::FromRedisValue::from_redis_value(reply).unwrap_or_default(),
        Err(e) if is_refusal(&e) => String::new(),
        Err(e) => return Err(map(e, "doctor")),
    };
    Ok(text
        .lines()
        .filter_map(|line| line.trim().split_once(':'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

/// A command the server answered with a refusal (unknown, renamed, not permitted), not a
/// connection that failed.
fn is_refusal(e: &redis::RedisError) -> bool {
    // Not LOADING, MASTERDOWN, CLUSTERDOWN, TRYAGAIN: a server that cannot answer now.
    matches!(e.code(), Some("ERR" | "NOPERM" | "NOAUTH" | "WRONGPASS"))
}
