//! TLS for the lab's servers: throwaway certificates ([`material`]), a question asked over TLS
//! ([`ask`], how the lab knows a TLS-only server is up, whatever certificate it shows) and a TLS terminator in front of a
//! plaintext server ([`terminate`], for servers that cannot speak TLS themselves, like moto).

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// Makes, in `dir` (with `openssl`; X.509 v3 throughout, which rustls' webpki requires):
/// - `ca.crt`/`ca.key`: a throwaway CA;
/// - `server.crt`/`server.key`: a certificate it signed for 127.0.0.1 and `localhost`, and
///   `server.pem` (key, then certificate: the one-file form ZooKeeper reads);
/// - `renewed.crt`: another certificate for the same key, names and CA (a rotation);
/// - `expired.crt`: the same again, valid for one day in 2024 only;
/// - `client.crt`/`client.key`: a client identity it signed;
/// - `other-ca.crt` (and its key): a second CA that signed `other-server.crt` for the server's
///   key and names (a server that moved to another CA) and nothing else.
pub fn material(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = |name: &str| dir.join(name).display().to_string();
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n")?;
    std::fs::write(dir.join("client-ext.cnf"), "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")?;
    // `openssl x509` cannot date a certificate in the past; `openssl ca` can, with a database.
    std::fs::write(dir.join("index.txt"), "")?;
    std::fs::write(dir.join("serial"), "1000\n")?;
    std::fs::write(
        dir.join("ca.cnf"),
        format!(
            "[ca]\ndefault_ca = lab\n[lab]\ndatabase = {}\nnew_certs_dir = {}\nserial = {}\n\
             default_md = sha256\npolicy = any\nunique_subject = no\n[any]\ncommonName = supplied\n",
            path("index.txt"),
            dir.display(),
            path("serial")
        ),
    )?;
    let new_ca = |name: &str, subject: &str| -> Vec<String> {
        let key = path(&format!("{name}.key"));
        let crt = path(&format!("{name}.crt"));
        let subject = format!("/CN={subject}");
        [
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", &subject, "-keyout", &key, "-out",
            &crt,
        ]
        .map(String::from)
        .to_vec()
    };
    let new_key = |name: &str, subject: &str| -> Vec<String> {
        let key = path(&format!("{name}.key"));
        let csr = path(&format!("{name}.csr"));
        let subject = format!("/CN={subject}");
        ["req", "-newkey", "rsa:2048", "-nodes", "-subj", &subject, "-keyout", &key, "-out", &csr]
            .map(String::from)
            .to_vec()
    };
    let sign = |csr: &str, ca: &str, ext: &str, out: &str| -> Vec<String> {
        let args = [
            "x509",
            "-req",
            "-in",
            &path(csr),
            "-CA",
            &path(&format!("{ca}.crt")),
            "-CAkey",
            &path(&format!("{ca}.key")),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &path(ext),
            "-out",
            &path(out),
        ];
        args.map(String::from).to_vec()
    };
    let expired = [
        "ca",
        "-batch",
        "-notext",
        "-config",
        &path("ca.cnf"),
        "-cert",
        &path("ca.crt"),
        "-keyfile",
        &path("ca.key"),
        "-in",
        &path("server.csr"),
        "-extfile",
        &path("ext.cnf"),
        "-startdate",
        "20240101000000Z",
        "-enddate",
        "20240102000000Z",
        "-out",
        &path("expired.crt"),
    ]
    .map(String::from)
    .to_vec();
    let steps = [
        new_ca("ca", "palisade test CA"),
        new_key("server", "127.0.0.1"),
        sign("server.csr", "ca", "ext.cnf", "server.crt"),
        sign("server.csr", "ca", "ext.cnf", "renewed.crt"),
        expired,
        new_key("client", "palisade test client"),
        sign("client.csr", "ca", "client-ext.cnf", "client.crt"),
        new_ca("other-ca", "palisade other CA"),
        sign("server.csr", "other-ca", "ext.cnf", "other-server.crt"),
    ];
    for args in steps {
        let out = Command::new("openssl").args(&args).output()?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!(
                "openssl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
    }
    let pem = [std::fs::read(dir.join("server.key"))?, std::fs::read(dir.join("server.crt"))?].concat();
    std::fs::write(dir.join("server.pem"), pem)
}

/// Takes any server certificate (signatures are still checked): the lab asks whether a server
/// is up, also one it started with an expired or foreign certificate on purpose, not whether
/// to trust it.
#[derive(Debug)]
struct AnyServer(rustls::crypto::WebPkiSupportedAlgorithms);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// `certs/<who>.crt` (the chain) and `certs/<who>.key`, as [`material`] makes them.
fn identity(certs: &Path, who: &str) -> std::io::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let bad = |e: &dyn std::fmt::Display| std::io::Error::other(format!("TLS material in {}: {e}", certs.display()));
    let chain = CertificateDer::pem_file_iter(certs.join(format!("{who}.crt")))
        .map_err(|e| bad(&e))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad(&e))?;
    let key = PrivateKeyDer::from_pem_file(certs.join(format!("{who}.key"))).map_err(|e| bad(&e))?;
    Ok((chain, key))
}

/// A client configuration that presents `certs/client.crt` and takes any server certificate.
fn client_config(certs: &Path) -> std::io::Result<Arc<rustls::ClientConfig>> {
    let bad = |e: &dyn std::fmt::Display| std::io::Error::other(format!("TLS material in {}: {e}", certs.display()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let any = Arc::new(AnyServer(provider.signature_verification_algorithms));
    let (chain, key) = identity(certs, "client")?;
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(&e))?
        .dangerous()
        .with_custom_certificate_verifier(any)
        .with_client_auth_cert(chain, key)
        .map_err(|e| bad(&e))?;
    Ok(Arc::new(config))
}

/// Sends `request` over TLS to `addr` (presenting `certs/client.crt`, taking any certificate)
/// and returns the whole answer, or "" when the server is not there, refuses or is silent.
pub fn ask(addr: SocketAddr, certs: &Path, request: &[u8]) -> String {
    let Ok(config) = client_config(certs) else { return String::new() };
    let Ok(name) = ServerName::try_from(addr.ip().to_string()) else { return String::new() };
    let Ok(mut connection) = rustls::ClientConnection::new(config, name) else { return String::new() };
    // A bounded connect: a member cut off by a partition must not hang the question.
    let Ok(mut tcp) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else { return String::new() };
    let _ = tcp.set_read_timeout(Some(Duration::from_millis(500)));
    let mut stream = rustls::Stream::new(&mut connection, &mut tcp);
    if stream.write_all(request).is_err() {
        return String::new();
    }
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    String::from_utf8_lossy(&reply).into_owned()
}

/// Serves TLS on `listener` with `certs/server.crt` and `server.key` (no client certificate
/// asked) and relays each connection, decrypted, to `upstream`. With `signers`, it appends to
/// that file each AWS access key id it has not seen before that signs a request passing through
/// (the `Credential=` of SigV4's `Authorization` header): how a test sees which credentials a
/// client took from its chain. Runs until the process ends.
pub fn terminate(
    listener: std::net::TcpListener,
    upstream: SocketAddr,
    certs: &Path,
    signers: Option<PathBuf>,
) -> std::io::Result<()> {
    let bad = |e: &dyn std::fmt::Display| std::io::Error::other(format!("TLS material in {}: {e}", certs.display()));
    let (chain, key) = identity(certs, "server")?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(&e))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| bad(&e))?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let signers = signers.map(|path| Arc::new(Signers { path, seen: Mutex::new(HashSet::new()) }));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    listener.set_nonblocking(true)?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        loop {
            let (client, _) = listener.accept().await?;
            let (acceptor, signers) = (acceptor.clone(), signers.clone());
            tokio::spawn(async move {
                // A client that fails the handshake or hangs up is its own business.
                let Ok(client) = acceptor.accept(client).await else { return };
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else { return };
                let _ = server.set_nodelay(true);
                let (mut from_client, mut to_server) = (tokio::io::split(client), server.into_split());
                let requests = async {
                    let mut buf = vec![0u8; 16 * 1024];
                    let mut tail = Vec::new();
                    loop {
                        let n = from_client.0.read(&mut buf).await?;
                        if n == 0 {
                            return to_server.1.shutdown().await;
                        }
                        if let Some(signers) = &signers {
                            // A header may straddle two reads: look at the last read's tail too.
                            tail.extend_from_slice(&buf[..n]);
                            signers.note(&tail);
                            let keep = tail.len().saturating_sub(256);
                            tail.drain(..keep);
                        }
                        to_server.1.write_all(&buf[..n]).await?;
                    }
                };
                let replies = tokio::io::copy(&mut to_server.0, &mut from_client.1);
                let _ = tokio::join!(requests, replies);
            });
        }
    })
}

/// The access key ids seen signing requests, and the file they are appended to.
struct Signers {
    path: PathBuf,
    seen: Mutex<HashSet<String>>,
}

impl Signers {
    fn note(&self, bytes: &[u8]) {
        const MARK: &[u8] = b"Credential=";
        let mut rest = bytes;
        while let Some(at) = rest.windows(MARK.len()).position(|w| w == MARK) {
            rest = &rest[at + MARK.len()..];
            let Some(end) = rest.iter().position(|b| *b == b'/') else { return };
            let id = String::from_utf8_lossy(&rest[..end]).into_owned();
            let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if seen.insert(id.clone()) {
                let _ = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&self.path)
                    .and_then(|mut f| writeln!(f, "{id}"));
            }
        }
    }
}

/// Relays every connection to `listen_ip` (a free port) to `upstream`, byte for byte, until
/// the runtime ends; returns the address it listens on. A way to reach a TLS server at an
/// address its certificate does not name (`127.0.0.2`, say).
pub async fn relay(listen_ip: std::net::IpAddr, upstream: SocketAddr) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind((listen_ip, 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    Ok(addr)
}
