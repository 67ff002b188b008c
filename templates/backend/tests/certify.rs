//! The template's certification: one line. `cargo test -p palisade-backend-template --features
//! conformance` runs every scenario of the registry its declarations call for.

use palisade_backend_template::conformance::factory;
use palisade_conformance::memory::MemoryStoreFactory;

palisade_conformance::certify!(template: lock_service = factory(), store = MemoryStoreFactory::new());
