//! ZooKeeper node names and stats as the backend reads them: the sequence a node was given
//! reads back exactly (negative ones after the wrap included, with or without a parent path);
//! any other name is not taken for a contender's; contenders sort into the order they were
//! issued in, across the wrap; a node's `czxid` is its fence only when it is positive.

use arbitrary::Arbitrary;
use palisade_core::{ErrorKind, OwnerToken};
use palisade_zookeeper::fuzzing::{fence_of, node_prefix, precedes, queue_order, sequence_of};

#[derive(Arbitrary, Debug)]
struct Input {
    token: [u8; 16],
    parent: String,
    sequence: i32,
    /// Contenders issued after a first one, by this much each (far less than 2³¹ in all).
    gaps: Vec<u16>,
    rotate: u8,
    name: String,
    czxid: i64,
}

/// One fuzz input, decoded as libFuzzer's typed targets decode theirs ([`crate::decode`]).
pub fn run(data: &[u8]) {
    let Some(input) = crate::decode::<Input>(data) else { return };
    let prefix = node_prefix(OwnerToken::from_bytes(input.token));
    let node = format!("{prefix}{:010}", input.sequence);
    assert_eq!(sequence_of(&node), Some(input.sequence), "{node}");
    let parent: String = input.parent.chars().filter(|&c| c != '/').take(20).collect();
    assert_eq!(sequence_of(&format!("/palisade/{parent}/{node}")), Some(input.sequence));

    // Any name: a sequence only from a `lock-…-<number>` last segment.
    if let Some(s) = sequence_of(&input.name) {
        let last = input.name.rsplit('/').next().unwrap_or_default();
        assert!(last.starts_with("lock-") && last.ends_with(&s.unsigned_abs().to_string()), "{:?} -> {s}", input.name);
    }

    // Queue order across the wrap: issued in the order of the gaps, listed in any rotation.
    let mut issued = vec![input.sequence];
    for gap in input.gaps.iter().take(64) {
        let last = issued[issued.len() - 1];
        issued.push(last.wrapping_add(i32::from(*gap) + 1));
    }
    let mut listed: Vec<(i32, String)> = issued.iter().map(|s| (*s, format!("{prefix}{s:010}"))).collect();
    let rotate = usize::from(input.rotate) % listed.len();
    listed.rotate_left(rotate);
    // The anchor is whichever is listed first: distances from it are signed, so those issued
    // before it sort ahead of it.
    queue_order(&mut listed);
    let got: Vec<i32> = listed.iter().map(|(s, _)| *s).collect();
    assert_eq!(got, issued, "listed rotated by {rotate}");
    for pair in issued.windows(2) {
        assert!(precedes(pair[0], pair[1]) && !precedes(pair[1], pair[0]), "{pair:?}");
    }
    assert!(!precedes(input.sequence, input.sequence));

    match fence_of(0, input.czxid) {
        Ok(fence) => assert!(input.czxid > 0 && u64::try_from(input.czxid).ok() == Some(fence.get())),
        Err(e) => assert!((input.czxid <= 0 || input.czxid >= 1 << 48) && e.kind() == ErrorKind::Backend),
    }
}
