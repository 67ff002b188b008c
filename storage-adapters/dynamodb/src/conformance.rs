//! The DynamoDB store's test factory (feature `conformance`): what its certification and
//! every pairing test use, so no test writes it twice. It reads the endpoint from
//! `PALISADE_DYNAMODB_ENDPOINT`, which the test command sets ([`require_env`]: a missing
//! variable fails, never skips).

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::{FencedStoreFactory, LoadSettings, require_env, store_factory};

use crate::{DynamoConfig, DynamoStore};

/// Independent clients of the table `table` at the test endpoint. The test server (moto)
/// serves one request at a time and copies the whole table for every transaction: requests
/// may queue for seconds under load, and the load scenario asks 25 jobs/s for 4 s over 10 keys.
/// Give each test process a table of its own (`palisade_conformance::test_process_id`) to keep
/// the copies small.
pub fn store(table: impl Into<String>) -> impl FencedStoreFactory<Store = DynamoStore> {
    let endpoint = require_env("PALISADE_DYNAMODB_ENDPOINT");
    let table = table.into();
    store_factory(move || {
        let config = DynamoConfig {
            endpoint: Some(endpoint.clone()),
            region: Some("us-east-1".into()),
            attempt_timeout: Duration::from_secs(30),
            operation_timeout: Duration::from_secs(60),
            ..DynamoConfig::new(table.clone())
        };
        async move { Ok(Arc::new(DynamoStore::open(config).await?)) }
    })
    .with_load(LoadSettings { rate: 25, secs: 4, keys: 10 })
}
