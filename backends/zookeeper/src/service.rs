//! The lock service: the ZooKeeper lock recipe with `czxid` fences.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use palisade_core::spi::{EpochFence, HeldGrants};
use palisade_core::spi::{timeout_error, validate_wait};
use palisade_core::{
    Capabilities, Deployment, Error, ErrorKind, Fence, FenceSource, Fenced, Grant, LockService, MultiAcquire,
    OwnerToken, Replication, ResourceKey, Result, Ttl, Waiting,
};
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};
use zookeeper_client as zk;

use crate::{BACKEND, ZkConfig};

/// A lock service on ZooKeeper. One session per instance, shared by all its locks.
///
/// Dropping it (or [`close`](ZkLockService::close)) closes the session: its lock nodes go at
/// once.
pub struct ZkLockService {
    inner: Arc<Inner>,
}

struct Inner {
    config: ZkConfig,
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
    held: Arc<HeldGrants>,
    stop: CancellationToken,
}

struct Session {
    client: zk::Client,
    id: i64,
    timeout: Duration,
    /// When the connection was lost, while it is (`None` while connected).
    disconnected_since: Mutex<Option<Instant>>,
    lost: CancellationToken,
}

impl Session {
    /// The latest instant the ensemble may still keep this session, as far as this process can
    /// prove: a third of the timeout passes between pings, so the server's last sight of us is
    /// at most that long before the disconnect (or now, while connected).
    fn deadline(&self) -> Instant {
        let since =
            (*self.disconnected_since.lock().unwrap_or_else(PoisonError::into_inner)).unwrap_or_else(Instant::now);
        since + self.timeout * 2 / 3
    }

    fn alive(&self) -> bool {
        !self.lost.is_cancelled() && Instant::now() < self.deadline()
    }
}

/// Maps a client error. `writes`: whether the request may have changed state, in which case a
/// lost connection leaves its outcome unknown.
///
/// The client reports a connection that failed in its own words (`Custom`: an I/O error, or
/// "no response from connection in N ms" when the network went silent, as in a partition):
/// those are connection losses too, not errors of the ensemble.
pub(crate) fn map(e: zk::Error, what: &str, writes: bool) -> Error {
    let (kind, retryable) = match &e {
        zk::Error::ConnectionLoss | zk::Error::Timeout | zk::Error::Custom(_) if writes => {
            (ErrorKind::OutcomeUnknown, false)
        }
        zk::Error::ConnectionLoss
        | zk::Error::Timeout
        | zk::Error::Custom(_)
        | zk::Error::NoHosts
        | zk::Error::Throttled => (ErrorKind::Unavailable, true),
        zk::Error::SessionExpired | zk::Error::SessionMoved | zk::Error::ClientClosed => (ErrorKind::LeaseLost, true),
        zk::Error::NoAuth | zk::Error::AuthFailed | zk::Error::InvalidAcl => (ErrorKind::InvalidConfig, false),
        zk::Error::BadArguments(_) => (ErrorKind::InvalidKey, false),
        _ => (ErrorKind::Backend, false),
    };
    Error::new(kind, BACKEND, format!("{what} failed: {e}")).with_retryable(retryable)
}

pub(crate) fn timed_out(what: &str, writes: bool) -> Error {
    let kind = if writes { ErrorKind::OutcomeUnknown } else { ErrorKind::Unavailable };
    Error::new(kind, BACKEND, format!("{what}: no answer within the request timeout")).with_retryable(!writes)
}

/// The epoch node's ACL under a digest identity: its creator changes it, anyone reads it.
static EPOCH_ACL: [zk::Acl; 2] =
    [zk::Acl::new_const(zk::Permission::ALL, "auth", ""), zk::Acl::new_const(zk::Permission::READ, "world", "anyone")];

/// `lock-<token>-` nodes; ZooKeeper appends a 10-digit sequence.
pub fn node_prefix(token: OwnerToken) -> String {
    format!("lock-{token}-")
}

/// The sequence ZooKeeper appended to a node's name (`lock-<token>-<sequence>`, or a path
/// ending in one): `%010d` of the parent's signed 32-bit `cversion`, which wraps to negative
/// after 2³¹ changes (`lock-<token>--000000001`). Taking the digits after the last `-` would
/// drop that sign; the token is hex, so the sequence is everything after its `-`.
pub fn sequence_of(name: &str) -> Option<i32> {
    let node = name.rsplit('/').next()?;
    node.strip_prefix("lock-")?.split_once('-')?.1.parse().ok()
}

/// Sorts contenders into queue order across the sequence's wrap: by distance from the first
/// one listed (wrapping), which is right as long as the live nodes of one lock span less than
/// 2³¹ sequence numbers — they are created within a few seconds of lock traffic of each other.
pub fn queue_order(contenders: &mut [(i32, String)]) {
    let Some(&(anchor, _)) = contenders.first() else { return };
    contenders.sort_by_key(|(s, _)| s.wrapping_sub(anchor));
}

/// A parent's children that are contender nodes, with their full paths, in queue order.
fn sorted_contenders(parent: &str, children: Vec<String>) -> Vec<(i32, String)> {
    let mut sorted: Vec<(i32, String)> =
        children.into_iter().filter_map(|c| sequence_of(&c).map(|s| (s, format!("{parent}/{c}")))).collect();
    queue_order(&mut sorted);
    sorted
}

/// The fence's layout: the service's epoch over 48 bits of the lock node's `czxid`. A zxid is
/// ZooKeeper's own epoch (one per leader election) over a 32-bit counter, so 48 bits last 65,536
/// elections of one ensemble's life; 2¹⁵ − 1 epochs keep every fence within 63 bits.
pub const LAYOUT: EpochFence = EpochFence::new(48);

/// The fence of a node created at transaction id `czxid` (its `Stat`) under `epoch`:
/// `epoch × 2⁴⁸ + czxid`, the `czxid` itself while the epoch is 0 (an ensemble that never lost
/// its data). A zxid is positive and, here, below 2⁴⁸: anything else is a
/// [`ErrorKind::Backend`] error, never a fence.
pub fn fence_of(epoch: u64, czxid: i64) -> Result<Fence> {
    u64::try_from(czxid).ok().and_then(|z| LAYOUT.fence(epoch, z)).ok_or_else(|| {
        Error::new(
            ErrorKind::Backend,
            BACKEND,
            format!("ZooKeeper returned czxid {czxid}, which under epoch {epoch} does not fit a fence's 63 bits"),
        )
    })
}

/// The `czxid` a fence was made from (its low 48 bits).
pub fn czxid_of(fence: Fence) -> i64 {
    i64::try_from(LAYOUT.number(fence)).unwrap_or(-1)
}

/// The epoch whose fences are all above `floor`: one past `floor`'s. `Unsupported` beyond the
/// last epoch (that many recoveries; the fences would no longer fit 63 bits).
pub fn epoch_above(floor: Fence) -> Result<u64> {
    LAYOUT.epoch_above(floor).ok_or_else(|| {
        Error::new(
            ErrorKind::Unsupported,
            BACKEND,
            format!(
                "fence {floor} needs an epoch above the last one ({}): fences would no longer fit 63 bits",
                LAYOUT.max_epoch()
            ),
        )
    })
}

/// The epoch node's data ([`EpochFence::encode`]).
pub fn encode_epoch(epoch: u64) -> Vec<u8> {
    EpochFence::encode(epoch).into_bytes()
}

/// The epoch the epoch node holds: no node (never raised) is 0; data in any other form is a
/// [`ErrorKind::Backend`] error, never an epoch.
pub fn decode_epoch(data: Option<&[u8]>) -> Result<u64> {
    let Some(data) = data else { return Ok(0) };
    EpochFence::decode(data).ok_or_else(|| {
        Error::new(
            ErrorKind::Backend,
            BACKEND,
            format!("the epoch node holds {:?}, not an epoch", String::from_utf8_lossy(data)),
        )
    })
}

/// Whether sequence `a` was issued before `b`, across the wrap.
pub fn precedes(a: i32, b: i32) -> bool {
    b.wrapping_sub(a) > 0
}

impl ZkLockService {
    /// Connects to `zk://host:port[,host:port…][/chroot]` with default settings.
    pub async fn connect(url: &str) -> Result<Self> {
        ZkLockService::connect_with(ZkConfig::from_url(url)?).await
    }

    /// Connects and starts the session.
    pub async fn connect_with(config: ZkConfig) -> Result<Self> {
        config.validate_complete()?;
        let inner = Arc::new(Inner {
            config,
            session: tokio::sync::Mutex::new(None),
            held: HeldGrants::new(),
            stop: CancellationToken::new(),
        });
        inner.session().await?;
        debug!(url = %inner.config.redacted_url(), "zookeeper lock service connected");
        Ok(ZkLockService { inner })
    }

    /// The settings this service was made with.
    pub fn config(&self) -> &ZkConfig {
        &self.inner.config
    }

    /// The current session's client (for tests and tooling), starting a session if needed.
    pub async fn client(&self) -> Result<zk::Client> {
        Ok(self.inner.session().await?.client.clone())
    }

    /// Closes the session: every lock of this client goes at once (lost signals fire).
    pub async fn close(self) {
        self.inner.shutdown().await;
    }

    /// The node that holds the service's epoch (for `inspect`).
    pub(crate) fn epoch_path(&self) -> String {
        self.inner.epoch_path()
    }

    /// The parent node of a resource's contenders: `<root>/<domain>/<id>`.
    pub fn parent_path(&self, key: &ResourceKey) -> String {
        self.inner.parent(key)
    }
}

impl Drop for ZkLockService {
    fn drop(&mut self) {
        let inner = Arc::clone(&self.inner);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move { inner.shutdown().await });
        } else {
            inner.stop.cancel();
        }
    }
}

/// A session, our contender node's path and stat, and, if they were read in the same flight,
/// the contenders and the epoch.
type Joined = (Arc<Session>, String, zk::Stat, Option<Listed>);

/// The contenders of a resource, lowest first, and the service's epoch, read right after our
/// node's creation.
type Listed = (Vec<(i32, String)>, u64);

impl Inner {
    fn parent(&self, key: &ResourceKey) -> String {
        format!("{}/{}/{}", self.config.root, key.domain(), key.id())
    }

    /// The node that holds the service's epoch (`<root>.epoch`), absent until a recovery. Not
    /// under the root: the root and the resources' parents are container nodes, which the
    /// ensemble deletes when they are empty, and the epoch must outlive every lock.
    fn epoch_path(&self) -> String {
        format!("{}.epoch", self.config.root)
    }

    /// The service's epoch now (0 while its node does not exist).
    async fn epoch(&self, session: &Session) -> Result<u64> {
        let read = timeout(self.config.request_timeout, session.client.get_data(&self.epoch_path()))
            .await
            .map_err(|_| timed_out("reading the epoch", false))?;
        match read {
            Ok((data, _)) => decode_epoch(Some(&data)),
            Err(zk::Error::NoNode) => Ok(0),
            Err(e) => Err(map(e, "reading the epoch", false)),
        }
    }

    async fn shutdown(&self) {
        self.stop.cancel();
        self.held.lose_all();
        if let Some(session) = self.session.lock().await.take() {
            session.lost.cancel();
            // Dropping the last handle closes the session on the server.
            drop(session);
        }
    }

    async fn session(&self) -> Result<Arc<Session>> {
        let mut slot = self.session.lock().await;
        if let Some(s) = slot.as_ref().filter(|s| s.alive()) {
            return Ok(Arc::clone(s));
        }
        if self.stop.is_cancelled() {
            return Err(Error::new(ErrorKind::Unavailable, BACKEND, "the lock service is closed"));
        }
        let mut connector = zk::Client::connector()
            .with_session_timeout(self.config.session_timeout)
            .with_connection_timeout(self.config.connect_timeout);
        match &self.config.digest {
            #[cfg(feature = "sasl")]
            Some((user, password)) if self.config.sasl => {
                connector = connector.with_sasl(zk::SaslOptions::digest_md5(user.clone(), password.clone()));
            }
            Some((user, password)) => {
                connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
            }
            None => {}
        }
        let cluster = format!("{}{}", self.config.servers.join(","), self.config.chroot.as_deref().unwrap_or(""));
        let connected =
            timeout(self.config.connect_timeout * 2, self.start_session(connector, &cluster)).await.map_err(|_| {
                Error::new(ErrorKind::Unavailable, BACKEND, format!("cannot connect to {}", self.config.redacted_url()))
                    .with_retryable(true)
            })?;
        let client = connected?.map_err(|e| {
            let err = map(e, "connect", false);
            if err.kind() == ErrorKind::Backend || err.kind() == ErrorKind::LeaseLost {
                Error::new(ErrorKind::Unavailable, BACKEND, format!("cannot connect to {}", self.config.redacted_url()))
                    .with_source(err)
                    .with_retryable(true)
            } else {
                err
            }
        })?;
        let session = Arc::new(Session {
            id: client.session_id().0,
            timeout: client.session_timeout(),
            client,
            disconnected_since: Mutex::new(None),
            lost: CancellationToken::new(),
        });
        tokio::spawn(watch_session(Arc::clone(&session), self.stop.clone()));
        debug!(session = format!("{:#x}", session.id), timeout = ?session.timeout, "zookeeper session started");
        *slot = Some(Arc::clone(&session));
        Ok(session)
    }

    /// The client's connect, over TLS for `zks://`. With TLS, a handshake of our own runs beside
    /// it ([`crate::tls`]): its refusal is the answer (the client would retry it as an outage).
    async fn start_session(
        &self,
        connector: zk::Connector,
        cluster: &str,
    ) -> Result<std::result::Result<zk::Client, zk::Error>> {
        #[cfg(feature = "tls")]
        if self.config.tls {
            let connector = connector.with_tls(crate::tls::options(&self.config)?);
            let config = self.config.clone();
            let mut refusal = tokio::task::spawn_blocking(move || crate::tls::refusal(&config));
            let connect = connector.secure_connect(cluster);
            tokio::pin!(connect);
            return tokio::select! {
                connected = &mut connect => Ok(connected),
                refused = &mut refusal => match refused {
                    Ok(Some(error)) => Err(error),
                    // Our handshake passed or proved nothing: the client's connect answers.
                    _ => Ok(connect.await),
                },
            };
        }
        Ok(connector.connect(cluster).await)
    }

    /// Creates our contender node, creating the resource's parents (container nodes, which
    /// the server removes when empty) when they are missing.
    async fn create_node(
        self: &Arc<Self>,
        session: &Arc<Session>,
        parent: &str,
        token: OwnerToken,
        list: bool,
    ) -> Result<(String, zk::Stat, Option<Listed>)> {
        let created = self.try_create_node(session, parent, token, list).await;
        if created.as_ref().is_err_and(|e| e.kind() == ErrorKind::OutcomeUnknown) {
            // The node may exist with a sequence we never learned: find it by our token (it is
            // in the name) and delete it, or it would block the queue while we live.
            self.abandon_by_token(parent.to_string(), token, session);
        }
        created
    }

    /// A live session and our new contender node on it. A session the server already expired
    /// (we may hear of it here first) is marked lost and replaced, once.
    /// With `list`, also the contenders as of our node's creation (see `try_create_node`).
    async fn join_queue(self: &Arc<Self>, parent: &str, token: OwnerToken, list: bool) -> Result<Joined> {
        let mut attempt = 0;
        loop {
            let session = self.session().await?;
            match self.create_node(&session, parent, token, list).await {
                Ok((path, stat, contenders)) => return Ok((session, path, stat, contenders)),
                Err(e) if e.kind() == ErrorKind::LeaseLost && attempt == 0 => {
                    session.lost.cancel();
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn abandon_by_token(self: &Arc<Self>, parent: String, token: OwnerToken, session: &Arc<Session>) {
        let (inner, session) = (Arc::downgrade(self), Arc::clone(session));
        tokio::spawn(async move {
            let prefix = node_prefix(token);
            for _ in 0..50 {
                let Some(strong) = inner.upgrade() else { return };
                if session.lost.is_cancelled() || strong.stop.is_cancelled() {
                    return;
                }
                if let Ok(contenders) = strong.contenders(&session, &parent).await {
                    match contenders
                        .into_iter()
                        .find(|(_, p)| p.rsplit('/').next().is_some_and(|n| n.starts_with(&prefix)))
                    {
                        Some((_, path)) => return strong.abandon(path, &session),
                        None => return,
                    }
                }
                drop(strong);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }

    /// Creates our node; with `list`, also lists the resource's contenders and reads the epoch
    /// in the same flight. The client sends requests in the order of the calls and the server
    /// answers a session's requests in order, so a listing sent right after the create sees
    /// our node and every contender created before it, and the epoch read after it is at
    /// least the epoch as of our node's creation, as reads sent after the create's reply
    /// would be, one round trip sooner. `None` when not asked for or when a read failed (the
    /// caller reads again).
    async fn try_create_node(
        &self,
        session: &Session,
        parent: &str,
        token: OwnerToken,
        list: bool,
    ) -> Result<(String, zk::Stat, Option<Listed>)> {
        let acls = if self.config.digest.is_some() { zk::Acls::creator_all() } else { zk::Acls::anyone_all() };
        let options = zk::CreateMode::EphemeralSequential.with_acls(acls);
        let prefix = format!("{parent}/{}", node_prefix(token));
        for _ in 0..3 {
            let create = session.client.create(&prefix, &[], &options);
            let listing = list.then(|| session.client.list_children(parent));
            let epoch_path = self.epoch_path();
            let epoch = list.then(|| session.client.get_data(&epoch_path));
            let created = timeout(self.config.request_timeout, create).await.map_err(|_| timed_out("acquire", true))?;
            match created {
                Ok((stat, sequence)) => {
                    let listed = match (listing, epoch) {
                        (Some(listing), Some(epoch)) => {
                            let children = timeout(self.config.request_timeout, listing).await;
                            let epoch = timeout(self.config.request_timeout, epoch).await;
                            match (children, epoch) {
                                // Not `?`: our node exists now, and the caller's queue place
                                // removes it if the epoch cannot be read.
                                (Ok(Ok(children)), Ok(Ok((data, _)))) => decode_epoch(Some(&data))
                                    .ok()
                                    .map(|epoch| (sorted_contenders(parent, children), epoch)),
                                (Ok(Ok(children)), Ok(Err(zk::Error::NoNode))) => {
                                    Some((sorted_contenders(parent, children), 0))
                                }
                                _ => None,
                            }
                        }
                        _ => None,
                    };
                    return Ok((format!("{prefix}{sequence}"), stat, listed));
                }
                Err(zk::Error::NoNode) => {
                    let parents = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
                    match timeout(self.config.request_timeout, session.client.mkdir(parent, &parents)).await {
                        Ok(Ok(())) | Ok(Err(zk::Error::NodeExists)) => {}
                        Ok(Err(e)) => return Err(map(e, "creating the lock's parent", false)),
                        Err(_) => return Err(timed_out("creating the lock's parent", false)),
                    }
                }
                Err(e) => return Err(map(e, "acquire", true)),
            }
        }
        Err(Error::new(ErrorKind::Unavailable, BACKEND, format!("{parent} keeps disappearing")).with_retryable(true))
    }

    /// The contenders of a resource, lowest sequence first.
    async fn contenders(&self, session: &Session, parent: &str) -> Result<Vec<(i32, String)>> {
        let children = timeout(self.config.request_timeout, session.client.list_children(parent))
            .await
            .map_err(|_| timed_out("listing contenders", false))?;
        let children = match children {
            Ok(c) => c,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(map(e, "listing contenders", false)),
        };
        Ok(sorted_contenders(parent, children))
    }

    /// Our node's stat (`None` if it is gone), the resource's contenders, lowest first, and
    /// the service's epoch, in one multi-read request.
    async fn queue_view(
        &self,
        session: &Session,
        parent: &str,
        path: &str,
    ) -> Result<(Option<zk::Stat>, Vec<(i32, String)>, u64)> {
        let failed = |e| map(e, "acquire (queue check)", false);
        let mut reader = session.client.new_multi_reader();
        reader.add_get_data(path).map_err(failed)?;
        reader.add_get_children(parent).map_err(failed)?;
        reader.add_get_data(&self.epoch_path()).map_err(failed)?;
        let results = timeout(self.config.request_timeout, reader.commit())
            .await
            .map_err(|_| timed_out("acquire (queue check)", false))?
            .map_err(failed)?;
        let unexpected = || Error::new(ErrorKind::Backend, BACKEND, "unexpected multi-read result");
        let [mine, children, epoch] = <[zk::MultiReadResult; 3]>::try_from(results).map_err(|_| unexpected())?;
        let mine = match mine {
            zk::MultiReadResult::Data { stat, .. } => Some(stat),
            zk::MultiReadResult::Error { err: zk::Error::NoNode } => None,
            zk::MultiReadResult::Error { err } => return Err(failed(err)),
            _ => return Err(unexpected()),
        };
        let mut contenders = match children {
            zk::MultiReadResult::Children { children } => {
                children.into_iter().filter_map(|c| sequence_of(&c).map(|s| (s, format!("{parent}/{c}")))).collect()
            }
            zk::MultiReadResult::Error { err: zk::Error::NoNode } => Vec::new(),
            zk::MultiReadResult::Error { err } => return Err(failed(err)),
            _ => return Err(unexpected()),
        };
        let epoch = match epoch {
            zk::MultiReadResult::Data { data, .. } => decode_epoch(Some(&data))?,
            zk::MultiReadResult::Error { err: zk::Error::NoNode } => 0,
            zk::MultiReadResult::Error { err } => return Err(failed(err)),
            _ => return Err(unexpected()),
        };
        queue_order(&mut contenders);
        Ok((mine, contenders, epoch))
    }

    /// Deletes a node of ours in the background until it is gone, the session is, or the
    /// service closes: a forgotten contender would block the queue for as long as we live.
    fn abandon(self: &Arc<Self>, path: String, session: &Arc<Session>) {
        let (inner, session) = (Arc::downgrade(self), Arc::clone(session));
        tokio::spawn(async move {
            let mut backoff =
                palisade_core::spi::Backoff::with_bounds(Duration::from_millis(20), Duration::from_millis(500));
            loop {
                let Some(strong) = inner.upgrade() else { return };
                if session.lost.is_cancelled() || strong.stop.is_cancelled() {
                    return;
                }
                match timeout(strong.config.request_timeout, session.client.delete(&path, None)).await {
                    Ok(Ok(())) | Ok(Err(zk::Error::NoNode)) => return,
                    Ok(Err(zk::Error::SessionExpired | zk::Error::ClientClosed)) => return,
                    _ => {}
                }
                drop(strong);
                tokio::select! {
                    () = tokio::time::sleep(backoff.next_delay()) => {}
                    () = session.lost.cancelled() => return,
                }
            }
        });
    }

    /// The TTL a grant requested at `sent_at` may claim: capped at the session's proven life.
    fn cap(session: &Session, ttl: Ttl, sent_at: Instant) -> Result<Ttl> {
        Ttl::new(ttl.get().min(session.deadline().saturating_duration_since(sent_at))).map_err(|_| {
            Error::new(ErrorKind::LeaseLost, BACKEND, "the ZooKeeper session has no time left").with_retryable(true)
        })
    }

    fn grant(
        self: &Arc<Self>,
        key: &ResourceKey,
        (token, path, fence): (OwnerToken, String, Fence),
        ttl: Ttl,
        sent_at: Instant,
        session: &Arc<Session>,
    ) -> Result<Grant<Fenced>> {
        let granted = Inner::cap(session, ttl, sent_at)?;
        let grant = Grant::new(key.clone(), token, fence, granted, sent_at).with_handle(path.clone());
        let give_up = {
            let (inner, session, path) = (Arc::downgrade(self), Arc::clone(session), path.clone());
            Box::new(move || {
                Box::pin(async move {
                    if let Some(inner) = inner.upgrade() {
                        inner.abandon(path, &session);
                    }
                }) as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
            })
        };
        self.held.hold(
            path,
            grant.fence().get(),
            sent_at + granted.get(),
            grant.lost_token().clone(),
            session.lost.clone(),
            give_up,
        );
        Ok(grant)
    }

    /// Our node for a grant: its handle if it carries the grant's token, else found by token
    /// among the resource's contenders (a grant rebuilt from its parts).
    async fn node_of(&self, session: &Session, grant: &Grant<Fenced>) -> Result<Option<String>> {
        let prefix = node_prefix(grant.token());
        if let Some(handle) = grant.handle() {
            return Ok(handle.rsplit('/').next().is_some_and(|n| n.starts_with(&prefix)).then(|| handle.to_string()));
        }
        let parent = self.parent(grant.key());
        Ok(self
            .contenders(session, &parent)
            .await?
            .into_iter()
            .map(|(_, path)| path)
            .find(|p| p.rsplit('/').next().is_some_and(|n| n.starts_with(&prefix))))
    }
}

/// Follows the session's state: a disconnect starts the clock on its proven life; expiry,
/// close or an authentication failure loses it (and every grant with it).
async fn watch_session(session: Arc<Session>, stop: CancellationToken) {
    let mut states = session.client.state_watcher();
    loop {
        let deadline = session.deadline();
        let disconnected = session.disconnected_since.lock().unwrap_or_else(PoisonError::into_inner).is_some();
        tokio::select! {
            () = stop.cancelled() => return,
            () = sleep_until(deadline), if disconnected => {
                error!(session = format!("{:#x}", session.id), "zookeeper disconnected past the session's proven life; its locks are lost");
                session.lost.cancel();
                return;
            }
            state = states.changed() => match state {
                zk::SessionState::Disconnected => {
                    warn!(session = format!("{:#x}", session.id), "zookeeper connection lost");
                    let mut since = session.disconnected_since.lock().unwrap_or_else(PoisonError::into_inner);
                    since.get_or_insert_with(Instant::now);
                }
                zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                    *session.disconnected_since.lock().unwrap_or_else(PoisonError::into_inner) = None;
                }
                other => {
                    error!(session = format!("{:#x}", session.id), state = ?other, "zookeeper session ended; its locks are lost");
                    session.lost.cancel();
                    return;
                }
            },
        }
    }
}

/// Deletes a waiter's node if the wait ends without the lock.
struct QueuePlace {
    inner: Arc<Inner>,
    session: Arc<Session>,
    path: String,
    armed: bool,
}

impl Drop for QueuePlace {
    fn drop(&mut self) {
        if self.armed && tokio::runtime::Handle::try_current().is_ok() {
            self.inner.abandon(std::mem::take(&mut self.path), &self.session);
        }
    }
}

#[async_trait]
impl LockService for ZkLockService {
    type Fencing = Fenced;

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fence_source: FenceSource::Zxid,
            fences_survive_release: true,
            fences_survive_restart: true,
            gap_free: false,
            waiting: Waiting::NativeFifo,
            // A stopped holder's node lives until the ensemble expires its session.
            expiry_delay: self.inner.config.session_timeout,
            deployment: Deployment::Network,
            // Zab: a grant is a node committed by a quorum of the ensemble.
            replication: Replication::LeaderQuorum,
            // A grant is a sequential node and then a look at who is first: ZooKeeper's `multi`
            // can create every node of a set at once, but not read the queues it joined.
            multi_acquire: MultiAcquire::PerKey,
        }
    }

    /// Creates our node; if it has the lowest sequence the lock is ours (fence = its
    /// `czxid`), otherwise it is deleted again and the answer is "busy".
    async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Fenced>>> {
        let inner = &self.inner;
        let token = OwnerToken::generate()?;
        let parent = inner.parent(key);
        let sent_at = Instant::now();
        let (session, path, stat, listed) = inner.join_queue(&parent, token, true).await?;
        let mut place =
            QueuePlace { inner: Arc::clone(inner), session: Arc::clone(&session), path: path.clone(), armed: true };
        let (contenders, epoch) = match listed {
            Some(listed) => listed,
            None => (inner.contenders(&session, &parent).await?, inner.epoch(&session).await?),
        };
        if contenders.first().map(|(_, p)| p) != Some(&path) {
            // Busy: leave at once (in the background if the delete fails).
            if let Ok(Ok(())) = timeout(inner.config.request_timeout, session.client.delete(&path, None)).await {
                place.armed = false;
            }
            return Ok(None);
        }
        let fence = fence_of(epoch, stat.czxid)?;
        place.armed = false;
        inner.grant(key, (token, path, fence), ttl, sent_at, &session).map(Some)
    }

    /// Rounds of `try_acquire` over the keys; between rounds, an existence watch on the first
    /// contender of each key (its holder, or the waiter it goes to next) wakes the waiter when
    /// any of them leaves. Not the node just ahead in a queue: these waiters join no queue, so
    /// they are not in the keys' FIFO order, and leave no node behind when cancelled. A key
    /// found with no contender at all is tried again at once.
    async fn acquire_any(&self, keys: &[ResourceKey], ttl: Ttl, wait: Duration) -> Result<Grant<Fenced>> {
        let first = palisade_core::spi::first_of(BACKEND, keys)?;
        validate_wait(wait)?;
        let give_up = Instant::now() + wait;
        let gave_up = || palisade_core::spi::timeout_of_any(timeout_error(BACKEND, first, wait), BACKEND, keys, wait);
        let inner = &self.inner;
        'round: loop {
            for key in keys {
                if let Some(grant) = self.try_acquire(key, ttl).await? {
                    return Ok(grant);
                }
            }
            if Instant::now() >= give_up {
                return Err(gave_up());
            }
            let session = inner.session().await?;
            let mut watchers = Vec::with_capacity(keys.len());
            for key in keys {
                let contenders = inner.contenders(&session, &inner.parent(key)).await?;
                let Some((_, head)) = contenders.first() else { continue 'round };
                let watched = timeout(inner.config.request_timeout, session.client.check_and_watch_stat(head))
                    .await
                    .map_err(|_| timed_out("watch", false))?
                    .map_err(|e| map(e, "watch", false))?;
                match watched {
                    (Some(_), watcher) => watchers.push(Box::pin(watcher.changed())),
                    (None, _) => continue 'round,
                }
            }
            let any_left = std::future::poll_fn(|cx| {
                if watchers.iter_mut().any(|w| w.as_mut().poll(cx).is_ready()) {
                    std::task::Poll::Ready(())
                } else {
                    std::task::Poll::Pending
                }
            });
            tokio::select! {
                () = any_left => {}
                () = sleep_until(give_up) => return Err(gave_up()),
                () = session.lost.cancelled() => {
                    return Err(Error::new(ErrorKind::LeaseLost, BACKEND, "the ZooKeeper session ended while waiting")
                        .with_retryable(true));
                }
            }
        }
    }

    /// The lock recipe: our node joins the queue; we watch only the node just ahead of ours
    /// (no herd), and re-check on every event. Before declaring the lock ours we re-read our
    /// node and require its ephemeral owner to be this session (a node left by an expired
    /// session is never mistaken for ours: CURATOR-604).
    async fn acquire(&self, key: &ResourceKey, ttl: Ttl, wait: Duration) -> Result<Grant<Fenced>> {
        validate_wait(wait)?;
        if wait.is_zero() {
            // One attempt: no queue node to create and remove.
            return self.try_acquire(key, ttl).await?.ok_or_else(|| timeout_error(BACKEND, key, wait));
        }
        let give_up = Instant::now() + wait;
        let inner = &self.inner;
        let token = OwnerToken::generate()?;
        let parent = inner.parent(key);
        let (session, path, stat, _) = inner.join_queue(&parent, token, false).await?;
        let mut place =
            QueuePlace { inner: Arc::clone(inner), session: Arc::clone(&session), path: path.clone(), armed: true };
        let my_sequence = sequence_of(&path).ok_or_else(|| {
            Error::new(ErrorKind::Backend, BACKEND, format!("lock node {path} has no sequence suffix"))
        })?;
        loop {
            let sent_at = Instant::now();
            // One read: our own node and the queue, as of the same moment.
            // The epoch is read once nobody is ahead: a grant's epoch is never older than the
            // one its predecessor was granted under.
            let (mine, contenders, epoch) = inner.queue_view(&session, &parent, &path).await?;
            let ours = mine.is_some_and(|s| s.ephemeral_owner == session.id && s.czxid == stat.czxid);
            if !ours || session.lost.is_cancelled() {
                place.armed = false;
                return Err(Error::new(ErrorKind::LeaseLost, BACKEND, "the ZooKeeper session ended while waiting")
                    .with_retryable(true));
            }
            let ahead = contenders.iter().rfind(|(s, _)| precedes(*s, my_sequence)).map(|(_, p)| p.clone());
            let Some(ahead) = ahead else {
                let fence = fence_of(epoch, stat.czxid)?;
                place.armed = false;
                return inner.grant(key, (token, path, fence), ttl, sent_at, &session);
            };
            let watched = timeout(inner.config.request_timeout, session.client.check_and_watch_stat(&ahead))
                .await
                .map_err(|_| timed_out("watch", false))?
                .map_err(|e| map(e, "watch", false))?;
            let (Some(_), watcher) = watched else { continue };
            tokio::select! {
                _ = watcher.changed() => {}
                () = sleep_until(give_up) => return Err(timeout_error(BACKEND, key, wait)),
                () = session.lost.cancelled() => {
                    place.armed = false;
                    return Err(Error::new(ErrorKind::LeaseLost, BACKEND, "the ZooKeeper session ended while waiting")
                        .with_retryable(true));
                }
            }
        }
    }

    /// Checks that our node still exists, created at the fence by this session, and moves the
    /// local deadline; the session's heartbeats keep the node on the server.
    async fn extend(&self, grant: &Grant<Fenced>, ttl: Ttl) -> Result<Ttl> {
        let inner = &self.inner;
        let fence = grant.fence().get();
        let not_holder =
            || Error::new(ErrorKind::NotHolder, BACKEND, format!("{} is not held by this grant", grant.key()));
        let session = inner.session.lock().await.clone().ok_or_else(not_holder)?;
        let Some(path) = inner.node_of(&session, grant).await? else { return Err(not_holder()) };
        if !inner.held.holds(&path, fence) {
            return Err(not_holder());
        }
        let sent_at = Instant::now();
        let stat = timeout(inner.config.request_timeout, session.client.check_stat(&path))
            .await
            .map_err(|_| timed_out("extend", false))?
            .map_err(|e| map(e, "extend", false))?;
        match stat {
            Some(s) if s.czxid == czxid_of(grant.fence()) && s.ephemeral_owner == session.id => {}
            _ => {
                inner.held.forget(&path, fence);
                return Err(not_holder());
            }
        }
        let granted = Inner::cap(&session, ttl, sent_at)?;
        if inner.held.extend(&path, fence, sent_at + granted.get()) { Ok(granted) } else { Err(not_holder()) }
    }

    /// Deletes our node.
    async fn release(&self, grant: &Grant<Fenced>) -> Result<()> {
        let inner = &self.inner;
        let not_holder =
            || Error::new(ErrorKind::NotHolder, BACKEND, format!("{} was not held by this grant", grant.key()));
        let session = inner.session.lock().await.clone().ok_or_else(not_holder)?;
        let Some(path) = inner.node_of(&session, grant).await? else { return Err(not_holder()) };
        inner.held.forget(&path, grant.fence().get());
        match timeout(inner.config.request_timeout, session.client.delete(&path, None)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(zk::Error::NoNode)) => Err(not_holder()),
            Ok(Err(e)) => {
                inner.abandon(path, &session);
                Err(map(e, "release", true))
            }
            Err(_) => {
                inner.abandon(path, &session);
                Err(timed_out("release", true))
            }
        }
    }

    /// Raises the service's epoch (the `<root>.epoch` node) to the first one whose fences are
    /// all above `floor` (fences are `epoch × 2⁴⁸ + czxid`); never lowers it. Every resource's fences move with it:
    /// the epoch is the service's, and an ensemble that lost its data lost every zxid at once.
    /// A grant whose node was created before the raise keeps its lower fence (the store refuses
    /// it and `lock_checked` acquires again).
    async fn advance_fence(&self, key: &ResourceKey, floor: Fence) -> Result<()> {
        let inner = &self.inner;
        let wanted = epoch_above(floor)?;
        let session = inner.session().await?;
        let path = inner.epoch_path();
        let request = inner.config.request_timeout;
        // Every client reads the epoch at every grant, whatever its identity (one without
        // credentials, a rotated password): anyone may read it; with a digest identity only
        // that identity may change it.
        let acls = if inner.config.digest.is_some() { zk::Acls::new(&EPOCH_ACL) } else { zk::Acls::anyone_all() };
        let failed = |e| map(e, "advancing the epoch", true);
        let late = || timed_out("advancing the epoch", true);
        // Compare-and-set on the node's version: create it, or raise a lower value; a
        // concurrent raise to as much or more ends it too.
        for _ in 0..8 {
            match timeout(request, session.client.get_data(&path)).await.map_err(|_| late())? {
                Ok((data, stat)) => {
                    let epoch = decode_epoch(Some(&data))?;
                    if epoch >= wanted {
                        return Ok(());
                    }
                    let set = session.client.set_data(&path, &encode_epoch(wanted), Some(stat.version));
                    match timeout(request, set).await.map_err(|_| late())? {
                        Ok(_) => {
                            warn!(key = %key, floor = floor.get(), from = epoch, epoch = wanted, "zookeeper epoch raised past the store's watermark: fences start above it");
                            return Ok(());
                        }
                        Err(zk::Error::BadVersion | zk::Error::NoNode) => {}
                        Err(e) => return Err(failed(e)),
                    }
                }
                Err(zk::Error::NoNode) => {
                    let options = zk::CreateMode::Persistent.with_acls(acls);
                    let create = session.client.create(&path, &encode_epoch(wanted), &options);
                    match timeout(request, create).await.map_err(|_| late())? {
                        Ok(_) => {
                            warn!(key = %key, floor = floor.get(), from = 0, epoch = wanted, "zookeeper epoch raised past the store's watermark: fences start above it");
                            return Ok(());
                        }
                        Err(zk::Error::NodeExists) => {}
                        Err(zk::Error::NoNode) => {
                            // The root's parent is missing (an ensemble that lost its data):
                            // create it, persistent, as the epoch's home.
                            let parent = path.rsplit_once('/').map_or("/", |(p, _)| if p.is_empty() { "/" } else { p });
                            let parents = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                            match timeout(request, session.client.mkdir(parent, &parents)).await.map_err(|_| late())? {
                                Ok(()) | Err(zk::Error::NodeExists) => {}
                                Err(e) => return Err(failed(e)),
                            }
                        }
                        Err(e) => return Err(failed(e)),
                    }
                }
                Err(e) => return Err(map(e, "reading the epoch", false)),
            }
        }
        Err(Error::new(ErrorKind::Unavailable, BACKEND, "the epoch kept changing while it was raised")
            .with_retryable(true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An epoch sits above the czxid; a fence never wraps, and the epoch's data is checked.
    #[test]
    fn fences_are_the_epoch_over_the_czxid() {
        assert_eq!(fence_of(0, 0x1_0000_0007).unwrap(), Fence::new(0x1_0000_0007));
        let raised = fence_of(3, 7).unwrap();
        assert_eq!(raised, Fence::new((3 << 48) + 7));
        assert_eq!(czxid_of(raised), 7);
        for bad in [0, -1, 1 << LAYOUT.number_bits(), i64::MAX] {
            assert_eq!(fence_of(0, bad).unwrap_err().kind(), ErrorKind::Backend, "{bad}");
        }
        assert_eq!(fence_of(LAYOUT.max_epoch() + 1, 1).unwrap_err().kind(), ErrorKind::Backend);
        assert!(
            i64::try_from(fence_of(LAYOUT.max_epoch(), (1 << LAYOUT.number_bits()) - 1).unwrap().get()).is_ok(),
            "63 bits"
        );
        for floor in [0, 1, (1 << LAYOUT.number_bits()) - 1, 1 << LAYOUT.number_bits(), (9 << LAYOUT.number_bits()) + 5]
        {
            let epoch = epoch_above(Fence::new(floor)).unwrap();
            assert!(fence_of(epoch, 1).unwrap().get() > floor, "{floor}");
        }
        assert_eq!(
            epoch_above(Fence::new(LAYOUT.max_epoch() << LAYOUT.number_bits())).unwrap_err().kind(),
            ErrorKind::Unsupported
        );
        assert_eq!(decode_epoch(None).unwrap(), 0);
        assert_eq!(decode_epoch(Some(&encode_epoch(12))).unwrap(), 12);
        for bad in [&b""[..], b"12", b"-1", b"1.5", b"x", b"99999999999999999999999"] {
            assert_eq!(decode_epoch(Some(bad)).unwrap_err().kind(), ErrorKind::Backend);
        }
    }

    /// After 2³¹ changes of the parent the suffix is negative; nodes created after the wrap
    /// must still queue behind the ones created before it (else a new node sees itself first
    /// while the holder's node exists: two holders).
    #[test]
    fn queue_order_holds_across_the_sequence_wrap() {
        let names = ["lock-c--2147483000", "lock-a-2147483000", "lock-d--2147482000", "lock-b-2147483647"];
        let mut contenders: Vec<(i32, String)> =
            names.iter().map(|n| (sequence_of(n).unwrap(), n.to_string())).collect();
        queue_order(&mut contenders);
        let order: Vec<&str> = contenders.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(order, ["lock-a-2147483000", "lock-b-2147483647", "lock-c--2147483000", "lock-d--2147482000"]);
        assert_eq!(sequence_of("lock-x--2147483648"), Some(i32::MIN));
        assert!(precedes(i32::MAX, i32::MIN), "the last positive sequence comes before the first negative");
        assert!(precedes(-2_147_483_000, -5) && !precedes(-5, -2_147_483_000));
        assert!(!precedes(7, 7));
        assert_eq!(sequence_of("/palisade/locks/d/i/lock-ab12--000000001"), Some(-1));
        assert_eq!(sequence_of("lock-ab12-0000000042"), Some(42));
        assert_eq!(sequence_of("other-ab12-0000000042"), None);
    }
}
