//! The coordination primitives' holders as real processes frozen with `SIGSTOP`: a permit
//! holder, a reader, a writer and a leader, stamped by
//! [`certify!`](macro@crate::certify) for every fenced lock service with a store other processes reach.
//!
//! Each scenario re-executes the test binary as the holder (as [`e2e::paused_holder_process`](
//! crate::e2e::paused_holder_process) does for a mutex): the holder takes its primitive and
//! says its fence; the parent freezes it with `SIGSTOP` past its TTL, lets a contender in
//! (whose entry or write outranks the holder), thaws it with `SIGCONT` and tells it to act.
//! The thawed holder's fenced action is refused with `StaleFence { its fence, the contender's }`,
//! its lost signal had fired, and the data shows the contender's work only.

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use palisade_core::{
    Election, Fence, Fenced, FencedStore, FencedStoreExt, Leadership, Lease, LockOptions, LockService, ReadLease,
    RwLock, Semaphore, WriteBatch,
};
use tokio::io::AsyncBufReadExt;

use crate::child::{self, HolderProcess, say};
use crate::e2e::relay_for;
use crate::harness::{Ctx, Outcome};
use crate::lock::{KeptAlive, client, key, patience};
use crate::relay::Relay;
use crate::store::store_client;
use crate::{FencedStoreFactory, LockServiceFactory, Namespace, Timing, attempt, ensure};

/// What the frozen process holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    Permit,
    Reader,
    Writer,
    Leader,
}

/// Permits of the semaphore, readers of the read-write lock.
const COUNT: u32 = 2;

/// **A permit holder frozen with SIGSTOP.** A semaphore of 2 permits; the parent's X holds
/// one (renewing it), the holder process the other. Frozen past its TTL, the holder loses its
/// slot to B (a higher fence on the same slot), who writes; thawed, the holder's write under its
/// permit is refused with `StaleFence`.
pub async fn semaphore_permit_holder_sigstop<L, S>(ctx: &Ctx, lf: &L, sf: &S) -> Outcome
where
    L: LockServiceFactory,
    L::Service: LockService<Fencing = Fenced>,
    S: FencedStoreFactory,
{
    frozen(ctx, lf, sf, Held::Permit).await
}

/// **A reader frozen with SIGSTOP.** The holder process enters a read-write lock as a reader;
/// frozen past its TTL, it is drained by writer B, who enters and writes; thawed, the reader's
/// [`check`](palisade_core::ReadLease::check) is refused with `StaleFence`.
pub async fn rwlock_reader_sigstop<L, S>(ctx: &Ctx, lf: &L, sf: &S) -> Outcome
where
    L: LockServiceFactory,
    L::Service: LockService<Fencing = Fenced>,
    S: FencedStoreFactory,
{
    frozen(ctx, lf, sf, Held::Reader).await
}

/// **A writer frozen with SIGSTOP.** The holder process enters a read-write lock as the
/// writer; frozen past its TTL, a reader B enters (nobody writes data); thawed, the writer's
/// write is refused with `StaleFence` by B's generation alone, and nothing of it lands.
pub async fn rwlock_writer_sigstop<L, S>(ctx: &Ctx, lf: &L, sf: &S) -> Outcome
where
    L: LockServiceFactory,
    L::Service: LockService<Fencing = Fenced>,
    S: FencedStoreFactory,
{
    frozen(ctx, lf, sf, Held::Writer).await
}

/// **A leader frozen with SIGSTOP.** The holder process campaigns, leads and proclaims; frozen
/// past its TTL (its heartbeat frozen with it), it is deposed by B, who leads with a higher
/// term and proclaims; thawed, the old leader's proclaim is refused with `StaleFence` and the
/// record names B.
pub async fn election_leader_sigstop<L, S>(ctx: &Ctx, lf: &L, sf: &S) -> Outcome
where
    L: LockServiceFactory,
    L::Service: LockService<Fencing = Fenced>,
    S: FencedStoreFactory,
{
    frozen(ctx, lf, sf, Held::Leader).await
}

/// The parent's side of every frozen-holder scenario.
async fn frozen<L, S>(ctx: &Ctx, lf: &L, sf: &S, held: Held) -> Outcome
where
    L: LockServiceFactory,
    L::Service: LockService<Fencing = Fenced>,
    S: FencedStoreFactory,
{
    if let Some(role) = child::role() {
        ensure!(ctx, role.scenario == ctx.scenario(), "child started for `{}`", role.scenario);
        let store = store_client(ctx, sf).await?;
        let svc = crate::e2e::child_service(ctx, lf, &role).await?;
        hold(svc, store, &role.namespace, lf.timing(), held).await;
        return Ok(ctx.report());
    }
    let ns = Namespace::new();
    let key = key(ctx, &ns, "frozen")?;
    let timing = lf.timing();
    let relay = relay_for(ctx, lf).await?;
    let store = store_client(ctx, sf).await?;
    let dyn_store: Arc<dyn FencedStore> = store.clone();
    let b = client(ctx, lf).await?;
    let data = ns.record("data");
    let wait = patience(timing.ttl);

    // X, for the semaphore: it holds the other permit throughout, renewing it.
    let x = match held {
        Held::Permit => {
            let sem = attempt!(ctx, Semaphore::new(client(ctx, lf).await?, key.clone(), COUNT), "semaphore");
            let permit = attempt!(ctx, sem.acquire(LockOptions::ttl(wait * 2).wait(wait)).await, "X's permit");
            Some(KeptAlive::new(permit, timing.ttl / 4))
        }
        _ => None,
    };
    let mut holder = HolderProcess::spawn(ctx, &ns, relay.as_ref().map(Relay::addr)).await?;
    let said = holder.expect(ctx, "acquired", Duration::from_secs(120)).await?;
    let fa = Fence::new(attempt!(ctx, said.parse::<u64>(), format!("the holder's fence `{said}`")));
    holder.signal(ctx, Signal::SIGSTOP)?;
    tokio::time::sleep(timing.expiry_bound()).await;
    let contender = LockOptions::ttl(timing.ttl * 4).wait(wait);
    let (fb, b_holds): (Fence, Option<Lease<L::Service>>) = match held {
        Held::Permit => {
            let sem = attempt!(ctx, Semaphore::new(b, key.clone(), COUNT), "semaphore");
            let permit = attempt!(ctx, sem.acquire(contender).await, "B's permit while the holder is frozen");
            if let Some(x) = &x {
                ensure!(ctx, permit.key() != x.lease().key(), "B took X's slot {}", permit.key());
            }
            attempt!(ctx, store.write(&permit, &WriteBatch::new().put(data.clone(), b"B".to_vec())).await, "B's write");
            (permit.fence(), Some(permit))
        }
        Held::Writer => {
            let rw = attempt!(ctx, RwLock::new(b, Arc::clone(&dyn_store), key.clone(), COUNT), "rwlock");
            let reader = attempt!(ctx, rw.read(contender).await, "B reads while the writer is frozen");
            let generation = reader.generation();
            attempt!(ctx, reader.release().await, "B leaves");
            (generation, None)
        }
        Held::Reader => {
            let rw = attempt!(ctx, RwLock::new(b, Arc::clone(&dyn_store), key.clone(), COUNT), "rwlock");
            let writer = attempt!(ctx, rw.write(contender).await, "B writes while the reader is frozen");
            attempt!(ctx, store.write(&writer, &WriteBatch::new().put(data.clone(), b"B".to_vec())).await, "B's write");
            (writer.fence(), Some(writer))
        }
        Held::Leader => {
            let leader = attempt!(
                ctx,
                Election::new(b, key.clone(), timing.ttl).campaign(wait).await,
                "B's campaign while the leader is frozen"
            );
            attempt!(ctx, leader.proclaim(&*store, "B").await, "B's proclaim");
            let term = leader.term();
            attempt!(ctx, leader.resign().await, "B resigns");
            (term, None)
        }
    };
    holder.signal(ctx, Signal::SIGCONT)?;
    holder.tell(ctx, "act").await?;
    let acted = holder.expect(ctx, "acted", Duration::from_secs(30)).await?;
    let status = holder.wait(ctx).await?;
    ensure!(ctx, status.success(), "the holder process failed: {status}");
    ensure!(ctx, fb > fa, "the contender's fence {fb} is not above the frozen holder's {fa}");
    let expected = format!("stale {fa} {fb} lost=true");
    ensure!(ctx, acted == expected, "the thawed {held:?} reported `{acted}`, expected `{expected}`");
    let (record, expected_value): (String, Option<&[u8]>) = match held {
        Held::Permit | Held::Reader => (data, Some(b"B")),
        Held::Writer => (data, None),
        Held::Leader => (Election::new(client(ctx, lf).await?, key, timing.ttl).record(), Some(b"B")),
    };
    let found = attempt!(ctx, store.read(&record).await, "read");
    ensure!(
        ctx,
        found.as_ref().map(|r| r.value.as_slice()) == expected_value,
        "{record} after the thawed {held:?} acted: {found:?}"
    );
    if let Some(lease) = b_holds {
        let _ = lease.release().await;
    }
    if let Some(x) = x {
        ensure!(ctx, !x.lease().is_lost(), "X's renewed permit was lost");
        x.end().await;
    }
    Ok(ctx.report())
}

/// What the holder process holds.
enum Holding<L: LockService<Fencing = Fenced> + ?Sized> {
    Lease(Lease<L>),
    Reader(ReadLease<L>),
    Leader(Leadership<L>),
}

/// The holder process: take the primitive, say `acquired FENCE`, wait for `act`, act (a write
/// under the lease, a reader's check, a leader's proclaim), say `acted ok|stale P C|error KIND
/// lost=BOOL`.
async fn hold<L, S>(svc: Arc<L>, store: Arc<S>, ns: &Namespace, timing: Timing, held: Held)
where
    L: LockService<Fencing = Fenced> + ?Sized,
    S: FencedStore,
{
    let Ok(key) = ns.key("frozen") else { return say("error key") };
    let options = LockOptions::ttl(timing.ttl).wait(Duration::from_secs(30));
    let dyn_store: Arc<dyn FencedStore> = store.clone();
    let taken = match held {
        Held::Permit => match Semaphore::new(svc, key, COUNT) {
            Ok(sem) => sem.acquire(options).await.map(Holding::Lease),
            Err(e) => Err(e),
        },
        Held::Writer | Held::Reader => match RwLock::new(svc, dyn_store, key, COUNT) {
            Ok(rw) if held == Held::Writer => rw.write(options).await.map(Holding::Lease),
            Ok(rw) => rw.read(options).await.map(Holding::Reader),
            Err(e) => Err(e),
        },
        Held::Leader => match Election::new(svc, key, timing.ttl).campaign(options.wait).await {
            Ok(leader) => leader.proclaim(&*store, "A").await.map(|()| Holding::Leader(leader)),
            Err(e) => Err(e),
        },
    };
    let holding = match taken {
        Ok(holding) => holding,
        Err(e) => return say(&format!("error acquire {e}")),
    };
    let (fence, lost) = match &holding {
        Holding::Lease(l) => (l.fence(), l.lost_token()),
        Holding::Reader(r) => (r.generation(), r.slot().lost_token()),
        Holding::Leader(l) => (l.term(), l.lease().lost_token()),
    };
    say(&format!("acquired {fence}"));
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    match stdin.next_line().await {
        Ok(Some(line)) if line == "act" => {}
        _ => return,
    }
    // Give the watchdog, which woke up together with us, a moment to fire.
    let lost = tokio::time::timeout(Duration::from_millis(100), lost.cancelled()).await.is_ok();
    let data = WriteBatch::new().put(ns.record("data"), b"A".to_vec());
    let result = match &holding {
        Holding::Lease(lease) => store.write(lease, &data).await,
        Holding::Reader(reader) => reader.check().await,
        Holding::Leader(leader) => leader.proclaim(&*store, "A-late").await,
    };
    let outcome = match result {
        Ok(()) => "ok".to_string(),
        Err(e) => match e.stale_fence_details() {
            Some((p, c)) => format!("stale {p} {c}"),
            None => format!("error {}", e.kind().as_str()),
        },
    };
    say(&format!("acted {outcome} lost={lost}"));
}
