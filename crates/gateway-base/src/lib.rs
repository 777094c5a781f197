//! The leaves every layer of the gateway shares. None of these modules
//! depends on another part of the gateway, so that the layers above (the
//! policy, the sandboxes, the broker, the pipeline) can all use them without
//! depending on each other.

pub mod canonical;
pub mod identity;
pub mod process;
pub mod secret;
pub mod text;
pub mod trust;

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

    /// An error that says its cause in its own message, as the audit log's do.
    #[derive(Debug, thiserror::Error)]
    #[error("audit log {path}: {source}")]
    struct SaysItsCause {
        path: String,
        source: std::io::Error,
    }

    /// An error that does not.
    #[derive(Debug, thiserror::Error)]
    #[error("{what}")]
    struct Context {
        what: &'static str,
        source: Box<dyn std::error::Error + 'static>,
    }

    #[test]
    fn each_cause_is_said_once() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "permission denied");
        let e = Context {
            what: "cannot verify audit log /var/audit.jsonl",
            source: Box::new(SaysItsCause {
                path: "/var/audit.jsonl".into(),
                source: io,
            }),
        };
        assert_eq!(
            error_chain(&e),
            "cannot verify audit log /var/audit.jsonl: audit log /var/audit.jsonl: permission denied"
        );
        // A cause the message does not mention is still said.
        let e = Context {
            what: "writing the plan",
            source: Box::new(std::io::Error::other("disk full")),
        };
        assert_eq!(error_chain(&e), "writing the plan: disk full");
    }
}
