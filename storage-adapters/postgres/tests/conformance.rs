//! The PostgreSQL store against a real PostgreSQL (started by `scripts/test`, address in
//! `PALISADE_POSTGRES_URL`): the store suite, and end to end with the in-memory lock service.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;

use palisade_conformance::memory::MemoryLockFactory;
use palisade_conformance::{FencedStoreFactory, require_env, store_factory};
use palisade_postgres::{PostgresConfig, PostgresStore};

/// Each client is its own small pool.
fn postgres() -> impl FencedStoreFactory<Store = PostgresStore> {
    let url = require_env("PALISADE_POSTGRES_URL");
    store_factory(move || {
        let config = PostgresConfig { max_connections: 4, ..PostgresConfig::new(url.clone()) };
        async move { Ok(Arc::new(PostgresStore::open(config).await?)) }
    })
}

palisade_conformance::fenced_store_suite!(postgres());
palisade_conformance::end_to_end_suite!(MemoryLockFactory::new(), postgres());
