//! The Redis lock service against a real Redis (started by `scripts/test`, address in
//! `PALISADE_REDIS_URL`): the lock suite, and end to end with the SQLite store.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::{
    FaultyClient, FencedStoreFactory, LockServiceFactory, Timing, lock_factory, proxy, require_env, store_factory,
};
use palisade_core::{Error, ErrorKind};
use palisade_redis::RedisLockService;
use palisade_sqlite::SqliteStore;

/// Each client is its own connection, as a separate process would have.
fn redis() -> impl LockServiceFactory<Service = RedisLockService> {
    let url = require_env("PALISADE_REDIS_URL");
    let raw = url.clone();
    let proxied = url.clone();
    lock_factory(Timing::new(Duration::from_millis(200), Duration::from_millis(50)), move || {
        let url = url.clone();
        async move { Ok(Arc::new(RedisLockService::connect(&url).await?)) }
    })
    .with_break_lock(move |key| {
        let url = raw.clone();
        async move {
            let fail = |e: redis::RedisError| Error::new(ErrorKind::Backend, "test", format!("raw DEL: {e}"));
            let client = redis::Client::open(url.as_str()).map_err(fail)?;
            let mut conn = client.get_multiplexed_async_connection().await.map_err(fail)?;
            let _: i64 = redis::cmd("DEL").arg(key.lock_key()).query_async(&mut conn).await.map_err(fail)?;
            Ok(())
        }
    })
    .with_faulty_client(move || {
        let url = proxied.clone();
        async move {
            let (url, proxies) = proxy::proxy_url(&url).await?;
            Ok(FaultyClient::new(Arc::new(RedisLockService::connect(&url).await?), proxies))
        }
    })
}

fn sqlite() -> impl FencedStoreFactory<Store = SqliteStore> {
    store_factory(|| async {
        let path = format!("{}/palisade-redis-e2e.db", env!("CARGO_TARGET_TMPDIR"));
        Ok(Arc::new(SqliteStore::connect(&format!("sqlite://{path}?synchronous=normal&busy_timeout_ms=30000")).await?))
    })
}

palisade_conformance::lock_service_suite!(redis());
palisade_conformance::end_to_end_suite!(redis(), sqlite());
