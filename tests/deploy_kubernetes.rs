//! deploy/kubernetes rendered as a platform engineer applies it: every
//! overlay (and the verify Job) through the real `kubectl kustomize`, each
//! object parsed strictly into its k8s-openapi type, each pod template held
//! to the Pod Security `restricted` profile, the gateway's RBAC read from the
//! rendered Roles, and the whole apply played, in the rendered order,
//! against the FAKE API server (no real one can run here: tests/support/
//! fake_kube.rs, which refuses an object whose namespace does not exist yet
//! and enforces the rendered RBAC as the real one does).

mod common;
#[path = "support/fake_kube.rs"]
mod fake_kube;
#[path = "support/openbao.rs"]
mod openbao;
#[path = "support/postgres.rs"]
mod pg;

use std::collections::BTreeSet;
use std::path::Path;

use common::strict;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolumeClaim, PodSpec, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde_json::{Value, json};

const TARGETS: [&str; 3] = ["overlays/kind", "overlays/production", "verify"];
const NS: &str = "gateway-sandbox";

/// `kubectl kustomize deploy/kubernetes/<target>`, its documents in order.
fn render(target: &str) -> Vec<Value> {
    let dir = common::repo().join("deploy/kubernetes").join(target);
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .expect("kubectl (scripts/bootstrap.sh installs it)");
    assert!(
        out.status.success(),
        "kubectl kustomize {target}: {}",
        common::stderr(&out)
    );
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&common::stdout(&out)).expect("rendered YAML");
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn name(d: &Value) -> String {
    format!(
        "{} {}/{}",
        d["kind"].as_str().unwrap_or(""),
        d["metadata"]["namespace"].as_str().unwrap_or(""),
        d["metadata"]["name"].as_str().unwrap_or("")
    )
}

/// The pod template of a workload, typed.
fn pod_spec(target: &str, d: &Value) -> Option<PodSpec> {
    match d["kind"].as_str()? {
        "Deployment" => strict::<Deployment>(target, d).spec?.template.spec,
        "StatefulSet" => strict::<StatefulSet>(target, d).spec?.template.spec,
        "Job" => strict::<Job>(target, d).spec?.template.spec,
        _ => None,
    }
}

#[test]
fn every_rendered_object_parses_into_its_kubernetes_type() {
    for target in TARGETS {
        let docs = render(target);
        assert!(!docs.is_empty(), "{target} renders nothing");
        for d in &docs {
            let at = format!("{target}: {}", name(d));
            match d["kind"].as_str().unwrap_or("") {
                "Namespace" => drop(strict::<Namespace>(&at, d)),
                "ServiceAccount" => drop(strict::<ServiceAccount>(&at, d)),
                "Role" => drop(strict::<Role>(&at, d)),
                "RoleBinding" => drop(strict::<RoleBinding>(&at, d)),
                "ClusterRole" => drop(strict::<ClusterRole>(&at, d)),
                "ClusterRoleBinding" => drop(strict::<ClusterRoleBinding>(&at, d)),
                "ConfigMap" => drop(strict::<ConfigMap>(&at, d)),
                "Service" => drop(strict::<Service>(&at, d)),
                "PersistentVolumeClaim" => drop(strict::<PersistentVolumeClaim>(&at, d)),
                "NetworkPolicy" => drop(strict::<NetworkPolicy>(&at, d)),
                "RuntimeClass" => drop(strict::<RuntimeClass>(&at, d)),
                "PodDisruptionBudget" => drop(strict::<PodDisruptionBudget>(&at, d)),
                "ValidatingAdmissionPolicy" => drop(strict::<
                    k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy,
                >(&at, d)),
                "ValidatingAdmissionPolicyBinding" => drop(strict::<
                    k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding,
                >(&at, d)),
                "Deployment" | "StatefulSet" | "Job" => drop(pod_spec(&at, d)),
                other => panic!("{at}: a kind this test does not check: {other}"),
            }
        }
    }
}

#[test]
fn every_pod_template_meets_the_restricted_pod_security_profile() {
    let mut seen = BTreeSet::new();
    for target in TARGETS {
        for d in render(target) {
            let Some(spec) = pod_spec(target, &d) else {
                continue;
            };
            let v = gateway::sandbox::kubernetes::podsecurity::restricted(&spec);
            assert!(v.is_empty(), "{target}: {}: {v:#?}", name(&d));
            seen.insert(name(&d));
            // The gateway's own containers also keep their root read-only.
            if d["metadata"]["namespace"] == NS {
                for c in &spec.containers {
                    let ro = c
                        .security_context
                        .as_ref()
                        .and_then(|s| s.read_only_root_filesystem);
                    assert_eq!(ro, Some(true), "{target}: {} {}", name(&d), c.name);
                }
            }
        }
    }
    for expected in [
        "Deployment gateway-sandbox/gateway",
        "Job gateway-sandbox/gateway-verify",
        "StatefulSet postgres/postgres",
    ] {
        assert!(seen.contains(expected), "{expected} not rendered: {seen:?}");
    }
    // The namespaces the pods land in enforce the same profile.
    for target in ["overlays/kind", "overlays/production"] {
        for d in render(target) {
            if d["kind"] == "Namespace"
                && (d["metadata"]["name"] == NS || d["metadata"]["name"] == "postgres")
            {
                assert_eq!(
                    d["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
                    "restricted",
                    "{target}: {}",
                    name(&d)
                );
            }
        }
    }
}

/// What the gateway's service account may do: in its own namespace only,
/// these verbs on these resources, nothing else.
const GATEWAY_MAY: [(&str, &str, &[&str]); 6] = [
    (
        "batch",
        "jobs",
        &["create", "get", "list", "watch", "patch", "delete"],
    ),
    ("", "secrets", &["create", "get", "list", "patch", "delete"]),
    ("", "pods", &["get", "list", "watch"]),
    ("", "pods/log", &["get"]),
    ("", "pods/attach", &["get", "create"]),
    ("", "events", &["get", "list", "watch"]),
];

#[test]
fn the_gateway_service_account_is_granted_nothing_beyond_its_sandbox_namespace() {
    for target in ["overlays/kind", "overlays/production"] {
        let docs = render(target);
        let is_gateway = |s: &Value| {
            s["kind"] == "ServiceAccount" && s["name"] == "gateway" && s["namespace"] == NS
        };
        let mut granted = Vec::new();
        for b in docs
            .iter()
            .filter(|d| d["kind"] == "RoleBinding" || d["kind"] == "ClusterRoleBinding")
        {
            let subjects = b["subjects"].as_array().cloned().unwrap_or_default();
            if !subjects.iter().any(is_gateway) {
                continue;
            }
            assert_eq!(
                b["kind"],
                "RoleBinding",
                "{target}: the gateway is bound cluster-wide: {}",
                name(b)
            );
            assert_eq!(b["metadata"]["namespace"], NS, "{target}: {}", name(b));
            assert_eq!(b["roleRef"]["kind"], "Role", "{target}: {}", name(b));
            let role = docs
                .iter()
                .find(|d| {
                    d["kind"] == "Role"
                        && d["metadata"]["namespace"] == NS
                        && d["metadata"]["name"] == b["roleRef"]["name"]
                })
                .unwrap_or_else(|| panic!("{target}: {} names a Role not rendered", name(b)));
            for rule in role["rules"].as_array().expect("rules") {
                let list = |k: &str| -> Vec<String> {
                    rule[k]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect()
                };
                assert!(rule.get("nonResourceURLs").is_none(), "{target}: {rule}");
                for g in list("apiGroups") {
                    for r in list("resources") {
                        for v in list("verbs") {
                            granted.push((g.clone(), r.clone(), v));
                        }
                    }
                }
            }
        }
        assert!(
            !granted.is_empty(),
            "{target}: the gateway is bound to nothing"
        );
        for (g, r, v) in &granted {
            let ok = GATEWAY_MAY
                .iter()
                .any(|(mg, mr, mv)| mg == g && mr == r && mv.contains(&v.as_str()));
            assert!(ok, "{target}: the gateway may {v} {g}/{r}, beyond its list");
        }
        // Nothing in the rendered set binds anything cluster-wide but the
        // token reviewer Vault's Kubernetes auth needs: `system:auth-delegator`
        // (create TokenReviews and SubjectAccessReviews, nothing else) for
        // Vault's own service account, never the gateway's.
        let crbs: Vec<String> = docs
            .iter()
            .filter(|d| d["kind"] == "ClusterRoleBinding")
            .filter(|d| {
                !(d["roleRef"]["name"] == "system:auth-delegator"
                    && d["subjects"]
                        == json!([{"kind": "ServiceAccount", "name": "openbao", "namespace": "vault"}]))
            })
            .map(name)
            .collect();
        assert!(crbs.is_empty(), "{target}: {crbs:?}");
    }
}

/// The API path an object is created at.
fn collection(d: &Value) -> String {
    let (group, resource) = match d["kind"].as_str().unwrap_or("") {
        "Namespace" => ("api/v1", "namespaces"),
        "ServiceAccount" => ("api/v1", "serviceaccounts"),
        "ConfigMap" => ("api/v1", "configmaps"),
        "Service" => ("api/v1", "services"),
        "PersistentVolumeClaim" => ("api/v1", "persistentvolumeclaims"),
        "Role" => ("apis/rbac.authorization.k8s.io/v1", "roles"),
        "RoleBinding" => ("apis/rbac.authorization.k8s.io/v1", "rolebindings"),
        "ClusterRole" => ("apis/rbac.authorization.k8s.io/v1", "clusterroles"),
        "ClusterRoleBinding" => ("apis/rbac.authorization.k8s.io/v1", "clusterrolebindings"),
        "NetworkPolicy" => ("apis/networking.k8s.io/v1", "networkpolicies"),
        "RuntimeClass" => ("apis/node.k8s.io/v1", "runtimeclasses"),
        "ValidatingAdmissionPolicy" => (
            "apis/admissionregistration.k8s.io/v1",
            "validatingadmissionpolicies",
        ),
        "ValidatingAdmissionPolicyBinding" => (
            "apis/admissionregistration.k8s.io/v1",
            "validatingadmissionpolicybindings",
        ),
        "PodDisruptionBudget" => ("apis/policy/v1", "poddisruptionbudgets"),
        "Deployment" => ("apis/apps/v1", "deployments"),
        "StatefulSet" => ("apis/apps/v1", "statefulsets"),
        "Job" => ("apis/batch/v1", "jobs"),
        other => panic!("no collection for {other}"),
    };
    match d["metadata"]["namespace"].as_str() {
        Some(ns) => format!("/{group}/namespaces/{ns}/{resource}"),
        None => format!("/{group}/{resource}"),
    }
}

/// POST every document, in order, as the cluster's admin; the statuses.
async fn apply(kube: &fake_kube::FakeKube, docs: &[Value]) -> Vec<(String, u16, String)> {
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(kube.ca_pem.as_bytes()).expect("ca"))
        .build()
        .expect("client");
    let mut out = Vec::new();
    for d in docs {
        let r = client
            .post(format!("{}{}", kube.url(), collection(d)))
            .bearer_auth(&kube.admin_jwt)
            .json(d)
            .send()
            .await
            .expect("POST");
        let status = r.status().as_u16();
        out.push((name(d), status, r.text().await.unwrap_or_default()));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fake_api_server_accepts_each_overlay_applied_in_the_rendered_order() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    for target in ["overlays/kind", "overlays/production"] {
        let kube = fake_kube::FakeKube::start().await;
        kube.with(|s| {
            s.strict_namespaces = true;
            for ns in ["default", "kube-system"] {
                s.objects.insert(
                    ("namespaces".into(), String::new(), ns.into()),
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
                );
            }
        });
        let docs = render(target);
        // The fake does refuse an object before its namespace: the same
        // documents with the Namespaces last fail.
        let mut reversed: Vec<Value> = docs
            .iter()
            .filter(|d| d["kind"] != "Namespace")
            .cloned()
            .collect();
        reversed.truncate(3);
        let early = apply(&kube, &reversed).await;
        assert!(
            early
                .iter()
                .any(|(_, s, body)| *s == 404 && body.contains("not found")),
            "{target}: the fake took objects before their namespace: {early:?}"
        );
        let kube = fake_kube::FakeKube::start().await;
        kube.with(|s| {
            s.strict_namespaces = true;
            for ns in ["default", "kube-system"] {
                s.objects.insert(
                    ("namespaces".into(), String::new(), ns.into()),
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
                );
            }
        });
        let applied = apply(&kube, &docs).await;
        let refused: Vec<_> = applied.iter().filter(|(_, s, _)| *s != 201).collect();
        assert!(refused.is_empty(), "{target}: {refused:#?}");
        assert_eq!(applied.len(), docs.len());

        // The rendered RBAC, enforced by the fake, lets the gateway's
        // service account do what the kubernetes backend does at start
        // (list and delete its leftover Jobs and Secrets) and nothing else.
        let token = kube.with(|s| s.service_account_token(NS, "gateway"));
        let dir = tempfile::tempdir().expect("tmp");
        let kubeconfig = kube.kubeconfig(dir.path(), &token, NS);
        let cfg = gateway::sandbox::kubernetes::KubeSandboxConfig {
            kubeconfig: Some(kubeconfig),
            ..Default::default()
        };
        let client = gateway::sandbox::kubernetes::client(&cfg)
            .await
            .expect("client");
        let sb = gateway::sandbox::kubernetes::KubernetesSandbox::new(client.clone(), cfg);
        sb.reap_leftovers()
            .await
            .unwrap_or_else(|e| panic!("{target}: the backend's start-up sweep: {e}"));
        let forbidden = |what: &str, path: &str, method: &str| {
            let (status, user) = kube.with(|s| {
                s.seen
                    .iter()
                    .rev()
                    .find(|r| r.path == path && r.method == method)
                    .map(|r| (r.status, r.user.clone()))
                    .unwrap_or_default()
            });
            assert_eq!(status, 403, "{target}: {what} was not forbidden ({user})");
        };
        use k8s_openapi::api::core::v1::Pod;
        let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), NS);
        let _ = pods
            .create(
                &Default::default(),
                &serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}))
                    .expect("pod"),
            )
            .await;
        forbidden(
            "creating a pod (only Jobs)",
            &format!("/api/v1/namespaces/{NS}/pods"),
            "POST",
        );
        let other: kube::Api<k8s_openapi::api::core::v1::Secret> =
            kube::Api::namespaced(client.clone(), "demo-app");
        let _ = other.list(&Default::default()).await;
        forbidden(
            "listing Secrets in another namespace",
            "/api/v1/namespaces/demo-app/secrets",
            "GET",
        );
        let cms: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), NS);
        let _ = cms.get("gateway-config").await;
        forbidden(
            "reading its own configuration through the API",
            &format!("/api/v1/namespaces/{NS}/configmaps/gateway-config"),
            "GET",
        );
    }
}

/// deploy/kubernetes/policies is the repository's policy set, as `gateway
/// policy configmap` makes it now: a policy change without regenerating
/// it fails here, with the command.
#[test]
fn the_policy_component_is_the_policy_dir_regenerated() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = common::gateway(dir.path())
        .args(["policy", "configmap", "--output"])
        .arg(dir.path().join("policies"))
        .arg("policies")
        .output()
        .expect("gateway policy configmap");
    assert!(out.status.success(), "{}", common::stderr(&out));
    for f in [
        "kustomization.yaml",
        "policies.yaml",
        "credential-roles.yaml",
    ] {
        let fresh = std::fs::read_to_string(dir.path().join("policies").join(f)).expect("fresh");
        let kept =
            std::fs::read_to_string(common::repo().join("deploy/kubernetes/policies").join(f))
                .expect("kept");
        assert!(
            fresh == kept,
            "deploy/kubernetes/policies/{f} is not the policy dir's: run `gateway policy configmap --output deploy/kubernetes/policies policies`"
        );
    }
}

/// The ConfigMap and its items, laid out as the kubelet does, are the
/// policy dir: the daemon loads the same set, file for file.
#[test]
fn the_configmap_as_the_kubelet_mounts_it_loads_the_same_policy_set() {
    let docs = render("overlays/production");
    let cm = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "gateway-policies")
        .expect("the policies ConfigMap");
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("Deployment");
    let volume = deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "policies")
        .expect("policies volume");
    assert_eq!(volume["configMap"]["name"], "gateway-policies");
    let files: Vec<(String, String)> = volume["configMap"]["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| {
            let key = i["key"].as_str().expect("key");
            (
                i["path"].as_str().expect("path").to_string(),
                cm["data"][key].as_str().expect("data").to_string(),
            )
        })
        .collect();
    assert_eq!(
        files.len(),
        cm["data"].as_object().expect("data").len(),
        "every key is mounted"
    );
    let dir = tempfile::tempdir().expect("tmp");
    let volume_dir = dir.path().join("policies");
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_str()))
        .collect();
    common::kubelet_write(&volume_dir, &refs);
    let opts = gateway::policy::set::LoadOptions::default();
    let mounted = gateway::policy::set::PolicySet::load(std::slice::from_ref(&volume_dir), &opts)
        .expect("mounted");
    let repo = gateway::policy::set::PolicySet::load(&[common::repo().join("policies")], &opts)
        .expect("repo");
    assert_eq!(mounted.fingerprint, repo.fingerprint);
    assert!(Path::new(&volume_dir).join("..data").exists());
}

/// Wait up to 20 s for `text` in the daemon's log at `log`.
async fn wait_for_log(log: &Path, text: &str, what: &str) {
    let started = std::time::Instant::now();
    loop {
        let now = std::fs::read_to_string(log).unwrap_or_default();
        if now.contains(text) {
            return;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{what}: {now}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The kubelet's part for one volume: `files` written in its layout under
/// `dir`, the volume dir left as it leaves an emptyDir-backed ConfigMap or
/// Secret volume (mode 2777, group the pod's fsGroup), the files owned by
/// root and group fsGroup with `mode`.
fn kubelet_volume(dir: &Path, files: &[(&str, &[u8])], mode: u32, fs_group: u32) {
    use std::os::unix::fs::PermissionsExt;
    let text: Vec<(String, String)> = files
        .iter()
        .map(|(p, c)| (p.to_string(), String::from_utf8_lossy(c).into_owned()))
        .collect();
    let refs: Vec<(&str, &str)> = text.iter().map(|(p, c)| (p.as_str(), c.as_str())).collect();
    let version = common::kubelet_write(dir, &refs);
    for (rel, _) in files {
        let f = dir.join(&version).join(rel);
        std::os::unix::fs::chown(&f, Some(0), Some(fs_group)).expect("chown");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    std::os::unix::fs::chown(dir, Some(0), Some(fs_group)).expect("chown");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o2777)).expect("chmod");
}

/// The daemon as the kind overlay's pod runs it, played on this host (a
/// STAND-IN for a pod: no kubelet or container runtime runs here). The
/// rendered gateway.toml, its paths moved under one root; the rendered
/// policy ConfigMap, TLS and PostgreSQL Secrets and service account token
/// in the kubelet's layout, mounted read-only in a mount namespace of the
/// daemon's own; the state emptyDir mode 2777; the rendered uid, gid and
/// fsGroup (65532, 65532, 65534); the in-cluster API server (the fake,
/// holding the rendered objects and enforcing their RBAC), OpenBao with
/// Kubernetes auth, PostgreSQL. It starts, says it is ready (policy,
/// database, Vault token), keeps its last good policy set when a broken
/// version is mounted, and stops at SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_runs_as_the_kind_overlay_configures_its_pod() {
    use std::os::unix::fs::PermissionsExt;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let docs = render("overlays/kind");
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("Deployment");
    let psc = &deployment["spec"]["template"]["spec"]["securityContext"];
    let (uid, gid, fs_group) = (
        psc["runAsUser"].as_u64().expect("runAsUser") as u32,
        psc["runAsGroup"].as_u64().expect("runAsGroup") as u32,
        psc["fsGroup"].as_u64().expect("fsGroup") as u32,
    );
    assert_eq!((uid, gid, fs_group), (65532, 65532, 65534));
    // distroless's `nonroot` user and group, which the socket belongs to.
    let _ = std::process::Command::new("groupadd")
        .args(["-g", "65532", "nonroot"])
        .status();
    let config_map = |n: &str| {
        docs.iter()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == n)
            .unwrap_or_else(|| panic!("ConfigMap {n}"))
    };
    let toml = config_map("gateway-config")["data"]["gateway.toml"]
        .as_str()
        .expect("gateway.toml")
        .to_string();

    // The cluster: the fake API server with the overlay applied.
    let kube = fake_kube::FakeKube::start().await;
    kube.with(|s| {
        for ns in ["default", "kube-system"] {
            s.objects.insert(
                ("namespaces".into(), String::new(), ns.into()),
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            );
        }
        s.strict_namespaces = true;
    });
    let applied = apply(&kube, &docs).await;
    assert!(applied.iter().all(|(_, s, _)| *s == 201), "{applied:#?}");
    let sa_token = kube.with(|s| s.service_account_token(NS, "gateway"));

    let dir = tempfile::tempdir().expect("tmp");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let root = dir.path().join("pod");
    // OpenBao, with the gateway's Kubernetes auth role.
    let bao = tokio::task::spawn_blocking(openbao::OpenBao::start)
        .await
        .expect("bao");
    let setup = dir.path().join("setup");
    std::fs::create_dir_all(&setup).expect("mkdir");
    std::fs::write(setup.join("kube-ca.pem"), &kube.ca_pem).expect("ca");
    std::fs::write(setup.join("openbao.jwt"), &kube.admin_jwt).expect("jwt");
    let out = common::gateway(&setup.join("home"))
        .args(["vault", "setup", "--kubernetes-host", &kube.url()])
        .arg("--kubernetes-ca-file")
        .arg(setup.join("kube-ca.pem"))
        .arg("--service-account-jwt-file")
        .arg(setup.join("openbao.jwt"))
        .args(["--kubernetes-auth", "gateway-sandbox/gateway"])
        .env("VAULT_ADDR", &bao.addr)
        .env("VAULT_TOKEN", &bao.root_token)
        .env_remove("AWS_ACCESS_KEY_ID")
        .output()
        .expect("vault setup");
    assert!(out.status.success(), "{}", common::stderr(&out));
    // PostgreSQL on loopback TCP (the pod reaches it over the network).
    let keys = dir.path().join("keys");
    std::fs::create_dir_all(&keys).expect("mkdir");
    let (ca, cert, key) = common::tls_files(&keys);
    let server = {
        let (cert, key) = (cert.clone(), key.clone());
        tokio::task::spawn_blocking(move || {
            let server = pg::Postgres::start_tls(&cert, &key);
            let _ = server.database("team");
            server
        })
        .await
        .expect("postgres")
    };
    let url = format!(
        "host=127.0.0.1 port={} user=postgres dbname=team sslmode=disable",
        server.port
    );

    // The pod's files, where the kubelet would have put them.
    let at = |p: &str| root.join(p.trim_start_matches('/'));
    let volumes = dir.path().join("volumes");
    let policy_files: Vec<(String, String)> = {
        let d = deployment["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .find(|v| v["name"] == "policies")
            .expect("policies volume")
            .clone();
        let data = &config_map("gateway-policies")["data"];
        d["configMap"]["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|i| {
                (
                    i["path"].as_str().expect("path").to_string(),
                    data[i["key"].as_str().expect("key")]
                        .as_str()
                        .expect("content")
                        .to_string(),
                )
            })
            .collect()
    };
    let write_policies = |files: &[(String, String)]| {
        let refs: Vec<(&str, &[u8])> = files
            .iter()
            .map(|(p, c)| (p.as_str(), c.as_bytes()))
            .collect();
        kubelet_volume(&volumes.join("policies"), &refs, 0o644, fs_group);
    };
    write_policies(&policy_files);
    // gateway.toml, its paths under the stand-in root; the addresses of
    // this test's services.
    let moved = toml
        .replace(
            "/usr/local/share/gateway/workspace",
            &at("/usr/local/share/gateway/workspace")
                .display()
                .to_string(),
        )
        .replace(
            "\"/etc/gateway",
            &format!("\"{}", at("/etc/gateway").display()),
        )
        .replace(
            "\"/var/lib/gateway",
            &format!("\"{}", at("/var/lib/gateway").display()),
        )
        .replace("\"/workspace\"", &format!("{:?}", at("/workspace")))
        .replace("http://172.18.0.1:8200", &bao.addr)
        .replace("https://172.18.0.1:9443", "https://127.0.0.1:9")
        .replace(
            "0.0.0.0:8443",
            &format!("127.0.0.1:{}", {
                let l = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
                l.local_addr().expect("addr").port()
            }),
        );
    let metrics_at = format!("127.0.0.1:{}", {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
        l.local_addr().expect("addr").port()
    });
    let moved = moved.replace("0.0.0.0:9464", &metrics_at);
    assert!(!moved.contains("172.18.0.1"), "{moved}");
    let listen = moved
        .lines()
        .find_map(|l| l.strip_prefix("listen = \""))
        .and_then(|l| l.split('"').next())
        .expect("listen")
        .to_string();
    kubelet_volume(
        &volumes.join("config"),
        &[("gateway.toml", moved.as_bytes())],
        0o644,
        fs_group,
    );
    let (tls_cert, tls_key) = (
        std::fs::read(&cert).expect("cert"),
        std::fs::read(&key).expect("key"),
    );
    kubelet_volume(
        &volumes.join("tls"),
        &[
            ("tls.crt", tls_cert.as_slice()),
            ("tls.key", tls_key.as_slice()),
        ],
        0o440,
        fs_group,
    );
    kubelet_volume(
        &volumes.join("postgres"),
        &[("url", url.as_bytes())],
        0o440,
        fs_group,
    );
    kubelet_volume(
        &volumes.join("serviceaccount"),
        &[
            ("token", sa_token.as_bytes()),
            ("ca.crt", kube.ca_pem.as_bytes()),
            ("namespace", NS.as_bytes()),
        ],
        0o440,
        fs_group,
    );
    // The image's demo workspace (COPY --chown=65532), the state emptyDir
    // and the workspace PVC.
    let image_ws = at("/usr/local/share/gateway/workspace/terraform/k8s-demo");
    std::fs::create_dir_all(&image_ws).expect("mkdir");
    std::fs::copy(
        common::repo().join("terraform/k8s-demo/main.tf"),
        image_ws.join("main.tf"),
    )
    .expect("module");
    let chown = |p: &Path, u: u32, g: u32| {
        let st = std::process::Command::new("chown")
            .arg("-R")
            .arg(format!("{u}:{g}"))
            .arg(p)
            .status()
            .expect("chown");
        assert!(st.success());
    };
    chown(&at("/usr/local/share/gateway/workspace"), uid, gid);
    for (p, mode) in [("/var/lib/gateway", 0o2777), ("/workspace", 0o2775)] {
        std::fs::create_dir_all(at(p)).expect("mkdir");
        std::os::unix::fs::chown(at(p), Some(0), Some(fs_group)).expect("chown");
        std::fs::set_permissions(at(p), std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    for p in [
        "/etc/gateway/config",
        "/etc/gateway/policies",
        "/etc/gateway/tls",
    ] {
        std::fs::create_dir_all(at(p)).expect("mount point");
    }
    std::fs::create_dir_all(at("/etc/gateway/postgres")).expect("mkdir");
    std::fs::write(at("/etc/gateway/postgres/url"), "").expect("mount point");

    // The container: a mount namespace with the volumes read-only where
    // the Deployment mounts them, then the rendered user, group and fsGroup.
    let script = r#"set -e
v="$1"; r="$2"; shift 2
mount --bind -o ro "$v/config" "$r/etc/gateway/config"
mount --bind -o ro "$v/policies" "$r/etc/gateway/policies"
mount --bind -o ro "$v/tls" "$r/etc/gateway/tls"
mount --bind -o ro "$v/postgres/..data/url" "$r/etc/gateway/postgres/url"
mount --bind "$r/var/lib/gateway" "$r/var/lib/gateway"
mount -t tmpfs tmpfs /run
mkdir -p /run/secrets/kubernetes.io/serviceaccount
mount --bind -o ro "$v/serviceaccount" /run/secrets/kubernetes.io/serviceaccount
exec setpriv --reuid=65532 --regid=65532 --groups=65534 --inh-caps=-all "$@""#;
    let log = dir.path().join("daemon.log");
    let mut child = std::process::Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg(&volumes)
        .arg(&root)
        .arg(env!("CARGO_BIN_EXE_gateway"))
        .arg("--config")
        .arg(at("/etc/gateway/config/gateway.toml"))
        .arg("daemon")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("RUST_LOG", "info")
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", kube.port.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("unshare");
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let started = std::time::Instant::now();
    while !read_log().contains("serving MCP over HTTP") {
        if let Ok(Some(st)) = child.try_wait() {
            panic!("the daemon exited ({st}): {}", read_log());
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "not serving after 60 s: {}",
            read_log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // It runs as the pod's user, not root.
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).expect("status");
    let uids = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .expect("Uid")
        .to_string();
    assert!(
        uids.split_whitespace().skip(1).all(|u| u == "65532"),
        "{uids}"
    );

    let probe = reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(&ca).expect("ca")).expect("ca"),
        )
        .build()
        .expect("client");
    let get = |path: &str| {
        let url = format!("https://{listen}{path}");
        let probe = probe.clone();
        async move {
            let r = probe.get(url).send().await.expect("GET");
            (r.status().as_u16(), r.text().await.unwrap_or_default())
        }
    };
    assert_eq!(get("/healthz").await.0, 200);
    assert_eq!(
        get("/readyz").await,
        (200, "policy: ok\ndatabase: ok\nvault: ok\n".to_string()),
        "{}",
        read_log()
    );
    // The kubelet mounts a version with a rule file that does not parse:
    // refused whole, the last good set stays, the replica stays ready.
    let mut broken = policy_files.clone();
    broken
        .iter_mut()
        .find(|(p, _)| p == "approvals.rego")
        .expect("approvals.rego")
        .1
        .push_str("\nnot rego {\n");
    write_policies(&broken);
    wait_for_log(
        &log,
        "policy reload failed, keeping the last good set",
        "the broken version was not reported",
    )
    .await;
    assert_eq!(get("/readyz").await.0, 200);
    // The next good version (a changed catalogue) is taken whole.
    let mut fixed = policy_files.clone();
    fixed
        .iter_mut()
        .find(|(p, _)| p == "config/tools/data.yaml")
        .expect("catalogue")
        .1
        .push_str("\n# a new version\n");
    write_policies(&fixed);
    wait_for_log(
        &log,
        "policy set reloaded",
        "the fixed version was not loaded",
    )
    .await;
    // Prometheus sees both on the metrics port: the failed reload, and
    // the one digest in use now.
    let metrics = reqwest::get(format!("http://{metrics_at}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics");
    assert!(
        metrics.contains("gateway_policy_reloads_total{result=\"failed\"} 1\n"),
        "{metrics}"
    );
    assert_eq!(
        metrics
            .lines()
            .filter(|l| l.starts_with("gateway_policy_loaded{"))
            .count(),
        1,
        "{metrics}"
    );
    // Not on the MCP port: the operator gave it a port of its own.
    assert_eq!(get("/metrics").await.0, 404);
    // SIGTERM (what the kubelet sends after preStop): it stops, cleanly.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let started = std::time::Instant::now();
    let st = loop {
        if let Ok(Some(st)) = child.try_wait() {
            break st;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "still running 60 s after SIGTERM: {}",
            read_log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(st.success(), "{st}: {}", read_log());
    drop(bao);
}
