//! Mapping the client library's errors.

use etcd_client::Error as EtcdError;
use palisade_core::{Error, ErrorKind};
use tonic::Code;
use tracing::debug;

use crate::BACKEND;

/// Maps an error of a request. `writes`: whether the request may have changed state, in which
/// case a timeout or a broken connection leaves its outcome unknown (and saying so is what
/// keeps a caller from blindly retrying into a double grant).
pub(crate) fn map(e: EtcdError, what: &str, writes: bool) -> Error {
    let writes = writes && !never_sent(&e);
    let (kind, retryable) = match &e {
        EtcdError::GRpcStatus(status) => match status.code() {
            Code::Unavailable => (if writes { ErrorKind::OutcomeUnknown } else { ErrorKind::Unavailable }, !writes),
            // A broken connection (TLS refused, reset) surfaces as Unknown "transport error".
            Code::Unknown if status.message().contains("transport error") => {
                (if writes { ErrorKind::OutcomeUnknown } else { ErrorKind::Unavailable }, !writes)
            }
            Code::DeadlineExceeded | Code::Cancelled | Code::Aborted | Code::Unknown if writes => {
                (ErrorKind::OutcomeUnknown, false)
            }
            Code::DeadlineExceeded | Code::Cancelled | Code::Aborted => (ErrorKind::Unavailable, true),
            Code::Unauthenticated | Code::PermissionDenied => (ErrorKind::InvalidConfig, false),
            // etcd reports bad credentials as InvalidArgument.
            Code::InvalidArgument
                if ["authentication failed", "user name is empty", "permission denied"]
                    .iter()
                    .any(|m| status.message().contains(m)) =>
            {
                (ErrorKind::InvalidConfig, false)
            }
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => (ErrorKind::Backend, false),
            Code::NotFound => (ErrorKind::LeaseLost, false),
            _ => (ErrorKind::Backend, false),
        },
        EtcdError::TransportError(_) | EtcdError::IoError(_) => (ErrorKind::Unavailable, true),
        EtcdError::InvalidArgs(_) | EtcdError::InvalidUri(_) | EtcdError::InvalidMetadataValue(_) => {
            (ErrorKind::InvalidConfig, false)
        }
        _ => (ErrorKind::Backend, false),
    };
    Error::new(kind, BACKEND, format!("{what} failed")).with_source(e).with_retryable(retryable)
}

/// A request that did not answer within the configured request timeout.
pub(crate) fn timed_out(what: &str, writes: bool) -> Error {
    if writes {
        Error::new(ErrorKind::OutcomeUnknown, BACKEND, format!("{what}: no answer within the request timeout"))
    } else {
        Error::new(ErrorKind::Unavailable, BACKEND, format!("{what}: no answer within the request timeout"))
            .with_retryable(true)
    }
}

/// Whether the request certainly never reached a server: the connection to the member it was
/// routed to could not even be opened (a dead member the client's balancer still picks). Such
/// a request is safe to send again, writes included.
pub(crate) fn never_sent(e: &EtcdError) -> bool {
    match e {
        EtcdError::GRpcStatus(status) if status.code() == Code::Unavailable => {
            let mut source = std::error::Error::source(status);
            while let Some(s) = source {
                if s.to_string().contains("tcp connect error") {
                    return true;
                }
                source = s.source();
            }
            status.message().contains("tcp connect error")
        }
        _ => false,
    }
}

/// How long an attempt of an idempotent request waits before it is sent again. A member cut
/// off by a partition answers nothing and resets nothing, and until the connection's keepalive
/// gives up on it the balancer still routes requests there; sent again, the request most
/// likely reaches a live member.
const RESEND_IDEMPOTENT_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs one request within `request_timeout`, sending it again (the balancer picks another
/// member) while it fails without having left this process: a dead member must not fail a
/// request that a live one can serve. An `idempotent` request (a read, the delete of a key
/// named by our own token) is also sent again when an attempt goes unanswered for
/// [`RESEND_IDEMPOTENT_AFTER`]: repeating it changes nothing, and a silent member must not hold
/// it for the whole request timeout.
pub(crate) async fn with_failover<T, F, Fut>(
    request_timeout: std::time::Duration,
    what: &str,
    writes: bool,
    idempotent: bool,
    mut send: F,
) -> palisade_core::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, EtcdError>>,
{
    use tokio::time::Instant;
    let give_up = Instant::now() + request_timeout;
    let mut backoff = palisade_core::spi::Backoff::with_bounds(
        std::time::Duration::from_millis(5),
        std::time::Duration::from_millis(100),
    );
    loop {
        let attempt_until = if idempotent { give_up.min(Instant::now() + RESEND_IDEMPOTENT_AFTER) } else { give_up };
        let result = match tokio::time::timeout_at(attempt_until, send()).await {
            Ok(result) => result,
            Err(_) if Instant::now() < give_up => {
                debug!(what, "no answer within {RESEND_IDEMPOTENT_AFTER:?}; sending the idempotent request again");
                continue;
            }
            Err(_) => return Err(timed_out(what, writes)),
        };
        match result {
            Ok(value) => return Ok(value),
            Err(e) if never_sent(&e) => {
                let delay = backoff.next_delay();
                if Instant::now() + delay >= give_up {
                    return Err(map(e, what, writes));
                }
                tokio::time::sleep(delay).await;
            }
            Err(e) => return Err(map(e, what, writes)),
        }
    }
}
