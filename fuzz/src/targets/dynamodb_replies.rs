//! DynamoDB's replies as the adapter decodes them: the input is an HTTP status and body for the
//! `TransactWriteItems` of a write batch, decoded by the SDK and then by the adapter (error
//! codes, cancellation reasons, the old fence item). A write is reported done only on a 2xx;
//! `StaleFence` or `DuplicateFence` only for a fenced write, and naming the fence presented; `Conflict` only for a
//! batch with a condition; an outcome left unknown is never called retryable; retries are
//! bounded. Never a panic.
//!
//! Input: byte 0 picks the status, byte 1 the batch and whether it is fenced, the rest is the
//! body (the seed corpus holds DynamoDB's own error bodies).

use std::sync::LazyLock;

use crate::dynamo::Harness;
use palisade_core::{ErrorKind, Fence, GrantFence, GrantId, WriteBatch, WriteOp};

const STATUSES: &[u16] = &[400, 200, 500, 503, 400, 413, 404, 204];

fn batches() -> Vec<WriteBatch> {
    vec![
        WriteBatch::new().put("k0", b"v".to_vec()),
        WriteBatch::new().create("k0", b"v".to_vec()),
        WriteBatch::new().check("k0", None).put("k0", b"v".to_vec()),
        WriteBatch::new().delete("k0").put("k1", b"w".to_vec()),
        WriteBatch::new().check("k0", Some(b"v".to_vec())).create("k1", b"w".to_vec()),
        WriteBatch::new(),
        WriteBatch::new().put("k0", b"v".to_vec()).check("k1", None).delete("k2"),
        WriteBatch::new().create("k0", b"v".to_vec()).create("k1", b"w".to_vec()),
    ]
}

static BATCHES: LazyLock<Vec<WriteBatch>> = LazyLock::new(batches);

/// One fuzz input: the bytes as they come.
pub fn run(data: &[u8]) {
    let [status, shape, body @ ..] = data else { return };
    let harness = Harness::get();
    let status = STATUSES[usize::from(*status) % STATUSES.len()];
    let fenced = shape & 1 == 1;
    let batch = &BATCHES[usize::from(shape >> 1) % BATCHES.len()];
    let fence = GrantFence::new(Fence::new(7), GrantId::from_bytes([7; 16]));

    let applied = harness.apply(status, body.to_vec(), batch, fenced.then_some(fence));
    let sent = harness.endpoint.requests().iter().filter(|(op, _)| op == "TransactWriteItems").count();
    assert!(sent <= 10, "{sent} attempts for one write");
    let conditional = batch.ops().iter().any(|op| matches!(op, WriteOp::Check { .. } | WriteOp::Create { .. }));
    match applied {
        Ok(()) => assert!((200..300).contains(&status) || sent == 0, "done on status {status}"),
        Err(e) => {
            assert_eq!(e.backend(), "dynamodb");
            match e.kind() {
                ErrorKind::StaleFence { .. } => {
                    assert!(fenced && status >= 300, "StaleFence for {status}, fenced: {fenced}: {e}");
                    if let Some((presented, _)) = e.stale_fence_details() {
                        assert_eq!(presented, fence.fence(), "{e}");
                    }
                }
                // The watermark item names this fence from another grant (rule 2).
                ErrorKind::DuplicateFence { fence: f } => {
                    assert!(fenced && status >= 300 && f == fence.fence(), "DuplicateFence for {status}: {e}")
                }
                ErrorKind::Conflict => assert!(conditional && status >= 300, "Conflict for {status}: {e}"),
                ErrorKind::OutcomeUnknown => assert!(!e.is_retryable(), "{e}"),
                ErrorKind::Unavailable | ErrorKind::Backend | ErrorKind::InvalidArgument | ErrorKind::InvalidConfig => {
                }
                other => panic!("a write failed as {other:?}: {e}"),
            }
        }
    }
}
