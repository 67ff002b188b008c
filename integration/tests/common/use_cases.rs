//! Runs each use-case example on a lock service and store, and checks the guarantee it
//! demonstrates (from the JSON line it ends with). Included by `examples.rs` (embedded default)
//! and `examples_servers.rs` (Redis / etcd with PostgreSQL).

use serde_json::Value;

use crate::common::{example, last_json};

/// Runs example `name` with `--lock`/`--store` (none: the embedded default) and extra flags.
fn run_example(name: &str, backend: Option<(&str, &str)>, extra: &[&str]) -> Value {
    let mut cmd = example(name);
    if let Some((lock, store)) = backend {
        cmd.args(["--lock", lock, "--store", store]);
    }
    let out = cmd.args(extra).output().expect("spawn example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{name} failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    let json = last_json(&out);
    assert_eq!(json["example"], name, "{json}");
    json
}

pub fn nightly_aggregation(backend: Option<(&str, &str)>, extra: &[&str]) {
    let r = run_example("nightly-aggregation", backend, extra);
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["first_tick_runners"], 1, "exactly one scheduler runs at midnight: {r}");
    assert_eq!(r["first_tick_skipped"], 3, "{r}");
    assert_eq!(r["runs"], 2, "the frozen runner and the one that resumed: {r}");
    assert_eq!(r["stale_writes_refused"], 1, "the frozen runner's late ack: {r}");
    assert_eq!(r["result"], r["expected"], "{r}");
    assert!(r["result_fence"].as_u64().is_some_and(|f| f > 0), "{r}");
}

pub fn cache_refresh(backend: Option<(&str, &str)>, extra: &[&str]) {
    let r = run_example("cache-refresh", backend, extra);
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["cold_origin_fetches"], 1, "single flight: {r}");
    // The others waited for the result, or (late starters) found it already there.
    let others = r["cold_waited"].as_u64().unwrap() + r["cold_served_fresh"].as_u64().unwrap();
    assert_eq!(others, 15, "every other reader got the refreshed value: {r}");
    assert!(r["cold_waited"].as_u64().unwrap() > 0, "{r}");
    assert!(r["served_stale"].as_u64().unwrap() > 0, "readers served stale during the refresh: {r}");
    assert_eq!(r["stale_refresh_refused"], 1, "{r}");
    assert_eq!(r["final_version"], 3, "the newer refresh stays: {r}");
}

pub fn invoice_numbering(backend: Option<(&str, &str)>, extra: &[&str]) {
    let r = run_example("invoice-numbering", backend, extra);
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["invoices"], 40, "{r}");
    assert_eq!(r["gaps"], 0, "{r}");
    assert_eq!(r["orders_invoiced_twice"], 0, "{r}");
    assert_eq!(r["frozen"], 2, "{r}");
    assert_eq!(r["stale_refused"], 2, "both frozen workers were refused: {r}");
}

pub fn outbox_relay(backend: Option<(&str, &str)>, extra: &[&str]) {
    let r = run_example("outbox-relay", backend, extra);
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["published"], r["rows"], "{r}");
    assert_eq!(r["double_published"], 0, "{r}");
    assert!(r["lost_signal_stops"].as_u64().unwrap() >= 1, "the lost signal stopped a hung relay: {r}");
    assert!(r["stale_marks_refused"].as_u64().unwrap() >= 1, "a frozen leader's mark was refused: {r}");
    assert!(r["leaderships"].as_u64().unwrap() >= 3, "{r}");
}

pub fn rate_limit(backend: Option<(&str, &str)>, extra: &[&str]) {
    let r = run_example("rate-limit", backend, extra);
    assert_eq!(r["ok"], true, "{r}");
    assert!(r["most_in_flight"].as_i64().unwrap() <= 3, "never more calls in flight than permits: {r}");
    assert!(r["most_in_flight"].as_i64().unwrap() >= 2, "the permits were used side by side: {r}");
    assert_eq!(r["stale_refused"], 1, "the frozen worker's record under its lost permit: {r}");
    let calls = r["calls"].as_u64().unwrap();
    assert!(calls >= 80, "every worker made its calls: {r}");
    assert_eq!(r["recorded"].as_u64().unwrap(), calls - 1, "every other call recorded: {r}");
}

pub fn price_catalogue(backend: Option<(&str, &str)>, extra: &[&str]) {
    let r = run_example("price-catalogue", backend, extra);
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["torn_reads"], 0, "no price changed under a read lock: {r}");
    assert_eq!(r["reader_writer_overlaps"], 0, "{r}");
    assert!(r["most_readers_at_once"].as_i64().unwrap() >= 2, "readers shared the lock: {r}");
    assert!(r["most_readers_at_once"].as_i64().unwrap() <= 4, "never more readers than allowed: {r}");
    assert_eq!(r["stale_writes_refused"], 1, "the frozen writer's prices were refused: {r}");
    assert_eq!(r["stale_reads_refused"], 1, "the frozen reader did not serve its old price: {r}");
    assert!(r["repricings"].as_u64().unwrap() >= 9, "every other repricing landed: {r}");
}

pub fn metrics(backend: Option<(&str, &str)>, extra: &[&str]) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec!["--listen", &listen, "--jobs", "200"];
    args.extend_from_slice(extra);
    let r = run_example("metrics", backend, &args);
    assert!(r["palisade_lock_fence_rejected_total"].as_f64().unwrap() > 0.0, "paused holders were refused: {r}");
    assert!(r["palisade_lock_acquire_total"].as_f64().unwrap() >= 200.0, "{r}");
}

/// Where no other worker can take over (no other order of the tenant waits for a number, or
/// one worker), nobody freezes: the run never waits out the 60 s takeover bound.
pub fn invoice_numbering_without_a_takeover(backend: Option<(&str, &str)>, extra: &[&str]) {
    // (flags, invoices, freezes at most). With 3 invoices a tenant, order 5 is globex's last:
    // it freezes only if order 1 or 3 still waits for its number (workers take the lock in no
    // set order), and then that order takes over. With 4, order 7 may be issued before or after.
    let cases: [(&[&str], u64, u64); 3] =
        [(&["--invoices", "3"], 6, 1), (&["--invoices", "4"], 8, 1), (&["--workers", "1"], 40, 0)];
    for (flags, invoices, freezes) in cases {
        let flags = [flags, extra].concat();
        let started = std::time::Instant::now();
        let r = run_example("invoice-numbering", backend, &flags);
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "{flags:?} waited for a takeover: {r}");
        assert_eq!(r["ok"], true, "{flags:?}: {r}");
        assert_eq!(r["invoices"], invoices, "{flags:?}: {r}");
        assert!(r["frozen"].as_u64().unwrap() <= freezes, "{flags:?}: {r}");
        assert_eq!(r["stale_refused"], r["frozen"], "{flags:?}: every frozen worker was refused: {r}");
    }
}
