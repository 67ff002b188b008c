//! The etcd lock service's test factory (feature `conformance`): what its certification
//! and every pairing test use, so no test writes them twice. They read the server's address
//! from the environment the test command sets ([`require_env`]: a missing variable fails, never
//! skips).

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::{FaultyClient, LockServiceFactory, Timing, lock_factory, proxy, require_env};
use palisade_core::{Error, ErrorKind};

use crate::{EtcdConfig, EtcdLockService};

/// [`service_with_session`] with 3 s sessions: how long after a process stops its locks are
/// given away.
pub fn service() -> impl LockServiceFactory<Service = EtcdLockService> {
    service_with_session(3)
}

/// Independent clients (each its own session of `session_ttl_s` seconds; grants of 1 s) of the
/// etcd at `PALISADE_ETCD_URL`, with `break_lock` (the resource's keys deleted, as with
/// etcdctl) and a faulty client.
pub fn service_with_session(session_ttl_s: u64) -> impl LockServiceFactory<Service = EtcdLockService> {
    let url = format!("{}?session_ttl_s={session_ttl_s}", require_env("PALISADE_ETCD_URL"));
    let raw = url.clone();
    let proxied = url.clone();
    lock_factory(Timing::new(Duration::from_secs(1), Duration::from_millis(3500)), move || {
        let config = EtcdConfig::from_url(&url);
        async move { Ok(Arc::new(EtcdLockService::connect_with(config?).await?)) }
    })
    // What `palisade inspect` reads: a client of its own, as the service is its own view.
    .viewed()
    // An operator deleting the resource's keys (holder and waiters) with etcdctl.
    .with_break_lock(move |key| {
        let config = EtcdConfig::from_url(&raw);
        async move {
            let config = config?;
            let fail =
                |e: etcd_client::Error| Error::new(ErrorKind::Backend, "conformance", format!("raw delete: {e}"));
            let endpoints: Vec<String> = config.endpoints.iter().map(|e| format!("http://{e}")).collect();
            let mut client = etcd_client::Client::connect(endpoints, None).await.map_err(fail)?;
            let prefix = format!("{}{}/", config.key_prefix, key.lock_key());
            client.delete(prefix, Some(etcd_client::DeleteOptions::new().with_prefix())).await.map_err(fail)?;
            Ok(())
        }
    })
    .with_faulty_client(move || {
        let url = proxied.clone();
        async move {
            let (url, proxies) = proxy::proxy_url(&url).await?;
            Ok(FaultyClient::new(Arc::new(EtcdLockService::connect_with(EtcdConfig::from_url(&url)?).await?), proxies))
        }
    })
}
