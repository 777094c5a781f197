//! Every audit event the gateway writes, in one place: its name (the
//! `event` field of a line of HOME/audit.jsonl) and its `data`. The gateway
//! writes events only through [`super::AuditLog::record`]; README.md's
//! table of events is checked against [`NAMES`] (tests/audit_events.rs).
//!
//! `policy.decision` is the one event with OPA's decision-log fields at the
//! top level ([`super::AuditLog::policy_decision`]); `audit.recovered` and
//! `audit.head_lost` are written by the log itself, when it finds its last
//! line cut short or its head file gone; so is `audit.dropped`, when a
//! replica could not keep every event the team's chain refused while its
//! database was away.

use serde::Serialize;
use serde_json::Value;

/// Every event name, in the order README.md lists them.
pub const NAMES: &[&str] = &[
    "tool.request",
    "policy.decision",
    "policy.error",
    "approval.requested",
    "approval.granted",
    "approval.denied",
    "approval.refused",
    "approval.spent",
    "approval.superseded",
    "approval.replayed",
    "approval.notified",
    "approval.notify_failed",
    "credential.issued",
    "credential.refused",
    "credential.revoked",
    "credential.revoke_failed",
    "credential.revoke_on_abort",
    "sandbox.started",
    "sandbox.completed",
    "sandbox.output_refused",
    "sandbox.failed",
    "plan.saved",
    "upstream.called",
    "upstream.arguments_refused",
    "upstream.tool_changed",
    "state.saved",
    "state.refused",
    "tool.result",
    "call.detached",
    "task.ended",
    "policy.loaded",
    "policy.load_failed",
    "policy.reloaded",
    "policy.reload_failed",
    "session.opened",
    "session.refused",
    "http.refused",
    "approval_page.signed_in",
    "approval_page.passkey_registered",
    "audit.recovered",
    "audit.head_lost",
    "audit.dropped",
];

fn no<T>(v: &Option<T>) -> bool {
    v.is_none()
}

/// One event and its data.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", content = "data")]
pub enum Event {
    /// A call as the agent made it, before anything is decided.
    #[serde(rename = "tool.request")]
    ToolRequest {
        tool: String,
        params: Value,
        principal: Value,
    },
    /// The policy failed while deciding (the call is denied).
    #[serde(rename = "policy.error")]
    PolicyError { step: String, error: String },
    /// A pending approval was recorded for a plan.
    #[serde(rename = "approval.requested")]
    ApprovalRequested {
        approval_id: String,
        plan_sha256: String,
        /// How many signals the plan carries.
        signals: Option<usize>,
        approvers_required: u32,
        expires_at: String,
    },
    /// A person granted an approval (`gateway approve`).
    #[serde(rename = "approval.granted")]
    ApprovalGranted(Verdict),
    /// A person denied an approval (`gateway deny`).
    #[serde(rename = "approval.denied")]
    ApprovalDenied(Verdict),
    /// An approval, or a verdict on one, was refused.
    #[serde(rename = "approval.refused")]
    ApprovalRefused {
        approval_id: String,
        #[serde(skip_serializing_if = "no")]
        reason: Option<String>,
        #[serde(skip_serializing_if = "no")]
        refusal: Option<Value>,
        #[serde(skip_serializing_if = "no")]
        approver: Option<String>,
        #[serde(skip_serializing_if = "no")]
        action: Option<String>,
        #[serde(skip_serializing_if = "no")]
        os_user: Option<String>,
        /// An SSO caller's identity (`{id, issuer, subject, email,
        /// client_id, groups}`).
        #[serde(skip_serializing_if = "no")]
        identity: Option<Value>,
    },
    /// A newer plan of the same call replaced a pending or approved
    /// approval: it can no longer be granted or spent.
    #[serde(rename = "approval.superseded")]
    ApprovalSuperseded {
        approval_id: String,
        superseded_by: String,
    },
    /// A notifier was told of a requested approval.
    #[serde(rename = "approval.notified")]
    ApprovalNotified {
        approval_id: String,
        notifier: String,
    },
    /// A notifier failed (the call went on regardless).
    #[serde(rename = "approval.notify_failed")]
    ApprovalNotifyFailed {
        approval_id: String,
        notifier: String,
        error: String,
    },
    /// An approval was used, once, for the apply of its plan.
    #[serde(rename = "approval.spent")]
    ApprovalSpent {
        approval_id: String,
        plan_sha256: String,
    },
    /// A credential was minted for a call (never the secret itself).
    #[serde(rename = "credential.issued")]
    CredentialIssued {
        lease_id: String,
        mount: String,
        role: String,
        #[serde(skip_serializing_if = "no")]
        params: Option<Value>,
        #[serde(skip_serializing_if = "no")]
        ttl_seconds: Option<u64>,
        #[serde(skip_serializing_if = "no")]
        credential: Option<Value>,
        /// Issued after the call was cancelled (and revoked at once).
        #[serde(skip_serializing_if = "no")]
        after_cancellation: Option<bool>,
    },
    /// No credential could be minted; nothing was run.
    #[serde(rename = "credential.refused")]
    CredentialRefused {
        mount: String,
        role: String,
        error: String,
    },
    #[serde(rename = "credential.revoked")]
    CredentialRevoked {
        lease_id: String,
        #[serde(skip_serializing_if = "no")]
        attempt: Option<usize>,
        /// Revoked at start-up, left open by a gateway that stopped.
        #[serde(skip_serializing_if = "no")]
        recovered: Option<bool>,
        #[serde(skip_serializing_if = "no")]
        reason: Option<String>,
        #[serde(skip_serializing_if = "no")]
        issued_at: Option<Value>,
        #[serde(skip_serializing_if = "no")]
        owner_pid: Option<Value>,
        /// The replica that minted it and died (a shared lease ledger).
        #[serde(skip_serializing_if = "no")]
        owner_replica: Option<String>,
    },
    #[serde(rename = "credential.revoke_failed")]
    CredentialRevokeFailed {
        lease_id: String,
        error: String,
        #[serde(skip_serializing_if = "no")]
        attempt: Option<usize>,
        #[serde(skip_serializing_if = "no")]
        of: Option<usize>,
        #[serde(skip_serializing_if = "no")]
        recovered: Option<bool>,
        #[serde(skip_serializing_if = "no")]
        expires_at: Option<Value>,
    },
    /// The call was dropped while holding a credential: revoked from a task.
    #[serde(rename = "credential.revoke_on_abort")]
    CredentialRevokeOnAbort { lease_id: String },
    #[serde(rename = "sandbox.started")]
    SandboxStarted {
        sandbox: String,
        backend: String,
        limits: Value,
        deadline_seconds: u64,
        egress: Vec<String>,
        credential: bool,
        steps: Value,
    },
    #[serde(rename = "sandbox.completed")]
    SandboxCompleted {
        sandbox: String,
        exit_code: Option<i32>,
        ended: Value,
        duration_ms: u128,
        stdout_truncated: bool,
        stderr_truncated: bool,
        /// When each step of the run was reached, ms from its start.
        /// (`[{"stage", "at_ms"}]`; absent when the backend names none).
        #[serde(skip_serializing_if = "Value::is_null")]
        stages: Value,
    },
    /// A file the sandbox left was not one the gateway reads.
    #[serde(rename = "sandbox.output_refused")]
    SandboxOutputRefused { sandbox: String, reason: String },
    #[serde(rename = "sandbox.failed")]
    SandboxFailed {
        sandbox: String,
        error: String,
        /// The steps the run reached before it failed, as in
        /// `sandbox.completed` (absent when none are known).
        #[serde(skip_serializing_if = "Value::is_null")]
        stages: Value,
    },
    /// A plan file and its JSON were saved (HOME/plans).
    #[serde(rename = "plan.saved")]
    PlanSaved {
        plan_file: String,
        sha256: String,
        json_sha256: String,
        shown_by: String,
    },
    /// An upstream MCP server's tool was called in its sandbox (or not,
    /// when `error` says why): digests of what was sent and returned.
    #[serde(rename = "upstream.called")]
    UpstreamCalled {
        upstream: String,
        tool: String,
        definition_sha256: String,
        arguments_sha256: String,
        #[serde(skip_serializing_if = "no")]
        result_bytes: Option<u64>,
        #[serde(skip_serializing_if = "no")]
        result_sha256: Option<String>,
        #[serde(skip_serializing_if = "no")]
        error: Option<String>,
        requests_refused: u64,
        notifications: u64,
        /// The warm sandbox that served the call (its `sandbox.started`
        /// is in the call that started it); absent: a sandbox of its own.
        #[serde(skip_serializing_if = "no")]
        warm_sandbox: Option<String>,
    },
    /// A call's arguments do not match the upstream tool's locked input
    /// schema; nothing was run.
    #[serde(rename = "upstream.arguments_refused")]
    UpstreamArgumentsRefused {
        upstream: String,
        tool: String,
        definition_sha256: String,
        errors: Vec<String>,
    },
    /// An upstream's tool is not as locked (changed or gone), or the
    /// server said its list changed: hidden and refused until locked again.
    #[serde(rename = "upstream.tool_changed")]
    UpstreamToolChanged {
        upstream: String,
        tool: String,
        locked_sha256: String,
        #[serde(skip_serializing_if = "no")]
        live_sha256: Option<String>,
        list_changed: bool,
    },
    /// A state file an apply left was written back to the module.
    #[serde(rename = "state.saved")]
    StateSaved {
        file: String,
        sha256: String,
        serial: u64,
        lineage: String,
    },
    /// A state file an apply left was not written back (kept aside).
    #[serde(rename = "state.refused")]
    StateRefused {
        file: String,
        sha256: String,
        reason: String,
        kept_at: String,
    },
    /// How the call ended: the outcome as the agent got it
    /// (`status` completed | denied | refused | pending_approval), or
    /// `cancelled` / `error`.
    #[serde(rename = "tool.result")]
    ToolResult(Value),
    /// A call made again with an approval it already spent: nothing ran;
    /// the result is the spending request's outcome, returned again.
    #[serde(rename = "approval.replayed")]
    ApprovalReplayed {
        approval_id: String,
        spent_by: String,
        status: String,
    },
    /// The client went away (cancelled, disconnected) after the call's
    /// apply was committed (its approval spent, or an apply that needs
    /// none about to start): it runs on to its end, and its `tool.result`
    /// follows.
    #[serde(rename = "call.detached")]
    CallDetached {
        #[serde(skip_serializing_if = "no")]
        approval_id: Option<String>,
        detail: String,
    },
    /// An MCP task ended (recorded under the request that made it): how
    /// (`completed`, `refused`, `cancelled`, `expired`, `failed`), why,
    /// and the request that carried out the approved call, if one did.
    #[serde(rename = "task.ended")]
    TaskEnded {
        task_id: String,
        outcome: String,
        detail: String,
        #[serde(skip_serializing_if = "no")]
        request_id: Option<String>,
    },
    #[serde(rename = "policy.loaded")]
    PolicyLoaded {
        fingerprint: String,
        files: usize,
        /// From a signed bundle: `{key_id, revision}`.
        #[serde(skip_serializing_if = "no")]
        signed: Option<Value>,
    },
    #[serde(rename = "policy.load_failed")]
    PolicyLoadFailed { error: String },
    #[serde(rename = "policy.reloaded")]
    PolicyReloaded {
        fingerprint: String,
        files: usize,
        #[serde(skip_serializing_if = "no")]
        signed: Option<Value>,
    },
    /// A changed policy set did not load; `active` is the set still used.
    #[serde(rename = "policy.reload_failed")]
    PolicyReloadFailed {
        error: String,
        active: Option<String>,
    },
    /// A connection to the daemon's socket was admitted. `caller` is the
    /// OS user the kernel named (uid, gid, pid, user, groups); `mode` is
    /// `mcp` (with its workspace) or `control` (with the command).
    #[serde(rename = "session.opened")]
    SessionOpened {
        caller: Value,
        mode: String,
        #[serde(skip_serializing_if = "no")]
        workspace: Option<String>,
        #[serde(skip_serializing_if = "no")]
        command: Option<Vec<String>>,
    },
    /// A connection was refused before anything ran (bad hello, a
    /// workspace the caller does not own, a command not served).
    #[serde(rename = "session.refused")]
    SessionRefused { caller: Value, reason: String },
    /// An HTTP request refused before anything ran: no token, a token that
    /// does not verify (its reason), a foreign Host or Origin, a token in
    /// the query string. `remote` is the peer address; `token` what the
    /// refused token said of itself (issuer, subject, kid, algorithm),
    /// never the token.
    /// An approver opened an approval page session with a listed passkey
    /// (user verified).
    #[serde(rename = "approval_page.signed_in")]
    ApprovalPageSignedIn {
        approver: String,
        credential_id: String,
        remote: String,
    },
    /// Someone created a passkey on the registration page (it counts only
    /// once a policy author lists it).
    #[serde(rename = "approval_page.passkey_registered")]
    ApprovalPagePasskeyRegistered {
        name: String,
        credential_id: String,
        remote: String,
    },
    #[serde(rename = "http.refused")]
    HttpRefused {
        status: u16,
        reason: String,
        remote: String,
        method: String,
        path: String,
        #[serde(skip_serializing_if = "no")]
        token: Option<Value>,
        /// The verified identity refused (a limit of its share reached).
        #[serde(skip_serializing_if = "no")]
        identity: Option<String>,
        /// Refusals of the same address not audited one by one since the
        /// last that was (past the per-minute budget).
        #[serde(skip_serializing_if = "no")]
        not_audited_before: Option<u64>,
    },
}

/// A person's verdict on an approval.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub approval_id: String,
    /// The proven identity the verdict counts for.
    pub approver: String,
    /// `ssh_key` or `os_user`: how it was proven.
    pub kind: String,
    /// Who submitted it, as the kernel named them (empty for an SSO
    /// identity).
    pub os_user: String,
    /// `sso`: the identity its token proved (`{id, issuer, subject, email,
    /// groups}`).
    #[serde(skip_serializing_if = "no")]
    pub identity: Option<Value>,
    pub reason: String,
    pub state: String,
    pub grants: u32,
    pub approvers_required: u32,
    /// For a signed verdict: the key, the statement and the signature, so
    /// that `gateway audit verify` (or ssh-keygen -Y verify) re-checks it.
    #[serde(skip_serializing_if = "no")]
    pub key_fingerprint: Option<String>,
    #[serde(skip_serializing_if = "no")]
    pub public_key: Option<String>,
    #[serde(skip_serializing_if = "no")]
    pub statement: Option<String>,
    #[serde(skip_serializing_if = "no")]
    pub signature: Option<String>,
}

impl Event {
    /// The event's name and data, as written.
    pub fn split(&self) -> (String, Value) {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        let name = v
            .get("event")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let data = v
            .as_object_mut()
            .and_then(|o| o.remove("data"))
            .unwrap_or(Value::Null);
        (name, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_event_splits_into_its_name_and_data_and_the_name_is_listed() {
        let e = Event::ApprovalSpent {
            approval_id: "ap-1".into(),
            plan_sha256: "ab".into(),
        };
        let (name, data) = e.split();
        assert_eq!(name, "approval.spent");
        assert_eq!(data, json!({"approval_id": "ap-1", "plan_sha256": "ab"}));
        assert!(NAMES.contains(&name.as_str()));
        let (name, data) = Event::ToolResult(json!({"status": "refused", "reason": "x"})).split();
        assert_eq!(name, "tool.result");
        assert_eq!(data["status"], "refused");
        let (_, data) = Event::CredentialRevoked {
            lease_id: "l".into(),
            attempt: Some(1),
            recovered: None,
            reason: None,
            issued_at: None,
            owner_pid: None,
            owner_replica: None,
        }
        .split();
        assert_eq!(data, json!({"lease_id": "l", "attempt": 1}));
    }
}
