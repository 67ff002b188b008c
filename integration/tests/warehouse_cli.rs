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

/// Every third job a transfer between two SKUs, every 30th job's holder paused past its TTL
/// (every pause lands on a transfer): fenced, stock is conserved and no transfer is half
/// applied; unfenced, the naive transfers' stale writes lose updates and stock is not conserved.
#[test]
fn simulate_with_transfers_conserves_stock_fenced_and_not_unfenced() {
    let dir = tempfile::tempdir().unwrap();
    let (out, fenced) = simulate(&dir, "30", &["--transfer-every", "3"]);
    assert_eq!(out.status.code(), Some(0), "{fenced}");
    assert_eq!(fenced["stock_conserved"], true, "{fenced}");
    assert_eq!(fenced["half_applied"], 0, "{fenced}");
    assert_eq!(fenced["duplicates"], 0, "{fenced}");
    assert_eq!(fenced["transfer_jobs_applied"], 80, "{fenced}");
    assert_eq!(fenced["jobs_applied"], 160, "{fenced}");
    assert_eq!(fenced["shipped"], 160, "{fenced}");
    assert!(fenced["fence_rejected"].as_u64().unwrap() > 0, "paused transfers must be refused: {fenced}");

    let (out, unfenced) = simulate(&dir, "30", &["--transfer-every", "3", "--unfenced"]);
    assert_eq!(out.status.code(), Some(0), "{unfenced}");
    assert_eq!(unfenced["stock_conserved"], false, "the naive transfers lose updates: {unfenced}");

    let store = store_url(&dir);
    let out = run(&["simulate", "--store", &store, "--jobs", "10", "--skus", "1", "--transfer-every", "3"]);
    assert_eq!(out.status.code(), Some(2), "a transfer needs two SKUs");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--skus"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn transfer_moves_stock_under_both_locks_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_url(&dir);
    for (sku, qty) in [("SKU-A", "5"), ("SKU-B", "0")] {
        let out = run(&["setup", "--sku", sku, "--qty", qty, "--store", &store]);
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let transfer = |qty: &str, job: &str| {
        run(&["transfer", "--from", "SKU-A", "--to", "SKU-B", "--qty", qty, "--store", &store, "--job", job])
    };
    let out = transfer("2", "move-1");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let events: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(events[0]["event"], "acquired");
    assert!(events[0]["fences"]["SKU-A"].is_u64() && events[0]["fences"]["SKU-B"].is_u64(), "{}", events[0]);
    assert_eq!(events[1], serde_json::json!({"event": "write", "applied": true}));
    let qty = |sku: &str| last_json(&run(&["show", "--sku", sku, "--store", &store]))["qty"].clone();
    assert_eq!((qty("SKU-A"), qty("SKU-B")), (Value::from(3), Value::from(2)));

    let out = transfer("2", "move-1");
    assert_eq!(out.status.code(), Some(5), "the same job is not applied twice");
    assert_eq!(last_json(&out)["reason"], "already_done");
    let out = transfer("10", "move-2");
    assert_eq!(out.status.code(), Some(1), "short stock is a runtime error");
    assert_eq!((qty("SKU-A"), qty("SKU-B")), (Value::from(3), Value::from(2)), "nothing moved");
    let out = run(&["transfer", "--from", "SKU-A", "--to", "SKU-A", "--store", &store]);
    assert_eq!(out.status.code(), Some(2), "the same SKU twice is bad input");
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim_end().lines().count(), 1);
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

/// Flags that name a flag in their error: quantities, absurd durations, negative numbers. Each
/// is exit 2 with one line on stderr that names the flag.
#[test]
fn out_of_range_numbers_name_their_flag() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_url(&dir);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["allocate", "--sku", "S", "--qty", "0"], "--qty"),
        (vec!["allocate", "--sku", "S", "--qty", "-5"], "--qty"),
        (vec!["setup", "--sku", "S", "--qty", "-5"], "--qty"),
        (vec!["setup", "--sku", "S", "--qty", "4294967296"], "--qty"),
        (vec!["allocate", "--sku", "S", "--ttl-ms", "-1"], "--ttl-ms"),
        (vec!["allocate", "--sku", "S", "--wait-ms", "86400001"], "--wait-ms"),
        (vec!["allocate", "--sku", "S", "--think-ms", "3600001"], "--think-ms"),
        (vec!["simulate", "--pause-ms", "99999999999"], "--pause-ms"),
        (vec!["simulate", "--ttl-ms", "600001"], "--ttl-ms"),
    ];
    for (mut args, flag) in cases {
        args.extend(["--store", &store]);
        let out = run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: the message must name {flag}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr:?}");
    }
    // Nothing was written by any of them: not even the database file.
    assert!(!dir.path().join("wh.db").exists(), "a refused command created the database");
}

/// The embedded default keeps its lock counter in the data's own file: a second process
/// continues the fences instead of starting again at 1 and repairing a "regression" by 2³⁰.
#[test]
fn the_embedded_default_never_regresses_across_runs() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_url(&dir);
    for qty in ["5", "7"] {
        let out = run(&["setup", "--sku", "SKU-1", "--qty", qty, "--store", &store]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        assert!(!stderr.contains("REGRESSION"), "{stderr}");
    }
    let shown = last_json(&run(&["show", "--sku", "SKU-1", "--store", &store]));
    assert_eq!(shown["qty"], 7, "{shown}");
    assert_eq!(shown["fence"], 2, "two grants, two consecutive fences: {shown}");

    // An in-process lock service over the same file does start again at 1 in every process:
    // the repair happens, and it is visible on stderr without any configuration.
    let out = run(&["setup", "--sku", "SKU-1", "--qty", "9", "--store", &store, "--lock", "memory://"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("FENCE REGRESSION"), "the regression log must be visible by default: {stderr}");
    let fence = last_json(&out)["fence"].as_u64().unwrap();
    assert!(fence > palisade::REGRESSION_GAP, "repaired past the watermark: {fence}");
}

/// `--wait-ms 0` tries once: it takes a free lock, and on a held one gives up at once (exit 1)
/// instead of waiting. The default lock service coordinates processes through the file.
#[test]
fn wait_zero_tries_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_url(&dir);
    let out = run(&["setup", "--sku", "SKU-1", "--qty", "5", "--store", &store]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run(&["allocate", "--sku", "SKU-1", "--wait-ms", "0", "--store", &store]);
    assert_eq!(out.status.code(), Some(0), "a free lock: {}", String::from_utf8_lossy(&out.stderr));

    // Another process holds the lock while it "thinks".
    let mut holder = common::warehouse()
        .args(["allocate", "--sku", "SKU-1", "--think-ms", "20000", "--store", &store])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()), &mut first).unwrap();
    assert!(first.contains("acquired"), "{first}");
    let started = std::time::Instant::now();
    let out = run(&["allocate", "--sku", "SKU-1", "--wait-ms", "0", "--store", &store]);
    let elapsed = started.elapsed();
    holder.kill().unwrap();
    holder.wait().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "a held lock is a runtime outcome: {stderr}");
    assert!(stderr.contains("tries once"), "{stderr}");
    assert!(elapsed < std::time::Duration::from_secs(15), "it waited for the holder: {elapsed:?}");
}

/// An SQLite path that cannot be opened is a configuration mistake (exit 2) that names the
/// path; `show` never creates a database.
#[test]
fn unopenable_and_missing_databases_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let nowhere = format!("sqlite://{}/no-such-dir/wh.db", dir.path().display());
    let out = run(&["setup", "--sku", "S", "--qty", "1", "--store", &nowhere]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no-such-dir/wh.db"), "{stderr}");

    let typo = dir.path().join("typo.db");
    let out = run(&["show", "--sku", "S", "--store", &format!("sqlite://{}", typo.display())]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("typo.db"), "{stderr}");
    assert!(!typo.exists(), "show created {}", typo.display());
}
