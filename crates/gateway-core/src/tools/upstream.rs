//! Upstream MCP servers: what the `mcp_upstream` runner needs besides the
//! pipeline. The operation the policy decided (`operation` of an upstream
//! tool's decision, from upstreams.rego), the host paths it may show the
//! server (never the gateway's own), the arguments checked against the
//! locked input schema, the tool definitions' digests the lock pins, and
//! the runner's report read as hostile input.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Value, json};

use gateway_base::canonical::{canonical_json, sha256_hex};
use gateway_runner::protocol::{CredentialFill, McpCall, McpExchange, McpReport, Step};
use gateway_sandbox::Bind;

/// The most text of a result put in the text block the agent reads.
pub const SUMMARY_CHARS: usize = 64 * 1024;

/// An upstream as the operator declared it (config/upstreams): how its
/// server is started and what it may see.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct Server {
    /// A stdio server: its argv, run in a sandbox per call. Empty for a
    /// remote server.
    #[serde(default)]
    pub command: Vec<String>,
    /// The image a stdio server runs from on the kubernetes sandbox
    /// backend (`NAME@sha256:…`): its runtime and files, with the runner
    /// put beside it. Not for the local backend, which runs this host's
    /// files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// A remote server (streamable HTTP): its URL, spoken to by the
    /// gateway itself ([`super::upstream_remote`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// PEM CA certificates a remote server's TLS is checked against,
    /// besides the system's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// A root-owned file (closed to others) holding the bearer token the
    /// gateway presents to a remote server: the operator's, never the
    /// agent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_file: Option<String>,
    /// Or a token granted to the gateway for each exchange.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth: Option<super::upstream_remote::OAuthClient>,
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub read_only: Vec<String>,
    #[serde(default)]
    pub writable: Vec<String>,
    #[serde(default = "default_max_result_bytes")]
    pub max_result_bytes: u64,
    #[serde(default = "default_timeout_seconds")]
    pub timeout_seconds: u64,
    /// The endpoints (by name, `[endpoints]`) a call's sandbox may reach.
    /// A listing (lock, diff, the daemon's readings) reaches none.
    #[serde(default)]
    pub egress: Vec<String>,
    /// How the server is handed the credential minted for a call (its
    /// `{{username}}`, `{{password}}` templates), when it gets one.
    #[serde(default)]
    pub credential: Option<CredentialFill>,
    /// A stdio server kept running between calls, in one sandbox of its
    /// own, on the backends that can (the pipeline's warm module): for a
    /// server that is handed no credential, whose callers may share it.
    #[serde(default)]
    pub warm: bool,
}

fn default_max_result_bytes() -> u64 {
    1 << 20
}

fn default_timeout_seconds() -> u64 {
    60
}

/// What the policy decided a call of an upstream's tool does.
#[derive(Debug, Clone)]
pub struct UpstreamOp {
    pub upstream: String,
    pub tool: String,
    pub server: Server,
    /// The locked definition, read from the lock's exact text (the
    /// policy engine would turn a `1.0` in it into `1`).
    pub definition: Value,
    pub definition_sha256: String,
    /// The credential the decision mints for the call (its kind, mount,
    /// role), bound into an approval with the rest.
    pub credential: Option<Value>,
}

/// The operation as the policy hands it over.
#[derive(Deserialize)]
struct OpWire {
    upstream: String,
    tool: String,
    #[serde(flatten)]
    server: Server,
    definition_json: String,
    definition_sha256: String,
}

impl Server {
    /// The server's environment.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = self
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !self.env.contains_key("HOME") {
            env.push(("HOME".into(), "/tmp".into()));
        }
        env
    }

    /// Whether it is a remote server (a URL, not a command).
    pub fn remote(&self) -> bool {
        self.url.is_some()
    }

    /// A command that starts with an absolute path, or a URL the gateway
    /// may reach; not both.
    pub fn check(&self, name: &str) -> Result<(), String> {
        if self.warm && (self.url.is_some() || self.credential.is_some()) {
            return Err(format!(
                "upstream {name:?} is declared warm: a warm server is a stdio server the gateway runs, and it serves the calls of many, so it is handed no per-call credential"
            ));
        }
        match (&self.url, self.command.first()) {
            (Some(_), Some(_)) => Err(format!(
                "upstream {name:?} has both a command and a url: it is one or the other"
            )),
            (Some(_), None) if self.oauth.is_some() && self.bearer_token_file.is_some() => {
                Err(format!(
                    "upstream {name:?} has both bearer_token_file and oauth: it presents one token"
                ))
            }
            (Some(url), None) => {
                if !self.read_only.is_empty()
                    || !self.writable.is_empty()
                    || !self.egress.is_empty()
                    || self.credential.is_some()
                    || self.image.is_some()
                {
                    return Err(format!(
                        "upstream {name:?} is remote: read_only, writable, egress, credential and image are for a server the gateway runs"
                    ));
                }
                super::upstream_remote::check_url(url)
                    .map_err(|e| format!("upstream {name:?}: {e}"))
            }
            (None, _) if self.oauth.is_some() || self.bearer_token_file.is_some() => Err(format!(
                "upstream {name:?}: bearer_token_file and oauth are for a remote server (url)"
            )),
            (None, Some(_))
                if self.image.is_some()
                    && !(self.read_only.is_empty() && self.writable.is_empty()) =>
            {
                Err(format!(
                    "upstream {name:?} runs from an image: it sees its image's files and its own /tmp, never a host path (read_only, writable)"
                ))
            }
            (None, Some(p)) if Path::new(p).is_absolute() => match &self.image {
                Some(image) => gateway_sandbox::kubernetes::manifests::check_image(image)
                    .map_err(|e| format!("upstream {name:?}: {e}")),
                None => Ok(()),
            },
            _ => Err(format!(
                "upstream {name:?}'s command must start with an absolute path"
            )),
        }
    }

    /// Whether the server can run on this gateway's sandbox backend: a
    /// remote server anywhere (the gateway speaks to it); a stdio server
    /// from this host's files on the local backend, from its declared
    /// image on the kubernetes backend.
    pub fn runs_on(&self, name: &str, host_tools: bool, backend: &str) -> Result<(), String> {
        match (&self.image, self.remote()) {
            (_, true) => Ok(()),
            (Some(image), false) if host_tools => Err(format!(
                "upstream {name:?} runs from the image {image:?}, which the kubernetes sandbox backend runs; this gateway's backend is {backend}, which runs this host's files (declare it without image here)"
            )),
            (None, false) if !host_tools => Err(format!(
                "upstream {name:?} is a stdio server declared without an image: on the {backend} sandbox backend it runs from the image its declaration names (image: NAME@sha256:…, holding its command)"
            )),
            _ => Ok(()),
        }
    }

    /// A step that only lists the server's tools.
    pub fn list_step(&self) -> Step {
        Step {
            argv: self.command.clone(),
            stdout_file: None,
            mcp: Some(McpExchange {
                max_bytes: self.max_result_bytes.max(4 << 20),
                timeout_ms: self.timeout_seconds.saturating_mul(1000),
                call: None,
                credential: self.credential.clone(),
            }),
        }
    }

    /// The step of a warm server's sandbox (`gateway-runner serve`): the
    /// server started and initialized within its timeout; its calls come
    /// later, one by one.
    pub fn serve_step(&self) -> Step {
        let mut step = self.list_step();
        if let Some(ex) = &mut step.mcp {
            ex.credential = None;
        }
        step
    }
}

impl UpstreamOp {
    /// The call as a warm server's runner takes it.
    pub fn serve_request(&self, arguments: &Value) -> gateway_runner::protocol::ServeRequest {
        gateway_runner::protocol::ServeRequest {
            max_bytes: self.server.max_result_bytes,
            timeout_ms: self.server.timeout_seconds.saturating_mul(1000),
            call: McpCall {
                name: self.tool.clone(),
                arguments: arguments.clone(),
                definition: self.definition.clone(),
                progress_token: Some(json!("gateway")),
            },
        }
    }

    pub fn from_decision(operation: Option<&Value>) -> Result<UpstreamOp, String> {
        let op = operation.ok_or("the policy gave no operation for this upstream tool")?;
        let wire: OpWire = serde_json::from_value(op.clone())
            .map_err(|e| format!("the policy's upstream operation does not read: {e}"))?;
        let definition: Value = serde_json::from_str(&wire.definition_json).map_err(|e| {
            format!(
                "the lock's definition of {}.{} does not read: {e}",
                wire.upstream, wire.tool
            )
        })?;
        let op = UpstreamOp {
            upstream: wire.upstream,
            tool: wire.tool,
            server: wire.server,
            definition,
            definition_sha256: wire.definition_sha256,
            credential: None,
        };
        op.server.check(&op.upstream)?;
        if op.definition["name"].as_str() != Some(op.tool.as_str()) {
            return Err(format!(
                "the locked definition of {}.{} names another tool",
                op.upstream, op.tool
            ));
        }
        if definition_digest(&op.definition) != op.definition_sha256 {
            return Err(format!(
                "the lock's digest of {}.{} is not its definition's (the lock file was edited by hand?): lock it again",
                op.upstream, op.tool
            ));
        }
        Ok(op)
    }

    /// The step the runner carries out: the server started, spoken to,
    /// and the tool called only if its live definition is the locked one.
    pub fn call_step(&self, arguments: &Value) -> Step {
        Step {
            argv: self.server.command.clone(),
            stdout_file: None,
            mcp: Some(McpExchange {
                max_bytes: self.server.max_result_bytes,
                timeout_ms: self.server.timeout_seconds.saturating_mul(1000),
                call: Some(McpCall {
                    name: self.tool.clone(),
                    arguments: arguments.clone(),
                    definition: self.definition.clone(),
                    // So that a server reports its progress (counted; the
                    // last one is kept in the report).
                    progress_token: Some(json!("gateway")),
                }),
                credential: self.server.credential.clone(),
            }),
        }
    }
}

/// What the agent is told of an upstream's progress notification
/// (`params` as the server sent it: hostile text, escaped and cut short).
pub fn progress_line(params: &Value, secrets: &[gateway_base::secret::SecretFile]) -> String {
    let num = |v: &Value| match v {
        Value::Number(n) => n.to_string(),
        _ => "?".into(),
    };
    let of = params
        .get("total")
        .map(|t| format!("/{}", num(t)))
        .unwrap_or_default();
    let said = params
        .get("message")
        .and_then(Value::as_str)
        .map(|m| {
            // The call's credential cut out first (a server that echoes
            // it), then the text escaped and cut short.
            let mut c = gateway_sandbox::Captured {
                bytes: m.as_bytes().to_vec(),
                truncated: false,
            };
            c.redact_all(secrets);
            let m: String = String::from_utf8_lossy(&c.bytes)
                .chars()
                .take(200)
                .collect();
            format!(": {}", gateway_base::text::escaped(&m, true))
        })
        .unwrap_or_default();
    format!(
        "upstream progress {}{of}{said}",
        num(params.get("progress").unwrap_or(&Value::Null))
    )
}

/// A sandbox's stderr line sink that passes the step runner's progress
/// lines ([`gateway_runner::protocol::PROGRESS_LINE`]) on to `tell`.
pub fn progress_sink(
    tell: impl Fn(String) + Send + Sync + 'static,
    secrets: Vec<gateway_base::secret::SecretFile>,
) -> gateway_sandbox::LineSink {
    gateway_sandbox::LineSink(std::sync::Arc::new(move |line: &[u8]| {
        let Some(rest) = line.strip_prefix(gateway_runner::protocol::PROGRESS_LINE.as_bytes())
        else {
            return;
        };
        if let Ok(params) = serde_json::from_slice::<Value>(rest)
            && params.is_object()
        {
            tell(progress_line(&params, &secrets));
        }
    }))
}

/// A tool definition's digest: SHA-256 of its canonical JSON (keys
/// sorted), over everything the server said of it (name, title,
/// description, schemas, annotations, _meta).
pub fn definition_digest(definition: &Value) -> String {
    sha256_hex(canonical_json(definition).as_bytes())
}

/// The digest an approval of an upstream call is bound to: the upstream,
/// the tool, its definition's digest and the exact arguments.
pub fn call_digest(op: &UpstreamOp, arguments: &Value) -> String {
    sha256_hex(
        canonical_json(&json!({
            "upstream": op.upstream,
            "tool": op.tool,
            "definition_sha256": op.definition_sha256,
            "arguments": arguments,
            // How the server runs and what it may see and change: an
            // approval is not spent after the operator re-declares it.
            "server": op.server,
            // Nor after the role minted for it changed.
            "credential": op.credential,
        }))
        .as_bytes(),
    )
}

/// Paths no upstream may be shown, whatever the policy says: the whole
/// host, the system's own trees, and the gateway's home (its state,
/// keys, audit, sockets), from above or inside.
fn forbidden(path: &Path, gateway_home: &Path, policies: &[PathBuf]) -> Option<String> {
    const SYSTEM: &[&str] = &["/etc", "/proc", "/sys", "/dev", "/run", "/var/run", "/boot"];
    // Shared trees: a dir under them may be declared, never all of one.
    const WHOLE: &[&str] = &["/tmp", "/var/tmp", "/var", "/home", "/root", "/srv", "/opt"];
    if path == Path::new("/") {
        return Some("the whole host".into());
    }
    if WHOLE.iter().any(|w| path == Path::new(w)) {
        return Some(format!("all of {}", path.display()));
    }
    for p in policies {
        if path.starts_with(p) || p.starts_with(path) {
            return Some(format!("the gateway's policies {}", p.display()));
        }
    }
    for s in SYSTEM {
        let s = Path::new(s);
        if path.starts_with(s) || s.starts_with(path) {
            return Some(format!("{} (the system's own)", s.display()));
        }
    }
    if path.starts_with(gateway_home) || gateway_home.starts_with(path) {
        return Some(format!("the gateway's home {}", gateway_home.display()));
    }
    None
}

/// Why someone other than root could replace `path` (resolved) by a link
/// after it was checked: a dir above it that is not root's, or that others
/// may write (unless sticky, and then the entry under it must be root's).
fn swappable(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let mut child_owner_must_be_root = false;
    let mut ancestors: Vec<&Path> = path.ancestors().collect();
    ancestors.reverse();
    for (i, dir) in ancestors.iter().enumerate() {
        let is_target = i + 1 == ancestors.len();
        let Ok(meta) = std::fs::symlink_metadata(dir) else {
            return Some(format!("{} cannot be read", dir.display()));
        };
        if child_owner_must_be_root && meta.uid() != 0 {
            return Some(format!(
                "{} is not root's, in a dir where anyone may create entries",
                dir.display()
            ));
        }
        if is_target {
            break;
        }
        if meta.uid() != 0 {
            return Some(format!("{} belongs to uid {}", dir.display(), meta.uid()));
        }
        let others_write = meta.mode() & 0o022 != 0;
        let sticky = meta.mode() & 0o1000 != 0;
        if others_write && !sticky {
            return Some(format!("others may write {}", dir.display()));
        }
        child_owner_must_be_root = others_write && sticky;
    }
    None
}

/// The declared paths as binds at their own paths: each resolved
/// (links followed, so that a link cannot lead into the gateway's home)
/// and checked against [`forbidden`].
pub fn binds(
    name: &str,
    server: &Server,
    gateway_home: &Path,
    policies: &[PathBuf],
) -> Result<Vec<Bind>, String> {
    let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let home = real(gateway_home);
    let policies: Vec<PathBuf> = policies.iter().map(|p| real(p)).collect();
    let mut binds = Vec::new();
    for (list, writable) in [(&server.read_only, false), (&server.writable, true)] {
        for p in list.iter() {
            let declared = PathBuf::from(p);
            if !declared.is_absolute()
                || declared
                    .components()
                    .any(|c| matches!(c, std::path::Component::ParentDir))
            {
                return Err(format!(
                    "upstream {name:?}: path {p:?} must be absolute, without '..'"
                ));
            }
            let real = std::fs::canonicalize(&declared)
                .map_err(|e| format!("upstream {name:?}: path {p:?}: {e}"))?;
            for candidate in [&declared, &real] {
                if let Some(why) = forbidden(candidate, &home, &policies) {
                    return Err(format!(
                        "upstream {name:?}: path {p:?} would show the server {why}; refused"
                    ));
                }
            }
            if let Some(why) = swappable(&real) {
                return Err(format!(
                    "upstream {name:?}: path {p:?} could be swapped for a link between its check and its mount ({why}); declare a path whose parent dirs only root can change"
                ));
            }
            binds.push(Bind {
                host: real,
                inside: declared,
                writable,
            });
        }
    }
    Ok(binds)
}

/// What is wrong with `arguments` for the locked `input_schema` (empty:
/// nothing). A schema that cannot be compiled refuses every call.
pub fn argument_errors(input_schema: &Value, arguments: &Value) -> Vec<(String, String)> {
    let validator = match validator(input_schema) {
        Ok(v) => v,
        Err(e) => {
            return vec![(
                String::new(),
                format!("the locked input schema cannot be used: {e}"),
            )];
        }
    };
    validator
        .iter_errors(arguments)
        .take(16)
        .map(|e| {
            let at = e.instance_path().to_string();
            let msg: String = e.to_string().chars().take(200).collect();
            (at, msg)
        })
        .collect()
}

/// Compiled schemas by the digest of their canonical JSON: a locked
/// schema is compiled once, not at every call (the same schema text always
/// compiles to the same validator).
type Validators = std::collections::HashMap<String, std::sync::Arc<jsonschema::Validator>>;
static VALIDATORS: std::sync::Mutex<Option<Validators>> = std::sync::Mutex::new(None);

fn validator(schema: &Value) -> Result<std::sync::Arc<jsonschema::Validator>, String> {
    let key = gateway_base::canonical::sha256_hex(
        gateway_base::canonical::canonical_json(schema).as_bytes(),
    );
    if let Ok(cache) = VALIDATORS.lock()
        && let Some(v) = cache.as_ref().and_then(|c| c.get(&key))
    {
        return Ok(std::sync::Arc::clone(v));
    }
    let compiled = std::sync::Arc::new(
        jsonschema::options()
            .build(schema)
            .map_err(|e| e.to_string())?,
    );
    if let Ok(mut cache) = VALIDATORS.lock() {
        let cache = cache.get_or_insert_with(Default::default);
        // Bounded: the locked tools' schemas, and a few after a re-lock.
        if cache.len() >= 512 {
            cache.clear();
        }
        cache.insert(key, std::sync::Arc::clone(&compiled));
    }
    Ok(compiled)
}

/// The report of the runner read from the sandbox's stdout (hostile: it
/// is the server's sandbox).
pub fn read_report(stdout: &[u8]) -> Result<McpReport, String> {
    McpReport::from_stdout(stdout)
}

/// What an ended exchange comes to: `(ok, summary, result)`. The content
/// is the server's; its text goes to the agent capped, structured content
/// only when it matches the locked output schema.
pub fn outcome(op: &UpstreamOp, report: &McpReport) -> (bool, String, Value) {
    let mut result = json!({
        "upstream": op.upstream,
        "tool": op.tool,
        "definition_sha256": op.definition_sha256,
        "requests_refused": report.requests_refused,
        "notifications": report.notifications,
    });
    if let Some(why) = &report.refused {
        result["refused"] = json!(why);
        if let Some(live) = &report.live_definition {
            result["live_definition_sha256"] = json!(definition_digest(live));
        }
        return (false, why.clone(), result);
    }
    if let Some(kind) = &report.error_kind {
        let why = report.error.clone().unwrap_or_else(|| kind.clone());
        let why = gateway_base::text::escaped(&why, false);
        result["error"] = json!({"kind": kind, "message": why});
        return (false, format!("upstream {}: {why}", op.upstream), result);
    }
    let Some(r) = &report.result else {
        result["error"] = json!({"kind": "protocol", "message": "the server answered nothing"});
        return (
            false,
            format!("upstream {} answered nothing", op.upstream),
            result,
        );
    };
    let bytes = serde_json::to_vec(r).unwrap_or_default();
    result["result_bytes"] = json!(bytes.len());
    result["result_sha256"] = json!(sha256_hex(&bytes));
    let is_error = r["isError"].as_bool().unwrap_or(false);
    let content: Vec<Value> = r["content"]
        .as_array()
        .map(|c| c.iter().filter(|b| b.is_object()).cloned().collect())
        .unwrap_or_default();
    let mut text = String::new();
    for block in &content {
        if let Some(t) = block["text"].as_str().filter(|_| block["type"] == "text") {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(t);
        }
    }
    let mut summary: String = text.chars().take(SUMMARY_CHARS).collect();
    if summary.len() < text.len() {
        summary.push_str("\n[… cut: the whole text is in the structured result]");
    }
    result["isError"] = json!(is_error);
    result["content"] = Value::Array(content);
    if let Some(structured) = r.get("structuredContent").filter(|v| !v.is_null()) {
        match op.definition.get("outputSchema") {
            Some(schema) => {
                let errors = argument_errors(schema, structured);
                if !errors.is_empty() {
                    result["content"] = json!([]);
                    result["error"] = json!({"kind": "output_schema",
                        "message": format!("the structured result does not match the locked output schema: {}", errors[0].1)});
                    return (
                        false,
                        format!(
                            "upstream {}'s result does not match the locked output schema; it was withheld",
                            op.upstream
                        ),
                        result,
                    );
                }
                result["structuredContent"] = structured.clone();
            }
            None => result["structuredContent"] = structured.clone(),
        }
    }
    if summary.is_empty() {
        summary = format!("{}.{} returned no text", op.upstream, op.tool);
    }
    (!is_error, summary, result)
}

/// What the audit keeps of a call's result: its shape and digests, never
/// the server's content or text.
pub fn audited(result: &Value) -> Value {
    let mut kept = serde_json::Map::new();
    for k in [
        "upstream",
        "tool",
        "definition_sha256",
        "isError",
        "result_bytes",
        "result_sha256",
        "refused",
        "live_definition_sha256",
        "requests_refused",
        "notifications",
    ] {
        if let Some(v) = result.get(k) {
            kept.insert(k.into(), v.clone());
        }
    }
    if let Some(kind) = result["error"].get("kind") {
        kept.insert("error".into(), json!({"kind": kind}));
    }
    Value::Object(kept)
}

/// A tool name the gateway can offer under a prefix: MCP's characters,
/// no dot (the prefix's separator), at most 64.
pub fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Why a tool the server lists cannot be offered (`None`: it can).
pub fn unusable(definition: &Value) -> Option<String> {
    let Some(name) = definition["name"].as_str() else {
        return Some("it has no name".into());
    };
    if !valid_tool_name(name) {
        return Some(format!(
            "its name {:?} is not [A-Za-z0-9_-]{{1,64}}",
            name.chars().take(80).collect::<String>()
        ));
    }
    if definition["inputSchema"]["properties"]
        .get("approval_id")
        .is_some()
    {
        return Some(
            "it has an argument named approval_id, which the gateway's own approval flow uses"
                .into(),
        );
    }
    if let Err(e) = jsonschema::options().build(&definition["inputSchema"]) {
        return Some(format!("its input schema cannot be used: {e}"));
    }
    None
}

/// The tools the server of upstream `name` lists, read in a throwaway
/// sandbox (no network, its declared paths), with the server's
/// `serverInfo`.
/// [`list`] of a remote server: no sandbox is involved.
pub async fn list_remote(name: &str, server: &Server) -> Result<McpReport, String> {
    server.check(name)?;
    let step = server.list_step();
    let ex = step.mcp.as_ref().ok_or("no exchange")?;
    let report = super::upstream_remote::exchange_redacted(server, ex).await?;
    match &report.error_kind {
        Some(kind) => Err(format!(
            "upstream {name:?}: {} ({kind})",
            report.error.clone().unwrap_or_default()
        )),
        None => Ok(report),
    }
}

pub async fn list(
    sandbox: &dyn gateway_sandbox::Sandbox,
    tools: &super::ToolPaths,
    (gateway_home, policies): (&Path, &[PathBuf]),
    name: &str,
    server: &Server,
) -> Result<McpReport, String> {
    server.check(name)?;
    if server.remote() {
        return list_remote(name, server).await;
    }
    let host = sandbox.uses_host_tools();
    server.runs_on(name, host, sandbox.backend())?;
    // The local backend binds this host's runner and the declared paths;
    // the kubernetes backend's pod has its image and the runner's.
    let mut binds = Vec::new();
    if host {
        binds = tools.runner_binds().map_err(|e| e.to_string())?;
        binds.extend(self::binds(name, server, gateway_home, policies)?);
        binds.sort_by(|a, b| a.inside.cmp(&b.inside));
    }
    let steps = vec![server.list_step()];
    let limits = gateway_sandbox::Limits {
        output_bytes: 8 << 20,
        ..gateway_sandbox::Limits::default()
    };
    let req = gateway_sandbox::SandboxRequest {
        name: format!(
            "upstream-list-{}",
            uuid::Uuid::new_v4()
                .simple()
                .to_string()
                .get(..12)
                .unwrap_or("x")
        ),
        argv: super::runner_argv(),
        env: server.env(),
        binds,
        workdir: None,
        files_in: vec![gateway_sandbox::FileIn {
            path: super::STEPS_FILE.into(),
            contents: serde_json::to_vec(&steps).unwrap_or_default(),
        }],
        credential: None,
        limits,
        deadline: std::time::Duration::from_secs(server.timeout_seconds.saturating_add(30)),
        network: gateway_sandbox::Network::None,
        files_out: vec![],
        on_stderr_line: None,
        image: server.image.clone(),
    };
    let r = sandbox.run(req).await.map_err(|e| e.to_string())?;
    let report = read_report(&r.stdout.bytes).map_err(|e| {
        format!(
            "{e} ({:?}): {}",
            r.ended,
            gateway_base::text::escaped(&r.stderr.text(), false)
                .chars()
                .rev()
                .take(2000)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<String>()
        )
    })?;
    if let Some(kind) = &report.error_kind {
        return Err(format!(
            "upstream {name:?}: {} ({kind})",
            report.error.clone().unwrap_or_default()
        ));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op() -> UpstreamOp {
        let definition = json!({"name": "write_note", "description": "d",
            "inputSchema": {"type": "object", "properties": {"text": {"type": "string", "maxLength": 5}},
                            "required": ["text"], "additionalProperties": false}});
        UpstreamOp {
            upstream: "notes".into(),
            tool: "write_note".into(),
            server: Server {
                command: vec!["/usr/bin/true".into()],
                image: None,
                env: Default::default(),
                read_only: vec![],
                writable: vec![],
                url: None,
                ca_file: None,
                bearer_token_file: None,
                oauth: None,
                max_result_bytes: 1000,
                timeout_seconds: 5,
                egress: vec![],
                credential: None,
                warm: false,
            },
            definition_sha256: definition_digest(&definition),
            definition,
            credential: None,
        }
    }

    #[test]
    fn a_warm_server_is_a_stdio_one_without_a_credential_and_serves_without_one() {
        let mut warm = op().server;
        warm.warm = true;
        assert!(warm.check("notes").is_ok());
        let mut with_credential = warm.clone();
        with_credential.credential = Some(CredentialFill::default());
        let e = with_credential.check("notes").unwrap_err();
        assert!(e.contains("no per-call credential"), "{e}");
        let mut remote = warm.clone();
        remote.command.clear();
        remote.url = Some("https://mcp.example.com/mcp".into());
        assert!(remote.check("notes").unwrap_err().contains("warm"));
        // Its runner's step starts the server and calls nothing itself.
        let step = warm.serve_step();
        let ex = step.mcp.expect("mcp");
        assert!(ex.call.is_none() && ex.credential.is_none());
        let req = op().serve_request(&json!({"text": "hi"}));
        assert_eq!(req.call.definition, op().definition);
        assert_eq!(req.max_bytes, 1000);
        assert_eq!(req.timeout_ms, 5000);
    }

    #[test]
    fn a_stdio_server_runs_from_host_files_locally_and_from_its_pinned_image_on_kubernetes() {
        let image = "registry.example.com/mcp/kit@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let host = op().server;
        let mut pinned = host.clone();
        pinned.image = Some(image.into());
        assert!(pinned.check("kit").is_ok());
        assert!(host.runs_on("kit", true, "local").is_ok());
        assert!(pinned.runs_on("kit", false, "kubernetes").is_ok());
        let e = host.runs_on("kit", false, "kubernetes").unwrap_err();
        assert!(e.contains("declared without an image"), "{e}");
        let e = pinned.runs_on("kit", true, "local").unwrap_err();
        assert!(e.contains("this host's files"), "{e}");
        // An image's server sees no host path; a tag is not a pin.
        let mut paths = pinned.clone();
        paths.read_only = vec!["/srv".into()];
        assert!(
            paths
                .check("kit")
                .unwrap_err()
                .contains("never a host path")
        );
        let mut tagged = pinned.clone();
        tagged.image = Some("registry.example.com/mcp/kit:1.2".into());
        assert!(tagged.check("kit").unwrap_err().contains("not pinned"));
        // A remote server has no image.
        let mut remote = pinned.clone();
        remote.command.clear();
        remote.url = Some("https://mcp.example.com/mcp".into());
        assert!(remote.check("kit").unwrap_err().contains("image"));
    }

    #[test]
    fn arguments_are_checked_against_the_locked_schema() {
        let o = op();
        let schema = &o.definition["inputSchema"];
        assert!(argument_errors(schema, &json!({"text": "hi"})).is_empty());
        for bad in [
            json!({}),
            json!({"text": 5}),
            json!({"text": "toolong"}),
            json!({"text": "a", "extra": 1}),
            json!([]),
        ] {
            assert!(!argument_errors(schema, &bad).is_empty(), "{bad}");
        }
        // A schema pointing elsewhere is not fetched: the call is refused.
        let remote = json!({"$ref": "https://attacker.example/schema.json"});
        assert!(!argument_errors(&remote, &json!({})).is_empty());
    }

    #[test]
    fn progress_is_told_as_escaped_short_text() {
        assert_eq!(
            progress_line(
                &json!({"progress": 2, "total": 4, "message": "half\nway"}),
                &[]
            ),
            "upstream progress 2/4: half\\nway"
        );
        assert_eq!(
            progress_line(&json!({"progress": 1.5}), &[]),
            "upstream progress 1.5"
        );
        // A server that echoes its credential in its progress.
        let secret = gateway_base::secret::SecretFile::new(
            b"password = s3cret-value-of-the-call\n".to_vec(),
        );
        assert_eq!(
            progress_line(
                &json!({"progress": 1, "message": "using s3cret-value-of-the-call now"}),
                std::slice::from_ref(&secret),
            ),
            "upstream progress 1: using <redacted> now"
        );
        let told = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let t = std::sync::Arc::clone(&told);
        let sink = progress_sink(move |s| t.lock().expect("lock").push(s), vec![secret]);
        (sink.0)(b"==> upstream progress {\"progress\": 3}");
        (sink.0)(b"==> step 1/1: node server.js");
        (sink.0)(b"==> upstream progress not json");
        assert_eq!(
            *told.lock().expect("lock"),
            vec!["upstream progress 3".to_string()]
        );
    }

    #[test]
    fn the_digest_binds_definition_and_arguments_and_ignores_key_order() {
        let o = op();
        let a = call_digest(&o, &json!({"text": "a", "n": 1}));
        let mut redeclared = o.clone();
        redeclared.server.writable = vec!["/srv/elsewhere".into()];
        assert_ne!(a, call_digest(&redeclared, &json!({"text": "a", "n": 1})));
        let mut other_role = o.clone();
        other_role.credential = Some(json!({"kind": "pg_write", "role": "app-write"}));
        assert_ne!(a, call_digest(&other_role, &json!({"text": "a", "n": 1})));
        assert_eq!(a, call_digest(&o, &json!({"n": 1, "text": "a"})));
        assert_ne!(a, call_digest(&o, &json!({"text": "b", "n": 1})));
        let mut other = o.clone();
        other.definition_sha256 = "0".repeat(64);
        assert_ne!(a, call_digest(&other, &json!({"text": "a", "n": 1})));
    }

    #[test]
    fn a_hand_edited_lock_is_refused() {
        let o = op();
        let mut v = serde_json::to_value(json!({
            "upstream": o.upstream, "tool": o.tool, "command": o.server.command,
            "definition_json": o.definition.to_string(), "definition_sha256": o.definition_sha256,
            "max_result_bytes": 10, "timeout_seconds": 1}))
        .unwrap_or_default();
        assert!(UpstreamOp::from_decision(Some(&v)).is_ok());
        let mut edited = o.definition.clone();
        edited["description"] = json!("now it says something else");
        v["definition_json"] = json!(edited.to_string());
        let e = UpstreamOp::from_decision(Some(&v))
            .err()
            .unwrap_or_default();
        assert!(e.contains("edited by hand"), "{e}");
        v["command"] = json!(["node"]);
        assert!(UpstreamOp::from_decision(Some(&v)).is_err());
    }

    #[test]
    fn a_definition_with_whole_floats_keeps_its_digest_through_the_lock_text() {
        let def: Value =
            serde_json::from_str(r#"{"name": "t", "inputSchema": {"type": "object", "properties": {"n": {"type": "number", "default": 1.0, "minimum": 0.0}}}}"#)
                .unwrap_or_default();
        let text = serde_json::to_string(&def).unwrap_or_default();
        assert!(text.contains("1.0"), "{text}");
        let op = json!({"upstream": "u", "tool": "t", "command": ["/bin/x"],
            "definition_json": text, "definition_sha256": definition_digest(&def)});
        let o = UpstreamOp::from_decision(Some(&op)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(o.definition, def);
    }

    #[test]
    fn a_path_under_a_dir_someone_else_may_change_is_refused() {
        // As root (the daemon, and the tests): a dir of uid 65534's above
        // the declared path lets that user swap it for a link.
        let base = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let theirs = base.path().join("theirs");
        let declared = theirs.join("data");
        std::fs::create_dir_all(&declared).unwrap_or_else(|e| panic!("{e}"));
        let mut o = op();
        o.server.read_only = vec![declared.display().to_string()];
        assert!(binds("t", &o.server, Path::new("/nonexistent-home"), &[]).is_ok());
        nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(65534)), None)
            .unwrap_or_else(|e| panic!("{e}"));
        let e = binds("t", &o.server, Path::new("/nonexistent-home"), &[])
            .err()
            .unwrap_or_default();
        assert!(e.contains("belongs to uid 65534"), "{e}");
        // Writable by others, not sticky.
        nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(0)), None)
            .unwrap_or_else(|e| panic!("{e}"));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o777))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(binds("t", &o.server, Path::new("/nonexistent-home"), &[]).is_err());
        // Sticky (as /tmp): the entry under it must be root's.
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o1777))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(binds("t", &o.server, Path::new("/nonexistent-home"), &[]).is_ok());
        nix::unistd::chown(&declared, Some(nix::unistd::Uid::from_raw(65534)), None)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(binds("t", &o.server, Path::new("/nonexistent-home"), &[]).is_err());
    }

    #[test]
    fn the_gateways_home_and_the_system_are_never_shown() {
        let home = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let inside = home.path().join("audit");
        std::fs::create_dir_all(&inside).unwrap_or_else(|e| panic!("{e}"));
        let elsewhere = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let link = elsewhere.path().join("innocent");
        std::os::unix::fs::symlink(&inside, &link).unwrap_or_else(|e| panic!("{e}"));
        let mut o = op();
        for (p, ok) in [
            ("/".to_string(), false),
            ("/etc".to_string(), false),
            ("/run".to_string(), false),
            (home.path().display().to_string(), false),
            (inside.display().to_string(), false),
            (link.display().to_string(), false),
            (format!("{}/../x", elsewhere.path().display()), false),
            ("relative".to_string(), false),
            (elsewhere.path().display().to_string(), true),
        ] {
            o.server.read_only = vec![p.clone()];
            assert_eq!(binds("t", &o.server, home.path(), &[]).is_ok(), ok, "{p}");
        }
        // A parent of the home would show it too.
        if let Some(parent) = home.path().parent() {
            o.server.writable = vec![parent.display().to_string()];
            o.server.read_only = vec![];
            assert!(binds("t", &o.server, home.path(), &[]).is_err());
        }
        // The policies, and all of a shared tree.
        o.server.writable = vec![];
        for p in ["/tmp", "/opt", "/home"] {
            o.server.read_only = vec![p.to_string()];
            assert!(binds("t", &o.server, home.path(), &[]).is_err(), "{p}");
        }
        o.server.read_only = vec![elsewhere.path().display().to_string()];
        assert!(
            binds(
                "t",
                &o.server,
                home.path(),
                &[elsewhere.path().join("policies")]
            )
            .is_err()
        );
    }

    #[test]
    fn a_result_is_capped_text_and_a_structured_result_must_match_its_schema() {
        let mut o = op();
        let report = McpReport {
            result: Some(
                json!({"content": [{"type": "text", "text": "x".repeat(SUMMARY_CHARS + 10)}],
                                "structuredContent": {"n": "not a number"}}),
            ),
            ..McpReport::default()
        };
        let (ok, summary, result) = outcome(&o, &report);
        assert!(ok);
        assert!(summary.len() < SUMMARY_CHARS + 100 && summary.contains("cut"));
        assert_eq!(result["structuredContent"]["n"], "not a number");
        o.definition["outputSchema"] =
            json!({"type": "object", "properties": {"n": {"type": "number"}}});
        let (ok, _, result) = outcome(&o, &report);
        assert!(!ok);
        assert_eq!(result["error"]["kind"], "output_schema");
        assert_eq!(result["content"], json!([]));
        let refused = McpReport {
            refused: Some("changed".into()),
            live_definition: Some(json!({"name": "write_note"})),
            ..McpReport::default()
        };
        let (ok, _, result) = outcome(&o, &refused);
        assert!(!ok);
        assert!(result["live_definition_sha256"].is_string());
    }
}
