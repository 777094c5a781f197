//! The kubernetes backend (README.md: the sandboxes): one gVisor Job per call.
//!
//! Per call: a Secret with the credential and files in, a Job (both named
//! from the request id, labelled for this gateway, the Secret owned by the
//! Job), then watches — not polling — on the Job, its pod and its events,
//! mapped to the sandbox result: succeeded, failed with its exit code,
//! deadline exceeded, killed for memory, image pull error, admission
//! rejected. The container's log is collected and split back into stdout
//! and stderr (the step runner frames its lines). Once the pod's container
//! has started the log is followed, and the runner's end frame, its last
//! line, is the end: the kubelet reports a container's end only at its
//! next relist, up to a second later. Without the frame (the runner died)
//! the end is the kubelet's. The Job is deleted
//! (propagation `Background`; the Secret goes with it, and is deleted too)
//! on every path, including cancellation; at start the backend deletes the
//! leftovers of this gateway instance.
//!
//! The watches are kube's watcher (list, then watch from the last version,
//! re-list when that version is gone, backoff after every error): without a
//! reachable API server, or with one whose watches keep failing, they are
//! retried with backoff until the deadline plus a grace period, then the
//! call fails with the last error. A pod whose sandbox or volumes cannot be
//! set up (the kubelet's events on the pod) ends the call with that reason
//! once it repeats, or at the deadline; a Job's `FailureTarget` (Kubernetes
//! 1.31+) is its end, before `Failed`.

pub mod manifests;
pub mod podsecurity;
mod pool;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use kube::api::{DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;

pub use manifests::KubeSandboxConfig;

use super::{
    Captured, Ended, Network, RunFuture, Sandbox, SandboxError, SandboxRequest, SandboxResult,
};

/// Whether an object, by its labels, is to be deleted.
type LabelTest<'a> =
    dyn Fn(Option<&std::collections::BTreeMap<String, String>>) -> bool + Sync + 'a;

#[derive(Clone)]
pub struct KubernetesSandbox {
    client: Client,
    cfg: Arc<KubeSandboxConfig>,
    /// The warm pool, when `warm_pool` is above 0.
    pool: Option<Arc<pool::Pool>>,
}

impl std::fmt::Debug for KubernetesSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesSandbox")
            .field("namespace", &self.cfg.namespace)
            .finish_non_exhaustive()
    }
}

/// The gateway's client for the cluster: `sandbox.kubernetes.kubeconfig`
/// when set, else inferred (in-cluster service account, KUBECONFIG,
/// ~/.kube/config).
pub async fn client(cfg: &KubeSandboxConfig) -> Result<Client, SandboxError> {
    let config = config(cfg).await?;
    Client::try_from(config).map_err(|e| SandboxError::Setup(format!("kube client: {e}")))
}

/// The cluster configuration behind [`client`].
pub async fn config(cfg: &KubeSandboxConfig) -> Result<kube::Config, SandboxError> {
    Ok(match &cfg.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| SandboxError::Setup(format!("kubeconfig {}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| SandboxError::Setup(format!("kubeconfig {}: {e}", path.display())))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| SandboxError::Setup(format!("no cluster configuration found: {e}")))?,
    })
}

/// Whether an API call that failed this way may succeed when repeated:
/// the API server was unreachable, overloaded or failed itself. A 4xx answer
/// (other than 429) is final.
fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        _ => true,
    }
}

/// The container's log. The pod has ended, so the log is complete and
/// reading it is idempotent: a transient failure (the API server restarting
/// just after the watch reported the end) is retried with backoff for up to
/// `retry_for`, so a blip does not lose the call's output.
async fn read_log(
    pods: &Api<Pod>,
    pod: &str,
    lp: &LogParams,
    retry_for: Duration,
) -> Result<Vec<u8>, kube::Error> {
    let until = Instant::now() + retry_for;
    let mut backoff = Duration::from_millis(100);
    loop {
        match read_log_bytes(pods, pod, lp).await {
            Ok(log) => return Ok(log),
            Err(e) if transient(&e) && Instant::now() + backoff < until => {
                tracing::debug!("reading the sandbox log failed ({e}); retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The log as bytes: a sandbox may print anything, and the byte limit may
/// cut a character in two, so the log is never required to be UTF-8 (the
/// text form of kube's `logs` fails on one such byte, and all the output
/// was lost).
async fn read_log_bytes(
    pods: &Api<Pod>,
    pod: &str,
    lp: &LogParams,
) -> Result<Vec<u8>, kube::Error> {
    use futures::AsyncReadExt;
    let stream = pods.log_stream(pod, lp).await?;
    let mut stream = std::pin::pin!(stream);
    let mut bytes = Vec::new();
    stream
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| kube::Error::Service(Box::new(e)))?;
    Ok(bytes)
}

/// An API error in words: the API server's own status and message.
fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!(
            "the API server answered {} {}: {}",
            s.code, s.reason, s.message
        ),
        other => other.to_string(),
    }
}

fn kube_err(what: &str, e: kube::Error) -> SandboxError {
    SandboxError::Setup(format!("{what}: {}", describe(&e)))
}

/// What the watches have seen so far.
#[derive(Debug, Default)]
struct Seen {
    pod: Option<String>,
    /// (exit code, reason) of the terminated container.
    terminated: Option<(i32, String)>,
    phase: Option<String>,
    deadline: bool,
    /// Why the sandbox cannot run at all (admission, image): the end.
    failure: Option<String>,
    /// Why the pod has not started yet (its sandbox, a volume, scheduling):
    /// the end when it keeps happening, and what a deadline is blamed on.
    pod_problem: Option<(String, i32)>,
    /// Repeats of each pod event, by (reason, Event object).
    pod_events: BTreeMap<(String, String), i32>,
    /// The Job succeeded (`SuccessCriteriaMet` or `Complete`).
    complete: bool,
    /// The pod is being deleted or disrupted (the Job controller at the
    /// deadline, an eviction, a drain): its end is not the tool's own.
    killed: bool,
    /// The pod failed before its container ran (the kubelet's admission:
    /// OutOfcpu, NodeAffinity…; an eviction), with its reason.
    pod_failed: Option<String>,
    /// The Job failed for a reason other than its deadline
    /// (`FailureTarget` or `Failed`: BackoffLimitExceeded, PodFailurePolicy…).
    job_failed: Option<String>,
}

/// How often a pod-level failure (kubelet events) may repeat before the
/// call ends with it rather than waiting for the deadline.
const POD_PROBLEM_REPEATS: i32 = 3;

/// Why a container waiting in `w` will never start by itself, if it won't
/// (`REASON): message`, closing the parenthesis its caller opens).
fn cannot_start(w: &k8s_openapi::api::core::v1::ContainerStateWaiting) -> Option<String> {
    let reason = w.reason.clone().unwrap_or_default();
    matches!(
        reason.as_str(),
        "ErrImagePull"
            | "ImagePullBackOff"
            | "InvalidImageName"
            | "ErrImageNeverPull"
            | "CreateContainerConfigError"
            | "CreateContainerError"
    )
    .then(|| format!("{reason}): {}", w.message.clone().unwrap_or_default()))
}

impl Seen {
    fn pod(&mut self, pod: &Pod) {
        self.pod = pod.metadata.name.clone();
        let Some(status) = &pod.status else {
            return;
        };
        self.phase = status.phase.clone();
        if status.reason.as_deref() == Some("DeadlineExceeded") {
            self.deadline = true;
        }
        let disrupted = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "DisruptionTarget" && c.status == "True");
        if pod.metadata.deletion_timestamp.is_some() || disrupted {
            self.killed = true;
        }
        if status.phase.as_deref() == Some("Failed") {
            let reason = status.reason.clone().unwrap_or_else(|| "Failed".into());
            let message = status.message.clone().unwrap_or_default();
            self.pod_failed = Some(format!("{reason}: {message}"));
        }
        for cs in status.container_statuses.iter().flatten() {
            let Some(state) = &cs.state else { continue };
            if let Some(t) = &state.terminated {
                self.terminated = Some((t.exit_code, t.reason.clone().unwrap_or_default()));
            }
            if let Some(w) = &state.waiting
                && let Some(why) = cannot_start(w)
            {
                self.failure = Some(format!("the sandbox container cannot start ({why}"));
            }
        }
        // A sandbox run from another image first has the runner copied in
        // by an init container of the runner image: its failure ends the
        // call now (the sandbox's container would wait for it forever).
        for cs in status.init_container_statuses.iter().flatten() {
            let Some(state) = &cs.state else { continue };
            if let Some(t) = &state.terminated
                && t.exit_code != 0
            {
                self.failure = Some(format!(
                    "the step runner could not be put beside the sandbox's image (init container {} ended with {} {}); nothing was run",
                    cs.name,
                    t.exit_code,
                    t.reason.clone().unwrap_or_default()
                ));
            }
            if let Some(w) = &state.waiting
                && let Some(why) = cannot_start(w)
            {
                self.failure = Some(format!(
                    "the runner image's init container cannot start ({why}; nothing was run"
                ));
            }
        }
    }

    /// The Job's conditions. Since Kubernetes 1.31 a Job that fails first
    /// gets `FailureTarget` (the controller then deletes its pod) and only
    /// after the pod has ended `Failed`; one that succeeds first gets
    /// `SuccessCriteriaMet`, then `Complete`. The first of each is the end.
    fn job(&mut self, job: &Job) {
        for c in job
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
        {
            if c.status != "True" {
                continue;
            }
            match (c.type_.as_str(), c.reason.as_deref()) {
                ("Failed" | "FailureTarget", Some("DeadlineExceeded")) => self.deadline = true,
                ("Failed" | "FailureTarget", reason) => {
                    self.job_failed = Some(format!(
                        "{}{}",
                        reason.unwrap_or("failed"),
                        c.message
                            .as_deref()
                            .map(|m| format!(": {m}"))
                            .unwrap_or_default()
                    ));
                }
                ("Complete" | "SuccessCriteriaMet", _) => self.complete = true,
                _ => {}
            }
        }
    }

    fn event(&mut self, ev: &Event) {
        let message = ev.message.clone().unwrap_or_default();
        match (ev.involved_object.kind.as_deref(), ev.reason.as_deref()) {
            (Some("Job"), Some("FailedCreate")) => {
                self.failure = Some(format!("admission rejected the sandbox pod: {message}"));
            }
            (
                Some("Pod"),
                Some(
                    reason @ ("FailedCreatePodSandBox"
                    | "FailedMount"
                    | "FailedAttachVolume"
                    | "FailedScheduling"),
                ),
            ) => {
                let what = match reason {
                    "FailedCreatePodSandBox" => {
                        "the sandbox pod's runtime sandbox could not be created"
                    }
                    "FailedScheduling" => "the sandbox pod could not be scheduled",
                    _ => "the sandbox pod's volumes could not be mounted",
                };
                // Repeats are counted over every Event object of the
                // reason (a new sandbox id each try makes a new object)
                // and both counts (core `count`, events.k8s.io `series`).
                let repeats = ev
                    .series
                    .as_ref()
                    .and_then(|s| s.count)
                    .or(ev.count)
                    .unwrap_or(1)
                    .max(1);
                let key = ev.metadata.name.clone().unwrap_or_default();
                self.pod_events.insert((reason.to_string(), key), repeats);
                let total: i32 = self
                    .pod_events
                    .iter()
                    .filter(|((r, _), _)| r == reason)
                    .map(|(_, n)| *n)
                    .sum();
                // Unschedulable for now is normal where nodes are added on
                // demand: only the deadline ends that.
                let count = if reason == "FailedScheduling" {
                    0
                } else {
                    total
                };
                let problem = format!("{what} ({reason}): {message}");
                // Said when it changes: a run that waits on a pod the
                // scheduler cannot place (or that will not start) says why
                // in the log while it waits, not only at its deadline.
                if self.pod_problem.as_ref().map(|(p, _)| p) != Some(&problem) {
                    tracing::warn!(
                        pod = self.pod.as_deref().unwrap_or_default(),
                        "a sandbox waits: {problem}"
                    );
                }
                self.pod_problem = Some((problem, count));
            }
            _ => {}
        }
    }

    /// The end, when the watches have seen one.
    fn ended(&self) -> Option<Result<(Option<i32>, Ended), String>> {
        if let Some(f) = &self.failure {
            return Some(Err(f.clone()));
        }
        let never_ran = self.terminated.is_none()
            && !matches!(
                self.phase.as_deref(),
                Some("Running" | "Succeeded" | "Failed")
            );
        if let Some((problem, count)) = &self.pod_problem
            && never_ran
            && (*count >= POD_PROBLEM_REPEATS || self.deadline)
        {
            return Some(Err(problem.clone()));
        }
        if self.deadline {
            return Some(Ok((None, Ended::Deadline)));
        }
        if let Some((_, reason)) = &self.terminated
            && reason == "OOMKilled"
        {
            return Some(Ok((None, Ended::Limit("memory".into()))));
        }
        // The pod's end says how (its exit code). It is the end on its own
        // when nobody killed the pod; a killed pod (being deleted, or
        // disrupted) waits for the Job's verdict: at its deadline the
        // controller kills the pod before it marks the Job.
        let finished = matches!(self.phase.as_deref(), Some("Succeeded" | "Failed"));
        if let Some((code, _)) = &self.terminated
            && finished
            && !self.killed
            && self.job_failed.is_none()
        {
            return Some(Ok((Some(*code), Ended::Exited)));
        }
        // A pod that failed with no container end (the kubelet refused it,
        // or it was evicted first).
        if self.terminated.is_none()
            && let Some(why) = &self.pod_failed
        {
            return Some(Err(format!(
                "the sandbox pod failed before its container ran ({why})"
            )));
        }
        // The Job succeeded and the pod's end was missed (a re-list after
        // the pod was gone): a success, exit 0.
        if self.complete && self.terminated.is_none() && self.job_failed.is_none() {
            return Some(Ok((Some(0), Ended::Exited)));
        }
        match (&self.terminated, &self.job_failed) {
            (Some((code, _)), Some(why)) if finished => {
                if *code == 0 {
                    Some(Err(format!(
                        "the sandbox Job failed ({why}) although its container exited 0"
                    )))
                } else {
                    Some(Ok((Some(*code), Ended::Exited)))
                }
            }
            (Some((code, _)), None) if finished && self.complete => {
                Some(Ok((Some(*code), Ended::Exited)))
            }
            // The Job's verdict came before the pod's end: wait for it.
            _ => None,
        }
    }

    /// What a give-up at the deadline is blamed on.
    fn overdue(&self) -> Result<(Option<i32>, Ended), String> {
        match (&self.pod_problem, &self.job_failed) {
            (Some((problem, _)), _) if self.terminated.is_none() => Err(problem.clone()),
            (_, Some(why)) => Err(format!(
                "the sandbox Job failed ({why}) and its pod's end was never seen"
            )),
            _ => Ok((None, Ended::Deadline)),
        }
    }
}

/// One of the watches' events.
enum Update {
    Pod(Box<Pod>),
    Job(Box<Job>),
    Event(Box<Event>),
    Lost(String),
    /// The followed log reached the runner's end frame: the whole log (up
    /// to the frame) and the runner's exit code.
    LogEnded(Vec<u8>, u8),
}

/// Follow the container's log from its start and report the runner's end
/// frame as soon as it is written ([`Update::LogEnded`]): the kubelet
/// reports a container's end only at its next relist (up to a second
/// later), the log has it at once. A log that ends without the frame, or
/// grows past `limit`, or fails, reports nothing: the watches see the end.
fn follow_log(
    pods: Api<Pod>,
    pod: String,
    limit: usize,
    pooled: bool,
    tx: tokio::sync::mpsc::UnboundedSender<Update>,
) -> tokio::task::JoinHandle<()> {
    use futures::AsyncReadExt;
    tokio::spawn(async move {
        let lp = LogParams {
            container: Some(manifests::CONTAINER.into()),
            follow: true,
            limit_bytes: Some(i64::try_from(limit).unwrap_or(i64::MAX)),
            ..LogParams::default()
        };
        let stream = match pods.log_stream(&pod, &lp).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("following the sandbox's log failed ({e}); waiting for its end");
                return;
            }
        };
        let mut stream = std::pin::pin!(stream);
        let mut log = Vec::new();
        // Where the call's part of the log begins: at once for a cold pod,
        // after the runner's ready line for a warm one.
        let mut from = (!pooled).then_some(0);
        // Each byte is looked at once, however the log is cut.
        let mut scan = gateway_runner::protocol::EndScan::default();
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            let n = match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            log.extend_from_slice(&chunk[..n]);
            let piece = match from {
                Some(_) => &chunk[..n],
                None => match gateway_runner::protocol::after_ready(&log) {
                    Some(at) => {
                        from = Some(at);
                        &log[at..]
                    }
                    None if log.len() >= limit => return,
                    None => continue,
                },
            };
            if let Some((len, code)) = scan.push(piece) {
                let at = from.unwrap_or(0);
                let body = log[at..at + len].to_vec();
                let _ = tx.send(Update::LogEnded(body, code));
                return;
            }
            if log.len() >= limit {
                return;
            }
        }
    })
}

/// What a warm pod's log may hold before the call's part (the runner's
/// messages while it waited for the lock-down).
const READY_SLACK: usize = 64 * 1024;

/// A sandbox's Job, made for its call or claimed from the pool, as the
/// wait for its end takes it.
struct Running {
    job: String,
    /// Selects its pod.
    pod_sel: String,
    cleanup: Cleanup,
    /// A warm pod: its log's call part begins after the ready line.
    pooled: bool,
    /// Tasks that last as long as the call (a warm pod's attach).
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Why a warm pod could not take a call.
enum Claim {
    /// Nothing reached the pod: the call can run in a new one.
    Untouched(String),
    /// The call's files or credential may have: the call fails.
    Failed(SandboxError),
}

/// Follow `api` with kube's watcher (a list, then a watch resumed from the
/// last version; a re-list when the version is gone or the stream ends
/// after an error; the default backoff, 0.8 s doubling to 30 s, after a
/// watch that fails to start or fails in the stream — kube-runtime resets
/// it at each new list, so a list that keeps failing is retried about every
/// 0.8 s), forwarding objects to `tx` until the receiver is dropped.
fn keep_watching<K, F>(
    api: Api<K>,
    config: watcher::Config,
    tx: tokio::sync::mpsc::UnboundedSender<Update>,
    wrap: F,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: Fn(K) -> Update + Send + 'static,
{
    tokio::spawn(async move {
        let stream = watcher::watcher(api, config).default_backoff();
        let mut stream = std::pin::pin!(stream);
        loop {
            // Ends as soon as nobody listens (a watch that only sees its
            // object deleted would otherwise never notice).
            let item = tokio::select! {
                _ = tx.closed() => return,
                item = stream.next() => match item {
                    Some(item) => item,
                    None => return,
                },
            };
            let sent = match item {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => tx.send(wrap(o)),
                Ok(_) => continue,
                Err(e) => tx.send(Update::Lost(e.to_string())),
            };
            if sent.is_err() {
                return;
            }
        }
    })
}

/// The call's watch tasks, aborted when dropped: at the end, and also when
/// the call is cancelled (its future dropped mid-wait).
struct Watchers(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Watchers {
    fn drop(&mut self) {
        for w in &self.0 {
            w.abort();
        }
    }
}

/// Deletes the Job and Secret when dropped before [`Cleanup::finish`]
/// (cancellation, panic): in the background on the runtime.
struct Cleanup {
    jobs: Api<Job>,
    secrets: Api<Secret>,
    job: String,
    secret: String,
    armed: bool,
}

impl Cleanup {
    async fn delete(jobs: &Api<Job>, secrets: &Api<Secret>, job: &str, secret: &str) {
        for attempt in 0..5u32 {
            fn gone<T>(r: &Result<T, kube::Error>) -> bool {
                match r {
                    Ok(_) => true,
                    Err(kube::Error::Api(s)) => s.code == 404,
                    Err(_) => false,
                }
            }
            let j = jobs.delete(job, &DeleteParams::background()).await;
            let s = secrets.delete(secret, &DeleteParams::background()).await;
            if gone(&j) && gone(&s) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200 * 2u64.pow(attempt))).await;
        }
        tracing::warn!(
            job,
            "could not delete the sandbox Job; it is removed at the next start"
        );
    }

    fn disarm(mut self) {
        self.armed = false;
    }

    /// Delete them now. The deletion runs in a task of its own: a call
    /// cancelled while it waits still has them deleted (the guard is
    /// disarmed before this returns).
    async fn finish(mut self) {
        self.armed = false;
        let (jobs, secrets, job, secret) = (
            self.jobs.clone(),
            self.secrets.clone(),
            self.job.clone(),
            self.secret.clone(),
        );
        let deletion =
            tokio::spawn(async move { Cleanup::delete(&jobs, &secrets, &job, &secret).await });
        let _ = deletion.await;
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (jobs, secrets, job, secret) = (
            self.jobs.clone(),
            self.secrets.clone(),
            self.job.clone(),
            self.secret.clone(),
        );
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            h.spawn(async move { Cleanup::delete(&jobs, &secrets, &job, &secret).await });
        }
    }
}

fn capped(bytes: Vec<u8>, cap: usize) -> Captured {
    let truncated = bytes.len() > cap;
    let mut bytes = bytes;
    bytes.truncate(cap);
    Captured { bytes, truncated }
}

/// What a backend made with `cfg` warns of its warm pool: a warm pod is
/// offered once its runner showed the network locked down, which it can
/// show only against the egress canary.
pub fn warm_pool_warning(cfg: &KubeSandboxConfig) -> Option<&'static str> {
    (cfg.warm_pool > 0 && cfg.egress_canary.is_none())
        .then_some("sandbox.kubernetes.warm_pool is set without egress_canary: no warm sandboxes")
}

impl KubernetesSandbox {
    pub fn new(client: Client, cfg: KubeSandboxConfig) -> KubernetesSandbox {
        if let Some(w) = warm_pool_warning(&cfg) {
            tracing::warn!("{w}");
        }
        let pool = (cfg.warm_pool > 0 && cfg.egress_canary.is_some()).then(|| {
            Arc::new(pool::Pool::new(
                cfg.warm_pool,
                Duration::from_secs(cfg.warm_pool_idle_seconds),
                pool::ready_wait(&cfg),
            ))
        });
        KubernetesSandbox {
            client,
            cfg: Arc::new(cfg),
            pool,
        }
    }

    pub fn config(&self) -> &KubeSandboxConfig {
        &self.cfg
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.cfg.namespace)
    }

    /// Delete every Job and Secret this gateway instance left (a previous
    /// run that stopped before its cleanup); a replica, only its own.
    /// Returns the Job names.
    pub async fn reap_leftovers(&self) -> Result<Vec<String>, SandboxError> {
        self.reap(&manifests::instance_selector(&self.cfg)).await
    }

    /// Delete every Job and Secret of this instance made by a replica that
    /// is not among `live` (it died: the living clean up after it).
    /// Objects without a replica's name are left alone. Returns the Job
    /// names.
    pub async fn reap_dead_replicas(&self, live: &[String]) -> Result<Vec<String>, SandboxError> {
        self.reap_where(&manifests::all_replicas_selector(&self.cfg), &|labels| {
            labels
                .and_then(|l| l.get(manifests::REPLICA))
                .is_some_and(|r| !live.contains(r))
        })
        .await
    }

    async fn reap(&self, selector: &str) -> Result<Vec<String>, SandboxError> {
        self.reap_where(selector, &|_| true).await
    }

    /// Delete the Jobs and Secrets `selector` selects whose labels `delete`
    /// accepts. Returns the Job names.
    async fn reap_where(
        &self,
        selector: &str,
        delete: &LabelTest<'_>,
    ) -> Result<Vec<String>, SandboxError> {
        let lp = ListParams::default().labels(selector);
        let jobs: Api<Job> = self.api();
        let secrets: Api<Secret> = self.api();
        let mut reaped = Vec::new();
        let list = jobs
            .list(&lp)
            .await
            .map_err(|e| kube_err("listing sandbox Jobs", e))?;
        for j in list {
            if delete(j.metadata.labels.as_ref())
                && let Some(name) = j.metadata.name
            {
                let _ = jobs.delete(&name, &DeleteParams::background()).await;
                reaped.push(name);
            }
        }
        let list = secrets
            .list(&lp)
            .await
            .map_err(|e| kube_err("listing sandbox Secrets", e))?;
        for s in list {
            if delete(s.metadata.labels.as_ref())
                && let Some(name) = s.metadata.name
            {
                let _ = secrets.delete(&name, &DeleteParams::background()).await;
            }
        }
        Ok(reaped)
    }

    async fn run_inner(&self, req: SandboxRequest) -> Result<SandboxResult, SandboxError> {
        let started = Instant::now();
        let mut stages = crate::Stages::start();
        if let Some(pool) = self.pool.clone()
            && manifests::poolable(&req)
        {
            let shell = manifests::shell(&req, "pool-shape");
            let (_, key) =
                manifests::warm_job(&self.cfg, &shell, "pool-shape", pool.idle_seconds())?;
            let (warm, stale) = pool.take(&key);
            self.refill(&key, shell);
            for w in stale {
                let sb = self.clone();
                tokio::spawn(async move { sb.delete_warm(&w.job).await });
            }
            if let Some(w) = warm {
                match self.claim(&req, w, &mut stages).await {
                    Ok(running) => {
                        pool.claimed(&key);
                        return self.wait(req, started, stages, running).await;
                    }
                    Err(Claim::Untouched(why)) => {
                        tracing::warn!(
                            "a warm sandbox could not be claimed ({why}); the call runs in a new one"
                        );
                        pool.failed(&key);
                    }
                    Err(Claim::Failed(e)) => return Err(e),
                }
            }
        }
        let running = self.start_cold(&req, &mut stages).await?;
        self.wait(req, started, stages, running).await
    }

    /// Take warm pod `w` for `req`: mark its Job claimed with the call's
    /// deadline, then write the call's files and credential to its stdin.
    /// `Untouched` when nothing reached the pod (the call can run cold);
    /// the pod is deleted either way when this fails.
    async fn claim(
        &self,
        req: &SandboxRequest,
        w: pool::Warm,
        stages: &mut crate::Stages,
    ) -> Result<Running, Claim> {
        use tokio::io::AsyncWriteExt;
        let jobs: Api<Job> = self.api();
        let pods: Api<Pod> = self.api();
        let cleanup = Cleanup {
            jobs: jobs.clone(),
            secrets: self.api(),
            job: w.job.clone(),
            secret: format!("{}-in", w.job),
            armed: true,
        };
        let line = match manifests::payload(req) {
            Ok(l) => l,
            Err(e) => {
                // Nothing was sent: the cold path refuses it the same way.
                cleanup.finish().await;
                return Err(Claim::Untouched(e.to_string()));
            }
        };
        // The Job's deadline counts from its start: what it has waited,
        // plus the call's own.
        let deadline = w.made.elapsed().as_secs() + req.deadline.as_secs().max(1) + 1;
        let patch = json!({
            "metadata": {"labels": {manifests::CLAIMED: req.name.to_ascii_lowercase()}},
            "spec": {"activeDeadlineSeconds": deadline},
        });
        if let Err(e) = jobs
            .patch(&w.job, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            cleanup.finish().await;
            return Err(Claim::Untouched(format!(
                "claiming its Job: {}",
                describe(&e)
            )));
        }
        stages.mark("claimed");
        let ap = kube::api::AttachParams::default()
            .container(manifests::CONTAINER)
            .stdin(true)
            .stdout(false)
            .stderr(false);
        let mut attached = match pods.attach(&w.pod, &ap).await {
            Ok(a) => a,
            Err(e) => {
                cleanup.finish().await;
                return Err(Claim::Untouched(format!(
                    "attaching to its pod: {}",
                    describe(&e)
                )));
            }
        };
        let Some(mut stdin) = attached.stdin() else {
            cleanup.finish().await;
            return Err(Claim::Untouched("its pod's stdin is not open".into()));
        };
        // The runner acts on the line only once its newline is in: while
        // `write_all` has not taken the whole line, no step can have run.
        let sent = tokio::time::timeout(Duration::from_secs(30), stdin.write_all(&line)).await;
        drop(line);
        if !matches!(sent, Ok(Ok(()))) {
            let why = match sent {
                Ok(Err(e)) => e.to_string(),
                _ => "not taken in 30 s".into(),
            };
            cleanup.finish().await;
            return Err(Claim::Failed(SandboxError::Setup(format!(
                "the call could not be written to the warm sandbox's stdin ({why}); nothing ran, and the sandbox was deleted"
            ))));
        }
        // The whole line is on its way: from here the call may run, and its
        // end is what the pod says, however the stdin closes.
        if let Err(e) = tokio::time::timeout(Duration::from_secs(5), stdin.shutdown())
            .await
            .unwrap_or(Ok(()))
        {
            tracing::debug!("closing the warm sandbox's stdin: {e}");
        }
        stages.mark("attached");
        // The attach stays open until the pod ends (or the call's end
        // aborts it).
        let session = tokio::spawn(async move {
            let _ = attached.join().await;
        });
        Ok(Running {
            job: w.job,
            pod_sel: format!("{}={}", manifests::REQUEST, w.request),
            cleanup,
            pooled: true,
            tasks: vec![session],
        })
    }

    /// Make `req`'s Secret and Job.
    async fn start_cold(
        &self,
        req: &SandboxRequest,
        stages: &mut crate::Stages,
    ) -> Result<Running, SandboxError> {
        let (job, secret) = manifests::build(&self.cfg, req)?;
        let (job_name, secret_name) = manifests::names(&req.name)?;
        let jobs: Api<Job> = self.api();
        let secrets: Api<Secret> = self.api();
        let pp = PostParams::default();
        // The guard exists before anything is created: a call cancelled
        // while the Secret is being created still deletes it (a delete of
        // what never got created is a harmless 404).
        let cleanup = Cleanup {
            jobs: jobs.clone(),
            secrets: secrets.clone(),
            job: job_name.clone(),
            secret: secret_name.clone(),
            armed: true,
        };
        if let Err(e) = secrets.create(&pp, &secret).await {
            // Not ours to delete when the name was taken (409).
            let ours = !matches!(&e, kube::Error::Api(s) if s.code == 409);
            if ours {
                cleanup.finish().await;
            } else {
                cleanup.disarm();
            }
            return Err(kube_err("creating the sandbox Secret", e));
        }
        stages.mark("secret_created");
        let created = match jobs.create(&pp, &job).await {
            Ok(j) => j,
            Err(e) => {
                if matches!(&e, kube::Error::Api(s) if s.code == 409) {
                    // Someone else's Job has the name: delete only our Secret.
                    cleanup.disarm();
                    let _ = secrets
                        .delete(&secret_name, &DeleteParams::background())
                        .await;
                } else {
                    cleanup.finish().await;
                }
                return Err(kube_err("creating the sandbox Job", e));
            }
        };
        stages.mark("job_created");
        // The Job owns the Secret: the garbage collector removes it too.
        if let Some(uid) = created.metadata.uid.clone() {
            let patch = json!({"metadata": {"ownerReferences": [{
                "apiVersion": "batch/v1", "kind": "Job", "name": job_name, "uid": uid,
                "controller": false, "blockOwnerDeletion": true}]}});
            if let Err(e) = secrets
                .patch(&secret_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                tracing::warn!(
                    "could not make the Job own its Secret ({e}); it is deleted explicitly"
                );
            }
        }
        Ok(Running {
            pod_sel: format!("{}={}", manifests::REQUEST, req.name.to_ascii_lowercase()),
            job: job_name,
            cleanup,
            pooled: false,
            tasks: Vec::new(),
        })
    }

    /// Follow a made or claimed Job to its end; its output, cleaned up.
    async fn wait(
        &self,
        req: SandboxRequest,
        started: Instant,
        mut stages: crate::Stages,
        running: Running,
    ) -> Result<SandboxResult, SandboxError> {
        let Running {
            job: job_name,
            pod_sel,
            cleanup,
            pooled,
            tasks,
        } = running;
        let jobs: Api<Job> = self.api();
        let pods: Api<Pod> = self.api();
        let events: Api<Event> = self.api();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut watchers = Watchers(vec![
            keep_watching(
                pods.clone(),
                watcher::Config::default().labels(&pod_sel).timeout(290),
                tx.clone(),
                |p| Update::Pod(Box::new(p)),
            ),
            keep_watching(
                jobs.clone(),
                watcher::Config::default()
                    .fields(&format!("metadata.name={job_name}"))
                    .timeout(290),
                tx.clone(),
                |j| Update::Job(Box::new(j)),
            ),
            keep_watching(
                events.clone(),
                watcher::Config::default()
                    .fields(&format!(
                        "involvedObject.kind=Job,involvedObject.name={job_name}"
                    ))
                    .timeout(290),
                tx.clone(),
                |e| Update::Event(Box::new(e)),
            ),
        ]);
        watchers.0.extend(tasks);
        // The pod's own events (the kubelet's: its sandbox, its volumes),
        // watched once the pod has a name.
        let mut pod_events: Option<tokio::sync::mpsc::UnboundedSender<Update>> = Some(tx.clone());
        let give_up =
            tokio::time::sleep(req.deadline + Duration::from_secs(self.cfg.grace_seconds));
        let mut give_up = std::pin::pin!(give_up);
        let mut seen = Seen::default();
        let mut lost: Option<String> = None;
        let cap = req.limits.output_bytes;
        // A warm pod's log has the runner's wait before the call's part.
        let log_limit = cap
            .saturating_mul(2)
            .saturating_add(if pooled { READY_SLACK } else { 0 });
        // The log as the runner ended it, when its end came from there.
        let mut ended_log: Option<Vec<u8>> = None;
        // Only a sandbox that hands back no files: files out are read from
        // the workspace once the container is really gone, never while a
        // process that wrote (or forged) the end frame may still change them.
        let mut follow: Option<tokio::sync::mpsc::UnboundedSender<Update>> =
            req.workdir.is_none().then_some(tx);
        let end = loop {
            tokio::select! {
                u = rx.recv() => match u {
                    Some(Update::Pod(p)) => {
                        lost = None;
                        seen.pod(&p);
                        pod_stages(&p, &mut stages);
                        if let (Some(name), true) = (&seen.pod, container_started(&p))
                            && let Some(tx) = follow.take()
                        {
                            watchers.0.push(follow_log(pods.clone(), name.clone(), log_limit, pooled, tx));
                        }
                        if let (Some(name), Some(tx)) = (&seen.pod, pod_events.take()) {
                            watchers.0.push(keep_watching(
                                events.clone(),
                                watcher::Config::default()
                                    .fields(&format!("involvedObject.kind=Pod,involvedObject.name={name}"))
                                    .timeout(290),
                                tx,
                                |e| Update::Event(Box::new(e)),
                            ));
                        }
                    }
                    Some(Update::Job(j)) => { lost = None; seen.job(&j) }
                    Some(Update::Event(e)) => { lost = None; seen.event(&e) }
                    Some(Update::Lost(why)) => lost = Some(why),
                    Some(Update::LogEnded(log, code)) => {
                        // The runner's word ends the run only while nothing
                        // else has: past the deadline, or once the pod is
                        // being killed or the Job failed, a step that ends
                        // before the kill reaches it is not the tool's own
                        // end, and the watches decide as before.
                        let overtaken = seen.killed
                            || seen.deadline
                            || seen.job_failed.is_some()
                            || started.elapsed() >= req.deadline;
                        if !overtaken {
                            stages.mark("end_logged");
                            ended_log = Some(log);
                            break Ok((Some(i32::from(code)), Ended::Exited));
                        }
                    }
                    None => break Err("the watches ended".to_string()),
                },
                _ = &mut give_up => {
                    break match &lost {
                        Some(why) => Err(format!("lost the API server while waiting for the sandbox: {why}")),
                        None => seen.overdue(),
                    };
                }
            }
            if let Some(end) = seen.ended() {
                break end;
            }
        };
        drop(watchers);
        stages.mark("end_seen");
        let (exit_code, ended) = match end {
            Ok(e) => e,
            Err(why) => {
                cleanup.finish().await;
                stages.mark("cleaned_up");
                return Err(SandboxError::Stopped {
                    why,
                    stages: stages.into_marks(),
                });
            }
        };
        // The container's log, split back into stdout and stderr. The
        // Job's watch may report its end before the pod's watch has named
        // the pod (the watches are separate streams): the pod is then
        // looked up by its label, or its output would be lost without a
        // word.
        let pod_name = match seen.pod.clone() {
            Some(p) => Some(p),
            None => pods
                .list(&ListParams::default().labels(&pod_sel))
                .await
                .ok()
                .and_then(|l| l.items.into_iter().find_map(|p| p.metadata.name)),
        };
        let (stdout, stderr) = match (&pod_name, ended_log) {
            (_, Some(log)) => {
                let (o, e) = gateway_runner::protocol::unframe(&log);
                (capped(o, cap), capped(e, cap))
            }
            (Some(pod), None) => {
                let lp = LogParams {
                    container: Some(manifests::CONTAINER.into()),
                    limit_bytes: Some(i64::try_from(log_limit).unwrap_or(i64::MAX)),
                    ..LogParams::default()
                };
                let retry_for = Duration::from_secs(self.cfg.grace_seconds);
                match read_log(&pods, pod, &lp, retry_for).await {
                    Ok(log) => {
                        // A warm pod's log with no ready line is not a
                        // log the runner wrote whole: none of it is taken.
                        let from = if pooled {
                            gateway_runner::protocol::after_ready(&log)
                        } else {
                            Some(0)
                        };
                        match from {
                            Some(from) => {
                                let (o, e) = gateway_runner::protocol::unframe(&log[from..]);
                                (capped(o, cap), capped(e, cap))
                            }
                            None => (
                                Captured::default(),
                                Captured {
                                    bytes: b"(the warm sandbox's log has no ready line: its output is not taken)".to_vec(),
                                    truncated: false,
                                },
                            ),
                        }
                    }
                    Err(e) => (
                        Captured::default(),
                        Captured {
                            bytes: format!(
                                "(the sandbox's log could not be read: {})",
                                describe(&e)
                            )
                            .into_bytes(),
                            truncated: false,
                        },
                    ),
                }
            }
            (None, None) => (Captured::default(), Captured::default()),
        };
        stages.mark("logs_read");
        // Files out: the working dir is on the workspace PVC, which the
        // gateway mounts at the same path; read as hostile input.
        let files_out = match &req.workdir {
            Some(w) => {
                match crate::beneath::read_files_out(w, &req.files_out, req.limits.file_out_bytes) {
                    Ok(f) => f,
                    Err(e) => {
                        cleanup.finish().await;
                        return Err(e.into());
                    }
                }
            }
            None => BTreeMap::new(),
        };
        cleanup.finish().await;
        stages.mark("cleaned_up");
        let mut endpoints = BTreeMap::new();
        if let Network::Endpoints(list) = &req.network {
            for e in list {
                if let Some(ip) = self.cfg.endpoint_addresses.get(&e.name) {
                    endpoints.insert(e.name.clone(), format!("{ip}:{}", e.port));
                }
            }
        }
        Ok(SandboxResult {
            name: req.name,
            exit_code,
            stdout,
            stderr,
            files_out,
            duration_ms: started.elapsed().as_millis(),
            ended,
            endpoints,
            stages: stages.into_marks(),
        })
    }
}

/// Whether the pod's container has started (running or ended): its log
/// can be read from then on.
fn container_started(pod: &Pod) -> bool {
    pod.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .any(|cs| {
            cs.name == manifests::CONTAINER
                && cs
                    .state
                    .as_ref()
                    .is_some_and(|s| s.running.is_some() || s.terminated.is_some())
        })
}

/// The steps a pod's updates show: placed on a node, its container
/// running, its container ended (as the kubelet reports them).
fn pod_stages(pod: &Pod, stages: &mut crate::Stages) {
    if pod
        .spec
        .as_ref()
        .is_some_and(|s| s.node_name.as_deref().is_some_and(|n| !n.is_empty()))
    {
        stages.mark("scheduled");
    }
    for cs in pod
        .status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
    {
        if cs.name != manifests::CONTAINER {
            continue;
        }
        match &cs.state {
            Some(s) if s.running.is_some() => stages.mark("container_running"),
            Some(s) if let Some(t) = &s.terminated => {
                // A container the runtime could not start ends with no
                // start (or the zero time): it never ran.
                let ran = !matches!(
                    t.reason.as_deref(),
                    Some("StartError" | "ContainerCannotRun")
                ) && t.started_at.as_ref().is_some_and(|at| at.0.as_second() > 0);
                if ran {
                    stages.mark("container_running");
                }
                stages.mark("container_ended");
            }
            _ => {}
        }
    }
}

impl Sandbox for KubernetesSandbox {
    fn run(&self, req: SandboxRequest) -> RunFuture<'_> {
        Box::pin(self.run_inner(req))
    }

    fn backend(&self) -> &'static str {
        "kubernetes"
    }

    fn uses_host_tools(&self) -> bool {
        false
    }

    fn terraform_provider_mirror(&self) -> Option<String> {
        self.cfg.provider_mirror.clone()
    }

    /// On the workspace PVC (sandboxes mount their working dir from it),
    /// in a dir of the gateway's that no policy lets an agent name.
    fn scratch_dir(&self) -> std::path::PathBuf {
        self.cfg.workspace_root.join(".gateway-scratch")
    }

    /// The kubelet gives the PVC the sandboxes' fsGroup, group-writable,
    /// on every mount.
    fn scratch_group_writable(&self) -> bool {
        true
    }
}
