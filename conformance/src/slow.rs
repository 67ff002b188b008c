//! Scenarios over a slow service: every reply arrives late, every request is applied on time
//! (a loaded cluster, a slow fsync, a long way back). A client that answers each request
//! within its own patience, or resends it, must still come to the answer the first attempt
//! earned.

use std::time::Duration;

use palisade_core::{ErrorKind, Fencing, Grant, LockService, Ttl};
use tokio::time::Instant;

use crate::harness::{Ctx, Failure, Outcome};
use crate::lock::{client, faulty_client, key};
use crate::{FaultProxy, LockServiceFactory, Namespace, attempt, ensure};

/// How late every reply of the slow client arrives: longer than the one second after which
/// some clients resend an idempotent request, far shorter than their request timeouts.
pub const SLOW_REPLY: Duration = Duration::from_millis(1500);

/// When a grant runs out locally (its `requested_at` plus the TTL granted).
fn deadline<G: Fencing>(grant: &Grant<G>) -> Instant {
    grant.requested_at() + grant.ttl().get()
}

/// **Slow replies still complete** (issue 33, item 5). Through the factory's [fault
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
