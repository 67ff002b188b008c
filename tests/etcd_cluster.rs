//! etcd's leader killed while clients hold and contend for locks, on a 3-member cluster of the
//! test's own (fast elections): no two holders at once, no stale write accepted, locks usable
//! again after the election, fences increasing across the leader change.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade::etcd::{EtcdConfig, EtcdLockService};
use palisade::postgres::PostgresStore;
use palisade::{Fence, FencedStore, FencedStoreExt, LockServiceExt, ResourceKey, WriteBatch};
use palisade_conformance::require_env;
use palisade_conformance::servers::EtcdCluster;
use tokio::time::Instant;

/// One grant as a worker saw it: when it held the lock (from the grant's return to the
/// earlier of its release and its lease deadline), its fence, and whether its write landed.
#[derive(Debug, Clone)]
struct Held {
    from: Instant,
    until: Instant,
    fence: Fence,
    wrote: bool,
}

async fn leader_index(cluster: &EtcdCluster) -> Option<usize> {
    for (i, port) in cluster.client_ports().into_iter().enumerate() {
        let Ok(mut client) = etcd_client::Client::connect([format!("http://127.0.0.1:{port}")], None).await else {
            continue;
        };
        if let Ok(status) = client.status().await
            && status.header().is_some_and(|h| h.member_id() == status.leader())
        {
            return Some(i);
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_under_contention() {
    let mut cluster = EtcdCluster::start(&require_env("PALISADE_ETCD_SERVER"), 3).unwrap();
    let url = format!("{}?session_ttl_s=2", cluster.url());
    let store = Arc::new(PostgresStore::connect(&require_env("PALISADE_POSTGRES_URL")).await.unwrap());
    let run = format!("leader{}", std::process::id());
    let keys: Vec<ResourceKey> = (0..2).map(|i| ResourceKey::new(run.clone(), format!("k{i}")).unwrap()).collect();
    let history: Arc<Mutex<BTreeMap<String, Vec<Held>>>> = Arc::default();
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();

    let started = Instant::now();
    let kill_at = started + Duration::from_secs(3);
    let stop_at = kill_at + Duration::from_secs(8);
    let mut workers = Vec::new();
    for w in 0..4 {
        let locks = Arc::new(EtcdLockService::connect_with(EtcdConfig::from_url(&url).unwrap()).await.unwrap());
        let (store, history, errors) = (Arc::clone(&store), Arc::clone(&history), Arc::clone(&errors));
        let key = keys[w % keys.len()].clone();
        let record = format!("{run}/{}", key.id());
        workers.push(tokio::spawn(async move {
            while Instant::now() < stop_at {
                let lease = match locks.lock(&key, Duration::from_secs(2), Duration::from_secs(3)).await {
                    Ok(l) => l,
                    Err(e) => {
                        // Elections and lost sessions are expected here; retry.
                        errors.lock().unwrap().push(e.to_string());
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let from = Instant::now();
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
                // Done with the critical section when the release is sent (it takes effect
                // somewhere during the call), or at the lease's deadline if that came first.
                let (deadline, fence) = (lease.deadline(), lease.fence());
                let until = Instant::now().min(deadline);
                let _ = lease.release().await;
                history.lock().unwrap().entry(record.clone()).or_default().push(Held { from, until, fence, wrote });
            }
        }));
    }

    tokio::time::sleep_until(kill_at).await;
    let leader = leader_index(&cluster).await.expect("a leader before the kill");
    cluster.kill_member(leader);
    let killed = Instant::now();
    for w in workers {
        w.await.unwrap();
    }

    let history = history.lock().unwrap().clone();
    let errors = errors.lock().unwrap().clone();
    let mut after_election = 0;
    for (record, mut grants) in history {
        grants.sort_by_key(|g| g.from);
        for pair in grants.windows(2) {
            assert!(pair[1].from >= pair[0].until, "{record}: two holders at once: {:?} and {:?}", pair[0], pair[1]);
        }
        let written: Vec<u64> = grants.iter().filter(|g| g.wrote).map(|g| g.fence.get()).collect();
        assert!(written.windows(2).all(|w| w[1] > w[0]), "{record}: accepted fences not increasing: {written:?}");
        after_election += grants.iter().filter(|g| g.wrote && g.from > killed + Duration::from_secs(3)).count();
        let last = store.read(&record).await.unwrap().unwrap();
        assert_eq!(
            String::from_utf8(last.value).unwrap(),
            written.last().unwrap().to_string(),
            "{record}: the stored value is not the last accepted write"
        );
    }
    assert!(after_election > 0, "no lock was usable after the election (errors: {errors:?})");
    eprintln!(
        "leader m{leader} killed; {after_election} writes after the election; {} errors meanwhile: {errors:?}",
        errors.len()
    );
    let mut kinds = BTreeMap::new();
    for e in &errors {
        *kinds.entry(e.chars().take(70).collect::<String>()).or_insert(0) += 1;
    }
    eprintln!("DBG {kinds:#?}");
}
