//! The incident's load test on Redis + PostgreSQL: 500 acquisitions/s for 60 s across 50 SKUs with
//! 5–20 ms handlers; fences per key gap-free and no duplicate side effect. A test binary of its
//! own, so that nothing else competes for the two cores while it runs.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;
use std::time::Duration;

use palisade::postgres::{PostgresConfig, PostgresStore};
use palisade::redis::RedisLockService;
use palisade_conformance::e2e::{LoadSettings, load_with};
use palisade_conformance::{Timing, harness, lock_factory, require_env, store_factory};

#[test]
fn load_of_500_per_second_for_60_seconds() {
    let redis_url = require_env("PALISADE_REDIS_URL");
    let pg_url = require_env("PALISADE_POSTGRES_URL");
    let test = harness::test_name(module_path!(), "load_of_500_per_second_for_60_seconds");
    harness::run("load", &test, |ctx| async move {
        let locks = lock_factory(Timing::new(Duration::from_millis(200), Duration::from_millis(50)), move || {
            let url = redis_url.clone();
            async move { Ok(Arc::new(RedisLockService::connect(&url).await?)) }
        });
        let stores = store_factory(move || {
            let config = PostgresConfig { max_connections: 4, ..PostgresConfig::new(pg_url.clone()) };
            async move { Ok(Arc::new(PostgresStore::open(config).await?)) }
        });
        load_with(&ctx, &locks, &stores, LoadSettings { rate: 500, secs: 60, keys: 50 }).await
    });
}
