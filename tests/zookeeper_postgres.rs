//! ZooKeeper + PostgreSQL against real servers (started by `scripts/test`): the end-to-end
//! suite, SIGSTOP and SIGKILL of real `warehouse allocate --lock zk://…` processes, and the
//! leader of a 3-server ensemble killed while clients hold and contend.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{last_json, run, warehouse};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use palisade::postgres::{PostgresConfig, PostgresStore};
use palisade::zookeeper::{ZkConfig, ZkLockService};
use palisade::{Fence, FencedStore, FencedStoreExt, LockServiceExt, ResourceKey, WriteBatch};
use palisade_conformance::servers::ZkEnsemble;
use palisade_conformance::{FencedStoreFactory, LockServiceFactory, Timing, lock_factory, require_env, store_factory};

fn zookeeper() -> impl LockServiceFactory<Service = ZkLockService> {
    let url = format!("{}?session_timeout_ms=3000", require_env("PALISADE_ZK_URL"));
    lock_factory(Timing::new(Duration::from_secs(1), Duration::from_millis(4000)), move || {
        let config = ZkConfig::from_url(&url);
        async move { Ok(Arc::new(ZkLockService::connect_with(config?).await?)) }
    })
}

fn postgres() -> impl FencedStoreFactory<Store = PostgresStore> {
    let url = require_env("PALISADE_POSTGRES_URL");
    store_factory(move || {
        let config = PostgresConfig { max_connections: 4, ..PostgresConfig::new(url.clone()) };
        async move { Ok(Arc::new(PostgresStore::open(config).await?)) }
    })
}

palisade_conformance::end_to_end_suite!(zookeeper(), postgres());

/// The warehouse processes' session timeout: how long after a process stops its lock goes.
const SESSION_MS: u64 = 2000;

fn urls() -> (String, String) {
    (
        format!("{}?session_timeout_ms={SESSION_MS}", require_env("PALISADE_ZK_URL")),
        require_env("PALISADE_POSTGRES_URL"),
    )
}

fn unique_sku(tag: &str) -> String {
    format!("{tag}-{}-{}", std::process::id(), Instant::now().elapsed().subsec_nanos())
}

fn allocate(
    lock: &str,
    store: &str,
    sku: &str,
    think_ms: &str,
) -> (std::process::Child, std::io::Lines<BufReader<std::process::ChildStdout>>) {
    let mut child = warehouse()
        .args(["allocate", "--lock", lock, "--store", store, "--sku", sku, "--ttl-ms", "1000", "--think-ms", think_ms])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

fn event(lines: &mut std::io::Lines<BufReader<std::process::ChildStdout>>) -> serde_json::Value {
    serde_json::from_str(&lines.next().expect("allocate said nothing").unwrap()).unwrap()
}

fn setup(lock: &str, store: &str, sku: &str) {
    let out = run(&["setup", "--lock", lock, "--store", store, "--sku", sku, "--qty", "10"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A frozen holder stops heartbeating, the ensemble expires its session and deletes its node,
/// a second process allocates; the thawed one is refused (exit 3).
#[test]
fn sigstop_holder_is_refused_after_it_thaws() {
    let (lock, store) = urls();
    let sku = unique_sku("ZSTOP");
    setup(&lock, &store, &sku);
    let (mut a, mut lines) = allocate(&lock, &store, &sku, "3000");
    let acquired = event(&mut lines);
    assert_eq!(acquired["event"], "acquired");
    let pid = Pid::from_raw(i32::try_from(a.id()).unwrap());
    kill(pid, Signal::SIGSTOP).unwrap();
    let b =
        run(&["allocate", "--lock", &lock, "--store", &store, "--sku", &sku, "--ttl-ms", "5000", "--wait-ms", "15000"]);
    assert_eq!(b.status.code(), Some(0), "{}", String::from_utf8_lossy(&b.stderr));
    assert!(last_json(&b)["fence"].as_u64() > acquired["fence"].as_u64());
    kill(pid, Signal::SIGCONT).unwrap();
    let wrote = event(&mut lines);
    assert_eq!(a.wait().unwrap().code(), Some(3), "the thawed holder must be refused: {wrote}");
    assert_eq!(wrote["reason"], "stale_fence");
    let shown = last_json(&run(&["show", "--store", &store, "--sku", &sku]));
    assert_eq!(shown["qty"], 9, "exactly one decrement: {shown}");
    assert_eq!(shown["duplicate_jobs"], 0, "{shown}");
}

/// SIGKILL of the holder: the next process completes within the session timeout plus the
/// server's expiry tick plus start-up and one acquisition.
#[test]
fn sigkill_holder_is_replaced_within_the_session_timeout() {
    let (lock, store) = urls();
    let sku = unique_sku("ZKILL");
    setup(&lock, &store, &sku);
    let (mut a, mut lines) = allocate(&lock, &store, &sku, "30000");
    assert_eq!(event(&mut lines)["event"], "acquired");
    let killed = Instant::now();
    kill(Pid::from_raw(i32::try_from(a.id()).unwrap()), Signal::SIGKILL).unwrap();
    let _ = a.wait();
    let b =
        run(&["allocate", "--lock", &lock, "--store", &store, "--sku", &sku, "--ttl-ms", "5000", "--wait-ms", "15000"]);
    let took = killed.elapsed();
    assert_eq!(b.status.code(), Some(0), "{}", String::from_utf8_lossy(&b.stderr));
    assert!(took < Duration::from_millis(SESSION_MS + 500 + 3000), "next holder took {took:?}");
}

#[derive(Debug, Clone)]
struct Held {
    from: tokio::time::Instant,
    until: tokio::time::Instant,
    fence: Fence,
    wrote: bool,
}

/// The ensemble's leader is killed while 4 clients contend for 2 keys and write through
/// PostgreSQL: no overlapping holds, accepted fences increase, locks usable after the election.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensemble_leader_killed_under_contention() {
    let mut ensemble = ZkEnsemble::start(&require_env("PALISADE_ZK_CLASSPATH"), 3).unwrap();
    let url = format!("{}?session_timeout_ms=4000", ensemble.url());
    let store = Arc::new(PostgresStore::connect(&require_env("PALISADE_POSTGRES_URL")).await.unwrap());
    let run_id = format!("zkleader{}", std::process::id());
    let keys: Vec<ResourceKey> = (0..2).map(|i| ResourceKey::new(run_id.clone(), format!("k{i}")).unwrap()).collect();
    let history: Arc<Mutex<BTreeMap<String, Vec<Held>>>> = Arc::default();
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let kill_at = tokio::time::Instant::now() + Duration::from_secs(3);
    let stop_at = kill_at + Duration::from_secs(10);
    let mut workers = Vec::new();
    for w in 0..4 {
        let locks = Arc::new(ZkLockService::connect(&url).await.unwrap());
        let (store, history, errors) = (Arc::clone(&store), Arc::clone(&history), Arc::clone(&errors));
        let key = keys[w % keys.len()].clone();
        let record = format!("{run_id}/{}", key.id());
        workers.push(tokio::spawn(async move {
            while tokio::time::Instant::now() < stop_at {
                let lease = match locks.lock(&key, Duration::from_secs(2), Duration::from_secs(3)).await {
                    Ok(l) => l,
                    Err(e) => {
                        errors.lock().unwrap().push(e.to_string());
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let from = tokio::time::Instant::now();
                tokio::time::sleep(Duration::from_millis(10)).await;
                let wrote = match store
                    .write(&lease, &WriteBatch::new().put(record.clone(), lease.fence().to_string()))
                    .await
                {
                    Ok(()) => true,
                    Err(e) => {
                        errors.lock().unwrap().push(e.to_string());
                        false
                    }
                };
                let (deadline, fence) = (lease.deadline(), lease.fence());
                let until = tokio::time::Instant::now().min(deadline);
                let _ = lease.release().await;
                history.lock().unwrap().entry(record.clone()).or_default().push(Held { from, until, fence, wrote });
            }
        }));
    }
    tokio::time::sleep_until(kill_at).await;
    let leader = ensemble.leader().expect("a leader before the kill");
    ensemble.kill_member(leader);
    let killed = tokio::time::Instant::now();
    for w in workers {
        w.await.unwrap();
    }
    let history = history.lock().unwrap().clone();
    let errors = errors.lock().unwrap().clone();
    let mut after = 0;
    for (record, mut grants) in history {
        grants.sort_by_key(|g| g.from);
        for pair in grants.windows(2) {
            assert!(pair[1].from >= pair[0].until, "{record}: two holders at once: {:?} and {:?}", pair[0], pair[1]);
        }
        let written: Vec<u64> = grants.iter().filter(|g| g.wrote).map(|g| g.fence.get()).collect();
        assert!(written.windows(2).all(|w| w[1] > w[0]), "{record}: accepted fences not increasing: {written:?}");
        after += grants.iter().filter(|g| g.wrote && g.from > killed + Duration::from_secs(5)).count();
        let last = store.read(&record).await.unwrap().unwrap();
        assert_eq!(String::from_utf8(last.value).unwrap(), written.last().unwrap().to_string());
    }
    assert!(after > 0, "no lock was usable after the election (errors: {errors:?})");
    eprintln!(
        "leader {leader} killed; {after} writes after the election; {} errors meanwhile: {errors:?}",
        errors.len()
    );
}
