//! Flags (a stable contract: see README.md beside this file).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Warehouse allocation under a fenced lock: the seed's incident and its fix.
#[derive(Debug, Parser)]
#[command(name = "warehouse", version)]
pub struct Cli {
    /// Lock service URL.
    #[arg(long, global = true, default_value = "memory://")]
    pub lock: String,
    /// Fenced store URL.
    #[arg(long, global = true, default_value = "sqlite://warehouse.db")]
    pub store: String,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
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
        /// The stock level.
        #[arg(long)]
        qty: u32,
    },
    /// Print a SKU's stock, last fence and audit counts as JSON.
    Show {
        /// The SKU.
        #[arg(long)]
        sku: String,
    },
    /// One worker: lock the SKU, think, decrement its stock with the lease's fence.
    Allocate {
        /// The SKU.
        #[arg(long)]
        sku: String,
        /// How many units to allocate.
        #[arg(long, default_value_t = 1)]
        qty: u32,
        /// Lock TTL in milliseconds.
        #[arg(long, default_value_t = 30_000)]
        ttl_ms: u64,
        /// How long to "work" between acquiring and writing, in milliseconds.
        #[arg(long, default_value_t = 0)]
        think_ms: u64,
        /// Job id for the audit table (default: a fresh random id). Two processes given the same
        /// id model a redelivered job: at most one of them applies it.
        #[arg(long)]
        job: Option<String>,
        /// How long to wait for the lock, in milliseconds.
        #[arg(long, default_value_t = 60_000)]
        wait_ms: u64,
    },
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
    /// Lock TTL in milliseconds (also the queue's redelivery timeout).
    #[arg(long, default_value_t = 200)]
    pub ttl_ms: u64,
    /// Every K-th job's holder pauses after acquiring (0: never).
    #[arg(long, default_value_t = 50)]
    pub pause_every: u64,
    /// Pause length in milliseconds (default: 2 × TTL + 50, longer than the TTL).
    #[arg(long)]
    pub pause_ms: Option<u64>,
    /// Write without the fence check: the seed's naive lock.
    #[arg(long)]
    pub unfenced: bool,
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
