//! The Kubernetes toolbox's reads (`kubectl_read`: k8s_get, k8s_describe,
//! k8s_logs, k8s_events, k8s_rollout_status, k8s_rollout_history) end to
//! end: the default policy decides, a REAL OpenBao mints a credential whose
//! role the policy data defines, REAL kubectl runs in a REAL gVisor
//! sandbox against the FAKE API server (tests/support/fake_kube.rs: no real
//! API server runs here; it follows the documented API, RBAC included, for
//! what kubectl sends), and the answer is read as hostile input.
//!
//! The cluster is the one an agent debugs: a Deployment whose pod
//! crash-loops because an environment variable is missing.

mod common;
#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/fake_kube.rs"]
mod fake_kube;
#[path = "support/kube_world.rs"]
mod kube_world;
#[path = "support/openbao.rs"]
mod openbao;

use std::io::{BufRead as _, Write as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gateway::broker::vault::VaultBroker;
use gateway::pipeline::{CallResult, Outcome, Pipeline, ToolCall};
use gateway::policy::Principal;
use kube_world::{World, everything_written, pipeline, settings, trail, world};
use serde_json::{Value, json};

/// A Secret's value, which must never leave the sandbox.
const SECRET_VALUE: &str = "hunter2-do-not-leak";

fn principal() -> Principal {
    Principal::os_user("test".into(), "alice".into(), 1000, vec![])
}

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// demo-app as an agent finds it: Deployment `web` (revision 2 rolled out
/// with a bad env var), its two ReplicaSets, a crash-looping pod with its
/// current and previous logs, the events, a Secret and a ConfigMap.
fn crash_looping(w: &World) {
    let ns = "demo-app";
    w.kube.with(|s| {
        s.put("namespaces", "", json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
        let dep = s.put("deployments", ns, json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": ns, "labels": {"app": "web"}, "generation": 2,
                "annotations": {"deployment.kubernetes.io/revision": "2",
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"spec\":{\"replicas\":1}}"},
                "managedFields": [{"manager": "kubectl-client-side-apply", "operation": "Update"}]},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "app", "image": "registry.example/web:1.4.2",
                        "env": [{"name": "DATABSE_URL", "value": "postgres://db:5432/web"}]}]}}},
            "status": {"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1, "unavailableReplicas": 1,
                "conditions": [{"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable",
                    "message": "Deployment does not have minimum availability."},
                    {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated",
                    "message": "ReplicaSet \"web-5c4b\" is progressing."}]}}));
        let uid = dep["metadata"]["uid"].as_str().unwrap_or("").to_string();
        for (rs, rev, image, replicas) in [("web-7d9f", "1", "registry.example/web:1.4.1", 0), ("web-5c4b", "2", "registry.example/web:1.4.2", 1)] {
            s.put("replicasets", ns, json!({
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": rs, "namespace": ns, "labels": {"app": "web", "pod-template-hash": &rs[4..]},
                    "annotations": {"deployment.kubernetes.io/revision": rev},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": uid, "controller": true}]},
                "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web", "pod-template-hash": &rs[4..]}},
                    "template": {"metadata": {"labels": {"app": "web", "pod-template-hash": &rs[4..]}},
                        "spec": {"containers": [{"name": "app", "image": image}]}}},
                "status": {"replicas": replicas}}));
        }
        s.put("pods", ns, json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-5c4b-x7k2p", "namespace": ns, "labels": {"app": "web", "pod-template-hash": "5c4b"}},
            "spec": {"nodeName": "kind-worker", "containers": [{"name": "app", "image": "registry.example/web:1.4.2"}]},
            "status": {"phase": "Running",
                "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": [{"name": "app", "ready": false, "restartCount": 4, "image": "registry.example/web:1.4.2",
                    "state": {"running": {"startedAt": "2026-12-07T00:00:00Z"}},
                    "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": "2026-12-07T00:00:00Z"}}}]}}));
        s.logs.insert("web-5c4b-x7k2p".into(), b"starting web 1.4.2\nconnecting to the database\n".to_vec());
        s.previous_logs.insert(
            "web-5c4b-x7k2p".into(),
            b"starting web 1.4.2\n\x1b]0;owned\x07panic: DATABASE_URL is not set\n".to_vec(),
        );
        for (i, (reason, kind, name, ty, msg)) in [
            ("Scheduled", "Pod", "web-5c4b-x7k2p", "Normal", "Successfully assigned demo-app/web-5c4b-x7k2p to kind-worker"),
            ("BackOff", "Pod", "web-5c4b-x7k2p", "Warning", "Back-off restarting failed container app in pod web-5c4b-x7k2p"),
            ("ScalingReplicaSet", "Deployment", "web", "Normal", "Scaled up replica set web-5c4b from 0 to 1"),
        ]
        .into_iter()
        .enumerate()
        {
            s.put("events", ns, json!({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": format!("{name}.{i}"), "namespace": ns},
                "involvedObject": {"kind": kind, "name": name, "namespace": ns},
                "reason": reason, "type": ty, "message": msg, "count": i + 1,
                "lastTimestamp": format!("2026-12-07T00:0{i}:00Z")}));
        }
        s.put("secrets", ns, json!({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": "db", "namespace": ns,
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": format!("{{\"stringData\":{{\"password\":\"{SECRET_VALUE}\"}}}}")}},
            "data": {"password": b64(SECRET_VALUE), "user": b64("web")}}));
        s.put("configmaps", ns, json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "web-config", "namespace": ns}, "data": {"LOG_LEVEL": "debug"}}));
    });
}

async fn setup() -> (World, Arc<Pipeline>) {
    let w = world().await;
    crash_looping(&w);
    let broker =
        Arc::new(VaultBroker::new(settings(&w.bao.addr, &w.gateway_token), &w.home).expect("b"));
    let p = pipeline(&w, broker);
    (w, p)
}

async fn call(p: &Arc<Pipeline>, tool: &str, params: Value) -> CallResult {
    p.call(ToolCall {
        trace: None,
        tool: tool.into(),
        params,
        principal: principal(),
        workspace: None,
    })
    .await
    .expect("call")
}

/// A completed call's summary and result; anything else fails the test.
fn completed(r: &CallResult) -> (&str, &Value) {
    match &r.outcome {
        Outcome::Completed {
            ok: true,
            summary,
            result,
        } => (summary, result),
        other => panic!("{} did not complete: {other:?}", r.tool),
    }
}

/// The audit's `tool.result` of a call.
fn audited_result(w: &World, rid: &str) -> Value {
    std::fs::read_to_string(w.home.join("audit.jsonl"))
        .expect("audit")
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["request_id"] == rid && e["event"] == "tool.result")
        .map(|e| e["data"].clone())
        .expect("tool.result")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_finds_why_a_deployment_crash_loops_through_the_read_tools() {
    let (w, p) = setup().await;

    // The pod's previous run says why it died; control characters from the
    // log (an OSC title sequence) arrive escaped.
    let r = call(&p, "k8s_logs", json!({"namespace": "demo-app", "name": "web-5c4b-x7k2p", "previous": true, "tail_lines": 50})).await;
    let (summary, result) = completed(&r);
    let text = result["text"].as_str().expect("text");
    assert!(text.contains("panic: DATABASE_URL is not set"), "{text}");
    assert!(!text.contains('\x1b') && !text.contains('\x07'), "{text:?}");
    assert!(summary.contains("DATABASE_URL"), "{summary}");
    assert_eq!(result["truncated"], false);
    // The audit keeps the log's size and digest, not the log.
    let audited = audited_result(&w, &r.request_id);
    assert!(!audited.to_string().contains("DATABASE_URL"), "{audited}");
    assert_eq!(
        audited["result"]["sha256"].as_str().map(str::len),
        Some(64),
        "{audited}"
    );
    let t = trail(&w.home, &r.request_id);
    assert!(t.contains(&"credential.revoked".to_string()), "{t:?}");
    // kubectl asked for exactly that: the previous run, 50 lines, capped.
    let q = w
        .kube
        .with(|s| s.log_queries.last().cloned())
        .expect("a log query");
    assert_eq!(q.get("previous").map(String::as_str), Some("true"), "{q:?}");
    assert_eq!(q.get("tailLines").map(String::as_str), Some("50"), "{q:?}");
    assert_eq!(q.get("limitBytes"), None, "{q:?}");

    // The pod's events, then the namespace's.
    let r = call(
        &p,
        "k8s_events",
        json!({"namespace": "demo-app", "kind": "pods", "name": "web-5c4b-x7k2p"}),
    )
    .await;
    let (summary, result) = completed(&r);
    let reasons: Vec<&str> = result["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert_eq!(reasons, ["Scheduled", "BackOff"], "{result}");
    assert!(
        summary.contains("Warning BackOff Pod/web-5c4b-x7k2p"),
        "{summary}"
    );
    let r = call(&p, "k8s_events", json!({"namespace": "demo-app"})).await;
    assert_eq!(completed(&r).1["events"].as_array().map(Vec::len), Some(3));

    // The Deployment as JSON: no managedFields, no last-applied copy.
    let r = call(
        &p,
        "k8s_get",
        json!({"namespace": "demo-app", "kind": "deployments", "name": "web"}),
    )
    .await;
    let (_, result) = completed(&r);
    let web = &result["items"][0];
    assert_eq!(
        web["spec"]["template"]["spec"]["containers"][0]["env"][0]["name"],
        "DATABSE_URL"
    );
    assert!(web["metadata"].get("managedFields").is_none(), "{web}");
    assert!(
        web["metadata"]["annotations"]
            .get("kubectl.kubernetes.io/last-applied-configuration")
            .is_none(),
        "{web}"
    );
    let r = call(
        &p,
        "k8s_get",
        json!({"namespace": "demo-app", "kind": "replicasets"}),
    )
    .await;
    let names: Vec<&str> = completed(&r).1["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["web-5c4b", "web-7d9f"]);

    // describe, rollout status and history: kubectl's own text.
    let r = call(
        &p,
        "k8s_describe",
        json!({"namespace": "demo-app", "kind": "deployments", "name": "web"}),
    )
    .await;
    let text = completed(&r).1["text"].as_str().expect("text").to_string();
    assert!(
        text.contains("web") && text.contains("DATABSE_URL"),
        "{text}"
    );
    let r = call(
        &p,
        "k8s_rollout_status",
        json!({"namespace": "demo-app", "kind": "deployments", "name": "web"}),
    )
    .await;
    let text = completed(&r).1["text"].as_str().expect("text").to_string();
    assert!(
        text.contains("Waiting for deployment \"web\" rollout to finish"),
        "{text}"
    );
    let r = call(
        &p,
        "k8s_rollout_history",
        json!({"namespace": "demo-app", "kind": "deployments", "name": "web"}),
    )
    .await;
    let text = completed(&r).1["text"].as_str().expect("text").to_string();
    assert!(
        text.contains('1') && text.contains('2') && text.contains("REVISION"),
        "{text}"
    );

    // Every request kubectl made was allowed by its call's own role: none
    // needed more than the policy data grants.
    let refused: Vec<_> = w.kube.with(|s| {
        s.seen
            .iter()
            .filter(|r| r.status == 403 || r.status == 401)
            .map(|r| format!("{} {} {} {}", r.user, r.method, r.path, r.status))
            .collect()
    });
    assert!(refused.is_empty(), "{refused:#?}");
    assert!(
        w.kube.with(|s| s.live("serviceaccounts").is_empty()),
        "a credential outlived its call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_is_read_as_names_and_keys_and_its_value_reaches_nothing() {
    let (w, p) = setup().await;
    let r = call(
        &p,
        "k8s_get",
        json!({"namespace": "demo-app", "kind": "secrets"}),
    )
    .await;
    let (summary, result) = completed(&r);
    assert_eq!(
        result["items"],
        json!([{"name": "db", "type": "Opaque", "keys": ["password", "user"]}]),
        "{result}"
    );
    assert_eq!(result["values"], "hidden");
    let r1 = call(
        &p,
        "k8s_get",
        json!({"namespace": "demo-app", "kind": "secrets", "name": "db"}),
    )
    .await;
    assert_eq!(
        completed(&r1).1["items"][0]["keys"],
        json!(["password", "user"])
    );
    // Neither the value nor its base64 is in the answer, the audit, or
    // anything else the gateway wrote.
    let everything = format!(
        "{summary}{result}{}{}",
        serde_json::to_string(&r1).expect("j"),
        everything_written(&w.home)
    );
    for needle in [SECRET_VALUE.to_string(), b64(SECRET_VALUE)] {
        assert!(!everything.contains(&needle), "the secret's value leaked");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_read_gets_a_token_that_can_do_only_what_its_tool_needs() {
    let (w, p) = setup().await;
    // The logs call's token: bound to a role of pods and pods/log, get only.
    let r = call(
        &p,
        "k8s_logs",
        json!({"namespace": "demo-app", "name": "web-5c4b-x7k2p"}),
    )
    .await;
    completed(&r);
    // The credential's ServiceAccount was bound (by OpenBao, creating no
    // Role of its own) to the Role provisioned for that tool.
    let (created_roles, bound): (usize, Vec<(String, Value)>) = w.kube.with(|s| {
        let bound = s
            .created
            .iter()
            .filter(|(r, b)| r == "rolebindings" && b["subjects"][0]["name"] != "openbao")
            .filter_map(|(_, b)| {
                let name = b["roleRef"]["name"].as_str()?.to_string();
                let role =
                    s.objects
                        .get(&("roles".to_string(), "demo-app".to_string(), name.clone()))?;
                Some((name, role["rules"].clone()))
            })
            .collect();
        let created_roles = s
            .seen
            .iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/roles"))
            .count();
        (created_roles, bound)
    });
    assert_eq!(created_roles, 0, "OpenBao made a Role");
    assert_eq!(
        bound,
        [(
            "gateway-k8s-logs-demo-app".to_string(),
            json!([{"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get"]}])
        )],
        "{bound:#?}"
    );
    // A denied read runs nothing and mints nothing.
    let before = w.kube.with(|s| s.created.len());
    for (tool, params, why) in [
        (
            "k8s_get",
            json!({"namespace": "kube-system", "kind": "secrets"}),
            "not in the allowlist",
        ),
        (
            "k8s_get",
            json!({"namespace": "demo-app", "kind": "nodes"}),
            "must be one of",
        ),
        (
            "k8s_logs",
            json!({"namespace": "demo-app", "name": "--raw=/api/v1/secrets"}),
            "does not have the form",
        ),
        (
            "k8s_logs",
            json!({"namespace": "demo-app", "name": "web", "tail_lines": 1000000}),
            "between 1 and 2000",
        ),
        (
            "k8s_describe",
            json!({"namespace": "demo-app", "kind": "secrets", "name": "db"}),
            "must be one of",
        ),
    ] {
        let r = call(&p, tool, params.clone()).await;
        let Outcome::Denied { reasons, .. } = &r.outcome else {
            panic!("{tool} {params} was not denied: {:?}", r.outcome);
        };
        assert!(
            reasons.iter().any(|x| x.contains(why)),
            "{tool} {params}: {reasons:?}"
        );
    }
    assert_eq!(
        w.kube.with(|s| s.created.len()),
        before,
        "a denied call minted a credential"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_larger_than_the_cap_is_cut_and_says_so() {
    let (w, p) = setup().await;
    // A log of ~200 KB: more than result_bytes (64 KiB).
    let line = "x".repeat(199) + "\n";
    w.kube.with(|s| {
        let log = line.repeat(1000) + "panic: the last words\n";
        s.logs.insert("web-5c4b-x7k2p".into(), log.into_bytes());
    });
    let r = call(
        &p,
        "k8s_logs",
        json!({"namespace": "demo-app", "name": "web-5c4b-x7k2p", "tail_lines": 2000}),
    )
    .await;
    let (_, result) = completed(&r);
    let text = result["text"].as_str().expect("text");
    assert_eq!(result["truncated"], true);
    assert!(text.len() <= 65536 + 200, "{}", text.len());
    // The newest lines are kept: a crash's last words are at the end.
    assert!(
        text.starts_with("[truncated: only the newest lines are shown"),
        "{}",
        &text[..120]
    );
    assert!(
        text.ends_with("panic: the last words\n"),
        "{}",
        &text[text.len() - 120..]
    );
    // A missing pod is kubectl's own answer, not a gateway error.
    let r = call(
        &p,
        "k8s_logs",
        json!({"namespace": "demo-app", "name": "gone"}),
    )
    .await;
    let Outcome::Completed {
        ok: false,
        summary,
        result,
    } = &r.outcome
    else {
        panic!("{:?}", r.outcome);
    };
    let seen: Vec<String> = w.kube.with(|s| {
        s.seen
            .iter()
            .rev()
            .take(4)
            .map(|r| format!("{} {} {}", r.method, r.path, r.status))
            .collect()
    });
    assert!(
        summary.contains("pods \"gone\" not found"),
        "{summary} {result} {seen:?}"
    );
}

// --- Changes: planned by the API server's dry run, bound to what it said ---

/// A world whose policies name bob's key as an allowed signer, and a way
/// for bob to approve with it (the real `gateway approve`).
struct Gate {
    _keys: tempfile::TempDir,
    policies: tempfile::TempDir,
    bob: std::path::PathBuf,
}

async fn setup_with_approver() -> (World, Arc<Pipeline>, Gate) {
    let w = world().await;
    crash_looping(&w);
    let keys = tempfile::tempdir().expect("keys");
    let bob = common::ssh_key(keys.path(), "bob");
    let policies = common::policies_with_signers(&[("bob", &bob)], &[]);
    let broker =
        Arc::new(VaultBroker::new(settings(&w.bao.addr, &w.gateway_token), &w.home).expect("b"));
    let p = kube_world::pipeline_with(&w, broker, policies.path());
    (
        w,
        p,
        Gate {
            _keys: keys,
            policies,
            bob,
        },
    )
}

impl Gate {
    fn approve(&self, w: &World, id: &str) {
        let out = common::gateway(&w.home)
            .arg("--policies")
            .arg(self.policies.path())
            .args(["approve", id, "--reason", "reviewed the diff"])
            .arg("--key")
            .arg(&self.bob)
            .output()
            .expect("gateway approve");
        assert!(
            out.status.success(),
            "{}{}",
            common::stdout(&out),
            common::stderr(&out)
        );
    }
}

fn pending(r: &CallResult) -> (String, Value, Value) {
    match &r.outcome {
        Outcome::PendingApproval {
            approval_id,
            signals,
            changes,
            ..
        } => (approval_id.clone(), signals.clone(), changes.clone()),
        other => panic!("{} did not wait for approval: {other:?}", r.tool),
    }
}

fn replicas(w: &World) -> Value {
    w.kube.with(|s| {
        s.objects[&(
            "deployments".to_string(),
            "demo-app".to_string(),
            "web".to_string(),
        )]["spec"]["replicas"]
            .clone()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_is_the_api_servers_dry_run_then_the_write_with_the_live_resource_version() {
    let (w, p) = setup().await;
    let rv = w.kube.with(|s| {
        s.objects[&(
            "deployments".to_string(),
            "demo-app".to_string(),
            "web".to_string(),
        )]["metadata"]["resourceVersion"]
            .clone()
    });
    // 1 -> 2 replicas: medium tier, no signal, no person needed.
    let r = call(
        &p,
        "k8s_scale",
        json!({"namespace": "demo-app", "kind": "deployments", "name": "web", "replicas": 2}),
    )
    .await;
    let (summary, result) = completed(&r);
    assert!(
        summary.contains("Deployment demo-app/web scaled"),
        "{summary}"
    );
    assert_eq!(result["object"]["spec"]["replicas"], 2);
    assert_eq!(replicas(&w), 2);
    // The API server was asked twice: the dry run, then the write, each a
    // PUT of the object carrying the resourceVersion that was read.
    let puts: Vec<String> = w.kube.with(|s| {
        s.seen
            .iter()
            .filter(|r| r.method == "PUT")
            .map(|r| format!("{}?{} {}", r.path, r.query, r.status))
            .collect()
    });
    assert_eq!(puts.len(), 2, "{puts:?}");
    assert!(puts.iter().all(|p| p.ends_with(" 200")), "{puts:?}");
    assert!(
        puts[0].contains("dryRun=All") && !puts[1].contains("dryRun"),
        "{puts:?}"
    );
    let now = w.kube.with(|s| {
        s.objects[&(
            "deployments".to_string(),
            "demo-app".to_string(),
            "web".to_string(),
        )]["metadata"]["resourceVersion"]
            .clone()
    });
    assert_ne!(now, rv, "the write made a new version");
    let t = trail(&w.home, &r.request_id);
    assert!(!t.iter().any(|e| e.starts_with("approval.")), "{t:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_change_fails_closed_when_the_object_changed_after_its_plan() {
    let (w, p, gate) = setup_with_approver().await;
    let params =
        json!({"namespace": "demo-app", "kind": "deployments", "name": "web", "replicas": 0});
    let r = call(&p, "k8s_scale", params.clone()).await;
    let (id, signals, changes) = pending(&r);
    assert_eq!(signals[0]["kind"], "scale_to_zero", "{signals}");
    assert!(
        signals[0]["message"]
            .as_str()
            .unwrap_or("")
            .contains("stops serving"),
        "{signals}"
    );
    assert_eq!(
        changes[0]["address"], "Deployment demo-app/web",
        "{changes}"
    );
    assert_eq!(replicas(&w), 1, "nothing is applied before the approval");
    gate.approve(&w, &id);
    // Someone changes the Deployment between the approval and the apply.
    w.kube.with(|s| {
        s.update("deployments", "demo-app", "web", |o| {
            o["spec"]["replicas"] = json!(5)
        });
    });
    let mut with_id = params.clone();
    with_id["approval_id"] = json!(id);
    let r = call(&p, "k8s_scale", with_id.clone()).await;
    let Outcome::Completed {
        ok: false,
        summary,
        result,
    } = &r.outcome
    else {
        panic!("{:?}", r.outcome);
    };
    assert_eq!(result["changed_since_plan"], true, "{result}");
    assert!(
        summary.contains("changed since it was planned") && summary.contains("plan again"),
        "{summary}"
    );
    assert_eq!(replicas(&w), 5, "the stale approval changed nothing");
    // The approval is spent (its outcome recorded): it cannot be used again.
    let again = call(&p, "k8s_scale", with_id).await;
    let text = format!("{:?}", again.outcome);
    assert!(
        text.contains("changed since it was planned") || text.contains("spent"),
        "{text}"
    );
    assert_eq!(replicas(&w), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fix_is_applied_exactly_as_approved() {
    let (w, p, gate) = setup_with_approver().await;
    // The agent proposes the one-line fix: the env var's name.
    let mut fixed = web_manifest(&w);
    fixed["metadata"]
        .as_object_mut()
        .map(|m| m.remove("annotations"));
    fixed["spec"]["template"]["spec"]["containers"][0]["env"][0]["name"] = json!("DATABASE_URL");
    let params = json!({"namespace": "demo-app", "manifest": fixed});
    let r = call(&p, "k8s_apply", params.clone()).await;
    let (id, signals, changes) = pending(&r);
    assert_eq!(
        signals,
        json!([]),
        "a high tier change waits for a person even without signals"
    );
    assert_eq!(changes[0]["actions"], json!(["update"]), "{changes}");
    // The approver sees the diff: the env var's name, before and after.
    let shown = common::gateway(&w.home)
        .arg("--policies")
        .arg(gate.policies.path())
        .args(["approvals", "show", &id])
        .output()
        .expect("show");
    let shown = common::stdout(&shown);
    assert!(
        shown.contains("DATABSE_URL") && shown.contains("DATABASE_URL"),
        "{shown}"
    );
    gate.approve(&w, &id);
    let mut with_id = params;
    with_id["approval_id"] = json!(id);
    let r = call(&p, "k8s_apply", with_id).await;
    let (summary, _) = completed(&r);
    assert!(summary.contains("applied"), "{summary}");
    let env = w.kube.with(|s| {
        s.objects[&(
            "deployments".to_string(),
            "demo-app".to_string(),
            "web".to_string(),
        )]["spec"]["template"]["spec"]["containers"][0]["env"]
            .clone()
    });
    assert_eq!(env[0]["name"], "DATABASE_URL", "{env}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_manifest_is_refused_before_anything_is_minted() {
    let (w, p) = setup().await;
    let before = w.kube.with(|s| s.created.len());
    let cm = |meta: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"a": "b"}});
    for (manifest, why) in [
        (
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "evil"}}),
            "not one this tool applies",
        ),
        (
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "evil"}}),
            "not one this tool applies",
        ),
        (
            cm(json!({"name": "x", "namespace": "kube-system"})),
            "is not the call's",
        ),
        (cm(json!({"generateName": "x-"})), "generateName"),
        (
            cm(
                json!({"name": "x", "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace", "name": "demo-app", "uid": "u"}]}),
            ),
            "ownerReferences",
        ),
        (cm(json!({"name": "--dry-run=none"})), "DNS name"),
        (
            json!({"apiVersion": "apps/v1", "kind": "ConfigMap", "metadata": {"name": "x"}}),
            "apiVersion",
        ),
        (
            json!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: evil}\n"
            ),
            "must be a JSON object",
        ),
        (
            json!(
                "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
            ),
            "must be a JSON object",
        ),
    ] {
        let r = call(
            &p,
            "k8s_apply",
            json!({"namespace": "demo-app", "manifest": manifest}),
        )
        .await;
        let Outcome::Denied { reasons, .. } = &r.outcome else {
            panic!("{manifest} was not denied: {:?}", r.outcome);
        };
        assert!(
            reasons.iter().any(|x| x.contains(why)),
            "{manifest}: {reasons:?}"
        );
    }
    assert_eq!(
        w.kube.with(|s| s.created.len()),
        before,
        "a denied change minted a credential or wrote"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_what_holds_data_says_so_and_deletes_only_the_approved_object() {
    let (w, p, gate) = setup_with_approver().await;
    w.kube.with(|s| {
        s.put(
            "statefulsets",
            "demo-app",
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "db", "namespace": "demo-app"}, "spec": {"replicas": 1}}),
        );
    });
    let params = json!({"namespace": "demo-app", "kind": "statefulsets", "name": "db"});
    let r = call(&p, "k8s_delete", params.clone()).await;
    let (id, signals, changes) = pending(&r);
    let kinds: Vec<&str> = signals
        .as_array()
        .expect("signals")
        .iter()
        .filter_map(|s| s["kind"].as_str())
        .collect();
    assert!(kinds.contains(&"delete_data"), "{signals}");
    assert_eq!(changes[0]["actions"], json!(["delete"]));
    // (The fake reads a DELETE's options from its body when it has one and
    // then ignores the query, as the API server does: a dry run said only
    // in the query deleted the StatefulSet here before anyone approved.)
    assert!(
        w.kube.with(|s| s.live("statefulsets").len()) == 1,
        "the dry run deleted nothing"
    );
    gate.approve(&w, &id);
    let mut with_id = params;
    with_id["approval_id"] = json!(id);
    let r = call(&p, "k8s_delete", with_id).await;
    let (summary, _) = completed(&r);
    assert!(summary.contains("deleted"), "{summary}");
    assert!(w.kube.with(|s| s.live("statefulsets").is_empty()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_object_is_created_as_the_dry_run_showed_it() {
    let (w, p, gate) = setup_with_approver().await;
    let manifest = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "web-flags", "labels": {"app": "web"}}, "data": {"FEATURE_X": "on"}});
    let params = json!({"namespace": "demo-app", "manifest": manifest});
    let r = call(&p, "k8s_apply", params.clone()).await;
    let (id, _, changes) = pending(&r);
    assert_eq!(changes[0]["actions"], json!(["create"]), "{changes}");
    assert!(
        w.kube.with(|s| !s.objects.contains_key(&(
            "configmaps".to_string(),
            "demo-app".to_string(),
            "web-flags".to_string()
        ))),
        "the dry run created nothing"
    );
    gate.approve(&w, &id);
    let mut with_id = params;
    with_id["approval_id"] = json!(id);
    let r = call(&p, "k8s_apply", with_id).await;
    completed(&r);
    let cm = w.kube.with(|s| {
        s.objects[&(
            "configmaps".to_string(),
            "demo-app".to_string(),
            "web-flags".to_string(),
        )]
            .clone()
    });
    assert_eq!(cm["data"], json!({"FEATURE_X": "on"}));
    assert_ne!(
        cm["metadata"]["uid"], "dry-run-web-flags",
        "the server assigned the uid, not the dry run"
    );
}

/// Plays the deployment controller and the kubelet for `demo-app/web`, as
/// the fake leaves them to its tests: once the Deployment's spec changes
/// (its generation passes `status.observedGeneration`) a ReplicaSet of the
/// new template is made and the Deployment's status says the rollout
/// began; a second later the kubelet starts its pod, which is ready only
/// when the template gives the app the `DATABASE_URL` it needs (else it
/// crash-loops as before and the rollout never ends), and the old
/// ReplicaSet is scaled down and its pod removed.
fn deployment_controller(w: &World, stop: &AtomicBool) {
    use sha2::Digest as _;
    let ns = "demo-app";
    let key = ("deployments".to_string(), ns.to_string(), "web".to_string());
    let mut started: Option<(String, String, Instant)> = None;
    let mut events = 0;
    let mut event =
        |s: &mut fake_kube::State, kind: &str, name: &str, ty: &str, reason: &str, msg: String| {
            events += 1;
            s.put(
                "events",
                ns,
                json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": format!("{name}.demo{events}"), "namespace": ns},
            "involvedObject": {"kind": kind, "name": name, "namespace": ns},
            "reason": reason, "type": ty, "message": msg, "count": 1,
            "lastTimestamp": "2026-12-07T00:10:00Z"}),
            );
        };
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(200));
        w.kube.with(|s| {
            let Some(dep) = s.objects.get(&key).cloned() else {
                return;
            };
            let generation = dep["metadata"]["generation"].as_i64().unwrap_or(1);
            let observed = dep["status"]["observedGeneration"].as_i64().unwrap_or(0);
            let replicas = dep["spec"]["replicas"].as_i64().unwrap_or(1);
            if generation > observed {
                // The deployment controller: a ReplicaSet for the template.
                let template = dep["spec"]["template"].clone();
                let hash = hex::encode(sha2::Sha256::digest(template.to_string()))[..10].to_string();
                let rs = format!("web-{hash}");
                let revision = 1 + s
                    .live("replicasets")
                    .iter()
                    .filter_map(|r| r["metadata"]["annotations"]["deployment.kubernetes.io/revision"].as_str()?.parse::<i64>().ok())
                    .max()
                    .unwrap_or(0);
                let mut t = template;
                t["metadata"]["labels"]["pod-template-hash"] = json!(hash);
                s.put("replicasets", ns, json!({
                    "apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "metadata": {"name": rs, "namespace": ns, "labels": {"app": "web", "pod-template-hash": hash},
                        "annotations": {"deployment.kubernetes.io/revision": revision.to_string()},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                            "uid": dep["metadata"]["uid"], "controller": true}]},
                    "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web", "pod-template-hash": hash}}, "template": t},
                    "status": {"replicas": 0}}));
                s.update("deployments", ns, "web", |d| {
                    d["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = json!(revision.to_string());
                    d["status"]["observedGeneration"] = json!(generation);
                    d["status"]["updatedReplicas"] = json!(replicas);
                    d["status"]["replicas"] = json!(replicas + 1);
                    d["status"]["conditions"][1] = json!({"type": "Progressing", "status": "True",
                        "reason": "ReplicaSetUpdated", "message": format!("ReplicaSet \"{rs}\" is progressing.")});
                });
                event(s, "Deployment", "web", "Normal", "ScalingReplicaSet", format!("Scaled up replica set {rs} from 0 to {replicas}"));
                started = Some((rs, hash, Instant::now()));
                return;
            }
            let Some((rs, hash, at)) = started.clone() else {
                return;
            };
            if at.elapsed() < Duration::from_secs(1) {
                return;
            }
            started = None;
            // The kubelet: the new pod runs; the app needs DATABASE_URL.
            let healthy = dep["spec"]["template"]["spec"]["containers"][0]["env"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| e["name"] == "DATABASE_URL");
            let pod = format!("{rs}-{}", &fake_kube::random_suffix()[..5]);
            let container = if healthy {
                json!({"name": "app", "ready": true, "restartCount": 0, "state": {"running": {"startedAt": "2026-12-07T00:10:01Z"}}})
            } else {
                json!({"name": "app", "ready": false, "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}})
            };
            s.put("pods", ns, json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": ns, "labels": {"app": "web", "pod-template-hash": hash}},
                "spec": {"nodeName": "kind-worker", "containers": dep["spec"]["template"]["spec"]["containers"]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if healthy { "True" } else { "False" }}],
                    "containerStatuses": [container]}}));
            event(s, "Pod", &pod, "Normal", "Started", "Started container app".into());
            if !healthy {
                s.previous_logs.insert(pod.clone(), b"starting web 1.4.2\npanic: DATABASE_URL is not set\n".to_vec());
                event(s, "Pod", &pod, "Warning", "BackOff", format!("Back-off restarting failed container app in pod {pod}"));
                return;
            }
            s.logs.insert(pod.clone(), b"starting web 1.4.2\nconnected to the database\nlistening on :8080\n".to_vec());
            // The old ReplicaSets scaled down, their pods gone.
            for old in s.live("replicasets") {
                let name = old["metadata"]["name"].as_str().unwrap_or("").to_string();
                if name != rs && old["spec"]["replicas"].as_i64().unwrap_or(0) > 0 {
                    s.update("replicasets", ns, &name, |r| r["spec"]["replicas"] = json!(0));
                    event(s, "Deployment", "web", "Normal", "ScalingReplicaSet", format!("Scaled down replica set {name} from 1 to 0"));
                }
            }
            for old in s.live("pods") {
                if old["metadata"]["labels"]["app"] == "web" && old["metadata"]["labels"]["pod-template-hash"] != hash.as_str() {
                    let name = old["metadata"]["name"].as_str().unwrap_or("").to_string();
                    s.remove("pods", ns, &name);
                }
            }
            s.update("deployments", ns, "web", |d| {
                d["status"] = json!({"observedGeneration": generation, "replicas": replicas, "updatedReplicas": replicas,
                    "readyReplicas": replicas, "availableReplicas": replicas,
                    "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                        "message": "Deployment has minimum availability."},
                        {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
                        "message": format!("ReplicaSet \"{rs}\" has successfully progressed.")}]});
            });
        });
    }
}

/// A daemon deciding with the default policies, its broker the world's
/// OpenBao, its cluster the world's fake API server.
fn daemon_on(w: &World) -> daemon::Daemon {
    daemon::os_user(daemon::AGENT);
    daemon::os_user(daemon::APPROVER);
    let token_file = w.dir.path().join("gateway-token");
    std::fs::write(&token_file, &w.gateway_token).expect("token file");
    let extra = format!(
        "[endpoints]\nkube-apiserver = {}\n[vault]\naddress = {:?}\nauth = \"token\"\ntoken_file = {:?}\n[kubernetes]\nca_file = {:?}\n",
        w.kube.port, w.bao.addr, token_file, w.ca_file
    );
    daemon::Daemon::start(&common::repo().join("policies"), &extra)
}

/// tests/mcp/kubernetes_demo.py `mode` as the agent OS user, its lines
/// printed as they come. Each `NEED-APPROVAL` is reviewed (`gateway
/// approvals show`, handed to `review` with the id) and approved by the
/// approver OS user, a member of the approvers' group, as a person would.
/// Returns the agent's exit status and what it printed.
fn run_agent(
    d: &daemon::Daemon,
    mode: &str,
    mut review: impl FnMut(&str, &str),
) -> (std::process::ExitStatus, String) {
    let workspace = daemon::owned_dir(daemon::AGENT);
    let agent_home = daemon::owned_dir(daemon::AGENT);
    let gateway = std::path::PathBuf::from(env!("CARGO_BIN_EXE_gateway"));
    let python = common::repo().join(".tools/venv-user/bin/python");
    assert!(
        python.is_file(),
        "the users' MCP client is installed by scripts/install-tools.sh mcp"
    );
    let mut agent = daemon::as_user(daemon::AGENT, agent_home.path(), &[], &python)
        .arg(common::repo().join("tests/mcp/kubernetes_demo.py"))
        .arg(mode)
        .arg(&gateway)
        .arg(&d.socket)
        .arg(workspace.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the agent");
    let mut to_agent = agent.stdin.take().expect("stdin");
    let from_agent = std::io::BufReader::new(agent.stdout.take().expect("stdout"));
    let mut said = String::new();
    for line in from_agent.lines().map_while(Result::ok) {
        println!("{line}");
        said.push_str(&line);
        said.push('\n');
        let Some(id) = line.strip_prefix("NEED-APPROVAL ") else {
            continue;
        };
        let approver_home = daemon::owned_dir(daemon::APPROVER);
        let run = |args: &[&str]| {
            let out = daemon::as_user(
                daemon::APPROVER,
                approver_home.path(),
                &[("GATEWAY_SOCKET", &d.socket)],
                &gateway,
            )
            .args(args)
            .output()
            .expect("gateway");
            let text = common::stdout(&out) + &common::stderr(&out);
            assert!(out.status.success(), "gateway {args:?}: {text}");
            text
        };
        let shown = run(&["approvals", "show", id]);
        review(id, &shown);
        let reason = "reviewed the diff";
        let out = run(&["approve", id, "--reason", reason]);
        println!(
            "\n== the approver: gateway approve {id} --reason {reason:?}\n   {}",
            out.trim()
        );
        writeln!(to_agent).expect("answer the agent");
    }
    (agent.wait().expect("agent"), said)
}

/// The README's second demo (`cargo test --test kubernetes_toolbox demo_ --
/// --nocapture`): a Deployment crash-loops because of a misspelt env var;
/// an agent (tests/mcp/kubernetes_demo.py, the MCP Python SDK, an
/// unprivileged OS user) finds why through the daemon's read tools and
/// proposes the fix with k8s_apply; the API server's dry run is the plan,
/// a second OS user in the approvers' group reviews it and approves it
/// with `gateway approve`, the apply runs, and the rollout finishes with
/// the new pod ready. Real daemon, OpenBao, gVisor and kubectl; the API
/// server is the FAKE one, this test playing its controllers.
#[test]
fn demo_a_crash_looping_deployment_is_found_and_fixed() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let w = rt.block_on(world());
    crash_looping(&w);
    let d = daemon_on(&w);
    println!("the Kubernetes demo: an agent fixes a crash-looping Deployment through the gateway");
    println!(
        "(real daemon, OpenBao, gVisor and kubectl; a FAKE API server, this test playing its controllers)\n"
    );
    let stop = AtomicBool::new(false);
    let (status, said) = std::thread::scope(|scope| {
        scope.spawn(|| deployment_controller(&w, &stop));
        let r = run_agent(&d, "demo", |id, shown| {
            println!("\n== the approver, another OS user: gateway approvals show {id}");
            for l in shown.lines() {
                println!("   {l}");
            }
            assert!(
                shown.contains("DATABSE_URL") && shown.contains("DATABASE_URL"),
                "the approver sees the env var's name before and after: {shown}"
            );
        });
        stop.store(true, Ordering::SeqCst);
        r
    });
    assert!(status.success(), "the agent failed: {said}\n{}", d.log());
    assert!(said.contains("AGENT DONE"), "{said}");
    // What the cluster now runs is the approved fix.
    let env = w.kube.with(|s| {
        s.objects[&(
            "deployments".to_string(),
            "demo-app".to_string(),
            "web".to_string(),
        )]["spec"]["template"]["spec"]["containers"][0]["env"]
            .clone()
    });
    assert_eq!(env[0]["name"], "DATABASE_URL", "{env}");
    // Every call's credential was revoked, the audit verifies, and the
    // Secret in the namespace reached neither the agent nor the gateway's
    // files.
    all_revoked(&w);
    d.assert_audit_verifies();
    let events = d.events();
    let spent: Vec<_> = events
        .iter()
        .filter(|e| e["event"] == "approval.spent")
        .collect();
    assert_eq!(spent.len(), 1, "{spent:?}");
    assert!(!said.contains(SECRET_VALUE));
    assert!(!everything_written(&d.home).contains(SECRET_VALUE));
    assert!(!d.log().contains(SECRET_VALUE));
    println!("\ndemo complete: the audit trail verifies; every credential was revoked");
}

/// No ServiceAccount a credential made is left (within 15 s).
fn all_revoked(w: &World) {
    let until = Instant::now() + Duration::from_secs(15);
    while !w.kube.with(|s| s.live("serviceaccounts").is_empty()) {
        assert!(Instant::now() < until, "a credential outlived its call");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every Kubernetes tool of the default catalog, through the daemon, from
/// the MCP Python SDK as an unprivileged OS user, on the fake API server:
/// the reads complete, the medium changes (no signal) are applied at once,
/// the high ones after another OS user's approval, each as its dry run
/// planned it.
#[test]
fn every_kubernetes_tool_works_through_the_daemon_from_the_python_sdk() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let w = rt.block_on(world());
    crash_looping(&w);
    w.kube.with(|s| {
        s.metrics_api = true;
        s.put(
            "podmetrics",
            "demo-app",
            fake_kube::pod_metrics("demo-app", "web-5c4b-x7k2p", &[("app", 5, 20)]),
        );
    });
    let d = daemon_on(&w);
    let mut reviewed = Vec::new();
    let (status, said) = run_agent(&d, "tour", |id, shown| {
        reviewed.push((id.to_string(), shown.to_string()));
    });
    assert!(status.success(), "the agent failed: {said}\n{}", d.log());
    assert!(said.contains("TOUR DONE"), "{said}");
    let tools: Vec<&str> = said
        .lines()
        .filter_map(|l| l.strip_prefix("TOOL ")?.split_whitespace().next())
        .collect();
    assert_eq!(
        tools,
        [
            "k8s_get_pod_status",
            "k8s_get",
            "k8s_describe",
            "k8s_logs",
            "k8s_events",
            "k8s_rollout_status",
            "k8s_rollout_history",
            "k8s_top",
            "k8s_scale",
            "k8s_rollout_restart",
            "k8s_set_image",
            "k8s_rollout_undo",
            "k8s_apply",
            "k8s_delete"
        ]
    );
    assert_eq!(
        reviewed.len(),
        3,
        "the three high-tier changes waited for a person"
    );
    // The cluster holds what each change said.
    let (web, flags, config) = w.kube.with(|s| {
        let get = |r: &str, n: &str| {
            s.objects
                .get(&(r.to_string(), "demo-app".to_string(), n.to_string()))
                .cloned()
        };
        (
            get("deployments", "web"),
            get("configmaps", "web-flags"),
            get("configmaps", "web-config"),
        )
    });
    let web = web.expect("web");
    assert_eq!(web["spec"]["replicas"], 2, "{web}");
    // Undone to revision 1: the template (and its image) of web-7d9f, the
    // restart annotation and the pinned image gone with it.
    assert_eq!(
        web["spec"]["template"]["spec"]["containers"][0]["image"], "registry.example/web:1.4.1",
        "{web}"
    );
    assert_eq!(flags.expect("created")["data"]["beta"], "on");
    assert!(config.is_none(), "web-config was deleted");
    all_revoked(&w);
    d.assert_audit_verifies();
    let spent = d
        .events()
        .iter()
        .filter(|e| e["event"] == "approval.spent")
        .count();
    assert_eq!(spent, 3);
}

/// k8s_top: kubectl top's per-container usage from the metrics API, with
/// a token that may read PodMetrics and pods and nothing else; on a
/// cluster without a metrics API the call ends saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_reads_the_metrics_api_and_says_when_a_cluster_has_none() {
    let (w, p) = setup().await;
    // No metrics-server: kubectl says so, and the call ends not ok.
    let r = call(&p, "k8s_top", json!({"namespace": "demo-app"})).await;
    match &r.outcome {
        Outcome::Completed {
            ok: false, summary, ..
        } => {
            assert!(summary.contains("Metrics API not available"), "{summary}")
        }
        other => panic!("{other:?}"),
    }
    w.kube.with(|s| {
        s.metrics_api = true;
        s.put(
            "podmetrics",
            "demo-app",
            fake_kube::pod_metrics("demo-app", "web-5c4b-x7k2p", &[("app", 250, 480)]),
        );
    });
    let r = call(&p, "k8s_top", json!({"namespace": "demo-app"})).await;
    let text = completed(&r).1["text"].as_str().expect("text").to_string();
    assert!(
        text.contains("web-5c4b-x7k2p") && text.contains("250m") && text.contains("480Mi"),
        "{text}"
    );
    let r = call(
        &p,
        "k8s_top",
        json!({"namespace": "demo-app", "name": "web-5c4b-x7k2p"}),
    )
    .await;
    assert!(
        completed(&r).1["text"]
            .as_str()
            .is_some_and(|t| t.contains("480Mi"))
    );
    // What its token may do: the metrics API's pods and the pods.
    let rules: Vec<Value> = w.kube.with(|s| {
        s.created
            .iter()
            .filter(|(r, b)| r == "rolebindings" && b["subjects"][0]["name"] != "openbao")
            .filter_map(|(_, b)| {
                let name = b["roleRef"]["name"].as_str()?.to_string();
                s.objects
                    .get(&("roles".to_string(), "demo-app".to_string(), name))
                    .map(|r| r["rules"].clone())
            })
            .collect()
    });
    assert_eq!(
        rules[0],
        json!([{"apiGroups": ["metrics.k8s.io"], "resources": ["pods"], "verbs": ["get", "list"]},
               {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}])
    );
    let refused: Vec<String> = w.kube.with(|s| {
        s.seen
            .iter()
            .filter(|r| r.status == 403 || r.status == 401)
            .map(|r| format!("{} {} {}", r.method, r.path, r.status))
            .collect()
    });
    assert!(refused.is_empty(), "{refused:#?}");
}

/// A manifest padded with changes (70 annotations) to push a risky field
/// past what the approval page shows with values: the plan says so in a
/// signal, and the page names every field it does not show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_padded_past_what_the_page_shows_is_a_signal() {
    let (w, p, gate) = setup_with_approver().await;
    let mut manifest = web_manifest(&w);
    for i in 0..70 {
        manifest["metadata"]["annotations"][format!("a{i:02}.example.com/pad")] = json!("x");
    }
    // The risky field, sorted after every annotation.
    manifest["spec"]["template"]["spec"]["containers"][0]["image"] =
        json!("registry.example/web:1.4.3");
    let r = call(
        &p,
        "k8s_apply",
        json!({"namespace": "demo-app", "manifest": manifest}),
    )
    .await;
    let (id, signals, _) = pending(&r);
    let kinds: Vec<&str> = signals
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["kind"].as_str())
        .collect();
    assert!(kinds.contains(&"large_change"), "{signals}");
    let shown = common::gateway(&w.home)
        .arg("--policies")
        .arg(gate.policies.path())
        .args(["approvals", "show", &id])
        .output()
        .expect("show");
    let shown = common::stdout(&shown);
    assert!(
        shown.contains("approval page shows with their values")
            && shown.contains("more changed attributes")
            && shown.contains("spec.template.spec.containers[0].image"),
        "{shown}"
    );
}

/// demo-app/web as an agent writes its manifest from a read: without its
/// status and the fields the server owns.
fn web_manifest(w: &World) -> Value {
    let mut m = w.kube.with(|s| {
        s.objects[&(
            "deployments".to_string(),
            "demo-app".to_string(),
            "web".to_string(),
        )]
            .clone()
    });
    if let Some(o) = m.as_object_mut() {
        o.remove("status");
    }
    if let Some(meta) = m["metadata"].as_object_mut() {
        for k in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "managedFields",
            "generation",
            "namespace",
        ] {
            meta.remove(k);
        }
    }
    m
}
