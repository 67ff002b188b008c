//! What the backend reads of etcd's txn responses, held apart from the client's types so that
//! the reading can be checked against any response a server might send (the fuzz targets).

use etcd_client::{TxnOpResponse, TxnResponse};
use palisade_core::{Error, ErrorKind, Fence, Result};

use crate::BACKEND;

/// A txn response as the backend reads it: whether its comparisons held, the revision in its
/// header, and the keys each of its gets found, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxnReply {
    /// Whether the txn's comparisons held (its success branch ran).
    pub succeeded: bool,
    /// The header's revision: after a put, the put's revision. `None`: no header.
    pub revision: Option<i64>,
    /// For each get in the txn, the keys it found.
    pub gets: Vec<Vec<Vec<u8>>>,
}

impl TxnReply {
    pub(crate) fn of(resp: &TxnResponse) -> Self {
        let gets = resp
            .op_responses()
            .into_iter()
            .filter_map(|r| match r {
                TxnOpResponse::Get(g) => Some(g.kvs().iter().map(|kv| kv.key().to_vec()).collect()),
                _ => None,
            })
            .collect();
        TxnReply { succeeded: resp.succeeded(), revision: resp.header().map(|h| h.revision()), gets }
    }

    /// The header's revision, which a txn that put a key makes that key's create revision: a
    /// revision is at least 1, so anything else (or no header) is a [`ErrorKind::Backend`]
    /// error, never a fence or a revision to count from.
    pub fn revision(&self) -> Result<i64> {
        match self.revision {
            Some(revision) if revision >= 1 => Ok(revision),
            Some(revision) => {
                Err(Error::new(ErrorKind::Backend, BACKEND, format!("etcd returned revision {revision}")))
            }
            None => Err(Error::new(ErrorKind::Backend, BACKEND, "etcd response without a header")),
        }
    }

    /// The revision as the fence of the key this txn created.
    pub fn fence(&self) -> Result<Fence> {
        self.revision().map(|r| Fence::new(r.unsigned_abs()))
    }

    /// The revision to watch from for what happens after this response: one past it.
    pub fn next_revision(&self) -> Result<i64> {
        let revision = self.revision()?;
        revision
            .checked_add(1)
            .ok_or_else(|| Error::new(ErrorKind::Backend, BACKEND, format!("etcd returned revision {revision}")))
    }

    /// Whether the first key the `get`th get found is `key` (the head of a queue is us).
    pub fn first_found_is(&self, get: usize, key: &[u8]) -> bool {
        self.first_found(get) == Some(key)
    }

    /// The first key the `get`th get found, if it found any.
    pub fn first_found(&self, get: usize) -> Option<&[u8]> {
        self.gets.get(get).and_then(|keys| keys.first()).map(Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fence only from a revision; counting on from the last one is an error, not an overflow.
    #[test]
    fn revisions_become_fences_only_when_they_are_revisions() {
        let reply = |revision| TxnReply { revision, ..TxnReply::default() };
        assert_eq!(reply(Some(42)).fence().unwrap(), Fence::new(42));
        assert_eq!(reply(Some(42)).next_revision().unwrap(), 43);
        for bad in [None, Some(0), Some(-1), Some(i64::MIN)] {
            assert_eq!(reply(bad).fence().unwrap_err().kind(), ErrorKind::Backend, "{bad:?}");
        }
        assert_eq!(reply(Some(i64::MAX)).next_revision().unwrap_err().kind(), ErrorKind::Backend);
        let queue = TxnReply { gets: vec![vec![b"a".to_vec(), b"b".to_vec()], vec![]], ..TxnReply::default() };
        assert!(queue.first_found_is(0, b"a") && !queue.first_found_is(0, b"b") && queue.first_found(1).is_none());
    }
}
