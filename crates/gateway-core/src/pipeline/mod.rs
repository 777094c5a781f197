//! The pipeline (README.md): one function of a request, used by the MCP
//! server and `gateway demo`. [`Pipeline::call_with`] runs the stages in
//! order:
//!
//! admission (may it start now: size, calls running, rate) -> audit
//! `tool.request` -> policy decision -> the tool's runner (chosen by
//! the catalog's `runner` key, [`runners`]): for Terraform, plan and decide
//! again with the plan, the approval gate; then credential -> sandbox ->
//! revoke -> audit `tool.result` -> result.
//!
//! A stage that stops the call returns a [`Stop`] (carried with `?`): a
//! deny, a refusal with its reason, or a failure of the gateway itself. A
//! call the policy denies, or that waits for approval, never reaches the
//! broker or the sandbox. An apply with an approval applies the saved plan
//! file whose digest the approval is bound to, never a fresh plan. One
//! request id threads through every event, the sandbox's name and the
//! approval.

pub mod admission;
pub mod limits;
pub mod notify;
pub mod plans;
pub mod runners;
pub mod upstreams;
pub mod warm;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::{Value, json};

use crate::tools::{self, ToolPaths};
use gateway_audit::approvals::ApprovalStore;
use gateway_audit::audit::{AuditLog, Event};
use gateway_broker::{Broker, RevokeGuard};
use gateway_policy::decision::Violation;
use gateway_policy::{Decision, DecisionInput, PolicyStore, Principal};
use gateway_sandbox::{
    Endpoint, FileIn, Network, Sandbox, SandboxRequest, SandboxResult, SecretFile,
};
use plans::PlanStore;

/// How a call ended.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    /// The policy refused the call. `violations`: what is wrong with the
    /// params, as the policy found it (the agent can correct those).
    Denied {
        reasons: Vec<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        violations: Vec<Violation>,
    },
    /// The call needs a person's approval; nothing was applied.
    PendingApproval {
        approval_id: String,
        signals: Value,
        changes: Value,
        approve_command: String,
        /// The approval page where a person reviews and decides it (when
        /// the gateway serves one: `[http]`).
        #[serde(skip_serializing_if = "Option::is_none")]
        review_url: Option<String>,
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
    /// The workspace this call's `working_dir` is resolved in (the daemon
    /// admits it per connection); `None`: the pipeline's own.
    pub workspace: Option<PathBuf>,
    /// The agent's trace this call continues (W3C trace context from the
    /// request's `_meta`), when it sent one.
    pub trace: Option<gateway_telemetry::TraceParent>,
}

/// One step of a call, as progress reports it: what is happening, and,
/// when it has one, the time by which that step will have ended (a
/// sandbox's deadline).
#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    pub message: String,
    pub within: Option<std::time::Duration>,
}

/// Where progress messages go (the MCP server turns them into progress
/// notifications, or a task's status, when the client asked for them).
/// Clones share one sender: when the caller goes away while the call runs
/// on ([`Commitment`]), [`Progress::disconnect`] drops it for every clone,
/// so that nothing waits on progress nobody reads.
#[derive(Debug, Clone, Default)]
pub struct Progress(Arc<Mutex<Option<tokio::sync::mpsc::UnboundedSender<Stage>>>>);

impl Progress {
    pub fn new(tx: Option<tokio::sync::mpsc::UnboundedSender<Stage>>) -> Progress {
        Progress(Arc::new(Mutex::new(tx)))
    }
    /// No more messages go out, from any clone.
    pub fn disconnect(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
    pub fn say(&self, message: impl Into<String>) {
        self.stage(message, None);
    }
    /// A step that ends within `within` at the latest.
    pub fn say_within(&self, message: impl Into<String>, within: std::time::Duration) {
        self.stage(message, Some(within));
    }
    fn stage(&self, message: impl Into<String>, within: Option<std::time::Duration>) {
        if let Some(tx) = &*self.0.lock().unwrap_or_else(|p| p.into_inner()) {
            let _ = tx.send(Stage {
                message: message.into(),
                within,
            });
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
    approvals: ApprovalStore,
    /// The saved plans (HOME/plans).
    pub plans: PlanStore,
    pub sandbox: Arc<dyn Sandbox>,
    pub tools: ToolPaths,
    /// Endpoint names a decision may allow, with their host ports.
    pub endpoints: BTreeMap<String, u16>,
    /// How a sandbox reaches the Kubernetes API server with a minted token
    /// (`None`: a Kubernetes credential cannot be used, calls are refused).
    pub kubernetes: Option<KubernetesAccess>,
    /// Credentials of the calls in flight (for redaction).
    live_secrets: LiveSecrets,
    /// The calls running and recently started, for admission.
    admission: admission::Admission,
    /// How long saved plans are kept, in seconds (from the policy).
    plan_retention_seconds: std::sync::atomic::AtomicU64,
    /// Woken when the store tells of a changed approval (a verdict given
    /// on any replica); see [`Pipeline::approval_poll`].
    pub approval_changes: Arc<tokio::sync::Notify>,
    /// How often a waiting call reads its approval's state when nothing
    /// wakes it: often on SQLite (a CLI in another process writes the file
    /// and tells no one), rarely when the store's notifications wake it.
    pub approval_poll: std::time::Duration,
    /// Where the approval page is (`https://host:port/approvals/`), when
    /// the gateway serves one: results and notifiers link an approval there.
    pub approval_page: Option<String>,
    /// What the gateway last read of each upstream MCP server's tools
    /// (`input.upstreams`), kept by [`Pipeline::watch_upstreams`].
    pub upstream_readings: Arc<upstreams::UpstreamReadings>,
    /// Upstream servers kept running between calls (declared `warm`).
    pub warm_upstreams: warm::WarmUpstreams,
    /// Every call's own task: a call runs on it, not on its caller's
    /// future, so that one past its point of no return outlives its client.
    running: tokio_util::task::TaskTracker,
    /// The calls past their point of no return and still running: request
    /// id -> the approval they spent (`None`: an apply the policy let run
    /// without one).
    applying: Mutex<BTreeMap<String, Option<String>>>,
    /// Calls the shutdown recorded as interrupted: their own end, should it
    /// still come, is not recorded a second time.
    interrupted: Mutex<std::collections::BTreeSet<String>>,
}

/// A call's point of no return: its approval spent, or, for an apply the
/// policy lets run without one, its apply about to start. Until then the
/// caller going away (cancel, disconnect, its session's end) abandons the
/// call: its task is aborted, which kills its sandbox and revokes its
/// credential, and an approval, not spent, stays granted. From then on the
/// apply is the operator's: it runs to its end on its own task whatever
/// the client does, its state is written back, and its outcome is kept
/// with the approval. One lock decides which of the two came first.
#[derive(Debug, Default)]
pub struct Commitment(Mutex<CommitState>);

#[derive(Debug, Default)]
enum CommitState {
    #[default]
    Open,
    Abandoned,
    /// Committed, with the approval it spent, if any.
    Committed(Option<String>),
}

impl Commitment {
    /// Run `commit` unless the caller has already gone; when it reports
    /// that it committed (spent `approval_id`, or had nothing to spend),
    /// the call is past its point of no return.
    pub fn commit<T>(
        &self,
        approval_id: Option<&str>,
        commit: impl FnOnce() -> (T, bool),
    ) -> Result<T, Stop> {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(*state, CommitState::Abandoned) {
            return Err(Stop::refused(match approval_id {
                Some(id) => format!(
                    "the client went away before approval {id} was spent; it stays granted and nothing was applied"
                ),
                None => "the client went away before the apply started; nothing was applied".into(),
            }));
        }
        let (out, committed) = commit();
        if committed {
            *state = CommitState::Committed(approval_id.map(str::to_string));
        }
        Ok(out)
    }

    /// The caller went away: abandons the call (`None`) unless it is
    /// committed (`Some`, with the approval it spent, if any).
    fn abandon(&self) -> Option<Option<String>> {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match &*state {
            CommitState::Committed(id) => Some(id.clone()),
            _ => {
                *state = CommitState::Abandoned;
                None
            }
        }
    }
}

/// The caller's side of a call running on its own task: when the caller's
/// future is dropped before the call returned, abandons or detaches it
/// ([`Commitment`]) and audits which.
struct CallerGone {
    pipeline: Arc<Pipeline>,
    commitment: Arc<Commitment>,
    /// The call's task while it runs (`None` once it returned).
    task: Option<tokio::task::JoinHandle<Result<CallResult, PipelineError>>>,
    progress: Progress,
    request_id: String,
    tool: String,
}

impl Drop for CallerGone {
    fn drop(&mut self) {
        let Some(task) = self.task.take() else {
            return;
        };
        if task.is_finished() {
            return;
        }
        self.progress.disconnect();
        match self.commitment.abandon() {
            None => {
                task.abort();
                // Recorded once the task is gone (its sandbox killed and
                // removed), not before.
                let pipeline = Arc::clone(&self.pipeline);
                let rid = self.request_id.clone();
                let tool = self.tool.clone();
                let record = move || {
                    let _ = pipeline.audit.record(
                        &rid,
                        Event::ToolResult(json!({
                            "status": "cancelled", "tool": tool,
                            "detail": "the client cancelled the call or went away; its sandbox was killed and removed, nothing was applied"})),
                    );
                };
                match tokio::runtime::Handle::try_current() {
                    Ok(rt) => {
                        rt.spawn(async move {
                            // Only a call the abort really stopped: one that
                            // returned first has its own tool.result.
                            if task.await.is_err_and(|e| e.is_cancelled()) {
                                record();
                            }
                        });
                    }
                    Err(_) => record(),
                }
            }
            Some(approval_id) => {
                let _ = self.pipeline.audit.record(
                    &self.request_id,
                    Event::CallDetached {
                        approval_id,
                        detail: "the client cancelled the call or went away once its apply was committed; the apply runs to its end, its state is written back and its outcome is kept with its approval".into(),
                    },
                );
            }
        }
    }
}

/// Keeps a committed call in [`Pipeline`]'s list of applies running until
/// it ends.
pub struct Applying<'a> {
    pipeline: &'a Pipeline,
    request_id: String,
}

impl Drop for Applying<'_> {
    fn drop(&mut self) {
        self.pipeline
            .applying
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.request_id);
    }
}

/// The API server as sandboxes see it: by endpoint name, with its CA.
#[derive(Debug, Clone)]
pub struct KubernetesAccess {
    pub endpoint: String,
    pub ca_pem: Vec<u8>,
    pub tls_server_name: String,
}

/// A sandbox's request as [`Pipeline::prepare_sandbox`] makes it.
pub(crate) struct Prepared {
    pub limits: (gateway_sandbox::Limits, std::time::Duration),
    pub network: Network,
    pub binds: Vec<gateway_sandbox::Bind>,
    pub env: Vec<(String, String)>,
    pub files_in: Vec<FileIn>,
    pub image: Option<String>,
    pub upstream: bool,
}

/// One sandbox of a call.
pub struct SandboxCall<'a> {
    /// The sandbox's name after the request id ("": the call's main sandbox).
    pub suffix: &'a str,
    pub tool: Toolset,
    pub steps: Vec<tools::Step>,
    /// A throwaway dir of the pipeline's (never a module dir itself).
    pub workdir: Option<&'a Path>,
    pub files_in: Vec<FileIn>,
    pub files_out: Vec<String>,
    /// Whether this sandbox gets the decision's credential and egress.
    pub with_credential: bool,
}

/// Every credential issued to a call still in flight, so that no sandbox's
/// output carries one (its own or another call's). A call's entries go
/// when the call ends, cancelled or not ([`CallSecrets`]).
#[derive(Default)]
pub struct LiveSecrets(Mutex<BTreeMap<(String, String), SecretFile>>);

impl LiveSecrets {
    pub fn add(&self, request_id: &str, lease_id: &str, secret: SecretFile) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((request_id.into(), lease_id.into()), secret);
    }

    pub fn all(&self) -> Vec<SecretFile> {
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

/// Which tool binaries a sandbox gets (their binds, environment and
/// config files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Toolset {
    Terraform,
    Kubectl,
    /// An upstream MCP server: the runner, plus the paths the operator
    /// declared for it (checked: [`tools::upstream::binds`]) and its
    /// environment. Only where the sandbox binds host paths (local).
    Upstream {
        binds: Vec<gateway_sandbox::Bind>,
        env: Vec<(String, String)>,
        /// The image it runs from (the kubernetes backend), if declared.
        image: Option<String>,
    },
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
    Audit(#[from] gateway_audit::audit::AuditError),
    #[error(transparent)]
    Approvals(#[from] gateway_audit::approvals::ApprovalError),
    #[error("the plans dir {path}: {source}")]
    Plans {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the call's task failed: {0}")]
    Task(String),
}

/// Why a call stopped before its tool ran to the end: what each stage
/// returns instead of going on, carried up with `?`.
#[derive(Debug)]
pub enum Stop {
    /// The policy denied the call.
    Denied {
        reasons: Vec<String>,
        violations: Vec<Violation>,
    },
    /// A later check refused it (the module, the approval, the plan file,
    /// the credential, the sandbox's setup or output); nothing more is run.
    Refused(Refusal),
    /// The gateway itself cannot go on (its audit log or approval store
    /// failed): an error, not a result.
    Failed(PipelineError),
}

/// A refusal's reason, said to the agent and recorded in `tool.result`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: String,
}

impl Stop {
    pub fn refused(reason: impl Into<String>) -> Stop {
        Stop::Refused(Refusal {
            reason: reason.into(),
        })
    }
}

impl<E: Into<PipelineError>> From<E> for Stop {
    fn from(e: E) -> Stop {
        Stop::Failed(e.into())
    }
}

/// One call on its way through the stages: the policy input (which grows
/// a plan, its configuration and an approval as the call goes on) and where
/// progress goes.
pub struct Call {
    pub input: DecisionInput,
    pub progress: Progress,
    /// Where `working_dir` is resolved.
    pub workspace: PathBuf,
    /// Who must own that workspace and module (a daemon session's
    /// caller, unless root); `None` for the pipeline's own workspace.
    pub workspace_owner: Option<u32>,
    /// Whether the call is past its point of no return.
    pub commitment: Arc<Commitment>,
    /// What the audit's `tool.result` keeps of a completed call's summary
    /// and result instead of themselves, when a runner sets it: a read's
    /// content (a log, objects) goes to the agent, its size and digest to
    /// the audit, as the API server's own audit keeps a read's metadata.
    pub audit_result: Option<Value>,
}

impl Call {
    pub fn request_id(&self) -> &str {
        &self.input.request_id
    }
}

/// Which decision of a call this is (the audit's `policy.error` says).
#[derive(Debug, Clone, Copy)]
pub enum Step {
    Request,
    Plan,
    Approval,
}

impl Step {
    fn as_str(self) -> &'static str {
        match self {
            Step::Request => "request",
            Step::Plan => "plan",
            Step::Approval => "approval",
        }
    }
}

/// Calls whose arguments are larger than this (in bytes of JSON) are
/// admitted first and decided after, as two evaluations: their decision
/// input (a copy of the arguments) is made only for a call admitted.
const ONE_EVALUATION_MAX_PARAMS: usize = 64 * 1024;

/// How often a waiting call reads its approval on SQLite.
pub const APPROVAL_POLL: std::time::Duration = std::time::Duration::from_millis(500);
/// The bound on a wait that notifications wake (a notification lost with
/// a connection is made up for this late).
pub const APPROVAL_POLL_NOTIFIED: std::time::Duration = std::time::Duration::from_secs(5);

impl Pipeline {
    /// Keep approvals in `store` instead of the home's SQLite file (the
    /// daemon's `[store]`).
    pub fn set_approval_store(&mut self, store: ApprovalStore) {
        self.approvals = store;
    }

    pub fn new(
        policy: Arc<PolicyStore>,
        home: PathBuf,
        workspace: PathBuf,
        sandbox: Arc<dyn Sandbox>,
        tools: ToolPaths,
    ) -> Result<Pipeline, PipelineError> {
        let audit = Arc::new(AuditLog::in_home(&home)?);
        Pipeline::with_audit(policy, home, workspace, sandbox, tools, audit)
    }

    /// [`Pipeline::new`] writing its events to `audit` (the replicas'
    /// chain) instead of the home's log, which is then never made.
    pub fn with_audit(
        policy: Arc<PolicyStore>,
        home: PathBuf,
        workspace: PathBuf,
        sandbox: Arc<dyn Sandbox>,
        tools: ToolPaths,
        audit: Arc<AuditLog>,
    ) -> Result<Pipeline, PipelineError> {
        let plans = PlanStore::in_home(&home).map_err(|source| PipelineError::Plans {
            path: home.join("plans"),
            source,
        })?;
        Ok(Pipeline {
            audit,
            broker: None,
            approvals: ApprovalStore::in_home(&home)?,
            plans,
            policy,
            home,
            workspace,
            sandbox,
            tools,
            endpoints: BTreeMap::new(),
            kubernetes: None,
            live_secrets: LiveSecrets::default(),
            admission: admission::Admission::default(),
            plan_retention_seconds: std::sync::atomic::AtomicU64::new(86_400),
            approval_changes: Arc::default(),
            approval_poll: APPROVAL_POLL,
            approval_page: None,
            upstream_readings: Default::default(),
            warm_upstreams: Default::default(),
            running: tokio_util::task::TaskTracker::new(),
            applying: Mutex::new(BTreeMap::new()),
            interrupted: Mutex::new(std::collections::BTreeSet::new()),
        })
    }

    /// Run one call through the whole pipeline.
    pub async fn call(self: &Arc<Self>, call: ToolCall) -> Result<CallResult, PipelineError> {
        let rid = gateway_policy::input::new_request_id();
        self.call_with(call, &rid, &Progress::default()).await
    }

    /// Run one call with a request id chosen by the caller (so that a
    /// cancelled call can still be named) and progress messages. Every
    /// call that gets a request audited ends with its `tool.result`.
    ///
    /// The call runs on a task of its own. Dropping this future (the
    /// client cancelled or went away) aborts it, unless it has spent an
    /// approval: then it runs to its end ([`Commitment`]).
    pub async fn call_with(
        self: &Arc<Self>,
        call: ToolCall,
        request_id: &str,
        progress: &Progress,
    ) -> Result<CallResult, PipelineError> {
        let commitment = Arc::new(Commitment::default());
        let tool = call.tool.clone();
        let task = {
            let me = Arc::clone(self);
            let rid = request_id.to_string();
            let progress = progress.clone();
            let commitment = Arc::clone(&commitment);
            self.running
                .spawn(async move { me.run_call(call, &rid, &progress, commitment).await })
        };
        let mut gone = CallerGone {
            pipeline: Arc::clone(self),
            commitment,
            task: Some(task),
            progress: progress.clone(),
            request_id: request_id.to_string(),
            tool,
        };
        let r = match gone.task.as_mut() {
            Some(task) => task.await,
            None => return Err(PipelineError::Task("the call's task is gone".into())),
        };
        gone.task = None;
        r.map_err(|e| PipelineError::Task(e.to_string()))?
    }

    /// At shutdown: wait until `deadline` for the calls still running (an
    /// approved apply runs on after its client went away). An apply still
    /// running then is recorded as interrupted, in the audit and with its
    /// approval, before the runtime goes and its sandbox with it. Returns
    /// how many were.
    pub async fn drain(&self, deadline: tokio::time::Instant) -> usize {
        self.running.close();
        if tokio::time::timeout_at(deadline, self.running.wait())
            .await
            .is_ok()
        {
            return 0;
        }
        // Claimed here, under both locks, so that an apply ending now
        // records either its own end or this one, never both.
        let left: Vec<(String, Option<String>)> = {
            let mut applying = self.applying.lock().unwrap_or_else(|p| p.into_inner());
            let mut interrupted = self.interrupted.lock().unwrap_or_else(|p| p.into_inner());
            let left: Vec<_> = std::mem::take(&mut *applying).into_iter().collect();
            interrupted.extend(left.iter().map(|(r, _)| r.clone()));
            left
        };
        for (rid, approval_id) in &left {
            let outcome = json!({
                "status": "interrupted",
                "reason": "the gateway stopped while the apply ran and its shutdown grace ran out: the sandbox was killed, the state the apply left was not written back and the infrastructure may be half changed; plan again to see where it stands",
            });
            let _ = self.audit.record(rid, Event::ToolResult(outcome.clone()));
            if let Some(id) = approval_id {
                let _ = self.approvals().record_outcome(id, rid, &outcome);
            }
        }
        left.len()
    }

    /// Mark a committed call as running until the guard is dropped.
    pub fn applying(&self, request_id: &str, approval_id: Option<&str>) -> Applying<'_> {
        self.applying
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(request_id.to_string(), approval_id.map(str::to_string));
        Applying {
            pipeline: self,
            request_id: request_id.to_string(),
        }
    }

    /// The body of [`Pipeline::call_with`], on the call's own task.
    async fn run_call(
        &self,
        call: ToolCall,
        request_id: &str,
        progress: &Progress,
        commitment: Arc<Commitment>,
    ) -> Result<CallResult, PipelineError> {
        let known = self
            .policy
            .current()
            .is_ok_and(|set| set.knows_tool(&call.tool));
        let tool_label = gateway_telemetry::tool_label(&call.tool, known);
        let span = gateway_telemetry::CallSpan::begin(request_id, &tool_label, call.trace.as_ref());
        let mut input = DecisionInput::new(call.tool, call.params, call.principal);
        input.request_id = request_id.to_string();
        // A tool with a locked input schema (an upstream's): the policy
        // sees the arguments with what is wrong with them for it.
        input.schema_violations = self
            .policy
            .current()
            .ok()
            .and_then(|set| set.schema_violations(&input.tool, &input.params));
        // What the gateway read of the upstream's tools, for an upstream's
        // tool (the policy refuses one that is not as locked).
        if input.schema_violations.is_some()
            && let Some((upstream, _)) = input.tool.split_once('.')
        {
            let readings = self.upstream_readings.snapshot();
            if let Some(r) = readings.get(upstream) {
                input.upstreams = Some(serde_json::json!({ upstream: r }));
            }
        }
        let workspace_owner = match (&call.workspace, input.principal.uid) {
            (Some(_), Some(uid)) if uid != 0 => Some(uid),
            _ => None,
        };
        let mut call = Call {
            input,
            progress: progress.clone(),
            workspace: call.workspace.unwrap_or_else(|| self.workspace.clone()),
            workspace_owner,
            commitment,
            audit_result: None,
        };
        // The call's credentials leave the redaction list however it ends.
        let _secrets = CallSecrets {
            live: &self.live_secrets,
            request_id: request_id.to_string(),
        };
        let mut decided = "none";
        let outcome = match self.stages(&mut call, &mut decided).await {
            Ok(outcome) => outcome,
            Err(Stop::Denied {
                reasons,
                violations,
            }) => Outcome::Denied {
                reasons,
                violations,
            },
            Err(Stop::Refused(r)) => Outcome::Refused { reason: r.reason },
            Err(Stop::Failed(e)) => {
                // The call still ends in the log when the log can take it.
                let _ = self.audit.record(
                    request_id,
                    Event::ToolResult(json!({"status": "error", "error": e.to_string()})),
                );
                Self::observed(tool_label, decided, "error", span);
                return Err(e);
            }
        };
        let ended = match &outcome {
            Outcome::Denied { .. } => "denied",
            Outcome::PendingApproval { .. } => "pending_approval",
            Outcome::Refused { .. } => "refused",
            Outcome::Completed { ok: true, .. } => "completed",
            Outcome::Completed { ok: false, .. } => "failed",
        };
        let r = self.finish(
            request_id,
            &call.input.tool,
            outcome,
            call.audit_result.take(),
        );
        Self::observed(
            tool_label,
            decided,
            if r.is_ok() { ended } else { "error" },
            span,
        );
        r
    }

    /// A call ended: its counter, and its span closed.
    fn observed(
        tool: String,
        decision: &'static str,
        outcome: &'static str,
        span: gateway_telemetry::CallSpan,
    ) {
        gateway_telemetry::metrics().call_ended(gateway_telemetry::metrics::CallLabels {
            tool,
            decision,
            outcome,
        });
        span.end(decision, outcome);
    }

    /// The stages of a call, in order.
    async fn stages(&self, call: &mut Call, decided: &mut &'static str) -> Result<Outcome, Stop> {
        let (admitted, evaluated) = self.admit(&call.input);
        self.audit_request(&call.input)?;
        // Counted as running until the call ends, however it ends.
        let _running = admitted.map_err(Stop::refused)?;
        gateway_telemetry::metrics().set_calls_running(self.admission.running());
        let decision = match evaluated {
            Some(ev) => self.decided(&call.input, Step::Request, ev),
            None => self.decide(&call.input, Step::Request),
        };
        *decided = match &decision {
            Ok(_) => "allow",
            Err(Stop::Denied { .. }) => "deny",
            Err(_) => "none",
        };
        let decision = decision?;
        call.progress.say(format!(
            "policy allowed {} (tier {})",
            call.input.tool, decision.tier
        ));
        let runner = runners::for_decision(&decision)?;
        runner.run(self, call, decision).await
    }

    /// Admission: whether the call may start now (`data.gateway.calls`),
    /// and, when it may, its decision, in one evaluation of the policy
    /// ([`gateway_policy::PolicySet::admit_and_decide`]; when that fails,
    /// each is asked alone and the decision comes later, as [`Self::decide`]).
    /// Also applies the policy's cap on audit lines before the call's
    /// first event is written. With no usable policy set there is nothing
    /// to admit by: the decision that follows denies the call, saying why.
    fn admit(
        &self,
        input: &DecisionInput,
    ) -> (
        Result<Option<admission::Admitted<'_>>, String>,
        Option<gateway_policy::set::Evaluation>,
    ) {
        let Ok(set) = self.policy.current() else {
            return (Ok(None), None);
        };
        let reserved = {
            let _t =
                gateway_telemetry::stage(&input.request_id, gateway_telemetry::Stage::Admission);
            self.admission.reserve(input)
        };
        let ask = |q: Value| {
            set.eval_rule(admission::VERDICT_RULE, regorus::Value::from(q))
                .map_err(|e| e.to_string())
        };
        let (verdict, evaluated) = {
            let mut t =
                gateway_telemetry::stage(&input.request_id, gateway_telemetry::Stage::Decision);
            // Arguments too large to be admitted anyway are not made into
            // a decision's input before admission has said so.
            if reserved.params_bytes > ONE_EVALUATION_MAX_PARAMS {
                t.attribute("gateway.step", "admission");
                (ask(reserved.query.clone()), None)
            } else {
                t.attribute("gateway.step", "admission+request");
                match set.admit_and_decide(&reserved.query, input) {
                    Ok((verdict, evaluated)) => (Ok(verdict), evaluated),
                    Err(_) => {
                        // Not the error itself: it may quote the agent's
                        // arguments (the decision asked alone records it).
                        tracing::debug!(
                            "admission and decision in one evaluation failed: asking each alone"
                        );
                        (ask(reserved.query.clone()), None)
                    }
                }
            }
        };
        // The decision does not depend on the counts: it stands when the
        // call is admitted on a second asking.
        let (settings, admitted) = self.admission.settle(verdict, reserved, ask);
        if let Some(s) = settings {
            self.audit.set_max_event_bytes(s.event_bytes);
            self.plan_retention_seconds.store(
                s.plan_retention.as_secs(),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        (admitted.map(Some), evaluated)
    }

    /// Notify: tell the policy's notifiers that `approval` waits
    /// ([`notify`]); never holds up the call.
    pub fn notify(&self, approval: &gateway_audit::approvals::Approval) {
        let Ok(set) = self.policy.current() else {
            return;
        };
        let list = set
            .eval_rule(
                "data.gateway.approvals.notifiers",
                regorus::Value::from(json!({})),
            )
            .unwrap_or(Value::Null);
        notify::spawn(
            self.audit.clone(),
            list,
            approval,
            self.review_url(&approval.id),
        );
    }

    /// The approval page of approval `id`, when there is one.
    pub fn review_url(&self, id: &str) -> Option<String> {
        self.approval_page.as_ref().map(|p| format!("{p}{id}"))
    }

    /// The grants of `approval`, each proven again with the policy of now
    /// ([`gateway_audit::approvals::proof::identities_now`]).
    pub fn approver_identities(&self, approval: &gateway_audit::approvals::Approval) -> Vec<Value> {
        let proofs = match self.policy.current() {
            Ok(set) => approval_proofs(&set),
            Err(_) => Default::default(),
        };
        gateway_audit::approvals::proof::identities_now(
            approval,
            &proofs,
            gateway_audit::approvals::now_ms(),
            gateway_audit::approvals::proof::groups_of_user,
        )
    }

    /// How long saved plans are kept (the policy's `plan_retention_seconds`).
    pub fn plan_retention(&self) -> std::time::Duration {
        std::time::Duration::from_secs(
            self.plan_retention_seconds
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// The Prometheus metrics now, with the store's approvals counted
    /// (blocking: the store may be a database).
    pub fn metrics_text(&self) -> String {
        let m = gateway_telemetry::metrics();
        match self.approvals().counts() {
            Ok(c) => m.set_approvals(&c),
            Err(e) => tracing::warn!("metrics: the approvals could not be counted: {e}"),
        }
        m.set_calls_running(self.running_calls());
        m.encode()
    }

    /// Calls running now (admitted and not ended).
    pub fn running_calls(&self) -> usize {
        self.admission.running()
    }

    /// Audit `tool.request`: the call as the agent made it, before anything
    /// is decided about it.
    fn audit_request(&self, input: &DecisionInput) -> Result<(), PipelineError> {
        // Arguments too large for the line are kept as their digest at
        // once (no walk through a hostile value under the log's lock).
        let params = gateway_audit::audit::kept(&input.params, self.audit.max_event_bytes() / 2);
        // Durable with the decision that follows it.
        self.audit.record_deferred(
            &input.request_id,
            Event::ToolRequest {
                tool: input.tool.clone(),
                params,
                principal: serde_json::to_value(&input.principal).unwrap_or(Value::Null),
            },
        )?;
        Ok(())
    }

    /// Decide and audit the decision; a deny stops the call.
    pub fn decide(&self, input: &DecisionInput, step: Step) -> Result<Decision, Stop> {
        let ev = {
            let mut t =
                gateway_telemetry::stage(&input.request_id, gateway_telemetry::Stage::Decision);
            t.attribute("gateway.step", step.as_str());
            self.policy.decide(input)
        };
        self.decided(input, step, ev)
    }

    /// Audit a decision made; a deny stops the call.
    fn decided(
        &self,
        input: &DecisionInput,
        step: Step,
        ev: gateway_policy::set::Evaluation,
    ) -> Result<Decision, Stop> {
        let decision = self.record_decision(input, step, ev)?;
        if decision.allow {
            // Nothing is done on a decision that is not on disk.
            self.audit.sync()?;
            return Ok(decision);
        }
        Err(Stop::Denied {
            reasons: decision.deny_reasons,
            violations: decision.violations,
        })
    }

    fn record_decision(
        &self,
        input: &DecisionInput,
        step: Step,
        ev: gateway_policy::set::Evaluation,
    ) -> Result<Decision, PipelineError> {
        // The plan itself is in the plans dir; the log keeps its digest.
        let mut audit_input = input.to_json_with_plan_digest();
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
            .policy_decision(&input.request_id, audit_input, result, &ev.policy)?;
        if let Some(err) = &ev.error {
            self.audit.record_deferred(
                &input.request_id,
                Event::PolicyError {
                    step: step.as_str().into(),
                    error: err.clone(),
                },
            )?;
        }
        Ok(ev.decision)
    }

    fn finish(
        &self,
        request_id: &str,
        tool: &str,
        outcome: Outcome,
        audit_result: Option<Value>,
    ) -> Result<CallResult, PipelineError> {
        let claimed = self
            .interrupted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(request_id);
        if !claimed {
            let mut recorded = serde_json::to_value(&outcome).unwrap_or(Value::Null);
            if let (Some(kept), Outcome::Completed { .. }) = (audit_result, &outcome) {
                recorded["result"] = kept;
                recorded["summary"] = json!(
                    "(the content went to the agent; the audit keeps its size and digest in result)"
                );
            }
            self.audit.record(request_id, Event::ToolResult(recorded))?;
        }
        Ok(CallResult {
            request_id: request_id.to_string(),
            tool: tool.to_string(),
            outcome,
        })
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

    /// What the decision and the tool make of a sandbox, before any
    /// credential: its limits, network, files, environment and image.
    pub(crate) fn prepare_sandbox(
        &self,
        decision: &Decision,
        tool: Toolset,
        steps: &[tools::Step],
        files_in: Vec<FileIn>,
    ) -> Result<Prepared, Stop> {
        let limits = limits::from_decision(&decision.sandbox).map_err(Stop::refused)?;
        let network = self.network(decision).map_err(Stop::refused)?;
        let terraform = tool == Toolset::Terraform;
        let upstream = matches!(tool, Toolset::Upstream { .. });
        let mut image = None;
        let (binds, mut env) = match tool {
            Toolset::Terraform => (self.tools.terraform_binds(), tools::terraform_env()),
            Toolset::Kubectl => (self.tools.kubectl_binds(), tools::kubectl_env()),
            Toolset::Upstream {
                binds,
                env,
                image: from,
            } => {
                // The local backend binds this host's files (the runner's
                // and the declared paths); the kubernetes backend runs the
                // declared image, which has no host path.
                let host = self.sandbox.uses_host_tools();
                if host == from.is_some() || (!host && !binds.is_empty()) {
                    return Err(Stop::refused(format!(
                        "this upstream MCP server cannot run on the {} sandbox backend as declared (a stdio server runs from this host's files on the local backend, from a pinned image without host paths on the kubernetes backend); nothing was run",
                        self.sandbox.backend()
                    )));
                }
                image = from;
                (
                    self.tools.runner_binds().map(|mut b| {
                        b.extend(binds);
                        b
                    }),
                    env,
                )
            }
        };
        // The kubernetes backend's image carries the tools; the local
        // backend binds this host's.
        let binds = match binds {
            _ if !self.sandbox.uses_host_tools() => Vec::new(),
            Ok(b) => b,
            Err(e) => return Err(Stop::refused(e.to_string())),
        };
        let mut files_in = files_in;
        files_in.push(FileIn {
            path: tools::STEPS_FILE.into(),
            contents: serde_json::to_vec(steps).unwrap_or_default(),
        });
        if terraform {
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
            Some((scope, "kubernetes")) => {
                files_in.push(self.kubeconfig_file(scope).map_err(Stop::refused)?);
                env.push(("KUBECONFIG".into(), tools::kubeconfig_inside()));
                env.push(("KUBE_CONFIG_PATH".into(), tools::kubeconfig_inside()));
            }
            // A database user (OpenBao's database secrets engine): the
            // credential file's `username = …` and `password = …` lines,
            // which the step runner fills into an upstream server's
            // templates. Only an upstream's sandbox takes one.
            Some((_, "database")) if upstream => {}
            Some((_, other)) => {
                return Err(Stop::refused(format!(
                    "the decision's credential is of type {other:?}, which this gateway cannot hand to this sandbox (it knows: kubernetes, and database for an upstream MCP server); nothing was run"
                )));
            }
        }
        Ok(Prepared {
            limits,
            network,
            binds,
            env,
            files_in,
            image,
            upstream,
        })
    }

    /// Run one sandbox of a call: limits and network from the decision, a
    /// credential minted for it (when `call.with_credential` and the
    /// decision names one) and revoked as soon as it ends, its output
    /// cleared of every live credential, each step audited.
    pub async fn run_sandbox(
        &self,
        progress: &Progress,
        rid: &str,
        decision: &Decision,
        call: SandboxCall<'_>,
    ) -> Result<SandboxResult, Stop> {
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
            return Err(Stop::refused(
                "the decision needs a credential and no credential broker is configured; nothing was run",
            ));
        }
        let Prepared {
            limits,
            network,
            binds,
            env,
            files_in,
            image,
            upstream,
        } = self.prepare_sandbox(decision, call.tool, &call.steps, call.files_in)?;
        // Everything is checked; only now is a credential minted, and from
        // here on it is revoked on every path (the guard covers
        // cancellation and panics).
        let mut credential = None;
        let mut revoke = None;
        if let (Some(scope), Some(broker)) = (&decision.credential, &self.broker) {
            let minted = {
                let _t = gateway_telemetry::stage(rid, gateway_telemetry::Stage::CredentialMint);
                gateway_broker::issue_for_call(broker, &self.audit, rid, scope).await
            };
            match minted {
                Ok(c) => {
                    progress.say("credential issued");
                    revoke = Some(RevokeGuard::new(
                        Arc::clone(broker),
                        Arc::clone(&self.audit),
                        rid,
                        &c.lease_id,
                    ));
                    self.live_secrets.add(rid, &c.lease_id, c.secret.clone());
                    self.audit.record(
                        rid,
                        Event::CredentialIssued {
                            lease_id: c.lease_id.clone(),
                            mount: scope.mount.clone(),
                            role: scope.role.clone(),
                            params: Some(json!(scope.params)),
                            ttl_seconds: Some(c.ttl.as_secs()),
                            credential: Some(json!(c.meta)),
                            after_cancellation: None,
                        },
                    )?;
                    credential = Some(c.secret.clone());
                }
                Err(e) => {
                    self.audit.record(
                        rid,
                        Event::CredentialRefused {
                            mount: scope.mount.clone(),
                            role: scope.role.clone(),
                            error: e.to_string(),
                        },
                    )?;
                    return Err(Stop::refused(format!(
                        "no credential for this call ({e}); nothing was run"
                    )));
                }
            }
        }
        // An upstream server's progress, passed on to the agent as it
        // comes, this call's credential cut from it.
        let on_stderr_line = upstream.then(|| {
            let progress = progress.clone();
            tools::upstream::progress_sink(
                move |line| progress.say(line),
                credential.iter().cloned().collect(),
            )
        });
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
            on_stderr_line,
            image,
        };
        self.audit.record(
            rid,
            Event::SandboxStarted {
                sandbox: name.clone(),
                backend: self.sandbox.backend().into(),
                limits: json!(limits.0),
                deadline_seconds: limits.1.as_secs(),
                egress: decision.sandbox.egress.clone(),
                credential: req.credential.is_some(),
                steps: json!(call.steps),
            },
        )?;
        progress.say_within(format!("sandbox {name} started"), limits.1);
        let mut outcome = {
            let mut t = gateway_telemetry::stage(rid, gateway_telemetry::Stage::SandboxRun);
            t.attribute("gateway.sandbox", name.clone());
            let run_started = std::time::SystemTime::now();
            let outcome = self.sandbox.run(req).await;
            // The steps the run reached, ended or failed: as an attribute
            // and as events on the span's timeline.
            let stages = match &outcome {
                Ok(r) => r.stages.as_slice(),
                Err(e) => e.stages(),
            };
            if !stages.is_empty() {
                t.attribute(
                    "gateway.sandbox.stages_ms",
                    gateway_sandbox::stages_text(stages),
                );
                let now = std::time::SystemTime::now();
                for m in stages {
                    let at = run_started + std::time::Duration::from_millis(m.at_ms);
                    t.event_at(m.stage, at.min(now));
                }
            }
            outcome
        };
        // The tool's output goes into the result and the audit: it must not
        // carry any live credential (this call's or another's in flight),
        // whatever the tool printed and however it encoded it.
        if let Ok(r) = &mut outcome {
            let secrets = self.live_secrets.all();
            r.stdout.redact_all(&secrets);
            r.stderr.redact_all(&secrets);
            // Files out too (the plan JSON shows outputs' values, a state
            // holds attributes), text or not (a state with one byte that is
            // not UTF-8 is still refused, and kept aside, redacted); only a
            // binary plan file keeps its bytes (it is kept in the gateway's
            // home, and the lease is revoked below anyway).
            for (name, bytes) in r.files_out.iter_mut() {
                if !name.ends_with(".tfplan") {
                    let mut c = gateway_sandbox::Captured {
                        bytes: std::mem::take(bytes),
                        truncated: false,
                    };
                    c.redact_all(&secrets);
                    *bytes = c.bytes;
                }
            }
        }
        let audited = match &outcome {
            Ok(r) => self.audit.record(
                rid,
                Event::SandboxCompleted {
                    sandbox: name.clone(),
                    exit_code: r.exit_code,
                    ended: json!(r.ended),
                    duration_ms: r.duration_ms,
                    stdout_truncated: r.stdout.truncated,
                    stderr_truncated: r.stderr.truncated,
                    stages: if r.stages.is_empty() {
                        Value::Null
                    } else {
                        json!(r.stages)
                    },
                },
            ),
            Err(gateway_sandbox::SandboxError::Output(e)) => self.audit.record(
                rid,
                Event::SandboxOutputRefused {
                    sandbox: name.clone(),
                    reason: e.to_string(),
                },
            ),
            Err(e) => self.audit.record(
                rid,
                Event::SandboxFailed {
                    sandbox: name.clone(),
                    error: e.to_string(),
                    stages: if e.stages().is_empty() {
                        Value::Null
                    } else {
                        json!(e.stages())
                    },
                },
            ),
        };
        // Revoke as soon as the sandbox has ended, whatever happened in it.
        if let Some(guard) = revoke {
            let _t = gateway_telemetry::stage(rid, gateway_telemetry::Stage::CredentialRevoke);
            guard.revoke().await;
        }
        audited?;
        outcome.map_err(|e| Stop::refused(format!("sandbox: {e}")))
    }

    /// The kubeconfig for a Kubernetes credential scope: the API server by
    /// its endpoint name, its CA, the token from the credential file.
    fn kubeconfig_file(&self, scope: &gateway_policy::CredentialScope) -> Result<FileIn, String> {
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
        let text = gateway_broker::kubeconfig::kubeconfig(
            &format!("https://{}:{port}", k.endpoint),
            &k.ca_pem,
            &k.tls_server_name,
            gateway_sandbox::CREDENTIAL_PATH,
            namespace,
        );
        Ok(FileIn {
            path: tools::KUBECONFIG_FILE.into(),
            contents: text.into_bytes(),
        })
    }

    /// A new, empty working dir for one sandbox, where the backend can
    /// mount it from, of at most `disk_bytes` where the backend needs the
    /// gateway to enforce that; removed when dropped.
    pub fn scratch(&self, disk_bytes: u64) -> Result<gateway_sandbox::Scratch, String> {
        let root = self.sandbox.scratch_dir();
        let group = self.sandbox.scratch_group_writable();
        gateway_sandbox::beneath::private_dir(&root, if group { 0o770 } else { 0o700 }, group)
            .map_err(|e| format!("the sandboxes' scratch dir: {e}"))?;
        let quota = self.sandbox.scratch_needs_quota().then_some(disk_bytes);
        gateway_sandbox::Scratch::new(&root, quota)
    }

    /// The approval store: its transactions run side by side, each on
    /// a connection of its own (PostgreSQL) or in turn (SQLite).
    pub fn approvals(&self) -> &ApprovalStore {
        &self.approvals
    }

    /// One approval as it stands now (expiry applied), for a caller that
    /// waits on a person: the MCP task of a pending apply.
    pub fn approval(
        &self,
        id: &str,
    ) -> Result<Option<gateway_audit::approvals::Approval>, gateway_audit::approvals::ApprovalError>
    {
        self.approvals().get(id)
    }
}

/// The last `lines` lines of a tool's output.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// What proves approvers under policy set `set`: its allowed signers
/// (`data.gateway.approvals.allowed_signers`) and listed passkeys
/// (`data.gateway.approvals.passkeys`). A passkey list that does not parse
/// proves no one (and says why in the log).
pub fn approval_proofs(set: &gateway_policy::PolicySet) -> gateway_audit::approvals::proof::Proofs {
    let rule = |name: &str| {
        set.eval_rule(
            &format!("data.gateway.approvals.{name}"),
            regorus::Value::from(json!({})),
        )
    };
    let signers = match rule("allowed_signers") {
        Ok(Value::String(s)) => s,
        _ => String::new(),
    };
    let passkeys = match rule("passkeys") {
        Ok(v) => gateway_audit::approvals::passkey::listed(&v).unwrap_or_else(|e| {
            tracing::warn!("{e}");
            Vec::new()
        }),
        Err(_) => Vec::new(),
    };
    gateway_audit::approvals::proof::Proofs { signers, passkeys }
}
