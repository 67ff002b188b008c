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

const CYCLES: usize = 500;
const ROUNDS: usize = 5;

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
    let raw_lease = lease_client.grant(30, None).await.unwrap().id();

    let _ = raw_cycles(&svc, raw_lease, &prefix).await;
    let _ = palisade_cycles(&svc, &prefix, false).await;
    let (mut raw, mut service, mut lease) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        raw.extend(raw_cycles(&svc, raw_lease, &prefix).await);
        service.extend(palisade_cycles(&svc, &prefix, false).await);
        lease.extend(palisade_cycles(&svc, &prefix, true).await);
    }
    let (raw, service, lease) = (stats(raw), stats(service), stats(lease));
    println!("# etcd lock service vs raw etcd operations\n");
    println!("Loopback etcd, one run; ratios compare like with like in that run.\n");
    println!("## Uncontended acquire + release ({} cycles per path, {ROUNDS} interleaved rounds)\n", CYCLES * ROUNDS);
    println!("| path | p50 ms | p99 ms | p50 ratio to raw |");
    println!("|---|---|---|---|");
    println!("| raw txn (create if absent, on a lease) + delete | {} | {} | 1.00 |", ms(raw.p50), ms(raw.p99));
    let r = |s: &Stats| s.p50.as_secs_f64() / raw.p50.as_secs_f64();
    println!(
        "| `try_acquire` + `release` (txn: no key under the prefix → put; txn: compare revision → delete) | {} | {} | {:.2} |",
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
