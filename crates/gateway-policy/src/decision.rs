//! The decision contract (README.md: the policy contract): the one object every policy evaluation
//! must return. Every field must be present; unknown fields are refused (a
//! misspelt field must not silently fall back to a default). An object that
//! does not match is turned into a deny by [`Decision::fail_closed`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::PolicyError;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    pub allow: bool,
    pub deny_reasons: Vec<String>,
    /// What is wrong with the params, as the policy found it (each one is
    /// also among `deny_reasons`).
    pub violations: Vec<Violation>,
    /// The gateway's runner for the tool (the catalog's `runner` key).
    #[serde(deserialize_with = "Option::deserialize")]
    pub runner: Option<String>,
    pub tier: String,
    pub annotations: Annotations,
    /// The credential to mint for this call; `null` when it needs none.
    /// `deserialize_with` makes the field required even though it is nullable.
    #[serde(deserialize_with = "Option::deserialize")]
    pub credential: Option<CredentialScope>,
    pub sandbox: SandboxLimits,
    pub signals: Vec<Signal>,
    pub approval: ApprovalRequirement,
    /// What the tool's runner is to carry out, for a runner that takes it
    /// from the policy (`kubectl_read`: the verb, kind, object and limits).
    /// Optional in the contract: absent or null for every other tool, so a
    /// policy set written before it still matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<serde_json::Value>,
}

/// MCP tool annotations (hints to the client, decided by the policy).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Annotations {
    #[serde(rename = "readOnlyHint")]
    pub read_only_hint: bool,
    #[serde(rename = "destructiveHint")]
    pub destructive_hint: bool,
    #[serde(rename = "idempotentHint")]
    pub idempotent_hint: bool,
    #[serde(rename = "openWorldHint")]
    pub open_world_hint: bool,
}

/// One thing wrong with a call's params (`data.gateway.tools.violations`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Violation {
    /// The param's name; "" for the params as a whole.
    pub param: String,
    /// `missing`, `unknown`, `not_a_string`, `too_long`, `not_an_object`, or
    /// whatever else the policy names.
    pub problem: String,
    pub message: String,
}

/// Which dynamic secret to ask Vault/OpenBao for: `POST {mount}/creds/{role}`
/// with `params`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialScope {
    /// The catalog's credential kind (`pod_reader`, `terraform_apply`, …).
    pub kind: String,
    /// What is issued, which decides how it reaches the sandbox:
    /// `kubernetes` (a token in a kubeconfig for `params.kubernetes_namespace`).
    #[serde(rename = "type")]
    pub credential_type: String,
    pub mount: String,
    pub role: String,
    pub params: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxLimits {
    pub cpu: String,
    pub memory: String,
    pub deadline_seconds: u64,
    /// Cap on the copy of a Terraform module a sandbox works on (bytes).
    pub module_copy_bytes: u64,
    /// Cap on the number of files and dirs in that copy.
    pub module_copy_files: u64,
    /// Cap on each file read back from a sandbox (plan, plan JSON, state).
    pub file_out_bytes: u64,
    /// How long a call waits for another call on the same module.
    pub module_wait_seconds: u64,
    /// Processes and threads the sandbox may have.
    pub max_processes: u64,
    /// Largest file a process in the sandbox may write.
    pub file_bytes: u64,
    /// Cap of the captured stdout, and of stderr.
    pub output_bytes: u64,
    /// Cap of the plan JSON read back and parsed (bounds the memory a plan takes).
    pub plan_json_bytes: u64,
    /// What a sandbox may write in all: the size of its working dir.
    pub disk_bytes: u64,
    pub egress: Vec<String>,
}

/// One destructive (or not understood) change found in a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signal {
    /// Resource address; empty for a signal about the plan as a whole.
    pub address: String,
    pub kind: String,
    pub actions: Vec<String>,
    #[serde(deserialize_with = "Option::deserialize")]
    pub reason: Option<String>,
    pub paths: Vec<Vec<serde_json::Value>>,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRequirement {
    pub required: bool,
    pub approvers: u32,
    pub ttl_seconds: u64,
    pub reason_required: bool,
    /// True when no approval is needed, or the approval presented in the
    /// input (`input.approval`) satisfies the requirement.
    pub satisfied: bool,
}

/// Upper bound for a sandbox deadline: one day.
const MAX_DEADLINE_SECONDS: u64 = 86_400;

impl Decision {
    /// Parse and check a raw policy result against the contract.
    pub fn from_policy_value(value: serde_json::Value) -> Result<Decision, PolicyError> {
        if !value.is_object() {
            return Err(PolicyError::Contract(format!(
                "expected an object, got {}",
                json_kind(&value)
            )));
        }
        let decision: Decision =
            serde_json::from_value(value).map_err(|e| PolicyError::Contract(e.to_string()))?;
        decision.check()?;
        Ok(decision)
    }

    fn check(&self) -> Result<(), PolicyError> {
        let bad = |m: String| Err(PolicyError::Contract(m));
        if self.allow && !self.deny_reasons.is_empty() {
            return bad("allow is true but deny_reasons is not empty".into());
        }
        // Params the policy found wrong never reach a tool, whatever the
        // rest of the policy says (the MCP layer does not check them).
        if self.allow && !self.violations.is_empty() {
            return bad("allow is true but violations is not empty".into());
        }
        if let Some(c) = &self.credential
            && c.credential_type == "kubernetes"
            && c.params
                .get("kubernetes_namespace")
                .is_none_or(String::is_empty)
        {
            return bad(
                "credential.type is kubernetes but credential.params.kubernetes_namespace is missing".into(),
            );
        }
        if self.tier.trim().is_empty() {
            return bad("tier is empty".into());
        }
        if let Some(c) = &self.credential {
            if !valid_vault_path(&c.mount) {
                return bad(format!(
                    "credential.mount {:?} is not a valid Vault mount path",
                    c.mount
                ));
            }
            if c.role.contains('/') || !valid_vault_path(&c.role) {
                return bad(format!(
                    "credential.role {:?} is not a valid Vault role name",
                    c.role
                ));
            }
        }
        if self.sandbox.cpu.trim().is_empty() || self.sandbox.memory.trim().is_empty() {
            return bad("sandbox.cpu and sandbox.memory must not be empty".into());
        }
        if self.sandbox.deadline_seconds == 0
            || self.sandbox.deadline_seconds > MAX_DEADLINE_SECONDS
        {
            return bad(format!(
                "sandbox.deadline_seconds {} is outside 1..={MAX_DEADLINE_SECONDS}",
                self.sandbox.deadline_seconds
            ));
        }
        for (name, v) in [
            ("module_copy_bytes", self.sandbox.module_copy_bytes),
            ("module_copy_files", self.sandbox.module_copy_files),
            ("file_out_bytes", self.sandbox.file_out_bytes),
            ("max_processes", self.sandbox.max_processes),
            ("file_bytes", self.sandbox.file_bytes),
            ("output_bytes", self.sandbox.output_bytes),
            ("plan_json_bytes", self.sandbox.plan_json_bytes),
            ("disk_bytes", self.sandbox.disk_bytes),
        ] {
            if v == 0 {
                return bad(format!("sandbox.{name} must be at least 1"));
            }
        }
        if self.sandbox.module_wait_seconds > MAX_DEADLINE_SECONDS {
            return bad(format!(
                "sandbox.module_wait_seconds {} is over {MAX_DEADLINE_SECONDS}",
                self.sandbox.module_wait_seconds
            ));
        }
        if self.approval.approvers == 0 {
            return bad("approval.approvers must be at least 1".into());
        }
        if self.approval.ttl_seconds == 0 {
            return bad("approval.ttl_seconds must be at least 1".into());
        }
        Ok(())
    }

    /// The decision used whenever the policy could not give a valid one: deny,
    /// with the error as the reason, the most cautious values everywhere else.
    pub fn fail_closed(reason: impl Into<String>) -> Decision {
        Decision {
            allow: false,
            deny_reasons: vec![reason.into()],
            violations: vec![],
            runner: None,
            tier: "high".into(),
            annotations: Annotations {
                read_only_hint: false,
                destructive_hint: true,
                idempotent_hint: false,
                open_world_hint: true,
            },
            credential: None,
            sandbox: SandboxLimits {
                cpu: "100m".into(),
                memory: "64Mi".into(),
                deadline_seconds: 1,
                module_copy_bytes: 1,
                module_copy_files: 1,
                file_out_bytes: 1,
                module_wait_seconds: 0,
                max_processes: 1,
                file_bytes: 1,
                output_bytes: 1,
                plan_json_bytes: 1,
                disk_bytes: 1,
                egress: vec![],
            },
            signals: vec![],
            operation: None,
            approval: ApprovalRequirement {
                required: true,
                approvers: 1,
                ttl_seconds: 1,
                reason_required: true,
                satisfied: false,
            },
        }
    }

    /// The decision with a reason added when the policy denied without one:
    /// a deny must always say why.
    pub fn with_default_reason(mut self) -> Decision {
        if !self.allow && self.deny_reasons.is_empty() {
            self.deny_reasons
                .push("denied by policy (the policy gave no reason)".into());
        }
        self
    }
}

/// A Vault path: one or more `/`-separated segments of `[A-Za-z0-9_.-]`,
/// none of them `.` or `..`.
fn valid_vault_path(path: &str) -> bool {
    !path.is_empty()
        && path.split('/').all(|seg| {
            !seg.is_empty()
                && seg != "."
                && seg != ".."
                && seg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        })
}

pub fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn valid() -> serde_json::Value {
        json!({
            "allow": true, "deny_reasons": [], "violations": [], "runner": null, "tier": "low",
            "annotations": {"readOnlyHint": true, "destructiveHint": false, "idempotentHint": true, "openWorldHint": true},
            "credential": {"kind": "pod_reader", "type": "kubernetes", "mount": "kubernetes", "role": "pod-reader", "params": {"kubernetes_namespace": "demo-app", "ttl": "10m"}},
            "sandbox": {"cpu": "500m", "memory": "512Mi", "deadline_seconds": 120, "module_copy_bytes": 1024, "module_copy_files": 10,
                        "file_out_bytes": 1024, "module_wait_seconds": 5, "max_processes": 64, "file_bytes": 1048576, "output_bytes": 65536, "plan_json_bytes": 1048576, "disk_bytes": 1048576, "egress": ["kube-apiserver"]},
            "signals": [{"address": "a.b", "kind": "delete", "actions": ["delete"], "reason": null, "paths": [], "message": "a.b will be destroyed"}],
            "approval": {"required": false, "approvers": 1, "ttl_seconds": 1800, "reason_required": false, "satisfied": true}
        })
    }

    #[test]
    fn an_allow_with_violations_or_a_kubernetes_credential_without_namespace_is_refused() {
        let v = with(
            valid(),
            "/violations",
            json!([{"param": "x", "problem": "unknown", "message": "unknown param \"x\""}]),
        );
        let err = Decision::from_policy_value(v).expect_err("refused");
        assert!(err.to_string().contains("violations is not empty"), "{err}");
        let v = with(valid(), "/credential/params", json!({"ttl": "10m"}));
        let err = Decision::from_policy_value(v).expect_err("refused");
        assert!(err.to_string().contains("kubernetes_namespace"), "{err}");
    }

    fn with(mut v: serde_json::Value, pointer: &str, new: serde_json::Value) -> serde_json::Value {
        *v.pointer_mut(pointer).expect("pointer exists") = new;
        v
    }

    fn without(mut v: serde_json::Value, key: &str) -> serde_json::Value {
        v.as_object_mut().expect("object").remove(key);
        v
    }

    #[test]
    fn a_valid_decision_parses() {
        let d = Decision::from_policy_value(valid()).expect("valid");
        assert!(d.allow);
        assert_eq!(d.credential.expect("credential").role, "pod-reader");
    }

    #[test]
    fn a_null_credential_is_accepted_but_a_missing_one_is_not() {
        let d = Decision::from_policy_value(with(valid(), "/credential", json!(null)))
            .expect("null ok");
        assert!(d.credential.is_none());
        let err = Decision::from_policy_value(without(valid(), "credential")).unwrap_err();
        assert!(
            err.to_string().contains("missing field `credential`"),
            "{err}"
        );
    }

    #[test]
    fn every_contract_violation_is_an_error_naming_the_problem() {
        let cases = [
            (without(valid(), "signals"), "missing field `signals`"),
            (with(valid(), "/allow", json!("yes")), "invalid type"),
            (
                with(valid(), "/deny_reasons", json!(["x"])),
                "allow is true but deny_reasons",
            ),
            (with(valid(), "/tier", json!(" ")), "tier is empty"),
            (
                with(valid(), "/credential/mount", json!("../sys")),
                "credential.mount",
            ),
            (
                with(valid(), "/credential/role", json!("a/b")),
                "credential.role",
            ),
            (
                with(valid(), "/sandbox/deadline_seconds", json!(0)),
                "deadline_seconds 0",
            ),
            (
                with(valid(), "/sandbox/file_out_bytes", json!(0)),
                "file_out_bytes must be at least 1",
            ),
            (
                with(valid(), "/sandbox/deadline_seconds", json!(-5)),
                "invalid value",
            ),
            (
                with(valid(), "/sandbox/memory", json!("")),
                "sandbox.cpu and sandbox.memory",
            ),
            (
                with(valid(), "/approval/approvers", json!(0)),
                "approvers must be at least 1",
            ),
            (
                with(valid(), "/approval/ttl_seconds", json!(0)),
                "ttl_seconds must be at least 1",
            ),
            (with(valid(), "/signals/0/reason", json!(3)), "invalid type"),
            (
                {
                    let mut v = valid();
                    v["alow"] = json!(true);
                    v
                },
                "unknown field `alow`",
            ),
            (json!([1]), "expected an object, got an array"),
        ];
        for (value, want) in cases {
            let err = Decision::from_policy_value(value.clone())
                .expect_err(&format!("should be refused: {value}"))
                .to_string();
            assert!(err.contains(want), "{err:?} should contain {want:?}");
        }
    }

    #[test]
    fn fail_closed_denies_and_is_itself_a_valid_decision() {
        let d = Decision::fail_closed("broken");
        assert!(!d.allow);
        assert_eq!(d.deny_reasons, vec!["broken".to_string()]);
        assert!(d.credential.is_none());
        let round =
            Decision::from_policy_value(serde_json::to_value(&d).expect("ser")).expect("valid");
        assert_eq!(round, d);
    }

    #[test]
    fn a_deny_without_reason_gets_one() {
        let d = Decision::from_policy_value(with(valid(), "/allow", json!(false)))
            .expect("valid")
            .with_default_reason();
        assert_eq!(d.deny_reasons.len(), 1);
    }
}
