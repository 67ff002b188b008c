//! The warehouse example's contract: flags, JSON output and exit codes, run as a real process.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

mod common;

use std::process::Output;

use common::{last_json, run};
use serde_json::Value;

fn store_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}/wh.db?synchronous=normal", dir.path().display())
}

fn simulate(dir: &tempfile::TempDir, pause_every: &str, extra: &[&str]) -> (Output, Value) {
    let store = store_url(dir);
    let mut args = vec![
        "simulate",
        "--store",
        &store,
        "--jobs",
        "240",
        "--workers",
        "4",
        "--skus",
        "4",
        "--ttl-ms",
        "100",
        "--pause-every",
        pause_every,
        "--pause-ms",
        "260",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = run(&args);
    let json = last_json(&out);
    (out, json)
}

#[test]
fn simulate_with_pauses_has_no_duplicates_fenced_and_some_unfenced() {
    let dir = tempfile::tempdir().unwrap();
    let (out, fenced) = simulate(&dir, "30", &[]);
    assert_eq!(out.status.code(), Some(0), "{fenced}");
    for field in ["jobs", "applied", "fence_rejected", "duplicates", "pauses", "elapsed_ms"] {
        assert!(fenced[field].is_u64(), "field {field} missing: {fenced}");
    }
    assert_eq!(fenced["jobs"], 240);
    assert_eq!(fenced["pauses"], 8);
    assert_eq!(fenced["duplicates"], 0, "{fenced}");
    assert_eq!(fenced["lost_updates"], 0, "{fenced}");
    assert_eq!(fenced["jobs_applied"], 240, "{fenced}");
    assert!(fenced["fence_rejected"].as_u64().unwrap() > 0, "paused holders must be refused: {fenced}");

    // Same file again: runs are namespaced, so the second run is unaffected by the first.
    let (out, unfenced) = simulate(&dir, "30", &["--unfenced"]);
    assert_eq!(out.status.code(), Some(0), "{unfenced}");
    assert_eq!(unfenced["mode"], "unfenced");
    assert_eq!(unfenced["fence_rejected"], 0);
    assert!(unfenced["duplicates"].as_u64().unwrap() > 0, "the naive lock ships twice: {unfenced}");
}

#[test]
fn simulate_without_pauses_is_clean_even_unfenced() {
    let dir = tempfile::tempdir().unwrap();
    let (out, r) = simulate(&dir, "0", &["--unfenced"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(r["pauses"], 0);
    assert_eq!(r["duplicates"], 0, "{r}");
}

#[test]
fn setup_allocate_show_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_url(&dir);
    let out = run(&["setup", "--sku", "SKU-1", "--qty", "5", "--store", &store]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));

    let out = run(&["allocate", "--sku", "SKU-1", "--qty", "2", "--store", &store, "--job", "order-1"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let events: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(events[0]["event"], "acquired");
    assert!(events[0]["fence"].is_u64());
    assert_eq!(events[1]["event"], "write");
    assert_eq!(events[1]["applied"], true);
    assert_eq!(events[1]["fence"], events[0]["fence"]);

    // The same job again is not applied twice (exit 5), even though the lock is free.
    let out = run(&["allocate", "--sku", "SKU-1", "--qty", "2", "--store", &store, "--job", "order-1"]);
    assert_eq!(out.status.code(), Some(5));
    assert_eq!(last_json(&out)["applied"], false);

    let shown = last_json(&run(&["show", "--sku", "SKU-1", "--store", &store]));
    assert_eq!(shown["qty"], 3);
    assert_eq!(shown["allocations"], 1);
    assert_eq!(shown["duplicate_jobs"], 0);
    assert!(shown["fence"].is_u64());

    let out = run(&["allocate", "--sku", "SKU-1", "--qty", "10", "--store", &store]);
    assert_eq!(out.status.code(), Some(1), "short stock is a runtime error");
    let out = run(&["allocate", "--sku", "NOPE", "--store", &store]);
    assert_eq!(out.status.code(), Some(1), "unknown SKU is a runtime error");
    let out = run(&["show", "--sku", "SKU-1", "--store", "postgres://nobody@127.0.0.1:1/none"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The example is built with every feature, so PostgreSQL is known and just unreachable.
    assert_eq!(out.status.code(), Some(1), "an unreachable server is a runtime error: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
}

#[test]
fn bad_input_exits_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_url(&dir);
    let cases: Vec<Vec<&str>> = vec![
        vec!["allocate", "--sku", "bad sku", "--store", &store],
        vec!["allocate", "--sku", "S", "--ttl-ms", "0", "--store", &store],
        vec!["allocate", "--sku", "S", "--ttl-ms", "999999999999", "--store", &store],
        vec!["setup", "--sku", "S", "--qty", "-1", "--store", &store],
        vec!["show", "--sku", "S", "--store", "ftp://nowhere"],
        vec!["show", "--sku", "S", "--store", "not a url"],
        vec!["allocate", "--sku", "S", "--lock", "redlock://127.0.0.1:1", "--store", &store],
        vec!["simulate", "--jobs", "0", "--store", &store],
        vec!["simulate", "--ttl-ms", "0", "--store", &store],
        vec!["frobnicate"],
    ];
    for args in cases {
        let out = run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: one line expected, got {stderr:?}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
