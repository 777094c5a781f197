//! The tools' runners: what each tool does once the policy has allowed the
//! request. The catalog names a tool's runner (`runner:` in
//! `config/tools/data.yaml`, `runner` in the decision); a new tool is a
//! runner here plus catalog lines, and the pipeline matches no tool name.

mod gate;
mod kubectl;
mod kubectl_change;
mod terraform;
mod upstream;

use std::future::Future;
use std::pin::Pin;

use serde_json::{Value, json};

use super::{Call, Outcome, Pipeline, Stop};
use gateway_policy::Decision;

/// What a runner's `run` returns.
pub type RunnerFuture<'a> = Pin<Box<dyn Future<Output = Result<Outcome, Stop>> + Send + 'a>>;

/// One tool's part of the pipeline, after the request's decision allowed
/// it: its own stages (plan, approval gate, credential, sandbox) and its
/// result. Stopping early is a [`Stop`].
pub trait ToolRunner: Send + Sync {
    /// The name the catalog's `runner:` key uses.
    fn name(&self) -> &'static str;

    fn run<'a>(
        &'a self,
        pipeline: &'a Pipeline,
        call: &'a mut Call,
        decision: Decision,
    ) -> RunnerFuture<'a>;

    /// The JSON Schema of the `result` of a completed call (every shape
    /// `run` can return, failures included): tools/list shows it in the
    /// tool's output schema, and clients validate what they get against it.
    fn result_schema(&self) -> Value;
}

/// The runner named `name`, if this gateway has it.
pub fn by_name(name: &str) -> Option<&'static dyn ToolRunner> {
    RUNNERS.iter().copied().find(|r| r.name() == name)
}

/// How a sandbox ended ([`gateway_sandbox::Ended`] as serialized).
pub fn ended_schema() -> Value {
    json!({"type": "object", "required": ["reason"], "additionalProperties": false,
           "properties": {
               "reason": {"type": "string", "enum": ["exited", "deadline", "limit", "signal"]},
               "detail": {"type": ["string", "integer"]}}})
}

/// A plan's resource changes ([`gateway_audit::approvals::plan_summary`]).
pub fn changes_schema() -> Value {
    json!({"type": "array", "items": {"type": "object", "required": ["address", "actions", "reason", "paths"],
        "additionalProperties": false,
        "properties": {
            "address": {"type": ["string", "null"], "description": "the resource's address"},
            "actions": {"type": ["array", "null"], "items": {"type": "string"}, "description": "Terraform's actions: create, update, delete, read, no-op"},
            "reason": {"type": ["string", "null"], "description": "Terraform's action_reason"},
            "paths": {"type": ["array", "null"], "description": "the attribute paths that force a replacement"}}}})
}

/// The decision's signals ([`gateway_policy::Signal`]).
pub fn signals_schema() -> Value {
    json!({"type": "array", "items": {"type": "object", "required": ["address", "kind", "actions", "reason", "paths", "message"],
        "additionalProperties": false,
        "properties": {
            "address": {"type": "string"},
            "kind": {"type": "string", "description": "what the policy flags: replace, delete, …"},
            "actions": {"type": "array", "items": {"type": "string"}},
            "reason": {"type": ["string", "null"]},
            "paths": {"type": "array", "items": {"type": "array"}},
            "message": {"type": "string", "description": "what a person should know before approving"}}}})
}

/// Every runner this gateway has.
pub static RUNNERS: &[&dyn ToolRunner] = &[
    &kubectl::GetPods,
    &kubectl::Read,
    &kubectl_change::Change,
    &terraform::Plan,
    &terraform::Apply,
    &upstream::Upstream,
];

/// The runner the decision names; a tool without one (or one this gateway
/// does not have) is refused before anything is run.
pub fn for_decision(decision: &Decision) -> Result<&'static dyn ToolRunner, Stop> {
    let Some(name) = decision.runner.as_deref() else {
        return Err(Stop::refused(
            "the tool catalog names no runner for this tool; nothing was run",
        ));
    };
    by_name(name).ok_or_else(|| {
            Stop::refused(format!(
                "the tool catalog names runner {name:?}, which this gateway does not have; nothing was run"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runner_names_are_unique() {
        let mut names: Vec<_> = RUNNERS.iter().map(|r| r.name()).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n);
    }

    #[test]
    fn a_decision_without_a_known_runner_is_refused() {
        let mut d = Decision::fail_closed("x");
        assert!(matches!(for_decision(&d), Err(Stop::Refused(_))));
        d.runner = Some("rm_rf".into());
        let Err(Stop::Refused(r)) = for_decision(&d) else {
            panic!("an unknown runner was accepted");
        };
        assert!(r.reason.contains("\"rm_rf\""), "{}", r.reason);
        d.runner = Some("terraform_apply".into());
        assert_eq!(
            for_decision(&d).ok().map(|r| r.name()),
            Some("terraform_apply")
        );
    }
}
