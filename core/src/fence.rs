//! Fencing tokens.

use std::fmt;

/// A fencing token: an integer a lock service issues with every grant, strictly larger than
/// every fence it issued earlier for the same resource.
///
/// A [`FencedStore`](crate::FencedStore) accepts a write only if its fence is at least the
/// highest fence it has accepted for the resource, so a holder that slept past its TTL is
/// refused once a newer holder has written. Fences are totally ordered; compare them with
/// `<`, `>=`, and so on.
///
/// Only a lock service should mint fences ([`Fence::new`] exists for backend authors and
/// tests). SQL stores keep fences in a signed 64-bit column, so they refuse fences above
/// [`Fence::MAX_STORABLE`] with [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Fence(u64);

impl Fence {
    /// The largest fence every store can hold (`i64::MAX`).
    pub const MAX_STORABLE: Fence = Fence(i64::MAX as u64);

    /// Wraps a raw fence value. For lock service implementations and tests.
    pub const fn new(value: u64) -> Self {
        Fence(value)
    }

    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The value as an `i64`, for SQL columns, or `None` above [`Fence::MAX_STORABLE`].
    pub fn to_i64(self) -> Option<i64> {
        i64::try_from(self.0).ok()
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fence({})", self.0)
    }
}

impl From<Fence> for u64 {
    fn from(f: Fence) -> u64 {
        f.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_are_totally_ordered() {
        let mut v = vec![Fence::new(42), Fence::new(7), Fence::new(41), Fence::new(42)];
        v.sort();
        assert_eq!(v, vec![Fence::new(7), Fence::new(41), Fence::new(42), Fence::new(42)]);
        assert!(Fence::new(41) < Fence::new(42));
        assert!(Fence::new(42) >= Fence::new(42));
        assert_eq!(Fence::new(u64::MAX).to_i64(), None);
        assert_eq!(Fence::MAX_STORABLE.to_i64(), Some(i64::MAX));
    }
}
