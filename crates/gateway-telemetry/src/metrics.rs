//! The daemon's Prometheus metrics (prometheus-client), one registry per
//! process, exposed in the OpenMetrics text format at `/metrics`.
//!
//! Names follow Prometheus's conventions: a `gateway_` prefix, base units
//! (`_seconds`, `_bytes`), `_total` on counters. Every label value comes
//! from a fixed list or from the policy's catalog ([`super::tool_label`]).

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde_json::Value;

use super::Stage;

/// The content type of [`Metrics::encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Seconds: a policy decision takes a fraction of a millisecond, a sandbox
/// seconds, an approval minutes to hours.
const BUCKETS: [f64; 20] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0, 300.0, 3600.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub tool: String,
    /// `allow`, `deny`, or `none` (the call ended before a decision).
    pub decision: &'static str,
    /// `completed`, `failed` (the tool failed in its sandbox), `denied`,
    /// `pending_approval`, `refused`, `error`.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabels {
    stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    event: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    digest: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SinkLabels {
    sink: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    /// The upstream's name in the operator's config/upstreams.
    upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpRefusalLabels {
    /// Which limit: `request_timeout`, `connections_per_identity`,
    /// `requests_per_identity`, `sessions_per_identity`, `sessions`.
    limit: &'static str,
    /// The identity over it, as the first 12 hex digits of the SHA-256 of
    /// its principal id (never a token or a claim as sent).
    identity: String,
}

type StageHistograms = Family<StageLabels, Histogram, fn() -> Histogram>;

fn stage_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

pub struct Metrics {
    registry: Registry,
    calls: Family<CallLabels, Counter>,
    stages: StageHistograms,
    approvals: Family<EventLabels, Counter>,
    approvals_now: Family<StateLabels, Gauge>,
    credentials_issued: Counter,
    credentials_revoked: Counter,
    credentials_revoke_failed: Counter,
    credentials_refused: Counter,
    credentials_open: Gauge,
    open_leases: Mutex<HashSet<String>>,
    sandboxes_running: Gauge,
    sandboxes: Family<ResultLabels, Counter>,
    policy_reloads: Family<ResultLabels, Counter>,
    policy_loaded: Family<PolicyLabels, Gauge>,
    audit_events: Family<EventLabels, Counter>,
    audit_bytes: Counter,
    export_sent: Family<SinkLabels, Counter>,
    export_failures: Family<SinkLabels, Counter>,
    export_backlog: Family<SinkLabels, Gauge>,
    export_last_success: Family<SinkLabels, Gauge>,
    export_up: Family<SinkLabels, Gauge>,
    calls_running: Gauge,
    http_refused: Family<HttpRefusalLabels, Counter>,
    upstream_changes: Family<UpstreamLabels, Counter>,
    http_sessions: Gauge,
    http_connections: Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

static METRICS: OnceLock<Metrics> = OnceLock::new();

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    METRICS.get_or_init(Metrics::new)
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::default();
        let calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "gateway_calls",
            "Tool calls ended, by tool, decision and outcome",
            calls.clone(),
        );
        let stages: StageHistograms = Family::new_with_constructor(stage_histogram);
        registry.register(
            "gateway_stage_duration_seconds",
            "Time spent in each stage of a call",
            stages.clone(),
        );
        let approvals = Family::<EventLabels, Counter>::default();
        registry.register(
            "gateway_approval_events",
            "Approval events recorded by this process (requested, granted, denied, refused, spent, superseded)",
            approvals.clone(),
        );
        let approvals_now = Family::<StateLabels, Gauge>::default();
        registry.register(
            "gateway_approvals",
            "Approvals in the store by state (pending, granted, denied, expired, spent), read at the scrape",
            approvals_now.clone(),
        );
        let counter = |registry: &mut Registry, name: &str, help: &str| {
            let c = Counter::default();
            registry.register(name, help, c.clone());
            c
        };
        let credentials_issued = counter(
            &mut registry,
            "gateway_credentials_issued",
            "Credentials minted for a call",
        );
        let credentials_revoked = counter(
            &mut registry,
            "gateway_credentials_revoked",
            "Credentials revoked",
        );
        let credentials_revoke_failed = counter(
            &mut registry,
            "gateway_credentials_revoke_failed",
            "Revocations that failed (the lease stays in the ledger and is revoked again)",
        );
        let credentials_refused = counter(
            &mut registry,
            "gateway_credentials_refused",
            "Credentials the broker would not mint",
        );
        let credentials_open = Gauge::default();
        registry.register(
            "gateway_credentials_open",
            "Credentials this process minted and has not revoked yet",
            credentials_open.clone(),
        );
        let sandboxes_running = Gauge::default();
        registry.register(
            "gateway_sandboxes_running",
            "Sandboxes started and not ended",
            sandboxes_running.clone(),
        );
        let sandboxes = Family::<ResultLabels, Counter>::default();
        registry.register(
            "gateway_sandboxes",
            "Sandboxes ended, by result (completed, output_refused, failed)",
            sandboxes.clone(),
        );
        let policy_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "gateway_policy_reloads",
            "Policy set (re)loads, by result (ok, failed)",
            policy_reloads.clone(),
        );
        let policy_loaded = Family::<PolicyLabels, Gauge>::default();
        registry.register(
            "gateway_policy_loaded",
            "1 for the digest of the policy set in use",
            policy_loaded.clone(),
        );
        let audit_events = Family::<EventLabels, Counter>::default();
        registry.register(
            "gateway_audit_appends",
            "Audit events appended, by event",
            audit_events.clone(),
        );
        let audit_bytes = counter(
            &mut registry,
            "gateway_audit_append_bytes",
            "Bytes of audit lines appended",
        );
        let export_sent = Family::<SinkLabels, Counter>::default();
        registry.register(
            "gateway_audit_export_events",
            "Audit events the sink acknowledged",
            export_sent.clone(),
        );
        let export_failures = Family::<SinkLabels, Counter>::default();
        registry.register(
            "gateway_audit_export_failures",
            "Batches the sink did not take (sent again after a backoff)",
            export_failures.clone(),
        );
        let export_backlog = Family::<SinkLabels, Gauge>::default();
        registry.register(
            "gateway_audit_export_backlog_events",
            "Audit events not yet acknowledged by the sink",
            export_backlog.clone(),
        );
        let export_last_success = Family::<SinkLabels, Gauge>::default();
        registry.register(
            "gateway_audit_export_last_success_timestamp_seconds",
            "When the sink last acknowledged a batch (Unix time)",
            export_last_success.clone(),
        );
        let export_up = Family::<SinkLabels, Gauge>::default();
        registry.register(
            "gateway_audit_export_up",
            "1 when the export's last round worked (the sink took the batch, or there was none to send), 0 when it failed",
            export_up.clone(),
        );
        let calls_running = Gauge::default();
        registry.register(
            "gateway_calls_running",
            "Calls admitted and not ended",
            calls_running.clone(),
        );
        let http_refused = Family::<HttpRefusalLabels, Counter>::default();
        registry.register(
            "gateway_http_limited",
            "HTTP requests refused at a limit of the remote transport (408 or 429), by limit and hashed identity",
            http_refused.clone(),
        );
        let upstream_changes = Family::<UpstreamLabels, Counter>::default();
        registry.register(
            "gateway_upstream_tool_changes",
            "Times an upstream MCP server's tool was found not as locked (changed, gone or new), or the server said its tool list changed",
            upstream_changes.clone(),
        );
        let http_sessions = Gauge::default();
        registry.register(
            "gateway_http_sessions",
            "Legacy MCP sessions open on the HTTP transport",
            http_sessions.clone(),
        );
        let http_connections = Gauge::default();
        registry.register(
            "gateway_http_connections",
            "HTTP connections open",
            http_connections.clone(),
        );
        // Every stage is shown from the start (a query over a stage that
        // never ran returns zeros, not nothing).
        for s in Stage::ALL {
            let _ = stages.get_or_create(&StageLabels { stage: s.as_str() });
        }
        for event in APPROVAL_EVENTS {
            let _ = approvals.get_or_create(&EventLabels { event });
        }
        for result in ["completed", "output_refused", "failed"] {
            let _ = sandboxes.get_or_create(&ResultLabels { result });
        }
        for result in ["ok", "failed"] {
            let _ = policy_reloads.get_or_create(&ResultLabels { result });
        }
        Metrics {
            registry,
            calls,
            stages,
            approvals,
            approvals_now,
            credentials_issued,
            credentials_revoked,
            credentials_revoke_failed,
            credentials_refused,
            credentials_open,
            open_leases: Mutex::new(HashSet::new()),
            sandboxes_running,
            sandboxes,
            policy_reloads,
            policy_loaded,
            audit_events,
            audit_bytes,
            export_sent,
            export_failures,
            export_backlog,
            export_last_success,
            export_up,
            calls_running,
            http_refused,
            upstream_changes,
            http_sessions,
            http_connections,
        }
    }

    /// A request refused at the HTTP transport's `limit` for `identity`
    /// (a principal id, hashed here; empty before one is known).
    pub fn http_limited(&self, limit: &'static str, identity: &str) {
        let identity = if identity.is_empty() {
            String::new()
        } else {
            gateway_base::canonical::sha256_hex(identity.as_bytes())[..12].to_string()
        };
        self.http_refused
            .get_or_create(&HttpRefusalLabels { limit, identity })
            .inc();
    }

    /// An upstream's tool found not as locked.
    pub fn upstream_tool_changed(&self, upstream: &str) {
        self.upstream_changes
            .get_or_create(&UpstreamLabels {
                upstream: upstream.chars().take(64).collect(),
            })
            .inc();
    }

    /// Legacy sessions open on the HTTP transport now.
    pub fn set_http_sessions(&self, sessions: usize) {
        self.http_sessions
            .set(i64::try_from(sessions).unwrap_or(i64::MAX));
    }

    /// HTTP connections open now.
    pub fn set_http_connections(&self, connections: usize) {
        self.http_connections
            .set(i64::try_from(connections).unwrap_or(i64::MAX));
    }

    /// The OpenMetrics text of every metric now.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    pub fn observe_stage(&self, stage: Stage, took: std::time::Duration) {
        self.stages
            .get_or_create(&StageLabels {
                stage: stage.as_str(),
            })
            .observe(took.as_secs_f64());
    }

    /// A call ended.
    pub fn call_ended(&self, labels: CallLabels) {
        if super::enabled() {
            self.calls.get_or_create(&labels).inc();
        }
    }

    /// Calls running now.
    pub fn set_calls_running(&self, n: usize) {
        self.calls_running.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The store's approvals by state, read for a scrape.
    pub fn set_approvals(&self, by_state: &[(&'static str, i64)]) {
        for (state, n) in by_state {
            self.approvals_now
                .get_or_create(&StateLabels { state })
                .set(*n);
        }
    }

    /// The audit export to `sink`: `sent` events acknowledged now, the
    /// backlog left.
    pub fn export_progress(&self, sink: &str, sent: u64, backlog: u64) {
        let l = SinkLabels {
            sink: sink.to_string(),
        };
        if sent > 0 {
            self.export_sent.get_or_create(&l).inc_by(sent);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            self.export_last_success
                .get_or_create(&l)
                .set(i64::try_from(now).unwrap_or(0));
        }
        self.export_backlog
            .get_or_create(&l)
            .set(i64::try_from(backlog).unwrap_or(i64::MAX));
    }

    /// Whether the export's last round worked.
    pub fn export_up(&self, sink: &str, up: bool) {
        self.export_up
            .get_or_create(&SinkLabels {
                sink: sink.to_string(),
            })
            .set(i64::from(up));
    }

    pub fn export_failed(&self, sink: &str) {
        self.export_failures
            .get_or_create(&SinkLabels {
                sink: sink.to_string(),
            })
            .inc();
    }

    /// An audit event was appended: the counters derived from it.
    /// `event`: one of the audit's names, or `other`.
    pub(super) fn audit_event(&self, event: &'static str, data: &Value, bytes: usize) {
        let name = event;
        self.audit_events
            .get_or_create(&EventLabels { event: name })
            .inc();
        self.audit_bytes.inc_by(bytes as u64);
        let lease = || {
            data.get("lease_id")
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let leases = || self.open_leases.lock().unwrap_or_else(|p| p.into_inner());
        match name {
            "approval.requested"
            | "approval.granted"
            | "approval.denied"
            | "approval.refused"
            | "approval.spent"
            | "approval.superseded" => {
                let short = name.trim_start_matches("approval.");
                let short = APPROVAL_EVENTS
                    .iter()
                    .find(|e| **e == short)
                    .copied()
                    .unwrap_or("other");
                self.approvals
                    .get_or_create(&EventLabels { event: short })
                    .inc();
            }
            "credential.issued" => {
                self.credentials_issued.inc();
                if let Some(l) = lease() {
                    let mut open = leases();
                    open.insert(l);
                    self.credentials_open.set(open.len() as i64);
                }
            }
            "credential.revoked" => {
                self.credentials_revoked.inc();
                if let Some(l) = lease() {
                    let mut open = leases();
                    open.remove(&l);
                    self.credentials_open.set(open.len() as i64);
                }
            }
            "credential.revoke_failed" => {
                self.credentials_revoke_failed.inc();
            }
            "credential.refused" => {
                self.credentials_refused.inc();
            }
            "sandbox.started" => {
                self.sandboxes_running.inc();
            }
            "sandbox.completed" | "sandbox.output_refused" | "sandbox.failed" => {
                self.sandboxes_running.dec();
                let result = name.trim_start_matches("sandbox.");
                let result = ["completed", "output_refused", "failed"]
                    .into_iter()
                    .find(|r| *r == result)
                    .unwrap_or("failed");
                self.sandboxes.get_or_create(&ResultLabels { result }).inc();
            }
            "policy.loaded" | "policy.reloaded" => {
                self.policy_reloads
                    .get_or_create(&ResultLabels { result: "ok" })
                    .inc();
                if let Some(fp) = data.get("fingerprint").and_then(Value::as_str) {
                    // One digest at a time: the set in use.
                    self.policy_loaded.clear();
                    self.policy_loaded
                        .get_or_create(&PolicyLabels {
                            digest: fp.chars().take(80).collect(),
                        })
                        .set(1);
                }
            }
            "policy.load_failed" | "policy.reload_failed" => {
                self.policy_reloads
                    .get_or_create(&ResultLabels { result: "failed" })
                    .inc();
            }
            _ => {}
        }
    }
}

const APPROVAL_EVENTS: [&str; 6] = [
    "requested",
    "granted",
    "denied",
    "refused",
    "spent",
    "superseded",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_move_the_counters_they_stand_for() {
        let m = Metrics::new();
        m.audit_event(
            "credential.issued",
            &serde_json::json!({"lease_id": "a"}),
            10,
        );
        m.audit_event(
            "credential.issued",
            &serde_json::json!({"lease_id": "b"}),
            10,
        );
        m.audit_event(
            "credential.revoked",
            &serde_json::json!({"lease_id": "a"}),
            10,
        );
        m.audit_event("sandbox.started", &Value::Null, 5);
        m.audit_event(
            "policy.reloaded",
            &serde_json::json!({"fingerprint": "f1"}),
            5,
        );
        m.audit_event(
            "policy.reloaded",
            &serde_json::json!({"fingerprint": "f2"}),
            5,
        );
        m.audit_event("other", &Value::Null, 5);
        let text = m.encode();
        for line in [
            "gateway_credentials_issued_total 2",
            "gateway_credentials_revoked_total 1",
            "gateway_credentials_open 1",
            "gateway_sandboxes_running 1",
            "gateway_policy_loaded{digest=\"f2\"} 1",
            "gateway_policy_reloads_total{result=\"ok\"} 2",
            "gateway_audit_appends_total{event=\"other\"} 1",
            "gateway_audit_append_bytes_total 50",
        ] {
            assert!(text.contains(line), "{line} not in:\n{text}");
        }
        // The digest before is gone: one set is in use.
        assert!(!text.contains("digest=\"f1\""), "{text}");
        assert!(
            text.contains(
                "gateway_stage_duration_seconds_bucket{le=\"0.0001\",stage=\"decision\"} 0"
            ) || text.contains("stage=\"decision\",le=\"0.0001\"} 0"),
            "{text}"
        );
    }
}
