//! `palisade inspect`: who holds which lock, with which fence, and which fence each store now
//! holds the resource's writes to. It reads the lock service's and the stores' own records
//! through their read-only views ([`palisade::InspectLocks`], [`palisade::InspectStore`]) and
//! changes nothing.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use palisade::{DynInspectLocks, DynInspectStore, Fence, LockView, ResourceKey, Waiters, WatermarkView, redact_url};
use serde_json::{Value, json};

/// `palisade inspect` flags.
#[derive(Debug, Clone, Args)]
pub struct InspectArgs {
    /// The lock service's URL: redis://, redis+sentinel://, redis+cluster://, etcd://, zk://,
    /// postgres://, sqlite://PATH.
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
    /// Show the view again every SECONDS (2 when not given) until interrupted.
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "2")]
    pub watch: Option<f64>,
}

/// Exit codes: 0 shown, nothing wrong; 1 shown, with a warning (a fence regression waiting to
/// happen); 2 bad usage; 3 a service or store could not be reached or read.
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
    let views = match Views::connect(&args).await {
        Ok(views) => views,
        Err(e) => {
            eprintln!("palisade inspect: {e}");
            return ExitCode::from(3);
        }
    };
    let prefix = args.prefix.clone().unwrap_or_default();
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
        refuse_missing_file(&args.lock)?;
        let lock = (redact_url(&args.lock), palisade::inspect_locks(&args.lock).await?);
        let mut stores = Vec::new();
        for url in &args.stores {
            refuse_missing_file(url)?;
            stores.push((redact_url(url), palisade::inspect_store(url).await?));
        }
        Ok(Views { lock, stores })
    }

    /// One view of `one` resource, or of every resource starting with `prefix`.
    async fn snapshot(&self, one: Option<&ResourceKey>, prefix: &str) -> palisade::Result<Snapshot> {
        let (lock_url, locks) = &self.lock;
        let mut truncated = false;
        // Every resource either side keeps anything for: a store's watermark outlives a lock
        // that left nothing behind (etcd, ZooKeeper), and a lock may never have written.
        let keys: Vec<ResourceKey> = match one {
            Some(key) => vec![key.clone()],
            None => {
                let mut keys: BTreeMap<String, ResourceKey> = BTreeMap::new();
                let listed = locks.resources(prefix).await?;
                truncated |= listed.truncated;
                keys.extend(listed.entries.into_iter().map(|k| (k.to_string(), k)));
                for (_, store) in &self.stores {
                    let marks = store.watermarks(prefix).await?;
                    truncated |= marks.truncated;
                    keys.extend(marks.entries.into_iter().map(|(k, _)| (k.to_string(), k)));
                }
                keys.into_values().take(palisade::MAX_LISTED).collect()
            }
        };
        let mut rows = Vec::with_capacity(keys.len());
        for key in keys {
            let lock = locks.lock_view(&key).await?;
            let mut marks = Vec::with_capacity(self.stores.len());
            for (_, store) in &self.stores {
                marks.push((store.backend(), store.watermark_view(&key).await?));
            }
            rows.push(Row { lock, marks });
        }
        Ok(Snapshot {
            lock: (locks.backend(), lock_url.clone()),
            stores: self.stores.iter().map(|(url, s)| (s.backend(), url.clone())).collect(),
            rows,
            truncated,
        })
    }
}

/// An SQLite URL naming a file that does not exist: inspecting it would create an empty
/// database, and show nothing, where the person on call most likely mistyped the path.
fn refuse_missing_file(url: &str) -> palisade::Result<()> {
    let Some(rest) = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:")) else { return Ok(()) };
    let path = rest.split('?').next().unwrap_or_default();
    if path.is_empty() || path == ":memory:" || std::path::Path::new(path).exists() {
        return Ok(());
    }
    Err(palisade::Error::new(
        palisade::ErrorKind::InvalidConfig,
        "sqlite",
        format!("{path} does not exist (inspect never creates a database)"),
    ))
}

/// One resource: its lock, and its watermark in each store (in the order given).
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
                && fence < mark.fence
            {
                out.push(format!(
                    "the holder's fence ({fence}) is below {store}'s watermark ({}): every write it makes will be refused",
                    mark.fence
                ));
            }
        }
        out
    }
}

/// A view of the lock service and its stores at one moment.
struct Snapshot {
    lock: (&'static str, String),
    stores: Vec<(&'static str, String)>,
    rows: Vec<Row>,
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
                        || "not recorded with the lock (the counter's, unless a repair moved it)".to_string(),
                        |f| f.to_string(),
                    );
                    let left = h.expires_in.map_or_else(
                        || "lasts as long as its session".to_string(),
                        |d| format!("{:.1} s left", d.as_secs_f64()),
                    );
                    let _ = writeln!(out, "  held by grant {}, fence {fence}, {left}", h.grant);
                }
                None => {
                    let _ = writeln!(out, "  free");
                }
            }
            let counter = lock.fence_counter.map_or_else(|| "none issued".to_string(), |f| f.to_string());
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
