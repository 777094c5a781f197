//! The lease ledger: every lease the gateway was issued, kept in SQLite
//! (`leases.db` under the home, WAL, `synchronous=FULL` so an issued lease
//! is on disk before the sandbox starts) until Vault confirmed its
//! revocation. A gateway that crashed between issue and revoke leaves rows
//! here; the next start revokes the ones whose owner process is gone.
//!
//! Each row names its owner (pid and the process's start time from
//! `/proc`), so two gateways sharing a home never revoke each other's live
//! leases.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

pub const FILE_NAME: &str = "leases.db";

#[derive(Debug, thiserror::Error)]
#[error("lease ledger {path}: {source}")]
pub struct LedgerError {
    pub path: PathBuf,
    #[source]
    pub source: rusqlite::Error,
}

/// A lease the ledger has not seen revoked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseRecord {
    pub lease_id: String,
    pub request_id: String,
    pub mount: String,
    pub role: String,
    pub issued_at: String,
    pub expires_at: String,
    pub owner_pid: u32,
    pub owner_start: u64,
    pub revoke_attempts: u32,
    pub last_error: Option<String>,
}

pub use crate::process::Owner;

pub struct LeaseLedger {
    path: PathBuf,
    conn: Connection,
}

impl std::fmt::Debug for LeaseLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseLedger")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

const SCHEMA_VERSION: i64 = 1;

impl LeaseLedger {
    pub fn open(path: impl Into<PathBuf>) -> Result<LeaseLedger, LedgerError> {
        let path = path.into();
        let err = |source| LedgerError {
            path: path.clone(),
            source,
        };
        // FULL: a lease must be on disk before anything uses it.
        let conn = crate::db::open(&path, "FULL").map_err(err)?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(err)?;
        if version < 1 {
            conn.execute_batch(
                "BEGIN IMMEDIATE;
                 CREATE TABLE IF NOT EXISTS leases (
                     lease_id TEXT PRIMARY KEY,
                     request_id TEXT NOT NULL,
                     mount TEXT NOT NULL,
                     role TEXT NOT NULL,
                     issued_at TEXT NOT NULL,
                     expires_at TEXT NOT NULL,
                     owner_pid INTEGER NOT NULL,
                     owner_start INTEGER NOT NULL,
                     revoked_at TEXT,
                     revoke_attempts INTEGER NOT NULL DEFAULT 0,
                     last_error TEXT
                 );
                 CREATE INDEX IF NOT EXISTS leases_open ON leases(revoked_at);
                 PRAGMA user_version = 1;
                 COMMIT;",
            )
            .map_err(err)?;
        } else if version > SCHEMA_VERSION {
            return Err(err(rusqlite::Error::InvalidParameterName(format!(
                "schema version {version} is newer than this gateway ({SCHEMA_VERSION})"
            ))));
        }
        Ok(LeaseLedger { path, conn })
    }

    pub fn in_home(home: &Path) -> Result<LeaseLedger, LedgerError> {
        LeaseLedger::open(home.join(FILE_NAME))
    }

    fn err(&self) -> impl Fn(rusqlite::Error) -> LedgerError + '_ {
        move |source| LedgerError {
            path: self.path.clone(),
            source,
        }
    }

    /// Record an issued lease (before the credential is used).
    pub fn issued(
        &self,
        lease_id: &str,
        request_id: &str,
        mount: &str,
        role: &str,
        ttl: Duration,
        owner: Owner,
    ) -> Result<(), LedgerError> {
        let now = chrono::Utc::now();
        let expires = now + chrono::Duration::seconds(ttl.as_secs() as i64);
        self.conn
            .execute(
                "INSERT OR REPLACE INTO leases (lease_id, request_id, mount, role, issued_at, expires_at, owner_pid, owner_start)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![lease_id, request_id, mount, role, now.to_rfc3339(), expires.to_rfc3339(), owner.pid, owner.start as i64],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// Vault confirmed the revocation.
    pub fn revoked(&self, lease_id: &str) -> Result<(), LedgerError> {
        self.conn
            .execute(
                "UPDATE leases SET revoked_at = ?2, revoke_attempts = revoke_attempts + 1, last_error = NULL WHERE lease_id = ?1",
                params![lease_id, chrono::Utc::now().to_rfc3339()],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// A revocation attempt failed (the lease stays open).
    pub fn revoke_failed(&self, lease_id: &str, error: &str) -> Result<(), LedgerError> {
        self.conn
            .execute(
                "UPDATE leases SET revoke_attempts = revoke_attempts + 1, last_error = ?2 WHERE lease_id = ?1",
                params![lease_id, error],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// Leases not seen revoked, oldest first.
    pub fn open_leases(&self) -> Result<Vec<LeaseRecord>, LedgerError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT lease_id, request_id, mount, role, issued_at, expires_at, owner_pid, owner_start, revoke_attempts, last_error
                 FROM leases WHERE revoked_at IS NULL ORDER BY issued_at",
            )
            .map_err(self.err())?;
        let rows = stmt
            .query_map([], |r| {
                Ok(LeaseRecord {
                    lease_id: r.get(0)?,
                    request_id: r.get(1)?,
                    mount: r.get(2)?,
                    role: r.get(3)?,
                    issued_at: r.get(4)?,
                    expires_at: r.get(5)?,
                    owner_pid: r.get(6)?,
                    owner_start: r.get::<_, i64>(7)? as u64,
                    revoke_attempts: r.get(8)?,
                    last_error: r.get(9)?,
                })
            })
            .map_err(self.err())?;
        rows.collect::<Result<Vec<_>, _>>().map_err(self.err())
    }

    /// Open leases whose owner process is gone: what a crash left behind.
    pub fn orphans(&self) -> Result<Vec<LeaseRecord>, LedgerError> {
        Ok(self
            .open_leases()?
            .into_iter()
            .filter(|l| {
                !Owner {
                    pid: l.owner_pid,
                    start: l.owner_start,
                }
                .alive()
            })
            .collect())
    }

    pub fn is_revoked(&self, lease_id: &str) -> Result<Option<bool>, LedgerError> {
        self.conn
            .query_row(
                "SELECT revoked_at IS NOT NULL FROM leases WHERE lease_id = ?1",
                params![lease_id],
                |r| r.get(0),
            )
            .optional()
            .map_err(self.err())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_stay_open_until_revoked_and_orphans_are_those_of_dead_owners() {
        let dir = tempfile::tempdir().expect("tmp");
        let l = LeaseLedger::in_home(dir.path()).expect("open");
        let me = Owner::current();
        assert!(me.alive());
        let gone = Owner {
            pid: me.pid,
            start: me.start + 1,
        };
        assert!(!gone.alive(), "a reused pid is another process");
        let ttl = Duration::from_secs(600);
        l.issued("k/creds/r/1", "req-1", "k", "r", ttl, me)
            .expect("1");
        l.issued("k/creds/r/2", "req-2", "k", "r", ttl, gone)
            .expect("2");
        assert_eq!(l.open_leases().expect("open").len(), 2);
        let orphans = l.orphans().expect("orphans");
        assert_eq!(orphans.len(), 1);
        assert_eq!(orphans[0].lease_id, "k/creds/r/2");
        l.revoke_failed("k/creds/r/2", "vault down").expect("fail");
        assert_eq!(
            l.orphans().expect("o")[0].last_error.as_deref(),
            Some("vault down")
        );
        l.revoked("k/creds/r/2").expect("revoked");
        assert!(l.orphans().expect("o").is_empty());
        assert_eq!(l.is_revoked("k/creds/r/2").expect("q"), Some(true));
        assert_eq!(l.is_revoked("k/creds/r/1").expect("q"), Some(false));
        assert_eq!(l.is_revoked("nope").expect("q"), None);
        // Reopening keeps everything (and the schema is not re-created).
        drop(l);
        let l = LeaseLedger::in_home(dir.path()).expect("reopen");
        assert_eq!(l.open_leases().expect("open").len(), 1);
    }
}
