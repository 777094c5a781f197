//! A real `gateway daemon` for the tests, started as root from a root-owned
//! temporary configuration, and OS users to play the agent and the approver.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The group the test daemons' sockets belong to, and two users in it.
pub const GROUP: &str = "gw-test";
pub const AGENT: &str = "gw-test-agent";
pub const APPROVER: &str = "gw-test-approver";
/// The group the default policy lets approve (data.config.approvals.identity).
pub const APPROVERS: &str = "gateway-approvers";

/// Make `user` (in [`GROUP`]) exist; returns its uid.
pub fn os_user(user: &str) -> u32 {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the daemon tests create OS users and start the daemon as root"
    );
    if nix::unistd::Group::from_name(GROUP)
        .ok()
        .flatten()
        .is_none()
    {
        let _ = Command::new("groupadd").arg(GROUP).status();
    }
    if nix::unistd::User::from_name(user).ok().flatten().is_none() {
        let _ = Command::new("useradd")
            .args(["-M", "-N", "-g", GROUP, "-s", "/usr/sbin/nologin", user])
            .status();
    }
    if user == APPROVER {
        if nix::unistd::Group::from_name(APPROVERS)
            .ok()
            .flatten()
            .is_none()
        {
            let _ = Command::new("groupadd").arg(APPROVERS).status();
        }
        let _ = Command::new("usermod")
            .args(["-a", "-G", APPROVERS, user])
            .status();
    }
    nix::unistd::User::from_name(user)
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("useradd {user} did not make the user"))
        .uid
        .as_raw()
}

/// A dir owned by `user` (mode 0700), for its workspace or home.
pub fn owned_dir(user: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().expect("dir");
    chown_tree(d.path(), user);
    d
}

pub fn chmod(p: impl AsRef<Path>, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p.as_ref(), std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {:o} {}: {e}", mode, p.as_ref().display()));
}

pub fn chown_tree(p: &Path, user: &str) {
    let st = Command::new("chown")
        .args(["-R", &format!("{user}:{GROUP}")])
        .arg(p)
        .status()
        .expect("chown");
    assert!(st.success());
}

/// `program` as `user`, with a clean environment: PATH, HOME and `vars`.
pub fn as_user(user: &str, home: &Path, vars: &[(&str, &Path)], program: &Path) -> Command {
    let mut c = Command::new("runuser");
    c.args([
        "-u",
        user,
        "--",
        "env",
        "-i",
        "PATH=/usr/local/bin:/usr/bin:/bin",
    ])
    .arg(format!("HOME={}", home.display()));
    for (k, v) in vars {
        c.arg(format!("{k}={}", v.display()));
    }
    c.arg(program);
    c
}

pub struct Daemon {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub policies: PathBuf,
    pub home: PathBuf,
    pub socket: PathBuf,
    pub log: PathBuf,
    child: Child,
}

impl Daemon {
    /// A root-owned dir (0755, so that users reach the socket) holding a
    /// copy of `policies`, the state dir and a config with `extra` appended.
    pub fn layout(policies: &Path, extra: &str) -> (tempfile::TempDir, PathBuf) {
        Daemon::layout_with(policies, extra, "")
    }

    /// [`Daemon::layout`] with more `[daemon]` keys.
    pub fn layout_with(
        policies: &Path,
        extra: &str,
        daemon_keys: &str,
    ) -> (tempfile::TempDir, PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("daemon dir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        super::common::copy_dir(policies, &dir.path().join("policies"));
        let config = dir.path().join("gateway.toml");
        let text = format!(
            "policies = {:?}\nhome = {:?}\n{extra}\n[daemon]\nsocket = {:?}\nsocket_group = {GROUP:?}\n{daemon_keys}\n",
            dir.path().join("policies"),
            dir.path().join("state"),
            dir.path().join("run/gateway.sock"),
        );
        std::fs::write(&config, text).expect("config");
        (dir, config)
    }

    /// `gateway daemon` on a prepared layout, with none of the test's
    /// environment that would change it.
    pub fn command(dir: &Path, config: &Path) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_gateway"));
        c.arg("--config")
            .arg(config)
            .arg("daemon")
            .current_dir(dir)
            .env_remove("GATEWAY_HOME")
            .env_remove("GATEWAY_POLICIES")
            .env_remove("GATEWAY_CONFIG")
            .env_remove("VAULT_ADDR")
            .env_remove("VAULT_TOKEN");
        c
    }

    /// Start the daemon on a prepared layout and wait for its socket.
    pub fn start_in(dir: tempfile::TempDir, config: PathBuf) -> Daemon {
        let cmd = Daemon::command(dir.path(), &config);
        Daemon::start_cmd(dir, config, cmd)
    }

    /// [`Daemon::start_in`] with the command given (e.g. the daemon run
    /// inside a mount namespace of its own).
    pub fn start_cmd(dir: tempfile::TempDir, config: PathBuf, mut cmd: Command) -> Daemon {
        let log = dir.path().join("daemon.log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("gateway daemon");
        let mut d = Daemon {
            policies: dir.path().join("policies"),
            home: dir.path().join("state"),
            socket: dir.path().join("run/gateway.sock"),
            config,
            log,
            dir,
            child,
        };
        let started = Instant::now();
        while !d.socket.exists() {
            if let Ok(Some(st)) = d.child.try_wait() {
                panic!(
                    "the daemon exited ({st}): {}",
                    std::fs::read_to_string(&d.log).unwrap_or_default()
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no socket after 30 s: {}",
                std::fs::read_to_string(&d.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }

    pub fn start(policies: &Path, extra: &str) -> Daemon {
        let (dir, config) = Daemon::layout(policies, extra);
        Daemon::start_in(dir, config)
    }

    /// The audit events, parsed.
    /// Whether the daemon keeps its state (and its audit chain) in
    /// PostgreSQL, shared with other replicas.
    fn shares_a_store(&self) -> bool {
        std::fs::read_to_string(&self.config)
            .unwrap_or_default()
            .contains("backend = \"postgres\"")
    }

    /// `gateway --config CONFIG audit ARGS` (as root, who can read the
    /// store's url_file).
    fn audit_cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_gateway"))
            .arg("--config")
            .arg(&self.config)
            .arg("audit")
            .args(args)
            .env_remove("GATEWAY_HOME")
            .output()
            .expect("gateway audit")
    }

    /// The daemon's audit events: its home's log, or the replicas' chain
    /// in the database.
    pub fn events(&self) -> Vec<serde_json::Value> {
        let text = if self.shares_a_store() {
            let out = self.audit_cli(&["--json"]);
            assert!(
                out.status.success(),
                "gateway audit --json: {}",
                super::common::stderr(&out)
            );
            super::common::stdout(&out)
        } else {
            std::fs::read_to_string(self.home.join("audit.jsonl")).unwrap_or_default()
        };
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The events of request `rid` once its `tool.result` is in the audit
    /// (its log, or the replicas' chain), waiting up to `within`.
    pub fn ended(&self, rid: &str, within: Duration) -> Vec<serde_json::Value> {
        let started = std::time::Instant::now();
        loop {
            let mine: Vec<serde_json::Value> = self
                .events()
                .into_iter()
                .filter(|e| e["request_id"] == rid)
                .collect();
            if mine.iter().any(|e| e["event"] == "tool.result") {
                return mine;
            }
            assert!(
                started.elapsed() < within,
                "request {rid} has no tool.result after {within:?}: {mine:#?}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `gateway audit verify` passes on the daemon's audit log.
    pub fn assert_audit_verifies(&self) {
        let verify = if self.shares_a_store() {
            self.audit_cli(&["verify"])
        } else {
            super::common::gateway(&self.home)
                .args(["audit", "verify"])
                .output()
                .expect("verify")
        };
        assert!(
            verify.status.success(),
            "{}",
            super::common::stdout(&verify)
        );
    }

    /// Stop the daemon (SIGTERM) and start it again on the same layout,
    /// its log appended to.
    pub fn restart(&mut self) {
        assert!(
            self.terminate(Duration::from_secs(30)).is_some(),
            "the daemon did not stop within 30 s: {}",
            self.log()
        );
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .expect("log");
        self.child = Daemon::command(self.dir.path(), &self.config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("gateway daemon");
        let started = Instant::now();
        while !self.socket.exists() {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("the daemon exited ({st}): {}", self.log());
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no socket after 30 s: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Send the daemon SIGTERM and wait up to `within` for it to exit.
    pub fn terminate(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let started = Instant::now();
        while started.elapsed() < within {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(15) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A workspace of `user`'s own holding a copy of the offline demo module.
pub fn demo_workspace(user: &str) -> tempfile::TempDir {
    let ws = owned_dir(user);
    super::common::copy_dir(
        &super::common::repo().join("terraform/offline-demo"),
        &ws.path().join("terraform/offline-demo"),
    );
    chown_tree(ws.path(), user);
    ws
}

/// What a run of the demo module (`terraform/offline-demo` in `workspace`)
/// adds: `count` resources whose input names the round, so that each
/// round changes them all and its plan or apply runs for seconds in gVisor.
pub fn write_slow_part(workspace: &Path, round: &str, count: usize) {
    let path = workspace.join("terraform/offline-demo").join("slow.tf");
    std::fs::write(
        &path,
        format!(
            "resource \"terraform_data\" \"many\" {{\n  count = {count}\n  input = \"${{count.index}}-{round}\"\n}}\n"
        ),
    )
    .expect("slow.tf");
    chown_tree(&path, AGENT);
}
