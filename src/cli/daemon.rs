//! `gateway daemon`: start the privileged service (README.md: deployment).
//!
//! Its paths come from its own flags, else its configuration file
//! (default /etc/gateway/gateway.toml), else the defaults under /etc/gateway
//! and /var/lib/gateway: never from the current directory. Before it
//! listens, everything it will read or run is checked ([`crate::trust`]);
//! the policy dir is checked again before every reload.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;

use super::Cli;
use crate::audit::Event;
use crate::config::{
    DAEMON_CONFIG, DAEMON_GROUP, DAEMON_POLICIES, DAEMON_SOCKET, DAEMON_STATE, GatewayConfig,
};
use crate::daemon::Daemon;
use crate::pipeline::Pipeline;
use crate::policy::PolicyStore;
use crate::policy::set::LoadOptions;
use crate::policy::store::{DEFAULT_POLL_INTERVAL, PolicyEvent, log_event};
use crate::sandbox::local::{LocalConfig, LocalSandbox};
use crate::tools::ToolPaths;
use crate::trust::Trust;

/// How often the living look for sandbox Jobs of replicas that died.
const SWEEP_DEAD_REPLICAS: std::time::Duration = std::time::Duration::from_secs(10);
/// How often a replica tries to append the audit events its chain refused
/// while the database was away, and ends the calls dead replicas left open.
const AUDIT_RECOVERY_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// How long a stopping replica keeps trying to append those events.
const FLUSH_AT_SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(5);
/// A call opened this long before a replica read the list of live ones is
/// old enough to be judged against it: a replica that joined after the
/// list was read (and whose calls it cannot name) started its calls later,
/// clocks between hosts a few seconds apart included.
const OPEN_CALL_MARGIN_MS: i64 = 10_000;
/// A replica must be missing from the live ones for this long, in every
/// look, before its open calls are ended: one the ledger called dead after
/// a long database outage or a partition registers again (under the same
/// id) within a few beats of reaching the database, and its calls are its
/// own to end.
const ABSENT_FOR: std::time::Duration = std::time::Duration::from_secs(20);

/// Open files the daemon keeps for itself beyond its HTTP connections:
/// the audit log and its head, the stores' connections, the socket's
/// sessions, each sandbox's pipes, files and namespaces, TLS to Vault and
/// the API server.
pub const RESERVED_FILES: u64 = 1024;

/// Raise the soft limit on open files to the hard one (a unit without
/// `LimitNOFILE` starts the daemon with 1,024, as many as
/// `max_connections`: a flood of connections then starves the audit and
/// the store), and refuse an `[http] max_connections` that would not leave
/// [`RESERVED_FILES`] for the daemon's own files. Returns the limit.
fn descriptor_budget(http: Option<&crate::config::http::HttpConfig>) -> anyhow::Result<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).context("reading RLIMIT_NOFILE")?;
    let soft = if soft < hard {
        match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(e) => {
                tracing::warn!("could not raise the open-file limit from {soft} to {hard}: {e}");
                soft
            }
        }
    } else {
        soft
    };
    if let Some(h) = http {
        let need = h.max_connections as u64 + RESERVED_FILES;
        if need > soft {
            anyhow::bail!(
                "[http] max_connections is {} but this process may open only {soft} files, and the daemon keeps {RESERVED_FILES} for its audit, stores and sandboxes: raise the limit (LimitNOFILE=65536 in the unit, which `gateway daemon install` writes; `ulimit -n` in a shell) or lower max_connections to {}",
                h.max_connections,
                soft.saturating_sub(RESERVED_FILES)
            );
        }
    }
    Ok(soft)
}

/// The team's audit after a database outage or a replica's death (nothing
/// to do on one host): every second, the events the chain refused are
/// appended; every few, the calls whose replica died before their end was
/// recorded are ended as interrupted. `finds_the_dead`: no broker's
/// orphan watch runs, so this loop also tells the ledger to look for
/// replicas that died.
fn spawn_audit_recovery(
    audit: Arc<crate::audit::AuditLog>,
    ledger: Option<Arc<dyn crate::broker::leases::Ledger>>,
    finds_the_dead: bool,
) {
    if audit.chain().is_none() {
        return;
    }
    // Since when each replica that holds open calls has been missing.
    let absent: Arc<std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>> =
        Arc::default();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(AUDIT_RECOVERY_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut n: u64 = 0;
        loop {
            let absent = Arc::clone(&absent);
            tick.tick().await;
            n += 1;
            let a = Arc::clone(&audit);
            let l = ledger.clone();
            let every = l
                .as_ref()
                .and_then(|l| l.watch_every())
                .map_or(0, |d| d.as_secs().max(1));
            let look = every > 0 && n.is_multiple_of(every);
            let done = tokio::task::spawn_blocking(move || {
                if let Err(e) = a.flush_spool() {
                    tracing::debug!("the audit events that wait still wait: {e}");
                    return;
                }
                let Some(l) = l.filter(|_| look) else {
                    return;
                };
                if finds_the_dead && let Err(e) = l.claim_orphans() {
                    tracing::warn!("looking for replicas that died: {e}");
                }
                let before = crate::audit::now_ms() - OPEN_CALL_MARGIN_MS;
                let live = match l.live_replicas() {
                    Ok(Some(live)) => live,
                    Ok(None) => return,
                    Err(e) => {
                        tracing::warn!("listing the live replicas: {e}");
                        return;
                    }
                };
                // Missing now, and in every look for ABSENT_FOR.
                let dead = |replica: &str| {
                    let mut absent = absent.lock().unwrap_or_else(|p| p.into_inner());
                    if live.iter().any(|l| l == replica) {
                        absent.remove(replica);
                        return false;
                    }
                    absent
                        .entry(replica.to_string())
                        .or_insert_with(std::time::Instant::now)
                        .elapsed()
                        >= ABSENT_FOR
                };
                absent
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .retain(|r, _| !live.contains(r));
                match a.end_orphaned_calls(&dead, before) {
                    Ok(ended) if !ended.is_empty() => tracing::warn!(
                        calls = ?ended,
                        "ended, as interrupted, the calls replicas that died left open in the audit"
                    ),
                    Ok(_) => {}
                    Err(e) => tracing::warn!("ending the calls of replicas that died: {e}"),
                }
            })
            .await;
            if let Err(e) = done {
                tracing::error!("the audit recovery task failed: {e}");
            }
        }
    });
}
/// At shutdown, how long the revocation of this process's leases may take
/// at least, after the grace the calls had.
const REVOKE_AT_SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug, clap::Args)]
pub struct DaemonArgs {
    /// The socket to listen on [default: [daemon] socket, else /run/gateway/gateway.sock].
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The group that may connect [default: [daemon] socket_group, else gateway].
    #[arg(long)]
    socket_group: Option<String>,
    /// Set the daemon up on this machine instead (group, directories,
    /// policies, systemd unit): see `gateway daemon install --help`.
    #[command(subcommand)]
    install: Option<InstallCommand>,
}

#[derive(Debug, clap::Subcommand)]
enum InstallCommand {
    /// Create the `gateway` group, /etc/gateway (config and the default
    /// policies), /var/lib/gateway, and a systemd unit; run as root.
    Install(super::install::DaemonInstallArgs),
}

/// The daemon's paths: its flags (root's own), else its configuration.
struct Paths {
    config: PathBuf,
    policies: PathBuf,
    home: PathBuf,
    socket: PathBuf,
    group: String,
}

fn paths(cli: &Cli, a: &DaemonArgs, file: &GatewayConfig) -> Paths {
    Paths {
        config: cli
            .config
            .clone()
            .unwrap_or_else(|| PathBuf::from(DAEMON_CONFIG)),
        policies: cli
            .policies_arg
            .clone()
            .or_else(|| file.policies.clone())
            .unwrap_or_else(|| PathBuf::from(DAEMON_POLICIES)),
        home: cli
            .home
            .clone()
            .or_else(|| file.home.clone())
            .unwrap_or_else(|| PathBuf::from(DAEMON_STATE)),
        socket: a
            .socket
            .clone()
            .or_else(|| file.daemon.socket.clone())
            .unwrap_or_else(|| PathBuf::from(DAEMON_SOCKET)),
        group: a
            .socket_group
            .clone()
            .or_else(|| file.daemon.socket_group.clone())
            .unwrap_or_else(|| DAEMON_GROUP.to_string()),
    }
}

pub fn run(cli: &Cli, a: &DaemonArgs) -> anyhow::Result<ExitCode> {
    if let Some(InstallCommand::Install(i)) = &a.install {
        return super::install::daemon(i);
    }
    let config_path = cli
        .config
        .clone()
        .unwrap_or_else(|| PathBuf::from(DAEMON_CONFIG));
    let file = GatewayConfig::load(&config_path, true).with_context(|| {
        format!(
            "the daemon reads its configuration from {} (gateway daemon install writes one)",
            config_path.display()
        )
    })?;
    let p = paths(cli, a, &file);
    descriptor_budget(file.http.as_ref()).context("the daemon refuses to start")?;
    let trust = Trust::for_this_process()
        .with_pod_volumes(&file.daemon.private_volumes, &file.daemon.read_only_volumes)
        .context("the daemon refuses to start")?;
    // The state dir: made owner-only when missing, then checked like the rest.
    if !p.home.exists() {
        trust
            .check_creatable("state dir", &p.home)
            .context("the daemon refuses to start")?;
        std::fs::create_dir_all(&p.home)
            .with_context(|| format!("cannot create the state dir {}", p.home.display()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p.home, std::fs::Permissions::from_mode(0o700))?;
    }
    let tools = {
        let mut t = ToolPaths::installed();
        t.provider_mirror = file.sandbox.provider_mirror.clone();
        t
    };
    let checked = crate::daemon::paths_to_check(
        &p.config,
        &p.policies,
        &p.home,
        std::env::current_exe().ok().as_deref(),
        &tools,
        &file,
    );
    let roots = file.daemon.workspace_roots.clone();
    let grace = file.daemon.shutdown_grace_seconds.map_or(
        crate::daemon::SHUTDOWN_GRACE,
        std::time::Duration::from_secs,
    );
    crate::daemon::check_all(&trust, &checked, &roots).context("the daemon refuses to start")?;

    let opts = LoadOptions {
        trust: Some(trust.clone()),
        ..LoadOptions::default()
    };
    let (policy, poll) = match &file.policy_bundle {
        Some(b) => {
            let source = crate::policy::bundle::BundleSource::from_config(b)
                .context("the daemon refuses to start: [policy_bundle]")?;
            let poll = source.poll;
            (Arc::new(PolicyStore::open_bundle(source, opts)), poll)
        }
        None => (
            Arc::new(PolicyStore::open(vec![p.policies.clone()], opts)),
            DEFAULT_POLL_INTERVAL,
        ),
    };
    let audit = super::audit::open_log(&file, &p.home)?;
    match policy.current() {
        Ok(set) => {
            audit.record(
                "",
                Event::PolicyLoaded {
                    fingerprint: set.fingerprint.clone(),
                    files: set.files.len(),
                    signed: set.signed.as_ref().map(|s| serde_json::json!(s)),
                },
            )?;
        }
        Err(e) => {
            tracing::error!("the policy set does not load; every call will be denied: {e}");
            audit.record("", Event::PolicyLoadFailed { error: e.clone() })?;
        }
    }
    let watch_audit = super::audit::open_log(&file, &p.home)?;
    let _watch = policy.watch(poll, move |ev| {
        log_event(ev);
        let event = match ev {
            PolicyEvent::Reloaded {
                fingerprint,
                files,
                signed,
            } => Event::PolicyReloaded {
                fingerprint: fingerprint.clone(),
                files: *files,
                signed: signed.as_ref().map(|s| serde_json::json!(s)),
            },
            PolicyEvent::ReloadFailed { error, active } => Event::PolicyReloadFailed {
                error: error.clone(),
                active: active.clone(),
            },
        };
        let _ = watch_audit.record("", event);
    });

    // The daemon's own view of the settings (never the caller's), in the
    // shape the operator commands take; they read its paths and file, never
    // its `command` (each command arrives parsed on its own).
    let own = Cli {
        policies_arg: Some(p.policies.clone()),
        home: Some(p.home.clone()),
        config: Some(p.config.clone()),
        file: file.clone(),
        policies: p.policies.clone(),
        command: super::Command::Demo,
    };
    // Replicas join one another in the shared ledger ([store]), Vault or
    // not: they keep their leases there (a survivor revokes those of a
    // replica that died) and name their sandboxes after themselves.
    let shared = file.store()?;
    let ledger = match &shared {
        crate::config::store::Store::Postgres { .. } => {
            Some(super::vault::ledger(&own, &p.home, true)?)
        }
        crate::config::store::Store::Sqlite => None,
    };
    let broker = super::vault::broker_on(&own, &p.home, ledger.clone())?;
    // This process's name among the replicas, when it is one.
    let replica = ledger
        .as_ref()
        .and_then(|l| l.replica())
        .map(str::to_string);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // From here the start may log in to Vault (the lane check, the orphan
    // recovery): a refusal before calls are served revokes that token
    // (dropped before `rt`, declared after it).
    let serving = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let _revoke_login = RevokeLoginOnRefusal {
        broker: broker.clone(),
        rt: rt.handle().clone(),
        serving: Arc::clone(&serving),
    };
    // More lanes than `vault setup --lanes` made: refused now, not at the
    // first call that lands on a missing one.
    if let Some(b) = &broker {
        use crate::broker::vault::LaneCheck;
        match policy.current() {
            Ok(set) => {
                // A few requests; a Vault that answers each one just in
                // time does not hold the start for long.
                let checked = rt.block_on(async {
                    tokio::time::timeout(LANE_CHECK_LIMIT, b.check_lanes(&role_mounts(&set))).await
                });
                match checked {
                    Ok(Ok(notes)) => {
                        for n in notes {
                            tracing::warn!("{n}");
                        }
                    }
                    Ok(Err(LaneCheck::Missing(m))) => {
                        anyhow::bail!("the daemon refuses to start: {m}")
                    }
                    Ok(Err(e @ LaneCheck::Unknown(_))) => tracing::warn!(
                        "{e}; a call that lands on a lane that was not set up is refused, saying so"
                    ),
                    Err(_) => tracing::warn!(
                        "the Vault lanes could not be checked within {} s; a call that lands on a lane that was not set up is refused, saying so",
                        LANE_CHECK_LIMIT.as_secs()
                    ),
                }
            }
            Err(e) => tracing::warn!(
                "the Vault lanes were not checked (no policy set loaded: {e}); a call that lands on a lane that was not set up is refused, saying so"
            ),
        }
    }
    // Traces, when a collector is named (README.md: "Watching it").
    if let Some(endpoint) = &file.telemetry.otlp_endpoint {
        crate::telemetry::trace::init(
            endpoint,
            file.telemetry.service_name.as_deref().unwrap_or("gateway"),
        )
        .map_err(|e| anyhow::anyhow!(e))
        .context("the daemon refuses to start")?;
    }
    let export_sink = file
        .audit_export_sink()
        .map_err(|e| anyhow::anyhow!(e))
        .context("the daemon refuses to start")?;
    let mut cluster: Option<crate::sandbox::kubernetes::KubernetesSandbox> = None;
    let sandbox: Arc<dyn crate::sandbox::Sandbox> = match file.sandbox.backend.as_str() {
        "kubernetes" => {
            let cfg = file.sandbox.kubernetes.clone();
            if let Some(c) = &cfg.egress_canary
                && c.parse::<std::net::SocketAddr>().is_err()
            {
                anyhow::bail!(
                    "[sandbox.kubernetes] egress_canary is {c:?}: it must be an IP:PORT (sandboxes resolve no names)"
                );
            }
            if cfg.egress_canary.is_none() {
                anyhow::bail!(
                    "[sandbox.kubernetes] egress_canary is not set: name an IP:PORT every sandbox's network policy denies                      (the cluster DNS service, e.g. \"10.96.0.10:53\"); sandboxes run nothing until it is unreachable,                      because a NetworkPolicy takes effect only after a pod has started"
                );
            }
            let sb = rt.block_on(async {
                let client = crate::sandbox::kubernetes::client(&cfg).await?;
                let mut cfg = cfg;
                // A replica's Jobs carry its name: it deletes only its own
                // at stop, and a survivor deletes a dead one's.
                cfg.replica = replica.clone();
                let sb = crate::sandbox::kubernetes::KubernetesSandbox::new(client, cfg);
                match sb.reap_leftovers().await {
                    Ok(r) if !r.is_empty() => {
                        tracing::warn!(jobs = ?r, "deleted sandbox Jobs a previous gateway left");
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!("could not look for leftover sandbox Jobs: {e}"),
                }
                Ok::<_, crate::sandbox::SandboxError>(sb)
            })?;
            cluster = Some(sb.clone());
            Arc::new(sb)
        }
        _ => {
            // Checked before it is ever run (LocalSandbox::new runs it).
            let runsc = file
                .sandbox
                .runsc
                .clone()
                .or_else(|| crate::sandbox::net::which("runsc"))
                .context("runsc is not installed (scripts/bootstrap.sh installs it) and [sandbox] runsc names none")?;
            trust
                .check_path("runsc", &runsc)
                .context("the daemon refuses to start")?;
            Arc::new(LocalSandbox::new(LocalConfig {
                runsc: Some(runsc),
                platform: file.sandbox.platform.clone(),
                ..LocalConfig::default()
            })?)
        }
    };
    let kubernetes = super::vault::kubernetes_access(&own)?;
    let endpoints: BTreeMap<String, u16> = file.endpoints.clone();
    // No session runs in this path: each one names its own workspace.
    // One audit chain for every replica when [store] is PostgreSQL.
    let mut pipeline = Pipeline::with_audit(
        policy,
        p.home.clone(),
        PathBuf::from("/nonexistent"),
        sandbox,
        tools.clone(),
        Arc::new(super::audit::open_log(&file, &p.home)?),
    )?;
    // The calls this replica opens in the team's chain carry its name, so
    // that a survivor can end those it leaves open if it dies.
    if let (Some(chain), Some(r)) = (pipeline.audit.chain(), &replica) {
        chain.set_replica(r);
    }
    // What /readyz checks besides the policy set.
    let mut ready: Vec<crate::http::ReadyCheck> = Vec::new();
    // Replicas share approvals and plans in PostgreSQL ([store]).
    if let crate::config::store::Store::Postgres { url, ca_file, pool } = shared {
        let db = super::database::postgres(&url, ca_file.as_deref(), pool)
            .context("the team's database ([store] url_file)")?;
        pipeline.set_approval_store(
            crate::approvals::ApprovalStore::on_postgres(db.clone())
                .context("the approval store in PostgreSQL ([store] url_file)")?,
        );
        db.migrate(
            "gateway_plans_schema",
            crate::pipeline::plans::SHARED_MIGRATIONS,
        )
        .context("the shared plans in PostgreSQL ([store] url_file)")?;
        // Verdicts given on any replica wake the calls waiting here.
        let changes = Arc::clone(&pipeline.approval_changes);
        db.listen(crate::approvals::CHANGES_CHANNEL, move |_| {
            changes.notify_waiters()
        })
        .context("listening for approval changes")?;
        pipeline.approval_poll = crate::pipeline::APPROVAL_POLL_NOTIFIED;
        let at = crate::db::Db::describe(&db);
        let db = Arc::new(db);
        ready.push(database_check(Arc::clone(&db)));
        pipeline.plans = pipeline.plans.clone().shared(db);
        tracing::info!(store = %at, "approvals and plans are kept in PostgreSQL");
    }
    pipeline.endpoints = endpoints;
    pipeline.kubernetes = kubernetes;
    // Upstreams' token files may be Secret volumes, as the store's are.
    crate::tools::upstream_remote::use_secret_volumes(file.secret_volumes());
    // The approval page is served on the HTTP listener, at the resource
    // URL's origin.
    pipeline.approval_page = file
        .http
        .as_ref()
        .and_then(|h| crate::approvals::passkey::RelyingParty::new(&h.resource).ok())
        .map(|rp| format!("{}/approvals/", rp.origin()));
    pipeline.broker = broker.clone().map(|b| b as Arc<dyn crate::broker::Broker>);
    if let Some(b) = &broker {
        ready.push(vault_check(Arc::clone(b)));
    }
    let pipeline = Arc::new(pipeline);
    let mut guarded: Vec<(String, PathBuf)> = checked
        .iter()
        .map(|(w, p, _)| (w.clone(), p.clone()))
        .collect();
    guarded.push(("socket".into(), p.socket.clone()));
    let own = Arc::new(own);
    // Operator commands decide with the set the pipeline uses: the last
    // one that loaded and passed the trust check, never the files as they
    // are now.
    let store = Arc::clone(&pipeline.policy);
    let control: crate::daemon::ControlHandler =
        Arc::new(move |caller, argv| super::control::serve_command(&own, &store, caller, argv));
    let control_for_http = Arc::clone(&control);
    let mut daemon = Daemon::new(Arc::clone(&pipeline), guarded, roots, control);
    if let Some(s) = file.daemon.progress_seconds {
        if !(1..=crate::mcp::MAX_HEARTBEAT.as_secs()).contains(&s) {
            anyhow::bail!(
                "[daemon] progress_seconds is {s}: it must be 1 to {} (clients give up on a request that is silent for long)",
                crate::mcp::MAX_HEARTBEAT.as_secs()
            );
        }
        daemon.heartbeat = std::time::Duration::from_secs(s);
    }
    let daemon = Arc::new(daemon);
    let socket = p.socket.clone();
    rt.block_on(async move {
        let listener = crate::daemon::bind(&p.socket, Some(&p.group), &trust)
            .context("the daemon refuses to start")?;
        // The sandbox Jobs of replicas no longer alive are deleted by the
        // living (without Vault, this loop is also what finds them dead).
        if let (Some(sb), Some(l)) = (cluster.clone(), ledger.clone())
            && l.watch_every().is_some()
        {
            let finds_the_dead = broker.is_none();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(SWEEP_DEAD_REPLICAS);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    if finds_the_dead && let Err(e) = l.claim_orphans() {
                        tracing::warn!("looking for replicas that died: {e}");
                    }
                    let live = match l.live_replicas() {
                        Ok(Some(live)) => live,
                        Ok(None) => return,
                        Err(e) => {
                            tracing::warn!("listing the live replicas: {e}");
                            continue;
                        }
                    };
                    match sb.reap_dead_replicas(&live).await {
                        Ok(jobs) if !jobs.is_empty() => tracing::warn!(
                            ?jobs,
                            "deleted the sandbox Jobs of replicas that died"
                        ),
                        Ok(_) => {}
                        Err(e) => tracing::warn!(
                            "could not delete the sandbox Jobs of replicas that died: {e}"
                        ),
                    }
                }
            });
        }
        spawn_audit_recovery(Arc::clone(&pipeline.audit), ledger.clone(), broker.is_none());
        if let Some(b) = &broker {
            b.recover_orphans(&pipeline.audit).await;
            b.spawn_renewal();
            b.spawn_orphan_watch(Arc::clone(&pipeline.audit));
        }
        eprintln!(
            "gateway daemon: listening on {} (group {}), policies {}, state {}",
            p.socket.display(),
            p.group,
            match &file.policy_bundle {
                Some(b) => format!("signed bundle {}", b.source),
                None => p.policies.display().to_string(),
            },
            p.home.display()
        );
        let stop = tokio_util::sync::CancellationToken::new();
        if let Some(h) = &file.http {
            // Remote calls run in one workspace, checked like a socket
            // session's (below a workspace root, none of the daemon's paths).
            let workspace = daemon
                .admit_workspace(&crate::identity::Caller::this_process(), &h.workspace)
                .map_err(|e| anyhow::anyhow!("[http] workspace: {e}"))
                .context("the daemon refuses to start")?;
            let server = crate::http::HttpServer::new(
                h,
                Arc::clone(&pipeline),
                workspace,
                daemon.heartbeat,
                Arc::clone(&control_for_http),
                file.page_session_key()
                    .map_err(|e| anyhow::anyhow!(e))
                    .context("the daemon refuses to start")?,
                stop.child_token(),
            )
            .context("the daemon refuses to start")?
            .with_ready_checks(ready);
            let server = if file.telemetry.metrics_on_http() {
                server.with_metrics(Arc::clone(&pipeline))
            } else {
                server
            };
            for e in server.verifier().warm().await {
                tracing::warn!("an issuer's signing keys could not be fetched at start (tried again on the first token): {e}");
            }
            let listener = server.bind().await.context("the daemon refuses to start")?;
            eprintln!("gateway daemon: serving MCP over HTTP at {}", server.describe());
            // Calls may mint with the token from now on.
            serving.store(true, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(Arc::new(server).serve(listener, stop.clone()));
        }
        if let Some(listen) = &file.telemetry.metrics_listen {
            let listener = crate::http::metrics::bind(listen)
                .await
                .map_err(|e| anyhow::anyhow!(e))
                .context("the daemon refuses to start")?;
            eprintln!("gateway daemon: serving /metrics at http://{listen}/metrics");
            tokio::spawn(crate::http::metrics::serve(
                listener,
                Arc::clone(&pipeline),
                stop.child_token(),
            ));
        }
        if let (Some((sink, signer)), Some(x)) = (export_sink, &file.audit_export) {
            let source = match &file.store()? {
                crate::config::store::Store::Sqlite => crate::audit::export::Source::file(
                    p.home.join(crate::audit::FILE_NAME),
                    p.home.join(format!("audit-export-{}.cursor", x.name)),
                ),
                crate::config::store::Store::Postgres { url, ca_file, pool } => {
                    // A chain handle of its own (the replica's pool): the
                    // export never waits on the calls' appends, nor they
                    // on it.
                    let chain = super::database::postgres(url, ca_file.as_deref(), *pool)
                        .and_then(crate::audit::shared::SharedChain::postgres)
                        .context("the audit export's connection to PostgreSQL ([store])")?;
                    crate::audit::export::Source::Chain {
                        chain,
                        me: replica.clone().unwrap_or_else(|| {
                            format!("pid-{}-{}", std::process::id(), uuid::Uuid::new_v4().simple())
                        }),
                    }
                }
            };
            let policy = Arc::clone(&pipeline.policy);
            let warned = Arc::new(std::sync::Mutex::new(String::new()));
            let settings = Arc::new(move || {
                let data = policy
                    .current()
                    .ok()
                    .and_then(|s| s.data("data.config.audit_export").ok().flatten())
                    .unwrap_or(serde_json::Value::Null);
                crate::audit::export::Settings::from_data(&data).unwrap_or_else(|e| {
                    let mut last = warned.lock().unwrap_or_else(|p| p.into_inner());
                    if *last != e {
                        tracing::warn!("the audit export keeps its default settings: {e}");
                        *last = e;
                    }
                    crate::audit::export::Settings::default()
                })
            });
            let exporter = crate::audit::export::Exporter {
                name: x.name.clone(),
                source: Arc::new(source),
                sink,
                signer,
                settings,
            };
            eprintln!(
                "gateway daemon: exporting the audit trail ({}) to {}",
                x.sink,
                reqwest::Url::parse(&x.url)
                    .map(|u| crate::audit::export::shown(&u))
                    .unwrap_or_default()
            );
            tokio::spawn(exporter.run(stop.child_token()));
        }
        // The upstream MCP servers' tools, read at start and now and then
        // (each compared with the lock; a changed one is hidden).
        {
            let pipeline = Arc::clone(&pipeline);
            let stop = stop.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = pipeline.watch_upstreams() => {}
                    _ = stop.cancelled() => {}
                }
            });
        }
        let signals = stop.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                return;
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            signals.cancel();
        });
        // One grace for everything the stop waits on: the cancelled calls
        // ending, then their credentials' revocation.
        serving.store(true, std::sync::atomic::Ordering::SeqCst);
        let stopped = Arc::clone(&daemon).serve(listener, stop, grace).await;
        // No warm sandbox is made or kept from the stop on (a call still
        // draining runs cold); the ready ones are deleted now, the rest
        // with this gateway's Jobs below.
        if let Some(sb) = &cluster {
            sb.close_pool().await;
        }
        let deadline = stopped
            .checked_add(grace)
            .unwrap_or_else(|| stopped + crate::daemon::SHUTDOWN_GRACE);
        // An apply past its point of no return runs on after its session
        // ended: it is waited for within the same grace, and recorded as
        // interrupted if it cannot be.
        let interrupted = pipeline.drain(deadline).await;
        if interrupted > 0 {
            tracing::error!(
                interrupted,
                "applies still running when the shutdown grace ran out were killed; the audit and their approvals say so"
            );
        }
        // Calls cancelled by the stop started their revocations in the
        // background; they are finished here, before the runtime goes.
        if let Some(b) = &broker {
            // Revocation has its own time, even when an apply took the
            // whole grace.
            let revoke_by = deadline.max(tokio::time::Instant::now() + REVOKE_AT_SHUTDOWN);
            let (done, left) = b.revoke_own_by(&pipeline.audit, revoke_by).await;
            if left > 0 {
                tracing::error!(
                    revoked = done,
                    still_open = left,
                    "leases left open at shutdown stay in the ledger; the next start (or, with replicas, a survivor) revokes them"
                );
            } else {
                // No credential of this process is live: its login token
                // (AppRole, Kubernetes auth) goes too. Vault would revoke a
                // lease still open with it, so not before.
                let revoked = tokio::time::timeout(REVOKE_LOGIN_LIMIT, b.revoke_login()).await;
                log_login_revocation(revoked, "this gateway");
            }
        }
        if let Some(sb) = &cluster
            && let Err(e) = sb.reap_leftovers().await
        {
            tracing::warn!("could not delete this gateway's sandbox Jobs at shutdown: {e}");
        }
        // Events the team's chain refused while its database was away get
        // a last chance; what is left is ended by a survivor (its calls as
        // interrupted), and said here.
        let audit = Arc::clone(&pipeline.audit);
        let flush_by = tokio::time::Instant::now() + FLUSH_AT_SHUTDOWN;
        loop {
            let a = Arc::clone(&audit);
            let flushed = tokio::task::spawn_blocking(move || a.flush_spool()).await;
            if matches!(flushed, Ok(Ok(_))) || tokio::time::Instant::now() >= flush_by {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
        let left = audit.spooled();
        if left > 0 {
            tracing::error!(
                events = left,
                "audit events the team's chain refused are lost with this process; the calls they end stay open in the chain until a live replica ends them as interrupted"
            );
        }
        // The last spans go out before the process does.
        tokio::task::spawn_blocking(crate::telemetry::trace::flush).await.ok();
        anyhow::Ok(())
    })?;
    let _ = std::fs::remove_file(&socket);
    Ok(ExitCode::SUCCESS)
}

/// `/readyz`: the shared database answers a query.
fn database_check(db: Arc<crate::db::postgres::PostgresDb>) -> crate::http::ReadyCheck {
    crate::http::ReadyCheck {
        name: "database",
        check: Arc::new(move || {
            let db = Arc::clone(&db);
            Box::pin(async move {
                tokio::task::spawn_blocking(move || {
                    crate::db::Db::read(&*db, &mut |tx| {
                        tx.query("SELECT 1", &[])?;
                        Ok(crate::db::End::Rollback)
                    })
                    .map_err(|e| e.to_string())
                })
                .await
                .map_err(|e| e.to_string())?
            })
        }),
    }
}

/// How long a refused start waits for Vault to revoke its login token.
const REVOKE_LOGIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Dropped when the daemon's start ends: unless calls were served, the
/// Vault token the start logged in for (AppRole or Kubernetes auth) is
/// revoked, so that a refused start (retried by systemd, say) leaves no
/// live token behind. No credential was minted with it before `serving`.
struct RevokeLoginOnRefusal {
    broker: Option<Arc<crate::broker::vault::VaultBroker>>,
    rt: tokio::runtime::Handle,
    serving: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for RevokeLoginOnRefusal {
    fn drop(&mut self) {
        if self.serving.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let Some(b) = self.broker.take() else {
            return;
        };
        let revoked = self
            .rt
            .block_on(async { tokio::time::timeout(REVOKE_LOGIN_LIMIT, b.revoke_login()).await });
        log_login_revocation(revoked, "this refused start");
    }
}

/// Log what came of revoking the Vault token `who` logged in for.
fn log_login_revocation(
    revoked: Result<Result<bool, crate::broker::BrokerError>, tokio::time::error::Elapsed>,
    who: &str,
) {
    match revoked {
        Ok(Ok(true)) => tracing::info!("revoked the Vault token {who} logged in for"),
        Ok(Ok(false)) => {}
        Ok(Err(e)) => tracing::warn!(
            "the Vault token {who} logged in for was not revoked (it lives until its TTL): {e}"
        ),
        Err(_) => tracing::warn!(
            "the Vault token {who} logged in for was not revoked within {} s (it lives until its TTL)",
            REVOKE_LOGIN_LIMIT.as_secs()
        ),
    }
}

/// How long the start waits for Vault to say whether the lanes are set up.
const LANE_CHECK_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The Vault roles the policy set names (`data.config.vault_roles`), by
/// mount: the Kubernetes secrets engine mounts its credentials are minted
/// on.
fn role_mounts(
    set: &crate::policy::PolicySet,
) -> BTreeMap<String, std::collections::BTreeSet<String>> {
    let roles = set
        .data("data.config.vault_roles.roles")
        .ok()
        .flatten()
        .unwrap_or_default();
    let mut by_mount: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for (name, role) in roles.as_object().into_iter().flatten() {
        let mount = role["mount"].as_str().unwrap_or("").trim_matches('/');
        if !mount.is_empty() {
            by_mount
                .entry(mount.to_string())
                .or_default()
                .insert(name.clone());
        }
    }
    by_mount
}

/// `/readyz`: the gateway's own Vault token is valid (Vault reachable,
/// unsealed, the token not expired or revoked).
fn vault_check(broker: Arc<crate::broker::vault::VaultBroker>) -> crate::http::ReadyCheck {
    crate::http::ReadyCheck {
        name: "vault",
        check: Arc::new(move || {
            let b = Arc::clone(&broker);
            Box::pin(async move { b.check().await.map(|_| ()).map_err(|e| e.to_string()) })
        }),
    }
}
