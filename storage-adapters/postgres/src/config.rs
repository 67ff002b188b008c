//! Connection settings and schema.

use std::fmt;
use std::time::Duration;

use palisade_core::Result;

use crate::store::BACKEND;

/// Where and how to connect.
#[derive(Clone)]
pub struct PostgresConfig {
    /// `postgres://user[:password]@host:port/db`.
    pub url: String,
    /// Pool size. Default: 16.
    pub max_connections: u32,
    /// How long to wait for a pooled connection. Default: 10 s.
    pub acquire_timeout: Duration,
    /// The watermark table. Default: `palisade_fences`.
    pub fences_table: String,
    /// The record table. Default: `palisade_records`.
    pub records_table: String,
    /// Create the tables at connect if missing. Default: true.
    pub migrate: bool,
}

impl PostgresConfig {
    /// Settings for `url` with the defaults above.
    pub fn new(url: impl Into<String>) -> Self {
        PostgresConfig {
            url: url.into(),
            max_connections: 16,
            acquire_timeout: Duration::from_secs(10),
            fences_table: "palisade_fences".into(),
            records_table: "palisade_records".into(),
            migrate: true,
        }
    }

    /// The DDL that creates both tables (idempotent), for your own migration tool.
    pub fn schema_sql(&self) -> Result<String> {
        let f = quote_ident(&self.fences_table)?;
        let r = quote_ident(&self.records_table)?;
        Ok(format!(
            "CREATE TABLE IF NOT EXISTS {f} (resource TEXT PRIMARY KEY, fence BIGINT NOT NULL, grant_id BYTEA);\n\
             ALTER TABLE {f} ADD COLUMN IF NOT EXISTS grant_id BYTEA;\n\
             CREATE TABLE IF NOT EXISTS {r} (key TEXT PRIMARY KEY, value BYTEA NOT NULL, fence BIGINT);"
        ))
    }

    /// The URL without its password, for logs and errors.
    pub fn redacted_url(&self) -> String {
        palisade_core::redact_url(&self.url)
    }
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &self.redacted_url())
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("fences_table", &self.fences_table)
            .field("records_table", &self.records_table)
            .field("migrate", &self.migrate)
            .finish()
    }
}

/// Checks an identifier and returns it double-quoted.
pub(crate) fn quote_ident(name: &str) -> Result<String> {
    palisade_core::quote_sql_identifier(BACKEND, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show_and_identifiers_are_checked() {
        let c = PostgresConfig::new("postgres://app:s3cret@db:5432/app?sslmode=require");
        assert_eq!(c.redacted_url(), "postgres://db:5432/app");
        assert!(!format!("{c:?}").contains("s3cret"));
        assert!(c.schema_sql().unwrap().contains("\"palisade_fences\""));
        assert!(quote_ident("x\"; DROP TABLE y; --").is_err());
        assert!(quote_ident("9x").is_err());
    }
}
