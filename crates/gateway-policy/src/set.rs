//! A loaded, compiled policy set and the evaluation of decisions against it.

use std::num::NonZeroU32;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use regorus::utils::limits::{ExecutionTimerConfig, LimitError};

use super::loader::{FileKind, Sources, data_value};
use super::{DECISION_RULE, Decision, DecisionInput, PolicyError};

/// Default budget for one evaluation. A 5,000-resource plan takes a few
/// milliseconds in release builds; anything near a second is a runaway policy.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(2);

/// How a policy set is loaded.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Time budget of one evaluation; over it, the evaluation is an error.
    pub budget: Duration,
    /// Rule the set must compile for. Compiling also prepares the engine
    /// every evaluation clones (analysis, schedule, rule index): a clone of
    /// an engine never prepared would redo that work on every call.
    pub entrypoint: String,
    /// The daemon's check of the policy dir before every load: a dir that
    /// someone else can write is refused (the last good set stays).
    pub trust: Option<gateway_base::trust::Trust>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            budget: DEFAULT_BUDGET,
            entrypoint: DECISION_RULE.to_string(),
            trust: None,
        }
    }
}

/// A compiled policy set. Built once, shared by every request (each
/// evaluation works on a cheap clone of the prepared engine).
#[derive(Debug)]
pub struct PolicySet {
    engine: regorus::Engine,
    /// SHA-256 over the set's files (see [`Sources::fingerprint`]).
    pub fingerprint: String,
    /// The files the set was built from, as displayed in messages.
    pub files: Vec<String>,
    pub budget: Duration,
    /// For a set loaded from a signed bundle: the key and the revision.
    pub signed: Option<super::bundle::Verified>,
    /// Tool lists made lately, by principal (see [`PolicySet::tool_list`]).
    tool_lists: std::sync::Mutex<std::collections::HashMap<String, (Instant, Arc<ToolList>)>>,
    /// The catalog's tool names (`data.config.tools`, and the locked tools
    /// of the declared upstreams), read once.
    tool_names: std::sync::OnceLock<std::collections::BTreeSet<String>>,
    /// The locked input schemas of the upstreams' tools, compiled once.
    pinned: std::sync::OnceLock<std::collections::BTreeMap<String, Pinned>>,
}

/// A locked input schema, compiled (or why it could not be).
#[derive(Debug)]
enum Pinned {
    Schema(Box<jsonschema::Validator>),
    Unusable(String),
}

/// The tools a principal is shown, by name.
pub type ToolList = serde_json::Map<String, serde_json::Value>;

/// How long a tool list is reused for the same principal. The list only
/// shapes what a client is shown (every call is decided again); a policy
/// that shows tools by the hour is late by at most this much.
pub const TOOL_LIST_REUSE: Duration = Duration::from_secs(2);
/// The most principals whose tool list is kept (a client names itself, so
/// one person can make many principals: the lists expire on every insert).
const TOOL_LISTS_KEPT: usize = 256;

/// The outcome of one decision.
#[derive(Debug, Clone)]
pub struct Evaluation {
    /// The decision to act on: the policy's, or a fail-closed deny.
    pub decision: Decision,
    /// Set when the policy could not give a valid decision (the decision is
    /// then a deny carrying this as its reason).
    pub error: Option<String>,
    pub elapsed: Duration,
    /// Fingerprint of the policy set that decided.
    pub policy: String,
}

impl PolicySet {
    /// Load every policy and data file under `roots` and compile.
    pub fn load(roots: &[PathBuf], opts: &LoadOptions) -> Result<PolicySet, PolicyError> {
        let sources = Sources::read(roots)?;
        if sources.rego_count() == 0 {
            return Err(PolicyError::Empty(
                roots.first().cloned().unwrap_or_default(),
            ));
        }
        PolicySet::from_sources(&sources, opts)
    }

    /// Build from files already read.
    pub fn from_sources(sources: &Sources, opts: &LoadOptions) -> Result<PolicySet, PolicyError> {
        let mut engine = new_engine(opts.budget);
        for f in &sources.files {
            match f.kind {
                FileKind::Rego => {
                    engine
                        .add_policy(f.display.clone(), f.content.clone())
                        .map_err(|e| PolicyError::Parse(e.to_string()))?;
                }
                FileKind::Json | FileKind::Yaml => {
                    engine
                        .add_data(data_value(f)?)
                        .map_err(|e| PolicyError::Data {
                            path: PathBuf::from(&f.display),
                            message: e.to_string(),
                        })?;
                }
            }
        }
        let rule = &opts.entrypoint;
        {
            // Compiling catches what parsing does not (unknown functions,
            // reassigned variables, a missing entrypoint) before the set is
            // ever used.
            // The entrypoint first, then every other rule of the set: only
            // what a rule reaches is compiled, and the gateway evaluates
            // more rules than the decision (tool_list, calls, sessions,
            // approvals), as a policy author's own helpers may be.
            let mut rules = vec![rule.clone()];
            rules.extend(rule_paths(&mut engine).into_iter().filter(|r| r != rule));
            let compiled = catch_unwind(AssertUnwindSafe(|| {
                for r in &rules {
                    let policy = engine
                        .compile_with_entrypoint(&r.as_str().into())
                        .map_err(|e| e.to_string())?;
                    let checked =
                        regorus::languages::rego::compiler::Compiler::compile_from_policy(
                            &policy,
                            &[r.as_str()],
                        )
                        .map_err(|e| e.to_string());
                    match checked {
                        Ok(_) => {}
                        // The bytecode compiler has no `with`; the
                        // interpreter that evaluates decisions does. A rule
                        // beyond the decision that uses it is not checked
                        // here (it was never refused for it before).
                        Err(m) if r != rule && m.contains(WITH_UNSUPPORTED) => {}
                        Err(m) => return Err(m),
                    }
                }
                Ok::<(), String>(())
            }));
            match compiled {
                Ok(Ok(())) => {}
                Ok(Err(message)) => {
                    return Err(PolicyError::Compile {
                        rule: rule.clone(),
                        message,
                    });
                }
                Err(p) => return Err(PolicyError::Panic(panic_message(&p))),
            }
        }
        // The gateway's own module, after the checks (a policy author's
        // tests and coverage never see it); its package is the gateway's.
        if rule_paths(&mut engine)
            .iter()
            .any(|r| r.starts_with(&format!("data.{CALL_PACKAGE}.")))
        {
            return Err(PolicyError::Compile {
                rule: CALL_RULE.into(),
                message: format!(
                    "the package {CALL_PACKAGE} is the gateway's own: rename the policy's package"
                ),
            });
        }
        engine
            .add_policy("(gateway) call.rego".into(), CALL_MODULE.into())
            .map_err(|e| PolicyError::Parse(e.to_string()))?;
        // Prepared once here (analysis, schedule), not again by every
        // evaluation's copy of the engine.
        catch_unwind(AssertUnwindSafe(|| {
            engine
                .compile_with_entrypoint(&CALL_RULE.into())
                .map(|_| ())
        }))
        .map_err(|p| PolicyError::Panic(panic_message(&p)))?
        .map_err(|e| PolicyError::Compile {
            rule: CALL_RULE.into(),
            message: e.to_string(),
        })?;
        Ok(PolicySet {
            engine,
            fingerprint: sources.fingerprint(),
            files: sources.files.iter().map(|f| f.display.clone()).collect(),
            budget: opts.budget,
            signed: sources.signed.clone(),
            tool_lists: Default::default(),
            tool_names: Default::default(),
            pinned: Default::default(),
        })
    }

    /// Evaluate `rule` for `input`: a panic in the engine, an error or a
    /// budget overrun is an error, never a value.
    pub fn eval_rule(
        &self,
        rule: &str,
        input: regorus::Value,
    ) -> Result<serde_json::Value, PolicyError> {
        let started = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| {
            let mut engine = self.engine.clone();
            engine.set_input(input);
            engine.eval_rule(rule.to_string())
        }));
        let value = match result {
            Err(p) => return Err(PolicyError::Panic(panic_message(&p))),
            Ok(Err(e)) => {
                let timed_out = e.chain().any(|c| {
                    matches!(
                        c.downcast_ref::<LimitError>(),
                        Some(LimitError::TimeLimitExceeded { .. })
                    )
                });
                if timed_out || started.elapsed() > self.budget {
                    return Err(PolicyError::Timeout {
                        budget_ms: self.budget.as_millis(),
                        message: e.to_string(),
                    });
                }
                return Err(PolicyError::Eval(e.to_string()));
            }
            Ok(Ok(v)) => v,
        };
        if started.elapsed() > self.budget {
            return Err(PolicyError::Timeout {
                budget_ms: self.budget.as_millis(),
                message: format!("took {} ms", started.elapsed().as_millis()),
            });
        }
        if value == regorus::Value::Undefined {
            return Err(PolicyError::Contract(format!(
                "{rule} is undefined for this input"
            )));
        }
        serde_json::to_value(&value)
            .map_err(|e| PolicyError::Eval(format!("result is not JSON: {e}")))
    }

    /// A data document of the set (e.g. `data.config.vault_roles`), as JSON;
    /// `None` when it is not defined.
    pub fn data(&self, path: &str) -> Result<Option<serde_json::Value>, PolicyError> {
        let mut engine = self.engine.clone();
        let results = engine
            .eval_query(path.to_string(), false)
            .map_err(|e| PolicyError::Eval(e.to_string()))?;
        let Some(value) = results
            .result
            .first()
            .and_then(|r| r.expressions.first())
            .map(|e| e.value.clone())
        else {
            return Ok(None);
        };
        serde_json::to_value(&value)
            .map(Some)
            .map_err(|e| PolicyError::Eval(format!("{path} is not JSON: {e}")))
    }

    /// Whether the catalog (`data.config.tools`) or an upstream's lock
    /// names `tool`: what a metric may label a call with (an agent chooses
    /// the name it sends).
    pub fn knows_tool(&self, tool: &str) -> bool {
        self.tool_names
            .get_or_init(|| {
                let mut names: std::collections::BTreeSet<String> =
                    match self.data("data.config.tools") {
                        Ok(Some(serde_json::Value::Object(m))) => m.keys().cloned().collect(),
                        _ => Default::default(),
                    };
                names.extend(self.pinned().keys().cloned());
                names
            })
            .contains(tool)
    }

    /// The locked tools of the declared upstreams (`u.tool`), each with its
    /// input schema compiled.
    fn pinned(&self) -> &std::collections::BTreeMap<String, Pinned> {
        self.pinned.get_or_init(|| {
            let mut out = std::collections::BTreeMap::new();
            let declared = match self.data("data.config.upstreams") {
                Ok(Some(serde_json::Value::Object(m))) => m,
                _ => return out,
            };
            let lock = self
                .data("data.config.upstream_lock")
                .ok()
                .flatten()
                .unwrap_or_default();
            for u in declared.keys() {
                for (t, entry) in lock[u]["tools"].as_object().into_iter().flatten() {
                    // The exact text the server sent (the policy
                    // engine's copy has `1.0` as `1`).
                    let definition: serde_json::Value = entry["definition_json"]
                        .as_str()
                        .and_then(|t| serde_json::from_str(t).ok())
                        .unwrap_or_default();
                    let schema = definition
                        .get("inputSchema")
                        .cloned()
                        .unwrap_or_else(|| serde_json::json!({"type": "object"}));
                    let pinned = match jsonschema::options().build(&schema) {
                        Ok(v) => Pinned::Schema(Box::new(v)),
                        Err(e) => Pinned::Unusable(e.to_string()),
                    };
                    out.insert(format!("{u}.{t}"), pinned);
                }
            }
            out
        })
    }

    /// For a tool with a locked input schema (an upstream's): what is
    /// wrong with `params` (approval_id aside, the gateway's own) for it,
    /// as `[{param, message}]` for the input's `schema_violations`. `None`
    /// for any other tool.
    pub fn schema_violations(
        &self,
        tool: &str,
        params: &serde_json::Value,
    ) -> Option<serde_json::Value> {
        let pinned = self.pinned().get(tool)?;
        let mut arguments = params.clone();
        if let Some(m) = arguments.as_object_mut() {
            m.remove("approval_id");
        }
        let found: Vec<serde_json::Value> = match pinned {
            Pinned::Unusable(e) => vec![serde_json::json!({"param": "",
                "message": format!("the locked input schema cannot be used: {e}")})],
            Pinned::Schema(v) => v
                .iter_errors(&arguments)
                .take(16)
                .map(|e| {
                    let at = e.instance_path().to_string();
                    let message: String = e.to_string().chars().take(200).collect();
                    serde_json::json!({
                        "param": at.trim_start_matches('/'),
                        "message": format!("{}: {message}", if at.is_empty() { "arguments" } else { at.as_str() }),
                    })
                })
                .collect(),
        };
        Some(serde_json::Value::Array(found))
    }

    /// `data.gateway.tool_list` for a principal: the tools it may see, by
    /// name, as the policy describes them (title, description, tier,
    /// annotations, params).
    /// `upstreams`: what the gateway last read of the upstream MCP
    /// servers' tools (`input.upstreams`; `{}` when none).
    pub fn tool_list(
        &self,
        principal: &super::Principal,
        upstreams: &serde_json::Value,
    ) -> Result<ToolList, PolicyError> {
        let input = serde_json::json!({"principal": principal, "upstreams": upstreams});
        // A session lists its tools and then calls them, each call
        // checking the list again: one evaluation serves them all for
        // [`TOOL_LIST_REUSE`] (this set's own: a reload starts afresh).
        let key = input.to_string();
        let reused = self
            .tool_lists
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .filter(|(at, _)| at.elapsed() < TOOL_LIST_REUSE)
            .map(|(_, l)| Arc::clone(l));
        if let Some(l) = reused {
            return Ok(Arc::unwrap_or_clone(l));
        }
        match self.eval_rule(super::TOOL_LIST_RULE, regorus::Value::from(input))? {
            serde_json::Value::Object(m) => {
                let mut kept = self.tool_lists.lock().unwrap_or_else(|e| e.into_inner());
                kept.retain(|_, (at, _)| at.elapsed() < TOOL_LIST_REUSE);
                if kept.len() < TOOL_LISTS_KEPT {
                    kept.insert(key, (Instant::now(), Arc::new(m.clone())));
                }
                Ok(m)
            }
            other => Err(PolicyError::Contract(format!(
                "{} must be an object of tools by name, got {}",
                super::TOOL_LIST_RULE,
                super::decision::json_kind(&other)
            ))),
        }
    }

    /// A call's admission verdict (`data.gateway.calls.verdict` for
    /// `admission`) and, when it admits the call, the decision for `input`,
    /// in one evaluation ([`CALL_MODULE`]). An error says nothing of which
    /// of the two failed: the caller then asks each alone, as
    /// [`PolicySet::eval_rule`] and [`PolicySet::decide`] do, so that what
    /// a failure refuses and says is the same as asked one by one.
    pub fn admit_and_decide(
        &self,
        admission: &serde_json::Value,
        input: &DecisionInput,
    ) -> Result<(serde_json::Value, Option<Evaluation>), PolicyError> {
        let started = Instant::now();
        let mut both = std::collections::BTreeMap::new();
        both.insert(
            regorus::Value::from("admission"),
            regorus::Value::from(admission.clone()),
        );
        both.insert(regorus::Value::from("decision"), input.to_rego());
        let serde_json::Value::Object(mut answer) =
            self.eval_rule(CALL_RULE, regorus::Value::from(both))?
        else {
            return Err(PolicyError::Contract(format!(
                "{CALL_RULE} is not an object"
            )));
        };
        let verdict = answer
            .remove("admission")
            .ok_or_else(|| PolicyError::Contract(format!("{CALL_RULE} has no admission")))?;
        let evaluation = answer
            .remove("decision")
            .map(|d| self.evaluation(Decision::from_policy_value(d), started));
        Ok((verdict, evaluation))
    }

    /// The decision for `input`. Never fails: anything that keeps the policy
    /// from giving a valid decision yields a deny with the error as reason.
    pub fn decide(&self, input: &DecisionInput) -> Evaluation {
        let started = Instant::now();
        let result = self
            .eval_rule(DECISION_RULE, input.to_rego())
            .and_then(Decision::from_policy_value);
        self.evaluation(result, started)
    }

    fn evaluation(&self, result: Result<Decision, PolicyError>, started: Instant) -> Evaluation {
        let (decision, error) = match result {
            Ok(d) => (d.with_default_reason(), None),
            Err(e) => {
                let msg = e.to_string();
                (Decision::fail_closed(msg.clone()), Some(msg))
            }
        };
        Evaluation {
            decision,
            error,
            elapsed: started.elapsed(),
            policy: self.fingerprint.clone(),
        }
    }
}

/// The package of the gateway's own module.
const CALL_PACKAGE: &str = "gateway_builtin";

/// The rule [`PolicySet::admit_and_decide`] evaluates.
pub const CALL_RULE: &str = "data.gateway_builtin.call.result";

/// Added by the gateway to every policy set (it is not one of the set's
/// files): a call's admission and, only when that admits it, its decision,
/// each rule seeing the input it always had, in one evaluation instead of
/// two. It decides nothing itself.
const CALL_MODULE: &str = r#"package gateway_builtin.call

admission := v if {
	v := data.gateway.calls.verdict with input as input.admission
}

result := {"admission": admission} if {
	admission.admit != true
} else := {"admission": admission, "decision": d} if {
	d := data.gateway.decision with input as input.decision
}
"#;

/// What regorus 0.14.1's bytecode compiler says of `with`.
const WITH_UNSUPPORTED: &str = "the `with` keyword is not supported by the compiler";

/// `data.<package>.<rule>` of every rule with a plain name (not a function,
/// not a test), once each, in the order of the modules.
fn rule_paths(engine: &mut regorus::Engine) -> Vec<String> {
    use regorus::unstable::{Rule, RuleHead};
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for module in engine.get_modules().iter() {
        let package = format!("data.{}", module.package.refr.span().text());
        for rule in &module.policy {
            let Rule::Spec { head, .. } = rule.as_ref() else {
                continue;
            };
            let refr = match head {
                RuleHead::Compr { refr, .. } | RuleHead::Set { refr, .. } => refr,
                RuleHead::Func { .. } => continue,
            };
            let name = refr.span().text();
            if name.starts_with("test_") || name.contains(['.', '[']) {
                continue;
            }
            let full = format!("{package}.{name}");
            if seen.insert(full.clone()) {
                out.push(full);
            }
        }
    }
    out
}

fn new_engine(budget: Duration) -> regorus::Engine {
    let mut engine = regorus::Engine::new();
    // A builtin that errors (a type mismatch in sprintf, count of a number)
    // is an evaluation error, not a silently undefined expression that could
    // keep a deny rule from firing.
    engine.set_strict_builtin_errors(true);
    engine.set_execution_timer_config(ExecutionTimerConfig {
        limit: budget,
        check_interval: NonZeroU32::MIN.saturating_add(63),
    });
    engine
}

pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Principal;
    use serde_json::json;

    fn set_from(files: &[(&str, &str)], opts: &LoadOptions) -> Result<PolicySet, PolicyError> {
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, content) in files {
            let p = dir.path().join(name);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, content).expect("write");
        }
        PolicySet::load(&[dir.path().to_path_buf()], opts)
    }

    fn input() -> DecisionInput {
        DecisionInput::new(
            "t",
            json!({}),
            Principal::os_user("test".into(), "u".into(), 1000, vec![]),
        )
    }

    const ALLOW_ALL: &str = r#"package gateway
decision := {
  "allow": true, "deny_reasons": [], "violations": [], "runner": null, "tier": data.cfg.tier,
  "annotations": {"readOnlyHint": true, "destructiveHint": false, "idempotentHint": true, "openWorldHint": false},
  "credential": null,
  "sandbox": {"cpu": "1", "memory": "1Gi", "deadline_seconds": 10, "module_copy_bytes": 1048576, "module_copy_files": 100, "file_out_bytes": 1048576, "module_wait_seconds": 1, "max_processes": 64, "file_bytes": 1048576, "output_bytes": 65536, "plan_json_bytes": 1048576, "disk_bytes": 1048576, "egress": []},
  "signals": [],
  "approval": {"required": false, "approvers": 1, "ttl_seconds": 60, "reason_required": false, "satisfied": true},
}
"#;

    const ADMIT_SMALL: &str = r#"package gateway.calls
verdict := {"admit": input.params_bytes < 100, "reasons": [], "event_bytes": 65536, "plan_retention_seconds": 60}
"#;

    #[test]
    fn one_evaluation_admits_then_decides_and_hides_no_error() {
        let rego = ALLOW_ALL.replace("data.cfg.tier", "sprintf(\"%s\", [input.params.x[0]])");
        let set = set_from(
            &[("d.rego", &rego), ("calls.rego", ADMIT_SMALL)],
            &LoadOptions::default(),
        )
        .expect("loads");
        let small = json!({"params_bytes": 10});
        let mut good = input();
        good.params = json!({"x": ["high"]});
        let (verdict, ev) = set.admit_and_decide(&small, &good).expect("one evaluation");
        assert_eq!(verdict["admit"], json!(true));
        let ev = ev.expect("admitted, so decided");
        assert_eq!(ev.error, None);
        assert_eq!(ev.decision.tier, "high");
        assert_eq!(
            serde_json::to_value(&ev.decision).expect("json"),
            serde_json::to_value(set.decide(&good).decision).expect("json")
        );
        // Refused at admission: the decision is not evaluated at all.
        let (verdict, ev) = set
            .admit_and_decide(&json!({"params_bytes": 1000}), &good)
            .expect("one evaluation");
        assert_eq!(verdict["admit"], json!(false));
        assert!(ev.is_none());
        // A decision that errors is an error of the whole evaluation (the
        // caller asks each rule alone), never a value.
        let mut hostile = input();
        hostile.params = json!({"x": "not an array"});
        set.admit_and_decide(&small, &hostile)
            .expect_err("the error is not swallowed");
        assert!(set.decide(&hostile).error.is_some());
        // A set without data.gateway.calls cannot be asked both at once.
        let bare = set_from(
            &[("d.rego", ALLOW_ALL), ("cfg/data.yaml", "tier: low\n")],
            &LoadOptions::default(),
        )
        .expect("loads");
        bare.admit_and_decide(&small, &input())
            .expect_err("no admission rule");
    }

    #[test]
    fn the_gateways_own_package_is_refused_in_a_policy() {
        let err = set_from(
            &[
                ("d.rego", ALLOW_ALL),
                ("cfg/data.yaml", "tier: low\n"),
                (
                    "mine.rego",
                    "package gateway_builtin.call\nresult := {\"admission\": {\"admit\": true}}\n",
                ),
            ],
            &LoadOptions::default(),
        )
        .map(|_| ())
        .expect_err("refused");
        assert!(err.to_string().contains("gateway_builtin"), "{err}");
    }

    #[test]
    fn a_valid_set_decides_and_reads_its_data() {
        let set = set_from(
            &[("d.rego", ALLOW_ALL), ("cfg/data.yaml", "tier: medium\n")],
            &LoadOptions::default(),
        )
        .expect("loads");
        let ev = set.decide(&input());
        assert_eq!(ev.error, None);
        assert!(ev.decision.allow);
        assert_eq!(ev.decision.tier, "medium");
    }

    #[test]
    fn the_tool_list_comes_from_the_policy() {
        let repo = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
        let set = PolicySet::load(&[repo.join("policies")], &LoadOptions::default())
            .expect("defaults load");
        let tools = set
            .tool_list(
                &Principal::os_user("c".into(), "u".into(), 1000, vec![]),
                &serde_json::json!({}),
            )
            .expect("tool list");
        let names: Vec<&str> = tools.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            vec![
                "k8s_apply",
                "k8s_delete",
                "k8s_describe",
                "k8s_events",
                "k8s_get",
                "k8s_get_pod_status",
                "k8s_logs",
                "k8s_rollout_history",
                "k8s_rollout_restart",
                "k8s_rollout_status",
                "k8s_rollout_undo",
                "k8s_scale",
                "k8s_set_image",
                "k8s_top",
                "terraform_apply",
                "terraform_plan"
            ]
        );
        assert_eq!(tools["terraform_apply"]["tier"], "high");
        let other = set_from(
            &[("d.rego", &format!("{ALLOW_ALL}\ntool_list := [1]\n"))],
            &LoadOptions::default(),
        )
        .expect("loads");
        let err = other
            .tool_list(
                &Principal::os_user("c".into(), "u".into(), 1000, vec![]),
                &serde_json::json!({}),
            )
            .expect_err("not an object");
        assert!(err.to_string().contains("must be an object"), "{err}");
    }

    #[test]
    fn a_reused_tool_list_is_the_one_made_for_that_principal() {
        let rego = format!(
            "{ALLOW_ALL}\ntool_list := {{\"mine\": {{}}}} if input.principal.user == \"alice\"\n\
             else := {{\"theirs\": {{}}}}\n"
        );
        let set = set_from(&[("d.rego", &rego)], &LoadOptions::default()).expect("loads");
        let alice = Principal::os_user("c".into(), "alice".into(), 1000, vec![]);
        let bob = Principal::os_user("c".into(), "bob".into(), 1001, vec![]);
        for _ in 0..2 {
            let a = set
                .tool_list(&alice, &serde_json::json!({}))
                .expect("alice's list");
            let b = set
                .tool_list(&bob, &serde_json::json!({}))
                .expect("bob's list");
            assert_eq!(a.keys().collect::<Vec<_>>(), ["mine"]);
            assert_eq!(b.keys().collect::<Vec<_>>(), ["theirs"]);
        }
        // Reused for a while, then made again.
        let kept = set
            .tool_lists
            .lock()
            .expect("lock")
            .get(&serde_json::json!({"principal": alice, "upstreams": {}}).to_string())
            .map(|(at, _)| *at)
            .expect("alice's list is kept");
        assert!(kept.elapsed() < TOOL_LIST_REUSE);
    }

    #[test]
    fn syntax_errors_name_file_line_and_column() {
        let err = set_from(
            &[("bad.rego", "package gateway\n\ndecision := {\n")],
            &LoadOptions::default(),
        )
        .expect_err("refused")
        .to_string();
        assert!(err.contains("bad.rego:"), "{err}");
        assert!(err.contains(":4:") || err.contains(":3:"), "{err}");
    }

    #[test]
    fn unknown_functions_are_caught_at_load_not_at_first_use() {
        let rego = "package gateway\ndecision := no_such_function(1)\n";
        let err = set_from(&[("d.rego", rego)], &LoadOptions::default())
            .expect_err("refused")
            .to_string();
        assert!(err.contains("no_such_function"), "{err}");
        assert!(err.contains("d.rego:2:"), "{err}");
    }

    #[test]
    fn an_unknown_function_in_a_rule_the_decision_does_not_reach_is_caught_at_load() {
        // The gateway evaluates more than the decision (tool_list, calls,
        // sessions, approvals): every rule is compiled at load.
        let rego = format!("{ALLOW_ALL}\nhelper := no_such_function(1)\n");
        let err = set_from(
            &[("d.rego", &rego), ("cfg/data.yaml", "tier: low\n")],
            &LoadOptions::default(),
        )
        .expect_err("refused")
        .to_string();
        assert!(err.contains("no_such_function"), "{err}");
        // A helper using `with` (which the bytecode compiler lacks) loads.
        let rego = format!(
            "{ALLOW_ALL}\nmocked := x if {{\n  x := data.cfg.tier with data.cfg.tier as \"high\"\n}}\n"
        );
        let set = set_from(
            &[("d.rego", &rego), ("cfg/data.yaml", "tier: low\n")],
            &LoadOptions::default(),
        )
        .expect("a rule with `with` beyond the decision loads");
        assert_eq!(
            set.eval_rule("data.gateway.mocked", regorus::Value::new_object())
                .expect("evaluates"),
            json!("high")
        );
    }

    #[test]
    fn a_set_without_the_entrypoint_is_refused() {
        let err = set_from(
            &[("d.rego", "package other\nx := 1\n")],
            &LoadOptions::default(),
        )
        .expect_err("refused")
        .to_string();
        assert!(err.contains("data.gateway.decision"), "{err}");
    }

    #[test]
    fn a_decision_that_breaks_the_contract_is_a_deny_with_the_reason() {
        let rego = ALLOW_ALL.replace("\"signals\": [],", "");
        let set = set_from(
            &[("d.rego", &rego), ("cfg/data.yaml", "tier: low\n")],
            &LoadOptions::default(),
        )
        .expect("loads");
        let ev = set.decide(&input());
        assert!(!ev.decision.allow);
        assert!(
            ev.decision.deny_reasons[0].contains("missing field `signals`"),
            "{:?}",
            ev.decision
        );
    }

    #[test]
    fn an_undefined_decision_is_a_deny() {
        let rego = "package gateway\ndecision := 1 if input.tool == \"never\"\n";
        let set = set_from(&[("d.rego", rego)], &LoadOptions::default()).expect("loads");
        let ev = set.decide(&input());
        assert!(!ev.decision.allow);
        assert!(
            ev.decision.deny_reasons[0].contains("undefined"),
            "{:?}",
            ev.decision.deny_reasons
        );
    }

    #[test]
    fn runtime_errors_are_a_deny_not_an_allow() {
        // Strict builtins: a sprintf type error is an error, not undefined.
        let rego = ALLOW_ALL.replace("data.cfg.tier", "sprintf(\"%s\", 1)");
        let set = set_from(&[("d.rego", &rego)], &LoadOptions::default()).expect("loads");
        let ev = set.decide(&input());
        assert!(!ev.decision.allow);
        assert!(ev.error.is_some());
    }

    /// Why decisions are made by regorus's interpreter and not by its
    /// bytecode VM (RVM), although the RVM decides the default policies'
    /// requests several times faster: regorus 0.14.1's RVM treats an error
    /// inside a rule body as that body failing, even with strict builtin
    /// errors on (`rules.rs`: only limit errors are fatal). A deny rule
    /// whose `sprintf` or `count` errors on hostile input then silently
    /// does not fire, and the decision is allow. The interpreter stops the
    /// whole evaluation, so the call is denied. When this test fails,
    /// regorus has changed that and the RVM can be reconsidered.
    #[test]
    fn the_bytecode_vm_lets_an_erroring_deny_rule_allow_so_decisions_use_the_interpreter() {
        let rego = ALLOW_ALL.replace(
            "\"allow\": true, \"deny_reasons\": []",
            "\"allow\": count(deny) == 0, \"deny_reasons\": deny",
        ) + "\ndeny contains msg if {\n  input.params.x\n  msg := sprintf(\"%s\", input.params.x)\n}\n";
        let set = set_from(
            &[("d.rego", &rego), ("cfg/data.yaml", "tier: low\n")],
            &LoadOptions::default(),
        )
        .expect("loads");
        let mut hostile = input();
        hostile.params = json!({"x": "not an array"});
        let ev = set.decide(&hostile);
        assert!(!ev.decision.allow, "{:?}", ev.decision);
        assert!(
            ev.error.as_deref().is_some_and(|e| e.contains("sprintf")),
            "{:?}",
            ev.error
        );

        let mut engine = set.engine.clone();
        let policy = engine
            .compile_with_entrypoint(&DECISION_RULE.into())
            .expect("compiles");
        let program = regorus::languages::rego::compiler::Compiler::compile_from_policy(
            &policy,
            &[DECISION_RULE],
        )
        .expect("RVM program");
        let mut vm = regorus::rvm::RegoVM::new();
        vm.set_strict_builtin_errors(true);
        vm.load_program(program);
        vm.set_data(engine.get_data()).expect("data");
        vm.set_input(hostile.to_rego());
        let rvm = vm
            .execute_entry_point_by_name(DECISION_RULE)
            .expect("the RVM evaluates without an error");
        assert_eq!(
            rvm["allow"],
            regorus::Value::from(true),
            "the RVM now fails closed: reconsider it for decisions"
        );
    }

    #[test]
    fn an_evaluation_over_its_budget_is_a_deny() {
        let rego = ALLOW_ALL.replace(
            "data.cfg.tier",
            "sprintf(\"%d\", [count([1 | some x in numbers.range(1, 5000); some y in numbers.range(1, 5000)])])",
        );
        let opts = LoadOptions {
            budget: Duration::from_millis(50),
            ..LoadOptions::default()
        };
        let set = set_from(&[("d.rego", &rego)], &opts).expect("loads");
        let started = Instant::now();
        let ev = set.decide(&input());
        assert!(!ev.decision.allow);
        assert!(
            ev.decision.deny_reasons[0].contains("time budget of 50 ms"),
            "{:?}",
            ev.decision.deny_reasons
        );
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the budget stopped the evaluation"
        );
    }
}
