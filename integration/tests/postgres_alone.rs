//! PostgreSQL alone: the lock service and the data in one database (started by `scripts/test`),
//! no Redis, etcd or ZooKeeper. The warehouse takes its locks from the store's database when
//! `--lock` is not given; the incident's SIGSTOP and SIGKILL chaos tests on real `warehouse
//! allocate` processes, and the warehouse simulation.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

mod common;

use std::time::{Duration, Instant};

use common::{last_json, run, unique_sku};
use nix::sys::signal::{Signal, kill};
use palisade_conformance::require_env;

fn database() -> String {
    require_env("PALISADE_POSTGRES_URL")
}

/// `allocate` with no `--lock`: the lock comes from the store's database.
fn allocator(
    store: &str,
    sku: &str,
    ttl_ms: u64,
    think_ms: u64,
) -> (std::process::Child, impl FnMut() -> serde_json::Value) {
    use std::io::BufRead;
    let mut child = common::warehouse()
        .args(["allocate", "--store", store, "--sku", sku, "--qty", "1"])
        .args(["--ttl-ms", &ttl_ms.to_string(), "--think-ms", &think_ms.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    (child, move || serde_json::from_str(&lines.next().expect("allocate said nothing").unwrap()).unwrap())
}

fn pid(child: &std::process::Child) -> nix::unistd::Pid {
    nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap())
}

/// The incident's chaos test with nothing but PostgreSQL: a holder process frozen past its TTL, a
/// second process allocates, the first thaws and is refused (exit 3); one decrement.
#[test]
fn sigstop_holder_is_refused_with_postgres_alone() {
    let store = database();
    let sku = unique_sku("PGSTOP");
    let out = run(&["setup", "--store", &store, "--sku", &sku, "--qty", "10"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));

    let (mut a, mut next) = allocator(&store, &sku, 1000, 3000);
    let acquired = next();
    assert_eq!(acquired["event"], "acquired");
    kill(pid(&a), Signal::SIGSTOP).unwrap();
    std::thread::sleep(Duration::from_millis(1300));

    let b = run(&["allocate", "--store", &store, "--sku", &sku, "--ttl-ms", "5000"]);
    assert_eq!(b.status.code(), Some(0), "{}", String::from_utf8_lossy(&b.stderr));
    assert!(last_json(&b)["fence"].as_u64() > acquired["fence"].as_u64());

    kill(pid(&a), Signal::SIGCONT).unwrap();
    let wrote = next();
    assert_eq!(a.wait().unwrap().code(), Some(3), "the thawed holder must be refused: {wrote}");
    assert_eq!(wrote["reason"], "stale_fence");
    let shown = last_json(&run(&["show", "--store", &store, "--sku", &sku]));
    assert_eq!(shown["qty"], 9, "exactly one decrement: {shown}");
    assert_eq!(shown["duplicate_jobs"], 0, "{shown}");
}

/// SIGKILL of the holder: the lock expires by the server's clock at its TTL, and the next
/// process allocates; fences continue across processes.
#[test]
fn sigkill_holder_is_replaced_within_ttl_with_postgres_alone() {
    let store = database();
    let sku = unique_sku("PGKILL");
    let out = run(&["setup", "--store", &store, "--sku", &sku, "--qty", "10"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let first = last_json(&out)["fence"].as_u64().unwrap();
    let (mut a, mut next) = allocator(&store, &sku, 1000, 30_000);
    let acquired = next();
    assert_eq!(acquired["fence"].as_u64(), Some(first + 1), "the counter is per resource, gap-free: {acquired}");
    let killed = Instant::now();
    kill(pid(&a), Signal::SIGKILL).unwrap();
    let _ = a.wait();
    let b = run(&["allocate", "--store", &store, "--sku", &sku, "--ttl-ms", "5000"]);
    let took = killed.elapsed();
    assert_eq!(b.status.code(), Some(0), "{}", String::from_utf8_lossy(&b.stderr));
    assert_eq!(last_json(&b)["fence"].as_u64(), Some(first + 2));
    assert!(took < Duration::from_millis(1000 + 2000), "next holder took {took:?}");
}

/// The warehouse simulation on PostgreSQL alone: no duplicate fenced, some unfenced.
#[test]
fn the_warehouse_simulation_with_postgres_alone() {
    let store = database();
    let sim = |extra: &[&str]| {
        let out = common::warehouse()
            .args(["simulate", "--store", &store, "--jobs", "400", "--workers", "16", "--skus", "8"])
            .args(["--ttl-ms", "300", "--pause-every", "40", "--json"])
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        last_json(&out)
    };
    let fenced = sim(&[]);
    assert_eq!(fenced["lock"], "postgres", "{fenced}");
    assert_eq!(fenced["duplicates"], 0, "{fenced}");
    assert!(fenced["fence_rejected"].as_u64().unwrap() > 0, "paused holders were refused: {fenced}");
    let unfenced = sim(&["--unfenced"]);
    assert!(unfenced["duplicates"].as_u64().unwrap() > 0, "the naive lock ships twice: {unfenced}");
}
