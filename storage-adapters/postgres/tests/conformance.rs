//! The PostgreSQL store and lock service against a real PostgreSQL (started by `scripts/test`,
//! address in `PALISADE_POSTGRES_URL`): the store suite; the lock suite (child processes
//! connect to the same database); end to end with the in-memory lock service, with the
//! PostgreSQL lock service in the store's own database, and the same with every fenced write
//! requiring its lock to be live (`require_live_lock`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::memory::MemoryLockFactory;
use palisade_conformance::{
    FaultyClient, FencedStoreFactory, HeldTransaction, LockServiceFactory, Timing, lock_factory, proxy, require_env,
    store_factory,
};
use palisade_core::{GrantFence, ResourceKey};
use palisade_postgres::{PostgresConfig, PostgresLockService, PostgresStore};

fn config() -> PostgresConfig {
    PostgresConfig { max_connections: 4, ..PostgresConfig::new(require_env("PALISADE_POSTGRES_URL")) }
}

/// Each client is its own small pool; a held fenced transaction is `begin_with_fence` on a
/// client of its own.
fn postgres() -> impl FencedStoreFactory<Store = PostgresStore> {
    store_factory(|| async { Ok(Arc::new(PostgresStore::open(config()).await?)) })
        .with_held_transaction(|resource, fence| hold(config(), resource, fence))
}

/// A store whose every fenced write also requires its lock to be live in the database.
fn postgres_live() -> impl FencedStoreFactory<Store = PostgresStore> {
    let live = || PostgresConfig { require_live_lock: true, ..config() };
    store_factory(move || async move { Ok(Arc::new(PostgresStore::open(live()).await?)) })
        .with_held_transaction(move |resource, fence| hold(live(), resource, fence))
}

/// A fenced transaction opened and left open (the store is kept with it).
async fn hold(
    config: PostgresConfig,
    resource: ResourceKey,
    fence: GrantFence,
) -> palisade_core::Result<HeldTransaction> {
    let store = PostgresStore::open(config).await?;
    let tx = store.begin_with_fence(&resource, fence).await?;
    Ok(Box::new((tx, store)))
}

/// Lock clients, each with its own pool, as separate processes would have. The margin covers
/// a waiter that missed a notification (it looks again within 250 ms). The TTL covers a renewal
/// queued behind the other scenarios' statements (this suite runs them all at once on two
/// cores): at 400 ms one came too late once.
fn postgres_locks() -> impl LockServiceFactory<Service = PostgresLockService> {
    lock_factory(Timing::new(Duration::from_millis(600), Duration::from_millis(300)), || async {
        Ok(Arc::new(PostgresLockService::new(&PostgresStore::open(config()).await?).await?))
    })
    // An operator clearing the lock by hand (the row and its fence counter stay).
    .with_break_lock(|key| async move {
        let store = PostgresStore::open(config()).await?;
        sqlx::query("UPDATE palisade_locks SET grant_id = NULL, expires_at = now() WHERE resource = $1")
            .bind(key.to_string())
            .execute(store.pool())
            .await
            .map_err(palisade_postgres::map_err)?;
        Ok(())
    })
    // A client whose connections (its pool's and its listener's) pass through a fault proxy.
    .with_faulty_client(|| async {
        let (url, proxies) = proxy::proxy_url(&require_env("PALISADE_POSTGRES_URL")).await?;
        let store = PostgresStore::open(PostgresConfig { max_connections: 4, ..PostgresConfig::new(url) }).await?;
        Ok(FaultyClient::new(Arc::new(PostgresLockService::new(&store).await?), proxies))
    })
}

palisade_conformance::certify!(postgres_store: fenced_store = postgres(), lock_service = MemoryLockFactory::new());
palisade_conformance::certify!(
    postgres: lock_service = postgres_locks(),
    store = postgres(),
    restartable = OwnPostgres::start(),
);
palisade_conformance::certify!(postgres_live_lock: pairing, lock_service = postgres_locks(), store = postgres_live());

/// The PostgreSQL lock service on a server of the test's own, which the restart scenario kills
/// (SIGKILL, crash recovery on the next start) keeping its data, and restarts with a new, empty
/// database: fences continue after the crash, and `lock_checked` repairs the empty database's
/// counters.
struct OwnPostgres {
    server: std::sync::Mutex<palisade_lab::servers::PostgresServer>,
    url: String,
}

impl OwnPostgres {
    fn start() -> Self {
        let server = palisade_lab::servers::PostgresServer::start().unwrap();
        let url = server.url();
        OwnPostgres { server: std::sync::Mutex::new(server), url }
    }
}

#[palisade_core::spi::async_trait]
impl LockServiceFactory for OwnPostgres {
    type Service = PostgresLockService;
    async fn client(&self) -> palisade_core::Result<Arc<PostgresLockService>> {
        Ok(Arc::new(PostgresLockService::connect(&self.url).await?))
    }
    fn timing(&self) -> Timing {
        Timing::new(Duration::from_millis(400), Duration::from_millis(300))
    }
    async fn restart_server(&self, keep_data: bool) -> palisade_core::Result<()> {
        let restarted = self.server.lock().unwrap().restart_keeping_data(keep_data);
        restarted.map_err(|e| {
            palisade_core::Error::new(
                palisade_core::ErrorKind::Unavailable,
                "test",
                format!("restarting postgres: {e}"),
            )
        })
    }
}
