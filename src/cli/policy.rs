//! `gateway policy eval|test|check`: the policy author's tools.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Subcommand, ValueEnum};

use super::Cli;
use crate::policy::set::LoadOptions;
use crate::policy::{DecisionInput, PlanInput, PolicySet, Principal, plan, testing};

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Print the decision the server would get for a call, as JSON.
    Eval(EvalArgs),
    /// Run the Rego unit tests (every `test_*` rule), like `opa test`.
    Test(TestArgs),
    /// Load and compile the policy set only (for editors and CI).
    Check(CheckArgs),
}

#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// Tool name (overrides `tool` from --input).
    #[arg(long)]
    tool: Option<String>,
    /// Tool params as a JSON object (overrides `params` from --input).
    #[arg(long)]
    params: Option<String>,
    /// A plan: the output of `terraform show -json PLANFILE`.
    #[arg(long)]
    plan: Option<PathBuf>,
    /// The saved plan file itself (`terraform plan -out=FILE`): the
    /// configuration it carries becomes `plan_config_files`, as the server
    /// reads it.
    #[arg(long)]
    plan_file: Option<PathBuf>,
    /// A full or partial input document (JSON); missing fields are filled in
    /// as the server would fill them.
    #[arg(long)]
    input: Option<PathBuf>,
    /// The approval presented with the call, as JSON ({"id", "status", "requested_by",
    /// "approvers", "identities": [{"name", "kind", "os_user", ...}]}).
    #[arg(long)]
    approval: Option<String>,
    /// principal.client
    #[arg(long, default_value = "cli")]
    client: String,
    /// Print the tools/list document for the principal (`data.gateway.tool_list`) instead of a decision.
    #[arg(long)]
    tool_list: bool,
    /// Print the input document too: {"input": …, "decision": …}.
    #[arg(long)]
    show_input: bool,
    /// Evaluation time budget in milliseconds.
    #[arg(long, env = "GATEWAY_POLICY_BUDGET_MS", default_value_t = 2000)]
    budget_ms: u64,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct TestArgs {
    /// Policy and test dirs or files [default: the --policies dir and ./policy-tests].
    paths: Vec<PathBuf>,
    /// Run only the tests whose full name (data.pkg.test_x) matches this regex.
    #[arg(long)]
    run: Option<String>,
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// Report which lines of the policy files the tests hit.
    #[arg(long)]
    coverage: bool,
    /// With --coverage: fail when total coverage is below this percentage.
    #[arg(long)]
    threshold: Option<f64>,
    /// Show prints and details of passing tests too.
    #[arg(short, long)]
    verbose: bool,
}

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Policy dirs or files [default: the --policies dir].
    paths: Vec<PathBuf>,
}

pub fn run(cli: &Cli, cmd: &PolicyCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        PolicyCommand::Eval(a) => eval(cli, a),
        PolicyCommand::Test(a) => test(cli, a),
        PolicyCommand::Check(a) => check(cli, a),
    }
}

fn eval(cli: &Cli, a: &EvalArgs) -> anyhow::Result<ExitCode> {
    let base: serde_json::Value = match &a.input {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read input {}", p.display()))?;
            serde_json::from_str(&text)
                .with_context(|| format!("input {} is not valid JSON", p.display()))?
        }
        None => serde_json::json!({}),
    };
    let Some(base) = base.as_object() else {
        bail!("the --input document must be a JSON object")
    };
    if a.tool_list {
        let principal = Principal::new(a.client.clone(), &crate::identity::Caller::this_process());
        let set = PolicySet::load(std::slice::from_ref(&cli.policies), &LoadOptions::default())?;
        let list = set.tool_list(&principal)?;
        super::out::print_safe(&format!("{}\n", serde_json::to_string_pretty(&list)?));
        return Ok(ExitCode::SUCCESS);
    }
    let tool = match (&a.tool, base.get("tool")) {
        (Some(t), _) => t.clone(),
        (None, Some(serde_json::Value::String(t))) => t.clone(),
        (None, Some(_)) => bail!("`tool` in the --input document must be a string"),
        (None, None) => bail!("no tool: pass --tool NAME or an --input document with `tool`"),
    };
    let params = match &a.params {
        Some(p) => serde_json::from_str(p).context("--params is not valid JSON")?,
        None => base
            .get("params")
            .cloned()
            .unwrap_or_else(|| serde_json::json!({})),
    };
    if !params.is_object() {
        bail!("params must be a JSON object, e.g. --params '{{\"namespace\": \"demo-app\"}}'");
    }
    // What the --input document does not say about the principal is this
    // process's user (never a made-up uid).
    let mut principal = serde_json::to_value(Principal::new(
        a.client.clone(),
        &crate::identity::Caller::this_process(),
    ))?;
    if let Some(p) = base.get("principal") {
        let Some(given) = p.as_object() else {
            bail!(
                "`principal` in --input must be an object {{\"client\", \"os_user\", \"uid\", \"groups\"}}"
            );
        };
        for (k, v) in given {
            principal[k] = v.clone();
        }
    }
    let principal: Principal = serde_json::from_value(principal).context(
        "`principal` in --input must be {\"client\": string, \"os_user\": string, \"uid\": number, \"groups\": [string]}",
    )?;
    let mut input = DecisionInput::new(tool, params, principal);
    if let Some(serde_json::Value::String(id)) = base.get("request_id") {
        input.request_id = id.clone();
    }
    if let Some(serde_json::Value::String(now)) = base.get("now") {
        input.now = now.clone();
    }
    if let Some(p) = &a.plan {
        let bytes = plan::read_bytes(p)?;
        input.plan = Some(PlanInput::from_bytes(&bytes, &p.display().to_string())?);
    } else if let Some(p) = base.get("plan") {
        let bytes = serde_json::to_vec(p)?;
        input.plan = Some(PlanInput::new(plan::parse_plan(
            &bytes,
            "the --input document's plan",
        )?));
    }
    if let Some(p) = &a.plan_file {
        let bin =
            std::fs::read(p).with_context(|| format!("cannot read plan file {}", p.display()))?;
        let files = crate::tools::plan_config_files(&bin, 64 << 20, &[])
            .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
        input.plan_config_files = Some(serde_json::to_value(files)?);
    } else if let Some(f) = base.get("plan_config_files") {
        input.plan_config_files = Some(f.clone());
    }
    input.approval = match &a.approval {
        Some(s) => Some(serde_json::from_str(s).context("--approval is not valid JSON")?),
        None => base.get("approval").cloned(),
    };

    let opts = LoadOptions {
        budget: Duration::from_millis(a.budget_ms),
        ..LoadOptions::default()
    };
    // A policy set that does not load still yields a decision: a deny with
    // the load error, exactly what the server would do.
    let evaluation = match PolicySet::load(std::slice::from_ref(&cli.policies), &opts) {
        Ok(set) => set.decide(&input),
        Err(e) => {
            let msg = format!("no usable policy set: {e}");
            crate::policy::Evaluation {
                decision: crate::policy::Decision::fail_closed(msg.clone()),
                error: Some(msg),
                elapsed: Duration::ZERO,
                policy: String::new(),
            }
        }
    };
    if let Some(e) = &evaluation.error {
        super::out::eprint_safe(&format!("gateway: policy failed closed: {e}\n"));
    }
    let out = if a.show_input {
        serde_json::json!({"input": input.to_json(), "decision": evaluation.decision})
    } else {
        serde_json::to_value(&evaluation.decision)?
    };
    // The input may hold a module's plan: printed terminal-safe.
    super::out::print_safe(&format!("{}\n", serde_json::to_string_pretty(&out)?));
    Ok(ExitCode::SUCCESS)
}

fn test(cli: &Cli, a: &TestArgs) -> anyhow::Result<ExitCode> {
    let paths = if a.paths.is_empty() {
        let mut p = vec![cli.policies.clone()];
        let tests = PathBuf::from("policy-tests");
        if tests.is_dir() {
            p.push(tests);
        }
        p
    } else {
        a.paths.clone()
    };
    let filter = a
        .run
        .as_deref()
        .map(regex::Regex::new)
        .transpose()
        .context("--run is not a valid regular expression")?;
    let opts = testing::RunOptions {
        filter,
        coverage: a.coverage || a.threshold.is_some(),
        budget: Some(Duration::from_secs(10)),
    };
    let report = testing::run(&paths, &opts)?;
    match a.format {
        Format::Text => super::out::print_safe(&testing::render_text(&report, a.verbose)),
        Format::Json => {
            super::out::print_safe(&format!("{}\n", serde_json::to_string_pretty(&report)?))
        }
    }
    let mut ok = report.success();
    if let (Some(threshold), Some(c)) = (a.threshold, &report.coverage)
        && c.percent + 1e-9 < threshold
    {
        eprintln!(
            "gateway: coverage {:.1}% is below the threshold {threshold}%",
            c.percent
        );
        ok = false;
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn check(cli: &Cli, a: &CheckArgs) -> anyhow::Result<ExitCode> {
    let paths = if a.paths.is_empty() {
        vec![cli.policies.clone()]
    } else {
        a.paths.clone()
    };
    match PolicySet::load(&paths, &LoadOptions::default()) {
        Ok(set) => {
            println!(
                "ok: {} files compile for {} (fingerprint {})",
                set.files.len(),
                crate::policy::DECISION_RULE,
                &set.fingerprint[..16]
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            super::out::eprint_safe(&format!("gateway: policy check failed: {e}\n"));
            Ok(ExitCode::FAILURE)
        }
    }
}
