//! # Outbox relay leadership: one relay publishes, a deposed one cannot mark or publish
//!
//! ```sh
//! cargo run --example outbox-relay                      # embedded default
//! cargo run --features redis,postgres,palisade-examples/postgres --example outbox-relay -- --lock redis://… --store postgres://…
//! ```
//!
//! **What goes wrong without a fence.** Several relay instances elect a leader with a lock; the
//! leader reads pending outbox rows, publishes them and marks them published. A leader that
//! freezes mid-batch loses its lease, a new leader publishes the same rows, and the old one wakes
//! up and publishes them again and marks them: duplicate messages, and marks that no longer mean
//! anything.
//!
//! **How this example prevents it.**
//! - Leadership is a fenced election (`Election::campaign_on_progress`): the term is the
//!   leadership lease's fence, and the lead is renewed **only while the relay makes progress**:
//!   a relay that hangs stops renewing and loses the lead within a TTL.
//! - The relay loop races every slow step against the lease's **lost signal** and stops the moment
//!   it fires: a hung publish is abandoned, not finished late.
//! - "Publish" and "mark as published" are **one fenced transaction** on the application's own
//!   tables (SQLite or PostgreSQL, `--store`; other stores are refused, exit 2):
//!
//!   ```sql
//!   CREATE TABLE outbox       (id TEXT PRIMARY KEY, payload TEXT NOT NULL, published_fence BIGINT);
//!   CREATE TABLE outbox_topic (outbox_id TEXT NOT NULL, payload TEXT NOT NULL, fence BIGINT NOT NULL);
//!   ```
//!
//!   The leader opens the transaction with `store.begin_fenced(&lease)` (the fence check is its
//!   first statement), marks each row published by its fence if nobody has, and puts the
//!   message on the topic table only for a row it marked. A frozen leader (which cannot even
//!   notice the lost signal) wakes with a lower fence than the new leader's, so its transaction
//!   is refused with `StaleFence` before any statement of its own runs: no second copy, no
//!   mark. (With an external broker, use its own fencing, such as Kafka's producer epochs, or an
//!   idempotency key.)

use palisade_examples::{common, sql::Db, with_db};

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
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

const BATCH: i64 = 5;

/// The application's tables and statements (PostgreSQL and SQLite read the same text).
mod tables {
    pub const CREATE: [&str; 2] = [
        "CREATE TABLE IF NOT EXISTS outbox (id TEXT PRIMARY KEY, payload TEXT NOT NULL, published_fence BIGINT)",
        "CREATE TABLE IF NOT EXISTS outbox_topic (outbox_id TEXT NOT NULL, payload TEXT NOT NULL, fence BIGINT NOT NULL)",
    ];
    pub const ADD: &str = "INSERT INTO outbox (id, payload, published_fence) VALUES ($1, $2, NULL)";
    /// This run's rows (`$1`: the run's id prefix) still pending, oldest first.
    pub const PENDING: &str = "SELECT id, payload FROM outbox \
         WHERE substr(id, 1, length($1)) = $1 AND published_fence IS NULL ORDER BY id LIMIT $2";
    /// Marks a row published by this fence, unless a leader already did.
    pub const MARK: &str = "UPDATE outbox SET published_fence = $2 WHERE id = $1 AND published_fence IS NULL";
    pub const PUBLISH: &str = "INSERT INTO outbox_topic (outbox_id, payload, fence) VALUES ($1, $2, $3)";
    pub const COUNT_PENDING: &str =
        "SELECT COUNT(*) FROM outbox WHERE substr(id, 1, length($1)) = $1 AND published_fence IS NULL";
    pub const COUNT_PUBLISHED: &str =
        "SELECT COUNT(*) FROM outbox WHERE substr(id, 1, length($1)) = $1 AND published_fence IS NOT NULL";
    pub const COUNT_MESSAGES: &str = "SELECT COUNT(*) FROM outbox_topic WHERE substr(outbox_id, 1, length($1)) = $1";
}

#[derive(Default)]
struct Tally {
    leaderships: AtomicU64,
    lost_stops: AtomicU64,
    stale_refused: AtomicU64,
    hang_injected: AtomicBool,
    freeze_injected: AtomicBool,
}

struct Outbox {
    db: Db,
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
    /// The prefix of this run's row ids (runs against one server keep apart).
    fn prefix(&self) -> String {
        format!("{}.", self.run)
    }

    /// Publishes and marks one batch of pending rows under `lease`, in one fenced transaction.
    /// With `freeze`, the leader freezes after listing (a GC pause): nothing runs, not even a
    /// check of the lost signal, until it wakes and writes.
    async fn batch(&self, lease: &Lease<DynLockService>, freeze: bool) -> palisade::Result<Step> {
        let fence = i64::try_from(lease.fence().get())
            .map_err(|_| Error::new(ErrorKind::InvalidArgument, "example", "fence past i64::MAX"))?;
        with_db!(&self.db, |store| {
            let pending: Vec<(String, String)> = sqlx::query_as(tables::PENDING)
                .bind(self.prefix())
                .bind(BATCH)
                .fetch_all(store.pool())
                .await
                .map_err(sql_err)?;
            if pending.is_empty() {
                return Ok(Step::Drained);
            }
            if freeze {
                println!("leader fence {fence}: frozen mid-batch (GC pause)");
                tokio::time::sleep(self.pause).await;
                println!("leader fence {fence}: woke up, publishing its batch anyway");
            }
            // The fence check is the transaction's first statement; a refusal runs none of ours.
            let mut tx = match store.begin_fenced(lease).await {
                Ok(tx) => tx,
                Err(e) if e.stale_fence_details().is_some() => {
                    println!("leader fence {fence}: publish refused ({e}); deposed");
                    self.tally.stale_refused.fetch_add(1, Ordering::SeqCst);
                    return Ok(Step::Deposed);
                }
                Err(e) => return Err(e),
            };
            for (id, payload) in pending {
                let marked = sqlx::query(tables::MARK)
                    .bind(&id)
                    .bind(fence)
                    .execute(tx.conn())
                    .await
                    .map_err(sql_err)?
                    .rows_affected();
                // Zero: another leader published it since we listed (it was still valid then).
                if marked == 1 {
                    sqlx::query(tables::PUBLISH)
                        .bind(&id)
                        .bind(&payload)
                        .bind(fence)
                        .execute(tx.conn())
                        .await
                        .map_err(sql_err)?;
                }
            }
            tx.commit().await?;
            Ok(Step::Progress)
        })
    }

    /// One relay instance: campaign, lead until drained, deposed or lost, and campaign again.
    async fn relay(self: Arc<Self>, locks: Arc<DynLockService>, id: u64) -> palisade::Result<()> {
        let election = Election::new(locks, self.key.clone(), self.ttl);
        loop {
            let progress = Progress::new();
            let leader = match election.campaign_on_progress(self.ttl * 2, &progress).await {
                Ok(leader) => leader,
                Err(e) if e.kind() == ErrorKind::Timeout => {
                    if self.drained().await? {
                        return Ok(());
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            self.tally.leaderships.fetch_add(1, Ordering::SeqCst);
            println!("relay {id}: leader for term {}", leader.term());
            let lease = leader.lease();
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
                    Some(self.batch(lease, true).await?)
                } else {
                    let step = async {
                        if hang {
                            println!("relay {id}: publish hangs (the broker stalls)");
                            tokio::time::sleep(self.pause * 4).await;
                        }
                        self.batch(lease, false).await
                    };
                    tokio::select! {
                        _ = leader.lost() => None,
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
                        let _ = leader.resign().await;
                        return Ok(());
                    }
                }
            }
            drop(leader);
            if self.drained().await? {
                return Ok(());
            }
        }
    }

    async fn drained(&self) -> palisade::Result<bool> {
        Ok(self.count(tables::COUNT_PENDING).await? == 0)
    }

    /// One of the `COUNT_*` statements over this run's rows.
    async fn count(&self, statement: &'static str) -> palisade::Result<u64> {
        let prefix = self.prefix();
        let (n,): (i64,) = with_db!(&self.db, |store| {
            sqlx::query_as(statement).bind(&prefix).fetch_one(store.pool()).await.map_err(sql_err)?
        });
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// The rows to relay, before any relay runs.
    async fn add_rows(&self, rows: u64) -> palisade::Result<()> {
        with_db!(&self.db, |store| {
            let mut tx = store.begin().await?;
            for i in 0..rows {
                sqlx::query(tables::ADD)
                    .bind(format!("{}{i:06}", self.prefix()))
                    .bind(format!("order-created {i}"))
                    .execute(tx.conn())
                    .await
                    .map_err(sql_err)?;
            }
            tx.commit().await
        })
    }
}

async fn run(args: Args) -> palisade::Result<ExitCode> {
    let db = Db::connect(&args.common.store, "outbox-relay", &tables::CREATE).await?;
    let run = common::run_id()?;
    let outbox = Arc::new(Outbox {
        db,
        key: ResourceKey::new("outbox-relay", format!("orders-{run}"))?,
        run,
        ttl: args.common.ttl(),
        pause: args.common.pause(),
        tally: Tally::default(),
    });
    outbox.add_rows(args.rows).await?;
    let mut relays = Vec::new();
    for id in 0..args.relays {
        let locks = args.common.lock_client().await?;
        relays.push(tokio::spawn(Arc::clone(&outbox).relay(locks, id)));
    }
    for r in relays {
        r.await.map_err(|e| Error::new(ErrorKind::Backend, "example", format!("a relay panicked: {e}")))??;
    }
    let published = outbox.count(tables::COUNT_PUBLISHED).await?;
    let messages = outbox.count(tables::COUNT_MESSAGES).await?;
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
