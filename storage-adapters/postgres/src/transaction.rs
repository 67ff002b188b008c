//! A transaction for the user's own statements, opened under a fence.

use palisade_core::{Error, ErrorKind, Fence, ResourceKey, Result};
use sqlx::{PgConnection, Postgres, Transaction};

use crate::db::{BACKEND, map_commit_err, map_err};

/// An open PostgreSQL transaction whose first statement accepted the fence (and holds the
/// resource's watermark row locked until it ends).
///
/// Run your statements on [`conn`](Self::conn), then [`commit`](Self::commit). Dropping it
/// without committing rolls everything back, the watermark raise included.
#[derive(Debug)]
pub struct PgFencedTransaction {
    tx: Transaction<'static, Postgres>,
    /// The first of `fences`.
    resource: ResourceKey,
    fence: Fence,
    /// Every resource whose watermark it raised, with its fence, in canonical order (one for
    /// `begin_fenced`, the set's for `begin_fenced_all`).
    fences: Vec<(ResourceKey, Fence)>,
}

impl PgFencedTransaction {
    /// `first` and `rest`: the resources whose watermarks it raised, in canonical order.
    pub(crate) fn new(
        tx: Transaction<'static, Postgres>,
        first: (ResourceKey, Fence),
        rest: Vec<(ResourceKey, Fence)>,
    ) -> Self {
        let mut fences = Vec::with_capacity(rest.len() + 1);
        fences.push(first.clone());
        fences.extend(rest);
        PgFencedTransaction { tx, resource: first.0, fence: first.1, fences }
    }

    /// The connection to run your statements on (`.execute(tx.conn())`).
    pub fn conn(&mut self) -> &mut PgConnection {
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

    /// The fence this transaction writes under; under `begin_fenced_all`, the first
    /// resource's (see [`fence_of`](Self::fence_of)).
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// Commits your statements and the watermark raise together.
    ///
    /// Behavior:
    /// - If one of your statements failed (even one whose error you ignored), PostgreSQL has
    ///   aborted the transaction and would answer COMMIT with a silent ROLLBACK: this returns
    ///   [`ErrorKind::Backend`] (not retryable) and nothing, not even the watermark, is written.
    ///   It costs one short statement before the COMMIT.
    /// - A COMMIT whose reply is lost (the connection broke after it was sent) is
    ///   [`ErrorKind::OutcomeUnknown`]: re-read before retrying.
    pub async fn commit(mut self) -> Result<()> {
        // In an aborted transaction every statement but COMMIT/ROLLBACK fails with 25P02.
        if let Err(e) = sqlx::query("SELECT 1").execute(&mut *self.tx).await {
            let aborted = matches!(&e, sqlx::Error::Database(db) if db.code().as_deref() == Some("25P02"));
            let _ = self.tx.rollback().await;
            if aborted {
                return Err(Error::new(
                    ErrorKind::Backend,
                    BACKEND,
                    "a statement in the fenced transaction failed, so PostgreSQL aborted it: nothing was committed, not even the watermark",
                )
                .with_retryable(false));
            }
            return Err(map_err(e));
        }
        self.tx.commit().await.map_err(map_commit_err)
    }

    /// Rolls everything back.
    pub async fn rollback(self) -> Result<()> {
        self.tx.rollback().await.map_err(map_err)
    }
}
