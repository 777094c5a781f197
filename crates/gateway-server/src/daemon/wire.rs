//! What travels on the daemon's socket before MCP: one JSON line from the
//! caller (its [`Hello`]), one JSON line back. For `mcp`, the back line is
//! an [`Ack`] and the connection then carries MCP (newline-delimited
//! JSON-RPC, as on stdio) until either side closes it. For `control`, the
//! back line is the command's [`Reply`] and the daemon closes.
//!
//! Nothing in a hello is an identity: who is calling comes from the
//! kernel (`SO_PEERCRED`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

/// The longest hello or reply line read (a longer one is refused).
pub const MAX_HELLO: u64 = 64 * 1024;
/// The longest control reply the CLI reads (audit output can be long).
pub const MAX_REPLY: u64 = 256 * 1024 * 1024;

/// The caller's first line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "gateway", rename_all = "snake_case", deny_unknown_fields)]
pub enum Hello {
    /// An MCP session whose `working_dir`s resolve in `workspace` (an
    /// absolute path the caller owns).
    Mcp { workspace: PathBuf },
    /// One operator command (`approve ID --reason ...`), as argv without
    /// the program name.
    Control { argv: Vec<String> },
}

impl Hello {
    /// Whether the caller waits for a control [`Reply`] (else an [`Ack`]).
    pub fn is_control(&self) -> bool {
        matches!(self, Hello::Control { .. })
    }
}

/// The daemon's answer to an `mcp` hello.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ack {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A control command's outcome: what the CLI prints, and its exit code.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    pub code: u8,
    pub stdout: String,
    pub stderr: String,
}

impl Reply {
    /// A refusal before the command ran.
    pub fn refused(why: impl std::fmt::Display) -> Reply {
        Reply {
            code: 2,
            stdout: String::new(),
            stderr: format!("gateway: refused: {why}\n"),
        }
    }
}

/// Read one line of at most `max` bytes (without its newline); `None` at a
/// clean end of stream.
pub async fn read_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    max: u64,
) -> std::io::Result<Option<String>> {
    let mut buf = Vec::new();
    let n = r.take(max + 1).read_until(b'\n', &mut buf).await?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            if n as u64 > max {
                format!("line longer than {max} bytes")
            } else {
                "the line ended without a newline".into()
            },
        ));
    }
    buf.pop();
    String::from_utf8(buf)
        .map(Some)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8"))
}

/// `v` as one JSON line.
/// The operator command that asks the daemon for approval `id`'s statement
/// to sign (`gateway approvals statement`), as the CLI and the approval
/// page send it: every value as `--flag=value`, never read as a flag.
pub fn statement_argv(id: &str, verdict: &str, reason: &str, valid_for: u64) -> Vec<String> {
    vec![
        "approvals".into(),
        "statement".into(),
        id.into(),
        format!("--verdict={verdict}"),
        format!("--reason={reason}"),
        format!("--valid-for={valid_for}"),
    ]
}

pub fn line<T: Serialize>(v: &T) -> Vec<u8> {
    let mut out = serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec());
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hellos_round_trip_and_unknown_fields_are_refused() {
        let h = Hello::Mcp {
            workspace: "/home/a/repo".into(),
        };
        let text = String::from_utf8(line(&h)).expect("utf8");
        assert_eq!(
            text,
            "{\"gateway\":\"mcp\",\"workspace\":\"/home/a/repo\"}\n"
        );
        assert_eq!(
            serde_json::from_str::<Hello>(text.trim()).expect("parse"),
            h
        );
        for bad in [
            r#"{"gateway":"mcp","workspace":"/x","uid":0}"#,
            r#"{"gateway":"admin"}"#,
            r#"{"workspace":"/x"}"#,
        ] {
            assert!(serde_json::from_str::<Hello>(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn lines_are_capped() {
        let mut r = tokio::io::BufReader::new(&b"0123456789\nrest"[..]);
        assert_eq!(
            read_line(&mut r, 10).await.expect("line").as_deref(),
            Some("0123456789")
        );
        let e = read_line(&mut r, 10).await.expect_err("no newline");
        assert!(e.to_string().contains("without a newline"), "{e}");
        let mut r = tokio::io::BufReader::new(&b"0123456789ab\n"[..]);
        let e = read_line(&mut r, 10).await.expect_err("too long");
        assert!(e.to_string().contains("longer than 10"), "{e}");
        let mut r = tokio::io::BufReader::new(&b""[..]);
        assert_eq!(read_line(&mut r, 10).await.expect("eof"), None);
    }
}
