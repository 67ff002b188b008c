//! Performance: each lock service against its backend's raw operation, and each store's fenced
//! write against its plain one, through `palisade_compare::measure`, the same code the
//! benchmarks in `integration/benches` use.

use std::sync::Arc;
use std::time::Duration;

use palisade::zookeeper::zookeeper_client as zk;
use palisade::{AnyLockService, DynFencedStore, Fence, ResourceKey, Ttl, WriteBatch};
use serde::Serialize;

use crate::target::Backend;
use palisade_compare::baseline;
use palisade_compare::measure::{self, Handoff, Hook, Latency, Plan, Rate, Variant};

/// The name of Palisade's variant in every comparison.
pub const OURS: &str = "palisade";
/// The name of the raw operation's variant.
pub const RAW: &str = "raw";
/// The name of the variant sending the very server operations Palisade sends, through the raw
/// client (Redis: the same scripts; etcd: the same txns): Palisade ÷ this is the client's cost.
pub const SAME: &str = "same operations, raw";

/// A lock service's figures: latency, throughput at each concurrency and handoff, for Palisade
/// (`OURS`) and, where the backend has one, its raw operation (`RAW`).
#[derive(Debug, Clone, Serialize)]
pub struct LockPerf {
    /// Sequential acquire + release.
    pub latency: Vec<Latency>,
    /// Acquire + release cycles per second, per variant and concurrency.
    pub throughput: Vec<Rate>,
    /// Release returned → the waiting contender holds.
    pub handoff: Vec<Latency>,
}

impl LockPerf {
    /// The latency of the variant called `name`.
    pub fn latency(&self, name: &str) -> Option<&Latency> {
        self.latency.iter().find(|l| l.name == name)
    }

    /// The throughput of the variant called `name` at `tasks`.
    pub fn rate(&self, name: &str, tasks: usize) -> Option<&Rate> {
        self.throughput.iter().find(|r| r.name == name && r.tasks == tasks)
    }

    /// The handoff of the variant called `name`.
    pub fn handoff(&self, name: &str) -> Option<&Latency> {
        self.handoff.iter().find(|l| l.name == name)
    }
}

/// A store's figures: a fenced one-record write (`fenced`) against the plain write (`plain`).
#[derive(Debug, Clone, Serialize)]
pub struct StorePerf {
    /// Both variants' sequential latency.
    pub latency: Vec<Latency>,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Measures the service at `url` (connected twice: a holder and a waiter for the handoff)
/// and its backend's raw operation on the same server.
pub async fn lock_perf(backend: Backend, url: &str, plan: &Plan) -> Result<LockPerf, String> {
    let prefix = measure::run_prefix("perf");
    let ttl = Ttl::from_millis(10_000).map_err(err)?;
    let (svc, waiter) =
        (palisade::connect_any_lock(url).await.map_err(err)?, palisade::connect_any_lock(url).await.map_err(err)?);
    let handoff_key = ResourceKey::new(&*prefix, "handoff").map_err(err)?;
    let (ours, mut handoffs) = match (svc, waiter) {
        (AnyLockService::Fenced(s), AnyLockService::Fenced(w)) => (
            baseline::service(OURS, Arc::clone(&s), &prefix, ttl),
            vec![Handoff::service(OURS, s, w, handoff_key, ttl.get(), Duration::from_millis(5))],
        ),
        (AnyLockService::Unfenced(s), AnyLockService::Unfenced(w)) => (
            baseline::service(OURS, Arc::clone(&s), &prefix, ttl),
            vec![Handoff::service(OURS, s, w, handoff_key, ttl.get(), Duration::from_millis(5))],
        ),
        _ => return Err("the same URL connected once fenced and once unfenced".into()),
    };
    let mut variants = Vec::new();
    let mut before: Option<Hook> = None;
    match backend {
        Backend::Memory => {}
        Backend::Redis => {
            variants.push(baseline::redis_set_nx(RAW, url, &prefix).await?);
            variants.push(baseline::redis_scripts(SAME, url, &prefix).await?);
            handoffs.push(baseline::redis_handoff(RAW, url, &prefix).await?);
        }
        Backend::Redlock => {
            // Redlock's baseline is one master: the first its own URL parser lists.
            let first = palisade::redlock::RedlockConfig::parse(url).map_err(err)?.nodes.swap_remove(0);
            variants.push(baseline::redis_set_nx(RAW, &first, &prefix).await?);
        }
        Backend::Etcd => {
            let config = palisade::etcd::EtcdConfig::from_url(url).map_err(err)?;
            let endpoints: Vec<String> = config.endpoints.iter().map(|h| format!("http://{h}")).collect();
            let client = etcd_client::Client::connect(endpoints, None).await.map_err(|e| format!("raw etcd: {e}"))?;
            let lease = baseline::etcd_lease(&client, 3600).await?;
            variants.push(baseline::etcd_txn(RAW, &client, lease, &prefix));
            variants.push(baseline::etcd_same_txns(SAME, &client, lease, &prefix));
            before = Some(baseline::etcd_compaction(&client));
        }
        Backend::Zookeeper => {
            let hosts = palisade::zookeeper::ZkConfig::from_url(url).map_err(err)?.servers.join(",");
            let client = zk::Client::connect(&hosts).await.map_err(|e| format!("raw zookeeper: {e}"))?;
            variants.push(baseline::zk_create(RAW, &client, &prefix, plan).await?);
        }
        Backend::Postgres => variants.push(baseline::postgres_row(RAW, url, &prefix).await?),
        Backend::Sqlite => variants.push(baseline::sqlite_row(RAW, url, &prefix).await?),
    }
    variants.push(ours);
    Ok(LockPerf {
        latency: measure::latency(&variants, plan, before.as_ref()).await?,
        throughput: measure::throughput_all(&variants, plan, before.as_ref()).await?,
        handoff: measure::handoffs(&handoffs, plan).await?,
    })
}

/// A fenced single-record write against the store's plain (unfenced) write of a record of the
/// same size, one writer, interleaved rounds (a quarter of the plan's cycles per round).
pub async fn store_perf(store: &Arc<DynFencedStore>, plan: &Plan) -> Result<StorePerf, String> {
    let prefix = measure::run_prefix("perf");
    let grant = palisade::GrantId::of(&palisade::OwnerToken::generate().map_err(err)?);
    let fenced = {
        let store = Arc::clone(store);
        let resource = ResourceKey::new(&*prefix, "w").map_err(err)?;
        let record = format!("{prefix}/fenced");
        let next = Arc::new(std::sync::atomic::AtomicU64::new(1));
        Variant::new("fenced", move |_| {
            let (store, resource) = (Arc::clone(&store), resource.clone());
            let fence = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let batch = WriteBatch::new().put(record.clone(), fence.to_string());
            async move {
                let fence = palisade::GrantFence::new(Fence::new(fence), grant);
                store.apply(&resource, fence, &batch).await.map_err(err)
            }
        })
    };
    let plain = {
        let store = Arc::clone(store);
        let record = format!("{prefix}/plain");
        Variant::new("plain", move |slot| {
            let store = Arc::clone(&store);
            let batch = WriteBatch::new().put(record.clone(), (slot.n + 1).to_string());
            async move { store.apply_unfenced(&batch).await.map_err(err) }
        })
    };
    let plan = Plan { cycles: (plan.cycles / 4).max(20), ..plan.clone() };
    Ok(StorePerf { latency: measure::latency(&[plain, fenced], &plan, None).await? })
}
