//! The lock table: its schema and every statement on it. The lock service issues grants from it
//! and the store's live-lock check (`require_live_lock`) reads it, so both stand on this module
//! and neither on the other.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::SqliteConnection;

use crate::db::map_err;

/// One row per resource ever locked; the row (and with it the fence counter) stays after
/// release and expiry, so fences never go back. `owner` is the holder's grant id (what a
/// store sees of a grant), so a store in the same file can check that a writer's lock is live.
/// `fence` is the last grant's (what extend, release and the live-lock check match);
/// `fence_floor` is where a repair moved the counter (`advance_fence`): the next grant's fence
/// is above both, and a repair never touches the holder's fence.
///
/// Expiry is on two clocks. `expires_at_ms` is on the wall clock, which every version reads
/// and writes. `boot_id`, `boot_expires_ms` and `boot_paired_ms` put the same expiry on the
/// machine's monotonic clock (milliseconds since boot, in the boot `boot_id` names), which no
/// one steps: a wall clock stepped forward (NTP, an operator, a VM resumed) would otherwise end
/// every hold early, and one stepped back would keep a dead holder's lock. `boot_paired_ms` is
/// the `expires_at_ms` they were written with: a version that knows only the wall clock
/// rewrites `expires_at_ms` and not them, and the mismatch says the monotonic expiry is an old
/// grant's, so that row is judged by the wall clock as that version judges it (see [`live`]).
const CREATE_LOCKS: &str = "CREATE TABLE IF NOT EXISTS palisade_locks (\
     resource TEXT PRIMARY KEY NOT NULL, owner BLOB, expires_at_ms INTEGER NOT NULL, fence INTEGER NOT NULL, \
     fence_floor INTEGER NOT NULL DEFAULT 0, boot_id TEXT, boot_expires_ms INTEGER, boot_paired_ms INTEGER) \
     WITHOUT ROWID";

/// The columns later versions added to the lock table, each with the statement that adds it,
/// in the order they came.
const ADDED_COLUMNS: [(&str, &str); 4] = [
    ("fence_floor", "ALTER TABLE palisade_locks ADD COLUMN fence_floor INTEGER NOT NULL DEFAULT 0"),
    ("boot_id", "ALTER TABLE palisade_locks ADD COLUMN boot_id TEXT"),
    ("boot_expires_ms", "ALTER TABLE palisade_locks ADD COLUMN boot_expires_ms INTEGER"),
    ("boot_paired_ms", "ALTER TABLE palisade_locks ADD COLUMN boot_paired_ms INTEGER"),
];

/// Creates the lock table if missing, and adds the columns later versions added. Runs inside
/// the caller's write transaction.
pub(crate) async fn migrate(conn: &mut SqliteConnection) -> palisade_core::Result<()> {
    sqlx::query(CREATE_LOCKS).execute(&mut *conn).await.map_err(map_err)?;
    let columns: Vec<String> = sqlx::query_scalar("SELECT name FROM pragma_table_info('palisade_locks')")
        .fetch_all(&mut *conn)
        .await
        .map_err(map_err)?;
    for (column, add) in ADDED_COLUMNS {
        if !columns.iter().any(|c| c == column) {
            sqlx::query(add).execute(&mut *conn).await.map_err(map_err)?;
        }
    }
    Ok(())
}

/// The condition "the row's grant has not expired", as SQL over the row's columns (`$t.`:
/// the table's name or alias), with the parameters that hold the wall clock's now, this boot's
/// id and the monotonic now. A row whose monotonic expiry was written with its wall expiry, by
/// a process that knew its boot, is judged by the monotonic clock (a row from another boot is
/// expired: its holders died with that boot); any other row, by the wall clock.
macro_rules! live {
    ($t:literal, $wall:literal, $boot:literal, $mono:literal) => {
        concat!(
            "(CASE WHEN ",
            $t,
            ".boot_id IS NOT NULL AND ",
            $boot,
            " IS NOT NULL AND ",
            $t,
            ".boot_paired_ms = ",
            $t,
            ".expires_at_ms THEN ",
            $t,
            ".boot_id = ",
            $boot,
            " AND ",
            $t,
            ".boot_expires_ms > ",
            $mono,
            " ELSE ",
            $t,
            ".expires_at_ms > ",
            $wall,
            " END)"
        )
    };
}

/// The store's live-lock check (`require_live_lock`): the row shows this grant, unexpired
/// (`?1` resource, `?2` grant id, `?3` fence, `?4` wall now, `?5` boot id, `?6` monotonic now).
pub(crate) const LIVE: &str = concat!(
    "SELECT 1 FROM palisade_locks WHERE resource = ?1 AND owner = ?2 AND fence = ?3 AND ",
    live!("palisade_locks", "?4", "?5", "?6")
);

/// The lock's current fence and grant, to explain a refused write.
pub(crate) const LOCK_ROW: &str = "SELECT fence, owner FROM palisade_locks WHERE resource = ?1";

/// Takes a free or expired lock and issues the next fence, in one statement: no row comes back
/// when somebody else holds it (`?1` resource, `?2` grant id, `?3` wall now, `?4` TTL, `?5`
/// boot id, `?6` monotonic now).
pub(crate) const ACQUIRE: &str = concat!(
    "INSERT INTO palisade_locks (resource, owner, expires_at_ms, fence, boot_id, boot_expires_ms, boot_paired_ms) \
     VALUES (?1, ?2, ?3 + ?4, 1, ?5, ?6 + ?4, ?3 + ?4) \
     ON CONFLICT (resource) DO UPDATE SET owner = excluded.owner, expires_at_ms = excluded.expires_at_ms, \
     boot_id = excluded.boot_id, boot_expires_ms = excluded.boot_expires_ms, boot_paired_ms = excluded.boot_paired_ms, \
     fence = max(palisade_locks.fence, palisade_locks.fence_floor) + 1 \
     WHERE palisade_locks.owner IS NULL OR NOT ",
    live!("palisade_locks", "?3", "?5", "?6"),
    " RETURNING fence"
);

/// Extends the grant (`?1` resource, `?2` grant id, `?3` wall now, `?4` TTL, `?5` fence, `?6`
/// boot id, `?7` monotonic now).
pub(crate) const EXTEND: &str = concat!(
    "UPDATE palisade_locks SET expires_at_ms = ?3 + ?4, boot_id = ?6, boot_expires_ms = ?7 + ?4, \
     boot_paired_ms = ?3 + ?4 WHERE resource = ?1 AND owner = ?2 AND fence = ?5 AND ",
    live!("palisade_locks", "?3", "?6", "?7")
);

/// Releases the grant (as [`EXTEND`]): the row and its counter stay.
pub(crate) const RELEASE: &str = concat!(
    "UPDATE palisade_locks SET owner = NULL, expires_at_ms = 0 \
     WHERE resource = ?1 AND owner = ?2 AND fence = ?5 AND ",
    live!("palisade_locks", "?3", "?6", "?7")
);

/// One lock as `palisade inspect` shows it, read only (`?1` resource, `?2` wall now, `?3` boot
/// id, `?4` monotonic now): the last grant's id and fence, the counter (the next grant's
/// fence is above it), whether the grant is live, and its milliseconds left on the clock its
/// expiry is judged by.
pub(crate) const VIEW: &str = concat!(
    "SELECT owner, fence, max(fence, fence_floor), ",
    live!("l", "?2", "?3", "?4"),
    ", CASE WHEN l.boot_id IS NOT NULL AND ?3 IS NOT NULL AND l.boot_paired_ms = l.expires_at_ms \
     THEN l.boot_expires_ms - ?4 ELSE l.expires_at_ms - ?2 END \
     FROM palisade_locks l WHERE resource = ?1"
);

/// The resources whose `domain:id` starts with `?1`, in key order, at most `?2`.
pub(crate) const LIST: &str =
    "SELECT resource FROM palisade_locks WHERE substr(resource, 1, length(?1)) = ?1 ORDER BY resource LIMIT ?2";

/// Moves the counter's floor (`?2`), never the holder's fence: see [`CREATE_LOCKS`].
pub(crate) const ADVANCE: &str = "INSERT INTO palisade_locks (resource, owner, expires_at_ms, fence, fence_floor) \
     VALUES (?1, NULL, 0, 0, ?2) \
     ON CONFLICT (resource) DO UPDATE SET fence_floor = max(palisade_locks.fence_floor, excluded.fence_floor)";

/// Now, on the clocks a lock's expiry is judged by: what the statements above bind.
#[derive(Debug, Clone)]
pub(crate) struct Now {
    /// Milliseconds since the Unix epoch by the wall clock.
    pub(crate) wall_ms: i64,
    /// This boot's id and the monotonic clock's milliseconds in it, where the machine tells
    /// them (Linux); elsewhere `None`, and expiry is judged by the wall clock alone.
    pub(crate) boot: Option<(&'static str, i64)>,
}

impl Now {
    /// The clocks, read now.
    pub(crate) fn read() -> Now {
        let wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        // The planted bug (test fixtures only) is this service before it knew the boot: every
        // expiry on the wall clock.
        if palisade_core::spi::planted_bug("sqlite-lock-judged-by-wall-clock") {
            return Now { wall_ms, boot: None };
        }
        Now { wall_ms, boot: boot_id().zip(monotonic_ms()) }
    }

    /// This boot's id, for binding (`None`: unknown).
    pub(crate) fn boot_id(&self) -> Option<&'static str> {
        self.boot.map(|(id, _)| id)
    }

    /// The monotonic now, for binding (`None` when the boot is unknown).
    pub(crate) fn monotonic_ms(&self) -> Option<i64> {
        self.boot.map(|(_, ms)| ms)
    }
}

/// The kernel's id of this boot (`/proc/sys/kernel/random/boot_id`): the monotonic clock
/// starts again at each boot, so its readings compare only within one. Every process on the
/// machine reads the same id and the same clock (unless they are in different Linux time
/// namespaces, which shift the monotonic clock: processes sharing a file must share one).
fn boot_id() -> Option<&'static str> {
    static BOOT: OnceLock<Option<String>> = OnceLock::new();
    BOOT.get_or_init(|| std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok().map(|id| id.trim().to_string()))
        .as_deref()
}

/// Milliseconds on `CLOCK_MONOTONIC`, the clock a lease's own `safe_until` is on.
#[cfg(not(unix))]
fn monotonic_ms() -> Option<i64> {
    None
}

/// Milliseconds on `CLOCK_MONOTONIC`, the clock a lease's own `safe_until` is on.
#[cfg(unix)]
#[allow(clippy::useless_conversion)] // `time_t` and `c_long` are narrower than i64 on some targets
fn monotonic_ms() -> Option<i64> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).ok()?;
    i64::try_from(t.tv_sec()).ok()?.checked_mul(1_000)?.checked_add(i64::try_from(t.tv_nsec()).ok()? / 1_000_000)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

    use sqlx::Connection;

    use super::*;

    const HOUR: i64 = 3_600_000;

    async fn table() -> SqliteConnection {
        let mut conn = SqliteConnection::connect("sqlite::memory:").await.unwrap();
        migrate(&mut conn).await.unwrap();
        conn
    }

    /// Takes `resource` for `grant` as a process whose wall clock reads `now.wall_ms`: its fence,
    /// or `None` when the lock is held.
    async fn acquire(conn: &mut SqliteConnection, resource: &str, grant: &[u8], ttl_ms: i64, now: &Now) -> Option<i64> {
        sqlx::query_scalar(ACQUIRE)
            .bind(resource)
            .bind(grant)
            .bind(now.wall_ms)
            .bind(ttl_ms)
            .bind(now.boot_id())
            .bind(now.monotonic_ms())
            .fetch_optional(conn)
            .await
            .unwrap()
    }

    fn shifted(by_ms: i64) -> Now {
        let now = Now::read();
        Now { wall_ms: now.wall_ms + by_ms, ..now }
    }

    #[tokio::test]
    async fn a_wall_clock_stepped_either_way_neither_ends_a_hold_nor_keeps_an_expired_one() {
        let mut conn = table().await;
        assert!(Now::read().boot.is_some(), "this machine tells its boot and its monotonic clock");
        assert_eq!(acquire(&mut conn, "r", b"a", 60_000, &Now::read()).await, Some(1));
        // A process whose wall clock was stepped an hour ahead: the minute's hold is not over.
        assert_eq!(acquire(&mut conn, "r", b"b", 60_000, &shifted(HOUR)).await, None, "a hold ended early");
        // A holder whose lease ran out, judged by a process whose wall clock was stepped an hour
        // back: the lock is free.
        assert_eq!(acquire(&mut conn, "s", b"a", 50, &Now::read()).await, Some(1));
        tokio::time::sleep(std::time::Duration::from_millis(120)).await;
        assert_eq!(acquire(&mut conn, "s", b"b", 60_000, &shifted(-HOUR)).await, Some(2), "an expired hold kept");
    }

    #[tokio::test]
    async fn a_row_written_by_a_version_that_knows_only_the_wall_clock_is_judged_by_it() {
        let mut conn = table().await;
        // A grant of this version, long expired on both clocks…
        assert_eq!(acquire(&mut conn, "r", b"a", 10, &Now::read()).await, Some(1));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        // …then one by an earlier version, which writes the wall expiry only (its statement).
        let wall = Now::read().wall_ms;
        sqlx::query(
            "INSERT INTO palisade_locks (resource, owner, expires_at_ms, fence) VALUES (?1, ?2, ?3 + ?4, 1) \
             ON CONFLICT (resource) DO UPDATE SET owner = excluded.owner, expires_at_ms = excluded.expires_at_ms, \
             fence = max(palisade_locks.fence, palisade_locks.fence_floor) + 1 \
             WHERE palisade_locks.owner IS NULL OR palisade_locks.expires_at_ms <= ?3",
        )
        .bind("r")
        .bind(b"old".as_slice())
        .bind(wall)
        .bind(60_000)
        .execute(&mut conn)
        .await
        .unwrap();
        // The monotonic expiry left from the first grant does not free the earlier version's.
        assert_eq!(acquire(&mut conn, "r", b"b", 60_000, &Now::read()).await, None);
        // A row from another boot is expired: its holders died with that boot.
        sqlx::query("UPDATE palisade_locks SET boot_id = 'another boot', boot_paired_ms = expires_at_ms")
            .execute(&mut conn)
            .await
            .unwrap();
        assert_eq!(acquire(&mut conn, "r", b"b", 60_000, &Now::read()).await, Some(3));
    }

    #[tokio::test]
    async fn a_table_of_an_earlier_version_gains_the_columns_it_lacks_and_keeps_its_rows() {
        let mut conn = SqliteConnection::connect("sqlite::memory:").await.unwrap();
        sqlx::query(
            "CREATE TABLE palisade_locks (resource TEXT PRIMARY KEY NOT NULL, owner BLOB, \
             expires_at_ms INTEGER NOT NULL, fence INTEGER NOT NULL) WITHOUT ROWID",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        sqlx::query("INSERT INTO palisade_locks VALUES ('r', NULL, 0, 7)").execute(&mut conn).await.unwrap();
        migrate(&mut conn).await.unwrap();
        migrate(&mut conn).await.unwrap();
        let columns: Vec<String> = sqlx::query_scalar("SELECT name FROM pragma_table_info('palisade_locks')")
            .fetch_all(&mut conn)
            .await
            .unwrap();
        for (column, _) in ADDED_COLUMNS {
            assert!(columns.iter().any(|c| c == column), "{column} added: {columns:?}");
        }
        assert_eq!(acquire(&mut conn, "r", b"a", 60_000, &Now::read()).await, Some(8), "the counter kept");
    }
}
