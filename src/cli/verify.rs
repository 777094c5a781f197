//! `gateway verify`: prove the sandbox isolation claims on the backend in use.

use std::process::ExitCode;

use super::Cli;
use crate::sandbox::local::{LocalConfig, LocalSandbox};

#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// Print the results as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(cli: &Cli, a: &VerifyArgs) -> anyhow::Result<ExitCode> {
    let sb = LocalSandbox::new(LocalConfig::default())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let checks = rt.block_on(crate::sandbox::verify::verify_local(&sb, &cli.home()));
    let ok = checks.iter().all(|c| c.pass);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&checks)?);
    } else {
        println!("gateway verify: local backend (gVisor runsc)");
        for c in &checks {
            println!(
                "{}  {}\n      {}",
                if c.pass { "PASS" } else { "FAIL" },
                c.name,
                c.detail
            );
        }
        let passed = checks.iter().filter(|c| c.pass).count();
        println!("{} passed, {} failed", passed, checks.len() - passed);
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
