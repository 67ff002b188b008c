//! The SQLite store runs the conformance suite: store scenarios, and end to end with the
//! in-memory lock service (whose child processes reach it through the suite's relay; they open
//! the same database file).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;

use palisade_conformance::memory::MemoryLockFactory;
use palisade_conformance::{FencedStoreFactory, store_factory};
use palisade_sqlite::SqliteStore;

/// Independent clients (each its own pool) of one database file that a child process opens too:
/// the path is fixed per test binary, and scenarios keep apart by namespace. Speed over
/// power-loss durability: the scenarios test semantics, not fsync.
fn sqlite() -> impl FencedStoreFactory<Store = SqliteStore> {
    store_factory(|| async {
        let path = format!("{}/palisade-sqlite-conformance.db", env!("CARGO_TARGET_TMPDIR"));
        Ok(Arc::new(SqliteStore::connect(&format!("sqlite://{path}?synchronous=normal&busy_timeout_ms=30000")).await?))
    })
}

palisade_conformance::fenced_store_suite!(sqlite());
palisade_conformance::end_to_end_suite!(MemoryLockFactory::new(), sqlite());
