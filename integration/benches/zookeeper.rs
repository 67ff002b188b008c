//! The ZooKeeper lock service against the raw ZooKeeper operations it is built on, in one run.
//!
//! ```sh
//! scripts/services up && source .services/env
//! cargo bench -p palisade-integration --bench zookeeper
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // a benchmark binary: panics are its errors

use std::sync::Arc;
use std::time::Duration;

use palisade::zookeeper::{ZkConfig, ZkLockService};
use palisade::{ResourceKey, Ttl};
use palisade_compare::baseline;
use palisade_compare::measure::{self, Handoff, Plan};

fn ms(v: f64) -> String {
    format!("{v:.3}")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = format!("{}?session_timeout_ms=6000", std::env::var("PALISADE_ZK_URL").expect("PALISADE_ZK_URL"));
    let config = ZkConfig::from_url(&url).unwrap();
    let svc = Arc::new(ZkLockService::connect_with(config.clone()).await.unwrap());
    let prefix = measure::run_prefix("bench");
    let plan = Plan::full();
    let ttl = Ttl::from_millis(2_000).unwrap();
    // The raw variant goes through the service's own session.
    let client = svc.client().await.unwrap();
    let variants = [
        baseline::zk_create("raw create (ephemeral sequential) + delete", &client, &prefix, &plan).await.unwrap(),
        baseline::service(
            "`try_acquire` + `release` (create ‖ list children, one flight; delete)",
            Arc::clone(&svc),
            &prefix,
            ttl,
        ),
        baseline::lease(
            "`try_lock` + `Lease::release` (plus watchdog, metrics, spans)",
            Arc::clone(&svc),
            &prefix,
            ttl,
        ),
    ];
    let latency = measure::latency(&variants, &plan, None).await.unwrap();
    println!("# ZooKeeper lock service vs raw ZooKeeper operations\n");
    println!(
        "Standalone ZooKeeper on loopback, one run, measured by `palisade_compare::measure` (the code `palisade \
         compare` uses): every variant on the same keys ({} per task) and concurrency, warmed up, then the variants \
         take turns for {} rounds; figures are medians over the rounds with their min–max.\n",
        plan.keys, plan.rounds
    );
    println!("## Uncontended acquire + release ({} cycles per variant per round, one task)\n", plan.cycles);
    println!("| path | p50 ms (rounds) | p99 ms | p50 ÷ raw |");
    println!("|---|---|---|---|");
    for l in &latency {
        println!("| {} | {} | {:.2} |", l.name, l.cells(), l.ratio_to(&latency[0]));
    }
    println!("\n## Throughput, a task's own keys, one session ({:.0}-s windows)\n", plan.window.as_secs_f64());
    println!("| tasks | raw /s | palisade /s | `Lease` /s | palisade ÷ raw | `Lease` ÷ palisade |");
    println!("|---|---|---|---|---|---|");
    for &tasks in &plan.concurrency {
        let rates = measure::throughput(&variants, tasks, &plan, None).await.unwrap();
        let [r, o, l] = &rates[..] else { unreachable!() };
        println!(
            "| {tasks} | {} | {} | {} | {:.2} | {:.2} |",
            r.per_sec.rate_cell(),
            o.per_sec.rate_cell(),
            l.per_sec.rate_cell(),
            o.ratio_to(r),
            l.ratio_to(o)
        );
    }

    // Handoff: release returned → the waiter (watching our node) holds.
    let handoff = Handoff::service(
        "`lock` waiting → `Lease::release`",
        Arc::new(ZkLockService::connect_with(config.clone()).await.unwrap()),
        Arc::new(ZkLockService::connect_with(config).await.unwrap()),
        ResourceKey::new(&*prefix, "handoff").unwrap(),
        Duration::from_secs(3),
        Duration::from_millis(10),
    );
    let h = measure::handoffs(&[handoff], &plan).await.unwrap();
    let h = &h[0];
    let one_trip = latency[0].p50_ms / 2.0;
    println!(
        "\n## Contended handoff (release returned → waiter holds), {} handoffs per round\n\np50 {} ms ({}–{}), p99 {} ms; one raw round trip ≈ {} ms: p50 handoff = {:.1} round trips (one watch notification + one multi-read of the contenders and our own node)",
        plan.handoffs,
        ms(h.p50_ms),
        ms(h.round_p50_ms.min),
        ms(h.round_p50_ms.max),
        ms(h.p99_ms),
        ms(one_trip),
        h.p50_ms / one_trip
    );
}
