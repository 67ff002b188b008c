//! Mapping the client library's errors.

use palisade_core::{Error, ErrorKind};
use redis::RedisError;

use crate::service::BACKEND;

/// Maps an error of a command that may have reached the server: a timeout or a dropped
/// connection leaves its outcome unknown, and saying so is what keeps a caller from blindly
/// retrying into a double grant.
pub(crate) fn map(e: RedisError, what: &str) -> Error {
    let (kind, retryable) = if e.is_connection_refusal() {
        (ErrorKind::Unavailable, true)
    } else if e.is_timeout() || e.is_connection_dropped() || e.is_io_error() {
        (ErrorKind::OutcomeUnknown, false)
    } else {
        (ErrorKind::Backend, false)
    };
    Error::new(kind, BACKEND, format!("{what} failed")).with_source(e).with_retryable(retryable)
}
