//! Redis lock service and PostgreSQL store, each against its raw operation in the same run.
//!
//! ```sh
//! scripts/services up && source .services/env
//! PALISADE_REDIS_SERVER=$(command -v redis-server) cargo bench -p palisade-integration --bench redis_postgres
//! ```
//!
//! Prints a Markdown report: ratios are what to compare across machines, not absolute times.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // a benchmark binary: panics are its errors

use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade::postgres::{FencedRow, PostgresConfig, PostgresStore};
use palisade::redis::RedisLockService;
use palisade::{Fence, FencedStore, LockService, LockServiceExt, ResourceKey, Ttl, WriteBatch};
use redis::AsyncCommands;

fn env(name: &str) -> String {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} is not set: run scripts/services up and source .services/env"))
}

struct Stats {
    p50: Duration,
    p99: Duration,
}

fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort_unstable();
    let at = |p: usize| v[(v.len() - 1) * p / 100];
    Stats { p50: at(50), p99: at(99) }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

/// Cycles per path per round; five rounds interleave the paths so drift hits them all alike.
const CYCLES: usize = 1000;
const ROUNDS: usize = 5;

async fn raw_cycle_latency(url: &str, prefix: &str) -> Vec<Duration> {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_connection_manager().await.unwrap();
    let mut lat = Vec::with_capacity(CYCLES);
    for i in 0..CYCLES {
        let key = format!("{prefix}:raw:{}", i % 64);
        let t = Instant::now();
        let _: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg("token")
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: i64 = conn.del(&key).await.unwrap();
        lat.push(t.elapsed());
    }
    lat
}

async fn raw_script_cycle_latency(url: &str, prefix: &str) -> Vec<Duration> {
    let (acquire, release) = scripts();
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_connection_manager().await.unwrap();
    let mut lat = Vec::with_capacity(CYCLES);
    for i in 0..CYCLES {
        let (lock, fence) = (format!("lock:{{{prefix}:rs{}}}", i % 64), format!("fence:{{{prefix}:rs{}}}", i % 64));
        let t = Instant::now();
        let _: (i64, String) =
            acquire.key(&lock).key(&fence).arg("token").arg(30_000).invoke_async(&mut conn).await.unwrap();
        let _: i64 = release.key(&lock).arg("token").arg("palisade:released:x").invoke_async(&mut conn).await.unwrap();
        lat.push(t.elapsed());
    }
    lat
}

/// The acquire and release scripts of palisade-redis, the very same ones.
fn scripts() -> (redis::Script, redis::Script) {
    (palisade::redis::scripts::ACQUIRE.clone(), palisade::redis::scripts::RELEASE.clone())
}

async fn palisade_cycle_latency(svc: &Arc<RedisLockService>, prefix: &str, with_lease: bool) -> Vec<Duration> {
    let ttl = Ttl::from_millis(30_000).unwrap();
    let mut lat = Vec::with_capacity(CYCLES);
    for i in 0..CYCLES {
        let key = ResourceKey::new(prefix, format!("p{}", i % 64)).unwrap();
        let t = Instant::now();
        if with_lease {
            let lease = svc.try_lock(&key, ttl.get()).await.unwrap().unwrap();
            lease.release().await.unwrap();
        } else {
            let grant = svc.try_acquire(&key, ttl).await.unwrap().unwrap();
            svc.release(&grant).await.unwrap();
        }
        lat.push(t.elapsed());
    }
    lat
}

async fn raw_throughput(url: &str, prefix: &str, tasks: usize, for_: Duration) -> f64 {
    let client = redis::Client::open(url).unwrap();
    let conn = client.get_connection_manager().await.unwrap();
    let start = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let mut conn = conn.clone();
        let key = format!("{prefix}:rawtp:{t}");
        handles.push(tokio::spawn(async move {
            let mut n = 0u64;
            while start.elapsed() < for_ {
                let _: Option<String> = redis::cmd("SET")
                    .arg(&key)
                    .arg("token")
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let _: i64 = conn.del(&key).await.unwrap();
                n += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap();
    }
    total as f64 / start.elapsed().as_secs_f64()
}

/// The same two Lua scripts through the redis crate directly: what the server's script
/// execution costs, without any of Palisade's client code.
async fn raw_script_throughput(url: &str, prefix: &str, tasks: usize, for_: Duration) -> f64 {
    let (acquire, release) = scripts();
    let client = redis::Client::open(url).unwrap();
    let conn = client.get_connection_manager().await.unwrap();
    let start = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let mut conn = conn.clone();
        let (acquire, release) = (acquire.clone(), release.clone());
        let (lock, fence, channel) = (
            format!("lock:{{{prefix}:s{t}}}"),
            format!("fence:{{{prefix}:s{t}}}"),
            format!("palisade:released:{prefix}{t}"),
        );
        handles.push(tokio::spawn(async move {
            let mut n = 0u64;
            while start.elapsed() < for_ {
                let _: (i64, String) =
                    acquire.key(&lock).key(&fence).arg("token").arg(30_000).invoke_async(&mut conn).await.unwrap();
                let _: i64 = release.key(&lock).arg("token").arg(&channel).invoke_async(&mut conn).await.unwrap();
                n += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap();
    }
    total as f64 / start.elapsed().as_secs_f64()
}

async fn palisade_throughput(svc: &Arc<RedisLockService>, prefix: &str, tasks: usize, for_: Duration) -> f64 {
    let start = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let svc = Arc::clone(svc);
        let key = ResourceKey::new(prefix, format!("tp{t}")).unwrap();
        handles.push(tokio::spawn(async move {
            let ttl = Ttl::from_millis(30_000).unwrap();
            let mut n = 0u64;
            while start.elapsed() < for_ {
                let g = svc.try_acquire(&key, ttl).await.unwrap().unwrap();
                svc.release(&g).await.unwrap();
                n += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap();
    }
    total as f64 / start.elapsed().as_secs_f64()
}

async fn handoff(url: &str, prefix: &str) -> Stats {
    let a = Arc::new(RedisLockService::connect(url).await.unwrap());
    let b = Arc::new(RedisLockService::connect(url).await.unwrap());
    let key = ResourceKey::new(prefix, "handoff").unwrap();
    let mut lat = Vec::new();
    for _ in 0..200 {
        let held = a.lock(&key, Duration::from_secs(30), Duration::from_secs(5)).await.unwrap();
        let (b2, k2) = (Arc::clone(&b), key.clone());
        let waiter = tokio::spawn(async move {
            let lease = b2.lock(&k2, Duration::from_secs(30), Duration::from_secs(10)).await.unwrap();
            (Instant::now(), lease)
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        held.release().await.unwrap();
        let released = Instant::now();
        let (got, lease) = waiter.await.unwrap();
        lat.push(got.saturating_duration_since(released));
        lease.release().await.unwrap();
    }
    stats(lat)
}

/// The same handoff through the raw client: a waiter subscribed to the release channel runs
/// the acquire script when the holder's release script publishes. Returns the wake (release
/// returned → message received) and the handoff (release returned → waiter holds).
async fn raw_handoff(url: &str, prefix: &str) -> (Stats, Stats) {
    use futures_util::StreamExt;
    const HANDOFFS: usize = 200;
    let (acquire, release) = scripts();
    let client = redis::Client::open(url).unwrap();
    let mut holder = client.get_multiplexed_async_connection().await.unwrap();
    let mut waiter_conn = client.get_multiplexed_async_connection().await.unwrap();
    let (lock, fence) = (format!("lock:{{{prefix}:rawhand}}"), format!("fence:{{{prefix}:rawhand}}"));
    let (watched, unwatched) = (format!("palisade:released:{lock}"), format!("palisade:released:{lock}:quiet"));
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub.subscribe(&watched).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let waiter = {
        let (acquire, lock, fence) = (acquire.clone(), lock.clone(), fence.clone());
        tokio::spawn(async move {
            let mut messages = pubsub.into_on_message();
            for _ in 0..HANDOFFS {
                messages.next().await.unwrap();
                let woke = Instant::now();
                let (granted, _): (i64, String) =
                    acquire.key(&lock).key(&fence).arg("b").arg(30_000).invoke_async(&mut waiter_conn).await.unwrap();
                assert_eq!(granted, 1);
                tx.send((woke, Instant::now())).unwrap();
            }
        })
    };
    let (mut wake, mut handoff) = (Vec::new(), Vec::new());
    for _ in 0..HANDOFFS {
        let (granted, _): (i64, String) =
            acquire.key(&lock).key(&fence).arg("a").arg(30_000).invoke_async(&mut holder).await.unwrap();
        assert_eq!(granted, 1);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let _: i64 = release.key(&lock).arg("a").arg(&watched).invoke_async(&mut holder).await.unwrap();
        let released = Instant::now();
        let (woke, got) = rx.recv().await.unwrap();
        wake.push(woke.saturating_duration_since(released));
        handoff.push(got.saturating_duration_since(released));
        let _: i64 = release.key(&lock).arg("b").arg(&unwatched).invoke_async(&mut holder).await.unwrap();
    }
    waiter.await.unwrap();
    (stats(wake), stats(handoff))
}

async fn pg_writers(
    writers: usize,
    for_: Duration,
    op: impl Fn(usize, u64) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync + 'static,
) -> f64 {
    let op = Arc::new(op);
    let start = Instant::now();
    let mut handles = Vec::new();
    for w in 0..writers {
        let op = Arc::clone(&op);
        handles.push(tokio::spawn(async move {
            let mut n = 0u64;
            while start.elapsed() < for_ {
                n += 1;
                op(w, n).await;
            }
            n
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap();
    }
    total as f64 / start.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let redis_url = env("PALISADE_REDIS_URL");
    let pg_url = env("PALISADE_POSTGRES_URL");
    let prefix = format!("bench{}", std::process::id());
    let svc = Arc::new(RedisLockService::connect(&redis_url).await.unwrap());

    println!("# Redis lock service and PostgreSQL store vs their raw operations\n");
    println!("Loopback servers, one run; ratios compare like with like in that run.\n");

    // Warm up connections and script caches.
    let _ = raw_cycle_latency(&redis_url, &prefix).await;
    let _ = raw_script_cycle_latency(&redis_url, &prefix).await;
    let _ = palisade_cycle_latency(&svc, &prefix, false).await;

    let (mut raw, mut raw_scripts, mut service, mut lease) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        raw.extend(raw_cycle_latency(&redis_url, &prefix).await);
        raw_scripts.extend(raw_script_cycle_latency(&redis_url, &prefix).await);
        service.extend(palisade_cycle_latency(&svc, &prefix, false).await);
        lease.extend(palisade_cycle_latency(&svc, &prefix, true).await);
    }
    let (raw, raw_scripts, service, lease) = (stats(raw), stats(raw_scripts), stats(service), stats(lease));
    println!(
        "## Uncontended acquire + release ({} cycles per path, {ROUNDS} interleaved rounds, one connection)\n",
        CYCLES * ROUNDS
    );
    println!("| path | p50 ms | p99 ms | p50 ratio to raw |");
    println!("|---|---|---|---|");
    println!("| raw `SET NX PX` + `DEL` | {} | {} | 1.00 |", ms(raw.p50), ms(raw.p99));
    let r = |s: &Stats| s.p50.as_secs_f64() / raw.p50.as_secs_f64();
    println!(
        "| the same two Lua scripts through the redis crate | {} | {} | {:.2} |",
        ms(raw_scripts.p50),
        ms(raw_scripts.p99),
        r(&raw_scripts)
    );
    println!(
        "| `try_acquire` + `release` (script: GET, INCR, SET PX; compare-token DEL) | {} | {} | {:.2} |",
        ms(service.p50),
        ms(service.p99),
        r(&service)
    );
    println!(
        "| `try_lock` + `Lease::release` (plus lease watchdog, metrics, spans) | {} | {} | {:.2} |\n",
        ms(lease.p50),
        ms(lease.p99),
        r(&lease)
    );

    let window = Duration::from_secs(3);
    let tp_window = Duration::from_secs(2);
    println!("## Throughput, distinct keys, one multiplexed connection (median of three interleaved 2-s rounds)\n");
    println!(
        "| tasks | raw `SET NX PX`+`DEL` /s | same Lua scripts, redis crate /s | palisade /s | palisade ÷ raw | palisade ÷ scripts |"
    );
    println!("|---|---|---|---|---|---|");
    for tasks in [1, 16, 64] {
        let (mut raws, mut scripts, mut ours) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..3 {
            raws.push(raw_throughput(&redis_url, &prefix, tasks, tp_window).await);
            scripts.push(raw_script_throughput(&redis_url, &prefix, tasks, tp_window).await);
            ours.push(palisade_throughput(&svc, &prefix, tasks, tp_window).await);
        }
        let (raw_tp, script_tp, p_tp) = (median(raws), median(scripts), median(ours));
        println!(
            "| {tasks} | {raw_tp:.0} | {script_tp:.0} | {p_tp:.0} | {:.2} | {:.2} |",
            p_tp / raw_tp,
            p_tp / script_tp
        );
    }

    let (mut ours, mut raw_wakes, mut raw_handoffs) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        ours.push(handoff(&redis_url, &prefix).await);
        let (wake, hand) = raw_handoff(&redis_url, &prefix).await;
        raw_wakes.push(wake);
        raw_handoffs.push(hand);
    }
    let mid = |v: Vec<Stats>| {
        let p50 = median(v.iter().map(|s| s.p50.as_secs_f64()).collect());
        let p99 = median(v.iter().map(|s| s.p99.as_secs_f64()).collect());
        (Duration::from_secs_f64(p50), Duration::from_secs_f64(p99))
    };
    let (h50, h99) = mid(ours);
    let (w50, w99) = mid(raw_wakes);
    let (r50, r99) = mid(raw_handoffs);
    println!(
        "\n## Contended handoff (release returned → waiter holds), 200 handoffs, median of three interleaved rounds\n"
    );
    println!("| path | p50 ms | p99 ms | p50 ratio to the raw handoff |");
    println!("|---|---|---|---|");
    println!(
        "| raw pub/sub wake (release script returned → subscriber has the message; it is published before the reply) | {} | {} | {:.2} |",
        ms(w50),
        ms(w99),
        w50.as_secs_f64() / r50.as_secs_f64()
    );
    println!(
        "| raw handoff (the same scripts; a subscribed waiter runs the acquire script on the message) | {} | {} | 1.00 |",
        ms(r50),
        ms(r99)
    );
    println!(
        "| `lock` waiting → `Lease::release` (pub/sub notification) | {} | {} | {:.2} |\n",
        ms(h50),
        ms(h99),
        h50.as_secs_f64() / r50.as_secs_f64()
    );

    if let Ok(server) = std::env::var("PALISADE_REDIS_SERVER") {
        println!("## Durability cost: acquire + release on a Redis of the benchmark's own, its AOF on disk\n");
        println!("| persistence | p50 ms | p99 ms | p50 ratio |");
        println!("|---|---|---|---|");
        let mut base = None;
        // On disk, never in memory: what an fsync costs is the point of this table (the test
        // servers' own data lives in /dev/shm when there is room).
        let disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let disk_dir = disk.path().display().to_string();
        for (name, mut args) in [
            ("none (`--appendonly no`)", vec!["--appendonly", "no"]),
            ("`appendonly yes`, `appendfsync everysec`", vec!["--appendonly", "yes", "--appendfsync", "everysec"]),
            ("`appendonly yes`, `appendfsync always`", vec!["--appendonly", "yes", "--appendfsync", "always"]),
        ] {
            args.extend(["--dir", disk_dir.as_str()]);
            let own_server = palisade_conformance::servers::LoopbackServer::redis(&server, &args).unwrap();
            let own = Arc::new(RedisLockService::connect(&own_server.redis_url()).await.unwrap());
            let _ = palisade_cycle_latency(&own, &prefix, false).await;
            let s = stats(palisade_cycle_latency(&own, &prefix, false).await);
            let b = *base.get_or_insert(s.p50.as_secs_f64());
            println!("| {name} | {} | {} | {:.2} |", ms(s.p50), ms(s.p99), s.p50.as_secs_f64() / b);
            drop(own);
            drop(own_server);
        }
        println!();
    }

    // PostgreSQL: the seed's single-statement form vs the same UPDATE unfenced, 8 writers on
    // their own rows; and the record API fenced vs unfenced.
    let store =
        PostgresStore::open(PostgresConfig { max_connections: 16, ..PostgresConfig::new(&pg_url) }).await.unwrap();
    let table = format!("bench_inventory_{}", std::process::id());
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (sku TEXT PRIMARY KEY, qty BIGINT NOT NULL, fence BIGINT NOT NULL)"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    for w in 0..8 {
        sqlx::query(sqlx::AssertSqlSafe(format!("INSERT INTO {table} VALUES ('sku{w}', 1000000000, 0)")))
            .execute(store.pool())
            .await
            .unwrap();
    }
    let table: &'static str = Box::leak(table.into_boxed_str());
    let writers = 8;
    let mut rows = Vec::new();
    for round in 1..=5u64 {
        let plain = {
            let pool = store.pool().clone();
            pg_writers(writers, window, move |w, _| {
                let pool = pool.clone();
                Box::pin(async move {
                    sqlx::query(sqlx::AssertSqlSafe(format!("UPDATE {table} SET qty = qty - 1 WHERE sku = $1")))
                        .bind(format!("sku{w}"))
                        .execute(&pool)
                        .await
                        .unwrap();
                })
            })
            .await
        };
        let fenced = {
            let store = store.clone();
            pg_writers(writers, window, move |w, n| {
                let store = store.clone();
                Box::pin(async move {
                    let key = format!("sku{w}");
                    let row = FencedRow { table, key_column: "sku", fence_column: "fence" };
                    store
                        .update_row_fenced(&row, &key, Fence::new(round * 100_000_000 + n), "qty = qty - 1", |q| q)
                        .await
                        .unwrap();
                })
            })
            .await
        };
        let rec_unfenced = {
            let store = store.clone();
            let prefix = prefix.clone();
            pg_writers(writers, window, move |w, n| {
                let store = store.clone();
                let batch = WriteBatch::new().put(format!("{prefix}/rec/{w}"), n.to_string());
                Box::pin(async move { store.apply_unfenced(&batch).await.unwrap() })
            })
            .await
        };
        let rec_fenced = {
            let store = store.clone();
            let prefix = prefix.clone();
            pg_writers(writers, window, move |w, n| {
                let store = store.clone();
                let key = ResourceKey::new(prefix.clone(), format!("w{w}")).unwrap();
                let batch = WriteBatch::new().put(format!("{prefix}/rec/{w}"), n.to_string());
                Box::pin(async move {
                    store
                        .apply(
                            &key,
                            palisade::GrantFence::new(Fence::new(round * 100_000_000 + n), BENCH_GRANT),
                            &batch,
                        )
                        .await
                        .unwrap()
                })
            })
            .await
        };
        rows.push((plain, fenced, rec_unfenced, rec_fenced));
    }
    println!(
        "## PostgreSQL, {writers} writers on their own rows ({}-s windows, five interleaved rounds)\n",
        window.as_secs()
    );
    println!(
        "| round | plain `UPDATE` /s | seed form `UPDATE … WHERE fence <= $f` /s | overhead | record API unfenced /s | record API fenced /s | overhead |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (i, (plain, fenced, ru, rf)) in rows.iter().enumerate() {
        println!(
            "| {} | {plain:.0} | {fenced:.0} | {:+.1}% | {ru:.0} | {rf:.0} | {:+.1}% |",
            i + 1,
            (plain / fenced - 1.0) * 100.0,
            (ru / rf - 1.0) * 100.0
        );
    }
    let median = |column: usize| {
        let mut v: Vec<f64> = rows.iter().map(|r| [r.0, r.1, r.2, r.3][column]).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (plain, fenced, ru, rf) = (median(0), median(1), median(2), median(3));
    println!(
        "| median | {plain:.0} | {fenced:.0} | {:+.1}% | {ru:.0} | {rf:.0} | {:+.1}% |",
        (plain / fenced - 1.0) * 100.0,
        (ru / rf - 1.0) * 100.0
    );
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {table}"))).execute(store.pool()).await.unwrap();
}

/// The grant every fenced write of the benchmark presents (each writer has its own resource).
const BENCH_GRANT: palisade::GrantId = palisade::GrantId::from_bytes([7; 16]);
