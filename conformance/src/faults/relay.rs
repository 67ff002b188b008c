//! A loopback relay that lets a child process use a lock service living in the parent's memory
//! (and, [`StoreRelay`], one for a fenced store).
//!
//! The process-level scenarios freeze a holder *process* with `SIGSTOP`. A service behind a
//! server is reached by the child directly; an in-process service (the memory reference
//! implementation, or yours) is served to the child by this relay. The relay forwards the four
//! `LockService` calls over a line protocol on 127.0.0.1; it never releases a grant when a
//! connection drops, so a killed child's lock expires at its TTL as with a real server.
//!
//! Wire format, one request and one reply per line, each request led by a request id the
//! client chooses:
//! `id TRY key ttl_us` → `GRANT token fence|- granted_ttl_us` or `BUSY`;
//! `id EXTEND key token fence|- ttl_us` → `OK granted_ttl_us`; `id RELEASE key token fence|-` →
//! `OK`; `id CAPS` → `CAPS name=value …`, the relayed service's capabilities (what
//! [`RelayLockService::discover`] reads); any request → `ERR kind resource|- message` on failure
//! (a fence refusal's kind with its fences: `stale_fence/presented/current`,
//! `duplicate_fence/fence`).
//!
//! A reply can be lost after its request ran (the fault scenarios make sure of it). The client
//! then reconnects and sends the same line again; the relay answers a request id it has seen
//! from its reply cache instead of running the request twice, so a lost `TRY` reply neither
//! orphans the grant nor takes a second one (catalogue C33). A resend that arrives while the
//! first run is still under way waits for that run's reply.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use palisade_core::{
    AllOrNone, Capabilities, Error, ErrorKind, Fencing, Grant, LockService, MultiAcquire, OwnerToken, ResourceKey,
    Result, Ttl,
};
use tokio::time::Instant;

mod store;
mod wire;

pub use store::{RelayStore, StoreRelay};
use wire::{BACKEND, Channel, Handler, fence_text, parse_fence, proto_err};

/// A running relay; dropping it stops accepting connections.
#[derive(Debug)]
pub struct Relay(wire::Listening);

/// The lock relay's side of a connection: the relayed service.
struct LockHandler<S>(Arc<S>);

#[async_trait]
impl<S: LockService> Handler for LockHandler<S> {
    async fn handle(&self, request: &str) -> Result<String> {
        handle(&*self.0, request).await
    }
}

impl Relay {
    /// Serves `service` on an ephemeral port of 127.0.0.1.
    pub async fn serve<S: LockService>(service: Arc<S>) -> Result<Relay> {
        let listening = wire::serve(move || {
            let service = Arc::clone(&service);
            async move { Ok(LockHandler(service)) }
        })
        .await?;
        Ok(Relay(listening))
    }

    /// The address to hand to the child.
    pub fn addr(&self) -> SocketAddr {
        self.0.addr
    }
}

fn parse_ttl(s: &str) -> Result<Ttl> {
    Ttl::new(Duration::from_micros(s.parse().map_err(|_| proto_err("bad ttl"))?))
}

fn grant_from<F: Fencing>(key: &str, token: &str, fence: &str, ttl: Ttl) -> Result<Grant<F>> {
    let key = palisade_core::spi::parse_any_resource_key(key)?;
    let token = OwnerToken::parse_hex(token)?;
    let fence = F::token_from(parse_fence(fence)?).ok_or_else(|| proto_err("missing fence"))?;
    Ok(Grant::new(key, token, fence, ttl, Instant::now()))
}

async fn handle<S: LockService>(service: &S, line: &str) -> Result<String> {
    let parts: Vec<&str> = line.split(' ').collect();
    match parts.as_slice() {
        ["TRY", key, ttl] => {
            let key = palisade_core::spi::parse_any_resource_key(key)?;
            Ok(match service.try_acquire(&key, parse_ttl(ttl)?).await? {
                Some(g) => {
                    format!("GRANT {} {} {}", g.token(), fence_text(g.fence_if_any()), g.ttl().get().as_micros())
                }
                None => "BUSY".to_string(),
            })
        }
        ["TRYALL", ttl, keys @ ..] => {
            let keys =
                keys.iter().map(|k| palisade_core::spi::parse_any_resource_key(k)).collect::<Result<Vec<_>>>()?;
            Ok(match service.try_acquire_all(&keys, parse_ttl(ttl)?).await? {
                AllOrNone::Granted(grants) => grants.iter().fold(String::from("GRANTS"), |mut reply, g| {
                    let fence = fence_text(g.fence_if_any());
                    reply.push_str(&format!(" {} {fence} {}", g.token(), g.ttl().get().as_micros()));
                    reply
                }),
                AllOrNone::Held(i) => format!("HELD {i}"),
                _ => return Err(proto_err("an outcome of try_acquire_all this relay does not know")),
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
        ["CAPS"] => Ok(caps_text(&service.capabilities())),
        _ => Err(proto_err("unknown request")),
    }
}

/// Asks the relay at `addr` for the relayed service's capabilities (the `CAPS` request).
pub async fn capabilities(addr: SocketAddr) -> Result<Capabilities> {
    RelayLockService::<palisade_core::Unfenced>::connect(addr, Capabilities::default()).await?.ask_capabilities().await
}

/// `CAPS name=value …`: every field of `caps`, the enums by their variant names.
fn caps_text(caps: &Capabilities) -> String {
    format!(
        "CAPS fence_source={:?} fences_survive_release={} fences_survive_restart={} gap_free={} waiting={:?} \
         expiry_delay_us={} deployment={:?} replication={:?} multi_acquire={:?}",
        caps.fence_source,
        caps.fences_survive_release,
        caps.fences_survive_restart,
        caps.gap_free,
        caps.waiting,
        caps.expiry_delay.as_micros(),
        caps.deployment,
        caps.replication,
        caps.multi_acquire
    )
}

/// The variant of `variants` named `name` (its `Debug` form).
fn variant<T: std::fmt::Debug + Copy>(variants: &[T], name: &str) -> Result<T> {
    variants
        .iter()
        .copied()
        .find(|v| format!("{v:?}") == name)
        .ok_or_else(|| proto_err(&format!("a capability this relay client does not know: {name}")))
}

/// Reads what [`caps_text`] wrote; a field missing or unknown is an error, never a default.
fn parse_caps(reply: &str) -> Result<Capabilities> {
    use palisade_core::{Deployment, FenceSource, Replication, Waiting};
    let fields: HashMap<&str, &str> =
        reply.strip_prefix("CAPS ").unwrap_or_default().split(' ').filter_map(|f| f.split_once('=')).collect();
    let field = |name: &str| fields.get(name).copied().ok_or_else(|| proto_err(&format!("CAPS without {name}")));
    let flag = |name: &str| -> Result<bool> { field(name)?.parse().map_err(|_| proto_err("a flag not true or false")) };
    Ok(Capabilities {
        fence_source: variant(
            &[FenceSource::Counter, FenceSource::Revision, FenceSource::Zxid, FenceSource::None],
            field("fence_source")?,
        )?,
        fences_survive_release: flag("fences_survive_release")?,
        fences_survive_restart: flag("fences_survive_restart")?,
        gap_free: flag("gap_free")?,
        waiting: variant(&[Waiting::Polling, Waiting::Native, Waiting::NativeFifo], field("waiting")?)?,
        expiry_delay: Duration::from_micros(
            field("expiry_delay_us")?.parse().map_err(|_| proto_err("a bad expiry_delay_us"))?,
        ),
        deployment: variant(&[Deployment::InProcess, Deployment::Embedded, Deployment::Network], field("deployment")?)?,
        replication: variant(
            &[Replication::None, Replication::LeaderQuorum, Replication::ClientMajority],
            field("replication")?,
        )?,
        multi_acquire: variant(
            &[MultiAcquire::PerKey, MultiAcquire::OneRequest, MultiAcquire::PerShard],
            field("multi_acquire")?,
        )?,
    })
}

/// What a [`RelayLockService`] does when a request's reply is lost (its connection ended
/// after the request was sent, so the request may have run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayRetry {
    /// Reconnects and sends the same request with the same id; the relay answers it from its
    /// reply cache if it ran. The default, and the correct client.
    SameRequest,
    /// Reconnects and sends the request under a new id, so it runs again: a lost `TRY` reply
    /// leaves the first grant orphaned (bug class 11). For tests of the suite itself.
    NewRequest,
    /// Resends every request the same way except a release, which runs again under a new id
    /// (a client library under the service that resends on a cut connection, as a cluster
    /// client does): the resend finds the lock freed by the first send and answers
    /// `NotHolder` for a release that succeeded. For tests of the suite itself.
    NewReleaseRequest,
    /// Gives up at once with [`ErrorKind::OutcomeUnknown`]: the grant of a lost `TRY` reply is
    /// orphaned until its TTL. For tests of the suite itself.
    Never,
}

/// The child's side: a `LockService` whose calls go to a [`Relay`].
#[derive(Debug)]
pub struct RelayLockService<F: Fencing> {
    channel: Channel,
    capabilities: Capabilities,
    /// Whether `try_acquire_all` is one request (when the relayed service declares
    /// [`MultiAcquire::OneRequest`]).
    batch: bool,
    _fencing: PhantomData<F>,
}

impl<F: Fencing> RelayLockService<F> {
    /// Connects to a relay; `capabilities` are the relayed service's.
    pub async fn connect(addr: SocketAddr, capabilities: Capabilities) -> Result<Self> {
        RelayLockService::connect_with(addr, capabilities, RelayRetry::SameRequest).await
    }

    /// Connects to a relay and asks it for the relayed service's capabilities ([`capabilities`]):
    /// how a process that was given only the relay's address (a client of `palisade torture`)
    /// connects. A service whose fencing is not `F`'s is an `InvalidConfig` error.
    pub async fn discover(addr: SocketAddr) -> Result<Self> {
        let mut client = RelayLockService::connect(addr, Capabilities::default()).await?;
        let capabilities = client.ask_capabilities().await?;
        // A fenced client's grant needs a fence (`token_from(None)` is none); an unfenced one's not.
        let fenced_client = F::token_from(None).is_none();
        if fenced_client != capabilities.issues_fences() {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                BACKEND,
                if capabilities.issues_fences() {
                    "the relayed service issues fences, and this client was built for an unfenced one"
                } else {
                    "the relayed service issues no fence, and this client was built for a fenced one"
                },
            ));
        }
        // The connection that asked serves the calls too.
        client.batch = capabilities.multi_acquire == MultiAcquire::OneRequest;
        client.capabilities = capabilities;
        Ok(client)
    }

    /// The relayed service's capabilities, asked on this client's connection.
    async fn ask_capabilities(&self) -> Result<Capabilities> {
        parse_caps(&self.call("CAPS".to_string()).await?)
    }

    /// Connects to a relay, resending requests whose reply was lost as `retry` says.
    pub async fn connect_with(addr: SocketAddr, capabilities: Capabilities, retry: RelayRetry) -> Result<Self> {
        let channel = Channel::open(addr, retry).await?;
        let batch = capabilities.multi_acquire == MultiAcquire::OneRequest;
        Ok(RelayLockService { channel, capabilities, batch, _fencing: PhantomData })
    }

    /// Sends `try_acquire_all` one key at a time whatever the relayed service declares: a
    /// client that claims one request for a set and does not keep it. For tests of the suite
    /// itself.
    pub fn one_key_at_a_time(mut self) -> Self {
        self.batch = false;
        self
    }

    async fn call(&self, request: String) -> Result<String> {
        self.channel.call(request).await
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

    async fn try_acquire_all(&self, keys: &[ResourceKey], ttl: Ttl) -> Result<AllOrNone<Grant<F>>> {
        if !self.batch {
            return palisade_core::spi::try_acquire_each(self, keys, ttl).await;
        }
        palisade_core::spi::distinct_keys(BACKEND, keys)?;
        let requested_at = Instant::now();
        let mut request = format!("TRYALL {}", ttl.get().as_micros());
        for key in keys {
            request.push_str(&format!(" {key}"));
        }
        let reply = self.call(request).await?;
        let parts: Vec<&str> = reply.split(' ').collect();
        match parts.as_slice() {
            ["HELD", i] => Ok(AllOrNone::Held(i.parse().map_err(|_| proto_err("bad HELD index"))?)),
            ["GRANTS", granted @ ..] if granted.len() == keys.len() * 3 => {
                let grants = keys
                    .iter()
                    .zip(granted.chunks(3))
                    .map(|(key, g)| {
                        let token = OwnerToken::parse_hex(g[0])?;
                        let fence = F::token_from(parse_fence(g[1])?).ok_or_else(|| proto_err("missing fence"))?;
                        Ok(Grant::new(key.clone(), token, fence, parse_ttl(g[2])?, requested_at))
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(AllOrNone::Granted(grants))
            }
            _ => Err(proto_err("bad TRYALL reply")),
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a panic is the failure report

    use super::*;
    use palisade_core::{Deployment, FenceSource, Fenced, MemoryLockService, Replication, Unfenced, Waiting};
    use tokio::net::TcpListener;

    #[test]
    fn capabilities_cross_the_relay_whole() {
        let caps = Capabilities {
            fence_source: FenceSource::Revision,
            fences_survive_release: true,
            fences_survive_restart: false,
            gap_free: true,
            waiting: Waiting::NativeFifo,
            expiry_delay: Duration::from_micros(1_500_250),
            deployment: Deployment::Embedded,
            replication: Replication::ClientMajority,
            multi_acquire: MultiAcquire::PerShard,
        };
        assert_eq!(parse_caps(&caps_text(&caps)).unwrap(), caps);
        assert_eq!(parse_caps(&caps_text(&Capabilities::default())).unwrap(), Capabilities::default());
        let unknown = caps_text(&caps).replace("PerShard", "PerPlanet");
        assert!(parse_caps(&unknown).unwrap_err().message().contains("PerPlanet"));
        assert!(parse_caps("CAPS gap_free=true").is_err(), "a missing field is an error, not a default");
    }

    #[tokio::test]
    async fn a_client_given_only_the_address_learns_the_capabilities() {
        let service = Arc::new(MemoryLockService::default());
        let relay = Relay::serve(Arc::clone(&service)).await.unwrap();
        let client = RelayLockService::<Fenced>::discover(relay.addr()).await.unwrap();
        assert_eq!(client.capabilities(), service.capabilities());
        let key = ResourceKey::new("relay", "caps").unwrap();
        let grant = client.try_acquire(&key, Ttl::new(Duration::from_secs(5)).unwrap()).await.unwrap().unwrap();
        client.release(&grant).await.unwrap();
        let wrong = RelayLockService::<Unfenced>::discover(relay.addr()).await.unwrap_err();
        assert_eq!(wrong.kind(), ErrorKind::InvalidConfig);
        assert!(wrong.message().contains("issues fences"), "{wrong}");
        assert_eq!(capabilities(relay.addr()).await.unwrap(), service.capabilities());
    }

    #[tokio::test]
    async fn a_relay_that_never_answers_is_an_unknown_outcome_within_the_bound() {
        // Accepts connections and reads requests, and never answers one.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let client = RelayLockService::<Fenced>::connect(addr, Capabilities::default()).await.unwrap();
        let key = ResourceKey::new("relay", "silent").unwrap();
        let started = Instant::now();
        let error = client.try_acquire(&key, Ttl::new(Duration::from_secs(5)).unwrap()).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::OutcomeUnknown, "{error}");
        let bound = wire::RESEND_FOR + wire::EXCHANGE_TIMEOUT + Duration::from_secs(2);
        assert!(started.elapsed() < bound, "answered after {:?}, past {bound:?}", started.elapsed());
    }
}
