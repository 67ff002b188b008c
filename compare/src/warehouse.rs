//! The warehouse benchmark: the warehouse simulation (synthetic allocation jobs with pauses past
//! the TTL), fenced and unfenced, on one lock service × store pair.

use clap::Parser;
use serde::Serialize;

use palisade_examples::warehouse::cli::{Cli, Command};

/// One simulation's figures (from the warehouse's own report).
#[derive(Debug, Clone, Serialize)]
pub struct WarehouseRun {
    pub mode: String,
    pub jobs: u64,
    pub pauses: u64,
    pub applied: u64,
    pub fence_rejected: u64,
    pub duplicates: u64,
    pub lost_updates: i64,
    pub jobs_per_sec: f64,
    pub elapsed_ms: u64,
    /// Jobs/s within each tenth of the jobs, in the order they were done (empty below 10 jobs).
    pub tenths_jobs_per_sec: Vec<f64>,
}

/// The benchmark's size: jobs, workers, SKUs, and how often a holder pauses past its TTL.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct WarehousePlan {
    pub jobs: u64,
    pub workers: u32,
    pub skus: u32,
    pub pause_every: u64,
}

pub async fn run(lock: &str, store: &str, plan: WarehousePlan, unfenced: bool) -> Result<WarehouseRun, String> {
    let (jobs, workers, skus, every) =
        (plan.jobs.to_string(), plan.workers.to_string(), plan.skus.to_string(), plan.pause_every.to_string());
    let mut argv = vec![
        "warehouse",
        "--lock",
        lock,
        "--store",
        store,
        "simulate",
        "--jobs",
        &jobs,
        "--workers",
        &workers,
        "--skus",
        &skus,
        "--pause-every",
        &every,
        "--json",
    ];
    if unfenced {
        argv.push("--unfenced");
    }
    let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
    let Command::Simulate(args) = &cli.command else { return Err("not a simulation".into()) };
    let r = palisade_examples::warehouse::simulate::simulate(&cli, args, true).await.map_err(|e| e.to_string())?;
    Ok(WarehouseRun {
        mode: r["mode"].as_str().unwrap_or("?").to_string(),
        jobs: r["jobs"].as_u64().unwrap_or(0),
        pauses: r["pauses"].as_u64().unwrap_or(0),
        applied: r["applied"].as_u64().unwrap_or(0),
        fence_rejected: r["fence_rejected"].as_u64().unwrap_or(0),
        duplicates: r["duplicates"].as_u64().unwrap_or(0),
        lost_updates: r["lost_updates"].as_i64().unwrap_or(0),
        jobs_per_sec: r["jobs_per_sec"].as_f64().unwrap_or(0.0),
        elapsed_ms: r["elapsed_ms"].as_u64().unwrap_or(0),
        tenths_jobs_per_sec: r["tenths_jobs_per_sec"]
            .as_array()
            .map(|a| a.iter().filter_map(serde_json::Value::as_f64).collect())
            .unwrap_or_default(),
    })
}
