//! `gateway serve` driven by a real MCP client: the official Python SDK
//! (PyPI `mcp`, installed into .tools by scripts/install-tools.sh) runs the
//! scenarios in tests/mcp/scenarios.py against the real binary relaying to
//! a real `gateway daemon`, with real gVisor, real Terraform, real SQLite
//! and the real audit log.

mod common;
#[path = "support/daemon.rs"]
mod daemon;

#[test]
fn a_real_mcp_client_runs_the_forces_replacement_scenario() {
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
    let d = daemon::Daemon::start(policies.path(), "");
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
        .env("GATEWAY_APPROVER_KEY", &operator_key)
        .output()
        .expect("run the client");
    let text = common::stdout(&out);
    assert!(
        out.status.success(),
        "{text}\n{}\n{}",
        common::stderr(&out),
        d.log()
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("PASS")).count(),
        14,
        "{text}"
    );
}
