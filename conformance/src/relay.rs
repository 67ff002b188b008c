//! A loopback relay that lets a child process use a lock service living in the parent's memory.
//!
//! The process-level scenarios freeze a holder *process* with `SIGSTOP`. A service behind a
//! server is reached by the child directly; an in-process service (the memory reference
//! implementation, or yours) is served to the child by this relay. The relay forwards the four
//! `LockService` calls over a line protocol on 127.0.0.1; it never releases a grant when a
//! connection drops, so a killed child's lock expires at its TTL as with a real server.
//!
//! Wire format, one request and one reply per line:
//! `TRY key ttl_us` → `GRANT token fence|- granted_ttl_us` or `BUSY`;
//! `EXTEND key token fence|- ttl_us` → `OK granted_ttl_us`; `RELEASE key token fence|-` → `OK`;
//! any request → `ERR kind message` on failure.

use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use palisade_core::{
    Capabilities, Error, ErrorKind, Fence, Fencing, Grant, LockService, OwnerToken, ResourceKey, Result, Ttl,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio::time::Instant;

const BACKEND: &str = "relay";

/// A running relay; dropping it stops accepting connections.
#[derive(Debug)]
pub struct Relay {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Relay {
    /// Serves `service` on an ephemeral port of 127.0.0.1.
    pub async fn serve<S: LockService>(service: Arc<S>) -> Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0").await.map_err(io_err)?;
        let addr = listener.local_addr().map_err(io_err)?;
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve_connection(Arc::clone(&service), stream));
            }
        });
        Ok(Relay { addr, task })
    }

    /// The address to hand to the child.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn io_err(e: std::io::Error) -> Error {
    Error::new(ErrorKind::Unavailable, BACKEND, "relay I/O failed").with_source(e)
}

fn proto_err(what: &str) -> Error {
    Error::new(ErrorKind::Backend, BACKEND, format!("relay protocol: {what}"))
}

fn fence_text(f: Option<Fence>) -> String {
    f.map_or_else(|| "-".to_string(), |f| f.get().to_string())
}

fn parse_fence(s: &str) -> Result<Option<Fence>> {
    if s == "-" { Ok(None) } else { s.parse().map(|v| Some(Fence::new(v))).map_err(|_| proto_err("bad fence")) }
}

fn parse_ttl(s: &str) -> Result<Ttl> {
    Ttl::new(Duration::from_micros(s.parse().map_err(|_| proto_err("bad ttl"))?))
}

fn kind_from(name: &str) -> ErrorKind {
    [
        ErrorKind::Timeout,
        ErrorKind::NotHolder,
        ErrorKind::LeaseLost,
        ErrorKind::Conflict,
        ErrorKind::Unavailable,
        ErrorKind::InvalidKey,
        ErrorKind::InvalidArgument,
        ErrorKind::InvalidConfig,
        ErrorKind::Unsupported,
        ErrorKind::FenceRegression,
        ErrorKind::OutcomeUnknown,
    ]
    .into_iter()
    .find(|k| k.as_str() == name)
    .unwrap_or(ErrorKind::Backend)
}

async fn serve_connection<S: LockService>(service: Arc<S>, stream: TcpStream) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let reply = match handle(&*service, &line).await {
            Ok(reply) => reply,
            Err(e) => format!("ERR {} {}", e.kind().as_str(), e.message().replace('\n', " ")),
        };
        if write.write_all(format!("{reply}\n").as_bytes()).await.is_err() {
            return;
        }
    }
}

fn grant_from<F: Fencing>(key: &str, token: &str, fence: &str, ttl: Ttl) -> Result<Grant<F>> {
    let key = ResourceKey::parse(key)?;
    let token = OwnerToken::parse_hex(token)?;
    let fence = F::token_from(parse_fence(fence)?).ok_or_else(|| proto_err("missing fence"))?;
    Ok(Grant::new(key, token, fence, ttl, Instant::now()))
}

async fn handle<S: LockService>(service: &S, line: &str) -> Result<String> {
    let parts: Vec<&str> = line.split(' ').collect();
    match parts.as_slice() {
        ["TRY", key, ttl] => {
            let key = ResourceKey::parse(key)?;
            Ok(match service.try_acquire(&key, parse_ttl(ttl)?).await? {
                Some(g) => {
                    format!("GRANT {} {} {}", g.token(), fence_text(g.fence_if_any()), g.ttl().get().as_micros())
                }
                None => "BUSY".to_string(),
            })
        }
        ["EXTEND", key, token, fence, ttl] => {
            let ttl = parse_ttl(ttl)?;
            let granted = service.extend(&grant_from(key, token, fence, ttl)?, ttl).await?;
            Ok(format!("OK {}", granted.get().as_micros()))
        }
        ["RELEASE", key, token, fence] => {
            let ttl = Ttl::new(Ttl::MIN)?;
            service.release(&grant_from(key, token, fence, ttl)?).await?;
            Ok("OK".to_string())
        }
        _ => Err(proto_err("unknown request")),
    }
}

/// The child's side: a `LockService` whose calls go to a [`Relay`].
#[derive(Debug)]
pub struct RelayLockService<F: Fencing> {
    conn: Mutex<(tokio::io::Lines<BufReader<OwnedReadHalf>>, OwnedWriteHalf)>,
    capabilities: Capabilities,
    _fencing: PhantomData<F>,
}

impl<F: Fencing> RelayLockService<F> {
    /// Connects to a relay; `capabilities` are the relayed service's.
    pub async fn connect(addr: SocketAddr, capabilities: Capabilities) -> Result<Self> {
        let stream = TcpStream::connect(addr).await.map_err(io_err)?;
        let (read, write) = stream.into_split();
        Ok(RelayLockService {
            conn: Mutex::new((BufReader::new(read).lines(), write)),
            capabilities,
            _fencing: PhantomData,
        })
    }

    async fn call(&self, request: String) -> Result<String> {
        let mut conn = self.conn.lock().await;
        conn.1.write_all(format!("{request}\n").as_bytes()).await.map_err(io_err)?;
        let reply = conn.0.next_line().await.map_err(io_err)?.ok_or_else(|| proto_err("relay closed"))?;
        match reply.strip_prefix("ERR ") {
            Some(rest) => {
                let (kind, message) = rest.split_once(' ').unwrap_or((rest, ""));
                Err(Error::new(kind_from(kind), BACKEND, message.to_string()))
            }
            None => Ok(reply),
        }
    }
}

#[async_trait]
impl<F: Fencing> LockService for RelayLockService<F> {
    type Fencing = F;

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<F>>> {
        let requested_at = Instant::now();
        let reply = self.call(format!("TRY {key} {}", ttl.get().as_micros())).await?;
        match reply.split(' ').collect::<Vec<_>>().as_slice() {
            ["BUSY"] => Ok(None),
            ["GRANT", token, fence, granted] => {
                let token = OwnerToken::parse_hex(token)?;
                let fence = F::token_from(parse_fence(fence)?).ok_or_else(|| proto_err("missing fence"))?;
                Ok(Some(Grant::new(key.clone(), token, fence, parse_ttl(granted)?, requested_at)))
            }
            _ => Err(proto_err("bad TRY reply")),
        }
    }

    async fn extend(&self, grant: &Grant<F>, ttl: Ttl) -> Result<Ttl> {
        let fence = fence_text(grant.fence_if_any());
        let reply =
            self.call(format!("EXTEND {} {} {fence} {}", grant.key(), grant.token(), ttl.get().as_micros())).await?;
        match reply.split_once(' ') {
            Some(("OK", granted)) => parse_ttl(granted),
            _ => Err(proto_err("bad EXTEND reply")),
        }
    }

    async fn release(&self, grant: &Grant<F>) -> Result<()> {
        let fence = fence_text(grant.fence_if_any());
        self.call(format!("RELEASE {} {} {fence}", grant.key(), grant.token())).await.map(drop)
    }
}
