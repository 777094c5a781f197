//! `gateway audit verify`: check the hash chain line by line.
//!
//! A line whose `hash` does not match its content was edited; a line whose
//! `prev` is not the previous line's `hash` means a line was removed,
//! reordered or inserted before it. The first such line is reported and the
//! log fails verification. A last line cut short (a crash while writing) is
//! reported but does not fail the lines before it; a cut line that a later
//! writer ended and recorded with an `audit.recovered` event is accepted.
//!
//! A line must be byte for byte what the writer writes: canonical JSON of
//! the event without `hash`, then `,"hash":"…"}`, the hash being SHA-256
//! of those canonical bytes. A duplicated key (which readers resolve in
//! different ways), reordered keys or other spacing is refused. Lines of
//! the earlier format (the hash over the parsed event, keys in the order
//! written) are accepted at the start of a log, before the first line of
//! this format, when they are exactly as that writer wrote them and free
//! of duplicate keys; the report warns about them.
//!
//! Removal from the end leaves a well-formed chain, so the log is also
//! checked against its head (the sidecar the writer updates after every
//! append, see [`super::Head`]): the head's event must be on the chain and
//! end where the head says. A head behind the end is fine (a crash between
//! the append and the head's update); a log that no longer reaches its head
//! fails. Checkpoints (heads recorded elsewhere by the operator) must be on
//! the chain too.

use std::path::Path;

use serde::Serialize;
use serde_json::{Map, Value};

use super::{GENESIS, event_hash};
use gateway_base::canonical::sha256_hex;

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Events whose hash and chain check out.
    pub verified: usize,
    /// The hash of the last verified event (the chain's head), if any.
    pub head: Option<String>,
    /// The first line that breaks the log, with why (1-based line number).
    pub first_bad: Option<(usize, String)>,
    /// Things reported that do not fail the log (a crash-cut line, no head).
    pub warnings: Vec<String>,
    /// Signed verdicts (`approval.granted` / `approval.denied`) whose SSH
    /// signature was checked again.
    pub signatures_verified: usize,
    /// Each verified event's hash and the byte offset where its line ends.
    #[serde(skip)]
    ends: Vec<(String, u64)>,
    /// The first `audit.head_lost` line, if any.
    #[serde(skip)]
    head_lost_at: Option<usize>,
    /// The head file was there but not usable (not a regular file,
    /// garbage, too long): the chain was checked alone.
    #[serde(skip)]
    head_damaged: bool,
    /// Why events removed from the end could go unseen (the head missing,
    /// damaged, or found lost by a writer), whatever the head rule.
    #[serde(skip)]
    head_problem: Option<String>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.first_bad.is_none()
    }

    /// The first `audit.head_lost` event's line, if any.
    pub fn head_lost(&self) -> Option<usize> {
        self.head_lost_at
    }

    /// Whether the head file was there but not usable ([`verify_file`]).
    pub fn head_damaged(&self) -> bool {
        self.head_damaged
    }

    /// Why events removed from the end of the log could go unseen, if
    /// they could: the head missing, damaged or found lost by a writer
    /// ([`verify_file`], under either head rule).
    pub fn head_problem(&self) -> Option<&str> {
        self.head_problem.as_deref()
    }
}

/// Whether a log without a head file (or whose writer found its head
/// gone, `audit.head_lost`) fails or only warns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadRule {
    /// A log with events must have its head (the default).
    Required,
    /// `--no-head`: a missing or lost head is a warning.
    Optional,
}

/// Verify the log at `path` against its chain, its recorded head and the
/// given checkpoints.
pub fn verify_file(
    path: &Path,
    checkpoints: &[String],
    head_rule: HeadRule,
) -> Result<Report, super::AuditError> {
    // The head first, then the log: a writer updates the head only after its
    // line is in the log, so a head read first never points past the log
    // read after it, even while the server keeps writing (no lock needed).
    // A head file that is not one (garbage, too long, not a regular file:
    // nothing a writer leaves) is reported as the log's failure, as a
    // missing head is, not as an error that says nothing of the chain.
    let (head, damaged) = match super::read_head(path) {
        Ok(head) => (head, None),
        Err(super::AuditError::BadHead { why, .. }) => (None, Some(why)),
        Err(e) => return Err(e),
    };
    let mut log_missing = false;
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        // The log gone while a head says it had events (or what is left of
        // one stands in its place): every event removed from the end, which
        // the empty log's check against the head says.
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && (head.is_some() || damaged.is_some()) =>
        {
            log_missing = true;
            Vec::new()
        }
        Err(source) => {
            return Err(super::AuditError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let mut report = verify_against(&bytes, head.as_ref(), checkpoints);
    if log_missing && report.ok() {
        // Whatever the head rule: a log is never accepted by its absence.
        report.first_bad = Some((
            1,
            format!(
                "the log is missing but its head file {} remains: every event was removed",
                super::head_path(path).display()
            ),
        ));
    }
    report.head_damaged = damaged.is_some();
    let missing = match &damaged {
        Some(why) => Some(format!(
            "the head file {} is damaged ({why}): events removed from the end of the log cannot be detected",
            super::head_path(path).display()
        )),
        None if head.is_none() && report.verified > 0 => Some(format!(
            "no head file {}: events removed from the end of the log cannot be detected",
            super::head_path(path).display()
        )),
        None => None,
    };
    if let Some(why) = missing {
        report.head_problem = Some(why.clone());
        match head_rule {
            HeadRule::Required if report.ok() => {
                report.first_bad = Some((
                    report.ends.len() + 1,
                    format!("{why} (pass --no-head to check the chain alone)"),
                ))
            }
            // Said even when the chain fails first: it is the next thing
            // to look at.
            _ => report.warnings.push(why),
        }
    }
    if let Some(line) = report.head_lost_at {
        let why = format!(
            "line {line}: the writer found the head file missing, damaged or not matching the log; events may have been removed from the end of the log before that line"
        );
        report.head_problem.get_or_insert_with(|| why.clone());
        match head_rule {
            HeadRule::Required if report.ok() => {
                report.first_bad = Some((line, format!("{why} (pass --no-head to accept it)")))
            }
            HeadRule::Optional if report.ok() => report.warnings.push(why),
            _ => {}
        }
    }
    Ok(report)
}

/// The chain alone (no head, no checkpoints).
pub fn verify_bytes(bytes: &[u8]) -> Report {
    verify_against(bytes, None, &[])
}

/// The chain, then whether it reaches `head` and holds every checkpoint.
pub fn verify_against(bytes: &[u8], head: Option<&super::Head>, checkpoints: &[String]) -> Report {
    let mut report = verify_chain(bytes);
    if !report.ok() {
        return report;
    }
    let after_last = report.ends.len() + 1;
    if let Some(h) = head {
        match report.ends.iter().position(|(hash, _)| *hash == h.hash) {
            Some(i) if report.ends[i].1 == h.bytes => {}
            Some(i) => {
                report.first_bad = Some((
                    i + 1,
                    format!(
                        "the recorded head event ends at byte {} but this line ends at byte {} (lines before it were changed)",
                        h.bytes, report.ends[i].1
                    ),
                ));
            }
            None if (bytes.len() as u64) < h.bytes => {
                report.first_bad = Some((
                    after_last,
                    format!(
                        "the log is {} bytes but its recorded head ends at byte {}: events were removed from the end",
                        bytes.len(),
                        h.bytes
                    ),
                ));
            }
            None => {
                report.first_bad = Some((
                    after_last,
                    format!(
                        "the recorded head event {} is not in the log: the end of the log was rewritten",
                        h.hash
                    ),
                ));
            }
        }
    }
    if report.ok() {
        for c in checkpoints {
            let c = c.trim().to_ascii_lowercase();
            if !report.ends.iter().any(|(hash, _)| *hash == c) {
                report.first_bad = Some((
                    after_last,
                    format!(
                        "checkpoint {c} is not on the chain: the log was rewritten or cut before it"
                    ),
                ));
                break;
            }
        }
    }
    report
}

fn verify_chain(bytes: &[u8]) -> Report {
    let mut lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    let ends_with_newline = bytes.is_empty() || bytes.ends_with(b"\n");
    let cut_last = if ends_with_newline {
        lines.pop(); // the empty piece after the final newline
        None
    } else {
        lines.pop()
    };
    let mut report = Report {
        verified: 0,
        head: None,
        first_bad: None,
        warnings: vec![],
        signatures_verified: 0,
        ends: vec![],
        head_lost_at: None,
        head_damaged: false,
        head_problem: None,
    };
    let mut end: u64 = 0;
    let mut prev = GENESIS.to_string();
    let mut pending_cut: Option<(usize, String)> = None;
    let mut current_format_seen = false;
    let mut legacy_lines = 0usize;
    for (i, raw) in lines.iter().enumerate() {
        let n = i + 1;
        end += raw.len() as u64 + 1;
        let event = match parse_line(raw) {
            Line::Event(e) => e,
            Line::Refused(why) => {
                report.first_bad = Some((n, why));
                return report;
            }
            Line::NotAnEvent => {
                // Only acceptable if the next line records the recovery;
                // a second one before it is not a crash's doing.
                if let Some((cut_line, _)) = pending_cut {
                    report.first_bad =
                        Some((cut_line, "not an audit event (edited or inserted)".into()));
                    return report;
                }
                pending_cut = Some((n, sha256_hex(raw)));
                continue;
            }
        };
        if let Some((cut_line, cut_hash)) = pending_cut.take() {
            let recovered = event.get("event").and_then(Value::as_str) == Some("audit.recovered")
                && event
                    .get("data")
                    .and_then(|d| d.get("truncated_sha256"))
                    .and_then(Value::as_str)
                    == Some(cut_hash.as_str());
            if !recovered {
                report.first_bad =
                    Some((cut_line, "not an audit event (edited or inserted)".into()));
                return report;
            }
            report.warnings.push(format!(
                "line {cut_line}: cut short by a crash; recovered at line {n}"
            ));
        }
        let hash = event
            .get("hash")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if event_hash(&event) != hash {
            report.first_bad = Some((n, "hash does not match the line's content (edited)".into()));
            return report;
        }
        let (written, _) = super::event_line(&without_hash(&event));
        if written.as_bytes()[..written.len() - 1] == **raw {
            current_format_seen = true;
        } else if !current_format_seen && legacy_bytes(&event) == **raw {
            legacy_lines += 1;
        } else {
            report.first_bad = Some((
                n,
                "the line is not byte for byte what the writer writes (keys reordered, spacing or escapes changed): edited"
                    .into(),
            ));
            return report;
        }
        if event.get("event").and_then(Value::as_str) == Some("audit.head_lost")
            && report.head_lost_at.is_none()
        {
            report.head_lost_at = Some(n);
        }
        let claimed_prev = event
            .get("prev")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if claimed_prev != prev {
            let why = if n == 1 {
                "the first line does not start the chain (lines removed before it)".to_string()
            } else {
                format!(
                    "prev does not match line {}'s hash (a line was removed, reordered or inserted)",
                    n - 1
                )
            };
            report.first_bad = Some((n, why));
            return report;
        }
        match signed_verdict(&event) {
            Ok(true) => report.signatures_verified += 1,
            Ok(false) => {}
            Err(why) => {
                report.first_bad = Some((n, why));
                return report;
            }
        }
        prev = hash.to_string();
        report.verified += 1;
        report.head = Some(prev.clone());
        report.ends.push((prev.clone(), end));
    }
    if let Some((cut_line, _)) = pending_cut {
        report.first_bad = Some((cut_line, "not an audit event (edited or inserted)".into()));
        return report;
    }
    if legacy_lines > 0 {
        report.warnings.push(format!(
            "the first {legacy_lines} line(s) are in the earlier line format (hash over the parsed event); they verify, and no duplicate key is in them"
        ));
    }
    if let Some(cut) = cut_last {
        report.warnings.push(format!(
            "line {}: cut short ({} bytes, no newline): a crash while writing? not verified",
            lines.len() + 1,
            cut.len()
        ));
    }
    report
}

/// Check a signed verdict's signature again, with the key the event
/// recorded: the statement must be for this approval and verdict, and the
/// signature over it must verify by that key, whose fingerprint must be the
/// one recorded. `Ok(false)`: the event is not a signed verdict.
fn signed_verdict(event: &Map<String, Value>) -> Result<bool, String> {
    use crate::approvals::signature::{Statement, verify_with_key};
    let name = event
        .get("event")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let verdict = match name {
        "approval.granted" => "grant",
        "approval.denied" => "deny",
        _ => return Ok(false),
    };
    let data = event.get("data").cloned().unwrap_or(Value::Null);
    let field = |k: &str| data.get(k).and_then(Value::as_str);
    let kind = field("kind");
    if kind != Some("ssh_key") && kind != Some("passkey") {
        if field("statement").is_some() || field("signature").is_some() {
            return Err(
                "a verdict carries a signature but is not recorded as signed (edited)".into(),
            );
        }
        return Ok(false);
    }
    let (Some(statement), Some(signature), Some(key), Some(fp)) = (
        field("statement"),
        field("signature"),
        field("public_key"),
        field("key_fingerprint"),
    ) else {
        return Err("a signed verdict without its statement, signature, key or fingerprint".into());
    };
    let st =
        Statement::parse(statement.as_bytes()).map_err(|e| format!("approval signature: {e}"))?;
    if Some(st.approval_id.as_str()) != field("approval_id") || st.verdict != verdict {
        return Err(format!(
            "approval signature: the statement is for {} {}, the event for {} {}",
            st.verdict,
            st.approval_id,
            verdict,
            field("approval_id").unwrap_or("?")
        ));
    }
    if Some(st.reason.as_str()) != field("reason") {
        return Err(
            "approval signature: the recorded reason is not the signed one (edited)".into(),
        );
    }
    if kind == Some("passkey") {
        // The assertion over the statement's SHA-256, by the credential
        // recorded with it, for the page's origin, user verified.
        let origin = data
            .get("identity")
            .and_then(|i| i.get("origin"))
            .and_then(Value::as_str)
            .ok_or("a passkey verdict without the origin it was given at")?;
        let approver = field("approver").unwrap_or_default();
        return match crate::approvals::passkey::verify_recorded(
            origin, approver, key, statement, signature,
        ) {
            Ok(p) if format!("webauthn:{}", p.credential_id) == fp => Ok(true),
            Ok(p) => Err(format!(
                "approval passkey: made by credential {}, recorded as {fp} (edited)",
                p.credential_id
            )),
            Err(e) => Err(format!("approval passkey does not verify: {e}")),
        };
    }
    match verify_with_key(key, statement.as_bytes(), signature) {
        Ok(actual) if actual == fp => Ok(true),
        Ok(actual) => Err(format!(
            "approval signature: made by key {actual}, recorded as {fp} (edited)"
        )),
        Err(e) => Err(format!("approval signature does not verify: {e}")),
    }
}

/// What one line of the log is.
enum Line {
    Event(Map<String, Value>),
    /// JSON with a `hash`, but not acceptable whatever follows.
    Refused(String),
    /// Not an event at all (a line cut by a crash, or garbage).
    NotAnEvent,
}

fn parse_line(raw: &[u8]) -> Line {
    match strict::object(raw) {
        Ok(event) if event.get("hash").and_then(Value::as_str).is_some() => Line::Event(event),
        Ok(_) => Line::NotAnEvent,
        Err(strict::Error::Duplicate(key)) => Line::Refused(format!(
            "duplicate key {key:?}: readers would disagree on its value (edited)"
        )),
        Err(strict::Error::Json) => Line::NotAnEvent,
    }
}

fn without_hash(event: &Map<String, Value>) -> Map<String, Value> {
    let mut m = event.clone();
    m.remove("hash");
    m
}

/// A line as the earlier writer wrote it: the event in the order of its keys.
fn legacy_bytes(event: &Map<String, Value>) -> Vec<u8> {
    serde_json::to_vec(event).unwrap_or_default()
}

/// JSON parsing that refuses an object with a key twice (serde_json keeps
/// the last value, other readers the first).
mod strict {
    use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
    use serde_json::{Map, Value};

    pub enum Error {
        Duplicate(String),
        Json,
    }

    struct Strict(Value);

    const DUPLICATE: &str = "\u{0}duplicate key\u{0}";

    impl<'de> Deserialize<'de> for Strict {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Strict, D::Error> {
            d.deserialize_any(StrictVisitor).map(Strict)
        }
    }

    struct StrictVisitor;

    impl<'de> Visitor<'de> for StrictVisitor {
        type Value = Value;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("JSON")
        }
        fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
            Ok(Value::Bool(v))
        }
        fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
            Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
        }
        fn visit_str<E>(self, v: &str) -> Result<Value, E> {
            Ok(Value::String(v.to_string()))
        }
        fn visit_string<E>(self, v: String) -> Result<Value, E> {
            Ok(Value::String(v))
        }
        fn visit_unit<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
            let mut out = Vec::new();
            while let Some(Strict(v)) = seq.next_element()? {
                out.push(v);
            }
            Ok(Value::Array(out))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
            let mut out = Map::new();
            while let Some(key) = map.next_key::<String>()? {
                let Strict(v) = map.next_value()?;
                if out.contains_key(&key) {
                    return Err(de::Error::custom(format!("{DUPLICATE}{key}")));
                }
                out.insert(key, v);
            }
            Ok(Value::Object(out))
        }
    }

    /// `raw` as a JSON object; a key twice anywhere in it is an error.
    pub fn object(raw: &[u8]) -> Result<Map<String, Value>, Error> {
        match serde_json::from_slice::<Strict>(raw) {
            Ok(Strict(Value::Object(m))) => Ok(m),
            Ok(_) => Err(Error::Json),
            Err(e) => {
                let msg = e.to_string();
                match msg.split_once(DUPLICATE) {
                    Some((_, rest)) => {
                        // serde_json appends " at line L column C".
                        let key = rest.rsplit_once(" at line ").map_or(rest, |(k, _)| k);
                        Err(Error::Duplicate(key.to_string()))
                    }
                    None => Err(Error::Json),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::AuditLog;
    use serde_json::json;

    /// A passkey grant as the daemon records it, made by a software
    /// authenticator over a real statement.
    fn passkey_grant() -> Map<String, Value> {
        use crate::approvals::passkey::{statement_challenge, testing::Authenticator};
        let a = Authenticator::new();
        let listed = a.listed("bob");
        let statement = "{\"approval_id\":\"ap-1\",\"expires_at\":\"2030-01-01T00:00:00Z\",\"params_sha256\":\"aa\",\"plan_sha256\":\"bb\",\"reason\":\"ok\",\"tool\":\"terraform_apply\",\"type\":\"gateway-approval/v1\",\"verdict\":\"grant\"}\n";
        assert!(crate::approvals::signature::Statement::parse(statement.as_bytes()).is_ok());
        let assertion = a.assert(
            "https://gw.example",
            "gw.example",
            &statement_challenge(statement.as_bytes()),
            true,
        );
        let event = json!({"event": "approval.granted", "data": {
            "approval_id": "ap-1", "approver": "bob", "kind": "passkey", "os_user": "",
            "reason": "ok", "key_fingerprint": format!("webauthn:{}", listed.id),
            "public_key": serde_json::to_string(&listed.credential).expect("json"),
            "statement": statement, "signature": assertion.to_string(),
            "identity": {"origin": "https://gw.example", "user_verified": true},
        }});
        event.as_object().expect("object").clone()
    }

    /// Numbers an agent sends land in the log as the shortest text of
    /// their f64; read back, each must give the same f64, or an honest log
    /// fails its own check (serde_json's default float parser is inexact).
    #[test]
    fn an_agents_floats_read_back_as_written() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path).expect("log");
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut floats = vec![4.520087423683831e186, 1.7976931348623157e308, 5e-324, 0.1];
        for _ in 0..2000 {
            // A spread of doubles over every exponent.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let f = f64::from_bits(x);
            if f.is_finite() {
                floats.push(f);
            }
        }
        for chunk in floats.chunks(50) {
            log.append("r", "tool.request", json!({"params": chunk}))
                .expect("append");
        }
        let r = verify_file(&path, &[], HeadRule::Required).expect("verify");
        assert!(r.ok(), "{:?}", r.first_bad);
    }

    #[test]
    fn a_passkey_grant_is_checked_again_and_an_edit_is_found() {
        let good = passkey_grant();
        assert_eq!(signed_verdict(&good), Ok(true));
        let edited = |f: &dyn Fn(&mut Map<String, Value>)| {
            let mut e = good.clone();
            let data = e
                .get_mut("data")
                .and_then(Value::as_object_mut)
                .expect("data");
            f(data);
            signed_verdict(&e)
        };
        // The recorded reason is not the signed one.
        assert!(
            edited(&|d| {
                d.insert("reason".into(), json!("other"));
            })
            .is_err()
        );
        // The statement changed (another verdict's or approval's).
        assert!(
            edited(&|d| {
                let st = d["statement"]
                    .as_str()
                    .expect("s")
                    .replace("\"reason\":\"ok\"", "\"reason\":\"ok!\"");
                d.insert("statement".into(), json!(st));
                d.insert("reason".into(), json!("ok!"));
            })
            .is_err()
        );
        // The credential swapped for another's, or the origin edited.
        assert!(
            edited(&|d| {
                let other = crate::approvals::passkey::testing::Authenticator::new().listed("bob");
                d.insert(
                    "public_key".into(),
                    json!(serde_json::to_string(&other.credential).expect("json")),
                );
            })
            .is_err()
        );
        assert!(
            edited(&|d| {
                d.insert("key_fingerprint".into(), json!("webauthn:AAAA"));
            })
            .is_err()
        );
        assert!(
            edited(&|d| {
                let mut i = d["identity"].clone();
                i["origin"] = json!("https://evil.example");
                d.insert("identity".into(), i);
            })
            .is_err()
        );
        // Recorded as another kind: its signature betrays it.
        assert!(
            edited(&|d| {
                d.insert("kind".into(), json!("os_user"));
            })
            .is_err()
        );
    }

    fn log_of(n: usize) -> (tempfile::TempDir, std::path::PathBuf, Vec<String>) {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("a.jsonl");
        let log = AuditLog::open(&path).expect("open");
        for i in 0..n {
            log.append(
                &format!("req-{i}"),
                "tool.request",
                json!({"i": i, "tool": "t"}),
            )
            .expect("append");
        }
        let lines = std::fs::read_to_string(&path)
            .expect("read")
            .lines()
            .map(str::to_string)
            .collect();
        (dir, path, lines)
    }

    fn join(lines: &[String]) -> Vec<u8> {
        let mut s = lines.join("\n");
        s.push('\n');
        s.into_bytes()
    }

    #[test]
    fn a_clean_log_verifies() {
        let (_d, path, _) = log_of(5);
        let r = verify_file(&path, &[], HeadRule::Required).expect("read");
        assert!(r.ok(), "{r:?}");
        assert_eq!(r.verified, 5);
        assert!(verify_bytes(b"").ok());
    }

    #[test]
    fn an_edited_value_is_caught_at_its_line() {
        let (_d, _p, mut lines) = log_of(5);
        lines[2] = lines[2].replace("\"i\":2", "\"i\":7");
        let r = verify_bytes(&join(&lines));
        assert_eq!(r.first_bad.map(|b| b.0), Some(3));
    }

    #[test]
    fn a_removed_line_is_caught() {
        let (_d, _p, mut lines) = log_of(5);
        lines.remove(1);
        assert_eq!(verify_bytes(&join(&lines)).first_bad.map(|b| b.0), Some(2));
        let (_d, _p, mut lines) = log_of(3);
        lines.remove(0);
        assert_eq!(verify_bytes(&join(&lines)).first_bad.map(|b| b.0), Some(1));
    }

    #[test]
    fn swapped_lines_are_caught() {
        let (_d, _p, mut lines) = log_of(5);
        lines.swap(1, 2);
        assert_eq!(verify_bytes(&join(&lines)).first_bad.map(|b| b.0), Some(2));
    }

    #[test]
    fn an_inserted_line_is_caught() {
        let (_d, _p, mut lines) = log_of(5);
        // A well-formed event with a correct own hash, chained to line 2.
        let mut forged: Map<String, Value> = serde_json::from_str(&lines[1]).expect("json");
        forged.insert("event".into(), "approval.granted".into());
        let prev =
            serde_json::from_str::<Map<String, Value>>(&lines[1]).expect("json")["hash"].clone();
        forged.insert("prev".into(), prev);
        forged.remove("hash");
        let (line, _) = crate::audit::event_line(&forged);
        lines.insert(2, line.trim_end().to_string());
        assert_eq!(verify_bytes(&join(&lines)).first_bad.map(|b| b.0), Some(4));
        let (_d, _p, mut lines) = log_of(3);
        lines.insert(1, "garbage".into());
        assert_eq!(verify_bytes(&join(&lines)).first_bad.map(|b| b.0), Some(2));
    }

    fn head_of(path: &Path) -> crate::audit::Head {
        crate::audit::read_head(path)
            .expect("head readable")
            .expect("head written")
    }

    #[test]
    fn the_writer_records_the_head_and_a_clean_log_reaches_it() {
        let (_d, path, lines) = log_of(4);
        let head = head_of(&path);
        let last: Map<String, Value> = serde_json::from_str(&lines[3]).expect("json");
        assert_eq!(Some(head.hash.as_str()), last["hash"].as_str());
        assert_eq!(head.bytes, std::fs::metadata(&path).expect("stat").len());
        let r = verify_file(&path, &[], HeadRule::Required).expect("verify");
        assert!(r.ok() && r.warnings.is_empty(), "{r:?}");
        assert_eq!(r.head, Some(head.hash));
    }

    #[test]
    fn events_removed_from_the_end_are_caught_through_the_head() {
        let (_d, path, lines) = log_of(5);
        // The chain alone cannot see it...
        std::fs::write(&path, join(&lines[..3])).expect("cut");
        assert!(verify_bytes(&std::fs::read(&path).expect("read")).ok());
        // ...the head can.
        let r = verify_file(&path, &[], HeadRule::Required).expect("verify");
        let (line, why) = r.first_bad.expect("caught");
        assert_eq!(line, 4);
        assert!(why.contains("events were removed from the end"), "{why}");
    }

    #[test]
    fn a_head_that_is_a_symlink_is_not_trusted() {
        // Events cut from the end, and the head replaced by a symlink to a
        // record (kept anywhere the attacker can write) that matches the
        // cut log: read through the link, it would pass.
        let (d, path, lines) = log_of(5);
        std::fs::write(&path, join(&lines[..3])).expect("cut");
        let last: Map<String, Value> = serde_json::from_str(&lines[2]).expect("json");
        let forged = crate::audit::Head {
            hash: last["hash"].as_str().expect("hash").to_string(),
            bytes: std::fs::metadata(&path).expect("stat").len(),
        };
        let elsewhere = d.path().join("elsewhere");
        std::fs::write(&elsewhere, crate::audit::head_record(&forged)).expect("write");
        let head = crate::audit::head_path(&path);
        std::fs::remove_file(&head).expect("rm head");
        std::os::unix::fs::symlink(&elsewhere, &head).expect("symlink");
        let r = verify_file(&path, &[], HeadRule::Required).expect("verify");
        assert!(r.head_damaged());
        let (_, why) = r.first_bad.expect("a symlinked head passed");
        assert!(why.contains("not a regular file"), "{why}");
        // With --no-head, the chain alone, and the head's state said.
        let r = verify_file(&path, &[], HeadRule::Optional).expect("verify");
        assert!(
            r.ok() && r.warnings.iter().any(|w| w.contains("is damaged")),
            "{r:?}"
        );
        // A directory or a FIFO at the name: the same, and never waited on.
        std::fs::remove_file(&head).expect("rm link");
        std::fs::create_dir(&head).expect("mkdir");
        let r = verify_file(&path, &[], HeadRule::Required).expect("verify");
        assert!(r.head_damaged() && !r.ok(), "{r:?}");
        std::fs::remove_dir(&head).expect("rmdir");
        nix::unistd::mkfifo(&head, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let r = verify_file(&path, &[], HeadRule::Required).expect("verify");
        assert!(r.head_damaged() && !r.ok(), "{r:?}");
        // The same record as a regular file is what the chain is checked
        // against, and this one matches: whoever can write the head's
        // directory can forge it (only a checkpoint kept elsewhere catches
        // that); the symlink is refused because no writer leaves one.
        std::fs::remove_file(&head).expect("rm fifo");
        std::fs::copy(&elsewhere, &head).expect("copy");
        assert!(
            verify_file(&path, &[], HeadRule::Required)
                .expect("verify")
                .ok()
        );
    }

    #[test]
    fn a_damaged_head_is_said_whatever_else_fails_and_a_removed_log_is_caught() {
        // The chain broken in the middle and the head damaged: the chain's
        // line fails the log, and the head is said too.
        let (_d, path, mut lines) = log_of(4);
        lines[1] = lines[1].replace("req-1", "req-X");
        std::fs::write(&path, join(&lines)).expect("edit");
        let head = crate::audit::head_path(&path);
        std::fs::write(&head, b"garbage").expect("damage");
        let r = verify_file(&path, &[], HeadRule::Required).expect("verify");
        assert_eq!(r.first_bad.as_ref().map(|b| b.0), Some(2), "{r:?}");
        assert!(r.head_damaged(), "{r:?}");
        assert!(r.warnings.iter().any(|w| w.contains("is damaged")), "{r:?}");
        // An empty log with a damaged head (no writer leaves one): fails.
        std::fs::write(&path, b"").expect("empty");
        let r = verify_file(&path, &[], HeadRule::Required).expect("verify");
        assert!(!r.ok() && r.head_problem().is_some(), "{r:?}");
        // The log removed whole, its head left: removal from the end.
        let (_d, path, _) = log_of(3);
        std::fs::remove_file(&path).expect("rm log");
        let r = verify_file(&path, &[], HeadRule::Required).expect("verify");
        let (_, why) = r.first_bad.expect("a removed log passed");
        assert!(why.contains("removed from the end"), "{why}");
        // The same with the head damaged, even with --no-head.
        std::fs::write(crate::audit::head_path(&path), b"garbage").expect("damage");
        for rule in [HeadRule::Required, HeadRule::Optional] {
            let r = verify_file(&path, &[], rule).expect("verify");
            let (_, why) = r.first_bad.expect("a removed log passed");
            assert!(why.contains("every event was removed"), "{why}");
        }
        // No log and no head: nothing was ever written; an error to say so.
        std::fs::remove_file(crate::audit::head_path(&path)).expect("rm head");
        assert!(verify_file(&path, &[], HeadRule::Required).is_err());
    }

    #[test]
    fn a_rewritten_end_is_caught_through_the_head() {
        let (_d, path, lines) = log_of(5);
        let head = head_of(&path);
        // Drop the last two events and chain a different one, padded to the
        // same length so the sizes do not give it away.
        std::fs::write(&path, join(&lines[..3])).expect("cut");
        std::fs::remove_file(crate::audit::head_path(&path)).expect("rm head");
        let log = AuditLog::open(&path).expect("open");
        let len = std::fs::metadata(&path).expect("stat").len();
        let pad = "x".repeat(
            usize::try_from(head.bytes - len)
                .unwrap_or(0)
                .saturating_sub(200),
        );
        log.append("req-x", "tool.request", json!({"pad": pad}))
            .expect("append");
        let r = verify_against(&std::fs::read(&path).expect("read"), Some(&head), &[]);
        let (_, why) = r.first_bad.expect("caught");
        assert!(why.contains("is not in the log"), "{why}");
    }

    #[test]
    fn a_head_behind_the_end_is_fine_and_a_missing_head_is_a_warning() {
        let (_d, path, _) = log_of(3);
        let behind = head_of(&path);
        let log = AuditLog::open(&path).expect("open");
        log.append("req-9", "tool.result", json!({}))
            .expect("append");
        // A crash between the append and the head's update leaves it behind.
        let r = verify_against(&std::fs::read(&path).expect("read"), Some(&behind), &[]);
        assert!(r.ok(), "{r:?}");
        assert_eq!(r.verified, 4);
        // A missing head, and a damaged one, fail the log (never a pass);
        // with --no-head, the chain alone, and the head's state said.
        let fails_then_warns = |said: &str, damaged: bool| {
            let r = verify_file(&path, &[], HeadRule::Required).expect("verify");
            assert_eq!(r.head_damaged(), damaged, "{r:?}");
            let (_, why) = r.first_bad.expect("the head's state passed");
            assert!(why.contains(said) && why.contains("--no-head"), "{why}");
            let r = verify_file(&path, &[], HeadRule::Optional).expect("verify");
            assert!(r.ok(), "{r:?}");
            assert!(r.warnings[0].contains(said), "{:?}", r.warnings);
        };
        std::fs::remove_file(crate::audit::head_path(&path)).expect("rm head");
        fails_then_warns("no head file", false);
        std::fs::write(crate::audit::head_path(&path), b"{\"hash\":").expect("damage");
        fails_then_warns("is damaged", true);
    }

    #[test]
    fn verifying_while_a_writer_appends_never_fails() {
        let (_d, path, _) = log_of(1);
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (path, done) = (path.clone(), std::sync::Arc::clone(&done));
            std::thread::spawn(move || {
                let log = AuditLog::open(&path).expect("open");
                for n in 0..600 {
                    log.append("req-w", "tool.request", json!({"n": n}))
                        .expect("append");
                }
                done.store(true, std::sync::atomic::Ordering::Relaxed);
            })
        };
        let mut checked = 0;
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            let r = verify_file(&path, &[], HeadRule::Required).expect("verify");
            assert!(r.ok(), "a concurrent append made verify fail: {r:?}");
            checked += 1;
        }
        writer.join().expect("writer");
        assert!(
            checked > 10,
            "verify ran while the writer wrote ({checked})"
        );
    }

    #[test]
    fn checkpoints_must_be_on_the_chain() {
        let (_d, path, lines) = log_of(4);
        let second: Map<String, Value> = serde_json::from_str(&lines[1]).expect("json");
        let cp = second["hash"].as_str().expect("hash").to_ascii_uppercase();
        let r = verify_file(&path, std::slice::from_ref(&cp), HeadRule::Required).expect("verify");
        assert!(r.ok(), "{r:?}");
        let r = verify_file(&path, &["ab".repeat(32)], HeadRule::Required).expect("verify");
        let (_, why) = r.first_bad.expect("unknown checkpoint");
        assert!(why.contains("is not on the chain"), "{why}");
        // A log rebuilt from scratch (new chain, new head) fails the checkpoint.
        std::fs::remove_file(&path).expect("rm");
        std::fs::remove_file(crate::audit::head_path(&path)).expect("rm head");
        let log = AuditLog::open(&path).expect("open");
        log.append("req-0", "tool.request", json!({}))
            .expect("append");
        let r = verify_file(&path, &[cp], HeadRule::Required).expect("verify");
        assert!(!r.ok(), "{r:?}");
    }

    #[test]
    fn a_last_line_cut_short_is_a_warning_not_a_failure() {
        let (_d, _p, lines) = log_of(3);
        let mut bytes = join(&lines);
        bytes.extend_from_slice(b"{\"ts\":\"2026-11-29T1");
        let r = verify_bytes(&bytes);
        assert!(r.ok(), "{r:?}");
        assert_eq!(r.verified, 3);
        assert!(
            r.warnings[0].contains("line 4: cut short"),
            "{:?}",
            r.warnings
        );
    }

    #[test]
    fn a_duplicated_key_is_refused_even_with_a_matching_hash() {
        let (_d, _p, mut lines) = log_of(3);
        // A reader keeping the first `event` sees "approval.granted"; the
        // hash (over the parsed event, which keeps the last) still matches.
        lines[1] = lines[1].replacen("{", "{\"event\":\"approval.granted\",", 1);
        let parsed: Map<String, Value> = serde_json::from_str(&lines[1]).expect("json");
        assert_eq!(event_hash(&parsed), parsed["hash"].as_str().expect("hash"));
        let (line, why) = verify_bytes(&join(&lines)).first_bad.expect("refused");
        assert_eq!(line, 2);
        assert!(why.contains("duplicate key \"event\""), "{why}");
        // Nested too.
        let (_d, _p, mut lines) = log_of(3);
        lines[2] = lines[2].replacen("\"data\":{", "\"data\":{\"tool\":\"x\",", 1);
        let (line, why) = verify_bytes(&join(&lines)).first_bad.expect("refused");
        assert_eq!(
            (line, why.contains("duplicate key \"tool\"")),
            (3, true),
            "{why}"
        );
    }

    #[test]
    fn a_line_not_byte_for_byte_as_written_is_refused() {
        for edit in [
            |l: &str| l.replacen(":", ": ", 1), // spacing
            |l: &str| l.replacen("\"tool\":\"t\"", "\"tool\":\"\\u0074\"", 1), // escapes
            |l: &str| format!("{l} "),          // trailing space
        ] {
            let (_d, _p, mut lines) = log_of(3);
            lines[1] = edit(&lines[1]);
            let r = verify_bytes(&join(&lines));
            let (line, why) = r.first_bad.expect("refused");
            assert_eq!(line, 2, "{why}");
            assert!(why.contains("byte for byte"), "{why}");
        }
        // Keys reordered (parsed, the same event).
        let (_d, _p, mut lines) = log_of(3);
        let m: Map<String, Value> = serde_json::from_str(&lines[1]).expect("json");
        let mut rev = Map::new();
        for (k, v) in m.iter().rev() {
            rev.insert(k.clone(), v.clone());
        }
        lines[1] = serde_json::to_string(&rev).expect("json");
        let (line, _) = verify_bytes(&join(&lines)).first_bad.expect("refused");
        assert_eq!(line, 2);
    }

    #[test]
    fn lines_of_the_earlier_format_verify_only_before_the_current_one() {
        // The earlier writer: keys in insertion order, hash over the parsed event.
        fn legacy(prev: &str, i: usize) -> (String, String) {
            let mut m = Map::new();
            m.insert("ts".into(), "2026-11-01T00:00:00.000Z".into());
            m.insert("request_id".into(), format!("r{i}").into());
            m.insert("event".into(), "tool.request".into());
            m.insert("data".into(), json!({"tool": "t", "i": i}));
            m.insert("prev".into(), prev.into());
            let h = event_hash(&m);
            m.insert("hash".into(), h.clone().into());
            (serde_json::to_string(&m).expect("json"), h)
        }
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("a.jsonl");
        let (a, ha) = legacy(GENESIS, 0);
        let (b, hb) = legacy(&ha, 1);
        std::fs::write(&path, format!("{a}\n{b}\n")).expect("write");
        let log = AuditLog::open(&path).expect("open");
        let c = log.append("r2", "tool.result", json!({})).expect("append");
        let r = verify_file(&path, &[], HeadRule::Optional).expect("verify");
        assert!(r.ok(), "{r:?}");
        assert_eq!(r.verified, 4, "2 legacy, head_lost, 1 current: {r:?}");
        assert!(
            r.warnings.iter().any(|w| w.contains("earlier line format")),
            "{r:?}"
        );
        // An earlier-format line after a current one is refused.
        let (d, _) = legacy(c["hash"].as_str().expect("hash"), 3);
        let mut bytes = std::fs::read(&path).expect("read");
        bytes.extend_from_slice(format!("{d}\n").as_bytes());
        let (line, why) = verify_bytes(&bytes).first_bad.expect("refused");
        assert_eq!(line, 5, "{why}");
        let _ = hb;
    }

    #[test]
    fn a_head_removed_after_a_cut_is_not_silently_replaced() {
        let (_d, path, lines) = log_of(5);
        std::fs::write(&path, join(&lines[..3])).expect("cut");
        std::fs::remove_file(crate::audit::head_path(&path)).expect("rm head");
        // The next writer writes a head again, but says it found none.
        let log = AuditLog::open(&path).expect("open");
        log.append("req-n", "tool.request", json!({}))
            .expect("append");
        let events = crate::audit::read_events(&path).expect("read");
        assert_eq!(events[3]["event"], "audit.head_lost");
        let r = verify_file(&path, &[], HeadRule::Required).expect("verify");
        let (line, why) = r.first_bad.expect("fails");
        assert_eq!(line, 4);
        assert!(why.contains("head file missing"), "{why}");
        let r = verify_file(&path, &[], HeadRule::Optional).expect("verify");
        assert!(
            r.ok() && r.warnings.iter().any(|w| w.contains("head file missing")),
            "{r:?}"
        );
    }

    #[test]
    fn a_cut_end_with_its_head_kept_is_not_healed_by_the_next_writer() {
        let (_d, path, lines) = log_of(5);
        // Cut at a line boundary; the head (5 events) stays.
        std::fs::write(&path, join(&lines[..3])).expect("cut");
        let log = AuditLog::open(&path).expect("open");
        log.append("req-n", "tool.request", json!({}))
            .expect("append");
        let events = crate::audit::read_events(&path).expect("read");
        assert_eq!(events[3]["event"], "audit.head_lost", "{events:?}");
        assert!(
            events[3]["data"]["head"]["bytes"].is_u64(),
            "{:?}",
            events[3]
        );
        let r = verify_file(&path, &[], HeadRule::Required).expect("verify");
        assert_eq!(r.first_bad.map(|b| b.0), Some(4), "{:?}", r.warnings);
        // The log removed, its head kept: the same.
        let (_d, path, _) = log_of(3);
        std::fs::remove_file(&path).expect("rm");
        let log = AuditLog::open(&path).expect("open");
        log.append("req-n", "tool.request", json!({}))
            .expect("append");
        let events = crate::audit::read_events(&path).expect("read");
        assert_eq!(events[0]["event"], "audit.head_lost");
        assert!(
            !verify_file(&path, &[], HeadRule::Required)
                .expect("verify")
                .ok()
        );
        // A damaged head too.
        let (_d, path, _) = log_of(2);
        std::fs::write(crate::audit::head_path(&path), b"{\"hash\":").expect("damage");
        let log = AuditLog::open(&path).expect("open");
        log.append("req-n", "tool.request", json!({}))
            .expect("append");
        let events = crate::audit::read_events(&path).expect("read");
        assert!(
            events[2]["data"]["head"]["damaged"].is_string(),
            "{:?}",
            events[2]
        );
        // Writers taking turns (another process appending) raise nothing.
        let (_d, path, _) = log_of(2);
        let one = AuditLog::open(&path).expect("open");
        let two = AuditLog::open(&path).expect("open");
        for i in 0..4 {
            let w = if i % 2 == 0 { &one } else { &two };
            w.append("req-t", "tool.request", json!({"i": i}))
                .expect("append");
        }
        let r = verify_file(&path, &[], HeadRule::Required).expect("verify");
        assert!(r.ok() && r.head_lost_at.is_none(), "{r:?}");
    }

    #[test]
    fn lines_inserted_before_a_recovered_cut_are_refused() {
        let (_d, path, _) = log_of(2);
        let mut bytes = std::fs::read(&path).expect("read");
        bytes.extend_from_slice(b"{\"event\":\"approval.granted\",\"hash\":5}\n");
        bytes.extend_from_slice(b"{\"ts\":\"2026");
        std::fs::write(&path, &bytes).expect("write");
        // The next writer ends the cut line and records its recovery.
        let log = AuditLog::open(&path).expect("open");
        log.append("req-n", "tool.request", json!({}))
            .expect("append");
        let r = verify_file(&path, &[], HeadRule::Optional).expect("verify");
        let (line, why) = r.first_bad.expect("refused");
        assert_eq!(line, 3, "{why}");
        assert!(why.contains("not an audit event"), "{why}");
    }

    #[test]
    fn a_last_line_whole_but_for_its_newline_is_ended_not_recovered() {
        let (_d, path, lines) = log_of(3);
        let bytes = std::fs::read(&path).expect("read");
        std::fs::write(&path, &bytes[..bytes.len() - 1]).expect("drop the newline");
        // The short write failed the append, so the head is the one before.
        let second: Map<String, Value> = serde_json::from_str(&lines[1]).expect("json");
        let behind = crate::audit::Head {
            hash: second["hash"].as_str().expect("hash").into(),
            bytes: (lines[0].len() + lines[1].len() + 2) as u64,
        };
        crate::audit::write_head(&path, &behind).expect("head");
        let log = AuditLog::open(&path).expect("open");
        log.append("req-n", "tool.request", json!({}))
            .expect("append");
        let events = crate::audit::read_events(&path).expect("read");
        let names: Vec<_> = events.iter().map(|e| e["event"].clone()).collect();
        assert!(!names.contains(&json!("audit.recovered")), "{names:?}");
        let r = verify_file(&path, &[], HeadRule::Required).expect("verify");
        assert!(r.ok() && r.warnings.is_empty(), "{r:?}");
        assert_eq!(r.verified, 4);
    }
}
