//! Liveness scenarios of a lock service: a lock that is safe can still be stuck. Each bounds
//! how long an operation may take, or checks that a recovery leaves the holder able to go on.
//! They run in the lock service registry (`lock_service_suite!`).

use std::time::Duration;

use palisade_core::{ErrorKind, Fence, LockService, REGRESSION_GAP, Ttl};
use tokio::time::Instant;

use crate::harness::{Ctx, Outcome};
use crate::lock::{client, key};
use crate::{LockServiceFactory, Namespace, attempt, ensure};

/// The allowance for "answers at once": a few round trips, scaled from this client's own
/// uncontended round trip (`round_trip`, an acquire plus a release), and never under a second
/// (two cores shared by clients, servers and other scenarios).
fn allowance(round_trip: Duration) -> Duration {
    (round_trip * 10).max(Duration::from_secs(1))
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
        ctx.note("unfenced service: no counter to repair");
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

    // This client's round trip, uncontended (the second of two: connections are warm).
    let mut round_trip = Duration::ZERO;
    for _ in 0..2 {
        let started = Instant::now();
        let Some(g) = attempt!(ctx, waiter.try_acquire(&k, ttl).await, "uncontended try_acquire") else {
            return Err(ctx.fail("a fresh key was reported busy"));
        };
        attempt!(ctx, waiter.release(&g).await, "release");
        round_trip = started.elapsed();
    }
    let allowed = allowance(round_trip);

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
