//! The approval gate the runners that change things share: a pending
//! approval bound to the call (tool, params without approval_id, the
//! requester) and to its plan's digest, audited and announced.

use std::time::Duration;

use serde_json::{Value, json};

use super::terraform::{bound_params, refused_approval, requester_facts};
use crate::pipeline::{Call, Outcome, Pipeline, Step, Stop};
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

    /// `keep` for a runner whose outcome is kept whole with its approval.
    pub(super) fn whole(outcome: &Outcome) -> Value {
        serde_json::to_value(outcome).unwrap_or(Value::Null)
    }

    /// A call presented with `approval`, bound to `digest`: decided again
    /// with the approval (`input.approval`), the approval spent (tool,
    /// params without approval_id, digest and requester checked by the
    /// store, once), then `run`; its outcome is kept with the approval as
    /// `keep` makes it (the same call presented again is answered with it).
    /// Refusals are audited.
    pub(super) async fn spend_and_run(
        &self,
        call: &mut Call,
        approval: &gateway_audit::approvals::Approval,
        digest: &str,
        keep: fn(&Outcome) -> Value,
        run: impl AsyncFnOnce(&Call, &Decision) -> Result<Outcome, Stop>,
    ) -> Result<Outcome, Stop> {
        let rid = call.request_id().to_string();
        let approval_id = approval.id.as_str();
        call.input.approval = Some(self.approval_input(approval));
        let decision = self.decide(&call.input, Step::Approval)?;
        if decision.approval.required
            && !decision.approval.satisfied
            && approval.state.as_str() == "approved"
        {
            let reason = format!(
                "approval {approval_id} does not meet the policy's requirement now ({} approver(s) needed, status {}); nothing was applied",
                decision.approval.approvers,
                approval.state.as_str()
            );
            self.audit
                .record(&rid, refused_approval(approval_id, Some(&reason), None))?;
            return Err(Stop::refused(reason));
        }
        let bound = bound_params(&call.input.params);
        let (spent, applying) = call.commitment.commit(Some(approval_id), || {
            let r =
                self.approvals()
                    .spend(approval_id, &call.input.tool, &bound, Some(digest), &rid);
            let spent = matches!(r, Ok(Ok(_)));
            let applying = spent.then(|| self.applying(&rid, Some(approval_id)));
            ((r, applying), spent)
        })?;
        let spent = spent?;
        if let Err(refusal) = spent {
            self.audit.record(
                &rid,
                refused_approval(approval_id, None, Some(json!(refusal))),
            )?;
            return Err(Stop::refused(refusal.to_string()));
        }
        let _applying = applying;
        // How long the call waited for its people: from the request to
        // the last verdict that granted it.
        let at = |t: &str| chrono::DateTime::parse_from_rfc3339(t).ok();
        if let (Some(from), Some(to)) = (
            at(&approval.created_at),
            approval.verdicts.iter().filter_map(|v| at(&v.at)).max(),
        ) && let Ok(waited) = (to - from).to_std()
        {
            gateway_telemetry::observe(gateway_telemetry::Stage::ApprovalWait, waited);
        }
        // From here every end, a failure of the audit included, leaves an
        // outcome with the approval.
        let result = match self.audit.record(
            &rid,
            Event::ApprovalSpent {
                approval_id: approval_id.into(),
                plan_sha256: digest.to_string(),
            },
        ) {
            Ok(_) => run(call, &decision).await,
            Err(e) => Err(Stop::from(e)),
        };
        // Kept with the approval, for whoever asks after the client left.
        let kept = match &result {
            Ok(outcome) => keep(outcome),
            Err(Stop::Refused(r)) => json!({"status": "refused", "reason": r.reason}),
            Err(Stop::Denied { reasons, .. }) => json!({"status": "denied", "reasons": reasons}),
            Err(Stop::Failed(e)) => json!({"status": "error", "error": e.to_string()}),
        };
        // What the call recorded with its result deferred (upstream.called)
        // is on disk before the approval says how it ended.
        if let Err(e) = self.audit.sync() {
            tracing::error!(request_id = %rid, "the audit could not be synced: {e}");
        }
        if let Err(e) = self.approvals().record_outcome(approval_id, &rid, &kept) {
            tracing::error!(approval_id, request_id = %rid, "the call's outcome could not be kept with its approval: {e}");
        }
        result
    }

    /// The approval `approval_id`, when it was requested by this call's
    /// principal (a refusal, audited, otherwise).
    pub(super) fn requesters_approval(
        &self,
        call: &Call,
        approval_id: &str,
    ) -> Result<gateway_audit::approvals::Approval, Stop> {
        let approval = self
            .approvals()
            .get(approval_id)?
            .ok_or_else(|| Stop::refused(format!("no approval with id {approval_id}")))?;
        if approval.requested_by != call.input.principal.id() {
            let reason = format!(
                "approval {approval_id} was requested by {}; only that user's calls can use it",
                approval.requested_by
            );
            self.audit.record(
                call.request_id(),
                refused_approval(approval_id, Some(&reason), None),
            )?;
            return Err(Stop::refused(reason));
        }
        Ok(approval)
    }
}
