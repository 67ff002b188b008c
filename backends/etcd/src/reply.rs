//! What the backend reads of etcd's txn responses, held apart from the client's types so that
//! the reading can be checked against any response a server might send (the fuzz targets).

use etcd_client::{TxnOpResponse, TxnResponse};
use palisade_core::spi::EpochFence;
use palisade_core::{Error, ErrorKind, Fence, Result};

use crate::BACKEND;

/// The fence's layout: the service's epoch over 44 bits of create revision (2⁴⁴ revisions is
/// 55 years of 10,000 writes a second to the cluster; 2¹⁹ − 1 epochs).
pub const LAYOUT: EpochFence = EpochFence::new(44);

/// The highest epoch: 2¹⁹ − 1, so that every fence fits in 63 bits (the SQL stores' `BIGINT`).
pub const MAX_EPOCH: u64 = LAYOUT.max_epoch();

/// A grant's fence: `epoch × 2⁴⁴ + revision`. Still the revision while the epoch is 0 (a
/// cluster that never lost its data); a `Backend` error for a revision beyond 44 bits or an
/// epoch beyond [`MAX_EPOCH`], never a fence that wrapped.
pub fn compose_fence(epoch: u64, revision: i64) -> Result<Fence> {
    u64::try_from(revision).ok().and_then(|r| LAYOUT.fence(epoch, r)).ok_or_else(|| {
        Error::new(
            ErrorKind::Backend,
            BACKEND,
            format!("etcd revision {revision} under epoch {epoch} does not fit a fence's 63 bits"),
        )
    })
}

/// The create revision a fence was made from (its low 44 bits).
pub fn revision_of(fence: Fence) -> i64 {
    i64::try_from(LAYOUT.number(fence)).unwrap_or(-1)
}

/// The epoch whose fences are all above `floor`: one past `floor`'s. `Unsupported` beyond
/// [`MAX_EPOCH`] (that many recoveries; the fences would no longer fit 63 bits).
pub fn epoch_above(floor: Fence) -> Result<u64> {
    LAYOUT.epoch_above(floor).ok_or_else(|| {
        Error::new(
            ErrorKind::Unsupported,
            BACKEND,
            format!(
                "fence {floor} needs an epoch above the last one ({MAX_EPOCH}): fences would no longer fit 63 bits"
            ),
        )
    })
}

/// The epoch key's value ([`EpochFence::encode`]).
pub fn encode_epoch(epoch: u64) -> String {
    EpochFence::encode(epoch)
}

/// The epoch a value of the epoch key holds: none (never raised) is 0; anything but
/// [`encode_epoch`]'s form is a `Backend` error, never an epoch.
pub fn decode_epoch(value: Option<&[u8]>) -> Result<u64> {
    let Some(value) = value else { return Ok(0) };
    EpochFence::decode(value).ok_or_else(|| {
        Error::new(
            ErrorKind::Backend,
            BACKEND,
            format!("the epoch key holds {:?}, not an epoch", String::from_utf8_lossy(value)),
        )
    })
}

/// A txn response as the backend reads it: whether its comparisons held, the revision in its
/// header, and the keys each of its gets found, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxnReply {
    /// Whether the txn's comparisons held (its success branch ran).
    pub succeeded: bool,
    /// The header's revision: after a put, the put's revision. `None`: no header.
    pub revision: Option<i64>,
    /// For each get in the txn, the keys it found.
    pub gets: Vec<Vec<Vec<u8>>>,
    /// For each get in the txn, the value of the first key it found.
    pub values: Vec<Option<Vec<u8>>>,
}

impl TxnReply {
    pub(crate) fn of(resp: &TxnResponse) -> Self {
        let (mut gets, mut values) = (Vec::new(), Vec::new());
        for r in resp.op_responses() {
            if let TxnOpResponse::Get(g) = r {
                gets.push(g.kvs().iter().map(|kv| kv.key().to_vec()).collect());
                values.push(g.kvs().first().map(|kv| kv.value().to_vec()));
            }
        }
        TxnReply { succeeded: resp.succeeded(), revision: resp.header().map(|h| h.revision()), gets, values }
    }

    /// The header's revision, which a txn that put a key makes that key's create revision: a
    /// revision is at least 1, so anything else (or no header) is a [`ErrorKind::Backend`]
    /// error, never a fence or a revision to count from.
    pub fn revision(&self) -> Result<i64> {
        match self.revision {
            Some(revision) if revision >= 1 => Ok(revision),
            Some(revision) => {
                Err(Error::new(ErrorKind::Backend, BACKEND, format!("etcd returned revision {revision}")))
            }
            None => Err(Error::new(ErrorKind::Backend, BACKEND, "etcd response without a header")),
        }
    }

    /// The fence of the key this txn created: its revision under the epoch the `epoch_get`th
    /// get read in the same txn ([`compose_fence`]).
    pub fn fence(&self, epoch_get: usize) -> Result<Fence> {
        let revision = self.revision()?;
        let read = self.values.get(epoch_get).ok_or_else(|| {
            Error::new(ErrorKind::Backend, BACKEND, "etcd answered a grant's txn without its read of the epoch")
        })?;
        let epoch = decode_epoch(read.as_deref())?;
        compose_fence(epoch, revision)
    }

    /// The revision to watch from for what happens after this response: one past it.
    pub fn next_revision(&self) -> Result<i64> {
        let revision = self.revision()?;
        revision
            .checked_add(1)
            .ok_or_else(|| Error::new(ErrorKind::Backend, BACKEND, format!("etcd returned revision {revision}")))
    }

    /// Whether the first key the `get`th get found is `key` (the head of a queue is us).
    pub fn first_found_is(&self, get: usize, key: &[u8]) -> bool {
        self.first_found(get) == Some(key)
    }

    /// The first key the `get`th get found, if it found any.
    pub fn first_found(&self, get: usize) -> Option<&[u8]> {
        self.gets.get(get).and_then(|keys| keys.first()).map(Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fence only from a revision; counting on from the last one is an error, not an overflow.
    #[test]
    fn revisions_become_fences_only_when_they_are_revisions() {
        let reply = |revision| TxnReply { revision, values: vec![None], ..TxnReply::default() };
        assert_eq!(reply(Some(42)).fence(0).unwrap(), Fence::new(42));
        assert_eq!(reply(Some(42)).next_revision().unwrap(), 43);
        for bad in [None, Some(0), Some(-1), Some(i64::MIN)] {
            assert_eq!(reply(bad).fence(0).unwrap_err().kind(), ErrorKind::Backend, "{bad:?}");
        }
        assert_eq!(reply(Some(i64::MAX)).next_revision().unwrap_err().kind(), ErrorKind::Backend);
        let queue = TxnReply { gets: vec![vec![b"a".to_vec(), b"b".to_vec()], vec![]], ..TxnReply::default() };
        assert!(queue.first_found_is(0, b"a") && !queue.first_found_is(0, b"b") && queue.first_found(1).is_none());
    }

    /// An epoch sits above the revision; a fence never wraps, and the epoch's text is checked.
    #[test]
    fn fences_are_the_epoch_over_the_revision() {
        let at = |epoch: Option<&str>, revision| TxnReply {
            revision: Some(revision),
            values: vec![epoch.map(|e| e.as_bytes().to_vec())],
            ..TxnReply::default()
        };
        assert_eq!(at(Some(&encode_epoch(0)), 7).fence(0).unwrap(), Fence::new(7));
        let raised = at(Some(&encode_epoch(3)), 7).fence(0).unwrap();
        assert_eq!(raised, Fence::new((3 << LAYOUT.number_bits()) + 7));
        assert_eq!(revision_of(raised), 7);
        for bad in ["3", "-0000000000000000003", "0000000000000000000x", ""] {
            assert_eq!(at(Some(bad), 7).fence(0).unwrap_err().kind(), ErrorKind::Backend, "{bad}");
        }
        assert_eq!(at(None, 1 << LAYOUT.number_bits()).fence(0).unwrap_err().kind(), ErrorKind::Backend);
        assert_eq!(compose_fence(MAX_EPOCH + 1, 1).unwrap_err().kind(), ErrorKind::Backend);
        let top = compose_fence(MAX_EPOCH, (1 << LAYOUT.number_bits()) - 1).unwrap();
        assert!(i64::try_from(top.get()).is_ok(), "every fence fits 63 bits");
        assert!(TxnReply { revision: Some(7), ..TxnReply::default() }.fence(0).is_err(), "no epoch read");
        // The epoch above a floor makes every fence of it larger than the floor.
        for floor in
            [0, 1, 7, (1 << LAYOUT.number_bits()) - 1, 1 << LAYOUT.number_bits(), (5 << LAYOUT.number_bits()) + 99]
        {
            let epoch = epoch_above(Fence::new(floor)).unwrap();
            assert!(compose_fence(epoch, 1).unwrap().get() > floor, "{floor}");
            assert!(epoch <= (floor >> LAYOUT.number_bits()) + 1, "no epoch wasted: {floor}");
        }
        let last = Fence::new(MAX_EPOCH << LAYOUT.number_bits());
        assert_eq!(epoch_above(last).unwrap_err().kind(), ErrorKind::Unsupported);
        assert!(encode_epoch(9) < encode_epoch(10), "the text orders as the number");
    }
}
