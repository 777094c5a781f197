//! `gateway verify`: prove the sandbox isolation claims on the backend in use.

use std::process::ExitCode;

use super::Cli;
use crate::sandbox::local::{LocalConfig, LocalSandbox};

#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// Print the results as JSON.
    #[arg(long)]
    json: bool,
    /// The backend to verify [default: the configured one].
    #[arg(long, value_parser = ["local", "kubernetes"])]
    backend: Option<String>,
    /// kubernetes: the namespace whose pod-reader credential is checked.
    #[arg(long, default_value = "demo-app")]
    namespace: String,
    /// local: how many times Terraform's init, plan and show run in a sandbox.
    #[arg(long, default_value_t = crate::verify::workload::TERRAFORM_RUNS as u16, value_parser = clap::value_parser!(u16).range(1..=100))]
    terraform_runs: u16,
}

pub fn run(cli: &Cli, a: &VerifyArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let backend = a
        .backend
        .clone()
        .unwrap_or_else(|| cli.file.sandbox.backend.clone());
    let (title, checks) = if backend == "kubernetes" {
        (
            "kubernetes backend (gVisor Jobs)",
            rt.block_on(verify_kubernetes(cli, a))?,
        )
    } else {
        super::dev::ensure_runner()?;
        super::dev::ensure_root("verify")?;
        let sb = LocalSandbox::new(LocalConfig::default())?;
        let repo = std::env::current_dir()?;
        let work = crate::verify::Workload {
            tools: crate::tools::ToolPaths::discover(&repo),
            limits: crate::verify::workload::call_limits(&cli.policies, "terraform_plan"),
            terraform_runs: usize::from(a.terraform_runs),
        };
        (
            "local backend (gVisor runsc)",
            rt.block_on(crate::verify::verify_local(&sb, &cli.home(), &work)),
        )
    };
    let ok = checks.iter().all(|c| c.pass);
    if a.json {
        super::out::print_safe(&format!("{}\n", serde_json::to_string_pretty(&checks)?));
    } else {
        // Details quote what the cluster or the sandbox answered.
        let mut text = format!("gateway verify: {title}\n");
        for c in &checks {
            text.push_str(&format!(
                "{}  {}\n      {}\n",
                if c.pass { "PASS" } else { "FAIL" },
                c.name,
                // One line: a detail quoting the cluster cannot forge a PASS.
                super::out::escaped(&c.detail, true)
            ));
        }
        let passed = checks.iter().filter(|c| c.pass).count();
        text.push_str(&format!(
            "{} passed, {} failed\n",
            passed,
            checks.len() - passed
        ));
        super::out::print_safe(&text);
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn verify_kubernetes(cli: &Cli, a: &VerifyArgs) -> anyhow::Result<Vec<crate::verify::Check>> {
    use crate::sandbox::kubernetes::{KubernetesSandbox, config};
    use crate::verify::kubernetes::verify_kubernetes;
    let cfg = cli.file.sandbox.kubernetes.clone();
    let base = config(&cfg).await?;
    let client = kube::Client::try_from(base.clone())?;
    let sb = KubernetesSandbox::new(client, cfg);
    let port = cli
        .file
        .endpoints
        .get("kube-apiserver")
        .copied()
        .unwrap_or(6443);
    let broker = super::vault::broker(cli, &cli.home())?;
    // The credential check uses exactly what the policy derives.
    let (scope, why_none) = match &broker {
        Some(_) => {
            let store = crate::policy::PolicyStore::open(
                vec![cli.policies.clone()],
                crate::policy::set::LoadOptions::default(),
            );
            let input = crate::policy::DecisionInput::new(
                "k8s_get_pod_status",
                serde_json::json!({"namespace": a.namespace}),
                crate::policy::Principal::new(
                    "gateway-verify",
                    &crate::identity::Caller::this_process(),
                ),
            );
            let d = store.decide(&input).decision;
            match (d.allow, d.credential) {
                (true, Some(c)) => (Some(c), String::new()),
                (true, None) => (
                    None,
                    format!(
                        "the policy derives no credential for k8s_get_pod_status in namespace {}: cannot check",
                        a.namespace
                    ),
                ),
                (false, _) => (
                    None,
                    format!(
                        "the policy denies k8s_get_pod_status in namespace {} ({}); pass --namespace with one it allows",
                        a.namespace,
                        d.deny_reasons.join("; ")
                    ),
                ),
            }
        }
        None => (
            None,
            "no Vault configured ([vault] address or VAULT_ADDR): cannot check".to_string(),
        ),
    };
    let token_check = match (&broker, &scope) {
        (Some(b), Some(s)) => Some((b.as_ref() as &dyn crate::broker::Broker, s)),
        _ => None,
    };
    let mut checks = verify_kubernetes(&sb, &base, port, token_check).await;
    if token_check.is_none() {
        checks.push(crate::verify::Check {
            name: "a minted pod-reader token lists pods in its namespace, not in kube-system nor secrets, and dies on revoke",
            pass: false,
            detail: why_none,
        });
    }
    Ok(checks)
}
