//! Waiting for something while holding a gate lock: the read-write lock's writer drains the
//! readers behind its gate, a queued semaphore's first waiter polls the permits behind its
//! place in the queue. One implementation of keeping the gate alive meanwhile.
//!
//! The gate is kept alive by elapsed time, not by the work behind it: a renewal on a timer
//! (every third of the gate's TTL) runs for as long as the gate is [`Held`], however many
//! operations the holder does and however long each takes. Extending only between timed-out
//! waits lost the gate whenever a series of quick operations (128 reader slots taken and
//! released at 5 ms each) outlasted the TTL without one of them timing out.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{ErrorKind, Result};
use crate::renewal::Renewal;
use crate::{Fenced, Lease, LockService};

/// A gate lock kept alive while its holder works behind it.
pub(crate) struct Held<'g, S: LockService<Fencing = Fenced> + ?Sized> {
    gate: &'g Lease<S>,
    ttl: Duration,
    renewal: Renewal,
}

impl<'g, S: LockService<Fencing = Fenced> + ?Sized> Held<'g, S> {
    /// Starts keeping `gate` (taken for `ttl`) alive until [`confirm`](Held::confirm) or drop.
    pub(crate) fn new(gate: &'g Lease<S>, ttl: Duration) -> Self {
        Held { gate, ttl, renewal: gate.keep_alive() }
    }

    /// Runs `attempt` (an acquisition that waits at most the time it is given) in chunks of a
    /// third of the gate's TTL, until it succeeds or `give_up` passes (the attempt's
    /// [`ErrorKind::Timeout`]); `Ok(None)` when the gate is found lost between chunks. The
    /// chunks only bound how late a loss is noticed: the gate's renewal does not wait for them.
    pub(crate) async fn wait_for<T, F, Fut>(&self, give_up: Instant, mut attempt: F) -> Result<Option<T>>
    where
        F: FnMut(Duration) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let chunk = (self.ttl / 3).max(Duration::from_millis(1));
        loop {
            if self.gate.is_lost() {
                return Ok(None);
            }
            let left = give_up.saturating_duration_since(Instant::now());
            match attempt(left.min(chunk)).await {
                Ok(taken) => return Ok(Some(taken)),
                Err(e) if e.kind() == ErrorKind::Timeout && left > chunk => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Stops the renewal (waiting for an extension in flight), leaving the gate held.
    pub(crate) async fn stop(self) {
        self.renewal.stop().await;
    }

    /// Stops the renewal and extends the gate once more, as the confirmation that it is still
    /// ours (refused once another holder took it); `Ok(false)` when it is not.
    pub(crate) async fn confirm(self) -> Result<bool> {
        let Held { gate, ttl, renewal } = self;
        renewal.stop().await;
        keep(gate, ttl).await
    }
}

/// Extends the gate; `Ok(false)` when it is no longer ours.
async fn keep<S: LockService<Fencing = Fenced> + ?Sized>(gate: &Lease<S>, ttl: Duration) -> Result<bool> {
    match gate.extend(ttl).await {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.kind(), ErrorKind::NotHolder | ErrorKind::LeaseLost) => Ok(false),
        Err(e) => Err(e),
    }
}
