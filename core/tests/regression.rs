//! Fencing rule 5: a lock service that lost its counter is noticed and repaired, and no stale
//! write is accepted on the way.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use palisade_core::LockOptions;
use std::sync::Arc;
use std::time::Duration;

use palisade_core::{
    ErrorKind, Fence, FencedStore, FencedStoreExt, LockServiceExt, MemoryFencedStore, MemoryLockService,
    REGRESSION_GAP, ResourceKey, WriteBatch,
};

#[tokio::test]
async fn a_lost_counter_is_detected_and_moved_above_the_watermark() {
    let locks = Arc::new(MemoryLockService::new());
    let store = MemoryFencedStore::new();
    let key = ResourceKey::new("alloc", "WH-09").unwrap();
    let ttl = Duration::from_secs(10);
    for _ in 0..5 {
        let lease = locks.lock_checked(&store, &key, LockOptions::ttl(ttl).wait(Duration::from_secs(1))).await.unwrap();
        store.write(&lease, &WriteBatch::new().put("k", lease.fence().to_string())).await.unwrap();
        lease.release().await.unwrap();
    }
    assert_eq!(store.watermark(&key).await.unwrap(), Some(Fence::new(5)));

    // The service forgets its counters (a Redis restart without persistence).
    locks.forget_fences();
    let naive = locks.lock(&key, LockOptions::ttl(ttl).wait(Duration::from_secs(1))).await.unwrap();
    assert_eq!(naive.fence(), Fence::new(1));
    let err = store.write(&naive, &WriteBatch::new().put("k", b"stale".to_vec())).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::StaleFence { .. }), "a regressed fence is refused, never accepted");
    naive.release().await.unwrap();

    let lease = locks.lock_checked(&store, &key, LockOptions::ttl(ttl).wait(Duration::from_secs(1))).await.unwrap();
    assert!(lease.fence().get() > 5 + REGRESSION_GAP, "fence {} is not past watermark + gap", lease.fence());
    store.write(&lease, &WriteBatch::new().put("k", b"recovered".to_vec())).await.unwrap();
    assert_eq!(store.read("k").await.unwrap().unwrap().value, b"recovered");
}
