//! Scenarios under real network partitions: a [`netns`](crate::netns) lab, where a client or a
//! server sits on a host of its own and a partition drops its packets (no closed socket, no
//! error: silence, as behind a failed switch).
//!
//! A backend author reaches them with a factory whose servers the lab's hosts can reach (bound
//! to [`Lab::gateway`](crate::netns::Lab::gateway), or on hosts of their own):
//!
//! ```no_run
//! # async fn demo<L, S>(lf: std::sync::Arc<L>, sf: std::sync::Arc<S>) -> Result<(), palisade_conformance::Failure>
//! # where L: palisade_conformance::LockServiceFactory,
//! #       L::Service: palisade_core::LockService<Fencing = palisade_core::Fenced>,
//! #       S: palisade_conformance::FencedStoreFactory {
//! use palisade_conformance::{Ctx, netns::Lab, partition};
//! let lab = Lab::new().expect("root and iproute2");
//! let host = lab.host().expect("a host");
//! partition::holder_cut_off(&Ctx::new("holder_cut_off", ""), &host, lf, sf).await?;
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use palisade_core::{
    Fence, Fenced, FencedStore, FencedStoreExt, GrantFence, Lease, LockOptions, LockService, LockServiceExt, WriteBatch,
};
use tokio::time::Instant;

use crate::harness::{Ctx, Outcome, attempt, ensure};
use crate::lock::KeptAlive;
use crate::netns::Host;
use crate::{FencedStoreFactory, LockServiceFactory, Namespace};

/// What [`holder_cut_off`] measured, beside its verdict (also in the report's notes).
#[derive(Debug, Clone, Copy)]
pub struct CutOffFigures {
    /// From the cut to the contender's grant.
    pub cut_to_contender_grant: Duration,
    /// From the heal to the cut-off holder's write being answered (refused, when fenced).
    pub heal_to_answer: Duration,
}

/// **The holder cut off past its TTL.** A holder on `host` (its lock client and its store
/// client opened there) acquires and keeps renewing; `host` is cut off from everything; a
/// contender in the caller's namespace waits for the lock (it must get it within the
/// service's expiry bound plus a second, and only once the holder's `safe_until` has passed:
/// the holder knew before anyone else gained) and writes; `host` is healed; the holder, still
/// holding its lease object, writes. That write must be refused as `StaleFence { its fence,
/// the contender's }`, the holder's lost signal must have fired, and the data must show only
/// the contender's write.
///
/// The factory's servers must be reachable from `host` (bound to the lab's gateway, or on
/// hosts of their own that are not cut).
pub async fn holder_cut_off<L, S>(ctx: &Ctx, host: &Host, lf: Arc<L>, sf: Arc<S>) -> Outcome
where
    L: LockServiceFactory,
    L::Service: LockService<Fencing = Fenced>,
    S: FencedStoreFactory,
{
    holder_cut_off_measured(ctx, host, lf, sf).await.map(|(report, _)| report)
}

/// [`holder_cut_off`], with its figures (what `palisade compare` reports).
pub async fn holder_cut_off_measured<L, S>(
    ctx: &Ctx,
    host: &Host,
    lf: Arc<L>,
    sf: Arc<S>,
) -> Result<(crate::Report, CutOffFigures), crate::Failure>
where
    L: LockServiceFactory,
    L::Service: LockService<Fencing = Fenced>,
    S: FencedStoreFactory,
{
    let ns = Namespace::new();
    let key = attempt!(ctx, ns.key("cut"), "key");
    let timing = lf.timing();
    let on_host = attempt!(ctx, host.runtime(), "a runtime on the holder's host");

    // The holder: everything it opens is opened on the host, and every call it makes runs
    // there (a reconnect made on the caller's threads would dodge the partition).
    let (holder_lf, holder_sf, holder_key) = (Arc::clone(&lf), Arc::clone(&sf), key.clone());
    let acquired = on_host.spawn(async move {
        let locks = holder_lf.client().await?;
        let store = holder_sf.client().await?;
        let lease = locks.lock(&holder_key, LockOptions::ttl(timing.ttl).wait(Duration::from_secs(30))).await?;
        let kept = KeptAlive::new(lease, timing.ttl / 3);
        Ok::<_, palisade_core::Error>((locks, store, kept))
    });
    let (holder_locks, holder_store, kept) =
        attempt!(ctx, attempt!(ctx, acquired.await, "the holder's task"), "the holder's acquire on its host");
    let fa = kept.lease().fence();
    let contender = attempt!(ctx, lf.client().await, "the contender's client");
    let store_b = attempt!(ctx, sf.client().await, "the contender's store client");

    attempt!(ctx, host.cut(), "cutting the holder's host off");
    let cut = Instant::now();
    let wait = timing.expiry_bound() + Duration::from_secs(1);
    let lease_b = contender.lock(&key, LockOptions::ttl(timing.ttl).wait(wait + Duration::from_secs(30))).await;
    let granted = Instant::now();
    let lease_b = match lease_b {
        Ok(lease) => lease,
        Err(e) => {
            let _ = host.heal();
            return Err(ctx.fail(format!("the contender got no lock while the holder was cut off: {e}")));
        }
    };
    let cut_to_grant = granted - cut;
    let holder_safe_until = kept.lease().safe_until();
    ensure!(
        ctx,
        holder_safe_until <= granted,
        "the contender was granted while the cut-off holder still believed it held the lock \
         (its safe_until was {:?} ahead)",
        holder_safe_until - granted
    );
    ensure!(
        ctx,
        cut_to_grant <= wait,
        "the contender waited {cut_to_grant:?} after the cut, more than the expiry bound + 1 s ({wait:?})"
    );
    let fb = lease_b.fence();
    ensure!(ctx, fb > fa, "the contender's fence {fb} is not above the cut-off holder's {fa}");
    attempt!(ctx, write(&*store_b, &lease_b, &batch(&ns, "B")).await, "the contender's write");

    attempt!(ctx, host.heal(), "healing the holder's host");
    let healed = Instant::now();
    let (write_ns, record) = (ns.clone(), kept);
    let wrote = on_host.spawn(async move {
        let lost = tokio::time::timeout(Duration::from_millis(100), record.lease().lost()).await.is_ok();
        let result = tokio::time::timeout(
            Duration::from_secs(60),
            write(&*holder_store, record.lease(), &batch(&write_ns, "A")),
        )
        .await;
        record.end().await;
        drop(holder_locks);
        (lost, result)
    });
    let (lost, result) = attempt!(ctx, wrote.await, "the holder's task");
    let heal_to_answer = healed.elapsed();
    let result = attempt!(ctx, result, "the healed holder's write (no answer in 60 s)");
    match result {
        Ok(()) => return Err(ctx.fail(format!("the cut-off holder's write with fence {fa} was accepted after {fb}"))),
        Err(e) => match e.stale_fence_details() {
            Some((presented, current)) => ensure!(
                ctx,
                (presented, current) == (fa, fb),
                "the cut-off holder was refused as stale {presented} {current}, expected {fa} {fb}"
            ),
            None => return Err(ctx.fail(format!("the cut-off holder's write failed, not as stale: {e}"))),
        },
    }
    ensure!(ctx, lost, "the cut-off holder's lost signal had not fired by the time it wrote");
    let data = attempt!(ctx, store_b.read(&ns.record("data")).await, "read");
    ensure!(ctx, data.as_ref().map(|r| r.value.as_slice()) == Some(b"B"), "data after the stale write: {data:?}");
    let audit_a = attempt!(ctx, store_b.read(&ns.record("audit/A")).await, "read");
    ensure!(ctx, audit_a.is_none(), "the cut-off holder's audit record landed");
    let _ = lease_b.release().await;
    ctx.note(format!(
        "cut off with fence {fa}: the contender got {fb} {:.0} ms after the cut; the write after the heal was \
         refused {:.0} ms after it",
        cut_to_grant.as_secs_f64() * 1e3,
        heal_to_answer.as_secs_f64() * 1e3
    ));
    Ok((ctx.report(), CutOffFigures { cut_to_contender_grant: cut_to_grant, heal_to_answer }))
}

fn batch(ns: &Namespace, who: &str) -> WriteBatch {
    WriteBatch::new()
        .put(ns.record("data"), who.as_bytes().to_vec())
        .put(ns.record(&format!("audit/{who}")), who.as_bytes().to_vec())
}

async fn write<L, S>(store: &S, lease: &Lease<L>, batch: &WriteBatch) -> palisade_core::Result<()>
where
    L: LockService<Fencing = Fenced> + ?Sized,
    S: FencedStore + ?Sized,
{
    let fence: Fence = lease.fence();
    store.write_fenced(lease.key(), GrantFence::new(fence, lease.grant().grant_id()), batch).await
}
