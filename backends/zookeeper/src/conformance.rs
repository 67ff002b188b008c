//! The ZooKeeper lock service's test factory (feature `conformance`): what its certification
//! and every pairing test use, so no test writes them twice. They read the server's address
//! from the environment the test command sets ([`require_env`]: a missing variable fails, never
//! skips).

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::{FaultyClient, LockServiceFactory, Timing, lock_factory, proxy, require_env};
use palisade_core::{Error, ErrorKind};

use crate::{ZkConfig, ZkLockService};

/// Independent clients (each its own session: 3 s, grants capped at 2 s) of the ZooKeeper at
/// `PALISADE_ZK_URL`, with `break_lock` (the contender nodes deleted, as with zkCli) and a
/// faulty client. The margin covers a stopped holder's session expiry plus the server's tick.
pub fn service() -> impl LockServiceFactory<Service = ZkLockService> {
    let url = format!("{}?session_timeout_ms=3000", require_env("PALISADE_ZK_URL"));
    let raw = url.clone();
    let proxied = url.clone();
    lock_factory(Timing::new(Duration::from_secs(1), Duration::from_millis(4000)), move || {
        let config = ZkConfig::from_url(&url);
        async move { Ok(Arc::new(ZkLockService::connect_with(config?).await?)) }
    })
    // What `palisade inspect` reads: a client of its own, as the service is its own view.
    .viewed()
    // An operator deleting the resource's contender nodes with zkCli.
    .with_break_lock(move |key| {
        let config = ZkConfig::from_url(&raw);
        async move {
            let config = config?;
            let fail =
                |e: zookeeper_client::Error| Error::new(ErrorKind::Backend, "conformance", format!("raw delete: {e}"));
            let cluster = format!("{}{}", config.servers.join(","), config.chroot.as_deref().unwrap_or(""));
            let client = zookeeper_client::Client::connector().connect(&cluster).await.map_err(fail)?;
            let parent = format!("{}/{}/{}", config.root, key.domain(), key.id());
            for child in client.list_children(&parent).await.map_err(fail)? {
                client.delete(&format!("{parent}/{child}"), None).await.map_err(fail)?;
            }
            Ok(())
        }
    })
    .with_faulty_client(move || {
        let url = proxied.clone();
        async move {
            let (url, proxies) = proxy::proxy_url(&url).await?;
            Ok(FaultyClient::new(Arc::new(ZkLockService::connect_with(ZkConfig::from_url(&url)?).await?), proxies))
        }
    })
}
