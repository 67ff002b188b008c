//! The PostgreSQL store and lock service against a real PostgreSQL (started by `scripts/test`,
//! address in `PALISADE_POSTGRES_URL`): the store suite; the lock suite (child processes
//! connect to the same database); end to end with the in-memory lock service, with the
//! PostgreSQL lock service in the store's own database, and the same with every fenced write
//! requiring its lock to be live (`require_live_lock`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::memory::MemoryLockFactory;
use palisade_conformance::{FencedStoreFactory, LockServiceFactory, Restart, Timing};
use palisade_postgres::{PostgresLockService, PostgresStore};

fn postgres() -> impl FencedStoreFactory<Store = PostgresStore> {
    palisade_postgres::conformance::store()
}

fn postgres_live() -> impl FencedStoreFactory<Store = PostgresStore> {
    palisade_postgres::conformance::live_lock_store()
}

fn postgres_locks() -> impl LockServiceFactory<Service = PostgresLockService> {
    palisade_postgres::conformance::service()
}

palisade_conformance::certify!(postgres_store: fenced_store = postgres(), lock_service = MemoryLockFactory::new());
palisade_conformance::certify!(
    postgres: lock_service = postgres_locks(),
    store = postgres(),
    restartable = OwnPostgres::start(),
);
palisade_conformance::certify!(postgres_live_lock: pairing, lock_service = postgres_locks(), store = postgres_live());

/// The PostgreSQL lock service on a server of the test's own, which the restart scenario kills
/// (SIGKILL, crash recovery on the next start) keeping its data, and restarts with a new, empty
/// database: fences continue after the crash, and `lock_checked` repairs the empty database's
/// counters.
struct OwnPostgres {
    server: std::sync::Mutex<palisade_lab::servers::PostgresServer>,
    url: String,
}

impl OwnPostgres {
    fn start() -> Self {
        let server = palisade_lab::servers::PostgresServer::start().unwrap();
        let url = server.url();
        OwnPostgres { server: std::sync::Mutex::new(server), url }
    }
}

#[palisade_core::spi::async_trait]
impl LockServiceFactory for OwnPostgres {
    type Service = PostgresLockService;
    async fn client(&self) -> palisade_core::Result<Arc<PostgresLockService>> {
        Ok(Arc::new(PostgresLockService::connect(&self.url).await?))
    }
    fn timing(&self) -> Timing {
        Timing::new(Duration::from_millis(400), Duration::from_millis(300))
    }
    async fn restart_server(&self, how: Restart) -> palisade_core::Result<()> {
        let restarted = self.server.lock().unwrap().restart_as(how);
        restarted.map_err(|e| {
            palisade_core::Error::new(
                palisade_core::ErrorKind::Unavailable,
                "test",
                format!("restarting postgres: {e}"),
            )
        })
    }
}
