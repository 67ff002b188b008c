//! Resource keys and record keys and values: a valid key round-trips through its text and keeps
//! its parts, an invalid one is `InvalidKey`; any text parses as a key exactly when its parts
//! are valid; a record key or a write batch is accepted exactly when the rules say so, and a
//! refusal has the kind the contract gives (`InvalidKey` for a key, `InvalidArgument` else).

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use palisade_core::MAX_RECORD_VALUE_LEN;
use palisade_fuzz::checks::{batch_validation, record_key_validation, resource_key_round_trips, resource_key_text};
use palisade_fuzz::{OpSpec, batch};

#[derive(Arbitrary, Debug)]
struct Input {
    domain: String,
    id: String,
    text: String,
    record_key: String,
    ops: Vec<OpSpec>,
}

fuzz_target!(|input: Input| {
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
});
