//! A transaction for the user's own statements, opened under a fence.

use palisade_core::{Fence, ResourceKey, Result};
use sqlx::{Sqlite, SqliteConnection, Transaction};
use tokio::sync::OwnedMutexGuard;

use crate::db::map_err;

/// An open SQLite transaction whose first statement accepted the fence.
///
/// Run your statements on [`conn`](Self::conn), then [`commit`](Self::commit). Dropping it
/// without committing rolls everything back, the watermark raise included.
#[derive(Debug)]
pub struct FencedTransaction {
    tx: Transaction<'static, Sqlite>,
    /// The first of `fences`.
    resource: ResourceKey,
    fence: Fence,
    /// Every resource whose watermark it raised, with its fence, in canonical order (one for
    /// `begin_fenced`, the set's for `begin_fenced_all`).
    fences: Vec<(ResourceKey, Fence)>,
    /// This process's writers queue behind an open transaction (see `SqliteStore`).
    _writer: OwnedMutexGuard<()>,
}

impl FencedTransaction {
    /// `first` and `rest`: the resources whose watermarks it raised, in canonical order.
    pub(crate) fn new(
        tx: Transaction<'static, Sqlite>,
        first: (ResourceKey, Fence),
        rest: Vec<(ResourceKey, Fence)>,
        writer: OwnedMutexGuard<()>,
    ) -> Self {
        let mut fences = Vec::with_capacity(rest.len() + 1);
        fences.push(first.clone());
        fences.extend(rest);
        FencedTransaction { tx, resource: first.0, fence: first.1, fences, _writer: writer }
    }

    /// The connection to run your statements on (`.execute(tx.conn())`).
    pub fn conn(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }

    /// The resource whose watermark this transaction raised (under `begin_fenced_all`, the
    /// first of the set in canonical order: see [`fences`](Self::fences)).
    pub fn resource(&self) -> &ResourceKey {
        &self.resource
    }

    /// Every resource whose watermark this transaction raised, with the fence it writes under,
    /// in canonical (sorted) order: one for `begin_fenced`, the whole set for `begin_fenced_all`.
    pub fn fences(&self) -> &[(ResourceKey, Fence)] {
        &self.fences
    }

    /// The fence this transaction writes under for `resource`, if it raised that resource's
    /// watermark: what to put in the fence column of that resource's rows.
    pub fn fence_of(&self, resource: &ResourceKey) -> Option<Fence> {
        self.fences.iter().find(|(r, _)| r == resource).map(|(_, f)| *f)
    }

    /// The fence this transaction writes under (store it on your rows if you like); under
    /// `begin_fenced_all`, the first resource's (see [`fence_of`](Self::fence_of)).
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// Commits your statements and the watermark raise together.
    pub async fn commit(self) -> Result<()> {
        self.tx.commit().await.map_err(map_err)
    }

    /// Rolls everything back.
    pub async fn rollback(self) -> Result<()> {
        self.tx.rollback().await.map_err(map_err)
    }
}

/// A write transaction for your own statements (`BEGIN IMMEDIATE`), queued behind this
/// process's other writers of the file: from [`SqliteStore::begin`](crate::SqliteStore::begin).
///
/// Run fenced statements on [`conn`](Self::conn) with
/// [`check_fence_in`](crate::SqliteStore::check_fence_in) or
/// [`update_row_fenced_in`](crate::SqliteStore::update_row_fenced_in), and your own beside
/// them; then [`commit`](Self::commit). Dropping it rolls everything back.
#[derive(Debug)]
pub struct WriteTransaction {
    tx: Transaction<'static, Sqlite>,
    _writer: OwnedMutexGuard<()>,
}

impl WriteTransaction {
    pub(crate) fn new(tx: Transaction<'static, Sqlite>, writer: OwnedMutexGuard<()>) -> Self {
        WriteTransaction { tx, _writer: writer }
    }

    /// The connection to run your statements on.
    pub fn conn(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }

    /// Commits everything the transaction did.
    pub async fn commit(self) -> Result<()> {
        self.tx.commit().await.map_err(map_err)
    }

    /// Rolls everything back.
    pub async fn rollback(self) -> Result<()> {
        self.tx.rollback().await.map_err(map_err)
    }
}
