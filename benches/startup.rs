//! Cold start of an agent's session, as an MCP client sees it: from
//! spawning `gateway serve` to the answer of its first `tools/list`
//! (`startup/serve_to_tools_list`). Each iteration is a new process: it
//! connects to the daemon's socket, says which workspace it is for, and
//! relays `initialize`, `notifications/initialized` and `tools/list`; the
//! daemon (started once, as root, from a temporary configuration, as the
//! daemon tests do) answers with the tools the policy lets this user see.
//!
//! Run as root: `cargo bench --bench startup`.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/support/daemon.rs"]
mod daemon;

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;

use criterion::{Criterion, criterion_group, criterion_main};

fn first_tools_list(socket: &std::path::Path, workspace: &std::path::Path) -> usize {
    let mut child = common::serve_command(socket, workspace)
        .stderr(Stdio::inherit())
        .spawn()
        .expect("gateway serve");
    let mut to = child.stdin.take().expect("stdin");
    let mut from = BufReader::new(child.stdout.take().expect("stdout"));
    let messages = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    ];
    for m in messages {
        writeln!(to, "{m}").expect("write");
    }
    to.flush().expect("flush");
    let mut line = String::new();
    let tools = loop {
        line.clear();
        let n = from.read_line(&mut line).expect("read");
        assert!(n > 0, "gateway serve ended before answering tools/list");
        let v: serde_json::Value = serde_json::from_str(&line).expect("JSON-RPC");
        if v["id"] == 2 {
            break v["result"]["tools"].as_array().map_or(0, Vec::len);
        }
    };
    drop(to);
    let _ = child.wait();
    tools
}

fn bench(c: &mut Criterion) {
    daemon::os_user(daemon::AGENT);
    let d = daemon::Daemon::start(&common::repo().join("policies"), "");
    let workspace = tempfile::tempdir().expect("workspace");
    // Every tool of the default catalog (its top-level keys).
    let catalog = std::fs::read_to_string(common::repo().join("policies/config/tools/data.yaml"))
        .expect("catalog");
    let tools = catalog
        .lines()
        .filter(|l| l.ends_with(':') && l.starts_with(|c: char| c.is_ascii_lowercase()))
        .count();
    assert!(tools >= 3, "{tools}");
    assert_eq!(first_tools_list(&d.socket, workspace.path()), tools);
    let mut g = c.benchmark_group("startup");
    g.sample_size(30);
    g.bench_function("serve_to_tools_list", |b| {
        b.iter(|| first_tools_list(&d.socket, workspace.path()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
