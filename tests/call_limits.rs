//! Admission through the whole pipeline (policies/calls.rego): a call with
//! arguments over the policy's size, or over its user's rate, is refused
//! before anything is decided or run, with the reason, and the audit keeps
//! a digest of the oversized arguments rather than the arguments. The
//! sandbox is the scripted fake (tests/support/scripted_sandbox.rs).

mod common;
#[path = "support/scripted_sandbox.rs"]
mod scripted_sandbox;

use std::sync::Arc;

use gateway::pipeline::{Outcome, Pipeline, ToolCall};
use gateway::policy::Principal;
use scripted_sandbox::ScriptedSandbox;
use serde_json::{Value, json};

const MODULE: &str = "terraform/offline-demo";

fn pipeline(
    edits: &[(&str, &str, &str)],
) -> (Vec<tempfile::TempDir>, Arc<ScriptedSandbox>, Arc<Pipeline>) {
    let policies = common::policies_with(edits);
    let home = tempfile::tempdir().expect("home");
    let (workspace, _module) = common::workspace_with_module(MODULE);
    let sandbox = Arc::new(scripted_sandbox::demo_script("create", Vec::new()));
    let (_, p) = scripted_sandbox::pipeline(
        policies.path(),
        home.path(),
        workspace.path(),
        sandbox.clone(),
    );
    (vec![policies, home, workspace], sandbox, Arc::new(p))
}

fn plan(params: Value, user: &str, uid: u32) -> ToolCall {
    ToolCall {
        trace: None,
        tool: "terraform_plan".into(),
        params,
        principal: Principal::os_user("test-agent".into(), user.into(), uid, vec![]),
        workspace: None,
    }
}

fn events(p: &Pipeline, rid: &str) -> Vec<Value> {
    gateway::audit::read_events(p.audit.path())
        .expect("read")
        .into_iter()
        .filter(|e| e["request_id"] == rid)
        .map(Value::Object)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_arguments_are_refused_unrun_and_audited_as_a_digest() {
    let (_dirs, sandbox, p) = pipeline(&[]);
    let blob = "A".repeat(1 << 20);
    let r = p
        .call(plan(
            json!({"working_dir": MODULE, "note": blob}),
            "alice",
            1000,
        ))
        .await
        .expect("call");
    let Outcome::Refused { reason } = &r.outcome else {
        panic!("refused: {:?}", r.outcome);
    };
    assert!(
        reason.contains("more than the 262144 allowed (data.config.calls.params_bytes)"),
        "{reason}"
    );
    assert!(sandbox.seen().is_empty(), "nothing ran");
    let trail = events(&p, &r.request_id);
    let names: Vec<&str> = trail.iter().filter_map(|e| e["event"].as_str()).collect();
    assert_eq!(
        names,
        vec!["tool.request", "tool.result"],
        "no decision was made"
    );
    let note = &trail[0]["data"]["params"]["note"]["omitted"];
    assert_eq!(note["bytes"], blob.len() + 2, "{}", trail[0]);
    assert_eq!(trail[0]["data"]["params"]["working_dir"], MODULE);
    let text = std::fs::read_to_string(p.audit.path()).expect("audit");
    assert!(
        text.len() < 64 * 1024,
        "the log did not take the megabyte: {}",
        text.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_over_the_rate_is_refused_and_another_is_not() {
    let (_dirs, sandbox, p) = pipeline(&[(
        "config/calls/data.yaml",
        "per_minute_per_user: 60\n",
        "per_minute_per_user: 3\n",
    )]);
    for n in 0..3 {
        let r = p
            .call(plan(json!({"working_dir": MODULE}), "alice", 1000))
            .await
            .expect("call");
        assert!(
            matches!(r.outcome, Outcome::Completed { .. }),
            "call {n}: {:?}",
            r.outcome
        );
    }
    let ran = sandbox.seen().len();
    let r = p
        .call(plan(json!({"working_dir": MODULE}), "alice", 1000))
        .await
        .expect("call");
    let Outcome::Refused { reason } = &r.outcome else {
        panic!("refused: {:?}", r.outcome);
    };
    assert!(
        reason.contains("alice made 3 calls in the last minute"),
        "{reason}"
    );
    assert_eq!(sandbox.seen().len(), ran, "nothing ran");
    // The count is per OS user (by uid): bob is not held back by alice.
    let r = p
        .call(plan(json!({"working_dir": MODULE}), "bob", 1001))
        .await
        .expect("call");
    assert!(
        matches!(r.outcome, Outcome::Completed { .. }),
        "{:?}",
        r.outcome
    );
}
