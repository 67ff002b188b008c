//! A lock service with one deliberate flaw at a time: the broken twins that show a checker can
//! fail. The conformance suite's own tests (`conformance/tests/broken.rs`) run its scenarios
//! against each flaw and expect the scenarios that check the broken guarantee to fail; the
//! torture's tests (`compare/tests/torture.rs`) serve some of them to client processes through
//! the conformance crate's relay and expect the history checker to find them.
//!
//! A test fixture, never published: the state lives in this process, and a panic in it is a
//! test's failure.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use palisade_core::spi::async_trait;
use palisade_core::{
    Capabilities, Error, ErrorKind, Fence, FenceSource, Fenced, Grant, LockService, OwnerToken, ResourceKey, Result,
    Ttl,
};
use tokio::time::Instant;

/// The one flaw a [`BrokenLock`] has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockFlaw {
    /// None: the control, which passes every lock scenario.
    None,
    /// Grants whether or not the key is held.
    NoExclusion,
    /// Release removes whoever holds the lock, whatever the token.
    ReleaseIgnoresToken,
    /// Grants never expire.
    NeverExpires,
    /// A takeover after expiry reuses the expired holder's fence.
    FenceNotIncreasedAfterExpiry,
    /// Extend says yes and does nothing.
    ExtendDoesNothing,
    /// `acquire` gives up at once (and does not validate its wait).
    AcquireNeverWaits,
    /// Fences jump by two while the service declares them gap-free.
    GapsDeclaredGapFree,
    /// Extend of an expired grant nobody took over brings it back to life.
    ExtendResurrects,
    /// A waiter sleeps until the holder's expiry instead of being woken by the release.
    WakesOnlyAtExpiry,
    /// A waiter reserves the lock while it waits and only a normal return gives the
    /// reservation back: a cancelled waiter blocks everyone.
    CancelLeaksReservation,
    /// Declares FIFO waiting, but the newest waiter goes first.
    NewestWaiterFirstDeclaredFifo,
    /// Correct, but its test factory declares a 5 s expiry margin nothing explains.
    UnexplainedMargin,
    /// Extend re-creates a lock that is gone (`SET … PX` instead of a compare), so a holder
    /// whose lock was deleted is never told (bug class 13).
    ExtendRecreates,
    /// Grants report twice the TTL the service enforces (a unit or rounding bug on the way
    /// back, bug class 8): the holder's deadline outlives the server's.
    OverstatesTtl,
    /// The fence counter lives in the lock record, so a release deletes it (bug classes 2, 3).
    CounterDeletedWithLock,
    /// Every grant gets a keep-alive task that nothing stops (bug class 14).
    RenewsForever,
    /// Expiry is judged by the asking client's clock (bug class 9).
    ClientClockExpiry,
    /// Declares fences that survive a restart, but keeps its counters in memory (bug class 4).
    CounterNotDurable,
    /// Cannot move its counter (`advance_fence` unsupported, as etcd's revisions once were):
    /// after a data loss every grant is below the store's watermark until an operator acts.
    CannotAdvance,
    /// Recovers from a wipe by itself (a counter that is missing starts past every fence ever
    /// issued, as one seeded from the clock would) but cannot move a counter that exists: a
    /// restore from an older snapshot leaves a key whose counter went back below the store's
    /// watermark until an operator acts.
    RepairsOnlyAMissingCounter,
    /// A zero-wait `acquire` that finds the lock held answers `Timeout` but leaves its ticket in
    /// the queue (a queue node created and not deleted when giving up at once).
    ZeroWaitStaysQueued,
    /// A repair (`advance_fence`) while the lock is held moves the holder's own fence, so the
    /// holder can no longer extend or release it (the SQL services' repair once did this).
    RepairStrandsTheHolder,
    /// A non-zero wait lasts until the lock is granted, whatever its bound (a statement that
    /// waits on a row lock inside the server).
    WaitIgnoresItsBound,
    /// The fence counter carries an expiry of two lock TTLs, so it is forgotten once the key
    /// has been free that long (unlike `CounterDeletedWithLock`, it survives the release).
    CounterForgottenWhenIdle,
    /// The owner token belongs to the client (a connection id, a host name), not to the grant:
    /// a client's repeated release of its old grant frees its new one.
    TokenPerClient,
    /// Extend of a lock that is gone answers success with what the key has left (nothing: the
    /// minimum TTL), as a `PEXPIRE` + `PTTL` script with no compare would: the holder hears of
    /// the loss from its own deadline only.
    ExtendAnswersWhatIsLeft,
    /// A grant made for an `acquire` whose future is dropped before the reply reaches the caller
    /// is kept alive for good, as a session keep-alive keeps every grant made in the session.
    CancelledGrantKeptAlive,
    /// A zero wait (`try_acquire`, `acquire` with no wait) on a held lock waits for the lock to
    /// come free, up to a lock timeout of seconds, instead of answering at once (a statement
    /// that waits on the holder's row lock).
    ZeroWaitBlocks,
    /// Declares native waiting, but its waiters poll with backoff (2 ms doubling to 250 ms),
    /// as the trait's default `acquire` does.
    NativeDeclaredPolls,
    /// Declares native waiting and wakes `acquire`'s waiters, but leaves `acquire_any` to the
    /// trait's default, which polls: a semaphore's waiters are not woken.
    NativeDeclaredAnyPolls,
    /// Declares one request per set (`MultiAcquire::OneRequest`), but its client sends
    /// `try_acquire_all` one key at a time.
    SetPerKeyDeclaredOneRequest,
    /// `try_acquire_all` takes the keys in order and, at a held one, answers `Held` but
    /// keeps the members it took before it (no rollback).
    SetKeepsTakenMembers,
    /// The read-only view (`InspectLocks`) shows the last grant made, released or not: a view
    /// that reads who was granted the lock, not who holds it.
    ViewKeepsTheLastHolder,
    /// The test factory gives no read-only view (the `view` hook every certification requires).
    NoView,
}

/// How long a `ZeroWaitBlocks` zero wait may block: its lock timeout.
const ROW_LOCK_TIMEOUT: Duration = Duration::from_millis(1500);

/// The way back of an `acquire`'s reply, during which `CancelledGrantKeptAlive` can lose it.
const REPLY_TRIP: Duration = Duration::from_millis(3);

/// One key's state on the "server".
#[derive(Debug, Default, Clone)]
pub struct Slot {
    /// Who holds the key, and until when.
    pub holder: Option<(OwnerToken, Instant)>,
    /// The last fence issued for the key (the counter).
    pub last_fence: u64,
    /// Tickets of the waiters in `acquire`, in arrival order.
    pub waiters: Vec<u64>,
    /// The last ticket given to a waiter.
    pub next_ticket: u64,
    /// The holder's own fence was moved by a repair (`RepairStrandsTheHolder`).
    pub stranded: bool,
    /// When the last holder released the key (`CounterForgottenWhenIdle`).
    pub released_at: Option<Instant>,
    /// The TTL of the last grant (`CounterForgottenWhenIdle`).
    pub last_ttl: Duration,
    /// The token of the last grant made, released or not (`ViewKeepsTheLastHolder`).
    pub last_granted: Option<OwnerToken>,
}

/// The "server's" state: every key's slot, shared by the clients of one service.
pub type Slots = Arc<Mutex<HashMap<ResourceKey, Slot>>>;

/// A lock service with one flaw at a time, its state in this process ("the server"); serve it to
/// other processes with `palisade_conformance::relay::Relay`.
#[derive(Debug)]
pub struct BrokenLock {
    /// The flaw.
    pub flaw: LockFlaw,
    /// The "server's" state, shared by every client of one factory.
    pub slots: Slots,
    /// The copy of `slots` the last `Restart::Snapshot` took.
    pub saved: Arc<Mutex<Option<HashMap<ResourceKey, Slot>>>>,
    /// How far this client's clock runs ahead (what a flawed service reads).
    pub clock_ahead: Duration,
    /// This client's own token (what `TokenPerClient` grants with).
    pub client_token: OwnerToken,
}

#[async_trait]
impl LockService for BrokenLock {
    type Fencing = Fenced;

    fn backend(&self) -> &'static str {
        "broken"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fence_source: FenceSource::Counter,
            fences_survive_release: true,
            fences_survive_restart: true,
            gap_free: true,
            waiting: match self.flaw {
                LockFlaw::NewestWaiterFirstDeclaredFifo => palisade_core::Waiting::NativeFifo,
                LockFlaw::NativeDeclaredPolls | LockFlaw::NativeDeclaredAnyPolls => palisade_core::Waiting::Native,
                _ => palisade_core::Waiting::Polling,
            },
            multi_acquire: palisade_core::MultiAcquire::OneRequest,
            ..Capabilities::default()
        }
    }

    async fn try_acquire_all(&self, keys: &[ResourceKey], ttl: Ttl) -> Result<palisade_core::AllOrNone<Grant<Fenced>>> {
        if self.flaw != LockFlaw::SetKeepsTakenMembers {
            return palisade_core::spi::try_acquire_each(self, keys, ttl).await;
        }
        let mut taken = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            match self.try_acquire(key, ttl).await? {
                Some(grant) => taken.push(grant),
                None => return Ok(palisade_core::AllOrNone::Held(i)),
            }
        }
        Ok(palisade_core::AllOrNone::Granted(taken))
    }

    async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Fenced>>> {
        if self.flaw == LockFlaw::ZeroWaitBlocks {
            let give_up = Instant::now() + ROW_LOCK_TIMEOUT;
            while Instant::now() < give_up
                && self
                    .slots
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(key)
                    .and_then(|s| s.holder)
                    .is_some_and(|(_, e)| e > Instant::now())
            {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        self.attempt(key, ttl, None)
    }

    async fn acquire(&self, key: &ResourceKey, ttl: Ttl, wait: Duration) -> Result<Grant<Fenced>> {
        if self.flaw == LockFlaw::ZeroWaitBlocks && wait.is_zero() {
            return self
                .try_acquire(key, ttl)
                .await?
                .ok_or_else(|| palisade_core::spi::timeout_error("broken", key, wait));
        }
        if self.flaw == LockFlaw::NativeDeclaredPolls {
            let backoff = palisade_core::spi::Backoff::new();
            let attempt = || self.try_acquire(key, ttl);
            return palisade_core::spi::poll_acquire("broken", key, wait, backoff, false, attempt).await;
        }
        if self.flaw == LockFlaw::AcquireNeverWaits {
            return self
                .try_acquire(key, ttl)
                .await?
                .ok_or_else(|| palisade_core::spi::timeout_error("broken", key, wait));
        }
        palisade_core::spi::validate_wait(wait)?;
        let wait = if self.flaw == LockFlaw::WaitIgnoresItsBound && !wait.is_zero() { Duration::MAX / 4 } else { wait };
        let give_up = Instant::now() + wait;
        let ticket = {
            let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
            let slot = slots.entry(key.clone()).or_default();
            slot.next_ticket += 1;
            slot.waiters.push(slot.next_ticket);
            slot.next_ticket
        };
        // Correct implementations leave the queue however the wait ends, drop included.
        let leave =
            Leave { lock: self, key: key.clone(), ticket, armed: self.flaw != LockFlaw::CancelLeaksReservation };
        let result = loop {
            if let Some(g) = self.attempt(key, ttl, Some(ticket))? {
                break Ok(g);
            }
            let now = Instant::now();
            if now >= give_up {
                if self.flaw == LockFlaw::ZeroWaitStaysQueued && wait.is_zero() {
                    let mut leave = leave;
                    leave.armed = false;
                    return Err(palisade_core::spi::timeout_error("broken", key, wait));
                }
                break Err(palisade_core::spi::timeout_error("broken", key, wait));
            }
            let mut nap = Duration::from_millis(2);
            if self.flaw == LockFlaw::WakesOnlyAtExpiry
                && let Some((_, expires)) =
                    self.slots.lock().unwrap_or_else(PoisonError::into_inner).get(key).and_then(|s| s.holder)
            {
                nap = nap.max(expires.saturating_duration_since(now));
            }
            tokio::time::sleep(nap.min(give_up - now)).await;
        };
        leave.now();
        if self.flaw == LockFlaw::CancelledGrantKeptAlive
            && let Ok(g) = &result
        {
            let orphan =
                Orphan { slots: Arc::clone(&self.slots), key: key.clone(), token: g.token(), ttl, armed: true };
            tokio::time::sleep(REPLY_TRIP).await;
            orphan.delivered();
        }
        result
    }

    async fn extend(&self, grant: &Grant<Fenced>, ttl: Ttl) -> Result<Ttl> {
        let now = Instant::now();
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        if self.flaw == LockFlaw::ExtendAnswersWhatIsLeft && slots.get(grant.key()).is_none_or(|s| s.holder.is_none()) {
            return Ttl::new(Ttl::MIN);
        }
        if self.flaw == LockFlaw::ExtendRecreates
            && let Some(slot) = slots.get_mut(grant.key())
            && slot.holder.is_none()
        {
            slot.holder = Some((grant.token(), now + ttl.get()));
            return Ok(ttl);
        }
        if slots.get(grant.key()).is_some_and(|s| s.stranded) {
            return Err(Error::new(ErrorKind::NotHolder, "broken", "the row's fence is not the grant's"));
        }
        match slots.get_mut(grant.key()).and_then(|s| s.holder.as_mut()) {
            Some((token, expires))
                if *token == grant.token() && (*expires > now || self.flaw == LockFlaw::ExtendResurrects) =>
            {
                if self.flaw != LockFlaw::ExtendDoesNothing {
                    *expires = now + ttl.get();
                }
                Ok(ttl)
            }
            _ => Err(Error::new(ErrorKind::NotHolder, "broken", "not held")),
        }
    }

    async fn advance_fence(&self, key: &ResourceKey, floor: Fence) -> Result<()> {
        if matches!(self.flaw, LockFlaw::CannotAdvance | LockFlaw::RepairsOnlyAMissingCounter) {
            return Err(Error::new(ErrorKind::Unsupported, "broken", "the counter cannot be moved"));
        }
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = slots.entry(key.clone()).or_default();
        slot.last_fence = slot.last_fence.max(floor.get());
        slot.stranded = self.flaw == LockFlaw::RepairStrandsTheHolder && slot.holder.is_some();
        Ok(())
    }

    async fn release(&self, grant: &Grant<Fenced>) -> Result<()> {
        let now = Instant::now();
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(slot) = slots.get_mut(grant.key()) else {
            return Err(Error::new(ErrorKind::NotHolder, "broken", "not held"));
        };
        let ours = slot.holder.is_some_and(|(t, e)| t == grant.token() && e > now) && !slot.stranded;
        if ours || (self.flaw == LockFlaw::ReleaseIgnoresToken && slot.holder.is_some()) {
            slot.holder = None;
            slot.released_at = Some(now);
            if self.flaw == LockFlaw::CounterDeletedWithLock {
                slots.remove(grant.key());
            }
            Ok(())
        } else {
            Err(Error::new(ErrorKind::NotHolder, "broken", "not held"))
        }
    }
}

/// Keeps `token`'s grant of `key` alive until somebody else holds the key.
async fn renew_forever(slots: Slots, key: ResourceKey, token: OwnerToken, ttl: Ttl) {
    loop {
        tokio::time::sleep(ttl.get() / 3).await;
        let mut slots = slots.lock().unwrap_or_else(PoisonError::into_inner);
        match slots.get_mut(&key).and_then(|s| s.holder.as_mut()) {
            Some((t, expires)) if *t == token => *expires = Instant::now() + ttl.get(),
            _ => return,
        }
    }
}

/// A grant on its way back to the caller of `acquire` (`CancelledGrantKeptAlive`): dropped
/// before delivery, the session keeps it alive.
struct Orphan {
    slots: Slots,
    key: ResourceKey,
    token: OwnerToken,
    ttl: Ttl,
    armed: bool,
}

impl Orphan {
    fn delivered(mut self) {
        self.armed = false;
    }
}

impl Drop for Orphan {
    fn drop(&mut self) {
        if self.armed
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(renew_forever(Arc::clone(&self.slots), self.key.clone(), self.token, self.ttl));
        }
    }
}

/// Takes a waiter's ticket out of the queue when its `acquire` ends or is dropped.
struct Leave<'a> {
    lock: &'a BrokenLock,
    key: ResourceKey,
    ticket: u64,
    armed: bool,
}

impl Leave<'_> {
    fn now(mut self) {
        self.remove();
        self.armed = false;
    }
    fn remove(&self) {
        if let Some(slot) = self.lock.slots.lock().unwrap_or_else(PoisonError::into_inner).get_mut(&self.key) {
            slot.waiters.retain(|t| *t != self.ticket);
        }
    }
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.remove();
        }
    }
}

impl BrokenLock {
    /// One attempt; `ticket`: the caller is a waiter in `acquire`. Waiters go in arrival order
    /// (or newest first, for that flaw), and a plain `try_acquire` defers to waiters.
    fn attempt(&self, key: &ResourceKey, ttl: Ttl, ticket: Option<u64>) -> Result<Option<Grant<Fenced>>> {
        let now = Instant::now();
        let judged = if self.flaw == LockFlaw::ClientClockExpiry { now + self.clock_ahead } else { now };
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = slots.entry(key.clone()).or_default();
        let held = slot.holder.is_some_and(|(_, expires)| expires > judged);
        if held && self.flaw != LockFlaw::NoExclusion {
            return Ok(None);
        }
        let next = if self.flaw == LockFlaw::NewestWaiterFirstDeclaredFifo {
            slot.waiters.iter().max()
        } else {
            slot.waiters.first()
        };
        if next.is_some_and(|n| Some(*n) != ticket) && self.flaw != LockFlaw::NoExclusion {
            return Ok(None);
        }
        let expired_takeover = slot.holder.is_some() && !held;
        if self.flaw == LockFlaw::CounterForgottenWhenIdle {
            let free_since = match slot.holder {
                Some((_, expires)) => Some(expires),
                None => slot.released_at,
            };
            if free_since.is_some_and(|t| t + slot.last_ttl * 2 <= now) {
                slot.last_fence = 0;
            }
        }
        slot.last_ttl = ttl.get();
        if self.flaw == LockFlaw::RepairsOnlyAMissingCounter && slot.last_fence == 0 {
            // Microseconds since 1970: past every fence an earlier counter issued.
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            slot.last_fence = u64::try_from(now.as_micros()).unwrap_or(u64::MAX / 4);
        }
        slot.last_fence += match self.flaw {
            LockFlaw::FenceNotIncreasedAfterExpiry if expired_takeover => 0,
            LockFlaw::GapsDeclaredGapFree => 2,
            _ => 1,
        };
        let token = if self.flaw == LockFlaw::TokenPerClient { self.client_token } else { OwnerToken::generate()? };
        let expires =
            if self.flaw == LockFlaw::NeverExpires { now + Duration::from_secs(3600) } else { now + ttl.get() };
        slot.holder = Some((token, expires));
        slot.last_granted = Some(token);
        slot.stranded = false;
        if self.flaw == LockFlaw::RenewsForever {
            tokio::spawn(renew_forever(Arc::clone(&self.slots), key.clone(), token, ttl));
        }
        let told = if self.flaw == LockFlaw::OverstatesTtl { Ttl::new(ttl.get() * 2)? } else { ttl };
        Ok(Some(Grant::new(key.clone(), token, Fence::new(slot.last_fence), told, now)))
    }
}

impl BrokenLock {
    /// A service with `flaw` (`LockFlaw::None`: a correct one) and a state of its own.
    pub fn new(flaw: LockFlaw) -> Result<BrokenLock> {
        Ok(BrokenLock {
            flaw,
            slots: Slots::default(),
            saved: Arc::default(),
            clock_ahead: Duration::ZERO,
            client_token: OwnerToken::generate()?,
        })
    }

    /// Another client of the same "server", with its own token and a clock `ahead`.
    pub fn sibling(&self, ahead: Duration) -> Result<BrokenLock> {
        Ok(BrokenLock {
            flaw: self.flaw,
            slots: Arc::clone(&self.slots),
            saved: Arc::clone(&self.saved),
            clock_ahead: ahead,
            client_token: OwnerToken::generate()?,
        })
    }
}

/// The view `palisade inspect` would read: the slot's live holder (its fence is the counter's
/// unless a repair moved the counter under it), or with `ViewKeepsTheLastHolder` the last
/// grant made.
#[async_trait]
impl palisade_core::InspectLocks for BrokenLock {
    fn backend(&self) -> &'static str {
        "broken"
    }

    async fn resources(&self, prefix: &str) -> Result<palisade_core::Listing<ResourceKey>> {
        let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let names: Vec<String> = slots.keys().map(ToString::to_string).filter(|n| n.starts_with(prefix)).collect();
        Ok(palisade_core::Listing::of_names(names.iter().map(String::as_str)))
    }

    async fn lock_view(&self, key: &ResourceKey) -> Result<palisade_core::LockView> {
        let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let view = palisade_core::LockView::free(key.clone());
        let Some(slot) = slots.get(key) else { return Ok(view) };
        let view = view.with_counter(Some(Fence::new(slot.last_fence)));
        let now = Instant::now();
        let holder = match (self.flaw, slot.holder) {
            (LockFlaw::ViewKeepsTheLastHolder, _) => slot.last_granted.map(|t| (t, None)),
            (_, Some((token, expires))) if expires > now => Some((token, Some(expires - now))),
            _ => None,
        };
        Ok(match holder {
            Some((token, left)) => {
                let fence = (!slot.stranded).then(|| Fence::new(slot.last_fence));
                view.held_by(palisade_core::HolderView::new(palisade_core::GrantId::of(&token), fence, left))
            }
            None => view,
        })
    }
}
