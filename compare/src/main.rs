//! # `palisade compare`: lock services and stores side by side, under the same faults and load
//!
//! ```sh
//! cargo run --release -p palisade-compare -- compare --local            # starts its own servers
//! cargo run --release -p palisade-compare -- compare --lock redis://… --lock etcd://… --store postgres://…
//! ```
//!
//! For every lock service × store pair it runs the same fault scenarios (a worker process
//! frozen with `SIGSTOP` past its TTL, a worker killed with `SIGKILL`, the lock server restarted
//! with its data lost, a cluster leader killed), the same performance measurements (each as a
//! ratio to the backend's raw operation measured in the same run), and the warehouse benchmark
//! (synthetic allocation jobs with injected pauses, fenced and unfenced). It writes a Markdown
//! report, SVG charts and, with `--json`, the raw figures. Every figure comes from this run.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a command-line tool

// The warehouse benchmark is the warehouse simulation itself (palisade-examples), not a copy.
mod charts;
mod doctor;
mod faults;
mod inspect;
mod local;
mod memory;
mod perf;
mod report;
mod target;
mod torture;
mod warehouse;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Palisade's command-line tool.
#[derive(Debug, Parser)]
#[command(name = "palisade", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Compare lock services and stores under the same faults and load.
    Compare(CompareArgs),
    /// Run a lock service × store pair under a random fault schedule drawn from a seed, record
    /// every client call in a history, and check the history. Exit 0: no anomaly; 1: an
    /// anomaly (the report names it); 2: bad usage; 3: the run could not be made.
    Torture(torture::TortureArgs),
    /// Show who holds which lock, with which fence, and each store's watermark for it (and the
    /// grant that set it); changes nothing. Exit 0: shown; 1: shown, with a warning (a fence
    /// regression waiting to happen); 2: bad usage; 3: a service or store could not be read.
    Inspect(inspect::InspectArgs),
    /// Check that the servers a deployment uses are configured for the guarantees it claims
    /// (Redis eviction, persistence and replication; PostgreSQL durability, transaction bound
    /// and schema; SQLite journal and file system; etcd cluster size, alarms, compaction and
    /// lease TTL; ZooKeeper ensemble and session timeout; DynamoDB key schema, deletion
    /// protection, item expiry and fence attributes): one line per check, pass, warn or fail,
    /// with the guarantee it protects; changes nothing. Exit 0: all pass; 1: a warning; 2: a
    /// check failed or a server could not be read (or the command line was refused).
    Doctor(doctor::DoctorArgs),
    /// (internal) A client process of the torture run.
    #[command(hide = true)]
    TortureClient(torture::client::ClientArgs),
    /// (internal) The worker process the fault scenarios freeze and kill.
    #[command(hide = true)]
    Worker(worker::WorkerArgs),
    /// (internal) The holder of a handoff measured across processes.
    #[command(hide = true)]
    Holder(worker::HolderArgs),
}

/// `palisade compare` flags.
#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    /// Start the project's own loopback servers (Redis, three Redlock masters, etcd, ZooKeeper,
    /// PostgreSQL; 3-member etcd and ZooKeeper clusters for the leader-kill cells) and stop
    /// them after. Combines with --lock/--store.
    #[arg(long)]
    pub local: bool,
    /// A lock service URL (repeatable): memory://, redis://, redlock://, etcd://, zk://.
    #[arg(long = "lock")]
    pub locks: Vec<String>,
    /// A fenced store URL (repeatable): sqlite://PATH, postgres://, dynamodb://TABLE?endpoint=….
    #[arg(long = "store")]
    pub stores: Vec<String>,
    /// A small run (CI): fewer cycles, shorter windows, 200 jobs in the warehouse benchmark.
    #[arg(long)]
    pub quick: bool,
    /// Jobs in the warehouse benchmark per pair and mode (default 2000, --quick 200; the 1M-job
    /// run is 1000000).
    /// (`--seed-jobs` is its former name, still accepted.)
    #[arg(long, alias = "seed-jobs")]
    pub warehouse_jobs: Option<u64>,
    /// Run only these parts (repeatable): `perf`, `faults`, `warehouse` (formerly `seed`, still
    /// accepted). Default: all three.
    #[arg(long = "only", value_enum)]
    pub only: Vec<Part>,
    /// Workers of the warehouse benchmark.
    #[arg(long, alias = "seed-workers", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub warehouse_workers: u32,
    /// SKUs (locks) of the warehouse benchmark.
    #[arg(long, alias = "seed-skus", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub warehouse_skus: u32,
    /// Every K-th job of the warehouse benchmark pauses past its TTL (0: never).
    #[arg(long, alias = "seed-pause-every", default_value_t = 50)]
    pub warehouse_pause_every: u64,
    /// The lease TTL of the fault scenarios, in milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(200..=60_000))]
    pub ttl_ms: u64,
    /// Where to write report.md, report.json and the SVG charts.
    #[arg(long, default_value = "target/compare")]
    pub out: PathBuf,
    /// Also print the JSON report on stdout (last line).
    #[arg(long)]
    pub json: bool,
    /// Sample a server process's resident memory once a second for the whole run, and report
    /// it at the start, at its peak and at the end (repeatable): `NAME=PID`, such as
    /// `etcd=1234`. A process whose memory cannot be read is an error at once.
    #[arg(long = "watch-memory", value_name = "NAME=PID")]
    pub watch_memory: Vec<String>,
}

/// A part of the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    /// Latency, throughput and handoff against the raw operations.
    Perf,
    /// The fault matrix.
    Faults,
    /// The warehouse benchmark (`seed`, its former name, is still accepted).
    #[value(alias = "seed")]
    Warehouse,
}

impl CompareArgs {
    /// Whether `part` runs.
    pub fn runs(&self, part: Part) -> bool {
        self.only.is_empty() || self.only.contains(&part)
    }

    /// The fault scenarios' lease TTL.
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code =
                if matches!(e.kind(), clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion) {
                    0
                } else {
                    2
                };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("palisade: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match cli.command {
        Command::Worker(args) => runtime.block_on(worker::run(args)),
        Command::Holder(args) => runtime.block_on(worker::hold(args)),
        Command::Torture(args) => runtime.block_on(torture::torture(args)),
        Command::TortureClient(args) => runtime.block_on(torture::client::run(args)),
        Command::Inspect(args) => runtime.block_on(inspect::run(args)),
        Command::Doctor(args) => runtime.block_on(doctor::run(args)),
        Command::Compare(args) => match runtime.block_on(report::compare(args)) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("palisade compare: {e}");
                ExitCode::from(1)
            }
        },
    }
}
