//! Fencing tokens.

use std::fmt;

use sha2::{Digest, Sha256};

use crate::OwnerToken;

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

/// Which grant a fence came from: a one-way digest of the grant's [`OwnerToken`].
///
/// A store keeps it beside its watermark so it can tell the holder's own second write (equal
/// fence, same grant: accepted) from a lock service that issued one fence twice (equal fence,
/// another grant: refused with [`ErrorKind::DuplicateFence`](crate::ErrorKind::DuplicateFence),
/// fencing rule 2). It is derived with SHA-256, so a store's tables never hold the owner token
/// itself, which is what lets a client release or extend the lock.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct GrantId([u8; 16]);

impl GrantId {
    /// The id of the grant held with `token`.
    pub fn of(token: &OwnerToken) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"palisade grant id v1\0");
        hasher.update(token.as_bytes());
        let digest = hasher.finalize();
        let mut out = [0u8; 16];
        out.copy_from_slice(&digest[..16]);
        GrantId(out)
    }

    /// Rebuilds an id from the bytes a store kept.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        GrantId(bytes)
    }

    /// The raw bytes, as stores keep them.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Rebuilds an id from a stored byte slice; `None` unless it is exactly 16 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        <[u8; 16]>::try_from(bytes).ok().map(GrantId)
    }
}

impl fmt::Display for GrantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for GrantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GrantId({self})")
    }
}

/// What a fenced write presents to a store: the [`Fence`] and the [`GrantId`] of the grant that
/// issued it.
///
/// A [`Lease`](crate::Lease) of a fenced service gives one ([`Lease::grant_fence`](crate::Lease::grant_fence));
/// pass it on to another process with [`fence`](Self::fence) and [`grant`](Self::grant) and
/// rebuild it there with [`GrantFence::new`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct GrantFence {
    fence: Fence,
    grant: GrantId,
}

impl GrantFence {
    /// `fence`, as issued with the grant `grant`.
    pub const fn new(fence: Fence, grant: GrantId) -> Self {
        GrantFence { fence, grant }
    }

    /// The fence.
    pub const fn fence(&self) -> Fence {
        self.fence
    }

    /// The grant it was issued with.
    pub const fn grant(&self) -> GrantId {
        self.grant
    }
}

impl fmt::Display for GrantFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (grant {})", self.fence, self.grant)
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

    #[test]
    fn grant_ids_are_stable_distinct_and_do_not_reveal_the_token() {
        let a = OwnerToken::from_bytes([7; 16]);
        let b = OwnerToken::from_bytes([8; 16]);
        assert_eq!(GrantId::of(&a), GrantId::of(&a));
        assert_ne!(GrantId::of(&a), GrantId::of(&b));
        assert_ne!(GrantId::of(&a).as_bytes(), a.as_bytes());
        assert!(!GrantId::of(&a).to_string().contains(&a.to_string()[..8]));
        assert_eq!(GrantId::from_slice(GrantId::of(&a).as_bytes()), Some(GrantId::of(&a)));
        assert_eq!(GrantId::from_slice(&[0; 15]), None);
        assert_eq!(GrantId::of(&a).to_string().len(), 32);
    }
}
