//! `palisade doctor`'s checks of an etcd cluster: its size, its alarms, whether its history is
//! compacted, and the TTL the cluster gives a session lease. Reads, but for one lease of the
//! session's TTL, granted and revoked at once: etcd raises a TTL below its minimum without a
//! word, and only the TTL it grants shows it (every client of the service grants such a lease).

use async_trait::async_trait;
use etcd_client::{AlarmAction, AlarmType, GetOptions};
use palisade_core::{Check, Diagnose, Result, Verdict};

use crate::BACKEND;
use crate::errors::with_failover;
use crate::service::EtcdLockService;

const AVAILABLE: &str = "locks are granted while a minority of members is down";
const DURABLE: &str = "fences never go back across a member's loss";
const WRITABLE: &str = "locks can be granted at all";
const BOUNDED: &str = "a holder that dies loses its locks one session TTL after its last keep-alive";

/// A history kept whole for more revisions than this, never compacted, is a cluster growing
/// until its space quota stops every write.
const UNCOMPACTED_REVISIONS: i64 = 100_000;

#[async_trait]
impl Diagnose for EtcdLockService {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn diagnose(&self) -> Result<Vec<Check>> {
        let inner = self.inner();
        let timeout = inner.config.request_timeout;
        let members = with_failover(timeout, "doctor: member list", false, true, || {
            let mut cluster = inner.client.cluster_client();
            async move { cluster.member_list().await }
        })
        .await?;
        let voters = members.members().iter().filter(|m| !m.is_learner()).count();
        let alarms = with_failover(timeout, "doctor: alarms", false, true, || {
            let mut maintenance = inner.client.maintenance_client();
            async move { maintenance.alarm(AlarmAction::Get, AlarmType::None, None).await }
        })
        .await?;
        let alarms: Vec<AlarmType> = alarms.alarms().iter().map(|a| a.alarm()).collect();
        // Revision 1 is readable until the first compaction removes it.
        let first = {
            let mut kv = inner.client.kv_client();
            let options = GetOptions::new().with_revision(1).with_count_only();
            tokio::time::timeout(timeout, kv.get(inner.config.key_prefix.as_bytes().to_vec(), Some(options))).await
        };
        let status = with_failover(timeout, "doctor: status", false, true, || {
            let mut maintenance = inner.client.maintenance_client();
            async move { maintenance.status().await }
        })
        .await?;
        let revision = status.header().map_or(0, |h| h.revision());
        let compacted = match first {
            Ok(Ok(_)) => Some(false),
            Ok(Err(e)) if e.to_string().contains("compacted") => Some(true),
            _ => None,
        };
        // The lease the session would hold: granted (the one write here, which every client
        // makes), asked how long it lasts, and revoked.
        let granted = with_failover(timeout, "doctor: a session lease", true, false, || {
            let mut lease = inner.client.lease_client();
            let ttl = i64::try_from(inner.config.session_ttl.as_secs()).unwrap_or(i64::MAX);
            async move { lease.grant(ttl, None).await }
        })
        .await;
        let ttl_check = match granted {
            Ok(lease) => {
                let id = lease.id();
                let _ = with_failover(timeout, "doctor: revoke the lease", true, true, || {
                    let mut lease = inner.client.lease_client();
                    async move { lease.revoke(id).await }
                })
                .await;
                lease_ttl(inner.config.session_ttl.as_secs(), lease.ttl())
            }
            Err(e) => Check::new(
                "session lease TTL",
                Verdict::Warn,
                format!("cannot tell: the cluster granted no lease ({})", e.report()),
                BOUNDED,
            ),
        };
        Ok(vec![
            cluster_size(voters),
            alarm_check(&alarms, status.db_size(), status.db_size_quota()),
            compaction(compacted, revision),
            ttl_check,
        ])
    }
}

fn cluster_size(voters: usize) -> Check {
    palisade_core::spi::majority_group(
        "cluster size",
        voters,
        "voting member",
        "a lone member's lost disk loses every fence counter (the stores refuse the fences issued again, and \
         lock_checked moves past them)",
        AVAILABLE,
    )
}

fn alarm_check(alarms: &[AlarmType], db_size: i64, quota: i64) -> Check {
    let used = if quota > 0 {
        format!(" (database {} MiB of a {} MiB quota)", db_size >> 20, quota >> 20)
    } else {
        String::new()
    };
    if alarms.contains(&AlarmType::Nospace) {
        return Check::new(
            "alarms",
            Verdict::Fail,
            format!(
                "NOSPACE{used}: the cluster refuses every write, so no lock is granted or released; compact, \
                 defragment and disarm the alarm (etcdctl alarm disarm), then turn on auto-compaction"
            ),
            WRITABLE,
        );
    }
    if alarms.contains(&AlarmType::Corrupt) {
        return Check::new(
            "alarms",
            Verdict::Fail,
            "CORRUPT: a member's data differs from the others'; replace that member before trusting its counters",
            DURABLE,
        );
    }
    if quota > 0 && db_size * 5 > quota * 4 {
        return Check::new(
            "alarms",
            Verdict::Warn,
            format!("none, but the database is over 80 % of its quota{used}: at the quota every write stops"),
            WRITABLE,
        );
    }
    Check::new("alarms", Verdict::Pass, format!("none{used}"), WRITABLE)
}

fn compaction(compacted: Option<bool>, revision: i64) -> Check {
    match compacted {
        Some(true) => Check::new(
            "compaction",
            Verdict::Pass,
            format!("the history is compacted (revision 1 is gone; now at {revision})"),
            WRITABLE,
        ),
        Some(false) if revision > UNCOMPACTED_REVISIONS => Check::new(
            "compaction",
            Verdict::Warn,
            format!(
                "never compacted: all {revision} revisions are kept, and every acquire and release adds some; the \
                 database grows until its space quota stops every write (a million-job run grew etcd to 2 GB); set \
                 --auto-compaction-mode and --auto-compaction-retention"
            ),
            WRITABLE,
        ),
        Some(false) => Check::new(
            "compaction",
            Verdict::Warn,
            format!(
                "not compacted yet ({revision} revisions kept): either the cluster is young or auto-compaction is off; \
                 without it the database grows until its space quota stops every write; check \
                 --auto-compaction-retention"
            ),
            WRITABLE,
        ),
        None => Check::new(
            "compaction",
            Verdict::Warn,
            "cannot tell: reading revision 1 failed for another reason",
            WRITABLE,
        ),
    }
}

fn lease_ttl(asked_s: u64, granted_s: i64) -> Check {
    let asked = i64::try_from(asked_s).unwrap_or(i64::MAX);
    if granted_s > asked {
        Check::new(
            "session lease TTL",
            Verdict::Warn,
            format!(
                "asked for {asked} s, granted {granted_s} s: etcd raises a lease to its minimum (one and a half \
                 election timeouts), so a holder that dies keeps its locks {granted_s} s; lower --election-timeout or \
                 raise session_ttl_s to match"
            ),
            BOUNDED,
        )
    } else {
        Check::new("session lease TTL", Verdict::Pass, format!("{granted_s} s, as asked"), BOUNDED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(cluster_size(1).verdict, Verdict::Warn);
        assert_eq!(cluster_size(2).verdict, Verdict::Warn);
        assert_eq!(cluster_size(3).verdict, Verdict::Pass);
        assert_eq!(cluster_size(4).verdict, Verdict::Warn);
        assert_eq!(cluster_size(5).verdict, Verdict::Pass);
    }

    #[test]
    fn alarms_and_quota() {
        assert_eq!(alarm_check(&[], 10, 0).verdict, Verdict::Pass);
        assert_eq!(alarm_check(&[AlarmType::Nospace], 10, 0).verdict, Verdict::Fail);
        assert_eq!(alarm_check(&[AlarmType::Corrupt], 10, 0).verdict, Verdict::Fail);
        assert_eq!(alarm_check(&[], 81, 100).verdict, Verdict::Warn);
        assert_eq!(alarm_check(&[], 79, 100).verdict, Verdict::Pass);
    }

    #[test]
    fn compaction_and_ttl() {
        assert_eq!(compaction(Some(true), 5).verdict, Verdict::Pass);
        assert_eq!(compaction(Some(false), 5).verdict, Verdict::Warn);
        assert!(compaction(Some(false), 200_000).found.starts_with("never compacted"));
        assert_eq!(lease_ttl(10, 10).verdict, Verdict::Pass);
        assert_eq!(lease_ttl(1, 2).verdict, Verdict::Warn);
    }
}
