//! etcd's leader killed while clients hold and contend for locks, on a 3-member cluster of the
//! test's own (fast elections): no two holders at once, no stale write accepted, locks usable
//! again after the election, fences increasing across the leader change.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

#[path = "common/contention.rs"]
mod contention;

use std::sync::Arc;

use palisade::DynFencedStore;
use palisade::etcd::{EtcdConfig, EtcdLockService};
use palisade::postgres::PostgresStore;
use palisade_conformance::require_env;
use palisade_conformance::servers::EtcdCluster;

/// The current leader's index; a loaded machine can be between elections, so ask for up to 10 s.
async fn leader_index(cluster: &EtcdCluster) -> Option<usize> {
    for _ in 0..50 {
        for (i, port) in cluster.client_ports().into_iter().enumerate() {
            let Ok(mut client) = etcd_client::Client::connect([format!("http://127.0.0.1:{port}")], None).await else {
                continue;
            };
            if let Ok(status) = client.status().await
                && status.header().is_some_and(|h| h.member_id() == status.leader())
            {
                return Some(i);
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_under_contention() {
    let mut cluster = EtcdCluster::start(&require_env("PALISADE_ETCD_SERVER"), 3).unwrap();
    let url = format!("{}?session_ttl_s=2", cluster.url());
    let store: Arc<DynFencedStore> =
        Arc::new(PostgresStore::connect(&require_env("PALISADE_POSTGRES_URL")).await.unwrap());
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(Arc::new(EtcdLockService::connect_with(EtcdConfig::from_url(&url).unwrap()).await.unwrap()));
    }
    let cluster = &mut cluster;
    let run = format!("leader{}", std::process::id());
    let (killed, after, errors) =
        contention::leader_killed_under_contention(clients, store, &run, move || async move {
            let leader = leader_index(cluster).await.expect("a leader before the kill");
            cluster.kill_member(leader);
            format!("m{leader}")
        })
        .await;
    eprintln!(
        "leader {killed} killed; {after} writes after the election; {} errors meanwhile: {errors:?}",
        errors.len()
    );
}
