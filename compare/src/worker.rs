//! The worker process the fault scenarios freeze (`SIGSTOP`) and kill (`SIGKILL`): it takes the
//! lock, says so, waits for "go" on stdin, then writes under its lease and reports the outcome.

use palisade::LockOptions;
use std::process::ExitCode;
use std::time::Duration;

use palisade::{AnyLockService, FencedStoreExt, LockService, LockServiceExt, ResourceKey, WriteBatch};
use tokio::io::{AsyncBufReadExt, BufReader};

/// What an internal client process works on: its lock service, its store, and the run's
/// namespace (the resources' domain and the records' prefix). Shared by `palisade worker` and
/// `palisade torture-client`.
#[derive(Debug, Clone, clap::Args)]
pub struct PairArgs {
    #[arg(long)]
    pub lock: String,
    #[arg(long)]
    pub store: String,
    #[arg(long)]
    pub ns: String,
}

/// `palisade worker` flags (internal).
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub pair: PairArgs,
    #[arg(long)]
    pub ttl_ms: u64,
}

pub async fn run(args: WorkerArgs) -> ExitCode {
    match work(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!("error {e}");
            ExitCode::from(1)
        }
    }
}

async fn work(worker: &WorkerArgs) -> palisade::Result<()> {
    let args = &worker.pair;
    let store = palisade::connect_store(&args.store).await?;
    let key = ResourceKey::new(args.ns.clone(), "fault")?;
    let ttl = Duration::from_millis(worker.ttl_ms);
    match palisade::connect_any_lock(&args.lock).await? {
        AnyLockService::Fenced(locks) => {
            let lease = locks.lock(&key, LockOptions::ttl(ttl).wait(Duration::from_secs(60))).await?;
            println!("acquired {}", lease.fence());
            wait_for_go().await;
            let lost = tokio::time::timeout(Duration::from_millis(200), lease.lost()).await.is_ok();
            let result = store.write(&lease, &batch(&args.ns)).await;
            report(result, lost);
        }
        AnyLockService::Unfenced(locks) => {
            let lease = locks.lock(&key, LockOptions::ttl(ttl).wait(Duration::from_secs(60))).await?;
            println!("acquired -");
            wait_for_go().await;
            let lost = tokio::time::timeout(Duration::from_millis(200), lease.lost()).await.is_ok();
            let result = store.apply_unfenced(&batch(&args.ns)).await;
            report(result, lost);
            let _ = locks.backend();
        }
    }
    Ok(())
}

/// `palisade holder` flags (internal): the holder of a handoff measured across processes.
#[derive(Debug, Clone, clap::Args)]
pub struct HolderArgs {
    #[arg(long)]
    pub lock: String,
    /// The resource's domain.
    #[arg(long)]
    pub domain: String,
    /// The resource's id.
    #[arg(long)]
    pub id: String,
}

/// At a line on stdin takes the lock and says "acquired"; at the next releases it and says
/// "released" with the wall-clock time the release returned (Unix nanoseconds: the measuring
/// process reads the same clock); and so on until stdin ends. It takes the lock only when told,
/// so that it never races the measured waiter for it.
pub async fn hold(args: HolderArgs) -> ExitCode {
    let held = async {
        let key = ResourceKey::new(args.domain.clone(), args.id.clone())?;
        match palisade::connect_any_lock(&args.lock).await? {
            AnyLockService::Fenced(locks) => hold_on(locks, &key).await,
            AnyLockService::Unfenced(locks) => hold_on(locks, &key).await,
        }
    };
    match held.await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!("error {e}");
            ExitCode::from(1)
        }
    }
}

async fn hold_on<S: LockService + ?Sized + 'static>(
    locks: std::sync::Arc<S>,
    key: &ResourceKey,
) -> palisade::Result<()> {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(_)) = lines.next_line().await {
        let lease = locks.lock(key, LockOptions::ttl(Duration::from_secs(10)).wait(Duration::from_secs(60))).await?;
        println!("acquired");
        let go = lines.next_line().await;
        lease.release().await?;
        if !matches!(go, Ok(Some(_))) {
            break;
        }
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        println!("released {}", now.as_nanos());
    }
    Ok(())
}

fn batch(ns: &str) -> WriteBatch {
    WriteBatch::new().put(format!("{ns}/data"), b"A".to_vec()).put(format!("{ns}/audit/A"), b"A".to_vec())
}

fn report(result: palisade::Result<()>, lost: bool) {
    match result {
        Ok(()) => println!("wrote ok lost={lost}"),
        Err(e) if e.stale_fence_details().is_some() => println!("wrote stale lost={lost}"),
        Err(e) => println!("wrote error lost={lost} {e}"),
    }
}

async fn wait_for_go() {
    let mut line = String::new();
    let _ = BufReader::new(tokio::io::stdin()).read_line(&mut line).await;
}
