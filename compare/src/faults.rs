//! The fault matrix: one cell per scenario for a lock service × store pair.

use palisade::LockOptions;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use palisade::{
    AnyLockService, DynFencedStore, DynLockService, DynUnfencedLockService, ErrorKind, FencedStoreExt, Lease,
    LockServiceExt, ResourceKey, WriteBatch,
};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::time::Instant;

use palisade_conformance::cluster::{LeaderKillReport, LeaderKillSettings, leader_killed_under_contention};
use palisade_conformance::partition::{Members, holder_cut_off_measured, leader_cut_off_under_contention};
use palisade_conformance::{Ctx, Timing, lock_factory, store_factory};
use palisade_lab::netns::{Host, Lab};
use palisade_lab::servers::{EtcdCluster, LoopbackServer, PostgresServer, RedisSentinels, Site, ZkEnsemble};

use crate::local::{Cluster, Local, zk_classpath};
use crate::target::Backend;

/// One cell of the fault matrix.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub scenario: &'static str,
    /// `false`: not run here (the note says why).
    pub ran: bool,
    /// Writes the store accepted from a holder after a later holder's write had been accepted.
    pub stale_accepted: Option<u64>,
    /// Extra audit records: a job's effect applied more than once.
    pub duplicates: Option<u64>,
    /// From the fault to another holder's lock (ms).
    pub proceed_ms: Option<f64>,
    /// Whether the faulted holder's lost signal had fired by the time it wrote.
    pub lost_fired: Option<bool>,
    /// No stale write accepted and no duplicate.
    pub safe: Option<bool>,
    pub note: String,
}

impl Cell {
    pub fn skipped(scenario: &'static str, why: impl Into<String>) -> Cell {
        Cell {
            scenario,
            ran: false,
            stale_accepted: None,
            duplicates: None,
            proceed_ms: None,
            lost_fired: None,
            safe: None,
            note: why.into(),
        }
    }

    fn failed(scenario: &'static str, why: impl std::fmt::Display) -> Cell {
        Cell { ran: true, ..Cell::skipped(scenario, format!("error: {why}")) }
    }
}

/// A lease of either kind, written through the store the only way it can be.
enum Holder {
    Fenced(Lease<DynLockService>),
    Unfenced(Lease<DynUnfencedLockService>),
}

impl Holder {
    async fn take(locks: &AnyLockService, key: &ResourceKey, ttl: Duration) -> palisade::Result<Holder> {
        let wait = Duration::from_secs(120);
        Ok(match locks {
            AnyLockService::Fenced(l) => Holder::Fenced(l.lock(key, LockOptions::ttl(ttl).wait(wait)).await?),
            AnyLockService::Unfenced(l) => Holder::Unfenced(l.lock(key, LockOptions::ttl(ttl).wait(wait)).await?),
        })
    }

    async fn write(&self, store: &DynFencedStore, batch: &WriteBatch) -> palisade::Result<()> {
        match self {
            Holder::Fenced(lease) => store.write(lease, batch).await,
            Holder::Unfenced(_) => store.apply_unfenced(batch).await,
        }
    }

    async fn release(self) {
        let _ = match self {
            Holder::Fenced(l) => l.release().await,
            Holder::Unfenced(l) => l.release().await,
        };
    }
}

fn namespace() -> String {
    let mut b = [0u8; 4];
    let _ = getrandom::fill(&mut b);
    format!("cmp{:02x}{:02x}{:02x}{:02x}", b[0], b[1], b[2], b[3])
}

fn who(ns: &str, name: &str) -> WriteBatch {
    WriteBatch::new()
        .put(format!("{ns}/data"), name.as_bytes().to_vec())
        .put(format!("{ns}/audit/{name}"), name.as_bytes().to_vec())
}

async fn audit_count(store: &DynFencedStore, ns: &str) -> palisade::Result<u64> {
    Ok(store.list(&format!("{ns}/audit/")).await?.len() as u64)
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

/// The worker process, up to its "acquired" line.
struct Worker {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    pid: Pid,
}

impl Worker {
    async fn start(lock: &str, store: &str, ns: &str, ttl: Duration) -> Result<Worker, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut child = tokio::process::Command::new(exe)
            .args(["worker", "--lock", lock, "--store", store, "--ns", ns, "--ttl-ms", &ttl.as_millis().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start the worker: {e}"))?;
        let stdout = child.stdout.take().ok_or("no worker stdout")?;
        let pid = Pid::from_raw(child.id().and_then(|id| i32::try_from(id).ok()).ok_or("no worker pid")?);
        let mut worker = Worker { child, lines: BufReader::new(stdout).lines(), pid };
        let line = worker.line().await?;
        if !line.starts_with("acquired") {
            return Err(format!("worker said {line:?}"));
        }
        Ok(worker)
    }

    async fn line(&mut self) -> Result<String, String> {
        match tokio::time::timeout(Duration::from_secs(120), self.lines.next_line()).await {
            Ok(Ok(Some(line))) => Ok(line),
            Ok(Ok(None)) => Err("the worker exited early".into()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("the worker said nothing for 120 s".into()),
        }
    }

    fn signal(&self, signal: Signal) -> Result<(), String> {
        kill(self.pid, signal).map_err(|e| format!("{signal}: {e}"))
    }
}

/// A worker frozen with SIGSTOP right after it took the lock, past its TTL; another holder takes
/// the lock and writes; the worker is thawed and writes too.
pub async fn paused(lock: &str, store_url: &str, store: &Arc<DynFencedStore>, ttl: Duration) -> Cell {
    const S: &str = "paused";
    let ns = namespace();
    let mut worker = match Worker::start(lock, store_url, &ns, ttl).await {
        Ok(w) => w,
        Err(e) => return Cell::failed(S, e),
    };
    if let Err(e) = worker.signal(Signal::SIGSTOP) {
        return Cell::failed(S, e);
    }
    let stopped = Instant::now();
    let result = async {
        let locks = palisade::connect_any_lock(lock).await?;
        let key = ResourceKey::new(ns.clone(), "fault")?;
        let b = Holder::take(&locks, &key, ttl).await?;
        let proceed = stopped.elapsed();
        b.write(store, &who(&ns, "B")).await?;
        Ok::<_, palisade::Error>((b, proceed))
    }
    .await;
    let _ = worker.signal(Signal::SIGCONT);
    let (b, proceed) = match result {
        Ok(r) => r,
        Err(e) => return Cell::failed(S, e),
    };
    if let Some(stdin) = worker.child.stdin.as_mut() {
        let _ = stdin.write_all(b"go\n").await;
    }
    let wrote = match worker.line().await {
        Ok(line) => line,
        Err(e) => return Cell::failed(S, e),
    };
    let _ = worker.child.wait().await;
    b.release().await;
    let stale = u64::from(wrote.starts_with("wrote ok"));
    let duplicates = match audit_count(store, &ns).await {
        Ok(n) => n.saturating_sub(1),
        Err(e) => return Cell::failed(S, e),
    };
    Cell {
        scenario: S,
        ran: true,
        stale_accepted: Some(stale),
        duplicates: Some(duplicates),
        proceed_ms: Some(ms(proceed)),
        lost_fired: Some(wrote.contains("lost=true")),
        safe: Some(stale == 0 && duplicates == 0),
        note: format!("thawed worker: {}", wrote.trim_start_matches("wrote ")),
    }
}

/// A worker killed with SIGKILL right after it took the lock; how long until another proceeds.
pub async fn killed(lock: &str, store_url: &str, store: &Arc<DynFencedStore>, ttl: Duration) -> Cell {
    const S: &str = "killed";
    let ns = namespace();
    let mut worker = match Worker::start(lock, store_url, &ns, ttl).await {
        Ok(w) => w,
        Err(e) => return Cell::failed(S, e),
    };
    if let Err(e) = worker.signal(Signal::SIGKILL) {
        return Cell::failed(S, e);
    }
    let killed = Instant::now();
    let _ = worker.child.wait().await;
    let result = async {
        let locks = palisade::connect_any_lock(lock).await?;
        let b = Holder::take(&locks, &ResourceKey::new(ns.clone(), "fault")?, ttl).await?;
        let proceed = killed.elapsed();
        b.write(store, &who(&ns, "B")).await?;
        b.release().await;
        Ok::<_, palisade::Error>((proceed, audit_count(store, &ns).await?))
    }
    .await;
    match result {
        Ok((proceed, audits)) => Cell {
            scenario: S,
            ran: true,
            stale_accepted: Some(0),
            duplicates: Some(audits.saturating_sub(1)),
            proceed_ms: Some(ms(proceed)),
            lost_fired: None,
            safe: Some(audits == 1),
            note: "next holder after the killed one's lease ran out".into(),
        },
        Err(e) => Cell::failed(S, e),
    }
}

/// The lock server restarts, keeping its data (`keep_data`, cell `restart_with_data`) or
/// losing it (cell `restart`; see [`Local::restart`]), while A holds the lock and has written;
/// B takes the lock (with `lock_checked` for fenced services, which repairs a lost counter) and
/// writes; then A, unaware, writes again.
pub async fn restart(
    local: Option<&mut Local>,
    backend: Backend,
    lock: &str,
    store: &Arc<DynFencedStore>,
    ttl: Duration,
    keep_data: bool,
) -> Cell {
    let s: &'static str = if keep_data { "restart_with_data" } else { "restart" };
    let Some(local) = local else { return Cell::skipped(s, "not run: the server was not started by --local") };
    let ns = namespace();
    let run = async {
        let key = ResourceKey::new(ns.clone(), "fault")?;
        let a_locks = palisade::connect_any_lock(lock).await?;
        // With its data kept the server still holds A's lock: B waits out A's TTL. Without it,
        // A's long TTL is a holder that still believes it holds a lock the server forgot.
        let a = Holder::take(&a_locks, &key, if keep_data { ttl } else { ttl * 10 }).await?;
        a.write(store, &who(&ns, "A1")).await?;
        let what = match local.restart(backend, keep_data).await {
            Some(Ok(what)) => what,
            Some(Err(e)) => return Err(palisade::Error::new(ErrorKind::Unavailable, "compare", e)),
            None => return Ok(None),
        };
        let restarted = Instant::now();
        let b_locks = palisade::connect_any_lock(lock).await?;
        let mut note = what;
        let (b_wrote, proceed) = match &b_locks {
            AnyLockService::Fenced(locks) => {
                match locks.lock_checked(&**store, &key, LockOptions::ttl(ttl).wait(Duration::from_secs(60))).await {
                    Ok(lease) => {
                        let proceed = restarted.elapsed();
                        let ok = store.write(&lease, &who(&ns, "B")).await.is_ok();
                        let _ = lease.release().await;
                        (ok, Some(proceed))
                    }
                    Err(e) if e.kind() == ErrorKind::FenceRegression => {
                        note.push_str(&format!("; B blocked: the service could not repair its fences ({e})"));
                        (false, None)
                    }
                    Err(e) => return Err(e),
                }
            }
            AnyLockService::Unfenced(_) => {
                let b = Holder::take(&b_locks, &key, ttl).await?;
                let proceed = restarted.elapsed();
                let ok = b.write(store, &who(&ns, "B")).await.is_ok();
                b.release().await;
                (ok, Some(proceed))
            }
        };
        let a_again = a.write(store, &who(&ns, "A2")).await;
        a.release().await;
        let stale = u64::from(b_wrote && a_again.is_ok());
        Ok(Some((stale, proceed, note)))
    }
    .await;
    match run {
        Ok(Some((stale, proceed, note))) => Cell {
            scenario: s,
            ran: true,
            stale_accepted: Some(stale),
            duplicates: Some(stale),
            proceed_ms: proceed.map(ms),
            lost_fired: None,
            safe: Some(stale == 0),
            note,
        },
        Ok(None) => Cell::skipped(s, "not run: no server to restart (an in-process service, or a file)"),
        Err(e) => Cell::failed(s, e),
    }
}

/// A 3-member cluster's leader killed while four clients contend for one lock and write
/// (`palisade_conformance::cluster`, the scenario the cluster tests assert on).
pub async fn leader_kill(backend: Backend, store: &Arc<DynFencedStore>, session_s: u64, quick: bool) -> Cell {
    const S: &str = "leader_kill";
    let Some(started) = Cluster::start(backend, session_s) else {
        return Cell::skipped(S, "not run: not a replicated service");
    };
    let (mut cluster, url) = match started {
        Ok(c) => c,
        Err(e) => return Cell::failed(S, e),
    };
    let clients = match contenders(&url).await {
        Ok(c) => c,
        Err(e) => return Cell::failed(S, e),
    };
    // After the kill: at least `after`, and until a few writes landed (an election with session
    // expiry can take seconds), at most 30 s.
    let settings = contention_settings(quick);
    let cluster = &mut cluster;
    let run = leader_killed_under_contention(clients, Arc::clone(store), &namespace(), settings, async || {
        cluster.kill_leader().await
    })
    .await;
    match run {
        Ok(report) => contention_cell(S, &report, String::new()),
        Err(e) => Cell::failed(S, e),
    }
}

/// Redis behind Sentinel (master, replica, three Sentinels): the master killed with SIGKILL
/// while four clients contend for one lock and write (the leader-kill run, with the
/// Sentinel failover as the fault). `next in` = from the kill to the first lock granted after
/// it whose write landed.
pub async fn sentinel_failover(backend: Backend, store: &Arc<DynFencedStore>, quick: bool) -> Cell {
    const S: &str = "failover";
    if backend != Backend::Redis {
        return Cell::skipped(S, "not run: Sentinel failover is Redis's");
    }
    let mut group = match RedisSentinels::start("redis-server") {
        Ok(g) => g,
        Err(e) => return Cell::failed(S, format!("cannot start Redis with Sentinels: {e}")),
    };
    let url = group.url();
    let clients = match contenders(&url).await {
        Ok(c) => c,
        Err(e) => return Cell::failed(S, e),
    };
    let settings = contention_settings(quick);
    let group = &mut group;
    let run = leader_killed_under_contention(clients, Arc::clone(store), &namespace(), settings, async || {
        group.kill_master();
        Ok("the master (SIGKILL)".to_string())
    })
    .await;
    match run {
        Ok(report) => contention_cell(S, &report, String::new()),
        Err(e) => Cell::failed(S, e),
    }
}

/// The four independent clients of `url` that contend in the leader-kill, failover and
/// leader-cut cells.
async fn contenders(url: &str) -> palisade::Result<Vec<Arc<DynLockService>>> {
    let mut clients = Vec::with_capacity(4);
    for _ in 0..4 {
        clients.push(palisade::connect_lock(url).await?);
    }
    Ok(clients)
}

/// The contention of the leader-kill and failover cells: one key, four clients, 2 s TTLs; at
/// least `after` past the fault, and until a few writes landed (at most 30 s).
fn contention_settings(quick: bool) -> LeaderKillSettings {
    LeaderKillSettings {
        keys: 1,
        before: Duration::from_secs(if quick { 1 } else { 2 }),
        settle: Duration::ZERO,
        after: Duration::from_secs(if quick { 3 } else { 8 }),
        writes_after: 5,
        ttl: Duration::from_secs(2),
    }
}

fn contention_cell(scenario: &'static str, report: &LeaderKillReport, more: String) -> Cell {
    Cell {
        scenario,
        ran: true,
        stale_accepted: Some(report.stale_accepted),
        duplicates: Some(report.overlaps.len() as u64),
        proceed_ms: report.first_grant_after_kill.map(ms),
        lost_fired: None,
        safe: Some(report.check().is_ok()),
        note: format!(
            "{}: {} writes accepted, {} after the fault; {} errors; {} leases lost; {} overlapping holds{more}",
            report.killed,
            report.writes,
            report.writes_after_election,
            report.errors.len(),
            report.leases_lost,
            report.overlaps.len()
        ),
    }
}

/// A network partition in namespaces of this machine (`palisade_lab::netns`; needs
/// root). etcd and ZooKeeper: a 3-member cluster, one member per host, its leader cut off
/// while four clients contend (`next in`: from the cut to the first write accepted after it),
/// then healed (it must rejoin, fences above all accepted). Redis and PostgreSQL: a renewing
/// holder on a host of its own, cut off from the server and its store past its TTL
/// (`partition::holder_cut_off`: `next in` from the cut to the contender's grant, which must
/// come after the holder's `safe_until`; the holder's write after the heal must be refused).
pub async fn partition(
    backend: Backend,
    store_url: &str,
    store: &Arc<DynFencedStore>,
    ttl: Duration,
    quick: bool,
) -> Cell {
    const S: &str = "partition";
    let runs_here = matches!(backend, Backend::Redis | Backend::Postgres | Backend::Etcd | Backend::Zookeeper);
    if !runs_here {
        return Cell::skipped(
            S,
            match backend {
                Backend::Redlock => "not run: no fences (see the Redlock partition test for its quorum under a cut)",
                _ => "not run: an in-process service or a file has no network to cut",
            },
        );
    }
    let lab = match Lab::new() {
        Ok(lab) => lab,
        Err(e) => return Cell::skipped(S, format!("not run: {e}")),
    };
    match backend {
        Backend::Etcd | Backend::Zookeeper => leader_cut(&lab, backend, store, quick).await,
        _ => holder_cut(&lab, backend, store_url, ttl).await,
    }
}

async fn leader_cut(lab: &Lab, backend: Backend, store: &Arc<DynFencedStore>, quick: bool) -> Cell {
    const S: &str = "partition";
    let hosts = match (0..3).map(|_| lab.host()).collect::<std::io::Result<Vec<Host>>>() {
        Ok(h) => h,
        Err(e) => return Cell::failed(S, e),
    };
    let sites: Vec<Site> = hosts.iter().map(Site::host).collect();
    let (members, url): (Box<dyn Members + Send + Sync>, String) = match backend {
        Backend::Etcd => match EtcdCluster::start_at("etcd", &sites) {
            Ok(c) => {
                let url = format!("{}?session_ttl_s=2", c.url());
                (Box::new(c), url)
            }
            Err(e) => return Cell::failed(S, format!("cannot start an etcd cluster: {e}")),
        },
        _ => match ZkEnsemble::start_at(&zk_classpath(), &sites) {
            Ok(c) => {
                let url = format!("{}?session_timeout_ms=2000", c.url());
                (Box::new(c), url)
            }
            Err(e) => return Cell::failed(S, format!("cannot start a ZooKeeper ensemble: {e}")),
        },
    };
    let clients = match contenders(&url).await {
        Ok(c) => c,
        Err(e) => return Cell::failed(S, e),
    };
    let run = leader_cut_off_under_contention(
        clients,
        Arc::clone(store),
        &namespace(),
        contention_settings(quick),
        &*members,
        &hosts,
    )
    .await;
    match run {
        Ok(report) => {
            let rejoined = report
                .rejoined_after
                .map_or("; did not rejoin".to_string(), |d| format!("; healed, it rejoined in {:.0} ms", ms(d)));
            let mut cell = contention_cell(S, &report.contention, rejoined);
            if let Err(e) = report.check() {
                cell.note.push_str(&format!("; check failed: {e}"));
            }
            if report.fence_after_heal.is_some_and(|(after, highest)| after <= highest) {
                cell.safe = Some(false);
            }
            cell
        }
        Err(e) => Cell::failed(S, e),
    }
}

async fn holder_cut(lab: &Lab, backend: Backend, store_url: &str, ttl: Duration) -> Cell {
    const S: &str = "partition";
    let gateway = Site::address(lab.gateway());
    // Servers of the cell's own on the lab's gateway, which the holder's host reaches; a
    // SQLite store is a file, which it reaches anyway.
    let postgres = if backend == Backend::Postgres || !store_url.starts_with("sqlite:") {
        match PostgresServer::start_at(&gateway) {
            Ok(pg) => Some(pg),
            Err(e) => return Cell::failed(S, format!("cannot start PostgreSQL on the lab: {e}")),
        }
    } else {
        None
    };
    let redis = if backend == Backend::Redis {
        match LoopbackServer::redis_at(&gateway, "redis-server", &[]) {
            Ok(redis) => Some(redis),
            Err(e) => return Cell::failed(S, format!("cannot start Redis on the lab: {e}")),
        }
    } else {
        None
    };
    // The PostgreSQL lock service locks in its store's database.
    let lock_url = match (&redis, &postgres) {
        (Some(redis), _) => redis.redis_url(),
        (None, Some(pg)) => pg.url(),
        (None, None) => return Cell::failed(S, "no server to cut the holder off from"),
    };
    let store_url = postgres.as_ref().map_or_else(|| store_url.to_string(), PostgresServer::url);
    let host = match lab.host() {
        Ok(h) => h,
        Err(e) => return Cell::failed(S, e),
    };
    // Redis expires on time to the millisecond; PostgreSQL's waiters poll.
    let margin = if backend == Backend::Redis { Duration::from_millis(100) } else { Duration::from_millis(500) };
    let locks = lock_factory(Timing::new(ttl, margin), move || {
        let url = lock_url.clone();
        async move { Ok(Arc::new(palisade::connect_lock(&url).await?)) }
    });
    let stores = store_factory(move || {
        let url = store_url.clone();
        async move { Ok(Arc::new(palisade::connect_store(&url).await?)) }
    });
    let ctx = Ctx::new("holder_cut_off", "compare");
    match holder_cut_off_measured(&ctx, &host, Arc::new(locks), Arc::new(stores)).await {
        Ok((_, figures)) => Cell {
            scenario: S,
            ran: true,
            stale_accepted: Some(0),
            duplicates: Some(0),
            proceed_ms: Some(ms(figures.cut_to_contender_grant)),
            lost_fired: Some(true),
            safe: Some(true),
            note: format!(
                "a renewing holder cut off past its TTL: the contender was granted {:.0} ms after the cut (after the \
                 holder's safe_until); healed, the holder's write was refused as stale {:.0} ms after the heal",
                ms(figures.cut_to_contender_grant),
                ms(figures.heal_to_answer)
            ),
        },
        Err(failure) => {
            let text = failure.to_string();
            let mut cell = Cell::failed(S, &text);
            // A stale write that landed is unsafe; any other failure is only reported.
            if text.contains("was accepted after") {
                cell.safe = Some(false);
                cell.stale_accepted = Some(1);
            }
            cell
        }
    }
}
