//! The DynamoDB store against a real DynamoDB-API server (moto, started by `scripts/test`;
//! endpoint in `PALISADE_DYNAMODB_ENDPOINT`): the store suite — which is what verifies the
//! server's condition-expression and transaction behaviour, nothing is assumed — and end to
//! end with the in-memory lock service.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;

use palisade_conformance::memory::MemoryLockFactory;
use palisade_conformance::{FencedStoreFactory, LoadSettings, require_env, store_factory};
use palisade_dynamodb::{DynamoConfig, DynamoStore};

/// moto serves one request at a time (see `scripts/lib/moto_serial.py`) at a few milliseconds
/// each, and copies the whole table for every transaction: the load scenario asks 25 jobs/s for
/// 4 s over 10 keys of it, and a table of this test process's own keeps the copies small.
fn dynamodb() -> impl FencedStoreFactory<Store = DynamoStore> {
    let endpoint = require_env("PALISADE_DYNAMODB_ENDPOINT");
    let table = format!("palisade-conformance-{}", palisade_conformance::test_process_id());
    store_factory(move || {
        let config = DynamoConfig {
            endpoint: Some(endpoint.clone()),
            region: Some("us-east-1".into()),
            // moto serves one request at a time and copies the table for every transaction:
            // under the load scenario a request can queue for seconds.
            attempt_timeout: std::time::Duration::from_secs(30),
            operation_timeout: std::time::Duration::from_secs(60),
            ..DynamoConfig::new(table.clone())
        };
        async move { Ok(Arc::new(DynamoStore::open(config).await?)) }
    })
    .with_load(LoadSettings { rate: 25, secs: 4, keys: 10 })
}

palisade_conformance::certify!(dynamodb: fenced_store = dynamodb(), lock_service = MemoryLockFactory::new());
