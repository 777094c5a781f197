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
use gateway::policy::set::LoadOptions;
use gateway::policy::{PolicyStore, Principal};
use gateway::tools::ToolPaths;
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
    module: std::path::PathBuf,
    sandbox: Arc<ScriptedSandbox>,
    pipeline: Pipeline,
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
    let config =
        std::fs::read_to_string(common::repo().join(MODULE).join("main.tf")).expect("main.tf");
    std::fs::write(module.join("main.tf"), &config).expect("write");
    // A second allowed module, so that an approval presented with its
    // working_dir gets as far as the approval's binding.
    let other = workspace.path().join("terraform/k8s-demo");
    std::fs::create_dir_all(&other).expect("mkdir");
    std::fs::write(other.join("main.tf"), "").expect("write");
    // A plan that replaces a resource: destructive, and terraform_apply is
    // high tier anyway.
    let plan_json = std::fs::read(common::repo().join("policy-tests/plans/replace/data.json"))
        .expect("fixture");
    let sandbox = Arc::new(ScriptedSandbox::new(
        &config,
        plan_json,
        STATE_AFTER.as_bytes().to_vec(),
    ));
    let store = Arc::new(PolicyStore::open(
        vec![policies.path().to_path_buf()],
        LoadOptions::default(),
    ));
    let pipeline = Pipeline::new(
        store,
        home.path().to_path_buf(),
        workspace.path().to_path_buf(),
        sandbox.clone(),
        ToolPaths::discover(&common::repo()),
    )
    .expect("pipeline");
    World {
        home: home.path().to_path_buf(),
        policies: policies.path().to_path_buf(),
        keys: keys.path().to_path_buf(),
        module,
        sandbox,
        pipeline,
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
            tool: "terraform_apply".into(),
            params,
            principal: Principal {
                client: "test-agent".into(),
                os_user: user.into(),
                uid,
                groups: vec![],
            },
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

    // 6. The same approval again: refused (spent), nothing run.
    let r5 = w
        .apply(json!({"working_dir": MODULE, "approval_id": approval_id}))
        .await;
    assert!(refused(&r5.outcome).contains("spent"), "{:?}", r5.outcome);
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
