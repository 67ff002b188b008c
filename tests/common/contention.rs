//! An ensemble's leader killed while clients hold and contend for locks and write through a
//! fenced store: shared by the etcd and ZooKeeper cluster tests.
//!
//! Four clients contend for two keys for 3 s, then `kill` runs (it kills the leader), and they
//! go on for 10 s. Checks: no two holds of a key overlap (each hold runs from the grant's return
//! to the earlier of its release being sent and its lease deadline, on one clock), the fences
//! the store accepted increase per key, the stored value is the last accepted write, and some
//! writes land more than 5 s after the kill (locks usable again after the election).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade::{DynFencedStore, Fence, Fenced, FencedStoreExt, LockService, LockServiceExt, ResourceKey, WriteBatch};
use tokio::time::Instant;

#[derive(Debug, Clone)]
struct Held {
    from: Instant,
    until: Instant,
    fence: Fence,
    wrote: bool,
}

/// Runs the scenario; returns what `kill` said it killed, the writes after the election and
/// the errors the clients saw meanwhile (expected: elections and lost sessions).
pub async fn leader_killed_under_contention<S, K, F>(
    clients: Vec<Arc<S>>,
    store: Arc<DynFencedStore>,
    run: &str,
    kill: K,
) -> (String, usize, Vec<String>)
where
    S: LockService<Fencing = Fenced>,
    K: FnOnce() -> F,
    F: Future<Output = String>,
{
    let keys: Vec<ResourceKey> = (0..2).map(|i| ResourceKey::new(run, format!("k{i}")).unwrap()).collect();
    let history: Arc<Mutex<BTreeMap<String, Vec<Held>>>> = Arc::default();
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let kill_at = Instant::now() + Duration::from_secs(3);
    let stop_at = kill_at + Duration::from_secs(10);
    let mut workers = Vec::new();
    for (w, locks) in clients.into_iter().enumerate() {
        let (store, history, errors) = (Arc::clone(&store), Arc::clone(&history), Arc::clone(&errors));
        let key = keys[w % keys.len()].clone();
        let record = format!("{run}/{}", key.id());
        workers.push(tokio::spawn(async move {
            while Instant::now() < stop_at {
                let lease = match locks.lock(&key, Duration::from_secs(2), Duration::from_secs(3)).await {
                    Ok(l) => l,
                    Err(e) => {
                        errors.lock().unwrap().push(e.to_string());
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let from = Instant::now();
                tokio::time::sleep(Duration::from_millis(10)).await;
                let batch = WriteBatch::new().put(record.clone(), lease.fence().to_string());
                let wrote = match store.write(&lease, &batch).await {
                    Ok(()) => true,
                    Err(e) => {
                        errors.lock().unwrap().push(e.to_string());
                        false
                    }
                };
                // The hold ends when the release is sent (it takes effect somewhere during the
                // call), or at the lease's deadline if that came first.
                let (deadline, fence) = (lease.deadline(), lease.fence());
                let until = Instant::now().min(deadline);
                let _ = lease.release().await;
                history.lock().unwrap().entry(record.clone()).or_default().push(Held { from, until, fence, wrote });
            }
        }));
    }
    tokio::time::sleep_until(kill_at).await;
    let killed_what = kill().await;
    let killed = Instant::now();
    for w in workers {
        w.await.unwrap();
    }
    let history = history.lock().unwrap().clone();
    let mut after = 0;
    for (record, mut holds) in history {
        holds.sort_by_key(|h| h.from);
        for pair in holds.windows(2) {
            assert!(pair[1].from >= pair[0].until, "{record}: two holders at once: {:?} and {:?}", pair[0], pair[1]);
        }
        let written: Vec<u64> = holds.iter().filter(|h| h.wrote).map(|h| h.fence.get()).collect();
        assert!(written.windows(2).all(|w| w[1] > w[0]), "{record}: accepted fences not increasing: {written:?}");
        after += holds.iter().filter(|h| h.wrote && h.from > killed + Duration::from_secs(5)).count();
        let last = store.read(&record).await.unwrap().unwrap();
        assert_eq!(
            String::from_utf8(last.value).unwrap(),
            written.last().unwrap().to_string(),
            "{record}: the stored value is not the last accepted write"
        );
    }
    let errors = errors.lock().unwrap().clone();
    assert!(after > 0, "no lock was usable after the election (errors: {errors:?})");
    (killed_what, after, errors)
}
