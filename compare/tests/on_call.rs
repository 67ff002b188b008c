//! The on-call examples (`docs/on-call/`: Prometheus alerting rules and a Grafana dashboard)
//! name only the metrics Palisade exports, in the form the Prometheus recorder gives them, and
//! cover every one of them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::collections::BTreeSet;
use std::path::PathBuf;

use palisade::metrics;

/// Every metric Palisade records.
const EXPORTED: [&str; 7] = [
    metrics::LOCK_ACQUIRE_TOTAL,
    metrics::LOCK_ACQUIRE_DURATION_SECONDS,
    metrics::LOCK_FENCE_REJECTED_TOTAL,
    metrics::LOCK_LOST_TOTAL,
    metrics::LOCK_RENEW_FAILED_TOTAL,
    metrics::LOCK_RELEASE_FAILED_TOTAL,
    metrics::LOCK_FENCE_REGRESSION_TOTAL,
];

fn read(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/on-call").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The `palisade_…` names a text uses.
fn names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("palisade_") {
        let tail = &rest[at..];
        let end = tail.find(|c: char| !(c.is_ascii_lowercase() || c == '_')).unwrap_or(tail.len());
        out.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// A name the Prometheus recorder exports: a metric, or a summary's `_sum` or `_count`.
fn exported(name: &str) -> Option<&'static str> {
    EXPORTED.iter().copied().find(|m| name == *m || name.strip_prefix(m).is_some_and(|s| s == "_sum" || s == "_count"))
}

fn covers_every_metric(file: &str, text: &str) {
    let used = names(text);
    for name in &used {
        assert!(exported(name).is_some(), "{file} names {name}, which Palisade does not export");
    }
    let covered: BTreeSet<&str> = used.iter().filter_map(|n| exported(n)).collect();
    for metric in EXPORTED {
        assert!(covered.contains(metric), "{file} leaves out {metric}");
    }
}

#[test]
fn the_alerting_rules_name_only_exported_metrics_and_every_one() {
    covers_every_metric("prometheus-alerts.yml", &read("prometheus-alerts.yml"));
}

#[test]
fn the_dashboard_is_grafana_json_over_every_metric() {
    let text = read("grafana-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(!panels.is_empty());
    for panel in panels {
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{panel}");
        for target in targets {
            assert!(target["expr"].as_str().is_some_and(|e| e.contains("palisade_")), "{target}");
        }
    }
    covers_every_metric("grafana-dashboard.json", &text);
}
