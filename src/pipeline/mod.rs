//! The pipeline (README.md): one function of a request, used by `gateway demo`
//! (and by the MCP server once it exists), in this order:
//!
//! audit `tool.request` -> policy decision -> (apply) plan, decide again with
//! the plan, approval gate -> credential -> sandbox -> revoke -> audit
//! `tool.result` -> result.
//!
//! A call the policy denies, or that waits for approval, never reaches the
//! broker or the sandbox. An apply with an approval applies the saved plan
//! file whose digest the approval is bound to, never a fresh plan. One
//! request id threads through every event, the sandbox's name and the
//! approval.

pub mod limits;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};

use crate::approvals::{ApprovalStore, NewApproval};
use crate::audit::AuditLog;
use crate::broker::{Broker, RevokeGuard};
use crate::canonical::sha256_hex;
use crate::policy::{Decision, DecisionInput, PlanInput, PolicyStore, Principal};
use crate::sandbox::{
    Endpoint, FileIn, Network, Sandbox, SandboxRequest, SandboxResult, SecretFile,
};
use crate::tools::module::{self, CopyCaps, ModuleDir, ModuleLock};
use crate::tools::{self, ToolPaths};

/// How a call ended.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    /// The policy refused the call. `violations`: what is wrong with the
    /// params, as the policy found it (the agent can correct those).
    Denied {
        reasons: Vec<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        violations: Vec<crate::policy::decision::Violation>,
    },
    /// The call needs a person's approval; nothing was applied.
    PendingApproval {
        approval_id: String,
        signals: Value,
        changes: Value,
        approve_command: String,
    },
    /// Refused by a later check (approval, plan file, credential, sandbox setup).
    Refused { reason: String },
    /// The tool ran; `ok` is false when it failed inside the sandbox.
    Completed {
        ok: bool,
        summary: String,
        result: Value,
    },
}

#[derive(Debug, Clone, Serialize)]
pub struct CallResult {
    pub request_id: String,
    pub tool: String,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// A call as the agent makes it.
#[derive(Debug, Clone)]
pub struct ToolCall {
    pub tool: String,
    pub params: Value,
    pub principal: Principal,
}

/// Where progress messages go (the MCP server turns them into progress
/// notifications when the client asked for them).
#[derive(Debug, Clone, Default)]
pub struct Progress(Option<tokio::sync::mpsc::UnboundedSender<String>>);

impl Progress {
    pub fn new(tx: Option<tokio::sync::mpsc::UnboundedSender<String>>) -> Progress {
        Progress(tx)
    }
    fn say(&self, message: impl Into<String>) {
        if let Some(tx) = &self.0 {
            let _ = tx.send(message.into());
        }
    }
}

pub struct Pipeline {
    pub policy: Arc<PolicyStore>,
    pub home: PathBuf,
    /// Where agents' `working_dir`s are resolved (the repository).
    pub workspace: PathBuf,
    pub audit: Arc<AuditLog>,
    /// Where credentials come from; `None`: calls that need one are refused.
    pub broker: Option<Arc<dyn Broker>>,
    approvals: Mutex<ApprovalStore>,
    pub sandbox: Arc<dyn Sandbox>,
    pub tools: ToolPaths,
    /// Endpoint names a decision may allow, with their host ports.
    pub endpoints: BTreeMap<String, u16>,
    /// How a sandbox reaches the Kubernetes API server with a minted token
    /// (`None`: a Kubernetes credential cannot be used, calls are refused).
    pub kubernetes: Option<KubernetesAccess>,
    /// Credentials of the calls in flight (for redaction).
    live_secrets: LiveSecrets,
}

/// The API server as sandboxes see it: by endpoint name, with its CA.
#[derive(Debug, Clone)]
pub struct KubernetesAccess {
    pub endpoint: String,
    pub ca_pem: Vec<u8>,
    pub tls_server_name: String,
}

/// One sandbox of a call.
struct SandboxCall<'a> {
    /// The sandbox's name after the request id ("": the call's main sandbox).
    suffix: &'a str,
    runner: Runner,
    steps: Vec<tools::Step>,
    /// A throwaway dir of the pipeline's (never a module dir itself).
    workdir: Option<&'a Path>,
    files_in: Vec<FileIn>,
    files_out: Vec<String>,
    /// Whether this sandbox gets the decision's credential and egress.
    with_credential: bool,
}

/// A Terraform call's module: opened once, locked for the whole call.
struct Module {
    dir: Arc<ModuleDir>,
    _lock: ModuleLock,
}

/// A plan made and shown: its JSON (made from the saved plan file by
/// trusted code) and the SHA-256 of that file.
struct MadePlan {
    plan: Value,
    digest: String,
    /// Run time of the plan and show sandboxes together.
    sandbox_ms: u128,
    /// The configuration files the plan file carries, `{path: text}`.
    config_files: Value,
}

/// Every credential issued to a call still in flight, so that no sandbox's
/// output carries one (its own or another call's). A call's entries go
/// when the call ends, cancelled or not ([`CallSecrets`]).
#[derive(Default)]
pub struct LiveSecrets(Mutex<BTreeMap<(String, String), SecretFile>>);

impl LiveSecrets {
    fn add(&self, request_id: &str, lease_id: &str, secret: SecretFile) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((request_id.into(), lease_id.into()), secret);
    }

    fn all(&self) -> Vec<SecretFile> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    fn forget_call(&self, request_id: &str) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(rid, _), _| rid != request_id);
    }
}

/// Drops a call's live credentials from [`LiveSecrets`] when the call
/// ends, on every path.
struct CallSecrets<'a> {
    live: &'a LiveSecrets,
    request_id: String,
}

impl Drop for CallSecrets<'_> {
    fn drop(&mut self) {
        self.live.forget_call(&self.request_id);
    }
}

/// Which tool a sandbox runs (its binaries, environment and config files).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Runner {
    Terraform,
    Kubectl,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("home", &self.home)
            .field("workspace", &self.workspace)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Audit(#[from] crate::audit::AuditError),
    #[error(transparent)]
    Approvals(#[from] crate::approvals::ApprovalError),
}

impl Pipeline {
    pub fn new(
        policy: Arc<PolicyStore>,
        home: PathBuf,
        workspace: PathBuf,
        sandbox: Arc<dyn Sandbox>,
        tools: ToolPaths,
    ) -> Result<Pipeline, PipelineError> {
        std::fs::create_dir_all(home.join("plans")).map_err(|source| {
            crate::audit::AuditError::Io {
                path: home.join("plans"),
                source,
            }
        })?;
        Ok(Pipeline {
            audit: Arc::new(AuditLog::in_home(&home)?),
            broker: None,
            approvals: Mutex::new(ApprovalStore::in_home(&home)?),
            policy,
            home,
            workspace,
            sandbox,
            tools,
            endpoints: BTreeMap::new(),
            kubernetes: None,
            live_secrets: LiveSecrets::default(),
        })
    }

    fn decide(&self, input: &DecisionInput, step: &str) -> Result<Decision, PipelineError> {
        let ev = self.policy.decide(input);
        let mut audit_input = input.to_json();
        if let Some(obj) = audit_input.as_object_mut()
            && obj.contains_key("plan")
        {
            // The plan itself is in the plans dir; the log keeps its digest.
            let digest = input
                .plan
                .as_ref()
                .map(|p| sha256_hex(p.json.to_string().as_bytes()));
            obj.insert("plan".into(), json!({"sha256_of_json": digest}));
        }
        if let Some(obj) = audit_input.as_object_mut()
            && let Some(files) = obj.get("plan_config_files")
        {
            // Carried by the saved plan file; the log keeps their names.
            let names: Vec<String> = files
                .as_object()
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
            obj.insert("plan_config_files".into(), json!({"files": names}));
        }
        let result = serde_json::to_value(&ev.decision).unwrap_or(Value::Null);
        self.audit
            .policy_decision(&input.request_id, &audit_input, &result, &ev.policy)?;
        if let Some(err) = &ev.error {
            self.audit.append(
                &input.request_id,
                "policy.error",
                json!({"step": step, "error": err}),
            )?;
        }
        Ok(ev.decision)
    }

    /// Decide; a deny ends the call (with its `tool.result`).
    fn decide_or_deny(
        &self,
        input: &DecisionInput,
        step: &str,
        tool: &str,
    ) -> Result<Result<Decision, CallResult>, PipelineError> {
        let decision = self.decide(input, step)?;
        if decision.allow {
            return Ok(Ok(decision));
        }
        let denied = Outcome::Denied {
            reasons: decision.deny_reasons,
            violations: decision.violations,
        };
        Ok(Err(self.finish(&input.request_id, tool, denied)?))
    }

    fn finish(
        &self,
        request_id: &str,
        tool: &str,
        outcome: Outcome,
    ) -> Result<CallResult, PipelineError> {
        self.audit.append(
            request_id,
            "tool.result",
            serde_json::to_value(&outcome).unwrap_or(Value::Null),
        )?;
        Ok(CallResult {
            request_id: request_id.to_string(),
            tool: tool.to_string(),
            outcome,
        })
    }

    /// Run one call through the whole pipeline.
    pub async fn call(&self, call: ToolCall) -> Result<CallResult, PipelineError> {
        let rid = crate::policy::input::new_request_id();
        self.call_with(call, &rid, &Progress::default()).await
    }

    /// Run one call with a request id chosen by the caller (so that a
    /// cancelled call can still be named) and progress messages.
    pub async fn call_with(
        &self,
        call: ToolCall,
        request_id: &str,
        progress: &Progress,
    ) -> Result<CallResult, PipelineError> {
        let mut input = DecisionInput::new(
            call.tool.clone(),
            call.params.clone(),
            call.principal.clone(),
        );
        input.request_id = request_id.to_string();
        let rid = input.request_id.clone();
        let _secrets = CallSecrets {
            live: &self.live_secrets,
            request_id: rid.clone(),
        };
        self.audit.append(
            &rid,
            "tool.request",
            json!({"tool": call.tool, "params": call.params, "principal": call.principal}),
        )?;
        let decision = match self.decide_or_deny(&input, "request", &call.tool)? {
            Ok(d) => d,
            Err(denied) => return Ok(denied),
        };
        progress.say(format!(
            "policy allowed {} (tier {})",
            call.tool, decision.tier
        ));
        match call.tool.as_str() {
            "terraform_plan" => self.terraform_plan(&mut input, decision, progress).await,
            "terraform_apply" => self.terraform_apply(&mut input, decision, progress).await,
            "k8s_get_pod_status" => self.pod_status(&input, decision, progress).await,
            other => {
                // The policy knows the tool but this gateway has no runner for it.
                let reason =
                    format!("this gateway has no runner for tool {other}; nothing was run");
                self.finish(&rid, other, Outcome::Refused { reason })
            }
        }
    }

    fn network(&self, decision: &Decision) -> Result<Network, String> {
        if decision.sandbox.egress.is_empty() {
            return Ok(Network::None);
        }
        let mut list = Vec::new();
        for name in &decision.sandbox.egress {
            let port = self.endpoints.get(name).ok_or_else(|| {
                format!(
                    "the decision allows endpoint {name:?}, which this gateway has no address for"
                )
            })?;
            list.push(Endpoint {
                name: name.clone(),
                port: *port,
            });
        }
        Ok(Network::Endpoints(list))
    }

    /// Run one sandbox of a call: limits and network from the decision, a
    /// credential minted for it (when `call.with_credential` and the
    /// decision names one) and revoked as soon as it ends, its output
    /// cleared of every live credential, each step audited.
    async fn run_sandbox(
        &self,
        progress: &Progress,
        rid: &str,
        decision: &Decision,
        call: SandboxCall<'_>,
    ) -> Result<Result<SandboxResult, String>, PipelineError> {
        // A sandbox without the call's credential gets no egress either.
        let stripped;
        let decision = if call.with_credential {
            decision
        } else {
            let mut d = decision.clone();
            d.credential = None;
            d.sandbox.egress.clear();
            stripped = d;
            &stripped
        };
        let name = if call.suffix.is_empty() {
            rid.to_string()
        } else {
            format!("{rid}-{}", call.suffix)
        };
        if decision.credential.is_some() && self.broker.is_none() {
            let reason = "the decision needs a credential and no credential broker is configured; nothing was run";
            return Ok(Err(reason.into()));
        }
        let limits = match limits::from_decision(&decision.sandbox) {
            Ok(l) => l,
            Err(e) => return Ok(Err(e)),
        };
        let network = match self.network(decision) {
            Ok(n) => n,
            Err(e) => return Ok(Err(e)),
        };
        let (binds, mut env) = match call.runner {
            Runner::Terraform => (self.tools.terraform_binds(), tools::terraform_env()),
            Runner::Kubectl => (self.tools.kubectl_binds(), tools::kubectl_env()),
        };
        // The kubernetes backend's image carries the tools; the local
        // backend binds this host's.
        let binds = match binds {
            _ if !self.sandbox.uses_host_tools() => Vec::new(),
            Ok(b) => b,
            Err(e) => return Ok(Err(e.to_string())),
        };
        let mut files_in = call.files_in;
        files_in.push(FileIn {
            path: tools::STEPS_FILE.into(),
            contents: serde_json::to_vec(&call.steps).unwrap_or_default(),
        });
        if call.runner == Runner::Terraform {
            let mirror = self
                .sandbox
                .terraform_provider_mirror()
                .unwrap_or_else(|| tools::PROVIDER_MIRROR.to_string());
            files_in.push(FileIn {
                path: tools::TF_CLI_CONFIG.into(),
                contents: tools::terraformrc(&mirror).into_bytes(),
            });
        }
        // How the credential reaches the sandbox is the decision's
        // `credential.type`: a Kubernetes token comes with a kubeconfig
        // around its token file (without the API server's CA configured it
        // cannot be used). A type this gateway cannot hand over is refused.
        match decision
            .credential
            .as_ref()
            .map(|c| (c, c.credential_type.as_str()))
        {
            None => {}
            Some((scope, "kubernetes")) => match self.kubeconfig_file(scope) {
                Ok(file) => {
                    files_in.push(file);
                    env.push(("KUBECONFIG".into(), tools::kubeconfig_inside()));
                    env.push(("KUBE_CONFIG_PATH".into(), tools::kubeconfig_inside()));
                }
                Err(e) => return Ok(Err(e)),
            },
            Some((_, other)) => {
                return Ok(Err(format!(
                    "the decision's credential is of type {other:?}, which this gateway cannot hand to a sandbox (it knows: kubernetes); nothing was run"
                )));
            }
        }
        // Everything is checked; only now is a credential minted, and from
        // here on it is revoked on every path (the guard covers
        // cancellation and panics).
        let mut credential = None;
        let mut revoke = None;
        if let (Some(scope), Some(broker)) = (&decision.credential, &self.broker) {
            match crate::broker::issue_for_call(broker, &self.audit, rid, scope).await {
                Ok(c) => {
                    progress.say("credential issued");
                    revoke = Some(RevokeGuard::new(
                        Arc::clone(broker),
                        Arc::clone(&self.audit),
                        rid,
                        &c.lease_id,
                    ));
                    self.live_secrets.add(rid, &c.lease_id, c.secret.clone());
                    self.audit.append(
                        rid,
                        "credential.issued",
                        json!({"lease_id": c.lease_id, "mount": scope.mount, "role": scope.role,
                               "params": scope.params, "ttl_seconds": c.ttl.as_secs(), "credential": c.meta}),
                    )?;
                    credential = Some(c.secret.clone());
                }
                Err(e) => {
                    self.audit.append(
                        rid,
                        "credential.refused",
                        json!({"mount": scope.mount, "role": scope.role, "error": e.to_string()}),
                    )?;
                    return Ok(Err(format!(
                        "no credential for this call ({e}); nothing was run"
                    )));
                }
            }
        }
        let req = SandboxRequest {
            name: name.clone(),
            argv: tools::runner_argv(),
            env,
            binds,
            workdir: call.workdir.map(Path::to_path_buf),
            files_in,
            credential,
            limits: limits.0,
            deadline: limits.1,
            network,
            files_out: call.files_out,
        };
        self.audit.append(
            rid,
            "sandbox.started",
            json!({"sandbox": name, "backend": self.sandbox.backend(), "limits": limits.0, "deadline_seconds": limits.1.as_secs(),
                   "egress": decision.sandbox.egress, "credential": req.credential.is_some(), "steps": call.steps}),
        )?;
        progress.say(format!("sandbox {name} started"));
        let mut outcome = self.sandbox.run(req).await;
        // The tool's output goes into the result and the audit: it must not
        // carry any live credential (this call's or another's in flight),
        // whatever the tool printed and however it encoded it.
        if let Ok(r) = &mut outcome {
            let secrets = self.live_secrets.all();
            r.stdout.redact_all(&secrets);
            r.stderr.redact_all(&secrets);
            // Text files out too (the plan JSON shows outputs' values, a
            // state holds attributes); a binary plan file keeps its bytes
            // (it is kept in the gateway's home, and the lease is revoked
            // below anyway).
            for bytes in r.files_out.values_mut() {
                if std::str::from_utf8(bytes).is_ok() {
                    let mut c = crate::sandbox::Captured {
                        bytes: std::mem::take(bytes),
                        truncated: false,
                    };
                    c.redact_all(&secrets);
                    *bytes = c.bytes;
                }
            }
        }
        let audited = match &outcome {
            Ok(r) => self.audit.append(
                rid,
                "sandbox.completed",
                json!({"sandbox": name, "exit_code": r.exit_code, "ended": r.ended, "duration_ms": r.duration_ms,
                       "stdout_truncated": r.stdout.truncated, "stderr_truncated": r.stderr.truncated}),
            ),
            Err(crate::sandbox::SandboxError::Output(e)) => self.audit.append(
                rid,
                "sandbox.output_refused",
                json!({"sandbox": name, "reason": e.to_string()}),
            ),
            Err(e) => self.audit.append(
                rid,
                "sandbox.failed",
                json!({"sandbox": name, "error": e.to_string()}),
            ),
        };
        // Revoke as soon as the sandbox has ended, whatever happened in it.
        if let Some(guard) = revoke {
            guard.revoke().await;
        }
        audited?;
        match outcome {
            Ok(r) => Ok(Ok(r)),
            Err(e) => Ok(Err(format!("sandbox: {e}"))),
        }
    }

    /// The kubeconfig for a Kubernetes credential scope: the API server by
    /// its endpoint name, its CA, the token from the credential file.
    fn kubeconfig_file(&self, scope: &crate::policy::CredentialScope) -> Result<FileIn, String> {
        let k = self.kubernetes.as_ref().ok_or(
            "the decision's credential is for Kubernetes and this gateway has no [kubernetes] ca_file configured; nothing was run",
        )?;
        let port = self.endpoints.get(&k.endpoint).ok_or_else(|| {
            format!(
                "the Kubernetes API server endpoint {:?} has no port configured ([endpoints]); nothing was run",
                k.endpoint
            )
        })?;
        let namespace = scope
            .params
            .get("kubernetes_namespace")
            .filter(|n| !n.is_empty())
            .ok_or("the decision's Kubernetes credential names no params.kubernetes_namespace; nothing was run")?;
        let text = crate::broker::kubeconfig::kubeconfig(
            &format!("https://{}:{port}", k.endpoint),
            &k.ca_pem,
            &k.tls_server_name,
            crate::sandbox::CREDENTIAL_PATH,
            namespace,
        );
        Ok(FileIn {
            path: tools::KUBECONFIG_FILE.into(),
            contents: text.into_bytes(),
        })
    }

    /// `k8s_get_pod_status`: `kubectl get pods` in the namespace the
    /// decision's credential is scoped to (never the agent's string), with
    /// the minted token, in a sandbox that reaches only the API server.
    async fn pod_status(
        &self,
        input: &DecisionInput,
        decision: Decision,
        progress: &Progress,
    ) -> Result<CallResult, PipelineError> {
        let rid = input.request_id.clone();
        let tool = "k8s_get_pod_status";
        let Some(namespace) = decision
            .credential
            .as_ref()
            .and_then(|c| c.params.get("kubernetes_namespace"))
            .cloned()
        else {
            let reason = "the decision names no credential scoped to a namespace; nothing was run";
            return self.finish(
                &rid,
                tool,
                Outcome::Refused {
                    reason: reason.into(),
                },
            );
        };
        if self.broker.is_none() {
            let reason = format!(
                "{tool} needs a credential and no credential broker is configured; nothing was run"
            );
            return self.finish(&rid, tool, Outcome::Refused { reason });
        }
        let r = match self
            .run_sandbox(
                progress,
                &rid,
                &decision,
                SandboxCall {
                    suffix: "",
                    runner: Runner::Kubectl,
                    steps: tools::kubectl_get_pods_steps(&namespace, &tools::kubeconfig_inside()),
                    workdir: None,
                    files_in: vec![],
                    files_out: vec![],
                    with_credential: true,
                },
            )
            .await?
        {
            Ok(r) => r,
            Err(reason) => return self.finish(&rid, tool, Outcome::Refused { reason }),
        };
        if !r.success() {
            return self.finish(
                &rid,
                tool,
                Outcome::Completed {
                    ok: false,
                    summary: format!("kubectl get pods failed ({:?})", r.ended),
                    result: json!({"namespace": namespace, "exit_code": r.exit_code, "ended": r.ended,
                                   "errors": tail(&r.stderr.text(), 20)}),
                },
            );
        }
        let (ok, summary, result) = match tools::pod_table(&r.stdout.bytes) {
            Ok(pods) => (
                true,
                tools::pod_summary(&namespace, &pods),
                json!({"namespace": namespace, "pods": pods}),
            ),
            Err(e) => (
                false,
                format!("kubectl's answer could not be read: {e}"),
                json!({"namespace": namespace}),
            ),
        };
        self.finish(
            &rid,
            tool,
            Outcome::Completed {
                ok,
                summary,
                result,
            },
        )
    }

    /// Open the call's module once (beneath the workspace, no link
    /// followed) and take its lock: one call at a time per module.
    async fn open_module(
        &self,
        input: &DecisionInput,
        decision: &Decision,
    ) -> Result<Module, String> {
        let wd = input
            .params
            .get("working_dir")
            .and_then(Value::as_str)
            .ok_or("working_dir is missing")?
            .to_string();
        let workspace = self.workspace.clone();
        let locks = self.home.join("locks");
        let wait = Duration::from_secs(decision.sandbox.module_wait_seconds);
        tokio::task::spawn_blocking(move || {
            let dir = ModuleDir::open(&workspace, &wd)?;
            let lock = dir.lock(&locks, wait)?;
            Ok::<_, tools::ToolError>(Module {
                dir: Arc::new(dir),
                _lock: lock,
            })
        })
        .await
        .map_err(|e| format!("opening the module: {e}"))?
        .map_err(|e| e.to_string())
    }

    /// A new, empty working dir for one sandbox, where the backend can
    /// mount it from; removed when dropped.
    fn scratch(&self) -> Result<tempfile::TempDir, String> {
        let root = self.sandbox.scratch_dir();
        let group = self.sandbox.scratch_group_writable();
        crate::sandbox::beneath::private_dir(&root, if group { 0o770 } else { 0o700 }, group)
            .map_err(|e| format!("the sandboxes' scratch dir: {e}"))?;
        tempfile::Builder::new()
            .prefix("work-")
            .tempdir_in(&root)
            .map_err(|e| format!("making a working dir under {}: {e}", root.display()))
    }

    /// A size-limited copy of the module for one sandbox.
    async fn copy_module(
        &self,
        module: &Module,
        decision: &Decision,
    ) -> Result<tempfile::TempDir, String> {
        let work = self.scratch()?;
        let dest = work.path().to_path_buf();
        let dir = Arc::clone(&module.dir);
        let caps = CopyCaps {
            bytes: decision.sandbox.module_copy_bytes,
            files: decision.sandbox.module_copy_files,
        };
        tokio::task::spawn_blocking(move || dir.copy_to(&dest, caps))
            .await
            .map_err(|e| format!("copying the module: {e}"))?
            .map_err(|e| e.to_string())?;
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
    ) -> Result<Result<MadePlan, String>, PipelineError> {
        let rid = input.request_id.clone();
        let work = match self.copy_module(module, decision).await {
            Ok(w) => w,
            Err(e) => return Ok(Err(e)),
        };
        let r = match self
            .run_sandbox(
                progress,
                &rid,
                decision,
                SandboxCall {
                    suffix: "",
                    runner: Runner::Terraform,
                    steps: tools::terraform_plan_steps(tools::PLAN_FILE),
                    workdir: Some(work.path()),
                    files_in: vec![],
                    files_out: vec![tools::PLAN_FILE.into(), tools::LOCK_FILE.into()],
                    with_credential: true,
                },
            )
            .await?
        {
            Ok(r) => r,
            Err(e) => return Ok(Err(e)),
        };
        // Everything else the plan sandbox wrote is discarded.
        drop(work);
        if !r.success() {
            return Ok(Err(format!(
                "terraform plan failed ({:?}):\n{}",
                r.ended,
                tail(&r.stderr.text(), 40)
            )));
        }
        let Some(bin) = r.files_out.get(tools::PLAN_FILE).cloned() else {
            return Ok(Err("terraform plan produced no plan file".into()));
        };
        let digest = sha256_hex(&bin);
        // What the plan file carries as configuration, for the policy (the
        // same bytes the approval is bound to, not the module dir).
        let config_files = match tools::plan_config_files(
            &bin,
            decision.sandbox.module_copy_bytes,
            &self.live_secrets.all(),
        ) {
            Ok(f) => f,
            Err(e) => return Ok(Err(e)),
        };

        // The providers the plan was made with, named by its lock file,
        // are installed from the trusted mirror for show to read schemas.
        let providers = match r
            .files_out
            .get(tools::LOCK_FILE)
            .map(|l| tools::locked_providers(l))
        {
            None => vec![],
            Some(Ok(p)) => p,
            Some(Err(e)) => return Ok(Err(format!("the plan's lock file: {e}"))),
        };
        let show_dir = match self.scratch() {
            Ok(d) => d,
            Err(e) => return Ok(Err(e)),
        };
        let show_config = tools::show_config(&providers);
        if let (Some(cfg), Some(lock)) = (&show_config, r.files_out.get(tools::LOCK_FILE)) {
            let written = std::fs::write(show_dir.path().join(tools::SHOW_CONFIG), cfg)
                .and_then(|_| std::fs::write(show_dir.path().join(tools::LOCK_FILE), lock));
            if let Err(e) = written {
                return Ok(Err(format!("preparing the show sandbox: {e}")));
            }
        }
        let shown = match self
            .run_sandbox(
                progress,
                &rid,
                decision,
                SandboxCall {
                    suffix: "show",
                    runner: Runner::Terraform,
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
            .await?
        {
            Ok(r) => r,
            Err(e) => return Ok(Err(e)),
        };
        drop(show_dir);
        if !shown.success() {
            return Ok(Err(format!(
                "terraform show of the saved plan failed ({:?}):\n{}",
                shown.ended,
                tail(&shown.stderr.text(), 40)
            )));
        }
        let Some(json_bytes) = shown.files_out.get(tools::PLAN_JSON) else {
            return Ok(Err("terraform show wrote no plan JSON".into()));
        };
        let plan = match crate::policy::plan::parse_plan(json_bytes, "the saved plan's JSON") {
            Ok(p) => p,
            Err(e) => return Ok(Err(e.to_string())),
        };
        let saved = self.plan_path(&rid, "tfplan");
        if let Err(e) = std::fs::write(&saved, &bin) {
            return Ok(Err(format!("saving the plan file: {e}")));
        }
        if let Err(e) = std::fs::write(self.plan_path(&rid, "json"), json_bytes) {
            return Ok(Err(format!("saving the plan's JSON: {e}")));
        }
        self.audit.append(
            &rid,
            "plan.saved",
            json!({"plan_file": saved.display().to_string(), "sha256": digest,
                   "json_sha256": sha256_hex(json_bytes), "shown_by": format!("{rid}-show")}),
        )?;
        progress.say("plan computed");
        Ok(Ok(MadePlan {
            plan,
            digest,
            sandbox_ms: r.duration_ms + shown.duration_ms,
            config_files: serde_json::to_value(config_files).unwrap_or(Value::Null),
        }))
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

    /// HOME/plans/<request id>.<ext>: the one place saved plans live.
    fn plan_path(&self, request_id: &str, ext: &str) -> PathBuf {
        self.home.join("plans").join(format!("{request_id}.{ext}"))
    }

    /// Plan in a sandbox, then decide again with the plan in the input. A
    /// failed plan is a refusal, a deny ends the call.
    async fn plan_and_decide(
        &self,
        progress: &Progress,
        input: &mut DecisionInput,
        first: &Decision,
        tool: &str,
        module: &Module,
    ) -> Result<Result<(MadePlan, Decision), CallResult>, PipelineError> {
        let rid = input.request_id.clone();
        let made = match self.make_plan(progress, input, first, module).await? {
            Ok(p) => p,
            Err(reason) => return Ok(Err(self.finish(&rid, tool, Outcome::Refused { reason })?)),
        };
        input.plan = Some(PlanInput::new(made.plan.clone()));
        input.plan_config_files = Some(made.config_files.clone());
        Ok(self.decide_or_deny(input, "plan", tool)?.map(|d| (made, d)))
    }

    async fn terraform_plan(
        &self,
        input: &mut DecisionInput,
        first: Decision,
        progress: &Progress,
    ) -> Result<CallResult, PipelineError> {
        let rid = input.request_id.clone();
        let tool = "terraform_plan";
        let module = match self.open_module(input, &first).await {
            Ok(m) => m,
            Err(reason) => return self.finish(&rid, tool, Outcome::Refused { reason }),
        };
        let (made, decision) = match self
            .plan_and_decide(progress, input, &first, tool, &module)
            .await?
        {
            Ok(p) => p,
            Err(ended) => return Ok(ended),
        };
        let changes = crate::approvals::plan_summary(&made.plan);
        let signals = serde_json::to_value(&decision.signals).unwrap_or(Value::Null);
        let summary = summarize(&changes, &decision);
        let digest = made.digest;
        self.finish(
            &rid,
            tool,
            Outcome::Completed {
                ok: true,
                summary,
                result: json!({"changes": changes, "signals": signals, "plan_sha256": digest, "sandbox_ms": made.sandbox_ms}),
            },
        )
    }

    async fn terraform_apply(
        &self,
        input: &mut DecisionInput,
        first: Decision,
        progress: &Progress,
    ) -> Result<CallResult, PipelineError> {
        let rid = input.request_id.clone();
        let tool = "terraform_apply";
        let approval_id = input
            .params
            .get("approval_id")
            .and_then(Value::as_str)
            .map(str::to_string);
        // The approval is bound to the call without its approval_id.
        let mut bound_params = input.params.clone();
        if let Some(o) = bound_params.as_object_mut() {
            o.remove("approval_id");
        }
        // The module is opened and locked before anything else (an approval
        // is not spent on a module another call holds).
        let module = match self.open_module(input, &first).await {
            Ok(m) => m,
            Err(reason) => return self.finish(&rid, tool, Outcome::Refused { reason }),
        };
        let Some(approval_id) = approval_id else {
            let (made, decision) = match self
                .plan_and_decide(progress, input, &first, tool, &module)
                .await?
            {
                Ok(p) => p,
                Err(ended) => return Ok(ended),
            };
            let digest = made.digest;
            let changes = crate::approvals::plan_summary(&made.plan);
            let signals = serde_json::to_value(&decision.signals).unwrap_or(Value::Null);
            if decision.approval.required && !decision.approval.satisfied {
                let a = self
                    .approvals
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .create(&NewApproval {
                        tool: tool.into(),
                        params: bound_params,
                        plan_sha256: Some(digest.clone()),
                        plan_summary: changes.clone(),
                        signals: signals.clone(),
                        request_id: rid.clone(),
                        requested_by: input.principal.os_user.clone(),
                        requested_client: input.principal.client.clone(),
                        approvers_required: decision.approval.approvers,
                        ttl: Duration::from_secs(decision.approval.ttl_seconds),
                        reason_required: decision.approval.reason_required,
                    })?;
                self.audit.append(
                    &rid,
                    "approval.requested",
                    json!({"approval_id": a.id, "plan_sha256": digest, "signals": signals.as_array().map(Vec::len),
                           "approvers_required": a.approvers_required, "expires_at": a.expires_at}),
                )?;
                let approve_command = format!(
                    "gateway approve {}{}",
                    a.id,
                    if a.reason_required {
                        " --reason \"...\""
                    } else {
                        ""
                    }
                );
                return self.finish(
                    &rid,
                    tool,
                    Outcome::PendingApproval {
                        approval_id: a.id,
                        signals,
                        changes,
                        approve_command,
                    },
                );
            }
            // The policy needs no approval for this plan: apply it now.
            return self
                .apply_saved(progress, input, &decision, &rid, &rid, &module)
                .await;
        };

        // With an approval: the saved plan it is bound to, never a fresh one.
        let approval = self
            .approvals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&approval_id)?;
        let Some(approval) = approval else {
            return self.finish(
                &rid,
                tool,
                Outcome::Refused {
                    reason: format!("no approval with id {approval_id}"),
                },
            );
        };
        let Ok(bin) = std::fs::read(self.plan_path(&approval.request_id, "tfplan")) else {
            let reason = format!(
                "the plan file approval {approval_id} is bound to is missing; plan and ask again"
            );
            self.audit.append(
                &rid,
                "approval.refused",
                json!({"approval_id": approval_id, "reason": reason}),
            )?;
            return self.finish(&rid, tool, Outcome::Refused { reason });
        };
        let digest = sha256_hex(&bin);
        if let Ok(files) = tools::plan_config_files(
            &bin,
            first.sandbox.module_copy_bytes,
            &self.live_secrets.all(),
        ) {
            input.plan_config_files = Some(serde_json::to_value(files).unwrap_or(Value::Null));
        }
        if let Ok(plan_json) = std::fs::read(self.plan_path(&approval.request_id, "json"))
            && let Ok(plan) = crate::policy::plan::parse_plan(&plan_json, "the saved plan")
        {
            input.plan = Some(PlanInput::new(plan));
        }
        input.approval = Some(json!({
            "id": approval.id, "status": approval.state.as_str(),
            "approvers": approval.verdicts.iter().filter(|v| v.verdict == "grant").map(|v| v.approver.clone()).collect::<Vec<_>>(),
        }));
        let decision = match self.decide_or_deny(input, "approval", tool)? {
            Ok(d) => d,
            Err(denied) => return Ok(denied),
        };
        let spent = self
            .approvals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .spend(&approval_id, tool, &bound_params, Some(&digest), &rid)?;
        if let Err(refusal) = spent {
            self.audit.append(
                &rid,
                "approval.refused",
                json!({"approval_id": approval_id, "refusal": refusal}),
            )?;
            return self.finish(
                &rid,
                tool,
                Outcome::Refused {
                    reason: refusal.to_string(),
                },
            );
        }
        self.audit.append(
            &rid,
            "approval.spent",
            json!({"approval_id": approval_id, "plan_sha256": digest}),
        )?;
        self.apply_saved(
            progress,
            input,
            &decision,
            &rid,
            &approval.request_id,
            &module,
        )
        .await
    }

    /// Apply the saved plan of request `plan_of` in a sandbox on a copy of
    /// the module, then write back exactly the state files (checked to be
    /// Terraform state of the module's lineage); the rest is discarded. The
    /// summary is made from the state before and after, not from what the
    /// sandbox printed.
    async fn apply_saved(
        &self,
        progress: &Progress,
        _input: &DecisionInput,
        decision: &Decision,
        rid: &str,
        plan_of: &str,
        module: &Module,
    ) -> Result<CallResult, PipelineError> {
        let tool = "terraform_apply";
        let Ok(bin) = std::fs::read(self.plan_path(plan_of, "tfplan")) else {
            return self.finish(
                rid,
                tool,
                Outcome::Refused {
                    reason: "the saved plan file is missing".into(),
                },
            );
        };
        let cap = decision.sandbox.file_out_bytes;
        let before = match module.dir.read_state(cap) {
            Ok(b) => b.and_then(|b| module::check_state(&b).ok()),
            Err(e) => {
                let reason = e.to_string();
                return self.finish(rid, tool, Outcome::Refused { reason });
            }
        };
        let work = match self.copy_module(module, decision).await {
            Ok(w) => w,
            Err(reason) => return self.finish(rid, tool, Outcome::Refused { reason }),
        };
        progress.say("applying the saved plan");
        let r = match self
            .run_sandbox(
                progress,
                rid,
                decision,
                SandboxCall {
                    suffix: "",
                    runner: Runner::Terraform,
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
            .await?
        {
            Ok(r) => r,
            Err(reason) => return self.finish(rid, tool, Outcome::Refused { reason }),
        };
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
            let facts = match checked {
                Ok(f) => f,
                Err(why) => {
                    self.audit.append(
                        rid,
                        "state.refused",
                        json!({"file": name, "sha256": sha256_hex(bytes), "reason": why, "kept_at": kept.display().to_string()}),
                    )?;
                    state_problems.push(format!(
                        "the {name} the apply left is not written back: {why} (kept at {})",
                        kept.display()
                    ));
                    continue;
                }
            };
            if let Err(e) = module.dir.write_state(name, bytes) {
                self.audit.append(
                    rid,
                    "state.refused",
                    json!({"file": name, "sha256": sha256_hex(bytes), "reason": e.to_string(), "kept_at": kept.display().to_string()}),
                )?;
                state_problems.push(format!(
                    "{name} could not be written back: {e} (kept at {})",
                    kept.display()
                ));
                continue;
            }
            let _ = std::fs::remove_file(&kept);
            self.audit.append(
                rid,
                "state.saved",
                json!({"file": name, "sha256": sha256_hex(bytes), "serial": facts.serial, "lineage": facts.lineage}),
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
        self.finish(
            rid,
            tool,
            Outcome::Completed {
                ok,
                summary,
                result: json!({"plan_sha256": sha256_hex(&bin), "exit_code": r.exit_code, "ended": r.ended,
                               "state": {"change": change, "serial": after.as_ref().map(|a| a.serial),
                                         "problems": state_problems},
                               "output": tail(&r.stdout.text(), 60), "errors": tail(&r.stderr.text(), 40)}),
            },
        )
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

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
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
