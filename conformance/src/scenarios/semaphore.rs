//! Semaphore scenarios: [`palisade_core::Semaphore`] on a fenced lock service and a store,
//! stamped by [`certify!`](macro@crate::certify) for every fenced lock service.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use palisade_core::{
    ErrorKind, Fenced, FencedStore, FencedStoreExt, LockOptions, LockService, LockServiceExt, ResourceKey, RwLock,
    Semaphore, WriteBatch,
};
use tokio::time::Instant;

use crate::harness::{Ctx, Outcome};
use crate::lock::{KeptAlive, client, key, patience};
use crate::store::store_client;
use crate::{FencedStoreFactory, LockServiceFactory, Namespace, attempt, ensure};

const PERMITS: u32 = 3;

/// **Semaphore count limit under contention.** Six clients share a semaphore of 3 permits and
/// take, hold (5–15 ms) and release permits for about a second, each over its own client. An
/// overlap detector over the holds (from the grant to the release, cut at the lease's
/// `safe_until`) finds at most 3 holders at any moment, and at some moment more than one (the
/// permits are used side by side: a semaphore that serialises everyone is a mutex); every
/// acquisition completes.
pub async fn semaphore_count_limit<F>(ctx: &Ctx, lf: &F) -> Outcome
where
    F: LockServiceFactory,
    F::Service: LockService<Fencing = Fenced>,
{
    const CLIENTS: usize = 6;
    let ns = Namespace::new();
    let sem_key = key(ctx, &ns, "semaphore")?;
    let timing = lf.timing();
    let ttl = (timing.ttl * 10).max(Duration::from_secs(2));
    let holds: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let svc = client(ctx, lf).await?;
        let sem = attempt!(ctx, Semaphore::new(svc, sem_key.clone(), PERMITS), "semaphore");
        let holds = Arc::clone(&holds);
        tasks.push(tokio::spawn(async move {
            let until = Instant::now() + Duration::from_millis(1000);
            let (mut n, mut lost) = (0u64, Vec::new());
            while Instant::now() < until {
                let permit = sem.acquire(LockOptions::ttl(ttl).wait(patience(ttl))).await?;
                let granted = Instant::now();
                tokio::time::sleep(Duration::from_millis(5 + (n * 7 + c as u64 * 3) % 11)).await;
                let ended = Instant::now().min(permit.safe_until());
                holds.lock().unwrap_or_else(PoisonError::into_inner).push((granted, ended));
                // Judged after the overlap check: a permit taken from under its holder shows
                // as an overlap first.
                if let Err(e) = permit.release().await {
                    lost.push(e.to_string());
                }
                n += 1;
            }
            Ok::<(u64, Vec<String>), palisade_core::Error>((n, lost))
        }));
    }
    let (mut total, mut lost) = (0, Vec::new());
    for t in tasks {
        match t.await {
            Ok(Ok((n, l))) => {
                total += n;
                lost.extend(l);
            }
            Ok(Err(e)) => return Err(ctx.fail(format!("a permit holder failed: {e}"))),
            Err(e) => return Err(ctx.fail(format!("a permit holder panicked: {e}"))),
        }
    }
    let holds = holds.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let mut events: Vec<(Instant, i32)> = holds.iter().flat_map(|&(a, b)| [(a, 1), (b, -1)]).collect();
    // An end and a start at the same instant do not overlap.
    events.sort_by_key(|&(t, d)| (t, d));
    let (mut now, mut most) = (0, 0);
    for (_, d) in events {
        now += d;
        most = most.max(now);
    }
    ensure!(
        ctx,
        most <= i32::try_from(PERMITS).unwrap_or(i32::MAX),
        "{most} permit holders at once on a semaphore of {PERMITS} (count limit broken)"
    );
    ensure!(
        ctx,
        most > 1,
        "never more than one holder at once in {total} holds: the permits were not used side by side"
    );
    ctx.note(format!("{total} holds by {CLIENTS} clients, at most {most} at once (limit {PERMITS})"));
    Ok(ctx.report())
}

/// **A stale permit holder is refused.** A semaphore of 2 permits: X holds one permit for the
/// whole scenario (renewing it while it makes progress), A the other with a short TTL and writes under it. A pauses past its TTL; B
/// takes a permit, necessarily A's slot, with a higher fence than A's, and writes; A wakes and
/// writes under its permit: `StaleFence`, the data shows B's write, and A's lost signal fired.
pub async fn semaphore_stale_permit_refused<L, S>(ctx: &Ctx, lf: &L, sf: &S) -> Outcome
where
    L: LockServiceFactory,
    L::Service: LockService<Fencing = Fenced>,
    S: FencedStoreFactory,
{
    let ns = Namespace::new();
    let sem_key = key(ctx, &ns, "semaphore")?;
    let timing = lf.timing();
    let store = store_client(ctx, sf).await?;
    let sem = |svc| Semaphore::new(svc, sem_key.clone(), 2);
    let (x, a, b) = (
        attempt!(ctx, sem(client(ctx, lf).await?), "semaphore"),
        attempt!(ctx, sem(client(ctx, lf).await?), "semaphore"),
        attempt!(ctx, sem(client(ctx, lf).await?), "semaphore"),
    );
    let long = LockOptions::ttl(patience(timing.ttl) * 2).wait(patience(timing.ttl));
    // X stays alive throughout: it renews (a service may cap a grant at its session's TTL).
    let x = KeptAlive::new(attempt!(ctx, x.acquire(long).await, "X's permit"), timing.ttl / 4);
    let permit_x = x.lease();
    let permit_a =
        attempt!(ctx, a.acquire(LockOptions::ttl(timing.ttl).wait(patience(timing.ttl))).await, "A's permit");
    ensure!(ctx, permit_a.key() != permit_x.key(), "two permits on one slot: {}", permit_a.key());
    let record = ns.record("slot-data");
    attempt!(ctx, store.write(&permit_a, &WriteBatch::new().put(record.clone(), b"A1".to_vec())).await, "A's write");
    tokio::time::sleep(timing.expiry_bound()).await;
    let started = Instant::now();
    let permit_b =
        attempt!(ctx, b.acquire(LockOptions::ttl(timing.ttl * 4).wait(patience(timing.ttl))).await, "B's permit");
    ensure!(ctx, permit_b.key() == permit_a.key(), "B took {} while X holds {}", permit_b.key(), permit_x.key());
    ensure!(
        ctx,
        permit_b.fence() > permit_a.fence(),
        "B's permit on A's expired slot has fence {} after A's {}",
        permit_b.fence(),
        permit_a.fence()
    );
    attempt!(ctx, store.write(&permit_b, &WriteBatch::new().put(record.clone(), b"B".to_vec())).await, "B's write");
    let late = store.write(&permit_a, &WriteBatch::new().put(record.clone(), b"A2".to_vec())).await;
    ensure!(
        ctx,
        late.as_ref().err().and_then(palisade_core::Error::stale_fence_details).is_some(),
        "the paused permit holder's write gave {late:?}, expected StaleFence"
    );
    let data = attempt!(ctx, store.read(&record).await, "read");
    ensure!(ctx, data.as_ref().map(|r| r.value.as_slice()) == Some(b"B"), "data after the refusal: {data:?}");
    ensure!(ctx, permit_a.is_lost(), "the paused permit holder's lost signal had not fired");
    let released = permit_a.release().await.err().map(|e| e.kind());
    ensure!(
        ctx,
        matches!(released, Some(ErrorKind::NotHolder | ErrorKind::LeaseLost)),
        "A released a permit B holds: {released:?}"
    );
    ctx.note(format!("B had A's slot {:.0} ms after it asked", started.elapsed().as_secs_f64() * 1e3));
    ensure!(ctx, !permit_x.is_lost(), "X's renewed permit was lost");
    let _ = permit_b.release().await;
    x.end().await;
    Ok(ctx.report())
}

/// **Queued waiters are served in order where the service declares FIFO.** A queued semaphore
/// of 1 permit: H holds it; three waiters, each over its own client, call `acquire` 100 ms
/// apart, so all three wait; H releases. Each waiter holds for 20 ms and releases. Where the
/// service declares `fifo(Primitive::Semaphore)` (it queues its waiters) the permit goes to
/// the waiters in the order they asked; elsewhere every waiter gets it within its wait (no
/// starvation) and the order is reported.
pub async fn semaphore_fifo_when_declared<F>(ctx: &Ctx, lf: &F) -> Outcome
where
    F: LockServiceFactory,
    F::Service: LockService<Fencing = Fenced>,
{
    const WAITERS: usize = 3;
    let ns = Namespace::new();
    let sem_key = key(ctx, &ns, "semaphore")?;
    let timing = lf.timing();
    let ttl = (timing.ttl * 10).max(Duration::from_secs(2));
    let holder_svc = client(ctx, lf).await?;
    let fifo = holder_svc.capabilities().fifo(palisade_core::Primitive::Semaphore);
    let queued = |svc| Semaphore::new(svc, sem_key.clone(), 1).and_then(Semaphore::queued);
    let holder = attempt!(ctx, queued(holder_svc), "semaphore");
    let held = attempt!(ctx, holder.try_acquire(ttl).await, "H's permit");
    let held = held.ok_or_else(|| ctx.fail("the only permit of a fresh semaphore was not free"))?;
    let order: Arc<Mutex<Vec<usize>>> = Arc::default();
    let mut waiters = Vec::new();
    for w in 0..WAITERS {
        let sem = attempt!(ctx, queued(client(ctx, lf).await?), "semaphore");
        let order = Arc::clone(&order);
        waiters.push(tokio::spawn(async move {
            let permit = sem.acquire(LockOptions::ttl(ttl).wait(patience(ttl))).await?;
            order.lock().unwrap_or_else(PoisonError::into_inner).push(w);
            tokio::time::sleep(Duration::from_millis(20)).await;
            permit.release().await
        }));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    attempt!(ctx, held.release().await, "H's release");
    for w in waiters {
        match w.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(ctx.fail(format!("a waiter failed (starved?): {e}"))),
            Err(e) => return Err(ctx.fail(format!("a waiter panicked: {e}"))),
        }
    }
    let order = order.lock().unwrap_or_else(PoisonError::into_inner).clone();
    ensure!(ctx, order.len() == WAITERS, "{} of {WAITERS} waiters got the permit", order.len());
    if fifo {
        ensure!(
            ctx,
            order == [0, 1, 2],
            "the service declares FIFO, but queued waiters were served in the order {order:?}"
        );
    }
    ctx.note(format!("waiters served in the order {order:?} (FIFO declared: {fifo})"));
    Ok(ctx.report())
}

/// **A primitive's own locks are not the user's keys** (`Semaphore`, `RwLock`): the locks a
/// primitive takes besides its resource (a semaphore's permit slots and queue, a read-write
/// lock's reader slots) live where no user key can be. A user's mutexes on `<id>.queue`,
/// `<id>.permit-0` and `<rw>.rw-read.permit-0` (the names those locks once had), held for the
/// whole scenario, block nothing: a queued semaphore of 1 permit on `<id>` takes its permit
/// with a zero wait, and the read-write lock on `<rw>` lets its writer in at once. The
/// primitive's own keys (`Semaphore::slot`, `Semaphore::queue`) are refused as user keys by
/// `ResourceKey::new`, and the backend takes locks on them (its key encoding accepts them).
pub async fn primitive_keys_are_their_own<L, S>(ctx: &Ctx, lf: &L, sf: &S) -> Outcome
where
    L: LockServiceFactory,
    L::Service: LockService<Fencing = Fenced>,
    S: FencedStoreFactory,
{
    let ns = Namespace::new();
    let ttl = (lf.timing().ttl * 10).max(Duration::from_secs(2));
    let user = client(ctx, lf).await?;
    let mut mutexes = Vec::new();
    for id in ["jobs.queue", "jobs.permit-0", "prices.rw-read.permit-0"] {
        let taken = attempt!(ctx, user.try_lock(&key(ctx, &ns, id)?, ttl).await, format!("a user's mutex on {id}"));
        mutexes.push(taken.ok_or_else(|| ctx.fail(format!("a user's mutex on a fresh key {id} was busy")))?);
    }
    let sem = Semaphore::new(client(ctx, lf).await?, key(ctx, &ns, "jobs")?, 1).and_then(Semaphore::queued);
    let sem = attempt!(ctx, sem, "semaphore");
    let permit = sem.acquire(LockOptions::ttl(ttl).wait(Duration::ZERO)).await;
    let permit = attempt!(
        ctx,
        permit,
        "a queued semaphore on `jobs`, whose only permit is free, while a user holds mutexes on jobs.queue and jobs.permit-0"
    );
    let store = store_client(ctx, sf).await?;
    let rw = attempt!(ctx, RwLock::new(client(ctx, lf).await?, store, key(ctx, &ns, "prices")?, 1), "rwlock");
    let writer = rw.write(LockOptions::ttl(ttl).wait(Duration::ZERO)).await;
    let writer = attempt!(
        ctx,
        writer,
        "the writer of a free read-write lock on `prices` while a user holds a mutex on prices.rw-read.permit-0"
    );
    let _ = writer.release().await;
    let _ = permit.release().await;
    for own in sem.queue().into_iter().chain(sem.slot(0)) {
        let typed = ResourceKey::new(own.domain(), own.id());
        ensure!(ctx, typed.is_err(), "the semaphore's own key {own} is a key a user can name");
    }
    for m in mutexes {
        let _ = m.release().await;
    }
    Ok(ctx.report())
}
