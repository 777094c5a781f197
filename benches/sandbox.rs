//! Per-call sandbox overhead on real gVisor (ptrace platform):
//! - `sandbox/gateway_true`: the gateway's local backend running `true`
//!   start to exit (bundle, runsc run, cgroup watch, cleanup);
//! - `sandbox/bare_runsc_true`: bare `runsc run` + `runsc delete` of the
//!   same bundle, written once.
//!
//! Run as root: `cargo bench --bench sandbox`. The ratio of the two is the
//! gateway's own cost per sandbox.

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use gateway::sandbox::local::{LocalConfig, LocalSandbox};
use gateway::sandbox::{Bind, Limits, Network, Sandbox, SandboxRequest};

fn request(name: String) -> SandboxRequest {
    SandboxRequest {
        name,
        argv: vec!["/bin/busybox".into(), "true".into()],
        env: vec![],
        binds: vec![Bind {
            host: "/bin/busybox".into(),
            inside: "/bin/busybox".into(),
            writable: false,
        }],
        workdir: None,
        files_in: vec![],
        credential: None,
        limits: Limits::default(),
        deadline: Duration::from_secs(30),
        network: Network::None,
        files_out: vec![],
        on_stderr_line: None,
        image: None,
    }
}

fn bench(c: &mut Criterion) {
    let sb = LocalSandbox::new(LocalConfig::default()).expect("runsc, as root");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("rt");
    let mut g = c.benchmark_group("sandbox");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    let mut i = 0u64;
    g.bench_function("gateway_true", |b| {
        b.iter(|| {
            i += 1;
            let r = rt
                .block_on(sb.run(request(format!("bench-gw-{i}"))))
                .expect("run");
            assert!(r.success());
        })
    });

    let dir = tempfile::tempdir().expect("tmp");
    sb.write_bundle_for_bench(&request("bench-bare".into()), dir.path())
        .expect("bundle");
    let state = tempfile::tempdir().expect("state");
    let mut j = 0u64;
    g.bench_function("bare_runsc_true", |b| {
        b.iter(|| {
            j += 1;
            let name = format!("bench-bare-{j}");
            let s = std::process::Command::new("runsc")
                .arg("--root")
                .arg(state.path())
                .args([
                    "--network",
                    "none",
                    "--platform",
                    "ptrace",
                    "--oci-seccomp",
                    "run",
                    "--bundle",
                ])
                .arg(dir.path())
                .arg(&name)
                .status()
                .expect("runsc");
            assert!(s.success());
            let _ = std::process::Command::new("runsc")
                .arg("--root")
                .arg(state.path())
                .args(["delete", "--force", &name])
                .status();
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
