//! One Redis master: a lazily (re)connected client and commands bounded by the node timeout.

use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use palisade_core::{Error, ErrorKind, redact_url};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError, Script};

use crate::service::BACKEND;

/// What one master said to one command.
#[derive(Debug)]
pub(crate) enum Reply {
    /// It did it (set the key, released, extended).
    Yes,
    /// It answered no (the key is somebody else's, or not there).
    No,
    /// No usable answer within the node timeout: down, hung, refused, or an error reply. The
    /// command may or may not have run.
    Failed(String),
}

/// One independent master.
///
/// The connection is a plain multiplexed one whose response timeout *is* the node timeout, so
/// the hot path arms one timer per command and nothing else. A connection that broke is
/// forgotten and made again on next use (also for a master that was down at start-up).
pub(crate) struct Node {
    /// 1-based position in the configured list, for messages.
    number: usize,
    url: String,
    client: redis::Client,
    conn: Mutex<Option<MultiplexedConnection>>,
    /// One connect at a time per master.
    connecting: tokio::sync::Mutex<()>,
    node_timeout: Duration,
    connect_timeout: Duration,
}

impl Node {
    pub(crate) fn new(
        number: usize,
        url: &str,
        node_timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<Self, Error> {
        let client = redis::Client::open(url).map_err(|e| {
            Error::new(ErrorKind::InvalidConfig, BACKEND, format!("bad URL for master {number}: {}", redact_url(url)))
                .with_source(e)
        })?;
        Ok(Node {
            number,
            url: redact_url(url),
            client,
            conn: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            node_timeout,
            connect_timeout,
        })
    }

    /// Connects now (at start-up), waiting up to the connect timeout. `Err` says why not.
    pub(crate) async fn connect(&self) -> Result<(), String> {
        match tokio::time::timeout(self.connect_timeout, self.connection()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("master {} ({}): {e}", self.number, self.url)),
            Err(_) => {
                Err(format!("master {} ({}): no connection within {:?}", self.number, self.url, self.connect_timeout))
            }
        }
    }

    /// A connection for reading (`palisade inspect`, `palisade doctor`), made within the
    /// connect timeout; `Err` says why not.
    pub(crate) async fn reader(&self) -> Result<MultiplexedConnection, String> {
        match tokio::time::timeout(self.connect_timeout, self.connection()).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(format!("master {} ({}): {e}", self.number, self.url)),
            Err(_) => {
                Err(format!("master {} ({}): no connection within {:?}", self.number, self.url, self.connect_timeout))
            }
        }
    }

    /// `master N (address)`, without credentials, for checks and errors.
    pub(crate) fn label(&self) -> String {
        format!("master {} ({})", self.number, self.url)
    }

    /// The bound on one reply of this master.
    pub(crate) fn node_timeout(&self) -> Duration {
        self.node_timeout
    }

    fn cached(&self) -> Option<MultiplexedConnection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    async fn connection(&self) -> redis::RedisResult<MultiplexedConnection> {
        if let Some(conn) = self.cached() {
            return Ok(conn);
        }
        let _gate = self.connecting.lock().await;
        if let Some(conn) = self.cached() {
            return Ok(conn);
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.node_timeout));
        let conn = self.client.get_multiplexed_async_connection_with_config(&config).await?;
        *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = Some(conn.clone());
        Ok(conn)
    }

    /// Runs `op` on this master: bounded by the connection's response timeout when connected,
    /// and by the node timeout as a whole when a connection must be made first.
    async fn bounded<F, Fut>(&self, what: &str, op: F) -> Reply
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<bool>>,
    {
        let result = match self.cached() {
            Some(conn) => op(conn).await,
            None => {
                let run = async {
                    let conn = self.connection().await?;
                    op(conn).await
                };
                match tokio::time::timeout(self.node_timeout, run).await {
                    Ok(result) => result,
                    Err(_) => {
                        return Reply::Failed(format!(
                            "master {}: {what} timed out after {:?} (connecting)",
                            self.number, self.node_timeout
                        ));
                    }
                }
            }
        };
        match result {
            Ok(true) => Reply::Yes,
            Ok(false) => Reply::No,
            Err(e) => {
                if e.is_connection_dropped() || e.is_io_error() || e.is_unrecoverable_error() {
                    // Racing a fresh connection made meanwhile costs one reconnect, no more.
                    *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = None;
                }
                Reply::Failed(self.describe(what, &e))
            }
        }
    }

    fn describe(&self, what: &str, e: &RedisError) -> String {
        if e.is_timeout() {
            return format!("master {}: {what} timed out after {:?}", self.number, self.node_timeout);
        }
        format!("master {} ({}): {what} failed: {e}", self.number, self.url)
    }

    /// `SET key token NX PX ttl_ms`: `Yes` if the key was free and is now ours.
    pub(crate) async fn set_nx_px(&self, key: &str, token: &[u8], ttl_ms: u64) -> Reply {
        self.bounded("SET NX PX", |mut conn| async move {
            let reply: Option<redis::Value> =
                redis::cmd("SET").arg(key).arg(token).arg("NX").arg("PX").arg(ttl_ms).query_async(&mut conn).await?;
            Ok(reply.is_some())
        })
        .await
    }

    /// Runs a compare-token script (`KEYS[1] = key`, `ARGV = token[, ttl]`): `Yes` if it
    /// returned 1.
    pub(crate) async fn compare_token(
        &self,
        what: &str,
        script: &Script,
        key: &str,
        token: &[u8],
        ttl_ms: Option<u64>,
    ) -> Reply {
        self.bounded(what, |mut conn| async move {
            let mut invocation = script.key(key);
            invocation.arg(token);
            if let Some(ms) = ttl_ms {
                invocation.arg(ms);
            }
            let done: i64 = invocation.invoke_async(&mut conn).await?;
            Ok(done == 1)
        })
        .await
    }
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node").field("number", &self.number).field("url", &self.url).finish_non_exhaustive()
    }
}
