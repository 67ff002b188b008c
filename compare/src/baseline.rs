//! The variants every comparison is made of: Palisade's paths, and each backend's raw
//! operation sent through the same client crate Palisade uses (`redis`, `etcd-client`,
//! `zookeeper-client`), on the same server, with the same keys per slot.

use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade::zookeeper::zookeeper_client as zk;
use palisade::{LockService, LockServiceExt, ResourceKey, Ttl};

use crate::measure::{Handoff, Hook, Plan, Slot, Variant};

fn key(prefix: &str, slot: Slot) -> Result<ResourceKey, String> {
    ResourceKey::new(prefix, format!("t{}k{}", slot.task, slot.key)).map_err(|e| e.to_string())
}

/// Palisade's `try_acquire` + `release` (trait level) on the slot's key under `prefix`.
pub fn service<S>(name: impl Into<String>, svc: Arc<S>, prefix: &str, ttl: Ttl) -> Variant
where
    S: LockService + ?Sized + 'static,
{
    let prefix = format!("{prefix}.svc");
    Variant::new(name, move |slot| {
        let (svc, key) = (Arc::clone(&svc), key(&prefix, slot));
        async move {
            let key = key?;
            let grant = svc.try_acquire(&key, ttl).await.map_err(|e| e.to_string())?;
            let grant = grant.ok_or_else(|| format!("{key} was held"))?;
            svc.release(&grant).await.map_err(|e| e.to_string())
        }
    })
}

/// Palisade's `lock_all` of two keys with a zero wait + `MultiLease::release`: a set taken at
/// once, in one request where the service declares it.
pub fn lock_set<S>(name: impl Into<String>, svc: Arc<S>, prefix: &str, ttl: Ttl) -> Variant
where
    S: LockService + ?Sized + 'static,
{
    let prefix = format!("{prefix}.set");
    Variant::new(name, move |slot| {
        let (svc, pair) = (Arc::clone(&svc), pair(&prefix, slot));
        async move {
            let pair = pair?;
            let set = svc.lock_all(&pair, palisade::LockOptions::ttl(ttl.get())).await.map_err(|e| e.to_string())?;
            set.release().await.map_err(|e| e.to_string())
        }
    })
}

/// The same two keys taken one `try_lock` after the other and released one after the other:
/// what an application without `lock_all` does.
pub fn two_locks<S>(name: impl Into<String>, svc: Arc<S>, prefix: &str, ttl: Ttl) -> Variant
where
    S: LockService + ?Sized + 'static,
{
    let prefix = format!("{prefix}.two");
    Variant::new(name, move |slot| {
        let (svc, pair) = (Arc::clone(&svc), pair(&prefix, slot));
        async move {
            let pair = pair?;
            let first = svc.try_lock(&pair[0], ttl.get()).await.map_err(|e| e.to_string())?;
            let first = first.ok_or_else(|| format!("{} was held", pair[0]))?;
            let second = svc.try_lock(&pair[1], ttl.get()).await.map_err(|e| e.to_string())?;
            let second = second.ok_or_else(|| format!("{} was held", pair[1]))?;
            first.release().await.map_err(|e| e.to_string())?;
            second.release().await.map_err(|e| e.to_string())
        }
    })
}

/// The slot's two keys under `prefix` (a transfer's `from` and `to`).
fn pair(prefix: &str, slot: Slot) -> Result<[ResourceKey; 2], String> {
    let id =
        |side: &str| ResourceKey::new(prefix, format!("t{}k{}{side}", slot.task, slot.key)).map_err(|e| e.to_string());
    Ok([id("a")?, id("b")?])
}

/// Palisade's `try_lock` + `Lease::release` (the application path: lease, watchdog, metrics).
pub fn lease<S>(name: impl Into<String>, svc: Arc<S>, prefix: &str, ttl: Ttl) -> Variant
where
    S: LockService + ?Sized + 'static,
{
    let prefix = format!("{prefix}.lease");
    Variant::new(name, move |slot| {
        let (svc, key) = (Arc::clone(&svc), key(&prefix, slot));
        async move {
            let key = key?;
            let lease = svc.try_lock(&key, ttl.get()).await.map_err(|e| e.to_string())?;
            lease.ok_or_else(|| format!("{key} was held"))?.release().await.map_err(|e| e.to_string())
        }
    })
}

/// Whether an acquire script's reply is a grant: a positive fence (Palisade's: an integer below
/// 2⁵³, a decimal string from there on, and `{0, pttl}` when held; the minimal pair's: 0 when
/// held).
fn granted_fence(reply: &redis::Value) -> bool {
    match reply {
        redis::Value::Int(fence) => *fence > 0,
        redis::Value::BulkString(_) => true,
        _ => false,
    }
}

fn redis_err(e: redis::RedisError) -> String {
    format!("raw redis: {e}")
}

async fn redis_conn(url: &str) -> Result<redis::aio::ConnectionManager, String> {
    let client = redis::Client::open(url).map_err(redis_err)?;
    client.get_connection_manager().await.map_err(redis_err)
}

/// The plain Redis lock: `SET key token NX PX ttl` + `DEL key`, one connection manager (as
/// Palisade's Redis service has).
pub async fn redis_set_nx(name: impl Into<String>, url: &str, prefix: &str) -> Result<Variant, String> {
    let conn = redis_conn(url).await?;
    let prefix = format!("{prefix}:raw");
    Ok(Variant::new(name, move |slot| {
        let mut conn = conn.clone();
        let key = format!("{prefix}:t{}k{}", slot.task, slot.key);
        async move {
            let set: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg("token")
                .arg("NX")
                .arg("PX")
                .arg(30_000)
                .query_async(&mut conn)
                .await
                .map_err(redis_err)?;
            set.ok_or_else(|| format!("{key} was held"))?;
            let _: i64 = redis::cmd("DEL").arg(&key).query_async(&mut conn).await.map_err(redis_err)?;
            Ok(())
        }
    }))
}

/// The least a fenced Redis lock can send: one script that takes the lock with `SET NX PX` and,
/// when it did, returns `INCR` of the fence counter; one compare-and-delete script to release.
/// No resend safety, no exact fences above 2⁵³, no waiters woken: the line Palisade's own
/// scripts are measured against.
pub async fn redis_minimal_fenced(name: impl Into<String>, url: &str, prefix: &str) -> Result<Variant, String> {
    static ACQUIRE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
        redis::Script::new(
            "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then \
             return redis.call('INCR', KEYS[2]) end return 0",
        )
    });
    static RELEASE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
        redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
        )
    });
    script_pair(name, url, &format!("{prefix}.minimal"), ACQUIRE.clone(), RELEASE.clone(), false).await
}

/// Palisade-redis's own acquire and release scripts, sent through the redis crate directly:
/// what the server's script execution costs without any of Palisade's client code.
pub async fn redis_scripts(name: impl Into<String>, url: &str, prefix: &str) -> Result<Variant, String> {
    let (acquire, release) = (palisade::redis::scripts::ACQUIRE.clone(), palisade::redis::scripts::RELEASE.clone());
    script_pair(name, url, &format!("{prefix}.scripts"), acquire, release, true).await
}

/// A cycle of two scripts on one connection manager: `acquire` (KEYS: lock, fence; ARGV:
/// token, ttl ms) and, when it granted, `release` (KEYS: lock; ARGV: token, and the lock's
/// release channel if `channel`).
async fn script_pair(
    name: impl Into<String>,
    url: &str,
    prefix: &str,
    acquire: redis::Script,
    release: redis::Script,
    channel: bool,
) -> Result<Variant, String> {
    let conn = redis_conn(url).await?;
    let prefix = prefix.to_string();
    Ok(Variant::new(name, move |slot| {
        let mut conn = conn.clone();
        let (acquire, release) = (acquire.clone(), release.clone());
        let resource = format!("{prefix}:t{}k{}", slot.task, slot.key);
        async move {
            let (lock, fence) = (format!("lock:{{{resource}}}"), format!("fence:{{{resource}}}"));
            let granted: redis::Value = acquire
                .key(&lock)
                .key(&fence)
                .arg("token")
                .arg(30_000)
                .invoke_async(&mut conn)
                .await
                .map_err(redis_err)?;
            if !granted_fence(&granted) {
                return Err(format!("{lock} was held"));
            }
            let mut release = release.key(&lock);
            release.arg("token");
            if channel {
                release.arg(format!("palisade:released:{lock}"));
            }
            let _: i64 = release.invoke_async(&mut conn).await.map_err(redis_err)?;
            Ok(())
        }
    }))
}

/// The handoff through the raw client: a waiter subscribed to the release channel runs the
/// acquire script when the holder's release script publishes.
pub async fn redis_handoff(name: impl Into<String>, url: &str, prefix: &str) -> Result<Handoff, String> {
    let client = redis::Client::open(url).map_err(redis_err)?;
    let prefix = format!("{prefix}.rawhand");
    Ok(Handoff::new(name, move |n| {
        let (client, prefix) = (client.clone(), prefix.clone());
        async move { raw_handoffs(client, &prefix, n).await }
    }))
}

async fn raw_handoffs(client: redis::Client, prefix: &str, n: usize) -> Result<Vec<Duration>, String> {
    use futures_util::StreamExt;
    let (acquire, release) = (palisade::redis::scripts::ACQUIRE.clone(), palisade::redis::scripts::RELEASE.clone());
    let mut holder = client.get_multiplexed_async_connection().await.map_err(redis_err)?;
    let mut waiter_conn = client.get_multiplexed_async_connection().await.map_err(redis_err)?;
    let (lock, fence) = (format!("lock:{{{prefix}}}"), format!("fence:{{{prefix}}}"));
    let (watched, unwatched) = (format!("palisade:released:{lock}"), format!("palisade:released:{lock}:quiet"));
    let mut pubsub = client.get_async_pubsub().await.map_err(redis_err)?;
    pubsub.subscribe(&watched).await.map_err(redis_err)?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let waiter = {
        let (acquire, lock, fence) = (acquire.clone(), lock.clone(), fence.clone());
        tokio::spawn(async move {
            let mut messages = pubsub.into_on_message();
            for _ in 0..n {
                if messages.next().await.is_none() {
                    return Err("the subscription ended".to_string());
                }
                let granted: redis::Value = acquire
                    .key(&lock)
                    .key(&fence)
                    .arg("b")
                    .arg(30_000)
                    .invoke_async(&mut waiter_conn)
                    .await
                    .map_err(redis_err)?;
                if !granted_fence(&granted) {
                    return Err("the raw waiter was not granted".into());
                }
                let _ = tx.send(Instant::now());
            }
            Ok(())
        })
    };
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let granted: redis::Value =
            acquire.key(&lock).key(&fence).arg("a").arg(30_000).invoke_async(&mut holder).await.map_err(redis_err)?;
        if !granted_fence(&granted) {
            return Err("the raw holder was not granted".into());
        }
        // The waiter's attempt that finds the lock held and marks it, as the service's waiters
        // do: the release of an unmarked lock publishes nothing.
        let held: redis::Value = acquire
            .key(&lock)
            .key(&fence)
            .arg("b")
            .arg(30_000)
            .arg("wait")
            .invoke_async(&mut holder)
            .await
            .map_err(redis_err)?;
        if !matches!(held, redis::Value::Array(_)) {
            return Err("the raw waiter's attempt was granted a held lock".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        let _: i64 = release.key(&lock).arg("a").arg(&watched).invoke_async(&mut holder).await.map_err(redis_err)?;
        let released = Instant::now();
        let got = rx.recv().await.ok_or("the raw waiter stopped")?;
        out.push(got.saturating_duration_since(released));
        let _: i64 = release.key(&lock).arg("b").arg(&unwatched).invoke_async(&mut holder).await.map_err(redis_err)?;
    }
    waiter.await.map_err(|e| e.to_string())??;
    Ok(out)
}

fn etcd_err(e: etcd_client::Error) -> String {
    format!("raw etcd: {e}")
}

/// The plain etcd lock: a txn that puts the key on `lease` if it does not exist, then a delete.
pub fn etcd_txn(name: impl Into<String>, client: &etcd_client::Client, lease: i64, prefix: &str) -> Variant {
    use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
    let kv = client.kv_client();
    let prefix = format!("{prefix}/raw");
    Variant::new(name, move |slot| {
        let mut kv = kv.clone();
        let key = format!("{prefix}/t{}k{}", slot.task, slot.key);
        async move {
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.clone(), "token", Some(PutOptions::new().with_lease(lease)))]);
            if !kv.txn(txn).await.map_err(etcd_err)?.succeeded() {
                return Err(format!("{key} was held"));
            }
            kv.delete(key, None).await.map_err(etcd_err)?;
            Ok(())
        }
    })
}

/// The very txns Palisade's etcd service sends, through the raw client: put a contender key
/// on `lease` if no key exists under the resource's prefix, reading the service's epoch in the
/// same txn (the key the fence's epoch lives in, absent until a data loss), then delete that
/// key.
pub fn etcd_same_txns(name: impl Into<String>, client: &etcd_client::Client, lease: i64, prefix: &str) -> Variant {
    use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
    let kv = client.kv_client();
    let prefix = format!("{prefix}/same");
    let epoch = format!("{prefix}/epoch");
    Variant::new(name, move |slot| {
        let mut kv = kv.clone();
        let resource = format!("{prefix}/t{}k{}/", slot.task, slot.key);
        let key = format!("{resource}{}", slot.n);
        let epoch = epoch.clone();
        async move {
            let txn =
                Txn::new().when([Compare::create_revision(resource, CompareOp::Equal, 0).with_prefix()]).and_then([
                    TxnOp::put(key.clone(), "token", Some(PutOptions::new().with_lease(lease))),
                    TxnOp::get(epoch, None),
                ]);
            if !kv.txn(txn).await.map_err(etcd_err)?.succeeded() {
                return Err(format!("{key} was held"));
            }
            kv.delete(key, None).await.map_err(etcd_err)?;
            Ok(())
        }
    })
}

/// Compacts etcd's history up to now before each turn. Palisade's acquire ranges over the
/// resource's key prefix, where etcd keeps every deleted contender key until a compaction:
/// each variant starts from the same compacted history, as under a server with
/// auto-compaction.
pub fn etcd_compaction(client: &etcd_client::Client) -> Hook {
    let kv = client.kv_client();
    Hook::new(move || {
        let mut kv = kv.clone();
        async move {
            let got = kv.get("compact-probe", None).await.map_err(etcd_err)?;
            let now = got.header().map(|h| h.revision()).ok_or("raw etcd: a reply without a header")?;
            match kv.compact(now, None).await {
                Ok(_) => Ok(()),
                // Already compacted to `now` (nothing written since) is fine.
                Err(e) if e.to_string().contains("compacted") => Ok(()),
                Err(e) => Err(etcd_err(e)),
            }
        }
    })
}

/// A lease of `ttl_s` seconds for the raw etcd variants, granted on `client`.
pub async fn etcd_lease(client: &etcd_client::Client, ttl_s: i64) -> Result<i64, String> {
    Ok(client.lease_client().grant(ttl_s, None).await.map_err(etcd_err)?.id())
}

/// The plain ZooKeeper lock: create an ephemeral sequential node under the slot's parent, then
/// delete it. The parents are created before the first turn.
pub async fn zk_create(
    name: impl Into<String>,
    client: &zk::Client,
    prefix: &str,
    plan: &Plan,
) -> Result<Variant, String> {
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let base = format!("/palisade-raw/{prefix}");
    let tasks = plan.concurrency.iter().copied().max().unwrap_or(1);
    for t in 0..tasks {
        for k in 0..plan.keys.max(1) {
            client.mkdir(&format!("{base}/t{t}k{k}"), &persistent).await.map_err(|e| format!("raw zookeeper: {e}"))?;
        }
    }
    let client = client.clone();
    Ok(Variant::new(name, move |slot| {
        let client = client.clone();
        let node = format!("{base}/t{}k{}/c-", slot.task, slot.key);
        async move {
            let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
            let (_, seq) = client.create(&node, &[], &options).await.map_err(|e| format!("raw zookeeper: {e}"))?;
            client.delete(&format!("{node}{seq}"), None).await.map_err(|e| format!("raw zookeeper: {e}"))
        }
    }))
}

fn sql_err(e: sqlx::Error) -> String {
    format!("raw sql: {e}")
}

/// The plain row lock on PostgreSQL, through sqlx (the client Palisade's service uses), on a
/// table of its own: `INSERT … ON CONFLICT DO NOTHING` of the slot's row (no row inserted:
/// held), then `DELETE` it. No fence, no expiry check: the cheapest lock a table can give.
pub async fn postgres_row(name: impl Into<String>, url: &str, prefix: &str) -> Result<Variant, String> {
    let statements = RowLock {
        create: "CREATE TABLE IF NOT EXISTS palisade_raw_locks (resource TEXT PRIMARY KEY, owner TEXT NOT NULL, \
                 expires_at TIMESTAMPTZ NOT NULL)",
        take: "INSERT INTO palisade_raw_locks (resource, owner, expires_at) \
               VALUES ($1, 'token', clock_timestamp() + interval '30 seconds') ON CONFLICT DO NOTHING",
        release: "DELETE FROM palisade_raw_locks WHERE resource = $1 AND owner = 'token'",
    };
    postgres_row_lock(name, url, &format!("{prefix}.raw"), statements).await
}

/// The minimal fenced row lock on PostgreSQL, through sqlx, on a table of its own: one
/// `INSERT … ON CONFLICT DO UPDATE … WHERE free OR expired RETURNING fence` takes the row and
/// issues the next fence (no row taken: held), and `UPDATE … SET owner = NULL` releases it. The
/// row stays, so its fence survives the release: the least a fenced lock in a table can do.
pub async fn postgres_minimal_fenced(name: impl Into<String>, url: &str, prefix: &str) -> Result<Variant, String> {
    let statements = RowLock {
        create: "CREATE TABLE IF NOT EXISTS palisade_minimal_locks (resource TEXT PRIMARY KEY, owner TEXT, \
                 expires_at TIMESTAMPTZ NOT NULL, fence BIGINT NOT NULL)",
        take: "INSERT INTO palisade_minimal_locks AS l (resource, owner, expires_at, fence) \
               VALUES ($1, 'token', clock_timestamp() + interval '30 seconds', 1) \
               ON CONFLICT (resource) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at, \
               fence = l.fence + 1 WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp() RETURNING l.fence",
        release: "UPDATE palisade_minimal_locks SET owner = NULL WHERE resource = $1 AND owner = 'token'",
    };
    postgres_row_lock(name, url, &format!("{prefix}.minimal"), statements).await
}

/// The same plain row lock in the SQLite file at `url` (its own pool, as a second process
/// would have; writes queue on the file's lock as the service's do). `?2` is the time in
/// milliseconds, which the plain lock stores and never reads.
pub async fn sqlite_row(name: impl Into<String>, url: &str, prefix: &str) -> Result<Variant, String> {
    let statements = RowLock {
        create: "CREATE TABLE IF NOT EXISTS palisade_raw_locks (resource TEXT PRIMARY KEY NOT NULL, owner TEXT NOT NULL, \
                 expires_at_ms INTEGER NOT NULL) WITHOUT ROWID",
        take: "INSERT INTO palisade_raw_locks (resource, owner, expires_at_ms) VALUES (?1, 'token', ?2) \
               ON CONFLICT DO NOTHING",
        release: "DELETE FROM palisade_raw_locks WHERE resource = ?1 AND owner = 'token'",
    };
    sqlite_row_lock(name, url, &format!("{prefix}.raw"), statements).await
}

/// The same minimal fenced row lock in the SQLite file at `url` (its own pool, as
/// [`sqlite_row`]'s; `?2` is the time in milliseconds, expiry by the machine's clock).
pub async fn sqlite_minimal_fenced(name: impl Into<String>, url: &str, prefix: &str) -> Result<Variant, String> {
    let statements = RowLock {
        create: "CREATE TABLE IF NOT EXISTS palisade_minimal_locks (resource TEXT PRIMARY KEY NOT NULL, owner TEXT, \
                 expires_at_ms INTEGER NOT NULL, fence INTEGER NOT NULL) WITHOUT ROWID",
        take: "INSERT INTO palisade_minimal_locks AS l (resource, owner, expires_at_ms, fence) \
               VALUES (?1, 'token', ?2 + 30000, 1) \
               ON CONFLICT (resource) DO UPDATE SET owner = excluded.owner, expires_at_ms = excluded.expires_at_ms, \
               fence = l.fence + 1 WHERE l.owner IS NULL OR l.expires_at_ms <= ?2 RETURNING fence",
        release: "UPDATE palisade_minimal_locks SET owner = NULL WHERE resource = ?1 AND owner = 'token'",
    };
    sqlite_row_lock(name, url, &format!("{prefix}.minimal"), statements).await
}

/// A lock kept as a table row: the table, the statement that takes the slot's row (one row
/// taken or none: held) and the one that lets it go, each bound to the slot's key first.
struct RowLock {
    create: &'static str,
    take: &'static str,
    release: &'static str,
}

async fn postgres_row_lock(name: impl Into<String>, url: &str, prefix: &str, lock: RowLock) -> Result<Variant, String> {
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(16).connect(url).await.map_err(sql_err)?;
    sqlx::query(lock.create).execute(&pool).await.map_err(sql_err)?;
    let prefix = prefix.to_string();
    Ok(Variant::new(name, move |slot| {
        let pool = pool.clone();
        let key = format!("{prefix}:t{}k{}", slot.task, slot.key);
        async move {
            let taken = sqlx::query(lock.take).bind(&key).execute(&pool).await.map_err(sql_err)?.rows_affected();
            if taken != 1 {
                return Err(format!("{key} was held"));
            }
            sqlx::query(lock.release).bind(&key).execute(&pool).await.map_err(sql_err)?;
            Ok(())
        }
    }))
}

async fn sqlite_row_lock(name: impl Into<String>, url: &str, prefix: &str, lock: RowLock) -> Result<Variant, String> {
    let store = palisade::sqlite::SqliteStore::connect(url).await.map_err(|e| e.to_string())?;
    let pool = store.pool().clone();
    sqlx::query(lock.create).execute(&pool).await.map_err(sql_err)?;
    let prefix = prefix.to_string();
    Ok(Variant::new(name, move |slot| {
        let pool = pool.clone();
        let key = format!("{prefix}:t{}k{}", slot.task, slot.key);
        async move {
            let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let now_ms = i64::try_from(now_ms.as_millis()).unwrap_or(i64::MAX);
            let taken =
                sqlx::query(lock.take).bind(&key).bind(now_ms).execute(&pool).await.map_err(sql_err)?.rows_affected();
            if taken != 1 {
                return Err(format!("{key} was held"));
            }
            sqlx::query(lock.release).bind(&key).execute(&pool).await.map_err(sql_err)?;
            Ok(())
        }
    }))
}
