//! The conformance suite's bounded-wait scenario with a fenced transaction held open, on a
//! database file and in a test process of its own: SQLite has one writer at a time, so the
//! held transaction stalls every other writer of its file (by design: see the crate docs), and
//! on the shared file of `conformance.rs` it would stall the other scenarios' renewals too.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::{
    FencedStoreFactory, HeldTransaction, LockServiceFactory, Timing, lock_factory, store_factory,
};
use palisade_core::{GrantFence, ResourceKey};
use palisade_sqlite::{SqliteLockService, SqliteStore};

fn url() -> String {
    let path = format!("{}/palisade-sqlite-transactions.db", env!("CARGO_TARGET_TMPDIR"));
    format!("sqlite://{path}?synchronous=normal")
}

fn sqlite_locks() -> impl LockServiceFactory<Service = SqliteLockService> {
    lock_factory(Timing::new(Duration::from_millis(500), Duration::from_millis(300)), || async {
        Ok(Arc::new(SqliteLockService::connect(&url()).await?))
    })
}

/// Plain and requiring a live lock: the transaction holds the file's write lock either way.
fn sqlite(live: bool) -> impl FencedStoreFactory<Store = SqliteStore> {
    let url = move || if live { format!("{}&require_live_lock=true", url()) } else { url() };
    store_factory(move || async move { Ok(Arc::new(SqliteStore::connect(&url()).await?)) })
        .with_held_transaction(move |resource, fence| hold(url(), resource, fence))
}

async fn hold(url: String, resource: ResourceKey, fence: GrantFence) -> palisade_core::Result<HeldTransaction> {
    let store = SqliteStore::connect(&url).await?;
    let tx = store.begin_with_fence(&resource, fence).await?;
    Ok(Box::new((tx, store)))
}

palisade_conformance::certify!(sqlite_own_file: pairing, lock_service = sqlite_locks(), store = sqlite(false));
palisade_conformance::certify!(sqlite_own_file_live_lock: pairing, lock_service = sqlite_locks(), store = sqlite(true));
