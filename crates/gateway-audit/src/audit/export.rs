//! The audit trail shipped to a SIEM (`[audit_export]`, README.md:
//! "Watching it"): every event as written (scrubbed), at least once, in
//! order, with the chain's hashes, and after every batch a checkpoint
//! (the sequence number and hash reached, signed when a key is
//! configured), so that the receiver can check order and completeness
//! offline: `gateway audit verify --from-export FILE --signer KEY`.
//!
//! The queue is the audit log itself: the exporter reads what is durable
//! past its cursor (the file up to its recorded head, or the team's chain
//! up to its head row), sends a batch, and moves the cursor only when the
//! sink acknowledged it (a 2xx; for OTLP, no rejected records). A crash
//! between the two sends that batch again (the at-least-once window is one
//! batch); a restart resumes at the cursor. The sink is never on a call's
//! path: a sink that is down leaves the calls as fast as before, the
//! backlog grows (a metric, `gateway_audit_export_backlog_events`) and the
//! batch is sent again after a backoff that doubles up to the policy's
//! `max_backoff_seconds`. Memory is bounded by the batch the policy allows
//! (`data.config.audit_export`), not by the backlog.
//!
//! Records (one JSON object each; the JSON-lines sink POSTs them one per
//! line, the OTLP sink sends each as a log record's body):
//! `{"kind":"event","export":NAME,"seq":N,"event":{…the event…}}` and
//! `{"kind":"checkpoint","export":NAME,"seq":N,"hash":H,"ts":T,"signature":SSHSIG|null}`.

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::{GENESIS, shared::SharedChain};

/// What the policy lets the exporter hold and wait (`data.config.audit_export`).
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Events in one batch at most.
    pub batch_events: u64,
    /// Bytes of audit lines in one batch at most (a single longer line
    /// still goes, alone).
    pub batch_bytes: u64,
    /// The longest wait between two tries of a batch the sink did not take.
    pub max_backoff: Duration,
    /// How often the log is read for new events.
    pub poll: Duration,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            batch_events: 500,
            batch_bytes: 1024 * 1024,
            max_backoff: Duration::from_secs(60),
            poll: Duration::from_secs(1),
        }
    }
}

impl Settings {
    /// From the policy's `data.config.audit_export`; a value out of its
    /// range is an error (the default is kept, and the log says why).
    pub fn from_data(v: &Value) -> Result<Settings, String> {
        let mut s = Settings::default();
        let num = |key: &str, lo: u64, hi: u64| -> Result<Option<u64>, String> {
            match v.get(key) {
                None => Ok(None),
                Some(n) => match n.as_u64().filter(|n| (lo..=hi).contains(n)) {
                    Some(n) => Ok(Some(n)),
                    None => Err(format!(
                        "data.config.audit_export.{key} is {n}: it must be a whole number from {lo} to {hi}"
                    )),
                },
            }
        };
        if let Some(n) = num("batch_events", 1, 10_000)? {
            s.batch_events = n;
        }
        if let Some(n) = num("batch_bytes", 4096, 16 * 1024 * 1024)? {
            s.batch_bytes = n;
        }
        if let Some(n) = num("max_backoff_seconds", 1, 3600)? {
            s.max_backoff = Duration::from_secs(n);
        }
        if let Some(n) = num("poll_milliseconds", 50, 60_000)? {
            s.poll = Duration::from_millis(n);
        }
        Ok(s)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("[audit_export] {0}")]
    Config(String),
    #[error("reading the audit log: {0}")]
    Source(String),
    #[error("the sink: {0}")]
    Sink(String),
}

/// Where the export reads from, and where its cursor is kept.
pub enum Source {
    /// A host's `audit.jsonl`; the cursor in a file beside it
    /// ([`Source::file`]).
    File {
        log: PathBuf,
        cursor: PathBuf,
        /// Newlines counted so far: (up to this offset, how many), so that
        /// each byte of the log is counted once for the backlog.
        counted: Mutex<(u64, u64)>,
        /// The chain's identity, once read.
        chain: std::sync::OnceLock<String>,
    },
    /// The team's chain; the cursor in its database, claimed by one
    /// replica at a time (`me`).
    Chain { chain: SharedChain, me: String },
}

/// Where a batch of events ends: the last event's sequence number and
/// hash, and (for a file) the byte offset after it and the lines before
/// that offset.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cursor {
    pub seq: u64,
    pub hash: String,
    #[serde(default)]
    pub offset: u64,
    #[serde(default)]
    pub lines: u64,
}

/// The largest cursor file read.
const MAX_CURSOR_BYTES: u64 = 4096;

/// A batch read past the cursor.
struct Batch {
    /// (sequence number, the event as written, its line as written
    /// without the newline).
    events: Vec<(u64, Map<String, Value>, String)>,
    /// The cursor after it.
    end: Cursor,
    /// Events past the cursor (this batch included).
    backlog: u64,
}

impl Source {
    /// A host's log at `log`, its export's cursor in the file `cursor`.
    pub fn file(log: PathBuf, cursor: PathBuf) -> Source {
        Source::File {
            log,
            cursor,
            counted: Mutex::new((0, 0)),
            chain: std::sync::OnceLock::new(),
        }
    }

    /// The cursor to send from, or `None` when another replica sends now.
    fn cursor(&self, name: &str) -> Result<Option<Cursor>, ExportError> {
        match self {
            Source::File { cursor, .. } => match read_cursor(cursor) {
                Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
                    ExportError::Source(format!(
                        "the export cursor {} is damaged ({e}); move it aside to send everything again",
                        cursor.display()
                    ))
                }),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Some(Cursor::default())),
                Err(e) => Err(ExportError::Source(format!("{}: {e}", cursor.display()))),
            },
            Source::Chain { chain, me } => chain
                .claim_export(name, me, chrono::Utc::now().timestamp_millis(), LEASE_MS)
                .map(|c| {
                    c.map(|(seq, hash)| Cursor {
                        seq,
                        hash,
                        ..Cursor::default()
                    })
                })
                .map_err(|e| ExportError::Source(e.to_string())),
        }
    }

    /// Move the cursor from `from` to `to` (the sink took the batch).
    fn advance(&self, name: &str, from: &Cursor, to: &Cursor) -> Result<(), ExportError> {
        match self {
            Source::File { cursor, .. } => write_cursor(cursor, to)
                .map_err(|e| ExportError::Source(format!("{}: {e}", cursor.display()))),
            Source::Chain { chain, me } => {
                let moved = chain
                    .advance_export(name, me, from.seq, to.seq, &to.hash)
                    .map_err(|e| ExportError::Source(e.to_string()))?;
                if !moved {
                    // Another replica took the export over meanwhile: it
                    // sends from the cursor it read (this batch again).
                    tracing::info!(export = name, "another replica sends the audit export now");
                }
                Ok(())
            }
        }
    }

    /// The chain's identity: its first event's hash (`None` while empty).
    fn chain_id(&self) -> Result<Option<String>, ExportError> {
        let first = match self {
            Source::File { log, .. } => {
                if super::read_head(log)
                    .map_err(|e| ExportError::Source(e.to_string()))?
                    .is_none()
                {
                    return Ok(None);
                }
                if let Some(id) = self.cached_chain() {
                    return Ok(Some(id));
                }
                let f = std::fs::File::open(log)
                    .map_err(|e| ExportError::Source(format!("{}: {e}", log.display())))?;
                let mut reader = BufReader::new(f);
                // The first event: the first line, or, when a crash cut it
                // short, the recovery after it.
                let mut line = Vec::new();
                for _ in 0..2 {
                    line.clear();
                    (&mut reader)
                        .take(MAX_LINE)
                        .read_until(b'\n', &mut line)
                        .map_err(|e| ExportError::Source(format!("{}: {e}", log.display())))?;
                    if serde_json::from_slice::<Map<String, Value>>(line.trim_ascii_end()).is_ok() {
                        break;
                    }
                }
                line
            }
            Source::Chain { chain, .. } => match chain
                .lines_after(0, 1)
                .map_err(|e| ExportError::Source(e.to_string()))?
                .0
                .into_iter()
                .next()
            {
                Some((_, l)) => l.into_bytes(),
                None => return Ok(None),
            },
        };
        let id = serde_json::from_slice::<Map<String, Value>>(first.trim_ascii_end())
            .ok()
            .and_then(|e| e.get("hash").and_then(Value::as_str).map(str::to_string));
        if let (Source::File { chain, .. }, Some(id)) = (self, &id) {
            let _ = chain.set(id.clone());
        }
        Ok(id)
    }

    fn cached_chain(&self) -> Option<String> {
        match self {
            Source::File { chain, .. } => chain.get().cloned(),
            Source::Chain { .. } => None,
        }
    }

    /// The batch past `from`, within `settings`.
    fn read(&self, from: &Cursor, settings: &Settings) -> Result<Batch, ExportError> {
        let lines = match self {
            Source::File { log, counted, .. } => read_file(log, from, settings, counted)?,
            Source::Chain { chain, .. } => {
                let (lines, head) = chain
                    .lines_after(from.seq, settings.batch_events)
                    .map_err(|e| ExportError::Source(e.to_string()))?;
                if head < from.seq {
                    return Err(ExportError::Source(format!(
                        "the chain's head ({head}) is behind the last event sent ({}): the database was restored or rewritten; run gateway audit verify",
                        from.seq
                    )));
                }
                let mut bytes = 0u64;
                let kept: Vec<(u64, String)> = lines
                    .into_iter()
                    .take_while(|(_, l)| {
                        let first = bytes == 0;
                        bytes += l.len() as u64;
                        first || bytes <= settings.batch_bytes
                    })
                    .collect();
                FileLines {
                    lines: kept,
                    backlog: head.saturating_sub(from.seq),
                    offset: 0,
                    newlines: 0,
                }
            }
        };
        let FileLines {
            lines,
            backlog,
            offset: end_offset,
            newlines,
        } = lines;
        let mut prev = if from.seq == 0 {
            GENESIS.to_string()
        } else {
            from.hash.clone()
        };
        let mut events = Vec::with_capacity(lines.len());
        let mut end = from.clone();
        for (seq, line) in lines {
            let event: Map<String, Value> = serde_json::from_str(line.trim_end()).map_err(|e| {
                ExportError::Source(format!(
                    "event {seq} is not JSON ({e}); run gateway audit verify"
                ))
            })?;
            // The chain must go on from what was sent: a log cut or
            // rewritten under the cursor is never sent as if it did.
            if event.get("prev").and_then(Value::as_str) != Some(prev.as_str()) {
                return Err(ExportError::Source(format!(
                    "event {seq} does not follow the last event sent (its prev is not {prev}): the log was cut or rewritten since; run gateway audit verify"
                )));
            }
            prev = event
                .get("hash")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            end = Cursor {
                seq,
                hash: prev.clone(),
                ..Cursor::default()
            };
            let raw = line.trim_end_matches('\n').to_string();
            events.push((seq, event, raw));
        }
        if let Source::File { .. } = self {
            (end.offset, end.lines) = if events.is_empty() {
                (from.offset, from.lines)
            } else {
                (end_offset, from.lines + newlines)
            };
        }
        Ok(Batch {
            events,
            end,
            backlog,
        })
    }
}

/// How long a replica holds the export once it claimed it (renewed with
/// every batch; a replica that died is taken over after it).
/// Well over a send's timeout (30 s) and a read: replicas' clocks must
/// agree within the rest (NTP).
const LEASE_MS: i64 = 120_000;

/// The longest line read from the log (the policy caps an event far
/// below: `data.config.calls.event_bytes`).
const MAX_LINE: u64 = 16 * 1024 * 1024;

/// Lines read past a cursor.
struct FileLines {
    /// (sequence number, line).
    lines: Vec<(u64, String)>,
    /// Lines past the cursor (this batch's included).
    backlog: u64,
    /// The byte offset after the lines read (a file).
    offset: u64,
    /// Newlines in what was read (a cut line's included).
    newlines: u64,
}

/// Up to a batch of complete, durable lines of the file after `from`
/// (durable: before the end its head records), read line by line (memory
/// is bounded by the batch, not the backlog). The backlog is counted with
/// `counted`, so that each byte of the log is read once for it.
fn read_file(
    log: &Path,
    from: &Cursor,
    settings: &Settings,
    counted: &Mutex<(u64, u64)>,
) -> Result<FileLines, ExportError> {
    let err = |e: std::io::Error| ExportError::Source(format!("{}: {e}", log.display()));
    let empty = || FileLines {
        lines: Vec::new(),
        backlog: 0,
        offset: from.offset,
        newlines: 0,
    };
    let Some(head) = super::read_head(log).map_err(|e| ExportError::Source(e.to_string()))? else {
        return Ok(empty());
    };
    if head.bytes < from.offset {
        return Err(ExportError::Source(format!(
            "{} ends at byte {} before the last event sent (byte {}): it was cut; run gateway audit verify",
            log.display(),
            head.bytes,
            from.offset
        )));
    }
    let mut f = std::fs::File::open(log).map_err(err)?;
    // The backlog: newlines up to the head, less those before the cursor.
    let total = {
        let mut c = counted.lock().unwrap_or_else(|p| p.into_inner());
        if c.0 > head.bytes {
            *c = (0, 0);
        }
        f.seek(SeekFrom::Start(c.0)).map_err(err)?;
        let mut chunk = vec![0u8; 64 * 1024];
        let mut left = head.bytes - c.0;
        while left > 0 {
            let want = usize::try_from(left.min(chunk.len() as u64)).unwrap_or(chunk.len());
            let n = f.read(&mut chunk[..want]).map_err(err)?;
            if n == 0 {
                break;
            }
            c.1 += chunk[..n].iter().filter(|b| **b == b'\n').count() as u64;
            c.0 += n as u64;
            left -= n as u64;
        }
        c.1
    };
    f.seek(SeekFrom::Start(from.offset)).map_err(err)?;
    let mut reader = BufReader::new(f.take(head.bytes - from.offset));
    let mut next_line = || -> Result<Option<Vec<u8>>, ExportError> {
        let mut b = Vec::new();
        let n = (&mut reader)
            .take(MAX_LINE)
            .read_until(b'\n', &mut b)
            .map_err(err)?;
        if n as u64 == MAX_LINE && b.last() != Some(&b'\n') {
            return Err(ExportError::Source(format!(
                "{}: a line longer than {MAX_LINE} bytes; run gateway audit verify",
                log.display()
            )));
        }
        Ok((n > 0 && b.last() == Some(&b'\n')).then_some(b))
    };
    let mut out = FileLines {
        lines: Vec::new(),
        backlog: total.saturating_sub(from.lines),
        offset: from.offset,
        newlines: 0,
    };
    let mut pending: Option<Vec<u8>> = None;
    let mut bytes = 0u64;
    let mut seq = from.seq;
    while (out.lines.len() as u64) < settings.batch_events {
        let line = match pending.take() {
            Some(l) => l,
            None => match next_line()? {
                Some(l) => l,
                None => break,
            },
        };
        let body = &line[..line.len() - 1];
        // A line a crash cut short, ended by the next writer together
        // with its `audit.recovered` event: not an event, passed over (the
        // recovery's `prev` is the last whole event's, as `audit verify`
        // reads it). Anything else that is not an event stops the export.
        if serde_json::from_slice::<Map<String, Value>>(body).is_err() {
            // The writer ends a cut line and writes its recovery at once:
            // nothing after it is not a recovery.
            let Some(next) = next_line()? else {
                return Err(ExportError::Source(format!(
                    "the line after event {seq} is not an event, and nothing recovers it; run gateway audit verify"
                )));
            };
            if !recovers(&next[..next.len() - 1], body) {
                return Err(ExportError::Source(format!(
                    "the line after event {seq} is not an event (nor a line a crash cut short, followed by its recovery); run gateway audit verify"
                )));
            }
            out.offset += line.len() as u64;
            out.newlines += 1;
            pending = Some(next);
            continue;
        }
        if !out.lines.is_empty() && bytes + line.len() as u64 > settings.batch_bytes {
            break;
        }
        bytes += line.len() as u64;
        out.offset += line.len() as u64;
        out.newlines += 1;
        seq += 1;
        let text = String::from_utf8(line)
            .map_err(|_| ExportError::Source(format!("event {seq} is not UTF-8")))?;
        out.lines.push((seq, text));
    }
    Ok(out)
}

/// The cursor file's bytes: a regular file, not a link, small.
fn read_cursor(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() || meta.len() > MAX_CURSOR_BYTES {
        return Err(std::io::Error::other(
            "not a regular file of at most 4 KiB; move it aside to send everything again",
        ));
    }
    let mut b = Vec::new();
    f.take(MAX_CURSOR_BYTES).read_to_end(&mut b)?;
    Ok(b)
}

/// Whether `next` is the `audit.recovered` event of the cut line `cut`.
fn recovers(next: &[u8], cut: &[u8]) -> bool {
    let Ok(e) = serde_json::from_slice::<Map<String, Value>>(next) else {
        return false;
    };
    let data = |k: &str| e.get("data").and_then(|d| d.get(k));
    e.get("event").and_then(Value::as_str) == Some("audit.recovered")
        && data("truncated_sha256").and_then(Value::as_str)
            == Some(gateway_base::canonical::sha256_hex(cut).as_str())
        && data("truncated_bytes").and_then(Value::as_u64) == Some(cut.len() as u64)
}

/// Write the cursor file whole (a new file renamed over the old one).
fn write_cursor(path: &Path, c: &Cursor) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("cursor.new");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&tmp)?;
    f.write_all(&serde_json::to_vec(c).unwrap_or_default())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// How batches are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkKind {
    /// JSON lines, `Content-Type: application/x-ndjson`.
    Jsonl,
    /// OTLP/HTTP logs, protobuf.
    Otlp,
}

/// The sink: its kind, URL and bearer token.
pub struct Sink {
    kind: SinkKind,
    url: reqwest::Url,
    token: Option<String>,
    client: reqwest::Client,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("kind", &self.kind)
            .field("url", &shown(&self.url))
            .finish_non_exhaustive()
    }
}

impl Sink {
    /// A sink of `kind` at `url`; plain http only to a loopback address.
    pub fn new(
        kind: &str,
        url: &str,
        token: Option<String>,
        ca_pem: Option<&[u8]>,
    ) -> Result<Sink, ExportError> {
        let bad = |m: String| ExportError::Config(m);
        let kind = match kind {
            "jsonl" => SinkKind::Jsonl,
            "otlp" => SinkKind::Otlp,
            other => {
                return Err(bad(format!(
                    "sink {other:?}: it must be \"jsonl\" or \"otlp\""
                )));
            }
        };
        let url = reqwest::Url::parse(url).map_err(|e| bad(format!("url: {e}")))?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err(bad(
                "url carries a user name or password: put the sink's token in token_file".into(),
            ));
        }
        let loopback = match url.host() {
            Some(url::Host::Ipv4(a)) => a.is_loopback(),
            Some(url::Host::Ipv6(a)) => a.is_loopback(),
            Some(url::Host::Domain(d)) => d == "localhost",
            None => false,
        };
        match url.scheme() {
            "https" => {}
            "http" if loopback => {}
            _ => {
                return Err(bad(format!(
                    "url {}: it must be https:// (plain http only to a loopback address: the events and the token would cross the network in clear)",
                    shown(&url)
                )));
            }
        }
        // The process's TLS provider (main installs the same one).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut b = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none());
        if let Some(pem) = ca_pem {
            for cert in reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| bad(format!("ca_file: {e}")))?
            {
                b = b.add_root_certificate(cert);
            }
        }
        let client = b
            .build()
            .map_err(|e| bad(format!("the HTTP client: {e}")))?;
        Ok(Sink {
            kind,
            url,
            token,
            client,
        })
    }

    /// Send `records`; `Ok` only when the sink took every one.
    async fn send(&self, records: &[Record]) -> Result<(), ExportError> {
        let (body, content_type) = match self.kind {
            SinkKind::Jsonl => {
                let mut body = Vec::new();
                for r in records {
                    body.extend_from_slice(r.json.as_bytes());
                    body.push(b'\n');
                }
                (body, "application/x-ndjson")
            }
            SinkKind::Otlp => (otlp_logs(records), "application/x-protobuf"),
        };
        let mut req = self
            .client
            .post(self.url.clone())
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        // The error names the sink's URL (the operator's own setting),
        // never the token.
        let resp = req
            .send()
            .await
            .map_err(|e| ExportError::Sink(e.without_url().to_string()))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(ExportError::Sink(format!(
                "{} answered {status}",
                shown(&self.url)
            )));
        }
        if self.kind == SinkKind::Otlp {
            use prost::Message as _;
            // The answer is small; a sink that sends more is not read on.
            let mut resp = resp;
            let mut bytes = Vec::new();
            while let Some(chunk) = resp
                .chunk()
                .await
                .map_err(|e| ExportError::Sink(e.without_url().to_string()))?
            {
                if bytes.len() + chunk.len() > MAX_ANSWER_BYTES {
                    return Err(ExportError::Sink(format!(
                        "{} answered with more than {MAX_ANSWER_BYTES} bytes",
                        shown(&self.url)
                    )));
                }
                bytes.extend_from_slice(&chunk);
            }
            if let Ok(r) =
                opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceResponse::decode(
                    bytes.as_slice(),
                )
                && let Some(p) = r.partial_success
                && p.rejected_log_records > 0
            {
                return Err(ExportError::Sink(format!(
                    "{} rejected {} of the batch's records ({})",
                    shown(&self.url),
                    p.rejected_log_records,
                    p.error_message
                        .chars()
                        .filter(|c| !c.is_control())
                        .take(200)
                        .collect::<String>()
                )));
            }
        }
        Ok(())
    }
}

/// The largest answer read from an OTLP sink (a partial-success message).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// A sink's URL as messages show it: no query (it may carry a key).
pub fn shown(url: &reqwest::Url) -> String {
    format!(
        "{}://{}{}",
        url.scheme(),
        url.host_str().unwrap_or_default(),
        url.port().map(|p| format!(":{p}")).unwrap_or_default()
    ) + url.path()
}

/// The records as one OTLP logs request: each a log record whose body is
/// the record's JSON, with its sequence number, kind and event as
/// attributes.
fn otlp_logs(records: &[Record]) -> Vec<u8> {
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{
        AnyValue, InstrumentationScope, KeyValue, any_value,
    };
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use prost::Message as _;
    let s = |v: &str| AnyValue {
        value: Some(any_value::Value::StringValue(v.to_string())),
    };
    let kv = |k: &str, v: AnyValue| KeyValue {
        key: k.to_string(),
        value: Some(v),
        ..Default::default()
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let log_records = records
        .iter()
        .map(|r| {
            let ts =
                r.ts.as_deref()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                    .and_then(|t| t.timestamp_nanos_opt())
                    .and_then(|n| u64::try_from(n).ok())
                    .unwrap_or(now);
            let mut attributes = vec![
                kv("gateway.audit.kind", s(r.kind)),
                kv(
                    "gateway.audit.seq",
                    AnyValue {
                        value: Some(any_value::Value::IntValue(
                            i64::try_from(r.seq).unwrap_or(i64::MAX),
                        )),
                    },
                ),
            ];
            if let Some(e) = &r.event {
                attributes.push(kv("gateway.audit.event", s(e)));
            }
            LogRecord {
                time_unix_nano: ts,
                observed_time_unix_nano: now,
                severity_number: 9,
                severity_text: "INFO".into(),
                body: Some(s(&r.json)),
                attributes,
                ..Default::default()
            }
        })
        .collect();
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(Resource {
                attributes: vec![kv("service.name", s("gateway"))],
                ..Default::default()
            }),
            scope_logs: vec![ScopeLogs {
                scope: Some(InstrumentationScope {
                    name: "gateway.audit".into(),
                    ..Default::default()
                }),
                log_records,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

/// The SSHSIG namespace of checkpoint signatures.
pub const CHECKPOINT_NAMESPACE: &str = "gateway-audit-checkpoint";

/// The bytes a checkpoint's signature covers: the export, the chain (its
/// first event's hash: another host's or a rotated log's chain is
/// another), where the chain stands, and when.
pub fn checkpoint_statement(export: &str, chain: &str, seq: u64, hash: &str, ts: &str) -> String {
    format!(
        "gateway-audit-checkpoint/v2\nexport={export}\nchain={chain}\nseq={seq}\nhash={hash}\nts={ts}\n"
    )
}

/// One record as sent: its JSON text, and what the OTLP sink also puts in
/// attributes.
pub struct Record {
    pub kind: &'static str,
    pub seq: u64,
    /// The event's name (an event record).
    pub event: Option<String>,
    /// The event's or the checkpoint's time.
    pub ts: Option<String>,
    pub json: String,
}

/// An event record: the event's line exactly as written (the receiver
/// checks those bytes, not a re-serialization of them).
pub fn event_record(
    export: &str,
    chain: &str,
    seq: u64,
    line: &str,
    event: &Map<String, Value>,
) -> Record {
    Record {
        kind: "event",
        seq,
        event: event
            .get("event")
            .and_then(Value::as_str)
            .map(str::to_string),
        ts: event.get("ts").and_then(Value::as_str).map(str::to_string),
        json: format!(
            "{{\"kind\":\"event\",\"export\":{},\"chain\":{},\"seq\":{seq},\"event\":{line}}}",
            Value::String(export.to_string()),
            Value::String(chain.to_string()),
        ),
    }
}

/// The running export.
pub struct Exporter {
    pub name: String,
    pub source: Arc<Source>,
    pub sink: Sink,
    pub signer: Option<ssh_key::PrivateKey>,
    /// The policy's settings now (read before every batch).
    pub settings: Arc<dyn Fn() -> Settings + Send + Sync>,
}

impl Exporter {
    /// Send batches until `stop`; never returns an error (each is logged,
    /// counted, and tried again after a backoff).
    pub async fn run(self, stop: tokio_util::sync::CancellationToken) {
        let mut failures = 0u32;
        loop {
            let settings = (self.settings)();
            let wait = match self.round(&settings).await {
                Ok(true) => {
                    failures = 0;
                    gateway_telemetry::metrics().export_up(&self.name, true);
                    continue;
                }
                Ok(false) => {
                    failures = 0;
                    gateway_telemetry::metrics().export_up(&self.name, true);
                    settings.poll
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    gateway_telemetry::metrics().export_failed(&self.name);
                    gateway_telemetry::metrics().export_up(&self.name, false);
                    let backoff = backoff(failures, settings.max_backoff);
                    tracing::warn!(
                        export = %self.name,
                        retry_in_ms = backoff.as_millis() as u64,
                        "the audit export: {e}"
                    );
                    backoff
                }
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One batch: whether one was sent (there may be more).
    pub async fn round(&self, settings: &Settings) -> Result<bool, ExportError> {
        let source = Arc::clone(&self.source);
        let name = self.name.clone();
        let s = settings.clone();
        let read = tokio::task::spawn_blocking(move || {
            let Some(from) = source.cursor(&name)? else {
                return Ok(None);
            };
            let batch = source.read(&from, &s)?;
            let chain = if batch.events.is_empty() {
                String::new()
            } else {
                source.chain_id()?.ok_or_else(|| {
                    ExportError::Source(
                        "the log's first event cannot be read (its chain is unnamed); run gateway audit verify".into(),
                    )
                })?
            };
            Ok::<_, ExportError>(Some((from, batch, chain)))
        })
        .await
        .map_err(|e| ExportError::Source(e.to_string()))??;
        let Some((from, batch, chain)) = read else {
            // Another replica sends: its own metrics show the backlog.
            gateway_telemetry::metrics().export_progress(&self.name, 0, 0);
            return Ok(false);
        };
        // Shown before the send: a sink that is down leaves it growing.
        gateway_telemetry::metrics().export_progress(&self.name, 0, batch.backlog);
        if batch.events.is_empty() {
            return Ok(false);
        }
        let mut records: Vec<Record> = batch
            .events
            .iter()
            .map(|(seq, e, line)| event_record(&self.name, &chain, *seq, line, e))
            .collect();
        records.push(self.checkpoint(&chain, &batch.end)?);
        self.sink.send(&records).await?;
        let sent = batch.events.len() as u64;
        let source = Arc::clone(&self.source);
        let name = self.name.clone();
        let end = batch.end.clone();
        tokio::task::spawn_blocking(move || source.advance(&name, &from, &end))
            .await
            .map_err(|e| ExportError::Source(e.to_string()))??;
        gateway_telemetry::metrics().export_progress(
            &self.name,
            sent,
            batch.backlog.saturating_sub(sent),
        );
        Ok(true)
    }

    fn checkpoint(&self, chain: &str, at: &Cursor) -> Result<Record, ExportError> {
        let ts = super::now_ts();
        let signature = match &self.signer {
            Some(key) => {
                let statement = checkpoint_statement(&self.name, chain, at.seq, &at.hash, &ts);
                let sig = key
                    .sign(
                        CHECKPOINT_NAMESPACE,
                        ssh_key::HashAlg::Sha512,
                        statement.as_bytes(),
                    )
                    .map_err(|e| ExportError::Config(format!("signing a checkpoint: {e}")))?;
                let pem = sig
                    .to_pem(ssh_key::LineEnding::LF)
                    .map_err(|e| ExportError::Config(format!("signing a checkpoint: {e}")))?;
                Value::String(pem)
            }
            None => Value::Null,
        };
        let json = json!({
            "kind": "checkpoint", "export": self.name, "chain": chain, "seq": at.seq,
            "hash": at.hash, "ts": ts, "signature": signature,
        })
        .to_string();
        Ok(Record {
            kind: "checkpoint",
            seq: at.seq,
            event: None,
            ts: Some(ts),
            json,
        })
    }
}

/// The wait after `failures` failed tries in a row: 1 s doubling, at most
/// `max`, with up to a quarter of jitter (replicas do not retry in step).
fn backoff(failures: u32, max: Duration) -> Duration {
    let base = Duration::from_secs(1)
        .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(max);
    let mut b = [0u8; 2];
    let _ = getrandom::fill(&mut b);
    let jitter = base.mul_f64(f64::from(u16::from_le_bytes(b)) / f64::from(u16::MAX) / 4.0);
    base.saturating_sub(jitter)
}

/// Read the signing key: an unencrypted OpenSSH Ed25519 private key.
pub fn signing_key(pem: &str) -> Result<ssh_key::PrivateKey, ExportError> {
    let key = ssh_key::PrivateKey::from_openssh(pem)
        .map_err(|e| ExportError::Config(format!("signing_key_file: {e}")))?;
    if key.is_encrypted() {
        return Err(ExportError::Config(
            "signing_key_file is encrypted: the daemon cannot ask for its passphrase".into(),
        ));
    }
    if key.algorithm() != ssh_key::Algorithm::Ed25519 {
        return Err(ExportError::Config(format!(
            "signing_key_file is a {} key: use an Ed25519 key (ssh-keygen -t ed25519)",
            key.algorithm()
        )));
    }
    Ok(key)
}

/// What `gateway audit verify --from-export` found.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ExportReport {
    /// The export's name and its chain (the first event's hash).
    pub export: Option<String>,
    pub chain: Option<String>,
    /// Events whose hash and chain check out (sequence numbers 1..=this).
    pub events: u64,
    /// Records received more than once (the at-least-once window), each
    /// the same as its first copy.
    pub duplicates: u64,
    /// Checkpoints on the chain.
    pub checkpoints: u64,
    /// Of them, signatures checked with a `--signer` key.
    pub signatures_verified: u64,
    /// The highest sequence number a checkpoint vouches for, and when that
    /// checkpoint was made (how fresh the export is).
    pub last_checkpoint: Option<u64>,
    pub last_checkpoint_ts: Option<String>,
    /// The chain's last hash.
    pub head: Option<String>,
    /// Things that do not fail the export (a lost head accepted).
    pub warnings: Vec<String>,
    /// Why the export fails, when it does.
    pub failure: Option<String>,
}

/// What a check of an export also asks for.
#[derive(Debug, Clone, Default)]
pub struct ExportChecks {
    /// Keys one of which must have signed every checkpoint.
    pub signers: Vec<ssh_key::PublicKey>,
    /// Heads recorded elsewhere (`gateway audit head`): each must be on
    /// the exported chain.
    pub pins: Vec<String>,
    /// Accept an `audit.head_lost` event (`--no-head`).
    pub head_lost_ok: bool,
}

/// One record as received.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Received<'a> {
    kind: String,
    export: String,
    chain: String,
    seq: u64,
    #[serde(borrow, default)]
    event: Option<&'a serde_json::value::RawValue>,
    #[serde(default)]
    hash: Option<String>,
    #[serde(default)]
    ts: Option<String>,
    #[serde(default)]
    signature: Option<String>,
}

/// Check an export as a receiver kept it (`text`: its records, one JSON
/// object a line, in any order, duplicates allowed): one export of one
/// chain; every event from the first on, none missing, each exactly the
/// bytes the gateway wrote and chained; every checkpoint on that chain
/// and, when `checks.signers` are given, signed by one of them; at least
/// one event, and none past the last checkpoint.
pub fn verify_export(text: &str, checks: &ExportChecks) -> ExportReport {
    let mut report = ExportReport::default();
    if let Err(why) = check_export(text, checks, &mut report) {
        report.failure = Some(why);
    }
    report
}

fn check_export(
    text: &str,
    checks: &ExportChecks,
    report: &mut ExportReport,
) -> Result<(), String> {
    use std::collections::BTreeMap;
    let mut events: BTreeMap<u64, (Map<String, Value>, String)> = BTreeMap::new();
    // Checkpoints by (sequence number, time): (hash, signature).
    let mut checkpoints: BTreeMap<(u64, String), (String, Option<String>)> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = i + 1;
        let r: Received = serde_json::from_str(line)
            .map_err(|e| format!("record {at}: not a record of an export ({e})"))?;
        for (what, got, slot) in [
            ("export", &r.export, &mut report.export),
            ("chain", &r.chain, &mut report.chain),
        ] {
            match slot {
                None => *slot = Some(got.clone()),
                Some(first) if first != got => {
                    return Err(format!(
                        "record {at}: it is of {what} {got:?}, the first record of {first:?}: check one export of one chain at a time"
                    ));
                }
                Some(_) => {}
            }
        }
        if r.seq == 0 {
            return Err(format!("record {at}: sequence number 0 (they start at 1)"));
        }
        let fields_fit = match r.kind.as_str() {
            "event" => r.hash.is_none() && r.ts.is_none() && r.signature.is_none(),
            "checkpoint" => {
                r.event.is_none()
                    && r.hash.as_deref().is_some_and(|h| !h.is_empty())
                    && r.ts.as_deref().is_some_and(|t| !t.is_empty())
            }
            _ => true,
        };
        if !fields_fit {
            return Err(format!(
                "record {at}: a {} record with fields of another kind",
                r.kind
            ));
        }
        match r.kind.as_str() {
            "event" => {
                let raw = r
                    .event
                    .ok_or_else(|| format!("record {at}: an event record without its event"))?
                    .get();
                match events.get(&r.seq) {
                    Some((_, first)) if first == raw => report.duplicates += 1,
                    Some(_) => {
                        return Err(format!(
                            "two different events carry sequence number {}: the export was tampered with",
                            r.seq
                        ));
                    }
                    None => {
                        let e: Map<String, Value> = serde_json::from_str(raw).map_err(|e| {
                            format!("record {at}: its event is not an object ({e})")
                        })?;
                        events.insert(r.seq, (e, raw.to_string()));
                    }
                }
            }
            "checkpoint" => {
                let key = (r.seq, r.ts.clone().unwrap_or_default());
                let value = (r.hash.clone().unwrap_or_default(), r.signature.clone());
                match checkpoints.get(&key) {
                    Some(first) if *first == value => report.duplicates += 1,
                    Some(_) => {
                        return Err(format!(
                            "two different checkpoints at sequence number {} and one time: the export was tampered with",
                            r.seq
                        ));
                    }
                    None => {
                        checkpoints.insert(key, value);
                    }
                }
            }
            other => return Err(format!("record {at}: unknown kind {other:?}")),
        }
    }
    if events.is_empty() || checkpoints.is_empty() {
        return Err(format!(
            "the export holds {} event(s) and {} checkpoint(s): there is nothing to vouch for",
            events.len(),
            checkpoints.len()
        ));
    }
    // Every event from the first on, none missing; the lines as the
    // gateway wrote them, checked as `audit verify` checks a log (each
    // hash, the chain, byte for byte what the writer writes: a key given
    // twice, reordered keys or other escapes fail).
    let mut bytes = Vec::new();
    for (expect, (seq, (_, raw))) in (1u64..).zip(&events) {
        if *seq != expect {
            return Err(format!(
                "events {expect} to {} are missing from the export",
                seq - 1
            ));
        }
        bytes.extend_from_slice(raw.as_bytes());
        bytes.push(b'\n');
    }
    let chain = super::verify::verify_against(&bytes, None, &checks.pins);
    if let Some((line, why)) = &chain.first_bad {
        return Err(format!("event {line}: {why}"));
    }
    if let Some(line) = chain.head_lost() {
        let why = format!(
            "event {line}: the writer found its head file missing or not matching the log; events may have been removed from the end of the log before it"
        );
        if !checks.head_lost_ok {
            return Err(format!("{why} (pass --no-head to accept it)"));
        }
        report.warnings.push(why);
    }
    report.events = events.len() as u64;
    report.head = chain.head.clone();
    // The chain is named by its first event.
    let first = events
        .get(&1)
        .and_then(|(e, _)| e.get("hash").and_then(Value::as_str))
        .unwrap_or_default();
    if report.chain.as_deref() != Some(first) {
        return Err(format!(
            "the records name chain {:?}, but its first event's hash is {first}",
            report.chain.as_deref().unwrap_or_default()
        ));
    }
    // Checkpoints: on the chain, and signed when signers are given.
    for ((seq, ts), (hash, signature)) in &checkpoints {
        let at = events.get(seq).ok_or_else(|| {
            format!("a checkpoint vouches for event {seq}, which is not in the export: events are missing")
        })?;
        if at.0.get("hash").and_then(Value::as_str) != Some(hash.as_str()) {
            return Err(format!(
                "the checkpoint at {seq} ({ts}) names hash {hash}, not event {seq}'s: the chain was rewritten"
            ));
        }
        if !checks.signers.is_empty() {
            let pem = signature.as_deref().ok_or_else(|| {
                format!("the checkpoint at {seq} ({ts}) is not signed, and --signer asks for signed ones")
            })?;
            let sig = ssh_key::SshSig::from_pem(pem).map_err(|e| {
                format!("the checkpoint at {seq} ({ts}): its signature does not parse ({e})")
            })?;
            let statement = checkpoint_statement(
                report.export.as_deref().unwrap_or_default(),
                report.chain.as_deref().unwrap_or_default(),
                *seq,
                hash,
                ts,
            );
            if !checks.signers.iter().any(|k| {
                k.verify(CHECKPOINT_NAMESPACE, statement.as_bytes(), &sig)
                    .is_ok()
            }) {
                return Err(format!(
                    "the checkpoint at {seq} ({ts}) is not signed by any --signer key"
                ));
            }
            report.signatures_verified += 1;
        }
        report.checkpoints += 1;
        if report.last_checkpoint.is_none_or(|l| *seq >= l) {
            report.last_checkpoint = Some(*seq);
            report.last_checkpoint_ts = Some(ts.clone());
        }
    }
    let last = report.last_checkpoint.unwrap_or(0);
    if report.events > last {
        return Err(format!(
            "events {} to {} come after the last checkpoint ({last}): the export ends inside a batch, so nothing vouches that none after them were dropped",
            last + 1,
            report.events,
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An export of `n` events as the exporter sends them, in batches of
    /// `batch`, each followed by its checkpoint signed with `key`.
    fn records(n: usize, batch: usize, key: Option<&ssh_key::PrivateKey>) -> Vec<Value> {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = super::super::AuditLog::open(dir.path().join("audit.jsonl")).expect("log");
        for i in 0..n {
            log.append("r", "tool.request", json!({"i": i}))
                .expect("append");
        }
        export_of(
            Source::file(dir.path().join("audit.jsonl"), dir.path().join("c")),
            batch,
            key,
        )
    }

    /// Everything `source` holds, as the exporter sends it in batches of
    /// `batch`, the records parsed.
    fn export_of(source: Source, batch: usize, key: Option<&ssh_key::PrivateKey>) -> Vec<Value> {
        let exporter = Exporter {
            name: "siem".into(),
            source: Arc::new(source),
            sink: Sink::new("jsonl", "http://127.0.0.1:9/", None, None).expect("sink"),
            signer: key.cloned(),
            settings: Arc::new(Settings::default),
        };
        let settings = Settings {
            batch_events: batch as u64,
            ..Settings::default()
        };
        let chain = exporter
            .source
            .chain_id()
            .expect("chain")
            .unwrap_or_default();
        let mut out = Vec::new();
        let mut at = Cursor::default();
        loop {
            let b = exporter.source.read(&at, &settings).expect("read");
            if b.events.is_empty() {
                return out;
            }
            let mut records: Vec<Record> = b
                .events
                .iter()
                .map(|(seq, e, line)| event_record("siem", &chain, *seq, line, e))
                .collect();
            records.push(exporter.checkpoint(&chain, &b.end).expect("checkpoint"));
            out.extend(
                records
                    .iter()
                    .map(|r| serde_json::from_str::<Value>(&r.json).expect("record")),
            );
            at = b.end;
        }
    }

    fn signed_by(k: &ssh_key::PublicKey) -> ExportChecks {
        ExportChecks {
            signers: vec![k.clone()],
            ..ExportChecks::default()
        }
    }

    fn key(dir: &Path, name: &str) -> (ssh_key::PrivateKey, ssh_key::PublicKey) {
        let path = dir.join(name);
        let st = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&path)
            .status()
            .expect("ssh-keygen");
        assert!(st.success());
        let private = signing_key(&std::fs::read_to_string(&path).expect("key")).expect("ed25519");
        let public = private.public_key().clone();
        (private, public)
    }

    fn text(records: &[Value]) -> String {
        records.iter().map(|r| format!("{r}\n")).collect()
    }

    #[test]
    fn a_whole_export_verifies_in_any_order_with_duplicates() {
        let dir = tempfile::tempdir().expect("dir");
        let (private, public) = key(dir.path(), "k");
        let mut r = records(10, 3, Some(&private));
        let report = verify_export(&text(&r), &signed_by(&public));
        assert_eq!(report.failure, None);
        assert_eq!(
            (
                report.events,
                report.checkpoints,
                report.signatures_verified
            ),
            (10, 4, 4)
        );
        // Sent again (a batch the sink took but whose answer was lost),
        // and received out of order.
        let again: Vec<Value> = r[0..4].to_vec();
        r.extend(again);
        r.reverse();
        let report = verify_export(&text(&r), &signed_by(&public));
        assert_eq!(report.failure, None, "{report:?}");
        assert_eq!((report.events, report.duplicates), (10, 4));
    }

    #[test]
    fn a_tampered_export_fails_and_says_how() {
        let dir = tempfile::tempdir().expect("dir");
        let (private, public) = key(dir.path(), "k");
        let (other, _) = key(dir.path(), "other");
        let good = records(6, 2, Some(&private));
        let none = ExportChecks::default();
        let fails = |r: &[Value], checks: &ExportChecks, why: &str| {
            let report = verify_export(&text(r), checks);
            let failure = report.failure.unwrap_or_default();
            assert!(failure.contains(why), "{why:?} not in {failure:?}");
        };
        // An event removed.
        let mut r = good.clone();
        r.retain(|x| !(x["kind"] == "event" && x["seq"] == 2));
        fails(&r, &none, "events 2 to 2 are missing");
        // An event edited (its hash kept).
        let mut r = good.clone();
        r[0]["event"]["data"]["i"] = json!(99);
        fails(&r, &none, "hash does not match the line's content (edited)");
        // An edited event whose hash is made again breaks the chain.
        let mut r = good.clone();
        let mut e = r[0]["event"].as_object().cloned().expect("event");
        e.remove("hash");
        e.insert("data".into(), json!({"i": 99}));
        let (_, hash) = super::super::event_line(&e);
        e.insert("hash".into(), Value::String(hash));
        r[0]["event"] = Value::Object(e);
        fails(&r, &none, "event 2");
        // A second, different copy of one event.
        let mut r = good.clone();
        let mut twin = r[0].clone();
        twin["event"]["ts"] = json!("2000-01-01T00:00:00.000Z");
        r.push(twin);
        fails(&r, &none, "two different events");
        // The last batch's checkpoint lost: its events are vouched for by none.
        let mut r = good.clone();
        r.pop();
        fails(&r, &none, "come after the last checkpoint");
        // Signed by another key, or not signed, with --signer.
        let forged = records(6, 2, Some(&other));
        fails(
            &forged,
            &signed_by(&public),
            "not signed by any --signer key",
        );
        let unsigned = records(6, 2, None);
        fails(&unsigned, &signed_by(&public), "is not signed");
        // A checkpoint's statement changed after signing.
        let mut r = good.clone();
        let last = r.len() - 1;
        r[last]["ts"] = json!("2000-01-01T00:00:00.000Z");
        fails(&r, &signed_by(&public), "not signed by any --signer key");
        // Without --signer the unsigned export verifies (its chain only).
        assert_eq!(verify_export(&text(&unsigned), &none).failure, None);
        // A key given twice in an event (a SIEM parser may keep either):
        // not the bytes the gateway wrote.
        let all = text(&good);
        let first = good[0]["event"].to_string();
        let doubled = first.replacen('{', "{\"data\":{\"i\":99},", 1);
        let report = verify_export(&all.replacen(&first, &doubled, 1), &none);
        assert!(
            report
                .failure
                .as_deref()
                .unwrap_or_default()
                .contains("duplicate key \"data\""),
            "{report:?}"
        );
        // A checkpoint that carries an event (a SIEM would index it).
        let mut r = good.clone();
        let last = r.len() - 1;
        r[last]["event"] = good[0]["event"].clone();
        fails(&r, &none, "with fields of another kind");
        // Nothing at all, or events with no checkpoint: nothing vouched for.
        fails(&[], &none, "nothing to vouch for");
        let mut r = good.clone();
        r.retain(|x| x["kind"] == "event");
        fails(&r, &none, "nothing to vouch for");
        // Records of another chain mixed in.
        let mut r = good.clone();
        r.extend(records(3, 3, Some(&private)));
        fails(&r, &none, "check one export of one chain at a time");
        // A sequence number 0.
        let mut r = good.clone();
        r[0]["seq"] = json!(0);
        fails(&r, &none, "sequence number 0");
        // A head recorded elsewhere must be on the chain.
        let pinned = |pin: &str| ExportChecks {
            pins: vec![pin.to_string()],
            ..ExportChecks::default()
        };
        let on_chain = good[1]["event"]["hash"].as_str().expect("hash").to_string();
        assert_eq!(verify_export(&all, &pinned(&on_chain)).failure, None);
        fails(&good, &pinned(&"0".repeat(64)), "not on the chain");
    }

    /// A line a crash cut short, and its recovery: the export goes on
    /// past it, and what it sent verifies.
    #[test]
    fn a_line_cut_by_a_crash_is_passed_over_with_its_recovery() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.jsonl");
        let log = super::super::AuditLog::open(&path).expect("log");
        log.append("r", "tool.request", json!({"i": 0}))
            .expect("append");
        // The crash: half a line, no newline.
        {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .expect("open");
            f.write_all(b"{\"data\":{\"i\":1},\"ev").expect("write");
        }
        // The next writer (a new process) ends it and records the recovery.
        let log = super::super::AuditLog::open(&path).expect("log");
        log.append("r", "tool.request", json!({"i": 2}))
            .expect("append");
        let source = Source::file(path.clone(), dir.path().join("c"));
        let b = source
            .read(&Cursor::default(), &Settings::default())
            .expect("read past the cut line");
        let names: Vec<&str> = b
            .events
            .iter()
            .filter_map(|(_, e, _)| e.get("event").and_then(Value::as_str))
            .collect();
        assert_eq!(names, ["tool.request", "audit.recovered", "tool.request"]);
        let records = export_of(Source::file(path.clone(), dir.path().join("c2")), 10, None);
        assert_eq!(records.len(), 4);
        assert_eq!(
            verify_export(&text(&records), &ExportChecks::default()).failure,
            None
        );
        // A line that is not an event and not recovered stops the export.
        std::fs::write(&path, b"not an event\nnor this\n").expect("write");
        super::super::write_head(
            &path,
            &super::super::Head {
                hash: String::new(),
                bytes: 22,
            },
        )
        .expect("head");
        let err = source
            .read(&Cursor::default(), &Settings::default())
            .err()
            .expect("refused");
        assert!(err.to_string().contains("not an event"), "{err}");
    }

    #[test]
    fn settings_out_of_range_are_refused() {
        assert_eq!(Settings::from_data(&json!({})), Ok(Settings::default()));
        let s = Settings::from_data(&json!({"batch_events": 10, "max_backoff_seconds": 5}))
            .expect("in range");
        assert_eq!(
            (s.batch_events, s.max_backoff),
            (10, Duration::from_secs(5))
        );
        for bad in [
            json!({"batch_events": 0}),
            json!({"batch_events": 1e9}),
            json!({"batch_bytes": "big"}),
            json!({"max_backoff_seconds": -1}),
        ] {
            assert!(Settings::from_data(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let max = Duration::from_secs(60);
        assert!(backoff(1, max) <= Duration::from_secs(1));
        assert!(backoff(1, max) >= Duration::from_millis(750));
        assert!(backoff(4, max) >= Duration::from_secs(6));
        assert!(backoff(30, max) <= max);
        assert!(backoff(30, max) >= Duration::from_secs(45));
    }

    #[test]
    fn a_plain_http_sink_must_be_on_this_host() {
        assert!(Sink::new("jsonl", "http://siem.example/ingest", None, None).is_err());
        assert!(Sink::new("jsonl", "http://127.0.0.1:9/ingest", None, None).is_ok());
        assert!(Sink::new("otlp", "https://siem.example/v1/logs", None, None).is_ok());
        assert!(Sink::new("syslog", "https://siem.example/", None, None).is_err());
    }

    /// A file log read in batches: every event once, in order, the cursor
    /// at each batch's end; a log cut under the cursor is refused.
    #[test]
    fn the_file_is_read_in_batches_from_the_cursor() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = super::super::AuditLog::open(dir.path().join("audit.jsonl")).expect("log");
        for i in 0..7 {
            log.append("r", "tool.request", json!({"i": i}))
                .expect("append");
        }
        let source = Source::file(dir.path().join("audit.jsonl"), dir.path().join("c.cursor"));
        let settings = Settings {
            batch_events: 3,
            ..Settings::default()
        };
        let mut at = source.cursor("t").expect("cursor").expect("mine");
        let mut seen = Vec::new();
        loop {
            let b = source.read(&at, &settings).expect("read");
            if b.events.is_empty() {
                assert_eq!(b.backlog, 0);
                break;
            }
            assert_eq!(b.backlog, 7 - seen.len() as u64);
            seen.extend(
                b.events
                    .iter()
                    .map(|(s, e, _)| (*s, e["data"]["i"].clone())),
            );
            source.advance("t", &at, &b.end).expect("advance");
            at = source.cursor("t").expect("cursor").expect("mine");
            assert_eq!(at, b.end);
        }
        assert_eq!(
            seen,
            (0..7).map(|i| (i as u64 + 1, json!(i))).collect::<Vec<_>>()
        );
        // Rewritten under the cursor: refused, nothing sent.
        let path = dir.path().join("audit.jsonl");
        let text = std::fs::read_to_string(&path).expect("read");
        let first = text.lines().next().expect("a line");
        std::fs::write(&path, format!("{first}\n")).expect("cut");
        super::super::write_head(
            &path,
            &super::super::Head {
                hash: String::new(),
                bytes: first.len() as u64 + 1,
            },
        )
        .expect("head");
        let err = source.read(&at, &settings).err().expect("cut");
        assert!(err.to_string().contains("was cut"), "{err}");
    }
}
