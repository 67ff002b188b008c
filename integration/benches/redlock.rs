//! Redlock: palisade's `RedlockService` against rslock 0.10 (the existing Rust Redlock crate)
//! on the same masters, at N = 1, 3 and 5, in one run.
//!
//! ```sh
//! scripts/services up && source .services/env   # five Redis masters in PALISADE_REDLOCK_URL
//! cargo bench -p palisade-integration --bench redlock
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // a benchmark binary: panics are its errors

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use palisade::redlock::RedlockService;
use palisade::{LockService, ResourceKey, Ttl};
use rslock::LockManager;

const CYCLES: usize = 300;
const ROUNDS: usize = 5;
const WINDOW: Duration = Duration::from_millis(500);
const THROUGHPUT_ROUNDS: usize = 10;
const TTL: Duration = Duration::from_secs(10);

fn pct(mut v: Vec<Duration>, p: usize) -> Duration {
    v.sort_unstable();
    v[(v.len() - 1) * p / 100]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

#[derive(Clone)]
enum Client {
    Palisade(Arc<RedlockService>),
    Rslock(LockManager),
}

impl Client {
    /// One uncontended acquire + release of key number `i` under `prefix`.
    async fn cycle(&self, prefix: &str, i: u64) {
        match self {
            Client::Palisade(svc) => {
                let key = ResourceKey::new(prefix, format!("k{i}")).unwrap();
                let grant = svc.try_acquire(&key, Ttl::new(TTL).unwrap()).await.unwrap().expect("uncontended");
                svc.release(&grant).await.unwrap();
            }
            Client::Rslock(rl) => {
                let resource = format!("rslock:{prefix}:k{i}");
                let lock = rl.lock(resource.as_str(), TTL).await.expect("uncontended");
                rl.unlock(&lock).await;
            }
        }
    }
}

async fn latency(client: &Client, prefix: &str) -> Vec<Duration> {
    let mut lat = Vec::with_capacity(CYCLES);
    for i in 0..CYCLES as u64 {
        let t = Instant::now();
        client.cycle(prefix, i).await;
        lat.push(t.elapsed());
    }
    lat
}

/// Acquire + release cycles per second with `tasks` concurrent tasks, each on keys of its own.
async fn throughput(client: &Client, prefix: &str, tasks: u64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (client, done, stop, prefix) = (client.clone(), done.clone(), stop.clone(), prefix.to_string());
        handles.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                client.cycle(&prefix, t * 1_000_000 + i).await;
                i += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(WINDOW).await;
    stop.store(true, Ordering::Relaxed);
    let counted = done.load(Ordering::Relaxed);
    let elapsed = started.elapsed();
    for h in handles {
        h.await.unwrap();
    }
    counted as f64 / elapsed.as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let all = std::env::var("PALISADE_REDLOCK_URL").expect("PALISADE_REDLOCK_URL (scripts/services up)");
    let hosts: Vec<String> = all.trim_start_matches("redlock://").split(',').map(str::to_string).collect();
    assert!(hosts.len() >= 5, "need five masters, got {}", hosts.len());
    let prefix = format!("bench{}", std::process::id());
    println!("# Redlock: palisade vs rslock 0.10\n");
    println!(
        "Independent Redis 7.0 masters on loopback, one run, same masters and keys for both clients. \
         Latency: {CYCLES} sequential uncontended acquire+release cycles per client in {ROUNDS} interleaved rounds. \
         Throughput: tasks on keys of their own for {WINDOW:?} windows, {THROUGHPUT_ROUNDS} interleaved rounds, mean.\n"
    );
    let mut latency_rows = Vec::new();
    let mut throughput_rows = Vec::new();
    let sizes: Vec<usize> = match std::env::var("PALISADE_BENCH_REDLOCK_N") {
        Ok(v) => v.split(',').map(|n| n.trim().parse().expect("PALISADE_BENCH_REDLOCK_N: numbers")).collect(),
        Err(_) => vec![1, 3, 5],
    };
    for n in sizes {
        let nodes: Vec<String> = hosts[..n].iter().map(|h| format!("redis://{h}")).collect();
        let ours = Client::Palisade(Arc::new(
            RedlockService::connect(&format!("redlock://{}", hosts[..n].join(","))).await.unwrap(),
        ));
        let theirs = Client::Rslock(LockManager::new(nodes));
        let (p, r) = (format!("{prefix}n{n}p"), format!("{prefix}n{n}r"));
        // Warm connections and script caches.
        let _ = latency(&ours, &p).await;
        let _ = latency(&theirs, &r).await;
        let (mut lo, mut lr) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            lo.extend(latency(&ours, &p).await);
            lr.extend(latency(&theirs, &r).await);
        }
        latency_rows.push((n, pct(lo.clone(), 50), pct(lo, 99), pct(lr.clone(), 50), pct(lr, 99)));
        for tasks in [1u64, 16, 64] {
            let (mut to, mut tr) = (0.0, 0.0);
            for round in 0..THROUGHPUT_ROUNDS {
                // Alternate who goes first, so drift on a shared machine favours nobody.
                if round % 2 == 0 {
                    to += throughput(&ours, &p, tasks).await;
                    tr += throughput(&theirs, &r, tasks).await;
                } else {
                    tr += throughput(&theirs, &r, tasks).await;
                    to += throughput(&ours, &p, tasks).await;
                }
            }
            let rounds = THROUGHPUT_ROUNDS as f64;
            throughput_rows.push((n, tasks, to / rounds, tr / rounds));
        }
    }
    println!("## Latency, one client, acquire + release (ms)\n");
    println!("| N | palisade p50 | palisade p99 | rslock p50 | rslock p99 | p50 ratio (rslock / palisade) |");
    println!("|---|---|---|---|---|---|");
    for (n, o50, o99, r50, r99) in latency_rows {
        let ratio = r50.as_secs_f64() / o50.as_secs_f64();
        println!("| {n} | {} | {} | {} | {} | {ratio:.2}× |", ms(o50), ms(o99), ms(r50), ms(r99));
    }
    println!("\n## Throughput, acquire + release cycles per second\n");
    println!("| N | tasks | palisade | rslock | ratio (palisade / rslock; target ≥ 1.0) |");
    println!("|---|---|---|---|---|");
    for (n, tasks, o, r) in throughput_rows {
        println!("| {n} | {tasks} | {o:.0} | {r:.0} | **{:.2}×** |", o / r);
    }
}
