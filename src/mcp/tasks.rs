//! Calls run as MCP tasks (the Tasks extension, SEP-2663) for a client that
//! declares it and a tool whose catalog entry says `task: true`.
//!
//! The call answers at once with a task; the client polls `tasks/get`. The
//! task runs the pipeline (its stages are the task's status message). When
//! the policy needs a person's approval the task keeps waiting, its status
//! saying which approval and the command an operator runs, and ends when
//! the approval is granted (the call is then made again with the approval,
//! as a new audited request, and its result is the task's), denied, expired,
//! superseded or spent elsewhere. Nothing here approves anything: the task
//! only reads the approval's state, which only `gateway approve` changes.
//!
//! `tasks/cancel` and the end of the session drop the running call (its
//! sandbox is killed and removed, the audit says so); a cancelled wait
//! leaves the approval as it is.

use std::sync::Arc;
use std::time::Duration;

use rmcp::ErrorData as McpError;
use rmcp::model::CallToolResult;
use rmcp::task_manager::{TaskContext, TaskExit};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::progress;
use super::result::to_result;
use crate::approvals::State;
use crate::pipeline::{CallResult, Outcome, Pipeline, Progress, ToolCall};

/// How often a waiting task reads its approval's state.
const APPROVAL_POLL: Duration = Duration::from_millis(500);
/// How long a task (and then its result) is kept: longer than any approval
/// can live (the policy keeps approvals within the plan retention, a day
/// by default); a waiting task ends when its approval expires.
pub const TASK_TTL: Duration = Duration::from_secs(2 * 24 * 3600);

/// What a task needs of the session.
#[derive(Clone)]
pub struct TaskSession {
    pub pipeline: Arc<Pipeline>,
    pub ended: CancellationToken,
    pub heartbeat: Duration,
}

impl TaskSession {
    /// The task's operation: the call, then the wait for its approval.
    pub async fn run(self, ctx: TaskContext, call: ToolCall) -> Result<CallToolResult, TaskExit> {
        let first = self.call(&ctx, call.clone()).await?;
        let Outcome::PendingApproval {
            approval_id,
            approve_command,
            ..
        } = &first.outcome
        else {
            return Ok(to_result(&first));
        };
        let waiting = format!(
            "waiting for a person's approval {approval_id}: an operator reviews it with \
             `gateway approvals show {approval_id}` and approves it with `{approve_command}`"
        );
        loop {
            ctx.set_status_message(waiting.clone());
            tokio::select! {
                _ = tokio::time::sleep(APPROVAL_POLL) => {}
                _ = ctx.cancelled() => return Err(TaskExit::Cancelled),
                _ = self.ended.cancelled() => return Err(TaskExit::Cancelled),
            }
            let approval = self.pipeline.approval(approval_id).map_err(|e| {
                TaskExit::Error(McpError::internal_error(
                    format!("the approval store cannot be read: {e}"),
                    None,
                ))
            })?;
            let refused = |reason: String| {
                Ok(to_result(&CallResult {
                    request_id: first.request_id.clone(),
                    tool: first.tool.clone(),
                    outcome: Outcome::Refused { reason },
                }))
            };
            let Some(a) = approval else {
                return refused(format!("approval {approval_id} is no longer recorded"));
            };
            match a.state {
                State::Pending => continue,
                State::Approved => {
                    let mut again = call.clone();
                    if let Value::Object(p) = &mut again.params {
                        p.insert("approval_id".into(), Value::String(approval_id.clone()));
                    }
                    ctx.set_status_message(format!("approval {approval_id} was granted: applying"));
                    let r = self.call(&ctx, again).await?;
                    return Ok(to_result(&r));
                }
                State::Denied => {
                    let why = a
                        .verdicts
                        .iter()
                        .rev()
                        .find(|v| v.verdict == "deny")
                        .map(|v| format!(" by {}: {}", v.approver, v.reason))
                        .unwrap_or_default();
                    return refused(format!(
                        "approval {approval_id} was denied{why}; nothing was applied"
                    ));
                }
                State::Expired => {
                    return refused(format!(
                        "approval {approval_id} expired at {} without being granted; nothing was applied",
                        a.expires_at
                    ));
                }
                State::Superseded => {
                    return refused(format!(
                        "approval {approval_id} was superseded by {} (a newer plan of the same call); nothing was applied",
                        a.superseded_by.as_deref().unwrap_or("a newer approval")
                    ));
                }
                State::Spent => {
                    return refused(format!(
                        "approval {approval_id} was already spent by request {}",
                        a.spent_request_id.as_deref().unwrap_or("(unknown)")
                    ));
                }
            }
        }
    }

    /// One pipeline call, its stages as the task's status; dropped (its
    /// sandbox killed, the audit told) when the task is cancelled.
    async fn call(&self, ctx: &TaskContext, call: ToolCall) -> Result<CallResult, TaskExit> {
        let request_id = crate::policy::input::new_request_id();
        let tool = call.tool.clone();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let status = ctx.clone();
        let forward = tokio::spawn(progress::forward(rx, self.heartbeat, move |note| {
            status.set_status_message(note.message);
            std::future::ready(())
        }));
        let stages = Progress::new(Some(tx));
        let result = tokio::select! {
            r = self.pipeline.call_with(call, &request_id, &stages) => Some(r),
            _ = ctx.cancelled() => None,
            _ = self.ended.cancelled() => None,
        };
        drop(stages);
        let _ = forward.await;
        match result {
            Some(Ok(r)) => Ok(r),
            Some(Err(e)) => Err(TaskExit::Error(McpError::internal_error(
                format!("the gateway failed: {e}"),
                None,
            ))),
            None => {
                super::record_cancelled(&self.pipeline, &request_id, &tool);
                Err(TaskExit::Cancelled)
            }
        }
    }
}

/// The status a task starts with.
pub fn accepted(tool: &str) -> String {
    format!("{tool} accepted; it runs as a task")
}
