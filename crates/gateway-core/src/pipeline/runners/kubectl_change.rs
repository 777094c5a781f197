//! `kubectl_change` (`k8s_scale`, `k8s_rollout_restart`, `k8s_set_image`,
//! `k8s_rollout_undo`, `k8s_apply`, `k8s_delete`, and any change the
//! catalog adds): a change planned with the API server's own dry run.
//!
//! Without `approval_id`: the live object is read (a sandbox with the
//! call's token), the object to send is worked out from it, and the API
//! server is asked what the write would leave (`dryRun=All`, a second
//! sandbox). The policy decides on both (`input.kubernetes`: live, planned,
//! the attribute changes; signals from `kubernetes_signals.rego`). When a
//! person must approve, the plan is saved and the approval bound to its
//! digest: the exact object to send, which carries the live object's
//! `resourceVersion`. Otherwise the change is applied now.
//!
//! With `approval_id`: the saved plan is decided again with the approval,
//! the approval spent (tool, params and plan digest checked), and exactly
//! that object sent. The `resourceVersion` it carries is the write's
//! precondition: when anyone changed the object after the plan, the API
//! server refuses the write (409 Conflict) and nothing is applied; the
//! approval stays spent (the point of no return was reached), with that
//! outcome recorded, and the agent is told to plan again.

use serde_json::{Value, json};

use super::kubectl::{credential_namespace, kubectl_sandbox};
use super::terraform::refused_approval;
use super::{RunnerFuture, ToolRunner};
use crate::pipeline::{Call, Outcome, Pipeline, SandboxCall, Step, Stop, Toolset, tail};
use crate::tools;
use crate::tools::kubectl_change::{self as change, ChangeOp};
use gateway_base::canonical::sha256_hex;
use gateway_policy::Decision;
use gateway_sandbox::FileIn;

pub struct Change;

/// A plan: what is sent at the apply, and what the policy and the
/// approver saw.
struct Plan {
    /// The saved plan file: `{"send", "creates"}`, whose digest the
    /// approval is bound to.
    file: Vec<u8>,
    digest: String,
    /// `input.kubernetes`.
    input: Value,
}

impl ToolRunner for Change {
    fn name(&self) -> &'static str {
        "kubectl_change"
    }

    fn result_schema(&self) -> Value {
        let head = json!({
            "namespace": {"type": "string"},
            "verb": {"type": "string"},
            "address": {"type": "string", "description": "Kind namespace/name"}
        });
        let with = |extra: Value| {
            let mut p = head.clone();
            if let (Some(p), Some(e)) = (p.as_object_mut(), extra.as_object()) {
                p.extend(e.clone());
            }
            p
        };
        json!({"anyOf": [
            {"description": "applied: the object as the API server answered the write (null when over the cap)",
             "type": "object", "required": ["namespace", "verb", "address", "object", "truncated"], "additionalProperties": false,
             "properties": with(json!({"object": {"type": ["object", "null"]}, "truncated": {"type": "boolean"}}))},
            {"description": "the write or its dry run failed in its sandbox; changed_since_plan is true when the object changed after the plan (nothing was applied: plan again)",
             "type": "object", "required": ["namespace", "verb", "address", "exit_code", "ended", "errors", "changed_since_plan"], "additionalProperties": false,
             "properties": with(json!({
                "exit_code": {"type": ["integer", "null"]},
                "ended": super::ended_schema(),
                "errors": {"type": "string", "description": "the last lines kubectl wrote to stderr"},
                "changed_since_plan": {"type": "boolean"}}))}
        ]})
    }

    fn run<'a>(&'a self, p: &'a Pipeline, call: &'a mut Call, first: Decision) -> RunnerFuture<'a> {
        Box::pin(async move {
            let namespace = credential_namespace(p, call, &first)?;
            let op = ChangeOp::from_decision(first.operation.as_ref(), &namespace)
                .map_err(|e| Stop::refused(format!("{e}; nothing was run")))?;
            let approval_id = call
                .input
                .params
                .get("approval_id")
                .and_then(Value::as_str)
                .map(str::to_string);
            if let Some(id) = &approval_id
                && let Some(outcome) = p.spent_outcome(call, &first, id).await?
            {
                return Ok(outcome);
            }
            match approval_id {
                None => p.k8s_plan(call, &first, &op).await,
                Some(id) => p.k8s_apply_approved(call, &op, &id).await,
            }
        })
    }
}

/// A sandbox of the change's that did not succeed, as a refusal.
fn sandbox_failed(what: &str, r: &gateway_sandbox::SandboxResult) -> Stop {
    Stop::refused(format!(
        "{what} failed ({:?}): {}; nothing was applied",
        r.ended,
        gateway_base::text::escaped(&tail(&r.stderr.text(), 10), false)
    ))
}

impl Pipeline {
    /// kubectl's `steps` with the call's token and `object` as the
    /// request body among the files in.
    async fn k8s_write_sandbox(
        &self,
        call: &Call,
        decision: &Decision,
        suffix: &str,
        steps: Vec<tools::Step>,
        object: &Value,
    ) -> Result<gateway_sandbox::SandboxResult, Stop> {
        self.run_sandbox(
            &call.progress,
            call.request_id(),
            decision,
            SandboxCall {
                suffix,
                tool: Toolset::Kubectl,
                steps,
                workdir: None,
                files_in: vec![FileIn {
                    path: change::OBJECT_FILE.into(),
                    contents: serde_json::to_vec(object).unwrap_or_default(),
                }],
                files_out: vec![],
                with_credential: true,
            },
        )
        .await
    }

    /// The plan: the live object, the object to send, the API server's
    /// dry run of the write.
    async fn k8s_make_plan(
        &self,
        call: &Call,
        decision: &Decision,
        op: &ChangeOp,
    ) -> Result<Plan, Stop> {
        let kubeconfig = tools::kubeconfig_inside();
        call.progress
            .say(format!("reading {} as it is now", op.address()));
        let r = kubectl_sandbox(self, call, decision, op.read_steps(&kubeconfig)).await?;
        let live = change::live_object(op, r.success(), &r.stdout.bytes, &r.stderr.text())
            .map_err(|e| Stop::refused(format!("{e}; nothing was applied")))?;
        let replicasets = if let (true, Some(live)) = (op.verb == "rollout_undo", &live) {
            let steps = op
                .revisions_steps(&kubeconfig, live)
                .map_err(|e| Stop::refused(format!("{e}; nothing was applied")))?;
            let call_rs = SandboxCall {
                suffix: "revisions",
                tool: Toolset::Kubectl,
                steps,
                workdir: None,
                files_in: vec![],
                files_out: vec![],
                with_credential: true,
            };
            let r = self
                .run_sandbox(&call.progress, call.request_id(), decision, call_rs)
                .await?;
            if !r.success() {
                return Err(sandbox_failed("reading the revisions", &r));
            }
            if r.stdout.truncated {
                return Err(Stop::refused(format!(
                    "the ReplicaSets of {} are more than the sandbox's output cap (sandbox.rego output_bytes); nothing was applied",
                    op.address()
                )));
            }
            Some(
                serde_json::from_slice::<Value>(&r.stdout.bytes)
                    .map_err(|e| Stop::refused(format!("the ReplicaSets are not JSON: {e}")))?,
            )
        } else {
            None
        };
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let desired = change::desired(op, live.as_ref(), replicasets.as_ref(), &now)
            .map_err(|e| Stop::refused(format!("{e}; nothing was applied")))?;
        let creates = live.is_none();
        call.progress.say(format!(
            "asking the API server what {} would become (dry run)",
            op.address()
        ));
        let r = self
            .k8s_write_sandbox(
                call,
                decision,
                "dryrun",
                op.write_steps(&kubeconfig, creates, true),
                &change::dry_run_body(op, &desired),
            )
            .await?;
        if !r.success() {
            return Err(sandbox_failed("the API server's dry run", &r));
        }
        let answer = change::planned_object(op, &r.stdout.bytes, live.as_ref())
            .map_err(|e| Stop::refused(format!("{e}; nothing was applied")))?;
        let planned = (op.verb != "delete").then_some(&answer);
        let input = change::plan_input(op, live.as_ref(), planned);
        let send = change::to_send(op, &desired, &answer, live.as_ref());
        let file = serde_json::to_vec(&json!({"send": send, "creates": creates}))
            .map_err(|e| Stop::refused(format!("the plan could not be written: {e}")))?;
        let digest = sha256_hex(&file);
        Ok(Plan {
            file,
            digest,
            input,
        })
    }

    /// A change without an approval: plan; the approval gate, or, when
    /// the policy needs none, the write now.
    async fn k8s_plan(
        &self,
        call: &mut Call,
        first: &Decision,
        op: &ChangeOp,
    ) -> Result<Outcome, Stop> {
        let plan = self.k8s_make_plan(call, first, op).await?;
        call.input.kubernetes = Some(plan.input.clone());
        let decision = self.decide(&call.input, Step::Plan)?;
        let rid = call.request_id().to_string();
        if !decision.approval.required || decision.approval.satisfied {
            call.commitment.commit(None, || ((), true))?;
            let _applying = self.applying(&rid, None);
            return self.k8s_write(call, &decision, op, &plan.file).await;
        }
        let summary = change::plan_summary(op, &plan.input);
        let changes: Vec<Value> = summary
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let mut c = c.clone();
                c.as_object_mut().map(|m| m.remove("diff"));
                c
            })
            .collect();
        let plan_json = serde_json::to_vec(&plan.input).unwrap_or_default();
        self.plans.save(&rid, &plan.file, &plan_json)?;
        self.plans.prune(self.plan_retention());
        self.request_approval(
            call,
            &decision,
            &plan.digest,
            summary,
            Value::Array(changes),
        )
    }

    /// A change with an approval: its saved plan decided again with the
    /// approval, the approval spent, exactly the planned object sent.
    async fn k8s_apply_approved(
        &self,
        call: &mut Call,
        op: &ChangeOp,
        approval_id: &str,
    ) -> Result<Outcome, Stop> {
        let rid = call.request_id().to_string();
        let approval = self.requesters_approval(call, approval_id)?;
        let Ok(file) = self.plans.plan_file(&approval.request_id) else {
            let reason = format!(
                "the plan approval {approval_id} is bound to is missing; plan and ask again"
            );
            self.audit
                .record(&rid, refused_approval(approval_id, Some(&reason), None))?;
            return Err(Stop::refused(reason));
        };
        let digest = sha256_hex(&file);
        if let Some(plan_json) = self.plans.plan_json(&approval.request_id)
            && let Ok(plan) = serde_json::from_slice::<Value>(&plan_json)
        {
            call.input.kubernetes = Some(plan);
        }
        self.spend_and_run(
            call,
            &approval,
            &digest,
            Pipeline::whole,
            async |call, decision| self.k8s_write(call, decision, op, &file).await,
        )
        .await
    }

    /// The write: exactly the plan's object, with the live object's
    /// resourceVersion (or uid and resourceVersion, for a delete) as its
    /// precondition.
    async fn k8s_write(
        &self,
        call: &Call,
        decision: &Decision,
        op: &ChangeOp,
        plan_file: &[u8],
    ) -> Result<Outcome, Stop> {
        let plan: Value = serde_json::from_slice(plan_file)
            .map_err(|e| Stop::refused(format!("the saved plan does not read: {e}")))?;
        let creates = plan["creates"].as_bool().unwrap_or(false);
        call.progress.say(format!("writing {}", op.address()));
        let r = self
            .k8s_write_sandbox(
                call,
                decision,
                "",
                op.write_steps(&tools::kubeconfig_inside(), creates, false),
                &plan["send"],
            )
            .await?;
        let head = json!({"namespace": op.namespace, "verb": op.verb, "address": op.address()});
        if !r.success() {
            let stderr = r.stderr.text();
            let changed = change::changed_since(&stderr);
            let errors = gateway_base::text::escaped(&tail(&stderr, 10), false);
            let mut result = head;
            result["exit_code"] = json!(r.exit_code);
            result["ended"] = json!(r.ended);
            result["errors"] = json!(errors);
            result["changed_since_plan"] = json!(changed);
            let summary = if changed {
                format!(
                    "{} changed since it was planned (its resourceVersion is not the one approved): nothing was applied; plan again",
                    op.address()
                )
            } else {
                format!("the write of {} failed: {errors}", op.address())
            };
            return Ok(Outcome::Completed {
                ok: false,
                summary,
                result,
            });
        }
        let (summary, applied) = change::applied(op, &r.stdout.bytes);
        let mut result = head;
        result["object"] = applied["object"].clone();
        result["truncated"] = applied["truncated"].clone();
        Ok(Outcome::Completed {
            ok: true,
            summary,
            result,
        })
    }
}
