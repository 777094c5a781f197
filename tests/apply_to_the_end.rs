//! Once an approval is spent, its apply is the operator's, not the
//! agent's: it runs to its end whatever the client does, its state is
//! written back, its outcome is kept with the approval and returned to a
//! repeated call, and a daemon shutdown waits for it within its grace (and
//! records what happened when it cannot).
//!
//! Real daemon (as root), real gVisor, real Terraform. The agent is an
//! unprivileged OS user speaking MCP JSON-RPC through `gateway serve`, as
//! an attacker would: it cancels (`notifications/cancelled`), closes its
//! input, or has its `gateway serve` killed while the approved apply runs.
//! Before the pipeline owned the apply, each of these killed the sandbox
//! after the spend: no state came back and the approval read `spent`.

#[path = "support/agent.rs"]
mod agent;
mod common;
#[path = "support/daemon.rs"]
mod daemon;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use agent::Agent;
use daemon::{AGENT, APPROVER, Daemon};
use serde_json::{Value, json};

const MODULE: &str = "terraform/offline-demo";

fn gateway() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gateway"))
}

/// The agent plans an apply; another OS user approves it. Returns the
/// approval's id.
fn planned_and_approved(d: &Daemon, workspace: &Path, home: &Path) -> String {
    let mut a = Agent::start(d, workspace, home);
    a.apply(1, json!({"working_dir": MODULE}));
    let r = a.wait(|v| v["id"] == 1, Duration::from_secs(600));
    let sc = &r["result"]["structuredContent"];
    assert_eq!(sc["status"], "pending_approval", "{r}");
    let id = sc["approval_id"].as_str().expect("approval id").to_string();
    let approver_home = daemon::owned_dir(APPROVER);
    let out = daemon::as_user(
        APPROVER,
        approver_home.path(),
        &[("GATEWAY_SOCKET", &d.socket)],
        &gateway(),
    )
    .args(["approve", &id, "--reason", "reviewed"])
    .output()
    .expect("approve");
    assert!(
        out.status.success(),
        "{}{}",
        common::stdout(&out),
        common::stderr(&out)
    );
    id
}

/// The request that spent approval `id`, once the daemon has written it.
fn spender(d: &Daemon, id: &str) -> String {
    let started = Instant::now();
    loop {
        if let Some(e) = d
            .events()
            .into_iter()
            .find(|e| e["event"] == "approval.spent" && e["data"]["approval_id"] == id)
        {
            return e["request_id"].as_str().expect("rid").to_string();
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "approval {id} was never spent: {}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn position(events: &[Value], name: &str) -> usize {
    events
        .iter()
        .position(|e| e["event"] == name)
        .unwrap_or_else(|| panic!("no {name} in {events:#?}"))
}

/// The approval as `gateway approvals show --json` prints it to the agent.
fn shown(d: &Daemon, id: &str, home: &Path) -> Value {
    let out = daemon::as_user(AGENT, home, &[("GATEWAY_SOCKET", &d.socket)], &gateway())
        .args(["approvals", "show", id, "--json"])
        .output()
        .expect("approvals show");
    assert!(out.status.success(), "{}", common::stderr(&out));
    serde_json::from_str(&common::stdout(&out)).expect("json")
}

fn state(workspace: &Path) -> String {
    std::fs::read_to_string(workspace.join(MODULE).join("terraform.tfstate")).unwrap_or_default()
}

#[test]
fn an_approved_apply_runs_to_its_end_whatever_the_client_does() {
    daemon::os_user(AGENT);
    daemon::os_user(APPROVER);
    let d = Daemon::start(&common::repo().join("policies"), "");
    let workspace = daemon::demo_workspace(AGENT);
    let home = daemon::owned_dir(AGENT);
    let count = 500;
    for round in ["cancelled", "input-closed", "serve-killed"] {
        let round_started = Instant::now();
        daemon::write_slow_part(workspace.path(), round, count);
        let id = planned_and_approved(&d, workspace.path(), home.path());
        let mut a = Agent::start(&d, workspace.path(), home.path());
        a.apply(7, json!({"working_dir": MODULE, "approval_id": id}));
        // The apply's sandbox is running Terraform when the agent acts.
        a.progress("applying the saved plan", Duration::from_secs(120));
        a.progress("started", Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(1500));
        match round {
            "cancelled" => a.send(
                json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                         "params": {"requestId": 7, "reason": "changed my mind"}}),
            ),
            "input-closed" => a.close_input(),
            _ => a.kill(),
        }
        let rid = spender(&d, &id);
        let events = d.ended(&rid, Duration::from_secs(600));
        let result = events
            .iter()
            .find(|e| e["event"] == "tool.result")
            .expect("result");
        assert_eq!(result["data"]["status"], "completed", "{round}: {result:#}");
        assert_eq!(result["data"]["ok"], true, "{round}: {result:#}");
        // The client went away while the apply's sandbox ran, and the apply
        // went on: detached before the sandbox ended, then completed.
        let detached = position(&events, "call.detached");
        let completed = position(&events, "sandbox.completed");
        assert!(
            detached < completed,
            "{round}: the client left after the apply ended, not during it: {events:#?}"
        );
        assert_eq!(events[completed]["data"]["exit_code"], 0, "{events:#?}");
        assert!(
            events.iter().any(|e| e["event"] == "state.saved"),
            "{round}: the state was not written back: {events:#?}"
        );
        let st = state(workspace.path());
        assert!(
            st.contains(&format!("\"{}-{round}\"", count - 1)),
            "{round}: the module's state does not hold what the apply did"
        );
        // The outcome is kept with the approval, for the agent and the operator.
        let a_then = shown(&d, &id, home.path());
        assert_eq!(a_then["state"], "spent");
        assert_eq!(a_then["spent_request_id"], rid.as_str());
        assert_eq!(a_then["outcome"]["status"], "completed", "{a_then:#}");
        assert_eq!(a_then["outcome"]["ok"], true, "{a_then:#}");
        // The same call again with the same approval: that outcome, not a refusal.
        drop(a);
        let mut again = Agent::start(&d, workspace.path(), home.path());
        again.apply(8, json!({"working_dir": MODULE, "approval_id": id}));
        let r = again.wait(|v| v["id"] == 8, Duration::from_secs(120));
        assert_eq!(r["result"]["isError"], false, "{round}: {r:#}");
        assert_eq!(
            r["result"]["structuredContent"]["status"], "completed",
            "{r:#}"
        );
        let text = r["result"]["content"][0]["text"].as_str().unwrap_or("");
        assert!(
            text.contains(&format!("was spent by request {rid}")),
            "{round}: {text}"
        );
        assert!(
            d.events().iter().any(|e| e["event"] == "approval.replayed"
                && e["data"]["approval_id"] == id.as_str()
                && e["data"]["spent_by"] == rid.as_str()),
            "{round}: the replay is not audited"
        );
        println!(
            "PASS {round}: the apply ({} ms in its sandbox, round {} s) ran to its end, its state was written back, its outcome kept and returned",
            events[completed]["data"]["duration_ms"],
            round_started.elapsed().as_secs()
        );
    }
    d.assert_audit_verifies();
}

/// SIGTERM to the daemon while an approved apply runs: it waits for the
/// apply within its grace; with a grace too short it records the apply as
/// interrupted (in the audit and with the approval) and kills the sandbox.
#[test]
fn a_daemon_shutdown_waits_for_a_running_apply_or_records_it_interrupted() {
    daemon::os_user(AGENT);
    daemon::os_user(APPROVER);
    for (grace, count) in [(120u64, 300usize), (1, 1500)] {
        let (dir, config) = Daemon::layout_with(
            &common::repo().join("policies"),
            "",
            &format!("shutdown_grace_seconds = {grace}"),
        );
        let mut d = Daemon::start_in(dir, config);
        let workspace = daemon::demo_workspace(AGENT);
        let home = daemon::owned_dir(AGENT);
        daemon::write_slow_part(workspace.path(), &format!("grace-{grace}"), count);
        let id = planned_and_approved(&d, workspace.path(), home.path());
        let before = state(workspace.path());
        let mut a = Agent::start(&d, workspace.path(), home.path());
        a.apply(7, json!({"working_dir": MODULE, "approval_id": id}));
        a.progress("applying the saved plan", Duration::from_secs(120));
        a.progress("started", Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(1000));
        let rid = spender(&d, &id);
        let status = d
            .terminate(Duration::from_secs(grace + 60))
            .expect("the daemon did not exit within its grace");
        assert!(status.success(), "{status}: {}", d.log());
        let events = d.ended(&rid, Duration::from_secs(5));
        let result = events
            .iter()
            .find(|e| e["event"] == "tool.result")
            .expect("result");
        // The approval's outcome, read from its store (the daemon is gone).
        let store = gateway::approvals::ApprovalStore::in_home(&d.home).expect("store");
        let kept = store.get(&id).expect("db").expect("approval");
        if grace > 1 {
            assert_eq!(result["data"]["status"], "completed", "{result:#}");
            assert_eq!(result["data"]["ok"], true, "{result:#}");
            assert!(state(workspace.path()).contains(&format!("\"{}-grace-{grace}\"", count - 1)));
            assert_eq!(
                kept.outcome.as_ref().map(|o| o["status"].clone()),
                Some(json!("completed"))
            );
        } else {
            assert_eq!(result["data"]["status"], "interrupted", "{result:#}");
            assert!(
                result["data"]["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("half changed")),
                "{result:#}"
            );
            assert_eq!(state(workspace.path()), before, "nothing was written back");
            assert_eq!(
                kept.outcome.as_ref().map(|o| o["status"].clone()),
                Some(json!("interrupted"))
            );
            // Its sandbox went with the daemon.
            let started = Instant::now();
            loop {
                let ps = Command::new("ps")
                    .args(["-eo", "args"])
                    .output()
                    .expect("ps");
                if !common::stdout(&ps)
                    .lines()
                    .any(|l| l.contains("runsc") && l.contains(&rid))
                {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "the interrupted apply's sandbox is still running"
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        println!("PASS grace {grace}s: {}", result["data"]["status"]);
    }
}
