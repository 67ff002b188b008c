//! Every use-case example on the embedded default (in-process locks, in-memory SQLite), as a
//! real process: each must show the guarantee it is about.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

mod common;

#[path = "common/use_cases.rs"]
mod use_cases;

#[test]
fn nightly_aggregation() {
    use_cases::nightly_aggregation(None, &[]);
}

#[test]
fn cache_refresh() {
    use_cases::cache_refresh(None, &[]);
}

/// The shortest TTL the flag takes: the stale wave must still come while the refresher's lease
/// holds (it came 100 ms after the freeze whatever the TTL, and at 100 ms or less a reader of
/// that wave refreshed v2 itself, so v3 was never fetched and the example reported a failure).
#[test]
fn cache_refresh_with_the_shortest_ttl() {
    use_cases::cache_refresh(None, &["--ttl-ms", "50"]);
}

#[test]
fn invoice_numbering() {
    use_cases::invoice_numbering(None, &[]);
}

#[test]
fn invoice_numbering_without_a_takeover() {
    use_cases::invoice_numbering_without_a_takeover(None, &[]);
}

#[test]
fn outbox_relay() {
    use_cases::outbox_relay(None, &[]);
}

#[test]
fn rate_limit() {
    use_cases::rate_limit(None, &[]);
}

#[test]
fn price_catalogue() {
    use_cases::price_catalogue(None, &[]);
}

#[test]
fn metrics() {
    use_cases::metrics(None, &[]);
}

/// The examples with tables of their own name the stores they run on, instead of failing
/// somewhere inside: exit 2 (bad configuration), one line on stderr, nothing on stdout's JSON.
#[test]
fn table_examples_refuse_a_store_without_tables() {
    for name in ["invoice-numbering", "outbox-relay"] {
        let out = common::example(name).args(["--store", "memory://"]).output().expect("spawn example");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert!(stderr.contains("sqlite: or postgres://"), "{name}: {stderr}");
        assert!(out.stdout.is_empty(), "{name} printed a summary for a run it did not make");
    }
}
