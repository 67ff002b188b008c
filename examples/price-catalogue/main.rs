//! # Price catalogue: many readers or one writer, and a frozen writer cannot change prices under the readers
//!
//! ```sh
//! cargo run --example price-catalogue                 # embedded default
//! cargo run --features redis,postgres,palisade-examples/postgres --example price-catalogue -- --lock redis://… --store postgres://…
//! ```
//!
//! **What goes wrong without a fence.** Pricing services read the catalogue under a read lock
//! (many at once) and a repricing job rewrites it under the write lock. A repricing job that
//! freezes (a GC pause) loses its write lock at the TTL; readers come back in, and then the
//! frozen job wakes and writes its prices **while readers hold their read locks**: a reader
//! that reads the price twice sees it change (a torn read), under a lock that promised it
//! could not. A reader that freezes after reading wakes after a repricing and serves the old
//! price as current.
//!
//! **How this example prevents it.**
//! - `RwLock::new(locks, store, key, max_readers)`: readers and writers take their fences
//!   from one sequence, and every entry records its generation in the store.
//! - The repricing job writes **under its write lease**: once a reader entered after its TTL,
//!   the store refuses the frozen job's write with `StaleFence` (nothing written).
//! - A reader calls `check()` after reading: refused with `StaleFence` when a writer entered
//!   after it, so the frozen reader drops what it read instead of serving it.

use palisade_examples::common;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use palisade::prelude::*;
use serde_json::json;

/// Many pricing readers, a few repricing writers, under a fenced read-write lock.
#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    common: common::Common,
    /// Readers (pricing services).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    readers: u64,
    /// Writers (repricing jobs).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=16))]
    writers: u64,
    /// Repricings per writer (writers go on until the frozen reader has woken).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(2..=1_000))]
    repricings: u64,
    /// Readers allowed in at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    max_readers: u32,
}

#[derive(Default)]
struct Tally {
    readers_in: AtomicI64,
    most_readers: AtomicI64,
    writers_in: AtomicI64,
    overlaps: AtomicU64,
    reads_served: AtomicU64,
    torn_reads: AtomicU64,
    stale_reads_refused: AtomicU64,
    repricings: AtomicU64,
    stale_writes_refused: AtomicU64,
    /// The frozen reader and writer have woken and acted: the others may stop.
    reader_thawed: AtomicBool,
    writer_thawed: AtomicBool,
}

impl Tally {
    fn done(&self) -> bool {
        self.reader_thawed.load(Ordering::SeqCst) && self.writer_thawed.load(Ordering::SeqCst)
    }
}

fn price(value: Option<palisade::Record>) -> u64 {
    value.and_then(|r| String::from_utf8(r.value).ok()).and_then(|s| s.parse().ok()).unwrap_or(0)
}

async fn reader(
    rw: RwLock<DynLockService>,
    store: Arc<DynFencedStore>,
    tally: Arc<Tally>,
    (id, ttl, pause, record): (u64, Duration, Duration, String),
) -> palisade::Result<()> {
    let mut first = true;
    while !tally.done() {
        let read = rw.read(LockOptions::ttl(ttl).wait(Duration::from_secs(60))).await?;
        let now = tally.readers_in.fetch_add(1, Ordering::SeqCst) + 1;
        tally.most_readers.fetch_max(now, Ordering::SeqCst);
        if tally.writers_in.load(Ordering::SeqCst) > 0 {
            tally.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let seen = price(store.read(&record).await?);
        let frozen = id == 0 && first;
        if frozen {
            // Reader 0 freezes after its first read, past its TTL: writers reprice meanwhile.
            println!("reader 0 (generation {}) froze after reading price {seen}", read.generation());
            tally.readers_in.fetch_sub(1, Ordering::SeqCst);
            tokio::time::sleep(pause).await;
        } else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if price(store.read(&record).await?) != seen {
                tally.torn_reads.fetch_add(1, Ordering::SeqCst);
            }
            tally.readers_in.fetch_sub(1, Ordering::SeqCst);
        }
        match read.check().await {
            Ok(()) => {
                tally.reads_served.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) if e.stale_fence_details().is_some() => {
                println!("reader {id}: price {seen} not served ({e}): a writer came in after it");
                tally.stale_reads_refused.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => return Err(e),
        }
        if frozen {
            tally.reader_thawed.store(true, Ordering::SeqCst);
        }
        let _ = read.release().await; // NotHolder after the freeze is expected
        first = false;
    }
    Ok(())
}

async fn writer(
    rw: RwLock<DynLockService>,
    store: Arc<DynFencedStore>,
    tally: Arc<Tally>,
    (id, repricings, ttl, pause, record): (u64, u64, Duration, Duration, String),
) -> palisade::Result<()> {
    let mut round = 0;
    while round < repricings || !tally.done() {
        let lease = rw.write(LockOptions::ttl(ttl).wait(Duration::from_secs(60))).await?;
        tally.writers_in.fetch_add(1, Ordering::SeqCst);
        if tally.readers_in.load(Ordering::SeqCst) > 0 || tally.writers_in.load(Ordering::SeqCst) > 1 {
            tally.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let next = price(store.read(&record).await?) + 1;
        // Writer 0's second repricing freezes past its TTL before it writes.
        let frozen = id == 0 && round == 1;
        if frozen {
            println!("writer 0 (fence {}) froze before writing price {next}", lease.fence());
            tally.writers_in.fetch_sub(1, Ordering::SeqCst);
            tokio::time::sleep(pause).await;
        }
        match store.write(&lease, &WriteBatch::new().put(record.clone(), next.to_string().into_bytes())).await {
            Ok(()) => {
                tally.repricings.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) if e.stale_fence_details().is_some() => {
                println!("writer {id}: price {next} refused ({e}): readers or a writer came in after it");
                tally.stale_writes_refused.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => return Err(e),
        }
        if frozen {
            tally.writer_thawed.store(true, Ordering::SeqCst);
        } else {
            tokio::time::sleep(Duration::from_millis(5)).await;
            tally.writers_in.fetch_sub(1, Ordering::SeqCst);
        }
        let _ = lease.release().await;
        round += 1;
        // Give readers a turn between repricings.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

async fn run(args: Args) -> palisade::Result<ExitCode> {
    let store = args.common.store().await?;
    let run = common::run_id()?;
    let key = ResourceKey::new("catalogue", format!("prices-{run}"))?;
    let record = format!("catalogue/{run}/price/sku-1");
    let tally = Arc::new(Tally::default());
    let (ttl, pause) = (args.common.ttl(), args.common.pause());
    let mut tasks = Vec::new();
    for id in 0..args.readers {
        let rw = RwLock::new(args.common.lock_client().await?, store.clone(), key.clone(), args.max_readers)?;
        let settings = (id, ttl, pause, record.clone());
        tasks.push(tokio::spawn(reader(rw, Arc::clone(&store), Arc::clone(&tally), settings)));
    }
    for id in 0..args.writers {
        let rw = RwLock::new(args.common.lock_client().await?, store.clone(), key.clone(), args.max_readers)?;
        let settings = (id, args.repricings, ttl, pause, record.clone());
        tasks.push(tokio::spawn(writer(rw, Arc::clone(&store), Arc::clone(&tally), settings)));
    }
    for t in tasks {
        t.await.map_err(|e| Error::new(ErrorKind::Backend, "example", format!("a task panicked: {e}")))??;
    }
    let load = |n: &AtomicU64| n.load(Ordering::SeqCst);
    let most = tally.most_readers.load(Ordering::SeqCst);
    let (torn, overlaps) = (load(&tally.torn_reads), load(&tally.overlaps));
    let (stale_reads, stale_writes) = (load(&tally.stale_reads_refused), load(&tally.stale_writes_refused));
    let held = torn == 0
        && overlaps == 0
        && most <= i64::from(args.max_readers)
        && stale_reads >= 1
        && stale_writes >= 1
        && price(store.read(&record).await?) == load(&tally.repricings);
    Ok(common::finish(
        json!({
            "example": "price-catalogue",
            "max_readers": args.max_readers,
            "most_readers_at_once": most,
            "reads_served": load(&tally.reads_served),
            "torn_reads": torn,
            "reader_writer_overlaps": overlaps,
            "stale_reads_refused": stale_reads,
            "repricings": load(&tally.repricings),
            "stale_writes_refused": stale_writes,
            "ok": held,
        }),
        held,
    ))
}

fn main() -> ExitCode {
    let args = Args::parse();
    common::main_with(|| run(args))
}
