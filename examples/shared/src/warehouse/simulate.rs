//! `simulate`: N workers, a job queue with redelivery, injected pauses past the TTL.
//!
//! The queue behaves like a real one: a job handed to a worker is handed out again if the
//! worker has not acknowledged it within the TTL (a visibility timeout). So when a holder
//! pauses past its TTL, its lock expires, its job is redelivered, another worker takes the lock
//! and applies the job, and the paused holder then wakes and writes: the incident.
//! Redelivered jobs jump the queue, as a job whose deadline has passed would in a real system
//! (and as the incident's write-up tells it: "another pod acquires the lock and completes the shipment").

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use palisade::prelude::*;
use palisade::{AnyLockService, CancellationToken};
use serde_json::json;
use tokio::sync::{Mutex, mpsc};
use tokio::time::Instant;

use super::cli::{Cli, SimulateArgs, millis};
use super::commands::{AppError, connect_any};
use super::inventory::{Mode, Order, Outcome, Transfer, Warehouse};

#[derive(Debug, Clone, Copy)]
struct Delivery {
    job: u64,
    attempt: u32,
}

#[derive(Default)]
struct Counters {
    applied: AtomicU64,
    transfers: AtomicU64,
    fence_rejected: AtomicU64,
    already_done: AtomicU64,
    pauses: AtomicU64,
    redeliveries: AtomicU64,
    lock_errors: AtomicU64,
    finished_jobs: AtomicU64,
    in_flight: AtomicU64,
}

struct Sim<L: LockService + ?Sized> {
    args: Settings,
    locks: Arc<L>,
    warehouse: Warehouse,
    run_id: String,
    queue: mpsc::UnboundedSender<Delivery>,
    redeliver: mpsc::UnboundedSender<Delivery>,
    counters: Counters,
    job_done: Vec<AtomicBool>,
    acquire_latencies: std::sync::Mutex<Vec<Duration>>,
    tenths: Tenths,
}

/// When each tenth of the jobs was done: whether the cost of a job grows with the work done
/// (a store or lock service that slows down as its history grows).
struct Tenths {
    /// What the marks count from.
    epoch: Instant,
    /// Microseconds from `epoch` to the moment the k+1-th tenth of the jobs was done.
    marks: [AtomicU64; 10],
}

impl Tenths {
    fn new() -> Self {
        Tenths { epoch: Instant::now(), marks: Default::default() }
    }

    /// The number of jobs done by the end of tenth `k` (1 to 10) of `jobs`.
    fn boundary(jobs: u64, k: u64) -> u64 {
        u64::try_from(u128::from(jobs) * u128::from(k) / 10).unwrap_or(jobs)
    }

    /// Records the moment the `done`-th job of `jobs` was done, when it ends a tenth.
    fn done(&self, done: u64, jobs: u64) {
        if jobs < 10 {
            return;
        }
        for k in 1..=10u64 {
            if done == Tenths::boundary(jobs, k) {
                let micros = u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX);
                self.marks[usize::try_from(k - 1).unwrap_or(0)].store(micros, Ordering::SeqCst);
            }
        }
    }

    /// Jobs per second within each tenth of the jobs, the first counted from `started`; empty
    /// for fewer than ten jobs.
    fn rates(&self, started: Instant, jobs: u64) -> Vec<f64> {
        if jobs < 10 {
            return Vec::new();
        }
        // Two workers ending tenths one job apart may store their marks out of order (each
        // counts, then reads the clock): the marks, sorted, are the moments the tenths ended.
        let mut marks: Vec<u64> = self.marks.iter().map(|m| m.load(Ordering::SeqCst)).collect();
        marks.sort_unstable();
        let mut from = started.saturating_duration_since(self.epoch).as_secs_f64();
        (1..=10u64)
            .zip(marks)
            .map(|(k, mark)| {
                let to = mark as f64 / 1e6;
                let n = (Tenths::boundary(jobs, k) - Tenths::boundary(jobs, k - 1)) as f64;
                let rate = n / (to - from).max(1e-9);
                from = to;
                (rate * 10.0).round() / 10.0
            })
            .collect()
    }
}

#[derive(Debug, Clone, Copy)]
struct Settings {
    workers: u32,
    jobs: u64,
    skus: u32,
    ttl: Duration,
    pause_every: u64,
    pause: Duration,
    mode: Mode,
    transfer_every: u64,
}

/// `simulate`: runs the simulation, prints its report, and exits 4 if a fenced run found duplicates.
pub async fn run(cli: &Cli, args: &SimulateArgs) -> Result<ExitCode, AppError> {
    let report = simulate(cli, args, false).await?;
    let duplicates = report["duplicates"].as_u64().unwrap_or(0);
    let half_applied = report["half_applied"].as_u64().unwrap_or(0);
    let conserved = report["stock_conserved"].as_bool().unwrap_or(false);
    if args.json {
        println!("{report}");
    } else {
        print_human(&report);
    }
    if report["mode"] == "fenced" && (duplicates > 0 || half_applied > 0 || !conserved) {
        eprintln!(
            "warehouse: SAFETY VIOLATION with fencing on: {duplicates} duplicate jobs, {half_applied} transfers applied \
             on one side only, stock conserved: {conserved}"
        );
        return Ok(ExitCode::from(4));
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs the simulation and returns its report (the JSON `run` prints); `quiet` silences the
/// progress output (for callers with their own, such as `palisade compare`).
pub async fn simulate(cli: &Cli, args: &SimulateArgs, quiet: bool) -> Result<serde_json::Value, AppError> {
    palisade::Ttl::new(millis(args.ttl_ms))?;
    let settings = Settings {
        workers: args.workers,
        jobs: args.jobs,
        skus: args.skus,
        ttl: millis(args.ttl_ms),
        pause_every: args.pause_every,
        pause: millis(args.pause_ms.unwrap_or(args.ttl_ms.saturating_mul(2).saturating_add(50))),
        mode: if args.unfenced { Mode::Unfenced } else { Mode::Fenced },
        transfer_every: args.transfer_every,
    };
    if settings.transfer_every > 0 && settings.skus < 2 {
        return Err(AppError::Usage("--transfer-every needs at least 2 SKUs (--skus)".into()));
    }
    if settings.pause_every > 0 && settings.pause <= settings.ttl {
        eprintln!("warehouse: note: --pause-ms is not longer than --ttl-ms, so pauses will not outlive leases");
    }
    let locks = connect_any(cli).await?;
    let store = cli.store.as_str();
    match locks {
        AnyLockService::Fenced(locks) => run_with(settings, locks, store, quiet).await,
        AnyLockService::Unfenced(locks) => {
            if settings.mode == Mode::Fenced {
                eprintln!(
                    "warehouse: note: the {} lock issues no fence, so this run is unfenced (as with --unfenced)",
                    locks.backend()
                );
            }
            run_with(Settings { mode: Mode::Unfenced, ..settings }, locks, store, quiet).await
        }
    }
}

async fn run_with<L: LockService + ?Sized>(
    settings: Settings,
    locks: Arc<L>,
    store: &str,
    quiet: bool,
) -> Result<serde_json::Value, AppError> {
    let run_id = palisade::OwnerToken::generate()?.to_string()[..8].to_string();
    let warehouse = Warehouse::connect(store, &run_id).await?;
    let initial = i64::try_from(settings.jobs).unwrap_or(i64::MAX);
    for s in 0..settings.skus {
        warehouse.initial_stock(&sku_name(s), initial).await?;
    }

    let (tx, rx) = mpsc::unbounded_channel();
    let (redeliver_tx, redeliver_rx) = mpsc::unbounded_channel();
    let sim = Arc::new(Sim {
        args: settings,
        locks,
        warehouse,
        run_id: run_id.clone(),
        queue: tx,
        redeliver: redeliver_tx,
        counters: Counters::default(),
        job_done: (0..settings.jobs).map(|_| AtomicBool::new(false)).collect(),
        acquire_latencies: std::sync::Mutex::new(Vec::with_capacity(usize::try_from(settings.jobs).unwrap_or(0))),
        tenths: Tenths::new(),
    });
    for job in 0..settings.jobs {
        let _ = sim.queue.send(Delivery { job, attempt: 1 });
    }

    let started = Instant::now();
    let rx = Arc::new(Mutex::new(Queues { fresh: rx, redelivered: redeliver_rx }));
    let stop = CancellationToken::new();
    let mut workers = Vec::new();
    for w in 0..settings.workers {
        workers.push(tokio::spawn(worker(Arc::clone(&sim), Arc::clone(&rx), stop.clone(), w)));
    }

    let progress = Progress::start(settings.jobs, quiet);
    loop {
        let finished = sim.counters.finished_jobs.load(Ordering::SeqCst);
        progress.update(finished, started.elapsed());
        if finished >= settings.jobs && sim.counters.in_flight.load(Ordering::SeqCst) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    for w in workers {
        let _ = w.await;
    }
    let elapsed = started.elapsed();
    progress.finish();

    report(&sim, started, elapsed).await
}

fn sku_name(s: u32) -> String {
    format!("SKU-{s:04}")
}

struct Queues {
    fresh: mpsc::UnboundedReceiver<Delivery>,
    redelivered: mpsc::UnboundedReceiver<Delivery>,
}

async fn worker<L: LockService + ?Sized>(sim: Arc<Sim<L>>, rx: Arc<Mutex<Queues>>, stop: CancellationToken, id: u32) {
    loop {
        let delivery = {
            let mut rx = rx.lock().await;
            let Queues { fresh, redelivered } = &mut *rx;
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                d = redelivered.recv() => d,
                d = fresh.recv() => d,
            }
        };
        let Some(delivery) = delivery else { return };
        if sim.job_done[job_index(delivery.job)].load(Ordering::SeqCst) {
            continue; // a stale redelivery of a job already finished
        }
        sim.counters.in_flight.fetch_add(1, Ordering::SeqCst);
        let acked = Arc::new(AtomicBool::new(false));
        arm_redelivery(&sim, delivery, Arc::clone(&acked));
        process(&sim, delivery, id).await;
        acked.store(true, Ordering::SeqCst);
        sim.counters.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn job_index(job: u64) -> usize {
    usize::try_from(job).unwrap_or(usize::MAX)
}

/// The visibility timeout: unacknowledged after one TTL, the job goes back on the queue.
fn arm_redelivery<L: LockService + ?Sized>(sim: &Arc<Sim<L>>, delivery: Delivery, acked: Arc<AtomicBool>) {
    let sim = Arc::clone(sim);
    tokio::spawn(async move {
        tokio::time::sleep(sim.args.ttl).await;
        if !acked.load(Ordering::SeqCst) && !sim.job_done[job_index(delivery.job)].load(Ordering::SeqCst) {
            sim.counters.redeliveries.fetch_add(1, Ordering::SeqCst);
            let _ = sim.redeliver.send(Delivery { job: delivery.job, attempt: delivery.attempt + 1 });
        }
    });
}

/// Whether job `job` is a transfer (`--transfer-every`).
fn is_transfer(settings: &Settings, job: u64) -> bool {
    settings.transfer_every > 0 && (job + 1).is_multiple_of(settings.transfer_every)
}

/// The pause a delivery's holder takes: every `--pause-every`-th job's first delivery.
fn pause_of<L: LockService + ?Sized>(sim: &Sim<L>, delivery: Delivery) -> Duration {
    if sim.args.pause_every > 0 && (delivery.job + 1).is_multiple_of(sim.args.pause_every) && delivery.attempt == 1 {
        sim.counters.pauses.fetch_add(1, Ordering::SeqCst);
        sim.args.pause
    } else {
        Duration::ZERO
    }
}

/// Counts an attempt's outcome; whether the job is finished.
fn count<L: LockService + ?Sized>(sim: &Sim<L>, outcome: palisade::Result<Outcome>, applied: &AtomicU64) -> bool {
    match outcome {
        Ok(Outcome::Applied) => {
            applied.fetch_add(1, Ordering::SeqCst);
            true
        }
        Ok(Outcome::AlreadyDone) => {
            sim.counters.already_done.fetch_add(1, Ordering::SeqCst);
            true
        }
        Ok(Outcome::StaleFence { .. }) => {
            sim.counters.fence_rejected.fetch_add(1, Ordering::SeqCst);
            false
        }
        Ok(Outcome::InsufficientStock { .. } | Outcome::UnknownSku) | Err(_) => {
            sim.counters.lock_errors.fetch_add(1, Ordering::SeqCst);
            false
        }
    }
}

fn finish<L: LockService + ?Sized>(sim: &Sim<L>, delivery: Delivery, finished: bool) {
    if finished && !sim.job_done[job_index(delivery.job)].swap(true, Ordering::SeqCst) {
        let done = sim.counters.finished_jobs.fetch_add(1, Ordering::SeqCst) + 1;
        sim.tenths.done(done, sim.args.jobs);
    }
}

/// A transfer job: one unit from SKU j mod N to SKU (j + 1) mod N, under both locks at once.
async fn process_transfer<L: LockService + ?Sized>(sim: &Sim<L>, delivery: Delivery, worker: u32) {
    let skus = u64::from(sim.args.skus);
    let from = sku_name(u32::try_from(delivery.job % skus).unwrap_or(0));
    let to = sku_name(u32::try_from((delivery.job + 1) % skus).unwrap_or(0));
    let keys = match (
        ResourceKey::new("alloc", format!("{}.{from}", sim.run_id)),
        ResourceKey::new("alloc", format!("{}.{to}", sim.run_id)),
    ) {
        (Ok(a), Ok(b)) => [a, b],
        _ => return,
    };
    let started = Instant::now();
    let wait = (sim.args.ttl * 50).max(Duration::from_secs(10));
    let Ok(both) = sim.locks.lock_all(&keys, LockOptions::ttl(sim.args.ttl).wait(wait)).await else {
        sim.counters.lock_errors.fetch_add(1, Ordering::SeqCst);
        return; // not acknowledged: the queue redelivers it
    };
    if let Ok(mut l) = sim.acquire_latencies.lock() {
        l.push(started.elapsed());
    }
    let pause = pause_of(sim, delivery);
    let job = format!("job-{:09}", delivery.job);
    let fences: Vec<String> =
        both.leases().iter().map(|l| l.fence_if_any().map_or_else(|| "none".to_string(), |f| f.to_string())).collect();
    let attempt = format!("a{}-w{worker}-f{}", delivery.attempt, fences.join("+"));
    let order = Transfer { from: &from, to: &to, job: &job, attempt: &attempt, qty: 1 };
    let outcome = sim.warehouse.transfer(&both, sim.args.mode, &order, pause).await;
    let finished = count(sim, outcome, &sim.counters.transfers);
    finish(sim, delivery, finished);
    let _ = both.release().await; // NotHolder after a pause is expected
}

async fn process<L: LockService + ?Sized>(sim: &Sim<L>, delivery: Delivery, worker: u32) {
    if is_transfer(&sim.args, delivery.job) {
        return process_transfer(sim, delivery, worker).await;
    }
    let sku = sku_name(u32::try_from(delivery.job % u64::from(sim.args.skus)).unwrap_or(0));
    let key = match ResourceKey::new("alloc", format!("{}.{sku}", sim.run_id)) {
        Ok(key) => key,
        Err(_) => return,
    };
    let started = Instant::now();
    let wait = (sim.args.ttl * 50).max(Duration::from_secs(10));
    let lease = match sim.locks.lock(&key, LockOptions::ttl(sim.args.ttl).wait(wait)).await {
        Ok(lease) => lease,
        Err(_) => {
            // Not acknowledged: the queue redelivers it.
            sim.counters.lock_errors.fetch_add(1, Ordering::SeqCst);
            return;
        }
    };
    if let Ok(mut l) = sim.acquire_latencies.lock() {
        l.push(started.elapsed());
    }
    let pause = pause_of(sim, delivery);
    let job = format!("job-{:09}", delivery.job);
    let fence = lease.fence_if_any().map_or_else(|| "none".to_string(), |f| f.to_string());
    let attempt = format!("a{}-w{worker}-f{fence}", delivery.attempt);
    let order = Order { sku: &sku, job: &job, attempt: &attempt, qty: 1 };
    let outcome = sim.warehouse.allocate(&lease, sim.args.mode, &order, pause).await;
    let finished = count(sim, outcome, &sim.counters.applied);
    finish(sim, delivery, finished);
    let _ = lease.release().await; // NotHolder after a pause is expected
}

async fn report<L: LockService + ?Sized>(
    sim: &Sim<L>,
    started: Instant,
    elapsed: Duration,
) -> Result<serde_json::Value, AppError> {
    let audit = sim.warehouse.audit(None).await?;
    let allocations: usize = audit.values().sum();
    let transfers = sim.warehouse.transfers().await?;
    // A job applied more than once: an allocation with two audit rows, a transfer moved twice.
    let duplicates =
        audit.values().filter(|&&n| n > 1).count() + transfers.values().filter(|t| t.out.max(t.into) > 1).count();
    let half_applied = transfers.values().filter(|t| t.out != t.into).count();
    let mut stock_decrements = 0i64;
    let mut stock_left = 0i64;
    for s in 0..sim.args.skus {
        let left = sim.warehouse.stock(&sku_name(s)).await?.map_or(0, |st| st.qty);
        stock_left += left;
        stock_decrements += i64::try_from(sim.args.jobs).unwrap_or(i64::MAX) - left;
    }
    // Transfers move stock and allocations ship it: what is left plus what shipped is what
    // there was, whatever the pauses.
    let shipped = sim.warehouse.shipped().await?;
    let initial = i64::from(sim.args.skus).saturating_mul(i64::try_from(sim.args.jobs).unwrap_or(i64::MAX));
    let stock_conserved = stock_left.saturating_add(shipped) == initial;
    let mut latencies = sim.acquire_latencies.lock().map(|l| l.clone()).unwrap_or_default();
    latencies.sort_unstable();
    let pct = |p: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let rank = ((p / 100.0) * (latencies.len() - 1) as f64).round() as usize;
        latencies[rank.min(latencies.len() - 1)].as_secs_f64() * 1000.0
    };
    let c = &sim.counters;
    let secs = elapsed.as_secs_f64().max(1e-9);
    let tenths = sim.tenths.rates(started, sim.args.jobs);
    let last_vs_first = match (tenths.first(), tenths.last()) {
        (Some(&first), Some(&last)) if first > 0.0 => json!((last / first * 100.0).round() / 100.0),
        _ => serde_json::Value::Null,
    };
    Ok(json!({
        "mode": if sim.args.mode == Mode::Fenced { "fenced" } else { "unfenced" },
        "run": sim.run_id,
        "jobs": sim.args.jobs,
        "workers": sim.args.workers,
        "skus": sim.args.skus,
        "ttl_ms": sim.args.ttl.as_millis() as u64,
        "pause_every": sim.args.pause_every,
        "pause_ms": sim.args.pause.as_millis() as u64,
        "applied": c.applied.load(Ordering::SeqCst),
        "fence_rejected": c.fence_rejected.load(Ordering::SeqCst),
        "already_done": c.already_done.load(Ordering::SeqCst),
        "duplicates": duplicates,
        "transfer_every": sim.args.transfer_every,
        "transfers": c.transfers.load(Ordering::SeqCst),
        "transfer_jobs_applied": transfers.len(),
        "half_applied": half_applied,
        "shipped": shipped,
        "stock_conserved": stock_conserved,
        "audit_allocations": allocations,
        "jobs_applied": audit.len(),
        "stock_decrements": stock_decrements,
        "lost_updates": i64::try_from(allocations).unwrap_or(i64::MAX) - stock_decrements,
        "pauses": c.pauses.load(Ordering::SeqCst),
        "redeliveries": c.redeliveries.load(Ordering::SeqCst),
        "errors": c.lock_errors.load(Ordering::SeqCst),
        "elapsed_ms": elapsed.as_millis() as u64,
        "jobs_per_sec": (sim.args.jobs as f64 / secs * 10.0).round() / 10.0,
        "acquire_p50_ms": (pct(50.0) * 1000.0).round() / 1000.0,
        "acquire_p99_ms": (pct(99.0) * 1000.0).round() / 1000.0,
        "tenths_jobs_per_sec": tenths,
        "last_tenth_vs_first": last_vs_first,
        "lock": sim.locks.backend(),
        "store": sim.warehouse.backend(),
    }))
}

fn print_human(r: &serde_json::Value) {
    println!("warehouse simulation ({}), run {}", r["mode"].as_str().unwrap_or("?"), r["run"].as_str().unwrap_or("?"));
    println!(
        "  {} jobs, {} workers, {} SKUs, TTL {} ms, a {} ms pause every {} jobs ({} pauses)",
        r["jobs"], r["workers"], r["skus"], r["ttl_ms"], r["pause_ms"], r["pause_every"], r["pauses"]
    );
    println!(
        "  applied {}   stale writes refused {}   already done {}   redeliveries {}   errors {}",
        r["applied"], r["fence_rejected"], r["already_done"], r["redeliveries"], r["errors"]
    );
    println!(
        "  duplicates {} (jobs applied more than once, from the audit table)   lost stock updates {}",
        r["duplicates"], r["lost_updates"]
    );
    if r["transfer_every"].as_u64().unwrap_or(0) > 0 {
        println!(
            "  transfers applied {}   half applied {}   stock conserved {} (stock left + {} shipped = initial)",
            r["transfers"], r["half_applied"], r["stock_conserved"], r["shipped"]
        );
    }
    println!(
        "  {} ms, {} jobs/s, acquire p50 {} ms p99 {} ms  [{} lock, {} store]",
        r["elapsed_ms"],
        r["jobs_per_sec"],
        r["acquire_p50_ms"],
        r["acquire_p99_ms"],
        r["lock"].as_str().unwrap_or("?"),
        r["store"].as_str().unwrap_or("?")
    );
}

/// A progress bar on a terminal, a progress line every 2 s otherwise; silent for short runs.
struct Progress {
    bar: Option<ProgressBar>,
    total: u64,
    quiet: bool,
    last_line: std::sync::Mutex<Instant>,
}

impl Progress {
    fn start(total: u64, quiet: bool) -> Self {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::new(total);
            if let Ok(style) = ProgressStyle::with_template(
                "{spinner} {pos}/{len} jobs [{elapsed_precise}] {wide_bar} {per_sec}, ETA {eta}",
            ) {
                bar.set_style(style);
            }
            bar
        });
        Progress { bar, total, quiet, last_line: std::sync::Mutex::new(Instant::now()) }
    }

    fn update(&self, done: u64, elapsed: Duration) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            return;
        }
        if self.quiet {
            return;
        }
        if let Ok(mut last) = self.last_line.lock()
            && last.elapsed() >= Duration::from_secs(2)
        {
            *last = Instant::now();
            let rate = done as f64 / elapsed.as_secs_f64().max(1e-3);
            let eta =
                if rate > 0.0 { format!("{:.0} s", self.total.saturating_sub(done) as f64 / rate) } else { "?".into() };
            eprintln!(
                "progress: {done}/{} jobs after {:.1} s ({rate:.0} jobs/s, ETA {eta})",
                self.total,
                elapsed.as_secs_f64()
            );
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
