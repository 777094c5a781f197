//! The warm pool (`sandbox.kubernetes.warm_pool`, README: "Warm
//! sandboxes"): pods started before their call, so that a call does not
//! wait for a pod to start and for its network to be shown locked down.
//!
//! - A pool is kept per shape of call ([`manifests::warm_job`]: the pod a
//!   call would get, without its files and credential). A shape is learnt
//!   from a call: the first call of a shape runs cold, and from then on
//!   `warm_pool` pods of it are kept until no call of it has come for
//!   `warm_pool_idle_seconds`.
//! - A warm pod runs `gateway-runner pooled`: it shows the network locked
//!   down (the egress canary), then writes its ready line. Only then is it
//!   offered; until then, and while it waits, it holds no credential and
//!   has run nothing but the runner.
//! - A call takes one pod (under the pool's lock: never two calls), marks
//!   its Job claimed and gives it the call's deadline, then writes the
//!   call's files and credential to its stdin (`pods/attach`). The pod
//!   runs that one call and ends; it is deleted as a cold one is. A pod
//!   that fails to be claimed before anything was written to it is
//!   deleted and the call runs cold.
//! - A warm pod that ends or is deleted while it waits (its idle deadline,
//!   a drain, an eviction) is dropped and replaced; a shape whose pods keep
//!   failing to become ready is not refilled for a while.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, LogParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};

use super::{KubernetesSandbox, SandboxRequest, container_started, describe, manifests};

/// A warm pod, ready for one call.
pub(super) struct Warm {
    /// Its Job.
    pub job: String,
    /// The request label its pod carries (`pool-…`).
    pub request: String,
    /// Its pod.
    pub pod: String,
    /// When its Job was made (its idle deadline counts from about then).
    pub made: Instant,
    /// The task that drops it when it ends while it waits.
    watch: tokio::task::JoinHandle<()>,
}

/// One shape's pool.
struct Shape {
    /// A call of this shape without its files and credential: what each
    /// new warm pod is made from.
    shell: SandboxRequest,
    ready: Vec<Warm>,
    starting: usize,
    /// The last call of this shape.
    used: Instant,
    /// Warm pods of this shape that failed in a row, and when the last did.
    failures: u32,
    failed_at: Option<Instant>,
    /// Ready pods of this shape that could not be claimed, in a row.
    refused: u32,
    /// Warm Jobs seen to end before they were offered: never offered.
    dead: std::collections::HashSet<String>,
}

/// How many warm pods of a shape may fail to start, or to be claimed, in
/// a row before it is left alone for [`FAILURE_PAUSE`].
const FAILURES_BEFORE_PAUSE: u32 = 3;
const FAILURE_PAUSE: Duration = Duration::from_secs(60);
/// A warm pod this close to its idle deadline is not offered (the Job
/// controller could end it while it is being claimed).
const DEADLINE_MARGIN: Duration = Duration::from_secs(30);

pub(super) struct Pool {
    size: usize,
    idle: Duration,
    /// How long a warm pod may take to become ready.
    ready_wait: Duration,
    shapes: Mutex<HashMap<String, Shape>>,
    /// Set at shutdown: no warm pod is made or kept from then on.
    closed: std::sync::atomic::AtomicBool,
    /// Warm Jobs being created now, and a wake-up when that changes: the
    /// close waits for them.
    creating: std::sync::atomic::AtomicUsize,
    created: tokio::sync::Notify,
    /// Warm Jobs created and not yet offered (their pod starting, its gate
    /// not passed): the close deletes them too, since the task that made
    /// one may not outlive the process (a `gateway verify` that ends).
    starting: Mutex<std::collections::HashSet<String>>,
}

/// How long a warm pod may take to become ready: its start and its gate.
pub(super) fn ready_wait(cfg: &manifests::KubeSandboxConfig) -> Duration {
    Duration::from_secs(cfg.lockdown_seconds + cfg.grace_seconds + 60)
}

/// The most shapes the pool keeps pods for: `warm_pool` pods each. A
/// policy whose decisions make a new pod for new parameters could
/// otherwise have an agent start pods without bound.
const MAX_SHAPES: usize = 8;

impl Pool {
    pub fn new(size: usize, idle: Duration, ready_wait: Duration) -> Pool {
        Pool {
            size,
            // A pod that took the whole wait to be ready is still worth
            // offering.
            idle: idle.max(ready_wait + DEADLINE_MARGIN * 2),
            ready_wait,
            shapes: Mutex::new(HashMap::new()),
            closed: std::sync::atomic::AtomicBool::new(false),
            creating: std::sync::atomic::AtomicUsize::new(0),
            created: tokio::sync::Notify::new(),
            starting: Mutex::new(std::collections::HashSet::new()),
        }
    }

    /// Make and keep no more warm pods; wait (up to 10 s) for the Jobs
    /// being created to be created and deleted again; the names of the
    /// ones that are ready or still starting are given back to be deleted
    /// (the daemon also deletes every Job of this gateway at shutdown).
    pub async fn close(&self) -> Vec<String> {
        use std::sync::atomic::Ordering;
        self.closed.store(true, Ordering::SeqCst);
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                // Registered before the count is read, so a create that
                // ends in between still wakes it.
                let woken = self.created.notified();
                tokio::pin!(woken);
                woken.as_mut().enable();
                if self.creating.load(Ordering::SeqCst) == 0 {
                    return;
                }
                woken.await;
            }
        })
        .await;
        let mut all = Vec::new();
        {
            let mut shapes = self.lock();
            for shape in shapes.values_mut() {
                for w in shape.ready.drain(..) {
                    w.watch.abort();
                    all.push(w.job);
                }
            }
        }
        all.extend(
            self.starting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .drain(),
        );
        all
    }

    /// A warm Job was created (`true`) or ended its start (`false`).
    fn starting(&self, job: &str, yes: bool) {
        let mut s = self.starting.lock().unwrap_or_else(|p| p.into_inner());
        if yes {
            s.insert(job.to_string());
        } else {
            s.remove(job);
        }
    }

    fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn idle_seconds(&self) -> u64 {
        self.idle.as_secs()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Shape>> {
        self.shapes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A ready pod of shape `key`, taken out of the pool: the newest one
    /// not near its idle deadline (older ones are dropped).
    pub fn take(&self, key: &str) -> (Option<Warm>, Vec<Warm>) {
        let mut shapes = self.lock();
        let Some(shape) = shapes.get_mut(key) else {
            return (None, Vec::new());
        };
        let mut stale = Vec::new();
        while let Some(w) = shape.ready.pop() {
            w.watch.abort();
            if w.made.elapsed() + DEADLINE_MARGIN < self.idle {
                return (Some(w), stale);
            }
            stale.push(w);
        }
        (None, stale)
    }

    /// Note a call of shape `key`; how many warm pods to start for it now.
    fn want(&self, key: &str, shell: SandboxRequest) -> usize {
        if self.is_closed() {
            return 0;
        }
        let mut shapes = self.lock();
        // Shapes gone idle with nothing left of them are forgotten.
        shapes
            .retain(|_, s| s.used.elapsed() <= self.idle || !s.ready.is_empty() || s.starting > 0);
        if !shapes.contains_key(key) && shapes.len() >= MAX_SHAPES {
            tracing::warn!(
                "the warm pool already keeps pods for {MAX_SHAPES} kinds of call; this one runs cold"
            );
            return 0;
        }
        let shape = shapes.entry(key.to_string()).or_insert_with(|| Shape {
            shell,
            ready: Vec::new(),
            starting: 0,
            used: Instant::now(),
            failures: 0,
            failed_at: None,
            refused: 0,
            dead: std::collections::HashSet::new(),
        });
        shape.used = Instant::now();
        self.need(shape)
    }

    /// How many more pods `shape` needs, counted as starting.
    fn need(&self, shape: &mut Shape) -> usize {
        let paused = shape.failures.max(shape.refused) >= FAILURES_BEFORE_PAUSE
            && shape.failed_at.is_some_and(|t| t.elapsed() < FAILURE_PAUSE);
        if paused || shape.used.elapsed() > self.idle || self.is_closed() {
            return 0;
        }
        let need = self.size.saturating_sub(shape.ready.len() + shape.starting);
        shape.starting += need;
        need
    }

    /// A pod of `key` that was starting is ready (`Some`) or failed
    /// (`None`). A ready pod is kept unless its shape has gone idle; `Err`
    /// gives it back to be deleted.
    fn started(&self, key: &str, warm: Option<Warm>) -> Result<(), Warm> {
        let mut shapes = self.lock();
        let Some(shape) = shapes.get_mut(key) else {
            return warm.map_or(Ok(()), Err);
        };
        shape.starting = shape.starting.saturating_sub(1);
        let dead = warm.as_ref().is_some_and(|w| shape.dead.remove(&w.job));
        match warm {
            // Too close to its idle deadline to be offered: a failure.
            Some(w) if w.made.elapsed() + DEADLINE_MARGIN >= self.idle => {
                shape.failures += 1;
                shape.failed_at = Some(Instant::now());
                Err(w)
            }
            Some(w) if shape.used.elapsed() <= self.idle && !dead && !self.is_closed() => {
                shape.failures = 0;
                shape.ready.push(w);
                Ok(())
            }
            Some(w) => Err(w),
            None => {
                shape.failures += 1;
                shape.failed_at = Some(Instant::now());
                Ok(())
            }
        }
    }

    /// A pod of `key` could not be claimed: counted as one that failed to
    /// start, so that a cluster that refuses every claim (no `pods/attach`)
    /// does not have warm pods made and deleted for every call.
    pub fn failed(&self, key: &str) {
        if let Some(shape) = self.lock().get_mut(key) {
            shape.refused += 1;
            shape.failed_at = Some(Instant::now());
        }
    }

    /// A pod of `key` was claimed.
    pub fn claimed(&self, key: &str) {
        if let Some(shape) = self.lock().get_mut(key) {
            shape.refused = 0;
        }
    }

    /// A waiting pod ended: drop it from its shape; how many to start in
    /// its place.
    fn gone(&self, key: &str, job: &str) -> usize {
        let mut shapes = self.lock();
        let Some(shape) = shapes.get_mut(key) else {
            return 0;
        };
        let before = shape.ready.len();
        shape.ready.retain(|w| w.job != job);
        if shape.ready.len() == before {
            // Taken by a call meanwhile (the call replaces it), or not
            // offered yet: then it never is.
            shape.dead.insert(job.to_string());
            return 0;
        }
        self.need(shape)
    }
}

/// A fresh name for a warm pod's request label (and so its Job).
fn fresh_id() -> String {
    let mut r = [0u8; 6];
    if getrandom::fill(&mut r).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        r.copy_from_slice(&nanos.to_le_bytes()[..6]);
    }
    format!("pool-{}", hex::encode(r))
}

impl KubernetesSandbox {
    /// Note a call of shape `key` and start the warm pods it needs.
    pub(super) fn refill(&self, key: &str, shell: SandboxRequest) {
        let Some(pool) = &self.pool else { return };
        let n = pool.want(key, shell);
        self.start_warm(key, n);
    }

    fn start_warm(&self, key: &str, n: usize) {
        for _ in 0..n {
            let (sb, key) = (self.clone(), key.to_string());
            tokio::spawn(async move { sb.warm_up(key).await });
        }
    }

    /// Make one warm pod of shape `key` and offer it once it is ready.
    async fn warm_up(self, key: String) {
        let Some(pool) = self.pool.clone() else {
            return;
        };
        if pool.is_closed() {
            let _ = pool.started(&key, None);
            return;
        }
        let shell = match pool.lock().get(&key) {
            Some(s) => s.shell.clone(),
            None => return,
        };
        let id = fresh_id();
        let job = match manifests::warm_job(&self.cfg, &shell, &id, pool.idle_seconds()) {
            Ok((job, _)) => job,
            Err(e) => {
                tracing::warn!("a warm sandbox cannot be made: {e}");
                let _ = pool.started(&key, None);
                return;
            }
        };
        let job_name = job.metadata.name.clone().unwrap_or_default();
        let jobs: kube::Api<Job> = self.api();
        // Counted while it is made, for the close to wait on; checked
        // again after the count is up, so a close either sees it counted
        // or this sees the close.
        use std::sync::atomic::Ordering;
        pool.creating.fetch_add(1, Ordering::SeqCst);
        let created = if pool.is_closed() {
            None
        } else {
            match jobs.create(&PostParams::default(), &job).await {
                Ok(j) => Some(j),
                Err(e) => {
                    tracing::warn!(
                        "a warm sandbox's Job could not be created: {}",
                        describe(&e)
                    );
                    None
                }
            }
        };
        if created.is_some() && pool.is_closed() {
            // Made while the gateway was stopping: not kept.
            self.delete_warm(&job_name).await;
        } else if created.is_some() {
            pool.starting(&job_name, true);
        }
        pool.creating.fetch_sub(1, Ordering::SeqCst);
        pool.created.notify_waiters();
        let Some(created) = created.filter(|_| !pool.is_closed()) else {
            let _ = pool.started(&key, None);
            return;
        };
        // Its deadline counts from about now.
        let made = Instant::now();
        let uid = created.metadata.uid.unwrap_or_default();
        let wait = pool.ready_wait;
        let readied = tokio::time::timeout(wait, self.ready(&id, &job_name, &uid)).await;
        pool.starting(&job_name, false);
        if pool.is_closed() {
            // Closed while it started: the close took its name to delete;
            // deleted here too, in case the close had already gone by.
            let _ = pool.started(&key, None);
            self.delete_warm(&job_name).await;
            return;
        }
        match readied {
            Ok(Ok(pod)) => {
                let watch = tokio::spawn(self.clone().watch_idle(
                    key.clone(),
                    job_name.clone(),
                    id.clone(),
                ));
                let warm = Warm {
                    job: job_name,
                    request: id,
                    pod,
                    made,
                    watch,
                };
                if let Err(w) = pool.started(&key, Some(warm)) {
                    w.watch.abort();
                    self.delete_warm(&w.job).await;
                }
            }
            failed => {
                let why = match failed {
                    Ok(Err(why)) => why,
                    _ => format!("not ready within {} s", wait.as_secs()),
                };
                tracing::warn!(job = job_name, "a warm sandbox failed to start: {why}");
                let _ = pool.started(&key, None);
                self.delete_warm(&job_name).await;
            }
        }
    }

    /// Wait until the pod of warm request `id` has written its ready line
    /// (its network is shown locked down); its name.
    async fn ready(&self, id: &str, job: &str, uid: &str) -> Result<String, String> {
        let pods: kube::Api<Pod> = self.api();
        let selector = format!("{}={id}", manifests::REQUEST);
        let stream = watcher::watcher(pods.clone(), watcher::Config::default().labels(&selector))
            .default_backoff();
        let mut stream = std::pin::pin!(stream);
        let mut unschedulable_said = false;
        let wait_secs = self.pool.as_ref().map_or(0, |p| p.ready_wait.as_secs());
        let pod = loop {
            match stream.next().await {
                Some(Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p))) => {
                    // Only the pod its own Job made.
                    let owned = p.metadata.owner_references.iter().flatten().any(|o| {
                        o.kind == "Job"
                            && o.name == job
                            && o.uid == uid
                            && o.controller == Some(true)
                    });
                    if !owned {
                        continue;
                    }
                    // A pod the scheduler cannot place (a node without
                    // room for the sandbox's requests) is said once, while
                    // it is waited for.
                    if let Some(c) = p
                        .status
                        .as_ref()
                        .and_then(|st| st.conditions.as_ref())
                        .and_then(|cs| {
                            cs.iter()
                                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
                        })
                        && !unschedulable_said
                    {
                        unschedulable_said = true;
                        tracing::warn!(
                            job,
                            "a warm sandbox's pod cannot be scheduled yet ({}: {}); waited for up to {} s",
                            c.reason.as_deref().unwrap_or("Unschedulable"),
                            c.message.as_deref().unwrap_or(""),
                            wait_secs
                        );
                    }
                    let mut seen = super::Seen::default();
                    seen.pod(&p);
                    if let Some(why) = seen.failure.or(seen.pod_failed) {
                        return Err(why);
                    }
                    if seen.terminated.is_some() || seen.killed {
                        return Err("its pod ended before it was ready".into());
                    }
                    if container_started(&p) {
                        break p.metadata.name.unwrap_or_default();
                    }
                }
                Some(Ok(watcher::Event::Delete(_))) => {
                    return Err("its pod was deleted".into());
                }
                Some(_) => {}
                None => return Err("the watch of its pod ended".into()),
            }
        };
        let lp = LogParams {
            container: Some(manifests::CONTAINER.into()),
            follow: true,
            limit_bytes: Some(64 * 1024),
            ..LogParams::default()
        };
        let log = pods
            .log_stream(&pod, &lp)
            .await
            .map_err(|e| format!("its log: {}", describe(&e)))?;
        let mut log = std::pin::pin!(log);
        let mut seen = Vec::new();
        let mut chunk = vec![0u8; 8192];
        loop {
            use futures::AsyncReadExt;
            let n = log
                .read(&mut chunk)
                .await
                .map_err(|e| format!("its log: {e}"))?;
            if n == 0 {
                let (_, said) = gateway_runner::protocol::unframe(&seen);
                return Err(format!(
                    "its runner ended before it was ready: {}",
                    String::from_utf8_lossy(&said).trim()
                ));
            }
            seen.extend_from_slice(&chunk[..n]);
            if gateway_runner::protocol::after_ready(&seen).is_some() {
                return Ok(pod);
            }
        }
    }

    /// While warm pod `id` waits, drop it as soon as it ends or goes.
    async fn watch_idle(self, key: String, job: String, id: String) {
        let pods: kube::Api<Pod> = self.api();
        let selector = format!("{}={id}", manifests::REQUEST);
        let stream =
            watcher::watcher(pods, watcher::Config::default().labels(&selector)).default_backoff();
        let mut stream = std::pin::pin!(stream);
        // Whether the pod was in the latest list (a pod gone before the
        // watch's first list sends no delete).
        let mut listed = false;
        loop {
            let gone = match stream.next().await {
                Some(Ok(watcher::Event::Init)) => {
                    listed = false;
                    false
                }
                Some(Ok(watcher::Event::InitApply(p) | watcher::Event::Apply(p))) => {
                    listed = true;
                    let mut seen = super::Seen::default();
                    seen.pod(&p);
                    seen.killed
                        || seen.terminated.is_some()
                        || seen.pod_failed.is_some()
                        || matches!(seen.phase.as_deref(), Some("Succeeded" | "Failed"))
                }
                Some(Ok(watcher::Event::InitDone)) => !listed,
                Some(Ok(watcher::Event::Delete(_))) | None => true,
                Some(Err(_)) => false,
            };
            if gone {
                break;
            }
        }
        let Some(pool) = self.pool.clone() else {
            return;
        };
        let n = pool.gone(&key, &job);
        if !pool.is_closed() {
            tracing::info!(job, "a warm sandbox ended while it waited; it is replaced");
        }
        self.delete_warm(&job).await;
        self.start_warm(&key, n);
    }

    /// Whether this backend keeps warm pods.
    pub fn has_warm_pool(&self) -> bool {
        self.pool.is_some()
    }

    /// How many warm pods are ready now, of every shape.
    pub fn warm_ready(&self) -> usize {
        self.pool
            .as_ref()
            .map_or(0, |p| p.lock().values().map(|s| s.ready.len()).sum())
    }

    /// At shutdown: make and keep no more warm pods, and delete the ready
    /// ones.
    pub async fn close_pool(&self) {
        let Some(pool) = &self.pool else { return };
        for job in pool.close().await {
            self.delete_warm(&job).await;
        }
    }

    /// Delete a warm Job (its pod goes with it).
    pub(super) async fn delete_warm(&self, job: &str) {
        let jobs: kube::Api<Job> = self.api();
        if let Err(e) = jobs.delete(job, &DeleteParams::background()).await
            && !matches!(&e, kube::Error::Api(s) if s.code == 404)
        {
            tracing::warn!(
                job,
                "could not delete a warm sandbox ({}); it is removed at the next start or at its idle deadline",
                describe(&e)
            );
        }
    }
}
