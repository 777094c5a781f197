//! `gateway vault setup|status|recover|cluster-roles`: configure
//! Vault/OpenBao for the policies, check the gateway's own access, revoke
//! leases a crashed gateway left open, and make (or check) the cluster
//! Roles the credentials are bound to.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;

use super::Cli;
use super::out::{Out, outln};
use crate::broker::setup::{SetupOptions, VaultRoles};
use crate::broker::vault::{VaultAuth, VaultBroker, VaultSettings};
use crate::pipeline::KubernetesAccess;

#[derive(Debug, clap::Subcommand)]
pub enum VaultCommand {
    /// Configure Vault/OpenBao for the policies (admin token from VAULT_TOKEN).
    Setup(SetupArgs),
    /// Check the gateway's own Vault access and list leases not yet revoked.
    Status,
    /// Revoke every lease a stopped gateway left open (also done at `serve` start).
    Recover,
    /// The cluster's Roles behind the credentials, from the policy data: print or write them, or check a cluster against them.
    ///
    /// Example: gateway vault cluster-roles | kubectl apply --server-side -f -
    /// Example: gateway vault cluster-roles --check   (the current kubectl context)
    ClusterRoles(ClusterRolesArgs),
}

#[derive(Debug, clap::Args)]
pub struct ClusterRolesArgs {
    /// Write the manifest here instead of printing it.
    #[arg(long, conflicts_with = "check")]
    output: Option<PathBuf>,
    /// Compare the cluster of the current kubeconfig context with the policy data; exit 1 on any difference.
    #[arg(long)]
    check: bool,
    /// The service account Vault/OpenBao's Kubernetes secrets engine runs as.
    #[arg(long, value_name = "NAMESPACE/NAME", default_value = "vault/openbao")]
    engine_service_account: String,
}

#[derive(Debug, clap::Args)]
pub struct SetupArgs {
    /// The Kubernetes API server URL as Vault reaches it.
    #[arg(long)]
    kubernetes_host: String,
    /// PEM file of the API server's CA.
    #[arg(long)]
    kubernetes_ca_file: PathBuf,
    /// File holding the JWT Vault authenticates to the API server with
    /// (omit when Vault runs in the cluster with its own service account).
    #[arg(long)]
    service_account_jwt_file: Option<PathBuf>,
    /// Name of the gateway's Vault policy and AppRole role.
    #[arg(long, default_value = "gateway")]
    name: String,
    /// Set up AppRole auth for the gateway and print its role id.
    #[arg(long)]
    approle: bool,
    /// With --approle: write a fresh secret id to this file (mode 0600).
    #[arg(long, requires = "approle")]
    secret_id_file: Option<PathBuf>,
    /// Set up Kubernetes auth for a gateway running in the cluster as this
    /// service account (NAMESPACE/NAME, e.g. gateway-sandbox/gateway).
    #[arg(long, value_name = "NAMESPACE/NAME")]
    kubernetes_auth: Option<String>,
    /// Mount each Kubernetes secrets engine this many times (MOUNT,
    /// MOUNT-lane-2, …, each with every role): OpenBao limits each mount
    /// to 5 API requests a second (a credential is 7; 1.25 credentials a
    /// second measured). Give the gateway the same number as `[vault] lanes`.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    lanes: u16,
}

/// The Vault settings from the config file and environment, if any.
fn settings(cli: &Cli) -> anyhow::Result<Option<VaultSettings>> {
    Ok(cli.file.vault.resolve()?)
}

/// The broker `serve` uses, or `None` when no Vault is configured.
/// Its leases are kept in the ledger [`ledger`] opens, as a replica.
pub fn broker(cli: &Cli, home: &std::path::Path) -> anyhow::Result<Option<Arc<VaultBroker>>> {
    broker_as(cli, home, true)
}

/// [`broker`] keeping its leases in `ledger` when one is given.
pub fn broker_on(
    cli: &Cli,
    home: &std::path::Path,
    ledger: Option<Arc<dyn crate::broker::leases::Ledger>>,
) -> anyhow::Result<Option<Arc<VaultBroker>>> {
    let Some(ledger) = ledger else {
        return broker(cli, home);
    };
    match settings(cli)? {
        Some(s) => {
            let address = s.address.clone();
            let b = VaultBroker::with_ledger(s, ledger)
                .with_context(|| format!("setting up the Vault broker for {address}"))?
                .with_lanes(cli.file.vault.lanes()?);
            Ok(Some(Arc::new(b)))
        }
        None => Ok(None),
    }
}

/// `replica`: whether this process joins the replicas of a shared ledger
/// (the daemon, `vault recover`) or only reads it (`vault status`).
fn broker_as(
    cli: &Cli,
    home: &std::path::Path,
    replica: bool,
) -> anyhow::Result<Option<Arc<VaultBroker>>> {
    match settings(cli)? {
        Some(s) => {
            let address = s.address.clone();
            let b = VaultBroker::with_ledger(s, ledger(cli, home, replica)?)
                .with_context(|| format!("setting up the Vault broker for {address}"))?
                .with_lanes(cli.file.vault.lanes()?);
            Ok(Some(Arc::new(b)))
        }
        None => Ok(None),
    }
}

/// The lease ledger of this configuration: the replicas' shared one in
/// PostgreSQL when `[store]` names it (with `replica`, this process joins
/// them for as long as the ledger lives; without, it only reads), else the
/// home's.
pub fn ledger(
    cli: &Cli,
    home: &std::path::Path,
    replica: bool,
) -> anyhow::Result<Arc<dyn crate::broker::leases::Ledger>> {
    use crate::broker::leases::{LocalLedger, SharedLedger};
    use crate::config::store::Store;
    Ok(match cli.file.store()? {
        Store::Sqlite => Arc::new(LocalLedger::in_home(home)?),
        Store::Postgres { url, ca_file, pool } => {
            let db = super::database::postgres(&url, ca_file.as_deref(), pool)
                .context("the lease ledger in PostgreSQL ([store] url_file)")?;
            if !replica {
                return Ok(Arc::new(SharedLedger::reader(db)));
            }
            let l = SharedLedger::open(db)
                .context("the lease ledger in PostgreSQL ([store] url_file)")?;
            tracing::info!(replica = l.replica(), "leases are kept in PostgreSQL");
            Arc::new(l)
        }
    })
}

/// `[kubernetes]` of the config, with its CA read.
pub fn kubernetes_access(cli: &Cli) -> anyhow::Result<Option<KubernetesAccess>> {
    let Some(k) = &cli.file.kubernetes else {
        return Ok(None);
    };
    let ca_pem = std::fs::read(&k.ca_file)
        .with_context(|| format!("kubernetes.ca_file {}", k.ca_file.display()))?;
    Ok(Some(KubernetesAccess {
        endpoint: k.endpoint.clone(),
        ca_pem,
        tls_server_name: k.tls_server_name.clone(),
    }))
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

pub fn run(cli: &Cli, cmd: &VaultCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        VaultCommand::Setup(a) => setup(cli, a),
        VaultCommand::Status => {
            let mut o = Out::default();
            let code = status(cli, &mut o)?;
            Ok(o.print(code))
        }
        VaultCommand::Recover => recover(cli),
        VaultCommand::ClusterRoles(a) => cluster_roles(cli, a),
    }
}

/// The policies' `config/vault_roles`.
pub fn vault_roles(cli: &Cli) -> anyhow::Result<VaultRoles> {
    let set = crate::policy::PolicySet::load(
        std::slice::from_ref(&cli.policies),
        &crate::policy::set::LoadOptions::default(),
    )
    .with_context(|| format!("loading the policies in {}", cli.policies.display()))?;
    let roles = set
        .data("data.config.vault_roles")?
        .context("the policies define no config/vault_roles/data.yaml: no roles to set up")?;
    serde_json::from_value(roles)
        .context("config/vault_roles/data.yaml does not match the expected shape")
}

/// The manifest `gateway vault cluster-roles` writes.
pub fn cluster_roles_manifest(roles: &VaultRoles, engine: (&str, &str)) -> anyhow::Result<String> {
    let mut text = String::from(
        "# Generated by `gateway vault cluster-roles` from config/vault_roles of the\n# policies. Do not edit: change the policy data and run it again.\n#\n# Each credential role's permissions, as a Role of its name in its\n# namespace, provisioned once; Vault/OpenBao binds a new ServiceAccount of\n# each credential to it (and may bind these Roles and no other).\n",
    );
    for doc in crate::broker::setup::cluster_roles(roles, engine) {
        text.push_str("---\n");
        text.push_str(&serde_saphyr::to_string(&doc)?);
    }
    Ok(text)
}

fn cluster_roles(cli: &Cli, a: &ClusterRolesArgs) -> anyhow::Result<ExitCode> {
    let roles = vault_roles(cli)?;
    let (ns, name) = a
        .engine_service_account
        .split_once('/')
        .context("--engine-service-account takes NAMESPACE/NAME")?;
    if a.check {
        return check_cluster_roles(&roles, (ns, name));
    }
    let text = cluster_roles_manifest(&roles, (ns, name))?;
    match &a.output {
        Some(path) => {
            std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?;
            println!(
                "wrote {} ({} credential roles)",
                path.display(),
                roles.roles.len()
            );
        }
        None => print!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// The drift check on the cluster `client` reaches: each object the
/// policy data implies read back, and every Role labelled a credential
/// role in those namespaces. One line per difference.
pub async fn cluster_role_drift(
    client: &kube::Client,
    roles: &VaultRoles,
    engine: (&str, &str),
) -> anyhow::Result<Vec<String>> {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use kube::api::{Api, ListParams};
    let expected = crate::broker::setup::cluster_roles(roles, engine);
    let namespaces: std::collections::BTreeSet<String> = expected
        .iter()
        .filter_map(|d| d["metadata"]["namespace"].as_str().map(str::to_string))
        .collect();
    let mut live = std::collections::BTreeMap::new();
    let mut listed = Vec::new();
    for d in &expected {
        let ns = d["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = d["metadata"]["name"].as_str().unwrap_or_default();
        let kind = d["kind"].as_str().unwrap_or_default();
        use k8s_openapi::api::admissionregistration::v1::{
            ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
        };
        let got = match kind {
            "Role" => Api::<Role>::namespaced(client.clone(), ns)
                .get_opt(name)
                .await
                .map(|o| o.map(|o| serde_json::to_value(o).unwrap_or_default())),
            "RoleBinding" => Api::<RoleBinding>::namespaced(client.clone(), ns)
                .get_opt(name)
                .await
                .map(|o| o.map(|o| serde_json::to_value(o).unwrap_or_default())),
            "ValidatingAdmissionPolicy" => Api::<ValidatingAdmissionPolicy>::all(client.clone())
                .get_opt(name)
                .await
                .map(|o| o.map(|o| serde_json::to_value(o).unwrap_or_default())),
            _ => Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
                .get_opt(name)
                .await
                .map(|o| o.map(|o| serde_json::to_value(o).unwrap_or_default())),
        }
        .with_context(|| format!("reading {kind} {ns}/{name}"))?;
        if let Some(o) = got {
            live.insert((kind.to_string(), ns.to_string(), name.to_string()), o);
        }
    }
    let lp = ListParams::default().labels(&format!(
        "{}=true",
        crate::broker::setup::CREDENTIAL_ROLE_LABEL
    ));
    for ns in &namespaces {
        for r in Api::<Role>::namespaced(client.clone(), ns)
            .list(&lp)
            .await
            .with_context(|| format!("listing the credential Roles in {ns}"))?
        {
            let mut v = serde_json::to_value(r).unwrap_or_default();
            v["kind"] = serde_json::json!("Role");
            listed.push(v);
        }
    }
    // Labelled objects anywhere (a namespace the data dropped keeps its
    // Roles and the engine's bindings until someone deletes them).
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let label = crate::broker::setup::CREDENTIAL_ROLE_LABEL;
    let mut bindings: Vec<serde_json::Value> = Vec::new();
    for value in ["true", "false"] {
        let lp = ListParams::default().labels(&format!("{label}={value}"));
        for r in Api::<Role>::all(client.clone())
            .list(&lp)
            .await
            .context("listing the gateway's Roles")?
        {
            let mut v = serde_json::to_value(r).unwrap_or_default();
            v["kind"] = serde_json::json!("Role");
            if !namespaces.contains(v["metadata"]["namespace"].as_str().unwrap_or_default()) {
                listed.push(v);
            }
        }
        for b in Api::<RoleBinding>::all(client.clone())
            .list(&lp)
            .await
            .context("listing the gateway's RoleBindings")?
        {
            bindings.push(serde_json::to_value(b).unwrap_or_default());
        }
    }
    for ns in &namespaces {
        for b in Api::<RoleBinding>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .with_context(|| format!("listing the RoleBindings in {ns}"))?
        {
            bindings.push(serde_json::to_value(b).unwrap_or_default());
        }
    }
    let cluster_bindings: Vec<serde_json::Value> = Api::<ClusterRoleBinding>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing the ClusterRoleBindings")?
        .into_iter()
        .map(|b| serde_json::to_value(b).unwrap_or_default())
        .collect();
    let issuer = Api::<ClusterRole>::all(client.clone())
        .get_opt(crate::broker::setup::ISSUER_CLUSTER_ROLE)
        .await
        .context("reading the issuer ClusterRole")?
        .map(|c| serde_json::to_value(c).unwrap_or_default());
    let mut drift = crate::broker::setup::role_drift(
        &expected,
        |k, n, m| {
            live.get(&(k.to_string(), n.to_string(), m.to_string()))
                .cloned()
        },
        &listed,
    );
    drift.extend(crate::broker::setup::binding_drift(
        &expected,
        &bindings,
        &cluster_bindings,
        issuer.as_ref(),
        &issuer_rules()?,
    ));
    Ok(drift)
}

/// The issuer ClusterRole's rules as cluster/vault-rbac.yaml (built into
/// this binary) has them.
fn issuer_rules() -> anyhow::Result<serde_json::Value> {
    const VAULT_RBAC: &str = include_str!("../../cluster/vault-rbac.yaml");
    serde_saphyr::from_multiple::<serde_json::Value>(VAULT_RBAC)
        .context("cluster/vault-rbac.yaml")?
        .into_iter()
        .find(|d| {
            d["kind"] == "ClusterRole"
                && d["metadata"]["name"] == crate::broker::setup::ISSUER_CLUSTER_ROLE
        })
        .map(|d| d["rules"].clone())
        .context("cluster/vault-rbac.yaml has no issuer ClusterRole")
}

/// `--check`: [`cluster_role_drift`] on the cluster of the current
/// kubeconfig context.
fn check_cluster_roles(roles: &VaultRoles, engine: (&str, &str)) -> anyhow::Result<ExitCode> {
    let namespaces: std::collections::BTreeSet<&str> =
        roles.roles.values().map(|r| r.namespace.as_str()).collect();
    let drift = runtime()?.block_on(async {
        let client = kube::Client::try_default()
            .await
            .context("connecting to the cluster of the current kubeconfig context")?;
        cluster_role_drift(&client, roles, engine).await
    })?;
    if drift.is_empty() {
        println!(
            "the cluster's credential Roles match the policy data ({} roles, {} namespace(s))",
            roles.roles.len(),
            namespaces.len()
        );
        return Ok(ExitCode::SUCCESS);
    }
    for d in &drift {
        super::out::print_safe(&format!("DRIFT {d}\n"));
    }
    println!(
        "{} difference(s): apply `gateway vault cluster-roles` (kubectl apply --server-side -f -), or change the policy data",
        drift.len()
    );
    Ok(ExitCode::from(1))
}

fn setup(cli: &Cli, a: &SetupArgs) -> anyhow::Result<ExitCode> {
    let admin = settings(cli)?.context(
        "no Vault configured: set VAULT_ADDR and VAULT_TOKEN (an admin token) or [vault] in gateway.toml",
    )?;
    if !matches!(admin.auth, VaultAuth::Token(_)) {
        anyhow::bail!("vault setup needs an admin token (VAULT_TOKEN), not AppRole");
    }
    let roles = vault_roles(cli)?;
    let ca = std::fs::read_to_string(&a.kubernetes_ca_file)
        .with_context(|| format!("reading {}", a.kubernetes_ca_file.display()))?;
    let jwt = match &a.service_account_jwt_file {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("reading {}", f.display()))?
                .trim()
                .to_string(),
        ),
        None => None,
    };
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let aws = match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
        (Some(k), Some(s)) => Some((
            k,
            s,
            env("AWS_REGION").unwrap_or_else(|| "us-east-1".into()),
        )),
        _ => None,
    };
    let kubernetes_auth = match &a.kubernetes_auth {
        Some(sa) => {
            let (ns, name) = sa
                .split_once('/')
                .context("--kubernetes-auth takes NAMESPACE/NAME")?;
            Some((ns.to_string(), name.to_string()))
        }
        None => None,
    };
    let opts = SetupOptions {
        kubernetes_host: a.kubernetes_host.clone(),
        kubernetes_ca_pem: ca,
        service_account_jwt: jwt,
        gateway_name: a.name.clone(),
        approle: a.approle,
        secret_id_file: a.secret_id_file.clone(),
        kubernetes_auth,
        aws,
        lanes: usize::from(a.lanes),
    };
    let report = runtime()?
        .block_on(crate::broker::setup::setup(&admin, &roles, &opts))
        .with_context(|| format!("setting up Vault at {}", admin.address))?;
    for line in report {
        super::out::print_safe(&format!("{line}\n"));
    }
    println!(
        "each role binds a credential to the cluster Role of its name: apply them with `gateway vault cluster-roles | kubectl apply --server-side -f -` (`gateway policy configmap` puts them in the policy component, deploy/kubernetes/policies, too), and check them with `gateway vault cluster-roles --check`"
    );
    Ok(ExitCode::SUCCESS)
}

pub fn status(cli: &Cli, o: &mut Out) -> anyhow::Result<u8> {
    let home = cli.home();
    let Some(broker) = broker_as(cli, &home, false)? else {
        outln!(
            o,
            "no Vault configured: calls that need a credential are refused"
        );
        return Ok(1);
    };
    let checked = runtime()?.block_on(broker.check());
    let open = broker.ledger().open_leases()?;
    let code = match checked {
        Ok((ttl, renewable)) => {
            outln!(
                o,
                "Vault {}: reachable; the gateway's token is valid (ttl {}s, {})",
                broker.address(),
                ttl.as_secs(),
                if renewable {
                    "renewable"
                } else {
                    "not renewable"
                }
            );
            0
        }
        Err(e) => {
            outln!(o, "Vault {}: NOT usable: {e}", broker.address());
            1
        }
    };
    outln!(o, "{} lease(s) not yet revoked", open.len());
    for l in open {
        outln!(
            o,
            "  {}  request {}  issued {}  expires {}{}",
            l.lease_id,
            l.request_id,
            l.issued_at,
            l.expires_at,
            l.last_error
                .map(|e| format!("  last error: {e}"))
                .unwrap_or_default()
        );
    }
    Ok(code)
}

fn recover(cli: &Cli) -> anyhow::Result<ExitCode> {
    let home = cli.home();
    let broker = broker(cli, &home)?.context("no Vault configured")?;
    let audit = super::audit::open_log(&cli.file, &home)?;
    // A replica that has just joined calls no one dead before the others
    // had the time to show they are alive.
    if let Some(wait) = broker.ledger().ready_in() {
        std::thread::sleep(wait);
    }
    let (done, left) = runtime()?.block_on(broker.recover_orphans(&audit));
    println!("revoked {done} lease(s) left open; {left} could not be revoked");
    Ok(if left == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
