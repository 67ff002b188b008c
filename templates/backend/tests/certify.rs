//! The template's certification: one line. `cargo test -p palisade-backend-template` runs
//! every scenario of the registry its declarations call for. The store its holders write
//! through is a SQLite file other processes reach: its holders are frozen and killed in
//! processes of their own.

use palisade_backend_template::conformance::factory;

fn store() -> impl palisade_conformance::FencedStoreFactory {
    let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("palisade-template-certification.db");
    palisade_sqlite::conformance::store(palisade_sqlite::conformance::url(&file))
}

palisade_conformance::certify!(template: lock_service = factory(), store = store());
