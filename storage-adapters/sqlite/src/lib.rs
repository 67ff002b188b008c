//! # palisade-sqlite
//!
//! Palisade's embedded fenced store and lock service: SQLite in WAL mode, no server. The fence
//! check, the watermark raise and the write run in **one** `BEGIN IMMEDIATE` transaction, so a
//! stale holder's write is refused atomically (fencing rule 1).
//!
//! [`SqliteLockService`] keeps locks and their fence counters in the same file as the data: the
//! embedded default (`--lock sqlite://FILE --store sqlite://FILE`) whose fences never regress
//! across runs and which coordinates every process on the machine that opens the file.
//!
//! Two ways to write:
//!
//! - the portable record API, [`FencedStore`](palisade_core::FencedStore) (what the conformance suite and the examples use);
//! - your **own statements** on your own tables, in a [`FencedTransaction`] from
//!   [`SqliteStore::begin_fenced`]: the transaction starts by checking and raising the
//!   resource's watermark, then runs whatever you run, and commits only what you commit;
//!   or in your own write transaction ([`SqliteStore::begin`], or a pool of yours through
//!   [`SqliteStore::from_pool`]) with [`SqliteStore::check_fence_in`], or the incident's
//!   single-row statement on a row with a fence column, [`SqliteStore::update_row_fenced_in`].
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use palisade_core::{ErrorKind, LockOptions, LockServiceExt, ResourceKey};
//! use palisade_sqlite::{SqliteLockService, SqliteStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> palisade_core::Result<()> {
//! let store = SqliteStore::connect("sqlite::memory:").await?;
//! let locks = Arc::new(SqliteLockService::new(&store).await?);
//! sqlx::query("CREATE TABLE inventory (sku TEXT PRIMARY KEY, qty INTEGER NOT NULL)")
//!     .execute(store.pool()).await.map_err(palisade_sqlite::map_err)?;
//! sqlx::query("INSERT INTO inventory VALUES ('SKU-1', 10)")
//!     .execute(store.pool()).await.map_err(palisade_sqlite::map_err)?;
//!
//! let wh = ResourceKey::new("alloc", "WH-01")?;
//! let old = locks.lock(&wh, LockOptions::ttl(Duration::from_millis(50)).wait(Duration::from_secs(1))).await?;
//! tokio::time::sleep(Duration::from_millis(100)).await;            // a pause past the TTL
//! let new = locks.lock(&wh, LockOptions::ttl(Duration::from_secs(30)).wait(Duration::from_secs(1))).await?;
//! let mut tx = store.begin_fenced(&new).await?; // checks and raises the watermark
//! sqlx::query("UPDATE inventory SET qty = qty - 1 WHERE sku = 'SKU-1'")
//!     .execute(tx.conn()).await.map_err(palisade_sqlite::map_err)?;
//! tx.commit().await?;
//!
//! // The holder that paused has an older fence: refused before it can run anything.
//! let err = store.begin_fenced(&old).await.unwrap_err();
//! assert!(matches!(err.kind(), ErrorKind::StaleFence { .. }));
//! # Ok(()) }
//! ```
//!
//! ## Durability
//!
//! File databases run with `journal_mode=WAL` and `synchronous=FULL` by default: a committed
//! watermark survives power loss, so a restarted store never forgets a fence it accepted.
//! `?synchronous=normal` trades that for speed (a power cut may lose the last commits, and with
//! them watermarks; a process crash loses nothing).

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

pub use config::{SqliteConfig, Synchronous};
pub use lock::SqliteLockService;
pub use palisade_core::FencedRow;
pub use store::{RowKey, RowWatermark, SqliteStore, map_err};
pub use transaction::{FencedTransaction, WriteTransaction};
