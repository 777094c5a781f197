//! The command line (README.md: command line).

mod approvals;
mod audit;
mod control;
mod daemon;
mod database;
mod demo;
mod dev;
pub(crate) mod doctor;
mod install;
mod login;
pub mod out;
mod policy;
mod serve;
mod upstream;
mod vault;
mod verify;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "gateway",
    version,
    about = "Policy-gated, sandboxed infrastructure actions for AI coding agents"
)]
pub struct Cli {
    /// Directory of the Rego policies and their data files [default:
    /// ./policies; for the daemon, its config's, else /etc/gateway/policies].
    #[arg(long = "policies", global = true, env = "GATEWAY_POLICIES")]
    pub policies_arg: Option<PathBuf>,

    /// Where approvals, the audit log and saved plans live [default:
    /// $XDG_STATE_HOME/gateway or ~/.local/state/gateway; for the daemon, its
    /// config's, else /var/lib/gateway]. Given to approvals|approve|deny|audit,
    /// they work on this dir directly instead of asking the daemon.
    #[arg(long, global = true, env = "GATEWAY_HOME")]
    pub home: Option<PathBuf>,

    /// The configuration file (only this one is read; a gateway.toml in the
    /// current dir is not).
    #[arg(long, global = true, env = "GATEWAY_CONFIG")]
    pub config: Option<PathBuf>,

    /// The loaded configuration (flags and environment override it).
    #[arg(skip)]
    pub file: crate::config::GatewayConfig,

    /// The policy dir in use: flag or env, else the config file, else ./policies.
    #[arg(skip)]
    pub policies: PathBuf,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// MCP over stdio, relayed to the daemon: what an MCP client starts.
    Serve(serve::ServeArgs),
    /// The privileged service that owns policies, state and sandboxes
    /// (`gateway daemon install` sets it up).
    Daemon(daemon::DaemonArgs),
    /// Write an MCP client's config for this user (`gateway client install claude-code`).
    #[command(subcommand)]
    Client(install::ClientCommand),
    /// Evaluate, test and check policies.
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    /// Sign in at the team's OpenID provider for a remote gateway (a code
    /// to confirm in any browser); the token is kept for `gateway approve`.
    Login(login::LoginArgs),
    /// Pending approvals and what they would do (`approvals show ID`).
    Approvals(approvals::ApprovalsArgs),
    /// Approve a pending call (a person, out of band; never the agent).
    Approve(approvals::VerdictArgs),
    /// Deny a pending call.
    Deny(approvals::VerdictArgs),
    /// Read the audit trail (`audit verify` checks its hash chain).
    Audit(audit::AuditArgs),
    /// The credential broker: set up Vault/OpenBao, check it, recover leases.
    #[command(subcommand)]
    Vault(vault::VaultCommand),
    /// Upstream MCP servers behind the gateway: list them, lock their tools, show what changed.
    #[command(subcommand)]
    Upstream(upstream::UpstreamCommand),
    /// Prove the sandbox isolation claims (kernel, egress, endpoints, files, limits).
    Verify(verify::VerifyArgs),
    /// The forces-replacement scenario end to end (local gVisor sandbox, real Terraform).
    Demo,
    /// Check the host and the installation; each problem with the command that fixes it.
    Doctor(doctor::DoctorArgs),
}

impl Cli {
    /// Parse the command line, with each subcommand's help showing only
    /// the options it takes: `serve` and `client` refuse the global
    /// `--policies`, `--home` and `--config` (a caller's flag never changes
    /// what the daemon does), so their help does not offer them.
    pub fn parse_shown() -> Cli {
        use clap::{CommandFactory, FromArgMatches};
        let mut cmd = Cli::command();
        // A subcommand that already has an argument of a global's id does
        // not get the global pushed into it: give these hidden copies.
        let hidden: Vec<clap::Arg> = cmd
            .get_arguments()
            .filter(|a| a.is_global_set())
            .map(|a| a.clone().hide(true))
            .collect();
        for sub in ["serve", "client"] {
            let hidden = hidden.clone();
            cmd = cmd.mut_subcommand(sub, |s| s.args(hidden));
        }
        let matches = cmd.get_matches();
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }

    /// The state directory in use: flag or env, else the config file, else the default.
    pub fn home(&self) -> PathBuf {
        self.home
            .clone()
            .or_else(|| self.file.home.clone())
            .unwrap_or_else(crate::config::default_home)
    }

    /// Load the configuration file and resolve the settings that depend on it.
    pub fn resolve(mut self) -> anyhow::Result<Cli> {
        // Only a file named on purpose: a gateway.toml in the current dir
        // (someone else's repository, perhaps) is never read by itself.
        if let Some(path) = &self.config {
            self.file = crate::config::GatewayConfig::load(path, true)?;
        }
        self.policies = self
            .policies_arg
            .clone()
            .or_else(|| self.file.policies.clone())
            .unwrap_or_else(|| PathBuf::from("policies"));
        Ok(self)
    }
}

/// Logs go to stderr (stdout is for results and, for `serve`, protocol),
/// filtered by `RUST_LOG` (default: warnings and errors). rmcp logs
/// nothing by default: its service loop logs each error response it sends
/// (answers to a client: an unknown tool, a task id it does not have,
/// audited where they matter), and as a remote upstream's client it logs
/// a hostile server's text as it came (content types, error bodies, tool
/// names), which could forge log lines or carry a token; the gateway logs
/// what matters of both itself.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,rustify=off,rmcp=off"));
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    // The commands an unprivileged user runs against the daemon read no
    // file of the current dir; the daemon reads only its own.
    let direct = cli.home.is_some() || cli.config.is_some() || cli.policies_arg.is_some();
    let served_by_daemon = matches!(
        &cli.command,
        Command::Approvals(_)
            | Command::Approve(_)
            | Command::Deny(_)
            | Command::Audit(_)
            | Command::Vault(vault::VaultCommand::Status)
    );
    if served_by_daemon && !direct {
        return match &cli.command {
            Command::Approve(a) => control::forward_verdict(a, a.id(), true),
            Command::Deny(a) => control::forward_verdict(a, a.id(), false),
            Command::Approvals(a) if a.watch_interval().is_some() => {
                control::watch(a.watch_interval().unwrap_or(2))
            }
            _ => control::forward(),
        };
    }
    match &cli.command {
        Command::Serve(a) => return serve::run(&cli, a),
        Command::Client(_) if direct => {
            anyhow::bail!(
                "gateway client install takes no --policies, --home or --config (nor their \
                 GATEWAY_* variables): the config it writes starts `gateway serve`, which \
                 takes none of them"
            )
        }
        Command::Client(c) => return install::client(c),
        Command::Login(a) => return login::run(a),
        Command::Daemon(a) => return daemon::run(&cli, a),
        // The doctor reports a broken configuration instead of stopping at it.
        Command::Doctor(a) => return doctor::run(&cli, a),
        _ => {}
    }
    let cli = cli.resolve()?;
    use crate::identity::DIRECT;
    let me = crate::identity::Caller::this_process();
    let mut o = out::Out::default();
    let code = match &cli.command {
        Command::Policy(cmd) => return policy::run(&cli, cmd),
        Command::Approvals(a) if a.watch_interval().is_some() => {
            return approvals::watch_direct(&cli, a.watch_interval().unwrap_or(2));
        }
        Command::Approvals(a) => approvals::list(&cli, a, None, &mut o),
        Command::Approve(a) | Command::Deny(a) => {
            let grant = matches!(&cli.command, Command::Approve(_));
            let signed = a.signed(grant, &mut |verdict, reason, valid_for| {
                approvals::statement_direct(&cli, a.id(), verdict, reason, valid_for)
            });
            match (approvals::load_policies(&cli), signed) {
                (Ok(set), Ok(signed)) => approvals::verdict(
                    &cli,
                    &signed,
                    grant,
                    &crate::daemon::Asker::Os(me.clone()),
                    DIRECT,
                    &set,
                    &mut o,
                ),
                (Err(e), _) | (_, Err(e)) => Err(e),
            }
        }
        Command::Audit(a) => audit::run(&cli, a, &mut o),
        Command::Demo => return demo::run(&cli),
        Command::Verify(a) => return verify::run(&cli, a),
        Command::Vault(c) => return vault::run(&cli, c),
        Command::Upstream(c) => return upstream::run(&cli, c),
        // Run above, before any configuration is read.
        Command::Serve(_)
        | Command::Client(_)
        | Command::Daemon(_)
        | Command::Doctor(_)
        | Command::Login(_) => {
            return Ok(ExitCode::from(2));
        }
    };
    match code {
        Ok(code) => Ok(o.print(code)),
        Err(e) => {
            // What was gathered before the error is still shown.
            let _ = o.print(0);
            Err(e)
        }
    }
}
