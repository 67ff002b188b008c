//! TLS to the ensemble (`zks://`): the client's options, and a handshake of our own that says
//! why TLS failed.
//!
//! The client crate logs a failed handshake at debug level and retries, as it does any lost
//! connection, until the session timeout: a wrong CA would look like an outage, retried
//! forever. So beside each session's connect [`refusal`] makes a handshake of its own with
//! the same trust and identity ([`probe_handshake`]) and asks `srvr` (a four-letter word every
//! server answers or declines in words): a refusal it sees is a configuration error, reported
//! at once.

use palisade_core::spi::tls::{Handshake, probe_handshake};
use palisade_core::{Error, ErrorKind, Result};
use zookeeper_client as zk;

use crate::{BACKEND, ZkConfig};

fn invalid(message: String) -> Error {
    Error::new(ErrorKind::InvalidConfig, BACKEND, message).with_retryable(false)
}

fn pem_text<'a>(what: &str, pem: &'a [u8]) -> Result<&'a str> {
    std::str::from_utf8(pem).map_err(|_| invalid(format!("the {what} is not PEM text")))
}

/// The client crate's options: trust the configured CA, present the configured identity.
pub(crate) fn options(config: &ZkConfig) -> Result<zk::TlsOptions> {
    palisade_core::spi::tls::install_default_provider();
    let ca = config.tls_root_cert.as_deref().unwrap_or_default();
    let mut options = zk::TlsOptions::new()
        .with_pem_ca(pem_text("TLS root certificate", ca)?)
        .map_err(|e| invalid(format!("the TLS root certificate is not a PEM certificate: {e}")))?;
    if let Some((cert, key)) = &config.tls_client_identity {
        options = options
            .with_pem_identity(pem_text("TLS client certificate", cert)?, pem_text("TLS client key", key)?)
            .map_err(|e| invalid(format!("the TLS client identity is not a PEM certificate and key: {e}")))?;
    }
    Ok(options)
}

/// The configuration error that keeps the session from starting, when every server that
/// answered refused our handshake; `None` when one accepted it or none answered (an outage,
/// which the session's own connect reports). Blocking: call it off the runtime's threads.
pub(crate) fn refusal(config: &ZkConfig) -> Option<Error> {
    let roots = config.tls_root_cert.as_deref().unwrap_or_default();
    let identity = config.tls_client_identity.as_ref().map(|(cert, key)| (cert.as_slice(), key.as_slice()));
    // A plaintext port answers `srvr` in words (or declines it in words).
    let plaintext =
        |reply: &[u8]| reply.starts_with(b"Zookeeper version") || reply.starts_with(b"srvr is not executed");
    let mut first = None;
    for server in &config.servers {
        match probe_handshake(server, roots, identity, b"srvr", &plaintext, config.connect_timeout) {
            Handshake::Accepted => return None,
            Handshake::Refused(why) => {
                first.get_or_insert_with(|| format!("TLS to {server} was refused: {why}"));
            }
            Handshake::Plaintext => {
                first.get_or_insert_with(|| {
                    format!(
                        "{server} does not speak TLS: it is a plaintext port (zk://), not the server's secureClientPort"
                    )
                });
            }
            _ => {}
        }
    }
    first.map(|why| invalid(format!("cannot connect to {}: {why}", config.redacted_url())))
}
