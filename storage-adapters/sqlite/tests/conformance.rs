//! The SQLite store and lock service run the conformance suite: store scenarios, lock scenarios
//! (child processes open the same database file), and end to end both with the in-memory lock
//! service (whose child processes reach it through the suite's relay) and with the SQLite lock
//! service on the store's own file, plain and with every fenced write requiring a live lock.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::sync::Arc;
use std::time::Duration;

use palisade_conformance::memory::MemoryLockFactory;
use palisade_conformance::{FencedStoreFactory, LockServiceFactory, Restart, Timing};
use palisade_sqlite::{SqliteLockService, SqliteStore};

fn url() -> String {
    // A file per certification: a process frozen inside a write of one (its renewal, say) holds
    // the file, and must not stall another certification's scenarios.
    let (certification, _) = palisade_conformance::certify::current().unwrap_or(("none", ""));
    let file = format!("palisade-sqlite-conformance-{certification}.db");
    palisade_sqlite::conformance::url(&std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(file))
}

/// Independent clients (each its own pool) of the database file.
fn sqlite() -> impl FencedStoreFactory<Store = SqliteStore> {
    palisade_sqlite::conformance::store(url())
}

/// A store on the same file whose every fenced write requires its lock to be live.
fn sqlite_live() -> impl FencedStoreFactory<Store = SqliteStore> {
    palisade_sqlite::conformance::store(format!("{}&require_live_lock=true", url()))
}

/// Lock clients on the same file, each with its own pool, as separate processes would have.
fn sqlite_locks() -> impl LockServiceFactory<Service = SqliteLockService> {
    palisade_sqlite::conformance::service(url())
}

palisade_conformance::certify!(sqlite_store: fenced_store = sqlite(), lock_service = MemoryLockFactory::new());
palisade_conformance::certify!(sqlite: lock_service = sqlite_locks(), store = sqlite(), restartable = OwnFile::new());
palisade_conformance::certify!(sqlite_live_lock: pairing, lock_service = sqlite_locks(), store = sqlite_live());

/// The SQLite lock service on a database file of the restart scenario's own. Its "server" is
/// the file: a restart with data is new connections to it, a restart without data is the file
/// gone (a restore of nothing, a new machine), and the counters with it; a snapshot is a copy
/// of the file and its write-ahead log, and a restore puts the copy in place as new files
/// (clients made before keep the old ones open: they are another machine's).
struct OwnFile {
    path: std::path::PathBuf,
}

/// The database file and its write-ahead log (a copy needs both), and its shared-memory index.
const FILES: [&str; 3] = ["", "-wal", "-shm"];

impl OwnFile {
    fn new() -> Self {
        let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("palisade-sqlite-restart-{}.db", palisade_conformance::test_process_id()));
        OwnFile { path }
    }

    fn file(&self, suffix: &str, snapshot: bool) -> String {
        format!("{}{}{suffix}", self.path.display(), if snapshot { ".snapshot" } else { "" })
    }

    /// Removes the database's files, or the snapshot's.
    fn remove(&self, snapshot: bool) -> std::io::Result<()> {
        for suffix in FILES {
            match std::fs::remove_file(self.file(suffix, snapshot)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// Copies the database's files to the snapshot's (`to_snapshot`) or back, as new files.
    fn copy(&self, to_snapshot: bool) -> std::io::Result<()> {
        self.remove(to_snapshot)?;
        // The index is rebuilt from the log by the next connection.
        for suffix in ["", "-wal"] {
            match std::fs::copy(self.file(suffix, !to_snapshot), self.file(suffix, to_snapshot)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    fn url(&self) -> String {
        palisade_sqlite::conformance::url(&self.path)
    }
}

#[palisade_core::spi::async_trait]
impl LockServiceFactory for OwnFile {
    type Service = SqliteLockService;
    async fn client(&self) -> palisade_core::Result<Arc<SqliteLockService>> {
        Ok(Arc::new(SqliteLockService::connect(&self.url()).await?))
    }
    fn timing(&self) -> Timing {
        Timing::new(Duration::from_millis(500), Duration::from_millis(300))
    }
    async fn restart_server(&self, how: Restart) -> palisade_core::Result<()> {
        let done = match how {
            Restart::LoseData => self.remove(false),
            Restart::Snapshot => self.copy(true),
            Restart::FromSnapshot => self.copy(false),
            _ => Ok(()),
        };
        done.map_err(|e| {
            palisade_core::Error::new(
                palisade_core::ErrorKind::Unavailable,
                "test",
                format!("{how:?} of {}: {e}", self.path.display()),
            )
        })
    }
}
