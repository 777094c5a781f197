//! OpenTelemetry traces of calls: a `gateway.call` span per call (a child
//! of the agent's own span when the request's `_meta` carries W3C trace
//! context, the MCP convention), and under it one span per stage, exported
//! with OTLP over HTTP/protobuf by the official SDK's batch processor.
//! Off (no span is made) unless `[telemetry] otlp_endpoint` is set.
//!
//! Attributes are the request id, the tool (bounded like the metrics'
//! label), the decision, the outcome, and names the gateway made (a
//! sandbox's name, an audit event's name): never a parameter, a principal
//! or anything from a sandbox's output.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{
    Span as _, SpanKind, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

use super::Stage;

static TRACER: OnceLock<(SdkTracerProvider, SdkTracer)> = OnceLock::new();

/// The open calls' contexts, by request id: a stage anywhere below the
/// pipeline finds its parent by the request id it already has.
static CALLS: LazyLock<Mutex<HashMap<String, Context>>> = LazyLock::new(Default::default);

/// Start exporting spans to the OTLP/HTTP collector at `endpoint` (its
/// base URL; spans go to `{endpoint}/v1/traces`). Once per process.
pub fn init(endpoint: &str, service_name: &str) -> Result<(), String> {
    use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
    // The process's TLS provider (main installs the same one); the
    // exporter's HTTP client is built now.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let base = url::Url::parse(endpoint).map_err(|e| format!("[telemetry] otlp_endpoint: {e}"))?;
    if !base.username().is_empty() || base.password().is_some() {
        return Err("[telemetry] otlp_endpoint carries a user name or password: a collector that needs credentials is not supported yet".into());
    }
    if !matches!(base.scheme(), "http" | "https") || base.query().is_some() {
        return Err(
            "[telemetry] otlp_endpoint: an http:// or https:// base URL without a query".into(),
        );
    }
    let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(url.clone())
        .with_timeout(Duration::from_secs(10))
        .with_headers(HashMap::new())
        .build()
        .map_err(|e| format!("[telemetry] otlp_endpoint {url}: {e}"))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service_name.to_string())
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        // Every call is traced, whatever the agent's own trace context
        // says (its `sampled` flag does not take a call out of the traces).
        .with_sampler(opentelemetry_sdk::trace::Sampler::AlwaysOn)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("gateway");
    TRACER
        .set((provider, tracer))
        .map_err(|_| "[telemetry] traces were already started".to_string())
}

/// Send the spans still buffered (at shutdown).
pub fn flush() {
    if let Some((provider, _)) = TRACER.get() {
        let _ = provider.force_flush();
    }
}

fn tracer() -> Option<&'static SdkTracer> {
    TRACER.get().map(|(_, t)| t)
}

/// W3C trace context an agent sent with its request (`_meta.traceparent`;
/// its `tracestate`, vendor data, is not taken into the gateway's spans).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TraceParent {
    pub traceparent: String,
}

impl TraceParent {
    /// From a request's `_meta`; `None` when it carries no traceparent of
    /// the W3C form (a malformed one is ignored, never an error).
    pub fn from_meta(meta: &serde_json::Map<String, serde_json::Value>) -> Option<TraceParent> {
        let tp = meta.get("traceparent")?.as_str()?;
        if tp.len() != 55 || !tp.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
            return None;
        }
        Some(TraceParent {
            traceparent: tp.to_string(),
        })
    }

    /// The parent context: the trace and span ids and flags.
    fn context(&self) -> Context {
        let mut carrier = HashMap::new();
        carrier.insert("traceparent".to_string(), self.traceparent.clone());
        opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier)
    }
}

/// A call's span, open while the call runs (dropped: ended, and its
/// context forgotten).
pub struct CallSpan {
    request_id: Option<String>,
}

impl CallSpan {
    /// Open the span of call `request_id` of `tool` (a bounded label).
    pub fn begin(request_id: &str, tool: &str, parent: Option<&TraceParent>) -> CallSpan {
        let Some(tracer) = tracer().filter(|_| super::enabled()) else {
            return CallSpan { request_id: None };
        };
        let parent_cx = parent.map(TraceParent::context).unwrap_or_default();
        let span = tracer
            .span_builder("gateway.call")
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("gateway.request_id", request_id.to_string()),
                KeyValue::new("gateway.tool", tool.to_string()),
            ])
            .start_with_context(tracer, &parent_cx);
        let cx = parent_cx.with_span(span);
        CALLS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(request_id.to_string(), cx);
        CallSpan {
            request_id: Some(request_id.to_string()),
        }
    }

    /// The call ended with `decision` and `outcome` (fixed words).
    pub fn end(mut self, decision: &'static str, outcome: &'static str) {
        if let Some(cx) = self.take() {
            let span = cx.span();
            span.set_attribute(KeyValue::new("gateway.decision", decision));
            span.set_attribute(KeyValue::new("gateway.outcome", outcome));
            if outcome == "error" {
                span.set_status(opentelemetry::trace::Status::error("the gateway failed"));
            }
            span.end();
        }
    }

    fn take(&mut self) -> Option<Context> {
        let rid = self.request_id.take()?;
        CALLS.lock().unwrap_or_else(|p| p.into_inner()).remove(&rid)
    }

    /// The trace id of this call's span (hex), when it is traced.
    pub fn trace_id(&self) -> Option<String> {
        let rid = self.request_id.as_ref()?;
        let calls = CALLS.lock().unwrap_or_else(|p| p.into_inner());
        let cx = calls.get(rid)?;
        Some(cx.span().span_context().trace_id().to_string())
    }
}

impl Drop for CallSpan {
    fn drop(&mut self) {
        if let Some(cx) = self.take() {
            cx.span().end();
        }
    }
}

fn call_context(request_id: &str) -> Option<Context> {
    if request_id.is_empty() {
        return None;
    }
    CALLS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(request_id)
        .cloned()
}

/// A stage's span.
pub struct StageSpan(opentelemetry_sdk::trace::Span);

impl StageSpan {
    pub(super) fn attribute(&mut self, key: &'static str, value: String) {
        self.0.set_attribute(KeyValue::new(key, value));
    }
    pub(super) fn event_at(&mut self, name: &'static str, at: SystemTime) {
        self.0.add_event_with_timestamp(name, at, Vec::new());
    }
    pub(super) fn end(mut self) {
        self.0.end();
    }
}

/// A span for `stage` under call `request_id`'s, when that call is traced.
pub(super) fn stage_span(request_id: &str, stage: Stage) -> Option<StageSpan> {
    let tracer = tracer()?;
    let cx = call_context(request_id)?;
    let span = tracer
        .span_builder(stage.as_str())
        .with_kind(SpanKind::Internal)
        .with_attributes([KeyValue::new("gateway.request_id", request_id.to_string())])
        .start_with_context(tracer, &cx);
    Some(StageSpan(span))
}

/// An audit append of `event` that took `took`, as a span of its call.
pub(super) fn audit_event(request_id: &str, event: &str, took: Duration) {
    let Some(tracer) = tracer() else {
        return;
    };
    let Some(cx) = call_context(request_id) else {
        return;
    };
    let end = SystemTime::now();
    let mut span = tracer
        .span_builder(Stage::AuditAppend.as_str())
        .with_kind(SpanKind::Internal)
        .with_start_time(end.checked_sub(took).unwrap_or(end))
        .with_attributes([
            KeyValue::new("gateway.request_id", request_id.to_string()),
            KeyValue::new("gateway.event", event.chars().take(64).collect::<String>()),
        ])
        .start_with_context(tracer, &cx);
    span.end_with_timestamp(end);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_is_taken_only_in_its_w3c_form() {
        let meta = |v: serde_json::Value| v.as_object().cloned().unwrap_or_default();
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let tp = TraceParent::from_meta(&meta(
            serde_json::json!({"traceparent": good, "tracestate": "a=b"}),
        ))
        .expect("a W3C traceparent");
        let cx = tp.context();
        assert_eq!(
            cx.span().span_context().trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        for bad in [
            serde_json::json!({"traceparent": "00-zz"}),
            serde_json::json!({"traceparent": 7}),
            serde_json::json!({"traceparent": format!("{good}\n")}),
            serde_json::json!({}),
        ] {
            assert_eq!(TraceParent::from_meta(&meta(bad.clone())), None, "{bad}");
        }
    }
}
