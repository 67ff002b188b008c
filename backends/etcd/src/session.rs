//! The client's session: one etcd lease, kept alive in the background, that every lock key
//! of this client is attached to.
//!
//! The server deletes the keys when the lease runs out, so a process that stops (crash,
//! SIGSTOP, partition) loses its locks `session_ttl` after its last successful keep-alive.
//! Locally the session knows a lower bound on the server's deadline: the time the last
//! acknowledged keep-alive was *sent*, plus the TTL the server confirmed.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use palisade_core::Result;

pub(crate) struct Session {
    pub(crate) id: i64,
    ttl: Duration,
    deadline: Mutex<Instant>,
    /// Fires when the session is known dead (keep-alive refused, or its deadline passed
    /// without an acknowledged keep-alive). Every grant of the session follows it.
    pub(crate) lost: CancellationToken,
}

impl Session {
    /// The latest instant at which the server may still consider the lease alive, as far as
    /// this process can prove: last acknowledged keep-alive's send time + confirmed TTL.
    pub(crate) fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the session is usable for a new grant or an extension at `now`.
    pub(crate) fn alive_at(&self, now: Instant) -> bool {
        !self.lost.is_cancelled() && now < self.deadline()
    }

    fn renewed(&self, sent_at: Instant, ttl_secs: i64) {
        let ttl = Duration::from_secs(u64::try_from(ttl_secs).unwrap_or(0)).min(self.ttl);
        let mut deadline = self.deadline.lock().unwrap_or_else(PoisonError::into_inner);
        *deadline = (*deadline).max(sent_at + ttl);
    }

    /// Grants a lease and starts keeping it alive until `stop` fires or the lease is lost.
    pub(crate) async fn start(
        client: &Client,
        ttl: Duration,
        request_timeout: Duration,
        stop: CancellationToken,
    ) -> Result<Arc<Session>> {
        let ttl_secs = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        // Counted from before the first attempt: the lease may start on any of them.
        let sent_at = Instant::now();
        let granted = crate::errors::with_failover(request_timeout, "granting the session lease", false, false, || {
            let mut lease = client.lease_client();
            async move { lease.grant(ttl_secs, None).await }
        })
        .await?;
        let session =
            Arc::new(Session { id: granted.id(), ttl, deadline: Mutex::new(sent_at), lost: CancellationToken::new() });
        session.renewed(sent_at, granted.ttl());
        debug!(lease = session.id, ttl_s = granted.ttl(), "etcd session started");
        tokio::spawn(keep_alive(client.clone(), Arc::clone(&session), request_timeout, stop));
        Ok(session)
    }
}

/// Renews the lease every third of its TTL. A failed round is retried on a fresh stream
/// (the member we talked to may be gone); once the local deadline passes without an
/// acknowledgement the session is declared lost, because the server may have expired it.
async fn keep_alive(client: Client, session: Arc<Session>, request_timeout: Duration, stop: CancellationToken) {
    let every = (session.ttl / 3).max(Duration::from_millis(100));
    let mut stream: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
    let mut delay = every;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = session.lost.cancelled() => return,
            () = sleep(delay) => {}
        }
        delay = every;
        if stream.is_none() {
            let mut lease = client.lease_client();
            match timeout(request_timeout.min(every), lease.keep_alive(session.id)).await {
                Ok(Ok(s)) => stream = Some(s),
                Ok(Err(e)) => {
                    warn!(lease = session.id, error = %e, "etcd keep-alive stream failed to open");
                    delay = every / 4;
                }
                Err(_) => {
                    warn!(lease = session.id, "etcd keep-alive stream timed out opening");
                    delay = every / 4;
                }
            }
        }
        if let Some((keeper, responses)) = stream.as_mut() {
            let sent_at = Instant::now();
            let round = async {
                keeper.keep_alive().await?;
                responses.message().await
            };
            // Never wait past the session deadline for an answer about the session.
            let patience = request_timeout.min(session.deadline().saturating_duration_since(sent_at)).max(every);
            match timeout(patience, round).await {
                Ok(Ok(Some(resp))) if resp.ttl() > 0 => session.renewed(sent_at, resp.ttl()),
                Ok(Ok(Some(_))) => {
                    error!(lease = session.id, "etcd session lease expired on the server; its locks are lost");
                    session.lost.cancel();
                    return;
                }
                Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
                    warn!(lease = session.id, "etcd keep-alive round failed; retrying on a fresh stream");
                    stream = None;
                    delay = every / 4;
                }
            }
        }
        if Instant::now() >= session.deadline() {
            error!(lease = session.id, "etcd session deadline passed without a keep-alive; its locks are lost");
            session.lost.cancel();
            return;
        }
    }
}
