//! Progress-gated renewal: extend a lease only while its holder proves it is moving.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::error::ErrorKind;
use crate::lease::LeaseShared;
use crate::{LockService, metrics};

/// A progress counter the handler bumps as it works (rows processed, chunks done).
///
/// Cheap to clone; all clones share one counter.
#[derive(Debug, Clone, Default)]
pub struct Progress(Arc<AtomicU64>);

impl Progress {
    /// A counter at zero.
    pub fn new() -> Self {
        Progress::default()
    }

    /// Records one unit of progress.
    pub fn tick(&self) {
        self.advance(1);
    }

    /// Records `n` units of progress.
    pub fn advance(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// The current count.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A running renewal task from [`Lease::renew_on_progress`](crate::Lease::renew_on_progress).
///
/// Dropping it stops the task.
#[derive(Debug)]
pub struct Renewal {
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Renewal {
    /// Starts the renewal task: every `every` (at most a third of the TTL last granted) it
    /// extends the lease if `progress` moved since the last check, or always when `progress`
    /// is `None` (a renewal on a timer, kept only for the primitives' own locks, which their
    /// runtime holds while it runs: a frozen process stops the task with it).
    pub(crate) fn start<S: LockService + ?Sized>(
        shared: Arc<LeaseShared<S>>,
        progress: Option<Progress>,
        every: Duration,
    ) -> Self {
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(shared, progress, every, stop.clone()));
        Renewal { stop, task: Some(task) }
    }

    /// Stops renewing and waits for the task to finish. The lease itself is untouched.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// Whether the task has ended (stopped, lease released or lost).
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(|t| t.is_finished())
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn run<S: LockService + ?Sized>(
    shared: Arc<LeaseShared<S>>,
    progress: Option<Progress>,
    every: Duration,
    stop: CancellationToken,
) {
    let backend = shared.service.backend();
    let mut seen = progress.as_ref().map(Progress::get);
    loop {
        // Within a third of what was last granted: a backend that capped an extension must not
        // see the next one only after the capped TTL ran out.
        let period = every.min(shared.ttl().get() / 3).max(Duration::from_millis(1));
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = shared.done().cancelled() => return,
            _ = shared.lost_token().cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        let now = progress.as_ref().map(Progress::get);
        if now.is_some() && now == seen {
            // A hung handler must lose the lease: that is the whole point of gating on progress.
            info!(backend, key = %shared.grant.key(), "no progress since the last check; not renewing");
            continue;
        }
        seen = now;
        match shared.extend(shared.requested_ttl()).await {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::LeaseLost => return,
            Err(e) => {
                error!(backend, key = %shared.grant.key(), error = %e.report(), "lease renewal failed");
                metrics::record_renew_failed(backend);
                shared.mark_lost("renewal failed");
                return;
            }
        }
    }
}
