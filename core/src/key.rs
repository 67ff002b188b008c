//! Resource keys: what a lock protects.

use std::fmt;

use crate::error::{Error, ErrorKind, Result};

/// The longest domain a [`ResourceKey`] accepts, in bytes.
pub const MAX_DOMAIN_LEN: usize = 64;
/// The longest id a [`ResourceKey`] accepts, in bytes.
pub const MAX_ID_LEN: usize = 192;

/// What separates a primitive's own lock from its resource in a key's id: a semaphore on
/// `quota:api` takes its permits on `quota:api~permit-0` … and queues its waiters on
/// `quota:api~queue`; a read-write lock on `catalogue:prices` keeps its reader slots on
/// `catalogue:prices~rw-read~permit-0` ….
///
/// [`ResourceKey::new`] and [`ResourceKey::parse`] refuse it, so no user key is ever one of
/// those locks: a mutex on `quota:api.queue` is a lock of its own. Every backend's key
/// encoding accepts it (Redis keys, etcd keys, ZooKeeper node names, SQL text columns and
/// DynamoDB string attributes take it as it is).
pub const SUB_KEY_SEPARATOR: char = '~';

/// The name of a resource a lock protects: a domain (the kind of thing, `alloc`) and an id (which
/// one, `WH-01`).
///
/// Both parts are validated on construction: non-empty, at most [`MAX_DOMAIN_LEN`] /
/// [`MAX_ID_LEN`] bytes, and only ASCII letters, digits, `-`, `_` and `.`. The character set
/// keeps keys safe in every backend's key space: no `:` (our separator), no `{`/`}` (Redis
/// Cluster hash tags), no `/` (etcd and ZooKeeper paths), no whitespace or control characters
/// an operator could not type into `redis-cli`, and no `~` ([`SUB_KEY_SEPARATOR`]: the
/// coordination primitives' own locks, which no user key may name).
///
/// ```
/// use palisade_core::ResourceKey;
///
/// let key = ResourceKey::new("alloc", "WH-01")?;
/// assert_eq!(key.lock_key(), "lock:{alloc:WH-01}");
/// assert_eq!(key.fence_key(), "fence:{alloc:WH-01}");
/// assert!(ResourceKey::new("alloc", "").is_err());
/// assert!(ResourceKey::new("alloc", "a b").is_err());
/// # Ok::<(), palisade_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceKey {
    domain: String,
    id: String,
}

impl ResourceKey {
    /// Validates and builds a key. Bad input is an [`ErrorKind::InvalidKey`] error, never a panic.
    pub fn new(domain: impl Into<String>, id: impl Into<String>) -> Result<Self> {
        let domain = domain.into();
        let id = id.into();
        validate_part("domain", &domain, MAX_DOMAIN_LEN)?;
        validate_part("id", &id, MAX_ID_LEN)?;
        Ok(ResourceKey { domain, id })
    }

    /// Parses the `domain:id` form that [`Display`](fmt::Display) prints, validated as
    /// [`new`](ResourceKey::new) does: a primitive's own key (`domain:id~queue`) is refused.
    /// Backends that carry keys as text and read them back use
    /// [`spi::parse_any_resource_key`](crate::spi::parse_any_resource_key).
    pub fn parse(s: &str) -> Result<Self> {
        let (domain, id) = split(s)?;
        ResourceKey::new(domain, id)
    }

    /// A primitive's own key under this resource: the id followed by [`SUB_KEY_SEPARATOR`] and
    /// `name` (`jobs` → `jobs~queue`). [`ErrorKind::InvalidKey`] when `name` is not a valid id
    /// or the id grows past [`MAX_ID_LEN`].
    pub(crate) fn sub_key(&self, name: &str) -> Result<Self> {
        validate_part("sub-key name", name, MAX_ID_LEN)?;
        let id = format!("{}{SUB_KEY_SEPARATOR}{name}", self.id);
        validate_any_id(&id)?;
        Ok(ResourceKey { domain: self.domain.clone(), id })
    }

    /// The kind of resource (`alloc`).
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// Which resource of that kind (`WH-01`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The lock key as it appears in a key-value server: `lock:{domain:id}`.
    ///
    /// The braces are a Redis Cluster hash tag: the lock key and the fence key hash to the same
    /// slot, so one script may touch both atomically (fencing rule 4).
    pub fn lock_key(&self) -> String {
        self.tagged("lock:")
    }

    /// The fence counter key as it appears in a key-value server: `fence:{domain:id}`.
    pub fn fence_key(&self) -> String {
        self.tagged("fence:")
    }

    /// `prefix{domain:id}`, built without the formatting machinery: it runs twice per Redis
    /// acquire and release, where `format!` was 5 % of the client's instructions.
    fn tagged(&self, prefix: &str) -> String {
        let mut key = String::with_capacity(prefix.len() + self.domain.len() + self.id.len() + 3);
        key.push_str(prefix);
        key.push('{');
        key.push_str(&self.domain);
        key.push(':');
        key.push_str(&self.id);
        key.push('}');
        key
    }
}

/// Parses any key [`Display`](fmt::Display) prints, a primitive's own keys included
/// (`domain:id~queue`, `domain:id~permit-3`): for a backend or relay that carries keys as text
/// and reads them back. Users parse with [`ResourceKey::parse`], which refuses those keys.
pub fn parse_any_resource_key(s: &str) -> Result<ResourceKey> {
    let (domain, id) = split(s)?;
    validate_part("domain", domain, MAX_DOMAIN_LEN)?;
    validate_any_id(id)?;
    Ok(ResourceKey { domain: domain.to_owned(), id: id.to_owned() })
}

fn split(s: &str) -> Result<(&str, &str)> {
    s.split_once(':').ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidKey,
            "core",
            format!("resource key {:?} is not of the form domain:id", truncate(s)),
        )
    })
}

/// An id, or a primitive's own id: valid parts joined by [`SUB_KEY_SEPARATOR`], at most
/// [`MAX_ID_LEN`] bytes in all.
fn validate_any_id(id: &str) -> Result<()> {
    if id.len() > MAX_ID_LEN {
        return Err(Error::new(
            ErrorKind::InvalidKey,
            "core",
            format!("resource key id is {} bytes long; at most {MAX_ID_LEN} are allowed", id.len()),
        ));
    }
    id.split(SUB_KEY_SEPARATOR).try_for_each(|part| validate_part("id", part, MAX_ID_LEN))
}

fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
}

fn validate_part(what: &str, value: &str, max: usize) -> Result<()> {
    let invalid = |why: String| Err(Error::new(ErrorKind::InvalidKey, "core", why));
    if value.is_empty() {
        return invalid(format!("resource key {what} is empty"));
    }
    if value.len() > max {
        return invalid(format!("resource key {what} is {} bytes long; at most {max} are allowed", value.len()));
    }
    if let Some(bad) = value.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))) {
        let reserved = if bad == SUB_KEY_SEPARATOR { " ('~' is reserved for the primitives' own locks)" } else { "" };
        return invalid(format!(
            "resource key {what} {:?} contains {bad:?}; only ASCII letters, digits, '-', '_' and '.' are allowed{reserved}",
            truncate(value)
        ));
    }
    Ok(())
}

impl fmt::Display for ResourceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.domain, self.id)
    }
}

impl fmt::Debug for ResourceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ResourceKey({self})")
    }
}

impl std::str::FromStr for ResourceKey {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        ResourceKey::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_warehouse_key_and_renders_layout() {
        let k = ResourceKey::new("alloc", "WH-01").unwrap();
        assert_eq!(k.to_string(), "alloc:WH-01");
        assert_eq!(k.lock_key(), "lock:{alloc:WH-01}");
        assert_eq!(k.fence_key(), "fence:{alloc:WH-01}");
        assert_eq!(ResourceKey::parse("alloc:WH-01").unwrap(), k);
    }

    #[test]
    fn rejects_bad_parts_with_invalid_key() {
        let long_id = "x".repeat(MAX_ID_LEN + 1);
        let long_domain = "d".repeat(MAX_DOMAIN_LEN + 1);
        let cases: Vec<(&str, &str)> = vec![
            ("", "a"),
            ("a", ""),
            ("a:b", "c"),
            ("a", "b:c"),
            ("a", "{tag}"),
            ("a", "x/y"),
            ("a", "white space"),
            ("a", "ünïcode"),
            ("a", "nul\0"),
            ("a", &long_id),
            (&long_domain, "a"),
        ];
        for (d, i) in cases {
            let err = ResourceKey::new(d, i).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidKey, "{d:?}/{i:?}");
        }
        assert_eq!(ResourceKey::parse("nocolon").unwrap_err().kind(), ErrorKind::InvalidKey);
    }

    #[test]
    fn sub_keys_are_keys_no_user_can_name() {
        let jobs = ResourceKey::new("q", "jobs").unwrap();
        let queue = jobs.sub_key("queue").unwrap();
        assert_eq!(queue.to_string(), "q:jobs~queue");
        assert_ne!(queue, ResourceKey::new("q", "jobs.queue").unwrap());
        assert_eq!(ResourceKey::new("q", "jobs~queue").unwrap_err().kind(), ErrorKind::InvalidKey);
        assert_eq!(ResourceKey::parse("q:jobs~queue").unwrap_err().kind(), ErrorKind::InvalidKey);
        let slot = jobs.sub_key("rw-read").unwrap().sub_key("permit-7").unwrap();
        assert_eq!(parse_any_resource_key(&slot.to_string()).unwrap(), slot);
        for bad in ["q:jobs~", "q:~queue", "q:jobs~~queue", "q:jobs~a/b", "q~x:jobs"] {
            assert_eq!(parse_any_resource_key(bad).unwrap_err().kind(), ErrorKind::InvalidKey, "{bad}");
        }
        assert_eq!(jobs.sub_key("a:b").unwrap_err().kind(), ErrorKind::InvalidKey);
        let long = ResourceKey::new("q", "x".repeat(MAX_ID_LEN - 2)).unwrap();
        assert_eq!(long.sub_key("ab").unwrap_err().kind(), ErrorKind::InvalidKey);
        assert!(long.sub_key("a").is_ok());
    }

    #[test]
    fn length_bounds_are_inclusive() {
        assert!(ResourceKey::new("d".repeat(MAX_DOMAIN_LEN), "x".repeat(MAX_ID_LEN)).is_ok());
    }
}
