//! A transaction for the user's own statements, opened under a fence.

use palisade_core::{Fence, ResourceKey, Result};
use sqlx::{PgConnection, Postgres, Transaction};

use crate::store::map_err;

/// An open PostgreSQL transaction whose first statement accepted the fence (and holds the
/// resource's watermark row locked until it ends).
///
/// Run your statements on [`conn`](Self::conn), then [`commit`](Self::commit). Dropping it
/// without committing rolls everything back, the watermark raise included.
#[derive(Debug)]
pub struct PgFencedTransaction {
    tx: Transaction<'static, Postgres>,
    resource: ResourceKey,
    fence: Fence,
}

impl PgFencedTransaction {
    pub(crate) fn new(tx: Transaction<'static, Postgres>, resource: ResourceKey, fence: Fence) -> Self {
        PgFencedTransaction { tx, resource, fence }
    }

    /// The connection to run your statements on (`.execute(tx.conn())`).
    pub fn conn(&mut self) -> &mut PgConnection {
        &mut self.tx
    }

    /// The resource whose watermark this transaction raised.
    pub fn resource(&self) -> &ResourceKey {
        &self.resource
    }

    /// The fence this transaction writes under.
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
