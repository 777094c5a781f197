//! Paths and settings shared by every command.

pub mod http;
pub mod store;
pub mod telemetry;

use std::path::PathBuf;

/// The gateway's state directory (approvals, audit log, saved plans) when
/// neither `--home` nor `GATEWAY_HOME` names one: `$XDG_STATE_HOME/gateway`,
/// else `~/.local/state/gateway`, else `./.gateway` when no home is known.
pub fn default_home() -> PathBuf {
    if let Some(state) = std::env::var_os("XDG_STATE_HOME").filter(|s| !s.is_empty()) {
        return PathBuf::from(state).join("gateway");
    }
    if let Some(home) = std::env::var_os("HOME").filter(|s| !s.is_empty()) {
        return PathBuf::from(home).join(".local/state/gateway");
    }
    PathBuf::from(".gateway")
}

/// `gateway.toml` (README.md: command line). Every key is optional; a flag or `GATEWAY_*`
/// environment variable overrides the file, and the file overrides the
/// defaults, which work on one machine with no file at all.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// Policy dir (default `./policies`).
    pub policies: Option<PathBuf>,
    /// State dir: approvals, audit log, saved plans.
    pub home: Option<PathBuf>,
    /// `gateway daemon`: its socket and the workspaces it serves.
    #[serde(default)]
    pub daemon: DaemonConfig,
    /// Endpoint names a decision may allow, with their TCP port on this host.
    #[serde(default)]
    pub endpoints: std::collections::BTreeMap<String, u16>,
    #[serde(default)]
    pub sandbox: SandboxConfig,
    /// The credential broker (README.md: credentials); no address anywhere (file or
    /// `VAULT_ADDR`) means no broker.
    #[serde(default)]
    pub vault: gateway_broker::vault::VaultConfig,
    /// How sandboxes reach the Kubernetes API server with a minted token.
    pub kubernetes: Option<gateway_broker::kubeconfig::KubernetesConfig>,
    /// `gateway daemon`: load the policy set from a signed bundle (a file
    /// or an https:// URL) instead of the policy dir.
    pub policy_bundle: Option<gateway_policy::bundle::BundleConfig>,
    /// `gateway daemon`: also serve remote MCP over HTTPS, for agents
    /// signed in with an OpenID provider (README.md: team gateway).
    pub http: Option<http::HttpConfig>,
    /// Where approvals are kept: SQLite under `home` (the default) or a
    /// PostgreSQL database shared by replicas (README.md: replicas).
    #[serde(default)]
    pub store: store::StoreConfig,
    /// `gateway daemon`: metrics and traces (README.md: "Watching it").
    #[serde(default)]
    pub telemetry: telemetry::TelemetryConfig,
    /// `gateway daemon`: ship the audit trail to a SIEM.
    pub audit_export: Option<telemetry::AuditExportConfig>,
}

/// Where the daemon's files are when neither its flags nor its
/// configuration say otherwise.
pub const DAEMON_CONFIG: &str = "/etc/gateway/gateway.toml";
pub const DAEMON_POLICIES: &str = "/etc/gateway/policies";
pub const DAEMON_STATE: &str = "/var/lib/gateway";
pub const DAEMON_SOCKET: &str = "/run/gateway/gateway.sock";
pub const DAEMON_GROUP: &str = "gateway";
/// Where `daemon install` puts root's copies of the gateway, the runner and
/// the tools a call runs (`bin/gateway`, `bin/gateway-runner`, and the
/// `.tools/` layout `scripts/install-tools.sh` makes, where the daemon
/// finds them beside its binary).
pub const DAEMON_LIB: &str = "/usr/local/lib/gateway";

/// `[daemon]`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    /// The Unix socket MCP fronts and operator commands connect to
    /// (default /run/gateway/gateway.sock).
    pub socket: Option<PathBuf>,
    /// The group that may connect (default `gateway`); the socket is 0660.
    pub socket_group: Option<String>,
    /// When set, a session's workspace must lie below one of these dirs
    /// (and, always, belong to the connecting user).
    #[serde(default)]
    pub workspace_roots: Vec<PathBuf>,
    /// At SIGTERM/SIGINT, how long the daemon waits for the calls it
    /// cancels to end and for their credentials to be revoked, in all
    /// (default 10). What is not revoked by then stays in the lease
    /// ledger, and the next start revokes it.
    pub shutdown_grace_seconds: Option<u64>,
    /// Dirs that are volumes of the daemon's own pod, which no other user
    /// can reach (a Kubernetes emptyDir for its state and socket): the
    /// kubelet makes them mode 0777, and their write bits are not held
    /// against them. Each must be a mount point (deploy/kubernetes).
    #[serde(default)]
    pub private_volumes: Vec<PathBuf>,
    /// The daemon's pod's ConfigMap, Secret and projected volumes (and a
    /// Secret file mounted by subPath), each a mount point: the kubelet
    /// makes their dirs mode 0777, but they are mounted read-only, which
    /// is checked at every use. What lies on one is not refused for its
    /// write bits; a Secret file on one may be read by the pod's fsGroup
    /// (`[store] url_file`). Only for a pod (deploy/kubernetes).
    #[serde(default)]
    pub read_only_volumes: Vec<PathBuf>,
    /// How often, in seconds, a long call sends MCP progress when nothing
    /// else happens (1 to 10, default 5): clients that give up on a
    /// silent request keep waiting.
    pub progress_seconds: Option<u64>,
}

#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxConfig {
    /// `local` (gVisor on this host) or `kubernetes` (a gVisor Job per call).
    #[serde(default = "default_backend")]
    pub backend: String,
    /// The runsc binary (default: found on PATH).
    pub runsc: Option<PathBuf>,
    /// runsc platform: ptrace (works everywhere) or kvm.
    #[serde(default = "default_platform")]
    pub platform: String,
    /// The trusted Terraform provider mirror (local backend): the only
    /// place `terraform init` in a sandbox takes providers from. None: no
    /// provider but Terraform's built-in one can be used.
    pub provider_mirror: Option<PathBuf>,
    /// The kubernetes backend (`backend = "kubernetes"`).
    #[serde(default)]
    pub kubernetes: gateway_sandbox::kubernetes::KubeSandboxConfig,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            backend: default_backend(),
            runsc: None,
            platform: default_platform(),
            provider_mirror: None,
            kubernetes: gateway_sandbox::kubernetes::KubeSandboxConfig::default(),
        }
    }
}

fn default_backend() -> String {
    "local".into()
}

fn default_platform() -> String {
    "ptrace".into()
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config {path} is not valid: {message}")]
    Invalid { path: PathBuf, message: String },
}

impl GatewayConfig {
    /// Load `path`; `required == false` means a missing file is the empty config.
    /// The `[store]` the file names, its connection string read from a
    /// file its owner alone reads, or from a Secret on one of the daemon's
    /// pod's read-only volumes.
    pub fn store(&self) -> Result<store::Store, store::StoreConfigError> {
        self.store.resolve_in(&self.secret_volumes())
    }

    /// Where this daemon may read a Secret volume's files.
    pub fn secret_volumes(&self) -> store::SecretVolumes {
        store::SecretVolumes {
            read_only: self.daemon.read_only_volumes.clone(),
            not_group: Some(
                self.daemon
                    .socket_group
                    .clone()
                    .unwrap_or_else(|| DAEMON_GROUP.to_string()),
            ),
        }
    }

    /// The approval page's session key (`[http] session_key_file`): the
    /// SHA-256 of the file's contents, which must be at least 32
    /// characters; `None` when no file is named.
    pub fn page_session_key(&self) -> Result<Option<[u8; 32]>, String> {
        let Some(path) = self.http.as_ref().and_then(|h| h.session_key_file.as_ref()) else {
            return Ok(None);
        };
        let text = store::read_secret_file(path, &self.secret_volumes())
            .map_err(|e| format!("[http] session_key_file {}: {e}", path.display()))?;
        let key = text.trim();
        if key.len() < 32 {
            return Err(format!(
                "[http] session_key_file {}: at least 32 characters (e.g. openssl rand -base64 48)",
                path.display()
            ));
        }
        use sha2::Digest;
        Ok(Some(sha2::Sha256::digest(key.as_bytes()).into()))
    }

    /// The audit export's sink and signing key (`[audit_export]`), read
    /// and checked: its token and key files are secrets (owner-only).
    pub fn audit_export_sink(
        &self,
    ) -> Result<
        Option<(
            gateway_audit::audit::export::Sink,
            Option<ssh_key::PrivateKey>,
        )>,
        String,
    > {
        let Some(x) = &self.audit_export else {
            return Ok(None);
        };
        let secret = |what: &str, p: &std::path::Path| {
            store::read_secret_file(p, &self.secret_volumes())
                .map_err(|e| format!("[audit_export] {what} {}: {e}", p.display()))
        };
        let token = match &x.token_file {
            Some(p) => Some(secret("token_file", p)?.trim().to_string()),
            None => None,
        };
        let ca = match &x.ca_file {
            Some(p) => Some(
                std::fs::read(p)
                    .map_err(|e| format!("[audit_export] ca_file {}: {e}", p.display()))?,
            ),
            None => None,
        };
        if x.name.is_empty()
            || x.name.len() > 64
            || !x
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(format!(
                "[audit_export] name {:?}: 1 to 64 letters, digits, - or _",
                x.name
            ));
        }
        let sink = gateway_audit::audit::export::Sink::new(&x.sink, &x.url, token, ca.as_deref())
            .map_err(|e| e.to_string())?;
        let key = match &x.signing_key_file {
            Some(p) => Some(
                gateway_audit::audit::export::signing_key(&secret("signing_key_file", p)?)
                    .map_err(|e| e.to_string())?,
            ),
            None => None,
        };
        Ok(Some((sink, key)))
    }

    pub fn load(path: &std::path::Path, required: bool) -> Result<GatewayConfig, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
                return Ok(GatewayConfig::default());
            }
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        let cfg: GatewayConfig = toml::from_str(&text).map_err(|e| ConfigError::Invalid {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        if !matches!(cfg.sandbox.backend.as_str(), "local" | "kubernetes") {
            return Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                message: format!(
                    "sandbox.backend {:?}: \"local\" or \"kubernetes\"",
                    cfg.sandbox.backend
                ),
            });
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_files_parse_and_refuse_unknown_keys() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("gateway.toml");
        std::fs::write(&p, "policies = \"p\"\n[daemon]\nworkspace_roots = [\"/home\"]\n[endpoints]\nkube-apiserver = 6443\n[sandbox]\nplatform = \"kvm\"\n").expect("write");
        let c = GatewayConfig::load(&p, true).expect("valid");
        assert_eq!(c.endpoints["kube-apiserver"], 6443);
        assert_eq!(c.sandbox.platform, "kvm");
        assert_eq!(c.sandbox.backend, "local");
        std::fs::write(&p, "polices = \"typo\"\n").expect("write");
        assert!(
            GatewayConfig::load(&p, true)
                .expect_err("typo")
                .to_string()
                .contains("unknown field `polices`")
        );
        std::fs::write(&p, "[sandbox]\nbackend = \"nomad\"\n").expect("write");
        assert!(GatewayConfig::load(&p, true).is_err());
        std::fs::write(
            &p,
            "[sandbox]\nbackend = \"kubernetes\"\n[sandbox.kubernetes]\nnamespace = \"sb\"\nworkspace_pvc = \"ws\"\n[sandbox.kubernetes.endpoint_addresses]\nkube-apiserver = \"172.18.0.2\"\n",
        )
        .expect("write");
        let c = GatewayConfig::load(&p, true).expect("kubernetes backend");
        assert_eq!(c.sandbox.kubernetes.namespace, "sb");
        assert_eq!(c.sandbox.kubernetes.runtime_class, "gvisor");
        assert_eq!(
            c.sandbox.kubernetes.endpoint_addresses["kube-apiserver"],
            "172.18.0.2"
        );
        assert!(GatewayConfig::load(&dir.path().join("none.toml"), false).is_ok());
        assert!(GatewayConfig::load(&dir.path().join("none.toml"), true).is_err());
    }

    #[test]
    fn the_example_config_is_valid() {
        let example = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .join("examples/gateway.toml");
        let c = GatewayConfig::load(&example, true).expect("examples/gateway.toml parses");
        assert_eq!(
            c.policies.as_deref(),
            Some(std::path::Path::new("/etc/gateway/policies"))
        );
        assert_eq!(c.daemon.socket_group.as_deref(), Some("gateway"));
    }
}

#[cfg(test)]
mod session_key_tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn with_key(file: &std::path::Path) -> GatewayConfig {
        let text = format!(
            "[http]\nlisten = \"127.0.0.1:1\"\nresource = \"https://gw.example/mcp\"\nworkspace = \"/w\"\nsession_key_file = {file:?}\n"
        );
        toml::from_str(&text).expect("config")
    }

    #[test]
    fn the_page_session_key_is_a_private_file_of_enough_randomness() {
        let dir = tempfile::tempdir().expect("dir");
        let f = dir.path().join("key");
        std::fs::write(&f, "x".repeat(48)).expect("write");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let a = with_key(&f)
            .page_session_key()
            .expect("read")
            .expect("a key");
        // The same file gives every replica the same key.
        assert_eq!(Some(a), with_key(&f).page_session_key().expect("read"));
        // Readable by others: refused, naming the file.
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let e = with_key(&f)
            .page_session_key()
            .expect_err("group/world readable");
        assert!(e.contains("session_key_file"), "{e}");
        // Too short.
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::fs::write(&f, "short").expect("write");
        assert!(with_key(&f).page_session_key().is_err());
        // None named: none.
        assert_eq!(GatewayConfig::default().page_session_key(), Ok(None));
    }
}
