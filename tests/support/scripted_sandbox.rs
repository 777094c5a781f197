//! A scripted fake [`Sandbox`] (test code, never the product): it runs
//! nothing. Each request is answered from a script by what the request asks
//! for (a plan, a show of a saved plan, an apply), and every request is
//! recorded, so that pipeline flows run as ordinary tests, without root,
//! gVisor or Terraform. What it hands back is what a real run hands back
//! (a plan file that is a zip carrying its configuration, the plan's JSON,
//! a state), so the pipeline's own checks run on it unchanged.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

use gateway::protocol::Step;
use gateway::sandbox::{
    Captured, Ended, RunFuture, Sandbox, SandboxError, SandboxRequest, SandboxResult,
};
use gateway::tools;

/// What one sandbox was asked to do.
#[derive(Debug, Clone)]
pub struct Seen {
    pub name: String,
    pub phase: Phase,
    pub steps: Vec<Step>,
    pub files_in: BTreeMap<String, Vec<u8>>,
    pub credential: bool,
    pub files_out: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Plan,
    Show,
    Apply,
    Other,
}

pub struct Script {
    /// `main.tf` as the plan file carries it (tfconfig/ in the zip).
    pub config: String,
    /// The plan's JSON `terraform show -json` gives for it.
    pub plan_json: Vec<u8>,
    /// The state an apply leaves.
    pub state_after: Vec<u8>,
    /// Distinguishes plan files of successive plans (Terraform's differ too).
    pub plans_made: u32,
    /// Every plan file a plan sandbox handed back: show and apply accept
    /// only these, as Terraform refuses a file that is not a plan it wrote.
    pub made: Vec<Vec<u8>>,
}

/// Something to do as a sandbox "runs" (a fault injected mid-call).
pub type OnRun = Box<dyn Fn(Phase) + Send>;

pub struct ScriptedSandbox {
    pub script: Mutex<Script>,
    pub seen: Mutex<Vec<Seen>>,
    /// Run as each sandbox "runs" (a fault to inject mid-call).
    pub on_run: Mutex<Option<OnRun>>,
    /// When set, every run stops part way, as a pod that never started
    /// does: `SandboxError::Stopped` with these stages reached.
    pub stop_at: Mutex<Option<Vec<gateway::sandbox::StageMark>>>,
    scratch: tempfile::TempDir,
}

impl ScriptedSandbox {
    pub fn new(config: &str, plan_json: Vec<u8>, state_after: Vec<u8>) -> ScriptedSandbox {
        ScriptedSandbox {
            script: Mutex::new(Script {
                config: config.into(),
                plan_json,
                state_after,
                plans_made: 0,
                made: Vec::new(),
            }),
            seen: Mutex::new(Vec::new()),
            on_run: Mutex::new(None),
            stop_at: Mutex::new(None),
            scratch: tempfile::tempdir().expect("scratch"),
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("seen").clone()
    }

    pub fn phases(&self) -> Vec<Phase> {
        self.seen().iter().map(|s| s.phase).collect()
    }
}

/// A saved plan file as Terraform writes one: a zip with the plan and the
/// configuration under tfconfig/.
pub fn plan_file(config: &str, serial: u32) -> Vec<u8> {
    let mut buf = std::io::Cursor::new(Vec::new());
    {
        let mut zip = zip::ZipWriter::new(&mut buf);
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        zip.start_file("tfplan", opts).expect("zip");
        zip.write_all(format!("scripted plan {serial}").as_bytes())
            .expect("zip");
        zip.start_file("tfconfig/main.tf", opts).expect("zip");
        zip.write_all(config.as_bytes()).expect("zip");
        zip.finish().expect("zip");
    }
    buf.into_inner()
}

fn phase_of(steps: &[Step]) -> Phase {
    let has = |word: &str| {
        steps.iter().any(|s| {
            s.argv.first().map(String::as_str) == Some("terraform")
                && s.argv.get(1).map(String::as_str) == Some(word)
        })
    };
    if has("apply") {
        Phase::Apply
    } else if has("show") {
        Phase::Show
    } else if has("plan") {
        Phase::Plan
    } else {
        Phase::Other
    }
}

impl Sandbox for ScriptedSandbox {
    fn run(&self, req: SandboxRequest) -> RunFuture<'_> {
        Box::pin(async move {
            let files_in: BTreeMap<String, Vec<u8>> = req
                .files_in
                .iter()
                .map(|f| (f.path.clone(), f.contents.clone()))
                .collect();
            let steps: Vec<Step> = files_in
                .get(tools::STEPS_FILE)
                .and_then(|b| serde_json::from_slice(b).ok())
                .ok_or_else(|| SandboxError::Invalid("no steps file".into()))?;
            let phase = phase_of(&steps);
            self.seen.lock().expect("seen").push(Seen {
                name: req.name.clone(),
                phase,
                steps: steps.clone(),
                files_in,
                credential: req.credential.is_some(),
                files_out: req.files_out.clone(),
            });
            if let Some(hook) = self.on_run.lock().expect("hook").as_ref() {
                hook(phase);
            }
            let stop = self.stop_at.lock().expect("stop").clone();
            if let Some(stages) = stop {
                return Err(SandboxError::Stopped {
                    why: "scripted: the pod never started".into(),
                    stages,
                });
            }
            let mut script = self.script.lock().expect("script");
            let mut files_out = BTreeMap::new();
            let given = req
                .files_in
                .iter()
                .find(|f| f.path == "plan.tfplan")
                .map(|f| f.contents.clone());
            if matches!(phase, Phase::Show | Phase::Apply)
                && !given.as_ref().is_some_and(|g| script.made.contains(g))
            {
                return Ok(SandboxResult {
                    name: req.name,
                    exit_code: Some(1),
                    stdout: Captured::default(),
                    stderr: Captured {
                        bytes: b"Error: Failed to load \"plan.tfplan\" as a plan file\n".to_vec(),
                        truncated: false,
                    },
                    files_out,
                    duration_ms: 1,
                    ended: Ended::Exited,
                    endpoints: BTreeMap::new(),
                    stages: Vec::new(),
                });
            }
            match phase {
                Phase::Plan => {
                    script.plans_made += 1;
                    let file = plan_file(&script.config, script.plans_made);
                    script.made.push(file.clone());
                    files_out.insert(tools::PLAN_FILE.to_string(), file);
                }
                Phase::Show => {
                    files_out.insert(tools::PLAN_JSON.to_string(), script.plan_json.clone());
                }
                Phase::Apply => {
                    files_out.insert("terraform.tfstate".to_string(), script.state_after.clone());
                }
                Phase::Other => {}
            }
            Ok(SandboxResult {
                name: req.name,
                exit_code: Some(0),
                stdout: Captured::default(),
                stderr: Captured::default(),
                files_out,
                duration_ms: 1,
                ended: Ended::Exited,
                endpoints: BTreeMap::new(),
                stages: Vec::new(),
            })
        })
    }

    fn backend(&self) -> &'static str {
        "scripted"
    }

    fn uses_host_tools(&self) -> bool {
        false
    }

    fn scratch_dir(&self) -> PathBuf {
        self.scratch.path().join("scratch")
    }
}

/// The offline demo module's configuration and a plan fixture's JSON
/// (`policy-tests/plans/NAME/data.json`): what a scripted sandbox answers.
pub fn demo_script(plan_fixture: &str, state_after: Vec<u8>) -> ScriptedSandbox {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = std::fs::read_to_string(repo.join("terraform/offline-demo/main.tf"))
        .expect("the demo module's main.tf");
    let plan_json = std::fs::read(
        repo.join("policy-tests/plans")
            .join(plan_fixture)
            .join("data.json"),
    )
    .expect("the plan fixture");
    ScriptedSandbox::new(&config, plan_json, state_after)
}

/// A pipeline on the policies in `policies`, its state in `home`, the
/// modules in `workspace`, each sandbox answered by `sandbox`.
pub fn pipeline(
    policies: &std::path::Path,
    home: &std::path::Path,
    workspace: &std::path::Path,
    sandbox: std::sync::Arc<ScriptedSandbox>,
) -> (
    std::sync::Arc<gateway::policy::PolicyStore>,
    gateway::pipeline::Pipeline,
) {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let store = std::sync::Arc::new(gateway::policy::PolicyStore::open(
        vec![policies.to_path_buf()],
        gateway::policy::set::LoadOptions::default(),
    ));
    let p = gateway::pipeline::Pipeline::new(
        store.clone(),
        home.to_path_buf(),
        workspace.to_path_buf(),
        sandbox,
        gateway::tools::ToolPaths::discover(repo),
    )
    .expect("pipeline");
    (store, p)
}
