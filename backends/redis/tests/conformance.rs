//! The Redis lock service certified with the SQLite store against the real servers `scripts/test`
//! starts: one Redis (`PALISADE_REDIS_URL`; the restart scenario on a Redis of the test's own),
//! a Sentinel group (`PALISADE_REDIS_SENTINEL_URL`) and a Redis Cluster
//! (`PALISADE_REDIS_CLUSTER_URL`), each with a faulty client behind fault proxies.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::{FencedStoreFactory, LockServiceFactory, Restart, Timing, require_env};
use palisade_core::{Error, ErrorKind};
use palisade_redis::RedisLockService;
use palisade_sqlite::SqliteStore;

fn redis() -> impl LockServiceFactory<Service = RedisLockService> {
    palisade_redis::conformance::service()
}

/// The store the scenarios write through: a file per certification, so that the three
/// certifications' resources (the same keys, fenced by three servers' counters) stay apart.
fn sqlite() -> impl FencedStoreFactory<Store = SqliteStore> {
    let (certification, _) = palisade_conformance::certify::current().unwrap_or(("none", ""));
    let file = format!("palisade-redis-e2e-{certification}.db");
    palisade_sqlite::conformance::store(palisade_sqlite::conformance::url(
        &std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(file),
    ))
}

palisade_conformance::certify!(redis_lock_service: lock_service = redis(), store = sqlite(), restartable = OwnRedis::start());
palisade_conformance::certify!(
    redis_sentinel_lock_service: lock_service = palisade_redis::conformance::sentinel_service(),
    store = sqlite()
);
palisade_conformance::certify!(
    redis_cluster_lock_service: lock_service = palisade_redis::conformance::cluster_service(),
    store = sqlite()
);

/// A Redis of this test's own, which the restart scenario restarts: with `appendfsync always`
/// a restart with data keeps the fence counter (the service still does not declare it: it
/// cannot know the server's persistence), and a restart without data wipes it.
struct OwnRedis {
    server: std::sync::Mutex<palisade_lab::servers::LoopbackServer>,
    url: String,
}

impl OwnRedis {
    fn start() -> Self {
        let server = palisade_lab::servers::LoopbackServer::redis(
            &require_env("PALISADE_REDIS_SERVER"),
            &["--appendonly", "yes", "--appendfsync", "always"],
        )
        .unwrap();
        let url = server.redis_url();
        OwnRedis { server: std::sync::Mutex::new(server), url }
    }
}

#[palisade_core::spi::async_trait]
impl LockServiceFactory for OwnRedis {
    type Service = RedisLockService;
    async fn client(&self) -> palisade_core::Result<Arc<RedisLockService>> {
        Ok(Arc::new(RedisLockService::connect(&self.url).await?))
    }
    fn timing(&self) -> Timing {
        Timing::new(Duration::from_millis(200), Duration::from_millis(50))
    }
    async fn restart_server(&self, how: Restart) -> palisade_core::Result<()> {
        let mut server = self.server.lock().unwrap();
        let restarted = server.restart_as(how);
        restarted.map_err(|e| Error::new(ErrorKind::Unavailable, "test", format!("restarting redis: {e}")))
    }
}
