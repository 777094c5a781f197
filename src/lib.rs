//! `gateway`: policy-gated, sandboxed infrastructure actions for AI coding agents.
//!
//! The modules follow the pipeline described in README.md. Every decision is made by the
//! Rego policies under `policies/` (see [`policy`]); Rust moves data.

pub mod approvals;
pub mod audit;
pub mod broker;
pub mod canonical;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod db;
pub mod doctor;
pub mod http;
pub mod identity;
pub mod mcp;
pub mod pipeline;
pub mod policy;
pub mod process;
pub use gateway_runner::protocol;
pub mod sandbox;
pub mod secret;
pub mod telemetry;
pub mod text;
pub mod tools;
pub mod trust;
pub mod verify;

/// Every binary, bench and test linking the gateway allocates with
/// mimalloc: policy evaluation makes and frees many small values, and
/// glibc's malloc made a plan decision about 30% slower (see README.md,
/// Benchmarks).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Errors made by libraries capture no backtrace unless
/// `RUST_LIB_BACKTRACE` asks for one. regorus makes errors in the normal
/// course of an evaluation; with `RUST_BACKTRACE=1` (common on developer
/// machines) each would capture a backtrace, making a decision 15-35%
/// slower. Panics keep their backtraces (`RUST_BACKTRACE`).
///
/// Call it first thing in `main`, before any thread exists.
pub fn quiet_library_backtraces() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // SAFETY: called first thing in `main` (the binary's and the
        // benches'), before any other thread exists that could read the
        // environment at the same time.
        unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    }
}

/// An error and its causes on one line, each cause once: an error that
/// already says its cause in its own message (`audit log X: denied`) does
/// not get it repeated (anyhow's `{:#}` and most chains would).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !out.contains(&m) {
            out.push_str(": ");
            out.push_str(&m);
        }
        cur = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::error_chain;
    use anyhow::Context;

    #[test]
    fn each_cause_is_said_once() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "permission denied");
        let e = crate::audit::AuditError::Io {
            path: "/var/audit.jsonl".into(),
            source: io,
        };
        let e = Err::<(), _>(e)
            .context("cannot verify audit log /var/audit.jsonl")
            .expect_err("an error");
        assert_eq!(
            error_chain(e.as_ref()),
            "cannot verify audit log /var/audit.jsonl: audit log /var/audit.jsonl: permission denied"
        );
        // A cause the message does not mention is still said.
        let e = anyhow::anyhow!("disk full").context("writing the plan");
        assert_eq!(error_chain(e.as_ref()), "writing the plan: disk full");
    }
}
