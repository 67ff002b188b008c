//! The reference implementations pass every scenario that applies to them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use palisade_conformance::memory::{MemoryLockFactory, MemoryStoreFactory};

palisade_conformance::lock_service_suite!(MemoryLockFactory::new());
palisade_conformance::fenced_store_suite!(MemoryStoreFactory::new());

/// The plain-function entry points run the same scenarios.
#[tokio::test]
async fn run_all_entry_points_pass_on_memory() {
    let reports = palisade_conformance::run_store_scenarios(&MemoryStoreFactory::new()).await.unwrap();
    assert_eq!(reports.len(), 9);
    let reports = palisade_conformance::run_end_to_end_scenarios(&MemoryLockFactory::new(), &MemoryStoreFactory::new())
        .await
        .unwrap();
    assert_eq!(reports.len(), 3);
}
