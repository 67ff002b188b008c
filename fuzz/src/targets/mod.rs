//! One module per fuzz target: `run` takes one input, the bytes libFuzzer hands the target
//! (`fuzz/libfuzzer/`), or one file of the committed corpus (`tests/corpus.rs`).

pub mod batch_encoding;
pub mod connection_urls;
pub mod dynamodb_replies;
pub mod etcd_replies;
pub mod keys_and_records;
pub mod postgres_replies;
pub mod redis_replies;
pub mod sqlite_batches;
pub mod warehouse_cli;
pub mod zookeeper_nodes;
