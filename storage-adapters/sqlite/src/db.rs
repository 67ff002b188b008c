//! What every module of this crate stands on: the backend's name and how a driver error becomes
//! a Palisade error, the same for the lock service, the store and the transactions.

use palisade_core::{Error, ErrorKind};

/// The name every error and metric of this crate carries.
pub(crate) const BACKEND: &str = "sqlite";

/// Maps a sqlx error to a Palisade error: busy/locked databases and pool timeouts are
/// [`ErrorKind::Unavailable`] (retryable), everything else [`ErrorKind::Backend`].
pub fn map_err(e: sqlx::Error) -> Error {
    let kind = match &e {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => ErrorKind::Unavailable,
        // SQLITE_BUSY (5) and SQLITE_LOCKED (6), with their extended codes.
        sqlx::Error::Database(db)
            if db.code().and_then(|c| c.parse::<i32>().ok()).is_some_and(|c| matches!(c & 0xff, 5 | 6)) =>
        {
            ErrorKind::Unavailable
        }
        _ => ErrorKind::Backend,
    };
    Error::new(kind, BACKEND, "SQLite operation failed").with_source(e)
}

/// Whether a connection's file name is an in-memory database: `:memory:`, empty, or what sqlx
/// makes of `sqlite::memory:` (`file:sqlx-in-memory-N`, a shared cache). Such a database lives
/// in this process alone.
pub(crate) fn is_in_memory(filename: &std::path::Path) -> bool {
    let name = filename.to_string_lossy();
    name.is_empty() || name == ":memory:" || name.starts_with("file:sqlx-in-memory-") || name.contains("mode=memory")
}

/// Whether `e` is SQLite's "no such table" (a table this file never had, or lost).
pub(crate) fn no_such_table(e: &palisade_core::Error) -> bool {
    std::error::Error::source(e)
        .and_then(|source| source.downcast_ref::<sqlx::Error>())
        .is_some_and(|e| matches!(e, sqlx::Error::Database(db) if db.message().starts_with("no such table")))
}
