//! An upstream MCP server's call through the gateway, against calling the
//! same server directly, in the same run (real policy, audit, gVisor):
//! - `upstream/direct_call`: the hostile test server (tests/upstreams/
//!   hostile_server.py, Python's standard library only) started once on
//!   the host, outside any sandbox, and a `tools/call` of `echo` sent over
//!   its pipes: what a client that keeps the server running pays;
//! - `upstream/allowed_call`: `warm.echo` through the pipeline, the same
//!   server declared `warm: true`: the schema check, the decision, the
//!   audit, and the call in the server's long-lived gVisor sandbox (the
//!   runner lists the tools to compare the live definition with the lock,
//!   then calls);
//! - `upstream/cold_call`: `hostile.echo`, the same server without
//!   `warm`: a gVisor sandbox and the server's start for the call;
//! - `upstream/denied_call`: `warm.echo` with arguments its locked schema
//!   refuses: checked, decided, audited, nothing started.
//!
//! `allowed_call - direct_call` is what the gateway adds. Run as root:
//! `cargo bench --bench upstream`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use gateway::pipeline::{Outcome, Pipeline, ToolCall};
use gateway::policy::set::LoadOptions;
use gateway::policy::{PolicyStore, Principal};
use gateway::sandbox::local::{LocalConfig, LocalSandbox};
use gateway::tools::ToolPaths;
use serde_json::json;

fn copy_dir(from: &Path, to: &Path) {
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

fn runner(repo: &Path) -> PathBuf {
    let release = repo.join("target/release/gateway-runner");
    if release.is_file() {
        release
    } else {
        repo.join("target/debug/gateway-runner")
    }
}

fn gateway_bin(repo: &Path) -> PathBuf {
    let release = repo.join("target/release/gateway");
    if release.is_file() {
        release
    } else {
        repo.join("target/debug/gateway")
    }
}

fn bench(c: &mut Criterion) {
    gateway::quiet_library_backtraces();
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let server = repo.join("tests/upstreams/hostile_server.py");
    let home = tempfile::tempdir().expect("home");
    let workspace = tempfile::tempdir().expect("workspace");
    let policies = tempfile::tempdir().expect("policies");
    copy_dir(&repo.join("policies"), policies.path());
    // The bench's user may make as many calls a minute as it likes.
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
    std::fs::write(
        policies.path().join("config/upstreams/data.yaml"),
        format!(
            "hostile:\n  command: [/usr/bin/python3, {server}]\n  read_only: [/usr, /lib, /lib64, {server}]\n  default_tier: low\nwarm:\n  command: [/usr/bin/python3, {server}]\n  read_only: [/usr, /lib, /lib64, {server}]\n  default_tier: low\n  warm: true\n",
            server = server.display()
        ),
    )
    .expect("upstreams");
    let out = std::process::Command::new(gateway_bin(&repo))
        .arg("--policies")
        .arg(policies.path())
        .arg("--home")
        .arg(home.path())
        .args(["upstream", "lock", "--all"])
        .output()
        .expect("gateway upstream lock");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let policy = Arc::new(PolicyStore::open(
        vec![policies.path().to_path_buf()],
        LoadOptions::default(),
    ));
    let sandbox = Arc::new(LocalSandbox::new(LocalConfig::default()).expect("runsc, as root"));
    let mut tools = ToolPaths::discover(&repo);
    tools.runner = runner(&repo);
    let pipeline = Arc::new(
        Pipeline::new(
            Arc::clone(&policy),
            home.path().to_path_buf(),
            workspace.path().to_path_buf(),
            sandbox,
            tools,
        )
        .expect("pipeline"),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("rt");
    let principal = Principal::os_user("bench".into(), "bench".into(), 1000, vec![]);
    let call = |tool: &str, params: serde_json::Value| ToolCall {
        trace: None,
        tool: tool.into(),
        params,
        principal: principal.clone(),
        workspace: None,
    };

    // The direct call: the same server kept running on the host, a
    // tools/call over its pipes.
    use std::io::{BufRead, Write};
    let mut direct_server = std::process::Command::new("/usr/bin/python3")
        .arg(&server)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3");
    let mut to = direct_server.stdin.take().expect("stdin");
    let mut from = std::io::BufReader::new(direct_server.stdout.take().expect("stdout"));
    let mut id = 0u64;
    let mut rpc = |method: &str, params: serde_json::Value| -> serde_json::Value {
        id += 1;
        let mut line = serde_json::to_vec(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
        .expect("json");
        line.push(b'\n');
        to.write_all(&line).expect("write");
        to.flush().expect("flush");
        loop {
            let mut got = String::new();
            assert!(
                from.read_line(&mut got).expect("read") > 0,
                "the server ended"
            );
            let v: serde_json::Value = serde_json::from_str(&got).expect("json");
            if v["id"] == json!(id) {
                return v;
            }
        }
    };
    rpc(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}),
    );

    let mut g = c.benchmark_group("upstream");
    g.sample_size(50);
    g.measurement_time(Duration::from_secs(10));
    g.bench_function("direct_call", |b| {
        b.iter(|| {
            let r = rpc(
                "tools/call",
                json!({"name": "echo", "arguments": {"text": "hi"}}),
            );
            assert_eq!(r["result"]["content"][0]["text"], "hi", "{r}");
        })
    });
    let through = |tool: &str| {
        let r = rt
            .block_on(pipeline.call(call(tool, json!({"text": "hi"}))))
            .expect("call");
        match r.outcome {
            Outcome::Completed {
                ok: true, summary, ..
            } => assert_eq!(summary, "hi"),
            other => panic!("{other:?}"),
        }
    };
    // The warm sandbox started outside the measurement.
    through("warm.echo");
    g.bench_function("allowed_call", |b| b.iter(|| through("warm.echo")));
    g.finish();
    let mut g = c.benchmark_group("upstream");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(20));
    g.bench_function("cold_call", |b| b.iter(|| through("hostile.echo")));
    g.finish();
    let mut g = c.benchmark_group("upstream");
    g.measurement_time(Duration::from_secs(10));
    g.bench_function("denied_call", |b| {
        b.iter(|| {
            let r = rt
                .block_on(pipeline.call(call("warm.echo", json!({"text": "x".repeat(101)}))))
                .expect("call");
            assert!(
                matches!(r.outcome, Outcome::Denied { .. }),
                "{:?}",
                r.outcome
            );
        })
    });
    g.finish();
    pipeline.warm_upstreams.stop_all();
    let _ = direct_server.kill();
    let _ = direct_server.wait();
}

criterion_group!(benches, bench);
criterion_main!(benches);
