//! `gateway verify` for the local backend: prove the isolation claims by
//! running probes in real sandboxes, not by reading configuration.
//!
//! The probe is the static busybox from Debian's busybox-static.

pub mod kubernetes;
pub mod workload;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::sandbox::local::LocalSandbox;
use crate::sandbox::{Bind, Ended, Endpoint, Limits, Network, Sandbox, SandboxRequest};

pub const PROBE: &str = "/bin/busybox";

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub pass: bool,
    pub detail: String,
}

fn probe(name: &str, script: &str) -> SandboxRequest {
    SandboxRequest {
        name: format!("verify-{name}-{}", std::process::id()),
        argv: vec![PROBE.into(), "sh".into(), "-c".into(), script.into()],
        env: vec![("PATH".into(), "/bin".into())],
        binds: vec![Bind {
            host: PROBE.into(),
            inside: PROBE.into(),
            writable: false,
        }],
        workdir: None,
        files_in: vec![],
        credential: None,
        limits: Limits::default(),
        deadline: Duration::from_secs(60),
        network: Network::None,
        files_out: vec![],
        on_stderr_line: None,
        image: None,
    }
}

/// busybox applets by absolute path (there is no shell PATH lookup to rely on).
fn bb(script: &str) -> String {
    let mut s = script.to_string();
    for applet in ["uname", "cat", "ls", "touch", "nc", "sleep", "id"] {
        s = s.replace(&format!("{applet} "), &format!("{PROBE} {applet} "));
    }
    s
}

/// A TCP server answering `reply` to every connection, until the process ends.
fn serve(reply: &'static str) -> std::io::Result<u16> {
    let l = TcpListener::bind("0.0.0.0:0")?;
    let port = l.local_addr()?.port();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
            let mut buf = [0u8; 64];
            let _ = c.read(&mut buf);
            let _ = c.write_all(reply.as_bytes());
        }
    });
    Ok(port)
}

fn host_ip() -> String {
    let out = std::process::Command::new("ip")
        .args(["-4", "route", "get", "1.1.1.1"])
        .output();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    text.split_whitespace()
        .skip_while(|w| *w != "src")
        .nth(1)
        .unwrap_or("127.0.0.1")
        .to_string()
}

async fn run(
    sb: &LocalSandbox,
    req: SandboxRequest,
) -> Result<crate::sandbox::SandboxResult, String> {
    sb.run(req).await.map_err(|e| e.to_string())
}

/// The tools a call runs and the limits it gets, for the workload checks.
pub struct Workload {
    pub tools: crate::tools::ToolPaths,
    pub limits: (Limits, Duration, String),
    pub terraform_runs: usize,
}

/// Run every check; each is independent.
pub async fn verify_local(sb: &LocalSandbox, home: &Path, work: &Workload) -> Vec<Check> {
    if !Path::new(PROBE).is_file() {
        return vec![Check {
            name: "probe",
            pass: false,
            detail: format!(
                "{PROBE} is missing: install it with `sudo apt-get install busybox-static`"
            ),
        }];
    }
    vec![
        kernel(sb).await,
        egress_blocked(sb).await,
        allowed_endpoint(sb).await,
        filesystem(sb, home).await,
        limits(sb).await,
        workload::terraform(sb, &work.tools, &work.limits, work.terraform_runs).await,
        workload::kubectl(sb, &work.tools, &work.limits).await,
    ]
}

async fn kernel(sb: &LocalSandbox) -> Check {
    let name = "1. the sandbox runs gVisor's kernel, not the host's";
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    match run(sb, probe("kernel", &bb("uname -r; uname -v"))).await {
        Ok(r) => {
            let out = r.stdout.text();
            let inside = out.lines().next().unwrap_or("").trim().to_string();
            Check {
                name,
                pass: r.success() && !inside.is_empty() && inside != host,
                detail: format!(
                    "sandbox kernel {inside:?} ({}), host kernel {host:?}",
                    out.lines().nth(1).unwrap_or("").trim()
                ),
            }
        }
        Err(e) => Check {
            name,
            pass: false,
            detail: e,
        },
    }
}

async fn egress_blocked(sb: &LocalSandbox) -> Check {
    let name = "2. egress is blocked: a server on the host is unreachable from a default sandbox";
    let port = match serve("HOST-SERVICE-REACHED\n") {
        Ok(p) => p,
        Err(e) => {
            return Check {
                name,
                pass: false,
                detail: format!("cannot start the test server: {e}"),
            };
        }
    };
    let targets = [host_ip(), "127.0.0.1".into(), "10.201.0.1".into()];
    let script = targets
        .iter()
        .map(|h| format!("echo x | nc -w 2 {h} {port} && echo CONNECTED-{h} || echo FAILED-{h}; "))
        .collect::<String>();
    match run(sb, probe("egress", &bb(&script))).await {
        Ok(r) => {
            let out = r.stdout.text();
            Check {
                name,
                // Every attempt must have run and failed: a probe that did
                // not run proves nothing.
                pass: !out.contains("HOST-SERVICE-REACHED")
                    && !out.contains("CONNECTED")
                    && out.matches("FAILED-").count() == targets.len(),
                detail: format!(
                    "tried {} on port {port}: {}",
                    targets.join(", "),
                    if out.contains("CONNECTED") {
                        out.trim().to_string()
                    } else {
                        format!(
                            "{} of {} attempts failed",
                            out.matches("FAILED-").count(),
                            targets.len()
                        )
                    }
                ),
            }
        }
        Err(e) => Check {
            name,
            pass: false,
            detail: e,
        },
    }
}

async fn allowed_endpoint(sb: &LocalSandbox) -> Check {
    let name = "3. an allowed endpoint is reachable; another port on the same host is not";
    let (Ok(allowed), Ok(other)) = (serve("ALLOWED-ENDPOINT\n"), serve("OTHER-PORT-REACHED\n"))
    else {
        return Check {
            name,
            pass: false,
            detail: "cannot start the test servers".into(),
        };
    };
    let script = format!(
        "h=${{GATEWAY_ENDPOINT_VERIFY%:*}}; echo x | nc -w 3 $h {allowed}; echo x | nc -w 3 $h {other}; echo x | nc -w 3 {} {other}; true",
        host_ip()
    );
    let mut req = probe("endpoint", &bb(&script));
    req.network = Network::Endpoints(vec![Endpoint {
        name: "verify".into(),
        port: allowed,
    }]);
    match run(sb, req).await {
        Ok(r) => {
            let out = r.stdout.text();
            let reached = out.contains("ALLOWED-ENDPOINT");
            let leaked = out.contains("OTHER-PORT-REACHED");
            Check {
                name,
                pass: reached && !leaked,
                detail: format!(
                    "allowed port {allowed}: {}; other port {other}: {}",
                    if reached {
                        "reachable"
                    } else {
                        "NOT reachable"
                    },
                    if leaked { "REACHABLE" } else { "blocked" }
                ),
            }
        }
        Err(e) => Check {
            name,
            pass: false,
            detail: e,
        },
    }
}

async fn filesystem(sb: &LocalSandbox, home: &Path) -> Check {
    let name = "4. host files are invisible and only the working dir is writable";
    let canary = home.join(format!("verify-canary-{}", std::process::id()));
    let secret = format!("canary-{}", uuid::Uuid::new_v4().simple());
    if let Err(e) = std::fs::create_dir_all(home).and_then(|_| std::fs::write(&canary, &secret)) {
        return Check {
            name,
            pass: false,
            detail: format!("cannot write the canary {}: {e}", canary.display()),
        };
    }
    let work = match tempfile::tempdir() {
        Ok(w) => w,
        Err(e) => {
            return Check {
                name,
                pass: false,
                detail: e.to_string(),
            };
        }
    };
    let script = format!(
        "cat {c}; cat /root/.bashrc; cat /etc/shadow; ls /home /root; \
         for p in /etc/x /x /bin/x /run/gateway/x /proc/x; do touch $p 2>/dev/null && echo WROTE $p; done; \
         touch /work/ok && echo WORK-WRITABLE",
        c = canary.display()
    );
    let mut req = probe("fs", &bb(&script));
    req.workdir = Some(work.path().to_path_buf());
    let result = run(sb, req).await;
    let _ = std::fs::remove_file(&canary);
    match result {
        Ok(r) => {
            let out = r.stdout.text();
            let read_canary = out.contains(&secret);
            let wrote: Vec<&str> = out.lines().filter(|l| l.starts_with("WROTE")).collect();
            let work_ok = out.contains("WORK-WRITABLE") && work.path().join("ok").exists();
            Check {
                name,
                pass: !read_canary && wrote.is_empty() && work_ok,
                detail: format!(
                    "host state file {}: {}; writes outside /work: {}; /work: {}",
                    canary.display(),
                    if read_canary { "READ" } else { "not visible" },
                    if wrote.is_empty() {
                        "all refused".to_string()
                    } else {
                        wrote.join(", ")
                    },
                    if work_ok { "writable" } else { "NOT writable" }
                ),
            }
        }
        Err(e) => Check {
            name,
            pass: false,
            detail: e,
        },
    }
}

async fn limits(sb: &LocalSandbox) -> Check {
    let name = "5. a memory hog, a fork bomb and a sleeper are stopped; the host stays healthy";
    let mut notes = Vec::new();
    let mut pass = true;
    let mut hog = probe(
        "memhog",
        "a=xxxxxxxxxxxxxxxx; while true; do a=\"$a$a\"; done",
    );
    hog.limits.memory_bytes = 256 << 20;
    match run(sb, hog).await {
        Ok(r) => {
            let ok = r.ended == Ended::Limit("memory".into());
            pass &= ok;
            notes.push(format!("memory hog: {:?}", r.ended));
        }
        Err(e) => {
            pass = false;
            notes.push(format!("memory hog: {e}"));
        }
    }
    let mut bomb = probe(
        "forkbomb",
        &bb("i=0; while [ $i -lt 1000 ]; do sleep 60 & i=$((i+1)); done; echo ALL-FORKED"),
    );
    bomb.limits.max_processes = 64;
    bomb.deadline = Duration::from_secs(30);
    match run(sb, bomb).await {
        Ok(r) => {
            let ok =
                !r.stdout.text().contains("ALL-FORKED") && r.stderr.text().contains("can't fork");
            pass &= ok;
            notes.push(format!(
                "fork bomb: {}",
                if ok {
                    "stopped at the process limit"
                } else {
                    "NOT stopped"
                }
            ));
        }
        Err(e) => {
            pass = false;
            notes.push(format!("fork bomb: {e}"));
        }
    }
    let mut sleeper = probe("sleeper", &bb("sleep 600"));
    sleeper.deadline = Duration::from_secs(2);
    let started = Instant::now();
    match run(sb, sleeper).await {
        Ok(r) => {
            let ok = r.ended == Ended::Deadline && started.elapsed() < Duration::from_secs(20);
            pass &= ok;
            notes.push(format!(
                "sleeper: {:?} after {:.1}s",
                r.ended,
                started.elapsed().as_secs_f64()
            ));
        }
        Err(e) => {
            pass = false;
            notes.push(format!("sleeper: {e}"));
        }
    }
    match run(sb, probe("healthy", "echo healthy")).await {
        Ok(r) => {
            let ok = r.success() && r.stdout.text().contains("healthy");
            pass &= ok;
            notes.push(format!("afterwards a sandbox runs: {ok}"));
        }
        Err(e) => {
            pass = false;
            notes.push(format!("afterwards: {e}"));
        }
    }
    // This check's own sandboxes only: the state dir is shared with any
    // gateway running calls on this host meanwhile.
    let mine = format!("-{}", std::process::id());
    let left = std::fs::read_dir(sb.state_dir())
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    // `verify-<probe>-<pid>`, then `_…` for runsc's own files.
                    let id = n.split('_').next().unwrap_or_default();
                    id.starts_with("verify-") && id.ends_with(&mine)
                })
                .count()
        })
        .unwrap_or(0);
    if left > 0 {
        pass = false;
        notes.push(format!(
            "{left} entries of its sandboxes left in runsc's state dir"
        ));
    }
    Check {
        name,
        pass,
        detail: notes.join("; "),
    }
}
