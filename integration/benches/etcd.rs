//! The etcd lock service against the raw etcd operations it is built on, in the same run.
//!
//! ```sh
//! scripts/services up && source .services/env
//! cargo bench -p palisade-integration --bench etcd
//! ```
//!
//! Prints a Markdown report: ratios are what to compare across machines, not absolute times.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // a benchmark binary: panics are its errors

use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade::etcd::{EtcdConfig, EtcdLockService};
use palisade::{LockService, ResourceKey, Ttl};
use palisade_compare::baseline;
use palisade_compare::measure::{self, Handoff, Plan};

/// How many times the history section locks one resource without compacting.
const PILED: usize = 20_000;
/// Cycles at each end of the history section.
const ENDS: usize = 500;

fn ms(v: f64) -> String {
    format!("{v:.3}")
}

fn p(mut v: Vec<Duration>, pct: usize) -> f64 {
    v.sort_unstable();
    v[(v.len() - 1) * pct / 100].as_secs_f64() * 1e3
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url =
        std::env::var("PALISADE_ETCD_URL").expect("PALISADE_ETCD_URL: run scripts/services up, source .services/env");
    let config = EtcdConfig { session_ttl: Duration::from_secs(5), ..EtcdConfig::from_url(&url).unwrap() };
    let svc = Arc::new(EtcdLockService::connect_with(config.clone()).await.unwrap());
    let prefix = measure::run_prefix("bench");
    let plan = Plan::full();
    let ttl = Ttl::from_millis(2_000).unwrap();
    // The raw variants go through the service's own client and connection; their lease is
    // long enough for the whole run (nothing keeps it alive).
    let client = svc.client().clone();
    let raw_lease = baseline::etcd_lease(&client, 3600).await.unwrap();
    let compaction = baseline::etcd_compaction(&client);
    let variants = [
        baseline::etcd_txn("raw txn (create if absent, on a lease) + delete", &client, raw_lease, &prefix),
        baseline::etcd_same_txns(
            "the same two txns Palisade sends, through the raw client",
            &client,
            raw_lease,
            &prefix,
        ),
        baseline::service(
            "`try_acquire` + `release` (txn: no key under the prefix → put; delete)",
            Arc::clone(&svc),
            &prefix,
            ttl,
        ),
        baseline::lease(
            "`try_lock` + `Lease::release` (plus lease watchdog, metrics, spans)",
            Arc::clone(&svc),
            &prefix,
            ttl,
        ),
    ];
    let latency = measure::latency(&variants, &plan, Some(&compaction)).await.unwrap();
    let [raw, same, ours, lease] = &latency[..] else { unreachable!() };

    println!("# etcd lock service vs raw etcd operations\n");
    println!(
        "Loopback etcd, one run, measured by `palisade_compare::measure` (the code `palisade compare` uses): every \
         variant on the same keys ({} per task) and concurrency, warmed up, then the variants take turns for {} rounds, \
         etcd's history compacted before each turn; figures are medians over the rounds with their min–max.\n",
        plan.keys, plan.rounds
    );
    println!("## Uncontended acquire + release ({} cycles per variant per round, one task)\n", plan.cycles);
    println!("| path | p50 ms (rounds) | p99 ms | p50 ÷ raw | p50 ÷ the same txns raw |");
    println!("|---|---|---|---|---|");
    for l in [raw, same, ours, lease] {
        println!("| {} | {} | {:.2} | {:.2} |", l.name, l.cells(), l.ratio_to(raw), l.ratio_to(same));
    }
    println!();

    println!("## Throughput, a task's own keys, one client ({:.0}-s windows)\n", plan.window.as_secs_f64());
    println!("| tasks | raw /s | the same txns, raw /s | palisade /s | palisade ÷ raw | palisade ÷ same txns |");
    println!("|---|---|---|---|---|---|");
    for &tasks in &plan.concurrency {
        let rates = measure::throughput(&variants[..3], tasks, &plan, Some(&compaction)).await.unwrap();
        let [r, s, o] = &rates[..] else { unreachable!() };
        println!(
            "| {tasks} | {} | {} | {} | {:.2} | {:.2} |",
            r.per_sec.rate_cell(),
            s.per_sec.rate_cell(),
            o.per_sec.rate_cell(),
            o.ratio_to(r),
            o.ratio_to(s)
        );
    }
    println!();

    // One resource taken PILED times without compacting: its deleted contender keys pile up
    // under its prefix.
    compaction_now(&compaction).await;
    let hot = ResourceKey::new(format!("{prefix}hot"), "k").unwrap();
    let (mut fresh, mut piled) = (Vec::new(), Vec::new());
    for i in 0..PILED {
        let t = Instant::now();
        let g = svc.try_acquire(&hot, ttl).await.unwrap().unwrap();
        svc.release(&g).await.unwrap();
        if i < ENDS {
            fresh.push(t.elapsed());
        } else if i >= PILED - ENDS {
            piled.push(t.elapsed());
        }
    }
    compaction_now(&compaction).await;
    println!("## Without compaction\n");
    let (f50, l50) = (p(fresh.clone(), 50), p(piled.clone(), 50));
    println!(
        "One resource locked and released {PILED} times with no compaction: `try_acquire` + `release` p50 {} ms \
         (p99 {}) over the first {ENDS} cycles, {} ms (p99 {}) over the last {ENDS}, {:.2}×. Every acquire ranges over \
         the resource's key prefix, where etcd's index keeps each deleted contender key until a compaction: run etcd \
         with auto-compaction.\n",
        ms(f50),
        ms(p(fresh, 99)),
        ms(l50),
        ms(p(piled, 99)),
        l50 / f50
    );

    let handoff = Handoff::service(
        "`lock` waiting → `Lease::release` (watch on the contender ahead)",
        Arc::new(EtcdLockService::connect_with(config.clone()).await.unwrap()),
        Arc::new(EtcdLockService::connect_with(config).await.unwrap()),
        ResourceKey::new(&*prefix, "handoff").unwrap(),
        Duration::from_secs(2),
        Duration::from_millis(10),
    );
    let h = measure::handoffs(&[handoff], &plan).await.unwrap();
    let h = &h[0];
    let one_trip = raw.p50_ms / 2.0;
    println!("## Contended handoff (release returned → waiter holds), {} handoffs per round\n", plan.handoffs);
    println!(
        "p50 {} ms ({}–{}), p99 {} ms; one raw round trip (the raw cycle's p50, halved) ≈ {} ms: p50 handoff = {:.1} round trips\n",
        ms(h.p50_ms),
        ms(h.round_p50_ms.min),
        ms(h.round_p50_ms.max),
        ms(h.p99_ms),
        ms(one_trip),
        h.p50_ms / one_trip
    );
}

async fn compaction_now(hook: &measure::Hook) {
    hook.call().await.unwrap();
}
