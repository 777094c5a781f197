//! `gateway serve` driven by a real MCP client: the official Python SDK
//! (PyPI `mcp`, installed into .tools by scripts/install-tools.sh) runs the
//! scenarios in tests/mcp/scenarios.py against the real binary relaying to
//! a real `gateway daemon`, with real gVisor, real Terraform, real SQLite
//! and the real audit log — once in the SDK's default mode (2026-07-28: no
//! handshake, the client's info in each request's `_meta`, plus a client
//! with the Tasks extension) and once in its legacy mode (the `initialize`
//! handshake, 2025-11-25).

mod common;
#[path = "support/daemon.rs"]
mod daemon;

fn run_scenarios(mode: &str, passes: usize) {
    let python = common::repo().join(".tools/venv/bin/python");
    assert!(
        python.is_file(),
        "the MCP client is installed by scripts/install-tools.sh"
    );
    // The operator approves by signing with an SSH key the policy lists
    // (`gateway approve` finds it in GATEWAY_APPROVER_KEY).
    let keys = tempfile::tempdir().expect("keys");
    let operator_key = common::ssh_key(keys.path(), "mcp-test-operator");
    let policies = common::policies_with_signers(&[("mcp-test-operator", &operator_key)], &[]);
    // The daemon's socket group must exist (it is made with the test users).
    daemon::os_user(daemon::AGENT);
    // Progress every second, so that a few seconds show the heartbeat.
    let (dir, config) = daemon::Daemon::layout_with(policies.path(), "", "progress_seconds = 1");
    let d = daemon::Daemon::start_in(dir, config);
    let workspace = tempfile::tempdir().expect("workspace");
    common::copy_dir(
        &common::repo().join("terraform"),
        &workspace.path().join("terraform"),
    );
    let out = std::process::Command::new(&python)
        .arg(common::repo().join("tests/mcp/scenarios.py"))
        .arg(env!("CARGO_BIN_EXE_gateway"))
        .arg(&d.home)
        .arg(workspace.path())
        .arg(&d.policies)
        .arg(&d.socket)
        .arg(mode)
        .env("GATEWAY_APPROVER_KEY", &operator_key)
        .output()
        .expect("run the client");
    let text = common::stdout(&out);
    println!("{text}");
    assert!(
        out.status.success(),
        "{text}\n{}\n{}",
        common::stderr(&out),
        d.log()
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("PASS")).count(),
        passes,
        "{text}"
    );
    // rmcp logs each error response at WARN; the daemon keeps its log for
    // its own problems.
    assert!(!d.log().contains("response error"), "{}", d.log());
}

#[test]
fn the_sdks_default_mode_2026_07_28_runs_every_scenario_and_a_task_waits_for_approval() {
    run_scenarios("auto", 18);
}

#[test]
fn the_sdks_legacy_mode_2025_11_25_runs_every_scenario() {
    run_scenarios("legacy", 15);
}
