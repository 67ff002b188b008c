//! What a lock service hands back when it grants a lock.

use std::fmt;
use std::sync::{Arc, OnceLock};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{Fence, GrantFence, GrantId, OwnerToken, ResourceKey, Ttl};

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Fenced {}
    impl Sealed for super::Unfenced {}
}

/// Whether a lock service's grants carry a fence. Implemented only by [`Fenced`] and
/// [`Unfenced`].
///
/// This is how the type system keeps efficiency locks away from fenced stores: only a
/// [`Lease`](crate::Lease) of a service whose `Fencing` is [`Fenced`] has a `fence()` and can be
/// passed to [`FencedStoreExt::write`](crate::FencedStoreExt::write).
pub trait Fencing: sealed::Sealed + Send + Sync + 'static {
    /// What a grant carries: a [`Fence`], or `()`.
    type Token: Copy + Send + Sync + fmt::Debug + 'static;
    /// `true` for [`Fenced`].
    const ISSUES_FENCES: bool;
    /// The fence a token carries, if any (for code generic over both kinds).
    fn fence_of(token: Self::Token) -> Option<Fence>;
    /// Rebuilds a token from what [`fence_of`](Fencing::fence_of) gave, for proxies that carry
    /// grants over a wire; `None` if a fenced token arrives without its fence.
    fn token_from(fence: Option<Fence>) -> Option<Self::Token>;
}

/// Marker: the service issues a strictly increasing [`Fence`] with every grant.
#[derive(Debug)]
pub enum Fenced {}

/// Marker: the service issues no fence (Redlock). Its leases cannot feed a fenced store.
#[derive(Debug)]
pub enum Unfenced {}

impl Fencing for Fenced {
    type Token = Fence;
    const ISSUES_FENCES: bool = true;
    fn fence_of(token: Fence) -> Option<Fence> {
        Some(token)
    }
    fn token_from(fence: Option<Fence>) -> Option<Fence> {
        fence
    }
}

impl Fencing for Unfenced {
    type Token = ();
    const ISSUES_FENCES: bool = false;
    fn fence_of((): ()) -> Option<Fence> {
        None
    }
    fn token_from(_: Option<Fence>) -> Option<()> {
        Some(())
    }
}

/// One grant of a lock, as a backend reports it: the raw material of a [`Lease`](crate::Lease).
///
/// Backends build it with [`Grant::new`]; users normally see it only through a `Lease`.
pub struct Grant<F: Fencing> {
    key: ResourceKey,
    token: OwnerToken,
    /// Derived from `token` on first use, then kept: a SHA-256 per grant was 9 % of the
    /// client's instructions on a Redis acquire + release, wasted on grants that never write.
    grant_id: OnceLock<GrantId>,
    fence: F::Token,
    ttl: Ttl,
    requested_at: Instant,
    handle: Option<Arc<str>>,
    lost: CancellationToken,
}

impl<F: Fencing> Grant<F> {
    /// A grant of `key` to the holder of `token`, with `fence` (a [`Fence`] for fenced services,
    /// `()` otherwise), valid for `ttl` counted from `requested_at`.
    ///
    /// `requested_at` must be taken **before** the acquire request was sent, so the local
    /// deadline errs early, never late.
    pub fn new(key: ResourceKey, token: OwnerToken, fence: F::Token, ttl: Ttl, requested_at: Instant) -> Self {
        Grant {
            key,
            token,
            grant_id: OnceLock::new(),
            fence,
            ttl,
            requested_at,
            handle: None,
            lost: CancellationToken::new(),
        }
    }

    /// Attaches a backend-specific handle (a ZooKeeper node path, an etcd key), returned by
    /// [`Grant::handle`] when the backend later extends or releases this grant.
    pub fn with_handle(mut self, handle: impl Into<Arc<str>>) -> Self {
        self.handle = Some(handle.into());
        self
    }

    /// The locked resource.
    pub fn key(&self) -> &ResourceKey {
        &self.key
    }

    /// The holder's token.
    pub fn token(&self) -> OwnerToken {
        self.token
    }

    /// The id a store records beside a watermark this grant set (a digest of the token).
    pub fn grant_id(&self) -> GrantId {
        *self.grant_id.get_or_init(|| GrantId::of(&self.token))
    }

    /// The fence, or `()` for unfenced services.
    pub fn fence_token(&self) -> F::Token {
        self.fence
    }

    /// The fence if the service issues them, `None` otherwise (for code generic over both).
    pub fn fence_if_any(&self) -> Option<Fence> {
        F::fence_of(self.fence)
    }

    /// The TTL granted at acquisition: what was asked for, or less where the backend caps it
    /// (a session-based backend caps it at the session's remaining life).
    pub fn ttl(&self) -> Ttl {
        self.ttl
    }

    /// When the acquire request was sent (local monotonic clock).
    pub fn requested_at(&self) -> Instant {
        self.requested_at
    }

    /// The backend-specific handle, if the backend attached one.
    pub fn handle(&self) -> Option<&str> {
        self.handle.as_deref()
    }

    /// The token a backend cancels to report that this grant is lost (session expired,
    /// keep-alive failed). The lease's lost signal follows it.
    pub fn lost_token(&self) -> &CancellationToken {
        &self.lost
    }
}

impl Grant<Fenced> {
    /// The fence issued with this grant.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// The fence with this grant's id: what a fenced write presents to a store.
    pub fn grant_fence(&self) -> GrantFence {
        GrantFence::new(self.fence, self.grant_id())
    }
}

impl<F: Fencing> Clone for Grant<F> {
    fn clone(&self) -> Self {
        Grant {
            key: self.key.clone(),
            token: self.token,
            grant_id: self.grant_id.clone(),
            fence: self.fence,
            ttl: self.ttl,
            requested_at: self.requested_at,
            handle: self.handle.clone(),
            lost: self.lost.clone(),
        }
    }
}

impl<F: Fencing> fmt::Debug for Grant<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grant")
            .field("key", &self.key)
            .field("token", &self.token)
            .field("fence", &self.fence)
            .field("ttl", &self.ttl)
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}
