//! The test factory of this backend (feature `conformance`): what its own certification and
//! any other crate's pairing test use, so no test writes it twice.

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::{LockServiceFactory, Timing, lock_factory};

use crate::TemplateLockService;

/// Independent clients of one service, with the `break_lock` and `view` hooks. A server-backed backend
/// reads its server's address here with `palisade_conformance::require_env` and adds
/// `with_faulty_client` (a client dialing `palisade_conformance::proxy::proxy_url(url)`).
pub fn factory() -> impl LockServiceFactory<Service = TemplateLockService> {
    let service = Arc::new(TemplateLockService::new());
    let (broken, viewed) = (Arc::clone(&service), Arc::clone(&service));
    lock_factory(Timing::new(Duration::from_millis(200), Duration::from_millis(50)), move || {
        std::future::ready(Ok(Arc::clone(&service)))
    })
    // The service lives in this process: a holder in a process of its own reaches it through
    // the suite's loopback relay. A server-backed service drops this line.
    .via_relay()
    .with_break_lock(move |key| {
        broken.break_lock(&key);
        std::future::ready(Ok(()))
    })
    // The read-only view `palisade inspect` shows: your service itself, or a connection of its own.
    .with_view(move || std::future::ready(Ok(Arc::clone(&viewed) as Arc<dyn palisade_core::InspectLocks>)))
}
