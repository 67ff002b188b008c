//! Fenced store scenarios (8–10, and bad input).

use std::sync::Arc;

use palisade_core::{ErrorKind, Fence, FencedStore, FencedStoreExt, GrantFence, GrantId, Record, WriteBatch};

/// The grant these scenarios write as, when one grant is all they need.
const GRANT_A: GrantId = GrantId::from_bytes([0xa1; 16]);
/// Another grant, that the lock service (wrongly) gave a fence `GRANT_A` already holds.
const GRANT_B: GrantId = GrantId::from_bytes([0xb2; 16]);

/// `fence` as `GRANT_A` presents it.
fn gf(fence: u64) -> GrantFence {
    GrantFence::new(Fence::new(fence), GRANT_A)
}

/// A grant of its own for each fence (as a lock service issues them).
fn own_grant(fence: u64) -> GrantFence {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&fence.to_be_bytes());
    GrantFence::new(Fence::new(fence), GrantId::from_bytes(id))
}

use crate::harness::{Ctx, Failure, Outcome};
use crate::{FencedStoreFactory, Namespace, attempt, ensure};

pub(crate) async fn store_client<F: FencedStoreFactory>(ctx: &Ctx, factory: &F) -> Result<Arc<F::Store>, Failure> {
    factory.client().await.map_err(|e| ctx.fail(format!("factory could not make a store client: {e}")))
}

async fn snapshot<S: FencedStore + ?Sized>(
    ctx: &Ctx,
    store: &S,
    ns: &Namespace,
) -> Result<Vec<(String, Record)>, Failure> {
    store.list(&ns.record("")).await.map_err(|e| ctx.fail(format!("list: {e}")))
}

/// **8. Equal, higher, lower.** `FencedStore::apply`: a fence equal to the watermark is
/// accepted again and again from the grant that set it (one grant writes many times); a higher
/// one is accepted and raises the watermark; a lower one is refused with
/// `StaleFence { presented, current }`; an equal one from **another** grant is refused with
/// `DuplicateFence { fence }` and leaves the watermark with the first grant (fencing rule 2);
/// after every refusal each record of the namespace stays byte-for-byte what it was. Records
/// remember the fence that wrote them.
pub async fn equal_higher_lower<F: FencedStoreFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let store = store_client(ctx, factory).await?;
    let res = attempt!(ctx, ns.key("wm"), "key");
    let k = ns.record("value");
    ensure!(ctx, attempt!(ctx, store.watermark(&res).await, "watermark").is_none(), "a fresh resource has a watermark");
    for (i, bytes) in [vec![1u8, 2, 3], vec![4, 5, 6], vec![0, 255, 10, 13]].into_iter().enumerate() {
        attempt!(
            ctx,
            store.write_fenced(&res, gf(10), &WriteBatch::new().put(k.clone(), bytes.clone())).await,
            format!("equal fence write #{i}")
        );
        let got = attempt!(ctx, store.read(&k).await, "read");
        ensure!(
            ctx,
            got == Some(Record { value: bytes, fence: Some(Fence::new(10)) }),
            "write #{i} under the same fence did not land: {got:?}"
        );
    }
    attempt!(
        ctx,
        store.write_fenced(&res, gf(11), &WriteBatch::new().put(k.clone(), b"eleven".to_vec())).await,
        "higher fence"
    );
    let wm = attempt!(ctx, store.watermark(&res).await, "watermark");
    ensure!(ctx, wm == Some(Fence::new(11)), "watermark after fence 11 is {wm:?}");
    attempt!(
        ctx,
        store.write_fenced(&res, gf(11), &WriteBatch::new().put(ns.record("seed"), b"s".to_vec())).await,
        "seed record"
    );
    let before = snapshot(ctx, &*store, &ns).await?;
    let stale = WriteBatch::new()
        .put(k.clone(), b"stale".to_vec())
        .put(ns.record("other"), b"x".to_vec())
        .delete(ns.record("seed"));
    for presented in [10u64, 0, 1] {
        let err = store.write_fenced(&res, own_grant(presented), &stale).await.err();
        let kind = err.as_ref().map(|e| e.kind());
        let expected = ErrorKind::StaleFence { presented: Fence::new(presented), current: Fence::new(11) };
        ensure!(
            ctx,
            kind == Some(expected),
            "fence {presented} below watermark 11 gave {kind:?}, expected {expected:?}"
        );
        ensure!(ctx, err.is_some_and(|e| !e.is_retryable()), "StaleFence must not be retryable");
    }
    // Rule 2: the same fence from another grant means the lock service issued it twice.
    let err = store.write_fenced(&res, GrantFence::new(Fence::new(11), GRANT_B), &stale).await.err();
    let kind = err.as_ref().map(|e| e.kind());
    let expected = ErrorKind::DuplicateFence { fence: Fence::new(11) };
    ensure!(
        ctx,
        kind == Some(expected),
        "fence 11 from a second grant, after the first grant set watermark 11, gave {kind:?}, expected {expected:?}"
    );
    ensure!(ctx, err.is_some_and(|e| !e.is_retryable()), "DuplicateFence must not be retryable");
    let after = snapshot(ctx, &*store, &ns).await?;
    ensure!(ctx, before == after, "a refused write changed data: before {before:?}, after {after:?}");
    let wm = attempt!(ctx, store.watermark(&res).await, "watermark");
    ensure!(ctx, wm == Some(Fence::new(11)), "a refused write moved the watermark to {wm:?}");
    // The duplicate did not take the watermark over: the first grant still writes.
    attempt!(
        ctx,
        store.write_fenced(&res, gf(11), &WriteBatch::new().put(ns.record("seed"), b"s".to_vec())).await,
        "the first grant's next write with fence 11 (after another grant's duplicate was refused)"
    );
    // Watermarks are per resource.
    let other = attempt!(ctx, ns.key("wm-other"), "key");
    attempt!(ctx, store.write_fenced(&other, gf(1), &WriteBatch::new()).await, "another resource's first fence");
    Ok(ctx.report())
}

/// **9. Concurrent writers with interleaved fences.** 8 independent clients present fences
/// 1..=160 in a scrambled order, each write putting its fence as the value and creating a log
/// record. The final state equals applying only the writes whose fence was ≥ the watermark at
/// their time: the logged fences are exactly the accepted ones, every refusal names a higher
/// watermark, the highest fence is accepted and its value is the final one. No lost update.
pub async fn concurrent_interleaved_fences<F: FencedStoreFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    const N: u64 = 160;
    let ns = Namespace::new();
    let res = attempt!(ctx, ns.key("race"), "key");
    let order: Vec<u64> = (1..=N).map(|i| (i * 67) % N + 1).collect();
    let mut tasks = Vec::new();
    for chunk in order.chunks(20) {
        let store = store_client(ctx, factory).await?;
        let (ns, res, chunk) = (ns.clone(), res.clone(), chunk.to_vec());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for f in chunk {
                let batch = WriteBatch::new()
                    .put(ns.record("value"), f.to_string())
                    .create(ns.record(&format!("log/{f:05}")), vec![]);
                out.push((f, store.write_fenced(&res, gf(f), &batch).await));
            }
            out
        }));
    }
    let mut accepted = Vec::new();
    for t in tasks {
        for (f, result) in attempt!(ctx, t.await, "writer task") {
            match result {
                Ok(()) => accepted.push(f),
                Err(e) => {
                    let Some((presented, current)) = e.stale_fence_details() else {
                        return Err(ctx.fail(format!("fence {f}: unexpected error {e}")));
                    };
                    ensure!(
                        ctx,
                        presented == Fence::new(f) && current > presented,
                        "fence {f} refused with presented {presented}, current {current}"
                    );
                }
            }
        }
    }
    accepted.sort_unstable();
    let store = store_client(ctx, factory).await?;
    let logged: Vec<u64> = attempt!(ctx, store.list(&ns.record("log/")).await, "list")
        .iter()
        .filter_map(|(k, _)| k.rsplit('/').next().and_then(|n| n.parse().ok()))
        .collect();
    ensure!(ctx, logged == accepted, "accepted writes {accepted:?} but the log holds {logged:?}");
    ensure!(ctx, accepted.last() == Some(&N), "the highest fence {N} was not accepted");
    let value = attempt!(ctx, store.read(&ns.record("value")).await, "read");
    ensure!(
        ctx,
        value.as_ref().map(|r| r.value.as_slice()) == Some(N.to_string().as_bytes()),
        "final value {value:?} is not the highest fence's"
    );
    let wm = attempt!(ctx, store.watermark(&res).await, "watermark");
    ensure!(ctx, wm == Some(Fence::new(N)), "final watermark {wm:?}");
    ctx.note(format!("{} of {N} writes accepted", accepted.len()));
    Ok(ctx.report())
}

/// **10. Atomicity.** A fenced write of several operations applies all or nothing: when a
/// `Create` or `Check` fails (`Conflict`) nothing is written and the watermark does not move;
/// when the fence is stale (`StaleFence`) nothing is written; conditions see the state before
/// the batch (a `Check` and a `Put` of one key are a compare-and-swap); a batch that passes
/// applies every operation.
pub async fn atomicity<F: FencedStoreFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let store = store_client(ctx, factory).await?;
    let res = attempt!(ctx, ns.key("atomic"), "key");
    let (qty, done, audit) = (ns.record("qty"), ns.record("done/j1"), ns.record("audit/j1"));
    attempt!(
        ctx,
        store
            .write_fenced(
                &res,
                gf(5),
                &WriteBatch::new().put(qty.clone(), b"10".to_vec()).put(done.clone(), b"x".to_vec())
            )
            .await,
        "seed"
    );
    let before = snapshot(ctx, &*store, &ns).await?;

    let cases = [
        (
            "a Create of an existing record",
            WriteBatch::new()
                .put(qty.clone(), b"9".to_vec())
                .put(audit.clone(), b"a".to_vec())
                .create(done.clone(), b"y".to_vec()),
        ),
        (
            "a Check of a changed value",
            WriteBatch::new()
                .check(qty.clone(), Some(b"11".to_vec()))
                .put(qty.clone(), b"10".to_vec())
                .put(audit.clone(), b"a".to_vec()),
        ),
        (
            "a Check for absence of a present record",
            WriteBatch::new().delete(qty.clone()).check(done.clone(), None).put(audit.clone(), b"a".to_vec()),
        ),
    ];
    for (what, batch) in cases {
        let kind = store.write_fenced(&res, gf(6), &batch).await.err().map(|e| e.kind());
        ensure!(ctx, kind == Some(ErrorKind::Conflict), "{what} gave {kind:?}, expected Conflict");
        let after = snapshot(ctx, &*store, &ns).await?;
        ensure!(ctx, after == before, "{what} left a partial write: {after:?}");
        let wm = attempt!(ctx, store.watermark(&res).await, "watermark");
        ensure!(ctx, wm == Some(Fence::new(5)), "{what} moved the watermark to {wm:?}");
    }
    let stale =
        WriteBatch::new().put(qty.clone(), b"0".to_vec()).delete(done.clone()).put(audit.clone(), b"stale".to_vec());
    let kind = store.write_fenced(&res, gf(4), &stale).await.err().map(|e| e.kind());
    ensure!(ctx, matches!(kind, Some(ErrorKind::StaleFence { .. })), "a stale multi-operation write gave {kind:?}");
    ensure!(ctx, snapshot(ctx, &*store, &ns).await? == before, "a stale multi-operation write left a partial write");

    let good = WriteBatch::new()
        .check(qty.clone(), Some(b"10".to_vec()))
        .put(qty.clone(), b"9".to_vec())
        .create(audit.clone(), b"ok".to_vec())
        .delete(done.clone())
        .check(ns.record("never-written"), None);
    attempt!(ctx, store.write_fenced(&res, gf(6), &good).await, "a batch whose conditions hold");
    let got_qty = attempt!(ctx, store.read(&qty).await, "read");
    ensure!(
        ctx,
        got_qty == Some(Record { value: b"9".to_vec(), fence: Some(Fence::new(6)) }),
        "compare-and-swap result {got_qty:?}"
    );
    ensure!(ctx, attempt!(ctx, store.read(&audit).await, "read").is_some(), "Create did not apply");
    ensure!(ctx, attempt!(ctx, store.read(&done).await, "read").is_none(), "Delete did not apply");
    Ok(ctx.report())
}

/// **Store bad input.** Malformed record keys (`InvalidKey`), a key written twice in a batch,
/// too many operations, an oversized value and a fence above `Fence::MAX_STORABLE`
/// (`InvalidArgument`) are refused before anything is written. Unfenced writes ignore and keep
/// watermarks, and their records carry no fence.
pub async fn store_bad_input<F: FencedStoreFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let store = store_client(ctx, factory).await?;
    let res = attempt!(ctx, ns.key("bad"), "key");
    let k = ns.record("k");
    let too_many = (0..=WriteBatch::MAX_OPS).fold(WriteBatch::new(), |b, i| b.put(ns.record(&format!("m{i}")), vec![]));
    let cases = [
        ("an empty key", WriteBatch::new().put("", vec![]), ErrorKind::InvalidKey),
        ("a key with a newline", WriteBatch::new().put("a\nb", vec![]), ErrorKind::InvalidKey),
        ("a key written twice", WriteBatch::new().put(k.clone(), vec![]).delete(k.clone()), ErrorKind::InvalidArgument),
        ("too many operations", too_many, ErrorKind::InvalidArgument),
        (
            "an oversized value",
            WriteBatch::new().put(k.clone(), vec![7; palisade_core::MAX_RECORD_VALUE_LEN + 1]),
            ErrorKind::InvalidArgument,
        ),
    ];
    for (what, batch, expected) in cases {
        let kind = store.write_fenced(&res, gf(1), &batch).await.err().map(|e| e.kind());
        ensure!(ctx, kind == Some(expected), "{what} gave {kind:?}, expected {expected:?}");
    }
    let kind = store.write_fenced(&res, gf(u64::MAX), &WriteBatch::new()).await.err().map(|e| e.kind());
    ensure!(ctx, kind == Some(ErrorKind::InvalidArgument), "an unstorable fence gave {kind:?}");
    ensure!(ctx, snapshot(ctx, &*store, &ns).await?.is_empty(), "refused writes left records behind");
    ensure!(ctx, attempt!(ctx, store.watermark(&res).await, "watermark").is_none(), "refused writes set a watermark");
    let kind = store.read("").await.err().map(|e| e.kind());
    ensure!(ctx, kind == Some(ErrorKind::InvalidKey), "reading an empty key gave {kind:?}");

    attempt!(
        ctx,
        store.write_fenced(&res, gf(3), &WriteBatch::new().put(k.clone(), b"a".to_vec())).await,
        "fenced write"
    );
    attempt!(ctx, store.apply_unfenced(&WriteBatch::new().put(k.clone(), b"b".to_vec())).await, "unfenced write");
    let got = attempt!(ctx, store.read(&k).await, "read");
    ensure!(ctx, got == Some(Record { value: b"b".to_vec(), fence: None }), "unfenced write result {got:?}");
    let wm = attempt!(ctx, store.watermark(&res).await, "watermark");
    ensure!(ctx, wm == Some(Fence::new(3)), "an unfenced write moved the watermark to {wm:?}");
    Ok(ctx.report())
}
