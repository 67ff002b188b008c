//! Scenarios over every coordination primitive at once (semaphore, read-write lock, election),
//! stamped by [`certify!`](macro@crate::certify) for every fenced lock service.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use palisade_core::{
    Election, Fenced, FencedStore, LockOptions, LockService, LockServiceExt, Progress, ResourceKey, RwLock, Semaphore,
};
use tokio::time::Instant;

use crate::harness::{Ctx, Outcome};
use crate::latency::SlowLockService;
use crate::lock::{client, key};
use crate::store::store_client;
use crate::{FencedStoreFactory, LockServiceFactory, Namespace, attempt};

/// Reader slots of the read-write lock and permits of the plain semaphore.
const SLOTS: u32 = 128;
/// Permits of the queued semaphore: enough that one round over them outlasts the TTL.
const QUEUED_SLOTS: u32 = 256;

/// **Primitives enter over a slow service** (`RwLock::write`/`read`, `Semaphore::acquire` plain
/// and queued, `Election::campaign`): a primitive that holds one lock while it does many
/// operations on others (a writer holds the gate while it drains the reader slots; a queued
/// semaphore's head holds the queue while it polls the permits) keeps that lock alive for as
/// long as it needs, however slow each operation is, so it enters within a bound set by the
/// operations it needs, not by the TTL.
///
/// Every primitive runs over a [`SlowLockService`] adding `latency` = TTL / 200 to each
/// operation (TTL = the factory's, at least 1 s: 5 ms at 1 s), with 128 reader slots and
/// permits and 256 queued permits, so that draining the slots (2 × 128 operations, 1.28 TTL)
/// or one round over the queued permits (256 operations, 1.28 TTL) outlasts the TTL.
///
/// **The bound.** `op`, the cost of one operation over the slow service, is measured first (8
/// operations on a scratch key: the latency plus the backend's own time). An entry that needs
/// `n` lock operations is allowed `2 × n × op + 1 s` (twice the work, for renewals on the way
/// and a loaded machine, plus a second of slack), and each primitive is asked to wait exactly
/// that long:
/// - `RwLock::write` on a free lock: the gate, 2 × 128 slot operations (take and release
///   each), the confirming extension, the gate's release on the way out: n = 2 × 128 + 3.
/// - `RwLock::read` on a free lock: gate, slot, confirmation, gate release: n = 4.
/// - `Semaphore::acquire` (plain) with 127 of its 128 permits held: at most one round over the
///   slots before it finds the free one: n = 128 + 1.
/// - `Semaphore::queued` with every permit held: waiter A takes the queue and waits for the
///   permits; for 2 TTLs its queue lock stays held (a probe never finds it free: a head that
///   lost it would let later waiters jump ahead); then one permit is freed, and A gets it
///   within the round in progress and one more: n = 2 × 256 + 2.
/// - `Election::campaign` on a free election: n = 1; the leader is still leading 2 TTLs later
///   (its renewals over the slow service kept it).
///
/// **Stalls.** The queue and the leader are renewed every third of the TTL, so a machine that
/// stops the test process or the server longer than that can cost a correct holder its lock.
/// Those two parts watch for stalls (how late a timer in the test fires; how long a probe's
/// round trip takes): a lapse after a stall of at least a quarter of the TTL is noted in the
/// report and the part runs once more on a fresh key; a lapse without one, or a second lapse,
/// fails.
///
/// A primitive that lets its lock expire meanwhile (extends it only between timed-out waits)
/// loses it and starts over, again and again: `Timeout` on a lock nobody else holds.
pub async fn primitives_enter_over_a_slow_service<L, S>(ctx: &Ctx, lf: &L, sf: &S) -> Outcome
where
    L: LockServiceFactory,
    L::Service: LockService<Fencing = Fenced>,
    S: FencedStoreFactory,
{
    let ns = Namespace::new();
    let ttl = lf.timing().ttl.max(Duration::from_secs(1));
    let latency = ttl / 200;
    let fast = client(ctx, lf).await?;
    let slow = Arc::new(SlowLockService::new(client(ctx, lf).await?, latency));
    let store: Arc<dyn FencedStore> = store_client(ctx, sf).await?;

    let probe = key(ctx, &ns, "probe")?;
    let measured = Instant::now();
    for _ in 0..4 {
        let lease = attempt!(ctx, slow.try_lock(&probe, ttl).await, "probe try_lock");
        let lease = lease.ok_or_else(|| ctx.fail("a fresh probe key was reported busy"))?;
        attempt!(ctx, lease.release().await, "probe release");
    }
    let op = measured.elapsed() / 8;
    let bound = |n: u32| op * n * 2 + Duration::from_secs(1);
    let within = |n: u32| LockOptions::ttl(ttl).wait(bound(n));
    let lat_ms = latency.as_secs_f64() * 1e3;
    ctx.note(format!("{lat_ms:.0} ms added per operation, {:.1} ms per operation measured", op.as_secs_f64() * 1e3));

    // The read-write lock's writer, then a reader.
    let rw_key = key(ctx, &ns, "rwlock")?;
    let rw = attempt!(ctx, RwLock::new(Arc::clone(&slow), Arc::clone(&store), rw_key, SLOTS), "rwlock");
    let n = 2 * SLOTS + 3;
    let started = Instant::now();
    let writer = rw.write(within(n)).await;
    let took = started.elapsed();
    let writer = match writer {
        Ok(writer) => writer,
        Err(e) => {
            return Err(ctx.fail(format!(
                "RwLock::write on a free lock of {SLOTS} reader slots, over a service adding {lat_ms:.0} ms per \
                 operation (TTL {ttl:?}), did not enter: {e} after {took:.2?}; it needs {n} operations, \
                 bound {:.2?}: the gate was lost while the reader slots were drained",
                bound(n)
            )));
        }
    };
    ctx.note(format!("RwLock::write entered in {took:.2?} (bound {:.2?})", bound(n)));
    attempt!(ctx, writer.release().await, "the writer's release");
    let started = Instant::now();
    let reader = attempt!(ctx, rw.read(within(4)).await, "RwLock::read on a free lock over the slow service");
    ctx.note(format!("RwLock::read entered in {:.2?} (bound {:.2?})", started.elapsed(), bound(4)));
    attempt!(ctx, reader.release().await, "the reader's release");

    // The plain semaphore, its last permit free.
    let sem_key = key(ctx, &ns, "semaphore")?;
    let holder = attempt!(ctx, Semaphore::new(Arc::clone(&fast), sem_key.clone(), SLOTS), "semaphore");
    let mut held = Vec::new();
    for _ in 1..SLOTS {
        let permit = attempt!(ctx, holder.try_acquire(ttl * 30).await, "a permit of a fresh semaphore");
        held.push(permit.ok_or_else(|| ctx.fail("a permit of a fresh semaphore was not free"))?);
    }
    let sem = attempt!(ctx, Semaphore::new(Arc::clone(&slow), sem_key, SLOTS), "semaphore");
    let started = Instant::now();
    let permit = sem.acquire(within(SLOTS + 1)).await;
    let took = started.elapsed();
    let permit = attempt!(
        ctx,
        permit.map_err(|e| format!("{e} after {took:.2?}")),
        "Semaphore::acquire of the last free permit"
    );
    ctx.note(format!("Semaphore::acquire entered in {took:.2?} (bound {:.2?})", bound(SLOTS + 1)));
    attempt!(ctx, permit.release().await, "the permit's release");
    release_all(held).await;

    queued_head_keeps_its_place(ctx, &ns, &fast, &slow, ttl, bound(2 * QUEUED_SLOTS + 2)).await?;

    // The election.
    once_more_after_a_stall(ctx, ttl, "the election", |round| {
        let key = key(ctx, &ns, &format!("election-{round}"));
        let slow = Arc::clone(&slow);
        async move { leader_keeps_its_lead(ctx, &key?, slow, ttl, bound(1)).await }
    })
    .await?;
    Ok(ctx.report())
}

/// The queued semaphore's part of [`primitives_enter_over_a_slow_service`]: with every
/// permit held, A (over the slow service) heads the queue and waits; for 2 TTLs a probe (over
/// the fast client) finds the queue's lock held every tenth of a TTL; then one permit is freed
/// and A gets it within `bound`.
async fn queued_head_keeps_its_place<S>(
    ctx: &Ctx,
    ns: &Namespace,
    fast: &Arc<S>,
    slow: &Arc<SlowLockService<S>>,
    ttl: Duration,
    bound: Duration,
) -> Result<(), crate::harness::Failure>
where
    S: LockService<Fencing = Fenced> + ?Sized,
{
    once_more_after_a_stall(ctx, ttl, "the queued semaphore's part", |round| {
        let key = key(ctx, ns, &format!("queued-{round}"));
        async move { queued_head_round(ctx, &key?, fast, slow, ttl, bound).await }
    })
    .await
}

/// A lock found lapsed although its holder renews it: what was seen, and the longest stall
/// of the machine seen until then.
struct Lapse {
    message: String,
    stall: Duration,
}

/// Runs `round` (given 0, then 1) until it ends without a [`Lapse`], at most twice.
///
/// A holder renews every third of its TTL, so a machine that stops the test process or the
/// server for longer than that (a loaded CI host starting a JVM) can cost a correct holder its
/// lock. A lapse after a stall of at least a quarter of the TTL is reported and the round runs
/// once more; a lapse with no such stall, or a second one, fails. An implementation that lets
/// its lock lapse while it works loses it again with no stall at all.
async fn once_more_after_a_stall<F, Fut>(
    ctx: &Ctx,
    ttl: Duration,
    what: &str,
    mut round: F,
) -> Result<(), crate::harness::Failure>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<Option<Lapse>, crate::harness::Failure>>,
{
    let Some(first) = round(0).await? else { return Ok(()) };
    if first.stall < ttl / 4 {
        return Err(ctx.fail(first.message));
    }
    ctx.note(format!(
        "{what} ran again after a stall of more than a quarter of the TTL {ttl:?} (the machine, not the holder, \
         missed a renewal): {}",
        first.message
    ));
    match round(1).await? {
        None => Ok(()),
        Some(again) => {
            Err(ctx.fail(format!("{} (and once before, after a stall of {:.2?})", again.message, first.stall)))
        }
    }
}

/// Measures the test process's stalls: how late a timer firing every `period` wakes up. Each
/// wake-up also ticks `progress`, when given (the holders that renew on progress keep working).
struct StallWatch {
    late_us: Arc<AtomicU64>,
    _task: AbortOnDrop,
}

impl StallWatch {
    fn start(period: Duration, progress: Option<Progress>) -> Self {
        let late_us = Arc::new(AtomicU64::new(0));
        let task = {
            let late_us = Arc::clone(&late_us);
            tokio::spawn(async move {
                loop {
                    if let Some(progress) = &progress {
                        progress.tick();
                    }
                    let slept = Instant::now();
                    tokio::time::sleep(period).await;
                    let late = slept.elapsed().saturating_sub(period);
                    late_us.fetch_max(u64::try_from(late.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
                }
            })
        };
        StallWatch { late_us, _task: AbortOnDrop(task) }
    }

    /// The longest stall so far.
    fn longest(&self) -> Duration {
        Duration::from_micros(self.late_us.load(Ordering::Relaxed))
    }
}

/// The election's part: a campaign on a free election enters within `bound`, and the leader
/// still leads 2 TTLs later.
async fn leader_keeps_its_lead<S>(
    ctx: &Ctx,
    key: &ResourceKey,
    slow: Arc<SlowLockService<S>>,
    ttl: Duration,
    bound: Duration,
) -> Result<Option<Lapse>, crate::harness::Failure>
where
    S: LockService<Fencing = Fenced> + ?Sized,
{
    let election = Election::new(slow, key.clone(), ttl);
    let started = Instant::now();
    let leader = attempt!(ctx, election.campaign(bound).await, "Election::campaign over the slow service");
    ctx.note(format!("Election::campaign entered in {:.2?} (bound {bound:.2?})", started.elapsed()));
    let watch = StallWatch::start(ttl / 10, None);
    tokio::time::sleep(ttl * 2).await;
    if leader.is_lost() {
        let _ = leader.resign().await;
        return Ok(Some(Lapse {
            message: format!(
                "the leader lost the lead within 2 TTLs (the longest stall seen meanwhile: {:.2?}, TTL {ttl:?}): its \
                 renewals over the slow service failed",
                watch.longest()
            ),
            stall: watch.longest(),
        }));
    }
    attempt!(ctx, leader.resign().await, "the leader's resignation");
    Ok(None)
}

/// One run of the queued part on `sem_key`: `Ok(None)` when A kept its place and got the freed
/// permit within `bound`, a [`Lapse`] when a probe found the queue free (the longest stall:
/// the test process's timer or a probe's round trip).
async fn queued_head_round<S>(
    ctx: &Ctx,
    sem_key: &ResourceKey,
    fast: &Arc<S>,
    slow: &Arc<SlowLockService<S>>,
    ttl: Duration,
    bound: Duration,
) -> Result<Option<Lapse>, crate::harness::Failure>
where
    S: LockService<Fencing = Fenced> + ?Sized,
{
    let holder = Semaphore::new(Arc::clone(fast), sem_key.clone(), QUEUED_SLOTS).and_then(Semaphore::queued);
    let holder = attempt!(ctx, holder, "semaphore");
    let queue = holder.queue().cloned().ok_or_else(|| ctx.fail("a queued semaphore has no queue"))?;
    let mut held = Vec::new();
    for _ in 0..QUEUED_SLOTS {
        let permit = attempt!(ctx, holder.try_acquire(ttl * 30).await, "a permit of a fresh semaphore");
        held.push(permit.ok_or_else(|| ctx.fail("a permit of a fresh semaphore was not free"))?);
    }
    // The held permits stay held: renewed, since a service whose locks live in a session
    // caps each grant at what the session has left, however long a TTL was asked for.
    let progress = Progress::new();
    let _renewals: Vec<_> = held.iter().map(|permit| permit.renew_on_progress(&progress)).collect();
    let watch = StallWatch::start(ttl / 10, Some(progress));
    let a = Semaphore::new(Arc::clone(slow), sem_key.clone(), QUEUED_SLOTS).and_then(Semaphore::queued);
    let a = attempt!(ctx, a, "semaphore");
    let a = tokio::spawn(async move { a.acquire(LockOptions::ttl(ttl).wait(ttl * 3 + bound * 2)).await });
    tokio::time::sleep(ttl / 4).await;
    let headed = Instant::now();
    let mut slowest_probe = Duration::ZERO;
    while headed.elapsed() < ttl * 2 {
        let sent = Instant::now();
        let probe = attempt!(ctx, fast.try_lock(&queue, ttl).await, "probing the queue's lock");
        slowest_probe = slowest_probe.max(sent.elapsed());
        if let Some(probe) = probe {
            let _ = probe.release().await;
            a.abort();
            release_all(held).await;
            let stall = watch.longest().max(slowest_probe);
            return Ok(Some(Lapse {
                message: format!(
                    "the queue's lock of a queued semaphore of {QUEUED_SLOTS} permits was free {:.2?} after its \
                     head, A, started polling the permits over the slow service (the longest stall seen meanwhile: \
                     {stall:.2?}, TTL {ttl:?}): the head lost the queue while it polled",
                    headed.elapsed() + ttl / 4
                ),
                stall,
            }));
        }
        tokio::time::sleep(ttl / 10).await;
    }
    let freed = Instant::now();
    if let Some(permit) = held.pop() {
        attempt!(ctx, permit.release().await, "freeing one permit");
    }
    let outcome = tokio::time::timeout(bound, a).await;
    release_all(held).await;
    match outcome {
        Ok(Ok(Ok(permit))) => {
            ctx.note(format!("the queued head got the freed permit in {:.2?} (bound {bound:.2?})", freed.elapsed()));
            let _ = permit.release().await;
            Ok(None)
        }
        Ok(Ok(Err(e))) => Err(ctx.fail(format!("the head of the queue, A, failed: {e}"))),
        Ok(Err(e)) => Err(ctx.fail(format!("A panicked: {e}"))),
        Err(_) => Err(ctx.fail(format!("A, the head of the queue, did not get the permit freed {bound:.2?} ago"))),
    }
}

/// Aborts a task when dropped (on every path out of the scenario).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn release_all<S: LockService + ?Sized>(held: Vec<palisade_core::Lease<S>>) {
    for permit in held {
        let _ = permit.release().await;
    }
}
