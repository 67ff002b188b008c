//! Property tests of the pure parts: the store's verdicts against the watermark rule for any
//! sequence of writes, TTL and deadline arithmetic (no overflow, `safe_until` never past what
//! the server can have), the backoff's bounds, resource keys (a valid one round-trips, an
//! invalid one is a typed error), and URL redaction (the password never survives).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

mod checks; // the properties, stated once for these tests and the fuzz targets

use std::time::Duration;

use palisade_core::spi::{Backoff, encode_userinfo};
use palisade_core::{
    ErrorKind, Fence, FencedStore, GrantFence, GrantId, LockOptions, LockServiceExt, MemoryFencedStore,
    MemoryLockService, ResourceKey, Ttl, WriteBatch,
};
use proptest::prelude::*;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// The watermark rule (FENCING.md rules 1 and 2) as a reference: `Ok` if the write with
/// `fence` from `grant` is accepted after the accepted writes that left `watermark`.
fn rule(watermark: Option<(u64, u8)>, fence: u64, grant: u8) -> Result<(), &'static str> {
    match watermark {
        _ if fence == 0 => Err("invalid"),
        None => Ok(()),
        Some((w, _)) if fence > w => Ok(()),
        Some((w, by)) if fence == w && by == grant => Ok(()),
        Some((w, _)) if fence == w => Err("duplicate"),
        Some(_) => Err("stale"),
    }
}

/// Any duration, the extremes included (`Duration::MAX`, zero, just past `u64::MAX` ns).
fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        Just(Duration::from_nanos(u64::MAX)),
        (0u64..=u64::MAX).prop_map(Duration::from_nanos),
        (0u64..=u64::MAX, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any sequence of writes (fences 0–5 from 3 grants): the store accepts exactly what the
    /// rule accepts, refuses the rest with the right kind, and its watermark is the last
    /// accepted write's fence.
    #[test]
    fn the_store_follows_the_watermark_rule(writes in prop::collection::vec((0u64..6, 0u8..3), 1..24)) {
        runtime().block_on(async {
            let store = MemoryFencedStore::new();
            let key = ResourceKey::new("prop", "k").unwrap();
            let mut watermark: Option<(u64, u8)> = None;
            for (fence, grant) in writes {
                let id = GrantId::from_slice(&[grant + 1; 16]).unwrap();
                let batch = WriteBatch::new().put("prop/value", vec![grant]);
                let result = store.apply(&key, GrantFence::new(Fence::new(fence), id), &batch).await;
                match (rule(watermark, fence, grant), result) {
                    (Ok(()), Ok(())) => watermark = Some((fence, grant)),
                    (Err("stale"), Err(e)) => prop_assert!(matches!(e.kind(), ErrorKind::StaleFence { .. }), "{e}"),
                    (Err("duplicate"), Err(e)) => {
                        prop_assert!(matches!(e.kind(), ErrorKind::DuplicateFence { .. }), "{e}")
                    }
                    (Err("invalid"), Err(_)) => {}
                    (expected, got) => prop_assert!(false, "fence {fence} from grant {grant} after {watermark:?}: rule {expected:?}, store {got:?}"),
                }
                let stored = store.watermark(&key).await.unwrap();
                prop_assert_eq!(stored, watermark.map(|(w, _)| Fence::new(w)));
            }
            Ok(())
        })?;
    }

    /// A TTL is valid exactly between its bounds; its rounded milliseconds never undercut it
    /// (a server told fewer milliseconds would expire the lock early); its drift margin is
    /// positive and at most half of it.
    #[test]
    fn ttl_bounds_rounding_and_margin(nanos in 0u64..(25 * 3600 * 1_000_000_000)) {
        let d = Duration::from_nanos(nanos);
        let valid = (Ttl::MIN..=Ttl::MAX).contains(&d);
        let ttl = Ttl::new(d);
        prop_assert_eq!(ttl.is_ok(), valid);
        if let Ok(ttl) = ttl {
            let ms = ttl.as_millis_ceil();
            prop_assert!(Duration::from_millis(ms) >= d);
            prop_assert!(Duration::from_millis(ms) < d + Duration::from_millis(1));
            let margin = ttl.drift_margin();
            prop_assert!(margin > Duration::ZERO && margin <= d / 2);
        }
    }

    /// Backoff with any bounds: never panics, the first delay is at most `first`, every later
    /// one at most the larger of `first` and `max`, and the ceiling reaches `max`.
    #[test]
    fn backoff_stays_within_its_bounds(first in any_duration(), max in any_duration(), steps in 1usize..80) {
        let mut backoff = Backoff::with_bounds(first, max);
        let top = first.max(max);
        for i in 0..steps {
            let delay = backoff.next_delay();
            if i == 0 {
                prop_assert!(delay <= first.max(Duration::from_nanos(1)), "first delay {delay:?} above {first:?}");
            }
            prop_assert!(delay <= top.max(Duration::from_nanos(1)), "delay {delay:?} above {top:?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any TTL: a lease's `safe_until` and `deadline` are never later than the request's send
    /// time plus the TTL (the earliest the server can expire it), and never overflow.
    #[test]
    fn safe_until_is_never_past_the_servers_expiry(ms in 1u64..(24 * 3600 * 1000)) {
        runtime().block_on(async {
            let locks = std::sync::Arc::new(MemoryLockService::new());
            let key = ResourceKey::new("prop", "ttl").unwrap();
            let ttl = Duration::from_millis(ms);
            let sent = tokio::time::Instant::now();
            let lease = locks.lock(&key, LockOptions::ttl(ttl)).await.unwrap();
            prop_assert!(lease.deadline() <= tokio::time::Instant::now() + ttl);
            prop_assert!(lease.deadline() >= sent + ttl);
            prop_assert!(lease.safe_until() <= lease.deadline());
            prop_assert!(lease.safe_until() + lease.ttl().drift_margin() >= lease.deadline());
            lease.release().await.unwrap();
            Ok(())
        })?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Any domain and id: a valid key round-trips through its text and keeps its parts; an
    /// invalid one is `InvalidKey`, never a panic.
    #[test]
    fn resource_keys_round_trip_or_are_refused(
        domain in prop_oneof!["[a-zA-Z0-9._-]{0,70}", "\\PC{0,40}"],
        id in prop_oneof!["[a-zA-Z0-9._-]{0,300}", "\\PC{0,40}"],
    ) {
        checks::resource_key_round_trips(&domain, &id).map_err(TestCaseError::fail)?;
        checks::resource_key_text(&format!("{domain}:{id}")).map_err(TestCaseError::fail)?;
    }

    /// Any scheme, hosts and password, percent-encoded or raw, in the user-info or the query:
    /// the redacted URL contains neither the password nor its encoding.
    #[test]
    fn redaction_never_keeps_the_password(
        scheme in prop::sample::select(vec![
            "redis", "rediss", "redis+sentinel", "redis+cluster", "redlock", "etcd", "etcds", "zk",
            "postgres", "postgresql", "dynamodb", "sqlite", "memory", "x-custom",
        ]),
        user in "[a-z]{0,8}",
        password in "[A-Z!#$%&*+=~@/?:;, \\[\\]]{4,20}",
        hosts in prop::collection::vec("[a-z0-9.]{1,10}(:[0-9]{1,5})?", 1..4),
        path in "(/[a-z0-9]{0,8})?",
        encoded in any::<bool>(),
        in_query in any::<bool>(),
    ) {
        let secret =
            if encoded { encode_userinfo(Some(&user), Some(&password)) } else { format!("{user}:{password}@") };
        let url = if in_query {
            format!("{scheme}://{}{path}?user={user}&password={password}", hosts.join(","))
        } else {
            format!("{scheme}://{secret}{}{path}", hosts.join(","))
        };
        checks::redaction_hides_password(&url, &password).map_err(TestCaseError::fail)?;
    }
}
