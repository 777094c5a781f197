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
pub mod identity;
pub mod mcp;
pub mod pipeline;
pub mod policy;
pub mod process;
pub use gateway_runner::protocol;
pub mod sandbox;
pub mod secret;
pub mod tools;
pub mod trust;
pub mod verify;

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
