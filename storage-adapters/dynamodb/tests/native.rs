//! The single-item fenced helpers on the user's own items, and ambiguous outcomes, against a
//! real DynamoDB-API server (moto, `PALISADE_DYNAMODB_ENDPOINT`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::collections::HashMap;
use std::time::Duration;

use palisade_conformance::require_env;
use palisade_core::{ErrorKind, Fence, FencedStore, GrantFence, GrantId, ResourceKey, WatermarkSource, WriteBatch};
use palisade_dynamodb::aws_sdk_dynamodb::types::AttributeValue;
use palisade_dynamodb::{DynamoConfig, DynamoStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn config(table: &str) -> DynamoConfig {
    DynamoConfig {
        endpoint: Some(require_env("PALISADE_DYNAMODB_ENDPOINT")),
        region: Some("us-east-1".into()),
        ..DynamoConfig::new(format!("{table}-{}", std::process::id()))
    }
}

fn n(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

async fn qty(store: &DynamoStore, sku: &str) -> Option<(i64, Option<u64>)> {
    let got = store
        .client()
        .get_item()
        .table_name(&store.config().table)
        .key("pk", AttributeValue::S(sku.into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    let item = got.item()?;
    let num = |k: &str| match item.get(k) {
        Some(AttributeValue::N(v)) => v.parse::<i64>().ok(),
        _ => None,
    };
    Some((num("qty")?, num("fence").map(|f| f as u64)))
}

#[tokio::test]
async fn update_put_and_delete_of_your_own_items_are_fenced_in_one_request() {
    let store = DynamoStore::open(config("native")).await.unwrap();
    let table = store.config().table.clone();
    let decrement = |sku: &str| {
        store
            .client()
            .update_item()
            .table_name(&table)
            .key("pk", AttributeValue::S(sku.into()))
            .update_expression("SET qty = qty - :one")
            .condition_expression("qty >= :one")
            .expression_attribute_values(":one", n(1))
    };

    // An item without a fence yet: the first fenced put takes it.
    let put =
        store.client().put_item().table_name(&table).item("pk", AttributeValue::S("SKU-1".into())).item("qty", n(2));
    store.put_item_fenced(put, gf(5)).await.unwrap();
    assert_eq!(qty(&store, "SKU-1").await, Some((2, Some(5))));

    // Equal and higher fences pass; the item remembers the fence.
    store.update_item_fenced(decrement("SKU-1"), gf(5)).await.unwrap();
    store.update_item_fenced(decrement("SKU-1"), gf(7)).await.unwrap();
    assert_eq!(qty(&store, "SKU-1").await, Some((0, Some(7))));

    // The same fence from another grant: the lock service issued it twice (rule 2).
    let other = GrantFence::new(Fence::new(7), GrantId::from_bytes([0xb2; 16]));
    let err = store.update_item_fenced(decrement("SKU-1"), other).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DuplicateFence { fence: Fence::new(7) }, "{err:?}");
    let put =
        store.client().put_item().table_name(&table).item("pk", AttributeValue::S("SKU-1".into())).item("qty", n(50));
    assert_eq!(
        store.put_item_fenced(put, other).await.unwrap_err().kind(),
        ErrorKind::DuplicateFence { fence: Fence::new(7) }
    );
    let delete = store.client().delete_item().table_name(&table).key("pk", AttributeValue::S("SKU-1".into()));
    assert_eq!(
        store.delete_item_fenced(delete, other).await.unwrap_err().kind(),
        ErrorKind::DuplicateFence { fence: Fence::new(7) }
    );
    assert_eq!(qty(&store, "SKU-1").await, Some((0, Some(7))), "the duplicates changed nothing");
    // `lock_checked` reads the item's fence through `item_watermark` (the helpers never raise
    // the store's watermark).
    let item = |sku: &str| HashMap::from([("pk".to_string(), AttributeValue::S(sku.into()))]);
    let resource = ResourceKey::new("native", "SKU-1").unwrap();
    assert_eq!(
        store.item_watermark(&table, item("SKU-1")).highest_fence(&resource).await.unwrap(),
        Some(Fence::new(7))
    );
    assert_eq!(store.item_watermark(&table, item("NOPE")).highest_fence(&resource).await.unwrap(), None);
    assert_eq!(store.watermark(&resource).await.unwrap(), None, "the store's own watermark never saw them");

    // A lower fence is StaleFence with the item's fence, and changes nothing.
    let err = store.update_item_fenced(decrement("SKU-1"), gf(6)).await.unwrap_err();
    assert_eq!(err.stale_fence_details(), Some((Fence::new(6), Fence::new(7))), "{err:?}");
    // Your own condition failing (stock 0) with a good fence is Conflict, not StaleFence.
    let err = store.update_item_fenced(decrement("SKU-1"), gf(8)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err:?}");
    assert_eq!(qty(&store, "SKU-1").await, Some((0, Some(7))), "nothing changed");

    // A stale put and a stale delete are refused too.
    let put =
        store.client().put_item().table_name(&table).item("pk", AttributeValue::S("SKU-1".into())).item("qty", n(99));
    assert!(store.put_item_fenced(put, gf(3)).await.unwrap_err().stale_fence_details().is_some());
    let delete = store.client().delete_item().table_name(&table).key("pk", AttributeValue::S("SKU-1".into()));
    assert!(store.delete_item_fenced(delete, gf(3)).await.unwrap_err().stale_fence_details().is_some());
    assert_eq!(qty(&store, "SKU-1").await, Some((0, Some(7))));
    let delete = store.client().delete_item().table_name(&table).key("pk", AttributeValue::S("SKU-1".into()));
    store.delete_item_fenced(delete, gf(7)).await.unwrap();
    assert_eq!(qty(&store, "SKU-1").await, None);

    // A fence above what the store can hold is refused before any request.
    let err = store.update_item_fenced(decrement("SKU-2"), gf(u64::MAX)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

/// Every fence the single-item helpers refuse, stale or duplicate, through an update, a put or
/// a delete, counts once in `palisade_lock_fence_rejected_total{store="dynamodb"}`: they bypass
/// `FencedStoreExt`, which counts the refusals of `apply`. Accepted writes and the caller's own
/// failed condition count nothing.
#[test]
fn every_fence_the_helpers_refuse_is_counted_once() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let store = DynamoStore::open(config("counted")).await.unwrap();
            let table = store.config().table.clone();
            let key = || AttributeValue::S("SKU-9".into());
            let update = || {
                store
                    .client()
                    .update_item()
                    .table_name(&table)
                    .key("pk", key())
                    .update_expression("SET qty = qty - :one")
                    .condition_expression("qty >= :one")
                    .expression_attribute_values(":one", n(1))
            };
            let put = || store.client().put_item().table_name(&table).item("pk", key()).item("qty", n(1));
            let delete = || store.client().delete_item().table_name(&table).key("pk", key());
            store.put_item_fenced(put(), gf(7)).await.unwrap();
            store.update_item_fenced(update(), gf(7)).await.unwrap();
            // The caller's own condition (stock 0) failing is a Conflict, not a refused fence.
            let err = store.update_item_fenced(update(), gf(7)).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Conflict, "{err:?}");

            let other = GrantFence::new(Fence::new(7), GrantId::from_bytes([0xb2; 16]));
            for fence in [gf(3), other] {
                let refusals = [
                    store.update_item_fenced(update(), fence).await.unwrap_err(),
                    store.put_item_fenced(put(), fence).await.unwrap_err(),
                    store.delete_item_fenced(delete(), fence).await.unwrap_err(),
                ];
                for err in refusals {
                    assert!(
                        matches!(err.kind(), ErrorKind::StaleFence { .. } | ErrorKind::DuplicateFence { .. }),
                        "{err:?}"
                    );
                }
            }
            store.delete_item_fenced(delete(), gf(7)).await.unwrap();
        });
    });
    let counted: u64 = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, _, _, _)| {
            k.key().name() == palisade_core::metrics::LOCK_FENCE_REJECTED_TOTAL
                && k.key().labels().any(|l| l.key() == "store" && l.value() == palisade_dynamodb::BACKEND)
        })
        .map(|(_, _, _, v)| match v {
            DebugValue::Counter(c) => c,
            _ => 0,
        })
        .sum();
    assert_eq!(counted, 6, "six refused fences (stale and duplicate × update, put, delete) counted {counted} times");
}

/// What a test proxy does to requests for one DynamoDB operation (matched on `X-Amz-Target`).
#[derive(Clone, Copy)]
enum Fault {
    /// Never forwards them and never answers: the request left, the answer never comes.
    Swallow(&'static str),
    /// Forwards the first one at once (the server applies it) but holds its answer back for
    /// the delay, past the client's attempt timeout; later ones pass untouched.
    DelayFirstReply(&'static str, Duration),
}

/// A proxy to the real server that forwards every request over a fresh connection and relays
/// the answer, except for what `fault` says.
async fn faulty_proxy(upstream: String, fault: Fault) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let upstream = upstream.trim_start_matches("http://").to_string();
    let delayed_once = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else { return };
            let upstream = upstream.clone();
            let delayed_once = std::sync::Arc::clone(&delayed_once);
            tokio::spawn(async move {
                loop {
                    // One request: headers, then Content-Length bytes.
                    let mut buf = Vec::new();
                    let mut byte = [0u8; 1];
                    while !buf.ends_with(b"\r\n\r\n") {
                        if conn.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        buf.push(byte[0]);
                    }
                    let head = String::from_utf8_lossy(&buf).to_string();
                    let len = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string())
                        })
                        .and_then(|v| v.parse::<usize>().ok())
                        .unwrap_or(0);
                    let mut body = vec![0u8; len];
                    conn.read_exact(&mut body).await.unwrap();
                    let target = |op: &str| head.contains(&format!("DynamoDB_20120810.{op}"));
                    let delay = match fault {
                        Fault::Swallow(op) if target(op) => {
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                            return;
                        }
                        Fault::DelayFirstReply(op, delay)
                            if target(op) && !delayed_once.swap(true, std::sync::atomic::Ordering::SeqCst) =>
                        {
                            Some(delay)
                        }
                        _ => None,
                    };
                    // Forward over a fresh connection, without keep-alive, and relay the answer.
                    let mut up = tokio::net::TcpStream::connect(&upstream).await.unwrap();
                    let head = head.replace("\r\n\r\n", "\r\nConnection: close\r\n\r\n");
                    up.write_all(head.as_bytes()).await.unwrap();
                    up.write_all(&body).await.unwrap();
                    let mut answer = Vec::new();
                    up.read_to_end(&mut answer).await.unwrap();
                    if let Some(delay) = delay {
                        tokio::time::sleep(delay).await;
                    }
                    let answer =
                        String::from_utf8_lossy(&answer).replace("Connection: close", "Connection: keep-alive");
                    if conn.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    format!("http://{addr}")
}

/// Issue 16.6b: the SDK retries a request whose attempt timed out, and a fenced update is not
/// idempotent (the same fence from the same grant passes again). The first attempt reaches the
/// server and applies; its answer is held back past the attempt timeout. The helper must not
/// send it again: one decrement, reported as `OutcomeUnknown`, never a silent second one.
#[tokio::test]
async fn a_fenced_update_whose_answer_is_late_is_sent_once_and_outcome_unknown() {
    let real = config("late-reply");
    let table = real.table.clone();
    let store = DynamoStore::open(real.clone()).await.unwrap();
    let put =
        store.client().put_item().table_name(&table).item("pk", AttributeValue::S("SKU-L".into())).item("qty", n(10));
    store.put_item_fenced(put, gf(5)).await.unwrap();

    let proxy =
        faulty_proxy(real.endpoint.clone().unwrap(), Fault::DelayFirstReply("UpdateItem", Duration::from_millis(1500)))
            .await;
    let mut through_proxy = real.clone();
    through_proxy.endpoint = Some(proxy);
    through_proxy.max_attempts = 3;
    through_proxy.attempt_timeout = Duration::from_millis(500);
    through_proxy.operation_timeout = Duration::from_secs(10);
    let late = DynamoStore::open(through_proxy).await.unwrap();
    let decrement = late
        .client()
        .update_item()
        .table_name(&table)
        .key("pk", AttributeValue::S("SKU-L".into()))
        .update_expression("SET qty = qty - :one")
        .expression_attribute_values(":one", n(1));
    let result = late.update_item_fenced(decrement, gf(5)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await; // the held-back answer is long gone
    assert_eq!(
        qty(&store, "SKU-L").await,
        Some((9, Some(5))),
        "decremented more than once; the helper said {result:?}"
    );
    let err = result.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err:?}");
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn a_write_whose_answer_never_comes_is_outcome_unknown_never_applied_or_refused() {
    let real = config("ambiguous");
    let store = DynamoStore::open(real.clone()).await.unwrap();
    let proxy = faulty_proxy(real.endpoint.clone().unwrap(), Fault::Swallow("TransactWriteItems")).await;
    let mut through_proxy = real.clone();
    through_proxy.endpoint = Some(proxy);
    through_proxy.max_attempts = 1;
    through_proxy.attempt_timeout = Duration::from_millis(500);
    through_proxy.operation_timeout = Duration::from_secs(2);
    let hanging = DynamoStore::open(through_proxy).await.unwrap();
    let resource = ResourceKey::new("amb", "x").unwrap();
    let err = hanging.apply(&resource, gf(1), &WriteBatch::new().put("amb/1", b"v".to_vec())).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err:?}");
    assert!(!err.is_retryable(), "an unknown outcome must not invite a blind retry");
    // Reads through the same proxy still work, and the real store shows nothing was written.
    assert_eq!(hanging.watermark(&resource).await.unwrap(), None);
    assert_eq!(store.read("amb/1").await.unwrap(), None);
}

/// A write's first answer is held back past the attempt timeout, and meanwhile another grant
/// writes a higher fence. The SDK resends the write with its client request token, and
/// DynamoDB answers a resend of a transaction that applied with that success, without
/// evaluating its condition again: the write applied, and it must be reported as applied, never
/// refused as stale (`palisade torture` found a read of a value whose write was "refused", on a
/// server that ignored the token).
#[tokio::test]
async fn a_write_resent_after_a_late_answer_is_answered_as_the_first_attempt_was() {
    let real = config("resent");
    let store = DynamoStore::open(real.clone()).await.unwrap();
    let proxy = faulty_proxy(
        real.endpoint.clone().unwrap(),
        Fault::DelayFirstReply("TransactWriteItems", Duration::from_millis(1500)),
    )
    .await;
    let mut through_proxy = real.clone();
    through_proxy.endpoint = Some(proxy);
    through_proxy.max_attempts = 3;
    through_proxy.attempt_timeout = Duration::from_millis(600);
    through_proxy.operation_timeout = Duration::from_secs(10);
    let late = DynamoStore::open(through_proxy).await.unwrap();
    let resource = ResourceKey::new("resent", "x").unwrap();
    let first = tokio::spawn(async move {
        late.apply(&resource, gf(1), &WriteBatch::new().put("resent/1", b"first".to_vec())).await
    });
    // The first attempt has reached the server and applied; its answer is held back.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let resource = ResourceKey::new("resent", "x").unwrap();
    let next = GrantFence::new(Fence::new(2), GrantId::from_bytes([0xb2; 16]));
    store.apply(&resource, next, &WriteBatch::new().put("resent/1", b"second".to_vec())).await.unwrap();
    let result = first.await.unwrap();
    assert!(result.is_ok(), "the first write applied (its resend carried its token), but was reported as {result:?}");
    assert_eq!(store.read("resent/1").await.unwrap().map(|r| r.value), Some(b"second".to_vec()));
}

/// `fence` as the test's one grant presents it.
fn gf(fence: u64) -> GrantFence {
    GrantFence::new(Fence::new(fence), GrantId::from_bytes([0xa1; 16]))
}

/// One `TransactWriteItems` holds at most 100 items: a multi-resource write past that (a
/// watermark per resource plus a record per operation) is refused before anything is sent,
/// saying how many items it needed; one within the limit is applied whole.
#[tokio::test]
async fn a_multi_resource_write_past_the_transaction_item_limit_is_refused_with_the_count() {
    let store = DynamoStore::open(config("item-limit")).await.unwrap();
    let fence = GrantFence::new(Fence::new(7), GrantId::from_bytes([7; 16]));
    let fences: Vec<_> = (0..palisade_core::spi::MAX_FENCES_PER_WRITE)
        .map(|i| (ResourceKey::new("limit", format!("r{i:02}")).unwrap(), fence))
        .collect();
    let batch = (0..40).fold(WriteBatch::new(), |b, i| b.put(format!("limit/{i}"), b"x".to_vec()));
    let err = store.apply_all(&fences, &batch).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("104 items") && err.to_string().contains("at most 100"), "{err}");
    assert!(store.read("limit/0").await.unwrap().is_none());
    assert!(store.watermark(&fences[0].0).await.unwrap().is_none(), "nothing was sent");

    let batch = (0..36).fold(WriteBatch::new(), |b, i| b.put(format!("limit/{i}"), b"x".to_vec()));
    store.apply_all(&fences, &batch).await.unwrap();
    assert_eq!(store.watermark(&fences[63].0).await.unwrap(), Some(Fence::new(7)));
    assert_eq!(store.read("limit/35").await.unwrap().unwrap().value, b"x");
}
