use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = gateway::cli::Cli::parse();
    gateway::cli::init_tracing();
    match gateway::cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gateway: {e:#}");
            ExitCode::from(2)
        }
    }
}
