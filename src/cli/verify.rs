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
    /// kubernetes: the namespace whose credentials are checked.
    #[arg(long, default_value = "demo-app")]
    namespace: String,
    /// kubernetes: the service account Vault/OpenBao's Kubernetes secrets
    /// engine runs as (the drift check compares its bindings).
    #[arg(long, value_name = "NAMESPACE/NAME", default_value = "vault/openbao")]
    engine_service_account: String,
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
    let sb = KubernetesSandbox::new(client.clone(), cfg);
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
    // 7. The toolbox's read and the dry run of a change, with the
    // credentials the policy derives for them.
    crate::verify::kubernetes::step(
        7,
        "a toolbox read and a change's dry run, with their own credentials",
    );
    let name = format!("gateway-verify-{}", std::process::id());
    let read = credential_for(
        cli,
        "k8s_get",
        serde_json::json!({"namespace": a.namespace, "kind": "deployments"}),
    );
    let change = credential_for(
        cli,
        "k8s_apply",
        serde_json::json!({"namespace": a.namespace, "manifest": {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name}, "data": {"checked-by": "gateway verify"}}}),
    );
    checks.push(match (&broker, read, change) {
        (Some(b), Ok(read), Ok(change)) => {
            crate::verify::kubernetes::toolbox_check(&base, b.as_ref(), &read, &change, &a.namespace).await
        }
        (None, _, _) => crate::verify::Check {
            name: "a k8s_get token reads the namespace, a k8s_apply token's server-side dry run is admitted and creates nothing",
            pass: false,
            detail: "no Vault configured ([vault] address or VAULT_ADDR): cannot check".into(),
        },
        (_, Err(e), _) | (_, _, Err(e)) => crate::verify::Check {
            name: "a k8s_get token reads the namespace, a k8s_apply token's server-side dry run is admitted and creates nothing",
            pass: false,
            detail: e,
        },
    });
    // 8. The cluster's credential Roles are the policy data's.
    crate::verify::kubernetes::step(
        8,
        "the credential Roles in the cluster are the policy data's",
    );
    const DRIFT: &str = "the credential Roles in the cluster are the policy data's (gateway vault cluster-roles --check)";
    let drift = async {
        let roles = super::vault::vault_roles(cli)?;
        let (ns, sa) = a
            .engine_service_account
            .split_once('/')
            .ok_or_else(|| anyhow::anyhow!("--engine-service-account takes NAMESPACE/NAME"))?;
        super::vault::cluster_role_drift(&client, &roles, (ns, sa)).await
    }
    .await;
    checks.push(match drift {
        Ok(d) if d.is_empty() => crate::verify::Check {
            name: DRIFT,
            pass: true,
            detail: "every Role and binding matches; no stray credential Role".into(),
        },
        Ok(d) => crate::verify::Check {
            name: DRIFT,
            pass: false,
            detail: d.join("; "),
        },
        Err(e) => crate::verify::Check {
            name: DRIFT,
            pass: false,
            detail: format!("{e:#}"),
        },
    });
    Ok(checks)
}

/// The credential the policy derives for `tool` with `params`, or why
/// there is none (in the policy's words).
fn credential_for(
    cli: &Cli,
    tool: &str,
    params: serde_json::Value,
) -> Result<crate::policy::CredentialScope, String> {
    let store = crate::policy::PolicyStore::open(
        vec![cli.policies.clone()],
        crate::policy::set::LoadOptions::default(),
    );
    let input = crate::policy::DecisionInput::new(
        tool,
        params,
        crate::policy::Principal::new("gateway-verify", &crate::identity::Caller::this_process()),
    );
    let d = store.decide(&input).decision;
    match (d.allow, d.credential) {
        (true, Some(c)) => Ok(c),
        (true, None) => Err(format!(
            "the policy derives no credential for {tool}: cannot check"
        )),
        (false, _) => Err(format!(
            "the policy denies {tool} ({}); pass --namespace with one it allows",
            d.deny_reasons.join("; ")
        )),
    }
}
