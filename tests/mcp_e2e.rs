//! `gateway serve` driven by a real MCP client: the official Python SDK
//! (PyPI `mcp`, installed into .tools by scripts/install-tools.sh) runs the
//! scenarios in tests/mcp/scenarios.py against the real binary, real gVisor,
//! real Terraform, real SQLite and the real audit log.

mod common;

#[test]
fn a_real_mcp_client_runs_the_forces_replacement_scenario() {
    let python = common::repo().join(".tools/venv/bin/python");
    assert!(
        python.is_file(),
        "the MCP client is installed by scripts/install-tools.sh"
    );
    let home = tempfile::tempdir().expect("home");
    let workspace = tempfile::tempdir().expect("workspace");
    common::copy_dir(
        &common::repo().join("terraform"),
        &workspace.path().join("terraform"),
    );
    let out = std::process::Command::new(&python)
        .arg(common::repo().join("tests/mcp/scenarios.py"))
        .arg(env!("CARGO_BIN_EXE_gateway"))
        .arg(home.path())
        .arg(workspace.path())
        .arg(common::repo().join("policies"))
        .output()
        .expect("run the client");
    let text = common::stdout(&out);
    assert!(out.status.success(), "{text}\n{}", common::stderr(&out));
    assert_eq!(
        text.lines().filter(|l| l.starts_with("PASS")).count(),
        14,
        "{text}"
    );
}
