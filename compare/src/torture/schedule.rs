//! The fault schedule, drawn from a seed: the same seed and the same menu give the same
//! schedule, fault for fault and millisecond for millisecond.

use std::fmt;

use serde::Serialize;

/// Which side of a client's connections a fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// The lock service.
    Lock,
    /// The fenced store.
    Store,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Lock => "the lock service",
            Side::Store => "the store",
        })
    }
}

/// One fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `SIGSTOP` a client for `ms`, then `SIGCONT`: a holder's GC pause or VM freeze.
    PauseClient { client: usize, ms: u64 },
    /// `SIGKILL` a client; a new process takes its place `down_ms` later.
    KillClient { client: usize, down_ms: u64 },
    /// Nothing flows between a client and one side for `ms`; bytes sent meanwhile arrive on
    /// heal (the fault proxy's partition).
    Partition { client: usize, side: Side, ms: u64 },
    /// The reply to a client's next request to one side is lost after the request was applied.
    LoseReply { client: usize, side: Side },
    /// Replies from one side reach a client `delay_ms` late, for `ms`.
    SlowReplies { client: usize, side: Side, delay_ms: u64, ms: u64 },
    /// Every connection between a client and one side is cut at once.
    Cut { client: usize, side: Side },
    /// `SIGSTOP` the server of one side for `ms`.
    PauseServer { side: Side, ms: u64 },
    /// Restart the server of one side, with its data.
    RestartServer { side: Side },
    /// The lock service loses every lock and fence counter: its server restarted empty, or a
    /// store-native service's lock table dropped (the store's own rows stay).
    LoseLockData,
    /// `SIGKILL` the lock service's leader (a cluster's: the others elect another), and start
    /// it again with its data `ms` later.
    KillLeader { ms: u64 },
    /// The client's host is cut off from every server and every other client for `ms` (its
    /// link down): a network partition, where the proxy's partition holds bytes back instead.
    IsolateHost { client: usize, ms: u64 },
    /// Everything the client's host sends is lost for `ms`; what reaches it still arrives.
    DropSent { client: usize, ms: u64 },
    /// Everything sent to the client's host is lost for `ms`: its requests arrive and are
    /// carried out, their answers never come back.
    DropReceived { client: usize, ms: u64 },
    /// `SIGKILL` the lock service's master behind Sentinel: the Sentinels promote its replica,
    /// which may lack the last grants (replication is asynchronous); the killed server comes
    /// back `ms` later, as the new master's replica.
    FailOver { ms: u64 },
    /// The client's wall clock is stepped by `by_s` seconds (ahead, or back when negative),
    /// and stepped back `ms` later, as NTP, an operator or a resumed VM steps one; its
    /// monotonic clock runs on untouched (libfaketime).
    JumpClock { client: usize, by_s: i64, ms: u64 },
}

impl Fault {
    /// How long the fault lasts (0: a moment).
    pub fn lasts_ms(&self) -> u64 {
        match *self {
            Fault::PauseClient { ms, .. }
            | Fault::Partition { ms, .. }
            | Fault::SlowReplies { ms, .. }
            | Fault::PauseServer { ms, .. }
            | Fault::KillLeader { ms }
            | Fault::IsolateHost { ms, .. }
            | Fault::DropSent { ms, .. }
            | Fault::DropReceived { ms, .. }
            | Fault::FailOver { ms }
            | Fault::JumpClock { ms, .. } => ms,
            Fault::KillClient { down_ms, .. } => down_ms,
            Fault::LoseReply { .. } | Fault::Cut { .. } | Fault::RestartServer { .. } | Fault::LoseLockData => 0,
        }
    }

    /// Whether the lock service loses its locks in this fault: only then may holds granted
    /// before and after it overlap (the history's `loses_locks`). A leader killed in a cluster
    /// and a server restarted with its data keep every acknowledged lock; a Sentinel failover
    /// may not (the Redis service's docs say so: the store's fences are what stays safe).
    pub fn loses_locks(&self) -> bool {
        matches!(self, Fault::LoseLockData | Fault::FailOver { .. })
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Fault::PauseClient { client, ms } => write!(f, "pause client {client} for {ms} ms (SIGSTOP)"),
            Fault::KillClient { client, down_ms } => {
                write!(f, "kill client {client} (SIGKILL), a new process {down_ms} ms later")
            }
            Fault::Partition { client, side, ms } => write!(f, "partition client {client} from {side} for {ms} ms"),
            Fault::LoseReply { client, side } => {
                write!(f, "lose the reply to client {client}'s next request to {side}")
            }
            Fault::SlowReplies { client, side, delay_ms, ms } => {
                write!(f, "delay {side}'s replies to client {client} by {delay_ms} ms for {ms} ms")
            }
            Fault::Cut { client, side } => write!(f, "cut client {client}'s connections to {side}"),
            Fault::PauseServer { side, ms } => write!(f, "pause the server of {side} for {ms} ms (SIGSTOP)"),
            Fault::RestartServer { side } => write!(f, "restart the server of {side}, data kept"),
            Fault::LoseLockData => f.write_str("the lock service loses every lock and fence counter"),
            Fault::KillLeader { ms } => {
                write!(f, "kill the lock service's leader (SIGKILL), back with its data {ms} ms later")
            }
            Fault::IsolateHost { client, ms } => {
                write!(f, "cut client {client}'s host off from the network for {ms} ms (link down)")
            }
            Fault::DropSent { client, ms } => {
                write!(f, "lose everything client {client}'s host sends for {ms} ms (one-way loss)")
            }
            Fault::DropReceived { client, ms } => {
                write!(f, "lose everything sent to client {client}'s host for {ms} ms (one-way loss)")
            }
            Fault::FailOver { ms } => write!(
                f,
                "kill the Redis master (SIGKILL), the Sentinels promote its replica; back as a replica {ms} ms later"
            ),
            Fault::JumpClock { client, by_s, ms } => {
                let way = if by_s < 0 { "back" } else { "ahead" };
                write!(f, "step client {client}'s wall clock {} s {way} for {ms} ms (libfaketime)", by_s.unsigned_abs())
            }
        }
    }
}

/// A fault and when it begins, from the start of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub at_ms: u64,
    pub fault: Fault,
}

/// What the run can do to the pair: which faults the schedule draws from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Menu {
    pub clients: usize,
    pub ttl_ms: u64,
    /// The clients reach the lock service over TCP, through fault proxies.
    pub lock_proxied: bool,
    /// The clients reach the store over TCP, through fault proxies.
    pub store_proxied: bool,
    /// The lock service's server is ours to pause and restart.
    pub lock_server: bool,
    /// The lock service's data is ours to lose.
    pub lock_data: bool,
    /// The store's server is ours to pause and restart (with its data: a store never loses it).
    pub store_server: bool,
    /// The lock service is a cluster of ours whose leader the schedule may kill.
    pub lock_leader: bool,
    /// Each client runs on a host of its own (a network namespace), which the schedule may cut
    /// off or make lose its traffic one way.
    pub hosts: bool,
    /// The lock service is a Redis master and replica behind Sentinels of ours, which the
    /// schedule may fail over.
    pub lock_failover: bool,
    /// The clients' wall clocks are ours to step (they run under libfaketime).
    pub clock_jumps: bool,
}

/// A deterministic generator (SplitMix64): the schedule must not depend on a crate's version.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi.saturating_sub(lo) + 1)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Draws the schedule for a run of `faulty_ms` (faults begin and heal within it): one fault at
/// a time, each followed by a quiet gap, from the start plus a second of warm-up.
pub fn draw(seed: u64, faulty_ms: u64, menu: &Menu) -> Vec<Step> {
    let mut rng = Rng::new(seed);
    let ttl = menu.ttl_ms;
    let mut kinds: Vec<&'static str> = vec!["pause-client", "pause-client", "kill-client"];
    for (proxied, side) in [(menu.lock_proxied, Side::Lock), (menu.store_proxied, Side::Store)] {
        if proxied {
            kinds.extend(match side {
                Side::Lock => ["partition-lock", "lose-lock", "slow-lock", "cut-lock"],
                Side::Store => ["partition-store", "lose-store", "slow-store", "cut-store"],
            });
        }
    }
    if menu.lock_server {
        kinds.extend(["pause-lock-server", "restart-lock-kept"]);
    }
    if menu.lock_data {
        kinds.push("lose-lock-data");
    }
    if menu.store_server {
        kinds.extend(["pause-store-server", "restart-store-kept"]);
    }
    // Last, so that the menus without it draw the schedules they always did.
    if menu.lock_leader {
        kinds.extend(["kill-lock-leader", "kill-lock-leader"]);
    }
    // After the leader, for the same reason.
    if menu.hosts {
        kinds.extend(["isolate-host", "drop-sent", "drop-received"]);
    }
    if menu.lock_failover {
        kinds.extend(["fail-over-lock", "fail-over-lock"]);
    }
    if menu.clock_jumps {
        kinds.extend(["jump-clock", "jump-clock"]);
    }
    let mut steps = Vec::new();
    let mut at = 1_000;
    loop {
        let kind = kinds[rng.below(kinds.len())];
        let client = rng.below(menu.clients);
        // Around the TTL: shorter than it (nothing expires), and well past it (the lease is
        // lost while the holder is away).
        let span = rng.between(ttl / 4, ttl * 3);
        let side = |s: &str| if s.ends_with("lock") || s.contains("-lock-") { Side::Lock } else { Side::Store };
        let fault = match kind {
            "pause-client" => Fault::PauseClient { client, ms: span },
            "kill-client" => Fault::KillClient { client, down_ms: rng.between(100, ttl) },
            "partition-lock" | "partition-store" => Fault::Partition { client, side: side(kind), ms: span },
            "lose-lock" | "lose-store" => Fault::LoseReply { client, side: side(kind) },
            "slow-lock" | "slow-store" => {
                Fault::SlowReplies { client, side: side(kind), delay_ms: rng.between(ttl / 10, ttl * 2), ms: span }
            }
            "cut-lock" | "cut-store" => Fault::Cut { client, side: side(kind) },
            "pause-lock-server" | "pause-store-server" => Fault::PauseServer { side: side(kind), ms: span },
            "restart-lock-kept" | "restart-store-kept" => Fault::RestartServer { side: side(kind) },
            "kill-lock-leader" => Fault::KillLeader { ms: span },
            "isolate-host" => Fault::IsolateHost { client, ms: span },
            "drop-sent" => Fault::DropSent { client, ms: span },
            "drop-received" => Fault::DropReceived { client, ms: span },
            "fail-over-lock" => Fault::FailOver { ms: span },
            // A step of a few TTLs to an hour, either way; libfaketime reads the step within a
            // second, so the clock stays stepped for at least two.
            "jump-clock" => {
                let by_s = i64::try_from(rng.between(2, 3_600)).unwrap_or(2);
                let by_s = if rng.below(2) == 0 { by_s } else { -by_s };
                Fault::JumpClock { client, by_s, ms: 2_000 + span }
            }
            _ => Fault::LoseLockData,
        };
        if at + fault.lasts_ms() > faulty_ms {
            break;
        }
        steps.push(Step { at_ms: at, fault });
        at += fault.lasts_ms() + rng.between(200, ttl * 2);
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn menu() -> Menu {
        Menu {
            clients: 4,
            ttl_ms: 1_000,
            lock_proxied: true,
            store_proxied: true,
            lock_server: true,
            lock_data: true,
            store_server: true,
            lock_leader: false,
            hosts: false,
            lock_failover: false,
            clock_jumps: false,
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_schedule_and_another_seed_another() {
        let a = draw(42, 60_000, &menu());
        assert_eq!(a, draw(42, 60_000, &menu()));
        assert_ne!(a, draw(43, 60_000, &menu()));
        assert!(a.len() > 10, "{a:?}");
    }

    #[test]
    fn faults_come_one_at_a_time_and_heal_within_the_window() {
        for seed in 0..200 {
            let steps = draw(seed, 20_000, &menu());
            for pair in steps.windows(2) {
                assert!(pair[0].at_ms + pair[0].fault.lasts_ms() < pair[1].at_ms, "{pair:?}");
            }
            assert!(steps.iter().all(|s| s.at_ms + s.fault.lasts_ms() <= 20_000));
        }
    }

    #[test]
    fn only_faults_the_pair_can_take_are_drawn() {
        let bare = Menu {
            lock_proxied: false,
            store_proxied: false,
            lock_server: false,
            lock_data: false,
            store_server: false,
            ..menu()
        };
        for seed in 0..50 {
            for step in draw(seed, 60_000, &bare) {
                assert!(matches!(step.fault, Fault::PauseClient { .. } | Fault::KillClient { .. }), "{step:?}");
            }
        }
        let all: Vec<Fault> = (0..50).flat_map(|seed| draw(seed, 60_000, &menu())).map(|s| s.fault).collect();
        assert!(all.iter().any(|f| matches!(f, Fault::LoseLockData)));
        assert!(all.iter().any(|f| matches!(f, Fault::RestartServer { side: Side::Store })));
        assert!(all.iter().any(|f| matches!(f, Fault::Partition { side: Side::Store, .. })));
        assert!(!all.iter().any(|f| matches!(f, Fault::KillLeader { .. })), "no cluster, no leader to kill");
        let cluster = Menu { lock_server: false, lock_data: false, lock_leader: true, ..menu() };
        let drawn: Vec<Fault> = (0..50).flat_map(|seed| draw(seed, 60_000, &cluster)).map(|s| s.fault).collect();
        assert!(drawn.iter().any(|f| matches!(f, Fault::KillLeader { .. })));
        let network =
            |f: &Fault| matches!(f, Fault::IsolateHost { .. } | Fault::DropSent { .. } | Fault::DropReceived { .. });
        assert!(!all.iter().any(network), "no hosts, no host to cut off");
        assert!(!all.iter().any(|f| matches!(f, Fault::FailOver { .. })), "no Sentinels, no failover");
        let sentinel = Menu { lock_server: false, lock_data: false, lock_failover: true, ..menu() };
        let drawn: Vec<Fault> = (0..50).flat_map(|seed| draw(seed, 60_000, &sentinel)).map(|s| s.fault).collect();
        assert!(drawn.iter().any(|f| matches!(f, Fault::FailOver { .. })));
        assert!(Fault::FailOver { ms: 1 }.loses_locks(), "a failover may lose what was not replicated");
        let on_hosts = Menu { hosts: true, ..menu() };
        let drawn: Vec<Fault> = (0..50).flat_map(|seed| draw(seed, 60_000, &on_hosts)).map(|s| s.fault).collect();
        for kind in [
            |f: &Fault| matches!(f, Fault::IsolateHost { .. }),
            |f: &Fault| matches!(f, Fault::DropSent { .. }),
            |f: &Fault| matches!(f, Fault::DropReceived { .. }),
        ] {
            assert!(drawn.iter().any(kind), "every network fault is drawn on hosts");
        }
        let jump = |f: &Fault| matches!(f, Fault::JumpClock { .. });
        assert!(!all.iter().any(jump), "no libfaketime, no clock to step");
        let jumps = Menu { clock_jumps: true, ..menu() };
        let drawn: Vec<Fault> = (0..50).flat_map(|seed| draw(seed, 60_000, &jumps)).map(|s| s.fault).collect();
        assert!(drawn.iter().any(|f| matches!(f, Fault::JumpClock { by_s, .. } if *by_s > 0)), "ahead");
        assert!(drawn.iter().any(|f| matches!(f, Fault::JumpClock { by_s, .. } if *by_s < 0)), "back");
        assert!(!Fault::JumpClock { client: 0, by_s: 60, ms: 1 }.loses_locks());
    }

    #[test]
    fn a_menu_without_a_leader_draws_what_it_drew_before_leaders_were_on_the_menu() {
        // The planted-bug tests name seeds by the schedules they draw: a fault added to the
        // menu must not move them. Seed 53's thirty seconds on Redis × SQLite: five kills.
        let redis_sqlite = Menu { store_proxied: false, lock_data: true, store_server: false, ..menu() };
        let kills =
            draw(53, 16_000, &redis_sqlite).iter().filter(|s| matches!(s.fault, Fault::KillClient { .. })).count();
        assert_eq!(kills, 5);
    }
}
