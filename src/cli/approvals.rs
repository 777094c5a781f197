//! `gateway approvals [show ID]`, `gateway approve ID`, `gateway deny ID`:
//! the operator's side of the approval gate. This process is the only way an
//! approval is granted: the MCP server has no code path for it.

use std::path::PathBuf;

use anyhow::Context;
use serde_json::{Value, json};

use super::Cli;
use super::out::{Out, errln, out, outln, shown};
use crate::approvals::{Approval, ApprovalStore, Approver, State, proof};
use crate::audit::events::Verdict;
use crate::audit::{AuditLog, Event, scrub::scrub};
use crate::policy::PolicySet;
use crate::policy::set::LoadOptions;

#[derive(Debug, clap::Args)]
pub struct ApprovalsArgs {
    #[command(subcommand)]
    show: Option<ApprovalsCommand>,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
    /// Include ended approvals (spent, denied, expired).
    #[arg(long)]
    all: bool,
}

impl ApprovalsArgs {
    /// `approvals watch`: a loop the CLI runs itself (the daemon answers
    /// one command per connection).
    pub fn watch_interval(&self) -> Option<u64> {
        match &self.show {
            Some(ApprovalsCommand::Watch { interval }) => Some((*interval).max(1)),
            _ => None,
        }
    }
}

#[derive(Debug, clap::Subcommand)]
enum ApprovalsCommand {
    /// Everything needed to decide: the call, each planned change, the signals.
    Show {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// The statement an approver signs (canonical JSON and a newline), for
    /// signing elsewhere: `ssh-keygen -Y sign -n gateway-approval -f KEY
    /// FILE`, then `gateway approve ID --signature FILE.sig`.
    Statement {
        id: String,
        /// `grant` (approve) or `deny`.
        #[arg(long, default_value = "grant", value_parser = ["grant", "deny"])]
        verdict: String,
        #[arg(long, default_value = "")]
        reason: String,
        /// How long the signed statement may be submitted, in seconds
        /// (never past the approval's own expiry).
        #[arg(long, default_value_t = 600)]
        valid_for: u64,
    },
    /// Follow approval requests as they come, until interrupted.
    Watch {
        /// Seconds between looks.
        #[arg(long, default_value_t = 2)]
        interval: u64,
    },
}

/// `gateway approve|deny ID`. The verdict is signed with the approver's SSH
/// key unless `--no-sign`; the key's principal in the policy's allowed
/// signers is then the approver. Without a signature the approver is the
/// OS user the kernel names, which counts only when the policy admits that
/// user and it is not the requester.
#[derive(Debug, Clone, clap::Args)]
pub struct VerdictArgs {
    /// The approval id (from `gateway approvals`).
    id: String,
    /// Why (required when the policy says so for this approval). Signed.
    #[arg(long, default_value = "")]
    reason: String,
    /// The SSH key to sign with: a private key file, or a public key whose
    /// private half is in the ssh-agent [default: $GATEWAY_APPROVER_KEY,
    /// else the first of ~/.ssh/id_ed25519_sk, id_ecdsa_sk, id_ed25519,
    /// id_ecdsa].
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
    /// Submit a signature made elsewhere: the output of `ssh-keygen -Y sign
    /// -n gateway-approval` over `gateway approvals statement ID`.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["key", "no_sign"])]
    signature: Option<PathBuf>,
    /// The statement that --signature signed [default: its path without .sig].
    #[arg(long, value_name = "FILE", requires = "signature")]
    statement: Option<PathBuf>,
    /// Do not sign: the approver is the OS user alone.
    #[arg(long, conflicts_with = "key")]
    no_sign: bool,
    /// How long the signed statement may be submitted, in seconds.
    #[arg(long, default_value_t = 600)]
    valid_for: u64,
    /// The signed statement, as the CLI hands it to the daemon.
    #[arg(long, hide = true)]
    signed_statement: Option<String>,
    /// Its signature, as the CLI hands it to the daemon.
    #[arg(long, hide = true)]
    ssh_signature: Option<String>,
    /// A passkey's assertion over the signed statement (WebAuthn, as JSON),
    /// as the approval page hands it to the daemon.
    #[arg(long, hide = true, conflicts_with = "ssh_signature")]
    webauthn_assertion: Option<String>,
}

impl VerdictArgs {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether it names files for the daemon to read (only the CLI reads
    /// the caller's files; the daemon gets their contents).
    pub fn names_files(&self) -> bool {
        self.key.is_some() || self.signature.is_some() || self.statement.is_some()
    }

    /// The command line the daemon is sent for this verdict.
    pub fn to_argv(&self, grant: bool) -> Vec<String> {
        // `--flag=value`: a value that starts with '-' (an armored
        // signature, a reason) is then never read as a flag.
        let mut v = vec![
            if grant { "approve" } else { "deny" }.to_string(),
            self.id.clone(),
            format!("--reason={}", self.reason),
        ];
        if let (Some(st), Some(sig)) = (&self.signed_statement, &self.ssh_signature) {
            v.push(format!("--signed-statement={st}"));
            v.push(format!("--ssh-signature={sig}"));
        }
        v
    }

    /// Sign, or read a signature made elsewhere, here in the CLI: the
    /// result carries the statement and signature and names no file.
    /// `statement_of(verdict, reason, valid_for)` gives the statement to
    /// sign (from the daemon, or the state dir).
    pub fn signed(
        &self,
        grant: bool,
        statement_of: &mut dyn FnMut(&str, &str, u64) -> anyhow::Result<String>,
    ) -> anyhow::Result<VerdictArgs> {
        use crate::approvals::signature;
        let mut out = self.clone();
        out.key = None;
        out.signature = None;
        out.statement = None;
        if let Some(sig_path) = &self.signature {
            let st_path = match &self.statement {
                Some(p) => p.clone(),
                None => sig_path.with_extension(""),
            };
            let read = |p: &std::path::Path| -> anyhow::Result<String> {
                let meta =
                    std::fs::metadata(p).with_context(|| format!("cannot read {}", p.display()))?;
                anyhow::ensure!(
                    meta.len() <= signature::MAX_BYTES as u64,
                    "{} is larger than a statement or signature can be",
                    p.display()
                );
                std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))
            };
            let statement = read(&st_path)?;
            let parsed = signature::Statement::parse(statement.as_bytes()).with_context(|| {
                format!(
                    "{} is not a statement from `gateway approvals statement`",
                    st_path.display()
                )
            })?;
            out.reason = parsed.reason;
            out.signed_statement = Some(statement);
            out.ssh_signature = Some(read(sig_path)?);
            return Ok(out);
        }
        if self.no_sign {
            return Ok(out);
        }
        let key = self
            .key
            .clone()
            .or_else(|| {
                std::env::var_os("GATEWAY_APPROVER_KEY")
                    .filter(|k| !k.is_empty())
                    .map(PathBuf::from)
            })
            .or_else(|| {
                std::env::var_os("HOME")
                    .and_then(|h| signature::default_key(std::path::Path::new(&h)))
            });
        let Some(key) = key else {
            return Ok(out);
        };
        let verdict = if grant { "grant" } else { "deny" };
        let statement = statement_of(verdict, &self.reason, self.valid_for)?;
        // Sign only what was asked for: a daemon socket the caller's
        // environment redirected could hand over another approval's
        // statement to sign.
        let parsed = signature::Statement::parse(statement.as_bytes())
            .context("the statement to sign is not a gateway approval statement")?;
        anyhow::ensure!(
            parsed.approval_id == self.id
                && parsed.verdict == verdict
                && parsed.reason == self.reason,
            "the statement to sign is for {} {} (reason {:?}), not what was asked ({verdict} {}); not signing",
            parsed.verdict,
            parsed.approval_id,
            parsed.reason,
            self.id
        );
        super::out::eprint_safe(&format!(
            "signing with {}: {verdict} {} for {} (params sha256 {}, plan sha256 {})\n",
            key.display(),
            parsed.approval_id,
            parsed.tool,
            parsed.params_sha256,
            parsed.plan_sha256.as_deref().unwrap_or("none"),
        ));
        let sig = signature::sign_with_ssh_keygen(&key, statement.as_bytes())?;
        out.signed_statement = Some(statement);
        out.ssh_signature = Some(sig);
        Ok(out)
    }
}

fn store(cli: &Cli) -> anyhow::Result<ApprovalStore> {
    open_store(&cli.file, &cli.home())
}

/// The approval store the configuration names (`[store]`): SQLite under
/// `home`, or the PostgreSQL database replicas share.
pub fn open_store(
    file: &crate::config::GatewayConfig,
    home: &std::path::Path,
) -> anyhow::Result<ApprovalStore> {
    use crate::config::store::Store;
    match file.store()? {
        Store::Sqlite => ApprovalStore::in_home(home)
            .with_context(|| format!("cannot open the approval store under {}", home.display())),
        Store::Postgres { url, ca_file, pool } => {
            super::database::postgres(&url, ca_file.as_deref(), pool)
                .map_err(|source| crate::approvals::ApprovalError::Db {
                    at: "postgresql".into(),
                    source,
                })
                .and_then(ApprovalStore::on_postgres)
                .context("cannot open the approval store in PostgreSQL ([store] url_file)")
        }
    }
}

/// `only_of`: show only the approvals this user requested (a caller the
/// policy does not let approve sees no one else's calls).
pub fn list(
    cli: &Cli,
    a: &ApprovalsArgs,
    only_of: Option<&str>,
    o: &mut Out,
) -> anyhow::Result<u8> {
    let store = store(cli)?;
    let visible = |x: &Approval| only_of.is_none_or(|u| x.requested_by == u);
    if let Some(ApprovalsCommand::Show { id, json }) = &a.show {
        let Some(approval) = store.get(id)?.filter(|x| visible(x)) else {
            errln!(o, "gateway: no approval with id {id}");
            return Ok(1);
        };
        if *json || a.json {
            outln!(
                o,
                "{}",
                serde_json::to_string_pretty(&scrub(&serde_json::to_value(&approval)?))?
            );
        } else {
            out!(o, "{}", render_show(&approval));
        }
        return Ok(0);
    }
    if let Some(ApprovalsCommand::Statement {
        id,
        verdict,
        reason,
        valid_for,
    }) = &a.show
    {
        let Some(approval) = store.get(id)?.filter(|x| visible(x)) else {
            errln!(o, "gateway: no approval with id {id}");
            return Ok(1);
        };
        if !matches!(approval.state, State::Pending) {
            errln!(
                o,
                "gateway: approval {id} is {}; there is nothing to sign",
                approval.state.as_str()
            );
            return Ok(1);
        }
        if super::out::escaped(reason, true) != *reason || reason.len() > MAX_REASON_BYTES {
            errln!(
                o,
                "gateway: the reason may hold at most {MAX_REASON_BYTES} bytes and no control or format characters"
            );
            return Ok(1);
        }
        let until = crate::approvals::now_ms()
            .saturating_add(i64::try_from(valid_for.saturating_mul(1000)).unwrap_or(i64::MAX));
        let bytes = approval.statement(verdict, reason, until).to_bytes();
        out!(o, "{}", String::from_utf8_lossy(&bytes));
        return Ok(0);
    }
    if a.watch_interval().is_some() {
        errln!(o, "gateway: approvals watch runs in the CLI, not here");
        return Ok(2);
    }
    let approvals: Vec<Approval> = store.list(a.all)?.into_iter().filter(visible).collect();
    if a.json {
        let v: Vec<Value> = approvals
            .iter()
            .map(|x| serde_json::to_value(x).map(|v| scrub(&v)))
            .collect::<Result<_, _>>()?;
        outln!(o, "{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    if approvals.is_empty() {
        outln!(o, "no {}approvals", if a.all { "" } else { "pending " });
        return Ok(0);
    }
    let now = crate::approvals::now_ms();
    let rows: Vec<[String; 8]> = approvals
        .iter()
        .map(|x| {
            [
                x.id.clone(),
                x.state.as_str().to_string(),
                x.tool.clone(),
                shown(&x.params.to_string()),
                x.signals.as_array().map(Vec::len).unwrap_or(0).to_string(),
                human(now - x.created_at_ms),
                if matches!(x.state, State::Pending | State::Approved) {
                    human(x.expires_at_ms - now)
                } else {
                    "-".into()
                },
                format!("{}/{}", x.grants(), x.approvers_required),
            ]
        })
        .collect();
    let header = [
        "ID",
        "STATE",
        "TOOL",
        "PARAMS",
        "SIGNALS",
        "AGE",
        "EXPIRES IN",
        "APPROVALS",
    ];
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r.iter()) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    outln!(o, "{}", line(header.to_vec()));
    for r in &rows {
        outln!(o, "{}", line(r.iter().map(String::as_str).collect()));
    }
    Ok(0)
}

/// `3d4h`, `12m`, `45s`.
fn human(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86400 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
    }
}

fn render_show(a: &Approval) -> String {
    use std::fmt::Write;
    let now = crate::approvals::now_ms();
    let mut o = String::new();
    let _ = writeln!(
        o,
        "approval {}  [{}: {} of {} approvals]",
        a.id,
        a.state.as_str(),
        a.grants(),
        a.approvers_required
    );
    let _ = writeln!(o, "  tool:          {}", a.tool);
    let _ = writeln!(o, "  params:        {}", shown(&a.params.to_string()));
    let _ = writeln!(
        o,
        "  requested by:  {} via {} (request {}) at {}, {} ago",
        shown(&a.requested_by),
        shown(&a.requested_client),
        a.request_id,
        a.created_at,
        human(now - a.created_at_ms)
    );
    let _ = writeln!(
        o,
        "  expires:       {} (in {})",
        a.expires_at,
        human(a.expires_at_ms - now)
    );
    if let Some(p) = &a.plan_sha256 {
        let _ = writeln!(o, "  plan file:     sha256 {p}");
    }
    let _ = writeln!(o, "  params digest: sha256 {}", a.params_sha256);
    let granted: Vec<String> = a
        .verdicts
        .iter()
        .filter(|v| v.verdict == "grant")
        .map(|v| shown(&v.approver))
        .collect();
    let _ = writeln!(
        o,
        "  approvals:     {} of {} given{}",
        a.grants(),
        a.approvers_required,
        if granted.is_empty() {
            String::new()
        } else {
            format!(" (by {})", granted.join(", "))
        }
    );
    let _ = writeln!(
        o,
        "  reason needed: {}",
        if a.reason_required {
            "yes (--reason)"
        } else {
            "no"
        }
    );
    // The sections of the approval page, in its order: the destructive
    // signals first, then the changes by action (crate::approvals::review).
    let signals = a.signals.as_array().cloned().unwrap_or_default();
    if signals.is_empty() {
        let _ = writeln!(o, "\nno destructive signals");
    } else {
        let _ = writeln!(o, "\n!!! DESTRUCTIVE SIGNALS ({}) !!!", signals.len());
        for s in &signals {
            let _ = writeln!(
                o,
                "  !! [{}] {}",
                shown(s["kind"].as_str().unwrap_or("?")),
                shown(s["message"].as_str().unwrap_or(""))
            );
        }
    }
    let groups = crate::approvals::review::grouped(&a.plan_summary);
    let total: usize = groups.iter().map(|g| g.2.len()).sum();
    let counts: Vec<String> = groups
        .iter()
        .map(|(key, _, v)| format!("{} {key}", v.len()))
        .collect();
    let _ = writeln!(
        o,
        "\nplanned changes ({total}{}{}):",
        if counts.is_empty() { "" } else { ": " },
        counts.join(", ")
    );
    if groups.is_empty() {
        let _ = writeln!(o, "  (none recorded)");
    }
    for (key, label, changes) in &groups {
        let mark = match *key {
            "create" => "+",
            "update" => "~",
            "read" => " ",
            "delete" => "-",
            "replace" => "-/+",
            _ => "!",
        };
        let _ = writeln!(o, "  {label} ({}):", changes.len());
        for c in changes {
            let _ = write!(
                o,
                "    {mark} {}",
                shown(c["address"].as_str().unwrap_or("?"))
            );
            if let Some(r) = c["reason"].as_str() {
                let _ = write!(o, "  reason={}", shown(r));
            }
            if let Some(p) = c["paths"].as_array().filter(|p| !p.is_empty()) {
                let _ = write!(o, "  paths={}", shown(&Value::Array(p.clone()).to_string()));
            }
            let _ = writeln!(o);
            for d in c["diff"].as_array().map(Vec::as_slice).unwrap_or_default() {
                let side = |v: &Value| match v {
                    Value::Null => "(none)".to_string(),
                    v => shown(v.as_str().unwrap_or("?")),
                };
                let _ = writeln!(
                    o,
                    "        {}: {} -> {}",
                    shown(d["path"].as_str().unwrap_or("?")),
                    side(&d["before"]),
                    side(&d["after"])
                );
            }
        }
    }
    if let Some(by) = &a.superseded_by {
        let _ = writeln!(o, "\nsuperseded by {by}: the call was planned again");
    }
    if let Some(rid) = &a.spent_request_id {
        let _ = writeln!(
            o,
            "\nspent by request {rid} at {}",
            a.spent_at.as_deref().unwrap_or("?")
        );
        match &a.outcome {
            None => {
                let _ = writeln!(
                    o,
                    "  outcome: not recorded yet (the apply is still running, or the gateway stopped before it ended)"
                );
            }
            Some(out) => {
                let status = out["status"].as_str().unwrap_or("?");
                let ok = match out["ok"].as_bool() {
                    Some(true) => " (ok)",
                    Some(false) => " (failed)",
                    None => "",
                };
                let _ = writeln!(
                    o,
                    "  outcome at {}: {}{ok}",
                    a.outcome_at.as_deref().unwrap_or("?"),
                    shown(status)
                );
                let text = out["summary"]
                    .as_str()
                    .or(out["reason"].as_str())
                    .or(out["error"].as_str())
                    .unwrap_or("");
                for line in text.lines() {
                    let _ = writeln!(o, "  {}", shown(line));
                }
            }
        }
    }
    for v in &a.verdicts {
        let how = match (v.kind.as_str(), &v.key_fingerprint) {
            ("ssh_key", Some(fp)) => format!(
                "signed with SSH key {fp}, submitted by OS user {}",
                shown(&v.os_user)
            ),
            ("passkey", Some(fp)) => format!("with passkey {}, user verified", shown(fp)),
            ("os_user", _) => "as the OS user the kernel named".to_string(),
            ("sso", _) => "with an SSO token".to_string(),
            _ => {
                "under a name nobody proved (recorded before signatures; never counted)".to_string()
            }
        };
        let _ = writeln!(
            o,
            "\n{} by {} ({how}) at {}: {}",
            v.verdict,
            shown(&v.approver),
            v.at,
            shown(&v.reason)
        );
    }
    let _ = writeln!(
        o,
        "\napproving lets the next {} call with approval_id {} run exactly this call{}, once, before it expires.",
        a.tool,
        a.id,
        if a.plan_sha256.is_some() {
            " and this saved plan"
        } else {
            ""
        }
    );
    let _ = writeln!(
        o,
        "  gateway approve {} --reason \"...\"     gateway deny {} --reason \"...\"",
        a.id, a.id
    );
    o
}

/// The policy set a direct command decides with (the daemon passes its own).
pub fn load_policies(cli: &Cli) -> anyhow::Result<PolicySet> {
    PolicySet::load(std::slice::from_ref(&cli.policies), &LoadOptions::default()).with_context(
        || {
            format!(
                "the policy set in {} does not load; refusing",
                cli.policies.display()
            )
        },
    )
}

/// The longest reason a verdict carries.
pub const MAX_REASON_BYTES: usize = 4096;

/// A refused verdict: audited, and said.
fn refuse(
    audit: &AuditLog,
    request_id: &str,
    id: &str,
    why: String,
    approver: Option<String>,
    caller: &crate::daemon::Asker,
    o: &mut Out,
) -> anyhow::Result<u8> {
    audit.record(
        request_id,
        Event::ApprovalRefused {
            approval_id: id.into(),
            reason: Some(why.clone()),
            refusal: None,
            approver,
            action: None,
            os_user: caller.os_user().map(str::to_string),
            identity: caller.sso_identity(),
        },
    )?;
    errln!(o, "gateway: refused: {why}");
    Ok(1)
}

/// The allowed signers the policy names (data.gateway.approvals.allowed_signers).
pub fn allowed_signers(set: &PolicySet) -> String {
    match set.eval_rule(
        "data.gateway.approvals.allowed_signers",
        regorus::Value::from(json!({})),
    ) {
        Ok(Value::String(s)) => s,
        _ => String::new(),
    }
}

/// `gateway approve|deny`: prove who the approver is (a signature checked
/// against the allowed signers, else the OS user the kernel named), ask the
/// policy whether that identity may give this verdict on this call
/// (data.gateway.approvals.verdict), then record it.
pub fn verdict(
    cli: &Cli,
    a: &VerdictArgs,
    grant: bool,
    caller: &crate::daemon::Asker,
    channel: &str,
    set: &PolicySet,
    o: &mut Out,
) -> anyhow::Result<u8> {
    let home = cli.home();
    let audit = super::audit::open_log(&cli.file, &home)?;
    let store = store(cli)?;
    let verdict = if grant { "grant" } else { "deny" };
    let Some(approval) = store.get(&a.id)? else {
        return refuse(
            &audit,
            "",
            &a.id,
            format!("no approval with id {}", a.id),
            None,
            caller,
            o,
        );
    };
    let rid = approval.request_id.clone();
    let (approver, reason) = match (&a.signed_statement, &a.ssh_signature) {
        (Some(statement), None) if a.webauthn_assertion.is_some() => {
            let assertion = a.webauthn_assertion.as_deref().unwrap_or_default();
            let rp = match cli
                .file
                .http
                .as_ref()
                .map(|h| crate::approvals::passkey::RelyingParty::new(&h.resource))
            {
                Some(Ok(rp)) => rp,
                Some(Err(e)) => {
                    let why = format!("passkey verdicts need the approval page: {e}");
                    return refuse(&audit, &rid, &a.id, why, None, caller, o);
                }
                None => {
                    let why = "passkey verdicts come from the approval page, which needs [http]"
                        .to_string();
                    return refuse(&audit, &rid, &a.id, why, None, caller, o);
                }
            };
            let proofs = crate::pipeline::approval_proofs(set);
            match proof::check_passkey(
                &approval,
                verdict,
                statement,
                assertion,
                &proofs.passkeys,
                &rp,
                crate::approvals::now_ms(),
            ) {
                // A page session gives verdicts only with its own passkeys.
                Ok((who, _)) if matches!(caller, crate::daemon::Asker::Passkey(n) if *n != who.name) =>
                {
                    let why = format!(
                        "the passkey is {}'s, and this page session is {}'s",
                        who.name,
                        caller.name()
                    );
                    return refuse(&audit, &rid, &a.id, why, None, caller, o);
                }
                Ok((who, st)) if a.reason.is_empty() || a.reason == st.reason => (who, st.reason),
                Ok(_) => {
                    let why = "--reason differs from the reason that was signed".to_string();
                    return refuse(&audit, &rid, &a.id, why, None, caller, o);
                }
                Err(e) => {
                    let why = format!("the passkey is not accepted: {e}");
                    return refuse(&audit, &rid, &a.id, why, None, caller, o);
                }
            }
        }
        (Some(statement), Some(signature)) => {
            let signed = crate::approvals::signature::Signed {
                statement: statement.clone(),
                signature: signature.clone(),
            };
            match proof::check_signed(
                &approval,
                verdict,
                &signed,
                &allowed_signers(set),
                crate::approvals::now_ms(),
            ) {
                Ok((signer, st)) if a.reason.is_empty() || a.reason == st.reason => (
                    proof::signed_approver(signer, signed, caller.os_user().unwrap_or("")),
                    st.reason,
                ),
                Ok(_) => {
                    let why = "--reason differs from the reason that was signed".to_string();
                    return refuse(&audit, &rid, &a.id, why, None, caller, o);
                }
                Err(e) => {
                    let why = format!("the signature is not accepted: {e}");
                    return refuse(&audit, &rid, &a.id, why, None, caller, o);
                }
            }
        }
        (None, None) if matches!(caller, crate::daemon::Asker::Passkey(_)) => {
            let why =
                "a verdict from the approval page needs the passkey's assertion over its statement"
                    .to_string();
            return refuse(&audit, &rid, &a.id, why, None, caller, o);
        }
        (None, None) => (
            Approver {
                name: caller.name().to_string(),
                kind: match caller {
                    crate::daemon::Asker::Os(_) => "os_user",
                    _ => "sso",
                },
                os_user: caller.os_user().unwrap_or("").to_string(),
                signed: None,
                identity: caller.sso_identity(),
            },
            a.reason.clone(),
        ),
        _ => {
            let why = "a signed verdict needs both its statement and its signature".to_string();
            return refuse(&audit, &rid, &a.id, why, None, caller, o);
        }
    };
    // The reason is kept in the statement, the store and the audit as
    // given; the audit scrubs secrets, which would break a signed one.
    if crate::audit::scrub::scrub_str(&reason) != reason {
        let why =
            "the reason contains something shaped like a secret (a token or key); write it without"
                .to_string();
        return refuse(&audit, &rid, &a.id, why, Some(approver.name), caller, o);
    }
    // Shown to people as is (a format character would be escaped on the
    // terminal, and the statement printed would not be the one signed).
    if super::out::escaped(&reason, true) != reason {
        let why =
            "the reason may not hold control or format characters (newlines, escapes, bidi marks)"
                .to_string();
        return refuse(&audit, &rid, &a.id, why, Some(approver.name), caller, o);
    }
    // Kept whole in one audit line (a longer one would be cut to a digest
    // there, and its signature could no longer be re-checked).
    if reason.len() > MAX_REASON_BYTES {
        let why = format!(
            "the reason is {} bytes; at most {MAX_REASON_BYTES}",
            reason.len()
        );
        return refuse(&audit, &rid, &a.id, why, Some(approver.name), caller, o);
    }
    let verdicts: Vec<Value> = approval
        .verdicts
        .iter()
        .map(|v| json!({"approver": v.approver, "verdict": v.verdict, "kind": v.kind, "os_user": v.os_user}))
        .collect();
    let input = json!({
        "verdict": verdict,
        "channel": channel,
        "approver": proof::identity_json(&approver, caller.groups()),
        "approval": {
            "id": approval.id, "tool": approval.tool, "params": approval.params,
            "requested_by": approval.requested_by, "requester": approval.requester,
            "signals": approval.signals,
            "state": approval.state.as_str(), "verdicts": verdicts,
        },
    });
    let judged = set.eval_rule(
        "data.gateway.approvals.verdict",
        regorus::Value::from(input),
    );
    match judged {
        Ok(v) if v["allow"] == Value::Bool(true) => {}
        Ok(v) => {
            let reasons: Vec<String> = v["reasons"]
                .as_array()
                .map(|r| {
                    r.iter()
                        .filter_map(Value::as_str)
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default();
            let why = if reasons.is_empty() {
                format!(
                    "the policy does not allow {} to {verdict} this call",
                    approver.name
                )
            } else {
                reasons.join("; ")
            };
            return refuse(&audit, &rid, &a.id, why, Some(approver.name), caller, o);
        }
        Err(e) => {
            let why = format!("the policy gives no verdict (data.gateway.approvals.verdict): {e}");
            return refuse(&audit, &rid, &a.id, why, Some(approver.name), caller, o);
        }
    }
    let who = approver.name.clone();
    let result = if grant {
        store.grant(&a.id, &approver, &reason)?
    } else {
        store.deny(&a.id, &approver, &reason)?
    };
    match result {
        Ok(approval) => {
            let (fp, key) = match &approver.signed {
                Some((s, _)) => (Some(s.fingerprint.clone()), Some(s.public_key.clone())),
                None => (None, None),
            };
            let verdict = Verdict {
                approval_id: approval.id.clone(),
                approver: who.clone(),
                kind: approver.kind.into(),
                os_user: caller.os_user().unwrap_or("").to_string(),
                identity: approver.identity.clone(),
                reason: reason.clone(),
                state: approval.state.as_str().into(),
                grants: approval.grants(),
                approvers_required: approval.approvers_required,
                key_fingerprint: fp.clone(),
                public_key: key,
                statement: approver.signed.as_ref().map(|(_, s)| s.statement.clone()),
                signature: approver.signed.as_ref().map(|(_, s)| s.signature.clone()),
            };
            audit.record(
                &approval.request_id,
                if grant {
                    Event::ApprovalGranted(verdict)
                } else {
                    Event::ApprovalDenied(verdict)
                },
            )?;
            let how = fp.map(|f| format!(" (key {f})")).unwrap_or_default();
            if grant {
                match approval.state {
                    State::Approved => outln!(
                        o,
                        "approved {} as {who}{how}: the next {} call with approval_id {} may run it, once, until {}",
                        approval.id,
                        approval.tool,
                        approval.id,
                        approval.expires_at
                    ),
                    _ => outln!(
                        o,
                        "recorded {who}'s approval{how} of {}: {} of {} approvals given",
                        approval.id,
                        approval.grants(),
                        approval.approvers_required
                    ),
                }
            } else {
                outln!(
                    o,
                    "denied {} as {who}{how}: it can no longer be approved or used",
                    approval.id
                );
            }
            Ok(0)
        }
        Err(refusal) => {
            audit.record(
                &rid,
                Event::ApprovalRefused {
                    approval_id: a.id.clone(),
                    reason: None,
                    refusal: Some(json!(refusal)),
                    approver: Some(who.clone()),
                    action: Some(if grant { "approve" } else { "deny" }.into()),
                    os_user: caller.os_user().map(str::to_string),
                    identity: caller.sso_identity(),
                },
            )?;
            errln!(o, "gateway: refused: {refusal}");
            Ok(1)
        }
    }
}

/// `gateway approvals watch`: print each approval request as it appears,
/// and what became of it, looking every `interval` seconds with `pending`
/// (the pending approvals as JSON) and `final_state` (one approval's state
/// once it is no longer pending). Runs until interrupted.
pub fn watch(
    interval: u64,
    pending: &mut dyn FnMut() -> anyhow::Result<Vec<Value>>,
    final_state: &mut dyn FnMut(&str) -> Option<String>,
) -> anyhow::Result<std::process::ExitCode> {
    use std::collections::BTreeMap;
    use std::io::Write;
    let mut seen: BTreeMap<String, Value> = BTreeMap::new();
    let mut first = true;
    loop {
        let now: Vec<Value> = pending()?;
        let mut lines = Vec::new();
        for a in &now {
            let Some(id) = a["id"].as_str() else { continue };
            if !seen.contains_key(id) {
                let signals = a["signals"].as_array().map(Vec::len).unwrap_or(0);
                lines.push(format!(
                    "{} {id}  {}  {}  requested by {}  {} signal(s)  expires {}  (gateway approvals show {id})",
                    if first { "PENDING" } else { "NEW" },
                    shown(a["tool"].as_str().unwrap_or("?")),
                    shown(&a["params"].to_string()),
                    shown(a["requested_by"].as_str().unwrap_or("?")),
                    signals,
                    shown(a["expires_at"].as_str().unwrap_or("?")),
                ));
                seen.insert(id.to_string(), a.clone());
            }
        }
        let gone: Vec<String> = seen
            .keys()
            .filter(|id| !now.iter().any(|a| a["id"].as_str() == Some(id.as_str())))
            .cloned()
            .collect();
        for id in gone {
            seen.remove(&id);
            let state = final_state(&id).unwrap_or_else(|| "gone".into());
            lines.push(format!("{} {id}", state.to_uppercase()));
        }
        if !lines.is_empty() {
            let mut out = std::io::stdout().lock();
            for l in lines {
                let _ = writeln!(out, "{l}");
            }
            let _ = out.flush();
        }
        first = false;
        std::thread::sleep(std::time::Duration::from_secs(interval));
    }
}

/// The pending approvals of a state dir as JSON, and one's state: what
/// `watch` reads on a direct command.
pub fn watch_direct(cli: &Cli, interval: u64) -> anyhow::Result<std::process::ExitCode> {
    let store = store(cli)?;
    watch(
        interval,
        &mut || {
            Ok(store
                .list(false)?
                .iter()
                .map(|a| scrub(&serde_json::to_value(a).unwrap_or_default()))
                .collect())
        },
        &mut |id| {
            store
                .get(id)
                .ok()
                .flatten()
                .map(|a| a.state.as_str().to_string())
        },
    )
}

/// The statement of approval `id` from a state dir (a direct command).
pub fn statement_direct(
    cli: &Cli,
    id: &str,
    verdict: &str,
    reason: &str,
    valid_for: u64,
) -> anyhow::Result<String> {
    let store = store(cli)?;
    let approval = store
        .get(id)?
        .with_context(|| format!("no approval with id {id}"))?;
    let until = crate::approvals::now_ms()
        .saturating_add(i64::try_from(valid_for.saturating_mul(1000)).unwrap_or(i64::MAX));
    Ok(
        String::from_utf8_lossy(&approval.statement(verdict, reason, until).to_bytes())
            .into_owned(),
    )
}
