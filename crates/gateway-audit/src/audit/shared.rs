//! The audit chain of a team gateway, in its database (`[store]`): one
//! chain for every replica, appended in the database.
//!
//! Why one serialised chain rather than a chain per replica joined by
//! signed checkpoints: a reader (an auditor, `gateway audit verify`) then
//! checks one sequence with the same verifier as the file, the JSONL
//! export is byte for byte the file a single host writes, and no replica
//! holds a signing key an attacker on it could use to sign a forged
//! checkpoint. The price is that appends queue on one row; the benchmark
//! `store/audit_append` measures what that costs with three replicas.
//!
//! Each append is one transaction: it moves the head row on
//! (`UPDATE … RETURNING` the new sequence number and the previous hash;
//! other writers wait on that row until it commits), builds the line on
//! that hash exactly as the file's writer does, inserts it under its
//! sequence number and records the new head. An event is durable when the
//! append returns (the commit); nothing is deferred. The head row plays
//! the part of the file's head sidecar: cutting events from the end
//! without moving it back is caught, and `gateway audit head` prints it to
//! keep elsewhere for `--checkpoint`.

use std::path::Path;

use serde_json::{Map, Value};

use gateway_store::{Db, DbError, End};

use super::Head;

/// The schema (refinery's history table on PostgreSQL:
/// `gateway_audit_schema`).
pub const MIGRATIONS: &[(&str, &str)] = &[
    ("V1__audit", SCHEMA),
    ("V2__audit_export", EXPORT_SCHEMA),
    ("V3__audit_open", OPEN_SCHEMA),
];

/// The calls whose `tool.request` is in the chain and whose `tool.result`
/// is not yet, with the replica that runs each. A row is added by the
/// append of the call's `tool.request` and removed by the append of its
/// `tool.result`, in the same transaction: the table and the chain never
/// disagree. A survivor ends the calls of a replica that died before it
/// could record their end ([`SharedChain::open_calls`],
/// [`Mark::CloseOrphan`]).
const OPEN_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS gateway_audit_open (
         request_id TEXT PRIMARY KEY,
         replica TEXT NOT NULL,
         started_ms BIGINT NOT NULL
     );";

/// What an append does to the table of open calls besides adding its line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark<'a> {
    /// Nothing (an event that neither opens nor ends a call).
    None,
    /// A call's `tool.request`: the call is open, run by this replica.
    Begins(&'a str),
    /// A call's `tool.result`: the call has ended.
    Ends(&'a str),
    /// The end of a call found open with its replica gone: written only
    /// if the call is still open (another survivor, or the call's own late
    /// end, may have ended it first); the append then returns `None`.
    CloseOrphan(&'a str),
}

impl<'a> Mark<'a> {
    /// What appending `event` of call `request_id` does to the open calls.
    pub fn for_event(event: &str, request_id: &'a str) -> Mark<'a> {
        match event {
            "tool.request" if !request_id.is_empty() => Mark::Begins(request_id),
            "tool.result" if !request_id.is_empty() => Mark::Ends(request_id),
            _ => Mark::None,
        }
    }
}

/// A call found open in the chain ([`SharedChain::open_calls`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenCall {
    pub request_id: String,
    pub replica: String,
    /// When its request was recorded (the replica's clock, ms since the epoch).
    pub started_ms: i64,
}

/// The audit exports' cursors ([`super::export`]): per export, the last
/// event the sink acknowledged, and which replica sends it for now (one
/// at a time, so replicas do not all send the same batches).
const EXPORT_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS gateway_audit_export (
         name TEXT PRIMARY KEY,
         seq BIGINT NOT NULL,
         hash TEXT NOT NULL,
         owner TEXT NOT NULL,
         lease_until_ms BIGINT NOT NULL
     );";

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS gateway_audit (
         seq BIGINT PRIMARY KEY,
         line TEXT NOT NULL
     );
     CREATE TABLE IF NOT EXISTS gateway_audit_head (
         id INTEGER PRIMARY KEY CHECK (id = 1),
         seq BIGINT NOT NULL,
         hash TEXT NOT NULL
     );
     INSERT INTO gateway_audit_head (id, seq, hash)
     VALUES (1, 0, '0000000000000000000000000000000000000000000000000000000000000000')
     ON CONFLICT (id) DO NOTHING;";

/// Makes an event's line on the previous event's hash: the event as
/// written, and its line.
pub type BuildLine<'a> = dyn FnMut(&str) -> (Map<String, Value>, String) + Send + 'a;

pub struct SharedChain {
    /// One connection per replica's chain; writers take it in turn (a
    /// fair lock: under load, no writer waits behind others again and
    /// again).
    db: parking_lot::FairMutex<Box<dyn Db>>,
    describe: String,
    /// The replica whose calls this writer opens ([`Mark::Begins`]); none
    /// for a writer that is not a replica (its calls are not tracked).
    replica: std::sync::OnceLock<String>,
}

impl std::fmt::Debug for SharedChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedChain")
            .field("db", &self.describe)
            .finish_non_exhaustive()
    }
}

/// Everything the chain holds, read in one snapshot.
#[derive(Debug, Clone)]
pub struct Export {
    /// The lines in order, as the file would hold them.
    pub bytes: Vec<u8>,
    /// The head row: the last event's hash and the length of `bytes`
    /// (what the file's head sidecar records).
    pub head: Head,
    /// How many events the head row counts.
    pub events: u64,
    /// How many events the table holds.
    pub rows: u64,
}

impl SharedChain {
    /// The chain in PostgreSQL (its schema brought up to date).
    pub fn postgres(db: gateway_store::postgres::PostgresDb) -> Result<SharedChain, DbError> {
        db.migrate("gateway_audit_schema", MIGRATIONS)?;
        Ok(SharedChain::on(Box::new(db)))
    }

    /// The chain in PostgreSQL, to read: nothing is created or migrated
    /// (a role that may only read can verify it; a chain whose tables are
    /// gone is an error, not an empty chain).
    pub fn postgres_reader(db: gateway_store::postgres::PostgresDb) -> SharedChain {
        SharedChain::on(Box::new(db))
    }

    /// The same chain in a SQLite file (the conformance suite runs every
    /// case on both; a single host keeps its audit in `audit.jsonl`).
    pub fn sqlite(path: &Path) -> Result<SharedChain, DbError> {
        let mut db = gateway_store::sqlite::SqliteDb::open(path, "FULL")?;
        db.connection().execute_batch(SCHEMA)?;
        db.connection().execute_batch(EXPORT_SCHEMA)?;
        db.connection().execute_batch(OPEN_SCHEMA)?;
        Ok(SharedChain::on(Box::new(db)))
    }

    fn on(db: Box<dyn Db>) -> SharedChain {
        SharedChain {
            describe: db.describe(),
            db: parking_lot::FairMutex::new(db),
            replica: std::sync::OnceLock::new(),
        }
    }

    /// Name the replica this writer appends for: the calls it opens from
    /// now on are kept open under that name until their end is appended.
    /// Set once; later names are ignored.
    pub fn set_replica(&self, replica: &str) {
        let _ = self.replica.set(replica.to_string());
    }

    /// The replica this writer appends for, when it is one.
    pub fn replica(&self) -> Option<&str> {
        self.replica.get().map(String::as_str)
    }

    /// Every call open in the chain (its request appended, its result not),
    /// oldest first.
    pub fn open_calls(&self) -> Result<Vec<OpenCall>, DbError> {
        let mut out = Vec::new();
        let db = self.db.lock();
        db.read(&mut |tx| {
            out = tx
                .query(
                    "SELECT request_id, replica, started_ms FROM gateway_audit_open ORDER BY started_ms, request_id",
                    &[],
                )?
                .iter()
                .map(|r| {
                    Ok(OpenCall {
                        request_id: r.text(0)?,
                        replica: r.text(1)?,
                        started_ms: r.int(2)?,
                    })
                })
                .collect::<Result<_, DbError>>()?;
            Ok(End::Rollback)
        })?;
        Ok(out)
    }

    pub fn describe(&self) -> &str {
        &self.describe
    }

    /// Append the line `build` makes on the previous event's hash; the
    /// event as written. `build` may be called more than once (a
    /// transaction run again); only the last line it made is kept.
    pub fn append(&self, build: &mut BuildLine<'_>) -> Result<Map<String, Value>, DbError> {
        self.append_marked(Mark::None, build)?
            .ok_or_else(|| DbError::Other("the append did not run".into()))
    }

    /// [`SharedChain::append`], and in the same transaction what `mark`
    /// says of the open calls. `None` when a [`Mark::CloseOrphan`] found
    /// its call already ended (nothing is appended then).
    pub fn append_marked(
        &self,
        mark: Mark<'_>,
        build: &mut BuildLine<'_>,
    ) -> Result<Option<Map<String, Value>>, DbError> {
        let mut written = None;
        let replica = self.replica.get().cloned();
        let db = self.db.lock();
        db.write_queued(&mut |tx| {
            written = None;
            let head = tx
                .query_opt(
                    "UPDATE gateway_audit_head SET seq = seq + 1 WHERE id = 1 RETURNING seq, hash",
                    &[],
                )?
                .ok_or_else(|| DbError::Shape("the audit head row is missing".into()))?;
            let (seq, prev) = (head.int(0)?, head.text(1)?);
            // After the head row (every append takes it first), so that two
            // appends never wait on each other's rows in opposite orders.
            match mark {
                Mark::None => {}
                Mark::Begins(rid) => {
                    if let Some(me) = &replica {
                        tx.execute(
                            "INSERT INTO gateway_audit_open (request_id, replica, started_ms)
                             VALUES (?1, ?2, ?3) ON CONFLICT (request_id) DO NOTHING",
                            &[rid.into(), me.as_str().into(), super::now_ms().into()],
                        )?;
                    }
                }
                Mark::Ends(rid) => {
                    tx.execute(
                        "DELETE FROM gateway_audit_open WHERE request_id = ?1",
                        &[rid.into()],
                    )?;
                }
                Mark::CloseOrphan(rid) => {
                    if tx.execute(
                        "DELETE FROM gateway_audit_open WHERE request_id = ?1",
                        &[rid.into()],
                    )? == 0
                    {
                        return Ok(End::Rollback);
                    }
                }
            }
            let (event, line) = build(&prev);
            let hash = event
                .get("hash")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            tx.execute(
                "INSERT INTO gateway_audit (seq, line) VALUES (?1, ?2)",
                &[seq.into(), line.into()],
            )?;
            tx.execute(
                "UPDATE gateway_audit_head SET hash = ?1 WHERE id = 1",
                &[hash.into()],
            )?;
            written = Some(event);
            Ok(End::Commit)
        })?;
        Ok(written)
    }

    /// Up to `limit` events after sequence number `after`, in order, with
    /// the head's sequence number (one snapshot).
    pub fn lines_after(
        &self,
        after: u64,
        limit: u64,
    ) -> Result<(Vec<(u64, String)>, u64), DbError> {
        let mut out = None;
        let db = self.db.lock();
        db.read(&mut |tx| {
            let head = tx
                .query_opt("SELECT seq FROM gateway_audit_head WHERE id = 1", &[])?
                .ok_or_else(|| DbError::Shape("the audit head row is missing".into()))?
                .int(0)?;
            let rows = tx.query(
                "SELECT seq, line FROM gateway_audit WHERE seq > ?1 AND seq <= ?2 ORDER BY seq LIMIT ?3",
                &[
                    i64::try_from(after).unwrap_or(i64::MAX).into(),
                    head.into(),
                    i64::try_from(limit).unwrap_or(i64::MAX).into(),
                ],
            )?;
            let mut lines = Vec::with_capacity(rows.len());
            for r in rows {
                lines.push((u64::try_from(r.int(0)?).unwrap_or(0), r.text(1)?));
            }
            out = Some((lines, u64::try_from(head).unwrap_or(0)));
            Ok(End::Rollback)
        })?;
        out.ok_or_else(|| DbError::Other("the read did not run".into()))
    }

    /// Export `name`'s cursor (sequence number, hash), claiming the right
    /// to send its next batch for `lease_ms` when no other replica holds
    /// it: `None` while another does.
    pub fn claim_export(
        &self,
        name: &str,
        me: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<Option<(u64, String)>, DbError> {
        let mut out = None;
        let db = self.db.lock();
        db.write(&mut |tx| {
            out = None;
            tx.execute(
                "INSERT INTO gateway_audit_export (name, seq, hash, owner, lease_until_ms)
                 VALUES (?1, 0, '', '', 0) ON CONFLICT (name) DO NOTHING",
                &[name.into()],
            )?;
            let claimed = tx.execute(
                "UPDATE gateway_audit_export SET owner = ?2, lease_until_ms = ?3
                 WHERE name = ?1 AND (owner = ?2 OR lease_until_ms < ?4)",
                &[
                    name.into(),
                    me.into(),
                    (now_ms + lease_ms).into(),
                    now_ms.into(),
                ],
            )?;
            if claimed == 1 {
                let row = tx
                    .query_opt(
                        "SELECT seq, hash FROM gateway_audit_export WHERE name = ?1",
                        &[name.into()],
                    )?
                    .ok_or_else(|| DbError::Shape("the export cursor row is missing".into()))?;
                out = Some((u64::try_from(row.int(0)?).unwrap_or(0), row.text(1)?));
            }
            Ok(End::Commit)
        })?;
        Ok(out)
    }

    /// Move export `name`'s cursor from `from` to (`seq`, `hash`), if this
    /// replica still holds it there; whether it moved.
    pub fn advance_export(
        &self,
        name: &str,
        me: &str,
        from: u64,
        seq: u64,
        hash: &str,
    ) -> Result<bool, DbError> {
        let mut moved = false;
        let db = self.db.lock();
        db.write(&mut |tx| {
            moved = tx.execute(
                "UPDATE gateway_audit_export SET seq = ?4, hash = ?5
                 WHERE name = ?1 AND owner = ?2 AND seq = ?3",
                &[
                    name.into(),
                    me.into(),
                    i64::try_from(from).unwrap_or(i64::MAX).into(),
                    i64::try_from(seq).unwrap_or(i64::MAX).into(),
                    hash.into(),
                ],
            )? == 1;
            Ok(End::Commit)
        })?;
        Ok(moved)
    }

    /// The whole chain and its head, from one consistent snapshot.
    pub fn export(&self) -> Result<Export, DbError> {
        let mut out = None;
        let db = self.db.lock();
        db.read(&mut |tx| {
            let head = tx
                .query_opt("SELECT seq, hash FROM gateway_audit_head WHERE id = 1", &[])?
                .ok_or_else(|| DbError::Shape("the audit head row is missing".into()))?;
            let (events, hash) = (head.int(0)?, head.text(1)?);
            let mut bytes = Vec::new();
            let mut rows = 0;
            for row in tx.query("SELECT line FROM gateway_audit ORDER BY seq", &[])? {
                rows += 1;
                bytes.extend_from_slice(row.text(0)?.as_bytes());
            }
            out = Some(Export {
                head: Head {
                    hash: if events == 0 { String::new() } else { hash },
                    bytes: bytes.len() as u64,
                },
                bytes,
                events: u64::try_from(events).unwrap_or(0),
                rows,
            });
            Ok(End::Rollback)
        })?;
        out.ok_or_else(|| DbError::Other("the export did not run".into()))
    }
}

/// Write `export` to a new file at `path` and its head to the sidecar
/// beside it, as a host's writer keeps them. Both are new files (mode
/// 0600): an existing file or link at either name is an error, never
/// written through.
pub fn write_export(path: &Path, export: &Export) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let create = |p: &Path| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(p)
    };
    let head = super::head_path(path);
    if std::fs::symlink_metadata(&head).is_ok() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} exists", head.display()),
        ));
    }
    let mut f = create(path)?;
    f.write_all(&export.bytes)?;
    f.sync_all()?;
    if export.rows > 0 {
        let mut h = create(&head)?;
        h.write_all(&super::head_record(&export.head))?;
        h.sync_all()?;
    }
    Ok(())
}
