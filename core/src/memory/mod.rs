//! In-process reference implementations: the semantics every other backend must match.
//!
//! They are always compiled. They coordinate tasks of one process only, so they are for
//! tests, examples and single-process deployments; they also make the whole flow runnable
//! with no server.

mod lock;
mod store;

pub use lock::MemoryLockService;
pub use store::MemoryFencedStore;

/// The one check of an in-process service or store: there is no server to configure, and
/// nothing outlives the process.
mod diagnose {
    use async_trait::async_trait;

    use super::{MemoryFencedStore, MemoryLockService};
    use crate::diagnose::{Check, Diagnose, Verdict};
    use crate::error::Result;

    fn in_process(what: &str) -> Vec<Check> {
        vec![Check::new(
            "in-process",
            Verdict::Warn,
            format!(
                "an in-process {what}: other processes do not share it, and it goes with this process, its fences \
                 with it; for tests, examples and single-process tools, not a deployment of several processes"
            ),
            "locks exclude every process of the deployment, and fences never go back",
        )]
    }

    #[async_trait]
    impl Diagnose for MemoryLockService {
        fn backend(&self) -> &'static str {
            "memory"
        }

        async fn diagnose(&self) -> Result<Vec<Check>> {
            Ok(in_process("lock service"))
        }
    }

    #[async_trait]
    impl Diagnose for MemoryFencedStore {
        fn backend(&self) -> &'static str {
            "memory"
        }

        async fn diagnose(&self) -> Result<Vec<Check>> {
            Ok(in_process("store"))
        }
    }
}
