//! Reading what a sandbox hands back, as hostile input.
//!
//! A sandbox runs code the gateway does not trust (a module's providers, a
//! tool's output), and the gateway reads the files it leaves with more
//! privilege than the sandbox had. So every file is opened beneath the
//! directory it must be in with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`: no symlink is followed,
//! anywhere in the path, and nothing outside the directory is reached. Only
//! regular files are read (a FIFO, device or socket is refused without
//! being opened for reading), and only up to a cap from policy data. Both
//! sandbox backends read their files out through [`read_files_out`].

use std::collections::BTreeMap;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat};

#[derive(Debug, thiserror::Error)]
pub enum BeneathError {
    #[error(
        "{path} is a symbolic link or passes through one; the gateway follows no link a sandbox made"
    )]
    Link { path: String },
    #[error("{path} leads outside the directory it must be in")]
    Escapes { path: String },
    #[error("{path} is a {kind}, not a regular file")]
    NotRegular { path: String, kind: &'static str },
    #[error("{path} is {size} bytes, over the policy's cap of {cap} bytes")]
    TooLarge { path: String, size: u64, cap: u64 },
    #[error("{path} does not exist")]
    NotFound { path: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// How every open here resolves a path: beneath the directory, no links,
/// no crossing into another mount (a FUSE or NFS mount inside a module
/// could block or lie).
fn how(flags: OFlag) -> OpenHow {
    OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS
                | ResolveFlag::RESOLVE_NO_XDEV,
        )
}

fn map_errno(path: &str, e: Errno) -> BeneathError {
    match e {
        Errno::ELOOP => BeneathError::Link { path: path.into() },
        Errno::EXDEV => BeneathError::Escapes { path: path.into() },
        Errno::EEXIST => BeneathError::Io {
            path: path.into(),
            source: std::io::Error::from(Errno::EEXIST),
        },
        Errno::ENOENT => BeneathError::NotFound { path: path.into() },
        other => BeneathError::Io {
            path: path.into(),
            source: std::io::Error::from(other),
        },
    }
}

/// The kind of file a stat describes, in words.
pub fn kind_of(st: &FileStat) -> &'static str {
    match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
        SFlag::S_IFREG => "regular file",
        SFlag::S_IFDIR => "directory",
        SFlag::S_IFLNK => "symbolic link",
        SFlag::S_IFIFO => "FIFO",
        SFlag::S_IFSOCK => "socket",
        SFlag::S_IFCHR => "character device",
        SFlag::S_IFBLK => "block device",
        _ => "file of unknown type",
    }
}

/// Open a directory the gateway itself names (not one a sandbox made),
/// refusing a symlink as its last component.
pub fn open_dir(path: &Path) -> Result<OwnedFd, BeneathError> {
    let shown = path.display().to_string();
    nix::fcntl::open(
        path,
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        Mode::empty(),
    )
    .map_err(|e| map_errno(&shown, e))
}

/// Open `rel` beneath `dir` with `flags`, following no link.
pub fn open_beneath(dir: impl AsFd, rel: &str, flags: OFlag) -> Result<OwnedFd, BeneathError> {
    if rel.is_empty() || rel.starts_with('/') {
        return Err(BeneathError::Escapes { path: rel.into() });
    }
    openat2(dir, rel, how(flags)).map_err(|e| map_errno(rel, e))
}

/// Create the new regular file `rel` beneath `dir` with `mode` (never an
/// existing file, never through a link).
pub fn create_beneath(dir: impl AsFd, rel: &str, mode: u32) -> Result<OwnedFd, BeneathError> {
    if rel.is_empty() || rel.starts_with('/') {
        return Err(BeneathError::Escapes { path: rel.into() });
    }
    let how =
        how(OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL).mode(Mode::from_bits_truncate(mode));
    openat2(dir, rel, how).map_err(|e| map_errno(rel, e))
}

/// Make sure `path` is a directory of this process's user that nobody
/// else can write, creating it (with `mode`) when it is missing: a
/// directory the gateway puts sandboxes' files in must not be one another
/// user made (an agent could create it first, in `/dev/shm` or on a
/// shared volume, and swap what the gateway writes there for links).
///
/// `group_may_write`: the directory's group may write it too (a volume
/// whose group is the sandboxes' fsGroup, which the kubelet sets on every
/// mount); its mode is then left as it is.
pub fn private_dir(path: &Path, mode: u32, group_may_write: bool) -> Result<(), BeneathError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let shown = path.display().to_string();
    let io = |source| BeneathError::Io {
        path: shown.clone(),
        source,
    };
    match std::fs::DirBuilder::new().mode(mode).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(e)),
    }
    let meta = std::fs::symlink_metadata(path).map_err(io)?;
    if meta.file_type().is_symlink() {
        return Err(BeneathError::Link { path: shown });
    }
    if !meta.is_dir() {
        return Err(BeneathError::NotRegular {
            path: shown,
            kind: "file that is not a directory",
        });
    }
    let me = nix::unistd::geteuid().as_raw();
    let foreign_write = if group_may_write { 0o002 } else { 0o022 };
    if meta.uid() != me || meta.mode() & foreign_write != 0 {
        return Err(BeneathError::Io {
            path: shown,
            source: std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "owned by uid {} with mode {:o}, not by this gateway (uid {me}) and writable by it alone; remove it (another user may have made it) and start again",
                    meta.uid(),
                    meta.mode() & 0o7777
                ),
            ),
        });
    }
    if group_may_write {
        return Ok(());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io)
}

/// Stat `rel` beneath `dir` without following a link and without opening
/// it for reading (an `O_PATH` descriptor: a FIFO does not block, a device
/// is not touched).
pub fn stat_beneath(dir: impl AsFd, rel: &str) -> Result<FileStat, BeneathError> {
    let fd = open_beneath(dir, rel, OFlag::O_PATH)?;
    fstat(&fd).map_err(|e| map_errno(rel, e))
}

/// Read the regular file `rel` beneath `dir`, at most `cap` bytes.
pub fn read_file(dir: impl AsFd, rel: &str, cap: u64) -> Result<Vec<u8>, BeneathError> {
    read_file_stat(dir, rel, cap).map(|(bytes, _)| bytes)
}

/// [`read_file`], with the stat of the descriptor that was read (the file
/// the bytes came from, whatever its name points at by now).
pub fn read_file_stat(
    dir: impl AsFd,
    rel: &str,
    cap: u64,
) -> Result<(Vec<u8>, FileStat), BeneathError> {
    let dir = dir.as_fd();
    let st = stat_beneath(dir, rel)?;
    let kind = kind_of(&st);
    if kind != "regular file" {
        return Err(BeneathError::NotRegular {
            path: rel.into(),
            kind,
        });
    }
    let size = u64::try_from(st.st_size).unwrap_or(u64::MAX);
    if size > cap {
        return Err(BeneathError::TooLarge {
            path: rel.into(),
            size,
            cap,
        });
    }
    // Open for reading; the file must still be the one just checked.
    let fd = open_beneath(dir, rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK)?;
    let again = fstat(&fd).map_err(|e| map_errno(rel, e))?;
    if again.st_dev != st.st_dev || again.st_ino != st.st_ino {
        return Err(BeneathError::NotRegular {
            path: rel.into(),
            kind: "file replaced while it was read",
        });
    }
    let mut out = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    std::fs::File::from(fd)
        .take(cap.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|source| BeneathError::Io {
            path: rel.into(),
            source,
        })?;
    if out.len() as u64 > cap {
        return Err(BeneathError::TooLarge {
            path: rel.into(),
            size: out.len() as u64,
            cap,
        });
    }
    Ok((out, again))
}

/// The files a sandbox left in its working dir that the caller asked for:
/// each read with [`read_file`]; a file that is not there is left out, any
/// other problem (a link, a FIFO, a device, over the cap) is an error.
pub fn read_files_out(
    workdir: &Path,
    names: &[String],
    cap: u64,
) -> Result<BTreeMap<String, Vec<u8>>, BeneathError> {
    let mut out = BTreeMap::new();
    if names.is_empty() {
        return Ok(out);
    }
    let dir = open_dir(workdir)?;
    for name in names {
        match read_file(&dir, name, cap) {
            Ok(bytes) => {
                out.insert(name.clone(), bytes);
            }
            Err(BeneathError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_fifos_devices_escapes_and_oversize_files_are_refused() {
        let d = tempfile::tempdir().expect("tmp");
        let outside = tempfile::tempdir().expect("tmp");
        std::fs::write(outside.path().join("secret"), "host secret").expect("write");
        std::fs::write(d.path().join("ok"), "fine").expect("write");
        std::fs::create_dir(d.path().join("sub")).expect("mkdir");
        std::fs::write(d.path().join("sub/ok"), "nested").expect("write");
        std::os::unix::fs::symlink(outside.path().join("secret"), d.path().join("link"))
            .expect("symlink");
        std::os::unix::fs::symlink(outside.path(), d.path().join("dirlink")).expect("symlink");
        std::os::unix::fs::symlink("ok", d.path().join("inner-link")).expect("symlink");
        nix::unistd::mkfifo(&d.path().join("fifo"), Mode::S_IRWXU).expect("mkfifo");
        std::fs::write(d.path().join("big"), vec![b'x'; 100]).expect("write");
        let dir = open_dir(d.path()).expect("dir");

        assert_eq!(read_file(&dir, "ok", 10).expect("ok"), b"fine");
        assert_eq!(read_file(&dir, "sub/ok", 10).expect("ok"), b"nested");
        for (name, want) in [
            ("link", "symbolic link"),
            ("dirlink/secret", "symbolic link"),
            ("inner-link", "symbolic link"),
            ("fifo", "FIFO"),
            ("sub", "directory"),
            ("../x", "outside"),
            ("/etc/passwd", "outside"),
            ("big", "over the policy's cap"),
            ("missing", "does not exist"),
        ] {
            let e = read_file(&dir, name, 50).expect_err(name).to_string();
            assert!(e.contains(want), "{name}: {e}");
        }
        // A character device (as root the test can make one where a
        // sandbox might): refused without being read.
        if nix::unistd::geteuid().is_root() {
            let dev = d.path().join("null");
            nix::sys::stat::mknod(
                &dev,
                SFlag::S_IFCHR,
                Mode::S_IRUSR | Mode::S_IWUSR,
                nix::sys::stat::makedev(1, 3),
            )
            .expect("mknod");
            let e = read_file(&dir, "null", 50).expect_err("device").to_string();
            assert!(e.contains("character device"), "{e}");
        }
        let got = read_files_out(d.path(), &["ok".into(), "missing".into()], 10).expect("out");
        assert_eq!(got.keys().collect::<Vec<_>>(), vec!["ok"]);
        assert!(read_files_out(d.path(), &["fifo".into()], 10).is_err());
        // The directory itself must not be a link either.
        assert!(open_dir(&d.path().join("dirlink")).is_err());
        // New files only, never through a link.
        let f = create_beneath(&dir, "new", 0o640).expect("create");
        drop(f);
        assert!(create_beneath(&dir, "new", 0o640).is_err(), "exists");
        assert!(
            create_beneath(&dir, "dirlink/x", 0o640).is_err(),
            "through a link"
        );
        assert!(!outside.path().join("x").exists());
    }

    #[test]
    fn a_private_dir_someone_else_made_or_linked_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().expect("tmp");
        let mine = d.path().join("mine");
        private_dir(&mine, 0o700, false).expect("made");
        private_dir(&mine, 0o700, false).expect("again");
        assert_eq!(
            std::fs::metadata(&mine).expect("meta").permissions().mode() & 0o777,
            0o700
        );
        let open = d.path().join("open");
        std::fs::create_dir(&open).expect("mkdir");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = private_dir(&open, 0o700, false)
            .expect_err("world-writable")
            .to_string();
        assert!(e.contains("writable by it alone"), "{e}");
        assert!(
            private_dir(&open, 0o700, true).is_err(),
            "others may not write, group or not"
        );
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o2770)).expect("chmod");
        assert!(private_dir(&open, 0o700, false).is_err());
        private_dir(&open, 0o770, true).expect("a group-writable volume dir");
        std::os::unix::fs::symlink(&mine, d.path().join("link")).expect("symlink");
        assert!(private_dir(&d.path().join("link"), 0o700, false).is_err());
        if nix::unistd::geteuid().is_root() {
            let theirs = d.path().join("theirs");
            std::fs::create_dir(&theirs).expect("mkdir");
            std::os::unix::fs::chown(&theirs, Some(1234), Some(1234)).expect("chown");
            let e = private_dir(&theirs, 0o700, true)
                .expect_err("not ours")
                .to_string();
            assert!(e.contains("owned by uid 1234"), "{e}");
        }
    }
}
