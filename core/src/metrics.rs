//! Metric names and the helpers that record them through the `metrics` facade.
//!
//! Install any `metrics` recorder (Prometheus exporter, StatsD, …) to collect them; with none
//! installed they cost next to nothing.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `palisade_lock_acquire_total` | counter | `backend`, `outcome` (`acquired`, `busy`, `timeout`, `error`) | acquisition attempts |
//! | `palisade_lock_acquire_duration_seconds` | histogram | `backend` | time to a grant (successful acquisitions) |
//! | `palisade_lock_fence_rejected_total` | counter | `store` | writes refused for a stale fence: a holder outlived its lease |
//! | `palisade_lock_lost_total` | counter | `backend` | leases lost before release (deadline, backend report, failed renewal) |
//! | `palisade_lock_renew_failed_total` | counter | `backend` | background renewals that failed (progress-gated, and the timer renewals of a leader and of the primitives' gates) |
//! | `palisade_lock_release_failed_total` | counter | `backend` | releases that failed (`with_lock` returns its work's result all the same: this is where those show) |
//! | `palisade_lock_fence_regression_total` | counter | `backend` | grants below a store's watermark: the service lost its counter |
//!
//! A sustained non-zero rate of `palisade_lock_fence_rejected_total` in steady state means TTLs are too
//! tight or handlers got slower: alert on it, as the incident's write-up advises.

use std::time::Duration;

/// Counter of acquisition attempts, by `backend` and `outcome`.
pub const LOCK_ACQUIRE_TOTAL: &str = "palisade_lock_acquire_total";
/// Histogram of the time to a grant, in seconds, by `backend`.
pub const LOCK_ACQUIRE_DURATION_SECONDS: &str = "palisade_lock_acquire_duration_seconds";
/// Counter of writes a store refused for a stale fence, by `store`.
pub const LOCK_FENCE_REJECTED_TOTAL: &str = "palisade_lock_fence_rejected_total";
/// Counter of leases lost before release, by `backend`.
pub const LOCK_LOST_TOTAL: &str = "palisade_lock_lost_total";
/// Counter of failed background renewals (progress-gated or on a timer), by `backend`.
pub const LOCK_RENEW_FAILED_TOTAL: &str = "palisade_lock_renew_failed_total";

/// Counter of failed releases ([`Lease::release`](crate::Lease::release)), by `backend`.
pub const LOCK_RELEASE_FAILED_TOTAL: &str = "palisade_lock_release_failed_total";

/// Counter of grants found below a store's watermark, by `backend`.
pub const LOCK_FENCE_REGRESSION_TOTAL: &str = "palisade_lock_fence_regression_total";

/// Records a fence regression.
pub fn record_fence_regression(backend: &'static str) {
    metrics::counter!(LOCK_FENCE_REGRESSION_TOTAL, "backend" => backend).increment(1);
}

/// Records one acquisition attempt's outcome (and its latency when it succeeded).
pub fn record_acquire(backend: &'static str, outcome: &'static str, elapsed: Option<Duration>) {
    metrics::counter!(LOCK_ACQUIRE_TOTAL, "backend" => backend, "outcome" => outcome).increment(1);
    if let Some(elapsed) = elapsed {
        metrics::histogram!(LOCK_ACQUIRE_DURATION_SECONDS, "backend" => backend).record(elapsed.as_secs_f64());
    }
}

/// Records a write refused for a stale fence. Stores with native write APIs call this too.
pub fn record_fence_rejected(store: &'static str) {
    metrics::counter!(LOCK_FENCE_REJECTED_TOTAL, "store" => store).increment(1);
}

/// Records a lease lost before release.
pub fn record_lost(backend: &'static str) {
    metrics::counter!(LOCK_LOST_TOTAL, "backend" => backend).increment(1);
}

/// Records a failed release.
pub fn record_release_failed(backend: &'static str) {
    metrics::counter!(LOCK_RELEASE_FAILED_TOTAL, "backend" => backend).increment(1);
}

/// Records a failed renewal.
pub fn record_renew_failed(backend: &'static str) {
    metrics::counter!(LOCK_RENEW_FAILED_TOTAL, "backend" => backend).increment(1);
}
