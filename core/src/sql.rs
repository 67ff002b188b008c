//! What the SQL stores share, generic over the sqlx driver (feature `sql`): the fence column's
//! conversion and the record reads. The PostgreSQL and SQLite stores each bring their own
//! statements and error mapping; the reading of rows is written once, here.

use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row, Type};

use crate::{Error, Fence, Record, ResourceKey, Result};

/// A fence column read back: NULL (never written under a fence) or a value that is not a fence
/// (negative) is `None`.
pub fn fence_from_column(v: Option<i64>) -> Option<Fence> {
    v.and_then(|v| u64::try_from(v).ok()).map(Fence::new)
}

/// Maps a driver error to a Palisade error (each store's own `map_err`).
pub type MapErr = fn(sqlx::Error) -> Error;

/// The watermark of `resource`: `sql` reads one row's fence (`$1`/`?1`: the resource).
pub async fn read_watermark<'c, DB, E>(
    exec: E,
    sql: &str,
    resource: &ResourceKey,
    map_err: MapErr,
) -> Result<Option<Fence>>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments: IntoArguments<DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
    (Option<i64>,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let v: Option<(Option<i64>,)> = sqlx::query_as(sqlx::AssertSqlSafe(sql.to_string()))
        .bind(resource.to_string())
        .fetch_optional(exec)
        .await
        .map_err(map_err)?;
    Ok(v.and_then(|(v,)| fence_from_column(v)))
}

/// One record: `sql` reads `(value, fence)` of one key.
pub async fn read_record<'c, DB, E>(exec: E, sql: &str, key: &str, map_err: MapErr) -> Result<Option<Record>>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments: IntoArguments<DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
    for<'r> Vec<u8>: Decode<'r, DB> + Type<DB>,
    for<'r> Option<i64>: Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    crate::store::validate_record_key(key)?;
    let row = sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
        .bind(key.to_string())
        .fetch_optional(exec)
        .await
        .map_err(map_err)?;
    row.map(|row| record_at(&row, 0, map_err)).transpose()
}

/// The records whose keys start with `prefix`: `sql` reads `(key, value, fence)` rows.
pub async fn list_records<'c, DB, E>(exec: E, sql: &str, prefix: &str, map_err: MapErr) -> Result<Vec<(String, Record)>>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments: IntoArguments<DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB>,
    for<'r> Vec<u8>: Decode<'r, DB> + Type<DB>,
    for<'r> Option<i64>: Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
        .bind(prefix.to_string())
        .fetch_all(exec)
        .await
        .map_err(map_err)?;
    rows.iter().map(|row| Ok((row.try_get(0).map_err(map_err)?, record_at(row, 1, map_err)?))).collect()
}

/// The record in columns `first` (value) and `first + 1` (fence) of `row`.
pub fn record_at<R>(row: &R, first: usize, map_err: MapErr) -> Result<Record>
where
    R: Row,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<i64>: Decode<'r, R::Database> + Type<R::Database>,
    usize: ColumnIndex<R>,
{
    Ok(Record {
        value: row.try_get(first).map_err(map_err)?,
        fence: fence_from_column(row.try_get(first + 1).map_err(map_err)?),
    })
}
