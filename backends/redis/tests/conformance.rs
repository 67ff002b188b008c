//! The Redis lock service against a real Redis (started by `scripts/test`, address in
//! `PALISADE_REDIS_URL`), certified with the SQLite store; the restart scenario on a Redis of
//! the test's own.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::{FencedStoreFactory, LockServiceFactory, Timing, require_env, store_factory};
use palisade_core::{Error, ErrorKind};
use palisade_redis::RedisLockService;
use palisade_sqlite::SqliteStore;

fn redis() -> impl LockServiceFactory<Service = RedisLockService> {
    palisade_redis::conformance::service()
}

fn sqlite() -> impl FencedStoreFactory<Store = SqliteStore> {
    store_factory(|| async {
        let path = format!("{}/palisade-redis-e2e.db", env!("CARGO_TARGET_TMPDIR"));
        Ok(Arc::new(SqliteStore::connect(&format!("sqlite://{path}?synchronous=normal&busy_timeout_ms=30000")).await?))
    })
}

palisade_conformance::certify!(redis_lock_service: lock_service = redis(), store = sqlite(), restartable = OwnRedis::start());

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
    async fn restart_server(&self, keep_data: bool) -> palisade_core::Result<()> {
        let mut server = self.server.lock().unwrap();
        let restarted = server.restart_keeping_data(keep_data);
        restarted.map_err(|e| Error::new(ErrorKind::Unavailable, "test", format!("restarting redis: {e}")))
    }
}
