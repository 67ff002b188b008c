//! What is being compared: lock services and stores by URL, and what kind each is.

use std::fmt;

/// The lock service behind a URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Memory,
    Redis,
    Redlock,
    Etcd,
    Zookeeper,
    /// The store-native lock services: locks in a table of the database that holds the data.
    Postgres,
    Sqlite,
}

impl Backend {
    pub fn of(url: &str) -> Option<Backend> {
        let scheme = url.split(':').next()?.to_ascii_lowercase();
        Some(match scheme.as_str() {
            "memory" => Backend::Memory,
            "redis" | "rediss" => Backend::Redis,
            "redlock" => Backend::Redlock,
            "etcd" | "etcds" => Backend::Etcd,
            "zk" => Backend::Zookeeper,
            "postgres" | "postgresql" => Backend::Postgres,
            "sqlite" => Backend::Sqlite,
            _ => return None,
        })
    }

    /// What the raw-operation baseline of this backend is.
    pub fn raw_op(self) -> &'static str {
        match self {
            Backend::Memory => "none (in-process)",
            Backend::Redis => "SET NX PX + DEL",
            Backend::Redlock => "SET NX PX + DEL on one master",
            Backend::Etcd => "txn put-if-absent + delete",
            Backend::Zookeeper => "create ephemeral + delete",
            Backend::Postgres => "INSERT … ON CONFLICT DO NOTHING + DELETE of a lock row",
            Backend::Sqlite => "INSERT … ON CONFLICT DO NOTHING + DELETE of a lock row",
        }
    }

    /// Whether this lock service is compared with `store`: a store-native service only with
    /// its own kind of database (its point is one database for locks and data; the other
    /// pairings would say nothing the services' own rows do not).
    pub fn pairs_with(self, store_url: &str) -> bool {
        match self {
            Backend::Postgres => store_url.starts_with("postgres://") || store_url.starts_with("postgresql://"),
            Backend::Sqlite => store_url.starts_with("sqlite:"),
            _ => true,
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Memory => "memory",
            Backend::Redis => "Redis",
            Backend::Redlock => "Redlock",
            Backend::Etcd => "etcd",
            Backend::Zookeeper => "ZooKeeper",
            Backend::Postgres => "PostgreSQL",
            Backend::Sqlite => "SQLite",
        })
    }
}

/// A lock service to compare.
#[derive(Debug, Clone)]
pub struct LockTarget {
    pub label: String,
    pub url: String,
    pub backend: Backend,
}

/// A store to compare.
#[derive(Debug, Clone)]
pub struct StoreTarget {
    pub label: String,
    pub url: String,
}

/// The URL with any password replaced, for the report.
pub fn shown(url: &str) -> String {
    palisade::redact_url(url).replace("<malformed URL>", url.split('@').next_back().unwrap_or(url))
}
