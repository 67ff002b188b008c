//! What the lock relay and the store relay share: the line protocol's request ids and reply
//! cache, the server's connection loop, the client's resend loop, and errors on the wire.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use palisade_core::{Error, ErrorKind, Fence, Result};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::RelayRetry;

pub(super) const BACKEND: &str = "relay";
/// Replies kept for repeated request ids: far more than the requests in flight at once.
const REPLY_CACHE: usize = 4096;
/// How long a client keeps resending a request whose reply was lost.
pub(super) const RESEND_FOR: Duration = Duration::from_secs(3);
/// How long a client waits for a connection, or for one request's reply, before it takes the
/// reply for lost: well past the longest a relayed call takes (a broken service's zero wait
/// that blocks 1.5 s). With [`RESEND_FOR`] it bounds every call: about 8 s.
pub(super) const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(5);

/// A request id's entry: its run under way (a repeat waits for its reply), or its reply.
#[derive(Debug)]
enum Entry {
    Running(watch::Receiver<Option<String>>),
    Done(String),
}

/// What a request id finds on arrival.
enum Arrival {
    /// Its reply: send it again.
    Done(String),
    /// Its first run, still under way (its reply was lost and it was resent): wait for it.
    Running(watch::Receiver<Option<String>>),
    /// Nothing: run it, and publish the reply here.
    New(watch::Sender<Option<String>>),
}

/// The latest request ids' runs and replies, oldest first out.
#[derive(Debug, Default)]
pub(super) struct ReplyCache {
    entries: HashMap<u64, Entry>,
    order: VecDeque<u64>,
}

impl ReplyCache {
    /// Looks `id` up, and marks it running if it is new, under one lock: a resend arriving
    /// while the first run is under way never starts a second one.
    fn arrive(&mut self, id: u64) -> Arrival {
        match self.entries.get(&id) {
            Some(Entry::Done(reply)) => Arrival::Done(reply.clone()),
            Some(Entry::Running(running)) => Arrival::Running(running.clone()),
            None => {
                let (publish, running) = watch::channel(None);
                self.insert(id, Entry::Running(running));
                Arrival::New(publish)
            }
        }
    }

    fn insert(&mut self, id: u64, entry: Entry) {
        if self.entries.insert(id, entry).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > REPLY_CACHE {
            if let Some(old) = self.order.pop_front() {
                self.entries.remove(&old);
            }
        }
    }
}

pub(super) fn io_err(e: std::io::Error) -> Error {
    Error::new(ErrorKind::Unavailable, BACKEND, "relay I/O failed").with_source(e)
}

pub(super) fn proto_err(what: &str) -> Error {
    Error::new(ErrorKind::Backend, BACKEND, format!("relay protocol: {what}"))
}

pub(super) fn fence_text(f: Option<Fence>) -> String {
    f.map_or_else(|| "-".to_string(), |f| f.get().to_string())
}

pub(super) fn parse_fence(s: &str) -> Result<Option<Fence>> {
    if s == "-" { Ok(None) } else { s.parse().map(|v| Some(Fence::new(v))).map_err(|_| proto_err("bad fence")) }
}

/// `ERR kind[/presented/current | /fence] resource|- message`: the kind with the details a
/// fence refusal carries, and the resource the error names, so that a relayed store's refusal
/// reaches the client as the store made it.
pub(super) fn error_line(e: &Error) -> String {
    let kind = match e.kind() {
        ErrorKind::StaleFence { presented, current } => format!("stale_fence/{presented}/{current}"),
        ErrorKind::DuplicateFence { fence } => format!("duplicate_fence/{fence}"),
        other => other.as_str().to_string(),
    };
    let resource = e.resource().map_or_else(|| "-".to_string(), ToString::to_string);
    format!("ERR {kind} {resource} {}", e.message().replace('\n', " "))
}

/// Reads what [`error_line`] wrote (without its `ERR `); a kind this side does not know is a
/// [`ErrorKind::Backend`] error.
fn error_from(rest: &str) -> Error {
    let mut parts = rest.splitn(3, ' ');
    let (kind, resource, message) = (parts.next().unwrap_or(""), parts.next().unwrap_or("-"), parts.next());
    let mut details = kind.split('/');
    let name = details.next().unwrap_or("");
    let fences: Vec<Fence> = details.filter_map(|d| d.parse().ok().map(Fence::new)).collect();
    let message = message.unwrap_or("").to_string();
    let mut error = match (name, fences.as_slice()) {
        ("stale_fence", [presented, current]) => Error::stale_fence(BACKEND, *presented, *current),
        ("duplicate_fence", [fence]) => Error::duplicate_fence(BACKEND, *fence),
        _ => Error::new(kind_from(name), BACKEND, message),
    };
    if let Ok(resource) = palisade_core::spi::parse_any_resource_key(resource) {
        error = error.with_resource(resource);
    }
    error
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
        ErrorKind::Reentrant,
        ErrorKind::WorkCancelled,
    ]
    .into_iter()
    .find(|k| k.as_str() == name)
    .unwrap_or(ErrorKind::Backend)
}

/// What a relay runs for one request line (without its id): the reply line, or an error.
#[async_trait]
pub(super) trait Handler: Send + Sync + 'static {
    async fn handle(&self, request: &str) -> Result<String>;
}

/// A relay's listening socket and accepting task; dropping it stops accepting connections.
#[derive(Debug)]
pub(super) struct Listening {
    pub(super) addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts connections on an ephemeral port of 127.0.0.1; `handler` makes each connection's
/// handler (a relayed store gives each its own client).
pub(super) async fn serve<H, F, Fut>(handler: F) -> Result<Listening>
where
    H: Handler,
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<H>> + Send,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.map_err(io_err)?;
    let addr = listener.local_addr().map_err(io_err)?;
    let cache = Arc::new(StdMutex::new(ReplyCache::default()));
    let handler = Arc::new(handler);
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (handler, cache) = (Arc::clone(&handler), Arc::clone(&cache));
            tokio::spawn(async move { serve_connection(handler().await, cache, stream).await });
        }
    });
    Ok(Listening { addr, task })
}

async fn serve_connection<H: Handler>(handler: Result<H>, cache: Arc<StdMutex<ReplyCache>>, stream: TcpStream) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let (id, request) = line.split_once(' ').unwrap_or((&line, ""));
        let id = id.parse::<u64>().ok();
        let arrival = id.map(|id| cache.lock().unwrap_or_else(PoisonError::into_inner).arrive(id));
        let reply = match arrival {
            Some(Arrival::Done(reply)) => reply,
            Some(Arrival::Running(mut running)) => match running.wait_for(Option::is_some).await {
                Ok(reply) => reply.clone().unwrap_or_default(),
                Err(_) => error_line(&Error::new(
                    ErrorKind::OutcomeUnknown,
                    BACKEND,
                    "the first run of this request ended without a reply",
                )),
            },
            Some(Arrival::New(publish)) => {
                let reply = run(&handler, request).await;
                if let Some(id) = id {
                    cache.lock().unwrap_or_else(PoisonError::into_inner).insert(id, Entry::Done(reply.clone()));
                }
                // Whoever resent it meanwhile is waiting; nobody may be, which is fine.
                let _ = publish.send(Some(reply.clone()));
                reply
            }
            None => run(&handler, request).await,
        };
        if write.write_all(format!("{reply}\n").as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Runs one request; its reply line, an error as [`error_line`] writes it.
async fn run<H: Handler>(handler: &Result<H>, request: &str) -> String {
    let result = match handler {
        Ok(handler) => handler.handle(request).await,
        Err(e) => Err(Error::new(e.kind(), BACKEND, format!("no client for this connection: {e}"))),
    };
    result.unwrap_or_else(|e| error_line(&e))
}

type Conn = (tokio::io::Lines<BufReader<OwnedReadHalf>>, OwnedWriteHalf);

/// A client's connection to a relay: one request at a time, each resent as `retry` says when
/// its reply is lost.
#[derive(Debug)]
pub(super) struct Channel {
    addr: SocketAddr,
    conn: Mutex<Option<Conn>>,
    retry: RelayRetry,
}

fn request_id() -> Result<u64> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::new(ErrorKind::Backend, BACKEND, format!("no randomness for a request id: {e}")))?;
    Ok(u64::from_le_bytes(bytes))
}

impl Channel {
    pub(super) async fn open(addr: SocketAddr, retry: RelayRetry) -> Result<Channel> {
        let conn = Channel::connect(addr).await?;
        Ok(Channel { addr, conn: Mutex::new(Some(conn)), retry })
    }

    async fn connect(addr: SocketAddr) -> Result<Conn> {
        let stream = tokio::time::timeout(EXCHANGE_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| io_err(std::io::ErrorKind::TimedOut.into()))?
            .map_err(io_err)?;
        let _ = stream.set_nodelay(true);
        let (read, write) = stream.into_split();
        Ok((BufReader::new(read).lines(), write))
    }

    /// Sends `request` and reads its reply on the open connection; a reply that takes longer
    /// than [`EXCHANGE_TIMEOUT`] is lost.
    async fn exchange(conn: &mut Conn, line: &str) -> std::io::Result<Option<String>> {
        let exchange = async {
            conn.1.write_all(line.as_bytes()).await?;
            conn.0.next_line().await
        };
        tokio::time::timeout(EXCHANGE_TIMEOUT, exchange).await.map_err(|_| std::io::ErrorKind::TimedOut)?
    }

    /// Sends `request` and returns its reply line (an `ERR` reply as the error it carries).
    /// Within [`RESEND_FOR`] plus one [`EXCHANGE_TIMEOUT`]; a reply still lost then is
    /// [`ErrorKind::OutcomeUnknown`].
    pub(super) async fn call(&self, request: String) -> Result<String> {
        let mut id = request_id()?;
        let give_up = Instant::now() + RESEND_FOR;
        let mut conn = self.conn.lock().await;
        let reply = loop {
            if conn.is_none() {
                match Channel::connect(self.addr).await {
                    Ok(c) => *conn = Some(c),
                    Err(_) if Instant::now() < give_up => {
                        resend_pause().await;
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            // Out of the slot while in use: a call dropped mid-exchange (a caller's timeout)
            // drops the connection with it, so its late reply is never read as the next one's.
            let Some(mut open) = conn.take() else { continue };
            match Channel::exchange(&mut open, &format!("{id} {request}\n")).await {
                Ok(Some(reply)) => {
                    *conn = Some(open);
                    break reply;
                }
                Ok(None) | Err(_) => {
                    // The reply is lost; the request may have run.
                    let unknown = || {
                        Error::new(ErrorKind::OutcomeUnknown, BACKEND, "the relay connection ended before the reply")
                    };
                    match self.retry {
                        RelayRetry::Never => return Err(unknown()),
                        _ if Instant::now() >= give_up => return Err(unknown()),
                        RelayRetry::SameRequest => {}
                        RelayRetry::NewReleaseRequest if !request.starts_with("RELEASE ") => {}
                        RelayRetry::NewRequest | RelayRetry::NewReleaseRequest => id = request_id()?,
                    }
                    resend_pause().await;
                }
            }
        };
        match reply.strip_prefix("ERR ") {
            Some(rest) => Err(error_from(rest)),
            None => Ok(reply),
        }
    }
}

/// The pause between resends.
async fn resend_pause() {
    tokio::time::sleep(Duration::from_millis(20)).await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a panic is the failure report

    use super::*;
    use palisade_core::ResourceKey;

    /// Counts its runs, and holds the first one until told to finish.
    struct Slow {
        runs: Arc<std::sync::atomic::AtomicUsize>,
        finish: Arc<tokio::sync::Notify>,
    }

    #[async_trait]
    impl Handler for Slow {
        async fn handle(&self, _request: &str) -> Result<String> {
            if self.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                self.finish.notified().await;
            }
            Ok("DONE".to_string())
        }
    }

    /// A request resent (its reply lost) while its first run is still under way waits for
    /// that run's reply instead of running again: a batch is applied once.
    #[tokio::test]
    async fn a_request_resent_while_it_runs_runs_once() {
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let finish = Arc::new(tokio::sync::Notify::new());
        let (r, f) = (Arc::clone(&runs), Arc::clone(&finish));
        let relay = serve(move || {
            let (runs, finish) = (Arc::clone(&r), Arc::clone(&f));
            async move { Ok(Slow { runs, finish }) }
        })
        .await
        .unwrap();
        let addr = relay.addr;
        // The first send, whose connection is cut while the request runs.
        let mut first = Channel::connect(addr).await.unwrap();
        first.1.write_all(b"7 APPLY\n").await.unwrap();
        while runs.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(first);
        // The resend, on a new connection, while the first run is under way.
        let mut resend = Channel::connect(addr).await.unwrap();
        resend.1.write_all(b"7 APPLY\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        finish.notify_one();
        let reply = tokio::time::timeout(Duration::from_secs(5), resend.0.next_line()).await.unwrap().unwrap();
        assert_eq!(reply.as_deref(), Some("DONE"));
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1, "the resend ran the request again");
    }

    #[test]
    fn refusals_cross_the_wire_with_their_details_and_resource() {
        let res = ResourceKey::new("alloc", "s1").unwrap();
        let stale = Error::stale_fence("broken", Fence::new(5), Fence::new(9)).with_resource(res.clone());
        let back = error_from(error_line(&stale).strip_prefix("ERR ").unwrap());
        assert_eq!(back.stale_fence_details(), Some((Fence::new(5), Fence::new(9))));
        assert_eq!(back.resource(), Some(&res));
        let duplicate =
            error_from(error_line(&Error::duplicate_fence("broken", Fence::new(7))).strip_prefix("ERR ").unwrap());
        assert_eq!(duplicate.kind(), ErrorKind::DuplicateFence { fence: Fence::new(7) });
        assert_eq!(duplicate.resource(), None);
        let conflict = Error::new(ErrorKind::Conflict, "broken", "record x exists\nalready");
        let back = error_from(error_line(&conflict).strip_prefix("ERR ").unwrap());
        assert_eq!((back.kind(), back.message()), (ErrorKind::Conflict, "record x exists already"));
        assert_eq!(error_from("no_such_kind - what").kind(), ErrorKind::Backend);
    }
}
