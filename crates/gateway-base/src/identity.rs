//! Who is on the other end: an OS user as the kernel reports it.
//!
//! The daemon takes a connection's uid, gid and pid from the socket's peer
//! credentials (`SO_PEERCRED`), never from what the caller says; the user
//! name and groups are then looked up from that uid. A command run directly
//! (no daemon) is the real uid of its own process. The MCP client's name is
//! a separate claim (the policy input's `principal.client`).

use serde::{Deserialize, Serialize};

/// How a command reached the code that runs it: through the daemon's
/// socket (the caller is its peer), or directly (the caller is this
/// process's user, on a state dir it can write).
pub const VIA_DAEMON: &str = "daemon";
pub const DIRECT: &str = "direct";

/// An OS user, as the kernel identified it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// The peer's pid at connect time (`None` for this process's own user).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    /// The user name of `uid` (`uid:N` when the uid has no name).
    pub user: String,
    /// Names of the groups of `uid` (primary first), from the group
    /// database; a gid without a name is `gid:N`.
    pub groups: Vec<String>,
}

impl Caller {
    /// The user with this uid (and primary gid), names looked up.
    pub fn from_ids(uid: u32, gid: u32, pid: Option<i32>) -> Caller {
        let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten();
        let name = user
            .as_ref()
            .map(|u| u.name.clone())
            .unwrap_or_else(|| format!("uid:{uid}"));
        let mut gids = vec![nix::unistd::Gid::from_raw(gid)];
        if let Some(u) = &user
            && let Ok(cname) = std::ffi::CString::new(u.name.clone())
            && let Ok(all) = nix::unistd::getgrouplist(&cname, u.gid)
        {
            for g in all {
                if !gids.contains(&g) {
                    gids.push(g);
                }
            }
        }
        let groups = gids
            .into_iter()
            .map(|g| match nix::unistd::Group::from_gid(g) {
                Ok(Some(gr)) => gr.name,
                _ => format!("gid:{g}"),
            })
            .collect();
        Caller {
            uid,
            gid,
            pid,
            user: name,
            groups,
        }
    }

    /// The real user of this process (not the environment, which the caller
    /// controls).
    pub fn this_process() -> Caller {
        Caller::from_ids(
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
            None,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Caller;

    #[test]
    fn this_process_is_named_from_its_uid() {
        let me = Caller::this_process();
        assert_eq!(me.uid, nix::unistd::getuid().as_raw());
        assert!(!me.user.is_empty());
        assert!(!me.groups.is_empty(), "{me:?}");
        let nobody = Caller::from_ids(4_000_000_000, 4_000_000_000, Some(1));
        assert_eq!(nobody.user, "uid:4000000000");
        assert_eq!(nobody.groups, vec!["gid:4000000000".to_string()]);
    }
}
