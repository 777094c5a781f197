//! `gateway policy eval|test|check` through the real binary.

mod common;

use common::{copy_dir, gateway, repo, stderr, stdout};
use serde_json::Value;

fn eval(args: &[&str]) -> (std::process::Output, Option<Value>) {
    let home = tempfile::tempdir().expect("home");
    let out = gateway(home.path())
        .args(["policy", "eval"])
        .args(args)
        .output()
        .expect("run gateway");
    let json = serde_json::from_slice(&out.stdout).ok();
    (out, json)
}

#[test]
fn eval_prints_an_allow_for_an_allowed_call() {
    let (out, d) = eval(&[
        "--tool",
        "k8s_get_pod_status",
        "--params",
        r#"{"namespace":"demo-app"}"#,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let d = d.expect("decision JSON on stdout");
    assert_eq!(d["allow"], true);
    assert_eq!(
        d["credential"]["params"]["kubernetes_namespace"],
        "demo-app"
    );
}

#[test]
fn eval_exits_zero_on_a_deny_and_says_why() {
    let (out, d) = eval(&[
        "--tool",
        "terraform_plan",
        "--params",
        r#"{"working_dir":"../../etc"}"#,
    ]);
    assert!(
        out.status.success(),
        "a deny is a decision: {}",
        stderr(&out)
    );
    let d = d.expect("decision");
    assert_eq!(d["allow"], false);
    let reasons = d["deny_reasons"].to_string();
    assert!(reasons.contains("contains '..'"), "{reasons}");
}

#[test]
fn eval_refuses_unusable_inputs_with_a_clear_message() {
    let dir = tempfile::tempdir().expect("tmp");
    let bom = dir.path().join("bom.json");
    std::fs::write(
        &bom,
        b"\xEF\xBB\xBF{\"format_version\":\"1.2\",\"planned_values\":{}}",
    )
    .expect("write");
    let state = dir.path().join("state.json");
    std::fs::write(&state, br#"{"format_version":"1.0","values":{}}"#).expect("write");
    let p = |p: &std::path::Path| p.display().to_string();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "--tool".into(),
                "terraform_plan".into(),
                "--params".into(),
                "{nope".into(),
            ],
            "--params is not valid JSON",
        ),
        (
            vec![
                "--tool".into(),
                "terraform_plan".into(),
                "--params".into(),
                "[1]".into(),
            ],
            "params must be a JSON object",
        ),
        (
            vec![
                "--tool".into(),
                "terraform_apply".into(),
                "--plan".into(),
                "/nonexistent/plan.json".into(),
            ],
            "cannot read plan /nonexistent/plan.json",
        ),
        (
            vec![
                "--tool".into(),
                "terraform_apply".into(),
                "--plan".into(),
                p(&bom),
            ],
            "byte order mark",
        ),
        (
            vec![
                "--tool".into(),
                "terraform_apply".into(),
                "--plan".into(),
                p(&state),
            ],
            "looks like state",
        ),
        (vec!["--params".into(), "{}".into()], "no tool"),
    ];
    for (args, want) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (out, _) = eval(&args);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(
            stdout(&out).is_empty(),
            "no decision is printed for unusable input"
        );
        assert!(
            stderr(&out).contains(want),
            "{args:?}: {:?} should contain {want:?}",
            stderr(&out)
        );
    }
}

#[test]
fn eval_with_a_real_plan_reports_its_signals() {
    let (out, d) = eval(&[
        "--tool",
        "terraform_apply",
        "--params",
        r#"{"working_dir":"terraform/offline-demo"}"#,
        "--plan",
        "policy-tests/plans/replace/data.json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let d = d.expect("decision");
    assert_eq!(d["signals"][0]["kind"], "replace");
    assert_eq!(d["approval"]["required"], true);
}

#[test]
fn eval_accepts_a_full_input_document() {
    let dir = tempfile::tempdir().expect("tmp");
    let input = dir.path().join("input.json");
    std::fs::write(
        &input,
        r#"{"tool":"k8s_get_pod_status","params":{"namespace":"demo-app"},"request_id":"req-fixed","principal":{"client":"claude-desktop","os_user":"alice"}}"#,
    )
    .expect("write");
    let (out, v) = eval(&["--input", &input.display().to_string(), "--show-input"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = v.expect("json");
    assert_eq!(v["input"]["request_id"], "req-fixed");
    assert_eq!(v["input"]["principal"]["client"], "claude-desktop");
    assert_eq!(v["decision"]["allow"], true);
}

#[test]
fn a_policy_dir_that_does_not_load_denies_every_call_with_the_error() {
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(
        dir.path().join("broken.rego"),
        "package gateway\n\ndecision := {\n",
    )
    .expect("write");
    let (out, d) = eval(&[
        "--policies",
        &dir.path().display().to_string(),
        "--tool",
        "k8s_get_pod_status",
    ]);
    assert!(out.status.success());
    let d = d.expect("decision");
    assert_eq!(d["allow"], false);
    assert!(
        d["deny_reasons"][0]
            .as_str()
            .unwrap_or("")
            .contains("broken.rego:"),
        "{d}"
    );
}

/// Nothing about tools, tiers, scopes, signals or approvals is in Rust: a
/// different policy set changes every one of them with the same binary.
#[test]
fn a_different_policy_set_changes_the_decisions() {
    let dir = tempfile::tempdir().expect("tmp");
    let alt = dir.path().join("policies");
    copy_dir(&repo().join("policies"), &alt);
    let edit = |file: &str, from: &str, to: &str| {
        let p = alt.join(file);
        let s = std::fs::read_to_string(&p).expect("read");
        assert!(s.contains(from), "{file} should contain {from:?}");
        std::fs::write(&p, s.replace(from, to)).expect("write");
    };
    // A new namespace with its own role, a tier change, a stricter approval,
    // forget no longer destructive, a longer deadline.
    edit(
        "config/scopes/data.yaml",
        "namespaces:\n",
        "namespaces:\n  staging:\n    roles:\n      pod_reader: ro-staging\n",
    );
    edit(
        "config/vault_roles/data.yaml",
        "roles:\n",
        "roles:\n  ro-staging:\n    mount: kubernetes\n    namespace: staging\n    default_ttl: 10m\n    max_ttl: 30m\n    rules: []\n",
    );
    edit(
        "config/tools/data.yaml",
        "  tier: low\n  scope: namespace",
        "  tier: high\n  scope: namespace",
    );
    edit(
        "config/approvals/data.yaml",
        "destructive:\n  approvers: 1",
        "destructive:\n  approvers: 3",
    );
    edit(
        "config/sandbox/data.yaml",
        "deadline_seconds: 120",
        "deadline_seconds: 45",
    );
    edit(
        "signals.rego",
        "} else := \"forget\" if {\n\t\"forget\" in c.actions\n",
        "} else := \"forget\" if {\n\t\"never\" in c.actions\n",
    );

    let alt_arg = alt.display().to_string();
    let run = |policies: &str, args: &[&str]| {
        let mut all = vec!["--policies", policies];
        all.extend_from_slice(args);
        let (out, d) = eval(&all);
        assert!(out.status.success(), "{}", stderr(&out));
        d.expect("decision")
    };
    let pods = [
        "--tool",
        "k8s_get_pod_status",
        "--params",
        r#"{"namespace":"staging"}"#,
    ];
    let default = run("policies", &pods);
    let changed = run(&alt_arg, &pods);
    assert_eq!(default["allow"], false);
    assert_eq!(changed["allow"], true);
    assert_eq!(changed["credential"]["role"], "ro-staging");
    assert_eq!(changed["tier"], "high");
    assert_eq!(changed["approval"]["required"], true);
    assert_eq!(changed["sandbox"]["deadline_seconds"], 45);

    let delete = [
        "--tool",
        "terraform_apply",
        "--params",
        r#"{"working_dir":"terraform/offline-demo"}"#,
        "--plan",
        "policy-tests/plans/delete/data.json",
    ];
    assert_eq!(run("policies", &delete)["approval"]["approvers"], 1);
    assert_eq!(run(&alt_arg, &delete)["approval"]["approvers"], 3);

    let forget = [
        "--tool",
        "terraform_apply",
        "--params",
        r#"{"working_dir":"terraform/offline-demo"}"#,
        "--plan",
        "policy-tests/plans/forget/data.json",
    ];
    assert_eq!(
        run("policies", &forget)["signals"].as_array().map(Vec::len),
        Some(1)
    );
    // In the alternative set forget is not a kind any more; the plan's
    // delete_because_no_resource_config reason still makes it a signal.
    assert_eq!(run(&alt_arg, &forget)["signals"][0]["kind"], "delete");
}

#[test]
fn policy_test_passes_on_the_default_policies_with_full_coverage() {
    let home = tempfile::tempdir().expect("home");
    let out = gateway(home.path())
        .args([
            "policy",
            "test",
            "--format",
            "json",
            "--coverage",
            "--threshold",
            "100",
        ])
        .output()
        .expect("run");
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("json report");
    let passed = report["passed"].as_u64().expect("passed");
    assert!(passed >= 40, "at least 40 policy tests, got {passed}");
    assert_eq!(report["failed"], 0);
    assert_eq!(report["coverage"]["percent"], 100.0);
    let files: Vec<&str> = report["coverage"]["files"]
        .as_array()
        .expect("files")
        .iter()
        .filter_map(|f| f["file"].as_str())
        .collect();
    assert!(
        files.iter().all(|f| f.starts_with("policies/")),
        "{files:?}"
    );
    assert!(files.contains(&"policies/signals.rego"), "{files:?}");
}

#[test]
fn policy_test_text_output_ends_with_the_summary_line() {
    let home = tempfile::tempdir().expect("home");
    let out = gateway(home.path())
        .args(["policy", "test", "--run", r"gateway_test\.signals\."])
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", stdout(&out));
    let text = stdout(&out);
    let last = text.lines().last().unwrap_or("");
    let passed: usize = last
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("count");
    assert_eq!(last, format!("{passed} passed, 0 failed"));
    assert!(passed > 10);
    assert!(
        text.lines()
            .filter(|l| l.ends_with("ms)"))
            .all(|l| l.contains("gateway_test.signals.")),
        "--run filters"
    );
}

fn run_test_dir(files: &[(&str, &str)], extra: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().expect("tmp");
    for (name, content) in files {
        let p = dir.path().join(name);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, content).expect("write");
    }
    let home = tempfile::tempdir().expect("home");
    gateway(home.path())
        .args(["policy", "test", &dir.path().display().to_string()])
        .args(extra)
        .output()
        .expect("run")
}

#[test]
fn policy_test_reports_pass_fail_and_error_and_exits_nonzero() {
    let out = run_test_dir(
        &[(
            "x_test.rego",
            "package x\nimport rego.v1\ntest_pass if true\ntest_fail if false\ntest_undefined if input.nothing\ntest_error if { x := 1; x == sprintf(\"%d\", 1) }\ntest_with_mock if { input.a == 1 with input as {\"a\": 1} }\nhelper := 1\n",
        )],
        &[],
    );
    let text = stdout(&out);
    assert!(!out.status.success());
    assert!(text.contains("data.x.test_pass: PASS"), "{text}");
    assert!(text.contains("data.x.test_fail: FAIL"), "{text}");
    assert!(text.contains("data.x.test_undefined: FAIL"), "{text}");
    assert!(text.contains("data.x.test_error: ERROR"), "{text}");
    assert!(!text.contains("helper"), "{text}");
    assert!(text.trim_end().ends_with("2 passed, 3 failed"), "{text}");
}

#[test]
fn with_mocking_of_input_and_data_works() {
    let out = run_test_dir(
        &[
            ("p.rego", "package p\nallow if input.user in data.users\n"),
            ("users/data.json", r#"["alice"]"#),
            (
                "p_test.rego",
                "package p_test\nimport data.p\ntest_data if { p.allow with input as {\"user\": \"alice\"} }\ntest_mock_data if { p.allow with input as {\"user\": \"bob\"} with data.users as [\"bob\"] }\ntest_denied if { not p.allow with input as {\"user\": \"bob\"} }\n",
            ),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(
        stdout(&out).trim_end().ends_with("3 passed, 0 failed"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_test_file_with_a_syntax_error_is_reported_not_skipped() {
    let out = run_test_dir(
        &[
            ("ok_test.rego", "package ok\ntest_a if true\n"),
            ("bad_test.rego", "package bad\ntest_b if {\n"),
        ],
        &[],
    );
    assert!(!out.status.success());
    let text = stdout(&out);
    assert!(
        text.contains("bad_test.rego: ERROR (file does not load)"),
        "{text}"
    );
    assert!(text.contains("bad_test.rego:"), "{text}");
    assert!(text.trim_end().ends_with("1 passed, 1 failed"), "{text}");
}

#[test]
fn policy_test_with_no_tests_fails() {
    let out = run_test_dir(&[("p.rego", "package p\nx := 1\n")], &[]);
    assert!(!out.status.success());
    assert!(stdout(&out).contains("no tests found"));
}

#[test]
fn coverage_threshold_fails_when_lines_are_not_covered() {
    let out = run_test_dir(
        &[
            (
                "p.rego",
                "package p\na := 1\nb := 2 if {\n\tinput.x == 1\n}\n",
            ),
            ("p_test.rego", "package p_test\ntest_a if data.p.a == 1\n"),
        ],
        &["--coverage", "--threshold", "100"],
    );
    assert!(!out.status.success());
    let text = stdout(&out);
    assert!(text.contains("not covered: lines"), "{text}");
    assert!(
        stderr(&out).contains("below the threshold"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn policy_check_passes_on_the_defaults_and_names_file_line_column_on_errors() {
    let home = tempfile::tempdir().expect("home");
    let ok = gateway(home.path())
        .args(["policy", "check"])
        .output()
        .expect("run");
    assert!(ok.status.success(), "{}", stderr(&ok));
    assert!(stdout(&ok).starts_with("ok: "));

    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(
        dir.path().join("d.rego"),
        "package gateway\n\ndecision := x if {\n\tx := 1\n\tx := 2\n}\n",
    )
    .expect("write");
    let bad = gateway(home.path())
        .args(["policy", "check", &dir.path().display().to_string()])
        .output()
        .expect("run");
    assert!(!bad.status.success());
    let err = stderr(&bad);
    assert!(
        err.contains("d.rego:5:"),
        "a reassigned variable is caught at load with its position: {err}"
    );
}

/// The README's "add a read tool without recompiling", as written there:
/// its catalog lines (taken from the README itself), a credential kind and
/// a role as its prose says, then the policy's own tests (which check the
/// role grants what the tool's verb asks) and a decision for the new tool.
#[test]
fn the_readme_adds_a_configmaps_reader_with_policy_data_alone() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README");
    let from = readme
        .find("**Add a read tool without recompiling**")
        .expect("the README's how-to");
    let block = readme[from..]
        .split("```yaml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("its catalog lines");
    let dir = tempfile::tempdir().expect("tmp");
    let policies = dir.path().join("policies");
    copy_dir(&repo().join("policies"), &policies);
    let append = |rel: &str, text: &str| {
        let p = policies.join(rel);
        let mut s = std::fs::read_to_string(&p).expect("data");
        s.push('\n');
        s.push_str(text);
        std::fs::write(&p, s).expect("write");
    };
    append("config/tools/data.yaml", block);
    let scopes = policies.join("config/scopes/data.yaml");
    let s = std::fs::read_to_string(&scopes).expect("scopes");
    let s = s
        .replace(
            "credential_kinds:\n",
            "credential_kinds:\n  k8s_configmaps: {type: kubernetes, mount: kubernetes, ttl: 10m, egress: [kube-apiserver]}\n",
        )
        .replace(
            "      k8s_rollout: gateway-k8s-rollout-demo-app\n",
            "      k8s_rollout: gateway-k8s-rollout-demo-app\n      k8s_configmaps: gateway-k8s-configmaps-demo-app\n",
        );
    std::fs::write(&scopes, s).expect("scopes");
    let role = "  gateway-k8s-configmaps-demo-app:\n    mount: kubernetes\n    namespace: demo-app\n    default_ttl: 10m\n    max_ttl: 30m\n    rules: [{apiGroups: [\"\"], resources: [configmaps], verbs: [get, list]}]\n";
    let home = tempfile::tempdir().expect("home");
    let run = |args: &[&str]| {
        gateway(home.path())
            .arg("--policies")
            .arg(&policies)
            .args(args)
            .output()
            .expect("gateway")
    };
    let tests = policies.join("../policy-tests");
    copy_dir(&repo().join("policy-tests"), &tests);
    let tests = tests.display().to_string();
    let policy_dir = policies.display().to_string();
    // Without its role, the policy's own tests say what is missing.
    let out = run(&["policy", "test", &policy_dir, &tests]);
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(
        stdout(&out).contains(
            "test_every_role_the_policies_can_derive_is_defined_by_the_vault_setup: FAIL"
        ),
        "{}",
        stdout(&out)
    );
    append("config/vault_roles/data.yaml", role);
    let out = run(&["policy", "test", &policy_dir, &tests]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let out = run(&[
        "policy",
        "eval",
        "--tool",
        "k8s_configmaps",
        "--params",
        r#"{"namespace":"demo-app","kind":"configmaps","name":"web-config"}"#,
    ]);
    let d: Value = serde_json::from_slice(&out.stdout).expect("decision");
    assert_eq!(d["allow"], true, "{d}");
    assert_eq!(d["credential"]["role"], "gateway-k8s-configmaps-demo-app");
    assert_eq!(d["operation"]["verb"], "get");
    assert_eq!(d["operation"]["resource"], "configmaps");
    assert_eq!(d["operation"]["name"], "web-config");
}
