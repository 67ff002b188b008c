//! etcd's leader killed while clients hold and contend for locks, on a 3-member cluster of the
//! test's own (fast elections): no two holders at once, no stale write accepted, locks usable
//! again after the election, fences increasing across the leader change
//! (`palisade_conformance::cluster`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;
use std::time::Duration;

use palisade::DynFencedStore;
use palisade::etcd::{EtcdConfig, EtcdLockService};
use palisade::postgres::PostgresStore;
use palisade_conformance::cluster::{LeaderKillSettings, leader_killed_under_contention};
use palisade_conformance::require_env;
use palisade_conformance::servers::EtcdCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_under_contention_is_safe_and_recovers() {
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
    let kill = move || async move {
        let leader = cluster.kill_leader(Duration::from_secs(10)).await.map_err(|e| e.to_string())?;
        Ok(format!("m{leader}"))
    };
    let report =
        leader_killed_under_contention(clients, store, &run, LeaderKillSettings::default(), kill).await.unwrap();
    eprintln!(
        "leader {} killed; {} writes, {} after the election; {} errors meanwhile: {:?}",
        report.killed,
        report.writes,
        report.writes_after_election,
        report.errors.len(),
        report.errors
    );
    report.check().unwrap();
}
