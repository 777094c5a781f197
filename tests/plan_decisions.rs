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

fn decide_apply(set: &PolicySet, fixture: &str) -> gateway::policy::Decision {
    let path = common::repo().join(format!("policy-tests/plans/{fixture}/data.json"));
    let plan = plan::read_plan_file(&path).expect("fixture is a plan");
    let mut input = DecisionInput::new(
        "terraform_apply",
        serde_json::json!({"working_dir": "terraform/offline-demo"}),
        Principal::os_user("snapshot".into(), "alice".into(), 1000, vec![]),
    );
    input.request_id = "req-snapshot".into();
    input.now = "2026-11-29T10:00:00Z".into();
    input.plan = Some(PlanInput::new(plan));
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
