//! Calls run as MCP tasks (the Tasks extension, SEP-2663) for a client that
//! declares it and a tool whose catalog entry says `task: true`.
//!
//! The call answers at once with a task; the client polls `tasks/get`. The
//! task runs the pipeline (its stages are the task's status message). When
//! the policy needs a person's approval the task keeps waiting, its status
//! saying which approval and the command an operator runs, and ends when
//! the approval is granted (the call is then made again with the approval,
//! as a new audited request through the whole pipeline, and its result is
//! the task's), denied, expired, superseded or spent elsewhere, or when the
//! task has waited as long as a task lives. Nothing here approves anything:
//! the task only reads the approval's state, which only `gateway approve`
//! and `gateway deny` change. Every end is audited (`task.ended`).
//!
//! `tasks/cancel` and the end of the session drop a running call (its
//! sandbox is killed and removed, the audit says so) and end a wait (the
//! approval stays as it is) — except an apply whose approval is spent: the
//! pipeline runs it to its end whatever the client does, so that no state
//! is lost half way, and keeps its outcome with the approval.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::ErrorData as McpError;
use rmcp::model::CallToolResult;
use rmcp::task_manager::{TaskContext, TaskExit};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::progress;
use super::result::to_result;
use gateway_audit::approvals::State;
use gateway_audit::audit::Event;
use gateway_core::pipeline::{CallResult, Outcome, Pipeline, Progress, ToolCall};

/// How long a task lives (rmcp keeps a finished one as long again, for
/// polling). A wait that lasts longer ends a minute before, saying how to go
/// on without the task.
pub const TASK_TTL: Duration = Duration::from_secs(3600);
const WAIT_AT_MOST: Duration = Duration::from_secs(3600 - 60);

/// What a task needs of the session.
#[derive(Clone)]
pub struct TaskSession {
    pub pipeline: Arc<Pipeline>,
    pub ended: CancellationToken,
    pub heartbeat: Duration,
}

/// How a task ended, for the audit.
struct End {
    outcome: &'static str,
    detail: String,
    request_id: Option<String>,
}

impl TaskSession {
    /// The task's operation: the call, then the wait for its approval; the
    /// end is audited under the first request.
    pub async fn run(self, ctx: TaskContext, call: ToolCall) -> Result<CallToolResult, TaskExit> {
        let (first_id, result, end) = self.run_inner(&ctx, call).await;
        if let Some(first_id) = first_id {
            let _ = self.pipeline.audit.record(
                &first_id,
                Event::TaskEnded {
                    task_id: ctx.task_id().to_string(),
                    outcome: end.outcome.into(),
                    detail: end.detail,
                    request_id: end.request_id,
                },
            );
        }
        result
    }

    async fn run_inner(
        &self,
        ctx: &TaskContext,
        call: ToolCall,
    ) -> (Option<String>, Result<CallToolResult, TaskExit>, End) {
        let started = Instant::now();
        let first_id = gateway_policy::input::new_request_id();
        let first = match self.call(ctx, call.clone(), &first_id).await {
            Ok(r) => r,
            Err((exit, end)) => return (Some(first_id), Err(exit), end),
        };
        let Outcome::PendingApproval {
            approval_id,
            approve_command,
            review_url,
            ..
        } = &first.outcome
        else {
            let end = End {
                outcome: "completed",
                detail: format!("the call ended {}", status_of(&first)),
                request_id: None,
            };
            return (Some(first_id), Ok(to_result(&first)), end);
        };
        let refused = |reason: String, outcome: &'static str| {
            let end = End {
                outcome,
                detail: reason.clone(),
                request_id: None,
            };
            let r = to_result(&CallResult {
                request_id: first.request_id.clone(),
                tool: first.tool.clone(),
                outcome: Outcome::Refused { reason },
            });
            (Some(first.request_id.clone()), Ok(r), end)
        };
        let waiting = match review_url {
            // The page first: the client shows its person where to decide.
            Some(url) => format!(
                "waiting for a person's approval {approval_id}: review and approve it at {url} \
                 (or `gateway approvals show {approval_id}`, then `{approve_command}`)"
            ),
            None => format!(
                "waiting for a person's approval {approval_id}: an operator reviews it with \
                 `gateway approvals show {approval_id}` and approves it with `{approve_command}`"
            ),
        };
        // A verdict given on any replica wakes the wait at once when the
        // store tells of changes (PostgreSQL's notifications); the poll is
        // the bound when it cannot (SQLite, or a lost listener).
        let changes = Arc::clone(&self.pipeline.approval_changes);
        let mut changed = Box::pin(changes.notified());
        changed.as_mut().enable();
        loop {
            ctx.set_status_message(waiting.clone());
            if started.elapsed() >= WAIT_AT_MOST {
                return refused(
                    format!(
                        "approval {approval_id} is still pending after {} minutes, as long as a task waits; \
                         once it is granted, call {} again with approval_id {approval_id}",
                        WAIT_AT_MOST.as_secs() / 60,
                        first.tool
                    ),
                    "expired",
                );
            }
            tokio::select! {
                _ = tokio::time::sleep(self.pipeline.approval_poll) => {}
                _ = &mut changed => {}
                _ = ctx.cancelled() => return cancelled(&first.request_id, "the client cancelled the task while it waited; the approval stays as it is"),
                _ = self.ended.cancelled() => return cancelled(&first.request_id, "the session ended while the task waited; the approval stays as it is"),
            }
            // Armed before the read: a change after it wakes the next wait.
            changed = Box::pin(changes.notified());
            changed.as_mut().enable();
            // SQLite, behind the store's lock: off the async workers.
            let pipeline = Arc::clone(&self.pipeline);
            let id = approval_id.clone();
            let approval = tokio::task::spawn_blocking(move || pipeline.approval(&id))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()));
            let approval = match approval {
                Ok(a) => a,
                Err(e) => {
                    let why = format!("the approval store cannot be read: {e}");
                    let end = End {
                        outcome: "failed",
                        detail: why.clone(),
                        request_id: None,
                    };
                    return (
                        Some(first.request_id.clone()),
                        Err(TaskExit::Error(McpError::internal_error(why, None))),
                        end,
                    );
                }
            };
            let Some(a) = approval else {
                return refused(
                    format!("approval {approval_id} is no longer recorded"),
                    "refused",
                );
            };
            match a.state {
                State::Pending => continue,
                State::Approved => {
                    let mut again = call.clone();
                    if let Value::Object(p) = &mut again.params {
                        p.insert("approval_id".into(), Value::String(approval_id.clone()));
                    }
                    ctx.set_status_message(format!("approval {approval_id} was granted: applying"));
                    let applied_id = gateway_policy::input::new_request_id();
                    return match self.call(ctx, again, &applied_id).await {
                        Ok(r) => {
                            let end = End {
                                outcome: "completed",
                                detail: format!(
                                    "approval {approval_id} was granted; the call ended {}",
                                    status_of(&r)
                                ),
                                request_id: Some(applied_id),
                            };
                            (Some(first.request_id.clone()), Ok(to_result(&r)), end)
                        }
                        Err((exit, mut end)) => {
                            if end.outcome == "cancelled" {
                                // Whether the cancel came before or after the
                                // spend was settled when the call was dropped:
                                // the store says which.
                                end.detail =
                                    self.cancelled_after_grant(approval_id, &applied_id).await;
                            }
                            end.request_id = Some(applied_id);
                            (Some(first.request_id.clone()), Err(exit), end)
                        }
                    };
                }
                State::Denied => {
                    let why = a
                        .verdicts
                        .iter()
                        .rev()
                        .find(|v| v.verdict == "deny")
                        .map(|v| format!(": {}", v.reason))
                        .unwrap_or_default();
                    return refused(
                        format!("approval {approval_id} was denied{why}; nothing was applied"),
                        "refused",
                    );
                }
                ended => {
                    let (reason, outcome) = match ended {
                        State::Expired => (
                            format!(
                                "approval {approval_id} expired at {} without being granted; nothing was applied",
                                a.expires_at
                            ),
                            "expired",
                        ),
                        State::Superseded => (
                            format!(
                                "approval {approval_id} was superseded by {} (a newer plan of the same call); nothing was applied",
                                a.superseded_by.as_deref().unwrap_or("a newer approval")
                            ),
                            "refused",
                        ),
                        _ => (
                            format!(
                                "approval {approval_id} was already spent by request {}",
                                a.spent_request_id.as_deref().unwrap_or("(unknown)")
                            ),
                            "refused",
                        ),
                    };
                    return refused(reason, outcome);
                }
            }
        }
    }

    /// What a task cancelled once its approval was granted left behind: the
    /// apply runs to its end if the approval was spent by its call (the
    /// pipeline settled that when the call was dropped), else nothing was
    /// applied and the approval stays granted.
    async fn cancelled_after_grant(&self, approval_id: &str, applied_id: &str) -> String {
        let pipeline = Arc::clone(&self.pipeline);
        let id = approval_id.to_string();
        let approval = tokio::task::spawn_blocking(move || pipeline.approval(&id)).await;
        match approval {
            Ok(Ok(Some(a))) if a.spent_request_id.as_deref() == Some(applied_id) => format!(
                "the task was cancelled after approval {approval_id} was spent; the apply runs to its end and its outcome is kept with the approval (gateway approvals show {approval_id})"
            ),
            Ok(Ok(Some(a))) => format!(
                "the task was cancelled after approval {approval_id} was granted, before it was spent; nothing was applied and the approval is {}",
                a.state.as_str()
            ),
            Ok(Ok(None)) => format!(
                "the task was cancelled after approval {approval_id} was granted; the approval is no longer recorded"
            ),
            Ok(Err(e)) => format!(
                "the task was cancelled after approval {approval_id} was granted; whether it was spent cannot be read: {e} (gateway approvals show {approval_id})"
            ),
            Err(e) => format!(
                "the task was cancelled after approval {approval_id} was granted; whether it was spent cannot be read: {e} (gateway approvals show {approval_id})"
            ),
        }
    }

    /// One pipeline call, its stages as the task's status. A cancel (or
    /// the session's end) drops it: the pipeline abandons it, or runs it to
    /// its end once its approval is spent ([`Self::cancelled_after_grant`]).
    async fn call(
        &self,
        ctx: &TaskContext,
        call: ToolCall,
        request_id: &str,
    ) -> Result<CallResult, (TaskExit, End)> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let status = ctx.clone();
        let forward = tokio::spawn(progress::forward(rx, self.heartbeat, move |note| {
            status.set_status_message(note.message);
            std::future::ready(())
        }));
        let stages = Progress::new(Some(tx));
        let result = tokio::select! {
            r = self.pipeline.call_with(call, request_id, &stages) => Some(r.map_err(|e| e.to_string())),
            _ = ctx.cancelled() => None,
            _ = self.ended.cancelled() => None,
        };
        // Every status message before the result (a dropped call's progress
        // was disconnected by the pipeline).
        drop(stages);
        let _ = forward.await;
        match result {
            Some(Ok(r)) => Ok(r),
            Some(Err(e)) => {
                let why = format!("the gateway failed: {e}");
                Err((
                    TaskExit::Error(McpError::internal_error(why.clone(), None)),
                    End {
                        outcome: "failed",
                        detail: why,
                        request_id: None,
                    },
                ))
            }
            None => Err((
                TaskExit::Cancelled,
                End {
                    outcome: "cancelled",
                    detail: "the task was cancelled while its call ran; the sandbox was killed and removed".into(),
                    request_id: None,
                },
            )),
        }
    }
}

/// A task ended while it waited (nothing was running).
fn cancelled(
    request_id: &str,
    detail: &str,
) -> (Option<String>, Result<CallToolResult, TaskExit>, End) {
    (
        Some(request_id.to_string()),
        Err(TaskExit::Cancelled),
        End {
            outcome: "cancelled",
            detail: detail.into(),
            request_id: None,
        },
    )
}

fn status_of(r: &CallResult) -> &'static str {
    match &r.outcome {
        Outcome::Denied { .. } => "denied",
        Outcome::PendingApproval { .. } => "pending approval",
        Outcome::Refused { .. } => "refused",
        Outcome::Completed { ok: true, .. } => "completed",
        Outcome::Completed { ok: false, .. } => "completed with a failure",
    }
}

/// The status a task starts with.
pub fn accepted(tool: &str) -> String {
    format!("{tool} accepted; it runs as a task")
}
