//! Several locks held as one ([`LockServiceExt::lock_all`]) and the write that fences every
//! one of them ([`FencedStore::apply_all`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use palisade_core::{
    AllOrNone, Deployment, ErrorKind, FencedStore, FencedStoreExt, GrantFence, LockOptions, LockService,
    LockServiceExt, MultiAcquire, MultiLease, ResourceKey, Ttl, WriteBatch,
};
use tokio::time::Instant;

use crate::harness::{Ctx, Outcome};
use crate::lock::{client, faulty_client, free_within, key, patience};
use crate::store::store_client;
use crate::{FencedStoreFactory, LockServiceFactory, Namespace, attempt, ensure};

/// Each member's resource and fence with its grant, or `None` for an unfenced service.
fn fences_if_any<S: LockService + ?Sized>(locks: &MultiLease<S>) -> Option<Vec<(ResourceKey, GrantFence)>> {
    locks
        .leases()
        .iter()
        .map(|lease| Some((lease.key().clone(), GrantFence::new(lease.fence_if_any()?, lease.grant().grant_id()))))
        .collect()
}

/// **Overlapping sets never deadlock.** Six clients take `lock_all` over three of five keys
/// each (client `i` over keys `i`, `i+1`, `i+2`, mod 5), handed over in an order of the
/// client's own (reversed for every other client), eight rounds each, holding each set a few
/// milliseconds. Every round is granted within its wait (no `Timeout`: nobody holds one key
/// while waiting for another's), no key is ever held by two sets at once, and the whole run
/// ends within a bound derived from the factory's TTL. Then a set whose later member is held
/// for three TTLs: the member taken first is kept alive meanwhile (another client's `try_lock`
/// of it is refused) and the set is granted whole once the later member is released.
pub async fn overlapping_lock_sets_never_deadlock<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    const CLIENTS: usize = 6;
    const KEYS: usize = 5;
    const ROUNDS: usize = 8;
    let ns = Namespace::new();
    let keys: Vec<ResourceKey> = (0..KEYS).map(|i| key(ctx, &ns, &format!("set-{i}"))).collect::<Result<_, _>>()?;
    let ttl = factory.timing().ttl;
    let wait = patience(ttl);
    let held: Arc<Vec<AtomicUsize>> = Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
    let overlaps = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let svc = client(ctx, factory).await?;
        let mut set: Vec<usize> = (0..3).map(|j| (c + j) % KEYS).collect();
        if c % 2 == 1 {
            set.reverse();
        }
        let given: Vec<ResourceKey> = set.iter().map(|&i| keys[i].clone()).collect();
        let (held, overlaps) = (Arc::clone(&held), Arc::clone(&overlaps));
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let locks = svc.lock_all(&given, LockOptions::ttl(ttl).wait(wait)).await?;
                for &i in &set {
                    if held[i].fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
                for &i in &set {
                    held[i].fetch_sub(1, Ordering::SeqCst);
                }
                locks.release().await?;
            }
            Ok::<_, palisade_core::Error>(())
        }));
    }
    let bound = wait * 2;
    for task in tasks {
        let left = bound.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, task).await {
            Err(_) => {
                return Err(ctx.fail(format!(
                    "{CLIENTS} clients taking overlapping sets of 3 of {KEYS} keys did not finish {ROUNDS} rounds \
                     within {bound:?}: a deadlock (or a wait that ignores its bound)"
                )));
            }
            Ok(Err(e)) => return Err(ctx.fail(format!("a client task panicked: {e}"))),
            Ok(Ok(Err(e))) if e.kind() == ErrorKind::Timeout => {
                return Err(ctx.fail(format!(
                    "lock_all over an overlapping set answered Timeout after its {wait:?} wait: clients holding one \
                     key while waiting for another's ({e})"
                )));
            }
            Ok(Ok(Err(e))) => return Err(ctx.fail(format!("lock_all or release failed: {e}"))),
            Ok(Ok(Ok(()))) => {}
        }
    }
    let overlaps = overlaps.load(Ordering::SeqCst);
    ensure!(ctx, overlaps == 0, "{overlaps} times a key was held by two sets at once");

    // A set whose later member is held for three TTLs: the member taken first is kept alive
    // meanwhile (nobody else gets it), and the set is granted whole once the later one is free.
    let (first, later) = (key(ctx, &ns, "alive-a")?, key(ctx, &ns, "alive-b")?);
    let (svc, other) = (client(ctx, factory).await?, client(ctx, factory).await?);
    // The later member's holder keeps it (extending it: some services cap a grant's TTL).
    let blocker = attempt!(ctx, other.lock(&later, LockOptions::ttl(ttl)).await, "the later member's holder");
    let pair = [first.clone(), later.clone()];
    let waiting = svc.lock_all(&pair, LockOptions::ttl(ttl).wait(wait));
    let probe = {
        let (other, first) = (Arc::clone(&other), first.clone());
        tokio::spawn(async move {
            for _ in 0..9 {
                tokio::time::sleep(ttl / 3).await;
                blocker.extend(ttl).await?;
            }
            let probe = other.try_lock(&first, ttl).await;
            let _ = blocker.release().await;
            probe
        })
    };
    // Judged as soon as it is granted: a set is a TTL's worth of locks, not more.
    let set = attempt!(ctx, waiting.await, "lock_all whose later member came free after three TTLs");
    let lost: Vec<String> = set
        .leases()
        .iter()
        .filter(|lease| lease.is_lost())
        .map(|lease| format!("{} ({:?} left)", lease.key(), lease.time_left()))
        .collect();
    ensure!(ctx, lost.is_empty(), "the set granted after the wait was already lost: member {}", lost.join(", "));
    attempt!(ctx, set.release().await, "release of the set granted after the wait");
    let probe = attempt!(
        ctx,
        attempt!(ctx, probe.await, "the probe task"),
        "another client's try_lock of the first member (or the blocker's extend)"
    );
    ensure!(
        ctx,
        probe.is_none(),
        "while lock_all waited three TTLs for its later member, another client took the member it had taken first \
         (it expired: lock_all did not keep it alive)"
    );
    ctx.note(format!(
        "{} sets of 3 keys taken and released by {CLIENTS} clients in {:?}",
        CLIENTS * ROUNDS,
        started.elapsed()
    ));
    Ok(ctx.report())
}

/// **`lock_all` leaves nothing behind.** A set whose last member is held answers `Timeout`
/// within its wait (zero: one attempt; 300 ms), and the members it took before are free at once
/// for another client, not at their TTL. Then, through the factory's fault proxy, the reply of
/// each of the set's first eight requests is lost in turn: whatever `lock_all` answers, no
/// member is left held by nobody (every key free well before its TTL after a failure, or after
/// the returned set's release) and a returned set is the only holder of its keys.
pub async fn lock_all_leaves_no_orphan<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let timing = factory.timing();
    let long = timing.ttl * 5;
    let ttl = attempt!(ctx, Ttl::new(long), "ttl");
    let prompt = long / 2;
    let (svc, other) = (client(ctx, factory).await?, client(ctx, factory).await?);
    let set = [key(ctx, &ns, "all-a")?, key(ctx, &ns, "all-b")?, key(ctx, &ns, "all-c")?];
    let blocker =
        attempt!(ctx, other.lock(&set[2], LockOptions::ttl(long)).await, "the blocker's lock on the last member");
    for wait in [Duration::ZERO, Duration::from_millis(300)] {
        let started = Instant::now();
        let result = svc.lock_all(&set, LockOptions::ttl(long).wait(wait)).await;
        let took = started.elapsed();
        let kind = result.as_ref().err().map(palisade_core::Error::kind);
        ensure!(ctx, kind == Some(ErrorKind::Timeout), "lock_all with a held member and a {wait:?} wait gave {kind:?}");
        ensure!(
            ctx,
            took <= wait + timing.expiry_margin.max(Duration::from_secs(1)),
            "lock_all with a held member took {took:?} to answer its {wait:?} wait"
        );
        for member in &set[..2] {
            let got = attempt!(ctx, other.try_acquire(member, ttl).await, "try_acquire of a member lock_all gave up");
            let Some(got) = got else {
                return Err(ctx.fail(format!(
                    "after lock_all gave up ({wait:?} wait), member {member} it had taken is still held: an orphan \
                     until its TTL"
                )));
            };
            attempt!(ctx, other.release(&got).await, "another client's release of a member lock_all gave up");
        }
    }
    attempt!(ctx, blocker.release().await, "the blocker's release");

    let Some(faulty) = faulty_client(ctx, factory).await? else { return Ok(ctx.report()) };
    let fsvc = Arc::clone(&faulty.service);
    let mut outcomes = Vec::new();
    for skip in 0..8 {
        let set = [key(ctx, &ns, &format!("lost-{skip}-a"))?, key(ctx, &ns, &format!("lost-{skip}-b"))?];
        let before = faulty.lose_replies_to(skip);
        let result = fsvc.lock_all(&set, LockOptions::ttl(long)).await;
        faulty.disarm();
        if faulty.lost_since(before) == 0 {
            ensure!(ctx, skip > 0, "the fault proxy lost no reply: does the faulty client dial it?");
            if let Ok(locks) = result {
                attempt!(ctx, locks.release().await, "release of a set taken with no reply lost");
            }
            break;
        }
        match result {
            Ok(locks) => {
                for member in &set {
                    let probe = attempt!(ctx, other.try_acquire(member, ttl).await, "probe");
                    ensure!(
                        ctx,
                        probe.is_none(),
                        "lock_all returned the set after reply {skip} was lost, and another client got member {member} too"
                    );
                }
                // A release may meet the connection the lost reply cut: retried as the service allows.
                let released = locks.release().await;
                if let Err(e) = &released {
                    ctx.note(format!("release after reply {skip} was lost: {e}"));
                }
                outcomes.push(format!("reply {skip}: granted"));
            }
            Err(e) => outcomes.push(format!("reply {skip}: {}", e.kind())),
        }
        for member in &set {
            let next = attempt!(ctx, free_within(&*other, member, ttl, prompt).await, "try_acquire after the fault");
            let Some(next) = next else {
                return Err(ctx.fail(format!(
                    "after reply {skip} of lock_all was lost ({}), member {member} stayed held for {prompt:?} of its \
                     {long:?} TTL: an orphan",
                    outcomes.last().map_or("", String::as_str)
                )));
            };
            attempt!(ctx, other.release(&next).await, "another client's release of a member after the fault");
        }
    }
    ctx.note(outcomes.join("; "));
    Ok(ctx.report())
}

/// How many keys `a_set_is_taken_all_or_nothing` takes while it counts requests.
const SET_COUNTED: usize = 16;

/// How many requests a set taken in "one request" may send through the fault proxy: the
/// request, and what a client adds around it whatever the set's size (a pooled connection's
/// check, a statement prepared on a connection that had not used it, a protocol's control
/// frames). One request per key would be [`SET_COUNTED`].
const SET_OVERHEAD: usize = 5;

/// **A set is taken all or nothing** ([`LockService::try_acquire_all`]). With the third of
/// four keys held by another client, `try_acquire_all` answers `Held` with that key's index
/// and takes none of the others (another client gets each at once). Freed, the set is granted
/// whole: one grant per key at its index, each a new fence where the service issues fences,
/// and nobody else gets any member. A service that declares
/// [`MultiAcquire::OneRequest`](palisade_core::MultiAcquire::OneRequest) takes a free set of
/// sixteen keys in one request: through its factory's fault proxy, after the same set was taken
/// and released once (warm connections and keys), at most five requests are counted (the request and a client's constant
/// overhead; one per key would be sixteen).
pub async fn a_set_is_taken_all_or_nothing<F: LockServiceFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let long = factory.timing().ttl * 5;
    let ttl = attempt!(ctx, Ttl::new(long), "ttl");
    let (svc, other) = (client(ctx, factory).await?, client(ctx, factory).await?);
    let set: Vec<ResourceKey> = (0..4).map(|i| key(ctx, &ns, &format!("set-{i}"))).collect::<Result<_, _>>()?;
    let blocker = attempt!(ctx, other.try_acquire(&set[2], ttl).await, "the blocker's try_acquire");
    let Some(blocker) = blocker else { return Err(ctx.fail("a fresh key was held")) };
    let tried = attempt!(ctx, svc.try_acquire_all(&set, ttl).await, "try_acquire_all with a held member");
    match tried {
        AllOrNone::Held(i) => {
            ensure!(ctx, i == 2, "try_acquire_all named index {i} held; only {} (index 2) is", set[2]);
        }
        AllOrNone::Granted(grants) => {
            for grant in &grants {
                let _ = svc.release(grant).await;
            }
            return Err(ctx.fail(format!("try_acquire_all granted a set whose member {} another client holds", set[2])));
        }
        _ => return Err(ctx.fail("try_acquire_all answered an outcome this suite does not know")),
    }
    let mut before = Vec::new();
    for (i, member) in set.iter().enumerate().filter(|(i, _)| *i != 2) {
        let got = attempt!(ctx, other.try_acquire(member, ttl).await, "try_acquire of a member the set did not take");
        let Some(got) = got else {
            return Err(ctx.fail(format!(
                "try_acquire_all answered Held, but left member {member} (index {i}) held: not all or nothing"
            )));
        };
        before.push((i, got.fence_if_any()));
        attempt!(ctx, other.release(&got).await, "release");
    }
    before.push((2, blocker.fence_if_any()));
    attempt!(ctx, other.release(&blocker).await, "the blocker's release");
    let tried = attempt!(ctx, svc.try_acquire_all(&set, ttl).await, "try_acquire_all of a free set");
    let AllOrNone::Granted(grants) = tried else {
        return Err(ctx.fail("try_acquire_all of a set nobody holds did not grant it"));
    };
    ensure!(ctx, grants.len() == set.len(), "{} grants for a set of {}", grants.len(), set.len());
    for (i, grant) in grants.iter().enumerate() {
        ensure!(ctx, grant.key() == &set[i], "grant {i} is for {}, not {}", grant.key(), set[i]);
        if let Some((_, Some(earlier))) = before.iter().find(|(j, _)| *j == i) {
            let fence = grant.fence_if_any();
            ensure!(
                ctx,
                fence.is_some_and(|f| f > *earlier),
                "member {} was granted fence {fence:?}, not above the {earlier:?} granted before",
                set[i]
            );
        }
        let probe = attempt!(ctx, other.try_acquire(&set[i], ttl).await, "probe of a granted member");
        ensure!(ctx, probe.is_none(), "another client got member {} of a granted set", set[i]);
    }
    for grant in &grants {
        attempt!(ctx, svc.release(grant).await, "release of a member");
    }

    let caps = svc.capabilities();
    if caps.multi_acquire != MultiAcquire::OneRequest {
        return Ok(ctx.report());
    }
    // Counted through the fault proxy: a networked service must have one (the helper fails it
    // otherwise); one without a network is counted where its factory offers a relayed client.
    let faulty = if caps.deployment == Deployment::Network {
        faulty_client(ctx, factory).await?
    } else {
        factory.faulty_client().await.ok().filter(|c| !c.proxies.is_empty())
    };
    let Some(faulty) = faulty else {
        ctx.note("one request per set declared; not counted: no client behind a fault proxy, and no network");
        return Ok(ctx.report());
    };
    let fsvc = Arc::clone(&faulty.service);
    // Warm: the connections a first request opens, a statement prepared at its first use, and
    // the keys' first grant (a service may create a key's record apart) are not the set's.
    let many: Vec<ResourceKey> =
        (0..SET_COUNTED).map(|i| key(ctx, &ns, &format!("one-{i}"))).collect::<Result<_, _>>()?;
    if let AllOrNone::Granted(grants) = attempt!(ctx, fsvc.try_acquire_all(&many, ttl).await, "warm-up set") {
        for grant in &grants {
            attempt!(ctx, fsvc.release(grant).await, "warm-up release");
        }
    }
    let sent_before = faulty.requests();
    let tried = attempt!(ctx, fsvc.try_acquire_all(&many, ttl).await, "try_acquire_all of free keys");
    let sent = faulty.requests().saturating_sub(sent_before);
    let AllOrNone::Granted(grants) = tried else {
        return Err(ctx.fail("try_acquire_all of free keys did not grant them"));
    };
    for grant in &grants {
        attempt!(ctx, fsvc.release(grant).await, "release of a member");
    }
    ensure!(
        ctx,
        sent <= SET_OVERHEAD,
        "the service declares one request per set, but taking {SET_COUNTED} free keys sent {sent} requests"
    );
    ctx.note(format!("{SET_COUNTED} free keys taken in {sent} request(s)"));
    Ok(ctx.report())
}

/// **A paused member refuses the whole multi-write.** A holds `{x, y}` with `lock_all` and
/// pauses past the TTL; B takes `y` alone and writes it. A's write of both (a transfer: `x`
/// down, `y` up) with every member's fence is refused with `StaleFence`, naming `y` (a store
/// that [requires the live lock](FencedStore::requires_live_lock) may refuse it first with
/// `NotHolder` for `x`, whose lock expired with nobody after it), and
/// nothing of it lands (neither `x`'s record nor `y`'s); B's write stands, and A's set has
/// fired its lost signal. For a service without fences the documented outcome is asserted
/// instead: A's stale write goes through.
pub async fn paused_member_refuses_the_multi_write<L: LockServiceFactory, S: FencedStoreFactory>(
    ctx: &Ctx,
    lf: &L,
    sf: &S,
) -> Outcome {
    let ns = Namespace::new();
    let (x, y) = (key(ctx, &ns, "transfer-x")?, key(ctx, &ns, "transfer-y")?);
    let (rx, ry) = (ns.record("stock/x"), ns.record("stock/y"));
    let timing = lf.timing();
    let (a, b) = (client(ctx, lf).await?, client(ctx, lf).await?);
    let (store_a, store_b) = (store_client(ctx, sf).await?, store_client(ctx, sf).await?);
    let options = LockOptions::ttl(timing.ttl).wait(patience(timing.ttl));
    let set_a = attempt!(ctx, a.lock_all(&[y.clone(), x.clone()], options).await, "A's lock_all");
    let lost = set_a.lost();
    tokio::time::sleep(timing.expiry_bound()).await; // the pause
    let lease_b = attempt!(ctx, b.lock(&y, options).await, "B's lock of y after A's TTL");
    let batch_b = WriteBatch::new().put(ry.clone(), b"B".to_vec());
    match lease_b.fence_if_any() {
        Some(f) => attempt!(
            ctx,
            store_b.write_fenced(&y, GrantFence::new(f, lease_b.grant().grant_id()), &batch_b).await,
            "B's write"
        ),
        None => attempt!(ctx, store_b.apply_unfenced(&batch_b).await, "B's write"),
    }
    let transfer = WriteBatch::new().put(rx.clone(), b"A: x - 1".to_vec()).put(ry.clone(), b"A: y + 1".to_vec());
    match fences_if_any(&set_a) {
        Some(fences) => {
            let err = store_a.write_all_fenced(&fences, &transfer).await.err();
            let kind = err.as_ref().map(palisade_core::Error::kind);
            let named = err.as_ref().and_then(palisade_core::Error::resource);
            if store_a.requires_live_lock() && kind == Some(ErrorKind::NotHolder) {
                // A store that checks the live lock judges x first (canonical order): its lock
                // expired with nobody after it.
                ensure!(ctx, named == Some(&x), "A's refused transfer (NotHolder) names {named:?}, expected {x}");
            } else {
                ensure!(ctx, matches!(kind, Some(ErrorKind::StaleFence { .. })), "A's stale transfer gave {kind:?}");
                ensure!(
                    ctx,
                    named == Some(&y),
                    "A's refused transfer names {named:?}, expected the member B took ({y})"
                );
            }
            let got = attempt!(ctx, store_b.read_many(&[&rx, &ry]).await, "read");
            ensure!(ctx, got[0].is_none(), "A's refused transfer wrote x's record (half applied): {:?}", got[0]);
            ensure!(
                ctx,
                got[1].as_ref().map(|r| r.value.as_slice()) == Some(b"B"),
                "y's record after A's refused transfer: {:?}",
                got[1]
            );
            ensure!(
                ctx,
                tokio::time::timeout(Duration::from_secs(1), lost).await.is_ok(),
                "A's set did not fire its lost signal though a member was taken over"
            );
        }
        None => {
            attempt!(ctx, store_a.apply_unfenced(&transfer).await, "A's unfenced transfer");
            ctx.refusal_checked("no fence: the stale holder's transfer went through (documented: efficiency lock)");
        }
    }
    attempt!(ctx, lease_b.release().await, "B's release");
    drop(set_a);
    Ok(ctx.report())
}
