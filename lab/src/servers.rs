//! Server processes of a test's own, on loopback: for the scenarios no shared server may
//! suffer (restarts that lose data, killed leaders, odd configurations).

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::netns::Host;

/// Where a server runs and listens: an address of the caller's network namespace (127.0.0.1
/// unless said otherwise; a [`Lab`](crate::netns::Lab)'s gateway for a server that lab hosts
/// must reach), or a lab [`Host`] of its own (a member that a partition can cut off).
#[derive(Debug, Clone)]
pub struct Site {
    ip: IpAddr,
    namespace: Option<String>,
}

impl Site {
    /// 127.0.0.1 of the caller's namespace: where every server runs unless placed.
    pub fn loopback() -> Site {
        Site { ip: IpAddr::V4(Ipv4Addr::LOCALHOST), namespace: None }
    }

    /// Another address of the caller's namespace, such as [`Lab::gateway`](crate::netns::Lab::gateway).
    pub fn address(ip: IpAddr) -> Site {
        Site { ip, namespace: None }
    }

    /// On `host`, listening on its address.
    pub fn host(host: &Host) -> Site {
        Site { ip: host.ip(), namespace: Some(host.namespace().to_string()) }
    }

    /// The address the server listens on.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }
}

/// How a server comes back from a restart: what a crash, a wipe, a backup and its restore
/// leave of its data. [`LoopbackServer::restart_as`], [`ZkEnsemble::restart_as`] and
/// [`PostgresServer::restart_as`] do each (and the certification's `restart_server` hook asks
/// for them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Restart {
    /// Killed (SIGKILL, as a crash) and started again with its data: a restart, a failover
    /// to an up-to-date replica.
    KeepData,
    /// Killed, its data deleted, and started empty: a server without persistence, a new
    /// machine, a restore of nothing.
    LoseData,
    /// Killed, its data copied aside (a backup: crash-consistent, as a volume snapshot is),
    /// and started again with its data. Replaces any earlier snapshot.
    Snapshot,
    /// Killed and started from the last [`Snapshot`](Restart::Snapshot): every write since
    /// is lost, while what came before survives (a restore from a backup taken some writes
    /// ago). An error if no snapshot was taken.
    FromSnapshot,
}

/// A server process on a free port of 127.0.0.1 (or of another [`Site`]) with a data directory
/// of its own; killed (and its directory removed) when dropped.
#[derive(Debug)]
pub struct LoopbackServer {
    child: Option<Child>,
    port: u16,
    site: Site,
    dir: PathBuf,
    program: String,
    args: Vec<String>,
    /// The copy of its data the last [`Restart::Snapshot`] took (removed on drop).
    snapshot: Option<PathBuf>,
}

impl LoopbackServer {
    /// Starts `program` with the arguments `args(port, data_dir)` builds, and waits up to 10 s
    /// until it accepts TCP connections on the port.
    pub fn start(program: &str, args: impl FnOnce(u16, &Path) -> Vec<String>) -> std::io::Result<Self> {
        LoopbackServer::start_on(program, free_port()?, args)
    }

    /// [`start`](Self::start) on a port chosen by the caller (servers that must know each
    /// other's ports before any of them starts, like the members of a cluster).
    pub fn start_on(program: &str, port: u16, args: impl FnOnce(u16, &Path) -> Vec<String>) -> std::io::Result<Self> {
        let mut server = LoopbackServer::spawn_unchecked(&Site::loopback(), program, port, args)?;
        server.wait_listening()?;
        Ok(server)
    }

    /// [`start`](Self::start) at `site`: `args` must make the server listen on `site.ip()`.
    pub fn start_at(site: &Site, program: &str, args: impl FnOnce(u16, &Path) -> Vec<String>) -> std::io::Result<Self> {
        let mut server = LoopbackServer::spawn_unchecked(site, program, free_port()?, args)?;
        server.wait_listening()?;
        Ok(server)
    }

    /// Starts without waiting for the port (the caller checks readiness its own way).
    fn spawn_unchecked(
        site: &Site,
        program: &str,
        port: u16,
        args: impl FnOnce(u16, &Path) -> Vec<String>,
    ) -> std::io::Result<Self> {
        let mut nonce = [0u8; 6];
        let _ = getrandom::fill(&mut nonce);
        let dir = server_root()
            .join(format!("palisade-server-{port}-{}", nonce.iter().map(|b| format!("{b:02x}")).collect::<String>()));
        std::fs::create_dir_all(&dir)?;
        let args = args(port, &dir);
        let mut server = LoopbackServer {
            child: None,
            port,
            site: site.clone(),
            dir,
            program: program.to_string(),
            args,
            snapshot: None,
        };
        server.child = Some(server.command().spawn()?);
        Ok(server)
    }

    fn command(&self) -> Command {
        let mut command = match &self.site.namespace {
            // `ip netns exec` becomes the program: the child's pid is the server's.
            Some(namespace) => crate::netns::exec_in(namespace, &self.program),
            None => Command::new(&self.program),
        };
        command.args(&self.args).stdin(Stdio::null());
        // The server's own output goes to a log beside its data, so a server that fails to
        // start or to form a cluster can say why (see `log_tail`).
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path());
        match log.and_then(|out| Ok((out.try_clone()?, out))) {
            Ok((out, err)) => command.stdout(out).stderr(err),
            Err(_) => command.stdout(Stdio::null()).stderr(Stdio::null()),
        };
        command
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join(LOG_FILE)
    }

    /// The last `lines` lines the server printed (stdout and stderr, all its runs), for error
    /// messages: empty if it printed nothing.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn spawn(&mut self) -> std::io::Result<()> {
        self.child = Some(self.command().spawn()?);
        self.wait_listening()
    }

    fn wait_listening(&mut self) -> std::io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect_timeout(&self.addr(), Duration::from_millis(200)).is_err() {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                return Err(not_ready(
                    &self.program,
                    &format!("exited ({status}) before it listened"),
                    &[self],
                    |_| true,
                ));
            }
            if Instant::now() > deadline {
                return Err(not_ready(&self.program, "did not listen in 10 s", &[self], |_| true));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// A `redis-server` (the binary at `program`) without persistence, plus `extra` arguments
    /// (which may turn persistence back on: later ones win).
    pub fn redis(program: &str, extra: &[&str]) -> std::io::Result<Self> {
        LoopbackServer::redis_at(&Site::loopback(), program, extra)
    }

    /// A `redis-server` that speaks only TLS (`--port 0`, `--tls-port`) and demands a client
    /// certificate its CA signed (`--tls-auth-clients yes`), with the certificates in `certs` as
    /// [`tls::material`](crate::tls::material) makes them; no persistence. Its URL is
    /// `rediss://` + [`addr`](Self::addr).
    pub fn redis_tls(program: &str, certs: &Path) -> std::io::Result<Self> {
        let file = |name: &str| certs.join(name).display().to_string();
        LoopbackServer::start(program, |port, dir| {
            [
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                &dir.display().to_string(),
                "--tls-cert-file",
                &file("server.crt"),
                "--tls-key-file",
                &file("server.key"),
                "--tls-ca-cert-file",
                &file("ca.crt"),
                "--tls-auth-clients",
                "yes",
            ]
            .map(String::from)
            .to_vec()
        })
    }

    /// [`redis`](Self::redis) at `site` (off loopback, with protected mode off: the test's
    /// own server has no password).
    pub fn redis_at(site: &Site, program: &str, extra: &[&str]) -> std::io::Result<Self> {
        let ip = site.ip();
        LoopbackServer::start_at(site, program, |port, dir| {
            let mut args: Vec<String> = vec![
                "--port".into(),
                port.to_string(),
                "--bind".into(),
                ip.to_string(),
                "--protected-mode".into(),
                "no".into(),
                "--save".into(),
                String::new(),
                "--appendonly".into(),
                "no".into(),
                "--dir".into(),
                dir.display().to_string(),
            ];
            args.extend(extra.iter().map(|s| s.to_string()));
            args
        })
    }

    /// A single-member etcd (the binary at `program`) with fast elections, auto-compaction
    /// (periodic, one minute of history kept) and a snapshot every 10 000 writes (the raft log
    /// kept in memory), its data in its own directory. Ready (healthy)
    /// when this returns.
    pub fn etcd(program: &str) -> std::io::Result<Self> {
        LoopbackServer::etcd_at(&Site::loopback(), program)
    }

    /// [`etcd`](Self::etcd) with `extra` flags after the usual ones (a flag given again there
    /// wins: `--election-timeout 5000`), for a test of a server configured its own way.
    pub fn etcd_with(program: &str, extra: &[&str]) -> std::io::Result<Self> {
        LoopbackServer::etcd_configured(&Site::loopback(), program, extra)
    }

    /// [`etcd`](Self::etcd) at `site`.
    pub fn etcd_at(site: &Site, program: &str) -> std::io::Result<Self> {
        LoopbackServer::etcd_configured(site, program, &[])
    }

    fn etcd_configured(site: &Site, program: &str, extra: &[&str]) -> std::io::Result<Self> {
        let peer = free_port()?;
        let cluster = format!("m0=http://{}", SocketAddr::new(site.ip, peer));
        let server = LoopbackServer::start_at(site, program, |port, dir| {
            let mut args = etcd_args("m0", site.ip, port, peer, dir, &cluster, "palisade-single");
            args.extend(extra.iter().map(|s| s.to_string()));
            args
        })?;
        wait_etcd_healthy(&[&server])?;
        Ok(server)
    }

    /// A one-member etcd that speaks only TLS to clients (`https://` client URL), with the
    /// certificates in `certs` as [`tls::material`](crate::tls::material) makes them, and
    /// demands a client certificate its CA signed (`--client-cert-auth`). Its URL is
    /// `etcds://` + [`addr`](Self::addr).
    pub fn etcd_tls(program: &str, certs: &Path) -> std::io::Result<Self> {
        let peer = free_port()?;
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let cluster = format!("m0=http://{}", SocketAddr::new(ip, peer));
        let file = |name: &str| certs.join(name).display().to_string();
        let server = LoopbackServer::start(program, |port, dir| {
            let mut args = etcd_args("m0", ip, port, peer, dir, &cluster, "palisade-tls");
            let plain = format!("http://{}", SocketAddr::new(ip, port));
            for arg in &mut args {
                if *arg == plain {
                    *arg = format!("https://{}", SocketAddr::new(ip, port));
                }
            }
            args.extend(
                ["--cert-file", &file("server.crt"), "--key-file", &file("server.key")]
                    .into_iter()
                    .chain(["--trusted-ca-file", &file("ca.crt"), "--client-cert-auth"])
                    .map(String::from),
            );
            args
        })?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let healthy = || {
            crate::tls::ask(server.addr(), certs, b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                .contains("\"health\":\"true\"")
        };
        while !healthy() {
            if Instant::now() > deadline {
                return Err(not_ready("etcd", "(TLS) did not become healthy in 30 s", &[&server], |_| true));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }

    /// Waits until this etcd member says it is healthy (after a restart).
    pub fn wait_etcd_healthy(&self) -> std::io::Result<()> {
        wait_etcd_healthy(&[self])
    }

    /// `etcd://IP:PORT`.
    pub fn etcd_url(&self) -> String {
        format!("etcd://{}", self.addr())
    }

    /// Kills it, deletes everything in its data directory, and starts it again: a server that
    /// lost its state (for etcd, its revisions restart low). [`restart_as`](Self::restart_as)
    /// with [`Restart::LoseData`].
    pub fn wipe_and_restart(&mut self) -> std::io::Result<()> {
        self.restart_as(Restart::LoseData)
    }

    /// Kills it, does to its data what `how` says, and starts it again on the same port with
    /// the same arguments.
    pub fn restart_as(&mut self, how: Restart) -> std::io::Result<()> {
        self.kill();
        self.prepare_data(how)?;
        self.spawn()
    }

    /// What `how` does to the data of this stopped server before it starts again.
    fn prepare_data(&mut self, how: Restart) -> std::io::Result<()> {
        match how {
            Restart::KeepData => Ok(()),
            Restart::LoseData => self.clear_data(),
            Restart::Snapshot => {
                let mut copy = self.dir.clone().into_os_string();
                copy.push(".snapshot");
                let copy = PathBuf::from(copy);
                remove_dir_if_present(&copy)?;
                copy_dir(&self.dir, &copy)?;
                self.snapshot = Some(copy);
                Ok(())
            }
            Restart::FromSnapshot => {
                let snapshot = self.snapshot.clone().ok_or_else(|| {
                    std::io::Error::other(format!("{} on port {}: no snapshot to restore", self.program, self.port))
                })?;
                self.clear_data()?;
                copy_dir(&snapshot, &self.dir)
            }
        }
    }

    /// Deletes everything in its data directory but its log (the server must be stopped).
    fn clear_data(&self) -> std::io::Result<()> {
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            if path.file_name().is_some_and(|name| name == LOG_FILE) {
                continue;
            }
            if path.is_dir() { std::fs::remove_dir_all(&path)? } else { std::fs::remove_file(&path)? }
        }
        Ok(())
    }

    /// `redis://IP:PORT`.
    pub fn redis_url(&self) -> String {
        format!("redis://{}", self.addr())
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address and port it listens on.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.site.ip, self.port)
    }

    /// The process id, while it runs (to freeze it with `SIGSTOP`, say).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Its data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Lets the server run on after this handle is gone, for servers that outlive the process
    /// that started them (`palisade-lab up`): returns its pid and data directory, which whoever
    /// stops it later kills and removes. `None` if it is not running.
    pub fn detach(self) -> Option<(u32, PathBuf)> {
        let detached = (self.pid()?, self.dir.clone());
        // Not dropped: dropping would kill it and remove its directory.
        std::mem::forget(self);
        Some(detached)
    }

    /// Kills it and every process it started with SIGKILL, and waits up to 5 s for all of them
    /// to exit: a PostgreSQL backend outlives a killed postmaster (in a session of its own)
    /// and keeps the shared memory that would refuse the next start.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let tree = kill_tree(child.id());
            let _ = child.wait();
            let deadline = Instant::now() + Duration::from_secs(5);
            while tree.iter().any(|&pid| process_state(pid) != "exited") && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    /// Kills it and starts it again with the same arguments on the same port (whatever it
    /// persisted to its data directory is what survives): [`restart_as`](Self::restart_as)
    /// with [`Restart::KeepData`].
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.restart_as(Restart::KeepData)
    }
}

impl Drop for LoopbackServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(snapshot) = &self.snapshot {
            let _ = std::fs::remove_dir_all(snapshot);
        }
    }
}

fn remove_dir_if_present(dir: &Path) -> std::io::Result<()> {
    absent_is_fine(std::fs::remove_dir_all(dir))
}

fn remove_file_if_present(file: &Path) -> std::io::Result<()> {
    absent_is_fine(std::fs::remove_file(file))
}

fn absent_is_fine(removed: std::io::Result<()>) -> std::io::Result<()> {
    match removed {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

const LOG_FILE: &str = "server.log";

/// Copies the directory `from` into `to` (created if missing), recursively, with each entry's
/// permissions and owner (PostgreSQL refuses a data directory that is not its user's, or open
/// to others), leaving out the server's log and its sockets.
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    std::fs::create_dir_all(to)?;
    let meta = std::fs::metadata(from)?;
    std::fs::set_permissions(to, meta.permissions())?;
    std::os::unix::fs::chown(to, Some(meta.uid()), Some(meta.gid()))?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (path, target) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type()?;
        if entry.file_name() == LOG_FILE {
            continue;
        }
        if kind.is_dir() {
            copy_dir(&path, &target)?;
        } else if kind.is_file() {
            std::fs::copy(&path, &target)?;
            let meta = entry.metadata()?;
            std::os::unix::fs::chown(&target, Some(meta.uid()), Some(meta.gid()))?;
        }
    }
    Ok(())
}

/// A Redis master, one replica and three Sentinels watching them (quorum 2, the master judged
/// down after 1 s without answers), each a [`LoopbackServer`]: for failover tests.
#[derive(Debug)]
pub struct RedisSentinels {
    master: LoopbackServer,
    replica: LoopbackServer,
    sentinels: Vec<LoopbackServer>,
}

/// The master group's name the Sentinels watch.
pub const SENTINEL_MASTER_NAME: &str = "palisade";

impl RedisSentinels {
    /// Starts them with the `redis-server` binary at `program` (Sentinels are `redis-server
    /// CONF --sentinel`) and returns once every Sentinel knows the replica and the other two
    /// Sentinels (what a failover needs).
    pub fn start(program: &str) -> std::io::Result<Self> {
        RedisSentinels::start_at(program, &Site::loopback(), &Site::loopback())
    }

    /// [`start`](Self::start), the master judged down only after `down_after` without answers:
    /// for a long-lived group (the test command's shared one) that a loaded machine must not
    /// fail over by mistake.
    pub fn start_patient(program: &str, down_after: Duration) -> std::io::Result<Self> {
        RedisSentinels::start_with(program, &Site::loopback(), &Site::loopback(), down_after)
    }

    /// [`start`](Self::start) with the master at `master` and the replica at `replica` (a lab
    /// host of its own, say, to cut it off from the master); the Sentinels listen on loopback
    /// and reach both.
    pub fn start_at(program: &str, master: &Site, replica: &Site) -> std::io::Result<Self> {
        RedisSentinels::start_with(program, master, replica, Duration::from_secs(1))
    }

    fn start_with(program: &str, master: &Site, replica: &Site, down_after: Duration) -> std::io::Result<Self> {
        let down_after = down_after.as_millis();
        // Redis waits 5 s before a diskless sync, in case more replicas come: none will.
        let master = LoopbackServer::redis_at(master, program, &["--repl-diskless-sync-delay", "0"])?;
        let (master_ip, master_port) = (master.addr().ip(), master.port().to_string());
        // Either server may be the master after a failover: neither waits before a sync.
        let replica = LoopbackServer::redis_at(
            replica,
            program,
            &["--replicaof", &master_ip.to_string(), &master_port, "--repl-diskless-sync-delay", "0"],
        )?;
        // Sentinels announce the address they reach the master from; they must listen there
        // too, or they cannot hear each other and never reach a quorum.
        let bind = if master_ip.is_loopback() { master_ip.to_string() } else { format!("127.0.0.1 {master_ip}") };
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            sentinels.push(LoopbackServer::start(program, |port, dir| {
                let conf = dir.join("sentinel.conf");
                let text = format!(
                    "port {port}\nbind {bind}\ndir {}\n\
                     sentinel monitor {SENTINEL_MASTER_NAME} {master_ip} {master_port} 2\n\
                     sentinel down-after-milliseconds {SENTINEL_MASTER_NAME} {down_after}\n\
                     sentinel failover-timeout {SENTINEL_MASTER_NAME} 5000\n\
                     sentinel parallel-syncs {SENTINEL_MASTER_NAME} 1\n",
                    dir.display()
                );
                // A failed write shows as a Sentinel that exits at once, with its reason in its log.
                let _ = std::fs::write(&conf, text);
                vec![conf.display().to_string(), "--sentinel".to_string()]
            })?);
        }
        let group = RedisSentinels { master, replica, sentinels };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !redis_command(group.master.addr(), &["INFO", "replication"]).is_ok_and(|r| r.contains("state=online")) {
            if Instant::now() > deadline {
                return Err(not_ready("redis replica", "did not finish its sync in 30 s", &[&group.replica], |_| true));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let ready = |s: &LoopbackServer| {
            let count = |what: &str| {
                redis_command(s.addr(), &["SENTINEL", what, SENTINEL_MASTER_NAME])
                    .map(|reply| reply.matches("\r\nname\r\n").count())
                    .unwrap_or(0)
            };
            count("replicas") >= 1 && count("sentinels") >= 2
        };
        while !group.sentinels.iter().all(ready) {
            if Instant::now() > deadline {
                let members: Vec<&LoopbackServer> = group.sentinels.iter().collect();
                return Err(not_ready(
                    "redis sentinels",
                    "did not see the replica and each other in 30 s",
                    &members,
                    |s| !ready(s),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(group)
    }

    /// `redis+sentinel://` naming the three Sentinels and the master group.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.sentinels.iter().map(|s| format!("127.0.0.1:{}", s.port())).collect();
        format!("redis+sentinel://{}/{SENTINEL_MASTER_NAME}", hosts.join(","))
    }

    /// The port of the master the first Sentinel that answers names.
    pub fn master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| {
            let reply = redis_command(s.addr(), &["SENTINEL", "get-master-addr-by-name", SENTINEL_MASTER_NAME]).ok()?;
            reply.lines().filter(|l| !l.starts_with(['*', '$'])).nth(1)?.trim().parse().ok()
        })
    }

    /// The first master and its replica (the replica is the master after a failover).
    pub fn servers(&self) -> (&LoopbackServer, &LoopbackServer) {
        (&self.master, &self.replica)
    }

    /// Closes the master's connection to its replica (`CLIENT KILL TYPE replica`). With the
    /// replica cut off so that it cannot reconnect, what the master writes next reaches no
    /// replica (data already sent into a cut keeps being retransmitted by the kernel, even
    /// after the master dies, and would arrive after a heal).
    pub fn disconnect_replica(&self) -> std::io::Result<()> {
        let reply = redis_command(self.master.addr(), &["CLIENT", "KILL", "TYPE", "replica"])?;
        if reply.starts_with(':') { Ok(()) } else { Err(std::io::Error::other(format!("CLIENT KILL: {reply}"))) }
    }

    /// The last `lines` lines of each Sentinel's log, for a failover that did not happen.
    pub fn sentinel_logs(&self, lines: usize) -> String {
        self.sentinels.iter().map(|s| format!("--- sentinel {}:\n{}\n", s.port(), s.log_tail(lines))).collect()
    }

    /// Which server the Sentinels name master now: 0 for the first master, 1 for its replica
    /// (see [`servers`](Self::servers)); `None` if no Sentinel answers or they name neither.
    pub fn master_index(&self) -> Option<usize> {
        let port = self.master_port()?;
        [self.master.port(), self.replica.port()].iter().position(|&p| p == port)
    }

    /// A failover: kills the server the Sentinels name master now (SIGKILL; it stays down) and
    /// waits, up to `within`, until they name the other. Returns the killed server's index
    /// ([`master_index`](Self::master_index)). The Sentinels start no failover of the group
    /// within twice the failover timeout (10 s) of the last one, so two in a row take that long.
    pub fn fail_over(&mut self, within: Duration) -> std::io::Result<usize> {
        let Some(old) = self.master_index() else {
            return Err(std::io::Error::other("the Sentinels name no master of the group"));
        };
        if old == 0 {
            self.master.kill()
        } else {
            self.replica.kill()
        }
        let deadline = Instant::now() + within;
        while self.master_index() != Some(1 - old) {
            if Instant::now() > deadline {
                return Err(std::io::Error::other(format!(
                    "the Sentinels did not promote the replica within {} s:\n{}",
                    within.as_secs(),
                    self.sentinel_logs(10)
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(old)
    }

    /// Starts server `i` ([`master_index`](Self::master_index)) again after a
    /// [`fail_over`](Self::fail_over), makes it a replica of the other (the master now) at once
    /// (`REPLICAOF`: started with its first arguments, the first master would otherwise be an
    /// empty master until the Sentinels demote it), and waits, up to `within`, until the master
    /// reports it as an online replica: until the group can fail over again.
    pub fn restart_server(&mut self, i: usize, within: Duration) -> std::io::Result<()> {
        if i == 0 {
            self.master.restart()?
        } else {
            self.replica.restart()?
        }
        let (server, other) = if i == 0 { (&self.master, &self.replica) } else { (&self.replica, &self.master) };
        let (ip, port) = (other.addr().ip().to_string(), other.port().to_string());
        let deadline = Instant::now() + within;
        let mut asked: Option<Instant> = None;
        let online = format!("port={},state=online", server.port());
        loop {
            // Asked again every 5 s (a Sentinel that had not yet heard of the failover may have
            // pointed it elsewhere meanwhile); asking to follow the master it follows is a no-op.
            if asked.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
                let reply = redis_command(server.addr(), &["REPLICAOF", &ip, &port])?;
                if !reply.starts_with("+OK") {
                    return Err(std::io::Error::other(format!("REPLICAOF {ip} {port}: {}", reply.trim())));
                }
                asked = Some(Instant::now());
            }
            if redis_command(other.addr(), &["INFO", "replication"]).is_ok_and(|r| r.contains(&online)) {
                return Ok(());
            }
            if Instant::now() > deadline {
                let info = |s: &LoopbackServer| redis_command(s.addr(), &["INFO", "replication"]).unwrap_or_default();
                return Err(std::io::Error::other(format!(
                    "the restarted server on port {} was not an online replica of the master on port {port} within \
                     {} s\n--- its INFO replication:\n{}\n--- the master's:\n{}\n{}",
                    server.port(),
                    within.as_secs(),
                    info(server),
                    info(other),
                    self.sentinel_logs(20)
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the first master with SIGKILL (it stays dead: the replica is promoted).
    pub fn kill_master(&mut self) {
        self.master.kill();
    }

    /// Lets the group run on after this handle is gone (see [`LoopbackServer::detach`]): the
    /// pid and data directory of each of its five servers (`None` for one not running).
    pub fn detach(self) -> Vec<Option<(u32, PathBuf)>> {
        let RedisSentinels { master, replica, sentinels } = self;
        [master, replica].into_iter().chain(sentinels).map(LoopbackServer::detach).collect()
    }
}

/// A Redis Cluster of three primaries with a replica each (a primary judged failed after 1 s
/// without answers), each node a [`LoopbackServer`]: for cluster and failover tests.
#[derive(Debug)]
pub struct RedisCluster {
    /// Primaries first (slots split in three), then their replicas in the same order.
    nodes: Vec<LoopbackServer>,
}

impl RedisCluster {
    /// Starts the six nodes with the `redis-server` binary at `program`, assigns the slots,
    /// joins them and makes the replicas follow; returns once every node reports the cluster
    /// `ok` and every replica is in sync.
    pub fn start(program: &str) -> std::io::Result<Self> {
        RedisCluster::start_patient(program, Duration::from_secs(1))
    }

    /// [`start`](Self::start), a primary judged failed only after `node_timeout` without
    /// answers: for a long-lived cluster (the test command's shared one) that a loaded machine
    /// must not fail over by mistake.
    pub fn start_patient(program: &str, node_timeout: Duration) -> std::io::Result<Self> {
        let node_timeout = node_timeout.as_millis().to_string();
        let (mut nodes, mut buses) = (Vec::new(), Vec::new());
        for _ in 0..6 {
            // The bus port defaults to the port + 10000, which may be the ephemeral port of a
            // client connection by then (the node cannot bind it and exits): a free one instead.
            let bus = free_port()?.to_string();
            buses.push(bus.clone());
            nodes.push(LoopbackServer::redis(
                program,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    &bus,
                    "--cluster-node-timeout",
                    &node_timeout,
                    "--repl-diskless-sync-delay",
                    "0",
                ],
            )?);
        }
        let cluster = RedisCluster { nodes };
        let fail = |what: &str| {
            let members: Vec<&LoopbackServer> = cluster.nodes.iter().collect();
            not_ready("redis cluster", what, &members, |_| true)
        };
        for (i, node) in cluster.nodes.iter().take(3).enumerate() {
            let (first, last) = (i * 16384 / 3, (i + 1) * 16384 / 3 - 1);
            let reply =
                redis_command(node.addr(), &["CLUSTER", "ADDSLOTSRANGE", &first.to_string(), &last.to_string()])?;
            if !reply.starts_with("+OK") {
                return Err(fail(&format!("refused its slots: {reply}")));
            }
        }
        let first_port = cluster.nodes[0].port().to_string();
        for node in &cluster.nodes[1..] {
            redis_command(node.addr(), &["CLUSTER", "MEET", "127.0.0.1", &first_port, &buses[0]])?;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let knows_all = |n: &LoopbackServer| {
            redis_command(n.addr(), &["CLUSTER", "NODES"]).is_ok_and(|r| r.matches("127.0.0.1:").count() >= 6)
        };
        while !cluster.nodes.iter().all(knows_all) {
            if Instant::now() > deadline {
                return Err(fail("did not meet in 30 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for i in 0..3 {
            let id = redis_command(cluster.nodes[i].addr(), &["CLUSTER", "MYID"])?;
            let id = id.lines().nth(1).unwrap_or_default().trim().to_string();
            let reply = redis_command(cluster.nodes[i + 3].addr(), &["CLUSTER", "REPLICATE", &id])?;
            if !reply.starts_with("+OK") {
                return Err(fail(&format!("a replica refused to follow: {reply}")));
            }
        }
        while !cluster.ok()
            || !cluster.nodes[3..].iter().all(|r| {
                redis_command(r.addr(), &["INFO", "replication"]).is_ok_and(|i| i.contains("master_link_status:up"))
            })
        {
            if Instant::now() > deadline {
                return Err(fail("did not become ok with replicas in sync in 30 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(cluster)
    }

    /// `redis+cluster://` naming the three first primaries as seeds.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self.nodes.iter().take(3).map(|n| format!("127.0.0.1:{}", n.port())).collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// Whether every running node reports `cluster_state:ok`.
    pub fn ok(&self) -> bool {
        self.nodes
            .iter()
            .filter(|n| n.pid().is_some())
            .all(|n| redis_command(n.addr(), &["CLUSTER", "INFO"]).is_ok_and(|r| r.contains("cluster_state:ok")))
    }

    /// Kills, with SIGKILL, the first primary serving `key` (its replica takes over) and
    /// returns its port.
    pub fn kill_primary_of(&mut self, key: &str) -> std::io::Result<u16> {
        let slot = redis_command(self.nodes[0].addr(), &["CLUSTER", "KEYSLOT", key])?;
        let slot: usize = slot.trim().trim_start_matches(':').parse().map_err(std::io::Error::other)?;
        let i = (0..3).find(|i| slot < (i + 1) * 16384 / 3).unwrap_or(2);
        let port = self.nodes[i].port();
        self.nodes[i].kill();
        Ok(port)
    }

    /// Lets the cluster run on after this handle is gone (see [`LoopbackServer::detach`]): the
    /// pid and data directory of each of its six nodes (`None` for one not running).
    pub fn detach(self) -> Vec<Option<(u32, PathBuf)>> {
        self.nodes.into_iter().map(LoopbackServer::detach).collect()
    }
}

/// Sends one command to the Redis (or Sentinel) at `addr` and returns its raw RESP reply (read
/// until the server has been quiet for 100 ms): enough for readiness checks.
fn redis_command(addr: SocketAddr, args: &[&str]) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut request = format!("*{}\r\n", args.len());
    for a in args {
        request.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    stream.write_all(request.as_bytes())?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

/// The directory of PostgreSQL's server binaries (`postgres`, `initdb`, `pg_isready`):
/// `$PALISADE_POSTGRES_BIN` when set (`palisade-lab up` exports the one it used), else
/// the newest major version installed under Debian's `/usr/lib/postgresql/<major>/bin`.
pub fn postgres_bin_dir() -> std::io::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("PALISADE_POSTGRES_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let major: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").is_file().then_some((major, bin))
        })
        .max_by_key(|(major, _)| *major);
    newest.map(|(_, bin)| bin).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no PostgreSQL server under /usr/lib/postgresql/*/bin (scripts/test installs one; or set PALISADE_POSTGRES_BIN)",
        )
    })
}

/// Where servers keep their data: memory (`/dev/shm`) when the machine has it with room to
/// spare (etcd preallocates 64 MB of log per member), as the shared servers of `scripts/test`
/// do. etcd and ZooKeeper fsync every write, and on a busy test disk that (not the code under
/// test) would set the pace and stretch elections; the faults these servers suffer (SIGKILL,
/// SIGSTOP, a wiped directory) lose the same data either way.
pub fn server_root() -> PathBuf {
    const ROOM: u64 = 2 << 30;
    let shm = Path::new("/dev/shm");
    let room =
        nix::sys::statvfs::statvfs(shm).map(|fs| fs.blocks_available().saturating_mul(fs.fragment_size())).unwrap_or(0);
    let writable = std::fs::metadata(shm).is_ok_and(|m| m.is_dir() && !m.permissions().readonly());
    if writable && room >= ROOM { shm.to_path_buf() } else { std::env::temp_dir() }
}

/// Ports this process has handed out already: a cluster's members are told each other's ports
/// before any of them binds, so the same port must not be picked twice meanwhile.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// Ports come in blocks of this many, each claimed by one process at a time.
const BLOCK: u16 = 256;

/// The blocks of ports this process has claimed ([`crate::claims`]), by first port: no other
/// process hands out a port of them while this one runs.
static BLOCKS: Mutex<Vec<(u16, crate::claims::Claim)>> = Mutex::new(Vec::new());

/// A free port on 127.0.0.1 for a server to bind later.
///
/// Chosen *below* the kernel's ephemeral range when there is room: a port taken from that range
/// (`bind(…:0)`) is free only until the server binds it, and meanwhile any outgoing connection on
/// the machine may get it as its source port, such as the first cluster member dialling its
/// peers. (A CI run had a 3-member etcd cluster that never became healthy, with its output
/// thrown away; this and a full disk, see [`server_root`], are the causes ruled out since, and
/// the members' logs now come with such an error.)
///
/// That range is cut into blocks of 256 ports, and a process hands out ports only from blocks
/// it has claimed (a lock on a file under `/tmp/palisade-lab-claims`): test binaries that run
/// side by side never hand out the same port, even before either server binds it. Within a
/// block, the search starts at a random port, so that a block claimed again right after its last
/// holder exited does not give out the same ports first (a server that process left behind may
/// still dial them). Where claims cannot protect the port, it is only distinct within this
/// process: when no claim can be made (`/tmp/palisade-lab-claims` is not this user's to
/// write), when every block is claimed, and when the ephemeral range leaves no room below it.
pub fn free_port() -> std::io::Result<u16> {
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let (low, high) = below_ephemeral_range();
    let usable = |port: u16, handed_out: &BTreeSet<u16>| {
        !handed_out.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok()
    };
    if high > low {
        let mut blocks = BLOCKS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let offset = random_u16();
        loop {
            let mut claimed = blocks.iter().flat_map(|&(first, _)| {
                let end = first.saturating_add(BLOCK).min(high);
                let start = first + offset % (end - first);
                (start..end).chain(first..start)
            });
            if let Some(port) = claimed.find(|&port| usable(port, &handed_out)) {
                handed_out.insert(port);
                return Ok(port);
            }
            match claim_a_block(low, high, &blocks) {
                Ok(Some(block)) => blocks.push(block),
                // Every block is another process's, or claims cannot be made here.
                Ok(None) | Err(_) => break,
            }
        }
        for _ in 0..200 {
            let port = low + random_u16() % (high - low);
            if usable(port, &handed_out) {
                handed_out.insert(port);
                return Ok(port);
            }
        }
    }
    // No room below the ephemeral range (or all of it busy): ask the kernel.
    loop {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if handed_out.insert(port) {
            return Ok(port);
        }
    }
}

/// Claims a block of `[low, high)` that this process does not hold yet, starting at a random
/// one (so that the processes that start together do not all try the same blocks first).
fn claim_a_block(
    low: u16,
    high: u16,
    held: &[(u16, crate::claims::Claim)],
) -> std::io::Result<Option<(u16, crate::claims::Claim)>> {
    let count = (high - low).div_ceil(BLOCK);
    let start = random_u16() % count;
    for i in 0..count {
        let first = low + (start + i) % count * BLOCK;
        if held.iter().any(|&(held, _)| held == first) {
            continue;
        }
        if let Some(claim) = crate::claims::try_claim(&format!("ports-{first}"))? {
            return Ok(Some((first, claim)));
        }
    }
    Ok(None)
}

/// A random number for spreading the port search (zero if the OS has no randomness to give).
fn random_u16() -> u16 {
    let mut bytes = [0u8; 2];
    let _ = getrandom::fill(&mut bytes);
    u16::from_le_bytes(bytes)
}

/// `[10000, first ephemeral port)`, empty if the kernel's ephemeral range starts below 11000.
fn below_ephemeral_range() -> (u16, u16) {
    const LOW: u16 = 10_000;
    let first_ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    if first_ephemeral >= LOW + 1000 { (LOW, first_ephemeral) } else { (LOW, LOW) }
}

fn etcd_args(name: &str, ip: IpAddr, port: u16, peer: u16, dir: &Path, cluster: &str, token: &str) -> Vec<String> {
    let (client, peer) = (SocketAddr::new(ip, port), SocketAddr::new(ip, peer));
    [
        "--name",
        name,
        "--data-dir",
        &dir.join("data").display().to_string(),
        "--listen-client-urls",
        &format!("http://{client}"),
        "--advertise-client-urls",
        &format!("http://{client}"),
        "--listen-peer-urls",
        &format!("http://{peer}"),
        "--initial-advertise-peer-urls",
        &format!("http://{peer}"),
        "--initial-cluster",
        cluster,
        "--initial-cluster-token",
        token,
        "--initial-cluster-state",
        "new",
        "--heartbeat-interval",
        "50",
        "--election-timeout",
        "300",
        // As production etcd should run: every acquire ranges over its resource's key prefix,
        // where the index keeps each deleted contender key until a compaction, and a long run
        // (the million-job one) grew an uncompacted etcd to 2 GB resident. One minute of history
        // is more than any watch here starts behind.
        "--auto-compaction-mode",
        "periodic",
        "--auto-compaction-retention",
        "1m",
        // etcd 3.4 keeps the raft log of the last `--snapshot-count` entries in memory (100 000
        // by default): with compaction alone, the million-job run peaked at 512 MiB resident,
        // most of it that log. Ten thousand bounds it; a snapshot of a lock service's small
        // keyspace every ten thousand writes costs little.
        "--snapshot-count",
        "10000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Whether an etcd member's `/health` says healthy (it has a leader and a quorum).
fn etcd_healthy(addr: SocketAddr) -> bool {
    ask(addr, b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").contains("\"health\":\"true\"")
}

/// Whether an etcd member says it is the leader (its `/metrics`).
fn etcd_is_leader(addr: SocketAddr) -> bool {
    ask(addr, b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").lines().any(|l| l == "etcd_server_is_leader 1")
}

/// Sends `request` on a fresh connection and reads the answer until the server closes
/// it ("" if unreachable; at most 500 ms of silence).
fn ask(addr: SocketAddr, request: &[u8]) -> String {
    use std::io::{Read, Write};
    // A bounded connect: a member cut off by a partition must not hang the question.
    let Ok(mut conn) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else { return String::new() };
    let _ = conn.set_read_timeout(Some(Duration::from_millis(500)));
    if conn.write_all(request).is_err() {
        return String::new();
    }
    let mut reply = String::new();
    let _ = conn.read_to_string(&mut reply);
    reply
}

/// Asks `leader` every 100 ms for up to `within` (a cluster can be between elections).
async fn wait_for_leader(what: &str, within: Duration, leader: impl Fn() -> Option<usize>) -> std::io::Result<usize> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(i) = leader() {
            return Ok(i);
        }
        if Instant::now() > deadline {
            return Err(std::io::Error::other(format!("{what} had no leader for {within:?}")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn wait_etcd_healthy(members: &[&LoopbackServer]) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !members.iter().all(|m| etcd_healthy(m.addr())) {
        if Instant::now() > deadline {
            return Err(not_ready("etcd", "did not become healthy in 30 s", members, |m| !etcd_healthy(m.addr())));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// SIGKILLs `root` and all its descendants, and returns their pids. Every process found is
/// stopped first (and seen stopped) and the tree read again until it grows no more, so that
/// none forks after it was read. A descendant whose parent had already exited (reparented
/// away) is not found.
pub(crate) fn kill_tree(root: u32) -> Vec<u32> {
    use nix::sys::signal::{Signal, kill};
    let signal = |pid: u32, signal: Signal| {
        if let Ok(pid) = i32::try_from(pid) {
            let _ = kill(nix::unistd::Pid::from_raw(pid), signal);
        }
    };
    let mut tree = vec![root];
    signal(root, Signal::SIGSTOP);
    loop {
        let deadline = Instant::now() + Duration::from_millis(200);
        while tree.iter().any(|&pid| process_state(pid) == "running") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let parents = parents();
        let found: Vec<u32> = parents
            .iter()
            .filter(|(pid, parent)| tree.contains(parent) && !tree.contains(pid))
            .map(|(&pid, _)| pid)
            .collect();
        if found.is_empty() {
            break;
        }
        for pid in found {
            signal(pid, Signal::SIGSTOP);
            tree.push(pid);
        }
    }
    for &pid in &tree {
        signal(pid, Signal::SIGKILL);
    }
    tree
}

/// Every process's parent, from one pass over `/proc`.
fn parents() -> std::collections::BTreeMap<u32, u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Default::default() };
    entries
        .filter_map(|entry| {
            let pid = entry.ok()?.file_name().to_str()?.parse::<u32>().ok()?;
            Some((pid, proc_stat(pid)?.1))
        })
        .collect()
}

/// A process's state letter and parent, from `/proc/PID/stat`: they follow the command name,
/// which is in parentheses and may hold spaces.
fn proc_stat(pid: u32) -> Option<(String, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.to_string();
    Some((state, fields.next()?.parse().ok()?))
}

/// `running`, `stopped` or `exited`, from `/proc` (an exited child not yet waited for is still
/// listed there, as a zombie).
fn process_state(pid: u32) -> &'static str {
    match proc_stat(pid).map(|(state, _)| state) {
        None => "exited",
        Some(state) => match state.as_str() {
            "Z" | "X" => "exited",
            "T" | "t" => "stopped",
            _ => "running",
        },
    }
}

/// An error naming the members that are not ready, with the end of each one's log.
fn not_ready(
    what: &str,
    failure: &str,
    members: &[&LoopbackServer],
    unready: impl Fn(&LoopbackServer) -> bool,
) -> std::io::Error {
    let mut message = format!("{what} on ports {:?} {failure}", members.iter().map(|m| m.port).collect::<Vec<_>>());
    for member in members.iter().filter(|m| unready(m)) {
        let running = match member.child.as_ref().map(Child::id) {
            Some(pid) => format!("pid {pid}, {}", process_state(pid)),
            None => "not started".to_string(),
        };
        message.push_str(&format!("\n--- port {} ({running}), end of its log:\n{}", member.port, member.log_tail(20)));
    }
    std::io::Error::other(message)
}

/// An etcd cluster of the test's own on loopback (fast elections: heartbeat 50 ms, election
/// timeout 300 ms; auto-compaction as for a single member). Members are killed and their
/// directories removed when it is dropped.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<LoopbackServer>,
}

impl EtcdCluster {
    /// Starts `size` members and waits until every one is healthy.
    pub fn start(program: &str, size: usize) -> std::io::Result<Self> {
        EtcdCluster::start_at(program, &vec![Site::loopback(); size])
    }

    /// One member at each site (member `i` at `sites[i]`: on lab hosts, so that a partition
    /// can cut one off); waits until every one is healthy.
    pub fn start_at(program: &str, sites: &[Site]) -> std::io::Result<Self> {
        let ports: Vec<(u16, u16)> =
            sites.iter().map(|_| Ok((free_port()?, free_port()?))).collect::<std::io::Result<_>>()?;
        let cluster = ports
            .iter()
            .zip(sites)
            .enumerate()
            .map(|(i, ((_, peer), site))| format!("m{i}=http://{}", SocketAddr::new(site.ip, *peer)))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("palisade-{}", ports[0].0);
        let mut members = Vec::with_capacity(sites.len());
        for (i, ((port, peer), site)) in ports.iter().zip(sites).enumerate() {
            // Members wait for each other before they listen for clients, so start them all
            // first and check readiness once.
            members.push(LoopbackServer::spawn_unchecked(site, program, *port, |port, dir| {
                etcd_args(&format!("m{i}"), site.ip, port, *peer, dir, &cluster, &token)
            })?);
        }
        wait_etcd_healthy(&members.iter().collect::<Vec<_>>())?;
        Ok(EtcdCluster { members })
    }

    /// `etcd://127.0.0.1:P0,127.0.0.1:P1,…` with every member.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.members.iter().map(|m| m.addr().to_string()).collect();
        format!("etcd://{}", hosts.join(","))
    }

    /// The client ports of the members, in member order (`m0`, `m1`, …).
    pub fn client_ports(&self) -> Vec<u16> {
        self.members.iter().map(|m| m.port).collect()
    }

    /// Kills member `i` (by its client port's position) with SIGKILL.
    pub fn kill_member(&mut self, i: usize) {
        if let Some(m) = self.members.get_mut(i) {
            m.kill();
        }
    }

    /// The index of the member that says it is the leader (running members only), if one is
    /// elected now.
    pub fn leader(&self) -> Option<usize> {
        self.members.iter().position(|m| m.child.is_some() && etcd_is_leader(m.addr()))
    }

    /// Kills the leader with SIGKILL, waiting up to `within` for there to be one (between
    /// elections there is none); returns its index.
    pub async fn kill_leader(&mut self, within: Duration) -> std::io::Result<usize> {
        let leader = wait_for_leader("the etcd cluster", within, || self.leader()).await?;
        self.kill_member(leader);
        Ok(leader)
    }

    /// Starts member `i` again (after [`kill_member`](Self::kill_member); a running member is
    /// killed first) with its data directory, so it rejoins the cluster as the same member.
    /// Waits until it reports itself healthy.
    pub fn restart_member(&mut self, i: usize) -> std::io::Result<()> {
        let member = self.members.get_mut(i).ok_or_else(|| std::io::Error::other(format!("no member {i}")))?;
        member.restart()?;
        wait_etcd_healthy(&[&*member])
    }

    /// Whether member `i` reports itself healthy (part of a quorum with a leader).
    pub fn member_healthy(&self, i: usize) -> bool {
        self.members.get(i).is_some_and(|m| m.child.is_some() && etcd_healthy(m.addr()))
    }
}

/// Sends a ZooKeeper four-letter command and returns the answer ("" if unreachable).
fn zk_four_letters(addr: SocketAddr, command: &str) -> String {
    ask(addr, command.as_bytes())
}

/// A ZooKeeper ensemble of the test's own on loopback (tickTime 500 ms, admin server off), run
/// from Debian's jars on `classpath` (`PALISADE_ZK_CLASSPATH`). Members are killed and their
/// directories removed when it is dropped.
#[derive(Debug)]
pub struct ZkEnsemble {
    members: Vec<LoopbackServer>,
    /// The certificates of a TLS-only ensemble ([`ZkEnsemble::start_tls`]), to ask it over TLS.
    tls: Option<PathBuf>,
}

/// The SASL (DIGEST-MD5) user a TLS-only ZooKeeper ([`ZkEnsemble::start_tls`]) knows.
pub const ZK_SASL_USER: &str = "palisade";
/// [`ZK_SASL_USER`]'s password.
pub const ZK_SASL_PASSWORD: &str = "palisade-sasl-secret";

impl ZkEnsemble {
    /// Member `i`'s pid (`None` if there is no such member, or it is stopped).
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members.get(i).and_then(LoopbackServer::pid)
    }

    /// Starts `size` servers and waits until each is a leader or a follower.
    pub fn start(classpath: &str, size: usize) -> std::io::Result<Self> {
        ZkEnsemble::start_at(classpath, &vec![Site::loopback(); size])
    }

    /// One server at each site (server `i` at `sites[i]`: on lab hosts, so that a partition
    /// can cut one off); waits until each is a leader or a follower.
    pub fn start_at(classpath: &str, sites: &[Site]) -> std::io::Result<Self> {
        ZkEnsemble::start_configured(classpath, sites, None)
    }

    /// One server that speaks only TLS (Netty, `secureClientPort`, no plaintext port) with the
    /// certificates in `certs` as [`tls::material`](crate::tls::material) makes them, and
    /// demands of every client a certificate its CA signed (`ssl.clientAuth=need`) and a SASL
    /// DIGEST-MD5 login as [`ZK_SASL_USER`] (`enforce.auth.schemes=sasl`). `classpath` must
    /// hold Netty's jars ([`ZK_CLASSPATH`](crate::services::ZK_CLASSPATH) does).
    pub fn start_tls(classpath: &str, certs: &Path) -> std::io::Result<Self> {
        ZkEnsemble::start_configured(classpath, &[Site::loopback()], Some(certs))
    }

    fn start_configured(classpath: &str, sites: &[Site], tls: Option<&Path>) -> std::io::Result<Self> {
        let size = sites.len();
        let ports: Vec<(u16, u16, u16)> =
            sites.iter().map(|_| Ok((free_port()?, free_port()?, free_port()?))).collect::<std::io::Result<_>>()?;
        let servers: String = ports
            .iter()
            .zip(sites)
            .enumerate()
            .map(|(i, ((_, quorum, election), site))| format!("server.{}={}:{quorum}:{election}\n", i + 1, site.ip))
            .collect();
        let mut members = Vec::with_capacity(size);
        for (i, ((port, _, _), site)) in ports.iter().zip(sites).enumerate() {
            let mut written = Ok(());
            let member = LoopbackServer::spawn_unchecked(site, "java", *port, |port, dir| {
                let data = dir.join("data");
                written = std::fs::create_dir_all(&data)
                    .and_then(|()| std::fs::write(data.join("myid"), format!("{}\n", i + 1)))
                    .and_then(|()| {
                        let listen = match tls {
                            None => format!("clientPort={port}\nclientPortAddress={}\n", site.ip),
                            Some(certs) => zk_tls_settings(port, site.ip, certs, dir)?,
                        };
                        std::fs::write(
                            dir.join("zoo.cfg"),
                            format!(
                                "tickTime=500\ninitLimit=10\nsyncLimit=5\ndataDir={}\n{listen}\
                                 admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr\n{servers}",
                                data.display(),
                            ),
                        )
                    });
                let mut args = vec![
                    "-Xms32m".to_string(),
                    "-Xmx256m".into(),
                    "-XX:+UseSerialGC".into(),
                    "-cp".into(),
                    classpath.into(),
                    format!("-Dzookeeper.log.dir={}", dir.display()),
                ];
                if tls.is_some() {
                    args.push(format!("-Djava.security.auth.login.config={}", dir.join("jaas.conf").display()));
                }
                args.push("org.apache.zookeeper.server.quorum.QuorumPeerMain".into());
                args.push(dir.join("zoo.cfg").display().to_string());
                args
            })?;
            written?;
            members.push(member);
        }
        let ensemble = ZkEnsemble { members, tls: tls.map(Path::to_path_buf) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(0..size).all(|i| ensemble.serving(i)) {
            if Instant::now() > deadline {
                let members: Vec<&LoopbackServer> = ensemble.members.iter().collect();
                return Err(not_ready("ZooKeeper", "did not form an ensemble in 30 s", &members, |m| {
                    !zk_four_letters(m.addr(), "srvr").lines().any(|l| l.starts_with("Mode: "))
                }));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(ensemble)
    }

    /// `zk://127.0.0.1:P1,127.0.0.1:P2,…` with every member (`zks://…` when it speaks TLS).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.members.iter().map(|m| m.addr().to_string()).collect();
        let scheme = if self.tls.is_some() { "zks" } else { "zk" };
        format!("{scheme}://{}", hosts.join(","))
    }

    /// Member `i`'s answer to the four-letter `srvr` ("" when it is down or not answering).
    fn status(&self, i: usize) -> String {
        let Some(member) = self.members.get(i).filter(|m| m.child.is_some()) else { return String::new() };
        match &self.tls {
            None => zk_four_letters(member.addr(), "srvr"),
            Some(certs) => crate::tls::ask(member.addr(), certs, b"srvr"),
        }
    }

    /// Member `i`'s role (`"leader"`, `"follower"`), or `None` if it is down or not serving.
    pub fn mode(&self, i: usize) -> Option<String> {
        let reply = self.status(i);
        reply.lines().find_map(|l| l.strip_prefix("Mode: ")).map(str::to_string).filter(|m| m != "standalone")
    }

    /// Whether member `i` serves clients (as leader, follower, or a standalone server when the
    /// ensemble has one member).
    pub fn serving(&self, i: usize) -> bool {
        self.status(i).lines().any(|l| l.starts_with("Mode: "))
    }

    /// Restarts member `i` (SIGKILL, then the same command): its data directory survives, as
    /// ZooKeeper's does on a real restart. Waits until it serves again.
    pub fn restart_member(&mut self, i: usize) -> std::io::Result<()> {
        let member = self.members.get_mut(i).ok_or_else(|| std::io::Error::other(format!("no member {i}")))?;
        member.restart()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.serving(i) {
            if Instant::now() > deadline {
                let member = &self.members[i];
                return Err(not_ready(
                    "ZooKeeper",
                    &format!("(member {i}) did not come back in 30 s"),
                    &[member],
                    |_| true,
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// Restarts every member (all killed first, then all started): keeping their data
    /// ([`Restart::KeepData`]: a restart of the whole ensemble), wiping their snapshots and
    /// transaction logs ([`Restart::LoseData`]: an ensemble restored empty, every zxid starts
    /// again from zero), or taking or restoring a snapshot of every member. Waits until every
    /// member serves again.
    pub fn restart_as(&mut self, how: Restart) -> std::io::Result<()> {
        for member in &mut self.members {
            member.kill();
        }
        for member in &mut self.members {
            match how {
                // Its identity (`myid`, `zoo.cfg`) stays: only ZooKeeper's own state goes.
                Restart::LoseData => remove_dir_if_present(&member.dir().join("data").join("version-2"))?,
                _ => member.prepare_data(how)?,
            }
        }
        for member in &mut self.members {
            member.spawn()?;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(0..self.members.len()).all(|i| self.serving(i)) {
            if Instant::now() > deadline {
                let members: Vec<&LoopbackServer> = self.members.iter().collect();
                return Err(not_ready("ZooKeeper", "did not come back in 30 s", &members, |_| true));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// The index of the current leader, if one is serving.
    pub fn leader(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| self.mode(i).as_deref() == Some("leader"))
    }

    /// Kills the leader with SIGKILL, waiting up to `within` for there to be one (between
    /// elections there is none); returns its index.
    pub async fn kill_leader(&mut self, within: Duration) -> std::io::Result<usize> {
        let leader = wait_for_leader("the ZooKeeper ensemble", within, || self.leader()).await?;
        self.kill_member(leader);
        Ok(leader)
    }

    /// Kills member `i` with SIGKILL.
    pub fn kill_member(&mut self, i: usize) {
        if let Some(m) = self.members.get_mut(i) {
            m.kill();
        }
    }

    /// Lets every member run on after this handle is gone ([`LoopbackServer::detach`]): their
    /// pids and data directories.
    pub fn detach(self) -> Vec<(u32, PathBuf)> {
        self.members.into_iter().filter_map(LoopbackServer::detach).collect()
    }
}

/// The `zoo.cfg` lines of a TLS-only server on `ip:port` ([`ZkEnsemble::start_tls`]), with the
/// JAAS file its SASL login needs written into `dir` beside it.
fn zk_tls_settings(port: u16, ip: IpAddr, certs: &Path, dir: &Path) -> std::io::Result<String> {
    std::fs::write(
        dir.join("jaas.conf"),
        format!(
            "Server {{\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n  \
             user_{ZK_SASL_USER}=\"{ZK_SASL_PASSWORD}\";\n}};\n"
        ),
    )?;
    let file = |name: &str| certs.join(name).display().to_string();
    Ok(format!(
        "secureClientPort={port}\nsecureClientPortAddress={ip}\n\
         serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
         ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
         ssl.trustStore.location={}\nssl.trustStore.type=PEM\nssl.clientAuth=need\n\
         authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider\n\
         enforce.auth.enabled=true\nenforce.auth.schemes=sasl\n",
        file("server.pem"),
        file("ca.crt"),
    ))
}

/// A PostgreSQL server of the caller's own (Debian's newest major version, run as the
/// `postgres` user, which it needs when the tests run as root), on its own port and directory:
/// for `palisade compare --local` and for tests that restart or wipe their server.
pub struct PostgresServer {
    server: LoopbackServer,
    bin: PathBuf,
}

impl PostgresServer {
    /// Lets the server run on after this handle is gone ([`LoopbackServer::detach`]): its pid
    /// (stop it with SIGINT, a fast shutdown) and data directory.
    pub fn detach(self) -> Option<(u32, PathBuf)> {
        self.server.detach()
    }

    /// The postmaster's pid (`None` once stopped). Each session is a child process of it: to
    /// freeze the whole server, signal its descendants too.
    pub fn pid(&self) -> Option<u32> {
        self.server.pid()
    }

    /// Initialises a database cluster (trust authentication, user `postgres`) and starts it.
    pub fn start() -> std::io::Result<Self> {
        PostgresServer::start_at(&Site::loopback())
    }

    /// [`start`](Self::start) at `site` (a lab's gateway, say, for clients on lab hosts).
    pub fn start_at(site: &Site) -> std::io::Result<Self> {
        PostgresServer::start_configured(site, None)
    }

    /// A server that speaks only TLS, with the certificates in `certs` (`ca.crt`,
    /// `server.crt`/`server.key` for 127.0.0.1, as the lab makes them for its TLS servers): `ssl = on`,
    /// and `pg_hba.conf` has `hostssl` lines only, so a plaintext session is refused. Role
    /// `palisade_cert` (created by its user) must present a client certificate the CA signed
    /// (`clientcert=verify-ca`); every other role is trusted over TLS. It listens on 127.0.0.1 and
    /// on 127.0.0.2, an address its certificate does not name.
    pub fn start_tls(certs: &Path) -> std::io::Result<Self> {
        PostgresServer::start_configured(&Site::loopback(), Some(certs))
    }

    fn start_configured(site: &Site, tls: Option<&Path>) -> std::io::Result<Self> {
        let bin = postgres_bin_dir()?;
        let mut init = Ok(());
        let listen = match tls {
            Some(_) => format!("listen_addresses={},127.0.0.2", site.ip),
            None => format!("listen_addresses={}", site.ip),
        };
        let server = LoopbackServer::start_at(site, "setpriv", |port, dir| {
            init = initdb(&bin, dir).and_then(|()| match tls {
                Some(certs) => tls_only(certs, dir),
                None => Ok(()),
            });
            let ssl = match tls {
                Some(_) => [
                    "-c",
                    "ssl=on",
                    "-c",
                    "ssl_cert_file=server.crt",
                    "-c",
                    "ssl_key_file=server.key",
                    "-c",
                    "ssl_ca_file=ca.crt",
                ]
                .map(String::from)
                .to_vec(),
                None => Vec::new(),
            };
            [
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                &bin.join("postgres").display().to_string(),
                "-D",
                &dir.join("data").display().to_string(),
                "-p",
                &port.to_string(),
                "-k",
                &dir.display().to_string(),
                "-c",
                &listen,
                "-c",
                "max_connections=300",
            ]
            .map(String::from)
            .into_iter()
            .chain(ssl)
            .collect()
        })?;
        init?;
        let server = PostgresServer { server, bin };
        server.wait_ready()?;
        Ok(server)
    }

    /// `postgres://postgres@IP:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@{}/postgres", self.server.addr())
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// Kills it (SIGKILL: the next start runs crash recovery) and starts it again as `how`
    /// says; [`Restart::LoseData`] starts it with a new, empty database cluster.
    /// Returns once it accepts sessions (past crash recovery, not only listening).
    pub fn restart_as(&mut self, how: Restart) -> std::io::Result<()> {
        self.server.kill();
        let dir = self.server.dir().to_path_buf();
        if how == Restart::LoseData {
            std::fs::remove_dir_all(dir.join("data"))?;
            initdb(&self.bin, &dir)?;
        } else {
            self.server.prepare_data(how)?;
        }
        // Every process of the old server is gone (`kill`), so its lock files are stale; a
        // restored one names a pid another process may have by now, which refuses the start.
        let socket_lock = format!(".s.PGSQL.{}.lock", self.port());
        for stale in [dir.join("data").join("postmaster.pid"), dir.join(socket_lock)] {
            remove_file_if_present(&stale)?;
        }
        self.server.spawn()?;
        self.wait_ready()
    }

    /// Waits up to 10 s until `pg_isready` says it accepts sessions: a server that listens
    /// may still be in crash recovery ("the database system is starting up").
    fn wait_ready(&self) -> std::io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ready = Command::new(self.bin.join("pg_isready"))
                .args(["-q", "-h", &self.server.site.ip.to_string(), "-p", &self.port().to_string()])
                .status()?;
            if ready.success() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(not_ready("PostgreSQL", "did not accept sessions in 10 s", &[&self.server], |_| true));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Makes the cluster in `dir/data` speak only TLS: the certificates copied in beside its
/// configuration (the key readable by `postgres` alone, which the server demands) and
/// `pg_hba.conf` replaced by `hostssl` lines (see [`PostgresServer::start_tls`]).
fn tls_only(certs: &Path, dir: &Path) -> std::io::Result<()> {
    let data = dir.join("data");
    for name in ["ca.crt", "server.crt", "server.key"] {
        std::fs::copy(certs.join(name), data.join(name))?;
    }
    std::fs::set_permissions(data.join("server.key"), std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    std::fs::write(
        data.join("pg_hba.conf"),
        "local all all trust\nhostssl all palisade_cert 127.0.0.0/8 trust clientcert=verify-ca\nhostssl all all 127.0.0.0/8 trust\n",
    )?;
    let status = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&data).status()?;
    if !status.success() {
        return Err(std::io::Error::other(format!("chown of {} exited with {status}", data.display())));
    }
    Ok(())
}

/// `initdb` of `dir/data`, owned by `postgres`.
fn initdb(bin: &Path, dir: &Path) -> std::io::Result<()> {
    let run = |cmd: &mut Command| match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(std::io::Error::other(format!("{cmd:?} exited with {s}"))),
        Err(e) => Err(std::io::Error::other(format!("{cmd:?}: {e}"))),
    };
    run(Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir))?;
    run(Command::new("setpriv")
        .args(["--reuid=postgres", "--regid=postgres", "--init-groups"])
        .arg(bin.join("initdb"))
        .arg("-D")
        .arg(dir.join("data"))
        .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C.UTF-8"])
        .stdout(Stdio::null())
        .stderr(Stdio::null()))?;
    // initdb trusts loopback only; a server on a lab's gateway serves the lab's hosts too
    // (`samenet`: the subnets the server's own addresses are on; it listens on one address).
    let hba = dir.join("data").join("pg_hba.conf");
    let mut rules = std::fs::read_to_string(&hba)?;
    rules.push_str("\nhost all all samenet trust\n");
    std::fs::write(&hba, rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_that_exits_at_start_says_why_at_once() {
        let started = Instant::now();
        let err = LoopbackServer::start("sh", |port, _| {
            vec!["-c".into(), format!("echo 'cannot bind 127.0.0.1:{port}: boom' >&2; exit 3")]
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("exited (exit status: 3) before it listened"), "{err}");
        assert!(err.contains("cannot bind 127.0.0.1:") && err.contains("boom"), "the log's end is in: {err}");
        assert!(started.elapsed() < Duration::from_secs(5), "did not wait out the 10 s deadline");
    }

    #[test]
    fn ports_are_free_distinct_and_outside_the_ephemeral_range() {
        let (low, high) = below_ephemeral_range();
        let ports: Vec<u16> = (0..50).map(|_| free_port().unwrap()).collect();
        let distinct: BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "a port was handed out twice: {ports:?}");
        for port in ports {
            if high > low {
                assert!((low..high).contains(&port), "{port} is not in [{low}, {high})");
            }
            TcpListener::bind(("127.0.0.1", port)).unwrap();
        }
    }

    /// The test command runs test binaries side by side: ports that two processes hand out at
    /// the same time, before their servers bind them, must differ too.
    #[test]
    fn ports_of_two_processes_never_coincide() {
        const COUNT: usize = 300;
        let ours: BTreeSet<u16> = (0..COUNT).map(|_| free_port().unwrap()).collect();
        let exe = std::env::current_exe().unwrap();
        let output = Command::new(exe)
            .args(["--exact", "servers::tests::hands_out_ports_to_another_process", "--nocapture"])
            .env(PORTS_FOR_THE_PARENT, COUNT.to_string())
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let theirs: BTreeSet<u16> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| line.strip_prefix("port ")?.parse().ok())
            .collect();
        assert_eq!(theirs.len(), COUNT, "the other process printed {theirs:?}");
        let both: Vec<&u16> = ours.intersection(&theirs).collect();
        assert!(both.is_empty(), "handed out by both processes: {both:?}");
    }

    const PORTS_FOR_THE_PARENT: &str = "PALISADE_LAB_TEST_PORTS_FOR_THE_PARENT";

    /// The other process of [`ports_of_two_processes_never_coincide`]: prints the ports it was
    /// asked for, when run with [`PORTS_FOR_THE_PARENT`] set (a plain test run does nothing).
    #[test]
    fn hands_out_ports_to_another_process() {
        if let Ok(count) = std::env::var(PORTS_FOR_THE_PARENT) {
            for _ in 0..count.parse::<usize>().unwrap() {
                println!("port {}", free_port().unwrap());
            }
        }
    }

    /// A backend busy in a query does not notice that its postmaster died: a restart that
    /// killed only the postmaster found the old shared memory still attached and exited 1
    /// ("pre-existing shared memory block is still in use"), as in a CI run.
    #[test]
    fn a_postgres_restart_with_a_busy_backend_starts_again() {
        const BUSY_FOR_A_MINUTE: &str = "SELECT count(*) FROM (SELECT generate_series(1, 1000000000)) AS busy";
        let mut server = PostgresServer::start().unwrap();
        let psql = postgres_bin_dir().unwrap().join("psql");
        let mut busy = Command::new(psql)
            // Busy on the CPU for a minute or two, and on nothing else: a set-returning function
            // in the select list streams its rows, where one in FROM would store them all in
            // temporary files. (A test binary killed at its bound orphaned this backend, which
            // does not notice its postmaster is gone, and the rows it stored filled /dev/shm.)
            .args(["-X", "-q", "-d", &server.url(), "-c", BUSY_FOR_A_MINUTE])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let restarted = server.restart_as(Restart::KeepData);
        let _ = busy.kill();
        let _ = busy.wait();
        restarted.unwrap();
        assert!(TcpStream::connect(server.server.addr()).is_ok());
    }

    /// A restore brings back what the snapshot had and nothing written after it.
    #[test]
    fn a_postgres_restored_from_a_snapshot_has_what_it_had_then() {
        let mut server = PostgresServer::start().unwrap();
        let url = server.url();
        let psql = |sql: &str| {
            let out = Command::new(postgres_bin_dir().unwrap().join("psql"))
                .args(["-X", "-q", "-A", "-t", "-d", &url, "-c", sql])
                .output()
                .unwrap();
            assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        psql("CREATE TABLE before_the_snapshot ()");
        server.restart_as(Restart::Snapshot).unwrap();
        psql("CREATE TABLE after_the_snapshot ()");
        server.restart_as(Restart::FromSnapshot).unwrap();
        let tables = "SELECT to_regclass('before_the_snapshot') IS NOT NULL, to_regclass('after_the_snapshot') IS NULL";
        assert_eq!(psql(tables), "t|t");
        server.restart_as(Restart::LoseData).unwrap();
        assert_eq!(psql("SELECT to_regclass('before_the_snapshot') IS NULL"), "t");
        server.restart_as(Restart::FromSnapshot).unwrap();
        assert_eq!(psql(tables), "t|t", "the snapshot outlives a wipe");
    }

    #[test]
    fn a_log_tail_keeps_the_last_lines() {
        let mut server = LoopbackServer::spawn_unchecked(&Site::loopback(), "sh", free_port().unwrap(), |_, _| {
            vec!["-c".into(), "for i in 1 2 3 4 5; do echo line$i; done".into()]
        })
        .unwrap();
        if let Some(child) = server.child.as_mut() {
            child.wait().unwrap();
        }
        assert_eq!(server.log_tail(2), "line4\nline5");
        assert_eq!(process_state(std::process::id()), "running");
    }
}
