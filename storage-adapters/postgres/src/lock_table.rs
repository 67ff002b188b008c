//! The lock table: its schema and every statement that reads or writes it. The lock service
//! issues grants from it and the store's live-lock check (`require_live_lock`) reads it, so
//! both stand on this module and neither on the other.
//!
//! Row locks are what keeps the two live together:
//! - A fenced write that requires a live lock takes the lock's row `FOR KEY SHARE` until its
//!   transaction ends. That conflicts only with `FOR UPDATE`.
//! - A grant takes the row `FOR UPDATE SKIP LOCKED` before it may replace the holder: while
//!   any fenced transaction of the old holder is open the row reads as held, so nobody is
//!   granted the lock before that transaction has ended, and nobody waits for it inside a
//!   statement either (an acquire answers at once; the waiter's own wait decides how long).
//! - Extend, release and the counter's repair change no key column, so they take the weaker
//!   `FOR NO KEY UPDATE`, which a `KEY SHARE` does not block: the holder can renew and release
//!   while its own fenced transaction is open.

use std::sync::Arc;

use palisade_core::Result;

use crate::db::{add_column_sql, quote_ident};

/// The DDL of the lock table `table` (idempotent, with the columns later versions added).
pub(crate) fn schema_sql(table: &str) -> Result<String> {
    let l = quote_ident(table)?;
    Ok(format!(
        "CREATE TABLE IF NOT EXISTS {l} (resource TEXT PRIMARY KEY, grant_id BYTEA, \
         expires_at TIMESTAMPTZ NOT NULL, fence BIGINT NOT NULL, waiting BOOLEAN NOT NULL DEFAULT false, \
         fence_floor BIGINT NOT NULL DEFAULT 0);\n{}\n{}",
        add_column_sql(&l, "waiting", "BOOLEAN NOT NULL DEFAULT false"),
        add_column_sql(&l, "fence_floor", "BIGINT NOT NULL DEFAULT 0"),
    ))
}

/// The store's live-lock check around a call of the batch function `apply` (`$1` resource,
/// `$2` fence, `$3` grant): the function runs only if the row shows this grant and fence,
/// unexpired, and the row stays locked `FOR KEY SHARE` until the transaction ends. Returns
/// how many times it ran (0 or 1) and the row's fence and grant, to say why when refused.
pub(crate) fn live_check_sql(table: &str, apply: &str, extra: &str) -> Result<String> {
    let l = quote_ident(table)?;
    // MATERIALIZED: the lock row is locked before the function runs, never after.
    Ok(format!(
        "WITH held AS MATERIALIZED (SELECT 1 FROM {l} WHERE resource = $1 AND grant_id = $3 AND fence = $2 \
         AND expires_at > clock_timestamp() FOR KEY SHARE), applied AS MATERIALIZED (SELECT {apply} FROM held) \
         SELECT (SELECT count(*) FROM applied), l.fence, l.grant_id{extra} \
         FROM (SELECT 1) AS one LEFT JOIN {l} AS l ON l.resource = $1"
    ))
}

/// The lock service's statements on one lock table.
#[derive(Debug)]
pub(crate) struct LockStatements {
    pub(crate) schema: String,
    /// The channel releases are announced on (the table's name), payload the resource.
    pub(crate) channel: String,
    // Shared, not copied, into every query (the hot path).
    /// The take-over of an existing free row alone: the common case, sent first.
    pub(crate) take: Arc<str>,
    /// Every case: inserts a new row, answers a resend, reports a holder, marks a waiter.
    pub(crate) acquire: Arc<str>,
    /// The take-over of a set whose rows all exist and are free, nothing else: sent first.
    /// One statement per set size, built at its first use ([`LockStatements::take_all`]).
    take_all: std::sync::Mutex<Vec<Option<Arc<str>>>>,
    /// The lock table's quoted name.
    table: String,
    /// The lock table's name, unquoted (what the catalogue shows).
    pub(crate) name: String,
    /// A set of resources (`$1`) under one grant id each (`$2`), all or nothing.
    pub(crate) acquire_all: Arc<str>,
    pub(crate) extend: Arc<str>,
    pub(crate) release: Arc<str>,
    /// Release by grant id alone: clean-up after an acquire whose outcome is unknown.
    pub(crate) release_grant: Arc<str>,
    pub(crate) advance: Arc<str>,
    /// `palisade inspect`'s read of one lock (`$1` resource), changing nothing: the last
    /// grant's id and fence, the counter, whether the grant is live, its milliseconds left,
    /// and the waiters' mark.
    pub(crate) view: Arc<str>,
    /// `palisade inspect`'s listing: the resources starting with `$1`, in byte order, at most `$2`.
    pub(crate) list: Arc<str>,
}

impl LockStatements {
    pub(crate) fn new(table: &str) -> Result<Self> {
        let l = quote_ident(table)?;
        let ms = "$3::float8 * interval '1 millisecond'";
        let live = "grant_id IS NOT NULL AND expires_at > clock_timestamp()";
        Ok(LockStatements {
            schema: schema_sql(table)?,
            channel: table.to_string(),
            // The take-over of a row that exists and is free or expired, nothing else: what an
            // acquire of a known resource nobody holds needs, at a fraction of the server's cost
            // of `acquire` below, which evaluates every case in one statement (PostgreSQL runs
            // every part of a `WITH`; `docs/benchmarks/postgres-server-cost.md`). No row back: anything else (no row,
            // held, locked by a fenced transaction, a resend of a grant made), which `acquire`
            // then answers. The row is locked `FOR UPDATE SKIP LOCKED` first, as there, so the
            // statement never waits; the update rechecks the row's latest version.
            take: format!(
                "UPDATE {l} AS l SET grant_id = $2, expires_at = clock_timestamp() + {ms}, \
                 fence = greatest(l.fence, l.fence_floor) + 1, waiting = false \
                 WHERE l.resource = $1 AND (l.grant_id IS NULL OR l.expires_at <= clock_timestamp()) \
                 AND l.resource = (SELECT resource FROM {l} WHERE resource = $1 \
                 AND (grant_id IS NULL OR expires_at <= clock_timestamp()) FOR UPDATE SKIP LOCKED) \
                 RETURNING l.fence"
            )
            .into(),
            // Takes a free or expired lock and issues the next fence (above the repair's
            // floor); otherwise no fence, the holder's time left (a hint for the waiter), and
            // whether a transaction keeps the row locked (a live-lock write of the last holder
            // still open: held until it ends, however long ago the lock expired).
            // - Idempotent per grant (`$2`): a row that already shows this grant answers with
            //   its fence, so a request resent after its reply was lost gets the grant it made.
            // - A lock the statement's snapshot shows held is answered from the read alone, and
            //   an existing row is taken over only once locked `FOR UPDATE SKIP LOCKED` (the
            //   update then owns the row lock it needs): the statement never waits for a fenced
            //   transaction (a `KEY SHARE` makes the row read as locked, hence held), nor for
            //   the holder's release (a woken waiter that loses the race does not queue).
            // - A row missing from the snapshot is only ever inserted, never taken over: when
            //   another acquire inserted it meanwhile the insert does nothing, and the caller
            //   looks again (an `ON CONFLICT DO UPDATE` would lock the row `FOR NO KEY UPDATE`,
            //   which a fenced transaction's `KEY SHARE` does not block).
            // - Only a row the snapshot shows free is taken over, so the take-over and the
            //   waiter's mark never update one row twice in one statement.
            // - A waiter (`$4`) that finds it held marks the row `waiting`, once, so that its
            //   release sends a `NOTIFY`; a grant clears the mark (the waiters still waiting set
            //   it again on their next attempt, which the release that made the grant possible
            //   woke them for).
            acquire: format!(
                "WITH cur AS (SELECT grant_id, fence, expires_at, waiting, {live} AS live FROM {l} WHERE resource = $1), \
                 held AS (SELECT expires_at, waiting FROM cur WHERE live AND grant_id <> $2), \
                 free AS (SELECT 1 FROM {l} WHERE resource = $1 AND (grant_id IS NULL OR expires_at <= clock_timestamp()) \
                 FOR UPDATE SKIP LOCKED), \
                 inserted AS (INSERT INTO {l} (resource, grant_id, expires_at, fence) \
                 SELECT $1, $2, clock_timestamp() + {ms}, 1 WHERE NOT EXISTS (SELECT 1 FROM cur) \
                 ON CONFLICT (resource) DO NOTHING RETURNING fence), \
                 updated AS (UPDATE {l} AS l SET grant_id = $2, expires_at = clock_timestamp() + {ms}, \
                 fence = greatest(l.fence, l.fence_floor) + 1, waiting = false \
                 WHERE l.resource = $1 AND NOT EXISTS (SELECT 1 FROM cur WHERE live) AND EXISTS (SELECT 1 FROM free) \
                 AND (l.grant_id IS NULL OR l.expires_at <= clock_timestamp()) RETURNING l.fence), \
                 marked AS (UPDATE {l} SET waiting = true WHERE resource = $1 AND $4 AND NOT waiting \
                 AND EXISTS (SELECT 1 FROM held WHERE NOT held.waiting)) \
                 SELECT coalesce((SELECT fence FROM inserted), (SELECT fence FROM updated), \
                 (SELECT fence FROM cur WHERE live AND grant_id = $2)) AS fence, \
                 (SELECT greatest(0, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000))::BIGINT FROM held) AS left_ms, \
                 EXISTS (SELECT 1 FROM cur WHERE NOT live) AND NOT EXISTS (SELECT 1 FROM free) AS locked"
            )
            .into(),
            take_all: std::sync::Mutex::new(Vec::new()),
            table: l.clone(),
            name: table.to_string(),
            // `acquire` for a set (`$1` resources, `$2` their grant ids, `$3` the TTL), in one
            // statement: every row is taken over or inserted only if none of the set is held by
            // another grant or locked by a transaction (`blocked`, whose first index is
            // returned; nothing is written then). Rows already showing their grant are a resend's
            // and answer with their fence, as in `acquire`. Returns the lowest blocked index
            // (counted from 1) or NULL, and the fences in the set's order. A row inserted by
            // another acquire between the snapshot and the insert leaves that member without a
            // fence (the insert does nothing): the caller releases the others, as after a
            // resend that did not end in the grant.
            acquire_all: format!(
                "WITH want AS (SELECT w.resource, w.grant_id, w.ord \
                 FROM unnest($1::text[], $2::bytea[]) WITH ORDINALITY AS w(resource, grant_id, ord)), \
                 free AS (SELECT resource FROM {l} WHERE resource = ANY($1::text[]) \
                 AND (grant_id IS NULL OR expires_at <= clock_timestamp()) FOR UPDATE SKIP LOCKED), \
                 blocked AS (SELECT w.ord FROM want w JOIN {l} AS l ON l.resource = w.resource \
                 WHERE NOT coalesce(l.grant_id = w.grant_id AND l.expires_at > clock_timestamp(), false) \
                 AND l.resource NOT IN (SELECT resource FROM free)), \
                 updated AS (UPDATE {l} AS l SET grant_id = w.grant_id, expires_at = clock_timestamp() + {ms}, \
                 fence = greatest(l.fence, l.fence_floor) + 1, waiting = false FROM want w \
                 WHERE l.resource = w.resource AND NOT EXISTS (SELECT 1 FROM blocked) \
                 AND l.resource IN (SELECT resource FROM free) \
                 AND (l.grant_id IS NULL OR l.expires_at <= clock_timestamp()) RETURNING l.resource, l.fence), \
                 inserted AS (INSERT INTO {l} (resource, grant_id, expires_at, fence) \
                 SELECT w.resource, w.grant_id, clock_timestamp() + {ms}, 1 FROM want w \
                 WHERE NOT EXISTS (SELECT 1 FROM blocked) AND NOT EXISTS (SELECT 1 FROM {l} WHERE resource = w.resource) \
                 ON CONFLICT (resource) DO NOTHING RETURNING resource, fence) \
                 SELECT (SELECT min(ord) FROM blocked) AS blocked, \
                 array(SELECT coalesce(u.fence, i.fence, CASE WHEN l.grant_id = w.grant_id \
                 AND l.expires_at > clock_timestamp() THEN l.fence END) FROM want w \
                 LEFT JOIN updated u ON u.resource = w.resource LEFT JOIN inserted i ON i.resource = w.resource \
                 LEFT JOIN {l} AS l ON l.resource = w.resource ORDER BY w.ord) AS fences"
            )
            .into(),
            extend: format!(
                "UPDATE {l} SET expires_at = clock_timestamp() + {ms} \
                 WHERE resource = $1 AND grant_id = $2 AND fence = $4 AND expires_at > clock_timestamp() RETURNING 1"
            )
            .into(),
            // The notification, only when a waiter marked the row, is delivered when the
            // statement commits: waiters wake to a free row. (PostgreSQL serialises notifying
            // commits, so an uncontended release sends none.) One row back: released.
            // (In `RETURNING`, not a `WITH` around the update, which costs the server more.)
            release: format!(
                "UPDATE {l} SET grant_id = NULL, expires_at = clock_timestamp() \
                 WHERE resource = $1 AND grant_id = $2 AND fence = $4 AND expires_at > clock_timestamp() \
                 RETURNING CASE WHEN waiting THEN pg_notify($3, resource) END"
            )
            .into(),
            release_grant: format!(
                "UPDATE {l} SET grant_id = NULL, expires_at = clock_timestamp() \
                 WHERE resource = $1 AND grant_id = $2 AND expires_at > clock_timestamp() \
                 RETURNING CASE WHEN waiting THEN pg_notify($3, resource) END"
            )
            .into(),
            // The floor, not the fence: the row's fence is its holder's, which extend, release
            // and the live-lock check match, so a repair never strands whoever holds the lock.
            advance: format!(
                "INSERT INTO {l} AS l (resource, grant_id, expires_at, fence, fence_floor) \
                 VALUES ($1, NULL, clock_timestamp(), 0, $2) \
                 ON CONFLICT (resource) DO UPDATE SET fence_floor = greatest(l.fence_floor, EXCLUDED.fence_floor)"
            )
            .into(),
            view: format!(
                "SELECT grant_id, fence, greatest(fence, fence_floor), {live}, \
                 greatest(0, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000))::BIGINT, waiting \
                 FROM {l} WHERE resource = $1"
            )
            .into(),
            list: format!("SELECT resource FROM {l} WHERE starts_with(resource, $1) ORDER BY resource COLLATE \"C\" LIMIT $2")
                .into(),
        })
    }
}

impl LockStatements {
    /// `take` for a set of `n` resources (`$1`‥`$n`, then their grant ids `$n+1`‥`$2n`, then
    /// the TTL): every row taken over only if every one exists, is free or expired, and is
    /// locked here `FOR UPDATE SKIP LOCKED` (the count, an init plan, is evaluated once, before
    /// any row is updated); otherwise no row changes and none comes back, and `acquire_all`
    /// decides. What a set nobody holds needs, at a fraction of `acquire_all`'s cost
    /// (PostgreSQL runs every part of a `WITH`).
    ///
    /// Scalar parameters, one statement per size, not arrays: PostgreSQL plans a statement
    /// with array parameters again at every execution (its generic plan, costed for arrays of
    /// any length, never wins), and the planning cost more than the statement's execution.
    pub(crate) fn take_all(&self, n: usize) -> Result<Arc<str>> {
        let mut built = self.take_all.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(Some(sql)) = built.get(n) {
            return Ok(Arc::clone(sql));
        }
        let l = &self.table;
        let list = |from: usize, cast: &str| (from..from + n).map(|i| format!("${i}::{cast}")).collect::<Vec<_>>();
        let resources = list(1, "text").join(", ");
        let grants = list(1, "text")
            .iter()
            .zip(list(n + 1, "bytea"))
            .map(|(resource, grant)| format!("WHEN {resource} THEN {grant}"))
            .collect::<Vec<_>>()
            .join(" ");
        let ttl = 2 * n + 1;
        let sql: Arc<str> = format!(
            "WITH free AS MATERIALIZED (SELECT resource FROM {l} WHERE resource IN ({resources}) \
             AND (grant_id IS NULL OR expires_at <= clock_timestamp()) FOR UPDATE SKIP LOCKED) \
             UPDATE {l} AS l SET grant_id = CASE l.resource {grants} END, \
             expires_at = clock_timestamp() + ${ttl}::float8 * interval '1 millisecond', \
             fence = greatest(l.fence, l.fence_floor) + 1, waiting = false \
             WHERE l.resource IN (SELECT resource FROM free) AND (SELECT count(*) FROM free) = {n} \
             RETURNING l.resource, l.fence"
        )
        .into();
        if built.len() <= n {
            built.resize(n + 1, None);
        }
        built[n] = Some(Arc::clone(&sql));
        Ok(sql)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::LockStatements;

    /// `pgbench` scripts of the lock service's statements, named by file, with `pgbench`
    /// variables for the parameters (`integration/benches/scripts/postgres-server-cost.sh`
    /// runs them), so the server's cost is measured on exactly what the service sends.
    fn pgbench_scripts() -> Vec<(&'static str, String)> {
        let statements = LockStatements::new("palisade_locks").expect("a valid table name");
        let with = |sql: &str, params: &[&str]| {
            // Highest first: `$1` must not match the start of `$10`.
            params
                .iter()
                .enumerate()
                .rev()
                .fold(sql.to_string(), |sql, (i, var)| sql.replace(&format!("${}", i + 1), var))
        };
        let acquire_params = [":client_id", ":grant", ":ttl", ":waiting"];
        let release = with(&statements.release, &[":client_id", ":grant", ":channel", ":fence"]);
        let script = |what: &str, acquire: &str| {
            format!(
                "-- Generated from storage-adapters/postgres/src/lock_table.rs by its tests\n\
                 -- (PALISADE_BLESS=1 cargo test -p palisade-postgres --lib pgbench): do not edit.\n\
                 -- {what},\n\
                 -- then the release: one uncontended cycle on the client's own resource (its id),\n\
                 -- its row made beforehand. Variables: -D ttl=30000 -D waiting=false -D channel=palisade_locks\n\
                 \\set grant random(1, 1000000000)\n{}\n\\gset\n{release};\n",
                with(acquire, &acquire_params)
            )
        };
        vec![
            ("schema.sql", format!("{}\n", statements.schema)),
            ("palisade.sql", script("The take-over of a free row (an acquire's first statement)", &statements.take)),
            (
                "palisade-full.sql",
                script("The full acquire statement (every acquire's only one before)", &statements.acquire),
            ),
        ]
    }

    #[test]
    fn pgbench_scripts_are_the_services_statements() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/server-cost");
        let bless = std::env::var("PALISADE_BLESS").is_ok_and(|v| v == "1");
        for (name, script) in pgbench_scripts() {
            let path = dir.join(name);
            if bless {
                std::fs::create_dir_all(&dir).expect("the directory");
                std::fs::write(&path, &script).expect("written");
            }
            let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                on_disk == script,
                "{} differs from the service's statements: run `PALISADE_BLESS=1 cargo test -p palisade-postgres --lib pgbench` and commit",
                path.display()
            );
        }
    }
}
