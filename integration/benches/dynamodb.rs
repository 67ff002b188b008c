//! The DynamoDB store's fenced writes against the same writes unconditioned, in one run, with
//! every HTTP request counted by an SDK interceptor: the fence must add no request.
//!
//! ```sh
//! scripts/services up && source .services/env
//! cargo bench -p palisade-integration --bench dynamodb
//! ```
//!
//! The server is moto (one request at a time): absolute times are moto's, compare ratios.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // a benchmark binary: panics are its errors

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use palisade::dynamodb::aws_sdk_dynamodb::Client;
use palisade::dynamodb::aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use palisade::dynamodb::aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use palisade::dynamodb::aws_sdk_dynamodb::types::AttributeValue;
use palisade::dynamodb::{DynamoConfig, DynamoStore};
use palisade::{Fence, FencedStore, ResourceKey, WriteBatch};

const ROUNDS: usize = 5;
const PER_ROUND: usize = 60;

/// Counts requests as they are put on the wire (retries included).
#[derive(Debug, Clone, Default)]
struct Requests(Arc<AtomicU64>);

impl Intercept for Requests {
    fn name(&self) -> &'static str {
        "request counter"
    }
    fn read_before_transmit(
        &self,
        _: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

struct Path {
    name: &'static str,
    samples: Vec<Duration>,
    requests: u64,
    calls: u64,
}

impl Path {
    fn new(name: &'static str) -> Self {
        Path { name, samples: Vec::new(), requests: 0, calls: 0 }
    }
    fn p(&self, pct: usize) -> Duration {
        let mut v = self.samples.clone();
        v.sort_unstable();
        v[(v.len() - 1) * pct / 100]
    }
}

async fn timed<F: std::future::Future<Output = ()>>(path: &mut Path, counter: &Requests, f: F) {
    let before = counter.0.load(Ordering::SeqCst);
    let t = Instant::now();
    f.await;
    path.samples.push(t.elapsed());
    path.requests += counter.0.load(Ordering::SeqCst) - before;
    path.calls += 1;
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let endpoint =
        std::env::var("PALISADE_DYNAMODB_ENDPOINT").expect("PALISADE_DYNAMODB_ENDPOINT: scripts/services up");
    let table = format!("bench-{}", std::process::id());
    let config =
        DynamoConfig { endpoint: Some(endpoint), region: Some("us-east-1".into()), ..DynamoConfig::new(table.clone()) };
    let plain_store = DynamoStore::open(config.clone()).await.unwrap();
    let counter = Requests::default();
    let client = Client::from_conf(plain_store.client().config().to_builder().interceptor(counter.clone()).build());
    // The store under test sends through the counting client too.
    let store = DynamoStore::from_client(client.clone(), config).await.unwrap();
    let key = |sku: &str| AttributeValue::S(sku.to_string());
    for sku in ["plain", "fenced"] {
        client
            .put_item()
            .table_name(&table)
            .item("pk", key(sku))
            .item("qty", AttributeValue::N("1000000".into()))
            .send()
            .await
            .unwrap();
    }
    let resource = ResourceKey::new("bench", "wh").unwrap();
    let mut fence = 0u64;
    let (mut plain, mut fenced, mut unfenced_batch, mut fenced_batch) = (
        Path::new("`UpdateItem` `SET qty = qty - :one` (unconditional)"),
        Path::new("the same through `update_item_fenced` (+ fence condition, + `fence = :f`)"),
        Path::new("record `apply_unfenced` (`TransactWriteItems`, 1 item)"),
        Path::new("record `apply` (`TransactWriteItems`: watermark item + 1 item)"),
    );
    for _ in 0..ROUNDS {
        for _ in 0..PER_ROUND {
            timed(&mut plain, &counter, async {
                client
                    .update_item()
                    .table_name(&table)
                    .key("pk", key("plain"))
                    .update_expression("SET qty = qty - :one")
                    .expression_attribute_values(":one", AttributeValue::N("1".into()))
                    .send()
                    .await
                    .unwrap();
            })
            .await;
        }
        for _ in 0..PER_ROUND {
            fence += 1;
            let update = client
                .update_item()
                .table_name(&table)
                .key("pk", key("fenced"))
                .update_expression("SET qty = qty - :one")
                .expression_attribute_values(":one", AttributeValue::N("1".into()));
            timed(&mut fenced, &counter, async {
                store
                    .update_item_fenced(update, palisade::GrantFence::new(Fence::new(fence), BENCH_GRANT))
                    .await
                    .map(drop)
                    .unwrap()
            })
            .await;
        }
        for i in 0..PER_ROUND {
            let batch = WriteBatch::new().put(format!("bench/u{i}"), b"v".to_vec());
            timed(&mut unfenced_batch, &counter, async { store.apply_unfenced(&batch).await.unwrap() }).await;
        }
        for i in 0..PER_ROUND {
            fence += 1;
            let batch = WriteBatch::new().put(format!("bench/f{i}"), b"v".to_vec());
            timed(&mut fenced_batch, &counter, async {
                store.apply(&resource, palisade::GrantFence::new(Fence::new(fence), BENCH_GRANT), &batch).await.unwrap()
            })
            .await;
        }
    }
    println!("# DynamoDB store: fenced vs unconditioned writes\n");
    println!("moto on loopback (one request at a time), {ROUNDS} interleaved rounds of {PER_ROUND} writes per path.\n");
    println!("| path | requests per write | p50 ms | p99 ms | p50 ratio |");
    println!("|---|---|---|---|---|");
    for (path, base) in
        [(&plain, &plain), (&fenced, &plain), (&unfenced_batch, &unfenced_batch), (&fenced_batch, &unfenced_batch)]
    {
        println!(
            "| {} | {:.2} | {:.3} | {:.3} | {:.2} |",
            path.name,
            path.requests as f64 / path.calls as f64,
            path.p(50).as_secs_f64() * 1e3,
            path.p(99).as_secs_f64() * 1e3,
            path.p(50).as_secs_f64() / base.p(50).as_secs_f64()
        );
    }
}

/// The grant every fenced write of the benchmark presents.
const BENCH_GRANT: palisade::GrantId = palisade::GrantId::from_bytes([7; 16]);
