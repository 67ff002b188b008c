//! The Redis lock service's test factory (feature `conformance`): what its certification
//! and every pairing test use, so no test writes them twice. They read the server's address
//! from the environment the test command sets ([`require_env`]: a missing variable fails, never
//! skips).

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::{FaultyClient, LockServiceFactory, Timing, lock_factory, proxy, require_env};
use palisade_core::{Error, ErrorKind};

use crate::RedisLockService;

/// Independent clients (each its own connection, as a separate process would have) of the Redis
/// at `PALISADE_REDIS_URL`, with `break_lock` (a raw `DEL` of the lock key) and a faulty client.
pub fn service() -> impl LockServiceFactory<Service = RedisLockService> {
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
            let fail = |e: redis::RedisError| Error::new(ErrorKind::Backend, "conformance", format!("raw DEL: {e}"));
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
