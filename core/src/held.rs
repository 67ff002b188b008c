//! Local deadlines for backends whose locks live in a session (etcd's lease, ZooKeeper's
//! session).
//!
//! Such a server keeps a lock as long as the client's session lives, not for the grant's TTL.
//! The [`LockService`](crate::LockService) contract still says a holder that neither extends
//! nor releases loses the lock after its TTL; [`HeldGrants`] is how a session backend keeps
//! it: every grant gets a local deadline, moved by extensions, and when it passes the grant's
//! lost signal fires and the backend's `give_up` deletes the lock on the server.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

/// What a backend runs when a grant's local deadline passes: delete the lock on the server.
pub type GiveUp = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// The grants a session-based client holds, by a backend-chosen id (the lock's node or key).
#[derive(Debug, Default)]
pub struct HeldGrants {
    held: Mutex<HashMap<String, Held>>,
}

#[derive(Debug)]
struct Held {
    fence: u64,
    deadline: watch::Sender<Instant>,
    lost: CancellationToken,
}

impl HeldGrants {
    /// A new, empty registry.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Records a grant until `deadline`. When the deadline passes without
    /// [`extend`](Self::extend), `lost` fires and `give_up` runs; when `session_lost` fires
    /// first, `lost` fires and nothing else (the server already dropped the lock).
    pub fn hold(
        self: &Arc<Self>,
        id: String,
        fence: u64,
        deadline: Instant,
        lost: CancellationToken,
        session_lost: CancellationToken,
        give_up: GiveUp,
    ) {
        let (tx, rx) = watch::channel(deadline);
        self.lock().insert(id.clone(), Held { fence, deadline: tx, lost: lost.clone() });
        tokio::spawn(watch_grant(Arc::downgrade(self), id, fence, rx, lost, session_lost, give_up));
    }

    /// Whether the grant is held: recorded with this fence, not lost, deadline ahead.
    pub fn holds(&self, id: &str, fence: u64) -> bool {
        self.lock()
            .get(id)
            .is_some_and(|h| h.fence == fence && !h.lost.is_cancelled() && *h.deadline.borrow() > Instant::now())
    }

    /// Moves a held grant's deadline; false if it is no longer held (given up meanwhile).
    pub fn extend(&self, id: &str, fence: u64, deadline: Instant) -> bool {
        match self.lock().get(id) {
            Some(h) if h.fence == fence && !h.lost.is_cancelled() => {
                h.deadline.send_replace(deadline);
                true
            }
            _ => false,
        }
    }

    /// Forgets a grant (released); true if it was held with this fence.
    pub fn forget(&self, id: &str, fence: u64) -> bool {
        let mut held = self.lock();
        if held.get(id).is_some_and(|h| h.fence == fence) {
            held.remove(id);
            true
        } else {
            false
        }
    }

    /// Fires every grant's lost signal and forgets them all (the client is closing).
    pub fn lose_all(&self) {
        for (_, held) in self.lock().drain() {
            held.lost.cancel();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

async fn watch_grant(
    grants: Weak<HeldGrants>,
    id: String,
    fence: u64,
    mut deadline: watch::Receiver<Instant>,
    lost: CancellationToken,
    session_lost: CancellationToken,
    give_up: GiveUp,
) {
    loop {
        let at = *deadline.borrow_and_update();
        tokio::select! {
            changed = deadline.changed() => {
                if changed.is_err() {
                    return; // released
                }
            }
            () = session_lost.cancelled() => {
                lost.cancel();
                if let Some(grants) = grants.upgrade() {
                    grants.forget(&id, fence);
                }
                return;
            }
            () = sleep_until(at) => {
                let Some(grants) = grants.upgrade() else { return };
                {
                    // Decide under the lock, so an extension that just landed wins.
                    let mut held = grants.lock();
                    match held.get(&id) {
                        Some(h) if h.fence == fence && *h.deadline.borrow() <= Instant::now() => {
                            held.remove(&id);
                        }
                        Some(h) if h.fence == fence => continue,
                        _ => return,
                    }
                }
                lost.cancel();
                tracing::debug!(%id, "grant expired locally; giving the lock up");
                give_up().await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    fn flag() -> (Arc<AtomicBool>, GiveUp) {
        let gave_up = Arc::new(AtomicBool::new(false));
        let g = Arc::clone(&gave_up);
        (gave_up, Box::new(move || Box::pin(async move { g.store(true, Ordering::SeqCst) })))
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_grant_is_given_up_at_its_deadline_and_an_extended_one_is_not() {
        let grants = HeldGrants::new();
        let (lost, session) = (CancellationToken::new(), CancellationToken::new());
        let (gave_up, give_up) = flag();
        let start = Instant::now();
        grants.hold("a".into(), 7, start + Duration::from_millis(100), lost.clone(), session.clone(), give_up);
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(grants.holds("a", 7) && !grants.holds("a", 8));
        assert!(grants.extend("a", 7, start + Duration::from_millis(200)));
        tokio::time::sleep(Duration::from_millis(80)).await; // past the first deadline
        assert!(!lost.is_cancelled() && !gave_up.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_millis(80)).await; // past the second
        assert!(lost.is_cancelled() && gave_up.load(Ordering::SeqCst));
        assert!(!grants.holds("a", 7) && !grants.extend("a", 7, Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn released_grants_are_quiet_and_a_lost_session_loses_them_all() {
        let grants = HeldGrants::new();
        let session = CancellationToken::new();
        let (released_lost, lost) = (CancellationToken::new(), CancellationToken::new());
        let (gave_up, give_up) = flag();
        let far = Instant::now() + Duration::from_secs(60);
        grants.hold(
            "r".into(),
            1,
            Instant::now() + Duration::from_millis(10),
            released_lost.clone(),
            session.clone(),
            give_up,
        );
        assert!(grants.forget("r", 1) && !grants.forget("r", 1));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!released_lost.is_cancelled() && !gave_up.load(Ordering::SeqCst));
        let (_, give_up) = flag();
        grants.hold("s".into(), 2, far, lost.clone(), session.clone(), give_up);
        session.cancel();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(lost.is_cancelled() && !grants.holds("s", 2));
    }
}
