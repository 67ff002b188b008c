//! Mapping the SDK's errors.

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use palisade_core::{Error, ErrorKind};

use crate::BACKEND;

/// Maps an SDK error of a request. `writes`: whether the request may have changed state, in
/// which case a failure after the request was sent (a timeout, a dropped connection) leaves
/// its outcome unknown, and saying so is what keeps a caller from blindly retrying or from
/// reporting a write that did land as lost.
pub(crate) fn map<E, R>(e: SdkError<E, R>, what: &str, writes: bool) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    let (kind, retryable) = match &e {
        SdkError::ConstructionFailure(_) => (ErrorKind::InvalidArgument, false),
        // Never sent: safe to retry, writes included.
        SdkError::DispatchFailure(d) if d.is_io() || d.is_timeout() => {
            (if writes { ErrorKind::OutcomeUnknown } else { ErrorKind::Unavailable }, !writes)
        }
        SdkError::DispatchFailure(_) => (ErrorKind::Unavailable, true),
        SdkError::TimeoutError(_) | SdkError::ResponseError(_) => {
            (if writes { ErrorKind::OutcomeUnknown } else { ErrorKind::Unavailable }, !writes)
        }
        SdkError::ServiceError(s) => match s.err().code() {
            Some(
                "ProvisionedThroughputExceededException"
                | "ThrottlingException"
                | "RequestLimitExceeded"
                | "InternalServerError"
                | "ServiceUnavailable"
                | "TransactionInProgressException",
            ) => (ErrorKind::Unavailable, true),
            Some("ResourceNotFoundException") => (ErrorKind::InvalidConfig, false),
            Some(
                "UnrecognizedClientException"
                | "InvalidSignatureException"
                | "AccessDeniedException"
                | "MissingAuthenticationToken"
                | "ExpiredTokenException",
            ) => (ErrorKind::InvalidConfig, false),
            Some("ValidationException") => (ErrorKind::InvalidArgument, false),
            _ => (ErrorKind::Backend, false),
        },
        _ => (ErrorKind::Backend, false),
    };
    let detail = match &e {
        SdkError::ServiceError(s) => {
            format!("{}: {}", s.err().code().unwrap_or("service error"), s.err().message().unwrap_or(""))
        }
        other => other.to_string(),
    };
    Error::new(kind, BACKEND, format!("{what} failed: {detail}")).with_source(e).with_retryable(retryable)
}
