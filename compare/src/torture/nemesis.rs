//! The run: the pair it judges, the servers it may own, the client processes and their fault
//! proxies, and the nemesis that plays the schedule against them while their events are
//! collected.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use palisade::AnyLockService;
use palisade_conformance::FaultProxy;
use palisade_conformance::proxy::proxy_url_on;
use palisade_history::{Call, Event, Outcome};
use palisade_lab::netns::{Host, Lab};
use palisade_lab::servers::{EtcdCluster, LoopbackServer, PostgresServer, RedisSentinels, Restart, ZkEnsemble};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::schedule::{Fault, Side, Step};
use super::{CALL_MS, INITIAL_STOCK, LIST_MS_PER_RECORD, TortureArgs, now, register_key, resource_name, sku_name};

/// The pair under test, as the run found it.
pub struct Target {
    /// The lock service's declared `expiry_delay`: how long past its TTL a lock may stay held.
    pub expiry_delay: Duration,
    pub lock_proxied: bool,
    pub store_proxied: bool,
}

impl Target {
    /// Connects to both once: the lock service must be fenced, and both must be reachable
    /// from other processes.
    pub async fn check(lock: &str, store: &str) -> Result<Target, String> {
        for (what, url) in [("lock service", lock), ("store", store)] {
            if url.starts_with("memory:") {
                return Err(format!(
                    "the {what} {url} lives inside one process, and the torture's clients are processes of their \
                     own: give a server's URL"
                ));
            }
        }
        let unfenced = || {
            format!(
                "{} issues no fence (an efficiency lock): the torture judges fenced pairs, whose store can refuse a \
                 stale holder",
                crate::target::shown(lock)
            )
        };
        let expiry_delay = if let Some(addr) = lock.strip_prefix("relay://") {
            let addr = super::relay_addr(addr).map_err(|e| e.to_string())?;
            let capabilities =
                palisade_conformance::relay::capabilities(addr).await.map_err(|e| format!("{lock}: {e}"))?;
            if !capabilities.issues_fences() {
                return Err(unfenced());
            }
            capabilities.expiry_delay
        } else {
            match palisade::connect_any_lock(lock).await.map_err(|e| e.to_string())? {
                AnyLockService::Fenced(locks) => locks.capabilities().expiry_delay,
                AnyLockService::Unfenced(_) => return Err(unfenced()),
            }
        };
        super::connect_store(store).await.map_err(|e| format!("{}: {e}", crate::target::shown(store)))?;
        Ok(Target {
            expiry_delay,
            lock_proxied: !lock.starts_with("sqlite:") && !dials_announced_addresses(lock),
            store_proxied: store.starts_with("postgres")
                || store.starts_with("dynamodb:")
                || store.starts_with("relay:"),
        })
    }
}

/// Whether the clients of this lock service dial the addresses its servers announce (Redis
/// behind Sentinels names the master, a Redis Cluster's nodes name each other), not the ones
/// the URL gives: proxies in front of the URL's hosts would see almost none of their traffic.
pub fn dials_announced_addresses(url: &str) -> bool {
    url.starts_with("redis+sentinel:")
        || url.starts_with("rediss+sentinel:")
        || url.starts_with("redis+cluster:")
        || url.starts_with("rediss+cluster:")
}

/// Puts fault proxies listening on `listen` in front of the servers a URL names; a DynamoDB URL
/// names its server in its `endpoint` parameter.
async fn proxied(listen: IpAddr, url: &str) -> Result<(String, Vec<FaultProxy>), String> {
    if let Some((head, query)) = url.split_once('?').filter(|_| url.starts_with("dynamodb:")) {
        let mut proxies = Vec::new();
        let mut params = Vec::new();
        for param in query.split('&') {
            match param.strip_prefix("endpoint=") {
                Some(endpoint) => {
                    let (rewritten, mut p) = proxy_url_on(listen, endpoint).await.map_err(|e| e.to_string())?;
                    proxies.append(&mut p);
                    params.push(format!("endpoint={rewritten}"));
                }
                None => params.push(param.to_string()),
            }
        }
        if proxies.is_empty() {
            return Err("a dynamodb:// URL without ?endpoint= names no server the torture can reach".into());
        }
        return Ok((format!("{head}?{}", params.join("&")), proxies));
    }
    proxy_url_on(listen, url).await.map_err(|e| e.to_string())
}

/// The servers of a `--local` run: started here, on loopback with data of their own, and
/// stopped on drop.
pub struct LocalServers {
    redis: Option<LoopbackServer>,
    /// `sentinel`: a master, its replica and three Sentinels.
    sentinels: Option<RedisSentinels>,
    etcd: Option<LoopbackServer>,
    /// `etcd3`: three members.
    etcd_cluster: Option<EtcdCluster>,
    /// `zk`: one server; `zk3`: three.
    zk: Option<ZkEnsemble>,
    postgres: Option<PostgresServer>,
    _sqlite_dir: Option<tempfile::TempDir>,
    lock_kind: String,
    pub lock_url: String,
    pub store_url: String,
    pub lock_restartable: bool,
    pub lock_loses_data: bool,
    pub store_restartable: bool,
    /// The lock service is a cluster whose leader the schedule may kill.
    pub lock_has_leader: bool,
    /// The lock service is Redis behind Sentinels, which the schedule may fail over.
    pub lock_fails_over: bool,
}

impl LocalServers {
    /// Starts a server for each side named by its kind (`redis`, `etcd`, `zk`, `postgres`,
    /// `sqlite`, the three-member clusters `etcd3` and `zk3`, and `sentinel`: a Redis master and
    /// replica behind three Sentinels); a side given as a URL is
    /// used as it is, and is not the run's to pause or restart. A cluster's faults are its
    /// leader's: killed, and back with its data.
    pub fn start(lock: &str, store: &str) -> Result<LocalServers, String> {
        let io = |what: &str, e: std::io::Error| {
            format!("cannot start {what}: {e} (run scripts/services up once to install the servers)")
        };
        let mut servers = LocalServers {
            redis: None,
            sentinels: None,
            etcd: None,
            etcd_cluster: None,
            zk: None,
            postgres: None,
            _sqlite_dir: None,
            lock_kind: lock.to_string(),
            lock_url: String::new(),
            store_url: String::new(),
            lock_restartable: ["redis", "etcd", "zk", "postgres"].contains(&lock),
            lock_loses_data: ["redis", "etcd", "zk", "postgres", "sqlite"].contains(&lock),
            store_restartable: store == "postgres",
            lock_has_leader: ["etcd3", "zk3"].contains(&lock),
            lock_fails_over: lock == "sentinel",
        };
        if lock == "postgres" || store == "postgres" {
            servers.postgres = Some(PostgresServer::start().map_err(|e| io("PostgreSQL", e))?);
        }
        let sqlite_url = if lock == "sqlite" || store == "sqlite" {
            let dir = tempfile::tempdir().map_err(|e| io("a SQLite directory", e))?;
            let url = format!("sqlite://{}/torture.db?synchronous=normal", dir.path().display());
            servers._sqlite_dir = Some(dir);
            url
        } else {
            String::new()
        };
        let postgres_url = servers.postgres.as_ref().map(PostgresServer::url).unwrap_or_default();
        servers.store_url = match store {
            "sqlite" => sqlite_url.clone(),
            "postgres" => postgres_url.clone(),
            url if url.contains("://") => url.to_string(),
            other => return Err(format!("--local starts a sqlite or postgres store, not {other:?}")),
        };
        servers.lock_url = match lock {
            "redis" => {
                // Every acknowledged write in the append-only file before it is acknowledged:
                // a restart keeps every lock and fence (the deployment the Redis docs advise
                // for fences that survive), and only the data-loss fault loses locks.
                let redis = LoopbackServer::redis("redis-server", &["--appendonly", "yes", "--appendfsync", "always"])
                    .map_err(|e| io("redis-server", e))?;
                let url = redis.redis_url();
                servers.redis = Some(redis);
                url
            }
            "sentinel" => {
                let group = RedisSentinels::start("redis-server").map_err(|e| io("Redis with Sentinels", e))?;
                let url = group.url();
                servers.sentinels = Some(group);
                url
            }
            "etcd" => {
                let etcd = LoopbackServer::etcd("etcd").map_err(|e| io("etcd", e))?;
                let url = format!("{}?session_ttl_s=2", etcd.etcd_url());
                servers.etcd = Some(etcd);
                url
            }
            "zk" | "zk3" => {
                let size = if lock == "zk3" { 3 } else { 1 };
                let zk = ZkEnsemble::start(&crate::local::zk_classpath(), size).map_err(|e| io("ZooKeeper", e))?;
                let url = format!("{}?session_timeout_ms=2000", zk.url());
                servers.zk = Some(zk);
                url
            }
            "etcd3" => {
                let etcd = EtcdCluster::start("etcd", 3).map_err(|e| io("an etcd cluster", e))?;
                let url = format!("{}?session_ttl_s=2", etcd.url());
                servers.etcd_cluster = Some(etcd);
                url
            }
            "postgres" => postgres_url,
            "sqlite" => sqlite_url,
            url if url.contains("://") => url.to_string(),
            other => {
                return Err(format!(
                    "--local starts a redis, sentinel, etcd, etcd3, zk, zk3, postgres or sqlite lock service, not \
                     {other:?}"
                ));
            }
        };
        Ok(servers)
    }

    /// The processes to freeze to pause a side's server (a PostgreSQL server is its postmaster
    /// and every session's process).
    fn pids(&self, side: Side) -> Vec<u32> {
        let main = match (side, self.lock_kind.as_str()) {
            (Side::Lock, "redis") => self.redis.as_ref().and_then(LoopbackServer::pid),
            (Side::Lock, "etcd") => self.etcd.as_ref().and_then(LoopbackServer::pid),
            (Side::Lock, "zk") => self.zk.as_ref().and_then(|z| z.pid(0)),
            (Side::Lock, "postgres") | (Side::Store, _) => self.postgres.as_ref().and_then(PostgresServer::pid),
            _ => None,
        };
        main.map(with_descendants).unwrap_or_default()
    }

    /// Restarts a side's server with its data.
    async fn restart(&mut self, side: Side) -> Result<(), String> {
        let e = |e: std::io::Error| e.to_string();
        match (side, self.lock_kind.as_str()) {
            (Side::Lock, "redis") => {
                let redis = self.redis.as_mut().ok_or("no Redis")?;
                tokio::task::block_in_place(|| redis.restart()).map_err(e)
            }
            (Side::Lock, "etcd") => {
                let etcd = self.etcd.as_mut().ok_or("no etcd")?;
                tokio::task::block_in_place(|| etcd.restart().and_then(|()| etcd.wait_etcd_healthy())).map_err(e)
            }
            (Side::Lock, "zk") => {
                let zk = self.zk.as_mut().ok_or("no ZooKeeper")?;
                tokio::task::block_in_place(|| zk.restart_as(Restart::KeepData)).map_err(e)
            }
            (Side::Lock, "postgres") | (Side::Store, _) => {
                let pg = self.postgres.as_mut().ok_or("no PostgreSQL")?;
                tokio::task::block_in_place(|| pg.restart_as(Restart::KeepData)).map_err(e)
            }
            _ => Err(format!("the {side} cannot be restarted here")),
        }
    }

    /// Kills the lock service's leader (waiting up to a few seconds for one to be elected, as
    /// after an earlier kill); returns which member it was.
    async fn kill_leader(&mut self) -> Result<usize, String> {
        let within = Duration::from_secs(10);
        let e = |e: std::io::Error| e.to_string();
        if let Some(etcd) = self.etcd_cluster.as_mut() {
            return etcd.kill_leader(within).await.map_err(e);
        }
        match self.zk.as_mut() {
            Some(zk) if self.lock_kind == "zk3" => zk.kill_leader(within).await.map_err(e),
            _ => Err("the lock service has no leader to kill here".into()),
        }
    }

    /// Fails the lock service's Redis over to its replica (waiting as long as the Sentinels
    /// may take to allow another failover); returns which server was killed.
    async fn fail_over(&mut self) -> Result<usize, String> {
        let group = self.sentinels.as_mut().ok_or("the lock service has no Sentinels here")?;
        tokio::task::block_in_place(|| group.fail_over(Duration::from_secs(30))).map_err(|e| e.to_string())
    }

    /// Starts server `i` of the Sentinels' group again, and waits until it is the master's
    /// replica (what the next failover needs).
    async fn rejoin(&mut self, i: usize) -> Result<(), String> {
        let group = self.sentinels.as_mut().ok_or("the lock service has no Sentinels here")?;
        tokio::task::block_in_place(|| group.restart_server(i, Duration::from_secs(30))).map_err(|e| e.to_string())
    }

    /// Starts member `i` of the lock service's cluster again, with its data.
    async fn restart_member(&mut self, i: usize) -> Result<(), String> {
        let e = |e: std::io::Error| e.to_string();
        if let Some(etcd) = self.etcd_cluster.as_mut() {
            return tokio::task::block_in_place(|| etcd.restart_member(i)).map_err(e);
        }
        let zk = self.zk.as_mut().ok_or("no ZooKeeper")?;
        tokio::task::block_in_place(|| zk.restart_member(i)).map_err(e)
    }

    /// The lock service loses every lock and fence counter: Redis, etcd and ZooKeeper restart
    /// with their data wiped; a store-native service's lock table is dropped (then PostgreSQL
    /// restarts), while the store's rows stay.
    async fn lose_lock_data(&mut self) -> Result<(), String> {
        let e = |e: std::io::Error| e.to_string();
        match self.lock_kind.as_str() {
            "redis" => {
                let redis = self.redis.as_mut().ok_or("no Redis")?;
                tokio::task::block_in_place(|| redis.wipe_and_restart()).map_err(e)
            }
            "etcd" => {
                let etcd = self.etcd.as_mut().ok_or("no etcd")?;
                tokio::task::block_in_place(|| etcd.wipe_and_restart().and_then(|()| etcd.wait_etcd_healthy()))
                    .map_err(e)
            }
            "zk" => {
                let zk = self.zk.as_mut().ok_or("no ZooKeeper")?;
                tokio::task::block_in_place(|| zk.restart_as(Restart::LoseData)).map_err(e)
            }
            "postgres" => {
                crate::local::drop_lock_table(&self.lock_url).await?;
                let pg = self.postgres.as_mut().ok_or("no PostgreSQL")?;
                tokio::task::block_in_place(|| pg.restart_as(Restart::KeepData)).map_err(e)
            }
            "sqlite" => crate::local::drop_lock_table(&self.lock_url).await,
            other => Err(format!("the lock service {other} cannot lose its data here")),
        }
    }
}

/// `pid` and every process descended from it (read from /proc).
fn with_descendants(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            // The parent is the second field after the command, which is in parentheses.
            let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok());
            if let Some(ppid) = ppid {
                parents.push((child, ppid));
            }
        }
    }
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        let p = all[i];
        all.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    all
}

/// Sends `signal` to each process; one that is gone already (a server's child that exited and
/// was reaped meanwhile) needs none.
fn signal_all(pids: &[u32], signal: Signal) -> Result<(), String> {
    for &pid in pids {
        let pid = Pid::from_raw(i32::try_from(pid).map_err(|e| e.to_string())?);
        match kill(pid, signal) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => return Err(format!("{signal} to {pid}: {e}")),
        }
    }
    Ok(())
}

/// One client's place: the process now in it, and its own proxies.
struct Slot {
    process: u32,
    child: Option<tokio::process::Child>,
    lock_url: String,
    store_url: String,
    lock_proxies: Vec<FaultProxy>,
    store_proxies: Vec<FaultProxy>,
    /// The client's host, with `--hosts`: every process in this slot runs there.
    host: Option<Host>,
}

impl Slot {
    /// The running client's process id; an error names a client that is gone (killed and not
    /// yet replaced, or exited by itself: its log says why).
    fn running(&mut self) -> Result<u32, String> {
        let exited = self.child.as_mut().map(tokio::process::Child::try_wait);
        match (exited, self.child.as_ref().and_then(tokio::process::Child::id)) {
            (Some(Ok(Some(status))), _) => {
                Err(format!("client process {} exited by itself ({status}; see clients.log)", self.process))
            }
            (_, Some(id)) => Ok(id),
            _ => Err(format!("client process {} is not running", self.process)),
        }
    }

    fn pid(&mut self) -> Result<Pid, String> {
        let id = self.running()?;
        Ok(Pid::from_raw(i32::try_from(id).map_err(|e| e.to_string())?))
    }

    /// The client's host, once the client now in the slot is seen on it: a fault on a host
    /// the client is not on would be no fault at all, so that is an error, not a quiet pass.
    async fn host(&mut self) -> Result<&Host, String> {
        let pid = self.running()?;
        let host = self.host.as_ref().ok_or("a network fault needs --hosts")?;
        // `ip netns exec` becomes the client within milliseconds of a (re)start.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !host.runs(pid).map_err(|e| format!("is client process {pid} on its host? {e}"))? {
            if Instant::now() > deadline {
                return Err(format!("client process {pid} is not on its host {}", host.namespace()));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(host)
    }

    fn proxies(&self, side: Side) -> &[FaultProxy] {
        match side {
            Side::Lock => &self.lock_proxies,
            Side::Store => &self.store_proxies,
        }
    }
}

/// The clients, their proxies, and the events they and the nemesis record.
pub struct Run {
    args: TortureArgs,
    seed: u64,
    plant: Option<&'static str>,
    ns: String,
    store_url: String,
    slots: Vec<Slot>,
    next_process: u32,
    /// Process 0's (this one's) next operation number: the restock before the clients start,
    /// the final reads after they stop.
    next_op: u64,
    events: mpsc::UnboundedSender<Event>,
    collected: mpsc::UnboundedReceiver<Event>,
    /// Events taken from `collected` before the run ended (to count them), in arrival order.
    drained: Vec<Event>,
    readers: Vec<tokio::task::JoinHandle<()>>,
    log: std::fs::File,
    /// With `--clock-jumps`: libfaketime, which every client runs under, and the directory of
    /// the files that tell each slot's clients their wall clock's step.
    clocks: Option<(PathBuf, PathBuf)>,
    /// The bridge the clients' hosts are on, with `--hosts` (dropped after the slots' hosts,
    /// being declared after them).
    _lab: Option<Lab>,
}

impl Run {
    pub async fn start(
        args: &TortureArgs,
        seed: u64,
        plant: Option<&'static str>,
        lock_url: &str,
        store_url: &str,
        target: &Target,
        faketime: Option<PathBuf>,
    ) -> Result<Run, String> {
        let mut b = [0u8; 4];
        let _ = getrandom::fill(&mut b);
        let ns = format!("torture{:08x}", u32::from_le_bytes(b));
        let log_path = args.out.join("clients.log");
        let log = std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        let (events, collected) = mpsc::unbounded_channel();
        let lab = if args.hosts {
            Some(
                tokio::task::block_in_place(Lab::new)
                    .map_err(|e| format!("--hosts: cannot make the network namespaces the clients run in: {e}"))?,
            )
        } else {
            None
        };
        // Where the proxies listen: on the bridge when the clients are on hosts of their own.
        let listen = lab.as_ref().map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), Lab::gateway);
        let mut run = Run {
            args: args.clone(),
            seed,
            plant,
            ns,
            store_url: store_url.to_string(),
            slots: Vec::new(),
            next_process: 1,
            next_op: 0,
            events,
            collected,
            drained: Vec::new(),
            readers: Vec::new(),
            log,
            clocks: faketime.map(|lib| (lib, args.out.join("clocks"))),
            _lab: None,
        };
        if let Some((_, dir)) = &mut run.clocks {
            std::fs::create_dir_all(&*dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            // Absolute: a client on a host of its own, or started elsewhere, finds it too.
            *dir = std::fs::canonicalize(&*dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            for slot in 0..run.slots_wanted() {
                run.step_clock(slot, 0)?;
            }
        }
        for _ in 0..args.clients {
            let (lock, lock_proxies) =
                if target.lock_proxied { proxied(listen, lock_url).await? } else { (lock_url.to_string(), Vec::new()) };
            let (store, store_proxies) = if target.store_proxied {
                proxied(listen, store_url).await?
            } else {
                (store_url.to_string(), Vec::new())
            };
            let host = match &lab {
                Some(lab) => Some(tokio::task::block_in_place(|| lab.host()).map_err(|e| format!("--hosts: {e}"))?),
                None => None,
            };
            run.slots.push(Slot {
                process: 0,
                child: None,
                lock_url: lock,
                store_url: store,
                lock_proxies,
                store_proxies,
                host,
            });
        }
        run._lab = lab;
        run.restock().await?;
        for slot in 0..run.slots.len() {
            run.spawn(slot)?;
        }
        Ok(run)
    }

    /// Starts a new client process in `slot`, numbered after every earlier one.
    fn spawn(&mut self, slot: usize) -> Result<(), String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let process = self.next_process;
        self.next_process += 1;
        let clock_file = self.clock_file(slot);
        let s = &mut self.slots[slot];
        let stderr = self.log.try_clone().map_err(|e| e.to_string())?;
        // On a host, `ip netns exec` becomes the client: the child's pid is the client's, for
        // the signals of pauses and kills.
        let mut command = match &s.host {
            Some(host) => {
                let exe = exe.to_str().ok_or("the palisade executable's path is not UTF-8")?;
                tokio::process::Command::from(host.command(exe))
            }
            None => tokio::process::Command::new(exe),
        };
        match self.plant {
            Some(bug) => command.env("PALISADE_PLANTED_BUG", bug),
            None => command.env_remove("PALISADE_PLANTED_BUG"),
        };
        if let Some((lib, _)) = &self.clocks {
            // The step is read from the slot's file at most a second late; the monotonic
            // clocks (the history's, a lease's `safe_until`) are left alone.
            command
                .env("LD_PRELOAD", lib)
                .env("FAKETIME_TIMESTAMP_FILE", clock_file)
                .env("FAKETIME_CACHE_DURATION", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .env("DONT_FAKE_MONOTONIC", "1");
        }
        let mut child = command
            .arg("torture-client")
            .args(["--lock", &s.lock_url, "--store", &s.store_url, "--ns", &self.ns])
            .args(["--process", &process.to_string(), "--resources", &self.args.resources.to_string()])
            .args(["--ttl-ms", &self.args.ttl_ms.to_string(), "--wait-ms", &self.args.wait_ms.to_string()])
            .args(["--seed", &self.seed.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start a client: {e}"))?;
        let stdout = child.stdout.take().ok_or("no client stdout")?;
        let events = self.events.clone();
        self.readers.push(tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                // A client killed mid-line leaves a torn last line: not an event.
                if let Ok(event) = serde_json::from_str::<Event>(&line) {
                    let _ = events.send(event);
                }
            }
        }));
        s.process = process;
        s.child = Some(child);
        Ok(())
    }

    fn record(&self, event: Event) {
        let _ = self.events.send(event);
    }

    /// The allocations every process has asked for so far (answered or not).
    fn allocations_so_far(&mut self) -> u64 {
        while let Ok(event) = self.collected.try_recv() {
            self.drained.push(event);
        }
        let asked = self.drained.iter().filter(|e| matches!(e, Event::Invoke { call: Call::Allocate { .. }, .. }));
        u64::try_from(asked.count()).unwrap_or(u64::MAX)
    }

    fn slots_wanted(&self) -> usize {
        usize::try_from(self.args.clients).unwrap_or(0)
    }

    /// The file that tells the clients of `slot` their wall clock's step (libfaketime's).
    fn clock_file(&self, slot: usize) -> PathBuf {
        self.clocks.as_ref().map_or_else(PathBuf::new, |(_, dir)| dir.join(format!("client-{slot}.faketime")))
    }

    /// Steps the wall clock of `slot`'s clients `by_s` seconds from the true time (0: back to
    /// it). Written whole and renamed into place, so that a client never reads half a step.
    fn step_clock(&self, slot: usize, by_s: i64) -> Result<(), String> {
        let file = self.clock_file(slot);
        let partial = file.with_extension("partial");
        std::fs::write(&partial, format!("{by_s:+}\n"))
            .and_then(|()| std::fs::rename(&partial, &file))
            .map_err(|e| format!("{}: {e}", file.display()))
    }

    /// Plays the schedule, lets the clients run to `total` and for at least `quiet` after the
    /// last fault healed (a fault whose servers took longer than drawn, a failover waiting for
    /// the Sentinels, must not eat the quiet stretch the progress check needs), stops them,
    /// reads every register once more, and returns every event recorded. A fault the nemesis
    /// could not inject or heal (a server that would not start again) ends the schedule there:
    /// the clients are stopped as at the end, and the error comes back beside the events, so
    /// that the history so far is still written and judged.
    pub async fn drive(
        mut self,
        steps: &[Step],
        mut servers: Option<&mut super::nemesis::LocalServers>,
        total: Duration,
        quiet: Duration,
    ) -> (Vec<Event>, Option<String>) {
        let start = Instant::now();
        let mut failed = None;
        for (id, step) in steps.iter().enumerate() {
            tokio::time::sleep_until(start + Duration::from_millis(step.at_ms)).await;
            let id = id as u64;
            let loses_locks = step.fault.loses_locks();
            self.record(Event::Fault { at: now(), id, what: step.fault.to_string(), loses_locks });
            if let Err(e) = self.apply(step.fault, servers.as_deref_mut()).await {
                failed = Some(format!("fault {id} ({}): {e}", step.fault));
                break;
            }
            self.record(Event::Healed { at: now(), id });
        }
        if failed.is_none() {
            tokio::time::sleep_until((start + total).max(Instant::now() + quiet)).await;
        }
        self.stop().await;
        self.final_reads().await;
        let Run { mut collected, events, drained, .. } = self;
        drop(events);
        let mut all = drained;
        while let Some(event) = collected.recv().await {
            all.push(event);
        }
        all.sort_by_key(Event::at);
        (all, failed)
    }

    async fn apply(&mut self, fault: Fault, servers: Option<&mut LocalServers>) -> Result<(), String> {
        let hold = |ms: u64| tokio::time::sleep(Duration::from_millis(ms));
        match fault {
            Fault::PauseClient { client, ms } => {
                let pid = self.slots[client].pid()?;
                kill(pid, Signal::SIGSTOP).map_err(|e| e.to_string())?;
                hold(ms).await;
                kill(pid, Signal::SIGCONT).map_err(|e| e.to_string())?;
            }
            Fault::KillClient { client, down_ms } => {
                let slot = &mut self.slots[client];
                if let Some(mut child) = slot.child.take() {
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                }
                let process = slot.process;
                self.record(Event::Crashed { at: now(), process });
                hold(down_ms).await;
                self.spawn(client)?;
            }
            Fault::Partition { client, side, ms } => {
                self.slots[client].proxies(side).iter().for_each(FaultProxy::partition);
                hold(ms).await;
                self.slots[client].proxies(side).iter().for_each(FaultProxy::heal);
            }
            Fault::LoseReply { client, side } => {
                let proxies = self.slots[client].proxies(side);
                let before: usize = proxies.iter().map(FaultProxy::lost_replies).sum();
                proxies.iter().for_each(FaultProxy::lose_next_reply);
                // Armed until a reply is lost, or a TTL has passed with no request.
                let until = Instant::now() + Duration::from_millis(self.args.ttl_ms);
                while Instant::now() < until && proxies.iter().map(FaultProxy::lost_replies).sum::<usize>() == before {
                    hold(10).await;
                }
                proxies.iter().for_each(FaultProxy::disarm);
            }
            Fault::SlowReplies { client, side, delay_ms, ms } => {
                let delay = Duration::from_millis(delay_ms);
                self.slots[client].proxies(side).iter().for_each(|p| p.delay_replies(delay));
                hold(ms).await;
                self.slots[client].proxies(side).iter().for_each(FaultProxy::no_delay);
            }
            Fault::Cut { client, side } => {
                self.slots[client].proxies(side).iter().for_each(FaultProxy::cut_connections)
            }
            Fault::PauseServer { side, ms } => {
                let servers = servers.ok_or("a server fault needs --local")?;
                let pids = servers.pids(side);
                signal_all(&pids, Signal::SIGSTOP)?;
                hold(ms).await;
                signal_all(&pids, Signal::SIGCONT)?;
            }
            Fault::RestartServer { side } => servers.ok_or("a server fault needs --local")?.restart(side).await?,
            Fault::LoseLockData => servers.ok_or("a server fault needs --local")?.lose_lock_data().await?,
            Fault::KillLeader { ms } => {
                let servers = servers.ok_or("a server fault needs --local")?;
                let member = servers.kill_leader().await?;
                hold(ms).await;
                servers.restart_member(member).await?;
            }
            Fault::FailOver { ms } => {
                let servers = servers.ok_or("a server fault needs --local")?;
                let killed = servers.fail_over().await?;
                hold(ms).await;
                servers.rejoin(killed).await?;
            }
            // `ip` and `tc` run to completion off the runtime's workers, which carry the proxies.
            Fault::IsolateHost { client, ms } => {
                let host = self.slots[client].host().await?;
                tokio::task::block_in_place(|| host.cut()).map_err(|e| e.to_string())?;
                hold(ms).await;
                tokio::task::block_in_place(|| host.heal()).map_err(|e| e.to_string())?;
            }
            Fault::JumpClock { client, by_s, ms } => {
                let pid = self.slots[client].pid()?;
                // A step written for a client that is not under libfaketime would change nothing:
                // an error, not a silent pass.
                let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
                if !maps.contains("libfaketime") {
                    return Err(format!("client process {pid} does not run under libfaketime"));
                }
                self.step_clock(client, by_s)?;
                hold(ms).await;
                self.step_clock(client, 0)?;
            }
            Fault::DropSent { client, ms } | Fault::DropReceived { client, ms } => {
                let host = self.slots[client].host().await?;
                tokio::task::block_in_place(|| match fault {
                    Fault::DropSent { .. } => host.drop_sent(),
                    _ => host.drop_received(),
                })
                .map_err(|e| e.to_string())?;
                hold(ms).await;
                tokio::task::block_in_place(|| host.stop_dropping()).map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    /// Closes every client's stdin (finish the cycle, then exit) and waits; a client still
    /// running after its bound is killed, and its open call stays open in the history.
    async fn stop(&mut self) {
        let bound = Duration::from_millis(self.args.wait_ms + 4 * CALL_MS + self.args.ttl_ms * 3);
        for slot in &mut self.slots {
            if let Some(child) = slot.child.as_mut() {
                drop(child.stdin.take());
            }
        }
        for i in 0..self.slots.len() {
            let Some(mut child) = self.slots[i].child.take() else { continue };
            if tokio::time::timeout(bound, child.wait()).await.is_err() {
                let _ = child.start_kill();
                let _ = child.wait().await;
                let process = self.slots[i].process;
                eprintln!("palisade torture: client {process} did not stop within {} ms; killed", bound.as_millis());
                self.record(Event::Crashed { at: now(), process });
            }
        }
        for reader in self.readers.drain(..) {
            let _ = reader.await;
        }
    }

    /// Process 0 records one of its own operations: `call`, answered by `answer`, promised
    /// within `within_ms`.
    async fn own<F>(&mut self, call: Call, within_ms: u64, answer: F) -> Outcome
    where
        F: std::future::Future<Output = Outcome>,
    {
        self.next_op += 1;
        let op = self.next_op;
        self.record(Event::Invoke { process: 0, op, at: now(), within_ms, call });
        let outcome = answer.await;
        self.record(Event::Complete { process: 0, op, at: now(), outcome: outcome.clone() });
        outcome
    }

    /// Process 0 puts every SKU's initial stock, before any client runs: where the stock
    /// check starts from.
    async fn restock(&mut self) -> Result<(), String> {
        let store = super::connect_store(&self.store_url).await.map_err(|e| format!("the store: {e}"))?;
        let warehouse = super::connect_warehouse(&self.store_url, &self.ns, &store)
            .await
            .map_err(|e| format!("the warehouse's tables or records cannot be set up: {e}"))?;
        for index in 0..self.args.resources {
            let sku = sku_name(usize::try_from(index).unwrap_or(0));
            let call = Call::Restock { resource: sku.clone(), qty: INITIAL_STOCK };
            let outcome = self
                .own(call, CALL_MS, async {
                    match warehouse.initial_stock(&sku, INITIAL_STOCK).await {
                        Ok(()) => Outcome::Accepted,
                        Err(e) => Outcome::Unknown { error: e.to_string() },
                    }
                })
                .await;
            if let Outcome::Unknown { error } = outcome {
                return Err(format!("the stock of {sku} cannot be set up: {error}"));
            }
        }
        Ok(())
    }

    /// Process 0 reads every register, every SKU's audit and stock once more, straight from
    /// the store: the last word on which writes and allocations landed.
    async fn final_reads(&mut self) {
        let store = match super::connect_store(&self.store_url).await {
            Ok(store) => Some(store),
            Err(e) => {
                eprintln!("palisade torture: the final reads cannot connect: {e}");
                None
            }
        };
        let Some(store) = store.map(|s: Arc<palisade::DynFencedStore>| s) else { return };
        for index in 0..self.args.resources {
            let resource = resource_name(usize::try_from(index).unwrap_or(0));
            let key = register_key(&self.ns, &resource);
            self.own(Call::Read { resource }, CALL_MS, async {
                match store.read(&key).await {
                    Ok(record) => {
                        Outcome::Value { value: record.map(|r| String::from_utf8_lossy(&r.value).into_owned()) }
                    }
                    Err(e) => Outcome::Unknown { error: e.to_string() },
                }
            })
            .await;
        }
        let warehouse = match super::connect_warehouse(&self.store_url, &self.ns, &store).await {
            Ok(warehouse) => warehouse,
            Err(e) => {
                eprintln!("palisade torture: the final audit cannot connect: {e}");
                return;
            }
        };
        let audit_ms = CALL_MS.saturating_add(self.allocations_so_far().saturating_mul(2 * LIST_MS_PER_RECORD));
        for index in 0..self.args.resources {
            let sku = sku_name(usize::try_from(index).unwrap_or(0));
            self.own(Call::Audit { resource: sku.clone() }, audit_ms, async {
                match warehouse.applied_attempts(&sku).await {
                    Ok(jobs) => Outcome::Audited { jobs },
                    Err(e) => Outcome::Unknown { error: e.to_string() },
                }
            })
            .await;
            self.own(Call::Stock { resource: sku.clone() }, CALL_MS, async {
                match warehouse.stock(&sku).await {
                    Ok(stock) => Outcome::Units { qty: stock.map(|s| s.qty) },
                    Err(e) => Outcome::Unknown { error: e.to_string() },
                }
            })
            .await;
        }
    }
}

/// Where libfaketime is: `PALISADE_LIBFAKETIME`, or where Debian and a source build put it.
/// The variant that serialises its own state across threads, since a client runs many.
pub fn libfaketime() -> Option<PathBuf> {
    if let Some(named) = std::env::var_os("PALISADE_LIBFAKETIME") {
        return Some(PathBuf::from(named)).filter(|p| p.is_file());
    }
    let mut candidates = vec![PathBuf::from("/usr/local/lib/faketime/libfaketimeMT.so.1")];
    if let Ok(dirs) = std::fs::read_dir("/usr/lib") {
        candidates.extend(dirs.flatten().map(|d| d.path().join("faketime/libfaketimeMT.so.1")));
    }
    candidates.push(PathBuf::from("/usr/lib/faketime/libfaketimeMT.so.1"));
    candidates.into_iter().find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_gone_before_its_signal_is_no_error() {
        // A paused PostgreSQL's backend that exited as the pause began: its postmaster, thawed
        // first, reaps it before the thaw reaches it (a 30-minute run stopped on that).
        let mut child = std::process::Command::new("true").spawn().expect("spawn true");
        let pid = child.id();
        child.wait().expect("reaped");
        assert_eq!(signal_all(&[pid], Signal::SIGCONT), Ok(()));
    }
}
