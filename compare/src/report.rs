//! Orchestration and output: the Markdown report, the JSON, the SVG charts.

use std::fmt::Write as _;
use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::json;

use crate::charts;
use crate::faults::{self, Cell};
use crate::local::Local;
use crate::memory::{self, Watched};
use crate::perf::{
    self, ACROSS, ACROSS_LATE, LEADER, LockPerf, MINIMAL, MUTEX, OURS, PERMIT, PrimitivePerf, RAW, READ, SAME,
    StorePerf, WRITE,
};
use crate::target::{Backend, LockTarget, StoreTarget, shown};
use crate::warehouse::{self, WarehouseRun};
use crate::{CompareArgs, Part};
use palisade_compare::measure::Plan;

/// The session TTL / timeout (s) of the locally started etcd and ZooKeeper: how long a frozen or
/// killed holder's session outlives it.
const LOCAL_SESSION_S: u64 = 2;

#[derive(Debug, Serialize)]
struct Pair {
    lock: String,
    store: String,
    faults: Vec<Cell>,
    warehouse: Vec<WarehouseRun>,
    warehouse_error: Option<String>,
}

#[derive(Debug, Serialize)]
struct LockRow {
    label: String,
    backend: Backend,
    url: String,
    fenced: bool,
    raw_op: &'static str,
    perf: Option<LockPerf>,
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct StoreRow {
    label: String,
    url: String,
    perf: Option<StorePerf>,
    error: Option<String>,
}

fn progress(total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} steps, ETA {eta} {msg}")
    {
        bar.set_style(style);
    }
    bar
}

pub async fn compare(args: CompareArgs) -> Result<ExitCode, String> {
    let started = std::time::Instant::now();
    let plan = if args.quick { Plan::quick() } else { Plan::full() };
    let warehouse_plan = warehouse::WarehousePlan {
        jobs: args.warehouse_jobs.unwrap_or(if args.quick { 200 } else { 2000 }),
        workers: args.warehouse_workers,
        skus: args.warehouse_skus,
        pause_every: args.warehouse_pause_every,
    };
    let (run_perf, run_faults, run_warehouse) =
        (args.runs(Part::Perf), args.runs(Part::Faults), args.runs(Part::Warehouse));
    let mut local = if args.local {
        eprintln!("starting loopback servers (Redis, 3 Redlock masters, etcd, ZooKeeper, PostgreSQL)…");
        Some(Local::start(LOCAL_SESSION_S)?)
    } else {
        None
    };
    let mut locks: Vec<(LockTarget, bool)> = Vec::new();
    let mut stores: Vec<StoreTarget> = Vec::new();
    if let Some(l) = &local {
        locks.extend(l.locks.iter().cloned().map(|t| (t, true)));
        stores.extend(l.stores.iter().cloned());
    }
    for url in &args.locks {
        let backend = Backend::of(url).ok_or_else(|| format!("unknown lock service URL {}", shown(url)))?;
        locks.push((LockTarget { label: format!("{backend} ({})", shown(url)), url: url.clone(), backend }, false));
    }
    for url in &args.stores {
        stores.push(StoreTarget { label: shown(url), url: url.clone() });
    }
    if locks.is_empty() || stores.is_empty() {
        return Err("nothing to compare: give --local, or at least one --lock and one --store".into());
    }
    let sampler = memory::Sampler::start(&args.watch_memory)?;
    let pairs_n =
        locks.iter().map(|(l, _)| stores.iter().filter(|s| l.backend.pairs_with(&s.url)).count()).sum::<usize>() as u64;
    let bar = progress(locks.len() as u64 + stores.len() as u64 + pairs_n * 9);

    let mut lock_rows = Vec::new();
    for (target, _) in locks.iter().filter(|_| run_perf) {
        bar.set_message(format!("performance: {}", target.label));
        let fenced = match palisade::connect_any_lock(&target.url).await {
            Ok(svc) => Ok(svc.is_fenced()),
            Err(e) => Err(e.to_string()),
        };
        let measured = match &fenced {
            Ok(_) => perf::lock_perf(target.backend, &target.url, &plan).await,
            Err(e) => Err(e.clone()),
        };
        let row = LockRow {
            label: target.label.clone(),
            backend: target.backend,
            url: shown(&target.url),
            fenced: fenced.unwrap_or(false),
            raw_op: target.backend.raw_op(),
            perf: measured.as_ref().ok().cloned(),
            error: measured.err(),
        };
        lock_rows.push(row);
        bar.inc(1);
    }
    let mut store_rows = Vec::new();
    let mut store_clients = Vec::new();
    for target in &stores {
        bar.set_message(format!("performance: {}", target.label));
        match palisade::connect_store(&target.url).await {
            Ok(store) => {
                let p = if run_perf { perf::store_perf(&store, &plan).await } else { Err("not run".into()) };
                store_rows.push(StoreRow {
                    label: target.label.clone(),
                    url: shown(&target.url),
                    perf: p.as_ref().ok().cloned(),
                    error: p.err(),
                });
                store_clients.push(Some(store));
            }
            Err(e) => {
                store_rows.push(StoreRow {
                    label: target.label.clone(),
                    url: shown(&target.url),
                    perf: None,
                    error: Some(e.to_string()),
                });
                store_clients.push(None);
            }
        }
        bar.inc(1);
    }

    let mut pairs = Vec::new();
    for (lock, is_local) in &locks {
        for (target, store) in stores.iter().zip(&store_clients) {
            if !lock.backend.pairs_with(&target.url) {
                continue;
            }
            let Some(store) = store else {
                bar.inc(9);
                continue;
            };
            let name = format!("{} × {}", lock.label, target.label);
            let mut cells = Vec::new();
            // The worker is another process: it must reach the same lock service and store.
            let in_process = lock.backend == Backend::Memory
                || target.url.starts_with("memory:")
                || target.url.starts_with("sqlite::memory:");
            let not_shared = "not run: an in-process service or store cannot be shared with a worker process";
            if run_faults {
                bar.set_message(format!("{name}: holder paused past its TTL"));
                cells.push(if in_process {
                    Cell::skipped("paused", not_shared)
                } else {
                    faults::paused(&lock.url, &target.url, store, args.ttl()).await
                });
                bar.inc(1);
                bar.set_message(format!("{name}: holder killed"));
                cells.push(if in_process {
                    Cell::skipped("killed", not_shared)
                } else {
                    faults::killed(&lock.url, &target.url, store, args.ttl()).await
                });
                bar.inc(1);
                bar.set_message(format!("{name}: lock server restarted with its data"));
                let owned = if *is_local { local.as_mut() } else { None };
                cells.push(faults::restart(owned, lock.backend, &lock.url, store, args.ttl(), true).await);
                bar.inc(1);
                bar.set_message(format!("{name}: lock service lost its data"));
                let owned = if *is_local { local.as_mut() } else { None };
                cells.push(faults::restart(owned, lock.backend, &lock.url, store, args.ttl(), false).await);
                bar.inc(1);
                bar.set_message(format!("{name}: cluster leader killed"));
                cells.push(if *is_local {
                    faults::leader_kill(lock.backend, store, LOCAL_SESSION_S, args.quick).await
                } else {
                    Cell::skipped("leader_kill", "not run: the cluster was not started by --local")
                });
                bar.inc(1);
                bar.set_message(format!("{name}: Sentinel failover"));
                cells.push(if *is_local {
                    faults::sentinel_failover(lock.backend, store, args.quick).await
                } else {
                    Cell::skipped("failover", "not run: the Sentinels were not started by --local")
                });
                bar.inc(1);
                bar.set_message(format!("{name}: network partition"));
                cells.push(if *is_local {
                    faults::partition(lock.backend, &target.url, store, args.ttl(), args.quick).await
                } else {
                    Cell::skipped("partition", "not run: the servers were not started by --local")
                });
                bar.inc(1);
            } else {
                bar.inc(7);
            }
            let mut warehouse_runs = Vec::new();
            let mut warehouse_error = None;
            // An unfenced service has one mode only.
            let modes: &[bool] = match (run_warehouse, lock.backend) {
                (false, _) => &[],
                (true, Backend::Redlock) => &[true],
                (true, _) => &[false, true],
            };
            for &unfenced in modes {
                bar.set_message(format!(
                    "{name}: warehouse benchmark ({})",
                    if unfenced { "unfenced" } else { "fenced" }
                ));
                match warehouse::run(&lock.url, &target.url, warehouse_plan, unfenced).await {
                    Ok(r) => warehouse_runs.push(r),
                    Err(e) => warehouse_error = Some(e),
                }
                bar.inc(1);
            }
            pairs.push(Pair {
                lock: lock.label.clone(),
                store: target.label.clone(),
                faults: cells,
                warehouse: warehouse_runs,
                warehouse_error,
            });
        }
    }
    bar.finish_and_clear();
    let memory = sampler.finish().await;
    drop(local);

    let parameters = json!({
        "quick": args.quick,
        "fault_ttl_ms": args.ttl_ms,
        "local_session_s": LOCAL_SESSION_S,
        "plan": plan,
        "parts": { "perf": run_perf, "faults": run_faults, "warehouse": run_warehouse },
        "warehouse": { "jobs": warehouse_plan.jobs, "workers": warehouse_plan.workers, "skus": warehouse_plan.skus, "ttl_ms": 200, "pause_every": warehouse_plan.pause_every, "pause_ms": 450 },
        "command": command_line(std::env::args()),
        "server_data_dir": palisade_lab::servers::server_root().display().to_string(),
        "sqlite_dir": std::env::temp_dir().display().to_string(),
    });
    let machine = machine();
    let date = today();
    let mut report = json!({
        "date": date,
        "machine": machine,
        "parameters": parameters,
        "elapsed_s": started.elapsed().as_secs(),
        "locks": lock_rows,
        "stores": store_rows,
        "pairs": pairs,
        "memory": memory,
    });
    add_former_names(&mut report);
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let write = |name: &str, text: String| {
        std::fs::write(args.out.join(name), text).map_err(|e| format!("{}: {e}", args.out.join(name).display()))
    };
    write("report.json", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?)?;
    let series: Vec<charts::Series<'_>> =
        lock_rows.iter().filter_map(|l| Some(charts::Series { label: &l.label, perf: l.perf.as_ref()? })).collect();
    // Charts only for a run that measured performance: an earlier run's charts in the same
    // directory are not overwritten with empty ones, and no chart appears without its figures.
    if !series.is_empty() {
        write("latency.svg", charts::latency(&series)?)?;
        write("throughput.svg", charts::throughput(&series, &plan.concurrency)?)?;
    }
    write(
        "report.md",
        markdown(
            &date,
            &machine,
            &parameters,
            started.elapsed().as_secs(),
            &plan,
            &lock_rows,
            &store_rows,
            &pairs,
            &memory,
            &args,
        ),
    )?;
    eprintln!("report: {}", args.out.join("report.md").display());
    if args.json {
        println!("{report}");
    }
    Ok(ExitCode::SUCCESS)
}

fn mark(cell: &Cell) -> String {
    if !cell.ran {
        return "–".into();
    }
    let Some(safe) = cell.safe else { return format!("⚠️ {}", cell.note) };
    // Safe but nobody could proceed is a liveness failure: never drawn as a pass.
    let symbol = match (safe, cell.proceed_ms) {
        (false, _) => "❌",
        (true, None) => "🟠",
        (true, Some(_)) => "✅",
    };
    let mut s = String::from(symbol);
    if let Some(n) = cell.stale_accepted {
        let _ = write!(s, " stale {n}");
    }
    if let Some(n) = cell.duplicates {
        let _ = write!(s, ", dup {n}");
    }
    match cell.proceed_ms {
        Some(ms) => {
            let _ = write!(s, ", next in {:.0} ms", ms);
        }
        None => s.push_str(", next: blocked"),
    }
    if let Some(lost) = cell.lost_fired {
        let _ = write!(s, ", lost {}", if lost { "fired" } else { "not fired" });
    }
    s
}

#[allow(clippy::too_many_arguments)]
fn markdown(
    date: &str,
    machine: &serde_json::Value,
    parameters: &serde_json::Value,
    elapsed_s: u64,
    plan: &Plan,
    locks: &[LockRow],
    stores: &[StoreRow],
    pairs: &[Pair],
    memory: &[Watched],
    args: &CompareArgs,
) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# Palisade architecture comparison\n");
    let _ = writeln!(
        md,
        "Generated by `palisade compare` on {date} in {elapsed_s} s. Every figure below comes from this run.\n"
    );
    let _ = writeln!(md, "- Machine: {}", machine["description"].as_str().unwrap_or("?"));
    let _ = writeln!(md, "- Parameters (repeat the run with the same ones): `{parameters}`\n");
    if args.runs(Part::Faults) {
        let _ = writeln!(md, "## Fault matrix\n");
        let _ = writeln!(
            md,
            "Each cell: ✅ no stale write accepted, no duplicate, and another holder proceeded / 🟠 safe, but no other holder could proceed (a liveness failure) / ❌ a stale write or a duplicate; `stale` = writes the store accepted from a holder after a later holder's write; `dup` = effects applied twice (audit records; for a killed leader, holds of one lock that overlapped); `next in` = from the fault until another holder had the lock; `lost` = whether the frozen holder's lost signal had fired by the time it wrote. Lock server restarted with its data: A holds and has written, the server restarts with its data, B locks (waiting out A's TTL) and writes, A writes again. Lock service lost its data: the same, but Redis, etcd and ZooKeeper restart with their data directories wiped and the PostgreSQL and SQLite services lose their lock table (the store's data stays); B locks with `lock_checked`, which repairs the lost fence counter (`next in` = from the restart to B's grant). Sentinel failover: Redis's master killed behind three Sentinels while four clients contend (`next in` = to the first lock granted after the kill whose write landed). Network partition (network namespaces; needs root): for etcd and ZooKeeper a 3-member cluster's leader cut off from the majority and the clients under contention (`next in` = to the first lock granted after the cut whose write landed), then healed; for Redis and PostgreSQL a renewing holder cut off from the server and the store past its TTL (`next in` = to the contender's grant; the holder's write after the heal must be refused).\n"
        );
        let _ = writeln!(
            md,
            "| lock service × store | holder paused past TTL (SIGSTOP) | holder killed (SIGKILL) | lock server restarted with its data | lock service lost its data | cluster leader killed | Sentinel failover | network partition |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
        for p in pairs {
            let cells: Vec<String> = p.faults.iter().map(mark).collect();
            let _ = writeln!(md, "| {} × {} | {} |", p.lock, p.store, cells.join(" | "));
        }
        let _ = writeln!(md, "\nNotes per cell:\n");
        for p in pairs {
            for c in &p.faults {
                if c.ran || !c.note.is_empty() {
                    let _ = writeln!(md, "- {} × {}, {}: {}", p.lock, p.store, c.scenario, c.note);
                }
            }
        }
    }
    if args.runs(Part::Perf) {
        let _ = writeln!(md, "\n## Lock services: latency and throughput\n");
        let _ = writeln!(
            md,
            "Every figure is Palisade's `try_acquire` + `release` beside the backend's raw operation sent through the same client crate to the same server in this run, on the same keys ({} per task) and concurrency; each variant first warms up, then the variants take turns for {} rounds. Latency: {} sequential cycles per round, p50/p99 of all rounds pooled, and the min–max of the rounds' p50s. Throughput: cycles per second of {} tasks at once in {:.1}-s windows, the median of the rounds (min–max). Handoff: release returned → the waiter already waiting holds, {} per round. Ratios are Palisade ÷ raw.\n",
            plan.keys,
            plan.rounds,
            plan.cycles,
            plan.concurrency.iter().map(ToString::to_string).collect::<Vec<_>>().join(" / "),
            plan.window.as_secs_f64(),
            plan.handoffs,
        );
        let mut header =
            String::from("| lock service | fence | raw op | p50 ms (rounds) | p99 ms | raw p50 ms | p50 ratio |");
        let mut rule = String::from("|---|---|---|---|---|---|---|");
        for c in &plan.concurrency {
            let _ = write!(header, " {c} task{} /s | ratio |", if *c == 1 { "" } else { "s" });
            rule.push_str("---|---|");
        }
        header.push_str(" handoff p50 ms | p99 ms | raw handoff p50 ms |");
        rule.push_str("---|---|---|");
        let _ = writeln!(md, "{header}\n{rule}");
        for l in locks {
            let Some(p) = &l.perf else {
                let _ = writeln!(md, "| {} | | error: {} |", l.label, l.error.as_deref().unwrap_or("?"));
                continue;
            };
            let (ours, raw) = (p.latency(OURS), p.latency(RAW));
            let mut row = format!("| {} | {} | {} |", l.label, if l.fenced { "yes" } else { "**no**" }, l.raw_op);
            match ours {
                Some(o) => {
                    let _ = write!(
                        row,
                        " {} | {} | {} |",
                        o.cells(),
                        raw.map_or("–".into(), |r| format!("{:.3}", r.p50_ms)),
                        raw.map_or("–".into(), |r| format!("{:.2}×", o.ratio_to(r)))
                    );
                }
                None => row.push_str(" – | – | – | – |"),
            }
            for &c in &plan.concurrency {
                match p.rate(OURS, c) {
                    Some(o) => {
                        let _ = write!(
                            row,
                            " {} | {} |",
                            o.per_sec.rate_cell(),
                            p.rate(RAW, c).map_or("–".into(), |r| format!("{:.2}×", o.ratio_to(r)))
                        );
                    }
                    None => row.push_str(" – | – |"),
                }
            }
            match p.handoff(OURS) {
                Some(h) => {
                    let _ = write!(
                        row,
                        " {:.3} | {:.3} | {} |",
                        h.p50_ms,
                        h.p99_ms,
                        p.handoff(RAW).map_or("–".into(), |r| format!("{:.3}", r.p50_ms))
                    );
                }
                None => row.push_str(" – | – | – |"),
            }
            let _ = writeln!(md, "{row}");
        }
        reference_table(
            &mut md,
            locks,
            plan,
            SAME,
            "Palisade ÷ the very server operations it sends, through the raw client (Redis: its two scripts; etcd: its two txns), in the same rounds: what Palisade's client code costs.",
        );
        reference_table(
            &mut md,
            locks,
            plan,
            MINIMAL,
            "Palisade ÷ the minimal fenced recipe, through the raw client, in the same rounds (Redis: `SET NX PX` then `INCR` in one script, and a compare-and-delete script; PostgreSQL and SQLite: one `INSERT … ON CONFLICT DO UPDATE … WHERE` free or expired `RETURNING` the next fence, and an `UPDATE` that clears the owner): the least any lock with a fence can send, so what Palisade's guarantees cost beyond the fence itself (resends that find their own grant, exact fences above 2⁵³ or a repair's floor, waiters woken, a holder's open transaction never waited on).",
        );
        for l in locks {
            let Some(p) = &l.perf else { continue };
            if let (Some(soon), Some(late)) = (p.handoff(ACROSS), p.handoff(ACROSS_LATE)) {
                let _ = writeln!(
                    md,
                    "\n{}, the holder in another process: handoff p50 {:.3} ms (p99 {:.3}) when the waiter had waited 5 ms, {:.3} ms (p99 {:.3}) after 300 ms, against {} in the same process. A release wakes only the waiters of its own process; another process's waiter finds it by polling, every 2 ms at first and more slowly the longer it waits (up to every 250 ms).",
                    l.label,
                    soon.p50_ms,
                    soon.p99_ms,
                    late.p50_ms,
                    late.p99_ms,
                    p.handoff(OURS).map_or("–".into(), |h| format!("{:.3} ms", h.p50_ms)),
                );
            }
        }
        if locks.iter().any(|l| l.perf.is_some()) {
            let _ = writeln!(md, "\n![latency](latency.svg)\n\n![throughput](throughput.svg)\n");
        }
        let prims: Vec<(&LockRow, &PrimitivePerf)> =
            locks.iter().filter_map(|l| Some((l, l.perf.as_ref()?.primitives.as_ref()?))).collect();
        if !prims.is_empty() {
            let (lat, hand) = perf::primitive_plans(plan);
            let n = prims.first().map_or(0, |(_, p)| p.count);
            let _ = writeln!(md, "## Coordination primitives\n");
            let _ = writeln!(
                md,
                "Each primitive built on the lock service (`Semaphore` of {n} permits, `RwLock` of {n} readers, `Election`) beside the service's mutex (`try_lock` + release), through the same client in the same interleaved rounds: {} uncontended cycles × {} rounds, zero wait, p50 of all rounds pooled and the min–max of the rounds' p50s. The read-write lock records each entry in an in-memory store here, so its figures are the lock service's: add one write to your store per entry. Handoff: the holder lets go → the waiter already waiting holds, {} per round × {} rounds (the write lock's is writer to writer; a semaphore's waiter waits for any of its slots (`acquire_any`: woken where the service notifies), the others wait as the service's mutex does). Ratios are the primitive ÷ the mutex.\n",
                lat.cycles, lat.rounds, hand.handoffs, hand.rounds
            );
            let kinds = [PERMIT, READ, WRITE, LEADER];
            let mut header = String::from("| lock service | mutex p50 ms |");
            let mut rule = String::from("|---|---|");
            for k in kinds {
                let _ = write!(header, " {k} p50 ms | ratio |");
                rule.push_str("---|---|");
            }
            header.push_str(" handoff p50 ms: mutex | permit | write lock | election |");
            rule.push_str("---|---|---|---|");
            let _ = writeln!(md, "{header}\n{rule}");
            for (l, p) in prims {
                let mutex = p.latency(MUTEX);
                let mut row = format!("| {} | {} |", l.label, mutex.map_or("–".into(), |m| format!("{:.3}", m.p50_ms)));
                for k in kinds {
                    match (p.latency(k), mutex) {
                        (Some(v), Some(m)) => {
                            let _ = write!(
                                row,
                                " {} | {:.2}× |",
                                v.cells().split(" | ").next().unwrap_or("–"),
                                v.ratio_to(m)
                            );
                        }
                        _ => row.push_str(" – | – |"),
                    }
                }
                for k in [MUTEX, PERMIT, WRITE, LEADER] {
                    let _ = write!(row, " {} |", p.handoff(k).map_or("–".into(), |h| format!("{:.3}", h.p50_ms)));
                }
                let _ = writeln!(md, "{row}");
            }
            let _ = writeln!(md);
        }
        let sets: Vec<(&LockRow, &perf::SetPerf)> =
            locks.iter().filter_map(|l| Some((l, &l.perf.as_ref()?.sets))).collect();
        if !sets.is_empty() {
            let most = plan.concurrency.iter().copied().max().unwrap_or(1);
            let _ = writeln!(md, "## Several locks at once\n");
            let _ = writeln!(
                md,
                "Two keys taken as one set (`lock_all`, zero wait, + release of the set) against the same two keys taken and released one by one (`try_lock` twice, two releases), through the same client in the same interleaved rounds: latency of {} sequential cycles × {} rounds, and cycles per second with {most} tasks. \"One request\": the service takes a free set in one request (`MultiAcquire::OneRequest`); \"per key\": one request per key, as two locks.\n",
                plan.cycles, plan.rounds
            );
            let _ = writeln!(
                md,
                "| lock service | set taken in | lock_all p50 ms (rounds) | lock_all p99 ms | two locks p50 ms (rounds) | two locks p99 ms | p50 ratio | lock_all cycles/s | two locks cycles/s | throughput ratio |"
            );
            let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
            for (l, p) in sets {
                let taken = match p.multi_acquire.as_str() {
                    "OneRequest" => "one request",
                    "PerShard" => "one request per shard",
                    _ => "per key",
                };
                let mut row = format!("| {} | {taken} |", l.label);
                match (p.latency(perf::SET), p.latency(perf::TWO_LOCKS)) {
                    (Some(set), Some(two)) => {
                        let _ = write!(row, " {} | {} | {:.2}× |", set.cells(), two.cells(), set.ratio_to(two));
                    }
                    _ => row.push_str(" – | – | – | – | – |"),
                }
                match (p.rate(perf::SET, most), p.rate(perf::TWO_LOCKS, most)) {
                    (Some(set), Some(two)) => {
                        let _ = write!(
                            row,
                            " {:.0} | {:.0} | {:.2}× |",
                            set.per_sec.median,
                            two.per_sec.median,
                            set.ratio_to(two)
                        );
                    }
                    _ => row.push_str(" – | – | – |"),
                }
                let _ = writeln!(md, "{row}");
            }
            let _ = writeln!(md);
        }
        let _ = writeln!(md, "## Stores: the cost of the fence\n");
        let _ = writeln!(
            md,
            "One-record write with a fence (watermark check and write in one atomic step) against the store's plain write of a record of the same size (no watermark), one writer, {} writes per round, the variants taking turns for {} rounds.\n",
            (plan.cycles / 4).max(20),
            plan.rounds
        );
        let _ = writeln!(
            md,
            "| store | fenced p50 ms (rounds) | fenced p99 ms | plain p50 ms (rounds) | plain p99 ms | p50 ratio |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|");
        for s in stores {
            let found = s.perf.as_ref().and_then(|p| {
                let find = |n: &str| p.latency.iter().find(|l| l.name == n);
                Some((find("fenced")?, find("plain")?))
            });
            match found {
                Some((f, u)) => {
                    let _ = writeln!(md, "| {} | {} | {} | {:.2}× |", s.label, f.cells(), u.cells(), f.ratio_to(u));
                }
                None => {
                    let _ = writeln!(md, "| {} | error: {} |||||", s.label, s.error.as_deref().unwrap_or("?"));
                }
            }
        }
        let _ = writeln!(
            md,
            "\nA transfer's write: one batch fencing two resources and writing a record of each (`apply_all`: both fences judged, all or nothing) against the same two records written by two single-resource fenced writes one after the other (what a transfer without the multi-write does, and can leave half applied), interleaved the same way.\n"
        );
        let _ = writeln!(
            md,
            "| store | multi-write p50 ms (rounds) | multi-write p99 ms | two writes p50 ms (rounds) | two writes p99 ms | p50 ratio |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|");
        for s in stores {
            let found = s.perf.as_ref().and_then(|p| {
                let find = |n: &str| p.latency.iter().find(|l| l.name == n);
                Some((find(perf::MULTI_WRITE)?, find(perf::TWO_WRITES)?))
            });
            if let Some((m, t)) = found {
                let _ = writeln!(md, "| {} | {} | {} | {:.2}× |", s.label, m.cells(), t.cells(), m.ratio_to(t));
            }
        }
    }
    if args.runs(Part::Warehouse) {
        let _ = writeln!(md, "\n## The warehouse benchmark\n");
        let _ = writeln!(
            md,
            "The warehouse simulation: {} allocation jobs on {} workers and {} SKUs, a job redelivered when not acknowledged within the TTL (200 ms), every {}th holder paused for 450 ms after reading the stock. Fenced: the write carries the fence and checks its preconditions atomically; unfenced: the incident's naive lock. Each job reads the stock and whether the job is done in one request, then writes: on PostgreSQL and SQLite one transaction on the warehouse's own tables (the fenced single-row `UPDATE inventory … WHERE fence <= $f` and the audit row if the job has none; unfenced, a blind decrement and audit row), on other stores one record batch.\n",
            parameters["warehouse"]["jobs"],
            parameters["warehouse"]["workers"],
            parameters["warehouse"]["skus"],
            parameters["warehouse"]["pause_every"],
        );
        let _ = writeln!(
            md,
            "| lock service × store | mode | jobs | pauses | applied | stale writes refused | duplicates | lost stock updates | jobs/s |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
        for p in pairs {
            for r in &p.warehouse {
                let _ = writeln!(
                    md,
                    "| {} × {} | {} | {} | {} | {} | {} | {} | {} | {:.1} |",
                    p.lock,
                    p.store,
                    r.mode,
                    r.jobs,
                    r.pauses,
                    r.applied,
                    r.fence_rejected,
                    r.duplicates,
                    r.lost_updates,
                    r.jobs_per_sec
                );
            }
            if let Some(e) = &p.warehouse_error {
                let _ = writeln!(md, "| {} × {} | error | {e} |||||||", p.lock, p.store);
            }
            if p.warehouse.len() == 1 && p.warehouse[0].mode == "unfenced" {
                let _ = writeln!(
                    md,
                    "| {} × {} | fenced | not possible: the service issues no fence ||||||| ",
                    p.lock, p.store
                );
            }
        }
        let ratios: Vec<String> = pairs
            .iter()
            .filter_map(|p| {
                let rate = |mode: &str| p.warehouse.iter().find(|r| r.mode == mode).map(|r| r.jobs_per_sec);
                let (f, u) = (rate("fenced")?, rate("unfenced")?);
                (u > 0.0).then(|| format!("{} × {}: {:.2}×", p.lock, p.store, f / u))
            })
            .collect();
        if !ratios.is_empty() {
            let _ = writeln!(md, "\nFenced ÷ unfenced throughput in the same setup: {}.", ratios.join("; "));
        }
        let tenths: Vec<(&Pair, &WarehouseRun)> = pairs
            .iter()
            .flat_map(|p| p.warehouse.iter().map(move |r| (p, r)))
            .filter(|(_, r)| r.tenths_jobs_per_sec.len() == 10)
            .collect();
        if !tenths.is_empty() {
            let _ = writeln!(
                md,
                "\nJobs/s within each tenth of the jobs, in the order they were done: a job that costs more as the run goes on (a server whose history or tables grow) shows as a falling row. Last ÷ first is the last tenth's rate ÷ the first's.\n"
            );
            let _ = writeln!(
                md,
                "| lock service × store | mode | 1st | 2nd | 3rd | 4th | 5th | 6th | 7th | 8th | 9th | 10th | last ÷ first |"
            );
            let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
            for (p, r) in tenths {
                let rates: Vec<String> = r.tenths_jobs_per_sec.iter().map(|v| format!("{v:.0}")).collect();
                let ratio = match (r.tenths_jobs_per_sec.first(), r.tenths_jobs_per_sec.last()) {
                    (Some(&first), Some(&last)) if first > 0.0 => format!("{:.2}", last / first),
                    _ => "–".into(),
                };
                let _ = writeln!(md, "| {} × {} | {} | {} | {ratio} |", p.lock, p.store, r.mode, rates.join(" | "));
            }
        }
    }
    if !memory.is_empty() {
        let _ = writeln!(md, "\n## Server memory\n");
        let _ = writeln!(
            md,
            "The resident set (`VmRSS`) of the processes named with `--watch-memory`, read once a second for the whole run.\n"
        );
        let _ = writeln!(md, "| process | pid | at the start | peak (when) | at the end | samples |");
        let _ = writeln!(md, "|---|---|---|---|---|---|");
        let mib = |kib: u64| format!("{:.0} MiB", kib as f64 / 1024.0);
        for w in memory {
            let end = if w.gone { format!("{} (then gone)", mib(w.end_kib)) } else { mib(w.end_kib) };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} ({} s) | {end} | {} |",
                w.name,
                w.pid,
                mib(w.start_kib),
                mib(w.peak_kib),
                w.peak_at_s,
                w.samples
            );
        }
    }
    md
}

/// A table of Palisade ÷ the variant `reference` (latency, then throughput at each
/// concurrency), for the lock services measured with it; nothing when none was.
fn reference_table(md: &mut String, locks: &[LockRow], plan: &Plan, reference: &str, intro: &str) {
    let rows: Vec<(&LockRow, &LockPerf)> = locks
        .iter()
        .filter_map(|l| Some((l, l.perf.as_ref()?)))
        .filter(|(_, p)| p.latency(reference).is_some())
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(md, "\n{intro}\n");
    let mut header = String::from("| lock service | p50 ratio |");
    let mut rule = String::from("|---|---|");
    for c in &plan.concurrency {
        let _ = write!(header, " {c} task{} |", if *c == 1 { "" } else { "s" });
        rule.push_str("---|");
    }
    let _ = writeln!(md, "{header}\n{rule}");
    for (l, p) in rows {
        let mut row = format!("| {} |", l.label);
        match (p.latency(OURS), p.latency(reference)) {
            (Some(o), Some(s)) => {
                let _ = write!(row, " {:.2}× |", o.ratio_to(s));
            }
            _ => row.push_str(" – |"),
        }
        for &c in &plan.concurrency {
            match (p.rate(OURS, c), p.rate(reference, c)) {
                (Some(o), Some(s)) => {
                    let _ = write!(row, " {:.2}× |", o.ratio_to(s));
                }
                _ => row.push_str(" – |"),
            }
        }
        let _ = writeln!(md, "{row}");
    }
}

/// The command line for the report, every URL without its password (reports get committed).
fn command_line(args: impl Iterator<Item = String>) -> String {
    args.map(|a| if a.contains("://") { shown(&a) } else { a }).collect::<Vec<_>>().join(" ")
}

fn machine() -> serde_json::Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let mem_kb: u64 = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_string();
    let debian = read("/etc/debian_version").trim().to_string();
    let description =
        format!("{cores} cores ({cpu}), {:.0} GiB RAM, Linux {kernel}, Debian {debian}", mem_kb as f64 / 1048576.0);
    json!({ "cores": cores, "cpu": cpu, "mem_kib": mem_kb, "kernel": kernel, "debian": debian, "description": description })
}

/// Today's UTC date, `YYYY-MM-DD`.
fn today() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    palisade::spi::utc_timestamp(secs).chars().take(10).collect()
}

/// The JSON report's former field names for the warehouse benchmark (`seed`, `seed_error`,
/// `parameters.seed`, `parameters.parts.seed`), kept beside the current ones (`warehouse` …)
/// so that scripts reading them go on working. Deprecated (see CHANGELOG.md): removed in 0.2.
fn add_former_names(report: &mut serde_json::Value) {
    let alias = |object: &mut serde_json::Value, current: &str, former: &str| {
        if let Some(map) = object.as_object_mut()
            && let Some(value) = map.get(current).cloned()
        {
            map.insert(former.to_string(), value);
        }
    };
    alias(&mut report["parameters"], "warehouse", "seed");
    alias(&mut report["parameters"]["parts"], "warehouse", "seed");
    if let Some(pairs) = report["pairs"].as_array_mut() {
        for pair in pairs {
            alias(pair, "warehouse", "seed");
            alias(pair, "warehouse_error", "seed_error");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_command_has_no_passwords() {
        let args =
            ["palisade", "compare", "--store", "postgres://app:s3cret@db:5432/app", "--lock", "redis://:pw@r:6379"];
        let line = command_line(args.into_iter().map(String::from));
        assert!(!line.contains("s3cret") && !line.contains("pw@"), "{line}");
        assert!(line.contains("--store postgres://db:5432/app"), "{line}");
    }

    #[test]
    fn dates_and_marks() {
        assert_eq!(today().len(), 10);
        let cell = Cell {
            scenario: "paused",
            ran: true,
            stale_accepted: Some(1),
            duplicates: Some(1),
            proceed_ms: Some(1200.0),
            lost_fired: Some(false),
            safe: Some(false),
            note: String::new(),
        };
        assert_eq!(mark(&cell), "❌ stale 1, dup 1, next in 1200 ms, lost not fired");
        // Safe, but the next holder was blocked: a liveness failure, not a pass.
        let blocked = Cell { safe: Some(true), stale_accepted: Some(0), duplicates: Some(0), proceed_ms: None, ..cell };
        assert_eq!(mark(&blocked), "🟠 stale 0, dup 0, next: blocked, lost not fired");
    }
}
