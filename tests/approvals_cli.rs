//! The approval store and the operator's CLI, through the real binary and
//! real SQLite: concurrent spenders, out-of-band approval, refusals, the
//! audit trail they leave, and no secret in any output.

mod common;

use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::{gateway, stderr, stdout};
use gateway::approvals::{ApprovalStore, Approver, NewApproval, Refusal};
use gateway::audit::AuditLog;
use serde_json::{Value, json};

const PLAN_SHA: &str = "3b5d3c7d207e37dceeedd301e35e2e58408a7a2c1d6f2e3b2a6c7d8e9f0a1b2c";
const JWT: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6ZGVtbyJ9.c2lnbmF0dXJlLWJ5dGVzLWhlcmU";
const VAULT_TOKEN: &str = "hvs.CAESIPlantedSecretTokenValue0123456789abcd";

fn new_approval(requested_by: &str, approvers: u32, reason_required: bool) -> NewApproval {
    let plan: Value = serde_json::from_str(
        &std::fs::read_to_string(common::repo().join("policy-tests/plans/replace/data.json"))
            .expect("fixture"),
    )
    .expect("json");
    NewApproval {
        tool: "terraform_apply".into(),
        params: json!({"working_dir": "terraform/offline-demo"}),
        plan_sha256: Some(PLAN_SHA.into()),
        plan_summary: gateway::approvals::plan_summary(&regorus::Value::from(plan)),
        signals: json!([{"address": "terraform_data.web", "kind": "replace", "actions": ["delete", "create"],
                         "reason": "replace_because_cannot_update", "paths": [["triggers_replace"]],
                         "message": "terraform_data.web will be destroyed and re-created"}]),
        request_id: "req-cli-test".into(),
        requested_by: requested_by.into(),
        requested_client: "claude-desktop".into(),
        requester: serde_json::Value::Null,
        approvers_required: approvers,
        ttl: Duration::from_secs(1800),
        reason_required,
    }
}

fn spend(store: &mut ApprovalStore, id: &str) -> Result<(), Refusal> {
    store
        .spend(
            id,
            "terraform_apply",
            &json!({"working_dir": "terraform/offline-demo"}),
            Some(PLAN_SHA),
            "req-spend",
        )
        .expect("database")
        .map(|_| ())
}

fn os_user(name: &str) -> Approver {
    Approver {
        identity: None,
        name: name.into(),
        kind: "os_user",
        os_user: name.into(),
        signed: None,
    }
}

/// Approvers' keys (made by ssh-keygen) and policies that list them.
struct Keys {
    dir: tempfile::TempDir,
    policies: tempfile::TempDir,
}

fn keys(names: &[&str]) -> Keys {
    let dir = tempfile::tempdir().expect("keys");
    let made: Vec<(String, std::path::PathBuf)> = names
        .iter()
        .map(|n| (n.to_string(), common::ssh_key(dir.path(), n)))
        .collect();
    let signers: Vec<(&str, &Path)> = made
        .iter()
        .map(|(n, k)| (n.as_str(), k.as_path()))
        .collect();
    let policies = common::policies_with_signers(&signers, &[]);
    Keys { dir, policies }
}

impl Keys {
    /// `gateway --policies P VERB ID --key NAME ARGS...` (signed by NAME).
    fn signed(
        &self,
        home: &Path,
        verb: &str,
        id: &str,
        name: &str,
        args: &[&str],
    ) -> std::process::Output {
        gateway(home)
            .arg("--policies")
            .arg(self.policies.path())
            .args([verb, id, "--key"])
            .arg(self.dir.path().join(name))
            .args(args)
            .output()
            .expect("run")
    }
}

fn approved(home: &Path) -> String {
    let store = ApprovalStore::in_home(home).expect("open");
    let (a, _) = store
        .create(&new_approval("alice", 1, false))
        .expect("create");
    store
        .grant(&a.id, &os_user("bob"), "ok")
        .expect("db")
        .expect("granted");
    a.id
}

#[test]
fn of_32_concurrent_spender_threads_exactly_one_succeeds() {
    let home = tempfile::tempdir().expect("home");
    let id = approved(home.path());
    let barrier = Arc::new(Barrier::new(32));
    let handles: Vec<_> = (0..32)
        .map(|_| {
            let (home, id, barrier) = (home.path().to_path_buf(), id.clone(), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let mut store = ApprovalStore::in_home(&home).expect("open");
                barrier.wait();
                spend(&mut store, &id)
            })
        })
        .collect();
    let results: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("thread"))
        .collect();
    assert_eq!(
        results.iter().filter(|r| r.is_ok()).count(),
        1,
        "{results:?}"
    );
    for r in results.iter().filter(|r| r.is_err()) {
        assert_eq!(r, &Err(Refusal::AlreadySpent { id: id.clone() }));
    }
}

/// Run by `of_8_concurrent_spender_processes_exactly_one_succeeds` in child
/// processes (this test binary, re-executed): spends the approval named in
/// the environment and prints the outcome.
#[test]
#[ignore = "helper: run in child processes by the multi-process test"]
fn spender_child_process() {
    let home = std::env::var("SPEND_HOME").expect("SPEND_HOME");
    let id = std::env::var("SPEND_ID").expect("SPEND_ID");
    let start: u128 = std::env::var("SPEND_AT_MS")
        .expect("SPEND_AT_MS")
        .parse()
        .expect("ms");
    let mut store = ApprovalStore::in_home(Path::new(&home)).expect("open");
    // Line the processes up on a common start time.
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0)
    };
    while now() < start {
        std::thread::sleep(Duration::from_millis(1));
    }
    match spend(&mut store, &id) {
        Ok(()) => println!("OUTCOME:SPENT"),
        Err(r) => println!("OUTCOME:REFUSED:{r}"),
    }
}

#[test]
fn of_8_concurrent_spender_processes_exactly_one_succeeds() {
    let home = tempfile::tempdir().expect("home");
    let id = approved(home.path());
    let exe = std::env::current_exe().expect("test binary");
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_millis()
        + 1500;
    let children: Vec<_> = (0..8)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([
                    "--ignored",
                    "--exact",
                    "spender_child_process",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("SPEND_HOME", home.path())
                .env("SPEND_ID", &id)
                .env("SPEND_AT_MS", start.to_string())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let outcomes: Vec<String> = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().expect("child");
            assert!(out.status.success(), "{}", stdout(&out));
            stdout(&out)
                .lines()
                .find_map(|l| l.find("OUTCOME:").map(|i| l[i..].to_string()))
                .unwrap_or_else(|| "none".into())
        })
        .collect();
    assert_eq!(
        outcomes.iter().filter(|o| *o == "OUTCOME:SPENT").count(),
        1,
        "{outcomes:?}"
    );
    let refused = format!("OUTCOME:REFUSED:approval {id} was already spent");
    assert_eq!(
        outcomes.iter().filter(|o| **o == refused).count(),
        7,
        "{outcomes:?}"
    );
}

#[test]
fn of_8_concurrent_approve_processes_exactly_one_approves() {
    let home = tempfile::tempdir().expect("home");
    let store = ApprovalStore::in_home(home.path()).expect("open");
    let (a, _) = store
        .create(&new_approval("alice", 1, false))
        .expect("create");
    let names: Vec<String> = (0..8).map(|i| format!("approver{i}")).collect();
    let k = keys(&names.iter().map(String::as_str).collect::<Vec<_>>());
    let children: Vec<_> = (0..8)
        .map(|i| {
            gateway(home.path())
                .arg("--policies")
                .arg(k.policies.path())
                .args(["approve", &a.id, "--reason", "race", "--key"])
                .arg(k.dir.path().join(format!("approver{i}")))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let outs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().expect("wait"))
        .collect();
    assert_eq!(outs.iter().filter(|o| o.status.success()).count(), 1);
    for o in outs.iter().filter(|o| !o.status.success()) {
        assert!(stderr(o).contains("is already approved"), "{}", stderr(o));
    }
    let a = store.get(&a.id).expect("db").expect("exists");
    assert_eq!(a.grants(), 1);
}

#[test]
fn the_operator_cli_lists_shows_approves_and_refuses() {
    let home = tempfile::tempdir().expect("home");
    let me = gateway::identity::Caller::this_process().user;
    let store = ApprovalStore::in_home(home.path()).expect("open");
    let (a, _) = store.create(&new_approval(&me, 1, true)).expect("create");
    let k = keys(&["bob"]);

    let list = gateway(home.path())
        .args(["approvals"])
        .output()
        .expect("run");
    assert!(list.status.success());
    let text = stdout(&list);
    assert!(text.starts_with("ID"), "{text}");
    assert!(
        text.contains(&a.id) && text.contains("terraform_apply") && text.contains("0/1"),
        "{text}"
    );

    let show = gateway(home.path())
        .args(["approvals", "show", &a.id])
        .output()
        .expect("run");
    let text = stdout(&show);
    assert!(text.contains("DESTRUCTIVE SIGNALS (1)"), "{text}");
    assert!(
        text.contains("terraform_data.web will be destroyed and re-created"),
        "{text}"
    );
    assert!(
        text.contains("replace (destroy and re-create) (1):")
            && text.contains("replace_because_cannot_update"),
        "{text}"
    );
    // The page's order: the signals before the changes.
    assert!(
        text.find("DESTRUCTIVE SIGNALS") < text.find("planned changes (1: 1 replace)"),
        "{text}"
    );
    assert!(
        text.contains(&format!("requested by:  {me} via claude-desktop")),
        "{text}"
    );

    // The requester cannot approve their own call.
    let own = gateway(home.path())
        .args(["approve", &a.id, "--reason", "mine", "--no-sign"])
        .output()
        .expect("run");
    assert!(!own.status.success());
    assert!(
        stderr(&own).contains("requested this call and cannot approve it"),
        "{}",
        stderr(&own)
    );
    // The reason is required for this approval.
    let no_reason = k.signed(home.path(), "approve", &a.id, "bob", &[]);
    assert!(!no_reason.status.success());
    assert!(
        stderr(&no_reason).contains("requires a reason"),
        "{}",
        stderr(&no_reason)
    );
    // Bob approves.
    let ok = k.signed(
        home.path(),
        "approve",
        &a.id,
        "bob",
        &["--reason", "replacement expected"],
    );
    assert!(ok.status.success(), "{}", stderr(&ok));
    assert!(
        stdout(&ok).contains(&format!("approved {} as bob (key SHA256:", a.id)),
        "{}",
        stdout(&ok)
    );
    // Unknown ids.
    let unknown = gateway(home.path())
        .args(["approve", "ap-0000", "--no-sign"])
        .output()
        .expect("run");
    assert!(!unknown.status.success());
    assert!(stderr(&unknown).contains("no approval with id ap-0000"));

    let json = gateway(home.path())
        .args(["approvals", "--json"])
        .output()
        .expect("run");
    let v: Value = serde_json::from_slice(&json.stdout).expect("json");
    assert_eq!(v[0]["state"], "approved");
    assert_eq!(v[0]["verdicts"][0]["approver"], "bob");
    assert_eq!(v[0]["verdicts"][0]["kind"], "ssh_key");

    // The audit trail has every verdict and refusal, chained.
    let trail = gateway(home.path())
        .args(["audit", "--request-id", "req-cli-test", "--json"])
        .output()
        .expect("run");
    let events: Vec<String> = stdout(&trail)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|e| e["event"].as_str().map(str::to_string))
        .collect();
    assert_eq!(
        events,
        vec!["approval.refused", "approval.refused", "approval.granted"]
    );
    let verify = gateway(home.path())
        .args(["audit", "verify"])
        .output()
        .expect("run");
    assert!(verify.status.success(), "{}", stdout(&verify));
}

#[test]
fn deny_ends_an_approval() {
    let home = tempfile::tempdir().expect("home");
    let mut store = ApprovalStore::in_home(home.path()).expect("open");
    let (a, _) = store
        .create(&new_approval("alice", 1, false))
        .expect("create");
    let k = keys(&["bob", "carol"]);
    let d = k.signed(home.path(), "deny", &a.id, "bob", &["--reason", "not now"]);
    assert!(d.status.success(), "{}", stderr(&d));
    let again = k.signed(home.path(), "approve", &a.id, "carol", &[]);
    assert!(!again.status.success());
    assert!(stderr(&again).contains("was denied"));
    assert_eq!(
        spend(&mut store, &a.id),
        Err(Refusal::Denied { id: a.id.clone() })
    );
    assert!(
        stdout(
            &gateway(home.path())
                .args(["approvals"])
                .output()
                .expect("run")
        )
        .contains("no pending approvals")
    );
}

#[test]
fn a_name_given_on_the_command_line_is_no_identity_as_is_gone() {
    let home = tempfile::tempdir().expect("home");
    let store = ApprovalStore::in_home(home.path()).expect("open");
    let (a, _) = store
        .create(&new_approval("alice", 1, false))
        .expect("create");
    let out = gateway(home.path())
        .args(["approve", &a.id, "--as", "bob"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("unexpected argument '--as'"),
        "{}",
        stderr(&out)
    );
    assert_eq!(store.get(&a.id).expect("db").expect("exists").grants(), 0);
}

#[test]
fn readers_are_not_blocked_while_the_server_writes() {
    let home = tempfile::tempdir().expect("home");
    let writer_home = home.path().to_path_buf();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    // The "server": creates approvals and writes audit events in a loop.
    let writer = std::thread::spawn(move || {
        let store = ApprovalStore::in_home(&writer_home).expect("open");
        let audit = AuditLog::in_home(&writer_home).expect("audit");
        let mut n = 0;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            // Another working dir each time: a new plan of the same call
            // would supersede the older ones.
            let mut new = new_approval("alice", 1, false);
            new.params = json!({"working_dir": format!("terraform/m{n}")});
            let (a, _) = store.create(&new).expect("create while readers read");
            audit
                .append(
                    &a.request_id,
                    "approval.requested",
                    json!({"approval_id": a.id}),
                )
                .expect("audit");
            n += 1;
        }
        n
    });
    for _ in 0..10 {
        let list = gateway(home.path())
            .args(["approvals", "--json"])
            .output()
            .expect("run");
        assert!(list.status.success(), "{}", stderr(&list));
        assert!(serde_json::from_slice::<Value>(&list.stdout).is_ok());
        let verify = gateway(home.path())
            .args(["audit", "verify"])
            .output()
            .expect("run");
        assert!(verify.status.success(), "{}", stdout(&verify));
        // The CLI writes too (a refusal event) while the server writes.
        let refused = gateway(home.path())
            .args(["approve", "ap-missing", "--no-sign"])
            .output()
            .expect("run");
        assert!(
            stderr(&refused).contains("no approval with id"),
            "{}",
            stderr(&refused)
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written = writer.join().expect("writer");
    assert!(written > 10, "the writer kept writing ({written})");
    let verify = gateway(home.path())
        .args(["audit", "verify"])
        .output()
        .expect("run");
    assert!(
        verify.status.success(),
        "interleaved writers keep one chain: {}",
        stdout(&verify)
    );
}

/// An audit log under `home` with `n` events.
fn audit_of(home: &Path, n: usize) -> AuditLog {
    let audit = AuditLog::in_home(home).expect("audit");
    for i in 0..n {
        audit
            .append(&format!("req-{i}"), "tool.request", json!({"i": i}))
            .expect("append");
    }
    audit
}

/// `gateway --home HOME ARGS...`, run to its end.
fn cli(home: &Path, args: &[&str]) -> std::process::Output {
    gateway(home).args(args).output().expect("run")
}

#[test]
fn audit_verify_on_the_command_line_names_the_first_bad_line() {
    let home = tempfile::tempdir().expect("home");
    audit_of(home.path(), 5);
    let path = home.path().join("audit.jsonl");
    let ok = cli(home.path(), &["audit", "verify"]);
    assert!(
        ok.status.success() && stdout(&ok).contains("ok: 5 events verified"),
        "{}",
        stdout(&ok)
    );
    let text = std::fs::read_to_string(&path).expect("read");
    std::fs::write(&path, text.replacen("\"i\":3", "\"i\":4", 1)).expect("tamper");
    let bad = cli(
        home.path(),
        &["audit", "verify", "--file", &path.display().to_string()],
    );
    assert!(!bad.status.success());
    assert!(
        stdout(&bad).contains("line 4: hash does not match"),
        "{}",
        stdout(&bad)
    );
}

#[test]
fn audit_head_and_checkpoints_catch_events_removed_from_the_end() {
    let home = tempfile::tempdir().expect("home");
    let audit = audit_of(home.path(), 3);
    let head = cli(home.path(), &["audit", "head", "--json"]);
    assert!(head.status.success(), "{}", stderr(&head));
    let head: Value = serde_json::from_slice(&head.stdout).expect("json");
    assert_eq!(head["events"], 3);
    let checkpoint = head["head"].as_str().expect("head hash").to_string();
    let path = home.path().join("audit.jsonl");
    let at_checkpoint = std::fs::read(&path).expect("read");
    for i in 3..5 {
        audit
            .append(&format!("req-{i}"), "tool.result", json!({"i": i}))
            .expect("append");
    }
    let ok = cli(
        home.path(),
        &["audit", "verify", "--checkpoint", &checkpoint],
    );
    assert!(
        ok.status.success() && stdout(&ok).contains("ok: 5 events verified"),
        "{}",
        stdout(&ok)
    );
    let whole = std::fs::read(&path).expect("read");
    // Cut the last two events: a well-formed chain, but short of its head.
    std::fs::write(&path, &at_checkpoint).expect("cut");
    let cut = cli(home.path(), &["audit", "verify"]);
    assert!(!cut.status.success());
    assert!(
        stdout(&cut).contains("line 4: the log is")
            && stdout(&cut).contains("removed from the end"),
        "{}",
        stdout(&cut)
    );
    // On the whole log, a checkpoint that is not on the chain fails.
    std::fs::write(&path, &whole).expect("restore");
    let bogus = cli(
        home.path(),
        &["audit", "verify", "--checkpoint", &"0f".repeat(32)],
    );
    assert!(!bogus.status.success());
    assert!(
        stdout(&bogus).contains("is not on the chain"),
        "{}",
        stdout(&bogus)
    );
    // `audit head` refuses to print the head of a log that does not verify.
    std::fs::write(&path, &at_checkpoint).expect("cut");
    let refused = cli(home.path(), &["audit", "head"]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("does not verify"),
        "{}",
        stderr(&refused)
    );
    // The head replaced by a symlink to a head record kept elsewhere:
    // never read through. `verify` fails on
    // it as on a log that does not verify (exit 1, with its report), and
    // the listing warns.
    let head = gateway::audit::head_path(&path);
    let forged = home.path().join("forged-head");
    std::fs::copy(&head, &forged).expect("copy head");
    std::fs::remove_file(&head).expect("rm head");
    std::os::unix::fs::symlink(&forged, &head).expect("symlink");
    let linked = cli(home.path(), &["audit", "verify"]);
    assert_eq!(linked.status.code(), Some(1), "{}", stderr(&linked));
    assert!(
        stdout(&linked).contains("is damaged") && stdout(&linked).contains("not a regular file"),
        "{}",
        stdout(&linked)
    );
    let listed = cli(home.path(), &["audit"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert!(
        stderr(&listed).contains("warning: ") && stderr(&listed).contains("is damaged"),
        "{}",
        stderr(&listed)
    );
    // No head at all: the listing says what `verify` fails on.
    std::fs::remove_file(&head).expect("rm link");
    let listed = cli(home.path(), &["audit"]);
    assert!(
        stderr(&listed).contains("no head file"),
        "{}",
        stderr(&listed)
    );
    // The whole log removed, its head left: removal from the end (of every
    // event), not a gateway that never wrote one.
    std::fs::write(&path, &whole).expect("restore");
    std::fs::copy(&forged, &head).expect("head back");
    assert!(cli(home.path(), &["audit", "verify"]).status.success());
    std::fs::remove_file(&path).expect("rm log");
    let gone = cli(home.path(), &["audit", "verify"]);
    assert_eq!(gone.status.code(), Some(1), "{}", stderr(&gone));
    assert!(
        stdout(&gone).contains("removed from the end"),
        "{}",
        stdout(&gone)
    );
    let listed = cli(home.path(), &["audit"]);
    assert!(
        stderr(&listed).contains("does not verify")
            && stderr(&listed).contains("removed from the end"),
        "{}",
        stderr(&listed)
    );
}

#[test]
fn no_planted_secret_reaches_the_audit_file_or_any_cli_output() {
    let home = tempfile::tempdir().expect("home");
    let store = ApprovalStore::in_home(home.path()).expect("open");
    let mut n = new_approval("alice", 1, false);
    n.params = json!({"working_dir": format!("terraform/{VAULT_TOKEN}")});
    n.signals = json!([{"kind": "replace", "message": format!("token {JWT} in a message"), "address": "x"}]);
    n.plan_summary = json!([{"address": format!("x.{JWT}"), "actions": ["delete"], "reason": null, "paths": []}]);
    let (a, _) = store.create(&n).expect("create");
    let audit = AuditLog::in_home(home.path()).expect("audit");
    audit
        .append(
            &a.request_id,
            "credential.issued",
            json!({"lease_id": "kubernetes/creds/gateway-pod-reader-demo-app/abc", "token": "opaque-service-account-token",
                   "client_token": VAULT_TOKEN, "headers": {"Authorization": format!("Bearer {JWT}")}}),
        )
        .expect("append");
    let mut outputs = Vec::new();
    for args in [
        vec!["approvals"],
        vec!["approvals", "--json", "--all"],
        vec!["approvals", "show", a.id.as_str()],
        vec!["approvals", "show", a.id.as_str(), "--json"],
        vec![
            "approve",
            a.id.as_str(),
            "--no-sign",
            "--reason",
            VAULT_TOKEN,
        ],
        vec!["audit"],
        vec!["audit", "--json"],
        vec!["audit", "verify"],
    ] {
        let out = gateway(home.path()).args(&args).output().expect("run");
        outputs.push((format!("{args:?}"), stdout(&out) + &stderr(&out)));
    }
    outputs.push((
        "audit file".into(),
        std::fs::read_to_string(home.path().join("audit.jsonl")).expect("read"),
    ));
    for (what, text) in &outputs {
        for secret in [JWT, VAULT_TOKEN, "opaque-service-account-token"] {
            assert!(!text.contains(secret), "{what} leaks a secret:\n{text}");
        }
    }
    assert!(
        outputs
            .iter()
            .any(|(_, t)| t.contains("kubernetes/creds/gateway-pod-reader-demo-app/abc")),
        "lease ids are kept"
    );
}

/// Attack: an MCP client names itself (and its params) with terminal
/// escapes, to paint a benign summary over the destructive signals when
/// the approver runs `gateway approvals`. No command prints a raw ESC,
/// CSI, OSC, BEL or CR it got from outside.
#[test]
fn no_escape_sequence_from_a_client_reaches_the_approvers_terminal() {
    let home = tempfile::tempdir().expect("home");
    let me = gateway::identity::Caller::this_process().user;
    let hostile = "claude\r\x1b[2K\x1b[1A  0 to destroy, all safe\x1b]0;ok\x07\u{9b}2J\u{202e}";
    let mut approval = new_approval(&me, 1, false);
    approval.requested_client = hostile.into();
    approval.params = json!({"working_dir": format!("terraform/offline-demo\x1b[8m{hostile}")});
    let (a, _) = ApprovalStore::in_home(home.path())
        .expect("open")
        .create(&approval)
        .expect("create");
    AuditLog::in_home(home.path())
        .expect("audit")
        .append(
            "req-evil",
            "tool.request",
            json!({"tool": "terraform_apply", "principal": {"client": hostile}}),
        )
        .expect("append");
    for args in [
        vec!["approvals"],
        vec!["approvals", "--all"],
        vec!["approvals", "show", &a.id],
        vec!["approvals", "show", &a.id, "--json"],
        vec!["audit"],
        vec!["audit", "--json"],
        vec!["deny", &a.id, "--reason", hostile],
    ] {
        let out = cli(home.path(), &args);
        for (stream, bytes) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
            let text = String::from_utf8_lossy(bytes);
            let raw: Vec<char> = text
                .chars()
                .filter(|c| (c.is_control() && !matches!(c, '\n' | '\t')) || *c == '\u{202e}')
                .collect();
            assert!(
                raw.is_empty(),
                "gateway {args:?} wrote {raw:?} to {stream}: {text}"
            );
        }
        assert!(
            !out.stdout.is_empty() || !out.stderr.is_empty(),
            "{args:?} printed something"
        );
    }
    let show = cli(home.path(), &["approvals", "show", &a.id]);
    assert!(
        stdout(&show).contains("\\u{001b}[2K"),
        "shown escaped, not dropped: {}",
        stdout(&show)
    );
}

#[test]
fn audit_verify_refuses_a_duplicated_key_and_a_missing_head_unless_told() {
    let home = tempfile::tempdir().expect("home");
    audit_of(home.path(), 3);
    let path = home.path().join("audit.jsonl");
    let text = std::fs::read_to_string(&path).expect("read");
    // A second "event" key first: readers that keep the first see a grant.
    let forged = text.replacen("{", "{\"event\":\"approval.granted\",", 1);
    std::fs::write(&path, &forged).expect("tamper");
    let bad = cli(home.path(), &["audit", "verify"]);
    assert!(!bad.status.success());
    assert!(
        stdout(&bad).contains("line 1: duplicate key \"event\""),
        "{}",
        stdout(&bad)
    );
    std::fs::write(&path, &text).expect("restore");
    std::fs::remove_file(home.path().join("audit.jsonl.head")).expect("rm head");
    let no_head = cli(home.path(), &["audit", "verify"]);
    assert!(!no_head.status.success());
    assert!(
        stdout(&no_head).contains("no head file") && stdout(&no_head).contains("--no-head"),
        "{}",
        stdout(&no_head)
    );
    let told = cli(home.path(), &["audit", "verify", "--no-head"]);
    assert!(
        told.status.success() && stdout(&told).contains("ok: 3 events verified"),
        "{}",
        stdout(&told)
    );
}
