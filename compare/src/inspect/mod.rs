//! `palisade inspect`: who holds which lock, with which fence, and which fence each store now
//! holds the resource's writes to. It reads the lock service's and the stores' own records
//! through their read-only views ([`palisade::InspectLocks`], [`palisade::InspectStore`]) and
//! changes nothing.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

mod page;
mod primitives;

use clap::Args;
use palisade::{DynInspectLocks, DynInspectStore, Fence, LockView, ResourceKey, Waiters, WatermarkView, redact_url};
use serde_json::{Value, json};

/// `palisade inspect` flags.
#[derive(Debug, Clone, Args)]
pub struct InspectArgs {
    /// The lock service's URL: redis://, redis+sentinel://, redis+cluster://, redlock://,
    /// etcd://, zk://, postgres://, sqlite://PATH.
    #[arg(long)]
    pub lock: String,
    /// A fenced store's URL (repeatable): sqlite://PATH, postgres://, dynamodb://TABLE?…. Each
    /// resource's watermark in it, and the grant that set it, is shown beside the lock.
    #[arg(long = "store")]
    pub stores: Vec<String>,
    /// One resource, as `domain:id` (`alloc:WH-01`). Without it, every resource found.
    pub resource: Option<String>,
    /// Only the resources whose `domain:id` starts with P.
    #[arg(long, value_name = "P", conflicts_with = "resource")]
    pub prefix: Option<String>,
    /// One JSON document per view on stdout, for scripts.
    #[arg(long)]
    pub json: bool,
    /// Show the view again every SECONDS (2 when not given) until interrupted. With --serve,
    /// how often the page reads the servers and refreshes (2 s when not given).
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "2")]
    pub watch: Option<f64>,
    /// Serve the view as a web page at ADDR (`127.0.0.1:8080`; port 0 picks a free one, and
    /// the address is printed on stderr) until interrupted: read-only, it refreshes itself
    /// every --watch seconds, and marks fence regressions and locks near expiry. `/view.json`
    /// is the --json document. The page has no authentication: keep ADDR on loopback or
    /// behind your own proxy.
    #[arg(long, value_name = "ADDR", conflicts_with = "json")]
    pub serve: Option<String>,
}

/// Exit codes: 0 shown, nothing wrong; 1 shown, with a warning (a fence regression waiting to
/// happen); 2 bad usage; 3 a service or store could not be reached or read. With --serve: 0
/// when interrupted, 2 when the address cannot be bound, 3 when the servers cannot be reached
/// at the start (a read that fails later shows on the page, beside the last view read).
pub async fn run(args: InspectArgs) -> ExitCode {
    let one = match args.resource.as_deref().map(palisade::spi::parse_any_resource_key).transpose() {
        Ok(one) => one,
        Err(e) => {
            eprintln!("palisade inspect: {e} (a resource is written domain:id, as alloc:WH-01)");
            return ExitCode::from(2);
        }
    };
    let every = match args.watch {
        Some(s) if !(0.1..=86_400.0).contains(&s) => {
            eprintln!("palisade inspect: --watch takes 0.1 to 86400 seconds, not {s}");
            return ExitCode::from(2);
        }
        s => s.map(Duration::from_secs_f64),
    };
    // Bound before connecting: a taken address is bad usage, whatever the servers say.
    let listener = match &args.serve {
        Some(addr) => match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => Some(listener),
            Err(e) => {
                eprintln!("palisade inspect: cannot serve on {addr}: {e}");
                return ExitCode::from(2);
            }
        },
        None => None,
    };
    let views = match Views::connect(&args).await {
        Ok(views) => views,
        Err(e) => {
            eprintln!("palisade inspect: {e}");
            return ExitCode::from(3);
        }
    };
    let prefix = args.prefix.clone().unwrap_or_default();
    if let Some(listener) = listener {
        return page::serve(listener, views, one, prefix, every.unwrap_or(Duration::from_secs(2))).await;
    }
    loop {
        let code = match views.snapshot(one.as_ref(), &prefix).await {
            Ok(snapshot) => {
                if args.json {
                    println!("{}", snapshot.to_json());
                } else {
                    print!("{}", snapshot.to_text());
                }
                if snapshot.warnings() > 0 { 1 } else { 0 }
            }
            Err(e) => {
                eprintln!("palisade inspect: {e}");
                3
            }
        };
        let Some(every) = every else { return ExitCode::from(code) };
        tokio::time::sleep(every).await;
        if !args.json {
            println!();
        }
    }
}

/// The read-only views of one lock service and its stores, with the URLs they were given
/// (shown without credentials).
struct Views {
    lock: (String, Arc<DynInspectLocks>),
    stores: Vec<(String, Arc<DynInspectStore>)>,
}

impl Views {
    async fn connect(args: &InspectArgs) -> palisade::Result<Views> {
        let lock = (redact_url(&args.lock), palisade::inspect_locks(&args.lock).await?);
        let mut stores = Vec::new();
        for url in &args.stores {
            stores.push((redact_url(url), palisade::inspect_store(url).await?));
        }
        Ok(Views { lock, stores })
    }

    /// One view of `one` resource, or of every resource starting with `prefix`.
    async fn snapshot(&self, one: Option<&ResourceKey>, prefix: &str) -> palisade::Result<Snapshot> {
        let (lock_url, locks) = &self.lock;
        let mut truncated = false;
        // Each store's listing, when there is one, by resource: the rows read their watermarks
        // from it instead of asking the store again, resource by resource (for DynamoDB, a
        // `GetItem` each after a `Scan` that already read them).
        let mut listed_marks: Vec<Option<Listed>> = vec![None; self.stores.len()];
        // Every resource either side keeps anything for: a store's watermark outlives a lock
        // that left nothing behind (etcd, ZooKeeper), and a lock may never have written.
        let keys: Vec<ResourceKey> = match one {
            // The resource alone: finding the locks a primitive is made of (`KEY~…`) takes a
            // listing (a walk of a whole Redis keyspace), which `--prefix KEY` asks for.
            Some(key) => vec![key.clone()],
            None => {
                let mut keys: BTreeMap<String, ResourceKey> = BTreeMap::new();
                let listed = locks.resources(prefix).await?;
                truncated |= listed.truncated;
                keys.extend(listed.entries.into_iter().map(|k| (k.to_string(), k)));
                for ((_, store), slot) in self.stores.iter().zip(&mut listed_marks) {
                    let marks = store.watermarks(prefix).await?;
                    truncated |= marks.truncated;
                    let mut by_key = BTreeMap::new();
                    for (key, mark) in marks.entries {
                        by_key.insert(key.to_string(), mark);
                        keys.entry(key.to_string()).or_insert(key);
                    }
                    *slot = Some(Listed { by_key, complete: !marks.truncated });
                }
                truncated |= keys.len() > palisade::MAX_LISTED;
                keys.into_values().take(palisade::MAX_LISTED).collect()
            }
        };
        let mut rows = Vec::with_capacity(keys.len());
        for key in keys {
            let lock = locks.lock_view(&key).await?;
            let name = key.to_string();
            let mut marks = Vec::with_capacity(self.stores.len());
            for ((_, store), listed) in self.stores.iter().zip(&listed_marks) {
                let mark = match listed {
                    Some(listed) if listed.complete || listed.by_key.contains_key(&name) => {
                        listed.by_key.get(&name).copied()
                    }
                    // A single resource, or one past a cut listing: ask the store.
                    _ => store.watermark_view(&key).await?,
                };
                marks.push((store.backend(), mark));
            }
            rows.push(Row { lock, marks });
        }
        // What the primitives keep in the stores: an election's proclaimed value, a read-write
        // lock's last writer.
        let mut records = BTreeMap::new();
        for (_, store) in &self.stores {
            match one {
                Some(key) => {
                    for kind in primitives::RECORD_KINDS {
                        let name = format!("{kind}{key}");
                        if let Some(record) = store.record(&name).await? {
                            records.entry(name).or_insert(record);
                        }
                    }
                }
                // One listing of the primitives' records (one scan of a DynamoDB table), each
                // kept when its resource starts with the prefix.
                None => {
                    for (name, record) in store.records(primitives::RECORDS).await? {
                        let wanted = primitives::RECORD_KINDS
                            .iter()
                            .any(|kind| name.strip_prefix(kind).is_some_and(|resource| resource.starts_with(prefix)));
                        if wanted {
                            records.entry(name).or_insert(record);
                        }
                    }
                }
            }
        }
        // Listed, the locks a primitive is made of are all here; one resource's view has none.
        let primitives = primitives::find(&rows, &records, one.is_none());
        Ok(Snapshot {
            lock: (locks.backend(), lock_url.clone()),
            stores: self.stores.iter().map(|(url, s)| (s.backend(), url.clone())).collect(),
            rows,
            primitives,
            truncated,
        })
    }
}

/// A store's listing of watermarks, by resource, and whether it holds every one.
#[derive(Clone)]
struct Listed {
    by_key: BTreeMap<String, WatermarkView>,
    complete: bool,
}

/// One resource: its lock, and its watermark in each store (in the order given).
#[derive(Clone)]
struct Row {
    lock: LockView,
    marks: Vec<(&'static str, Option<WatermarkView>)>,
}

impl Row {
    /// What is wrong, for the person on call.
    fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (store, mark) in &self.marks {
            let Some(mark) = mark else { continue };
            // The next grant's fence is one above the counter: at or below the watermark, the
            // store refuses it (a regression waiting to happen; `lock_checked` repairs it).
            if let Some(counter) = self.lock.fence_counter
                && counter < mark.fence
            {
                out.push(format!(
                    "FENCE REGRESSION waiting: the lock service's counter ({counter}) is below {store}'s watermark \
                     ({}): its next grant would be refused; lock_checked moves the counter past it on the next lock",
                    mark.fence
                ));
            }
            if let Some(holder) = &self.lock.holder
                && let Some(fence) = holder.fence
            {
                if fence < mark.fence {
                    out.push(format!(
                        "the holder's fence ({fence}) is below {store}'s watermark ({}): every write it makes will be \
                         refused",
                        mark.fence
                    ));
                } else if fence == mark.fence && mark.grant.is_some_and(|g| g != holder.grant) {
                    out.push(format!(
                        "the holder's fence ({fence}) was issued before, to the grant that set {store}'s watermark: the \
                         service issued one fence twice, and the store refuses the holder's writes as duplicates"
                    ));
                }
            }
        }
        out
    }
}

/// A view of the lock service and its stores at one moment.
#[derive(Clone)]
struct Snapshot {
    lock: (&'static str, String),
    stores: Vec<(&'static str, String)>,
    rows: Vec<Row>,
    /// The semaphores, read-write locks and elections among the rows and the stores' records.
    primitives: Vec<primitives::Primitive>,
    truncated: bool,
}

impl Snapshot {
    fn warnings(&self) -> usize {
        self.rows.iter().map(|r| r.warnings().len()).sum()
    }

    fn to_json(&self) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|row| {
                let lock = &row.lock;
                let holder = lock.holder.as_ref().map(|h| {
                    json!({
                        "grant": h.grant.to_string(),
                        "fence": h.fence.map(Fence::get),
                        "expires_in_ms": h.expires_in.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                    })
                });
                let marks: Vec<Value> = row
                    .marks
                    .iter()
                    .map(|(store, mark)| {
                        json!({
                            "store": store,
                            "fence": mark.map(|m| m.fence.get()),
                            "grant": mark.and_then(|m| m.grant).map(|g| g.to_string()),
                            "set_by_holder": match (mark.and_then(|m| m.grant), &lock.holder) {
                                (Some(g), Some(h)) => Some(g == h.grant),
                                _ => None,
                            },
                        })
                    })
                    .collect();
                json!({
                    "resource": lock.key.to_string(),
                    "held": lock.holder.is_some(),
                    "holder": holder,
                    "fence_counter": lock.fence_counter.map(Fence::get),
                    "waiters": waiters_json(lock.waiters),
                    "watermarks": marks,
                    "warnings": row.warnings(),
                })
            })
            .collect();
        json!({
            "lock": { "backend": self.lock.0, "url": self.lock.1 },
            "stores": self.stores.iter().map(|(b, u)| json!({ "backend": b, "url": u })).collect::<Vec<_>>(),
            "resources": rows,
            "primitives": self.primitives.iter().map(primitives::Primitive::to_json).collect::<Vec<_>>(),
            "truncated": self.truncated,
            "warnings": self.warnings(),
        })
    }

    fn to_text(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(out, "lock service: {} ({})", self.lock.0, self.lock.1);
        for (backend, url) in &self.stores {
            let _ = writeln!(out, "store: {backend} ({url})");
        }
        if self.rows.is_empty() {
            let _ = writeln!(out, "no resource found");
        }
        for row in &self.rows {
            let lock = &row.lock;
            let _ = writeln!(out, "\n{}", lock.key);
            match &lock.holder {
                Some(h) => {
                    let fence = h.fence.map_or_else(
                        || "not known (not kept beside the holder, or issued under an epoch since raised)".to_string(),
                        |f| f.to_string(),
                    );
                    let left = h.expires_in.map_or_else(
                        || "no expiry of its own (it lasts as long as its holder's session)".to_string(),
                        |d| format!("{:.1} s left", d.as_secs_f64()),
                    );
                    let _ = writeln!(out, "  held by grant {}, fence {fence}, {left}", h.grant);
                }
                None => {
                    let _ = writeln!(out, "  free");
                }
            }
            let counter = match lock.fence_counter {
                None => "not known to this service (nobody holds or waits)".to_string(),
                Some(f) if f.get() == 0 => "0 (none kept: the next fence is 1)".to_string(),
                Some(f) => f.to_string(),
            };
            let _ = writeln!(out, "  fence counter: {counter}; waiters: {}", waiters_text(lock.waiters));
            for (store, mark) in &row.marks {
                match mark {
                    Some(m) => {
                        let by = match (m.grant, &lock.holder) {
                            (Some(g), Some(h)) if g == h.grant => format!("grant {g} (the holder)"),
                            (Some(g), _) => format!("grant {g}"),
                            (None, _) => "a grant not recorded (written before grants were)".to_string(),
                        };
                        let _ = writeln!(out, "  {store} watermark: {}, set by {by}", m.fence);
                    }
                    None => {
                        let _ = writeln!(out, "  {store} watermark: none (never written under a fence)");
                    }
                }
            }
            for warning in row.warnings() {
                let _ = writeln!(out, "  WARNING: {warning}");
            }
        }
        if !self.primitives.is_empty() {
            let _ = writeln!(out, "\nprimitives:");
            for line in self.primitives.iter().flat_map(primitives::Primitive::to_lines) {
                let _ = writeln!(out, "  {line}");
            }
        }
        if self.truncated {
            let _ = writeln!(out, "\n(more than {} resources: narrow --prefix to see the rest)", palisade::MAX_LISTED);
        }
        out
    }
}

fn waiters_json(waiters: Waiters) -> Value {
    match waiters {
        Waiters::Queued(n) => json!({ "kind": "queued", "count": n }),
        Waiters::Marked => json!({ "kind": "marked" }),
        Waiters::None => json!({ "kind": "none", "count": 0 }),
        _ => json!({ "kind": "unknown" }),
    }
}

fn waiters_text(waiters: Waiters) -> String {
    match waiters {
        Waiters::Queued(n) => format!("{n} queued"),
        Waiters::Marked => "at least one has waited since the grant".to_string(),
        Waiters::None => "none".to_string(),
        _ => "not shown by this backend".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use palisade::{GrantId, HolderView};

    use super::*;

    fn grant(n: u8) -> GrantId {
        GrantId::from_bytes([n; 16])
    }

    fn row(counter: Option<u64>, holder: Option<(u8, u64)>, mark: Option<(u64, u8)>) -> Row {
        let key = ResourceKey::new("alloc", "WH-01").unwrap_or_else(|e| panic!("{e}"));
        let mut lock = LockView::free(key).with_counter(counter.map(Fence::new));
        if let Some((g, f)) = holder {
            lock = lock.held_by(HolderView::new(grant(g), Some(Fence::new(f)), None));
        }
        Row { lock, marks: vec![("sqlite", mark.map(|(f, g)| WatermarkView::new(Fence::new(f), Some(grant(g)))))] }
    }

    #[test]
    fn a_counter_below_a_watermark_is_a_regression_waiting() {
        assert!(row(Some(5), None, Some((5, 1))).warnings().is_empty(), "the last holder wrote: fine");
        assert!(row(Some(4), None, Some((5, 1))).warnings().iter().any(|w| w.starts_with("FENCE REGRESSION")));
        // A counter lost with the service's data reads 0.
        assert_eq!(row(Some(0), None, Some((5, 1))).warnings().len(), 1);
        // A service that cannot tell its counter raises nothing.
        assert!(row(None, None, Some((5, 1))).warnings().is_empty());
    }

    #[test]
    fn a_holder_held_to_a_higher_or_someone_elses_equal_fence_is_said() {
        assert!(row(Some(6), Some((2, 6)), Some((5, 1))).warnings().is_empty());
        assert!(row(Some(5), Some((1, 5)), Some((5, 1))).warnings().is_empty(), "its own write");
        let duplicate = row(Some(5), Some((2, 5)), Some((5, 1))).warnings();
        assert!(duplicate.iter().any(|w| w.contains("issued one fence twice")), "{duplicate:?}");
        let below = row(Some(7), Some((2, 4)), Some((5, 1))).warnings();
        assert!(below.iter().any(|w| w.contains("below sqlite's watermark")), "{below:?}");
    }
}
