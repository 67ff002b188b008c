//! The lock table: its schema and every statement on it. The lock service issues grants from it
//! and the store's live-lock check (`require_live_lock`) reads it, so both stand on this module
//! and neither on the other.

use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::SqliteConnection;

use crate::db::map_err;

/// One row per resource ever locked; the row (and with it the fence counter) stays after
/// release and expiry, so fences never go back. `owner` is the holder's grant id (what a
/// store sees of a grant), so a store in the same file can check that a writer's lock is live.
/// `fence` is the last grant's (what extend, release and the live-lock check match);
/// `fence_floor` is where a repair moved the counter (`advance_fence`): the next grant's fence
/// is above both, and a repair never touches the holder's fence.
const CREATE_LOCKS: &str = "CREATE TABLE IF NOT EXISTS palisade_locks (\
     resource TEXT PRIMARY KEY NOT NULL, owner BLOB, expires_at_ms INTEGER NOT NULL, fence INTEGER NOT NULL, \
     fence_floor INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID";

/// Creates the lock table if missing, and adds the columns later versions added. Runs inside
/// the caller's write transaction.
pub(crate) async fn migrate(conn: &mut SqliteConnection) -> palisade_core::Result<()> {
    sqlx::query(CREATE_LOCKS).execute(&mut *conn).await.map_err(map_err)?;
    let has_floor: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pragma_table_info('palisade_locks') WHERE name = 'fence_floor'")
            .fetch_one(&mut *conn)
            .await
            .map_err(map_err)?;
    if has_floor == 0 {
        sqlx::query("ALTER TABLE palisade_locks ADD COLUMN fence_floor INTEGER NOT NULL DEFAULT 0")
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
    }
    Ok(())
}

/// The store's live-lock check (`require_live_lock`): the row shows this grant, unexpired.
pub(crate) const LIVE: &str =
    "SELECT 1 FROM palisade_locks WHERE resource = ?1 AND owner = ?2 AND fence = ?3 AND expires_at_ms > ?4";

/// The lock's current fence and grant, to explain a refused write.
pub(crate) const LOCK_ROW: &str = "SELECT fence, owner FROM palisade_locks WHERE resource = ?1";

/// Takes a free or expired lock and issues the next fence, in one statement: no row comes back
/// when somebody else holds it.
pub(crate) const ACQUIRE: &str = "INSERT INTO palisade_locks (resource, owner, expires_at_ms, fence) VALUES (?1, ?2, ?3 + ?4, 1) \
     ON CONFLICT (resource) DO UPDATE SET owner = excluded.owner, expires_at_ms = excluded.expires_at_ms, \
     fence = max(palisade_locks.fence, palisade_locks.fence_floor) + 1 \
     WHERE palisade_locks.owner IS NULL OR palisade_locks.expires_at_ms <= ?3 \
     RETURNING fence";

/// Extends the grant (`?1` resource, `?2` grant id, `?3` now, `?4` TTL, `?5` fence).
pub(crate) const EXTEND: &str = "UPDATE palisade_locks SET expires_at_ms = ?3 + ?4 \
     WHERE resource = ?1 AND owner = ?2 AND fence = ?5 AND expires_at_ms > ?3";

/// Releases the grant (as [`EXTEND`]): the row and its counter stay.
pub(crate) const RELEASE: &str = "UPDATE palisade_locks SET owner = NULL, expires_at_ms = 0 \
     WHERE resource = ?1 AND owner = ?2 AND fence = ?5 AND expires_at_ms > ?3";

/// Moves the counter's floor (`?2`), never the holder's fence: see [`CREATE_LOCKS`].
pub(crate) const ADVANCE: &str = "INSERT INTO palisade_locks (resource, owner, expires_at_ms, fence, fence_floor) \
     VALUES (?1, NULL, 0, 0, ?2) \
     ON CONFLICT (resource) DO UPDATE SET fence_floor = max(palisade_locks.fence_floor, excluded.fence_floor)";

/// Milliseconds since the Unix epoch by the wall clock, the one clock every process on the
/// machine shares.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
