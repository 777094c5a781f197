//! The Terraform runners: `terraform_plan` and `terraform_apply`.
//!
//! Plan: the module is opened once (beneath the workspace, no link followed)
//! and locked; `init` and `plan -out` run in a sandbox on a copy of it (its
//! code runs there, with the plan's credential); the plan's JSON is made
//! from the saved plan file alone, in a second sandbox that holds nothing
//! of the module's and no credential; the policy decides again with the
//! plan and the configuration the plan file carries.
//!
//! Apply without an approval: plan, and when the policy needs a person's
//! approval, a pending approval bound to the params and the plan file's
//! digest. Apply with one: the saved plan it is bound to, never a fresh
//! one, decided again with the approval, spent once, applied on a copy of
//! the module; exactly the state files come back, checked.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};

use super::{RunnerFuture, ToolRunner};
use crate::pipeline::{Call, Outcome, Pipeline, Progress, SandboxCall, Step, Stop, Toolset, tail};
use crate::tools;
use crate::tools::module::{self, CopyCaps, ModuleDir, ModuleLock};
use gateway_audit::audit::Event;
use gateway_base::canonical::sha256_hex;
use gateway_policy::{Decision, DecisionInput, PlanInput};
use gateway_sandbox::FileIn;

pub struct Plan;
pub struct Apply;

impl ToolRunner for Plan {
    fn name(&self) -> &'static str {
        "terraform_plan"
    }

    fn result_schema(&self) -> Value {
        json!({"type": "object", "required": ["changes", "signals", "plan_sha256", "sandbox_ms"],
               "additionalProperties": false,
               "properties": {
                   "changes": super::changes_schema(),
                   "signals": super::signals_schema(),
                   "plan_sha256": {"type": "string", "description": "SHA-256 of the saved plan file"},
                   "sandbox_ms": {"type": "integer", "minimum": 0}}})
    }

    fn run<'a>(&'a self, p: &'a Pipeline, call: &'a mut Call, first: Decision) -> RunnerFuture<'a> {
        Box::pin(async move {
            let module = p.open_module(call, &first).await?;
            let (made, decision) = p.plan_and_decide(call, &first, &module).await?;
            let changes = gateway_audit::approvals::plan_summary(made.plan.value());
            let signals = serde_json::to_value(&decision.signals).unwrap_or(Value::Null);
            Ok(Outcome::Completed {
                ok: true,
                summary: summarize(&changes, &decision),
                result: json!({"changes": changes, "signals": signals, "plan_sha256": made.digest,
                               "sandbox_ms": made.sandbox_ms}),
            })
        })
    }
}

impl ToolRunner for Apply {
    fn name(&self) -> &'static str {
        "terraform_apply"
    }

    fn result_schema(&self) -> Value {
        let names = json!({"type": "array", "items": {"type": "string"}});
        json!({"type": "object",
               "required": ["plan_sha256", "exit_code", "ended", "state", "output", "errors"],
               "additionalProperties": false,
               "properties": {
                   "plan_sha256": {"type": "string", "description": "SHA-256 of the plan file that was applied"},
                   "exit_code": {"type": ["integer", "null"]},
                   "ended": super::ended_schema(),
                   "state": {"type": "object", "required": ["change", "serial", "problems"],
                             "additionalProperties": false,
                             "description": "what the apply did, read from the state before and after it",
                             "properties": {
                                 "change": {"type": "object", "required": ["added", "replaced", "removed"],
                                            "additionalProperties": false,
                                            "properties": {"added": names, "replaced": names, "removed": names}},
                                 "serial": {"type": ["integer", "null"]},
                                 "problems": {"type": "array", "items": {"type": "string"}}}},
                   "output": {"type": "string", "description": "the last lines terraform printed"},
                   "errors": {"type": "string", "description": "the last lines terraform wrote to stderr"}}})
    }

    fn run<'a>(&'a self, p: &'a Pipeline, call: &'a mut Call, first: Decision) -> RunnerFuture<'a> {
        Box::pin(async move {
            let approval_id = call
                .input
                .params
                .get("approval_id")
                .and_then(Value::as_str)
                .map(str::to_string);
            // The same call again with an approval it already spent: that
            // apply's outcome (the client may have gone away while it ran).
            if let Some(id) = &approval_id
                && let Some(outcome) = p.spent_outcome(call, &first, id).await?
            {
                return Ok(outcome);
            }
            // The module is opened and locked before anything else (an
            // approval is not spent on a module another call holds).
            let module = p.open_module(call, &first).await?;
            match approval_id {
                None => p.plan_for_approval(call, &first, &module).await,
                Some(id) => p.apply_approved(call, &first, &module, &id).await,
            }
        })
    }
}

/// A Terraform call's module: opened once, locked for the whole call.
struct Module {
    dir: Arc<ModuleDir>,
    _lock: ModuleLock,
}

/// A plan made and shown: its JSON (made from the saved plan file by
/// trusted code) and the SHA-256 of that file.
struct MadePlan {
    plan: PlanInput,
    /// The saved plan file's bytes, as made (and saved).
    plan_file: Vec<u8>,
    digest: String,
    /// Run time of the plan and show sandboxes together.
    sandbox_ms: u128,
    /// The configuration files the plan file carries, parsed.
    config_files: Value,
}

/// What a credential cut out of a sandbox's output or files is replaced with.
const REDACTED: &[u8] = b"<redacted>";

/// A sandbox step that did not succeed, as a refusal with how it ended and
/// the end of what it said.
fn failed(what: &str, r: &gateway_sandbox::SandboxResult) -> Stop {
    Stop::refused(format!(
        "{what} failed ({:?}):\n{}",
        r.ended,
        tail(&r.stderr.text(), 40)
    ))
}

/// `approval.refused` from the pipeline: with a reason of its own or the
/// store's refusal.
pub(super) fn refused_approval(
    approval_id: &str,
    reason: Option<&str>,
    refusal: Option<Value>,
) -> Event {
    Event::ApprovalRefused {
        approval_id: approval_id.into(),
        reason: reason.map(str::to_string),
        refusal,
        approver: None,
        action: None,
        os_user: None,
        identity: None,
    }
}

/// An apply's outcome kept with its approval, returned to a later call
/// with the same approval.
pub(super) fn replayed(kept: &Value, approval_id: &str, spender: &str) -> Outcome {
    let said = format!(
        "approval {approval_id} was spent by request {spender}; this is that apply's outcome."
    );
    match kept["status"].as_str() {
        Some("completed") => Outcome::Completed {
            ok: kept["ok"].as_bool().unwrap_or(false),
            summary: format!("{said}\n{}", kept["summary"].as_str().unwrap_or("")),
            result: kept["result"].clone(),
        },
        status => Outcome::Refused {
            reason: format!(
                "{said} It ended {}: {}",
                status.unwrap_or("without a status"),
                kept["reason"]
                    .as_str()
                    .or(kept["error"].as_str())
                    .unwrap_or("(no reason recorded)")
            ),
        },
    }
}

/// The call's params without its approval_id: what an approval is bound to.
pub(super) fn bound_params(params: &Value) -> Value {
    let mut bound = params.clone();
    if let Some(o) = bound.as_object_mut() {
        o.remove("approval_id");
    }
    bound
}

impl Pipeline {
    /// Open the call's module once (beneath the workspace, no link
    /// followed) and take its lock: one call at a time per module.
    async fn open_module(&self, call: &Call, decision: &Decision) -> Result<Module, Stop> {
        let wd = call
            .input
            .params
            .get("working_dir")
            .and_then(Value::as_str)
            .ok_or_else(|| Stop::refused("working_dir is missing"))?
            .to_string();
        let workspace = call.workspace.clone();
        let owner = call.workspace_owner;
        let locks = self.home.join("locks");
        let wait = Duration::from_secs(decision.sandbox.module_wait_seconds);
        tokio::task::spawn_blocking(move || {
            let dir = ModuleDir::open_owned(&workspace, &wd, owner)?;
            let lock = dir.lock(&locks, wait)?;
            Ok::<_, tools::ToolError>(Module {
                dir: Arc::new(dir),
                _lock: lock,
            })
        })
        .await
        .map_err(|e| Stop::refused(format!("opening the module: {e}")))?
        .map_err(|e| Stop::refused(e.to_string()))
    }

    /// A size-limited copy of the module for one sandbox.
    async fn copy_module(
        &self,
        module: &Module,
        decision: &Decision,
    ) -> Result<gateway_sandbox::Scratch, Stop> {
        let work = self
            .scratch(decision.sandbox.disk_bytes)
            .map_err(Stop::refused)?;
        let dest = work.path().to_path_buf();
        let dir = Arc::clone(&module.dir);
        let caps = CopyCaps {
            bytes: decision.sandbox.module_copy_bytes,
            files: decision.sandbox.module_copy_files,
        };
        tokio::task::spawn_blocking(move || dir.copy_to(&dest, caps))
            .await
            .map_err(|e| Stop::refused(format!("copying the module: {e}")))?
            .map_err(|e| Stop::refused(e.to_string()))?;
        Ok(work)
    }

    /// Plan: `init` and `plan -out` in a sandbox on a copy of the module
    /// (its code runs there, with the plan's credential); then the plan's
    /// JSON from the saved plan file alone, in a second sandbox that holds
    /// nothing of the module's and no credential. Both are saved under
    /// HOME/plans/<request id>.*.
    async fn make_plan(
        &self,
        progress: &Progress,
        input: &DecisionInput,
        decision: &Decision,
        module: &Module,
    ) -> Result<MadePlan, Stop> {
        let rid = input.request_id.clone();
        let work = self.copy_module(module, decision).await?;
        let r = self
            .run_sandbox(
                progress,
                &rid,
                decision,
                SandboxCall {
                    suffix: "",
                    tool: Toolset::Terraform,
                    steps: tools::terraform_plan_steps(tools::PLAN_FILE),
                    workdir: Some(work.path()),
                    files_in: vec![],
                    files_out: vec![tools::PLAN_FILE.into(), tools::LOCK_FILE.into()],
                    with_credential: true,
                },
            )
            .await?;
        // Everything else the plan sandbox wrote is discarded.
        drop(work);
        if !r.success() {
            return Err(failed("terraform plan", &r));
        }
        let Some(bin) = r.files_out.get(tools::PLAN_FILE).cloned() else {
            return Err(Stop::refused("terraform plan produced no plan file"));
        };
        let digest = sha256_hex(&bin);
        // What the plan file carries as configuration, for the policy (the
        // same bytes the approval is bound to, not the module dir).
        let config_files = tools::plan_config_files(
            &bin,
            decision.sandbox.module_copy_bytes,
            &self.live_secrets.all(),
        )
        .map_err(Stop::refused)?;

        // The providers the plan was made with, named by its lock file,
        // are installed from the trusted mirror for show to read schemas.
        let providers = match r
            .files_out
            .get(tools::LOCK_FILE)
            .map(|l| tools::locked_providers(l))
        {
            None => vec![],
            Some(Ok(p)) => p,
            Some(Err(e)) => return Err(Stop::refused(format!("the plan's lock file: {e}"))),
        };
        let show_dir = self
            .scratch(decision.sandbox.disk_bytes)
            .map_err(Stop::refused)?;
        let show_config = tools::show_config(&providers);
        if let (Some(cfg), Some(lock)) = (&show_config, r.files_out.get(tools::LOCK_FILE)) {
            let written = std::fs::write(show_dir.path().join(tools::SHOW_CONFIG), cfg)
                .and_then(|_| std::fs::write(show_dir.path().join(tools::LOCK_FILE), lock));
            if let Err(e) = written {
                return Err(Stop::refused(format!("preparing the show sandbox: {e}")));
            }
        }
        // The plan JSON is parsed and handed to the policy: its memory
        // grows with it, so it is read under the policy's plan_json_bytes.
        let mut show_decision = decision.clone();
        show_decision.sandbox.file_out_bytes = decision
            .sandbox
            .file_out_bytes
            .min(decision.sandbox.plan_json_bytes);
        let shown = self
            .run_sandbox(
                progress,
                &rid,
                &show_decision,
                SandboxCall {
                    suffix: "show",
                    tool: Toolset::Terraform,
                    steps: tools::terraform_show_steps(
                        &tools::plan_inside("plan.tfplan"),
                        tools::PLAN_JSON,
                        show_config.is_some(),
                    ),
                    workdir: Some(show_dir.path()),
                    files_in: vec![FileIn {
                        path: "plan.tfplan".into(),
                        contents: bin.clone(),
                    }],
                    files_out: vec![tools::PLAN_JSON.into()],
                    with_credential: false,
                },
            )
            .await?;
        drop(show_dir);
        if !shown.success() {
            return Err(failed("terraform show of the saved plan", &shown));
        }
        let Some(json_bytes) = shown.files_out.get(tools::PLAN_JSON) else {
            return Err(Stop::refused("terraform show wrote no plan JSON"));
        };
        // A value in the plan made from the credential file (an output, an
        // attribute) was cut out of its JSON above; the plan file itself
        // still holds it, and the apply would write it into the module's
        // state, in the agent's repository. Such a plan is not kept.
        if json_bytes.windows(REDACTED.len()).any(|w| w == REDACTED) {
            return Err(Stop::refused(
                "the plan holds a credential minted for this call in a value (an output or an attribute made from the credential file): it is not kept and cannot be applied; the credential has been revoked",
            ));
        }
        let plan = PlanInput::from_bytes(json_bytes, "the saved plan's JSON")
            .map_err(|e| Stop::refused(e.to_string()))?;
        let saved = self.plans.save(&rid, &bin, json_bytes)?;
        // Plans older than the policy keeps them go (an approval cannot
        // outlive its plan; the policy keeps retention above approval TTLs).
        self.plans.prune(self.plan_retention());
        self.audit.record(
            &rid,
            Event::PlanSaved {
                plan_file: saved.display().to_string(),
                sha256: digest.clone(),
                json_sha256: plan.sha256.clone(),
                shown_by: format!("{rid}-show"),
            },
        )?;
        progress.say("plan computed");
        Ok(MadePlan {
            plan,
            plan_file: bin,
            digest,
            sandbox_ms: r.duration_ms + shown.duration_ms,
            config_files: serde_json::to_value(config_files).unwrap_or(Value::Null),
        })
    }

    /// Keep `bytes` (a state an apply left) in HOME/quarantine, readable
    /// by the gateway's user only; returns where.
    fn keep_aside(&self, rid: &str, name: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let dir = self.home.join("quarantine");
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let path = dir.join(format!("{rid}.{name}"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        Ok(path)
    }

    /// Plan in a sandbox, then decide again with the plan in the input. A
    /// failed plan is a refusal, a deny stops the call.
    async fn plan_and_decide(
        &self,
        call: &mut Call,
        first: &Decision,
        module: &Module,
    ) -> Result<(MadePlan, Decision), Stop> {
        let made = self
            .make_plan(&call.progress, &call.input, first, module)
            .await?;
        call.input.plan = Some(made.plan.clone());
        call.input.plan_config_files = Some(made.config_files.clone());
        let decision = self.decide(&call.input, Step::Plan)?;
        Ok((made, decision))
    }

    /// Apply without an approval: plan; the approval gate (a pending
    /// approval bound to the params and the plan), or, when the policy
    /// needs none, apply that plan now.
    async fn plan_for_approval(
        &self,
        call: &mut Call,
        first: &Decision,
        module: &Module,
    ) -> Result<Outcome, Stop> {
        let (made, decision) = self.plan_and_decide(call, first, module).await?;
        let rid = call.request_id().to_string();
        if !decision.approval.required || decision.approval.satisfied {
            // An apply changes infrastructure: once it starts it runs to
            // its end, whatever the client does.
            call.commitment.commit(None, || ((), true))?;
            let _applying = self.applying(&rid, None);
            return self
                .apply_saved(
                    &call.progress,
                    &decision,
                    &rid,
                    made.plan_file,
                    &made.digest,
                    module,
                )
                .await;
        }
        let changes = gateway_audit::approvals::plan_summary(made.plan.value());
        let summary = gateway_audit::approvals::review::with_diffs(&changes, made.plan.value());
        self.request_approval(call, &decision, &made.digest, summary, changes)
    }

    /// Apply with an approval: the saved plan it is bound to, decided again
    /// with the approval in the input, the approval spent (bound params and
    /// plan digest checked), then applied.
    async fn apply_approved(
        &self,
        call: &mut Call,
        first: &Decision,
        module: &Module,
        approval_id: &str,
    ) -> Result<Outcome, Stop> {
        let rid = call.request_id().to_string();
        // An approval is bound to the user who asked for it, as it is to
        // the tool, params and plan: another user cannot spend it (nor
        // apply someone else's plan in their own workspace).
        let approval = self.requesters_approval(call, approval_id)?;
        let bin = match self.plans.plan_file(&approval.request_id) {
            Ok(b) => b,
            Err(stop) => {
                let reason = format!(
                    "the plan file approval {approval_id} is bound to is missing; plan and ask again"
                );
                self.audit
                    .record(&rid, refused_approval(approval_id, Some(&reason), None))?;
                drop(stop);
                return Err(Stop::refused(reason));
            }
        };
        let digest = sha256_hex(&bin);
        if let Ok(files) = tools::plan_config_files(
            &bin,
            first.sandbox.module_copy_bytes,
            &self.live_secrets.all(),
        ) {
            call.input.plan_config_files = Some(serde_json::to_value(files).unwrap_or(Value::Null));
        }
        if let Some(plan_json) = self.plans.plan_json(&approval.request_id)
            && let Ok(plan) = PlanInput::from_bytes(&plan_json, "the saved plan")
        {
            call.input.plan = Some(plan);
        }
        self.spend_and_run(
            call,
            &approval,
            &digest,
            Pipeline::whole,
            async |call, decision| {
                self.apply_saved(
                    &call.progress,
                    decision,
                    call.request_id(),
                    bin,
                    &digest,
                    module,
                )
                .await
            },
        )
        .await
    }

    /// A call with an approval that the same user's same call already
    /// spent: the outcome of that apply, waited for while it still runs
    /// here. `None`: not such a call (it goes on, and the store refuses
    /// what it must).
    pub(super) async fn spent_outcome(
        &self,
        call: &Call,
        first: &Decision,
        approval_id: &str,
    ) -> Result<Option<Outcome>, Stop> {
        let bound = bound_params(&call.input.params);
        let same_call = |a: &gateway_audit::approvals::Approval| {
            a.state == gateway_audit::approvals::State::Spent
                && a.requested_by == call.input.principal.id()
                && a.tool == call.input.tool
                && a.params_sha256 == gateway_base::canonical::call_digest(&call.input.tool, &bound)
        };
        let Some(mut approval) = self.approvals().get(approval_id)?.filter(same_call) else {
            return Ok(None);
        };
        let spender = approval.spent_request_id.clone().unwrap_or_default();
        let waited = Duration::from_secs(first.sandbox.deadline_seconds) + Duration::from_secs(60);
        let started = std::time::Instant::now();
        loop {
            if let Some(kept) = &approval.outcome {
                self.audit.record(
                    call.request_id(),
                    Event::ApprovalReplayed {
                        approval_id: approval_id.into(),
                        spent_by: spender.clone(),
                        status: kept["status"].as_str().unwrap_or("").to_string(),
                    },
                )?;
                return Ok(Some(replayed(kept, approval_id, &spender)));
            }
            let running_here = self
                .applying
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(&spender);
            if !running_here || started.elapsed() > waited {
                return Err(Stop::refused(format!(
                    "approval {approval_id} was spent by request {spender}, whose outcome is not recorded{}; `gateway approvals show {approval_id}` shows it once it is",
                    if running_here {
                        " yet: that apply is still running"
                    } else {
                        " (it is running in another replica, or ran in a gateway that stopped before it ended)"
                    }
                )));
            }
            call.progress.say(format!(
                "approval {approval_id} was spent by request {spender}, whose apply is still running: waiting for its outcome"
            ));
            tokio::time::sleep(Duration::from_millis(500)).await;
            approval = match self.approvals().get(approval_id)? {
                Some(a) => a,
                None => return Ok(None),
            };
        }
    }

    /// Apply `bin`, the saved plan file read once by the caller (the bytes
    /// whose digest the policy and the approval saw, never read again from
    /// disk), in a sandbox on a copy of the module, then write back exactly the state files (checked to be
    /// Terraform state of the module's lineage); the rest is discarded. The
    /// summary is made from the state before and after, not from what the
    /// sandbox printed.
    async fn apply_saved(
        &self,
        progress: &Progress,
        decision: &Decision,
        rid: &str,
        bin: Vec<u8>,
        digest: &str,
        module: &Module,
    ) -> Result<Outcome, Stop> {
        if sha256_hex(&bin) != digest {
            return Err(Stop::refused(
                "the plan file is not the one the decision was made on; nothing was applied",
            ));
        }
        let cap = decision.sandbox.file_out_bytes;
        let before = module
            .dir
            .read_state(cap)
            .map_err(|e| Stop::refused(e.to_string()))?
            .and_then(|b| module::check_state(&b).ok());
        let work = self.copy_module(module, decision).await?;
        progress.say("applying the saved plan");
        let r = self
            .run_sandbox(
                progress,
                rid,
                decision,
                SandboxCall {
                    suffix: "",
                    tool: Toolset::Terraform,
                    steps: tools::terraform_apply_steps(&tools::plan_inside("plan.tfplan")),
                    workdir: Some(work.path()),
                    files_in: vec![FileIn {
                        path: "plan.tfplan".into(),
                        contents: bin.clone(),
                    }],
                    files_out: module::STATE_FILES.iter().map(|s| s.to_string()).collect(),
                    with_credential: true,
                },
            )
            .await?;
        drop(work);
        // The state back, backup first so that the state is the last file
        // written. Every state that came back is first kept in
        // HOME/quarantine (owner only) until it is written, so that no
        // failure on the way loses what the apply did.
        let mut after = None;
        let mut state_problems = Vec::new();
        for name in module::STATE_FILES.iter().rev() {
            let Some(bytes) = r.files_out.get(*name) else {
                continue;
            };
            let kept = match self.keep_aside(rid, name, bytes) {
                Ok(p) => p,
                Err(e) => {
                    state_problems.push(format!(
                        "the {name} the apply left could not be kept aside ({e}); it is not written back"
                    ));
                    continue;
                }
            };
            let checked = module::check_state(bytes).and_then(|facts| match &before {
                Some(b) if *name == module::STATE_FILES[0] && b.lineage != facts.lineage => {
                    Err(format!(
                        "its lineage {} is not the module's ({})",
                        facts.lineage, b.lineage
                    ))
                }
                Some(b) if *name == module::STATE_FILES[0] && facts.serial < b.serial => {
                    Err(format!(
                        "its serial {} is older than the module's ({})",
                        facts.serial, b.serial
                    ))
                }
                _ => Ok(facts),
            });
            // A state that holds a call's credential (an output or an
            // attribute made from the credential file) is never written
            // where the agent reads it, in a git workspace: it stays in
            // quarantine, for the operator, even once the credential is
            // revoked (it may not have been).
            // What came back was already cut of every live credential (in
            // run_sandbox), so a credential shows here as the marker it was
            // replaced with; the check for the credential itself stays for
            // what a future change of that order would let through.
            let checked = checked.and_then(|facts| {
                let marked = bytes.windows(REDACTED.len()).any(|w| w == REDACTED);
                if marked || gateway_sandbox::holds_any(bytes, &self.live_secrets.all()) {
                    Err("it held a credential minted for a call (an output or attribute made from the credential file; cut out of the copy kept aside): it stays in quarantine for the operator, and the module's state is as it was before this apply".to_string())
                } else {
                    Ok(facts)
                }
            });
            let facts = match checked {
                Ok(f) => f,
                Err(why) => {
                    self.audit.record(
                        rid,
                        Event::StateRefused {
                            file: name.to_string(),
                            sha256: sha256_hex(bytes),
                            reason: why.clone(),
                            kept_at: kept.display().to_string(),
                        },
                    )?;
                    state_problems.push(format!(
                        "the {name} the apply left is not written back: {why} (kept at {})",
                        kept.display()
                    ));
                    continue;
                }
            };
            if let Err(e) = module.dir.write_state(name, bytes) {
                self.audit.record(
                    rid,
                    Event::StateRefused {
                        file: name.to_string(),
                        sha256: sha256_hex(bytes),
                        reason: e.to_string(),
                        kept_at: kept.display().to_string(),
                    },
                )?;
                state_problems.push(format!(
                    "{name} could not be written back: {e} (kept at {})",
                    kept.display()
                ));
                continue;
            }
            let _ = std::fs::remove_file(&kept);
            self.audit.record(
                rid,
                Event::StateSaved {
                    file: name.to_string(),
                    sha256: sha256_hex(bytes),
                    serial: facts.serial,
                    lineage: facts.lineage.clone(),
                },
            )?;
            if *name == module::STATE_FILES[0] {
                after = Some(facts);
            }
        }
        // An apply that ran leaves the module's state where the gateway
        // reads it; none there (a backend or workspace elsewhere in the
        // copy, which is discarded) is a failure, not "nothing changed".
        if r.success() && !r.files_out.contains_key(module::STATE_FILES[0]) {
            state_problems.push(
                "the apply left no terraform.tfstate in the module dir (a non-local backend, another state path or a workspace?): its state is lost with the sandbox; use the default local state".into(),
            );
        }
        let ok = r.success() && state_problems.is_empty();
        let change = state_change(before.as_ref(), after.as_ref());
        let summary = if r.success() {
            let mut s = format!(
                "Applied the approved plan. From the state: {} added, {} replaced, {} removed.",
                change.added.len(),
                change.replaced.len(),
                change.removed.len()
            );
            for (what, list) in [("replaced", &change.replaced), ("removed", &change.removed)] {
                if !list.is_empty() {
                    s.push_str(&format!("\n  {what}: {}", list.join(", ")));
                }
            }
            for p in &state_problems {
                s.push_str(&format!("\n  !! {p}"));
            }
            s
        } else {
            format!("terraform apply failed ({:?})", r.ended)
        };
        Ok(Outcome::Completed {
            ok,
            summary,
            result: json!({"plan_sha256": sha256_hex(&bin), "exit_code": r.exit_code, "ended": r.ended,
                           "state": {"change": change, "serial": after.as_ref().map(|a| a.serial),
                                     "problems": state_problems},
                           "output": tail(&r.stdout.text(), 60), "errors": tail(&r.stderr.text(), 40)}),
        })
    }
}
/// What an apply did, read from the state before and after it (not from
/// what the sandbox printed).
#[derive(Debug, Default, Serialize)]
struct StateChange {
    added: Vec<String>,
    replaced: Vec<String>,
    removed: Vec<String>,
}

fn state_change(
    before: Option<&module::StateFacts>,
    after: Option<&module::StateFacts>,
) -> StateChange {
    let Some(after) = after else {
        return StateChange::default();
    };
    let empty = module::StateFacts {
        lineage: String::new(),
        serial: 0,
        addresses: vec![],
        ids: Default::default(),
    };
    let before = before.unwrap_or(&empty);
    let b: std::collections::BTreeSet<&String> = before.addresses.iter().collect();
    let a: std::collections::BTreeSet<&String> = after.addresses.iter().collect();
    StateChange {
        added: a.difference(&b).map(|s| s.to_string()).collect(),
        removed: b.difference(&a).map(|s| s.to_string()).collect(),
        replaced: a
            .intersection(&b)
            .filter(|addr| matches!((before.ids.get(**addr), after.ids.get(**addr)), (Some(x), Some(y)) if x != y))
            .map(|s| s.to_string())
            .collect(),
    }
}

/// One line per planned change, then the signals.
pub fn summarize(changes: &Value, decision: &Decision) -> String {
    let list = changes.as_array().cloned().unwrap_or_default();
    let mut s = if list.is_empty() {
        "No changes: the infrastructure matches the configuration.".to_string()
    } else {
        format!("{} planned change(s):", list.len())
    };
    for c in &list {
        s.push_str(&format!(
            "\n  {} {}",
            c["actions"],
            c["address"].as_str().unwrap_or("?")
        ));
    }
    for sig in &decision.signals {
        s.push_str(&format!("\n  !! {}", sig.message));
    }
    s
}

/// The requester as the approvals policy knows them: the names its other
/// identities might carry are the policy's to derive.
pub(super) fn requester_facts(p: &gateway_policy::Principal) -> Value {
    let mut m = serde_json::Map::new();
    m.insert("kind".into(), json!(p.kind));
    m.insert("user".into(), json!(p.user));
    for (k, v) in [
        ("email", &p.email),
        ("issuer", &p.issuer),
        ("subject", &p.subject),
    ] {
        if let Some(v) = v {
            m.insert(k.into(), json!(v));
        }
    }
    Value::Object(m)
}
