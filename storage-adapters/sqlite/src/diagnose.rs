//! `palisade doctor`'s checks of an SQLite database file: its journal mode, how safely this
//! URL commits (its `synchronous`), and where the file lives (SQLite's locking does not hold
//! on a network file system). Reads only (a read-only open of a WAL file may make the `-shm`
//! file SQLite needs to read it).

use std::path::Path;

use async_trait::async_trait;
use palisade_core::{Check, Diagnose, Result, Verdict};

use crate::db::{BACKEND, map_err};
use crate::{SqliteLockService, SqliteStore};

const CONCURRENT: &str = "readers never wait for the writer, so a read under a lock never holds up a grant";
const DURABLE: &str = "an acknowledged grant or write survives a crash";
const EXCLUSIVE: &str = "one writer at a time, so a fence check and its write are one step";

#[async_trait]
impl Diagnose for SqliteStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn diagnose(&self) -> Result<Vec<Check>> {
        let journal: String =
            sqlx::query_scalar("PRAGMA journal_mode").fetch_one(self.pool()).await.map_err(map_err)?;
        // `memory` and `off` are a connection's, never a file's: a file shows wal or a rollback
        // journal.
        let mut checks = vec![match journal.as_str() {
            "wal" => Check::new("journal_mode", Verdict::Pass, "wal", CONCURRENT),
            _ => Check::new(
                "journal_mode",
                Verdict::Warn,
                format!(
                    "{journal}: readers and the writer wait for each other (a Palisade store switches the file to wal \
                     when it opens it to write)"
                ),
                CONCURRENT,
            ),
        }];
        // This connection's setting: the URL's (`?synchronous=`), full by default.
        let synchronous: i64 =
            sqlx::query_scalar("PRAGMA synchronous").fetch_one(self.pool()).await.map_err(map_err)?;
        checks.push(match synchronous {
            2 | 3 => Check::new("synchronous", Verdict::Pass, "full (this URL's)", DURABLE),
            1 => Check::new(
                "synchronous",
                Verdict::Warn,
                "normal (this URL's): in WAL mode, a power loss or a crash of the machine can lose the last \
                 commits, grants and watermarks with them; use synchronous=full",
                DURABLE,
            ),
            _ => Check::new(
                "synchronous",
                Verdict::Fail,
                "off (this URL's): a crash of the machine can lose commits or corrupt the file; use synchronous=full",
                DURABLE,
            ),
        });
        let path = self.pool().connect_options().get_filename().to_path_buf();
        checks.push(location(&path));
        Ok(checks)
    }
}

#[async_trait]
impl Diagnose for SqliteLockService {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn diagnose(&self) -> Result<Vec<Check>> {
        self.store().diagnose().await
    }
}

/// Where the database file lives: local, or a network file system whose locks SQLite cannot
/// trust.
fn location(path: &Path) -> Check {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    match filesystem_magic(dir) {
        None => Check::new(
            "file system",
            Verdict::Warn,
            format!("cannot tell what file system {} is on: make sure it is a local disk", dir.display()),
            EXCLUSIVE,
        ),
        Some(magic) => match network_filesystem(magic) {
            Some((name, verdict)) => Check::new(
                "file system",
                verdict,
                format!(
                    "{} is on {name}: SQLite's file locks do not hold across machines there, so two writers can \
                     meet and the fence check with them; keep the file on a local disk",
                    dir.display()
                ),
                EXCLUSIVE,
            ),
            None => Check::new(
                "file system",
                Verdict::Pass,
                format!("{} is on a local file system", dir.display()),
                EXCLUSIVE,
            ),
        },
    }
}

/// The magic number of the file system `dir` is on. Magic numbers are 32 bits; the field is
/// signed and as wide as a `long`, so a 32-bit target shows the high ones negative.
#[cfg(target_os = "linux")]
#[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)] // the low 32 bits are the number
fn filesystem_magic(dir: &Path) -> Option<u32> {
    nix::sys::statfs::statfs(dir).ok().map(|s| s.filesystem_type().0 as u32)
}

#[cfg(not(target_os = "linux"))]
fn filesystem_magic(_: &Path) -> Option<u32> {
    None
}

/// A network file system by its `statfs` magic number, and how bad it is: the ones that share
/// a file between machines fail; FUSE may be one (sshfs) or not, so it warns.
fn network_filesystem(magic: u32) -> Option<(&'static str, Verdict)> {
    Some(match magic {
        0x6969 => ("NFS", Verdict::Fail),
        0x517B => ("SMB", Verdict::Fail),
        0xFF53_4D42 => ("CIFS", Verdict::Fail),
        0xFE53_4D42 => ("SMB2", Verdict::Fail),
        0x0102_1997 => ("9P", Verdict::Fail),
        0x00C3_6400 => ("CephFS", Verdict::Fail),
        0x4750_4653 => ("GPFS", Verdict::Fail),
        0x0BD0_0BD0 => ("Lustre", Verdict::Fail),
        0x5346_414F => ("AFS", Verdict::Fail),
        0x6573_5546 => ("FUSE (which may be a network file system, such as sshfs)", Verdict::Warn),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_file_systems_fail_and_fuse_warns() {
        assert_eq!(network_filesystem(0x6969).map(|(_, v)| v), Some(Verdict::Fail));
        assert_eq!(network_filesystem(0xFF53_4D42).map(|(_, v)| v), Some(Verdict::Fail));
        assert_eq!(network_filesystem(0x6573_5546).map(|(_, v)| v), Some(Verdict::Warn));
        // ext4, tmpfs, overlayfs: local.
        for local in [0xEF53, 0x0102_1994, 0x794C_7630] {
            assert_eq!(network_filesystem(local), None);
        }
    }

    #[test]
    fn a_temporary_directory_is_local() {
        let dir = std::env::temp_dir().join("palisade-doctor-local.db");
        assert_eq!(location(&dir).verdict, Verdict::Pass, "{:?}", location(&dir));
    }
}
