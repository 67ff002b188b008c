//! In-process reference implementations: the semantics every other backend must match.
//!
//! They are always compiled. They coordinate tasks of one process only, so they are for
//! tests, examples and single-process deployments; they also make the whole flow runnable
//! with no server.

mod lock;
mod store;

pub use lock::MemoryLockService;
pub use store::MemoryFencedStore;
