//! The DynamoDB store against a real DynamoDB-API server (moto, started by `scripts/test`;
//! endpoint in `PALISADE_DYNAMODB_ENDPOINT`): the store suite — which is what verifies the
//! server's condition-expression and transaction behaviour, nothing is assumed — and end to
//! end with the in-memory lock service.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use palisade_conformance::FencedStoreFactory;
use palisade_conformance::memory::MemoryLockFactory;
use palisade_dynamodb::DynamoStore;

/// A table of this test process's own.
fn dynamodb() -> impl FencedStoreFactory<Store = DynamoStore> {
    palisade_dynamodb::conformance::store(format!("palisade-conformance-{}", palisade_conformance::test_process_id()))
}

palisade_conformance::certify!(dynamodb: fenced_store = dynamodb(), lock_service = MemoryLockFactory::new());
