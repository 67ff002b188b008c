//! Read-write lock scenarios: [`palisade_core::RwLock`] on a fenced lock service and a store,
//! stamped by [`certify!`](macro@crate::certify) for every fenced lock service.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use palisade_core::{Fenced, FencedStore, FencedStoreExt, LockOptions, LockService, RwLock, WriteBatch};
use tokio::time::Instant;

use crate::harness::{Ctx, Outcome};
use crate::lock::{client, key, patience};
use crate::store::store_client;
use crate::{FencedStoreFactory, LockServiceFactory, Namespace, attempt, ensure};

const MAX_READERS: u32 = 3;

/// One hold of the lock, from its grant to its release (cut at its `safe_until`).
#[derive(Clone, Copy)]
struct Hold {
    writer: bool,
    from: Instant,
    to: Instant,
}

/// **Many readers or one writer, and writers are not starved.** Four reader clients enter,
/// read (5–15 ms) and leave, over and over, so that readers keep overlapping, for a second and
/// until two writer clients have each entered 3 times (asking again 20 ms after each turn). An overlap detector
/// over the holds finds: never a writer together with anyone else, never more than 3 readers
/// (the lock's `max_readers`), and at some moment more than one reader (readers share). Every
/// writer's entry completes within its wait (`Timeout` would be starvation) while the readers
/// keep coming; the longest writer wait is reported.
pub async fn rwlock_readers_share_writers_exclude<L, S>(ctx: &Ctx, lf: &L, sf: &S) -> Outcome
where
    L: LockServiceFactory,
    L::Service: LockService<Fencing = Fenced>,
    S: FencedStoreFactory,
{
    const READERS: usize = 4;
    const WRITERS: usize = 2;
    const WRITES: u64 = 3;
    let ns = Namespace::new();
    let rw_key = key(ctx, &ns, "rwlock")?;
    let timing = lf.timing();
    let ttl = (timing.ttl * 10).max(Duration::from_secs(2));
    let options = LockOptions::ttl(ttl).wait(patience(ttl));
    let store: Arc<dyn FencedStore> = store_client(ctx, sf).await?;
    let holds: Arc<Mutex<Vec<Hold>>> = Arc::default();
    let writers_done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Readers stop by then even if a writer failed (its failure is the scenario's).
    let (started, give_up) = (Instant::now(), Instant::now() + patience(ttl) * 2);
    let mut tasks = Vec::new();
    for c in 0..READERS + WRITERS {
        let writer = c >= READERS;
        let svc = client(ctx, lf).await?;
        let rw = attempt!(ctx, RwLock::new(svc, Arc::clone(&store), rw_key.clone(), MAX_READERS), "rwlock");
        let (holds, writers_done) = (Arc::clone(&holds), Arc::clone(&writers_done));
        tasks.push(tokio::spawn(async move {
            let (mut n, mut longest_wait, mut refused) = (0u64, Duration::ZERO, Vec::new());
            let more = |n: u64| {
                if writer {
                    n < WRITES
                } else {
                    // Readers read for a second at least, side by side, and until the writers are done.
                    let writing = writers_done.load(std::sync::atomic::Ordering::SeqCst) < WRITERS;
                    (writing || started.elapsed() < Duration::from_secs(1)) && Instant::now() < give_up
                }
            };
            while more(n) {
                let asked = Instant::now();
                let hold = 5 + (n * 7 + c as u64 * 3) % 11;
                let (granted, ended, released) = if writer {
                    let lease = rw.write(options).await?;
                    let granted = Instant::now();
                    tokio::time::sleep(Duration::from_millis(hold)).await;
                    (granted, Instant::now().min(lease.safe_until()), lease.release().await)
                } else {
                    let read = rw.read(options).await?;
                    let granted = Instant::now();
                    tokio::time::sleep(Duration::from_millis(hold)).await;
                    (granted, Instant::now().min(read.safe_until()), read.release().await)
                };
                longest_wait = longest_wait.max(granted - asked);
                holds.lock().unwrap_or_else(PoisonError::into_inner).push(Hold { writer, from: granted, to: ended });
                // Judged after the overlap check: a lock taken from under its holder shows as
                // an overlap first.
                if let Err(e) = released {
                    refused.push(e.to_string());
                }
                n += 1;
                if writer {
                    // A writer pauses between turns; readers never do.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            if writer {
                writers_done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            Ok::<_, palisade_core::Error>((writer, n, longest_wait, refused))
        }));
    }
    let mut per_writer = Vec::new();
    let (mut reads, mut longest, mut refused) = (0, Duration::ZERO, Vec::new());
    for t in tasks {
        match t.await {
            Ok(Ok((true, n, wait, r))) => {
                per_writer.push(n);
                longest = longest.max(wait);
                refused.extend(r);
            }
            Ok(Ok((false, n, _, r))) => {
                reads += n;
                refused.extend(r);
            }
            Ok(Err(e)) => return Err(ctx.fail(format!("a reader or writer failed: {e}"))),
            Err(e) => return Err(ctx.fail(format!("a reader or writer panicked: {e}"))),
        }
    }
    let holds = holds.lock().unwrap_or_else(PoisonError::into_inner).clone();
    // (instant, +1/-1 start/end, writer?): an end and a start at the same instant do not overlap.
    let mut events: Vec<(Instant, i32, bool)> =
        holds.iter().flat_map(|h| [(h.from, 1, h.writer), (h.to, -1, h.writer)]).collect();
    events.sort_by_key(|&(t, d, _)| (t, d));
    let (mut readers, mut writers, mut most_readers) = (0i32, 0i32, 0i32);
    for (_, d, writer) in events {
        if writer {
            writers += d;
        } else {
            readers += d;
        }
        ensure!(ctx, writers <= 1, "two writers at once");
        ensure!(ctx, writers == 0 || readers == 0, "a writer and {readers} reader(s) at once");
        most_readers = most_readers.max(readers);
    }
    ensure!(
        ctx,
        most_readers <= i32::try_from(MAX_READERS).unwrap_or(i32::MAX),
        "{most_readers} readers at once on a lock of {MAX_READERS} readers"
    );
    ensure!(ctx, most_readers > 1, "never two readers at once in {reads} reads: readers do not share");
    ensure!(ctx, refused.is_empty(), "{} releases refused, the first: {:?}", refused.len(), refused.first());
    ctx.note(format!(
        "{reads} reads (at most {most_readers} at once), writes per writer {per_writer:?}, longest writer wait {:.0} ms",
        longest.as_secs_f64() * 1e3
    ));
    Ok(ctx.report())
}

/// **Stale writers and stale readers are refused by the store.** Writer A writes, then pauses
/// past its TTL; reader R enters: A's next write is refused with `StaleFence` (R's generation
/// is the watermark) although nobody wrote data after A, and A's lost signal fired. Then R
/// pauses past its TTL and writer B enters and writes: R's check is refused with `StaleFence`
/// (R's generation against B's), R's lost signal fired, and the data is B's.
pub async fn rwlock_stale_holders_refused<L, S>(ctx: &Ctx, lf: &L, sf: &S) -> Outcome
where
    L: LockServiceFactory,
    L::Service: LockService<Fencing = Fenced>,
    S: FencedStoreFactory,
{
    let ns = Namespace::new();
    let rw_key = key(ctx, &ns, "rwlock")?;
    let timing = lf.timing();
    let store: Arc<dyn FencedStore> = store_client(ctx, sf).await?;
    let rw = |svc| RwLock::new(svc, Arc::clone(&store), rw_key.clone(), MAX_READERS);
    let (a, r, b) = (
        attempt!(ctx, rw(client(ctx, lf).await?), "rwlock"),
        attempt!(ctx, rw(client(ctx, lf).await?), "rwlock"),
        attempt!(ctx, rw(client(ctx, lf).await?), "rwlock"),
    );
    let short = LockOptions::ttl(timing.ttl).wait(patience(timing.ttl));
    let record = ns.record("rw-data");
    let writer_a = attempt!(ctx, a.write(short).await, "A enters as the writer");
    attempt!(ctx, store.write(&writer_a, &WriteBatch::new().put(record.clone(), b"A1".to_vec())).await, "A's write");
    tokio::time::sleep(timing.expiry_bound()).await;
    let reader = attempt!(ctx, r.read(short).await, "R enters as a reader");
    ensure!(
        ctx,
        reader.generation() > writer_a.fence(),
        "R's generation {} is not above A's fence {}",
        reader.generation(),
        writer_a.fence()
    );
    let late = store.write(&writer_a, &WriteBatch::new().put(record.clone(), b"A2".to_vec())).await;
    ensure!(
        ctx,
        late.as_ref().err().and_then(palisade_core::Error::stale_fence_details)
            == Some((writer_a.fence(), reader.generation())),
        "the stale writer's write after a reader entered gave {late:?}, expected StaleFence {{ {}, {} }}",
        writer_a.fence(),
        reader.generation()
    );
    ensure!(ctx, writer_a.is_lost(), "the stale writer's lost signal had not fired");
    attempt!(ctx, reader.check().await, "R's check while no writer entered after it");
    tokio::time::sleep(timing.expiry_bound()).await;
    let writer_b = attempt!(ctx, b.write(short).await, "B enters as the writer after R's TTL");
    attempt!(ctx, store.write(&writer_b, &WriteBatch::new().put(record.clone(), b"B".to_vec())).await, "B's write");
    let checked = reader.check().await;
    ensure!(
        ctx,
        checked.as_ref().err().and_then(palisade_core::Error::stale_fence_details)
            == Some((reader.generation(), writer_b.fence())),
        "the stale reader's check after B entered gave {checked:?}, expected StaleFence {{ {}, {} }}",
        reader.generation(),
        writer_b.fence()
    );
    ensure!(ctx, reader.is_lost(), "the stale reader's lost signal had not fired");
    let data = attempt!(ctx, store.read(&record).await, "read");
    ensure!(ctx, data.as_ref().map(|r| r.value.as_slice()) == Some(b"B"), "data: {data:?}");
    let _ = writer_b.release().await;
    Ok(ctx.report())
}
