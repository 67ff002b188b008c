//! For other backends built on plain Redis servers (Palisade's Redlock): the same reading of
//! a server that `palisade inspect` and `palisade doctor` do here, so that every Redis server
//! is listed and judged one way. Application code has no use for it.

use palisade_core::{Check, Result};
use redis::aio::MultiplexedConnection;

/// The eviction and persistence checks of one Redis server (`maxmemory-policy`,
/// `appendonly`, `appendfsync`, `no-appendfsync-on-rewrite`, `save`), as `palisade doctor`
/// judges a Redis lock service's master; `on` ends each check's name (`" on master 2"`).
/// A server that refuses `CONFIG GET` gives warnings that say so.
pub async fn settings_checks(conn: &mut MultiplexedConnection, on: &str) -> Result<Vec<Check>> {
    crate::diagnose::settings(conn, None, on).await
}

/// The keys of one server whose names start with `prefix` (taken literally), walked with
/// `SCAN`: the names, and whether the walk ended (`false`: it stopped once more than
/// [`MAX_LISTED`](palisade_core::MAX_LISTED) were found).
pub async fn keys_starting_with(conn: &mut MultiplexedConnection, prefix: &str) -> Result<(Vec<String>, bool)> {
    let mut names = Vec::new();
    let complete =
        crate::inspect::scan(conn, None, &format!("{}*", crate::inspect::glob_escape(prefix)), &mut names).await?;
    Ok((names, complete))
}
