//! Measurement shared by the benchmarks.

use std::future::Future;
use std::time::{Duration, Instant};

/// Runs `tasks` copies of `task` at once for `window` and returns their cycles per second
/// together. `task(t, until)` gets its index and the instant to stop at, and returns how many
/// cycles it completed.
pub async fn cycles_per_second<F, Fut>(tasks: usize, window: Duration, task: F) -> f64
where
    F: Fn(usize, Instant) -> Fut,
    Fut: Future<Output = u64> + Send + 'static,
{
    let start = Instant::now();
    let until = start + window;
    let handles: Vec<_> = (0..tasks).map(|t| tokio::spawn(task(t, until))).collect();
    let mut total = 0;
    for h in handles {
        total += h.await.expect("a benchmark task panicked");
    }
    total as f64 / start.elapsed().as_secs_f64()
}
