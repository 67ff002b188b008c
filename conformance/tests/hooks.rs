//! A declared guarantee needs the hook that tests it: certification fails, naming the hook,
//! when the factory does not provide it, and passes (not applicable) when nothing that needs it
//! is declared.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::{Ctx, LockServiceFactory, Outcome, Status, Timing, certify, lock, lock_factory};
use palisade_core::spi::async_trait;
use palisade_core::{
    Capabilities, Deployment, Fence, Fenced, Grant, LockService, MemoryLockService, Replication, ResourceKey, Result,
    Ttl,
};

/// The in-memory service, declaring whatever the test says.
struct Declaring {
    inner: MemoryLockService,
    caps: Capabilities,
}

#[async_trait]
impl LockService for Declaring {
    type Fencing = Fenced;
    fn backend(&self) -> &'static str {
        "declaring"
    }
    fn capabilities(&self) -> Capabilities {
        self.caps
    }
    async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Fenced>>> {
        self.inner.try_acquire(key, ttl).await
    }
    async fn acquire(&self, key: &ResourceKey, ttl: Ttl, wait: Duration) -> Result<Grant<Fenced>> {
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

/// A factory with no hook at all, over a service declaring `change(memory's capabilities)`.
fn declaring(change: impl Fn(&mut Capabilities)) -> impl LockServiceFactory<Service = Declaring> {
    let memory = MemoryLockService::new();
    let mut caps = memory.capabilities();
    change(&mut caps);
    let service = Arc::new(Declaring { inner: memory, caps });
    lock_factory(Timing::new(Duration::from_millis(200), Duration::from_millis(50)), move || {
        let service = Arc::clone(&service);
        async move { Ok(service) }
    })
}

fn ctx(name: &'static str) -> Ctx {
    Ctx::new(name, "")
}

fn fails_naming(outcome: Outcome, declared: &str, hook: &str) {
    let failure = outcome.expect_err("a declared guarantee without its hook must fail certification");
    assert!(failure.message.contains(declared), "the failure names the declaration `{declared}`: {failure}");
    assert!(failure.message.contains(hook), "the failure names the hook `{hook}`: {failure}");
}

fn not_applicable(outcome: Outcome) {
    let report = outcome.expect("nothing declared that needs the hook");
    assert_eq!(report.status, Status::NotApplicable, "{report:?}");
}

#[tokio::test]
async fn durable_fences_without_restart_server_fail() {
    let f = declaring(|c| c.fences_survive_restart = true);
    fails_naming(
        certify::without_restart_server(&ctx("restart"), &f).await,
        "fences_survive_restart",
        "restart_server",
    );
    let f = declaring(|c| c.fences_survive_restart = false);
    not_applicable(certify::without_restart_server(&ctx("restart"), &f).await);
}

#[tokio::test]
async fn a_leader_quorum_without_kill_leader_fails() {
    let f = declaring(|c| c.replication = Replication::LeaderQuorum);
    fails_naming(certify::without_kill_leader(&ctx("leader_killed"), &f).await, "LeaderQuorum", "kill_leader");
    let f = declaring(|c| c.replication = Replication::None);
    not_applicable(certify::without_kill_leader(&ctx("leader_killed"), &f).await);
}

#[tokio::test]
async fn a_networked_service_without_a_faulty_client_fails() {
    let f = declaring(|c| c.deployment = Deployment::Network);
    let c = ctx("lost_replies_leave_one_live_grant");
    fails_naming(lock::lost_replies_leave_one_live_grant(&c, &f).await, "Deployment::Network", "faulty_client");
    let f = declaring(|c| c.deployment = Deployment::InProcess);
    not_applicable(lock::lost_replies_leave_one_live_grant(&ctx("lost_replies_leave_one_live_grant"), &f).await);
}

#[tokio::test]
async fn a_service_without_break_lock_fails() {
    let f = declaring(|_| {});
    fails_naming(
        lock::lost_signal_from_the_backend(&ctx("lost_signal_from_the_backend"), &f).await,
        "every",
        "break_lock",
    );
}

#[tokio::test]
async fn a_client_majority_behind_one_proxy_fails() {
    use palisade_conformance::relay::{Relay, RelayLockService};
    use palisade_conformance::{FaultProxy, FaultyClient};
    let memory = Arc::new(MemoryLockService::new());
    let mut caps = memory.capabilities();
    caps.replication = Replication::ClientMajority;
    let service = Arc::new(Declaring { inner: MemoryLockService::new(), caps });
    let faulty = Arc::clone(&service);
    let f = lock_factory(Timing::new(Duration::from_millis(200), Duration::from_millis(50)), move || {
        let service = Arc::clone(&service);
        async move { Ok(service) }
    })
    .with_faulty_client(move || {
        let service = Arc::clone(&faulty);
        async move {
            let relay = Relay::serve(Arc::clone(&service)).await?;
            let proxy = FaultProxy::start(relay.addr()).await?;
            let client = RelayLockService::<Fenced>::connect(proxy.addr(), service.capabilities()).await?;
            Ok(FaultyClient::new(Arc::new(client), vec![proxy]).keeping(relay))
        }
    });
    let c = ctx("quorum_faults_never_grant_a_minority");
    fails_naming(lock::quorum_faults_never_grant_a_minority(&c, &f).await, "ClientMajority", "three");
}

#[tokio::test]
async fn a_factory_without_a_view_fails() {
    let f = declaring(|_| {});
    fails_naming(lock::view_shows_the_holder(&ctx("view_shows_the_holder"), &f).await, "every", "view");
}
