//! `palisade torture`, as CI runs it: every fenced lock service × store pair for a short run
//! under the nemesis on servers of its own, judged by the history checker; the same seed
//! drawing the same schedule; and the command's exit codes.
//!
//! Two tortures at a time at most (a gate below), whatever the test threads: each holds four
//! client processes and its servers, mostly waiting on TTLs and faults; two side by side on
//! this project's 2-core machine keep every call well inside its bound, and take half the
//! time of one at a time.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::process::{Command, Output};
use std::sync::{Condvar, Mutex, PoisonError};

use palisade_conformance::require_env;
use serde_json::Value;

/// How many tortures run at once.
const AT_ONCE: usize = 2;

/// Tortures running now, and the wake-up for those waiting.
static RUNNING: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

/// A place among the [`AT_ONCE`] tortures that may run, given back on drop.
struct Turn;

impl Turn {
    fn take() -> Turn {
        let (count, freed) = &RUNNING;
        let mut running = count.lock().unwrap_or_else(PoisonError::into_inner);
        while *running >= AT_ONCE {
            running = freed.wait(running).unwrap_or_else(PoisonError::into_inner);
        }
        *running += 1;
        Turn
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let (count, freed) = &RUNNING;
        *count.lock().unwrap_or_else(PoisonError::into_inner) -= 1;
        freed.notify_one();
    }
}

/// The CI run's length per pair: 25 s, of which the last 14 s are the quiet stretch the
/// progress check needs.
const DURATION: &str = "25s";

fn torture(args: &[&str]) -> (Output, Option<Value>, tempfile::TempDir) {
    let _turn = Turn::take();
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .arg("torture")
        .args(args)
        .arg("--out")
        .arg(out.path())
        .env("TMPDIR", "/dev/shm")
        .output()
        .expect("run palisade torture");
    let json = String::from_utf8_lossy(&output.stdout).lines().last().and_then(|l| serde_json::from_str(l).ok());
    (output, json, out)
}

/// A seed per pair, so a CI run replays; `PALISADE_TORTURE_SEED` draws others.
fn seed(pair: u64) -> String {
    let base: u64 = std::env::var("PALISADE_TORTURE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    (base * 100 + pair).to_string()
}

fn dynamodb(tag: &str) -> String {
    format!(
        "dynamodb://torture-{tag}-{}?endpoint={}&region=us-east-1",
        std::process::id(),
        require_env("PALISADE_DYNAMODB_ENDPOINT")
    )
}

fn runs_clean(pair: u64, lock: &str, store: &str) {
    runs_clean_with(pair, lock, store, &[]);
}

fn runs_clean_with(pair: u64, lock: &str, store: &str, more: &[&str]) {
    let seed = seed(pair);
    let mut args = vec!["--local", "--lock", lock, "--store", store, "--seed", &seed, "--duration", DURATION, "--json"];
    args.extend_from_slice(more);
    let (output, json, out) = torture(&args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let report = std::fs::read_to_string(out.path().join("report.md")).unwrap_or_default();
    assert_eq!(output.status.code(), Some(0), "{lock} × {store}, seed {seed}:\n{stderr}\n{report}");
    let json = json.expect("a JSON last line");
    assert_eq!(json["anomalies"], Value::Array(vec![]), "{json}");
    assert!(json["operations"].as_u64().unwrap() > 200, "the workload ran: {json}");
    assert!(json["writes"]["accepted"].as_u64().unwrap() > 50, "{json}");
    assert!(json["faults"].as_u64().unwrap() >= 2, "the nemesis ran: {json}");
    assert_eq!(json["faults"].as_u64(), json["schedule"].as_array().map(|s| s.len() as u64), "{json}");
    if lock.ends_with('3') && std::env::var_os("PALISADE_TORTURE_SEED").is_none() {
        let kills =
            json["schedule"].as_array().unwrap().iter().filter(|s| s["fault"].as_str().unwrap().contains("leader"));
        assert!(kills.count() >= 1, "the cluster's leader killed: {json}");
    }
    if lock == "sentinel" && std::env::var_os("PALISADE_TORTURE_SEED").is_none() {
        let failovers =
            json["schedule"].as_array().unwrap().iter().filter(|s| s["fault"].as_str().unwrap().contains("Sentinels"));
        assert!(failovers.count() >= 2, "the master failed over: {json}");
    }
    if more.contains(&"--hosts") && std::env::var_os("PALISADE_TORTURE_SEED").is_none() {
        let faults: Vec<&str> =
            json["schedule"].as_array().unwrap().iter().map(|s| s["fault"].as_str().unwrap()).collect();
        for kind in ["host off from the network", "host sends", "sent to client"] {
            assert!(faults.iter().any(|f| f.contains(kind)), "a fault with {kind:?} drawn: {json}");
        }
    }
    if more.contains(&"--clock-jumps") && std::env::var_os("PALISADE_TORTURE_SEED").is_none() {
        let faults: Vec<&str> =
            json["schedule"].as_array().unwrap().iter().map(|s| s["fault"].as_str().unwrap()).collect();
        for way in ["s ahead", "s back"] {
            assert!(faults.iter().any(|f| f.contains("wall clock") && f.contains(way)), "a clock {way:?}: {json}");
        }
    }
    assert!(json["allocations_applied"].as_u64().unwrap() > 10, "the warehouse's allocations ran: {json}");
    for file in ["history.jsonl", "report.md", "report.json", "timeline.svg"] {
        assert!(out.path().join(file).is_file(), "{file} written");
    }
    // The audits list the store, and promise a bound that grows with the allocations asked for.
    let invokes: Vec<serde_json::Value> = std::fs::read_to_string(out.path().join("history.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["ev"] == "invoke")
        .collect();
    let asked = invokes.iter().filter(|e| e["call"]["call"] == "allocate").count() as u64;
    let audits: Vec<&serde_json::Value> = invokes.iter().filter(|e| e["call"]["call"] == "audit").collect();
    assert_eq!(audits.len(), 3, "one audit a SKU");
    for audit in audits {
        assert_eq!(audit["within_ms"].as_u64(), Some(2_000 + 2 * asked), "{audit}");
    }
}

macro_rules! pairs {
    ($($name:ident: $n:expr, $lock:expr, $store:expr;)*) => {$(
        #[test]
        fn $name() {
            runs_clean($n, $lock, $store);
        }
    )*};
}

pairs! {
    redis_with_sqlite: 1, "redis", "sqlite";
    redis_with_postgres: 2, "redis", "postgres";
    redis_with_dynamodb: 3, "redis", &dynamodb("redis");
    etcd_with_sqlite: 4, "etcd", "sqlite";
    etcd_with_postgres: 5, "etcd", "postgres";
    etcd_with_dynamodb: 6, "etcd", &dynamodb("etcd");
    zookeeper_with_sqlite: 7, "zk", "sqlite";
    zookeeper_with_postgres: 8, "zk", "postgres";
    zookeeper_with_dynamodb: 9, "zk", &dynamodb("zk");
    postgres_on_its_own_database: 10, "postgres", "postgres";
    sqlite_on_its_own_file: 11, "sqlite", "sqlite";
}

/// A three-member cluster whose leader the schedule kills and starts again: seeds whose 9 s of
/// faults draw two leader kills each.
#[test]
fn etcd_cluster_with_postgres() {
    runs_clean(42, "etcd3", "postgres");
}

#[test]
fn zookeeper_ensemble_with_sqlite() {
    runs_clean(44, "zk3", "sqlite");
}

/// Redis behind Sentinels, failed over twice (seed 6 draws two failovers; the Sentinels allow
/// one every 10 s, so the run takes about 45 s).
#[test]
fn redis_sentinel_with_sqlite() {
    runs_clean(6, "sentinel", "sqlite");
}

/// Clients on hosts of their own (network namespaces): seeds whose faults cut a client's host
/// off the network once, and make one lose what it sends and one what it receives.
#[test]
fn redis_with_postgres_on_hosts() {
    runs_clean_with(192, "redis", "postgres", &["--hosts"]);
}

#[test]
fn etcd_with_sqlite_on_hosts() {
    runs_clean_with(252, "etcd", "sqlite", &["--hosts"]);
}

/// Clients whose wall clocks the schedule steps ahead and back (libfaketime): seeds that step
/// one ahead and one back. The store-native lock services judge expiry by a clock no one steps
/// (SQLite: the machine's monotonic clock; PostgreSQL: the server's).
#[test]
fn sqlite_on_its_own_file_with_clock_jumps() {
    runs_clean_with(84, "sqlite", "sqlite", &["--clock-jumps"]);
}

#[test]
fn postgres_on_its_own_database_with_clock_jumps() {
    runs_clean_with(37, "postgres", "postgres", &["--clock-jumps"]);
}

/// A client process started while the schedule holds its store down (restarted, partitioned)
/// keeps trying to connect instead of giving up and leaving its place empty for the rest of the
/// run (it used to give up after the library's own connect attempts, about 11 s, and sit idle
/// until told to stop); told to stop meanwhile, it stops.
#[test]
fn a_client_started_while_its_store_is_down_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let said = dir.path().join("client.err");
    let mut client = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .arg("torture-client")
        .args(["--lock", &format!("sqlite://{}/locks.db", dir.path().display())])
        .args(["--store", &format!("postgres://postgres@127.0.0.1:{closed}/postgres")])
        .args(["--ns", "down", "--process", "1", "--resources", "1", "--ttl-ms", "1000", "--wait-ms", "1000"])
        .args(["--seed", "1"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&said).unwrap())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(16));
    let gave_up = std::fs::read_to_string(&said).unwrap();
    assert!(gave_up.is_empty(), "the client gave up on a store that was down for 16 s: {gave_up}");
    drop(client.stdin.take());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while client.try_wait().unwrap().is_none() {
        // One connect attempt may be under way: the library's own, about 11 s.
        assert!(std::time::Instant::now() < deadline, "the client did not stop within 15 s of being told to");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn the_same_seed_draws_the_same_schedule() {
    let run = |seed: &str| {
        let (output, json, _out) = torture(&[
            "--local",
            "--lock",
            "sqlite",
            "--store",
            "sqlite",
            "--seed",
            seed,
            "--duration",
            "20s",
            "--json",
        ]);
        assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
        json.expect("a JSON last line")["schedule"].clone()
    };
    let first = run("4242");
    assert!(first.as_array().is_some_and(|s| !s.is_empty()), "{first}");
    assert_eq!(first, run("4242"), "the same seed, the same schedule");
}

#[test]
fn bad_input_and_pairs_it_cannot_judge_are_refused_with_reasons() {
    let fails = |args: &[&str], code: i32, says: &str| {
        let (output, _, _out) = torture(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?} should say {says:?}: {stderr}");
    };
    fails(&["--lock", "sqlite", "--store", "sqlite", "--duration", "ten"], 2, "not a duration");
    fails(&["--lock", "memory://", "--store", "memory://"], 3, "lives inside one process");
    let redlock = require_env("PALISADE_REDLOCK_URL");
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}/t.db", dir.path().display());
    fails(&["--lock", &redlock, "--store", &sqlite], 3, "issues no fence");
    fails(&["--local", "--lock", "sqlite", "--store", "sqlite", "--duration", "10s"], 3, "too short");
    fails(&["--local", "--lock", "mysql", "--store", "sqlite"], 3, "not \"mysql\"");
    fails(&["--local", "--hosts", "--lock", "sqlite", "--store", "sqlite"], 3, "nothing to cut");
}

/// A run against a broken implementation: its exit code, the anomaly kinds found, its JSON
/// last line (`Null` if none), and what to print on failure (`what`, the torture's stderr and
/// its report).
struct Judged {
    code: Option<i32>,
    kinds: Vec<String>,
    json: Value,
    said: String,
}

fn judged(what: &str, args: &[&str]) -> Judged {
    let (output, json, out) = torture(args);
    let kinds = json
        .as_ref()
        .map(|j| j["anomalies"].as_array().unwrap().iter().map(|a| a["kind"].as_str().unwrap().to_string()).collect())
        .unwrap_or_default();
    let report = std::fs::read_to_string(out.path().join("report.md")).unwrap_or_default();
    let said = format!("{what}: {}\n{report}", String::from_utf8_lossy(&output.stderr));
    Judged { code: output.status.code(), kinds, json: json.unwrap_or_default(), said }
}

/// How many runs a broken implementation (or a planted bug) gets: whether a frozen holder wakes
/// with writes left, or a killed one held a lock it had not yet extended, is the machine's
/// timing, not the schedule's.
const RUNS: usize = 3;

/// Passes when one of [`RUNS`] runs exits 1 with one of `kinds` among its anomalies, and
/// gives back that run.
fn found_within_runs(what: &str, seed: &str, kinds: &[&str], run: impl Fn() -> Judged) -> Judged {
    found_within(RUNS, what, seed, kinds, run)
}

/// Passes when one of `runs` runs exits 1 with one of `kinds` among its anomalies, and gives
/// back that run.
fn found_within(runs: usize, what: &str, seed: &str, kinds: &[&str], run: impl Fn() -> Judged) -> Judged {
    let mut said = String::new();
    for n in 1..=runs {
        let judged = run();
        let seen = &judged.kinds;
        eprintln!("{what}, seed {seed}, run {n}: found {seen:?}");
        if judged.code == Some(1) && kinds.iter().any(|k| seen.iter().any(|s| s == k)) {
            return judged;
        }
        assert!(judged.code == Some(0) || judged.code == Some(1), "{}", judged.said);
        said = format!("expected one of {kinds:?} in {runs} runs; the last found {seen:?}: {}", judged.said);
    }
    panic!("{said}");
}

/// The conformance suite's broken lock service (palisade-broken-lock), one flaw at a time,
/// living in this test's process and served to the torture's client processes by the
/// conformance crate's relay (`--lock relay://…`, through the clients' fault proxies), with a
/// SQLite store. The flaws a history can show are found; the control passes. Seed 725's 60 s
/// draw eleven client pauses or lock-service partitions longer than the TTL (what a late
/// release needs), seed 126's 25 s five client kills (what a lock that outlives its holder
/// needs); docs/torture/README.md lists the flaws the torture cannot see, and why.
mod broken_twins {
    use std::sync::Arc;

    use palisade_broken_lock::{BrokenLock, LockFlaw};
    use palisade_conformance::relay::Relay;

    use super::*;

    /// Runs the torture against `flaw` for `duration`, with `more` of its arguments.
    fn tortured(flaw: LockFlaw, seed: &str, duration: &str, more: &[&str]) -> Judged {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let relay = runtime.block_on(Relay::serve(Arc::new(BrokenLock::new(flaw).unwrap()))).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let lock = format!("relay://{}", relay.addr());
        let store = format!("sqlite://{}/t.db", dir.path().display());
        let mut args = vec!["--lock", &lock, "--store", &store, "--seed", seed, "--duration", duration, "--json"];
        args.extend_from_slice(more);
        judged(&format!("{flaw:?}"), &args)
    }

    fn found(flaw: LockFlaw, seed: &str, duration: &str, kinds: &[&str]) {
        found_within_runs(&format!("{flaw:?}"), seed, kinds, || tortured(flaw, seed, duration, &[]));
    }

    #[test]
    fn the_control_passes() {
        let run = tortured(LockFlaw::None, &seed(21), "25s", &[]);
        assert_eq!((run.code, run.kinds), (Some(0), vec![]), "{}", run.said);
    }

    #[test]
    fn no_exclusion_is_found() {
        found(LockFlaw::NoExclusion, &seed(22), "25s", &["overlap", "exclusion"]);
    }

    #[test]
    fn extend_does_nothing_is_found() {
        found(LockFlaw::ExtendDoesNothing, &seed(23), "25s", &["overlap"]);
    }

    #[test]
    fn release_ignores_token_is_found() {
        // A late release shows only where it frees a lock someone else holds, and a third
        // client takes it while the second's lease is still safe: the flaw needs contention.
        // On three resources (six, with the SKUs) a frozen holder often woke to a free lock or
        // an idle one: seeds 725 to 728 showed 1, 2, 0 and 0 overlaps, and CI once missed it
        // in three runs of seed 725. On one resource (a register and a SKU for four clients)
        // the same seeds showed 15, 10, 2 and 9, and four more runs of seed 725, two at a time
        // as CI runs them, 9, 11, 17 and 5.
        let (flaw, seed) = (LockFlaw::ReleaseIgnoresToken, seed(725));
        let kinds = ["overlap", "exclusion"];
        found_within_runs(&format!("{flaw:?}"), &seed, &kinds, || tortured(flaw, &seed, "60s", &["--resources", "1"]));
    }

    #[test]
    fn never_expires_is_found() {
        found(LockFlaw::NeverExpires, &seed(2805), "60s", &["no_progress"]);
    }

    #[test]
    fn overstates_ttl_is_found() {
        found(LockFlaw::OverstatesTtl, &seed(725), "60s", &["overlap"]);
    }

    #[test]
    fn renews_forever_is_found() {
        found(LockFlaw::RenewsForever, &seed(126), "25s", &["no_progress"]);
    }

    #[test]
    fn counter_deleted_with_lock_is_found() {
        found(LockFlaw::CounterDeletedWithLock, &seed(28), "25s", &["no_progress"]);
    }
}

/// The conformance suite's broken stores (palisade-broken-store), one flaw at a time, living in
/// this test's process and served to the torture's client processes by the conformance crate's
/// store relay (`--store relay://…`, through the clients' fault proxies; each connection a store
/// client of its own, as each process of a deployment has), under the broken lock service's
/// control over the lock relay. The registers and the warehouse's allocations are kept as
/// records in the store. A stale write needs a holder frozen past its TTL that wakes with writes
/// left: seed 725's 60 s draw eleven such pauses (or lock-service partitions). The flaws whose
/// harm needs no fault show in 25 s. docs/torture/README.md lists the flaws the torture cannot
/// see, and why.
mod broken_stores {
    use std::sync::Arc;

    use palisade_broken_lock::{BrokenLock, LockFlaw};
    use palisade_broken_store::{BrokenStore, StoreFlaw};
    use palisade_conformance::relay::{Relay, StoreRelay};

    use super::*;

    /// Runs the torture against a store with `flaw` (and a lock service with `lock`) for
    /// `duration`.
    fn tortured(lock: LockFlaw, flaw: StoreFlaw, seed: &str, duration: &str) -> Judged {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let locks = runtime.block_on(Relay::serve(Arc::new(BrokenLock::new(lock).unwrap()))).unwrap();
        let store = BrokenStore::new(flaw);
        let clients = palisade_conformance::store_factory(move || {
            let client = store.client();
            async move { Ok(Arc::new(client)) }
        });
        let stores = runtime.block_on(StoreRelay::serve(Arc::new(clients))).unwrap();
        let (lock, store) = (format!("relay://{}", locks.addr()), format!("relay://{}", stores.addr()));
        judged(
            &format!("{flaw:?}"),
            &["--lock", &lock, "--store", &store, "--seed", seed, "--duration", duration, "--json"],
        )
    }

    fn found(lock: LockFlaw, flaw: StoreFlaw, seed: &str, duration: &str, kinds: &[&str]) {
        found_within_runs(&format!("{flaw:?}"), seed, kinds, || tortured(lock, flaw, seed, duration));
    }

    #[test]
    fn the_control_passes() {
        let run = tortured(LockFlaw::None, StoreFlaw::None, &seed(31), "25s");
        assert_eq!((run.code, run.kinds), (Some(0), vec![]), "{}", run.said);
    }

    #[test]
    fn accepts_lower_fence_is_found() {
        found(LockFlaw::None, StoreFlaw::AcceptsLowerFence, &seed(725), "60s", &["fence_order"]);
    }

    #[test]
    fn silent_rejection_is_found() {
        // The stale write is acknowledged and never lands: its fence is out of order, and no
        // read sees its value.
        found(LockFlaw::None, StoreFlaw::SilentRejection, &seed(725), "60s", &["fence_order", "register"]);
    }

    #[test]
    fn watermark_in_client_is_found() {
        found(LockFlaw::None, StoreFlaw::WatermarkInClient, &seed(725), "60s", &["fence_order"]);
    }

    #[test]
    fn watermark_per_domain_is_found() {
        // A resource's holder is refused for a fence another resource's holder set.
        found(LockFlaw::None, StoreFlaw::WatermarkPerDomain, &seed(32), "25s", &["unjustified_refusal"]);
    }

    #[test]
    fn read_many_in_key_order_is_found() {
        // The warehouse reads the stock and the job's done mark in one `read_many`: swapped,
        // the stock reads as done, and every job is turned away as already done.
        found(LockFlaw::None, StoreFlaw::ReadManyInKeyOrder, &seed(33), "25s", &["unjustified_refusal"]);
    }

    #[test]
    fn accepts_equal_from_any_grant_is_found() {
        // A lock service that gives an expired holder's fence to the next holder issues one
        // fence twice; a holder frozen before its first write wakes and writes with the fence
        // its successor wrote with, which the store must refuse. (A fence at or below the
        // store's watermark at grant time never reaches the store: the clients' `lock_checked`
        // turns it away first, fencing rule 5.)
        //
        // The holder must be frozen between its grant and its first write, and another client
        // must take the lock over and write meanwhile. Runs of seed 725 showed it in 4 of 5
        // runs with the work a hold does before its first write (1 of 4 without it, which
        // failed CI), so it gets five runs where the other flaws get three.
        let (lock, flaw) = (LockFlaw::FenceNotIncreasedAfterExpiry, StoreFlaw::AcceptsEqualFromAnyGrant);
        let seed = seed(725);
        found_within(5, &format!("{flaw:?}"), &seed, &["duplicate_fence"], || tortured(lock, flaw, &seed, "60s"));
    }
}

/// The planted bugs (feature `planted-bugs`): each re-introduces a known bug in a real backend,
/// and the torture must find it from the history alone, name it, and exit 1, within the run's
/// stated duration. Each run's seed draws a schedule with the fault the bug needs (a schedule
/// is fixed by its seed number: the same every run). Each gets [`RUNS`] runs, as the broken
/// twins do: the seed number fixes when each fault lands, but whether a holder is holding then
/// is the machine's timing. The thinnest, the wall-clock bug, showed 1 to 7 overlaps in ten runs.
#[cfg(feature = "planted-bugs")]
mod planted {
    use super::*;

    // Seeds whose 30 s schedule (16 s of faults) has what each bug needs.
    /// Five clients killed: a client holds most of the time, and one kill while holding is
    /// enough (three kills were not, once in five runs).
    const SEED_KILLS: &str = "53";
    /// Seventeen clients frozen past their TTL in a 90 s run of SQLite × SQLite. A frozen holder
    /// writes stale only if it wakes with writes left, before its lost signal stops it, and
    /// another holder wrote meanwhile: four freezes in 30 s (Redis × SQLite, seed 245) missed
    /// once in CI, and eight in 40 s (seed 731) once in three runs.
    const SEED_PAUSES: &str = "2180";
    /// The SQLite lock service loses its table.
    const SEED_LOSE_SQLITE: &str = "2";

    fn found(bug: &str, lock: &str, store: &str, seed: &str, duration: &str, kinds: &[&str]) {
        found_with(bug, (lock, store), seed, duration, kinds, &[]);
    }

    fn found_with(bug: &str, (lock, store): (&str, &str), seed: &str, duration: &str, kinds: &[&str], more: &[&str]) {
        let mut args = vec![
            "--local",
            "--lock",
            lock,
            "--store",
            store,
            "--seed",
            seed,
            "--duration",
            duration,
            "--plant",
            bug,
            "--json",
        ];
        args.extend_from_slice(more);
        let run = found_within_runs(bug, seed, kinds, || judged(bug, &args));
        assert_eq!(run.json["planted"], bug, "{}", run.json);
        assert!(run.said.contains(&format!("**Planted bug** `{bug}`")), "the report names the bug: {}", run.said);
        assert!(run.said.contains("replay with: palisade torture --local --plant"), "{}", run.said);
    }

    /// Seed 42's 25 s step a client's wall clock 245 s back, then 1,142 s ahead: a holder
    /// whose clock is behind writes an expiry already past for everyone else, and a client
    /// whose clock is ahead sees every other hold as over.
    #[test]
    fn sqlite_lock_judged_by_wall_clock_is_found() {
        found_with(
            "sqlite-lock-judged-by-wall-clock",
            ("sqlite", "sqlite"),
            "42",
            "25s",
            &["overlap"],
            &["--clock-jumps"],
        );
    }

    #[test]
    fn redis_lock_outlives_its_ttl_is_found() {
        found("redis-lock-outlives-its-ttl", "redis", "sqlite", SEED_KILLS, "30s", &["no_progress"]);
    }

    #[test]
    fn redis_lock_expires_early_is_found() {
        // No fault needed: four clients contend for three resources, and every grant's lock
        // is free to the next after a quarter of its lease.
        found("redis-lock-expires-early", "redis", "sqlite", "1", "30s", &["overlap"]);
    }

    #[test]
    fn sqlite_store_accepts_stale_fences_is_found() {
        found(
            "sqlite-store-accepts-stale-fences",
            "sqlite",
            "sqlite",
            SEED_PAUSES,
            "90s",
            &["fence_order", "exclusion"],
        );
    }

    #[test]
    fn sqlite_lock_table_not_remade_is_found() {
        found("sqlite-lock-table-not-remade", "sqlite", "sqlite", SEED_LOSE_SQLITE, "30s", &["no_progress"]);
    }

    #[test]
    fn postgres_store_serves_stale_reads_is_found() {
        // No fault needed: readers in other processes see a second-old answer.
        found("postgres-store-serves-stale-reads", "redis", "postgres", "1", "30s", &["register"]);
    }
}
