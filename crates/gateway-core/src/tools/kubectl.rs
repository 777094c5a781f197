//! The `kubectl_read` runner's commands and what it makes of kubectl's
//! answers. The operation comes whole from the policy (`operation` in the
//! decision, built by `kubernetes.rego`); this module checks that it is
//! well formed (a floor, not a decision: a name that could be read as a
//! flag, a verb it does not know, are refused whatever the policy says),
//! turns it into one kubectl argv, and reads kubectl's output as hostile
//! input: objects without `managedFields`, Secrets as names and keys only,
//! text with its control characters escaped, everything capped with a
//! `truncated` mark.

use serde::Deserialize;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::{KUBECTL, Step};

/// One read, as the policy decided it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadOp {
    pub verb: String,
    pub namespace: String,
    pub group: String,
    pub resource: String,
    pub kind: String,
    pub name: String,
    pub container: String,
    #[serde(deserialize_with = "whole")]
    pub tail_lines: u64,
    #[serde(deserialize_with = "whole")]
    pub since_seconds: u64,
    pub previous: bool,
    pub values: String,
    #[serde(deserialize_with = "whole")]
    pub result_bytes: u64,
}

/// A whole number however the policy wrote it (`5` or `5.0`).
fn whole<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let n = serde_json::Number::deserialize(d)?;
    if let Some(u) = n.as_u64() {
        return Ok(u);
    }
    match n.as_f64() {
        Some(f) if f >= 0.0 && f.fract() == 0.0 && f <= 1e15 => Ok(f as u64),
        _ => Err(serde::de::Error::custom(format!(
            "{n} is not a whole number"
        ))),
    }
}

/// The verbs this runner carries out.
pub const VERBS: &[&str] = &[
    "get",
    "describe",
    "logs",
    "events",
    "rollout_status",
    "rollout_history",
    "top",
];

/// The most any read may return, whatever the policy says (the sandbox's
/// own output cap is larger).
pub const MAX_RESULT_BYTES: u64 = 1 << 20;

/// A DNS-1123 subdomain (an object's name) or label: lowercase letters,
/// digits, `-` and `.`, starting and ending with a letter or digit. So it
/// can never be read as a flag.
pub(crate) fn dns_name(s: &str, max: usize, dots: bool) -> bool {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !s.is_empty()
        && s.len() <= max
        && s.starts_with(ok_char)
        && s.ends_with(ok_char)
        && s.chars()
            .all(|c| ok_char(c) || c == '-' || (dots && c == '.'))
}

/// An API group or resource: lowercase letters, digits, `.`, `-`, `/`
/// (a subresource), never empty unless allowed, never a flag.
pub(crate) fn api_word(s: &str) -> bool {
    s.chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-'))
        && !s.starts_with(['-', '.'])
}

impl ReadOp {
    /// The operation in a decision, checked. `namespace` is the one the
    /// call's credential is scoped to: the operation must name it.
    pub fn from_decision(op: Option<&Value>, namespace: &str) -> Result<ReadOp, String> {
        let Some(v) = op.filter(|v| !v.is_null()) else {
            return Err("the decision carries no Kubernetes operation for kubectl_read".into());
        };
        let op: ReadOp = serde_json::from_value(v.clone())
            .map_err(|e| format!("the decision's Kubernetes operation is malformed: {e}"))?;
        op.check(namespace)?;
        Ok(op)
    }

    fn check(&self, namespace: &str) -> Result<(), String> {
        if !VERBS.contains(&self.verb.as_str()) {
            return Err(format!(
                "kubectl_read has no verb {:?} (it has: {})",
                self.verb,
                VERBS.join(", ")
            ));
        }
        if self.namespace != namespace {
            return Err(format!(
                "the operation names namespace {:?} but the credential is scoped to {namespace:?}",
                self.namespace
            ));
        }
        if !dns_name(&self.namespace, 63, false) {
            return Err(format!("{:?} is not a namespace name", self.namespace));
        }
        if !self.name.is_empty() && !dns_name(&self.name, 253, true) {
            return Err(format!("{:?} is not an object name", self.name));
        }
        if !self.container.is_empty() && !dns_name(&self.container, 63, false) {
            return Err(format!("{:?} is not a container name", self.container));
        }
        if !api_word(&self.group)
            || self.group.ends_with('.')
            || !api_word(&self.resource)
            || self.resource.contains(['/', '.'])
        {
            return Err(format!(
                "{:?} of group {:?} is not a resource",
                self.resource, self.group
            ));
        }
        if !self.kind.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(format!("{:?} is not a Kind", self.kind));
        }
        let needs_kind = !matches!(self.verb.as_str(), "events" | "logs");
        if needs_kind && self.resource.is_empty() {
            return Err(format!("{} needs a kind", self.verb));
        }
        let needs_name = !matches!(self.verb.as_str(), "get" | "events" | "top");
        if needs_name && self.name.is_empty() {
            return Err(format!("{} needs an object's name", self.verb));
        }
        if self.verb == "events" && self.name.is_empty() != self.kind.is_empty() {
            return Err("events of one object need both its kind and its name".into());
        }
        if self.verb == "logs" && !matches!(self.resource.as_str(), "" | "pods") {
            return Err("logs are a pod's".into());
        }
        if !matches!(self.values.as_str(), "shown" | "hidden") {
            return Err(format!(
                "values {:?} is neither shown nor hidden",
                self.values
            ));
        }
        // A kind whose values are hidden is read with get only (names and
        // keys): describe would print a service-account token in clear.
        if self.values_hidden() && !matches!(self.verb.as_str(), "get" | "events") {
            return Err(format!(
                "{} of {} is refused: its values are hidden, so it is only listed (get)",
                self.verb,
                self.kubectl_type()
            ));
        }
        if self.result_bytes == 0 || self.tail_lines == 0 {
            return Err("result_bytes and tail_lines must be at least 1".into());
        }
        Ok(())
    }

    /// The kind as kubectl takes it: `pods`, `deployments.apps`.
    pub fn kubectl_type(&self) -> String {
        let resource = if self.resource.is_empty() {
            "pods"
        } else {
            &self.resource
        };
        if self.group.is_empty() {
            resource.to_string()
        } else {
            format!("{resource}.{}", self.group)
        }
    }

    /// Values never leave the sandbox for a Secret, whatever the policy
    /// says of it, nor for any kind the policy marks `hidden`.
    pub fn values_hidden(&self) -> bool {
        self.values == "hidden"
            || self.kind == "Secret"
            || (self.group.is_empty() && matches!(self.resource.as_str(), "secrets" | "secret"))
    }

    /// What the result is about, for the summary and the audit.
    pub fn object(&self) -> String {
        match (self.name.as_str(), self.verb.as_str()) {
            ("", "events") => format!("namespace {}", self.namespace),
            ("", _) => format!("{} in {}", self.kubectl_type(), self.namespace),
            (n, _) => format!("{}/{n} in {}", self.kubectl_type(), self.namespace),
        }
    }

    /// The cap on what the agent gets.
    pub fn cap(&self) -> usize {
        usize::try_from(self.result_bytes.min(MAX_RESULT_BYTES)).unwrap_or(1 << 20)
    }

    /// Whether kubectl's answer is JSON (read into objects) or text.
    pub fn answers_json(&self) -> bool {
        matches!(self.verb.as_str(), "get" | "events")
    }

    /// The one kubectl command.
    pub fn steps(&self, kubeconfig_inside: &str) -> Vec<Step> {
        let mut argv: Vec<String> = vec![
            KUBECTL.into(),
            "--kubeconfig".into(),
            kubeconfig_inside.into(),
            "--namespace".into(),
            self.namespace.clone(),
            "--request-timeout=30s".into(),
        ];
        let mut push = |a: &[&str]| argv.extend(a.iter().map(|s| s.to_string()));
        let ty = self.kubectl_type();
        let object = format!("{ty}/{}", self.name);
        match self.verb.as_str() {
            "get" => {
                push(&["get", &ty]);
                if !self.name.is_empty() {
                    push(&[&self.name]);
                }
                if self.values_hidden() {
                    // Names, types and keys are all that leave the sandbox.
                    push(&["--output", KEYS_ONLY_TEMPLATE]);
                } else {
                    push(&["--output", "json"]);
                }
            }
            // TYPE/NAME, one argument: `describe TYPE NAME` falls back to
            // every object whose name starts with NAME when NAME is not found.
            "describe" => push(&["describe", &object]),
            "logs" => {
                // No --limit-bytes: the kubelet counts it from the start of
                // the tail, and a crash's last words are at its end. The
                // runner keeps the last `result_bytes` of what comes back.
                let tail = format!("--tail={}", self.tail_lines);
                push(&["logs", &format!("pods/{}", self.name), &tail]);
                if !self.container.is_empty() {
                    push(&["--container", &self.container]);
                }
                if self.since_seconds > 0 {
                    push(&[&format!("--since={}s", self.since_seconds)]);
                }
                if self.previous {
                    push(&["--previous"]);
                }
            }
            "events" => {
                push(&["get", "events", "--output", "json"]);
                if !self.name.is_empty() {
                    push(&[
                        "--field-selector",
                        &format!(
                            "involvedObject.kind={},involvedObject.name={}",
                            self.kind, self.name
                        ),
                    ]);
                }
            }
            "rollout_status" => push(&["rollout", "status", &object, "--watch=false"]),
            // Per container: which one of a pod uses the memory.
            "top" => {
                push(&["top", "pod"]);
                if !self.name.is_empty() {
                    push(&[&self.name]);
                }
                push(&["--containers"]);
            }
            _ => push(&["rollout", "history", &object]),
        }
        vec![Step {
            argv,
            stdout_file: None,
            mcp: None,
        }]
    }
}

/// A Go template printing, per Secret (one object or a list), its name,
/// type and the keys of its data: one line each, each field Go-quoted
/// (`%q`) and the fields space-separated. A Secret's type is free text (the
/// API server does not check it), so nothing is printed unquoted.
pub const KEYS_ONLY_TEMPLATE: &str = "go-template={{define \"s\"}}{{printf \"%q\" .metadata.name}} {{printf \"%q\" (or .type \"\")}}{{range $k, $v := .data}} {{printf \"%q\" $k}}{{end}}\n{{end}}{{if .items}}{{range .items}}{{template \"s\" .}}{{end}}{{else}}{{if .metadata}}{{template \"s\" .}}{{end}}{{end}}";

/// What the agent gets of one read.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadResult {
    pub summary: String,
    pub result: Value,
    /// What the audit keeps instead of the content: its size and digest.
    pub audited: Value,
}

/// kubectl's answer (stdout, already capped by the sandbox: `cut` says
/// so) made into the agent's result.
pub fn read_result(op: &ReadOp, stdout: &[u8], cut: bool) -> Result<ReadResult, String> {
    let (summary, mut result) = if op.values_hidden() && op.verb == "get" {
        keys_only(op, stdout, cut)?
    } else if op.answers_json() {
        objects(op, stdout, cut)?
    } else {
        text(op, stdout, cut)
    };
    let content = serde_json::to_vec(&result).unwrap_or_default();
    let audited = json!({
        "verb": op.verb,
        "object": op.object(),
        "bytes": content.len(),
        "sha256": hex::encode(Sha256::digest(&content)),
        "truncated": result["truncated"],
    });
    if let Some(m) = result.as_object_mut() {
        m.insert("namespace".into(), op.namespace.clone().into());
        m.insert("verb".into(), op.verb.clone().into());
    }
    Ok(ReadResult {
        summary,
        result,
        audited,
    })
}

/// kubectl's complaint as the agent gets it: its last lines, at most
/// `cap` bytes of them, control characters escaped.
pub fn errors(stderr: &str, cap: usize) -> String {
    let lines: Vec<&str> = stderr.lines().collect();
    let last = lines[lines.len().saturating_sub(20)..].join("\n");
    gateway_base::text::escaped(cut_to(&last, cap.min(8192), true), false)
}

/// At most `cap` bytes of `t`, cut at a character boundary: its start
/// (`keep_end` false) or its end (`keep_end`: a log's newest lines).
fn cut_to(t: &str, cap: usize, keep_end: bool) -> &str {
    if t.len() <= cap {
        return t;
    }
    if keep_end {
        let mut at = t.len() - cap;
        while !t.is_char_boundary(at) {
            at += 1;
        }
        &t[at..]
    } else {
        let mut at = cap;
        while !t.is_char_boundary(at) {
            at -= 1;
        }
        &t[..at]
    }
}

/// Text (describe, logs, rollout): control and format characters escaped,
/// then at most the cap (what the agent gets is what was counted). A log
/// keeps its end, where a crash's last words are.
fn text(op: &ReadOp, stdout: &[u8], cut: bool) -> (String, Value) {
    let cap = op.cap();
    let logs = op.verb == "logs";
    // Escaping is linear; the sandbox's output cap bounds what it reads.
    let all = gateway_base::text::escaped(&String::from_utf8_lossy(stdout), false);
    let kept = cut_to(&all, cap, logs);
    let truncated = cut || kept.len() < all.len();
    let mut t = kept.to_string();
    if truncated {
        if logs {
            t.insert_str(0, "[truncated: only the newest lines are shown; ask for fewer lines (tail_lines) or a shorter since_seconds]\n");
        } else {
            t.push_str("\n[truncated]");
        }
    }
    let summary = if t.trim().is_empty() {
        format!("{}: nothing (no output)", op.object())
    } else {
        format!("{}:\n{t}", op.object())
    };
    (
        summary,
        json!({"object": op.object(), "text": t, "truncated": truncated}),
    )
}

/// The longest event message kept (a core/v1 Event's message has no limit
/// of its own; events.k8s.io keeps 1 KiB).
const EVENT_MESSAGE_BYTES: usize = 1024;

/// `kubectl get -o json`: one object or a list. Each object without its
/// `managedFields` and its last-applied annotation (a copy of what was
/// applied, noise at best); as many whole objects as fit in the cap, an
/// object too large for it skipped (counted), never the rest with it.
/// Events become rows, newest kept first.
fn objects(op: &ReadOp, stdout: &[u8], cut: bool) -> Result<(String, Value), String> {
    if cut {
        // Cut JSON does not parse; say why rather than "not JSON".
        return Err(format!(
            "kubectl's answer for {} was longer than the sandbox's output cap (output_bytes){}",
            op.object(),
            if op.name.is_empty() {
                "; name one object"
            } else {
                ""
            }
        ));
    }
    let v: Value = serde_json::from_slice(stdout).map_err(|e| format!("not JSON: {e}"))?;
    let items: Vec<Value> = match v.get("items") {
        Some(Value::Array(items)) => items.clone(),
        Some(_) => return Err("a list whose items are not an array".into()),
        None if v.get("kind").is_some_and(Value::is_string) => vec![v],
        None => return Err("neither an object nor a list".into()),
    };
    let total = items.len();
    let cap = op.cap();
    let mut rows: Vec<Value> = if op.verb == "events" {
        let mut rows: Vec<Value> = items.iter().map(event_row).collect();
        // Newest first, to keep the newest when not all fit.
        rows.sort_by(|a, b| b["last_seen"].as_str().cmp(&a["last_seen"].as_str()));
        rows
    } else {
        items.into_iter().map(trimmed).collect()
    };
    let mut kept = Vec::new();
    let mut used: usize = 2;
    for item in rows.drain(..) {
        let n = serde_json::to_vec(&item)
            .map(|b| b.len())
            .unwrap_or(usize::MAX);
        if used.saturating_add(n).saturating_add(1) > cap {
            continue;
        }
        used += n + 1;
        kept.push(item);
    }
    if op.verb == "events" {
        kept.reverse();
    }
    let omitted = total - kept.len();
    let summary = if op.verb == "events" {
        event_summary(op, &kept, omitted)
    } else {
        let names: Vec<&str> = kept
            .iter()
            .filter_map(|o| o["metadata"]["name"].as_str())
            .collect();
        let mut s = format!("{} object(s), {}", total, op.object());
        if !names.is_empty() {
            s.push_str(": ");
            s.push_str(&gateway_base::text::escaped(&names.join(", "), true));
        }
        if omitted > 0 {
            s.push_str(&format!(
                " [truncated: {omitted} not shown, over the {cap}-byte cap{}]",
                if op.name.is_empty() {
                    "; name one object"
                } else {
                    ""
                }
            ));
        }
        s
    };
    let key = if op.verb == "events" {
        "events"
    } else {
        "items"
    };
    Ok((
        summary,
        json!({key: kept, "object": op.object(), "truncated": omitted > 0, "omitted": omitted}),
    ))
}

/// An object as the agent gets it.
fn trimmed(mut o: Value) -> Value {
    if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
        if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            a.remove("kubectl.kubernetes.io/last-applied-configuration");
        }
    }
    o
}

fn s(v: &Value) -> String {
    gateway_base::text::escaped(cut_to(v.as_str().unwrap_or(""), 253, false), true)
}

/// One event as a row: when it was last seen, its type, reason, what it
/// is about, its message (cut, then escaped) and how many times it
/// happened (a series' count for events.k8s.io-style ones).
fn event_row(e: &Value) -> Value {
    let last = [
        &e["series"]["lastObservedTime"],
        &e["lastTimestamp"],
        &e["eventTime"],
        &e["firstTimestamp"],
        &e["metadata"]["creationTimestamp"],
    ]
    .into_iter()
    .find(|t| t.as_str().is_some_and(|t| !t.is_empty()))
    .map(s)
    .unwrap_or_default();
    let io = &e["involvedObject"];
    let message = e["message"].as_str().unwrap_or("");
    let mut m = gateway_base::text::escaped(cut_to(message, EVENT_MESSAGE_BYTES, false), false);
    if message.len() > EVENT_MESSAGE_BYTES {
        m.push_str(" [truncated]");
    }
    json!({
        "last_seen": last,
        "type": s(&e["type"]),
        "reason": s(&e["reason"]),
        "object": format!("{}/{}", s(&io["kind"]), s(&io["name"])),
        "message": m,
        "count": e["series"]["count"].as_u64().or(e["count"].as_u64()).unwrap_or(1),
    })
}

fn event_summary(op: &ReadOp, rows: &[Value], omitted: usize) -> String {
    if rows.is_empty() && omitted == 0 {
        return format!("No events for {}.", op.object());
    }
    let mut out = format!("{} event(s) for {}:", rows.len() + omitted, op.object());
    for r in rows {
        out.push_str(&format!(
            "\n{} {} {} {} (x{}): {}",
            r["last_seen"].as_str().unwrap_or(""),
            r["type"].as_str().unwrap_or(""),
            r["reason"].as_str().unwrap_or(""),
            r["object"].as_str().unwrap_or(""),
            r["count"],
            r["message"].as_str().unwrap_or("").replace('\n', "\\n"),
        ));
    }
    if omitted > 0 {
        out.push_str(&format!("\n[truncated: {omitted} older events not shown]"));
    }
    out
}

/// One Go-quoted string (`%q`) at the start of `s`: its value and the rest.
fn go_unquoted(s: &str) -> Option<(String, &str)> {
    let mut chars = s.strip_prefix('"')?.char_indices();
    let mut out = String::new();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((out, &s[i + 2..])),
            '\\' => {
                let (_, e) = chars.next()?;
                let hex = |n: usize, chars: &mut std::str::CharIndices| -> Option<char> {
                    let h: String = (0..n)
                        .filter_map(|_| chars.next().map(|(_, c)| c))
                        .collect();
                    (h.len() == n)
                        .then(|| u32::from_str_radix(&h, 16).ok().and_then(char::from_u32))?
                };
                out.push(match e {
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    'a' => '\u{7}',
                    'b' => '\u{8}',
                    'f' => '\u{c}',
                    'v' => '\u{b}',
                    '\\' => '\\',
                    '"' => '"',
                    'x' => hex(2, &mut chars)?,
                    'u' => hex(4, &mut chars)?,
                    'U' => hex(8, &mut chars)?,
                    _ => return None,
                });
            }
            c => out.push(c),
        }
    }
    None
}

/// Secrets as names, types and keys ([`KEYS_ONLY_TEMPLATE`]'s lines: Go-
/// quoted fields). A line that is not that form is refused whole: only
/// quoted strings, one space apart, can pass.
fn keys_only(op: &ReadOp, stdout: &[u8], cut: bool) -> Result<(String, Value), String> {
    let text = std::str::from_utf8(stdout).map_err(|_| "not UTF-8".to_string())?;
    let mut items = Vec::new();
    let mut used = 2;
    let mut omitted = 0;
    for line in text.split('\n').filter(|l| !l.is_empty()) {
        let mut fields = Vec::new();
        let mut rest = line;
        loop {
            let (v, r) = go_unquoted(rest).ok_or_else(|| {
                "a line that is not a Secret's quoted name, type and keys".to_string()
            })?;
            fields.push(v);
            if r.is_empty() {
                break;
            }
            rest = r.strip_prefix(' ').ok_or_else(|| {
                "a line that is not a Secret's quoted name, type and keys".to_string()
            })?;
        }
        if fields.len() < 2 {
            return Err("a line that is not a Secret's name and type".into());
        }
        let shown = |f: &str| gateway_base::text::escaped(cut_to(f, 253, false), true);
        let mut m = Map::new();
        m.insert("name".into(), shown(&fields[0]).into());
        m.insert("type".into(), shown(&fields[1]).into());
        m.insert(
            "keys".into(),
            json!(fields[2..].iter().map(|k| shown(k)).collect::<Vec<_>>()),
        );
        let item = Value::Object(m);
        let n = item.to_string().len() + 1;
        if used + n > op.cap() {
            omitted += 1;
            continue;
        }
        used += n;
        items.push(item);
    }
    let truncated = cut || omitted > 0;
    let mut summary = format!(
        "{} secret(s) in {} (names and keys only, never values)",
        items.len() + omitted,
        op.namespace
    );
    for i in &items {
        summary.push_str(&format!(
            "\n{} ({}): {}",
            i["name"].as_str().unwrap_or(""),
            i["type"].as_str().unwrap_or(""),
            i["keys"]
                .as_array()
                .map(|k| k
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(", "))
                .unwrap_or_default()
        ));
    }
    if truncated {
        summary.push_str("\n[truncated]");
    }
    Ok((
        summary,
        json!({"items": items, "object": op.object(), "values": "hidden", "truncated": truncated, "omitted": omitted}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(v: Value) -> Result<ReadOp, String> {
        let mut base = json!({"verb": "get", "namespace": "demo-app", "group": "apps",
            "resource": "deployments", "kind": "Deployment", "name": "", "container": "",
            "tail_lines": 200, "since_seconds": 0, "previous": false, "values": "shown",
            "result_bytes": 65536});
        for (k, x) in v.as_object().expect("object") {
            base[k] = x.clone();
        }
        ReadOp::from_decision(Some(&base), "demo-app")
    }

    fn argv(o: &ReadOp) -> Vec<String> {
        o.steps("/in/kubeconfig").remove(0).argv[6..].to_vec()
    }

    #[test]
    fn each_verb_is_one_kubectl_command_in_the_credentials_namespace() {
        let get = op(json!({})).expect("get");
        assert_eq!(argv(&get), ["get", "deployments.apps", "--output", "json"]);
        let head = &get.steps("/in/kubeconfig")[0].argv[..6];
        assert_eq!(
            head,
            [
                KUBECTL,
                "--kubeconfig",
                "/in/kubeconfig",
                "--namespace",
                "demo-app",
                "--request-timeout=30s"
            ]
        );
        let logs = op(
            json!({"verb": "logs", "group": "", "resource": "pods", "kind": "Pod",
            "name": "web-1", "container": "app", "tail_lines": 50, "since_seconds": 600,
            "previous": true, "result_bytes": 1000}),
        )
        .expect("logs");
        assert_eq!(
            argv(&logs),
            [
                "logs",
                "pods/web-1",
                "--tail=50",
                "--container",
                "app",
                "--since=600s",
                "--previous"
            ]
        );
        let ev = op(json!({"verb": "events", "group": "", "resource": "pods", "kind": "Pod", "name": "web-1"}))
            .expect("events");
        assert_eq!(
            argv(&ev),
            [
                "get",
                "events",
                "--output",
                "json",
                "--field-selector",
                "involvedObject.kind=Pod,involvedObject.name=web-1"
            ]
        );
        let st = op(json!({"verb": "rollout_status", "name": "web"})).expect("status");
        assert_eq!(
            argv(&st),
            ["rollout", "status", "deployments.apps/web", "--watch=false"]
        );
        let secrets = op(json!({"group": "", "resource": "secrets", "kind": "Secret"})).expect("s");
        assert_eq!(argv(&secrets)[..3], ["get", "secrets", "--output"]);
        assert!(argv(&secrets)[3].starts_with("go-template="));
    }

    #[test]
    fn an_operation_that_could_smuggle_a_flag_or_leave_its_namespace_is_refused() {
        for (bad, why) in [
            (json!({"name": "--raw=/api"}), "not an object name"),
            (json!({"name": "-v9"}), "not an object name"),
            (json!({"namespace": "kube-system"}), "credential is scoped"),
            (json!({"verb": "exec"}), "no verb"),
            (json!({"resource": "pods/exec"}), "not a resource"),
            (json!({"group": "--kubeconfig=/x"}), "not a resource"),
            (
                json!({"verb": "logs", "name": "p", "container": "--previous=x"}),
                "container",
            ),
            (json!({"verb": "describe"}), "needs an object's name"),
            (
                json!({"verb": "logs", "resource": "deployments", "name": "web"}),
                "a pod's",
            ),
            (json!({"tail_lines": 2.5}), "whole number"),
            (json!({"extra": 1}), "malformed"),
            (json!({"values": "maybe"}), "neither"),
            (
                json!({"verb": "describe", "group": "", "resource": "secrets", "kind": "Secret", "name": "db"}),
                "only listed",
            ),
            (
                json!({"verb": "describe", "group": "", "resource": "secret", "kind": "Secret", "name": "db"}),
                "only listed",
            ),
            (
                json!({"group": "", "resource": "secrets.v1.", "kind": "Secret"}),
                "not a resource",
            ),
            (
                json!({"group": "apps.", "resource": "deployments"}),
                "not a resource",
            ),
        ] {
            let e = op(bad.clone()).expect_err(&bad.to_string());
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert!(ReadOp::from_decision(None, "demo-app").is_err());
        assert!(ReadOp::from_decision(Some(&Value::Null), "demo-app").is_err());
        assert_eq!(op(json!({"tail_lines": 5.0})).expect("5.0").tail_lines, 5);
    }

    #[test]
    fn objects_lose_managed_fields_and_last_applied_and_fit_the_cap() {
        let o = op(json!({"result_bytes": 250})).expect("op");
        let item = |n: &str| {
            json!({"kind": "Deployment", "metadata": {"name": n,
            "managedFields": [{"manager": "kubectl"}],
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"big\":1}", "keep": "me"}},
            "spec": {"replicas": 2}})
        };
        let list = json!({"kind": "List", "items": [item("a"), item("b"), item("c"), item("d")]});
        let r = read_result(&o, list.to_string().as_bytes(), false).expect("read");
        let items = r.result["items"].as_array().expect("items");
        assert!(!items.is_empty() && items.len() < 4, "{}", r.result);
        assert!(items[0]["metadata"].get("managedFields").is_none());
        assert_eq!(items[0]["metadata"]["annotations"], json!({"keep": "me"}));
        assert_eq!(r.result["truncated"], true);
        assert_eq!(r.result["omitted"], 4 - items.len());
        assert!(r.summary.contains("[truncated"), "{}", r.summary);
        assert!(serde_json::to_vec(&r.result["items"]).expect("j").len() <= 250);
        // The audit keeps the size and digest, not the objects.
        assert!(!r.audited.to_string().contains("replicas"), "{}", r.audited);
        assert_eq!(r.audited["sha256"].as_str().map(str::len), Some(64));
        // One object (get NAME) is a list of one.
        let one = read_result(&o, item("a").to_string().as_bytes(), false).expect("one");
        assert_eq!(one.result["items"][0]["metadata"]["name"], "a");
        // Cut JSON is refused with the reason, not parsed.
        let e = read_result(&o, b"{\"items\": [", true).expect_err("cut");
        assert!(e.contains("output cap"), "{e}");
    }

    #[test]
    fn text_is_escaped_and_capped() {
        let o = op(json!({"verb": "logs", "group": "", "resource": "pods", "name": "p", "result_bytes": 20}))
            .expect("op");
        let r = read_result(
            &o,
            b"line one \x1b[2Jcleared\nline two is long enough",
            false,
        )
        .expect("text");
        let t = r.result["text"].as_str().expect("text");
        assert!(!t.contains('\x1b'), "{t:?}");
        assert!(t.contains("[truncated"), "{t:?}");
        assert_eq!(r.result["truncated"], true);
        assert!(
            r.summary.starts_with("pods/p in demo-app:"),
            "{}",
            r.summary
        );
    }

    #[test]
    fn secrets_are_names_types_and_keys_and_nothing_else_passes() {
        // Whatever the policy says, a Secret's values stay in the sandbox.
        let o =
            op(json!({"group": "", "resource": "secrets", "kind": "Secret", "values": "shown"}))
                .expect("op");
        assert!(o.values_hidden());
        let r = read_result(
            &o,
            br#""db" "Opaque" "password" "user"
"tls" "kubernetes.io/tls" "tls.crt" "tls.key"
"#,
            false,
        )
        .expect("keys");
        assert_eq!(
            r.result["items"],
            json!([{"name": "db", "type": "Opaque", "keys": ["password", "user"]},
                   {"name": "tls", "type": "kubernetes.io/tls", "keys": ["tls.crt", "tls.key"]}])
        );
        // A Secret's type is free text: with a space, a newline and quotes
        // it stays one field of one Secret (never a forged second line).
        let odd = read_result(
            &o,
            br#""db" "a b\n\"x\" \"y\"" "k"
"#,
            false,
        )
        .expect("quoted");
        assert_eq!(
            odd.result["items"].as_array().map(Vec::len),
            Some(1),
            "{}",
            odd.result
        );
        assert_eq!(odd.result["items"][0]["keys"], json!(["k"]));
        assert_eq!(odd.result["items"][0]["type"], "a b\\n\"x\" \"y\"");
        // A line that is not quoted names and keys (a value, JSON) is refused.
        for bad in [
            &b"db Opaque password\n"[..],
            b"{\"data\": {\"p\": \"x\"}}\n",
            b"\"db\"\n",
            b"\"db\" \"Opaque\" cGFzcw==\n",
            b"\"db\" \"Opaque\"  \"k\"\n",
        ] {
            assert!(read_result(&o, bad, false).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn events_are_rows_oldest_first() {
        let o = op(json!({"verb": "events", "group": "", "resource": "", "kind": ""})).expect("op");
        let list = json!({"kind": "List", "items": [
            {"lastTimestamp": "2026-01-01T00:00:05Z", "type": "Warning", "reason": "BackOff",
             "involvedObject": {"kind": "Pod", "name": "web-1"}, "message": "Back-off \u{1b}[1m restarting", "count": 7},
            {"lastTimestamp": "2026-01-01T00:00:01Z", "type": "Normal", "reason": "Pulled",
             "involvedObject": {"kind": "Pod", "name": "web-1"}, "message": "pulled"}]});
        let r = read_result(&o, list.to_string().as_bytes(), false).expect("events");
        let ev = r.result["events"].as_array().expect("rows");
        assert_eq!(ev[0]["reason"], "Pulled");
        assert_eq!(ev[1]["count"], 7);
        assert!(!r.summary.contains('\x1b'));
        assert!(
            r.summary.contains("Warning BackOff Pod/web-1 (x7)"),
            "{}",
            r.summary
        );
    }
}
