//! The MCP server (`gateway serve`, stdio, rmcp): the agent's only way in.
//!
//! - Both eras of the protocol: 2025-11-25 and older (the `initialize`
//!   handshake; the client's name comes from it) and 2026-07-28 (no
//!   handshake; the client's name and capabilities travel in each request's
//!   `_meta`). The name is what the client says it is: it chooses which
//!   tools the policy shows, never who may approve.
//! - `tools/list` shows only the tools the policy lists for this client
//!   (`data.gateway.tool_list`), with input schemas from the policy's param
//!   specs (descriptions, length limits, the values the policy allows as
//!   `enum`, nothing else accepted), each tool's own output schema
//!   ([`schema`]) and the policy's annotations. When a policy reload changes
//!   what a session would be shown, it is told: `notifications/tools/list_changed`
//!   (on a 2026-07-28 connection through `subscriptions/listen`).
//! - `tools/call` runs the pipeline. A tool this client is not shown is a
//!   JSON-RPC `-32602` error (SEP-1303), after the request is audited.
//!   Arguments the policy finds wrong (`violations`), denials and refusals
//!   are tool results with `isError: true` that name what is wrong, so that
//!   the model can correct them. Progress notifications go out when the
//!   client sent a progress token: each stage and a heartbeat at least
//!   every 10 s ([`progress`]). Cancellation drops the call, which kills
//!   its sandbox, and the audit says so — except an apply past its point
//!   of no return (its approval spent), which the pipeline runs to its end.
//! - A client that declares the Tasks extension gets a task for the tools
//!   the catalog marks `task: true`, which waits for a person's approval
//!   ([`tasks`]).
//! - There is no tool, resource or prompt that approves, denies or reads
//!   approvals: approving is only reachable from the CLI.

mod progress;
mod result;
pub mod schema;
mod tasks;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, CreateTaskResult, GetTaskParams,
    GetTaskResult, Implementation, InitializeResult, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ServerCapabilities, SubscriptionFilter, Tool, ToolAnnotations,
};
use rmcp::service::{Peer, RequestContext, SubscriptionContext};
use rmcp::task_manager::{TaskManager, TaskOptions};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Map, Value, json};

pub use progress::{DEFAULT_HEARTBEAT, MAX_HEARTBEAT};
pub use result::to_result;
pub use schema::{input_schema, output_schema};

use gateway_core::pipeline::{Outcome, Pipeline, ToolCall};
use gateway_policy::Principal;

/// How a session's caller is known.
#[derive(Debug, Clone)]
enum Identity {
    /// An OS user, as the kernel named it.
    Os(gateway_base::identity::Caller),
    /// Each request's verified bearer token ([`SsoPrincipal`]).
    Bearer,
}

/// The principal an HTTP request's bearer token proved, which the HTTP
/// transport puts in the request's extensions after verifying it (the
/// client's name is filled in from the MCP request).
#[derive(Debug, Clone)]
pub struct SsoPrincipal(pub Principal);

/// What a session shows: the tools a principal may see, by name.
type Catalog = Map<String, Value>;

pub struct GatewayServer {
    pipeline: Arc<Pipeline>,
    /// Who is on the other end: an OS user as the kernel said (the
    /// daemon's socket peer, or this process's user), or whoever each HTTP
    /// request's verified token names.
    identity: Identity,
    /// An HTTP session's identity, from its first request: a session is
    /// never used by another identity (its id is not a credential).
    bound: Arc<Mutex<Option<String>>>,
    /// Where this session's `working_dir`s are resolved (`None`: the
    /// pipeline's own).
    workspace: Option<std::path::PathBuf>,
    /// Cancelled when the session ends (the client went away): every call
    /// and task still running is dropped, which kills its sandbox.
    ended: tokio_util::sync::CancellationToken,
    /// How often progress goes out while nothing else happens.
    heartbeat: Duration,
    /// This session's tasks (a task id is only known to its session).
    tasks: TaskManager,
    /// When each task was made: the manager keeps a task, finished or
    /// not, for up to two lifetimes, so those count as held.
    made: Arc<Mutex<std::collections::VecDeque<std::time::Instant>>>,
    /// `subscriptions/listen` streams open now.
    listens: Arc<std::sync::atomic::AtomicUsize>,
    /// What a handshake-era session was last shown, to tell it when a
    /// policy reload changes that (`None` until it lists tools).
    shown: Arc<Mutex<Option<Shown>>>,
}

#[derive(Clone)]
struct Shown {
    principal: Principal,
    catalog: Option<Catalog>,
    peer: Peer<RoleServer>,
}

impl GatewayServer {
    /// A session of this process's own user in the pipeline's workspace.
    pub fn new(pipeline: Arc<Pipeline>) -> GatewayServer {
        GatewayServer::for_caller(
            pipeline,
            gateway_base::identity::Caller::this_process(),
            None,
        )
    }

    /// A session of `caller` (from the socket's peer credentials) in
    /// `workspace`.
    pub fn for_caller(
        pipeline: Arc<Pipeline>,
        caller: gateway_base::identity::Caller,
        workspace: Option<std::path::PathBuf>,
    ) -> GatewayServer {
        GatewayServer::with_identity(pipeline, Identity::Os(caller), workspace)
    }

    /// A session of the HTTP transport: each request's principal is the
    /// one its verified bearer token proves ([`SsoPrincipal`], put in the
    /// request's extensions by the transport), in the transport's
    /// `workspace`.
    pub fn for_http(pipeline: Arc<Pipeline>, workspace: std::path::PathBuf) -> GatewayServer {
        GatewayServer::with_identity(pipeline, Identity::Bearer, Some(workspace))
    }

    fn with_identity(
        pipeline: Arc<Pipeline>,
        identity: Identity,
        workspace: Option<std::path::PathBuf>,
    ) -> GatewayServer {
        GatewayServer {
            pipeline,
            identity,
            bound: Arc::new(Mutex::new(None)),
            workspace,
            ended: tokio_util::sync::CancellationToken::new(),
            heartbeat: DEFAULT_HEARTBEAT,
            tasks: TaskManager::new(),
            made: Arc::new(Mutex::new(std::collections::VecDeque::new())),
            listens: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            shown: Arc::new(Mutex::new(None)),
        }
    }

    /// Progress at least this often (at most [`MAX_HEARTBEAT`]).
    pub fn with_heartbeat(mut self, every: Duration) -> GatewayServer {
        self.heartbeat = every.min(MAX_HEARTBEAT);
        self
    }

    /// A token that ends every call of this session when cancelled.
    pub fn session_end(&self) -> tokio_util::sync::CancellationToken {
        self.ended.clone()
    }

    fn principal(&self, ctx: &RequestContext<RoleServer>) -> Result<Principal, McpError> {
        match &self.identity {
            Identity::Os(caller) => Ok(Principal::new(client_name(ctx), caller)),
            Identity::Bearer => {
                let Some(SsoPrincipal(p)) = ctx
                    .extensions
                    .get::<hyper::http::request::Parts>()
                    .and_then(|parts| parts.extensions.get::<SsoPrincipal>())
                else {
                    return Err(McpError::invalid_request(
                        "this request carries no verified identity",
                        None,
                    ));
                };
                let mut p = p.clone();
                p.client = client_name(ctx);
                let id = p.id();
                let mut bound = self.bound.lock().unwrap_or_else(|e| e.into_inner());
                match &*bound {
                    Some(b) if *b != id => {
                        return Err(McpError::invalid_request(
                            "this MCP session belongs to another identity; start your own session",
                            None,
                        ));
                    }
                    Some(_) => {}
                    None => *bound = Some(id),
                }
                Ok(p)
            }
        }
    }

    /// The tools this principal may see, as the policy describes them.
    fn catalog(&self, principal: &Principal) -> Result<Catalog, McpError> {
        catalog(&self.pipeline, principal)
    }

    /// Whether the policy lets this session hold one more task
    /// (`data.gateway.calls.task_allowed`); when it does not, or cannot
    /// say, the call is answered in its own response.
    /// Counts the task as made when it is.
    fn task_allowed(&self, principal: &Principal, tool: &str) -> bool {
        // Over HTTP a 2026-07-28 request has no session for a task to live
        // in: the call is answered in its own response (a pending apply
        // says how to call again with its approval).
        if matches!(self.identity, Identity::Bearer) {
            return false;
        }
        let Ok(set) = self.pipeline.policy.current() else {
            return false;
        };
        let Ok(mut made) = self.made.lock() else {
            return false;
        };
        let kept = 2 * tasks::TASK_TTL;
        while made.front().is_some_and(|t| t.elapsed() >= kept) {
            made.pop_front();
        }
        let input = json!({
            "tool": tool, "client": principal.client, "kind": principal.kind,
            "user": principal.user, "os_user": principal.os_user,
            "uid": principal.uid, "tasks": {"session": made.len()},
        });
        let allowed = matches!(
            set.eval_rule(
                "data.gateway.calls.task_allowed",
                regorus::Value::from(input)
            ),
            Ok(Value::Bool(true))
        );
        if allowed {
            made.push_back(std::time::Instant::now());
        }
        allowed
    }

    /// Start telling a handshake-era session when a reload changes what it
    /// was shown (once per session).
    fn watch_reloads(&self) {
        let shown = Arc::clone(&self.shown);
        let pipeline = Arc::clone(&self.pipeline);
        let ended = self.ended.clone();
        let mut swaps = self.pipeline.policy.swaps();
        let mut readings = self.pipeline.upstream_readings.subscribe();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = ended.cancelled() => break,
                    r = swaps.changed() => if r.is_err() { break },
                    // An upstream's tools read anew: a tool may have been
                    // hidden (or shown again).
                    r = readings.changed() => if r.is_err() { break },
                }
                let Some(before) = shown.lock().ok().and_then(|s| s.clone()) else {
                    continue;
                };
                let now = catalog(&pipeline, &before.principal).ok();
                if now != before.catalog {
                    if let Ok(mut s) = shown.lock() {
                        *s = Some(Shown {
                            catalog: now,
                            ..before.clone()
                        });
                    }
                    if before.peer.notify_tool_list_changed().await.is_err() {
                        break;
                    }
                }
            }
        });
    }
}

/// The most `subscriptions/listen` streams one session may hold open.
const MAX_LISTENS: usize = 4;

/// One open listen stream, counted until it ends.
struct ListenSlot(Arc<std::sync::atomic::AtomicUsize>);

/// A session's server goes when its session does (the socket's
/// connection closed, an HTTP session ended or expired, a stateless
/// request answered): what it still watches or runs for the session ends.
impl Drop for GatewayServer {
    fn drop(&mut self) {
        self.ended.cancel();
    }
}

impl Drop for ListenSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

fn catalog(pipeline: &Pipeline, principal: &Principal) -> Result<Catalog, McpError> {
    let set = pipeline
        .policy
        .current()
        .map_err(|e| McpError::internal_error(format!("no usable policy set: {e}"), None))?;
    set.tool_list(principal, &pipeline.upstream_readings.snapshot())
        .map_err(|e| McpError::internal_error(e.to_string(), None))
}

/// Whether the session speaks 2026-07-28 or later: it made no handshake,
/// so what the client is travels in each request's `_meta`. Decided by the
/// session, not by the request: a session that made the handshake keeps
/// what it said then, whatever a later request's `_meta` claims.
fn modern(ctx: &RequestContext<RoleServer>) -> bool {
    // Over stateless HTTP the transport stands in a peer of its own, whose
    // version is the request's header; a handshake's negotiated version is
    // never renamed by a later request's `_meta`.
    ctx.peer
        .peer_info()
        .is_none_or(|i| i.protocol_version.as_str() >= "2026-07-28")
}

/// The longest client name kept (in characters); the rest is cut.
const CLIENT_NAME_CHARS: usize = 128;

/// The client's name: from this request's `_meta` on 2026-07-28, from the
/// handshake before. `unknown` when it gave none.
fn client_name(ctx: &RequestContext<RoleServer>) -> String {
    let info = if modern(ctx) {
        ctx.meta.client_info()
    } else {
        ctx.peer.peer_info().map(|i| i.client_info.clone())
    };
    // No control characters (a NUL is not even text to PostgreSQL).
    info.map(|i| {
        i.name
            .chars()
            .filter(|c| !c.is_control())
            .take(CLIENT_NAME_CHARS)
            .collect::<String>()
    })
    .filter(|n| !n.is_empty())
    .unwrap_or_else(|| "unknown".into())
}

/// A name the client sent, quoted and cut at 64 characters (what it sent
/// is not echoed back at any size).
fn quoted(s: &str) -> String {
    let short: String = s.chars().take(64).collect();
    if short.len() < s.len() {
        format!("{:?}…", short)
    } else {
        format!("{short:?}")
    }
}

fn tool_of(name: &str, t: &Value) -> Tool {
    let a = &t["annotations"];
    let annotations = ToolAnnotations::new()
        .read_only(a["readOnlyHint"].as_bool().unwrap_or(false))
        .destructive(a["destructiveHint"].as_bool().unwrap_or(true))
        .idempotent(a["idempotentHint"].as_bool().unwrap_or(false))
        .open_world(a["openWorldHint"].as_bool().unwrap_or(true));
    let schema = match t.get("input_schema") {
        Some(Value::Object(pinned)) => schema::pinned_input_schema(pinned, &t["params"]),
        _ => input_schema(&t["params"]),
    };
    let mut tool = Tool::new(
        name.to_string(),
        t["description"].as_str().unwrap_or("").trim().to_string(),
        schema,
    )
    .with_annotations(annotations)
    .with_raw_output_schema(Arc::new(output_schema(t["runner"].as_str())));
    if let Some(title) = t["title"].as_str() {
        tool = tool.with_title(title);
    }
    tool
}

impl ServerHandler for GatewayServer {
    fn get_info(&self) -> InitializeResult {
        // Tasks are served where a session holds them (the local socket);
        // over HTTP a call is answered in its own response, so the
        // extension is not offered there.
        let served_tasks = !matches!(self.identity, Identity::Bearer);
        let capabilities = if served_tasks {
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .enable_tasks()
                .build()
        } else {
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build()
        };
        InitializeResult::new(capabilities)
            .with_server_info(Implementation::new("gateway", env!("CARGO_PKG_VERSION")))
            .with_instructions(if served_tasks {
                "Infrastructure tools behind policy. Destructive calls return a pending approval that a person \
                 grants out of band; call again with the approval_id once approved (a client with the tasks \
                 extension gets a task that waits for the approval instead)."
            } else {
                "Infrastructure tools behind policy. Destructive calls return a pending approval that a person \
                 grants out of band; call again with the approval_id once approved."
            })
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let principal = self.principal(&ctx)?;
        let catalog = self.catalog(&principal)?;
        let tools = catalog.iter().map(|(name, t)| tool_of(name, t)).collect();
        if !modern(&ctx) {
            let first = self
                .shown
                .lock()
                .map(|mut s| {
                    let first = s.is_none();
                    *s = Some(Shown {
                        principal,
                        catalog: Some(catalog),
                        peer: ctx.peer.clone(),
                    });
                    first
                })
                .unwrap_or(false);
            if first {
                self.watch_reloads();
            }
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let principal = self.principal(&ctx)?;
        let name = request.name.to_string();
        let call = ToolCall {
            trace: gateway_telemetry::TraceParent::from_meta(&ctx.meta),
            tool: name.clone(),
            params: Value::Object(request.arguments.clone().unwrap_or_default()),
            principal: principal.clone(),
            workspace: self.workspace.clone(),
        };
        let shown = self.catalog(&principal).ok();
        let entry = shown.as_ref().and_then(|c| c.get(&name));
        // Unknown to this client: the policy's list does not have it (a
        // list that cannot be made says nothing: the call is denied anyway).
        let unknown = shown.as_ref().is_some_and(|c| !c.contains_key(&name));
        let as_task = entry.is_some_and(|t| t["task"] == true)
            && ctx
                .client_capabilities()
                .is_some_and(|c| c.supports_tasks())
            && self.task_allowed(&principal, &name);
        if as_task {
            let session = tasks::TaskSession {
                pipeline: Arc::clone(&self.pipeline),
                ended: self.ended.clone(),
                heartbeat: self.heartbeat,
            };
            let options = TaskOptions::new()
                .with_ttl_ms(tasks::TASK_TTL.as_millis() as u64)
                .with_poll_interval_ms(500)
                .with_status_message(tasks::accepted(&name));
            let task = self
                .tasks
                .spawn(options, move |tctx| Box::pin(session.run(tctx, call)));
            return Ok(CallToolResponse::Task(CreateTaskResult::new(task)));
        }

        let progress_token = ctx.meta.get_progress_token();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let peer = ctx.peer.clone();
        let forward = tokio::spawn(progress::forward(rx, self.heartbeat, move |note| {
            let peer = peer.clone();
            let token = progress_token.clone();
            async move {
                if let Some(token) = token {
                    let mut p = ProgressNotificationParam::new(token, note.progress);
                    p.total = note.total;
                    p.message = Some(note.message);
                    let _ = peer.notify_progress(p).await;
                }
            }
        }));
        let request_id = gateway_policy::input::new_request_id();
        let progress = gateway_core::pipeline::Progress::new(Some(tx));
        // A cancel drops the call: the pipeline abandons it, or, once its
        // apply is committed, lets it run to its end (and audits which).
        let result = tokio::select! {
            r = self.pipeline.call_with(call, &request_id, &progress) => Some(r),
            _ = ctx.ct.cancelled() => None,
            _ = self.ended.cancelled() => None,
        };
        // Deliver every progress message before the result.
        drop(progress);
        let _ = forward.await;
        match result {
            // A tool this client is not shown is a protocol error (SEP-1303),
            // after the pipeline audited and denied it.
            Some(Ok(r)) => match &r.outcome {
                // The same words whether the tool does not exist or is
                // kept from this client; the policy's reasons are in the audit.
                Outcome::Denied { .. } if unknown => Err(McpError::invalid_params(
                    format!("Unknown tool: {}", quoted(&name)),
                    Some(json!({"request_id": r.request_id})),
                )),
                _ => Ok(CallToolResponse::Complete(to_result(&r))),
            },
            Some(Err(e)) => Err(McpError::internal_error(
                format!("the gateway failed: {e}"),
                None,
            )),
            // The call's future was dropped (the pipeline recorded what
            // became of it).
            None => Err(McpError::internal_error("cancelled", None)),
        }
    }

    fn accepted_subscription_filter(
        &self,
        _requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(SubscriptionFilter::builder().tools_list_changed().build())
    }

    /// A 2026-07-28 client's `subscriptions/listen`: told when a reload
    /// changes the tools it (as this request names it) would be shown.
    async fn listen(&self, sub: SubscriptionContext) -> Result<(), McpError> {
        use std::sync::atomic::Ordering;
        // A client needs one stream; a few are allowed, not a pile of them
        // (each one costs a tools/list evaluation at every reload).
        if self.listens.fetch_add(1, Ordering::SeqCst) >= MAX_LISTENS {
            self.listens.fetch_sub(1, Ordering::SeqCst);
            return Err(McpError::invalid_request(
                format!("this session already has {MAX_LISTENS} subscriptions/listen streams open"),
                None,
            ));
        }
        let _open = ListenSlot(Arc::clone(&self.listens));
        let principal = self.principal(sub.request_context())?;
        let mut before = self.catalog(&principal).ok();
        let mut swaps = self.pipeline.policy.swaps();
        loop {
            tokio::select! {
                _ = sub.cancelled() => return Ok(()),
                _ = self.ended.cancelled() => return Ok(()),
                r = swaps.changed() => if r.is_err() { return Ok(()) },
            }
            let now = self.catalog(&principal).ok();
            if now != before {
                before = now;
                if sub.sink().notify_tool_list_changed().await.is_err() {
                    return Ok(());
                }
            }
        }
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        self.tasks
            .get_task(&request.task_id)
            .map(GetTaskResult::new)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.tasks.cancel_task(&request.task_id)
    }
}
