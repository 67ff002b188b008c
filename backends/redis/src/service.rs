//! The Redis lock service.

use std::fmt;
use std::future::Future;
use std::sync::{Mutex, PoisonError, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use palisade_core::spi::{
    AttemptOutcome, distinct_keys, first_granted, first_of, timeout_of_any, try_acquire_each, validate_wait,
    wait_for_any_release, wait_for_release,
};
use palisade_core::{
    AllOrNone, Capabilities, Error, ErrorKind, Fence, FenceSource, Fenced, Grant, LockService, MultiAcquire,
    OwnerToken, ResourceKey, Result, Ttl, Waiting,
};
use redis::Value;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::config::RedisConfig;
use crate::connection::{AddressMap, ClusterTarget, Conn};
use crate::errors::map;
use crate::scripts::{
    ACQUIRE, ACQUIRE_ALL, ADVANCE_FENCE, AcquireAllReply, AcquireReply, EXTEND, RELEASE, RELEASE_MARKED, decode_done,
};
use crate::sentinel::SentinelTarget;
use crate::waiters::{Patience, Source, Waiters};

pub(crate) const BACKEND: &str = "redis";

/// The longest a waiter sleeps between attempts when no release notification arrives.
const MAX_WAIT_STEP: Duration = Duration::from_millis(250);
/// How long a waiter waits for the release subscription to go live before it waits anyway
/// (and polls every `MAX_WAIT_STEP`). Only while the first subscription on a server expected
/// to answer is being made: never for a subscription that is down (see `Waiters::ready`).
const SUBSCRIBE_WAIT: Duration = Duration::from_secs(1);

/// A lock service on one Redis server, on the master a group of Sentinels names
/// (`redis+sentinel://`, followed across failovers), or on a Redis Cluster (`redis+cluster://`).
///
/// One instance is one client: a multiplexed connection that reconnects, plus a pub/sub
/// connection for release notifications opened on first wait. Share it behind an `Arc`.
pub struct RedisLockService {
    config: RedisConfig,
    /// The connection to the server, or to the master the Sentinels name (replaced when a
    /// failover moves it).
    conn: RwLock<Conn>,
    waiters: Waiters,
    /// Behind Sentinel: whom to ask for the master, the master's address now, and one asking
    /// at a time.
    sentinel: Option<Following>,
}

struct Following {
    target: SentinelTarget,
    master: Mutex<String>,
    asking: tokio::sync::Mutex<()>,
}

impl RedisLockService {
    /// Connects with default timeouts (see [`RedisConfig`]).
    pub async fn connect(url: &str) -> Result<Self> {
        RedisLockService::connect_with(RedisConfig::new(url)).await
    }

    /// Connects, then checks that the server's eviction policy cannot evict fence keys.
    pub async fn connect_with(config: RedisConfig) -> Result<Self> {
        config.check_scheme()?;
        #[cfg(feature = "tls")]
        palisade_core::spi::tls::install_default_provider();
        let mut config = config;
        let (conn, source, sentinel) = if config.url.starts_with("redis+sentinel://") {
            let mut target = SentinelTarget::parse(&config.url)?;
            target.address_map = AddressMap::parse(&config.address_map)?;
            if config.replica_acks.is_none() {
                config.replica_acks = target.replica_acks;
            }
            let (url, master) = target.master_url(config.connect_timeout).await?;
            let client = redis::Client::open(url.as_str()).map_err(|e| {
                Error::new(
                    ErrorKind::InvalidConfig,
                    BACKEND,
                    format!("the master {master} named by {}", target.redacted),
                )
                .with_source(e)
            })?;
            let conn = Conn::Server(manage(&client, &config).await?);
            let source = Source::Sentinel(target.clone());
            let following = Following { target, master: Mutex::new(master), asking: tokio::sync::Mutex::new(()) };
            (conn, source, Some(following))
        } else if config.url.starts_with("redis+cluster://") {
            let mut target = ClusterTarget::parse(&config.url)?;
            target.address_map = AddressMap::parse(&config.address_map)?;
            (Conn::Cluster(target.connect(&config).await?), Source::Cluster(target.notification_clients()?), None)
        } else {
            let client = open_client(&config).map_err(|e| {
                Error::new(ErrorKind::InvalidConfig, BACKEND, format!("bad Redis URL {}", config.redacted_url()))
                    .with_source(e)
            })?;
            (Conn::Server(manage(&client, &config).await?), Source::Server(client), None)
        };
        let patience = Patience { connect: config.connect_timeout, ping: config.response_timeout };
        let waiters = Waiters::new(source, patience);
        let service = RedisLockService { waiters, conn: RwLock::new(conn), config, sentinel };
        service.check_eviction_policy().await?;
        debug!(url = %service.config.redacted_url(), "redis lock service connected");
        Ok(service)
    }

    /// Whom this service asks for the master, behind Sentinel.
    pub(crate) fn sentinel_target(&self) -> Option<&SentinelTarget> {
        self.sentinel.as_ref().map(|f| &f.target)
    }

    /// "Eviction policies must never evict lock or fence keys." Only `noeviction` guarantees it:
    /// `allkeys-*` can evict fence keys, and every `volatile-*` policy can evict a held lock's
    /// key (it carries a PX expiry; `volatile-ttl` even prefers it), after which a second client
    /// is granted the lock while the first is inside its TTL.
    async fn check_eviction_policy(&self) -> Result<()> {
        let mut conn = self.conn();
        let reply: redis::RedisResult<Vec<String>> =
            redis::cmd("CONFIG").arg("GET").arg("maxmemory-policy").query_async(&mut conn).await;
        let policy = match reply {
            Ok(pair) if pair.len() == 2 => pair[1].clone(),
            Ok(_) | Err(_) => {
                warn!(url = %self.config.redacted_url(), "cannot read maxmemory-policy (CONFIG disabled?); make sure it never evicts keys without a TTL");
                return Ok(());
            }
        };
        if policy == "noeviction" || self.config.allow_eviction {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::InvalidConfig,
            BACKEND,
            format!(
                "maxmemory-policy is {policy}, which can evict held locks (volatile-*) or fence keys (allkeys-*); \
                 use noeviction, or set RedisConfig::allow_eviction if this Redis never fills up"
            ),
        ))
    }

    /// Runs a script (`send` sends it on the connection it is given), sending it again while
    /// its outcome is unknown (a reply lost with its connection, a connection cut before the
    /// request went out) for up to the response timeout from the first failure. Safe because
    /// every script is idempotent for its owner token: a resent acquire gets its own grant
    /// back, a resent extend extends again, a resent release finds the lock gone. Returns the
    /// reply and whether an earlier send's outcome was unknown.
    async fn invoke<T, F, Sent>(&self, send: F, what: &str) -> Result<(T, bool)>
    where
        F: Fn(Conn) -> Sent,
        Sent: Future<Output = redis::RedisResult<T>>,
    {
        // The clock is read only once something failed: the happy path stays one round trip.
        let mut give_up = None;
        let mut pause = Duration::from_millis(5);
        let mut unknown = false;
        loop {
            match send(self.conn()).await {
                Ok(reply) => return Ok((reply, unknown)),
                Err(e) => {
                    let e = map(e, what);
                    let resend = matches!(e.kind(), ErrorKind::OutcomeUnknown | ErrorKind::Unavailable);
                    let now = Instant::now();
                    let give_up = *give_up.get_or_insert(now + self.config.response_timeout);
                    if !resend || now + pause >= give_up {
                        return Err(e);
                    }
                    unknown |= e.kind() == ErrorKind::OutcomeUnknown;
                    debug!(error = %e, "resending a redis script whose outcome is unknown");
                    tokio::time::sleep(pause).await;
                    self.follow_master().await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
            }
        }
    }

    /// [`invoke`](Self::invoke) for a prepared script.
    pub(crate) async fn invoke_script(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
        what: &str,
    ) -> Result<(Value, bool)> {
        self.invoke(|mut conn| async move { invocation.invoke_async(&mut conn).await }, what).await
    }

    /// How long a cluster release's marker lives: past the last resend of its call. The cluster
    /// client resends a request for up to the response timeout, and `invoke` sends it again
    /// for up to another, each send after a connect: twice the response timeout, a connect
    /// timeout and a second (12 s with the defaults).
    fn release_marker_lifetime(&self) -> Duration {
        self.config.response_timeout * 2 + self.config.connect_timeout + Duration::from_secs(1)
    }

    /// The settings this service was made with.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// The connection in use (a cheap handle on the multiplexed connection).
    pub(crate) fn conn(&self) -> Conn {
        self.conn.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Behind Sentinel, after a command failed: asks the Sentinels for the master and moves to
    /// it if it changed (a failover). Nothing otherwise: the connection reconnects by itself.
    async fn follow_master(&self) {
        let Some(following) = &self.sentinel else { return };
        let _one_at_a_time = following.asking.lock().await;
        let (url, master) = match following.target.master_url(self.config.connect_timeout).await {
            Ok(found) => found,
            Err(e) => return debug!(error = %e, "no master named yet"),
        };
        if *following.master.lock().unwrap_or_else(PoisonError::into_inner) == master {
            return;
        }
        let connected = match redis::Client::open(url.as_str()) {
            Ok(client) => client.get_connection_manager_with_config(manager_config(&self.config)).await,
            Err(e) => Err(e),
        };
        match connected {
            Ok(conn) => {
                *self.conn.write().unwrap_or_else(PoisonError::into_inner) = Conn::Server(conn);
                let mut current = following.master.lock().unwrap_or_else(PoisonError::into_inner);
                warn!(from = %current, to = %master, name = %following.target.master_name, "followed a failover to a new master");
                *current = master;
                drop(current);
                self.waiters.moved();
            }
            Err(e) => debug!(master = %master, error = %e, "the new master does not answer yet"),
        }
    }

    /// An acquire script in a pipeline, with `WAIT` right behind it where
    /// [`RedisConfig::replica_acks`] asks for acknowledgements ([`acquire_then_wait`] sends it).
    fn with_replica_acks(&self, script: redis::Cmd) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        pipe.add_command(script);
        if let Some(acks) = self.config.replica_acks {
            let millis = u64::try_from(acks.timeout.as_millis()).unwrap_or(u64::MAX).max(1);
            pipe.cmd("WAIT").arg(acks.replicas).arg(millis);
        }
        pipe.ignore_errors();
        pipe
    }

    /// With [`RedisConfig::replica_acks`]: whether the replicas acknowledged `grant`, from the
    /// reply of the `WAIT` sent right behind its script; when too few did, releases it and fails.
    async fn acknowledged(
        &self,
        grant: Grant<Fenced>,
        waited: Option<redis::RedisResult<Value>>,
    ) -> Result<Grant<Fenced>> {
        match self.replicas_acknowledged(waited, &grant) {
            Ok(()) => Ok(grant),
            Err(e) => {
                let _ = self.release(&grant).await;
                Err(e)
            }
        }
    }

    /// Whether the `WAIT` sent right behind a grant's script (`waited`) counted enough replicas
    /// ([`RedisConfig::replica_acks`]); the error says why not, naming `grant`. The caller
    /// releases what the script granted.
    fn replicas_acknowledged(&self, waited: Option<redis::RedisResult<Value>>, grant: &Grant<Fenced>) -> Result<()> {
        let (Some(acks), Some(waited)) = (self.config.replica_acks, waited) else { return Ok(()) };
        let acked = match waited {
            Ok(Value::Int(n)) => n,
            Ok(other) => {
                return Err(Error::new(ErrorKind::Backend, BACKEND, format!("unexpected WAIT reply: {other:?}")));
            }
            Err(e) => return Err(map(e, "wait for replicas")),
        };
        if acked >= i64::from(acks.replicas) {
            return Ok(());
        }
        warn!(key = %grant.key(), acked, wanted = acks.replicas, "a grant was not acknowledged by enough replicas: released");
        Err(Error::new(
            ErrorKind::Unavailable,
            BACKEND,
            format!(
                "the grant of {} reached {acked} of {} replicas within {:?}, so a failover could hand its fence out again: released it",
                grant.key(),
                acks.replicas,
                acks.timeout
            ),
        )
        .with_retryable(true))
    }

    /// One acquire script. `waiting`: the caller will wait if the lock is held, so the script
    /// marks a held lock for its release to publish (`scripts::WAITED_ON`).
    async fn attempt(&self, key: &ResourceKey, ttl: Ttl, waiting: bool) -> Result<AttemptOutcome<Grant<Fenced>>> {
        let token = OwnerToken::generate()?;
        let requested_at = Instant::now();
        let mut script = redis::cmd("EVALSHA");
        script.arg(ACQUIRE.get_hash()).arg(2).arg(key.lock_key()).arg(key.fence_key());
        script.arg(&token.to_hex()[..]).arg(server_ttl(ttl));
        if waiting {
            script.arg("wait");
        }
        let pipe = &self.with_replica_acks(script);
        let ((reply, waited), _) = self.invoke(move |conn| acquire_then_wait(conn, pipe, &ACQUIRE), "acquire").await?;
        match AcquireReply::decode(&reply, &key.fence_key())? {
            AcquireReply::Granted(fence) => {
                let grant = Grant::new(key.clone(), token, fence, ttl, requested_at);
                Ok(AttemptOutcome::Granted(self.acknowledged(grant, waited).await?))
            }
            AcquireReply::Held { remaining } => Ok(AttemptOutcome::Held { remaining }),
        }
    }
}

impl RedisLockService {
    /// [`ACQUIRE_ALL`] for `keys`, with `WAIT` behind it as [`attempt`](Self::attempt) sends it.
    async fn attempt_all(&self, keys: &[ResourceKey], ttl: Ttl) -> Result<AllOrNone<Grant<Fenced>>> {
        let tokens = keys.iter().map(|_| OwnerToken::generate()).collect::<Result<Vec<_>>>()?;
        let requested_at = Instant::now();
        let mut script = redis::cmd("EVALSHA");
        script.arg(ACQUIRE_ALL.get_hash()).arg(keys.len() * 2);
        for key in keys {
            script.arg(key.lock_key());
        }
        for key in keys {
            script.arg(key.fence_key());
        }
        script.arg(ttl.as_millis_ceil());
        for token in &tokens {
            script.arg(&token.to_hex()[..]);
        }
        let pipe = &self.with_replica_acks(script);
        let ((reply, waited), _) =
            self.invoke(move |conn| acquire_then_wait(conn, pipe, &ACQUIRE_ALL), "acquire a set").await?;
        let fences = match AcquireAllReply::decode(&reply, keys.len())? {
            AcquireAllReply::Held(i) => return Ok(AllOrNone::Held(i)),
            AcquireAllReply::Granted(fences) => fences,
        };
        let grants: Vec<Grant<Fenced>> = keys
            .iter()
            .zip(tokens)
            .zip(fences)
            .map(|((key, token), fence)| Grant::new(key.clone(), token, fence, ttl, requested_at))
            .collect();
        if let Err(e) = self.replicas_acknowledged(waited, &grants[0]) {
            for grant in &grants {
                let _ = self.release(grant).await;
            }
            return Err(e);
        }
        Ok(AllOrNone::Granted(grants))
    }
}

/// Sends `pipe`: the acquire script and, with replica acks, `WAIT` right behind it, in one
/// round trip on one connection. `WAIT` counts the replicas that acknowledged what *its*
/// connection wrote: sent on its own after the script's reply, on the service's connection
/// of that moment, it measured another master whenever another task had followed a failover
/// in between, and acknowledged a grant that master never carried. Loads the script where it
/// is missing (a replica promoted since) and sends again. Returns the script's reply and
/// `WAIT`'s, if sent.
async fn acquire_then_wait(
    mut conn: Conn,
    pipe: &redis::Pipeline,
    script: &redis::Script,
) -> redis::RedisResult<(Value, Option<redis::RedisResult<Value>>)> {
    async fn send(
        conn: &mut Conn,
        pipe: &redis::Pipeline,
    ) -> redis::RedisResult<(Value, Option<redis::RedisResult<Value>>)> {
        let mut replies: Vec<redis::RedisResult<Value>> = pipe.query_async(conn).await?;
        let waited = if replies.len() > 1 { replies.pop() } else { None };
        let script =
            replies.pop().unwrap_or_else(|| Err((redis::ErrorKind::Parse, "no reply to the acquire script").into()));
        Ok((script?, waited))
    }
    match send(&mut conn, pipe).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.load_async(&mut conn).await?;
            send(&mut conn, pipe).await
        }
        sent => sent,
    }
}

#[async_trait]
impl LockService for RedisLockService {
    type Fencing = Fenced;

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fence_source: FenceSource::Counter,
            fences_survive_release: true,
            // Only with persistence (appendonly): the library cannot know, so it does not claim it.
            fences_survive_restart: false,
            gap_free: true,
            waiting: Waiting::Native,
            // A set is one script on one server. On a cluster every resource has a hash tag of
            // its own, so a set's keys lie in as many slots as it has keys: one script each.
            multi_acquire: if matches!(self.conn(), Conn::Cluster(_)) {
                MultiAcquire::PerKey
            } else {
                MultiAcquire::OneRequest
            },
            ..Capabilities::default()
        }
    }

    async fn try_acquire(&self, key: &ResourceKey, ttl: Ttl) -> Result<Option<Grant<Fenced>>> {
        match self.attempt(key, ttl, false).await? {
            AttemptOutcome::Granted(grant) => Ok(Some(grant)),
            AttemptOutcome::Held { .. } => Ok(None),
        }
    }

    async fn acquire(&self, key: &ResourceKey, ttl: Ttl, wait: Duration) -> Result<Grant<Fenced>> {
        validate_wait(wait)?;
        let give_up = Instant::now() + wait;
        if let AttemptOutcome::Granted(grant) = self.attempt(key, ttl, !wait.is_zero()).await? {
            return Ok(grant);
        }
        if wait.is_zero() {
            return Err(palisade_core::spi::timeout_error(BACKEND, key, wait));
        }
        // Held: wait on the release notifications only once they are live, or a release in
        // the meantime goes unheard until the next poll (a conformance test caught 250 ms);
        // when they are down (a dead or black-holed server), poll at once instead.
        self.waiters.ready(wait.min(SUBSCRIBE_WAIT)).await;
        let left = give_up.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(palisade_core::spi::timeout_error(BACKEND, key, wait));
        }
        let released = || self.waiters.watch(&Waiters::channel(&key.lock_key()));
        wait_for_release(BACKEND, key, left, released, Some(MAX_WAIT_STEP), || self.attempt(key, ttl, true))
            .await
            .map_err(|e| {
                if e.kind() == ErrorKind::Timeout { palisade_core::spi::timeout_error(BACKEND, key, wait) } else { e }
            })
    }

    /// One [`ACQUIRE_ALL`] script on one server; on a cluster, where each resource hashes to
    /// a slot of its own, one [`ACQUIRE`] per key (the trait's default).
    async fn try_acquire_all(&self, keys: &[ResourceKey], ttl: Ttl) -> Result<AllOrNone<Grant<Fenced>>> {
        distinct_keys(BACKEND, keys)?;
        if matches!(self.conn(), Conn::Cluster(_)) {
            return try_acquire_each(self, keys, ttl).await;
        }
        self.attempt_all(keys, ttl).await
    }

    async fn acquire_any(&self, keys: &[ResourceKey], ttl: Ttl, wait: Duration) -> Result<Grant<Fenced>> {
        let first = first_of(BACKEND, keys)?;
        validate_wait(wait)?;
        let give_up = Instant::now() + wait;
        // As `acquire`, over every key: a round that may wait marks the holders it finds, so
        // their releases publish.
        let round = |mark: bool| first_granted(keys.len(), move |i| self.attempt(&keys[i], ttl, mark));
        if let AttemptOutcome::Granted(grant) = round(!wait.is_zero()).await? {
            return Ok(grant);
        }
        if !wait.is_zero() {
            self.waiters.ready(wait.min(SUBSCRIBE_WAIT)).await;
        }
        let left = give_up.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timeout_of_any(palisade_core::spi::timeout_error(BACKEND, first, wait), BACKEND, keys, wait));
        }
        let released =
            || keys.iter().map(|key| self.waiters.watch(&Waiters::channel(&key.lock_key()))).collect::<Vec<_>>();
        wait_for_any_release(BACKEND, first, left, released, Some(MAX_WAIT_STEP), || round(true)).await.map_err(|e| {
            let e = if e.kind() == ErrorKind::Timeout {
                palisade_core::spi::timeout_error(BACKEND, first, wait)
            } else {
                e
            };
            timeout_of_any(e, BACKEND, keys, wait)
        })
    }

    async fn extend(&self, grant: &Grant<Fenced>, ttl: Ttl) -> Result<Ttl> {
        let mut extend = EXTEND.key(grant.key().lock_key());
        extend.arg(&grant.token().to_hex()[..]).arg(server_ttl(ttl));
        let (reply, _) = self.invoke_script(&extend, "extend").await?;
        if decode_done(&reply, "extend")? {
            Ok(ttl)
        } else {
            Err(Error::new(
                ErrorKind::NotHolder,
                BACKEND,
                format!("{} is not held by this owner token", grant.key().lock_key()),
            ))
        }
    }

    /// Owner-checked delete. A release whose first reply was lost and whose resend finds the
    /// lock gone reports success: the first send deleted it, or it had expired; either way
    /// this grant no longer holds it, and nobody else's lock was touched.
    async fn release(&self, grant: &Grant<Fenced>) -> Result<()> {
        let lock_key = grant.key().lock_key();
        let (reply, resent) = if matches!(self.conn(), Conn::Cluster(_)) {
            // The cluster client resends a request whose connection dropped by itself, below
            // `invoke`, which then never learns of the resend: the call's nonce marks its own.
            let nonce = OwnerToken::generate()?.to_hex();
            let mut release = RELEASE_MARKED.key(&lock_key);
            release
                .key(release_marker(&lock_key, &nonce))
                .arg(&grant.token().to_hex()[..])
                .arg(Waiters::channel(&lock_key))
                .arg(self.release_marker_lifetime().as_millis().to_string());
            self.invoke_script(&release, "release").await?
        } else {
            let mut release = RELEASE.key(&lock_key);
            release.arg(&grant.token().to_hex()[..]).arg(Waiters::channel(&lock_key));
            self.invoke_script(&release, "release").await?
        };
        if decode_done(&reply, "release")? || resent {
            Ok(())
        } else {
            Err(Error::new(ErrorKind::NotHolder, BACKEND, format!("{lock_key} is not held by this owner token")))
        }
    }

    async fn advance_fence(&self, key: &ResourceKey, floor: Fence) -> Result<()> {
        let floor = i64::try_from(floor.get())
            .map_err(|_| Error::new(ErrorKind::InvalidArgument, BACKEND, "fence floor above i64::MAX"))?;
        let mut conn = self.conn();
        let now: String = ADVANCE_FENCE
            .key(key.fence_key())
            .arg(floor)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| map(e, "advance fence"))?;
        warn!(key = %key, fence = now, "fence counter moved past the store's watermark");
        Ok(())
    }
}

impl fmt::Debug for RedisLockService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLockService").field("config", &self.config).finish_non_exhaustive()
    }
}

/// The marker of one release call of a lock key: `released:{domain:id}:<nonce>`, in the lock's
/// slot (the hash tag is the first `{…}`).
fn release_marker(lock_key: &str, nonce: &[u8]) -> Vec<u8> {
    let mut key = format!("released:{}:", lock_key.strip_prefix("lock:").unwrap_or(lock_key)).into_bytes();
    key.extend_from_slice(nonce);
    key
}

/// A managed connection to the server `client` names.
///
/// A refused TLS handshake (the CA, the host name, the dates, our certificate) and a
/// `rediss://` URL that reaches a plaintext port are `InvalidConfig`: no retry helps.
async fn manage(client: &redis::Client, config: &RedisConfig) -> Result<ConnectionManager> {
    match client.get_connection_manager_with_config(manager_config(config)).await {
        Ok(manager) => Ok(manager),
        Err(e) => {
            let refused = match tls_refusal(&e) {
                Some(why) => Some(why),
                None => plaintext_port(config).await,
            };
            let (kind, message) = match refused {
                Some(why) => (ErrorKind::InvalidConfig, format!("cannot connect to {}: {why}", config.redacted_url())),
                None => (ErrorKind::Unavailable, format!("cannot connect to {}", config.redacted_url())),
            };
            Err(Error::new(kind, BACKEND, message).with_source(e).with_retryable(kind == ErrorKind::Unavailable))
        }
    }
}

#[cfg(feature = "tls")]
fn tls_refusal(e: &redis::RedisError) -> Option<String> {
    palisade_core::spi::tls::handshake_refusal(e)
}

#[cfg(not(feature = "tls"))]
fn tls_refusal(_: &redis::RedisError) -> Option<String> {
    None
}

/// Why a `rediss://` connection failed when the port answers a plaintext `PING` the way Redis
/// does (the handshake only timed out: Redis waits for the end of an inline command).
#[cfg(feature = "tls")]
async fn plaintext_port(config: &RedisConfig) -> Option<String> {
    if !config.url.starts_with("rediss://") {
        return None;
    }
    let parsed = palisade_core::spi::ConnectionUrl::parse(&config.url).ok()?;
    let (host, port) = parsed.hosts.first()?.clone();
    let address = format!("{host}:{}", port.unwrap_or(6379));
    let within = config.connect_timeout;
    let plain = tokio::task::spawn_blocking(move || {
        palisade_core::spi::tls::plaintext_port(&address, b"PING\r\n", within, |reply| {
            reply.starts_with(b"+PONG") || reply.starts_with(b"-NOAUTH") || reply.starts_with(b"-ERR")
        })
    })
    .await
    .unwrap_or(false);
    plain.then(|| "the server does not speak TLS: this is a plaintext port (use redis://)".to_string())
}

#[cfg(not(feature = "tls"))]
async fn plaintext_port(_: &RedisConfig) -> Option<String> {
    None
}

/// How every connection of the service is managed: explicit timeouts, a few quick retries.
fn manager_config(config: &RedisConfig) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(config.response_timeout))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500))
}

/// A client for the URL, with the configured certificates for `rediss://`.
fn open_client(config: &RedisConfig) -> redis::RedisResult<redis::Client> {
    #[cfg(feature = "tls")]
    if config.has_tls_material() {
        let certificates = redis::TlsCertificates {
            client_tls: config.tls_client_identity.as_ref().map(|id| redis::ClientTlsConfig {
                client_cert: id.certificate.clone(),
                client_key: id.private_key.clone(),
            }),
            root_cert: config.tls_root_cert.clone(),
        };
        return redis::Client::build_with_tls(config.url.as_str(), certificates);
    }
    redis::Client::open(config.url.as_str())
}

/// The TTL a grant's script sends the server, in milliseconds. Planted bugs (tests only):
/// `redis-lock-outlives-its-ttl`, a unit slip that sends a thousand times the grant's TTL, so
/// a holder that dies leaves its lock held for good; `redis-lock-expires-early`, a quarter of
/// it, so the server frees a lock while its holder is still told it is safe.
fn server_ttl(ttl: Ttl) -> u64 {
    let ms = ttl.as_millis_ceil();
    if palisade_core::spi::planted_bug("redis-lock-outlives-its-ttl") {
        ms.saturating_mul(1000)
    } else if palisade_core::spi::planted_bug("redis-lock-expires-early") {
        (ms / 4).max(1)
    } else {
        ms
    }
}
