//! Orchestration and output: the Markdown report, the JSON, the SVG charts.

use std::fmt::Write as _;
use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::json;

use crate::CompareArgs;
use crate::faults::{self, Cell};
use crate::local::Local;
use crate::perf::{self, LockPerf, Sizes, StorePerf};
use crate::seed::{self, SeedRun};
use crate::target::{Backend, LockTarget, StoreTarget, shown};

/// The session TTL / timeout (s) of the locally started etcd and ZooKeeper: how long a frozen or
/// killed holder's session outlives it.
const LOCAL_SESSION_S: u64 = 2;

#[derive(Debug, Serialize)]
struct Pair {
    lock: String,
    store: String,
    faults: Vec<Cell>,
    seed: Vec<SeedRun>,
    seed_error: Option<String>,
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
    if let Ok(style) = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}") {
        bar.set_style(style);
    }
    bar
}

pub async fn compare(args: CompareArgs) -> Result<ExitCode, String> {
    let started = std::time::Instant::now();
    let sizes = Sizes::new(args.quick);
    let seed_jobs = args.seed_jobs.unwrap_or(if args.quick { 200 } else { 2000 });
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
    let pairs_n = (locks.len() * stores.len()) as u64;
    let bar = progress(locks.len() as u64 + stores.len() as u64 + pairs_n * 6);

    let mut lock_rows = Vec::new();
    for (target, _) in &locks {
        bar.set_message(format!("performance: {}", target.label));
        let row = match palisade::connect_any_lock(&target.url).await {
            Ok(svc) => {
                let fenced = svc.is_fenced();
                match perf::lock_perf(&svc, target.backend, &target.url, sizes).await {
                    Ok(p) => LockRow {
                        label: target.label.clone(),
                        backend: target.backend,
                        url: shown(&target.url),
                        fenced,
                        raw_op: target.backend.raw_op(),
                        perf: Some(p),
                        error: None,
                    },
                    Err(e) => LockRow {
                        label: target.label.clone(),
                        backend: target.backend,
                        url: shown(&target.url),
                        fenced,
                        raw_op: target.backend.raw_op(),
                        perf: None,
                        error: Some(e.to_string()),
                    },
                }
            }
            Err(e) => LockRow {
                label: target.label.clone(),
                backend: target.backend,
                url: shown(&target.url),
                fenced: false,
                raw_op: target.backend.raw_op(),
                perf: None,
                error: Some(e.to_string()),
            },
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
                let p = perf::store_perf(&store, sizes).await;
                store_rows.push(StoreRow {
                    label: target.label.clone(),
                    url: shown(&target.url),
                    perf: p.as_ref().ok().cloned(),
                    error: p.err().map(|e| e.to_string()),
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
            let Some(store) = store else {
                bar.inc(6);
                continue;
            };
            let name = format!("{} × {}", lock.label, target.label);
            let mut cells = Vec::new();
            // The worker is another process: it must reach the same lock service and store.
            let in_process = lock.backend == Backend::Memory
                || target.url.starts_with("memory:")
                || target.url.starts_with("sqlite::memory:");
            let not_shared = "not run: an in-process service or store cannot be shared with a worker process";
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
            bar.set_message(format!("{name}: lock server restarted"));
            let owned = if *is_local { local.as_mut() } else { None };
            cells.push(faults::restart(owned, lock.backend, &lock.url, store, args.ttl()).await);
            bar.inc(1);
            bar.set_message(format!("{name}: cluster leader killed"));
            cells.push(if *is_local {
                faults::leader_kill(lock.backend, store, LOCAL_SESSION_S, args.quick).await
            } else {
                Cell {
                    scenario: "leader_kill",
                    ran: false,
                    stale_accepted: None,
                    duplicates: None,
                    proceed_ms: None,
                    lost_fired: None,
                    safe: None,
                    note: "not run: the cluster was not started by --local".into(),
                }
            });
            bar.inc(1);
            let mut seed_runs = Vec::new();
            let mut seed_error = None;
            // An unfenced service has one mode only.
            let modes: &[bool] = if lock.backend == Backend::Redlock { &[true] } else { &[false, true] };
            for &unfenced in modes {
                bar.set_message(format!("{name}: seed benchmark ({})", if unfenced { "unfenced" } else { "fenced" }));
                match seed::run(&lock.url, &target.url, seed_jobs, unfenced).await {
                    Ok(r) => seed_runs.push(r),
                    Err(e) => seed_error = Some(e),
                }
                bar.inc(1);
            }
            pairs.push(Pair {
                lock: lock.label.clone(),
                store: target.label.clone(),
                faults: cells,
                seed: seed_runs,
                seed_error,
            });
        }
    }
    bar.finish_and_clear();
    drop(local);

    let parameters = json!({
        "quick": args.quick,
        "fault_ttl_ms": args.ttl_ms,
        "local_session_s": LOCAL_SESSION_S,
        "sizes": sizes,
        "concurrency": perf::CONCURRENCY,
        "seed": { "jobs": seed_jobs, "workers": 8, "skus": 8, "ttl_ms": 200, "pause_every": 50, "pause_ms": 450 },
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "server_data_dir": palisade_conformance::servers::server_root().display().to_string(),
        "sqlite_dir": std::env::temp_dir().display().to_string(),
    });
    let machine = machine();
    let date = today();
    let report = json!({
        "date": date,
        "machine": machine,
        "parameters": parameters,
        "elapsed_s": started.elapsed().as_secs(),
        "locks": lock_rows,
        "stores": store_rows,
        "pairs": pairs,
    });
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let write = |name: &str, text: String| {
        std::fs::write(args.out.join(name), text).map_err(|e| format!("{}: {e}", args.out.join(name).display()))
    };
    write("report.json", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?)?;
    write("latency.svg", latency_svg(&lock_rows))?;
    write("throughput.svg", throughput_svg(&lock_rows))?;
    write(
        "report.md",
        markdown(&date, &machine, &parameters, started.elapsed().as_secs(), &lock_rows, &store_rows, &pairs),
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

fn ratio(a: f64, b: Option<f64>) -> String {
    match b {
        Some(b) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "–".into(),
    }
}

#[allow(clippy::too_many_arguments)]
fn markdown(
    date: &str,
    machine: &serde_json::Value,
    parameters: &serde_json::Value,
    elapsed_s: u64,
    locks: &[LockRow],
    stores: &[StoreRow],
    pairs: &[Pair],
) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# Palisade architecture comparison\n");
    let _ = writeln!(
        md,
        "Generated by `palisade compare` on {date} in {elapsed_s} s. Every figure below comes from this run.\n"
    );
    let _ = writeln!(md, "- Machine: {}", machine["description"].as_str().unwrap_or("?"));
    let _ = writeln!(md, "- Parameters (repeat the run with the same ones): `{parameters}`\n");
    let _ = writeln!(md, "## Fault matrix\n");
    let _ = writeln!(
        md,
        "Each cell: ✅ no stale write accepted, no duplicate, and another holder proceeded / 🟠 safe, but no other holder could proceed (a liveness failure) / ❌ a stale write or a duplicate; `stale` = writes the store accepted from a holder after a later holder's write; `dup` = effects applied twice (audit records; for a killed leader, holds of one lock that overlapped); `next in` = from the fault until another holder had the lock; `lost` = whether the frozen holder's lost signal had fired by the time it wrote.\n"
    );
    let _ = writeln!(
        md,
        "| lock service × store | holder paused past TTL (SIGSTOP) | holder killed (SIGKILL) | lock server restarted | cluster leader killed |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|");
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
    let _ = writeln!(md, "\n## Lock services: latency and throughput\n");
    let _ = writeln!(
        md,
        "Uncontended `try_acquire` + `release` on 16 recurring keys, one task; the raw operation is the backend's own, on the same server, in the same run. Throughput: acquire + release cycles per second with 1 / 16 / 64 concurrent tasks on keys of their own. Handoff: a waiter already waiting when the holder releases.\n"
    );
    let _ = writeln!(
        md,
        "| lock service | fence | p50 ms | p99 ms | raw op | raw p50 ms | p50 ratio | 1 task /s | 16 tasks /s | 64 tasks /s | 1 task vs raw | handoff p50 ms | handoff p99 ms |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for l in locks {
        match &l.perf {
            Some(p) => {
                let t = |n: u64| p.throughput.iter().find(|(c, _)| *c == n).map_or(0.0, |(_, v)| *v);
                let _ = writeln!(
                    md,
                    "| {} | {} | {:.3} | {:.3} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {} | {:.3} | {:.3} |",
                    l.label,
                    if l.fenced { "yes" } else { "**no**" },
                    p.p50_ms,
                    p.p99_ms,
                    l.raw_op,
                    p.raw_p50_ms.map_or("–".into(), |v| format!("{v:.3}")),
                    ratio(p.p50_ms, p.raw_p50_ms),
                    t(1),
                    t(16),
                    t(64),
                    ratio(t(1), p.raw_throughput),
                    p.handoff_p50_ms,
                    p.handoff_p99_ms
                );
            }
            None => {
                let _ = writeln!(md, "| {} | | error: {} |||||||||||", l.label, l.error.as_deref().unwrap_or("?"));
            }
        }
    }
    let _ = writeln!(md, "\n![latency](latency.svg) ![throughput](throughput.svg)\n");
    let _ = writeln!(md, "## Stores: the cost of the fence\n");
    let _ = writeln!(
        md,
        "One-record write with a fence (watermark check and write in one atomic step) against the store's plain write of the same record (no watermark), sequential.\n"
    );
    let _ = writeln!(md, "| store | fenced p50 ms | fenced p99 ms | plain p50 ms | plain p99 ms | p50 ratio |");
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    for s in stores {
        match &s.perf {
            Some(p) => {
                let _ = writeln!(
                    md,
                    "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {} |",
                    s.label,
                    p.fenced_p50_ms,
                    p.fenced_p99_ms,
                    p.plain_p50_ms,
                    p.plain_p99_ms,
                    ratio(p.fenced_p50_ms, Some(p.plain_p50_ms))
                );
            }
            None => {
                let _ = writeln!(md, "| {} | error: {} |||||", s.label, s.error.as_deref().unwrap_or("?"));
            }
        }
    }
    let _ = writeln!(md, "\n## The seed's benchmark\n");
    let _ = writeln!(
        md,
        "The warehouse simulation: allocation jobs on 8 workers and 8 SKUs, a job redelivered when not acknowledged within the TTL (200 ms), every 50th holder paused for 450 ms after reading the stock. Fenced: the write carries the fence and checks its preconditions atomically; unfenced: the seed's naive lock.\n"
    );
    let _ = writeln!(
        md,
        "| lock service × store | mode | jobs | pauses | applied | stale writes refused | duplicates | lost stock updates | jobs/s |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    for p in pairs {
        for r in &p.seed {
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
        if let Some(e) = &p.seed_error {
            let _ = writeln!(md, "| {} × {} | error | {e} |||||||", p.lock, p.store);
        }
        if p.seed.len() == 1 && p.seed[0].mode == "unfenced" {
            let _ = writeln!(
                md,
                "| {} × {} | fenced | not possible: the service issues no fence ||||||| ",
                p.lock, p.store
            );
        }
    }
    md
}

const COLOURS: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"];

fn svg_frame(title: &str, x_label: &str, y_label: &str) -> String {
    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="640" height="400" font-family="sans-serif" font-size="12">
<rect width="640" height="400" fill="white"/>
<text x="320" y="20" text-anchor="middle" font-size="14">{title}</text>
<line x1="60" y1="340" x2="600" y2="340" stroke="black"/><line x1="60" y1="40" x2="60" y2="340" stroke="black"/>
<text x="330" y="380" text-anchor="middle">{x_label}</text>
<text x="15" y="190" transform="rotate(-90 15 190)" text-anchor="middle">{y_label}</text>
"##
    )
}

fn legend(svg: &mut String, i: usize, label: &str) {
    let y = 50 + 16 * i;
    let _ = writeln!(
        svg,
        r#"<rect x="440" y="{}" width="10" height="10" fill="{}"/><text x="455" y="{}">{}</text>"#,
        y,
        COLOURS[i % COLOURS.len()],
        y + 9,
        escape(label)
    );
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The latency distribution (CDF) of uncontended acquire + release per lock service.
fn latency_svg(locks: &[LockRow]) -> String {
    let mut svg = svg_frame("acquire + release latency, CDF", "milliseconds", "fraction of cycles");
    let max = locks
        .iter()
        .filter_map(|l| l.perf.as_ref())
        .filter_map(|p| p.latencies_ms.get(p.latencies_ms.len().saturating_sub(1) * 99 / 100).copied())
        .fold(0.0f64, f64::max)
        .max(0.001);
    for tick in 0..=4 {
        let v = max * f64::from(tick) / 4.0;
        let x = 60.0 + 540.0 * f64::from(tick) / 4.0;
        let _ = writeln!(svg, r#"<text x="{x:.0}" y="355" text-anchor="middle">{v:.2}</text>"#);
    }
    for (i, l) in locks.iter().enumerate() {
        let Some(p) = &l.perf else { continue };
        let n = p.latencies_ms.len().max(1) as f64;
        let points: Vec<String> = p
            .latencies_ms
            .iter()
            .enumerate()
            .filter(|(_, v)| **v <= max)
            .map(|(k, v)| format!("{:.1},{:.1}", 60.0 + 540.0 * v / max, 340.0 - 300.0 * (k as f64 + 1.0) / n))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            COLOURS[i % COLOURS.len()],
            points.join(" ")
        );
        legend(&mut svg, i, &l.label);
    }
    svg.push_str("</svg>\n");
    svg
}

/// Throughput against concurrency per lock service.
fn throughput_svg(locks: &[LockRow]) -> String {
    let mut svg = svg_frame("acquire + release throughput", "concurrent tasks", "cycles per second");
    let max = locks
        .iter()
        .filter_map(|l| l.perf.as_ref())
        .flat_map(|p| p.throughput.iter().map(|(_, v)| *v))
        .fold(1.0f64, f64::max);
    let xs = perf::CONCURRENCY;
    for (k, c) in xs.iter().enumerate() {
        let x = 60.0 + 540.0 * k as f64 / (xs.len() - 1) as f64;
        let _ = writeln!(svg, r#"<text x="{x:.0}" y="355" text-anchor="middle">{c}</text>"#);
    }
    for tick in 0..=4 {
        let v = max * f64::from(tick) / 4.0;
        let y = 340.0 - 300.0 * f64::from(tick) / 4.0;
        let _ = writeln!(svg, r#"<text x="56" y="{y:.0}" text-anchor="end">{v:.0}</text>"#);
    }
    for (i, l) in locks.iter().enumerate() {
        let Some(p) = &l.perf else { continue };
        let points: Vec<String> = p
            .throughput
            .iter()
            .enumerate()
            .map(|(k, (_, v))| {
                format!("{:.1},{:.1}", 60.0 + 540.0 * k as f64 / (xs.len() - 1) as f64, 340.0 - 300.0 * v / max)
            })
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            COLOURS[i % COLOURS.len()],
            points.join(" ")
        );
        legend(&mut svg, i, &l.label);
    }
    svg.push_str("</svg>\n");
    svg
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

/// Today's UTC date, `YYYY-MM-DD` (civil from days, no date library needed).
fn today() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let z = i64::try_from(secs / 86_400).unwrap_or(0) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(ratio(2.0, Some(1.0)), "2.00×");
        assert_eq!(ratio(2.0, None), "–");
    }
}
