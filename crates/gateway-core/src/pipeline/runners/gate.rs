//! The approval gate the runners that change things share: a pending
//! approval bound to the call (tool, params without approval_id, the
//! requester) and to its plan's digest, audited and announced.

use std::time::Duration;

use serde_json::{Value, json};

use super::terraform::{bound_params, requester_facts};
use crate::pipeline::{Call, Outcome, Pipeline, Stop};
use gateway_audit::approvals::NewApproval;
use gateway_audit::audit::Event;
use gateway_policy::Decision;

impl Pipeline {
    /// A pending approval for `call`, bound to `digest`; `plan_summary` is
    /// what the approver reads, `changes` what the agent is told.
    pub(super) fn request_approval(
        &self,
        call: &Call,
        decision: &Decision,
        digest: &str,
        plan_summary: Value,
        changes: Value,
    ) -> Result<Outcome, Stop> {
        let rid = call.request_id().to_string();
        let signals = serde_json::to_value(&decision.signals).unwrap_or(Value::Null);
        let (a, superseded) = self.approvals().create(&NewApproval {
            tool: call.input.tool.clone(),
            params: bound_params(&call.input.params),
            plan_sha256: Some(digest.to_string()),
            plan_summary,
            signals: signals.clone(),
            request_id: rid.clone(),
            requested_by: call.input.principal.id(),
            requested_client: call.input.principal.client.clone(),
            requester: requester_facts(&call.input.principal),
            approvers_required: decision.approval.approvers,
            ttl: Duration::from_secs(decision.approval.ttl_seconds),
            reason_required: decision.approval.reason_required,
        })?;
        self.audit.record(
            &rid,
            Event::ApprovalRequested {
                approval_id: a.id.clone(),
                plan_sha256: digest.to_string(),
                signals: signals.as_array().map(Vec::len),
                approvers_required: a.approvers_required,
                expires_at: a.expires_at.to_string(),
            },
        )?;
        for old in superseded {
            let old_rid = self
                .approvals()
                .get(&old)?
                .map(|o| o.request_id)
                .unwrap_or_default();
            self.audit.record(
                &old_rid,
                Event::ApprovalSuperseded {
                    approval_id: old,
                    superseded_by: a.id.clone(),
                },
            )?;
        }
        self.notify(&a);
        let approve_command = format!(
            "gateway approve {}{}",
            a.id,
            if a.reason_required {
                " --reason \"...\""
            } else {
                ""
            }
        );
        Ok(Outcome::PendingApproval {
            review_url: self.review_url(&a.id),
            approval_id: a.id,
            signals,
            changes,
            approve_command,
        })
    }

    /// The approval presented with a call, as the policy sees it
    /// (`input.approval`): who approved, proven again now (signatures
    /// against today's allowed signers).
    pub(super) fn approval_input(&self, approval: &gateway_audit::approvals::Approval) -> Value {
        let identities = self.approver_identities(approval);
        json!({
            "id": approval.id, "status": approval.state.as_str(),
            "requested_by": approval.requested_by,
            "requester": approval.requester,
            "signals": approval.signals,
            "approvers": identities.iter().filter_map(|i| i["name"].as_str()).collect::<Vec<_>>(),
            "identities": identities,
        })
    }
}
