use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;

use crate::error::Result;
use crate::store::{canonical_fences, conflict_error, fence_refusal, storable_fence, validate_record_key};
use crate::{
    Fence, FencedStore, GrantFence, InspectStore, Listing, Record, ResourceKey, WatermarkView, WriteBatch, WriteOp,
};

const BACKEND: &str = "memory";

/// An in-process fenced store: watermarks and records in one mutex, so the fence check and the
/// write are one atomic step by construction.
#[derive(Debug, Default)]
pub struct MemoryFencedStore {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The highest fence accepted per resource, with the grant that presented it.
    watermarks: HashMap<ResourceKey, GrantFence>,
    records: BTreeMap<String, Record>,
}

impl MemoryFencedStore {
    /// An empty store.
    pub fn new() -> Self {
        MemoryFencedStore::default()
    }

    /// Applies `batch` under `fences` (canonical order; none: unfenced), in one step under
    /// the mutex: every fence is judged before anything changes.
    fn apply_ops(&self, fences: &[(ResourceKey, GrantFence)], batch: &WriteBatch) -> Result<()> {
        batch.validate()?;
        for (_, f) in fences {
            storable_fence(BACKEND, f.fence())?;
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        for (resource, presented) in fences {
            if let Some(&current) = state.watermarks.get(resource)
                && let Some(refusal) = fence_refusal(BACKEND, *presented, current.fence(), Some(current.grant()))
            {
                return Err(refusal.with_resource(resource.clone()));
            }
        }
        // Conditions see the state before the batch (see `WriteBatch`).
        for op in batch.ops() {
            let holds = match op {
                WriteOp::Create { key, .. } => !state.records.contains_key(key),
                WriteOp::Check { key, expected } => state.records.get(key).map(|r| &r.value) == expected.as_ref(),
                WriteOp::Put { .. } | WriteOp::Delete { .. } => true,
            };
            if !holds {
                return Err(conflict_error(BACKEND, op));
            }
        }
        for (resource, presented) in fences {
            state.watermarks.insert(resource.clone(), *presented);
        }
        let record_fence = fences.last().map(|(_, f)| f.fence());
        for op in batch.ops() {
            match op {
                WriteOp::Put { key, value } | WriteOp::Create { key, value } => {
                    state.records.insert(key.clone(), Record { value: value.clone(), fence: record_fence });
                }
                WriteOp::Delete { key } => {
                    state.records.remove(key);
                }
                WriteOp::Check { .. } => {}
            }
        }
        Ok(())
    }
}

#[async_trait]
impl FencedStore for MemoryFencedStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn apply(&self, resource: &ResourceKey, fence: GrantFence, batch: &WriteBatch) -> Result<()> {
        self.apply_ops(&[(resource.clone(), fence)], batch)
    }

    async fn apply_all(&self, fences: &[(ResourceKey, GrantFence)], batch: &WriteBatch) -> Result<()> {
        self.apply_ops(&canonical_fences(BACKEND, fences)?, batch)
    }

    async fn apply_unfenced(&self, batch: &WriteBatch) -> Result<()> {
        self.apply_ops(&[], batch)
    }

    async fn watermark(&self, resource: &ResourceKey) -> Result<Option<Fence>> {
        Ok(self.state.lock().unwrap_or_else(PoisonError::into_inner).watermarks.get(resource).map(GrantFence::fence))
    }

    async fn read(&self, key: &str) -> Result<Option<Record>> {
        validate_record_key(key)?;
        Ok(self.state.lock().unwrap_or_else(PoisonError::into_inner).records.get(key).cloned())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Record)>> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(state
            .records
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect())
    }
}

#[async_trait]
impl InspectStore for MemoryFencedStore {
    async fn watermarks(&self, prefix: &str) -> Result<Listing<(ResourceKey, WatermarkView)>> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut marks: Vec<(ResourceKey, WatermarkView)> = state
            .watermarks
            .iter()
            .filter(|(k, _)| k.to_string().starts_with(prefix))
            .map(|(k, f)| (k.clone(), WatermarkView::new(f.fence(), Some(f.grant()))))
            .collect();
        marks.sort_by_cached_key(|(k, _)| k.to_string());
        Ok(Listing::of(marks))
    }

    async fn watermark_view(&self, resource: &ResourceKey) -> Result<Option<WatermarkView>> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(state.watermarks.get(resource).map(|f| WatermarkView::new(f.fence(), Some(f.grant()))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn res() -> ResourceKey {
        ResourceKey::new("alloc", "WH-01").unwrap()
    }

    /// Fence `f` as grant `g` presents it.
    fn gf(f: u64, g: u8) -> GrantFence {
        GrantFence::new(Fence::new(f), crate::GrantId::from_bytes([g; 16]))
    }

    #[tokio::test]
    async fn the_view_shows_each_watermark_and_the_grant_that_set_it() {
        let s = MemoryFencedStore::new();
        assert_eq!(s.watermark_view(&res()).await.unwrap(), None);
        s.apply(&res(), gf(4, 7), &WriteBatch::new().put("k", b"v".to_vec())).await.unwrap();
        let mark = WatermarkView::new(Fence::new(4), Some(gf(4, 7).grant()));
        assert_eq!(s.watermark_view(&res()).await.unwrap(), Some(mark));
        let listed = s.watermarks("").await.unwrap();
        assert_eq!(listed.entries, vec![(res(), mark)]);
        assert!(s.watermarks("zzz").await.unwrap().entries.is_empty());
    }

    #[tokio::test]
    async fn equal_accepted_lower_rejected_data_untouched() {
        let s = MemoryFencedStore::new();
        s.apply(&res(), gf(5, 1), &WriteBatch::new().put("k", b"a".to_vec())).await.unwrap();
        s.apply(&res(), gf(5, 1), &WriteBatch::new().put("k", b"b".to_vec())).await.unwrap();
        let err = s.apply(&res(), gf(4, 2), &WriteBatch::new().put("k", b"c".to_vec())).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::StaleFence { presented: Fence::new(4), current: Fence::new(5) });
        let r = s.read("k").await.unwrap().unwrap();
        assert_eq!((r.value.as_slice(), r.fence), (&b"b"[..], Some(Fence::new(5))));
        assert_eq!(s.watermark(&res()).await.unwrap(), Some(Fence::new(5)));
    }

    /// Rule 2: the lock service issued fence 5 twice (it lost part of its counter). The second
    /// grant's write is refused as a duplicate, and the first grant may go on writing.
    #[tokio::test]
    async fn equal_fence_from_another_grant_is_a_duplicate() {
        let s = MemoryFencedStore::new();
        s.apply(&res(), gf(5, 1), &WriteBatch::new().put("k", b"a".to_vec())).await.unwrap();
        let err = s.apply(&res(), gf(5, 2), &WriteBatch::new().put("k", b"b".to_vec())).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::DuplicateFence { fence: Fence::new(5) });
        assert_eq!(s.read("k").await.unwrap().unwrap().value, b"a");
        s.apply(&res(), gf(5, 1), &WriteBatch::new().put("k", b"c".to_vec())).await.unwrap();
        s.apply(&res(), gf(6, 2), &WriteBatch::new().put("k", b"d".to_vec())).await.unwrap();
        let err = s.apply(&res(), gf(6, 1), &WriteBatch::new()).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::DuplicateFence { fence: Fence::new(6) });
    }

    #[tokio::test]
    async fn failed_condition_writes_nothing_and_keeps_watermark() {
        let s = MemoryFencedStore::new();
        s.apply(&res(), gf(1, 1), &WriteBatch::new().put("done/1", b"x".to_vec())).await.unwrap();
        let batch = WriteBatch::new().put("other", b"y".to_vec()).create("done/1", b"z".to_vec());
        let err = s.apply(&res(), gf(2, 2), &batch).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Conflict);
        assert!(s.read("other").await.unwrap().is_none());
        assert_eq!(s.watermark(&res()).await.unwrap(), Some(Fence::new(1)));
        assert_eq!(s.list("done/").await.unwrap().len(), 1);
    }
}
