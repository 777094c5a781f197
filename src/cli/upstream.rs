//! `gateway upstream list|lock|diff|test`: the upstream MCP servers the
//! policy declares (config/upstreams), and the lock that pins each one's
//! tool definitions (config/upstream_lock/data.json). `lock` and `diff`
//! start each server as a call would (a throwaway gVisor sandbox, its
//! declared paths, no network) and read its tools.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::Cli;
use super::out::print_safe;
use crate::policy::PolicySet;
use crate::policy::set::LoadOptions;
use crate::tools::upstream::{self, Server};

/// Where the lock is, under the policy dir.
pub const LOCK_FILE: &str = "config/upstream_lock/data.json";

#[derive(Debug, clap::Subcommand)]
pub enum UpstreamCommand {
    /// The declared upstreams and their locked tools, with each tool's tier.
    List(ListArgs),
    /// Start each upstream (or those named), read its tools and pin the ones you accept in the lock file.
    ///
    /// A tool new or changed since the last lock is pinned only when accepted by name (--accept
    /// fs.write_file) or all at once (--all); read `gateway upstream diff` first.
    ///
    /// Example: gateway upstream lock fs --all
    Lock(LockArgs),
    /// What changed on each upstream since its tools were locked; exit 1 on any difference.
    ///
    /// Example: gateway upstream diff
    Diff(SelectArgs),
    /// Start one upstream as a call would and say whether every locked tool is still as locked.
    ///
    /// Example: gateway upstream test fs
    Test(TestArgs),
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct SelectArgs {
    /// Upstream names (all declared ones when none is given).
    names: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct LockArgs {
    #[command(flatten)]
    select: SelectArgs,
    /// Accept this new or changed tool (UPSTREAM.TOOL, or UPSTREAM.TOOL=SHA256 as `diff` shows it, to lock only that definition); repeatable.
    #[arg(long, value_name = "UPSTREAM.TOOL[=SHA256]")]
    accept: Vec<String>,
    /// Accept every new or changed tool of the selected upstreams.
    #[arg(long)]
    all: bool,
}

/// The most tools one upstream may have locked, and the largest definition
/// (each one is in every decision's catalog).
const MAX_TOOLS: usize = 256;
const MAX_DEFINITION_BYTES: usize = 64 << 10;

#[derive(Debug, clap::Args)]
pub struct TestArgs {
    /// The upstream's name.
    name: String,
}

pub fn run(cli: &Cli, cmd: &UpstreamCommand) -> anyhow::Result<ExitCode> {
    let set = PolicySet::load(std::slice::from_ref(&cli.policies), &LoadOptions::default())
        .with_context(|| format!("loading the policies in {}", cli.policies.display()))?;
    let declared = declared(&set)?;
    let lock_path = cli.policies.join(LOCK_FILE);
    let lock = read_lock(&lock_path)?;
    match cmd {
        UpstreamCommand::List(a) => list(&set, &declared, &lock, a.json),
        UpstreamCommand::Lock(a) => {
            let names = selected(&declared, &a.select.names)?;
            let live = read_live(cli, &declared, &names)?;
            let mut new_lock = lock.clone();
            // Upstreams no longer declared leave the lock.
            new_lock.retain(|k, _| declared.contains_key(k));
            let mut skipped = Vec::new();
            let mut waiting = Vec::new();
            for (name, report) in &live {
                let before = lock
                    .get(name)
                    .and_then(|l| l["tools"].as_object().cloned())
                    .unwrap_or_default();
                let mut tools = serde_json::Map::new();
                let mut seen = std::collections::BTreeSet::new();
                let listed = report.tools.clone().unwrap_or_default();
                if listed.len() > MAX_TOOLS {
                    bail!(
                        "upstream {name:?} lists {} tools, more than the {MAX_TOOLS} one upstream may have locked",
                        listed.len()
                    );
                }
                for def in &listed {
                    let t = def["name"].as_str().unwrap_or_default().to_string();
                    if !seen.insert(t.clone()) {
                        bail!(
                            "upstream {name:?} lists tool {} twice: refused (which one would a call get?)",
                            shown(&t)
                        );
                    }
                    if let Some(why) = upstream::unusable(def) {
                        skipped.push(format!("{name}.{}: not locked: {why}", shown(&t)));
                        continue;
                    }
                    let text = serde_json::to_string(def)?;
                    if text.len() > MAX_DEFINITION_BYTES {
                        skipped.push(format!(
                            "{name}.{t}: not locked: its definition is {} bytes, more than {MAX_DEFINITION_BYTES}",
                            text.len()
                        ));
                        continue;
                    }
                    let digest = upstream::definition_digest(def);
                    let same =
                        before.get(&t).and_then(|l| l["sha256"].as_str()) == Some(digest.as_str());
                    let full = format!("{name}.{t}");
                    // Accepted with the digest `diff` showed: only that
                    // definition (a server that shows the lock something
                    // else than it showed diff is refused).
                    if let Some(wanted) = a
                        .accept
                        .iter()
                        .find_map(|x| x.strip_prefix(&format!("{full}=")))
                        && wanted != digest
                    {
                        bail!(
                            "{full}: the server now shows the definition {digest}, not {wanted} that you accepted; run `gateway upstream diff` again"
                        );
                    }
                    let accepted = same
                        || a.all
                        || a.accept.contains(&full)
                        || a.accept.contains(&format!("{full}={digest}"));
                    if !accepted {
                        waiting.push(format!("{name}.{t}"));
                        // What was locked before stays locked (and refused
                        // at the call while it differs).
                        if let Some(old) = before.get(&t) {
                            tools.insert(t, old.clone());
                        }
                        continue;
                    }
                    tools.insert(
                        t,
                        json!({"sha256": digest, "definition_json": text, "definition": def}),
                    );
                }
                new_lock.insert(
                    name.clone(),
                    json!({
                        "server": report.server.clone().unwrap_or(Value::Null)["serverInfo"],
                        "locked_at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                        "tools": tools,
                    }),
                );
            }
            let changes = differences(&lock, &live);
            write_lock(&lock_path, &new_lock)?;
            if a.select.json {
                print_safe(&format!(
                    "{}\n",
                    serde_json::to_string_pretty(
                        &json!({"lock": lock_path, "changes": changes, "skipped": skipped, "not_accepted": waiting})
                    )?
                ));
            } else {
                for c in &changes {
                    print_safe(&format!("{}\n", change_line(c)));
                }
                for s in &skipped {
                    print_safe(&format!("skipped {s}\n"));
                }
                print_safe(&format!(
                    "wrote {} for {} upstream(s); the daemon offers what it pins once it reloads its policies\n",
                    lock_path.display(),
                    live.len(),
                ));
                if !waiting.is_empty() {
                    print_safe(&format!(
                        "not locked (new or changed, not accepted): {}\n  read `gateway upstream diff`, then accept them by name (--accept UPSTREAM.TOOL) or all (--all)\n",
                        waiting.join(", ")
                    ));
                }
            }
            Ok(if waiting.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        UpstreamCommand::Diff(a) => {
            let names = selected(&declared, &a.names)?;
            let live = read_live(cli, &declared, &names)?;
            let mut scoped = lock.clone();
            scoped.retain(|k, _| names.contains(k));
            let changes = differences(&scoped, &live);
            if a.json {
                print_safe(&format!(
                    "{}\n",
                    serde_json::to_string_pretty(&json!({"changes": changes}))?
                ));
            } else if changes.is_empty() {
                print_safe("no change: every tool is as locked\n");
            } else {
                for c in &changes {
                    print_safe(&format!("{}\n", change_line(c)));
                }
            }
            Ok(if changes.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        UpstreamCommand::Test(a) => {
            let names = selected(&declared, std::slice::from_ref(&a.name))?;
            let live = read_live(cli, &declared, &names)?;
            let report = &live[&a.name];
            print_safe(&format!(
                "upstream {}: started in its sandbox, server {}, {} tool(s)\n",
                a.name,
                report
                    .server
                    .as_ref()
                    .map(|s| s["serverInfo"].to_string())
                    .unwrap_or_else(|| "unknown".into()),
                report.tools.as_ref().map(Vec::len).unwrap_or(0)
            ));
            let mut scoped = lock.clone();
            scoped.retain(|k, _| k == &a.name);
            let changes = differences(&scoped, &live);
            for c in &changes {
                print_safe(&format!("{}\n", change_line(c)));
            }
            let locked = scoped
                .get(&a.name)
                .and_then(|l| l["tools"].as_object())
                .map(|t| t.len())
                .unwrap_or(0);
            print_safe(&format!(
                "{} locked tool(s) offered as locked; {} difference(s)\n",
                locked.saturating_sub(changes.iter().filter(|c| c["change"] != "new").count()),
                changes.len()
            ));
            Ok(if changes.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

/// `data.config.upstreams`, each checked.
fn declared(set: &PolicySet) -> anyhow::Result<BTreeMap<String, Server>> {
    let v = set
        .data("data.config.upstreams")?
        .unwrap_or_else(|| json!({}));
    let mut out = BTreeMap::new();
    for (name, decl) in v.as_object().into_iter().flatten() {
        if !upstream::valid_tool_name(name) {
            bail!("upstream name {name:?} must be [A-Za-z0-9_-], at most 64 characters");
        }
        let s: Server = serde_json::from_value(decl.clone())
            .with_context(|| format!("config/upstreams: upstream {name:?}"))?;
        s.check(name).map_err(anyhow::Error::msg)?;
        out.insert(name.clone(), s);
    }
    Ok(out)
}

fn selected(declared: &BTreeMap<String, Server>, names: &[String]) -> anyhow::Result<Vec<String>> {
    if names.is_empty() {
        return Ok(declared.keys().cloned().collect());
    }
    for n in names {
        if !declared.contains_key(n) {
            bail!(
                "no upstream {n:?} in config/upstreams (declared: {})",
                declared.keys().cloned().collect::<Vec<_>>().join(", ")
            );
        }
    }
    Ok(names.to_vec())
}

fn read_lock(path: &Path) -> anyhow::Result<BTreeMap<String, Value>> {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b).with_context(|| format!("{}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(e).with_context(|| format!("{}", path.display())),
    }
}

fn write_lock(path: &Path, lock: &BTreeMap<String, Value>) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut text = serde_json::to_string_pretty(lock)?;
    text.push('\n');
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text).with_context(|| format!("{}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("{}", path.display()))?;
    Ok(())
}

/// Each named upstream's tools, read from its server in a sandbox (a
/// stdio server: on the local backend this needs root and gVisor; on the
/// kubernetes backend of `--config` it is a Job of its image) or at its
/// URL (a remote one).
fn read_live(
    cli: &Cli,
    declared: &BTreeMap<String, Server>,
    names: &[String],
) -> anyhow::Result<BTreeMap<String, crate::protocol::McpReport>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let sb: Option<Box<dyn crate::sandbox::Sandbox>> = if !names
        .iter()
        .any(|n| !declared[n].remote())
    {
        None
    } else if cli.file.sandbox.backend == "kubernetes" {
        let mut cfg = cli.file.sandbox.kubernetes.clone();
        // As the daemon: a server's pod runs nothing until its
        // network policy is seen to hold.
        if cfg.egress_canary.is_none() {
            anyhow::bail!(
                "[sandbox.kubernetes] egress_canary is not set in --config: a listing's pod would run the server before its network policy holds (name an IP:PORT every sandbox's network policy denies, e.g. the cluster DNS service)"
            );
        }
        // Its Job carries no replica's name: the replicas' reaping of
        // a dead one's Jobs leaves it alone.
        cfg.replica = None;
        let client = rt
            .block_on(crate::sandbox::kubernetes::client(&cfg))
            .context("the kubernetes sandbox backend of --config")?;
        Some(Box::new(
            crate::sandbox::kubernetes::KubernetesSandbox::new(client, cfg),
        ))
    } else {
        super::dev::ensure_runner()?;
        super::dev::ensure_root("upstream")?;
        Some(Box::new(crate::sandbox::local::LocalSandbox::new(
            crate::sandbox::local::LocalConfig::default(),
        )?))
    };
    let tools = crate::tools::ToolPaths::installed();
    let home: PathBuf = cli.home();
    let mut out = BTreeMap::new();
    for n in names {
        let report = rt
            .block_on(async {
                match &sb {
                    Some(sb) if !declared[n].remote() => {
                        upstream::list(
                            sb.as_ref(),
                            &tools,
                            (&home, std::slice::from_ref(&cli.policies)),
                            n,
                            &declared[n],
                        )
                        .await
                    }
                    _ => upstream::list_remote(n, &declared[n]).await,
                }
            })
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("reading the tools of upstream {n:?}"))?;
        out.insert(n.clone(), report);
    }
    Ok(out)
}

/// What differs between the lock and what the servers list now: one
/// entry per tool (`new`, `changed` with the fields, `gone`).
fn differences(
    lock: &BTreeMap<String, Value>,
    live: &BTreeMap<String, crate::protocol::McpReport>,
) -> Vec<Value> {
    let mut out = Vec::new();
    for (name, report) in live {
        let locked = lock
            .get(name)
            .and_then(|l| l["tools"].as_object().cloned())
            .unwrap_or_default();
        let mut seen = std::collections::BTreeSet::new();
        for def in report.tools.iter().flatten() {
            let Some(t) = def["name"].as_str() else {
                continue;
            };
            seen.insert(t.to_string());
            let digest = upstream::definition_digest(def);
            match locked.get(t) {
                None => out
                    .push(json!({"upstream": name, "tool": t, "change": "new", "sha256": digest})),
                Some(l) if l["sha256"].as_str() != Some(digest.as_str()) => {
                    let old = &l["definition"];
                    let mut fields: Vec<String> = Vec::new();
                    let keys: std::collections::BTreeSet<&String> = old
                        .as_object()
                        .into_iter()
                        .flatten()
                        .chain(def.as_object().into_iter().flatten())
                        .map(|(k, _)| k)
                        .collect();
                    for k in keys {
                        if old.get(k) != def.get(k) {
                            fields.push(k.clone());
                        }
                    }
                    out.push(json!({"upstream": name, "tool": t, "change": "changed",
                        "fields": fields, "locked_sha256": l["sha256"], "sha256": digest,
                        "locked": old, "live": def}));
                }
                Some(_) => {}
            }
        }
        for t in locked.keys().filter(|t| !seen.contains(*t)) {
            out.push(json!({"upstream": name, "tool": t, "change": "gone"}));
        }
    }
    out
}

fn change_line(c: &Value) -> String {
    let tool = format!(
        "{}.{}",
        shown(c["upstream"].as_str().unwrap_or("")),
        shown(c["tool"].as_str().unwrap_or(""))
    );
    match c["change"].as_str() {
        Some("new") => format!(
            "+ {tool}: new (offered once locked), sha256 {}",
            c["sha256"].as_str().unwrap_or("")
        ),
        Some("gone") => format!("- {tool}: no longer listed by the server"),
        _ => {
            let mut s = format!(
                "~ {tool}: changed to sha256 {} ({})",
                c["sha256"].as_str().unwrap_or(""),
                c["fields"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(shown)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            for f in c["fields"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                s.push_str(&format!(
                    "\n    {f}: {} -> {}",
                    short(&c["locked"][f]),
                    short(&c["live"][f])
                ));
            }
            s
        }
    }
}

/// A name the server chose, as one escaped line of at most 80 characters.
fn shown(name: &str) -> String {
    let t = crate::text::escaped(name, true);
    t.chars().take(80).collect()
}

/// A value as one escaped line, at most 300 characters.
fn short(v: &Value) -> String {
    let t = crate::text::escaped(&v.to_string(), true);
    let cut: String = t.chars().take(300).collect();
    if cut.len() < t.len() {
        format!("{cut}…")
    } else {
        cut
    }
}

fn list(
    set: &PolicySet,
    declared: &BTreeMap<String, Server>,
    lock: &BTreeMap<String, Value>,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    let catalog = set
        .data("data.gateway.upstreams.catalog")?
        .unwrap_or_else(|| json!({}));
    let mut rows = Vec::new();
    for (name, server) in declared {
        let locked = lock.get(name);
        let tools: Vec<Value> = locked
            .and_then(|l| l["tools"].as_object())
            .into_iter()
            .flatten()
            .map(|(t, e)| {
                let full = format!("{name}.{t}");
                json!({"name": full, "tier": catalog[&full]["tier"], "sha256": e["sha256"]})
            })
            .collect();
        rows.push(json!({
            "upstream": name,
            "command": server.command,
            "locked_at": locked.map(|l| l["locked_at"].clone()),
            "server": locked.map(|l| l["server"].clone()),
            "tools": tools,
        }));
    }
    if json_out {
        print_safe(&format!("{}\n", serde_json::to_string_pretty(&rows)?));
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        print_safe("no upstream is declared (policies: config/upstreams/data.yaml)\n");
    }
    for r in &rows {
        print_safe(&format!(
            "{}: {}\n  locked at {}\n",
            r["upstream"].as_str().unwrap_or(""),
            crate::text::escaped(&r["command"].to_string(), false),
            r["locked_at"]
                .as_str()
                .unwrap_or("never (gateway upstream lock)")
        ));
        for t in r["tools"].as_array().into_iter().flatten() {
            print_safe(&format!(
                "  {:<40} {}\n",
                t["name"].as_str().unwrap_or(""),
                t["tier"].as_str().unwrap_or("?")
            ));
        }
    }
    Ok(ExitCode::SUCCESS)
}
