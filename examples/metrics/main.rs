//! # Metrics: the warehouse simulation, watched through Prometheus `/metrics`
//!
//! ```sh
//! cargo run --example metrics                        # serves http://127.0.0.1:9898/metrics
//! cargo run --example metrics -- --serve-secs 300    # keep serving after the run, to scrape it
//! ```
//!
//! It installs the `metrics-exporter-prometheus` recorder, serves its text on localhost with a
//! few lines of tokio (so the example needs no HTTP stack), runs the warehouse simulation (the
//! incident: holders paused past their TTL), prints the lock metrics it
//! scraped from its own `/metrics`, and keeps serving for `--serve-secs`.
//!
//! **What goes wrong without a fence, and what to watch.** The paused holders' stale writes are
//! refused by the store and counted in `palisade_lock_fence_rejected_total{store}`; their leases show up in
//! `palisade_lock_lost_total{backend}`. A sustained non-zero rate of either means TTLs are too tight for the
//! work (or the work slowed down): alert on it. Acquisition latency and outcomes are in
//! `palisade_lock_acquire_duration_seconds` and `palisade_lock_acquire_total{outcome}`.

use palisade_examples::logging;
use palisade_examples::warehouse::{cli, commands, simulate};

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use serde_json::json;

/// The warehouse simulation with a Prometheus endpoint.
#[derive(Debug, Parser)]
struct Args {
    /// Lock service URL.
    #[arg(long, default_value = "memory://")]
    lock: String,
    /// Fenced store URL.
    #[arg(long, default_value = "sqlite::memory:")]
    store: String,
    /// Where to serve `/metrics` (localhost only by default).
    #[arg(long, default_value = "127.0.0.1:9898")]
    listen: SocketAddr,
    /// Allocation jobs to simulate.
    #[arg(long, default_value_t = 400)]
    jobs: u64,
    /// Lock TTL in milliseconds.
    #[arg(long, default_value_t = 200)]
    ttl_ms: u64,
    /// Keep serving `/metrics` this long after the run.
    #[arg(long, default_value_t = 0)]
    serve_secs: u64,
}

/// `GET /metrics` from our own listener, over plain TCP (no HTTP client needed).
fn scrape(addr: SocketAddr) -> std::io::Result<String> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    conn.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())?;
    let mut body = String::new();
    conn.read_to_string(&mut body)?;
    Ok(body)
}

/// The sum of a counter's samples over all label sets.
fn total(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Answers every connection with the recorder's current text: enough HTTP for a scraper.
async fn serve(listener: tokio::net::TcpListener, handle: metrics_exporter_prometheus::PrometheusHandle) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let Ok((mut conn, _)) = listener.accept().await else { continue };
        let handle = handle.clone();
        tokio::spawn(async move {
            // The request itself does not matter: read what arrived, then answer.
            let mut request = [0u8; 1024];
            let _ = tokio::time::timeout(Duration::from_secs(2), conn.read(&mut request)).await;
            let body = handle.render();
            let head = format!(
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes()).await;
            let _ = conn.write_all(body.as_bytes()).await;
            let _ = conn.shutdown().await;
        });
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = Args::parse();
    logging::init();
    let handle = match metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder() {
        Ok(handle) => handle,
        Err(e) => {
            eprintln!("metrics: cannot install the Prometheus recorder: {e}");
            return ExitCode::from(1);
        }
    };
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("metrics: cannot serve {}: {e}", args.listen);
            return ExitCode::from(1);
        }
    };
    tokio::spawn(serve(listener, handle));
    println!("serving http://{}/metrics", args.listen);
    let jobs = args.jobs.to_string();
    let ttl = args.ttl_ms.to_string();
    let argv = [
        "warehouse",
        "--lock",
        &args.lock,
        "--store",
        &args.store,
        "simulate",
        "--jobs",
        &jobs,
        "--ttl-ms",
        &ttl,
        "--json",
    ];
    let cli = match cli::Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(e) => return cli::usage_error(e),
    };
    let cli::Command::Simulate(sim) = &cli.command else { return ExitCode::from(2) };
    match simulate::run(&cli, sim).await {
        Ok(code) if code == ExitCode::SUCCESS => {}
        Ok(code) => return code,
        Err(e) => {
            eprintln!("metrics: {e}");
            return ExitCode::from(commands::exit_code_for(&e));
        }
    }
    let body = match tokio::task::spawn_blocking(move || scrape(args.listen)).await {
        Ok(Ok(body)) => body,
        Ok(Err(e)) => {
            eprintln!("metrics: cannot scrape our own /metrics: {e}");
            return ExitCode::from(1);
        }
        Err(e) => {
            eprintln!("metrics: {e}");
            return ExitCode::from(1);
        }
    };
    for line in body.lines().filter(|l| l.starts_with("lock_")) {
        println!("  {line}");
    }
    if args.serve_secs > 0 {
        println!("serving /metrics for {} s more", args.serve_secs);
        tokio::time::sleep(Duration::from_secs(args.serve_secs)).await;
    }
    println!(
        "{}",
        json!({
            "example": "metrics",
            "metrics_url": format!("http://{}/metrics", args.listen),
            "palisade_lock_fence_rejected_total": total(&body, "palisade_lock_fence_rejected_total"),
            "palisade_lock_lost_total": total(&body, "palisade_lock_lost_total"),
            "palisade_lock_acquire_total": total(&body, "palisade_lock_acquire_total"),
        })
    );
    ExitCode::SUCCESS
}
