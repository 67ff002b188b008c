//! # palisade-dynamodb
//!
//! Palisade's DynamoDB fenced store: the fence check travels **inside** the write, as a
//! condition DynamoDB evaluates atomically with it.
//!
//! - **Your own items, one request**: [`DynamoStore::update_item_fenced`],
//!   [`put_item_fenced`](DynamoStore::put_item_fenced) and
//!   [`delete_item_fenced`](DynamoStore::delete_item_fenced) take the request you built with
//!   the SDK, add `attribute_not_exists(fence) OR fence <= :f` (ANDed with your condition) and
//!   `fence = :f`, and send it once. `ConditionalCheckFailedException` becomes
//!   `StaleFence { presented, current }`, `current` read from the old item DynamoDB returns with
//!   the failure (`ReturnValuesOnConditionCheckFailure=ALL_OLD`); if the fence was fine, your own
//!   condition failed: `Conflict`.
//! - **Several items, all or nothing**: the portable [`FencedStore`](palisade_core::FencedStore)
//!   API sends one `TransactWriteItems` whose first item is the conditional update of the
//!   resource's watermark item; a cancellation because of it is `StaleFence`, because of a
//!   record's `Create`/`Check` condition `Conflict`, because of a concurrent transaction it is
//!   retried with a fresh request token.
//! - **Ambiguous outcomes**: every transaction carries a client request token, so the SDK's
//!   own retries (standard mode: throttling, 5xx, dropped connections) apply it at most once; a
//!   failure after the request left (timeout, broken response) is `OutcomeUnknown`, never
//!   "applied" and never "refused".
//!
//! ## Table
//!
//! One table, partition key `pk` (string), on-demand billing; created at connect unless
//! `create_table=false` ([`DynamoStore::create_table`]). Items: `fence#<domain:id>` with the
//! watermark in `fence` (number); `rec#<record key>` with `value` (binary) and the writer's
//! `fence`. `list` is a consistent `Scan` (tooling and tests, not a hot path).
//!
//! ## Connecting
//!
//! `dynamodb://TABLE[?endpoint=http://127.0.0.1:8000&region=eu-west-1&create_table=false]`.
//! Credentials come from the SDK's standard chain (environment, profile, web identity,
//! instance metadata), never from the URL; a chain that finds none is
//! [`InvalidConfig`](palisade_core::ErrorKind::InvalidConfig). The HTTP client is rustls (ring)
//! on tokio; an `https://` endpoint signed by a private CA is trusted with
//! [`DynamoConfig::with_tls_root_cert`], and a refused handshake is `InvalidConfig` too.
//!
//! ```no_run
//! # async fn demo<S: palisade_core::LockService<Fencing = palisade_core::Fenced>>(lease: palisade_core::Lease<S>) -> palisade_core::Result<()> {
//! use aws_sdk_dynamodb::types::AttributeValue;
//! use palisade_dynamodb::DynamoStore;
//!
//! let store = DynamoStore::connect("dynamodb://palisade?region=eu-west-1").await?;
//! let update = store
//!     .client()
//!     .update_item()
//!     .table_name("inventory")
//!     .key("sku", AttributeValue::S("SKU-1".into()))
//!     .update_expression("SET qty = qty - :one")
//!     .condition_expression("qty >= :one")
//!     .expression_attribute_values(":one", AttributeValue::N("1".into()));
//! store.update_item_fenced(update, lease.grant_fence()).await?; // `lease`: a fenced lock

//! # Ok(()) }
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
#[cfg(feature = "conformance")]
pub mod conformance;
mod diagnose;
mod errors;
mod single_item;
mod store;

pub use aws_sdk_dynamodb;
pub use config::DynamoConfig;
pub use store::{DynamoStore, FENCE_ATTRIBUTE, GRANT_ATTRIBUTE, ItemWatermark, KEY_ATTRIBUTE, VALUE_ATTRIBUTE};

/// The backend name in errors, logs and metrics.
pub const BACKEND: &str = "dynamodb";
