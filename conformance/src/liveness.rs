//! Liveness scenarios of a lock service: a lock that is safe can still be stuck. Each bounds
//! how long an operation may take, checks that a recovery leaves the holder able to go on, or
//! that a slow service (every reply late, every request applied on time: a loaded cluster, a
//! slow fsync, a long way back) still comes to the answer the first attempt earned. They run
//! in the [registry](crate::registry).

use std::time::Duration;

use palisade_core::{ErrorKind, Fence, Fencing, Grant, LockService, REGRESSION_GAP, ResourceKey, Ttl};
use tokio::time::Instant;

use crate::harness::{Ctx, Failure, Outcome};
use crate::lock::{client, faulty_client, key};
use crate::{FaultProxy, FencedStoreFactory, LockServiceFactory, Namespace, attempt, ensure};

/// The allowance for "answers at once": ten of `service`'s own uncontended round trips (an
/// acquire plus a release of the free key `free`, the second of two: connections are warm),
/// and never under a second (two cores shared by clients, servers and other scenarios).
/// Returns the round trip and the allowance.
async fn measured_allowance<S: LockService + ?Sized>(
    ctx: &Ctx,
    service: &S,
    free: &ResourceKey,
    ttl: Ttl,
) -> Result<(Duration, Duration), Failure> {
    let mut round_trip = Duration::ZERO;
    for _ in 0..2 {
        let started = Instant::now();
        let Some(g) = attempt!(ctx, service.try_acquire(free, ttl).await, "uncontended try_acquire") else {
            return Err(ctx.fail("a fresh key was reported busy"));
        };
        attempt!(ctx, service.release(&g).await, "release");
        round_trip = started.elapsed();
    }
    Ok((round_trip, (round_trip * 10).max(Duration::from_secs(1))))
}

/// **A repair keeps the holder** (`LockService::advance_fence`; fencing rule 5's repair, issue
/// of stranded holders). The repair of a fence regression moves a key's counter while the lock
/// may be held: by [`FencedStoreExt::write`](palisade_core::FencedStoreExt::write) on a
/// `DuplicateFence`, possibly on behalf of a stale duplicate while the current, legitimate
/// holder works. Moving the counter must not change who holds the lock or whether they can
/// renew and release it:
/// - while A holds the key, `advance_fence(key, A's fence + REGRESSION_GAP)` succeeds (or is
///   `Unsupported`, and the scenario says so);
/// - another client still cannot take the key;
/// - A extends and releases its grant without error;
/// - the next grant's fence is above the floor.
pub async fn repair_keeps_the_holder<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let k = key(ctx, &ns, "repair")?;
    let timing = factory.timing();
    let ttl = attempt!(ctx, Ttl::new(timing.ttl * 4), "ttl");
    let (holder, other) = (client(ctx, factory).await?, client(ctx, factory).await?);
    let Some(grant) = attempt!(ctx, holder.try_acquire(&k, ttl).await, "try_acquire of a fresh key") else {
        return Err(ctx.fail("a fresh key was reported busy"));
    };
    let Some(fence) = grant.fence_if_any() else {
        attempt!(ctx, holder.release(&grant).await, "release");
        ctx.refusal_checked("unfenced service: no counter to repair");
        return Ok(ctx.report());
    };
    let floor = Fence::new(fence.get().saturating_add(REGRESSION_GAP));
    match holder.advance_fence(&k, floor).await {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            attempt!(ctx, holder.release(&grant).await, "release");
            ctx.note(format!("advance_fence is unsupported: {e}"));
            return Ok(ctx.report());
        }
        Err(e) => return Err(ctx.fail(format!("advance_fence while the lock is held: {e}"))),
    }
    let stolen = attempt!(ctx, other.try_acquire(&k, ttl).await, "another client's try_acquire after the repair");
    ensure!(ctx, stolen.is_none(), "after the counter was moved another client got the lock its holder still holds");
    let extended = holder.extend(&grant, ttl).await;
    ensure!(
        ctx,
        extended.is_ok(),
        "the repair stranded the holder: its extend after advance_fence gave {:?}",
        extended.err().map(|e| e.to_string())
    );
    let released = holder.release(&grant).await;
    ensure!(
        ctx,
        released.is_ok(),
        "the repair stranded the holder: its release after advance_fence gave {:?} (the lock stays stuck until its TTL)",
        released.err().map(|e| e.to_string())
    );
    let next = attempt!(ctx, other.acquire(&k, ttl, timing.expiry_bound()).await, "the next grant after the release");
    let next_fence = next.fence_if_any().unwrap_or_default();
    ensure!(ctx, next_fence > floor, "the next grant's fence {next_fence} is not above the repair's floor {floor}");
    attempt!(ctx, other.release(&next).await, "release");
    Ok(ctx.report())
}

/// **Waits are bounded** (`LockService::try_acquire`, `LockService::acquire`; "every wait has a
/// bound you can state"). While another client holds a key:
/// - `try_acquire` answers "held" within the allowance (ten of this client's uncontended round
///   trips, at least 1 s): a zero wait is a few round trips, never a wait for the holder;
/// - `acquire` with a wait of 300 ms answers `Timeout` within 300 ms plus the allowance, well
///   before the holder's TTL (4 × the factory's TTL, at least 2 s) runs out;
/// - the holder's own `extend` and `release` answer within the allowance.
pub async fn waits_are_bounded<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let k = key(ctx, &ns, "bounded")?;
    let timing = factory.timing();
    let ttl = attempt!(ctx, Ttl::new((timing.ttl * 4).max(Duration::from_secs(2))), "ttl");
    let (holder, waiter) = (client(ctx, factory).await?, client(ctx, factory).await?);

    let (round_trip, allowed) = measured_allowance(ctx, &*waiter, &k, ttl).await?;

    let Some(held) = attempt!(ctx, holder.try_acquire(&k, ttl).await, "the holder's try_acquire") else {
        return Err(ctx.fail("the lock was still held after its release"));
    };
    let started = Instant::now();
    let tried = tokio::time::timeout(ttl.get(), waiter.try_acquire(&k, ttl)).await;
    let took = started.elapsed();
    let Ok(tried) = tried else {
        return Err(ctx.fail(format!("try_acquire on a held lock did not answer within the holder's TTL ({ttl:?})")));
    };
    ensure!(ctx, matches!(tried, Ok(None)), "try_acquire on a held lock gave {tried:?}, expected \"held\"");
    ensure!(ctx, took <= allowed, "try_acquire on a held lock took {took:?}, allowed {allowed:?}: it waited");

    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let waited = tokio::time::timeout(ttl.get(), waiter.acquire(&k, ttl, wait)).await;
    let took = started.elapsed();
    let Ok(waited) = waited else {
        return Err(ctx.fail(format!(
            "acquire with a {wait:?} wait did not answer within the holder's TTL ({ttl:?}): it ignored its wait"
        )));
    };
    ensure!(
        ctx,
        took <= wait + allowed,
        "acquire with a {wait:?} wait on a held lock took {took:?}, allowed {:?}: it ignored its wait",
        wait + allowed
    );
    let kind = waited.as_ref().err().map(|e| e.kind());
    ensure!(ctx, kind == Some(ErrorKind::Timeout), "acquire with a {wait:?} wait on a held lock gave {kind:?}");

    let started = Instant::now();
    attempt!(ctx, holder.extend(&held, ttl).await, "the holder's extend");
    attempt!(ctx, holder.release(&held).await, "the holder's release");
    let took = started.elapsed();
    ensure!(ctx, took <= allowed * 2, "the holder's extend and release took {took:?}, allowed {:?}", allowed * 2);
    ctx.note(format!(
        "round trip {:.1} ms; allowance {:.0} ms",
        round_trip.as_secs_f64() * 1e3,
        allowed.as_secs_f64() * 1e3
    ));
    Ok(ctx.report())
}

/// How late every reply of the slow client arrives: longer than the one second after which
/// some clients resend an idempotent request, far shorter than their request timeouts.
pub const SLOW_REPLY: Duration = Duration::from_millis(1500);

/// When a grant runs out locally (its `requested_at` plus the TTL granted).
fn deadline<G: Fencing>(grant: &Grant<G>) -> Instant {
    grant.requested_at() + grant.ttl().get()
}

/// **Slow replies still complete**. Through the factory's [fault
/// proxy](crate::proxy), every reply to a client arrives [`SLOW_REPLY`] late while its requests
/// are applied at once ([`FaultProxy::delay_replies`]). A request slower than a client's
/// resend interval is still a request that succeeded:
/// - `try_acquire` of a free key grants it;
/// - `extend` of that grant succeeds (`LockService::extend`: only a grant that expired or was
///   released is `NotHolder`) — checked when the grant has two slow replies' worth of time
///   left; a service that caps grants at a session shorter than that (etcd's, ZooKeeper's) is
///   noted instead, since renewing over such replies cannot keep its grant;
/// - `release` of a grant still live when it is sent succeeds: it frees the lock, and a resend
///   that finds it freed by the first attempt reports success (`LockService::release`), never
///   `NotHolder`;
/// - a fresh client then takes the lock at once;
/// - the same holds for a release during which the slowness ends (the delay stops while the
///   first reply is still on its way; a resend is then answered at once, with the lock
///   already freed by the first attempt).
///
/// A service that does not grant at all through replies this slow (a per-request timeout
/// below the delay, as Redlock's node timeout) is noted, once a fresh client has shown the
/// attempt left no orphan (with replies quick again, the lock is free well before its TTL).
/// A factory without a faulty client is noted, not checked.
///
/// [`FaultProxy::delay_replies`]: crate::FaultProxy::delay_replies
pub async fn slow_replies_still_complete<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let Some(faulty) = faulty_client(ctx, factory).await? else { return Ok(ctx.report()) };
    let ns = Namespace::new();
    let timing = factory.timing();
    // Far longer than the replies, so a delayed answer is never what runs a grant out (a
    // session-capped service may still grant less).
    let ttl = attempt!(ctx, Ttl::new((timing.ttl * 4).max(SLOW_REPLY * 8)), "ttl");
    let other = client(ctx, factory).await?;
    let svc = &faulty.service;
    let k = key(ctx, &ns, "slow")?;
    for proxy in &faulty.proxies {
        proxy.delay_replies(SLOW_REPLY);
    }

    let Some(grant) = granted_or_gone(ctx, &**svc, &faulty.proxies, &*other, &k, ttl).await? else {
        return Ok(ctx.report());
    };
    let mut until = deadline(&grant);
    let left = until.saturating_duration_since(Instant::now());
    if left > SLOW_REPLY * 2 {
        let sent = Instant::now();
        match svc.extend(&grant, ttl).await {
            Ok(granted) => until = sent + granted.get(),
            Err(e) => {
                return Err(ctx.fail(format!(
                    "with replies {SLOW_REPLY:?} late, extend of a grant with {left:?} left failed: {e} (a renewal \
                     slower than the client's resend interval must still complete)"
                )));
            }
        }
    } else {
        ctx.note(format!(
            "the service granted {:?} (capped by its session): too little to renew over replies {SLOW_REPLY:?} late; \
             extend not checked",
            grant.ttl().get()
        ));
    }

    released_and_free(ctx, &**svc, &*other, &grant, until, timing.expiry_bound(), async {}).await?;

    let k = key(ctx, &ns, "slow-then-quick")?;
    let Some(grant) = granted_or_gone(ctx, &**svc, &faulty.proxies, &*other, &k, ttl).await? else {
        return Ok(ctx.report());
    };
    let recover = async {
        tokio::time::sleep(SLOW_REPLY / 2).await;
        for proxy in &faulty.proxies {
            proxy.no_delay();
        }
    };
    let until = deadline(&grant);
    released_and_free(ctx, &**svc, &*other, &grant, until, timing.expiry_bound(), recover).await?;
    Ok(ctx.report())
}

/// The slow client's grant of the free key `k`; or, from a service that does not grant through
/// replies this slow (a per-request timeout below [`SLOW_REPLY`], as Redlock's node timeout),
/// `None` once `other` has shown that the attempt left nothing behind: with replies quick again
/// (the server reachable again), the lock is free well before the TTL
/// (`LockService::try_acquire`: no orphan).
async fn granted_or_gone<G, S, O>(
    ctx: &Ctx,
    svc: &S,
    proxies: &[FaultProxy],
    other: &O,
    k: &palisade_core::ResourceKey,
    ttl: Ttl,
) -> Result<Option<Grant<G>>, Failure>
where
    G: Fencing,
    S: LockService<Fencing = G> + ?Sized,
    O: LockService + ?Sized,
{
    let refused = match svc.try_acquire(k, ttl).await {
        Ok(Some(grant)) => return Ok(Some(grant)),
        Ok(None) => "reported the free key busy".to_string(),
        Err(e) => format!("failed: {e}"),
    };
    // A client that cannot even connect through replies this slow cleans up once it can.
    for proxy in proxies {
        proxy.no_delay();
    }
    let prompt = ttl.get() / 2;
    let give_up = Instant::now() + prompt;
    loop {
        if let Some(next) = attempt!(ctx, other.try_acquire(k, ttl).await, "a fresh client's try_acquire") {
            attempt!(ctx, other.release(&next).await, "the fresh client's release");
            break;
        }
        ensure!(
            ctx,
            Instant::now() < give_up,
            "with replies {SLOW_REPLY:?} late, try_acquire of a free key {refused}, and the lock was still held \
             {prompt:?} after replies were quick again: an orphaned grant nobody can release until its TTL"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ctx.note(format!(
        "with replies {SLOW_REPLY:?} late, try_acquire {refused} (a per-request timeout below the delay?), leaving \
         nothing behind; the rest not checked"
    ));
    Ok(None)
}

/// Releases `grant` (locally live until `until`) through the slow client, running `during`
/// alongside, and checks that the lock is then free for `other`: at once after a release that
/// succeeded, within `bound` after one that found the grant run out.
async fn released_and_free<G, S, O>(
    ctx: &Ctx,
    svc: &S,
    other: &O,
    grant: &Grant<G>,
    until: Instant,
    bound: Duration,
    during: impl std::future::Future<Output = ()>,
) -> Result<(), Failure>
where
    G: Fencing,
    S: LockService<Fencing = G> + ?Sized,
    O: LockService + ?Sized,
{
    let ttl = grant.ttl();
    // A grant whose deadline falls in the instant the release is sent may have been given up
    // by its own client first: only a grant with some time left must release cleanly.
    let live = !grant.lost_token().is_cancelled() && until > Instant::now() + Duration::from_millis(200);
    let sent = Instant::now();
    let (released, ()) = tokio::join!(svc.release(grant), during);
    let took = sent.elapsed();
    match released {
        Ok(()) => {
            let next = attempt!(ctx, other.try_acquire(grant.key(), ttl).await, "a fresh client's try_acquire");
            let Some(next) = next else {
                return Err(ctx.fail(format!(
                    "release succeeded after {took:?} (replies {SLOW_REPLY:?} late), but a fresh client found the \
                     lock still held"
                )));
            };
            attempt!(ctx, other.release(&next).await, "the fresh client's release");
        }
        Err(e) if live => {
            return Err(ctx.fail(format!(
                "with replies {SLOW_REPLY:?} late, release of a live grant failed after {took:?}: {e}{}",
                if e.kind() == ErrorKind::NotHolder {
                    " (NotHolder for a release that freed the lock: a resend turned its success into a refusal)"
                } else {
                    ""
                }
            )));
        }
        Err(e) => {
            ensure!(
                ctx,
                e.kind() == ErrorKind::NotHolder,
                "release of a grant that ran out as it was sent: {e}, expected success or NotHolder"
            );
            let give_up = Instant::now() + bound;
            loop {
                if let Some(next) = attempt!(ctx, other.try_acquire(grant.key(), ttl).await, "try_acquire") {
                    attempt!(ctx, other.release(&next).await, "release");
                    break;
                }
                ensure!(ctx, Instant::now() < give_up, "a grant that ran out left the lock held {bound:?} later");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            ctx.note("the grant ran out as its release was sent (NotHolder)");
        }
    }
    Ok(())
}

/// **Waits are bounded while a fenced transaction is open** (end to end; a store with
/// transactions of its own, [`FencedStoreFactory::hold_transaction`]). A holder takes the lock
/// (TTL 4 × the factory's, at least 3 s) and opens a fenced transaction under its fence, which
/// stays open and idle — a holder busy elsewhere, or frozen. Meanwhile, from another client:
/// - `try_acquire` answers within the allowance (ten uncontended round trips, at least 1 s):
///   "held", or a retryable error; never a grant while the holder's transaction is open;
/// - `acquire` with a 300 ms wait answers within 300 ms plus the allowance: `Timeout`, or the
///   retryable refusal of its last attempt.
///
/// Then the transaction ends, the holder releases, and the other client gets the lock within
/// the expiry bound. (Whether the holder can renew inside its own transaction is the store's
/// to document: SQLite, one writer at a time, cannot.)
///
/// [`FencedStoreFactory::hold_transaction`]: crate::FencedStoreFactory::hold_transaction
pub async fn waits_are_bounded_while_a_fenced_transaction_is_open<L: LockServiceFactory, S: FencedStoreFactory>(
    ctx: &Ctx,
    lf: &L,
    sf: &S,
) -> Outcome {
    let ns = Namespace::new();
    let k = key(ctx, &ns, "bounded-in-tx")?;
    let timing = lf.timing();
    let ttl = attempt!(ctx, Ttl::new((timing.ttl * 4).max(Duration::from_secs(3))), "ttl");
    let (holder, other) = (client(ctx, lf).await?, client(ctx, lf).await?);

    let (_, allowed) = measured_allowance(ctx, &*other, &key(ctx, &ns, "round-trip")?, ttl).await?;

    let Some(grant) = attempt!(ctx, holder.try_acquire(&k, ttl).await, "the holder's try_acquire") else {
        return Err(ctx.fail("a fresh key was reported busy"));
    };
    let Some(fence) = grant.fence_if_any() else {
        attempt!(ctx, holder.release(&grant).await, "release");
        ctx.refusal_checked("unfenced service: no fenced transaction to open");
        return Ok(ctx.report());
    };
    let held = match sf.hold_transaction(&k, palisade_core::GrantFence::new(fence, grant.grant_id())).await {
        Ok(held) => held,
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            attempt!(ctx, holder.release(&grant).await, "release");
            ctx.not_applicable(format!("the store holds no transaction of its own: {e}"));
            return Ok(ctx.report());
        }
        Err(e) => return Err(ctx.fail(format!("the store factory could not open a fenced transaction: {e}"))),
    };

    let started = Instant::now();
    let tried = tokio::time::timeout(ttl.get(), other.try_acquire(&k, ttl)).await;
    let took = started.elapsed();
    let Ok(tried) = tried else {
        return Err(ctx.fail(format!(
            "try_acquire while the holder's fenced transaction was open did not answer within the TTL ({ttl:?})"
        )));
    };
    match &tried {
        Ok(None) => {}
        Err(e) if e.is_retryable() => ctx.note(format!("try_acquire meanwhile: {e}")),
        Ok(Some(_)) => return Err(ctx.fail("granted while the holder held the lock with a fenced transaction open")),
        Err(e) => return Err(ctx.fail(format!("try_acquire while a fenced transaction was open: {e}"))),
    }
    ensure!(
        ctx,
        took <= allowed,
        "try_acquire while the holder's fenced transaction was open took {took:?}, allowed {allowed:?}: it waited for the transaction"
    );

    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let waited = tokio::time::timeout(ttl.get(), other.acquire(&k, ttl, wait)).await;
    let took = started.elapsed();
    let Ok(waited) = waited else {
        return Err(ctx.fail(format!(
            "acquire with a {wait:?} wait while a fenced transaction was open did not answer within the TTL: it ignored its wait"
        )));
    };
    ensure!(
        ctx,
        took <= wait + allowed,
        "acquire with a {wait:?} wait while a fenced transaction was open took {took:?}, allowed {:?}: it ignored its wait",
        wait + allowed
    );
    match &waited {
        Err(e) if e.kind() == ErrorKind::Timeout => {}
        // The last attempt's own refusal (a store busy with the transaction) may stand for
        // the timeout: it says why the wait ran out.
        Err(e) if e.is_retryable() => ctx.note(format!("acquire with a {wait:?} wait meanwhile: {e}")),
        other => {
            let kind = other.as_ref().err().map(|e| e.kind());
            return Err(ctx.fail(format!("acquire with a {wait:?} wait on a held lock gave {kind:?}")));
        }
    }

    drop(held);
    attempt!(ctx, holder.release(&grant).await, "the holder's release after its transaction ended");
    let next = attempt!(ctx, other.acquire(&k, ttl, timing.expiry_bound()).await, "the lock after the release");
    attempt!(ctx, other.release(&next).await, "release");
    ctx.note(format!("allowance {:.0} ms", allowed.as_secs_f64() * 1e3));
    Ok(ctx.report())
}
