//! # palisade-model
//!
//! The fencing protocol of `../shared/FENCING.md` as a state machine small enough to read,
//! checked exhaustively with [stateright]: every interleaving of its actions up to the bounds
//! below is explored, and every state is checked against the properties.
//!
//! **The parts.** A lock service with one lock and a fence counter; clients that acquire (plainly
//! or through `lock_checked`), release, and write through a fenced store; the store's
//! watermark rule. **The faults.** A holder pauses at any step and resumes at any later one (the
//! service lets its lock go, `Expire`, while the holder still holds its grant and may write);
//! the service loses the tail of its counter, or all of it, and its lock with it (a failover to
//! a lagging replica, a restart without persistence), `Lose`.
//!
//! **The rules** ([`Rules::Correct`]):
//! - the store accepts a write whose fence is above its watermark, or equal to it **from the
//!   grant that set it** (rule 2); anything else is refused, a fence equal from another grant
//!   as a duplicate;
//! - `lock_checked` takes the lock, reads the watermark, and if its fence is **at or below**
//!   it, gives the grant back, moves the counter to the watermark plus [`GAP`] and takes the
//!   lock again, at most twice (core's `checked`); the gap stands for `REGRESSION_GAP` (2³⁰):
//!   more than the grants the model can issue;
//! - a write refused as a duplicate moves the counter the same way (`FencedStoreExt::write`).
//!
//! **The properties** ([`FencingModel::properties`]):
//! - `fence order`: the store's accepted writes never go back in fence, and repeat a fence only
//!   for the same grant;
//! - `checked grant above the watermark`: a `lock_checked` grant's fence is above every fence
//!   the store had accepted when it was granted;
//! - `repair terminates`: `lock_checked` never gives up (`FenceRegression`);
//! - `repair outranks earlier grants` (checked with at most one counter loss): a grant made
//!   after a repair is above every fence issued before it, so no grant from before the loss
//!   can outrank it;
//! - `stale refused after newer write` (checked where the counter is never lost): once a grant
//!   has written, no write of an earlier grant is accepted.
//!
//! The last two are the limits of fencing over a service that loses its counter ([`Limit`]):
//! the checker finds where each breaks ([`limit_counterexample`]), and the first three hold
//! there too. After a loss, a grant issued before it that had not written yet may hold a
//! higher fence than grants issued after it, and nothing can see that until it writes (what
//! the README says a failover can lose, narrowed by replica acknowledgement); after a second
//! loss before a repaired grant writes, the next repair can issue its fence again, and rule 2
//! refuses the second of the two writers.
//!
//! **Two ways to repair** ([`Recovery`]). A service whose counter can be set (Redis, the SQL
//! services) moves it to the watermark plus the gap. A service whose fences come from a
//! number it cannot set (etcd's revision, ZooKeeper's zxid) keeps an **epoch** beside it, and
//! a fence is `epoch × SPAN + counter` ([`SPAN`] stands for 2⁴⁴ or 2⁴⁸): the repair raises the
//! epoch to one past the watermark's, and a loss takes the epoch back too (it lives in the
//! same data: a wipe sets it to 0, an old snapshot to an older value). The same properties
//! hold for both, with the same limits.
//!
//! Each weakened rule ([`Rules`]) makes the checker find a counterexample to the property it
//! breaks; `scripts/model-check` runs them all and prints the states explored.
//!
//! **Abstractions.** One lock; `lock_checked`'s rounds are atomic (another client's step cannot
//! fall between its watermark read and its grant: such a step could only make the store refuse
//! more); a lost counter loses the lock too (the harder case for exclusion).
//!
//! [stateright]: https://docs.rs/stateright

use stateright::{Model, Property};

/// What a repair adds to the watermark: stands for `REGRESSION_GAP` (2³⁰), more than the grants
/// a run of the model issues.
pub const GAP: u32 = 8;

/// The span of the counter under an epoch: a fence is `epoch × SPAN + counter`. Stands for
/// 2⁴⁴ (etcd) or 2⁴⁸ (ZooKeeper): more than the counter reaches in a run of the model.
pub const SPAN: u32 = 16;

/// How the service moves its fences past a watermark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Recovery {
    /// The counter is set to the watermark plus [`GAP`] (Redis, the SQL services).
    Counter,
    /// The epoch is raised to one past the watermark's; the counter goes on (etcd, ZooKeeper).
    Epoch,
}

/// The rules the model runs with: the correct ones, or one weakened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rules {
    /// As implemented.
    Correct,
    /// The store accepts an equal fence from any grant (rule 2 dropped).
    EqualFromAnyGrant,
    /// `lock_checked` repairs only a fence strictly below the watermark (`<` for `<=`).
    CheckedRepairsOnlyBelow,
    /// The repair moves the counter to the watermark itself, without the gap.
    RepairWithoutGap,
    /// The epoch repair raises the epoch to the watermark's own, not one past it.
    EpochNotPastTheWatermark,
}

/// The model: how many clients, how many grants and counter losses a run may have, and the
/// rules.
#[derive(Clone, Debug)]
pub struct FencingModel {
    /// Clients (each holds at most one grant).
    pub clients: usize,
    /// Grants issued in a run, at most (fewer than [`GAP`]).
    pub max_grants: usize,
    /// Counter losses in a run, at most.
    pub max_losses: u8,
    /// The rules.
    pub rules: Rules,
    /// How a repair moves the fences.
    pub recovery: Recovery,
}

/// A grant a client holds: its issue number (grants are numbered in issue order) and fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Grant {
    /// Issue order.
    pub id: u8,
    /// The fence.
    pub fence: u32,
    /// Whether it has written (each grant writes once: a second write of the same grant adds
    /// nothing to the orders checked, and would make the state space infinite).
    pub wrote: bool,
}

/// A state of the system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The service's counter: the last fence it issued (under [`Recovery::Epoch`], the last
    /// counter), as far as it remembers.
    pub counter: u32,
    /// The service's epoch ([`Recovery::Epoch`]; always 0 otherwise).
    pub epoch: u32,
    /// The grant holding the lock at the service, if any.
    pub lock: Option<u8>,
    /// The fence of every grant issued, by issue number.
    pub issued: Vec<u32>,
    /// What each client holds (a paused client's grant may have expired at the service).
    pub clients: Vec<Option<Grant>>,
    /// The store's watermark: the fence and grant of its last accepted write.
    pub watermark: Option<(u32, u8)>,
    /// The writes the store accepted, in order: (fence, grant).
    pub accepted: Vec<(u32, u8)>,
    /// Counter losses so far.
    pub losses: u8,
    /// A `lock_checked` grant was at or below the watermark it read.
    pub checked_below_watermark: bool,
    /// A grant after a repair was at or below a fence issued before it.
    pub repair_outranked: bool,
    /// `lock_checked` gave up after its two rounds.
    pub checked_gave_up: bool,
}

/// A step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Client `c` takes the free lock.
    Acquire(usize),
    /// Client `c` takes the free lock through `lock_checked`.
    AcquireChecked(usize),
    /// Client `c` releases its grant (the service frees the lock if the grant still holds it).
    Release(usize),
    /// Client `c` writes with its grant (it may have paused past its expiry).
    Write(usize),
    /// The service lets the lock go (its holder paused past the TTL).
    Expire,
    /// The service's counter falls back to this value (and its epoch to the second one), and
    /// its lock is lost.
    Lose(u32, u32),
}

impl FencingModel {
    /// The correct rules with `clients` clients, `max_grants` grants and `max_losses` losses.
    pub fn new(clients: usize, max_grants: usize, max_losses: u8) -> Self {
        FencingModel { clients, max_grants, max_losses, rules: Rules::Correct, recovery: Recovery::Counter }
    }

    /// The same model repairing with `recovery`.
    pub fn with_recovery(mut self, recovery: Recovery) -> Self {
        self.recovery = recovery;
        self
    }

    /// The same bounds with `rules`.
    pub fn with_rules(mut self, rules: Rules) -> Self {
        self.rules = rules;
        self
    }

    fn accepts(&self, watermark: Option<(u32, u8)>, grant: Grant) -> Verdict {
        match watermark {
            None => Verdict::Accept,
            Some((w, _)) if grant.fence > w => Verdict::Accept,
            Some((w, by)) if grant.fence == w => {
                if by == grant.id || self.rules == Rules::EqualFromAnyGrant {
                    Verdict::Accept
                } else {
                    Verdict::Duplicate
                }
            }
            Some(_) => Verdict::Stale,
        }
    }

    /// Moves the service's fences past `watermark`: the counter or the epoch.
    fn repair(&self, state: &mut State, watermark: u32) {
        match self.recovery {
            Recovery::Counter => {
                let floor = if self.rules == Rules::RepairWithoutGap { watermark } else { watermark + GAP };
                state.counter = state.counter.max(floor);
            }
            Recovery::Epoch => {
                let past = if self.rules == Rules::EpochNotPastTheWatermark { 0 } else { 1 };
                state.epoch = state.epoch.max(watermark / SPAN + past);
            }
        }
    }

    /// Issues a grant to client `c` (the lock must be free).
    fn grant(state: &mut State, c: usize) -> Grant {
        state.counter += 1;
        let fence = state.epoch * SPAN + state.counter;
        let id = u8::try_from(state.issued.len()).unwrap_or(u8::MAX);
        state.issued.push(fence);
        state.lock = Some(id);
        let grant = Grant { id, fence, wrote: false };
        state.clients[c] = Some(grant);
        grant
    }

    fn can_grant(&self, state: &State, c: usize) -> bool {
        state.lock.is_none() && state.clients[c].is_none() && state.issued.len() < self.max_grants
    }
}

enum Verdict {
    Accept,
    Duplicate,
    Stale,
}

impl Model for FencingModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            counter: 0,
            epoch: 0,
            lock: None,
            issued: Vec::new(),
            clients: vec![None; self.clients],
            watermark: None,
            accepted: Vec::new(),
            losses: 0,
            checked_below_watermark: false,
            repair_outranked: false,
            checked_gave_up: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for c in 0..self.clients {
            if self.can_grant(state, c) {
                actions.push(Action::Acquire(c));
                actions.push(Action::AcquireChecked(c));
            }
            if let Some(grant) = state.clients[c] {
                actions.push(Action::Release(c));
                if !grant.wrote {
                    actions.push(Action::Write(c));
                }
            }
        }
        if state.lock.is_some() {
            actions.push(Action::Expire);
        }
        if state.losses < self.max_losses {
            for to in 0..state.counter {
                for epoch in 0..=state.epoch {
                    actions.push(Action::Lose(to, epoch));
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Acquire(c) => {
                FencingModel::grant(&mut state, c);
            }
            Action::AcquireChecked(c) => {
                let watermark = state.watermark.map_or(0, |(w, _)| w);
                let mut repaired = false;
                let mut done = false;
                // Two rounds, as core's `checked`: the first may repair, the second must be clean.
                for _ in 0..2 {
                    let before = state.issued.iter().copied().max().unwrap_or(0);
                    let grant = FencingModel::grant(&mut state, c);
                    if repaired && grant.fence <= before {
                        state.repair_outranked = true;
                    }
                    let regressed = match self.rules {
                        Rules::CheckedRepairsOnlyBelow => grant.fence < watermark,
                        _ => grant.fence <= watermark,
                    };
                    if !regressed {
                        if grant.fence <= watermark {
                            state.checked_below_watermark = true;
                        }
                        done = true;
                        break;
                    }
                    // Give the grant back and move the counter on.
                    state.lock = None;
                    state.clients[c] = None;
                    self.repair(&mut state, watermark);
                    repaired = true;
                }
                if !done {
                    state.checked_gave_up = true;
                }
            }
            Action::Release(c) => {
                let grant = state.clients[c].take()?;
                if state.lock == Some(grant.id) {
                    state.lock = None;
                }
            }
            Action::Write(c) => {
                let grant = state.clients[c]?;
                match self.accepts(state.watermark, grant) {
                    Verdict::Accept => {
                        state.watermark = Some((grant.fence, grant.id));
                        state.accepted.push((grant.fence, grant.id));
                        state.clients[c] = Some(Grant { wrote: true, ..grant });
                    }
                    Verdict::Duplicate => {
                        // `FencedStoreExt::write` repairs the counter; this grant can never write.
                        self.repair(&mut state, grant.fence);
                        state.clients[c] = None;
                    }
                    Verdict::Stale => {
                        state.clients[c] = None;
                    }
                }
            }
            Action::Expire => {
                state.lock = None;
            }
            Action::Lose(to, epoch) => {
                state.counter = to;
                state.epoch = epoch;
                state.lock = None;
                state.losses += 1;
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::<Self>::always("fence order", |_, state: &State| {
                state.accepted.windows(2).all(|w| w[1].0 > w[0].0 || (w[1].0 == w[0].0 && w[1].1 == w[0].1))
            }),
            Property::<Self>::always("checked grant above the watermark", |_, state: &State| {
                !state.checked_below_watermark
            }),
            Property::<Self>::always("repair terminates", |_, state: &State| !state.checked_gave_up),
        ];
        if self.max_losses <= 1 {
            properties.push(Property::<Self>::always(Limit::RepairOutranks.property(), |_, state: &State| {
                Limit::RepairOutranks.holds(state)
            }));
        }
        if self.max_losses == 0 {
            properties.push(Property::<Self>::always(Limit::StaleAfterNewer.property(), |_, state: &State| {
                Limit::StaleAfterNewer.holds(state)
            }));
        }
        properties
    }
}

/// The properties that hold only with few counter losses: the limits of fencing over a lock
/// service that loses its counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `stale refused after newer write`, true without counter loss. After a loss, a grant
    /// issued before it that had not written yet can hold a higher fence than grants issued
    /// after it; nothing can see that until it writes, and then the store orders it after
    /// them.
    StaleAfterNewer,
    /// `repair outranks earlier grants`, true with one loss. The repair moves the counter
    /// relative to the watermark, the only fence it can know: if the counter is lost again
    /// before a repaired grant writes, the next repair can issue that grant's fence again. The
    /// store then refuses whichever of the two writes second as a duplicate (fence order holds)
    /// and the counter is repaired again.
    RepairOutranks,
}

impl Limit {
    /// The property's name.
    pub fn property(self) -> &'static str {
        match self {
            Limit::StaleAfterNewer => "stale refused after newer write",
            Limit::RepairOutranks => "repair outranks earlier grants",
        }
    }

    /// Whether `state` satisfies it.
    pub fn holds(self, state: &State) -> bool {
        match self {
            // No accepted write of a grant issued before one whose write was accepted earlier.
            Limit::StaleAfterNewer => state.accepted.windows(2).all(|w| w[1].1 >= w[0].1),
            Limit::RepairOutranks => !state.repair_outranked,
        }
    }
}

/// A run of `model` that breaks `limit`, as the steps that reach it; `None` if the checker
/// finds none within the bounds.
pub fn limit_counterexample(model: FencingModel, limit: Limit) -> Option<Vec<Action>> {
    use stateright::Checker;
    let checker = LimitModel(model, limit).checker().spawn_bfs().join();
    checker.discovery(limit.property()).map(|path| path.into_actions())
}

/// The model with only one limit's property, for [`limit_counterexample`].
struct LimitModel(FencingModel, Limit);

impl Model for LimitModel {
    type State = State;
    type Action = Action;
    fn init_states(&self) -> Vec<State> {
        self.0.init_states()
    }
    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        self.0.actions(state, actions);
    }
    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        self.0.next_state(last, action)
    }
    fn properties(&self) -> Vec<Property<Self>> {
        vec![Property::<Self>::always(self.1.property(), |model: &LimitModel, state: &State| model.1.holds(state))]
    }
}

/// What a check of a model found.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Distinct states explored.
    pub states: usize,
    /// The properties with a counterexample, each with the steps that reach it.
    pub violated: Vec<(&'static str, Vec<Action>)>,
}

/// Explores every state of `model` (breadth first) and checks its properties in each.
pub fn check(model: FencingModel) -> Outcome {
    use stateright::Checker;
    let names: Vec<&'static str> = model.properties().iter().map(|p| p.name).collect();
    let checker = model.checker().spawn_bfs().join();
    let violated =
        names.into_iter().filter_map(|name| checker.discovery(name).map(|path| (name, path.into_actions()))).collect();
    Outcome { states: checker.unique_state_count(), violated }
}
