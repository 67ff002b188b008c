//! Lock service scenarios (1–7, and the ones named after catalogue classes).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use palisade_core::{
    Error, ErrorKind, Fenced, FencedStore, Fencing, Grant, Lease, LockOptions, LockService, LockServiceExt, OwnerToken,
    Progress, ResourceKey, Ttl, WriteBatch,
};
use tokio::time::Instant;

use crate::harness::{Ctx, Failure, Outcome};
use crate::{FaultyClient, FencedStoreFactory, FencingOf, LockServiceFactory, Namespace, Restart, attempt, ensure};

// The liveness scenarios, in the registry with the rest (`$crate::lock::$name`).
pub use crate::liveness::{
    acquire_cancelled_as_the_lock_frees, idle_key_keeps_its_counter, repair_keeps_the_holder,
    resent_release_never_frees_a_new_grant, slow_replies_still_complete, waits_are_bounded,
};

type Service<F> = <F as LockServiceFactory>::Service;

pub(crate) async fn client<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Result<Arc<Service<F>>, Failure> {
    let svc = factory.client().await.map_err(|e| ctx.fail(format!("factory could not make a client: {e}")))?;
    ctx.saw_service(svc.backend(), &svc.capabilities());
    Ok(svc)
}

pub(crate) fn key(ctx: &Ctx, ns: &Namespace, id: &str) -> Result<ResourceKey, Failure> {
    ns.key(id).map_err(|e| ctx.fail(format!("namespace key: {e}")))
}

/// The grant of a `try_acquire` on a key nobody holds: an error, or "held", fails the scenario.
pub(crate) fn fresh<G>(ctx: &Ctx, acquired: palisade_core::Result<Option<G>>) -> Result<G, Failure> {
    match acquired {
        Ok(Some(grant)) => Ok(grant),
        Ok(None) => Err(ctx.fail("a fresh key was reported busy")),
        Err(e) => Err(ctx.fail(format!("try_acquire of a fresh key: {e}"))),
    }
}

/// Generous bound for waits that should succeed: never the thing under test.
pub(crate) fn patience(factory_ttl: Duration) -> Duration {
    (factory_ttl * 20).max(Duration::from_secs(20))
}

/// **1. Mutual exclusion.** `LockService::try_acquire`/`acquire`: at most one unexpired grant
/// of a key exists at a time. 4 independent clients × 20 rounds contend for one key; a
/// non-atomic read-modify-write of a shared counter inside the critical section never sees a
/// second holder and loses no increment; every round completes.
pub async fn mutual_exclusion<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    const CLIENTS: u64 = 4;
    const ROUNDS: u64 = 20;
    let ns = Namespace::new();
    let key = key(ctx, &ns, "mutex")?;
    let ttl = factory.timing().ttl;
    let holders = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let value = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let svc = client(ctx, factory).await?;
        let (key, holders, overlaps, value) = (key.clone(), holders.clone(), overlaps.clone(), value.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let lease = svc.lock(&key, LockOptions::ttl(ttl).wait(patience(ttl))).await?;
                if holders.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                let v = value.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
                value.store(v + 1, Ordering::SeqCst);
                holders.fetch_sub(1, Ordering::SeqCst);
                lease.release().await?;
            }
            Ok::<(), palisade_core::Error>(())
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(attempt!(ctx, t.await, "client task panicked"));
    }
    // Overlaps first: a second holder is the broken guarantee; the errors it causes later
    // (a release that finds someone else's lock) are its consequences.
    ensure!(
        ctx,
        overlaps.load(Ordering::SeqCst) == 0,
        "{} times a client got the lock while another held it",
        overlaps.load(Ordering::SeqCst)
    );
    for r in results {
        attempt!(ctx, r, "a contending client failed");
    }
    let got = value.load(Ordering::SeqCst);
    ensure!(
        ctx,
        got == CLIENTS * ROUNDS,
        "lost updates inside the critical section: counter {got}, expected {}",
        CLIENTS * ROUNDS
    );
    ctx.note(format!("{} exclusive rounds", CLIENTS * ROUNDS));
    Ok(ctx.report())
}

/// **2. Owner-only release and extend.** `LockService::extend`/`release`: a grant carrying
/// another owner token cannot release or extend the lock (`NotHolder`, and the holder keeps
/// it); a released grant cannot be released again (`NotHolder`).
pub async fn owner_only_release_and_extend<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let key = key(ctx, &ns, "owner")?;
    let ttl = attempt!(ctx, Ttl::new(factory.timing().ttl * 4), "ttl");
    let holder = client(ctx, factory).await?;
    let other = client(ctx, factory).await?;
    let mine = fresh(ctx, holder.try_acquire(&key, ttl).await)?;
    let token = attempt!(ctx, OwnerToken::generate(), "token");
    let mut forged: Grant<<Service<F> as LockService>::Fencing> =
        Grant::new(key.clone(), token, mine.fence_token(), ttl, Instant::now());
    if let Some(handle) = mine.handle() {
        forged = forged.with_handle(handle);
    }
    let err = other.release(&forged).await.err().map(|e| e.kind());
    ensure!(ctx, err == Some(ErrorKind::NotHolder), "release with a foreign token gave {err:?}, expected NotHolder");
    let err = other.extend(&forged, ttl).await.err().map(|e| e.kind());
    ensure!(ctx, err == Some(ErrorKind::NotHolder), "extend with a foreign token gave {err:?}, expected NotHolder");
    let busy = attempt!(ctx, other.try_acquire(&key, ttl).await, "try_acquire by the other client");
    ensure!(ctx, busy.is_none(), "the holder lost the lock to a foreign release or extend");
    attempt!(ctx, holder.extend(&mine, ttl).await, "the owner's own extend");
    attempt!(ctx, holder.release(&mine).await, "the owner's own release");
    let err = holder.release(&mine).await.err().map(|e| e.kind());
    ensure!(ctx, err == Some(ErrorKind::NotHolder), "a second release gave {err:?}, expected NotHolder");
    let err = holder.extend(&mine, ttl).await.err().map(|e| e.kind());
    ensure!(ctx, err == Some(ErrorKind::NotHolder), "extend after release gave {err:?}, expected NotHolder");
    Ok(ctx.report())
}

/// **3. Expiry and takeover.** A holder that neither extends nor releases loses the lock after
/// its TTL (plus the declared margin), and not before; another client then gets it with a
/// higher fence; the first holder's lost signal has fired by then.
pub async fn expiry_and_takeover<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let key = key(ctx, &ns, "expiry")?;
    let timing = factory.timing();
    let a = client(ctx, factory).await?;
    let b = client(ctx, factory).await?;
    let started = Instant::now();
    let first = fresh(ctx, a.try_lock(&key, timing.ttl).await)?;
    let acquired = Instant::now();
    let taken_over = loop {
        if let Some(lease) = attempt!(ctx, b.try_lock(&key, timing.ttl).await, "takeover try_lock") {
            break lease;
        }
        ensure!(
            ctx,
            acquired.elapsed() <= timing.expiry_bound() + Duration::from_millis(250),
            "nobody could take the lock {:?} after the holder went silent (TTL {:?} + margin {:?})",
            acquired.elapsed(),
            timing.ttl,
            timing.expiry_margin
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let took = started.elapsed();
    // The grant's TTL counts from the server's receipt, which is after `started`; allow for a
    // coarse server clock (1 ms) and nothing else.
    ensure!(
        ctx,
        took + Duration::from_millis(2) >= timing.ttl,
        "the lock was taken over after {took:?}, before its TTL {:?}",
        timing.ttl
    );
    if let (Some(fa), Some(fb)) = (first.fence_if_any(), taken_over.fence_if_any()) {
        ensure!(ctx, fb > fa, "takeover fence {fb} is not above the expired holder's {fa}");
    }
    let lost = tokio::time::timeout(Duration::from_millis(20), first.lost()).await.is_ok();
    ensure!(ctx, lost, "the expired holder's lost signal had not fired when another client took the lock");
    ctx.note(format!("takeover after {:.0} ms (TTL {} ms)", took.as_secs_f64() * 1e3, timing.ttl.as_millis()));
    let err = first.release().await.err().map(|e| e.kind());
    ensure!(ctx, err == Some(ErrorKind::NotHolder), "release by the expired holder gave {err:?}, expected NotHolder");
    attempt!(ctx, taken_over.release().await, "release by the new holder");
    Ok(ctx.report())
}

/// **4. Fence monotonicity.** Over grants that end by release, by expiry and takeover, and by
/// extension then release, each grant's fence is strictly above every earlier one of the
/// resource, and exactly one above the previous where the service declares `gap_free`. A
/// service declaring no fence must hand out none (the documented refusal).
pub async fn fence_monotonicity<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let key = key(ctx, &ns, "fences")?;
    let timing = factory.timing();
    let a = client(ctx, factory).await?;
    let b = client(ctx, factory).await?;
    let caps = a.capabilities();
    let issues = <<Service<F> as LockService>::Fencing as Fencing>::ISSUES_FENCES;
    ensure!(
        ctx,
        caps.issues_fences() == issues,
        "capabilities say fence source {:?}, but the type says fences: {issues}",
        caps.fence_source
    );
    let mut fences = Vec::new();
    for round in 0..9 {
        let (holder, next) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let lease =
            attempt!(ctx, holder.lock(&key, LockOptions::ttl(timing.ttl).wait(patience(timing.ttl))).await, "lock");
        fences.push(lease.fence_if_any());
        match round % 3 {
            0 => attempt!(ctx, lease.release().await, "release"),
            1 => {
                // Let it expire; the other client takes over.
                let taken = attempt!(
                    ctx,
                    next.lock(&key, LockOptions::ttl(timing.ttl).wait(patience(timing.ttl))).await,
                    "takeover"
                );
                fences.push(taken.fence_if_any());
                attempt!(ctx, taken.release().await, "release after takeover");
                drop(lease);
            }
            _ => {
                attempt!(ctx, lease.extend(timing.ttl).await, "extend");
                attempt!(ctx, lease.release().await, "release after extend");
            }
        }
    }
    if !issues {
        ensure!(ctx, fences.iter().all(Option::is_none), "an unfenced service handed out a fence");
        ctx.refusal_checked("no fences, as declared (efficiency lock)");
        return Ok(ctx.report());
    }
    let fences: Vec<u64> = fences.into_iter().map(|f| f.map_or(0, |f| f.get())).collect();
    for pair in fences.windows(2) {
        ensure!(
            ctx,
            pair[1] > pair[0],
            "fences went {} then {}: not strictly increasing ({fences:?})",
            pair[0],
            pair[1]
        );
        if caps.gap_free {
            ensure!(
                ctx,
                pair[1] == pair[0] + 1,
                "declared gap-free but fences went {} then {} ({fences:?})",
                pair[0],
                pair[1]
            );
        }
    }
    ctx.note(format!("{} grants, fences {}..={}", fences.len(), fences[0], fences[fences.len() - 1]));
    Ok(ctx.report())
}

/// **5. Progress-gated renewal.** `Lease::renew_on_progress`: a holder that keeps making
/// progress keeps the lock past three TTLs (another client cannot take it); once its progress
/// stalls it loses the lock within TTL + margin, its lost signal fires, and another client
/// gets it.
pub async fn progress_gated_renewal<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let key = key(ctx, &ns, "renewal")?;
    let timing = factory.timing();
    let a = client(ctx, factory).await?;
    let b = client(ctx, factory).await?;
    let lease = attempt!(ctx, a.lock(&key, LockOptions::ttl(timing.ttl).wait(patience(timing.ttl))).await, "lock");
    let progress = Progress::new();
    let _renewal = lease.renew_on_progress(&progress);
    let until = Instant::now() + timing.ttl * 3;
    while Instant::now() < until {
        progress.tick();
        let stolen = attempt!(ctx, b.try_lock(&key, timing.ttl).await, "probe");
        ensure!(ctx, stolen.is_none(), "another client took the lock while its holder was making progress");
        tokio::time::sleep(timing.ttl / 10).await;
    }
    ensure!(ctx, !lease.is_lost(), "a progressing holder's lease was lost");
    let stalled = Instant::now();
    let bound = timing.expiry_bound() + timing.ttl / 3 + Duration::from_millis(100);
    let lost = tokio::time::timeout(bound, lease.lost()).await.is_ok();
    ensure!(ctx, lost, "a stalled holder's lease was not lost within {bound:?}");
    let taken = loop {
        if let Some(l) = attempt!(ctx, b.try_lock(&key, timing.ttl).await, "takeover") {
            break l;
        }
        ensure!(
            ctx,
            stalled.elapsed() <= bound + timing.expiry_margin,
            "the stalled holder still had the lock after {:?}",
            stalled.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    ctx.note(format!("lost {:.0} ms after the stall", stalled.elapsed().as_secs_f64() * 1e3));
    attempt!(ctx, taken.release().await, "release");
    Ok(ctx.report())
}

/// **6. Wait and handoff.** `acquire` with a wait timeout gets the lock when the holder
/// releases it, and fails with `Timeout` (retryable) when the holder keeps it. Handoff latency
/// (release returned → waiter holds) is reported, and bounded by one TTL (the hold is four): a
/// waiter that misses its wake-up and waits for the holder's expiry fails.
pub async fn wait_and_handoff<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let key = key(ctx, &ns, "handoff")?;
    let timing = factory.timing();
    let long = timing.ttl * 4;
    let a = client(ctx, factory).await?;
    let b = client(ctx, factory).await?;
    let mut handoffs = Vec::new();
    for _ in 0..8 {
        let held = attempt!(ctx, a.lock(&key, LockOptions::ttl(long).wait(patience(timing.ttl))).await, "holder lock");
        let waiter = {
            let (b, key) = (Arc::clone(&b), key.clone());
            tokio::spawn(async move {
                let lease = b.lock(&key, LockOptions::ttl(long).wait(patience(long))).await;
                (lease, Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        attempt!(ctx, held.release().await, "holder release");
        let released = Instant::now();
        let (lease, got_at) = attempt!(ctx, waiter.await, "waiter task");
        let lease = attempt!(ctx, lease, "the waiter did not get the released lock");
        let handoff = got_at.saturating_duration_since(released);
        // A waiter that is woken, or polls, gets a released lock promptly; one that sleeps
        // until the holder's TTL would wait out most of the 4 TTLs of this hold.
        ensure!(
            ctx,
            handoff <= timing.ttl,
            "the waiter got the released lock {handoff:?} after the release, more than one TTL ({:?}): it missed its wake-up",
            timing.ttl
        );
        handoffs.push(handoff);
        attempt!(ctx, lease.release().await, "waiter release");
    }
    handoffs.sort();
    ctx.note(format!(
        "handoff p50 {:.2} ms, max {:.2} ms",
        handoffs[handoffs.len() / 2].as_secs_f64() * 1e3,
        handoffs[handoffs.len() - 1].as_secs_f64() * 1e3
    ));
    let held = attempt!(ctx, a.lock(&key, LockOptions::ttl(long).wait(patience(timing.ttl))).await, "holder lock");
    let wait = timing.ttl / 2;
    let started = Instant::now();
    let err = b.lock(&key, LockOptions::ttl(long).wait(wait)).await.err();
    let kind = err.as_ref().map(|e| e.kind());
    ensure!(ctx, kind == Some(ErrorKind::Timeout), "waiting on a held lock gave {kind:?}, expected Timeout");
    ensure!(ctx, err.is_some_and(|e| e.is_retryable()), "Timeout must be retryable");
    ensure!(ctx, started.elapsed() >= wait, "Timeout came after {:?}, before the wait of {wait:?}", started.elapsed());
    attempt!(ctx, held.release().await, "release");
    Ok(ctx.report())
}

/// **7. Bad input.** Invalid keys, a zero TTL, a TTL above the maximum and a wait above 24 h are
/// typed errors (`InvalidKey`, `InvalidArgument`), never a panic or a grant. The service's own
/// `acquire` refuses a too long wait too (backends that override it must validate).
pub async fn bad_input<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let svc = client(ctx, factory).await?;
    for (domain, id) in
        [("", "x"), (ns.name(), ""), (ns.name(), "a b"), (ns.name(), "a:b"), (ns.name(), "{x}"), (ns.name(), "x/y")]
    {
        let kind = ResourceKey::new(domain, id).err().map(|e| e.kind());
        ensure!(ctx, kind == Some(ErrorKind::InvalidKey), "key {domain:?}/{id:?} gave {kind:?}, expected InvalidKey");
    }
    let key = key(ctx, &ns, "bad-input")?;
    for ttl in [Duration::ZERO, Ttl::MAX + Duration::from_secs(1), Duration::from_secs(u64::MAX / 4)] {
        let kind = svc.try_lock(&key, ttl).await.err().map(|e| e.kind());
        ensure!(ctx, kind == Some(ErrorKind::InvalidArgument), "TTL {ttl:?} gave {kind:?}, expected InvalidArgument");
    }
    let too_long = Ttl::MAX + Duration::from_secs(1);
    let kind = svc.lock(&key, LockOptions::ttl(factory.timing().ttl).wait(too_long)).await.err().map(|e| e.kind());
    ensure!(ctx, kind == Some(ErrorKind::InvalidArgument), "a wait above 24 h gave {kind:?}, expected InvalidArgument");
    let ttl = attempt!(ctx, Ttl::new(factory.timing().ttl), "ttl");
    let kind = svc.acquire(&key, ttl, too_long).await.err().map(|e| e.kind());
    ensure!(
        ctx,
        kind == Some(ErrorKind::InvalidArgument),
        "the service's acquire with a wait above 24 h gave {kind:?}, expected InvalidArgument"
    );
    let free = attempt!(ctx, svc.try_lock(&key, factory.timing().ttl).await, "try_lock after bad input");
    ensure!(ctx, free.is_some(), "bad input left the key locked");
    Ok(ctx.report())
}

/// **A zero wait is one attempt** (`LockService::acquire`, `LockOptions::wait`). With a wait of
/// zero, `acquire` takes a free lock, and on a held one answers `Timeout` at once (well within
/// the TTL) without leaving anything behind: after the holder releases, a plain `try_acquire`
/// from another client gets the lock (a queue node or reservation of the zero-wait attempt
/// would block it).
pub async fn zero_wait_is_one_attempt<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let key = key(ctx, &ns, "zero-wait")?;
    let timing = factory.timing();
    let ttl = attempt!(ctx, Ttl::new(timing.ttl * 4), "ttl");
    let (holder, prober, next) =
        (client(ctx, factory).await?, client(ctx, factory).await?, client(ctx, factory).await?);
    let free =
        attempt!(ctx, prober.acquire(&key, ttl, Duration::ZERO).await, "acquire of a free lock with a zero wait");
    attempt!(ctx, prober.release(&free).await, "release");
    let held = fresh(ctx, holder.try_acquire(&key, ttl).await)?;
    let asked = Instant::now();
    let kind = prober.acquire(&key, ttl, Duration::ZERO).await.err().map(|e| e.kind());
    let took = asked.elapsed();
    // The time first: a zero wait that blocked until the holder's grant ran out may come back
    // with the lock, and the wait is what went wrong.
    ensure!(
        ctx,
        took < timing.ttl,
        "a zero wait on a held lock took {took:?} (answering {kind:?}): it waited instead of making one attempt"
    );
    ensure!(ctx, kind == Some(ErrorKind::Timeout), "a zero wait on a held lock gave {kind:?}, expected Timeout");
    attempt!(ctx, holder.release(&held).await, "holder release");
    // A bounded wait, not one try: a backend may clean up after the attempt asynchronously.
    let after = next.acquire(&key, ttl, timing.ttl).await;
    let after = attempt!(
        ctx,
        after,
        format!(
            "the lock after its holder released it (waited up to {:?}): the zero-wait attempt left a queue entry",
            timing.ttl
        )
    );
    attempt!(ctx, next.release(&after).await, "release");
    ctx.note(format!("zero wait on a held lock answered in {:.1} ms", took.as_secs_f64() * 1e3));
    Ok(ctx.report())
}

/// **`with_lock` releases on every path** (`LockServiceExt::with_lock`). The scoped form
/// releases after its work succeeds and after it fails (another client then takes the lock at
/// once); inside the work, taking the same key from the same service is `Reentrant` at once,
/// not a wait on ourselves; and when the lease is lost under the work (a TTL with no
/// extension), the work is cancelled at its next await and the result is `WorkCancelled`, not
/// retryable (what the work did before may have taken effect).
pub async fn with_lock_releases_on_every_path<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let key = key(ctx, &ns, "scoped")?;
    let timing = factory.timing();
    let (svc, other) = (client(ctx, factory).await?, client(ctx, factory).await?);
    let options = LockOptions::ttl(timing.ttl * 4).wait(patience(timing.ttl));
    let probe = |what: &'static str| {
        let (other, key) = (Arc::clone(&other), key.clone());
        async move {
            match other.try_lock(&key, timing.ttl).await {
                Ok(Some(lease)) => lease.release().await.map_err(|e| format!("{what}: release: {e}")),
                Ok(None) => Err(format!("the lock is still held {what}: with_lock did not release it")),
                Err(e) => Err(format!("{what}: try_lock: {e}")),
            }
        }
    };

    let fence =
        svc.with_lock(&key, options, |lease| Box::pin(async move { Ok::<_, Error>(lease.fence_if_any()) })).await;
    attempt!(ctx, fence, "with_lock whose work succeeds");
    probe("after a successful with_lock").await.map_err(|e| ctx.fail(e))?;

    let failed: Result<(), Error> = svc
        .with_lock(&key, options, |_| {
            Box::pin(async move { Err(Error::new(ErrorKind::Conflict, "work", "the work failed")) })
        })
        .await;
    let kind = failed.err().map(|e| e.kind());
    ensure!(
        ctx,
        kind == Some(ErrorKind::Conflict),
        "with_lock whose work fails gave {kind:?}, expected the work's Conflict"
    );
    probe("after a with_lock whose work failed").await.map_err(|e| ctx.fail(e))?;

    let inner = Arc::clone(&svc);
    let inner_key = key.clone();
    let nested = svc
        .with_lock(&key, options, |_| {
            Box::pin(async move {
                let asked = Instant::now();
                let kind = inner.lock(&inner_key, options).await.err().map(|e| e.kind());
                Ok::<_, Error>((kind, asked.elapsed()))
            })
        })
        .await;
    let (kind, took) = attempt!(ctx, nested, "with_lock around a nested lock");
    ensure!(ctx, kind == Some(ErrorKind::Reentrant), "a nested lock of the same key gave {kind:?}, expected Reentrant");
    ensure!(ctx, took < timing.ttl, "the re-entrant lock was refused only after {took:?}: it waited on itself");

    let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = Arc::clone(&finished);
    let short = LockOptions::ttl(timing.ttl).wait(patience(timing.ttl));
    let lost = svc
        .with_lock(&key, short, |_| {
            Box::pin(async move {
                tokio::time::sleep(timing.ttl * 3).await;
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok::<_, Error>(())
            })
        })
        .await;
    let (kind, retryable) = lost.err().map_or((None, false), |e| (Some(e.kind()), e.is_retryable()));
    ensure!(
        ctx,
        kind == Some(ErrorKind::WorkCancelled) && !retryable,
        "work outliving its lease gave {kind:?} (retryable: {retryable}), expected WorkCancelled, not retryable"
    );
    ensure!(
        ctx,
        !finished.load(std::sync::atomic::Ordering::SeqCst),
        "the work ran to its end after the lease was lost: it was not cancelled"
    );
    let after = attempt!(
        ctx,
        other.lock(&key, LockOptions::ttl(timing.ttl).wait(patience(timing.ttl))).await,
        "lock after the lost lease"
    );
    attempt!(ctx, after.release().await, "release");
    Ok(ctx.report())
}

/// **Stale release and extend reach the backend** (catalogue C8, C9, C13). The lease refuses
/// locally once its deadline passed, so this calls the service itself with the old grant:
/// after another client took the expired lock over, `release` and `extend` of the old grant
/// are `NotHolder` and the new holder keeps the lock; and an expired grant nobody took over
/// cannot be extended back to life (`LockService::extend`: "a grant that has expired … gets
/// `NotHolder` and nothing changes"; `release`: "the current holder (if any) keeps the lock").
pub async fn stale_release_and_extend_after_takeover<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let key = key(ctx, &ns, "stale-ops")?;
    let timing = factory.timing();
    let ttl = attempt!(ctx, Ttl::new(timing.ttl), "ttl");
    let (a, b, c) = (client(ctx, factory).await?, client(ctx, factory).await?, client(ctx, factory).await?);
    let old = fresh(ctx, a.try_acquire(&key, ttl).await)?;
    let bound = timing.expiry_bound() + Duration::from_millis(250);
    let new = attempt!(ctx, free_within(&*b, &key, ttl, bound).await, "takeover try_acquire");
    let Some(new) = new else { return Err(ctx.fail("the expired lock was never free")) };
    let kind = a.extend(&old, ttl).await.err().map(|e| e.kind());
    ensure!(
        ctx,
        kind == Some(ErrorKind::NotHolder),
        "extend of the expired grant after a takeover gave {kind:?}, expected NotHolder"
    );
    let kind = a.release(&old).await.err().map(|e| e.kind());
    ensure!(
        ctx,
        kind == Some(ErrorKind::NotHolder),
        "release of the expired grant after a takeover gave {kind:?}, expected NotHolder"
    );
    let stolen = attempt!(ctx, c.try_acquire(&key, ttl).await, "probe");
    ensure!(ctx, stolen.is_none(), "a stale release or extend freed the new holder's lock");
    attempt!(ctx, b.extend(&new, ttl).await, "the new holder's extend");
    attempt!(ctx, b.release(&new).await, "the new holder's release");

    // C13: expired, and nobody took it over.
    let lonely = attempt!(ctx, a.try_acquire(&key, ttl).await, "try_acquire");
    let Some(lonely) = lonely else { return Err(ctx.fail("a released key was reported busy")) };
    tokio::time::sleep(timing.expiry_bound() + Duration::from_millis(50)).await;
    let kind = a.extend(&lonely, ttl).await.err().map(|e| e.kind());
    ensure!(
        ctx,
        kind == Some(ErrorKind::NotHolder),
        "extend of a grant that expired with nobody waiting gave {kind:?}, expected NotHolder (an expired lock must not come back to life)"
    );
    let free = attempt!(ctx, c.try_acquire(&key, ttl).await, "try_acquire after the refused extend");
    ensure!(ctx, free.is_some(), "the lock is held after its grant expired and its extend was refused");
    if let Some(g) = free {
        attempt!(ctx, c.release(&g).await, "release");
    }
    Ok(ctx.report())
}

/// **Cancelled acquires leave no residue** (catalogue C25, C39). Six waiters for a held lock
/// are cancelled (their `acquire` futures dropped) at different points of their wait. After the
/// holder releases, another client gets the lock within TTL + margin and releases it, and a
/// fresh client then finds it free: no queue entry, session node or reservation of a cancelled
/// waiter blocks anyone. (`LockService::acquire`: dropping the future gives up the wait.)
pub async fn cancelled_acquires_leave_no_residue<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let key = key(ctx, &ns, "cancel")?;
    let timing = factory.timing();
    let long = timing.ttl * 4;
    // Every client is made before the holder locks: making one may take a while (a connect
    // that queues for a database file), and that is not time the holder's TTL covers.
    let holder = client(ctx, factory).await?;
    let mut waiters = Vec::with_capacity(6);
    for _ in 0..6 {
        waiters.push(client(ctx, factory).await?);
    }
    let next = client(ctx, factory).await?;
    let held = attempt!(ctx, holder.lock(&key, LockOptions::ttl(long).wait(patience(timing.ttl))).await, "holder lock");
    for (i, svc) in (0..6u64).zip(waiters) {
        let key = key.clone();
        let waiter =
            tokio::spawn(async move { svc.lock(&key, LockOptions::ttl(long).wait(patience(long))).await.map(drop) });
        tokio::time::sleep(Duration::from_millis((i * 7) % 25)).await;
        waiter.abort();
        let _ = waiter.await;
    }
    attempt!(ctx, held.release().await, "holder release");
    let released = Instant::now();
    let bound = timing.expiry_bound() + Duration::from_millis(500);
    let lease = next.lock(&key, LockOptions::ttl(timing.ttl).wait(bound)).await;
    let lease = attempt!(
        ctx,
        lease,
        format!(
            "the lock after six cancelled waiters and a release (waited up to {bound:?}): a cancelled waiter left residue"
        )
    );
    let took = released.elapsed();
    attempt!(ctx, lease.release().await, "release");
    let fresh = client(ctx, factory).await?;
    let free = attempt!(ctx, fresh.try_lock(&key, timing.ttl).await, "try_lock");
    ensure!(ctx, free.is_some(), "the lock is busy after everyone released it: a cancelled waiter holds it");
    if let Some(l) = free {
        attempt!(ctx, l.release().await, "release");
    }
    ctx.note(format!("next holder {:.1} ms after the release", took.as_secs_f64() * 1e3));
    Ok(ctx.report())
}

/// **FIFO when declared** (catalogue C28). A service whose capabilities say
/// `Waiting::NativeFifo` grants waiters in arrival order: four waiters arrive 30 ms apart
/// behind a holder, and after each release the longest-waiting one gets the lock. A service
/// that does not declare it passes with a note.
pub async fn fifo_when_declared<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let key = key(ctx, &ns, "fifo")?;
    let timing = factory.timing();
    let holder = client(ctx, factory).await?;
    if holder.capabilities().waiting != palisade_core::Waiting::NativeFifo {
        ctx.not_applicable("FIFO not declared: no order to check");
        return Ok(ctx.report());
    }
    let long = timing.ttl * 4;
    // Clients first: making one is not time the holder's TTL covers.
    let mut clients = Vec::with_capacity(4);
    for _ in 0..4 {
        clients.push(client(ctx, factory).await?);
    }
    let held = attempt!(ctx, holder.lock(&key, LockOptions::ttl(long).wait(patience(timing.ttl))).await, "holder lock");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for (i, svc) in clients.into_iter().enumerate() {
        let (key, order) = (key.clone(), Arc::clone(&order));
        waiters.push(tokio::spawn(async move {
            let lease = svc.lock(&key, LockOptions::ttl(long).wait(patience(long))).await?;
            order.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(i);
            tokio::time::sleep(Duration::from_millis(5)).await;
            lease.release().await
        }));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    attempt!(ctx, held.release().await, "holder release");
    for w in waiters {
        attempt!(ctx, attempt!(ctx, w.await, "waiter task"), "a waiter");
    }
    let got = order.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
    ensure!(
        ctx,
        got == [0, 1, 2, 3],
        "declared FIFO, but waiters arriving in order 0, 1, 2, 3 got the lock as {got:?}"
    );
    Ok(ctx.report())
}

/// **Declared timing is explained.** The factory's expiry margin (how long after a TTL the
/// scenarios wait for a stopped holder's lock to come free) must be explained by the service's
/// declared [`Capabilities::expiry_delay`](palisade_core::Capabilities::expiry_delay), plus at
/// most `max(TTL, 1 s)` for round trips and expiry resolution. A larger margin would weaken
/// every expiry bound of the suite without anyone noticing.
pub async fn declared_timing_is_explained<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let timing = factory.timing();
    let caps = client(ctx, factory).await?.capabilities();
    let slack = timing.ttl.max(Duration::from_secs(1));
    ensure!(
        ctx,
        timing.expiry_margin <= caps.expiry_delay + slack,
        "the expiry margin {:?} is not explained: the service declares an expiry delay of {:?}, and at most {slack:?} more is allowed for round trips",
        timing.expiry_margin,
        caps.expiry_delay
    );
    ctx.note(format!(
        "margin {} ms = declared expiry delay {} ms + {} ms",
        timing.expiry_margin.as_millis(),
        caps.expiry_delay.as_millis(),
        timing.expiry_margin.saturating_sub(caps.expiry_delay).as_millis()
    ));
    Ok(ctx.report())
}

/// **The lost signal comes from the backend** (catalogue C23). A holder renewing on progress
/// (a long TTL, renewed every third of it) has its lock deleted on the server behind its back
/// ([`LockServiceFactory::break_lock`]): its lost signal must fire within two thirds of the
/// granted TTL and before the lease's deadline as it then stands (an extend answered with
/// success after the delete moves that deadline, and a watchdog firing there is the lease's
/// own clock, not the backend), so it was the backend that reported the loss; and the
/// service's own `extend` of that grant is then `NotHolder`. A lost signal subscribed after
/// the loss fires at once, and a cleanly released lease's lost signal never fires. A factory
/// without the hook passes with a note.
pub async fn lost_signal_from_the_backend<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let key = key(ctx, &ns, "lost-signal")?;
    let timing = factory.timing();
    let svc = client(ctx, factory).await?;
    let long = timing.ttl * 6;

    let clean = attempt!(ctx, svc.lock(&key, LockOptions::ttl(long).wait(patience(timing.ttl))).await, "lock");
    let clean_lost = clean.lost();
    attempt!(ctx, clean.release().await, "release");
    let fired = tokio::time::timeout(timing.ttl, clean_lost).await.is_ok();
    ensure!(ctx, !fired, "the lost signal fired after a clean release");

    let lease = attempt!(ctx, svc.lock(&key, LockOptions::ttl(long).wait(patience(timing.ttl))).await, "lock");
    let progress = palisade_core::Progress::new();
    let _renewal = lease.renew_on_progress(&progress);
    match factory.break_lock(&key).await {
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            ctx.saw_hook("break_lock", false);
            let _ = lease.release().await;
            return Err(ctx.fail(
                "the factory provides no `break_lock`, which every certification requires: the suite cannot \
                 check that the holder learns of a lost lock from the backend",
            ));
        }
        other => {
            ctx.saw_hook("break_lock", true);
            attempt!(ctx, other, "break_lock")
        }
    }
    let broken = Instant::now();
    // Renewal runs every third of the granted TTL (a session-based backend may cap it below
    // `long`): the loss must be known by two thirds, while the local deadline is at the full TTL.
    let granted = lease.ttl().get();
    let bound = granted * 2 / 3;
    let ticking = Ticking::start(&progress);
    let fired = tokio::time::timeout(bound, lease.lost()).await.is_ok();
    drop(ticking);
    ensure!(
        ctx,
        fired,
        "the lock was deleted on the server, but the holder's lost signal had not fired {bound:?} later (renewal every {:?}; the local deadline is at {granted:?})",
        granted / 3
    );
    let took = broken.elapsed();
    // A service whose extend answers a deleted lock with "OK, a moment left" moves the local
    // deadline to that moment, and the watchdog then fires in time: the signal must have
    // come before the lease's own deadline, and the service's own extend must say NotHolder.
    let deadline = lease.deadline();
    ensure!(
        ctx,
        Instant::now() < deadline,
        "the lost signal fired {took:?} after the server-side delete, but only at the lease's own deadline (an extend \
         after the delete was answered with success, granting {:?}): the service never reported the loss, the local \
         clock did",
        lease.ttl().get()
    );
    let renewed = svc.extend(lease.grant(), attempt!(ctx, Ttl::new(long), "ttl")).await;
    ensure!(
        ctx,
        renewed.as_ref().is_err_and(|e| e.kind() == ErrorKind::NotHolder),
        "the service's own extend of a grant whose lock was deleted on the server gave {:?}, expected NotHolder",
        renewed.map_err(|e| e.to_string())
    );
    let again = tokio::time::timeout(Duration::from_millis(20), lease.lost()).await.is_ok();
    ensure!(ctx, again, "a lost signal subscribed after the loss did not fire at once");
    ctx.note(format!(
        "lost {:.0} ms after the server-side delete (local deadline {} ms)",
        took.as_secs_f64() * 1e3,
        granted.as_millis()
    ));
    Ok(ctx.report())
}

/// A task that reports progress every 10 ms (a holder that keeps working) until dropped.
struct Ticking(tokio::task::JoinHandle<()>);

impl Ticking {
    fn start(progress: &Progress) -> Self {
        let progress = progress.clone();
        Ticking(tokio::spawn(async move {
            loop {
                progress.tick();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }))
    }
}

impl Drop for Ticking {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How many of an acquire's requests the lost-reply scenario loses the reply of, one at a time.
const ACQUIRE_ROUND_TRIPS: usize = 4;

/// The factory's client behind fault proxies, or `None` (noted in the report) if it has none.
pub(crate) async fn faulty_client<F: LockServiceFactory>(
    ctx: &Ctx,
    factory: &F,
) -> Result<Option<FaultyClient<FencingOf<F>>>, Failure> {
    match factory.faulty_client().await {
        Ok(c) if c.proxies.is_empty() => Err(ctx.fail("the factory's faulty client has no fault proxy")),
        Ok(c) => {
            ctx.saw_hook("faulty_client", true);
            Ok(Some(c))
        }
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            ctx.saw_hook("faulty_client", false);
            let deployment = client(ctx, factory).await?.capabilities().deployment;
            if deployment == palisade_core::Deployment::Network {
                return Err(ctx.fail(
                    "declares `Deployment::Network` but provides no `faulty_client`: a networked service must be \
                     certified against lost replies, cut connections and partitions",
                ));
            }
            ctx.not_applicable(format!(
                "{deployment:?} deployment and no client behind a fault proxy: no network to fault"
            ));
            Ok(None)
        }
        Err(e) => Err(ctx.fail(format!("factory could not make a faulty client: {e}"))),
    }
}

/// Retries `op` while it fails with a retryable error (a client reconnecting after a fault),
/// for up to five seconds; the first non-retryable result is returned.
pub(crate) async fn settle<T, Fut>(mut op: impl FnMut() -> Fut) -> palisade_core::Result<T>
where
    Fut: std::future::Future<Output = palisade_core::Result<T>>,
{
    let give_up = Instant::now() + Duration::from_secs(5);
    loop {
        match op().await {
            Err(e) if e.is_retryable() && Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
}

/// Polls `try_acquire` until it grants or `within` has passed.
pub(crate) async fn free_within<S: LockService + ?Sized>(
    svc: &S,
    key: &ResourceKey,
    ttl: Ttl,
    within: Duration,
) -> palisade_core::Result<Option<Grant<S::Fencing>>> {
    let give_up = Instant::now() + within;
    loop {
        if let Some(g) = svc.try_acquire(key, ttl).await? {
            return Ok(Some(g));
        }
        if Instant::now() >= give_up {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// **Lost replies leave one live grant** (catalogue C33; bug classes 6 and 11). Through the
/// factory's [fault proxy](crate::proxy), the reply to a request is lost after the server
/// applied it, once for each of `try_acquire`, `release` and `extend`. Whatever the client
/// then answers, the lock must be in the state its answer implies (`LockService::try_acquire`:
/// "a reply lost after the server applied the request leaves no orphan"; `release`: "a caller
/// repeating a release it could not confirm gets `NotHolder`, and the next holder keeps the
/// lock"):
/// - a grant returned after the lost reply is the only one (no other client gets the lock),
///   releasable, and on a gap-free service it spent one fence, not two;
/// - an error leaves no orphan: the lock is free well before its TTL (a `None`, "held", on a
///   free key is the client's own first attempt holding it);
/// - after a release whose reply was lost the lock is free, and repeating that release (what
///   a caller does with an unconfirmed one) is `NotHolder` and leaves the next holder's lock
///   alone;
/// - an extend whose reply was lost leaves the grant releasable, or cleanly gone.
pub async fn lost_replies_leave_one_live_grant<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let Some(faulty) = faulty_client(ctx, factory).await? else { return Ok(ctx.report()) };
    let ns = Namespace::new();
    let timing = factory.timing();
    // A TTL long enough that "free well before its TTL" tells a resolved fault from an orphan.
    let long = timing.ttl * 5;
    let ttl = attempt!(ctx, Ttl::new(long), "ttl");
    let prompt = long / 2;
    let svc = &faulty.service;
    let (other, third) = (client(ctx, factory).await?, client(ctx, factory).await?);
    let gap_free = other.capabilities().gap_free;

    // Acquire, losing the reply of its first request, then of its second, … (an acquire may
    // take several round trips), until the acquire takes fewer requests than that.
    for skip in 0..ACQUIRE_ROUND_TRIPS {
        let k = key(ctx, &ns, &format!("lost-acquire-{skip}"))?;
        let before = faulty.lose_replies_to(skip);
        let result = svc.try_acquire(&k, ttl).await;
        faulty.disarm();
        if faulty.lost_since(before) == 0 {
            ensure!(ctx, skip > 0, "the fault proxy lost no reply: does the faulty client dial it?");
            if let Ok(Some(g)) = result {
                // The previous round cut the faulty client's connection; a release on it may
                // be the request that finds the connection gone (`OutcomeUnknown`), and a
                // release may be resent (`LockService::release`): a resend answered
                // `NotHolder` means the unconfirmed one was applied.
                let mut released = svc.release(&g).await;
                let mut resent = false;
                for _ in 0..3 {
                    match &released {
                        Err(e) if e.kind() == ErrorKind::OutcomeUnknown => {
                            released = svc.release(&g).await;
                            resent = true;
                        }
                        Err(e) if resent && e.kind() == ErrorKind::NotHolder => {
                            released = Ok(());
                            break;
                        }
                        _ => break,
                    }
                }
                attempt!(ctx, released, "release");
            }
            break;
        }
        match result {
            Ok(Some(g)) => {
                let probe = attempt!(ctx, other.try_acquire(&k, ttl).await, "probe");
                ensure!(
                    ctx,
                    probe.is_none(),
                    "after its reply was lost try_acquire returned a grant, and another client got the lock too: a double grant"
                );
                attempt!(ctx, settle(|| svc.release(&g)).await, "release of the grant returned after a lost reply");
                let next = attempt!(ctx, free_within(&*other, &k, ttl, prompt).await, "try_acquire after the release");
                let Some(next) = next else {
                    return Err(
                        ctx.fail("the grant returned after a lost reply was released, but the lock stayed held")
                    );
                };
                if let (Some(a), Some(b)) = (g.fence_if_any(), next.fence_if_any()) {
                    ensure!(ctx, b > a, "fence {b} after {a}: not increasing");
                    ensure!(
                        ctx,
                        !gap_free || b.get() == a.get() + 1,
                        "fences {a} then {b} around a lost acquire reply, though declared gap-free: the retry spent a second fence"
                    );
                }
                attempt!(ctx, other.release(&next).await, "release");
                ctx.note(format!("acquire (reply {skip} lost): resolved into the grant"));
            }
            Ok(None) => {
                return Err(ctx.fail(
                    "try_acquire of a free key answered \"held\" after its reply was lost: its own first attempt holds \
                     the lock, an orphan nobody can release until its TTL (a retry that is not the same request)",
                ));
            }
            Err(e) => {
                let next = attempt!(ctx, free_within(&*other, &k, ttl, prompt).await, "try_acquire after the failure");
                let Some(next) = next else {
                    return Err(ctx.fail(format!(
                        "try_acquire failed after its reply was lost ({e}), and the lock was still held {prompt:?} later: \
                         an orphaned grant nobody can release until its TTL"
                    )));
                };
                attempt!(ctx, other.release(&next).await, "release");
                ctx.note(format!("acquire (reply {skip} lost): failed with {}, no orphan", e.kind().as_str()));
            }
        }
    }

    // Release, then the caller's repeat of the release it could not confirm.
    let k = key(ctx, &ns, "lost-release")?;
    let g = fresh(ctx, settle(|| svc.try_acquire(&k, ttl)).await)?;
    let before = faulty.lose_next_replies();
    let result = svc.release(&g).await;
    faulty.disarm();
    ensure!(ctx, faulty.lost_since(before) > 0, "the fault proxy lost no reply to the release");
    // `LockService::release`: the grant was live and nobody else took the lock, so whatever
    // resent the release (the service, or a client library under it) must not call it
    // someone else's; an unknown outcome is honest, `NotHolder` is not.
    if let Err(e) = &result {
        ensure!(
            ctx,
            e.kind() != ErrorKind::NotHolder,
            "a live grant's release whose reply was lost answered NotHolder ({e}): its resend found the lock freed \
             by the first send and reported it as another's"
        );
    }
    let next = attempt!(ctx, free_within(&*other, &k, ttl, prompt).await, "try_acquire after the release");
    let Some(next) = next else {
        return Err(ctx.fail(format!(
            "the release reached the server but its reply was lost ({:?}), and the lock was still held {prompt:?} later",
            result.err().map(|e| e.kind())
        )));
    };
    let again = settle(|| svc.release(&g)).await.err().map(|e| e.kind());
    let stolen = attempt!(ctx, third.try_acquire(&k, ttl).await, "probe");
    ensure!(
        ctx,
        stolen.is_none(),
        "a release repeated after its lost reply freed the next holder's lock (bug class 6)"
    );
    ensure!(
        ctx,
        again == Some(ErrorKind::NotHolder),
        "a repeated release of a grant already released gave {again:?}, expected NotHolder"
    );
    attempt!(ctx, other.release(&next).await, "the next holder's release");

    // Extend.
    let k = key(ctx, &ns, "lost-extend")?;
    let g = fresh(ctx, settle(|| svc.try_acquire(&k, ttl)).await)?;
    let before = faulty.lose_next_replies();
    let extended = svc.extend(&g, ttl).await;
    faulty.disarm();
    ensure!(ctx, faulty.lost_since(before) > 0, "the fault proxy lost no reply to the extend");
    let stolen = attempt!(ctx, third.try_acquire(&k, ttl).await, "probe");
    ensure!(ctx, stolen.is_none(), "after an extend whose reply was lost another client got the lock");
    match (extended, settle(|| svc.release(&g)).await) {
        (_, Ok(())) => {}
        (Err(_), Err(e)) if e.kind() == ErrorKind::NotHolder => {}
        (Ok(_), Err(e)) => {
            return Err(ctx.fail(format!(
                "extend reported success after its reply was lost, but the grant could not be released: {e}"
            )));
        }
        (Err(x), Err(e)) => {
            return Err(ctx.fail(format!("after an extend whose reply was lost ({x}) the release failed: {e}")));
        }
    }
    let next = attempt!(ctx, free_within(&*other, &k, ttl, prompt).await, "try_acquire after the release");
    let Some(next) = next else {
        return Err(ctx.fail("after an extend whose reply was lost and a release, the lock stayed held"));
    };
    attempt!(ctx, other.release(&next).await, "release");
    Ok(ctx.report())
}

/// **A cut connection keeps the grant or reports it lost** (catalogue C31). While a client
/// behind a [fault proxy](crate::proxy) holds a lock, every one of its connections is cut (a
/// server restart, a load balancer's reap). Afterwards the client either still holds the
/// grant, and then extending and releasing it works and nobody else got the lock meanwhile,
/// or it reports the grant gone (`NotHolder`, `LeaseLost`) and the lock comes free within
/// TTL + margin. Either way the client can take new locks.
pub async fn cut_connections_keep_the_grant_or_report_it<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let Some(faulty) = faulty_client(ctx, factory).await? else { return Ok(ctx.report()) };
    let ns = Namespace::new();
    let timing = factory.timing();
    let ttl = attempt!(ctx, Ttl::new(timing.ttl * 4), "ttl");
    let svc = &faulty.service;
    let other = client(ctx, factory).await?;
    let k = key(ctx, &ns, "cut")?;
    let g = fresh(ctx, svc.try_acquire(&k, ttl).await)?;
    faulty.cut_connections();
    let probe = attempt!(ctx, other.try_acquire(&k, ttl).await, "probe right after the cut");
    ensure!(ctx, probe.is_none(), "right after the holder's connections were cut another client got its lock");
    match settle(|| svc.extend(&g, ttl)).await {
        Ok(_) => {
            let probe = attempt!(ctx, other.try_acquire(&k, ttl).await, "probe");
            ensure!(
                ctx,
                probe.is_none(),
                "the holder extended its grant after the cut, yet another client got the lock"
            );
            attempt!(ctx, settle(|| svc.release(&g)).await, "release after the cut");
            ctx.note("the grant survived the cut");
        }
        Err(e) if matches!(e.kind(), ErrorKind::NotHolder | ErrorKind::LeaseLost) => {
            let free = attempt!(
                ctx,
                free_within(&*other, &k, ttl, ttl.get() + timing.expiry_margin).await,
                "try_acquire after the lost grant"
            );
            ensure!(
                ctx,
                free.is_some(),
                "the holder was told its grant is gone, but the lock stayed held past its TTL"
            );
            if let Some(free) = free {
                attempt!(ctx, other.release(&free).await, "release");
            }
            ctx.note(format!("the cut cost the grant ({})", e.kind().as_str()));
        }
        Err(e) => return Err(ctx.fail(format!("extend after the connections were cut: {e}"))),
    }
    let k = key(ctx, &ns, "after-cut")?;
    let again = attempt!(ctx, settle(|| svc.try_acquire(&k, ttl)).await, "try_acquire on a new key after the cut");
    ensure!(ctx, again.is_some(), "after the cut the client could not take a free lock");
    if let Some(g) = again {
        attempt!(ctx, svc.release(&g).await, "release");
    }
    Ok(ctx.report())
}

/// **A partitioned holder loses the lock before anyone else gains it** (catalogue C34 for one
/// holder, C42, bug class 13). A holder renewing on progress is cut off from the service by a
/// [partition](crate::proxy::FaultProxy::partition) while another client waits for the lock.
/// When the other client is granted it, the holder's lease must already be lost and its
/// `safe_until` past (the lease's deadline is never later than the server's expiry). After the
/// partition heals, extending the old grant reaches the service and is `NotHolder`, and the
/// new holder keeps the lock.
pub async fn partitioned_holder_loses_before_anyone_gains<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let Some(faulty) = faulty_client(ctx, factory).await? else { return Ok(ctx.report()) };
    let ns = Namespace::new();
    let timing = factory.timing();
    let ttl = attempt!(ctx, Ttl::new(timing.ttl), "ttl");
    let (other, third) = (client(ctx, factory).await?, client(ctx, factory).await?);
    let k = key(ctx, &ns, "partition")?;
    let lease =
        attempt!(ctx, faulty.service.lock(&k, LockOptions::ttl(timing.ttl).wait(patience(timing.ttl))).await, "lock");
    let progress = Progress::new();
    let _renewal = lease.renew_on_progress(&progress);
    let ticking = Ticking::start(&progress);
    tokio::time::sleep(timing.ttl / 2).await;
    ensure!(ctx, !lease.is_lost(), "a lease renewed on progress was lost before the partition");
    faulty.partition();
    let cut_at = Instant::now();
    let next = other.acquire(&k, ttl, patience(timing.ttl)).await;
    let granted_at = Instant::now();
    drop(ticking);
    let next = attempt!(ctx, next, "the other client's acquire during the partition");
    ensure!(
        ctx,
        lease.safe_until() <= granted_at,
        "another client got the lock {:?} after the partition while the partitioned holder's safe_until was {:?} later still: two holders",
        granted_at - cut_at,
        lease.safe_until() - granted_at
    );
    // The lost signal is the watchdog's timer at the deadline (or the backend's word before):
    // a few milliseconds of scheduling after the deadline are not a second holder.
    let fired = tokio::time::timeout_at(lease.deadline().max(granted_at) + Duration::from_millis(50), lease.lost())
        .await
        .is_ok();
    ensure!(ctx, fired, "the partitioned holder's lost signal did not fire at its deadline");
    faulty.heal();
    let stale = settle(|| faulty.service.extend(lease.grant(), ttl)).await.err().map(|e| e.kind());
    ensure!(
        ctx,
        stale == Some(ErrorKind::NotHolder),
        "after the partition healed, extending the old grant gave {stale:?}, expected NotHolder"
    );
    let stolen = attempt!(ctx, third.try_acquire(&k, ttl).await, "probe");
    ensure!(ctx, stolen.is_none(), "after the partition healed the new holder's lock was free");
    attempt!(ctx, other.release(&next).await, "the new holder's release");
    ctx.note(format!("the lock changed hands {:.0} ms after the partition", (granted_at - cut_at).as_secs_f64() * 1e3));
    Ok(ctx.report())
}

/// **A minority is never a quorum** (catalogue C32; bug class 17), for services that spread a
/// lock over several servers (Redlock): a factory whose faulty client has at least three fault
/// proxies. With a majority of its servers partitioned away, a client is not granted the lock;
/// the partial grants it made on the minority are rolled back, so a second client that reaches
/// a bare majority (every server but as many as the first client reached) gets the free lock at
/// once; and with a minority partitioned away the lock is still granted. Single-server
/// services pass with a note.
pub async fn quorum_faults_never_grant_a_minority<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let Some(first) = faulty_client(ctx, factory).await? else { return Ok(ctx.report()) };
    let n = first.proxies.len();
    // The declaration decides, not the number of proxies: a cluster's client talks to many
    // servers through as many proxies, but each key lives on one of them.
    let replication = first.service.capabilities().replication;
    if replication != palisade_core::Replication::ClientMajority {
        ctx.not_applicable(format!(
            "replication {replication:?}: the client does not count a majority of independent servers"
        ));
        return Ok(ctx.report());
    }
    ensure!(
        ctx,
        n >= 3,
        "declares `Replication::ClientMajority` but its faulty client has {n} fault prox(ies): a majority of \
         independent servers needs at least three, each behind a proxy of its own"
    );
    let Some(second) = faulty_client(ctx, factory).await? else { return Ok(ctx.report()) };
    let majority = n / 2 + 1;
    let minority = n - majority;
    let ns = Namespace::new();
    let timing = factory.timing();
    let ttl = attempt!(ctx, Ttl::new(timing.ttl * 5), "ttl");

    let k = key(ctx, &ns, "quorum")?;
    for p in &first.proxies[..majority] {
        p.partition();
    }
    let cut_off = first.service.try_acquire(&k, ttl).await;
    first.heal();
    ensure!(
        ctx,
        !matches!(cut_off, Ok(Some(_))),
        "granted with only {minority} of {n} servers reachable: a minority counted as a quorum"
    );
    // The first client wrote to the last `minority` servers; the second reaches all but the
    // first `minority`, a bare majority that includes them.
    for p in &second.proxies[..minority] {
        p.partition();
    }
    let failed_at = Instant::now();
    let next = free_within(&*second.service, &k, ttl, ttl.get() / 2).await;
    let waited = failed_at.elapsed();
    second.heal();
    let next = attempt!(ctx, next, "try_acquire through a bare majority");
    let Some(next) = next else {
        return Err(ctx.fail(format!(
            "a client reaching {majority} of {n} servers could not take the free lock: the servers that answered the \
             failed attempt still hold its partial grant (not rolled back)"
        )));
    };
    attempt!(ctx, settle(|| second.service.release(&next)).await, "release");
    ctx.note(format!("a bare majority got the lock {:.0} ms after the failed attempt", waited.as_secs_f64() * 1e3));

    let k = key(ctx, &ns, "quorum-minority-down")?;
    for p in &first.proxies[..minority] {
        p.partition();
    }
    let granted = first.service.try_acquire(&k, ttl).await;
    first.heal();
    let granted = attempt!(ctx, granted, "try_acquire with a minority unreachable");
    let Some(granted) = granted else {
        return Err(ctx.fail(format!("with {minority} of {n} servers unreachable the free lock was not granted")));
    };
    attempt!(ctx, settle(|| first.service.release(&granted)).await, "release");
    Ok(ctx.report())
}

/// **A dropped client lets go** (catalogue C30, C39; bug class 14). A client takes a lock and is
/// dropped without releasing it (a leaked handle, a stopped task: no release is ever sent).
/// Nothing of it may keep the lock alive (a keep-alive or renewal task that outlives its
/// client): another client gets the lock within TTL + margin (`LockService::try_acquire`: "a
/// holder that neither extends nor releases loses the lock after `ttl`").
pub async fn dropped_client_lets_go<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let k = key(ctx, &ns, "dropped")?;
    let timing = factory.timing();
    let ttl = attempt!(ctx, Ttl::new(timing.ttl), "ttl");
    let other = client(ctx, factory).await?;
    let holder = client(ctx, factory).await?;
    let grant = fresh(ctx, holder.try_acquire(&k, ttl).await)?;
    drop(grant);
    drop(holder);
    let dropped = Instant::now();
    let bound = timing.expiry_bound() + Duration::from_millis(250);
    let next = attempt!(ctx, free_within(&*other, &k, ttl, bound).await, "try_acquire after the drop");
    let Some(next) = next else {
        return Err(ctx.fail(format!(
            "a client dropped while holding the lock (TTL {:?}) left it held {bound:?} later: the lock outlives its \
             holder (a keep-alive that outlives its client, bug class 14, or no expiry at all)",
            timing.ttl
        )));
    };
    ctx.note(format!("free {:.0} ms after the holder was dropped", dropped.elapsed().as_secs_f64() * 1e3));
    attempt!(ctx, other.release(&next).await, "release");
    Ok(ctx.report())
}

/// **A fast client clock takes nothing early** (catalogue C41; bug class 9). A client whose
/// clock runs ten TTLs ahead ([`LockServiceFactory::skewed_client`]) tries for half a TTL to
/// take a lock another client just took: expiry is judged by the server's clock (or a
/// monotonic one), never by a client's wall clock, so it never gets it. A factory whose clients
/// read no clock that could matter passes with a note.
pub async fn fast_client_clock_takes_nothing_early<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let timing = factory.timing();
    let ahead = timing.ttl * 10;
    let skewed = match factory.skewed_client(ahead).await {
        Ok(c) => c,
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            ctx.saw_hook("skewed_client", false);
            ctx.not_applicable(
                "no client with a skewed clock: expiry is judged by one clock (the server's or this machine's)",
            );
            return Ok(ctx.report());
        }
        Err(e) => return Err(ctx.fail(format!("factory could not make a skewed client: {e}"))),
    };
    let ns = Namespace::new();
    let k = key(ctx, &ns, "skew")?;
    let long = timing.ttl * 2;
    let ttl = attempt!(ctx, Ttl::new(long), "ttl");
    let (holder, other) = (client(ctx, factory).await?, client(ctx, factory).await?);
    let grant = fresh(ctx, holder.try_acquire(&k, ttl).await)?;
    let granted = Instant::now();
    let probe = attempt!(ctx, other.try_acquire(&k, ttl).await, "probe");
    ensure!(ctx, probe.is_none(), "another client (clock in step) took the held lock: no exclusion to begin with");
    let stolen = attempt!(ctx, free_within(&*skewed, &k, ttl, timing.ttl).await, "the skewed client's try_acquire");
    if let Some(stolen) = stolen {
        let _ = skewed.release(&stolen).await;
        return Err(ctx.fail(format!(
            "a client whose clock runs {ahead:?} ahead took the lock {:?} after it was granted for {long:?}: expiry \
             judged by a client's clock (bug class 9)",
            granted.elapsed()
        )));
    }
    attempt!(ctx, holder.release(&grant).await, "release");
    Ok(ctx.report())
}

/// **A cut-off waiter is never a second holder** (catalogue C27 with C31; bug class 12). A
/// client behind a [fault proxy](crate::proxy) waits in `acquire` for a held lock and is
/// partitioned away past TTL + margin, long enough for a session of its to expire on the
/// server. Then the holder releases and a third client tries to take the lock:
/// - if it gets it, the cut-off waiter must not come back holding the same lock when the
///   partition heals (its `acquire` fails, or goes on waiting): a waiter whose session died
///   is never granted;
/// - if it does not, the lock went to the waiter while it was cut off (a service whose
///   waiters have no session), and the waiter's `acquire` must return that grant once the
///   partition heals: a lock held by nobody would be a dead waiter blocking the queue.
pub async fn dead_waiter_is_never_granted<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let Some(waiter) = faulty_client(ctx, factory).await? else { return Ok(ctx.report()) };
    let ns = Namespace::new();
    let k = key(ctx, &ns, "dead-waiter")?;
    let timing = factory.timing();
    let long = (timing.ttl * 20).max(timing.expiry_bound() * 3);
    let ttl = attempt!(ctx, Ttl::new(long), "ttl");
    let (holder, third) = (client(ctx, factory).await?, client(ctx, factory).await?);
    // The holder renews while the waiter is cut off (a session-capped grant would run out).
    let held = attempt!(ctx, holder.lock(&k, LockOptions::ttl(long).wait(patience(timing.ttl))).await, "lock");
    let progress = Progress::new();
    let renewal = held.renew_on_progress(&progress);
    let ticking = Ticking::start(&progress);
    let waiting = {
        let (svc, k) = (Arc::clone(&waiter.service), k.clone());
        let wait = timing.expiry_bound() * 4 + Duration::from_secs(2);
        tokio::spawn(async move { svc.acquire(&k, ttl, wait).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    waiter.partition();
    tokio::time::sleep(timing.expiry_bound() + Duration::from_millis(250)).await;
    drop(ticking);
    drop(renewal);
    attempt!(ctx, held.release().await, "the holder's release");
    let next = free_within(&*third, &k, ttl, timing.expiry_bound() + Duration::from_millis(250)).await;
    waiter.heal();
    let next = attempt!(ctx, next, "try_acquire after the release");
    let outcome = tokio::time::timeout(Duration::from_secs(2), waiting).await;
    let outcome = match outcome {
        Ok(joined) => Some(attempt!(ctx, joined, "the waiter's task")),
        Err(_) => None,
    };
    match (next, outcome) {
        (Some(next), Some(Ok(grant))) => {
            let _ = waiter.service.release(&grant).await;
            let _ = third.release(&next).await;
            Err(ctx.fail(
                "a waiter cut off past its session came back holding the lock that another client had taken: two                  holders (bug class 12)",
            ))
        }
        (Some(next), outcome) => {
            let stolen = attempt!(ctx, holder.try_acquire(&k, ttl).await, "probe");
            attempt!(ctx, third.release(&next).await, "the new holder's release");
            ensure!(ctx, stolen.is_none(), "the new holder's lock was free before it released it");
            match outcome {
                Some(Err(e)) => ctx.note(format!("the cut-off waiter's acquire ended with {}", e.kind().as_str())),
                _ => ctx.note("the cut-off waiter was still waiting after the partition healed"),
            }
            Ok(ctx.report())
        }
        (None, Some(Ok(grant))) => {
            attempt!(ctx, settle(|| waiter.service.release(&grant)).await, "the waiter's release");
            ctx.note("the lock went to the waiter while it was cut off (no session to lose)");
            Ok(ctx.report())
        }
        (None, outcome) => Err(ctx.fail(format!(
            "after the holder released, nobody could take the lock: not a third client, and not the cut-off waiter              ({}): a dead waiter blocks the queue",
            match outcome {
                Some(Err(e)) => format!("its acquire failed: {e}"),
                _ => "still waiting".to_string(),
            }
        ))),
    }
}

/// **Fences survive a restart when declared, and a data loss is repaired without an
/// operator** (catalogue C20; bug class 4), for a fenced service over a server of the test's
/// own ([`LockServiceFactory::restart_server`]).
/// After the server restarts with its data, a service declaring `fences_survive_restart`
/// issues a fence above every earlier one. Then a holder writes through the store, and the
/// server restarts **without** its data while the holder still has its lease (a paused
/// holder): the counter is gone. `lock_checked` against the store must give a new holder a
/// fence above the store's watermark (`LockService::advance_fence` moved the service's fences
/// on), that holder's write must be accepted, and the old holder's refused, all within two
/// acquire waits and a few round trips of `lock_checked`'s start. A service that answers
/// `FenceRegression` instead leaves the resource stuck until an operator acts: it fails.
/// Last, the server is restored from a snapshot taken five grants ago (a partial loss: a
/// counter goes back, or is gone for a key first used after the snapshot); the same holds for
/// a key written after the snapshot and for one whose only grant since never wrote.
pub async fn fences_survive_restart_or_are_repaired<F, S>(ctx: &Ctx, factory: &F, stores: &S) -> Outcome
where
    F: LockServiceFactory,
    F::Service: LockService<Fencing = palisade_core::Fenced>,
    S: FencedStoreFactory,
{
    let ns = Namespace::new();
    let k = key(ctx, &ns, "restart")?;
    let timing = factory.timing();
    let ttl = attempt!(ctx, Ttl::new(timing.ttl), "ttl");
    let first = client(ctx, factory).await?;
    let caps = first.capabilities();
    let grant = fresh(ctx, first.try_acquire(&k, ttl).await)?;
    let before = grant.fence();
    attempt!(ctx, first.release(&grant).await, "release");
    attempt!(ctx, factory.restart_server(Restart::KeepData).await, "restart with data");
    let second = client(ctx, factory).await?;
    let grant = attempt!(ctx, settle(|| second.try_acquire(&k, ttl)).await, "try_acquire after the restart");
    let Some(grant) = grant else { return Err(ctx.fail("after a restart a released key was reported busy")) };
    let after = grant.fence();
    attempt!(ctx, second.release(&grant).await, "release");
    if caps.fences_survive_restart {
        ensure!(
            ctx,
            after > before,
            "declares fences_survive_restart, but after a restart with its data the fence went from {before} to {after} (bug class 4)"
        );
    } else {
        ctx.note(format!("fence {before} → {after} across a restart (survival not declared)"));
    }

    // A holder writes, then the server loses its data while the holder is paused.
    let store = crate::store::store_client(ctx, stores).await?;
    let k = key(ctx, &ns, "data-loss")?;
    let holder = client(ctx, factory).await?;
    let long = LockOptions::ttl(timing.ttl * 20).wait(patience(timing.ttl));
    let stale = attempt!(ctx, holder.lock(&k, long).await, "lock before the data loss");
    let data = |what: &str| WriteBatch::new().put(ns.record("data"), what.as_bytes().to_vec());
    attempt!(ctx, crate::e2e::write(&*store, &stale, &data("before")).await, "the write before the data loss");
    attempt!(ctx, factory.restart_server(Restart::LoseData).await, "restart without data");
    let third = client(ctx, factory).await?;
    let (lease, wrote) = repaired_holder_writes(
        ctx,
        factory,
        &third,
        &*store,
        &k,
        "data-loss",
        "a restart without data",
        &data("after"),
    )
    .await?;
    ensure!(
        ctx,
        lease.fence() > stale.fence(),
        "after a restart without data lock_checked gave fence {}, not above the {} the store had accepted",
        lease.fence(),
        stale.fence()
    );
    let old = crate::e2e::write(&*store, &stale, &data("stale")).await;
    ensure!(
        ctx,
        old.as_ref().err().and_then(|e| e.stale_fence_details()).is_some(),
        "the holder from before the data loss wrote with fence {} after the repair: {old:?}, expected StaleFence",
        stale.fence()
    );
    let now = attempt!(ctx, store.read(&ns.record("data")).await, "read");
    ensure!(ctx, now.as_ref().map(|r| r.value.as_slice()) == Some(b"after".as_slice()), "data: {now:?}");
    ctx.note(format!(
        "after the data loss: fence {} → {}, the new holder wrote {:.0} ms after lock_checked began",
        stale.fence(),
        lease.fence(),
        wrote.as_secs_f64() * 1e3
    ));
    attempt!(ctx, lease.release().await, "release");
    let _ = stale.release().await; // lost with the data: NotHolder or Ok, either is fine here
    restored_from_an_older_snapshot(ctx, factory, &*store, &ns).await?;
    Ok(ctx.report())
}

/// After a data loss (`after` says which), `lock_checked` on `key` (named `name` in messages)
/// must give `service`'s client a lease whose `batch` the store accepts, within two acquire
/// waits and six round trips of `lock_checked`'s start (the useless grant, its release,
/// `advance_fence`, the watermark reads). A `FenceRegression` leaves the resource stuck until
/// an operator acts: a failure. Returns the lease and how long the write took to land.
#[allow(clippy::too_many_arguments)]
async fn repaired_holder_writes<F, St>(
    ctx: &Ctx,
    factory: &F,
    service: &Arc<Service<F>>,
    store: &St,
    key: &ResourceKey,
    name: &str,
    after: &str,
    batch: &WriteBatch,
) -> Result<(palisade_core::Lease<Service<F>>, Duration), Failure>
where
    F: LockServiceFactory,
    F::Service: LockService<Fencing = palisade_core::Fenced>,
    St: palisade_core::FencedStore + ?Sized,
{
    let timing = factory.timing();
    let options = LockOptions::ttl(timing.ttl * 4).wait(patience(timing.ttl));
    let started = Instant::now();
    let lease = match settle(|| service.lock_checked(store, key, options)).await {
        Ok(lease) => lease,
        Err(e) if e.kind() == ErrorKind::FenceRegression => {
            return Err(ctx.fail(format!(
                "after {after} lock_checked refused key `{name}` ({e}): the service cannot move its fences past \
                 the store's watermark by itself, so the resource stays stuck until an operator acts"
            )));
        }
        Err(e) => return Err(ctx.fail(format!("lock_checked of key `{name}` after {after}: {e}"))),
    };
    attempt!(ctx, crate::e2e::write(store, &lease, batch).await, "the new holder's write after the loss");
    let wrote = started.elapsed();
    let bound = patience(timing.ttl) * 2 + timing.round_trip() * 6;
    ensure!(
        ctx,
        wrote <= bound,
        "after {after} the new holder of key `{name}` wrote {wrote:?} after lock_checked began, beyond the bound \
         {bound:?} (two acquire waits and six round trips: the useless grant, its release, advance_fence, the \
         watermark reads)"
    );
    Ok((lease, wrote))
}

/// The partial loss of [`fences_survive_restart_or_are_repaired`]: the server is restored from
/// a snapshot taken some grants ago. Key `written` had a write accepted before the snapshot
/// (its counter survives, lower than it was); after the snapshot it had a few grants nobody
/// used and one, `w`, that wrote. Key `unwritten` had one grant, `x`, that never wrote (its
/// counter is gone; a new grant may get `x`'s very fence). After the restore, `lock_checked`
/// gives each key a holder whose write is accepted within the bound, and `w`'s and `x`'s
/// writes are refused, or, the documented limit, `x`'s fence outranks the new holder's: then
/// `x`'s write is accepted and the new holder's next one refused (never an equal or lower
/// fence after a higher one).
async fn restored_from_an_older_snapshot<F, St>(
    ctx: &Ctx,
    factory: &F,
    store: &St,
    ns: &Namespace,
) -> Result<(), Failure>
where
    F: LockServiceFactory,
    F::Service: LockService<Fencing = palisade_core::Fenced>,
    St: palisade_core::FencedStore + ?Sized,
{
    let timing = factory.timing();
    let (written, unwritten) = (key(ctx, ns, "restored-written")?, key(ctx, ns, "restored-unwritten")?);
    let data = |what: &str| WriteBatch::new().put(ns.record("restored"), what.as_bytes().to_vec());
    let long = LockOptions::ttl(timing.ttl * 20).wait(patience(timing.ttl));
    let before = client(ctx, factory).await?;
    let p = attempt!(ctx, before.lock(&written, long).await, "lock before the snapshot");
    attempt!(ctx, crate::e2e::write(store, &p, &data("before the snapshot")).await, "the write before the snapshot");
    attempt!(ctx, p.release().await, "release before the snapshot");

    attempt!(ctx, factory.restart_server(Restart::Snapshot).await, "restart taking a snapshot");
    let after = client(ctx, factory).await?;
    let ttl = attempt!(ctx, Ttl::new(timing.ttl), "ttl");
    for _ in 0..3 {
        let unused = fresh(ctx, settle(|| after.try_acquire(&written, ttl)).await)?;
        attempt!(ctx, after.release(&unused).await, "release of an unused grant");
    }
    let w = attempt!(ctx, after.lock(&written, long).await, "lock after the snapshot");
    attempt!(ctx, crate::e2e::write(store, &w, &data("after the snapshot")).await, "the write after the snapshot");
    let x = attempt!(ctx, after.lock(&unwritten, long).await, "lock of the key that is never written");

    attempt!(ctx, factory.restart_server(Restart::FromSnapshot).await, "restart from the snapshot");
    let restored = client(ctx, factory).await?;
    let mut notes = Vec::new();
    for (k, record, stale, what) in
        [(&written, "restored", &w, "written"), (&unwritten, "restored-blank", &x, "unwritten")]
    {
        let batch = |value: &str| WriteBatch::new().put(ns.record(record), value.as_bytes().to_vec());
        let after = "a restore from an older snapshot";
        let (lease, wrote) =
            repaired_holder_writes(ctx, factory, &restored, store, k, what, after, &batch("new")).await?;
        let mut last = "new";
        match crate::e2e::write(store, stale, &batch("stale")).await {
            Err(e) if e.stale_fence_details().is_some() || matches!(e.kind(), ErrorKind::DuplicateFence { .. }) => {}
            // The documented limit: a grant from before the restore that had not written may
            // outrank the new holder's. The store then orders the two by fence: the new
            // holder's next write is refused, and only a fence above the old one is accepted.
            Ok(()) if stale.fence() > lease.fence() => {
                let again = crate::e2e::write(store, &lease, &batch("new again")).await;
                ensure!(
                    ctx,
                    again.as_ref().err().and_then(|e| e.stale_fence_details()).is_some(),
                    "key `{what}`: after the old holder's fence {} was accepted, the new holder's {} was not \
                     refused: {again:?}",
                    stale.fence(),
                    lease.fence()
                );
                last = "stale";
                notes.push(format!("`{what}`: the old holder's unwritten grant outranked the new one"));
            }
            old => {
                return Err(ctx.fail(format!(
                    "after a restore from an older snapshot the holder of key `{what}` from before it wrote with \
                     fence {} after the new holder wrote with {}: {old:?}, expected StaleFence or DuplicateFence",
                    stale.fence(),
                    lease.fence()
                )));
            }
        }
        let now = attempt!(ctx, store.read(&ns.record(record)).await, "read");
        ensure!(ctx, now.as_ref().map(|r| r.value.as_slice()) == Some(last.as_bytes()), "`{what}`: {now:?}");
        notes.push(format!("`{what}` {} → {} in {:.0} ms", stale.fence(), lease.fence(), wrote.as_secs_f64() * 1e3));
        attempt!(ctx, lease.release().await, "release");
    }
    ctx.note(format!("after a restore from a snapshot taken 5 grants ago: {}", notes.join(", ")));
    let _ = (w.release().await, x.release().await); // lost with the restore: either answer is fine
    Ok(())
}

/// **Keys are independent, and a lock is not re-entrant** (catalogue C5, C18, C22). While one
/// client holds a key, its own second `try_acquire` of it is refused (one unexpired grant per
/// key, whoever asks), and another client takes keys that differ only in case, by a prefix or
/// suffix, by where the domain ends, or that are as long as a key may be. On a gap-free
/// service each key's fences go up by one however many grants other keys had meanwhile
/// (a counter per key, not one shared).
pub async fn keys_are_independent<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let timing = factory.timing();
    let ttl = attempt!(ctx, Ttl::new(timing.ttl * 4), "ttl");
    let (a, b) = (client(ctx, factory).await?, client(ctx, factory).await?);
    let base = key(ctx, &ns, "k")?;
    let mut others = Vec::new();
    for id in ["K", "kk", "k.k", "x.k", "k-", &"k".repeat(palisade_core::MAX_ID_LEN)] {
        others.push(key(ctx, &ns, id)?);
    }
    others.push(attempt!(ctx, ResourceKey::new(format!("{}.k", ns.name()), "k"), "key in a longer domain"));
    let held = fresh(ctx, a.try_acquire(&base, ttl).await)?;
    let again = attempt!(ctx, a.try_acquire(&base, ttl).await, "the holder's second try_acquire");
    if let Some(again) = again {
        let _ = a.release(&again).await;
        return Err(
            ctx.fail("the holder's own second try_acquire of its held key was granted: a lock is not re-entrant")
        );
    }
    let mut grants = Vec::new();
    for other in &others {
        let got = attempt!(ctx, b.try_acquire(other, ttl).await, "try_acquire of another key");
        let Some(got) = got else {
            return Err(ctx.fail(format!("holding {base} kept another client from {other}: the keys collide")));
        };
        grants.push(got);
    }
    for g in &grants {
        attempt!(ctx, b.release(g).await, "release");
    }
    attempt!(ctx, a.release(&held).await, "release");
    let next = attempt!(ctx, a.try_acquire(&base, ttl).await, "try_acquire again");
    let Some(next) = next else { return Err(ctx.fail("a released key was reported busy")) };
    attempt!(ctx, a.release(&next).await, "release");
    if let (Some(before), Some(after)) = (held.fence_if_any(), next.fence_if_any()) {
        ensure!(ctx, after > before, "fence {after} after {before} on one key: not increasing");
        ensure!(
            ctx,
            !a.capabilities().gap_free || after.get() == before.get() + 1,
            "fences {before} then {after} on one key with {} grants of other keys between, though declared gap-free: \
             the counter is shared across keys",
            grants.len()
        );
    }
    Ok(ctx.report())
}

/// A lease renewed while its holder runs (ticking its progress every 20 ms, renewing every
/// `every`: a service may cap a grant at its session's TTL).
pub(crate) struct KeptAlive<L: LockService<Fencing = Fenced> + ?Sized> {
    lease: Lease<L>,
    _renewal: palisade_core::Renewal,
    ticking: tokio::task::JoinHandle<()>,
}

impl<L: LockService<Fencing = Fenced> + ?Sized> KeptAlive<L> {
    pub(crate) fn new(lease: Lease<L>, every: Duration) -> Self {
        let progress = Progress::new();
        let renewal = lease.renew_on_progress_every(&progress, every);
        let ticking = tokio::spawn(async move {
            loop {
                progress.tick();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        KeptAlive { lease, _renewal: renewal, ticking }
    }

    /// The lease.
    pub(crate) fn lease(&self) -> &Lease<L> {
        &self.lease
    }

    /// Stops renewing and releases the lease.
    pub(crate) async fn end(self) {
        self.ticking.abort();
        let _ = self.lease.release().await;
    }
}

/// **The read-only view shows the holder and changes nothing** (`InspectLocks`, what
/// `palisade inspect` reads; the factory's `view` hook, required). While a client holds a
/// key:
/// - `lock_view` shows a holder with that grant's id, its fence where the service keeps one
///   beside the holder (else none), and a fence counter, where shown, at or above the fence;
/// - `resources` of the namespace's domain lists the key;
/// - no owner token appears anywhere in the view;
/// - reading changed nothing: the holder extends, another client still cannot take the key.
///
/// Once released: no holder, and the counter, where shown, still at or above the fence.
pub async fn view_shows_the_holder<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let view = match factory.view().await {
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            ctx.saw_hook("view", false);
            return Err(ctx.fail(
                "the factory provides no `view`, which every certification requires: the suite cannot check what \
                 `palisade inspect` shows of this service",
            ));
        }
        other => {
            ctx.saw_hook("view", true);
            attempt!(ctx, other, "view")
        }
    };
    let ns = Namespace::new();
    let key = key(ctx, &ns, "viewed")?;
    let ttl = attempt!(ctx, Ttl::new(factory.timing().ttl * 4), "ttl");
    let (holder, other) = (client(ctx, factory).await?, client(ctx, factory).await?);
    let grant = fresh(ctx, holder.try_acquire(&key, ttl).await)?;
    let fence = grant.fence_if_any();
    let seen = attempt!(ctx, view.lock_view(&key).await, "lock_view of a held key");
    ensure!(ctx, seen.key == key, "lock_view of {key} answered for {}", seen.key);
    let shown = format!("{seen:?}");
    ensure!(ctx, !shown.contains(&grant.token().to_string()), "the view shows the holder's owner token");
    let Some(shown_holder) = &seen.holder else {
        return Err(ctx.fail(format!("lock_view shows no holder of a held key: {seen:?}")));
    };
    ensure!(
        ctx,
        shown_holder.grant == grant.grant_id(),
        "lock_view shows grant {} holding {key}, but grant {} does",
        shown_holder.grant,
        grant.grant_id()
    );
    if let (Some(shown), Some(issued)) = (shown_holder.fence, fence) {
        ensure!(ctx, shown == issued, "lock_view shows the holder's fence as {shown}; it was issued {issued}");
    }
    if let (Some(counter), Some(issued)) = (seen.fence_counter, fence) {
        ensure!(ctx, counter >= issued, "lock_view shows the fence counter at {counter}, below the holder's {issued}");
    }
    let listed = attempt!(ctx, view.resources(&format!("{}:", key.domain())).await, "resources of the domain");
    ensure!(ctx, listed.entries.contains(&key), "resources does not list the held {key}: {:?}", listed.entries);
    attempt!(ctx, holder.extend(&grant, ttl).await, "the holder's extend after the view");
    let busy = attempt!(ctx, other.try_acquire(&key, ttl).await, "another client's try_acquire after the view");
    ensure!(ctx, busy.is_none(), "after the view, another client took the held {key}");
    attempt!(ctx, holder.release(&grant).await, "release");
    let after = attempt!(ctx, view.lock_view(&key).await, "lock_view of a released key");
    ensure!(ctx, after.holder.is_none(), "lock_view still shows a holder of the released {key}: {after:?}");
    if let (Some(counter), Some(issued)) = (after.fence_counter, fence) {
        ensure!(ctx, counter >= issued, "after release the fence counter shows {counter}, below the fence {issued}");
    }
    ctx.note(match fence {
        Some(_) => format!(
            "holder shown with fence {}, counter {}",
            shown_holder.fence.map_or_else(|| "not kept beside the holder".to_string(), |s| s.to_string()),
            seen.fence_counter.map_or_else(|| "not shown".to_string(), |c| c.to_string())
        ),
        None => "holder shown (no fence: an unfenced service)".to_string(),
    });
    Ok(ctx.report())
}
