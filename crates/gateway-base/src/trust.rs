//! Whether the daemon may trust a path: the path and every directory above
//! it belong to root (or to the daemon's own user) and nobody else can write
//! them. Whoever can write the policy dir, the configuration, the state or a
//! binary the daemon runs decides what the daemon does, so an agent with a
//! shell must own none of them.
//!
//! A world-writable directory above the path is accepted only when it is
//! root's and sticky (`/tmp`): there nobody can rename or replace another
//! user's entries. So are the write bits of the volumes the operator names
//! as the daemon's pod's own (`[daemon] private_volumes`, an emptyDir;
//! `read_only_volumes`, ConfigMap and Secret volumes, while mounted
//! read-only), each a mount point. Everything else group- or world-writable
//! is refused, naming the path and the fix.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why a path cannot be trusted.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("{what} {path} is not safe: {why}; fix: {fix}")]
    Unsafe {
        what: String,
        path: PathBuf,
        why: String,
        fix: String,
    },
    #[error("{what} {path}: {source}")]
    Io {
        what: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} {path} lies inside the workspace {workspace}, which the agent can write")]
    InsideWorkspace {
        what: String,
        path: PathBuf,
        workspace: PathBuf,
    },
}

/// The owners the daemon accepts: root and the daemon's own user.
#[derive(Debug, Clone)]
pub struct Trust {
    owners: Vec<u32>,
    /// Volumes of this pod alone (see [`Trust::with_pod_volumes`]).
    private: Vec<PathBuf>,
    /// Read-only volumes of this pod (see [`Trust::with_pod_volumes`]).
    read_only: Vec<PathBuf>,
}

impl Trust {
    /// Root and this process's effective user.
    pub fn for_this_process() -> Trust {
        let me = nix::unistd::geteuid().as_raw();
        let mut owners = vec![0];
        if me != 0 {
            owners.push(me);
        }
        Trust {
            owners,
            private: Vec::new(),
            read_only: Vec::new(),
        }
    }

    /// Also trust the write bits of the daemon's pod volumes, each of
    /// which must be a mount point (or the operator's statement is
    /// refused: on a host, a world-writable dir is what it says):
    ///
    /// - `private`: dirs no other user can reach, a Kubernetes `emptyDir`
    ///   of the daemon's own pod (the kubelet makes it mode 0777, 2777 with
    ///   an fsGroup, and no other container mounts it);
    /// - `read_only`: ConfigMap, Secret and projected volumes (and a Secret
    ///   file mounted by `subPath`): mode 0777 too, but mounted read-only,
    ///   which is checked again at every use, so that nobody in the pod can
    ///   change them; everything at or below one is excused its write bits.
    ///
    /// Owners are still checked, and so is every dir above them. A
    /// read-only mount the operator did not name is not excused: a host's
    /// read-only view (systemd `ProtectSystem=strict`, a `:ro` bind) says
    /// nothing of who writes the same files through another.
    pub fn with_pod_volumes(
        mut self,
        private: &[PathBuf],
        read_only: &[PathBuf],
    ) -> Result<Trust, TrustError> {
        let mounts =
            std::fs::read_to_string("/proc/self/mountinfo").map_err(|source| TrustError::Io {
                what: "mount table".into(),
                path: PathBuf::from("/proc/self/mountinfo"),
                source,
            })?;
        let points: Vec<PathBuf> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(|p| PathBuf::from(unescape_mount_path(p)))
            .collect();
        if nix::unistd::geteuid().is_root() && !(private.is_empty() && read_only.is_empty()) {
            return Err(TrustError::Unsafe {
                what: "[daemon] private_volumes / read_only_volumes".into(),
                path: PathBuf::from("/"),
                why: "they are for a daemon in a pod, which runs as a user of its own; a root daemon on a host trusts no dir for being a mount".into(),
                fix: "remove them, or run the daemon as a non-root user (deploy/kubernetes)".into(),
            });
        }
        for (list, key, read_only) in [
            (private, "private_volumes", false),
            (read_only, "read_only_volumes", true),
        ] {
            for d in list {
                let real = std::fs::canonicalize(d).map_err(|source| TrustError::Io {
                    what: format!("[daemon] {key} entry"),
                    path: d.clone(),
                    source,
                })?;
                if !points.contains(&real) {
                    return Err(TrustError::Unsafe {
                        what: format!("[daemon] {key} entry"),
                        path: d.clone(),
                        why:
                            "not a mount point (only a volume of the daemon's own pod may be named)"
                                .into(),
                        fix: format!("remove it from [daemon] {key}"),
                    });
                }
                let refuse = |why: String| TrustError::Unsafe {
                    what: format!("[daemon] {key} entry"),
                    path: d.clone(),
                    why,
                    fix: format!("remove it from [daemon] {key}"),
                };
                if real == Path::new("/") {
                    return Err(refuse(
                        "the root of the file system is no pod volume".into(),
                    ));
                }
                // Another mount inside it would be excused with it.
                if let Some(inner) = points.iter().find(|p| **p != real && p.starts_with(&real)) {
                    return Err(refuse(format!(
                        "{} is mounted inside it: name each volume itself",
                        inner.display()
                    )));
                }
                if read_only {
                    if !on_read_only_mount(&real) {
                        return Err(refuse("not mounted read-only".into()));
                    }
                    self.read_only.push(real);
                } else {
                    self.private.push(real);
                }
            }
        }
        Ok(self)
    }

    /// Whether `p` is at or below a declared read-only volume, and lies
    /// on a read-only mount itself now (a link is judged by what it names).
    fn on_read_only_volume(&self, p: &Path) -> bool {
        self.read_only
            .iter()
            .any(|v| p.starts_with(v) && on_read_only_mount(p))
    }

    /// Root alone: what a root daemon's files must belong to, checked by
    /// another user (`gateway doctor`).
    pub fn root_only() -> Trust {
        Trust {
            owners: vec![0],
            private: Vec::new(),
            read_only: Vec::new(),
        }
    }

    /// `path` and every directory above it, and every link on the way to
    /// it (a link, and the dir it sits in, must be trusted too: otherwise
    /// whoever can rewrite the link decides what the path names).
    pub fn check_path(&self, what: &str, path: &Path) -> Result<(), TrustError> {
        self.check_links(what, path, 0)?;
        let real = std::fs::canonicalize(path).map_err(|source| TrustError::Io {
            what: what.into(),
            path: path.to_path_buf(),
            source,
        })?;
        self.check_entry(what, &real, false)?;
        for dir in real.ancestors().skip(1) {
            self.check_entry(what, dir, true)?;
        }
        Ok(())
    }

    /// `root` as [`Trust::check_path`], and everything below it (links
    /// are not followed: a link's own owner is checked).
    pub fn check_tree(&self, what: &str, root: &Path) -> Result<(), TrustError> {
        self.check_path(what, root)?;
        let real = std::fs::canonicalize(root).map_err(|source| TrustError::Io {
            what: what.into(),
            path: root.to_path_buf(),
            source,
        })?;
        let mut stack = vec![real];
        while let Some(dir) = stack.pop() {
            if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
                continue;
            }
            let io = |source| TrustError::Io {
                what: what.into(),
                path: dir.clone(),
                source,
            };
            for entry in std::fs::read_dir(&dir).map_err(io)? {
                let entry = entry.map_err(io)?;
                let p = entry.path();
                self.check_entry(what, &p, false)?;
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(p);
                }
            }
        }
        Ok(())
    }

    fn check_links(&self, what: &str, path: &Path, depth: u8) -> Result<(), TrustError> {
        use std::path::Component;
        let io = |p: &Path, source| TrustError::Io {
            what: what.into(),
            path: p.to_path_buf(),
            source,
        };
        if depth > 40 {
            return Err(io(
                path,
                std::io::Error::other("too many levels of symbolic links"),
            ));
        }
        let abs = if path.is_absolute() {
            path.to_path_buf()
        } else {
            std::env::current_dir().map_err(|e| io(path, e))?.join(path)
        };
        let comps: Vec<Component> = abs.components().collect();
        let mut cur = PathBuf::new();
        for (i, comp) in comps.iter().enumerate() {
            match comp {
                // No link has been met on `cur` so far: it is physical, and
                // `..` is its parent.
                Component::ParentDir => {
                    cur.pop();
                    continue;
                }
                Component::CurDir => continue,
                c => cur.push(c),
            }
            let m = std::fs::symlink_metadata(&cur).map_err(|e| io(&cur, e))?;
            if m.file_type().is_symlink() {
                // The link, and every dir above it (whoever can write any
                // of them can replace the link): `cur` is physical so far.
                self.check_entry(what, &cur, false)?;
                let parent = cur.parent().unwrap_or(Path::new("/")).to_path_buf();
                for dir in parent.ancestors() {
                    self.check_entry(what, dir, true)?;
                }
                let target = std::fs::read_link(&cur).map_err(|e| io(&cur, e))?;
                let mut next = if target.is_absolute() {
                    target
                } else {
                    parent.join(target)
                };
                for rest in &comps[i + 1..] {
                    next.push(rest);
                }
                return self.check_links(what, &next, depth + 1);
            }
        }
        Ok(())
    }

    fn check_entry(&self, what: &str, p: &Path, above: bool) -> Result<(), TrustError> {
        let m = std::fs::symlink_metadata(p).map_err(|source| TrustError::Io {
            what: what.into(),
            path: p.to_path_buf(),
            source,
        })?;
        let unsafe_ = |why: String, fix: String| TrustError::Unsafe {
            what: what.into(),
            path: p.to_path_buf(),
            why,
            fix,
        };
        if !self.owners.contains(&m.uid()) {
            return Err(unsafe_(
                format!("owned by {}", user_name(m.uid())),
                format!("chown root {}", p.display()),
            ));
        }
        if m.file_type().is_symlink() {
            // A link's mode bits mean nothing; its owner was checked.
            return Ok(());
        }
        let mode = m.mode();
        let sticky_root_dir = m.is_dir() && mode & 0o1000 != 0 && m.uid() == 0;
        let private = m.is_dir() && self.private.iter().any(|d| d == p);
        // Writable by others, and none of: a sticky root dir above, a
        // private volume, a read-only mount.
        let excused = (above && sticky_root_dir) || private || self.on_read_only_volume(p);
        if mode & 0o022 != 0 && !excused {
            let who = if mode & 0o002 != 0 {
                "everyone"
            } else {
                "its group"
            };
            return Err(unsafe_(
                format!("writable by {who} (mode {:o})", mode & 0o7777),
                format!("chmod go-w {}", p.display()),
            ));
        }
        Ok(())
    }
}

/// A mount point as `/proc/self/mountinfo` writes it: space, tab, newline
/// and backslash as octal escapes.
fn unescape_mount_path(p: &str) -> String {
    let b = p.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `p` lies on a file system mounted read-only (in this process's
/// view).
pub fn on_read_only_mount(p: &Path) -> bool {
    nix::sys::statvfs::statvfs(p)
        .is_ok_and(|s| s.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
}

impl Trust {
    /// Before creating `path` (and the dirs it needs): the nearest dir that
    /// exists must be trusted, so that nothing is created through someone
    /// else's dir or link.
    pub fn check_creatable(&self, what: &str, path: &Path) -> Result<(), TrustError> {
        let existing = path
            .ancestors()
            .find(|p| !p.as_os_str().is_empty() && std::fs::symlink_metadata(p).is_ok())
            .unwrap_or(Path::new("/"));
        self.check_path(what, existing)
    }
}

/// Refuse `path` when it is `workspace` or lies below it.
pub fn outside_workspace(what: &str, path: &Path, workspace: &Path) -> Result<(), TrustError> {
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let ws = std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.to_path_buf());
    if real.starts_with(&ws) {
        return Err(TrustError::InsideWorkspace {
            what: what.into(),
            path: real,
            workspace: ws,
        });
    }
    Ok(())
}

fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => format!("{} (uid {uid})", u.name),
        _ => format!("uid {uid}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn only(owner: u32) -> Trust {
        Trust {
            owners: vec![owner],
            private: Vec::new(),
            read_only: Vec::new(),
        }
    }

    #[test]
    fn pod_volumes_are_refused_to_a_root_daemon_and_must_be_mount_points() {
        let dir = tempfile::tempdir().expect("tmp");
        let plain = vec![dir.path().to_path_buf()];
        for (private, read_only) in [(plain.clone(), vec![]), (vec![], plain.clone())] {
            let e = Trust::for_this_process()
                .with_pod_volumes(&private, &read_only)
                .expect_err("a plain dir, or a root daemon");
            let expected = if nix::unistd::geteuid().is_root() {
                "a root daemon on a host"
            } else {
                "not a mount point"
            };
            assert!(e.to_string().contains(expected), "{e}");
        }
        Trust::for_this_process()
            .with_pod_volumes(&[], &[])
            .expect("none named");
        assert_eq!(unescape_mount_path("/a\\040b\\011c"), "/a b\tc");
    }

    #[test]
    fn writable_by_others_is_refused_with_the_fix() {
        let me = nix::unistd::geteuid().as_raw();
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("policies");
        std::fs::create_dir(&p).expect("dir");
        std::fs::write(p.join("a.rego"), "package a\n").expect("file");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        only(me).check_tree("policy dir", &p).expect("safe");
        for (path, mode, who) in [
            (p.clone(), 0o775, "its group"),
            (p.join("a.rego"), 0o646, "everyone"),
        ] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
            let e = only(me)
                .check_tree("policy dir", &p)
                .expect_err("unsafe")
                .to_string();
            assert!(e.contains(who) && e.contains("chmod go-w"), "{e}");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        // /tmp above the dir is world-writable but root's and sticky.
        only(me)
            .check_path("policy dir", &p)
            .expect("sticky /tmp above");
    }

    #[test]
    fn a_link_on_the_path_must_be_trusted_and_sit_in_a_trusted_dir() {
        let me = nix::unistd::geteuid().as_raw();
        let dir = tempfile::tempdir().expect("tmp");
        let real = dir.path().join("real");
        std::fs::create_dir(&real).expect("dir");
        let open = dir.path().join("open");
        std::fs::create_dir(&open).expect("dir");
        std::os::unix::fs::symlink(&real, open.join("link")).expect("link");
        std::os::unix::fs::symlink(&real, dir.path().join("good")).expect("link");
        only(me)
            .check_path("policy dir", &dir.path().join("good"))
            .expect("a trusted link to a trusted dir");
        // The link sits in a dir others can write: they could retarget it.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = only(me)
            .check_path("policy dir", &open.join("link"))
            .expect_err("a link in a writable dir")
            .to_string();
        assert!(e.contains("writable by everyone"), "{e}");
        // ... or a dir further up: it could rename the link's dir aside.
        let deep = open.join("b");
        std::fs::create_dir(&deep).expect("dir");
        std::fs::set_permissions(&deep, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::os::unix::fs::symlink(&real, deep.join("link")).expect("link");
        let e = only(me)
            .check_path("policy dir", &deep.join("link"))
            .expect_err("a link below a writable dir")
            .to_string();
        assert!(e.contains("writable by everyone"), "{e}");
        // A link owned by someone else.
        let e = only(me.wrapping_add(4242))
            .check_links("policy dir", &dir.path().join("good"), 0)
            .expect_err("not ours")
            .to_string();
        assert!(e.contains("owned by"), "{e}");
    }

    #[test]
    fn another_owner_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let other = nix::unistd::geteuid().as_raw().wrapping_add(4242);
        let e = only(other)
            .check_path("config", dir.path())
            .expect_err("not ours")
            .to_string();
        assert!(e.contains("owned by") && e.contains("chown root"), "{e}");
    }

    #[test]
    fn a_path_inside_the_workspace_is_refused() {
        let ws = tempfile::tempdir().expect("ws");
        std::fs::create_dir(ws.path().join("policies")).expect("dir");
        let e = outside_workspace("policy dir", &ws.path().join("policies"), ws.path())
            .expect_err("inside");
        assert!(e.to_string().contains("inside the workspace"), "{e}");
        outside_workspace("policy dir", std::path::Path::new("/etc"), ws.path()).expect("outside");
    }
}
