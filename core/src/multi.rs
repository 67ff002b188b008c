//! Several locks held as one: [`MultiLease`], from
//! [`LockServiceExt::lock_all`](crate::LockServiceExt::lock_all).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, ErrorKind, Result};
use crate::{AllOrNone, Fence, Fenced, GrantFence, Lease, LockOptions, LockService, ResourceKey};

/// Several locks taken as one by [`LockServiceExt::lock_all`](crate::LockServiceExt::lock_all):
/// every member's [`Lease`], in canonical key order, with one lost signal.
///
/// - **Canonical order.** The keys are taken in their sorted order (duplicates once), whatever
///   order the caller gave: two callers whose sets overlap take their common keys in the same
///   order, so neither can hold one while waiting for the other's (no deadlock).
/// - **All or nothing.** `lock_all` returns every lock or none: a member it could not take
///   within the one wait (held, an error) releases the members already taken before it
///   returns the error.
/// - **One lost signal.** [`lost`](Self::lost) fires when **any** member's lease is lost: the
///   set no longer protects all its resources. Each member keeps its own fence; a fenced
///   write carries them all ([`fences`](Self::fences)):
///   [`FencedStoreExt::write_all`](crate::FencedStoreExt::write_all) applies one batch only if
///   every member's fence passes.
/// - Dropping it without [`release`](Self::release) releases every member as a dropped
///   [`Lease`] does: best effort, in the background.
pub struct MultiLease<S: LockService + ?Sized> {
    leases: Vec<Lease<S>>,
    lost: CancellationToken,
    /// Fires on release or drop: stops the watchers of the members' lost signals.
    done: CancellationToken,
    watching: AtomicBool,
}

impl<S: LockService + ?Sized> MultiLease<S> {
    /// The members' leases, in canonical (sorted) key order.
    pub fn leases(&self) -> &[Lease<S>] {
        &self.leases
    }

    /// The member lease of `key`, if `key` is in the set.
    pub fn lease(&self, key: &ResourceKey) -> Option<&Lease<S>> {
        self.leases.iter().find(|lease| lease.key() == key)
    }

    /// The keys, in canonical order.
    pub fn keys(&self) -> impl Iterator<Item = &ResourceKey> {
        self.leases.iter().map(Lease::key)
    }

    /// The earliest of the members' local deadlines: the set is safe until its first member
    /// may expire (a hint, like [`Lease::safe_until`]; the fences are the safety).
    pub fn safe_until(&self) -> Instant {
        self.leases.iter().map(Lease::safe_until).min().unwrap_or_else(Instant::now)
    }

    /// Whether any member's lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled() || self.leases.iter().any(Lease::is_lost)
    }

    /// Resolves when any member's lease is lost (never after a release).
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let lost = self.lost_token();
        async move { lost.cancelled().await }
    }

    /// A token cancelled when any member's lease is lost (never after a release).
    pub fn lost_token(&self) -> CancellationToken {
        if !self.watching.swap(true, Ordering::AcqRel) {
            // One small task per member, each gone when its member is lost or the set released.
            for lease in &self.leases {
                let (member, all, done) = (lease.lost(), self.lost.clone(), self.done.clone());
                tokio::spawn(async move {
                    tokio::select! {
                        () = member => all.cancel(),
                        () = done.cancelled() => {}
                    }
                });
            }
        }
        self.lost.clone()
    }

    /// Extends every member to `ttl` (from now). Stops at the first member that fails and
    /// returns its error (the members after it keep their earlier deadlines): a member lost
    /// already is [`ErrorKind::LeaseLost`] or [`ErrorKind::NotHolder`], and the set's
    /// [`lost`](Self::lost) fires.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        for lease in &self.leases {
            lease.extend(ttl).await?;
        }
        Ok(())
    }

    /// Releases every member (all of them are tried, in reverse order) and returns the first
    /// error, if any. A member that failed to release is freed at its TTL at the latest.
    pub async fn release(mut self) -> Result<()> {
        self.done.cancel();
        let mut first = None;
        while let Some(lease) = self.leases.pop() {
            if let Err(e) = lease.release().await {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl<S: LockService<Fencing = Fenced> + ?Sized> MultiLease<S> {
    /// Each member's resource and the fence (with its grant) a fenced write presents for it,
    /// in canonical order.
    pub fn fences(&self) -> Vec<(ResourceKey, GrantFence)> {
        self.leases.iter().map(|lease| (lease.key().clone(), lease.grant_fence())).collect()
    }

    /// The fence of `key`'s member, if `key` is in the set.
    pub fn fence(&self, key: &ResourceKey) -> Option<Fence> {
        self.lease(key).map(Lease::fence)
    }
}

impl<S: LockService + ?Sized> Drop for MultiLease<S> {
    fn drop(&mut self) {
        // The members release themselves on drop; the watchers stop here.
        self.done.cancel();
    }
}

impl<S: LockService + ?Sized> fmt::Debug for MultiLease<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLease").field("keys", &self.keys().collect::<Vec<_>>()).finish_non_exhaustive()
    }
}

/// The canonical order of a key set: sorted, each key once. An empty set is
/// [`ErrorKind::InvalidArgument`].
pub(crate) fn canonical(backend: &'static str, keys: &[ResourceKey]) -> Result<Vec<ResourceKey>> {
    if keys.is_empty() {
        return Err(Error::new(ErrorKind::InvalidArgument, backend, "lock_all needs at least one key"));
    }
    crate::service::set_within_limit(backend, "lock_all", keys.len())?;
    let mut keys = keys.to_vec();
    keys.sort();
    keys.dedup();
    Ok(keys)
}

/// `lock_all`: the free keys taken at once (`take_free`: the service's
/// [`try_acquire_all`](LockService::try_acquire_all), one request where the service can), and
/// for each key found held, the keys below it taken, then it waited for (`lock_one`) and the
/// rest taken at once again: keys are only ever waited for in canonical order, while holding
/// only keys below them, so overlapping sets never deadlock. One wait for the whole set; on any
/// failure the taken members are released before the error returns. A zero wait is one
/// `take_free`.
pub(crate) async fn lock_all<S, F, Fut, T, TFut>(
    service: &Arc<S>,
    keys: &[ResourceKey],
    options: LockOptions,
    lock_one: F,
    take_free: T,
) -> Result<MultiLease<S>>
where
    S: LockService + ?Sized,
    F: Fn(ResourceKey, LockOptions) -> Fut,
    Fut: Future<Output = Result<Lease<S>>>,
    T: Fn(Vec<ResourceKey>) -> TFut,
    TFut: Future<Output = Result<AllOrNone<Lease<S>>>>,
{
    let keys = canonical(service.backend(), keys)?;
    crate::spi::validate_wait(options.wait)?;
    let deadline = Instant::now() + options.wait;
    let mut leases: Vec<Lease<S>> = Vec::with_capacity(keys.len());
    let mut rest: &[ResourceKey] = &keys;
    while !rest.is_empty() {
        let Some(tried) = keep_alive_while(&leases, options.ttl, take_free(rest.to_vec())).await else {
            // A member taken earlier was lost meanwhile: the set can no longer be whole.
            return Err(give_up(service.backend(), &mut leases, None).await);
        };
        let held = match tried {
            Ok(AllOrNone::Granted(taken)) => {
                leases.extend(taken);
                break;
            }
            Ok(AllOrNone::Held(i)) => i.min(rest.len() - 1),
            Err(e) => return Err(not_taken(service.backend(), &mut leases, &rest[0], e).await),
        };
        if options.wait.is_zero() {
            let e = crate::spi::timeout_error(service.backend(), &rest[held], options.wait);
            return Err(not_taken(service.backend(), &mut leases, &rest[held], e).await);
        }
        // The keys below the held one were free a moment ago: take them before waiting for it.
        if held > 0 {
            let Some(tried) = keep_alive_while(&leases, options.ttl, take_free(rest[..held].to_vec())).await else {
                return Err(give_up(service.backend(), &mut leases, None).await);
            };
            match tried {
                Ok(AllOrNone::Granted(taken)) => {
                    leases.extend(taken);
                    rest = &rest[held..];
                }
                // Taken by another meanwhile: wait for the lowest key left, as always.
                Ok(AllOrNone::Held(_)) => {}
                Err(e) => return Err(not_taken(service.backend(), &mut leases, &rest[0], e).await),
            }
        }
        let key = &rest[0];
        // One wait for the whole set: each member waits for what is left of it.
        let left = deadline.saturating_duration_since(Instant::now());
        let Some(acquired) = keep_alive_while(&leases, options.ttl, lock_one(key.clone(), options.wait(left))).await
        else {
            return Err(give_up(service.backend(), &mut leases, None).await);
        };
        match acquired {
            Ok(lease) => leases.push(lease),
            Err(e) => return Err(not_taken(service.backend(), &mut leases, key, e).await),
        }
        rest = &rest[1..];
    }
    // A member taken early has spent part of its TTL while the later ones were waited for:
    // bring each that has less than half of it left back to the full TTL, so that the set
    // starts whole. A member that expired meanwhile (a TTL shorter than the wait) cannot be:
    // the set is given up, not handed over with a lost member.
    let half = options.ttl / 2;
    for i in 0..leases.len() {
        if leases[i].is_lost() {
            return Err(give_up(service.backend(), &mut leases, None).await);
        }
        if leases[i].time_left() >= half {
            continue;
        }
        if let Err(e) = leases[i].extend(options.ttl).await {
            return Err(give_up(service.backend(), &mut leases, Some(e)).await);
        }
    }
    Ok(MultiLease {
        leases,
        lost: CancellationToken::new(),
        done: CancellationToken::new(),
        watching: AtomicBool::new(false),
    })
}

/// Releases every member taken (in reverse order) and returns why `key` could not be taken:
/// `e`'s kind and retryability, naming the key.
async fn not_taken<S: LockService + ?Sized>(
    backend: &'static str,
    leases: &mut Vec<Lease<S>>,
    key: &ResourceKey,
    e: Error,
) -> Error {
    while let Some(taken) = leases.pop() {
        // Freed at its TTL at the latest if this fails: the error that matters is why the set
        // could not be taken.
        let _ = taken.release().await;
    }
    let taken_before = if e.kind() == ErrorKind::Timeout { " (held past the wait)" } else { "" };
    Error::new(
        e.kind(),
        backend,
        format!("lock_all could not take {key}{taken_before}; the locks it had taken are released"),
    )
    .with_retryable(e.is_retryable())
    .with_source(e)
}

/// Releases every member taken (in reverse order) and returns the set's
/// [`ErrorKind::LeaseLost`] (retryable), naming the first member lost (`cause`: the extension
/// that failed, if that is how it was found).
async fn give_up<S: LockService + ?Sized>(
    backend: &'static str,
    leases: &mut Vec<Lease<S>>,
    cause: Option<Error>,
) -> Error {
    let lost = leases.iter().find(|lease| lease.is_lost()).or_else(|| leases.first()).map(|lease| lease.key().clone());
    while let Some(taken) = leases.pop() {
        let _ = taken.release().await;
    }
    let what = lost.map_or_else(|| String::from("a member"), |key| key.to_string());
    let error = Error::new(
        ErrorKind::LeaseLost,
        backend,
        format!(
            "lock_all: {what} was lost (its lock broken, taken over or expired) while the other keys were waited \
             for; the locks it had taken are released"
        ),
    )
    .with_retryable(true);
    match cause {
        Some(cause) => error.with_source(cause),
        None => error,
    }
}

/// Runs `waiting` (a later member's acquire) while extending the members already taken
/// whenever one has less than half of `ttl` left, so that a TTL shorter than the wait does
/// not let them expire (and another client take them) while the set is not yet whole.
/// `None` as soon as a member is lost (its lock broken or taken over, an extension refused):
/// the set can no longer be whole, so waiting on, and holding the others, would be for nothing.
///
/// The extensions run beside the acquire, both polled together, never one parked while the
/// other runs: an acquire parked mid-attempt may hold what an extension needs (SQLite's write
/// lock, a pooled connection), and the extension would wait for it until the member expired.
async fn keep_alive_while<S, T>(taken: &[Lease<S>], ttl: Duration, waiting: impl Future<Output = T>) -> Option<T>
where
    S: LockService + ?Sized,
{
    if taken.is_empty() {
        return Some(waiting.await);
    }
    let period = (ttl / 4).max(Duration::from_millis(1));
    let keep = async {
        let mut tick = tokio::time::interval_at(Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            for lease in taken {
                if lease.is_lost() {
                    return;
                }
                if lease.time_left() < ttl / 2 {
                    let _ = lease.extend(ttl).await;
                }
            }
        }
    };
    tokio::pin!(waiting, keep);
    tokio::select! {
        done = &mut waiting => Some(done),
        () = &mut keep => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::{LockService, LockServiceExt, MemoryLockService};

    fn key(id: &str) -> ResourceKey {
        ResourceKey::new("acct", id).unwrap()
    }

    fn service() -> Arc<MemoryLockService> {
        Arc::new(MemoryLockService::new())
    }

    #[tokio::test]
    async fn keys_are_taken_in_canonical_order_once_each() {
        let locks = service();
        let set =
            locks.lock_all(&[key("b"), key("a"), key("b")], LockOptions::ttl(Duration::from_secs(5))).await.unwrap();
        let keys: Vec<&ResourceKey> = set.keys().collect();
        assert_eq!(keys, [&key("a"), &key("b")]);
        let fences = set.fences();
        assert_eq!(fences.len(), 2);
        assert_eq!(set.fence(&key("a")), Some(fences[0].1.fence()));
        set.release().await.unwrap();
        // Released: both are free again.
        assert!(locks.try_lock(&key("a"), Duration::from_secs(1)).await.unwrap().is_some());
        assert!(locks.try_lock(&key("b"), Duration::from_secs(1)).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn no_keys_is_an_invalid_argument() {
        let e = service().lock_all(&[], LockOptions::ttl(Duration::from_secs(1))).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }

    /// A member held past the wait: a timeout naming it, within the wait, and the member taken
    /// before it is free again (all or nothing).
    #[tokio::test]
    async fn a_held_member_times_out_and_releases_what_was_taken() {
        let locks = service();
        let held = locks.try_lock(&key("b"), Duration::from_secs(5)).await.unwrap().unwrap();
        let started = Instant::now();
        let wait = Duration::from_millis(200);
        let e = locks
            .lock_all(&[key("a"), key("b")], LockOptions::ttl(Duration::from_secs(5)).wait(wait))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e:?}");
        assert!(e.to_string().contains("acct:b"), "{e}");
        assert!(started.elapsed() < wait + Duration::from_millis(500), "took {:?}", started.elapsed());
        assert!(locks.try_lock(&key("a"), Duration::from_secs(1)).await.unwrap().is_some(), "a was left held");
        // A zero wait is one attempt at each key.
        let e = locks.lock_all(&[key("c"), key("b")], LockOptions::ttl(Duration::from_secs(5))).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout);
        assert!(locks.try_lock(&key("c"), Duration::from_secs(1)).await.unwrap().is_some(), "c was left held");
        held.release().await.unwrap();
    }

    /// Tasks taking overlapping sets, listed in opposite orders, all finish: no deadlock, and
    /// never two holders of one key at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn overlapping_sets_in_any_order_never_deadlock() {
        let locks = service();
        let inside = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for t in 0..8 {
            let (locks, inside) = (Arc::clone(&locks), Arc::clone(&inside));
            tasks.push(tokio::spawn(async move {
                let sets = [vec![key("x"), key("y")], vec![key("y"), key("z")], vec![key("z"), key("x")]];
                for round in 0..20 {
                    let mut set = sets[(t + round) % 3].clone();
                    if t % 2 == 1 {
                        set.reverse();
                    }
                    let options = LockOptions::ttl(Duration::from_secs(5)).wait(Duration::from_secs(10));
                    let held = locks.lock_all(&set, options).await.unwrap();
                    for k in held.keys() {
                        assert!(inside.lock().unwrap().insert(k.clone()), "{k} held twice");
                    }
                    tokio::task::yield_now().await;
                    for k in held.keys() {
                        inside.lock().unwrap().remove(k);
                    }
                    held.release().await.unwrap();
                }
            }));
        }
        for task in tasks {
            tokio::time::timeout(Duration::from_secs(20), task).await.expect("a task never finished").unwrap();
        }
        assert!(started.elapsed() < Duration::from_secs(20));
    }

    /// A member taken long before the last is brought back to its full TTL: the set starts
    /// whole, not with its first member about to expire.
    #[tokio::test]
    async fn early_members_start_with_their_full_ttl_again() {
        let locks = service();
        let held = locks.try_lock(&key("late"), Duration::from_secs(5)).await.unwrap().unwrap();
        let freed = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            held.release().await.unwrap();
        });
        let ttl = Duration::from_secs(1);
        let set = locks
            .lock_all(&[key("early"), key("late")], LockOptions::ttl(ttl).wait(Duration::from_secs(5)))
            .await
            .unwrap();
        freed.await.unwrap();
        let early = set.lease(&key("early")).unwrap();
        assert!(early.time_left() > ttl / 2, "the first member has {:?} left", early.time_left());
        set.release().await.unwrap();
    }

    /// A TTL shorter than the wait: the members taken first are kept alive while a later one
    /// is waited for, so nobody else takes them meanwhile and the set is granted whole once
    /// the later one comes free (before, they expired and the set was given up, again and
    /// again under contention).
    #[tokio::test]
    async fn early_members_are_kept_alive_while_a_later_one_is_waited_for() {
        let locks = service();
        let held = locks.try_lock(&key("slow"), Duration::from_secs(5)).await.unwrap().unwrap();
        let (taker, first) = (Arc::clone(&locks), key("first"));
        let freed = tokio::spawn(async move {
            // Two of the first member's TTLs later, somebody else tries it.
            tokio::time::sleep(Duration::from_millis(400)).await;
            let other = taker.try_lock(&first, Duration::from_secs(5)).await.unwrap();
            held.release().await.unwrap();
            other
        });
        let options = LockOptions::ttl(Duration::from_millis(200)).wait(Duration::from_secs(5));
        let set = locks.lock_all(&[key("first"), key("slow")], options).await.unwrap();
        assert!(freed.await.unwrap().is_none(), "the first member expired while the second was waited for");
        assert!(!set.is_lost());
        set.release().await.unwrap();
    }

    /// A member lost while the others were waited for (its lock broken on the server) gives
    /// the set up at once, not when the later member comes free: nothing is left held, and the
    /// error says why.
    #[tokio::test]
    async fn a_member_lost_while_waiting_gives_the_set_up() {
        let locks = service();
        let held = locks.try_lock(&key("slow"), Duration::from_secs(5)).await.unwrap().unwrap();
        let (breaker, first) = (Arc::clone(&locks), key("first"));
        let freed = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            breaker.break_lock(&first);
            let other = breaker.try_lock(&first, Duration::from_secs(5)).await.unwrap();
            tokio::time::sleep(Duration::from_secs(3)).await;
            held.release().await.unwrap();
            other
        });
        let options = LockOptions::ttl(Duration::from_millis(200)).wait(Duration::from_secs(10));
        let e = locks.lock_all(&[key("first"), key("slow")], options).await.unwrap_err();
        assert!(!freed.is_finished(), "lock_all waited for the later member though the first was lost");
        assert_eq!(e.kind(), ErrorKind::LeaseLost, "{e:?}");
        assert!(e.is_retryable());
        let other = freed.await.unwrap().expect("the broken member was not free to take");
        assert!(locks.try_lock(&key("slow"), Duration::from_secs(1)).await.unwrap().is_some(), "slow was left held");
        other.release().await.unwrap();
    }

    /// A service that implements only the required methods: the trait's default
    /// `try_acquire_all`, one `try_acquire` per key.
    struct PerKey(MemoryLockService);

    #[async_trait::async_trait]
    impl LockService for PerKey {
        type Fencing = Fenced;
        fn backend(&self) -> &'static str {
            "per-key"
        }
        fn capabilities(&self) -> crate::Capabilities {
            crate::Capabilities::default()
        }
        async fn try_acquire(&self, key: &ResourceKey, ttl: crate::Ttl) -> Result<Option<crate::Grant<Fenced>>> {
            self.0.try_acquire(key, ttl).await
        }
        async fn extend(&self, grant: &crate::Grant<Fenced>, ttl: crate::Ttl) -> Result<crate::Ttl> {
            self.0.extend(grant, ttl).await
        }
        async fn release(&self, grant: &crate::Grant<Fenced>) -> Result<()> {
            self.0.release(grant).await
        }
    }

    /// `try_acquire_all` takes every key or none, on the memory service (one step) and through
    /// the trait's default (one key at a time, the taken ones given back): the held key's index,
    /// and every other key free afterwards.
    #[tokio::test]
    async fn try_acquire_all_takes_every_key_or_none() {
        let memory = service();
        let per_key = Arc::new(PerKey(MemoryLockService::new()));
        let ttl = crate::Ttl::from_millis(5_000).unwrap();
        let services: [Arc<crate::DynLockService>; 2] = [memory, per_key];
        for locks in services {
            let set = [key("a"), key("b"), key("c")];
            let held = locks.try_acquire(&set[1], ttl).await.unwrap().unwrap();
            match locks.try_acquire_all(&set, ttl).await.unwrap() {
                AllOrNone::Held(i) => assert_eq!(i, 1, "{}", locks.backend()),
                AllOrNone::Granted(_) => panic!("{}: granted a set with a held key", locks.backend()),
            }
            for free in [&set[0], &set[2]] {
                let got = locks.try_acquire(free, ttl).await.unwrap();
                let got = got.unwrap_or_else(|| panic!("{}: {free} left held", locks.backend()));
                locks.release(&got).await.unwrap();
            }
            locks.release(&held).await.unwrap();
            let AllOrNone::Granted(grants) = locks.try_acquire_all(&set, ttl).await.unwrap() else {
                panic!("{}: a free set was not granted", locks.backend());
            };
            let keys: Vec<&ResourceKey> = grants.iter().map(crate::Grant::key).collect();
            assert_eq!(keys, [&set[0], &set[1], &set[2]], "one grant per key, at its index");
            // b was granted before: its fence moved on.
            assert!(grants[1].fence().get() > held.fence().get());
            for grant in &grants {
                locks.release(grant).await.unwrap();
            }
            for bad in [vec![], vec![key("a"), key("a")]] {
                let e = locks.try_acquire_all(&bad, ttl).await.unwrap_err();
                assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{}: {bad:?}", locks.backend());
            }
        }
    }

    /// More keys than one fenced write carries is refused before anything is taken.
    #[tokio::test]
    async fn a_set_above_the_limit_is_an_invalid_argument() {
        let locks = service();
        let keys: Vec<ResourceKey> = (0..=crate::store::MAX_FENCES_PER_WRITE).map(|i| key(&format!("k{i}"))).collect();
        let e = locks.lock_all(&keys, LockOptions::ttl(Duration::from_secs(1))).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(locks.last_fence(&keys[0]).is_none(), "a key was taken");
    }

    /// The set's lost signal fires when one member is lost, even when the others are fine.
    #[tokio::test]
    async fn the_set_is_lost_when_any_member_is() {
        let locks = service();
        let set = locks.lock_all(&[key("p"), key("q")], LockOptions::ttl(Duration::from_secs(30))).await.unwrap();
        let lost = set.lost();
        assert!(!set.is_lost());
        // The member on q is taken away behind the holder's back (as an operator would).
        let q = set.lease(&key("q")).unwrap();
        locks.release(q.grant()).await.unwrap();
        q.extend(Duration::from_secs(30)).await.unwrap_err();
        tokio::time::timeout(Duration::from_secs(5), lost).await.expect("the set's lost signal never fired");
        assert!(set.is_lost());
        assert!(set.extend(Duration::from_secs(30)).await.is_err());
        let _ = set.release().await;
    }

    #[tokio::test]
    async fn with_locks_runs_the_work_holding_every_lock_and_releases_them() {
        let locks = service();
        let other = Arc::clone(&locks);
        let done = locks
            .with_locks(&[key("m"), key("n")], LockOptions::ttl(Duration::from_secs(5)), |set| {
                Box::pin(async move {
                    assert_eq!(set.leases().len(), 2);
                    // Held for the work: nobody else gets either (the raw acquire: no re-entry check).
                    let ttl = crate::Ttl::from_millis(1000)?;
                    assert!(other.try_acquire(&key("m"), ttl).await?.is_none());
                    assert!(other.try_acquire(&key("n"), ttl).await?.is_none());
                    // Taking a member again inside is re-entry, not a wait on ourselves.
                    let again = other.lock(&key("n"), LockOptions::ttl(Duration::from_secs(1))).await.unwrap_err();
                    assert_eq!(again.kind(), ErrorKind::Reentrant);
                    Ok::<_, Error>(7)
                })
            })
            .await
            .unwrap();
        assert_eq!(done, 7);
        assert!(locks.try_lock(&key("m"), Duration::from_secs(1)).await.unwrap().is_some());
        assert!(locks.try_lock(&key("n"), Duration::from_secs(1)).await.unwrap().is_some());
    }
}
