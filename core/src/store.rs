//! The fenced store contract: the store, not the clock, decides whether a write is stale.

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;

use crate::error::{Error, ErrorKind, Result};
use crate::{Fence, GrantFence, GrantId, ResourceKey};

/// The longest record key, in bytes.
pub const MAX_RECORD_KEY_LEN: usize = 512;
/// The largest record value, in bytes.
pub const MAX_RECORD_VALUE_LEN: usize = 64 * 1024;

/// A store that applies writes only when they carry a fence at least as high as any fence it
/// has accepted for the resource.
///
/// This is the portable, record-level surface that every store implements and the
/// conformance suite checks. Stores also offer native APIs for the user's own statements
/// (for example `palisade_sqlite::SqliteStore::begin_fenced`), with the same guarantees.
///
/// Records are a flat key space (`String` keys, byte values) shared by all resources; the
/// fence watermark is kept per [`ResourceKey`]. Users normally call
/// [`FencedStoreExt::write`](crate::FencedStoreExt::write) with a lease.
#[async_trait]
pub trait FencedStore: Send + Sync + 'static {
    /// The store's short name (`"sqlite"`, `"postgres"`), used in errors and metric labels.
    fn backend(&self) -> &'static str;

    /// Applies `batch` under `fence` for `resource`, atomically.
    ///
    /// Behavior:
    /// - The batch is validated first ([`WriteBatch::validate`]); a fence above
    ///   [`Fence::MAX_STORABLE`], or 0 (never issued), is [`ErrorKind::InvalidArgument`].
    /// - If the fence is lower than the resource's watermark (the highest fence accepted for
    ///   it), nothing is written and the result is [`ErrorKind::StaleFence`] with the presented
    ///   fence and the watermark.
    /// - The store remembers which grant set the watermark. An **equal** fence is accepted from
    ///   that same grant (one grant writes many times) and refused from any other with
    ///   [`ErrorKind::DuplicateFence`]: the lock service issued one fence twice. A watermark
    ///   stored before grants were recorded accepts an equal fence and records its grant.
    /// - Otherwise the watermark becomes the fence and its grant, and the operations apply in
    ///   order, in the **same** transaction as the check. Each written record remembers the
    ///   fence.
    /// - If any `Create` or `Check` does not hold, nothing is written (the watermark included)
    ///   and the result is [`ErrorKind::Conflict`].
    /// - All or nothing: no partial batch is ever visible, whatever fails.
    /// - `Ok(())` means applied. Zero rows updated is never reported as success.
    async fn apply(&self, resource: &ResourceKey, fence: GrantFence, batch: &WriteBatch) -> Result<()>;

    /// Applies `batch` under one fence per resource (a [`MultiLease`](crate::MultiLease)'s
    /// [`fences`](crate::MultiLease::fences)), atomically: the write of a job that moves
    /// something from one resource to another.
    ///
    /// Behavior (checked by the conformance suite's `multi_write_all_or_nothing`):
    /// - The fences are validated first ([`canonical_fences`](crate::spi::canonical_fences)):
    ///   none, more than [`MAX_FENCES_PER_WRITE`](crate::spi::MAX_FENCES_PER_WRITE), a resource
    ///   given twice, or a fence no store holds is [`ErrorKind::InvalidArgument`]; so is a batch
    ///   [`WriteBatch::validate`] refuses, or one the store cannot apply as one transaction
    ///   (DynamoDB: more than 100 items).
    /// - **Every** resource's fence is judged by the rules of [`apply`](FencedStore::apply),
    ///   in canonical (sorted) order. If any is refused, nothing is written (no record, no
    ///   watermark of any resource) and the error is that resource's refusal
    ///   ([`ErrorKind::StaleFence`], [`ErrorKind::DuplicateFence`], or with
    ///   [`requires_live_lock`](FencedStore::requires_live_lock) [`ErrorKind::NotHolder`]),
    ///   naming it in [`Error::resource`].
    /// - Otherwise every watermark is raised to its fence and grant and the operations apply,
    ///   in one transaction with the checks. Each written record remembers the fence of the
    ///   last resource in canonical order (records belong to no one resource).
    /// - A failed `Create` or `Check` is [`ErrorKind::Conflict`] with nothing written.
    /// - With one fence it is exactly [`apply`](FencedStore::apply).
    async fn apply_all(&self, fences: &[(ResourceKey, GrantFence)], batch: &WriteBatch) -> Result<()>;

    /// Whether fenced writes also require their lock to be **live**: a store in the same
    /// database as its lock service (PostgreSQL's `require_live_lock`) can check the lock's own
    /// row in the write's transaction, and keep it from being granted again until the commit.
    ///
    /// Behavior when `true` (checked by the conformance suite's `live_lock_when_declared`):
    /// besides the rules of [`apply`](FencedStore::apply), a write whose grant no longer holds
    /// the lock is refused with nothing written, even before any newer holder wrote: with
    /// [`ErrorKind::StaleFence`] when a newer grant took the lock, [`ErrorKind::NotHolder`] when
    /// it expired with nobody after it. When `false` (the default), fencing orders writes and
    /// does not judge liveness: an expired holder's write is accepted until a newer fence is.
    fn requires_live_lock(&self) -> bool {
        false
    }

    /// Applies `batch` without any fence check and without touching watermarks: the incident's
    /// naive lock, kept for efficiency locks (which have no fence) and for comparisons.
    ///
    /// Behavior: like [`apply`](FencedStore::apply) minus the fence; records written this way
    /// carry no fence.
    async fn apply_unfenced(&self, batch: &WriteBatch) -> Result<()>;

    /// The highest fence accepted for `resource`, or `None` if it has never been written.
    async fn watermark(&self, resource: &ResourceKey) -> Result<Option<Fence>>;

    /// Reads one record.
    async fn read(&self, key: &str) -> Result<Option<Record>>;

    /// Reads several records: one answer per key, in the order of `keys` (`None` for a missing
    /// record; a key given twice is answered twice).
    ///
    /// Behavior: the same answers as [`read`](FencedStore::read) of each key. An invalid key is
    /// [`ErrorKind::InvalidKey`] and nothing is read. Stores that can send the reads as
    /// one request do (PostgreSQL: one statement); the provided method reads one key after
    /// another.
    async fn read_many(&self, keys: &[&str]) -> Result<Vec<Option<Record>>> {
        for key in keys {
            crate::spi::validate_record_key(key)?;
        }
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            out.push(self.read(key).await?);
        }
        Ok(out)
    }

    /// Reads every record whose key starts with `prefix`, in key order.
    async fn list(&self, prefix: &str) -> Result<Vec<(String, Record)>>;
}

/// Where [`lock_checked`](crate::LockServiceExt::lock_checked) reads the highest fence a
/// resource has accepted, to compare a fresh grant with it (fencing rule 5).
///
/// Every [`FencedStore`] is one (its per-resource watermark). Fences that live elsewhere are
/// too: a row of your own table written with a single-row helper carries its fence in its own
/// column and never raises the store's watermark, so the store's watermark cannot show a
/// regression for it; `palisade_postgres::PostgresStore::row_watermark` reads that column.
#[async_trait]
pub trait WatermarkSource: Send + Sync {
    /// A short name for logs and errors (the store's [`backend`](FencedStore::backend)).
    fn source_name(&self) -> &'static str;

    /// The highest fence accepted for `resource`, or `None` if nothing was written under one.
    async fn highest_fence(&self, resource: &ResourceKey) -> Result<Option<Fence>>;
}

#[async_trait]
impl<T: FencedStore + ?Sized> WatermarkSource for T {
    fn source_name(&self) -> &'static str {
        self.backend()
    }
    async fn highest_fence(&self, resource: &ResourceKey) -> Result<Option<Fence>> {
        self.watermark(resource).await
    }
}

/// A fenced store behind a pointer: what `palisade::connect_store` returns.
pub type DynFencedStore = dyn FencedStore;

#[async_trait]
impl<T: FencedStore + ?Sized> FencedStore for Arc<T> {
    fn backend(&self) -> &'static str {
        (**self).backend()
    }
    async fn apply(&self, resource: &ResourceKey, fence: GrantFence, batch: &WriteBatch) -> Result<()> {
        (**self).apply(resource, fence, batch).await
    }
    async fn apply_all(&self, fences: &[(ResourceKey, GrantFence)], batch: &WriteBatch) -> Result<()> {
        (**self).apply_all(fences, batch).await
    }
    fn requires_live_lock(&self) -> bool {
        (**self).requires_live_lock()
    }
    async fn apply_unfenced(&self, batch: &WriteBatch) -> Result<()> {
        (**self).apply_unfenced(batch).await
    }
    async fn watermark(&self, resource: &ResourceKey) -> Result<Option<Fence>> {
        (**self).watermark(resource).await
    }
    async fn read(&self, key: &str) -> Result<Option<Record>> {
        (**self).read(key).await
    }
    async fn read_many(&self, keys: &[&str]) -> Result<Vec<Option<Record>>> {
        (**self).read_many(keys).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<(String, Record)>> {
        (**self).list(prefix).await
    }
}

/// A stored record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The value bytes.
    pub value: Vec<u8>,
    /// The fence of the write that stored it (`None` for unfenced writes).
    pub fence: Option<Fence>,
}

/// One operation in a [`WriteBatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOp {
    /// Stores `value` at `key`, replacing any previous value.
    Put {
        /// The record key.
        key: String,
        /// The new value.
        value: Vec<u8>,
    },
    /// Stores `value` at `key`, which must not exist yet ([`ErrorKind::Conflict`] otherwise).
    /// This is how "is job J already done?" goes inside the fenced transaction (fencing rule 3).
    Create {
        /// The record key.
        key: String,
        /// The value.
        value: Vec<u8>,
    },
    /// Deletes `key` if it exists.
    Delete {
        /// The record key.
        key: String,
    },
    /// Requires `key` to hold exactly `expected` (`None`: to be absent), or the batch fails with
    /// [`ErrorKind::Conflict`]. Guards a read-modify-write against a write that slipped in
    /// between the read and this batch.
    Check {
        /// The record key.
        key: String,
        /// The value it must hold, or `None` for "must not exist".
        expected: Option<Vec<u8>>,
    },
}

impl WriteOp {
    /// The key the operation touches.
    pub fn key(&self) -> &str {
        match self {
            WriteOp::Put { key, .. }
            | WriteOp::Create { key, .. }
            | WriteOp::Delete { key }
            | WriteOp::Check { key, .. } => key,
        }
    }
}

/// An ordered list of record operations applied all or nothing.
///
/// Conditions (`Check`, and the absence `Create` requires) are evaluated against the state
/// **before** the batch, so a `Check` and a `Put` of the same key form a compare-and-swap.
///
/// ```
/// use palisade_core::WriteBatch;
///
/// let batch = WriteBatch::new()
///     .check("stock/WH-01/SKU-1", Some(b"10".to_vec()))
///     .put("stock/WH-01/SKU-1", b"9".to_vec())
///     .create("done/job-17", b"1".to_vec());
/// assert_eq!(batch.len(), 3);
/// assert!(batch.validate().is_ok());
/// // A key may be written once per batch (DynamoDB transactions allow no more).
/// assert!(batch.clone().put("done/job-17", vec![]).validate().is_err());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteBatch {
    ops: Vec<WriteOp>,
}

impl WriteBatch {
    /// The most operations one batch may hold (DynamoDB's transaction limit, less the fence item,
    /// rounded down).
    pub const MAX_OPS: usize = 64;

    /// An empty batch.
    pub fn new() -> Self {
        WriteBatch::default()
    }

    /// Appends an operation.
    pub fn push(mut self, op: WriteOp) -> Self {
        self.ops.push(op);
        self
    }

    /// Appends [`WriteOp::Put`].
    pub fn put(self, key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.push(WriteOp::Put { key: key.into(), value: value.into() })
    }

    /// Appends [`WriteOp::Create`].
    pub fn create(self, key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.push(WriteOp::Create { key: key.into(), value: value.into() })
    }

    /// Appends [`WriteOp::Delete`].
    pub fn delete(self, key: impl Into<String>) -> Self {
        self.push(WriteOp::Delete { key: key.into() })
    }

    /// Appends [`WriteOp::Check`].
    pub fn check(self, key: impl Into<String>, expected: Option<Vec<u8>>) -> Self {
        self.push(WriteOp::Check { key: key.into(), expected })
    }

    /// The operations in order.
    pub fn ops(&self) -> &[WriteOp] {
        &self.ops
    }

    /// How many operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Checks the batch every store must refuse: more than [`WriteBatch::MAX_OPS`] operations,
    /// a key written twice or checked twice, a malformed key ([`ErrorKind::InvalidKey`]) or an
    /// oversized value. A key may be checked and written in one batch (read-modify-write).
    /// An empty batch is valid: it only checks and raises the watermark.
    pub fn validate(&self) -> Result<()> {
        if self.ops.len() > Self::MAX_OPS {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "core",
                format!("write batch has {} operations; at most {} are allowed", self.ops.len(), Self::MAX_OPS),
            ));
        }
        let mut written = HashSet::with_capacity(self.ops.len());
        let mut checked = HashSet::new();
        for op in &self.ops {
            validate_record_key(op.key())?;
            let seen = if matches!(op, WriteOp::Check { .. }) { &mut checked } else { &mut written };
            if !seen.insert(op.key()) {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    "core",
                    format!("record key {:?} is written (or checked) twice in one write batch", op.key()),
                ));
            }
            if let WriteOp::Put { value, .. } | WriteOp::Create { value, .. } = op
                && value.len() > MAX_RECORD_VALUE_LEN
            {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    "core",
                    format!("record value of {} bytes exceeds {MAX_RECORD_VALUE_LEN}", value.len()),
                ));
            }
        }
        Ok(())
    }
}

/// Checks a record key: non-empty, at most [`MAX_RECORD_KEY_LEN`] bytes, no control characters.
pub fn validate_record_key(key: &str) -> Result<()> {
    let why = if key.is_empty() {
        "record key is empty".to_string()
    } else if key.len() > MAX_RECORD_KEY_LEN {
        format!("record key is {} bytes; at most {MAX_RECORD_KEY_LEN} are allowed", key.len())
    } else if key.chars().any(char::is_control) {
        "record key contains a control character".to_string()
    } else {
        return Ok(());
    };
    Err(Error::new(ErrorKind::InvalidKey, "core", why))
}

/// Checks a table or column name for a SQL store and returns it double-quoted: 1–63 ASCII
/// letters, digits or `_`, not starting with a digit (PostgreSQL's limit; SQLite accepts it
/// too). Anything else is [`ErrorKind::InvalidConfig`], so a configured name can never carry
/// SQL.
pub fn quote_sql_identifier(backend: &'static str, name: &str) -> Result<String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        return Err(Error::new(
            ErrorKind::InvalidConfig,
            backend,
            format!("identifier {name:?} must be 1-63 ASCII letters, digits or '_', not starting with a digit"),
        ));
    }
    Ok(format!("\"{name}\""))
}

/// Converts a fence for a signed 64-bit column, or explains why a store cannot take it: above
/// [`Fence::MAX_STORABLE`], or 0, which no lock service issues (fences start at 1), so a 0 is
/// an uninitialised fence, never a grant's.
pub fn storable_fence(backend: &'static str, fence: Fence) -> Result<i64> {
    if fence.get() == 0 {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            backend,
            "fence 0 is never issued by a lock service (fences start at 1): an uninitialised fence",
        ));
    }
    fence.to_i64().ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidArgument,
            backend,
            format!("fence {fence} is above the largest storable fence {}", Fence::MAX_STORABLE),
        )
    })
}

/// Fencing rule 2 in one place, for store authors: whether a write presenting `presented` may
/// pass a resource whose watermark is `watermark`, set by the grant `watermark_grant` (`None`
/// when the store has no record of it).
///
/// Returns the refusal ([`ErrorKind::StaleFence`] or [`ErrorKind::DuplicateFence`]) or `None`
/// when the write may proceed. A store must still check and raise the watermark atomically with
/// the write (rule 1); this function is its reference, and how SQL stores explain a statement
/// that changed zero rows.
pub fn fence_refusal(
    backend: &'static str,
    presented: GrantFence,
    watermark: Fence,
    watermark_grant: Option<GrantId>,
) -> Option<Error> {
    let fence = presented.fence();
    if fence < watermark {
        return Some(Error::stale_fence(backend, fence, watermark));
    }
    match watermark_grant {
        Some(grant) if fence == watermark && grant != presented.grant() => Some(Error::duplicate_fence(backend, fence)),
        _ => None,
    }
}

/// Why a store's conditional watermark update changed nothing: the [`fence_refusal`] for the
/// watermark it then read, or, if that would have passed (the watermark moved in between, which
/// an atomic store rules out), an [`ErrorKind::Backend`] error naming the resource.
pub fn explain_refusal(
    backend: &'static str,
    resource: &ResourceKey,
    presented: GrantFence,
    watermark: Fence,
    watermark_grant: Option<GrantId>,
) -> Error {
    fence_refusal(backend, presented, watermark, watermark_grant)
        .unwrap_or_else(|| {
            Error::new(
                ErrorKind::Backend,
                backend,
                format!("the watermark of {resource} refused fence {presented} for no known reason"),
            )
        })
        .with_resource(resource.clone())
}

/// The refusal of a write whose lock is not live where the store looks for it (a store that
/// [requires a live lock](FencedStore::requires_live_lock), in the same database as its lock
/// service): `presented` is the write's resource and fence (`None` when the caller's
/// transaction did not say), `lock` the fence and grant the lock's own row shows (`None`: no
/// row). A newer grant took the lock: the [`fence_refusal`] a store that had accepted that
/// grant's write would give ([`ErrorKind::StaleFence`]). Otherwise the lock expired with nobody
/// after it, or never was from `lock_table`: [`ErrorKind::NotHolder`].
pub fn lock_not_live(
    backend: &'static str,
    lock_table: &str,
    presented: Option<(&ResourceKey, GrantFence)>,
    lock: Option<(Fence, Option<GrantId>)>,
) -> Error {
    if let (Some((resource, fence)), Some((current, grant))) = (presented, lock)
        && current > fence.fence()
    {
        return explain_refusal(backend, resource, fence, current, grant);
    }
    let (what, fence) = presented.map_or((String::from("?"), 0), |(r, f)| (r.to_string(), f.fence().get()));
    let refusal = Error::new(
        ErrorKind::NotHolder,
        backend,
        format!(
            "write refused: the lock on {what} (fence {fence}) is not live in {lock_table} (it expired, was taken \
             over, or was not taken from its lock service); nothing written"
        ),
    );
    match presented {
        Some((resource, _)) => refusal.with_resource(resource.clone()),
        None => refusal,
    }
}

/// The most resources one [`FencedStore::apply_all`] may fence.
pub const MAX_FENCES_PER_WRITE: usize = 64;

/// Checks the fences of an [`apply_all`](FencedStore::apply_all) and returns them in canonical
/// (resource-sorted) order, the order every store checks and locks them in, so two writes
/// over overlapping sets cannot deadlock on the store's watermark rows.
///
/// Refused with [`ErrorKind::InvalidArgument`], before anything is sent: no fence, more than
/// [`MAX_FENCES_PER_WRITE`], a resource given twice, or a fence no store can hold (0 or above
/// [`Fence::MAX_STORABLE`]).
pub fn canonical_fences(
    backend: &'static str,
    fences: &[(ResourceKey, GrantFence)],
) -> Result<Vec<(ResourceKey, GrantFence)>> {
    if fences.is_empty() {
        return Err(Error::new(ErrorKind::InvalidArgument, backend, "a multi-resource write needs at least one fence"));
    }
    if fences.len() > MAX_FENCES_PER_WRITE {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            backend,
            format!("a write fences {} resources; at most {MAX_FENCES_PER_WRITE} are allowed", fences.len()),
        ));
    }
    let mut sorted = fences.to_vec();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(pair) = sorted.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            backend,
            format!("resource {} is fenced twice in one write", pair[0].0),
        ));
    }
    for (_, fence) in &sorted {
        storable_fence(backend, fence.fence())?;
    }
    Ok(sorted)
}

/// The [`ErrorKind::Conflict`] error for a failed `Create` or `Check`.
pub fn conflict_error(backend: &'static str, op: &WriteOp) -> Error {
    let what = match op {
        WriteOp::Create { key, .. } => format!("record {key:?} already exists"),
        WriteOp::Check { key, expected: None } => format!("record {key:?} exists but must be absent"),
        WriteOp::Check { key, .. } => format!("record {key:?} changed since it was read"),
        other => format!("condition on {:?} failed", other.key()),
    };
    Error::new(ErrorKind::Conflict, backend, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_refuses_what_no_store_can_do() {
        assert!(WriteBatch::new().validate().is_ok());
        let too_many = (0..=WriteBatch::MAX_OPS).fold(WriteBatch::new(), |b, i| b.put(format!("k{i}"), vec![]));
        assert_eq!(too_many.validate().unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(WriteBatch::new().put("", vec![]).validate().unwrap_err().kind(), ErrorKind::InvalidKey);
        assert_eq!(WriteBatch::new().put("a\nb", vec![]).validate().unwrap_err().kind(), ErrorKind::InvalidKey);
        assert_eq!(
            WriteBatch::new().put("k", vec![0; MAX_RECORD_VALUE_LEN + 1]).validate().unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            WriteBatch::new().put("k", vec![]).delete("k").validate().unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            WriteBatch::new().check("k", None).check("k", None).validate().unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        assert!(WriteBatch::new().check("k", Some(b"1".to_vec())).put("k", b"2".to_vec()).validate().is_ok());
    }
}
