//! Write batches in each store's format, and what each store makes of them.
//!
//! - PostgreSQL: the apply function's arrays (kind, key, value) decode back to the batch, by
//!   the function's table of kinds.
//! - DynamoDB: the `TransactWriteItems` request the adapter sends through the SDK holds one
//!   item per operation, in order (a check of a key the batch writes folded into that write's
//!   condition), each with its record key and value as given; an invalid batch sends nothing.
//! - SQLite: see `sqlite_batches`.

use std::collections::HashSet;

use crate::dynamo::Harness;
use crate::{OpSpec, batch, checks, grant_fence};
use arbitrary::Arbitrary;
use palisade_core::{GrantFence, MAX_RECORD_VALUE_LEN, WriteBatch, WriteOp};
use serde_json::Value;

/// One batch: unfenced (`None`), or under [`grant_fence`]'s fence and grant.
#[derive(Arbitrary, Debug)]
struct Step {
    ops: Vec<OpSpec>,
    fenced: Option<(u8, u8)>,
}

/// PostgreSQL: kinds 1 put, 2 create, 3 delete, 4 check for a value, 5 check for absence.
fn postgres(batch: &WriteBatch) {
    let (kinds, keys, values) = palisade_postgres::fuzzing::encode_ops(batch.ops());
    assert!(kinds.len() == batch.len() && keys.len() == batch.len() && values.len() == batch.len());
    for (i, op) in batch.ops().iter().enumerate() {
        let (key, value) = (keys[i].to_string(), values[i].to_vec());
        let decoded = match kinds[i] {
            1 => WriteOp::Put { key, value },
            2 => WriteOp::Create { key, value },
            3 if value.is_empty() => WriteOp::Delete { key },
            4 => WriteOp::Check { key, expected: Some(value) },
            5 if value.is_empty() => WriteOp::Check { key, expected: None },
            kind => panic!("op {i} encoded as kind {kind} with {} value bytes", value.len()),
        };
        assert_eq!(&decoded, op, "op {i}");
    }
}

fn text<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, p| v.get(p))?.as_str()
}

/// DynamoDB: the request as the SDK put it on the wire.
fn dynamodb(batch: &WriteBatch, fence: Option<GrantFence>) {
    let harness = Harness::get();
    let applied = harness.apply(200, b"{}".to_vec(), batch, fence);
    let requests = harness.endpoint.requests();
    if batch.validate().is_err() {
        assert!(applied.is_err() && requests.is_empty(), "an invalid batch was sent: {requests:?}");
        return;
    }
    assert!(applied.is_ok(), "{applied:?}");
    let written: HashSet<&str> =
        batch.ops().iter().filter(|op| !matches!(op, WriteOp::Check { .. })).map(WriteOp::key).collect();
    let checked: HashSet<&str> =
        batch.ops().iter().filter(|op| matches!(op, WriteOp::Check { .. })).map(WriteOp::key).collect();
    let expected: Vec<&WriteOp> =
        batch.ops().iter().filter(|op| !(matches!(op, WriteOp::Check { .. }) && written.contains(op.key()))).collect();
    if expected.is_empty() && fence.is_none() {
        assert!(requests.is_empty(), "an empty unfenced batch was sent");
        return;
    }
    let [(operation, body)] = requests.as_slice() else { panic!("{} requests for one batch", requests.len()) };
    assert_eq!(operation, "TransactWriteItems");
    let body: Value = serde_json::from_slice(body).unwrap_or_else(|e| panic!("request body: {e}"));
    let items = body.get("TransactItems").and_then(Value::as_array).cloned().unwrap_or_default();
    let records: Vec<&Value> = items
        .iter()
        .filter(|item| {
            ["Put", "Delete", "ConditionCheck", "Update"].iter().any(|kind| {
                text(item, &[kind, "Item", "pk", "S"])
                    .or_else(|| text(item, &[kind, "Key", "pk", "S"]))
                    .is_some_and(|pk| pk.starts_with("rec#"))
            })
        })
        .collect();
    assert_eq!(records.len(), expected.len(), "{body}");
    assert_eq!(items.len() - records.len(), usize::from(fence.is_some()), "the fence item: {body}");
    for (item, op) in records.iter().zip(&expected) {
        let pk = format!("rec#{}", op.key());
        let condition = |kind: &str| text(item, &[kind, "ConditionExpression"]);
        match op {
            WriteOp::Put { value, .. } | WriteOp::Create { value, .. } => {
                assert_eq!(text(item, &["Put", "Item", "pk", "S"]), Some(pk.as_str()), "{item}");
                let stored = text(item, &["Put", "Item", "value", "B"]).unwrap_or_default();
                assert_eq!(stored, aws_smithy_types::base64::encode(value), "{item}");
                if matches!(op, WriteOp::Create { .. }) {
                    assert!(condition("Put").is_some_and(|c| c.contains("attribute_not_exists")), "{item}");
                }
                if checked.contains(op.key()) {
                    assert!(condition("Put").is_some(), "a checked put without its condition: {item}");
                }
            }
            WriteOp::Delete { .. } => {
                assert_eq!(text(item, &["Delete", "Key", "pk", "S"]), Some(pk.as_str()), "{item}");
                if checked.contains(op.key()) {
                    assert!(condition("Delete").is_some(), "a checked delete without its condition: {item}");
                }
            }
            WriteOp::Check { .. } => {
                assert_eq!(text(item, &["ConditionCheck", "Key", "pk", "S"]), Some(pk.as_str()), "{item}");
                assert!(condition("ConditionCheck").is_some(), "{item}");
            }
        }
    }
}

/// One fuzz input, decoded as libFuzzer's typed targets decode theirs ([`crate::decode`]).
pub fn run(data: &[u8]) {
    let Some(steps) = crate::decode::<Vec<Step>>(data) else { return };
    for step in steps.iter().take(4) {
        let batch = batch(&step.ops);
        if let Err(why) = checks::batch_validation(&batch, MAX_RECORD_VALUE_LEN) {
            panic!("{why}");
        }
        postgres(&batch);
        dynamodb(&batch, grant_fence(step.fenced));
    }
}
