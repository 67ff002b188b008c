//! Claims on shared machine resources (a block of ports, a lab subnet) that hold across the
//! processes of one machine, not only the threads of one.
//!
//! Test binaries run side by side (the test command runs several at once), and each picks ports
//! and subnets for servers that bind them later. A port that one process found free and handed
//! out, but whose server has not bound it yet, looks free to every other process too. A claim is
//! an advisory lock (`flock`) on a file named after the resource in a directory every process of
//! the machine shares: only one process holds it, and the kernel releases it when that process
//! exits, however it exits (a killed test binary leaves no stale claim behind).

use std::fs::{File, OpenOptions, TryLockError};
use std::path::PathBuf;

/// A resource this process holds until the claim is dropped (or the process ends).
#[derive(Debug)]
pub(crate) struct Claim {
    _file: File,
}

/// Where the claims' files live: one fixed place for every process of the machine, whatever
/// its `TMPDIR` (`palisade compare`'s own test points its child's at `/dev/shm`, and claims in
/// two places would not see each other).
fn directory() -> PathBuf {
    PathBuf::from("/tmp/palisade-lab-claims")
}

/// Claims `name` for this process: `Ok(Some)` if it was free, `Ok(None)` if another holder
/// has it (another process, or this one through a claim it has not dropped), `Err` if claims
/// cannot be made here at all (the directory cannot be created or the file opened), in which
/// case the caller falls back to what it did without them.
pub(crate) fn try_claim(name: &str) -> std::io::Result<Option<Claim>> {
    let dir = directory();
    std::fs::create_dir_all(&dir)?;
    // Never truncated or written: the lock, not the content, is the claim, and the file
    // outlives its holder so that no holder ever removes a file another process has locked.
    let file = OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(name))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(Claim { _file: file })),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(e)) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_is_held_until_dropped() {
        let name = format!("test-{}", std::process::id());
        let first = try_claim(&name).unwrap().expect("a fresh name is free");
        assert!(try_claim(&name).unwrap().is_none(), "a held claim was granted twice");
        drop(first);
        assert!(try_claim(&name).unwrap().is_some(), "a dropped claim stayed held");
        let _ = std::fs::remove_file(directory().join(&name));
    }
}
