//! The Redlock service: the algorithm over the masters.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::join_all;
use palisade_core::spi::{Backoff, poll_acquire};
use palisade_core::{
    Capabilities, Deployment, Error, ErrorKind, FenceSource, Grant, LockService, OwnerToken, Replication, ResourceKey,
    Result, Ttl, Unfenced, Waiting,
};
use redis::Script;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::config::RedlockConfig;
use crate::node::{Node, Reply};
use crate::scripts::{EXTEND, RELEASE};

pub(crate) const BACKEND: &str = "redlock";

/// Redlock over N independent Redis masters: an **efficiency lock without a fence**.
///
/// One instance is one client: a multiplexed connection per master. Share it behind an `Arc`.
/// See the [crate docs](crate) for the algorithm, its assumptions, and when to use it.
pub struct RedlockService {
    config: RedlockConfig,
    nodes: Vec<Arc<Node>>,
}

/// How the masters answered one round.
#[derive(Debug, Default)]
struct Tally {
    yes: usize,
    no: usize,
    failures: Vec<String>,
}

impl Tally {
    fn of(replies: Vec<Reply>) -> Self {
        let mut tally = Tally::default();
        for reply in replies {
            match reply {
                Reply::Yes => tally.yes += 1,
                Reply::No => tally.no += 1,
                Reply::Failed(why) => tally.failures.push(why),
            }
        }
        tally
    }

    fn answered(&self) -> usize {
        self.yes + self.no
    }
}

impl RedlockService {
    /// Connects to the masters of a `redlock://host:port[,host:port…]` URL
    /// (see [`RedlockConfig::parse`]).
    pub async fn connect(url: &str) -> Result<Self> {
        RedlockService::connect_with(RedlockConfig::parse(url)?).await
    }

    /// Connects to every master in parallel. Succeeds when a majority is reachable (the others
    /// are connected on first use); otherwise [`ErrorKind::Unavailable`] naming the failures.
    pub async fn connect_with(config: RedlockConfig) -> Result<Self> {
        config.validate()?;
        let nodes = config
            .nodes
            .iter()
            .enumerate()
            .map(|(i, url)| Node::new(i + 1, url, config.node_timeout, config.connect_timeout).map(Arc::new))
            .collect::<Result<Vec<_>>>()?;
        let failures: Vec<String> =
            join_all(nodes.iter().map(|n| n.connect())).await.into_iter().filter_map(|r| r.err()).collect();
        let reachable = nodes.len() - failures.len();
        if reachable < config.quorum() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                BACKEND,
                format!(
                    "only {reachable} of {} masters reachable; a majority ({}) is needed: {}",
                    nodes.len(),
                    config.quorum(),
                    failures.join("; ")
                ),
            )
            .with_retryable(true));
        }
        for failure in &failures {
            warn!(failure = %failure, "redlock master unreachable at connect; will retry on use");
        }
        debug!(masters = nodes.len(), quorum = config.quorum(), "redlock service connected");
        Ok(RedlockService { config, nodes })
    }

    /// The settings in use.
    pub fn config(&self) -> &RedlockConfig {
        &self.config
    }

    /// The masters, in the URL's order.
    pub(crate) fn nodes(&self) -> &[Arc<Node>] {
        &self.nodes
    }

    /// The key on every master: `redlock:{domain:id}` (apart from the Redis backend's
    /// `lock:{domain:id}`, so the two never share a key by accident).
    pub(crate) fn redis_key(key: &ResourceKey) -> String {
        format!("redlock:{{{}:{}}}", key.domain(), key.id())
    }

    fn unavailable(&self, what: &str, tally: &Tally) -> Error {
        Error::new(
            ErrorKind::Unavailable,
            BACKEND,
            format!(
                "{what}: only {} of {} masters answered; a majority ({}) is needed: {}",
                tally.answered(),
                self.nodes.len(),
                self.config.quorum(),
                tally.failures.join("; ")
            ),
        )
        .with_retryable(true)
    }

    fn reported_ttl(&self, ttl: Ttl) -> Result<Ttl> {
        self.config.reported_ttl(ttl).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                BACKEND,
                format!(
                    "TTL {:?} leaves no validity after the clock-drift allowance of {:?}",
                    ttl.get(),
                    self.config.drift(ttl.get())
                ),
            )
        })
    }

    /// Whether a round that started at `started` still has validity left.
    fn still_valid(&self, ttl: Ttl, started: Instant) -> bool {
        started.elapsed() + self.config.drift(ttl.get()) < ttl.get()
    }

    async fn on_every_node(&self, script: &Script, what: &str, key: &str, token: &[u8], ttl_ms: Option<u64>) -> Tally {
        Tally::of(join_all(self.nodes.iter().map(|n| n.compare_token(what, script, key, token, ttl_ms))).await)
    }

    /// Deletes the key wherever it still holds `token`, also on masters that failed to answer
    /// (their `SET` may have landed, or may still land: bytes held up by a partition arrive
    /// when it heals). A master that fails again is retried in the background until `until`
    /// (the TTL's end, when the key expires there anyway), so a late `SET` is not left holding
    /// the lock on it with nobody to release it.
    async fn release_everywhere(&self, key: &str, token: &[u8], until: Instant) {
        let replies = join_all(self.nodes.iter().map(|n| n.compare_token("release", &RELEASE, key, token, None))).await;
        for (node, reply) in self.nodes.iter().zip(replies) {
            if let Reply::Failed(why) = reply {
                debug!(key, failure = %why, "a master missed the clean-up; retrying it in the background");
                let (node, key, token) = (Arc::clone(node), key.to_string(), token.to_vec());
                tokio::spawn(async move {
                    let mut backoff = Backoff::with_bounds(Duration::from_millis(20), Duration::from_millis(250));
                    while Instant::now() < until {
                        tokio::time::sleep(backoff.next_delay()).await;
                        if !matches!(
                            node.compare_token("release", &RELEASE, &key, &token, None).await,
                            Reply::Failed(_)
                        ) {
                            return;
                        }
                    }
                });
            }
        }
    }

    /// One round of the algorithm.
    async fn attempt(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Unfenced>>> {
        let reported = self.reported_ttl(ttl)?;
        let token = OwnerToken::generate()?;
        let (redis_key, token_hex, ttl_ms) = (Self::redis_key(key), token.to_hex(), ttl.as_millis_ceil());
        let token_text = &token_hex[..];
        let started = Instant::now();
        let tally = Tally::of(join_all(self.nodes.iter().map(|n| n.set_nx_px(&redis_key, token_text, ttl_ms))).await);
        let quorum = self.config.quorum();
        if tally.yes >= quorum && self.still_valid(ttl, started) {
            if !tally.failures.is_empty() {
                debug!(key = %key, failures = ?tally.failures, "granted by a majority; some masters failed");
            }
            return Ok(Some(Grant::new(key.clone(), token, (), reported, started)));
        }
        if tally.yes > 0 || !tally.failures.is_empty() {
            self.release_everywhere(&redis_key, token_text, started + ttl.get()).await;
        }
        if tally.yes >= quorum {
            return Err(Error::new(
                ErrorKind::Unavailable,
                BACKEND,
                format!(
                    "acquiring {key} took {:?}, which leaves no validity of the {:?} TTL",
                    started.elapsed(),
                    ttl.get()
                ),
            )
            .with_retryable(true));
        }
        if tally.answered() < quorum {
            return Err(self.unavailable(&format!("acquire {key}"), &tally));
        }
        Ok(None)
    }
}

#[async_trait]
impl LockService for RedlockService {
    type Fencing = Unfenced;

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fence_source: FenceSource::None,
            waiting: Waiting::Polling,
            deployment: Deployment::Network,
            // One master is the degenerate case: a majority of one.
            replication: if self.nodes.len() > 1 { Replication::ClientMajority } else { Replication::None },
            ..Capabilities::default()
        }
    }

    /// One round: `SET NX PX` on every master at once; granted when a majority said yes and
    /// validity is left; otherwise released everywhere and `Ok(None)` (held or split), or
    /// [`ErrorKind::Unavailable`] (retryable) when fewer than a majority answered.
    async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Unfenced>>> {
        self.attempt(key, ttl).await
    }

    /// Rounds separated by a random delay of up to [`RedlockConfig::retry_delay`]. A retryable
    /// error (too few masters answered) is retried too; if the wait runs out right after one,
    /// that error is returned instead of [`ErrorKind::Timeout`].
    async fn acquire(&self, key: &ResourceKey, ttl: Ttl, wait: Duration) -> Result<Grant<Unfenced>> {
        self.reported_ttl(ttl)?;
        let jitter = Backoff::with_bounds(self.config.retry_delay, self.config.retry_delay);
        poll_acquire(BACKEND, key, wait, jitter, true, || self.attempt(key, ttl)).await
    }

    /// The compare-token `PEXPIRE` on every master; extended when a majority did it with
    /// validity left. Otherwise the key is released wherever it is still ours, and the error is
    /// [`ErrorKind::NotHolder`] (a majority answered that the key is not ours) or
    /// [`ErrorKind::Unavailable`].
    async fn extend(&self, grant: &Grant<Unfenced>, ttl: Ttl) -> Result<Ttl> {
        let reported = self.reported_ttl(ttl)?;
        let (redis_key, token) = (Self::redis_key(grant.key()), grant.token().to_hex());
        let started = Instant::now();
        let tally = self.on_every_node(&EXTEND, "extend", &redis_key, &token[..], Some(ttl.as_millis_ceil())).await;
        if tally.yes >= self.config.quorum() && self.still_valid(ttl, started) {
            return Ok(reported);
        }
        if tally.yes > 0 {
            self.release_everywhere(&redis_key, &token[..], started + ttl.get()).await;
        }
        if tally.answered() < self.config.quorum() {
            return Err(self.unavailable(&format!("extend {}", grant.key()), &tally));
        }
        Err(Error::new(
            ErrorKind::NotHolder,
            BACKEND,
            format!(
                "{} is held by this owner token on only {} of {} masters",
                grant.key(),
                tally.yes,
                self.nodes.len()
            ),
        ))
    }

    /// The compare-token `DEL` on every master. `Ok` when a majority deleted our key;
    /// [`ErrorKind::NotHolder`] when a majority answered that it was not ours (expired, taken
    /// over, released already); [`ErrorKind::Unavailable`] when too few answered (the key then
    /// expires at its TTL).
    async fn release(&self, grant: &Grant<Unfenced>) -> Result<()> {
        let (redis_key, token) = (Self::redis_key(grant.key()), grant.token().to_hex());
        let tally = self.on_every_node(&RELEASE, "release", &redis_key, &token[..], None).await;
        if tally.yes >= self.config.quorum() {
            return Ok(());
        }
        if tally.answered() < self.config.quorum() {
            return Err(self.unavailable(&format!("release {}", grant.key()), &tally));
        }
        Err(Error::new(
            ErrorKind::NotHolder,
            BACKEND,
            format!(
                "{} was held by this owner token on only {} of {} masters",
                grant.key(),
                tally.yes,
                self.nodes.len()
            ),
        ))
    }
}

impl fmt::Debug for RedlockService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockService").field("config", &self.config).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_apart_from_the_redis_backend() {
        let key = ResourceKey::new("alloc", "WH-01").unwrap();
        assert_eq!(RedlockService::redis_key(&key), "redlock:{alloc:WH-01}");
        assert_ne!(RedlockService::redis_key(&key), key.lock_key());
    }

    #[tokio::test]
    async fn no_majority_reachable_is_unavailable() {
        // Ports nobody listens on (bound then dropped); refused at once on loopback.
        let ports: Vec<u16> =
            (0..3).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()).collect();
        let url = format!("redlock://{}", ports.iter().map(|p| format!("127.0.0.1:{p}")).collect::<Vec<_>>().join(","));
        let err = RedlockService::connect(&url).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
        assert!(err.is_retryable());
        assert!(err.to_string().contains("only 0 of 3 masters reachable"), "{err}");
    }
}
