//! Who approves is proven, never claimed: real `ssh-keygen` keys and
//! signatures, the real `gateway` binary, real SQLite. Each attack on the
//! signed statement is played and refused with its reason; k-of-n needs k
//! distinct keys; a signature made elsewhere is submitted with
//! `--signature FILE` and re-checks with stock `ssh-keygen -Y verify`;
//! `gateway audit verify` catches a forged or edited signature; `gateway
//! approvals watch` follows requests live.

mod common;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{gateway, stderr, stdout};
use gateway::approvals::{ApprovalStore, NewApproval};
use gateway::audit::AuditLog;
use serde_json::{Value, json};

const PLAN_SHA: &str = "3b5d3c7d207e37dceeedd301e35e2e58408a7a2c1d6f2e3b2a6c7d8e9f0a1b2c";

fn new_approval(requested_by: &str, approvers: u32) -> NewApproval {
    NewApproval {
        tool: "terraform_apply".into(),
        params: json!({"working_dir": "terraform/offline-demo"}),
        plan_sha256: Some(PLAN_SHA.into()),
        plan_summary: json!([{"address": "terraform_data.web", "actions": ["delete", "create"], "reason": null, "paths": []}]),
        signals: json!([{"kind": "replace", "message": "terraform_data.web will be destroyed and re-created"}]),
        request_id: "req-identity".into(),
        requested_by: requested_by.into(),
        requested_client: "test".into(),
        requester: serde_json::Value::Null,
        approvers_required: approvers,
        ttl: Duration::from_secs(1800),
        reason_required: false,
    }
}

/// A state dir, keys for `listed` (in the policies' allowed signers) and
/// for `unlisted`, and one pending approval requested by alice.
struct Setup {
    home: tempfile::TempDir,
    keys: tempfile::TempDir,
    policies: tempfile::TempDir,
    id: String,
}

fn setup(listed: &[&str], unlisted: &[&str], approvers: u32) -> Setup {
    let keys = tempfile::tempdir().expect("keys");
    let made: Vec<(String, PathBuf)> = listed
        .iter()
        .map(|n| (n.to_string(), common::ssh_key(keys.path(), n)))
        .collect();
    for n in unlisted {
        common::ssh_key(keys.path(), n);
    }
    let signers: Vec<(&str, &Path)> = made
        .iter()
        .map(|(n, k)| (n.as_str(), k.as_path()))
        .collect();
    let policies = common::policies_with_signers(&signers, &[]);
    let home = tempfile::tempdir().expect("home");
    let (a, _) = ApprovalStore::in_home(home.path())
        .expect("store")
        .create(&new_approval("alice", approvers))
        .expect("create");
    Setup {
        home,
        keys,
        policies,
        id: a.id,
    }
}

impl Setup {
    fn run(&self, args: &[&str]) -> std::process::Output {
        gateway(self.home.path())
            .arg("--policies")
            .arg(self.policies.path())
            .args(args)
            .output()
            .expect("run")
    }

    fn key(&self, name: &str) -> String {
        self.keys.path().join(name).display().to_string()
    }

    fn approve_with(&self, name: &str, reason: &str) -> std::process::Output {
        self.run(&[
            "approve",
            &self.id,
            "--reason",
            reason,
            "--key",
            &self.key(name),
        ])
    }

    fn grants(&self) -> u32 {
        ApprovalStore::in_home(self.home.path())
            .expect("store")
            .get(&self.id)
            .expect("db")
            .expect("exists")
            .grants()
    }

    /// `ssh-keygen -Y sign` of `file` with `name`'s key: FILE.sig.
    fn sign_file(&self, name: &str, file: &Path) -> PathBuf {
        let st = std::process::Command::new("ssh-keygen")
            .args(["-q", "-Y", "sign", "-n", "gateway-approval", "-f"])
            .arg(self.keys.path().join(name))
            .arg(file)
            .status()
            .expect("ssh-keygen");
        assert!(st.success());
        let mut sig = file.as_os_str().to_owned();
        sig.push(".sig");
        PathBuf::from(sig)
    }

    /// The statement the gateway gives for this approval, in a file.
    fn statement_file(&self, args: &[&str]) -> PathBuf {
        let mut all = vec!["approvals", "statement", self.id.as_str()];
        all.extend_from_slice(args);
        let out = self.run(&all);
        assert!(out.status.success(), "{}", stderr(&out));
        let path = self
            .keys
            .path()
            .join(format!("statement-{}.json", rand_suffix()));
        std::fs::write(&path, &out.stdout).expect("write");
        path
    }
}

fn rand_suffix() -> String {
    gateway::approvals::new_id().expect("id")[3..15].to_string()
}

fn refused(out: &std::process::Output, why: &str) {
    assert!(
        !out.status.success() && stderr(out).contains(why),
        "expected a refusal containing {why:?}: {}{}",
        stdout(out),
        stderr(out)
    );
}

#[test]
fn each_forged_stale_or_misdirected_signature_is_refused_with_its_reason() {
    let s = setup(&["bob", "alice"], &["eve"], 1);
    // A key the policy does not list.
    refused(
        &s.approve_with("eve", "ok"),
        "is not one of the policy's allowed signers",
    );
    // The requester's own key (listed, under the requester's name).
    refused(
        &s.approve_with("alice", "ok"),
        "alice requested this call and cannot approve it",
    );
    // A statement changed after it was signed (the reason, still canonical).
    let st = s.statement_file(&["--reason", "ok"]);
    let sig = s.sign_file("bob", &st);
    let text = std::fs::read_to_string(&st).expect("read");
    std::fs::write(&st, text.replace("\"reason\":\"ok\"", "\"reason\":\"OK\"")).expect("edit");
    refused(
        &s.run(&["approve", &s.id, "--signature", &sig.display().to_string()]),
        "does not verify",
    );
    // The same statement with spaces added: not the canonical bytes.
    std::fs::write(&st, text.replace("\":", "\": ")).expect("edit");
    refused(
        &s.run(&["approve", &s.id, "--signature", &sig.display().to_string()]),
        "canonical",
    );
    // A valid signature by an allowed key over a statement for another plan.
    let other = s.keys.path().join("other-plan.json");
    std::fs::write(&other, text.replace(PLAN_SHA, &"cd".repeat(32))).expect("write");
    let other_sig = s.sign_file("bob", &other);
    refused(
        &s.run(&[
            "approve",
            &s.id,
            "--signature",
            &other_sig.display().to_string(),
        ]),
        "the signed statement is for another plan digest than approval",
    );
    // A statement signed to deny, presented as an approval.
    let deny = s.statement_file(&["--verdict", "deny", "--reason", "no"]);
    let deny_sig = s.sign_file("bob", &deny);
    let text_deny = std::fs::read_to_string(&deny).expect("read");
    std::fs::write(&deny, &text_deny).expect("keep");
    refused(
        &s.run(&[
            "approve",
            &s.id,
            "--signature",
            &deny_sig.display().to_string(),
        ]),
        "the signed statement is for another verdict than approval",
    );
    // An expired statement.
    let stale = s.statement_file(&["--reason", "ok", "--valid-for", "0"]);
    let stale_sig = s.sign_file("bob", &stale);
    refused(
        &s.run(&[
            "approve",
            &s.id,
            "--signature",
            &stale_sig.display().to_string(),
        ]),
        "the signed statement expired",
    );
    // A signature in git's namespace (a commit signature) is no approval.
    let good = s.statement_file(&["--reason", "ok"]);
    let git_sig = s.keys.path().join("git.sig");
    let out = std::process::Command::new("ssh-keygen")
        .args(["-q", "-Y", "sign", "-n", "git", "-f"])
        .arg(s.keys.path().join("bob"))
        .stdin(std::fs::File::open(&good).expect("open"))
        .output()
        .expect("ssh-keygen");
    std::fs::write(&git_sig, &out.stdout).expect("write");
    refused(
        &s.run(&[
            "approve",
            &s.id,
            "--signature",
            &git_sig.display().to_string(),
            "--statement",
            &good.display().to_string(),
        ]),
        "namespace is \"git\"",
    );
    // A reason too long to keep whole in one audit line.
    refused(
        &s.approve_with("bob", &"x".repeat(5000)),
        "the reason is 5000 bytes",
    );
    refused(
        &s.approve_with("bob", "fine\u{202e}enod"),
        "the reason may not hold control or format characters",
    );
    assert_eq!(s.grants(), 0, "no refused verdict was recorded");

    // Every refusal is audited, with its reason and no grant (the
    // non-canonical statement never left the CLI: it is refused on reading).
    let log = std::fs::read_to_string(s.home.path().join("audit.jsonl")).expect("audit");
    let refusals = log
        .lines()
        .filter(|l| l.contains("\"approval.refused\""))
        .count();
    assert_eq!(refusals, 9, "{log}");
    assert!(!log.contains("approval.granted"));
}

#[test]
fn a_signature_made_elsewhere_is_submitted_and_anyone_can_recheck_it() {
    let s = setup(&["bob"], &[], 1);
    let st = s.statement_file(&["--reason", "reviewed the replacement"]);
    let sig = s.sign_file("bob", &st);
    let out = s.run(&["approve", &s.id, "--signature", &sig.display().to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("approved {} as bob (key SHA256:", s.id)),
        "{}",
        stdout(&out)
    );
    // Stock OpenSSH agrees, with the policy's own allowed signers.
    let signers = s.keys.path().join("allowed_signers");
    let public = std::fs::read_to_string(s.keys.path().join("bob.pub")).expect("pub");
    std::fs::write(
        &signers,
        format!("bob namespaces=\"gateway-approval\" {public}"),
    )
    .expect("write");
    let verify = std::process::Command::new("ssh-keygen")
        .args(["-Y", "verify", "-n", "gateway-approval", "-I", "bob", "-f"])
        .arg(&signers)
        .arg("-s")
        .arg(&sig)
        .stdin(std::fs::File::open(&st).expect("open"))
        .output()
        .expect("ssh-keygen");
    assert!(verify.status.success(), "{}", stderr(&verify));
    // Who signed, with which key, is shown and kept.
    let show = s.run(&["approvals", "show", &s.id]);
    assert!(
        stdout(&show).contains("grant by bob (signed with SSH key SHA256:"),
        "{}",
        stdout(&show)
    );
    let json: Value =
        serde_json::from_slice(&s.run(&["approvals", "show", &s.id, "--json"]).stdout)
            .expect("json");
    let v = &json["verdicts"][0];
    assert_eq!(v["kind"], "ssh_key");
    assert_eq!(
        v["statement"].as_str(),
        Some(std::fs::read_to_string(&st).expect("st").as_str())
    );
    assert!(
        v["signature"]
            .as_str()
            .is_some_and(|x| x.starts_with("-----BEGIN SSH SIGNATURE-----"))
    );
    let audit = s.run(&["audit", "verify"]);
    assert!(
        stdout(&audit).contains("(1 approval signature(s) checked)"),
        "{}",
        stdout(&audit)
    );
}

#[test]
fn k_of_n_needs_k_distinct_keys_and_two_keys_of_one_person_count_once() {
    let s = setup(&["bob", "carol"], &["bob2"], 2);
    // bob's second key, listed under the same name.
    let mut signers = std::fs::read_to_string(s.policies.path().join("config/approvers/data.yaml"))
        .expect("read");
    let second = std::fs::read_to_string(s.keys.path().join("bob2.pub")).expect("pub");
    signers.push_str(&format!("  bob {}\n", second.trim()));
    std::fs::write(
        s.policies.path().join("config/approvers/data.yaml"),
        signers,
    )
    .expect("write");

    let one = s.approve_with("bob", "ok");
    assert!(one.status.success(), "{}", stderr(&one));
    assert!(
        stdout(&one).contains("1 of 2 approvals given"),
        "{}",
        stdout(&one)
    );
    refused(&s.approve_with("bob", "again"), "bob already approved");
    refused(
        &s.approve_with("bob2", "my other key"),
        "bob already approved",
    );
    assert_eq!(s.grants(), 1);
    let two = s.approve_with("carol", "ok");
    assert!(two.status.success(), "{}", stderr(&two));
    assert!(stdout(&two).contains("approved"), "{}", stdout(&two));
    assert_eq!(s.grants(), 2);
}

#[test]
fn audit_verify_catches_a_forged_or_edited_signature() {
    let s = setup(&["bob"], &["eve"], 1);
    let ok = s.approve_with("bob", "fine");
    assert!(ok.status.success(), "{}", stderr(&ok));
    let log = std::fs::read_to_string(s.home.path().join("audit.jsonl")).expect("audit");
    let granted: Value = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["event"] == "approval.granted")
        .expect("granted");
    let data = granted["data"].clone();
    let statement = data["statement"].as_str().expect("statement").to_string();
    // eve signs bob's statement; the forger records it under bob's key.
    let file = s.keys.path().join("forged.json");
    std::fs::write(&file, &statement).expect("write");
    let eve_sig = std::fs::read_to_string(s.sign_file("eve", &file)).expect("sig");
    let mut forged = data.clone();
    forged["signature"] = eve_sig.into();
    let mut edited_reason = data.clone();
    edited_reason["reason"] = "something else".into();
    let mut other_key = data.clone();
    other_key["key_fingerprint"] = "SHA256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".into();
    let mut unsigned_claim = data.clone();
    unsigned_claim["kind"] = "os_user".into();
    for (what, event, why) in [
        (
            "a forged signature",
            forged,
            "approval signature does not verify",
        ),
        (
            "an edited reason",
            edited_reason,
            "the recorded reason is not the signed one",
        ),
        ("another key's fingerprint", other_key, "recorded as"),
        (
            "a signature recorded as unsigned",
            unsigned_claim,
            "is not recorded as signed",
        ),
    ] {
        // Written through the writer itself, so the hash chain holds: only
        // the signature check can catch it.
        let home = tempfile::tempdir().expect("home");
        let audit = AuditLog::in_home(home.path()).expect("audit");
        audit
            .append("req-x", "approval.granted", data.clone())
            .expect("append");
        audit
            .append("req-x", "approval.granted", event)
            .expect("append");
        let out = gateway(home.path())
            .args(["audit", "verify"])
            .output()
            .expect("run");
        assert!(!out.status.success(), "{what} passed: {}", stdout(&out));
        assert!(
            stdout(&out).contains("line 2") && stdout(&out).contains(why),
            "{what}: {}",
            stdout(&out)
        );
    }
}

#[test]
fn approvals_watch_follows_requests_as_they_come() {
    let s = setup(&["bob"], &[], 1);
    let mut child = gateway(s.home.path())
        .args(["approvals", "watch", "--interval", "1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("watch");
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a line").expect("read");
    assert!(
        first.starts_with(&format!("PENDING {}", s.id)) && first.contains("terraform_apply"),
        "{first}"
    );
    // A new plan of the same call: a new request, and the old one superseded.
    let (newer, gone) = ApprovalStore::in_home(s.home.path())
        .expect("store")
        .create(&new_approval("alice", 1))
        .expect("create");
    assert_eq!(gone, vec![s.id.clone()]);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.push(lines.next().expect("a line").expect("read"));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        seen.iter().any(
            |l| l.starts_with(&format!("NEW {}", newer.id)) && l.contains("requested by alice")
        ),
        "{seen:?}"
    );
    assert!(
        seen.iter().any(|l| l == &format!("SUPERSEDED {}", s.id)),
        "{seen:?}"
    );
}

/// A key whose private half only an ssh-agent holds signs through the
/// agent; an agent key added with `ssh-add -c` needs its confirmation each
/// time, and a refused confirmation approves nothing. (The agent's askpass
/// is a script the test answers through a file, in place of a person.)
#[test]
fn a_key_held_by_an_ssh_agent_signs_only_when_its_use_is_confirmed() {
    let s = setup(&["bob"], &[], 1);
    let dir = s.keys.path();
    let answer = dir.join("answer");
    let askpass = dir.join("askpass");
    std::fs::write(
        &askpass,
        format!(
            "#!/bin/sh\n[ \"$(cat {})\" = yes ] && echo yes && exit 0\nexit 1\n",
            answer.display()
        ),
    )
    .expect("askpass");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&askpass, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let sock = dir.join("agent.sock");
    let mut agent = std::process::Command::new("ssh-agent")
        .arg("-D")
        .arg("-a")
        .arg(&sock)
        .env("SSH_ASKPASS", &askpass)
        .env("SSH_ASKPASS_REQUIRE", "force")
        .env("DISPLAY", ":0")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("ssh-agent");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !sock.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let add = std::process::Command::new("ssh-add")
        .arg("-c")
        .arg(dir.join("bob"))
        .env("SSH_AUTH_SOCK", &sock)
        .output()
        .expect("ssh-add");
    assert!(add.status.success(), "{}", stderr(&add));
    // The private key is gone from disk: only the agent can sign.
    std::fs::remove_file(dir.join("bob")).expect("rm");
    let approve = || {
        gateway(s.home.path())
            .arg("--policies")
            .arg(s.policies.path())
            .args(["approve", &s.id, "--reason", "ok", "--key"])
            .arg(dir.join("bob.pub"))
            .env("SSH_AUTH_SOCK", &sock)
            .output()
            .expect("approve")
    };
    std::fs::write(&answer, "no").expect("answer");
    let refused_use = approve();
    let _ = std::fs::write(&answer, "yes");
    let confirmed = approve();
    let _ = agent.kill();
    let _ = agent.wait();
    assert!(
        !refused_use.status.success()
            && stderr(&refused_use).contains("cannot sign with ssh-keygen"),
        "{}{}",
        stdout(&refused_use),
        stderr(&refused_use)
    );
    assert!(
        confirmed.status.success() && stdout(&confirmed).contains("approved"),
        "{}{}",
        stdout(&confirmed),
        stderr(&confirmed)
    );
    assert_eq!(s.grants(), 1);
}
