//! What the SQL stores share, generic over the sqlx driver (feature `sql`): the fence column's
//! conversion and the record reads. The PostgreSQL and SQLite stores each bring their own
//! statements and error mapping; the reading of rows is written once, here.

use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row, Type};

use crate::{
    Error, Fence, GrantId, HolderView, Listing, LockView, MAX_LISTED, Record, ResourceKey, Result, WatermarkView,
};

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

/// The watermark of `resource` for `palisade inspect`: `sql` reads one row's `(fence,
/// grant_id)` (`$1`/`?1`: the resource).
pub async fn watermark_view<'c, DB, E>(
    exec: E,
    sql: &str,
    resource: &ResourceKey,
    map_err: MapErr,
) -> Result<Option<WatermarkView>>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments: IntoArguments<DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
    for<'r> Option<Vec<u8>>: Decode<'r, DB> + Type<DB>,
    for<'r> Option<i64>: Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    let row = sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
        .bind(resource.to_string())
        .fetch_optional(exec)
        .await
        .map_err(map_err)?;
    row.map(|row| watermark_at(&row, 0, map_err)).transpose().map(Option::flatten)
}

/// Every watermark whose resource starts with `prefix`, for `palisade inspect`: `sql` reads
/// `(resource, fence, grant_id)` rows in key order (`$1`/`?1`: the prefix, `$2`/`?2`: how
/// many at most). Rows whose resource this version cannot parse are left out.
pub async fn list_watermarks<'c, DB, E>(
    exec: E,
    sql: &str,
    prefix: &str,
    map_err: MapErr,
) -> Result<Listing<(ResourceKey, WatermarkView)>>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments: IntoArguments<DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB>,
    for<'r> Option<Vec<u8>>: Decode<'r, DB> + Type<DB>,
    for<'r> Option<i64>: Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
        .bind(prefix.to_string())
        .bind(i64::try_from(MAX_LISTED + 1).unwrap_or(i64::MAX))
        .fetch_all(exec)
        .await
        .map_err(map_err)?;
    let mut marks = Vec::with_capacity(rows.len());
    for row in &rows {
        let resource: String = row.try_get(0).map_err(map_err)?;
        let Ok(key) = crate::key::parse_any_resource_key(&resource) else { continue };
        if let Some(mark) = watermark_at(row, 1, map_err)? {
            marks.push((key, mark));
        }
    }
    Ok(Listing::of(marks))
}

/// The watermark in columns `first` (fence) and `first + 1` (grant id) of `row`; `None` when
/// the fence is not one.
fn watermark_at<R>(row: &R, first: usize, map_err: MapErr) -> Result<Option<WatermarkView>>
where
    R: Row,
    for<'r> Option<Vec<u8>>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<i64>: Decode<'r, R::Database> + Type<R::Database>,
    usize: ColumnIndex<R>,
{
    let fence = fence_from_column(row.try_get(first).map_err(map_err)?);
    let grant: Option<Vec<u8>> = row.try_get(first + 1).map_err(map_err)?;
    Ok(fence.map(|f| WatermarkView::new(f, grant.as_deref().and_then(GrantId::from_slice))))
}

/// A lock table's row as [`LockView`] shows it, from its first five columns: the last
/// grant's id and fence, the counter (the higher of the fence and a repair's floor), whether
/// the grant is live, and its milliseconds left. A fence of 0 (a row only a repair made) is
/// no fence.
pub fn lock_view_at<R>(key: &ResourceKey, row: &R, map_err: MapErr) -> Result<LockView>
where
    R: Row,
    for<'r> Option<Vec<u8>>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
    usize: ColumnIndex<R>,
{
    let grant: Option<Vec<u8>> = row.try_get(0).map_err(map_err)?;
    let (fence, counter): (i64, i64) = (row.try_get(1).map_err(map_err)?, row.try_get(2).map_err(map_err)?);
    let live: bool = row.try_get(3).map_err(map_err)?;
    let left_ms: i64 = row.try_get(4).map_err(map_err)?;
    let issued = |v: i64| u64::try_from(v).ok().filter(|v| *v > 0).map(Fence::new);
    let view = LockView::free(key.clone()).with_counter(Some(Fence::new(u64::try_from(counter).unwrap_or(0))));
    Ok(match grant.as_deref().and_then(GrantId::from_slice) {
        Some(grant) if live => view.held_by(HolderView::new(
            grant,
            issued(fence),
            Some(std::time::Duration::from_millis(u64::try_from(left_ms).unwrap_or(0))),
        )),
        _ => view,
    })
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
