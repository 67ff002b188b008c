//! The lease lifecycle: deadlines, lost signals, release, and progress-gated renewal.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use palisade_core::LockOptions;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use palisade_core::{
    Capabilities, Error, ErrorKind, Fenced, Grant, LockService, LockServiceExt, MemoryLockService, Progress,
    ResourceKey, Result, Ttl,
};
use tokio::time::Instant;

fn key(id: &str) -> ResourceKey {
    ResourceKey::new("test", id).unwrap()
}

#[tokio::test]
async fn lost_fires_at_the_deadline_without_extension() {
    let svc = Arc::new(MemoryLockService::new());
    let lease = svc.try_lock(&key("a"), Duration::from_millis(50)).await.unwrap().unwrap();
    assert!(!lease.is_lost());
    assert!(lease.safe_until() < lease.deadline());
    assert!(lease.time_left() > Duration::ZERO);
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(2), lease.lost()).await.expect("lost fired");
    assert!(started.elapsed() >= Duration::from_millis(30), "fired too early: {:?}", started.elapsed());
    assert!(lease.is_lost());
    assert_eq!(lease.time_left(), Duration::ZERO);
    let err = lease.extend(Duration::from_secs(1)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LeaseLost);
}

#[tokio::test]
async fn extension_moves_the_deadline_and_release_never_fires_lost() {
    let svc = Arc::new(MemoryLockService::new());
    let lease = svc.try_lock(&key("b"), Duration::from_millis(60)).await.unwrap().unwrap();
    let before = lease.deadline();
    tokio::time::sleep(Duration::from_millis(30)).await;
    lease.extend(Duration::from_millis(300)).await.unwrap();
    assert!(lease.deadline() > before + Duration::from_millis(200));
    assert_eq!(lease.ttl().get(), Duration::from_millis(300));
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(!lease.is_lost(), "extended lease must not be lost at the old deadline");
    let lost = lease.lost();
    let token = lease.lost_token();
    lease.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(!token.is_cancelled(), "a released lease is not lost");
    assert!(tokio::time::timeout(Duration::from_millis(10), lost).await.is_err());
}

#[tokio::test]
async fn release_after_takeover_says_not_holder() {
    let svc = Arc::new(MemoryLockService::new());
    let old = svc.try_lock(&key("c"), Duration::from_millis(20)).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(40)).await;
    let new = svc.try_lock(&key("c"), Duration::from_secs(10)).await.unwrap().unwrap();
    assert!(new.fence() > old.fence());
    assert_eq!(old.release().await.unwrap_err().kind(), ErrorKind::NotHolder);
    // The new holder still holds it.
    assert!(svc.try_lock(&key("c"), Duration::from_secs(1)).await.unwrap().is_none());
    new.release().await.unwrap();
}

#[tokio::test]
async fn drop_releases_in_the_background() {
    let svc = Arc::new(MemoryLockService::new());
    drop(svc.try_lock(&key("d"), Duration::from_secs(30)).await.unwrap().unwrap());
    let again = svc.lock(&key("d"), LockOptions::ttl(Duration::from_secs(30)).wait(Duration::from_secs(2))).await;
    assert!(again.is_ok(), "dropped lease should be released well before its 30 s TTL");
}

#[tokio::test]
async fn bad_ttl_and_wait_are_typed_errors() {
    let svc = Arc::new(MemoryLockService::new());
    for ttl in [Duration::ZERO, Duration::from_secs(25 * 3600)] {
        let err = svc.try_lock(&key("e"), ttl).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    }
    let too_long = LockOptions::ttl(Duration::from_secs(1)).wait(Duration::from_secs(25 * 3600));
    let err = svc.lock(&key("e"), too_long).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

#[tokio::test]
async fn progress_keeps_the_lease_past_several_ttls_and_a_stall_loses_it() {
    let svc = Arc::new(MemoryLockService::new());
    let ttl = Duration::from_millis(90);
    let lease = svc.try_lock(&key("f"), ttl).await.unwrap().unwrap();
    let progress = Progress::new();
    let renewal = lease.renew_on_progress(&progress);
    let worked_until = Instant::now() + ttl * 5;
    while Instant::now() < worked_until {
        progress.tick();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!lease.is_lost(), "a progressing holder keeps its lease past 5 TTLs");
    assert!(svc.try_lock(&key("f"), ttl).await.unwrap().is_none(), "still held on the service");

    // Stall: no more ticks. The lease must be lost within one TTL (+ a check interval).
    let stalled_at = Instant::now();
    tokio::time::timeout(ttl * 3, lease.lost()).await.expect("stalled lease is lost");
    assert!(stalled_at.elapsed() <= ttl + ttl / 3 + Duration::from_millis(50), "{:?}", stalled_at.elapsed());
    assert!(
        renewal.is_finished() || {
            tokio::time::sleep(Duration::from_millis(20)).await;
            renewal.is_finished()
        }
    );
    let next = svc.lock(&key("f"), LockOptions::ttl(ttl).wait(Duration::from_secs(1))).await.unwrap();
    assert!(next.fence() > lease.fence());
}

/// A service whose extensions can be switched to fail, to see renewal failure handling.
struct FlakyExtend {
    inner: MemoryLockService,
    fail: AtomicBool,
}

#[async_trait]
impl LockService for FlakyExtend {
    type Fencing = Fenced;
    fn backend(&self) -> &'static str {
        "flaky"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Fenced>>> {
        self.inner.try_acquire(key, ttl).await
    }
    async fn extend(&self, grant: &Grant<Fenced>, ttl: Ttl) -> Result<Ttl> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(Error::new(ErrorKind::Unavailable, "flaky", "injected"));
        }
        self.inner.extend(grant, ttl).await
    }
    async fn release(&self, grant: &Grant<Fenced>) -> Result<()> {
        self.inner.release(grant).await
    }
}

/// Sums a counter over its labels. One snapshot per test: taking a snapshot drains it.
fn counter(
    snapshot: &[(metrics_util::CompositeKey, Option<metrics::Unit>, Option<metrics::SharedString>, DebugValue)],
    name: &str,
) -> u64 {
    snapshot
        .iter()
        .filter(|(k, _, _, _)| k.key().name() == name)
        .map(|(_, _, _, v)| match v {
            DebugValue::Counter(c) => *c,
            _ => 0,
        })
        .sum()
}

#[test]
fn failed_renewal_fires_lost_and_is_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let svc = Arc::new(FlakyExtend { inner: MemoryLockService::new(), fail: AtomicBool::new(false) });
            let lease = svc.try_lock(&key("g"), Duration::from_millis(300)).await.unwrap().unwrap();
            let progress = Progress::new();
            let _renewal = lease.renew_on_progress_every(&progress, Duration::from_millis(20));
            progress.tick();
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(!lease.is_lost());
            svc.fail.store(true, Ordering::SeqCst);
            progress.tick();
            tokio::time::timeout(Duration::from_millis(200), lease.lost()).await.expect("lost after failed renewal");
        });
    });
    let snapshot = snapshotter.snapshot().into_vec();
    assert_eq!(counter(&snapshot, palisade_core::metrics::LOCK_RENEW_FAILED_TOTAL), 1);
    assert_eq!(counter(&snapshot, palisade_core::metrics::LOCK_LOST_TOTAL), 1);
    assert_eq!(counter(&snapshot, palisade_core::metrics::LOCK_ACQUIRE_TOTAL), 1);
}

/// A service that caps the TTL of one extension (etcd does while its session's keep-alive
/// hiccups), then grants what is asked again, and records what each extension asked for.
struct CapsOnce {
    inner: MemoryLockService,
    capped: AtomicBool,
    asked: std::sync::Mutex<Vec<Duration>>,
}

#[async_trait]
impl LockService for CapsOnce {
    type Fencing = Fenced;
    fn backend(&self) -> &'static str {
        "caps-once"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Fenced>>> {
        self.inner.try_acquire(key, ttl).await
    }
    async fn extend(&self, grant: &Grant<Fenced>, ttl: Ttl) -> Result<Ttl> {
        self.asked.lock().unwrap().push(ttl.get());
        let ttl = if self.capped.swap(false, Ordering::SeqCst) { Ttl::from_millis(150).unwrap() } else { ttl };
        self.inner.extend(grant, ttl).await
    }
    async fn release(&self, grant: &Grant<Fenced>) -> Result<()> {
        self.inner.release(grant).await
    }
}

/// One capped extension must not shrink the lease for good: renewal keeps asking for the TTL
/// the holder wanted, and renews often enough for whatever was granted. Before the fix it asked
/// for the capped TTL from then on, every third of the *first* TTL: longer than the capped one,
/// so a holder making progress lost its lease.
#[tokio::test]
async fn one_capped_extension_does_not_shrink_renewal_for_good() {
    let svc = Arc::new(CapsOnce {
        inner: MemoryLockService::new(),
        capped: AtomicBool::new(true),
        asked: std::sync::Mutex::new(Vec::new()),
    });
    let lease = svc.try_lock(&key("capped"), Duration::from_millis(600)).await.unwrap().unwrap();
    let progress = Progress::new();
    let _renewal = lease.renew_on_progress(&progress);
    let ticking = {
        let progress = progress.clone();
        tokio::spawn(async move {
            for _ in 0..100 {
                progress.tick();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    ticking.await.unwrap();
    assert!(!lease.is_lost(), "a holder that made progress lost its lease");
    let asked = svc.asked.lock().unwrap().clone();
    assert!(asked.len() >= 3, "{asked:?}");
    assert!(asked.iter().all(|a| *a == Duration::from_millis(600)), "renewal asked for a shrunken TTL: {asked:?}");
    assert_eq!(lease.ttl().get(), Duration::from_millis(600), "the granted TTL is back to what was asked");
}
