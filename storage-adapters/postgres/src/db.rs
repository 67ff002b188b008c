//! What every module of this crate stands on: the backend's name and how a driver error becomes
//! a Palisade error. The lock service, the store and the transaction all map errors here, so a
//! retryable failure means the same in each.

use palisade_core::{Error, ErrorKind, Result};

/// The name every error and metric of this crate carries.
pub(crate) const BACKEND: &str = "postgres";

/// Maps a sqlx error: pool and connection trouble is [`ErrorKind::Unavailable`] (retryable),
/// serialization failures and deadlocks too; everything else [`ErrorKind::Backend`].
pub fn map_err(e: sqlx::Error) -> Error {
    let kind = match &e {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) | sqlx::Error::Tls(_) => {
            ErrorKind::Unavailable
        }
        // 40001 serialization_failure, 40P01 deadlock_detected, 57P01 admin_shutdown.
        sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("40001" | "40P01" | "57P01")) => {
            ErrorKind::Unavailable
        }
        _ => ErrorKind::Backend,
    };
    Error::new(kind, BACKEND, "PostgreSQL operation failed").with_source(e)
}

/// Why a connection to `url` (redacted) could not be opened. A failure of configuration is
/// [`ErrorKind::InvalidConfig`], not retryable, and its message names the cause: TLS refused
/// (a server certificate from a CA not trusted, for another host name, or expired; TLS asked
/// of a server without it, or of a build without the `tls` feature), a certificate or key file
/// missing or unreadable, the server refusing the session's authentication. Anything else (refused, reset, timed out, the pool's timeout) is
/// [`ErrorKind::Unavailable`] and retryable. Neither message carries a password.
pub(crate) fn connect_error(e: sqlx::Error, url: &str) -> Error {
    let misconfigured = match &e {
        sqlx::Error::Tls(cause) => Some(tls_failure(cause.as_ref()).unwrap_or_else(|| format!("TLS: {cause}"))),
        sqlx::Error::Configuration(cause) => Some(cause.to_string()),
        sqlx::Error::Io(io) => tls_failure(io).or_else(|| {
            matches!(io.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied).then(|| {
                format!(
                    "a file it was given is missing or unreadable (sslrootcert, sslcert, sslkey or a socket path): {io}"
                )
            })
        }),
        // Class 28, invalid authorization: no `pg_hba.conf` line admits this session (say,
        // plaintext to a server that takes only TLS), a wrong password, a missing certificate.
        sqlx::Error::Database(db) if db.code().is_some_and(|code| code.starts_with("28")) => {
            Some(db.message().to_string())
        }
        _ => None,
    };
    match misconfigured {
        Some(cause) => Error::new(ErrorKind::InvalidConfig, BACKEND, format!("cannot connect to {url}: {cause}"))
            .with_source(e)
            .with_retryable(false),
        None => Error::new(ErrorKind::Unavailable, BACKEND, format!("cannot connect to {url}"))
            .with_source(e)
            .with_retryable(true),
    }
}

/// The handshake's own refusal, which reaches sqlx as an I/O error around rustls's (or as its
/// TLS error).
#[cfg(feature = "tls")]
fn tls_failure(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    palisade_core::spi::tls::handshake_refusal(error)
}

#[cfg(not(feature = "tls"))]
fn tls_failure(_: &(dyn std::error::Error + 'static)) -> Option<String> {
    None
}

/// Whether the request may have reached the server and been applied although no reply came
/// back: the connection broke (or spoke nonsense) after the request was sent.
pub(crate) fn reply_lost(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Io(_) | sqlx::Error::Protocol(_))
}

/// A failed COMMIT whose reply never arrived may have committed: say so instead of guessing.
pub(crate) fn map_commit_err(e: sqlx::Error) -> Error {
    if reply_lost(&e) {
        return Error::new(
            ErrorKind::OutcomeUnknown,
            BACKEND,
            "COMMIT was sent but not acknowledged; re-read before retrying",
        )
        .with_source(e)
        .with_retryable(false);
    }
    map_err(e)
}

/// Checks an identifier and returns it double-quoted.
pub(crate) fn quote_ident(name: &str) -> Result<String> {
    palisade_core::spi::quote_sql_identifier(BACKEND, name)
}

/// DDL that adds a column to `table` (quoted) only if it is missing.
///
/// Not `ALTER TABLE … ADD COLUMN IF NOT EXISTS`: that takes the table's `ACCESS EXCLUSIVE` lock
/// even when the column exists, so a client connecting (and migrating) behind any open
/// transaction on the table — a fenced transaction holding its lock row — would queue every
/// later statement on the table behind itself until that transaction ends.
pub(crate) fn add_column_sql(table: &str, column: &str, definition: &str) -> String {
    format!(
        "DO $$BEGIN IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('{table}') \
         AND attname = '{column}' AND NOT attisdropped) THEN ALTER TABLE {table} ADD COLUMN {column} {definition}; \
         END IF; END$$;"
    )
}

/// Whether `e` is PostgreSQL's `undefined_table` (42P01): a table this database never had, or
/// lost.
pub(crate) fn undefined_table(e: &palisade_core::Error) -> bool {
    std::error::Error::source(e)
        .and_then(|source| source.downcast_ref::<sqlx::Error>())
        .is_some_and(|e| matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("42P01")))
}
