//! Sandboxes (README.md: the sandboxes): one throwaway sandbox per tool call, behind one
//! contract for every backend — a command, files in, an optional credential
//! file, limits, a deadline and a network rule in; exit status, capped
//! stdout/stderr, files out, duration and why it ended out.
//!
//! Backends: [`local`] (gVisor `runsc` on one Linux host, the embedded
//! default) and [`kubernetes`] (a gVisor Job per call on a cluster).

pub mod beneath;
pub mod cgroups;
pub mod kubernetes;
pub mod local;
pub mod net;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use zeroize::Zeroizing;

pub use gateway_runner::protocol::{CREDENTIAL_PATH, FILES_IN_DIR, WORKDIR};
/// The unprivileged user tools run as.
pub const SANDBOX_UID: u32 = 65534;

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(
        "gVisor's runsc is not installed or not usable ({0}); install it with `sudo apt-get install runsc` (Debian/Ubuntu) or `scripts/install-tools.sh`. The gateway never runs a tool outside a sandbox."
    )]
    RunscMissing(String),
    #[error(
        "the local sandbox needs {tool} ({why}); install it with `sudo apt-get install {package}`"
    )]
    HostToolMissing {
        tool: &'static str,
        package: &'static str,
        why: &'static str,
    },
    #[error(
        "the local sandbox must run as root (runsc and network namespaces need it); running as uid {0}"
    )]
    NotRoot(u32),
    #[error("this host cannot hold a sandbox to its limits: {0}")]
    Cgroups(String),
    #[error("invalid sandbox request: {0}")]
    Invalid(String),
    #[error("sandbox setup failed: {0}")]
    Setup(String),
    #[error("sandbox I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A file the sandbox left is not one the gateway will read (a link, a
    /// FIFO, a device, over the cap): the sandbox is hostile input.
    #[error("the sandbox's output was refused: {0}")]
    Output(#[from] beneath::BeneathError),
    /// The run started and could not finish (its pod never started, the
    /// API server went away…): why, and the steps it reached.
    #[error("sandbox setup failed: {why}")]
    Stopped { why: String, stages: Vec<StageMark> },
}

impl SandboxError {
    /// The steps a failed run reached (empty when none are known).
    pub fn stages(&self) -> &[StageMark] {
        match self {
            SandboxError::Stopped { stages, .. } => stages,
            _ => &[],
        }
    }
}

pub use gateway_base::secret::SecretFile;

/// A host path made visible inside the sandbox, read-only unless
/// `writable` (an upstream MCP server's declared directories: the
/// operator's choice, on the local backend only).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bind {
    pub host: PathBuf,
    pub inside: PathBuf,
    pub writable: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// Memory of the whole sandbox (its cgroup, plus a fixed headroom for
    /// gVisor itself); over it, the sandbox is killed.
    pub memory_bytes: u64,
    /// Processes (and threads) the sandbox user may have.
    pub max_processes: u64,
    /// CPU seconds the whole sandbox may use (measured on its cgroup, killed
    /// when exceeded), and the per-process RLIMIT_CPU.
    pub cpu_seconds: u64,
    /// CPU share as a cgroup quota, in thousandths of a core (500 = half a core).
    pub cpu_millicores: u64,
    /// Largest file a process may write.
    pub file_bytes: u64,
    /// Cap of captured stdout and of stderr, each.
    pub output_bytes: usize,
    /// Cap of each file read back from the working dir (`files_out`).
    pub file_out_bytes: u64,
    /// What the sandbox may write in all (the size of its working dir and
    /// of its scratch storage).
    pub disk_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 512 << 20,
            max_processes: 256,
            cpu_seconds: 300,
            cpu_millicores: 1000,
            file_bytes: 256 << 20,
            output_bytes: 1 << 20,
            file_out_bytes: 64 << 20,
            disk_bytes: 1 << 30,
        }
    }
}

/// A network endpoint a sandbox may reach: a TCP port on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Endpoint {
    /// The decision's name for it (e.g. `kube-apiserver`).
    pub name: String,
    /// The TCP port on the host (listening on an address the sandbox's
    /// veth can reach, e.g. 0.0.0.0).
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Network {
    /// No network at all.
    None,
    /// Only these endpoints; everything else is dropped.
    Endpoints(Vec<Endpoint>),
}

#[derive(Debug, Clone)]
pub struct FileIn {
    /// Path relative to [`FILES_IN_DIR`].
    pub path: String,
    pub contents: Vec<u8>,
}

#[derive(Debug, Clone)]
pub struct SandboxRequest {
    /// Unique name (from the request id); also names the runsc container.
    pub name: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Host files and dirs the command needs, read-only.
    pub binds: Vec<Bind>,
    /// Host dir mounted read-write at [`WORKDIR`]: the only writable place.
    /// Always a throwaway dir of the caller's (a copy of a module, never the
    /// module itself), under [`Sandbox::scratch_dir`].
    pub workdir: Option<PathBuf>,
    pub files_in: Vec<FileIn>,
    pub credential: Option<SecretFile>,
    pub limits: Limits,
    pub deadline: Duration,
    pub network: Network,
    /// Paths relative to the working dir to return after the run, read as
    /// hostile input ([`beneath::read_files_out`]): no link followed,
    /// regular files only, at most `limits.file_out_bytes` each.
    pub files_out: Vec<String>,
    /// Told of each line of the sandbox's stderr as it comes (lines of at
    /// most [`LineSink::MAX`] bytes; the backends that stream it: local).
    /// What it is told is the sandbox's output: hostile.
    pub on_stderr_line: Option<LineSink>,
    /// The image the sandbox's container runs from, pinned by digest, when
    /// it is not the backend's own: an upstream MCP server's, whose runtime
    /// (Node.js, Python…) the runner image does not carry. The runner is
    /// put beside it at the same path. Only the kubernetes backend runs
    /// one; the local backend runs this host's files and refuses it.
    pub image: Option<String>,
}

/// What a [`LineSink`] calls with each line.
pub type LineFn = dyn Fn(&[u8]) + Send + Sync;

/// Where a sandbox's stderr lines go as they come ([`SandboxRequest`]).
#[derive(Clone)]
pub struct LineSink(pub std::sync::Arc<LineFn>);

impl LineSink {
    /// The longest line passed on; longer ones are not.
    pub const MAX: usize = 2048;
}

impl std::fmt::Debug for LineSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LineSink")
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Captured {
    #[serde(serialize_with = "lossy")]
    pub bytes: Vec<u8>,
    /// True when the output was longer than the cap and was cut.
    pub truncated: bool,
}

fn lossy<S: serde::Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(b))
}

impl Captured {
    /// Replace every occurrence of `secret` with `<redacted>`: a tool that
    /// prints its credential must not carry it into a result or the audit.
    /// An occurrence may be wrapped across lines as Terraform wraps its
    /// diagnostics: a line break, then indentation and the `│` of its box,
    /// between any two of the secret's bytes.
    pub fn redact(&mut self, secret: &SecretFile) {
        let needle = secret.expose();
        if needle.is_empty() {
            return;
        }
        let mut out = Vec::with_capacity(self.bytes.len());
        let mut i = 0;
        while i < self.bytes.len() {
            match match_wrapped(&self.bytes, i, needle) {
                Some(end) => {
                    out.extend_from_slice(b"<redacted>");
                    i = end;
                }
                None => {
                    out.push(self.bytes[i]);
                    i += 1;
                }
            }
        }
        self.bytes = out;
    }

    /// Redact every one of `secrets`, also in the cheap encodings a tool
    /// (or hostile code) could print it in: base64 (standard and URL-safe,
    /// at each of the three alignments it can have inside a longer
    /// encoded text) and hex (lower and upper case).
    /// A credential file of `key = value` lines (an AWS credentials file)
    /// has each value redacted on its own too.
    pub fn redact_all(&mut self, secrets: &[SecretFile]) {
        for s in secrets {
            let mut parts = vec![Zeroizing::new(s.expose().to_vec())];
            if s.expose().contains(&b'\n') {
                for line in s.expose().split(|b| *b == b'\n') {
                    if let Some(eq) = line.iter().position(|b| *b == b'=') {
                        let v = line[eq + 1..].trim_ascii();
                        if v.len() >= 8 {
                            parts.push(Zeroizing::new(v.to_vec()));
                        }
                    }
                }
            }
            // A JWT's parts (a Kubernetes token's payload and signature)
            // are each secret enough to cut out on their own, and every
            // part is also encoded after being reversed.
            let jwt_parts: Vec<Zeroizing<Vec<u8>>> = parts
                .iter()
                .flat_map(|p| {
                    p.split(|b| *b == b'.')
                        .filter(|x| x.len() >= 16 && x.len() < p.len())
                        .map(|x| Zeroizing::new(x.to_vec()))
                        .collect::<Vec<_>>()
                })
                .collect();
            parts.extend(jwt_parts);
            let reversed: Vec<Zeroizing<Vec<u8>>> = parts
                .iter()
                .map(|p| Zeroizing::new(p.iter().rev().copied().collect()))
                .collect();
            parts.extend(reversed);
            let mut needles: Vec<Zeroizing<Vec<u8>>> =
                parts.iter().flat_map(|p| encodings(p)).collect();
            needles.sort_by_key(|n| std::cmp::Reverse(n.len()));
            needles.dedup();
            for needle in needles {
                self.redact(&SecretFile::from_zeroizing(needle));
            }
        }
    }

    /// The text, with a marker when it was cut.
    pub fn text(&self) -> String {
        let mut s = String::from_utf8_lossy(&self.bytes).into_owned();
        if self.truncated {
            s.push_str("\n[… output cut at the sandbox's output limit …]");
        }
        s
    }
}

/// `secret` and its encodings, longest first. A base64 form is taken from
/// each whole 3-byte group of the secret after skipping 0, 1 or 2 bytes,
/// so it is found whatever the secret's offset in the encoded stream.
fn encodings(secret: &[u8]) -> Vec<Zeroizing<Vec<u8>>> {
    use base64::Engine;
    let mut out: Vec<Zeroizing<Vec<u8>>> = vec![Zeroizing::new(secret.to_vec())];
    if secret.len() >= 8 {
        out.push(Zeroizing::new(hex::encode(secret).into_bytes()));
        out.push(Zeroizing::new(hex::encode_upper(secret).into_bytes()));
        // Percent-encoding of everything but RFC 3986's unreserved bytes
        // (what urlencode() and most URL encoders make), upper and lower.
        for upper in [true, false] {
            let mut pct = Vec::with_capacity(secret.len() * 3);
            for &b in secret {
                if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                    pct.push(b);
                } else if upper {
                    pct.extend_from_slice(format!("%{b:02X}").as_bytes());
                } else {
                    pct.extend_from_slice(format!("%{b:02x}").as_bytes());
                }
            }
            out.push(Zeroizing::new(pct));
        }
        for skip in 0..3 {
            let rest = &secret[skip..];
            let whole = &rest[..rest.len() - rest.len() % 3];
            for engine in [
                &base64::engine::general_purpose::STANDARD_NO_PAD,
                &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            ] {
                out.push(Zeroizing::new(engine.encode(whole).into_bytes()));
            }
        }
        // Each of those backwards too (reverse() costs a module nothing).
        let reversed: Vec<Zeroizing<Vec<u8>>> = out
            .iter()
            .map(|n| Zeroizing::new(n.iter().rev().copied().collect()))
            .collect();
        out.extend(reversed);
    }
    out.sort_by_key(|n| std::cmp::Reverse(n.len()));
    out.dedup();
    out
}

/// Where `needle` ends if it starts at `hay[at]`, allowing between any two
/// of its bytes a line wrap (`\r`/`\n`, then spaces, tabs and the
/// box-drawing `│` Terraform frames its diagnostics with) or a short
/// separator (at most [`MAX_GAP`] bytes that are neither ASCII letters nor
/// digits: a space, a dash, a zero-width space).
fn match_wrapped(hay: &[u8], at: usize, needle: &[u8]) -> Option<usize> {
    const BAR: &[u8] = "│".as_bytes();
    let (mut j, mut k) = (at, 0);
    while k < needle.len() {
        let b = *hay.get(j)?;
        if b == needle[k] {
            j += 1;
            k += 1;
        } else if k > 0 && !b.is_ascii_alphanumeric() && b != b'\n' && b != b'\r' {
            let mut gap = 0;
            while let Some(&c) = hay.get(j) {
                if c == needle[k] || c.is_ascii_alphanumeric() || gap == MAX_GAP {
                    break;
                }
                j += 1;
                gap += 1;
            }
            if hay.get(j) != Some(&needle[k]) {
                return None;
            }
        } else if k > 0 && (b == b'\n' || b == b'\r') {
            while let Some(&c) = hay.get(j) {
                if matches!(c, b'\n' | b'\r' | b' ' | b'\t') {
                    j += 1;
                } else if hay[j..].starts_with(BAR) {
                    j += BAR.len();
                } else {
                    break;
                }
            }
        } else {
            return None;
        }
    }
    Some(j)
}

/// The most bytes of a separator [`match_wrapped`] skips between two bytes
/// of a secret.
const MAX_GAP: usize = 4;

/// Whether `bytes` hold any of `secrets` in a form [`Captured::redact_all`]
/// redacts: for files that must not be written where the agent reads them.
pub fn holds_any(bytes: &[u8], secrets: &[SecretFile]) -> bool {
    let mut c = Captured {
        bytes: bytes.to_vec(),
        truncated: false,
    };
    c.redact_all(secrets);
    c.bytes != bytes
}

/// Why the sandbox ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "reason", content = "detail")]
pub enum Ended {
    /// The command exited on its own (see the exit code).
    Exited,
    /// Killed at the wall-clock deadline.
    Deadline,
    /// Killed by the kernel for a limit (CPU time, file size).
    Limit(String),
    /// Killed by a signal that was not ours.
    Signal(i32),
}

#[derive(Debug, Clone, Serialize)]
pub struct SandboxResult {
    pub name: String,
    /// Exit code when the command exited; `None` when it was killed.
    pub exit_code: Option<i32>,
    pub stdout: Captured,
    pub stderr: Captured,
    #[serde(skip)]
    pub files_out: BTreeMap<String, Vec<u8>>,
    pub duration_ms: u128,
    pub ended: Ended,
    /// Sandbox-side address (`ip:port`) of each allowed endpoint.
    pub endpoints: BTreeMap<String, String>,
    /// When each step of the run was reached, in order (audited with the
    /// sandbox's end and put on its trace span): where a run's time went.
    pub stages: Vec<StageMark>,
}

/// A step of a sandbox's run reached `at_ms` after the run began.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StageMark {
    pub stage: &'static str,
    pub at_ms: u64,
}

/// The steps a run reached, timed from its start.
#[derive(Debug)]
pub struct Stages {
    started: std::time::Instant,
    marks: Vec<StageMark>,
}

impl Stages {
    pub fn start() -> Stages {
        Stages {
            started: std::time::Instant::now(),
            marks: Vec::new(),
        }
    }

    /// `stage` is reached now (only its first time counts).
    pub fn mark(&mut self, stage: &'static str) {
        if self.marks.iter().any(|m| m.stage == stage) {
            return;
        }
        let at_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.marks.push(StageMark { stage, at_ms });
    }

    pub fn into_marks(self) -> Vec<StageMark> {
        self.marks
    }
}

/// `stage=ms` pairs, in order (a trace attribute).
pub fn stages_text(marks: &[StageMark]) -> String {
    marks
        .iter()
        .map(|m| format!("{}={}", m.stage, m.at_ms))
        .collect::<Vec<_>>()
        .join(",")
}

impl SandboxResult {
    pub fn success(&self) -> bool {
        self.ended == Ended::Exited && self.exit_code == Some(0)
    }
}

/// What [`Sandbox::run`] returns.
pub type RunFuture<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<SandboxResult, SandboxError>> + Send + 'a>,
>;

/// What [`Sandbox::start_session`] returns.
pub type SessionFuture<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<SandboxSession, SandboxError>> + Send + 'a>,
>;

/// A sandbox that lives on after it started ([`Sandbox::start_session`]):
/// its command's stdin and stdout are the caller's. It is killed and
/// removed when this is dropped, when its command ends, or at its
/// request's deadline and limits, whichever comes first.
pub struct SandboxSession {
    pub name: String,
    /// The command's stdin.
    pub input: Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
    /// The command's stdout: hostile.
    pub output: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    /// False once the sandbox has ended or is ending.
    pub alive: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Dropped with the session: the sandbox is stopped.
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// Told once the sandbox has ended and is removed: why, and when.
    pub ended: Option<tokio::sync::oneshot::Receiver<SessionEnd>>,
}

/// How a [`SandboxSession`] ended.
#[derive(Debug, Clone)]
pub struct SessionEnd {
    pub ended: Ended,
    pub exit_code: Option<i32>,
    pub duration_ms: u128,
}

impl SandboxSession {
    pub fn alive(&self) -> bool {
        self.alive.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl std::fmt::Debug for SandboxSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxSession")
            .field("name", &self.name)
            .field("alive", &self.alive())
            .finish()
    }
}

/// A sandbox backend.
pub trait Sandbox: Send + Sync {
    /// Run one request in a new sandbox and remove it afterwards. Dropping
    /// the returned future (cancellation) kills and removes the sandbox.
    fn run(&self, req: SandboxRequest) -> RunFuture<'_>;

    /// The backend's name, as the audit records it.
    fn backend(&self) -> &'static str;

    /// Start a sandbox that lives on, its command's stdin and stdout the
    /// caller's ([`SandboxSession`]); for a server that serves many calls
    /// (a warm upstream MCP server, which is handed no credential). The
    /// backends that cannot say so ([`Sandbox::runs_sessions`]).
    fn start_session(&self, req: SandboxRequest) -> SessionFuture<'_> {
        let backend = self.backend();
        drop(req);
        Box::pin(async move {
            Err(SandboxError::Invalid(format!(
                "the {backend} sandbox backend runs no long-lived sandbox"
            )))
        })
    }

    /// Whether [`Sandbox::start_session`] can start one.
    fn runs_sessions(&self) -> bool {
        false
    }

    /// Whether the tools come from this host (bound into the sandbox, the
    /// local backend) rather than from the sandbox's image.
    fn uses_host_tools(&self) -> bool {
        true
    }

    /// Where a Terraform provider mirror is inside the sandbox, if the
    /// backend puts it somewhere of its own.
    fn terraform_provider_mirror(&self) -> Option<String> {
        None
    }

    /// Where working dirs for this backend's sandboxes are made (a copy of
    /// a module per sandbox): a place the backend can mount from.
    fn scratch_dir(&self) -> PathBuf {
        std::env::temp_dir().join("gateway-scratch")
    }

    /// Whether the scratch dir's group may write it (a volume shared with
    /// the sandboxes through their fsGroup).
    fn scratch_group_writable(&self) -> bool {
        false
    }

    /// Whether each working dir must be a filesystem of its own, of the
    /// decision's `disk_bytes` (the local backend: the sandbox writes
    /// straight into it). Backends that limit storage themselves
    /// (Kubernetes' ephemeral-storage) say false.
    fn scratch_needs_quota(&self) -> bool {
        false
    }
}

/// The prefix of a working dir's name: `work-<pid>-<start>-`, the process
/// that made it, so that one left by a killed gateway can be found.
pub fn scratch_prefix() -> String {
    let o = gateway_base::process::Owner::current();
    format!("work-{}-{}-", o.pid, o.start)
}

/// A sandbox's working dir: a new empty dir, mounted as a tmpfs of its own
/// size when the backend needs a quota; unmounted and removed when dropped.
#[derive(Debug)]
pub struct Scratch {
    dir: Option<tempfile::TempDir>,
    mounted: bool,
}

impl Scratch {
    /// A new working dir under `root`; with `quota`, a tmpfs of `quota`
    /// bytes (mode 0700, nosuid, nodev) is mounted on it, and a failure to
    /// mount is an error (the sandbox would otherwise write without limit).
    pub fn new(root: &Path, quota: Option<u64>) -> Result<Scratch, String> {
        let dir = tempfile::Builder::new()
            .prefix(&scratch_prefix())
            .tempdir_in(root)
            .map_err(|e| format!("making a working dir under {}: {e}", root.display()))?;
        let mut s = Scratch {
            dir: Some(dir),
            mounted: false,
        };
        if let Some(bytes) = quota {
            use nix::mount::{MsFlags, mount};
            mount(
                Some("gateway-scratch"),
                s.path(),
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                // Inodes too: a million empty files take kernel memory
                // that `size` does not count (one per 16 KiB of quota,
                // at least 4096).
                Some(format!("size={bytes},nr_inodes={},mode=0700", (bytes / 16384).max(4096)).as_str()),
            )
            .map_err(|e| {
                format!(
                    "cannot give the sandbox a working dir of {bytes} bytes (a tmpfs on {}): {e}; nothing was run",
                    s.path().display()
                )
            })?;
            s.mounted = true;
        }
        Ok(s)
    }

    pub fn path(&self) -> &Path {
        self.dir.as_ref().map_or(Path::new(""), |d| d.path())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.mounted {
            let _ = nix::mount::umount2(self.path(), nix::mount::MntFlags::MNT_DETACH);
        }
        // The TempDir removes the (now empty) mount point.
        self.dir.take();
    }
}

/// Unmount and remove the working dirs under `root` that a gateway process
/// no longer running left (killed before its [`Scratch`] dropped).
/// Returns the dirs removed.
pub fn reap_scratch(root: &Path) -> Vec<PathBuf> {
    let mut reaped = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else {
        return reaped;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("work-") else {
            continue;
        };
        let mut parts = rest.splitn(3, '-');
        let owner = match (
            parts.next().and_then(|p| p.parse().ok()),
            parts.next().and_then(|s| s.parse().ok()),
        ) {
            (Some(pid), Some(start)) => gateway_base::process::Owner { pid, start },
            _ => continue,
        };
        if owner.alive() {
            continue;
        }
        let path = entry.path();
        let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
        if std::fs::remove_dir_all(&path).is_ok() {
            reaped.push(path);
        }
    }
    reaped
}

/// A name usable as a runsc container id, a netns and interface suffix.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_printed_credential_is_cut_out_of_captured_output() {
        let secret = SecretFile::new(b"tok-123".to_vec());
        let mut c = Captured {
            bytes: b"a tok-123 b tok-12 tok-123tok-123".to_vec(),
            truncated: false,
        };
        c.redact(&secret);
        assert_eq!(
            String::from_utf8_lossy(&c.bytes),
            "a <redacted> b tok-12 <redacted><redacted>"
        );
        assert_eq!(format!("{secret:?} {secret}"), "<redacted> <redacted>");
    }

    #[test]
    fn every_live_credential_is_cut_out_also_base64_and_hex_encoded() {
        use base64::Engine;
        let a = SecretFile::new(b"hvs.first-call-token-0123456789".to_vec());
        let b = SecretFile::new(b"eyJhbGciOi.second-call-jwt.sig".to_vec());
        let mut text = String::from("plain: hvs.first-call-token-0123456789\n");
        for prefix in ["", "x", "xy"] {
            let mut raw = prefix.as_bytes().to_vec();
            raw.extend_from_slice(b"eyJhbGciOi.second-call-jwt.sig");
            raw.extend_from_slice(b" tail");
            text.push_str(&base64::engine::general_purpose::STANDARD.encode(&raw));
            text.push('\n');
            text.push_str(&base64::engine::general_purpose::URL_SAFE.encode(&raw));
            text.push('\n');
        }
        text.push_str(&hex::encode("hvs.first-call-token-0123456789"));
        text.push('\n');
        text.push_str(&hex::encode_upper("eyJhbGciOi.second-call-jwt.sig"));
        let mut c = Captured {
            bytes: text.into_bytes(),
            truncated: false,
        };
        c.redact_all(&[a, b]);
        let out = String::from_utf8_lossy(&c.bytes).into_owned();
        // Decode every line back: no secret survives in any of them.
        for line in out.lines() {
            assert!(!line.contains("first-call-token"), "{line}");
            for engine in [
                &base64::engine::general_purpose::STANDARD,
                &base64::engine::general_purpose::URL_SAFE,
            ] {
                if let Ok(d) = engine.decode(line) {
                    let d = String::from_utf8_lossy(&d);
                    assert!(!d.contains("second-call-jwt"), "{line} decodes to {d}");
                }
            }
            if let Ok(d) = hex::decode(line) {
                let d = String::from_utf8_lossy(&d);
                assert!(!d.contains("call-"), "{line} decodes to {d}");
            }
        }
        assert_eq!(out.matches("<redacted>").count(), 9, "{out}");

        // Reversed, percent-encoded, and wrapped as Terraform wraps a
        // diagnostic (a line break, then "│ " between two of its bytes).
        let t = SecretFile::new(b"hvs.CAESIJ+reversed/secret=".to_vec());
        let mut c = Captured {
            bytes: format!(
                "rev {}\npct {}\nwrapped: hvs.CAESIJ+rev\n│   ersed/secret=\nbase64 reversed {}\n",
                "=terces/desrever+JISEAC.svh",
                "hvs.CAESIJ%2Breversed%2Fsecret%3D",
                base64::engine::general_purpose::STANDARD_NO_PAD
                    .encode(b"hvs.CAESIJ+reversed/secret=")
                    .chars()
                    .rev()
                    .collect::<String>()
            )
            .into_bytes(),
            truncated: false,
        };
        c.redact_all(&[t]);
        let out = String::from_utf8_lossy(&c.bytes).into_owned();
        assert_eq!(
            out,
            "rev <redacted>\npct <redacted>\nwrapped: <redacted>\nbase64 reversed <redacted>\n"
        );
        // Encodings of the reversed value, separators, a JWT's parts alone.
        let jwt = SecretFile::new(
            b"eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0tc2EifQ.c2lnbmF0dXJlLXBhcnQtMTIzNDU2"
                .to_vec(),
        );
        let rev: Vec<u8> = jwt.expose().iter().rev().copied().collect();
        let text = format!(
            "a {}\nb {}\nc {}\nd {}\n",
            base64::engine::general_purpose::STANDARD.encode(&rev),
            "eyJhbGciOiJSUzI1NiJ9 eyJzdWIiOiJzeXN0ZW0tc2EifQ c2lnbmF0dXJlLXBhcnQtMTIzNDU2",
            "c2lnbmF0dXJlLXBhcnQtMTIzNDU2",
            "eyJhbGci\u{200b}OiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0tc2EifQ.c2lnbmF0dXJlLXBhcnQtMTIzNDU2",
        );
        let mut c = Captured {
            bytes: text.into_bytes(),
            truncated: false,
        };
        c.redact_all(&[jwt]);
        let out = String::from_utf8_lossy(&c.bytes).into_owned();
        // (A base64 text keeps its last, partial group: at most two bytes
        // of the secret; a JWT whose dots were replaced loses each part.)
        assert_eq!(
            out,
            "a <redacted>ZQ==\nb <redacted> <redacted> <redacted>\nc <redacted>\nd <redacted>\n"
        );
        assert!(holds_any(
            b"{\"outputs\":{\"t\":{\"value\":\"=terces/desrever+JISEAC.svh\"}}}",
            &[SecretFile::new(b"hvs.CAESIJ+reversed/secret=".to_vec())]
        ));
        assert!(!holds_any(
            b"{\"outputs\":{}}",
            &[SecretFile::new(b"hvs.CAESIJ+reversed/secret=".to_vec())]
        ));

        // An AWS credentials file: each value on its own is a secret too.
        let ini = SecretFile::new(
            b"[default]\naws_access_key_id = AKIAEXAMPLEKEY12\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG\n".to_vec(),
        );
        let mut c = Captured {
            bytes: b"key AKIAEXAMPLEKEY12 secret wJalrXUtnFEMI/K7MDENG".to_vec(),
            truncated: false,
        };
        c.redact_all(&[ini]);
        assert_eq!(
            String::from_utf8_lossy(&c.bytes),
            "key <redacted> secret <redacted>"
        );
    }
}

#[cfg(test)]
mod scratch_tests {
    use super::*;

    fn mounted(path: &Path) -> bool {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(path.to_str().unwrap_or("")))
    }

    /// Needs root (to mount), as the local backend does; CI runs as root.
    #[test]
    fn a_quota_scratch_is_a_tmpfs_of_its_size_and_goes_when_dropped() {
        let root = tempfile::tempdir().expect("root");
        let s = Scratch::new(root.path(), Some(1 << 20)).expect("mounted (needs root)");
        let path = s.path().to_path_buf();
        assert!(mounted(&path));
        let v = nix::sys::statvfs::statvfs(path.as_path()).expect("statvfs");
        assert_eq!(v.blocks() * v.fragment_size(), 1 << 20);
        let big = std::fs::write(path.join("fill"), vec![0u8; 2 << 20]);
        assert!(big.is_err(), "2 MiB do not fit in 1 MiB");
        drop(s);
        assert!(!mounted(&path) && !path.exists());
        // A dir left by a gateway that is gone (pid 1's start time differs)
        // is unmounted and removed by the reaper; ours are left alone.
        let ours = Scratch::new(root.path(), Some(1 << 20)).expect("mounted");
        let stale = root.path().join("work-1-1-abcdef");
        std::fs::create_dir(&stale).expect("mkdir");
        let reaped = reap_scratch(root.path());
        assert_eq!(reaped, vec![stale.clone()]);
        assert!(ours.path().exists() && mounted(ours.path()));
    }
}
