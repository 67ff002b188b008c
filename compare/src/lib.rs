//! The measurement code behind `palisade compare` and the benchmarks in `integration/benches`:
//! one implementation, so the figures of both come from the same code path.
//!
//! - [`measure`]: warm-up, interleaved rounds, medians with min–max; latency, throughput at a
//!   concurrency, contended handoff.
//! - [`baseline`]: the variants compared: Palisade's paths and each backend's raw operation
//!   through the same client crate.

pub mod baseline;
pub mod measure;
