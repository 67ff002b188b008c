//! PostgreSQL's replies to the apply function as the store decodes them: a refusal (`PF001`,
//! `<fence> <grant hex>` or `<fence> -`) gives back exactly the watermark it names, and a
//! grant only from well-formed hex that the message holds; a failed check (`PF002`, a 1-based
//! index) names exactly that operation, or none when the index is out of range. Any other
//! message is read without a panic.

use crate::{OpSpec, batch};
use arbitrary::Arbitrary;
use palisade_core::{Fence, GrantId};
use palisade_postgres::fuzzing::{decode_refusal, failed_check};

#[derive(Arbitrary, Debug)]
struct Input {
    message: String,
    fence: u64,
    grant: [u8; 16],
    index: u16,
    ops: Vec<OpSpec>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One fuzz input, decoded as libFuzzer's typed targets decode theirs ([`crate::decode`]).
pub fn run(data: &[u8]) {
    let Some(input) = crate::decode::<Input>(data) else { return };
    let fence = input.fence >> 1; // a BIGINT's range
    let grant = GrantId::from_bytes(input.grant);
    assert_eq!(decode_refusal(&format!("{fence} {}", hex(&input.grant))), (Fence::new(fence), Some(grant)));
    assert_eq!(decode_refusal(&format!("{fence} -")), (Fence::new(fence), None));

    let (_, decoded) = decode_refusal(&input.message);
    if let Some(g) = decoded {
        // PostgreSQL writes lower case; either case is the same bytes.
        assert!(input.message.to_ascii_lowercase().contains(&hex(g.as_bytes())), "{:?} -> {g:?}", input.message);
    }

    let batch = batch(&input.ops);
    let ops = batch.ops();
    let i = usize::from(input.index);
    assert_eq!(failed_check(&i.to_string(), ops), i.checked_sub(1).and_then(|i| ops.get(i)));
    if let Some(op) = failed_check(&input.message, ops) {
        let named = input.message.parse::<usize>().ok().and_then(|i| ops.get(i.checked_sub(1)?));
        assert_eq!(Some(op), named, "{:?}", input.message);
    }
}
