//! A FAKE Kubernetes API server for the tests — not a real one. No real API
//! server can run on these machines, so this one follows the documented API
//! for exactly what the gateway's tests exercise:
//!
//! - what OpenBao's Kubernetes secrets engine (client-go) sends when it
//!   mints and revokes a credential: ServiceAccounts, Roles, RoleBindings and
//!   TokenRequests (`serviceaccounts/NAME/token`), with **protobuf** request
//!   bodies (`application/vnd.kubernetes.protobuf`, the `k8s\0` envelope)
//!   or JSON; answers are JSON (client-go accepts it);
//! - what `kubectl get pods -o json` sends: discovery (`/api`, `/apis`,
//!   `/api/v1`) and `GET .../pods`;
//! - what the gateway's kubernetes backend (kube-rs) sends: Secrets, Jobs
//!   (`batch/v1`), Pods and Events — create, get, list and **watch** with
//!   `labelSelector`/`fieldSelector` and `resourceVersion` (a watch replays
//!   the changes after the version it is given, then streams new ones),
//!   merge patches, pod logs, `pods/attach` over a WebSocket
//!   (`v5.channel.k8s.io`, else `v4`; stdin only, as the gateway attaches;
//!   a container's `stdinOnce`: what a later session writes is dropped),
//!   deletion with `propagationPolicy` (the
//!   garbage collector removes what the deleted object owns unless
//!   `Orphan`), `409 AlreadyExists` / `404 NotFound` `Status` bodies. A
//!   "job controller" creates the Job's pod (or, when admission is set to
//!   reject, a `FailedCreate` Event instead) and follows it as the 1.31+
//!   controller does (`SuccessCriteriaMet`/`FailureTarget` first, then
//!   `Complete`/`Failed` once the pod has ended); **the test plays the
//!   kubelet** (pod phases, container states, logs, events on the pod such
//!   as `FailedCreatePodSandBox`), or the fake does, on a timing model of
//!   a node ([`Kubelet`]: scheduling, start, run, the kubelet's relist
//!   delay, followed logs); The server can be paused (every
//!   connection dropped, nothing listening) and resumed on the same port,
//!   and can answer every watch with an in-stream ERROR event (`watch_error`)
//!   as the real one does when etcd fails mid-watch; the job controller can
//!   take its time to make the pod (`pod_creation_delay`) and one
//!   resource's watches can lag, delivering nothing (`muted_watches`), as
//!   the real server's separate watch streams can;
//! - the real server's token authentication cache: a revoked token is
//!   forbidden (403) for `token_cache` before it is unauthorized (401);
//! - TLS with its own CA (the kubeconfig the gateway writes carries it),
//!   bearer-token authentication and RBAC: a minted token is a real
//!   three-part JWT with `exp`, valid only while its ServiceAccount exists
//!   and unexpired, and authorized only by the rules of the Roles bound to
//!   that ServiceAccount in that namespace (401/403 `Status` bodies as the
//!   real server sends them).
//!
//! It does not model a CNI: a NetworkPolicy is not enforced here at all, so
//! the window after a pod starts before its policy applies on a real CNI
//! is tested on the runner itself (tests/runner_binary.rs),
//! with a network that is open at first.
//!
//! Everything it was asked is recorded so tests can assert on it.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub content_type: String,
    /// Who asked: "admin" (the secrets engine's own JWT), a ServiceAccount
    /// `system:serviceaccount:NS:NAME`, or "anonymous"/"invalid".
    pub user: String,
    pub status: u16,
    /// When the request arrived.
    pub at: std::time::Instant,
    /// The request's query string ("" without one).
    pub query: String,
}

#[derive(Debug, Default)]
pub struct State {
    /// The token of `vault/openbao` ([`FakeKube::openbao_jwt`]).
    pub openbao_token: String,
    /// Objects by (resource, namespace, name), as JSON.
    pub objects: BTreeMap<(String, String, String), Value>,
    /// Minted tokens -> (namespace, service account, uid of the SA, exp).
    pub tokens: BTreeMap<String, (String, String, String, u64)>,
    /// Pods served per namespace.
    pub pods: BTreeMap<String, Vec<Value>>,
    /// Every request, once answered.
    pub seen: Vec<Seen>,
    /// Refuse a namespaced object whose namespace does not exist, as the
    /// real API server does (`namespaces "x" not found`). Off by default:
    /// the backend tests make Jobs without making their namespace first.
    pub strict_namespaces: bool,
    /// The path of every request, as it arrives (before it is answered:
    /// a held `GET pods` is here while it waits).
    pub arrived: Vec<String>,
    /// Every created object, in order (kept after deletion).
    pub created: Vec<(String, Value)>,
    /// Every deleted object key, in order.
    pub deleted: Vec<(String, String, String)>,
    /// Hold `GET pods` this long before answering.
    pub pods_delay: Duration,
    /// Whether the cluster runs a metrics API (metrics-server): `/apis`
    /// lists `metrics.k8s.io/v1beta1` and its PodMetrics are served from
    /// the objects of resource `podmetrics` (see [`pod_metrics`]).
    pub metrics_api: bool,
    /// When set, the "job controller" cannot create pods: admission says this.
    pub reject_pods: Option<String>,
    /// Namespaces where the fake's Pod Security admission rejects
    /// privileged pods created directly.
    pub restricted_namespaces: Vec<String>,
    /// Container logs by pod name.
    pub logs: BTreeMap<String, Vec<u8>>,
    /// The log of a pod's container's previous (terminated) run, by pod
    /// name: what `previous=true` reads.
    pub previous_logs: BTreeMap<String, Vec<u8>>,
    /// When each line of `logs[pod]` was written (seconds since the epoch),
    /// for `sinceSeconds` and `timestamps` ([`State::log_line`]); a line
    /// with no time recorded counts as written now.
    pub log_times: BTreeMap<String, Vec<f64>>,
    /// Failures `GET pods/{name}/log` answers with, one per request, before
    /// it serves the log: (pod name prefix, HTTP status, reason, message),
    /// as the API server does when it cannot reach the kubelet (500) or
    /// sheds load (429/503). Only a pod whose name starts with the prefix
    /// takes the front failure, so a log read of another pod (a follow
    /// still open from an earlier call) cannot consume it.
    pub log_failures: std::collections::VecDeque<(String, u16, String, String)>,
    /// The query of every `GET pods/{name}/log`, in order.
    pub log_queries: Vec<BTreeMap<String, String>>,
    /// Deletions with their propagation policy: (resource, name, policy).
    pub deletions: Vec<(String, String, String)>,
    /// Every change, for watches: (resource version, type, resource, object).
    pub changes: Vec<(u64, String, String, Value)>,
    /// Watch requests received (each `?watch=true`).
    pub watches: usize,
    /// Watch streams open now (a client that stopped reading holds one).
    pub open_watches: usize,
    /// While set, every watch answers at once with an in-stream ERROR event
    /// (this status code, as the real server does when etcd or a webhook
    /// fails mid-watch) and ends.
    pub watch_error: Option<u16>,
    /// Resources whose watch streams stay open but deliver nothing while
    /// listed: one resource's watch lagging behind another's, as the real
    /// server's separate streams can.
    pub muted_watches: BTreeSet<String>,
    /// How long the "job controller" takes to create a Job's pod (zero: at
    /// once, in the Job's create request).
    pub pod_creation_delay: Duration,
    /// How long a deleted ServiceAccount's token still authenticates (the
    /// real API server caches successful token authentications for 10 s):
    /// its requests are then forbidden (403), not unauthorized (401).
    pub token_cache: Duration,
    /// When set, the fake plays the scheduler and the kubelet of every
    /// Job's pod itself, on this timing model ([`Kubelet`]); else the test
    /// plays them.
    pub kubelet: Option<Kubelet>,
    /// How long every request takes before it is answered (a real API
    /// server's round trip; zero here by default).
    pub request_latency: Duration,
    /// What each pod's container got on its stdin (the first attach
    /// session's; `stdinOnce`).
    pub stdin: BTreeMap<String, Vec<u8>>,
    /// Pods whose stdin is closed (their first attach session ended).
    pub stdin_closed: BTreeSet<String>,
    /// Attach sessions, by pod, in order.
    pub attaches: Vec<String>,
    /// While set, every attach is forbidden (403), as RBAC without
    /// `pods/attach` answers.
    pub refuse_attach: bool,
    /// While set, an attach is upgraded and then dropped at once, before
    /// anything it sends is read (a connection lost mid-attach).
    pub drop_attach: bool,
    /// When each pod's container really exited (the runtime's word, which
    /// the kubelet reports only at its next relist).
    pub exited: BTreeMap<String, std::time::Instant>,
    /// The kubelet's relist grid starts here.
    epoch: Option<std::time::Instant>,
    /// When each ServiceAccount was deleted.
    sa_deleted: BTreeMap<(String, String), std::time::Instant>,
    notify: Option<tokio::sync::broadcast::Sender<(u64, String, String, Value)>>,
    next_rv: u64,
    /// Resource versions below this are compacted away (etcd keeps a few
    /// minutes of history): a watch from one of them is answered with an
    /// `ERROR` event, `410 Expired`, and ends, as on a real server. The
    /// fake starts with its history compacted up to its first version.
    pub compacted: u64,
}

/// The timing model of a node (FAKE: the times are parameters, not
/// measured here). What it reproduces of the real kubelet:
///
/// - the scheduler binds the pod `schedule` after the Job's pod is made;
/// - the container starts `start` later (volumes, the runtime's sandbox,
///   the container), runs `run`, writes `log` as it ends and exits with
///   `exit_code`; a warm pod's runner (`pooled`) instead writes its ready
///   line after `gate`, then waits for a whole line on its stdin (an
///   attach) and runs the rest of `run` from then;
/// - the kubelet learns of each change only at its next relist (the PLEG
///   relists every `relist`, 1 s by default upstream, on a fixed grid) and
///   the status is in the API server `report` after that; two changes in
///   one relist period are reported as the last only;
/// - a log is readable only once the kubelet has the container running
///   (`400 … is waiting to start: ContainerCreating` before);
/// - a followed log (`follow=true`) streams what is written; at its end it
///   stops at once when the container has already exited, else the
///   kubelet notices the exit only at its next state check, every
///   `follow_check` (5 s upstream) from when it began waiting.
#[derive(Debug, Clone)]
pub struct Kubelet {
    pub schedule: Duration,
    pub start: Duration,
    pub run: Duration,
    /// The part of `run` the runner's network gate takes. A warm pod
    /// (`gateway-runner pooled`) writes its ready line after it, waits for
    /// a line on its stdin, and then runs the rest of `run`.
    pub gate: Duration,
    pub relist: Duration,
    pub report: Duration,
    pub follow_check: Duration,
    pub log: Vec<u8>,
    pub exit_code: i32,
}

impl Kubelet {
    /// When a change made at `at` is in the API server.
    fn reported(&self, epoch: std::time::Instant, at: std::time::Instant) -> std::time::Instant {
        if self.relist.is_zero() {
            return at + self.report;
        }
        let since = at.saturating_duration_since(epoch).as_nanos();
        let period = self.relist.as_nanos();
        let ticks = since.div_ceil(period);
        let next = epoch + Duration::from_nanos(u64::try_from(ticks * period).unwrap_or(u64::MAX));
        next + self.report
    }
}

/// The kubelet of [`Kubelet`] running `pod` to its end.
async fn kubelet(st: Arc<Mutex<State>>, ns: String, pod: String, k: Kubelet) {
    use std::time::Instant;
    let epoch = {
        let Ok(mut s) = st.lock() else { return };
        *s.epoch.get_or_insert_with(Instant::now)
    };
    tokio::time::sleep(k.schedule).await;
    let bound = st.lock().is_ok_and(|mut s| {
        s.update("pods", &ns, &pod, |p| {
            p["spec"]["nodeName"] = json!("node-1");
            p["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "True"}]);
        })
    });
    if !bound {
        return;
    }
    tokio::time::sleep(k.start).await;
    let started = Instant::now();
    let started_at = rfc3339(now());
    let pooled = st.lock().is_ok_and(|s| {
        s.objects
            .get(&("pods".to_string(), ns.clone(), pod.clone()))
            .is_some_and(|p| p["spec"]["containers"][0]["command"][1] == "pooled")
    });
    if pooled {
        return warm_kubelet(st, ns, pod, k, epoch, started, started_at).await;
    }
    let exits = started + k.run;
    let running_seen = k.reported(epoch, started);
    let end_seen = k.reported(epoch, exits);
    if running_seen < end_seen {
        tokio::time::sleep_until(running_seen.into()).await;
        let Ok(mut s) = st.lock() else { return };
        let alive = s.update("pods", &ns, &pod, |p| {
            p["status"] = json!({"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [{"name": "runner", "ready": true, "restartCount": 0,
                "image": "gateway-runner:0.1.0", "imageID": "", "state": {"running": {}}}]});
        });
        if !alive {
            return;
        }
    }
    tokio::time::sleep_until(exits.into()).await;
    {
        let Ok(mut s) = st.lock() else { return };
        if !s
            .objects
            .contains_key(&("pods".to_string(), ns.clone(), pod.clone()))
        {
            return;
        }
        s.logs.insert(pod.clone(), k.log.clone());
        s.exited.insert(pod.clone(), Instant::now());
    }
    tokio::time::sleep_until(end_seen.into()).await;
    report_ended(&st, &ns, &pod, k.exit_code, &started_at);
}

/// The kubelet reports the pod's container ended with `exit_code`.
fn report_ended(st: &Arc<Mutex<State>>, ns: &str, pod: &str, exit_code: i32, started_at: &str) {
    let (phase, reason) = if exit_code == 0 {
        ("Succeeded", "Completed")
    } else {
        ("Failed", "Error")
    };
    if let Ok(mut s) = st.lock() {
        s.update("pods", ns, pod, |p| {
            p["status"] = json!({"phase": phase, "conditions": [{"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [{"name": "runner", "ready": false, "restartCount": 0,
                "image": "gateway-runner:0.1.0", "imageID": "",
                "state": {"terminated": {"exitCode": exit_code, "reason": reason,
                    "startedAt": started_at, "finishedAt": rfc3339(now())}}}]});
        });
    }
}

/// The rest of [`kubelet`] for a warm pod: running (at the next relist),
/// its ready line after `gate`, then, once a whole line is on its stdin,
/// the rest of `run`, its log, its exit.
async fn warm_kubelet(
    st: Arc<Mutex<State>>,
    ns: String,
    pod: String,
    k: Kubelet,
    epoch: std::time::Instant,
    started: std::time::Instant,
    started_at: String,
) {
    use std::time::Instant;
    let key = ("pods".to_string(), ns.clone(), pod.clone());
    tokio::time::sleep_until(k.reported(epoch, started).into()).await;
    let alive = st.lock().is_ok_and(|mut s| {
        s.update("pods", &ns, &pod, |p| {
            p["status"] = json!({"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [{"name": "runner", "ready": true, "restartCount": 0,
                "image": "gateway-runner:0.1.0", "imageID": "", "state": {"running": {"startedAt": started_at}}}]});
        })
    });
    if !alive {
        return;
    }
    tokio::time::sleep_until((started + k.gate).into()).await;
    match st.lock() {
        Ok(mut s) if s.objects.contains_key(&key) => {
            s.logs.insert(pod.clone(), b"r ready\n".to_vec());
        }
        _ => return,
    }
    // Its runner reads one line from stdin; a stdin that closes before
    // the line is whole ends it (exit 125, nothing run).
    let whole = loop {
        {
            let Ok(s) = st.lock() else { return };
            if !s.objects.contains_key(&key) {
                return;
            }
            if s.stdin.get(&pod).is_some_and(|b| b.contains(&b'\n')) {
                break true;
            }
            if s.stdin_closed.contains(&pod) {
                break false;
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let (tail, exit_code) = if whole {
        (k.log.clone(), k.exit_code)
    } else {
        (
            b"e gateway-runner: stdin ended before the call was whole; nothing was run\nx 125\n"
                .to_vec(),
            125,
        )
    };
    let exits = Instant::now()
        + if whole {
            k.run.saturating_sub(k.gate)
        } else {
            Duration::ZERO
        };
    tokio::time::sleep_until(exits.into()).await;
    {
        let Ok(mut s) = st.lock() else { return };
        if !s.objects.contains_key(&key) {
            return;
        }
        let mut log = b"r ready\n".to_vec();
        log.extend_from_slice(&tail);
        s.logs.insert(pod.clone(), log);
        s.exited.insert(pod.clone(), Instant::now());
    }
    tokio::time::sleep_until(k.reported(epoch, exits).into()).await;
    report_ended(&st, &ns, &pod, exit_code, &started_at);
}

/// `GET pods/{name}/attach` with a WebSocket upgrade, as the API server
/// (and the kubelet behind it) answers it: authorized as `get` and
/// `create` on `pods/attach`, only to a running container whose `stdin`
/// is open, the channel protocol `v5.channel.k8s.io` (else `v4`); what
/// the client writes on channel 0 is the container's stdin until the
/// session ends or a v5 close of channel 0, after which (`stdinOnce`) the
/// stdin is closed for good.
async fn attach(
    mut req: Request<Incoming>,
    st: Arc<Mutex<State>>,
    admin: String,
) -> Response<Body> {
    let path = req.uri().path().to_string();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (ns, pod) = match parts.as_slice() {
        ["api", "v1", "namespaces", ns, "pods", pod, "attach"] => (ns.to_string(), pod.to_string()),
        _ => {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                "not found".into(),
                json!({}),
            );
        }
    };
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let auth = header("authorization");
    let key = header("sec-websocket-key").unwrap_or_default();
    let protocols = header("sec-websocket-protocol").unwrap_or_default();
    {
        let mut s = st.lock().expect("state");
        s.arrived.push(path.clone());
        let who = s.who(auth.as_deref(), &admin);
        let ok = !s.refuse_attach
            && match &who {
                Who::Admin => true,
                Who::Sa { ns: sa_ns, name } => ["get", "create"]
                    .iter()
                    .all(|verb| s.allowed(sa_ns, name, verb, "", "pods/attach", Some(&pod), &ns)),
                _ => false,
            };
        if !ok {
            return match &who {
                Who::Sa { ns: sa_ns, name } => forbidden_error(
                    &format!("system:serviceaccount:{sa_ns}:{name}"),
                    "create",
                    "pods",
                    "pods/attach",
                    Some(&pod),
                    &ns,
                ),
                // The admin, when the test refuses attaches outright.
                Who::Admin => forbidden_error(
                    "system:serviceaccount:vault:openbao",
                    "create",
                    "pods",
                    "pods/attach",
                    Some(&pod),
                    &ns,
                ),
                _ => status(
                    StatusCode::UNAUTHORIZED,
                    "Unauthorized",
                    "Unauthorized".into(),
                    json!({}),
                ),
            };
        }
        let Some(p) = s
            .objects
            .get(&("pods".to_string(), ns.clone(), pod.clone()))
        else {
            return not_found_error("pods", &pod);
        };
        if p["status"]["phase"] != "Running" {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("pod {pod} is not running"),
                json!({}),
            );
        }
        if p["spec"]["containers"][0]["stdin"] != true {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("stdin is not enabled for container runner of pod {pod}"),
                json!({}),
            );
        }
        s.attaches.push(pod.clone());
    }
    let proto = if protocols
        .split(',')
        .any(|p| p.trim() == "v5.channel.k8s.io")
    {
        "v5.channel.k8s.io"
    } else {
        "v4.channel.k8s.io"
    };
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        use futures::StreamExt;
        use tokio_tungstenite::tungstenite::Message;
        let Ok(upgraded) = upgrade.await else { return };
        let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            hyper_util::rt::TokioIo::new(upgraded),
            tokio_tungstenite::tungstenite::protocol::Role::Server,
            None,
        )
        .await;
        if st.lock().is_ok_and(|s| s.drop_attach) {
            drop(ws);
            if let Ok(mut s) = st.lock() {
                s.stdin_closed.insert(pod.clone());
            }
            return;
        }
        let open = |s: &State| !s.stdin_closed.contains(&pod);
        while let Some(Ok(msg)) = ws.next().await {
            let Message::Binary(data) = msg else {
                if matches!(msg, Message::Close(_)) {
                    break;
                }
                continue;
            };
            let Ok(mut s) = st.lock() else { return };
            match data.first() {
                Some(0) if open(&s) => s
                    .stdin
                    .entry(pod.clone())
                    .or_default()
                    .extend_from_slice(&data[1..]),
                Some(255) if data.get(1) == Some(&0) => {
                    s.stdin_closed.insert(pod.clone());
                }
                _ => {}
            }
        }
        if let Ok(mut s) = st.lock() {
            s.stdin_closed.insert(pod.clone());
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("upgrade", "websocket")
        .header("connection", "Upgrade")
        .header("sec-websocket-accept", accept)
        .header("sec-websocket-protocol", proto)
        .body(full(Bytes::new()))
        .expect("response")
}

/// Whether `pod`'s container has exited: the runtime's word when the
/// kubelet model runs it, else the status the test set.
fn container_exited(s: &State, ns: &str, pod: &str) -> bool {
    if s.exited.contains_key(pod) {
        return true;
    }
    match s
        .objects
        .get(&("pods".to_string(), ns.to_string(), pod.to_string()))
    {
        None => true,
        Some(p) => p["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["state"]["terminated"].is_object()),
    }
}

/// A followed log: what is written, as it is written, until the container
/// has exited (noticed as [`Kubelet`] says).
fn follow_log(st: Arc<Mutex<State>>, ns: String, pod: String, limit: Option<usize>) -> Body {
    let (tx, rx) = tokio::sync::mpsc::channel::<
        Result<hyper::body::Frame<Bytes>, std::convert::Infallible>,
    >(64);
    tokio::spawn(async move {
        let mut sent = 0usize;
        let mut waiting_since: Option<std::time::Instant> = None;
        loop {
            let (chunk, exited, check) = {
                let Ok(s) = st.lock() else { return };
                let log = s.logs.get(&pod).cloned().unwrap_or_default();
                let end = limit.map_or(log.len(), |l| log.len().min(l));
                let chunk = log.get(sent..end).unwrap_or_default().to_vec();
                let check = s
                    .kubelet
                    .as_ref()
                    .map_or(Duration::ZERO, |k| k.follow_check);
                (chunk, container_exited(&s, &ns, &pod), check)
            };
            if !chunk.is_empty() {
                sent += chunk.len();
                waiting_since = None;
                if tx
                    .send(Ok(hyper::body::Frame::data(Bytes::from(chunk))))
                    .await
                    .is_err()
                {
                    return;
                }
                continue;
            }
            if limit.is_some_and(|l| sent >= l) {
                return;
            }
            // At the end of what is written: stop at once when the
            // container is gone (the kubelet asks the runtime before it
            // waits); else its exit is noticed at a check every `check`.
            let first = waiting_since.is_none();
            let since = *waiting_since.get_or_insert_with(std::time::Instant::now);
            if exited {
                let waited = since.elapsed();
                if check.is_zero() || first {
                    return;
                }
                let periods = waited.as_nanos().div_ceil(check.as_nanos()).max(1);
                let at = since
                    + Duration::from_nanos(
                        u64::try_from(periods * check.as_nanos()).unwrap_or(u64::MAX),
                    );
                tokio::time::sleep_until(at.into()).await;
                // Whatever came meanwhile is sent before the end.
                let log = match st.lock() {
                    Ok(s) => s.logs.get(&pod).cloned().unwrap_or_default(),
                    Err(_) => return,
                };
                let end = limit.map_or(log.len(), |l| log.len().min(l));
                if end > sent {
                    let _ = tx
                        .send(Ok(hyper::body::Frame::data(Bytes::copy_from_slice(
                            &log[sent..end],
                        ))))
                        .await;
                }
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    http_body_util::StreamBody::new(tokio_stream_from(rx)).boxed()
}

pub struct FakeKube {
    pub port: u16,
    acceptor: tokio_rustls::TlsAcceptor,
    shutdown: tokio::sync::watch::Sender<u64>,
    /// PEM of the CA that signed the server's certificate.
    pub ca_pem: String,
    /// The JWT the secrets engine authenticates with (full access).
    pub admin_jwt: String,
    /// A token of the ServiceAccount `vault/openbao`, what OpenBao's
    /// Kubernetes secrets engine authenticates with: held to RBAC like any
    /// service account (cluster/vault-rbac.yaml and the generated
    /// credential roles grant it its rights, once applied with
    /// [`State::apply_cluster_assets`]).
    pub openbao_jwt: String,
    pub state: Arc<Mutex<State>>,
    task: Mutex<tokio::task::JoinHandle<()>>,
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        if let Ok(t) = self.task.lock() {
            t.abort();
        }
        self.shutdown.send_modify(|g| *g += 1);
    }
}

type Body = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

/// The k8s protobuf messages the secrets engine sends, with the field
/// numbers of k8s.io/api's generated.proto (only the fields read here).
mod pb {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Unknown {
        #[prost(message, optional, tag = "1")]
        pub type_meta: Option<TypeMeta>,
        #[prost(bytes = "vec", optional, tag = "2")]
        pub raw: Option<Vec<u8>>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TypeMeta {
        #[prost(string, optional, tag = "1")]
        pub api_version: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub kind: Option<String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ObjectMeta {
        #[prost(string, optional, tag = "1")]
        pub name: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub generate_name: Option<String>,
        #[prost(string, optional, tag = "3")]
        pub namespace: Option<String>,
        #[prost(btree_map = "string, string", tag = "11")]
        pub labels: std::collections::BTreeMap<String, String>,
        #[prost(btree_map = "string, string", tag = "12")]
        pub annotations: std::collections::BTreeMap<String, String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WithMeta {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<ObjectMeta>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PolicyRule {
        #[prost(string, repeated, tag = "1")]
        pub verbs: Vec<String>,
        #[prost(string, repeated, tag = "2")]
        pub api_groups: Vec<String>,
        #[prost(string, repeated, tag = "3")]
        pub resources: Vec<String>,
        #[prost(string, repeated, tag = "4")]
        pub resource_names: Vec<String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Role {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<ObjectMeta>,
        #[prost(message, repeated, tag = "2")]
        pub rules: Vec<PolicyRule>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Subject {
        #[prost(string, optional, tag = "1")]
        pub kind: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub api_group: Option<String>,
        #[prost(string, optional, tag = "3")]
        pub name: Option<String>,
        #[prost(string, optional, tag = "4")]
        pub namespace: Option<String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RoleRef {
        #[prost(string, optional, tag = "1")]
        pub api_group: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub kind: Option<String>,
        #[prost(string, optional, tag = "3")]
        pub name: Option<String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RoleBinding {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<ObjectMeta>,
        #[prost(message, repeated, tag = "2")]
        pub subjects: Vec<Subject>,
        #[prost(message, optional, tag = "3")]
        pub role_ref: Option<RoleRef>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TokenRequestSpec {
        #[prost(string, repeated, tag = "1")]
        pub audiences: Vec<String>,
        #[prost(int64, optional, tag = "4")]
        pub expiration_seconds: Option<i64>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TokenReviewSpec {
        #[prost(string, optional, tag = "1")]
        pub token: Option<String>,
        #[prost(string, repeated, tag = "2")]
        pub audiences: Vec<String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TokenReview {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<ObjectMeta>,
        #[prost(message, optional, tag = "2")]
        pub spec: Option<TokenReviewSpec>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TokenRequest {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<ObjectMeta>,
        #[prost(message, optional, tag = "2")]
        pub spec: Option<TokenRequestSpec>,
    }
}

fn meta_json(m: &Option<pb::ObjectMeta>) -> Value {
    let m = m.clone().unwrap_or_default();
    let mut o = serde_json::Map::new();
    if let Some(n) = m.name.filter(|s| !s.is_empty()) {
        o.insert("name".into(), json!(n));
    }
    if let Some(n) = m.generate_name.filter(|s| !s.is_empty()) {
        o.insert("generateName".into(), json!(n));
    }
    if let Some(n) = m.namespace.filter(|s| !s.is_empty()) {
        o.insert("namespace".into(), json!(n));
    }
    if !m.labels.is_empty() {
        o.insert("labels".into(), json!(m.labels));
    }
    if !m.annotations.is_empty() {
        o.insert("annotations".into(), json!(m.annotations));
    }
    Value::Object(o)
}

fn opt(s: &Option<String>) -> String {
    s.clone().unwrap_or_default()
}

/// Decode a request body (protobuf envelope or JSON) of `kind` into JSON.
fn decode_body(content_type: &str, body: &[u8], kind: &str) -> Result<Value, String> {
    use prost::Message;
    if !content_type.starts_with("application/vnd.kubernetes.protobuf") {
        return serde_json::from_slice(body).map_err(|e| format!("bad JSON body: {e}"));
    }
    let inner = body
        .strip_prefix(b"k8s\0")
        .ok_or("protobuf body without the k8s envelope")?;
    let unknown = pb::Unknown::decode(inner).map_err(|e| e.to_string())?;
    let raw = unknown.raw.unwrap_or_default();
    let tm = unknown.type_meta.unwrap_or_default();
    if opt(&tm.kind) != kind {
        return Err(format!("expected a {kind}, got {:?}", tm.kind));
    }
    let api_version = opt(&tm.api_version);
    Ok(match kind {
        "ServiceAccount" => {
            let o = pb::WithMeta::decode(&raw[..]).map_err(|e| e.to_string())?;
            json!({"apiVersion": api_version, "kind": kind, "metadata": meta_json(&o.metadata)})
        }
        "Role" => {
            let o = pb::Role::decode(&raw[..]).map_err(|e| e.to_string())?;
            let rules: Vec<Value> = o
                .rules
                .iter()
                .map(|r| {
                    json!({"verbs": r.verbs, "apiGroups": r.api_groups, "resources": r.resources,
                           "resourceNames": r.resource_names})
                })
                .collect();
            json!({"apiVersion": api_version, "kind": kind, "metadata": meta_json(&o.metadata), "rules": rules})
        }
        "RoleBinding" => {
            let o = pb::RoleBinding::decode(&raw[..]).map_err(|e| e.to_string())?;
            let subjects: Vec<Value> = o
                .subjects
                .iter()
                .map(|s| json!({"kind": opt(&s.kind), "apiGroup": opt(&s.api_group), "name": opt(&s.name), "namespace": opt(&s.namespace)}))
                .collect();
            let rr = o.role_ref.unwrap_or_default();
            json!({"apiVersion": api_version, "kind": kind, "metadata": meta_json(&o.metadata), "subjects": subjects,
                   "roleRef": {"apiGroup": opt(&rr.api_group), "kind": opt(&rr.kind), "name": opt(&rr.name)}})
        }
        "TokenRequest" => {
            let o = pb::TokenRequest::decode(&raw[..]).map_err(|e| e.to_string())?;
            let spec = o.spec.unwrap_or_default();
            json!({"apiVersion": api_version, "kind": kind, "metadata": meta_json(&o.metadata),
                   "spec": {"audiences": spec.audiences, "expirationSeconds": spec.expiration_seconds}})
        }
        "TokenReview" => {
            let o = pb::TokenReview::decode(&raw[..]).map_err(|e| e.to_string())?;
            let spec = o.spec.unwrap_or_default();
            json!({"apiVersion": api_version, "kind": kind, "metadata": meta_json(&o.metadata),
                   "spec": {"token": opt(&spec.token), "audiences": spec.audiences}})
        }
        other => return Err(format!("no protobuf decoder for {other}")),
    })
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Now, in seconds since the epoch, with the fraction.
fn now_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// RFC 3339 with nanoseconds, as the kubelet prefixes a log line
/// (`timestamps=true`): `2026-12-06T14:38:17.710037008Z`.
fn rfc3339_nano(secs: f64) -> String {
    let whole = secs.floor() as i64;
    let nanos = ((secs - secs.floor()) * 1e9) as u32;
    chrono::DateTime::from_timestamp(whole, nanos)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true))
        .unwrap_or_default()
}

fn rfc3339(secs: u64) -> String {
    chrono::DateTime::from_timestamp(secs as i64, 0)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A three-part JWT shaped like a bound service account token (the fake
/// does not sign: tokens are checked by lookup, as the real server checks
/// that the bound object still exists).
pub fn jwt(sub: &str, exp: u64, extra: Value) -> String {
    let header = json!({"alg": "RS256", "kid": "fake-kube-apiserver"});
    let mut jti = [0u8; 16];
    getrandom::fill(&mut jti).expect("random");
    let mut claims = json!({"iss": "https://kubernetes.default.svc.cluster.local", "sub": sub,
        "aud": ["https://kubernetes.default.svc.cluster.local"], "iat": now(), "nbf": now(), "exp": exp,
        "jti": hex::encode(jti)});
    if let (Some(c), Some(e)) = (claims.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    let mut sig = [0u8; 64];
    getrandom::fill(&mut sig).expect("random");
    format!(
        "{}.{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes()),
        b64(&sig)
    )
}

/// Whether an RBAC rule's list (`verbs`, `apiGroups`, `resources`) holds
/// `want` or `*`.
fn any(list: &Value, want: &str) -> bool {
    list.as_array()
        .into_iter()
        .flatten()
        .any(|v| v == "*" || v == want)
}

fn status(code: StatusCode, reason: &str, message: String, details: Value) -> Response<Body> {
    let mut body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16()});
    // kube-apiserver leaves `details` out when it has nothing in it (a 401,
    // a log's 400).
    if details.as_object().is_some_and(|d| !d.is_empty()) {
        body["details"] = details;
    }
    respond(code, body)
}

/// The API group of a resource the fake serves ("" for the core group).
pub fn group_of(resource: &str) -> &'static str {
    match resource {
        "jobs" => "batch",
        "roles" | "rolebindings" | "clusterroles" | "clusterrolebindings" => {
            "rbac.authorization.k8s.io"
        }
        "deployments" | "statefulsets" | "replicasets" => "apps",
        "networkpolicies" => "networking.k8s.io",
        "poddisruptionbudgets" => "policy",
        "runtimeclasses" => "node.k8s.io",
        "tokenreviews" => "authentication.k8s.io",
        _ => "",
    }
}

/// How kube-apiserver's messages name a resource: `jobs.batch`, `pods`.
fn qualified(resource: &str) -> String {
    match group_of(resource) {
        "" => resource.to_string(),
        g => format!("{resource}.{g}"),
    }
}

/// A `Status` error about `resource` (and object `name`), with the details
/// the real server gives: `name` when there is one, `group` unless core,
/// `kind` the resource (apimachinery's NewNotFound, NewAlreadyExists,
/// NewForbidden, NewConflict).
fn api_error(
    code: StatusCode,
    reason: &str,
    message: String,
    resource: &str,
    name: Option<&str>,
) -> Response<Body> {
    let mut details = json!({"kind": resource});
    if let Some(n) = name {
        details["name"] = json!(n);
    }
    if !group_of(resource).is_empty() {
        details["group"] = json!(group_of(resource));
    }
    status(code, reason, message, details)
}

/// 404 NotFound for `name` of `resource`, as the real server says it.
fn not_found_error(resource: &str, name: &str) -> Response<Body> {
    api_error(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{} \"{name}\" not found", qualified(resource)),
        resource,
        Some(name),
    )
}

/// 403 Forbidden for `user` doing `verb` on `authz_resource` (maybe a
/// subresource, `pods/attach`) of `resource` in `ns`, as RBAC's
/// authorizer says it.
fn forbidden_error(
    user: &str,
    verb: &str,
    resource: &str,
    authz_resource: &str,
    name: Option<&str>,
    ns: &str,
) -> Response<Body> {
    let subject = match name {
        Some(n) => format!("{} \"{n}\"", qualified(resource)),
        None => qualified(resource),
    };
    let scope = if ns.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{ns}\"")
    };
    api_error(
        StatusCode::FORBIDDEN,
        "Forbidden",
        format!(
            "{subject} is forbidden: User \"{user}\" cannot {verb} resource \"{authz_resource}\" in API group \"{}\" {scope}",
            group_of(resource)
        ),
        resource,
        name,
    )
}

/// One Namespace, or its 404.
fn namespace_get(st: &Arc<Mutex<State>>, name: &str) -> Response<Body> {
    let s = st.lock().expect("state");
    match s
        .objects
        .get(&("namespaces".to_string(), String::new(), name.to_string()))
    {
        Some(o) => respond(StatusCode::OK, o.clone()),
        None => not_found_error("namespaces", name),
    }
}

fn respond(code: StatusCode, body: Value) -> Response<Body> {
    let mut r = Response::new(full(body.to_string()));
    *r.status_mut() = code;
    r.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

/// Who a bearer token is.
enum Who {
    Admin,
    Sa { ns: String, name: String },
    Invalid,
    Anonymous,
}

impl State {
    fn who(&self, auth: Option<&str>, admin_jwt: &str) -> Who {
        let Some(token) = auth.and_then(|a| a.strip_prefix("Bearer ")) else {
            return Who::Anonymous;
        };
        if token == admin_jwt {
            return Who::Admin;
        }
        // OpenBao's service account (the fake's own: it is not among the
        // objects, so that a test's "no ServiceAccount is left" counts
        // only the credentials').
        if !self.openbao_token.is_empty() && token == self.openbao_token {
            return Who::Sa {
                ns: "vault".into(),
                name: "openbao".into(),
            };
        }
        match self.tokens.get(token) {
            Some((ns, name, uid, exp)) if *exp > now() => {
                // Valid only while the very ServiceAccount it was bound to exists.
                let key = ("serviceaccounts".to_string(), ns.clone(), name.clone());
                match self.objects.get(&key) {
                    Some(sa) if sa["metadata"]["uid"] == json!(uid) => Who::Sa {
                        ns: ns.clone(),
                        name: name.clone(),
                    },
                    // Deleted, but still in the authentication cache: the
                    // token authenticates and RBAC (its bindings gone)
                    // forbids everything.
                    None if self
                        .sa_deleted
                        .get(&(ns.clone(), name.clone()))
                        .is_some_and(|at| at.elapsed() < self.token_cache) =>
                    {
                        Who::Sa {
                            ns: ns.clone(),
                            name: name.clone(),
                        }
                    }
                    _ => Who::Invalid,
                }
            }
            _ => Who::Invalid,
        }
    }

    /// RBAC: may service account `ns/sa` do `verb` on `resource` (API
    /// group `group`, object `name` if the request names one) in
    /// `target_ns`? Only Roles bound in `target_ns`; a rule with
    /// `resourceNames` allows only those objects (never a list or create).
    #[allow(clippy::too_many_arguments)]
    pub fn allowed(
        &self,
        ns: &str,
        sa: &str,
        verb: &str,
        group: &str,
        resource: &str,
        name: Option<&str>,
        target_ns: &str,
    ) -> bool {
        let bindings = self
            .objects
            .iter()
            .filter(|((r, n, _), _)| r == "rolebindings" && n == target_ns)
            .map(|(_, v)| v);
        for b in bindings {
            let subject_matches =
                b["subjects"].as_array().into_iter().flatten().any(|s| {
                    s["kind"] == "ServiceAccount" && s["name"] == sa && s["namespace"] == ns
                });
            if !subject_matches {
                continue;
            }
            let role_name = b["roleRef"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            // A RoleBinding grants a Role of its namespace, or a
            // ClusterRole's rules within its namespace (RBAC docs,
            // "RoleBinding and ClusterRoleBinding").
            let role_key = match b["roleRef"]["kind"].as_str() {
                Some("Role") => ("roles".to_string(), target_ns.to_string(), role_name),
                Some("ClusterRole") => ("clusterroles".to_string(), String::new(), role_name),
                _ => continue,
            };
            let Some(role) = self.objects.get(&role_key) else {
                continue;
            };
            for rule in role["rules"].as_array().into_iter().flatten() {
                let names: Vec<&str> = rule["resourceNames"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                let name_ok = names.is_empty() || name.is_some_and(|n| names.contains(&n));
                if any(&rule["verbs"], verb)
                    && any(&rule["apiGroups"], group)
                    && any(&rule["resources"], resource)
                    && name_ok
                {
                    return true;
                }
            }
        }
        false
    }

    /// RBAC at the cluster scope: may service account `ns/sa` do `verb`
    /// on `resource` of `group`, through a ClusterRoleBinding to a
    /// ClusterRole (the built-in `system:auth-delegator` among them)?
    pub fn allowed_cluster(
        &self,
        ns: &str,
        sa: &str,
        verb: &str,
        group: &str,
        resource: &str,
    ) -> bool {
        self.objects
            .iter()
            .filter(|((r, _, _), _)| r == "clusterrolebindings")
            .map(|(_, b)| b)
            .filter(|b| {
                b["roleRef"]["kind"] == "ClusterRole"
                    && b["subjects"].as_array().into_iter().flatten().any(|s| {
                        s["kind"] == "ServiceAccount" && s["name"] == sa && s["namespace"] == ns
                    })
            })
            .filter_map(|b| {
                let name = b["roleRef"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                self.objects
                    .get(&("clusterroles".to_string(), String::new(), name))
            })
            .flat_map(|role| role["rules"].as_array().cloned().unwrap_or_default())
            .any(|rule| {
                any(&rule["verbs"], verb)
                    && any(&rule["apiGroups"], group)
                    && any(&rule["resources"], resource)
            })
    }

    /// Does `ns/sa` hold every permission of `rules` in `target_ns`? (What
    /// RBAC's escalation check asks of someone who writes a Role, or binds
    /// one, without `escalate` or `bind`.)
    fn holds_all(&self, ns: &str, sa: &str, rules: &Value, target_ns: &str) -> bool {
        rules.as_array().into_iter().flatten().all(|rule| {
            let list = |k: &str| -> Vec<String> {
                rule[k]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            };
            let names = list("resourceNames");
            list("verbs").iter().all(|verb| {
                list("apiGroups").iter().all(|group| {
                    list("resources").iter().all(|resource| {
                        if names.is_empty() {
                            self.allowed(ns, sa, verb, group, resource, None, target_ns)
                        } else {
                            names.iter().all(|n| {
                                self.allowed(ns, sa, verb, group, resource, Some(n), target_ns)
                            })
                        }
                    })
                })
            })
        })
    }

    /// RBAC's privilege escalation prevention ("Using RBAC Authorization",
    /// "Restrictions on role creation or update" and "on role binding
    /// creation or update"): a service account may write a Role only with
    /// `escalate` on roles or holding every permission it grants, and bind
    /// a Role or ClusterRole only with `bind` on it (by name, when the
    /// rule lists resourceNames) or holding every permission it grants.
    /// `None` when allowed; else the real server's message.
    pub fn escalation(
        &self,
        ns: &str,
        sa: &str,
        resource: &str,
        obj: &Value,
        target_ns: &str,
    ) -> Option<String> {
        let user = format!("system:serviceaccount:{ns}:{sa}");
        match resource {
            "roles" => {
                if self.allowed(
                    ns,
                    sa,
                    "escalate",
                    "rbac.authorization.k8s.io",
                    "roles",
                    None,
                    target_ns,
                ) || self.holds_all(ns, sa, &obj["rules"], target_ns)
                {
                    return None;
                }
                Some(format!(
                    "roles.rbac.authorization.k8s.io \"{}\" is forbidden: user \"{user}\" is attempting to grant RBAC permissions not currently held",
                    obj["metadata"]["name"].as_str().unwrap_or_default()
                ))
            }
            "rolebindings" => {
                let kind = obj["roleRef"]["kind"].as_str().unwrap_or_default();
                let name = obj["roleRef"]["name"].as_str().unwrap_or_default();
                let (role_resource, role) = if kind == "ClusterRole" {
                    (
                        "clusterroles",
                        self.objects.get(&(
                            "clusterroles".to_string(),
                            String::new(),
                            name.to_string(),
                        )),
                    )
                } else {
                    (
                        "roles",
                        self.objects.get(&(
                            "roles".to_string(),
                            target_ns.to_string(),
                            name.to_string(),
                        )),
                    )
                };
                if self.allowed(
                    ns,
                    sa,
                    "bind",
                    "rbac.authorization.k8s.io",
                    role_resource,
                    Some(name),
                    target_ns,
                ) || role.is_some_and(|r| self.holds_all(ns, sa, &r["rules"], target_ns))
                {
                    return None;
                }
                Some(format!(
                    "rolebindings.rbac.authorization.k8s.io \"{}\" is forbidden: user \"{user}\" is attempting to grant RBAC permissions not currently held",
                    obj["metadata"]["name"].as_str().unwrap_or_default()
                ))
            }
            _ => None,
        }
    }

    /// Validating admission policies (`admissionregistration.k8s.io/v1`,
    /// "Validating Admission Policy" in the docs): each policy bound with
    /// `Deny` whose resource rules take `operation` on `resource` and
    /// whose match conditions hold runs its variables and validations,
    /// in CEL (a real interpreter, cel-interpreter), over `request`,
    /// `object` and `oldObject`. The first validation that is false, or
    /// fails to run (`failurePolicy: Fail`), denies the request with the
    /// server's message: 403 for `reason: Forbidden`, else 422.
    pub fn admission(
        &self,
        user: &str,
        operation: &str,
        resource: &str,
        ns: &str,
        object: Option<&Value>,
        old: Option<&Value>,
    ) -> Option<Response<Body>> {
        self.admission_of(user, operation, resource, ns, None, object, old)
    }

    /// [`State::admission`] of a request whose name is not its object's
    /// (a subresource's: `serviceaccounts/NAME/token` names the account).
    #[allow(clippy::too_many_arguments)]
    pub fn admission_of(
        &self,
        user: &str,
        operation: &str,
        resource: &str,
        ns: &str,
        request_name: Option<&str>,
        object: Option<&Value>,
        old: Option<&Value>,
    ) -> Option<Response<Body>> {
        let name = request_name
            .or_else(|| object.or(old).and_then(|o| o["metadata"]["name"].as_str()))
            .unwrap_or_default()
            .to_string();
        let request = json!({"operation": operation, "userInfo": {"username": user},
            "name": name, "namespace": ns, "resource": {"resource": resource}});
        let bindings: Vec<&Value> = self
            .objects
            .iter()
            .filter(|((r, _, _), _)| r == "validatingadmissionpolicybindings")
            .map(|(_, b)| b)
            .filter(|b| any(&b["spec"]["validationActions"], "Deny"))
            .collect();
        for b in bindings {
            let policy_name = b["spec"]["policyName"].as_str().unwrap_or_default();
            let Some(policy) = self.objects.get(&(
                "validatingadmissionpolicies".to_string(),
                String::new(),
                policy_name.to_string(),
            )) else {
                continue;
            };
            let spec = &policy["spec"];
            let takes = spec["matchConstraints"]["resourceRules"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|r| any(&r["resources"], resource) && any(&r["operations"], operation));
            if !takes {
                continue;
            }
            let deny = |message: String, reason: &str| {
                let (code, reason) = if reason == "Forbidden" {
                    (StatusCode::FORBIDDEN, "Forbidden")
                } else {
                    (StatusCode::UNPROCESSABLE_ENTITY, "Invalid")
                };
                Some(status(
                    code,
                    reason,
                    format!(
                        "{} \"{name}\" is forbidden: ValidatingAdmissionPolicy '{policy_name}' with binding '{}' denied request: {message}",
                        qualified(resource),
                        b["metadata"]["name"].as_str().unwrap_or_default()
                    ),
                    json!({"name": name, "kind": resource}),
                ))
            };
            let mut ctx = cel_interpreter::Context::default();
            let null = Value::Null;
            for (k, v) in [
                ("request", &request),
                ("object", object.unwrap_or(&null)),
                ("oldObject", old.unwrap_or(&null)),
            ] {
                if ctx.add_variable(k, v.clone()).is_err() {
                    return deny(format!("{k} is not CEL data"), "");
                }
            }
            let eval = |ctx: &cel_interpreter::Context,
                        expr: &str|
             -> Result<cel_interpreter::Value, String> {
                cel_interpreter::Program::compile(expr)
                    .map_err(|e| format!("compilation failed: {e}"))?
                    .execute(ctx)
                    .map_err(|e| format!("expression '{expr}' resulted in error: {e}"))
            };
            let mut applies = true;
            for c in spec["matchConditions"].as_array().into_iter().flatten() {
                match eval(&ctx, c["expression"].as_str().unwrap_or("false")) {
                    Ok(cel_interpreter::Value::Bool(true)) => {}
                    Ok(_) => applies = false,
                    Err(e) => return deny(e, ""),
                }
            }
            if !applies {
                continue;
            }
            let mut variables = std::collections::HashMap::new();
            for v in spec["variables"].as_array().into_iter().flatten() {
                match eval(&ctx, v["expression"].as_str().unwrap_or("null")) {
                    Ok(val) => {
                        variables.insert(v["name"].as_str().unwrap_or_default().to_string(), val);
                    }
                    Err(e) => return deny(e, ""),
                }
                ctx.add_variable_from_value("variables", variables.clone());
            }
            for v in spec["validations"].as_array().into_iter().flatten() {
                let reason = v["reason"].as_str().unwrap_or_default();
                let message = v["message"]
                    .as_str()
                    .unwrap_or("failed expression")
                    .to_string();
                match eval(&ctx, v["expression"].as_str().unwrap_or("false")) {
                    Ok(cel_interpreter::Value::Bool(true)) => {}
                    Ok(_) => return deny(message, reason),
                    Err(e) => return deny(e, reason),
                }
            }
        }
        None
    }

    /// The operator's `kubectl apply` of cluster assets: every RBAC object
    /// and ServiceAccount in `yaml` (documents separated by `---`).
    pub fn apply_yaml(&mut self, yaml: &str) {
        // Set up before the test: not among what the test sees created.
        let before = self.created.len();
        for doc in serde_saphyr::from_multiple::<Value>(yaml).expect("YAML") {
            let resource = match doc["kind"].as_str() {
                Some("Role") => "roles",
                Some("RoleBinding") => "rolebindings",
                Some("ClusterRole") => "clusterroles",
                Some("ClusterRoleBinding") => "clusterrolebindings",
                Some("ServiceAccount") => "serviceaccounts",
                Some("ValidatingAdmissionPolicy") => "validatingadmissionpolicies",
                Some("ValidatingAdmissionPolicyBinding") => "validatingadmissionpolicybindings",
                _ => continue,
            };
            let ns = doc["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let name = doc["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if self
                .objects
                .contains_key(&(resource.to_string(), ns.clone(), name.clone()))
            {
                self.update(resource, &ns, &name, |o| *o = doc.clone());
            } else {
                self.put(resource, &ns, doc);
            }
        }
        self.created.truncate(before);
    }

    /// The live objects of `resource` a credential made: not the
    /// operator's cluster assets (which carry `gateway.dev/credential-role`).
    pub fn minted(&self, resource: &str) -> Vec<Value> {
        self.live(resource)
            .into_iter()
            .filter(|o| o["metadata"]["labels"]["gateway.dev/credential-role"].is_null())
            .collect()
    }

    /// cluster/vault-rbac.yaml, as `scripts/vault-setup.sh` applies it,
    /// and `credential_roles` (what `gateway vault cluster-roles` printed).
    pub fn apply_cluster_assets(&mut self, credential_roles: &str) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cluster/vault-rbac.yaml");
        let vault_rbac = std::fs::read_to_string(&path).expect("cluster/vault-rbac.yaml");
        // Its ServiceAccount is the fake's own (its token was minted at start).
        let without_sa: Vec<&str> = vault_rbac
            .split("\n---\n")
            .filter(|d| !d.contains("kind: ServiceAccount\n"))
            .collect();
        self.apply_yaml(&without_sa.join("\n---\n"));
        self.apply_yaml(credential_roles);
    }

    fn create(
        &mut self,
        resource: &str,
        ns: &str,
        mut obj: Value,
    ) -> Result<Value, Box<Response<Body>>> {
        let meta = obj["metadata"].clone();
        let name = match meta["name"].as_str().filter(|s| !s.is_empty()) {
            Some(n) => n.to_string(),
            None => match meta["generateName"].as_str() {
                Some(g) => format!("{g}{}", random_suffix()),
                None => {
                    return Err(Box::new(status(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "Invalid",
                        format!(
                            "{resource} \"\" is invalid: metadata.name: Required value: name or generateName is required"
                        ),
                        json!({"kind": resource}),
                    )));
                }
            },
        };
        let key = (resource.to_string(), ns.to_string(), name.clone());
        if self.objects.contains_key(&key) {
            return Err(Box::new(api_error(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", qualified(resource)),
                resource,
                Some(&name),
            )));
        }
        self.next_rv += 1;
        let mut uid = [0u8; 16];
        getrandom::fill(&mut uid).expect("random");
        let m = &mut obj["metadata"];
        m["name"] = json!(name);
        m["namespace"] = json!(ns);
        m["uid"] = json!(hex::encode(uid));
        m["resourceVersion"] = json!(self.next_rv.to_string());
        m["creationTimestamp"] = json!(rfc3339(now()));
        if resource == "pods" && obj["status"]["phase"].is_null() {
            obj["status"] = json!({"phase": "Pending"});
        }
        // Workloads count their spec's changes from 1 (each kind's
        // PrepareForCreate); a controller playing history may give more.
        if matches!(
            resource,
            "deployments" | "statefulsets" | "daemonsets" | "replicasets" | "jobs"
        ) && obj["metadata"]["generation"].is_null()
        {
            obj["metadata"]["generation"] = json!(1);
        }
        self.objects.insert(key, obj.clone());
        self.created.push((resource.to_string(), obj.clone()));
        self.record("ADDED", resource, &obj);
        Ok(obj)
    }

    /// What [`State::create`] would store, stored nowhere (a dry run: the
    /// real server fills in uid and creationTimestamp, and no
    /// resourceVersion, since nothing was written).
    fn would_create(
        &self,
        resource: &str,
        ns: &str,
        mut obj: Value,
    ) -> Result<Value, Box<Response<Body>>> {
        let Some(name) = obj["metadata"]["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .map(str::to_string)
        else {
            return Err(Box::new(status(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                format!(
                    "{resource} \"\" is invalid: metadata.name: Required value: name or generateName is required"
                ),
                json!({"kind": resource}),
            )));
        };
        if self
            .objects
            .contains_key(&(resource.to_string(), ns.to_string(), name.clone()))
        {
            return Err(Box::new(api_error(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", qualified(resource)),
                resource,
                Some(&name),
            )));
        }
        let m = &mut obj["metadata"];
        m["namespace"] = json!(ns);
        m["uid"] = json!(format!("dry-run-{name}"));
        m["creationTimestamp"] = json!(rfc3339(now()));
        if matches!(
            resource,
            "deployments" | "statefulsets" | "daemonsets" | "replicasets" | "jobs"
        ) {
            m["generation"] = json!(1);
        }
        Ok(obj)
    }

    fn record(&mut self, kind: &str, resource: &str, obj: &Value) {
        let rv = obj["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or(self.next_rv);
        let change = (rv, kind.to_string(), resource.to_string(), obj.clone());
        self.changes.push(change.clone());
        if let Some(tx) = &self.notify {
            let _ = tx.send(change);
        }
    }

    /// Change an object (the kubelet and controllers do this): `f` edits
    /// it, a new resourceVersion is set and watchers see MODIFIED.
    pub fn update(
        &mut self,
        resource: &str,
        ns: &str,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> bool {
        let key = (resource.to_string(), ns.to_string(), name.to_string());
        let Some(mut obj) = self.objects.get(&key).cloned() else {
            return false;
        };
        f(&mut obj);
        self.next_rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.next_rv.to_string());
        self.objects.insert(key, obj.clone());
        self.record("MODIFIED", resource, &obj);
        if resource == "pods" {
            self.job_follows_pod(ns, &obj);
        }
        true
    }

    /// The job controller following its pod, as on Kubernetes 1.31+: when
    /// the pod has ended, a Job with no verdict yet gets `SuccessCriteriaMet`
    /// then `Complete` (the pod succeeded) or `FailureTarget` then `Failed`
    /// with reason `BackoffLimitExceeded` (it failed; backoffLimit is 0); a
    /// Job that already has `FailureTarget` or `SuccessCriteriaMet` (its
    /// deadline, say) gets the final condition of the same reason only now.
    fn job_follows_pod(&mut self, ns: &str, pod: &Value) {
        let Some(job) = pod["metadata"]["labels"]["job-name"]
            .as_str()
            .map(str::to_string)
        else {
            return;
        };
        let (target, last, reason) = match pod["status"]["phase"].as_str() {
            Some("Succeeded") => ("SuccessCriteriaMet", "Complete", "CompletionsReached"),
            Some("Failed") => ("FailureTarget", "Failed", "BackoffLimitExceeded"),
            _ => return,
        };
        let key = ("jobs".to_string(), ns.to_string(), job.clone());
        let Some(current) = self.objects.get(&key) else {
            return;
        };
        let conditions: Vec<Value> = current["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let has = |t: &str| conditions.iter().any(|c| c["type"] == t);
        if has("Complete") || has("Failed") {
            return;
        }
        let pending = conditions
            .iter()
            .find(|c| c["type"] == "FailureTarget" || c["type"] == "SuccessCriteriaMet")
            .cloned();
        let condition = |t: &str, r: &str| json!({"type": t, "status": "True", "reason": r, "message": format!("{r} (fake job controller)")});
        match pending {
            Some(p) => {
                let last = if p["type"] == "FailureTarget" {
                    "Failed"
                } else {
                    "Complete"
                };
                let r = p["reason"].as_str().unwrap_or(reason).to_string();
                self.update("jobs", ns, &job, |j| {
                    j["status"]["conditions"] = json!([p, condition(last, &r)]);
                });
            }
            None => {
                let first = condition(target, reason);
                let first2 = first.clone();
                self.update("jobs", ns, &job, |j| {
                    j["status"]["conditions"] = json!([first])
                });
                self.update("jobs", ns, &job, |j| {
                    j["status"]["conditions"] = json!([first2, condition(last, reason)]);
                });
            }
        }
    }

    /// Add an object as a controller would (no admission).
    pub fn put(&mut self, resource: &str, ns: &str, obj: Value) -> Value {
        match self.create(resource, ns, obj) {
            Ok(o) => o,
            Err(_) => Value::Null,
        }
    }

    /// Remove an object as a controller would (no finalizers, no garbage
    /// collection of what it owns).
    pub fn remove(&mut self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        let key = (resource.to_string(), ns.to_string(), name.to_string());
        let mut obj = self.objects.remove(&key)?;
        if resource == "serviceaccounts" {
            self.sa_deleted.insert(
                (ns.to_string(), name.to_string()),
                std::time::Instant::now(),
            );
        }
        self.deleted.push(key);
        self.next_rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.next_rv.to_string());
        self.record("DELETED", resource, &obj);
        Some(obj)
    }

    /// The garbage collector: everything owned by `uid`, recursively.
    fn collect_owned(&mut self, uid: &str) {
        let owned: Vec<(String, String, String, String)> = self
            .objects
            .iter()
            .filter(|(_, v)| {
                v["metadata"]["ownerReferences"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|o| o["uid"] == uid)
            })
            .map(|((r, n, name), v)| {
                (
                    r.clone(),
                    n.clone(),
                    name.clone(),
                    v["metadata"]["uid"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        for (r, n, name, child) in owned {
            self.remove(&r, &n, &name);
            self.collect_owned(&child);
        }
    }

    /// Pods of Job `job` (by the job-name label the job controller sets).
    pub fn pods_of(&self, job: &str) -> Vec<String> {
        self.objects
            .iter()
            .filter(|((r, _, _), v)| r == "pods" && v["metadata"]["labels"]["job-name"] == job)
            .map(|((_, _, n), _)| n.clone())
            .collect()
    }

    /// Objects of `resource` whose labels include every `k=v` of `selector`.
    fn select(
        &self,
        resource: &str,
        ns: &str,
        labels: Option<&str>,
        fields: Option<&str>,
    ) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((r, n, _), v)| r == resource && n == ns && matches(v, labels, fields))
            .map(|(_, v)| v.clone())
            .collect()
    }

    fn delete(&mut self, resource: &str, ns: &str, name: &str) -> Response<Body> {
        match self.remove(resource, ns, name) {
            Some(obj) => respond(StatusCode::OK, obj),
            None => not_found_error(resource, name),
        }
    }

    /// A ServiceAccount and a token for it, as a pod of it would have.
    pub fn service_account_token(&mut self, ns: &str, name: &str) -> String {
        let key = (
            "serviceaccounts".to_string(),
            ns.to_string(),
            name.to_string(),
        );
        let sa = match self.objects.get(&key) {
            Some(sa) => sa.clone(),
            None => self.put(
                "serviceaccounts",
                ns,
                json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}),
            ),
        };
        let uid = sa["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let exp = now() + 3600;
        let token = jwt(
            &format!("system:serviceaccount:{ns}:{name}"),
            exp,
            json!({"kubernetes.io": {"namespace": ns, "serviceaccount": {"name": name, "uid": uid}}}),
        );
        self.tokens
            .insert(token.clone(), (ns.to_string(), name.to_string(), uid, exp));
        token
    }

    /// Apply the ClusterRoleBindings of the repository's cluster assets
    /// (cluster/vault-rbac.yaml), as `kubectl apply -k cluster/` would:
    /// what lets OpenBao's service account review tokens.
    pub fn apply_cluster_bindings(&mut self) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cluster/vault-rbac.yaml");
        let text = std::fs::read_to_string(&path).expect("cluster/vault-rbac.yaml");
        for doc in serde_saphyr::from_multiple::<Value>(&text).expect("YAML") {
            if doc["kind"] == "ClusterRoleBinding" {
                let name = doc["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                self.objects
                    .insert(("clusterrolebindings".into(), String::new(), name), doc);
            }
        }
    }

    /// Append `line` (a newline is added) to pod `pod`'s log, written
    /// `ago` seconds before now.
    pub fn log_line(&mut self, pod: &str, line: &str, ago: f64) {
        let log = self.logs.entry(pod.to_string()).or_default();
        let lines = log.split_inclusive(|b| *b == b'\n').count();
        let times = self.log_times.entry(pod.to_string()).or_default();
        // Lines written before without a time count as written now.
        times.resize(lines, now_f64());
        times.push(now_f64() - ago);
        log.extend_from_slice(line.as_bytes());
        log.push(b'\n');
    }

    /// Objects of `resource` that exist now.
    pub fn live(&self, resource: &str) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((r, _, _), _)| r == resource)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

impl FakeKube {
    /// Start the fake on 0.0.0.0 (so a sandbox reaches it through its veth)
    /// on a free port, with a fresh CA.
    pub async fn start() -> FakeKube {
        let ca_key = rcgen::KeyPair::generate().expect("ca key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "fake-kube-apiserver test CA");
        let ca_cert = ca_params.self_signed(&ca_key).expect("ca cert");
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().expect("key");
        // The names a real API server certificate carries (kind/kubeadm).
        let mut params = rcgen::CertificateParams::new(vec![
            "kubernetes".to_string(),
            "kubernetes.default".to_string(),
            "kubernetes.default.svc".to_string(),
            "localhost".to_string(),
            "127.0.0.1".to_string(),
        ])
        .expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver");
        let cert = params.signed_by(&key, &issuer).expect("cert");

        let certs = vec![cert.der().clone()];
        let pk = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).expect("key der");
        let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("tls versions")
        .with_no_client_auth()
        .with_single_cert(certs, pk)
        .expect("tls config");
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));

        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], 0)))
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let admin_jwt = jwt(
            "system:serviceaccount:vault:openbao",
            now() + 86_400,
            json!({}),
        );
        let (notify, _) = tokio::sync::broadcast::channel(1024);
        let mut first = State {
            notify: Some(notify),
            // A cluster's history starts long before the test: versions
            // from 1000 on, everything older compacted.
            next_rv: 1000,
            compacted: 1000,
            ..State::default()
        };
        // The built-in ClusterRole every cluster has (what a token
        // reviewer is bound to), as `kubectl get clusterrole
        // system:auth-delegator -o yaml` shows it.
        first.objects.insert(
            ("clusterroles".into(), String::new(), "system:auth-delegator".into()),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "system:auth-delegator",
                    "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
                "rules": [
                    {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
                    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}
                ]}),
        );
        let openbao_jwt = jwt(
            "system:serviceaccount:vault:openbao",
            now() + 86_400,
            json!({"kubernetes.io": {"namespace": "vault", "serviceaccount": {"name": "openbao"}}}),
        );
        first.openbao_token = openbao_jwt.clone();
        let state = Arc::new(Mutex::new(first));
        tokio::spawn(deadline_controller(Arc::downgrade(&state)));
        let (shutdown, _) = tokio::sync::watch::channel(0u64);
        let task = serve(
            listener,
            acceptor.clone(),
            Arc::clone(&state),
            admin_jwt.clone(),
            shutdown.subscribe(),
        );
        FakeKube {
            port,
            acceptor,
            shutdown,
            ca_pem: ca_cert.pem(),
            admin_jwt,
            openbao_jwt,
            state,
            task: Mutex::new(task),
        }
    }

    /// The API server goes away: nothing listens, every open connection
    /// (watches included) is dropped.
    pub fn pause(&self) {
        if let Ok(t) = self.task.lock() {
            t.abort();
        }
        self.shutdown.send_modify(|g| *g += 1);
    }

    /// It comes back on the same port with the same state.
    pub async fn resume(&self) {
        let mut tries = 0;
        let listener = loop {
            match tokio::net::TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], self.port))).await {
                Ok(l) => break l,
                Err(e) if tries < 50 => {
                    tries += 1;
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("rebinding port {}: {e}", self.port),
            }
        };
        let task = serve(
            listener,
            self.acceptor.clone(),
            Arc::clone(&self.state),
            self.admin_jwt.clone(),
            self.shutdown.subscribe(),
        );
        if let Ok(mut t) = self.task.lock() {
            *t = task;
        }
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// A kubeconfig in `dir` for this server (its CA), authenticating with
    /// `token` (kept in a file beside it), default namespace `ns`.
    pub fn kubeconfig(&self, dir: &std::path::Path, token: &str, ns: &str) -> std::path::PathBuf {
        let token_file = dir.join("token");
        std::fs::write(&token_file, token).expect("token");
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            gateway::broker::kubeconfig::kubeconfig(
                &self.url(),
                self.ca_pem.as_bytes(),
                "kubernetes",
                &token_file.display().to_string(),
                ns,
            ),
        )
        .expect("kubeconfig");
        kubeconfig
    }

    /// Serve these pods in `ns`.
    pub fn set_pods(&self, ns: &str, pods: Vec<Value>) {
        self.state
            .lock()
            .expect("state")
            .pods
            .insert(ns.into(), pods);
    }

    pub fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().expect("state"))
    }

    /// Stop answering (the API server went away for good).
    pub fn stop(&self) {
        self.pause();
    }
}

/// A pod as the API server returns it.
pub fn pod(name: &str, ns: &str, phase: &str, ready: bool, restarts: u32) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"), "creationTimestamp": rfc3339(now() - 3600),
                     "labels": {"app": "demo"}},
        "spec": {"nodeName": "kind-worker", "containers": [{"name": "app", "image": "nginx:1.27"}]},
        "status": {"phase": phase, "podIP": "10.244.1.7", "startTime": rfc3339(now() - 3600),
                   "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}],
                   "containerStatuses": [{"name": "app", "ready": ready, "restartCount": restarts, "image": "nginx:1.27",
                                          "state": {"running": {"startedAt": rfc3339(now() - 3500)}}}]}})
}

/// Does `obj` match an equality label selector and field selector?
fn matches(obj: &Value, labels: Option<&str>, fields: Option<&str>) -> bool {
    let pairs = |sel: Option<&str>| -> Vec<(String, String)> {
        sel.unwrap_or("")
            .split(',')
            .filter(|p| !p.is_empty())
            .filter_map(|p| {
                p.split_once('=')
                    .map(|(k, v)| (k.trim_end_matches('=').to_string(), v.to_string()))
            })
            .collect()
    };
    // As the API server reads a label selector: `key=value`, and `key`
    // (the label exists) or `!key` (it does not).
    let exists_ok = labels
        .unwrap_or("")
        .split(',')
        .filter(|p| !p.is_empty() && !p.contains('='))
        .all(|p| match p.strip_prefix('!') {
            Some(k) => obj["metadata"]["labels"].get(k).is_none(),
            None => obj["metadata"]["labels"].get(p).is_some(),
        });
    let labels_ok = exists_ok
        && pairs(labels)
            .iter()
            .all(|(k, v)| obj["metadata"]["labels"][k.as_str()] == v.as_str());
    let fields_ok = pairs(fields).iter().all(|(path, v)| {
        let mut cur = obj;
        for part in path.split('.') {
            cur = &cur[part];
        }
        cur == v.as_str()
    });
    labels_ok && fields_ok
}

fn query(uri: &hyper::Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), percent_decode(v)))
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Jobs, Secrets, Pods (by selector), Events: what the kubernetes backend uses.
#[allow(clippy::too_many_arguments)]
async fn workload_route(
    verb: &str,
    resource: &str,
    ns: &str,
    name: Option<&str>,
    sub: Option<&str>,
    q: &BTreeMap<String, String>,
    ct: &str,
    body: &[u8],
    st: &Arc<Mutex<State>>,
) -> Response<Body> {
    let labels = q.get("labelSelector").cloned();
    let fields = q.get("fieldSelector").cloned();
    let not_found = |name: &str| not_found_error(resource, name);
    match (verb, name, sub) {
        ("get", Some(pod), Some("log")) if resource == "pods" => {
            let mut s = st.lock().expect("state");
            let Some(object) = s
                .objects
                .get(&("pods".to_string(), ns.to_string(), pod.to_string()))
                .cloned()
            else {
                return not_found(pod);
            };
            // As the API server: `container` must name one of the pod's
            // containers (400 otherwise); without it, a pod with one
            // container is read, a pod with several is a 400.
            let containers: Vec<String> = object["spec"]["containers"]
                .as_array()
                .map(|cs| {
                    cs.iter()
                        .filter_map(|c| c["name"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            s.log_queries.push(q.clone());
            // PodLogOptions validation: 422 Invalid, with its causes.
            let invalid = |field: &str, value: &str, why: &str| {
                status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    format!(
                        "PodLogOptions \"{pod}\" is invalid: {field}: Invalid value: {value}: {why}"
                    ),
                    json!({"name": pod, "kind": "PodLogOptions", "causes": [{"reason": "FieldValueInvalid",
                        "message": format!("Invalid value: {value}: {why}"), "field": field}]}),
                )
            };
            let tail = match q.get("tailLines").map(|v| (v, v.parse::<i64>())) {
                Some((v, Ok(n))) if n < 0 => {
                    return invalid("tailLines", v, "must be greater than or equal to 0");
                }
                Some((_, Ok(n))) => Some(n as usize),
                _ => None,
            };
            let since = match q.get("sinceSeconds").map(|v| (v, v.parse::<i64>())) {
                Some((v, Ok(n))) if n < 1 => {
                    return invalid("sinceSeconds", v, "must be greater than 0");
                }
                Some((_, Ok(n))) => Some(n as f64),
                _ => None,
            };
            let timestamps = q.get("timestamps").is_some_and(|v| v == "true");
            match q.get("container") {
                Some(c) if !containers.contains(c) => {
                    return status(
                        StatusCode::BAD_REQUEST,
                        "BadRequest",
                        format!("container {c} is not valid for pod {pod}"),
                        json!({}),
                    );
                }
                None if containers.len() != 1 => {
                    return status(
                        StatusCode::BAD_REQUEST,
                        "BadRequest",
                        format!(
                            "a container name must be specified for pod {pod}, choose one of: [{}]",
                            containers.join(" ")
                        ),
                        json!({}),
                    );
                }
                _ => {}
            }
            let container = q
                .get("container")
                .cloned()
                .or_else(|| containers.first().cloned())
                .unwrap_or_default();
            let container_status = object["status"]["containerStatuses"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["name"] == container.as_str())
                .cloned()
                .unwrap_or(Value::Null);
            // `previous`: the container's last terminated run, which a
            // container that never restarted does not have.
            if q.get("previous").is_some_and(|v| v == "true")
                && !container_status["lastState"]["terminated"].is_object()
            {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!(
                        "previous terminated container \"{container}\" in pod \"{pod}\" not found"
                    ),
                    json!({}),
                );
            }
            // A container still waiting has no log yet: the real reason
            // (ErrImageNeverPull, ImagePullBackOff, ContainerCreating…).
            if let Some(reason) = container_status["state"]["waiting"]["reason"].as_str() {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!(
                        "container \"{container}\" in pod \"{pod}\" is waiting to start: {reason}"
                    ),
                    json!({}),
                );
            }
            if let Some((_, code, reason, message)) = s
                .log_failures
                .front()
                .filter(|(prefix, ..)| pod.starts_with(prefix.as_str()))
                .cloned()
            {
                s.log_failures.pop_front();
                let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                return status(code, &reason, message, json!({"name": pod, "kind": "pods"}));
            }
            // The kubelet serves a log only once its status has the
            // container running or ended.
            if s.kubelet.is_some() {
                let container = q
                    .get("container")
                    .cloned()
                    .or_else(|| containers.first().cloned())
                    .unwrap_or_default();
                let state = s.objects[&("pods".to_string(), ns.to_string(), pod.to_string())]
                    ["status"]["containerStatuses"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["name"] == container.as_str())
                    .map(|c| c["state"].clone())
                    .unwrap_or(Value::Null);
                if !(state["running"].is_object() || state["terminated"].is_object()) {
                    return status(
                        StatusCode::BAD_REQUEST,
                        "BadRequest",
                        format!(
                            "container \"{container}\" in pod \"{pod}\" is waiting to start: ContainerCreating"
                        ),
                        json!({}),
                    );
                }
            }
            // `limitBytes`: the API server stops after that many bytes.
            let limit = q.get("limitBytes").and_then(|l| l.parse::<usize>().ok());
            if q.get("follow").is_some_and(|f| f == "true") {
                drop(s);
                let mut r = Response::new(follow_log(
                    Arc::clone(st),
                    ns.to_string(),
                    pod.to_string(),
                    limit,
                ));
                r.headers_mut().insert(
                    "content-type",
                    hyper::header::HeaderValue::from_static("text/plain"),
                );
                return r;
            }
            // The previous run's log, when it was asked for (kept by the
            // kubelet for the container's last terminated instance).
            let previous = q.get("previous").is_some_and(|v| v == "true");
            let mut log = if previous {
                s.previous_logs.get(pod).cloned().unwrap_or_default()
            } else {
                s.logs.get(pod).cloned().unwrap_or_default()
            };
            if since.is_some() || tail.is_some() || timestamps {
                let at = now_f64();
                let times = s.log_times.get(pod).cloned().unwrap_or_default();
                let mut lines: Vec<(f64, &[u8])> = log
                    .split_inclusive(|b| *b == b'\n')
                    .enumerate()
                    .map(|(i, l)| (times.get(i).copied().unwrap_or(at), l))
                    .collect();
                if let Some(secs) = since {
                    lines.retain(|(t, _)| *t >= at - secs);
                }
                if let Some(n) = tail {
                    let skip = lines.len().saturating_sub(n);
                    lines.drain(..skip);
                }
                let mut out = Vec::new();
                for (t, l) in lines {
                    if timestamps {
                        out.extend_from_slice(rfc3339_nano(t).as_bytes());
                        out.push(b' ');
                    }
                    out.extend_from_slice(l);
                }
                log = out;
            }
            if let Some(limit) = limit {
                log.truncate(limit);
            }
            let mut r = Response::new(full(log));
            r.headers_mut().insert(
                "content-type",
                hyper::header::HeaderValue::from_static("text/plain"),
            );
            r
        }
        ("get", Some(n), None) => {
            let s = st.lock().expect("state");
            match s
                .objects
                .get(&(resource.to_string(), ns.to_string(), n.to_string()))
            {
                Some(o) => respond(StatusCode::OK, o.clone()),
                None => not_found(n),
            }
        }
        ("list", None, None) => {
            let s = st.lock().expect("state");
            let items = s.select(resource, ns, labels.as_deref(), fields.as_deref());
            respond(
                StatusCode::OK,
                json!({"kind": format!("{}List", kind_of(resource)), "apiVersion": api_version_of(resource),
                       "metadata": {"resourceVersion": s.next_rv.to_string()}, "items": items}),
            )
        }
        ("watch", None, None) => {
            let injected = {
                let mut s = st.lock().expect("state");
                s.watches += 1;
                s.watch_error
            };
            if let Some(code) = injected {
                // An ERROR event in the stream, then the end of it.
                let event = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
                    "metadata": {}, "status": "Failure", "reason": "InternalError", "code": code,
                    "message": "etcdserver: request timed out (fake)"}});
                let mut r = Response::new(full(format!("{event}\n")));
                r.headers_mut().insert(
                    "content-type",
                    hyper::header::HeaderValue::from_static("application/json"),
                );
                return r;
            }
            let since: u64 = q
                .get("resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let (compacted, current) = {
                let s = st.lock().expect("state");
                (s.compacted, s.next_rv)
            };
            if since > 0 && since < compacted {
                let event = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
                    "metadata": {}, "status": "Failure", "reason": "Expired", "code": 410,
                    "message": format!("too old resource version: {since} ({current})")}});
                let mut r = Response::new(full(format!("{event}\n")));
                r.headers_mut().insert(
                    "content-type",
                    hyper::header::HeaderValue::from_static("application/json"),
                );
                return r;
            }
            // `sendInitialEvents=true`: the current objects as ADDED, then a
            // BOOKMARK that says they are all there (with bookmarks asked).
            let initial_end = q.get("sendInitialEvents").is_some_and(|v| v == "true")
                && q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
            let since = if q.get("sendInitialEvents").is_some_and(|v| v == "true") {
                0
            } else {
                since
            };
            let timeout = q
                .get("timeoutSeconds")
                .and_then(|v| v.parse().ok())
                .unwrap_or(290u64);
            let (tx, rx) = tokio::sync::mpsc::channel::<
                Result<hyper::body::Frame<Bytes>, std::convert::Infallible>,
            >(64);
            let (backlog, mut live) = {
                let s = st.lock().expect("state");
                let live = s.notify.as_ref().expect("notify").subscribe();
                let backlog: Vec<(u64, String, Value)> = if since == 0 {
                    // "0": the current objects as ADDED, then changes.
                    s.select(resource, ns, labels.as_deref(), fields.as_deref())
                        .into_iter()
                        .map(|o| (s.next_rv, "ADDED".to_string(), o))
                        .collect()
                } else {
                    s.changes
                        .iter()
                        .filter(|(rv, _, r, o)| {
                            *rv > since
                                && r == resource
                                && o["metadata"]["namespace"] == ns
                                && matches(o, labels.as_deref(), fields.as_deref())
                        })
                        .map(|(rv, t, _, o)| (*rv, t.clone(), o.clone()))
                        .collect()
                };
                (backlog, live)
            };
            let floor = backlog.iter().map(|(rv, _, _)| *rv).max().unwrap_or(since);
            let (resource, ns) = (resource.to_string(), ns.to_string());
            let open = OpenWatch::new(Arc::clone(st));
            let watch_state = Arc::clone(st);
            tokio::spawn(async move {
                let _open = open;
                let line = |t: &str, o: &Value| {
                    Bytes::from(format!("{}\n", json!({"type": t, "object": o})))
                };
                let muted = |st: &Arc<Mutex<State>>, r: &str| {
                    st.lock()
                        .map(|s| s.muted_watches.contains(r))
                        .unwrap_or(false)
                };
                for (_, t, o) in &backlog {
                    if muted(&watch_state, &resource) {
                        continue;
                    }
                    if tx
                        .send(Ok(hyper::body::Frame::data(line(t, o))))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                if initial_end {
                    let bookmark = json!({"kind": kind_of(&resource), "apiVersion": api_version_of(&resource),
                        "metadata": {"resourceVersion": current.to_string(),
                                     "annotations": {"k8s.io/initial-events-end": "true"}}});
                    if tx
                        .send(Ok(hyper::body::Frame::data(line("BOOKMARK", &bookmark))))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                let end = tokio::time::sleep(Duration::from_secs(timeout));
                let mut end = std::pin::pin!(end);
                loop {
                    tokio::select! {
                        _ = &mut end => return,
                        _ = tx.closed() => return,
                        c = live.recv() => match c {
                            Ok((rv, t, r, o)) => {
                                if rv <= floor && since != 0 { continue; }
                                if muted(&watch_state, &resource) { continue; }
                                if r == resource && o["metadata"]["namespace"] == ns.as_str()
                                    && matches(&o, labels.as_deref(), fields.as_deref())
                                    && tx.send(Ok(hyper::body::Frame::data(line(&t, &o)))).await.is_err() {
                                    return;
                                }
                            }
                            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                            Err(_) => return,
                        }
                    }
                }
            });
            let body = http_body_util::StreamBody::new(tokio_stream_from(rx)).boxed();
            let mut r = Response::new(body);
            r.headers_mut().insert(
                "content-type",
                hyper::header::HeaderValue::from_static("application/json"),
            );
            r
        }
        ("create", None, None) => {
            let obj: Value = match serde_json::from_slice(body) {
                Ok(v) => v,
                Err(e) => {
                    return status(
                        StatusCode::BAD_REQUEST,
                        "BadRequest",
                        format!("bad JSON: {e}"),
                        json!({}),
                    );
                }
            };
            let mut s = st.lock().expect("state");
            // Pod Security admission (the fake's: privileged only).
            if resource == "pods"
                && s.restricted_namespaces.iter().any(|n| n == ns)
                && obj["spec"]["containers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["securityContext"]["privileged"] == true)
            {
                let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
                return status(
                    StatusCode::FORBIDDEN,
                    "Forbidden",
                    format!(
                        "pods \"{name}\" is forbidden: violates PodSecurity \"restricted:latest\": privileged (containers must not set securityContext.privileged=true)"
                    ),
                    json!({"name": name, "kind": "pods"}),
                );
            }
            if let Some(r) = bad_dry_run(q) {
                return r;
            }
            if let Some(r) = mount_of_no_volume(resource, &obj) {
                return r;
            }
            if q.get("dryRun").is_some() {
                return respond(StatusCode::CREATED, obj);
            }

            let created = match s.create(resource, ns, obj) {
                Ok(c) => c,
                Err(r) => return *r,
            };
            if resource == "jobs" {
                if s.pod_creation_delay.is_zero() {
                    job_controller(&mut s, ns, &created);
                    start_kubelet(st, &s, ns, &created);
                } else {
                    // The real job controller creates the pod on its own
                    // time, after the Job is there.
                    let (st, ns, job, delay) = (
                        Arc::clone(st),
                        ns.to_string(),
                        created.clone(),
                        s.pod_creation_delay,
                    );
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        if let Ok(mut s) = st.lock() {
                            job_controller(&mut s, &ns, &job);
                            start_kubelet(&st, &s, &ns, &job);
                        }
                    });
                }
            }
            respond(StatusCode::CREATED, created)
        }
        ("patch" | "update", Some(n), None) => write_object(verb, resource, ns, n, q, ct, body, st),
        ("delete", Some(n), None) => {
            if let Some(r) = bad_dry_run(q) {
                return r;
            }
            let opts: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            // A dry-run deletion deletes nothing: the object as it is.
            if q.get("dryRun").is_some() {
                let s = st.lock().expect("state");
                return match s
                    .objects
                    .get(&(resource.to_string(), ns.to_string(), n.to_string()))
                {
                    Some(o) => respond(StatusCode::OK, o.clone()),
                    None => not_found(n),
                };
            }
            let policy = opts["propagationPolicy"]
                .as_str()
                .unwrap_or(
                    // The default for Jobs through the API is orphaning.
                    if resource == "jobs" {
                        "Orphan"
                    } else {
                        "Background"
                    },
                )
                .to_string();
            let mut s = st.lock().expect("state");
            // A running pod is deleted gracefully, as on a real server: it
            // gets its deletionTimestamp (now + its grace, 30 s by default)
            // and stays, Terminating, until the kubelet confirms it stopped
            // (here: a moment later); the answer is the pod as it is then.
            let key = (resource.to_string(), ns.to_string(), n.to_string());
            // Graceful unless the pod has no node yet or has ended.
            let graceful = resource == "pods"
                && s.objects.get(&key).is_some_and(|p| {
                    (p["spec"]["nodeName"].is_string() || p["status"]["phase"] == "Running")
                        && !matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
                });
            let grace_default = s
                .objects
                .get(&key)
                .and_then(|p| p["spec"]["terminationGracePeriodSeconds"].as_u64())
                .unwrap_or(30);
            if graceful {
                let grace = opts["gracePeriodSeconds"].as_u64().unwrap_or(grace_default);
                s.update(resource, ns, n, |p| {
                    p["metadata"]["deletionTimestamp"] = json!(rfc3339(now() + grace));
                    p["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
                });
                s.deletions
                    .push((resource.to_string(), n.to_string(), policy.clone()));
                let pod = s.objects.get(&key).cloned().unwrap_or(Value::Null);
                let (st, ns, n) = (Arc::clone(st), ns.to_string(), n.to_string());
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if let Ok(mut s) = st.lock()
                        && let Some(obj) = s.remove("pods", &ns, &n)
                    {
                        let uid = obj["metadata"]["uid"].as_str().unwrap_or("").to_string();
                        s.collect_owned(&uid);
                    }
                });
                return respond(StatusCode::OK, pod);
            }
            let Some(obj) = s.remove(resource, ns, n) else {
                return not_found(n);
            };
            s.deletions
                .push((resource.to_string(), n.to_string(), policy.clone()));
            if policy != "Orphan" {
                let uid = obj["metadata"]["uid"].as_str().unwrap_or("").to_string();
                s.collect_owned(&uid);
            }
            // A Job (deleted at once, its pods left to the garbage
            // collector) is answered with a `Status`, not the object.
            if resource == "jobs" {
                return respond(
                    StatusCode::OK,
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                        "details": {"name": n, "group": "batch", "kind": "jobs",
                                    "uid": obj["metadata"]["uid"]}}),
                );
            }
            respond(StatusCode::OK, obj)
        }
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("the fake API server does not implement {verb} on {resource}"),
            json!({}),
        ),
    }
}

/// `current` with `body` applied as a patch of content type `ct`, as the
/// API server does: a JSON merge patch (RFC 7386), a JSON patch (RFC 6902,
/// what `kubectl rollout undo` sends), or a strategic merge patch (what
/// `kubectl scale`, `set image` send: lists of named items, such as
/// `containers`, merged item by item on `name`). Any other type is 415.
fn apply_patch(current: &Value, ct: &str, body: &[u8]) -> Result<Value, Box<Response<Body>>> {
    let bad = |e: String| {
        Box::new(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("error decoding patch: {e}"),
            json!({}),
        ))
    };
    let mut out = current.clone();
    if ct.starts_with("application/merge-patch+json") {
        let patch: Value = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
        merge(&mut out, &patch);
    } else if ct.starts_with("application/json-patch+json") {
        let patch: json_patch::Patch =
            serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
        json_patch::patch(&mut out, &patch).map_err(|e| {
            Box::new(status(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                format!("the server rejected our request due to an error in our request: {e}"),
                json!({}),
            ))
        })?;
    } else if ct.starts_with("application/strategic-merge-patch+json") {
        let patch: Value = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
        strategic_merge(&mut out, &patch);
    } else {
        return Err(Box::new(status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (not {ct})"
            ),
            json!({}),
        )));
    }
    Ok(out)
}

/// A strategic merge patch, for the lists the gateway's tools touch: a
/// list whose items are objects with a `name` (containers, env, ports,
/// volumes) is merged item by item on it; anything else as a merge patch.
fn strategic_merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                    continue;
                }
                let named = |a: &Value| {
                    a.as_array()
                        .is_some_and(|a| !a.is_empty() && a.iter().all(|i| i["name"].is_string()))
                };
                match t.get_mut(k) {
                    Some(Value::Array(items)) if named(v) => {
                        for pi in v.as_array().into_iter().flatten() {
                            match items.iter_mut().find(|i| i["name"] == pi["name"]) {
                                Some(existing) => strategic_merge(existing, pi),
                                None => items.push(pi.clone()),
                            }
                        }
                    }
                    Some(existing) if existing.is_object() && v.is_object() => {
                        strategic_merge(existing, v)
                    }
                    _ => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// `dryRun` takes one value, `All`; anything else is 422, as the real
/// server says it.
/// What the real server refuses of a write's query: a `dryRun` other
/// than `All`, a `fieldValidation` other than `Ignore`, `Warn` or
/// `Strict` (400 BadRequest, as the API server says it).
fn bad_query(q: &BTreeMap<String, String>) -> Option<Response<Body>> {
    if let Some(r) = bad_dry_run(q) {
        return Some(r);
    }
    let v = q.get("fieldValidation")?;
    (!matches!(v.as_str(), "Ignore" | "Warn" | "Strict")).then(|| {
        status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!(
                "fieldValidation parameter unsupported: {v}: must be one of Ignore, Warn or Strict"
            ),
            json!({}),
        )
    })
}

/// The API server's validation of a pod template (a Job's) or a pod: each
/// container's and init container's volume mount must name one of the
/// pod's volumes (`spec.template.spec.containers[0].volumeMounts[0].name:
/// Not found: "x"`, 422 Invalid).
fn mount_of_no_volume(resource: &str, obj: &Value) -> Option<Response<Body>> {
    let (spec, at) = match resource {
        "jobs" => (&obj["spec"]["template"]["spec"], "spec.template.spec"),
        "pods" => (&obj["spec"], "spec"),
        _ => return None,
    };
    let volumes: Vec<&str> = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str())
        .collect();
    for list in ["initContainers", "containers"] {
        for (i, c) in spec[list].as_array().into_iter().flatten().enumerate() {
            for (j, m) in c["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                let name = m["name"].as_str().unwrap_or_default();
                if !volumes.contains(&name) {
                    let kind = if resource == "jobs" {
                        "Job.batch"
                    } else {
                        "Pod"
                    };
                    let obj_name = obj["metadata"]["name"].as_str().unwrap_or_default();
                    return Some(status(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "Invalid",
                        format!(
                            "{kind} \"{obj_name}\" is invalid: {at}.{list}[{i}].volumeMounts[{j}].name: Not found: \"{name}\""
                        ),
                        json!({"name": obj_name, "kind": resource}),
                    ));
                }
            }
        }
    }
    None
}

fn bad_dry_run(q: &BTreeMap<String, String>) -> Option<Response<Body>> {
    let v = q.get("dryRun")?;
    (v != "All").then(|| {
        status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("Unsupported value: \"{v}\": supported values: \"All\""),
            json!({}),
        )
    })
}

/// 409 Conflict for a write that carried a `resourceVersion` other than
/// the stored one (optimistic concurrency), as the real server says it.
fn conflict_error(resource: &str, name: &str) -> Response<Body> {
    api_error(
        StatusCode::CONFLICT,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
            qualified(resource)
        ),
        resource,
        Some(name),
    )
}

/// A PUT (the whole object) or a PATCH of `name`: optimistic concurrency
/// on the `resourceVersion` the write carries (409 when it is not the
/// stored one), `metadata.generation` + 1 when the spec changes, and with
/// `dryRun=All` the object as it would be (its stored `resourceVersion`)
/// with nothing stored.
#[allow(clippy::too_many_arguments)]
fn write_object(
    verb: &str,
    resource: &str,
    ns: &str,
    name: &str,
    q: &BTreeMap<String, String>,
    ct: &str,
    body: &[u8],
    st: &Arc<Mutex<State>>,
) -> Response<Body> {
    let mut s = st.lock().expect("state");
    let key = (resource.to_string(), ns.to_string(), name.to_string());
    let Some(current) = s.objects.get(&key).cloned() else {
        return not_found_error(resource, name);
    };
    let stored_rv = current["metadata"]["resourceVersion"].clone();
    let mut next = if verb == "update" {
        match serde_json::from_slice::<Value>(body) {
            Ok(v) => v,
            Err(e) => {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("the body is not an object: {e}"),
                    json!({}),
                );
            }
        }
    } else {
        match apply_patch(&current, ct, body) {
            Ok(v) => v,
            Err(r) => return *r,
        }
    };
    // The version the write was made against, when it says one.
    let claimed = next["metadata"]["resourceVersion"].clone();
    if claimed.as_str().is_some_and(|v| !v.is_empty()) && claimed != stored_rv {
        return conflict_error(resource, name);
    }
    // What the server keeps whatever the write says.
    for k in ["uid", "creationTimestamp", "name", "namespace"] {
        next["metadata"][k] = current["metadata"][k].clone();
    }
    // A kind with a `status` subresource keeps its status on a write of
    // the main resource (API conventions, "Spec and Status": the status is
    // written only through `/status`; each kind's strategy copies the old
    // status over in PrepareForUpdate).
    if has_status_subresource(resource) {
        match current.get("status") {
            Some(st) => next["status"] = st.clone(),
            None => {
                next.as_object_mut().map(|m| m.remove("status"));
            }
        }
    }
    let generation = current["metadata"]["generation"].as_i64().unwrap_or(1);
    next["metadata"]["generation"] = json!(if next["spec"] != current["spec"] {
        generation + 1
    } else {
        generation
    });
    next["metadata"]["resourceVersion"] = stored_rv;
    if let Some(r) = bad_dry_run(q) {
        return r;
    }
    if q.get("dryRun").is_some_and(|v| v == "All") {
        return respond(StatusCode::OK, next);
    }
    s.update(resource, ns, name, |o| *o = next);
    respond(
        StatusCode::OK,
        s.objects.get(&key).cloned().unwrap_or(Value::Null),
    )
}

/// What a client's create keeps: each kind's PrepareForCreate drops the
/// status of a kind whose status is a subresource, and a workload's
/// generation starts at 1 whatever the client sent.
fn as_created(resource: &str, mut obj: Value) -> Value {
    if has_status_subresource(resource)
        && let Some(m) = obj.as_object_mut()
    {
        m.remove("status");
    }
    if let Some(m) = obj["metadata"].as_object_mut() {
        m.remove("generation");
    }
    obj
}

/// The built-in kinds the fake serves whose status is a subresource.
fn has_status_subresource(resource: &str) -> bool {
    matches!(
        resource,
        "deployments"
            | "statefulsets"
            | "daemonsets"
            | "replicasets"
            | "pods"
            | "jobs"
            | "services"
            | "persistentvolumeclaims"
            | "namespaces"
    )
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            for (k, v) in p {
                if v.is_null() {
                    if let Some(t) = target.as_object_mut() {
                        t.remove(k);
                    }
                } else {
                    merge(&mut target[k.as_str()], v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// One open watch stream, counted in [`State::open_watches`] until its
/// serving task ends (the client closed it, or it timed out).
struct OpenWatch(Arc<Mutex<State>>);

impl OpenWatch {
    fn new(st: Arc<Mutex<State>>) -> OpenWatch {
        if let Ok(mut s) = st.lock() {
            s.open_watches += 1;
        }
        OpenWatch(st)
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        if let Ok(mut s) = self.0.lock() {
            s.open_watches = s.open_watches.saturating_sub(1);
        }
    }
}

/// The job controller's `activeDeadlineSeconds`, as Kubernetes 1.31+
/// enforces it: counted from `status.startTime` (whole seconds), read
/// again each time (a claimed warm Job's deadline is patched); when it
/// passes, the Job gets `FailureTarget` (`DeadlineExceeded`, "Job was
/// active longer than specified deadline"), `active` 0 and `terminating`
/// its pods, and each pod is deleted gracefully; once a pod is gone the
/// Job gets `Failed` of the same reason ([`State::job_follows_pod`]).
async fn deadline_controller(st: std::sync::Weak<Mutex<State>>) {
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Some(st) = st.upgrade() else { return };
        let mut s = match st.lock() {
            Ok(s) => s,
            Err(_) => return,
        };
        let now = now_f64();
        let due: Vec<(String, String)> = s
            .objects
            .iter()
            .filter(|((r, _, _), _)| r == "jobs")
            .filter(|(_, j)| {
                let settled = j["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| {
                        c["status"] == "True"
                            && matches!(
                                c["type"].as_str(),
                                Some(
                                    "FailureTarget" | "Failed" | "Complete" | "SuccessCriteriaMet"
                                )
                            )
                    });
                let started = j["status"]["startTime"]
                    .as_str()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                    .map(|t| t.timestamp() as f64);
                match (started, j["spec"]["activeDeadlineSeconds"].as_f64()) {
                    (Some(at), Some(d)) => !settled && at + d <= now,
                    _ => false,
                }
            })
            .map(|((_, ns, name), _)| (ns.clone(), name.clone()))
            .collect();
        for (ns, job) in due {
            let pods = s.pods_of(&job);
            let at = rfc3339(now as u64);
            s.update("jobs", &ns, &job, |j| {
                let mut conditions = j["status"]["conditions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                conditions.push(
                    json!({"type": "FailureTarget", "status": "True", "reason": "DeadlineExceeded",
                    "message": "Job was active longer than specified deadline",
                    "lastProbeTime": at, "lastTransitionTime": at}),
                );
                j["status"]["conditions"] = json!(conditions);
                j["status"]["active"] = json!(0);
                j["status"]["terminating"] = json!(pods.len());
            });
            for pod in pods {
                let grace = s
                    .objects
                    .get(&("pods".to_string(), ns.clone(), pod.clone()))
                    .and_then(|p| p["spec"]["terminationGracePeriodSeconds"].as_u64())
                    .unwrap_or(30);
                s.update("pods", &ns, &pod, |p| {
                    p["metadata"]["deletionTimestamp"] = json!(rfc3339(now as u64 + grace));
                    p["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
                });
                // The kubelet stops it (SIGTERM: 143) and confirms.
                let (st, ns) = (Arc::clone(&st), ns.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if let Ok(mut s) = st.lock() {
                        s.update("pods", &ns, &pod, |p| {
                            if !matches!(
                                p["status"]["phase"].as_str(),
                                Some("Succeeded" | "Failed")
                            ) {
                                p["status"]["phase"] = json!("Failed");
                            }
                        });
                        if let Some(obj) = s.remove("pods", &ns, &pod) {
                            let uid = obj["metadata"]["uid"].as_str().unwrap_or("").to_string();
                            s.collect_owned(&uid);
                        }
                    }
                });
            }
        }
    }
}

/// With a [`Kubelet`] model, the node runs the Job's pod on its own.
fn start_kubelet(st: &Arc<Mutex<State>>, s: &State, ns: &str, job: &Value) {
    let Some(k) = s.kubelet.clone() else { return };
    let name = job["metadata"]["name"].as_str().unwrap_or_default();
    for pod in s.pods_of(name) {
        tokio::spawn(kubelet(Arc::clone(st), ns.to_string(), pod, k.clone()));
    }
}

/// The job controller: one pod per Job (or a FailedCreate Event when
/// admission rejects it).
fn job_controller(s: &mut State, ns: &str, job: &Value) {
    let job_name = job["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let job_uid = job["metadata"]["uid"].clone();
    let owner = json!([{"apiVersion": "batch/v1", "kind": "Job", "name": job_name, "uid": job_uid,
                        "controller": true, "blockOwnerDeletion": true}]);
    let pod_name = format!("{job_name}-{}", random_suffix());
    if let Some(message) = s.reject_pods.clone() {
        s.put("events", ns, json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": format!("{job_name}."), "namespace": ns},
            "involvedObject": {"kind": "Job", "name": job_name, "namespace": ns, "uid": job_uid, "apiVersion": "batch/v1"},
            "reason": "FailedCreate", "type": "Warning",
            "message": format!("Error creating: pods \"{pod_name}\" is forbidden: {message}"),
            "source": {"component": "job-controller"}, "count": 1,
            "firstTimestamp": rfc3339(now()), "lastTimestamp": rfc3339(now()), "eventTime": null,
            "reportingComponent": "job-controller", "reportingInstance": ""}));
        return;
    }
    let template = &job["spec"]["template"];
    let mut labels = template["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    labels["job-name"] = json!(job_name);
    labels["batch.kubernetes.io/job-name"] = json!(job_name);
    labels["controller-uid"] = job_uid.clone();
    s.put(
        "pods",
        ns,
        json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": ns, "labels": labels, "ownerReferences": owner},
        "spec": template["spec"], "status": {"phase": "Pending"}}),
    );
    s.update("jobs", ns, &job_name, |j| {
        j["status"] = json!({"active": 1, "startTime": rfc3339(now())});
    });
}

/// What `generateName` appends: five characters of apimachinery's
/// `utilrand` alphabet (no vowels, no look-alike digits), as a Job's pod
/// is named `<job>-<5 chars>` by the job controller.
/// A pod's PodMetrics (`metrics.k8s.io/v1beta1`) as metrics-server
/// reports it: each container's CPU (millicores) and memory (MiB) now.
pub fn pod_metrics(ns: &str, pod: &str, containers: &[(&str, u32, u32)]) -> Value {
    json!({"apiVersion": "metrics.k8s.io/v1beta1", "kind": "PodMetrics",
        "metadata": {"name": pod, "namespace": ns, "labels": {"app": "web"}},
        "timestamp": "2026-12-07T00:10:00Z", "window": "15s",
        "containers": containers.iter().map(|(c, cpu, mem)| json!({"name": c,
            "usage": {"cpu": format!("{}n", u64::from(*cpu) * 1_000_000), "memory": format!("{}Ki", u64::from(*mem) * 1024)}}))
            .collect::<Vec<_>>()})
}

pub fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut r = [0u8; 5];
    getrandom::fill(&mut r).expect("random");
    r.iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

/// A core/v1 Event as `events.k8s.io/v1` shows it: `regarding`, `note`,
/// `reportingController`, and the old fields as `deprecated*`.
pub fn events_v1(e: &Value) -> Value {
    let controller = e["reportingComponent"]
        .as_str()
        .filter(|c| !c.is_empty())
        .or_else(|| e["source"]["component"].as_str())
        .unwrap_or_default();
    let mut out = json!({"kind": "Event", "apiVersion": "events.k8s.io/v1", "metadata": e["metadata"],
        "eventTime": e["eventTime"], "reportingController": controller,
        "reportingInstance": e["reportingInstance"], "reason": e["reason"],
        "regarding": e["involvedObject"], "note": e["message"], "type": e["type"],
        "deprecatedSource": e["source"], "deprecatedFirstTimestamp": e["firstTimestamp"],
        "deprecatedLastTimestamp": e["lastTimestamp"]});
    // What the old API had none of, the new one leaves out.
    if !e["action"].is_null() {
        out["action"] = e["action"].clone();
    }
    if !e["count"].is_null() {
        out["deprecatedCount"] = e["count"].clone();
    }
    out
}

/// A core/v1 Event as the scheduler writes it (the new events API under
/// the old one): `eventTime` to the microsecond, `reportingComponent`,
/// an `action`, and no `count`, `firstTimestamp`, `lastTimestamp` or
/// `source.component`.
pub fn scheduler_event(ns: &str, pod: &str, uid: &str, reason: &str, message: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": format!("{pod}."), "namespace": ns},
        "involvedObject": {"kind": "Pod", "namespace": ns, "name": pod, "uid": uid, "apiVersion": "v1"},
        "reason": reason, "message": message, "type": if reason == "Scheduled" { "Normal" } else { "Warning" },
        "source": {}, "firstTimestamp": null, "lastTimestamp": null,
        "eventTime": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "action": "Binding", "reportingComponent": "default-scheduler",
        "reportingInstance": "default-scheduler-node"})
}

/// A core/v1 Event as the kubelet writes it (the old events API): a
/// `count`, `firstTimestamp` and `lastTimestamp` of whole seconds,
/// `source.component`, no `eventTime`.
pub fn kubelet_event(
    ns: &str,
    pod: &str,
    uid: &str,
    reason: &str,
    message: &str,
    count: u32,
) -> Value {
    let at = rfc3339(now());
    json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": format!("{pod}."), "namespace": ns},
        "involvedObject": {"kind": "Pod", "namespace": ns, "name": pod, "uid": uid, "apiVersion": "v1"},
        "reason": reason, "message": message,
        "type": if matches!(reason, "Pulled" | "Created" | "Started" | "Killing") { "Normal" } else { "Warning" },
        "source": {"component": "kubelet", "host": "node"}, "count": count,
        "firstTimestamp": at, "lastTimestamp": at, "eventTime": null,
        "reportingComponent": "kubelet", "reportingInstance": "node"})
}

fn kind_of(resource: &str) -> &'static str {
    match resource {
        "pods" => "Pod",
        "jobs" => "Job",
        "secrets" => "Secret",
        "events" => "Event",
        "deployments" => "Deployment",
        "replicasets" => "ReplicaSet",
        "statefulsets" => "StatefulSet",
        "daemonsets" => "DaemonSet",
        "controllerrevisions" => "ControllerRevision",
        "services" => "Service",
        "configmaps" => "ConfigMap",
        "serviceaccounts" => "ServiceAccount",
        "roles" => "Role",
        "rolebindings" => "RoleBinding",
        _ => "Unknown",
    }
}

fn api_version_of(resource: &str) -> &'static str {
    match resource {
        "jobs" => "batch/v1",
        "deployments" | "replicasets" | "statefulsets" | "daemonsets" | "controllerrevisions" => {
            "apps/v1"
        }
        "roles" | "rolebindings" => "rbac.authorization.k8s.io/v1",
        _ => "v1",
    }
}

fn discovery(path: &str) -> Option<Value> {
    Some(match path {
        "/version" => {
            json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-fake", "platform": "linux/amd64"})
        }
        "/api" => {
            json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "kubernetes:6443"}]})
        }
        "/apis" => {
            let group = |g: &str| {
                let gv = format!("{g}/v1");
                json!({"name": g, "versions": [{"groupVersion": gv, "version": "v1"}],
                       "preferredVersion": {"groupVersion": gv, "version": "v1"}})
            };
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                group("apps"), group("events.k8s.io"), group("batch"), group("rbac.authorization.k8s.io")]})
        }
        "/apis/apps/v1" => {
            json!({"kind": "APIResourceList", "groupVersion": "apps/v1", "resources": [
            {"name": "controllerrevisions", "singularName": "controllerrevision", "namespaced": true, "kind": "ControllerRevision", "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]},
            {"name": "daemonsets", "singularName": "daemonset", "namespaced": true, "kind": "DaemonSet", "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "shortNames": ["ds"], "categories": ["all"]},
            {"name": "deployments", "singularName": "deployment", "namespaced": true, "kind": "Deployment", "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "shortNames": ["deploy"], "categories": ["all"]},
            {"name": "deployments/scale", "singularName": "", "namespaced": true, "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]},
            {"name": "deployments/status", "singularName": "", "namespaced": true, "kind": "Deployment", "verbs": ["get", "patch", "update"]},
            {"name": "replicasets", "singularName": "replicaset", "namespaced": true, "kind": "ReplicaSet", "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "shortNames": ["rs"], "categories": ["all"]},
            {"name": "statefulsets", "singularName": "statefulset", "namespaced": true, "kind": "StatefulSet", "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "shortNames": ["sts"], "categories": ["all"]}]})
        }
        "/apis/batch/v1" => {
            json!({"kind": "APIResourceList", "groupVersion": "batch/v1", "resources": [
            {"name": "jobs", "singularName": "job", "namespaced": true, "kind": "Job", "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "categories": ["all"]}]})
        }
        "/apis/events.k8s.io/v1" => {
            json!({"kind": "APIResourceList", "groupVersion": "events.k8s.io/v1", "resources": [
            {"name": "events", "singularName": "event", "namespaced": true, "kind": "Event", "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "shortNames": ["ev"]}]})
        }
        "/api/v1" => json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            {"name": "configmaps", "singularName": "configmap", "namespaced": true, "kind": "ConfigMap", "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "shortNames": ["cm"]},
            {"name": "events", "singularName": "event", "namespaced": true, "kind": "Event", "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "shortNames": ["ev"]},
            {"name": "pods", "singularName": "pod", "namespaced": true, "kind": "Pod", "verbs": ["get", "list", "watch"], "shortNames": ["po"], "categories": ["all"]},
            {"name": "pods/log", "singularName": "", "namespaced": true, "kind": "Pod", "verbs": ["get"]},
            {"name": "services", "singularName": "service", "namespaced": true, "kind": "Service", "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "shortNames": ["svc"], "categories": ["all"]},
            {"name": "secrets", "singularName": "secret", "namespaced": true, "kind": "Secret", "verbs": ["get", "list"]},
            {"name": "serviceaccounts", "singularName": "serviceaccount", "namespaced": true, "kind": "ServiceAccount", "verbs": ["create", "delete", "get", "list"], "shortNames": ["sa"]},
            {"name": "serviceaccounts/token", "singularName": "", "namespaced": true, "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest", "verbs": ["create"]}]}),
        "/apis/rbac.authorization.k8s.io/v1" => {
            json!({"kind": "APIResourceList", "groupVersion": "rbac.authorization.k8s.io/v1", "resources": [
            {"name": "roles", "singularName": "role", "namespaced": true, "kind": "Role", "verbs": ["create", "delete", "get", "list"]},
            {"name": "rolebindings", "singularName": "rolebinding", "namespaced": true, "kind": "RoleBinding", "verbs": ["create", "delete", "get", "list"]}]})
        }
        _ => return None,
    })
}

fn serve(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    st: Arc<Mutex<State>>,
    admin: String,
    shutdown: tokio::sync::watch::Receiver<u64>,
) -> tokio::task::JoinHandle<()> {
    // This listener's generation: a pause ends it and every connection it
    // accepted, also one accepted while the pause was taking effect.
    let born = *shutdown.borrow();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (acceptor, st, admin) = (acceptor.clone(), Arc::clone(&st), admin.clone());
            let mut shutdown = shutdown.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |req| {
                    let (st, admin) = (Arc::clone(&st), admin.clone());
                    async move { Ok::<_, std::convert::Infallible>(handle(req, st, admin).await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                    .with_upgrades();
                if *shutdown.borrow() != born {
                    return;
                }
                tokio::select! {
                    _ = conn => {}
                    _ = shutdown.wait_for(|g| *g != born) => {}
                }
            });
        }
    })
}

async fn handle(req: Request<Incoming>, st: Arc<Mutex<State>>, admin: String) -> Response<Body> {
    if req.uri().path().ends_with("/attach")
        && req
            .headers()
            .get("upgrade")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"))
    {
        return attach(req, st, admin).await;
    }
    let at = std::time::Instant::now();
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let raw_query = req.uri().query().unwrap_or("").to_string();
    let q = query(req.uri());
    let ct = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let latency = match st.lock() {
        Ok(mut s) => {
            s.arrived.push(path.clone());
            s.request_latency
        }
        Err(_) => Duration::ZERO,
    };
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let (resp, user) = route(&method, &path, &q, &ct, &body, auth.as_deref(), &st, &admin).await;
    if let Ok(mut s) = st.lock() {
        s.seen.push(Seen {
            method,
            path,
            content_type: ct,
            user,
            status: resp.status().as_u16(),
            at,
            query: raw_query,
        });
    }
    resp
}

#[allow(clippy::too_many_arguments)]
async fn route(
    method: &str,
    path: &str,
    q: &BTreeMap<String, String>,
    ct: &str,
    body: &[u8],
    auth: Option<&str>,
    st: &Arc<Mutex<State>>,
    admin: &str,
) -> (Response<Body>, String) {
    let who = st.lock().expect("state").who(auth, admin);
    let user = match &who {
        Who::Admin => "admin".to_string(),
        Who::Sa { ns, name } => format!("system:serviceaccount:{ns}:{name}"),
        Who::Invalid => "invalid".to_string(),
        Who::Anonymous => "anonymous".to_string(),
    };
    if matches!(who, Who::Invalid | Who::Anonymous) {
        return (
            status(
                StatusCode::UNAUTHORIZED,
                "Unauthorized",
                "Unauthorized".into(),
                json!({}),
            ),
            user,
        );
    }
    // Discovery is open to every authenticated user (system:discovery).
    let metrics_api = st.lock().expect("state").metrics_api;
    if method == "GET"
        && let Some(mut d) = discovery(path)
    {
        // metrics-server registers its group through an APIService.
        if path == "/apis"
            && metrics_api
            && let Some(groups) = d["groups"].as_array_mut()
        {
            let gv = "metrics.k8s.io/v1beta1";
            groups.push(json!({"name": "metrics.k8s.io", "versions": [{"groupVersion": gv, "version": "v1beta1"}],
                "preferredVersion": {"groupVersion": gv, "version": "v1beta1"}}));
        }
        return (respond(StatusCode::OK, d), user);
    }
    if method == "GET" && metrics_api && path == "/apis/metrics.k8s.io/v1beta1" {
        return (
            respond(
                StatusCode::OK,
                json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "metrics.k8s.io/v1beta1", "resources": [
                    {"name": "nodes", "singularName": "", "namespaced": false, "kind": "NodeMetrics", "verbs": ["get", "list"]},
                    {"name": "pods", "singularName": "", "namespaced": true, "kind": "PodMetrics", "verbs": ["get", "list"]}]}),
            ),
            user,
        );
    }
    // TokenReview (what Vault's Kubernetes auth asks about a JWT). The
    // reviewer needs `create tokenreviews` at the cluster scope, as on a
    // real server (the built-in `system:auth-delegator` grants it). The
    // admin JWT stands for OpenBao's own service account (vault/openbao)
    // and is held to that too.
    if method == "POST" && path == "/apis/authentication.k8s.io/v1/tokenreviews" {
        let reviewer = match &who {
            Who::Sa { ns, name } => Some((ns.clone(), name.clone())),
            _ => Some(("vault".to_string(), "openbao".to_string())),
        };
        if let Some((rns, rsa)) = reviewer
            && !st.lock().expect("state").allowed_cluster(
                &rns,
                &rsa,
                "create",
                "authentication.k8s.io",
                "tokenreviews",
            )
        {
            return (
                status(
                    StatusCode::FORBIDDEN,
                    "Forbidden",
                    format!(
                        "tokenreviews.authentication.k8s.io is forbidden: User \"system:serviceaccount:{rns}:{rsa}\" cannot create resource \"tokenreviews\" in API group \"authentication.k8s.io\" at the cluster scope"
                    ),
                    json!({"group": "authentication.k8s.io", "kind": "tokenreviews"}),
                ),
                user,
            );
        }
        let review = match decode_body(ct, body, "TokenReview") {
            Ok(v) => v,
            Err(e) => {
                return (
                    status(StatusCode::BAD_REQUEST, "BadRequest", e, json!({})),
                    user,
                );
            }
        };
        let token = review["spec"]["token"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let s = st.lock().expect("state");
        let reviewed = s.who(Some(&format!("Bearer {token}")), admin);
        let status_json = match reviewed {
            Who::Sa { ns, name }
                if s.objects.contains_key(&(
                    "serviceaccounts".to_string(),
                    ns.clone(),
                    name.clone(),
                )) =>
            {
                let uid = s.objects[&("serviceaccounts".to_string(), ns.clone(), name.clone())]["metadata"]["uid"].clone();
                json!({"authenticated": true, "user": {"username": format!("system:serviceaccount:{ns}:{name}"), "uid": uid,
                    "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{ns}"), "system:authenticated"]},
                    "audiences": review["spec"]["audiences"]})
            }
            _ => json!({"authenticated": false, "error": "invalid bearer token"}),
        };
        drop(s);
        let mut out = review;
        out["apiVersion"] = json!("authentication.k8s.io/v1");
        out["kind"] = json!("TokenReview");
        out["status"] = status_json;
        return (respond(StatusCode::CREATED, out), user);
    }
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    // (group, namespace, resource, name, subresource)
    let (group, rest) = match parts.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", "rbac.authorization.k8s.io", "v1", rest @ ..] => {
            ("rbac.authorization.k8s.io", rest)
        }
        ["apis", "admissionregistration.k8s.io", "v1", rest @ ..] => {
            ("admissionregistration.k8s.io", rest)
        }
        ["apis", "metrics.k8s.io", "v1beta1", rest @ ..] if metrics_api => ("metrics.k8s.io", rest),
        ["apis", "batch", "v1", rest @ ..] => ("batch", rest),
        ["apis", "events.k8s.io", "v1", rest @ ..] => ("events.k8s.io", rest),
        // What a deployment's manifests hold (created by an admin's apply).
        [
            "apis",
            g @ ("apps" | "policy" | "networking.k8s.io" | "node.k8s.io"),
            "v1",
            rest @ ..,
        ] => (*g, rest),
        _ => {
            return (
                status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    "the server could not find the requested resource".into(),
                    json!({}),
                ),
                user,
            );
        }
    };
    // Namespaces themselves (cluster-scoped; admin only).
    if group.is_empty() && matches!(who, Who::Admin) {
        match (method, rest) {
            ("POST", ["namespaces"]) => {
                let obj: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
                let mut s = st.lock().expect("state");
                let r = match s.create("namespaces", "", obj) {
                    Ok(o) => respond(StatusCode::CREATED, o),
                    Err(r) => *r,
                };
                return (r, user);
            }
            ("DELETE", ["namespaces", name]) => {
                let mut s = st.lock().expect("state");
                // Deleting a namespace deletes what is in it.
                let inside: Vec<(String, String, String)> = s
                    .objects
                    .keys()
                    .filter(|(_, n, _)| n == name)
                    .cloned()
                    .collect();
                for (r, n, o) in inside {
                    s.remove(&r, &n, &o);
                }
                return (s.delete("namespaces", "", name), user);
            }
            _ => {}
        }
    }
    // Cluster-scoped objects of a deployment's manifests (admin only).
    if matches!(who, Who::Admin)
        && method == "POST"
        && let [
            resource @ ("clusterroles"
            | "clusterrolebindings"
            | "runtimeclasses"
            | "validatingadmissionpolicies"
            | "validatingadmissionpolicybindings"),
        ] = rest
    {
        let r = match decode_body(ct, body, "") {
            Ok(obj) => match st.lock().expect("state").create(resource, "", obj) {
                Ok(o) => respond(StatusCode::CREATED, o),
                Err(r) => *r,
            },
            Err(e) => status(StatusCode::BAD_REQUEST, "BadRequest", e, json!({})),
        };
        return (r, user);
    }
    // RBAC objects read at the cluster scope, as an operator's tools read
    // them: every namespace's Roles or RoleBindings (with a label
    // selector), ClusterRoles and ClusterRoleBindings, one ClusterRole.
    // An admin's, or a service account's with the cluster-wide right.
    if method == "GET"
        && let [
            resource @ ("roles"
            | "rolebindings"
            | "clusterroles"
            | "clusterrolebindings"
            | "validatingadmissionpolicies"
            | "validatingadmissionpolicybindings"),
            rest_name @ ..,
        ] = rest
        && matches!(
            group,
            "rbac.authorization.k8s.io" | "admissionregistration.k8s.io"
        )
        && rest_name.len() <= 1
    {
        let verb = if rest_name.is_empty() { "list" } else { "get" };
        let s = st.lock().expect("state");
        if let Who::Sa {
            ns: sa_ns,
            name: sa,
        } = &who
            && !s.allowed_cluster(sa_ns, sa, verb, group, resource)
        {
            return (
                forbidden_error(
                    &user,
                    verb,
                    resource,
                    resource,
                    rest_name.first().copied(),
                    "",
                ),
                user,
            );
        }
        let labels = q.get("labelSelector").map(String::as_str);
        let r = match rest_name.first() {
            Some(name)
                if matches!(
                    *resource,
                    "clusterroles"
                        | "clusterrolebindings"
                        | "validatingadmissionpolicies"
                        | "validatingadmissionpolicybindings"
                ) =>
            {
                match s
                    .objects
                    .get(&(resource.to_string(), String::new(), name.to_string()))
                {
                    Some(o) => respond(StatusCode::OK, o.clone()),
                    None => not_found_error(resource, name),
                }
            }
            Some(_) => status(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource".into(),
                json!({}),
            ),
            None => {
                let kind = match *resource {
                    "roles" => "RoleList",
                    "rolebindings" => "RoleBindingList",
                    "clusterroles" => "ClusterRoleList",
                    "validatingadmissionpolicies" => "ValidatingAdmissionPolicyList",
                    "validatingadmissionpolicybindings" => "ValidatingAdmissionPolicyBindingList",
                    _ => "ClusterRoleBindingList",
                };
                let items: Vec<Value> = s
                    .objects
                    .iter()
                    .filter(|((r, _, _), v)| r == resource && matches(v, labels, None))
                    .map(|(_, v)| v.clone())
                    .collect();
                respond(
                    StatusCode::OK,
                    json!({"kind": kind, "apiVersion": format!("{group}/v1"),
                           "metadata": {"resourceVersion": s.next_rv.to_string()}, "items": items}),
                )
            }
        };
        return (r, user);
    }
    // GET of one Namespace (kubectl asks for it after a NotFound, to say
    // whether the namespace itself is missing). A namespace's own name is
    // the request's namespace for RBAC: a ServiceAccount needs `get
    // namespaces` granted there or cluster-wide, which the gateway's roles
    // never grant: 403, as the real server answers.
    if let (true, ["namespaces", name]) = (method == "GET", rest) {
        let r = match &who {
            Who::Sa {
                ns: sa_ns,
                name: sa,
            } => {
                let s = st.lock().expect("state");
                if s.allowed(sa_ns, sa, "get", "", "namespaces", Some(name), name)
                    || s.allowed_cluster(sa_ns, sa, "get", "", "namespaces")
                {
                    drop(s);
                    namespace_get(st, name)
                } else {
                    forbidden_error(&user, "get", "namespaces", "namespaces", Some(name), name)
                }
            }
            _ => namespace_get(st, name),
        };
        return (r, user);
    }
    let (ns, resource, name, sub) = match rest {
        ["namespaces", ns, resource] => (*ns, *resource, None, None),
        ["namespaces", ns, resource, name] => (*ns, *resource, Some(*name), None),
        ["namespaces", ns, resource, name, sub] => (*ns, *resource, Some(*name), Some(*sub)),
        _ => {
            return (
                status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    "the server could not find the requested resource".into(),
                    json!({}),
                ),
                user,
            );
        }
    };
    let watching = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
    let verb = match (method, name, sub) {
        ("GET", None, _) if watching => "watch",
        ("GET", None, _) => "list",
        ("GET", Some(_), _) => "get",
        ("POST", _, _) => "create",
        ("DELETE", _, _) => "delete",
        ("PATCH", _, _) => "patch",
        ("PUT", Some(_), _) => "update",
        _ => "unsupported",
    };
    let (authz_resource, authz_group) = match sub {
        Some("token") => ("serviceaccounts/token".to_string(), group),
        Some(s) => (format!("{resource}/{s}"), group),
        None => (resource.to_string(), group),
    };
    if let Who::Sa {
        ns: sa_ns,
        name: sa,
    } = &who
    {
        let ok = st.lock().expect("state").allowed(
            sa_ns,
            sa,
            verb,
            authz_group,
            &authz_resource,
            name,
            ns,
        );
        if !ok {
            return (
                forbidden_error(&user, verb, resource, &authz_resource, name, ns),
                user,
            );
        }
    }
    if method == "POST" {
        let s = st.lock().expect("state");
        if s.strict_namespaces
            && !s
                .objects
                .contains_key(&("namespaces".to_string(), String::new(), ns.to_string()))
        {
            return (
                status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("namespaces \"{ns}\" not found"),
                    json!({"name": ns, "kind": "namespaces"}),
                ),
                user,
            );
        }
    }
    let labels = q.get("labelSelector").map(String::as_str);
    let fields = q.get("fieldSelector").map(String::as_str);
    // Events: each API takes its own field labels (core/v1:
    // involvedObject.*, events.k8s.io/v1: regarding.*; the other's is 400),
    // and events.k8s.io/v1 shows the same events in its own shape.
    if resource == "events" && matches!(verb, "list" | "watch") {
        let (ours, theirs) = if group == "events.k8s.io" {
            ("regarding.", "involvedObject.")
        } else {
            ("involvedObject.", "regarding.")
        };
        if let Some(bad) = fields
            .unwrap_or("")
            .split(',')
            .filter_map(|p| p.split_once('=').map(|(k, _)| k.trim_end_matches('!')))
            .find(|k| k.starts_with(theirs) && !k.starts_with(ours))
        {
            return (
                status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("field label not supported: {bad}"),
                    json!({}),
                ),
                user,
            );
        }
        if group == "events.k8s.io" && verb == "list" {
            let s = st.lock().expect("state");
            let items: Vec<Value> = s
                .select("events", ns, labels, None)
                .iter()
                .map(events_v1)
                .filter(|e| matches(e, None, fields))
                .collect();
            return (
                respond(
                    StatusCode::OK,
                    json!({"kind": "EventList", "apiVersion": "events.k8s.io/v1",
                        "metadata": {"resourceVersion": s.next_rv.to_string()}, "items": items}),
                ),
                user,
            );
        }
    }
    // The metrics API's PodMetrics (read-only, as metrics-server serves
    // them: `podmetrics.metrics.k8s.io "NAME" not found` for a pod it has
    // no sample of yet).
    if group == "metrics.k8s.io" {
        let s = st.lock().expect("state");
        let r = match (verb, resource, name) {
            ("list", "pods", None) => respond(
                StatusCode::OK,
                json!({"kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1", "metadata": {},
                       "items": s.select("podmetrics", ns, labels, None)}),
            ),
            ("get", "pods", Some(n)) => {
                match s
                    .objects
                    .get(&("podmetrics".to_string(), ns.to_string(), n.to_string()))
                {
                    Some(o) => respond(StatusCode::OK, o.clone()),
                    None => api_error(
                        StatusCode::NOT_FOUND,
                        "NotFound",
                        format!("podmetrics.metrics.k8s.io \"{n}\" not found"),
                        "pods",
                        Some(n),
                    ),
                }
            }
            _ => status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                format!("the metrics API serves get and list, not {verb}"),
                json!({}),
            ),
        };
        return (r, user);
    }
    // The stored kinds the Kubernetes tools read: get, list and watch
    // (with label and field selectors) as for the workload kinds.
    let read_kind = matches!(
        resource,
        "deployments"
            | "replicasets"
            | "statefulsets"
            | "daemonsets"
            | "controllerrevisions"
            | "services"
            | "configmaps"
    ) && matches!(verb, "get" | "list" | "watch")
        && sub.is_none();
    let workload = read_kind
        || matches!(resource, "jobs" | "secrets" | "events")
        || (resource == "pods"
            && (labels.is_some() || fields.is_some() || watching || verb == "create"));
    if workload || (resource == "pods" && name.is_some()) {
        return (
            workload_route(verb, resource, ns, name, sub, q, ct, body, st).await,
            user,
        );
    }
    let resp = match (verb, resource, sub) {
        ("list", "pods", None) => {
            let delay = st.lock().expect("state").pods_delay;
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            // One store, as the real API has: the pods a test serves and
            // the pods the job controller created.
            let s = st.lock().expect("state");
            let mut items = s.pods.get(ns).cloned().unwrap_or_default();
            items.extend(s.select("pods", ns, None, None));
            respond(
                StatusCode::OK,
                json!({"kind": "PodList", "apiVersion": "v1",
                       "metadata": {"resourceVersion": s.next_rv.to_string()}, "items": items}),
            )
        }
        // RBAC objects, read as an operator's tools read them.
        ("get", "roles" | "rolebindings", None) => {
            let s = st.lock().expect("state");
            let name = name.unwrap_or_default();
            match s
                .objects
                .get(&(resource.to_string(), ns.to_string(), name.to_string()))
            {
                Some(o) => respond(StatusCode::OK, o.clone()),
                None => not_found_error(resource, name),
            }
        }
        ("list", "roles" | "rolebindings", None) => {
            let s = st.lock().expect("state");
            let kind = if resource == "roles" {
                "RoleList"
            } else {
                "RoleBindingList"
            };
            respond(
                StatusCode::OK,
                json!({"kind": kind, "apiVersion": "rbac.authorization.k8s.io/v1",
                       "metadata": {"resourceVersion": s.next_rv.to_string()},
                       "items": s.select(resource, ns, labels, fields)}),
            )
        }
        ("list", "secrets", None) => respond(
            StatusCode::OK,
            json!({"kind": "SecretList", "apiVersion": "v1", "metadata": {}, "items": []}),
        ),
        ("create", "serviceaccounts", Some("token")) => {
            let name = name.unwrap_or_default();
            let tr = match decode_body(ct, body, "TokenRequest") {
                Ok(v) => v,
                Err(e) => {
                    return (
                        status(StatusCode::BAD_REQUEST, "BadRequest", e, json!({})),
                        user,
                    );
                }
            };
            let mut s = st.lock().expect("state");
            if let Some(r) = s.admission_of(
                &user,
                "CREATE",
                "serviceaccounts/token",
                ns,
                Some(name),
                Some(&tr),
                None,
            ) {
                return (r, user);
            }
            let key = (
                "serviceaccounts".to_string(),
                ns.to_string(),
                name.to_string(),
            );
            let Some(sa) = s.objects.get(&key).cloned() else {
                return (not_found_error("serviceaccounts", name), user);
            };
            let secs = tr["spec"]["expirationSeconds"].as_u64().unwrap_or(3600);
            if secs < 600 {
                return (
                    status(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "Invalid",
                        format!(
                            "TokenRequest.authentication.k8s.io \"{name}\" is invalid: spec.expirationSeconds: Invalid value: {secs}: may not specify a duration less than 10 minutes"
                        ),
                        json!({"name": name, "group": "authentication.k8s.io", "kind": "TokenRequest",
                            "causes": [{"reason": "FieldValueInvalid", "field": "spec.expirationSeconds",
                                "message": format!("Invalid value: {secs}: may not specify a duration less than 10 minutes")}]}),
                    ),
                    user,
                );
            }
            let exp = now() + secs;
            let uid = sa["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let token = jwt(
                &format!("system:serviceaccount:{ns}:{name}"),
                exp,
                json!({"kubernetes.io": {"namespace": ns, "serviceaccount": {"name": name, "uid": uid}}}),
            );
            s.tokens
                .insert(token.clone(), (ns.to_string(), name.to_string(), uid, exp));
            s.created.push(("serviceaccounts/token".into(), tr.clone()));
            let mut out = tr;
            out["metadata"]["name"] = json!(name);
            out["metadata"]["namespace"] = json!(ns);
            out["metadata"]["creationTimestamp"] = Value::Null;
            out["status"] = json!({"token": token, "expirationTimestamp": rfc3339(exp)});
            respond(StatusCode::CREATED, out)
        }
        ("create", "serviceaccounts" | "roles" | "rolebindings", None) => {
            let kind = match resource {
                "serviceaccounts" => "ServiceAccount",
                "roles" => "Role",
                _ => "RoleBinding",
            };
            match decode_body(ct, body, kind) {
                Ok(obj) => {
                    let mut s = st.lock().expect("state");
                    let refused = match &who {
                        Who::Sa {
                            ns: sa_ns,
                            name: sa,
                        } => s.escalation(sa_ns, sa, resource, &obj, ns),
                        _ => None,
                    };
                    let mut obj = obj;
                    if obj["metadata"]["namespace"].is_null() {
                        obj["metadata"]["namespace"] = json!(ns);
                    }
                    let denied = match refused {
                        Some(_) => None,
                        None => s.admission(&user, "CREATE", resource, ns, Some(&obj), None),
                    };
                    match (refused, denied) {
                        (_, Some(r)) => r,
                        (Some(message), None) => status(
                            StatusCode::FORBIDDEN,
                            "Forbidden",
                            message,
                            json!({"group": "rbac.authorization.k8s.io", "kind": resource,
                                "name": obj["metadata"]["name"]}),
                        ),
                        (None, None) => match s.create(resource, ns, obj) {
                            Ok(created) => respond(StatusCode::CREATED, created),
                            Err(r) => *r,
                        },
                    }
                }
                Err(e) => status(StatusCode::BAD_REQUEST, "BadRequest", e, json!({})),
            }
        }
        // The rest of a deployment's manifests: kept as they were sent
        // (no controller acts on them here).
        (
            "create",
            "deployments"
            | "statefulsets"
            | "poddisruptionbudgets"
            | "networkpolicies"
            | "services"
            | "configmaps"
            | "persistentvolumeclaims",
            None,
        ) => match decode_body(ct, body, "") {
            // What the real server refuses of a create (the write path's
            // own checks), and a dry run (`dryRun=All`) that stores
            // nothing and answers the object as it would be.
            Ok(_) if bad_query(q).is_some() => bad_query(q).expect("checked"),
            Ok(obj)
                if obj["metadata"]["resourceVersion"]
                    .as_str()
                    .is_some_and(|v| !v.is_empty()) =>
            {
                status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalError",
                    "resourceVersion should not be set on objects to be created".into(),
                    json!({}),
                )
            }
            Ok(obj) if q.get("dryRun").is_some() => {
                match st.lock().expect("state").would_create(
                    resource,
                    ns,
                    as_created(resource, obj),
                ) {
                    Ok(o) => respond(StatusCode::CREATED, o),
                    Err(r) => *r,
                }
            }
            Ok(obj) => {
                match st
                    .lock()
                    .expect("state")
                    .create(resource, ns, as_created(resource, obj))
                {
                    Ok(created) => respond(StatusCode::CREATED, created),
                    Err(r) => *r,
                }
            }
            Err(e) => status(StatusCode::BAD_REQUEST, "BadRequest", e, json!({})),
        },
        // A stored object of a deployment's kinds (a Deployment the
        // Kubernetes tools read and change): get, replace, patch.
        (
            "get",
            "deployments" | "statefulsets" | "services" | "configmaps" | "persistentvolumeclaims",
            None,
        ) => {
            let n = name.unwrap_or_default();
            match st.lock().expect("state").objects.get(&(
                resource.to_string(),
                ns.to_string(),
                n.to_string(),
            )) {
                Some(o) => respond(StatusCode::OK, o.clone()),
                None => not_found_error(resource, n),
            }
        }
        (
            "update" | "patch",
            "deployments"
            | "statefulsets"
            | "daemonsets"
            | "services"
            | "configmaps"
            | "persistentvolumeclaims",
            None,
        ) if bad_query(q).is_some() => bad_query(q).expect("checked"),
        (
            "update" | "patch",
            "deployments"
            | "statefulsets"
            | "daemonsets"
            | "services"
            | "configmaps"
            | "persistentvolumeclaims",
            None,
        ) => write_object(
            verb,
            resource,
            ns,
            name.unwrap_or_default(),
            q,
            ct,
            body,
            st,
        ),
        // Deleting one object of the kinds the Kubernetes tools change:
        // DeleteOptions in the body (their preconditions: the uid and
        // resourceVersion the object must still have, else 409 Conflict
        // and nothing deleted), and a dry run that deletes nothing.
        (
            "delete",
            "deployments"
            | "statefulsets"
            | "daemonsets"
            | "services"
            | "configmaps"
            | "persistentvolumeclaims",
            None,
        ) => {
            if let Some(r) = bad_query(q) {
                return (r, user);
            }
            let n = name.unwrap_or_default();
            let opts: Value = if body.is_empty() {
                json!({})
            } else {
                match serde_json::from_slice(body) {
                    Ok(v) => v,
                    Err(e) => {
                        return (
                            status(
                                StatusCode::BAD_REQUEST,
                                "BadRequest",
                                format!("the body is not DeleteOptions: {e}"),
                                json!({}),
                            ),
                            user,
                        );
                    }
                }
            };
            let mut s = st.lock().expect("state");
            let key = (resource.to_string(), ns.to_string(), n.to_string());
            let Some(current) = s.objects.get(&key).cloned() else {
                return (not_found_error(resource, n), user);
            };
            for (field, label) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
                let want = &opts["preconditions"][field];
                if !want.is_null() && want != &current["metadata"][field] {
                    return (
                        api_error(
                            StatusCode::CONFLICT,
                            "Conflict",
                            format!(
                                "Precondition failed: {label} in precondition: {}, {label} in object meta: {}",
                                want.as_str().unwrap_or(""),
                                current["metadata"][field].as_str().unwrap_or("")
                            ),
                            resource,
                            Some(n),
                        ),
                        user,
                    );
                }
            }
            // The API server reads a DELETE's options from its body when
            // it has one, and then ignores the query (`dryRun` included).
            let dry_run = if body.is_empty() {
                q.get("dryRun").is_some()
            } else {
                opts["dryRun"] == json!(["All"])
            };
            // An object without finalizers is gone at once: the answer is
            // a Status naming it. One with finalizers (a PVC's protection)
            // is answered with itself, marked for deletion.
            let answer = if current["metadata"]["finalizers"]
                .as_array()
                .is_some_and(|f| !f.is_empty())
                || resource == "persistentvolumeclaims"
            {
                let mut o = current.clone();
                o["metadata"]["deletionTimestamp"] = json!(rfc3339(now()));
                o
            } else {
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    "details": {"name": n, "group": group, "kind": resource, "uid": current["metadata"]["uid"]}})
            };
            if !dry_run {
                s.remove(resource, ns, n);
            }
            respond(StatusCode::OK, answer)
        }
        ("delete", "serviceaccounts" | "roles" | "rolebindings", None) => {
            let mut s = st.lock().expect("state");
            let name = name.unwrap_or_default();
            let old = s
                .objects
                .get(&(resource.to_string(), ns.to_string(), name.to_string()))
                .cloned();
            match old.and_then(|o| s.admission(&user, "DELETE", resource, ns, None, Some(&o))) {
                Some(r) => r,
                None => s.delete(resource, ns, name),
            }
        }
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("the fake API server does not implement {method} {path}"),
            json!({}),
        ),
    };
    (resp, user)
}
