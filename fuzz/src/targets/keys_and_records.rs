//! Resource keys and record keys and values: a valid key round-trips through its text and keeps
//! its parts, an invalid one is `InvalidKey`; any text parses as a key exactly when its parts
//! are valid; a record key or a write batch is accepted exactly when the rules say so, and a
//! refusal has the kind the contract gives (`InvalidKey` for a key, `InvalidArgument` else).

use crate::checks::{batch_validation, record_key_validation, resource_key_round_trips, resource_key_text};
use crate::{OpSpec, batch};
use arbitrary::Arbitrary;
use palisade_core::MAX_RECORD_VALUE_LEN;

#[derive(Arbitrary, Debug)]
struct Input {
    domain: String,
    id: String,
    text: String,
    record_key: String,
    ops: Vec<OpSpec>,
}

/// One fuzz input, decoded as libFuzzer's typed targets decode theirs ([`crate::decode`]).
pub fn run(data: &[u8]) {
    let Some(input) = crate::decode::<Input>(data) else { return };
    let verdicts = [
        resource_key_round_trips(&input.domain, &input.id),
        resource_key_text(&input.text),
        resource_key_text(&format!("{}:{}", input.domain, input.id)),
        record_key_validation(&input.record_key),
        batch_validation(&batch(&input.ops), MAX_RECORD_VALUE_LEN),
    ];
    for verdict in verdicts {
        if let Err(why) = verdict {
            panic!("{why}");
        }
    }
}
