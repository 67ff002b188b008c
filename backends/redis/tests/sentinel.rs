//! Redis behind Sentinel (`redis+sentinel://`): a master, a replica and three Sentinels of the
//! test's own on loopback. The master is killed during a workload: the service follows the
//! failover, no stale write is accepted, and allocations resume.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // tests

mod common;

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::{FaultProxy, require_env};
use palisade_core::{ErrorKind, LockOptions, LockService, LockServiceExt, ResourceKey, Ttl};
use palisade_lab::servers::{RedisSentinels, SENTINEL_MASTER_NAME};
use palisade_redis::{RedisConfig, RedisLockService};

fn sentinels() -> RedisSentinels {
    RedisSentinels::start(&require_env("PALISADE_REDIS_SERVER")).expect("master, replica and three sentinels")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_is_replaced_and_no_stale_write_is_accepted() {
    let mut group = sentinels();
    let old_master = group.master_port();
    let key = ResourceKey::new("sentinel", "stock").unwrap();
    let recovered = common::allocations_survive(&group.url(), &key, || group.kill_master()).await;
    assert_ne!(group.master_port(), old_master, "the Sentinels promoted the replica");
    println!("sentinel: allocations resumed {:.2} s after the master was killed", recovered.as_secs_f64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acknowledgement_is_waited_for_and_reported_when_missing() {
    let group = sentinels();
    let key = ResourceKey::new("sentinel", "acks").unwrap();
    let options = LockOptions::ttl(Duration::from_secs(5)).wait(Duration::ZERO);
    let one = Arc::new(
        RedisLockService::connect(&format!("{}?wait_replicas=1&wait_timeout_ms=2000", group.url())).await.unwrap(),
    );
    let lease = one.lock(&key, options).await.expect("one replica acknowledges");
    lease.release().await.unwrap();
    let two = Arc::new(
        RedisLockService::connect(&format!("{}?wait_replicas=2&wait_timeout_ms=200", group.url())).await.unwrap(),
    );
    let e = two.lock(&key, options).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("reached 1 of 2 replicas"), "{e}");
    assert!(e.is_retryable());
    // The unacknowledged grant was released: the lock is free at once.
    let again = one.lock(&key, options).await.expect("the unacknowledged grant was released");
    again.release().await.unwrap();
    assert_eq!(two.backend(), "redis");
}

/// A process frozen with `SIGSTOP` until the guard is dropped.
struct Frozen(u32);

impl Frozen {
    fn stop(pid: u32) -> Frozen {
        let status = std::process::Command::new("kill").args(["-STOP", &pid.to_string()]).status().unwrap();
        assert!(status.success(), "SIGSTOP {pid}");
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill").args(["-CONT", &self.0.to_string()]).status();
    }
}

/// `WAIT` counts the replicas that acknowledged the writes of *the connection it is sent on*;
/// on a connection that never wrote it answers at once. The replica is frozen (`SIGSTOP`): it
/// stays connected but acknowledges nothing new, so no grant can be acknowledged. The
/// acquire's reply is lost (the proxy in front of the master drops it and closes the
/// connection): the script is resent on a new connection, where it finds its own grant.
/// That grant must not be counted as acknowledged (issue 33, item 8, the reconnect case).
/// This passed before the fix too: Redis sets a connection's replication offset after every
/// command, and the resent script runs on the new connection before `WAIT` (only a
/// connection that ran nothing since the grant answers 1 at once). The swap case, which was
/// real, is the next test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acks_count_the_connection_that_carried_the_grant() {
    let group = sentinels();
    let (master, replica) = group.servers();
    let proxy = FaultProxy::start(master.addr()).await.unwrap();
    let config = RedisConfig::new(format!("redis://{}", proxy.addr())).with_replica_acks(1, Duration::from_millis(300));
    let svc = RedisLockService::connect_with(config).await.unwrap();
    let key = ResourceKey::new("sentinel", "acked").unwrap();
    let ttl = Ttl::from_millis(30_000).unwrap();
    let grant = svc.try_acquire(&key, ttl).await.unwrap().expect("acknowledged while the replica runs");
    svc.release(&grant).await.unwrap();

    let frozen = Frozen::stop(replica.pid().unwrap());
    let e = svc.try_acquire(&key, ttl).await.unwrap_err();
    assert!(e.to_string().contains("reached 0 of 1 replicas"), "a frozen replica acknowledges nothing: {e}");

    proxy.lose_next_reply();
    let resent = svc.try_acquire(&key, ttl).await;
    assert_eq!(proxy.lost_replies(), 1, "the acquire's reply was lost");
    match resent {
        Ok(grant) => panic!(
            "a grant no replica acknowledged was returned as acknowledged (fence {:?}): WAIT ran on a \
             connection that never carried it",
            grant.map(|g| g.fence())
        ),
        Err(e) => assert!(e.to_string().contains("reached 0 of 1 replicas"), "{e}"),
    }
    drop(frozen);
    // The unacknowledged grant was released: the lock is free at once.
    let plain = RedisLockService::connect(&master.redis_url()).await.unwrap();
    let again = plain.try_acquire(&key, ttl).await.unwrap().expect("the unacknowledged grant was released");
    plain.release(&again).await.unwrap();
}

/// Points every Sentinel of `group` at `master` for the group's name, with no failover for a
/// minute (the address may be a proxy the test partitions).
async fn name_master(group: &RedisSentinels, master: std::net::SocketAddr) {
    let url = group.url();
    let hosts = url.trim_start_matches("redis+sentinel://").split('/').next().unwrap().to_string();
    for sentinel in hosts.split(',') {
        let client = redis::Client::open(format!("redis://{sentinel}")).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let ask = |args: &[String]| redis::cmd("SENTINEL").arg(args).clone();
        let name = SENTINEL_MASTER_NAME.to_string();
        let _: redis::Value = ask(&["REMOVE".into(), name.clone()]).query_async(&mut conn).await.unwrap();
        let monitor = ["MONITOR".into(), name.clone(), master.ip().to_string(), master.port().to_string(), "2".into()];
        let _: () = ask(&monitor).query_async(&mut conn).await.unwrap();
        let quiet = ["SET".into(), name, "down-after-milliseconds".into(), "60000".into()];
        let _: () = ask(&quiet).query_async(&mut conn).await.unwrap();
    }
}

/// The swap of item 8 (issue 33): the service moves to another master (another task's
/// `follow_master`) while an acquire's script is on its way to the old one. Its `WAIT` must
/// count the replicas of the master that carried the grant, whose replica is frozen: 0.
///
/// The Sentinels name the master through proxy P0; two other acquires, D then B 1.2 s
/// later, hang there (P0 is partitioned). The Sentinels then name the same master through
/// proxy P1: D's request times out, D follows to P1. Acquire A goes out on P1, slowed to
/// 1 s each way, and the Sentinels name a second master M2, whose replica runs: B's request
/// times out while A's is in flight, and B follows to M2. A's reply then arrives, granted on
/// the first master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acks_count_the_master_that_carried_the_grant_across_a_swap() {
    let group = sentinels();
    let other = sentinels(); // M2 and its replica
    let (m1, r1) = group.servers();
    let (p0, p1) = (FaultProxy::start(m1.addr()).await.unwrap(), FaultProxy::start(m1.addr()).await.unwrap());
    name_master(&group, p0.addr()).await;
    let mut config = RedisConfig::new(format!("{}?wait_replicas=1&wait_timeout_ms=300", group.url()));
    config.response_timeout = Duration::from_secs(4);
    let svc = Arc::new(RedisLockService::connect_with(config).await.unwrap());
    let ttl = Ttl::from_millis(30_000).unwrap();
    let key = |name: &str| ResourceKey::new("sentinel", format!("swap-{name}")).unwrap();
    let grant = svc.try_acquire(&key("warm"), ttl).await.unwrap().expect("acknowledged while the replica runs");
    svc.release(&grant).await.unwrap();

    let _frozen = Frozen::stop(r1.pid().unwrap());
    p0.partition();
    let hang = |name: &'static str| {
        let svc = Arc::clone(&svc);
        tokio::spawn(async move { svc.try_acquire(&key(name), ttl).await.map(|g| g.is_some()) })
    };
    // D's request times out 4 s after it went out (the response timeout), B's 1.2 s later.
    let sent = tokio::time::Instant::now();
    let d = hang("d");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let b = hang("b");
    name_master(&group, p1.addr()).await;
    // D has followed to P1 (its request timed out at 4 s); B's times out at 5.2 s, while A's,
    // sent now, is on its way (its script's reply comes back at 6.6 s, `WAIT`'s at 7.6 s).
    tokio::time::sleep_until(sent + Duration::from_millis(4600)).await;
    p1.set_delay(Duration::from_secs(1));
    name_master(&group, other.servers().0.addr()).await;

    let a = svc.try_acquire(&key("a"), ttl).await;
    p1.set_delay(Duration::ZERO);
    p0.heal();
    let _ = (d.await.unwrap(), b.await.unwrap());
    // A's script ran on the first master only (its lock is there, not on M2).
    let holds = |addr: std::net::SocketAddr| async move {
        let client = redis::Client::open(format!("redis://{addr}")).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        redis::cmd("EXISTS").arg(key("a").lock_key()).query_async::<i64>(&mut conn).await.unwrap()
    };
    assert_eq!(holds(other.servers().0.addr()).await, 0, "A's script ran on M2: the swap came too early");
    match a {
        Ok(grant) => panic!(
            "a grant no replica of its master acknowledged was returned as acknowledged ({:?}, lock on the \
             first master: {}): WAIT ran on the master the service moved to meanwhile",
            grant.map(|g| g.fence()),
            holds(m1.addr()).await
        ),
        Err(e) => assert!(e.to_string().contains("reached 0 of 1 replicas"), "{e}"),
    }
}

/// Release notifications follow the master (issue 33, item 9). After a failover the waiter's
/// service subscribes on the promoted replica, and a contended acquire does not wait for a
/// subscription to the old master's address, which is now a black hole (it accepts
/// connections and never answers): the subscription used to stay on the first master, and
/// every contended acquire then waited up to 1 s for it to come up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_notifications_follow_the_master_after_a_failover() {
    let mut group = sentinels();
    let old_master = group.servers().0.addr();
    let holder = RedisLockService::connect(&group.url()).await.unwrap();
    let waiter = Arc::new(RedisLockService::connect(&group.url()).await.unwrap());
    let key = ResourceKey::new("sentinel", "handoff").unwrap();
    common::handoff(&holder, &waiter, &key).await; // the waiter's service subscribes on the first master

    group.kill_master();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while group.master_port().is_none_or(|port| port == old_master.port()) {
        assert!(tokio::time::Instant::now() < deadline, "no promotion in 30 s:\n{}", group.sentinel_logs(30));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let new_master = group.master_port().unwrap();
    // Both services follow the failover.
    for svc in [&holder, &*waiter] {
        loop {
            match svc.try_acquire(&key, Ttl::from_millis(5_000).unwrap()).await {
                Ok(Some(grant)) => break svc.release(&grant).await.unwrap(),
                Ok(None) => panic!("{key} is held"),
                Err(e) => assert!(tokio::time::Instant::now() < deadline, "no grant after the failover: {e}"),
            }
        }
    }
    let hole = common::black_hole(old_master).await;

    let mut handoffs = Vec::new();
    for _ in 0..3 {
        handoffs.push(common::handoff(&holder, &waiter, &key).await);
    }
    let client = redis::Client::open(format!("redis://127.0.0.1:{new_master}")).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let patterns: i64 = redis::cmd("PUBSUB").arg("NUMPAT").query_async(&mut conn).await.unwrap();
    // The subscription stays: it answers the listener's PINGs, it is not made again each time.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let clients: String = redis::cmd("CLIENT").arg("LIST").query_async(&mut conn).await.unwrap();
    let subscriber = clients.lines().find(|c| c.contains(" psub=1 ")).expect("a pattern subscriber");
    let age: u64 = subscriber.split(" age=").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    hole.abort();
    assert!(age >= 2 && subscriber.contains(" cmd=ping "), "the subscriber: {subscriber}");
    println!("after the failover: handoffs took {handoffs:?} from release to grant");
    assert_eq!(patterns, 1, "the waiter's release subscription is not on the promoted master");
    let total: Duration = handoffs.iter().sum();
    assert!(
        total < Duration::from_millis(1500),
        "three handoffs after the failover took {handoffs:?} from release to grant"
    );
}

/// What a failover can lose: the replica, cut off from the master by a network partition
/// (and its replication link closed, so that no retransmission brings it back), misses the
/// last grants; the master dies; the Sentinels promote the replica, whose fence
/// counter is behind what the store has accepted. A plain grant's write is then refused (a
/// fence regression never lets a write through), and `lock_checked` sees the regression,
/// moves the counter past the store's watermark, and its write lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_that_lost_the_last_fences_is_refused_then_repaired_by_lock_checked() {
    use palisade_core::{FencedStore, FencedStoreExt, WriteBatch};
    use palisade_lab::netns::Lab;
    use palisade_lab::servers::Site;

    let lab = Lab::new().expect("a lab (root and iproute2)");
    let replica_host = lab.host().unwrap();
    let mut group = RedisSentinels::start_at(
        &require_env("PALISADE_REDIS_SERVER"),
        &Site::address(lab.gateway()),
        &Site::host(&replica_host),
    )
    .expect("master, replica on its own host, three sentinels");
    let replica_port = group.servers().1.port();
    let dir = tempfile::tempdir().unwrap();
    let store =
        palisade_sqlite::SqliteStore::connect(&format!("sqlite://{}/data.db", dir.path().display())).await.unwrap();
    let locks = Arc::new(RedisLockService::connect(&group.url()).await.unwrap());
    let key = ResourceKey::new("sentinel", "tail").unwrap();
    let options = LockOptions::ttl(Duration::from_secs(5)).wait(Duration::from_secs(5));
    let put = |who: &str| WriteBatch::new().put("sentinel/tail", who.as_bytes().to_vec());

    let first = locks.lock_checked(&store, &key, options).await.unwrap();
    store.write(&first, &put("replicated")).await.unwrap();
    first.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // the replica has it

    replica_host.cut().unwrap();
    group.disconnect_replica().unwrap();
    let mut tail = Vec::new();
    for _ in 0..3 {
        let lease = locks.lock(&key, options).await.unwrap();
        store.write(&lease, &put("tail")).await.unwrap();
        tail.push(lease.fence());
        lease.release().await.unwrap();
    }
    let last = *tail.last().unwrap();
    group.kill_master();
    replica_host.heal().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while group.master_port() != Some(replica_port) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Sentinels did not promote the replica in 30 s:\n{}",
            group.sentinel_logs(30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The service follows the failover; the promoted replica's counter is behind.
    let plain = loop {
        match locks.lock(&key, options).await {
            Ok(lease) => break lease,
            Err(e) => {
                assert!(e.is_retryable() || e.kind() == ErrorKind::OutcomeUnknown, "{e}");
                assert!(tokio::time::Instant::now() < deadline, "no grant after the failover: {e}");
            }
        }
    };
    assert!(plain.fence() <= last, "the promoted replica kept the tail (fence {} after {last})", plain.fence());
    let refused = store.write(&plain, &put("regressed")).await.unwrap_err();
    assert_eq!(refused.stale_fence_details(), Some((plain.fence(), last)), "{refused}");
    plain.release().await.unwrap();

    let checked = locks.lock_checked(&store, &key, options).await.unwrap();
    assert!(checked.fence() > last, "lock_checked gave fence {} after the lost tail's {last}", checked.fence());
    store.write(&checked, &put("repaired")).await.unwrap();
    checked.release().await.unwrap();
    let value = store.read("sentinel/tail").await.unwrap().unwrap().value;
    assert_eq!(value, b"repaired");
}
