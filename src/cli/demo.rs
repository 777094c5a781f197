//! `gateway demo`: the forces-replacement scenario, end to end, on the local
//! backend with real Terraform, through the same pipeline the server uses.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::Cli;
use crate::pipeline::{Outcome, Pipeline, ToolCall};
use crate::policy::set::LoadOptions;
use crate::policy::{PolicyStore, Principal};
use crate::sandbox::local::{LocalConfig, LocalSandbox};
use crate::tools::ToolPaths;

const MODULE: &str = "terraform/offline-demo";
const LABEL_LINE: &str = "  labels = \"app=web\"";
const EDITED_LINE: &str = "  labels = \"app=web,tier=frontend\"";

fn say(step: &str, text: &str) {
    super::out::print_safe(&format!("\n== {step}\n{text}\n"));
}

fn show(r: &crate::pipeline::CallResult) -> String {
    match &r.outcome {
        Outcome::Denied { reasons, .. } => {
            format!("DENIED ({}): {}", r.request_id, reasons.join("; "))
        }
        Outcome::Refused { reason } => format!("REFUSED ({}): {reason}", r.request_id),
        Outcome::PendingApproval {
            approval_id,
            signals,
            approve_command,
            ..
        } => {
            let sigs: Vec<String> = signals
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|s| format!("  !! {}", s["message"].as_str().unwrap_or("?")))
                        .collect()
                })
                .unwrap_or_default();
            format!(
                "PENDING APPROVAL ({}): approval id {approval_id}\n{}\nan operator runs: {approve_command}",
                r.request_id,
                sigs.join("\n")
            )
        }
        Outcome::Completed { ok, summary, .. } => {
            format!(
                "{} ({}): {summary}",
                if *ok { "OK" } else { "FAILED" },
                r.request_id
            )
        }
    }
}

pub fn run(cli: &Cli) -> anyhow::Result<ExitCode> {
    super::dev::ensure_runner()?;
    super::dev::ensure_root("demo")?;
    scenario(cli).map_err(|e| {
        anyhow::anyhow!(
            "{e:#}\n\nThe demo stopped there. Next: `gateway doctor` checks this host (runsc and which \
             platforms start a sandbox, cgroups, Terraform and kubectl, each with its fix), and \
             `gateway verify` runs Terraform in the sandbox five times as a call does."
        )
    })
}

fn scenario(cli: &Cli) -> anyhow::Result<ExitCode> {
    let repo = std::env::current_dir().context("current dir")?;
    let home = cli.home().join("demo");
    let workspace = home.join("workspace");
    let module = workspace.join(MODULE);
    if workspace.exists() {
        std::fs::remove_dir_all(&workspace).context("clearing the previous demo workspace")?;
    }
    std::fs::create_dir_all(&module)?;
    for entry in std::fs::read_dir(repo.join(MODULE))
        .with_context(|| format!("{MODULE} not found: run from the repository root"))?
    {
        let entry = entry?;
        if entry.path().is_file() && entry.path().extension().is_some_and(|e| e == "tf") {
            std::fs::copy(entry.path(), module.join(entry.file_name()))?;
        }
    }
    let policies = demo_policies(cli)?;
    let policy = Arc::new(PolicyStore::open(
        vec![policies.clone()],
        LoadOptions::default(),
    ));
    if let Err(e) = policy.current() {
        bail!("the policy set does not load: {e}");
    }
    let sandbox = Arc::new(LocalSandbox::new(LocalConfig::default())?);
    let tools = ToolPaths::discover(&repo);
    let pipeline = Arc::new(Pipeline::new(
        policy,
        home.clone(),
        workspace.clone(),
        sandbox,
        tools,
    )?);
    let agent = Principal::new("gateway-demo", &crate::identity::Caller::this_process());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let call = |tool: &str, params: Value| {
        rt.block_on(pipeline.call(ToolCall {
            trace: None,
            tool: tool.into(),
            params,
            principal: agent.clone(),
            workspace: None,
        }))
    };
    println!(
        "gateway demo: the forces-replacement scenario on the local backend (gVisor + Terraform)"
    );
    println!(
        "workspace: {}   home: {}",
        workspace.display(),
        home.display()
    );

    // Setup: the demo's resources must exist before a replacement can be planned.
    let seed = call("terraform_apply", json!({"working_dir": MODULE}))?;
    let Outcome::PendingApproval { approval_id, .. } = &seed.outcome else {
        bail!(
            "seeding the demo expected a pending approval: {}",
            show(&seed)
        );
    };
    approve(cli, approval_id, "demo setup: create the initial resources")?;
    let seeded = call(
        "terraform_apply",
        json!({"working_dir": MODULE, "approval_id": approval_id}),
    )?;
    say(
        "0. setup: create the demo resources (approved by the demo operator)",
        &show(&seeded),
    );
    ensure(
        matches!(seeded.outcome, Outcome::Completed { ok: true, .. }),
        "setup apply",
    )?;

    let plan = call("terraform_plan", json!({"working_dir": MODULE}))?;
    say(
        "1. agent: terraform_plan (low risk: runs at once)",
        &show(&plan),
    );
    ensure(
        matches!(plan.outcome, Outcome::Completed { ok: true, .. }),
        "plan",
    )?;

    let main_tf = module.join("main.tf");
    let text = std::fs::read_to_string(&main_tf)?;
    if !text.contains(LABEL_LINE) {
        bail!(
            "{} no longer has the line {LABEL_LINE:?} the demo edits",
            main_tf.display()
        );
    }
    std::fs::write(&main_tf, text.replacen(LABEL_LINE, EDITED_LINE, 1))?;
    say(
        "2. edit one line",
        &format!(
            "{}:\n  - {LABEL_LINE}\n  + {EDITED_LINE}",
            main_tf.display()
        ),
    );

    let gated = call("terraform_apply", json!({"working_dir": MODULE}))?;
    say(
        "3. agent: terraform_apply without approval (the gate stops it; nothing is applied)",
        &show(&gated),
    );
    let Outcome::PendingApproval {
        approval_id,
        signals,
        ..
    } = &gated.outcome
    else {
        bail!("expected the gate to stop the apply: {}", show(&gated));
    };
    ensure(
        signals
            .as_array()
            .is_some_and(|s| s.iter().any(|x| x["kind"] == "replace")),
        "a replace signal",
    )?;

    let out = approve(cli, approval_id, "replacement of web is expected")?;
    say("4. operator, in a separate process: gateway approve", &out);

    let applied = call(
        "terraform_apply",
        json!({"working_dir": MODULE, "approval_id": approval_id}),
    )?;
    say(
        "5. agent: terraform_apply with the approval (applies exactly the reviewed plan)",
        &show(&applied),
    );
    ensure(
        matches!(applied.outcome, Outcome::Completed { ok: true, .. }),
        "approved apply",
    )?;

    let reuse = call(
        "terraform_apply",
        json!({"working_dir": MODULE, "approval_id": approval_id}),
    )?;
    say(
        "6. agent: the same call with the same approval again (single use: nothing is applied again; the first apply's outcome is returned)",
        &show(&reuse),
    );
    ensure(
        matches!(&reuse.outcome, Outcome::Completed { summary, .. } if summary.contains("was spent by request")),
        "reuse answered with the spent apply's outcome",
    )?;

    let verify = crate::audit::verify::verify_file(
        pipeline.audit.path(),
        &[],
        crate::audit::verify::HeadRule::Required,
    )?;
    say(
        "7. audit trail",
        &format!(
            "{}\n{} events, chain {}; read it with: gateway --home {} audit --request-id {}",
            pipeline.audit.path().display(),
            verify.verified,
            if verify.ok() { "verified" } else { "BROKEN" },
            home.display(),
            gated.request_id
        ),
    );
    ensure(verify.ok(), "audit chain")?;
    println!("\ndemo complete");
    Ok(ExitCode::SUCCESS)
}

fn ensure(ok: bool, what: &str) -> anyhow::Result<()> {
    if ok {
        Ok(())
    } else {
        bail!("demo step failed: {what} (its result is printed above)")
    }
}

/// Approve from a separate `gateway approve` process, as an operator would.
fn approve(cli: &Cli, id: &str, reason: &str) -> anyhow::Result<String> {
    let exe = std::env::current_exe()?;
    let out = std::process::Command::new(exe)
        .arg("--policies")
        .arg(cli.home().join("demo").join("policies"))
        .arg("--home")
        .arg(cli.home().join("demo"))
        .args(["approve", id, "--reason", reason, "--key"])
        .arg(operator_key(cli))
        .output()?;
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("gateway approve failed: {text}");
    }
    Ok(format!(
        "$ gateway approve {id} --reason {reason:?} --key demo/operator_key\n{}",
        text.trim()
    ))
}

/// The demo operator's SSH key (made once, without a passphrase: it is the
/// demo's, in its own state dir).
fn operator_key(cli: &Cli) -> std::path::PathBuf {
    cli.home().join("demo").join("operator_key")
}

/// The demo's own copy of the policies, whose allowed signers hold the
/// demo operator's key (made here if needed).
fn demo_policies(cli: &Cli) -> anyhow::Result<std::path::PathBuf> {
    let key = operator_key(cli);
    if !key.exists() {
        if let Some(d) = key.parent() {
            std::fs::create_dir_all(d)?;
        }
        let st = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "demo-operator", "-f"])
            .arg(&key)
            .status()
            .context("running ssh-keygen to make the demo operator's key")?;
        ensure(st.success(), "ssh-keygen made the demo operator's key")?;
    }
    let to = cli.home().join("demo").join("policies");
    if to.exists() {
        std::fs::remove_dir_all(&to)?;
    }
    super::install::copy_tree(&cli.policies, &to)?;
    let line = super::install::signer_line(&format!(
        "demo-operator={}",
        key.with_extension("pub").display()
    ))?;
    std::fs::write(
        to.join("config/approvers/data.yaml"),
        super::install::approvers_yaml(&[line]),
    )?;
    Ok(to)
}
