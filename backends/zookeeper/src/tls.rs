//! TLS to the ensemble (`zks://`): the client's options, and a handshake of our own that says
//! why TLS failed.
//!
//! The client crate logs a failed handshake at debug level and retries, as it does any lost
//! connection, until the session timeout: a wrong CA would look like an outage, retried
//! forever. So beside each session's connect [`refusal`] makes a handshake of its own with
//! the same trust and identity, and asks `srvr` (a four-letter word every server answers or
//! declines in words): a refusal it sees is a configuration error, reported at once.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use palisade_core::{Error, ErrorKind, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
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

/// The same trust and identity as [`options`], for our own handshake.
fn client_config(config: &ZkConfig) -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(config.tls_root_cert.as_deref().unwrap_or_default()) {
        let cert = cert.map_err(|e| invalid(format!("the TLS root certificate is not PEM: {e}")))?;
        roots.add(cert).map_err(|e| invalid(format!("the TLS root certificate is unusable: {e}")))?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(format!("TLS: {e}")))?
        .with_root_certificates(roots);
    let config = match &config.tls_client_identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| invalid(format!("the TLS client certificate is not PEM: {e}")))?;
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| invalid(format!("the TLS client key is not a PEM private key: {e}")))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| invalid(format!("the TLS client identity is unusable: {e}")))?
        }
    };
    Ok(Arc::new(config))
}

/// What one server made of our handshake.
enum Probe {
    /// Unreachable, or it hung up for reasons of its own: says nothing about the settings.
    Inconclusive,
    /// The handshake passed: whatever fails, it is not TLS.
    Accepted,
    /// The handshake was refused, for this reason.
    Refused(String),
}

fn probe(server: &str, config: Arc<rustls::ClientConfig>, within: Duration) -> Probe {
    let Some((host, port)) = server.rsplit_once(':') else { return Probe::Inconclusive };
    let Ok(port) = port.parse::<u16>() else { return Probe::Inconclusive };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let Some(addr) = (host, port).to_socket_addrs().ok().and_then(|mut a| a.next()) else {
        return Probe::Inconclusive;
    };
    let Ok(name) = ServerName::try_from(host.to_string()) else { return Probe::Inconclusive };
    let Ok(mut connection) = rustls::ClientConnection::new(config, name) else { return Probe::Inconclusive };
    let Ok(mut tcp) = TcpStream::connect_timeout(&addr, within) else { return Probe::Inconclusive };
    let _ = tcp.set_read_timeout(Some(within));
    let _ = tcp.set_write_timeout(Some(within));
    let mut stream = rustls::Stream::new(&mut connection, &mut tcp);
    let mut reply = Vec::new();
    let result = stream.write_all(b"srvr").and_then(|()| stream.read_to_end(&mut reply));
    match result {
        Ok(_) => Probe::Accepted,
        Err(e) => match palisade_core::spi::tls::handshake_refusal(&e) {
            Some(why) => Probe::Refused(why),
            None if !stream.conn.is_handshaking() => Probe::Accepted,
            // The server hung up on a ClientHello: a plaintext port answers `srvr` in words.
            None if plaintext_port(addr, within) => Probe::Refused(
                "the server does not speak TLS: this is a plaintext port (zk://), not its secureClientPort".to_string(),
            ),
            None => Probe::Inconclusive,
        },
    }
}

/// Whether the server at `addr` answers a plaintext `srvr` as a ZooKeeper server does.
fn plaintext_port(addr: std::net::SocketAddr, within: Duration) -> bool {
    let Ok(mut tcp) = TcpStream::connect_timeout(&addr, within) else { return false };
    let _ = tcp.set_read_timeout(Some(within));
    let mut reply = String::new();
    tcp.write_all(b"srvr").is_ok()
        && tcp.read_to_string(&mut reply).is_ok()
        && (reply.starts_with("Zookeeper version")
            || reply.contains("is not executed because it is not in the whitelist"))
}

/// The configuration error that keeps the session from starting, when every server that
/// answered refused our handshake; `None` when one accepted it or none answered (an outage,
/// which the session's own connect reports). Blocking: call it off the runtime's threads.
pub(crate) fn refusal(config: &ZkConfig) -> Option<Error> {
    let client = match client_config(config) {
        Ok(client) => client,
        Err(e) => return Some(e),
    };
    let mut first = None;
    for server in &config.servers {
        match probe(server, Arc::clone(&client), config.connect_timeout) {
            Probe::Accepted => return None,
            Probe::Refused(why) => {
                first.get_or_insert_with(|| format!("TLS to {server} was refused: {why}"));
            }
            Probe::Inconclusive => {}
        }
    }
    first.map(|why| invalid(format!("cannot connect to {}: {why}", config.redacted_url())))
}
