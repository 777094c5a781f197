//! Notify: when a call stops at the approval gate, tell the people who can
//! approve it, through the notifiers the policy names
//! (`data.gateway.approvals.notifiers`):
//!
//! - `{"webhook": URL}`: an HTTP POST of a JSON body whose `text` field is
//!   a one-line summary (what a Slack, Mattermost or Teams incoming webhook
//!   shows) and whose `approval` field has the details;
//! - `{"webhook_file": PATH}`: the same, to the URL held in PATH, a file
//!   only its owner can read (policy data is readable by everyone, and a
//!   Slack URL is its own secret);
//! - `{"command": [ARGV…]}`: the command run with that JSON on stdin, no
//!   shell, an empty environment but `PATH`.
//!
//! Each runs in its own task, bounded by its `timeout_seconds` (the
//! policy's `notify_timeout_seconds` unless the entry gives one); an outcome is audited
//! (`approval.notified` / `approval.notify_failed`) and never holds up or
//! fails the call. A webhook URL often carries a secret (Slack's does), so
//! only its scheme and host are ever written down.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use gateway_audit::approvals::Approval;
use gateway_audit::audit::{AuditLog, Event};

/// How long one notifier may take when the policy's entry does not say.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The most output read back from a command notifier (then discarded).
const MAX_COMMAND_OUTPUT: u64 = 64 * 1024;

#[derive(Debug, Clone, PartialEq)]
pub enum Notifier {
    Webhook(String),
    WebhookFile(std::path::PathBuf),
    Command(Vec<String>),
}

/// The longest webhook URL file read.
const MAX_URL_FILE: u64 = 4096;

/// The URL in a `webhook_file`: a regular file of this process's user,
/// readable by it alone, in a dir no one else can write; opened without
/// following a link or blocking on a FIFO.
fn url_from_file(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let me = nix::unistd::geteuid().as_raw();
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .ok_or_else(|| format!("{} is not an absolute path", path.display()))?;
    let dm = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !dm.is_dir() || (dm.uid() != me && dm.uid() != 0) || dm.mode() & 0o022 != 0 {
        return Err(format!(
            "{} must be a dir of root's or this user's that no one else can write",
            dir.display()
        ));
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let m = f.metadata().map_err(|e| e.to_string())?;
    if !m.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    if m.uid() != me {
        return Err(format!("{} is not this user's (uid {me})", path.display()));
    }
    if m.mode() & 0o077 != 0 {
        return Err(format!(
            "{} is readable or writable by others (mode {:o}): chmod 600 it",
            path.display(),
            m.mode() & 0o777
        ));
    }
    let mut text = String::new();
    f.take(MAX_URL_FILE)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(text.trim().to_string())
}

impl Notifier {
    /// What the audit calls it: never a URL's path or query.
    pub fn label(&self) -> String {
        match self {
            Notifier::Webhook(url) => match reqwest::Url::parse(url) {
                Ok(u) => format!("webhook {}://{}", u.scheme(), u.host_str().unwrap_or("?")),
                Err(_) => "webhook (unparsable URL)".into(),
            },
            Notifier::WebhookFile(p) => format!("webhook (URL in {})", p.display()),
            Notifier::Command(argv) => format!(
                "command {}",
                argv.first().map(String::as_str).unwrap_or("?")
            ),
        }
    }
}

/// The notifiers in the policy's list, each with how long it may take; an
/// entry that is none of the kinds is reported (as an error string) and
/// skipped.
pub fn parse(list: &Value) -> (Vec<(Notifier, Duration)>, Vec<String>) {
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for (i, n) in list.as_array().into_iter().flatten().enumerate() {
        let timeout = match n.get("timeout_seconds") {
            None => TIMEOUT,
            Some(t) => match t.as_u64().filter(|s| *s > 0) {
                Some(s) => Duration::from_secs(s),
                None => {
                    bad.push(format!(
                        "notifier {i}: timeout_seconds is not a positive integer"
                    ));
                    continue;
                }
            },
        };
        if let Some(url) = n.get("webhook").and_then(Value::as_str) {
            ok.push((Notifier::Webhook(url.to_string()), timeout));
        } else if let Some(p) = n.get("webhook_file").and_then(Value::as_str) {
            ok.push((Notifier::WebhookFile(p.into()), timeout));
        } else if let Some(argv) = n.get("command").and_then(Value::as_array) {
            let argv: Vec<String> = argv
                .iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect();
            if argv.is_empty() {
                bad.push(format!("notifier {i}: an empty command"));
            } else {
                ok.push((Notifier::Command(argv), timeout));
            }
        } else {
            bad.push(format!(
                "notifier {i}: not {{\"webhook\": URL}}, {{\"webhook_file\": PATH}} or {{\"command\": [ARGV]}}"
            ));
        }
    }
    (ok, bad)
}

/// The body every notifier gets. Every string in it came, or may have come,
/// from the agent (params, its client's name) or the module (signal
/// messages, addresses): each field is escaped on its own
/// ([`gateway_base::text::markup_escaped_json`]: no markup, mention or link, no
/// control or bidi character), not only `text`, since a consumer may show
/// any field. Consumers must still treat the payload as untrusted.
pub fn body(a: &Approval, review_url: Option<&str>) -> Value {
    let signals = a.signals.as_array().map(Vec::len).unwrap_or(0);
    let changes = a.plan_summary.as_array().map(Vec::len).unwrap_or(0);
    let params = gateway_audit::audit::scrub::scrub(&a.params);
    // One line on what is destructive: each signal kind and how often.
    let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
    for s in a.signals.as_array().into_iter().flatten() {
        *kinds
            .entry(s["kind"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
    }
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let review = match review_url {
        Some(u) => format!(
            "Review and decide at {u} (or `gateway approvals show {}`)",
            a.id
        ),
        None => format!("Review with `gateway approvals show {}`", a.id),
    };
    let text = format!(
        "gateway: approval {} requested by {} for {} {}: {} planned change(s), {} destructive signal(s){}. {review}; it expires at {}.",
        a.id,
        a.requested_by,
        a.tool,
        params,
        changes,
        signals,
        if kinds.is_empty() {
            String::new()
        } else {
            format!(" ({})", kinds.join(", "))
        },
        a.expires_at
    );
    json!({
        "text": gateway_base::text::markup_escaped(&text),
        "approval": gateway_base::text::markup_escaped_json(&json!({
            "id": a.id, "tool": a.tool, "params": params,
            "requested_by": a.requested_by, "client": a.requested_client,
            "plan_sha256": a.plan_sha256, "changes": changes, "signals": a.signals,
            "approvers_required": a.approvers_required, "expires_at": a.expires_at,
            "show": format!("gateway approvals show {}", a.id),
        })),
        // The gateway's own URL (from its configuration, never from the
        // plan or the agent): the one link a consumer may make clickable.
        "review_url": review_url,
    })
}

async fn send(n: &Notifier, body: &Value, timeout: Duration) -> Result<(), String> {
    let from_file;
    let webhook = match n {
        Notifier::Webhook(url) => Some(url.as_str()),
        Notifier::WebhookFile(p) => {
            let p = p.clone();
            from_file = tokio::task::spawn_blocking(move || url_from_file(&p))
                .await
                .map_err(|e| e.to_string())??;
            Some(from_file.as_str())
        }
        Notifier::Command(_) => None,
    };
    match (n, webhook) {
        (_, Some(url)) => {
            // The one TLS provider of the binary (as in main), also when
            // the pipeline runs inside another program: reqwest panics
            // without one.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let client = reqwest::Client::builder()
                .timeout(timeout)
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|e| format!("no HTTP client: {}", e.without_url()))?;
            let r = client
                .post(url)
                .json(body)
                .send()
                .await
                .map_err(|e| e.without_url().to_string())?;
            if r.status().is_success() {
                Ok(())
            } else {
                Err(format!("the webhook answered {}", r.status()))
            }
        }
        (Notifier::Command(argv), _) => {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut child = tokio::process::Command::new(&argv[0])
                .args(&argv[1..])
                .env_clear()
                .env("PATH", "/usr/local/bin:/usr/bin:/bin")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| format!("cannot run it: {e}"))?;
            if let Some(mut stdin) = child.stdin.take() {
                let _ = stdin.write_all(body.to_string().as_bytes()).await;
            }
            if let Some(out) = child.stdout.take() {
                let mut sink = Vec::new();
                let _ = out.take(MAX_COMMAND_OUTPUT).read_to_end(&mut sink).await;
            }
            let status = child.wait().await.map_err(|e| e.to_string())?;
            if status.success() {
                Ok(())
            } else {
                Err(format!("it exited with {status}"))
            }
        }
        (_, None) => Err("not a notifier".into()),
    }
}

/// Tell every notifier about `approval`, each in a task of its own; what
/// became of each is audited. Returns at once.
pub fn spawn(
    audit: Arc<AuditLog>,
    notifiers: Value,
    approval: &Approval,
    review_url: Option<String>,
) {
    let (list, bad) = parse(&notifiers);
    let rid = approval.request_id.clone();
    let id = approval.id.clone();
    for error in bad {
        let _ = audit.record(
            &rid,
            Event::ApprovalNotifyFailed {
                approval_id: id.clone(),
                notifier: "policy".into(),
                error,
            },
        );
    }
    if list.is_empty() {
        return;
    }
    let body = body(approval, review_url.as_deref());
    for (n, timeout) in list {
        let (audit, body, rid, id) = (audit.clone(), body.clone(), rid.clone(), id.clone());
        tokio::spawn(async move {
            let outcome = match tokio::time::timeout(timeout, send(&n, &body, timeout)).await {
                Ok(r) => r,
                Err(_) => Err(format!("no answer within {}s", timeout.as_secs())),
            };
            let event = match outcome {
                Ok(()) => Event::ApprovalNotified {
                    approval_id: id,
                    notifier: n.label(),
                },
                Err(error) => {
                    tracing::warn!("notifier {} failed for {id}: {error}", n.label());
                    Event::ApprovalNotifyFailed {
                        approval_id: id,
                        notifier: n.label(),
                        error,
                    }
                }
            };
            let _ = audit.record(&rid, event);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_links_the_page_and_sums_up_the_signals_in_one_line() {
        let dir = tempfile::tempdir().expect("dir");
        let store = gateway_audit::approvals::ApprovalStore::in_home(dir.path()).expect("store");
        let sig = |kind: &str| json!({"address": "<!channel> a.b", "kind": kind, "actions": ["delete"], "reason": null, "paths": [], "message": "m"});
        let (a, _) = store
            .create(&gateway_audit::approvals::NewApproval {
                tool: "terraform_apply".into(),
                params: json!({"working_dir": "m"}),
                plan_sha256: None,
                plan_summary: json!([]),
                signals: json!([sig("delete"), sig("replace"), sig("delete")]),
                request_id: "r".into(),
                requested_by: "alice".into(),
                requested_client: "c".into(),
                requester: Value::Null,
                approvers_required: 1,
                ttl: Duration::from_secs(60),
                reason_required: false,
            })
            .expect("create");
        let url = format!("https://gw.example/approvals/{}", a.id);
        let b = body(&a, Some(&url));
        let text = b["text"].as_str().expect("text");
        assert!(text.contains("(2 delete, 1 replace)"), "{text}");
        assert!(
            text.contains(&format!("Review and decide at {url}")),
            "{text}"
        );
        assert_eq!(b["review_url"], url.as_str());
        assert!(!b.to_string().contains("<!channel>"), "{b}");
        let b = body(&a, None);
        assert_eq!(b["review_url"], Value::Null);
        assert!(
            b["text"]
                .as_str()
                .is_some_and(|t| t.contains("Review with `gateway approvals show"))
        );
    }

    #[test]
    fn labels_never_carry_a_webhook_path() {
        let n = Notifier::Webhook("https://hooks.slack.com/services/T000/B000/XXXXSECRET".into());
        assert_eq!(n.label(), "webhook https://hooks.slack.com");
        assert_eq!(
            Notifier::Command(vec!["/usr/bin/notify-send".into(), "x".into()]).label(),
            "command /usr/bin/notify-send"
        );
    }

    #[test]
    fn a_webhook_file_must_be_a_private_regular_file_of_this_user() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tmp");
        let good = dir.path().join("url");
        std::fs::write(&good, "http://127.0.0.1:9/x\n").expect("write");
        std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert_eq!(url_from_file(&good).as_deref(), Ok("http://127.0.0.1:9/x"));
        // A FIFO is refused at once (opening it does not wait for a writer).
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        assert!(url_from_file(&fifo).is_err_and(|e| e.contains("not a regular file")));
        // A link to the good file is not followed.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&good, &link).expect("symlink");
        assert!(url_from_file(&link).is_err_and(|e| e.contains("cannot open")));
        // Readable by others.
        std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        assert!(url_from_file(&good).is_err_and(|e| e.contains("readable or writable by others")));
        std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        // In a dir others can write.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
        assert!(url_from_file(&good).is_err_and(|e| e.contains("no one else can write")));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        // Another user's file (when the test can make one).
        if nix::unistd::geteuid().is_root() {
            nix::unistd::chown(&good, Some(nix::unistd::Uid::from_raw(65534)), None)
                .expect("chown");
            assert!(url_from_file(&good).is_err_and(|e| e.contains("is not this user's")));
        }
    }

    #[test]
    fn the_policy_list_is_read_and_bad_entries_reported() {
        let (ok, bad) = parse(&json!([
            {"webhook": "http://x/", "timeout_seconds": 3},
            {"command": ["a", "b"]},
            {"command": []},
            {"email": "x"},
            {"webhook": "http://y/", "timeout_seconds": 0}
        ]));
        assert_eq!(
            ok,
            vec![
                (
                    Notifier::Webhook("http://x/".into()),
                    Duration::from_secs(3)
                ),
                (Notifier::Command(vec!["a".into(), "b".into()]), TIMEOUT)
            ]
        );
        assert_eq!(bad.len(), 3);
        assert_eq!(
            gateway_base::text::markup_escaped("<!channel> & <http://evil|ok>"),
            "&lt;!channel&gt; &amp; &lt;http://evil|ok&gt;"
        );
    }
}
