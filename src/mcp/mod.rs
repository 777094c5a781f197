//! The MCP server (`gateway serve`, stdio, rmcp): the agent's only way in.
//!
//! - `tools/list` shows only the tools the policy lists for this client
//!   (`data.gateway.tool_list`), with input schemas built from the policy's
//!   param specs (`additionalProperties: false`, string limits), one output
//!   schema, and the policy's annotations.
//! - `tools/call` runs the pipeline. Denials and refusals are tool results
//!   with `isError: true` and the reasons. Malformed arguments are found by
//!   the policy (`violations` in the decision), after the request is
//!   audited, and come back the same way (a tool execution error, as
//!   SEP-1303 asks, so that the model can correct them), naming each field. Progress notifications go out
//!   when the client sent a progress token; cancellation drops the call,
//!   which kills its sandbox, and the audit says so.
//! - There is no tool, resource or prompt that approves, denies or reads
//!   approvals: approving is only reachable from the CLI.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    InitializeResult, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ServerCapabilities, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Map, Value, json};

use crate::pipeline::{CallResult, Outcome, Pipeline, ToolCall};
use crate::policy::Principal;

pub struct GatewayServer {
    pipeline: Arc<Pipeline>,
    /// The OS user on the other end, as the kernel said (the daemon's
    /// socket peer), or this process's user.
    caller: crate::identity::Caller,
    /// Where this session's `working_dir`s are resolved (`None`: the
    /// pipeline's own).
    workspace: Option<std::path::PathBuf>,
    /// Cancelled when the session ends (the client went away): every call
    /// still running is dropped, which kills its sandbox.
    ended: tokio_util::sync::CancellationToken,
}

impl GatewayServer {
    /// A session of this process's own user in the pipeline's workspace.
    pub fn new(pipeline: Arc<Pipeline>) -> GatewayServer {
        GatewayServer::for_caller(pipeline, crate::identity::Caller::this_process(), None)
    }

    /// A session of `caller` (from the socket's peer credentials) in
    /// `workspace`.
    pub fn for_caller(
        pipeline: Arc<Pipeline>,
        caller: crate::identity::Caller,
        workspace: Option<std::path::PathBuf>,
    ) -> GatewayServer {
        GatewayServer {
            pipeline,
            caller,
            workspace,
            ended: tokio_util::sync::CancellationToken::new(),
        }
    }

    /// A token that ends every call of this session when cancelled.
    pub fn session_end(&self) -> tokio_util::sync::CancellationToken {
        self.ended.clone()
    }

    fn principal(&self, ctx: &RequestContext<RoleServer>) -> Principal {
        let client = ctx
            .peer
            .peer_info()
            .map(|i| i.client_info.name.clone())
            .unwrap_or_else(|| "unknown".into());
        Principal::new(client, &self.caller)
    }

    /// The tools this principal may see, as the policy describes them.
    fn catalog(&self, principal: &Principal) -> Result<Map<String, Value>, McpError> {
        let set =
            self.pipeline.policy.current().map_err(|e| {
                McpError::internal_error(format!("no usable policy set: {e}"), None)
            })?;
        set.tool_list(principal)
            .map_err(|e| McpError::internal_error(e.to_string(), None))
    }
}

/// The input schema of a tool from its policy param specs.
pub fn input_schema(params: &Value) -> Map<String, Value> {
    let mut props = Map::new();
    let mut required = Vec::new();
    if let Some(p) = params.as_object() {
        for (name, spec) in p {
            let mut s = json!({"type": "string", "minLength": 1});
            if let Some(max) = spec.get("max_length").and_then(Value::as_u64) {
                s["maxLength"] = max.into();
            }
            if let Some(d) = spec.get("description").and_then(Value::as_str) {
                s["description"] = d.into();
            }
            props.insert(name.clone(), s);
            if spec
                .get("required")
                .and_then(Value::as_bool)
                .unwrap_or(false)
            {
                required.push(Value::String(name.clone()));
            }
        }
    }
    let mut schema = Map::new();
    schema.insert("type".into(), "object".into());
    schema.insert("properties".into(), Value::Object(props));
    schema.insert("required".into(), Value::Array(required));
    schema.insert("additionalProperties".into(), false.into());
    schema
}

/// The output schema shared by every tool: the pipeline's result.
pub fn output_schema() -> Map<String, Value> {
    let v = json!({
        "type": "object",
        "required": ["request_id", "tool", "status"],
        "properties": {
            "request_id": {"type": "string"},
            "tool": {"type": "string"},
            "status": {"type": "string", "enum": ["denied", "pending_approval", "refused", "completed", "cancelled"]},
            "reasons": {"type": "array", "items": {"type": "string"}},
            "violations": {"type": "array", "items": {"type": "object", "required": ["param", "problem", "message"],
                "properties": {"param": {"type": "string"}, "problem": {"type": "string"}, "message": {"type": "string"}}}},
            "reason": {"type": "string"},
            "approval_id": {"type": "string"},
            "approve_command": {"type": "string"},
            "signals": {"type": "array", "items": {"type": "object"}},
            "changes": {"type": "array", "items": {"type": "object"}},
            "ok": {"type": "boolean"},
            "summary": {"type": "string"},
            "result": {"type": "object"}
        }
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The tool result for a pipeline result: text plus structured content,
/// `isError` for denials and refusals, the request id in `_meta`.
pub fn to_result(r: &CallResult) -> CallToolResult {
    let structured = serde_json::to_value(r).unwrap_or(Value::Null);
    let (text, is_error) = match &r.outcome {
        Outcome::Denied { violations, .. } if !violations.is_empty() => {
            let mut t = format!("Invalid arguments for {}:", r.tool);
            for v in violations {
                t.push_str(&format!("\n- {}", v.message));
            }
            (t, true)
        }
        Outcome::Denied { reasons, .. } => {
            (format!("Denied by policy: {}", reasons.join("; ")), true)
        }
        Outcome::Refused { reason } => (format!("Refused: {reason}"), true),
        Outcome::PendingApproval {
            approval_id,
            signals,
            approve_command,
            ..
        } => {
            let mut t = format!(
                "Not applied: this call needs a person's approval (approval id {approval_id}). \
                 An operator reviews it with `gateway approvals show {approval_id}` and approves it with `{approve_command}`; \
                 then call terraform_apply again with approval_id {approval_id}."
            );
            for s in signals.as_array().into_iter().flatten() {
                t.push_str(&format!("\n!! {}", s["message"].as_str().unwrap_or("")));
            }
            (t, false)
        }
        Outcome::Completed { ok, summary, .. } => (summary.clone(), !ok),
    };
    let mut result = if is_error {
        CallToolResult::structured_error(structured)
    } else {
        CallToolResult::structured(structured)
    };
    result.content.insert(0, ContentBlock::text(text));
    let mut meta = rmcp::model::MetaObject::default();
    meta.insert("request_id".into(), Value::String(r.request_id.clone()));
    result.with_meta(Some(meta))
}

impl ServerHandler for GatewayServer {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("gateway", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Infrastructure tools behind policy. Destructive calls return a pending approval that a person \
                 grants out of band; call again with the approval_id once approved.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let principal = self.principal(&ctx);
        let catalog = self.catalog(&principal)?;
        let tools = catalog
            .iter()
            .map(|(name, t)| {
                let a = &t["annotations"];
                let annotations = ToolAnnotations::new()
                    .read_only(a["readOnlyHint"].as_bool().unwrap_or(false))
                    .destructive(a["destructiveHint"].as_bool().unwrap_or(true))
                    .idempotent(a["idempotentHint"].as_bool().unwrap_or(false))
                    .open_world(a["openWorldHint"].as_bool().unwrap_or(true));
                let mut tool = Tool::new(
                    name.clone(),
                    t["description"].as_str().unwrap_or("").trim().to_string(),
                    input_schema(&t["params"]),
                )
                .with_annotations(annotations)
                .with_raw_output_schema(Arc::new(output_schema()));
                if let Some(title) = t["title"].as_str() {
                    tool = tool.with_title(title);
                }
                tool
            })
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let principal = self.principal(&ctx);
        let args = request.arguments.clone().unwrap_or_default();
        let name = request.name.to_string();
        let call = ToolCall {
            tool: name.clone(),
            params: Value::Object(args),
            principal,
            workspace: self.workspace.clone(),
        };
        let progress_token = ctx.meta.get_progress_token();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let peer = ctx.peer.clone();
        let forward = tokio::spawn(async move {
            let mut n = 0.0;
            while let Some(message) = rx.recv().await {
                n += 1.0;
                if let Some(token) = &progress_token {
                    let mut p = ProgressNotificationParam::new(token.clone(), n);
                    p.message = Some(message);
                    let _ = peer.notify_progress(p).await;
                }
            }
        });
        let pipeline = Arc::clone(&self.pipeline);
        let request_id = crate::policy::input::new_request_id();
        let progress = crate::pipeline::Progress::new(Some(tx));
        let result = tokio::select! {
            r = pipeline.call_with(call, &request_id, &progress) => Some(r),
            _ = ctx.ct.cancelled() => None,
            _ = self.ended.cancelled() => None,
        };
        // Deliver every progress message before the result.
        drop(progress);
        let _ = forward.await;
        match result {
            Some(Ok(r)) => Ok(CallToolResponse::Complete(to_result(&r))),
            Some(Err(e)) => Err(McpError::internal_error(
                format!("the gateway failed: {e}"),
                None,
            )),
            None => {
                // The call's future was dropped: its sandbox is killed and removed.
                let _ = self.pipeline.audit.record(
                    &request_id,
                    crate::audit::Event::ToolResult(
                        json!({"status": "cancelled", "tool": name, "detail": "the client cancelled the call; its sandbox was killed and removed"}),
                    ),
                );
                Err(McpError::internal_error("cancelled", None))
            }
        }
    }
}
