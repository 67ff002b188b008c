//! `palisade inspect` and `palisade doctor` for Redlock: each master read as the Redis backend
//! reads a server ([`palisade_redis::server`]), and judged together. Reads only.
//!
//! A Redlock lock is held where one token is on a majority of the masters: the view shows that
//! holder (by its grant id), with the time left on the soonest of those masters. There is no
//! fence to show: Redlock issues none.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::join_all;
use palisade_core::{
    Check, Diagnose, Error, ErrorKind, GrantId, HolderView, InspectLocks, Listing, LockView, OwnerToken, ResourceKey,
    Result, Verdict,
};

use crate::service::{BACKEND, RedlockService};

const PREFIX: &str = "redlock:{";
const MAJORITY: &str = "a lock has one holder while a majority of masters keeps its key";

impl RedlockService {
    /// Whether `answered` masters are enough to tell who holds a lock (a majority).
    fn enough(&self, answered: usize, what: &str, failures: &[String]) -> Result<()> {
        if answered >= self.config().quorum() {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            BACKEND,
            format!(
                "{what}: only {answered} of {} masters answered, and a majority ({}) is needed: {}",
                self.nodes().len(),
                self.config().quorum(),
                failures.join("; ")
            ),
        )
        .with_retryable(true))
    }
}

#[async_trait]
impl InspectLocks for RedlockService {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// The resources with a key on any master that answers (a majority must).
    async fn resources(&self, prefix: &str) -> Result<Listing<ResourceKey>> {
        let wanted = format!("{PREFIX}{prefix}");
        let walks = join_all(self.nodes().iter().map(|node| {
            let wanted = wanted.clone();
            async move {
                let mut conn = node.reader().await?;
                tokio::time::timeout(
                    node.node_timeout() * 10,
                    palisade_redis::server::keys_starting_with(&mut conn, &wanted),
                )
                .await
                .map_err(|_| format!("{}: SCAN timed out", node.label()))?
                .map_err(|e| format!("{}: {}", node.label(), e.report()))
            }
        }))
        .await;
        let (mut names, mut complete, mut answered, mut failures) = (BTreeSet::new(), true, 0, Vec::new());
        for walk in walks {
            match walk {
                Ok((found, ended)) => {
                    answered += 1;
                    complete &= ended;
                    names.extend(found);
                }
                Err(e) => failures.push(e),
            }
        }
        self.enough(answered, "inspect", &failures)?;
        let mut listing = Listing::of_names(names.iter().filter_map(|n| n.strip_prefix(PREFIX)?.strip_suffix('}')));
        listing.truncated |= !complete;
        Ok(listing)
    }

    async fn lock_view(&self, key: &ResourceKey) -> Result<LockView> {
        let name = RedlockService::redis_key(key);
        let reads = join_all(self.nodes().iter().map(|node| {
            let name = name.clone();
            async move {
                let mut conn = node.reader().await?;
                let mut pipe = redis::pipe();
                pipe.get(&name).cmd("PTTL").arg(&name);
                let read = pipe.query_async::<(Option<String>, i64)>(&mut conn);
                match tokio::time::timeout(node.node_timeout(), read).await {
                    Ok(Ok(answer)) => Ok(answer),
                    Ok(Err(e)) => Err(format!("{}: {e}", node.label())),
                    Err(_) => Err(format!("{}: no answer in {:?}", node.label(), node.node_timeout())),
                }
            }
        }))
        .await;
        let (mut by_token, mut answered, mut failures) = (HashMap::<String, Vec<i64>>::new(), 0, Vec::new());
        for read in reads {
            match read {
                Ok((Some(token), left_ms)) => {
                    answered += 1;
                    by_token.entry(token).or_default().push(left_ms);
                }
                Ok((None, _)) => answered += 1,
                Err(e) => failures.push(e),
            }
        }
        self.enough(answered, "inspect", &failures)?;
        let view = LockView::free(key.clone());
        let holder = by_token.into_iter().find(|(_, lefts)| lefts.len() >= self.config().quorum());
        let Some((token, lefts)) = holder else { return Ok(view) };
        // Never the token itself in an error: it could release the lock.
        let token = OwnerToken::parse_hex(&token).map_err(|_| {
            Error::new(
                ErrorKind::Backend,
                BACKEND,
                format!("the key of {key} holds something other than an owner token"),
            )
        })?;
        // The lock lasts while a majority keeps it: until the majority-th soonest expiry.
        let mut lefts: Vec<i64> = lefts.into_iter().filter(|ms| *ms >= 0).collect();
        lefts.sort_unstable_by(|a, b| b.cmp(a));
        let left =
            lefts.get(self.config().quorum().saturating_sub(1)).map(|ms| Duration::from_millis(ms.unsigned_abs()));
        Ok(view.held_by(HolderView::new(GrantId::of(&token), None, left)))
    }
}

#[async_trait]
impl Diagnose for RedlockService {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn diagnose(&self) -> Result<Vec<Check>> {
        let masters = self.nodes().len();
        let mut checks = vec![masters_check(masters)];
        for node in self.nodes() {
            let on = format!(" on {}", node.label());
            match node.reader().await {
                Ok(mut conn) => checks.extend(palisade_redis::server::settings_checks(&mut conn, &on).await?),
                Err(e) => checks.push(Check::new(
                    format!("reachable{on}"),
                    Verdict::Fail,
                    format!("{e}: while it is down, one master fewer stands between the locks and a lost majority"),
                    MAJORITY,
                )),
            }
        }
        Ok(checks)
    }
}

fn masters_check(masters: usize) -> Check {
    palisade_core::spi::majority_group(
        "masters",
        masters,
        "master",
        "keep the masters independent (no replicas, separate machines)",
        MAJORITY,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn master_counts() {
        assert_eq!(masters_check(1).verdict, Verdict::Warn);
        assert_eq!(masters_check(3).verdict, Verdict::Pass);
        assert_eq!(masters_check(4).verdict, Verdict::Warn);
        assert_eq!(masters_check(5).verdict, Verdict::Pass);
    }
}
