//! `palisade inspect`'s view of the keys the service writes: `lock:{d:id}` (the holder's
//! token, with the waiters' mark) and `fence:{d:id}` (the counter, which outlives every
//! grant, so it is what a listing walks). Reads only.

use std::time::Duration;

use async_trait::async_trait;
use palisade_core::{
    Error, ErrorKind, Fence, GrantId, HolderView, InspectLocks, Listing, LockView, MAX_LISTED, OwnerToken, ResourceKey,
    Result, Waiters,
};
use redis::Value;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use crate::connection::Conn;
use crate::errors::map;
use crate::scripts::VIEW;
use crate::service::{BACKEND, RedisLockService};

/// How many keys a `SCAN` step asks for: enough to list a large keyspace in few round trips,
/// few enough that each step stays short on the server.
const SCAN_COUNT: usize = 1_000;

#[async_trait]
impl InspectLocks for RedisLockService {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn resources(&self, prefix: &str) -> Result<Listing<ResourceKey>> {
        let pattern = format!("fence:{{{}*", glob_escape(prefix));
        let mut names = Vec::new();
        let mut complete = true;
        match self.conn() {
            Conn::Server(mut conn) => complete = scan(&mut conn, None, &pattern, &mut names).await?,
            Conn::Cluster(mut conn) => {
                for (host, port) in primaries(&mut conn).await? {
                    let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
                    if !scan(&mut conn, Some(node), &pattern, &mut names).await? {
                        complete = false;
                        break;
                    }
                }
            }
        }
        let mut listing = Listing::of_names(names.iter().filter_map(|n| n.strip_prefix("fence:{")?.strip_suffix('}')));
        // A walk stopped early found more than it lists, in SCAN's order, not the keys'.
        listing.truncated |= !complete;
        Ok(listing)
    }

    async fn lock_view(&self, key: &ResourceKey) -> Result<LockView> {
        let mut invocation = VIEW.prepare_invoke();
        invocation.key(key.lock_key()).key(key.fence_key());
        let (reply, _) = self.invoke_script(&invocation, "inspect").await?;
        // Never the reply itself in an error: the lock's value is the holder's owner token.
        let bad = |what: &str| Error::new(ErrorKind::Backend, BACKEND, format!("inspect {key}: {what}"));
        let Value::Array(parts) = &reply else { return Err(bad("the reply is not an array")) };
        let [holder, pttl, counter] = parts.as_slice() else { return Err(bad("the reply is not three values")) };
        // No counter is a next fence of 1: none issued, or the counter lost with the data.
        let counter = match counter {
            Value::Nil => 0,
            Value::BulkString(b) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| bad("the fence counter is not a decimal integer"))?,
            _ => return Err(bad("the fence counter is not a string")),
        };
        let view = LockView::free(key.clone()).with_counter(Some(Fence::new(counter)));
        let holder = match holder {
            Value::Nil => return Ok(view),
            Value::BulkString(b) => std::str::from_utf8(b).map_err(|_| bad("the lock's value is not text"))?,
            _ => return Err(bad("the lock's value is not a string")),
        };
        let (token, marked) = match holder.strip_suffix('+') {
            Some(token) => (token, true),
            None => (holder, false),
        };
        let token = OwnerToken::parse_hex(token).map_err(|_| bad("the lock's value is not an owner token"))?;
        let left = match pttl {
            Value::Int(ms) => u64::try_from(*ms).ok().map(Duration::from_millis),
            _ => return Err(bad("the lock's time to live is not an integer")),
        };
        // The lock's value holds no fence: the holder's is the counter's, unless a repair
        // raised the counter after the grant, which the view cannot tell. Only callers that
        // wait through ACQUIRE mark the lock: without the mark, waiters may still poll.
        let view = if marked { view.with_waiters(Waiters::Marked) } else { view };
        Ok(view.held_by(HolderView::new(GrantId::of(&token), None, left)))
    }
}

/// `text` as a `SCAN MATCH` glob matching itself.
pub(crate) fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Walks one server's keyspace with `SCAN` (on `node` of a cluster), adding the names that
/// match `pattern` to `names`: whether the walk ended (`false`: it stopped once more than
/// [`MAX_LISTED`] were found).
pub(crate) async fn scan<C: redis::aio::ConnectionLike + ScanRoute>(
    conn: &mut C,
    node: Option<RoutingInfo>,
    pattern: &str,
    names: &mut Vec<String>,
) -> Result<bool> {
    let mut cursor = 0u64;
    loop {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(SCAN_COUNT);
        let reply = conn.send_to(cmd, node.clone()).await.map_err(|e| map(e, "inspect"))?;
        let (next, found): (u64, Vec<String>) = redis::FromRedisValue::from_redis_value(reply)
            .map_err(|e| Error::new(ErrorKind::Backend, BACKEND, format!("unexpected SCAN reply: {e}")))?;
        names.extend(found);
        cursor = next;
        if cursor == 0 {
            return Ok(true);
        }
        if names.len() > MAX_LISTED {
            return Ok(false);
        }
    }
}

/// Sends a command to one server, or to a chosen node of a cluster.
#[async_trait]
pub(crate) trait ScanRoute {
    async fn send_to(&mut self, cmd: redis::Cmd, node: Option<RoutingInfo>) -> redis::RedisResult<Value>;
}

#[async_trait]
impl ScanRoute for redis::aio::ConnectionManager {
    async fn send_to(&mut self, cmd: redis::Cmd, _: Option<RoutingInfo>) -> redis::RedisResult<Value> {
        cmd.query_async(self).await
    }
}

#[async_trait]
impl ScanRoute for redis::aio::MultiplexedConnection {
    async fn send_to(&mut self, cmd: redis::Cmd, _: Option<RoutingInfo>) -> redis::RedisResult<Value> {
        cmd.query_async(self).await
    }
}

#[async_trait]
impl ScanRoute for redis::cluster_async::ClusterConnection {
    async fn send_to(&mut self, cmd: redis::Cmd, node: Option<RoutingInfo>) -> redis::RedisResult<Value> {
        match node {
            Some(node) => self.route_command(cmd, node).await,
            None => cmd.query_async(self).await,
        }
    }
}

/// A cluster's primaries, as `CLUSTER NODES` on any node names them.
pub(crate) async fn primaries(conn: &mut redis::cluster_async::ClusterConnection) -> Result<Vec<(String, u16)>> {
    let nodes: String = redis::cmd("CLUSTER").arg("NODES").query_async(conn).await.map_err(|e| map(e, "inspect"))?;
    let mut out = Vec::new();
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some(address), Some(flags)) = (fields.get(1), fields.get(2)) else { continue };
        // A primary the others agree has failed holds no slots once its replica took over;
        // one only suspected (`fail?`) still serves its slots, and is walked.
        let flags: Vec<&str> = flags.split(',').collect();
        if !flags.contains(&"master") || flags.contains(&"fail") {
            continue;
        }
        // host:port@cport[,hostname]
        let address = address.split(['@', ',']).next().unwrap_or_default();
        match address.rsplit_once(':').map(|(host, port)| (host, port.parse())) {
            Some((host, Ok(port))) if !host.is_empty() => out.push((host.to_string(), port)),
            // A primary with no address known yet (a node still joining): its keys would be
            // missing from the listing, which must not pass for complete.
            _ => {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    BACKEND,
                    format!("inspect: a cluster primary has no address yet ({address:?}); try again"),
                )
                .with_retryable(true));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_matches_itself_in_a_scan_glob() {
        assert_eq!(glob_escape("alloc:W*H?[1]\\"), "alloc:W\\*H\\?\\[1\\]\\\\");
        assert_eq!(glob_escape(""), "");
    }
}
