//! The Redis lock service's test factory (feature `conformance`): what its certification
//! and every pairing test use, so no test writes them twice. They read the server's address
//! from the environment the test command sets ([`require_env`]: a missing variable fails, never
//! skips).

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::{FaultProxy, FaultyClient, LockServiceFactory, Timing, lock_factory, proxy, require_env};
use palisade_core::{Error, ErrorKind};

use crate::connection::ClusterTarget;
use crate::sentinel::SentinelTarget;
use crate::{RedisConfig, RedisLockService};

/// Independent clients (each its own connection, as a separate process would have) of the Redis
/// at `PALISADE_REDIS_URL`, with `break_lock` (a raw `DEL` of the lock key) and a faulty client.
pub fn service() -> impl LockServiceFactory<Service = RedisLockService> {
    let url = require_env("PALISADE_REDIS_URL");
    let raw = url.clone();
    let proxied = url.clone();
    lock_factory(Timing::new(Duration::from_millis(200), Duration::from_millis(50)), move || {
        let url = url.clone();
        async move { Ok(Arc::new(RedisLockService::connect(&url).await?)) }
    })
    // What `palisade inspect` reads: a client of its own, as the service is its own view.
    .viewed()
    .with_break_lock(move |key| {
        let url = raw.clone();
        async move { raw_del(&url, &key.lock_key()).await }
    })
    .with_faulty_client(move || {
        let url = proxied.clone();
        async move {
            let (url, proxies) = proxy::proxy_url(&url).await?;
            Ok(FaultyClient::new(Arc::new(RedisLockService::connect(&url).await?), proxies))
        }
    })
}

/// Independent clients of the Sentinel group at `PALISADE_REDIS_SENTINEL_URL` (a master, a
/// replica, three Sentinels), with `break_lock` (a raw `DEL` on the master the Sentinels name)
/// and a faulty client: the master's address, as the Sentinels name it, is mapped
/// ([`RedisConfig::address_map`]) to a fault proxy in front of it.
pub fn sentinel_service() -> impl LockServiceFactory<Service = RedisLockService> {
    let url = require_env("PALISADE_REDIS_SENTINEL_URL");
    let (raw, proxied) = (url.clone(), url.clone());
    lock_factory(Timing::new(Duration::from_millis(200), Duration::from_millis(50)), move || {
        let url = url.clone();
        async move { Ok(Arc::new(RedisLockService::connect(&url).await?)) }
    })
    // What `palisade inspect` reads: a client of its own, as the service is its own view.
    .viewed()
    .with_break_lock(move |key| {
        let url = raw.clone();
        async move {
            let (master, _) = SentinelTarget::parse(&url)?.master_url(ASK).await?;
            raw_del(&master, &key.lock_key()).await
        }
    })
    .with_faulty_client(move || {
        let url = proxied.clone();
        async move {
            let (_, master) = SentinelTarget::parse(&url)?.master_url(ASK).await?;
            let proxy = FaultProxy::start(socket_address(&master)?).await?;
            let config = RedisConfig::new(url.as_str()).with_address_mapped(master, proxy.addr().to_string());
            Ok(FaultyClient::new(Arc::new(RedisLockService::connect_with(config).await?), vec![proxy]))
        }
    })
}

/// Independent clients of the Redis Cluster at `PALISADE_REDIS_CLUSTER_URL` (three primaries
/// with a replica each), with `break_lock` (a raw `DEL` through a cluster client, sent to the
/// key's slot) and a faulty client: every node's address, as the cluster names it, is mapped
/// ([`RedisConfig::address_map`]) to a fault proxy of its own in front of it, so a partition
/// cuts the client from the whole cluster and a lost reply is lost whichever node answers.
pub fn cluster_service() -> impl LockServiceFactory<Service = RedisLockService> {
    let url = require_env("PALISADE_REDIS_CLUSTER_URL");
    let (raw, proxied) = (url.clone(), url.clone());
    lock_factory(Timing::new(Duration::from_millis(200), Duration::from_millis(50)), move || {
        let url = url.clone();
        async move { Ok(Arc::new(RedisLockService::connect(&url).await?)) }
    })
    // What `palisade inspect` reads: a client of its own, as the service is its own view.
    .viewed()
    .with_break_lock(move |key| {
        let url = raw.clone();
        async move {
            let client = redis::cluster::ClusterClient::new(ClusterTarget::parse(&url)?.seed_urls()).map_err(fail)?;
            let mut conn = client.get_async_connection().await.map_err(fail)?;
            let _: i64 = redis::cmd("DEL").arg(key.lock_key()).query_async(&mut conn).await.map_err(fail)?;
            Ok(())
        }
    })
    .with_faulty_client(move || {
        let url = proxied.clone();
        async move {
            let mut config = RedisConfig::new(url.as_str());
            let mut proxies = Vec::new();
            for node in cluster_nodes(&url).await? {
                let proxy = FaultProxy::start(socket_address(&node)?).await?;
                config = config.with_address_mapped(node, proxy.addr().to_string());
                proxies.push(proxy);
            }
            Ok(FaultyClient::new(Arc::new(RedisLockService::connect_with(config).await?), proxies))
        }
    })
}

/// How long the factories wait for a Sentinel's answer.
const ASK: Duration = Duration::from_secs(2);

fn fail(e: redis::RedisError) -> Error {
    Error::new(ErrorKind::Backend, "conformance", format!("raw Redis command: {e}"))
}

/// A raw `DEL key` on the server at `url`: an operator's hand, not the service's.
async fn raw_del(url: &str, key: &str) -> palisade_core::Result<()> {
    let client = redis::Client::open(url).map_err(fail)?;
    let mut conn = client.get_multiplexed_async_connection().await.map_err(fail)?;
    let _: i64 = redis::cmd("DEL").arg(key).query_async(&mut conn).await.map_err(fail)?;
    Ok(())
}

fn socket_address(address: &str) -> palisade_core::Result<std::net::SocketAddr> {
    address.parse().map_err(|_| {
        Error::new(ErrorKind::InvalidConfig, "conformance", format!("`{address}` is not an IP address and port"))
    })
}

/// Every node's `host:port` as the cluster names it (`CLUSTER NODES`, asked of the first seed).
async fn cluster_nodes(url: &str) -> palisade_core::Result<Vec<String>> {
    let seeds = ClusterTarget::parse(url)?.seed_urls();
    let seed = seeds.first().ok_or_else(|| Error::new(ErrorKind::InvalidConfig, "conformance", "no seed"))?;
    let client = redis::Client::open(seed.as_str()).map_err(fail)?;
    let mut conn = client.get_multiplexed_async_connection().await.map_err(fail)?;
    let nodes: String = redis::cmd("CLUSTER").arg("NODES").query_async(&mut conn).await.map_err(fail)?;
    // `<id> <ip:port@cport[,hostname]> <flags> …`, one line per node.
    let addresses: Vec<String> = nodes
        .lines()
        .filter_map(|line| line.split_whitespace().nth(1))
        .filter_map(|field| field.split('@').next())
        .filter(|address| !address.ends_with(":0"))
        .map(str::to_string)
        .collect();
    if addresses.is_empty() {
        return Err(Error::new(ErrorKind::Backend, "conformance", format!("CLUSTER NODES named no node: {nodes}")));
    }
    Ok(addresses)
}
