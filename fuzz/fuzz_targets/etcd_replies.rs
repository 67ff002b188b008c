//! etcd txn responses as the backend reads them: the header's revision is a fence only when it
//! is a revision (at least 1), and then exactly that number; the revision to watch from is one
//! past it, without overflow; "the head of the queue is us" holds exactly when the get's first
//! key is ours. Anything else is a `Backend` error, never a fence and never a panic.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use palisade_core::ErrorKind;
use palisade_etcd::fuzzing::TxnReply;

#[derive(Arbitrary, Debug)]
struct Input {
    succeeded: bool,
    revision: Option<i64>,
    gets: Vec<Vec<Vec<u8>>>,
    ours: Vec<u8>,
    get: u8,
}

fuzz_target!(|input: Input| {
    let reply = TxnReply { succeeded: input.succeeded, revision: input.revision, gets: input.gets };
    match (reply.revision(), input.revision) {
        (Ok(r), Some(expected)) => {
            assert!(r >= 1 && r == expected);
            assert_eq!(reply.fence().map(|f| f.get()).ok(), u64::try_from(r).ok());
            match reply.next_revision() {
                Ok(next) => assert_eq!(i128::from(next), i128::from(r) + 1),
                Err(e) => assert!(r == i64::MAX && e.kind() == ErrorKind::Backend),
            }
        }
        (Ok(r), None) => panic!("revision {r} without a header"),
        (Err(e), revision) => {
            assert!(revision.is_none_or(|r| r < 1), "{revision:?} refused: {e}");
            assert_eq!(e.kind(), ErrorKind::Backend);
            assert!(reply.fence().is_err() && reply.next_revision().is_err());
        }
    }
    let get = usize::from(input.get % 4);
    let first = reply.gets.get(get).and_then(|keys| keys.first());
    assert_eq!(reply.first_found(get), first.map(Vec::as_slice));
    assert_eq!(reply.first_found_is(get, &input.ours), first == Some(&input.ours));
});
