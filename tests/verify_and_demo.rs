//! `gateway verify` and `gateway demo` through the real binary, on real
//! gVisor and real Terraform.

mod common;

use common::{gateway, stderr, stdout};

#[test]
fn gateway_verify_passes_all_five_checks_on_the_local_backend() {
    let home = tempfile::tempdir().expect("home");
    let out = gateway(home.path()).arg("verify").output().expect("run");
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert_eq!(
        text.lines().filter(|l| l.starts_with("PASS")).count(),
        5,
        "{text}"
    );
    assert!(text.trim_end().ends_with("5 passed, 0 failed"), "{text}");
    assert!(text.contains("memory hog: Limit(\"memory\")"), "{text}");
}

#[test]
fn gateway_demo_runs_the_forces_replacement_scenario_for_real() {
    let home = tempfile::tempdir().expect("home");
    let module = common::repo().join("terraform/offline-demo/main.tf");
    let before = std::fs::read_to_string(&module).expect("module");
    let out = gateway(home.path()).arg("demo").output().expect("run");
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    for expected in [
        "Applied the approved plan. From the state: 2 added, 0 replaced, 0 removed.",
        "No changes",
        "PENDING APPROVAL",
        "!! terraform_data.web will be destroyed and re-created",
        "approved ap-",
        "Applied the approved plan. From the state: 0 added, 1 replaced, 0 removed.\n  replaced: terraform_data.web",
        "was already spent",
        "chain verified",
        "demo complete",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    assert_eq!(
        std::fs::read_to_string(&module).expect("module"),
        before,
        "the repository's module is not edited"
    );
    // The audit trail: every event of the gated apply, in order, chained.
    let audit = home.path().join("demo/audit.jsonl");
    let verify = gateway(home.path())
        .args(["audit", "verify", "--file", &audit.display().to_string()])
        .output()
        .expect("run");
    assert!(verify.status.success(), "{}", stdout(&verify));
    let events: Vec<serde_json::Value> = std::fs::read_to_string(&audit)
        .expect("audit")
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let gated = events
        .iter()
        .find(|e| e["event"] == "approval.requested")
        .and_then(|e| e["request_id"].as_str())
        .expect("an approval was requested")
        .to_string();
    let trail: Vec<&str> = events
        .iter()
        .filter(|e| e["request_id"] == gated.as_str())
        .filter_map(|e| e["event"].as_str())
        .collect();
    assert_eq!(
        trail,
        vec![
            "tool.request",
            "policy.decision",
            // The plan sandbox, on a copy of the module...
            "sandbox.started",
            "sandbox.completed",
            // ...and the one that shows the saved plan file.
            "sandbox.started",
            "sandbox.completed",
            "plan.saved",
            "policy.decision",
            "approval.requested",
            "tool.result",
            "approval.granted"
        ],
        "the gated apply's trail"
    );
}
