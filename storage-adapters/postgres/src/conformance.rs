//! The PostgreSQL store's and lock service's test factories (feature `conformance`): what
//! their certifications and every pairing test use, so no test writes them twice. They read
//! the server's address from `PALISADE_POSTGRES_URL`, which the test command sets
//! ([`require_env`]: a missing variable fails, never skips).

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::{
    FaultyClient, FencedStoreFactory, HeldTransaction, LockServiceFactory, Timing, lock_factory, proxy, require_env,
    store_factory,
};
use palisade_core::{GrantFence, ResourceKey, Result};

use crate::{PostgresConfig, PostgresLockService, PostgresStore};

fn config(url: &str) -> Result<PostgresConfig> {
    Ok(PostgresConfig { max_connections: 4, ..PostgresConfig::from_url(url)? })
}

/// Independent store clients, each its own small pool; a held fenced transaction
/// (`hold_transaction`) is `begin_with_fence` on a client of its own.
pub fn store() -> impl FencedStoreFactory<Store = PostgresStore> {
    store_at(require_env("PALISADE_POSTGRES_URL"))
}

/// [`store`] on the database at `url` (its query parameters too: `sslmode`, `sslrootcert`, …).
pub fn store_at(url: String) -> impl FencedStoreFactory<Store = PostgresStore> {
    let held = url.clone();
    store_factory(move || {
        let config = config(&url);
        async move { Ok(Arc::new(PostgresStore::open(config?).await?)) }
    })
    .with_held_transaction(move |resource, fence| {
        let config = config(&held);
        async move { hold(config?, resource, fence).await }
    })
}

/// [`store`], with every fenced write requiring its lock to be live in the database.
pub fn live_lock_store() -> impl FencedStoreFactory<Store = PostgresStore> {
    let url = require_env("PALISADE_POSTGRES_URL");
    let live = PostgresConfig { require_live_lock: true, max_connections: 4, ..PostgresConfig::new(url) };
    let held = live.clone();
    store_factory(move || {
        let live = live.clone();
        async move { Ok(Arc::new(PostgresStore::open(live).await?)) }
    })
    .with_held_transaction(move |resource, fence| hold(held.clone(), resource, fence))
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

/// Lock clients, each with its own pool, as separate processes would have, with `break_lock`
/// (the lock row cleared by hand; its fence counter stays) and a faulty client (its pool's and
/// its listener's connections through a proxy). The margin covers a waiter that missed a
/// notification (it looks again within 250 ms); the TTL a renewal queued behind the other
/// scenarios' statements on two cores.
pub fn service() -> impl LockServiceFactory<Service = PostgresLockService> {
    service_at(require_env("PALISADE_POSTGRES_URL"))
}

/// [`service`] on the database at `url` (its query parameters too: `sslmode`, `sslrootcert`,
/// …; the faulty client's proxy forwards TLS untouched, so it keeps them).
pub fn service_at(url: String) -> impl LockServiceFactory<Service = PostgresLockService> {
    let (broken, proxied) = (url.clone(), url.clone());
    lock_factory(Timing::new(Duration::from_millis(600), Duration::from_millis(300)), move || {
        let config = config(&url);
        async move { Ok(Arc::new(PostgresLockService::new(&PostgresStore::open(config?).await?).await?)) }
    })
    // What `palisade inspect` reads: a client of its own, as the service is its own view.
    .viewed()
    .with_break_lock(move |key| {
        let config = config(&broken);
        async move {
            let store = PostgresStore::open(config?).await?;
            sqlx::query("UPDATE palisade_locks SET grant_id = NULL, expires_at = now() WHERE resource = $1")
                .bind(key.to_string())
                .execute(store.pool())
                .await
                .map_err(crate::map_err)?;
            Ok(())
        }
    })
    .with_faulty_client(move || {
        let url = proxied.clone();
        async move {
            let (url, proxies) = proxy::proxy_url(&url).await?;
            let store = PostgresStore::open(config(&url)?).await?;
            Ok(FaultyClient::new(Arc::new(PostgresLockService::new(&store).await?), proxies))
        }
    })
}
