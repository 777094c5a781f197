//! What `cargo run` leaves out: the in-sandbox runner.
//!
//! `cargo run --release -- demo` (the README's first command) builds only
//! the `gateway` binary; the runner is another package of the workspace,
//! and the sandbox needs it beside the gateway. When the gateway was
//! started by cargo from its own target dir and the runner is not there,
//! the pure tools that run sandboxes (`demo`, `verify`, `doctor`) build it
//! with the same cargo and profile, saying so. The daemon never does: it
//! takes the runner installed beside it or refuses to start.

use std::path::Path;

use anyhow::{Context, bail};

/// Build the runner beside this executable when cargo started us from a
/// target dir (cargo brings it up to date: a stale runner from before an
/// edit is as wrong as a missing one). Does nothing otherwise.
pub fn ensure_runner() -> anyhow::Result<()> {
    let me = std::env::current_exe().context("the path of this executable")?;
    let runner = me.with_file_name("gateway-runner");
    // `cargo run` sets CARGO to the cargo it was started with, and
    // CARGO_MANIFEST_DIR to the package's directory (the repository).
    let (Some(cargo), Some(manifest_dir)) = (
        std::env::var_os("CARGO"),
        std::env::var_os("CARGO_MANIFEST_DIR"),
    ) else {
        return Ok(());
    };
    let manifest = Path::new(&manifest_dir).join("Cargo.toml");
    let profile_dir = me.parent().and_then(Path::file_name);
    let release = match profile_dir.and_then(|p| p.to_str()) {
        Some("release") => true,
        Some("debug") => false,
        _ => return Ok(()),
    };
    if !manifest.is_file() {
        return Ok(());
    }
    if !runner.is_file() {
        eprintln!(
            "gateway: the in-sandbox runner is not built yet (cargo run builds only the gateway): \
             cargo build{} -p gateway-runner",
            if release { " --release" } else { "" }
        );
    }
    let mut cmd = std::process::Command::new(&cargo);
    cmd.arg("build")
        .arg("--quiet")
        .arg("--manifest-path")
        .arg(&manifest)
        .args(["-p", "gateway-runner"]);
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().context("running cargo to build the runner")?;
    if !status.success() || !runner.is_file() {
        bail!(
            "building the runner failed ({status}); build it yourself: cargo build{} -p gateway-runner",
            if release { " --release" } else { "" }
        );
    }
    Ok(())
}

/// The pure tools that start sandboxes (`demo`, `verify`) need root: runsc
/// and network namespaces do. Run by another user, they run themselves
/// again through sudo (the same binary by its absolute path, the same
/// arguments and directory), so that `cargo run --release -- demo` works
/// for a user with sudo; without sudo they say how to run them.
pub fn ensure_root(what: &str) -> anyhow::Result<()> {
    if nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let sudo = Path::new("/usr/bin/sudo");
    if !sudo.is_file() {
        bail!("gateway {what} starts gVisor sandboxes (runsc, network namespaces): run it as root");
    }
    // sudo resets the environment: a setting made there would be lost
    // without a word, so it is refused instead.
    let set: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with("GATEWAY_"))
        .collect();
    if !set.is_empty() {
        bail!(
            "gateway {what} starts gVisor sandboxes, which needs root, and sudo would drop {}: run it as root with them set (e.g. sudo env {}=… {} {what})",
            set.join(", "),
            set[0],
            std::env::current_exe()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| "gateway".into())
        );
    }
    let me = std::env::current_exe().context("the path of this executable")?;
    eprintln!("gateway {what} starts gVisor sandboxes, which needs root: running it with sudo");
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(sudo)
        .arg("--")
        .arg(&me)
        .args(std::env::args_os().skip(1))
        .exec();
    Err(anyhow::anyhow!("running {} with sudo: {err}", me.display()))
}
