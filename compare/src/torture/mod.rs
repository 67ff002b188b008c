//! `palisade torture`: a lock service × store pair under a random fault schedule drawn from a
//! seed, every client call recorded in a history, and the history judged by a checker that
//! knows nothing of the code under test (`palisade-history`).
//!
//! The clients are processes of their own (`palisade torture-client`), so that a holder can be
//! frozen with `SIGSTOP` and killed with `SIGKILL` like any real one. Each reaches the lock
//! service and the store through fault proxies of its own (`palisade_conformance::proxy`), so
//! one holder can be cut off, lose a reply or hear it late while the others carry on (a
//! service whose servers announce the addresses clients dial, Redis behind Sentinels or a
//! Redis Cluster, and a SQLite file are reached directly). With `--local` the servers are the
//! run's own, and the schedule also pauses, restarts and fails them over. With `--hosts` each
//! client is on a network namespace of its own, which the schedule cuts off the network or
//! makes lose its traffic one way.

pub mod client;
mod nemesis;
mod report;
pub mod schedule;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use palisade_history::{Bounds, History};

use self::schedule::Menu;

/// The bound a client promises for one call to a server (a read, a write, an extend, a
/// release), and on top of an acquire's wait: the longest the library's own call timeouts
/// and resends take when nothing is faulted.
pub const CALL_MS: u64 = 2_000;

/// What an audit, process 0's listing of the store after the run, promises on top of a call's
/// bound for each record an allocation may have written (its done mark and its audit row): a
/// listing reads what it lists (DynamoDB's reads the whole table), so its bound grows with the
/// run. 1 ms a record allows some 8 s for a page of 1 MB of the warehouse's records, which
/// DynamoDB reads in a fraction of a second and the DynamoDB emulator the tests run in a few.
pub const LIST_MS_PER_RECORD: u64 = 1;

/// What the checker adds to each call's promised bound: a loaded 2-core machine.
const ALLOWANCE_MS: u64 = 3_000;

/// `palisade torture` flags.
#[derive(Debug, Clone, Args)]
pub struct TortureArgs {
    /// The lock service's URL (a fenced one: redis://, etcd://, zk://, postgres://, sqlite://, or
    /// relay://HOST:PORT for a service in another process served by the conformance crate's relay);
    /// with --local, the kind of server to start: redis, etcd, zk, postgres or sqlite, a
    /// three-member cluster whose leader the schedule kills (etcd3 or zk3), or sentinel (a Redis
    /// master and replica behind three Sentinels, which the schedule fails over).
    #[arg(long)]
    pub lock: String,
    /// The fenced store's URL (sqlite://PATH, postgres://, dynamodb://TABLE?endpoint=…, or
    /// relay://HOST:PORT for a store in another process served by the conformance crate's store
    /// relay); with --local: sqlite or postgres.
    #[arg(long)]
    pub store: String,
    /// Draws the fault schedule and the clients' choices: the same seed, duration and pair
    /// draw the same schedule. Default: a random one, printed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// How long to run: `90s`, `10m`, `1h` (a bare number is seconds). The last stretch is
    /// quiet, for the progress check.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Start the servers (loopback, data of their own), stop them after, and let the schedule
    /// pause and restart them too.
    #[arg(long)]
    pub local: bool,
    /// Run each client on a host of its own (a Linux network namespace on a bridge; needs root
    /// and iproute2), so that the schedule also cuts a client's host off the network and makes
    /// it lose what it sends or what it receives. The servers stay where they are; the clients
    /// reach them through fault proxies on the bridge.
    #[arg(long)]
    pub hosts: bool,
    /// Run each client under libfaketime (Debian: `apt install libfaketime`), so that the
    /// schedule also steps a client's wall clock ahead or back (its monotonic clock runs on).
    #[arg(long)]
    pub clock_jumps: bool,
    /// Client processes.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(2..=32))]
    pub clients: u64,
    /// Resources of each kind: registers (r0, r1, …) and SKUs of the warehouse (s0, s1, …), each
    /// with a lock of its own.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub resources: u64,
    /// The clients' lease TTL, in milliseconds.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(200..=60_000))]
    pub ttl_ms: u64,
    /// How long a client waits for a lock, in milliseconds.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    pub wait_ms: u64,
    /// Where to write history.jsonl, report.md, report.json and timeline.svg.
    #[arg(long, default_value = "target/torture")]
    pub out: PathBuf,
    /// Also print the JSON report on stdout (last line).
    #[arg(long)]
    pub json: bool,
    /// Re-introduce a known bug in the clients' backend (test fixtures, in builds with the
    /// feature `planted-bugs` only), to see the torture find it: redis-lock-outlives-its-ttl,
    /// redis-lock-expires-early, sqlite-store-accepts-stale-fences, sqlite-lock-table-not-remade,
    /// sqlite-lock-judged-by-wall-clock, postgres-store-serves-stale-reads.
    #[arg(long, value_name = "BUG")]
    pub plant: Option<String>,
}

/// The bugs `--plant` can re-introduce, and what each breaks.
pub const PLANTED_BUGS: &[(&str, &str)] = &[
    (
        "redis-lock-outlives-its-ttl",
        "Redis: acquire and extend send the server a TTL a thousand times the grant's (a unit slip), so a killed \
         holder's lock stays held (no progress)",
    ),
    (
        "redis-lock-expires-early",
        "Redis: acquire and extend send the server a quarter of the grant's TTL, so the lock is free again while \
         its holder is still told it is safe (overlapping holds; the store's fences keep the data in order)",
    ),
    (
        "sqlite-store-accepts-stale-fences",
        "SQLite store: a write refused by the watermark goes ahead anyway (fence order, exclusion)",
    ),
    (
        "sqlite-lock-table-not-remade",
        "SQLite lock service: a lock table dropped under it is not made again (no progress)",
    ),
    (
        "sqlite-lock-judged-by-wall-clock",
        "SQLite lock service: expiry judged by the wall clock alone, as before it was judged by the monotonic \
         clock, so a client whose clock is stepped ends or keeps holds wrongly (overlapping holds; needs \
         --clock-jumps)",
    ),
    (
        "postgres-store-serves-stale-reads",
        "PostgreSQL store: reads go through a cache that keeps an answer for a second, as a lagging replica \
         would (the register is not linearizable)",
    ),
];

/// Checks `--plant`: a bug this build carries.
fn planted(name: Option<&str>) -> Result<Option<&'static str>, String> {
    let Some(name) = name else { return Ok(None) };
    let Some((known, _)) = PLANTED_BUGS.iter().find(|(n, _)| *n == name) else {
        let names: Vec<&str> = PLANTED_BUGS.iter().map(|(n, _)| *n).collect();
        return Err(format!("--plant {name:?}: no such bug; the planted bugs are {}", names.join(", ")));
    };
    if cfg!(feature = "planted-bugs") {
        Ok(Some(known))
    } else {
        Err("--plant needs a build with the feature planted-bugs (test fixtures, never a release build): \
             cargo run -p palisade-compare --features planted-bugs -- torture …"
            .into())
    }
}

/// Parses `90s`, `10m`, `1h`, `500ms` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().map_err(|_| format!("{text:?} is not a duration (such as 90s, 10m, 1h)"))?;
    let ms = match unit {
        "" | "s" => n.checked_mul(1_000),
        "ms" => Some(n),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => None,
    }
    .ok_or_else(|| format!("{text:?} is not a duration (such as 90s, 10m, 1h)"))?;
    Ok(Duration::from_millis(ms))
}

/// Nanoseconds on `CLOCK_MONOTONIC`, the clock every process of the machine shares: the
/// history's timestamps, comparable across the clients and the nemesis.
pub fn now() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => {
            u64::try_from(t.tv_sec()).unwrap_or(0).saturating_mul(1_000_000_000)
                + u64::try_from(t.tv_nsec()).unwrap_or(0)
        }
        Err(_) => 0,
    }
}

/// Connects to the lock service a URL names: a Palisade URL, or `relay://HOST:PORT`, a service
/// living in another process (a test's deliberately broken one) served by
/// `palisade_conformance::relay::Relay`, whose capabilities the relay tells.
pub async fn connect_lock(url: &str) -> palisade::Result<std::sync::Arc<palisade::DynLockService>> {
    let Some(addr) = url.strip_prefix("relay://") else { return palisade::connect_lock(url).await };
    let addr = relay_addr(addr)?;
    let relayed = palisade_conformance::relay::RelayLockService::<palisade::Fenced>::discover(addr).await?;
    Ok(std::sync::Arc::new(relayed))
}

/// Connects to the store a URL names: a Palisade URL, or `relay://HOST:PORT`, a store living in
/// another process (a test's deliberately broken one) served by
/// `palisade_conformance::relay::StoreRelay`.
pub async fn connect_store(url: &str) -> palisade::Result<std::sync::Arc<palisade::DynFencedStore>> {
    let Some(addr) = url.strip_prefix("relay://") else { return palisade::connect_store(url).await };
    let relayed = palisade_conformance::relay::RelayStore::connect(relay_addr(addr)?).await?;
    Ok(std::sync::Arc::new(relayed))
}

/// The warehouse on the store a URL names: its own tables on PostgreSQL or SQLite, records in
/// `store` (the client's connection to that URL) on any other.
pub async fn connect_warehouse(
    url: &str,
    scope: &str,
    store: &std::sync::Arc<palisade::DynFencedStore>,
) -> palisade::Result<palisade_examples::warehouse::inventory::Warehouse> {
    use palisade_examples::warehouse::inventory::Warehouse;
    if Warehouse::keeps_tables(url) {
        Warehouse::connect(url, scope).await
    } else {
        Ok(Warehouse::on_records(std::sync::Arc::clone(store), scope))
    }
}

/// The `IP:PORT` of a `relay://` URL.
pub fn relay_addr(addr: &str) -> palisade::Result<std::net::SocketAddr> {
    addr.trim_end_matches('/').parse().map_err(|_| {
        palisade::Error::new(palisade::ErrorKind::InvalidConfig, "relay", "a relay:// URL is relay://IP:PORT")
    })
}

/// The name of resource `i` in the history and in its lock's key.
pub fn resource_name(i: usize) -> String {
    format!("r{i}")
}

/// The name of the warehouse's SKU `i` in the history, its lock and its stock.
pub fn sku_name(i: usize) -> String {
    format!("s{i}")
}

/// The stock each SKU starts with: more than a run allocates.
pub const INITIAL_STOCK: i64 = 1_000_000_000;

/// The record holding a resource's register.
pub fn register_key(ns: &str, resource: &str) -> String {
    format!("{ns}/register/{resource}")
}

/// What the checker is told to allow, from the run's settings and the lock service's declared
/// `expiry_delay`: after the last heal, a lock left by a paused or killed holder is free within
/// its TTL plus the expiry delay, a waiter gets it within one more TTL of contention and its
/// wait, and its write takes one call.
pub fn bounds(args: &TortureArgs, expiry_delay: Duration) -> Bounds {
    let expiry = u64::try_from(expiry_delay.as_millis()).unwrap_or(u64::MAX);
    Bounds {
        progress_ms: args.wait_ms + 2 * args.ttl_ms + expiry + 2 * CALL_MS + ALLOWANCE_MS,
        allowance_ms: ALLOWANCE_MS,
    }
}

/// Runs the torture; the exit code is the verdict. Interrupted (Ctrl-C, `SIGTERM`), it stops
/// what it started (client processes, servers, network namespaces: dropping the run does) and
/// exits 3 with no verdict.
pub async fn torture(args: TortureArgs) -> ExitCode {
    let outcome = tokio::select! {
        outcome = run(args) => outcome,
        signal = interrupted() => Err(format!("interrupted by {signal}: what the run started is stopped, and no verdict")),
    };
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("palisade torture: {e}");
            ExitCode::from(3)
        }
    }
}

/// Resolves at the first Ctrl-C or `SIGTERM`, with the signal's name; never where neither can
/// be listened for.
async fn interrupted() -> &'static str {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        result = tokio::signal::ctrl_c() => match result {
            Ok(()) => "Ctrl-C",
            Err(_) => std::future::pending().await,
        },
        () = terminate => "SIGTERM",
    }
}

async fn run(args: TortureArgs) -> Result<ExitCode, String> {
    let seed = args.seed.unwrap_or_else(|| {
        let mut b = [0u8; 8];
        let _ = getrandom::fill(&mut b);
        u64::from_le_bytes(b) % 1_000_000_000
    });
    let plant = planted(args.plant.as_deref())?;
    let mut servers = if args.local { Some(nemesis::LocalServers::start(&args.lock, &args.store)?) } else { None };
    let (lock_url, store_url) = match &servers {
        Some(s) => (s.lock_url.clone(), s.store_url.clone()),
        None => (args.lock.clone(), args.store.clone()),
    };
    let target = nemesis::Target::check(&lock_url, &store_url).await?;
    if args.hosts && nemesis::dials_announced_addresses(&lock_url) {
        return Err(format!(
            "--hosts: the clients of {} dial the addresses its servers announce, not proxies on the hosts' bridge, \
             and a client on a host of its own reaches no loopback address but its own",
            crate::target::shown(&lock_url)
        ));
    }
    if args.hosts && !target.lock_proxied && !target.store_proxied {
        return Err(format!(
            "--hosts: neither {} nor {} is reached over the network, so there is nothing to cut a client's host off \
             from",
            crate::target::shown(&lock_url),
            crate::target::shown(&store_url)
        ));
    }
    let faketime = if args.clock_jumps {
        Some(nemesis::libfaketime().ok_or(
            "--clock-jumps runs the clients under libfaketime, and it is not installed (Debian: apt install \
             libfaketime; or name the library in PALISADE_LIBFAKETIME)",
        )?)
    } else {
        None
    };
    let bounds = bounds(&args, target.expiry_delay);
    let quiet_ms = bounds.progress_ms + ALLOWANCE_MS;
    let total_ms = u64::try_from(args.duration.as_millis()).unwrap_or(u64::MAX);
    if total_ms < quiet_ms + 5_000 {
        return Err(format!(
            "--duration {} s is too short for this pair: the quiet stretch the progress check needs is {} s, and \
             faults need at least 5 s more",
            total_ms / 1000,
            quiet_ms.div_ceil(1000)
        ));
    }
    let menu = Menu {
        clients: usize::try_from(args.clients).unwrap_or(4),
        ttl_ms: args.ttl_ms,
        lock_proxied: target.lock_proxied,
        store_proxied: target.store_proxied,
        lock_server: servers.as_ref().is_some_and(|s| s.lock_restartable),
        lock_data: servers.as_ref().is_some_and(|s| s.lock_loses_data),
        store_server: servers.as_ref().is_some_and(|s| s.store_restartable),
        lock_leader: servers.as_ref().is_some_and(|s| s.lock_has_leader),
        hosts: args.hosts,
        lock_failover: servers.as_ref().is_some_and(|s| s.lock_fails_over),
        clock_jumps: args.clock_jumps,
    };
    let steps = schedule::draw(seed, total_ms - quiet_ms, &menu);
    eprintln!(
        "palisade torture: seed {seed}, {} fault(s) over {} s, then {} s quiet; {} clients on {} resources",
        steps.len(),
        (total_ms - quiet_ms) / 1000,
        quiet_ms / 1000,
        args.clients,
        args.resources
    );
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    if let Some(bug) = plant {
        eprintln!("palisade torture: the clients carry the planted bug {bug}");
    }
    let run = nemesis::Run::start(&args, seed, plant, &lock_url, &store_url, &target, faketime).await?;
    let (events, nemesis_failed) =
        run.drive(&steps, servers.as_mut(), Duration::from_millis(total_ms), Duration::from_millis(quiet_ms)).await;
    let history = History::from_events(events.clone()).map_err(|e| e.to_string())?;
    let verdict = palisade_history::check(&history, bounds);
    let replay = format!(
        "palisade torture{}{}{}{} --lock {} --store {} --seed {seed} --duration {}s --clients {} --resources {} --ttl-ms {} \
         --wait-ms {}",
        if args.local { " --local" } else { "" },
        if args.hosts { " --hosts" } else { "" },
        plant.map(|bug| format!(" --plant {bug}")).unwrap_or_default(),
        if args.clock_jumps { " --clock-jumps" } else { "" },
        crate::target::shown(&args.lock),
        crate::target::shown(&args.store),
        total_ms / 1000,
        args.clients,
        args.resources,
        args.ttl_ms,
        args.wait_ms
    );
    let summary = report::Summary {
        replay,
        planted: plant,
        lock: crate::target::shown(&lock_url),
        store: crate::target::shown(&store_url),
        seed,
        duration_s: total_ms / 1000,
        bounds,
        steps: &steps,
        history: &history,
        verdict: &verdict,
    };
    report::write(&args.out, &summary, &events)?;
    report::print(&summary, &args.out);
    if args.json {
        println!("{}", report::json(&summary));
    }
    drop(servers);
    if let Some(e) = nemesis_failed {
        // The history so far is written and judged above; the run itself is not whole.
        return Err(format!(
            "the nemesis stopped the run early: {e} (the history so far is in {})",
            args.out.display()
        ));
    }
    Ok(if verdict.valid() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("99999999999999999999h").is_err());
    }
}
