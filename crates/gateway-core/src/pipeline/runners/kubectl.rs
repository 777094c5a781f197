//! `kubectl_get_pods` (tool `k8s_get_pod_status`): `kubectl get pods` in the
//! namespace the decision's credential is scoped to (never the agent's
//! string), with the minted token, in a sandbox that reaches only the API
//! server.

use serde_json::{Value, json};

use super::{RunnerFuture, ToolRunner};
use crate::pipeline::{Call, Outcome, Pipeline, SandboxCall, Stop, Toolset, tail};
use crate::tools;
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
            let namespace = decision
                .credential
                .as_ref()
                .and_then(|c| c.params.get("kubernetes_namespace"))
                .cloned()
                .ok_or_else(|| {
                    Stop::refused(
                        "the decision names no credential scoped to a namespace; nothing was run",
                    )
                })?;
            if p.broker.is_none() {
                return Err(Stop::refused(format!(
                    "{} needs a credential and no credential broker is configured; nothing was run",
                    call.input.tool
                )));
            }
            let r = p
                .run_sandbox(
                    &call.progress,
                    call.request_id(),
                    &decision,
                    SandboxCall {
                        suffix: "",
                        tool: Toolset::Kubectl,
                        steps: tools::kubectl_get_pods_steps(
                            &namespace,
                            &tools::kubeconfig_inside(),
                        ),
                        workdir: None,
                        files_in: vec![],
                        files_out: vec![],
                        with_credential: true,
                    },
                )
                .await?;
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
