-- Generated from storage-adapters/postgres/src/lock_table.rs by its tests
-- (PALISADE_BLESS=1 cargo test -p palisade-postgres --lib pgbench): do not edit.
-- The take-over of a free row (an acquire's first statement),
-- then the release: one uncontended cycle on the client's own resource (its id),
-- its row made beforehand. Variables: -D ttl=30000 -D waiting=false -D channel=palisade_locks
\set grant random(1, 1000000000)
UPDATE "palisade_locks" AS l SET grant_id = :grant, expires_at = clock_timestamp() + :ttl::float8 * interval '1 millisecond', fence = greatest(l.fence, l.fence_floor) + 1, waiting = false WHERE l.resource = :client_id AND (l.grant_id IS NULL OR l.expires_at <= clock_timestamp()) AND l.resource = (SELECT resource FROM "palisade_locks" WHERE resource = :client_id AND (grant_id IS NULL OR expires_at <= clock_timestamp()) FOR UPDATE SKIP LOCKED) RETURNING l.fence
\gset
UPDATE "palisade_locks" SET grant_id = NULL, expires_at = clock_timestamp() WHERE resource = :client_id AND grant_id = :grant AND fence = :fence AND expires_at > clock_timestamp() RETURNING CASE WHEN waiting THEN pg_notify(:channel, resource) END;
