//! Connection settings for the SQLite store.

use std::path::PathBuf;
use std::time::Duration;

use palisade_core::{Error, ErrorKind, Result};

use crate::db::BACKEND;

/// How hard SQLite syncs commits to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Sync every commit (survives power loss). The default.
    #[default]
    Full,
    /// Sync at checkpoints only (survives process crashes, not power loss).
    Normal,
    /// Never sync (tests and throwaway simulations only).
    Off,
}

/// Where and how to open the store.
#[derive(Clone)]
pub struct SqliteConfig {
    /// The database file, or `None` for a private in-memory database.
    pub path: Option<PathBuf>,
    /// Commit durability. Default: [`Synchronous::Full`].
    pub synchronous: Synchronous,
    /// Whether opening creates a missing database file (URL `mode=rwc`, the default) or refuses
    /// it with [`ErrorKind::InvalidConfig`] (`mode=rw`). Default: `true`.
    pub create_if_missing: bool,
    /// How long a writer waits for another writer's transaction. Default: 5 s.
    pub busy_timeout: Duration,
    /// Pool size (forced to 1 for in-memory databases, which live in one connection). Default: 8.
    pub max_connections: u32,
    /// The watermark table. Default: `palisade_fences`.
    pub fences_table: String,
    /// The record table. Default: `palisade_records`.
    pub records_table: String,
    /// Every fenced write also requires the writer's lock to be live in this file's
    /// [`SqliteLockService`](crate::SqliteLockService): its row must show the writer's grant
    /// and fence, unexpired, checked inside the write's transaction, which holds SQLite's write
    /// lock until it commits, so nobody can be granted the lock in between. A write that fails
    /// it is [`ErrorKind::StaleFence`] when a newer grant took the lock, [`ErrorKind::NotHolder`]
    /// otherwise (expired with nobody after it, or not from this file's lock service); nothing
    /// written. Applies to the record API, `begin_fenced` and `check_fence_in`; the single-row
    /// helpers check only the row's own fence. URL: `&require_live_lock=true`. Default: false.
    pub require_live_lock: bool,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        SqliteConfig {
            path: None,
            synchronous: Synchronous::Full,
            create_if_missing: true,
            busy_timeout: Duration::from_secs(5),
            max_connections: 8,
            fences_table: "palisade_fences".into(),
            records_table: "palisade_records".into(),
            require_live_lock: false,
        }
    }
}

impl SqliteConfig {
    /// Parses `sqlite::memory:`, `sqlite://PATH` or `sqlite:PATH`, with optional
    /// `?synchronous=full|normal|off`, `&busy_timeout_ms=N` and `&mode=rwc|rw` (`rw`: the file
    /// must exist).
    pub fn from_url(url: &str) -> Result<Self> {
        let invalid = |why: String| Err(Error::new(ErrorKind::InvalidConfig, BACKEND, why));
        let Some(rest) = url.strip_prefix("sqlite:") else {
            return invalid("a SQLite URL starts with `sqlite:`".into());
        };
        let rest = rest.strip_prefix("//").unwrap_or(rest);
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut config = SqliteConfig::default();
        if path.is_empty() {
            return invalid("the SQLite URL has no path (use sqlite::memory: for an in-memory store)".into());
        }
        if path != ":memory:" {
            config.path = Some(PathBuf::from(path));
        }
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "synchronous" => {
                    config.synchronous = match value.to_ascii_lowercase().as_str() {
                        "full" => Synchronous::Full,
                        "normal" => Synchronous::Normal,
                        "off" => Synchronous::Off,
                        other => return invalid(format!("synchronous={other:?}: use full, normal or off")),
                    }
                }
                "mode" => {
                    config.create_if_missing = match value {
                        "rwc" => true,
                        "rw" => false,
                        other => return invalid(format!("mode={other:?}: use rwc (create if missing) or rw")),
                    }
                }
                "busy_timeout_ms" => match value.parse::<u64>() {
                    Ok(ms) => config.busy_timeout = Duration::from_millis(ms),
                    Err(_) => return invalid(format!("busy_timeout_ms={value:?} is not a whole number")),
                },
                "require_live_lock" => {
                    config.require_live_lock = match value {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        other => return invalid(format!("require_live_lock={other:?}: use true or false")),
                    }
                }
                other => return invalid(format!("unknown SQLite URL parameter {other:?}")),
            }
        }
        Ok(config)
    }
}

impl std::fmt::Debug for SqliteConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteConfig")
            .field("path", &self.path.as_deref().map(shown_path))
            .field("synchronous", &self.synchronous)
            .field("create_if_missing", &self.create_if_missing)
            .field("busy_timeout", &self.busy_timeout)
            .field("max_connections", &self.max_connections)
            .field("fences_table", &self.fences_table)
            .field("records_table", &self.records_table)
            .field("require_live_lock", &self.require_live_lock)
            .finish()
    }
}

/// A database path as logs and errors show it: whole, unless it holds an `@`, which in a
/// `sqlite://user:password@…` URL written by mistake is a password.
pub(crate) fn shown_path(path: &std::path::Path) -> String {
    let text = path.display().to_string();
    if text.contains('@') { "(a path holding an '@', not shown)".to_string() } else { text }
}

/// Checks an identifier and returns it double-quoted.
pub(crate) fn quote_ident(name: &str) -> Result<String> {
    palisade_core::spi::quote_sql_identifier(BACKEND, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_url_forms() {
        assert!(SqliteConfig::from_url("sqlite::memory:").unwrap().path.is_none());
        assert!(SqliteConfig::from_url("sqlite://:memory:").unwrap().path.is_none());
        let c = SqliteConfig::from_url("sqlite://wh.db?synchronous=normal&busy_timeout_ms=50").unwrap();
        assert_eq!(c.path.unwrap(), PathBuf::from("wh.db"));
        assert_eq!(c.synchronous, Synchronous::Normal);
        assert_eq!(c.busy_timeout, Duration::from_millis(50));
        assert_eq!(SqliteConfig::from_url("sqlite:/tmp/x.db").unwrap().path.unwrap(), PathBuf::from("/tmp/x.db"));
        assert!(SqliteConfig::from_url("sqlite://wh.db").unwrap().create_if_missing);
        assert!(!SqliteConfig::from_url("sqlite://wh.db?mode=rw").unwrap().create_if_missing);
        assert!(SqliteConfig::from_url("sqlite://wh.db?require_live_lock=true").unwrap().require_live_lock);
        assert!(!SqliteConfig::from_url("sqlite://wh.db").unwrap().require_live_lock);
        for bad in [
            "postgres://x",
            "sqlite://",
            "sqlite://a?synchronous=maybe",
            "sqlite://a?x=1",
            "sqlite://a?busy_timeout_ms=z",
            "sqlite://a?mode=ro",
            "sqlite://a?require_live_lock=yes",
        ] {
            assert_eq!(SqliteConfig::from_url(bad).unwrap_err().kind(), ErrorKind::InvalidConfig, "{bad}");
        }
    }

    /// SQLite takes no credentials, but a URL given some by mistake never shows them (found by
    /// fuzz/connection_urls: the path was shown whole).
    #[test]
    fn a_path_that_looks_like_user_info_is_not_shown() {
        let c = SqliteConfig::from_url("sqlite://app:s3cret@db.example/app.db").unwrap();
        assert!(!format!("{c:?}").contains("s3cret"), "{c:?}");
        let c = SqliteConfig::from_url("sqlite:/data/wh.db").unwrap();
        assert!(format!("{c:?}").contains("/data/wh.db"), "{c:?}");
    }

    #[test]
    fn quotes_only_plain_identifiers() {
        assert_eq!(quote_ident("palisade_fences").unwrap(), "\"palisade_fences\"");
        for bad in ["", "1abc", "a\"b", "a b", "a;drop", &"x".repeat(64)] {
            assert!(quote_ident(bad).is_err(), "{bad}");
        }
    }
}
