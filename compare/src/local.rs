//! `--local`: the project's own servers on loopback, started here and stopped on drop.

use palisade_lab::servers::{EtcdCluster, LoopbackServer, PostgresServer, Restart, ZkEnsemble};

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

    /// Restarts `backend`'s server keeping its data (`keep_data`: Redis and the Redlock masters
    /// save a snapshot first), or makes the lock service lose its data: Redis, the Redlock
    /// masters, etcd and ZooKeeper restart with their data directories wiped; the PostgreSQL
    /// and SQLite services, whose data shares a database with the store, lose their lock table
    /// (every fence counter) while the store's data stays. Returns what was done, or `None` if
    /// there is nothing to do (an in-process service; a file has no server to restart).
    pub async fn restart(&mut self, backend: Backend, keep_data: bool) -> Option<Result<String, String>> {
        let done = match (backend, keep_data) {
            (Backend::Redis, true) => save(&self.redis)
                .await
                .and_then(|()| self.redis.restart().map_err(|e| e.to_string()))
                .map(|()| "Redis saved a snapshot and restarted (its keys survive)".to_string()),
            (Backend::Redis, false) => self
                .redis
                .wipe_and_restart()
                .map(|()| "Redis restarted with its data wiped (every key lost)".to_string())
                .map_err(|e| e.to_string()),
            (Backend::Redlock, keep) => {
                let mut done = Ok(());
                for master in &mut self.redlock {
                    if keep {
                        done = done.and(save(master).await);
                    }
                    done = done.and_then(|()| {
                        if keep { master.restart() } else { master.wipe_and_restart() }.map_err(|e| e.to_string())
                    });
                }
                done.map(|()| {
                    if keep {
                        "all 3 masters saved and restarted"
                    } else {
                        "all 3 masters restarted with their data wiped"
                    }
                    .to_string()
                })
            }
            (Backend::Etcd, keep) => if keep { self.etcd.restart() } else { self.etcd.wipe_and_restart() }
                .and_then(|()| self.etcd.wait_etcd_healthy())
                .map(|()| {
                    if keep {
                        "etcd restarted (its data survives)"
                    } else {
                        "etcd restarted with its data directory wiped (revisions restart low)"
                    }
                    .to_string()
                })
                .map_err(|e| e.to_string()),
            (Backend::Zookeeper, true) => self
                .zk
                .restart_member(0)
                .map(|()| "ZooKeeper restarted (its data survives)".to_string())
                .map_err(|e| e.to_string()),
            (Backend::Zookeeper, false) => self
                .zk
                .restart_as(Restart::LoseData)
                .map(|()| "ZooKeeper restarted with its data directory wiped (zxids restart low)".to_string())
                .map_err(|e| e.to_string()),
            (Backend::Postgres, true) => self
                .postgres
                .restart_as(Restart::KeepData)
                .map(|()| "PostgreSQL restarted (its data survives; the store's database restarted too)".to_string())
                .map_err(|e| e.to_string()),
            (Backend::Postgres, false) => drop_lock_table(&self.postgres.url())
                .await
                .and_then(|()| self.postgres.restart_as(Restart::KeepData).map_err(|e| e.to_string()))
                .map(|()| {
                    "the lock service's table dropped (every fence counter lost), then PostgreSQL restarted; the \
                     store's data survives"
                        .to_string()
                }),
            (Backend::Sqlite, false) => {
                let url = self.locks.iter().find(|l| l.backend == Backend::Sqlite).map(|l| l.url.clone())?;
                drop_lock_table(&url).await.map(|()| {
                    "the lock service's table dropped from the file (every fence counter lost); the store's data \
                     survives"
                        .to_string()
                })
            }
            (Backend::Memory, _) | (Backend::Sqlite, true) => return None,
        };
        Some(done)
    }
}

/// `SAVE` on a Redis of ours: its next start loads the snapshot.
async fn save(server: &LoopbackServer) -> Result<(), String> {
    let client = redis::Client::open(server.redis_url()).map_err(|e| e.to_string())?;
    let mut conn = client.get_multiplexed_async_connection().await.map_err(|e| e.to_string())?;
    redis::cmd("SAVE").query_async::<()>(&mut conn).await.map_err(|e| format!("SAVE: {e}"))
}

/// Drops the store-native lock service's table (`palisade_locks`), as a restore of the lock
/// service's data from nothing would leave it; it is created again at the next connect.
pub(crate) async fn drop_lock_table(url: &str) -> Result<(), String> {
    use sqlx::Connection as _;
    let statement = "DROP TABLE IF EXISTS palisade_locks";
    if url.starts_with("sqlite:") {
        // The file alone: the query holds palisade's own parameters, which sqlx does not know.
        let file = url.split('?').next().unwrap_or(url);
        let mut conn = sqlx::SqliteConnection::connect(file).await.map_err(|e| e.to_string())?;
        sqlx::query(statement).execute(&mut conn).await.map_err(|e| e.to_string())?;
    } else {
        let mut conn = sqlx::PgConnection::connect(url).await.map_err(|e| e.to_string())?;
        // Never wait long behind a lock service's open transaction: fail the cell instead.
        sqlx::query("SET lock_timeout = '10s'").execute(&mut conn).await.map_err(|e| e.to_string())?;
        sqlx::query(statement).execute(&mut conn).await.map_err(|e| e.to_string())?;
    }
    Ok(())
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
