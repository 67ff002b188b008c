//! Validated durations for leases and waits.

use std::fmt;
use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};

/// A lease's time to live: between [`Ttl::MIN`] and [`Ttl::MAX`].
///
/// A TTL should exceed the p99 of the work it protects, but not so much that crash recovery
/// stalls. Long-held leases (leadership) are renewed on progress instead of being given a
/// huge TTL, so the maximum is deliberately a day.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ttl(Duration);

impl Ttl {
    /// The shortest TTL accepted: one millisecond (Redis `PX` granularity).
    pub const MIN: Duration = Duration::from_millis(1);
    /// The longest TTL accepted: 24 hours.
    pub const MAX: Duration = Duration::from_secs(24 * 60 * 60);

    /// Validates `d`. Zero, sub-millisecond and over-a-day values are
    /// [`ErrorKind::InvalidArgument`].
    pub fn new(d: Duration) -> Result<Self> {
        if d < Self::MIN {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "core",
                format!("TTL {d:?} is below the minimum of 1 ms"),
            ));
        }
        if d > Self::MAX {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "core",
                format!("TTL {d:?} is above the maximum of 24 h; renew on progress instead"),
            ));
        }
        Ok(Ttl(d))
    }

    /// A TTL of `ms` milliseconds, validated.
    pub fn from_millis(ms: u64) -> Result<Self> {
        Ttl::new(Duration::from_millis(ms))
    }

    /// The duration.
    pub fn get(self) -> Duration {
        self.0
    }

    /// Whole milliseconds, rounded up, as backends with millisecond TTLs want them.
    pub fn as_millis_ceil(self) -> u64 {
        let ms = self.0.as_millis();
        let rounded = if self.0.subsec_nanos().is_multiple_of(1_000_000) { ms } else { ms + 1 };
        u64::try_from(rounded).unwrap_or(u64::MAX)
    }

    /// The local safety margin for clock drift: 1 % of the TTL plus 2 ms (Redlock's rule),
    /// never more than half the TTL.
    pub fn drift_margin(self) -> Duration {
        (self.0 / 100 + Duration::from_millis(2)).min(self.0 / 2)
    }
}

impl fmt::Debug for Ttl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ttl({:?})", self.0)
    }
}

impl TryFrom<Duration> for Ttl {
    type Error = Error;
    fn try_from(d: Duration) -> Result<Self> {
        Ttl::new(d)
    }
}

/// Checks a wait timeout for [`LockService::acquire`](crate::LockService::acquire): at most
/// [`Ttl::MAX`]. Zero is valid: one attempt, as everywhere else a zero wait means.
pub fn validate_wait(wait: Duration) -> Result<()> {
    if wait > Ttl::MAX {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "core",
            format!("wait timeout {wait:?} is above the maximum of 24 h"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_enforced() {
        assert_eq!(Ttl::new(Duration::ZERO).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(Ttl::new(Duration::from_micros(999)).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(Ttl::new(Ttl::MAX + Duration::from_secs(1)).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert!(Ttl::new(Ttl::MIN).is_ok());
        assert!(Ttl::new(Ttl::MAX).is_ok());
        assert!(validate_wait(Duration::ZERO).is_ok(), "zero: one attempt");
        assert_eq!(validate_wait(Ttl::MAX + Duration::from_millis(1)).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert!(validate_wait(Duration::from_millis(1)).is_ok());
    }

    #[test]
    fn millis_round_up_and_margin_is_bounded() {
        assert_eq!(Ttl::new(Duration::from_micros(1500)).unwrap().as_millis_ceil(), 2);
        assert_eq!(Ttl::from_millis(30_000).unwrap().as_millis_ceil(), 30_000);
        assert_eq!(Ttl::from_millis(30_000).unwrap().drift_margin(), Duration::from_millis(302));
        assert_eq!(Ttl::from_millis(2).unwrap().drift_margin(), Duration::from_millis(1));
    }
}
