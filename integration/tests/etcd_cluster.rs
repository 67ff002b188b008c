//! etcd's leader killed while clients hold and contend for locks, on a 3-member cluster of the
//! test's own (fast elections): no two holders at once, no stale write accepted, locks usable
//! again after the election, fences increasing across the leader change
//! (`palisade_conformance::cluster::leader_killed`, stamped by `cluster_suite!`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;
use std::time::Duration;

use palisade::etcd::{EtcdConfig, EtcdLockService};
use palisade::postgres::PostgresStore;
use palisade::{Error, ErrorKind};
use palisade_conformance::servers::EtcdCluster;
use palisade_conformance::{
    ClusterFactory, FencedStoreFactory, LockServiceFactory, Timing, require_env, store_factory,
};

/// Clients of a 3-member cluster of the factory's own, with 2 s sessions.
struct EtcdClusterFactory {
    cluster: tokio::sync::Mutex<EtcdCluster>,
    url: String,
}

fn etcd_cluster() -> EtcdClusterFactory {
    let cluster = EtcdCluster::start(&require_env("PALISADE_ETCD_SERVER"), 3).unwrap();
    let url = format!("{}?session_ttl_s=2", cluster.url());
    EtcdClusterFactory { cluster: tokio::sync::Mutex::new(cluster), url }
}

#[palisade::spi::async_trait]
impl LockServiceFactory for EtcdClusterFactory {
    type Service = EtcdLockService;
    async fn client(&self) -> palisade::Result<Arc<EtcdLockService>> {
        Ok(Arc::new(EtcdLockService::connect_with(EtcdConfig::from_url(&self.url)?).await?))
    }
    fn timing(&self) -> Timing {
        Timing::new(Duration::from_secs(1), Duration::from_millis(2500))
    }
}

#[palisade::spi::async_trait]
impl ClusterFactory for EtcdClusterFactory {
    async fn kill_leader(&self) -> palisade::Result<String> {
        let leader = self
            .cluster
            .lock()
            .await
            .kill_leader(Duration::from_secs(10))
            .await
            .map_err(|e| Error::new(ErrorKind::Backend, "test", format!("could not kill the etcd leader: {e}")))?;
        Ok(format!("m{leader}"))
    }
}

fn postgres() -> impl FencedStoreFactory<Store = PostgresStore> {
    let url = require_env("PALISADE_POSTGRES_URL");
    store_factory(move || {
        let url = url.clone();
        async move { Ok(Arc::new(PostgresStore::connect(&url).await?)) }
    })
}

palisade_conformance::cluster_suite!(etcd_cluster(), postgres());
