//! Master faults, on Redis masters of each test's own (started here, killed by PID): what
//! Redlock survives, what it refuses, and the double grant it cannot prevent.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use palisade_core::LockOptions;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use palisade_conformance::require_env;
use palisade_core::{ErrorKind, LockService, LockServiceExt, ResourceKey};
use palisade_lab::servers::LoopbackServer;
use palisade_redlock::{RedlockConfig, RedlockService};
use tokio::time::Instant;

fn masters(n: usize) -> Vec<LoopbackServer> {
    let program = require_env("PALISADE_REDIS_SERVER");
    (0..n).map(|_| LoopbackServer::redis(&program, &[]).expect("start redis-server")).collect()
}

fn url(masters: &[LoopbackServer]) -> String {
    let hosts: Vec<String> = masters.iter().map(|m| format!("127.0.0.1:{}", m.port())).collect();
    format!("redlock://{}", hosts.join(","))
}

async fn raw(master: &LoopbackServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(master.redis_url()).unwrap().get_multiplexed_async_connection().await.unwrap()
}

async fn holder_of(master: &LoopbackServer, key: &ResourceKey) -> Option<String> {
    let mut conn = raw(master).await;
    redis::cmd("GET").arg(format!("redlock:{{{}:{}}}", key.domain(), key.id())).query_async(&mut conn).await.unwrap()
}

fn key(id: &str) -> ResourceKey {
    ResourceKey::new("faults", id).unwrap()
}

const TTL: Duration = Duration::from_secs(10);

#[tokio::test]
async fn five_masters_grant_with_two_down_and_refuse_with_three_down() {
    let mut nodes = masters(5);
    let locks = Arc::new(RedlockService::connect(&url(&nodes)).await.unwrap());
    for down in 0..=2 {
        if down > 0 {
            nodes[down - 1].kill();
        }
        let k = key(&format!("down-{down}"));
        let lease = locks.try_lock(&k, TTL).await.unwrap().unwrap_or_else(|| panic!("{down} down: not granted"));
        assert!(lease.time_left() > TTL / 2, "{down} down: {:?} left", lease.time_left());
        lease.release().await.unwrap();
    }
    nodes[2].kill();
    let err = locks.try_lock(&key("down-3"), TTL).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_retryable());
    assert!(err.to_string().contains("only 2 of 5 masters answered"), "{err}");
    // Waiting does not turn a missing majority into a Timeout: the last error is reported.
    let err = locks.lock(&key("down-3"), LockOptions::ttl(TTL).wait(Duration::from_millis(300))).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    // A master that comes back (empty) is used again without reconnecting by hand.
    nodes[2].restart().unwrap();
    let lease = locks.lock(&key("back"), LockOptions::ttl(TTL).wait(Duration::from_secs(5))).await.unwrap();
    lease.release().await.unwrap();
}

#[tokio::test]
async fn a_hung_master_costs_the_node_timeout_not_the_ttl() {
    let nodes = masters(3);
    let config = RedlockConfig::parse(&url(&nodes)).unwrap();
    let node_timeout = config.node_timeout;
    let locks = Arc::new(RedlockService::connect_with(config).await.unwrap());
    let pid = Pid::from_raw(i32::try_from(nodes[0].pid().unwrap()).unwrap());
    kill(pid, Signal::SIGSTOP).unwrap();
    let started = Instant::now();
    let result = locks.try_lock(&key("hung"), TTL).await;
    let took = started.elapsed();
    kill(pid, Signal::SIGCONT).unwrap();
    let lease = result.unwrap().expect("two of three masters answered");
    assert!(took >= node_timeout, "granted after {took:?}, before the hung master's timeout");
    assert!(took < TTL / 4, "a hung master held the round for {took:?}");
    // The validity is counted from before the round: what the hung master cost is gone.
    assert!(lease.time_left() <= TTL - node_timeout, "{:?} left", lease.time_left());
    lease.release().await.unwrap();
}

#[tokio::test]
async fn a_failed_round_releases_what_it_took() {
    let nodes = masters(3);
    let locks = Arc::new(RedlockService::connect(&url(&nodes)).await.unwrap());
    let k = key("split");
    // Another client holds the key on two masters: this client can only get the third.
    for master in &nodes[..2] {
        let mut conn = raw(master).await;
        let _: () = redis::cmd("SET")
            .arg("redlock:{faults:split}")
            .arg("other")
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    assert!(locks.try_lock(&k, TTL).await.unwrap().is_none());
    assert_eq!(holder_of(&nodes[2], &k).await, None, "the minority grant was left behind");
    assert_eq!(holder_of(&nodes[0], &k).await.as_deref(), Some("other"), "the clean-up touched another's key");
}

#[tokio::test]
async fn extend_needs_a_majority_and_gives_back_the_rest() {
    let nodes = masters(3);
    let locks = Arc::new(RedlockService::connect(&url(&nodes)).await.unwrap());
    let k = key("extend");
    let lease = locks.try_lock(&k, TTL).await.unwrap().unwrap();
    lease.extend(TTL).await.unwrap();
    // Two masters lose the key (expired early, say): the holder no longer has a majority.
    for master in &nodes[..2] {
        let mut conn = raw(master).await;
        let _: () = redis::cmd("DEL").arg("redlock:{faults:extend}").query_async(&mut conn).await.unwrap();
    }
    let err = lease.extend(TTL).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHolder, "{err}");
    assert!(lease.is_lost(), "a refused extension must fire the lost signal");
    assert_eq!(holder_of(&nodes[2], &k).await, None, "the minority key was kept after the failed extend");
    let next = locks.try_lock(&k, TTL).await.unwrap();
    assert!(next.is_some(), "the lock did not come free");
}

/// **Documented limitation, not a failure.** A master that restarts without persistence
/// while a lock is held forgets it; with two other masters unreachable during the grant, a
/// second client then gets a majority for the same lock: two holders at once. This is the
/// scenario of Kleppmann (2016); antirez's answer is delayed restarts (keep a restarted master
/// out for one TTL) or `appendfsync always`, which this library cannot enforce on the servers.
/// With a fenced backend the second holder's fence would outrank the first; Redlock has none.
#[tokio::test]
async fn documented_limitation_restart_without_persistence_double_grants() {
    let mut nodes = masters(5);
    let locks_a = Arc::new(RedlockService::connect(&url(&nodes)).await.unwrap());
    let k = key("double");
    // D and E are unreachable while A takes the lock on A, B, C.
    nodes[3].kill();
    nodes[4].kill();
    let a = locks_a.try_lock(&k, TTL).await.unwrap().expect("A gets 3 of 5");
    nodes[3].restart().unwrap();
    nodes[4].restart().unwrap();
    // C crashes and comes back at once, empty.
    nodes[2].restart().unwrap();
    let locks_b = Arc::new(RedlockService::connect(&url(&nodes)).await.unwrap());
    let b = locks_b.try_lock(&k, TTL).await.unwrap();
    let b = b.expect("B got C, D, E: the double grant this test documents did not happen");
    assert!(!a.is_lost() && a.time_left() > Duration::ZERO, "A's lease ran out: the grants did not overlap");
    assert!(!b.is_lost() && b.time_left() > Duration::ZERO);
    eprintln!(
        "documented limitation reproduced: two clients hold {k} at once ({:?} and {:?} left)",
        a.time_left(),
        b.time_left()
    );
    // B releases its majority. A finds out only now, after its work, that it no longer had
    // one: NotHolder, or Unavailable while its connections to the restarted masters recover.
    b.release().await.unwrap();
    let err = a.release().await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::NotHolder | ErrorKind::Unavailable), "{err}");
    assert_eq!(locks_a.capabilities().fence_source, palisade_core::FenceSource::None);
}
