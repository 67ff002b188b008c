//! Waiting for something while holding a gate lock: the read-write lock's writer drains the
//! readers behind its gate, a queued semaphore's first waiter polls the permits behind its
//! place in the queue. One implementation of keeping the gate alive meanwhile.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{ErrorKind, Result};
use crate::{Fenced, Lease, LockService};

/// Runs `attempt` (an acquisition that waits at most the time it is given) in chunks of a
/// third of the gate's TTL, extending the gate between chunks, until it succeeds or `give_up`
/// passes (the attempt's [`ErrorKind::Timeout`]); `Ok(None)` when the gate was lost.
pub(crate) async fn while_holding<S, T, F, Fut>(
    gate: &Lease<S>,
    ttl: Duration,
    give_up: Instant,
    mut attempt: F,
) -> Result<Option<T>>
where
    S: LockService<Fencing = Fenced> + ?Sized,
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let chunk = (ttl / 3).max(Duration::from_millis(1));
    loop {
        let left = give_up.saturating_duration_since(Instant::now());
        match attempt(left.min(chunk)).await {
            Ok(taken) => return Ok(Some(taken)),
            Err(e) if e.kind() == ErrorKind::Timeout && left > chunk => {}
            Err(e) => return Err(e),
        }
        if !keep(gate, ttl).await? {
            return Ok(None);
        }
    }
}

/// Extends the gate; `Ok(false)` when it is no longer ours.
pub(crate) async fn keep<S: LockService<Fencing = Fenced> + ?Sized>(gate: &Lease<S>, ttl: Duration) -> Result<bool> {
    match gate.extend(ttl).await {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.kind(), ErrorKind::NotHolder | ErrorKind::LeaseLost) => Ok(false),
        Err(e) => Err(e),
    }
}
