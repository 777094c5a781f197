//! The audit trail (README.md: audit): an append-only JSONL file, one event per line,
//! hash-chained and scrubbed of secrets.
//!
//! Every event has `ts`, `request_id`, `event`, `data`, `prev` (the `hash`
//! of the previous line; 64 zeros for the first) and `hash`. A line is the
//! canonical JSON of the event without `hash` (keys sorted, no whitespace)
//! with `,"hash":"…"` put before its closing brace, and `hash` is SHA-256
//! of exactly those canonical bytes: the hash covers the bytes a reader
//! reads, and `audit verify` refuses a line that is not byte for byte what
//! the writer writes (a duplicated key, reordered keys, other spacing).
//! Policy decisions also carry
//! OPA decision-log fields (`decision_id`, `path`, `input`, `result`,
//! `timestamp`) at the top level so existing decision-log tooling reads them.
//!
//! The chain alone cannot show that events were removed from the *end* of
//! the file. After every append the writer also records the chain's head —
//! the last event's hash and the file's length after it — in a sidecar file
//! (`audit.jsonl.head`, one fixed-size record overwritten in place), and `audit verify`
//! fails when the log no longer reaches that head. For protection against
//! someone who can rewrite both files, `gateway audit head` prints the head
//! to record elsewhere (a ticket, a remote log), and `audit verify
//! --checkpoint HASH` checks that such a recorded head is still on the chain.
//!
//! Writers in several processes (the server and the CLI) take an exclusive
//! `flock` on the file for each append, so lines never interleave; each line
//! is written with one `write`. A line is `fsync`ed before `append` returns,
//! unless it is appended [`Durability::WithNext`]: then it becomes durable
//! with the next durable append or [`AuditLog::sync`], which the pipeline
//! calls before it acts on a decision or answers the client (a result the
//! client saw is never missing from the log after a crash; one fsync per
//! step the client waits on, not one per event). The head is only ever
//! recorded after an fsync, so a crash never leaves a head past the durable
//! end of the log.

pub mod events;
pub mod export;
pub mod scrub;
pub mod shared;
pub mod spool;
pub mod verify;

pub use events::Event;

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{Map, Value};

use gateway_base::canonical::{canonical_json, sha256_hex, write_canonical_object};

/// `prev` of the first event.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The audit file's name under the gateway's home.
pub const FILE_NAME: &str = "audit.jsonl";

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("audit log {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("audit event is not an object")]
    NotAnObject,
    #[error("audit head {path} is unreadable ({why}); it was edited or damaged")]
    BadHead { path: PathBuf, why: String },
    /// Said to callers (agents among them): where the database is stays
    /// in `at`, for the operator's log, not in the message.
    #[error("the team's audit chain (its database): {source}")]
    Database {
        at: String,
        #[source]
        source: gateway_store::DbError,
    },
}

/// The chain's head as the last writer recorded it in the sidecar file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Head {
    /// The `hash` of the last event appended.
    pub hash: String,
    /// The log's length in bytes right after that event.
    pub bytes: u64,
}

/// The sidecar file holding the head of the log at `log`.
pub fn head_path(log: &Path) -> PathBuf {
    let mut name = log.file_name().unwrap_or_default().to_os_string();
    name.push(".head");
    log.with_file_name(name)
}

/// The recorded head of the log at `log`; `None` when there is no sidecar.
/// A record that does not parse is read again a few times (a read racing
/// the writer's in-place update could see it half written) before it is
/// called damaged.
pub fn read_head(log: &Path) -> Result<Option<Head>, AuditError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = head_path(log);
    parse_head(path, |path| {
        // As the writer opens it: never through a symlink (a head the
        // writer would refuse is not one a reader trusts), non-blocking (a
        // FIFO at the name does not hold the reader), a regular file only.
        let f = match OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        regular_head(&f)?;
        read_head_bytes(&f).map(Some)
    })
}

/// At most one byte more than a head record, from the start of `f` (its
/// position is not used): a file longer than a record is damaged, and is
/// not read whole (it may be any size).
fn read_head_bytes(f: &File) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; HEAD_RECORD + 1];
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], n as u64)? {
            0 => break,
            k => n += k,
        }
    }
    Ok(buf[..n].to_vec())
}

/// The head record `read` gives (`None`: there is none), read again a few
/// times when it does not parse ([`read_head`]).
fn parse_head(
    path: PathBuf,
    mut read: impl FnMut(&Path) -> std::io::Result<Option<Vec<u8>>>,
) -> Result<Option<Head>, AuditError> {
    let mut tries = 0;
    loop {
        let bytes = match read(&path) {
            Ok(Some(b)) => b,
            Ok(None) => return Ok(None),
            Err(e) if not_a_head(&e) => {
                return Err(AuditError::BadHead {
                    path,
                    why: "not a regular file (a symlink, a directory, a FIFO or a device): the gateway writes its head as a regular file".into(),
                });
            }
            Err(source) => return Err(AuditError::Io { path, source }),
        };
        if bytes.len() > HEAD_RECORD {
            return Err(AuditError::BadHead {
                path,
                why: format!("longer than a head record ({HEAD_RECORD} bytes)"),
            });
        }
        match serde_json::from_slice(&bytes) {
            Ok(head) => return Ok(Some(head)),
            Err(_) if tries < 3 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(e) => {
                return Err(AuditError::BadHead {
                    path,
                    why: e.to_string(),
                });
            }
        }
    }
}

/// The head record's fixed size: JSON padded with spaces.
const HEAD_RECORD: usize = 128;

/// Record `head` for the log at `log`: one fixed-size record overwritten in
/// place (one write of one block, so a reader or a crash sees the old head or
/// the new one). Not fsynced: the log line was, and a head left behind by a
/// crash is one `audit verify` accepts. Called with the log's lock held.
fn write_head(log: &Path, head: &Head) -> std::io::Result<()> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let record = head_record(head);
    let path = head_path(log);
    let created = std::fs::symlink_metadata(&path).is_err();
    // Never through a symlink (one to the log would have the log cut to a
    // record), never blocked on a FIFO, and only into a regular file.
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(&path)?;
    regular_head(&f)?;
    f.write_all_at(&record, 0)?;
    if f.metadata()?.len() != record.len() as u64 {
        f.set_len(record.len() as u64)?;
    }
    if created {
        // A head that a power loss took back would read as lost: the new
        // file and its name are made durable once.
        f.sync_all()?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)?.sync_all()?;
        }
    }
    Ok(())
}

/// The bytes of a head record.
pub fn head_record(head: &Head) -> Vec<u8> {
    let mut record = serde_json::to_string(head).unwrap_or_default().into_bytes();
    if record.len() < HEAD_RECORD {
        record.resize(HEAD_RECORD - 1, b' ');
        record.push(b'\n');
    }
    record
}

/// Where the chain stands at the end of the file.
#[derive(Debug, Default)]
struct Tail {
    len: u64,
    last_hash: Option<String>,
    /// The head this writer last recorded (after an fsync).
    written: Option<Head>,
    /// The open file that wrote lines not yet fsynced (`None`: none are).
    /// They are written and fsynced through this one handle, opened before
    /// the first of them: an I/O error writing them back is reported to
    /// it (a handle opened later might never hear of it).
    pending: Option<File>,
    /// An fsync of deferred lines failed: they may not be on disk, and no
    /// later fsync can say otherwise. Every later sync fails (fail closed:
    /// nothing more is done on a decision) until the process restarts.
    sync_failed: bool,
    /// The head record's file, open while its name still leads to it:
    /// read and rewritten in place through this handle, not opened by
    /// name at every append ([`Tail::head_now`], [`Tail::write_head`]).
    head: Option<KeptHead>,
}

/// An open head file and the file it is (device, inode): an open file's
/// inode cannot be reused while it is open, so the name still leads to
/// this file exactly when a stat of the name gives the same pair.
#[derive(Debug)]
struct KeptHead {
    file: File,
    dev: u64,
    ino: u64,
}

/// A head file is a regular file: anything else at the name is refused.
fn regular_head(f: &File) -> std::io::Result<std::fs::Metadata> {
    let m = f.metadata()?;
    if !m.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the head record's name is not a regular file",
        ));
    }
    Ok(m)
}

/// An error opening the head that says what is at its name is not a head
/// record (a symlink, a directory, a device or FIFO, anything not a
/// regular file), not that the machine failed.
fn not_a_head(e: &std::io::Error) -> bool {
    use nix::libc::{EISDIR, ELOOP, ENXIO};
    matches!(e.raw_os_error(), Some(ELOOP | EISDIR | ENXIO))
        || e.kind() == std::io::ErrorKind::InvalidData
}

impl KeptHead {
    /// The head file at `path`, opened as [`write_head`] opens it (not
    /// through a symlink, a regular file only).
    fn open(path: &Path) -> std::io::Result<KeptHead> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
            .open(path)?;
        let m = regular_head(&file)?;
        Ok(KeptHead {
            file,
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}

impl Tail {
    /// What this writer knows of the end of the file is no longer true
    /// (a failed write, someone else's lines): forget it, but keep what it
    /// still owes (the pending lines) and any failed fsync.
    fn forget_end(&mut self) {
        self.len = 0;
        self.last_hash = None;
        self.written = None;
    }

    /// The kept head file, while the head's name is still it (a stat of
    /// the name, not following a symlink, as the head is opened): once the
    /// file is removed, renamed over or replaced in any way it is let go,
    /// so that the file now at the name (or its absence) is what is read.
    fn kept_head(&mut self, log: &Path) -> Option<&File> {
        use std::os::unix::fs::MetadataExt;
        let same = self.head.as_ref().is_some_and(|k| {
            std::fs::symlink_metadata(head_path(log))
                .is_ok_and(|m| m.dev() == k.dev && m.ino() == k.ino)
        });
        if !same {
            self.head = None;
        }
        self.head.as_ref().map(|k| &k.file)
    }

    /// The head of the log at `log` now ([`read_head_now`]), through the
    /// kept handle when there is one (opened and kept when there is not).
    fn head_now(&mut self, log: &Path) -> Result<HeadNow, AuditError> {
        if self.kept_head(log).is_none() {
            match KeptHead::open(&head_path(log)) {
                Ok(k) => self.head = Some(k),
                // Missing, or not ours to write: read by name.
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
                    ) =>
                {
                    return read_head_now(log);
                }
                // A symlink, a directory, a FIFO: not a head record.
                Err(e) if not_a_head(&e) => return Ok(HeadNow::Damaged(e.to_string())),
                // The machine's (no file descriptor left, an I/O error):
                // the append fails, nothing is said of the head.
                Err(source) => {
                    return Err(AuditError::Io {
                        path: head_path(log),
                        source,
                    });
                }
            }
        }
        let Some(f) = self.head.as_ref().map(|k| &k.file) else {
            return read_head_now(log);
        };
        let read = parse_head(head_path(log), |_| read_head_bytes(f).map(Some));
        if matches!(read, Err(AuditError::Io { .. })) {
            // Opened again by name at the next append.
            self.head = None;
        }
        head_now_from(read)
    }

    /// [`write_head`], in place through the kept handle when there is one
    /// still at the head's name; otherwise by name, and the file is then
    /// kept.
    fn write_head(&mut self, log: &Path, head: &Head) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        if let Some(f) = self.kept_head(log) {
            let record = head_record(head);
            let written = f.write_all_at(&record, 0).and_then(|()| {
                if f.metadata()?.len() != record.len() as u64 {
                    f.set_len(record.len() as u64)?;
                }
                Ok(())
            });
            if written.is_err() {
                // Opened again by name at the next append.
                self.head = None;
            }
            return written;
        }
        write_head(log, head)?;
        self.head = KeptHead::open(&head_path(log)).ok();
        Ok(())
    }
}

/// When an appended line must be on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Before the append returns (and every line before it).
    Now,
    /// With the next durable append or [`AuditLog::sync`]: for an event the
    /// caller follows with another before anything is done or answered.
    WithNext,
}

#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    tail: Mutex<Tail>,
    /// The largest line written ([`AuditLog::set_max_event_bytes`]).
    max_event_bytes: std::sync::atomic::AtomicUsize,
    /// The team's chain in the database, when events go there instead of
    /// the file ([`AuditLog::shared`]).
    shared: Option<shared::SharedChain>,
    /// Events the chain refused, waiting for it ([`spool`]); only a
    /// shared chain's.
    spool: Mutex<spool::Spool>,
    /// Whether anything waits in `spool` (read without its lock).
    spooled: std::sync::atomic::AtomicBool,
}

/// An event as written, and the length of its line.
type Written = (Map<String, Value>, usize);

/// Events never kept for later when the chain refuses them: they gate
/// what they describe (a session whose opening cannot be recorded is
/// refused, so it never opened), or anyone can make them at will (a
/// refused HTTP request: its answer was its record; keeping them would let
/// a client without a token fill the replica's spool and push the calls'
/// own ends out of it).
const NOT_KEPT: &[&str] = &["session.opened", "http.refused"];

/// How many waiting events one flush appends before it lets other writers
/// in (the recovery task flushes in such rounds, every second).
const FLUSH_BATCH: usize = 256;

/// Milliseconds since the epoch, now.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// The cap on one audit line until the policy sets one
/// (`data.config.limits.event_bytes`).
pub const DEFAULT_MAX_EVENT_BYTES: usize = 64 * 1024;

/// The smallest cap accepted: room for the fixed fields and a few digests.
const MIN_EVENT_BYTES: usize = 4096;

/// How much of a value an event keeps when the value is replaced by its digest.
const PREFIX_CHARS: usize = 200;

/// The hash of an event: SHA-256 over its canonical JSON without `hash`
/// (the bytes of its line before `,"hash"`, with the closing brace).
pub fn event_hash(event: &Map<String, Value>) -> String {
    let mut body = Vec::new();
    write_canonical_object(event, |k| k != "hash", &mut body);
    sha256_hex(&body)
}

/// The line of an event (without `hash`) and its hash: the canonical JSON,
/// then `,"hash":"…"}` and a newline.
pub fn event_line(without_hash: &Map<String, Value>) -> (String, String) {
    let mut line = Vec::with_capacity(512);
    write_canonical_object(without_hash, |_| true, &mut line);
    let hash = sha256_hex(&line);
    // The body ends with its object's `}`: the hash goes in before it.
    line.pop();
    if line.len() > 1 {
        line.push(b',');
    }
    line.extend_from_slice(b"\"hash\":\"");
    line.extend_from_slice(hash.as_bytes());
    line.extend_from_slice(b"\"}\n");
    // serde_json's text (UTF-8) and ASCII only.
    let line = String::from_utf8(line)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    (line, hash)
}

pub fn now_ts() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

impl AuditLog {
    /// Open (creating, mode 0600) the audit log at `path`.
    pub fn open(path: impl Into<PathBuf>) -> Result<AuditLog, AuditError> {
        let path = path.into();
        let io = |source| AuditError::Io {
            path: path.clone(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        open_file(&path).map_err(io)?;
        Ok(AuditLog {
            path,
            tail: Mutex::new(Tail::default()),
            max_event_bytes: std::sync::atomic::AtomicUsize::new(DEFAULT_MAX_EVENT_BYTES),
            shared: None,
            spool: Mutex::default(),
            spooled: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// A log whose events go to the team's chain in the database
    /// ([`shared`]); every append is durable when it returns.
    pub fn shared(chain: shared::SharedChain) -> AuditLog {
        AuditLog {
            path: PathBuf::from(chain.describe()),
            tail: Mutex::new(Tail::default()),
            max_event_bytes: std::sync::atomic::AtomicUsize::new(DEFAULT_MAX_EVENT_BYTES),
            shared: Some(chain),
            spool: Mutex::default(),
            spooled: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The team's chain this log appends to, if it is one.
    pub fn chain(&self) -> Option<&shared::SharedChain> {
        self.shared.as_ref()
    }

    /// Cap every line written from now on at `bytes` (at least 4 KiB): a
    /// larger event keeps its small values, and each large one is replaced
    /// by `{"omitted": {"sha256", "bytes", "prefix"}}` (the digest of its
    /// canonical JSON, its size, its first characters).
    /// The cap on one line now.
    pub fn max_event_bytes(&self) -> usize {
        self.max_event_bytes
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn set_max_event_bytes(&self, bytes: usize) {
        self.max_event_bytes.store(
            bytes.max(MIN_EVENT_BYTES),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// The audit log under a gateway home directory.
    pub fn in_home(home: &Path) -> Result<AuditLog, AuditError> {
        AuditLog::open(home.join(FILE_NAME))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Record one of the gateway's events ([`Event`]): the way every part
    /// of the gateway writes to the log.
    pub fn record(&self, request_id: &str, event: Event) -> Result<Map<String, Value>, AuditError> {
        let (name, data) = event.split();
        self.append(request_id, &name, data)
    }

    /// [`AuditLog::record`] made durable only with the next durable
    /// append or [`AuditLog::sync`] ([`Durability::WithNext`]).
    pub fn record_deferred(
        &self,
        request_id: &str,
        event: Event,
    ) -> Result<Map<String, Value>, AuditError> {
        let (name, data) = event.split();
        self.append_durable(request_id, &name, data, Map::new(), Durability::WithNext)
    }

    /// Make every line this writer appended durable (and record the head).
    /// Nothing to do when they already are. Fails when they cannot be
    /// shown durable: the fsync failed (now or before), or the log no
    /// longer holds them (cut back since they were written).
    pub fn sync(&self) -> Result<(), AuditError> {
        if self.shared.is_some() {
            // Each append committed before it returned.
            return Ok(());
        }
        let mut tail = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        let io = |source| AuditError::Io {
            path: self.path.clone(),
            source,
        };
        if tail.sync_failed {
            return Err(io(std::io::Error::other(
                "an earlier fsync of this log failed: events may be missing from the disk; check it and restart the gateway",
            )));
        }
        let Some(file) = tail.pending.take() else {
            return Ok(());
        };
        // Lines that are no longer in the log are owed no more; on any
        // other error they still are (and so is their handle).
        let mut gone = false;
        let result = (|| {
            file.lock().map_err(io)?;
            if let Err(e) = file.sync_data() {
                tail.sync_failed = true;
                return Err(io(e));
            }
            let len = file.metadata().map_err(io)?.len();
            let Some(hash) = tail.last_hash.clone() else {
                // A failed append since made this writer forget where it
                // ended; the next append reads the end again.
                gone = true;
                return Ok(());
            };
            let mut f = file.try_clone().map_err(io)?;
            let ours = Head {
                hash,
                bytes: tail.len,
            };
            if len < tail.len || !head_is_on(&mut f, &ours, len).map_err(io)? {
                gone = true;
                return Err(io(std::io::Error::other(
                    "the log no longer holds events this gateway wrote to it (it was cut or rewritten)",
                )));
            }
            gone = true;
            // Another writer that appended since made our lines durable
            // with its own and recorded a head past them.
            if len == tail.len {
                // Only over the head this writer left: one removed,
                // replaced or damaged since its last append is left as it
                // is found, for the next append to check against the log
                // and report (`audit.head_lost`), as it would have been
                // without this sync.
                match tail.head_now(&self.path)? {
                    HeadNow::Found(h) if Some(&h) == tail.written.as_ref() => {}
                    // Not a head at all (garbage, a symlink, a FIFO): as
                    // writing over it would have, the sync fails.
                    HeadNow::Damaged(why) => {
                        return Err(AuditError::Io {
                            path: head_path(&self.path),
                            source: std::io::Error::other(format!(
                                "the audit head is damaged ({why}); the next append records it as lost"
                            )),
                        });
                    }
                    HeadNow::Found(_) | HeadNow::Missing => return Ok(()),
                }
                tail.write_head(&self.path, &ours)
                    .map_err(|source| AuditError::Io {
                        path: head_path(&self.path),
                        source,
                    })?;
                tail.written = Some(ours);
            }
            Ok(())
        })();
        let _ = file.unlock();
        if result.is_err() && !gone {
            tail.forget_end();
            tail.pending = Some(file);
        }
        // When they are gone, what this writer knows of the end it left
        // stays: its next append finds that end missing and says so in
        // the log (`audit.head_lost`).
        result
    }

    /// Append one event by name (the log's own primitive; the gateway's
    /// parts use [`AuditLog::record`]). `data` is scrubbed of secrets
    /// before it is written.
    pub fn append(
        &self,
        request_id: &str,
        event: &str,
        data: Value,
    ) -> Result<Map<String, Value>, AuditError> {
        self.append_with(request_id, event, data, Map::new())
    }

    /// Append one event with extra top-level fields (scrubbed too).
    pub fn append_with(
        &self,
        request_id: &str,
        event: &str,
        data: Value,
        extra: Map<String, Value>,
    ) -> Result<Map<String, Value>, AuditError> {
        self.append_durable(request_id, event, data, extra, Durability::Now)
    }

    /// Append one event, on disk when `durability` says.
    pub fn append_durable(
        &self,
        request_id: &str,
        event: &str,
        data: Value,
        extra: Map<String, Value>,
        durability: Durability,
    ) -> Result<Map<String, Value>, AuditError> {
        if !gateway_telemetry::enabled() {
            return self
                .append_measured(request_id, event, data, extra, durability)
                .map(|(e, _)| e);
        }
        let started = std::time::Instant::now();
        // The counters derived from events read their data as written.
        let (written, bytes) = self.append_measured(request_id, event, data, extra, durability)?;
        let name = events::NAMES
            .iter()
            .find(|n| **n == event)
            .copied()
            .unwrap_or("other");
        gateway_telemetry::audit_appended(
            request_id,
            name,
            written.get("data").unwrap_or(&Value::Null),
            bytes,
            started.elapsed(),
        );
        Ok(written)
    }

    /// One event to the team's chain. When it refuses (its database is
    /// away) the event waits in the spool for it, and the caller is told
    /// of the refusal; while anything waits, the spool is emptied first.
    fn append_shared(
        &self,
        chain: &shared::SharedChain,
        request_id: &str,
        event: &str,
        data: Value,
        extra: Map<String, Value>,
    ) -> Result<(Map<String, Value>, usize), AuditError> {
        use std::sync::atomic::Ordering;
        let refused = |source: gateway_store::DbError| {
            // Every event the chain refused is in the replica's log, with
            // the event's name and where the chain is.
            tracing::error!(
                db = %chain.describe(),
                request_id,
                event,
                "the audit chain refused an event (kept to append when it is back): {source}"
            );
            AuditError::Database {
                at: chain.describe().to_string(),
                source,
            }
        };
        if self.spooled.load(Ordering::Acquire) {
            // An event of a call with events still waiting goes behind them
            // (a call's events stay in their order); any other is appended
            // now, and what waits is left to the recovery task, in rounds,
            // so that no writer stalls behind thousands of late events.
            let mut spool = self.spool.lock().unwrap_or_else(|p| p.into_inner());
            if !request_id.is_empty() && spool.waiting_for(request_id) {
                let why = "this call's earlier events still wait for the team's chain";
                if !NOT_KEPT.contains(&event) {
                    spool.keep(request_id, event, data, extra, why);
                }
                return Err(refused(gateway_store::DbError::Other(why.into())));
            }
        }
        match self.append_chain(
            chain,
            shared::Mark::for_event(event, request_id),
            request_id,
            event,
            &data,
            &extra,
        ) {
            Ok(Some(written)) => Ok(written),
            Ok(None) => Err(AuditError::Database {
                at: chain.describe().to_string(),
                source: gateway_store::DbError::Other("the append did not run".into()),
            }),
            Err(source) => {
                if !NOT_KEPT.contains(&event) {
                    let mut spool = self.spool.lock().unwrap_or_else(|p| p.into_inner());
                    spool.keep(request_id, event, data, extra, &source.to_string());
                    self.spooled.store(true, Ordering::Release);
                }
                Err(refused(source))
            }
        }
    }

    /// Append one line to the chain with `mark`: the event as written and
    /// the line's length (`None`: a [`shared::Mark::CloseOrphan`] whose
    /// call had already ended).
    fn append_chain(
        &self,
        chain: &shared::SharedChain,
        mark: shared::Mark<'_>,
        request_id: &str,
        event: &str,
        data: &Value,
        extra: &Map<String, Value>,
    ) -> Result<Option<Written>, gateway_store::DbError> {
        let cap = self.max_event_bytes();
        let mut bytes = 0;
        let written = chain.append_marked(mark, &mut |prev| {
            let (event, line) = build_capped_line(
                Some(prev),
                request_id,
                event,
                data.clone(),
                extra.clone(),
                cap,
            );
            bytes = line.len();
            (event, line)
        })?;
        Ok(written.map(|e| (e, bytes)))
    }

    /// Append what waits in `spool`, oldest first, then the
    /// `audit.dropped` event owed for what could not be kept; stops at the
    /// first refusal (what is left keeps waiting).
    fn flush_locked(
        &self,
        chain: &shared::SharedChain,
        spool: &mut spool::Spool,
        most: usize,
    ) -> Result<usize, gateway_store::DbError> {
        let mut done = 0;
        while let Some(late) = spool.front() {
            if done >= most {
                return Ok(done);
            }
            let mark = shared::Mark::for_event(&late.event, &late.request_id);
            self.append_chain(
                chain,
                mark,
                &late.request_id,
                &late.event,
                &late.data,
                &late.extra,
            )?;
            spool.pop();
            done += 1;
        }
        if let Some(dropped) = spool.take_dropped() {
            let r = self.append_chain(
                chain,
                shared::Mark::None,
                "",
                "audit.dropped",
                &dropped,
                &Map::new(),
            );
            if let Err(e) = r {
                // Owed still: put back as it was counted.
                spool.restore_dropped(&dropped);
                return Err(e);
            }
            done += 1;
        }
        self.spooled
            .store(false, std::sync::atomic::Ordering::Release);
        Ok(done)
    }

    /// Append the events waiting for the team's chain, if any, in rounds
    /// of [`FLUSH_BATCH`] (the lock is let go between them): how many were
    /// appended (nothing to do for a file). Blocking: run it off the async
    /// threads.
    pub fn flush_spool(&self) -> Result<usize, AuditError> {
        let Some(chain) = &self.shared else {
            return Ok(0);
        };
        let mut done = 0;
        while self.spooled.load(std::sync::atomic::Ordering::Acquire) {
            let mut spool = self.spool.lock().unwrap_or_else(|p| p.into_inner());
            let n = self
                .flush_locked(chain, &mut spool, FLUSH_BATCH)
                .map_err(|source| AuditError::Database {
                    at: chain.describe().to_string(),
                    source,
                })?;
            done += n;
            if n == 0 {
                break;
            }
        }
        if done > 0 {
            tracing::warn!(
                events = done,
                "appended the audit events that waited for the team's chain"
            );
        }
        Ok(done)
    }

    /// How many events wait for the team's chain.
    pub fn spooled(&self) -> usize {
        self.spool.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// End, as interrupted, every call the team's chain holds open whose
    /// replica `dead` says is gone and whose request was recorded before
    /// `before_ms`: its replica stopped before it could record the call's
    /// end. Several survivors may try at once; each call is ended once.
    /// Returns the request ids ended here.
    pub fn end_orphaned_calls(
        &self,
        dead: &dyn Fn(&str) -> bool,
        before_ms: i64,
    ) -> Result<Vec<String>, AuditError> {
        let Some(chain) = &self.shared else {
            return Ok(Vec::new());
        };
        let db = |source| AuditError::Database {
            at: chain.describe().to_string(),
            source,
        };
        let mut ended = Vec::new();
        for call in chain.open_calls().map_err(db)? {
            if !dead(&call.replica) || call.started_ms >= before_ms {
                continue;
            }
            let data = serde_json::json!({
                "status": "interrupted",
                "reason": format!(
                    "the replica running this call ({}) stopped before the call's end was recorded; what the call did after its last recorded step is unknown: look before calling again",
                    call.replica
                ),
                "replica": call.replica,
            });
            let r = self.append_chain(
                chain,
                shared::Mark::CloseOrphan(&call.request_id),
                &call.request_id,
                "tool.result",
                &data,
                &Map::new(),
            );
            if r.map_err(db)?.is_some() {
                ended.push(call.request_id);
            }
        }
        Ok(ended)
    }

    /// [`AuditLog::append_durable`]: the event as written and the length
    /// of its line.
    fn append_measured(
        &self,
        request_id: &str,
        event: &str,
        data: Value,
        extra: Map<String, Value>,
        durability: Durability,
    ) -> Result<(Map<String, Value>, usize), AuditError> {
        if let Some(chain) = &self.shared {
            return self.append_shared(chain, request_id, event, data, extra);
        }
        let mut tail = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        // Deferred lines are all written through the handle that will
        // fsync them.
        let owed = tail.pending.is_some();
        let mut file = match tail.pending.take() {
            Some(f) => f,
            None => open_file(&self.path).map_err(|source| {
                tail.forget_end();
                AuditError::Io {
                    path: self.path.clone(),
                    source,
                }
            })?,
        };
        let result = self.append_locked(
            &mut tail, &mut file, request_id, event, data, extra, durability, owed,
        );
        let _ = file.unlock();
        match result {
            Ok((event, deferred, bytes)) => {
                if deferred {
                    tail.pending = Some(file);
                }
                Ok((event, bytes))
            }
            Err(e) => {
                // A write may have failed half way (a full disk): what this
                // writer knows of the end of the file is no longer true, so
                // the next append reads it again (and ends a cut line).
                // Lines deferred before stay owed, on their handle.
                tail.forget_end();
                if owed {
                    tail.pending = Some(file);
                }
                Err(e)
            }
        }
    }

    /// Append under the lock on `file`; the event, and whether its line
    /// (and the lines `owed` before it) still waits for an fsync.
    #[allow(clippy::too_many_arguments)]
    fn append_locked(
        &self,
        tail: &mut Tail,
        file: &mut File,
        request_id: &str,
        event: &str,
        data: Value,
        extra: Map<String, Value>,
        durability: Durability,
        owed: bool,
    ) -> Result<(Map<String, Value>, bool, usize), AuditError> {
        let io = |source| AuditError::Io {
            path: self.path.clone(),
            source,
        };
        let file = &mut *file;
        file.lock().map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        // What the last writer recorded as the end of the log; a head this
        // writer did not leave means someone else wrote (another process,
        // or someone cutting the log), so everything is checked again.
        let head = tail.head_now(&self.path)?;
        let ours = matches!(&head, HeadNow::Found(h) if Some(h) == tail.written.as_ref());
        if len != tail.len || tail.last_hash.is_none() || !ours {
            // The end this writer last left, when it knows one: lines it
            // wrote after its head (deferred ones) are checked too, not
            // only the head.
            let own_end = tail.last_hash.clone().map(|hash| Head {
                hash,
                bytes: tail.len,
            });
            let fresh = read_tail(file, len).map_err(io)?;
            tail.len = fresh.len;
            tail.last_hash = fresh.last_hash;
            tail.written = None;
            let own_end_lost = match &own_end {
                Some(end) => !head_is_on(file, end, len).map_err(io)?,
                None => false,
            };
            if let Some(cut) = tail_is_cut(file, len).map_err(io)? {
                if let Some(hash) = complete_line(&cut, tail.last_hash.as_deref()) {
                    // Whole but for its newline (a short write): it is the
                    // last event, as `audit verify` reads it too.
                    file.write_all(b"\n").map_err(io)?;
                    tail.last_hash = Some(hash);
                } else {
                    // A crash cut the last line short: end it, and record
                    // the recovery (in the same write) so `audit verify`
                    // can tell it from tampering.
                    let data = serde_json::json!({"truncated_sha256": sha256_hex(&cut), "truncated_bytes": cut.len()});
                    let (obj, line) = build_line(
                        tail.last_hash.as_deref(),
                        "",
                        "audit.recovered",
                        data,
                        Map::new(),
                    );
                    file.write_all(format!("\n{line}").as_bytes()).map_err(io)?;
                    tail.last_hash = obj.get("hash").and_then(Value::as_str).map(str::to_string);
                }
            }
            // A head that is missing, damaged, or not on this file (the end
            // of the log cut or rewritten, the log removed): writing a new
            // head silently would make that invisible. The log says so
            // instead, and `audit verify` fails on it unless told
            // `--no-head`.
            let found = match &head {
                HeadNow::Missing if len == 0 => None,
                // The first writer stopped between its first line and
                // creating the head: nothing can have been cut yet.
                HeadNow::Missing if only_first_line(file, len).map_err(io)? => None,
                HeadNow::Missing => Some(Value::String("missing".into())),
                HeadNow::Damaged(why) => Some(serde_json::json!({"damaged": why})),
                HeadNow::Found(h) if head_is_on(file, h, len).map_err(io)? => None,
                HeadNow::Found(h) => Some(serde_json::json!({"hash": h.hash, "bytes": h.bytes})),
            };
            let found = match (found, own_end_lost, &own_end) {
                (None, true, Some(end)) => {
                    Some(serde_json::json!({"hash": end.hash, "bytes": end.bytes}))
                }
                (found, _, _) => found,
            };
            if let Some(found) = found {
                let data = serde_json::json!({"log_bytes": len, "last_hash": tail.last_hash, "head": found});
                own_line(file, tail, "audit.head_lost", data).map_err(io)?;
            }
        }
        let cap = self
            .max_event_bytes
            .load(std::sync::atomic::Ordering::Relaxed);
        let (event_obj, line) = build_capped_line(
            tail.last_hash.as_deref(),
            request_id,
            event,
            data,
            extra,
            cap,
        );
        file.write_all(line.as_bytes()).map_err(io)?;
        tail.len = file.metadata().map_err(io)?.len();
        tail.last_hash = event_obj
            .get("hash")
            .and_then(Value::as_str)
            .map(str::to_string);
        // A writer's first line is durable at once, so that its head
        // exists before anything is deferred.
        if durability == Durability::WithNext && tail.written.is_some() && !tail.sync_failed {
            return Ok((event_obj, true, line.len()));
        } else {
            if let Err(e) = file.sync_data() {
                if owed {
                    tail.sync_failed = true;
                }
                return Err(io(e));
            }
            let head = Head {
                hash: tail.last_hash.clone().unwrap_or_default(),
                bytes: tail.len,
            };
            tail.write_head(&self.path, &head)
                .map_err(|source| AuditError::Io {
                    path: head_path(&self.path),
                    source,
                })?;
            tail.written = Some(head);
        }
        Ok((event_obj, false, line.len()))
    }
}

impl AuditLog {
    /// A `policy.decision` event, readable by OPA decision-log tooling:
    /// `decision_id`, `path`, `input`, `result` and `timestamp` at the top
    /// level (all scrubbed), plus the policy set's fingerprint in `data`.
    pub fn policy_decision(
        &self,
        request_id: &str,
        input: Value,
        result: Value,
        policy_fingerprint: &str,
    ) -> Result<Map<String, Value>, AuditError> {
        let mut extra = Map::new();
        extra.insert(
            "decision_id".into(),
            format!("{request_id}/{}", uuid::Uuid::new_v4().simple()).into(),
        );
        extra.insert("path".into(), "gateway/decision".into());
        let allow = result.get("allow").cloned().unwrap_or(Value::Null);
        extra.insert("input".into(), input);
        extra.insert("result".into(), result);
        extra.insert("timestamp".into(), now_ts().into());
        let data = serde_json::json!({"policy": policy_fingerprint, "allow": allow});
        // Durable with what follows: the call's result for a deny, the
        // pipeline's sync before it acts on an allow.
        self.append_durable(
            request_id,
            "policy.decision",
            data,
            extra,
            Durability::WithNext,
        )
    }
}

impl Drop for AuditLog {
    fn drop(&mut self) {
        let _ = self.sync();
    }
}

fn open_file(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
}

fn build_line(
    prev: Option<&str>,
    request_id: &str,
    event: &str,
    data: Value,
    extra: Map<String, Value>,
) -> (Map<String, Value>, String) {
    let mut obj = Map::new();
    obj.insert("ts".into(), now_ts().into());
    obj.insert("request_id".into(), request_id.into());
    obj.insert("event".into(), event.into());
    obj.insert("data".into(), scrub::scrub_owned(data));
    for (k, v) in extra {
        if !matches!(
            k.as_str(),
            "ts" | "request_id" | "event" | "data" | "prev" | "hash"
        ) {
            obj.insert(k, scrub::scrub_owned(v));
        }
    }
    obj.insert("prev".into(), prev.unwrap_or(GENESIS).into());
    let (line, hash) = event_line(&obj);
    obj.insert("hash".into(), hash.into());
    (obj, line)
}

/// [`build_line`] for an event whose line may be at most `cap` bytes: the
/// largest values of `data` and of the extra fields are replaced by their
/// digests ([`omitted`]), biggest first, until it fits ([`fit`]). The work
/// is linear in the event's size (each value is measured a bounded number
/// of times), so an oversized event cannot hold the log's lock for long.
fn build_capped_line(
    prev: Option<&str>,
    request_id: &str,
    event: &str,
    data: Value,
    extra: Map<String, Value>,
    cap: usize,
) -> (Map<String, Value>, String) {
    let (obj, line) = build_line(prev, request_id, event, data, extra);
    if line.len() <= cap {
        return (obj, line);
    }
    // Work on the scrubbed values (the digest is of what would have been
    // written), as one object: data and the extra fields together.
    let mut fields: Map<String, Value> = obj
        .into_iter()
        .filter(|(k, _)| !matches!(k.as_str(), "ts" | "request_id" | "event" | "prev" | "hash"))
        .collect();
    let mut all = Value::Object(std::mem::take(&mut fields));
    fit(&mut all, cap.saturating_sub(1024), 0);
    let Value::Object(mut all) = all else {
        return build_line(prev, request_id, event, Value::Null, Map::new());
    };
    let data = all.remove("data").unwrap_or(Value::Null);
    build_line(prev, request_id, event, data, all)
}

/// Serialized size of `v`.
fn json_len(v: &Value) -> usize {
    serde_json::to_string(v).map_or(0, |s| s.len())
}

/// How deep [`fit`] descends before it digests a value whole.
const FIT_DEPTH: usize = 4;

/// Shrink `v` to at most `budget` bytes of JSON: its largest children are
/// fitted (a container holding most of the excess, up to [`FIT_DEPTH`]
/// levels down) or replaced by their digests, biggest first; a value with
/// no child worth cutting (none over 1 KiB) is digested whole.
fn fit(v: &mut Value, budget: usize, depth: usize) {
    let mut total = json_len(v);
    if total <= budget {
        return;
    }
    let mut children: Vec<(usize, &mut Value)> = match v {
        Value::Object(m) if depth < FIT_DEPTH && !is_omitted_map(m) => {
            m.values_mut().map(|c| (json_len(c), c)).collect()
        }
        Value::Array(a) if depth < FIT_DEPTH => a.iter_mut().map(|c| (json_len(c), c)).collect(),
        _ => Vec::new(),
    };
    children.sort_by_key(|(size, _)| std::cmp::Reverse(*size));
    let mut digested_whole = true;
    for (size, child) in children {
        if total <= budget || size <= 1024 {
            break;
        }
        digested_whole = false;
        let excess = total - budget;
        if matches!(child, Value::Object(_) | Value::Array(_)) && size > excess + 1024 {
            fit(child, size - excess, depth + 1);
        } else {
            *child = omitted(child);
        }
        total = total - size + json_len(child);
    }
    if total > budget || digested_whole {
        *v = omitted(v);
    }
}

/// `{"omitted": {"sha256", "bytes", "prefix"}}` for a value too large to keep.
fn omitted(v: &Value) -> Value {
    let canonical = canonical_json(v);
    let prefix: String = match v {
        Value::String(s) => s.chars().take(PREFIX_CHARS).collect(),
        _ => canonical.chars().take(PREFIX_CHARS).collect(),
    };
    serde_json::json!({"omitted": {
        "sha256": sha256_hex(canonical.as_bytes()),
        "bytes": canonical.len(),
        "prefix": prefix,
    }})
}

fn is_omitted_map(m: &Map<String, Value>) -> bool {
    m.len() == 1 && m.contains_key("omitted")
}

/// `value` as an event keeps it: whole when its JSON is at most
/// `max_bytes`, else as its digest (for a value known to be too large
/// before the event is built, such as a refused call's arguments).
pub fn kept(value: &Value, max_bytes: usize) -> Value {
    if json_len(value) <= max_bytes {
        return value.clone();
    }
    // Scrubbed first: a digest's prefix and hash are of what may be written.
    let value = &scrub::scrub(value);
    // An object keeps its small fields (the working dir, the namespace).
    if let Value::Object(m) = value {
        let some: Map<String, Value> = m
            .iter()
            .map(|(k, v)| {
                let v = if json_len(v) <= 1024 {
                    v.clone()
                } else {
                    omitted(v)
                };
                (k.clone(), v)
            })
            .collect();
        let some = Value::Object(some);
        if json_len(&some) <= max_bytes {
            return some;
        }
    }
    omitted(value)
}

/// The head file as a writer finds it.
enum HeadNow {
    Missing,
    Damaged(String),
    Found(Head),
}

/// A head that cannot be read for a reason of the machine's (no file
/// descriptor left, an I/O error) fails the append instead: only a head
/// that reads but does not parse is damaged.
fn read_head_now(log: &Path) -> Result<HeadNow, AuditError> {
    head_now_from(read_head(log))
}

fn head_now_from(read: Result<Option<Head>, AuditError>) -> Result<HeadNow, AuditError> {
    match read {
        Ok(Some(h)) => Ok(HeadNow::Found(h)),
        Ok(None) => Ok(HeadNow::Missing),
        Err(e @ AuditError::BadHead { .. }) => Ok(HeadNow::Damaged(e.to_string())),
        Err(e) => Err(e),
    }
}

/// Whether the log (`len` bytes) is one complete line, the chain's first.
fn only_first_line(file: &mut File, len: u64) -> std::io::Result<bool> {
    if len == 0 || last_newline_before(file, len - 1)?.is_some() {
        return Ok(false);
    }
    let Some(line) = last_complete_line(file, len)? else {
        return Ok(false);
    };
    Ok(serde_json::from_slice::<Map<String, Value>>(&line)
        .ok()
        .is_some_and(|m| m.get("prev").and_then(Value::as_str) == Some(GENESIS)))
}

/// Whether the log (`len` bytes) holds `head`'s event as the line ending at
/// `head.bytes`.
fn head_is_on(file: &mut File, head: &Head, len: u64) -> std::io::Result<bool> {
    if head.bytes == 0 || head.bytes > len {
        return Ok(false);
    }
    let Some(nl) = last_newline_before(file, head.bytes)? else {
        return Ok(false);
    };
    if nl + 1 != head.bytes {
        return Ok(false);
    }
    let Some(line) = last_complete_line(file, head.bytes)? else {
        return Ok(false);
    };
    Ok(serde_json::from_slice::<Map<String, Value>>(&line)
        .ok()
        .and_then(|m| m.get("hash").and_then(Value::as_str).map(str::to_string))
        .is_some_and(|h| h == head.hash))
}

/// The hash of `bytes` when they are a whole event line of the current
/// format chained to `prev` (only the newline missing).
fn complete_line(bytes: &[u8], prev: Option<&str>) -> Option<String> {
    let event: Map<String, Value> = serde_json::from_slice(bytes).ok()?;
    let hash = event.get("hash").and_then(Value::as_str)?.to_string();
    if event.get("prev").and_then(Value::as_str) != Some(prev.unwrap_or(GENESIS)) {
        return None;
    }
    let mut without = event.clone();
    without.remove("hash");
    let (line, h) = event_line(&without);
    (h == hash && line.as_bytes()[..line.len() - 1] == *bytes).then_some(hash)
}

/// Append an event the log writes about itself (no request id).
fn own_line(file: &mut File, tail: &mut Tail, event: &str, data: Value) -> std::io::Result<()> {
    let (obj, line) = build_line(tail.last_hash.as_deref(), "", event, data, Map::new());
    file.write_all(line.as_bytes())?;
    tail.last_hash = obj.get("hash").and_then(Value::as_str).map(str::to_string);
    Ok(())
}

/// The hash at the end of the chain: the last complete line's `hash`.
fn read_tail(file: &mut File, len: u64) -> std::io::Result<Tail> {
    let last = last_complete_line(file, len)?;
    let last_hash = last.map(|bytes| {
        serde_json::from_slice::<Map<String, Value>>(&bytes)
            .ok()
            .and_then(|m| m.get("hash").and_then(Value::as_str).map(str::to_string))
            // A line that is not an event still anchors the chain, by its bytes.
            .unwrap_or_else(|| sha256_hex(&bytes))
    });
    Ok(Tail {
        len,
        last_hash,
        ..Tail::default()
    })
}

/// The bytes after the last newline, when the file does not end with one.
fn tail_is_cut(file: &mut File, len: u64) -> std::io::Result<Option<Vec<u8>>> {
    if len == 0 {
        return Ok(None);
    }
    let start = last_newline_before(file, len)?.map(|p| p + 1).unwrap_or(0);
    if start == len {
        return Ok(None);
    }
    let mut buf = vec![0; (len - start) as usize];
    file.seek(SeekFrom::Start(start))?;
    file.read_exact(&mut buf)?;
    Ok(Some(buf))
}

fn last_complete_line(file: &mut File, len: u64) -> std::io::Result<Option<Vec<u8>>> {
    let Some(end) = last_newline_before(file, len)? else {
        return Ok(None);
    };
    let start = last_newline_before(file, end)?.map(|p| p + 1).unwrap_or(0);
    let mut buf = vec![0; (end - start) as usize];
    file.seek(SeekFrom::Start(start))?;
    file.read_exact(&mut buf)?;
    Ok(Some(buf))
}

/// Position of the last `\n` strictly before `end`.
fn last_newline_before(file: &mut File, end: u64) -> std::io::Result<Option<u64>> {
    const CHUNK: u64 = 64 * 1024;
    let mut pos = end;
    while pos > 0 {
        let start = pos.saturating_sub(CHUNK);
        let mut buf = vec![0; (pos - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut buf)?;
        if let Some(i) = buf.iter().rposition(|b| *b == b'\n') {
            return Ok(Some(start + i as u64));
        }
        pos = start;
    }
    Ok(None)
}

/// Every event in the file (lines that do not parse are skipped; `audit
/// verify` reports them).
pub fn read_events(path: &Path) -> Result<Vec<Map<String, Value>>, AuditError> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(source) => {
            return Err(AuditError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    Ok(text
        .split(|b| *b == b'\n')
        .filter_map(|l| serde_json::from_slice::<Map<String, Value>>(l).ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What a hostile agent can put in its params reaches the writer as an
    /// event's data: control characters, U+2028, a BOM, keys differing only
    /// in case, secret-named keys in any case, a JWT. The log verifies
    /// (the hash covers what the verifier reads), and no secret is in it.
    #[test]
    fn hostile_params_are_written_verifiably_and_scrubbed() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("a.jsonl");
        let log = AuditLog::open(&path).expect("open");
        let jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhZ2VudCJ9.c2lnbmF0dXJlLWJ5dGVz";
        let params = json!({
            "namespace": "kube-system\u{0}\n\r\t\u{1f}\u{7f}\u{2028}\u{feff}\"\\",
            "Namespace": "case only",
            "API_KEY": "sk-live-opaque-1",
            "Session_Token": 424242,
            "nested": [{"PassWord": "hunter2-opaque"}, {"note": format!("bearer {jwt}")}],
            "\u{1}key\u{2028}": {},
        });
        for event in ["tool.request", "policy.decision", "tool.result"] {
            log.append("req-hostile", event, json!({"params": params}))
                .expect("append");
        }
        let bytes = std::fs::read_to_string(&path).expect("read");
        for secret in ["sk-live-opaque-1", "424242", "hunter2-opaque", jwt] {
            assert!(!bytes.contains(secret), "{secret} reached the log");
        }
        assert_eq!(bytes.lines().count(), 3, "one line per event: {bytes}");
        let report =
            crate::audit::verify::verify_file(&path, &[], crate::audit::verify::HeadRule::Required)
                .expect("read");
        assert!(report.ok() && report.verified == 3, "{report:?}");
    }

    /// An event's line and hash as an independent writer gives them
    /// (Python's `json.dumps(sort_keys=True, separators=(",", ":"),
    /// ensure_ascii=False)` and `hashlib.sha256`): a line's bytes, and so
    /// every hash in a log, never change with the writer's code.
    #[test]
    fn an_event_line_is_the_canonical_text_another_writer_gives() {
        let event = json!({
            "ts": "2026-12-05T00:00:00.000Z", "request_id": "r-1", "event": "tool.request",
            "data": {
                "tool": "k8s_get_pod_status",
                "params": {"namespace": "demo-app", "Note": "é\n\t\"x\"\\ \u{2028}\u{1}"},
                "n": [1, -2, 3.5, null, true],
                "a": {},
            },
            "prev": "genesis",
        });
        let Value::Object(event) = event else {
            unreachable!("an object literal")
        };
        let hash = "88055dd9c0bbd5f4428b049d5b1b76e91aaa25e2b150976d61db82ddd35ac5ca";
        let line = concat!(
            r#"{"data":{"a":{},"n":[1,-2,3.5,null,true],"params":{"Note":"é\n\t\"x\"\\ "#,
            "\u{2028}",
            r#"\u0001","namespace":"demo-app"},"tool":"k8s_get_pod_status"},"event":"tool.request","prev":"genesis","request_id":"r-1","ts":"2026-12-05T00:00:00.000Z","hash":""#,
            "88055dd9c0bbd5f4428b049d5b1b76e91aaa25e2b150976d61db82ddd35ac5ca",
            "\"}\n"
        );
        assert_eq!(event_line(&event), (line.to_string(), hash.to_string()));
        let mut with_hash = event.clone();
        with_hash.insert("hash".into(), hash.into());
        assert_eq!(event_hash(&with_hash), hash);
        // An empty event: no comma before the hash.
        let (line, hash) = event_line(&Map::new());
        assert_eq!(line, format!("{{\"hash\":\"{hash}\"}}\n"));
        assert_eq!(hash, sha256_hex(b"{}"));
    }

    #[test]
    fn events_chain_and_are_scrubbed() {
        let dir = tempfile::tempdir().expect("tmp");
        let log = AuditLog::open(dir.path().join("a.jsonl")).expect("open");
        let a = log
            .append("req-1", "tool.request", json!({"tool": "t"}))
            .expect("append");
        let b = log
            .append(
                "req-1",
                "credential.issued",
                json!({"lease_id": "k/creds/r/1", "token": "hvs.AAAAAAAAAAAAAAAAAAAAAAAA"}),
            )
            .expect("append");
        assert_eq!(a["prev"], GENESIS);
        assert_eq!(b["prev"], a["hash"]);
        let text = std::fs::read_to_string(log.path()).expect("read");
        assert!(!text.contains("hvs.AAAA"));
        assert!(text.contains("k/creds/r/1"));
        assert_eq!(text.lines().count(), 2);
        assert_eq!(event_hash(&b), b["hash"]);
    }

    #[test]
    fn policy_decisions_carry_opa_decision_log_fields() {
        let dir = tempfile::tempdir().expect("tmp");
        let log = AuditLog::open(dir.path().join("a.jsonl")).expect("open");
        let e = log
            .policy_decision(
                "req-9",
                json!({"tool": "t", "params": {"password": "hunter2"}}),
                json!({"allow": false}),
                "abc",
            )
            .expect("append");
        assert_eq!(e["path"], "gateway/decision");
        assert!(
            e["decision_id"]
                .as_str()
                .is_some_and(|d| d.starts_with("req-9/"))
        );
        assert_eq!(e["result"]["allow"], false);
        assert_eq!(e["input"]["params"]["password"], "<redacted>");
        assert_eq!(e["data"]["allow"], false);
        assert!(
            crate::audit::verify::verify_file(
                log.path(),
                &[],
                crate::audit::verify::HeadRule::Required
            )
            .expect("read")
            .ok()
        );
    }

    #[test]
    fn a_second_writer_continues_the_chain() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("a.jsonl");
        let one = AuditLog::open(&path).expect("open");
        let two = AuditLog::open(&path).expect("open");
        let a = one.append("r", "x", json!({})).expect("append");
        let b = two.append("r", "y", json!({})).expect("append");
        let c = one.append("r", "z", json!({})).expect("append");
        assert_eq!(b["prev"], a["hash"]);
        assert_eq!(c["prev"], b["hash"]);
    }

    #[test]
    fn a_line_cut_by_a_crash_is_ended_and_recorded() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("a.jsonl");
        let log = AuditLog::open(&path).expect("open");
        let a = log.append("r", "x", json!({})).expect("append");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(b"{\"ts\":\"2026"))
            .expect("cut");
        let fresh = AuditLog::open(&path).expect("open");
        let b = fresh.append("r", "y", json!({})).expect("append");
        let events = read_events(&path).expect("read");
        assert_eq!(events.len(), 3);
        assert_eq!(events[1]["event"], "audit.recovered");
        assert_eq!(events[1]["prev"], a["hash"]);
        assert_eq!(b["prev"], events[1]["hash"]);
    }

    #[test]
    fn a_large_event_keeps_its_small_values_and_digests_the_large_ones() {
        let dir = tempfile::tempdir().expect("tmp");
        let log = AuditLog::open(dir.path().join("a.jsonl")).expect("open");
        log.set_max_event_bytes(8192);
        let big = "A".repeat(3 << 20);
        let many: Vec<u32> = (0..50_000).collect();
        let e = log
            .append(
                "req-big",
                "tool.request",
                json!({"tool": "terraform_plan", "params": {"working_dir": "m", "blob": big, "list": many}}),
            )
            .expect("append");
        let text = std::fs::read_to_string(log.path()).expect("read");
        assert!(text.len() <= 8192, "{} bytes", text.len());
        assert_eq!(e["data"]["tool"], "terraform_plan");
        assert_eq!(e["data"]["params"]["working_dir"], "m");
        let blob = &e["data"]["params"]["blob"]["omitted"];
        assert_eq!(blob["bytes"], big.len() + 2);
        assert_eq!(
            blob["sha256"],
            sha256_hex(canonical_json(&Value::String(big.clone())).as_bytes())
        );
        assert_eq!(blob["prefix"], "A".repeat(PREFIX_CHARS));
        assert!(
            e["data"]["params"]["list"]["omitted"]["sha256"].is_string(),
            "{e:?}"
        );
        // Still one verifiable line of the chain; small events untouched.
        let small = log
            .append("req-small", "tool.result", json!({"ok": true}))
            .expect("append");
        assert_eq!(small["data"], json!({"ok": true}));
        assert!(
            crate::audit::verify::verify_file(
                log.path(),
                &[],
                crate::audit::verify::HeadRule::Required
            )
            .expect("read")
            .ok()
        );
        // Many small values are cut as a whole.
        let wide: Map<String, Value> = (0..5000).map(|i| (format!("k{i}"), json!(i))).collect();
        log.append("req-wide", "tool.request", Value::Object(wide))
            .expect("append");
        let last = std::fs::read_to_string(log.path()).expect("read");
        assert!(last.lines().all(|l| l.len() <= 8192));
    }

    #[test]
    fn an_event_of_many_mid_sized_strings_deep_inside_is_cut_to_fit() {
        // The shape that made the first cut quadratic: tens of thousands
        // of strings just over the digest's size, under nested objects.
        let mut v = json!(
            (0..20_000)
                .map(|i| format!("{i:0>300}"))
                .collect::<Vec<_>>()
        );
        for depth in 0..50 {
            v = json!({format!("k{depth}"): v, "small": depth});
        }
        let dir = tempfile::tempdir().expect("tmp");
        let log = AuditLog::open(dir.path().join("a.jsonl")).expect("open");
        log.set_max_event_bytes(8192);
        let started = std::time::Instant::now();
        log.append("req-deep", "tool.request", json!({"params": v}))
            .expect("append");
        eprintln!(
            "cut a {} byte event in {:?}",
            20_000 * 303,
            started.elapsed()
        );
        let text = std::fs::read_to_string(log.path()).expect("read");
        assert!(text.len() <= 8192, "{}", text.len());
    }

    #[test]
    fn a_digested_value_never_carries_a_secret_in_its_prefix() {
        let params = json!({"vars": {"a_password": "hunter2", "token": "hvs.CAESIPlantedSecretTokenValue0123456789", "big": "x".repeat(40_000)}});
        let kept = kept(&params, 32 * 1024);
        let text = kept.to_string();
        assert!(
            !text.contains("hunter2") && !text.contains("hvs.CAES"),
            "{text}"
        );
        assert!(kept["vars"]["omitted"]["prefix"].is_string(), "{text}");
    }

    #[test]
    fn a_first_writer_stopped_before_its_head_leaves_no_head_lost() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("a.jsonl");
        let log = AuditLog::open(&path).expect("open");
        log.append("r", "x", json!({})).expect("append");
        std::fs::remove_file(head_path(&path)).expect("as if never written");
        let again = AuditLog::open(&path).expect("open");
        again.append("r", "y", json!({})).expect("append");
        let events = read_events(&path).expect("read");
        assert_eq!(events.len(), 2, "{events:?}");
    }

    #[test]
    fn a_deferred_line_is_durable_with_the_next_and_the_head_never_runs_ahead() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("a.jsonl");
        let log = AuditLog::open(&path).expect("open");
        let head = || read_head(&path).expect("head").expect("a head");
        let len = || std::fs::metadata(&path).expect("stat").len();
        // A writer's first line is durable at once, even when deferred.
        let first = log
            .append_durable("r", "x", json!({}), Map::new(), Durability::WithNext)
            .expect("append");
        assert_eq!(head().hash, first["hash"]);
        assert_eq!(head().bytes, len());
        let deferred = log
            .append_durable("r", "y", json!({}), Map::new(), Durability::WithNext)
            .expect("append");
        // On the chain and in the file, but the head stays at the last fsync.
        assert_eq!(deferred["prev"], first["hash"]);
        assert_eq!(head().hash, first["hash"]);
        assert!(head().bytes < len());
        // A crash that loses the unsynced line leaves a log that verifies.
        let lost = std::fs::read(&path).expect("read");
        let durable = &lost[..usize::try_from(head().bytes).expect("size")];
        assert!(verify::verify_against(durable, Some(&head()), &[]).ok());
        // The next durable line carries it to disk and moves the head.
        let last = log.append("r", "z", json!({})).expect("append");
        assert_eq!(last["prev"], deferred["hash"]);
        assert_eq!(head().hash, last["hash"]);
        assert_eq!(head().bytes, len());
        // sync() does the same for a deferred line with nothing after it.
        let tail = log
            .append_durable("r", "w", json!({}), Map::new(), Durability::WithNext)
            .expect("append");
        assert_ne!(head().hash, tail["hash"]);
        log.sync().expect("sync");
        assert_eq!(head().hash, tail["hash"]);
        assert_eq!(head().bytes, len());
        // Another writer appending in between: its fsync covers ours, and
        // our sync leaves its (later) head alone.
        let mine = log
            .append_durable("r", "v", json!({}), Map::new(), Durability::WithNext)
            .expect("append");
        let other = AuditLog::open(&path).expect("open");
        let theirs = other.append("r", "u", json!({})).expect("append");
        assert_eq!(theirs["prev"], mine["hash"]);
        log.sync().expect("sync");
        assert_eq!(head().hash, theirs["hash"]);
        let after = log.append("r", "t", json!({})).expect("append");
        assert_eq!(after["prev"], theirs["hash"]);
        let report = verify::verify_file(&path, &[], verify::HeadRule::Required).expect("verify");
        assert!(report.ok(), "{report:?}");
        assert_eq!(report.verified, 7);
    }

    /// A log with one durable line and one deferred line, the deferred
    /// one then cut off by someone else (the log set back to its head).
    fn log_with_its_deferred_line_cut(path: &Path) -> AuditLog {
        let log = AuditLog::open(path).expect("open");
        log.append("r", "x", json!({})).expect("append");
        let durable = std::fs::metadata(path).expect("stat").len();
        log.append_durable("r", "y", json!({}), Map::new(), Durability::WithNext)
            .expect("append");
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|f| f.set_len(durable))
            .expect("cut");
        log
    }

    #[test]
    fn deferred_lines_cut_from_the_log_are_noticed_not_lost_silently() {
        let dir = tempfile::tempdir().expect("tmp");
        for sync_first in [true, false] {
            let path = dir.path().join(format!("{sync_first}.jsonl"));
            let log = log_with_its_deferred_line_cut(&path);
            if sync_first {
                let err = log.sync().expect_err("the deferred line is gone");
                assert!(err.to_string().contains("no longer holds"), "{err}");
            }
            // The next line says so in the log, and verify fails on it.
            log.append("r", "z", json!({})).expect("append");
            let events = read_events(&path).expect("read");
            assert_eq!(events[1]["event"], "audit.head_lost", "{events:?}");
            let report =
                verify::verify_file(&path, &[], verify::HeadRule::Required).expect("verify");
            assert!(!report.ok(), "{report:?}");
        }
    }

    #[test]
    fn a_log_dropped_with_a_deferred_line_syncs_it() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("a.jsonl");
        let log = AuditLog::open(&path).expect("open");
        log.append("r", "x", json!({})).expect("append");
        let last = log
            .append_durable("r", "y", json!({}), Map::new(), Durability::WithNext)
            .expect("append");
        drop(log);
        let head = read_head(&path).expect("head").expect("a head");
        assert_eq!(head.hash, last["hash"]);
    }

    /// A sync writes the head only over the one its writer left: a head
    /// removed or replaced between a deferred append and its sync is left
    /// for the next append to report; a damaged one fails the sync (the
    /// allowed call it was for is not acted on).
    #[test]
    fn a_sync_leaves_a_head_changed_since_the_last_append_for_the_next_append_to_report() {
        use super::events::Event;
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("a.jsonl");
        let head = head_path(&path);
        let log = AuditLog::open(&path).expect("open");
        log.append("r", "x", json!({})).expect("append");
        let defer = |log: &AuditLog| {
            log.record_deferred("r", Event::ToolResult(json!({"n": 1})))
                .expect("deferred");
        };
        let lost_at_next = |log: &AuditLog| {
            log.append("r", "x", json!({})).expect("append");
            let events = read_events(&path).expect("read");
            let n = events.len();
            (events[n - 2]["event"] == "audit.head_lost")
                .then(|| events[n - 2]["data"]["head"].clone())
        };
        // Untouched: the sync records the head past the deferred line.
        defer(&log);
        log.sync().expect("sync");
        let len = std::fs::metadata(&path).expect("log").len();
        assert_eq!(read_head(&path).expect("head").expect("a head").bytes, len);
        assert_eq!(lost_at_next(&log), None);

        // Removed between a deferred append and its sync.
        defer(&log);
        std::fs::remove_file(&head).expect("rm head");
        log.sync().expect("sync");
        assert!(!head.exists(), "the sync wrote a head over a removed one");
        assert_eq!(lost_at_next(&log), Some(json!("missing")));

        // Replaced by one the log does not hold.
        defer(&log);
        let other = Head {
            hash: "0".repeat(64),
            bytes: 3,
        };
        std::fs::write(&head, head_record(&other)).expect("write");
        log.sync().expect("sync");
        let found = lost_at_next(&log).expect("head_lost");
        assert_eq!(found["bytes"], 3, "{found}");

        // Damaged, or not a file: the sync fails, and the next append
        // reports what it found.
        defer(&log);
        std::fs::write(&head, b"not a head").expect("write");
        assert!(log.sync().is_err(), "a damaged head passed the sync");
        assert_eq!(std::fs::read(&head).expect("head"), b"not a head");
        let found = lost_at_next(&log).expect("head_lost");
        assert!(found["damaged"].is_string(), "{found}");
        assert_eq!(lost_at_next(&log), None, "the head is kept again after");
        defer(&log);
        std::fs::remove_file(&head).expect("rm head");
        std::os::unix::fs::symlink(&path, &head).expect("symlink");
        assert!(log.sync().is_err(), "a symlinked head passed the sync");
        std::fs::remove_file(&head).expect("rm symlink");
        let found = lost_at_next(&log).expect("head_lost");
        assert_eq!(found, json!("missing"));
    }

    /// A writer keeps its head file open between appends; what someone
    /// does to the file at the head's name meanwhile is still seen at the
    /// next append, as when the head was opened by name each time (a file
    /// still linked under another name too).
    #[test]
    fn a_writer_keeping_its_head_open_still_sees_it_removed_replaced_or_rewritten() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("a.jsonl");
        let head = head_path(&path);
        let log = AuditLog::open(&path).expect("open");
        let lost = |log: &AuditLog| {
            log.append("r", "x", json!({})).expect("append");
            let events = read_events(&path).expect("read");
            let n = events.len();
            (
                events[n - 2]["event"] == "audit.head_lost",
                events[n - 2]["data"]["head"].clone(),
            )
        };
        log.append("r", "x", json!({})).expect("append");
        log.append("r", "x", json!({})).expect("append");
        assert!(!lost(&log).0, "an untouched head raised head_lost");

        // Removed.
        std::fs::remove_file(&head).expect("rm head");
        let (was_lost, found) = lost(&log);
        assert!(was_lost && found == "missing", "{found}");
        assert!(!lost(&log).0, "the head written again was not kept");

        // Renamed over by another file, holding a head the log does not.
        let other = Head {
            hash: "0".repeat(64),
            bytes: 3,
        };
        let tmp = dir.path().join("other");
        std::fs::write(&tmp, head_record(&other)).expect("write");
        std::fs::rename(&tmp, &head).expect("rename");
        let (was_lost, found) = lost(&log);
        assert!(was_lost && found["bytes"] == 3, "{found}");
        assert!(!lost(&log).0);

        // Renamed away: the name is empty, the file lives on elsewhere.
        std::fs::rename(&head, dir.path().join("away")).expect("rename");
        let (was_lost, found) = lost(&log);
        assert!(was_lost && found == "missing", "{found}");
        assert!(!lost(&log).0);
        assert!(
            std::fs::read(dir.path().join("away")).expect("away")
                != std::fs::read(&head).expect("head"),
            "the writer kept writing the head into the file renamed away"
        );

        // A sparse head file of 64 GiB: damaged, and not read whole.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&head)
            .expect("open")
            .set_len(1 << 36)
            .expect("grow");
        let (was_lost, found) = lost(&log);
        assert!(
            was_lost
                && found["damaged"]
                    .as_str()
                    .is_some_and(|d| d.contains("longer than")),
            "{found}"
        );
        assert!(!lost(&log).0);

        // Renamed over while another name still links the writer's file.
        std::fs::hard_link(&head, dir.path().join("kept")).expect("link");
        std::fs::write(&tmp, head_record(&other)).expect("write");
        std::fs::rename(&tmp, &head).expect("rename");
        let (was_lost, found) = lost(&log);
        assert!(was_lost && found["bytes"] == 3, "{found}");
        assert!(!lost(&log).0);

        // Rewritten in place (the same file).
        std::fs::write(&head, head_record(&other)).expect("rewrite");
        let (was_lost, found) = lost(&log);
        assert!(was_lost && found["bytes"] == 3, "{found}");
        assert!(!lost(&log).0);

        // A symlink at the name, even to the log: never written through.
        let before = std::fs::read(&path).expect("log");
        std::fs::remove_file(&head).expect("rm head");
        std::os::unix::fs::symlink(&path, &head).expect("symlink");
        let refused = log.append("r", "x", json!({}));
        assert!(refused.is_err(), "an append wrote a head through a symlink");
        let after = std::fs::read(&path).expect("log");
        assert!(after.len() > before.len() && after.starts_with(&before));
        let said = |what: &str| {
            let events = read_events(&path).expect("read");
            let n = events.len();
            assert_eq!(events[n - 2]["event"], "audit.head_lost", "{what}");
            let damaged = events[n - 2]["data"]["head"]["damaged"].clone();
            assert!(damaged.is_string(), "{what}: {damaged}");
        };
        said("a symlink");
        std::fs::remove_file(&head).expect("rm link");
        assert!(lost(&log).0);
        assert!(!lost(&log).0);

        // A FIFO and a directory at the name: refused, said, never waited on.
        std::fs::remove_file(&head).expect("rm head");
        nix::unistd::mkfifo(&head, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        assert!(log.append("r", "x", json!({})).is_err());
        said("a FIFO");
        std::fs::remove_file(&head).expect("rm fifo");
        std::fs::create_dir(&head).expect("mkdir");
        assert!(log.append("r", "x", json!({})).is_err());
        said("a directory");
        std::fs::remove_dir(&head).expect("rmdir");
        assert!(lost(&log).0);
        assert!(!lost(&log).0);

        // Damaged in place.
        std::fs::write(&head, b"{\"hash\":").expect("damage");
        let (was_lost, found) = lost(&log);
        assert!(was_lost && found["damaged"].is_string(), "{found}");
        assert!(
            verify::verify_file(&path, &[], verify::HeadRule::Optional)
                .expect("verify")
                .ok()
        );
    }
}
