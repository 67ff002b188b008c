//! `setup`, `show`, `allocate`, and dispatch.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use palisade::DynLockService;
use palisade::prelude::*;
use serde_json::json;

use super::cli::{Cli, Command, WorkArgs, millis};
use super::inventory::{Mode, Order, Outcome, Transfer, Warehouse};
use super::simulate;

/// The exit code for an error: 2 for bad input, 1 for everything else.
pub fn exit_code_for(e: &AppError) -> u8 {
    match e {
        AppError::Usage(_) => 2,
        AppError::Runtime(_) => 1,
    }
}

/// A failure, already sorted into bad input and runtime trouble.
#[derive(Debug)]
pub enum AppError {
    /// Bad input (exit 2).
    Usage(String),
    /// Anything else (exit 1).
    Runtime(String),
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Usage(m) | AppError::Runtime(m) => f.write_str(m),
        }
    }
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        match e.kind() {
            ErrorKind::InvalidKey | ErrorKind::InvalidArgument | ErrorKind::InvalidConfig | ErrorKind::Unsupported => {
                AppError::Usage(e.report().to_string())
            }
            _ => AppError::Runtime(e.report().to_string()),
        }
    }
}

/// The lock service and the warehouse's data (its tables on PostgreSQL and SQLite).
pub async fn connect(cli: &Cli) -> Result<(Arc<DynLockService>, Warehouse), AppError> {
    let locks = palisade::connect_lock(&cli.lock_url()).await?;
    let warehouse = Warehouse::connect(&cli.store, "").await?;
    Ok((locks, warehouse))
}

/// For `simulate`, which also runs on an unfenced lock (Redlock) to show what it lets through.
pub async fn connect_any(cli: &Cli) -> Result<palisade::AnyLockService, AppError> {
    Ok(palisade::connect_any_lock(&cli.lock_url()).await?)
}

/// Runs the parsed command line; the exit code on success, or the error to report.
pub async fn run(cli: Cli) -> Result<ExitCode, AppError> {
    match &cli.command {
        Command::Simulate(args) => simulate::run(&cli, args).await,
        Command::Setup { sku, qty } => setup(&cli, sku, *qty).await,
        Command::Show { sku } => show(&cli, sku).await,
        Command::Allocate { sku, work } => allocate(&cli, sku, work).await,
        Command::Transfer { from, to, work } => transfer(&cli, from, to, work).await,
    }
}

fn warn_if_single_process(cli: &Cli) {
    let lock = cli.lock_url();
    if lock.starts_with("memory:") {
        eprintln!(
            "warehouse: note: {} locks only exclude within this process; use sqlite://FILE or a lock server to coordinate processes",
            lock
        );
    }
}

async fn setup(cli: &Cli, sku: &str, qty: i64) -> Result<ExitCode, AppError> {
    Warehouse::resource(sku)?;
    let (locks, warehouse) = connect(cli).await?;
    let options = LockOptions::ttl(Duration::from_secs(30)).wait(Duration::from_secs(60));
    let lease = warehouse
        .lock_checked(&locks, sku, options)
        .await?
        .ok_or_else(|| AppError::Runtime(format!("the lock on {sku} did not come free")))?;
    warehouse.set_stock(&lease, sku, qty).await?;
    println!("{}", json!({"event": "setup", "sku": sku, "qty": qty, "fence": lease.fence().get()}));
    lease.release().await?;
    Ok(ExitCode::SUCCESS)
}

async fn show(cli: &Cli, sku: &str) -> Result<ExitCode, AppError> {
    Warehouse::resource(sku)?;
    let warehouse = Warehouse::connect(&existing_only(&cli.store), "").await?;
    let stock = warehouse.stock(sku).await?.ok_or_else(|| {
        AppError::Runtime(format!("unknown SKU {sku:?}: run `warehouse setup --sku {sku} --qty N` first"))
    })?;
    let audit = warehouse.audit(Some(sku)).await?;
    let allocations: usize = audit.values().sum();
    let duplicate_jobs = audit.values().filter(|&&n| n > 1).count();
    println!(
        "{}",
        json!({
            "sku": sku,
            "qty": stock.qty,
            "fence": stock.fence.map(|f| f.get()),
            "allocations": allocations,
            "duplicate_jobs": duplicate_jobs,
        })
    );
    Ok(ExitCode::SUCCESS)
}

/// `show` only reads: an SQLite file is opened only if it exists (`mode=rw`), so a mistyped
/// path is an error that names it instead of a new, empty database.
fn existing_only(store: &str) -> String {
    let is_file = store.starts_with("sqlite:") && !store.contains(":memory:");
    if !is_file || store.contains("mode=") {
        return store.to_string();
    }
    let separator = if store.contains('?') { '&' } else { '?' };
    format!("{store}{separator}mode=rw")
}

fn emit(value: serde_json::Value) -> Result<(), AppError> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{value}").and_then(|()| out.flush()).map_err(|e| AppError::Runtime(format!("stdout: {e}")))
}

async fn allocate(cli: &Cli, sku: &str, work: &WorkArgs) -> Result<ExitCode, AppError> {
    let WorkArgs { qty, ttl_ms, think_ms, wait_ms, .. } = *work;
    let key = Warehouse::resource(sku)?;
    let ttl = palisade::Ttl::new(millis(ttl_ms))?.get();
    let wait = millis(wait_ms);
    let job = job_id(work.job.as_deref())?;
    warn_if_single_process(cli);
    let (locks, warehouse) = connect(cli).await?;
    // Checked against where the stock keeps its fence: a lock service that lost its fence
    // counter is noticed and repaired here instead of having every write refused (fencing
    // rule 5). `--wait-ms 0` tries once: a held lock is a runtime outcome (exit 1), like a
    // wait that ran out.
    let lease = warehouse.lock_checked(&locks, sku, LockOptions::ttl(ttl).wait(wait)).await?.ok_or_else(|| {
        AppError::Runtime(format!("the lock on {key} is held by another worker (--wait-ms 0 tries once)"))
    })?;
    let fence = lease.fence().get();
    emit(json!({"event": "acquired", "fence": fence, "job": job}))?;
    let attempt = lease.token().to_string();
    let outcome = warehouse
        .allocate(&lease, Mode::Fenced, &Order { sku, job: &job, attempt: &attempt, qty }, millis(think_ms))
        .await?;
    let code = match outcome {
        Outcome::Applied => {
            emit(json!({"event": "write", "fence": fence, "applied": true}))?;
            ExitCode::SUCCESS
        }
        Outcome::StaleFence { presented, current } => {
            emit(
                json!({"event": "write", "fence": presented.get(), "applied": false, "reason": "stale_fence", "current": current.get()}),
            )?;
            eprintln!("warehouse: write refused: fence {presented} is stale, the store has accepted {current}");
            ExitCode::from(3)
        }
        Outcome::AlreadyDone => {
            emit(json!({"event": "write", "fence": fence, "applied": false, "reason": "already_done"}))?;
            eprintln!("warehouse: job {job} was already applied by another worker; nothing to do");
            ExitCode::from(5)
        }
        Outcome::InsufficientStock { available } => {
            emit(json!({"event": "write", "fence": fence, "applied": false, "reason": "insufficient_stock"}))?;
            eprintln!("warehouse: insufficient stock for {sku}: {available} available, {qty} requested");
            ExitCode::from(1)
        }
        Outcome::UnknownSku => {
            eprintln!("warehouse: unknown SKU {sku:?}: run `warehouse setup --sku {sku} --qty N` first");
            ExitCode::from(1)
        }
    };
    // A stale holder no longer holds the lock: NotHolder is expected and harmless here.
    if let Err(e) = lease.release().await
        && e.kind() != ErrorKind::NotHolder
    {
        eprintln!("warehouse: release failed: {}", e.report());
    }
    Ok(code)
}

/// `--job`, checked (a record key without '/'), or a fresh random id.
fn job_id(job: Option<&str>) -> Result<String, AppError> {
    match job {
        Some(job) => {
            palisade::spi::validate_record_key(job)?;
            if job.contains('/') {
                return Err(AppError::Usage("job id must not contain '/'".into()));
            }
            Ok(job.to_string())
        }
        None => Ok(format!("job-{}", palisade::OwnerToken::generate()?)),
    }
}

/// `transfer`'s flags.
async fn transfer(cli: &Cli, from: &str, to: &str, work: &WorkArgs) -> Result<ExitCode, AppError> {
    let keys = [Warehouse::resource(from)?, Warehouse::resource(to)?];
    if from == to {
        return Err(AppError::Usage(format!("--from and --to name the same SKU ({from}): a transfer needs two")));
    }
    let ttl = palisade::Ttl::new(millis(work.ttl_ms))?.get();
    let wait = millis(work.wait_ms);
    let job = job_id(work.job.as_deref())?;
    warn_if_single_process(cli);
    let (locks, warehouse) = connect(cli).await?;
    // Fencing rule 5 for each SKU first: a lock service that lost a counter is repaired here
    // (each lock taken checked and let go at once), instead of the transfer being refused.
    for sku in [from, to] {
        if let Some(lease) = warehouse.lock_checked(&locks, sku, LockOptions::ttl(ttl).wait(wait)).await? {
            lease.release().await?;
        }
    }
    let both = locks.lock_all(&keys, LockOptions::ttl(ttl).wait(wait)).await.map_err(|e| match e.kind() {
        ErrorKind::Timeout => AppError::Runtime(format!(
            "the locks on {} and {} were not both free within --wait-ms ({})",
            keys[0],
            keys[1],
            e.report()
        )),
        _ => AppError::from(e),
    })?;
    let fences: serde_json::Map<String, serde_json::Value> = [from, to]
        .iter()
        .zip(&keys)
        .map(|(sku, key)| (sku.to_string(), json!(both.fence(key).map(|f| f.get()))))
        .collect();
    emit(json!({"event": "acquired", "fences": fences, "job": job}))?;
    let attempt = both.leases().first().map(|l| l.token().to_string()).unwrap_or_default();
    let order = Transfer { from, to, job: &job, attempt: &attempt, qty: work.qty };
    let outcome = warehouse.transfer(&both, Mode::Fenced, &order, millis(work.think_ms)).await?;
    let code = match outcome {
        Outcome::Applied => {
            emit(json!({"event": "write", "applied": true}))?;
            ExitCode::SUCCESS
        }
        Outcome::StaleFence { presented, current } => {
            emit(
                json!({"event": "write", "applied": false, "reason": "stale_fence", "fence": presented.get(), "current": current.get()}),
            )?;
            eprintln!(
                "warehouse: transfer refused whole: fence {presented} is stale, the store has accepted {current}"
            );
            ExitCode::from(3)
        }
        Outcome::AlreadyDone => {
            emit(json!({"event": "write", "applied": false, "reason": "already_done"}))?;
            eprintln!("warehouse: job {job} was already applied by another worker; nothing to do");
            ExitCode::from(5)
        }
        Outcome::InsufficientStock { available } => {
            emit(json!({"event": "write", "applied": false, "reason": "insufficient_stock"}))?;
            eprintln!("warehouse: insufficient stock for {from}: {available} available, {} requested", work.qty);
            ExitCode::from(1)
        }
        Outcome::UnknownSku => {
            eprintln!(
                "warehouse: unknown SKU {from:?} or {to:?}: run `warehouse setup --sku S --qty N` for both first"
            );
            ExitCode::from(1)
        }
    };
    // A stale holder no longer holds the locks: NotHolder is expected and harmless here.
    if let Err(e) = both.release().await
        && e.kind() != ErrorKind::NotHolder
    {
        eprintln!("warehouse: release failed: {}", e.report());
    }
    Ok(code)
}
