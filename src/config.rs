//! Paths and settings shared by every command.

use std::path::PathBuf;

/// The gateway's state directory (approvals, audit log, saved plans) when
/// neither `--home` nor `GATEWAY_HOME` names one: `$XDG_STATE_HOME/gateway`,
/// else `~/.local/state/gateway`, else `./.gateway` when no home is known.
pub fn default_home() -> PathBuf {
    if let Some(state) = std::env::var_os("XDG_STATE_HOME").filter(|s| !s.is_empty()) {
        return PathBuf::from(state).join("gateway");
    }
    if let Some(home) = std::env::var_os("HOME").filter(|s| !s.is_empty()) {
        return PathBuf::from(home).join(".local/state/gateway");
    }
    PathBuf::from(".gateway")
}

/// The real OS user running this process (from the uid, not from the
/// environment, which the caller controls): the approver's default identity.
pub fn os_identity() -> String {
    let uid = nix::unistd::getuid();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(u)) => u.name,
        _ => format!("uid:{uid}"),
    }
}
