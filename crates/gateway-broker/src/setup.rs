//! `gateway vault setup`: configure a Vault or OpenBao for the policies —
//! the Kubernetes secrets engine pointed at the cluster, one role per
//! credential scope (from `data.config.vault_roles`, the same data the
//! policies check their derived roles against), the gateway's own
//! least-privilege policy and its AppRole. Idempotent: every write is a
//! create-or-update; a mount that exists is left as it is.
//!
//! The AWS secrets engine is configured only when AWS credentials are in the
//! environment, and the report says so when it is skipped.

use std::collections::BTreeMap;
use std::path::PathBuf;

use rustify::enums::RequestMethod;
use serde::Deserialize;
use serde_json::{Value, json};

use super::BrokerError;
use super::vault::{VaultSettings, call, client_for};

/// One role of `data.config.vault_roles.roles`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleDef {
    pub mount: String,
    pub namespace: String,
    /// TTL of a credential when the request names none.
    pub default_ttl: String,
    /// Longest TTL Vault grants.
    pub max_ttl: String,
    pub rules: Vec<Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VaultRoles {
    pub roles: BTreeMap<String, RoleDef>,
}

/// What the operator passes.
#[derive(Debug, Clone)]
pub struct SetupOptions {
    /// The API server URL Vault reaches the cluster at.
    pub kubernetes_host: String,
    /// PEM of the API server's CA.
    pub kubernetes_ca_pem: String,
    /// The JWT Vault authenticates to the API server with (when Vault does
    /// not run in the cluster with its own service account).
    pub service_account_jwt: Option<String>,
    /// Name of the gateway's Vault policy and AppRole role.
    pub gateway_name: String,
    /// Set up AppRole auth for the gateway.
    pub approle: bool,
    /// Write a fresh AppRole secret id here (mode 0600).
    pub secret_id_file: Option<PathBuf>,
    /// Set up Kubernetes auth for a gateway running in the cluster as this
    /// service account (namespace, name).
    pub kubernetes_auth: Option<(String, String)>,
    /// AWS root credentials for the AWS secrets engine (from the
    /// environment); `None` skips it.
    pub aws: Option<(String, String, String)>,
    /// Copies of each Kubernetes secrets engine mount, each with every
    /// role ([`super::lane_mount`]); 1 is the mount alone.
    pub lanes: usize,
}

/// The gateway's own Vault policy: mint from its roles, revoke their leases,
/// nothing else (token self-lookup and renewal come from Vault's `default`
/// policy).
pub fn gateway_policy(roles: &VaultRoles, lanes: usize, kept: &[String]) -> String {
    let mut s = String::from(
        "# Written by `gateway vault setup`: the gateway may mint credentials from its\n# roles and revoke those roles' leases, and nothing else.\n",
    );
    for (name, r) in &roles.roles {
        for lane in 0..lanes.max(1) {
            s.push_str(&format!(
                "\npath \"{m}/creds/{name}\" {{\n  capabilities = [\"update\"]\n}}\n\npath \"sys/leases/revoke/{m}/creds/{name}/*\" {{\n  capabilities = [\"update\"]\n}}\n",
                m = super::lane_mount(&r.mount, lane)
            ));
        }
    }
    // Lanes set up before and no longer: their leases (a call's still
    // running, an orphan's) stay revocable, and nothing new is minted there.
    for path in kept {
        if !s.contains(&format!("path \"{path}\"")) {
            s.push_str(&format!(
                "\npath \"{path}\" {{\n  capabilities = [\"update\"]\n}}\n"
            ));
        }
    }
    s
}

/// The revocations of `roles`' leases on any lane that a gateway policy
/// written before grants (`sys/leases/revoke/LANE/creds/ROLE/*`, exactly
/// as setup writes them): a new setup keeps them. Nothing else in that
/// policy is kept, however it was edited.
pub fn revocations_in(policy: &str, roles: &VaultRoles) -> Vec<String> {
    let granted: std::collections::BTreeSet<&str> = policy
        .lines()
        .filter_map(|l| l.trim().strip_prefix("path \""))
        .filter_map(|l| l.strip_suffix("\" {"))
        .collect();
    let mut kept = Vec::new();
    for (name, def) in &roles.roles {
        for lane in 0..super::MAX_LANES {
            let path = format!(
                "sys/leases/revoke/{}/creds/{name}/*",
                super::lane_mount(&def.mount, lane)
            );
            if granted.contains(path.as_str()) {
                kept.push(path);
            }
        }
    }
    kept
}

/// The Kubernetes secrets engine role `name` for `def`: each credential is
/// a new ServiceAccount bound (by a new RoleBinding) to the Role of the
/// same name that [`cluster_roles`] provisions once in the role's
/// namespace. The engine creates no Role and needs neither `escalate` nor
/// the right to write Roles: only to bind these, by name.
pub fn role_body(name: &str, def: &RoleDef) -> Value {
    json!({
        "allowed_kubernetes_namespaces": [def.namespace],
        "kubernetes_role_type": "Role",
        "kubernetes_role_name": name,
        // A role written by an older setup keeps the fields a write does
        // not send, and the engine refuses a role that has more than one
        // of these three: the other two are cleared by name.
        "generated_role_rules": "",
        "service_account_name": "",
        // Its ServiceAccount and RoleBinding are named so that the
        // admission policies tell them from an application's.
        "name_template": NAME_TEMPLATE,
        "token_default_ttl": def.default_ttl,
        "token_max_ttl": def.max_ttl,
        "extra_labels": {"app.kubernetes.io/part-of": "gateway"},
    })
}

/// The ClusterRole the secrets engine's service account is given in each
/// namespace it mints credentials in (cluster/vault-rbac.yaml): its
/// ServiceAccounts, their tokens and RoleBindings.
pub const ISSUER_CLUSTER_ROLE: &str = "gateway-credential-issuer";
/// The Role, in each such namespace, that lets the engine bind exactly the
/// credential Roles there (`bind` with `resourceNames`).
pub const BINDER_ROLE: &str = "gateway-credential-binder";
/// The label every object [`cluster_roles`] makes carries, `true` on the
/// credential Roles themselves (what the drift check lists).
pub const CREDENTIAL_ROLE_LABEL: &str = "gateway.dev/credential-role";

/// The Kubernetes objects behind the credentials, made once from the same
/// data the policies derive scopes from (`data.config.vault_roles`): a
/// Role per credential role, named as it and holding exactly its rules;
/// and per namespace, for the secrets engine's service account
/// `engine` (namespace, name), a RoleBinding of [`ISSUER_CLUSTER_ROLE`]
/// and a Role (and binding) that may `bind` those Roles and no other.
pub fn cluster_roles(roles: &VaultRoles, engine: (&str, &str)) -> Vec<Value> {
    let labels = |credential: bool| json!({"app.kubernetes.io/part-of": "gateway", CREDENTIAL_ROLE_LABEL: credential.to_string()});
    let subject = json!([{"kind": "ServiceAccount", "name": engine.1, "namespace": engine.0}]);
    let mut by_ns: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut docs = Vec::new();
    for (name, def) in &roles.roles {
        by_ns.entry(&def.namespace).or_default().push(name);
        docs.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": name, "namespace": def.namespace, "labels": labels(true)},
            "rules": def.rules,
        }));
    }
    // What RBAC cannot say: the engine's `bind` lets it give a credential
    // Role to any subject. An admission policy holds every RoleBinding it
    // writes or deletes to a credential's own shape.
    let cel = |v: &str| format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"));
    let allowed: Vec<String> = by_ns
        .iter()
        .map(|(ns, names)| {
            let names: Vec<String> = names.iter().map(|n| cel(n)).collect();
            format!(
                "(variables.binding.metadata.namespace == {} && variables.binding.roleRef.name in [{}])",
                cel(ns),
                names.join(", ")
            )
        })
        .collect();
    let engine_user = format!("system:serviceaccount:{}:{}", engine.0, engine.1);
    let policy_labels =
        json!({"app.kubernetes.io/part-of": "gateway", CREDENTIAL_ROLE_LABEL: "false"});
    let admission = [
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": BINDINGS_POLICY, "labels": policy_labels},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": ["rbac.authorization.k8s.io"], "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["rolebindings"],
                    "scope": "*"}]},
                "matchConditions": [{"name": "made-by-the-secrets-engine",
                    "expression": format!("request.userInfo.username == {}", cel(&engine_user))}],
                "variables": [{"name": "binding",
                    "expression": "request.operation == 'DELETE' ? oldObject : object"}],
                "validations": [
                    // A revocation deletes what an earlier policy allowed:
                    // only a creation is held to today's list.
                    {"expression": format!("request.operation == 'DELETE' || (variables.binding.roleRef.kind == 'Role' && ({}))", allowed.join(" || ")),
                     "message": "the secrets engine binds only the gateway's credential Roles, each in its own namespace",
                     "reason": "Forbidden"},
                    {"expression": format!("variables.binding.metadata.name.startsWith({prefix}) && has(variables.binding.subjects) && size(variables.binding.subjects) == 1 && variables.binding.subjects[0].kind == 'ServiceAccount' && variables.binding.subjects[0].name == variables.binding.metadata.name && has(variables.binding.subjects[0].namespace) && variables.binding.subjects[0].namespace == variables.binding.metadata.namespace", prefix = cel(CREDENTIAL_NAME_PREFIX)),
                     "message": format!("a credential's RoleBinding is named as its own ServiceAccount ({CREDENTIAL_NAME_PREFIX}…) and holds exactly that one ServiceAccount, of its own namespace"),
                     "reason": "Forbidden"}
                ]
            }
        }),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": BINDINGS_POLICY, "labels": policy_labels},
            "spec": {"policyName": BINDINGS_POLICY, "validationActions": ["Deny"]}
        }),
        // Its ServiceAccounts and their tokens: only the credentials' own
        // (named by the role's name_template), never an application's.
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": ACCOUNTS_POLICY, "labels": policy_labels},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE", "DELETE"],
                    "resources": ["serviceaccounts", "serviceaccounts/token"], "scope": "*"}]},
                "matchConditions": [{"name": "made-by-the-secrets-engine",
                    "expression": format!("request.userInfo.username == {}", cel(&engine_user))}],
                "validations": [
                    {"expression": format!("request.name.startsWith({})", cel(CREDENTIAL_NAME_PREFIX)),
                     "message": format!("the secrets engine makes, deletes and asks tokens for its credentials' own ServiceAccounts ({CREDENTIAL_NAME_PREFIX}…) only"),
                     "reason": "Forbidden"}
                ]
            }
        }),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": ACCOUNTS_POLICY, "labels": policy_labels},
            "spec": {"policyName": ACCOUNTS_POLICY, "validationActions": ["Deny"]}
        }),
    ];
    for (ns, names) in by_ns {
        docs.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": ISSUER_CLUSTER_ROLE, "namespace": ns, "labels": labels(false)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ISSUER_CLUSTER_ROLE},
            "subjects": subject,
        }));
        docs.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": BINDER_ROLE, "namespace": ns, "labels": labels(false)},
            "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"],
                       "verbs": ["bind"], "resourceNames": names}],
        }));
        docs.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": BINDER_ROLE, "namespace": ns, "labels": labels(false)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": BINDER_ROLE},
            "subjects": subject,
        }));
    }
    docs.extend(admission);
    docs
}

/// The ValidatingAdmissionPolicies (and their bindings) [`cluster_roles`]
/// makes: the engine's RoleBindings, and its ServiceAccounts and tokens.
pub const BINDINGS_POLICY: &str = "gateway-credential-bindings";
pub const ACCOUNTS_POLICY: &str = "gateway-credential-accounts";

/// What every object the engine makes for a credential is named by
/// (ServiceAccount, RoleBinding and token alike): the admission policies
/// hold it to these and no other.
pub const CREDENTIAL_NAME_PREFIX: &str = "gw-cred-";

/// The engine's name template for them: the prefix, the time, and random
/// letters and digits (what the engine's own default template uses too).
pub const NAME_TEMPLATE: &str = "gw-cred-{{unix_time}}-{{random 16 | lowercase}}";

/// A rule as the API server keeps it, for comparing: every list sorted,
/// an empty `resourceNames` (what a Role written without one reads back
/// as, from some clients) the same as none.
fn normal_rule(rule: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for key in [
        "apiGroups",
        "resources",
        "verbs",
        "resourceNames",
        "nonResourceURLs",
    ] {
        let mut items: Vec<String> = rule[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        items.sort();
        items.dedup();
        if !items.is_empty() {
            out.insert(key.into(), json!(items));
        }
    }
    Value::Object(out)
}

/// A rule list as [`normal_rule`]s, sorted: equal when RBAC reads them
/// the same.
fn normal_rules(rules: &Value) -> Vec<String> {
    let mut r: Vec<String> = rules
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| normal_rule(r).to_string())
        .collect();
    r.sort();
    r
}

/// How the cluster's objects differ from [`cluster_roles`]' `expected`:
/// `live(kind, namespace, name)` is the object in the cluster, if any, and
/// `listed` every Role labelled a credential role in those namespaces.
/// One line per difference; none when the cluster matches.
pub fn role_drift(
    expected: &[Value],
    live: impl Fn(&str, &str, &str) -> Option<Value>,
    listed: &[Value],
) -> Vec<String> {
    let mut drift = Vec::new();
    let key = |o: &Value| {
        (
            o["kind"].as_str().unwrap_or_default().to_string(),
            o["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        )
    };
    let rules = |o: &Value| normal_rules(&o["rules"]);
    for want in expected {
        let (kind, ns, name) = key(want);
        // A cluster-scoped object has no namespace to name.
        let at = if ns.is_empty() {
            name.clone()
        } else {
            format!("{ns}/{name}")
        };
        let Some(have) = live(&kind, &ns, &name) else {
            drift.push(format!("{kind} {at} is missing"));
            continue;
        };
        if kind == "Role" && rules(want) != rules(&have) {
            drift.push(format!(
                "{kind} {at} has other rules: {} (the policy data says {})",
                json!(have["rules"]),
                json!(want["rules"])
            ));
        }
        let fields: &[&str] = match kind.as_str() {
            "RoleBinding" => &["roleRef", "subjects"],
            // What the policy decides by (the server defaults the rest).
            "ValidatingAdmissionPolicy" => &[
                "/spec/failurePolicy",
                "/spec/matchConstraints/resourceRules",
                "/spec/matchConditions",
                "/spec/variables",
                "/spec/validations",
            ],
            "ValidatingAdmissionPolicyBinding" => &["/spec/policyName", "/spec/validationActions"],
            _ => &[],
        };
        for field in fields {
            let (w, h) = if field.starts_with('/') {
                (want.pointer(field), have.pointer(field))
            } else {
                (want.get(*field), have.get(*field))
            };
            if w != h {
                drift.push(format!(
                    "{kind} {at} has another {}: {} (expected {})",
                    field.trim_start_matches('/').replace('/', "."),
                    h.cloned().unwrap_or(Value::Null),
                    w.cloned().unwrap_or(Value::Null)
                ));
            }
        }
    }
    let wanted: std::collections::BTreeSet<_> = expected.iter().map(key).collect();
    for have in listed {
        let mut k = key(have);
        if k.0.is_empty() {
            k.0 = "Role".into();
        }
        if !wanted.contains(&k) {
            drift.push(format!(
                "Role {}/{} is labelled a gateway credential role and is not in the policy data: delete it or add it to config/vault_roles",
                k.1, k.2
            ));
        }
    }
    drift
}

/// How Vault reaches the cluster (the secrets engine's and the Kubernetes
/// auth method's config): its API server and CA, and when Vault does not run
/// in the cluster, the JWT it authenticates with under `jwt_key`.
fn cluster_config(opts: &SetupOptions, jwt_key: &str) -> Value {
    let mut config = json!({
        "kubernetes_host": opts.kubernetes_host,
        "kubernetes_ca_cert": opts.kubernetes_ca_pem,
    });
    if let Some(jwt) = &opts.service_account_jwt {
        config[jwt_key] = json!(jwt);
        config["disable_local_ca_jwt"] = json!(true);
    }
    config
}

/// Enable a secrets engine (`table` = "mounts") or an auth method
/// ("auth") of type `kind` at `path`, unless one is there already.
async fn enable(
    client: &vaultrs::client::VaultClient,
    table: &str,
    path: &str,
    kind: &str,
    report: &mut Vec<String>,
) -> Result<(), BrokerError> {
    let what = if table == "auth" {
        "auth"
    } else {
        "secrets engine"
    };
    let list = call(
        client,
        RequestMethod::GET,
        &format!("sys/{table}"),
        None,
        &format!("listing sys/{table}"),
    )
    .await?
    .unwrap_or(Value::Null);
    let key = format!("{}/", path.trim_matches('/'));
    if list.get(&key).is_some() || list["data"].get(&key).is_some() {
        report.push(format!("{what} {key}: already enabled"));
        return Ok(());
    }
    call(
        client,
        RequestMethod::POST,
        &format!("sys/{table}/{}", path.trim_matches('/')),
        Some(json!({"type": kind, "description": "used by the gateway"})),
        &format!("enabling {what} {key} ({kind})"),
    )
    .await?;
    report.push(format!("{what} {key}: enabled ({kind})"));
    Ok(())
}

/// Run the setup; returns one line per step done.
pub async fn setup(
    admin: &VaultSettings,
    roles: &VaultRoles,
    opts: &SetupOptions,
) -> Result<Vec<String>, BrokerError> {
    let client = client_for(admin)?;
    let mut report = Vec::new();
    if !(1..=super::MAX_LANES).contains(&opts.lanes) {
        return Err(BrokerError::Refused(format!(
            "--lanes {}: give 1 to {}",
            opts.lanes,
            super::MAX_LANES
        )));
    }
    let k8s_mounts: std::collections::BTreeSet<String> = roles
        .roles
        .values()
        .flat_map(|r| (0..opts.lanes).map(|lane| super::lane_mount(&r.mount, lane)))
        .collect();
    for m in &k8s_mounts {
        enable(&client, "mounts", m, "kubernetes", &mut report).await?;
        let config = cluster_config(opts, "service_account_jwt");
        call(
            &client,
            RequestMethod::POST,
            &format!("{m}/config"),
            Some(config),
            &format!("configuring {m}/"),
        )
        .await?;
        report.push(format!("{m}/config: API server {}", opts.kubernetes_host));
    }
    for (name, def) in &roles.roles {
        for lane in 0..opts.lanes {
            let mount = super::lane_mount(&def.mount, lane);
            call(
                &client,
                RequestMethod::POST,
                &format!("{mount}/roles/{name}"),
                Some(role_body(name, def)),
                &format!("writing role {name} on {mount}/"),
            )
            .await?;
            report.push(format!(
                "{mount}/roles/{name}: namespace {}, {} rule(s), max ttl {}",
                def.namespace,
                def.rules.len(),
                def.max_ttl
            ));
        }
    }
    // What the gateway may revoke now stays revocable (fewer lanes than
    // before must not strand the leases of the lanes dropped).
    let before = match call(
        &client,
        RequestMethod::GET,
        &format!("sys/policies/acl/{}", opts.gateway_name),
        None,
        "reading the gateway's policy",
    )
    .await
    {
        Ok(v) => v,
        // Not written yet (vault_error's 404).
        Err(BrokerError::Refused(m)) if m.contains("not found in Vault") => None,
        Err(e) => return Err(e),
    };
    let kept = before
        .and_then(|v| {
            v["data"]["policy"]
                .as_str()
                .or(v["policy"].as_str())
                .map(|p| revocations_in(p, roles))
        })
        .unwrap_or_default();
    let policy = gateway_policy(roles, opts.lanes, &kept);
    call(
        &client,
        RequestMethod::POST,
        &format!("sys/policies/acl/{}", opts.gateway_name),
        Some(json!({"policy": policy})),
        "writing the gateway's policy",
    )
    .await?;
    report.push(format!(
        "policy {}: creds of {} role(s) and revocation of their leases only",
        opts.gateway_name,
        roles.roles.len()
    ));
    if opts.approle {
        enable(&client, "auth", "approle", "approle", &mut report).await?;
        let role = format!("auth/approle/role/{}", opts.gateway_name);
        call(
            &client,
            RequestMethod::POST,
            &role,
            Some(json!({"token_policies": [opts.gateway_name], "token_ttl": "1h", "token_max_ttl": "24h",
                        "secret_id_ttl": "0", "token_type": "service"})),
            "writing the gateway's AppRole",
        )
        .await?;
        let role_id = call(
            &client,
            RequestMethod::GET,
            &format!("{role}/role-id"),
            None,
            "reading the AppRole role id",
        )
        .await?
        .unwrap_or(Value::Null);
        let role_id = role_id["data"]["role_id"]
            .as_str()
            .unwrap_or("")
            .to_string();
        report.push(format!("approle {}: role_id {role_id}", opts.gateway_name));
        if let Some(path) = &opts.secret_id_file {
            let sid = call(
                &client,
                RequestMethod::POST,
                &format!("{role}/secret-id"),
                Some(json!({})),
                "generating an AppRole secret id",
            )
            .await?
            .unwrap_or(Value::Null);
            let secret = zeroize::Zeroizing::new(
                sid["data"]["secret_id"].as_str().unwrap_or("").to_string(),
            );
            write_private(path, secret.as_bytes())
                .map_err(|e| BrokerError::Refused(format!("writing {}: {e}", path.display())))?;
            report.push(format!(
                "approle secret id: written to {} (0600)",
                path.display()
            ));
        }
    }
    if let Some((ns, sa)) = &opts.kubernetes_auth {
        enable(&client, "auth", "kubernetes", "kubernetes", &mut report).await?;
        // Vault reviews the gateway's token with its own (TokenReview).
        let config = cluster_config(opts, "token_reviewer_jwt");
        call(
            &client,
            RequestMethod::POST,
            "auth/kubernetes/config",
            Some(config),
            "configuring Kubernetes auth",
        )
        .await?;
        call(
            &client,
            RequestMethod::POST,
            &format!("auth/kubernetes/role/{}", opts.gateway_name),
            Some(json!({"bound_service_account_names": [sa], "bound_service_account_namespaces": [ns],
                        "token_policies": [opts.gateway_name], "token_ttl": "1h", "token_max_ttl": "24h"})),
            "writing the gateway's Kubernetes auth role",
        )
        .await?;
        report.push(format!(
            "auth kubernetes/role/{}: service account {ns}/{sa}",
            opts.gateway_name
        ));
    }
    match &opts.aws {
        Some((key, secret, region)) => {
            enable(&client, "mounts", "aws", "aws", &mut report).await?;
            call(
                &client,
                RequestMethod::POST,
                "aws/config/root",
                Some(json!({"access_key": key, "secret_key": secret, "region": region})),
                "configuring the AWS secrets engine",
            )
            .await?;
            report.push(format!("secrets engine aws/: configured for {region}"));
        }
        None => report.push(
            "secrets engine aws/: skipped (no AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment)".into(),
        ),
    }
    Ok(report)
}

fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.write_all(b"\n")
}

/// What [`role_drift`] does not see, in the bindings and in the secrets
/// engine's own ClusterRole:
/// - `bindings` (every RoleBinding of the credential namespaces, and every
///   one labelled as this tool's anywhere): one that is not expected and
///   refers to a credential Role, the binder Role or the issuer ClusterRole
///   must be a credential's own (a credential Role of its namespace, held
///   by one ServiceAccount of its namespace, as the engine makes them);
///   anything else hands the engine's rights or a credential's to someone;
/// - a labelled binding that is not expected is left over;
/// - `cluster_bindings`: a ClusterRoleBinding of the issuer ClusterRole
///   grants it in every namespace;
/// - `issuer`, the issuer ClusterRole as the cluster has it, must hold
///   exactly `issuer_rules` (cluster/vault-rbac.yaml): the engine's
///   containment rests on it holding no right on Roles and no `escalate`.
pub fn binding_drift(
    expected: &[Value],
    bindings: &[Value],
    cluster_bindings: &[Value],
    issuer: Option<&Value>,
    issuer_rules: &Value,
) -> Vec<String> {
    let mut drift = Vec::new();
    let meta = |o: &Value, k: &str| o["metadata"][k].as_str().unwrap_or_default().to_string();
    let expected_bindings: std::collections::BTreeSet<(String, String)> = expected
        .iter()
        .filter(|d| d["kind"] == "RoleBinding")
        .map(|d| (meta(d, "namespace"), meta(d, "name")))
        .collect();
    let credential_roles: std::collections::BTreeSet<(String, String)> = expected
        .iter()
        .filter(|d| d["kind"] == "Role" && d["metadata"]["labels"][CREDENTIAL_ROLE_LABEL] == "true")
        .map(|d| (meta(d, "namespace"), meta(d, "name")))
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    for b in bindings {
        let (ns, name) = (meta(b, "namespace"), meta(b, "name"));
        if !seen.insert((ns.clone(), name.clone()))
            || expected_bindings.contains(&(ns.clone(), name.clone()))
        {
            continue;
        }
        let kind = b["roleRef"]["kind"].as_str().unwrap_or_default();
        let role = b["roleRef"]["name"].as_str().unwrap_or_default();
        let to_credential =
            kind == "Role" && credential_roles.contains(&(ns.clone(), role.to_string()));
        let to_engine = (kind == "Role" && role == BINDER_ROLE)
            || (kind == "ClusterRole" && role == ISSUER_CLUSTER_ROLE);
        let labelled = !b["metadata"]["labels"][CREDENTIAL_ROLE_LABEL].is_null();
        let subjects = b["subjects"].as_array().cloned().unwrap_or_default();
        let a_credentials_own = to_credential
            && name.starts_with(CREDENTIAL_NAME_PREFIX)
            && subjects.len() == 1
            && subjects[0]["kind"] == "ServiceAccount"
            && subjects[0]["name"] == name.as_str()
            && subjects[0]["namespace"].as_str().unwrap_or(ns.as_str()) == ns;
        if labelled {
            drift.push(format!(
                "RoleBinding {ns}/{name} is labelled as the gateway's and is not in the policy data: delete it"
            ));
        } else if to_engine || (to_credential && !a_credentials_own) {
            drift.push(format!(
                "RoleBinding {ns}/{name} gives {kind} {role} to {}: only the engine's bindings and a credential's own ServiceAccount may hold it",
                Value::Array(subjects)
            ));
        }
    }
    for b in cluster_bindings {
        if b["roleRef"]["kind"] == "ClusterRole" && b["roleRef"]["name"] == ISSUER_CLUSTER_ROLE {
            drift.push(format!(
                "ClusterRoleBinding {} gives ClusterRole {ISSUER_CLUSTER_ROLE} in every namespace: bind it per namespace only",
                meta(b, "name")
            ));
        }
    }
    let rules = normal_rules;
    match issuer {
        None => drift.push(format!("ClusterRole {ISSUER_CLUSTER_ROLE} is missing (cluster/vault-rbac.yaml)")),
        Some(c) if rules(&c["rules"]) != rules(issuer_rules) => drift.push(format!(
            "ClusterRole {ISSUER_CLUSTER_ROLE} has other rules: {} (cluster/vault-rbac.yaml says {})",
            c["rules"], issuer_rules
        )),
        Some(_) => {}
    }
    drift
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roles() -> VaultRoles {
        serde_json::from_value(json!({"roles": {
            "r1": {"mount": "kubernetes", "namespace": "demo-app", "default_ttl": "10m", "max_ttl": "30m",
                   "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]}}}))
        .expect("roles")
    }

    #[test]
    fn the_gateway_policy_grants_only_its_roles_creds_and_their_revocation() {
        let p = gateway_policy(&roles(), 1, &[]);
        assert!(p.contains("path \"kubernetes/creds/r1\""));
        assert!(p.contains("path \"sys/leases/revoke/kubernetes/creds/r1/*\""));
        assert_eq!(p.matches("path ").count(), 2, "{p}");
        assert!(!p.contains("sudo") && !p.contains("\"read\""));
        // Each lane's mount, and no other.
        let p = gateway_policy(&roles(), 3, &[]);
        for m in ["kubernetes", "kubernetes-lane-2", "kubernetes-lane-3"] {
            assert!(p.contains(&format!("path \"{m}/creds/r1\"")), "{p}");
            assert!(
                p.contains(&format!("path \"sys/leases/revoke/{m}/creds/r1/*\"")),
                "{p}"
            );
        }
        assert_eq!(p.matches("path ").count(), 6, "{p}");
        // Down to one lane: nothing is minted on the others any more, but
        // their leases stay revocable.
        let kept = revocations_in(&p, &roles());
        assert_eq!(kept.len(), 3, "{kept:?}");
        let fewer = gateway_policy(&roles(), 1, &kept);
        assert!(
            !fewer.contains("path \"kubernetes-lane-3/creds/r1\""),
            "{fewer}"
        );
        assert!(
            fewer.contains("path \"sys/leases/revoke/kubernetes-lane-3/creds/r1/*\""),
            "{fewer}"
        );
        assert_eq!(fewer.matches("path ").count(), 4, "{fewer}");
        // Nothing but those exact revocations is kept from an edited policy.
        let edited = format!(
            "{p}path \"secret/*\" {{\npath \"sys/leases/revoke/*\" {{\npath \"sys/leases/revoke/+/creds/r1/*\" {{\npath \"sys/leases/revoke/other/creds/r1/*\" {{\n"
        );
        assert_eq!(revocations_in(&edited, &roles()), kept);
    }

    #[test]
    fn a_role_binds_its_one_namespace_to_the_provisioned_role_of_its_name() {
        let b = role_body("r1", &roles().roles["r1"]);
        assert_eq!(b["allowed_kubernetes_namespaces"], json!(["demo-app"]));
        assert_eq!(b["kubernetes_role_name"], "r1");
        assert_eq!(b["kubernetes_role_type"], "Role");
        // Cleared, for a role an older setup wrote with generated rules.
        assert_eq!(b["generated_role_rules"], "");
        assert_eq!(b["service_account_name"], "");
    }

    #[test]
    fn the_cluster_roles_hold_the_rules_and_the_engine_may_bind_only_them() {
        let docs = cluster_roles(&roles(), ("vault", "openbao"));
        let kinds: Vec<String> = docs
            .iter()
            .map(|d| {
                format!(
                    "{} {}",
                    d["kind"].as_str().unwrap_or(""),
                    d["metadata"]["name"].as_str().unwrap_or("")
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "Role r1",
                "RoleBinding gateway-credential-issuer",
                "Role gateway-credential-binder",
                "RoleBinding gateway-credential-binder",
                "ValidatingAdmissionPolicy gateway-credential-bindings",
                "ValidatingAdmissionPolicyBinding gateway-credential-bindings",
                "ValidatingAdmissionPolicy gateway-credential-accounts",
                "ValidatingAdmissionPolicyBinding gateway-credential-accounts"
            ]
        );
        let vap = &docs[4]["spec"];
        assert_eq!(
            vap["matchConditions"][0]["expression"],
            "request.userInfo.username == 'system:serviceaccount:vault:openbao'"
        );
        assert_eq!(
            vap["validations"][0]["expression"],
            "request.operation == 'DELETE' || (variables.binding.roleRef.kind == 'Role' && ((variables.binding.metadata.namespace == 'demo-app' && variables.binding.roleRef.name in ['r1'])))"
        );
        // A name cannot break out of its CEL string.
        let mut odd = roles();
        let r = odd.roles.remove("r1").expect("r1");
        odd.roles.insert("x' || true || '".into(), r);
        let odd_docs = cluster_roles(&odd, ("vault", "openbao"));
        assert!(
            odd_docs[4]["spec"]["validations"][0]["expression"]
                .as_str()
                .is_some_and(|e| e.contains(r"in ['x\' || true || \'']")),
            "{}",
            odd_docs[4]["spec"]["validations"][0]["expression"]
        );
        assert_eq!(
            docs[0]["rules"],
            roles().roles["r1"].rules.iter().cloned().collect::<Value>()
        );
        assert_eq!(docs[0]["metadata"]["labels"][CREDENTIAL_ROLE_LABEL], "true");
        assert_eq!(
            docs[2]["rules"],
            json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["bind"], "resourceNames": ["r1"]}])
        );
        assert_eq!(docs[3]["subjects"][0]["name"], "openbao");
    }

    #[test]
    fn binding_drift_names_every_foreign_grant_of_a_credential_or_the_engine() {
        let docs = cluster_roles(&roles(), ("vault", "openbao"));
        let issuer_rules =
            json!([{"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["create"]}]);
        let issuer = json!({"rules": issuer_rules});
        let binding = |name: &str, kind: &str, role: &str, subjects: Value| {
            json!({"metadata": {"name": name, "namespace": "demo-app"},
                   "roleRef": {"kind": kind, "name": role}, "subjects": subjects})
        };
        let sa =
            |ns: &str| json!([{"kind": "ServiceAccount", "name": "gw-cred-x", "namespace": ns}]);
        // The engine's own bindings and a credential's: nothing to say.
        let mut ok = vec![
            docs[1].clone(),
            docs[3].clone(),
            binding("gw-cred-x", "Role", "r1", sa("demo-app")),
        ];
        ok.push(binding(
            "app",
            "Role",
            "someone-elses",
            json!([{"kind": "Group", "name": "devs"}]),
        ));
        assert_eq!(
            binding_drift(&docs, &ok, &[], Some(&issuer), &issuer_rules),
            Vec::<String>::new()
        );
        let bad = vec![
            binding(
                "everyone",
                "Role",
                "r1",
                json!([{"kind": "Group", "name": "system:authenticated"}]),
            ),
            binding("elsewhere", "Role", "r1", sa("other")),
            binding(
                "engine",
                "ClusterRole",
                ISSUER_CLUSTER_ROLE,
                json!([{"kind": "User", "name": "mallory"}]),
            ),
            binding("binder", "Role", BINDER_ROLE, sa("demo-app")),
            json!({"metadata": {"name": "stale", "namespace": "gone", "labels": {CREDENTIAL_ROLE_LABEL: "false"}},
                   "roleRef": {"kind": "Role", "name": BINDER_ROLE}, "subjects": sa("gone")}),
        ];
        let crb = json!({"metadata": {"name": "wide"}, "roleRef": {"kind": "ClusterRole", "name": ISSUER_CLUSTER_ROLE}});
        let widened = json!({"rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"]}]});
        let d = binding_drift(&docs, &bad, &[crb], Some(&widened), &issuer_rules);
        assert_eq!(d.len(), 7, "{d:#?}");
        for (i, what) in [
            "everyone",
            "elsewhere",
            "engine",
            "binder",
            "gone/stale",
            "ClusterRoleBinding wide",
            "has other rules",
        ]
        .iter()
        .enumerate()
        {
            assert!(d[i].contains(what), "{i}: {d:#?}");
        }
        assert!(binding_drift(&docs, &[], &[], None, &issuer_rules)[0].contains("is missing"));
    }

    #[test]
    fn drift_names_what_is_missing_changed_or_left_over() {
        let docs = cluster_roles(&roles(), ("vault", "openbao"));
        let same = |kind: &str, ns: &str, name: &str| {
            docs.iter()
                .find(|d| {
                    d["kind"] == kind
                        && d["metadata"]["namespace"].as_str().unwrap_or("") == ns
                        && d["metadata"]["name"] == name
                })
                .cloned()
        };
        // As the API server reads them back: lists in another order, an
        // empty resourceNames.
        let mut r1 = docs[0].clone();
        r1["rules"] = json!([{"verbs": ["list"], "resources": ["pods"], "apiGroups": [""], "resourceNames": []}]);
        let read_back = |kind: &str, ns: &str, name: &str| {
            if name == "r1" {
                Some(r1.clone())
            } else {
                same(kind, ns, name)
            }
        };
        assert_eq!(
            role_drift(&docs, read_back, &[docs[0].clone()]),
            Vec::<String>::new()
        );
        // A rule widened in the cluster, a binding gone, a stray role.
        let mut wide = docs[0].clone();
        wide["rules"][0]["verbs"] = json!(["list", "delete"]);
        let drifted = |kind: &str, ns: &str, name: &str| match name {
            "r1" => Some(wide.clone()),
            BINDER_ROLE if kind == "RoleBinding" => None,
            _ => same(kind, ns, name),
        };
        let stray = json!({"metadata": {"name": "old", "namespace": "demo-app"}});
        let d = role_drift(&docs, drifted, &[docs[0].clone(), stray]);
        assert_eq!(d.len(), 3, "{d:#?}");
        assert!(
            d[0].contains("Role demo-app/r1 has other rules") && d[0].contains("delete"),
            "{d:?}"
        );
        assert!(
            d[1].contains("RoleBinding demo-app/gateway-credential-binder is missing"),
            "{d:?}"
        );
        assert!(d[2].contains("Role demo-app/old is labelled"), "{d:?}");
    }
}
