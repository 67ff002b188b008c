//! The checker against histories known to be good and known to be bad, one per anomaly and
//! per way a correct history can look odd (an unknown outcome, a write delayed past another).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use palisade_history::{AnomalyKind, Bounds, Call, Event, History, Outcome, Verdict, check};

const BOUNDS: Bounds = Bounds { progress_ms: 5_000, allowance_ms: 1_000 };
const MS: u64 = 1_000_000;

/// Writes events by hand: times in milliseconds, one operation id per call.
#[derive(Default)]
struct Recorder {
    events: Vec<Event>,
    next: u64,
}

impl Recorder {
    fn op(&mut self, process: u32, from_ms: u64, to_ms: Option<u64>, call: Call, outcome: Outcome) -> &mut Self {
        self.next += 1;
        let op = self.next;
        self.events.push(Event::Invoke { process, op, at: from_ms * MS, within_ms: 1_000, call });
        if let Some(to) = to_ms {
            self.events.push(Event::Complete { process, op, at: to * MS, outcome });
        }
        self
    }

    fn write(
        &mut self,
        p: u32,
        span: (u64, Option<u64>),
        grant: &str,
        fence: u64,
        value: &str,
        outcome: Outcome,
    ) -> &mut Self {
        let call = Call::Write { resource: "r".into(), grant: grant.into(), fence, value: value.into() };
        self.op(p, span.0, span.1, call, outcome)
    }

    fn accepted(&mut self, p: u32, from: u64, to: u64, grant: &str, fence: u64, value: &str) -> &mut Self {
        self.write(p, (from, Some(to)), grant, fence, value, Outcome::Accepted)
    }

    fn read(&mut self, p: u32, from: u64, to: u64, value: Option<&str>) -> &mut Self {
        let outcome = Outcome::Value { value: value.map(str::to_string) };
        self.op(p, from, Some(to), Call::Read { resource: "r".into() }, outcome)
    }

    fn acquire(&mut self, p: u32, from: u64, to: u64, outcome: Outcome) -> &mut Self {
        self.op(p, from, Some(to), Call::Acquire { resource: "r".into(), ttl_ms: 1_000 }, outcome)
    }

    fn fault(&mut self, id: u64, from_ms: u64, to_ms: u64) -> &mut Self {
        self.events.push(Event::Fault { at: from_ms * MS, id, what: "pause p1".into(), loses_locks: false });
        self.events.push(Event::Healed { at: to_ms * MS, id });
        self
    }

    /// A fault in which the lock service loses its locks.
    fn lose_locks(&mut self, id: u64, from_ms: u64, to_ms: u64) -> &mut Self {
        self.events.push(Event::Fault { at: from_ms * MS, id, what: "lose locks".into(), loses_locks: true });
        self.events.push(Event::Healed { at: to_ms * MS, id });
        self
    }

    fn call(&mut self, p: u32, from: u64, to: u64, call: Call, outcome: Outcome) -> &mut Self {
        self.op(p, from, Some(to), call, outcome)
    }

    fn verdict(&self) -> Verdict {
        let history = History::from_events(self.events.clone()).expect("a well-formed history");
        check(&history, BOUNDS)
    }
}

fn kinds(v: &Verdict) -> Vec<AnomalyKind> {
    let mut k: Vec<AnomalyKind> = v.anomalies.iter().map(|a| a.kind).collect();
    k.sort();
    k.dedup();
    k
}

/// A grant, its lease safe until `safe_until_ms` where the recorder knew it.
fn granted(grant: &str, fence: u64, safe_until_ms: Option<u64>) -> Outcome {
    Outcome::Granted { grant: grant.into(), fence, safe_until: safe_until_ms.map(|t| t * MS) }
}

fn unknown() -> Outcome {
    Outcome::Unknown { error: "connection lost".into() }
}

#[test]
fn a_clean_handoff_is_valid() {
    let v = Recorder::default()
        .read(1, 0, 1, None)
        .accepted(1, 2, 3, "g1", 1, "a")
        .read(1, 4, 5, Some("a"))
        .accepted(1, 6, 7, "g1", 1, "b")
        .read(2, 10, 11, Some("b"))
        .accepted(2, 12, 13, "g2", 2, "c")
        .read(1, 14, 15, Some("c"))
        .verdict();
    assert!(v.valid(), "{:#?}", v.anomalies);
    assert_eq!((v.writes_accepted, v.reads), (3, 4));
}

#[test]
fn a_stale_holder_refused_is_valid_and_its_value_never_read() {
    let v = Recorder::default()
        .accepted(1, 0, 1, "g1", 1, "a")
        .accepted(2, 5, 6, "g2", 2, "b")
        .write(1, (7, Some(8)), "g1", 1, "late", Outcome::Stale)
        .read(3, 9, 10, Some("b"))
        .verdict();
    assert!(v.valid(), "{:#?}", v.anomalies);
}

#[test]
fn a_stale_write_accepted_is_a_fence_order_anomaly() {
    // The incident: the paused holder's write lands after the new holder's.
    let v = Recorder::default()
        .accepted(1, 0, 1, "g1", 1, "a")
        .accepted(2, 5, 6, "g2", 2, "b")
        .accepted(1, 7, 8, "g1", 1, "late")
        .verdict();
    assert!(kinds(&v).contains(&AnomalyKind::FenceOrder), "{:#?}", v.anomalies);
    assert!(kinds(&v).contains(&AnomalyKind::Exclusion), "{:#?}", v.anomalies);
    let order = v.anomalies.iter().find(|a| a.kind == AnomalyKind::FenceOrder).expect("reported");
    assert_eq!(order.witnesses.len(), 2, "the smallest window: the two writes");
    assert_eq!(order.window, (5 * MS, 8 * MS));
}

#[test]
fn writes_of_two_grants_interleaved_break_exclusion_even_with_plausible_fences() {
    // A lock service that granted one fence twice: fence order alone sees only equal fences.
    let v = Recorder::default()
        .accepted(1, 0, 1, "g1", 7, "a")
        .accepted(2, 2, 3, "g2", 7, "b")
        .accepted(1, 4, 5, "g1", 7, "c")
        .verdict();
    assert_eq!(kinds(&v), vec![AnomalyKind::DuplicateFence, AnomalyKind::Exclusion], "{:#?}", v.anomalies);
}

#[test]
fn concurrent_writes_may_land_in_either_order() {
    // Overlapping in real time, so the store may have applied fence 1 first: no anomaly.
    let v = Recorder::default()
        .accepted(1, 0, 10, "g1", 1, "a")
        .accepted(2, 5, 6, "g2", 2, "b")
        .read(3, 11, 12, Some("b"))
        .verdict();
    assert!(v.valid(), "{:#?}", v.anomalies);
}

#[test]
fn a_write_of_unknown_outcome_may_land_late_or_never() {
    let never = Recorder::default()
        .write(1, (0, None), "g1", 1, "lost", unknown())
        .accepted(2, 5, 6, "g2", 2, "b")
        .read(3, 7, 8, Some("b"))
        .verdict();
    assert!(never.valid(), "{:#?}", never.anomalies);
    let late = Recorder::default()
        .write(1, (0, Some(1)), "g1", 1, "slow", unknown())
        .accepted(1, 2, 3, "g1", 1, "next")
        .read(3, 7, 8, Some("slow"))
        .verdict();
    assert!(late.valid(), "an unknown write may land after a later one of its grant: {:#?}", late.anomalies);
}

#[test]
fn a_refusal_without_a_higher_fence_is_unjustified() {
    let v = Recorder::default()
        .accepted(1, 0, 1, "g1", 5, "a")
        .write(2, (2, Some(3)), "g2", 6, "b", Outcome::Stale)
        .verdict();
    assert_eq!(kinds(&v), vec![AnomalyKind::UnjustifiedRefusal], "{:#?}", v.anomalies);
    // A higher fence of unknown outcome begun before is cause enough.
    let v = Recorder::default()
        .write(1, (0, None), "g7", 7, "maybe", unknown())
        .write(2, (2, Some(3)), "g2", 6, "b", Outcome::Stale)
        .verdict();
    assert!(v.valid(), "{:#?}", v.anomalies);
    let v = Recorder::default()
        .accepted(1, 0, 1, "g1", 5, "a")
        .write(2, (2, Some(3)), "g2", 5, "b", Outcome::Duplicate)
        .write(1, (4, Some(5)), "g1", 5, "c", Outcome::Duplicate)
        .verdict();
    assert_eq!(v.anomalies.len(), 1, "only the same grant's refusal lacks a cause: {:#?}", v.anomalies);
    assert_eq!(v.anomalies[0].witnesses[0].process, 1);
}

#[test]
fn a_refused_write_that_is_read_is_a_phantom() {
    let v = Recorder::default()
        .accepted(2, 0, 1, "g2", 2, "b")
        .write(1, (2, Some(3)), "g1", 1, "stale", Outcome::Stale)
        .read(3, 4, 5, Some("stale"))
        .verdict();
    assert_eq!(kinds(&v), vec![AnomalyKind::PhantomRead], "{:#?}", v.anomalies);
}

#[test]
fn a_value_nobody_wrote_or_read_before_its_write_is_a_phantom() {
    let v = Recorder::default().read(1, 0, 1, Some("ghost")).verdict();
    assert_eq!(kinds(&v), vec![AnomalyKind::PhantomRead]);
    let v = Recorder::default().read(1, 0, 1, Some("a")).accepted(2, 2, 3, "g2", 1, "a").verdict();
    assert!(kinds(&v).contains(&AnomalyKind::PhantomRead), "{:#?}", v.anomalies);
}

#[test]
fn a_lost_acknowledged_write_is_not_linearizable() {
    // "b" was acknowledged before the read began, yet the read sees the older "a".
    let v = Recorder::default()
        .accepted(1, 0, 1, "g1", 1, "a")
        .accepted(2, 2, 3, "g2", 2, "b")
        .read(3, 4, 5, Some("a"))
        .verdict();
    assert_eq!(kinds(&v), vec![AnomalyKind::Register], "{:#?}", v.anomalies);
}

#[test]
fn an_old_value_coming_back_is_not_linearizable() {
    // A write applied twice (a resend after its acknowledgement): "a" reappears after "b".
    let v = Recorder::default()
        .accepted(1, 0, 1, "g1", 1, "a")
        .read(3, 2, 3, Some("a"))
        .accepted(1, 4, 5, "g1", 1, "b")
        .read(3, 6, 7, Some("b"))
        .read(3, 8, 9, Some("a"))
        .verdict();
    assert_eq!(kinds(&v), vec![AnomalyKind::Register], "{:#?}", v.anomalies);
}

#[test]
fn an_empty_read_after_an_acknowledged_write_is_not_linearizable() {
    let v = Recorder::default().accepted(1, 0, 1, "g1", 1, "a").read(2, 2, 3, None).verdict();
    assert_eq!(kinds(&v), vec![AnomalyKind::Register], "{:#?}", v.anomalies);
}

#[test]
fn no_progress_after_the_last_heal_is_an_anomaly() {
    let stuck = Recorder::default()
        .fault(1, 0, 10)
        .acquire(1, 11, 12, Outcome::Refused)
        .acquire(1, 13, 14, Outcome::Refused)
        .acquire(1, 9_000, 9_001, Outcome::Refused)
        .verdict();
    assert_eq!(kinds(&stuck), vec![AnomalyKind::NoProgress], "{:#?}", stuck.anomalies);
    let live = Recorder::default()
        .fault(1, 0, 10)
        .acquire(1, 11, 12, granted("g1", 1, None))
        .accepted(1, 13, 14, "g1", 1, "a")
        .verdict();
    assert!(live.valid(), "{:#?}", live.anomalies);
}

/// The bound runs from the first acquire asked for after the heal: a resource nobody asked for
/// until after heal + bound (found by a 30-minute etcd × DynamoDB run, where r2's first ask
/// came 13.8 s after the heal, past the 13 s bound) could not have progressed by then.
#[test]
fn progress_is_owed_from_the_first_ask_after_the_heal() {
    let late_but_live = Recorder::default()
        .fault(1, 0, 10)
        .acquire(1, 6_000, 6_001, granted("g1", 1, None))
        .accepted(1, 6_002, 6_003, "g1", 1, "a")
        .acquire(2, 11_500, 11_501, Outcome::Refused)
        .verdict();
    assert!(late_but_live.valid(), "{:#?}", late_but_live.anomalies);
    let late_and_stuck = Recorder::default()
        .fault(1, 0, 10)
        .acquire(1, 6_000, 6_001, Outcome::Refused)
        .acquire(1, 9_000, 9_001, Outcome::Refused)
        .acquire(1, 11_500, 11_501, Outcome::Refused)
        .verdict();
    assert_eq!(kinds(&late_and_stuck), vec![AnomalyKind::NoProgress], "{:#?}", late_and_stuck.anomalies);
    // Asked for too near the end for its bound to have passed: the history cannot say.
    let too_late_to_judge = Recorder::default()
        .fault(1, 0, 10)
        .acquire(1, 6_000, 6_001, Outcome::Refused)
        .acquire(1, 9_000, 9_001, Outcome::Refused)
        .verdict();
    assert!(too_late_to_judge.valid(), "{:#?}", too_late_to_judge.anomalies);
}

#[test]
fn a_call_past_its_bound_after_the_heal_is_unbounded() {
    let v = Recorder::default()
        .fault(1, 0, 10)
        .acquire(1, 11, 12, granted("g1", 1, None))
        .accepted(1, 13, 5_000, "g1", 1, "a")
        .verdict();
    assert_eq!(kinds(&v), vec![AnomalyKind::Unbounded], "{:#?}", v.anomalies);
}

#[test]
fn a_malformed_history_is_refused_not_judged() {
    let e = History::from_events([Event::Complete { process: 1, op: 1, at: 1, outcome: Outcome::Accepted }]);
    assert!(e.is_err());
    let lines = "{\"ev\":\"invoke\",\"process\":1,\"op\":1,\"at\":5,\"within_ms\":10,\"call\":{\"call\":\"read\",\"resource\":\"r\"}}\n\
                 {\"ev\":\"complete\",\"process\":1,\"op\":1,\"at\":6,\"outcome\":{\"outcome\":\"value\",\"value\":\"x\"}}\n";
    let h = History::from_json_lines(lines).expect("JSON lines");
    assert_eq!(h.operations.len(), 1);
    assert!(History::from_json_lines("not json").is_err());
}

/// The zone test against brute force: small random histories of writes (some of unknown
/// outcome) and reads, each judged by trying every order consistent with real time; the
/// checker must agree on every one.
#[test]
fn the_register_check_agrees_with_brute_force() {
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut bad = 0;
    for _ in 0..20_000 {
        let mut ops: Vec<Op> = Vec::new();
        let writes = 1 + next(3) as usize;
        for w in 0..writes {
            let from = next(20);
            ops.push(Op { from, to: from + 1 + next(6), write: true, value: w + 1, unknown: next(4) == 0 });
        }
        for _ in 0..(1 + next(4)) {
            let from = next(24);
            let value = next(writes as u64 + 1) as usize;
            ops.push(Op { from, to: from + 1 + next(4), write: false, value, unknown: false });
        }
        let mut r = Recorder::default();
        for (i, op) in ops.iter().enumerate() {
            let p = i as u32 + 1;
            if op.write {
                let outcome = if op.unknown { unknown() } else { Outcome::Accepted };
                r.write(p, (op.from, Some(op.to)), &format!("g{p}"), 0, &format!("v{}", op.value), outcome);
            } else {
                r.read(p, op.from, op.to, (op.value > 0).then(|| format!("v{}", op.value)).as_deref());
            }
        }
        let v = r.verdict();
        let checker = !kinds(&v).iter().any(|k| matches!(k, AnomalyKind::Register | AnomalyKind::PhantomRead));
        let brute = linearizable(&ops);
        assert_eq!(checker, brute, "checker and brute force disagree on {ops:?}: {:#?}", v.anomalies);
        bad += usize::from(!brute);
    }
    assert!(bad > 2_000, "the random histories include bad ones ({bad})");
}

#[derive(Debug, Clone, Copy)]
struct Op {
    from: u64,
    to: u64,
    write: bool,
    value: usize,
    /// A write of unknown outcome: it may never take effect, or take effect at any time after
    /// `from`.
    unknown: bool,
}

/// Tries every order consistent with real time.
fn linearizable(ops: &[Op]) -> bool {
    fn go(ops: &[Op], done: &mut Vec<bool>, value: usize) -> bool {
        let pending = || ops.iter().zip(done.iter()).filter(|(o, d)| !**d && !o.unknown);
        if pending().next().is_none() {
            return true; // the unknown writes left never happened
        }
        // The next operation can be any pending one that no pending one wholly precedes.
        let min_complete = pending().map(|(o, _)| o.to).min().unwrap_or(u64::MAX);
        for i in 0..ops.len() {
            let op = ops[i];
            if done[i] || op.from > min_complete || (!op.write && op.value != value) {
                continue;
            }
            done[i] = true;
            if go(ops, done, if op.write { op.value } else { value }) {
                return true;
            }
            done[i] = false;
        }
        false
    }
    go(ops, &mut vec![false; ops.len()], 0)
}

#[test]
fn a_lease_granted_while_another_is_safe_is_an_overlap_once_both_write() {
    // A lock that expires early on the server: the second holder gets it 300 ms into the
    // first one's 1 s lease, and both write; the store orders their writes by fence, so only
    // the leases show it.
    let early = Recorder::default()
        .acquire(1, 0, 1, granted("g1", 1, Some(990)))
        .accepted(1, 2, 3, "g1", 1, "a")
        .acquire(2, 100, 300, granted("g2", 2, Some(1290)))
        .accepted(2, 301, 302, "g2", 2, "b")
        .verdict();
    assert_eq!(kinds(&early), vec![AnomalyKind::Overlap], "{:#?}", early.anomalies);
    assert_eq!(early.anomalies[0].witnesses.len(), 4, "both acquires and a write of each");
    // The same holds, but the first never wrote: nothing acted twice.
    let idle = Recorder::default()
        .acquire(1, 0, 1, granted("g1", 1, Some(990)))
        .acquire(2, 100, 300, granted("g2", 2, Some(1290)))
        .accepted(2, 301, 302, "g2", 2, "b")
        .verdict();
    assert!(idle.valid(), "{:#?}", idle.anomalies);
}

#[test]
fn a_handoff_after_release_or_expiry_is_no_overlap() {
    let release = |grant: &str| Call::Release { resource: "r".into(), grant: grant.into() };
    let v = Recorder::default()
        .acquire(1, 0, 1, granted("g1", 1, Some(990)))
        .accepted(1, 2, 3, "g1", 1, "a")
        .call(1, 10, 11, release("g1"), Outcome::Done { safe_until: None })
        .acquire(2, 5, 12, granted("g2", 2, Some(1000)))
        .accepted(2, 13, 14, "g2", 2, "b")
        // Expiry: the next holder is granted after g2's safe_until.
        .acquire(3, 500, 1001, granted("g3", 3, Some(2000)))
        .accepted(3, 1002, 1003, "g3", 3, "c")
        .verdict();
    assert!(v.valid(), "{:#?}", v.anomalies);
}

#[test]
fn an_extend_moves_a_lease_safe_until() {
    let extend = |grant: &str| Call::Extend { resource: "r".into(), grant: grant.into() };
    let v = Recorder::default()
        .acquire(1, 0, 1, granted("g1", 1, Some(990)))
        .accepted(1, 2, 3, "g1", 1, "a")
        .call(1, 500, 501, extend("g1"), Outcome::Done { safe_until: Some(1490 * MS) })
        .acquire(2, 100, 1200, granted("g2", 2, Some(2200)))
        .accepted(2, 1201, 1202, "g2", 2, "b")
        .verdict();
    assert_eq!(kinds(&v), vec![AnomalyKind::Overlap], "{:#?}", v.anomalies);
}

#[test]
fn lost_locks_excuse_an_overlap_across_the_loss_only() {
    let history = |lost_at: u64| {
        let mut r = Recorder::default();
        r.lose_locks(1, lost_at, lost_at + 50)
            .acquire(1, 0, 1, granted("g1", 1, Some(990)))
            .accepted(1, 2, 3, "g1", 1, "a")
            .acquire(2, 100, 300, granted("g2", 2, Some(1290)))
            .accepted(2, 301, 302, "g2", 2, "b");
        r.verdict()
    };
    // The service lost g1's lock at 200 ms: g2's grant at 300 ms is what a service without
    // its data does, and only fences keep the two apart.
    let across = history(200);
    assert!(across.anomalies.iter().all(|a| a.kind != AnomalyKind::Overlap), "{:#?}", across.anomalies);
    // Lost after both were granted: no excuse.
    let after = history(400);
    assert!(after.anomalies.iter().any(|a| a.kind == AnomalyKind::Overlap), "{:#?}", after.anomalies);
}

#[test]
fn grants_recorded_without_safe_until_are_not_judged_for_overlap() {
    let v = Recorder::default()
        .acquire(1, 0, 1, granted("g1", 1, None))
        .accepted(1, 2, 3, "g1", 1, "a")
        .acquire(2, 100, 300, granted("g2", 2, None))
        .accepted(2, 301, 302, "g2", 2, "b")
        .verdict();
    assert!(v.valid(), "{:#?}", v.anomalies);
}

// The warehouse's allocations: a SKU "s" restocked to 100 units, attempts of jobs, stock reads,
// and the audit read once the clients have stopped.

fn restock(r: &mut Recorder) -> &mut Recorder {
    r.call(0, 0, 1, Call::Restock { resource: "s".into(), qty: 100 }, Outcome::Accepted)
}

fn allocate<'r>(
    r: &'r mut Recorder,
    p: u32,
    span: (u64, Option<u64>),
    (grant, fence): (&str, u64),
    (job, attempt, qty): (&str, &str, i64),
    outcome: Outcome,
) -> &'r mut Recorder {
    let call = Call::Allocate {
        resource: "s".into(),
        grant: grant.into(),
        fence,
        job: job.into(),
        attempt: attempt.into(),
        qty,
    };
    r.op(p, span.0, span.1, call, outcome)
}

fn stock_read(r: &mut Recorder, p: u32, from: u64, to: u64, qty: i64) -> &mut Recorder {
    r.call(p, from, to, Call::Stock { resource: "s".into() }, Outcome::Units { qty: Some(qty) })
}

fn audit<'r>(r: &'r mut Recorder, at: u64, jobs: &[(&str, &[&str])]) -> &'r mut Recorder {
    let jobs = jobs.iter().map(|(j, a)| (j.to_string(), a.iter().map(|a| a.to_string()).collect())).collect();
    r.call(0, at, at + 1, Call::Audit { resource: "s".into() }, Outcome::Audited { jobs })
}

/// Two holders one after the other; the second retries the first's job and finds it done, a
/// stale third is refused, and an attempt of unknown outcome landed (the audit says so).
fn good_allocations() -> Recorder {
    let mut r = Recorder::default();
    restock(&mut r);
    allocate(&mut r, 1, (10, Some(12)), ("g1", 1), ("j1", "a1", 3), Outcome::Accepted);
    stock_read(&mut r, 1, 13, 14, 97);
    allocate(&mut r, 2, (20, Some(22)), ("g2", 2), ("j1", "a2", 3), Outcome::AlreadyDone);
    allocate(&mut r, 2, (23, Some(25)), ("g2", 2), ("j2", "a3", 2), unknown());
    allocate(&mut r, 1, (26, Some(27)), ("g1", 1), ("j3", "a4", 5), Outcome::Stale);
    stock_read(&mut r, 3, 30, 31, 95);
    audit(&mut r, 40, &[("j1", &["a1"]), ("j2", &["a3"])]);
    stock_read(&mut r, 0, 42, 43, 95);
    r
}

#[test]
fn allocations_audited_and_counted_are_valid() {
    let v = good_allocations().verdict();
    assert!(v.valid(), "{:#?}", v.anomalies);
    assert_eq!(v.allocations_applied, 2);
    assert_eq!((v.writes_accepted, v.writes_refused, v.writes_unknown), (1, 2, 1));
}

#[test]
fn a_job_applied_by_two_attempts_is_a_double_allocation() {
    let mut r = Recorder::default();
    restock(&mut r);
    allocate(&mut r, 1, (10, Some(12)), ("g1", 1), ("j1", "a1", 3), Outcome::Accepted);
    allocate(&mut r, 2, (20, Some(22)), ("g2", 2), ("j1", "a2", 3), Outcome::Accepted);
    audit(&mut r, 40, &[("j1", &["a1", "a2"])]);
    stock_read(&mut r, 0, 42, 43, 94);
    let v = r.verdict();
    assert_eq!(kinds(&v), vec![AnomalyKind::DoubleAllocation], "{:#?}", v.anomalies);
    assert!(v.anomalies[0].message.contains("j1"), "{}", v.anomalies[0]);
}

#[test]
fn an_audit_that_disagrees_with_the_answers_is_an_anomaly() {
    // Acknowledged but missing; refused but present; present but never made.
    for (audited, outcome) in [
        (&[][..], Outcome::Accepted),
        (&["a1"][..], Outcome::Stale),
        (&["a1"][..], Outcome::AlreadyDone),
        (&["a1", "a9"][..], Outcome::Accepted),
    ] {
        let mut r = Recorder::default();
        allocate(&mut r, 1, (10, Some(12)), ("g1", 1), ("j1", "a1", 3), outcome.clone());
        let jobs: Vec<(&str, &[&str])> =
            audited.iter().map(|a| if *a == "a1" { ("j1", &["a1"][..]) } else { ("j9", &["a9"][..]) }).collect();
        audit(&mut r, 40, &jobs);
        let v = r.verdict();
        assert!(kinds(&v).contains(&AnomalyKind::Audit), "{outcome:?} audited as {audited:?}: {:#?}", v.anomalies);
    }
}

#[test]
fn a_job_found_done_with_no_earlier_attempt_landed_is_an_unjustified_refusal() {
    let mut r = Recorder::default();
    allocate(&mut r, 2, (5, Some(6)), ("g2", 2), ("j1", "a2", 3), Outcome::AlreadyDone);
    allocate(&mut r, 1, (10, Some(12)), ("g1", 1), ("j1", "a1", 3), Outcome::Accepted);
    audit(&mut r, 40, &[("j1", &["a1"])]);
    let v = r.verdict();
    assert_eq!(kinds(&v), vec![AnomalyKind::UnjustifiedRefusal], "{:#?}", v.anomalies);
}

#[test]
fn a_stock_no_order_of_allocations_explains_is_an_anomaly() {
    // Too high after an acknowledged allocation (a lost decrement), too low before any began
    // (a decrement applied twice, or units taken by nobody's attempt).
    for (from, seen) in [(13, 100), (5, 97)] {
        let mut r = Recorder::default();
        restock(&mut r);
        allocate(&mut r, 1, (10, Some(12)), ("g1", 1), ("j1", "a1", 3), Outcome::Accepted);
        stock_read(&mut r, 2, from, from + 1, seen);
        audit(&mut r, 40, &[("j1", &["a1"])]);
        let v = r.verdict();
        assert_eq!(kinds(&v), vec![AnomalyKind::Stock], "read at {from} ms saw {seen}: {:#?}", v.anomalies);
    }
    // While the allocation runs, either level is fine.
    for seen in [100, 97] {
        let mut r = Recorder::default();
        restock(&mut r);
        allocate(&mut r, 1, (10, Some(12)), ("g1", 1), ("j1", "a1", 3), Outcome::Accepted);
        stock_read(&mut r, 2, 11, 11, seen);
        audit(&mut r, 40, &[("j1", &["a1"])]);
        assert!(r.verdict().valid(), "{seen} during the allocation");
    }
}

#[test]
fn allocations_are_writes_to_the_fence_checks() {
    // A stale holder's allocation applied after the newer holder's: fence order.
    let mut r = Recorder::default();
    restock(&mut r);
    allocate(&mut r, 2, (20, Some(22)), ("g2", 2), ("j2", "a2", 1), Outcome::Accepted);
    allocate(&mut r, 1, (30, Some(32)), ("g1", 1), ("j3", "a3", 1), Outcome::Accepted);
    audit(&mut r, 40, &[("j2", &["a2"]), ("j3", &["a3"])]);
    let v = r.verdict();
    assert!(kinds(&v).contains(&AnomalyKind::FenceOrder), "{:#?}", v.anomalies);
    // A stale refusal with nothing higher begun: unjustified.
    let mut r = Recorder::default();
    allocate(&mut r, 1, (10, Some(12)), ("g1", 1), ("j1", "a1", 1), Outcome::Stale);
    audit(&mut r, 40, &[]);
    assert_eq!(kinds(&r.verdict()), vec![AnomalyKind::UnjustifiedRefusal]);
}
