//! Every call a scenario makes is held to a time bound: a service or store that hangs fails at
//! its bound, naming the call, and a correct one logs nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use palisade_conformance::bounds::{BoundedLockFactory, BoundedStoreFactory, CallBounds};
use palisade_conformance::memory::{MemoryLockFactory, MemoryStoreFactory};
use palisade_conformance::{FencedStoreFactory, LockServiceFactory, Namespace, Timing, lock_factory, store_factory};
use palisade_core::{
    Capabilities, ErrorKind, Fence, Fenced, FencedStore, Grant, GrantFence, LockService, MemoryFencedStore,
    MemoryLockService, Record, ResourceKey, Result, Ttl, WriteBatch,
};
use tokio::time::Instant;

/// Short, so the tests are quick; the bound logic is the same at 2 s.
const ALLOWANCE: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flaw {
    /// `try_acquire` answers after 10 s.
    SlowTryAcquire,
    /// `acquire` waits as if it had been given a day.
    WaitIgnored,
    /// `try_acquire` blocks its thread for a second (an async fn calling blocking I/O).
    BlocksItsThread,
}

/// The memory service with one flaw.
struct Flawed {
    inner: MemoryLockService,
    flaw: Flaw,
}

#[async_trait]
impl LockService for Flawed {
    type Fencing = Fenced;

    fn backend(&self) -> &'static str {
        "flawed"
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Fenced>>> {
        match self.flaw {
            Flaw::SlowTryAcquire => tokio::time::sleep(Duration::from_secs(10)).await,
            Flaw::BlocksItsThread => std::thread::sleep(Duration::from_secs(1)),
            Flaw::WaitIgnored => {}
        }
        self.inner.try_acquire(key, ttl).await
    }

    async fn acquire(&self, key: &ResourceKey, ttl: Ttl, wait: Duration) -> Result<Grant<Fenced>> {
        let wait = if self.flaw == Flaw::WaitIgnored { Duration::from_secs(24 * 3600) } else { wait };
        self.inner.acquire(key, ttl, wait).await
    }

    async fn extend(&self, grant: &Grant<Fenced>, ttl: Ttl) -> Result<Ttl> {
        self.inner.extend(grant, ttl).await
    }

    async fn release(&self, grant: &Grant<Fenced>) -> Result<()> {
        self.inner.release(grant).await
    }

    async fn advance_fence(&self, key: &ResourceKey, floor: Fence) -> Result<()> {
        self.inner.advance_fence(key, floor).await
    }
}

fn flawed(flaw: Flaw) -> impl LockServiceFactory<Service = Flawed> {
    let service = Arc::new(Flawed { inner: MemoryLockService::new(), flaw });
    lock_factory(
        Timing::new(Duration::from_millis(200), Duration::from_millis(50)).with_round_trip(ALLOWANCE),
        move || {
            let service = Arc::clone(&service);
            async move { Ok(service) }
        },
    )
}

fn ttl() -> Ttl {
    Ttl::new(Duration::from_secs(5)).unwrap()
}

#[tokio::test]
async fn a_try_acquire_that_blocks_fails_at_its_bound_naming_the_call() {
    let log = CallBounds::new(Duration::from_secs(2));
    let factory = BoundedLockFactory::declared(flawed(Flaw::SlowTryAcquire), &log);
    assert_eq!(factory.bounds().round_trip(), ALLOWANCE, "the factory's declared allowance, not the log's");
    let client = factory.client().await.unwrap();
    let key = Namespace::new().key("k").unwrap();

    let started = Instant::now();
    let err = client.try_acquire(&key, ttl()).await.expect_err("abandoned at its bound");
    let took = started.elapsed();
    assert!(took >= ALLOWANCE && took < ALLOWANCE * 3, "answered after {took:?}, not near the {ALLOWANCE:?} bound");
    assert_eq!(err.kind(), ErrorKind::Backend);
    assert!(!err.is_retryable(), "a scenario must not retry a call that outlived its bound");
    assert!(err.message().contains("conformance: call outlived its bound"), "{err}");

    let violations = log.violations();
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert_eq!(violations[0].call, format!("try_acquire({key})"));
    assert_eq!(violations[0].took, None, "abandoned, not answered");
    assert_eq!(violations[0].bound.total(), ALLOWANCE, "no wait, no expiry delay");
    let failure = log.take_failure().expect("a failure");
    assert_eq!(
        failure,
        format!(
            "`try_acquire({key})` did not answer within its bound 500 ms (expiry delay 0 s + round-trip allowance 500 ms)"
        )
    );
    assert!(log.violations().is_empty(), "taken");
}

#[tokio::test]
async fn an_acquire_that_ignores_its_wait_fails_at_wait_plus_allowance() {
    let log = CallBounds::new(Duration::from_secs(2));
    let factory = BoundedLockFactory::declared(flawed(Flaw::WaitIgnored), &log);
    let (holder, waiter) = (factory.client().await.unwrap(), factory.client().await.unwrap());
    let key = Namespace::new().key("k").unwrap();
    let grant = holder.try_acquire(&key, ttl()).await.unwrap().expect("free");

    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let err = waiter.acquire(&key, ttl(), wait).await.expect_err("held for 5 s");
    let took = started.elapsed();
    assert!(took >= wait + ALLOWANCE && took < wait + ALLOWANCE * 3, "answered after {took:?}");
    assert_ne!(err.kind(), ErrorKind::Timeout, "the bound's error is not a wait that ran out");

    let failure = log.take_failure().expect("a failure");
    assert_eq!(
        failure,
        format!(
            "`acquire({key}, wait 300 ms)` did not answer within its bound 800 ms (wait 300 ms + expiry delay 0 s + \
             round-trip allowance 500 ms)"
        )
    );
    holder.release(&grant).await.unwrap();
    assert_eq!(log.take_failure(), None, "the release kept its bound");
}

#[tokio::test]
async fn a_call_that_blocks_its_thread_is_logged_with_what_it_took() {
    let log = CallBounds::new(ALLOWANCE);
    let factory = BoundedLockFactory::new(flawed(Flaw::BlocksItsThread), log.clone());
    let client = factory.client().await.unwrap();
    let key = Namespace::new().key("k").unwrap();
    // The timer cannot fire while the thread sleeps: the answer comes, late, and is passed on.
    let grant = client.try_acquire(&key, ttl()).await.unwrap().expect("free");
    let violations = log.take_violations();
    assert_eq!(violations.len(), 1, "{violations:?}");
    let took = violations[0].took.expect("it answered");
    assert!(took >= Duration::from_secs(1), "{took:?}");
    assert!(violations[0].to_string().contains("answered after 1"), "{}", violations[0]);
    client.release(&grant).await.unwrap();
}

/// A store whose reads never answer.
struct HangingReads(MemoryFencedStore);

#[async_trait]
impl FencedStore for HangingReads {
    fn backend(&self) -> &'static str {
        "hanging"
    }
    async fn apply(&self, resource: &ResourceKey, fence: GrantFence, batch: &WriteBatch) -> Result<()> {
        self.0.apply(resource, fence, batch).await
    }
    async fn apply_all(&self, fences: &[(ResourceKey, GrantFence)], batch: &WriteBatch) -> Result<()> {
        self.0.apply_all(fences, batch).await
    }
    async fn apply_unfenced(&self, batch: &WriteBatch) -> Result<()> {
        self.0.apply_unfenced(batch).await
    }
    async fn watermark(&self, resource: &ResourceKey) -> Result<Option<Fence>> {
        self.0.watermark(resource).await
    }
    async fn read(&self, _key: &str) -> Result<Option<Record>> {
        std::future::pending().await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<(String, Record)>> {
        self.0.list(prefix).await
    }
}

/// Declares the short allowance, which the bounded factory must pick up.
struct HangingFactory(Arc<HangingReads>);

#[async_trait]
impl FencedStoreFactory for HangingFactory {
    type Store = HangingReads;
    async fn client(&self) -> Result<Arc<HangingReads>> {
        Ok(Arc::clone(&self.0))
    }
    fn round_trip(&self) -> Duration {
        ALLOWANCE
    }
}

#[tokio::test]
async fn a_store_read_that_hangs_fails_at_the_allowance() {
    let log = CallBounds::new(Duration::from_secs(2));
    let factory = BoundedStoreFactory::declared(HangingFactory(Arc::new(HangingReads(MemoryFencedStore::new()))), &log);
    let store = factory.client().await.unwrap();
    let ns = Namespace::new();
    store.apply_unfenced(&WriteBatch::new().put(ns.record("r"), b"v".to_vec())).await.unwrap();
    assert_eq!(store.list(ns.name()).await.unwrap().len(), 1);

    let started = Instant::now();
    let err = store.read(&ns.record("r")).await.expect_err("hangs");
    assert!(started.elapsed() < ALLOWANCE * 3, "{:?}", started.elapsed());
    assert!(err.message().contains("outlived its bound"), "{err}");
    let failure = log.take_failure().expect("a failure");
    assert!(
        failure.starts_with(&format!("`read({})` did not answer within its bound 500 ms", ns.record("r"))),
        "{failure}"
    );
    assert!(failure.contains("expiry delay 0 s"), "a store call has no expiry delay: {failure}");
}

#[tokio::test]
async fn a_store_that_hangs_fails_its_scenarios_naming_the_call() {
    let hanging = Arc::new(HangingReads(MemoryFencedStore::new()));
    let factory = store_factory(move || {
        let hanging = Arc::clone(&hanging);
        async move { Ok(hanging) }
    });
    let outcomes = palisade_conformance::store_outcomes(&factory).await;
    let failure = match &outcomes.iter().find(|(name, _)| *name == "equal_higher_lower").expect("ran").1 {
        Ok(_) => panic!("a store whose reads hang passed equal_higher_lower"),
        Err(failure) => failure.message.clone(),
    };
    assert!(failure.starts_with("`read(") && failure.contains("did not answer within its bound 5 s"), "{failure}");
}

#[tokio::test]
async fn several_violations_make_one_message_naming_the_first_few() {
    let log = CallBounds::new(Duration::from_millis(50));
    let client = BoundedLockFactory::new(flawed(Flaw::SlowTryAcquire), log.clone()).client().await.unwrap();
    let ns = Namespace::new();
    for i in 0..5 {
        let _ = client.try_acquire(&ns.key(&format!("k{i}")).unwrap(), ttl()).await;
    }
    let failure = log.take_failure().expect("a failure");
    assert!(failure.starts_with("5 calls outlived their bounds: `try_acquire("), "{failure}");
    assert_eq!(failure.matches("try_acquire(").count(), 3, "{failure}");
    assert!(failure.ends_with("; and 2 more"), "{failure}");
}

/// Through the path of the tests `certify!` stamps (factories wrapped in the context's bounds): a passing scenario whose call outlived its bound fails, and
/// a scenario that failed because of it reports the bound first, not the error that followed.
#[test]
fn the_harness_reports_the_violation_as_the_root_cause() {
    let run = std::panic::catch_unwind(|| {
        palisade_conformance::harness::run("owner_only_release_and_extend", "owner_only", |ctx| async move {
            let lf = BoundedLockFactory::declared(flawed(Flaw::SlowTryAcquire), ctx.bounds());
            palisade_conformance::lock::owner_only_release_and_extend(&ctx, &lf).await
        });
    });
    let payload = run.expect_err("the scenario must fail");
    let message = payload.downcast_ref::<String>().cloned().unwrap_or_default();
    let root = message.split_once(": ").map(|(_, rest)| rest).unwrap_or_default();
    assert!(
        root.starts_with("`try_acquire(") || root.contains("calls outlived their bounds: `try_acquire("),
        "the violation leads: {message}"
    );
    assert!(message.contains("round-trip allowance 500 ms"), "{message}");
    // What the scenario saw next (the abandoned call's error) follows, as a consequence.
    assert!(message.contains("(and then: "), "{message}");
}

#[tokio::test]
async fn the_memory_implementations_keep_every_bound() {
    for (name, outcome) in palisade_conformance::lock_outcomes(&MemoryLockFactory::new()).await {
        if let Err(failure) = outcome {
            panic!("lock scenario {name} failed on memory: {failure}");
        }
    }
    for (name, outcome) in palisade_conformance::store_outcomes(&MemoryStoreFactory::new()).await {
        if let Err(failure) = outcome {
            panic!("store scenario {name} failed on memory: {failure}");
        }
    }
    // The scenarios' clients logged into contexts of their own; a client of this log must too.
    let log = CallBounds::new(Duration::from_secs(2));
    let client = BoundedLockFactory::declared(MemoryLockFactory::new(), &log).client().await.unwrap();
    let key = Namespace::new().key("k").unwrap();
    let grant = client.acquire(&key, ttl(), Duration::from_millis(10)).await.unwrap();
    client.extend(&grant, ttl()).await.unwrap();
    client.release(&grant).await.unwrap();
    assert_eq!(log.take_failure(), None);
}
