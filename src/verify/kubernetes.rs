//! `gateway verify --backend kubernetes`: the isolation claims, proven on a
//! live cluster with probes in real sandbox Jobs (the runner image's
//! `gateway sandbox-probe`), not by reading configuration:
//!
//! 1. the sandbox's kernel is gVisor's;
//! 2. default-deny egress is enforced from the moment the tool could run: a
//!    probe server in a scratch namespace is reached from a pod there first
//!    (the network works), as is the egress canary (so its silence proves
//!    something), then NOT from a sandbox, whose probe connects as soon as
//!    the runner's lock-down check lets it (the same check steps wait for);
//! 3. the API server endpoint is reachable from a sandbox allowed it;
//! 4. a privileged pod in the sandbox namespace is rejected by admission
//!    (dry run: nothing is created);
//! 5. a minted pod-reader token lists pods in its namespace, is forbidden in
//!    `kube-system` and on secrets, and is refused once revoked: at once
//!    (403 while the API server's cache of authenticated tokens still knows
//!    it, about ten seconds on a real one), then 401;
//! 6. with `warm_pool` set: a warm sandbox becomes ready, takes a call's
//!    steps on its stdin (`pods/attach`) and runs them;
//! 7. the Kubernetes toolbox's credentials: a `k8s_get` token reads the
//!    namespace, a `k8s_apply` token's server-side dry run is admitted and
//!    creates nothing;
//! 8. the credential Roles in the cluster are the policy data's (the drift
//!    check of `gateway vault cluster-roles --check`).
//!
//! It needs a context allowed to create a namespace and pods (an operator's,
//! not the gateway's least-privilege account). Check 5 needs a broker.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::{Api, Client};
use serde_json::json;

use super::Check;
use crate::broker::Broker;
use crate::policy::CredentialScope;
use crate::sandbox::kubernetes::{KubeSandboxConfig, KubernetesSandbox};
use crate::sandbox::{Endpoint, Limits, Network, Sandbox, SandboxRequest};

const EGRESS: &str = "default-deny egress from the start (a pod-to-pod baseline and the canary connect, the sandbox does not)";

/// How long a revoked token may still be known to the API server's cache
/// of authenticated tokens (10 s on kube-apiserver), with room.
const TOKEN_CACHE: Duration = Duration::from_secs(30);

/// The scratch namespace of check 2 (created and deleted by verify).
pub const VERIFY_NAMESPACE: &str = "gateway-verify";

fn probe(name: &str, args: &[&str], network: Network) -> SandboxRequest {
    let mut argv = vec![crate::protocol::RUNNER.to_string(), "probe".into()];
    argv.extend(args.iter().map(|s| s.to_string()));
    SandboxRequest {
        name: format!("verify-{name}-{}", std::process::id()),
        argv,
        env: vec![],
        binds: vec![],
        workdir: None,
        files_in: vec![],
        credential: None,
        limits: Limits::default(),
        deadline: Duration::from_secs(120),
        network,
        files_out: vec![],
        on_stderr_line: None,
        image: None,
    }
}

/// The backend of check 2's baseline pod: in the scratch namespace, no
/// lock-down to wait for (no canary), and no warm pods (nor the warning
/// that a pool without a canary makes none, which every verify printed
/// although the gateway's own pool was set up right).
pub fn baseline_config(cfg: &KubeSandboxConfig) -> KubeSandboxConfig {
    KubeSandboxConfig {
        namespace: VERIFY_NAMESPACE.into(),
        egress_canary: None,
        warm_pool: 0,
        ..cfg.clone()
    }
}

/// Progress, as each check starts (a check that waits on a pod the
/// scheduler cannot place says so in the log meanwhile).
pub fn step(n: usize, what: &str) {
    eprintln!("verify: [{n}/8] {what}…");
}

fn check(name: &'static str, pass: bool, detail: impl Into<String>) -> Check {
    Check {
        name,
        pass,
        detail: detail.into(),
    }
}

/// What a probe said, in one line.
fn said(r: &Result<crate::sandbox::SandboxResult, crate::sandbox::SandboxError>) -> String {
    match r {
        Ok(r) => format!(
            "exit {:?}, {}",
            r.exit_code,
            format!("{} {}", r.stdout.text(), r.stderr.text())
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        ),
        Err(e) => e.to_string(),
    }
}

/// The probe server of check 2: a pod in the scratch namespace; its IP.
async fn probe_server(client: &Client, cfg: &KubeSandboxConfig) -> Result<String, String> {
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": VERIFY_NAMESPACE,
        "labels": {"app.kubernetes.io/part-of": "gateway", "pod-security.kubernetes.io/enforce": "restricted"}}}))
    .map_err(|e| e.to_string())?;
    match nss.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(format!("creating namespace {VERIFY_NAMESPACE}: {e}")),
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), VERIFY_NAMESPACE);
    let name = format!("verify-server-{}", std::process::id());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "gateway", "gateway.dev/verify": "server"}},
        "spec": {"runtimeClassName": cfg.runtime_class, "automountServiceAccountToken": false, "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65534, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "server", "image": cfg.image, "imagePullPolicy": cfg.image_pull_policy,
                "command": [crate::protocol::RUNNER, "probe", "serve", "8080"],
                "ports": [{"containerPort": 8080}],
                "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"]}}}]}}))
    .map_err(|e| e.to_string())?;
    pods.create(&PostParams::default(), &pod)
        .await
        .map_err(|e| format!("creating the probe server: {e}"))?;
    // Wait (watching) for it to run and have an IP.
    let wp = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(120);
    let stream = pods
        .watch(&wp, "0")
        .await
        .map_err(|e| format!("watching the probe server: {e}"))?;
    let mut stream = std::pin::pin!(stream);
    while let Some(ev) = stream.next().await {
        if let Ok(WatchEvent::Added(p) | WatchEvent::Modified(p)) = ev {
            let st = p.status.unwrap_or_default();
            if st.phase.as_deref() == Some("Running")
                && let Some(ip) = st.pod_ip
            {
                return Ok(ip);
            }
        }
    }
    Err("the probe server never ran".into())
}

/// Run every check. `api_port` is the API server port sandboxes connect to;
/// `scope` and `broker` (when a broker is configured) drive check 5.
pub async fn verify_kubernetes(
    sb: &KubernetesSandbox,
    base: &kube::Config,
    api_port: u16,
    token_check: Option<(&dyn Broker, &CredentialScope)>,
) -> Vec<Check> {
    let cfg = sb.config().clone();
    let client = match Client::try_from(base.clone()) {
        Ok(c) => c,
        Err(e) => return vec![check("cluster reachable", false, e.to_string())],
    };
    let mut checks = Vec::new();

    // 1. gVisor.
    step(1, "the sandbox's kernel is gVisor's");
    let r = sb.run(probe("kernel", &["kernel"], Network::None)).await;
    let gvisor = r
        .as_ref()
        .is_ok_and(|r| r.success() && r.stdout.text().contains("release 4.4.0"));
    checks.push(check("the sandbox's kernel is gVisor's", gvisor, said(&r)));

    // 2. Default-deny egress, after a baseline that proves the network works.
    step(2, EGRESS);
    match probe_server(&client, &cfg).await {
        Ok(ip) => {
            let target = format!("{ip}:8080");
            // The baseline pod is not a sandbox: no lock-down to wait for.
            let scratch = KubernetesSandbox::new(client.clone(), baseline_config(&cfg));
            let baseline = scratch
                .run(probe("baseline", &["connect", &target], Network::None))
                .await;
            let base_ok = baseline.as_ref().is_ok_and(|r| r.success());
            let (canary_ok, canary_said) = match &cfg.egress_canary {
                Some(canary) => {
                    let r = scratch
                        .run(probe("canary", &["connect", canary], Network::None))
                        .await;
                    (r.as_ref().is_ok_and(|r| r.success()), said(&r))
                }
                None => (
                    false,
                    "no [sandbox.kubernetes] egress_canary: a sandbox could reach anything until its NetworkPolicy takes effect".into(),
                ),
            };
            let denied = sb
                .run(probe("egress", &["connect", &target], Network::None))
                .await;
            let denied_ok = denied.as_ref().is_ok_and(|r| r.exit_code == Some(1));
            checks.push(check(
                EGRESS,
                base_ok && canary_ok && denied_ok,
                format!(
                    "baseline: {}; canary from the baseline namespace: {canary_said}; sandbox: {}",
                    said(&baseline),
                    said(&denied)
                ),
            ));
        }
        Err(e) => checks.push(check(EGRESS, false, e)),
    }
    let nss: Api<Namespace> = Api::all(client.clone());
    let _ = nss
        .delete(VERIFY_NAMESPACE, &DeleteParams::background())
        .await;

    // 3. The API server endpoint, for a sandbox allowed it.
    step(3, "the API server is reachable from a sandbox allowed it");
    let target = format!("kube-apiserver:{api_port}");
    let r = sb
        .run(probe(
            "apiserver",
            &["connect", &target],
            Network::Endpoints(vec![Endpoint {
                name: "kube-apiserver".into(),
                port: api_port,
            }]),
        ))
        .await;
    checks.push(check(
        "the API server endpoint is reachable from a sandbox allowed it",
        r.as_ref().is_ok_and(|r| r.success()),
        said(&r),
    ));

    // 4. Admission rejects a privileged pod in the sandbox namespace.
    step(4, "admission rejects a privileged pod");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &cfg.namespace);
    let privileged: Result<Pod, _> = serde_json::from_value(json!({
        "metadata": {"name": format!("verify-privileged-{}", std::process::id())},
        "spec": {"containers": [{"name": "p", "image": cfg.image, "securityContext": {"privileged": true}}]}}));
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let outcome = match privileged {
        Ok(p) => pods.create(&dry, &p).await,
        Err(e) => Err(kube::Error::Service(e.to_string().into())),
    };
    let (pass, detail) = match outcome {
        Err(kube::Error::Api(s)) if s.code == 403 => (true, format!("403: {}", s.message)),
        Err(e) => (false, format!("unexpected error: {e}")),
        Ok(_) => (false, "ADMITTED: a privileged pod passed admission".into()),
    };
    checks.push(check(
        "a privileged pod in the sandbox namespace is rejected by admission",
        pass,
        detail,
    ));

    // 5. A minted pod-reader token does exactly what its role says.
    step(
        5,
        "a minted token does what its scope allows and nothing else",
    );
    if let Some((broker, scope)) = token_check {
        checks.push(token_checks(base, broker, scope).await);
    }

    // 6. The warm pool, when there is one.
    step(6, "a warm sandbox becomes ready and takes a call");
    if sb.has_warm_pool() {
        checks.push(warm_pool_check(sb).await);
    }
    checks
}

/// Check 6: a first call of a shape (cold) teaches the pool; once a warm
/// pod of it is ready, a second call runs in it, its steps written to the
/// pod's stdin. The pool is closed afterwards and its pods deleted.
pub async fn warm_pool_check(sb: &KubernetesSandbox) -> Check {
    const NAME: &str =
        "a warm sandbox becomes ready and takes a call's steps on its stdin (pods/attach)";
    let steps = vec![crate::protocol::Step {
        argv: vec![
            crate::protocol::RUNNER.into(),
            "probe".into(),
            "kernel".into(),
        ],
        stdout_file: None,
        mcp: None,
    }];
    let request = |n: u8| -> Result<SandboxRequest, String> {
        Ok(SandboxRequest {
            name: format!("verify-warm{n}-{}", std::process::id()),
            argv: crate::protocol::runner_argv(),
            files_in: vec![crate::sandbox::FileIn {
                path: crate::protocol::STEPS_FILE.into(),
                contents: serde_json::to_vec(&steps).map_err(|e| e.to_string())?,
            }],
            ..probe("warm", &[], Network::None)
        })
    };
    let outcome = async {
        let first = sb.run(request(1)?).await;
        if !first.as_ref().is_ok_and(|r| r.success()) {
            return Err(format!("the first (cold) call: {}", said(&first)));
        }
        let wait = Duration::from_secs(sb.config().lockdown_seconds + 180);
        let until = std::time::Instant::now() + wait;
        while sb.warm_ready() == 0 {
            if std::time::Instant::now() >= until {
                return Err(format!(
                    "no warm sandbox was ready within {} s of the first call",
                    wait.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let second = sb.run(request(2)?).await;
        let warm = second
            .as_ref()
            .is_ok_and(|r| r.stages.iter().any(|m| m.stage == "attached"));
        let ran = second
            .as_ref()
            .is_ok_and(|r| r.success() && r.stdout.text().contains("release "));
        match (warm, ran) {
            (true, true) => Ok(format!("ran in a warm pod: {}", said(&second))),
            (false, _) => Err(format!(
                "the call did not run in a warm pod: {}",
                said(&second)
            )),
            (true, false) => Err(format!("the warm pod's run: {}", said(&second))),
        }
    }
    .await;
    sb.close_pool().await;
    match outcome {
        Ok(detail) => check(NAME, true, detail),
        Err(detail) => check(NAME, false, detail),
    }
}

async fn token_checks(base: &kube::Config, broker: &dyn Broker, scope: &CredentialScope) -> Check {
    const NAME: &str = "a minted pod-reader token lists pods in its namespace, not in kube-system nor secrets, and dies on revoke";
    let ns = scope
        .params
        .get("kubernetes_namespace")
        .cloned()
        .unwrap_or_default();
    let cred = match broker.issue("verify", scope).await {
        Ok(c) => c,
        Err(e) => return check(NAME, false, format!("issuing: {e}")),
    };
    let token = String::from_utf8_lossy(cred.secret.expose()).into_owned();
    let mut cfg = base.clone();
    cfg.auth_info = kube::config::AuthInfo {
        token: Some(secrecy::SecretString::from(token)),
        ..kube::config::AuthInfo::default()
    };
    let code = |r: Result<(), kube::Error>| match r {
        Ok(()) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(_) => 0,
    };
    let (own, other, secrets) = match Client::try_from(cfg.clone()) {
        Ok(c) => {
            let lp = ListParams::default().limit(1);
            let own: Api<Pod> = Api::namespaced(c.clone(), &ns);
            let other: Api<Pod> = Api::namespaced(c.clone(), "kube-system");
            let secrets: Api<Secret> = Api::namespaced(c.clone(), &ns);
            (
                code(own.list(&lp).await.map(|_| ())),
                code(other.list(&lp).await.map(|_| ())),
                code(secrets.list(&lp).await.map(|_| ())),
            )
        }
        Err(e) => {
            let _ = broker.revoke(&cred.lease_id).await;
            return check(NAME, false, format!("client: {e}"));
        }
    };
    let revoked = broker.revoke(&cred.lease_id).await;
    // Refused at once; 401 once the API server's token cache lets go of it.
    let revoked_at = std::time::Instant::now();
    let mut answers: Vec<u16> = Vec::new();
    let after = match Client::try_from(cfg) {
        Ok(c) => {
            let own: Api<Pod> = Api::namespaced(c, &ns);
            loop {
                let a = code(own.list(&ListParams::default().limit(1)).await.map(|_| ()));
                answers.push(a);
                if a != 403 || revoked_at.elapsed() >= TOKEN_CACHE {
                    break a;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        Err(_) => 0,
    };
    let forbidden = answers.iter().filter(|a| **a == 403).count();
    let refused_throughout = answers.iter().all(|a| *a == 401 || *a == 403);
    let pass = own == 200
        && other == 403
        && secrets == 403
        && revoked.is_ok()
        && refused_throughout
        && after == 401;
    let after_text = if forbidden > 0 {
        format!(
            "403 for {:.1} s (the API server's token cache), then {after}",
            revoked_at.elapsed().as_secs_f64()
        )
    } else {
        after.to_string()
    };
    check(
        NAME,
        pass,
        format!(
            "pods in {ns}: {own}; pods in kube-system: {other}; secrets in {ns}: {secrets}; revoke: {}; after revoke: {after_text}",
            if revoked.is_ok() { "ok" } else { "failed" }
        ),
    )
}

/// Check 7: the Kubernetes toolbox's credentials on this cluster, as the
/// policy derives them: a `k8s_get` token lists the namespace's
/// Deployments, and a `k8s_apply` token's server-side dry run of a new
/// ConfigMap is admitted by the API server (its RBAC, admission and
/// validation) and creates nothing. Both tokens are revoked.
pub async fn toolbox_check(
    base: &kube::Config,
    broker: &dyn Broker,
    read: &CredentialScope,
    change: &CredentialScope,
    namespace: &str,
) -> Check {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::ConfigMap;
    const NAME: &str = "a k8s_get token reads the namespace, a k8s_apply token's server-side dry run is admitted and creates nothing";
    let with_token = |token: String| {
        let mut cfg = base.clone();
        cfg.auth_info = kube::config::AuthInfo {
            token: Some(secrecy::SecretString::from(token)),
            ..kube::config::AuthInfo::default()
        };
        Client::try_from(cfg)
    };
    let code = |e: &kube::Error| match e {
        kube::Error::Api(s) => format!("{} {}", s.code, s.message),
        other => other.to_string(),
    };
    // The read.
    let cred = match broker.issue("verify-read", read).await {
        Ok(c) => c,
        Err(e) => return check(NAME, false, format!("issuing the k8s_get credential: {e}")),
    };
    let listed = match with_token(String::from_utf8_lossy(cred.secret.expose()).into_owned()) {
        Ok(c) => Api::<Deployment>::namespaced(c, namespace)
            .list(&ListParams::default().limit(50))
            .await
            .map(|l| l.items.len())
            .map_err(|e| code(&e)),
        Err(e) => Err(e.to_string()),
    };
    let read_revoked = broker.revoke(&cred.lease_id).await.is_ok();
    // The dry run of a change.
    let name = format!("gateway-verify-{}", std::process::id());
    let cm: ConfigMap = match serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "gateway"}},
        "data": {"checked-by": "gateway verify"}}))
    {
        Ok(c) => c,
        Err(e) => return check(NAME, false, e.to_string()),
    };
    let cred = match broker.issue("verify-change", change).await {
        Ok(c) => c,
        Err(e) => {
            return check(
                NAME,
                false,
                format!("issuing the k8s_apply credential: {e}"),
            );
        }
    };
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let planned = match with_token(String::from_utf8_lossy(cred.secret.expose()).into_owned()) {
        Ok(c) => Api::<ConfigMap>::namespaced(c, namespace)
            .create(&dry, &cm)
            .await
            .map_err(|e| code(&e)),
        Err(e) => Err(e.to_string()),
    };
    let change_revoked = broker.revoke(&cred.lease_id).await.is_ok();
    // Nothing was created: the operator's own eyes.
    let left = match Client::try_from(base.clone()) {
        Ok(c) => {
            let api = Api::<ConfigMap>::namespaced(c, namespace);
            let left = api
                .get_opt(&name)
                .await
                .map(|o| o.is_some())
                .map_err(|e| code(&e));
            // A server that ignored the dry run made it: verify leaves
            // nothing behind either way.
            if left == Ok(true) {
                let _ = api.delete(&name, &DeleteParams::default()).await;
            }
            left
        }
        Err(e) => Err(e.to_string()),
    };
    let pass = listed.is_ok()
        && planned
            .as_ref()
            .is_ok_and(|c| c.metadata.name.as_deref() == Some(name.as_str()))
        && left == Ok(false)
        && read_revoked
        && change_revoked;
    check(
        NAME,
        pass,
        format!(
            "deployments in {namespace}: {}; dry-run create of ConfigMap {namespace}/{name}: {}; afterwards in the cluster: {}; tokens revoked: {}",
            match &listed {
                Ok(n) => format!("listed ({n})"),
                Err(e) => format!("refused ({e})"),
            },
            match &planned {
                Ok(_) => "admitted".to_string(),
                Err(e) => format!("refused ({e})"),
            },
            match &left {
                Ok(false) => "absent".to_string(),
                Ok(true) => "PRESENT (a dry run created it)".to_string(),
                Err(e) => format!("unknown ({e})"),
            },
            if read_revoked && change_revoked {
                "both"
            } else {
                "NOT all"
            }
        ),
    )
}
