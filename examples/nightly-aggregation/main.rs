//! # Nightly aggregation: exactly one scheduler runs tonight's job, and a late one cannot undo it
//!
//! ```sh
//! cargo run --example nightly-aggregation                      # embedded default
//! cargo run --features redis,postgres,palisade-examples/postgres --example nightly-aggregation -- --lock redis://… --store postgres://…
//! ```
//!
//! **What goes wrong without a fence.** Several schedulers fire at midnight; a lock makes one of
//! them run the job. The job is longer than the lock's TTL, so it renews. If the runner freezes
//! (a GC pause, a VM migration) its lease runs out, the next scheduler tick takes the lock and
//! finishes the job, and then the frozen runner wakes up and carries on: it overwrites the job's
//! progress and tonight's result with its own stale view, or runs the rest of the job twice.
//!
//! **How this example prevents it.**
//! - Every scheduler uses `try_lock`: if the job is held, it skips (no queue of schedulers).
//! - The job works in chunks that each finish well under half the TTL, and acks progress after
//!   every chunk by writing the job row **with the lease's fence** (the fix's advice).
//! - The lease is renewed only while progress moves (`renew_on_progress`): a frozen runner stops
//!   renewing, so its lease expires and another scheduler can resume from the acked chunk.
//! - The result row is written with the fence too. When the frozen runner wakes, its next ack is
//!   refused with `StaleFence` and it stops: tonight's result stays the one the live runner wrote.

use palisade_examples::common;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use palisade::prelude::*;
use palisade::{DynFencedStore, Fence};
use serde_json::json;

/// Nightly aggregation under a fenced lock.
#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    common: common::Common,
    /// Schedulers that fire at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    schedulers: u64,
    /// Do not freeze the first runner (the clean path).
    #[arg(long)]
    no_pause: bool,
}

const CHUNKS: u64 = 8;
const EVENTS_PER_CHUNK: u64 = 25;
/// The chunk the first runner freezes before.
const FREEZE_AT: u64 = 3;

#[derive(Default)]
struct Tally {
    started: AtomicU64,
    skipped: AtomicU64,
    already_done: AtomicU64,
    stale_refused: AtomicU64,
}

struct Job {
    store: Arc<DynFencedStore>,
    run: String,
    key: ResourceKey,
    ttl: Duration,
    pause: Duration,
    tally: Tally,
}

impl Job {
    fn event_key(&self, i: u64) -> String {
        format!("agg/{}/event/{i:05}", self.run)
    }
    fn job_row(&self) -> String {
        format!("agg/{}/job", self.run)
    }
    fn result_row(&self) -> String {
        format!("agg/{}/result", self.run)
    }

    /// One scheduler tick on one scheduler: skip if the job is held, else run (or resume) it.
    async fn tick(self: Arc<Self>, locks: Arc<DynLockService>, freeze: bool) -> palisade::Result<()> {
        let Some(lease) = locks.try_lock(&self.key, self.ttl).await? else {
            self.tally.skipped.fetch_add(1, Ordering::SeqCst);
            return Ok(());
        };
        if self.store.read(&self.result_row()).await?.is_some() {
            self.tally.already_done.fetch_add(1, Ordering::SeqCst);
            return lease.release().await;
        }
        self.tally.started.fetch_add(1, Ordering::SeqCst);
        let progress = Progress::new();
        let _renewal = lease.renew_on_progress(&progress);
        // Resume from the last acked chunk (written under an earlier runner's fence, maybe).
        let (mut next, mut sum) = match self.store.read(&self.job_row()).await? {
            Some(row) => parse_progress(&row.value),
            None => (0, 0),
        };
        while next < CHUNKS {
            if freeze && next == FREEZE_AT {
                println!("runner fence {}: frozen before chunk {next} (no progress, no renewal)", lease.fence());
                tokio::time::sleep(self.pause).await;
                println!("runner fence {}: woke up, carrying on as if nothing happened", lease.fence());
            }
            // The chunk's work: well under half the TTL.
            for i in next * EVENTS_PER_CHUNK..(next + 1) * EVENTS_PER_CHUNK {
                if let Some(event) = self.store.read(&self.event_key(i)).await? {
                    sum += parse_u64(&event.value);
                }
            }
            tokio::time::sleep(self.ttl / 6).await;
            next += 1;
            let mut batch = WriteBatch::new().put(self.job_row(), format!("{next} {sum}"));
            if next == CHUNKS {
                batch = batch.put(self.result_row(), sum.to_string());
            }
            match self.store.write(&lease, &batch).await {
                Ok(()) => progress.tick(),
                Err(e) if e.stale_fence_details().is_some() => {
                    println!("runner fence {}: ack of chunk {next} refused ({e}); stopping", lease.fence());
                    self.tally.stale_refused.fetch_add(1, Ordering::SeqCst);
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
        println!("runner fence {}: finished, result {sum}", lease.fence());
        lease.release().await
    }
}

fn parse_u64(bytes: &[u8]) -> u64 {
    std::str::from_utf8(bytes).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

fn parse_progress(bytes: &[u8]) -> (u64, u64) {
    let text = String::from_utf8_lossy(bytes);
    let mut parts = text.split_whitespace().map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

async fn run(args: Args) -> palisade::Result<ExitCode> {
    let store = args.common.store().await?;
    let run = common::run_id()?;
    let key = ResourceKey::new("nightly", format!("agg-{run}"))?;
    let job = Arc::new(Job {
        store: Arc::clone(&store),
        run,
        key,
        ttl: args.common.ttl(),
        pause: args.common.pause(),
        tally: Tally::default(),
    });
    // Yesterday's events (a batch holds at most 64 operations).
    let mut expected = 0;
    for chunk in 0..CHUNKS {
        let mut events = WriteBatch::new();
        for i in chunk * EVENTS_PER_CHUNK..(chunk + 1) * EVENTS_PER_CHUNK {
            let amount = i % 97 + 1;
            expected += amount;
            events = events.put(job.event_key(i), amount.to_string());
        }
        store.apply_unfenced(&events).await?;
    }
    let mut clients = Vec::new();
    for _ in 0..args.schedulers {
        clients.push(args.common.lock_client().await?);
    }

    // Midnight: every scheduler fires at once. The winner is the one that will freeze.
    let first: Vec<_> =
        clients.iter().map(|locks| tokio::spawn(Arc::clone(&job).tick(Arc::clone(locks), !args.no_pause))).collect();
    // Wait until every first-tick scheduler has either started the job or skipped it.
    for _ in 0..2_000 {
        if job.tally.started.load(Ordering::SeqCst) + job.tally.skipped.load(Ordering::SeqCst) >= args.schedulers {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let first_winners = job.tally.started.load(Ordering::SeqCst);
    let first_skipped = job.tally.skipped.load(Ordering::SeqCst);
    println!("midnight: {first_winners} scheduler runs the job, {first_skipped} skip it");

    // The schedulers keep ticking (every half TTL, one at a time) until tonight's result exists.
    let mut later = Vec::new();
    let mut tick = 0usize;
    while store.read(&job.result_row()).await?.is_none() {
        tokio::time::sleep(args.common.ttl() / 2).await;
        let locks = Arc::clone(&clients[tick % clients.len()]);
        later.push(tokio::spawn(Arc::clone(&job).tick(locks, false)));
        tick += 1;
        if tick > 2_000 {
            return Err(Error::new(ErrorKind::Timeout, "example", "no result after 2000 scheduler ticks"));
        }
    }
    for handle in first.into_iter().chain(later) {
        handle.await.map_err(|e| Error::new(ErrorKind::Backend, "example", format!("a scheduler panicked: {e}")))??;
    }
    let result = store.read(&job.result_row()).await?;
    let (value, fence) = match &result {
        Some(r) => (parse_u64(&r.value), r.fence),
        None => (0, None),
    };
    let t = &job.tally;
    let stale = t.stale_refused.load(Ordering::SeqCst);
    let runs = t.started.load(Ordering::SeqCst);
    let held = first_winners == 1 && value == expected && (args.no_pause || (stale == 1 && runs == 2));
    println!("tonight's result {value} (expected {expected}), written under fence {}", fence.map_or(0, Fence::get));
    Ok(common::finish(
        json!({
            "example": "nightly-aggregation",
            "schedulers": args.schedulers,
            "first_tick_runners": first_winners,
            "first_tick_skipped": first_skipped,
            "runs": runs,
            "skipped": t.skipped.load(Ordering::SeqCst),
            "already_done": t.already_done.load(Ordering::SeqCst),
            "stale_writes_refused": stale,
            "result": value,
            "expected": expected,
            "result_fence": fence.map(Fence::get),
            "lock": args.common.lock.split(':').next(),
            "ok": held,
        }),
        held,
    ))
}

fn main() -> ExitCode {
    let args = Args::parse();
    common::main_with(|| run(args))
}
