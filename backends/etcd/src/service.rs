//! The lock service: one txn per uncontended acquire, FIFO waiting by watching the
//! predecessor, and a local expiry per grant so a silent holder's lock is given up on time.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnResponse, WatchOptions,
};
use palisade_core::spi::{GiveUp, HeldGrants};
use palisade_core::spi::{distinct_keys, timeout_error, validate_wait};
use palisade_core::{
    AllOrNone, Capabilities, Deployment, Error, ErrorKind, Fence, FenceSource, Fenced, Grant, LockService,
    MultiAcquire, OwnerToken, Replication, ResourceKey, Result, Ttl, Waiting,
};
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::errors::{map, never_sent, send_until_answered, timed_out, with_failover};
use crate::reply::{TxnReply, compose_fence, decode_epoch, encode_epoch, epoch_above, revision_of};
use crate::session::Session;
use crate::{BACKEND, EtcdConfig};

/// A lock service on etcd. Cheap to share behind an `Arc`; one session lease per instance.
///
/// Dropping it stops the keep-alive and revokes the session lease in the background (its
/// locks go at once); [`close`](EtcdLockService::close) does the same and waits for it.
pub struct EtcdLockService {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) config: EtcdConfig,
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
    held: Arc<HeldGrants>,
    stop: CancellationToken,
    /// The key that holds the service's epoch (`<prefix>epoch`), absent until a recovery.
    pub(crate) epoch_key: String,
}

/// How long a connection may stay silent before the client pings it: etcd's default
/// `--grpc-keepalive-min-time`, the most often a server accepts pings before it closes the
/// connection as abusive.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);

/// How long a ping may go unanswered before the connection is dropped and its member set
/// aside until a reconnect succeeds. A member cut off by a partition answers nothing and
/// resets nothing: until this fires, the balancer keeps sending it a share of the requests,
/// each of which waits out the request timeout. (Measured by the partition test with the
/// leader's host cut off under contention: with the request timeout, 5 s, as the ping timeout,
/// 14 writes landed in the 10 s after the cut; with 2 s, about 280.)
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Why `etcds://` could not connect, when it is the TLS settings: the client library reports
/// a client certificate the server refused (after a TLS 1.3 handshake) as a closed connection,
/// and a plaintext port as a handshake cut short. A handshake of our own
/// ([`probe_handshake`](palisade_core::spi::tls::probe_handshake)) with the same trust and
/// identity tells; without a private CA (the platform's roots) only a plaintext port is
/// checked. Blocking.
#[cfg(feature = "tls")]
fn tls_refusal_at_connect(config: &EtcdConfig) -> Option<Error> {
    use palisade_core::spi::tls::{Handshake, plaintext_port, probe_handshake};
    let question = b"GET /version HTTP/1.0\r\n\r\n";
    let http = |reply: &[u8]| reply.starts_with(b"HTTP/1.");
    let identity = config.tls_client_identity.as_ref().map(|(cert, key)| (cert.as_slice(), key.as_slice()));
    let why = config.endpoints.iter().find_map(|endpoint| {
        let seen = match &config.tls_root_cert {
            Some(roots) => probe_handshake(endpoint, roots, identity, question, &http, config.connect_timeout),
            None if plaintext_port(endpoint, question, config.connect_timeout, http) => Handshake::Plaintext,
            None => Handshake::Inconclusive,
        };
        match seen {
            Handshake::Refused(why) => Some(format!("TLS to {endpoint} was refused: {why}")),
            Handshake::Plaintext => Some(format!(
                "the server at {endpoint} does not speak TLS (it answered plain HTTP: use etcd://, or the member's \
                 https:// client URL)"
            )),
            _ => None,
        }
    })?;
    Some(
        Error::new(ErrorKind::InvalidConfig, BACKEND, format!("cannot connect to {}: {why}", config.redacted_url()))
            .with_retryable(false),
    )
}

#[cfg(not(feature = "tls"))]
fn tls_refusal_at_connect(_: &EtcdConfig) -> Option<Error> {
    None
}

impl EtcdLockService {
    /// Connects to `etcd://host:port[,host:port…]` with default settings (see [`EtcdConfig`]).
    pub async fn connect(url: &str) -> Result<Self> {
        EtcdLockService::connect_with(EtcdConfig::from_url(url)?).await
    }

    /// Connects and starts the session lease.
    pub async fn connect_with(config: EtcdConfig) -> Result<Self> {
        let service = EtcdLockService::open(config).await?;
        let inner = &service.inner;
        // Start the session now: a wrong address or credentials fail here, not at the first lock.
        inner.session().await.map_err(|e| {
            if matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::OutcomeUnknown) {
                Error::new(ErrorKind::Unavailable, BACKEND, format!("cannot reach {}", inner.config.redacted_url()))
                    .with_source(e)
                    .with_retryable(true)
            } else {
                e
            }
        })?;
        debug!(url = %inner.config.redacted_url(), "etcd lock service connected");
        Ok(service)
    }

    /// Connects to `url` for reading only, as `palisade inspect` and `palisade doctor` do:
    /// the same checks of the address, credentials and key prefix as
    /// [`connect`](Self::connect), but no session lease is granted (a cluster that refuses
    /// writes, out of space, can still be read). A lock taken through it starts the session
    /// then.
    pub async fn open_read_only(url: &str) -> Result<Self> {
        EtcdLockService::open(EtcdConfig::from_url(url)?).await
    }

    /// Connects, and reads the key prefix once; no session yet.
    async fn open(config: EtcdConfig) -> Result<Self> {
        config.validate()?;
        let scheme = if config.tls { "https" } else { "http" };
        let endpoints: Vec<String> = config.endpoints.iter().map(|e| format!("{scheme}://{e}")).collect();
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_timeout(config.request_timeout)
            .with_keep_alive(KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT.min(config.request_timeout));
        if let (Some(user), Some(password)) = (&config.user, &config.password) {
            options = options.with_user(user.clone(), password.clone());
        }
        #[cfg(feature = "tls")]
        if config.tls {
            let mut tls = etcd_client::TlsOptions::new();
            if let Some(ca) = &config.tls_root_cert {
                tls = tls.ca_certificate(etcd_client::Certificate::from_pem(ca));
            }
            if let Some((cert, key)) = &config.tls_client_identity {
                tls = tls.identity(etcd_client::Identity::from_pem(cert, key));
            }
            options = options.with_tls(tls);
        }
        let client =
            timeout(config.connect_timeout + config.request_timeout, Client::connect(&endpoints, Some(options)))
                .await
                .map_err(|_| {
                    Error::new(ErrorKind::Unavailable, BACKEND, format!("cannot connect to {}", config.redacted_url()))
                        .with_retryable(true)
                })?
                .map_err(|e| {
                    let mut err = map(e, "connect", false);
                    if err.kind() == ErrorKind::Backend {
                        err = Error::new(
                            ErrorKind::Unavailable,
                            BACKEND,
                            format!("cannot connect to {}", config.redacted_url()),
                        )
                        .with_source(err)
                        .with_retryable(true);
                    }
                    err
                })?;
        let epoch_key = format!("{}epoch", config.key_prefix);
        let inner = Arc::new(Inner {
            client,
            config,
            epoch_key,
            session: tokio::sync::Mutex::new(None),
            held: HeldGrants::new(),
            stop: CancellationToken::new(),
        });
        // Read our prefix once: etcd grants leases to anyone, so this is what finds missing
        // credentials or permissions here rather than at the first lock.
        let read = with_failover(inner.config.request_timeout, "reading the key prefix", false, true, || {
            let mut kv = inner.client.kv_client();
            let prefix = inner.config.key_prefix.clone();
            async move { kv.get(prefix, Some(GetOptions::new().with_prefix().with_count_only())).await }
        })
        .await;
        if let Err(e) = read {
            if e.kind() == ErrorKind::Unavailable && inner.config.tls {
                let config = inner.config.clone();
                if let Ok(Some(refused)) = tokio::task::spawn_blocking(move || tls_refusal_at_connect(&config)).await {
                    return Err(refused);
                }
            }
            return Err(e);
        }
        Ok(EtcdLockService { inner })
    }

    /// The settings this service was made with.
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// The underlying etcd client (for tests and tooling; Palisade's keys live under
    /// [`EtcdConfig::key_prefix`]).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Stops the keep-alive and revokes the session lease: every lock of this client is
    /// released at once (their lost signals fire).
    pub async fn close(self) -> Result<()> {
        self.inner.stop.cancel();
        let session = self.inner.session.lock().await.take();
        self.inner.held.lose_all();
        if let Some(session) = session {
            session.lost.cancel();
            let mut lease = self.inner.client.lease_client();
            timeout(self.inner.config.request_timeout, lease.revoke(session.id))
                .await
                .map_err(|_| timed_out("revoking the session lease", true))?
                .map_err(|e| map(e, "revoking the session lease", true))?;
        }
        Ok(())
    }

    /// What the service keeps: its client, configuration and key names (for `inspect`).
    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }

    /// The etcd key of one contender for `key`: `<prefix>lock:{domain:id}/<owner token>`.
    /// Every contender of a resource shares the `<prefix>lock:{domain:id}/` prefix; the
    /// closing brace keeps one resource's prefix from matching another's.
    pub fn contender_key(&self, key: &ResourceKey, token: OwnerToken) -> String {
        contender_key(self.inner.resource_prefix(key), token)
    }

    /// A grant's contender key, and whether this service holds the grant. The key is the
    /// grant's handle when this service holds a grant under that handle and fence (it made the
    /// handle from the key), and is built from the resource and token otherwise: a handle of
    /// anyone else's is never taken for a key to delete.
    fn held_key<'g>(&self, grant: &'g Grant<Fenced>) -> (Cow<'g, str>, bool) {
        let fence = grant.fence().get();
        match grant.handle() {
            Some(handle) if self.inner.held.holds(handle, fence) => (Cow::Borrowed(handle), true),
            _ => {
                let id = self.contender_key(grant.key(), grant.token());
                let held = self.inner.held.holds(&id, fence);
                (Cow::Owned(id), held)
            }
        }
    }
}

impl Drop for EtcdLockService {
    fn drop(&mut self) {
        self.inner.stop.cancel();
        let inner = Arc::clone(&self.inner);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let session = inner.session.lock().await.take();
                if let Some(session) = session {
                    session.lost.cancel();
                    let mut lease = inner.client.lease_client();
                    let _ = timeout(inner.config.request_timeout, lease.revoke(session.id)).await;
                }
            });
        }
    }
}

impl Inner {
    pub(crate) fn resource_prefix(&self, key: &ResourceKey) -> String {
        format!("{}{}/", self.config.key_prefix, key.lock_key())
    }

    /// The live session, starting a new one if there is none or the last one was lost.
    pub(crate) async fn session(&self) -> Result<Arc<Session>> {
        let mut slot = self.session.lock().await;
        if let Some(s) = slot.as_ref().filter(|s| s.alive_at(Instant::now())) {
            return Ok(Arc::clone(s));
        }
        if self.stop.is_cancelled() {
            return Err(Error::new(ErrorKind::Unavailable, BACKEND, "the lock service is closed"));
        }
        let session =
            Session::start(&self.client, self.config.session_ttl, self.config.request_timeout, self.stop.clone())
                .await?;
        *slot = Some(Arc::clone(&session));
        Ok(session)
    }

    /// One txn within the request timeout. A txn that never left this process (the member it
    /// was routed to is down) is sent again, to another member, until the timeout; so is a
    /// read-only one (`!writes`) that a silent member leaves unanswered for a second. `txn`
    /// builds each attempt's request: a clone of one built beforehand would cost every
    /// request a copy that only a resend needs.
    pub(crate) async fn txn(&self, txn: impl Fn() -> Txn, what: &str, writes: bool) -> Result<TxnResponse> {
        with_failover(self.config.request_timeout, what, writes, !writes, || {
            let mut kv = self.client.kv_client();
            let txn = txn();
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// Makes sure a key of ours goes away: a put whose outcome is unknown, a queue place left
    /// on an error, a release or expiry that could not reach the cluster. While the session
    /// lives the server keeps the key, and a forgotten one would block the queue behind it for
    /// as long as this process runs. Retries in the background until the delete lands, the
    /// session is gone (the server deleted it), or the service closes (it revokes the lease).
    /// Unconditional delete is safe: the key's name carries our owner token, nobody else
    /// ever writes it.
    fn abandon(self: &Arc<Self>, etcd_key: Vec<u8>, session_lost: CancellationToken) {
        let inner = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut backoff =
                palisade_core::spi::Backoff::with_bounds(Duration::from_millis(20), Duration::from_millis(500));
            loop {
                let Some(strong) = inner.upgrade() else { return };
                if session_lost.is_cancelled() || strong.stop.is_cancelled() {
                    return;
                }
                let mut kv = strong.client.kv_client();
                match timeout(strong.config.request_timeout, kv.delete(etcd_key.clone(), None)).await {
                    Ok(Ok(_)) => return,
                    Ok(Err(e)) => debug!(error = %e, "retrying the delete of an abandoned etcd lock key"),
                    Err(_) => debug!("retrying the delete of an abandoned etcd lock key (timeout)"),
                }
                drop(strong);
                tokio::select! {
                    () = tokio::time::sleep(backoff.next_delay()) => {}
                    () = session_lost.cancelled() => return,
                }
            }
        });
    }

    /// Deletes a contender key. A plain delete is the owner check: the key's name carries the
    /// grant's owner token, fresh for every grant, so a key of that name is this grant's or
    /// nobody's (the compare on its create revision this replaced, sent as a txn, checked
    /// nothing more).
    async fn delete_own(&self, etcd_key: &[u8]) -> Result<Deleted> {
        let answer = send_until_answered(self.config.request_timeout, "release", true, true, || {
            let mut kv = self.client.kv_client();
            let key = etcd_key.to_vec();
            async move { kv.delete(key, None).await }
        })
        .await?;
        Ok(if answer.value.deleted() > 0 {
            Deleted::Now
        } else if answer.resent {
            Deleted::GoneAfterResend
        } else {
            Deleted::WasGone
        })
    }

    /// The TTL a grant requested at `sent_at` may claim: `ttl`, capped at what the session is
    /// known to have left, so the holder's deadline never outlives the server's.
    fn cap(session: &Session, ttl: Ttl, sent_at: Instant) -> Result<Ttl> {
        let left = session.deadline().saturating_duration_since(sent_at);
        Ttl::new(ttl.get().min(left)).map_err(|_| {
            Error::new(ErrorKind::LeaseLost, BACKEND, "the etcd session has no time left; its locks are lost")
                .with_retryable(true)
        })
    }

    fn grant(
        self: &Arc<Self>,
        key: &ResourceKey,
        contender: &Contender,
        fence: Fence,
        ttl: Ttl,
        sent_at: Instant,
        session: &Arc<Session>,
    ) -> Result<Grant<Fenced>> {
        let etcd_key = contender.key.as_str();
        let granted = Inner::cap(session, ttl, sent_at)?;
        let fence_value = fence.get();
        // The handle is the contender key, so extend and release need not build it again.
        let handle: Arc<str> = Arc::from(etcd_key);
        let grant = Grant::new(key.clone(), contender.token, fence, granted, sent_at).with_handle(Arc::clone(&handle));
        // At the local deadline: delete our key (owner-checked), in the background if need be.
        let give_up: GiveUp = {
            let (inner, session_lost) = (Arc::downgrade(self), session.lost.clone());
            Box::new(move || {
                Box::pin(async move {
                    let Some(inner) = inner.upgrade() else { return };
                    if let Err(e) = inner.delete_own(handle.as_bytes()).await {
                        warn!(error = %e, "could not delete an expired lock key; retrying in the background");
                        inner.abandon(handle.as_bytes().to_vec(), session_lost);
                    }
                })
            })
        };
        // The grant's own lost token is the one that fires: the lease watchdog listens to it.
        self.held.hold(
            etcd_key.to_owned(),
            fence_value,
            sent_at + granted.get(),
            grant.lost_token().clone(),
            session.lost.clone(),
            give_up,
        );
        Ok(grant)
    }
}

/// One contender for a resource: a fresh owner token and its etcd key,
/// `<prefix>lock:{domain:id}/<token>`, whose value is the token.
struct Contender {
    token: OwnerToken,
    key: String,
    /// Where the resource's prefix ends in `key`.
    split: usize,
}

impl Contender {
    fn new(inner: &Inner, resource: &ResourceKey) -> Result<Contender> {
        let token = OwnerToken::generate()?;
        let key = inner.resource_prefix(resource);
        let split = key.len();
        Ok(Contender { token, key: contender_key(key, token), split })
    }

    /// Every contender's key for the resource starts with this.
    fn prefix(&self) -> &str {
        &self.key[..self.split]
    }

    /// The key's value: the token, the key's last part.
    fn value(&self) -> &str {
        &self.key[self.split..]
    }
}

/// A contender's key: the resource's prefix, then the token.
fn contender_key(mut prefix: String, token: OwnerToken) -> String {
    use std::fmt::Write;
    // Writing to a String cannot fail.
    let _ = write!(prefix, "{token}");
    prefix
}

/// What a delete of our own key found.
enum Deleted {
    /// It deleted the key.
    Now,
    /// The key was gone, and an earlier attempt of the same delete may have deleted it.
    GoneAfterResend,
    /// The key was gone before the delete.
    WasGone,
}

/// Deletes a waiter's key if the wait ends without the lock (timeout, error, or the acquire
/// future dropped), so an abandoned place in the queue never blocks those behind it.
struct QueuePlace {
    inner: Arc<Inner>,
    etcd_key: Vec<u8>,
    session_lost: CancellationToken,
    armed: bool,
}

impl QueuePlace {
    /// Our key `etcd_key`, which may exist from now on, deleted unless disarmed.
    fn armed(inner: &Arc<Inner>, etcd_key: &str, session: &Session) -> QueuePlace {
        QueuePlace {
            inner: Arc::clone(inner),
            etcd_key: etcd_key.as_bytes().to_vec(),
            session_lost: session.lost.clone(),
            armed: true,
        }
    }

    async fn leave(mut self) {
        self.armed = false;
        let mut kv = self.inner.client.kv_client();
        match timeout(self.inner.config.request_timeout, kv.delete(self.etcd_key.clone(), None)).await {
            Ok(Ok(_)) => {}
            _ => {
                warn!("could not leave the etcd lock queue; retrying in the background");
                self.inner.abandon(std::mem::take(&mut self.etcd_key), self.session_lost.clone());
            }
        }
    }
}

impl Drop for QueuePlace {
    fn drop(&mut self) {
        if self.armed && tokio::runtime::Handle::try_current().is_ok() {
            self.inner.abandon(std::mem::take(&mut self.etcd_key), self.session_lost.clone());
        }
    }
}

#[async_trait]
impl LockService for EtcdLockService {
    type Fencing = Fenced;

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fence_source: FenceSource::Revision,
            fences_survive_release: true,
            fences_survive_restart: true,
            gap_free: false,
            waiting: Waiting::NativeFifo,
            // A stopped holder's key lives on its session lease until the lease expires.
            expiry_delay: self.inner.config.session_ttl,
            deployment: Deployment::Network,
            // Raft: a grant is a key committed by a quorum of the cluster.
            replication: Replication::LeaderQuorum,
            multi_acquire: MultiAcquire::OneRequest,
        }
    }

    /// One txn: if nobody holds or waits for `key`, create this contender's key on the
    /// session lease; its create revision is the fence.
    async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Fenced>>> {
        self.attempt(key, ttl).await.map(|(grant, _)| grant)
    }

    /// One txn: if nobody holds or waits for any of the keys, create a contender key for each
    /// on the session lease (their create revision, the txn's, is every member's fence);
    /// otherwise read which one is taken.
    async fn try_acquire_all(&self, keys: &[ResourceKey], ttl: Ttl) -> Result<AllOrNone<Grant<Fenced>>> {
        distinct_keys(BACKEND, keys)?;
        self.attempt_all(keys, ttl).await
    }

    /// Rounds of `try_acquire` over the keys; between rounds, one watch over the range of
    /// their prefixes, from the revision of the round's first txn, wakes the waiter at the
    /// first delete in it (a release, an expiry, a waiter leaving), so nothing deleted since
    /// the round looked is missed. No queue entry is made: these waiters are not in the keys'
    /// FIFO order. Dropped mid-round, the txn in flight leaves nothing behind (its key, if the
    /// put landed, is deleted in the background).
    async fn acquire_any(&self, keys: &[ResourceKey], ttl: Ttl, wait: Duration) -> Result<Grant<Fenced>> {
        let first = palisade_core::spi::first_of(BACKEND, keys)?;
        validate_wait(wait)?;
        let give_up = Instant::now() + wait;
        let prefixes: Vec<String> = keys.iter().map(|k| self.inner.resource_prefix(k)).collect();
        let (Some(low), Some(high)) = (prefixes.iter().min(), prefixes.iter().max()) else {
            return Err(timeout_error(BACKEND, first, wait));
        };
        let range_end = prefix_end(high.as_bytes());
        let timed_out = || palisade_core::spi::timeout_of_any(timeout_error(BACKEND, first, wait), BACKEND, keys, wait);
        loop {
            let mut watch_from: Option<i64> = None;
            for key in keys {
                let (grant, next) = self.attempt(key, ttl).await?;
                if let Some(grant) = grant {
                    return Ok(grant);
                }
                watch_from.get_or_insert(next);
            }
            let Some(from) = watch_from.filter(|_| Instant::now() < give_up) else { return Err(timed_out()) };
            let session = self.inner.session().await?;
            let range = (low.as_bytes().to_vec(), Some(range_end.clone()));
            if !self.wait_for_delete(range, from, give_up, &session).await? {
                return Err(timed_out());
            }
        }
    }

    /// Joins the resource's queue (one txn that also says who is first), then watches the
    /// contender just ahead until it is gone: FIFO, push-based, no polling. Before declaring
    /// the lock held it re-reads its own key in the same txn that finds no predecessor, so a
    /// session that expired while waiting is never mistaken for ownership.
    async fn acquire(&self, key: &ResourceKey, ttl: Ttl, wait: Duration) -> Result<Grant<Fenced>> {
        validate_wait(wait)?;
        if wait.is_zero() {
            // One attempt: no queue node to create and remove.
            return self.try_acquire(key, ttl).await?.ok_or_else(|| timeout_error(BACKEND, key, wait));
        }
        let give_up = Instant::now() + wait;
        let inner = &self.inner;
        let session = inner.session().await?;
        let contender = Contender::new(inner, key)?;
        let (etcd_key, prefix, value) = (contender.key.as_str(), contender.prefix(), contender.value());
        let mut sent_at = Instant::now();
        let first = GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Ascend).with_limit(1);
        let txn = || {
            Txn::new().and_then([
                TxnOp::put(etcd_key, value, Some(PutOptions::new().with_lease(session.id))),
                TxnOp::get(prefix, Some(first.clone())),
                // The epoch as of our key's creation: fences grow in the queue's order.
                TxnOp::get(inner.epoch_key.as_str(), None),
            ])
        };
        // From here on our key may exist: every way out without the lock must remove it.
        let mut place = QueuePlace::armed(inner, etcd_key, &session);
        let resp = inner.txn(txn, "acquire", true).await?;
        let reply = TxnReply::of(&resp);
        let revision = reply.revision()?;
        let head_is_us = reply.first_found_is(0, etcd_key.as_bytes());
        // The epoch read with the last look at the queue: a raise while we waited counts.
        let mut epoch_read = reply.values.get(1).cloned();
        // Until nobody is ahead: who is just ahead of us, and are we still queued?
        if !head_is_us {
            loop {
                // Who is just ahead of us, and are we still queued (is our session alive)?
                sent_at = Instant::now();
                let ahead = GetOptions::new()
                    .with_prefix()
                    .with_max_create_revision(revision - 1)
                    .with_sort(SortTarget::Create, SortOrder::Descend)
                    .with_limit(1);
                let txn = || {
                    Txn::new().and_then([
                        TxnOp::get(etcd_key, None),
                        TxnOp::get(prefix, Some(ahead.clone())),
                        TxnOp::get(inner.epoch_key.as_str(), None),
                    ])
                };
                let resp = match inner.txn(txn, "acquire (queue check)", false).await {
                    Ok(r) => r,
                    Err(e) => {
                        place.leave().await;
                        return Err(e);
                    }
                };
                let reply = TxnReply::of(&resp);
                let still_queued = reply.first_found(0).is_some();
                if !still_queued || session.lost.is_cancelled() {
                    place.armed = false; // the key is gone with the session already
                    return Err(Error::new(ErrorKind::LeaseLost, BACKEND, "the etcd session expired while waiting")
                        .with_retryable(true));
                }
                let Some(predecessor) = reply.first_found(1).map(<[u8]>::to_vec) else {
                    epoch_read = reply.values.get(2).cloned();
                    break; // nobody ahead: ours
                };
                let watch_from = reply.next_revision()?;
                let waited = self.wait_for_delete((predecessor, None), watch_from, give_up, &session).await;
                match waited {
                    Ok(true) => {}
                    Ok(false) => {
                        place.leave().await;
                        return Err(timeout_error(BACKEND, key, wait));
                    }
                    Err(e) => {
                        place.leave().await;
                        return Err(e);
                    }
                }
            }
        }
        // Our key's create revision under the epoch as of the grant (`advance_fence`: no grant
        // after a raise is below it, also one that was queued before it).
        let fence = epoch_read
            .ok_or_else(|| Error::new(ErrorKind::Backend, BACKEND, "etcd answered without the read of the epoch"))
            .and_then(|read| decode_epoch(read.as_deref()))
            .and_then(|epoch| compose_fence(epoch, revision));
        let granted = fence.and_then(|fence| inner.grant(key, &contender, fence, ttl, sent_at, &session));
        // Still armed if the grant failed (the session's local deadline passed meanwhile): the
        // place's drop deletes our key instead of leaving it on a lease that may yet renew.
        place.armed = granted.is_err();
        drop(place);
        granted
    }

    /// Checks ownership in one txn (our key, created at the fence, still exists) and moves
    /// the local deadline; the session's keep-alive is what keeps the key on the server.
    async fn extend(&self, grant: &Grant<Fenced>, ttl: Ttl) -> Result<Ttl> {
        let inner = &self.inner;
        let fence_value = grant.fence().get();
        let revision = revision_of(grant.fence());
        let not_holder =
            || Error::new(ErrorKind::NotHolder, BACKEND, format!("{} is not held by this grant", grant.key()));
        let (id, held) = self.held_key(grant);
        if !held {
            return Err(not_holder());
        }
        let session = inner.session.lock().await.clone();
        let Some(session) = session else { return Err(not_holder()) };
        let sent_at = Instant::now();
        let txn = || Txn::new().when([Compare::create_revision(id.as_bytes(), CompareOp::Equal, revision)]);
        if !inner.txn(txn, "extend", false).await?.succeeded() {
            if inner.held.forget(&id, fence_value) {
                warn!(key = %grant.key(), "etcd lock key vanished (session expired?); the grant is lost");
            }
            return Err(not_holder());
        }
        let granted = Inner::cap(&session, ttl, sent_at)?;
        if inner.held.extend(&id, fence_value, sent_at + granted.get()) { Ok(granted) } else { Err(not_holder()) }
    }

    /// Deletes our key if it is still the one created at the grant's fence.
    async fn release(&self, grant: &Grant<Fenced>) -> Result<()> {
        let inner = &self.inner;
        let (id, held) = self.held_key(grant);
        inner.held.forget(&id, grant.fence().get());
        let deleted = match inner.delete_own(id.as_bytes()).await {
            Ok(deleted) => deleted,
            Err(e) => {
                // Not held by us any more either way; make sure the key goes.
                if let Some(session) = inner.session.lock().await.clone() {
                    inner.abandon(id.as_bytes().to_vec(), session.lost.clone());
                }
                return Err(e);
            }
        };
        match deleted {
            Deleted::Now => Ok(()),
            // `LockService::release`: a resend that finds the lock freed by the first send
            // reports success. The key was ours and live when the release began (its local
            // deadline, never later than the server's, had not passed), and from then on
            // only this release deletes it (or the session's expiry, later still): the grant
            // held the lock until this release let it go.
            Deleted::GoneAfterResend if held => Ok(()),
            Deleted::GoneAfterResend | Deleted::WasGone => {
                Err(Error::new(ErrorKind::NotHolder, BACKEND, format!("{} was not held by this grant", grant.key())))
            }
        }
    }

    /// Raises the service's epoch (`<prefix>epoch`) to the first one whose fences are all above
    /// `floor` (fences are `epoch × 2⁴⁴ + revision`); never lowers it. Every key's
    /// fences move with it: the epoch is the service's, and a cluster that lost its data lost
    /// every key's revisions at once. A grant whose key was created before the raise keeps its
    /// lower fence (the store refuses it and `lock_checked` acquires again).
    async fn advance_fence(&self, key: &ResourceKey, floor: Fence) -> Result<()> {
        let inner = &self.inner;
        let wanted = epoch_above(floor)?;
        let epoch_key = inner.epoch_key.as_str();
        // A compare-and-set loop: create the key, or raise a lower value; a concurrent raise
        // to as much or more ends it too. etcd compares values byte by byte: the fixed-width
        // text orders as the number.
        for _ in 0..8 {
            let create = || {
                Txn::new()
                    .when([Compare::create_revision(epoch_key, CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(epoch_key, encode_epoch(wanted), None)])
                    .or_else([TxnOp::get(epoch_key, None)])
            };
            let created = inner.txn(create, "advance the epoch", true).await?;
            let reply = TxnReply::of(&created);
            let now = if reply.succeeded { None } else { reply.values.first().cloned().flatten() };
            if reply.succeeded || decode_epoch(now.as_deref())? >= wanted {
                break;
            }
            let raise = || {
                Txn::new()
                    .when([Compare::value(epoch_key, CompareOp::Less, encode_epoch(wanted))])
                    .and_then([TxnOp::put(epoch_key, encode_epoch(wanted), None)])
                    .or_else([TxnOp::get(epoch_key, None)])
            };
            let raised = TxnReply::of(&inner.txn(raise, "advance the epoch", true).await?);
            let now = if raised.succeeded { None } else { raised.values.first().cloned().flatten() };
            if raised.succeeded || (now.is_some() && decode_epoch(now.as_deref())? >= wanted) {
                break;
            }
            // The key was deleted between the two txns: create it again.
        }
        let epoch = TxnReply::of(
            &inner.txn(|| Txn::new().and_then([TxnOp::get(epoch_key, None)]), "read the epoch", false).await?,
        );
        let epoch = decode_epoch(epoch.values.first().cloned().flatten().as_deref())?;
        if epoch < wanted {
            return Err(Error::new(
                ErrorKind::Unavailable,
                BACKEND,
                format!("the epoch stayed at {epoch} below {wanted}: its key is being deleted as it is raised"),
            )
            .with_retryable(true));
        }
        warn!(key = %key, floor = floor.get(), epoch, "etcd epoch at or past the one above the store's watermark: fences start above it");
        Ok(())
    }
}

impl EtcdLockService {
    /// [`try_acquire`](LockService::try_acquire), and the revision to watch from for what
    /// happens after its txn.
    async fn attempt(&self, key: &ResourceKey, ttl: Ttl) -> Result<(Option<Grant<Fenced>>, i64)> {
        let inner = &self.inner;
        let session = inner.session().await?;
        let contender = Contender::new(inner, key)?;
        let etcd_key = contender.key.as_str();
        let sent_at = Instant::now();
        let txn = || {
            Txn::new().when([Compare::create_revision(contender.prefix(), CompareOp::Equal, 0).with_prefix()]).and_then(
                [
                    TxnOp::put(etcd_key, contender.value(), Some(PutOptions::new().with_lease(session.id))),
                    TxnOp::get(inner.epoch_key.as_str(), None),
                ],
            )
        };
        // Until the answer is in, the put may have landed: a ghost holder on the session lease
        // would block the key for as long as the process lives. An error, a grant that cannot
        // be tracked, or the call dropped mid-txn (a waiting `acquire_any` given up by its
        // caller) deletes it.
        let mut place = QueuePlace::armed(inner, etcd_key, &session);
        let resp = inner.txn(txn, "acquire", true).await?;
        let reply = TxnReply::of(&resp);
        let next = reply.next_revision()?;
        if !reply.succeeded {
            place.armed = false;
            return Ok((None, next));
        }
        // An error here (the session's local deadline passed during the txn: no deadline
        // tracks our key) leaves the place armed, and its drop deletes the key.
        let grant = reply.fence(0).and_then(|fence| inner.grant(key, &contender, fence, ttl, sent_at, &session))?;
        place.armed = false;
        Ok((Some(grant), next))
    }

    /// [`try_acquire_all`](LockService::try_acquire_all): one txn over every key, its puts
    /// deleted in the background whenever its outcome is not a set of tracked grants.
    async fn attempt_all(&self, keys: &[ResourceKey], ttl: Ttl) -> Result<AllOrNone<Grant<Fenced>>> {
        let inner = &self.inner;
        let session = inner.session().await?;
        let contenders = keys.iter().map(|key| Contender::new(inner, key)).collect::<Result<Vec<_>>>()?;
        let sent_at = Instant::now();
        let txn = || {
            let free = contenders
                .iter()
                .map(|c| Compare::create_revision(c.prefix(), CompareOp::Equal, 0).with_prefix())
                .collect::<Vec<_>>();
            let mut take = contenders
                .iter()
                .map(|c| TxnOp::put(c.key.as_str(), c.value(), Some(PutOptions::new().with_lease(session.id))))
                .collect::<Vec<_>>();
            take.push(TxnOp::get(inner.epoch_key.as_str(), None));
            let taken = contenders
                .iter()
                .map(|c| TxnOp::get(c.prefix(), Some(GetOptions::new().with_prefix().with_keys_only().with_limit(1))))
                .collect::<Vec<_>>();
            Txn::new().when(free).and_then(take).or_else(taken)
        };
        // As in `attempt`: until the answer is in, any of the puts may have landed.
        let mut places =
            contenders.iter().map(|c| QueuePlace::armed(inner, c.key.as_str(), &session)).collect::<Vec<_>>();
        let resp = inner.txn(txn, "acquire a set", true).await?;
        let reply = TxnReply::of(&resp);
        if !reply.succeeded {
            for place in &mut places {
                place.armed = false;
            }
            // A key deleted between the compare and the read leaves no sign: say the first.
            let held = (0..keys.len()).find(|&i| reply.first_found(i).is_some()).unwrap_or(0);
            return Ok(AllOrNone::Held(held));
        }
        let fence = reply.fence(0)?;
        let mut grants = Vec::with_capacity(keys.len());
        for (key, contender) in keys.iter().zip(&contenders) {
            // An error (the session's local deadline passed during the txn) leaves every place
            // armed: their drops delete the keys, and the grants made so far stop tracking.
            grants.push(inner.grant(key, contender, fence, ttl, sent_at, &session)?);
        }
        for place in &mut places {
            place.armed = false;
        }
        Ok(AllOrNone::Granted(grants))
    }

    /// Waits until `key` is deleted (true), or `give_up` passes (false); with a range end, until
    /// any key in `[key, end)` is. Watches from `from_revision`, so a deletion between our read
    /// and the watch is not missed.
    async fn wait_for_delete(
        &self,
        (key, range_end): (Vec<u8>, Option<Vec<u8>>),
        from_revision: i64,
        give_up: Instant,
        session: &Arc<Session>,
    ) -> Result<bool> {
        let mut backoff =
            palisade_core::spi::Backoff::with_bounds(Duration::from_millis(5), Duration::from_millis(100));
        let mut stream = loop {
            let mut watcher = self.inner.client.watch_client();
            let mut options = WatchOptions::new().with_start_revision(from_revision);
            if let Some(end) = &range_end {
                options = options.with_range(end.clone());
            }
            let opened = timeout(self.inner.config.request_timeout, watcher.watch(key.clone(), Some(options)));
            let opened = tokio::select! {
                () = sleep_until(give_up) => return Ok(false),
                opened = opened => opened.map_err(|_| timed_out("watch", false))?,
            };
            match opened {
                Ok(stream) => break stream,
                // Routed to a member that is down: try again (another member), within the wait.
                Err(e) if never_sent(&e) => tokio::select! {
                    () = sleep_until(give_up) => return Ok(false),
                    () = tokio::time::sleep(backoff.next_delay()) => {}
                },
                Err(e) => return Err(map(e, "watch", false)),
            }
        };
        loop {
            tokio::select! {
                () = sleep_until(give_up) => return Ok(false),
                () = session.lost.cancelled() => {
                    return Err(Error::new(ErrorKind::LeaseLost, BACKEND, "the etcd session expired while waiting")
                        .with_retryable(true));
                }
                message = stream.message() => match message.map_err(|e| map(e, "watch", false))? {
                    Some(resp) => {
                        if resp.events().iter().any(|e| e.event_type() == EventType::Delete) || resp.canceled() {
                            // A cancelled watch (compaction, member loss): re-check from scratch.
                            return Ok(true);
                        }
                    }
                    None => return Ok(true), // stream ended: re-check from scratch
                },
            }
        }
    }
}

/// The end of the range of keys that start with `prefix` (etcd's prefix range end): the prefix
/// with its last byte below 0xff raised by one and what follows it dropped.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff: every key after it.
    vec![0]
}
