//! `palisade doctor`'s checks of a ZooKeeper ensemble: its voting members, as its own
//! `/zookeeper/config` lists them, and the session timeout the servers agreed to. Reads only
//! (the session it asks about is the one every connection keeps).

use async_trait::async_trait;
use palisade_core::{Check, Diagnose, Result, Verdict};
use tokio::time::timeout;
use zookeeper_client as zk;

use crate::BACKEND;
use crate::service::ZkLockService;

const AVAILABLE: &str = "locks are granted while a minority of servers is down";
const BOUNDED: &str = "a holder that dies loses its locks one session timeout after it last reached the ensemble";

/// The node where ZooKeeper (3.5 and later) keeps the ensemble's configuration.
const CONFIG_NODE: &str = "/zookeeper/config";

#[async_trait]
impl Diagnose for ZkLockService {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn diagnose(&self) -> Result<Vec<Check>> {
        let client = self.client().await?;
        let request = self.config().request_timeout;
        let ensemble = match timeout(request, client.get_data(CONFIG_NODE)).await {
            Err(_) => return Err(crate::service::timed_out("doctor", false)),
            Ok(Ok((data, _))) => ensemble_size(&String::from_utf8_lossy(&data)),
            Ok(Err(zk::Error::NoNode | zk::Error::NoAuth)) => None,
            Ok(Err(e)) => return Err(crate::service::map(e, "doctor", false)),
        };
        Ok(vec![ensemble_check(ensemble), session_timeout(self.config().session_timeout, client.session_timeout())])
    }
}

/// The voting members a `/zookeeper/config` text lists (`server.N=host:p:p[:participant|:observer][;client]`):
/// `Some(0)` for the empty text of a standalone server, `None` if it lists none in a form
/// known here.
fn ensemble_size(config: &str) -> Option<usize> {
    let servers: Vec<&str> = config.lines().filter(|l| l.trim_start().starts_with("server.")).collect();
    if servers.is_empty() {
        return config.trim().is_empty().then_some(0).or_else(|| config.contains("version=").then_some(0));
    }
    Some(servers.iter().filter(|l| !l.split(';').next().unwrap_or("").ends_with(":observer")).count())
}

fn ensemble_check(voters: Option<usize>) -> Check {
    match voters {
        None => Check::new(
            "ensemble size",
            Verdict::Warn,
            format!("cannot tell: {CONFIG_NODE} is not readable here (ZooKeeper before 3.5, or an ACL)"),
            AVAILABLE,
        ),
        Some(n) => palisade_core::spi::majority_group(
            "ensemble size",
            n.max(1),
            "voting server",
            "a lone server's lost disk loses the zxids the fences are made of (lock_checked moves past the stores' \
             watermarks)",
            AVAILABLE,
        ),
    }
}

fn session_timeout(asked: std::time::Duration, agreed: std::time::Duration) -> Check {
    let ms = |d: std::time::Duration| d.as_millis();
    if agreed > asked {
        Check::new(
            "session timeout",
            Verdict::Warn,
            format!(
                "asked for {} ms, the servers agreed to {} ms (their minSessionTimeout, 2 ticks unless set): a holder \
                 that dies keeps its locks {} ms; lower minSessionTimeout or tickTime, or ask for {} ms",
                ms(asked),
                ms(agreed),
                ms(agreed),
                ms(agreed)
            ),
            BOUNDED,
        )
    } else if agreed < asked {
        Check::new(
            "session timeout",
            Verdict::Warn,
            format!(
                "asked for {} ms, the servers agreed to only {} ms (their maxSessionTimeout, 20 ticks unless set): a \
                 holder cut off from the ensemble for {} ms loses its locks (it is fenced, and stops); raise \
                 maxSessionTimeout or ask for {} ms",
                ms(asked),
                ms(agreed),
                ms(agreed),
                ms(agreed)
            ),
            BOUNDED,
        )
    } else {
        Check::new("session timeout", Verdict::Pass, format!("{} ms, as asked", ms(agreed)), BOUNDED)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn ensemble_sizes_from_the_config_node() {
        assert_eq!(ensemble_size(""), Some(0));
        let three = "server.1=127.0.0.1:2888:3888:participant;0.0.0.0:2181\n\
                     server.2=127.0.0.1:2889:3889:participant;0.0.0.0:2182\n\
                     server.3=127.0.0.1:2890:3890:participant;0.0.0.0:2183\nversion=100000000";
        assert_eq!(ensemble_size(three), Some(3));
        let observed = format!("{three}\nserver.4=127.0.0.1:2891:3891:observer;0.0.0.0:2184");
        assert_eq!(ensemble_size(&observed), Some(3));
        assert_eq!(ensemble_size("something else"), None);
        assert_eq!(ensemble_check(Some(3)).verdict, Verdict::Pass);
        assert_eq!(ensemble_check(Some(0)).verdict, Verdict::Warn);
        assert_eq!(ensemble_check(Some(4)).verdict, Verdict::Warn);
        assert_eq!(ensemble_check(None).verdict, Verdict::Warn);
    }

    #[test]
    fn session_timeouts() {
        let s = Duration::from_secs;
        assert_eq!(session_timeout(s(10), s(10)).verdict, Verdict::Pass);
        assert_eq!(session_timeout(s(3), s(20)).verdict, Verdict::Warn);
        assert_eq!(session_timeout(s(60), s(40)).verdict, Verdict::Warn);
    }
}
