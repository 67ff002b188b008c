//! `--local`: the project's own servers on loopback, started here and stopped on drop.

use palisade_lab::servers::{EtcdCluster, LoopbackServer, PostgresServer, ZkEnsemble};

use crate::target::{Backend, LockTarget, StoreTarget};

/// Debian's ZooKeeper jars (what `palisade-lab up` uses).
pub fn zk_classpath() -> String {
    std::env::var("PALISADE_ZK_CLASSPATH").unwrap_or_else(|_| palisade_lab::services::ZK_CLASSPATH.to_string())
}

/// The single-node servers every pair uses.
pub struct Local {
    redis: LoopbackServer,
    redlock: Vec<LoopbackServer>,
    etcd: LoopbackServer,
    zk: ZkEnsemble,
    postgres: PostgresServer,
    /// Holds the SQLite file; removed on drop.
    _sqlite_dir: tempfile::TempDir,
    pub locks: Vec<LockTarget>,
    pub stores: Vec<StoreTarget>,
}

fn io(what: &str, e: std::io::Error) -> String {
    format!("cannot start {what}: {e} (run scripts/services up once to install the servers)")
}

impl Local {
    pub fn start(session_s: u64) -> Result<Local, String> {
        let redis = LoopbackServer::redis("redis-server", &[]).map_err(|e| io("redis-server", e))?;
        let redlock = (0..3)
            .map(|_| LoopbackServer::redis("redis-server", &[]))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| io("redis-server (Redlock)", e))?;
        let etcd = LoopbackServer::etcd("etcd").map_err(|e| io("etcd", e))?;
        let zk = ZkEnsemble::start(&zk_classpath(), 1).map_err(|e| io("ZooKeeper", e))?;
        let postgres = PostgresServer::start().map_err(|e| io("PostgreSQL", e))?;
        let sqlite_dir = tempfile::tempdir().map_err(|e| io("a SQLite directory", e))?;
        let redlock_url = format!(
            "redlock://{}",
            redlock.iter().map(|m| format!("127.0.0.1:{}", m.port())).collect::<Vec<_>>().join(",")
        );
        let locks = vec![
            LockTarget { label: "Redis".into(), url: redis.redis_url(), backend: Backend::Redis },
            LockTarget { label: "Redlock (3 masters)".into(), url: redlock_url, backend: Backend::Redlock },
            LockTarget {
                label: "etcd".into(),
                url: format!("{}?session_ttl_s={session_s}", etcd.etcd_url()),
                backend: Backend::Etcd,
            },
            LockTarget {
                label: "ZooKeeper".into(),
                url: format!("{}?session_timeout_ms={}", zk.url(), session_s * 1000),
                backend: Backend::Zookeeper,
            },
        ];
        let stores = vec![
            StoreTarget {
                label: "SQLite".into(),
                url: format!("sqlite://{}/compare.db?synchronous=normal", sqlite_dir.path().display()),
            },
            StoreTarget { label: "PostgreSQL".into(), url: postgres.url() },
        ];
        // The store-native services, each in its store's own database (see `Backend::pairs_with`).
        let locks = locks
            .into_iter()
            .chain(stores.iter().map(|s| LockTarget {
                label: s.label.clone(),
                url: s.url.clone(),
                backend: if s.url.starts_with("sqlite:") { Backend::Sqlite } else { Backend::Postgres },
            }))
            .collect();
        Ok(Local { redis, redlock, etcd, zk, postgres, _sqlite_dir: sqlite_dir, locks, stores })
    }

    /// Restarts `backend`'s server: Redis and the Redlock masters without persistence, etcd
    /// with its data wiped (all lose their state); ZooKeeper keeps its data (as it does on a
    /// real restart). Returns what was done, or `None` if this backend has no local server.
    pub fn restart(&mut self, backend: Backend) -> Option<Result<String, String>> {
        let done = match backend {
            Backend::Redis => {
                self.redis.restart().map(|()| "Redis restarted without persistence (all keys lost)".to_string())
            }
            Backend::Redlock => self
                .redlock
                .iter_mut()
                .try_for_each(LoopbackServer::restart)
                .map(|()| "all 3 masters restarted without persistence".to_string()),
            Backend::Etcd => self
                .etcd
                .wipe_and_restart()
                .and_then(|()| self.etcd.wait_etcd_healthy())
                .map(|()| "etcd restarted with its data directory wiped (revisions restart low)".to_string()),
            Backend::Zookeeper => {
                self.zk.restart_member(0).map(|()| "ZooKeeper restarted (its data survives)".to_string())
            }
            Backend::Postgres => self
                .postgres
                .restart_keeping_data(true)
                .map(|()| "PostgreSQL restarted (its data survives; the store's database restarted too)".to_string()),
            Backend::Memory | Backend::Sqlite => return None,
        };
        Some(done.map_err(|e| e.to_string()))
    }
}

/// A 3-member cluster for a leader-kill cell: started fresh for each cell (a killed member does
/// not come back), dropped after.
pub enum Cluster {
    Etcd(EtcdCluster),
    Zk(ZkEnsemble),
}

impl Cluster {
    pub fn start(backend: Backend, session_s: u64) -> Option<Result<(Cluster, String), String>> {
        Some(match backend {
            Backend::Etcd => EtcdCluster::start("etcd", 3)
                .map(|c| {
                    let url = format!("{}?session_ttl_s={session_s}", c.url());
                    (Cluster::Etcd(c), url)
                })
                .map_err(|e| io("an etcd cluster", e)),
            Backend::Zookeeper => ZkEnsemble::start(&zk_classpath(), 3)
                .map(|c| {
                    let url = format!("{}?session_timeout_ms={}", c.url(), session_s * 1000);
                    (Cluster::Zk(c), url)
                })
                .map_err(|e| io("a ZooKeeper ensemble", e)),
            _ => return None,
        })
    }

    /// Kills the current leader (waiting up to 10 s for one: the cluster may be between
    /// elections); says which member it was.
    pub async fn kill_leader(&mut self) -> Result<String, String> {
        let within = std::time::Duration::from_secs(10);
        match self {
            Cluster::Zk(zk) => zk.kill_leader(within).await.map(|i| format!("ZooKeeper member {i}")),
            Cluster::Etcd(etcd) => etcd.kill_leader(within).await.map(|i| format!("etcd member m{i}")),
        }
        .map_err(|e| e.to_string())
    }
}
