//! `gateway doctor`: the host and the installation, each check ok or a
//! problem with the command that fixes it.

use std::path::PathBuf;
use std::process::ExitCode;

use super::Cli;
use crate::doctor::{Finding, Status, Subject};

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Print the findings as JSON (an array of {check, status, detail, fix}).
    #[arg(long)]
    json: bool,
}

/// What the doctor looks at: the daemon's configuration at `config_path`,
/// and the gateway the daemon runs with the tools beside it: root's
/// installed copy where `daemon install` made one, else this binary.
pub fn subject(config_path: PathBuf) -> Subject {
    let installed = std::path::Path::new(crate::config::DAEMON_LIB).join("bin/gateway");
    let daemon_exe = if installed.is_file() {
        installed
    } else {
        std::env::current_exe().unwrap_or_else(|_| PathBuf::from("gateway"))
    };
    Subject {
        tools: crate::tools::ToolPaths::beside(&daemon_exe),
        daemon_exe,
        config: crate::config::GatewayConfig::load(&config_path, true).map_err(|e| {
            use std::error::Error;
            match e.source() {
                Some(s) => format!("{e}: {s}"),
                None => e.to_string(),
            }
        }),
        config_path,
        probe_platforms: nix::unistd::geteuid().is_root(),
    }
}

/// Every check on `subject`.
pub fn check(subject: &Subject) -> anyhow::Result<Vec<Finding>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok(rt.block_on(crate::doctor::run(subject)))
}

/// The findings as an operator reads them; returns how many are problems.
pub fn print(findings: &[Finding]) -> usize {
    let problems = findings
        .iter()
        .filter(|f| f.status == Status::Problem)
        .count();
    let mut text = String::from("gateway doctor\n");
    for f in findings {
        let tag = match f.status {
            Status::Ok => "ok     ",
            Status::Note => "note   ",
            Status::Problem => "PROBLEM",
        };
        text.push_str(&format!(
            "{tag} {:<16} {}\n",
            f.check,
            super::out::escaped(&f.detail, true)
        ));
        if let Some(fix) = &f.fix {
            text.push_str(&format!(
                "        {:<16} fix: {}\n",
                "",
                super::out::escaped(fix, true)
            ));
        }
    }
    text.push_str(&format!(
        "{} checks, {problems} problem{}\n",
        findings.len(),
        if problems == 1 { "" } else { "s" }
    ));
    super::out::print_safe(&text);
    problems
}

pub fn run(cli: &Cli, a: &DoctorArgs) -> anyhow::Result<ExitCode> {
    super::dev::ensure_runner()?;
    let config_path = cli
        .config
        .clone()
        .unwrap_or_else(|| PathBuf::from(crate::config::DAEMON_CONFIG));
    let findings = check(&subject(config_path))?;
    let problems = if a.json {
        super::out::print_safe(&format!("{}\n", serde_json::to_string_pretty(&findings)?));
        findings
            .iter()
            .filter(|f| f.status == Status::Problem)
            .count()
    } else {
        print(&findings)
    };
    Ok(if problems == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
