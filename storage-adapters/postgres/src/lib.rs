//! # palisade-postgres
//!
//! Palisade's PostgreSQL fenced store. The fence check and the write happen in **one
//! transaction** whose first statement raises the resource's watermark:
//!
//! ```sql
//! INSERT INTO palisade_fences (resource, fence) VALUES ($1, $2)
//! ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence
//!   WHERE palisade_fences.fence <= EXCLUDED.fence
//! ```
//!
//! Zero rows affected means a higher fence was accepted before: the transaction rolls back and
//! the caller gets `StaleFence { presented, current }`. The watermark row stays locked until
//! commit, so concurrent fenced transactions on one resource are serialized, and a waiting one
//! re-checks the committed watermark before it proceeds.
//!
//! Ways to write, from the most portable to the closest to your own code:
//!
//! - the portable record API, [`FencedStore`](palisade_core::FencedStore);
//! - your **own statements** in a [`PgFencedTransaction`] from [`PostgresStore::begin_fenced`]
//!   (`&lease`), or the same check in **a transaction you already have**,
//!   [`PostgresStore::check_fence_in`];
//! - the incident's **single-statement** form on a row that carries its own fence column,
//!   [`PostgresStore::update_row_fenced`] (its own transaction) or
//!   [`PostgresStore::update_row_fenced_in`] (yours): `UPDATE t SET …, fence = $f WHERE key = $k
//!   AND fence <= $f`, zero rows mapped to `StaleFence`, the key of any type sqlx binds.
//!
//! Your application already has a pool: [`PostgresStore::from_pool`] uses it.
//!
//! PostgreSQL can also grant the locks: [`PostgresLockService`] keeps them in a table of the
//! same database (expiry by the server's clock, a per-resource fence counter, waiters woken by
//! `LISTEN`/`NOTIFY`), and a store opened with [`PostgresConfig::require_live_lock`] then
//! commits each fenced write only while its lock is live.
//!
//! ```no_run
//! use palisade_core::{Lease, LockService};
//! use palisade_postgres::PostgresStore;
//!
//! # async fn demo<S: LockService<Fencing = palisade_core::Fenced>>(lease: Lease<S>) -> palisade_core::Result<()> {
//! let store = PostgresStore::connect("postgres://app@127.0.0.1/app").await?;
//! // `lease`: the lock on `alloc:WH-01`, from any fenced lock service.
//! let mut tx = store.begin_fenced(&lease).await?;
//! sqlx::query("UPDATE inventory SET qty = qty - 1 WHERE sku = 'SKU-1'")
//!     .execute(tx.conn()).await.map_err(palisade_postgres::map_err)?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```
//!
//! ## Schema
//!
//! [`PostgresStore::connect`] creates the two tables if missing, and (re)creates the function
//! `{fences_table}__{records_table}_apply` ([`PostgresStore::migrate`]): a record batch is one
//! call of it, one statement and one round trip (the watermark rule, every check, every write,
//! or nothing). To run the DDL with your own migration tool instead, take it from
//! [`PostgresConfig::schema_sql`] (run it again after upgrading Palisade) and open the store
//! with `migrate: false`.

#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
#[cfg(feature = "conformance")]
pub mod conformance;
mod db;
mod diagnose;
mod lock;
mod lock_table;
mod store;
mod transaction;

pub use config::{PostgresConfig, PostgresTls, SslMode};
pub use db::map_err;
pub use lock::PostgresLockService;
pub use palisade_core::FencedRow;
pub use store::{PostgresStore, RowKey, RowWatermark};
pub use transaction::PgFencedTransaction;

/// The pure parts that the fuzz targets (`fuzz/`) check: behind the `fuzzing` feature, with
/// no stability promise.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::store::{decode_refusal, encode_ops, failed_check};
}
