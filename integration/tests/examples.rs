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

#[test]
fn invoice_numbering() {
    use_cases::invoice_numbering(None, &[]);
}

#[test]
fn outbox_relay() {
    use_cases::outbox_relay(None, &[]);
}

#[test]
fn metrics() {
    use_cases::metrics(None, &[]);
}
