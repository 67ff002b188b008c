//! Redlock against real Redis masters (five started by `scripts/test`, listed in
//! `PALISADE_REDLOCK_URL`): the lock suite on one master (the default deployment) and on five,
//! and end to end with the SQLite store, where the suite asserts the documented unfenced
//! outcome (the paused holder's write goes through).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::{
    FaultyClient, FencedStoreFactory, LoadSettings, LockServiceFactory, Timing, lock_factory, proxy, require_env,
    store_factory,
};
use palisade_core::{Error, ErrorKind};
use palisade_redlock::RedlockService;
use palisade_sqlite::SqliteStore;

/// The first `n` of the test command's masters. The node timeout is generous because the
/// suite runs beside other tests on two cores; the fault tests use the 50 ms default.
fn redlock(n: usize) -> impl LockServiceFactory<Service = RedlockService> {
    let all = require_env("PALISADE_REDLOCK_URL");
    let hosts: Vec<&str> = all.trim_start_matches("redlock://").split(',').collect();
    assert!(hosts.len() >= n, "PALISADE_REDLOCK_URL lists {} masters, the test needs {n}", hosts.len());
    let url = format!("redlock://{}?node_timeout_ms=250", hosts[..n].join(","));
    let masters: Vec<String> = hosts[..n].iter().map(|h| format!("redis://{h}")).collect();
    let proxied = url.clone();
    lock_factory(Timing::new(Duration::from_millis(500), Duration::from_millis(100)), move || {
        let url = url.clone();
        async move { Ok(Arc::new(RedlockService::connect(&url).await?)) }
    })
    // An operator deleting the lock on every master (`redlock:{domain:id}`).
    .with_break_lock(move |key| {
        let masters = masters.clone();
        async move {
            let fail = |e: redis::RedisError| Error::new(ErrorKind::Backend, "test", format!("raw DEL: {e}"));
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

/// The load spreads over 250 keys (2 acquisitions per key per second instead of 10): Redlock
/// has no queue, and when a round gives no contender a majority all of them release and retry,
/// so five masters under ten contenders per key per second can go without a winner for longer
/// than the scenario's patience on this two-core machine (seen as 20 s acquire timeouts).
fn sqlite() -> impl FencedStoreFactory<Store = SqliteStore> {
    store_factory(|| async {
        let path = format!("{}/palisade-redlock-e2e.db", env!("CARGO_TARGET_TMPDIR"));
        Ok(Arc::new(SqliteStore::connect(&format!("sqlite://{path}?synchronous=normal&busy_timeout_ms=30000")).await?))
    })
    .with_load(LoadSettings { keys: 250, ..LoadSettings::from_env() })
}

palisade_conformance::certify!(redlock_single_master: lock_service = redlock(1), store = sqlite());
palisade_conformance::certify!(redlock: lock_service = redlock(5), store = sqlite());
