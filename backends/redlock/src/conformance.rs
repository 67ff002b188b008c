//! Redlock's test factory (feature `conformance`): what its certification
//! and every pairing test use, so no test writes them twice. They read the server's address
//! from the environment the test command sets ([`require_env`]: a missing variable fails, never
//! skips).

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::{FaultyClient, LockServiceFactory, Timing, lock_factory, proxy, require_env};
use palisade_core::{Error, ErrorKind};

use crate::RedlockService;

/// Independent clients of Redlock over the first `n` masters of `PALISADE_REDLOCK_URL`, with
/// `break_lock` (the lock deleted on every master) and a faulty client (a proxy per master). The
/// node timeout is generous: the certification runs beside other tests on two cores.
pub fn service(n: usize) -> impl LockServiceFactory<Service = RedlockService> {
    let all = require_env("PALISADE_REDLOCK_URL");
    let hosts: Vec<&str> = all.trim_start_matches("redlock://").split(',').collect();
    // Fewer masters than asked for is the environment's mistake: every client says so.
    let missing =
        (hosts.len() < n).then(|| format!("PALISADE_REDLOCK_URL lists {} masters, {n} are needed", hosts.len()));
    let n = n.min(hosts.len());
    let url = format!("redlock://{}?node_timeout_ms=250", hosts[..n].join(","));
    let masters: Vec<String> = hosts[..n].iter().map(|h| format!("redis://{h}")).collect();
    let proxied = url.clone();
    lock_factory(Timing::new(Duration::from_millis(500), Duration::from_millis(100)), move || {
        let (url, missing) = (url.clone(), missing.clone());
        async move {
            if let Some(missing) = missing {
                return Err(Error::new(ErrorKind::InvalidConfig, "conformance", missing));
            }
            Ok(Arc::new(RedlockService::connect(&url).await?))
        }
    })
    // What `palisade inspect` reads: a client of its own, as the service is its own view.
    .viewed()
    // An operator deleting the lock on every master (`redlock:{domain:id}`).
    .with_break_lock(move |key| {
        let masters = masters.clone();
        async move {
            let fail = |e: redis::RedisError| Error::new(ErrorKind::Backend, "conformance", format!("raw DEL: {e}"));
            for master in masters {
                let client = redis::Client::open(master.as_str()).map_err(fail)?;
                let mut conn = client.get_multiplexed_async_connection().await.map_err(fail)?;
                let lock = format!("redlock:{{{}:{}}}", key.domain(), key.id());
                let _: i64 = redis::cmd("DEL").arg(lock).query_async(&mut conn).await.map_err(fail)?;
            }
            Ok(())
        }
    })
    .with_faulty_client(move || {
        let url = proxied.clone();
        async move {
            let (url, proxies) = proxy::proxy_url(&url).await?;
            Ok(FaultyClient::new(Arc::new(RedlockService::connect(&url).await?), proxies))
        }
    })
}
