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

/// The OS user running this process, as the policy input's `principal.os_user`.
pub fn os_user() -> String {
    ["USER", "LOGNAME"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| "unknown".to_string())
}
