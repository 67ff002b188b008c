//! The worker process the fault scenarios freeze (`SIGSTOP`) and kill (`SIGKILL`): it takes the
//! lock, says so, waits for "go" on stdin, then writes under its lease and reports the outcome.

use palisade::LockOptions;
use std::process::ExitCode;
use std::time::Duration;

use palisade::{AnyLockService, FencedStoreExt, LockService, LockServiceExt, ResourceKey, WriteBatch};
use tokio::io::{AsyncBufReadExt, BufReader};

/// `palisade worker` flags (internal).
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    #[arg(long)]
    pub lock: String,
    #[arg(long)]
    pub store: String,
    /// The scenario's namespace (resource domain and record prefix).
    #[arg(long)]
    pub ns: String,
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

async fn work(args: &WorkerArgs) -> palisade::Result<()> {
    let store = palisade::connect_store(&args.store).await?;
    let key = ResourceKey::new(args.ns.clone(), "fault")?;
    let ttl = Duration::from_millis(args.ttl_ms);
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
