//! Redlock against real Redis masters (five started by `scripts/test`, listed in
//! `PALISADE_REDLOCK_URL`): the lock suite on one master (the default deployment) and on five,
//! and end to end with the SQLite store, where the suite asserts the documented unfenced
//! outcome (the paused holder's write goes through).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::{FencedStoreFactory, LockServiceFactory, Timing, lock_factory, require_env, store_factory};
use palisade_redlock::RedlockService;
use palisade_sqlite::SqliteStore;

/// The first `n` of the test command's masters. The node timeout is generous because the
/// suite runs beside other tests on two cores; the fault tests use the 50 ms default.
fn redlock(n: usize) -> impl LockServiceFactory<Service = RedlockService> {
    let all = require_env("PALISADE_REDLOCK_URL");
    let hosts: Vec<&str> = all.trim_start_matches("redlock://").split(',').collect();
    assert!(hosts.len() >= n, "PALISADE_REDLOCK_URL lists {} masters, the test needs {n}", hosts.len());
    let url = format!("redlock://{}?node_timeout_ms=250", hosts[..n].join(","));
    lock_factory(Timing::new(Duration::from_millis(500), Duration::from_millis(100)), move || {
        let url = url.clone();
        async move { Ok(Arc::new(RedlockService::connect(&url).await?)) }
    })
}

fn sqlite() -> impl FencedStoreFactory<Store = SqliteStore> {
    store_factory(|| async {
        let path = format!("{}/palisade-redlock-e2e.db", env!("CARGO_TARGET_TMPDIR"));
        Ok(Arc::new(SqliteStore::connect(&format!("sqlite://{path}?synchronous=normal&busy_timeout_ms=30000")).await?))
    })
}

palisade_conformance::lock_service_suite!(single_master, redlock(1));
palisade_conformance::lock_service_suite!(five_masters, redlock(5));
palisade_conformance::end_to_end_suite!(five_masters_end_to_end, redlock(5), sqlite());
