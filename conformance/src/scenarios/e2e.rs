//! End-to-end scenarios: a lock service and a fenced store together (11–13, and rule 3).

use palisade_core::LockOptions;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::sys::signal::Signal;
use palisade_core::{
    ErrorKind, Fence, FencedStore, FencedStoreExt, GrantFence, Lease, LockService, LockServiceExt, Progress, Record,
    Result, WriteBatch,
};
use tokio::time::Instant;

use crate::child::{self, HolderProcess};
use crate::harness::{Ctx, Failure, Outcome};
use crate::lock::{client, key, patience};
use crate::relay::{Relay, RelayLockService};
use crate::store::store_client;

// The liveness scenario with a store, in the end-to-end registry with the rest.
pub use crate::liveness::waits_are_bounded_while_a_fenced_transaction_is_open;
use crate::{FencedStoreFactory, LockServiceFactory, Namespace, ProcessAccess, attempt, ensure};

/// Writes under a lease: fenced if the service issues fences, the naive unfenced path if not
/// (an efficiency lock has nothing else).
pub(crate) async fn write<L: LockService + ?Sized, S: FencedStore + ?Sized>(
    store: &S,
    lease: &Lease<L>,
    batch: &WriteBatch,
) -> Result<()> {
    match lease.fence_if_any() {
        Some(fence) => store.write_fenced(lease.key(), GrantFence::new(fence, lease.grant().grant_id()), batch).await,
        None => store.apply_unfenced(batch).await,
    }
}

pub(crate) fn data_batch(ns: &Namespace, who: &str) -> WriteBatch {
    WriteBatch::new()
        .put(ns.record("data"), who.as_bytes().to_vec())
        .put(ns.record(&format!("audit/{who}")), who.as_bytes().to_vec())
}

async fn read_data<S: FencedStore + ?Sized>(
    ctx: &Ctx,
    store: &S,
    ns: &Namespace,
) -> std::result::Result<Option<Record>, Failure> {
    store.read(&ns.record("data")).await.map_err(|e| ctx.fail(format!("read: {e}")))
}

/// **11a. Paused holder past TTL, in process.** A acquires (fence fa) and its task stops
/// (no progress, so its progress-gated renewal stops too) for TTL + margin; B acquires with
/// fb > fa and writes; A resumes and writes with fa: `StaleFence { fa, fb }`, the data shows
/// only B's write, `palisade_lock_fence_rejected_total` went up by exactly one, and A's lost signal
/// had fired. For a service without fences the documented outcome is asserted instead: A's
/// stale write goes through.
pub async fn paused_holder_in_process<L: LockServiceFactory, S: FencedStoreFactory>(
    ctx: &Ctx,
    lf: &L,
    sf: &S,
) -> Outcome {
    let ns = Namespace::new();
    let key = key(ctx, &ns, "paused")?;
    let timing = lf.timing();
    let (a, b) = (client(ctx, lf).await?, client(ctx, lf).await?);
    let (store_a, store_b) = (store_client(ctx, sf).await?, store_client(ctx, sf).await?);
    let lease_a = attempt!(ctx, a.lock(&key, LockOptions::ttl(timing.ttl).wait(patience(timing.ttl))).await, "A lock");
    let progress = Progress::new();
    let renewal = lease_a.renew_on_progress(&progress);
    tokio::time::sleep(timing.expiry_bound()).await; // the pause: no progress, no writes
    let lease_b = attempt!(
        ctx,
        b.lock(&key, LockOptions::ttl(timing.ttl).wait(patience(timing.ttl))).await,
        "B lock after A's TTL"
    );
    attempt!(ctx, write(&*store_b, &lease_b, &data_batch(&ns, "B")).await, "B's write");
    let _ = ctx.take_counter(palisade_core::metrics::LOCK_FENCE_REJECTED_TOTAL);
    let result = write(&*store_a, &lease_a, &data_batch(&ns, "A")).await;
    let rejected = ctx.take_counter(palisade_core::metrics::LOCK_FENCE_REJECTED_TOTAL);
    drop(renewal);
    match (lease_a.fence_if_any(), lease_b.fence_if_any()) {
        (Some(fa), Some(fb)) => {
            ensure!(ctx, fb > fa, "B's fence {fb} is not above A's {fa}");
            let kind = result.err().map(|e| e.kind());
            let expected = ErrorKind::StaleFence { presented: fa, current: fb };
            ensure!(ctx, kind == Some(expected), "A's stale write gave {kind:?}, expected {expected:?}");
            let data = read_data(ctx, &*store_b, &ns).await?;
            ensure!(
                ctx,
                data.as_ref().map(|r| r.value.as_slice()) == Some(b"B"),
                "data after the stale write: {data:?}"
            );
            let audit_a = attempt!(ctx, store_b.read(&ns.record("audit/A")).await, "read");
            ensure!(ctx, audit_a.is_none(), "the stale holder's audit record landed");
            if let Some(rejected) = rejected {
                ensure!(ctx, rejected == 1, "palisade_lock_fence_rejected_total went up by {rejected}, expected 1");
            } else {
                ctx.note("palisade_lock_fence_rejected_total not checked: no recorder (run through the suite macro)");
            }
            ensure!(ctx, lease_a.is_lost(), "A's lost signal had not fired by the time it wrote");
        }
        _ => {
            ensure!(ctx, result.is_ok(), "an unfenced stale write failed: {:?}", result.err());
            let data = read_data(ctx, &*store_b, &ns).await?;
            ensure!(ctx, data.as_ref().map(|r| r.value.as_slice()) == Some(b"A"), "data: {data:?}");
            ctx.refusal_checked("no fence: the stale holder's write went through (documented: efficiency lock)");
        }
    }
    let _ = lease_b.release().await;
    Ok(ctx.report())
}

/// Starts the relay a child needs for an in-process service.
pub(crate) async fn relay_for<L: LockServiceFactory>(ctx: &Ctx, lf: &L) -> std::result::Result<Option<Relay>, Failure> {
    match lf.process_access() {
        ProcessAccess::Direct => Ok(None),
        ProcessAccess::Relay => {
            let svc = client(ctx, lf).await?;
            Ok(Some(attempt!(ctx, Relay::serve(svc).await, "starting the relay")))
        }
    }
}

/// The lock service as a scenario's holder child reaches it: over the parent's loopback relay
/// for an in-process service, else a client of its own from the factory.
pub(crate) async fn child_service<L: LockServiceFactory>(
    ctx: &Ctx,
    lf: &L,
    role: &child::ChildRole,
) -> std::result::Result<Arc<dyn LockService<Fencing = crate::FencingOf<L>>>, Failure> {
    Ok(match role.relay {
        Some(addr) => Arc::new(attempt!(
            ctx,
            RelayLockService::<crate::FencingOf<L>>::connect(addr, Default::default()).await,
            "connecting to the relay"
        )),
        None => client(ctx, lf).await?,
    })
}

/// The child role: connect like any client would, then hold and write.
async fn play_holder<L: LockServiceFactory, S: FencedStoreFactory>(
    ctx: &Ctx,
    lf: &L,
    sf: &S,
    role: child::ChildRole,
) -> Outcome {
    ensure!(
        ctx,
        role.scenario == ctx.scenario(),
        "child started for `{}` but running `{}`",
        role.scenario,
        ctx.scenario()
    );
    let store = store_client(ctx, sf).await?;
    let svc = child_service(ctx, lf, &role).await?;
    child::hold_and_write(ctx, svc, store, &role.namespace, lf.timing()).await;
    Ok(ctx.report())
}

/// What both process-level scenarios start with: a namespace, the relay if the service needs
/// one, the second client B with its store, and the holder process.
struct ProcessSetup<L: LockServiceFactory, S: FencedStoreFactory> {
    ns: Namespace,
    key: palisade_core::ResourceKey,
    timing: crate::Timing,
    _relay: Option<Relay>,
    b: Arc<L::Service>,
    store_b: Arc<S::Store>,
    holder: HolderProcess,
}

impl<L: LockServiceFactory, S: FencedStoreFactory> ProcessSetup<L, S> {
    async fn start(ctx: &Ctx, lf: &L, sf: &S) -> std::result::Result<Self, Failure> {
        let ns = Namespace::new();
        let key = key(ctx, &ns, "paused")?;
        let relay = relay_for(ctx, lf).await?;
        let b = client(ctx, lf).await?;
        let store_b = store_client(ctx, sf).await?;
        let holder = HolderProcess::spawn(ctx, &ns, relay.as_ref().map(Relay::addr)).await?;
        Ok(ProcessSetup { ns, key, timing: lf.timing(), _relay: relay, b, store_b, holder })
    }
}

fn parse_fence(s: &str) -> Option<Fence> {
    s.parse().ok().map(Fence::new)
}

/// **11b. Paused holder past TTL, a real process frozen with SIGSTOP** (the incident's chaos
/// test). The holder runs in a child process (this test binary re-executed in the holder
/// role), acquires (fa), and is frozen with `SIGSTOP` for TTL + margin: its timers and
/// renewals freeze with it. B acquires (fb > fa) and writes; the holder is thawed with
/// `SIGCONT` and writes with fa: `StaleFence { fa, fb }`, its lost signal had fired, its
/// `palisade_lock_fence_rejected_total` went up by one, and the data shows only B's write. Without
/// fences the documented outcome is asserted: the stale write goes through.
pub async fn paused_holder_process<L: LockServiceFactory, S: FencedStoreFactory>(ctx: &Ctx, lf: &L, sf: &S) -> Outcome {
    if let Some(role) = child::role() {
        return play_holder(ctx, lf, sf, role).await;
    }
    let ProcessSetup { ns, key, timing, _relay, b, store_b, mut holder } = ProcessSetup::start(ctx, lf, sf).await?;
    let fa = holder.expect(ctx, "acquired", Duration::from_secs(120)).await?;
    holder.signal(ctx, Signal::SIGSTOP)?;
    let frozen = Instant::now();
    tokio::time::sleep(timing.expiry_bound()).await;
    let lease_b = attempt!(
        ctx,
        b.lock(&key, LockOptions::ttl(timing.ttl).wait(patience(timing.ttl))).await,
        "B lock while the holder is frozen"
    );
    attempt!(ctx, write(&*store_b, &lease_b, &data_batch(&ns, "B")).await, "B's write");
    holder.signal(ctx, Signal::SIGCONT)?;
    ctx.note(format!("holder frozen {:.0} ms", frozen.elapsed().as_secs_f64() * 1e3));
    holder.tell(ctx, "write").await?;
    let wrote = holder.expect(ctx, "wrote", Duration::from_secs(30)).await?;
    let status = holder.wait(ctx).await?;
    ensure!(ctx, status.success(), "the holder process failed: {status}");
    let data = read_data(ctx, &*store_b, &ns).await?;
    match (parse_fence(&fa), lease_b.fence_if_any()) {
        (Some(fa), Some(fb)) => {
            ensure!(ctx, fb > fa, "B's fence {fb} is not above the frozen holder's {fa}");
            let expected = format!("stale {fa} {fb} lost=true rejected=1");
            ensure!(ctx, wrote == expected, "the thawed holder reported `{wrote}`, expected `{expected}`");
            ensure!(
                ctx,
                data.as_ref().map(|r| r.value.as_slice()) == Some(b"B"),
                "data after the stale write: {data:?}"
            );
            let audit_a = attempt!(ctx, store_b.read(&ns.record("audit/A")).await, "read");
            ensure!(ctx, audit_a.is_none(), "the stale holder's audit record landed");
        }
        _ => {
            ensure!(ctx, wrote.starts_with("ok"), "an unfenced stale write reported `{wrote}`");
            ensure!(ctx, data.as_ref().map(|r| r.value.as_slice()) == Some(b"A"), "data: {data:?}");
            ctx.refusal_checked("no fence: the frozen holder's write went through (documented: efficiency lock)");
        }
    }
    let _ = lease_b.release().await;
    Ok(ctx.report())
}

/// **12. Holder killed mid-critical-section.** A holder process acquires and is killed with
/// `SIGKILL` before writing; B gets the lock within TTL + margin of the holder's grant (one
/// waiting acquisition) and writes; nothing of the killed holder's is in the store.
pub async fn killed_holder<L: LockServiceFactory, S: FencedStoreFactory>(ctx: &Ctx, lf: &L, sf: &S) -> Outcome {
    if let Some(role) = child::role() {
        return play_holder(ctx, lf, sf, role).await;
    }
    let ProcessSetup { key, timing, _relay, b, store_b, mut holder, ns } = ProcessSetup::start(ctx, lf, sf).await?;
    let _ = holder.expect(ctx, "acquired", Duration::from_secs(120)).await?;
    let granted = Instant::now();
    holder.signal(ctx, Signal::SIGKILL)?;
    let status = holder.wait(ctx).await?;
    ensure!(ctx, !status.success(), "the killed holder exited successfully");
    let bound = timing.expiry_bound() + Duration::from_millis(300);
    let lease_b =
        attempt!(ctx, b.lock(&key, LockOptions::ttl(timing.ttl).wait(bound)).await, "B's single waiting acquisition");
    let took = granted.elapsed();
    attempt!(ctx, write(&*store_b, &lease_b, &data_batch(&ns, "B")).await, "B's write");
    ensure!(ctx, took <= bound, "B waited {took:?}, more than TTL + margin ({bound:?})");
    let audit_a = attempt!(ctx, store_b.read(&ns.record("audit/A")).await, "read");
    ensure!(ctx, audit_a.is_none(), "the killed holder's record exists");
    ctx.note(format!(
        "next holder in {:.0} ms after the kill (TTL {} ms)",
        took.as_secs_f64() * 1e3,
        timing.ttl.as_millis()
    ));
    let _ = lease_b.release().await;
    Ok(ctx.report())
}

/// **Rule 3. A fence orders writes; it does not make a job run once.** A is paused past its
/// TTL and B acquires, but A wakes *before* B's first write: A's write is accepted (its fence
/// is still ≥ the watermark). B's fenced write that creates the job's "done" record fails with
/// `Conflict`, so B sees A's work instead of doing the job twice; B's later writes are
/// accepted and A's next write is refused with `StaleFence`.
///
/// A store that [requires a live lock](palisade_core::FencedStore::requires_live_lock) refuses
/// A's first write already (`StaleFence`: B holds the lock), and B does the job.
pub async fn stale_write_before_new_holder_writes<L: LockServiceFactory, S: FencedStoreFactory>(
    ctx: &Ctx,
    lf: &L,
    sf: &S,
) -> Outcome {
    let ns = Namespace::new();
    let key = key(ctx, &ns, "rule3")?;
    let timing = lf.timing();
    let (a, b) = (client(ctx, lf).await?, client(ctx, lf).await?);
    let store = store_client(ctx, sf).await?;
    let lease_a = attempt!(ctx, a.lock(&key, LockOptions::ttl(timing.ttl).wait(patience(timing.ttl))).await, "A lock");
    tokio::time::sleep(timing.expiry_bound()).await;
    let lease_b = attempt!(ctx, b.lock(&key, LockOptions::ttl(timing.ttl).wait(patience(timing.ttl))).await, "B lock");
    let job = |who: &str| {
        WriteBatch::new()
            .create(ns.record("done/J"), who.as_bytes().to_vec())
            .put(ns.record("data"), who.as_bytes().to_vec())
    };
    let doer = if store.requires_live_lock() && lease_a.fence_if_any().is_some() {
        let first = write(&*store, &lease_a, &job("A")).await;
        ensure!(
            ctx,
            first.as_ref().err().and_then(|e| e.stale_fence_details()).is_some(),
            "A's write while B holds the lock gave {first:?}, expected StaleFence (the store requires a live lock)"
        );
        attempt!(ctx, write(&*store, &lease_b, &job("B")).await, "B's job write");
        b"B"
    } else {
        attempt!(
            ctx,
            write(&*store, &lease_a, &job("A")).await,
            "A's write before B's first write (its fence still passes)"
        );
        let kind = write(&*store, &lease_b, &job("B")).await.err().map(|e| e.kind());
        ensure!(
            ctx,
            kind == Some(ErrorKind::Conflict),
            "B's job write after A's gave {kind:?}, expected Conflict (job already done)"
        );
        b"A"
    };
    let done = attempt!(ctx, store.read(&ns.record("done/J")).await, "read");
    ensure!(ctx, done.as_ref().map(|r| r.value.as_slice()) == Some(doer), "the job record is {done:?}");
    attempt!(
        ctx,
        write(&*store, &lease_b, &WriteBatch::new().put(ns.record("data"), b"B".to_vec())).await,
        "B's next write"
    );
    let again = write(&*store, &lease_a, &WriteBatch::new().put(ns.record("data"), b"A2".to_vec())).await;
    if lease_a.fence_if_any().is_some() {
        ensure!(
            ctx,
            again.as_ref().err().and_then(|e| e.stale_fence_details()).is_some(),
            "A's write after B's gave {again:?}, expected StaleFence"
        );
        let data = read_data(ctx, &*store, &ns).await?;
        ensure!(ctx, data.as_ref().map(|r| r.value.as_slice()) == Some(b"B"), "data: {data:?}");
    } else {
        ensure!(ctx, again.is_ok(), "an unfenced write failed: {again:?}");
        ctx.refusal_checked("no fence: A's later write went through too (documented: efficiency lock)");
    }
    let _ = lease_b.release().await;
    Ok(ctx.report())
}

/// **A live lock, when the store declares it** ([`requires_live_lock`]). A takes the lock and
/// outlives its TTL with nobody taking the lock after it, then writes. A store that declares it
/// must refuse the write (`NotHolder` or `StaleFence`) with nothing written, and accept the
/// next holder's; one that does not must accept it (fencing orders writes, it does not judge
/// liveness: refusing here would be a store inventing a newer fence).
///
/// [`requires_live_lock`]: palisade_core::FencedStore::requires_live_lock
pub async fn live_lock_when_declared<L: LockServiceFactory, S: FencedStoreFactory>(
    ctx: &Ctx,
    lf: &L,
    sf: &S,
) -> Outcome {
    let ns = Namespace::new();
    let key = key(ctx, &ns, "live")?;
    let timing = lf.timing();
    let (a, b) = (client(ctx, lf).await?, client(ctx, lf).await?);
    let store = store_client(ctx, sf).await?;
    let lease_a = attempt!(ctx, a.lock(&key, LockOptions::ttl(timing.ttl).wait(patience(timing.ttl))).await, "A lock");
    if lease_a.fence_if_any().is_none() {
        ctx.refusal_checked("no fence: nothing for a store to judge (efficiency lock)");
        return Ok(ctx.report());
    }
    attempt!(
        ctx,
        write(&*store, &lease_a, &WriteBatch::new().put(ns.record("data"), b"A1".to_vec())).await,
        "A's write while live"
    );
    tokio::time::sleep(timing.expiry_bound()).await;
    let late = write(&*store, &lease_a, &WriteBatch::new().put(ns.record("data"), b"A2".to_vec())).await;
    let data = read_data(ctx, &*store, &ns).await?;
    if store.requires_live_lock() {
        let kind = late.as_ref().err().map(palisade_core::Error::kind);
        ensure!(
            ctx,
            matches!(kind, Some(ErrorKind::NotHolder | ErrorKind::StaleFence { .. })),
            "the expired holder's write gave {late:?}, expected NotHolder (the store declares it requires a live lock)"
        );
        ensure!(ctx, data.as_ref().map(|r| r.value.as_slice()) == Some(b"A1"), "data after the refusal: {data:?}");
    } else {
        ensure!(ctx, late.is_ok(), "the expired holder's write, with no newer fence anywhere, gave {late:?}");
        ctx.note("the store does not require a live lock: the expired holder's write was accepted (no newer fence)");
    }
    let lease_b = attempt!(ctx, b.lock(&key, LockOptions::ttl(timing.ttl).wait(patience(timing.ttl))).await, "B lock");
    attempt!(
        ctx,
        write(&*store, &lease_b, &WriteBatch::new().put(ns.record("data"), b"B".to_vec())).await,
        "B's write"
    );
    let _ = lease_b.release().await;
    Ok(ctx.report())
}

/// Load parameters, from the environment: `PALISADE_CONFORMANCE_LOAD_RATE` (acquisitions per
/// second, default 500), `PALISADE_CONFORMANCE_LOAD_SECS` (default 3), `PALISADE_CONFORMANCE_LOAD_KEYS`
/// (default 50). Handlers take 5–20 ms.
#[derive(Debug, Clone, Copy)]
pub struct LoadSettings {
    /// Target acquisitions per second.
    pub rate: u64,
    /// How long to sustain it.
    pub secs: u64,
    /// Keys to spread the load over.
    pub keys: u64,
}

impl LoadSettings {
    /// Reads the environment, with the defaults above.
    pub fn from_env() -> Self {
        let get = |name: &str, default: u64| {
            std::env::var(name).ok().and_then(|v| v.parse().ok()).filter(|&v| v > 0).unwrap_or(default)
        };
        LoadSettings {
            rate: get("PALISADE_CONFORMANCE_LOAD_RATE", 500),
            secs: get("PALISADE_CONFORMANCE_LOAD_SECS", 3),
            keys: get("PALISADE_CONFORMANCE_LOAD_KEYS", 50),
        }
    }
}

/// One hold of the load scenario whose write was accepted: granted at, the last moment its
/// holder could act, its fence.
type Hold = (Instant, Instant, u64);

/// **13. Load.** Acquisitions at a target rate across a set of keys with 5–20 ms handlers
/// (see [`LoadSettings`]; the store factory's [`load`](crate::FencedStoreFactory::load));
/// every job writes its audit record with its fence (a `Create`, so a job applied twice is a
/// loud `Conflict`, never a silent duplicate), and a job whose write is refused for a stale
/// fence is redone under a new grant. Every job's record exists exactly once, no two holds of a key whose writes were accepted overlap (each hold
/// runs from its grant to the last moment its holder could act: the write, or its
/// `safe_until` if earlier), no fence is issued twice for a key, and fences are gap-free where
/// declared. The achieved rate, acquisition latency and redone jobs are
/// reported.
pub async fn load<L: LockServiceFactory, S: FencedStoreFactory>(ctx: &Ctx, lf: &L, sf: &S) -> Outcome {
    load_with(ctx, lf, sf, sf.load()).await
}

/// [`load`] with explicit settings (a long soak in one test, without touching the others).
pub async fn load_with<L: LockServiceFactory, S: FencedStoreFactory>(
    ctx: &Ctx,
    lf: &L,
    sf: &S,
    settings: LoadSettings,
) -> Outcome {
    let ns = Namespace::new();
    let timing = lf.timing();
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push((client(ctx, lf).await?, store_client(ctx, sf).await?));
    }
    let gap_free = clients[0].0.capabilities().gap_free;
    let jobs = settings.rate * settings.secs;
    let fences: Arc<Mutex<BTreeMap<u64, Vec<u64>>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let rejected = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let expired = Arc::new(std::sync::atomic::AtomicU64::new(0));
    // Per key: (granted, last moment the holder could act, fence) of every hold whose write
    // was accepted; two that overlap mean two holders at once.
    let holds: Arc<Mutex<BTreeMap<u64, Vec<Hold>>>> = Arc::default();
    // Far above handler + write time, so refusals stay rare; they are retried when they happen.
    let lease_ttl = (timing.ttl * 10).max(Duration::from_secs(2));
    let mut interval = tokio::time::interval(Duration::from_secs_f64(1.0 / settings.rate as f64));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(usize::try_from(jobs).unwrap_or(0));
    let mut rng = u64::from(started.elapsed().subsec_nanos()) | 1;
    for job in 0..jobs {
        interval.tick().await;
        let (svc, store) = clients[usize::try_from(job % 8).unwrap_or(0)].clone();
        let k = job % settings.keys;
        let key = key(ctx, &ns, &format!("load-{k}"))?;
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let handler = Duration::from_millis(5 + rng % 16);
        let (ns, fences, latencies) = (ns.clone(), Arc::clone(&fences), Arc::clone(&latencies));
        let (rejected, expired, holds) = (Arc::clone(&rejected), Arc::clone(&expired), Arc::clone(&holds));
        tasks.push(tokio::spawn(async move {
            // A job whose holder outlived its lease (a slow store under load) is refused by the
            // fence and redone under a new grant, as a queue would redeliver it.
            for _ in 0..5 {
                let asked = Instant::now();
                let lease = svc.lock(&key, LockOptions::ttl(lease_ttl).wait(patience(timing.ttl))).await?;
                let granted = Instant::now();
                latencies.lock().unwrap_or_else(PoisonError::into_inner).push(asked.elapsed());
                if let Some(f) = lease.fence_if_any() {
                    fences.lock().unwrap_or_else(PoisonError::into_inner).entry(k).or_default().push(f.get());
                }
                tokio::time::sleep(handler).await;
                let batch =
                    WriteBatch::new().create(ns.record(&format!("audit/{job:08}")), format!("{k}").into_bytes());
                match write(&*store, &lease, &batch).await {
                    // The fence made the write safe even if the lease ran out during it (a
                    // store stalled by the disk); then the release finds the lock gone, which
                    // is harmless and counted, not a failure.
                    Ok(()) => {
                        let acted_until = Instant::now().min(lease.safe_until());
                        let fence = lease.fence_if_any().map_or(0, |f| f.get());
                        holds.lock().unwrap_or_else(PoisonError::into_inner).entry(k).or_default().push((
                            granted,
                            acted_until,
                            fence,
                        ));
                        return match lease.release().await {
                            Err(e) if matches!(e.kind(), ErrorKind::NotHolder | ErrorKind::LeaseLost) => {
                                expired.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                Ok(())
                            }
                            other => other,
                        };
                    }
                    Err(e) if e.stale_fence_details().is_some() => {
                        rejected.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(palisade_core::Error::new(ErrorKind::Timeout, "conformance", format!("job {job}: refused five times")))
        }));
    }
    let mut failures = 0;
    let mut first_error = None;
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                failures += 1;
                first_error.get_or_insert_with(|| e.to_string());
            }
            Err(e) => return Err(ctx.fail(format!("a load task panicked: {e}"))),
        }
    }
    let elapsed = started.elapsed();
    ensure!(ctx, failures == 0, "{failures} of {jobs} jobs failed; first: {}", first_error.unwrap_or_default());
    let audit = attempt!(ctx, clients[0].1.list(&ns.record("audit/")).await, "list");
    ensure!(ctx, audit.len() as u64 == jobs, "{} audit records for {jobs} jobs", audit.len());
    let holds = holds.lock().unwrap_or_else(PoisonError::into_inner).clone();
    for (k, mut hs) in holds {
        hs.sort_by_key(|h| h.0);
        for pair in hs.windows(2) {
            let ((_, a_until, a_fence), (b_granted, _, b_fence)) = (pair[0], pair[1]);
            ensure!(
                ctx,
                b_granted >= a_until,
                "key load-{k}: two holders at once, both writes accepted: fence {b_fence} was granted {:?} before the holder of fence {a_fence} stopped acting",
                a_until.saturating_duration_since(b_granted)
            );
        }
    }
    let fences = fences.lock().unwrap_or_else(PoisonError::into_inner).clone();
    for (k, mut fs) in fences {
        let issued = fs.len();
        fs.sort_unstable();
        fs.dedup();
        ensure!(ctx, fs.len() == issued, "key load-{k}: a fence was issued twice");
        if gap_free {
            ensure!(
                ctx,
                fs.windows(2).all(|w| w[1] == w[0] + 1),
                "key load-{k}: declared gap-free but fences have gaps: {fs:?}"
            );
        }
    }
    let mut lat = latencies.lock().unwrap_or_else(PoisonError::into_inner).clone();
    lat.sort();
    let pct = |p: usize| lat.get((lat.len().saturating_sub(1)) * p / 100).map_or(0.0, |d| d.as_secs_f64() * 1e3);
    ctx.note(format!(
        "{jobs} jobs over {} keys at {:.0}/s (target {}/s), acquire p50 {:.2} ms p99 {:.2} ms, {} stale writes redone, \
         {} leases ran out before release",
        settings.keys,
        jobs as f64 / elapsed.as_secs_f64(),
        settings.rate,
        pct(50),
        pct(99),
        rejected.load(std::sync::atomic::Ordering::SeqCst),
        expired.load(std::sync::atomic::Ordering::SeqCst)
    ));
    Ok(ctx.report())
}

/// **A holder frozen inside its open fenced transaction blocks nobody's wait** (a real process,
/// [`FencedStoreFactory::hold_transaction`]). The holder, a child process, takes the lock (TTL
/// 4 × the factory's, at least 3 s), opens a fenced transaction of the store under its fence,
/// and is frozen with `SIGSTOP` there: its transaction stays open, its connections stay up,
/// nothing it holds is let go. Meanwhile another client's
/// - `try_acquire` answers within the allowance (ten uncontended round trips, at least 1 s):
///   "held" or a retryable error, never a grant;
/// - `acquire` with a 300 ms wait answers within 300 ms plus the allowance: `Timeout`, or the
///   retryable refusal of its last attempt.
///
/// The holder is then thawed, ends its transaction and releases, and the other client gets the
/// lock within the expiry bound. A store without transactions of its own is not applicable.
pub async fn frozen_holder_inside_a_fenced_transaction<L: LockServiceFactory, S: FencedStoreFactory>(
    ctx: &Ctx,
    lf: &L,
    sf: &S,
) -> Outcome {
    let timing = lf.timing();
    let ttl = attempt!(ctx, palisade_core::Ttl::new((timing.ttl * 4).max(Duration::from_secs(3))), "ttl");
    if let Some(role) = child::role() {
        return hold_in_transaction(ctx, lf, sf, role, ttl).await;
    }
    let ns = Namespace::new();
    let k = key(ctx, &ns, "paused")?;
    let relay = relay_for(ctx, lf).await?;
    let other = client(ctx, lf).await?;
    let (_, allowed) = crate::liveness::measured_allowance(ctx, &*other, &key(ctx, &ns, "round-trip")?, ttl).await?;
    let mut holder = HolderProcess::spawn(ctx, &ns, relay.as_ref().map(Relay::addr)).await?;
    let said = holder.expect(ctx, "acquired", Duration::from_secs(120)).await?;
    match said.split_once(' ') {
        Some((_, "in-transaction")) => {}
        Some((_, why)) if why.starts_with("unfenced") => {
            holder.tell(ctx, "release").await?;
            ctx.refusal_checked("unfenced service: no fenced transaction to open");
            return Ok(ctx.report());
        }
        Some((_, why)) if why.starts_with("unsupported") => {
            holder.tell(ctx, "release").await?;
            ctx.not_applicable(format!("the store holds no transaction of its own: {why}"));
            return Ok(ctx.report());
        }
        _ => return Err(ctx.fail(format!("the holder could not open its fenced transaction: {said}"))),
    }
    holder.signal(ctx, Signal::SIGSTOP)?;
    let frozen = Instant::now();

    let meanwhile = "a frozen holder's fenced transaction was open";
    crate::liveness::contenders_keep_their_bounds(ctx, &*other, &k, ttl, allowed, meanwhile).await?;
    let frozen_for = frozen.elapsed();

    holder.signal(ctx, Signal::SIGCONT)?;
    holder.tell(ctx, "release").await?;
    let released = holder.expect(ctx, "released", Duration::from_secs(30)).await?;
    ctx.note(format!("the thawed holder's release: {released}"));
    let next = attempt!(ctx, other.acquire(&k, ttl, timing.expiry_bound()).await, "the lock after the holder let go");
    attempt!(ctx, other.release(&next).await, "release");
    let status = holder.wait(ctx).await?;
    ensure!(ctx, status.success(), "the holder process failed: {status}");
    ctx.note(format!(
        "frozen {:.0} ms with its transaction open; allowance {:.0} ms",
        frozen_for.as_secs_f64() * 1e3,
        allowed.as_secs_f64() * 1e3
    ));
    Ok(ctx.report())
}

/// The child role of [`frozen_holder_inside_a_fenced_transaction`]: take the lock, open the
/// fenced transaction, say `acquired FENCE in-transaction` (or why not), wait for `release`
/// (frozen meanwhile), then end the transaction, release, and say `released ok|ERROR`.
async fn hold_in_transaction<L: LockServiceFactory, S: FencedStoreFactory>(
    ctx: &Ctx,
    lf: &L,
    sf: &S,
    role: child::ChildRole,
    ttl: palisade_core::Ttl,
) -> Outcome {
    use tokio::io::AsyncBufReadExt;
    let svc = child_service(ctx, lf, &role).await?;
    let Ok(key) = role.namespace.key("paused") else {
        child::say("error key");
        return Ok(ctx.report());
    };
    let grant = match svc.acquire(&key, ttl, Duration::from_secs(30)).await {
        Ok(grant) => grant,
        Err(e) => {
            child::say(&format!("error acquire {e}"));
            return Ok(ctx.report());
        }
    };
    let held = match grant.fence_if_any() {
        None => {
            child::say("acquired - unfenced");
            None
        }
        Some(fence) => match sf.hold_transaction(&key, GrantFence::new(fence, grant.grant_id())).await {
            Ok(held) => {
                child::say(&format!("acquired {fence} in-transaction"));
                Some(held)
            }
            Err(e) if e.kind() == ErrorKind::Unsupported => {
                child::say(&format!("acquired {fence} unsupported: {e}"));
                None
            }
            Err(e) => {
                child::say(&format!("acquired {fence} error: {e}"));
                None
            }
        },
    };
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let _ = stdin.next_line().await;
    drop(held);
    match svc.release(&grant).await {
        Ok(()) => child::say("released ok"),
        Err(e) => child::say(&format!("released {}", e.kind().as_str())),
    }
    Ok(ctx.report())
}
