//! What a torture run writes: the history (JSON lines), a Markdown report, the JSON verdict
//! and a timeline of holds and faults (SVG).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use palisade_history::{Bounds, Call, Event, History, Outcome, Verdict};
use serde_json::{Value, json};

use super::schedule::Step;

/// Everything a report says.
pub struct Summary<'a> {
    /// The command that replays the run's schedule.
    pub replay: String,
    /// The bug planted in the clients' backend, if any.
    pub planted: Option<&'static str>,
    pub lock: String,
    pub store: String,
    pub seed: u64,
    pub duration_s: u64,
    pub bounds: Bounds,
    pub steps: &'a [Step],
    pub history: &'a History,
    pub verdict: &'a Verdict,
}

fn schedule(steps: &[Step]) -> Value {
    Value::Array(steps.iter().map(|s| json!({ "at_ms": s.at_ms, "fault": s.fault.to_string() })).collect())
}

/// The history's first event: where a report's times start.
fn origin(history: &History) -> u64 {
    history.operations.iter().map(|o| o.invoked).chain(history.faults.iter().map(|f| f.began)).min().unwrap_or(0)
}

/// Milliseconds from the history's first event.
fn ms(history: &History, t: u64) -> f64 {
    t.saturating_sub(origin(history)) as f64 / 1e6
}

/// The JSON report (the last line `--json` prints).
pub fn json(s: &Summary<'_>) -> Value {
    let v = s.verdict;
    json!({
        "lock": s.lock,
        "store": s.store,
        "seed": s.seed,
        "replay": s.replay,
        "planted": s.planted,
        "duration_s": s.duration_s,
        "operations": v.operations,
        "faults": s.history.faults.len(),
        "schedule": schedule(s.steps),
        "anomalies": v.anomalies.iter().map(|a| json!({
            "kind": a.kind,
            "resource": a.resource,
            "message": a.message,
            "window_ms": [ms(s.history, a.window.0), ms(s.history, a.window.1)],
            "witnesses": a.witnesses.iter().map(|w| w.describe(origin(s.history))).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "valid": v.valid(),
        "grants": v.grants,
        "writes": { "accepted": v.writes_accepted, "refused": v.writes_refused, "unknown": v.writes_unknown },
        "reads": v.reads,
        "allocations_applied": v.allocations_applied,
        "crashed_processes": s.history.crashed.len(),
        "bounds": s.bounds,
    })
}

/// The run in a few lines, on stderr.
pub fn print(s: &Summary<'_>, out: &Path) {
    let v = s.verdict;
    eprintln!(
        "palisade torture: {} operations ({} grants, {} writes accepted, {} refused, {} unknown, {} reads, {} \
         allocations applied), {} faults",
        v.operations,
        v.grants,
        v.writes_accepted,
        v.writes_refused,
        v.writes_unknown,
        v.reads,
        v.allocations_applied,
        s.history.faults.len()
    );
    if v.valid() {
        eprintln!("palisade torture: no anomaly (seed {}); report in {}", s.seed, out.display());
    } else {
        eprintln!("palisade torture: {} anomal{} (seed {}):", v.anomalies.len(), plural(v.anomalies.len()), s.seed);
        for a in v.anomalies.iter().take(10) {
            eprintln!("  {} on {}: {}", a.kind, a.resource, a.message);
            for w in &a.witnesses {
                eprintln!("    {}", w.describe(origin(s.history)));
            }
        }
        if v.anomalies.len() > 10 {
            eprintln!("  … and {} more in the report", v.anomalies.len() - 10);
        }
        eprintln!("palisade torture: the schedule (ms from the start):");
        for step in s.steps {
            eprintln!("  {:>7}  {}", step.at_ms, step.fault);
        }
        eprintln!("palisade torture: replay with: {}", s.replay);
        eprintln!("palisade torture: report in {}", out.display());
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "y" } else { "ies" }
}

/// Writes history.jsonl, report.md, report.json and timeline.svg into `out`.
pub fn write(out: &Path, s: &Summary<'_>, events: &[Event]) -> Result<(), String> {
    let put = |name: &str, text: String| {
        std::fs::write(out.join(name), text).map_err(|e| format!("{}: {e}", out.join(name).display()))
    };
    let mut lines = String::new();
    for event in events {
        if let Ok(line) = serde_json::to_string(event) {
            lines.push_str(&line);
            lines.push('\n');
        }
    }
    put("history.jsonl", lines)?;
    put("report.json", format!("{:#}\n", json(s)))?;
    put("report.md", markdown(s))?;
    put("timeline.svg", timeline(s))?;
    Ok(())
}

/// The most calls an anomaly's window lists in the report.
const MAX_WINDOW: usize = 40;

fn markdown(s: &Summary<'_>) -> String {
    let v = s.verdict;
    let mut md = String::new();
    let _ = writeln!(md, "# Torture: {} × {}\n", s.lock, s.store);
    let _ = writeln!(
        md,
        "Seed {} · {} s · {} operations · {} faults · **{}**\n",
        s.seed,
        s.duration_s,
        v.operations,
        s.history.faults.len(),
        if v.valid() { "no anomaly".to_string() } else { format!("{} anomalies", v.anomalies.len()) }
    );
    let _ = writeln!(md, "Replay: `{}`\n", s.replay);
    if let Some(bug) = s.planted {
        let what = super::PLANTED_BUGS.iter().find(|(n, _)| *n == bug).map_or("", |(_, w)| *w);
        let _ = writeln!(md, "**Planted bug** `{bug}`: {what}.\n");
    }
    let _ = writeln!(md, "![holds and faults](timeline.svg)\n");
    let _ = writeln!(md, "## Operations\n");
    let _ = writeln!(
        md,
        "| grants | writes accepted | refused | unknown outcome | reads | allocations applied | processes killed |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|");
    let _ = writeln!(
        md,
        "| {} | {} | {} | {} | {} | {} | {} |\n",
        v.grants,
        v.writes_accepted,
        v.writes_refused,
        v.writes_unknown,
        v.reads,
        v.allocations_applied,
        s.history.crashed.len()
    );
    let _ = writeln!(
        md,
        "Writes are the registers' writes and the SKUs' allocations; an allocation that found its job \
         already done counts as refused.\n"
    );
    let _ = writeln!(
        md,
        "Progress bound after the last heal: {} ms; each call's bound plus {} ms.\n",
        s.bounds.progress_ms, s.bounds.allowance_ms
    );
    let _ = writeln!(md, "## Anomalies\n");
    if v.valid() {
        let _ = writeln!(
            md,
            "None: fences in order, no two holders' writes interleaved, no two leases that wrote safe at once, no refusal without a cause, the registers linearizable, no job allocated twice, the audits agreeing with the answers and the stock with the allocations applied, progress after the last heal, every call within its bound.\n"
        );
    }
    for a in &v.anomalies {
        let _ = writeln!(
            md,
            "### {} on {}\n\n{}\n\nWindow {:.1}–{:.1} ms:\n\n```",
            a.kind,
            a.resource,
            a.message,
            ms(s.history, a.window.0),
            ms(s.history, a.window.1)
        );
        for w in &a.witnesses {
            let _ = writeln!(md, "{}", w.describe(origin(s.history)));
        }
        let _ = writeln!(md, "```\n");
        // The history's window itself: every call on the resource that overlaps it, and the
        // faults that did.
        let within: Vec<_> = s
            .history
            .operations
            .iter()
            .filter(|o| o.call.resource() == a.resource)
            .filter(|o| o.invoked <= a.window.1 && o.completed.unwrap_or(u64::MAX) >= a.window.0)
            .collect();
        let faults: Vec<_> = s
            .history
            .faults
            .iter()
            .filter(|f| f.began <= a.window.1 && f.healed.unwrap_or(u64::MAX) >= a.window.0)
            .collect();
        let _ = writeln!(
            md,
            "<details><summary>The window: {} calls on {}, {} faults</summary>\n\n```",
            within.len(),
            a.resource,
            faults.len()
        );
        for f in &faults {
            let _ = writeln!(md, "fault {} [{:.3} ms] {}", f.id, ms(s.history, f.began), f.what);
        }
        for o in within.iter().take(MAX_WINDOW) {
            let _ = writeln!(md, "{}", o.describe(origin(s.history)));
        }
        if within.len() > MAX_WINDOW {
            let _ = writeln!(md, "… {} more in history.jsonl", within.len() - MAX_WINDOW);
        }
        let _ = writeln!(md, "```\n</details>\n");
    }
    let _ = writeln!(md, "## Schedule\n");
    let _ = writeln!(md, "| # | at | fault | began | healed |");
    let _ = writeln!(md, "|---:|---:|---|---:|---:|");
    for (i, step) in s.steps.iter().enumerate() {
        let window = s.history.faults.iter().find(|f| f.id == i as u64);
        let began = window.map_or("–".to_string(), |f| format!("{:.0} ms", ms(s.history, f.began)));
        let healed = window.and_then(|f| f.healed).map_or("–".to_string(), |t| format!("{:.0} ms", ms(s.history, t)));
        let _ = writeln!(md, "| {i} | {} ms | {} | {began} | {healed} |", step.at_ms, step.fault);
    }
    md
}

/// Holds (a bar from grant to release, per client process, coloured by resource, a black line
/// under it to the lease's last `safe_until`; struck through in red where a write or an
/// allocation was refused for its fence) and faults (shaded spans, numbered as in the
/// schedule).
fn timeline(s: &Summary<'_>) -> String {
    let h = s.history;
    let end = ms(h, h.end).max(1.0);
    let processes: Vec<u32> = {
        let mut p: Vec<u32> = h.operations.iter().map(|o| o.process).collect();
        p.sort_unstable();
        p.dedup();
        p
    };
    let (left, row, width) = (60.0, 18.0, 1200.0);
    let height = 40.0 + row * processes.len() as f64;
    let x = |t: f64| left + (width - left - 10.0) * t / end;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="10">"#
    );
    for f in &h.faults {
        let (a, b) = (ms(h, f.began), ms(h, f.healed.unwrap_or(h.end)));
        let _ = write!(
            svg,
            r##"<rect x="{:.1}" y="0" width="{:.1}" height="{height}" fill="#d62728" opacity="0.15"><title>{}</title></rect><text x="{:.1}" y="10" fill="#d62728">{}</text>"##,
            x(a),
            (x(b) - x(a)).max(1.0),
            escape(&f.what),
            x(a),
            f.id
        );
    }
    const COLOURS: [&str; 6] = ["#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b"];
    let mut resources: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, p) in processes.iter().enumerate() {
        let y = 20.0 + row * i as f64;
        let _ = write!(svg, r#"<text x="4" y="{:.1}">p{p}</text>"#, y + 11.0);
        let ops: Vec<_> = h.operations.iter().filter(|o| o.process == *p).collect();
        // The hold: from its grant, on a resource, safe until the last `safe_until` it was told.
        let mut held: Option<(f64, &str, Option<f64>)> = None;
        for op in &ops {
            match (&op.call, &op.outcome) {
                (Call::Acquire { resource, .. }, Some(Outcome::Granted { safe_until, .. })) => {
                    let safe = safe_until.map(|t| ms(h, t));
                    held = Some((ms(h, op.completed.unwrap_or(op.invoked)), resource.as_str(), safe));
                }
                (Call::Extend { .. }, Some(Outcome::Done { safe_until: Some(t) })) => {
                    if let Some((_, _, safe)) = &mut held {
                        *safe = Some(safe.map_or(ms(h, *t), |s| s.max(ms(h, *t))));
                    }
                }
                (Call::Release { .. }, _) => {
                    if let Some((from, resource, safe)) = held.take() {
                        let n = resources.len();
                        let colour = COLOURS[*resources.entry(resource).or_insert(n) % COLOURS.len()];
                        let to = ms(h, op.completed.unwrap_or(h.end));
                        let _ = write!(
                            svg,
                            r#"<rect x="{:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{colour}"><title>{resource}</title></rect>"#,
                            x(from),
                            (x(to) - x(from)).max(1.0),
                            row - 4.0
                        );
                        // The lease's safe_until: a black line under the bar, so that a bar
                        // running past its line is a holder acting after it was told to stop.
                        if let Some(safe) = safe {
                            let _ = write!(
                                svg,
                                r##"<line x1="{:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#000" stroke-width="1.5"><title>{resource}: safe until {safe:.0} ms</title></line>"##,
                                x(from),
                                x(safe.max(from)),
                                y + row - 3.0,
                                y + row - 3.0
                            );
                        }
                    }
                }
                (Call::Write { .. } | Call::Allocate { .. }, Some(Outcome::Stale | Outcome::Duplicate)) => {
                    let t = x(ms(h, op.invoked));
                    let _ = write!(
                        svg,
                        r##"<line x1="{t:.1}" x2="{t:.1}" y1="{y:.1}" y2="{:.1}" stroke="#d62728" stroke-width="2"/>"##,
                        y + row - 4.0
                    );
                }
                _ => {}
            }
        }
    }
    let _ = write!(
        svg,
        r##"<text x="{left}" y="{:.1}">0 s</text><text x="{:.1}" y="{:.1}" text-anchor="end">{:.0} s</text></svg>"##,
        height - 4.0,
        width - 10.0,
        height - 4.0,
        end / 1000.0
    );
    svg
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
