//! [`Db`] on a SQLite file: one connection, writes in `BEGIN IMMEDIATE`
//! transactions (one writer at a time across every process on the file).
//! The connection is taken in turn by the threads of this process.

use std::path::{Path, PathBuf};

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, Transaction, TransactionBehavior};

use super::{Body, Db, DbError, End, Row, SqlValue, Tx};

#[derive(Debug)]
pub struct SqliteDb {
    path: PathBuf,
    conn: std::sync::Mutex<Connection>,
}

impl SqliteDb {
    /// Open (creating) the file; `synchronous` as in [`super::open`].
    pub fn open(path: &Path, synchronous: &str) -> Result<SqliteDb, DbError> {
        Ok(SqliteDb {
            path: path.to_path_buf(),
            conn: std::sync::Mutex::new(super::open(path, synchronous)?),
        })
    }

    /// The connection itself, for a store's own migrations.
    pub fn connection(&mut self) -> &mut Connection {
        self.conn.get_mut().unwrap_or_else(|p| p.into_inner())
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl rusqlite::ToSql for SqlValue {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            SqlValue::Null => ToSqlOutput::Borrowed(ValueRef::Null),
            SqlValue::Int(v) => ToSqlOutput::Borrowed(ValueRef::Integer(*v)),
            SqlValue::Text(v) => ToSqlOutput::Borrowed(ValueRef::Text(v.as_bytes())),
            SqlValue::Bool(v) => ToSqlOutput::Borrowed(ValueRef::Integer(i64::from(*v))),
            SqlValue::Bytes(v) => ToSqlOutput::Borrowed(ValueRef::Blob(v)),
        })
    }
}

struct SqliteTx<'a>(&'a Connection);

impl Tx for SqliteTx<'_> {
    fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<u64, DbError> {
        let n = self
            .0
            .prepare_cached(sql)?
            .execute(rusqlite::params_from_iter(params))?;
        Ok(n as u64)
    }

    fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<Vec<Row>, DbError> {
        let mut stmt = self.0.prepare_cached(sql)?;
        let columns = stmt.column_count();
        let mut rows = stmt.query(rusqlite::params_from_iter(params))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            let mut row = Vec::with_capacity(columns);
            for i in 0..columns {
                row.push(match r.get_ref(i)? {
                    ValueRef::Null => SqlValue::Null,
                    ValueRef::Integer(v) => SqlValue::Int(v),
                    ValueRef::Blob(b) => SqlValue::Bytes(b.to_vec()),
                    ValueRef::Text(t) => SqlValue::Text(
                        std::str::from_utf8(t)
                            .map_err(|e| DbError::Shape(format!("column {i}: {e}")))?
                            .to_string(),
                    ),
                    other => {
                        return Err(DbError::Shape(format!(
                            "column {i}: unexpected {:?}",
                            other.data_type()
                        )));
                    }
                });
            }
            out.push(Row(row));
        }
        Ok(out)
    }
}

impl Db for SqliteDb {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn write(&self, body: &mut Body<'_>) -> Result<(), DbError> {
        let conn = self.conn();
        let tx = Transaction::new_unchecked(&conn, TransactionBehavior::Immediate)?;
        match body(&mut SqliteTx(&tx))? {
            End::Commit => tx.commit()?,
            End::Rollback => tx.rollback()?,
        }
        Ok(())
    }

    fn read(&self, body: &mut Body<'_>) -> Result<(), DbError> {
        let conn = self.conn();
        let tx = Transaction::new_unchecked(&conn, TransactionBehavior::Deferred)?;
        body(&mut SqliteTx(&tx))?;
        tx.rollback()?;
        Ok(())
    }
}
