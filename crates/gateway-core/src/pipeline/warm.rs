//! Warm upstream MCP servers: a stdio server declared `warm: true` is kept
//! running between calls, in one long-lived sandbox of its own
//! ([`gateway_sandbox::Sandbox::start_session`]), where the step runner
//! (`gateway-runner serve`) makes each call as a cold sandbox's runner
//! does: the tool's live definition compared with the locked one first,
//! the result capped in bytes and time. What it saves is the sandbox's
//! and the server's start (hundreds of milliseconds) on every call.
//!
//! What it costs, and why it is only for servers that are handed no
//! credential: the server sees every call made through it while it lives,
//! whoever makes them, and keeps what it likes between them. So:
//! - a warm server never gets a per-call credential (upstreams.rego and
//!   [`crate::tools::upstream::Server::check`] refuse the declaration);
//! - one call at a time: a call that finds the server busy gets a cold
//!   sandbox of its own (no agent can hold the others up by keeping the
//!   warm one busy);
//! - a server over a call's byte cap, late, gone or speaking garbage is
//!   stopped and not trusted with another call; the next call starts a
//!   new one;
//! - the sandbox lives at most [`LIFETIME`] and [`MAX_CALLS`] calls, and
//!   is replaced whenever what the decision makes of it changes (limits,
//!   network, paths, environment, command);
//! - on a backend that runs no long-lived sandbox (kubernetes), every call
//!   gets a cold sandbox, as if the server were not warm.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use gateway_runner::protocol::{McpReport, ServeLine, ServeRequest};
use gateway_sandbox::SandboxSession;

/// The longest a warm sandbox lives.
pub const LIFETIME: Duration = Duration::from_secs(600);
/// The most calls a warm sandbox serves.
pub const MAX_CALLS: u64 = 10_000;
/// Time allowed past a call's own timeout for the runner to report it.
const REPORT_GRACE: Duration = Duration::from_secs(5);

/// One upstream's warm sandbox, or none.
pub(crate) type Slot = Arc<tokio::sync::Mutex<Option<Warm>>>;

/// The warm sandboxes, by upstream.
#[derive(Default)]
pub struct WarmUpstreams {
    slots: Mutex<HashMap<String, Slot>>,
    /// Raised by [`WarmUpstreams::stop_all`]: a sandbox busy then is not
    /// put back after its call.
    generation: std::sync::atomic::AtomicU64,
}

impl WarmUpstreams {
    /// The upstream's slot (made on first use).
    pub(crate) fn slot(&self, upstream: &str) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(slots.entry(upstream.to_string()).or_default())
    }

    /// How many warm sandboxes are running now.
    pub fn running(&self) -> usize {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots
            .values()
            .filter(|s| {
                s.try_lock()
                    .map(|w| w.as_ref().is_some_and(|w| w.session.alive()))
                    .unwrap_or(true)
            })
            .count()
    }

    /// Stop every warm sandbox (one busy with a call stops when the call
    /// ends: it is not put back).
    pub fn stop_all(&self) {
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        for s in slots.values() {
            if let Ok(mut w) = s.try_lock() {
                w.take();
            }
        }
    }

    /// Stop the upstream's warm sandbox, if it has one and it is idle (a
    /// call found the upstream no longer declared warm).
    pub fn retire(&self, upstream: &str) {
        let slot = {
            let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            slots.get(upstream).cloned()
        };
        if let Some(slot) = slot
            && let Ok(mut w) = slot.try_lock()
        {
            w.take();
        }
    }

    /// Stop the warm sandbox of every upstream not in `warm` (the policy
    /// in force no longer declares it, or no longer warm): an operator who
    /// removes a server expects it gone, not serving until its lifetime
    /// ends. One busy with a call stops when the call ends.
    pub fn keep_only(&self, warm: &std::collections::BTreeSet<String>) {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        for (name, s) in slots.iter().filter(|(name, _)| !warm.contains(*name)) {
            match s.try_lock() {
                Ok(mut w) => {
                    if w.take().is_some() {
                        tracing::info!(
                            upstream = %name,
                            "its warm sandbox is stopped: the policy no longer declares it warm"
                        );
                    }
                }
                // Busy: not put back after its call.
                Err(_) => {
                    self.generation
                        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        }
    }

    /// The current generation ([`WarmUpstreams::stop_all`]).
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A running warm sandbox.
pub(crate) struct Warm {
    /// What it was started from; another call's differing key replaces it.
    pub key: String,
    pub session: SandboxSession,
    output: BufReader<Box<dyn tokio::io::AsyncRead + Send + Unpin>>,
    input: Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
    started: Instant,
    pub calls: u64,
}

/// Why a warm call got no report: the sandbox is stopped.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Broken(pub String);

impl Warm {
    pub fn new(key: String, mut session: SandboxSession) -> Warm {
        let output: Box<dyn tokio::io::AsyncRead + Send + Unpin> =
            std::mem::replace(&mut session.output, Box::new(tokio::io::empty()));
        let input: Box<dyn tokio::io::AsyncWrite + Send + Unpin> =
            std::mem::replace(&mut session.input, Box::new(tokio::io::sink()));
        Warm {
            key,
            session,
            output: BufReader::new(output),
            input,
            started: Instant::now(),
            calls: 0,
        }
    }

    /// Whether it may take another call made from `key`, one that may
    /// last `call_time`: it must outlive the call.
    pub fn usable(&self, key: &str, call_time: Duration) -> bool {
        self.key == key
            && self.session.alive()
            && self.calls < MAX_CALLS
            && self
                .started
                .elapsed()
                .saturating_add(call_time)
                .saturating_add(REPORT_GRACE)
                < LIFETIME
    }

    /// One call: the request written, progress lines handed to
    /// `on_progress` as they come, the report returned. Lines are read at
    /// most `line_cap` bytes each; anything but a progress or report line,
    /// a line over the cap, or no report within the call's time breaks
    /// the sandbox (the caller drops it).
    pub async fn call(
        &mut self,
        req: &ServeRequest,
        line_cap: usize,
        on_progress: &(dyn Fn(&serde_json::Value) + Send + Sync),
    ) -> Result<McpReport, Broken> {
        self.calls += 1;
        // The runner writes nothing between calls: a line already waiting
        // would be taken for this call's.
        if !self.output.buffer().is_empty() {
            return Err(Broken("the warm sandbox wrote between two calls".into()));
        }
        let mut line = serde_json::to_vec(req).map_err(|e| Broken(e.to_string()))?;
        line.push(b'\n');
        let timeout = Duration::from_millis(req.timeout_ms).saturating_add(REPORT_GRACE);
        let exchange = async {
            self.input
                .write_all(&line)
                .await
                .map_err(|e| Broken(format!("the warm sandbox does not take the call: {e}")))?;
            self.input
                .flush()
                .await
                .map_err(|e| Broken(format!("the warm sandbox does not take the call: {e}")))?;
            loop {
                let mut got = Vec::new();
                let n = (&mut self.output)
                    .take(
                        u64::try_from(line_cap)
                            .unwrap_or(u64::MAX)
                            .saturating_add(1),
                    )
                    .read_until(b'\n', &mut got)
                    .await
                    .map_err(|e| Broken(format!("reading the warm sandbox failed: {e}")))?;
                if n == 0 {
                    return Err(Broken(
                        "the warm sandbox ended before it reported the call".into(),
                    ));
                }
                if got.len() > line_cap {
                    return Err(Broken(format!(
                        "the warm sandbox wrote a line of more than {line_cap} bytes (sandbox.rego output_bytes)"
                    )));
                }
                match serde_json::from_slice::<ServeLine>(&got) {
                    Ok(ServeLine::Progress(p)) => on_progress(&p),
                    Ok(ServeLine::Report(r)) => return Ok(*r),
                    Err(e) => {
                        return Err(Broken(format!(
                            "the warm sandbox wrote a line that is not its runner's: {}",
                            gateway_base::text::escaped(&e.to_string(), true)
                        )));
                    }
                }
            }
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err(Broken(format!(
                "the warm sandbox did not report the call within {} s",
                timeout.as_secs()
            ))),
        }
    }
}

/// What a warm sandbox is started from, as one key: another call whose
/// decision makes a different sandbox gets a new one.
pub(crate) fn key(req: &gateway_sandbox::SandboxRequest) -> String {
    let mut text = format!(
        "{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n",
        req.argv, req.env, req.binds, req.network, req.limits, req.deadline
    );
    for f in &req.files_in {
        text.push_str(&f.path);
        text.push('\n');
        text.push_str(&gateway_base::canonical::sha256_hex(&f.contents));
        text.push('\n');
    }
    gateway_base::canonical::sha256_hex(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A warm sandbox whose stop the test can watch.
    fn warm(name: &str) -> (Warm, tokio::sync::oneshot::Receiver<()>) {
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let session = SandboxSession {
            name: name.into(),
            input: Box::new(tokio::io::sink()),
            output: Box::new(tokio::io::empty()),
            alive: Arc::new(std::sync::atomic::AtomicBool::new(true)),
            stop: Some(stop),
            ended: None,
        };
        (Warm::new(name.into(), session), stopped)
    }

    #[tokio::test]
    async fn an_upstream_no_longer_declared_warm_loses_its_sandbox_and_a_busy_one_is_not_put_back()
    {
        let w = WarmUpstreams::default();
        let (a, mut a_stop) = warm("a");
        let (b, mut b_stop) = warm("b");
        *w.slot("a").lock().await = Some(a);
        *w.slot("b").lock().await = Some(b);
        let busy = w.slot("c");
        let held = busy.lock().await;
        let generation = w.generation();

        w.keep_only(&["a".to_string()].into_iter().collect());
        // b is stopped (its session dropped), a still runs.
        assert!(matches!(
            b_stop.try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Closed)
        ));
        assert!(matches!(
            a_stop.try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Empty)
        ));
        assert!(w.slot("b").lock().await.is_none());
        assert!(w.slot("a").lock().await.is_some());
        // c was busy: the call holding it sees another generation and
        // does not put it back.
        assert_ne!(w.generation(), generation);
        drop(held);
        assert_eq!(w.running(), 1);
    }
}
