//! Flags (a stable contract: see examples/warehouse/README.md).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The longest lock TTL and lock wait `allocate` accepts: 24 h, the library's own bounds.
pub const MAX_ALLOCATE_MS: i64 = 86_400_000;
/// The longest `--think-ms`: 1 h.
pub const MAX_THINK_MS: i64 = 3_600_000;
/// The longest TTL and pause `simulate` accepts: 10 min (a run must end).
pub const MAX_SIMULATE_MS: i64 = 600_000;
/// The largest quantity: stock levels and allocations are whole units up to 2³² − 1.
pub const MAX_QTY: i64 = u32::MAX as i64;

/// A validated millisecond flag as a duration (the ranges above keep it non-negative).
pub fn millis(ms: i64) -> std::time::Duration {
    std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

// Numbers are parsed as signed so that `--qty -5` is "out of range" for `--qty`, not an
// unknown flag `-5`; the ranges are the contract (examples/warehouse/README.md).

/// Warehouse allocation under a fenced lock: the incident and its fix.
#[derive(Debug, Parser)]
#[command(name = "warehouse", version)]
pub struct Cli {
    /// Lock service URL [default: the store's URL when the store is a SQLite file or a
    /// PostgreSQL database, so locks, fence counters and data share it; otherwise memory://].
    #[arg(long, global = true)]
    pub lock: Option<String>,
    /// Fenced store URL.
    #[arg(long, global = true, default_value = "sqlite://warehouse.db")]
    pub store: String,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The lock service URL: `--lock`, or the default described on the flag.
    pub fn lock_url(&self) -> String {
        match &self.lock {
            Some(lock) => lock.clone(),
            None if self.store.starts_with("sqlite:") && !self.store.contains(":memory:") => self.store.clone(),
            None if self.store.starts_with("postgres://") || self.store.starts_with("postgresql://") => {
                self.store.clone()
            }
            None => "memory://".to_string(),
        }
    }
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run N workers over a job queue with injected pauses; report duplicates from the audit table.
    Simulate(SimulateArgs),
    /// Set a SKU's stock level.
    Setup {
        /// The SKU (letters, digits, '-', '_', '.').
        #[arg(long)]
        sku: String,
        /// The stock level (0 to 4294967295).
        #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(0..=MAX_QTY))]
        qty: i64,
    },
    /// Print a SKU's stock, last fence and audit counts as JSON.
    Show {
        /// The SKU.
        #[arg(long)]
        sku: String,
    },
    /// Move stock from one SKU to another under both locks at once: one write both fences
    /// must pass, so it lands whole or not at all.
    Transfer {
        /// The SKU the units leave.
        #[arg(long)]
        from: String,
        /// The SKU they arrive at (another SKU).
        #[arg(long)]
        to: String,
        /// How many units, how long, and under which job id.
        #[command(flatten)]
        work: WorkArgs,
    },
    /// One worker: lock the SKU, think, decrement its stock with the lease's fence.
    Allocate {
        /// The SKU.
        #[arg(long)]
        sku: String,
        /// How many units, how long, and under which job id.
        #[command(flatten)]
        work: WorkArgs,
    },
}

/// The flags `allocate` and `transfer` share: one job's units, its lock TTL and wait, its
/// think time, and its id.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkArgs {
    /// How many units (at least 1).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(1..=MAX_QTY))]
    pub qty: i64,
    /// Lock TTL in milliseconds (1 to 86400000).
    #[arg(long, default_value_t = 30_000, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(1..=MAX_ALLOCATE_MS))]
    pub ttl_ms: i64,
    /// How long to "work" between acquiring and writing, in milliseconds (0 to 3600000).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(0..=MAX_THINK_MS))]
    pub think_ms: i64,
    /// Job id for the audit table (default: a fresh random id). Two processes given the same
    /// id model a redelivered job: at most one of them applies it.
    #[arg(long)]
    pub job: Option<String>,
    /// How long to wait for the lock (both locks for a transfer), in milliseconds (0 to
    /// 86400000; 0 tries once).
    #[arg(long, default_value_t = 60_000, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(0..=MAX_ALLOCATE_MS))]
    pub wait_ms: i64,
}

/// `simulate` flags.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// Concurrent workers.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub workers: u32,
    /// Allocation jobs to run.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub jobs: u64,
    /// Distinct SKUs (one lock each); job j allocates SKU j mod N.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub skus: u32,
    /// Lock TTL in milliseconds (also the queue's redelivery timeout; 1 to 600000).
    #[arg(long, default_value_t = 200, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(1..=MAX_SIMULATE_MS))]
    pub ttl_ms: i64,
    /// Every K-th job's holder pauses after acquiring (0: never).
    #[arg(long, default_value_t = 50)]
    pub pause_every: u64,
    /// Pause length in milliseconds (default: 2 × TTL + 50, longer than the TTL; 0 to 600000).
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(0..=MAX_SIMULATE_MS))]
    pub pause_ms: Option<i64>,
    /// Write without the fence check: the incident's naive lock.
    #[arg(long)]
    pub unfenced: bool,
    /// Every K-th job is a transfer of one unit from SKU j mod N to SKU (j + 1) mod N, under
    /// both SKUs' locks at once (0: never; needs at least 2 SKUs).
    #[arg(long, default_value_t = 0)]
    pub transfer_every: u64,
    /// Print one JSON object on the last line instead of a human summary.
    #[arg(long)]
    pub json: bool,
}

/// Prints a clap error as one line (help and version print in full) and picks the exit code.
pub fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    let text = e.to_string();
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("invalid arguments");
    eprintln!("warehouse: {}", line.trim_start_matches("error: "));
    ExitCode::from(2)
}
