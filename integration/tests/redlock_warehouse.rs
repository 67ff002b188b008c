//! The warehouse on Redlock (three of the test command's masters, `PALISADE_REDLOCK_URL`):
//! `simulate` runs unfenced and shows what an efficiency lock lets through; the commands that
//! write with a fence refuse it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

mod common;

use common::{last_json, run};
use palisade_conformance::require_env;

fn three_masters() -> String {
    let all = require_env("PALISADE_REDLOCK_URL");
    let hosts: Vec<&str> = all.trim_start_matches("redlock://").split(',').take(3).collect();
    format!("redlock://{}?node_timeout_ms=250", hosts.join(","))
}

#[test]
fn simulate_on_redlock_is_unfenced_and_ships_twice() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}/wh.db?synchronous=normal", dir.path().display());
    let lock = three_masters();
    let out = run(&[
        "simulate",
        "--lock",
        &lock,
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
        "30",
        "--pause-ms",
        "260",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report = last_json(&out);
    assert_eq!(out.status.code(), Some(0), "{report} {stderr}");
    assert!(stderr.contains("issues no fence"), "no note that the run is unfenced: {stderr}");
    assert_eq!(report["mode"], "unfenced");
    assert_eq!(report["lock"], "redlock");
    assert_eq!(report["pauses"], 8);
    assert_eq!(report["fence_rejected"], 0, "{report}");
    assert!(report["duplicates"].as_u64().unwrap() > 0, "paused Redlock holders ship twice: {report}");
    assert_eq!(report["jobs_applied"], 240, "{report}");
}

#[test]
fn fenced_commands_refuse_redlock() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}/wh.db", dir.path().display());
    let lock = three_masters();
    for args in [
        vec!["allocate", "--sku", "S", "--lock", &lock, "--store", &store],
        vec!["setup", "--sku", "S", "--qty", "5", "--lock", &lock, "--store", &store],
    ] {
        let out = run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains("no fence"), "{stderr}");
    }
}
