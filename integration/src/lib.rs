//! Palisade's tests and benchmarks against real servers, and its examples run as processes.
//!
//! This crate has no code of its own: its `tests/` and `benches/` need the raw server clients
//! (for baselines and fault injection) that the `palisade` package must not make every example
//! compile. `scripts/test` starts the servers and runs them.
