//! The lease ledger: every lease the gateway was issued, kept until Vault
//! confirmed its revocation, behind one interface ([`Ledger`]) with two
//! implementations:
//!
//! - [`LocalLedger`], a single host's: SQLite (`leases.db` under the home,
//!   WAL, `synchronous=FULL` so an issued lease is on disk before the
//!   sandbox starts). Each row names its owner (pid and the process's start
//!   time from `/proc`), so two gateways sharing a home never revoke each
//!   other's live leases; the next start revokes the ones whose owner
//!   process is gone.
//! - [`SharedLedger`], the replicas' (PostgreSQL, `[store]`): each row
//!   names the replica that minted it, and each replica shows it is alive
//!   by holding an advisory lock on a connection of its own (and beating a
//!   heartbeat row). A replica that dies (`kill -9`, its host gone) loses
//!   the lock when its connection closes, or stops beating; every survivor
//!   looks every [`SharedLedger::WATCH_EVERY`] and the first to see it
//!   takes its open leases over, in one transaction, and revokes them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

use gateway_store::{Db, DbError, SqlValue};

pub const FILE_NAME: &str = "leases.db";

#[derive(Debug, thiserror::Error)]
#[error("lease ledger {at}: {source}")]
pub struct LedgerError {
    /// The file, or the database (never its password).
    pub at: String,
    #[source]
    pub source: DbError,
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
    /// The owning process (a single host's ledger; 0 in a shared one).
    pub owner_pid: u32,
    pub owner_start: u64,
    /// The owning replica (a shared ledger's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner_replica: Option<String>,
    pub revoke_attempts: u32,
    pub last_error: Option<String>,
}

pub use gateway_base::process::Owner;

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
        let err = |source: rusqlite::Error| LedgerError {
            at: path.display().to_string(),
            source: source.into(),
        };
        // FULL: a lease must be on disk before anything uses it.
        let conn = gateway_store::open(&path, "FULL").map_err(err)?;
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
        move |source: rusqlite::Error| LedgerError {
            at: self.path.display().to_string(),
            source: source.into(),
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
                    owner_replica: None,
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

/// The ledger a broker records its leases in, as seen by one process:
/// its own leases, and those of owners that are gone.
pub trait Ledger: Send + Sync + std::fmt::Debug {
    /// Where it is, for messages.
    fn describe(&self) -> String;
    /// Record a lease this process was issued (before the credential is used).
    fn issued(
        &self,
        lease_id: &str,
        request_id: &str,
        mount: &str,
        role: &str,
        ttl: Duration,
    ) -> Result<(), LedgerError>;
    /// Vault confirmed the revocation.
    fn revoked(&self, lease_id: &str) -> Result<(), LedgerError>;
    /// A revocation attempt failed (the lease stays open).
    fn revoke_failed(&self, lease_id: &str, error: &str) -> Result<(), LedgerError>;
    /// `Some(true)` once revoked; `None` for a lease it never held.
    fn is_revoked(&self, lease_id: &str) -> Result<Option<bool>, LedgerError>;
    /// Every lease not seen revoked, oldest first.
    fn open_leases(&self) -> Result<Vec<LeaseRecord>, LedgerError>;
    /// This process's open leases.
    fn own(&self) -> Result<Vec<LeaseRecord>, LedgerError>;
    /// The open leases of owners that are gone, now this process's to
    /// revoke (in a shared ledger, taken over in one transaction, so that
    /// one survivor revokes each).
    fn claim_orphans(&self) -> Result<Vec<LeaseRecord>, LedgerError>;
    /// Leases this process took over from a dead owner and has not yet
    /// seen revoked, due to be tried again (a failed revocation is tried
    /// again after 2, 4, 8 … s, at most every 5 minutes, until the lease's
    /// own expiry, when Vault ends it anyway).
    fn claimed_unrevoked(&self) -> Result<Vec<LeaseRecord>, LedgerError> {
        Ok(Vec::new())
    }
    /// This process's name among the replicas of a shared ledger.
    fn replica(&self) -> Option<&str> {
        None
    }
    /// The replicas the ledger knows alive (`None`: not a shared ledger);
    /// what a dead one made is for the living to delete.
    fn live_replicas(&self) -> Result<Option<Vec<String>>, LedgerError> {
        Ok(None)
    }
    /// How long before this process may call others dead (`None`: now).
    fn ready_in(&self) -> Option<Duration> {
        None
    }
    /// How often a running gateway looks for orphans (`None`: only at its
    /// start; a single host's gateways share nothing else).
    fn watch_every(&self) -> Option<Duration>;
}

/// A single host's ledger ([`LeaseLedger`]), for this process.
#[derive(Debug)]
pub struct LocalLedger {
    inner: std::sync::Mutex<LeaseLedger>,
    owner: Owner,
}

impl LocalLedger {
    pub fn in_home(home: &Path) -> Result<LocalLedger, LedgerError> {
        Ok(LocalLedger {
            inner: std::sync::Mutex::new(LeaseLedger::in_home(home)?),
            owner: Owner::current(),
        })
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&LeaseLedger) -> Result<T, LedgerError>,
    ) -> Result<T, LedgerError> {
        f(&self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Ledger for LocalLedger {
    fn describe(&self) -> String {
        self.with(|l| Ok(l.path.display().to_string()))
            .unwrap_or_default()
    }
    fn issued(
        &self,
        lease_id: &str,
        request_id: &str,
        mount: &str,
        role: &str,
        ttl: Duration,
    ) -> Result<(), LedgerError> {
        self.with(|l| l.issued(lease_id, request_id, mount, role, ttl, self.owner))
    }
    fn revoked(&self, lease_id: &str) -> Result<(), LedgerError> {
        self.with(|l| l.revoked(lease_id))
    }
    fn revoke_failed(&self, lease_id: &str, error: &str) -> Result<(), LedgerError> {
        self.with(|l| l.revoke_failed(lease_id, error))
    }
    fn is_revoked(&self, lease_id: &str) -> Result<Option<bool>, LedgerError> {
        self.with(|l| l.is_revoked(lease_id))
    }
    fn open_leases(&self) -> Result<Vec<LeaseRecord>, LedgerError> {
        self.with(|l| l.open_leases())
    }
    fn own(&self) -> Result<Vec<LeaseRecord>, LedgerError> {
        Ok(self
            .open_leases()?
            .into_iter()
            .filter(|l| l.owner_pid == self.owner.pid && l.owner_start == self.owner.start)
            .collect())
    }
    fn claim_orphans(&self) -> Result<Vec<LeaseRecord>, LedgerError> {
        self.with(|l| l.orphans())
    }
    fn watch_every(&self) -> Option<Duration> {
        None
    }
}

/// The replicas' ledger in PostgreSQL, for this replica (module docs).
pub struct SharedLedger {
    db: Box<dyn Db + Sync>,
    me: String,
    /// The advisory lock this replica holds while alive.
    key: i64,
    /// This replica's presence (`None`: a reader, not a replica).
    alive: Option<gateway_store::postgres::HeldLock>,
}

impl std::fmt::Debug for SharedLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedLedger")
            .field("db", &self.db.describe())
            .field("replica", &self.me)
            .finish_non_exhaustive()
    }
}

/// The shared ledger's schema (refinery's history table:
/// `gateway_leases_schema`).
pub const SHARED_MIGRATIONS: &[(&str, &str)] = &[
    (
        "V1__leases",
        "CREATE TABLE gateway_replicas (
         id TEXT PRIMARY KEY,
         lock_key BIGINT NOT NULL,
         host TEXT NOT NULL,
         pid BIGINT NOT NULL,
         started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
         heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now()
     );
     CREATE TABLE gateway_leases (
         lease_id TEXT PRIMARY KEY,
         request_id TEXT NOT NULL,
         mount TEXT NOT NULL,
         role TEXT NOT NULL,
         issued_at TEXT NOT NULL,
         expires_at TEXT NOT NULL,
         owner TEXT NOT NULL,
         revoked_at TEXT,
         revoke_attempts INTEGER NOT NULL DEFAULT 0,
         last_error TEXT
     );
     CREATE INDEX gateway_leases_open ON gateway_leases (owner) WHERE revoked_at IS NULL;",
    ),
    (
        "V2__claimed_from",
        "ALTER TABLE gateway_leases ADD COLUMN claimed_from TEXT;",
    ),
    (
        "V3__next_try_at",
        "ALTER TABLE gateway_leases ADD COLUMN next_try_at TIMESTAMPTZ;",
    ),
];

const LEASE_COLUMNS: &str =
    "lease_id, request_id, mount, role, issued_at, expires_at, owner, revoke_attempts, last_error";

fn shared_record(r: &gateway_store::Row) -> Result<LeaseRecord, DbError> {
    Ok(LeaseRecord {
        lease_id: r.text(0)?,
        request_id: r.text(1)?,
        mount: r.text(2)?,
        role: r.text(3)?,
        issued_at: r.text(4)?,
        expires_at: r.text(5)?,
        owner_pid: 0,
        owner_start: 0,
        owner_replica: Some(r.text(6)?),
        revoke_attempts: u32::try_from(r.int(7)?).unwrap_or(u32::MAX),
        last_error: r.opt_text(8)?,
    })
}

impl SharedLedger {
    /// How often each replica beats its heartbeat, and looks for the
    /// leases of replicas that died.
    pub const WATCH_EVERY: Duration = Duration::from_secs(2);
    /// A replica whose lock is free is dead once its heartbeat is this old
    /// (three beats missed): a connection that only blinked (a network
    /// blip, the database restarting) is made again, and the lock taken
    /// again, well within it.
    pub const LOCK_FREE_SECONDS: u64 = 6;
    /// A replica whose heartbeat is this old is dead even if its lock is
    /// still held (its host vanished and the database has not yet ended
    /// its session).
    pub const STALE_SECONDS: u64 = 30;
    /// A replica calls others dead only once its own lock has been held
    /// this long without a break: after the database came back, every
    /// replica has had the time to take its lock again.
    pub const SETTLED: Duration = Duration::from_secs(6);

    /// This replica's view of the ledger in `db` (migrated first): it
    /// shows itself alive before it returns, and for as long as it lives.
    pub fn open(db: gateway_store::postgres::PostgresDb) -> Result<SharedLedger, LedgerError> {
        let at = Db::describe(&db);
        let err = |source| LedgerError {
            at: at.clone(),
            source,
        };
        db.migrate("gateway_leases_schema", SHARED_MIGRATIONS)
            .map_err(err)?;
        let me = uuid::Uuid::new_v4().to_string();
        let mut key = [0u8; 8];
        getrandom::fill(&mut key).map_err(|e| err(DbError::Other(format!("random: {e}"))))?;
        let key = i64::from_le_bytes(key);
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        let alive = db
            .hold(
                key,
                "INSERT INTO gateway_replicas (id, lock_key, host, pid) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()
                 RETURNING (xmax = 0)",
                vec![
                    me.clone().into(),
                    key.into(),
                    host.into(),
                    i64::from(std::process::id()).into(),
                ],
                Self::WATCH_EVERY,
            )
            .map_err(err)?;
        Ok(SharedLedger {
            db: Box::new(db),
            me,
            key,
            alive: Some(alive),
        })
    }

    /// The ledger in `db`, to read (`gateway vault status`): this process
    /// does not join the replicas, and nothing is created.
    pub fn reader(db: gateway_store::postgres::PostgresDb) -> SharedLedger {
        SharedLedger {
            db: Box::new(db),
            me: String::new(),
            key: 0,
            alive: None,
        }
    }

    /// This replica's id in the ledger.
    pub fn replica(&self) -> &str {
        &self.me
    }

    fn err(&self, source: DbError) -> LedgerError {
        LedgerError {
            at: self.db.describe(),
            source,
        }
    }

    fn write(&self, sql: &str, params: &[SqlValue]) -> Result<u64, LedgerError> {
        let mut n = 0;
        self.db
            .write(&mut |tx| {
                n = tx.execute(sql, params)?;
                Ok(gateway_store::End::Commit)
            })
            .map_err(|e| self.err(e))?;
        Ok(n)
    }

    fn records(&self, sql: &str, params: &[SqlValue]) -> Result<Vec<LeaseRecord>, LedgerError> {
        let mut out = Vec::new();
        self.db
            .read(&mut |tx| {
                out = tx
                    .query(sql, params)?
                    .iter()
                    .map(shared_record)
                    .collect::<Result<_, _>>()?;
                Ok(gateway_store::End::Rollback)
            })
            .map_err(|e| self.err(e))?;
        Ok(out)
    }
}

impl Ledger for SharedLedger {
    fn describe(&self) -> String {
        self.db.describe()
    }
    fn issued(
        &self,
        lease_id: &str,
        request_id: &str,
        mount: &str,
        role: &str,
        ttl: Duration,
    ) -> Result<(), LedgerError> {
        let now = chrono::Utc::now();
        let expires = now + chrono::Duration::seconds(ttl.as_secs() as i64);
        // Only while this replica is one the others know alive: a lease
        // recorded by a replica they have called dead would be revoked
        // under its call (the broker revokes it and refuses the call).
        let n = self.write(
            "INSERT INTO gateway_leases (lease_id, request_id, mount, role, issued_at, expires_at, owner)
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7
             WHERE EXISTS (SELECT 1 FROM gateway_replicas WHERE id = ?7)
             ON CONFLICT (lease_id) DO UPDATE SET owner = EXCLUDED.owner, revoked_at = NULL",
            &[
                lease_id.into(),
                request_id.into(),
                mount.into(),
                role.into(),
                now.to_rfc3339().into(),
                expires.to_rfc3339().into(),
                self.me.as_str().into(),
            ],
        )?;
        if n == 0 {
            return Err(self.err(DbError::Other(
                "this replica is not registered as alive (its connection to the database was lost long enough for the others to call it dead); it registers again within seconds".into(),
            )));
        }
        Ok(())
    }
    fn revoked(&self, lease_id: &str) -> Result<(), LedgerError> {
        self.write(
            "UPDATE gateway_leases SET revoked_at = ?2, revoke_attempts = revoke_attempts + 1, last_error = NULL WHERE lease_id = ?1",
            &[lease_id.into(), chrono::Utc::now().to_rfc3339().into()],
        )
        .map(|_| ())
    }
    fn revoke_failed(&self, lease_id: &str, error: &str) -> Result<(), LedgerError> {
        // Tried again after 2, 4, 8 … seconds, at most every 5 minutes.
        self.write(
            "UPDATE gateway_leases SET revoke_attempts = revoke_attempts + 1, last_error = ?2,
                 next_try_at = now() + LEAST(power(2, revoke_attempts + 1), 300) * interval '1 second'
             WHERE lease_id = ?1",
            &[lease_id.into(), error.into()],
        )
        .map(|_| ())
    }
    fn is_revoked(&self, lease_id: &str) -> Result<Option<bool>, LedgerError> {
        let mut out = None;
        self.db
            .read(&mut |tx| {
                out = tx
                    .query_opt(
                        "SELECT revoked_at IS NOT NULL FROM gateway_leases WHERE lease_id = ?1",
                        &[lease_id.into()],
                    )?
                    .map(|r| r.bool(0))
                    .transpose()?;
                Ok(gateway_store::End::Rollback)
            })
            .map_err(|e| self.err(e))?;
        Ok(out)
    }
    fn open_leases(&self) -> Result<Vec<LeaseRecord>, LedgerError> {
        self.records(
            &format!(
                "SELECT {LEASE_COLUMNS} FROM gateway_leases WHERE revoked_at IS NULL ORDER BY issued_at"
            ),
            &[],
        )
    }
    fn own(&self) -> Result<Vec<LeaseRecord>, LedgerError> {
        self.records(
            &format!(
                "SELECT {LEASE_COLUMNS} FROM gateway_leases WHERE revoked_at IS NULL AND owner = ?1 ORDER BY issued_at"
            ),
            &[self.me.as_str().into()],
        )
    }
    fn claim_orphans(&self) -> Result<Vec<LeaseRecord>, LedgerError> {
        // A reader is not a replica; a replica that has just (re)taken its
        // lock gives the others the time to take theirs.
        if self.alive.is_none() || self.ready_in().is_some() {
            return Ok(Vec::new());
        }
        let me: SqlValue = self.me.as_str().into();
        let mut claimed = Vec::new();
        let key = self.key;
        self.db
            .write(&mut |tx| {
                claimed.clear();
                // This replica's own lock, held on this very server for the
                // settling time: after a failover to another server, the
                // others' locks (and heartbeats) there are as new as its
                // own, and no one is called dead until they had the time
                // to come back.
                let settled = tx
                    .query_opt(
                        &format!(
                            "SELECT EXISTS (
                                 SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                                 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                                   AND l.classid::bigint = ((?1::bigint >> 32) & 4294967295)
                                   AND l.objid::bigint = (?1::bigint & 4294967295)
                                   AND a.backend_start < now() - interval '{} seconds')",
                            Self::SETTLED.as_secs()
                        ),
                        &[key.into()],
                    )?
                    .map(|r| r.bool(0))
                    .transpose()?
                    .unwrap_or(false);
                if !settled {
                    return Ok(gateway_store::End::Rollback);
                }
                // A replica is dead when its lock can be taken (its
                // connection is gone) or its heartbeat stopped.
                let others = tx.query(
                    &format!(
                        "SELECT id, lock_key, heartbeat_at < now() - interval '{} seconds',
                                heartbeat_at < now() - interval '{} seconds'
                         FROM gateway_replicas WHERE id <> ?1",
                        Self::STALE_SECONDS,
                        Self::LOCK_FREE_SECONDS
                    ),
                    std::slice::from_ref(&me),
                )?;
                for r in &others {
                    let dead = r.bool(2)?
                        || (r.bool(3)?
                            && tx
                                .query_opt(
                                    "SELECT pg_try_advisory_xact_lock(?1)",
                                    &[r.int(1)?.into()],
                                )?
                                .map(|r| r.bool(0))
                                .transpose()?
                                .unwrap_or(false));
                    if dead {
                        tx.execute(
                            "DELETE FROM gateway_replicas WHERE id = ?1",
                            &[r.text(0)?.into()],
                        )?;
                    }
                }
                // Leases whose replica is no longer there (just found
                // dead, or gone before) are this replica's now; the old
                // owner is kept in what is returned.
                let rows = tx.query(
                    "WITH gone AS (
                         SELECT lease_id, owner FROM gateway_leases
                         WHERE revoked_at IS NULL AND owner <> ?1
                           AND owner NOT IN (SELECT id FROM gateway_replicas)
                         FOR UPDATE
                     )
                     UPDATE gateway_leases l SET owner = ?1, claimed_from = gone.owner FROM gone
                     WHERE l.lease_id = gone.lease_id
                     RETURNING l.lease_id, l.request_id, l.mount, l.role, l.issued_at, l.expires_at,
                               gone.owner, l.revoke_attempts, l.last_error",
                    std::slice::from_ref(&me),
                )?;
                claimed = rows.iter().map(shared_record).collect::<Result<_, _>>()?;
                Ok(gateway_store::End::Commit)
            })
            .map_err(|e| self.err(e))?;
        claimed.sort_by(|a, b| a.issued_at.cmp(&b.issued_at));
        Ok(claimed)
    }
    fn claimed_unrevoked(&self) -> Result<Vec<LeaseRecord>, LedgerError> {
        self.records(
            "SELECT lease_id, request_id, mount, role, issued_at, expires_at, claimed_from, revoke_attempts, last_error
             FROM gateway_leases
             WHERE revoked_at IS NULL AND owner = ?1 AND claimed_from IS NOT NULL
               AND (next_try_at IS NULL OR next_try_at <= now())
               AND expires_at::timestamptz > now()
             ORDER BY issued_at",
            &[self.me.as_str().into()],
        )
    }
    fn replica(&self) -> Option<&str> {
        self.alive.as_ref().map(|_| self.me.as_str())
    }
    fn live_replicas(&self) -> Result<Option<Vec<String>>, LedgerError> {
        let mut out = Vec::new();
        self.db
            .read(&mut |tx| {
                out = tx
                    .query("SELECT id FROM gateway_replicas", &[])?
                    .iter()
                    .map(|r| r.text(0))
                    .collect::<Result<_, _>>()?;
                Ok(gateway_store::End::Rollback)
            })
            .map_err(|e| self.err(e))?;
        Ok(Some(out))
    }
    fn ready_in(&self) -> Option<Duration> {
        let held = self.alive.as_ref()?.held_for();
        (held < Self::SETTLED).then(|| Self::SETTLED - held)
    }
    fn watch_every(&self) -> Option<Duration> {
        self.alive.as_ref().map(|_| Self::WATCH_EVERY)
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
