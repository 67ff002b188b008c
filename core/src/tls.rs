//! What the TLS backends share (feature `tls`): one crypto provider for the process, and a
//! handshake's refusal in words a person can act on.

use std::error::Error as StdError;

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
        next = e.source();
    }
    None
}

fn describe(error: &rustls::Error) -> String {
    match error {
        rustls::Error::InvalidCertificate(cause) => match cause {
            CertificateError::ExpiredContext { not_after, .. } => {
                format!("the server's certificate expired on {} (renew it)", utc(not_after.as_secs()))
            }
            CertificateError::Expired => "the server's certificate has expired (renew it)".to_string(),
            CertificateError::NotValidYetContext { not_before, .. } => format!(
                "the server's certificate is not valid before {} (check both clocks)",
                utc(not_before.as_secs())
            ),
            CertificateError::UnknownIssuer => "the server's certificate is signed by a CA this client does not \
                                                trust (give the CA that signed it)"
                .to_string(),
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                format!("the server's certificate is not valid for the host name connected to ({cause})")
            }
            other => format!("the server's certificate was refused: {other}"),
        },
        rustls::Error::AlertReceived(
            alert @ (AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateUnknown
            | AlertDescription::AccessDenied),
        ) => format!("the server refused this client's certificate, or wanted one and got none ({alert:?})"),
        other => format!("TLS: {other}"),
    }
}

/// `secs` after the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC` (proleptic Gregorian calendar).
fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rest = secs % 86_400;
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC", rest / 3600, rest % 3600 / 60, rest % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::UnixTime;
    use std::time::Duration;

    #[test]
    fn dates_are_utc_calendar_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_704_153_600), "2024-01-02 00:00:00 UTC");
        assert_eq!(utc(951_782_400 + 3_661), "2000-02-29 01:01:01 UTC");
        assert_eq!(utc(4_107_542_399), "2100-02-28 23:59:59 UTC");
    }

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
    fn other_errors_are_not_refusals() {
        let plain = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(handshake_refusal(&plain), None);
        let unknown = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        assert!(handshake_refusal(&unknown).unwrap().contains("does not trust"));
    }
}
