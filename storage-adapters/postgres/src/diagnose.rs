//! `palisade doctor`'s checks of a PostgreSQL database: durability of commits, the bound on an
//! idle transaction, and the schema of the tables the lock service and the store use. Reads
//! only (`SHOW` and the catalogue).

use async_trait::async_trait;
use palisade_core::{Check, Diagnose, Result, Verdict};
use sqlx::PgPool;

use crate::db::{BACKEND, map_err};
use crate::{PostgresLockService, PostgresStore};

const DURABLE: &str = "an acknowledged grant or write survives a crash";
const LIVE: &str = "a holder that goes silent inside a transaction does not keep its lock for good";
const SCHEMA: &str = "the statements find the columns they read and write";

/// The lock table's columns, as the service's statements use them.
const LOCK_COLUMNS: [&str; 6] = ["resource", "grant_id", "expires_at", "fence", "waiting", "fence_floor"];
const FENCE_COLUMNS: [&str; 3] = ["resource", "fence", "grant_id"];
const RECORD_COLUMNS: [&str; 3] = ["key", "value", "fence"];

#[async_trait]
impl Diagnose for PostgresLockService {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn diagnose(&self) -> Result<Vec<Check>> {
        let (pool, table) = self.pool_and_table();
        let mut checks = server_checks(pool).await?;
        checks.push(table_check(pool, table, &LOCK_COLUMNS).await?);
        Ok(checks)
    }
}

#[async_trait]
impl Diagnose for PostgresStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn diagnose(&self) -> Result<Vec<Check>> {
        let mut checks = server_checks(self.pool()).await?;
        let (fences, records) = self.data_tables();
        checks.push(table_check(self.pool(), fences, &FENCE_COLUMNS).await?);
        checks.push(table_check(self.pool(), records, &RECORD_COLUMNS).await?);
        Ok(checks)
    }
}

/// The settings every connection of this database runs with. A setting this role may not
/// read is a warning that says so.
async fn server_checks(pool: &PgPool) -> Result<Vec<Check>> {
    let mut checks = Vec::new();
    for (name, protects) in
        [("fsync", DURABLE), ("synchronous_commit", DURABLE), ("idle_in_transaction_session_timeout", LIVE)]
    {
        let shown: std::result::Result<String, sqlx::Error> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SHOW {name}"))).fetch_one(pool).await;
        let value = match shown {
            Ok(value) => value,
            Err(sqlx::Error::Database(db)) => {
                checks.push(Check::new(
                    name,
                    Verdict::Warn,
                    format!("cannot be read ({}): check it by hand", db.message()),
                    protects,
                ));
                continue;
            }
            Err(e) => return Err(map_err(e)),
        };
        checks.push(judge(name, &value, protects));
    }
    Ok(checks)
}

/// One setting's verdict.
fn judge(name: &'static str, value: &str, protects: &'static str) -> Check {
    match (name, value) {
        ("fsync", "off") => {
            Check::new(name, Verdict::Fail, "off: a crash of the machine can lose or corrupt any commit", protects)
        }
        ("synchronous_commit", "off") => Check::new(
            name,
            Verdict::Fail,
            "off: a crash loses commits already acknowledged, so grants and watermarks go back (fences issued \
             again, stale writes accepted after the restart); use on",
            protects,
        ),
        ("idle_in_transaction_session_timeout", "0") => Check::new(
            name,
            Verdict::Warn,
            "0 (no bound): the fenced transactions Palisade opens bound themselves, but a transaction of your own \
             that holds a lock row (a fenced transaction begun on your connection and left open) keeps the lock \
             until its client comes back; set a bound above your longest transaction",
            protects,
        ),
        _ => Check::new(name, Verdict::Pass, value, protects),
    }
}

/// Whether `table` (in the connection's search path) has `columns`.
async fn table_check(pool: &PgPool, table: &str, columns: &[&str]) -> Result<Check> {
    let found: Vec<String> = sqlx::query_scalar(
        "SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 \
         AND NOT a.attisdropped",
    )
    .bind(crate::db::quote_ident(table)?)
    .fetch_all(pool)
    .await
    .map_err(map_err)?;
    let name = format!("table {table}");
    if found.is_empty() {
        return Ok(Check::new(
            name,
            Verdict::Fail,
            "missing: connect once with migrate on, or run the DDL of PostgresConfig::schema_sql",
            SCHEMA,
        ));
    }
    let missing: Vec<&str> = columns.iter().copied().filter(|c| !found.iter().any(|f| f == c)).collect();
    Ok(if missing.is_empty() {
        Check::new(name, Verdict::Pass, format!("has {}", columns.join(", ")), SCHEMA)
    } else {
        Check::new(
            name,
            Verdict::Fail,
            format!(
                "lacks {}: an older version's table; connect once with migrate on, or run PostgresConfig::schema_sql",
                missing.join(", ")
            ),
            SCHEMA,
        )
    })
}
