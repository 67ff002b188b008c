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

/// The name of the variant sending the minimal fenced recipe through the raw client (Redis:
/// `SET NX PX` then `INCR` in one script, a compare-and-delete script; PostgreSQL and SQLite:
/// one upsert that takes a free or expired row and returns its next fence, an update that
/// clears the owner): Palisade ÷ this is what its guarantees beyond the fence cost.
pub const MINIMAL: &str = "minimal fenced recipe, raw";
/// Palisade's handoff from a holder in another process, the waiter waiting 5 ms (SQLite: a
/// release wakes only the waiters of its own process).
pub const ACROSS: &str = "palisade, holder in another process";
/// The same after the waiter waited 300 ms (its polling slowed down by then).
pub const ACROSS_LATE: &str = "palisade, holder in another process, after 300 ms";

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
    /// The coordination primitives built on the service (fenced services only).
    pub primitives: Option<PrimitivePerf>,
    /// Two keys taken as a set (`SET`) against two single locks (`TWO_LOCKS`).
    pub sets: SetPerf,
}

/// A set of two keys (`lock_all`, zero wait, + release) against the same two keys taken and
/// released one by one, through the same client in the same interleaved rounds.
#[derive(Debug, Clone, Serialize)]
pub struct SetPerf {
    /// Whether the service takes a set in one request ([`palisade::MultiAcquire`], debug form).
    pub multi_acquire: String,
    /// Both variants' sequential latency.
    pub latency: Vec<Latency>,
    /// Both variants' cycles per second at each concurrency.
    pub throughput: Vec<Rate>,
}

impl SetPerf {
    /// The latency of the variant called `name`.
    pub fn latency(&self, name: &str) -> Option<&Latency> {
        self.latency.iter().find(|l| l.name == name)
    }

    /// The throughput of the variant called `name` at `tasks`.
    pub fn rate(&self, name: &str, tasks: usize) -> Option<&Rate> {
        self.throughput.iter().find(|r| r.name == name && r.tasks == tasks)
    }
}

/// The set variant in [`SetPerf`]: `lock_all` of two keys + release.
pub const SET: &str = "lock_all, 2 keys";
/// The two-locks variant in [`SetPerf`]: two `try_lock`s + two releases.
pub const TWO_LOCKS: &str = "two locks";

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
    let fenced = svc.is_fenced();
    let (ours, mut handoffs, sets, multi_acquire) = match (svc, waiter) {
        (AnyLockService::Fenced(s), AnyLockService::Fenced(w)) => (
            baseline::service(OURS, Arc::clone(&s), &prefix, ttl),
            vec![Handoff::service(OURS, Arc::clone(&s), w, handoff_key, ttl.get(), Duration::from_millis(5))],
            [
                baseline::lock_set(SET, Arc::clone(&s), &prefix, ttl),
                baseline::two_locks(TWO_LOCKS, Arc::clone(&s), &prefix, ttl),
            ],
            s.capabilities().multi_acquire,
        ),
        (AnyLockService::Unfenced(s), AnyLockService::Unfenced(w)) => (
            baseline::service(OURS, Arc::clone(&s), &prefix, ttl),
            vec![Handoff::service(OURS, Arc::clone(&s), w, handoff_key, ttl.get(), Duration::from_millis(5))],
            [
                baseline::lock_set(SET, Arc::clone(&s), &prefix, ttl),
                baseline::two_locks(TWO_LOCKS, Arc::clone(&s), &prefix, ttl),
            ],
            s.capabilities().multi_acquire,
        ),
        _ => return Err("the same URL connected once fenced and once unfenced".into()),
    };
    let mut variants = Vec::new();
    let mut before: Option<Hook> = None;
    match backend {
        Backend::Memory => {}
        Backend::Redis => {
            variants.push(baseline::redis_set_nx(RAW, url, &prefix).await?);
            variants.push(baseline::redis_minimal_fenced(MINIMAL, url, &prefix).await?);
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
        Backend::Postgres => {
            variants.push(baseline::postgres_row(RAW, url, &prefix).await?);
            variants.push(baseline::postgres_minimal_fenced(MINIMAL, url, &prefix).await?);
        }
        Backend::Sqlite => {
            variants.push(baseline::sqlite_row(RAW, url, &prefix).await?);
            variants.push(baseline::sqlite_minimal_fenced(MINIMAL, url, &prefix).await?);
            // Another process's waiters are not woken; they find the release by polling.
            let key = ResourceKey::new(&*prefix, "handoff-across").map_err(err)?;
            let AnyLockService::Fenced(waiter) = palisade::connect_any_lock(url).await.map_err(err)? else {
                return Err("SQLite's lock service connected unfenced".into());
            };
            handoffs.push(Handoff::from_another_process(
                ACROSS,
                Arc::clone(&waiter),
                url,
                key.clone(),
                Duration::from_millis(5),
                1,
            ));
            handoffs.push(Handoff::from_another_process(ACROSS_LATE, waiter, url, key, Duration::from_millis(300), 10));
        }
    }
    variants.push(ours);
    Ok(LockPerf {
        latency: measure::latency(&variants, plan, before.as_ref()).await?,
        throughput: measure::throughput_all(&variants, plan, before.as_ref()).await?,
        handoff: measure::handoffs(&handoffs, plan).await?,
        primitives: if fenced { Some(primitive_perf(url, plan).await?) } else { None },
        sets: SetPerf {
            multi_acquire: format!("{multi_acquire:?}"),
            latency: measure::latency(&sets, plan, before.as_ref()).await?,
            throughput: measure::throughput_all(&sets, plan, before.as_ref()).await?,
        },
    })
}

/// The mutex's variant in [`PrimitivePerf`]: `try_lock` + `Lease::release`.
pub const MUTEX: &str = "mutex";
/// A semaphore permit: `Semaphore::try_acquire` + release.
pub const PERMIT: &str = "semaphore permit";
/// A read lock: `RwLock::read` + release.
pub const READ: &str = "read lock";
/// A write lock: `RwLock::write` + release.
pub const WRITE: &str = "write lock";
/// An election: `Election::campaign` + `resign`.
pub const LEADER: &str = "election";
/// Permits of the measured semaphore, readers of the measured read-write lock.
pub const PRIMITIVE_COUNT: u32 = 4;

/// The coordination primitives on one fenced service: each one's uncontended cycle beside the
/// mutex's (the same client, the same rounds, interleaved), and each one's handoff (let go →
/// the waiter already waiting holds). The read-write lock records its entries in an in-memory
/// store, so the figures are the lock service's; on a real store add one store write per entry.
#[derive(Debug, Clone, Serialize)]
pub struct PrimitivePerf {
    /// Sequential cycles, one variant per primitive and the mutex.
    pub latency: Vec<Latency>,
    /// Handoffs, one variant per primitive (the read lock's is the write lock's drain) and the mutex.
    pub handoff: Vec<Latency>,
    /// Permits of the semaphore and readers of the read-write lock measured.
    pub count: u32,
}

impl PrimitivePerf {
    /// The latency of the variant called `name`.
    pub fn latency(&self, name: &str) -> Option<&Latency> {
        self.latency.iter().find(|l| l.name == name)
    }

    /// The handoff of the variant called `name`.
    pub fn handoff(&self, name: &str) -> Option<&Latency> {
        self.handoff.iter().find(|l| l.name == name)
    }
}

/// Measures [`PrimitivePerf`] on the fenced service at `url` (two clients: a holder and a
/// waiter), with a tenth of the plan's cycles and a quarter of its handoffs (a write entry is
/// 2 + 2 × 4 lock operations).
pub async fn primitive_perf(url: &str, plan: &Plan) -> Result<PrimitivePerf, String> {
    use palisade::{Election, LockOptions, MemoryFencedStore, RwLock, Semaphore};
    let prefix = measure::run_prefix("prim");
    let ttl = Ttl::from_millis(10_000).map_err(err)?;
    let (svc, waiter) =
        (palisade::connect_lock(url).await.map_err(err)?, palisade::connect_lock(url).await.map_err(err)?);
    let store: Arc<DynFencedStore> = Arc::new(MemoryFencedStore::new());
    let once = LockOptions::ttl(ttl.get()).wait(Duration::ZERO);
    let key = {
        let prefix = prefix.clone();
        move |what: &str, slot: measure::Slot| {
            ResourceKey::new(&*prefix, format!("{}-{}-{}", what.replace(' ', "-"), slot.task, slot.key)).map_err(err)
        }
    };
    let variant = |name: &'static str| {
        let (svc, store, key) = (Arc::clone(&svc), Arc::clone(&store), key.clone());
        Variant::new(name, move |slot| {
            let (svc, store, key) = (Arc::clone(&svc), Arc::clone(&store), key(name, slot));
            async move {
                let key = key?;
                match name {
                    PERMIT => {
                        let sem = Semaphore::new(svc, key, PRIMITIVE_COUNT).map_err(err)?;
                        let permit = sem.try_acquire(ttl.get()).await.map_err(err)?.ok_or("no permit free")?;
                        permit.release().await.map_err(err)
                    }
                    READ | WRITE => {
                        let rw = RwLock::new(svc, store, key, PRIMITIVE_COUNT).map_err(err)?;
                        if name == READ {
                            rw.read(once).await.map_err(err)?.release().await.map_err(err)
                        } else {
                            rw.write(once).await.map_err(err)?.release().await.map_err(err)
                        }
                    }
                    _ => Election::new(svc, key, ttl.get())
                        .campaign(Duration::ZERO)
                        .await
                        .map_err(err)?
                        .resign()
                        .await
                        .map_err(err),
                }
            }
        })
    };
    let variants = [
        baseline::lease(MUTEX, Arc::clone(&svc), &prefix, ttl),
        variant(PERMIT),
        variant(READ),
        variant(WRITE),
        variant(LEADER),
    ];
    let latency = measure::latency(&variants, &primitive_plans(plan).0, None).await?;

    let settle = Duration::from_millis(5);
    let wait = LockOptions::ttl(ttl.get()).wait(Duration::from_secs(10));
    let one_key = |what: &str| ResourceKey::new(&*prefix, format!("handoff-{what}")).map_err(err);
    let sems = (
        Semaphore::new(Arc::clone(&svc), one_key("sem")?, 1).map_err(err)?,
        Semaphore::new(Arc::clone(&waiter), one_key("sem")?, 1).map_err(err)?,
    );
    let rws = (
        RwLock::new(Arc::clone(&svc), Arc::clone(&store), one_key("rw")?, PRIMITIVE_COUNT).map_err(err)?,
        RwLock::new(Arc::clone(&waiter), Arc::clone(&store), one_key("rw")?, PRIMITIVE_COUNT).map_err(err)?,
    );
    let elections = (
        Election::new(Arc::clone(&svc), one_key("el")?, ttl.get()),
        Election::new(Arc::clone(&waiter), one_key("el")?, ttl.get()),
    );
    let release = |lease: palisade::Lease<palisade::DynLockService>| async move { lease.release().await.map_err(err) };
    let handoffs = [
        Handoff::service(MUTEX, Arc::clone(&svc), Arc::clone(&waiter), one_key("mutex")?, ttl.get(), settle),
        Handoff::between(
            PERMIT,
            move || {
                let s = sems.0.clone();
                async move { s.acquire(wait).await.map_err(err) }
            },
            move || {
                let s = sems.1.clone();
                async move { s.acquire(wait).await.map_err(err) }
            },
            release,
            settle,
        ),
        Handoff::between(
            WRITE,
            move || {
                let rw = rws.0.clone();
                async move { rw.write(wait).await.map_err(err) }
            },
            move || {
                let rw = rws.1.clone();
                async move { rw.write(wait).await.map_err(err) }
            },
            release,
            settle,
        ),
        Handoff::between(
            LEADER,
            move || {
                let e = elections.0.clone();
                async move { e.campaign(wait.wait).await.map_err(err) }
            },
            move || {
                let e = elections.1.clone();
                async move { e.campaign(wait.wait).await.map_err(err) }
            },
            |leader: palisade::Leadership<palisade::DynLockService>| async move { leader.resign().await.map_err(err) },
            settle,
        ),
    ];
    let handoff = measure::handoffs(&handoffs, &primitive_plans(plan).1).await?;
    Ok(PrimitivePerf { latency, handoff, count: PRIMITIVE_COUNT })
}

/// The plans [`primitive_perf`] measures with: a tenth of `plan`'s cycles (at least 20) for
/// latency, a quarter of its handoffs (at least 5).
pub fn primitive_plans(plan: &Plan) -> (Plan, Plan) {
    (
        Plan { cycles: (plan.cycles / 10).max(20), ..plan.clone() },
        Plan { handoffs: (plan.handoffs / 4).max(5), ..plan.clone() },
    )
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
    // A transfer's write: one batch fencing two resources (`apply_all`) against the same two
    // records written by two single-resource fenced writes, one after the other.
    let pair = [ResourceKey::new(&*prefix, "from").map_err(err)?, ResourceKey::new(&*prefix, "to").map_err(err)?];
    let records = [format!("{prefix}/from"), format!("{prefix}/to")];
    let next = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let multi = {
        let (store, pair, records, next) = (Arc::clone(store), pair.clone(), records.clone(), Arc::clone(&next));
        Variant::new(MULTI_WRITE, move |_| {
            let store = Arc::clone(&store);
            let fence =
                palisade::GrantFence::new(Fence::new(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)), grant);
            let fences = [(pair[0].clone(), fence), (pair[1].clone(), fence)];
            let batch =
                WriteBatch::new().put(records[0].clone(), b"-1".to_vec()).put(records[1].clone(), b"+1".to_vec());
            async move { store.apply_all(&fences, &batch).await.map_err(err) }
        })
    };
    let singles = {
        let store = Arc::clone(store);
        Variant::new(TWO_WRITES, move |_| {
            let (store, pair, records) = (Arc::clone(&store), pair.clone(), records.clone());
            let fence =
                palisade::GrantFence::new(Fence::new(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)), grant);
            async move {
                store
                    .apply(&pair[0], fence, &WriteBatch::new().put(records[0].clone(), b"-1".to_vec()))
                    .await
                    .map_err(err)?;
                store
                    .apply(&pair[1], fence, &WriteBatch::new().put(records[1].clone(), b"+1".to_vec()))
                    .await
                    .map_err(err)
            }
        })
    };
    let plan = Plan { cycles: (plan.cycles / 4).max(20), ..plan.clone() };
    Ok(StorePerf { latency: measure::latency(&[plain, fenced, singles, multi], &plan, None).await? })
}

/// The store variant writing two resources' records in one fenced batch (`apply_all`).
pub const MULTI_WRITE: &str = "multi-write, 2 resources";
/// The store variant writing the same two records with two single-resource fenced writes.
pub const TWO_WRITES: &str = "two fenced writes";
