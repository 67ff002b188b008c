//! The reference implementations pass every scenario that applies to them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use palisade_conformance::memory::{MemoryLockFactory, MemoryStoreFactory};

palisade_conformance::certify!(memory: lock_service = MemoryLockFactory::new(), store = sqlite_file());
palisade_conformance::certify!(memory_store: fenced_store = MemoryStoreFactory::new(), lock_service = MemoryLockFactory::new());

/// A SQLite file of this test process's own: the store the memory service's process-level
/// scenarios write through (the memory store lives in one process; a holder in a child process
/// reaches the memory service over the loopback relay, and this file directly).
fn sqlite_file() -> impl palisade_conformance::FencedStoreFactory {
    palisade_conformance::store_factory(|| async {
        let url = format!(
            "sqlite://{}/palisade-memory-certification.db?synchronous=normal&busy_timeout_ms=30000",
            env!("CARGO_TARGET_TMPDIR")
        );
        Ok(std::sync::Arc::new(palisade_sqlite::SqliteStore::connect(&url).await?))
    })
}

/// The plain-function entry points run the same scenarios.
#[tokio::test]
async fn run_all_entry_points_pass_on_memory() {
    let reports = palisade_conformance::run_store_scenarios(&MemoryStoreFactory::new()).await.unwrap();
    assert_eq!(reports.len(), 10);
    let reports = palisade_conformance::run_end_to_end_scenarios(&MemoryLockFactory::new(), &MemoryStoreFactory::new())
        .await
        .unwrap();
    assert_eq!(reports.len(), 3);
}

/// A correct service whose clients are slow to make (a connect that waits for a database
/// file's write lock on a loaded CI machine) passes the scenarios that make clients while a
/// lock is held: setting up clients is not time the holder's TTL has to cover.
#[test]
fn slow_client_set_up_is_not_charged_to_the_holder() {
    use std::sync::Arc;
    use std::time::Duration;

    use palisade_conformance::{Timing, lock_factory};
    use palisade_core::MemoryLockService;

    let service = Arc::new(MemoryLockService::default());
    let slow = lock_factory(Timing::new(Duration::from_millis(200), Duration::from_millis(50)), move || {
        let service = Arc::clone(&service);
        async move {
            // Six of these outlast four TTLs (the holder's lease in the scenario).
            tokio::time::sleep(Duration::from_millis(250)).await;
            Ok(service)
        }
    });
    palisade_conformance::harness::run(
        "cancelled_acquires_leave_no_residue",
        "slow_client_set_up_is_not_charged_to_the_holder",
        |ctx| async move { palisade_conformance::lock::cancelled_acquires_leave_no_residue(&ctx, &slow).await },
    );
}
