//! `gateway audit verify`: check the hash chain line by line.
//!
//! A line whose `hash` does not match its content was edited; a line whose
//! `prev` is not the previous line's `hash` means a line was removed,
//! reordered or inserted before it. The first such line is reported and the
//! log fails verification. A last line cut short (a crash while writing) is
//! reported but does not fail the lines before it; a cut line that a later
//! writer ended and recorded with an `audit.recovered` event is accepted.

use std::path::Path;

use serde::Serialize;
use serde_json::{Map, Value};

use super::{GENESIS, event_hash};
use crate::canonical::sha256_hex;

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Events whose hash and chain check out.
    pub verified: usize,
    /// The first line that breaks the log, with why (1-based line number).
    pub first_bad: Option<(usize, String)>,
    /// Things reported that do not fail the log (a crash-cut line).
    pub warnings: Vec<String>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.first_bad.is_none()
    }
}

pub fn verify_file(path: &Path) -> std::io::Result<Report> {
    let bytes = std::fs::read(path)?;
    Ok(verify_bytes(&bytes))
}

pub fn verify_bytes(bytes: &[u8]) -> Report {
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
        first_bad: None,
        warnings: vec![],
    };
    let mut prev = GENESIS.to_string();
    let mut pending_cut: Option<(usize, String)> = None;
    for (i, raw) in lines.iter().enumerate() {
        let n = i + 1;
        let parsed = serde_json::from_slice::<Map<String, Value>>(raw).ok();
        let Some(event) = parsed.filter(|e| e.get("hash").and_then(Value::as_str).is_some()) else {
            // Only acceptable if the next line records the recovery.
            pending_cut = Some((n, sha256_hex(raw)));
            continue;
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
        prev = hash.to_string();
        report.verified += 1;
    }
    if let Some((cut_line, _)) = pending_cut {
        report.first_bad = Some((cut_line, "not an audit event (edited or inserted)".into()));
        return report;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::AuditLog;
    use serde_json::json;

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
        let r = verify_file(&path).expect("read");
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
        let h = event_hash(&forged);
        forged.insert("hash".into(), h.into());
        lines.insert(2, serde_json::to_string(&forged).expect("json"));
        assert_eq!(verify_bytes(&join(&lines)).first_bad.map(|b| b.0), Some(4));
        let (_d, _p, mut lines) = log_of(3);
        lines.insert(1, "garbage".into());
        assert_eq!(verify_bytes(&join(&lines)).first_bad.map(|b| b.0), Some(2));
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
}
