//! Performance: each lock service against its own raw operation, and each store's fenced write
//! against its plain one, measured in the same run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use palisade::zookeeper::zookeeper_client as zk;
use palisade::{AnyLockService, DynFencedStore, Fence, LockService, ResourceKey, Ttl, WriteBatch};
use serde::Serialize;

use crate::target::Backend;

/// Sizes of one run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sizes {
    pub cycles: usize,
    pub window_ms: u64,
    pub handoffs: usize,
    pub writes: usize,
}

impl Sizes {
    pub fn new(quick: bool) -> Sizes {
        if quick {
            Sizes { cycles: 60, window_ms: 300, handoffs: 10, writes: 60 }
        } else {
            Sizes { cycles: 400, window_ms: 2000, handoffs: 40, writes: 300 }
        }
    }
}

pub const CONCURRENCY: [u64; 3] = [1, 16, 64];

/// A lock service's figures.
#[derive(Debug, Clone, Serialize)]
pub struct LockPerf {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub raw_p50_ms: Option<f64>,
    pub raw_p99_ms: Option<f64>,
    /// acquire + release cycles per second at 1, 16, 64 tasks.
    pub throughput: Vec<(u64, f64)>,
    pub raw_throughput: Option<f64>,
    pub handoff_p50_ms: f64,
    pub handoff_p99_ms: f64,
    /// Sorted latencies (ms), for the chart.
    #[serde(skip)]
    pub latencies_ms: Vec<f64>,
}

/// A store's figures.
#[derive(Debug, Clone, Serialize)]
pub struct StorePerf {
    pub fenced_p50_ms: f64,
    pub fenced_p99_ms: f64,
    pub plain_p50_ms: f64,
    pub plain_p99_ms: f64,
}

fn pct(sorted: &[Duration], p: usize) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let d = sorted[(sorted.len() - 1) * p / 100];
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn sorted(mut v: Vec<Duration>) -> Vec<Duration> {
    v.sort_unstable();
    v
}

fn prefix() -> String {
    let mut b = [0u8; 3];
    let _ = getrandom::fill(&mut b);
    format!("perf{:02x}{:02x}{:02x}", b[0], b[1], b[2])
}

async fn cycle<L: LockService + ?Sized>(svc: &L, key: &ResourceKey, ttl: Ttl) -> palisade::Result<()> {
    let Some(grant) = svc.try_acquire(key, ttl).await? else {
        return Err(palisade::Error::new(palisade::ErrorKind::Conflict, "compare", format!("{key} was held")));
    };
    svc.release(&grant).await
}

async fn measure<L: LockService + ?Sized>(svc: Arc<L>, sizes: Sizes) -> palisade::Result<LockPerf> {
    let ttl = Ttl::from_millis(10_000)?;
    let p = prefix();
    let mut lat = Vec::with_capacity(sizes.cycles);
    // 16 recurring resources, as locks on SKUs or tenants recur (a ZooKeeper parent node or an
    // etcd prefix is made once per resource, not once per cycle).
    for i in 0..sizes.cycles {
        let key = ResourceKey::new(p.clone(), format!("u{}", i % 16))?;
        let t = Instant::now();
        cycle(&*svc, &key, ttl).await?;
        lat.push(t.elapsed());
    }
    let lat = sorted(lat);
    let mut throughput = Vec::new();
    for tasks in CONCURRENCY {
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for t in 0..tasks {
            let (svc, done, stop, p) = (Arc::clone(&svc), Arc::clone(&done), Arc::clone(&stop), p.clone());
            handles.push(tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = ResourceKey::new(p.clone(), format!("t{tasks}-{t}-{}", i % 8))?;
                    cycle(&*svc, &key, ttl).await?;
                    done.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
                Ok::<(), palisade::Error>(())
            }));
        }
        let started = Instant::now();
        tokio::time::sleep(Duration::from_millis(sizes.window_ms)).await;
        stop.store(true, Ordering::Relaxed);
        let count = done.load(Ordering::Relaxed);
        let secs = started.elapsed().as_secs_f64();
        for h in handles {
            h.await.map_err(|e| palisade::Error::new(palisade::ErrorKind::Backend, "compare", e.to_string()))??;
        }
        throughput.push((tasks, (count as f64 / secs).round()));
    }
    // Contended handoff: the waiter is already waiting when the holder releases.
    let key = ResourceKey::new(p.clone(), "handoff")?;
    let long = Ttl::from_millis(30_000)?;
    let mut handoffs = Vec::new();
    for _ in 0..sizes.handoffs {
        let Some(held) = svc.try_acquire(&key, long).await? else { continue };
        let waiter = {
            let (svc, key) = (Arc::clone(&svc), key.clone());
            tokio::spawn(async move {
                let grant = svc.acquire(&key, long, Duration::from_secs(30)).await;
                (grant, Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        svc.release(&held).await?;
        let released = Instant::now();
        let (grant, got) =
            waiter.await.map_err(|e| palisade::Error::new(palisade::ErrorKind::Backend, "compare", e.to_string()))?;
        let grant = grant?;
        handoffs.push(got.saturating_duration_since(released));
        svc.release(&grant).await?;
    }
    let handoffs = sorted(handoffs);
    Ok(LockPerf {
        p50_ms: pct(&lat, 50),
        p99_ms: pct(&lat, 99),
        raw_p50_ms: None,
        raw_p99_ms: None,
        throughput,
        raw_throughput: None,
        handoff_p50_ms: pct(&handoffs, 50),
        handoff_p99_ms: pct(&handoffs, 99),
        latencies_ms: lat.iter().map(|d| d.as_secs_f64() * 1e3).collect(),
    })
}

/// Measures `locks`, and its backend's raw operation on the same server.
pub async fn lock_perf(
    locks: &AnyLockService,
    backend: Backend,
    url: &str,
    sizes: Sizes,
) -> palisade::Result<LockPerf> {
    let mut perf = match locks {
        AnyLockService::Fenced(s) => measure(Arc::clone(s), sizes).await?,
        AnyLockService::Unfenced(s) => measure(Arc::clone(s), sizes).await?,
    };
    if let Some((lat, per_sec)) = raw(backend, url, sizes).await? {
        perf.raw_p50_ms = Some(pct(&lat, 50));
        perf.raw_p99_ms = Some(pct(&lat, 99));
        perf.raw_throughput = Some(per_sec);
    }
    Ok(perf)
}

fn backend_err(what: &str, e: impl std::fmt::Display) -> palisade::Error {
    palisade::Error::new(palisade::ErrorKind::Backend, "compare", format!("raw {what}: {e}"))
}

/// The raw operation: sequential latencies, and one task's cycles per second.
async fn raw(backend: Backend, url: &str, sizes: Sizes) -> palisade::Result<Option<(Vec<Duration>, f64)>> {
    let p = prefix();
    let mut lat = Vec::with_capacity(sizes.cycles);
    match backend {
        Backend::Memory => return Ok(None),
        Backend::Redis | Backend::Redlock => {
            // Redlock's baseline is one master: the first its own URL parser lists.
            let redis_url = if backend == Backend::Redlock {
                palisade::redlock::RedlockConfig::parse(url)?.nodes.swap_remove(0)
            } else {
                url.to_string()
            };
            let client = redis::Client::open(redis_url).map_err(|e| backend_err("redis", e))?;
            let mut conn = client.get_multiplexed_async_connection().await.map_err(|e| backend_err("redis", e))?;
            for i in 0..sizes.cycles {
                let key = format!("{p}:raw:{i}");
                let t = Instant::now();
                let _: Option<String> = redis::cmd("SET")
                    .arg(&key)
                    .arg("v")
                    .arg("NX")
                    .arg("PX")
                    .arg(10_000)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| backend_err("redis", e))?;
                let _: i64 =
                    redis::cmd("DEL").arg(&key).query_async(&mut conn).await.map_err(|e| backend_err("redis", e))?;
                lat.push(t.elapsed());
            }
        }
        Backend::Etcd => {
            let config = palisade::etcd::EtcdConfig::from_url(url)?;
            let endpoints: Vec<String> = config.endpoints.iter().map(|h| format!("http://{h}")).collect();
            let mut client = etcd_client::Client::connect(endpoints, None).await.map_err(|e| backend_err("etcd", e))?;
            for i in 0..sizes.cycles {
                let key = format!("{p}/raw/{i}");
                let t = Instant::now();
                let txn = etcd_client::Txn::new()
                    .when([etcd_client::Compare::create_revision(key.clone(), etcd_client::CompareOp::Equal, 0)])
                    .and_then([etcd_client::TxnOp::put(key.clone(), "v", None)]);
                client.txn(txn).await.map_err(|e| backend_err("etcd", e))?;
                client.delete(key, None).await.map_err(|e| backend_err("etcd", e))?;
                lat.push(t.elapsed());
            }
        }
        Backend::Zookeeper => {
            let hosts = palisade::zookeeper::ZkConfig::from_url(url)?.servers.join(",");
            let client = zk::Client::connect(&hosts).await.map_err(|e| backend_err("zookeeper", e))?;
            let options = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
            for i in 0..sizes.cycles {
                let path = format!("/{p}-raw-{i}");
                let t = Instant::now();
                client.create(&path, b"v", &options).await.map_err(|e| backend_err("zookeeper", e))?;
                client.delete(&path, None).await.map_err(|e| backend_err("zookeeper", e))?;
                lat.push(t.elapsed());
            }
        }
    }
    let total: Duration = lat.iter().sum();
    let per_sec = (lat.len() as f64 / total.as_secs_f64().max(1e-9)).round();
    Ok(Some((sorted(lat), per_sec)))
}

/// A fenced single-record write against the store's plain (unfenced) write of the same record.
pub async fn store_perf(store: &Arc<DynFencedStore>, sizes: Sizes) -> palisade::Result<StorePerf> {
    let p = prefix();
    let resource = ResourceKey::new(p.clone(), "w")?;
    let (mut fenced, mut plain) = (Vec::new(), Vec::new());
    let grant = palisade::GrantId::of(&palisade::OwnerToken::generate()?);
    for i in 0..sizes.writes {
        let batch = WriteBatch::new().put(format!("{p}/fenced"), i.to_string());
        let t = Instant::now();
        store.apply(&resource, palisade::GrantFence::new(Fence::new(i as u64 + 1), grant), &batch).await?;
        fenced.push(t.elapsed());
        let batch = WriteBatch::new().put(format!("{p}/plain"), i.to_string());
        let t = Instant::now();
        store.apply_unfenced(&batch).await?;
        plain.push(t.elapsed());
    }
    let (fenced, plain) = (sorted(fenced), sorted(plain));
    Ok(StorePerf {
        fenced_p50_ms: pct(&fenced, 50),
        fenced_p99_ms: pct(&fenced, 99),
        plain_p50_ms: pct(&plain, 50),
        plain_p99_ms: pct(&plain, 99),
    })
}
