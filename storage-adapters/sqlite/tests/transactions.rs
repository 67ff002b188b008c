//! The end-to-end scenarios with a fenced transaction held open (in this process, and in a
//! holder process frozen with `SIGSTOP`), each scenario on a database file of its own: SQLite
//! has one writer at a time, so a held transaction stalls every other writer of its file (by
//! design: see the crate docs), and on a shared file it would stall the other scenarios too.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::{
    FencedStoreFactory, HeldTransaction, LockServiceFactory, Timing, lock_factory, store_factory,
};
use palisade_core::{GrantFence, ResourceKey};
use palisade_sqlite::{SqliteLockService, SqliteStore};

/// A file per scenario: named after the test process (the parent's, in a scenario's holder
/// child) and the certification and scenario running, which the child sees too.
fn url() -> String {
    let (certification, scenario) = palisade_conformance::certify::current().unwrap_or(("none", "none"));
    let path = format!(
        "{}/palisade-sqlite-transactions-{}-{certification}-{scenario}.db",
        env!("CARGO_TARGET_TMPDIR"),
        palisade_conformance::test_process_id()
    );
    format!("sqlite://{path}?synchronous=normal")
}

/// (The factories take the file's name when made, on the test's own thread.)
fn sqlite_locks() -> impl LockServiceFactory<Service = SqliteLockService> {
    let url = url();
    lock_factory(Timing::new(Duration::from_millis(500), Duration::from_millis(300)), move || {
        let url = url.clone();
        async move { Ok(Arc::new(SqliteLockService::connect(&url).await?)) }
    })
}

/// Plain and requiring a live lock: the transaction holds the file's write lock either way.
fn sqlite(live: bool) -> impl FencedStoreFactory<Store = SqliteStore> {
    let url = if live { format!("{}&require_live_lock=true", url()) } else { url() };
    let held = url.clone();
    store_factory(move || {
        let url = url.clone();
        async move { Ok(Arc::new(SqliteStore::connect(&url).await?)) }
    })
    .with_held_transaction(move |resource, fence| hold(held.clone(), resource, fence))
}

async fn hold(url: String, resource: ResourceKey, fence: GrantFence) -> palisade_core::Result<HeldTransaction> {
    let store = SqliteStore::connect(&url).await?;
    let tx = store.begin_with_fence(&resource, fence).await?;
    Ok(Box::new((tx, store)))
}

palisade_conformance::certify!(sqlite_own_file: pairing, lock_service = sqlite_locks(), store = sqlite(false));
palisade_conformance::certify!(sqlite_own_file_live_lock: pairing, lock_service = sqlite_locks(), store = sqlite(true));
