//! `gateway policy eval|test|check|build|sign|verify`: the policy author's
//! tools.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Subcommand, ValueEnum};

use super::Cli;
use crate::policy::set::LoadOptions;
use crate::policy::{DecisionInput, PlanInput, PolicySet, Principal, bundle, plan, testing};

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Print the decision the server would get for a call, as JSON.
    Eval(EvalArgs),
    /// Run the Rego unit tests (every `test_*` rule), like `opa test`.
    Test(TestArgs),
    /// Load and compile the policy set only (for editors and CI).
    Check(CheckArgs),
    /// Make a policy bundle (OPA's format, a .tar.gz) of a policy dir that
    /// loads and compiles; signed when --signing-key is given.
    Build(BuildArgs),
    /// Sign a bundle (.tar.gz), in place or to --output: its
    /// .signatures.json lists every file's digest, signed with your key.
    Sign(SignArgs),
    /// Check a bundle's signature and digests with a public key, as the
    /// daemon does before it loads one, and that its policy set compiles.
    Verify(VerifyArgs),
    /// Write a policy dir that loads and compiles as a Kustomize component
    /// for deploy/kubernetes: a ConfigMap of its files, and the
    /// Deployment's volume placing each at its path (ConfigMap keys cannot
    /// hold a `/`).
    Configmap(ConfigmapArgs),
}

#[derive(Debug, clap::Args)]
pub struct ConfigmapArgs {
    /// The policy dir [default: the --policies dir].
    dir: Option<PathBuf>,
    /// The component's dir (kustomization.yaml, policies.yaml and, when
    /// the policies define credential roles, credential-roles.yaml are
    /// written there).
    #[arg(short, long)]
    output: PathBuf,
    /// The service account Vault/OpenBao's Kubernetes secrets engine runs
    /// as (it may bind the credential Roles).
    #[arg(long, value_name = "NAMESPACE/NAME", default_value = "vault/openbao")]
    engine_service_account: String,
    /// The ConfigMap's name (the Deployment's `policies` volume names it).
    #[arg(long, default_value = "gateway-policies")]
    name: String,
    /// The gateway's namespace.
    #[arg(long, default_value = "gateway-sandbox")]
    namespace: String,
}

/// The credential roles' file of the policy component.
const ROLES_FILE: &str = "credential-roles.yaml";

/// The label of a workload whose `policies` volume mounts the ConfigMap.
const POLICIES_LABEL: &str = "gateway.dev/policies";

#[derive(Debug, clap::Args)]
pub struct SigningArgs {
    /// The private key (PEM, PKCS#8: `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256`).
    #[arg(long)]
    signing_key: Option<PathBuf>,
    /// RS256/384/512, PS256/384/512, ES256/384 or EdDSA.
    #[arg(long, default_value = "ES256")]
    signing_alg: String,
    /// The key's id (the daemon's [[policy_bundle.keys]] id).
    #[arg(long, default_value = "policy")]
    key_id: String,
}

#[derive(Debug, clap::Args)]
pub struct BuildArgs {
    /// The policy dir [default: the --policies dir].
    dir: Option<PathBuf>,
    /// The bundle to write.
    #[arg(short, long)]
    output: PathBuf,
    /// The manifest's revision [default: the policy set's fingerprint].
    #[arg(long)]
    revision: Option<String>,
    #[command(flatten)]
    signing: SigningArgs,
}

#[derive(Debug, clap::Args)]
pub struct SignArgs {
    /// The bundle (.tar.gz).
    bundle: PathBuf,
    /// Where to write the signed bundle [default: over the input, by rename].
    #[arg(short, long)]
    output: Option<PathBuf>,
    #[command(flatten)]
    signing: SigningArgs,
}

#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// The bundle (.tar.gz).
    bundle: PathBuf,
    /// The public key (PEM).
    #[arg(long)]
    public_key: PathBuf,
    /// The key's algorithm.
    #[arg(long, default_value = "ES256")]
    algorithm: String,
    /// The key's id.
    #[arg(long, default_value = "policy")]
    key_id: String,
    /// The scope the signature must carry (default: none).
    #[arg(long, default_value = "")]
    scope: String,
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
        PolicyCommand::Build(a) => build(cli, a),
        PolicyCommand::Sign(a) => sign(a),
        PolicyCommand::Verify(a) => verify(a),
        PolicyCommand::Configmap(a) => configmap(cli, a),
    }
}

/// The most a ConfigMap may hold (the API server refuses more than 1 MiB
/// in all; this leaves room for its metadata).
const CONFIGMAP_MAX_BYTES: usize = 1_000_000;

/// A ConfigMap key for a policy file's relative path: `/` is `__`, the
/// only change (the key must match `[-._a-zA-Z0-9]+`).
fn configmap_key(relative: &str) -> anyhow::Result<String> {
    let key = relative.replace('/', "__");
    if key.is_empty()
        || key.len() > 253
        || !key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        || relative
            .split('/')
            .any(|c| c.contains("__") || c.starts_with('_') || c.ends_with('_'))
    {
        bail!(
            "{relative}: a ConfigMap key may hold only letters, digits, '-', '_' and '.' (and this one maps '/' to '__', so no part of the path may hold '__' or begin or end with '_'): rename the file, or deploy a signed bundle ([policy_bundle]) instead"
        );
    }
    Ok(key)
}

fn configmap(cli: &Cli, a: &ConfigmapArgs) -> anyhow::Result<ExitCode> {
    let dir = a.dir.clone().unwrap_or_else(|| cli.policies.clone());
    let set = PolicySet::load(std::slice::from_ref(&dir), &LoadOptions::default())
        .with_context(|| format!("the policy set in {}", dir.display()))?;
    let sources = crate::policy::loader::Sources::read(std::slice::from_ref(&dir))?;
    let mut data = serde_json::Map::new();
    let mut items = Vec::new();
    let mut total = 0;
    for f in &sources.files {
        let key = configmap_key(&f.relative)?;
        if data.contains_key(&key) {
            bail!(
                "{} and another file map to the same ConfigMap key {key}: rename one",
                f.relative
            );
        }
        total += key.len() + f.content.len();
        items.push(serde_json::json!({"key": key, "path": f.relative}));
        data.insert(key, serde_json::Value::String(f.content.clone()));
    }
    if total > CONFIGMAP_MAX_BYTES {
        bail!(
            "the policy set is {total} bytes: more than a ConfigMap holds (1 MiB); deploy a signed bundle ([policy_bundle]) instead"
        );
    }
    let header = format!(
        "# Generated by `gateway policy configmap` from {} (policy set {}).\n# Do not edit: change the policies and run it again.\n",
        dir.display(),
        set.fingerprint
    );
    let configmap = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": a.name,
            "namespace": a.namespace,
            "labels": {"app.kubernetes.io/part-of": "gateway"},
        },
        "data": data,
    });
    // The cluster Roles the policies' credentials are bound to, made from
    // the same set: they deploy together, and never drift apart.
    let roles = match set.data("data.config.vault_roles")? {
        Some(v) => {
            let roles: crate::broker::setup::VaultRoles = serde_json::from_value(v)
                .context("config/vault_roles/data.yaml does not match the expected shape")?;
            let (ns, sa) = a
                .engine_service_account
                .split_once('/')
                .context("--engine-service-account takes NAMESPACE/NAME")?;
            Some(super::vault::cluster_roles_manifest(&roles, (ns, sa))?)
        }
        None => None,
    };
    let mut resources = vec!["policies.yaml"];
    if roles.is_some() {
        resources.push(ROLES_FILE);
    }
    let component = serde_json::json!({
        "apiVersion": "kustomize.config.k8s.io/v1alpha1",
        "kind": "Component",
        "resources": resources,
        "patches": [{
            // Every workload that mounts the policies says so by a label:
            // the Deployment, and the verify Job.
            "target": {"labelSelector": format!("{POLICIES_LABEL}=mounted")},
            "patch": serde_saphyr::to_string(&serde_json::json!({
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "any"},
                "spec": {"template": {"spec": {"volumes": [{
                    "name": "policies",
                    "configMap": {"name": a.name, "items": items},
                }]}}},
            }))?,
        }],
    });
    std::fs::create_dir_all(&a.output)
        .with_context(|| format!("creating {}", a.output.display()))?;
    for (name, doc) in [
        ("policies.yaml", &configmap),
        ("kustomization.yaml", &component),
    ] {
        let text = format!("{header}{}", serde_saphyr::to_string(doc)?);
        write_by_rename(&a.output.join(name), text.as_bytes())?;
    }
    let roles_path = a.output.join(ROLES_FILE);
    match &roles {
        Some(text) => write_by_rename(&roles_path, text.as_bytes())?,
        None if roles_path.exists() => std::fs::remove_file(&roles_path)
            .with_context(|| format!("removing {}", roles_path.display()))?,
        None => {}
    }
    println!(
        "wrote {} ({} files, policy set {})",
        a.output.display(),
        sources.files.len(),
        set.fingerprint
    );
    Ok(ExitCode::SUCCESS)
}

fn signing_key(a: &SigningArgs) -> anyhow::Result<Option<bundle::SigningKey>> {
    let Some(path) = &a.signing_key else {
        return Ok(None);
    };
    let pem = std::fs::read(path).with_context(|| format!("the signing key {}", path.display()))?;
    bundle::SigningKey::from_pem(&a.key_id, &a.signing_alg, &pem)
        .map(Some)
        .map_err(|e| anyhow::anyhow!("the signing key {}: {e}", path.display()))
}

/// Write `bytes` to `path` by rename (never half-written where it is read).
fn write_by_rename(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or_else(|| std::path::Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("a temporary file in {}", dir.display()))?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn build(cli: &Cli, a: &BuildArgs) -> anyhow::Result<ExitCode> {
    let dir = a.dir.clone().unwrap_or_else(|| cli.policies.clone());
    // The set must load and compile before it is packed.
    let set = PolicySet::load(std::slice::from_ref(&dir), &LoadOptions::default())
        .with_context(|| format!("the policy set in {}", dir.display()))?;
    let sources = crate::policy::loader::Sources::read(std::slice::from_ref(&dir))?;
    let mut files = Vec::new();
    for f in &sources.files {
        // Data goes in as data.json: OPA and the gateway then read the same
        // document (no YAML dialect between them), hashed as JSON.
        let (name, bytes) = match f.kind {
            crate::policy::loader::FileKind::Yaml => {
                let value = regorus::Value::from_yaml_str(&f.content)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", f.display))?;
                let json = serde_json::to_value(&value)?;
                // JSON keys are strings: YAML keys that are numbers or
                // booleans would load differently from the bundle.
                if regorus::Value::from(json.clone()) != value {
                    bail!(
                        "{}: a key that is not a string (a number or a boolean) cannot be carried as JSON data; quote it",
                        f.display
                    );
                }
                let json = serde_json::to_vec(&json)?;
                let dir = f.relative.rsplit_once('/').map(|(d, _)| d);
                let name = match dir {
                    Some(d) => format!("{d}/data.json"),
                    None => "data.json".to_string(),
                };
                (name, json)
            }
            _ => (f.relative.clone(), f.content.clone().into_bytes()),
        };
        if files.iter().any(|b: &bundle::BundleFile| b.name == name) {
            bail!("{name} comes from two files in {}", dir.display());
        }
        files.push(bundle::BundleFile { name, bytes });
    }
    let manifest = bundle::Manifest {
        revision: Some(
            a.revision
                .clone()
                .unwrap_or_else(|| set.fingerprint.clone()),
        ),
        roots: Some(vec![String::new()]),
        metadata: None,
    };
    files.push(bundle::BundleFile {
        name: bundle::MANIFEST.into(),
        bytes: serde_json::to_vec(&manifest)?,
    });
    let signed = match signing_key(&a.signing)? {
        Some(key) => bundle::sign(&files, &key)?,
        None => files,
    };
    write_by_rename(&a.output, &bundle::pack(&signed)?)?;
    println!(
        "wrote {} ({} files, revision {}){}",
        a.output.display(),
        signed.len(),
        manifest.revision.unwrap_or_default(),
        if a.signing.signing_key.is_some() {
            ", signed"
        } else {
            ", not signed: gateway policy sign it before a daemon can load it"
        }
    );
    Ok(ExitCode::SUCCESS)
}

fn sign(a: &SignArgs) -> anyhow::Result<ExitCode> {
    let key = signing_key(&a.signing)?.context("--signing-key is required")?;
    let bytes = std::fs::read(&a.bundle).with_context(|| format!("{}", a.bundle.display()))?;
    let files = bundle::unpack(&bytes)?;
    let signed = bundle::sign(&files, &key)?;
    let out = a.output.clone().unwrap_or_else(|| a.bundle.clone());
    write_by_rename(&out, &bundle::pack(&signed)?)?;
    println!(
        "signed {} with key {:?} ({}): {} files",
        out.display(),
        key.id,
        a.signing.signing_alg,
        signed.len() - 1
    );
    Ok(ExitCode::SUCCESS)
}

fn verify(a: &VerifyArgs) -> anyhow::Result<ExitCode> {
    let key = bundle::VerificationKey::load(&bundle::KeyConfig {
        id: a.key_id.clone(),
        algorithm: a.algorithm.clone(),
        public_key: a.public_key.clone(),
        scope: a.scope.clone(),
    })?;
    let bytes = std::fs::read(&a.bundle).with_context(|| format!("{}", a.bundle.display()))?;
    let files = bundle::unpack(&bytes)?;
    let verified = bundle::verify(&files, std::slice::from_ref(&key))?;
    let sources = crate::policy::loader::Sources::from_bundle("bundle", &files)?;
    let set = PolicySet::from_sources(&sources, &LoadOptions::default())?;
    println!(
        "verified: signed with key {:?}, revision {}, {} files; the policy set compiles (fingerprint {})",
        verified.key_id,
        verified.revision.as_deref().unwrap_or("(none)"),
        files.len() - 1,
        set.fingerprint
    );
    Ok(ExitCode::SUCCESS)
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
        // What --input says the gateway read of the upstreams, if anything.
        let upstreams = base
            .get("upstreams")
            .cloned()
            .unwrap_or_else(|| serde_json::json!({}));
        let list = set.tool_list(&principal, &upstreams)?;
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
                "`principal` in --input must be an object {{\"client\", \"os_user\", \"uid\", \"groups\"}} or an SSO principal {{\"kind\": \"sso\", ...}}"
            );
        };
        // An SSO principal has no OS user; an OS user given is its `user`.
        if given.get("kind").and_then(|k| k.as_str()) == Some("sso")
            && let Some(m) = principal.as_object_mut()
        {
            m.remove("os_user");
            m.remove("uid");
            m.remove("user");
        }
        if given.contains_key("os_user")
            && !given.contains_key("user")
            && let Some(m) = principal.as_object_mut()
        {
            m.remove("user");
        }
        for (k, v) in given {
            principal[k] = v.clone();
        }
    }
    let principal: Principal = serde_json::from_value::<Principal>(principal)
        .context(
            "`principal` in --input must be {\"client\": string, \"os_user\": string, \"uid\": number, \"groups\": [string]} (an OS user) or {\"kind\": \"sso\", \"client\", \"user\", \"groups\", \"issuer\", \"subject\", \"email\", \"client_id\"}",
        )?
        .normalized();
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
    // A Kubernetes change's plan (live, planned, changes), as given.
    if let Some(k) = base.get("kubernetes") {
        input.kubernetes = Some(k.clone());
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
    if let Some(u) = base.get("upstreams") {
        input.upstreams = Some(u.clone());
    }
    let evaluation = match PolicySet::load(std::slice::from_ref(&cli.policies), &opts) {
        Ok(set) => {
            // An upstream's tool: its arguments checked against the locked
            // input schema, as the server checks them.
            input.schema_violations = set.schema_violations(&input.tool, &input.params);
            set.decide(&input)
        }
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

#[cfg(test)]
mod tests {
    use super::configmap_key;

    #[test]
    fn configmap_keys_map_paths_one_to_one() {
        assert_eq!(
            configmap_key("config/tools/data.yaml").expect("key"),
            "config__tools__data.yaml"
        );
        // Each of these could collide with another path's key.
        for bad in [
            "x_/y.rego",
            "x/_y.rego",
            "a__b.rego",
            "d/x y.rego",
            "d/é.rego",
        ] {
            assert!(configmap_key(bad).is_err(), "{bad}");
        }
    }
}
