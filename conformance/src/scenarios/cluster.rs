//! A replicated lock service's leader killed while clients contend for locks and write through
//! a fenced store: the cluster scenario the etcd and ZooKeeper tests assert on and
//! `palisade compare` reports.
//!
//! Clients contend for a few keys, each holding a lock briefly and writing its fence through the
//! store; `kill` runs (it kills the leader) and they go on. [`LeaderKillReport`] says whether
//! two holds of a key ever overlapped (each hold runs from the grant's return to the earlier of
//! its release being sent and its lease deadline, on one clock), whether the store accepted a
//! fence that did not increase, whether each record ends with the last accepted write, and how
//! soon and how often locks were usable again after the election.

use palisade_core::LockOptions;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use palisade_core::{
    DynFencedStore, Fence, Fenced, FencedStoreExt, LockService, LockServiceExt, ResourceKey, WriteBatch,
};
use tokio::time::Instant;

use crate::harness::{Ctx, Outcome};
use crate::{FencedStoreFactory, LockServiceFactory, Namespace, attempt};

/// How long the scenario runs, and how many keys the clients share.
#[derive(Debug, Clone, Copy)]
pub struct LeaderKillSettings {
    /// Keys the clients contend for (client `i` uses key `i mod keys`). At least 1.
    pub keys: usize,
    /// Contention before the kill.
    pub before: Duration,
    /// Holds that start this long after the kill count as "after the election".
    pub settle: Duration,
    /// The least time the clients go on after the kill.
    pub after: Duration,
    /// Past `after`, they go on (up to 30 s after the kill) until this many writes of holds
    /// after the election have landed.
    pub writes_after: usize,
    /// The TTL of each lock.
    pub ttl: Duration,
}

impl Default for LeaderKillSettings {
    /// Two keys, 3 s before the kill, 10 s after; "after the election" from 5 s; 2 s TTLs.
    fn default() -> Self {
        LeaderKillSettings {
            keys: 2,
            before: Duration::from_secs(3),
            settle: Duration::from_secs(5),
            after: Duration::from_secs(10),
            writes_after: 1,
            ttl: Duration::from_secs(2),
        }
    }
}

/// What happened.
#[derive(Debug, Clone)]
pub struct LeaderKillReport {
    /// What `kill` said it killed.
    pub killed: String,
    /// Pairs of holds of one key that overlapped: two holders at once.
    pub overlaps: Vec<String>,
    /// Writes the store accepted with a fence not above the one it accepted before for the
    /// same record (a stale or duplicate holder's write).
    pub stale_accepted: u64,
    /// Records whose stored value is not the last accepted write.
    pub wrong_final_values: Vec<String>,
    /// Writes the store accepted in all.
    pub writes: usize,
    /// Accepted writes of holds that started `settle` or more after the kill.
    pub writes_after_election: usize,
    /// From the kill to the first write accepted after it.
    pub first_write_after_kill: Option<Duration>,
    /// From the kill to the first grant returned after it whose write the store accepted: how
    /// soon locks were usable again (a hold granted before the fault may write after it, which
    /// says nothing of recovery).
    pub first_grant_after_kill: Option<Duration>,
    /// Leases whose lost signal had fired by the time their holder released them.
    pub leases_lost: u64,
    /// The errors the clients saw (expected: elections, lost sessions).
    pub errors: Vec<String>,
}

impl LeaderKillReport {
    /// `Ok` when no holds overlapped, no stale write was accepted, every record ends with its
    /// last accepted write, and locks were usable again after the election; otherwise what
    /// went wrong.
    pub fn check(&self) -> Result<(), String> {
        let mut wrong = Vec::new();
        if !self.overlaps.is_empty() {
            wrong.push(format!("two holders at once: {}", self.overlaps.join("; ")));
        }
        if self.stale_accepted > 0 {
            wrong.push(format!("{} writes accepted with a fence not above the previous one", self.stale_accepted));
        }
        if !self.wrong_final_values.is_empty() {
            wrong.push(format!(
                "the stored value is not the last accepted write: {}",
                self.wrong_final_values.join("; ")
            ));
        }
        if self.writes_after_election == 0 {
            wrong.push(format!("no lock was usable after the election (errors: {:?})", self.errors));
        }
        if wrong.is_empty() { Ok(()) } else { Err(format!("leader {} killed: {}", self.killed, wrong.join(" | "))) }
    }
}

#[derive(Debug, Clone)]
struct Hold {
    from: Instant,
    until: Instant,
    fence: Fence,
    /// When the store accepted this hold's write.
    wrote_at: Option<Instant>,
}

/// Runs the scenario with `clients` (independent clients of one cluster) writing under
/// `namespace` in `store`. Errors only when `kill` does (the clients are stopped first).
pub async fn leader_killed_under_contention<S, K, F>(
    clients: Vec<Arc<S>>,
    store: Arc<DynFencedStore>,
    namespace: &str,
    settings: LeaderKillSettings,
    kill: K,
) -> Result<LeaderKillReport, String>
where
    S: LockService<Fencing = Fenced> + ?Sized,
    K: FnOnce() -> F,
    F: Future<Output = Result<String, String>>,
{
    let keys = (0..settings.keys.max(1))
        .map(|i| ResourceKey::new(namespace, format!("k{i}")))
        .collect::<palisade_core::Result<Vec<_>>>()
        .map_err(|e| e.to_string())?;
    let history: Arc<Mutex<BTreeMap<String, Vec<Hold>>>> = Arc::default();
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let lost = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for (w, locks) in clients.into_iter().enumerate() {
        let (store, history, errors, lost, stop) =
            (Arc::clone(&store), Arc::clone(&history), Arc::clone(&errors), Arc::clone(&lost), Arc::clone(&stop));
        let key = keys[w % keys.len()].clone();
        let record = format!("{namespace}/{}", key.id());
        let ttl = settings.ttl;
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let lease = match locks.lock(&key, LockOptions::ttl(ttl).wait(Duration::from_secs(3))).await {
                    Ok(l) => l,
                    Err(e) => {
                        errors.lock().unwrap_or_else(PoisonError::into_inner).push(e.to_string());
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let from = Instant::now();
                tokio::time::sleep(Duration::from_millis(10)).await;
                let batch = WriteBatch::new().put(record.clone(), lease.fence().to_string());
                let wrote_at = match store.write(&lease, &batch).await {
                    Ok(()) => Some(Instant::now()),
                    Err(e) => {
                        errors.lock().unwrap_or_else(PoisonError::into_inner).push(e.to_string());
                        None
                    }
                };
                if lease.is_lost() {
                    lost.fetch_add(1, Ordering::SeqCst);
                }
                // The hold ends when the release is sent (it takes effect somewhere during the
                // call), or at the lease's deadline if that came first.
                let (deadline, fence) = (lease.deadline(), lease.fence());
                let until = Instant::now().min(deadline);
                let _ = lease.release().await;
                let hold = Hold { from, until, fence, wrote_at };
                history.lock().unwrap_or_else(PoisonError::into_inner).entry(record.clone()).or_default().push(hold);
            }
        }));
    }
    let stop_workers = async || {
        stop.store(true, Ordering::SeqCst);
        for w in workers {
            let _ = w.await;
        }
    };
    tokio::time::sleep(settings.before).await;
    let killed = match kill().await {
        Ok(what) => what,
        Err(e) => {
            stop_workers().await;
            return Err(e);
        }
    };
    let killed_at = Instant::now();
    let election = killed_at + settings.settle;
    let writes_after = |history: &BTreeMap<String, Vec<Hold>>| {
        history.values().flatten().filter(|h| h.wrote_at.is_some() && h.from >= election).count()
    };
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let waited = killed_at.elapsed();
        let landed = writes_after(&history.lock().unwrap_or_else(PoisonError::into_inner));
        if (waited >= settings.after && landed >= settings.writes_after)
            || waited >= settings.after.max(Duration::from_secs(30))
        {
            break;
        }
    }
    stop_workers().await;

    let history = history.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let mut report = LeaderKillReport {
        killed,
        overlaps: Vec::new(),
        stale_accepted: 0,
        wrong_final_values: Vec::new(),
        writes: history.values().flatten().filter(|h| h.wrote_at.is_some()).count(),
        writes_after_election: writes_after(&history),
        first_write_after_kill: history
            .values()
            .flatten()
            .filter_map(|h| h.wrote_at)
            .filter(|t| *t > killed_at)
            .min()
            .map(|t| t - killed_at),
        first_grant_after_kill: history
            .values()
            .flatten()
            .filter(|h| h.wrote_at.is_some() && h.from > killed_at)
            .map(|h| h.from - killed_at)
            .min(),
        leases_lost: lost.load(Ordering::SeqCst),
        errors: errors.lock().unwrap_or_else(PoisonError::into_inner).clone(),
    };
    for (record, mut holds) in history {
        holds.sort_by_key(|h| h.from);
        for pair in holds.windows(2) {
            if pair[1].from < pair[0].until {
                report.overlaps.push(format!("{record}: {:?} and {:?}", pair[0], pair[1]));
            }
        }
        // In the order the store accepted them.
        let mut written: Vec<(Instant, Fence)> = holds.iter().filter_map(|h| Some((h.wrote_at?, h.fence))).collect();
        written.sort_by_key(|(at, _)| *at);
        report.stale_accepted += written.windows(2).filter(|w| w[1].1 <= w[0].1).count() as u64;
        let Some((_, last)) = written.last() else { continue };
        let stored = store.read(&record).await.map_err(|e| e.to_string())?;
        let stored = stored.map(|r| String::from_utf8_lossy(&r.value).into_owned());
        if stored.as_deref() != Some(&last.to_string()) {
            report.wrong_final_values.push(format!("{record}: stored {stored:?}, last accepted fence {last}"));
        }
    }
    Ok(report)
}

/// **Leader killed under contention** (catalogue C35), as a suite scenario: four clients of
/// `lf`'s cluster contend for two keys and write through `sf`'s store while the factory kills
/// the cluster's leader ([`LockServiceFactory::kill_leader`]); [`LeaderKillReport::check`] must
/// pass: no two holds of a key overlapped, the store accepted no fence that did not increase,
/// every record ends with its last accepted write, and locks were usable again after the
/// election.
pub async fn leader_killed<L, S>(ctx: &Ctx, lf: &L, sf: &S) -> Outcome
where
    L: LockServiceFactory,
    L::Service: LockService<Fencing = Fenced>,
    S: FencedStoreFactory,
{
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(attempt!(ctx, lf.client().await, "a cluster client"));
    }
    let store: Arc<DynFencedStore> = attempt!(ctx, sf.client().await, "a store client");
    let ns = Namespace::new();
    let kill = || async { lf.kill_leader().await.map_err(|e| e.report().to_string()) };
    let report = leader_killed_under_contention(clients, store, ns.name(), LeaderKillSettings::default(), kill).await;
    let report = match report {
        Ok(report) => report,
        Err(e) => return Err(ctx.fail(format!("the leader could not be killed: {e}"))),
    };
    ctx.note(format!(
        "leader {} killed; {} writes, {} after the election; {} errors meanwhile",
        report.killed,
        report.writes,
        report.writes_after_election,
        report.errors.len()
    ));
    if let Err(broken) = report.check() {
        return Err(ctx.fail(broken));
    }
    Ok(ctx.report())
}
