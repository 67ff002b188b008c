//! `palisade inspect`'s view of the keys the service writes: each resource's queue of
//! contenders under `<prefix>lock:{d:id}/`, the first (lowest create revision) holding the
//! lock, and the epoch key. Reads only.

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse};
use palisade_core::{
    Error, ErrorKind, GrantId, HolderView, InspectLocks, Listing, LockView, OwnerToken, ResourceKey, Result, Waiters,
};

use crate::BACKEND;
use crate::errors::with_failover;
use crate::reply::{compose_fence, decode_epoch};
use crate::service::EtcdLockService;

#[async_trait]
impl InspectLocks for EtcdLockService {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// The resources with a holder or a queue: etcd keeps nothing for a released resource
    /// (its fences are revisions, not a counter of its own).
    async fn resources(&self, prefix: &str) -> Result<Listing<ResourceKey>> {
        let inner = self.inner();
        let locks = format!("{}lock:{{", inner.config.key_prefix);
        let from = format!("{locks}{prefix}");
        let resp = with_failover(inner.config.request_timeout, "inspect", false, true, || {
            let (mut kv, from) = (inner.client.kv_client(), from.clone());
            async move { kv.get(from, Some(GetOptions::new().with_prefix().with_keys_only())).await }
        })
        .await?;
        Ok(Listing::of_names(
            resp.kvs()
                .iter()
                .filter_map(|kv| std::str::from_utf8(kv.key()).ok())
                .filter_map(|k| k.strip_prefix(locks.as_str())?.rsplit_once("}/").map(|(resource, _)| resource)),
        ))
    }

    async fn lock_view(&self, key: &ResourceKey) -> Result<LockView> {
        let inner = self.inner();
        let queue = inner.resource_prefix(key);
        let epoch_key = inner.epoch_key.clone();
        let sorted = GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Ascend);
        let counted = GetOptions::new().with_prefix().with_count_only();
        let txn = || {
            Txn::new().and_then([
                TxnOp::get(queue.as_str(), Some(sorted.clone().with_limit(1))),
                TxnOp::get(queue.as_str(), Some(counted.clone())),
                TxnOp::get(epoch_key.as_str(), None),
            ])
        };
        let resp = inner.txn(txn, "inspect", false).await?;
        let bad = |what: &str| Error::new(ErrorKind::Backend, BACKEND, format!("etcd answered inspect {key} {what}"));
        let gets: Vec<_> = resp
            .op_responses()
            .into_iter()
            .filter_map(|r| match r {
                TxnOpResponse::Get(g) => Some(g),
                _ => None,
            })
            .collect();
        let [first, count, epoch] = gets.as_slice() else { return Err(bad("without its three reads")) };
        let epoch_kv = epoch.kvs().first();
        let epoch_raised_at = epoch_kv.map_or(0, |kv| kv.mod_revision());
        let epoch = decode_epoch(epoch_kv.map(|kv| kv.value()))?;
        let revision = resp.header().map(|h| h.revision()).ok_or_else(|| bad("without a header"))?;
        // The next grant's fence is a revision after this one: the store's revision is the
        // counter.
        let view = LockView::free(key.clone()).with_counter(Some(compose_fence(epoch, revision)?));
        let Some(holder) = first.kvs().first() else { return Ok(view.with_waiters(Waiters::None)) };
        let queued = u64::try_from(count.count()).unwrap_or(0).saturating_sub(1);
        let token = std::str::from_utf8(holder.value())
            .ok()
            .and_then(|t| OwnerToken::parse_hex(t).ok())
            .ok_or_else(|| bad("with a holder key whose value is not an owner token"))?;
        // The service composes a grant's fence with the epoch it read at the grant: a repair
        // that raised the epoch after the holder queued leaves it unknown which one that was.
        let fence = if epoch_raised_at > holder.create_revision() {
            None
        } else {
            Some(compose_fence(epoch, holder.create_revision())?)
        };
        let left = self.lease_left(holder.lease()).await?;
        Ok(view.with_waiters(Waiters::Queued(queued)).held_by(HolderView::new(GrantId::of(&token), fence, left)))
    }
}

impl EtcdLockService {
    /// How long the lease `id` has left on the server (`None` for no lease or one gone).
    async fn lease_left(&self, id: i64) -> Result<Option<Duration>> {
        if id == 0 {
            return Ok(None);
        }
        let inner = self.inner();
        let resp = with_failover(inner.config.request_timeout, "inspect (lease)", false, true, || {
            let mut lease = inner.client.lease_client();
            async move { lease.time_to_live(id, None).await }
        })
        .await?;
        Ok(u64::try_from(resp.ttl()).ok().map(Duration::from_secs))
    }
}
