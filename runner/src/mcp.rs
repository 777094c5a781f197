//! An MCP client over a stdio server's pipes, inside the sandbox: the
//! step of an upstream MCP server's call ([`protocol::McpExchange`]).
//!
//! The server is started as the step's command and spoken to with
//! newline-delimited JSON-RPC (the MCP stdio transport): `initialize`,
//! `notifications/initialized`, `tools/list` (every page), then, for a
//! call, `tools/call`, but only when the tool's live definition is exactly
//! the one pinned by the operator's lock. The server is hostile: what it
//! writes is capped in bytes ([`protocol::McpExchange::max_bytes`], all
//! messages together) and in time; a request it makes of the client
//! (sampling, elicitation, roots) is refused, `ping` answered; its
//! notifications are counted (progress kept). The report
//! ([`protocol::McpReport`]) is one line of JSON on stdout; the gateway
//! reads it as hostile input too.

use std::io::{BufRead, BufReader, Read, Write};

use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, sync_channel};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::protocol::{McpCall, McpExchange, McpReport, ServeLine, ServeRequest};

/// The MCP revision the client speaks.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// Pages of `tools/list` read at most.
const MAX_PAGES: usize = 32;
/// Server requests whose method the report names (the count is whole).
const NAMED_REQUESTS: usize = 16;

/// What the reader thread hands over.
enum Read1 {
    Message(Value),
    /// A line that is not a JSON object.
    Garbage,
    /// Over the byte cap: the server is stopped.
    TooLarge,
    Closed,
}

/// Reads the server's stdout, one message per line: no line longer than
/// `line_cap` is held, and each line is charged to `budget` (bytes left,
/// shared with the session, which gives each call its own) once read, so
/// a budget set while the reader waits applies to the next line.
fn reader(
    stdout: impl Read + Send + 'static,
    line_cap: u64,
    budget: Arc<AtomicU64>,
) -> Receiver<Read1> {
    let (tx, rx) = sync_channel(64);
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut line = Vec::new();
        loop {
            line.clear();
            let got = (&mut r)
                .take(line_cap.saturating_add(1))
                .read_until(b'\n', &mut line);
            let n = match got {
                Ok(0) | Err(_) => {
                    let _ = tx.send(Read1::Closed);
                    return;
                }
                Ok(n) => n as u64,
            };
            let charged =
                budget.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| b.checked_sub(n));
            if n > line_cap || charged.is_err() {
                let _ = tx.send(Read1::TooLarge);
                return;
            }
            let text = line.trim_ascii();
            if text.is_empty() {
                continue;
            }
            let msg = match serde_json::from_slice::<Value>(text) {
                Ok(v) if v.is_object() => Read1::Message(v),
                _ => Read1::Garbage,
            };
            if tx.send(msg).is_err() {
                return;
            }
        }
    });
    rx
}

/// Writes to the server's stdin on a thread of its own: a server that
/// never reads its stdin cannot hold the exchange past its deadline.
fn writer(mut stdin: impl Write + Send + 'static) -> std::sync::mpsc::SyncSender<Vec<u8>> {
    let (tx, rx) = sync_channel::<Vec<u8>>(64);
    std::thread::spawn(move || {
        for line in rx {
            if stdin.write_all(&line).and_then(|()| stdin.flush()).is_err() {
                return;
            }
        }
    });
    tx
}

/// One exchange's state: the server's pipes and what the report says.
struct Session<'a> {
    stdin: std::sync::mpsc::SyncSender<Vec<u8>>,
    from: Receiver<Read1>,
    /// Bytes the server may still write (the reader's).
    budget: Arc<AtomicU64>,
    deadline: Instant,
    next_id: u64,
    report: McpReport,
    /// Told of each progress notification's params, as it comes.
    on_progress: &'a dyn Fn(&Value),
}

/// Why a request got no answer.
enum Failed {
    /// Written into the report as `error_kind`/`error`.
    Stop(&'static str, String),
}

impl Session<'_> {
    fn send(&mut self, msg: &Value) -> Result<(), Failed> {
        let mut line = serde_json::to_vec(msg).unwrap_or_default();
        line.push(b'\n');
        // A full queue: the server has stopped reading what it is sent.
        self.stdin.try_send(line).map_err(|e| {
            Failed::Stop(
                "closed",
                format!("the server does not take what it is sent: {e}"),
            )
        })
    }

    /// Send `method` and wait for its answer, dealing with what comes
    /// before it.
    fn request(&mut self, method: &str, params: Value) -> Result<Value, Failed> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            let msg = match self.from.recv_timeout(left) {
                Ok(Read1::Message(m)) => m,
                Ok(Read1::Garbage) => {
                    self.report.garbage_lines += 1;
                    continue;
                }
                Ok(Read1::TooLarge) => {
                    return Err(Failed::Stop(
                        "too_large",
                        format!(
                            "the server wrote more than {} bytes; it was stopped",
                            self.report.max_bytes
                        ),
                    ));
                }
                Ok(Read1::Closed) | Err(RecvTimeoutError::Disconnected) => {
                    return Err(Failed::Stop(
                        "closed",
                        format!("the server ended before it answered {method}"),
                    ));
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(Failed::Stop(
                        "timeout",
                        format!(
                            "the server did not answer {method} within the call's {} ms; it was stopped",
                            self.report.timeout_ms
                        ),
                    ));
                }
            };
            let has_method = msg
                .get("method")
                .and_then(Value::as_str)
                .map(str::to_string);
            match (has_method, msg.get("id")) {
                // A request of the server's.
                (Some(m), Some(rid)) => {
                    let rid = rid.clone();
                    if m == "ping" {
                        self.send(&json!({"jsonrpc": "2.0", "id": rid, "result": {}}))?;
                        continue;
                    }
                    self.report.requests_refused += 1;
                    if self.report.refused_methods.len() < NAMED_REQUESTS {
                        self.report
                            .refused_methods
                            .push(m.chars().take(64).collect());
                    }
                    self.send(&json!({"jsonrpc": "2.0", "id": rid, "error": {
                        "code": -32601,
                        "message": "refused by the gateway: this client offers no sampling, elicitation or roots"}}))?;
                }
                // A notification.
                (Some(m), None) => {
                    self.report.notifications += 1;
                    match m.as_str() {
                        // Params that are an object, as MCP says (`null`
                        // would read back as no progress at all).
                        "notifications/progress" => {
                            self.report.progress =
                                msg.get("params").filter(|p| p.is_object()).cloned();
                            if let Some(p) = &self.report.progress {
                                (self.on_progress)(p);
                            }
                        }
                        "notifications/tools/list_changed" => self.report.list_changed = true,
                        _ => {}
                    }
                }
                // An answer: ours, or one to nothing we asked.
                (None, Some(rid)) if rid.as_u64() == Some(id) => {
                    if let Some(e) = msg.get("error") {
                        return Err(Failed::Stop(
                            "rpc_error",
                            format!("{method}: {}", short(&e["message"])),
                        ));
                    }
                    // Every result this client asks for (initialize,
                    // tools/list, tools/call) is an object; an answer
                    // without one is no answer (and `null` would read back
                    // as no result at all).
                    return match msg.get("result") {
                        Some(r) if r.is_object() => Ok(r.clone()),
                        _ => Err(Failed::Stop(
                            "protocol",
                            format!("the server's answer to {method} has no result object"),
                        )),
                    };
                }
                _ => self.report.garbage_lines += 1,
            }
        }
    }

    /// `tools/list`, every page.
    fn list_tools(&mut self) -> Result<Vec<Value>, Failed> {
        let mut tools = Vec::new();
        let mut cursor: Option<Value> = None;
        for _ in 0..MAX_PAGES {
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            let page = self.request("tools/list", params)?;
            tools.extend(page["tools"].as_array().cloned().unwrap_or_default());
            match page.get("nextCursor") {
                Some(c) if c.is_string() => cursor = Some(c.clone()),
                _ => return Ok(tools),
            }
        }
        Err(Failed::Stop(
            "protocol",
            format!("tools/list has more than {MAX_PAGES} pages"),
        ))
    }
}

/// A server's error message, short and as text.
fn short(v: &Value) -> String {
    let s = match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    s.chars().take(500).collect()
}

impl<'a> Session<'a> {
    /// A session over a started server's pipes (`None`: they are missing).
    fn over(child: &mut Child, max_bytes: u64, on_progress: &'a dyn Fn(&Value)) -> Option<Self> {
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return None;
        };
        Some(Session::on(stdin, stdout, max_bytes, on_progress))
    }

    /// A session over a server's input and output.
    fn on(
        stdin: impl Write + Send + 'static,
        stdout: impl Read + Send + 'static,
        max_bytes: u64,
        on_progress: &'a dyn Fn(&Value),
    ) -> Self {
        let budget = Arc::new(AtomicU64::new(max_bytes));
        Session {
            stdin: writer(stdin),
            from: reader(stdout, max_bytes, Arc::clone(&budget)),
            budget,
            deadline: Instant::now(),
            next_id: 0,
            report: McpReport::default(),
            on_progress,
        }
    }

    /// A fresh report, byte budget and deadline for the next exchange.
    fn begin(&mut self, max_bytes: u64, timeout_ms: u64) {
        self.report = McpReport {
            max_bytes,
            timeout_ms,
            server: self.report.server.take(),
            ..McpReport::default()
        };
        self.budget.store(max_bytes, Ordering::SeqCst);
        self.deadline = Instant::now() + Duration::from_millis(timeout_ms);
    }

    /// `initialize` and `notifications/initialized`.
    fn initialize(&mut self) -> Result<(), Failed> {
        let init = self.request(
            "initialize",
            json!({"protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                   "clientInfo": {"name": "gateway", "version": env!("CARGO_PKG_VERSION")}}),
        )?;
        self.report.server = Some(json!({
            "protocolVersion": init.get("protocolVersion").cloned().unwrap_or(Value::Null),
            "serverInfo": init.get("serverInfo").cloned().unwrap_or(Value::Null),
        }));
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
    }

    /// The tools listed, and `call` made only when the tool's live
    /// definition is exactly the locked one.
    fn call_checked(&mut self, call: &McpCall) -> Result<(), Failed> {
        let tools = self.list_tools()?;
        let live = tools
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some(call.name.as_str()))
            .cloned();
        match live {
            None => {
                self.report.refused = Some(format!(
                    "the server no longer offers tool {:?}; nothing was called",
                    call.name
                ));
            }
            Some(live) if live != call.definition => {
                self.report.live_definition = Some(live);
                self.report.refused = Some(format!(
                    "tool {:?}'s definition is not the one locked (it changed on the server); nothing was called",
                    call.name
                ));
            }
            Some(_) => {
                let mut params = json!({"name": call.name, "arguments": call.arguments});
                if let Some(token) = &call.progress_token {
                    params["_meta"] = json!({"progressToken": token});
                }
                self.report.result = Some(self.request("tools/call", params)?);
            }
        }
        Ok(())
    }

    /// What stopped an exchange, into its report.
    fn failed(&mut self, r: Result<(), Failed>) {
        if let Err(Failed::Stop(kind, why)) = r {
            self.report.error_kind = Some(kind.into());
            self.report.error = Some(why);
        }
    }
}

/// The report for a server whose pipes are missing.
fn no_pipes(max_bytes: u64, timeout_ms: u64) -> McpReport {
    McpReport {
        max_bytes,
        timeout_ms,
        error_kind: Some("closed".into()),
        error: Some("the server's pipes are missing".into()),
        ..McpReport::default()
    }
}

/// Run the exchange with a started server (`stdin`/`stdout` piped) and
/// return the report; the server is killed before returning.
pub fn exchange(child: &mut Child, ex: &McpExchange, on_progress: &dyn Fn(&Value)) -> McpReport {
    let Some(s) = Session::over(child, ex.max_bytes, on_progress) else {
        return no_pipes(ex.max_bytes, ex.timeout_ms);
    };
    let report = run_exchange(s, ex);
    let _ = child.kill();
    let _ = child.wait();
    report
}

/// The exchange with a server that reads `stdin` and writes `stdout`
/// (hostile: anything at all), as [`exchange`] makes it; for the fuzz
/// targets and tests, which play the server without a process.
pub fn exchange_over(
    stdin: impl Write + Send + 'static,
    stdout: impl Read + Send + 'static,
    ex: &McpExchange,
) -> McpReport {
    run_exchange(Session::on(stdin, stdout, ex.max_bytes, &|_| {}), ex)
}

fn run_exchange(mut s: Session, ex: &McpExchange) -> McpReport {
    s.begin(ex.max_bytes, ex.timeout_ms);
    let run = |s: &mut Session| -> Result<(), Failed> {
        s.initialize()?;
        match &ex.call {
            None => {
                s.report.tools = Some(s.list_tools()?);
                Ok(())
            }
            Some(call) => s.call_checked(call),
        }
    };
    let r = run(&mut s);
    s.failed(r);
    s.report
}

/// A warm server (`gateway-runner serve`): initialized once within `ex`'s
/// time, then one call per [`ServeRequest`] line read from `input`, each
/// with its own byte cap and time, its progress and then its report handed
/// to `emit` as they come. Ends when `input` ends or holds a line that is
/// not a request, or when a call ends in anything but the server's own
/// error answer (a server over its cap, late, gone or speaking garbage is
/// not trusted with another call); the server is killed before returning.
pub fn serve(
    child: &mut Child,
    ex: &McpExchange,
    input: &mut dyn BufRead,
    emit: &(dyn Fn(&ServeLine) + Sync),
) {
    let on_progress = |p: &Value| emit(&ServeLine::Progress(p.clone()));
    let Some(mut s) = Session::over(child, ex.max_bytes, &on_progress) else {
        emit(&ServeLine::Report(Box::new(no_pipes(
            ex.max_bytes,
            ex.timeout_ms,
        ))));
        return;
    };
    s.begin(ex.max_bytes, ex.timeout_ms);
    let init = s.initialize();
    let mut broken = init.is_err();
    s.failed(init);
    loop {
        let req = match read_request(input) {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(why) => {
                let report = McpReport {
                    error_kind: Some("protocol".into()),
                    error: Some(why),
                    ..McpReport::default()
                };
                emit(&ServeLine::Report(Box::new(report)));
                break;
            }
        };
        if broken {
            // The server never started well: the first call is told why.
            emit(&ServeLine::Report(Box::new(std::mem::take(&mut s.report))));
            break;
        }
        s.begin(req.max_bytes, req.timeout_ms);
        let r = s.call_checked(&req.call);
        broken = matches!(&r, Err(Failed::Stop(kind, _)) if *kind != "rpc_error");
        s.failed(r);
        let report = s.report.clone();
        emit(&ServeLine::Report(Box::new(report)));
        if broken {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The next [`ServeRequest`] line; `Ok(None)` at the end of the input.
fn read_request(input: &mut dyn BufRead) -> Result<Option<ServeRequest>, String> {
    let mut line = Vec::new();
    let max = crate::protocol::SERVE_REQUEST_MAX;
    input
        .take(u64::try_from(max).unwrap_or(u64::MAX) + 1)
        .read_until(b'\n', &mut line)
        .map_err(|e| format!("reading the call failed: {e}"))?;
    if line.is_empty() {
        return Ok(None);
    }
    if line.len() > max {
        return Err(format!("a call is longer than {max} bytes"));
    }
    serde_json::from_slice(&line)
        .map(Some)
        .map_err(|e| format!("a call does not read: {e}"))
}

/// The call's credential as `KEY = value` lines (the credential file a
/// sandbox gets at [`crate::protocol::CREDENTIAL_PATH`]); `None` when
/// there is no such file (a listing, which gets no credential).
pub fn credential_fields(
    path: &std::path::Path,
) -> Result<Option<std::collections::BTreeMap<String, String>>, String> {
    let text = match std::fs::read(path) {
        Ok(b) => String::from_utf8(b).map_err(|_| "the credential file is not text".to_string())?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read the credential file: {e}")),
    };
    let mut fields = std::collections::BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (k, v) = line
            .split_once('=')
            .ok_or("the credential file is not KEY = value lines")?;
        fields.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(Some(fields))
}

/// `template` with each `{{KEY}}` replaced by the credential's field
/// (`{{KEY:url}}`: percent-encoded for a URL), or by nothing when there
/// is no credential. A key the credential does not have is an error (a
/// server started with half its connection string would only fail
/// later, less clearly). The error names the key, never a value.
pub fn fill(
    template: &str,
    fields: Option<&std::collections::BTreeMap<String, String>>,
) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or_else(|| format!("an unclosed {{{{ in {template:?}"))?;
        let spec = after[..end].trim();
        let (key, url) = match spec.strip_suffix(":url") {
            Some(k) => (k, true),
            None => (spec, false),
        };
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(format!("{{{{{spec}}}}} is not a credential field"));
        }
        if let Some(fields) = fields {
            let value = fields
                .get(key)
                .ok_or_else(|| format!("the call's credential has no field {key:?}"))?;
            if url {
                for b in value.bytes() {
                    if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                        out.push(char::from(b));
                    } else {
                        out.push_str(&format!("%{b:02X}"));
                    }
                }
            } else {
                out.push_str(value);
            }
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The server's arguments and environment with the credential filled in
/// (see [`fill`]).
#[allow(clippy::type_complexity)]
pub fn filled(
    argv: &[String],
    use_: &crate::protocol::CredentialFill,
    fields: Option<&std::collections::BTreeMap<String, String>>,
) -> Result<(Vec<String>, Vec<(String, String)>), String> {
    let args = argv
        .iter()
        .map(|a| fill(a, fields))
        .collect::<Result<Vec<_>, _>>()?;
    let env = use_
        .env
        .iter()
        .map(|(k, v)| fill(v, fields).map(|v| (k.clone(), v)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((args, env))
}

#[cfg(test)]
mod fill_tests {
    use super::*;
    use crate::protocol::{McpCall, McpExchange, McpReport};

    /// An exchange with a server whose whole output is `lines`.
    fn against(lines: &str) -> McpReport {
        let ex = McpExchange {
            max_bytes: 65536,
            timeout_ms: 2000,
            call: Some(McpCall {
                name: "echo".into(),
                arguments: json!({"text": "hi"}),
                definition: json!({"name": "echo", "inputSchema": {"type": "object"}}),
                progress_token: None,
            }),
            credential: None,
        };
        exchange_over(
            std::io::sink(),
            std::io::Cursor::new(lines.as_bytes().to_vec()),
            &ex,
        )
    }

    // Found by the fuzz target mcp_server_output: an answer to tools/call
    // without a result was taken as a call that returned `null`, a report
    // the gateway then read back as one with no result.
    #[test]
    fn an_answer_without_a_result_object_is_a_protocol_error_and_the_report_reads_back() {
        let init = r#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18","serverInfo":{"name":"s"}}}"#;
        let list = r#"{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"echo","inputSchema":{"type":"object"}}]}}"#;
        for answer in [
            r#"{"jsonrpc":"2.0","id":3,"TTTresult":{"content":[]}}"#,
            r#"{"jsonrpc":"2.0","id":3,"result":null}"#,
            r#"{"jsonrpc":"2.0","id":3,"result":[1]}"#,
        ] {
            let report = against(&format!("{init}\n{list}\n{answer}\n"));
            assert_eq!(report.result, None, "{answer}");
            assert_eq!(report.error_kind.as_deref(), Some("protocol"), "{answer}");
            let line = serde_json::to_string(&report).expect("json");
            assert_eq!(McpReport::from_stdout(line.as_bytes()), Ok(report));
        }
        let ok = against(&format!(
            "{init}\n{list}\n{}\n",
            r#"{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"hi"}]}}"#
        ));
        assert_eq!(ok.error_kind, None, "{ok:?}");
        assert!(ok.result.is_some());
        // Progress whose params are not an object is counted, not kept (a
        // `null` read back as no progress). Found by the attack review.
        let odd = against(&format!(
            "{init}\n{}\n{list}\n",
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":null}"#
        ));
        assert_eq!((odd.notifications, odd.progress.clone()), (1, None));
        let line = serde_json::to_string(&odd).expect("json");
        assert_eq!(McpReport::from_stdout(line.as_bytes()), Ok(odd));
    }

    #[test]
    fn the_credential_is_filled_in_and_a_listing_gets_empty_fields() {
        let fields: std::collections::BTreeMap<String, String> = [
            ("username".to_string(), "v-app-read-1".to_string()),
            ("password".to_string(), "p@ss/w:rd".to_string()),
        ]
        .into();
        assert_eq!(
            fill(
                "postgresql://{{username}}:{{ password:url }}@db:5432/app",
                Some(&fields)
            )
            .expect("filled"),
            "postgresql://v-app-read-1:p%40ss%2Fw%3Ard@db:5432/app"
        );
        assert_eq!(
            fill("postgresql://{{username}}:{{password}}@db/app", None).expect("empty"),
            "postgresql://:@db/app"
        );
        assert_eq!(
            fill("no placeholder", Some(&fields)).expect("same"),
            "no placeholder"
        );
        let missing = fill("{{token}}", Some(&fields)).expect_err("no such field");
        assert!(
            missing.contains("token") && !missing.contains("p@ss"),
            "{missing}"
        );
        assert!(fill("{{user name}}", Some(&fields)).is_err());
        assert!(fill("{{username", Some(&fields)).is_err());
    }

    #[test]
    fn the_credential_file_reads_as_key_value_lines() {
        let dir = std::env::temp_dir().join(format!("gw-fill-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let f = dir.join("credential");
        assert_eq!(credential_fields(&f).expect("absent"), None);
        std::fs::write(&f, "username = u1\npassword = a=b\n").expect("write");
        let got = credential_fields(&f).expect("read").expect("some");
        assert_eq!(got["username"], "u1");
        assert_eq!(got["password"], "a=b");
        std::fs::write(&f, "just a token").expect("write");
        assert!(credential_fields(&f).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
