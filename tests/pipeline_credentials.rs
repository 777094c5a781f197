//! The pipeline's credential guarantees, with a test double for the broker
//! (the Vault/OpenBao broker is separate work): a credential is minted only
//! for a call that will run, and revoked on every path — success, tool
//! failure, deadline, cancellation — with retries, and the audit shows
//! `credential.revoked` (or `credential.revoke_failed`) for every
//! `credential.issued`. Everything else is real: policy, gVisor, Terraform,
//! SQLite, the audit file.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gateway::pipeline::{Outcome, Pipeline, ToolCall};
use gateway::policy::set::LoadOptions;
use gateway::policy::{PolicyStore, Principal};
use gateway::sandbox::local::{LocalConfig, LocalSandbox};
use gateway::tools::ToolPaths;
use serde_json::json;

#[path = "support/fake_broker.rs"]
mod fake_broker;
use fake_broker::{FakeBroker, TOKEN};

struct Setup {
    _dirs: Vec<tempfile::TempDir>,
    home: std::path::PathBuf,
    workspace: std::path::PathBuf,
    pipeline: std::sync::Arc<Pipeline>,
    broker: Arc<FakeBroker>,
}

/// The default policies, except that the offline module now needs a
/// (fake) credential scoped to demo-app, and terraform_plan gets `deadline`.
fn setup(deadline: u64, with_broker: bool) -> Setup {
    let deadline = format!("  terraform_plan:\n    deadline_seconds: {deadline}");
    let policies = common::policies_with(&[(
        "config/sandbox/data.yaml",
        "  terraform_plan:\n    deadline_seconds: 300",
        &deadline,
    )]);
    fake_broker::give_the_offline_module_a_credential(policies.path());

    let home = tempfile::tempdir().expect("home");
    let (workspace, _module) = common::workspace_with_module("terraform/offline-demo");
    let store = Arc::new(PolicyStore::open(
        vec![policies.path().to_path_buf()],
        LoadOptions::default(),
    ));
    assert!(store.current().is_ok());
    let sandbox = Arc::new(LocalSandbox::new(LocalConfig::default()).expect("runsc"));
    let mut tools = ToolPaths::discover(&common::repo());
    tools.runner = common::runner_bin();
    let mut pipeline = Pipeline::new(
        store,
        home.path().to_path_buf(),
        workspace.path().to_path_buf(),
        sandbox,
        tools,
    )
    .expect("pipeline");
    fake_broker::reach_a_stand_in_api_server(&mut pipeline);
    let broker = Arc::new(FakeBroker::default());
    if with_broker {
        pipeline.broker = Some(broker.clone());
    }
    Setup {
        home: home.path().to_path_buf(),
        workspace: workspace.path().to_path_buf(),
        _dirs: vec![policies, home, workspace],
        pipeline: std::sync::Arc::new(pipeline),
        broker,
    }
}

fn plan() -> ToolCall {
    ToolCall {
        trace: None,
        tool: "terraform_plan".into(),
        params: json!({"working_dir": "terraform/offline-demo"}),
        principal: Principal::os_user("test".into(), "alice".into(), 1000, vec![]),
        workspace: None,
    }
}

use common::audit_events as events;

fn trail(home: &std::path::Path, rid: &str) -> Vec<String> {
    events(home)
        .iter()
        .filter(|e| e["request_id"] == rid)
        .filter_map(|e| e["event"].as_str().map(str::to_string))
        .collect()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("rt")
}

fn assert_no_secret_anywhere(home: &std::path::Path) {
    let audit = std::fs::read_to_string(home.join("audit.jsonl")).expect("audit");
    assert!(
        !audit.contains(TOKEN),
        "the token never reaches the audit log"
    );
}

#[test]
fn success_issues_exactly_the_derived_scope_and_revokes_after_the_sandbox() {
    let s = setup(300, true);
    let r = rt().block_on(s.pipeline.call(plan())).expect("call");
    assert!(
        matches!(r.outcome, Outcome::Completed { ok: true, .. }),
        "{:?}",
        r.outcome
    );
    let issued = s.broker.issued.lock().expect("lock").clone();
    assert_eq!(issued.len(), 1);
    assert_eq!(issued[0].role, "test-plan");
    assert_eq!(issued[0].params["kubernetes_namespace"], "demo-app");
    assert!(s.broker.live.lock().expect("lock").is_empty(), "revoked");
    let t = trail(&s.home, &r.request_id);
    let pos = |e: &str| t.iter().position(|x| x == e).unwrap_or(usize::MAX);
    assert!(pos("credential.issued") < pos("sandbox.started"), "{t:?}");
    assert!(
        pos("sandbox.completed") < pos("credential.revoked"),
        "{t:?}"
    );
    assert!(pos("credential.revoked") < pos("tool.result"), "{t:?}");
    assert_no_secret_anywhere(&s.home);
    let text = serde_json::to_string(&r).expect("json");
    assert!(!text.contains(TOKEN), "the token never reaches the result");
}

/// A module that reads the credential file and shows it as an output: the
/// token must reach neither the result nor the audit log, and the plan
/// (whose file holds it, and whose apply would write it into the module's
/// state in the agent's repository) is refused and not kept.
#[test]
fn a_module_that_prints_its_credential_does_not_leak_it() {
    let s = setup(300, true);
    std::fs::write(
        s.workspace.join("terraform/offline-demo/leak.tf"),
        "output \"token\" {\n  value = file(\"/run/gateway/credential\")\n}\n",
    )
    .expect("write");
    let r = rt().block_on(s.pipeline.call(plan())).expect("call");
    assert!(
        matches!(&r.outcome, Outcome::Refused { reason }
            if reason.contains("the plan holds a credential minted for this call")),
        "{:?}",
        r.outcome
    );
    assert!(
        !s.home
            .join("plans")
            .join(format!("{}.json", r.request_id))
            .exists(),
        "no plan is kept"
    );
    assert!(s.broker.live.lock().expect("lock").is_empty(), "revoked");
    assert!(!serde_json::to_string(&r).expect("json").contains(TOKEN));
    assert_no_secret_anywhere(&s.home);
}

#[test]
fn a_failing_tool_still_revokes() {
    let s = setup(300, true);
    std::fs::write(
        s.workspace.join("terraform/offline-demo/broken.tf"),
        "resource \"terraform_data\" {\n",
    )
    .expect("write");
    let r = rt().block_on(s.pipeline.call(plan())).expect("call");
    assert!(
        matches!(&r.outcome, Outcome::Refused { reason } if reason.contains("terraform plan failed")),
        "{:?}",
        r.outcome
    );
    assert!(s.broker.live.lock().expect("lock").is_empty());
    assert!(trail(&s.home, &r.request_id).contains(&"credential.revoked".to_string()));
}

#[test]
fn a_deadline_kill_still_revokes() {
    let s = setup(1, true);
    std::fs::write(
        s.workspace.join("terraform/offline-demo/slow.tf"),
        "resource \"terraform_data\" \"many\" {\n  count = 4000\n  input = count.index\n}\n",
    )
    .expect("write");
    let r = rt().block_on(s.pipeline.call(plan())).expect("call");
    assert!(
        matches!(&r.outcome, Outcome::Refused { reason } if reason.contains("Deadline")),
        "{:?}",
        r.outcome
    );
    assert!(s.broker.live.lock().expect("lock").is_empty());
}

#[test]
fn a_cancelled_call_kills_its_sandbox_and_revokes_in_the_background() {
    let s = setup(300, true);
    std::fs::write(
        s.workspace.join("terraform/offline-demo/slow.tf"),
        "resource \"terraform_data\" \"many\" {\n  count = 4000\n  input = count.index\n}\n",
    )
    .expect("write");
    let rt = rt();
    let res = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(3), s.pipeline.call(plan())).await
    });
    assert!(res.is_err(), "cancelled while running");
    assert_eq!(s.broker.issued.lock().expect("lock").len(), 1);
    let revoked = rt.block_on(async {
        for _ in 0..100 {
            if s.broker.live.lock().map(|l| l.is_empty()).unwrap_or(false) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    });
    assert!(revoked, "the lease of a cancelled call is revoked");
    let all: Vec<String> = events(&s.home)
        .iter()
        .filter_map(|e| e["event"].as_str().map(str::to_string))
        .collect();
    assert!(
        all.contains(&"credential.revoke_on_abort".to_string())
            && all.contains(&"credential.revoked".to_string()),
        "{all:?}"
    );
}

#[test]
fn a_call_cancelled_while_the_credential_is_being_minted_still_revokes_it() {
    let s = setup(300, true);
    s.broker.issue_delay_ms.store(1500, Ordering::SeqCst);
    let rt = rt();
    let res = rt.block_on(async {
        tokio::time::timeout(Duration::from_millis(300), s.pipeline.call(plan())).await
    });
    assert!(res.is_err(), "cancelled while the broker was minting");
    // The credential arrives after the caller is gone, and is revoked.
    let revoked = rt.block_on(async {
        for _ in 0..100 {
            let issued = s.broker.issued.lock().map(|l| l.len()).unwrap_or(0);
            let live = s.broker.live.lock().map(|l| l.len()).unwrap_or(1);
            if issued == 1 && live == 0 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    });
    assert!(
        revoked,
        "the late credential was revoked, not left to its TTL"
    );
    let all = events(&s.home);
    assert!(
        all.iter()
            .any(|e| e["event"] == "credential.issued" && e["data"]["after_cancellation"] == true),
        "{all:?}"
    );
    assert!(all.iter().any(|e| e["event"] == "credential.revoked"));
    assert!(
        !all.iter().any(|e| e["event"] == "sandbox.started"),
        "nothing ran"
    );
}

#[test]
fn revoke_failures_are_retried_and_reported() {
    let s = setup(300, true);
    s.broker.fail_revokes.store(2, Ordering::SeqCst);
    let r = rt().block_on(s.pipeline.call(plan())).expect("call");
    let t = trail(&s.home, &r.request_id);
    assert_eq!(
        t.iter()
            .filter(|e| *e == "credential.revoke_failed")
            .count(),
        2,
        "{t:?}"
    );
    assert!(t.contains(&"credential.revoked".to_string()));
    assert!(s.broker.live.lock().expect("lock").is_empty());

    let s = setup(300, true);
    s.broker.fail_revokes.store(100, Ordering::SeqCst);
    let r = rt().block_on(s.pipeline.call(plan())).expect("call");
    let t = trail(&s.home, &r.request_id);
    assert_eq!(
        t.iter()
            .filter(|e| *e == "credential.revoke_failed")
            .count(),
        gateway::broker::REVOKE_BACKOFF.len(),
        "{t:?}"
    );
    assert!(!t.contains(&"credential.revoked".to_string()));
}

#[test]
fn without_a_broker_a_call_that_needs_a_credential_is_refused_before_anything_runs() {
    let s = setup(300, false);
    let r = rt().block_on(s.pipeline.call(plan())).expect("call");
    assert!(
        matches!(&r.outcome, Outcome::Refused { reason } if reason.contains("no credential broker")),
        "{:?}",
        r.outcome
    );
    assert_eq!(
        trail(&s.home, &r.request_id),
        vec!["tool.request", "policy.decision", "tool.result"]
    );
}

#[test]
fn denied_calls_never_touch_the_broker_or_the_sandbox() {
    let s = setup(300, true);
    let rt = rt();
    let denied = rt
        .block_on(s.pipeline.call(ToolCall {
            trace: None,
            tool: "terraform_plan".into(),
            params: json!({"working_dir": "../x"}),
            ..plan()
        }))
        .expect("call");
    assert!(matches!(denied.outcome, Outcome::Denied { .. }));
    assert!(s.broker.issued.lock().expect("lock").is_empty());
    assert_eq!(
        trail(&s.home, &denied.request_id),
        vec!["tool.request", "policy.decision", "tool.result"]
    );
}
