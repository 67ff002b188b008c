//! A TCP fault proxy: it sits between a client and its server, forwards bytes both ways, and
//! on command loses a reply after its request reached the server, cuts every connection,
//! delays traffic, or partitions the client from the server until healed.
//!
//! A backend author gets the fault scenarios by handing the suite a client that dials the
//! proxy instead of the server ([`LockServiceFactory::faulty_client`]); the proxy knows
//! nothing of the protocol, so it works for any server spoken to over TCP.
//!
//! What each fault looks like to the client:
//! - **lost reply** ([`FaultProxy::lose_next_reply`]): the next request goes through and is
//!   applied; the first bytes the server sends back on that connection are dropped and the
//!   connection is closed. The client sees its connection end with the request's outcome
//!   unknown: the ambiguity every retry protocol must resolve.
//! - **cut** ([`FaultProxy::cut_connections`]): every open connection is closed at once (a
//!   server restart, a load balancer's idle reap, a NAT table flush); new ones are accepted.
//! - **partition** ([`FaultProxy::partition`] until [`FaultProxy::heal`]): nothing flows
//!   either way and new connections hang; bytes already sent are held and delivered on heal,
//!   as TCP's retransmissions would.
//! - **delay** ([`FaultProxy::set_delay`]): every chunk waits that long in each direction.
//! - **slow replies** ([`FaultProxy::delay_replies`] until [`FaultProxy::no_delay`]): every
//!   request reaches the server at once and is applied, and its reply reaches the client that
//!   long later (a loaded server, a slow fsync, a long path back). A client that gives up on a
//!   request sooner and sends it again sees its first attempt's effect in the second one's
//!   answer.
//!
//! A delay is latency, not bandwidth: each chunk is held for the delay from the moment the
//! proxy read it, chunks keep their order, and chunks read close together arrive close
//! together (what many requests multiplexed on one connection need).
//!
//! [`LockServiceFactory::faulty_client`]: crate::LockServiceFactory::faulty_client

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use palisade_core::{Error, ErrorKind, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Whether traffic may flow, and which generation of connections is still wanted.
#[derive(Debug, Clone, Copy, Default)]
struct Gate {
    partitioned: bool,
    generation: u64,
}

#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    gate: watch::Sender<Gate>,
    /// Armed: how many requests to let through before the one whose reply is lost.
    lose_reply: std::sync::Mutex<Option<usize>>,
    lost_replies: AtomicUsize,
    /// Chunks forwarded from clients to the server: requests, as [`FaultProxy::lose_reply_to`]
    /// counts them.
    requests: AtomicUsize,
    /// Latency added to client-to-server chunks, in microseconds.
    up_delay_us: AtomicU64,
    /// Latency added to server-to-client chunks, in microseconds.
    down_delay_us: AtomicU64,
    connections: AtomicUsize,
}

/// A running fault proxy on an ephemeral port of 127.0.0.1 (or of the address given to
/// [`start_on`](Self::start_on)); dropping it stops accepting
/// connections (open ones end when either side closes).
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy on 127.0.0.1 that forwards every connection it accepts to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<FaultProxy> {
        FaultProxy::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST), upstream).await
    }

    /// Starts a proxy listening on `listen` (an address of this machine: a lab's gateway, for
    /// clients on hosts of their own) that forwards every connection it accepts to `upstream`.
    pub async fn start_on(listen: IpAddr, upstream: SocketAddr) -> Result<FaultProxy> {
        let listener = TcpListener::bind((listen, 0)).await.map_err(io_err)?;
        let addr = listener.local_addr().map_err(io_err)?;
        let shared = Arc::new(Shared {
            upstream,
            gate: watch::Sender::new(Gate::default()),
            lose_reply: std::sync::Mutex::new(None),
            lost_replies: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
            up_delay_us: AtomicU64::new(0),
            down_delay_us: AtomicU64::new(0),
            connections: AtomicUsize::new(0),
        });
        let task = {
            let shared = Arc::clone(&shared);
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    shared.connections.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(relay(Arc::clone(&shared), client));
                }
            })
        };
        Ok(FaultProxy { addr, shared, task })
    }

    /// Where the client must connect instead of the server.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server behind the proxy.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// Arms a one-shot fault: the next request (on any connection) reaches the server, and
    /// the server's reply to it is dropped and its connection closed.
    pub fn lose_next_reply(&self) {
        self.lose_reply_to(0);
    }

    /// Arms a one-shot fault like [`lose_next_reply`](Self::lose_next_reply), for the request
    /// after the next `skip` ones (an operation that takes several round trips loses the reply
    /// of a later one). A "request" is what the client sends before it waits: a chunk of bytes.
    pub fn lose_reply_to(&self, skip: usize) {
        *self.shared.lose_reply.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(skip);
    }

    /// Disarms a pending lost reply if its request did not come.
    pub fn disarm(&self) {
        *self.shared.lose_reply.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// How many replies the proxy has dropped so far.
    pub fn lost_replies(&self) -> usize {
        self.shared.lost_replies.load(Ordering::SeqCst)
    }

    /// How many requests clients have sent through the proxy so far, counted as
    /// [`lose_reply_to`](Self::lose_reply_to) counts them: each chunk of bytes a client sends
    /// before it waits. (A request the client's socket splits in two counts twice, so a count
    /// is an upper bound on the round trips.)
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// How many client connections the proxy has accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Closes every open connection, both sides; new connections are accepted as usual.
    pub fn cut_connections(&self) {
        self.shared.gate.send_modify(|g| g.generation += 1);
    }

    /// Stops all traffic, both ways, on open and new connections, until [`heal`](Self::heal).
    pub fn partition(&self) {
        self.shared.gate.send_modify(|g| g.partitioned = true);
    }

    /// Ends a [`partition`](Self::partition): held bytes flow again.
    pub fn heal(&self) {
        self.shared.gate.send_modify(|g| g.partitioned = false);
    }

    /// Delays every chunk of bytes by `delay` in each direction (zero: no delay), from the
    /// moment the proxy reads it; chunks already read keep the delay they were read with.
    pub fn set_delay(&self, delay: Duration) {
        self.shared.up_delay_us.store(micros(delay), Ordering::SeqCst);
        self.shared.down_delay_us.store(micros(delay), Ordering::SeqCst);
    }

    /// Delays every reply (server-to-client chunk) by `delay`, requests going through at once:
    /// each request is applied on time and its answer arrives `delay` late. Replaces the reply
    /// delay of [`set_delay`](Self::set_delay) and keeps its request delay; chunks already read
    /// keep the delay they were read with.
    pub fn delay_replies(&self, delay: Duration) {
        self.shared.down_delay_us.store(micros(delay), Ordering::SeqCst);
    }

    /// Ends every delay ([`set_delay`](Self::set_delay), [`delay_replies`](Self::delay_replies))
    /// for the chunks read from now on; chunks already held are still delivered when due.
    pub fn no_delay(&self) {
        self.set_delay(Duration::ZERO);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        // Open connections end too: a proxy that is gone must not keep a client talking.
        self.cut_connections();
    }
}

/// Puts a fault proxy in front of every server a connection URL names, and returns the URL
/// rewritten to dial the proxies (in the order of the hosts), with the proxies.
///
/// The URL is `scheme://[userinfo@]host:port[,host:port…][/path][?query]`, the shape of every
/// Palisade URL (`redis://`, `redlock://a,b,c`, `etcd://`, `zk://`); the rest is kept as is.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> palisade_core::Result<()> {
/// let (url, proxies) = palisade_conformance::proxy::proxy_url("redis://:secret@127.0.0.1:6379/0").await?;
/// assert_eq!(url, format!("redis://:secret@{}/0", proxies[0].addr()));
/// assert_eq!(proxies[0].upstream().port(), 6379);
/// # Ok(())
/// # }
/// ```
pub async fn proxy_url(url: &str) -> Result<(String, Vec<FaultProxy>)> {
    proxy_url_on(IpAddr::V4(Ipv4Addr::LOCALHOST), url).await
}

/// [`proxy_url`] with the proxies listening on `listen` rather than 127.0.0.1 (a lab's gateway,
/// so that clients on hosts of their own reach them).
pub async fn proxy_url_on(listen: IpAddr, url: &str) -> Result<(String, Vec<FaultProxy>)> {
    let bad = |what: &str| Error::new(ErrorKind::InvalidConfig, "fault-proxy", format!("cannot proxy a URL: {what}"));
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((user, hosts)) => (format!("{user}@"), hosts),
        None => (String::new(), authority),
    };
    let mut proxies = Vec::new();
    let mut dialed = Vec::new();
    for host in hosts.split(',') {
        let upstream = tokio::net::lookup_host(host)
            .await
            .map_err(|_| bad("a host without a port, or one that does not resolve"))?
            .next()
            .ok_or_else(|| bad("a host that does not resolve"))?;
        let proxy = FaultProxy::start_on(listen, upstream).await?;
        dialed.push(proxy.addr().to_string());
        proxies.push(proxy);
    }
    Ok((format!("{scheme}://{userinfo}{}{tail}", dialed.join(",")), proxies))
}

fn micros(delay: Duration) -> u64 {
    u64::try_from(delay.as_micros()).unwrap_or(u64::MAX)
}

fn io_err(e: std::io::Error) -> Error {
    Error::new(ErrorKind::Unavailable, "fault-proxy", "fault proxy I/O failed").with_source(e)
}

/// One client connection: forwards both ways until either side closes, the connection is
/// cut, or a lost reply ends it.
async fn relay(shared: Arc<Shared>, client: TcpStream) {
    let mut gate = shared.gate.subscribe();
    let generation = gate.borrow().generation;
    let cut = {
        let mut gate = gate.clone();
        async move {
            // An error means the proxy is gone: end the connection too.
            let _ = gate.wait_for(|g| g.generation != generation).await;
        }
    };
    let session = async {
        if !open(&mut gate, generation).await {
            return;
        }
        let Ok(server) = TcpStream::connect(shared.upstream).await else { return };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        // Set when the request whose reply is to be lost went up this connection.
        let doomed = AtomicBool::new(false);
        tokio::select! {
            () = pump(&shared, shared.gate.subscribe(), client_read, server_write, Direction::Up, &doomed) => {}
            () = pump(&shared, shared.gate.subscribe(), server_read, client_write, Direction::Down, &doomed) => {}
        }
    };
    tokio::select! {
        () = cut => {}
        () = session => {}
    }
}

/// Waits until traffic may flow; false if the connection was cut meanwhile.
async fn open(gate: &mut watch::Receiver<Gate>, generation: u64) -> bool {
    match gate.wait_for(|g| !g.partitioned || g.generation != generation).await {
        Ok(g) => g.generation == generation,
        Err(_) => false,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Client to server.
    Up,
    /// Server to client.
    Down,
}

/// Forwards one direction of a connection until its source ends (then delivers what is still
/// held) or a fault ends it. A reader takes chunks as they come and stamps each with when it
/// is due; the writer delivers them in order at that time, so a delay adds latency without
/// slowing the chunks behind it.
async fn pump(
    shared: &Shared,
    mut gate: watch::Receiver<Gate>,
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    direction: Direction,
    doomed: &AtomicBool,
) {
    let generation = gate.borrow().generation;
    let delay_us = match direction {
        Direction::Up => &shared.up_delay_us,
        Direction::Down => &shared.down_delay_us,
    };
    let (held, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let at = Instant::now() + Duration::from_micros(delay_us.load(Ordering::SeqCst));
            if held.send((at, buf[..n].to_vec())).is_err() {
                break;
            }
        }
        // The source ended: the writer delivers what is held, then ends the connection.
        drop(held);
        std::future::pending::<()>().await;
    };
    let write = async {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if !open(&mut gate, generation).await {
                return;
            }
            match direction {
                Direction::Up => {
                    shared.requests.fetch_add(1, Ordering::SeqCst);
                    let mut armed = shared.lose_reply.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    match *armed {
                        Some(0) => {
                            *armed = None;
                            doomed.store(true, Ordering::SeqCst);
                        }
                        Some(n) => *armed = Some(n - 1),
                        None => {}
                    }
                }
                Direction::Down => {
                    if doomed.load(Ordering::SeqCst) {
                        // The request was applied (the server answered): lose the answer and
                        // end the connection, so the client never learns the outcome.
                        shared.lost_replies.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                }
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = read => {}
        () = write => {}
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// An echo server that counts the requests it received.
    async fn echo() -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        counter.fetch_add(1, Ordering::SeqCst);
                        if s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, seen)
    }

    async fn roundtrip(s: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
        s.write_all(msg).await?;
        let mut buf = vec![0u8; msg.len()];
        s.read_exact(&mut buf).await?;
        Ok(buf)
    }

    #[tokio::test]
    async fn forwards_and_loses_exactly_one_reply_after_the_request_arrived() {
        let (server, seen) = echo().await;
        let proxy = FaultProxy::start(server).await.unwrap();
        let mut a = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut a, b"ping").await.unwrap(), b"ping");
        proxy.lose_next_reply();
        assert!(roundtrip(&mut a, b"lost").await.is_err(), "the reply was delivered");
        assert_eq!(seen.load(Ordering::SeqCst), 2, "the request whose reply was lost never reached the server");
        assert_eq!(proxy.lost_replies(), 1);
        let mut b = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut b, b"again").await.unwrap(), b"again", "one-shot fault stayed armed");
    }

    #[tokio::test]
    async fn a_later_request_can_lose_its_reply() {
        let (server, seen) = echo().await;
        let proxy = FaultProxy::start(server).await.unwrap();
        let mut a = TcpStream::connect(proxy.addr()).await.unwrap();
        proxy.lose_reply_to(1);
        assert_eq!(roundtrip(&mut a, b"first").await.unwrap(), b"first");
        assert!(roundtrip(&mut a, b"second").await.is_err(), "the second reply was delivered");
        assert_eq!(seen.load(Ordering::SeqCst), 2);
        assert_eq!(proxy.lost_replies(), 1);
    }

    #[tokio::test]
    async fn a_partition_holds_traffic_until_healed_and_a_cut_closes_connections() {
        let (server, seen) = echo().await;
        let proxy = FaultProxy::start(server).await.unwrap();
        let mut a = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut a, b"one").await.unwrap(), b"one");
        proxy.partition();
        let held = tokio::time::timeout(Duration::from_millis(200), roundtrip(&mut a, b"two")).await;
        assert!(held.is_err(), "traffic flowed through a partition");
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        proxy.heal();
        let mut rest = [0u8; 3];
        a.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"two", "the bytes held by the partition were not delivered on heal");
        proxy.cut_connections();
        let mut buf = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(2), a.read(&mut buf)).await.unwrap();
        assert!(matches!(closed, Ok(0) | Err(_)), "a cut connection stayed open");
        let mut b = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut b, b"new").await.unwrap(), b"new");
        assert_eq!(proxy.connections(), 2);
    }

    #[tokio::test]
    async fn delayed_replies_arrive_late_after_the_request_was_applied_without_queueing() {
        let (server, seen) = echo().await;
        let proxy = FaultProxy::start(server).await.unwrap();
        let mut a = TcpStream::connect(proxy.addr()).await.unwrap();
        a.set_nodelay(true).unwrap();
        assert_eq!(roundtrip(&mut a, b"warm").await.unwrap(), b"warm");
        let delay = Duration::from_secs(2);
        proxy.delay_replies(delay);
        let sent = Instant::now();
        // Three requests in a row on one connection: a delay held per chunk in turn would
        // answer the last after three delays; latency answers all after about one.
        for msg in [b"one", b"two", b"six"] {
            a.write_all(msg).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The client may coalesce the small writes: count that they arrived, not how many reads.
        assert!(seen.load(Ordering::SeqCst) > 1, "the requests did not reach the server at once");
        let mut replies = [0u8; 9];
        a.read_exact(&mut replies).await.unwrap();
        let took = sent.elapsed();
        assert_eq!(&replies, b"onetwosix");
        assert!(took >= delay, "the replies came back after {took:?}, before the {delay:?} delay");
        assert!(took < delay * 2, "three replies took {took:?}: the delay queued them one after another");
        proxy.no_delay();
        let sent = Instant::now();
        assert_eq!(roundtrip(&mut a, b"fast").await.unwrap(), b"fast");
        assert!(sent.elapsed() < delay, "no_delay left the replies delayed");
    }
}
