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

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use palisade::etcd::{EtcdConfig, EtcdLockService};
use palisade::{LockService, LockServiceExt, ResourceKey, Ttl};

mod common;

const CYCLES: usize = 500;
const ROUNDS: usize = 5;
/// How many times the history section locks one resource without compacting.
const PILED: usize = 20_000;

struct Stats {
    p50: Duration,
    p99: Duration,
}

fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort_unstable();
    let at = |p: usize| v[(v.len() - 1) * p / 100];
    Stats { p50: at(50), p99: at(99) }
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

/// The raw equivalent on the same client and session lease: a create-if-absent txn that puts
/// a key on the lease, then a delete.
async fn raw_cycles(svc: &EtcdLockService, lease: i64, prefix: &str) -> Vec<Duration> {
    let mut kv = svc.client().kv_client();
    let mut lat = Vec::with_capacity(CYCLES);
    for i in 0..CYCLES {
        let key = format!("{prefix}/raw/{}", i % 64);
        let t = Instant::now();
        let txn = Txn::new().when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
            key.clone(),
            "token",
            Some(PutOptions::new().with_lease(lease)),
        )]);
        assert!(kv.txn(txn).await.unwrap().succeeded());
        kv.delete(key, None).await.unwrap();
        lat.push(t.elapsed());
    }
    lat
}

/// The very operations `try_acquire` + `release` send, through the raw client: a txn that
/// puts a contender key on the lease if no key exists under the resource's prefix, then a
/// delete of that key.
async fn shaped_cycles(svc: &EtcdLockService, lease: i64, prefix: &str) -> Vec<Duration> {
    let mut kv = svc.client().kv_client();
    let mut lat = Vec::with_capacity(CYCLES);
    for i in 0..CYCLES {
        let resource = format!("{prefix}/shaped/{}/", i % 64);
        let key = format!("{resource}{i}");
        let t = Instant::now();
        let txn = Txn::new()
            .when([Compare::create_revision(resource, CompareOp::Equal, 0).with_prefix()])
            .and_then([TxnOp::put(key.clone(), "token", Some(PutOptions::new().with_lease(lease)))]);
        assert!(kv.txn(txn).await.unwrap().succeeded());
        kv.delete(key, None).await.unwrap();
        lat.push(t.elapsed());
    }
    lat
}

/// Compacts etcd's history up to now. Every acquire ranges over the resource's key prefix, and
/// until a compaction etcd's index keeps every deleted contender key there: each variant starts
/// from the same compacted history, as under a server with auto-compaction.
async fn compact(svc: &EtcdLockService) {
    let mut kv = svc.client().kv_client();
    let now = kv.get("compact-probe", None).await.unwrap().header().unwrap().revision();
    // Already compacted to `now` (nothing written since the last call) is fine.
    if let Err(e) = kv.compact(now, None).await {
        assert!(e.to_string().contains("compacted"), "compaction failed: {e}");
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Which path a throughput window drives.
#[derive(Clone, Copy)]
enum Path {
    Raw,
    Shaped,
    Palisade,
}

/// Acquire + release cycles per second over `for_`, `tasks` tasks on keys of their own, one
/// client (its one connection multiplexed, as for the raw paths).
async fn throughput(
    svc: &Arc<EtcdLockService>,
    lease: i64,
    prefix: &str,
    path: Path,
    tasks: usize,
    window: Duration,
) -> f64 {
    common::cycles_per_second(tasks, window, |t, until| {
        let svc = Arc::clone(svc);
        let prefix = format!("{prefix}/tp{t}");
        async move {
            let mut kv = svc.client().kv_client();
            let key = ResourceKey::new(prefix.replace('/', "."), "k").unwrap();
            let ttl = Ttl::from_millis(2_000).unwrap();
            let mut n = 0u64;
            while Instant::now() < until {
                match path {
                    Path::Raw => {
                        let txn = Txn::new()
                            .when([Compare::create_revision(prefix.clone(), CompareOp::Equal, 0)])
                            .and_then([TxnOp::put(prefix.clone(), "token", Some(PutOptions::new().with_lease(lease)))]);
                        assert!(kv.txn(txn).await.unwrap().succeeded());
                        kv.delete(prefix.clone(), None).await.unwrap();
                    }
                    Path::Shaped => {
                        let resource = format!("{prefix}/");
                        let key = format!("{resource}{n}");
                        let txn = Txn::new()
                            .when([Compare::create_revision(resource, CompareOp::Equal, 0).with_prefix()])
                            .and_then([TxnOp::put(key.clone(), "token", Some(PutOptions::new().with_lease(lease)))]);
                        assert!(kv.txn(txn).await.unwrap().succeeded());
                        kv.delete(key, None).await.unwrap();
                    }
                    Path::Palisade => {
                        let g = svc.try_acquire(&key, ttl).await.unwrap().unwrap();
                        svc.release(&g).await.unwrap();
                    }
                }
                n += 1;
            }
            n
        }
    })
    .await
}

async fn palisade_cycles(svc: &Arc<EtcdLockService>, prefix: &str, with_lease: bool) -> Vec<Duration> {
    let ttl = Ttl::from_millis(2_000).unwrap();
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

async fn handoffs(a: Arc<EtcdLockService>, b: Arc<EtcdLockService>, prefix: &str) -> Stats {
    let key = ResourceKey::new(prefix, "handoff").unwrap();
    let mut lat = Vec::new();
    for _ in 0..100 {
        let held = a.lock(&key, Duration::from_secs(2), Duration::from_secs(5)).await.unwrap();
        let (b2, k2) = (Arc::clone(&b), key.clone());
        let waiter = tokio::spawn(async move {
            let lease = b2.lock(&k2, Duration::from_secs(2), Duration::from_secs(10)).await.unwrap();
            (Instant::now(), lease)
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        held.release().await.unwrap();
        let released = Instant::now();
        let (got, lease) = waiter.await.unwrap();
        lat.push(got.saturating_duration_since(released));
        lease.release().await.unwrap();
    }
    stats(lat)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url =
        std::env::var("PALISADE_ETCD_URL").expect("PALISADE_ETCD_URL: run scripts/services up, source .services/env");
    let config = EtcdConfig { session_ttl: Duration::from_secs(5), ..EtcdConfig::from_url(&url).unwrap() };
    let svc = Arc::new(EtcdLockService::connect_with(config.clone()).await.unwrap());
    let prefix = format!("bench{}", std::process::id());
    let mut lease_client = svc.client().lease_client();
    // Long enough for the whole run: nothing keeps it alive.
    let raw_lease = lease_client.grant(3600, None).await.unwrap().id();

    let _ = raw_cycles(&svc, raw_lease, &prefix).await;
    let _ = shaped_cycles(&svc, raw_lease, &prefix).await;
    let _ = palisade_cycles(&svc, &prefix, false).await;
    let (mut raw, mut shaped, mut service, mut lease) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        compact(&svc).await;
        raw.extend(raw_cycles(&svc, raw_lease, &prefix).await);
        compact(&svc).await;
        shaped.extend(shaped_cycles(&svc, raw_lease, &prefix).await);
        compact(&svc).await;
        service.extend(palisade_cycles(&svc, &prefix, false).await);
        compact(&svc).await;
        lease.extend(palisade_cycles(&svc, &prefix, true).await);
    }
    // One resource taken PILED times without compacting: its deleted contender keys pile up
    // under its prefix.
    compact(&svc).await;
    let hot = ResourceKey::new(format!("{prefix}hot"), "k").unwrap();
    let ttl = Ttl::from_millis(2_000).unwrap();
    let (mut fresh, mut piled) = (Vec::new(), Vec::new());
    for i in 0..PILED {
        let t = Instant::now();
        let g = svc.try_acquire(&hot, ttl).await.unwrap().unwrap();
        svc.release(&g).await.unwrap();
        if i < CYCLES {
            fresh.push(t.elapsed());
        } else if i >= PILED - CYCLES {
            piled.push(t.elapsed());
        }
    }
    let (fresh, piled) = (stats(fresh), stats(piled));
    compact(&svc).await;
    let (raw, shaped, service, lease) = (stats(raw), stats(shaped), stats(service), stats(lease));
    println!("# etcd lock service vs raw etcd operations\n");
    println!("Loopback etcd, one run; ratios compare like with like in that run.\n");
    println!(
        "## Uncontended acquire + release ({} cycles per path, {ROUNDS} interleaved rounds, history compacted before each)\n",
        CYCLES * ROUNDS
    );
    println!("| path | p50 ms | p99 ms | p50 ratio to raw | p50 ratio to the same txns raw |");
    println!("|---|---|---|---|---|");
    let r = |s: &Stats| s.p50.as_secs_f64() / raw.p50.as_secs_f64();
    let q = |s: &Stats| s.p50.as_secs_f64() / shaped.p50.as_secs_f64();
    println!(
        "| raw txn (create if absent, on a lease) + delete | {} | {} | 1.00 | {:.2} |",
        ms(raw.p50),
        ms(raw.p99),
        q(&raw)
    );
    println!(
        "| the same two txns Palisade sends, through the raw client | {} | {} | {:.2} | 1.00 |",
        ms(shaped.p50),
        ms(shaped.p99),
        r(&shaped)
    );
    println!(
        "| `try_acquire` + `release` (txn: no key under the prefix → put; delete) | {} | {} | {:.2} | {:.2} |",
        ms(service.p50),
        ms(service.p99),
        r(&service),
        q(&service)
    );
    println!(
        "| `try_lock` + `Lease::release` (plus lease watchdog, metrics, spans) | {} | {} | {:.2} | {:.2} |\n",
        ms(lease.p50),
        ms(lease.p99),
        r(&lease),
        q(&lease)
    );
    println!("## Without compaction\n");
    println!(
        "One resource locked and released {PILED} times with no compaction: `try_acquire` + `release` p50 {} ms \
         (p99 {}) over the first {CYCLES} cycles, {} ms (p99 {}) over the last {CYCLES}, {:.2}×. Every acquire ranges over \
         the resource's key prefix, where etcd's index keeps each deleted contender key until a compaction: run etcd \
         with auto-compaction.\n",
        ms(fresh.p50),
        ms(fresh.p99),
        ms(piled.p50),
        ms(piled.p99),
        piled.p50.as_secs_f64() / fresh.p50.as_secs_f64()
    );

    println!(
        "## Throughput, a key per task, one client (median of three interleaved 2-s windows, compacted before each)\n"
    );
    println!(
        "| tasks | raw txn + delete /s | the same txns as Palisade, raw /s | palisade /s | palisade ÷ raw | palisade ÷ same txns |"
    );
    println!("|---|---|---|---|---|---|");
    for tasks in [1, 16, 64] {
        let (mut raws, mut shapeds, mut ours) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..3 {
            let window = Duration::from_secs(2);
            compact(&svc).await;
            raws.push(throughput(&svc, raw_lease, &prefix, Path::Raw, tasks, window).await);
            compact(&svc).await;
            shapeds.push(throughput(&svc, raw_lease, &prefix, Path::Shaped, tasks, window).await);
            compact(&svc).await;
            ours.push(throughput(&svc, raw_lease, &prefix, Path::Palisade, tasks, window).await);
        }
        let (raw_tp, shaped_tp, our_tp) = (median(raws), median(shapeds), median(ours));
        println!(
            "| {tasks} | {raw_tp:.0} | {shaped_tp:.0} | {our_tp:.0} | {:.2} | {:.2} |",
            our_tp / raw_tp,
            our_tp / shaped_tp
        );
    }
    println!();

    let a = Arc::new(EtcdLockService::connect_with(config.clone()).await.unwrap());
    let b = Arc::new(EtcdLockService::connect_with(config).await.unwrap());
    let h = handoffs(a, b, &prefix).await;
    println!("## Contended handoff (release returned → waiter holds), 100 handoffs\n");
    println!(
        "p50 {} ms, p99 {} ms; one raw round trip (p50 of create txn + delete, halved) ≈ {} ms: p50 handoff = {:.1} round trips\n",
        ms(h.p50),
        ms(h.p99),
        ms(raw.p50 / 2),
        h.p50.as_secs_f64() / (raw.p50.as_secs_f64() / 2.0)
    );
}
