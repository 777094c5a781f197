//! `gateway serve`: MCP over stdio. stdout carries only protocol; logs go to
//! stderr.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use rmcp::ServiceExt;

use super::Cli;
use crate::audit::{AuditLog, Event};
use crate::mcp::GatewayServer;
use crate::pipeline::Pipeline;
use crate::policy::PolicyStore;
use crate::policy::set::LoadOptions;
use crate::policy::store::{DEFAULT_POLL_INTERVAL, PolicyEvent, log_event};
use crate::sandbox::local::{LocalConfig, LocalSandbox};
use crate::tools::ToolPaths;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Where agents' working_dirs are resolved (the repository) [default: config, else .].
    #[arg(long, env = "GATEWAY_WORKSPACE")]
    workspace: Option<PathBuf>,
    /// An endpoint a decision may allow, as NAME=PORT (a TCP port on this
    /// host), e.g. kube-apiserver=6443. Repeatable.
    #[arg(long = "endpoint", env = "GATEWAY_ENDPOINTS", value_delimiter = ',')]
    endpoints: Vec<String>,
}

pub fn run(cli: &Cli, a: &ServeArgs) -> anyhow::Result<ExitCode> {
    let home = cli.home();
    std::fs::create_dir_all(&home).with_context(|| format!("cannot create {}", home.display()))?;
    let mut endpoints: BTreeMap<String, u16> = cli.file.endpoints.clone();
    for e in &a.endpoints {
        let (name, port) = e.split_once('=').context("--endpoint takes NAME=PORT")?;
        endpoints.insert(
            name.to_string(),
            port.parse::<u16>()
                .with_context(|| format!("--endpoint {e}: bad port"))?,
        );
    }
    let policy = Arc::new(PolicyStore::open(
        vec![cli.policies.clone()],
        LoadOptions::default(),
    ));
    let audit = AuditLog::in_home(&home)?;
    match policy.current() {
        Ok(set) => {
            audit.record(
                "",
                Event::PolicyLoaded {
                    fingerprint: set.fingerprint.clone(),
                    files: set.files.len(),
                },
            )?;
        }
        Err(e) => {
            tracing::error!("the policy set does not load; every call will be denied: {e}");
            audit.record("", Event::PolicyLoadFailed { error: e.clone() })?;
        }
    }
    let watch_audit = AuditLog::in_home(&home)?;
    let _watch = policy.watch(DEFAULT_POLL_INTERVAL, move |ev| {
        log_event(ev);
        let event = match ev {
            PolicyEvent::Reloaded { fingerprint, files } => Event::PolicyReloaded {
                fingerprint: fingerprint.clone(),
                files: *files,
            },
            PolicyEvent::ReloadFailed { error, active } => Event::PolicyReloadFailed {
                error: error.clone(),
                active: active.clone(),
            },
        };
        let _ = watch_audit.record("", event);
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut cluster: Option<crate::sandbox::kubernetes::KubernetesSandbox> = None;
    let sandbox: Arc<dyn crate::sandbox::Sandbox> = match cli.file.sandbox.backend.as_str() {
        "kubernetes" => {
            let cfg = cli.file.sandbox.kubernetes.clone();
            let sb = rt.block_on(async {
                let client = crate::sandbox::kubernetes::client(&cfg).await?;
                let sb = crate::sandbox::kubernetes::KubernetesSandbox::new(client, cfg);
                // Jobs a previous run of this instance left are removed first.
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
        _ => Arc::new(LocalSandbox::new(LocalConfig {
            runsc: cli.file.sandbox.runsc.clone(),
            platform: cli.file.sandbox.platform.clone(),
            ..LocalConfig::default()
        })?),
    };
    let ws = a
        .workspace
        .clone()
        .or_else(|| cli.file.workspace.clone())
        .unwrap_or_else(|| PathBuf::from("."));
    let workspace =
        std::fs::canonicalize(&ws).with_context(|| format!("workspace {}", ws.display()))?;
    let mut tools = ToolPaths::discover(&workspace);
    tools.provider_mirror = cli.file.sandbox.provider_mirror.clone();
    let broker = super::vault::broker(cli, &home)?;
    let kubernetes = super::vault::kubernetes_access(cli)?;
    let mut pipeline = Pipeline::new(policy, home, workspace, sandbox, tools)?;
    pipeline.endpoints = endpoints;
    pipeline.kubernetes = kubernetes;
    pipeline.broker = broker.clone().map(|b| b as Arc<dyn crate::broker::Broker>);
    let pipeline = Arc::new(pipeline);
    let server = GatewayServer::new(Arc::clone(&pipeline));
    rt.block_on(async move {
        if let Some(b) = &broker {
            // Leases a previous gateway left open are revoked before any
            // new call, and the gateway's own token is kept alive.
            b.recover_orphans(&pipeline.audit).await;
            b.spawn_renewal();
        }
        let service = server
            .serve(rmcp::transport::stdio())
            .await
            .context("MCP initialisation")?;
        let ended = service.waiting().await.context("MCP session");
        // Shutting down: calls still in flight are abandoned; delete their
        // Jobs now rather than leave them to the next start.
        if let Some(sb) = &cluster
            && let Err(e) = sb.reap_leftovers().await
        {
            tracing::warn!("could not delete this gateway's sandbox Jobs at shutdown: {e}");
        }
        ended?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
