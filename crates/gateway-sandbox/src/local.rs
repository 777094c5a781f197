//! The local backend: each call in its own gVisor sandbox (`runsc run` with
//! an OCI bundle written here with `oci-spec`), on one Linux host.
//!
//! The bundle's root is an empty read-only directory holding only mount
//! points; what the tool needs is bind-mounted read-only at its own path
//! (its binary and the libraries it links), plus a generated minimal `/etc`,
//! a private `/tmp` (tmpfs), the working dir read-write at `/work` (the only
//! writable mount), `files_in` read-only and the credential as a 0400 file.
//! The process runs as uid 65534 with no capabilities, `no_new_privileges`,
//! rlimits for memory, processes, CPU time and file size, and an OCI seccomp
//! profile that gVisor enforces inside the sandbox (`--oci-seccomp`).
//! Network: `--network=none`, or the namespace of [`super::net`].
//! Everything is removed after the call — on success, error, deadline,
//! panic and cancellation (a guard's `Drop`): the runsc container and its
//! state, the bundle, the namespace.

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Component, Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use oci_spec::runtime::{
    LinuxBuilder, LinuxCapabilitiesBuilder, LinuxCpuBuilder, LinuxMemoryBuilder,
    LinuxNamespaceBuilder, LinuxNamespaceType, LinuxResourcesBuilder, LinuxSeccompAction,
    LinuxSeccompBuilder, LinuxSyscallBuilder, MountBuilder, PosixRlimitBuilder, PosixRlimitType,
    ProcessBuilder, RootBuilder, Spec, SpecBuilder, UserBuilder,
};
use tokio::io::AsyncReadExt;

use super::cgroups::Hierarchy;
use super::net::NetNs;
use super::{
    CREDENTIAL_PATH, Captured, Ended, FILES_IN_DIR, Network, RunFuture, SANDBOX_UID, Sandbox,
    SandboxError, SandboxRequest, SandboxResult, SandboxSession, WORKDIR, valid_name,
};

/// Syscalls refused (EPERM) inside the sandbox on top of gVisor's own
/// surface: nothing a tool needs, everything an escape attempt would.
const DENIED_SYSCALLS: &[&str] = &[
    "ptrace",
    "mount",
    "umount2",
    "unshare",
    "setns",
    "pivot_root",
    "chroot",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "kexec_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
];

/// Memory for gVisor's own sentry and gofer on top of the tool's limit.
const SENTRY_HEADROOM: u64 = 128 << 20;

/// The sandbox's cgroup, relative to each controller's root.
fn cgroup_path(name: &str) -> PathBuf {
    PathBuf::from(format!("/gateway/{name}"))
}

/// Remove what is left of the sandbox's cgroup, in every controller (v1)
/// or the unified tree (v2). `runsc delete` removes it when it knows the
/// container; a `runsc run` killed half way through creating it (the call
/// cancelled at that moment) leaves the cgroup made and no container to
/// delete. Any process still in it is killed first.
fn remove_cgroup(cgroups: &Hierarchy, name: &str) {
    let rel = cgroup_path(name);
    let rel = rel.strip_prefix("/").unwrap_or(&rel);
    for dir in cgroups.all_dirs(rel).iter().filter(|d| d.is_dir()) {
        for _ in 0..20 {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

/// Remove runsc's files for container `name` left in its state dir: a
/// `runsc run` killed while it created the container leaves its lock file
/// (`<name>_sandbox:<name>.lock`) that `runsc delete` does not know of.
fn remove_state_files(state: &Path, name: &str) {
    let prefix = format!("{name}_");
    if let Ok(entries) = std::fs::read_dir(state) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Watches the sandbox's cgroup while it runs: resolves when CPU time goes
/// over `cpu_limit`; records whether memory reached the limit (the cgroup
/// may be gone by the time the sandbox has been killed for it).
async fn watch_cgroup(
    cgroups: Arc<Hierarchy>,
    name: String,
    cpu_limit: Duration,
    memory_limit: u64,
    memory_hit: Arc<AtomicBool>,
) {
    let rel = cgroup_path(&name);
    let rel = rel.strip_prefix("/").unwrap_or(&rel).to_path_buf();
    let mut tick = 0u32;
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if let Some((peak, fails)) = cgroups.memory_pressure(&rel)
            && (fails > 0 || peak >= memory_limit / 10 * 9)
        {
            memory_hit.store(true, Ordering::Relaxed);
        }
        tick += 1;
        if tick.is_multiple_of(5) && cgroups.cpu_used(&rel).is_some_and(|used| used > cpu_limit) {
            return;
        }
    }
}

/// In each bundle: the gateway process that runs it ("PID START").
const OWNER_FILE: &str = "owner";

#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// The runsc binary (default: found on PATH).
    pub runsc: Option<PathBuf>,
    /// Where bundles and runsc state live (default: /dev/shm/gateway-sandbox
    /// when /dev/shm exists, so credential files never touch a disk).
    pub root: Option<PathBuf>,
    /// runsc platform (ptrace works everywhere; kvm where /dev/kvm exists).
    pub platform: String,
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig {
            runsc: None,
            root: None,
            platform: "ptrace".into(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct LocalSandbox {
    runsc: PathBuf,
    root: PathBuf,
    platform: String,
    cgroups: Arc<Hierarchy>,
}

impl LocalSandbox {
    /// Find and check runsc. Missing or unusable => an error naming the
    /// install command; there is no fallback to running unsandboxed.
    pub fn new(cfg: LocalConfig) -> Result<LocalSandbox, SandboxError> {
        let uid = nix::unistd::geteuid().as_raw();
        if uid != 0 {
            return Err(SandboxError::NotRoot(uid));
        }
        let runsc = match cfg.runsc {
            Some(p) => p,
            None => super::net::which("runsc")
                .ok_or_else(|| SandboxError::RunscMissing("not found on PATH".into()))?,
        };
        let out = std::process::Command::new(&runsc)
            .arg("--version")
            .output()
            .map_err(|e| SandboxError::RunscMissing(format!("{}: {e}", runsc.display())))?;
        if !out.status.success() {
            return Err(SandboxError::RunscMissing(format!(
                "{} --version failed",
                runsc.display()
            )));
        }
        let root = cfg.root.unwrap_or_else(|| {
            let shm = Path::new("/dev/shm");
            if shm.is_dir() {
                shm.join("gateway-sandbox")
            } else {
                std::env::temp_dir().join("gateway-sandbox")
            }
        });
        // Ours alone, checked (not only created): in /dev/shm anyone could
        // have made it first.
        for dir in [
            root.clone(),
            root.join("state"),
            root.join("bundles"),
            root.join("scratch"),
        ] {
            super::beneath::private_dir(&dir, 0o700, false)
                .map_err(|e| SandboxError::Setup(format!("the sandbox root: {e}")))?;
        }
        // The limits live in cgroups: a host without the controllers
        // they need cannot hold a sandbox to them, so it gets none.
        let cgroups = Hierarchy::detect();
        let missing = cgroups.missing();
        if !missing.is_empty() {
            return Err(SandboxError::Cgroups(format!(
                "the cgroup controller(s) {} that the sandbox's memory and CPU limits need are not available (cgroups: {}); {}",
                missing.join(", "),
                cgroups.describe(),
                super::cgroups::fix_for_missing(&cgroups, &missing)
            )));
        }
        let sandbox = LocalSandbox {
            runsc,
            root,
            platform: cfg.platform,
            cgroups: Arc::new(cgroups),
        };
        let reaped = sandbox.reap_leftovers();
        if !reaped.is_empty() {
            tracing::warn!(sandboxes = ?reaped, "removed sandboxes a stopped gateway left behind");
        }
        Ok(sandbox)
    }

    /// The runsc binary this sandbox runs.
    pub fn runsc(&self) -> &Path {
        &self.runsc
    }

    /// Remove every sandbox whose gateway process is gone (killed before
    /// its cleanup ran): the runsc container, the network namespace and
    /// the bundle (which may hold a credential file). Sandboxes of live
    /// gateways sharing this root are left alone. Returns the names removed.
    pub fn reap_leftovers(&self) -> Vec<String> {
        let mut reaped = Vec::new();
        let Ok(entries) = std::fs::read_dir(self.bundles_dir()) else {
            return reaped;
        };
        for entry in entries.flatten() {
            let dir = entry.path();
            let owner = std::fs::read_to_string(dir.join(OWNER_FILE))
                .ok()
                .and_then(|t| {
                    let (pid, start) = t.trim().split_once(' ')?;
                    Some(gateway_base::process::Owner {
                        pid: pid.parse().ok()?,
                        start: start.parse().ok()?,
                    })
                });
            let leftover = match owner {
                Some(o) => !o.alive(),
                // No owner file: being created right now, or left by a crash
                // between mkdir and write; only the latter is old.
                None => entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > Duration::from_secs(60)),
            };
            if !leftover {
                continue;
            }
            let file_name = entry.file_name().to_string_lossy().into_owned();
            // The bundle is "<name>-<random suffix>".
            let name = file_name
                .rsplit_once('-')
                .map(|(n, _)| n.to_string())
                .unwrap_or_else(|| file_name.clone());
            let mut cleanup = Cleanup {
                runsc: self.runsc.clone(),
                cgroups: Arc::clone(&self.cgroups),
                state: self.state_dir(),
                name: name.clone(),
                netns: None,
                bundle: None,
                started: valid_name(&name),
            };
            cleanup.finish();
            super::net::NetNs::remove_leftover(&name);
            let _ = std::fs::remove_dir_all(&dir);
            reaped.push(name);
        }
        for dir in super::reap_scratch(&self.scratch_dir()) {
            reaped.push(dir.display().to_string());
        }
        reaped
    }

    /// runsc's state dir (checked empty after each call by the tests).
    pub fn state_dir(&self) -> PathBuf {
        self.root.join("state")
    }

    pub fn bundles_dir(&self) -> PathBuf {
        self.root.join("bundles")
    }

    /// The bundle for `req`: config.json and the mount-point-only rootfs.
    /// `hosts`: endpoint names and the address they have inside the
    /// sandbox (so a kubeconfig can name `kube-apiserver`).
    fn write_bundle(
        &self,
        req: &SandboxRequest,
        bundle: &Path,
        hosts: &[(String, String)],
    ) -> Result<Spec, SandboxError> {
        let rootfs = bundle.join("rootfs");
        std::fs::create_dir_all(&rootfs)?;
        let mut mounts = vec![
            mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"])?,
            mount(
                "/dev",
                "tmpfs",
                "tmpfs",
                &["nosuid", "strictatime", "mode=755", "size=65536k"],
            )?,
            mount(
                "/tmp",
                "tmpfs",
                "tmpfs",
                &["nosuid", "nodev", "mode=1777", "size=65536k"],
            )?,
        ];
        // opt/terraform/providers: where a provider mirror is bound; an empty
        // read-only dir when the operator configured none.
        for dir in [
            "proc",
            "dev",
            "tmp",
            "etc",
            "run/gateway",
            "work",
            "opt/terraform/providers",
        ] {
            std::fs::create_dir_all(rootfs.join(dir))?;
        }

        // A minimal /etc of our own: no host file is shown.
        let mut hosts_file = String::from("127.0.0.1 localhost\n::1 localhost\n");
        let hostname = |n: &str| {
            !n.is_empty()
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        };
        for (name, ip) in hosts.iter().filter(|(n, _)| hostname(n)) {
            hosts_file.push_str(&format!("{ip} {name}\n"));
        }
        let etc = bundle.join("etc");
        std::fs::create_dir_all(&etc)?;
        let etc_files = [
            (
                "passwd",
                "root:x:0:0:root:/nonexistent:/nonexistent\nnobody:x:65534:65534:nobody:/nonexistent:/nonexistent\n",
            ),
            ("group", "root:x:0:\nnogroup:x:65534:\n"),
            ("hosts", hosts_file.as_str()),
            (
                "nsswitch.conf",
                "passwd: files\ngroup: files\nhosts: files\n",
            ),
            ("resolv.conf", ""),
        ];
        for (name, content) in etc_files {
            std::fs::write(etc.join(name), content)?;
            std::fs::write(rootfs.join("etc").join(name), "")?;
            mounts.push(bind(&etc.join(name), &Path::new("/etc").join(name), false)?);
        }

        // The tool's files, read-only, at their own paths.
        let mut seen = HashSet::new();
        for b in &req.binds {
            let inside = clean_inside(&b.inside)?;
            if !seen.insert(inside.clone()) {
                continue;
            }
            let meta = std::fs::metadata(&b.host).map_err(|e| {
                SandboxError::Invalid(format!("bind source {}: {e}", b.host.display()))
            })?;
            make_mount_point(&rootfs, &inside, meta.is_dir())?;
            mounts.push(bind(&b.host, &inside, b.writable)?);
        }

        if let Some(work) = &req.workdir {
            chown_tree(work, SANDBOX_UID)?;
            mounts.push(bind(work, Path::new(WORKDIR), true)?);
        }

        if !req.files_in.is_empty() {
            let dir = bundle.join("in");
            for f in &req.files_in {
                let rel = clean_relative(&f.path)?;
                let p = dir.join(rel);
                if let Some(parent) = p.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::write(&p, &f.contents)?;
            }
            chown_tree(&dir, SANDBOX_UID)?;
            make_mount_point(&rootfs, Path::new(FILES_IN_DIR), true)?;
            mounts.push(bind(&dir, Path::new(FILES_IN_DIR), false)?);
        }

        if let Some(secret) = &req.credential {
            let dir = bundle.join("cred");
            std::fs::create_dir_all(&dir)?;
            let file = dir.join("credential");
            {
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o400)
                    .open(&file)?;
                f.write_all(secret.expose())?;
            }
            chown(&file, Some(SANDBOX_UID), Some(SANDBOX_UID))?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
            make_mount_point(&rootfs, Path::new(CREDENTIAL_PATH), false)?;
            mounts.push(bind(&file, Path::new(CREDENTIAL_PATH), false)?);
        }

        let l = &req.limits;
        let rlimit = |typ, v: u64| {
            PosixRlimitBuilder::default()
                .typ(typ)
                .hard(v)
                .soft(v)
                .build()
        };
        let rlimits = vec![
            // Address space, not memory: Go programs (Terraform, kubectl)
            // reserve far more than they use, and V8 (Node.js, an upstream
            // MCP server's runtime) reserves 10 GiB for each WebAssembly
            // memory (Node's own HTTP parser is one). The memory limit
            // proper is the sandbox cgroup's below.
            rlimit(
                PosixRlimitType::RlimitAs,
                l.memory_bytes.saturating_mul(8).max(32 << 30),
            )
            .map_err(spec_err)?,
            rlimit(PosixRlimitType::RlimitNproc, l.max_processes).map_err(spec_err)?,
            rlimit(PosixRlimitType::RlimitCpu, l.cpu_seconds).map_err(spec_err)?,
            rlimit(PosixRlimitType::RlimitFsize, l.file_bytes).map_err(spec_err)?,
            rlimit(PosixRlimitType::RlimitNofile, 1024).map_err(spec_err)?,
            rlimit(PosixRlimitType::RlimitCore, 0).map_err(spec_err)?,
        ];
        let mut env = vec![
            "PATH=/usr/local/bin:/usr/bin:/bin".to_string(),
            "HOME=/tmp".to_string(),
        ];
        env.extend(req.env.iter().map(|(k, v)| format!("{k}={v}")));
        let none = HashSet::new();
        let process = ProcessBuilder::default()
            .terminal(false)
            .user(
                UserBuilder::default()
                    .uid(SANDBOX_UID)
                    .gid(SANDBOX_UID)
                    .build()
                    .map_err(spec_err)?,
            )
            .args(req.argv.clone())
            .env(env)
            .cwd(if req.workdir.is_some() {
                WORKDIR
            } else {
                "/tmp"
            })
            .capabilities(
                LinuxCapabilitiesBuilder::default()
                    .bounding(none.clone())
                    .effective(none.clone())
                    .inheritable(none.clone())
                    .permitted(none.clone())
                    .ambient(none)
                    .build()
                    .map_err(spec_err)?,
            )
            .rlimits(rlimits)
            .no_new_privileges(true)
            .build()
            .map_err(spec_err)?;
        let namespaces = [
            LinuxNamespaceType::Pid,
            LinuxNamespaceType::Ipc,
            LinuxNamespaceType::Uts,
            LinuxNamespaceType::Mount,
        ]
        .into_iter()
        .map(|t| LinuxNamespaceBuilder::default().typ(t).build())
        .collect::<Result<Vec<_>, _>>()
        .map_err(spec_err)?;
        let seccomp = LinuxSeccompBuilder::default()
            .default_action(LinuxSeccompAction::ScmpActAllow)
            .syscalls(vec![
                LinuxSyscallBuilder::default()
                    .names(
                        DENIED_SYSCALLS
                            .iter()
                            .map(|s| s.to_string())
                            .collect::<Vec<_>>(),
                    )
                    .action(LinuxSeccompAction::ScmpActErrno)
                    .errno_ret(1u32)
                    .build()
                    .map_err(spec_err)?,
            ])
            .build()
            .map_err(spec_err)?;
        // The sandbox's own cgroup: a CPU quota, a memory ceiling for the
        // whole sandbox (the tool's limit plus headroom for gVisor itself),
        // and the CPU accounting the CPU-time watch reads.
        let resources = LinuxResourcesBuilder::default()
            .cpu(
                LinuxCpuBuilder::default()
                    .quota(i64::try_from(l.cpu_millicores.max(10) * 100).unwrap_or(100_000))
                    .period(100_000u64)
                    .build()
                    .map_err(spec_err)?,
            )
            .memory(
                LinuxMemoryBuilder::default()
                    .limit(
                        i64::try_from(l.memory_bytes.saturating_add(SENTRY_HEADROOM))
                            .unwrap_or(i64::MAX),
                    )
                    .build()
                    .map_err(spec_err)?,
            )
            .build()
            .map_err(spec_err)?;
        let linux = LinuxBuilder::default()
            .cgroups_path(cgroup_path(&req.name))
            .resources(resources)
            .namespaces(namespaces)
            .seccomp(seccomp)
            .masked_paths(vec![])
            .readonly_paths(vec![])
            .build()
            .map_err(spec_err)?;
        let spec = SpecBuilder::default()
            .version("1.0.2")
            .hostname(req.name.clone())
            .root(
                RootBuilder::default()
                    .path("rootfs")
                    .readonly(true)
                    .build()
                    .map_err(spec_err)?,
            )
            .mounts(mounts)
            .process(process)
            .linux(linux)
            .build()
            .map_err(spec_err)?;
        spec.save(bundle.join("config.json")).map_err(spec_err)?;
        Ok(spec)
    }

    /// Write the bundle `run` would write for `req` into `dir` (for the
    /// benchmark that compares against bare `runsc run`).
    pub fn write_bundle_for_bench(
        &self,
        req: &SandboxRequest,
        dir: &Path,
    ) -> Result<(), SandboxError> {
        self.write_bundle(req, dir, &[]).map(|_| ())
    }

    /// Write the bundle, make the network and start `runsc run`; the
    /// sandbox is removed when the returned guard is.
    async fn launch(&self, req: SandboxRequest, stdin: bool) -> Result<Launched, SandboxError> {
        if !valid_name(&req.name) {
            return Err(SandboxError::Invalid(format!(
                "sandbox name {:?} must be [A-Za-z0-9-], at most 64",
                req.name
            )));
        }
        if req.argv.is_empty() {
            return Err(SandboxError::Invalid("empty command".into()));
        }
        if let Some(image) = &req.image {
            return Err(SandboxError::Invalid(format!(
                "this sandbox runs from the image {image:?}: the local backend runs this host's files, not images (the kubernetes backend runs images)"
            )));
        }
        let started = Instant::now();
        let mut stages = super::Stages::start();
        let bundle = tempfile::Builder::new()
            .prefix(&format!("{}-", req.name))
            .tempdir_in(self.bundles_dir())?;
        let owner = gateway_base::process::Owner::current();
        std::fs::write(
            bundle.path().join(OWNER_FILE),
            format!("{} {}\n", owner.pid, owner.start),
        )?;
        let mut guard = Cleanup {
            runsc: self.runsc.clone(),
            cgroups: Arc::clone(&self.cgroups),
            state: self.state_dir(),
            name: req.name.clone(),
            netns: None,
            bundle: Some(bundle),
            started: false,
        };
        let bundle_path = guard
            .bundle
            .as_ref()
            .map(|b| b.path().to_path_buf())
            .unwrap_or_default();
        let mut req = req;
        let mut endpoints = BTreeMap::new();
        let mut hosts = Vec::new();
        if let Network::Endpoints(list) = &req.network {
            let ns = NetNs::create(&req.name, list)?;
            for e in list {
                hosts.push((e.name.clone(), ns.host_ip.to_string()));
                let addr = format!("{}:{}", ns.host_ip, e.port);
                let var = format!(
                    "GATEWAY_ENDPOINT_{}",
                    e.name.to_ascii_uppercase().replace('-', "_")
                );
                req.env.push((var, addr.clone()));
                endpoints.insert(e.name.clone(), addr);
            }
            guard.netns = Some(ns);
        }
        let spec_req = req.clone();
        let this = self.clone();
        let bp = bundle_path.clone();
        tokio::task::spawn_blocking(move || this.write_bundle(&spec_req, &bp, &hosts))
            .await
            .map_err(|e| SandboxError::Setup(format!("writing the bundle: {e}")))??;

        let mut cmd = match &guard.netns {
            Some(ns) => {
                let mut c = tokio::process::Command::new("nsenter");
                c.arg(format!("--net={}", ns.path()))
                    .arg(&self.runsc)
                    .args(["--network", "host"]);
                c
            }
            None => {
                let mut c = tokio::process::Command::new(&self.runsc);
                c.args(["--network", "none"]);
                c
            }
        };
        cmd.arg("--root")
            .arg(self.state_dir())
            .args(["--platform", &self.platform, "--oci-seccomp"])
            .arg("run")
            .arg("--bundle")
            .arg(&bundle_path)
            .arg(&req.name)
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        guard.started = true;
        let child = cmd
            .spawn()
            .map_err(|e| SandboxError::Setup(format!("starting runsc: {e}")))?;
        stages.mark("runsc_started");
        Ok(Launched {
            guard,
            child,
            req,
            endpoints,
            stages,
            started,
        })
    }

    async fn run_inner(&self, req: SandboxRequest) -> Result<SandboxResult, SandboxError> {
        let Launched {
            mut guard,
            mut child,
            req,
            endpoints,
            mut stages,
            started,
        } = self.launch(req, false).await?;
        let cap = req.limits.output_bytes;
        let out = child.stdout.take().map(|s| tokio::spawn(capture(s, cap)));
        let sink = req.on_stderr_line.clone();
        let err = child
            .stderr
            .take()
            .map(|s| tokio::spawn(capture_lines(s, cap, sink)));
        let cgroup_memory = req.limits.memory_bytes.saturating_add(SENTRY_HEADROOM);
        let memory_hit = Arc::new(AtomicBool::new(false));
        enum Stop {
            Exited(std::io::Result<std::process::ExitStatus>),
            Deadline,
            Cpu,
        }
        let stop = tokio::select! {
            s = child.wait() => Stop::Exited(s),
            _ = tokio::time::sleep(req.deadline) => Stop::Deadline,
            _ = watch_cgroup(Arc::clone(&self.cgroups), req.name.clone(), Duration::from_secs(req.limits.cpu_seconds), cgroup_memory, Arc::clone(&memory_hit)) => Stop::Cpu,
        };
        stages.mark("ended");
        let (status, killed_for) = match stop {
            Stop::Exited(s) => (s?, None),
            other => {
                guard.kill();
                let s = tokio::time::timeout(Duration::from_secs(20), child.wait())
                    .await
                    .map_err(|_| SandboxError::Setup("runsc did not stop after kill".into()))??;
                let why = match other {
                    Stop::Cpu => Ended::Limit("CPU time".into()),
                    _ => Ended::Deadline,
                };
                (s, Some(why))
            }
        };
        let stdout = match out {
            Some(h) => h.await.unwrap_or_default(),
            None => Captured::default(),
        };
        let stderr = match err {
            Some(h) => h.await.unwrap_or_default(),
            None => Captured::default(),
        };
        let code = status.code();
        let memory_hit = status.code() != Some(0) && memory_hit.load(Ordering::Relaxed);
        // A working dir with no room left when the tool failed: it hit its
        // disk_bytes (the tool's own error says "no space left on device").
        let disk_full = status.code() != Some(0)
            && req.workdir.as_ref().is_some_and(|w| {
                nix::sys::statvfs::statvfs(w.as_path())
                    .is_ok_and(|v| v.blocks_available() == 0 && v.blocks() > 0)
            });
        let (exit_code, ended) = if let Some(why) = killed_for {
            (None, why)
        } else if memory_hit {
            (
                status.code().filter(|c| *c < 128),
                Ended::Limit("memory".into()),
            )
        } else if disk_full {
            (
                status.code().filter(|c| *c < 128),
                Ended::Limit("disk (the working dir is full)".into()),
            )
        } else {
            match code {
                Some(c) if c > 128 && c < 160 => {
                    let sig = c - 128;
                    let ended = match sig {
                        24 => Ended::Limit("CPU time (SIGXCPU)".into()),
                        25 => Ended::Limit("file size (SIGXFSZ)".into()),
                        s => Ended::Signal(s),
                    };
                    (None, ended)
                }
                Some(c) => (Some(c), Ended::Exited),
                None => (None, Ended::Signal(-1)),
            }
        };
        let files_out = match &req.workdir {
            Some(work) => {
                super::beneath::read_files_out(work, &req.files_out, req.limits.file_out_bytes)?
            }
            None => BTreeMap::new(),
        };
        stages.mark("output_read");
        guard.finish();
        stages.mark("cleaned_up");
        Ok(SandboxResult {
            name: req.name.clone(),
            exit_code,
            stdout,
            stderr,
            files_out,
            duration_ms: started.elapsed().as_millis(),
            ended,
            endpoints,
            stages: stages.into_marks(),
        })
    }
}

/// Marks a session's sandbox as ended when dropped.
struct Dead(Arc<AtomicBool>);

impl Drop for Dead {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// A started `runsc run` and what removes it.
struct Launched {
    guard: Cleanup,
    child: tokio::process::Child,
    req: SandboxRequest,
    endpoints: BTreeMap<String, String>,
    stages: super::Stages,
    started: Instant,
}

impl LocalSandbox {
    async fn session_inner(&self, req: SandboxRequest) -> Result<SandboxSession, SandboxError> {
        let Launched {
            mut guard,
            mut child,
            req,
            ..
        } = self.launch(req, true).await?;
        let (Some(input), Some(output)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(SandboxError::Setup("runsc's pipes are missing".into()));
        };
        // The sandbox's stderr (the server's own words) is read and
        // dropped: nothing waits on a full pipe.
        let drain = child
            .stderr
            .take()
            .map(|e| tokio::spawn(capture(e, 64 * 1024)));
        let alive = Arc::new(AtomicBool::new(true));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (tell_end, ended) = tokio::sync::oneshot::channel::<super::SessionEnd>();
        let since = Instant::now();
        let cgroups = Arc::clone(&self.cgroups);
        let name = req.name.clone();
        let still = Arc::clone(&alive);
        tokio::spawn(async move {
            // Not alive from the moment this task ends, or is dropped
            // with its runtime (the guard then removes the sandbox).
            let _dead = Dead(still);
            let memory = req.limits.memory_bytes.saturating_add(SENTRY_HEADROOM);
            let memory_hit = Arc::new(AtomicBool::new(false));
            let why = tokio::select! {
                s = child.wait() => match s.ok().and_then(|s| s.code()) {
                    Some(c) if c != 0 && memory_hit.load(Ordering::Relaxed) => {
                        (Some(c), Ended::Limit("memory".into()))
                    }
                    Some(c) => (Some(c), Ended::Exited),
                    None => (None, Ended::Signal(-1)),
                },
                _ = tokio::time::sleep(req.deadline) => (None, Ended::Deadline),
                _ = watch_cgroup(cgroups, req.name.clone(), Duration::from_secs(req.limits.cpu_seconds), memory, Arc::clone(&memory_hit)) => {
                    let what = if memory_hit.load(Ordering::Relaxed) { "memory" } else { "CPU time" };
                    (None, Ended::Limit(what.into()))
                }
                _ = stopped => (None, Ended::Exited),
            };
            _dead.0.store(false, Ordering::SeqCst);
            guard.kill();
            let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
            if let Some(d) = drain {
                d.abort();
            }
            let _ = tokio::task::spawn_blocking(move || guard.finish()).await;
            let _ = tell_end.send(super::SessionEnd {
                ended: why.1,
                exit_code: why.0,
                duration_ms: since.elapsed().as_millis(),
            });
        });
        Ok(SandboxSession {
            name,
            input: Box::new(input),
            output: Box::new(output),
            alive,
            stop: Some(stop),
            ended: Some(ended),
        })
    }
}

impl Sandbox for LocalSandbox {
    fn run(&self, req: SandboxRequest) -> RunFuture<'_> {
        Box::pin(self.run_inner(req))
    }

    fn start_session(&self, req: SandboxRequest) -> super::SessionFuture<'_> {
        Box::pin(self.session_inner(req))
    }

    fn runs_sessions(&self) -> bool {
        true
    }

    fn backend(&self) -> &'static str {
        "local"
    }

    fn scratch_dir(&self) -> PathBuf {
        self.root.join("scratch")
    }

    fn scratch_needs_quota(&self) -> bool {
        true
    }
}

/// Removes everything a sandbox left, whatever path the call took.
struct Cleanup {
    runsc: PathBuf,
    cgroups: Arc<Hierarchy>,
    state: PathBuf,
    name: String,
    netns: Option<NetNs>,
    bundle: Option<tempfile::TempDir>,
    started: bool,
}

impl Cleanup {
    fn runsc(&self, args: &[&str]) {
        let _ = std::process::Command::new(&self.runsc)
            .arg("--root")
            .arg(&self.state)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    fn kill(&self) {
        self.runsc(&["kill", "--all", &self.name, "KILL"]);
    }

    fn finish(&mut self) {
        if self.started {
            self.kill();
            self.runsc(&["delete", "--force", &self.name]);
            remove_cgroup(&self.cgroups, &self.name);
            remove_state_files(&self.state, &self.name);
            self.started = false;
        }
        if let Some(mut ns) = self.netns.take() {
            ns.remove();
        }
        if let Some(b) = self.bundle.take() {
            let _ = b.close();
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.finish();
    }
}

/// [`capture`], telling `sink` of each whole line as it comes.
async fn capture_lines<R: tokio::io::AsyncRead + Unpin>(
    mut r: R,
    cap: usize,
    sink: Option<crate::LineSink>,
) -> Captured {
    let Some(sink) = sink else {
        return capture(r, cap).await;
    };
    let mut out = Captured::default();
    let mut buf = vec![0u8; 16 * 1024];
    // The line being read (cut at the sink's most; a longer one is skipped).
    let mut line: Vec<u8> = Vec::new();
    let mut too_long = false;
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                for &b in &buf[..n] {
                    if b == b'\n' {
                        if !too_long {
                            (sink.0)(&line);
                        }
                        line.clear();
                        too_long = false;
                    } else if line.len() < crate::LineSink::MAX {
                        line.push(b);
                    } else {
                        too_long = true;
                    }
                }
                let room = cap.saturating_sub(out.bytes.len());
                if n > room {
                    out.truncated = true;
                }
                out.bytes.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    out
}

async fn capture<R: tokio::io::AsyncRead + Unpin>(mut r: R, cap: usize) -> Captured {
    let mut out = Captured::default();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = cap.saturating_sub(out.bytes.len());
                if n > room {
                    out.truncated = true;
                }
                out.bytes.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    out
}

fn spec_err(e: impl std::fmt::Display) -> SandboxError {
    SandboxError::Setup(format!("OCI spec: {e}"))
}

fn mount(
    dest: &str,
    typ: &str,
    source: &str,
    options: &[&str],
) -> Result<oci_spec::runtime::Mount, SandboxError> {
    MountBuilder::default()
        .destination(dest)
        .typ(typ)
        .source(source)
        .options(options.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .build()
        .map_err(spec_err)
}

fn bind(
    host: &Path,
    inside: &Path,
    writable: bool,
) -> Result<oci_spec::runtime::Mount, SandboxError> {
    let mut options = vec![
        "rbind".to_string(),
        "nosuid".to_string(),
        "nodev".to_string(),
    ];
    options.push(if writable { "rw" } else { "ro" }.to_string());
    MountBuilder::default()
        .destination(inside)
        .typ("bind")
        .source(host)
        .options(options)
        .build()
        .map_err(spec_err)
}

/// An absolute path inside the sandbox with no `..`.
fn clean_inside(p: &Path) -> Result<PathBuf, SandboxError> {
    if !p.is_absolute() || p.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(SandboxError::Invalid(format!(
            "{} must be absolute without '..'",
            p.display()
        )));
    }
    Ok(p.to_path_buf())
}

/// A relative path with no `..` and no root.
fn clean_relative(p: &str) -> Result<PathBuf, SandboxError> {
    let path = Path::new(p);
    if p.is_empty()
        || path
            .components()
            .any(|c| !matches!(c, Component::Normal(_)))
    {
        return Err(SandboxError::Invalid(format!(
            "{p:?} must be a relative path without '..'"
        )));
    }
    Ok(path.to_path_buf())
}

fn make_mount_point(rootfs: &Path, inside: &Path, dir: bool) -> Result<(), SandboxError> {
    let rel = inside.strip_prefix("/").unwrap_or(inside);
    let target = rootfs.join(rel);
    if dir {
        std::fs::create_dir_all(&target)?;
    } else {
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        if !target.exists() {
            std::fs::write(&target, b"")?;
        }
    }
    Ok(())
}

fn chown_tree(path: &Path, uid: u32) -> Result<(), SandboxError> {
    let meta = std::fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    std::os::unix::fs::lchown(path, Some(uid), Some(uid))?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid)?;
        }
    }
    Ok(())
}
