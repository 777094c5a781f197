//! The kubeconfig a sandbox's kubectl (or Terraform's kubernetes provider)
//! uses: the API server by its endpoint name, its CA, and the minted token
//! read from the credential file (`tokenFile`) — the token itself is never
//! written into the kubeconfig, an env var or an argument.

use base64::Engine as _;
use serde_json::json;

/// How the sandbox reaches the Kubernetes API server (gateway.toml
/// `[kubernetes]`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesConfig {
    /// The endpoint name (a key of `[endpoints]`, and what the policy's
    /// `egress` names) the API server is reached as.
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    /// PEM file of the CA that signed the API server's certificate.
    pub ca_file: std::path::PathBuf,
    /// The name the API server's certificate is checked against (every
    /// kubeadm/kind API server certificate carries `kubernetes`).
    #[serde(default = "default_server_name")]
    pub tls_server_name: String,
}

fn default_endpoint() -> String {
    "kube-apiserver".into()
}

fn default_server_name() -> String {
    "kubernetes".into()
}

/// A kubeconfig (JSON, which kubectl reads as YAML) for `server` with the
/// CA in `ca_pem`, authenticating with the token in `token_file`.
pub fn kubeconfig(
    server: &str,
    ca_pem: &[u8],
    tls_server_name: &str,
    token_file: &str,
    namespace: &str,
) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "gateway", "cluster": {
            "server": server,
            "certificate-authority-data": ca,
            "tls-server-name": tls_server_name,
        }}],
        "users": [{"name": "gateway", "user": {"tokenFile": token_file}}],
        "contexts": [{"name": "gateway", "context": {"cluster": "gateway", "user": "gateway", "namespace": namespace}}],
        "current-context": "gateway",
        "preferences": {},
    });
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubeconfig_points_at_the_token_file_and_carries_no_token() {
        let k = kubeconfig(
            "https://kube-apiserver:6443",
            b"-----BEGIN CERTIFICATE-----\nX\n-----END CERTIFICATE-----\n",
            "kubernetes",
            "/run/gateway/credential",
            "demo-app",
        );
        let v: serde_json::Value = serde_json::from_str(&k).expect("json");
        assert_eq!(
            v["users"][0]["user"],
            json!({"tokenFile": "/run/gateway/credential"})
        );
        assert_eq!(v["clusters"][0]["cluster"]["tls-server-name"], "kubernetes");
        assert_eq!(v["contexts"][0]["context"]["namespace"], "demo-app");
        let ca = v["clusters"][0]["cluster"]["certificate-authority-data"]
            .as_str()
            .expect("ca");
        let pem = base64::engine::general_purpose::STANDARD
            .decode(ca)
            .expect("b64");
        assert!(pem.starts_with(b"-----BEGIN CERTIFICATE-----"));
    }
}
