//! One error type for every backend and store.
//!
//! Callers decide what to do from [`Error::kind`] and [`Error::is_retryable`], never from the
//! message text: the message is for humans and may change.

use std::borrow::Cow;
use std::fmt;

use crate::{Fence, ResourceKey};

/// A boxed error from a backend's client library, kept as the [`Error`]'s source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A shorthand for `Result<T, palisade_core::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, in terms a caller can act on.
///
/// New kinds may be added in minor releases, so match with a wildcard arm.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Waiting for a lock (or for a server) took longer than the caller allowed.
    Timeout,
    /// The caller's owner token does not hold the lock: it expired, was taken over, or was
    /// already released. Nothing was changed.
    NotHolder,
    /// The lease is known to be lost (its deadline passed or the backend reported loss);
    /// the operation was refused locally without contacting the backend.
    LeaseLost,
    /// The store refused a write because a higher fence has already been accepted for the
    /// resource. The data is untouched. This is fencing doing its job: a stale holder woke up.
    StaleFence {
        /// The fence the write carried.
        presented: Fence,
        /// The highest fence the store had accepted for the resource (its watermark).
        current: Fence,
    },
    /// The store refused a write whose fence **equals** its watermark but was issued with a
    /// different grant than the one that set it: the lock service issued one fence twice, so
    /// it lost part of its counter (Redis `appendfsync everysec`, a failover to a lagging
    /// replica). Nothing was written. This is a fence regression (fencing rules 2 and 5): it is
    /// counted in `palisade_lock_fence_regression_total`, and the lease that hit it is useless; release it
    /// and lock again (after [`FencedStoreExt::write`](crate::FencedStoreExt::write) has moved
    /// the counter, the next grant outranks every fence issued before the loss).
    DuplicateFence {
        /// The fence both grants carried.
        fence: Fence,
    },
    /// A condition inside a fenced write did not hold (a record that had to be absent exists,
    /// or a record changed since it was read). The fence was fine; nothing was written.
    Conflict,
    /// The backend could not be reached or refused service for now.
    Unavailable,
    /// A [`ResourceKey`](crate::ResourceKey) or record key is malformed.
    InvalidKey,
    /// An argument is out of range (a TTL of zero, a wait above 24 h, a fence a store cannot hold).
    InvalidArgument,
    /// A configuration or connection URL is malformed or inconsistent.
    InvalidConfig,
    /// The backend or build does not support the operation (a scheme whose cargo feature is
    /// off, a capability the backend lacks).
    Unsupported,
    /// The lock service issued a fence below a watermark a store reported: the service lost
    /// its counter (restart without persistence, failover, restore). See rule 5 of fencing.
    FenceRegression,
    /// A request was sent but its outcome is unknown (the connection dropped before the
    /// reply). Reconcile before retrying: a blind retry can double-apply or double-grant.
    OutcomeUnknown,
    /// The calling task already holds this lock from this service (inside
    /// [`with_lock`](crate::LockServiceExt::with_lock) on the same key): locks are not
    /// re-entrant, and waiting for ourselves would only end when the wait ran out. Nothing was
    /// sent to the backend.
    Reentrant,
    /// [`with_lock`](crate::LockServiceExt::with_lock)'s lease was lost while its work ran,
    /// and the work was cancelled at its next await. **What the work did before may have
    /// taken effect**: its fenced writes were judged by the store (those after a newer holder
    /// wrote are refused), anything else may have committed. Not retryable as such: find out
    /// what the work did (read back its records) before running it again.
    WorkCancelled,
    /// Any other failure reported by the backend.
    Backend,
}

impl ErrorKind {
    /// Whether an operation failing with this kind may succeed if simply tried again later.
    ///
    /// This is the default for [`Error::is_retryable`]; a backend may override it per error.
    pub fn default_retryable(self) -> bool {
        matches!(self, ErrorKind::Timeout | ErrorKind::Unavailable)
    }

    /// A short, stable, snake_case name, used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "timeout",
            ErrorKind::NotHolder => "not_holder",
            ErrorKind::LeaseLost => "lease_lost",
            ErrorKind::StaleFence { .. } => "stale_fence",
            ErrorKind::DuplicateFence { .. } => "duplicate_fence",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::InvalidKey => "invalid_key",
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::InvalidConfig => "invalid_config",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::FenceRegression => "fence_regression",
            ErrorKind::OutcomeUnknown => "outcome_unknown",
            ErrorKind::Reentrant => "reentrant",
            ErrorKind::WorkCancelled => "work_cancelled",
            ErrorKind::Backend => "backend",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::StaleFence { presented, current } => {
                write!(f, "stale fence (presented {presented}, store holds {current})")
            }
            ErrorKind::DuplicateFence { fence } => {
                write!(f, "duplicate fence ({fence} was issued to two grants)")
            }
            other => f.write_str(other.as_str()),
        }
    }
}

/// The error every Palisade operation returns.
///
/// It carries a [`kind`](Error::kind), the name of the backend or store that produced it,
/// a human message, an optional source error, and whether retrying makes sense.
pub struct Error {
    kind: ErrorKind,
    backend: Cow<'static, str>,
    message: Cow<'static, str>,
    retryable: bool,
    source: Option<BoxError>,
    resource: Option<Box<ResourceKey>>,
}

impl Error {
    /// A new error of `kind` from `backend` (e.g. `"redis"`, `"sqlite"`, `"core"`).
    pub fn new(kind: ErrorKind, backend: impl Into<Cow<'static, str>>, message: impl Into<Cow<'static, str>>) -> Self {
        Error {
            kind,
            backend: backend.into(),
            message: message.into(),
            retryable: kind.default_retryable(),
            source: None,
            resource: None,
        }
    }

    /// The [`ErrorKind::StaleFence`] error a store returns when it refuses a write.
    pub fn stale_fence(backend: impl Into<Cow<'static, str>>, presented: Fence, current: Fence) -> Self {
        Error::new(
            ErrorKind::StaleFence { presented, current },
            backend,
            "write refused: a newer lock holder has already written to this resource",
        )
    }

    /// The [`ErrorKind::DuplicateFence`] error a store returns when an equal fence comes from a
    /// grant other than the one that set its watermark.
    pub fn duplicate_fence(backend: impl Into<Cow<'static, str>>, fence: Fence) -> Self {
        Error::new(
            ErrorKind::DuplicateFence { fence },
            backend,
            "write refused: another grant already wrote with this fence; the lock service issued it twice (it lost part of its counter)",
        )
    }

    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Names the resource the error is about: the member of a multi-resource write
    /// ([`FencedStore::apply_all`](crate::FencedStore::apply_all)) whose fence was refused, so
    /// the caller knows which lease went stale. Shown in [`Display`](fmt::Display) after the
    /// backend.
    pub fn with_resource(mut self, resource: ResourceKey) -> Self {
        self.resource = Some(Box::new(resource));
        self
    }

    /// The resource the error is about, where the store named it (every fence refusal of a
    /// store in this repository does).
    pub fn resource(&self) -> Option<&ResourceKey> {
        self.resource.as_deref()
    }

    /// Overrides whether retrying makes sense.
    pub fn with_retryable(mut self, retryable: bool) -> Self {
        self.retryable = retryable;
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The backend or store that reported the error (`"core"` for local validation).
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// The human-readable message, without the kind or backend.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether the same operation may succeed if tried again later.
    ///
    /// A retryable error never hides an ambiguous outcome: those are
    /// [`ErrorKind::OutcomeUnknown`] and not retryable.
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    /// `Some((presented, current))` when this is a stale-fence rejection.
    pub fn stale_fence_details(&self) -> Option<(Fence, Fence)> {
        match self.kind {
            ErrorKind::StaleFence { presented, current } => Some((presented, current)),
            _ => None,
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind)
            .field("backend", &self.backend)
            .field("message", &self.message)
            .field("retryable", &self.retryable);
        if let Some(resource) = &self.resource {
            d.field("resource", resource);
        }
        if let Some(source) = &self.source {
            d.field("source", source);
        }
        d.finish()
    }
}

/// This error alone: kind, backend and message. The cause is [`source`](std::error::Error::source),
/// not repeated here, so error reporters (`anyhow`, `eyre`, [`Error::report`]) print it once.
impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.kind, self.backend)?;
        if let Some(resource) = &self.resource {
            write!(f, " on {resource}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl Error {
    /// The error and its chain of causes on one line (`… : cause: cause`), for a program that
    /// prints errors itself rather than through an error reporter.
    ///
    /// ```
    /// use palisade_core::{Error, ErrorKind};
    /// let e = Error::new(ErrorKind::Unavailable, "redis", "cannot connect")
    ///     .with_source(std::io::Error::other("connection refused"));
    /// assert_eq!(e.to_string(), "unavailable (redis): cannot connect");
    /// assert_eq!(e.report().to_string(), "unavailable (redis): cannot connect: connection refused");
    /// ```
    pub fn report(&self) -> impl fmt::Display + '_ {
        Report(self)
    }
}

struct Report<'a>(&'a Error);

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = std::error::Error::source(self.0);
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_ref().map(|s| s.as_ref() as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_defaults_follow_the_kind() {
        assert!(Error::new(ErrorKind::Timeout, "core", "t").is_retryable());
        assert!(Error::new(ErrorKind::Unavailable, "redis", "down").is_retryable());
        assert!(!Error::new(ErrorKind::OutcomeUnknown, "redis", "?").is_retryable());
        assert!(!Error::stale_fence("sqlite", Fence::new(1), Fence::new(2)).is_retryable());
        assert!(Error::new(ErrorKind::Backend, "x", "y").with_retryable(true).is_retryable());
    }

    #[test]
    fn display_names_backend_and_fences() {
        let e = Error::stale_fence("sqlite", Fence::new(41), Fence::new(42));
        let s = e.to_string();
        assert!(s.contains("presented 41"), "{s}");
        assert!(s.contains("store holds 42"), "{s}");
        assert!(s.contains("sqlite"), "{s}");
        assert_eq!(e.stale_fence_details(), Some((Fence::new(41), Fence::new(42))));
    }

    /// `Display` and `source()` must not both carry the cause: reporters that walk the chain
    /// (anyhow, eyre) would print it twice.
    #[test]
    fn the_source_is_printed_once_by_a_chain_reporter() {
        let e = Error::new(ErrorKind::Unavailable, "redis", "cannot connect")
            .with_source(std::io::Error::other("connection refused"));
        let mut chain = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            chain.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        assert_eq!(chain.matches("connection refused").count(), 1, "{chain}");
        assert_eq!(e.report().to_string(), chain);
    }
}
