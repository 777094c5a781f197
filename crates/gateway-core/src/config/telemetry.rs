//! `[telemetry]` and `[audit_export]` (README.md: "Watching it").

use std::path::PathBuf;

/// `[telemetry]`: metrics and traces.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// A plain-HTTP address serving only `/metrics` (e.g. `0.0.0.0:9464`
    /// for a Prometheus in the cluster). Set, the MCP listener no longer
    /// serves `/metrics` unless `metrics_on_http` says so.
    pub metrics_listen: Option<String>,
    /// Whether the `[http]` listener serves `/metrics` too (default: yes,
    /// unless `metrics_listen` is set).
    pub metrics_on_http: Option<bool>,
    /// An OTLP/HTTP collector's base URL (`http://host:4318`): spans go to
    /// `{otlp_endpoint}/v1/traces` as protobuf. Unset: no traces.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` of the spans (default `gateway`).
    pub service_name: Option<String>,
}

impl TelemetryConfig {
    /// Whether the MCP listener serves `/metrics`.
    pub fn metrics_on_http(&self) -> bool {
        self.metrics_on_http
            .unwrap_or(self.metrics_listen.is_none())
    }
}

/// `[audit_export]`: the audit trail shipped to a SIEM.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditExportConfig {
    /// `jsonl` (JSON lines POSTed over HTTPS) or `otlp` (OTLP/HTTP logs,
    /// protobuf).
    pub sink: String,
    /// Where batches are POSTed: the full URL (`https://siem/ingest`, or
    /// an OTLP collector's `http://host:4318/v1/logs`). Plain http is
    /// accepted only to a loopback address.
    pub url: String,
    /// A file holding the bearer token sent with each batch (owner-only).
    pub token_file: Option<PathBuf>,
    /// A PEM file of CA certificates for the sink's TLS (default: the
    /// system's roots).
    pub ca_file: Option<PathBuf>,
    /// An OpenSSH Ed25519 private key (unencrypted, owner-only) that signs
    /// the checkpoints sent after each batch; its public key is what
    /// `gateway audit verify --from-export --signer` checks them with.
    pub signing_key_file: Option<PathBuf>,
    /// The export's name: its cursor is kept under it, and its metrics are
    /// labelled with it (default `siem`).
    #[serde(default = "default_name")]
    pub name: String,
}

fn default_name() -> String {
    "siem".into()
}
