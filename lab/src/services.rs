//! The shared servers of the test command, started once and left running for every test:
//! what `palisade-lab up` starts and `palisade-lab down` stops (`scripts/services`,
//! `scripts/test`). Each is a server of [`servers`](crate::servers) detached from this process;
//! their pids and directories are recorded in the state directory, with an `env` file of the
//! variables the tests read.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::servers::{LoopbackServer, PostgresServer, RedisCluster, RedisSentinels, ZkEnsemble, postgres_bin_dir};

/// Debian's ZooKeeper jars, which the ZooKeeper servers run from, with the Netty jars its TLS
/// connection factory needs.
pub const ZK_CLASSPATH: &str = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar:\
                                /usr/share/java/netty-buffer.jar:/usr/share/java/netty-codec.jar:\
                                /usr/share/java/netty-common.jar:/usr/share/java/netty-handler.jar:\
                                /usr/share/java/netty-resolver.jar:/usr/share/java/netty-transport.jar:\
                                /usr/share/java/netty-transport-native-unix-common.jar:\
                                /usr/share/java/netty-transport-native-epoll.jar";

const PIDS: &str = "pids";
const CLEANUP: &str = "cleanup";
const ENV: &str = "env";

/// What `up` started: the variables to export, in order.
#[derive(Debug, Default)]
pub struct Started {
    /// `(NAME, value)` pairs for the tests' environment.
    pub env: Vec<(String, String)>,
}

impl Started {
    fn set(&mut self, name: &str, value: impl Into<String>) {
        self.env.push((name.to_string(), value.into()));
    }

    /// The `env` file's text: one `export NAME='value'` line each (quoted for the shell).
    pub fn exports(&self) -> String {
        let mut out = String::new();
        for (name, value) in &self.env {
            let _ = writeln!(out, "export {name}='{}'", value.replace('\'', "'\\''"));
        }
        out
    }
}

/// Records a detached server so that [`down`] stops it and removes its directory.
fn record(state: &Path, name: &str, detached: Option<(u32, PathBuf)>) -> std::io::Result<()> {
    let (pid, dir) = detached.ok_or_else(|| std::io::Error::other(format!("{name} is not running")))?;
    append(&state.join(PIDS), &format!("{pid} {name}\n"))?;
    append(&state.join(CLEANUP), &format!("{}\n", dir.display()))
}

fn append(path: &Path, line: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    std::fs::OpenOptions::new().create(true).append(true).open(path)?.write_all(line.as_bytes())
}

/// The program `name` on `PATH`.
fn which(name: &str) -> std::io::Result<String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .map(|p| p.display().to_string())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("`{name}` is not installed (scripts/test installs every server it needs)"),
            )
        })
}

/// The shared servers, by the names [`up`] takes.
pub const SERVERS: &[&str] = &[
    "redis",
    "redis-tls",
    "redis-sentinel",
    "redis-cluster",
    "redlock",
    "postgres",
    "postgres-tls",
    "etcd",
    "etcd-tls",
    "dynamodb",
    "dynamodb-tls",
    "zookeeper",
    "zookeeper-tls",
];

/// How long the shared Sentinels and cluster nodes wait before judging a server failed.
const SHARED_FAILURE_DETECTION: Duration = Duration::from_secs(10);

/// The shared servers that are `redis-server` processes.
const REDIS_SERVERS: &[&str] = &["redis", "redis-tls", "redis-sentinel", "redis-cluster", "redlock"];

/// Starts the shared servers named in `only` (every one of [`SERVERS`] when empty), after
/// stopping whatever an earlier `up` left in `state`: Redis, a TLS-only Redis demanding client
/// certificates, a Sentinel group (a master, a replica, three Sentinels), a Redis Cluster (three
/// primaries with a replica each), five Redlock masters, PostgreSQL, a TLS-only PostgreSQL
/// ([`PostgresServer::start_tls`]), etcd, a TLS-only etcd demanding client certificates
/// ([`LoopbackServer::etcd_tls`]), a DynamoDB-API
/// server (moto, from `PALISADE_MOTO_PYTHON`) and one behind a TLS terminator
/// (`dynamodb-tls`, started only by the `palisade-lab` program), ZooKeeper and a TLS-only ZooKeeper demanding
/// client certificates and a SASL login ([`ZkEnsemble::start_tls`]), each on a free port of
/// 127.0.0.1.
/// Writes `state/env` and returns what it holds.
pub fn up(state: &Path, repo: &Path, only: &[String]) -> std::io::Result<Started> {
    if let Some(unknown) = only.iter().find(|name| !SERVERS.contains(&name.as_str())) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("no server is called `{unknown}` (there are: {})", SERVERS.join(", ")),
        ));
    }
    let want = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    std::fs::create_dir_all(state)?;
    down(state)?;
    let mut started = Started::default();

    let redis_server = if REDIS_SERVERS.iter().any(|name| want(name)) {
        let program = which("redis-server")?;
        started.set("PALISADE_REDIS_SERVER", program.clone());
        program
    } else {
        String::new()
    };
    if want("redis") {
        let redis = LoopbackServer::redis(&redis_server, &[])?;
        started.set("PALISADE_REDIS_URL", redis.redis_url());
        record(state, "redis", redis.detach())?;
    }
    if want("redis-tls") {
        start_redis_tls(state, &redis_server, &mut started)?;
    }
    if want("redis-sentinel") {
        // Long-lived and shared by parallel tests: a failover by mistake on a loaded machine
        // would move the master away from a certification's fault proxy.
        let group = RedisSentinels::start_patient(&redis_server, SHARED_FAILURE_DETECTION)?;
        started.set("PALISADE_REDIS_SENTINEL_URL", group.url());
        for detached in group.detach() {
            record(state, "redis-sentinel", detached)?;
        }
    }
    if want("redis-cluster") {
        let cluster = RedisCluster::start_patient(&redis_server, SHARED_FAILURE_DETECTION)?;
        started.set("PALISADE_REDIS_CLUSTER_URL", cluster.url());
        for detached in cluster.detach() {
            record(state, "redis-cluster", detached)?;
        }
    }
    if want("redlock") {
        let mut masters = Vec::new();
        for i in 1..=5 {
            let master = LoopbackServer::redis(&redis_server, &[])?;
            masters.push(master.addr().to_string());
            record(state, &format!("redlock{i}"), master.detach())?;
        }
        started.set("PALISADE_REDLOCK_URL", format!("redlock://{}", masters.join(",")));
    }
    if want("postgres") {
        let postgres = PostgresServer::start()?;
        started.set("PALISADE_POSTGRES_URL", postgres.url());
        started.set("PALISADE_POSTGRES_BIN", postgres_bin_dir()?.display().to_string());
        record(state, "postgres", postgres.detach())?;
    }
    if want("postgres-tls") {
        let certs = state.join("postgres-tls-certs");
        crate::tls::material(&certs)?;
        let postgres = PostgresServer::start_tls(&certs)?;
        started.set("PALISADE_POSTGRES_TLS_URL", postgres.url());
        started.set("PALISADE_POSTGRES_TLS_CA", certs.join("ca.crt").display().to_string());
        started.set("PALISADE_POSTGRES_TLS_OTHER_CA", certs.join("other-ca.crt").display().to_string());
        started.set("PALISADE_POSTGRES_TLS_CLIENT_CERT", certs.join("client.crt").display().to_string());
        started.set("PALISADE_POSTGRES_TLS_CLIENT_KEY", certs.join("client.key").display().to_string());
        record(state, "postgres-tls", postgres.detach())?;
    }
    if want("etcd") {
        let etcd_server = which("etcd")?;
        let etcd = LoopbackServer::etcd(&etcd_server)?;
        started.set("PALISADE_ETCD_URL", etcd.etcd_url());
        started.set("PALISADE_ETCD_SERVER", etcd_server);
        record(state, "etcd", etcd.detach())?;
    }
    if want("etcd-tls") {
        let certs = state.join("etcd-tls-certs");
        crate::tls::material(&certs)?;
        let etcd = LoopbackServer::etcd_tls(&which("etcd")?, &certs)?;
        started.set("PALISADE_ETCD_TLS_URL", format!("etcds://{}", etcd.addr()));
        started.set("PALISADE_ETCD_TLS_CERTS", certs.display().to_string());
        record(state, "etcd-tls", etcd.detach())?;
    }
    if want("dynamodb") {
        let moto = start_moto(repo)?;
        started.set("PALISADE_DYNAMODB_ENDPOINT", format!("http://{}", moto.addr()));
        aws_environment(&mut started);
        record(state, "dynamodb", moto.detach())?;
    }
    if want("dynamodb-tls") {
        start_dynamodb_tls(state, repo, &mut started)?;
    }
    if want("zookeeper") {
        // tickTime 500 ms, so that the tests' short sessions are allowed (the minimum is 2 ticks).
        let zookeeper = ZkEnsemble::start(ZK_CLASSPATH, 1)?;
        started.set("PALISADE_ZK_URL", zookeeper.url());
        started.set("PALISADE_ZK_CLASSPATH", ZK_CLASSPATH);
        for detached in zookeeper.detach() {
            record(state, "zookeeper", Some(detached))?;
        }
    }
    if want("zookeeper-tls") {
        let certs = state.join("zookeeper-tls-certs");
        crate::tls::material(&certs)?;
        let zookeeper = ZkEnsemble::start_tls(ZK_CLASSPATH, &certs)?;
        started.set("PALISADE_ZK_TLS_URL", zookeeper.url());
        started.set("PALISADE_ZK_TLS_CERTS", certs.display().to_string());
        for detached in zookeeper.detach() {
            record(state, "zookeeper-tls", Some(detached))?;
        }
    }
    std::fs::write(state.join(ENV), started.exports())?;
    Ok(started)
}

/// A TLS-only Redis that demands client certificates (mutual TLS), with a throwaway CA.
fn start_redis_tls(state: &Path, redis_server: &str, started: &mut Started) -> std::io::Result<()> {
    let certs = state.join("redis-tls-certs");
    crate::tls::material(&certs)?;
    let tls = LoopbackServer::redis_tls(redis_server, &certs)?;
    started.set("PALISADE_REDIS_TLS_URL", format!("rediss://{}", tls.addr()));
    started.set("PALISADE_REDIS_TLS_CA", certs.join("ca.crt").display().to_string());
    started.set("PALISADE_REDIS_TLS_CLIENT_CERT", certs.join("client.crt").display().to_string());
    started.set("PALISADE_REDIS_TLS_CLIENT_KEY", certs.join("client.key").display().to_string());
    started.set("PALISADE_REDIS_TLS_CERTS", certs.display().to_string());
    record(state, "redis-tls", tls.detach())?;
    Ok(())
}

/// The DynamoDB-API server: moto, one request at a time (see `scripts/lib/moto_serial.py`).
fn start_moto(repo: &Path) -> std::io::Result<LoopbackServer> {
    let python = std::env::var("PALISADE_MOTO_PYTHON").map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "PALISADE_MOTO_PYTHON is not set: install the prerequisites first (scripts/lib/prerequisites.sh)",
        )
    })?;
    let serial = repo.join("scripts/lib/moto_serial.py").display().to_string();
    LoopbackServer::start(&python, |port, _| vec![serial, "127.0.0.1".into(), port.to_string()])
}

/// The credentials and region every DynamoDB test client finds in its environment: moto
/// accepts any credentials, and the SDK's standard chain reads these.
fn aws_environment(started: &mut Started) {
    if !started.env.iter().any(|(name, _)| name == "AWS_ACCESS_KEY_ID") {
        started.set("AWS_ACCESS_KEY_ID", "palisade-test");
        started.set("AWS_SECRET_ACCESS_KEY", "palisade-test");
        started.set("AWS_REGION", "us-east-1");
    }
}

/// A DynamoDB endpoint that speaks only HTTPS: a moto of its own behind this program's TLS
/// terminator (`palisade-lab tls-terminate`, [`crate::tls::terminate`]), which records the
/// access key ids that sign requests in `PALISADE_DYNAMODB_TLS_SIGNERS`.
fn start_dynamodb_tls(state: &Path, repo: &Path, started: &mut Started) -> std::io::Result<()> {
    let moto = start_moto(repo)?;
    let certs = state.join("dynamodb-tls-certs");
    crate::tls::material(&certs)?;
    let signers = certs.join("signers");
    let lab = std::env::current_exe()?.display().to_string();
    let upstream = moto.addr().to_string();
    let terminator = LoopbackServer::start(&lab, |port, _| {
        vec![
            "tls-terminate".to_string(),
            port.to_string(),
            upstream,
            certs.display().to_string(),
            signers.display().to_string(),
        ]
    })?;
    started.set("PALISADE_DYNAMODB_TLS_ENDPOINT", format!("https://{}", terminator.addr()));
    started.set("PALISADE_DYNAMODB_TLS_CERTS", certs.display().to_string());
    started.set("PALISADE_DYNAMODB_TLS_SIGNERS", signers.display().to_string());
    aws_environment(started);
    record(state, "dynamodb-tls", moto.detach())?;
    record(state, "dynamodb-tls", terminator.detach())
}

/// Stops every server an earlier [`up`] recorded in `state` (PostgreSQL with SIGINT, a fast
/// shutdown; the others with SIGTERM, then SIGKILL after 5 s) and removes their directories. A
/// server that already died is fine.
pub fn down(state: &Path) -> std::io::Result<()> {
    let pids = state.join(PIDS);
    let listed = std::fs::read_to_string(&pids).unwrap_or_default();
    let servers: Vec<(Pid, &str)> = listed
        .lines()
        .filter_map(|line| {
            let (pid, name) = line.split_once(' ')?;
            Some((Pid::from_raw(pid.parse::<i32>().ok().filter(|pid| *pid > 1)?), name))
        })
        .collect();
    for (pid, name) in &servers {
        let _ = kill(*pid, if name.starts_with("postgres") { Signal::SIGINT } else { Signal::SIGTERM });
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for (pid, _) in &servers {
        while alive(*pid) && Instant::now() < deadline {
            // Our own child (when `up` and `down` run in one process) must be reaped to go.
            let _ = nix::sys::wait::waitpid(*pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
            std::thread::sleep(Duration::from_millis(50));
        }
        if alive(*pid) {
            // With what it forked: PostgreSQL's backends outlive a killed postmaster.
            crate::servers::kill_tree(pid.as_raw().unsigned_abs());
        }
    }
    let _ = std::fs::remove_file(&pids);
    let cleanup = state.join(CLEANUP);
    for dir in std::fs::read_to_string(&cleanup).unwrap_or_default().lines() {
        let _ = std::fs::remove_dir_all(dir);
    }
    let _ = std::fs::remove_file(cleanup);
    let _ = std::fs::remove_file(state.join(ENV));
    Ok(())
}

/// Whether `pid` is a live process: one that exists and is not a zombie waiting for a parent
/// that does not reap it (servers outlive the `up` that started them).
fn alive(pid: Pid) -> bool {
    if kill(pid, None).is_err() {
        return false;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the parenthesised command name, which may itself contain spaces.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
    state != Some("Z")
}
