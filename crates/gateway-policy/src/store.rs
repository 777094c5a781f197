//! The active policy set, hot-reloaded.
//!
//! A [`PolicyStore`] holds the last good [`PolicySet`] behind an `Arc` that
//! is swapped atomically: a request takes the `Arc` once and decides with
//! that whole set, whatever happens to the files meanwhile. A watcher thread
//! polls the policy directory (content fingerprint, every 250 ms by default)
//! and reloads when anything changed: an edited, added or removed file —
//! but only once the changed content has been the same at two polls in a
//! row, so that a file caught half written by an editor or a copy is never
//! loaded (it parses as often as not: YAML cut at a line end is YAML). A
//! broken edit never replaces a good set; it is reported through the event
//! callback (stderr and audit `policy.reload_failed`). If no good set was
//! ever loaded, every decision is a deny whose reason is the load error.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::bundle::BundleSource;
use super::loader::Sources;
use super::set::{Evaluation, LoadOptions, PolicySet};
use super::{Decision, DecisionInput, PolicyError};

/// What the store reports about (re)loads.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyEvent {
    /// A new policy set is active (`signed`: the key and revision of the
    /// bundle it came from).
    Reloaded {
        fingerprint: String,
        files: usize,
        signed: Option<super::bundle::Verified>,
    },
    /// A changed policy set failed to load; the previous one stays active
    /// (or, if none ever loaded, every call stays denied).
    ReloadFailed {
        error: String,
        active: Option<String>,
    },
}

enum Active {
    Ready(Arc<PolicySet>),
    Broken(String),
}

/// How often the watcher looks at the policy files by default: edits take
/// effect within two of these intervals (the change, then the same content
/// again) plus the (millisecond) reload.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// The loading of a policy set, done only when its fingerprint changed.
type LoadLater<'a> = Box<dyn FnOnce() -> Result<Sources, PolicyError> + 'a>;

/// Where a store's policy set comes from.
#[derive(Debug, Clone)]
pub enum Origin {
    /// Policy dirs, read as they are: an edit is taken once it has stayed
    /// the same for two polls (deploy by rename for a whole set at once).
    Dirs(Vec<PathBuf>),
    /// A signed bundle: loaded only when its signature and every file's
    /// digest verify, so that a half-written or tampered one never is.
    Bundle(Arc<BundleSource>),
}

pub struct PolicyStore {
    origin: Origin,
    opts: LoadOptions,
    active: RwLock<Arc<Active>>,
    /// Fingerprint of the files last attempted (good or broken), so a broken
    /// edit is reported once, not at every poll.
    last_seen: RwLock<Option<String>>,
    /// A changed fingerprint seen at the last poll, not loaded yet: the
    /// change is taken when the next poll sees the same.
    settling: std::sync::Mutex<Option<String>>,
    /// Counts the swaps of the active set, for whoever shows something the
    /// policy decides (the MCP server's `list_changed`).
    swaps: tokio::sync::watch::Sender<u64>,
}

impl std::fmt::Debug for PolicyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyStore")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl PolicyStore {
    /// Load the policy set under `roots`. A failure is not an error here: the
    /// store starts broken and denies every call with the load error.
    pub fn open(roots: Vec<PathBuf>, opts: LoadOptions) -> PolicyStore {
        PolicyStore::open_from(Origin::Dirs(roots), opts)
    }

    /// The policy dirs this store reads (none for a bundle).
    pub fn dirs(&self) -> Vec<PathBuf> {
        match &self.origin {
            Origin::Dirs(d) => d.clone(),
            Origin::Bundle(_) => Vec::new(),
        }
    }

    /// Load the policy set from a signed bundle (the same: a failure leaves
    /// the store broken, denying every call).
    pub fn open_bundle(source: BundleSource, opts: LoadOptions) -> PolicyStore {
        PolicyStore::open_from(Origin::Bundle(Arc::new(source)), opts)
    }

    fn open_from(origin: Origin, opts: LoadOptions) -> PolicyStore {
        let store = PolicyStore {
            origin,
            opts,
            active: RwLock::new(Arc::new(Active::Broken("policy set not loaded yet".into()))),
            last_seen: RwLock::new(None),
            settling: std::sync::Mutex::new(None),
            swaps: tokio::sync::watch::Sender::new(0),
        };
        store.reload();
        store
    }

    /// The active set, or the error that keeps every call denied.
    pub fn current(&self) -> Result<Arc<PolicySet>, String> {
        let active = self
            .active
            .read()
            .map(|a| Arc::clone(&a))
            .unwrap_or_else(|p| Arc::clone(&p.into_inner()));
        match active.as_ref() {
            Active::Ready(set) => Ok(Arc::clone(set)),
            Active::Broken(e) => Err(e.clone()),
        }
    }

    /// Decide with the active set (fail closed when there is none).
    pub fn decide(&self, input: &DecisionInput) -> Evaluation {
        match self.current() {
            Ok(set) => set.decide(input),
            Err(e) => {
                let msg = format!("no usable policy set: {e}");
                Evaluation {
                    decision: Decision::fail_closed(msg.clone()),
                    error: Some(msg),
                    elapsed: Duration::ZERO,
                    policy: String::new(),
                }
            }
        }
    }

    /// Every root passes the daemon's trust check (when it makes one).
    fn check_trust(&self, roots: &[PathBuf]) -> Result<(), PolicyError> {
        if let Some(t) = &self.opts.trust {
            for root in roots {
                t.check_tree("policy dir", root)?;
            }
        }
        Ok(())
    }

    /// Where the set comes from.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// What to load now, with its fingerprint; whether a change must
    /// settle first (dirs) or is taken at once (a bundle, whose signature
    /// makes a half-written one fail).
    fn read(&self) -> (String, LoadLater<'_>, bool) {
        match &self.origin {
            Origin::Dirs(roots) => {
                let sources = self.check_trust(roots).and_then(|()| Sources::read(roots));
                // An unreadable directory is fingerprinted by its error, so
                // that it too is reported once rather than at every poll.
                let fingerprint = match &sources {
                    Ok(s) => s.fingerprint(),
                    Err(e) => format!("unreadable: {e}"),
                };
                (fingerprint, Box::new(move || sources), true)
            }
            Origin::Bundle(b) => {
                let name = b.name();
                let bad = move |error| PolicyError::Bundle {
                    source_name: b.name(),
                    error,
                };
                let trusted = match (&b.location, &self.opts.trust) {
                    (super::bundle::Location::File(p), Some(t)) => {
                        t.check_path("policy bundle", p).map_err(PolicyError::from)
                    }
                    _ => Ok(()),
                };
                let fetched = trusted.and_then(|()| b.fetch().map_err(&bad));
                let fingerprint = match &fetched {
                    Ok(bytes) => format!("bundle {}", gateway_base::canonical::sha256_hex(bytes)),
                    Err(e) => format!("unreadable: {e}"),
                };
                let load = move || {
                    let bytes = fetched?;
                    let (files, verified) = b.open(&bytes).map_err(bad)?;
                    tracing::info!(
                        bundle = %name,
                        key = %verified.key_id,
                        revision = verified.revision.as_deref().unwrap_or(""),
                        "policy bundle verified"
                    );
                    let mut sources = Sources::from_bundle("bundle", &files)?;
                    sources.signed = Some(verified);
                    Ok(sources)
                };
                (fingerprint, Box::new(load), false)
            }
        }
    }

    /// Reload now if the files changed since the last attempt. Returns what
    /// happened, or `None` when nothing changed.
    pub fn reload(&self) -> Option<PolicyEvent> {
        self.load_if_changed(false)
    }

    /// What the watcher does at each poll: like [`PolicyStore::reload`], but a
    /// change is taken only when the previous poll saw the same content.
    pub fn poll(&self) -> Option<PolicyEvent> {
        self.load_if_changed(true)
    }

    fn load_if_changed(&self, settle: bool) -> Option<PolicyEvent> {
        let (fingerprint, sources, settles) = self.read();
        let settle = settle && settles;
        let fingerprint = Some(fingerprint);
        {
            let seen = self.last_seen.read().map(|s| s.clone()).unwrap_or(None);
            let mut settling = self.settling.lock().unwrap_or_else(|p| p.into_inner());
            if seen == fingerprint {
                *settling = None;
                return None;
            }
            if settle && *settling != fingerprint {
                // Changed since the last poll: wait for it to stay put.
                *settling = fingerprint;
                return None;
            }
            *settling = None;
        }
        if let Ok(mut seen) = self.last_seen.write() {
            *seen = fingerprint;
        }
        let loaded = sources().and_then(|s| {
            if s.rego_count() == 0 {
                Err(PolicyError::Empty(match &self.origin {
                    Origin::Dirs(roots) => roots.first().cloned().unwrap_or_default(),
                    Origin::Bundle(b) => PathBuf::from(b.name()),
                }))
            } else {
                PolicySet::from_sources(&s, &self.opts)
            }
        });
        let event = match loaded {
            Ok(set) => {
                let ev = PolicyEvent::Reloaded {
                    fingerprint: set.fingerprint.clone(),
                    files: set.files.len(),
                    signed: set.signed.clone(),
                };
                self.swap(Active::Ready(Arc::new(set)));
                ev
            }
            Err(e) => {
                let error = e.to_string();
                let active = self.current().ok().map(|s| s.fingerprint.clone());
                if active.is_none() {
                    self.swap(Active::Broken(error.clone()));
                }
                PolicyEvent::ReloadFailed { error, active }
            }
        };
        Some(event)
    }

    fn swap(&self, next: Active) {
        let next = Arc::new(next);
        match self.active.write() {
            Ok(mut a) => *a = next,
            Err(p) => *p.into_inner() = next,
        }
        self.swaps.send_modify(|n| *n += 1);
    }

    /// Changes each time another set (or a load error) becomes active.
    pub fn swaps(&self) -> tokio::sync::watch::Receiver<u64> {
        self.swaps.subscribe()
    }

    /// Watch the policy files and reload on change, calling `on_event` for
    /// each reload or failure. The watcher stops when the handle is dropped.
    pub fn watch(
        self: &Arc<Self>,
        interval: Duration,
        on_event: impl Fn(&PolicyEvent) + Send + 'static,
    ) -> WatchHandle {
        let stop = Arc::new(AtomicBool::new(false));
        let weak = Arc::downgrade(self);
        let stop2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("policy-watch".into())
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    let until = Instant::now() + interval;
                    while Instant::now() < until && !stop2.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(20).min(interval));
                    }
                    let Some(store) = weak.upgrade() else { break };
                    if let Some(ev) = store.poll() {
                        on_event(&ev);
                    }
                }
            })
            .ok();
        WatchHandle { stop, thread }
    }
}

/// Stops the watcher thread when dropped.
#[derive(Debug)]
pub struct WatchHandle {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Print reload events to stderr through tracing (the audit log is wired in
/// by the server).
pub fn log_event(ev: &PolicyEvent) {
    match ev {
        PolicyEvent::Reloaded {
            fingerprint, files, ..
        } => {
            tracing::info!(event = "policy.reloaded", fingerprint = %fingerprint, files, "policy set reloaded");
        }
        PolicyEvent::ReloadFailed { error, active } => {
            tracing::error!(
                event = "policy.reload_failed",
                active = active.as_deref().unwrap_or("none: every call is denied"),
                "policy reload failed, keeping the last good set: {error}"
            );
        }
    }
}
