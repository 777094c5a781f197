//! What a platform team watches (README.md: "Watching it"): Prometheus
//! metrics and OpenTelemetry traces of the calls.
//!
//! One hook per place, below every other part: a stage of a call is timed
//! with [`stage`] (a guard: on drop it observes the stage's histogram and
//! ends the stage's span, a child of the call's span), a call is opened
//! and closed with [`CallSpan`], and every audit append reports itself with
//! [`audit_appended`], from which the counters of approvals, credentials,
//! sandboxes and policy reloads are derived (the audit already records each
//! of those once, at the place it happens). Nothing here decides anything,
//! and nothing here ever fails a call: a metric or a span that cannot be
//! made is not made.
//!
//! Labels are bounded: a tool is named only when the policy's catalog has
//! it (else `other`), decisions and outcomes are fixed words, events are
//! the audit's own names. No request id, user or argument is ever a label
//! or a span attribute beyond the request id on spans (a trace is looked up
//! by it).

pub mod metrics;
pub mod trace;

use std::time::Instant;

pub use metrics::{Metrics, metrics};
pub use trace::{CallSpan, TraceParent};

/// The stages a call's time is split into (the `stage` label, and the
/// span names under `gateway.call`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Whether the call may start now (data.gateway.calls).
    Admission,
    /// One policy decision (a Terraform call has two: request, plan).
    Decision,
    /// From an approval's request to the verdict a call spent.
    ApprovalWait,
    /// The credential minted for one sandbox.
    CredentialMint,
    /// Its revocation.
    CredentialRevoke,
    /// A sandbox from its request to its end (start, the steps, teardown).
    SandboxRun,
    /// One audit append (durable or deferred).
    AuditAppend,
}

impl Stage {
    pub const ALL: [Stage; 7] = [
        Stage::Admission,
        Stage::Decision,
        Stage::ApprovalWait,
        Stage::CredentialMint,
        Stage::CredentialRevoke,
        Stage::SandboxRun,
        Stage::AuditAppend,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Admission => "admission",
            Stage::Decision => "decision",
            Stage::ApprovalWait => "approval_wait",
            Stage::CredentialMint => "credential_mint",
            Stage::CredentialRevoke => "credential_revoke",
            Stage::SandboxRun => "sandbox_run",
            Stage::AuditAppend => "audit_append",
        }
    }
}

/// Whether metrics are recorded (on unless turned off: the benchmark
/// compares a call with and without).
static ENABLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Turn the recording of metrics (and spans) on or off for the process.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, std::sync::atomic::Ordering::Relaxed);
}

pub fn enabled() -> bool {
    ENABLED.load(std::sync::atomic::Ordering::Relaxed)
}

/// A stage being timed: dropped, it observes its histogram and ends its
/// span.
pub struct StageTimer {
    stage: Stage,
    started: Instant,
    span: Option<trace::StageSpan>,
}

impl StageTimer {
    /// Attach an attribute to the stage's span (a bounded word or a name
    /// the gateway made: a sandbox's name, a decision's step).
    pub fn attribute(&mut self, key: &'static str, value: impl Into<String>) {
        if let Some(s) = &mut self.span {
            s.attribute(key, value.into());
        }
    }
}

impl StageTimer {
    /// A point the stage reached at `at`, as an event on its span (one of
    /// the gateway's own step names: a sandbox run's stages).
    pub fn event_at(&mut self, name: &'static str, at: std::time::SystemTime) {
        if let Some(s) = &mut self.span {
            s.event_at(name, at);
        }
    }
}

impl Drop for StageTimer {
    fn drop(&mut self) {
        if enabled() {
            metrics().observe_stage(self.stage, self.started.elapsed());
        }
        if let Some(s) = self.span.take() {
            s.end();
        }
    }
}

/// Time `stage` of the call `request_id` (its span is a child of the
/// call's when the call is traced).
pub fn stage(request_id: &str, stage: Stage) -> StageTimer {
    let span = if enabled() {
        trace::stage_span(request_id, stage)
    } else {
        None
    };
    StageTimer {
        stage,
        started: Instant::now(),
        span,
    }
}

/// A stage that already took `took` (measured elsewhere: an approval's
/// wait, from its stored times).
pub fn observe(stage: Stage, took: std::time::Duration) {
    if enabled() {
        metrics().observe_stage(stage, took);
    }
}

/// An audit event was appended (`bytes`: its line), in `took`. `event`:
/// one of the audit's own names, or `other`.
pub fn audit_appended(
    request_id: &str,
    event: &'static str,
    data: &serde_json::Value,
    bytes: usize,
    took: std::time::Duration,
) {
    if !enabled() {
        return;
    }
    let m = metrics();
    m.observe_stage(Stage::AuditAppend, took);
    m.audit_event(event, data, bytes);
    trace::audit_event(request_id, event, took);
}

/// The `tool` label of a call: the tool's name when the policy's catalog
/// has it, else `other` (an agent chooses the name it sends).
pub fn tool_label(tool: &str, known: bool) -> String {
    if known && tool.len() <= 64 {
        tool.to_string()
    } else {
        "other".to_string()
    }
}
