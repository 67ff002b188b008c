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
    // A refused TLS handshake (its CA, its name, its dates, our certificate) is the settings',
    // and nothing was sent: no retry can help.
    #[cfg(feature = "tls")]
    if let Some(why) = tls_refusal(&e) {
        return Error::new(ErrorKind::InvalidConfig, BACKEND, format!("{what} failed: TLS was refused: {why}"))
            .with_source(e)
            .with_retryable(false);
    }
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

/// The TLS handshake's refusal inside `e`: the client library's error does not name its
/// cause as a `source`, so the search starts from the status or transport error it holds.
#[cfg(feature = "tls")]
fn tls_refusal(e: &EtcdError) -> Option<String> {
    let inner: &(dyn std::error::Error + 'static) = match e {
        EtcdError::GRpcStatus(status) => status,
        EtcdError::TransportError(transport) => transport,
        EtcdError::IoError(io) => io,
        _ => return None,
    };
    palisade_core::spi::tls::handshake_refusal(inner)
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

/// Whether the attempt failed with its connection (reset, closed under it, a broken pipe),
/// whatever the server did with it: a request written into a connection that a proxy, a load
/// balancer or a restarted member had closed. An idempotent request is sent again on a new
/// connection (issue 40: a release after a fault proxy cut the connection failed as
/// `OutcomeUnknown`, and its lock stayed held until its TTL).
fn connection_broken(e: &EtcdError) -> bool {
    match e {
        EtcdError::GRpcStatus(status) => {
            status.code() == Code::Unavailable
                || (status.code() == Code::Unknown && status.message().contains("transport error"))
        }
        EtcdError::TransportError(_) | EtcdError::IoError(_) => true,
        _ => false,
    }
}

/// How long an attempt of an idempotent request goes unanswered before another one is sent
/// beside it. A member cut off by a partition answers nothing and resets nothing, and until the
/// connection's keepalive gives up on it the balancer still routes requests there; sent again,
/// the request most likely reaches a live member.
const RESEND_IDEMPOTENT_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// The answer to a request sent by [`with_failover`].
pub(crate) struct Answer<T> {
    /// What the server answered.
    pub(crate) value: T,
    /// Whether another attempt of the same request may have reached the server too. A resend
    /// answers after the first attempt's effect: a delete resent after a first one that
    /// committed finds nothing to delete.
    pub(crate) resent: bool,
}

/// Runs one request within `request_timeout`, sending it again (the balancer picks another
/// member) while it fails without having left this process: a dead member must not fail a
/// request that a live one can serve. An `idempotent` request (a read, the delete of a key
/// named by our own token) is also sent again whenever its attempts go unanswered for
/// [`RESEND_IDEMPOTENT_AFTER`], and whenever its connection breaks under it: repeating it
/// changes nothing, and a silent member or a cut connection must not fail it.
///
/// A resend never cancels the attempts before it: the first answer of any attempt is the
/// answer. A cluster slower than the resend interval (a loaded leader, a slow fsync) still
/// answers the first attempt, where cancelling it for each resend would leave every request
/// unanswered until the timeout (issue 33: with answers 1.5 s late, every read and release
/// failed and every renewed lease was lost).
pub(crate) async fn with_failover<T, F, Fut>(
    request_timeout: std::time::Duration,
    what: &str,
    writes: bool,
    idempotent: bool,
    send: F,
) -> palisade_core::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, EtcdError>>,
{
    Ok(send_until_answered(request_timeout, what, writes, idempotent, send).await?.value)
}

/// [`with_failover`], saying whether the answer may follow another attempt's effect.
pub(crate) async fn send_until_answered<T, F, Fut>(
    request_timeout: std::time::Duration,
    what: &str,
    writes: bool,
    idempotent: bool,
    mut send: F,
) -> palisade_core::Result<Answer<T>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, EtcdError>>,
{
    use std::pin::Pin;
    use std::task::Poll;
    use tokio::time::{Instant, sleep_until};

    enum Event<T> {
        Answered(usize, Result<T, EtcdError>),
        Send,
        GiveUp,
    }

    let give_up = Instant::now() + request_timeout;
    let mut backoff = palisade_core::spi::Backoff::with_bounds(
        std::time::Duration::from_millis(5),
        std::time::Duration::from_millis(100),
    );
    // An attempt refused before it left this process is sent again after a backoff, unless
    // that would be past the give-up.
    let mut retry_after = |e: EtcdError| {
        let retry = Instant::now() + backoff.next_delay();
        if retry >= give_up { Err(map(e, what, writes)) } else { Ok(retry) }
    };
    let resend_at = || idempotent.then(|| Instant::now() + RESEND_IDEMPOTENT_AFTER);
    // The common case on its own: the first attempt answers before a resend is due. It costs
    // one timer and no list of attempts, which on a busy client is a visible share of what a
    // request costs beside the raw client's (issue 37).
    let mut first = Box::pin(send());
    let first_due = resend_at().map_or(give_up, |at| at.min(give_up));
    // What is in flight, how many attempts may have reached a server (every one sent but
    // those refused before they left this process), and when the next one goes.
    let (mut in_flight, mut reached, mut next_send): (Vec<Pin<Box<Fut>>>, usize, Option<Instant>) =
        match tokio::time::timeout_at(first_due, first.as_mut()).await {
            Ok(Ok(value)) => return Ok(Answer { value, resent: false }),
            Ok(Err(e)) if never_sent(&e) => (Vec::new(), 0, Some(retry_after(e)?)),
            // It may have reached the server, but sent again it changes nothing.
            Ok(Err(e)) if idempotent && connection_broken(&e) => (Vec::new(), 1, Some(retry_after(e)?)),
            Ok(Err(e)) => return Err(map(e, what, writes)),
            Err(_) if !idempotent || Instant::now() >= give_up => return Err(timed_out(what, writes)),
            // Unanswered for the resend interval: the loop sends it again at once, beside it.
            Err(_) => (vec![first], 1, Some(Instant::now())),
        };
    loop {
        let event = {
            let answered = std::future::poll_fn(|cx| {
                for (i, attempt) in in_flight.iter_mut().enumerate() {
                    if let Poll::Ready(result) = attempt.as_mut().poll(cx) {
                        return Poll::Ready((i, result));
                    }
                }
                Poll::Pending
            });
            let send_at = next_send.unwrap_or(give_up);
            tokio::select! {
                biased;
                (i, result) = answered => Event::Answered(i, result),
                () = sleep_until(give_up) => Event::GiveUp,
                () = sleep_until(send_at), if next_send.is_some() => Event::Send,
            }
        };
        match event {
            Event::GiveUp => return Err(timed_out(what, writes)),
            Event::Send => {
                if !in_flight.is_empty() {
                    debug!(what, "no answer within {RESEND_IDEMPOTENT_AFTER:?}; sending the idempotent request again");
                }
                in_flight.push(Box::pin(send()));
                reached += 1;
                next_send = resend_at();
            }
            Event::Answered(i, result) => {
                drop(in_flight.swap_remove(i));
                match result {
                    Ok(value) => return Ok(Answer { value, resent: reached > 1 }),
                    Err(e) if never_sent(&e) => {
                        reached -= 1;
                        let retry = retry_after(e)?;
                        next_send = Some(next_send.map_or(retry, |at| at.min(retry)));
                    }
                    Err(e) if idempotent && connection_broken(&e) && in_flight.is_empty() => {
                        let retry = retry_after(e)?;
                        next_send = Some(next_send.map_or(retry, |at| at.min(retry)));
                    }
                    // Another attempt may still answer.
                    Err(e) if !in_flight.is_empty() => {
                        debug!(what, error = %e, "an attempt failed; waiting for the others");
                    }
                    Err(e) => return Err(map(e, what, writes)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// What tonic answers for a request written into a connection the other side had closed
    /// (seen in the conformance suite after a fault proxy cut a connection).
    fn broken_pipe() -> EtcdError {
        EtcdError::GRpcStatus(tonic::Status::unknown("transport error"))
    }

    /// A send whose first attempt meets a broken connection and whose later ones are answered.
    fn broken_then_answered(sent: &AtomicUsize) -> impl FnMut() -> std::future::Ready<Result<u32, EtcdError>> + '_ {
        move || {
            let n = sent.fetch_add(1, Ordering::SeqCst);
            std::future::ready(if n == 0 { Err(broken_pipe()) } else { Ok(7) })
        }
    }

    #[tokio::test]
    async fn an_idempotent_request_that_meets_a_broken_connection_is_sent_again() {
        let sent = AtomicUsize::new(0);
        let answer = send_until_answered(Duration::from_secs(2), "release", true, true, broken_then_answered(&sent))
            .await
            .expect("answered by the second attempt");
        assert_eq!((answer.value, answer.resent), (7, true), "the first attempt may have reached the server");
        assert_eq!(sent.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_request_that_is_not_idempotent_is_not_sent_again_and_its_outcome_is_unknown() {
        let sent = AtomicUsize::new(0);
        let e = send_until_answered(Duration::from_secs(2), "acquire", true, false, broken_then_answered(&sent))
            .await
            .err()
            .expect("no second attempt");
        assert_eq!(e.kind(), palisade_core::ErrorKind::OutcomeUnknown);
        assert_eq!(sent.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_idempotent_request_whose_connection_stays_broken_fails_within_its_timeout() {
        let started = tokio::time::Instant::now();
        let e = send_until_answered(Duration::from_millis(300), "release", true, true, || {
            std::future::ready(Err::<u32, _>(broken_pipe()))
        })
        .await
        .err()
        .expect("never answered");
        assert_eq!(e.kind(), palisade_core::ErrorKind::OutcomeUnknown);
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    }
}
