//! `gateway serve`: what an MCP client starts. It runs as the user, holds
//! nothing and decides nothing: it tells the daemon which workspace the
//! session is for, then relays MCP between stdio and the daemon's socket,
//! byte for byte (protocol versions, progress and cancellation pass
//! through). When the client closes stdin or goes away, the connection
//! closes and the daemon cancels the session's calls.
//!
//! It takes no option that changes policy, configuration or state: those
//! belong to the daemon, and `--policies`, `--home` and `--config` (or
//! their environment variables) make it refuse to start.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};

use super::Cli;
use crate::daemon::wire::{self, Ack, Hello};

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The repository the agent works in: its `working_dir`s resolve here
    /// (it must be yours) [default: the current dir].
    #[arg(long)]
    workspace: Option<PathBuf>,
    /// The daemon's socket [default: $GATEWAY_SOCKET, else /run/gateway/gateway.sock].
    #[arg(long)]
    socket: Option<PathBuf>,
}

pub fn run(cli: &Cli, a: &ServeArgs) -> anyhow::Result<ExitCode> {
    if cli.policies_arg.is_some() || cli.home.is_some() || cli.config.is_some() {
        bail!(
            "gateway serve takes no --policies, --home or --config (nor GATEWAY_POLICIES, \
             GATEWAY_HOME, GATEWAY_CONFIG): policies, configuration and state belong to the \
             daemon (gateway daemon); unset them"
        );
    }
    let ws = match &a.workspace {
        Some(w) => w.clone(),
        None => std::env::current_dir().context("the current dir")?,
    };
    let workspace =
        std::fs::canonicalize(&ws).with_context(|| format!("workspace {}", ws.display()))?;
    let socket = a.socket.clone().unwrap_or_else(super::control::socket_path);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(relay(&socket, workspace))?;
    Ok(ExitCode::SUCCESS)
}

async fn relay(socket: &std::path::Path, workspace: PathBuf) -> anyhow::Result<()> {
    let stream = super::control::connect(socket).await?;
    let (read, mut to_daemon) = stream.into_split();
    let mut from_daemon = BufReader::new(read);
    to_daemon
        .write_all(&wire::line(&Hello::Mcp { workspace }))
        .await
        .context("sending the hello to the daemon")?;
    let ack = wire::read_line(&mut from_daemon, wire::MAX_HELLO)
        .await
        .context("reading the daemon's answer")?
        .context("the daemon closed the connection")?;
    let ack: Ack = serde_json::from_str(&ack).context("the daemon's answer is not an ack")?;
    if !ack.ok {
        bail!(
            "the daemon refused the session: {}",
            ack.error.unwrap_or_default()
        );
    }
    let up = async {
        pump(&mut tokio::io::stdin(), &mut to_daemon).await?;
        // The client is done: the daemon sees the end of the stream.
        to_daemon.shutdown().await
    };
    let mut stdout = tokio::io::stdout();
    let down = pump(&mut from_daemon, &mut stdout);
    tokio::pin!(up);
    tokio::pin!(down);
    // The session ends when the daemon closes; an early client EOF just
    // half-closes, so that replies still in flight are delivered.
    let mut up_done = false;
    loop {
        tokio::select! {
            r = &mut up, if !up_done => {
                up_done = true;
                if let Err(e) = r {
                    // stdin or the socket broke: nothing more can be relayed.
                    return Err(anyhow::Error::new(e).context("relaying to the daemon"));
                }
            }
            r = &mut down => {
                return r.context("relaying from the daemon");
            }
        }
    }
}

/// Copy until the end of `from`, flushing after every read (MCP messages
/// must not wait in a buffer).
async fn pump<R, W>(from: &mut R, to: &mut W) -> std::io::Result<()>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        to.write_all(&buf[..n]).await?;
        to.flush().await?;
    }
}
