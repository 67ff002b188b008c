//! Choosing a backend by URL.

use std::sync::Arc;

use palisade_core::{
    Capabilities, Diagnose, DynDiagnose, DynFencedStore, DynInspectLocks, DynInspectStore, DynLockService,
    DynUnfencedLockService, Error, ErrorKind, Fenced, FencedStore, InspectLocks, InspectStore, LockService, Result,
};

const BACKEND: &str = "palisade";

/// Schemes this crate knows, the cargo feature that enables each, and whether this build has it.
struct Scheme {
    names: &'static [&'static str],
    feature: &'static str,
    enabled: bool,
    /// `false` for backends announced but not yet shipped in this release.
    shipped: bool,
}

const LOCK_SCHEMES: &[Scheme] = &[
    Scheme { names: &["memory"], feature: "memory", enabled: cfg!(feature = "memory"), shipped: true },
    Scheme { names: &["sqlite"], feature: "sqlite", enabled: cfg!(feature = "sqlite"), shipped: true },
    Scheme {
        names: &["postgres", "postgresql"],
        feature: "postgres",
        enabled: cfg!(feature = "postgres"),
        shipped: true,
    },
    Scheme {
        names: &["redis", "rediss", "redis+sentinel", "redis+cluster"],
        feature: "redis",
        enabled: cfg!(feature = "redis"),
        shipped: true,
    },
    Scheme { names: &["redlock"], feature: "redlock", enabled: cfg!(feature = "redlock"), shipped: true },
    Scheme { names: &["etcd", "etcds"], feature: "etcd", enabled: cfg!(feature = "etcd"), shipped: true },
    Scheme { names: &["zk"], feature: "zookeeper", enabled: cfg!(feature = "zookeeper"), shipped: true },
];

const STORE_SCHEMES: &[Scheme] = &[
    Scheme { names: &["memory"], feature: "memory", enabled: cfg!(feature = "memory"), shipped: true },
    Scheme { names: &["sqlite"], feature: "sqlite", enabled: cfg!(feature = "sqlite"), shipped: true },
    Scheme {
        names: &["postgres", "postgresql"],
        feature: "postgres",
        enabled: cfg!(feature = "postgres"),
        shipped: true,
    },
    Scheme { names: &["dynamodb"], feature: "dynamodb", enabled: cfg!(feature = "dynamodb"), shipped: true },
];

fn scheme_of(url: &str) -> Result<&str> {
    match url.split_once(':') {
        Some((scheme, _)) if !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric() || c == '+') => {
            Ok(scheme)
        }
        _ => Err(Error::new(
            ErrorKind::InvalidConfig,
            BACKEND,
            "malformed URL: expected SCHEME:… (for example memory:// or sqlite://warehouse.db)",
        )),
    }
}

/// Finds `scheme` in `table`; errors say which feature to enable or which schemes exist.
fn check_scheme(what: &str, scheme: &str, table: &[Scheme]) -> Result<()> {
    let lower = scheme.to_ascii_lowercase();
    match table.iter().find(|s| s.names.contains(&lower.as_str())) {
        Some(s) if s.enabled => Ok(()),
        Some(s) if s.shipped => Err(Error::new(
            ErrorKind::Unsupported,
            BACKEND,
            format!("{what} scheme `{scheme}` needs palisade's cargo feature `{}`", s.feature),
        )),
        Some(s) => Err(Error::new(
            ErrorKind::Unsupported,
            BACKEND,
            format!(
                "{what} scheme `{scheme}` belongs to the `{}` backend, which this release of palisade does not ship yet",
                s.feature
            ),
        )),
        None => {
            let known: Vec<&str> = table.iter().flat_map(|s| s.names.iter().copied()).collect();
            Err(Error::new(
                ErrorKind::InvalidConfig,
                BACKEND,
                format!("unknown {what} scheme `{scheme}` (known: {})", known.join(", ")),
            ))
        }
    }
}

/// Connects to a fenced lock service by URL.
///
/// | URL | service |
/// |---|---|
/// | `memory://` or `memory://NAME` | the in-process [`MemoryLockService`](palisade_core::MemoryLockService); every call with the same `NAME` in one process shares one instance |
/// | `sqlite://PATH` | `palisade_sqlite::SqliteLockService` (feature `sqlite`): locks and fence counters in the database file, shared by every process that opens it; give the store the same URL to keep locks and data in one file |
/// | `postgres://[user:pass@]host:port/db[?sslmode=…]` | `palisade_postgres::PostgresLockService` (feature `postgres`, TLS included: `sslmode=require\|verify-ca\|verify-full`): locks and fence counters in a table of the database, expiry by the server's clock; give the store the same database (with `?require_live_lock=true`, each fenced write commits only while its lock is live) |
/// | `redis://[user:pass@]host:port[/db]`, `rediss://…` | `palisade_redis::RedisLockService` (feature `redis`, `redis-tls` for TLS) |
/// | `redis+sentinel://[user:pass@]host:port[,host:port…]/MASTER_NAME[?sentinel_password=…&db=N&wait_replicas=N&wait_timeout_ms=T]` | the same service on the master the Sentinels name, followed across failovers (feature `redis`) |
/// | `redis+cluster://[user:pass@]host:port[,host:port…]` | the same service on a Redis Cluster: each script to its resource's slot, `MOVED`/`ASK` followed (feature `redis`) |
/// | `etcd://[user:pass@]host:port[,host:port…][?session_ttl_s=N]`, `etcds://…` | `palisade_etcd::EtcdLockService` (feature `etcd`, `etcd-tls` for TLS) |
/// | `zk://[user:pass@]host:port[,host:port…][/chroot][?session_timeout_ms=N]` | `palisade_zookeeper::ZkLockService` (feature `zookeeper`) |
///
/// `redlock://…` issues no fence, so it is refused here ([`ErrorKind::Unsupported`], before
/// any connection): connect it with [`connect_any_lock`].
///
/// Errors: a malformed URL or unknown scheme is [`ErrorKind::InvalidConfig`]; a scheme whose
/// cargo feature is off is [`ErrorKind::Unsupported`] and names the feature.
pub async fn connect_lock(url: &str) -> Result<Arc<DynLockService>> {
    let service: Arc<DynLockService> = connect_fenced(&lock_scheme(url)?, url).await?;
    Ok(service)
}

/// The URL's lock-service scheme, lowercased, once it is known and its feature is on.
fn lock_scheme(url: &str) -> Result<String> {
    let scheme = scheme_of(url)?;
    check_scheme("lock service", scheme, LOCK_SCHEMES)?;
    Ok(scheme.to_ascii_lowercase())
}

/// A fenced lock service with its read-only view and its checks: what every fenced scheme
/// connects to, so that [`connect_lock`], [`inspect_locks`] and [`diagnose_lock`] share one
/// table of schemes.
trait ViewedLockService: LockService<Fencing = Fenced> + Unchanged {}
impl<T: LockService<Fencing = Fenced> + InspectLocks + Diagnose> ViewedLockService for T {}

/// A fenced store with its read-only view and its checks (as [`ViewedLockService`]).
trait ViewedStore: FencedStore + UnchangedStore {}
impl<T: FencedStore + InspectStore + Diagnose> ViewedStore for T {}

/// Connects a fenced service of a checked `scheme`.
async fn connect_fenced(scheme: &str, url: &str) -> Result<Arc<dyn ViewedLockService>> {
    // Read by every arm but the refusals: with no lock service's feature on, by none.
    let _ = url;
    match scheme {
        #[cfg(feature = "memory")]
        "memory" => Ok(memory::lock_service(memory::instance_name(url)?)),
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Arc::new(palisade_sqlite::SqliteLockService::connect(url).await?)),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Arc::new(palisade_postgres::PostgresLockService::connect(url).await?)),
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+sentinel" | "redis+cluster" => {
            Ok(Arc::new(palisade_redis::RedisLockService::connect(url).await?))
        }
        #[cfg(feature = "etcd")]
        "etcd" | "etcds" => Ok(Arc::new(palisade_etcd::EtcdLockService::connect(url).await?)),
        #[cfg(feature = "zookeeper")]
        "zk" => Ok(Arc::new(palisade_zookeeper::ZkLockService::connect(url).await?)),
        "redlock" => Err(unfenced_refused(scheme)),
        _ => Err(Error::new(ErrorKind::Unsupported, BACKEND, format!("scheme `{scheme}` is not wired"))),
    }
}

fn unfenced_refused(scheme: &str) -> Error {
    Error::new(
        ErrorKind::Unsupported,
        BACKEND,
        format!(
            "`{scheme}` issues no fence, so it cannot protect fenced writes; connect it with connect_any_lock (an efficiency lock)"
        ),
    )
}

/// A lock service connected by URL, fenced or not: what [`connect_any_lock`] returns.
///
/// Code that needs fences matches on [`Fenced`](AnyLockService::Fenced) (or calls
/// [`fenced`](AnyLockService::fenced)); code that compares backends, or only wants an
/// efficiency lock, handles both.
#[derive(Clone)]
pub enum AnyLockService {
    /// A service whose grants carry fences (every backend but Redlock).
    Fenced(Arc<DynLockService>),
    /// An efficiency lock without fences (Redlock): its leases cannot feed a fenced store.
    Unfenced(Arc<DynUnfencedLockService>),
}

impl AnyLockService {
    /// The backend's short name (`"redis"`, `"redlock"`).
    pub fn backend(&self) -> &'static str {
        match self {
            AnyLockService::Fenced(s) => s.backend(),
            AnyLockService::Unfenced(s) => s.backend(),
        }
    }

    /// What the service declares.
    pub fn capabilities(&self) -> Capabilities {
        match self {
            AnyLockService::Fenced(s) => s.capabilities(),
            AnyLockService::Unfenced(s) => s.capabilities(),
        }
    }

    /// Whether its grants carry fences.
    pub fn is_fenced(&self) -> bool {
        matches!(self, AnyLockService::Fenced(_))
    }

    /// The fenced service, or [`ErrorKind::Unsupported`] for an unfenced one.
    pub fn fenced(self) -> Result<Arc<DynLockService>> {
        match self {
            AnyLockService::Fenced(s) => Ok(s),
            AnyLockService::Unfenced(s) => Err(unfenced_refused(s.backend())),
        }
    }
}

impl std::fmt::Debug for AnyLockService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_fenced() { "Fenced" } else { "Unfenced" };
        f.debug_tuple(kind).field(&self.backend()).finish()
    }
}

/// Connects to any lock service by URL: the schemes of [`connect_lock`], plus the unfenced
/// ones.
///
/// | URL | service |
/// |---|---|
/// | `redlock://[user:pass@]host:port[,host:port…][/db][?node_timeout_ms=N&drift_factor=F&drift_ms=N&retry_delay_ms=N]` | `palisade_redlock::RedlockService` (feature `redlock`), [`AnyLockService::Unfenced`] |
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> palisade::Result<()> {
/// let locks = palisade::connect_any_lock("memory://").await?;
/// assert!(locks.is_fenced());
/// let fenced = locks.fenced()?; // what connect_lock would have returned
/// # let _ = fenced;
/// # Ok(()) }
/// ```
///
/// Errors: as for [`connect_lock`].
pub async fn connect_any_lock(url: &str) -> Result<AnyLockService> {
    let scheme = lock_scheme(url)?;
    match scheme.as_str() {
        #[cfg(feature = "redlock")]
        "redlock" => Ok(AnyLockService::Unfenced(Arc::new(palisade_redlock::RedlockService::connect(url).await?))),
        _ => {
            let service: Arc<DynLockService> = connect_fenced(&scheme, url).await?;
            Ok(AnyLockService::Fenced(service))
        }
    }
}

/// Connects to a fenced store by URL.
///
/// | URL | store |
/// |---|---|
/// | `memory://` or `memory://NAME` | the in-process [`MemoryFencedStore`](palisade_core::MemoryFencedStore), shared per `NAME` |
/// | `sqlite://PATH`, `sqlite:PATH`, `sqlite::memory:` | `palisade_sqlite::SqliteStore` (`?synchronous=full\|normal\|off`) |
/// | `postgres://user[:pass]@host:port/db[?sslmode=…]` | `palisade_postgres::PostgresStore` (feature `postgres`, TLS included) |
/// | `dynamodb://TABLE[?endpoint=URL&region=R]` | `palisade_dynamodb::DynamoStore` (feature `dynamodb`; credentials from the AWS chain) |
///
/// Errors: as for [`connect_lock`]; an unreachable server is [`ErrorKind::Unavailable`].
pub async fn connect_store(url: &str) -> Result<Arc<DynFencedStore>> {
    let store: Arc<DynFencedStore> = connect_viewed_store(url).await?;
    Ok(store)
}

/// Connects a store by URL, with its read-only view.
async fn connect_viewed_store(url: &str) -> Result<Arc<dyn ViewedStore>> {
    let scheme = scheme_of(url)?;
    check_scheme("store", scheme, STORE_SCHEMES)?;
    match scheme.to_ascii_lowercase().as_str() {
        #[cfg(feature = "memory")]
        "memory" => Ok(memory::store(memory::instance_name(url)?)),
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Arc::new(palisade_sqlite::SqliteStore::connect(url).await?)),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Arc::new(palisade_postgres::PostgresStore::connect(url).await?)),
        #[cfg(feature = "dynamodb")]
        "dynamodb" => Ok(Arc::new(palisade_dynamodb::DynamoStore::connect(url).await?)),
        _ => Err(Error::new(ErrorKind::Unsupported, BACKEND, format!("scheme `{scheme}` is not wired"))),
    }
}

/// What every lock service gives when opened changing nothing: its view and its checks.
trait Unchanged: InspectLocks + Diagnose {}
impl<T: InspectLocks + Diagnose> Unchanged for T {}

/// A store opened changing nothing, with its view and its checks.
trait UnchangedStore: InspectStore + Diagnose {}
impl<T: InspectStore + Diagnose> UnchangedStore for T {}

/// The lock service at `url` of a checked `scheme`, opened changing nothing: an SQLite file
/// read-only, PostgreSQL without migrations, a Redis whose eviction policy `connect` would
/// refuse all the same (to show it, and to say what is wrong with it), etcd without its
/// session lease, and the others as their `connect` does (ZooKeeper opens a session, which
/// writes no node; Redlock connects to its masters).
async fn open_lock_unchanged(scheme: &str, url: &str) -> Result<Arc<dyn Unchanged>> {
    match scheme {
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Arc::new(palisade_sqlite::SqliteLockService::open_read_only(url).await?)),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            let config = postgres_without_migrations(url)?;
            let store = palisade_postgres::PostgresStore::open(config.clone()).await?;
            let service = palisade_postgres::PostgresLockService::with_config(store.pool().clone(), &config).await?;
            Ok(Arc::new(service))
        }
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+sentinel" | "redis+cluster" => {
            let mut config = palisade_redis::RedisConfig::new(url);
            config.allow_eviction = true;
            Ok(Arc::new(palisade_redis::RedisLockService::connect_with(config).await?))
        }
        #[cfg(feature = "etcd")]
        "etcd" | "etcds" => Ok(Arc::new(palisade_etcd::EtcdLockService::open_read_only(url).await?)),
        #[cfg(feature = "redlock")]
        "redlock" => Ok(Arc::new(palisade_redlock::RedlockService::connect(url).await?)),
        _ => {
            let service = connect_fenced(scheme, url).await?;
            let service: Arc<dyn Unchanged> = service;
            Ok(service)
        }
    }
}

/// The store at `url`, opened changing nothing (as [`open_lock_unchanged`]): an SQLite file
/// read-only, PostgreSQL without migrations, DynamoDB without creating its table (a table
/// that is not there is an error).
async fn open_store_unchanged(url: &str) -> Result<Arc<dyn UnchangedStore>> {
    let scheme = scheme_of(url)?;
    check_scheme("store", scheme, STORE_SCHEMES)?;
    match scheme.to_ascii_lowercase().as_str() {
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Arc::new(palisade_sqlite::SqliteStore::open_read_only(url).await?)),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            Ok(Arc::new(palisade_postgres::PostgresStore::open(postgres_without_migrations(url)?).await?))
        }
        #[cfg(feature = "dynamodb")]
        "dynamodb" => {
            let mut config = palisade_dynamodb::DynamoConfig::from_url(url)?;
            config.create_table = false;
            Ok(Arc::new(palisade_dynamodb::DynamoStore::open(config).await?))
        }
        _ => {
            let store = connect_viewed_store(url).await?;
            let store: Arc<dyn UnchangedStore> = store;
            Ok(store)
        }
    }
}

/// The read-only view of the lock service at `url` ([`InspectLocks`](palisade_core::InspectLocks)):
/// who holds which lock, with which fence. What `palisade inspect` reads.
///
/// Takes the URLs of [`connect_lock`] (a `memory://` view sees this process's instance only)
/// and changes nothing: an SQLite file is opened read-only (it must exist), PostgreSQL without
/// making its tables, a Redis whose eviction policy [`connect_lock`] refuses is opened all the
/// same, etcd without a session lease, and the other services as their `connect` does
/// (ZooKeeper opens a session, which writes no node). A table that is not there shows as
/// nothing locked. A `redlock://` lock shows its holder (the token on a majority of the
/// masters), with no fence.
///
/// Errors: as for [`connect_lock`].
pub async fn inspect_locks(url: &str) -> Result<Arc<DynInspectLocks>> {
    let view: Arc<DynInspectLocks> = open_lock_unchanged(&lock_scheme(url)?, url).await?;
    Ok(view)
}

/// The read-only view of the store at `url` ([`InspectStore`](palisade_core::InspectStore)):
/// each resource's watermark and the grant that set it. Takes the URLs of [`connect_store`]
/// and changes nothing: an SQLite file is opened read-only, PostgreSQL without making its
/// tables, DynamoDB without creating its table (a table that is not there is an error).
///
/// Errors: as for [`connect_store`].
pub async fn inspect_store(url: &str) -> Result<Arc<DynInspectStore>> {
    let view: Arc<DynInspectStore> = open_store_unchanged(url).await?;
    Ok(view)
}

/// The configuration checks of the lock service at `url` ([`Diagnose`](palisade_core::Diagnose)):
/// what `palisade doctor` runs. Connects as [`inspect_locks`] does, changing nothing. Every
/// service has checks.
///
/// Errors: as for [`connect_lock`].
pub async fn diagnose_lock(url: &str) -> Result<Arc<DynDiagnose>> {
    let checks: Arc<DynDiagnose> = open_lock_unchanged(&lock_scheme(url)?, url).await?;
    Ok(checks)
}

/// The configuration checks of the store at `url`, connected as [`inspect_store`] does.
///
/// Errors: as for [`connect_store`].
pub async fn diagnose_store(url: &str) -> Result<Arc<DynDiagnose>> {
    let checks: Arc<DynDiagnose> = open_store_unchanged(url).await?;
    Ok(checks)
}

/// A PostgreSQL URL's settings with `migrate` off: nothing is created or replaced.
#[cfg(feature = "postgres")]
fn postgres_without_migrations(url: &str) -> Result<palisade_postgres::PostgresConfig> {
    let mut config = palisade_postgres::PostgresConfig::from_url(url)?;
    config.migrate = false;
    Ok(config)
}

#[cfg(feature = "memory")]
mod memory {
    //! Named in-process instances, so `memory://x` means the same service everywhere in a process.

    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock, PoisonError};

    use palisade_core::{Error, ErrorKind, MemoryFencedStore, MemoryLockService, Result};

    type Registry<T> = OnceLock<Mutex<HashMap<String, Arc<T>>>>;
    static LOCKS: Registry<MemoryLockService> = OnceLock::new();
    static STORES: Registry<MemoryFencedStore> = OnceLock::new();

    pub(super) fn instance_name(url: &str) -> Result<String> {
        let rest = url.get("memory:".len()..).unwrap_or("");
        let name = rest.strip_prefix("//").unwrap_or(rest).trim_end_matches('/');
        if name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
            Ok(name.to_string())
        } else {
            Err(Error::new(
                ErrorKind::InvalidConfig,
                "memory",
                "a memory:// URL takes an optional instance name of letters, digits, '-', '_' and '.'",
            ))
        }
    }

    fn get<T: Default>(registry: &Registry<T>, name: String) -> Arc<T> {
        let map = registry.get_or_init(Default::default);
        let mut map = map.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(map.entry(name).or_default())
    }

    pub(super) fn lock_service(name: String) -> Arc<MemoryLockService> {
        get(&LOCKS, name)
    }

    pub(super) fn store(name: String) -> Arc<MemoryFencedStore> {
        get(&STORES, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unknown_and_malformed_urls_are_invalid_config() {
        for url in ["", "nocolon", "ftp://x", ":x", "m e://"] {
            let err = connect_lock(url).await.err().expect(url);
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}: {err}");
        }
        let err = connect_store("mysql://x").await.err().expect("mysql");
        assert!(err.to_string().contains("sqlite"), "{err}");
    }

    #[tokio::test]
    async fn redlock_is_never_a_fenced_service() {
        // Refused before connecting: nothing listens on port 1.
        let err = connect_lock("redlock://127.0.0.1:1").await.err().expect("redlock");
        assert_eq!(err.kind(), ErrorKind::Unsupported);
        let wanted = if cfg!(feature = "redlock") { "connect_any_lock" } else { "cargo feature `redlock`" };
        assert!(err.to_string().contains(wanted), "{err}");
        #[cfg(feature = "memory")]
        {
            let any = connect_any_lock("memory://").await.unwrap();
            assert!(any.is_fenced() && any.backend() == "memory", "{any:?}");
        }
    }

    #[tokio::test]
    async fn disabled_backends_are_unsupported_and_named() {
        if !cfg!(feature = "etcd") {
            let err = connect_lock("etcd://127.0.0.1:2379").await.err().expect("etcd");
            assert_eq!(err.kind(), ErrorKind::Unsupported);
            assert!(err.to_string().contains("cargo feature `etcd`"), "{err}");
        }
        if !cfg!(feature = "dynamodb") {
            let err = connect_store("dynamodb://table").await.err().expect("dynamodb");
            assert_eq!(err.kind(), ErrorKind::Unsupported);
            assert!(err.to_string().contains("cargo feature `dynamodb`"), "{err}");
        }
        if !cfg!(feature = "redis") {
            let err = connect_lock("redis://127.0.0.1:6379").await.err().expect("redis");
            assert_eq!(err.kind(), ErrorKind::Unsupported);
            assert!(err.to_string().contains("cargo feature `redis`"), "{err}");
        }
    }

    #[cfg(feature = "memory")]
    #[tokio::test]
    async fn memory_instances_are_shared_by_name() {
        use palisade_core::{LockServiceExt, ResourceKey};
        use std::time::Duration;
        let key = ResourceKey::new("t", "shared").unwrap();
        let a = connect_lock("memory://conn-test").await.unwrap();
        let b = connect_lock("memory://conn-test").await.unwrap();
        let other = connect_lock("memory://conn-other").await.unwrap();
        let held = a.try_lock(&key, Duration::from_secs(10)).await.unwrap().unwrap();
        assert!(b.try_lock(&key, Duration::from_secs(10)).await.unwrap().is_none());
        assert!(other.try_lock(&key, Duration::from_secs(10)).await.unwrap().is_some());
        held.release().await.unwrap();
        assert_eq!(connect_lock("memory://bad name").await.err().map(|e| e.kind()), Some(ErrorKind::InvalidConfig));
    }
}
