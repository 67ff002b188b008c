//! Fenced store scenarios (8–10, bad input, and the store-side classes of the catalogue).

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
    let store = factory.client().await.map_err(|e| ctx.fail(format!("factory could not make a store client: {e}")))?;
    ctx.saw_store(store.backend());
    Ok(store)
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
        store.write_fenced(&res, gf(11), &WriteBatch::new().put(ns.record("existing"), b"s".to_vec())).await,
        "the existing record"
    );
    let before = snapshot(ctx, &*store, &ns).await?;
    let stale = WriteBatch::new()
        .put(k.clone(), b"stale".to_vec())
        .put(ns.record("other"), b"x".to_vec())
        .delete(ns.record("existing"));
    for presented in [10u64, 1] {
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
        store.write_fenced(&res, gf(11), &WriteBatch::new().put(ns.record("existing"), b"s".to_vec())).await,
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
        "the first stock"
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

/// **Stale batches of every shape.** A stale fence is refused whatever the batch holds, not
/// only batches that start with a `Put`: Delete-only, Create-only, Check-only (a check that
/// holds), mixed, and empty batches presenting a fence below the watermark are
/// `StaleFence`, and the same shapes presenting the watermark's fence from another grant are
/// `DuplicateFence`; none of them changes a record or the watermark.
/// (`FencedStore::apply`: "If the fence is lower than the resource's watermark, nothing is
/// written"; "an equal fence … from any other grant is refused".)
pub async fn stale_batches_of_every_shape<F: FencedStoreFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let store = store_client(ctx, factory).await?;
    let res = attempt!(ctx, ns.key("shapes"), "key");
    let (a, b) = (ns.record("a"), ns.record("b"));
    attempt!(
        ctx,
        store
            .write_fenced(&res, gf(5), &WriteBatch::new().put(a.clone(), b"A".to_vec()).put(b.clone(), b"B".to_vec()))
            .await,
        "the existing record under fence 5"
    );
    let before = snapshot(ctx, &*store, &ns).await?;
    let shapes = [
        ("Delete-only", WriteBatch::new().delete(a.clone())),
        ("Create-only", WriteBatch::new().create(ns.record("new"), b"N".to_vec())),
        ("Check-only (a check that holds)", WriteBatch::new().check(a.clone(), Some(b"A".to_vec()))),
        ("Check for absence only", WriteBatch::new().check(ns.record("absent"), None)),
        ("Delete and Create", WriteBatch::new().delete(b.clone()).create(ns.record("new"), b"N".to_vec())),
        ("empty", WriteBatch::new()),
    ];
    let duplicate = GrantFence::new(Fence::new(5), GRANT_B);
    for (what, batch) in &shapes {
        for (presented, expected) in [
            (gf(4), ErrorKind::StaleFence { presented: Fence::new(4), current: Fence::new(5) }),
            (duplicate, ErrorKind::DuplicateFence { fence: Fence::new(5) }),
        ] {
            let kind = store.write_fenced(&res, presented, batch).await.err().map(|e| e.kind());
            ensure!(
                ctx,
                kind == Some(expected),
                "a {what} batch under {presented} gave {kind:?}, expected {expected:?}"
            );
            let after = snapshot(ctx, &*store, &ns).await?;
            ensure!(ctx, after == before, "a refused {what} batch under {presented} changed data: {after:?}");
            let wm = attempt!(ctx, store.watermark(&res).await, "watermark");
            ensure!(ctx, wm == Some(Fence::new(5)), "a refused {what} batch moved the watermark to {wm:?}");
        }
    }
    Ok(ctx.report())
}

/// **The comparison matrix.** Against a watermark `w` set by grant A: `w − 1` is refused from
/// A and from B (`StaleFence`); `w` is accepted from A again and refused from B
/// (`DuplicateFence`); `w + 1` is accepted from B and then belongs to B (A's `w + 1` becomes the
/// duplicate). The watermark never decreases and never changes on a refusal, and fence 0 (never
/// issued) is `InvalidArgument`. (`FencedStore::apply`, fencing rule 2.)
pub async fn fence_comparison_matrix<F: FencedStoreFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let store = store_client(ctx, factory).await?;
    let res = attempt!(ctx, ns.key("matrix"), "key");
    let k = ns.record("v");
    let a = |f: u64| GrantFence::new(Fence::new(f), GRANT_A);
    let b = |f: u64| GrantFence::new(Fence::new(f), GRANT_B);
    let stale = |p: u64, c: u64| Err(ErrorKind::StaleFence { presented: Fence::new(p), current: Fence::new(c) });
    let dup = |f: u64| Err(ErrorKind::DuplicateFence { fence: Fence::new(f) });
    // (presented, expected outcome, watermark after)
    let steps: [(GrantFence, Result<(), ErrorKind>, u64); 10] = [
        (a(20), Ok(()), 20),
        (a(19), stale(19, 20), 20),
        (b(19), stale(19, 20), 20),
        (a(20), Ok(()), 20),
        (b(20), dup(20), 20),
        (b(21), Ok(()), 21),
        (a(21), dup(21), 21),
        (b(21), Ok(()), 21),
        (a(20), stale(20, 21), 21),
        (a(22), Ok(()), 22),
    ];
    let mut last_wm = 0;
    for (i, (presented, expected, wm_after)) in steps.into_iter().enumerate() {
        let value = format!("step {i}");
        let got = store.write_fenced(&res, presented, &WriteBatch::new().put(k.clone(), value.clone())).await;
        let kind = got.as_ref().map(|_| ()).map_err(|e| e.kind());
        ensure!(ctx, kind == expected, "step {i}: {presented} gave {kind:?}, expected {expected:?}");
        let wm = attempt!(ctx, store.watermark(&res).await, "watermark").map_or(0, Fence::get);
        ensure!(ctx, wm == wm_after, "step {i}: watermark {wm} after {presented}, expected {wm_after}");
        ensure!(ctx, wm >= last_wm, "step {i}: the watermark went down from {last_wm} to {wm}");
        last_wm = wm;
        let record = attempt!(ctx, store.read(&k).await, "read");
        if expected.is_ok() {
            ensure!(
                ctx,
                record.as_ref().is_some_and(|r| r.value == value.as_bytes() && r.fence == Some(presented.fence())),
                "step {i}: an accepted write is not what the record holds: {record:?}"
            );
        } else {
            ensure!(
                ctx,
                record.as_ref().is_some_and(|r| r.value != value.as_bytes()),
                "step {i}: a refused write landed: {record:?}"
            );
        }
    }
    let other = attempt!(ctx, ns.key("matrix-zero"), "key");
    let kind = store
        .write_fenced(&other, a(0), &WriteBatch::new().put(ns.record("zero"), vec![]))
        .await
        .err()
        .map(|e| e.kind());
    ensure!(
        ctx,
        kind == Some(ErrorKind::InvalidArgument),
        "fence 0 (never issued) gave {kind:?}, expected InvalidArgument"
    );
    ensure!(ctx, attempt!(ctx, store.watermark(&other).await, "watermark").is_none(), "fence 0 set a watermark");
    Ok(ctx.report())
}

/// **Watermark scope.** Watermarks are per resource: after `r1` accepted fence 10, `r2` (and
/// `r1-x`, whose name starts with `r1`'s) still accept fence 3, and each reads back its own. A
/// new client of the same store (what a restarted process gets from the factory) still refuses
/// `r1`'s stale fence and reads the same watermarks: they live in the store, not in a client.
/// (`FencedStore`: "the fence watermark is kept per `ResourceKey`".)
pub async fn watermark_scope<F: FencedStoreFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let store = store_client(ctx, factory).await?;
    let (r1, r2, r1x) =
        (attempt!(ctx, ns.key("r1"), "key"), attempt!(ctx, ns.key("r2"), "key"), attempt!(ctx, ns.key("r1-x"), "key"));
    attempt!(
        ctx,
        store.write_fenced(&r1, gf(10), &WriteBatch::new().put(ns.record("r1"), b"10".to_vec())).await,
        "r1 at 10"
    );
    for (name, res) in [("r2", &r2), ("r1-x", &r1x)] {
        attempt!(
            ctx,
            store.write_fenced(res, own_grant(3), &WriteBatch::new().put(ns.record(name), b"3".to_vec())).await,
            format!("{name} at 3 after r1 accepted 10 (watermarks are per resource)")
        );
    }
    let fresh = store_client(ctx, factory).await?;
    for (client, label) in [(&store, "the same client"), (&fresh, "a new client")] {
        for (res, want) in [(&r1, 10), (&r2, 3), (&r1x, 3)] {
            let wm = attempt!(ctx, client.watermark(res).await, "watermark");
            ensure!(ctx, wm == Some(Fence::new(want)), "{label} reads {res}'s watermark as {wm:?}, expected {want}");
        }
    }
    let kind = fresh
        .write_fenced(&r1, own_grant(9), &WriteBatch::new().put(ns.record("r1"), b"9".to_vec()))
        .await
        .err()
        .map(|e| e.kind());
    ensure!(
        ctx,
        matches!(kind, Some(ErrorKind::StaleFence { .. })),
        "a new client accepted fence 9 on r1 (watermark 10): {kind:?}; the watermark must live in the store"
    );
    Ok(ctx.report())
}

/// **Reading many records.** `read_many` answers each key as `read` does, in the order asked:
/// a fenced record, an unfenced one, a missing one and a key asked twice; an invalid key
/// among them is `InvalidKey`. (`FencedStore::read_many`: "one answer per key, in the
/// order of `keys`".)
pub async fn read_many_answers_like_read<F: FencedStoreFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let store = store_client(ctx, factory).await?;
    let res = attempt!(ctx, ns.key("rm"), "key");
    let (a, b, missing) = (ns.record("z-last"), ns.record("a-first"), ns.record("missing"));
    attempt!(
        ctx,
        store.write_fenced(&res, gf(4), &WriteBatch::new().put(a.clone(), b"A".to_vec())).await,
        "fenced write"
    );
    attempt!(ctx, store.apply_unfenced(&WriteBatch::new().put(b.clone(), b"B".to_vec())).await, "unfenced write");
    let keys = [a.as_str(), missing.as_str(), b.as_str(), a.as_str()];
    let many = attempt!(ctx, store.read_many(&keys).await, "read_many");
    ensure!(ctx, many.len() == keys.len(), "read_many gave {} answers for {} keys", many.len(), keys.len());
    for (key, got) in keys.iter().zip(&many) {
        let one = attempt!(ctx, store.read(key).await, "read");
        ensure!(ctx, *got == one, "read_many answered {key} with {got:?}, read with {one:?}: not in the order asked");
    }
    ensure!(ctx, many[0].as_ref().and_then(|r| r.fence) == Some(Fence::new(4)), "the fenced record lost its fence");
    let bad = store.read_many(&[a.as_str(), "bad key\u{0}"]).await.err().map(|e| e.kind());
    ensure!(ctx, bad == Some(ErrorKind::InvalidKey), "an invalid key among many: {bad:?}, expected InvalidKey");
    Ok(ctx.report())
}

/// **The store race.** Two writers, each with its own client, present fences `t1 < t2` for one
/// resource at the same moment, round after round. Whatever the interleaving, the check and
/// the write are one atomic step: after each round the record holds `t2`'s value and the
/// watermark is `t2`; `t1` is accepted only if it landed first (then `t2` overwrote it) and is
/// otherwise `StaleFence`. A store that reads the watermark and writes in a second step lets
/// `t1` land after `t2`. (Fencing rule 1.)
pub async fn store_race<F: FencedStoreFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    const ROUNDS: u64 = 40;
    let ns = Namespace::new();
    let res = attempt!(ctx, ns.key("race2"), "key");
    let k = ns.record("v");
    let (low, high) = (store_client(ctx, factory).await?, store_client(ctx, factory).await?);
    let (mut low_accepted, mut low_refused) = (0, 0);
    for round in 0..ROUNDS {
        let (t1, t2) = (own_grant(2 * round + 1), own_grant(2 * round + 2));
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let write = |store: Arc<F::Store>, fence: GrantFence, barrier: Arc<tokio::sync::Barrier>| {
            let (res, batch) = (res.clone(), WriteBatch::new().put(k.clone(), fence.fence().to_string()));
            tokio::spawn(async move {
                barrier.wait().await;
                store.write_fenced(&res, fence, &batch).await
            })
        };
        // Either writer may start first: alternate, so a two-step store meets both orders.
        let (r1, r2) = if round % 2 == 0 {
            let first = write(Arc::clone(&low), t1, Arc::clone(&barrier));
            let second = write(Arc::clone(&high), t2, barrier);
            (attempt!(ctx, first.await, "writer task"), attempt!(ctx, second.await, "writer task"))
        } else {
            let first = write(Arc::clone(&high), t2, Arc::clone(&barrier));
            let second = write(Arc::clone(&low), t1, barrier);
            let r2 = attempt!(ctx, first.await, "writer task");
            (attempt!(ctx, second.await, "writer task"), r2)
        };
        attempt!(ctx, r2, format!("round {round}: the higher fence {t2}"));
        match r1 {
            Ok(()) => low_accepted += 1,
            Err(e) if matches!(e.kind(), ErrorKind::StaleFence { .. }) => low_refused += 1,
            Err(e) => return Err(ctx.fail(format!("round {round}: the lower fence {t1}: unexpected error {e}"))),
        }
        let got = attempt!(ctx, low.read(&k).await, "read");
        ensure!(
            ctx,
            got.as_ref().map(|r| r.value.as_slice()) == Some(t2.fence().to_string().as_bytes()),
            "round {round}: the record holds {got:?} after fences {t1} and {t2} raced: the lower one landed after the higher (check and write are not one step)"
        );
        let wm = attempt!(ctx, high.watermark(&res).await, "watermark");
        ensure!(ctx, wm == Some(t2.fence()), "round {round}: watermark {wm:?} after {t2} was accepted");
    }
    ctx.note(format!(
        "{ROUNDS} rounds: the lower fence landed first {low_accepted} times, refused {low_refused} times"
    ));
    Ok(ctx.report())
}

/// **Multi-resource writes are all or nothing.** [`FencedStore::apply_all`]: one fence per
/// resource, judged for **every** resource. A stale member (here the second in canonical order,
/// so a store that judges only the first lets it through) refuses the whole write with
/// `StaleFence`, naming that member in `Error::resource`, with no record written and no
/// watermark raised; an equal fence from another grant on any member is `DuplicateFence`;
/// a failed condition is `Conflict` with nothing changed; a write whose fences all pass
/// raises every watermark and writes every record (each remembering the last resource's fence
/// in canonical order). No fence, a resource twice, or fence 0 is `InvalidArgument`. Two writers
/// of overlapping sets, given in opposite orders, run 20 rounds each concurrently: every write
/// answers (accepted or `StaleFence`) and the two watermarks always end equal.
pub async fn multi_write_all_or_nothing<F: FencedStoreFactory>(ctx: &Ctx, factory: &F) -> Outcome {
    let ns = Namespace::new();
    let store = store_client(ctx, factory).await?;
    let (a, b, c) = (
        attempt!(ctx, ns.key("multi-a"), "key"),
        attempt!(ctx, ns.key("multi-b"), "key"),
        attempt!(ctx, ns.key("multi-c"), "key"),
    );
    let (ra, rb, rc) = (ns.record("multi/a"), ns.record("multi/b"), ns.record("multi/c"));
    attempt!(ctx, store.write_fenced(&a, gf(10), &WriteBatch::new().put(ra.clone(), b"a10".to_vec())).await, "a at 10");
    attempt!(ctx, store.write_fenced(&b, gf(10), &WriteBatch::new().put(rb.clone(), b"b10".to_vec())).await, "b at 10");
    // A newer holder of b wrote: b's watermark is 30.
    attempt!(ctx, store.write_fenced(&b, own_grant(30), &WriteBatch::new()).await, "b at 30");
    let before = snapshot(ctx, &*store, &ns).await?;
    let transfer = |x: &[u8]| {
        WriteBatch::new()
            .put(ra.clone(), [b"a", x].concat())
            .put(rb.clone(), [b"b", x].concat())
            .put(rc.clone(), [b"c", x].concat())
    };
    let watermarks = |store: Arc<F::Store>| {
        let (a, b, c) = (a.clone(), b.clone(), c.clone());
        async move {
            Ok::<_, palisade_core::Error>([
                store.watermark(&a).await?,
                store.watermark(&b).await?,
                store.watermark(&c).await?,
            ])
        }
    };
    let marks_before = attempt!(ctx, watermarks(Arc::clone(&store)).await, "watermarks");

    // Given out of order on purpose: the store sorts them.
    let stale = [(c.clone(), gf(5)), (b.clone(), gf(10)), (a.clone(), gf(11))];
    let err = store.write_all_fenced(&stale, &transfer(b"stale")).await.err();
    let kind = err.as_ref().map(palisade_core::Error::kind);
    ensure!(
        ctx,
        kind == Some(ErrorKind::StaleFence { presented: Fence::new(10), current: Fence::new(30) }),
        "a multi-write with one stale member (b: fence 10, watermark 30) gave {kind:?}, expected StaleFence 10 < 30"
    );
    let named = err.as_ref().and_then(palisade_core::Error::resource);
    ensure!(ctx, named == Some(&b), "the refusal of the stale member names {named:?}, expected {b}");
    ensure!(ctx, snapshot(ctx, &*store, &ns).await? == before, "a multi-write with a stale member wrote records");
    let marks = attempt!(ctx, watermarks(Arc::clone(&store)).await, "watermarks");
    ensure!(
        ctx,
        marks == marks_before,
        "a multi-write with a stale member moved watermarks: {marks_before:?} → {marks:?}"
    );

    let duplicate = [(a.clone(), GrantFence::new(Fence::new(10), GRANT_B)), (b.clone(), own_grant(31))];
    let err = store.write_all_fenced(&duplicate, &transfer(b"dup")).await.err();
    let kind = err.as_ref().map(palisade_core::Error::kind);
    ensure!(
        ctx,
        kind == Some(ErrorKind::DuplicateFence { fence: Fence::new(10) }),
        "a multi-write whose member a presents fence 10 from another grant gave {kind:?}, expected DuplicateFence"
    );
    ensure!(ctx, err.as_ref().and_then(palisade_core::Error::resource) == Some(&a), "the duplicate does not name {a}");
    ensure!(ctx, snapshot(ctx, &*store, &ns).await? == before, "a refused duplicate wrote records");

    let conflict = WriteBatch::new()
        .put(ra.clone(), b"a-conflict".to_vec())
        .create(rb.clone(), b"exists".to_vec())
        .put(rc.clone(), b"c-conflict".to_vec());
    let kind = store
        .write_all_fenced(&[(a.clone(), gf(12)), (b.clone(), own_grant(31))], &conflict)
        .await
        .err()
        .map(|e| e.kind());
    ensure!(
        ctx,
        kind == Some(ErrorKind::Conflict),
        "a multi-write with a failed Create gave {kind:?}, expected Conflict"
    );
    ensure!(ctx, snapshot(ctx, &*store, &ns).await? == before, "a multi-write with a failed condition wrote records");
    let marks = attempt!(ctx, watermarks(Arc::clone(&store)).await, "watermarks");
    ensure!(ctx, marks == marks_before, "a multi-write with a failed condition moved watermarks to {marks:?}");

    let good = [(c.clone(), gf(5)), (a.clone(), gf(12)), (b.clone(), own_grant(31))];
    attempt!(ctx, store.write_all_fenced(&good, &transfer(b"ok")).await, "a multi-write whose fences all pass");
    let marks = attempt!(ctx, watermarks(Arc::clone(&store)).await, "watermarks");
    ensure!(
        ctx,
        marks == [Some(Fence::new(12)), Some(Fence::new(31)), Some(Fence::new(5))],
        "after an accepted multi-write the watermarks are {marks:?}, expected [12, 31, 5]"
    );
    let got = attempt!(ctx, store.read_many(&[&ra, &rb, &rc]).await, "read_many");
    let expected = [(b"aok", 5), (b"bok", 5), (b"cok", 5)]
        .map(|(v, f)| Some(Record { value: v.to_vec(), fence: Some(Fence::new(f)) }));
    ensure!(
        ctx,
        got == expected,
        "an accepted multi-write left {got:?}, expected {expected:?} (records carry c's fence, the last in canonical order)"
    );

    for (what, fences) in [
        ("no fence", vec![]),
        ("a resource twice", vec![(a.clone(), gf(13)), (a.clone(), gf(14))]),
        ("fence 0", vec![(a.clone(), gf(13)), (b.clone(), gf(0))]),
    ] {
        let kind = store.write_all_fenced(&fences, &transfer(b"bad")).await.err().map(|e| e.kind());
        ensure!(
            ctx,
            kind == Some(ErrorKind::InvalidArgument),
            "a multi-write with {what} gave {kind:?}, expected InvalidArgument"
        );
    }

    // Overlapping sets from two writers, each given in its own order.
    let (x, y) = (attempt!(ctx, ns.key("multi-x"), "key"), attempt!(ctx, ns.key("multi-y"), "key"));
    let writer = |first: bool| {
        let (store, x, y, rx) = (Arc::clone(&store), x.clone(), y.clone(), ns.record("multi/x"));
        tokio::spawn(async move {
            let mut answers = Vec::new();
            for round in 0..20u64 {
                let fence = own_grant(100 + 2 * round + u64::from(first));
                let fences = if first {
                    [(x.clone(), fence), (y.clone(), fence)]
                } else {
                    [(y.clone(), fence), (x.clone(), fence)]
                };
                let batch = WriteBatch::new().put(rx.clone(), fence.fence().get().to_string().into_bytes());
                answers.push(store.write_all_fenced(&fences, &batch).await.err().map(|e| e.kind()));
            }
            answers
        })
    };
    let (one, two) = (writer(true), writer(false));
    let (one, two) = (attempt!(ctx, one.await, "writer"), attempt!(ctx, two.await, "writer"));
    for kind in one.iter().chain(&two) {
        ensure!(
            ctx,
            kind.is_none() || matches!(kind, Some(ErrorKind::StaleFence { .. })),
            "a concurrent multi-write over overlapping sets answered {kind:?}, expected success or StaleFence"
        );
    }
    let (wx, wy) =
        (attempt!(ctx, store.watermark(&x).await, "watermark"), attempt!(ctx, store.watermark(&y).await, "watermark"));
    ensure!(
        ctx,
        wx == wy && wx.is_some(),
        "two resources always written together ended at watermarks {wx:?} and {wy:?}"
    );
    let accepted = one.iter().chain(&two).filter(|k| k.is_none()).count();
    ctx.note(format!("40 concurrent multi-writes over overlapping sets: {accepted} accepted, watermarks both {wx:?}"));
    Ok(ctx.report())
}
