//! The fix's single-statement fenced write on a row of the application's own table.
//!
//! SQL stores run the statement with their driver (`update_row_fenced`); what it says, and
//! what zero affected rows mean, is written once here.

use crate::error::{Error, ErrorKind, Result};
use crate::store::quote_sql_identifier;
use crate::{Fence, metrics};

/// A row of your own table that carries its own fence column: where a store's
/// `update_row_fenced` writes (`palisade_postgres::PostgresStore::update_row_fenced`,
/// `palisade_sqlite::SqliteStore::update_row_fenced`).
///
/// ```sql
/// CREATE TABLE inventory (sku TEXT PRIMARY KEY, qty BIGINT NOT NULL, fence BIGINT);
/// ```
///
/// is `FencedRow { table: "inventory", key_column: "sku", fence_column: "fence" }`. A NULL
/// fence means the row was never written under a fence (any fence may write it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FencedRow<'a> {
    /// Your table.
    pub table: &'a str,
    /// Its key column (any type the store's driver binds).
    pub key_column: &'a str,
    /// Its fence column (`BIGINT`, or `INTEGER` on SQLite).
    pub fence_column: &'a str,
}

impl FencedRow<'_> {
    /// The statement: `UPDATE {table} SET {set}, {fence} = $1 WHERE {key} = $2 AND ({fence}
    /// IS NULL OR {fence} <= $1)`, identifiers checked and quoted (an invalid one is
    /// [`ErrorKind::InvalidConfig`]). `$1` is the fence, `$2` the key, `set`'s own
    /// placeholders start at `$3` (PostgreSQL and SQLite both read `$N`).
    pub fn update_sql(&self, backend: &'static str, set: &str) -> Result<String> {
        let (t, k, f) = self.quoted(backend)?;
        Ok(format!("UPDATE {t} SET {set}, {f} = $1 WHERE {k} = $2 AND ({f} IS NULL OR {f} <= $1)"))
    }

    /// The query that reads the row's fence (`$1`: the key), to explain zero affected rows.
    pub fn fence_sql(&self, backend: &'static str) -> Result<String> {
        let (t, k, f) = self.quoted(backend)?;
        Ok(format!("SELECT {f} FROM {t} WHERE {k} = $1"))
    }

    /// Why the update changed no row, from the row's fence as [`fence_sql`](Self::fence_sql)
    /// read it (`None`: no such row; `Some(None)`: a NULL fence): a row with a higher fence is
    /// [`ErrorKind::StaleFence`] (counted in `palisade_lock_fence_rejected_total`), a missing
    /// row [`ErrorKind::InvalidArgument`]. `key` is for the message.
    pub fn refusal(
        &self,
        backend: &'static str,
        key: &dyn std::fmt::Debug,
        presented: Fence,
        current: Option<Option<Fence>>,
    ) -> Error {
        match current {
            Some(current) => {
                metrics::record_fence_rejected(backend);
                Error::stale_fence(backend, presented, current.unwrap_or_default())
            }
            None => Error::new(
                ErrorKind::InvalidArgument,
                backend,
                format!("no row with {} = {key:?} in {}", self.key_column, self.table),
            ),
        }
    }

    fn quoted(&self, backend: &'static str) -> Result<(String, String, String)> {
        Ok((
            quote_sql_identifier(backend, self.table)?,
            quote_sql_identifier(backend, self.key_column)?,
            quote_sql_identifier(backend, self.fence_column)?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_quote_identifiers_and_refuse_bad_ones() {
        let row = FencedRow { table: "inventory", key_column: "sku", fence_column: "fence" };
        assert_eq!(
            row.update_sql("t", "qty = qty - $3").unwrap(),
            "UPDATE \"inventory\" SET qty = qty - $3, \"fence\" = $1 WHERE \"sku\" = $2 AND (\"fence\" IS NULL OR \"fence\" <= $1)"
        );
        assert_eq!(row.fence_sql("t").unwrap(), "SELECT \"fence\" FROM \"inventory\" WHERE \"sku\" = $1");
        let bad = FencedRow { table: "inventory; DROP TABLE x", ..row };
        assert_eq!(bad.update_sql("t", "qty = 1").unwrap_err().kind(), ErrorKind::InvalidConfig);
    }

    #[test]
    fn zero_rows_are_explained() {
        let row = FencedRow { table: "inventory", key_column: "sku", fence_column: "fence" };
        let stale = row.refusal("t", &"S1", Fence::new(4), Some(Some(Fence::new(5))));
        assert_eq!(stale.kind(), ErrorKind::StaleFence { presented: Fence::new(4), current: Fence::new(5) });
        let missing = row.refusal("t", &7_i64, Fence::new(4), None);
        assert_eq!(missing.kind(), ErrorKind::InvalidArgument);
        assert!(missing.to_string().contains("sku = 7"), "{missing}");
    }
}
