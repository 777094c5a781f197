//! An upstream MCP server's call through the gateway, against calling the
//! same server directly, in the same run (real policy, audit, gVisor):
//! - `upstream/direct_call`: the step runner on the host, outside any
//!   sandbox, starting the hostile test server (tests/upstreams/
//!   hostile_server.py, Python's standard library only) and making the
//!   same exchange (initialize, tools/list, tools/call `echo`): what a
//!   client that starts the server itself pays;
//! - `upstream/allowed_call`: `hostile.echo` through the pipeline: the
//!   schema check, the decision, the audit, a gVisor sandbox for the call
//!   and the same exchange inside it;
//! - `upstream/denied_call`: `hostile.echo` with arguments its locked
//!   schema refuses: checked, decided, audited, nothing started.
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
            "hostile:\n  command: [/usr/bin/python3, {server}]\n  read_only: [/usr, /lib, /lib64, {server}]\n  default_tier: low\n",
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
    let call = |params: serde_json::Value| ToolCall {
        trace: None,
        tool: "hostile.echo".into(),
        params,
        principal: principal.clone(),
        workspace: None,
    };

    // The direct call: the same step, run by the same runner, on the host.
    let lock: serde_json::Value = serde_json::from_slice(
        &std::fs::read(policies.path().join("config/upstream_lock/data.json")).expect("lock"),
    )
    .expect("lock json");
    let definition = lock["hostile"]["tools"]["echo"]["definition"].clone();
    let steps = json!([{
        "argv": ["/usr/bin/python3", server],
        "mcp": {"max_bytes": 1048576, "timeout_ms": 60000,
                "call": {"name": "echo", "arguments": {"text": "hi"}, "definition": definition}}
    }]);
    let steps_file = home.path().join("direct-steps.json");
    std::fs::write(&steps_file, serde_json::to_vec(&steps).expect("steps")).expect("write");
    let direct = || {
        let out = std::process::Command::new(runner(&repo))
            .arg("exec")
            .arg(&steps_file)
            .output()
            .expect("runner");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("report");
        assert_eq!(report["result"]["content"][0]["text"], "hi", "{report}");
    };

    let mut g = c.benchmark_group("upstream");
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(30));
    g.bench_function("direct_call", |b| b.iter(direct));
    g.bench_function("allowed_call", |b| {
        b.iter(|| {
            let r = rt
                .block_on(pipeline.call(call(json!({"text": "hi"}))))
                .expect("call");
            match r.outcome {
                Outcome::Completed {
                    ok: true, summary, ..
                } => assert_eq!(summary, "hi"),
                other => panic!("{other:?}"),
            }
        })
    });
    g.finish();
    let mut g = c.benchmark_group("upstream");
    g.measurement_time(Duration::from_secs(10));
    g.bench_function("denied_call", |b| {
        b.iter(|| {
            let r = rt
                .block_on(pipeline.call(call(json!({"text": "x".repeat(101)}))))
                .expect("call");
            assert!(
                matches!(r.outcome, Outcome::Denied { .. }),
                "{:?}",
                r.outcome
            );
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
