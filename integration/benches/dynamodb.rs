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

use palisade::dynamodb::aws_sdk_dynamodb::Client;
use palisade::dynamodb::aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use palisade::dynamodb::aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use palisade::dynamodb::aws_sdk_dynamodb::types::AttributeValue;
use palisade::dynamodb::{DynamoConfig, DynamoStore};
use palisade::{Fence, FencedStore, ResourceKey, WriteBatch};
use palisade_compare::measure::{self, Plan, Variant};

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

/// Counts the requests one variant sends (the latency measurement runs one cycle at a time).
#[derive(Clone, Default)]
struct Tally {
    requests: Arc<AtomicU64>,
    calls: Arc<AtomicU64>,
}

impl Tally {
    async fn count<F: std::future::Future<Output = Result<(), String>>>(
        &self,
        counter: &Requests,
        f: F,
    ) -> Result<(), String> {
        let before = counter.0.load(Ordering::SeqCst);
        let out = f.await;
        self.requests.fetch_add(counter.0.load(Ordering::SeqCst) - before, Ordering::SeqCst);
        self.calls.fetch_add(1, Ordering::SeqCst);
        out
    }

    fn per_call(&self) -> f64 {
        self.requests.load(Ordering::SeqCst) as f64 / self.calls.load(Ordering::SeqCst).max(1) as f64
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
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
    let fences = Arc::new(AtomicU64::new(0));
    let tallies: [Tally; 4] = Default::default();
    let plain = {
        let (client, table, counter, tally) = (client.clone(), table.clone(), counter.clone(), tallies[0].clone());
        Variant::new("`UpdateItem` `SET qty = qty - :one` (unconditional)", move |_| {
            let update = client
                .update_item()
                .table_name(&table)
                .key("pk", key("plain"))
                .update_expression("SET qty = qty - :one")
                .expression_attribute_values(":one", AttributeValue::N("1".into()));
            let (counter, tally) = (counter.clone(), tally.clone());
            async move { tally.count(&counter, async { update.send().await.map(drop).map_err(|e| e.to_string()) }).await }
        })
    };
    let fenced = {
        let (client, table, counter, tally) = (client.clone(), table.clone(), counter.clone(), tallies[1].clone());
        let (store, fences) = (store.clone(), Arc::clone(&fences));
        Variant::new("the same through `update_item_fenced` (+ fence condition, + `fence = :f`)", move |_| {
            let update = client
                .update_item()
                .table_name(&table)
                .key("pk", key("fenced"))
                .update_expression("SET qty = qty - :one")
                .expression_attribute_values(":one", AttributeValue::N("1".into()));
            let fence = Fence::new(fences.fetch_add(1, Ordering::SeqCst) + 1);
            let (store, counter, tally) = (store.clone(), counter.clone(), tally.clone());
            async move {
                let write = store.update_item_fenced(update, palisade::GrantFence::new(fence, BENCH_GRANT));
                tally.count(&counter, async { write.await.map(drop).map_err(|e| e.to_string()) }).await
            }
        })
    };
    let unfenced_batch = {
        let (store, counter, tally) = (store.clone(), counter.clone(), tallies[2].clone());
        Variant::new("record `apply_unfenced` (`TransactWriteItems`, 1 item)", move |slot| {
            let batch = WriteBatch::new().put(format!("bench/u{}", slot.key), b"v".to_vec());
            let (store, counter, tally) = (store.clone(), counter.clone(), tally.clone());
            async move {
                tally.count(&counter, async { store.apply_unfenced(&batch).await.map_err(|e| e.to_string()) }).await
            }
        })
    };
    let fenced_batch = {
        let (store, counter, tally, fences) = (store.clone(), counter.clone(), tallies[3].clone(), Arc::clone(&fences));
        Variant::new("record `apply` (`TransactWriteItems`: watermark item + 1 item)", move |slot| {
            let batch = WriteBatch::new().put(format!("bench/f{}", slot.key), b"v".to_vec());
            let fence = palisade::GrantFence::new(Fence::new(fences.fetch_add(1, Ordering::SeqCst) + 1), BENCH_GRANT);
            let (store, counter, tally, resource) = (store.clone(), counter.clone(), tally.clone(), resource.clone());
            async move {
                tally
                    .count(&counter, async { store.apply(&resource, fence, &batch).await.map_err(|e| e.to_string()) })
                    .await
            }
        })
    };
    let plan = Plan { cycles: 60, ..Plan::full() };
    let l = measure::latency(&[plain, fenced, unfenced_batch, fenced_batch], &plan, None).await.unwrap();
    println!("# DynamoDB store: fenced vs unconditioned writes\n");
    println!(
        "moto on loopback (one request at a time), measured by `palisade_compare::measure`: each path warmed up, then \
         the paths take turns for {} rounds of {} writes.\n",
        plan.rounds, plan.cycles
    );
    println!("| path | requests per write | p50 ms (rounds) | p99 ms | p50 ratio |");
    println!("|---|---|---|---|---|");
    for (i, path) in l.iter().enumerate() {
        let base = &l[i - i % 2];
        println!(
            "| {} | {:.2} | {:.3} ({:.3}–{:.3}) | {:.3} | {:.2} |",
            path.name,
            tallies[i].per_call(),
            path.p50_ms,
            path.round_p50_ms.min,
            path.round_p50_ms.max,
            path.p99_ms,
            path.ratio_to(base)
        );
    }
}

const BENCH_GRANT: palisade::GrantId = palisade::GrantId::from_bytes([7; 16]);
