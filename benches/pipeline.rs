//! The gateway's own overhead per call, on the real pipeline (real policy,
//! real SQLite, real audit file with fsync, real gVisor):
//! - `pipeline/denied_call`: a k8s_get_pod_status call the policy denies —
//!   request in to result out, no sandbox: all of it is overhead;
//!   Metrics and traces are on (spans exported to a local OTLP endpoint);
//! - `pipeline/denied_call/telemetry_off`: the same with both off, to state
//!   what they cost (README.md: "Watching it"); the two interleave their
//!   calls (each times its own), so both see the same machine; both make
//!   their calls from a task on the runtime, as the transports do;
//! - `pipeline/denied_call/from_thread`: the same call made from the
//!   bench's own thread (`block_on`), as `denied_call` was until
//!   2026-12-04: what that hand-off to the runtime added;
//! - `pipeline/denied_call/postgres_audit`: the same with the audit in the
//!   replicas' chain in a real PostgreSQL (tests/support/postgres.rs): what
//!   the shared audit adds per call (its calls from a task too);
//! - `pipeline/plan_call_overhead`: a terraform_plan of the offline demo
//!   module, request in to result out, minus the sandbox's own run time
//!   (reported by the sandbox) — what the gateway adds to a low-risk call.
//!
//! Run as root: `cargo bench --bench pipeline`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use gateway::pipeline::{Outcome, Pipeline, ToolCall};
#[path = "../tests/support/postgres.rs"]
mod pg;

use gateway::policy::set::LoadOptions;
use gateway::policy::{PolicyStore, Principal};
use gateway::sandbox::local::{LocalConfig, LocalSandbox};
use gateway::tools::ToolPaths;
use serde_json::json;

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read dir") {
        let e = e.expect("entry");
        let dest = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), &dest).expect("copy");
        }
    }
}

fn bench(c: &mut Criterion) {
    // As the gateway binary does (first thing, one thread).
    gateway::quiet_library_backtraces();
    let repo = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let home = tempfile::tempdir().expect("home");
    let workspace = tempfile::tempdir().expect("workspace");
    let module = workspace.path().join("terraform/offline-demo");
    std::fs::create_dir_all(&module).expect("mkdir");
    std::fs::copy(
        repo.join("terraform/offline-demo/main.tf"),
        module.join("main.tf"),
    )
    .expect("copy");
    // The default policies, but for the admission limit on calls per user
    // and minute (a bench makes thousands): lifted for the bench's user
    // only, the way an operator would (data.config.calls.users).
    let policies = tempfile::tempdir().expect("policies");
    copy_dir(&repo.join("policies"), policies.path());
    let calls = policies.path().join("config/calls/data.yaml");
    let text = std::fs::read_to_string(&calls).expect("calls");
    assert!(text.contains("\nusers: {}\n"), "the calls table changed");
    std::fs::write(
        &calls,
        text.replace(
            "\nusers: {}\n",
            "\nusers: {bench: {per_minute_per_user: 1000000000}}\n",
        ),
    )
    .expect("write");
    let policy = Arc::new(PolicyStore::open(
        vec![policies.path().to_path_buf()],
        LoadOptions::default(),
    ));
    let sandbox = Arc::new(LocalSandbox::new(LocalConfig::default()).expect("runsc, as root"));
    let mut tools = ToolPaths::discover(&repo);
    // The in-sandbox step runner is gateway-runner, not this bench.
    tools.runner = repo.join("target/release/gateway-runner");
    if !tools.runner.is_file() {
        tools.runner = repo.join("target/debug/gateway-runner");
    }
    let make = || {
        Pipeline::new(
            Arc::clone(&policy),
            home.path().to_path_buf(),
            workspace.path().to_path_buf(),
            Arc::clone(&sandbox) as Arc<dyn gateway::sandbox::Sandbox>,
            tools.clone(),
        )
        .expect("pipeline")
    };
    let pipeline = Arc::new(make());
    // The same, writing its audit to the replicas' chain in PostgreSQL.
    let server = pg::Postgres::start();
    let mut shared = make();
    shared.audit = Arc::new(gateway::audit::AuditLog::shared(
        gateway::audit::shared::SharedChain::postgres(
            gateway::db::postgres::PostgresDb::connect(&server.database("bench"), None)
                .expect("connect"),
        )
        .expect("chain"),
    ));
    let shared = Arc::new(shared);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("rt");
    // Metrics and traces on, as a daemon with [telemetry] runs: spans go
    // to an OTLP/HTTP endpoint that takes everything (a thread answering
    // 200), so that the export's own work is in the run.
    let collector = std::net::TcpListener::bind("127.0.0.1:0").expect("collector");
    let endpoint = format!("http://{}", collector.local_addr().expect("addr"));
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut conn in collector.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 20];
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0
                        || conn
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n")
                            .is_err()
                    {
                        break;
                    }
                }
            });
        }
    });
    gateway::telemetry::trace::init(&endpoint, "bench").expect("traces");
    let traceparent = gateway::telemetry::TraceParent {
        traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
    };
    let principal = Principal::os_user("bench".into(), "bench".into(), 1000, vec![]);
    let call = |tool: &str, params: serde_json::Value| ToolCall {
        trace: Some(traceparent.clone()),
        tool: tool.into(),
        params,
        principal: principal.clone(),
        workspace: None,
    };

    let mut g = c.benchmark_group("pipeline");
    let denied_call = call("k8s_get_pod_status", json!({"namespace": "kube-system"}));
    // One denied call, awaited on the runtime: the way every transport
    // calls the pipeline (an MCP request's handler is a task).
    let denied = |pipeline: Arc<Pipeline>, one: ToolCall| async move {
        let r = pipeline.call(one).await.expect("call");
        assert!(matches!(r.outcome, Outcome::Denied { .. }));
    };
    // Telemetry on and off are interleaved call by call (each bench times
    // only its own state's calls), so that both see the same machine: on a
    // noisy 2-core host, two benches run one after the other differed by
    // more than the cost being measured. The calls are made from a task on
    // the runtime, as a transport makes them; until 2026-12-04 they were
    // made from the bench's own thread (`block_on`), which added a hand-off
    // to a worker thread and back to every call: `denied_call/from_thread`
    // still measures that way.
    let interleaved = |timed: bool| {
        let pipeline = Arc::clone(&pipeline);
        let one = denied_call.clone();
        let rt = &rt;
        move |b: &mut criterion::Bencher| {
            b.iter_custom(|iters| {
                let pipeline = Arc::clone(&pipeline);
                let one = one.clone();
                rt.block_on(async move {
                    tokio::spawn(async move {
                        let mut took = Duration::ZERO;
                        for _ in 0..iters {
                            gateway::telemetry::set_enabled(!timed);
                            denied(Arc::clone(&pipeline), one.clone()).await;
                            gateway::telemetry::set_enabled(timed);
                            let started = Instant::now();
                            denied(Arc::clone(&pipeline), one.clone()).await;
                            took += started.elapsed();
                        }
                        gateway::telemetry::set_enabled(true);
                        took
                    })
                    .await
                    .expect("the bench's task")
                })
            })
        }
    };
    // Long enough to see past the fsync's spread (5 s runs varied by
    // ±20% on the 2-core machine the README's figures come from).
    g.measurement_time(Duration::from_secs(20));
    g.bench_function("denied_call", interleaved(true));
    // The same call with metrics and traces off.
    g.bench_function("denied_call/telemetry_off", interleaved(false));
    // The same call made as the bench made it before 2026-12-04: each one
    // from the bench's thread, through `block_on`.
    g.bench_function("denied_call/from_thread", |b| {
        b.iter(|| rt.block_on(denied(Arc::clone(&pipeline), denied_call.clone())))
    });
    g.measurement_time(Duration::from_secs(5));
    g.bench_function("denied_call/postgres_audit", |b| {
        // From a task on the runtime too, so that it compares with
        // denied_call.
        b.iter_custom(|iters| {
            let shared = Arc::clone(&shared);
            let one = denied_call.clone();
            rt.block_on(async move {
                tokio::spawn(async move {
                    let started = Instant::now();
                    for _ in 0..iters {
                        denied(Arc::clone(&shared), one.clone()).await;
                    }
                    started.elapsed()
                })
                .await
                .expect("the bench's task")
            })
        })
    });
    g.sample_size(10).measurement_time(Duration::from_secs(30));
    g.bench_function("plan_call_overhead", |b| {
        b.iter_custom(|iters| {
            let mut overhead = Duration::ZERO;
            for _ in 0..iters {
                let started = Instant::now();
                let r = rt
                    .block_on(pipeline.call(call(
                        "terraform_plan",
                        json!({"working_dir": "terraform/offline-demo"}),
                    )))
                    .expect("call");
                let total = started.elapsed();
                let Outcome::Completed {
                    ok: true, result, ..
                } = r.outcome
                else {
                    panic!("plan failed: {:?}", r.outcome)
                };
                let sandbox =
                    Duration::from_millis(result["sandbox_ms"].as_u64().expect("sandbox_ms"));
                overhead += total.saturating_sub(sandbox);
            }
            overhead
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
