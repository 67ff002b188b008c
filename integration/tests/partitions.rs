//! Real network partitions (network namespaces on a bridge, `palisade_lab::netns`):
//! packets dropped in silence, not a process killed or a socket closed.
//!
//! - A holder cut off from Redis, etcd or ZooKeeper (and from its PostgreSQL store) past its
//!   TTL while a contender takes the lock: its write after the heal is refused as stale, its
//!   lost signal had fired, the contender was granted only after the holder's `safe_until`
//!   (`palisade_conformance::partition::holder_cut_off`).
//! - The etcd or ZooKeeper leader cut off from the majority (and from the clients) while four
//!   clients contend and write: no two holders, no stale write accepted, locks usable again,
//!   and after the heal the old leader rejoins and fences keep growing.
//! - Two of five Redlock masters cut off: grants go on without overlap, each silent master
//!   costing its node timeout; a third cut and grants are refused; healed, they come back.
//!
//! Each test starts its servers on the lab: bound to the lab's gateway (reachable from the
//! holder's host and from the root namespace) or one per host. Tests here run one at a time:
//! their timings are what they check.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;
use std::time::Duration;

use palisade::etcd::{EtcdConfig, EtcdLockService};
use palisade::postgres::{PostgresConfig, PostgresStore};
use palisade::redis::RedisLockService;
use palisade::redlock::RedlockService;
use palisade::zookeeper::ZkLockService;
use palisade::{LockOptions, LockService, LockServiceExt, ResourceKey};
use palisade_conformance::cluster::LeaderKillSettings;
use palisade_conformance::{Ctx, FencedStoreFactory, Timing, lock_factory, partition, require_env, store_factory};
use palisade_lab::netns::{Host, Lab};
use palisade_lab::servers::{EtcdCluster, LoopbackServer, PostgresServer, Site, ZkEnsemble};
use tokio::time::Instant;

/// One partition test at a time (a failed test does not poison it).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn postgres_store(url: String) -> impl FencedStoreFactory<Store = PostgresStore> {
    store_factory(move || {
        let config = PostgresConfig { max_connections: 2, ..PostgresConfig::new(url.clone()) };
        async move { Ok(Arc::new(PostgresStore::open(config).await?)) }
    })
}

async fn run_holder_cut_off<L>(name: &'static str, lab: &Lab, locks: L)
where
    L: palisade_conformance::LockServiceFactory + 'static,
    L::Service: LockService<Fencing = palisade::Fenced>,
{
    let postgres = PostgresServer::start_at(&Site::address(lab.gateway())).unwrap();
    let host = lab.host().unwrap();
    let ctx = Ctx::new(name, name);
    let report = partition::holder_cut_off(&ctx, &host, Arc::new(locks), Arc::new(postgres_store(postgres.url())))
        .await
        .unwrap_or_else(|failure| panic!("{failure}"));
    println!("{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_holder_cut_off_past_its_ttl_is_refused() {
    let _one = SERIAL.lock().await;
    let lab = Lab::new().unwrap();
    let redis =
        LoopbackServer::redis_at(&Site::address(lab.gateway()), &require_env("PALISADE_REDIS_SERVER"), &[]).unwrap();
    let url = redis.redis_url();
    let locks = lock_factory(Timing::new(Duration::from_millis(500), Duration::from_millis(100)), move || {
        let url = url.clone();
        async move { Ok(Arc::new(RedisLockService::connect(&url).await?)) }
    });
    run_holder_cut_off("redis_holder_cut_off", &lab, locks).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_holder_cut_off_past_its_ttl_is_refused() {
    let _one = SERIAL.lock().await;
    let lab = Lab::new().unwrap();
    let etcd = LoopbackServer::etcd_at(&Site::address(lab.gateway()), &require_env("PALISADE_ETCD_SERVER")).unwrap();
    let url = format!("{}?session_ttl_s=2", etcd.etcd_url());
    let locks = lock_factory(Timing::new(Duration::from_secs(1), Duration::from_millis(2500)), move || {
        let config = EtcdConfig::from_url(&url);
        async move { Ok(Arc::new(EtcdLockService::connect_with(config?).await?)) }
    });
    run_holder_cut_off("etcd_holder_cut_off", &lab, locks).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_holder_cut_off_past_its_ttl_is_refused() {
    let _one = SERIAL.lock().await;
    let lab = Lab::new().unwrap();
    let zk = ZkEnsemble::start_at(&require_env("PALISADE_ZK_CLASSPATH"), &[Site::address(lab.gateway())]).unwrap();
    let url = format!("{}?session_timeout_ms=3000", zk.url());
    let locks = lock_factory(Timing::new(Duration::from_secs(1), Duration::from_millis(4000)), move || {
        let url = url.clone();
        async move { Ok(Arc::new(ZkLockService::connect(&url).await?)) }
    });
    run_holder_cut_off("zookeeper_holder_cut_off", &lab, locks).await;
}

async fn leader_cut_off<S, M>(members: &M, hosts: &[Host], clients: Vec<Arc<S>>)
where
    S: LockService<Fencing = palisade::Fenced>,
    M: partition::Members,
{
    let store: Arc<palisade::DynFencedStore> = Arc::new(palisade::MemoryFencedStore::new());
    let settings = LeaderKillSettings {
        keys: 2,
        before: Duration::from_secs(2),
        settle: Duration::from_secs(6),
        after: Duration::from_secs(10),
        writes_after: 5,
        ttl: Duration::from_secs(2),
    };
    let namespace = format!("cut-leader-{}", std::process::id());
    let report =
        partition::leader_cut_off_under_contention(clients, store, &namespace, settings, members, hosts).await.unwrap();
    println!("{report:#?}");
    report.check().unwrap();
    let first = report.contention.first_grant_after_kill;
    assert!(
        first.is_some_and(|d| d < Duration::from_secs(15)),
        "no lock granted and written within 15 s of the cut: {first:?}"
    );
}

fn hosts(lab: &Lab, n: usize) -> Vec<Host> {
    (0..n).map(|_| lab.host().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_leader_cut_off_from_the_majority_under_contention() {
    let _one = SERIAL.lock().await;
    let lab = Lab::new().unwrap();
    let hosts = hosts(&lab, 3);
    let sites: Vec<Site> = hosts.iter().map(Site::host).collect();
    let cluster = EtcdCluster::start_at(&require_env("PALISADE_ETCD_SERVER"), &sites).unwrap();
    let url = format!("{}?session_ttl_s=2", cluster.url());
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(Arc::new(EtcdLockService::connect(&url).await.unwrap()));
    }
    leader_cut_off(&cluster, &hosts, clients).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_leader_cut_off_from_the_majority_under_contention() {
    let _one = SERIAL.lock().await;
    let lab = Lab::new().unwrap();
    let hosts = hosts(&lab, 3);
    let sites: Vec<Site> = hosts.iter().map(Site::host).collect();
    let ensemble = ZkEnsemble::start_at(&require_env("PALISADE_ZK_CLASSPATH"), &sites).unwrap();
    let url = format!("{}?session_timeout_ms=4000", ensemble.url());
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(Arc::new(ZkLockService::connect(&url).await.unwrap()));
    }
    leader_cut_off(&ensemble, &hosts, clients).await;
}

/// Three clients take turns on one key for `run`; returns the holds (grant returned → release
/// sent), and how many acquisitions failed.
async fn redlock_contention(
    clients: &[Arc<RedlockService>],
    key: &ResourceKey,
    run: Duration,
) -> (Vec<(Instant, Instant)>, usize) {
    let stop = Instant::now() + run;
    let mut tasks = Vec::new();
    for locks in clients {
        let (locks, key) = (Arc::clone(locks), key.clone());
        tasks.push(tokio::spawn(async move {
            let (mut holds, mut failed) = (Vec::new(), 0);
            while Instant::now() < stop {
                match locks.lock(&key, LockOptions::ttl(Duration::from_secs(2)).wait(Duration::from_millis(500))).await
                {
                    Ok(lease) => {
                        let from = Instant::now();
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        let until = Instant::now();
                        holds.push((from, until));
                        let _ = lease.release().await;
                    }
                    Err(_) => failed += 1,
                }
            }
            (holds, failed)
        }));
    }
    let (mut holds, mut failed) = (Vec::new(), 0);
    for task in tasks {
        let (h, f) = task.await.unwrap();
        holds.extend(h);
        failed += f;
    }
    holds.sort();
    (holds, failed)
}

fn assert_no_overlap(holds: &[(Instant, Instant)], when: &str) {
    for pair in holds.windows(2) {
        assert!(pair[1].0 >= pair[0].1, "{when}: two holders at once ({:?} apart)", pair[0].1 - pair[1].0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_with_a_minority_of_masters_cut_off() {
    let _one = SERIAL.lock().await;
    let lab = Lab::new().unwrap();
    let hosts = hosts(&lab, 5);
    let program = require_env("PALISADE_REDIS_SERVER");
    let masters: Vec<LoopbackServer> =
        hosts.iter().map(|h| LoopbackServer::redis_at(&Site::host(h), &program, &[]).unwrap()).collect();
    let url = format!("redlock://{}", masters.iter().map(|m| m.addr().to_string()).collect::<Vec<_>>().join(","));
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(Arc::new(RedlockService::connect(&url).await.unwrap()));
    }
    let key = ResourceKey::new("partitions", format!("redlock-{}", std::process::id())).unwrap();

    let (holds, _) = redlock_contention(&clients, &key, Duration::from_secs(1)).await;
    assert!(holds.len() > 10, "only {} grants with every master up", holds.len());
    assert_no_overlap(&holds, "all up");

    hosts[0].cut().unwrap();
    hosts[1].cut().unwrap();
    let (holds, failed) = redlock_contention(&clients, &key, Duration::from_secs(3)).await;
    println!("two of five masters cut off: {} grants, {failed} acquisitions failed", holds.len());
    assert!(holds.len() > 10, "only {} grants with a minority cut off", holds.len());
    assert_no_overlap(&holds, "two of five cut off");
    let single = Instant::now();
    let lease = clients[0].try_lock(&key, Duration::from_secs(2)).await.unwrap().expect("free: granted");
    let took = single.elapsed();
    lease.release().await.unwrap();
    // Each silent master costs its node timeout (50 ms by default), not TCP's patience.
    assert!(took < Duration::from_millis(500), "a grant with two silent masters took {took:?}");

    hosts[2].cut().unwrap();
    let err = clients[0].try_lock(&key, Duration::from_secs(2)).await.unwrap_err();
    assert_eq!(err.kind(), palisade::ErrorKind::Unavailable, "three of five cut off: {err}");

    for host in &hosts[..3] {
        host.heal().unwrap();
    }
    // Healed, grants come back (a connection may take a moment to recover from the silence).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match clients[0].try_lock(&key, Duration::from_secs(2)).await {
            Ok(Some(lease)) => {
                lease.release().await.unwrap();
                break;
            }
            other => assert!(Instant::now() < deadline, "20 s after the heal: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (holds, _) = redlock_contention(&clients, &key, Duration::from_secs(1)).await;
    assert!(holds.len() > 10, "only {} grants after the heal", holds.len());
    assert_no_overlap(&holds, "healed");
}

/// Redis with a classic bug: each grant and extension claims ten times the TTL the server
/// was given, so a holder believes it holds long after the server let the lock go.
struct OverstatingRedis(RedisLockService);

fn overstate(ttl: palisade::Ttl) -> palisade::Result<palisade::Ttl> {
    palisade::Ttl::new(ttl.get() * 10)
}

#[palisade::spi::async_trait]
impl LockService for OverstatingRedis {
    type Fencing = palisade::Fenced;
    fn backend(&self) -> &'static str {
        "overstating-redis"
    }
    fn capabilities(&self) -> palisade::Capabilities {
        self.0.capabilities()
    }
    async fn try_acquire(
        &self,
        key: &ResourceKey,
        ttl: palisade::Ttl,
    ) -> palisade::Result<Option<palisade::Grant<palisade::Fenced>>> {
        let Some(grant) = self.0.try_acquire(key, ttl).await? else { return Ok(None) };
        let mut told = palisade::Grant::new(
            key.clone(),
            grant.token(),
            grant.fence(),
            overstate(grant.ttl())?,
            grant.requested_at(),
        );
        if let Some(handle) = grant.handle() {
            told = told.with_handle(handle.to_string());
        }
        Ok(Some(told))
    }
    async fn extend(
        &self,
        grant: &palisade::Grant<palisade::Fenced>,
        ttl: palisade::Ttl,
    ) -> palisade::Result<palisade::Ttl> {
        overstate(self.0.extend(grant, ttl).await?)
    }
    async fn release(&self, grant: &palisade::Grant<palisade::Fenced>) -> palisade::Result<()> {
        self.0.release(grant).await
    }
}

/// The scenario catches that bug, for its reason: the contender is granted while the cut-off
/// holder still believes it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_overstating_its_ttl_fails_the_cut_off_holder_scenario() {
    let _one = SERIAL.lock().await;
    let lab = Lab::new().unwrap();
    let redis =
        LoopbackServer::redis_at(&Site::address(lab.gateway()), &require_env("PALISADE_REDIS_SERVER"), &[]).unwrap();
    let postgres = PostgresServer::start_at(&Site::address(lab.gateway())).unwrap();
    let url = redis.redis_url();
    let locks = lock_factory(Timing::new(Duration::from_millis(500), Duration::from_millis(100)), move || {
        let url = url.clone();
        async move { Ok(Arc::new(OverstatingRedis(RedisLockService::connect(&url).await?))) }
    });
    let host = lab.host().unwrap();
    let ctx = Ctx::new("holder_cut_off", "overstating");
    let failure = partition::holder_cut_off(&ctx, &host, Arc::new(locks), Arc::new(postgres_store(postgres.url())))
        .await
        .expect_err("a service whose grants overstate their TTL passed the cut-off holder scenario");
    assert!(failure.to_string().contains("still believed it held the lock"), "failed for another reason: {failure}");
}
