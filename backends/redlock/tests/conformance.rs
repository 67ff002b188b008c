//! Redlock against real Redis masters (five started by `scripts/test`, listed in
//! `PALISADE_REDLOCK_URL`): the lock suite on one master (the default deployment) and on five,
//! and end to end with the SQLite store, where the suite asserts the documented unfenced
//! outcome (the paused holder's write goes through).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;

use palisade_conformance::{FencedStoreFactory, LoadSettings, LockServiceFactory, store_factory};
use palisade_redlock::RedlockService;
use palisade_sqlite::SqliteStore;

fn redlock(n: usize) -> impl LockServiceFactory<Service = RedlockService> {
    palisade_redlock::conformance::service(n)
}

/// The load spreads over 250 keys (2 acquisitions per key per second instead of 10): Redlock
/// has no queue, and when a round gives no contender a majority all of them release and retry,
/// so five masters under ten contenders per key per second can go without a winner for longer
/// than the scenario's patience on this two-core machine (seen as 20 s acquire timeouts).
fn sqlite() -> impl FencedStoreFactory<Store = SqliteStore> {
    store_factory(|| async {
        let path = format!("{}/palisade-redlock-e2e.db", env!("CARGO_TARGET_TMPDIR"));
        Ok(Arc::new(SqliteStore::connect(&format!("sqlite://{path}?synchronous=normal&busy_timeout_ms=30000")).await?))
    })
    .with_load(LoadSettings { keys: 250, ..LoadSettings::from_env() })
}

palisade_conformance::certify!(redlock_single_master: lock_service = redlock(1), store = sqlite());
palisade_conformance::certify!(redlock: lock_service = redlock(5), store = sqlite());
