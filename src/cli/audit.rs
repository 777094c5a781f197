//! `gateway audit [--request-id ID] [--since DURATION] [--json]` and
//! `gateway audit verify [--file F] [--checkpoint HASH]...` and
//! `gateway audit head [--file F] [--json]`.

use std::path::PathBuf;

use anyhow::{Context, bail};
use serde_json::{Map, Value};

use super::Cli;
use super::out::{Out, outln};
use crate::audit::{self, verify};

#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    #[command(subcommand)]
    verify: Option<AuditCommand>,
    /// Only this request's events.
    #[arg(long)]
    request_id: Option<String>,
    /// Only events newer than this (e.g. 30s, 15m, 2h, 1d).
    #[arg(long)]
    since: Option<String>,
    /// Raw events, one JSON object per line.
    #[arg(long)]
    json: bool,
    /// The audit file [default: HOME/audit.jsonl].
    #[arg(long)]
    file: Option<PathBuf>,
}

#[derive(Debug, clap::Subcommand)]
enum AuditCommand {
    /// Check the hash chain; non-zero exit and the first bad line when the
    /// log was edited, cut, reordered or added to.
    ///
    /// The log must also reach its recorded head (the sidecar file the
    /// writers keep beside it), so events removed from the end are caught.
    Verify {
        #[arg(long)]
        file: Option<PathBuf>,
        #[arg(long)]
        json: bool,
        /// A head printed earlier by `gateway audit head` and kept elsewhere:
        /// it must still be on the chain (repeatable).
        #[arg(long = "checkpoint", value_name = "HASH")]
        checkpoints: Vec<String>,
        /// Accept a log whose head file is missing or damaged (or whose
        /// writer found it so): only the chain is checked, so events
        /// removed from the end go unnoticed.
        #[arg(long)]
        no_head: bool,
        /// Check what a SIEM received from `[audit_export]` instead: the
        /// records (one JSON object a line, as the JSON-lines sink sends
        /// them or as the OTLP log records' bodies), in any order,
        /// duplicates allowed. Every event from the first on must be
        /// there, chained, and vouched for by a checkpoint.
        /// --checkpoint and --no-head apply to it as to a log.
        #[arg(long, value_name = "FILE", conflicts_with = "file")]
        from_export: Option<PathBuf>,
        /// With --from-export: an OpenSSH public key file (the export's
        /// `signing_key_file`'s .pub); every checkpoint must be signed by
        /// one of these keys (repeatable).
        #[arg(long = "signer", value_name = "FILE", requires = "from_export")]
        signers: Vec<PathBuf>,
    },
    /// Print the chain's current head (last event's hash, event count), to
    /// record outside this machine and check later with `verify --checkpoint`.
    Head {
        #[arg(long)]
        file: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Write the team's chain (`[store]` in PostgreSQL) to a JSONL file and
    /// its head sidecar: byte for byte the file a single host keeps, which
    /// `gateway audit verify --file` checks anywhere.
    Export {
        /// The file to write (it must not exist); its head goes beside it
        /// (`FILE.head`).
        #[arg(long)]
        out: PathBuf,
    },
}

impl AuditArgs {
    /// Whether the command names an audit file of its own (`--file`, or
    /// `export --out`): the daemon never reads or writes a file a caller
    /// names.
    pub fn names_a_file(&self) -> bool {
        self.file.is_some()
            || matches!(
                &self.verify,
                Some(AuditCommand::Verify { file: Some(_), .. })
                    | Some(AuditCommand::Verify {
                        from_export: Some(_),
                        ..
                    })
                    | Some(AuditCommand::Head { file: Some(_), .. })
                    | Some(AuditCommand::Export { .. })
            )
    }
}

/// The audit log `file` writes to: the team's chain in PostgreSQL when
/// `[store]` names one, else HOME/audit.jsonl.
pub fn open_log(
    file: &crate::config::GatewayConfig,
    home: &std::path::Path,
) -> anyhow::Result<audit::AuditLog> {
    use crate::config::store::Store;
    match file.store()? {
        Store::Sqlite => Ok(audit::AuditLog::in_home(home)?),
        Store::Postgres { url, ca_file, pool } => {
            let chain = super::database::postgres(&url, ca_file.as_deref(), pool)
                .and_then(audit::shared::SharedChain::postgres)
                .context("cannot open the audit chain in PostgreSQL ([store] url_file)")?;
            Ok(audit::AuditLog::shared(chain))
        }
    }
}

/// `audit verify --from-export FILE [--signer KEY]...`.
fn verify_export(
    o: &mut Out,
    export: &std::path::Path,
    signers: &[PathBuf],
    pins: &[String],
    head_lost_ok: bool,
    json: bool,
) -> anyhow::Result<u8> {
    let text = std::fs::read_to_string(export)
        .with_context(|| format!("cannot read the export {}", export.display()))?;
    let mut keys = Vec::new();
    for f in signers {
        let line = std::fs::read_to_string(f)
            .with_context(|| format!("cannot read the signer key {}", f.display()))?;
        keys.push(
            ssh_key::PublicKey::from_openssh(line.trim())
                .with_context(|| format!("{} is not an OpenSSH public key", f.display()))?,
        );
    }
    let signed = !keys.is_empty();
    let report = audit::export::verify_export(
        &text,
        &audit::export::ExportChecks {
            signers: keys,
            pins: pins.to_vec(),
            head_lost_ok,
        },
    );
    if json {
        outln!(o, "{}", serde_json::to_string_pretty(&report)?);
    } else {
        for w in &report.warnings {
            outln!(o, "warning: {w}");
        }
        match &report.failure {
            None => outln!(
                o,
                "ok: {} events verified in the export {} ({} checkpoint(s), {} signature(s) checked{}, {} duplicate record(s)); export {}, chain {}, last checkpoint at event {} made {}",
                report.events,
                export.display(),
                report.checkpoints,
                report.signatures_verified,
                if signed {
                    ""
                } else {
                    ": name the export's key with --signer to check them"
                },
                report.duplicates,
                report.export.as_deref().unwrap_or_default(),
                report.chain.as_deref().unwrap_or_default(),
                report.last_checkpoint.unwrap_or(0),
                report.last_checkpoint_ts.as_deref().unwrap_or_default()
            ),
            Some(why) => outln!(o, "FAIL: the export {}: {why}", export.display()),
        }
    }
    Ok(if report.failure.is_none() { 0 } else { 1 })
}

/// `30s`, `15m`, `2h`, `1d` as milliseconds.
pub fn parse_duration(s: &str) -> anyhow::Result<i64> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: i64 = num
        .parse()
        .with_context(|| format!("{s:?} is not a duration like 30s, 15m, 2h or 1d"))?;
    let mult = match unit {
        "ms" => 1,
        "s" | "" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => bail!("{s:?}: unknown unit {unit:?} (use s, m, h or d)"),
    };
    Ok(n.saturating_mul(mult))
}

fn ts_ms(e: &Map<String, Value>) -> Option<i64> {
    e.get("ts")
        .and_then(Value::as_str)
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.timestamp_millis())
}

/// The team's chain read from the database into a private file (with its
/// head sidecar), so that every command reads it as it reads a host's log;
/// `None` when `[store]` keeps the audit in the home.
struct FromDatabase {
    _dir: tempfile::TempDir,
    path: PathBuf,
    name: String,
    /// Events the head row counts, and rows the table holds.
    events: u64,
    rows: u64,
}

/// The team's chain, to read (`None`: `[store]` keeps the audit in the
/// home); nothing is created.
fn chain_reader(cli: &Cli) -> anyhow::Result<Option<audit::shared::SharedChain>> {
    use crate::config::store::Store;
    match cli.file.store()? {
        Store::Sqlite => Ok(None),
        Store::Postgres { url, ca_file, pool } => {
            let db = super::database::postgres(&url, ca_file.as_deref(), pool)
                .context("cannot reach the audit chain in PostgreSQL ([store] url_file)")?;
            Ok(Some(audit::shared::SharedChain::postgres_reader(db)))
        }
    }
}

fn from_database(cli: &Cli) -> anyhow::Result<Option<FromDatabase>> {
    let Some(chain) = chain_reader(cli)? else {
        return Ok(None);
    };
    let chain = &chain;
    let export = chain
        .export()
        .with_context(|| format!("cannot read the audit chain in {}", chain.describe()))?;
    let dir = tempfile::tempdir().context("a private directory for the chain")?;
    let path = dir.path().join(audit::FILE_NAME);
    audit::shared::write_export(&path, &export)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(Some(FromDatabase {
        _dir: dir,
        path,
        name: chain.describe().to_string(),
        events: export.events,
        rows: export.rows,
    }))
}

pub fn run(cli: &Cli, a: &AuditArgs, o: &mut Out) -> anyhow::Result<u8> {
    if let Some(AuditCommand::Export { out }) = &a.verify {
        let Some(chain) = chain_reader(cli)? else {
            bail!(
                "this gateway keeps its audit in {} ([store] is not PostgreSQL): that file is the export",
                cli.home().join(audit::FILE_NAME).display()
            );
        };
        let export = chain
            .export()
            .with_context(|| format!("cannot read the audit chain in {}", chain.describe()))?;
        audit::shared::write_export(out, &export)
            .with_context(|| format!("cannot write {}", out.display()))?;
        outln!(
            o,
            "wrote {} events ({} bytes) to {} and its head to {}",
            export.rows,
            export.bytes.len(),
            out.display(),
            audit::head_path(out).display()
        );
        return Ok(0);
    }
    // Without --file, a team gateway's chain is read from its database.
    let db = if a.names_a_file() {
        None
    } else {
        from_database(cli)?
    };
    let log_path = |file: &Option<PathBuf>| match &db {
        Some(d) => d.path.clone(),
        None => file
            .clone()
            .or_else(|| a.file.clone())
            .unwrap_or_else(|| cli.home().join(audit::FILE_NAME)),
    };
    let shown = |path: &std::path::Path| match &db {
        Some(d) => d.name.clone(),
        None => path.display().to_string(),
    };
    if let Some(AuditCommand::Head { file, json }) = &a.verify {
        let path = log_path(file);
        let report = verify::verify_file(&path, &[], verify::HeadRule::Required)
            .with_context(|| format!("cannot read audit log {}", shown(&path)))?;
        if !report.ok() {
            let (line, why) = report.first_bad.unwrap_or_default();
            bail!(
                "{} does not verify (line {line}: {why}); no head to record",
                shown(&path)
            );
        }
        let Some(head) = report.head else {
            bail!("{} has no events yet", shown(&path));
        };
        if *json {
            outln!(
                o,
                "{}",
                serde_json::json!({"file": shown(&path), "head": head, "events": report.verified, "ts": audit::now_ts()})
            );
        } else {
            outln!(
                o,
                "{head}  ({} events in {}, at {})\ncheck later with: gateway audit verify --checkpoint {head}",
                report.verified,
                shown(&path),
                audit::now_ts()
            );
        }
        return Ok(0);
    }
    if let Some(AuditCommand::Verify {
        from_export: Some(export),
        signers,
        json,
        checkpoints,
        no_head,
        ..
    }) = &a.verify
    {
        return verify_export(o, export, signers, checkpoints, *no_head, *json);
    }
    if let Some(AuditCommand::Verify {
        file,
        json,
        checkpoints,
        no_head,
        ..
    }) = &a.verify
    {
        let path = log_path(file);
        let rule = if *no_head {
            verify::HeadRule::Optional
        } else {
            verify::HeadRule::Required
        };
        let mut report = verify::verify_file(&path, checkpoints, rule)
            .with_context(|| format!("cannot verify audit log {}", shown(&path)))?;
        if let Some(d) = &db
            && report.ok()
            && d.events != d.rows
        {
            report.first_bad = Some((
                report.verified + 1,
                format!(
                    "the head row counts {} events but the table holds {}: events were removed or added outside the chain",
                    d.events, d.rows
                ),
            ));
        }
        if *json {
            outln!(o, "{}", serde_json::to_string_pretty(&report)?);
        } else {
            for w in &report.warnings {
                outln!(o, "warning: {w}");
            }
            match &report.first_bad {
                None => outln!(
                    o,
                    "ok: {} events verified in {} ({} approval signature(s) checked)",
                    report.verified,
                    shown(&path),
                    report.signatures_verified
                ),
                Some((line, why)) => {
                    outln!(
                        o,
                        "FAIL: {}: line {line}: {why} ({} events before it verified)",
                        shown(&path),
                        report.verified
                    )
                }
            }
        }
        return Ok(if report.ok() { 0 } else { 1 });
    }
    let path = log_path(&None);
    let since = a
        .since
        .as_deref()
        .map(parse_duration)
        .transpose()?
        .map(|d| crate::approvals::now_ms() - d);
    // What is listed is what the file says; say when it does not verify,
    // or could not be checked.
    match verify::verify_file(&path, &[], verify::HeadRule::Optional) {
        Ok(report) => {
            if let Some((line, why)) = &report.first_bad {
                super::out::errln!(
                    o,
                    "warning: {} does not verify from line {line} ({why}); events from there on cannot be trusted (gateway audit verify)",
                    shown(&path)
                );
            } else if let Some(why) = report.head_problem() {
                super::out::errln!(o, "warning: {}: {why} (gateway audit verify)", shown(&path));
            }
        }
        // No log yet: the listing below says so.
        Err(crate::audit::AuditError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => super::out::errln!(
            o,
            "warning: {} could not be verified ({e}); what is listed cannot be trusted (gateway audit verify)",
            shown(&path)
        ),
    }
    let events: Vec<Map<String, Value>> = audit::read_events(&path)?
        .into_iter()
        .filter(|e| {
            a.request_id
                .as_deref()
                .is_none_or(|id| e.get("request_id").and_then(Value::as_str) == Some(id))
        })
        .filter(|e| since.is_none_or(|s| ts_ms(e).is_some_and(|t| t >= s)))
        .collect();
    if a.json {
        for e in &events {
            outln!(o, "{}", serde_json::to_string(e)?);
        }
        return Ok(0);
    }
    if events.is_empty() {
        outln!(
            o,
            "no audit events{}",
            a.request_id
                .as_ref()
                .map(|r| format!(" for {r}"))
                .unwrap_or_default()
        );
        return Ok(0);
    }
    // One block per request id, in the order each first appeared.
    let mut order: Vec<String> = Vec::new();
    let mut by_request: std::collections::HashMap<String, Vec<&Map<String, Value>>> =
        Default::default();
    for e in &events {
        let id = e
            .get("request_id")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if !by_request.contains_key(&id) {
            order.push(id.clone());
        }
        by_request.entry(id).or_default().push(e);
    }
    for id in order {
        let list = &by_request[&id];
        let first = list.first().and_then(|e| ts_ms(e)).unwrap_or(0);
        let last = list.last().and_then(|e| ts_ms(e)).unwrap_or(first);
        outln!(
            o,
            "{} ({} events, {} ms)",
            if id.is_empty() { "(no request)" } else { &id },
            list.len(),
            last - first
        );
        for e in list {
            let t = e.get("ts").and_then(Value::as_str).unwrap_or("?");
            let offset = ts_ms(e).map(|x| x - first).unwrap_or(0);
            let name = e.get("event").and_then(Value::as_str).unwrap_or("?");
            let data = e
                .get("data")
                .map(|d| super::out::shown(&d.to_string()))
                .unwrap_or_default();
            outln!(o, "  {t}  +{offset:>6}ms  {name:<22} {data}");
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::parse_duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").ok(), Some(30_000));
        assert_eq!(parse_duration("15m").ok(), Some(900_000));
        assert_eq!(parse_duration("2h").ok(), Some(7_200_000));
        assert_eq!(parse_duration("1d").ok(), Some(86_400_000));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5y").is_err());
    }
}
