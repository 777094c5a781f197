use std::process::ExitCode;

fn main() -> ExitCode {
    gateway::quiet_library_backtraces();
    // One TLS provider for the whole process (vaultrs and any other rustls
    // user), chosen before anything opens a connection.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = gateway::cli::Cli::parse_shown();
    gateway::cli::init_tracing();
    match gateway::cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            gateway::cli::out::eprint_safe(&format!(
                "gateway: {}\n",
                gateway::error_chain(e.as_ref())
            ));
            ExitCode::from(2)
        }
    }
}
