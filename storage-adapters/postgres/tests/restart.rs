//! The PostgreSQL lock service on a server of the test's own, killed (SIGKILL, crash recovery on
//! the next start) with its data kept, and restarted with a new, empty database: fences
//! continue after the crash, and `lock_checked` repairs the empty database's counters.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_conformance::servers::PostgresServer;
use palisade_conformance::{LockServiceFactory, RestartableFactory, Timing};
use palisade_core::{Error, ErrorKind};
use palisade_postgres::PostgresLockService;

struct OwnPostgres {
    server: Mutex<PostgresServer>,
    url: String,
}

impl OwnPostgres {
    fn start() -> Self {
        let server = PostgresServer::start().unwrap();
        let url = server.url();
        OwnPostgres { server: Mutex::new(server), url }
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
}

#[palisade_core::spi::async_trait]
impl RestartableFactory for OwnPostgres {
    async fn restart_server(&self, keep_data: bool) -> palisade_core::Result<()> {
        let restarted = self.server.lock().unwrap().restart_keeping_data(keep_data);
        restarted.map_err(|e| Error::new(ErrorKind::Unavailable, "test", format!("restarting postgres: {e}")))
    }
}

palisade_conformance::restart_suite!(OwnPostgres::start());
