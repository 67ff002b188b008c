//! etcd txn responses as the backend reads them: the header's revision is a fence only when it
//! is a revision (at least 1, below 2⁴⁴), and then exactly the epoch read with it over that
//! number; the revision to watch from is one past it, without overflow; "the head of the queue
//! is us" holds exactly when the get's first key is ours. Anything else is a `Backend` error,
//! never a fence and never a panic.

use arbitrary::Arbitrary;
use palisade_core::ErrorKind;
use palisade_etcd::fuzzing::TxnReply;

#[derive(Arbitrary, Debug)]
struct Input {
    succeeded: bool,
    revision: Option<i64>,
    gets: Vec<Vec<Vec<u8>>>,
    epoch: Option<Vec<u8>>,
    ours: Vec<u8>,
    get: u8,
}

/// One fuzz input, decoded as libFuzzer's typed targets decode theirs ([`crate::decode`]).
pub fn run(data: &[u8]) {
    let Some(input) = crate::decode::<Input>(data) else { return };
    let reply = TxnReply {
        succeeded: input.succeeded,
        revision: input.revision,
        gets: input.gets,
        values: vec![input.epoch.clone()],
    };
    match (reply.revision(), input.revision) {
        (Ok(r), Some(expected)) => {
            assert!(r >= 1 && r == expected);
            // The fence is the epoch (20 digits, at most 2^19 - 1) over the revision (below 2^44),
            // exactly; anything else is a Backend error.
            let epoch = match input.epoch.as_deref() {
                None => Some(0),
                Some(e) if e.len() == 20 && e.iter().all(u8::is_ascii_digit) => {
                    std::str::from_utf8(e).ok().and_then(|e| e.parse::<u64>().ok())
                }
                Some(_) => None,
            };
            let expected = epoch.filter(|e| *e < 1 << 19 && r < 1 << 44).map(|e| (e << 44) | r.unsigned_abs());
            match reply.fence(0) {
                Ok(fence) => assert_eq!(Some(fence.get()), expected),
                Err(e) => assert!(expected.is_none() && e.kind() == ErrorKind::Backend, "{e}"),
            }
            match reply.next_revision() {
                Ok(next) => assert_eq!(i128::from(next), i128::from(r) + 1),
                Err(e) => assert!(r == i64::MAX && e.kind() == ErrorKind::Backend),
            }
        }
        (Ok(r), None) => panic!("revision {r} without a header"),
        (Err(e), revision) => {
            assert!(revision.is_none_or(|r| r < 1), "{revision:?} refused: {e}");
            assert_eq!(e.kind(), ErrorKind::Backend);
            assert!(reply.fence(0).is_err() && reply.next_revision().is_err());
        }
    }
    let get = usize::from(input.get % 4);
    let first = reply.gets.get(get).and_then(|keys| keys.first());
    assert_eq!(reply.first_found(get), first.map(Vec::as_slice));
    assert_eq!(reply.first_found_is(get, &input.ours), first == Some(&input.ours));
}
