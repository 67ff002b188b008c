//! A client process of the torture run (`palisade torture-client`, internal): it takes locks,
//! reads and writes each resource's register through the fenced store, allocates the
//! warehouse's stock of each SKU as the warehouse example does, and prints every call and its
//! outcome as a history event (one JSON line each) until its stdin closes.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use palisade::{
    DynFencedStore, DynLockService, ErrorKind, FencedStoreExt, Lease, LockOptions, LockServiceExt, ResourceKey,
    WriteBatch,
};
use palisade_examples::warehouse::inventory::{self, Mode, Order, Warehouse};
use palisade_history::{Call, Event, Outcome};
use tokio::io::AsyncReadExt;

use super::schedule::Rng;
use super::{CALL_MS, now, register_key, resource_name, sku_name};

/// `palisade torture-client` flags (internal).
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    #[command(flatten)]
    pub pair: crate::worker::PairArgs,
    /// This process's number in the history.
    #[arg(long)]
    pub process: u32,
    #[arg(long)]
    pub resources: usize,
    #[arg(long)]
    pub ttl_ms: u64,
    #[arg(long)]
    pub wait_ms: u64,
    /// Draws the workload's choices (which resource, how many writes, how long to sleep).
    #[arg(long)]
    pub seed: u64,
}

pub async fn run(args: ClientArgs) -> ExitCode {
    let stop = Arc::new(AtomicBool::new(false));
    // Stdin closing is the signal to finish the current cycle and exit.
    let stopping = stop.clone();
    tokio::spawn(async move {
        let mut sink = Vec::new();
        let _ = tokio::io::stdin().read_to_end(&mut sink).await;
        stopping.store(true, Ordering::SeqCst);
    });
    match work(&args, &stop).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("torture client {}: {e}", args.process);
            ExitCode::from(1)
        }
    }
}

struct Recorder {
    process: u32,
    next: u64,
}

impl Recorder {
    fn invoke(&mut self, call: Call, within_ms: u64) -> u64 {
        self.next += 1;
        emit(&Event::Invoke { process: self.process, op: self.next, at: now(), within_ms, call });
        self.next
    }

    fn complete(&self, op: u64, outcome: Outcome) {
        emit(&Event::Complete { process: self.process, op, at: now(), outcome });
    }
}

fn emit(event: &Event) {
    // One line per event, written whole: the parent reads lines, and a process killed
    // mid-write leaves at most a torn last line, which the parent drops.
    if let Ok(line) = serde_json::to_string(event) {
        println!("{line}");
    }
}

async fn work(args: &ClientArgs, stop: &AtomicBool) -> palisade::Result<()> {
    // A client started while the schedule holds a server down (a restart, a partition, a
    // failover) keeps trying, as a real worker would, instead of leaving its place empty.
    let locks = until_connected(stop, || super::connect_lock(&args.pair.lock)).await?;
    let store = until_connected(stop, || super::connect_store(&args.pair.store)).await?;
    let warehouse = until_connected(stop, || super::connect_warehouse(&args.pair.store, &args.pair.ns, &store)).await?;
    let mut rng = Rng::new(args.seed ^ (u64::from(args.process) << 32));
    let mut rec = Recorder { process: args.process, next: 0 };
    let ttl = Duration::from_millis(args.ttl_ms);
    let mut grants = 0u64;
    while !stop.load(Ordering::SeqCst) {
        // Half the holds are of a register, half of a SKU of the warehouse.
        let index = rng.below(2 * args.resources);
        let on = if index < args.resources {
            let resource = resource_name(index);
            On::Register { register: register_key(&args.pair.ns, &resource), resource }
        } else {
            On::Sku { resource: sku_name(index - args.resources), warehouse: &warehouse }
        };
        let resource = on.resource().to_string();
        let op = rec.invoke(Call::Acquire { resource: resource.clone(), ttl_ms: args.ttl_ms }, args.wait_ms + CALL_MS);
        let options = LockOptions::ttl(ttl).wait(Duration::from_millis(args.wait_ms));
        let locked = match &on {
            On::Register { .. } => {
                let key = ResourceKey::new(args.pair.ns.clone(), resource.clone())?;
                locks.lock_checked(&*store, &key, options).await.map(Some)
            }
            // The warehouse's own lock and check: the SKU's row fence on the tables.
            On::Sku { warehouse, .. } => warehouse.lock_checked(&locks, &resource, options).await,
        };
        let lease = match locked {
            Ok(Some(lease)) => {
                grants += 1;
                let grant = format!("p{}.{grants}", args.process);
                let safe_until = Some(on_history_clock(lease.safe_until()));
                rec.complete(op, Outcome::Granted { grant: grant.clone(), fence: lease.fence().get(), safe_until });
                (lease, grant)
            }
            Ok(None) => {
                rec.complete(op, Outcome::Refused);
                continue;
            }
            Err(e) if e.kind() == ErrorKind::Timeout => {
                rec.complete(op, Outcome::Refused);
                continue;
            }
            Err(e) => {
                rec.complete(op, Outcome::Unknown { error: e.to_string() });
                tokio::time::sleep(Duration::from_millis(rng.between(10, 100))).await;
                continue;
            }
        };
        hold(args, &mut rng, &mut rec, &store, &on, lease).await;
        tokio::time::sleep(Duration::from_millis(rng.between(0, 30))).await;
    }
    Ok(())
}

/// What a hold works on.
enum On<'w> {
    /// A resource's register (`register`: its record's key).
    Register { resource: String, register: String },
    /// A SKU of the warehouse: its stock, allocated for jobs.
    Sku { resource: String, warehouse: &'w Warehouse },
}

impl On<'_> {
    fn resource(&self) -> &str {
        match self {
            On::Register { resource, .. } | On::Sku { resource, .. } => resource,
        }
    }
}

/// Connects with `connect` until it succeeds, trying again every 200 ms while the error is one
/// a server coming back may end (unavailable, timed out); any other error, or the stop signal,
/// ends the tries with the last error.
async fn until_connected<T, F, Fut>(stop: &AtomicBool, connect: F) -> palisade::Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = palisade::Result<T>>,
{
    loop {
        match connect().await {
            Ok(connected) => return Ok(connected),
            Err(e) if e.is_retryable() && !stop.load(Ordering::SeqCst) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Works, then reads and writes, under the lease a few times (a register's value, or a SKU's
/// stock and an allocation), sometimes extending it, then gives it back. One hold in four is long: it keeps
/// writing, extending the lease after each write, until two TTLs have passed, as a job that
/// outlives its first lease does (without these, a lease rarely outlives its first TTL, and an
/// extend the service ignores goes unseen).
async fn hold(
    args: &ClientArgs,
    rng: &mut Rng,
    rec: &mut Recorder,
    store: &Arc<DynFencedStore>,
    on: &On<'_>,
    (lease, grant): (Lease<DynLockService>, String),
) {
    let resource = on.resource();
    let long_until = (rng.below(4) == 0).then(|| tokio::time::Instant::now() + Duration::from_millis(2 * args.ttl_ms));
    let writes = if long_until.is_some() { u64::MAX } else { rng.between(1, 3) };
    for write in 0..writes {
        if long_until.is_some_and(|until| tokio::time::Instant::now() >= until) {
            break;
        }
        // The work before each write, the first included: a job computes between taking the
        // lock and writing, and the incident's holder was frozen there. Without it a pause
        // rarely lands between a grant and its first write, and a lock service that gives an
        // expired holder's fence to its successor goes unseen (the successor's fence check
        // turns it away once the old holder has written).
        tokio::time::sleep(Duration::from_millis(rng.between(0, args.ttl_ms / 3))).await;
        let refused = match on {
            On::Register { register, .. } => {
                write_register(rec, store, (resource, register), (&lease, &grant), write).await
            }
            On::Sku { warehouse, .. } => allocate(rng, rec, warehouse, resource, (&lease, &grant), write).await,
        };
        if refused {
            break;
        }
        if long_until.is_some() || rng.below(3) == 0 {
            let call = Call::Extend { resource: resource.to_string(), grant: grant.clone() };
            let op = rec.invoke(call, CALL_MS);
            let extended = lease.extend(Duration::from_millis(args.ttl_ms)).await;
            rec.complete(op, done_or_lost(extended.map(|()| Some(on_history_clock(lease.safe_until())))));
        }
    }
    let op = rec.invoke(Call::Release { resource: resource.to_string(), grant }, CALL_MS);
    rec.complete(op, done_or_lost(lease.release().await.map(|()| None)));
}

/// Reads the register, then writes a value of this grant's to it; whether the write was
/// refused (the hold then ends).
async fn write_register(
    rec: &mut Recorder,
    store: &Arc<DynFencedStore>,
    (resource, register): (&str, &str),
    (lease, grant): (&Lease<DynLockService>, &str),
    write: u64,
) -> bool {
    let op = rec.invoke(Call::Read { resource: resource.to_string() }, CALL_MS);
    let outcome = match store.read(register).await {
        Ok(record) => Outcome::Value { value: record.map(|r| String::from_utf8_lossy(&r.value).into_owned()) },
        Err(e) => Outcome::Unknown { error: e.to_string() },
    };
    rec.complete(op, outcome);
    let value = format!("{grant}.w{write}");
    let fence = lease.fence().get();
    let call = Call::Write { resource: resource.to_string(), grant: grant.to_string(), fence, value: value.clone() };
    let op = rec.invoke(call, CALL_MS);
    let result = store.write(lease, &WriteBatch::new().put(register.to_string(), value.into_bytes())).await;
    let refused = result.is_err();
    rec.complete(op, write_outcome(result));
    refused
}

/// Jobs come in a window that slides by one every this long: the clients of one SKU keep
/// drawing the same few jobs, so a job is often tried again by another holder (as a queue
/// redelivers one whose worker went quiet), and at most one attempt may ship it.
const JOB_EVERY_MS: u64 = 200;

/// Reads the SKU's stock, then allocates it for a job through the warehouse's own allocation
/// (the stock and the job's audit row in one fenced write, only if the job is not done yet);
/// whether the allocation was refused (the hold then ends).
async fn allocate(
    rng: &mut Rng,
    rec: &mut Recorder,
    warehouse: &Warehouse,
    sku: &str,
    (lease, grant): (&Lease<DynLockService>, &str),
    write: u64,
) -> bool {
    let op = rec.invoke(Call::Stock { resource: sku.to_string() }, CALL_MS);
    let outcome = match warehouse.stock(sku).await {
        Ok(stock) => Outcome::Units { qty: stock.map(|s| s.qty) },
        Err(e) => Outcome::Unknown { error: e.to_string() },
    };
    rec.complete(op, outcome);
    let n = now() / (JOB_EVERY_MS * 1_000_000) + rng.below(4) as u64;
    let (job, attempt, qty) = (format!("{sku}.j{n}"), format!("{grant}.a{write}"), 1 + (n % 3) as i64);
    let fence = lease.fence().get();
    let call = Call::Allocate {
        resource: sku.to_string(),
        grant: grant.to_string(),
        fence,
        job: job.clone(),
        attempt: attempt.clone(),
        qty,
    };
    let op = rec.invoke(call, CALL_MS);
    let order = Order { sku, job: &job, attempt: &attempt, qty };
    // A short pause between the allocation's read and its write: the window a stale holder
    // wakes in.
    let pause = Duration::from_millis(rng.between(0, 20));
    let outcome = match warehouse.allocate(lease, Mode::Fenced, &order, pause).await {
        Ok(inventory::Outcome::Applied) => Outcome::Accepted,
        Ok(inventory::Outcome::StaleFence { .. }) => Outcome::Stale,
        Ok(inventory::Outcome::AlreadyDone) => Outcome::AlreadyDone,
        Ok(other) => Outcome::Failed { error: format!("{other:?}") },
        Err(e) => write_outcome(Err(e)),
    };
    let refused = !matches!(outcome, Outcome::Accepted | Outcome::AlreadyDone);
    rec.complete(op, outcome);
    refused
}

/// A write's outcome as the history states it: only an error that certainly left nothing
/// behind is a refusal; anything else may have been applied.
fn write_outcome(result: palisade::Result<()>) -> Outcome {
    let Err(e) = result else { return Outcome::Accepted };
    match e.kind() {
        ErrorKind::StaleFence { .. } => Outcome::Stale,
        ErrorKind::DuplicateFence { .. } => Outcome::Duplicate,
        ErrorKind::LeaseLost
        | ErrorKind::NotHolder
        | ErrorKind::Conflict
        | ErrorKind::FenceRegression
        | ErrorKind::InvalidArgument
        | ErrorKind::InvalidKey => Outcome::Failed { error: e.to_string() },
        _ => Outcome::Unknown { error: e.to_string() },
    }
}

/// `instant` on the history's clock (`CLOCK_MONOTONIC`, which `Instant` reads too).
fn on_history_clock(instant: tokio::time::Instant) -> u64 {
    let (here, t) = (tokio::time::Instant::now(), now());
    match instant.checked_duration_since(here) {
        Some(ahead) => t.saturating_add(u64::try_from(ahead.as_nanos()).unwrap_or(u64::MAX)),
        None => t.saturating_sub(u64::try_from(here.duration_since(instant).as_nanos()).unwrap_or(u64::MAX)),
    }
}

/// An extend's or a release's outcome; `Ok` carries the lease's new `safe_until` (an extend's).
fn done_or_lost(result: palisade::Result<Option<u64>>) -> Outcome {
    match result {
        Ok(safe_until) => Outcome::Done { safe_until },
        Err(e) if matches!(e.kind(), ErrorKind::LeaseLost | ErrorKind::NotHolder) => Outcome::Lost,
        Err(e) => Outcome::Unknown { error: e.to_string() },
    }
}
