//! `kubectl_get_pods` (tool `k8s_get_pod_status`): `kubectl get pods` in the
//! namespace the decision's credential is scoped to (never the agent's
//! string), with the minted token, in a sandbox that reaches only the API
//! server.
//!
//! `kubectl_read` (`k8s_get`, `k8s_describe`, `k8s_logs`, `k8s_events`,
//! `k8s_rollout_status`, `k8s_rollout_history`, and any read the catalog
//! adds): the one kubectl command of the decision's `operation`, the same
//! way; its answer is read as hostile input ([`tools::kubectl`]).

use serde_json::{Value, json};

use super::{RunnerFuture, ToolRunner};
use crate::pipeline::{Call, Outcome, Pipeline, SandboxCall, Stop, Toolset, tail};
use crate::tools;
use crate::tools::kubectl::ReadOp;
use gateway_policy::Decision;

pub struct GetPods;

impl ToolRunner for GetPods {
    fn name(&self) -> &'static str {
        "kubectl_get_pods"
    }

    fn result_schema(&self) -> Value {
        json!({"anyOf": [
            {"description": "the pods, as kubectl listed them",
             "type": "object", "required": ["namespace", "pods"], "additionalProperties": false,
             "properties": {
                "namespace": {"type": "string"},
                "pods": {"type": "array", "items": {"type": "object",
                    "required": ["name", "phase", "ready", "restarts", "node", "started"],
                    "additionalProperties": false,
                    "properties": {
                        "name": {"type": "string"},
                        "phase": {"type": "string"},
                        "ready": {"type": "string", "description": "ready containers / containers"},
                        "restarts": {"type": "integer", "minimum": 0},
                        "node": {"type": "string"},
                        "started": {"type": "string", "description": "RFC 3339, or empty"}}}}}},
            {"description": "kubectl failed in its sandbox",
             "type": "object", "required": ["namespace", "exit_code", "ended", "errors"], "additionalProperties": false,
             "properties": {
                "namespace": {"type": "string"},
                "exit_code": {"type": ["integer", "null"]},
                "ended": super::ended_schema(),
                "errors": {"type": "string", "description": "the last lines kubectl wrote to stderr"}}},
            {"description": "kubectl's answer could not be read (the summary says why)",
             "type": "object", "required": ["namespace"], "additionalProperties": false,
             "properties": {"namespace": {"type": "string"}}}
        ]})
    }

    fn run<'a>(
        &'a self,
        p: &'a Pipeline,
        call: &'a mut Call,
        decision: Decision,
    ) -> RunnerFuture<'a> {
        Box::pin(async move {
            let namespace = credential_namespace(p, call, &decision)?;
            let steps = tools::kubectl_get_pods_steps(&namespace, &tools::kubeconfig_inside());
            let r = kubectl_sandbox(p, call, &decision, steps).await?;
            if !r.success() {
                return Ok(Outcome::Completed {
                    ok: false,
                    summary: format!("kubectl get pods failed ({:?})", r.ended),
                    result: json!({"namespace": namespace, "exit_code": r.exit_code, "ended": r.ended,
                                   "errors": tail(&r.stderr.text(), 20)}),
                });
            }
            Ok(match tools::pod_table(&r.stdout.bytes) {
                Ok(pods) => Outcome::Completed {
                    ok: true,
                    summary: tools::pod_summary(&namespace, &pods),
                    result: json!({"namespace": namespace, "pods": pods}),
                },
                Err(e) => Outcome::Completed {
                    ok: false,
                    summary: format!("kubectl's answer could not be read: {e}"),
                    result: json!({"namespace": namespace}),
                },
            })
        })
    }
}

/// The namespace the decision's credential is scoped to (what kubectl is
/// pointed at), once it is known that a broker can mint it.
pub(super) fn credential_namespace(
    p: &Pipeline,
    call: &Call,
    decision: &Decision,
) -> Result<String, Stop> {
    let namespace = decision
        .credential
        .as_ref()
        .and_then(|c| c.params.get("kubernetes_namespace"))
        .cloned()
        .ok_or_else(|| {
            Stop::refused("the decision names no credential scoped to a namespace; nothing was run")
        })?;
    if p.broker.is_none() {
        return Err(Stop::refused(format!(
            "{} needs a credential and no credential broker is configured; nothing was run",
            call.input.tool
        )));
    }
    Ok(namespace)
}

/// kubectl's `steps` in the call's sandbox, with its credential.
pub(super) async fn kubectl_sandbox(
    p: &Pipeline,
    call: &Call,
    decision: &Decision,
    steps: Vec<tools::Step>,
) -> Result<gateway_sandbox::SandboxResult, Stop> {
    p.run_sandbox(
        &call.progress,
        call.request_id(),
        decision,
        SandboxCall {
            suffix: "",
            tool: Toolset::Kubectl,
            steps,
            workdir: None,
            files_in: vec![],
            files_out: vec![],
            with_credential: true,
        },
    )
    .await
}

pub struct Read;

impl ToolRunner for Read {
    fn name(&self) -> &'static str {
        "kubectl_read"
    }

    fn result_schema(&self) -> Value {
        let common = |extra: Value| {
            let mut props = json!({
                "namespace": {"type": "string"},
                "verb": {"type": "string", "description": "what kubectl did: get, describe, logs, events, rollout_status, rollout_history"},
                "object": {"type": "string", "description": "what the read is about"},
                "truncated": {"type": "boolean", "description": "true when there was more than the policy's result_bytes (or the sandbox's output cap): the rest is not shown"}
            });
            if let (Some(p), Some(e)) = (props.as_object_mut(), extra.as_object()) {
                p.extend(e.clone());
            }
            props
        };
        json!({"anyOf": [
            {"description": "objects, as JSON without managedFields (get)",
             "type": "object", "required": ["namespace", "verb", "object", "items", "truncated", "omitted"], "additionalProperties": false,
             "properties": common(json!({
                "items": {"type": "array", "items": {"type": "object"}},
                "omitted": {"type": "integer", "minimum": 0, "description": "objects left out to keep under the cap"}}))},
            {"description": "Secrets: names, types and keys, never values (get)",
             "type": "object", "required": ["namespace", "verb", "object", "items", "values", "truncated", "omitted"], "additionalProperties": false,
             "properties": common(json!({
                "items": {"type": "array", "items": {"type": "object", "required": ["name", "type", "keys"], "additionalProperties": false,
                    "properties": {"name": {"type": "string"}, "type": {"type": "string"}, "keys": {"type": "array", "items": {"type": "string"}}}}},
                "values": {"const": "hidden"},
                "omitted": {"type": "integer", "minimum": 0}}))},
            {"description": "events, oldest first (events)",
             "type": "object", "required": ["namespace", "verb", "object", "events", "truncated", "omitted"], "additionalProperties": false,
             "properties": common(json!({
                "events": {"type": "array", "items": {"type": "object",
                    "required": ["last_seen", "type", "reason", "object", "message", "count"], "additionalProperties": false,
                    "properties": {"last_seen": {"type": "string"}, "type": {"type": "string"}, "reason": {"type": "string"},
                        "object": {"type": "string"}, "message": {"type": "string"}, "count": {"type": "integer"}}}},
                "omitted": {"type": "integer", "minimum": 0}}))},
            {"description": "kubectl's text, control characters escaped (describe, logs, rollout_status, rollout_history)",
             "type": "object", "required": ["namespace", "verb", "object", "text", "truncated"], "additionalProperties": false,
             "properties": common(json!({"text": {"type": "string"}}))},
            {"description": "kubectl failed in its sandbox",
             "type": "object", "required": ["namespace", "verb", "object", "exit_code", "ended", "errors"], "additionalProperties": false,
             "properties": {
                "namespace": {"type": "string"}, "verb": {"type": "string"}, "object": {"type": "string"},
                "exit_code": {"type": ["integer", "null"]},
                "ended": super::ended_schema(),
                "errors": {"type": "string", "description": "the last lines kubectl wrote to stderr"}}},
            {"description": "kubectl's answer could not be read (the summary says why)",
             "type": "object", "required": ["namespace", "verb", "object"], "additionalProperties": false,
             "properties": {"namespace": {"type": "string"}, "verb": {"type": "string"}, "object": {"type": "string"}}}
        ]})
    }

    fn run<'a>(
        &'a self,
        p: &'a Pipeline,
        call: &'a mut Call,
        decision: Decision,
    ) -> RunnerFuture<'a> {
        Box::pin(async move {
            let namespace = credential_namespace(p, call, &decision)?;
            let op = ReadOp::from_decision(decision.operation.as_ref(), &namespace)
                .map_err(|e| Stop::refused(format!("{e}; nothing was run")))?;
            let r =
                kubectl_sandbox(p, call, &decision, op.steps(&tools::kubeconfig_inside())).await?;
            let head = json!({"namespace": namespace, "verb": op.verb, "object": op.object()});
            if !r.success() {
                let errors = tools::kubectl::errors(&r.stderr.text(), op.cap());
                let mut result = head;
                result["exit_code"] = json!(r.exit_code);
                result["ended"] = json!(r.ended);
                result["errors"] = json!(errors);
                call.audit_result =
                    Some(json!({"verb": op.verb, "object": op.object(), "failed": true}));
                return Ok(Outcome::Completed {
                    ok: false,
                    summary: format!("kubectl could not read {}: {errors}", op.object()),
                    result,
                });
            }
            Ok(
                match tools::kubectl::read_result(&op, &r.stdout.bytes, r.stdout.truncated) {
                    Ok(read) => {
                        call.audit_result = Some(read.audited);
                        Outcome::Completed {
                            ok: true,
                            summary: read.summary,
                            result: read.result,
                        }
                    }
                    Err(e) => Outcome::Completed {
                        ok: false,
                        summary: format!("kubectl's answer could not be read: {e}"),
                        result: head,
                    },
                },
            )
        })
    }
}
