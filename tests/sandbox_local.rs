//! The local backend against real gVisor (`runsc`, ptrace platform): the
//! kernel is gVisor's, the network is none or exactly the allowed endpoints,
//! the filesystem is read-only but for the working dir, limits and the
//! deadline hold, and nothing is left behind — also on cancellation.
//!
//! The command inside is the static busybox from Debian's busybox-static
//! (installed by scripts/bootstrap.sh), bind-mounted read-only.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gateway::sandbox::local::{LocalConfig, LocalSandbox};
use gateway::sandbox::{
    Bind, Ended, Endpoint, Limits, Network, Sandbox, SandboxRequest, SecretFile,
};

const BUSYBOX: &str = "/bin/busybox";

fn sandbox() -> LocalSandbox {
    LocalSandbox::new(LocalConfig::default())
        .expect("runsc is installed (scripts/bootstrap.sh) and we are root")
}

fn request(name: &str, script: &str) -> SandboxRequest {
    SandboxRequest {
        name: format!("t-{name}-{}", std::process::id()),
        argv: vec![BUSYBOX.into(), "sh".into(), "-c".into(), script.into()],
        env: vec![],
        binds: vec![Bind {
            host: BUSYBOX.into(),
            inside: BUSYBOX.into(),
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

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn assert_clean(sb: &LocalSandbox, name: &str) {
    let state: Vec<_> = std::fs::read_dir(sb.state_dir())
        .expect("state dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert!(
        !state.iter().any(|n| n.to_string_lossy().contains(name)),
        "runsc state left for {name}: {state:?}"
    );
    let bundles: Vec<_> = std::fs::read_dir(sb.bundles_dir())
        .expect("bundles")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert!(
        !bundles
            .iter()
            .any(|n| n.to_string_lossy().starts_with(name)),
        "bundle left: {bundles:?}"
    );
    let ps = std::process::Command::new("ps")
        .args(["-eo", "args"])
        .output()
        .expect("ps");
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(
        !ps.lines().any(|l| l.contains("runsc") && l.contains(name)),
        "runsc process left for {name}:\n{ps}"
    );
    let ns = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip");
    let hash = {
        use sha2::Digest;
        hex::encode(&sha2::Sha256::digest(name.as_bytes())[..4])
    };
    assert!(
        !String::from_utf8_lossy(&ns.stdout).contains(&hash),
        "netns left for {name}"
    );
    for controller in ["cpuacct", "memory", "cpu"] {
        let cg = Path::new("/sys/fs/cgroup")
            .join(controller)
            .join("gateway")
            .join(name);
        assert!(!cg.exists(), "cgroup left: {}", cg.display());
    }
}

#[test]
fn the_sandbox_reports_the_gvisor_kernel_not_the_hosts() {
    let sb = sandbox();
    let req = request(
        "kernel",
        "/bin/busybox uname -r; /bin/busybox dmesg 2>/dev/null | /bin/busybox head -1",
    );
    let name = req.name.clone();
    let r = rt().block_on(sb.run(req)).expect("run");
    assert!(r.success(), "{r:?}");
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("host kernel");
    let inside = r.stdout.text();
    assert_ne!(
        inside.lines().next().unwrap_or("").trim(),
        host.trim(),
        "same kernel as the host"
    );
    assert!(
        inside.contains("gVisor") || inside.starts_with("4.4.0"),
        "{inside}"
    );
    assert_clean(&sb, &name);
}

fn serve(listener: TcpListener, reply: &'static str) {
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut c = conn;
            let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
            let mut buf = [0u8; 64];
            let _ = c.read(&mut buf);
            let _ = c.write_all(reply.as_bytes());
        }
    });
}

fn host_ip() -> String {
    // The address of the host's default interface: what a sandbox with a
    // network would try to reach.
    let out = std::process::Command::new("ip")
        .args(["-4", "route", "get", "1.1.1.1"])
        .output()
        .expect("ip");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.split_whitespace()
        .skip_while(|w| *w != "src")
        .nth(1)
        .unwrap_or("127.0.0.1")
        .to_string()
}

#[test]
fn without_endpoints_nothing_is_reachable() {
    let sb = sandbox();
    let l = TcpListener::bind("0.0.0.0:0").expect("listen");
    let port = l.local_addr().expect("addr").port();
    serve(l, "SECRET-HOST-SERVICE\n");
    let script = format!(
        "for h in {} 127.0.0.1 10.201.0.1; do echo x | /bin/busybox nc -w 2 $h {port} && echo REACHED-$h || echo FAILED-$h; done",
        host_ip()
    );
    let req = request("nonet", &script);
    let name = req.name.clone();
    let r = rt().block_on(sb.run(req)).expect("run");
    let out = r.stdout.text();
    assert!(
        !out.contains("REACHED") && !out.contains("SECRET-HOST-SERVICE"),
        "{out}\n{}",
        r.stderr.text()
    );
    // Not vacuous: the probe ran and each connection attempt failed.
    assert_eq!(
        out.matches("FAILED-").count(),
        3,
        "{out}\n{}",
        r.stderr.text()
    );
    assert_clean(&sb, &name);
}

#[test]
fn an_allowed_endpoint_is_reachable_and_nothing_else() {
    let sb = sandbox();
    let allowed = TcpListener::bind("0.0.0.0:0").expect("listen");
    let other = TcpListener::bind("0.0.0.0:0").expect("listen");
    let (ap, op) = (
        allowed.local_addr().expect("a").port(),
        other.local_addr().expect("o").port(),
    );
    serve(allowed, "ALLOWED-OK\n");
    serve(other, "OTHER-REACHED\n");
    let script = format!(
        "echo x | /bin/busybox nc -w 3 ${{GATEWAY_ENDPOINT_KUBE_APISERVER%:*}} {ap}; echo x | /bin/busybox nc -w 3 ${{GATEWAY_ENDPOINT_KUBE_APISERVER%:*}} {op}; echo x | /bin/busybox nc -w 3 {} {ap}; echo done",
        host_ip()
    );
    let mut req = request("endpoints", &script);
    req.network = Network::Endpoints(vec![Endpoint {
        name: "kube-apiserver".into(),
        port: ap,
    }]);
    let name = req.name.clone();
    let r = rt().block_on(sb.run(req)).expect("run");
    let out = r.stdout.text();
    assert!(
        out.contains("ALLOWED-OK"),
        "allowed endpoint reachable: {out}\n{}",
        r.stderr.text()
    );
    assert_eq!(
        out.matches("ALLOWED-OK").count(),
        1,
        "the host's other address is not allowed: {out}"
    );
    assert!(
        !out.contains("OTHER-REACHED"),
        "a second port on the same host is blocked: {out}"
    );
    assert!(r.endpoints["kube-apiserver"].ends_with(&format!(":{ap}")));
    assert_clean(&sb, &name);
}

#[test]
fn only_the_working_dir_is_writable_and_host_files_are_invisible() {
    let sb = sandbox();
    let home = tempfile::tempdir().expect("home");
    std::fs::write(home.path().join("audit.jsonl"), "host-state-secret").expect("write");
    let work = tempfile::tempdir().expect("work");
    std::fs::write(work.path().join("main.tf"), "# module").expect("write");
    let script = format!(
        "cat {h}/audit.jsonl; cat /root/.bashrc; cat /etc/shadow; ls /home; \
         touch /etc/x && echo WROTE-ETC; touch /x && echo WROTE-ROOT; touch /run/gateway/x && echo WROTE-RUN; \
         touch /bin/x && echo WROTE-BIN; echo hello > /work/out.txt && echo WROTE-WORK; echo tmp > /tmp/t && echo WROTE-TMP; \
         id -u; cat /work/main.tf; cat /run/gateway/credential; ls -ln /run/gateway/credential; env",
        h = home.path().display()
    );
    let script = script
        .replace("cat ", "/bin/busybox cat ")
        .replace("ls ", "/bin/busybox ls ")
        .replace("touch ", "/bin/busybox touch ")
        .replace("id ", "/bin/busybox id ")
        .replace("env", "/bin/busybox env");
    let mut req = request("fs", &script);
    req.workdir = Some(work.path().to_path_buf());
    req.credential = Some(SecretFile::new(b"minted-token-value".to_vec()));
    req.files_out = vec!["out.txt".into()];
    let name = req.name.clone();
    let r = rt().block_on(sb.run(req)).expect("run");
    let out = r.stdout.text();
    for bad in [
        "host-state-secret",
        "WROTE-ETC",
        "WROTE-ROOT",
        "WROTE-RUN",
        "WROTE-BIN",
    ] {
        assert!(!out.contains(bad), "{bad} in {out}");
    }
    assert!(
        out.contains("WROTE-WORK") && out.contains("WROTE-TMP"),
        "{out}\n{}",
        r.stderr.text()
    );
    assert!(out.contains("65534"), "runs as nobody: {out}");
    assert!(out.contains("# module"));
    assert!(
        out.contains("minted-token-value"),
        "the credential file is readable by the tool"
    );
    assert!(out.contains("-r--------"), "credential mode 0400: {out}");
    assert!(
        !out.lines().any(|l| l.contains("=minted-token-value")),
        "never in the environment"
    );
    assert_eq!(
        r.files_out
            .get("out.txt")
            .map(|b| String::from_utf8_lossy(b).to_string()),
        Some("hello\n".into())
    );
    assert_eq!(
        std::fs::read_to_string(work.path().join("out.txt")).expect("written on the host"),
        "hello\n"
    );
    assert_clean(&sb, &name);
}

#[test]
fn limits_and_the_deadline_stop_runaway_commands_and_the_host_stays_healthy() {
    let sb = sandbox();
    let rt = rt();
    let mut hog = request(
        "memhog",
        "a=xxxxxxxxxxxxxxxx; while true; do a=\"$a$a\"; done",
    );
    hog.limits.memory_bytes = 256 << 20;
    let r = rt.block_on(sb.run(hog)).expect("run");
    assert!(!r.success(), "{r:?}");
    assert_ne!(
        r.ended,
        Ended::Deadline,
        "stopped by the memory limit, not the deadline: {r:?}"
    );

    let mut bomb = request(
        "forkbomb",
        "i=0; while [ $i -lt 1000 ]; do /bin/busybox sleep 60 & i=$((i+1)); done; echo all-forked",
    );
    bomb.limits.max_processes = 64;
    let r = rt.block_on(sb.run(bomb)).expect("run");
    assert!(!r.stdout.text().contains("all-forked"), "{r:?}");
    assert!(
        r.stderr.text().contains("can't fork"),
        "stopped by the process limit: {r:?}"
    );

    let mut sleeper = request("sleeper", "/bin/busybox sleep 600");
    sleeper.deadline = Duration::from_secs(2);
    let name = sleeper.name.clone();
    let started = std::time::Instant::now();
    let r = rt.block_on(sb.run(sleeper)).expect("run");
    assert_eq!(r.ended, Ended::Deadline);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "killed near its deadline"
    );
    assert_clean(&sb, &name);

    let mut cpu = request("cpuhog", "while true; do :; done");
    cpu.limits.cpu_seconds = 1;
    let r = rt.block_on(sb.run(cpu)).expect("run");
    assert!(
        matches!(&r.ended, Ended::Limit(l) if l.starts_with("CPU time")),
        "{r:?}"
    );
    assert!(r.duration_ms < 10_000, "stopped near its CPU limit: {r:?}");

    let mut noisy = request(
        "noisy",
        "i=0; while [ $i -lt 5000 ]; do echo 0123456789abcdef; i=$((i+1)); done",
    );
    noisy.limits.output_bytes = 1000;
    let r = rt.block_on(sb.run(noisy)).expect("run");
    assert!(
        r.stdout.truncated && r.stdout.bytes.len() == 1000,
        "{}",
        r.stdout.bytes.len()
    );
    assert!(r.stdout.text().ends_with("output limit …]"));

    // The host is fine: a normal sandbox still runs.
    let r = rt
        .block_on(sb.run(request("after", "echo healthy")))
        .expect("run");
    assert!(r.success() && r.stdout.text().contains("healthy"));
}

#[test]
fn cancelling_a_call_kills_and_removes_its_sandbox() {
    let sb = sandbox();
    let rt = rt();
    let req = request("cancel", "/bin/busybox sleep 600");
    let name = req.name.clone();
    let cancelled =
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(2), sb.run(req)).await });
    assert!(
        cancelled.is_err(),
        "the call was still running when cancelled"
    );
    assert_clean(&sb, &name);
}

#[test]
fn a_missing_runsc_is_a_clear_error_never_a_fallback() {
    let err = LocalSandbox::new(LocalConfig {
        runsc: Some(PathBuf::from("/nonexistent/runsc")),
        ..LocalConfig::default()
    })
    .expect_err("refused");
    let msg = err.to_string();
    assert!(msg.contains("apt-get install runsc"), "{msg}");
    assert!(msg.contains("never runs a tool outside a sandbox"), "{msg}");
}
