//! The ZooKeeper lock service against a real standalone ZooKeeper (started by `scripts/test`,
//! address in `PALISADE_ZK_URL`, tickTime 500 ms): the lock suite, end to end with SQLite, and
//! the recipe's own hazards.
//!
//! Timing: 3 s sessions (grants are capped at 2 s, two thirds of it), 1 s grants; the margin
//! covers a frozen or killed holder's session expiry plus the server's 500 ms expiry tick.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use palisade_core::LockOptions;
use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::{FencedStoreFactory, LockServiceFactory, Restart, Timing, require_env, store_factory};
use palisade_core::{Error, ErrorKind};
use palisade_core::{LockService, LockServiceExt, ResourceKey, Ttl};
use palisade_sqlite::SqliteStore;
use palisade_zookeeper::ZkLockService;

fn url() -> String {
    format!("{}?session_timeout_ms=3000", require_env("PALISADE_ZK_URL"))
}

fn zookeeper() -> impl LockServiceFactory<Service = ZkLockService> {
    palisade_zookeeper::conformance::service()
}

fn sqlite() -> impl FencedStoreFactory<Store = SqliteStore> {
    store_factory(|| async {
        let path = format!("{}/palisade-zk-e2e.db", env!("CARGO_TARGET_TMPDIR"));
        Ok(Arc::new(SqliteStore::connect(&format!("sqlite://{path}?synchronous=normal&busy_timeout_ms=30000")).await?))
    })
}

palisade_conformance::certify!(
    zookeeper: lock_service = zookeeper(),
    store = sqlite(),
    restartable = zookeeper_ensemble(1),
    cluster = zookeeper_ensemble(3),
);

/// The fence is the node's czxid, not its sequence: deleting the resource's parent between
/// grants restarts the sequence at 0, and the fence still grows.
#[tokio::test]
async fn deleting_the_parent_between_grants_restarts_the_sequence_not_the_fence() {
    let locks = ZkLockService::connect(&url()).await.unwrap();
    let key = ResourceKey::new("zkparent", format!("p{}", std::process::id())).unwrap();
    let parent = locks.parent_path(&key);
    let client = locks.client().await.unwrap();
    let mut fences = Vec::new();
    for round in 0..3 {
        let grant = locks.try_acquire(&key, Ttl::from_millis(2000).unwrap()).await.unwrap().expect("free");
        let node = grant.handle().unwrap().to_string();
        assert!(node.ends_with("0000000000"), "round {round}: a fresh parent restarts the sequence: {node}");
        fences.push(grant.fence().get());
        locks.release(&grant).await.unwrap();
        client.delete(&parent, None).await.unwrap();
    }
    assert!(fences.windows(2).all(|w| w[1] > w[0]), "fences must grow across parent deletions: {fences:?}");
}

/// CURATOR-604: a holder's session expires while a waiter waits. The waiter gets the lock with a
/// higher fence; the expired holder's grant is lost; after its client starts a new session, the
/// old session's node is never taken for its own: it cannot get the lock while the waiter holds it.
#[tokio::test]
async fn an_expired_session_never_passes_its_node_off_as_a_new_sessions() {
    let a = Arc::new(ZkLockService::connect(&url()).await.unwrap());
    let b = Arc::new(ZkLockService::connect(&url()).await.unwrap());
    let key = ResourceKey::new("zk604", format!("k{}", std::process::id())).unwrap();
    let held = a.try_acquire(&key, Ttl::from_millis(1500).unwrap()).await.unwrap().expect("free");
    // The waiter keeps the lock it gets (renewing from the moment it has it) however long the
    // rest takes on a loaded machine.
    let progress = palisade_core::Progress::new();
    let ticker = {
        let progress = progress.clone();
        tokio::spawn(async move {
            loop {
                progress.tick();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let waiter = {
        let (b, key, progress) = (Arc::clone(&b), key.clone(), progress.clone());
        tokio::spawn(async move {
            let lease = b.lock(&key, LockOptions::ttl(Duration::from_secs(2)).wait(Duration::from_secs(20))).await?;
            let renewal = lease.renew_on_progress(&progress);
            Ok::<_, palisade_core::Error>((lease, renewal))
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Expire A's session the classic way: a second client joins it and closes it.
    let a_client = a.client().await.unwrap();
    let server = require_env("PALISADE_ZK_URL").replacen("zk://", "", 1);
    let mut hijack = None;
    for _ in 0..5 {
        // A loaded machine can make the join slow: be patient, and try again.
        let joined = palisade_zookeeper::zookeeper_client::Client::connector()
            .with_session(a_client.session().clone())
            .with_connection_timeout(Duration::from_secs(5))
            .connect(&server)
            .await;
        match joined {
            Ok(client) => {
                hijack = Some(client);
                break;
            }
            Err(e) => eprintln!("joining A's session: {e} (trying again)"),
        }
    }
    drop(hijack.expect("could not join A's session"));
    let (lease, _renewal) = waiter.await.unwrap().unwrap();
    assert!(lease.fence() > held.fence(), "waiter fence {} vs expired holder {}", lease.fence(), held.fence());
    tokio::time::timeout(Duration::from_secs(5), held.lost_token().cancelled()).await.expect("A's grant must be lost");
    // A's next attempt runs on a new session and must not see the lock as its own. The client
    // may still be establishing that session on a loaded machine: an error is not a grant, so
    // retry those for a while.
    let ttl = Ttl::from_millis(1500).unwrap();
    let patient = async |what: &str| {
        for _ in 0..50 {
            match a.try_acquire(&key, ttl).await {
                Ok(answer) => return answer,
                Err(e) => eprintln!("{what}: {e} (retrying)"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("{what}: A's client never answered");
    };
    assert!(!lease.is_lost(), "the waiter lost its lock before A's attempt");
    assert!(patient("A after its session expired").await.is_none(), "A took a held lock");
    let waiter_fence = lease.fence();
    ticker.abort();
    assert!(!lease.is_lost(), "the waiter lost its lock while A retried");
    lease.release().await.unwrap();
    let again = patient("A after the release").await.expect("free again");
    assert!(again.fence() > waiter_fence);
    a.release(&again).await.unwrap();
}

/// Clients of an ensemble of the factory's own (4 s sessions): of one server, what the restart
/// scenario restarts with and without its data; of three, what the leader-kill scenario kills
/// the leader of.
struct ZkEnsembleFactory {
    ensemble: tokio::sync::Mutex<palisade_lab::servers::ZkEnsemble>,
    url: String,
}

fn zookeeper_ensemble(size: usize) -> ZkEnsembleFactory {
    let ensemble = palisade_lab::servers::ZkEnsemble::start(&require_env("PALISADE_ZK_CLASSPATH"), size).unwrap();
    let url = format!("{}?session_timeout_ms=4000", ensemble.url());
    ZkEnsembleFactory { ensemble: tokio::sync::Mutex::new(ensemble), url }
}

#[palisade_core::spi::async_trait]
impl LockServiceFactory for ZkEnsembleFactory {
    type Service = ZkLockService;
    async fn client(&self) -> palisade_core::Result<Arc<ZkLockService>> {
        Ok(Arc::new(ZkLockService::connect(&self.url).await?))
    }
    fn timing(&self) -> Timing {
        Timing::new(Duration::from_secs(1), Duration::from_millis(4500))
    }
    async fn kill_leader(&self) -> palisade_core::Result<String> {
        let leader = self
            .ensemble
            .lock()
            .await
            .kill_leader(Duration::from_secs(10))
            .await
            .map_err(|e| Error::new(ErrorKind::Backend, "test", format!("could not kill the leader: {e}")))?;
        Ok(format!("server {}", leader + 1))
    }
    async fn restart_server(&self, how: Restart) -> palisade_core::Result<()> {
        let mut ensemble = self.ensemble.lock().await;
        let restarted = ensemble.restart_as(how);
        restarted.map_err(|e| Error::new(ErrorKind::Unavailable, "test", format!("restarting ZooKeeper: {e}")))
    }
}
