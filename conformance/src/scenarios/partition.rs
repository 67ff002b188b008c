//! Scenarios under real network partitions: a [`netns`](palisade_lab::netns) lab, where a client or a
//! server sits on a host of its own and a partition drops its packets (no closed socket, no
//! error: silence, as behind a failed switch).
//!
//! A backend author reaches them with a factory whose servers the lab's hosts can reach (bound
//! to [`Lab::gateway`](palisade_lab::netns::Lab::gateway), or on hosts of their own):
//!
//! ```no_run
//! # async fn demo<L, S>(lf: std::sync::Arc<L>, sf: std::sync::Arc<S>) -> Result<(), palisade_conformance::Failure>
//! # where L: palisade_conformance::LockServiceFactory + 'static,
//! #       L::Service: palisade_core::LockService<Fencing = palisade_core::Fenced>,
//! #       S: palisade_conformance::FencedStoreFactory + 'static {
//! use palisade_conformance::{Ctx, partition};
//! use palisade_lab::netns::Lab;
//! let lab = Lab::new().expect("root and iproute2");
//! let host = lab.host().expect("a host");
//! partition::holder_cut_off(&Ctx::new("holder_cut_off", ""), &host, lf, sf).await?;
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use palisade_core::{
    DynFencedStore, Fence, Fenced, FencedStore, LockOptions, LockService, LockServiceExt, ResourceKey,
};
use tokio::time::Instant;

use crate::cluster::{LeaderKillReport, LeaderKillSettings, leader_killed_under_contention};
use crate::e2e::{data_batch, write};
use crate::harness::{Ctx, Outcome, attempt, ensure};
use crate::lock::KeptAlive;
use crate::{FencedStoreFactory, LockServiceFactory, Namespace};
use palisade_lab::netns::Host;
use palisade_lab::servers::{EtcdCluster, ZkEnsemble};

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
    L: LockServiceFactory + 'static,
    L::Service: LockService<Fencing = Fenced>,
    S: FencedStoreFactory + 'static,
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
    L: LockServiceFactory + 'static,
    L::Service: LockService<Fencing = Fenced>,
    S: FencedStoreFactory + 'static,
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
    attempt!(ctx, write(&*store_b, &lease_b, &data_batch(&ns, "B")).await, "the contender's write");

    attempt!(ctx, host.heal(), "healing the holder's host");
    let healed = Instant::now();
    let (write_ns, record) = (ns.clone(), kept);
    let wrote = on_host.spawn(async move {
        let lost = tokio::time::timeout(Duration::from_millis(100), record.lease().lost()).await.is_ok();
        let result = tokio::time::timeout(
            Duration::from_secs(60),
            write(&*holder_store, record.lease(), &data_batch(&write_ns, "A")),
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

/// A replicated service whose members sit on lab hosts, member `i` on `hosts[i]`
/// ([`EtcdCluster::start_at`], [`ZkEnsemble::start_at`] with [`Site::host`]).
///
/// [`Site::host`]: palisade_lab::servers::Site::host
pub trait Members {
    /// The member that says it leads now, if any.
    fn leader(&self) -> Option<usize>;
    /// Whether member `i` serves clients (part of a quorum).
    fn serving(&self, i: usize) -> bool;
}

impl Members for EtcdCluster {
    fn leader(&self) -> Option<usize> {
        EtcdCluster::leader(self)
    }
    fn serving(&self, i: usize) -> bool {
        self.member_healthy(i)
    }
}

impl Members for ZkEnsemble {
    fn leader(&self) -> Option<usize> {
        ZkEnsemble::leader(self)
    }
    fn serving(&self, i: usize) -> bool {
        ZkEnsemble::serving(self, i)
    }
}

/// What [`leader_cut_off_under_contention`] saw.
#[derive(Debug, Clone)]
pub struct LeaderCutReport {
    /// The contention across the cut, as for a killed leader (`killed` names the member cut off).
    pub contention: LeaderKillReport,
    /// From the heal until the old leader served again as a member.
    pub rejoined_after: Option<Duration>,
    /// After the rejoin: the fence of a new grant of the first key, and the highest fence the
    /// store had accepted for it.
    pub fence_after_heal: Option<(Fence, Fence)>,
}

impl LeaderCutReport {
    /// `Ok` when the contention was safe and live ([`LeaderKillReport::check`]), every error
    /// the clients saw was typed as what a partition causes (never `backend`, which a caller
    /// would not retry), the old leader rejoined, and fences went on growing past it.
    pub fn check(&self) -> Result<(), String> {
        let mut wrong = Vec::new();
        if let Err(e) = self.contention.check() {
            wrong.push(e);
        }
        let misfiled: Vec<&String> = self.contention.errors.iter().filter(|e| e.starts_with("backend ")).collect();
        if !misfiled.is_empty() {
            wrong.push(format!("partition errors reported as backend errors: {misfiled:?}"));
        }
        if self.rejoined_after.is_none() {
            wrong.push("the old leader did not rejoin within 30 s of the heal".to_string());
        }
        match self.fence_after_heal {
            Some((after, highest)) if after <= highest => {
                wrong.push(format!("after the heal a grant got fence {after}, not above the accepted {highest}"))
            }
            None => wrong.push("no grant after the heal".to_string()),
            Some(_) => {}
        }
        if wrong.is_empty() { Ok(()) } else { Err(wrong.join(" | ")) }
    }
}

/// **The leader cut off from the majority under contention.** `clients` (in the caller's
/// namespace, each knowing every member) contend for `settings.keys` keys and write their
/// fences through `store`, as in [`leader_killed_under_contention`]; the fault is the leader's
/// host cut off (from the other members and from every client) instead of a kill. Then the host
/// is healed: the old leader must rejoin, and a new grant's fence must be above every fence
/// the store accepted. `Err` only when the scenario could not run (no leader, no store answer).
pub async fn leader_cut_off_under_contention<S, M>(
    clients: Vec<Arc<S>>,
    store: Arc<DynFencedStore>,
    namespace: &str,
    settings: LeaderKillSettings,
    members: &M,
    hosts: &[Host],
) -> Result<LeaderCutReport, String>
where
    S: LockService<Fencing = Fenced> + ?Sized,
    M: Members + ?Sized,
{
    let first = clients.first().cloned().ok_or("no clients")?;
    let mut cut = None;
    let contention = leader_killed_under_contention(clients, Arc::clone(&store), namespace, settings, || {
        let cut = &mut cut;
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            let leader = loop {
                if let Some(i) = members.leader() {
                    break i;
                }
                if Instant::now() > deadline {
                    return Err("no leader for 10 s".to_string());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            hosts.get(leader).ok_or(format!("member {leader} has no host"))?.cut().map_err(|e| e.to_string())?;
            *cut = Some(leader);
            Ok(format!("member {leader} cut off"))
        }
    })
    .await?;
    let Some(old) = cut else { return Err("no member was cut".to_string()) };
    hosts[old].heal().map_err(|e| e.to_string())?;
    let healed = Instant::now();
    let mut rejoined_after = None;
    while healed.elapsed() < Duration::from_secs(30) {
        if members.serving(old) {
            rejoined_after = Some(healed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let key = ResourceKey::new(namespace, "k0").map_err(|e| e.to_string())?;
    let highest = store.watermark(&key).await.map_err(|e| e.to_string())?.unwrap_or(Fence::new(0));
    let fence_after_heal = match first.lock(&key, LockOptions::ttl(settings.ttl).wait(Duration::from_secs(20))).await {
        Ok(lease) => {
            let fence = lease.fence();
            let _ = lease.release().await;
            Some((fence, highest))
        }
        Err(_) => None,
    };
    Ok(LeaderCutReport { contention, rejoined_after, fence_after_heal })
}
