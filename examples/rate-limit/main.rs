//! # Rate limit: at most N calls in flight to a partner's API, and a frozen caller cannot count twice
//!
//! ```sh
//! cargo run --example rate-limit                      # embedded default
//! cargo run --features redis,postgres,palisade-examples/postgres --example rate-limit -- --lock redis://… --store postgres://…
//! ```
//!
//! **What goes wrong without a fence.** A partner allows 3 concurrent calls. Workers take a
//! permit of a distributed semaphore before each call and record the call's outcome afterwards.
//! A worker that freezes mid-call (a GC pause) loses its permit at the TTL, another worker takes
//! that permit and makes its call; then the frozen one wakes and records its call as if it had
//! held the permit all along: the ledger of who held which permit when is wrong, and any
//! accounting built on it (billing per permit, retries of "unfinished" calls) is too.
//!
//! **How this example prevents it.**
//! - `Semaphore::new(locks, key, 3)`: 3 permits, each the lock of its own slot, so at most 3
//!   workers hold one at a time (the example measures it).
//! - Each worker records its call **under its permit**: a fenced write judged under the permit's
//!   slot. A frozen worker's record carries a lower fence than the slot's next holder's, which
//!   wrote first: refused with `StaleFence`.

use palisade_examples::common;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use palisade::prelude::*;
use serde_json::json;

/// At most N calls in flight, under a fenced semaphore.
#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    common: common::Common,
    /// Permits: calls in flight at once.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=64))]
    permits: u32,
    /// Workers.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=64))]
    workers: u64,
    /// Calls per worker (the others go on until the frozen worker has woken).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    calls: u64,
}

#[derive(Default)]
struct Tally {
    in_flight: AtomicI64,
    most_in_flight: AtomicI64,
    calls: AtomicU64,
    recorded: AtomicU64,
    stale_refused: AtomicU64,
    /// The frozen worker has woken and tried to record: the others may stop.
    thawed: AtomicBool,
}

async fn worker(
    sem: Semaphore<DynLockService>,
    store: Arc<DynFencedStore>,
    tally: Arc<Tally>,
    (id, calls, ttl, pause, run): (u64, u64, Duration, Duration, String),
) -> palisade::Result<()> {
    // Every worker makes its calls; the others go on until the frozen one has woken, so that
    // its permit's slot is taken and used while it sleeps.
    let mut call = 0;
    while call < calls || (id != 0 && !tally.thawed.load(Ordering::SeqCst)) {
        tally.calls.fetch_add(1, Ordering::SeqCst);
        let permit = sem.acquire(LockOptions::ttl(ttl).wait(Duration::from_secs(60))).await?;
        let now = tally.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        tally.most_in_flight.fetch_max(now, Ordering::SeqCst);
        // Worker 0's first call freezes past the TTL: its permit goes to another worker.
        let frozen = id == 0 && call == 0;
        if frozen {
            println!("worker 0 (permit {}, fence {}) froze mid-call", permit.key(), permit.fence());
            tally.in_flight.fetch_sub(1, Ordering::SeqCst); // it no longer holds the permit in fact
            tokio::time::sleep(pause).await;
            // A long freeze: it wakes once the slot's next holder has recorded a call.
            let slot = format!("ratelimit/{run}/{}/", permit.key());
            for _ in 0..1500 {
                let later = store.list(&slot).await?.iter().any(|(_, r)| r.fence > Some(permit.fence()));
                if later {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        } else {
            tokio::time::sleep(Duration::from_millis(25)).await; // the call
            tally.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        let record = WriteBatch::new().put(format!("ratelimit/{run}/{}/{id}-{call}", permit.key()), b"called".to_vec());
        match store.write(&permit, &record).await {
            Ok(()) => {
                tally.recorded.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) if e.stale_fence_details().is_some() => {
                println!(
                    "worker {id}: its record under {} was refused ({e}): the permit was no longer its own",
                    permit.key()
                );
                tally.stale_refused.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => return Err(e),
        }
        if frozen {
            tally.thawed.store(true, Ordering::SeqCst);
        }
        let _ = permit.release().await; // NotHolder after the freeze is expected
        call += 1;
    }
    Ok(())
}

async fn run(args: Args) -> palisade::Result<ExitCode> {
    let store = args.common.store().await?;
    let run = common::run_id()?;
    let key = ResourceKey::new("partner-api", format!("calls-{run}"))?;
    let tally = Arc::new(Tally::default());
    let mut workers = Vec::new();
    for id in 0..args.workers {
        let sem = Semaphore::new(args.common.lock_client().await?, key.clone(), args.permits)?;
        let settings = (id, args.calls, args.common.ttl(), args.common.pause(), run.clone());
        workers.push(tokio::spawn(worker(sem, Arc::clone(&store), Arc::clone(&tally), settings)));
    }
    for w in workers {
        w.await.map_err(|e| Error::new(ErrorKind::Backend, "example", format!("a worker panicked: {e}")))??;
    }
    let most = tally.most_in_flight.load(Ordering::SeqCst);
    let (recorded, stale) = (tally.recorded.load(Ordering::SeqCst), tally.stale_refused.load(Ordering::SeqCst));
    let calls = tally.calls.load(Ordering::SeqCst);
    let held = most <= i64::from(args.permits) && recorded + stale == calls;
    Ok(common::finish(
        json!({
            "example": "rate-limit",
            "permits": args.permits,
            "calls": calls,
            "most_in_flight": most,
            "recorded": recorded,
            "stale_refused": stale,
            "ok": held,
        }),
        held,
    ))
}

fn main() -> ExitCode {
    let args = Args::parse();
    common::main_with(|| run(args))
}
