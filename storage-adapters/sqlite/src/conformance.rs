//! The SQLite store's and lock service's test factories (feature `conformance`): what their
//! certifications and every pairing test use, so no test writes them twice. Each takes the
//! database's URL (a file of the test's own, which child processes open too).

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::{FencedStoreFactory, LockServiceFactory, Timing, lock_factory, store_factory};

use crate::{SqliteLockService, SqliteStore};

/// `sqlite://` URL of `path`, favouring speed over power-loss durability (the scenarios test
/// semantics, not fsync) and waiting up to 30 s for the file's writer.
pub fn url(path: &std::path::Path) -> String {
    format!("sqlite://{}?synchronous=normal&busy_timeout_ms=30000", path.display())
}

/// Independent store clients (each its own pool) of the database at `url`.
pub fn store(url: impl Into<String>) -> impl FencedStoreFactory<Store = SqliteStore> {
    let url = url.into();
    store_factory(move || {
        let url = url.clone();
        async move { Ok(Arc::new(SqliteStore::connect(&url).await?)) }
    })
}

/// Lock clients of the database at `url`, each with its own pool as separate processes would
/// have, with `break_lock` (the lock row cleared by hand; its fence counter stays). The margin
/// covers the polling backoff (up to 250 ms) of a waiter that saw the lock held; the TTL a
/// renewal queued behind other writers of the same file on two cores.
pub fn service(url: impl Into<String>) -> impl LockServiceFactory<Service = SqliteLockService> {
    let url = url.into();
    let raw = url.clone();
    lock_factory(Timing::new(Duration::from_millis(500), Duration::from_millis(300)), move || {
        let url = url.clone();
        async move { Ok(Arc::new(SqliteLockService::connect(&url).await?)) }
    })
    // What `palisade inspect` reads: a client of its own, as the service is its own view.
    .viewed()
    .with_break_lock(move |key| {
        let url = raw.clone();
        async move {
            let store = SqliteStore::connect(&url).await?;
            sqlx::query("UPDATE palisade_locks SET owner = NULL, expires_at_ms = 0 WHERE resource = ?1")
                .bind(key.to_string())
                .execute(store.pool())
                .await
                .map_err(crate::map_err)?;
            Ok(())
        }
    })
}
