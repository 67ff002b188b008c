//! Mapping the client library's errors.

use palisade_core::{Error, ErrorKind};
use redis::RedisError;

use crate::service::BACKEND;

/// Maps an error of a command that may have reached the server: a timeout or a dropped
/// connection leaves its outcome unknown, and saying so is what keeps a caller from blindly
/// retrying into a double grant.
pub(crate) fn map(e: RedisError, what: &str) -> Error {
    use redis::{ErrorKind as RedisKind, ServerErrorKind};
    let not_run = matches!(
        e.kind(),
        RedisKind::Server(
            ServerErrorKind::BusyLoading
                | ServerErrorKind::TryAgain
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
        )
    );
    let (kind, retryable) = if e.is_connection_refusal() || not_run {
        // Refused, or answered "not now" without running the command (a restarted server
        // still loading its data; a demoted master refusing writes as a replica, READONLY,
        // which the scripts meet before their first write): nothing happened, so trying again
        // (on the new master, behind Sentinel) is safe.
        (ErrorKind::Unavailable, true)
    } else if e.is_timeout() || e.is_connection_dropped() || e.is_io_error() {
        (ErrorKind::OutcomeUnknown, false)
    } else {
        (ErrorKind::Backend, false)
    };
    Error::new(kind, BACKEND, format!("{what} failed")).with_source(e).with_retryable(retryable)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use redis::{ErrorKind as RedisKind, RedisError, ServerErrorKind};

    use super::*;

    #[test]
    fn a_server_still_loading_its_data_is_unavailable_and_retryable() {
        // Redis answers LOADING (and TRYAGAIN, MASTERDOWN) without running the command: a
        // restarted server reading its AOF said so to the first acquire of a benchmark, which
        // failed as a permanent backend error.
        for kind in [
            ServerErrorKind::BusyLoading,
            ServerErrorKind::TryAgain,
            ServerErrorKind::MasterDown,
            ServerErrorKind::ReadOnly,
        ] {
            let e = map(RedisError::from((RedisKind::Server(kind), "not now")), "acquire");
            assert_eq!(e.kind(), ErrorKind::Unavailable, "{kind:?}");
            assert!(e.is_retryable(), "{kind:?}");
        }
        let other = map(RedisError::from((RedisKind::Server(ServerErrorKind::ResponseError), "ERR")), "acquire");
        assert_eq!(other.kind(), ErrorKind::Backend);
    }
}
