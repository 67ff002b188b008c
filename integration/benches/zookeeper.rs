//! The ZooKeeper lock service against the raw ZooKeeper operations it is built on, in one run.
//!
//! ```sh
//! scripts/services up && source .services/env
//! cargo bench -p palisade-integration --bench zookeeper
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // a benchmark binary: panics are its errors

use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade::zookeeper::zookeeper_client as zk;
use palisade::zookeeper::{ZkConfig, ZkLockService};
use palisade::{LockService, LockServiceExt, ResourceKey, Ttl};

const CYCLES: usize = 400;
const ROUNDS: usize = 5;

fn pct(mut v: Vec<Duration>, p: usize) -> Duration {
    v.sort_unstable();
    v[(v.len() - 1) * p / 100]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

async fn raw(client: &zk::Client, parent: &str) -> Vec<Duration> {
    let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let mut lat = Vec::with_capacity(CYCLES);
    for _ in 0..CYCLES {
        let t = Instant::now();
        let (_, seq) = client.create(&format!("{parent}/raw-"), &[], &options).await.unwrap();
        client.delete(&format!("{parent}/raw-{seq}"), None).await.unwrap();
        lat.push(t.elapsed());
    }
    lat
}

async fn ours(svc: &Arc<ZkLockService>, prefix: &str, lease: bool) -> Vec<Duration> {
    let ttl = Ttl::from_millis(2_000).unwrap();
    let mut lat = Vec::with_capacity(CYCLES);
    for i in 0..CYCLES {
        let key = ResourceKey::new(prefix, format!("p{}", i % 64)).unwrap();
        let t = Instant::now();
        if lease {
            svc.try_lock(&key, ttl.get()).await.unwrap().unwrap().release().await.unwrap();
        } else {
            let g = svc.try_acquire(&key, ttl).await.unwrap().unwrap();
            svc.release(&g).await.unwrap();
        }
        lat.push(t.elapsed());
    }
    lat
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = format!("{}?session_timeout_ms=6000", std::env::var("PALISADE_ZK_URL").expect("PALISADE_ZK_URL"));
    let config = ZkConfig::from_url(&url).unwrap();
    let svc = Arc::new(ZkLockService::connect_with(config.clone()).await.unwrap());
    let prefix = format!("bench{}", std::process::id());
    let client = svc.client().await.unwrap();
    let parent = format!("/palisade-bench/{prefix}");
    client.mkdir(&parent, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    // Warm the parents and the connection.
    let _ = raw(&client, &parent).await;
    let _ = ours(&svc, &prefix, false).await;
    let (mut r, mut s, mut l) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        r.extend(raw(&client, &parent).await);
        s.extend(ours(&svc, &prefix, false).await);
        l.extend(ours(&svc, &prefix, true).await);
    }
    let base = pct(r.clone(), 50);
    println!("# ZooKeeper lock service vs raw ZooKeeper operations\n");
    println!(
        "Standalone ZooKeeper on loopback, one run; {} cycles per path in {ROUNDS} interleaved rounds.\n",
        CYCLES * ROUNDS
    );
    println!("| path | p50 ms | p99 ms | p50 ratio to raw |");
    println!("|---|---|---|---|");
    println!("| raw create (ephemeral sequential) + delete | {} | {} | 1.00 |", ms(base), ms(pct(r, 99)));
    for (name, v) in [
        ("`try_acquire` + `release` (create + list children + delete)", s),
        ("`try_lock` + `Lease::release` (plus watchdog, metrics, spans)", l),
    ] {
        let p50 = pct(v.clone(), 50);
        println!("| {name} | {} | {} | {:.2} |", ms(p50), ms(pct(v, 99)), p50.as_secs_f64() / base.as_secs_f64());
    }

    // Handoff: release returned → the waiter (watching our node) holds.
    let a = Arc::new(ZkLockService::connect_with(config.clone()).await.unwrap());
    let b = Arc::new(ZkLockService::connect_with(config).await.unwrap());
    let key = ResourceKey::new(&prefix, "handoff").unwrap();
    let mut handoffs = Vec::new();
    for _ in 0..100 {
        let held = a.lock(&key, Duration::from_secs(3), Duration::from_secs(5)).await.unwrap();
        let (b2, k2) = (Arc::clone(&b), key.clone());
        let waiter = tokio::spawn(async move {
            let lease = b2.lock(&k2, Duration::from_secs(3), Duration::from_secs(10)).await.unwrap();
            (Instant::now(), lease)
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        held.release().await.unwrap();
        let released = Instant::now();
        let (got, lease) = waiter.await.unwrap();
        handoffs.push(got.saturating_duration_since(released));
        lease.release().await.unwrap();
    }
    let one_trip = base / 2;
    let h50 = pct(handoffs.clone(), 50);
    println!(
        "\n## Contended handoff (release returned → waiter holds), 100 handoffs\n\np50 {} ms, p99 {} ms; one raw round trip ≈ {} ms: p50 handoff = {:.1} round trips (one watch notification + one multi-read of the contenders and our own node)",
        ms(h50),
        ms(pct(handoffs, 99)),
        ms(one_trip),
        h50.as_secs_f64() / one_trip.as_secs_f64()
    );
}
