//! `gateway approvals [show ID]`, `gateway approve ID`, `gateway deny ID`:
//! the operator's side of the approval gate. This process is the only way an
//! approval is granted: the MCP server has no code path for it.

use anyhow::Context;
use serde_json::{Value, json};

use super::Cli;
use super::out::{Out, errln, out, outln};
use crate::approvals::{Approval, ApprovalStore, State};
use crate::audit::events::Verdict;
use crate::audit::{AuditLog, Event, scrub::scrub};
use crate::identity::Caller;
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

#[derive(Debug, clap::Subcommand)]
enum ApprovalsCommand {
    /// Everything needed to decide: the call, each planned change, the signals.
    Show {
        id: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, clap::Args)]
pub struct VerdictArgs {
    /// The approval id (from `gateway approvals`).
    id: String,
    /// Why (required when the policy says so for this approval).
    #[arg(long, default_value = "")]
    reason: String,
    /// Record the verdict under this identity instead of the OS user
    /// (only when the policy allows it: data.config.approvals.identity).
    #[arg(long = "as", value_name = "NAME")]
    as_name: Option<String>,
}

impl VerdictArgs {
    /// Whether the caller asked to be recorded under another name (`--as`).
    pub fn names_identity(&self) -> bool {
        self.as_name.is_some()
    }
}

fn store(cli: &Cli) -> anyhow::Result<ApprovalStore> {
    let home = cli.home();
    ApprovalStore::in_home(&home)
        .with_context(|| format!("cannot open the approval store under {}", home.display()))
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

/// An untrusted string as one field on the terminal: secrets scrubbed and
/// every control or format character escaped, newlines included
/// ([`super::out::escaped`]).
pub fn shown(s: &str) -> String {
    super::out::escaped(&crate::audit::scrub::scrub_str(s), true)
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
    let _ = writeln!(
        o,
        "  reason needed: {}",
        if a.reason_required {
            "yes (--reason)"
        } else {
            "no"
        }
    );
    let changes = a.plan_summary.as_array().cloned().unwrap_or_default();
    let _ = writeln!(o, "\nplanned changes ({}):", changes.len());
    if changes.is_empty() {
        let _ = writeln!(o, "  (none recorded)");
    }
    for c in &changes {
        let actions: Vec<&str> = c["actions"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mark = match actions.as_slice() {
            ["create"] => "+",
            ["update"] => "~",
            ["no-op"] | ["read"] => " ",
            ["delete"] => "-",
            _ => "!",
        };
        let _ = write!(
            o,
            "  {mark} {:<24} {}",
            actions.join(","),
            shown(c["address"].as_str().unwrap_or("?"))
        );
        if let Some(r) = c["reason"].as_str() {
            let _ = write!(o, "  reason={}", shown(r));
        }
        if let Some(p) = c["paths"].as_array().filter(|p| !p.is_empty()) {
            let _ = write!(o, "  paths={}", shown(&Value::Array(p.clone()).to_string()));
        }
        let _ = writeln!(o);
    }
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
    for v in &a.verdicts {
        let _ = writeln!(
            o,
            "\n{} by {} at {}: {}",
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

/// The identity a verdict is recorded under, as the policy decides
/// (data.gateway.approvals.approver).
fn approver(
    set: &PolicySet,
    caller: &Caller,
    channel: &str,
    as_name: Option<&str>,
) -> anyhow::Result<Result<String, String>> {
    let mut input = json!({"os_user": caller.user, "uid": caller.uid, "groups": caller.groups, "channel": channel});
    if let Some(n) = as_name {
        input["named"] = n.into();
    }
    match set.eval_rule(
        "data.gateway.approvals.approver",
        regorus::Value::from(input),
    ) {
        Ok(Value::String(s)) if !s.trim().is_empty() => Ok(Ok(s)),
        Ok(other) => Ok(Err(format!(
            "the policy gave no usable approver identity ({other})"
        ))),
        Err(e) => Ok(Err(match as_name {
            Some(n) => format!(
                "--as {n} is not allowed by the policy (data.config.approvals.identity): {e}"
            ),
            None => {
                tracing::debug!("no approver identity from the policy: {e}");
                format!(
                    "{} may not approve or deny calls (data.config.approvals.identity names who may)",
                    caller.user
                )
            }
        })),
    }
}

pub fn verdict(
    cli: &Cli,
    a: &VerdictArgs,
    grant: bool,
    caller: &Caller,
    channel: &str,
    set: &PolicySet,
    o: &mut Out,
) -> anyhow::Result<u8> {
    let home = cli.home();
    let audit = AuditLog::in_home(&home)?;
    let mut store = store(cli)?;
    let request_id = store.get(&a.id)?.map(|x| x.request_id).unwrap_or_default();
    let who = match approver(set, caller, channel, a.as_name.as_deref())? {
        Ok(w) => w,
        Err(why) => {
            audit.record(
                &request_id,
                Event::ApprovalRefused {
                    approval_id: a.id.clone(),
                    reason: Some(why.clone()),
                    refusal: None,
                    approver: None,
                    action: None,
                    os_user: Some(caller.user.clone()),
                },
            )?;
            errln!(o, "gateway: refused: {why}");
            return Ok(1);
        }
    };
    let result = if grant {
        store.grant(&a.id, &who, &a.reason)?
    } else {
        store.deny(&a.id, &who, &a.reason)?
    };
    match result {
        Ok(approval) => {
            let verdict = Verdict {
                approval_id: approval.id.clone(),
                approver: who.clone(),
                reason: a.reason.clone(),
                state: approval.state.as_str().into(),
                grants: approval.grants(),
                approvers_required: approval.approvers_required,
            };
            audit.record(
                &approval.request_id,
                if grant {
                    Event::ApprovalGranted(verdict)
                } else {
                    Event::ApprovalDenied(verdict)
                },
            )?;
            if grant {
                match approval.state {
                    State::Approved => outln!(
                        o,
                        "approved {} as {who}: the next {} call with approval_id {} may run it, once, until {}",
                        approval.id,
                        approval.tool,
                        approval.id,
                        approval.expires_at
                    ),
                    _ => outln!(
                        o,
                        "recorded {who}'s approval of {}: {} of {} approvals given",
                        approval.id,
                        approval.grants(),
                        approval.approvers_required
                    ),
                }
            } else {
                outln!(
                    o,
                    "denied {} as {who}: it can no longer be approved or used",
                    approval.id
                );
            }
            Ok(0)
        }
        Err(refusal) => {
            audit.record(
                &request_id,
                Event::ApprovalRefused {
                    approval_id: a.id.clone(),
                    reason: None,
                    refusal: Some(json!(refusal)),
                    approver: Some(who.clone()),
                    action: Some(if grant { "approve" } else { "deny" }.into()),
                    os_user: None,
                },
            )?;
            errln!(o, "gateway: refused: {refusal}");
            Ok(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::shown;

    #[test]
    fn no_control_or_format_character_reaches_the_terminal() {
        let hostile = "ok\r\x1b[2K  !! fake\x1b]0;title\x07\u{9b}31m\u{202e}evil\u{200b}\tend\n";
        let s = shown(hostile);
        assert!(
            s.chars()
                .all(|c| !c.is_control() && !('\u{200b}'..='\u{202e}').contains(&c)),
            "{s:?}"
        );
        assert_eq!(
            s,
            "ok\\r\\u{001b}[2K  !! fake\\u{001b}]0;title\\u{0007}\\u{009b}31m\\u{202e}evil\\u{200b}\\tend\\n"
        );
        assert_eq!(shown("plain text, ünïcode"), "plain text, ünïcode");
    }
}
