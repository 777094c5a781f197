//! The decision for each real plan fixture (policy-tests/plans/*/data.json, made by
//! scripts/make-plan-fixtures.sh with a real Terraform), snapshotted with
//! insta. The request id and time are fixed so that snapshots are stable.

mod common;

use gateway::policy::set::LoadOptions;
use gateway::policy::{DecisionInput, PlanInput, PolicySet, Principal, plan};

const FIXTURES: &[&str] = &[
    "create",
    "update",
    "delete",
    "delete-count-index",
    "destroy-all",
    "replace",
    "replace-create-before-destroy",
    "replace-by-request",
    "forget",
    "no-changes",
    "empty",
    "targeted-incomplete",
];

fn policies() -> PolicySet {
    PolicySet::load(&[common::repo().join("policies")], &LoadOptions::default())
        .expect("default policies load")
}

/// The apply of the offline demo with `fixture`'s plan.
fn apply_input(fixture: &str) -> DecisionInput {
    let path = common::repo().join(format!("policy-tests/plans/{fixture}/data.json"));
    let plan = plan::read_plan_file(&path).expect("fixture is a plan");
    let mut input = DecisionInput::new(
        "terraform_apply",
        serde_json::json!({"working_dir": "terraform/offline-demo"}),
        Principal::os_user("snapshot".into(), "alice".into(), 1000, vec![]),
    );
    input.plan = Some(PlanInput::new(plan));
    input
}

fn decide_apply(set: &PolicySet, fixture: &str) -> gateway::policy::Decision {
    let mut input = apply_input(fixture);
    input.request_id = "req-snapshot".into();
    input.now = "2026-11-29T10:00:00Z".into();
    let ev = set.decide(&input);
    assert_eq!(ev.error, None, "{fixture}: the policy decided");
    ev.decision
}

#[test]
fn every_fixture_directory_entry_is_snapshotted() {
    let mut on_disk: Vec<String> = std::fs::read_dir(common::repo().join("policy-tests/plans"))
        .expect("fixtures dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("data.json").is_file())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = FIXTURES.iter().map(|s| s.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "a new fixture needs a snapshot");
}

#[test]
fn plan_decisions_match_their_snapshots() {
    let set = policies();
    for fixture in FIXTURES {
        let decision = decide_apply(&set, fixture);
        insta::assert_json_snapshot!(format!("apply-{fixture}"), decision);
    }
}

/// The rule of SPEC §3 in one table: which fixtures are destructive.
#[test]
fn destructive_fixtures_and_only_those_carry_signals() {
    let set = policies();
    for fixture in FIXTURES {
        let d = decide_apply(&set, fixture);
        let kinds: Vec<&str> = d.signals.iter().map(|s| s.kind.as_str()).collect();
        let want: &[&str] = match *fixture {
            "create" | "update" | "no-changes" | "empty" => &[],
            "delete" | "delete-count-index" => &["delete"],
            "destroy-all" => &["delete", "delete"],
            "replace" | "replace-create-before-destroy" | "replace-by-request" => &["replace"],
            "forget" => &["forget"],
            "targeted-incomplete" => &["plan-incomplete"],
            other => panic!("unlisted fixture {other}"),
        };
        assert_eq!(kinds, want, "{fixture}");
        assert!(
            d.allow,
            "{fixture}: an apply of the allowed module is allowed (behind approval)"
        );
        assert!(d.approval.required, "{fixture}: apply is high tier");
        assert_eq!(
            d.approval.reason_required,
            !want.is_empty(),
            "{fixture}: destructive settings"
        );
    }
}

/// One evaluation for a call's admission and decision
/// (`PolicySet::admit_and_decide`, what the pipeline asks at a call's
/// start) gives what each rule gives asked alone: for every plan fixture
/// and for request-step calls allowed, denied, malformed and unknown. A
/// call refused at admission gets no decision.
#[test]
fn one_evaluation_decides_as_two_do() {
    let set = policies();
    let admission = |params_bytes: u64| {
        serde_json::json!({
            "tool": "t", "client": "c", "kind": "os_user", "user": "alice",
            "os_user": "alice", "uid": 1000, "issuer": null, "groups": [],
            "params_bytes": params_bytes, "running": {"user": 0, "total": 0},
            "last_minute": {"user": 0},
        })
    };
    let mut inputs = Vec::new();
    for fixture in FIXTURES {
        inputs.push(apply_input(fixture));
    }
    for (tool, params) in [
        (
            "k8s_get_pod_status",
            serde_json::json!({"namespace": "demo-app"}),
        ),
        (
            "k8s_get_pod_status",
            serde_json::json!({"namespace": "kube-system"}),
        ),
        ("k8s_get_pod_status", serde_json::json!({"namespace": 7})),
        (
            "k8s_get_pod_status",
            serde_json::json!({"namespace": "demo-app", "extra": true}),
        ),
        (
            "terraform_plan",
            serde_json::json!({"working_dir": "terraform/offline-demo"}),
        ),
        (
            "terraform_plan",
            serde_json::json!({"working_dir": "../../etc"}),
        ),
        (
            "terraform_apply",
            serde_json::json!({"working_dir": "terraform/offline-demo"}),
        ),
        ("no_such_tool", serde_json::json!({})),
    ] {
        inputs.push(DecisionInput::new(
            tool,
            params,
            Principal::os_user("c".into(), "alice".into(), 1000, vec![]),
        ));
    }
    let mut allowed = 0;
    for input in &inputs {
        let what = format!("{} {}", input.tool, input.params);
        let alone = set.decide(input);
        let verdict_alone = set
            .eval_rule(
                "data.gateway.calls.verdict",
                regorus::Value::from(admission(10)),
            )
            .expect("verdict");
        let (verdict, ev) = set
            .admit_and_decide(&admission(10), input)
            .expect("one evaluation");
        assert_eq!(verdict, verdict_alone, "{what}");
        let ev = ev.expect("admitted, so decided");
        assert_eq!(ev.error, alone.error, "{what}");
        assert_eq!(
            serde_json::to_value(&ev.decision).expect("json"),
            serde_json::to_value(&alone.decision).expect("json"),
            "{what}"
        );
        allowed += usize::from(alone.decision.allow);
        let (verdict, ev) = set
            .admit_and_decide(&admission(10_000_000), input)
            .expect("one evaluation");
        assert_eq!(verdict["admit"], serde_json::json!(false), "{what}");
        assert!(ev.is_none(), "{what}: refused calls are not decided");
    }
    assert!(
        allowed > 2 && allowed < inputs.len(),
        "both outcomes are compared ({allowed} of {} allowed)",
        inputs.len()
    );
}
