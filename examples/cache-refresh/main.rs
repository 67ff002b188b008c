//! # Cache refresh, single flight: one reader refreshes, and an old refresh cannot win
//!
//! ```sh
//! cargo run --example cache-refresh                      # embedded default
//! cargo run --features redis,postgres,palisade-examples/postgres --example cache-refresh -- --lock redis://… --store postgres://…
//! ```
//!
//! **What goes wrong without a fence.** A hot cache entry expires and a hundred readers miss at
//! once; each recomputes it from the origin (a thundering herd). Put a lock around the refresh
//! and only one does, but a refresher that froze after fetching (a GC pause) wakes up *after* a
//! newer refresh wrote a newer value, and overwrites it with its old one: the cache now serves
//! stale data until the next expiry, and nobody knows.
//!
//! **How this example prevents it.**
//! - Readers that miss call `try_lock`; the winner refreshes, the others serve the stale value
//!   if there is one, or wait for the lock and then read what the refresher wrote (single flight:
//!   one origin fetch per refresh).
//! - The refresher re-reads the entry after taking the lock (somebody may have just refreshed it).
//! - The entry is written **with the lease's fence**. A refresher that froze past its TTL has a
//!   lower fence than the one that refreshed after it, so its late write is refused with
//!   `StaleFence` and the newer value stays.

use palisade_examples::common;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use palisade::DynFencedStore;
use palisade::prelude::*;
use serde_json::json;

/// Single-flight cache refresh under a fenced lock.
#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    common: common::Common,
    /// Readers that miss at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=256))]
    readers: u64,
}

/// The slow origin the cache protects: its data version, and how often it was asked.
#[derive(Default)]
struct Origin {
    version: AtomicU64,
    fetches: AtomicU64,
}

impl Origin {
    async fn fetch(&self) -> u64 {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(30)).await;
        self.version.load(Ordering::SeqCst)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Served {
    Fresh,
    Stale,
    AfterWaiting,
    Refreshed,
}

struct Cache {
    store: Arc<DynFencedStore>,
    origin: Origin,
    key: ResourceKey,
    entry: String,
    ttl: Duration,
    stale_refused: AtomicU64,
    /// Told when the refresher that freezes has fetched and frozen, holding the lock.
    froze: tokio::sync::Notify,
}

impl Cache {
    /// The cached version and whether it is still fresh (`v3` fresh, `v3 stale` invalidated).
    async fn get(&self) -> palisade::Result<Option<(u64, bool)>> {
        Ok(self.store.read(&self.entry).await?.map(|r| {
            let text = String::from_utf8_lossy(&r.value).to_string();
            let version = text.trim_start_matches('v').split(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0);
            (version, !text.ends_with("stale"))
        }))
    }

    /// Marks the entry stale (what a writer of the origin does after changing it).
    async fn invalidate(&self) -> palisade::Result<()> {
        if let Some((version, _)) = self.get().await? {
            self.store.apply_unfenced(&WriteBatch::new().put(self.entry.clone(), format!("v{version} stale"))).await?;
        }
        Ok(())
    }

    /// Refreshes under `lease`, freezing for `pause` between fetch and write if asked.
    async fn refresh(&self, lease: &Lease<DynLockService>, pause: Duration) -> palisade::Result<u64> {
        let version = self.origin.fetch().await;
        if !pause.is_zero() {
            println!("refresher fence {}: fetched v{version}, then froze", lease.fence());
            self.froze.notify_one();
            tokio::time::sleep(pause).await;
        }
        match self.store.write(lease, &WriteBatch::new().put(self.entry.clone(), format!("v{version}"))).await {
            Ok(()) => Ok(version),
            Err(e) if e.stale_fence_details().is_some() => {
                println!("refresher fence {}: late write of v{version} refused ({e})", lease.fence());
                self.stale_refused.fetch_add(1, Ordering::SeqCst);
                Ok(version)
            }
            Err(e) => Err(e),
        }
    }

    /// One reader's read.
    async fn read(&self, locks: &Arc<DynLockService>, pause: Duration) -> palisade::Result<Served> {
        let cached = self.get().await?;
        if let Some((_, true)) = cached {
            return Ok(Served::Fresh);
        }
        if let Some(lease) = locks.try_lock(&self.key, self.ttl).await? {
            if let Some((_, true)) = self.get().await? {
                lease.release().await?;
                return Ok(Served::Fresh);
            }
            self.refresh(&lease, pause).await?;
            // A frozen refresher's lease has expired; NotHolder on release is expected then.
            let _ = lease.release().await;
            return Ok(Served::Refreshed);
        }
        if cached.is_some() {
            return Ok(Served::Stale);
        }
        // Nothing to serve: wait for the refresher to finish, then read what it wrote.
        loop {
            let lease = locks.lock(&self.key, LockOptions::ttl(self.ttl).wait(Duration::from_secs(60))).await?;
            let fresh = matches!(self.get().await?, Some((_, true)));
            lease.release().await?;
            if fresh {
                return Ok(Served::AfterWaiting);
            }
        }
    }
}

async fn wave(
    cache: &Arc<Cache>,
    clients: &[Arc<DynLockService>],
    pause_first: Duration,
) -> palisade::Result<Vec<Served>> {
    let handles: Vec<_> = clients
        .iter()
        .map(|locks| {
            let (cache, locks) = (Arc::clone(cache), Arc::clone(locks));
            tokio::spawn(async move { cache.read(&locks, pause_first).await })
        })
        .collect();
    let mut served = Vec::new();
    for h in handles {
        served
            .push(h.await.map_err(|e| Error::new(ErrorKind::Backend, "example", format!("a reader panicked: {e}")))??);
    }
    Ok(served)
}

fn count(served: &[Served], kind: Served) -> usize {
    served.iter().filter(|&&s| s == kind).count()
}

async fn run(args: Args) -> palisade::Result<ExitCode> {
    let store = args.common.store().await?;
    let run = common::run_id()?;
    let cache = Arc::new(Cache {
        store,
        origin: Origin::default(),
        key: ResourceKey::new("cache", format!("product-{run}"))?,
        entry: format!("cache/{run}/product"),
        ttl: args.common.ttl(),
        stale_refused: AtomicU64::new(0),
        froze: tokio::sync::Notify::new(),
    });
    cache.origin.version.store(1, Ordering::SeqCst);
    let mut clients = Vec::new();
    for _ in 0..args.readers {
        clients.push(args.common.lock_client().await?);
    }

    // 1. Cold miss: every reader at once, nothing to serve. One fetch, the rest wait for it.
    let cold = wave(&cache, &clients, Duration::ZERO).await?;
    let cold_fetches = cache.origin.fetches.load(Ordering::SeqCst);
    println!(
        "cold miss: {} refreshed, {} waited for the result, {} origin fetch(es)",
        count(&cold, Served::Refreshed),
        count(&cold, Served::AfterWaiting),
        cold_fetches
    );

    // 2. The origin changes (v2); the entry goes stale; a wave of readers: one refreshes but
    //    freezes after fetching v2, the others serve the stale v1 at once.
    cache.origin.version.store(2, Ordering::SeqCst);
    cache.invalidate().await?;
    let frozen = {
        let (cache, locks, pause) = (Arc::clone(&cache), Arc::clone(&clients[0]), args.common.pause());
        tokio::spawn(async move { cache.read(&locks, pause).await })
    };
    // The wave comes once the refresher holds the lock and has frozen, well inside its TTL: a
    // wave after the lease ran out would find the lock free and refresh v2 itself.
    tokio::time::timeout(Duration::from_secs(60), cache.froze.notified())
        .await
        .map_err(|_| Error::new(ErrorKind::Timeout, "example", "the refresher did not take the lock within 60 s"))?;
    let stale_wave = wave(&cache, &clients[1..], Duration::ZERO).await?;

    // 3. The origin changes again (v3) while the refresher is frozen. Once its lease has run out,
    //    the next wave refreshes v3.
    cache.origin.version.store(3, Ordering::SeqCst);
    tokio::time::sleep(args.common.ttl()).await;
    let mut after = Vec::new();
    // Waves every 50 ms until one finds the lock free (the frozen lease has expired) and refreshes.
    for _ in 0..200 {
        let served = wave(&cache, &clients[1..], Duration::ZERO).await?;
        let refreshed = count(&served, Served::Refreshed) > 0;
        after.extend(served);
        if refreshed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let frozen = frozen.await.map_err(|e| Error::new(ErrorKind::Backend, "example", format!("panicked: {e}")))??;

    let final_version = cache.get().await?.map_or(0, |(v, _)| v);
    let stale_refused = cache.stale_refused.load(Ordering::SeqCst);
    println!("final cache entry v{final_version}; late refreshes refused: {stale_refused}");
    let held = cold_fetches == 1
        && count(&cold, Served::Refreshed) == 1
        && frozen == Served::Refreshed
        && stale_refused == 1
        && final_version == 3;
    Ok(common::finish(
        json!({
            "example": "cache-refresh",
            "readers": args.readers,
            "cold_origin_fetches": cold_fetches,
            "cold_waited": count(&cold, Served::AfterWaiting),
            "cold_served_fresh": count(&cold, Served::Fresh),
            "served_stale": count(&stale_wave, Served::Stale) + count(&after, Served::Stale),
            "refreshes_after_pause": count(&after, Served::Refreshed),
            "origin_fetches": cache.origin.fetches.load(Ordering::SeqCst),
            "stale_refresh_refused": stale_refused,
            "final_version": final_version,
            "ok": held,
        }),
        held,
    ))
}

fn main() -> ExitCode {
    let args = Args::parse();
    common::main_with(|| run(args))
}
