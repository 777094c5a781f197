//! The gateway's databases behind one interface: SQLite (a file under the
//! home; the embedded default of a single host) and PostgreSQL (shared by
//! the replicas of a team gateway). A store (approvals, …) writes its
//! logic once against [`Db`] and [`Tx`]: statements in the SQL both speak,
//! with `?1`-style parameters, run in transactions that serialise with
//! every other writer of the same database.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

pub mod postgres;
pub mod sqlite;

/// `synchronous`: `NORMAL` (durable at checkpoints) or `FULL` (every
/// commit on disk before it returns). The directory is made, a busy
/// timeout lets the server and the CLI share the file, WAL.
pub fn open(path: &Path, synchronous: &str) -> rusqlite::Result<Connection> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let _ = std::fs::create_dir_all(dir);
    }
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", synchronous)?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(conn)
}

/// A value bound to a statement or read from a row.
#[derive(Debug, Clone, PartialEq)]
pub enum SqlValue {
    Null,
    Int(i64),
    Text(String),
    Bool(bool),
    Bytes(Vec<u8>),
}

impl From<i64> for SqlValue {
    fn from(v: i64) -> Self {
        SqlValue::Int(v)
    }
}
impl From<u32> for SqlValue {
    fn from(v: u32) -> Self {
        SqlValue::Int(i64::from(v))
    }
}
impl From<bool> for SqlValue {
    fn from(v: bool) -> Self {
        SqlValue::Bool(v)
    }
}
impl From<&str> for SqlValue {
    fn from(v: &str) -> Self {
        SqlValue::Text(v.to_string())
    }
}
impl From<String> for SqlValue {
    fn from(v: String) -> Self {
        SqlValue::Text(v)
    }
}
impl From<&String> for SqlValue {
    fn from(v: &String) -> Self {
        SqlValue::Text(v.clone())
    }
}
impl From<&[u8]> for SqlValue {
    fn from(v: &[u8]) -> Self {
        SqlValue::Bytes(v.to_vec())
    }
}
impl<T: Into<SqlValue>> From<Option<T>> for SqlValue {
    fn from(v: Option<T>) -> Self {
        v.map_or(SqlValue::Null, Into::into)
    }
}

/// One row: its columns in the order the statement selected them.
#[derive(Debug, Clone, PartialEq)]
pub struct Row(pub Vec<SqlValue>);

impl Row {
    fn at(&self, i: usize) -> Result<&SqlValue, DbError> {
        self.0
            .get(i)
            .ok_or_else(|| DbError::Shape(format!("no column {i}")))
    }

    pub fn int(&self, i: usize) -> Result<i64, DbError> {
        match self.at(i)? {
            SqlValue::Int(v) => Ok(*v),
            other => Err(DbError::Shape(format!(
                "column {i}: an integer expected, got {other:?}"
            ))),
        }
    }

    pub fn opt_int(&self, i: usize) -> Result<Option<i64>, DbError> {
        match self.at(i)? {
            SqlValue::Null => Ok(None),
            _ => self.int(i).map(Some),
        }
    }

    pub fn text(&self, i: usize) -> Result<String, DbError> {
        match self.at(i)? {
            SqlValue::Text(v) => Ok(v.clone()),
            other => Err(DbError::Shape(format!(
                "column {i}: text expected, got {other:?}"
            ))),
        }
    }

    pub fn opt_text(&self, i: usize) -> Result<Option<String>, DbError> {
        match self.at(i)? {
            SqlValue::Null => Ok(None),
            _ => self.text(i).map(Some),
        }
    }

    pub fn bytes(&self, i: usize) -> Result<Vec<u8>, DbError> {
        match self.at(i)? {
            SqlValue::Bytes(v) => Ok(v.clone()),
            other => Err(DbError::Shape(format!(
                "column {i}: bytes expected, got {other:?}"
            ))),
        }
    }

    /// A boolean (SQLite keeps it as an integer).
    pub fn bool(&self, i: usize) -> Result<bool, DbError> {
        match self.at(i)? {
            SqlValue::Bool(v) => Ok(*v),
            SqlValue::Int(v) => Ok(*v != 0),
            other => Err(DbError::Shape(format!(
                "column {i}: a boolean expected, got {other:?}"
            ))),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("{0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("{}", postgres_message(.0))]
    Postgres(#[from] tokio_postgres::Error),
    /// The connection was lost while the transaction committed: its
    /// writes may or may not have been kept (the caller reads to know).
    #[error("the database did not answer the commit, which may have happened: {0}")]
    CommitUnknown(String),
    /// A row that is not what the statement selects.
    #[error("unexpected row: {0}")]
    Shape(String),
    #[error("{0}")]
    Other(String),
}

/// What PostgreSQL said (its error's own message and code), or what
/// failed on the way to it ("db error" alone says nothing).
fn postgres_message(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} ({}): {}", db.severity(), db.code().code(), db.message());
    }
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

impl DbError {
    /// The database gave up the transaction for another one (PostgreSQL's
    /// serialization failure or deadlock): running it again is right.
    pub fn retryable(&self) -> bool {
        match self {
            DbError::Postgres(e) => e.code().is_some_and(|c| {
                *c == tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE
                    || *c == tokio_postgres::error::SqlState::T_R_DEADLOCK_DETECTED
            }),
            _ => false,
        }
    }
}

/// Statements inside one transaction.
pub trait Tx {
    /// Run a statement; the rows it changed.
    fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<u64, DbError>;
    /// Run a query; its rows.
    fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<Vec<Row>, DbError>;
    /// Tell the database's listeners on `channel` (at commit, and only if
    /// it commits). A database without listeners (SQLite) does nothing:
    /// its readers poll.
    fn notify(&mut self, _channel: &str, _payload: &str) -> Result<(), DbError> {
        Ok(())
    }
    /// The first row of a query, if any.
    fn query_opt(&mut self, sql: &str, params: &[SqlValue]) -> Result<Option<Row>, DbError> {
        Ok(self.query(sql, params)?.into_iter().next())
    }
}

/// What a transaction's body says: keep its writes or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Commit,
    Rollback,
}

/// The body of a transaction. It may be run more than once (a database
/// that gives up a transaction for a concurrent one runs it again): it
/// keeps what it found in its own state, overwritten on each run.
pub type Body<'a> = dyn FnMut(&mut dyn Tx) -> Result<End, DbError> + Send + 'a;

/// A database a store keeps its rows in.
pub trait Db: Send + Sync + std::fmt::Debug {
    /// Where it is, for messages: a path, or a PostgreSQL host and
    /// database (never a password).
    fn describe(&self) -> String;
    /// Where it is, in a message a caller (an agent among them) may read:
    /// a shared database's host, port and role stay in the operator's log.
    fn label(&self) -> String {
        self.describe()
    }
    /// Run `body` in one transaction serialised with every other writer.
    fn write(&self, body: &mut Body<'_>) -> Result<(), DbError>;
    /// Run `body` for reads (a consistent snapshot; its writes, if any,
    /// are rolled back).
    fn read(&self, body: &mut Body<'_>) -> Result<(), DbError>;
    /// Run `body` in one transaction that sees the latest committed rows
    /// and waits for the writers of the rows it updates (PostgreSQL's READ
    /// COMMITTED): for a body whose one decisive write is a conditional
    /// `UPDATE` of one row (`UPDATE … RETURNING` of a row every writer
    /// moves on; `UPDATE … WHERE state = 'approved'` of a row only one
    /// writer may change), so that the writers queue on that row, the
    /// later ones finding the condition false, instead of being given up
    /// and run again. A database that runs one writer at a time (SQLite)
    /// runs it as [`Db::write`].
    fn write_queued(&self, body: &mut Body<'_>) -> Result<(), DbError> {
        self.write(body)
    }
}
