//! The approval gate, as an ordinary test: no root, no gVisor, no
//! Terraform. The pipeline runs with a scripted fake sandbox
//! (tests/support/scripted_sandbox.rs) that answers each sandbox as a real
//! one would and records what it was asked. The real policies, approval
//! store, audit log, module handling and plan-file checks run unchanged.
//!
//! The flow: apply without an approval plans and stops at a pending
//! approval (nothing applied); another person approves; an apply with other
//! params, or with the saved plan file changed on disk, is refused and
//! spends nothing; the apply with the approval applies exactly the bytes of
//! the plan that was approved (no fresh plan); the same approval again is
//! refused.

mod common;
#[path = "support/scripted_sandbox.rs"]
mod scripted_sandbox;

use std::sync::Arc;

use gateway::pipeline::{Outcome, Pipeline, ToolCall};
use gateway::policy::{PolicyStore, Principal};
use scripted_sandbox::{Phase, ScriptedSandbox};
use serde_json::{Value, json};

const MODULE: &str = "terraform/offline-demo";
const STATE_AFTER: &str = r#"{"version": 4, "terraform_version": "1.15.5", "serial": 3, "lineage": "6f1c-lineage",
 "outputs": {}, "resources": [{"mode": "managed", "type": "terraform_data", "name": "web",
 "provider": "provider[\"terraform.io/builtin/terraform\"]",
 "instances": [{"schema_version": 0, "attributes": {"id": "new-id"}}]}]}"#;

struct World {
    _dirs: Vec<tempfile::TempDir>,
    home: std::path::PathBuf,
    policies: std::path::PathBuf,
    keys: std::path::PathBuf,
    policy: Arc<PolicyStore>,
    module: std::path::PathBuf,
    sandbox: Arc<ScriptedSandbox>,
    pipeline: std::sync::Arc<Pipeline>,
}

fn world() -> World {
    world_with(&[])
}

/// A world whose policies name bob and carol's keys as allowed signers
/// (and `edits` to them).
fn world_with(edits: &[(&str, &str, &str)]) -> World {
    let keys = tempfile::tempdir().expect("keys");
    let bob = common::ssh_key(keys.path(), "bob");
    let carol = common::ssh_key(keys.path(), "carol");
    let alice = common::ssh_key(keys.path(), "alice");
    let policies = common::policies_with_signers(
        &[("bob", &bob), ("carol", &carol), ("alice", &alice)],
        edits,
    );
    let home = tempfile::tempdir().expect("home");
    let workspace = tempfile::tempdir().expect("workspace");
    let module = workspace.path().join(MODULE);
    std::fs::create_dir_all(&module).expect("mkdir");
    std::fs::copy(
        common::repo().join(MODULE).join("main.tf"),
        module.join("main.tf"),
    )
    .expect("copy main.tf");
    // A second allowed module, so that an approval presented with its
    // working_dir gets as far as the approval's binding.
    let other = workspace.path().join("terraform/k8s-demo");
    std::fs::create_dir_all(&other).expect("mkdir");
    std::fs::write(other.join("main.tf"), "").expect("write");
    // A plan that replaces a resource: destructive, and terraform_apply is
    // high tier anyway.
    let sandbox = Arc::new(scripted_sandbox::demo_script(
        "replace",
        STATE_AFTER.as_bytes().to_vec(),
    ));
    let (store, pipeline) = scripted_sandbox::pipeline(
        policies.path(),
        home.path(),
        workspace.path(),
        sandbox.clone(),
    );
    World {
        home: home.path().to_path_buf(),
        policies: policies.path().to_path_buf(),
        keys: keys.path().to_path_buf(),
        policy: store,
        module,
        sandbox,
        pipeline: std::sync::Arc::new(pipeline),
        _dirs: vec![home, workspace, policies, keys],
    }
}

impl World {
    /// `gateway approve|deny ID` by the real binary, signed with `key`'s
    /// SSH key (`None`: unsigned, as this OS user).
    fn verdict(
        &self,
        verb: &str,
        id: &str,
        key: Option<&str>,
        reason: &str,
    ) -> std::process::Output {
        let mut cmd = common::gateway(&self.home);
        cmd.arg("--policies")
            .arg(&self.policies)
            .args([verb, id, "--reason", reason]);
        match key {
            Some(k) => cmd.arg("--key").arg(self.keys.join(k)),
            None => cmd.arg("--no-sign"),
        };
        cmd.output().expect("gateway approve")
    }

    fn approve(&self, id: &str, key: &str, reason: &str) {
        let out = self.verdict("approve", id, Some(key), reason);
        assert!(
            out.status.success(),
            "{}{}",
            common::stdout(&out),
            common::stderr(&out)
        );
    }

    /// terraform_apply with `params`, as the agent alice.
    async fn apply(&self, params: Value) -> gateway::pipeline::CallResult {
        self.apply_as("alice", 1000, params).await
    }

    async fn apply_as(&self, user: &str, uid: u32, params: Value) -> gateway::pipeline::CallResult {
        let call = ToolCall {
            trace: None,
            tool: "terraform_apply".into(),
            params,
            principal: Principal::os_user("test-agent".into(), user.into(), uid, vec![]),
            workspace: None,
        };
        self.pipeline.call(call).await.expect("call")
    }
}

fn refused(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Refused { reason } => reason.clone(),
        Outcome::Denied { reasons, .. } => reasons.join("; "),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn the_approval_gate_applies_exactly_the_approved_plan() {
    let w = world();

    // 1. No approval: plan, show, then a pending approval; nothing applied.
    let r = w.apply(json!({"working_dir": MODULE})).await;
    let Outcome::PendingApproval {
        approval_id,
        signals,
        approve_command,
        ..
    } = &r.outcome
    else {
        panic!("expected a pending approval, got {:?}", r.outcome);
    };
    assert_eq!(w.sandbox.phases(), vec![Phase::Plan, Phase::Show]);
    assert!(
        signals
            .as_array()
            .is_some_and(|s| s.iter().any(|x| x["kind"] == "replace")),
        "{signals}"
    );
    assert!(approve_command.contains(approval_id.as_str()));
    assert!(
        !w.module.join("terraform.tfstate").exists(),
        "nothing applied"
    );
    let plan_sandbox = &w.sandbox.seen()[0];
    assert!(
        !plan_sandbox.credential,
        "the offline module gets no credential"
    );
    let saved = w
        .home
        .join("plans")
        .join(format!("{}.tfplan", r.request_id));
    let approved_bytes = std::fs::read(&saved).expect("the saved plan file");

    // 2. Someone else approves it, by signing with their key (the
    // requester may not, even with a key of its own in the list).
    let own = w.verdict("approve", approval_id, Some("alice"), "looks fine");
    assert!(
        !own.status.success()
            && common::stderr(&own).contains("alice requested this call and cannot approve it"),
        "the requester approved their own call: {}",
        common::stderr(&own)
    );
    w.approve(approval_id, "bob", "replacing web is intended");

    // 3. Another user presents alice's approval: refused, nothing run,
    // the approval stays usable.
    let before = w.sandbox.seen().len();
    let stolen = w
        .apply_as(
            "mallory",
            1001,
            json!({"working_dir": MODULE, "approval_id": approval_id}),
        )
        .await;
    let why = refused(&stolen.outcome);
    assert!(
        why.contains("requested by alice; only that user's calls"),
        "{why}"
    );
    assert_eq!(
        w.sandbox.seen().len(),
        before,
        "a refused call ran a sandbox"
    );

    // 3b. The approval with other params: refused, nothing run.
    let r2 = w
        .apply(json!({"working_dir": "terraform/k8s-demo", "approval_id": approval_id}))
        .await;
    let why = refused(&r2.outcome);
    assert!(!why.is_empty());
    assert_eq!(
        w.sandbox.seen().len(),
        before,
        "a refused call ran a sandbox"
    );

    // 4. The saved plan file changed on disk: refused, approval not spent.
    std::fs::write(&saved, b"another plan").expect("tamper");
    let r3 = w
        .apply(json!({"working_dir": MODULE, "approval_id": approval_id}))
        .await;
    let why = refused(&r3.outcome);
    assert!(
        why.contains("digest") || why.contains("changed"),
        "refused for the plan file: {why}"
    );
    assert_eq!(
        w.sandbox.seen().len(),
        before,
        "a refused call ran a sandbox"
    );
    std::fs::write(&saved, &approved_bytes).expect("restore");

    // 5. With the approval: exactly the approved plan's bytes are applied,
    // and no fresh plan is made.
    let r4 = w
        .apply(json!({"working_dir": MODULE, "approval_id": approval_id}))
        .await;
    let Outcome::Completed { ok, summary, .. } = &r4.outcome else {
        panic!("expected the apply to complete, got {:?}", r4.outcome);
    };
    assert!(*ok, "{summary}");
    assert!(summary.contains("1 added"), "{summary}");
    let seen = w.sandbox.seen();
    assert_eq!(
        seen.len(),
        before + 1,
        "one sandbox: the apply, no new plan"
    );
    let applied = seen.last().expect("apply");
    assert_eq!(applied.phase, Phase::Apply);
    assert_eq!(
        applied.steps,
        gateway::tools::terraform_apply_steps(&gateway::tools::plan_inside("plan.tfplan")),
        "the apply sandbox ran init and the apply of the given plan file, no plan of its own"
    );
    assert_eq!(
        applied.files_in.get("plan.tfplan"),
        Some(&approved_bytes),
        "the apply got exactly the approved plan file"
    );
    let state = std::fs::read_to_string(w.module.join("terraform.tfstate")).expect("state back");
    assert!(state.contains("6f1c-lineage"));

    // 6. The same call with the same approval again: that apply's
    // outcome, read back from the approval (the client may have gone away
    // while it ran); nothing runs again.
    let r5 = w
        .apply(json!({"working_dir": MODULE, "approval_id": approval_id}))
        .await;
    let Outcome::Completed {
        ok: true, summary, ..
    } = &r5.outcome
    else {
        panic!("expected the spent apply's outcome, got {:?}", r5.outcome);
    };
    assert!(
        summary.contains("was spent by request") && summary.contains("1 added"),
        "{summary}"
    );
    assert_eq!(w.sandbox.seen().len(), before + 1);
    // Another user with it: refused, not shown another's outcome.
    let r6 = w
        .apply_as(
            "mallory",
            1001,
            json!({"working_dir": MODULE, "approval_id": approval_id}),
        )
        .await;
    assert!(
        refused(&r6.outcome).contains("only that user"),
        "{:?}",
        r6.outcome
    );
    assert_eq!(w.sandbox.seen().len(), before + 1);
}

#[tokio::test]
async fn a_denied_approval_applies_nothing() {
    let w = world();
    let r = w.apply(json!({"working_dir": MODULE})).await;
    let Outcome::PendingApproval { approval_id, .. } = &r.outcome else {
        panic!("expected a pending approval, got {:?}", r.outcome);
    };
    let out = w.verdict("deny", approval_id, Some("bob"), "not today");
    assert!(out.status.success(), "{}", common::stderr(&out));
    let r2 = w
        .apply(json!({"working_dir": MODULE, "approval_id": approval_id}))
        .await;
    refused(&r2.outcome);
    assert_eq!(w.sandbox.phases(), vec![Phase::Plan, Phase::Show]);
    assert!(!w.module.join("terraform.tfstate").exists());
}

use common::{audit_events as events, pending_approval as pending};

/// The call applied its plan.
fn applied(r: &gateway::pipeline::CallResult) {
    assert!(
        matches!(r.outcome, Outcome::Completed { ok: true, .. }),
        "{:?}",
        r.outcome
    );
}

#[tokio::test]
async fn a_re_plan_supersedes_the_older_approval_even_once_approved() {
    let w = world();
    let first = pending(&w.apply(json!({"working_dir": MODULE})).await);
    w.approve(&first, "bob", "replacing web is intended");
    // The agent plans again: the approver never approves, and the agent
    // never spends, a stale plan.
    let second = pending(&w.apply(json!({"working_dir": MODULE})).await);
    assert_ne!(first, second);
    let before = w.sandbox.seen().len();
    let r = w
        .apply(json!({"working_dir": MODULE, "approval_id": first}))
        .await;
    let why = refused(&r.outcome);
    assert!(
        why.contains(&format!("was superseded by {second}")),
        "{why}"
    );
    assert_eq!(w.sandbox.seen().len(), before, "nothing ran");
    let late = w.verdict("approve", &first, Some("carol"), "late");
    assert!(
        common::stderr(&late).contains("superseded"),
        "{}",
        common::stderr(&late)
    );
    let superseded: Vec<Value> = events(&w.home)
        .into_iter()
        .filter(|e| e["event"] == "approval.superseded")
        .collect();
    assert_eq!(superseded.len(), 1, "{superseded:?}");
    assert_eq!(superseded[0]["data"]["approval_id"], first.as_str());
    assert_eq!(superseded[0]["data"]["superseded_by"], second.as_str());
    // The newer one works as any other.
    w.approve(&second, "bob", "this plan");
    let r = w
        .apply(json!({"working_dir": MODULE, "approval_id": second}))
        .await;
    applied(&r);
}

#[tokio::test]
async fn a_key_taken_off_the_allowed_signers_no_longer_counts() {
    let w = world();
    let id = pending(&w.apply(json!({"working_dir": MODULE})).await);
    w.approve(&id, "bob", "ok then");
    // bob's key is removed from the policy before the apply.
    let file = w.policies.join("config/approvers/data.yaml");
    let text = std::fs::read_to_string(&file).expect("read");
    let kept: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("bob "))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&file, kept).expect("write");
    w.policy.poll();
    assert!(w.policy.poll().is_some(), "the edited policy loads");
    let before = w.sandbox.seen().len();
    let r = w
        .apply(json!({"working_dir": MODULE, "approval_id": id}))
        .await;
    let why = refused(&r.outcome);
    assert!(
        why.contains("does not meet the policy's requirement now"),
        "{why}"
    );
    assert_eq!(w.sandbox.seen().len(), before, "nothing ran");
}

#[tokio::test]
async fn two_approvers_means_two_keys_through_the_whole_gate() {
    let w = world_with(&[(
        "config/approvals/data.yaml",
        "destructive:\n  approvers: 1",
        "destructive:\n  approvers: 2",
    )]);
    let id = pending(&w.apply(json!({"working_dir": MODULE})).await);
    w.approve(&id, "bob", "one");
    let r = w
        .apply(json!({"working_dir": MODULE, "approval_id": id}))
        .await;
    assert!(refused(&r.outcome).contains("1 of 2"), "{:?}", r.outcome);
    w.approve(&id, "carol", "two");
    let r = w
        .apply(json!({"working_dir": MODULE, "approval_id": id}))
        .await;
    applied(&r);
}

/// A one-shot HTTP server on 127.0.0.1: the body of the first request.
fn webhook_receiver() -> (u16, std::sync::mpsc::Receiver<(String, Value)>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Ok((stream, _)) = listener.accept() else {
            return;
        };
        let mut reader = BufReader::new(stream.try_clone().expect("clone"));
        let mut request_line = String::new();
        let _ = reader.read_line(&mut request_line);
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                break;
            }
            if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length];
        let _ = reader.read_exact(&mut body);
        let mut stream = stream;
        let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
        let _ = tx.send((
            request_line,
            serde_json::from_slice(&body).unwrap_or(Value::Null),
        ));
    });
    (port, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_hears_of_each_request_and_a_dead_one_holds_up_nothing() {
    let (port, heard) = webhook_receiver();
    // A port nothing listens on: the dead notifier.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    // The live URL is kept in a file only its owner reads; one readable by
    // others is refused (and named, never read).
    let secrets = tempfile::tempdir().expect("secrets");
    let url_file = secrets.path().join("slack-url");
    std::fs::write(
        &url_file,
        format!("http://127.0.0.1:{port}/services/T0/B0/SECRETPART\n"),
    )
    .expect("write");
    let open_file = secrets.path().join("open-url");
    std::fs::write(&open_file, "http://127.0.0.1:1/OPENSECRET\n").expect("write");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&url_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::fs::set_permissions(&open_file, std::fs::Permissions::from_mode(0o644))
            .expect("chmod");
    }
    let notifiers = format!(
        "notifiers:\n  - webhook_file: {}\n  - webhook_file: {}\n  - webhook: http://127.0.0.1:{dead}/x\n  - command: [/bin/false]\n",
        url_file.display(),
        open_file.display()
    );
    let w = world_with(&[("config/approvals/data.yaml", "notifiers: []\n", &notifiers)]);
    let started = std::time::Instant::now();
    let id = pending(&w.apply(json!({"working_dir": MODULE})).await);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "the call waited for its notifiers"
    );
    let (line, body) = tokio::task::spawn_blocking(move || {
        heard
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("the webhook was called")
    })
    .await
    .expect("join");
    assert!(
        line.starts_with("POST /services/T0/B0/SECRETPART "),
        "{line}"
    );
    let text = body["text"].as_str().expect("a Slack-style text field");
    assert!(
        text.contains(&id)
            && text.contains("requested by alice")
            && text.contains("1 destructive signal(s)"),
        "{text}"
    );
    assert_eq!(body["approval"]["id"], id.as_str());
    assert_eq!(
        body["approval"]["show"],
        format!("gateway approvals show {id}")
    );
    // Each outcome is audited; the webhook's path (its secret) never is.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let outcomes = loop {
        let got: Vec<Value> = events(&w.home)
            .into_iter()
            .filter(|e| e["event"] == "approval.notified" || e["event"] == "approval.notify_failed")
            .collect();
        if got.len() == 4 || std::time::Instant::now() > deadline {
            break got;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(outcomes.len(), 4, "{outcomes:?}");
    let log = std::fs::read_to_string(w.home.join("audit.jsonl")).expect("log");
    assert!(
        !log.contains("SECRETPART") && !log.contains("OPENSECRET"),
        "a webhook URL was logged"
    );
    assert!(outcomes.iter().any(|e| e["event"] == "approval.notified"
        && e["data"]["notifier"] == format!("webhook (URL in {})", url_file.display())));
    assert!(outcomes.iter().any(|e| {
        e["event"] == "approval.notify_failed"
            && e["data"]["error"]
                .as_str()
                .is_some_and(|m| m.contains("readable or writable by others"))
    }));
    assert_eq!(
        outcomes
            .iter()
            .filter(|e| e["event"] == "approval.notify_failed")
            .count(),
        3,
        "{outcomes:?}"
    );
    // The call goes on as usual.
    w.approve(&id, "bob", "ok");
    let r = w
        .apply(json!({"working_dir": MODULE, "approval_id": id}))
        .await;
    applied(&r);
}
