//! What a platform team watches (README.md: "Watching it"), with the real
//! components: a `gateway daemon` running real calls in gVisor, Debian's
//! Prometheus scraping it, and an OTLP/HTTP receiver that decodes what the
//! gateway sends with the official protobuf definitions (PyPI
//! opentelemetry-proto, tests/observability/receiver.py). The receiver is
//! also the SIEM the audit trail is exported to; it is killed mid-stream
//! and the daemon restarted, and what it kept must still verify, whole.

#[path = "support/agent.rs"]
mod agent;
mod common;
#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/otlp.rs"]
mod otlp;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use agent::Agent;
use daemon::{AGENT, Daemon};
use otlp::{free_port, lines};

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for_port(port: u16, what: &str, child: &mut Child) {
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(st)) = child.try_wait() {
            panic!("{what} exited ({st})");
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{what} does not listen on {port} after 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn receiver(port: u16, out: &Path, token: Option<&str>) -> otlp::Receiver {
    otlp::Receiver::start(Some(port), out, token)
}

/// Debian's Prometheus, scraping `target` every second.
fn prometheus(port: u16, target: &str, dir: &Path) -> Proc {
    let bin = which("prometheus").expect("prometheus is installed by scripts/bootstrap.sh");
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: gateway\n    static_configs:\n      - targets: [\"{target}\"]\n"
        ),
    )
    .expect("prometheus.yml");
    let mut child = Command::new(bin)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).expect("log"))
        .spawn()
        .expect("prometheus");
    wait_for_port(port, "prometheus", &mut child);
    Proc(child)
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}

/// An instant query through Prometheus's HTTP API: the result vector.
fn query(prom: u16, expr: &str) -> Vec<Value> {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--get"])
        .arg(format!("http://127.0.0.1:{prom}/api/v1/query"))
        .arg("--data-urlencode")
        .arg(format!("query={expr}"))
        .output()
        .expect("curl");
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{expr}: {e}: {}", common::stdout(&out)));
    assert_eq!(v["status"], "success", "{expr}: {v}");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// Wait until `expr` has a sample whose value `ok` accepts.
fn eventually(prom: u16, expr: &str, ok: impl Fn(f64) -> bool) -> Vec<Value> {
    let started = Instant::now();
    loop {
        let r = query(prom, expr);
        if r.iter().any(|s| {
            s["value"][1]
                .as_str()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(&ok)
        }) {
            return r;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{expr}: no such value after 60 s: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The daemon's `/metrics`, as text.
fn scrape(port: u16) -> String {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .arg(format!("http://127.0.0.1:{port}/metrics"))
        .output()
        .expect("curl");
    assert!(out.status.success(), "{}", common::stderr(&out));
    common::stdout(&out)
}

/// The value of the sample named exactly `series` in a scrape.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// A tools/call with W3C trace context in its `_meta`.
fn traced_call(a: &mut Agent, id: u64, tool: &str, args: Value, traceparent: &str) {
    a.send(
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": tool, "arguments": args,
        "_meta": {"progressToken": "p", "traceparent": traceparent, "tracestate": "agent=1"}}}),
    );
}

/// The spans the receiver got for `trace_id`, once its root has come.
fn trace(out: &Path, trace_id: &str) -> Vec<Value> {
    otlp::spans_until(
        out,
        |s| s["trace_id"] == trace_id,
        |s| s["name"] == "gateway.call",
    )
}

#[test]
fn a_call_is_traced_counted_scraped_and_its_audit_reaches_the_siem_through_an_outage() {
    daemon::os_user(AGENT);
    let work = tempfile::tempdir().expect("work");
    let out = work.path().join("receiver");
    std::fs::create_dir_all(&out).expect("out");
    let (otlp, metrics, prom) = (free_port(), free_port(), free_port());
    let key = common::ssh_key(work.path(), "export-key");
    let extra = format!(
        "[telemetry]\nmetrics_listen = \"127.0.0.1:{metrics}\"\notlp_endpoint = \"http://127.0.0.1:{otlp}\"\nservice_name = \"gateway-test\"\n\
         [audit_export]\nsink = \"otlp\"\nurl = \"http://127.0.0.1:{otlp}/v1/logs\"\nsigning_key_file = {key:?}\nname = \"siem\"\n"
    );
    let (dir, config) = Daemon::layout(&common::repo().join("policies"), &extra);
    // Small batches, read often: the outage falls between batches.
    std::fs::write(
        dir.path().join("policies/config/audit_export/data.yaml"),
        "batch_events: 7\nbatch_bytes: 1048576\nmax_backoff_seconds: 2\npoll_milliseconds: 100\n",
    )
    .expect("export settings");
    let mut siem = Some(receiver(otlp, &out, None));
    let prom_dir = work.path().join("prometheus");
    std::fs::create_dir_all(&prom_dir).expect("prometheus dir");
    let _prometheus = prometheus(prom, &format!("127.0.0.1:{metrics}"), &prom_dir);
    let mut d = Daemon::start_in(dir, config);
    let workspace = daemon::demo_workspace(AGENT);
    let agent_home = daemon::owned_dir(AGENT);
    let mut a = Agent::start(&d, workspace.path(), agent_home.path());

    // 1. A denied call (a tool the catalog does not have) and a plan that
    // runs in gVisor, each continuing the agent's trace.
    let (t1, p1) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let (t2, p2) = ("5cf92f3577b34da6a3ce929d0e0e4737", "10f067aa0ba902b8");
    // Not sampled by the agent: the gateway traces it all the same.
    traced_call(
        &mut a,
        1,
        "made_up_tool",
        json!({}),
        &format!("00-{t1}-{p1}-00"),
    );
    let r1 = a.wait(|v| v["id"] == 1, Duration::from_secs(30));
    // Unknown to this client: a protocol error, after the pipeline denied it.
    assert!(
        r1["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("Unknown tool")),
        "{r1}"
    );
    traced_call(
        &mut a,
        2,
        "terraform_plan",
        json!({"working_dir": "terraform/offline-demo"}),
        &format!("00-{t2}-{p2}-01"),
    );
    let r2 = a.wait(|v| v["id"] == 2, Duration::from_secs(300));
    assert_eq!(
        r2["result"]["structuredContent"]["status"], "completed",
        "{r2}"
    );

    // 2. The plan's trace: the agent's trace id, the gateway's span a
    // child of the agent's, every stage under it with its times.
    let spans = trace(&out, t2);
    let root = spans
        .iter()
        .find(|s| s["name"] == "gateway.call")
        .expect("root");
    assert_eq!(root["parent_span_id"], p2, "{root}");
    assert_eq!(root["service"], "gateway-test");
    assert_eq!(root["attributes"]["gateway.tool"], "terraform_plan");
    assert_eq!(root["attributes"]["gateway.decision"], "allow");
    assert_eq!(root["attributes"]["gateway.outcome"], "completed");
    let rid = root["attributes"]["gateway.request_id"]
        .as_str()
        .expect("request id")
        .to_string();
    let children: Vec<&Value> = spans
        .iter()
        .filter(|s| s["parent_span_id"] == root["span_id"])
        .collect();
    for stage in ["admission", "decision", "sandbox_run", "audit_append"] {
        let s = children
            .iter()
            .find(|s| s["name"] == stage)
            .unwrap_or_else(|| panic!("no {stage} span under the call: {spans:#?}"));
        assert_eq!(s["attributes"]["gateway.request_id"], rid.as_str());
        let (start, end) = (
            s["start"].as_u64().unwrap_or(0),
            s["end"].as_u64().unwrap_or(0),
        );
        assert!(start > 0 && end >= start, "{s}");
        assert!(
            start >= root["start"].as_u64().unwrap_or(u64::MAX)
                && end <= root["end"].as_u64().unwrap_or(0),
            "{stage} is not within the call: {s} {root}"
        );
    }
    // Two decisions: the request (with its admission, one evaluation),
    // then the plan.
    let steps: Vec<&Value> = children
        .iter()
        .filter(|s| s["name"] == "decision")
        .map(|s| &s["attributes"]["gateway.step"])
        .collect();
    assert!(
        steps.contains(&&json!("admission+request")) && steps.contains(&&json!("plan")),
        "{steps:?}"
    );
    // No argument, user or output in any span.
    let all = std::fs::read_to_string(out.join("spans.jsonl")).expect("spans");
    for secretish in ["offline-demo", AGENT, "working_dir"] {
        assert!(!all.contains(secretish), "{secretish} is in a span");
    }
    // The denied call: a tool nobody listed is `other`, never its name.
    let denied = trace(&out, t1);
    let root1 = denied
        .iter()
        .find(|s| s["name"] == "gateway.call")
        .expect("root");
    assert_eq!(root1["parent_span_id"], p1);
    assert_eq!(root1["attributes"]["gateway.tool"], "other");
    assert_eq!(root1["attributes"]["gateway.decision"], "deny");
    assert_eq!(root1["attributes"]["gateway.outcome"], "denied");
    assert!(!all.contains("made_up_tool"));

    // 3. Prometheus scraped the counters and histograms the calls moved.
    eventually(
        prom,
        "gateway_calls_total{tool=\"terraform_plan\",decision=\"allow\",outcome=\"completed\"}",
        |v| v == 1.0,
    );
    eventually(
        prom,
        "gateway_calls_total{tool=\"other\",decision=\"deny\",outcome=\"denied\"}",
        |v| v == 1.0,
    );
    eventually(
        prom,
        "gateway_stage_duration_seconds_count{stage=\"sandbox_run\"}",
        |v| v >= 1.0,
    );
    eventually(
        prom,
        "gateway_stage_duration_seconds_count{stage=\"decision\"}",
        |v| v >= 3.0,
    );
    eventually(prom, "gateway_sandboxes_total{result=\"completed\"}", |v| {
        v >= 1.0
    });
    eventually(prom, "gateway_sandboxes_running", |v| v == 0.0);
    eventually(prom, "gateway_policy_loaded", |v| v == 1.0);
    let text = scrape(metrics);
    assert!(!text.contains(&rid), "a request id is a label");
    assert!(!text.contains(AGENT), "a user is a label");
    assert!(!text.contains("made_up_tool"), "an unknown tool is a label");

    // 4. The SIEM goes away mid-stream. Calls go on as fast as before;
    // the backlog grows and is shown.
    let exported_before = lines(&out.join("export.jsonl")).len();
    assert!(
        exported_before > 0,
        "nothing was exported before the outage"
    );
    siem.take();
    for id in 3..6 {
        let started = Instant::now();
        a.call(id, "made_up_tool", json!({})).expect("call");
        a.wait(|v| v["id"] == id, Duration::from_secs(30));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a call took {:?} while the sink was down",
            started.elapsed()
        );
    }
    let started = Instant::now();
    loop {
        let t = scrape(metrics);
        let backlog = sample(&t, "gateway_audit_export_backlog_events{sink=\"siem\"}");
        let failures = sample(&t, "gateway_audit_export_failures_total{sink=\"siem\"}");
        if backlog.is_some_and(|b| b > 0.0) && failures.is_some_and(|f| f > 0.0) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no backlog or failure shown while the sink is down: {t}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // 5. The daemon restarts while the sink is still down; more calls.
    a.kill();
    d.restart();
    let mut a = Agent::start(&d, workspace.path(), agent_home.path());
    a.call(7, "made_up_tool", json!({})).expect("call");
    a.wait(|v| v["id"] == 7, Duration::from_secs(30));

    // 6. The sink comes back: everything reaches it.
    let _siem = receiver(otlp, &out, None);
    let log_events = || {
        std::fs::read_to_string(d.home.join("audit.jsonl"))
            .unwrap_or_default()
            .lines()
            .count() as u64
    };
    let started = Instant::now();
    let records = loop {
        let records = lines(&out.join("export.jsonl"));
        let got: std::collections::BTreeSet<u64> = records
            .iter()
            .filter(|r| r["kind"] == "event")
            .filter_map(|r| r["seq"].as_u64())
            .collect();
        let t = scrape(metrics);
        if got.len() as u64 == log_events()
            && sample(&t, "gateway_audit_export_backlog_events{sink=\"siem\"}") == Some(0.0)
        {
            break records;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the export did not catch up in 60 s: {} of {} events ({})",
            got.len(),
            log_events(),
            d.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    // At least once, with duplicates only inside the window: a batch at
    // most (7 events) sent again.
    let events = records.iter().filter(|r| r["kind"] == "event").count() as u64;
    assert!(
        events <= log_events() + 7,
        "{events} event records for {} events",
        log_events()
    );
    // The receiver checks the export offline: whole, in order, signed.
    let pubkey = key.with_extension("pub");
    let verify = common::gateway(&d.home)
        .args(["audit", "verify", "--from-export"])
        .arg(out.join("export.jsonl"))
        .arg("--signer")
        .arg(&pubkey)
        .output()
        .expect("verify");
    let said = common::stdout(&verify);
    assert!(verify.status.success(), "{said}{}", common::stderr(&verify));
    assert!(
        said.contains(&format!("ok: {} events verified", log_events())),
        "{said}"
    );
    // The export is the daemon's log, event for event.
    let log: Vec<Value> = std::fs::read_to_string(d.home.join("audit.jsonl"))
        .expect("log")
        .lines()
        .map(|l| serde_json::from_str(l).expect("event"))
        .collect();
    for r in &records {
        if r["kind"] == "event" {
            let seq = r["seq"].as_u64().expect("seq") as usize;
            assert_eq!(r["event"], log[seq - 1], "event {seq}");
        }
    }
    // An export with an event taken out fails, and says where.
    let mut cut: Vec<String> = records
        .iter()
        .filter(|r| !(r["kind"] == "event" && r["seq"] == 3))
        .map(Value::to_string)
        .collect();
    cut.push(String::new());
    std::fs::write(work.path().join("cut.jsonl"), cut.join("\n")).expect("cut");
    let verify = common::gateway(&d.home)
        .args(["audit", "verify", "--from-export"])
        .arg(work.path().join("cut.jsonl"))
        .output()
        .expect("verify");
    assert!(!verify.status.success());
    assert!(
        common::stdout(&verify).contains("events 3 to 3 are missing"),
        "{}",
        common::stdout(&verify)
    );
    // A checkpoint signed by another key fails with --signer.
    let other = common::ssh_key(work.path(), "other-key");
    let verify = common::gateway(&d.home)
        .args(["audit", "verify", "--from-export"])
        .arg(out.join("export.jsonl"))
        .arg("--signer")
        .arg(other.with_extension("pub"))
        .output()
        .expect("verify");
    assert!(!verify.status.success(), "{}", common::stdout(&verify));

    // 7. Every query of the shipped dashboard returns data from this run.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(common::repo().join("deploy/grafana/gateway-dashboard.json"))
            .expect("dashboard"),
    )
    .expect("dashboard JSON");
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect();
    assert!(exprs.len() >= 10, "{exprs:?}");
    for e in &exprs {
        let started = Instant::now();
        while query(prom, e).is_empty() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the dashboard's query {e} returns nothing"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    // The alert rules load.
    let check = Command::new("promtool")
        .args(["check", "rules"])
        .arg(common::repo().join("deploy/prometheus/gateway-alerts.yml"))
        .output()
        .expect("promtool");
    assert!(check.status.success(), "{}", common::stdout(&check));
    d.assert_audit_verifies();
}

/// The JSON-lines sink: a batch counts as sent only when the sink took it
/// with the export's bearer token; a refused batch leaves the cursor
/// where it was; a new exporter (a restart) goes on from the cursor, with
/// nothing sent twice once acknowledged.
#[test]
fn the_jsonl_sink_takes_batches_with_its_token_and_a_restart_resumes_at_the_cursor() {
    use gateway::audit::export::{Exporter, Settings, Sink, Source};
    use std::sync::Arc;
    let work = tempfile::tempdir().expect("work");
    let out = work.path().join("receiver");
    std::fs::create_dir_all(&out).expect("out");
    let port = free_port();
    let token = "export-token-8f1c2d9e7a";
    let _siem = receiver(port, &out, Some(token));
    let log_path = work.path().join("audit.jsonl");
    let log = gateway::audit::AuditLog::open(&log_path).expect("log");
    for i in 0..25 {
        log.append(&format!("req-{i}"), "tool.request", json!({"i": i}))
            .expect("append");
    }
    let cursor = work.path().join("siem.cursor");
    let exporter = |token: &str| Exporter {
        name: "siem".into(),
        source: Arc::new(Source::file(log_path.clone(), cursor.clone())),
        sink: Sink::new(
            "jsonl",
            &format!("http://127.0.0.1:{port}/ingest"),
            Some(token.to_string()),
            None,
        )
        .expect("sink"),
        signer: None,
        settings: Arc::new(Settings::default),
    };
    let settings = Settings {
        batch_events: 10,
        ..Settings::default()
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let received = || lines(&out.join("export-jsonl.jsonl"));
    // The wrong token: refused, nothing moves.
    let err = rt
        .block_on(exporter("not-the-token").round(&settings))
        .expect_err("refused");
    assert!(err.to_string().contains("401"), "{err}");
    assert!(!err.to_string().contains("not-the-token"), "{err}");
    assert!(!cursor.exists());
    assert!(received().is_empty());
    // The right one: three batches (10, 10, 5), each with its checkpoint.
    let x = exporter(token);
    while rt.block_on(x.round(&settings)).expect("sent") {}
    let got = received();
    assert_eq!(got.iter().filter(|r| r["kind"] == "event").count(), 25);
    assert_eq!(got.iter().filter(|r| r["kind"] == "checkpoint").count(), 3);
    // More events, and a new exporter: it goes on from the cursor.
    for i in 25..30 {
        log.append(&format!("req-{i}"), "tool.request", json!({"i": i}))
            .expect("append");
    }
    let x = exporter(token);
    while rt.block_on(x.round(&settings)).expect("sent") {}
    let got = received();
    let seqs: Vec<u64> = got
        .iter()
        .filter(|r| r["kind"] == "event")
        .filter_map(|r| r["seq"].as_u64())
        .collect();
    assert_eq!(
        seqs,
        (1..=30).collect::<Vec<_>>(),
        "each event once, in order"
    );
    let text: String = got.iter().map(|r| format!("{r}\n")).collect();
    let report = gateway::audit::export::verify_export(&text, &Default::default());
    assert_eq!(report.failure, None);
    assert_eq!(report.events, 30);
}

/// The team's chain as the export's source (SQLite here; the cursor's
/// primitives are in the store conformance suite on PostgreSQL too): two
/// replicas run the exporter in turn; the one holding the export sends,
/// the other waits, and the sink gets each event once, in order.
#[test]
fn replicas_export_the_shared_chain_in_turn_each_event_once() {
    use gateway::audit::export::{Exporter, Settings, Sink, Source};
    use gateway::audit::shared::SharedChain;
    use std::sync::Arc;
    let work = tempfile::tempdir().expect("work");
    let out = work.path().join("receiver");
    let siem = otlp::Receiver::start(None, &out, Some("t0ken-0123456789"));
    let db = work.path().join("chain.db");
    let log = gateway::audit::AuditLog::shared(SharedChain::sqlite(&db).expect("chain"));
    for i in 0..12 {
        log.append(&format!("req-{i}"), "tool.request", json!({"i": i}))
            .expect("append");
    }
    let replica = |me: &str| Exporter {
        name: "siem".into(),
        source: Arc::new(Source::Chain {
            chain: SharedChain::sqlite(&db).expect("chain"),
            me: me.into(),
        }),
        sink: Sink::new(
            "jsonl",
            &format!("{}/ingest", siem.url()),
            Some("t0ken-0123456789".into()),
            None,
        )
        .expect("sink"),
        signer: None,
        settings: Arc::new(Settings::default),
    };
    let (a, b) = (replica("a"), replica("b"));
    let settings = Settings {
        batch_events: 5,
        ..Settings::default()
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    // A claims the export and sends; B, in between, sends nothing.
    assert!(rt.block_on(a.round(&settings)).expect("a"));
    assert!(!rt.block_on(b.round(&settings)).expect("b waits"));
    while rt.block_on(a.round(&settings)).expect("a") {}
    assert!(!rt.block_on(b.round(&settings)).expect("b waits"));
    let got = lines(&out.join("export-jsonl.jsonl"));
    let seqs: Vec<u64> = got
        .iter()
        .filter(|r| r["kind"] == "event")
        .filter_map(|r| r["seq"].as_u64())
        .collect();
    assert_eq!(seqs, (1..=12).collect::<Vec<_>>());
    let text: String = got.iter().map(|r| format!("{r}\n")).collect();
    let report = gateway::audit::export::verify_export(&text, &Default::default());
    assert_eq!((report.failure, report.events), (None, 12));
}
