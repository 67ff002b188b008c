//! Election scenarios: [`palisade_core::Election`] on a fenced lock service and a store,
//! stamped by [`certify!`](macro@crate::certify) for every fenced lock service.

use std::sync::Arc;
use std::time::Duration;

use palisade_core::{Election, ErrorKind, Fence, Fenced, FencedStore, LockService};

use crate::harness::{Ctx, Outcome};
use crate::lock::{client, key, patience};
use crate::store::store_client;
use crate::{FencedStoreFactory, LockServiceFactory, Namespace, attempt, ensure};

/// What the frozen leader reports from its own runtime.
struct Frozen {
    term: Fence,
    late_proclaim: palisade_core::Result<()>,
    lost: bool,
}

/// **One leader; a frozen leader is deposed and refused.** Leader A campaigns on a runtime of
/// its own, proclaims, and stays leader past several TTLs (its heartbeat renews): B's campaign
/// with a short wait times out. Then A's whole runtime freezes (blocked, as a GC pause or a
/// SIGSTOP stops every thread). B campaigns and leads, once A's lead ran out, with a higher
/// term, and proclaims; observers see B's term. A thaws: its lost signal has fired, and its proclaim is
/// refused with `StaleFence`; the record still names B.
pub async fn election_frozen_leader_is_deposed<L, S>(ctx: &Ctx, lf: &L, sf: &S) -> Outcome
where
    L: LockServiceFactory,
    L::Service: LockService<Fencing = Fenced>,
    S: FencedStoreFactory,
{
    let ns = Namespace::new();
    let election_key = key(ctx, &ns, "election")?;
    let timing = lf.timing();
    let store = store_client(ctx, sf).await?;
    let b = Election::new(client(ctx, lf).await?, election_key.clone(), timing.ttl);
    let (elected_tx, elected_rx) = std::sync::mpsc::channel::<Result<Fence, String>>();
    let (freeze_tx, freeze_rx) = std::sync::mpsc::channel::<()>();
    let (thaw_tx, thaw_rx) = std::sync::mpsc::channel::<()>();
    let wait = patience(timing.ttl);

    // B and the observer run on this runtime's workers while A runs on a thread of its own.
    let b_side = {
        let (b, store) = (b.clone(), Arc::clone(&store));
        tokio::spawn(async move {
            let a_term = match tokio::task::spawn_blocking(move || elected_rx.recv()).await {
                Ok(Ok(Ok(term))) => term,
                Ok(Ok(Err(e))) => return Err(format!("A's campaign or proclaim: {e}")),
                _ => return Err("A's thread ended before it led".to_string()),
            };
            // A leads past several TTLs: its heartbeat renews.
            let early = b.campaign(timing.ttl * 3).await;
            if early.as_ref().err().map(palisade_core::Error::kind) != Some(ErrorKind::Timeout) {
                return Err(format!(
                    "B's campaign while A leads and renews gave {:?}, expected Timeout",
                    early.as_ref().map(palisade_core::Leadership::term)
                ));
            }
            let _ = freeze_tx.send(());
            let leader_b = b.campaign(wait).await.map_err(|e| format!("B's campaign after A froze: {e}"))?;
            if leader_b.term() <= a_term {
                return Err(format!("B's term {} is not above A's {a_term}", leader_b.term()));
            }
            leader_b.proclaim(&*store, "B").await.map_err(|e| format!("B's proclaim: {e}"))?;
            let mut observed = b.observe(Arc::clone(&store), Duration::from_millis(10));
            let seen = tokio::time::timeout(wait, observed.wait_for(|o| o.as_ref().is_some_and(|o| o.value == b"B")))
                .await
                .ok()
                .and_then(Result::ok)
                .map(|o| o.clone());
            let _ = thaw_tx.send(());
            if seen.as_ref().and_then(|o| o.as_ref().map(|o| o.term)) != Some(leader_b.term()) {
                return Err(format!("observers saw {seen:?}"));
            }
            Ok((a_term, leader_b))
        })
    };

    // A: its client, its election and its leadership all live on a runtime of its own (a
    // session's keep-alive too), so that blocking that runtime freezes A and nothing else, as
    // a GC pause or a SIGSTOP freezes a whole process.
    let a_store = Arc::clone(&store);
    let frozen = std::thread::scope(|scope| {
        let a = scope.spawn(move || -> Result<Frozen, String> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("a runtime for A: {e}"))?;
            runtime.block_on(async move {
                let elected = async {
                    let svc = lf.client().await?;
                    let leader = Election::new(svc, election_key, timing.ttl).campaign(wait).await?;
                    leader.proclaim(&*a_store, "A").await?;
                    Ok::<_, palisade_core::Error>(leader)
                }
                .await;
                let leader = match elected {
                    Ok(leader) => leader,
                    Err(e) => {
                        let _ = elected_tx.send(Err(e.to_string()));
                        return Err(e.to_string());
                    }
                };
                let _ = elected_tx.send(Ok(leader.term()));
                // Lead until told to freeze (the heartbeat renews meanwhile).
                while freeze_rx.try_recv().is_err_and(|e| e == std::sync::mpsc::TryRecvError::Empty) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                // The whole runtime stops (no heartbeat, no renewal, no keep-alive) until B
                // leads and proclaims.
                let _ = thaw_rx.recv();
                tokio::task::yield_now().await;
                let late_proclaim = leader.proclaim(&*a_store, "A-late").await;
                Ok(Frozen { term: leader.term(), late_proclaim, lost: leader.is_lost() })
            })
        });
        a.join().map_err(|_| "A's thread panicked".to_string()).and_then(|r| r)
    });
    let (a_term, leader_b) = match b_side.await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return Err(ctx.fail(e)),
        Err(e) => return Err(ctx.fail(format!("B's task panicked: {e}"))),
    };
    let frozen = frozen.map_err(|e| ctx.fail(format!("A failed: {e}")))?;
    ensure!(ctx, frozen.term == a_term, "A's term changed");
    ensure!(ctx, frozen.lost, "the frozen leader's lost signal had not fired when it thawed");
    ensure!(
        ctx,
        frozen.late_proclaim.as_ref().err().and_then(palisade_core::Error::stale_fence_details).is_some(),
        "the deposed leader's proclaim gave {:?}, expected StaleFence",
        frozen.late_proclaim
    );
    let record = attempt!(ctx, store.read(&b.record()).await, "read");
    ensure!(ctx, record.as_ref().map(|r| r.value.as_slice()) == Some(b"B"), "the leader record is {record:?}");
    attempt!(ctx, leader_b.resign().await, "B resigns");
    Ok(ctx.report())
}
