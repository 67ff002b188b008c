//! The scenarios, by area: each an `async fn` over the factories, listed in the
//! [registry](crate::registry) with the guarantee it checks.

pub mod cluster;
pub mod e2e;
pub mod election;
pub mod frozen;
pub mod liveness;
pub mod lock;
pub mod multi;
pub mod partition;
pub mod primitives;
pub mod rwlock;
pub mod semaphore;
pub mod store;
