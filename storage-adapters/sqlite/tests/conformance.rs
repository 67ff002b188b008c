//! The SQLite store runs the conformance suite: store scenarios, and end to end with the
//! in-memory lock service (whose child processes reach it through the suite's relay; they open
//! the same database file).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::path::PathBuf;
use std::sync::Arc;

use palisade_conformance::FencedStoreFactory;
use palisade_conformance::memory::MemoryLockFactory;
use palisade_core::Result;
use palisade_sqlite::SqliteStore;

/// Independent clients (each its own pool) of one database file that a child process can open
/// too: the path is fixed per test binary, and scenarios keep apart by namespace.
struct SqliteFactory {
    url: String,
}

impl SqliteFactory {
    fn new() -> Self {
        let path: PathBuf = [env!("CARGO_TARGET_TMPDIR"), "palisade-sqlite-conformance.db"].iter().collect();
        // Speed over power-loss durability: the scenarios test semantics, not fsync.
        SqliteFactory { url: format!("sqlite://{}?synchronous=normal&busy_timeout_ms=30000", path.display()) }
    }
}

#[palisade_core::async_trait]
impl FencedStoreFactory for SqliteFactory {
    type Store = SqliteStore;

    async fn client(&self) -> Result<Arc<SqliteStore>> {
        Ok(Arc::new(SqliteStore::connect(&self.url).await?))
    }
}

palisade_conformance::fenced_store_suite!(SqliteFactory::new());
palisade_conformance::end_to_end_suite!(MemoryLockFactory::new(), SqliteFactory::new());
