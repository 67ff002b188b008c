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
use std::time::Duration;

use palisade::postgres::{FencedRow, PostgresConfig, PostgresStore};
use palisade::redis::RedisLockService;
use palisade::{Fence, FencedStore, ResourceKey, Ttl, WriteBatch};
use palisade_compare::baseline;
use palisade_compare::measure::{self, Handoff, Plan, Variant};

fn env(name: &str) -> String {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} is not set: run scripts/services up and source .services/env"))
}

fn ms(v: f64) -> String {
    format!("{v:.3}")
}

/// Palisade's Redis service against rslock 0.10 (a Redlock client) on the same single server.
fn rslock(url: &str, prefix: &str) -> Variant {
    let manager = rslock::LockManager::new(vec![url.to_string()]);
    let prefix = format!("{prefix}:rslock");
    Variant::new("rslock", move |slot| {
        let manager = manager.clone();
        let resource = format!("{prefix}:t{}k{}", slot.task, slot.key);
        async move {
            let lock = manager.lock(resource.as_str(), Duration::from_secs(30)).await.map_err(|e| e.to_string())?;
            manager.unlock(&lock).await;
            Ok(())
        }
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let redis_url = env("PALISADE_REDIS_URL");
    let pg_url = env("PALISADE_POSTGRES_URL");
    let prefix = measure::run_prefix("bench");
    let plan = Plan::full();
    let ttl = Ttl::from_millis(30_000).unwrap();
    let svc = Arc::new(RedisLockService::connect(&redis_url).await.unwrap());

    println!("# Redis lock service and PostgreSQL store vs their raw operations\n");
    println!(
        "Loopback servers, one run, measured by `palisade_compare::measure` (the code `palisade compare` uses): \
         every variant on the same keys ({} per task) and concurrency, warmed up, then the variants take turns for {} \
         rounds; figures are medians over the rounds with their min–max. Ratios compare like with like in this run.\n",
        plan.keys, plan.rounds
    );

    let variants = [
        baseline::redis_set_nx("raw `SET NX PX` + `DEL`", &redis_url, &prefix).await.unwrap(),
        baseline::redis_minimal_fenced(
            "minimal fenced pair (`SET NX PX` then `INCR` in one script; a compare-and-delete script)",
            &redis_url,
            &prefix,
        )
        .await
        .unwrap(),
        baseline::redis_scripts("the same two Lua scripts through the redis crate", &redis_url, &prefix).await.unwrap(),
        rslock(&redis_url, &prefix),
        baseline::service("`try_acquire` + `release`", Arc::clone(&svc), &prefix, ttl),
        baseline::lease(
            "`try_lock` + `Lease::release` (plus metrics and spans; no watchdog until the lost signal is watched)",
            Arc::clone(&svc),
            &prefix,
            ttl,
        ),
    ];
    let [raw, minimal, scripts, theirs, ours, lease] = &variants;
    let latency = measure::latency(&variants, &plan, None).await.unwrap();
    let [raw_l, minimal_l, scripts_l, theirs_l, ours_l, lease_l] = &latency[..] else { unreachable!() };
    println!(
        "## Uncontended acquire + release ({} cycles per variant per round, one task, one connection)\n",
        plan.cycles
    );
    println!("| path | p50 ms (rounds) | p99 ms | p50 ÷ raw | p50 ÷ minimal fenced | p50 ÷ same scripts |");
    println!("|---|---|---|---|---|---|");
    for l in [raw_l, minimal_l, scripts_l, theirs_l, ours_l, lease_l] {
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.2} |",
            l.name,
            l.cells(),
            l.ratio_to(raw_l),
            l.ratio_to(minimal_l),
            l.ratio_to(scripts_l)
        );
    }
    println!(
        "\n`Lease` ÷ trait level: {:.2}; rslock ÷ `try_acquire` + `release`: {:.2} (rslock sends `SET NX PX` and a compare-delete script: no fence).\n",
        lease_l.ratio_to(ours_l),
        theirs_l.ratio_to(ours_l)
    );

    println!(
        "## Throughput, a task's own keys, one multiplexed connection per client ({:.0}-s windows)\n",
        plan.window.as_secs_f64()
    );
    println!(
        "| tasks | raw /s | minimal fenced /s | same scripts /s | rslock /s | palisade /s | `Lease` /s | palisade ÷ raw | \
         palisade ÷ minimal fenced | same scripts ÷ minimal fenced | palisade ÷ same scripts | ÷ rslock | `Lease` ÷ palisade |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let tp = [raw.clone(), minimal.clone(), scripts.clone(), theirs.clone(), ours.clone(), lease.clone()];
    for &tasks in &plan.concurrency {
        let rates = measure::throughput(&tp, tasks, &plan, None).await.unwrap();
        let [r, mi, sc, th, o, le] = &rates[..] else { unreachable!() };
        println!(
            "| {tasks} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            r.per_sec.rate_cell(),
            mi.per_sec.rate_cell(),
            sc.per_sec.rate_cell(),
            th.per_sec.rate_cell(),
            o.per_sec.rate_cell(),
            le.per_sec.rate_cell(),
            o.ratio_to(r),
            o.ratio_to(mi),
            sc.ratio_to(mi),
            o.ratio_to(sc),
            o.ratio_to(th),
            le.ratio_to(o)
        );
    }

    let handoffs = [
        baseline::redis_handoff(
            "raw handoff (the same scripts; a subscribed waiter runs the acquire script on the message)",
            &redis_url,
            &prefix,
        )
        .await
        .unwrap(),
        Handoff::service(
            "`lock` waiting → `Lease::release` (pub/sub notification)",
            Arc::new(RedisLockService::connect(&redis_url).await.unwrap()),
            Arc::new(RedisLockService::connect(&redis_url).await.unwrap()),
            ResourceKey::new(&*prefix, "handoff").unwrap(),
            Duration::from_secs(30),
            Duration::from_millis(5),
        ),
    ];
    let h = measure::handoffs(&handoffs, &plan).await.unwrap();
    println!(
        "\n## Contended handoff (release returned → waiter holds), {} handoffs per variant per round\n",
        plan.handoffs
    );
    println!("| path | p50 ms (rounds) | p99 ms | p50 ÷ the raw handoff |");
    println!("|---|---|---|---|");
    for l in &h {
        println!("| {} | {} | {:.2} |", l.name, l.cells(), l.ratio_to(&h[0]));
    }
    println!();

    if let Ok(server) = std::env::var("PALISADE_REDIS_SERVER") {
        println!("## Durability cost: acquire + release on a Redis of the benchmark's own, its AOF on disk\n");
        println!("| persistence | p50 ms | p99 ms | p50 ratio |");
        println!("|---|---|---|---|");
        let mut base = None;
        // On disk, never in memory: what an fsync costs is the point of this table (the test
        // servers' own data lives in /dev/shm when there is room).
        let disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let disk_dir = disk.path().display().to_string();
        let one = Plan { rounds: 1, ..plan.clone() };
        for (name, mut args) in [
            ("none (`--appendonly no`)", vec!["--appendonly", "no"]),
            ("`appendonly yes`, `appendfsync everysec`", vec!["--appendonly", "yes", "--appendfsync", "everysec"]),
            ("`appendonly yes`, `appendfsync always`", vec!["--appendonly", "yes", "--appendfsync", "always"]),
        ] {
            args.extend(["--dir", disk_dir.as_str()]);
            let own_server = palisade_lab::servers::LoopbackServer::redis(&server, &args).unwrap();
            let own = Arc::new(RedisLockService::connect(&own_server.redis_url()).await.unwrap());
            let l =
                measure::latency(&[baseline::service(name, Arc::clone(&own), &prefix, ttl)], &one, None).await.unwrap();
            let l = &l[0];
            let b = *base.get_or_insert(l.p50_ms);
            println!("| {name} | {} | {} | {:.2} |", ms(l.p50_ms), ms(l.p99_ms), l.p50_ms / b);
            drop(own);
            drop(own_server);
        }
        println!();
    }

    // PostgreSQL: the fix's single-statement form vs the same UPDATE unfenced, 8 writers on
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
    let writers = 8;
    for w in 0..writers {
        sqlx::query(sqlx::AssertSqlSafe(format!("INSERT INTO {table} VALUES ('sku{w}', 1000000000, 0)")))
            .execute(store.pool())
            .await
            .unwrap();
    }
    let table: &'static str = Box::leak(table.into_boxed_str());
    // Fences grow across every window of the run: one counter per writer.
    let fences: Arc<Vec<std::sync::atomic::AtomicU64>> =
        Arc::new((0..writers).map(|_| std::sync::atomic::AtomicU64::new(0)).collect());
    let next_fence = move |fences: &Arc<Vec<std::sync::atomic::AtomicU64>>, w: usize| {
        Fence::new(fences[w].fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1)
    };
    let plain = {
        let pool = store.pool().clone();
        Variant::new("plain `UPDATE … SET qty = qty - 1`", move |slot| {
            let pool = pool.clone();
            async move {
                sqlx::query(sqlx::AssertSqlSafe(format!("UPDATE {table} SET qty = qty - 1 WHERE sku = $1")))
                    .bind(format!("sku{}", slot.task))
                    .execute(&pool)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
        })
    };
    let fix_form = {
        let (store, fences) = (store.clone(), Arc::clone(&fences));
        Variant::new("the fix's form `UPDATE … WHERE fence <= $f` (`update_row_fenced`)", move |slot| {
            let (store, fence) = (store.clone(), next_fence(&fences, slot.task));
            async move {
                let row = FencedRow { table, key_column: "sku", fence_column: "fence" };
                let key = format!("sku{}", slot.task);
                store
                    .update_row_fenced(&row, &key, fence, "qty = qty - 1", |q| q)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
        })
    };
    let record_plain = {
        let (store, prefix) = (store.clone(), prefix.clone());
        Variant::new("record API unfenced (`apply_unfenced`)", move |slot| {
            let store = store.clone();
            let batch = WriteBatch::new().put(format!("{prefix}/rec/{}", slot.task), slot.n.to_string());
            async move { store.apply_unfenced(&batch).await.map_err(|e| e.to_string()) }
        })
    };
    let record_fenced = {
        let (store, prefix, fences) = (
            store.clone(),
            prefix.clone(),
            Arc::new((0..writers).map(|_| std::sync::atomic::AtomicU64::new(0)).collect::<Vec<_>>()),
        );
        Variant::new("record API fenced (`apply`)", move |slot| {
            let (store, fence) = (store.clone(), next_fence(&fences, slot.task));
            let key = ResourceKey::new(prefix.clone(), format!("w{}", slot.task));
            let batch = WriteBatch::new().put(format!("{prefix}/rec/{}", slot.task), slot.n.to_string());
            async move {
                let key = key.map_err(|e| e.to_string())?;
                store
                    .apply(&key, palisade::GrantFence::new(fence, BENCH_GRANT), &batch)
                    .await
                    .map_err(|e| e.to_string())
            }
        })
    };
    let pg_plan = Plan { window: Duration::from_secs(3), ..plan.clone() };
    let rates =
        measure::throughput(&[plain, fix_form, record_plain, record_fenced], writers, &pg_plan, None).await.unwrap();
    println!(
        "## PostgreSQL, {writers} writers on their own rows ({}-s windows, {} interleaved rounds)\n",
        pg_plan.window.as_secs(),
        pg_plan.rounds
    );
    println!("| path | writes/s (rounds) | fenced ÷ unfenced |");
    println!("|---|---|---|");
    for (i, r) in rates.iter().enumerate() {
        let base = &rates[i - i % 2];
        println!(
            "| {} | {:.0} ({:.0}–{:.0}) | {} |",
            r.name,
            r.per_sec.median,
            r.per_sec.min,
            r.per_sec.max,
            if i % 2 == 1 { format!("{:.2}", r.ratio_to(base)) } else { "–".into() }
        );
    }
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {table}"))).execute(store.pool()).await.unwrap();
}

/// The grant every fenced write of the benchmark presents (each writer has its own resource).
const BENCH_GRANT: palisade::GrantId = palisade::GrantId::from_bytes([7; 16]);
