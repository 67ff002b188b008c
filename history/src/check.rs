//! The checker: what must hold of any history of a correct lock service and fenced store,
//! judged from the history alone.
//!
//! Per resource (each resource's lock and register are independent, so each is checked alone,
//! as in P-compositional checking):
//!
//! - **fence order**: take the writes the store applied (accepted, or of unknown outcome but
//!   read by someone). If one completed before another began, the later one's fence is not
//!   lower. One fence is applied from one grant only (rule 2 of fencing: an equal fence from
//!   another grant is a duplicate the store refuses).
//! - **exclusion**: no grant's applied writes surround another grant's applied write in real
//!   time (grant A wrote, then B wrote, then A wrote again). It judges holds by writes alone,
//!   not by fences, so it still speaks if fences are wrong.
//! - **overlap**: no two grants whose leases were safe at the same moment both had a write
//!   applied. A lease is safe from its acquire's completion until the `safe_until` its holder
//!   was told (moved by each extend), or until its release began. Only a fault in which the
//!   lock service lost its locks excuses an overlap of grants taken on either side of it;
//!   then only the store's fence check keeps them apart.
//! - **register**: the register is linearizable. Values are unique, so each read names its
//!   write; a write of unknown outcome that nobody read may not have happened, one that was
//!   read happened at some moment after its invocation (Jepsen's `:info`). A write the store
//!   refused is never read. The test is the zone test for a register whose values are written
//!   once (Gibbons and Korach; Anderson et al., "What consistency does your key-value store
//!   actually provide?"): each value's writes and reads form a cluster whose zone runs from
//!   its earliest completion to its latest invocation; the history is linearizable if and only
//!   if no two forward zones overlap and no backward zone lies inside a forward one.
//! - **allocations** (a SKU of the warehouse: its stock and its audit): the audit, read once
//!   the clients have stopped, names the attempts applied. No job is applied twice; every
//!   acknowledged attempt is in it and no refused one; a job found already done was applied
//!   by an attempt that began before; and every stock read lies between the initial stock
//!   less every applied attempt that began before the read ended, and the initial stock less
//!   every applied attempt that ended before the read began (a counter's linearizability:
//!   each applied attempt takes its units at one moment inside its call). Applied attempts
//!   are the SKU's writes for the fence order, exclusion and overlap checks.
//! - **progress**: once the last fault has healed, every resource asked for sees a write (or
//!   an allocation) accepted within the stated bound of its first acquire after the heal (a
//!   resource first asked for too near the end of the history is not judged).
//! - **bounded calls**: every operation invoked after the last fault healed answers within
//!   its promised bound plus the allowance, unless its process was killed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use serde::Serialize;

use crate::model::{Call, History, Operation, Outcome, Time};

/// What the checker allows for, stated by whoever ran the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Bounds {
    /// After the last heal, a write accepted on every resource within this long (derived from
    /// the lock TTL, the service's `expiry_delay` and the acquire's wait).
    pub progress_ms: u64,
    /// Added to each operation's own promised bound for the bounded-calls check (scheduling,
    /// a loaded machine).
    pub allowance_ms: u64,
}

/// What an anomaly breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AnomalyKind {
    /// A lower fence applied after a higher one had been.
    FenceOrder,
    /// One fence applied from two grants.
    DuplicateFence,
    /// Two grants' writes interleaved.
    Exclusion,
    /// Two grants' leases were safe at the same moment, and both wrote: the lock service let
    /// two holders act at once.
    Overlap,
    /// The register is not linearizable.
    Register,
    /// A read returned a value nobody wrote, a value whose write the store refused, or a value
    /// before its write began.
    PhantomRead,
    /// No write accepted on a resource within the bound after the last heal.
    NoProgress,
    /// An operation did not answer within its bound, nothing being faulted.
    Unbounded,
    /// The store refused a write as stale (or as a duplicate) though no write that could have
    /// raised its watermark that far had begun, or found a job already done that no earlier
    /// attempt had applied: a holder turned away for nothing.
    UnjustifiedRefusal,
    /// One job applied by two attempts: a duplicate shipment, the incident's harm.
    DoubleAllocation,
    /// The audit disagrees with the answers: an acknowledged allocation missing from it, a
    /// refused one in it, or an attempt nobody made.
    Audit,
    /// A stock read that no order of the applied allocations explains.
    Stock,
}

impl fmt::Display for AnomalyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AnomalyKind::FenceOrder => "fence order",
            AnomalyKind::DuplicateFence => "duplicate fence",
            AnomalyKind::Exclusion => "exclusion",
            AnomalyKind::Overlap => "overlapping holds",
            AnomalyKind::Register => "register not linearizable",
            AnomalyKind::PhantomRead => "phantom read",
            AnomalyKind::NoProgress => "no progress after heal",
            AnomalyKind::Unbounded => "unbounded call",
            AnomalyKind::UnjustifiedRefusal => "unjustified refusal",
            AnomalyKind::DoubleAllocation => "job allocated twice",
            AnomalyKind::Audit => "audit disagrees",
            AnomalyKind::Stock => "stock not explained",
        })
    }
}

/// Something the history shows that a correct system never does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Anomaly {
    /// What it breaks.
    pub kind: AnomalyKind,
    /// The resource it was found on.
    pub resource: String,
    /// What happened, in words.
    pub message: String,
    /// The operations that show it: the smallest set the check found.
    pub witnesses: Vec<Operation>,
    /// The window of the history the witnesses span.
    pub window: (Time, Time),
}

impl Anomaly {
    fn new(kind: AnomalyKind, resource: &str, message: String, witnesses: Vec<&Operation>) -> Anomaly {
        let start = witnesses.iter().map(|o| o.invoked).min().unwrap_or(0);
        let end = witnesses.iter().map(|o| o.completed.unwrap_or(o.invoked)).max().unwrap_or(start);
        Anomaly {
            kind,
            resource: resource.to_string(),
            message,
            witnesses: witnesses.into_iter().cloned().collect(),
            window: (start, end.max(start)),
        }
    }
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} on {}: {}", self.kind, self.resource, self.message)?;
        for op in &self.witnesses {
            writeln!(f, "    {op}")?;
        }
        Ok(())
    }
}

/// What the checker found, and what it looked at.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Verdict {
    /// Operations in the history.
    pub operations: usize,
    /// Resources they touched.
    pub resources: usize,
    /// Grants made (acquires granted).
    pub grants: usize,
    /// Writes the store accepted.
    pub writes_accepted: usize,
    /// Writes the store refused (stale or duplicate fence, or another certain refusal).
    pub writes_refused: usize,
    /// Writes of unknown outcome.
    pub writes_unknown: usize,
    /// Reads answered.
    pub reads: usize,
    /// Allocations applied (as the audit says, or acknowledged where there is no audit); each
    /// allocation attempt also counts as a write above.
    pub allocations_applied: usize,
    /// What the checker found.
    pub anomalies: Vec<Anomaly>,
}

impl Verdict {
    /// No anomaly.
    pub fn valid(&self) -> bool {
        self.anomalies.is_empty()
    }
}

/// Judges `history`.
pub fn check(history: &History, bounds: Bounds) -> Verdict {
    let mut by_resource: BTreeMap<&str, Vec<&Operation>> = BTreeMap::new();
    for op in &history.operations {
        by_resource.entry(op.call.resource()).or_default().push(op);
    }
    let mut verdict =
        Verdict { operations: history.operations.len(), resources: by_resource.len(), ..Verdict::default() };
    for op in &history.operations {
        match (&op.call, &op.outcome) {
            (Call::Acquire { .. }, Some(Outcome::Granted { .. })) => verdict.grants += 1,
            (Call::Write { .. } | Call::Allocate { .. }, Some(Outcome::Accepted)) => verdict.writes_accepted += 1,
            (Call::Write { .. } | Call::Allocate { .. }, None | Some(Outcome::Unknown { .. })) => {
                verdict.writes_unknown += 1
            }
            (Call::Write { .. } | Call::Allocate { .. }, Some(_)) => verdict.writes_refused += 1,
            (Call::Read { .. }, Some(Outcome::Value { .. })) | (Call::Stock { .. }, Some(Outcome::Units { .. })) => {
                verdict.reads += 1
            }
            _ => {}
        }
    }
    for (resource, ops) in &by_resource {
        let mut applied = register(resource, ops, &mut verdict.anomalies);
        let allocated = allocations(resource, ops, &mut verdict.anomalies);
        verdict.allocations_applied += allocated.len();
        applied.extend(allocated);
        fence_order(resource, &applied, &mut verdict.anomalies);
        refusals(resource, ops, &mut verdict.anomalies);
        exclusion(resource, &applied, &mut verdict.anomalies);
        overlap(resource, ops, &applied, history, &mut verdict.anomalies);
    }
    progress(history, &by_resource, bounds, &mut verdict.anomalies);
    bounded(history, bounds, &mut verdict.anomalies);
    verdict
}

/// A write the store applied: accepted, or of unknown outcome and read.
struct Applied<'h> {
    op: &'h Operation,
    grant: &'h str,
    fence: u64,
}

/// The register check; returns the writes that were applied.
fn register<'h>(resource: &str, ops: &[&'h Operation], anomalies: &mut Vec<Anomaly>) -> Vec<Applied<'h>> {
    let mut writes: HashMap<&str, &Operation> = HashMap::new();
    let mut reads: HashMap<Option<&str>, Vec<&Operation>> = HashMap::new();
    for op in ops {
        match (&op.call, &op.outcome) {
            (Call::Write { value, .. }, _) => {
                if let Some(first) = writes.insert(value.as_str(), op) {
                    anomalies.push(Anomaly::new(
                        AnomalyKind::Register,
                        resource,
                        format!("the value {value:?} was written twice: the history cannot name its reads' write"),
                        vec![first, op],
                    ));
                }
            }
            (Call::Read { .. }, Some(Outcome::Value { value })) => reads.entry(value.as_deref()).or_default().push(op),
            _ => {}
        }
    }
    // Each cluster: a value's write (or the initial empty register, written before time began)
    // and the reads that returned it.
    struct Cluster<'h> {
        value: Option<&'h str>,
        write: Option<&'h Operation>,
        min_complete: Time,
        max_invoke: Time,
        /// The operations that fix each end (for the report).
        at_min: Option<&'h Operation>,
        at_max: Option<&'h Operation>,
    }
    let mut clusters: Vec<Cluster<'h>> = Vec::new();
    let mut applied = Vec::new();
    let mut read_values: BTreeSet<&str> = BTreeSet::new();
    for (value, rs) in &reads {
        let Some(v) = value else { continue };
        read_values.insert(v);
        let Some(write) = writes.get(v) else {
            anomalies.push(Anomaly::new(
                AnomalyKind::PhantomRead,
                resource,
                format!("a read returned {v:?}, which no operation wrote"),
                vec![rs[0]],
            ));
            continue;
        };
        if !matches!(write.outcome, None | Some(Outcome::Accepted | Outcome::Unknown { .. })) {
            anomalies.push(Anomaly::new(
                AnomalyKind::PhantomRead,
                resource,
                format!("a read returned {v:?}, whose write the store refused"),
                vec![write, rs[0]],
            ));
        }
        if let Some(early) = rs.iter().find(|r| r.completed_or_never() < write.invoked) {
            anomalies.push(Anomaly::new(
                AnomalyKind::PhantomRead,
                resource,
                format!("a read returned {v:?} before its write began"),
                vec![early, write],
            ));
        }
    }
    for op in ops {
        if let (Call::Write { value, grant, fence, .. }, outcome) = (&op.call, &op.outcome) {
            let taken = match outcome {
                Some(Outcome::Accepted) => true,
                None | Some(Outcome::Unknown { .. }) => read_values.contains(value.as_str()),
                Some(_) => false,
            };
            if taken {
                applied.push(Applied { op, grant, fence: *fence });
                clusters.push(Cluster {
                    value: Some(value),
                    write: Some(op),
                    min_complete: op.effect_by(),
                    max_invoke: op.invoked,
                    at_min: Some(op),
                    at_max: Some(op),
                });
            }
        }
    }
    let initial = Cluster { value: None, write: None, min_complete: 0, max_invoke: 0, at_min: None, at_max: None };
    clusters.push(initial);
    let index: HashMap<Option<&str>, usize> = clusters.iter().enumerate().map(|(i, c)| (c.value, i)).collect();
    for (value, rs) in &reads {
        let Some(&i) = index.get(value) else { continue };
        let c = &mut clusters[i];
        for r in rs {
            if r.completed_or_never() < c.min_complete {
                c.min_complete = r.completed_or_never();
                c.at_min = Some(r);
            }
            if r.invoked > c.max_invoke {
                c.max_invoke = r.invoked;
                c.at_max = Some(r);
            }
        }
    }
    let shown = |c: &Cluster<'_>| match c.value {
        Some(v) => format!("{v:?}"),
        None => "the empty register".to_string(),
    };
    let witnesses = |c: &Cluster<'h>| -> Vec<&'h Operation> {
        let mut w: Vec<&'h Operation> = c.write.into_iter().chain(c.at_min).chain(c.at_max).collect();
        w.sort_by_key(|o| (o.process, o.op));
        w.dedup_by_key(|o| (o.process, o.op));
        w
    };
    // Forward zones [min_complete, max_invoke], backward zones [max_invoke, min_complete].
    let mut forward: Vec<&Cluster<'_>> = clusters.iter().filter(|c| c.min_complete < c.max_invoke).collect();
    forward.sort_by_key(|c| c.min_complete);
    for pair in forward.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.min_complete < a.max_invoke {
            let mut w = witnesses(a);
            w.extend(witnesses(b));
            anomalies.push(Anomaly::new(
                AnomalyKind::Register,
                resource,
                format!(
                    "{} and {} were each read after the other was already visible: no order of the writes \
                     explains both",
                    shown(a),
                    shown(b)
                ),
                w,
            ));
        }
    }
    for c in clusters.iter().filter(|c| c.min_complete >= c.max_invoke) {
        // The forward zone that starts last before this backward zone does.
        // The empty register's cluster begins before time does, so it starts before any zone.
        let i = forward.partition_point(|f| f.value.is_none() || f.min_complete < c.max_invoke);
        if i == 0 {
            continue;
        }
        let f = forward[i - 1];
        if !std::ptr::eq(f, c) && c.min_complete < f.max_invoke {
            let mut w = witnesses(f);
            w.extend(witnesses(c));
            anomalies.push(Anomaly::new(
                AnomalyKind::Register,
                resource,
                format!(
                    "{} was written and read entirely while {} was visible before and after it: a read missed a \
                     newer write, or an older value came back",
                    shown(c),
                    shown(f)
                ),
                w,
            ));
        }
    }
    applied
}

fn fence_order(resource: &str, applied: &[Applied<'_>], anomalies: &mut Vec<Anomaly>) {
    let mut grants_of: BTreeMap<u64, Vec<&Applied<'_>>> = BTreeMap::new();
    for a in applied {
        let same = grants_of.entry(a.fence).or_default();
        if !same.iter().any(|b| b.grant == a.grant) {
            same.push(a);
        }
    }
    for (fence, writes) in &grants_of {
        if writes.len() > 1 {
            anomalies.push(Anomaly::new(
                AnomalyKind::DuplicateFence,
                resource,
                format!("fence {fence} was applied from {} grants", writes.len()),
                writes.iter().map(|a| a.op).collect(),
            ));
        }
    }
    // Sweep by invocation: the highest fence among writes that completed before it began.
    let mut by_complete: Vec<&Applied<'_>> = applied.iter().collect();
    by_complete.sort_by_key(|a| a.op.effect_by());
    let mut by_invoke: Vec<&Applied<'_>> = applied.iter().collect();
    by_invoke.sort_by_key(|a| a.op.invoked);
    let mut highest: Option<&Applied<'_>> = None;
    let mut done = 0;
    for b in by_invoke {
        while done < by_complete.len() && by_complete[done].op.effect_by() < b.op.invoked {
            let a = by_complete[done];
            if highest.is_none_or(|h| a.fence > h.fence) {
                highest = Some(a);
            }
            done += 1;
        }
        if let Some(a) = highest.filter(|a| a.fence > b.fence) {
            anomalies.push(Anomaly::new(
                AnomalyKind::FenceOrder,
                resource,
                format!("fence {} was applied after fence {} had been", b.fence, a.fence),
                vec![a.op, b.op],
            ));
        }
    }
}

/// A refusal needs a cause: for a stale fence, a write with a higher fence that may have been
/// applied (accepted, or of unknown outcome) and began before the refused one ended; for a
/// duplicate, one with the same fence from another grant.
fn refusals(resource: &str, ops: &[&Operation], anomalies: &mut Vec<Anomaly>) {
    let mayhave: Vec<(&Operation, u64, &str)> = ops
        .iter()
        .filter(|o| matches!(o.outcome, None | Some(Outcome::Accepted | Outcome::Unknown { .. })))
        .filter_map(|o| fenced(&o.call).map(|(fence, grant)| (*o, fence, grant)))
        .collect();
    for op in ops {
        let Some((fence, grant)) = fenced(&op.call) else { continue };
        let fence = &fence;
        let cause = match op.outcome {
            Some(Outcome::Stale) => mayhave.iter().find(|(w, f, _)| f > fence && w.invoked < op.completed_or_never()),
            Some(Outcome::Duplicate) => {
                mayhave.iter().find(|(w, f, g)| f == fence && *g != grant && w.invoked < op.completed_or_never())
            }
            _ => continue,
        };
        if cause.is_none() {
            let what = if matches!(op.outcome, Some(Outcome::Stale)) { "stale" } else { "a duplicate" };
            anomalies.push(Anomaly::new(
                AnomalyKind::UnjustifiedRefusal,
                resource,
                format!("the store refused fence {fence} as {what}, but no write that could have set its watermark had begun"),
                vec![op],
            ));
        }
    }
}

/// A fenced write's fence and grant: a register write's or an allocation's.
fn fenced(call: &Call) -> Option<(u64, &str)> {
    match call {
        Call::Write { fence, grant, .. } | Call::Allocate { fence, grant, .. } => Some((*fence, grant)),
        _ => None,
    }
}

/// The allocation checks of a SKU; returns the attempts that were applied.
fn allocations<'h>(resource: &str, ops: &[&'h Operation], anomalies: &mut Vec<Anomaly>) -> Vec<Applied<'h>> {
    struct Attempt<'h> {
        op: &'h Operation,
        grant: &'h str,
        fence: u64,
        job: &'h str,
        qty: i64,
    }
    let mut attempts: HashMap<&str, Attempt<'h>> = HashMap::new();
    for op in ops {
        if let Call::Allocate { grant, fence, job, attempt, qty, .. } = &op.call
            && let Some(first) = attempts.insert(attempt, Attempt { op, grant, fence: *fence, job, qty: *qty })
        {
            anomalies.push(Anomaly::new(
                AnomalyKind::Audit,
                resource,
                format!("the attempt {attempt:?} was made twice: the audit cannot name it"),
                vec![first.op, op],
            ));
        }
    }
    // The last audit read answered.
    let audit = ops.iter().rev().find_map(|o| match (&o.call, &o.outcome) {
        (Call::Audit { .. }, Some(Outcome::Audited { jobs })) => Some((*o, jobs)),
        _ => None,
    });
    let applied: BTreeSet<&str> = match audit {
        Some((audit_op, jobs)) => {
            let mut applied = BTreeSet::new();
            for (job, ids) in jobs {
                let made: Vec<&Operation> = ids.iter().filter_map(|a| attempts.get(a.as_str())).map(|a| a.op).collect();
                if ids.len() > 1 {
                    let mut witnesses = made.clone();
                    witnesses.push(audit_op);
                    anomalies.push(Anomaly::new(
                        AnomalyKind::DoubleAllocation,
                        resource,
                        format!(
                            "job {job:?} was applied by {} attempts ({}): shipped twice",
                            ids.len(),
                            ids.join(", ")
                        ),
                        witnesses,
                    ));
                }
                for id in ids {
                    match attempts.get(id.as_str()) {
                        Some(a) if a.job != job => anomalies.push(Anomaly::new(
                            AnomalyKind::Audit,
                            resource,
                            format!("the audit has attempt {id:?} under job {job:?}, but it was made for {:?}", a.job),
                            vec![a.op, audit_op],
                        )),
                        Some(_) => {}
                        None => anomalies.push(Anomaly::new(
                            AnomalyKind::Audit,
                            resource,
                            format!("the audit has attempt {id:?} of job {job:?}, which nobody made"),
                            vec![audit_op],
                        )),
                    }
                    applied.insert(id.as_str());
                }
            }
            for (id, a) in &attempts {
                let in_audit = applied.contains(id);
                match &a.op.outcome {
                    Some(Outcome::Accepted) if !in_audit => anomalies.push(Anomaly::new(
                        AnomalyKind::Audit,
                        resource,
                        format!("the allocation {id:?} was acknowledged, and the audit does not have it: lost"),
                        vec![a.op, audit_op],
                    )),
                    Some(Outcome::Stale | Outcome::Duplicate | Outcome::AlreadyDone | Outcome::Failed { .. })
                        if in_audit =>
                    {
                        anomalies.push(Anomaly::new(
                            AnomalyKind::Audit,
                            resource,
                            format!("the allocation {id:?} was refused, and the audit has it: applied after all"),
                            vec![a.op, audit_op],
                        ))
                    }
                    _ => {}
                }
            }
            applied
        }
        // With no audit, only what was acknowledged is known to have landed.
        None => attempts
            .iter()
            .filter(|(_, a)| matches!(a.op.outcome, Some(Outcome::Accepted)))
            .map(|(id, _)| *id)
            .collect(),
    };
    // A job found already done needs an attempt of it that may have landed and began first.
    for a in attempts.values().filter(|a| matches!(a.op.outcome, Some(Outcome::AlreadyDone))) {
        let cause = attempts.iter().find(|(id, b)| {
            b.job == a.job
                && !std::ptr::eq(b.op, a.op)
                && b.op.invoked < a.op.completed_or_never()
                && match audit {
                    Some(_) => applied.contains(*id),
                    None => matches!(b.op.outcome, None | Some(Outcome::Accepted | Outcome::Unknown { .. })),
                }
        });
        if cause.is_none() {
            anomalies.push(Anomaly::new(
                AnomalyKind::UnjustifiedRefusal,
                resource,
                format!("job {:?} was found already done, but no attempt of it that landed had begun", a.job),
                vec![a.op],
            ));
        }
    }
    let counted: Vec<(&Operation, i64, bool)> =
        attempts.iter().map(|(id, a)| (a.op, a.qty, applied.contains(id))).collect();
    stock(resource, ops, &counted, audit.is_some(), anomalies);
    attempts
        .into_iter()
        .filter(|(id, _)| applied.contains(id))
        .map(|(_, a)| Applied { op: a.op, grant: a.grant, fence: a.fence })
        .collect()
}

/// The stock check: a counter from the restock, less each applied allocation's units at one
/// moment inside its call. `attempts` are (operation, units, applied); `audited` says whether
/// `applied` is known exactly (from the audit) or only for acknowledged ones.
fn stock(
    resource: &str,
    ops: &[&Operation],
    attempts: &[(&Operation, i64, bool)],
    audited: bool,
    anomalies: &mut Vec<Anomaly>,
) {
    let Some(restock) =
        ops.iter().find(|o| matches!(o.call, Call::Restock { .. }) && matches!(o.outcome, Some(Outcome::Accepted)))
    else {
        return;
    };
    let Call::Restock { qty: initial, .. } = restock.call else { return };
    // Without an audit, an attempt of unknown outcome may have landed or not.
    let may_have = |(op, _, applied): &(&Operation, i64, bool)| {
        *applied || (!audited && matches!(op.outcome, None | Some(Outcome::Unknown { .. })))
    };
    for read in ops {
        let (Call::Stock { .. }, Some(Outcome::Units { qty: Some(seen) })) = (&read.call, &read.outcome) else {
            continue;
        };
        if read.invoked < restock.completed_or_never() {
            continue;
        }
        let taken_at_most: i64 =
            attempts.iter().filter(|a| may_have(a) && a.0.invoked < read.completed_or_never()).map(|a| a.1).sum();
        let taken_at_least: i64 = attempts.iter().filter(|a| a.2 && a.0.effect_by() < read.invoked).map(|a| a.1).sum();
        let (low, high) = (initial - taken_at_most, initial - taken_at_least);
        if *seen < low || *seen > high {
            let mut witnesses = vec![*restock, *read];
            witnesses.extend(
                attempts.iter().filter(|a| a.2 && a.0.invoked < read.completed_or_never()).map(|a| a.0).take(6),
            );
            anomalies.push(Anomaly::new(
                AnomalyKind::Stock,
                resource,
                format!(
                    "a read found {seen} units; from {initial} and the allocations applied around it, it can only be \
                     {low} to {high}"
                ),
                witnesses,
            ));
        }
    }
}

fn exclusion(resource: &str, applied: &[Applied<'_>], anomalies: &mut Vec<Anomaly>) {
    // Each grant's span: from its first applied write's completion to its last one's invocation.
    struct Span<'h> {
        grant: &'h str,
        first_done: &'h Operation,
        last_begun: &'h Operation,
    }
    let mut spans: BTreeMap<&str, Span<'_>> = BTreeMap::new();
    for a in applied {
        let span = spans.entry(a.grant).or_insert(Span { grant: a.grant, first_done: a.op, last_begun: a.op });
        if a.op.effect_by() < span.first_done.effect_by() {
            span.first_done = a.op;
        }
        if a.op.invoked > span.last_begun.invoked {
            span.last_begun = a.op;
        }
    }
    let mut spans: Vec<Span<'_>> = spans.into_values().collect();
    spans.sort_by_key(|s| s.first_done.effect_by());
    // Running over spans by start: the two latest-ending spans of different grants so far.
    let mut best: Vec<[Option<usize>; 2]> = Vec::with_capacity(spans.len());
    let mut top: [Option<usize>; 2] = [None, None];
    let end = |i: usize| spans[i].last_begun.invoked;
    for i in 0..spans.len() {
        match top {
            [Some(t), _] if end(i) > end(t) => top = [Some(i), Some(t)],
            [Some(_), Some(s)] if end(i) > end(s) => top[1] = Some(i),
            [Some(_), None] => top[1] = Some(i),
            [None, _] => top[0] = Some(i),
            _ => {}
        }
        best.push(top);
    }
    let mut reported: BTreeSet<(&str, &str)> = BTreeSet::new();
    for b in applied {
        let i = spans.partition_point(|s| s.first_done.effect_by() < b.op.invoked);
        if i == 0 {
            continue;
        }
        let Some(g) = best[i - 1].into_iter().flatten().find(|&j| spans[j].grant != b.grant) else { continue };
        let span = &spans[g];
        if b.op.effect_by() < span.last_begun.invoked && reported.insert((span.grant, b.grant)) {
            anomalies.push(Anomaly::new(
                AnomalyKind::Exclusion,
                resource,
                format!(
                    "{} wrote, then {} wrote, then {} wrote again: two holders at once",
                    span.grant, b.grant, span.grant
                ),
                vec![span.first_done, b.op, span.last_begun],
            ));
        }
    }
}

fn overlap(
    resource: &str,
    ops: &[&Operation],
    applied: &[Applied<'_>],
    history: &History,
    anomalies: &mut Vec<Anomaly>,
) {
    struct Hold<'h> {
        acquire: &'h Operation,
        /// From the acquire's completion to the last `safe_until` its holder was told, or the
        /// start of its release if earlier.
        from: Time,
        until: Time,
        /// The first write applied under it.
        wrote: &'h Operation,
    }
    let mut first_write: HashMap<&str, &Operation> = HashMap::new();
    for a in applied {
        let first = first_write.entry(a.grant).or_insert(a.op);
        if a.op.invoked < first.invoked {
            *first = a.op;
        }
    }
    let mut holds: BTreeMap<&str, Hold<'_>> = BTreeMap::new();
    for op in ops {
        if let (Call::Acquire { .. }, Some(Outcome::Granted { grant, safe_until: Some(until), .. }), Some(from)) =
            (&op.call, &op.outcome, op.completed)
            && let Some(&wrote) = first_write.get(grant.as_str())
        {
            holds.insert(grant, Hold { acquire: op, from, until: *until, wrote });
        }
    }
    for op in ops {
        match (&op.call, &op.outcome) {
            (Call::Extend { grant, .. }, Some(Outcome::Done { safe_until: Some(until) })) => {
                if let Some(hold) = holds.get_mut(grant.as_str()) {
                    hold.until = hold.until.max(*until);
                }
            }
            (Call::Release { grant, .. }, _) => {
                if let Some(hold) = holds.get_mut(grant.as_str()) {
                    hold.until = hold.until.min(op.invoked);
                }
            }
            _ => {}
        }
    }
    let mut holds: Vec<Hold<'_>> = holds.into_values().filter(|h| h.until > h.from).collect();
    holds.sort_by_key(|h| h.from);
    // Locks lost between an earlier grant's acquire and a later one's completion excuse them.
    let lost_locks = |earlier: &Operation, later: &Operation| {
        history
            .faults
            .iter()
            .any(|f| f.loses_locks && f.began >= earlier.invoked && f.began <= later.completed_or_never())
    };
    let mut open: Vec<&Hold<'_>> = Vec::new();
    for hold in &holds {
        open.retain(|h| h.until > hold.from);
        for earlier in &open {
            if !lost_locks(earlier.acquire, hold.acquire) {
                anomalies.push(Anomaly::new(
                    AnomalyKind::Overlap,
                    resource,
                    format!(
                        "a lease was granted {:.1} ms before an earlier one's safe_until, and both wrote: two \
                         holders at once",
                        (earlier.until - hold.from) as f64 / 1e6
                    ),
                    vec![earlier.acquire, earlier.wrote, hold.acquire, hold.wrote],
                ));
            }
        }
        open.push(hold);
    }
}

fn progress(
    history: &History,
    by_resource: &BTreeMap<&str, Vec<&Operation>>,
    bounds: Bounds,
    anomalies: &mut Vec<Anomaly>,
) {
    let Some(healed) = history.last_heal() else { return };
    for (resource, ops) in by_resource {
        // Only resources the workload kept asking for after the heal, and from the first ask
        // then: a resource nobody asked for could not progress.
        let asked: Vec<&&Operation> =
            ops.iter().filter(|o| matches!(o.call, Call::Acquire { .. }) && o.invoked >= healed).collect();
        let Some(first_ask) = asked.iter().map(|o| o.invoked).min() else { continue };
        let deadline = first_ask.saturating_add(bounds.progress_ms.saturating_mul(1_000_000));
        if deadline > history.end {
            // The history ended before the bound: it cannot say.
            continue;
        }
        let progressed = ops.iter().any(|o| {
            matches!((&o.call, &o.outcome), (Call::Write { .. } | Call::Allocate { .. }, Some(Outcome::Accepted)))
                && o.completed.is_some_and(|c| c >= healed && c <= deadline)
        });
        if !progressed {
            let last: Vec<&Operation> = ops.iter().filter(|o| o.invoked >= healed).take(4).copied().collect();
            anomalies.push(Anomaly::new(
                AnomalyKind::NoProgress,
                resource,
                format!(
                    "no write accepted within {} ms of its first acquire after the last heal ({} acquires asked for it after)",
                    bounds.progress_ms,
                    asked.len()
                ),
                last,
            ));
        }
    }
}

fn bounded(history: &History, bounds: Bounds, anomalies: &mut Vec<Anomaly>) {
    let Some(healed) = history.last_heal() else { return };
    for op in history.operations.iter().filter(|o| o.invoked >= healed) {
        let limit = op.invoked.saturating_add((op.within_ms + bounds.allowance_ms).saturating_mul(1_000_000));
        let killed = history.crashed.get(&op.process).is_some_and(|&t| t <= limit);
        let late = match op.completed {
            Some(c) => c > limit,
            // The history ended before the bound: it cannot say.
            None => !killed && history.end > limit,
        };
        if late && !killed {
            let took = op.completed.map_or("never answered".to_string(), |c| {
                format!("answered after {} ms", (c - op.invoked) / 1_000_000)
            });
            anomalies.push(Anomaly::new(
                AnomalyKind::Unbounded,
                op.call.resource(),
                format!("{took}; it promised {} ms (+{} ms allowed)", op.within_ms, bounds.allowance_ms),
                vec![op],
            ));
        }
    }
}
