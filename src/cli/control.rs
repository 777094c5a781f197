//! Operator commands through the daemon: `gateway approvals|approve|deny|
//! audit|vault status` with no `--home`/`--config`/`--policies` are sent to
//! the daemon's socket as argv ([`forward`]); the daemon parses them again
//! with only the commands it serves and runs them with the caller's
//! kernel-given identity as the approver ([`serve_command`]).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Parser;
use tokio::io::{AsyncWriteExt, BufReader};

use super::Cli;
use super::out::Out;
use crate::daemon::Asker;
use crate::daemon::wire::{self, Hello, Reply};
use crate::policy::PolicySet;

/// The socket the CLI talks to: `GATEWAY_SOCKET`, else the default.
pub fn socket_path() -> PathBuf {
    std::env::var_os("GATEWAY_SOCKET")
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(crate::config::DAEMON_SOCKET))
}

/// Connect to the daemon, naming the socket and what to do when it fails.
pub async fn connect(socket: &std::path::Path) -> anyhow::Result<tokio::net::UnixStream> {
    tokio::net::UnixStream::connect(socket).await.with_context(|| {
        format!(
            "cannot reach the gateway daemon at {} (is it running? systemctl status gateway; \
             is this user in its group? id -nG). To read a state dir of your own directly, pass --home DIR",
            socket.display()
        )
    })
}

/// Send `argv` (without the program name) to the daemon; its reply.
pub fn ask(argv: Vec<String>) -> anyhow::Result<Reply> {
    ask_checked(argv, false)
}

/// [`ask`]; with `root_only`, only a daemon running as root is asked
/// (what `gateway approve` signs for must come from the real daemon, not a
/// socket the caller's environment points elsewhere).
pub fn ask_checked(argv: Vec<String>, root_only: bool) -> anyhow::Result<Reply> {
    if let Some(url) = std::env::var("GATEWAY_URL").ok().filter(|u| !u.is_empty()) {
        return ask_remote(&url, argv);
    }
    let socket = socket_path();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let stream = connect(&socket).await?;
        if root_only {
            let peer = stream.peer_cred().context("the daemon's credentials")?;
            anyhow::ensure!(
                peer.uid() == 0,
                "the socket {} is served by uid {}, not by the root daemon: not signing anything it sends",
                socket.display(),
                peer.uid()
            );
        }
        let (read, mut write) = stream.into_split();
        write
            .write_all(&wire::line(&Hello::Control { argv }))
            .await
            .context("sending the command to the daemon")?;
        let mut read = BufReader::new(read);
        let line = wire::read_line(&mut read, wire::MAX_REPLY)
            .await
            .context("reading the daemon's answer")?
            .context("the daemon closed the connection without an answer")?;
        let reply: Reply =
            serde_json::from_str(&line).context("the daemon's answer is not a reply")?;
        anyhow::Ok(reply)
    })
}

/// A team gateway (`GATEWAY_URL`, its MCP endpoint): the command goes over
/// HTTPS to `<url>/control` with the person's access token
/// (`GATEWAY_TOKEN`, or the file `GATEWAY_TOKEN_FILE` names), checked by
/// the gateway like an agent's; `GATEWAY_CA_FILE` adds a CA to the
/// system's. The server's certificate is what stands for the daemon here.
fn ask_remote(url: &str, argv: Vec<String>) -> anyhow::Result<Reply> {
    let parsed = reqwest::Url::parse(url).with_context(|| format!("GATEWAY_URL {url:?}"))?;
    let loopback = parsed.host_str().is_some_and(|h| {
        h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
    });
    anyhow::ensure!(
        parsed.scheme() == "https" || (parsed.scheme() == "http" && loopback),
        "GATEWAY_URL {url:?}: a team gateway is reached over https://"
    );
    let token = match std::env::var("GATEWAY_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
    {
        Some(t) => t,
        None => {
            let file = std::env::var_os("GATEWAY_TOKEN_FILE")
                .filter(|f| !f.is_empty())
                .map(PathBuf::from)
                .or_else(|| super::login::default_token_file().filter(|f| f.exists()))
                .context("GATEWAY_URL is set but there is no token: run gateway login, or set GATEWAY_TOKEN or GATEWAY_TOKEN_FILE")?;
            std::fs::read_to_string(&file)
                .with_context(|| {
                    format!(
                        "reading GATEWAY_TOKEN_FILE {}",
                        PathBuf::from(&file).display()
                    )
                })?
                .trim()
                .to_string()
        }
    };
    // The token goes only to the gateway it was issued for: a GATEWAY_URL
    // someone else set (a planted .envrc) does not get it.
    let audience = token_audience(&token);
    anyhow::ensure!(
        audience
            .iter()
            .any(|a| a.trim_end_matches('/') == url.trim_end_matches('/')),
        "the token is for {}, not for GATEWAY_URL {url}: not sending it (run gateway login for this gateway)",
        if audience.is_empty() {
            "no audience it names".to_string()
        } else {
            audience.join(", ")
        }
    );
    let control = format!("{}/control", url.trim_end_matches('/'));
    let ca = std::env::var_os("GATEWAY_CA_FILE").filter(|f| !f.is_empty());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut b = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(60))
            .redirect(reqwest::redirect::Policy::none());
        if let Some(ca) = &ca {
            let pem = std::fs::read(ca)
                .with_context(|| format!("GATEWAY_CA_FILE {}", PathBuf::from(ca).display()))?;
            for cert in reqwest::Certificate::from_pem_bundle(&pem).context("GATEWAY_CA_FILE")? {
                b = b.add_root_certificate(cert);
            }
        }
        let r = b
            .build()?
            .post(&control)
            .bearer_auth(&token)
            .json(&serde_json::json!({ "argv": argv }))
            .send()
            .await
            .map_err(|e| {
                anyhow::anyhow!("cannot reach the gateway at {control}: {}", e.without_url())
            })?;
        let status = r.status();
        let text = r.text().await.unwrap_or_default();
        if !status.is_success() {
            bail!("the gateway refused ({status}): {}", text.trim());
        }
        serde_json::from_str::<Reply>(&text).context("the gateway's answer is not a reply")
    })
}

/// The audiences a JWT access token names (unverified: only to decide
/// where this client may send it).
fn token_audience(token: &str) -> Vec<String> {
    let claims = crate::http::auth::unverified_claims(token);
    match &claims["aud"] {
        serde_json::Value::String(a) => vec![a.clone()],
        serde_json::Value::Array(a) => a
            .iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect(),
        _ => Vec::new(),
    }
}

fn print(reply: Reply) -> ExitCode {
    let out = Out {
        stdout: reply.stdout,
        stderr: reply.stderr,
    };
    out.print(reply.code)
}

/// Send this process's command line to the daemon and print its answer.
pub fn forward() -> anyhow::Result<ExitCode> {
    let argv: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| {
            a.into_string()
                .map_err(|_| anyhow::anyhow!("an argument is not valid UTF-8"))
        })
        .collect::<Result<_, _>>()?;
    Ok(print(ask(argv)?))
}

/// `gateway approve|deny` through the daemon: sign here (this user's key,
/// this user's terminal for a passphrase or a touch) over the statement
/// the daemon gives, then send the statement and signature.
pub fn forward_verdict(
    a: &super::approvals::VerdictArgs,
    id: &str,
    grant: bool,
) -> anyhow::Result<ExitCode> {
    let signed = a.signed(grant, &mut |verdict, reason, valid_for| {
        let reply = ask_checked(wire::statement_argv(id, verdict, reason, valid_for), true)?;
        if reply.code != 0 {
            anyhow::bail!(
                "the daemon gave no statement to sign: {}",
                reply.stderr.trim()
            );
        }
        Ok(reply.stdout)
    })?;
    Ok(print(ask(signed.to_argv(grant))?))
}

/// `gateway approvals watch` through the daemon: one question per look.
pub fn watch(interval: u64) -> anyhow::Result<ExitCode> {
    let json_of = |argv: Vec<&str>| -> anyhow::Result<serde_json::Value> {
        let reply = ask(argv.into_iter().map(String::from).collect())?;
        anyhow::ensure!(reply.code == 0, "{}", reply.stderr.trim());
        serde_json::from_str(&reply.stdout).context("the daemon's answer is not JSON")
    };
    super::approvals::watch(
        interval,
        &mut || {
            Ok(json_of(vec!["approvals", "--json"])?
                .as_array()
                .cloned()
                .unwrap_or_default())
        },
        &mut |id| {
            json_of(vec!["approvals", "show", id, "--json"])
                .ok()
                .and_then(|v| v["state"].as_str().map(String::from))
        },
    )
}

/// The commands the daemon serves on its socket.
#[derive(Debug, clap::Parser)]
#[command(
    name = "gateway",
    no_binary_name = true,
    disable_help_subcommand = true
)]
struct Served {
    #[command(subcommand)]
    command: ServedCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ServedCommand {
    Approvals(super::approvals::ApprovalsArgs),
    Approve(super::approvals::VerdictArgs),
    Deny(super::approvals::VerdictArgs),
    Audit(super::audit::AuditArgs),
    #[command(subcommand)]
    Vault(ServedVault),
}

#[derive(Debug, clap::Subcommand)]
enum ServedVault {
    Status,
}

/// Run one command for `caller` with the daemon's own settings (`own`).
pub fn serve_command(
    own: &Cli,
    store: &crate::policy::PolicyStore,
    caller: &Asker,
    argv: Vec<String>,
) -> Reply {
    let parsed = match Served::try_parse_from(&argv) {
        Ok(p) => p,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let text = e.render().to_string();
            return if e.use_stderr() {
                Reply {
                    code,
                    stdout: String::new(),
                    stderr: format!(
                        "{text}\n(the daemon serves: approvals, approve, deny, audit, vault status)\n"
                    ),
                }
            } else {
                Reply {
                    code,
                    stdout: text,
                    stderr: String::new(),
                }
            };
        }
    };
    let set = match store.current() {
        Ok(set) => set,
        Err(e) => return Reply::refused(format!("the daemon has no usable policy set: {e}")),
    };
    let mut o = Out::default();
    let result = run(own, &set, caller, parsed.command, &mut o);
    match result {
        Ok(code) => Reply {
            code,
            stdout: o.stdout,
            stderr: o.stderr,
        },
        Err(e) => Reply {
            code: 2,
            stdout: o.stdout,
            stderr: format!("{}gateway: {}\n", o.stderr, crate::error_chain(e.as_ref())),
        },
    }
}

/// Ask `data.gateway.approvals.RULE` about `caller` (and `command`):
/// `may_approve` (approve, and see every user's approvals) or `may_run`
/// (run this operator command). Anything but `true` is no.
fn allowed(set: &PolicySet, rule: &str, caller: &Asker, command: &str) -> bool {
    let input = caller.policy_input(caller.channel(), command);
    set.eval_rule(
        &format!("data.gateway.approvals.{rule}"),
        regorus::Value::from(input),
    )
    .is_ok_and(|v| v == serde_json::Value::Bool(true))
}

fn run(
    own: &Cli,
    set: &PolicySet,
    caller: &Asker,
    cmd: ServedCommand,
    o: &mut Out,
) -> anyhow::Result<u8> {
    // Who may run which command is the policy's (data.gateway.approvals.may_run).
    let may_run = |command: &str| -> anyhow::Result<()> {
        if !allowed(set, "may_run", caller, command) {
            bail!(
                "{command} is for approvers, and {} is not one (data.config.approvals.identity)",
                caller.name()
            );
        }
        Ok(())
    };
    match cmd {
        ServedCommand::Approvals(a) => {
            may_run("approvals")?;
            let only_of = (!allowed(set, "may_approve", caller, "approvals")).then(|| caller.id());
            super::approvals::list(own, &a, only_of.as_deref(), o)
        }
        ServedCommand::Approve(a) | ServedCommand::Deny(a) if a.names_files() => bail!(
            "--key, --signature and --statement are read by the gateway command on the caller's side, \
             never by the daemon: run `gateway approve` itself, not a hand-made request"
        ),
        ServedCommand::Approve(a) => {
            super::approvals::verdict(own, &a, true, caller, caller.channel(), set, o)
        }
        ServedCommand::Deny(a) => {
            super::approvals::verdict(own, &a, false, caller, caller.channel(), set, o)
        }
        ServedCommand::Audit(a) if a.names_a_file() => {
            bail!(
                "--file and export are not accepted through the daemon: it reads its own audit log and writes no file a caller names (run them with --config or --home)"
            )
        }
        ServedCommand::Audit(a) => {
            may_run("audit")?;
            super::audit::run(own, &a, o)
        }
        ServedCommand::Vault(ServedVault::Status) => {
            may_run("vault status")?;
            super::vault::status(own, o)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_verdict_reaches_the_daemon_whole_whatever_its_values_start_with() {
        let sig = "-----BEGIN SSH SIGNATURE-----\nU1NIU0lH\n-----END SSH SIGNATURE-----\n";
        let Served {
            command: ServedCommand::Approve(a),
        } = Served::try_parse_from([
            "approve",
            "ap-1",
            "--reason=-rf is fine",
            "--signed-statement={\"a\":1}\n",
            &format!("--ssh-signature={sig}"),
        ])
        .expect("parse")
        else {
            panic!("not an approve");
        };
        let again = Served::try_parse_from(a.to_argv(true)).expect("round trip");
        let ServedCommand::Approve(b) = again.command else {
            panic!("not an approve");
        };
        assert_eq!(b.to_argv(true), a.to_argv(true));
        assert!(a.to_argv(true).contains(&format!("--ssh-signature={sig}")));
        assert!(
            a.to_argv(true)
                .contains(&"--reason=-rf is fine".to_string())
        );
        assert!(!b.names_files());
    }
}
