//! What the TLS backends share (feature `tls`): one crypto provider for the process, and a
//! handshake's refusal in words a person can act on.

use std::error::Error as StdError;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::{AlertDescription, CertificateError};

/// Installs rustls's `ring` provider as the process's default, unless a provider is installed
/// already (by the application or another crate), which is then kept.
///
/// Client crates that build their TLS configuration with `rustls::ClientConfig::builder()`
/// need a default provider once more than one is compiled into the program (any crate may
/// enable `aws-lc-rs` as well as `ring`); without one they panic. Backends call this before
/// their first TLS connection.
pub fn install_default_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may have installed one in between: theirs is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Why a TLS handshake failed, when `error` is rustls's or wraps it (in its source chain, or
/// inside an I/O error, as most clients pass it on): the cause in words, with the server's
/// certificate's expiry date when it expired. `None` when no rustls error is inside, so a
/// caller can tell a refused handshake (a configuration error: retrying cannot help) from a
/// broken connection.
pub fn handshake_refusal(error: &(dyn StdError + 'static)) -> Option<String> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(describe(tls));
        }
        if let Some(inner) = e.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref)
            && let Some(found) = handshake_refusal(inner)
        {
            return Some(found);
        }
        // Some clients pass rustls's error on as its text alone, or behind a wrapper that hides
        // its type (an `Arc<dyn Error>`): rustls's own words still say what it was.
        if let Some(found) = from_text(&e.to_string()) {
            return Some(found);
        }
        next = e.source();
    }
    None
}

/// [`describe`] of the rustls error whose `Display` is `text`, for the errors a handshake
/// refusal can be; `None` for any other text.
fn from_text(text: &str) -> Option<String> {
    if let Some(alert) = text.strip_prefix("received fatal alert: ") {
        return CLIENT_CERTIFICATE_ALERTS
            .iter()
            .any(|(name, _)| *name == alert)
            .then(|| client_certificate_refused(alert));
    }
    let Some(certificate) = text.strip_prefix("invalid peer certificate: ") else {
        return text
            .starts_with("received corrupt message")
            .then(|| format!("the server does not speak TLS on this port (a plaintext port?): {text}"));
    };
    let cause = match certificate {
        "UnknownIssuer" => CertificateError::UnknownIssuer,
        _ if certificate.starts_with("NotValidForName")
            || certificate.starts_with("certificate not valid for name") =>
        {
            return Some(format!(
                "the server's certificate is not valid for the host name connected to ({certificate})"
            ));
        }
        _ if certificate.starts_with("Expired") || certificate.starts_with("certificate expired") => {
            // "… but certificate is not valid after <secs> (…)": the date, when the text has it.
            let after = certificate.split("not valid after ").nth(1).and_then(|rest| rest.split(' ').next());
            if let Some(secs) = after.and_then(|secs| secs.parse::<u64>().ok()) {
                return Some(format!(
                    "the server's certificate expired on {} (renew it)",
                    crate::date::utc_timestamp(secs)
                ));
            }
            CertificateError::Expired
        }
        _ => return Some(format!("the server's certificate was refused: {certificate}")),
    };
    Some(describe(&rustls::Error::InvalidCertificate(cause)))
}

/// What a handshake of a backend's own ([`probe_handshake`]) made of one server.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Handshake {
    /// Unreachable, or it hung up for reasons of its own: says nothing about the settings.
    Inconclusive,
    /// The handshake, and the server's acceptance of our certificate, passed: whatever fails,
    /// it is not TLS.
    Accepted,
    /// The handshake (or our certificate) was refused, for this reason
    /// ([`handshake_refusal`]'s words).
    Refused(String),
    /// The server does not speak TLS: it answered `plaintext`'s question in plaintext.
    Plaintext,
}

/// What a backend checks a server with when its client library reports a failed TLS
/// connection only as a lost one (a refused handshake retried as an outage, a client
/// certificate refused after a TLS 1.3 handshake seen as a closed connection): a handshake of
/// its own with `address` (`host:port`; the host is the name the certificate must carry),
/// trusting the CA certificates in `roots` (PEM) and presenting `identity` (PEM certificate
/// chain, PEM private key) if given, then `question` sent and the answer read to its end (a
/// refusal of our certificate arrives there). When the server hangs up on the handshake, the
/// same question asked in plaintext, and `plaintext_answer` (a test of the answer's first
/// bytes), tell a plaintext port ([`plaintext_port`]). Blocking, each step bounded by `within`: call it off the runtime's
/// threads. Unusable `roots` or `identity` are `Refused` with the reason.
pub fn probe_handshake(
    address: &str,
    roots: &[u8],
    identity: Option<(&[u8], &[u8])>,
    question: &[u8],
    plaintext_answer: &dyn Fn(&[u8]) -> bool,
    within: Duration,
) -> Handshake {
    let config = match client_config(roots, identity) {
        Ok(config) => config,
        Err(why) => return Handshake::Refused(why),
    };
    let Some((host, _)) = address.rsplit_once(':') else { return Handshake::Inconclusive };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let Some(addr) = address.to_socket_addrs().ok().and_then(|mut a| a.next()) else {
        return Handshake::Inconclusive;
    };
    let Ok(name) = rustls::pki_types::ServerName::try_from(host.to_string()) else { return Handshake::Inconclusive };
    let Ok(mut connection) = rustls::ClientConnection::new(config, name) else { return Handshake::Inconclusive };
    let Ok(mut tcp) = TcpStream::connect_timeout(&addr, within) else { return Handshake::Inconclusive };
    let _ = tcp.set_read_timeout(Some(within));
    let _ = tcp.set_write_timeout(Some(within));
    let mut stream = rustls::Stream::new(&mut connection, &mut tcp);
    let mut reply = Vec::new();
    match stream.write_all(question).and_then(|()| stream.read_to_end(&mut reply)) {
        Ok(_) => Handshake::Accepted,
        Err(e) => match handshake_refusal(&e) {
            Some(why) => Handshake::Refused(why),
            // A timeout after the handshake: the server took our certificate and is thinking.
            None if !stream.conn.is_handshaking() => Handshake::Accepted,
            None if plaintext_port(address, question, within, plaintext_answer) => Handshake::Plaintext,
            None => Handshake::Inconclusive,
        },
    }
}

/// A client configuration (ring) that trusts `roots` and presents `identity`.
fn client_config(roots: &[u8], identity: Option<(&[u8], &[u8])>) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut store = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(roots) {
        let cert = cert.map_err(|e| format!("the TLS root certificate is not PEM: {e}"))?;
        store.add(cert).map_err(|e| format!("the TLS root certificate is unusable: {e}"))?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(store);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = rustls::pki_types::CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("the TLS client certificate is not PEM: {e}"))?;
            let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| format!("the TLS client key is not a PEM private key: {e}"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("the TLS client identity is unusable: {e}"))?
        }
    };
    Ok(Arc::new(config))
}

/// Whether the server at `address` (`host:port`) answers `question`, sent in plaintext, the way
/// `answered` recognises (given the first bytes of the answer): how a backend tells a plaintext
/// port, which its TLS client met only as a handshake that timed out or was cut short, from an
/// outage. Blocking, each step bounded by `within`: call it off the runtime's threads.
pub fn plaintext_port(address: &str, question: &[u8], within: Duration, answered: impl Fn(&[u8]) -> bool) -> bool {
    let Some(addr) = address.to_socket_addrs().ok().and_then(|mut a| a.next()) else { return false };
    let Ok(mut tcp) = TcpStream::connect_timeout(&addr, within) else { return false };
    let _ = tcp.set_read_timeout(Some(within));
    let _ = tcp.set_write_timeout(Some(within));
    if tcp.write_all(question).is_err() {
        return false;
    }
    let mut reply = [0u8; 64];
    let mut got = 0;
    while got < reply.len() {
        match tcp.read(&mut reply[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
        if answered(&reply[..got]) {
            return true;
        }
    }
    answered(&reply[..got])
}

/// Checks that `pem` holds at least one certificate, each usable as a trust anchor, and
/// returns how many: so that a client library that panics on a bad one (the AWS SDK's does) is
/// never handed one. The error says what is wrong, for a configuration error.
pub fn check_root_certificates(pem: &[u8]) -> Result<usize, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| format!("not PEM certificates: {e}"))?;
        roots.add(cert).map_err(|e| format!("a certificate that cannot be a trust anchor: {e}"))?;
    }
    match roots.len() {
        0 => Err("no certificate in the PEM".to_string()),
        n => Ok(n),
    }
}

fn describe(error: &rustls::Error) -> String {
    match error {
        rustls::Error::InvalidCertificate(cause) => match cause {
            CertificateError::ExpiredContext { not_after, .. } => {
                format!(
                    "the server's certificate expired on {} (renew it)",
                    crate::date::utc_timestamp(not_after.as_secs())
                )
            }
            CertificateError::Expired => "the server's certificate has expired (renew it)".to_string(),
            CertificateError::NotValidYetContext { not_before, .. } => format!(
                "the server's certificate is not valid before {} (check both clocks)",
                crate::date::utc_timestamp(not_before.as_secs())
            ),
            CertificateError::UnknownIssuer => "the server's certificate is signed by a CA this client does not \
                                                trust (give the CA that signed it)"
                .to_string(),
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                format!("the server's certificate is not valid for the host name connected to ({cause})")
            }
            other => format!("the server's certificate was refused: {other}"),
        },
        rustls::Error::AlertReceived(alert) if CLIENT_CERTIFICATE_ALERTS.iter().any(|(_, a)| a == alert) => {
            client_certificate_refused(&format!("{alert:?}"))
        }
        rustls::Error::InvalidMessage(_) => {
            format!("the server does not speak TLS on this port (a plaintext port?): {error}")
        }
        other => format!("TLS: {other}"),
    }
}

/// The alerts a server sends about the client's certificate, by rustls's name for them.
const CLIENT_CERTIFICATE_ALERTS: [(&str, AlertDescription); 6] = [
    ("CertificateRequired", AlertDescription::CertificateRequired),
    ("BadCertificate", AlertDescription::BadCertificate),
    ("UnknownCA", AlertDescription::UnknownCA),
    ("CertificateExpired", AlertDescription::CertificateExpired),
    ("CertificateUnknown", AlertDescription::CertificateUnknown),
    ("AccessDenied", AlertDescription::AccessDenied),
];

fn client_certificate_refused(alert: &str) -> String {
    format!("the server refused this client's certificate, or wanted one and got none ({alert})")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::UnixTime;
    use std::time::Duration;

    #[test]
    fn an_expired_certificate_names_its_date_through_an_io_error() {
        let expired = rustls::Error::InvalidCertificate(CertificateError::ExpiredContext {
            time: UnixTime::since_unix_epoch(Duration::from_secs(1_800_000_000)),
            not_after: UnixTime::since_unix_epoch(Duration::from_secs(1_704_153_600)),
        });
        let wrapped = std::io::Error::new(std::io::ErrorKind::InvalidData, expired);
        let said = handshake_refusal(&wrapped).unwrap();
        assert!(said.contains("expired on 2024-01-02 00:00:00 UTC"), "{said}");
    }

    #[test]
    fn root_certificates_are_checked_before_a_library_can_panic_on_them() {
        assert!(check_root_certificates(b"").unwrap_err().contains("no certificate"));
        let garbage = b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n";
        assert!(check_root_certificates(garbage).unwrap_err().contains("trust anchor"));
    }

    /// What a client that passes on rustls's error as text makes of each refusal is what the
    /// typed error gives: rustls's words are checked here, so a release that rewords them fails.
    #[test]
    fn refusals_read_the_same_from_rustls_text() {
        let expired = rustls::Error::InvalidCertificate(CertificateError::ExpiredContext {
            time: UnixTime::since_unix_epoch(Duration::from_secs(1_800_000_000)),
            not_after: UnixTime::since_unix_epoch(Duration::from_secs(1_704_153_600)),
        });
        let cases = [
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
            rustls::Error::InvalidCertificate(CertificateError::NotValidForName),
            rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                expected: rustls::pki_types::ServerName::try_from("a.example").unwrap(),
                presented: vec!["b.example".into()],
            }),
            expired,
            rustls::Error::InvalidCertificate(CertificateError::Expired),
            rustls::Error::AlertReceived(AlertDescription::BadCertificate),
            rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType),
        ];
        for typed in cases {
            let from_type = handshake_refusal(&typed).unwrap();
            let text = std::io::Error::other(typed.to_string());
            let from_words = handshake_refusal(&text).unwrap_or_default();
            assert_eq!(from_words.split(':').next(), from_type.split(':').next(), "{typed}");
        }
    }

    #[test]
    fn an_alert_about_our_certificate_is_recognised_as_text_too() {
        let typed = rustls::Error::AlertReceived(AlertDescription::CertificateRequired);
        assert!(handshake_refusal(&typed).unwrap().contains("refused this client's certificate"));
        let text = std::io::Error::new(std::io::ErrorKind::InvalidData, typed.to_string());
        assert!(handshake_refusal(&text).unwrap().contains("(CertificateRequired)"));
        let other = std::io::Error::new(std::io::ErrorKind::InvalidData, "received fatal alert: DecodeError");
        assert_eq!(handshake_refusal(&other), None);
    }

    #[test]
    fn other_errors_are_not_refusals() {
        let plain = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(handshake_refusal(&plain), None);
        let unknown = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        assert!(handshake_refusal(&unknown).unwrap().contains("does not trust"));
    }
}
