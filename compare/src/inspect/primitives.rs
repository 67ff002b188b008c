//! The primitives built of locks, seen whole: a semaphore's permits, a read-write lock's gate,
//! readers and last writer, an election's leader, term and proclaimed value. Each is made of
//! plain locks whose keys say what they are part of (`q:jobs~permit-3`, `catalog:prices~rw-read~permit-0`),
//! and of records in a store (`palisade/election/KEY`, `palisade/rwlock/KEY`), so they are
//! recognised from the listing and the records alone: the backends need to know nothing of
//! them.

use std::collections::BTreeMap;

use palisade::{Fence, HolderView, Record};
use serde_json::{Value, json};

use super::Row;

/// Where [`Election`](palisade::Election) keeps what its leader proclaimed (its
/// [`record`](palisade::Election::record)), before the resource's name.
pub(super) const ELECTION_RECORDS: &str = "palisade/election/";
/// Where a [`RwLock`](palisade::RwLock) keeps its last writer's generation.
pub(super) const RWLOCK_RECORDS: &str = "palisade/rwlock/";
/// The records of every kind above.
pub(super) const RECORD_KINDS: [&str; 2] = [ELECTION_RECORDS, RWLOCK_RECORDS];
/// What the names of every record above start with.
pub(super) const RECORDS: &str = "palisade/";

const PERMIT: &str = "~permit-";
const READERS: &str = "~rw-read";

/// One permit (or reader slot) seen, by its number.
#[derive(Clone)]
pub(super) struct Permit {
    number: u32,
    holder: Option<HolderView>,
}

/// A primitive found among the resources.
#[derive(Clone)]
pub(super) enum Primitive {
    Semaphore {
        key: String,
        permits: Vec<Permit>,
    },
    /// `readers`: `None` when the reader slots were not listed (one resource's view).
    RwLock {
        key: String,
        gate: Option<HolderView>,
        readers: Option<Vec<Permit>>,
        last_writer: Option<Fence>,
    },
    Election {
        key: String,
        leader: Option<HolderView>,
        proclaimed: Option<Record>,
    },
}

/// The primitives `rows` and the stores' `records` (by name, election and read-write lock
/// records only) show, in key order. `listed`: whether the rows are a listing, which holds
/// every lock a primitive is made of (else a read-write lock's readers are not known).
pub(super) fn find(rows: &[Row], records: &BTreeMap<String, Record>, listed: bool) -> Vec<Primitive> {
    // The held rows' holders by name, read once: a listing may hold 10,000 rows and as many
    // primitives.
    let mut holders: BTreeMap<String, &HolderView> = BTreeMap::new();
    let mut semaphores: BTreeMap<String, Vec<Permit>> = BTreeMap::new();
    for row in rows {
        let name = row.lock.key.to_string();
        if let Some((base, number)) = name.rsplit_once(PERMIT)
            && let Ok(number) = number.parse::<u32>()
        {
            semaphores.entry(base.to_string()).or_default().push(Permit { number, holder: row.lock.holder.clone() });
        }
        if let Some(holder) = &row.lock.holder {
            holders.insert(name, holder);
        }
    }
    let holder_of = |name: &str| holders.get(name).map(|&holder| holder.clone());
    let mut found: BTreeMap<String, Primitive> = BTreeMap::new();
    let mut readers_of: BTreeMap<String, Vec<Permit>> = BTreeMap::new();
    for (base, mut permits) in semaphores {
        permits.sort_by_key(|p| p.number);
        match base.strip_suffix(READERS) {
            Some(gate) => {
                readers_of.insert(gate.to_string(), permits);
            }
            None => {
                found.insert(base.clone(), Primitive::Semaphore { key: base, permits });
            }
        }
    }
    let generation = |gate: &str| records.get(&format!("{RWLOCK_RECORDS}{gate}")).and_then(|r| r.fence);
    let mut gates: std::collections::BTreeSet<String> = readers_of.keys().cloned().collect();
    gates.extend(records.keys().filter_map(|k| k.strip_prefix(RWLOCK_RECORDS)).map(str::to_string));
    for gate in gates {
        let readers = readers_of.remove(&gate).or_else(|| listed.then(Vec::new));
        found.insert(
            gate.clone(),
            Primitive::RwLock { gate: holder_of(&gate), last_writer: generation(&gate), readers, key: gate },
        );
    }
    let mut elections: Vec<String> =
        records.keys().filter_map(|k| k.strip_prefix(ELECTION_RECORDS)).map(str::to_string).collect();
    elections.sort();
    for key in elections {
        let proclaimed = records.get(&format!("{ELECTION_RECORDS}{key}")).cloned();
        found.insert(key.clone(), Primitive::Election { leader: holder_of(&key), proclaimed, key });
    }
    found.into_values().collect()
}

fn holder_json(holder: Option<&HolderView>) -> Value {
    holder.map_or(Value::Null, |h| json!({ "grant": h.grant.to_string(), "fence": h.fence.map(Fence::get) }))
}

fn permits_json(permits: &[Permit]) -> Vec<Value> {
    permits.iter().map(|p| json!({ "permit": p.number, "holder": holder_json(p.holder.as_ref()) })).collect()
}

fn held(permits: &[Permit]) -> usize {
    permits.iter().filter(|p| p.holder.is_some()).count()
}

/// A proclaimed value for a person: its text when it is short UTF-8, else its size.
fn preview(value: &[u8]) -> String {
    match std::str::from_utf8(value) {
        Ok(text) if text.chars().count() <= 80 && !text.chars().any(char::is_control) => format!("{text:?}"),
        Ok(text) if !text.chars().any(char::is_control) => {
            format!("{:?}… ({} bytes)", text.chars().take(77).collect::<String>(), value.len())
        }
        _ => format!("{} bytes", value.len()),
    }
}

impl Primitive {
    pub(super) fn to_json(&self) -> Value {
        match self {
            Primitive::Semaphore { key, permits } => json!({
                "kind": "semaphore",
                "resource": key,
                "permits_seen": permits.len(),
                "permits_held": held(permits),
                "permits": permits_json(permits),
            }),
            Primitive::RwLock { key, gate, readers, last_writer } => json!({
                "kind": "rwlock",
                "resource": key,
                "gate": holder_json(gate.as_ref()),
                "readers_inside": readers.as_deref().map(held),
                "readers": readers.as_deref().map(permits_json),
                "last_writer_fence": last_writer.map(Fence::get),
            }),
            Primitive::Election { key, leader, proclaimed } => json!({
                "kind": "election",
                "resource": key,
                "leader": holder_json(leader.as_ref()),
                "term": leader.as_ref().and_then(|l| l.fence).map(Fence::get),
                "proclaimed": proclaimed.as_ref().map(|r| json!({
                    "term": r.fence.map(Fence::get),
                    "value": String::from_utf8_lossy(&r.value),
                    "bytes": r.value.len(),
                })),
            }),
        }
    }

    /// Lines for a person, each without its line break.
    pub(super) fn to_lines(&self) -> Vec<String> {
        let who = |h: &HolderView| {
            format!("grant {}{}", h.grant, h.fence.map_or_else(String::new, |f| format!(" (fence {f})")))
        };
        let permit_lines = |permits: &[Permit], noun: &str| {
            permits
                .iter()
                .map(|p| match &p.holder {
                    Some(h) => format!("    {noun} {}: held by {}", p.number, who(h)),
                    None => format!("    {noun} {}: free", p.number),
                })
                .collect::<Vec<_>>()
        };
        match self {
            Primitive::Semaphore { key, permits } => {
                let mut out =
                    vec![format!("semaphore {key}: {} of the {} permits seen held", held(permits), permits.len())];
                out.extend(permit_lines(permits, "permit"));
                out
            }
            Primitive::RwLock { key, gate, readers, last_writer } => {
                let gate = gate.as_ref().map_or_else(
                    || "free".to_string(),
                    |h| format!("held by {} (a writer inside, or one waiting for the readers to leave)", who(h)),
                );
                let last =
                    last_writer.map_or_else(|| "none recorded".to_string(), |f| format!("the writer with fence {f}"));
                let inside = match readers.as_deref().map(held) {
                    Some(1) => "1 reader inside".to_string(),
                    Some(n) => format!("{n} readers inside"),
                    None => format!("readers not listed (--prefix {key} lists them)"),
                };
                let mut out = vec![format!("read-write lock {key}: gate {gate}; {inside}; last writer: {last}")];
                out.extend(permit_lines(readers.as_deref().unwrap_or_default(), "reader slot"));
                out
            }
            Primitive::Election { key, leader, proclaimed } => {
                let leader_text = leader.as_ref().map_or_else(
                    || "no leader".to_string(),
                    |h| {
                        format!(
                            "leader grant {}, term {}",
                            h.grant,
                            h.fence.map_or_else(|| "not known".to_string(), |f| f.to_string())
                        )
                    },
                );
                let said = match (proclaimed, leader.as_ref().and_then(|l| l.fence)) {
                    (None, _) => "nothing proclaimed yet".to_string(),
                    (Some(r), term) => {
                        let at = r.fence.map_or_else(|| "no term".to_string(), |f| format!("term {f}"));
                        let stale = match (r.fence, term) {
                            (Some(said), Some(now)) if said < now => {
                                " (by an earlier leader: this one has not proclaimed yet)"
                            }
                            _ => "",
                        };
                        format!("proclaimed {} at {at}{stale}", preview(&r.value))
                    }
                };
                vec![format!("election {key}: {leader_text}; {said}")]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use palisade::{GrantId, LockView};

    use super::*;

    fn row(name: &str, holder: Option<u8>) -> Row {
        let key = palisade::spi::parse_any_resource_key(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut lock = LockView::free(key);
        if let Some(g) = holder {
            lock = lock.held_by(HolderView::new(GrantId::from_bytes([g; 16]), Some(Fence::new(u64::from(g))), None));
        }
        Row { lock, marks: Vec::new() }
    }

    fn record(value: &[u8], fence: u64) -> Record {
        Record { value: value.to_vec(), fence: Some(Fence::new(fence)) }
    }

    #[test]
    fn permits_gates_and_records_make_primitives() {
        let rows = vec![
            row("q:jobs~permit-0", Some(1)),
            row("q:jobs~permit-1", None),
            row("q:jobs~permit-2", Some(2)),
            row("catalog:prices", None),
            row("catalog:prices~rw-read~permit-0", Some(3)),
            row("relay:orders", Some(9)),
        ];
        let mut records = BTreeMap::new();
        records.insert(format!("{RWLOCK_RECORDS}catalog:prices"), record(b"4", 4));
        records.insert(format!("{ELECTION_RECORDS}relay:orders"), record(b"node-a", 7));
        let found = find(&rows, &records, true);
        let lines: Vec<String> = found.iter().flat_map(Primitive::to_lines).collect();
        let text = lines.join("\n");
        assert!(text.contains("semaphore q:jobs: 2 of the 3 permits seen held"), "{text}");
        assert!(
            text.contains(
                "read-write lock catalog:prices: gate free; 1 reader inside; last writer: the writer with fence 4"
            ),
            "{text}"
        );
        assert!(
            text.contains("proclaimed \"node-a\" at term 7 (by an earlier leader: this one has not proclaimed yet)"),
            "{text}"
        );
        assert_eq!(found.len(), 3, "{text}");
        let json: Vec<Value> = found.iter().map(Primitive::to_json).collect();
        assert_eq!(json[0]["kind"], "rwlock");
        assert_eq!(json[1]["kind"], "semaphore");
        assert_eq!(json[1]["permits_held"], 2);
        assert_eq!(json[2]["leader"]["fence"], 9);
        assert_eq!(json[2]["proclaimed"]["value"], "node-a");
        // One resource's view does not list the reader slots: it says so.
        let gate_only = find(&rows[3..4], &records, false);
        let text = gate_only.iter().flat_map(Primitive::to_lines).collect::<Vec<_>>().join("\n");
        assert!(text.contains("readers not listed (--prefix catalog:prices lists them)"), "{text}");
    }

    #[test]
    fn a_proclaimed_value_is_shown_safely() {
        assert_eq!(preview(b"node-a"), "\"node-a\"");
        assert_eq!(preview(&[0xff, 0x00]), "2 bytes");
        assert!(preview("x".repeat(200).as_bytes()).ends_with("(200 bytes)"));
    }
}
