//! Redlock: palisade's `RedlockService` against rslock 0.10 (the existing Rust Redlock crate)
//! on the same masters, at N = 1, 3 and 5, in one run.
//!
//! ```sh
//! scripts/services up && source .services/env   # five Redis masters in PALISADE_REDLOCK_URL
//! cargo bench -p palisade-integration --bench redlock
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // a benchmark binary: panics are its errors

use std::sync::Arc;
use std::time::Duration;

use palisade::Ttl;
use palisade::redlock::RedlockService;
use palisade_compare::baseline;
use palisade_compare::measure::{self, Plan, Variant};

const TTL: Duration = Duration::from_secs(10);

fn rslock(nodes: Vec<String>, prefix: &str) -> Variant {
    let manager = rslock::LockManager::new(nodes);
    let prefix = format!("rslock:{prefix}");
    Variant::new("rslock", move |slot| {
        let manager = manager.clone();
        let resource = format!("{prefix}:t{}k{}", slot.task, slot.key);
        async move {
            let lock = manager.lock(resource.as_str(), TTL).await.map_err(|e| e.to_string())?;
            manager.unlock(&lock).await;
            Ok(())
        }
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let all = std::env::var("PALISADE_REDLOCK_URL").expect("PALISADE_REDLOCK_URL (scripts/services up)");
    let hosts: Vec<String> = all.trim_start_matches("redlock://").split(',').map(str::to_string).collect();
    assert!(hosts.len() >= 5, "need five masters, got {}", hosts.len());
    let prefix = measure::run_prefix("bench");
    let plan = Plan { cycles: 300, ..Plan::full() };
    println!("# Redlock: palisade vs rslock 0.10\n");
    println!(
        "Independent Redis masters on loopback, one run, same masters for both clients, measured by \
         `palisade_compare::measure` (the code `palisade compare` uses): the same keys ({} per task) and concurrency, \
         warmed up, then the two take turns for {} rounds. Latency: {} sequential uncontended acquire + release cycles \
         per round. Throughput: {:.0}-s windows. Medians over the rounds (min–max).\n",
        plan.keys,
        plan.rounds,
        plan.cycles,
        plan.window.as_secs_f64()
    );
    let sizes: Vec<usize> = match std::env::var("PALISADE_BENCH_REDLOCK_N") {
        Ok(v) => v.split(',').map(|n| n.trim().parse().expect("PALISADE_BENCH_REDLOCK_N: numbers")).collect(),
        Err(_) => vec![1, 3, 5],
    };
    let (mut latency_rows, mut throughput_rows) = (Vec::new(), Vec::new());
    for n in sizes {
        let nodes: Vec<String> = hosts[..n].iter().map(|h| format!("redis://{h}")).collect();
        let ours = Arc::new(RedlockService::connect(&format!("redlock://{}", hosts[..n].join(","))).await.unwrap());
        let p = format!("{prefix}n{n}");
        let variants = [baseline::service("palisade", ours, &p, Ttl::new(TTL).unwrap()), rslock(nodes, &p)];
        let l = measure::latency(&variants, &plan, None).await.unwrap();
        latency_rows.push(format!(
            "| {n} | {:.3} | {:.3} | {:.3} | {:.3} | {:.2}× |",
            l[0].p50_ms,
            l[0].p99_ms,
            l[1].p50_ms,
            l[1].p99_ms,
            l[1].ratio_to(&l[0])
        ));
        for &tasks in &plan.concurrency {
            let r = measure::throughput(&variants, tasks, &plan, None).await.unwrap();
            throughput_rows.push(format!(
                "| {n} | {tasks} | {} | {} | **{:.2}×** |",
                r[0].per_sec.rate_cell(),
                r[1].per_sec.rate_cell(),
                r[0].ratio_to(&r[1])
            ));
        }
    }
    println!("## Latency, one client, acquire + release (ms)\n");
    println!("| N | palisade p50 | palisade p99 | rslock p50 | rslock p99 | p50 ratio (rslock / palisade) |");
    println!("|---|---|---|---|---|---|");
    for row in latency_rows {
        println!("{row}");
    }
    println!("\n## Throughput, acquire + release cycles per second\n");
    println!("| N | tasks | palisade | rslock | ratio (palisade / rslock; target ≥ 1.0) |");
    println!("|---|---|---|---|---|");
    for row in throughput_rows {
        println!("{row}");
    }
}
