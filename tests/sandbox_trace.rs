//! A sandbox run's stages on its trace span: each stage the run reached is
//! an event on `sandbox_run` at the time it was reached, for a run that
//! stopped part way (its pod never started) as for one that ended. The
//! spans go to the test OTLP receiver (tests/observability/receiver.py);
//! the sandbox is the scripted fake (tests/support/scripted_sandbox.rs).

mod common;
#[path = "support/otlp.rs"]
mod otlp;
#[path = "support/scripted_sandbox.rs"]
mod scripted_sandbox;

use std::sync::Arc;

use gateway::pipeline::{Outcome, ToolCall};
use gateway::policy::Principal;
use gateway::sandbox::StageMark;
use serde_json::{Value, json};

const MODULE: &str = "terraform/offline-demo";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_stops_part_way_has_its_stages_as_events_on_its_span() {
    let policies = common::policies_with(&[]);
    let home = tempfile::tempdir().expect("home");
    let (workspace, _module) = common::workspace_with_module(MODULE);
    let sandbox = Arc::new(scripted_sandbox::demo_script("create", Vec::new()));
    let reached = vec![
        StageMark {
            stage: "secret_created",
            at_ms: 5,
        },
        StageMark {
            stage: "job_created",
            at_ms: 12,
        },
        StageMark {
            stage: "scheduled",
            at_ms: 40,
        },
    ];
    *sandbox.stop_at.lock().expect("stop") = Some(reached.clone());
    let (_, p) = scripted_sandbox::pipeline(
        policies.path(),
        home.path(),
        workspace.path(),
        sandbox.clone(),
    );
    let p = Arc::new(p);
    let spans_dir = tempfile::tempdir().expect("spans");
    let receiver = otlp::Receiver::start(None, spans_dir.path(), None);
    gateway::telemetry::trace::init(&receiver.url(), "gateway-test").expect("traces");
    let r = p
        .call(ToolCall {
            trace: None,
            tool: "terraform_plan".into(),
            params: json!({"working_dir": MODULE}),
            principal: Principal::os_user("test-agent".into(), "alice".into(), 1000, vec![]),
            workspace: None,
        })
        .await
        .expect("call");
    assert!(
        !matches!(r.outcome, Outcome::Completed { ok: true, .. }),
        "{:?}",
        r.outcome
    );
    let spans = otlp::call_spans(spans_dir.path(), &r.request_id).await;
    let run = spans
        .iter()
        .find(|s| s["name"] == "sandbox_run")
        .unwrap_or_else(|| panic!("no sandbox_run span: {spans:#?}"));
    let events = run["events"].as_array().expect("events");
    let names: Vec<&str> = events.iter().filter_map(|e| e["name"].as_str()).collect();
    assert_eq!(
        names,
        ["secret_created", "job_created", "scheduled"],
        "{run}"
    );
    let at = |v: &Value, k: &str| v[k].as_u64().expect("time");
    let times: Vec<u64> = events.iter().map(|e| at(e, "time")).collect();
    // In order, within the span, each no later than when it was reached
    // (the scripted run returns at once: the marks are capped at its end).
    assert!(
        times.windows(2).all(|w| w[0] <= w[1])
            && times[0] >= at(run, "start")
            && times[2] <= at(run, "end"),
        "{times:?} in {run}"
    );
    assert_eq!(
        run["attributes"]["gateway.sandbox.stages_ms"],
        "secret_created=5,job_created=12,scheduled=40",
        "{run}"
    );
    // The audit's sandbox.failed says it stopped; the trace says where.
    let failed = gateway::audit::read_events(p.audit.path())
        .expect("audit")
        .into_iter()
        .find(|e| e["request_id"] == r.request_id.as_str() && e["event"] == "sandbox.failed");
    assert!(failed.is_some(), "sandbox.failed is audited");
}
