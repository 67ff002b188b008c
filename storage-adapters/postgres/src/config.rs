//! Connection settings and schema.

use std::fmt;
use std::time::Duration;

use palisade_core::{Error, ErrorKind, Result};
use sqlx::postgres::{PgConnectOptions, PgSslMode};

use crate::db::{BACKEND, quote_ident};

/// Where and how to connect.
#[derive(Clone)]
pub struct PostgresConfig {
    /// `postgres://user[:password]@host:port/db`.
    pub url: String,
    /// Pool size. Default: 16.
    pub max_connections: u32,
    /// How long to wait for a pooled connection. Default: 10 s.
    pub acquire_timeout: Duration,
    /// The watermark table. Default: `palisade_fences`.
    pub fences_table: String,
    /// The record table. Default: `palisade_records`.
    pub records_table: String,
    /// The lock table of [`PostgresLockService`](crate::PostgresLockService). Default:
    /// `palisade_locks`.
    pub locks_table: String,
    /// Every fenced write also requires the writer's lock to be live in this database's
    /// [`PostgresLockService`] (its `locks_table`): the row must show the writer's grant and fence,
    /// unexpired by the server's clock, and stays locked (`FOR KEY SHARE`) until the write
    /// commits, so no other holder can be granted the lock before then. The lock service never
    /// waits for that row lock: while it is held the lock reads as held (a zero-wait try
    /// answers at once), and the holder itself can still extend and release. A write that fails it is
    /// [`ErrorKind::NotHolder`], nothing written. Only for locks taken from this database's lock
    /// service: a lease from Redis, etcd or ZooKeeper has no row here and every write is
    /// refused. Applies to the record API, [`begin_fenced`](crate::PostgresStore::begin_fenced)
    /// and [`check_fence_in`](crate::PostgresStore::check_fence_in); the single-row helpers
    /// check only the row's own fence. URL: `?require_live_lock=true`. Default: false.
    ///
    /// [`PostgresLockService`]: crate::PostgresLockService
    pub require_live_lock: bool,
    /// Create the tables at connect if missing. Default: true.
    pub migrate: bool,
    /// TLS to the server; each setting given here overrides the URL's (`sslmode`,
    /// `sslrootcert`, `sslcert`, `sslkey`, as libpq names them). Default: the URL's, and
    /// `sslmode=prefer` when it says nothing.
    pub tls: PostgresTls,
}

/// How a connection uses TLS ([`PostgresConfig::tls`]). Every field left `None` is taken from
/// the URL. Modes beyond [`SslMode::Prefer`] need the crate's `tls` feature (on with palisade's
/// `postgres`): without it they fail at connect with [`ErrorKind::InvalidConfig`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PostgresTls {
    /// `sslmode`.
    pub mode: Option<SslMode>,
    /// `sslrootcert`: a PEM file of CA certificates trusted beside the platform's.
    pub root_cert: Option<std::path::PathBuf>,
    /// `sslcert`: the client's certificate (PEM), for servers that authenticate clients by
    /// certificate.
    pub client_cert: Option<std::path::PathBuf>,
    /// `sslkey`: the client certificate's private key (PEM).
    pub client_key: Option<std::path::PathBuf>,
}

/// libpq's `sslmode`, as far as the driver implements it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SslMode {
    /// Never TLS.
    Disable,
    /// TLS when the server offers it, without checking its certificate; plaintext otherwise.
    /// An attacker on the path can strip TLS or impersonate the server.
    Prefer,
    /// TLS or no connection, without checking the server's certificate. Unlike libpq, a root
    /// certificate does not make this [`SslMode::VerifyCa`]: ask for that.
    Require,
    /// TLS, and the server's certificate must come from a trusted CA (any host name).
    VerifyCa,
    /// TLS, from a trusted CA, for the host connected to: the only mode that stops an active
    /// attacker. Use it in production.
    VerifyFull,
}

impl SslMode {
    fn sqlx(self) -> PgSslMode {
        match self {
            SslMode::Disable => PgSslMode::Disable,
            SslMode::Prefer => PgSslMode::Prefer,
            SslMode::Require => PgSslMode::Require,
            SslMode::VerifyCa => PgSslMode::VerifyCa,
            SslMode::VerifyFull => PgSslMode::VerifyFull,
        }
    }
}

impl PostgresConfig {
    /// Settings for `url` with the defaults above.
    pub fn new(url: impl Into<String>) -> Self {
        PostgresConfig {
            url: url.into(),
            max_connections: 16,
            acquire_timeout: Duration::from_secs(10),
            fences_table: "palisade_fences".into(),
            records_table: "palisade_records".into(),
            locks_table: "palisade_locks".into(),
            require_live_lock: false,
            migrate: true,
            tls: PostgresTls::default(),
        }
    }

    /// The driver's options: the URL's, with [`tls`](Self::tls) applied over them. A mode that
    /// needs TLS in a build without it is [`ErrorKind::InvalidConfig`] here, before any
    /// connection is tried.
    pub(crate) fn connect_options(&self) -> Result<PgConnectOptions> {
        // sqlx asks rustls for the process's provider, which panics when a program compiles two
        // (another crate's rustls may bring `aws-lc-rs`): install ours unless one is there.
        #[cfg(feature = "tls")]
        palisade_core::spi::tls::install_default_provider();
        let mut options: PgConnectOptions = self.url.parse().map_err(|e| {
            Error::new(ErrorKind::InvalidConfig, BACKEND, format!("bad PostgreSQL URL {}", self.redacted_url()))
                .with_source(e)
        })?;
        if let Some(mode) = self.tls.mode {
            options = options.ssl_mode(mode.sqlx());
        }
        if let Some(path) = &self.tls.root_cert {
            options = options.ssl_root_cert(path);
        }
        if let Some(path) = &self.tls.client_cert {
            options = options.ssl_client_cert(path);
        }
        if let Some(path) = &self.tls.client_key {
            options = options.ssl_client_key(path);
        }
        let needs_tls =
            matches!(options.get_ssl_mode(), PgSslMode::Require | PgSslMode::VerifyCa | PgSslMode::VerifyFull);
        if needs_tls && !cfg!(feature = "tls") {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                BACKEND,
                format!(
                    "{} asks for TLS (sslmode {:?}), which this build lacks: enable the `tls` feature of palisade-postgres (palisade's `postgres` has it)",
                    self.redacted_url(),
                    options.get_ssl_mode()
                ),
            ));
        }
        Ok(options)
    }

    /// Settings for `url` with the defaults above, and Palisade's own query parameter taken
    /// out of it (`require_live_lock=true|false`); the other parameters are the driver's
    /// (`sslmode`, `application_name`, …).
    pub fn from_url(url: &str) -> Result<Self> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let (mut config, mut kept) = (PostgresConfig::new(""), Vec::new());
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=').unwrap_or((pair, "")) {
                ("require_live_lock", value) => {
                    config.require_live_lock = match value {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        other => {
                            return Err(Error::new(
                                ErrorKind::InvalidConfig,
                                BACKEND,
                                format!("require_live_lock={other:?}: use true or false"),
                            ));
                        }
                    }
                }
                _ => kept.push(pair),
            }
        }
        config.url = if kept.is_empty() { base.to_string() } else { format!("{base}?{}", kept.join("&")) };
        Ok(config)
    }

    /// The lock table's DDL (idempotent): one row per resource ever locked, kept after release
    /// and expiry so its fence counter never goes back; `waiting` tells a release whether to
    /// wake anyone.
    pub fn locks_schema_sql(&self) -> Result<String> {
        crate::lock_table::schema_sql(&self.locks_table)
    }

    /// The DDL that creates the store's tables (idempotent), for your own migration tool;
    /// with `require_live_lock`, the lock table too.
    pub fn schema_sql(&self) -> Result<String> {
        let f = quote_ident(&self.fences_table)?;
        let r = quote_ident(&self.records_table)?;
        let apply = self.apply_function()?;
        let locks = if self.require_live_lock { self.locks_schema_sql()? + "\n" } else { String::new() };
        Ok(locks
            + &format!(
                "CREATE TABLE IF NOT EXISTS {f} (resource TEXT PRIMARY KEY, fence BIGINT NOT NULL, grant_id BYTEA);\n\
             {}\n\
             CREATE TABLE IF NOT EXISTS {r} (key TEXT PRIMARY KEY, value BYTEA NOT NULL, fence BIGINT);\n{}",
                crate::db::add_column_sql(&f, "grant_id", "BYTEA"),
                apply_function_sql(&apply, &f, &r)
            ))
    }

    /// The quoted name of the function that applies a record batch in one statement,
    /// `{fences_table}__{records_table}_apply`: both tables are in its body, so each pair has
    /// its own. Past PostgreSQL's 63-character limit it is `palisade_apply_` and a 64-bit
    /// FNV-1a hash of the pair (stable across versions and processes).
    pub(crate) fn apply_function(&self) -> Result<String> {
        let (f, r) = (quote_ident(&self.fences_table)?, quote_ident(&self.records_table)?);
        let name = format!("{}__{}_apply", self.fences_table, self.records_table);
        if name.len() <= 63 {
            return quote_ident(&name);
        }
        let hash = format!("{f}.{r}")
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
        quote_ident(&format!("palisade_apply_{hash:016x}"))
    }

    /// The URL without its password, for logs and errors.
    pub fn redacted_url(&self) -> String {
        palisade_core::redact_url(&self.url)
    }
}

/// The batch function: the watermark rule (fencing rule 2), every check, then every write, in
/// the one statement that calls it, so a fenced write is one round trip. Each statement inside
/// takes a fresh snapshot (PL/pgSQL, read committed), exactly as the same statements sent one
/// by one in a transaction would: the watermark row is locked first, so writers of one
/// resource run one after the other. A refusal raises `PF001` (message: `current-fence
/// grant-hex|-`), a failed condition `PF002` (message: the op's 1-based index); raising undoes
/// everything the call did.
///
/// Op kinds: 1 put, 2 create, 3 delete, 4 check that the key holds the value, 5 check that
/// the key is absent (claimed with a placeholder row until a write of the batch replaces it,
/// deleted at the end otherwise).
fn apply_function_sql(name: &str, f: &str, r: &str) -> String {
    format!(
        r#"CREATE OR REPLACE FUNCTION {name}(p_resource TEXT, p_fence BIGINT, p_grant BYTEA, p_kinds SMALLINT[], p_keys TEXT[], p_values BYTEA[])
RETURNS VOID LANGUAGE plpgsql AS $palisade$
DECLARE
  n INT := coalesce(array_length(p_keys, 1), 0);
  changed BIGINT;
  cur_fence BIGINT;
  cur_grant BYTEA;
  actual BYTEA;
  claimed TEXT[] := '{{}}';
BEGIN
  IF p_resource IS NOT NULL THEN
    INSERT INTO {f} (resource, fence, grant_id) VALUES (p_resource, p_fence, p_grant)
      ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence, grant_id = EXCLUDED.grant_id
      WHERE {f}.fence < EXCLUDED.fence OR ({f}.fence = EXCLUDED.fence
        AND ({f}.grant_id IS NULL OR {f}.grant_id = EXCLUDED.grant_id));
    GET DIAGNOSTICS changed = ROW_COUNT;
    IF changed = 0 THEN
      SELECT fence, grant_id INTO cur_fence, cur_grant FROM {f} WHERE resource = p_resource;
      RAISE EXCEPTION USING ERRCODE = 'PF001',
        MESSAGE = cur_fence::TEXT || ' ' || coalesce(encode(cur_grant, 'hex'), '-');
    END IF;
  END IF;
  FOR i IN 1..n LOOP
    IF p_kinds[i] = 4 THEN
      claimed := array_remove(claimed, p_keys[i]);
      SELECT value INTO actual FROM {r} WHERE key = p_keys[i] FOR UPDATE;
      IF NOT FOUND OR actual IS DISTINCT FROM p_values[i] THEN
        RAISE EXCEPTION USING ERRCODE = 'PF002', MESSAGE = i::TEXT;
      END IF;
    ELSIF p_kinds[i] = 5 THEN
      INSERT INTO {r} (key, value, fence) VALUES (p_keys[i], ''::BYTEA, NULL) ON CONFLICT (key) DO NOTHING;
      GET DIAGNOSTICS changed = ROW_COUNT;
      IF changed = 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'PF002', MESSAGE = i::TEXT;
      END IF;
      claimed := claimed || p_keys[i];
    END IF;
  END LOOP;
  FOR i IN 1..n LOOP
    IF p_kinds[i] = 1 OR (p_kinds[i] = 2 AND p_keys[i] = ANY(claimed)) THEN
      claimed := array_remove(claimed, p_keys[i]);
      INSERT INTO {r} (key, value, fence) VALUES (p_keys[i], p_values[i], p_fence)
        ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, fence = EXCLUDED.fence;
    ELSIF p_kinds[i] = 2 THEN
      INSERT INTO {r} (key, value, fence) VALUES (p_keys[i], p_values[i], p_fence) ON CONFLICT (key) DO NOTHING;
      GET DIAGNOSTICS changed = ROW_COUNT;
      IF changed = 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'PF002', MESSAGE = i::TEXT;
      END IF;
    ELSIF p_kinds[i] = 3 THEN
      claimed := array_remove(claimed, p_keys[i]);
      DELETE FROM {r} WHERE key = p_keys[i];
    END IF;
  END LOOP;
  IF array_length(claimed, 1) > 0 THEN
    DELETE FROM {r} WHERE key = ANY(claimed);
  END IF;
END
$palisade$;"#
    )
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &self.redacted_url())
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("fences_table", &self.fences_table)
            .field("records_table", &self.records_table)
            .field("locks_table", &self.locks_table)
            .field("require_live_lock", &self.require_live_lock)
            .field("migrate", &self.migrate)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show_and_identifiers_are_checked() {
        let c = PostgresConfig::new("postgres://app:s3cret@db:5432/app?sslmode=require");
        assert_eq!(c.redacted_url(), "postgres://db:5432/app");
        assert!(!format!("{c:?}").contains("s3cret"));
        assert!(c.schema_sql().unwrap().contains("\"palisade_fences\""));
        assert!(c.schema_sql().unwrap().contains("FUNCTION \"palisade_fences__palisade_records_apply\"("));
        let long = PostgresConfig { fences_table: "f".repeat(40), records_table: "r".repeat(40), ..c.clone() };
        let other = PostgresConfig { fences_table: "g".repeat(40), ..long.clone() };
        let (a, b) = (long.apply_function().unwrap(), other.apply_function().unwrap());
        assert!(a.starts_with("\"palisade_apply_") && a.len() == 15 + 16 + 2 && a != b, "{a} {b}");
        assert!(quote_ident("x\"; DROP TABLE y; --").is_err());
        assert!(quote_ident("9x").is_err());
    }

    #[test]
    fn palisade_parameters_are_taken_out_of_the_url() {
        let c = PostgresConfig::from_url("postgres://a@h/db?sslmode=disable&require_live_lock=true&x=1").unwrap();
        assert!(c.require_live_lock);
        assert_eq!(c.url, "postgres://a@h/db?sslmode=disable&x=1");
        let c = PostgresConfig::from_url("postgres://a@h/db?require_live_lock=false").unwrap();
        assert!(!c.require_live_lock);
        assert_eq!(c.url, "postgres://a@h/db");
        assert_eq!(PostgresConfig::from_url("postgres://a@h/db").unwrap().url, "postgres://a@h/db");
        let bad = PostgresConfig::from_url("postgres://a:pw@h/db?require_live_lock=yes").unwrap_err();
        assert_eq!(bad.kind(), ErrorKind::InvalidConfig);
        assert!(!bad.to_string().contains("pw"));
    }
}
