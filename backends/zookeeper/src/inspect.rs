//! `palisade inspect`'s view of the nodes the service writes: each resource's queue of
//! contender nodes `lock-<token>-<sequence>` under `<root>/<domain>/<id>` (the first in queue
//! order holds the lock) and the epoch node. Reads only.

use async_trait::async_trait;
use palisade_core::{
    Error, ErrorKind, GrantId, HolderView, InspectLocks, Listing, LockView, MAX_LISTED, OwnerToken, ResourceKey,
    Result, Waiters,
};
use tokio::time::timeout;
use zookeeper_client as zk;

use crate::BACKEND;
use crate::service::{ZkLockService, decode_epoch, fence_of, queue_order, sequence_of};

#[async_trait]
impl InspectLocks for ZkLockService {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// The resources with a holder or a queue: ZooKeeper deletes a resource's parent node
    /// once its last contender has gone (its fences are transaction ids, not a counter of its
    /// own).
    async fn resources(&self, prefix: &str) -> Result<Listing<ResourceKey>> {
        let client = self.client().await?;
        let root = self.config().root.clone();
        let mut names = Vec::new();
        let mut domains = self.children(&client, &root).await?;
        domains.sort();
        for domain in domains {
            // A domain cannot match unless its text and the prefix agree as far as either goes.
            let text = format!("{domain}:");
            if !(text.starts_with(prefix) || prefix.starts_with(&text)) {
                continue;
            }
            for id in self.children(&client, &format!("{root}/{domain}")).await? {
                let name = format!("{domain}:{id}");
                if name.starts_with(prefix) {
                    names.push(name);
                }
            }
            if names.len() > MAX_LISTED {
                break;
            }
        }
        Ok(Listing::of_names(names.iter().map(String::as_str)))
    }

    async fn lock_view(&self, key: &ResourceKey) -> Result<LockView> {
        let client = self.client().await?;
        let parent = self.parent_path(key);
        let request = self.config().request_timeout;
        let listed = timeout(request, client.get_children(&parent)).await.map_err(|_| timed_out())?;
        let (children, parent_stat) = match listed {
            Ok(found) => found,
            // Nobody holds or waits: the next grant's fence is above the ensemble's zxid now,
            // which no read here returns, so the counter is unknown.
            Err(zk::Error::NoNode) => return Ok(LockView::free(key.clone()).with_waiters(Waiters::None)),
            Err(e) => return Err(failed(e)),
        };
        let (epoch, epoch_raised_at) =
            match timeout(request, client.get_data(&self.epoch_path())).await.map_err(|_| timed_out())? {
                Ok((data, stat)) => (decode_epoch(Some(&data))?, stat.mzxid),
                Err(zk::Error::NoNode) => (0, 0),
                Err(e) => return Err(failed(e)),
            };
        // Every grant's node is a child of the parent, created after its last change: the next
        // grant's fence is above the parent's `pzxid`.
        let view = LockView::free(key.clone()).with_counter(Some(fence_of(epoch, parent_stat.pzxid)?));
        let mut queue: Vec<(i32, String)> =
            children.into_iter().filter_map(|c| sequence_of(&c).map(|s| (s, c))).collect();
        queue_order(&mut queue);
        let Some((_, first)) = queue.first() else { return Ok(view.with_waiters(Waiters::None)) };
        // Never the node's name in an error: it holds the holder's owner token.
        let bad = || {
            Error::new(ErrorKind::Backend, BACKEND, format!("the first lock node under {parent} names no owner token"))
        };
        let token = first
            .strip_prefix("lock-")
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(token, _)| OwnerToken::parse_hex(token).ok())
            .ok_or_else(bad)?;
        let stat = timeout(request, client.check_stat(&format!("{parent}/{first}"))).await.map_err(|_| timed_out())?;
        let view = view.with_waiters(Waiters::Queued(u64::try_from(queue.len() - 1).unwrap_or(0)));
        Ok(match stat.map_err(failed)? {
            // Session-bound: the lock lasts as long as its holder's session.
            // The service composes a grant's fence with the epoch it read at the grant: a repair
            // that raised the epoch after the holder queued leaves it unknown which one that was.
            Some(stat) => {
                let fence = if epoch_raised_at > stat.czxid { None } else { Some(fence_of(epoch, stat.czxid)?) };
                view.held_by(HolderView::new(GrantId::of(&token), fence, None))
            }
            // Released between the two reads.
            None => view,
        })
    }
}

impl ZkLockService {
    /// The children of `path` (none when it does not exist).
    async fn children(&self, client: &zk::Client, path: &str) -> Result<Vec<String>> {
        match timeout(self.config().request_timeout, client.list_children(path)).await.map_err(|_| timed_out())? {
            Ok(children) => Ok(children),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(failed(e)),
        }
    }
}

fn failed(e: zk::Error) -> Error {
    crate::service::map(e, "inspect", false)
}

fn timed_out() -> Error {
    crate::service::timed_out("inspect", false)
}
