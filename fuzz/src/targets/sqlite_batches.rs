//! SQLite against the in-memory store, batch after batch, fenced (a few fences and grants, so
//! that the watermark rule and its equal-fence case come up) or not: both accept, or both
//! refuse with the same kind; both keep the same watermark; afterwards both hold the same
//! records, byte for byte.

use std::collections::HashSet;
use std::sync::LazyLock;

use crate::{OpSpec, batch, checks, grant_fence, runtime};
use arbitrary::Arbitrary;
use palisade_core::{FencedStore, MemoryFencedStore, ResourceKey};
use palisade_sqlite::SqliteStore;

/// One batch: unfenced (`None`), or under [`grant_fence`]'s fence and grant.
#[derive(Arbitrary, Debug)]
struct Step {
    ops: Vec<OpSpec>,
    fenced: Option<(u8, u8)>,
}

/// One in-memory database for the whole run (emptied before each input): opening one per input
/// would be most of the time spent. The clock runs: sqlx waits on threads.
static WORLD: LazyLock<(tokio::runtime::Runtime, SqliteStore)> = LazyLock::new(|| {
    let rt = runtime(false);
    let store = rt.block_on(SqliteStore::connect("sqlite::memory:")).unwrap_or_else(|e| panic!("sqlite: {e}"));
    (rt, store)
});

/// SQLite and the in-memory store, the same steps.
fn sqlite_against_memory(rt: &tokio::runtime::Runtime, sqlite: &SqliteStore, steps: &[Step]) {
    let memory = MemoryFencedStore::new();
    let resource = ResourceKey::new("fuzz", "r").unwrap_or_else(|e| panic!("{e}"));
    rt.block_on(async {
        for table in ["palisade_records", "palisade_fences"] {
            sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {table}")))
                .execute(sqlite.pool())
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let mut keys = HashSet::new();
        for (i, step) in steps.iter().enumerate() {
            let batch = batch(&step.ops);
            keys.extend(batch.ops().iter().map(|op| op.key().to_string()));
            let (s, m) = match grant_fence(step.fenced) {
                Some(f) => (sqlite.apply(&resource, f, &batch).await, memory.apply(&resource, f, &batch).await),
                None => (sqlite.apply_unfenced(&batch).await, memory.apply_unfenced(&batch).await),
            };
            assert_eq!(
                s.as_ref().map_err(|e| e.kind()),
                m.as_ref().map_err(|e| e.kind()),
                "step {i}: sqlite {s:?}, memory {m:?}"
            );
            assert_eq!(
                sqlite.watermark(&resource).await.ok(),
                memory.watermark(&resource).await.ok(),
                "step {i}: watermarks"
            );
        }
        for key in keys.iter().filter(|k| checks::record_key_validation(k).is_ok()) {
            let (s, m) = (sqlite.read(key).await, memory.read(key).await);
            assert_eq!(s.as_ref().ok(), m.as_ref().ok(), "{key:?}: sqlite {s:?}, memory {m:?}");
        }
    });
}

/// One fuzz input, decoded as libFuzzer's typed targets decode theirs ([`crate::decode`]).
pub fn run(data: &[u8]) {
    let Some(steps) = crate::decode::<Vec<Step>>(data) else { return };
    let (rt, sqlite) = &*WORLD;
    sqlite_against_memory(rt, sqlite, &steps[..steps.len().min(6)]);
}
