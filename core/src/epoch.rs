//! Fences for a service whose own number cannot be moved (etcd's revision, ZooKeeper's
//! `czxid`): an epoch kept in the service sits above the number, and a repair after a data loss
//! raises the epoch ([`LockService::advance_fence`](crate::LockService::advance_fence)).

use crate::Fence;

/// `epoch × 2^bits + number`, with every fence within 63 bits (a SQL `BIGINT`): the layout of
/// an epoch-carrying fence, and the epoch's text as the service stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochFence {
    bits: u32,
}

impl EpochFence {
    /// A layout whose low `number_bits` bits hold the service's number (at most 62).
    pub const fn new(number_bits: u32) -> Self {
        assert!(number_bits >= 1 && number_bits <= 62, "an epoch fence needs 1 to 62 number bits");
        EpochFence { bits: number_bits }
    }

    /// How many low bits hold the number.
    pub const fn number_bits(&self) -> u32 {
        self.bits
    }

    /// The highest epoch whose fences fit in 63 bits.
    pub const fn max_epoch(&self) -> u64 {
        (1 << (63 - self.bits)) - 1
    }

    /// The fence of `number` (at least 1, below 2^bits) under `epoch` (at most
    /// [`max_epoch`](Self::max_epoch)); `None` outside those bounds, never a fence that wrapped.
    pub fn fence(&self, epoch: u64, number: u64) -> Option<Fence> {
        (number >= 1 && number < (1 << self.bits) && epoch <= self.max_epoch())
            .then(|| Fence::new((epoch << self.bits) | number))
    }

    /// The number a fence was made from (its low bits).
    pub fn number(&self, fence: Fence) -> u64 {
        fence.get() & ((1 << self.bits) - 1)
    }

    /// The epoch whose fences are all above `floor`: one past `floor`'s; `None` beyond
    /// [`max_epoch`](Self::max_epoch).
    pub fn epoch_above(&self, floor: Fence) -> Option<u64> {
        let epoch = (floor.get() >> self.bits) + 1;
        (epoch <= self.max_epoch()).then_some(epoch)
    }

    /// The epoch as the service stores it: 20 decimal digits, so that a byte-wise comparison
    /// (etcd's) orders epochs as numbers.
    pub fn encode(epoch: u64) -> String {
        format!("{epoch:020}")
    }

    /// The epoch stored as [`encode`](Self::encode) writes it; `None` for anything else.
    pub fn decode(stored: &[u8]) -> Option<u64> {
        (stored.len() == 20 && stored.iter().all(u8::is_ascii_digit))
            .then(|| std::str::from_utf8(stored).ok()?.parse().ok())
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_epoch_sits_above_the_number_and_nothing_wraps() {
        let layout = EpochFence::new(44);
        assert_eq!(layout.max_epoch(), (1 << 19) - 1);
        assert_eq!(layout.fence(0, 7), Some(Fence::new(7)));
        let raised = layout.fence(3, 7).unwrap();
        assert_eq!(raised, Fence::new((3 << 44) + 7));
        assert_eq!(layout.number(raised), 7);
        assert_eq!(layout.fence(0, 0), None);
        assert_eq!(layout.fence(0, 1 << 44), None);
        assert_eq!(layout.fence(layout.max_epoch() + 1, 1), None);
        assert!(i64::try_from(layout.fence(layout.max_epoch(), (1 << 44) - 1).unwrap().get()).is_ok());
        for floor in [0, 1, (1 << 44) - 1, 1 << 44, (5 << 44) + 99] {
            let epoch = layout.epoch_above(Fence::new(floor)).unwrap();
            assert!(layout.fence(epoch, 1).unwrap().get() > floor, "{floor}");
        }
        assert_eq!(layout.epoch_above(Fence::new(layout.max_epoch() << 44)), None);
        assert_eq!(EpochFence::decode(EpochFence::encode(12).as_bytes()), Some(12));
        assert!(EpochFence::encode(9) < EpochFence::encode(10));
        for bad in [&b""[..], b"12", b"-0000000000000000003", b"0000000000000000000x"] {
            assert_eq!(EpochFence::decode(bad), None);
        }
    }
}
