//! Application tables on PostgreSQL or SQLite, for the use-case examples that keep their data
//! in tables of their own (invoice numbering, outbox relay).
//!
//! An application is written for one database; these examples run on the embedded default
//! (SQLite) and on PostgreSQL, so their statements are written once (`$N` placeholders, types
//! both databases read the same) and [`with_db!`](crate::with_db) runs the same block on
//! whichever store the URL named. Inside the block, `store` is a
//! [`PostgresStore`](palisade::postgres::PostgresStore) or a
//! [`SqliteStore`](palisade::sqlite::SqliteStore), and `sql_err` maps a `sqlx::Error` to a
//! Palisade error. Both stores have the same fenced API (`begin_fenced(&lease)`,
//! `check_fence_in(conn, &lease)`, `update_row_fenced_in`), and both open a write transaction
//! of the application's own with `store.begin()` (SQLite's is the store's own method; for
//! PostgreSQL, [`PgBegin`] gives the pool's transaction the same shape).

use palisade::prelude::*;

/// The SQL store an example's tables live in.
#[derive(Clone)]
pub enum Db {
    /// PostgreSQL (`postgres://…`, with the `postgres` feature).
    #[cfg(feature = "postgres")]
    Postgres(palisade::postgres::PostgresStore),
    /// SQLite (`sqlite::memory:`, `sqlite://PATH`).
    Sqlite(palisade::sqlite::SqliteStore),
}

impl Db {
    /// Connects to the store at `url` and creates the example's tables (`create`: `CREATE
    /// TABLE IF NOT EXISTS …` statements) if missing. Any other store is an
    /// [`ErrorKind::InvalidConfig`] naming the example: its data is in SQL tables.
    pub async fn connect(url: &str, example: &'static str, create: &[&'static str]) -> palisade::Result<Db> {
        let db = if url.starts_with("sqlite:") {
            Db::Sqlite(palisade::sqlite::SqliteStore::connect(url).await?)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Self::postgres(url, example).await?
        } else {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                example,
                format!(
                    "{}: this example keeps its data in SQL tables of its own; give --store a sqlite: or \
                     postgres:// URL (the warehouse example runs on every store)",
                    palisade::redact_url(url)
                ),
            ));
        };
        db.create_tables(create).await?;
        Ok(db)
    }

    #[cfg(feature = "postgres")]
    async fn postgres(url: &str, _example: &'static str) -> palisade::Result<Db> {
        Ok(Db::Postgres(palisade::postgres::PostgresStore::connect(url).await?))
    }

    #[cfg(not(feature = "postgres"))]
    async fn postgres(url: &str, example: &'static str) -> palisade::Result<Db> {
        Err(Error::new(
            ErrorKind::InvalidConfig,
            example,
            format!(
                "{}: build with --features postgres,palisade-examples/postgres for PostgreSQL",
                palisade::redact_url(url)
            ),
        ))
    }

    /// The store's name, for reports (`postgres`, `sqlite`).
    pub fn backend(&self) -> &'static str {
        match self {
            #[cfg(feature = "postgres")]
            Db::Postgres(_) => "postgres",
            Db::Sqlite(_) => "sqlite",
        }
    }

    /// Runs `statements` in one write transaction. On PostgreSQL, concurrent `CREATE TABLE IF
    /// NOT EXISTS` collide on the catalog (two examples starting at once): they take turns on
    /// an advisory lock held until the commit.
    pub async fn create_tables(&self, statements: &[&'static str]) -> palisade::Result<()> {
        match self {
            #[cfg(feature = "postgres")]
            Db::Postgres(store) => {
                use palisade::postgres::map_err;
                let mut tx = store.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock(7243010046)").execute(tx.conn()).await.map_err(map_err)?;
                for &statement in statements {
                    sqlx::query(statement).execute(tx.conn()).await.map_err(map_err)?;
                }
                tx.commit().await
            }
            Db::Sqlite(store) => {
                let mut tx = store.begin().await?;
                for &statement in statements {
                    sqlx::query(statement).execute(tx.conn()).await.map_err(palisade::sqlite::map_err)?;
                }
                tx.commit().await
            }
        }
    }
}

/// Runs the same block on the store `$db` names, with `$store` bound to it and `sql_err` to
/// its driver's error mapping (see the [module](crate::sql) docs).
#[macro_export]
macro_rules! with_db {
    ($db:expr, |$store:ident| $body:expr) => {
        match $db {
            #[cfg(feature = "postgres")]
            $crate::sql::Db::Postgres($store) => {
                #[allow(unused_imports)]
                use {::palisade::postgres::map_err as sql_err, $crate::sql::PgBegin as _};
                $body
            }
            $crate::sql::Db::Sqlite($store) => {
                #[allow(unused_imports)]
                use ::palisade::sqlite::map_err as sql_err;
                $body
            }
        }
    };
}

/// `store.begin()` on PostgreSQL, as SQLite's store has it: the application's own
/// transaction from the store's pool, answering with Palisade errors.
#[cfg(feature = "postgres")]
pub trait PgBegin {
    /// Opens a transaction on the store's pool.
    fn begin(&self) -> impl Future<Output = palisade::Result<PgTx>> + Send;
}

#[cfg(feature = "postgres")]
impl PgBegin for palisade::postgres::PostgresStore {
    async fn begin(&self) -> palisade::Result<PgTx> {
        Ok(PgTx(self.pool().begin().await.map_err(palisade::postgres::map_err)?))
    }
}

/// A PostgreSQL transaction shaped like SQLite's `WriteTransaction`: `conn()` for your
/// statements, `commit()` answering with a Palisade error; dropping it rolls back.
#[cfg(feature = "postgres")]
pub struct PgTx(sqlx::Transaction<'static, sqlx::Postgres>);

#[cfg(feature = "postgres")]
impl PgTx {
    /// The connection to run statements on.
    pub fn conn(&mut self) -> &mut sqlx::PgConnection {
        &mut self.0
    }

    /// Commits the transaction.
    pub async fn commit(self) -> palisade::Result<()> {
        self.0.commit().await.map_err(palisade::postgres::map_err)
    }
}
