//! The one list of scenarios: what [`certify!`](macro@crate::certify) stamps, what the broken twins
//! run, and what the scenario tables in the README and the crate docs are checked against.
//!
//! Each entry names the scenario's module and function, its **shape** (which factories it
//! needs and what it asks of them) and the guarantee it checks. A certification stamps every
//! entry whose shape its arguments cover; whether the scenario then checks the guarantee, the
//! documented refusal of an undeclared one, or fails for a missing hook is decided at run time
//! from what the service and store declare ([`Capabilities`](palisade_core::Capabilities),
//! [`FencedStoreFactory::shared_across_processes`](crate::FencedStoreFactory::shared_across_processes)),
//! never by the author.

/// Which factories a scenario needs, and what of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shape {
    /// A lock service alone.
    Lock,
    /// A fenced store alone.
    Store,
    /// A lock service and a store, in this process.
    Pair,
    /// A lock service and a store another process can reach (a holder in a process of its
    /// own, frozen with `SIGSTOP` or killed).
    Process,
    /// A fenced lock service's coordination primitives, with a store.
    Primitive,
    /// The same, with the primitive's holder in a process of its own.
    FrozenPrimitive,
    /// A fenced service whose server the suite may restart (`restartable`).
    Restart,
    /// A fenced service over a cluster whose leader the suite may kill (`cluster`), with a store.
    Cluster,
}

impl Shape {
    /// The shape's name in reports and tables.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Lock => "lock",
            Shape::Store => "store",
            Shape::Pair => "pair",
            Shape::Process => "process",
            Shape::Primitive => "primitive",
            Shape::FrozenPrimitive => "frozen primitive",
            Shape::Restart => "restart",
            Shape::Cluster => "cluster",
        }
    }

    /// Whether a certification of a lock service (`certify!(name: lock_service = …, store = …)`)
    /// runs scenarios of this shape.
    pub fn certifies_lock_services(self) -> bool {
        !matches!(self, Shape::Store)
    }

    /// Whether a certification of a fenced store (`certify!(name: fenced_store = …,
    /// lock_service = …)`) runs scenarios of this shape.
    pub fn certifies_stores(self) -> bool {
        matches!(self, Shape::Store | Shape::Pair | Shape::Process)
    }

    /// Whether a pairing (`certify!(name: pairing, lock_service = …, store = …)`) runs scenarios
    /// of this shape.
    pub fn certifies_pairings(self) -> bool {
        matches!(self, Shape::Pair | Shape::Process)
    }
}

/// One scenario of the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scenario {
    /// The scenario's function name (also its test's name).
    pub name: &'static str,
    /// The module of this crate it lives in.
    pub module: &'static str,
    /// Which factories it needs.
    pub shape: Shape,
    /// The guarantee it checks, in one line.
    pub guarantee: &'static str,
}

/// Calls `$crate::$callback!` with `$args` and every scenario as
/// `shape module::name "guarantee";`, in the order they run.
#[doc(hidden)]
#[macro_export]
macro_rules! __registry {
    ($callback:ident $args:tt) => {
        $crate::$callback! { $args
            lock lock::mutual_exclusion "one holder at a time, no lost update inside the critical section";
            lock lock::owner_only_release_and_extend "a foreign owner token can neither release nor extend";
            lock lock::expiry_and_takeover "a silent holder loses the lock after TTL (+ margin), not before";
            lock lock::fence_monotonicity "fences strictly increase across release, expiry, takeover (gap-free if declared)";
            lock lock::progress_gated_renewal "progress keeps a lease alive; a stall loses it within a TTL";
            lock lock::wait_and_handoff "waiters get released locks within one TTL (the hold is four), `Timeout` otherwise; handoff latency reported";
            lock lock::bad_input "bad keys, TTLs and waits are typed errors";
            lock lock::zero_wait_is_one_attempt "a zero wait takes a free lock, answers `Timeout` at once on a held one, and leaves nothing queued";
            lock lock::with_lock_releases_on_every_path "`with_lock` releases after success and error, refuses re-entry at once, cancels its work when the lease is lost";
            lock lock::keys_are_independent "keys differing in case, by a prefix or suffix, by where the domain ends, or as long as a key may be do not collide; a holder's second acquire of its key is refused; per-key counters on gap-free services";
            lock lock::stale_release_and_extend_after_takeover "the service itself refuses release/extend of an expired grant after a takeover (the new holder keeps the lock) and never extends an expired grant back to life";
            lock lock::cancelled_acquires_leave_no_residue "six waiters cancelled mid-wait leave nothing behind: the next client gets the released lock within TTL + margin";
            lock lock::fifo_when_declared "a service declaring `Waiting::NativeFifo` grants four waiters in arrival order";
            lock lock::declared_timing_is_explained "the test factory's expiry margin is explained by the declared `expiry_delay` (+ at most max(TTL, 1 s))";
            lock lock::lost_signal_from_the_backend "the factory deletes the lock on the server (`break_lock`, required): the renewing holder's lost signal fires before the lease's own deadline and the service's extend answers `NotHolder` (the loss comes from the service, not from core's watchdog); at once when subscribed after the loss; never after a clean release";
            lock lock::lost_replies_leave_one_live_grant "a reply lost after the server applied `try_acquire`, `release` or `extend`: the client returns the one live, releasable grant (one fence spent if gap-free) or an error with no orphan left (free within half the TTL); a live grant's release whose reply was lost never answers `NotHolder`; a release repeated after its lost reply is `NotHolder` and leaves the next holder alone";
            lock lock::cut_connections_keep_the_grant_or_report_it "every connection of a holder cut: it still holds (extend and release work, nobody else got the lock) or is told it lost it; new locks still work";
            lock lock::partitioned_holder_loses_before_anyone_gains "a renewing holder partitioned from the service: when another client is granted the lock, the holder's `safe_until` has passed and its lost signal fires; after healing its extend is `NotHolder`";
            lock lock::quorum_faults_never_grant_a_minority "a service that counts a majority of independent servers (`Replication::ClientMajority`, Redlock): no grant with a majority partitioned, partial grants rolled back (also a `SET` held up by the partition and delivered on heal), a grant with a minority partitioned";
            lock lock::dropped_client_lets_go "a client dropped while holding: the lock is free within TTL + margin (nothing keeps renewing it)";
            lock lock::fast_client_clock_takes_nothing_early "a client whose clock runs ten TTLs ahead (`skewed_client`) cannot take a held lock";
            lock lock::dead_waiter_is_never_granted "a waiter partitioned past its session: a third client gets the released lock and the waiter never comes back holding it (or, without sessions, the waiter got it)";
            lock lock::view_shows_the_holder "the read-only view (`InspectLocks`, what `palisade inspect` reads; the factory's `view` hook, required): a held key shows its holder's grant id and fence (where kept beside the holder), the counter at or above it, and is listed; no owner token shown; the holder still extends and nobody else gets the key; released, no holder";
            lock liveness::repair_keeps_the_holder "`advance_fence` (the repair of a fence regression) while the lock is held: nobody else gets it, the holder extends and releases as before, the next fence is above the floor";
            lock liveness::waits_are_bounded "on a held lock: `try_acquire` answers \"held\" within ten round trips (≥ 1 s); `acquire` with a 300 ms wait answers `Timeout` within 300 ms + that; the holder's extend and release answer as fast";
            lock liveness::slow_replies_still_complete "every reply 1.5 s late (`FaultProxy::delay_replies`): acquire, extend and release succeed, a release is never turned into `NotHolder` by a resend, a fresh client then takes the lock at once; a service that cannot grant through such replies (Redlock's node timeout) must leave no orphan";
            lock liveness::idle_key_keeps_its_counter "a key idle for more than three TTLs keeps its fence counter: where fences survive release, the next grant's fence is strictly higher";
            lock liveness::resent_release_never_frees_a_new_grant "a client repeating a release whose reply was lost never frees its own next grant: the repeat is `NotHolder`, the new grant stays held, extends and releases";
            lock liveness::releases_wake_waiters "`acquire_any` takes the first free key in order, a zero wait is one round and `Timeout`, no keys `InvalidArgument`; where native waiting is declared, a release wakes the waiter: the median of eleven handoffs after a 300 ms wait is within 10 ms + two round trips (the fastest of five), for `acquire` and for `acquire_any` (a polling waiter's is about 70 ms)";
            lock liveness::acquire_cancelled_as_the_lock_frees "an acquire dropped within ±3 ms of the release (21 rounds, the waiter's client kept alive) leaves no grant nobody owns: a third client gets the lock within TTL + margin + a round trip";
            lock multi::overlapping_lock_sets_never_deadlock "six clients `lock_all` overlapping sets of three of five keys, given in opposite orders: every set granted within its wait, no key held twice, the run ends within two waits; a member taken first is kept alive while a later one is held for three TTLs";
            lock multi::a_set_is_taken_all_or_nothing "`try_acquire_all` with one member held answers `Held` with its index and takes none of the others; a free set is granted whole (one grant per key, new fences, nobody else gets a member); a service declaring `MultiAcquire::OneRequest` takes sixteen free keys (taken and released once before) in at most five requests through its fault proxy";
            lock multi::lock_all_leaves_no_orphan "a set with a held member answers `Timeout` within its wait and frees the members it took at once; a reply lost at any of the set's first eight requests leaves no member held by nobody";
            store store::equal_higher_lower "equal fence accepted from the same grant, refused from another with `DuplicateFence`; lower refused with `StaleFence`; data untouched";
            store store::concurrent_interleaved_fences "concurrent scrambled fences: exactly the writes ≥ watermark land";
            store store::atomicity "multi-operation writes are all or nothing";
            store store::store_bad_input "malformed batches refused";
            store store::stale_batches_of_every_shape "Delete-only, Create-only, Check-only, mixed and empty stale batches refused (`StaleFence`, or `DuplicateFence` from another grant), nothing changed";
            store store::fence_comparison_matrix "w−1, w, w+1 × same grant / other grant; the watermark never decreases; fence 0 refused";
            store store::watermark_scope "watermarks per resource (also for a name that starts with another's), and in the store: a new client refuses the stale fence";
            store store::read_many_answers_like_read "`read_many` answers each key as `read` does, in the order asked (missing and repeated keys included); an invalid key is `InvalidKey`";
            store store::store_race "two clients race fences t1 < t2, 40 rounds: the record always ends with t2's value";
            store store::multi_write_all_or_nothing "`apply_all`: a stale or duplicate fence on any member refuses the whole write and names that member, nothing written; failed conditions write nothing; an accepted write raises every watermark; writers of overlapping sets in opposite orders never deadlock and keep the watermarks equal";
            pair e2e::paused_holder_in_process "a holder paused past its TTL gets `StaleFence`; metric +1; lost signal fired";
            process e2e::paused_holder_process "the same, with a real holder process frozen by `SIGSTOP` and thawed by `SIGCONT`";
            process e2e::killed_holder "after `SIGKILL` of the holder, the next one proceeds within TTL + margin";
            pair e2e::stale_write_before_new_holder_writes "fencing rule 3: the \"done\" check inside the fenced write";
            pair e2e::live_lock_when_declared "a store that declares it checks the live lock refuses a write whose lock is gone";
            pair e2e::waits_are_bounded_while_a_fenced_transaction_is_open "a holder's fenced transaction held open (store hook `hold_transaction`): another client's zero wait and 300 ms wait still answer within their bound, never with a grant";
            process e2e::frozen_holder_inside_a_fenced_transaction "a holder process frozen by `SIGSTOP` with its fenced transaction open (`hold_transaction`): another client's zero wait and 300 ms wait still answer within their bound, never with a grant; thawed, it lets go and the lock is taken within the expiry bound";
            pair multi::paused_member_refuses_the_multi_write "a holder of `{x, y}` paused past its TTL while B took `y` and wrote: its transfer over both is refused whole (`StaleFence` naming `y`, or `NotHolder` naming `x` where the store checks the live lock), nothing of it lands, its set's lost signal fired";
            pair e2e::load "500 acquisitions/s across 50 keys: no overlapping holds with accepted writes (grant → last moment the holder could act), every job's record exactly once, no fence issued twice (a lease that ran out during an accepted write is counted, not failed)";
            primitive semaphore::semaphore_count_limit "never more permits held than the count";
            primitive semaphore::semaphore_stale_permit_refused "a permit holder paused past its TTL gets `StaleFence` from the store";
            primitive semaphore::semaphore_fifo_when_declared "a queued semaphore serves waiters in arrival order where FIFO is declared";
            primitive semaphore::primitive_keys_are_their_own "a semaphore's and a read-write lock's internal keys are keys no user can name";
            primitive rwlock::rwlock_readers_share_writers_exclude "readers share, a writer excludes readers and writers, a waiting writer is not starved";
            primitive rwlock::rwlock_stale_holders_refused "a reader or writer paused past its TTL gets `StaleFence`";
            primitive election::election_frozen_leader_is_deposed "a leader paused past its term is deposed; its writes are refused";
            primitive liveness::duplicate_fence_repair_keeps_the_holder "a holder whose fence the store already accepted from another grant gets `DuplicateFence` from `FencedStoreExt::write`, which repairs the counter; the holder still extends and releases, and a new holder gets the lock at once, its fence past the duplicate (+ `REGRESSION_GAP` where repaired)";
            primitive primitives::primitives_enter_over_a_slow_service "over a service 5 ms slower per operation (128 reader slots and permits, 256 queued permits): every primitive enters within a bound derived from its operations";
            frozen_primitive frozen::semaphore_permit_holder_sigstop "a permit holder frozen by `SIGSTOP` past its TTL is refused on waking";
            frozen_primitive frozen::rwlock_reader_sigstop "a reader frozen by `SIGSTOP` past its TTL is refused on waking; a writer enters";
            frozen_primitive frozen::rwlock_writer_sigstop "a writer frozen by `SIGSTOP` past its TTL is refused on waking; the next writer enters";
            frozen_primitive frozen::election_leader_sigstop "a leader frozen by `SIGSTOP` past its term is refused on waking; a new leader is elected";
            restart lock::fences_survive_restart_or_are_repaired "a restart with data keeps fences growing where declared; after a data loss, and after a restore from a snapshot taken five grants ago, `lock_checked` moves the fences past the store's watermark by itself, the new holder writes within two waits, the holder from before the loss is refused";
            cluster cluster::leader_killed "the cluster's leader killed under contention: no overlapping holds, fences increase, locks usable after the election";
        }
    };
}

/// Builds [`SCENARIOS`] from the registry (a callback of [`__registry!`](crate::__registry)).
#[doc(hidden)]
#[macro_export]
macro_rules! __registry_list {
    ({} $($shape:ident $module:ident :: $name:ident $guarantee:literal;)*) => {
        /// Every scenario, in the order they run.
        pub const SCENARIOS: &[$crate::registry::Scenario] = &[
            $($crate::registry::Scenario {
                name: stringify!($name),
                module: stringify!($module),
                shape: $crate::registry::shape_of(stringify!($shape)),
                guarantee: $guarantee,
            },)*
        ];
    };
}

crate::__registry!(__registry_list {});

#[doc(hidden)]
pub const fn shape_of(shape: &str) -> Shape {
    match shape.as_bytes() {
        b"lock" => Shape::Lock,
        b"store" => Shape::Store,
        b"pair" => Shape::Pair,
        b"process" => Shape::Process,
        b"primitive" => Shape::Primitive,
        b"frozen_primitive" => Shape::FrozenPrimitive,
        b"restart" => Shape::Restart,
        b"cluster" => Shape::Cluster,
        // A misspelt shape in the registry stops the build.
        _ => panic!("a registry entry has an unknown shape"),
    }
}

/// The scenario named `name`, if the registry has it.
pub fn scenario(name: &str) -> Option<&'static Scenario> {
    SCENARIOS.iter().find(|s| s.name == name)
}

/// The scenario table of the README and the crate docs, generated from the registry.
pub fn markdown_table() -> String {
    let mut out = String::from("| scenario | shape | the guarantee it checks |\n|---|---|---|\n");
    for s in SCENARIOS {
        out.push_str(&format!("| `{}::{}` | {} | {} |\n", s.module, s.name, s.shape.name(), s.guarantee));
    }
    out
}
