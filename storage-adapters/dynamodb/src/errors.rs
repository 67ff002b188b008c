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
    // A refused TLS handshake is the endpoint's settings (its CA, its name), never a blip.
    if let Some(why) = palisade_core::spi::tls::handshake_refusal(&e) {
        return Error::new(ErrorKind::InvalidConfig, BACKEND, format!("{what} failed: TLS was refused: {why}"))
            .with_source(e)
            .with_retryable(false);
    }
    if let Some(why) = credentials_missing(&e) {
        return Error::new(ErrorKind::InvalidConfig, BACKEND, format!("{what} failed: {why}"))
            .with_source(e)
            .with_retryable(false);
    }
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
        SdkError::ServiceError(s) => classify(s.err().code(), writes),
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

/// Why the request could not be signed, when the SDK's credential chain found nothing or was
/// misconfigured: the deployment's settings, which no retry changes (a provider that timed out
/// or failed on its own is an outage, and not matched here).
fn credentials_missing(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    use aws_credential_types::provider::error::CredentialsError;
    let mut next = Some(e);
    while let Some(error) = next {
        match error.downcast_ref::<CredentialsError>() {
            Some(CredentialsError::CredentialsNotLoaded(_)) => {
                return Some(
                    "no AWS credentials: the SDK's standard chain found none (environment variables, the \
                     profile files, web identity, the container and instance metadata)"
                        .to_string(),
                );
            }
            Some(CredentialsError::InvalidConfiguration(_)) => {
                return Some(
                    "the AWS credential chain's settings are invalid (a profile, or a credential source it names)"
                        .to_string(),
                );
            }
            _ => next = error.source(),
        }
    }
    None
}

/// The kind of a service error by its code, and whether retrying is safe.
fn classify(code: Option<&str>, writes: bool) -> (ErrorKind, bool) {
    match code {
        // Refused before anything happened: retry.
        Some("ProvisionedThroughputExceededException" | "ThrottlingException" | "RequestLimitExceeded") => {
            (ErrorKind::Unavailable, true)
        }
        // The write may still commit (DynamoDB: "the request may or may not have succeeded";
        // a transaction in progress is the first attempt, still running). A retry with a fresh
        // token could apply the batch twice or report a false Conflict: the outcome is unknown.
        Some("InternalServerError" | "ServiceUnavailable" | "TransactionInProgressException") if writes => {
            (ErrorKind::OutcomeUnknown, false)
        }
        Some("InternalServerError" | "ServiceUnavailable" | "TransactionInProgressException") => {
            (ErrorKind::Unavailable, true)
        }
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write that failed with an error after which it may still have committed is never
    /// reported as a retryable `Unavailable`.
    #[test]
    fn ambiguous_write_failures_are_outcome_unknown() {
        for code in ["InternalServerError", "ServiceUnavailable", "TransactionInProgressException"] {
            assert_eq!(classify(Some(code), true), (ErrorKind::OutcomeUnknown, false), "{code}");
            assert_eq!(classify(Some(code), false), (ErrorKind::Unavailable, true), "{code} on a read");
        }
        assert_eq!(classify(Some("ThrottlingException"), true), (ErrorKind::Unavailable, true));
        assert_eq!(classify(Some("ValidationException"), true), (ErrorKind::InvalidArgument, false));
    }
}
