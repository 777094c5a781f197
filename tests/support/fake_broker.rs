//! A broker double for the pipeline tests: records what it issued and
//! revoked, can fail revocations and be slow; everything else in those
//! tests is real.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use gateway::broker::{BoxFuture, Broker, BrokerError, CredentialMeta, IssuedCredential};
use gateway::policy::CredentialScope;
use gateway::sandbox::SecretFile;

/// Every lease gets its own token: `TOKEN` followed by the lease number.
pub const TOKEN: &str = "fake-minted-token-ZXhhbXBsZQ";

/// A broker double that records what it issued and revoked.
#[derive(Default)]
pub struct FakeBroker {
    pub issued: Mutex<Vec<CredentialScope>>,
    pub live: Mutex<BTreeSet<String>>,
    pub revoked: Mutex<Vec<String>>,
    pub fail_revokes: AtomicUsize,
    pub counter: AtomicUsize,
    /// Milliseconds each issue takes (a slow Vault).
    pub issue_delay_ms: std::sync::atomic::AtomicU64,
}

impl Broker for FakeBroker {
    fn issue<'a>(
        &'a self,
        _request_id: &'a str,
        scope: &'a CredentialScope,
    ) -> BoxFuture<'a, Result<IssuedCredential, BrokerError>> {
        Box::pin(async move {
            let delay = self.issue_delay_ms.load(Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(delay)).await;
            let n = self.counter.fetch_add(1, Ordering::SeqCst);
            let lease = format!("{}/creds/{}/lease-{n}", scope.mount, scope.role);
            self.issued.lock().expect("lock").push(scope.clone());
            self.live.lock().expect("lock").insert(lease.clone());
            Ok(IssuedCredential {
                lease_id: lease,
                secret: SecretFile::new(format!("{TOKEN}{n:04}").into_bytes()),
                ttl: Duration::from_secs(600),
                meta: CredentialMeta::Opaque,
            })
        })
    }

    fn revoke<'a>(&'a self, lease_id: &'a str) -> BoxFuture<'a, Result<(), BrokerError>> {
        Box::pin(async move {
            if self.fail_revokes.load(Ordering::SeqCst) > 0 {
                self.fail_revokes.fetch_sub(1, Ordering::SeqCst);
                return Err(BrokerError::Unreachable("injected failure".into()));
            }
            self.live.lock().expect("lock").remove(lease_id);
            self.revoked
                .lock()
                .expect("lock")
                .push(lease_id.to_string());
            Ok(())
        })
    }
}

/// Edit a copy of the default policies so that the offline demo module
/// needs a credential (scoped to demo-app, roles test-plan/test-apply,
/// defined for the Vault setup too): what the broker double then issues.
pub fn give_the_offline_module_a_credential(policies: &std::path::Path) {
    let scopes = policies.join("config/scopes/data.yaml");
    let text = std::fs::read_to_string(&scopes).expect("scopes").replace(
        "    credential: none\n",
        "    namespace: demo-app\n    roles:\n      terraform_plan: test-plan\n      terraform_apply: test-apply\n",
    );
    std::fs::write(&scopes, text).expect("write");
    let roles = policies.join("config/vault_roles/data.yaml");
    let mut text = std::fs::read_to_string(&roles).expect("roles");
    for role in ["test-plan", "test-apply"] {
        text.push_str(&format!(
            "  {role}:\n    mount: kubernetes\n    namespace: demo-app\n    default_ttl: 10m\n    max_ttl: 30m\n    rules: []\n"
        ));
    }
    std::fs::write(&roles, text).expect("write");
}

/// What a pipeline needs to hand a (fake) Kubernetes credential to a
/// sandbox: the API server's endpoint (nothing needs to listen on it) and
/// a CA for the kubeconfig around the token.
pub fn reach_a_stand_in_api_server(pipeline: &mut gateway::pipeline::Pipeline) {
    pipeline.endpoints.insert("kube-apiserver".into(), 16443);
    pipeline.kubernetes = Some(gateway::pipeline::KubernetesAccess {
        endpoint: "kube-apiserver".into(),
        ca_pem: b"-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n".to_vec(),
        tls_server_name: "kubernetes".into(),
    });
}
