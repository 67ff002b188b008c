//! # Outbox relay leadership: one relay publishes, a deposed one cannot mark or publish
//!
//! ```sh
//! cargo run --example outbox-relay                      # embedded default
//! cargo run --features redis,postgres --example outbox-relay -- --lock redis://… --store postgres://…
//! ```
//!
//! **What goes wrong without a fence.** Several relay instances elect a leader with a lock; the
//! leader reads pending outbox rows, publishes them and marks them published. A leader that
//! freezes mid-batch loses its lease, a new leader publishes the same rows, and the old one wakes
//! up and publishes them again and marks them: duplicate messages, and marks that no longer mean
//! anything.
//!
//! **How this example prevents it.**
//! - Leadership is a long-held lease renewed **only while the relay makes progress**
//!   (`renew_on_progress`): a relay that hangs stops renewing and loses the lease within a TTL.
//! - The relay loop races every slow step against the lease's **lost signal** and stops the moment
//!   it fires: a hung publish is abandoned, not finished late.
//! - "Publish" and "mark as published" are **one fenced write**: the message goes to the topic
//!   and the outbox row flips to `published` in the same batch, with the leader's fence. A frozen
//!   leader (which cannot even notice the lost signal) wakes with a lower fence than the new
//!   leader's, so its write is refused with `StaleFence`: no second copy, no mark. (With an
//!   external broker, use its own fencing, such as Kafka's producer epochs, or an idempotency key.)

use palisade_examples::common;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use palisade::DynFencedStore;
use palisade::prelude::*;
use serde_json::json;

/// Outbox relay leader election under a fenced lock.
#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    common: common::Common,
    /// Outbox rows to publish.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    rows: u64,
    /// Relay instances.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=16))]
    relays: u64,
}

const BATCH: usize = 5;

#[derive(Default)]
struct Tally {
    leaderships: AtomicU64,
    lost_stops: AtomicU64,
    stale_refused: AtomicU64,
    hang_injected: AtomicBool,
    freeze_injected: AtomicBool,
}

struct Outbox {
    store: Arc<DynFencedStore>,
    run: String,
    key: ResourceKey,
    ttl: Duration,
    pause: Duration,
    tally: Tally,
}

enum Step {
    /// Published a batch.
    Progress,
    /// Nothing pending.
    Drained,
    /// A write was refused: we are no longer the leader.
    Deposed,
}

impl Outbox {
    fn rows_prefix(&self) -> String {
        format!("outbox/{}/row/", self.run)
    }
    fn topic_prefix(&self) -> String {
        format!("outbox/{}/topic/", self.run)
    }

    /// Publishes and marks one batch of pending rows under `lease`.
    /// With `freeze`, the leader freezes after listing (a GC pause): nothing runs, not even a
    /// check of the lost signal, until it wakes and writes.
    async fn batch(&self, lease: &Lease<DynLockService>, freeze: bool) -> palisade::Result<Step> {
        let pending: Vec<(String, Vec<u8>)> = self
            .store
            .list(&self.rows_prefix())
            .await?
            .into_iter()
            .filter(|(_, r)| r.value != b"published")
            .take(BATCH)
            .map(|(k, r)| (k, r.value))
            .collect();
        if pending.is_empty() {
            return Ok(Step::Drained);
        }
        if freeze {
            println!("leader fence {}: frozen mid-batch (GC pause)", lease.fence());
            tokio::time::sleep(self.pause).await;
            println!("leader fence {}: woke up, publishing its batch anyway", lease.fence());
        }
        for (row, payload) in pending {
            let id = row.rsplit('/').next().unwrap_or_default().to_string();
            let write = WriteBatch::new()
                .check(row.clone(), Some(payload.clone()))
                .put(row, b"published".to_vec())
                .create(format!("{}{id}", self.topic_prefix()), payload);
            match self.store.write(lease, &write).await {
                Ok(()) => {}
                Err(e) if e.stale_fence_details().is_some() => {
                    println!("leader fence {}: publish of {id} refused ({e}); deposed", lease.fence());
                    self.tally.stale_refused.fetch_add(1, Ordering::SeqCst);
                    return Ok(Step::Deposed);
                }
                Err(e) if e.kind() == ErrorKind::Conflict => {
                    // The row changed since we listed it: another leader published it. Re-list.
                    return Ok(Step::Progress);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Step::Progress)
    }

    /// One relay instance: campaign, lead until drained, deposed or lost, and campaign again.
    async fn relay(self: Arc<Self>, locks: Arc<DynLockService>, id: u64) -> palisade::Result<()> {
        loop {
            let lease = match locks.lock(&self.key, LockOptions::ttl(self.ttl).wait(self.ttl * 2)).await {
                Ok(lease) => lease,
                Err(e) if e.kind() == ErrorKind::Timeout => {
                    if self.drained().await? {
                        return Ok(());
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            self.tally.leaderships.fetch_add(1, Ordering::SeqCst);
            println!("relay {id}: leader with fence {}", lease.fence());
            let progress = Progress::new();
            let _renewal = lease.renew_on_progress(&progress);
            let mut batch_no = 0u64;
            loop {
                batch_no += 1;
                // The first leader's third batch hangs in a slow publish: no progress, so no
                // renewal; the lost signal fires and stops the loop before the publish ends.
                let hang = batch_no == 3 && !self.tally.hang_injected.swap(true, Ordering::SeqCst);
                // The next leader's second batch freezes instead: a frozen process cannot race
                // anything against its lost signal, so only the fence stops it.
                let freeze = !hang
                    && batch_no == 2
                    && self.tally.hang_injected.load(Ordering::SeqCst)
                    && !self.tally.freeze_injected.swap(true, Ordering::SeqCst);
                let step = if freeze {
                    Some(self.batch(&lease, true).await?)
                } else {
                    let step = async {
                        if hang {
                            println!("relay {id}: publish hangs (the broker stalls)");
                            tokio::time::sleep(self.pause * 4).await;
                        }
                        self.batch(&lease, false).await
                    };
                    tokio::select! {
                        _ = lease.lost() => None,
                        step = step => Some(step?),
                    }
                };
                match step {
                    None => {
                        println!("relay {id}: lost the lease; stopping the relay loop");
                        self.tally.lost_stops.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                    Some(Step::Progress) => progress.tick(),
                    Some(Step::Deposed) => break,
                    Some(Step::Drained) => {
                        let _ = lease.release().await;
                        return Ok(());
                    }
                }
            }
            drop(lease);
            if self.drained().await? {
                return Ok(());
            }
        }
    }

    async fn drained(&self) -> palisade::Result<bool> {
        Ok(self.store.list(&self.rows_prefix()).await?.iter().all(|(_, r)| r.value == b"published"))
    }
}

async fn run(args: Args) -> palisade::Result<ExitCode> {
    let store = args.common.store().await?;
    let run = common::run_id()?;
    let outbox = Arc::new(Outbox {
        store,
        key: ResourceKey::new("outbox-relay", format!("orders-{run}"))?,
        run,
        ttl: args.common.ttl(),
        pause: args.common.pause(),
        tally: Tally::default(),
    });
    for first in (0..args.rows).step_by(50) {
        let mut seed = WriteBatch::new();
        for i in first..(first + 50).min(args.rows) {
            seed = seed.put(format!("{}{i:06}", outbox.rows_prefix()), format!("order-created {i}"));
        }
        outbox.store.apply_unfenced(&seed).await?;
    }
    let mut relays = Vec::new();
    for id in 0..args.relays {
        let locks = args.common.lock_client().await?;
        relays.push(tokio::spawn(Arc::clone(&outbox).relay(locks, id)));
    }
    for r in relays {
        r.await.map_err(|e| Error::new(ErrorKind::Backend, "example", format!("a relay panicked: {e}")))??;
    }
    let rows = outbox.store.list(&outbox.rows_prefix()).await?;
    let published = rows.iter().filter(|(_, r)| r.value == b"published").count() as u64;
    let messages = outbox.store.list(&outbox.topic_prefix()).await?.len() as u64;
    let t = &outbox.tally;
    let (lost, stale) = (t.lost_stops.load(Ordering::SeqCst), t.stale_refused.load(Ordering::SeqCst));
    println!("{published} of {} rows published, {messages} messages on the topic", args.rows);
    let held = published == args.rows && messages == args.rows;
    Ok(common::finish(
        json!({
            "example": "outbox-relay",
            "rows": args.rows,
            "published": published,
            "topic_messages": messages,
            "double_published": messages.saturating_sub(published),
            "leaderships": t.leaderships.load(Ordering::SeqCst),
            "lost_signal_stops": lost,
            "stale_marks_refused": stale,
            "ok": held,
        }),
        held,
    ))
}

fn main() -> ExitCode {
    let args = Args::parse();
    common::main_with(|| run(args))
}
