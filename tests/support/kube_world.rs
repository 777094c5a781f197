//! A world for the Kubernetes tests that use a REAL OpenBao (`bao server
//! -dev`) whose Kubernetes secrets engine talks to the FAKE API server
//! (tests/support/fake_kube.rs), set up by the real `gateway vault setup`;
//! and a pipeline over it that runs real kubectl in real gVisor sandboxes.
//! Used by tests/broker_openbao.rs and tests/kubernetes_toolbox.rs.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common;
use crate::fake_kube::FakeKube;
use crate::openbao::OpenBao;
use gateway::broker::vault::{Secret, VaultAuth, VaultBroker, VaultSettings};
use gateway::pipeline::{KubernetesAccess, Pipeline};
use gateway::policy::PolicyStore;
use gateway::policy::set::LoadOptions;
use gateway::sandbox::local::{LocalConfig, LocalSandbox};
use gateway::tools::ToolPaths;
use serde_json::Value;

pub struct World {
    pub kube: FakeKube,
    pub bao: OpenBao,
    /// A token with only the `gateway` policy `vault setup` wrote.
    pub gateway_token: String,
    pub dir: tempfile::TempDir,
    pub home: PathBuf,
    pub ca_file: PathBuf,
    pub setup_output: String,
}

pub fn tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// OpenBao + the fake API server, set up by `gateway vault setup`.
pub async fn world() -> World {
    tls();
    let kube = FakeKube::start().await;
    let bao = tokio::task::spawn_blocking(OpenBao::start)
        .await
        .expect("bao");
    let dir = tempfile::tempdir().expect("tmp");
    let ca_file = dir.path().join("kube-ca.pem");
    std::fs::write(&ca_file, &kube.ca_pem).expect("ca");
    let jwt_file = dir.path().join("openbao-sa.jwt");
    std::fs::write(&jwt_file, &kube.openbao_jwt).expect("jwt");
    let home = dir.path().join("home");
    // The operator applies the cluster assets first (scripts/vault-setup.sh):
    // OpenBao's rights, and the credential roles made from the policies.
    let roles = common::gateway(&home)
        .args(["vault", "cluster-roles"])
        .output()
        .expect("vault cluster-roles");
    assert!(roles.status.success(), "{}", common::stderr(&roles));
    kube.with(|s| s.apply_cluster_assets(&common::stdout(&roles)));
    let out = common::gateway(&home)
        .args(["vault", "setup", "--kubernetes-host", &kube.url()])
        .arg("--kubernetes-ca-file")
        .arg(&ca_file)
        .arg("--service-account-jwt-file")
        .arg(&jwt_file)
        .args(["--approle", "--secret-id-file"])
        .arg(dir.path().join("secret-id"))
        .env("VAULT_ADDR", &bao.addr)
        .env("VAULT_TOKEN", &bao.root_token)
        .env_remove("AWS_ACCESS_KEY_ID")
        .output()
        .expect("vault setup");
    assert!(
        out.status.success(),
        "vault setup failed: {}{}",
        common::stdout(&out),
        common::stderr(&out)
    );
    let gateway_token = bao.token_with_policy("gateway");
    World {
        kube,
        bao,
        gateway_token,
        home,
        ca_file,
        setup_output: common::stdout(&out),
        dir,
    }
}

pub fn settings(addr: &str, token: &str) -> VaultSettings {
    VaultSettings {
        address: addr.to_string(),
        namespace: None,
        ca_cert: None,
        auth: VaultAuth::Token(Secret::from(token)),
        timeout: std::time::Duration::from_secs(5),
    }
}

pub fn pipeline(w: &World, broker: Arc<VaultBroker>) -> Arc<Pipeline> {
    pipeline_with(w, broker, &common::repo().join("policies"))
}

/// [`pipeline`] deciding with the policy dir `policies`.
pub fn pipeline_with(w: &World, broker: Arc<VaultBroker>, policies: &Path) -> Arc<Pipeline> {
    let store = Arc::new(PolicyStore::open(
        vec![policies.to_path_buf()],
        LoadOptions::default(),
    ));
    let sandbox = Arc::new(LocalSandbox::new(LocalConfig::default()).expect("runsc"));
    let mut tools = ToolPaths::discover(&common::repo());
    tools.runner = common::runner_bin();
    let mut p =
        Pipeline::new(store, w.home.clone(), common::repo(), sandbox, tools).expect("pipeline");
    p.endpoints = BTreeMap::from([("kube-apiserver".to_string(), w.kube.port)]);
    p.kubernetes = Some(KubernetesAccess {
        endpoint: "kube-apiserver".into(),
        ca_pem: std::fs::read(&w.ca_file).expect("ca"),
        tls_server_name: "kubernetes".into(),
    });
    p.broker = Some(broker);
    Arc::new(p)
}

pub fn trail(home: &Path, rid: &str) -> Vec<String> {
    std::fs::read_to_string(home.join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["request_id"] == rid)
        .filter_map(|e| e["event"].as_str().map(str::to_string))
        .collect()
}

/// Every byte the gateway wrote under its home, as text.
pub fn everything_written(home: &Path) -> String {
    let mut all = String::new();
    for entry in std::fs::read_dir(home).expect("home").flatten() {
        if entry.path().is_file() {
            all.push_str(&String::from_utf8_lossy(
                &std::fs::read(entry.path()).unwrap_or_default(),
            ));
        }
    }
    all
}
