//! `gateway doctor`: the host and the installation, each check ok or a
//! problem with the command that fixes it.

use std::path::PathBuf;
use std::process::ExitCode;

use super::Cli;
use crate::doctor::{Status, Subject};

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Print the findings as JSON (an array of {check, status, detail, fix}).
    #[arg(long)]
    json: bool,
}

pub fn run(cli: &Cli, a: &DoctorArgs) -> anyhow::Result<ExitCode> {
    super::dev::ensure_runner()?;
    let config_path = cli
        .config
        .clone()
        .unwrap_or_else(|| PathBuf::from(crate::config::DAEMON_CONFIG));
    let subject = Subject {
        config: crate::config::GatewayConfig::load(&config_path, true).map_err(|e| {
            use std::error::Error;
            match e.source() {
                Some(s) => format!("{e}: {s}"),
                None => e.to_string(),
            }
        }),
        config_path,
        tools: crate::tools::ToolPaths::installed(),
        probe_platforms: nix::unistd::geteuid().is_root(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let findings = rt.block_on(crate::doctor::run(&subject));
    let problems = findings
        .iter()
        .filter(|f| f.status == Status::Problem)
        .count();
    if a.json {
        super::out::print_safe(&format!("{}\n", serde_json::to_string_pretty(&findings)?));
    } else {
        let mut text = String::from("gateway doctor\n");
        for f in &findings {
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
    }
    Ok(if problems == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
