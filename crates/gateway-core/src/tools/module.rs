//! A Terraform module as the gateway handles it: hostile code in a
//! directory the agent can change at any moment.
//!
//! - The module dir is resolved once per call, beneath the workspace, with
//!   no symlink followed anywhere on the way ([`ModuleDir::open`]); every
//!   later access goes through the directory descriptor opened then, so a
//!   dir swapped for a link afterwards is never entered.
//! - No sandbox ever gets the module dir itself. Each gets a size-limited
//!   copy ([`ModuleDir::copy_to`]) of its regular files and directories,
//!   without `.terraform/`, `terraform.d/` (a module-local provider dir),
//!   `.gateway/` and `.git/`; a symlink, FIFO, device or socket in the
//!   module is a refusal.
//! - After an approved apply the gateway writes back exactly the state
//!   files, checked to be Terraform state of the same lineage
//!   ([`check_state`], [`ModuleDir::write_state`]); everything else the
//!   sandbox wrote is discarded with its copy.
//! - One call at a time works on a module ([`ModuleDir::lock`], an `flock`
//!   shared by every gateway process using the same home).

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::stat::{Mode, fstat};

use super::ToolError;
use gateway_sandbox::beneath::{self, BeneathError};

/// The state files an apply may change, and nothing else.
pub const STATE_FILES: [&str; 2] = ["terraform.tfstate", "terraform.tfstate.backup"];

/// Names never copied into a sandbox, at any depth: Terraform's own
/// install dir, a module-local provider dir, the gateway's plan dir, git.
pub const SKIPPED: [&str; 4] = [".terraform", "terraform.d", ".gateway", ".git"];

/// Most resource instances a state may have for the gateway to check it,
/// and the longest address part (a hostile state could otherwise make the
/// addresses the gateway builds cost far more than the file).
const MAX_STATE_INSTANCES: usize = 200_000;
const MAX_ADDRESS_BYTES: usize = 4096;

/// How deep a module's directories may nest.
const MAX_DEPTH: usize = 32;

/// Caps on one copy of a module (from the decision's sandbox limits).
#[derive(Debug, Clone, Copy)]
pub struct CopyCaps {
    pub bytes: u64,
    pub files: u64,
}

/// What a copy held.
#[derive(Debug, Clone, Default)]
pub struct Copied {
    pub bytes: u64,
    pub files: u64,
}

/// A module dir, opened once.
#[derive(Debug)]
pub struct ModuleDir {
    /// The agent's `working_dir`, as the policy saw it.
    pub working_dir: String,
    /// Where it is (for messages and the lock's name).
    pub path: PathBuf,
    fd: OwnedFd,
    uid: u32,
    gid: u32,
}

fn refusal(working_dir: &str, e: BeneathError) -> ToolError {
    ToolError::Module(format!("working_dir {working_dir:?}: {e}"))
}

impl ModuleDir {
    /// Open `working_dir` beneath `workspace` (a directory the operator
    /// configured), following no link on the way.
    pub fn open(workspace: &Path, working_dir: &str) -> Result<ModuleDir, ToolError> {
        ModuleDir::open_owned(workspace, working_dir, None)
    }

    /// [`ModuleDir::open`], and the workspace and module dir as opened must
    /// belong to `owner` (the daemon's caller): a workspace swapped for a
    /// link to someone else's repository after the session was admitted is
    /// refused, whatever the path resolved to.
    pub fn open_owned(
        workspace: &Path,
        working_dir: &str,
        owner: Option<u32>,
    ) -> Result<ModuleDir, ToolError> {
        let rel = Path::new(working_dir);
        if working_dir.is_empty()
            || rel.is_absolute()
            || rel.components().any(|c| !matches!(c, Component::Normal(_)))
        {
            return Err(ToolError::OutsideWorkspace(working_dir.into()));
        }
        let root = std::fs::canonicalize(workspace).map_err(|source| ToolError::Io {
            what: format!("workspace {}", workspace.display()),
            source,
        })?;
        let root_fd = beneath::open_dir(&root).map_err(|e| refusal(working_dir, e))?;
        let not_theirs = |what: &str, uid: u32, want: u32| {
            ToolError::Module(format!(
                "{what} belongs to uid {uid}, not to the caller (uid {want}): a session works only in the caller's own workspace"
            ))
        };
        if let Some(want) = owner {
            let st = fstat(&root_fd).map_err(|e| ToolError::Io {
                what: format!("workspace {}", root.display()),
                source: e.into(),
            })?;
            if st.st_uid != want {
                return Err(not_theirs(
                    &format!("workspace {}", root.display()),
                    st.st_uid,
                    want,
                ));
            }
        }
        let fd = beneath::open_beneath(&root_fd, working_dir, OFlag::O_DIRECTORY | OFlag::O_RDONLY)
            .map_err(|e| match e {
                BeneathError::Escapes { .. } => ToolError::OutsideWorkspace(working_dir.into()),
                // O_DIRECTORY|O_NOFOLLOW on a link says "not a directory": say
                // what it really is.
                BeneathError::Io { .. } => match beneath::stat_beneath(&root_fd, working_dir) {
                    Ok(st) => ToolError::Module(format!(
                        "working_dir {working_dir:?} is a {}, not a directory",
                        beneath::kind_of(&st)
                    )),
                    Err(e2) => refusal(working_dir, e2),
                },
                e => refusal(working_dir, e),
            })?;
        let st = fstat(&fd).map_err(|e| ToolError::Io {
            what: format!("working_dir {working_dir}"),
            source: e.into(),
        })?;
        if let Some(want) = owner
            && st.st_uid != want
        {
            return Err(not_theirs(
                &format!("working_dir {working_dir}"),
                st.st_uid,
                want,
            ));
        }
        Ok(ModuleDir {
            working_dir: working_dir.into(),
            path: root.join(rel),
            fd,
            uid: st.st_uid,
            gid: st.st_gid,
        })
    }

    /// Copy the module's regular files and directories into `dest` (an
    /// empty directory), within `caps`.
    pub fn copy_to(&self, dest: &Path, caps: CopyCaps) -> Result<Copied, ToolError> {
        let mut done = Copied::default();
        let fd = nix::unistd::dup(&self.fd).map_err(|e| ToolError::Io {
            what: "working_dir".into(),
            source: e.into(),
        })?;
        let dest_fd = beneath::open_dir(dest).map_err(|e| ToolError::Module(e.to_string()))?;
        self.copy_dir(fd, dest_fd, "", caps, &mut done, 0)?;
        Ok(done)
    }

    /// Copy the directory `fd` into the directory `dest` (both by fd:
    /// nothing is resolved by path, so nothing swapped in on either side
    /// is followed).
    fn copy_dir(
        &self,
        fd: OwnedFd,
        dest: OwnedFd,
        shown: &str,
        caps: CopyCaps,
        done: &mut Copied,
        depth: usize,
    ) -> Result<(), ToolError> {
        let wd = &self.working_dir;
        if depth > MAX_DEPTH {
            return Err(ToolError::Module(format!(
                "working_dir {wd:?}: directories nest deeper than {MAX_DEPTH} at {shown}"
            )));
        }
        let io = |what: String| {
            move |e: nix::errno::Errno| ToolError::Io {
                what,
                source: e.into(),
            }
        };
        let too_many = || {
            ToolError::Module(format!(
                "working_dir {wd:?} holds more than the policy's {} files",
                caps.files
            ))
        };
        let dup = nix::unistd::dup(&fd).map_err(io(format!("{wd}/{shown}")))?;
        let mut dir = nix::dir::Dir::from_fd(dup).map_err(io(format!("{wd}/{shown}")))?;
        let mut names: Vec<String> = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(io(format!("{wd}/{shown}")))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            // Counted while listing: a dir of millions of names is refused
            // before it is held in memory.
            if done.files + names.len() as u64 >= caps.files {
                return Err(too_many());
            }
            let Ok(name) = std::str::from_utf8(name) else {
                return Err(ToolError::Module(format!(
                    "working_dir {wd:?}: a file name in {shown:?} is not UTF-8"
                )));
            };
            names.push(name.to_string());
        }
        names.sort();
        for name in names {
            if SKIPPED.contains(&name.as_str()) {
                continue;
            }
            let path = if shown.is_empty() {
                name.clone()
            } else {
                format!("{shown}/{name}")
            };
            let st = beneath::stat_beneath(&fd, &name).map_err(|e| refusal(wd, e))?;
            let kind = beneath::kind_of(&st);
            done.files += 1;
            if done.files > caps.files {
                return Err(too_many());
            }
            // Only what the module's owner owns: the gateway reads as root,
            // and a file moved in from elsewhere may be one the agent could
            // not read itself.
            if st.st_uid != self.uid {
                return Err(ToolError::Module(format!(
                    "working_dir {wd:?}: {path} is owned by uid {}, not by the module's owner (uid {})",
                    st.st_uid, self.uid
                )));
            }
            let write_err = |e: BeneathError| ToolError::Io {
                what: format!("copying {path}"),
                source: std::io::Error::other(e.to_string()),
            };
            match kind {
                "directory" => {
                    let sub =
                        beneath::open_beneath(&fd, &name, OFlag::O_DIRECTORY | OFlag::O_RDONLY)
                            .map_err(|e| refusal(wd, e))?;
                    nix::sys::stat::mkdirat(&dest, name.as_str(), Mode::from_bits_truncate(0o755))
                        .map_err(io(format!("copying {path}")))?;
                    let sub_dest =
                        beneath::open_beneath(&dest, &name, OFlag::O_DIRECTORY | OFlag::O_RDONLY)
                            .map_err(write_err)?;
                    self.copy_dir(sub, sub_dest, &path, caps, done, depth + 1)?;
                }
                // A file with other names may be one the agent could not
                // read itself (the gateway reads as root): refused.
                "regular file" if st.st_nlink > 1 => {
                    return Err(ToolError::Module(format!(
                        "working_dir {wd:?}: {path} is a hard link ({} names); a module may hold only files of its own",
                        st.st_nlink
                    )));
                }
                "regular file" => {
                    let room = caps.bytes.saturating_sub(done.bytes);
                    let bytes = match beneath::read_file_stat(&fd, &name, room) {
                        // The checks again, on the file that was read (it
                        // may have been swapped since the first stat).
                        Ok((_, read)) if read.st_uid != self.uid || read.st_nlink > 1 => {
                            return Err(ToolError::Module(format!(
                                "working_dir {wd:?}: {path} changed while it was copied (now owned by uid {}, {} names)",
                                read.st_uid, read.st_nlink
                            )));
                        }
                        Ok((b, _)) => b,
                        Err(BeneathError::TooLarge { .. }) => {
                            return Err(ToolError::Module(format!(
                                "working_dir {wd:?} is larger than the policy's {} bytes (at {path})",
                                caps.bytes
                            )));
                        }
                        Err(e) => return Err(refusal(wd, e)),
                    };
                    done.bytes += bytes.len() as u64;
                    // The file's execute bits are kept (scripts a module
                    // runs); set-id, sticky and group/other write are not.
                    let out = beneath::create_beneath(&dest, &name, st.st_mode & 0o755 | 0o400)
                        .map_err(write_err)?;
                    File::from(out)
                        .write_all(&bytes)
                        .map_err(|source| ToolError::Io {
                            what: format!("copying {path}"),
                            source,
                        })?;
                }
                other => {
                    return Err(ToolError::Module(format!(
                        "working_dir {wd:?}: {path} is a {other}; a module may hold only regular files and directories"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The module's current state file, if it has one (checked like a file
    /// a sandbox left: the agent can make it anything).
    pub fn read_state(&self, cap: u64) -> Result<Option<Vec<u8>>, ToolError> {
        match beneath::read_file(&self.fd, STATE_FILES[0], cap) {
            Ok(b) => Ok(Some(b)),
            Err(BeneathError::NotFound { .. }) => Ok(None),
            Err(e) => Err(refusal(&self.working_dir, e)),
        }
    }

    /// Replace state file `name` in the module dir with `bytes`: written
    /// to a new file beside it, synced, owned like the module dir, then
    /// renamed over it (a link there is replaced, never followed).
    pub fn write_state(&self, name: &str, bytes: &[u8]) -> Result<(), ToolError> {
        if !STATE_FILES.contains(&name) {
            return Err(ToolError::Module(format!("{name} is not a state file")));
        }
        let io = |source: std::io::Error| ToolError::Io {
            what: format!("writing {}/{name}", self.working_dir),
            source,
        };
        let tmp = format!(".{name}.gateway-{}", uuid::Uuid::new_v4().simple());
        let fd = beneath::open_beneath(
            &self.fd,
            &tmp,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
        )
        .map_err(|e| refusal(&self.working_dir, e))?;
        let written = (|| {
            nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(0o600))
                .map_err(std::io::Error::from)?;
            nix::unistd::fchown(
                &fd,
                Some(nix::unistd::Uid::from_raw(self.uid)),
                Some(nix::unistd::Gid::from_raw(self.gid)),
            )
            .map_err(std::io::Error::from)?;
            let mut f = File::from(fd);
            f.write_all(bytes)?;
            f.sync_all()?;
            nix::fcntl::renameat(&self.fd, tmp.as_str(), &self.fd, name)
                .map_err(std::io::Error::from)?;
            nix::unistd::fsync(&self.fd).map_err(std::io::Error::from)
        })();
        if written.is_err() {
            let _ = nix::unistd::unlinkat(
                &self.fd,
                tmp.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        }
        written.map_err(io)
    }

    /// Take the module's lock (one call at a time per module, across every
    /// gateway process sharing `locks_dir`), waiting at most `wait`.
    /// Blocking: call from a blocking thread.
    pub fn lock(&self, locks_dir: &Path, wait: Duration) -> Result<ModuleLock, ToolError> {
        let st = fstat(&self.fd).map_err(|e| ToolError::Io {
            what: format!("working_dir {}", self.working_dir),
            source: e.into(),
        })?;
        std::fs::create_dir_all(locks_dir).map_err(|source| ToolError::Io {
            what: format!("lock dir {}", locks_dir.display()),
            source,
        })?;
        // The module by its inode (two names for one dir share a lock) and
        // by its name (a dir renamed aside and replaced by a copy is still
        // the same module to the policy and its infrastructure).
        let started = Instant::now();
        let by_inode = self.lock_file(
            &locks_dir.join(format!("module-{}-{}.lock", st.st_dev, st.st_ino)),
            started,
            wait,
        )?;
        let name_key = gateway_base::canonical::sha256_hex(self.working_dir.as_bytes());
        let by_name = self.lock_file(
            &locks_dir.join(format!("module-name-{}.lock", &name_key[..32])),
            started,
            wait,
        )?;
        Ok(ModuleLock(by_inode, by_name))
    }

    fn lock_file(
        &self,
        file: &Path,
        started: Instant,
        wait: Duration,
    ) -> Result<Flock<File>, ToolError> {
        loop {
            use std::os::unix::fs::OpenOptionsExt;
            let f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(file)
                .map_err(|source| ToolError::Io {
                    what: format!("lock {}", file.display()),
                    source,
                })?;
            match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                Ok(l) => return Ok(l),
                Err((_, nix::errno::Errno::EWOULDBLOCK)) if started.elapsed() < wait => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                    return Err(ToolError::Busy(format!(
                        "working_dir {:?} is in use by another call (waited {} s); try again when it has finished",
                        self.working_dir,
                        wait.as_secs()
                    )));
                }
                Err((_, e)) => {
                    return Err(ToolError::Io {
                        what: format!("lock {}", file.display()),
                        source: e.into(),
                    });
                }
            }
        }
    }

    /// The directory descriptor (for reading beneath it).
    pub fn fd(&self) -> impl AsFd + '_ {
        &self.fd
    }
}

/// Held while a call works on a module; released when dropped.
#[derive(Debug)]
pub struct ModuleLock(
    #[allow(dead_code)] Flock<File>,
    #[allow(dead_code)] Flock<File>,
);

/// The parts of a Terraform state the gateway checks and reports.
#[derive(Debug, Clone, PartialEq)]
pub struct StateFacts {
    pub lineage: String,
    pub serial: u64,
    /// Managed and data resource instance addresses, sorted.
    pub addresses: Vec<String>,
    /// Each instance's `id` attribute, where it has one (a replaced
    /// instance keeps its address and gets a new id).
    pub ids: std::collections::BTreeMap<String, String>,
}

/// The fields of a state file the gateway reads; everything else is
/// skipped while parsing, never held in memory (a state can be large, and
/// the agent can write the module's).
#[derive(serde::Deserialize)]
struct RawState {
    version: Option<u64>,
    lineage: Option<String>,
    serial: Option<u64>,
    resources: Option<Vec<RawResource>>,
}

#[derive(serde::Deserialize)]
struct RawResource {
    #[serde(default)]
    module: String,
    #[serde(default)]
    mode: String,
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    instances: Vec<RawInstance>,
}

#[derive(serde::Deserialize)]
struct RawInstance {
    #[serde(default)]
    index_key: Scalar,
    attributes: Option<RawAttributes>,
}

#[derive(serde::Deserialize)]
struct RawAttributes {
    #[serde(default)]
    id: Scalar,
}

/// A string or a whole number, kept; any other JSON value, skipped as it
/// is parsed (an `id` or `index_key` can be anything in a hostile state).
#[derive(Default)]
enum Scalar {
    Str(String),
    Num(u64),
    #[default]
    Other,
}

impl<'de> serde::Deserialize<'de> for Scalar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Scalar, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar::Str(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar::Num(v))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Scalar, E> {
                Ok(Scalar::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Scalar, E> {
                Ok(Scalar::Other)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Scalar, E> {
                Ok(Scalar::Other)
            }
            fn visit_unit<E>(self) -> Result<Scalar, E> {
                Ok(Scalar::Other)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Scalar, A::Error> {
                while a.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Scalar, A::Error> {
                while a
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(Scalar::Other)
            }
        }
        d.deserialize_any(V)
    }
}

/// Check that `bytes` are a Terraform state (format version 4): an object
/// with `version`, `lineage`, `serial` and a `resources` list.
pub fn check_state(bytes: &[u8]) -> Result<StateFacts, String> {
    let raw: RawState =
        serde_json::from_slice(bytes).map_err(|e| format!("not a Terraform state: {e}"))?;
    if raw.version != Some(4) {
        return Err("not a Terraform state (version 4)".into());
    }
    let lineage = raw
        .lineage
        .filter(|l| !l.is_empty())
        .ok_or("the state has no lineage")?;
    let serial = raw.serial.ok_or("the state has no serial")?;
    let resources = raw.resources.ok_or("the state has no resources list")?;
    let instances: usize = resources.iter().map(|r| r.instances.len()).sum();
    if instances > MAX_STATE_INSTANCES {
        return Err(format!(
            "the state has {instances} resource instances, more than the {MAX_STATE_INSTANCES} the gateway checks"
        ));
    }
    if resources
        .iter()
        .any(|r| r.module.len() + r.kind.len() + r.name.len() > MAX_ADDRESS_BYTES)
    {
        return Err(format!(
            "the state names a resource longer than {MAX_ADDRESS_BYTES} bytes"
        ));
    }
    let mut addresses = Vec::new();
    let mut ids = std::collections::BTreeMap::new();
    for r in resources {
        let mut base = String::new();
        if !r.module.is_empty() {
            base.push_str(&r.module);
            base.push('.');
        }
        if r.mode == "data" {
            base.push_str("data.");
        }
        base.push_str(&format!("{}.{}", r.kind, r.name));
        for i in r.instances {
            let addr = match i.index_key {
                Scalar::Str(k) => format!("{base}[{k:?}]"),
                Scalar::Num(n) => format!("{base}[{n}]"),
                Scalar::Other => base.clone(),
            };
            if let Some(Scalar::Str(id)) = i.attributes.map(|a| a.id) {
                ids.insert(addr.clone(), id);
            }
            addresses.push(addr);
        }
    }
    addresses.sort();
    Ok(StateFacts {
        lineage,
        serial,
        addresses,
        ids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> CopyCaps {
        CopyCaps {
            bytes: 1 << 20,
            files: 100,
        }
    }

    #[test]
    fn a_copy_holds_only_the_modules_regular_files_and_dirs() {
        let ws = tempfile::tempdir().expect("ws");
        let m = ws.path().join("mods/m");
        std::fs::create_dir_all(m.join("sub")).expect("mkdir");
        std::fs::create_dir_all(m.join("terraform.d/plugins/x")).expect("mkdir");
        std::fs::create_dir_all(m.join(".terraform/providers")).expect("mkdir");
        std::fs::write(m.join("main.tf"), "# main").expect("write");
        std::fs::write(m.join("sub/x.tf"), "# x").expect("write");
        std::fs::write(m.join("terraform.d/plugins/x/p"), "evil").expect("write");
        std::fs::write(m.join(".terraform/providers/p"), "evil").expect("write");
        let dest = tempfile::tempdir().expect("dest");
        let md = ModuleDir::open(ws.path(), "mods/m").expect("open");
        let c = md.copy_to(dest.path(), caps()).expect("copy");
        assert_eq!((c.files, c.bytes), (3, 9));
        assert!(dest.path().join("main.tf").is_file());
        assert!(dest.path().join("sub/x.tf").is_file());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(dest.path().join("main.tf"))
                .expect("meta")
                .permissions()
                .mode()
                & 0o7777,
            0o644
        );
        // A script keeps its execute bits; set-id and other-write go.
        std::fs::write(m.join("run.sh"), "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(m.join("run.sh"), std::fs::Permissions::from_mode(0o4777))
            .expect("chmod");
        let dest2 = tempfile::tempdir().expect("dest");
        md.copy_to(dest2.path(), caps()).expect("copy");
        assert_eq!(
            std::fs::metadata(dest2.path().join("run.sh"))
                .expect("meta")
                .permissions()
                .mode()
                & 0o7777,
            0o755
        );
        std::fs::remove_file(m.join("run.sh")).expect("rm");
        assert!(!dest.path().join("terraform.d").exists());
        assert!(!dest.path().join(".terraform").exists());

        // Over the caps.
        let small = CopyCaps {
            bytes: 5,
            files: 100,
        };
        let e = md
            .copy_to(tempfile::tempdir().expect("d").path(), small)
            .expect_err("big");
        assert!(
            e.to_string().contains("larger than the policy's 5 bytes"),
            "{e}"
        );
        let few = CopyCaps {
            bytes: 1 << 20,
            files: 2,
        };
        let e = md
            .copy_to(tempfile::tempdir().expect("d").path(), few)
            .expect_err("many");
        assert!(
            e.to_string().contains("more than the policy's 2 files"),
            "{e}"
        );

        // A link inside the module, to a host file: refused, not followed.
        std::os::unix::fs::symlink("/etc/passwd", m.join("passwd.tf")).expect("symlink");
        let e = md
            .copy_to(tempfile::tempdir().expect("d").path(), caps())
            .expect_err("link");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        std::fs::remove_file(m.join("passwd.tf")).expect("rm");
        // A hard link to a file outside the module: refused, not read.
        let outside = tempfile::tempdir().expect("outside");
        std::fs::write(outside.path().join("secret"), "root only").expect("write");
        std::fs::hard_link(outside.path().join("secret"), m.join("secret.tf")).expect("link");
        let e = md
            .copy_to(tempfile::tempdir().expect("d").path(), caps())
            .expect_err("hard link");
        assert!(e.to_string().contains("hard link"), "{e}");
        std::fs::remove_file(m.join("secret.tf")).expect("rm");
        // A file someone else owns, moved into the module: refused.
        if nix::unistd::geteuid().is_root() {
            std::fs::write(m.join("theirs.tf"), "x").expect("write");
            std::os::unix::fs::chown(m.join("theirs.tf"), Some(4321), None).expect("chown");
            let e = md
                .copy_to(tempfile::tempdir().expect("d").path(), caps())
                .expect_err("owner");
            assert!(e.to_string().contains("owned by uid 4321"), "{e}");
            std::fs::remove_file(m.join("theirs.tf")).expect("rm");
        }
        nix::unistd::mkfifo(&m.join("fifo"), Mode::S_IRWXU).expect("fifo");
        let e = md
            .copy_to(tempfile::tempdir().expect("d").path(), caps())
            .expect_err("fifo");
        assert!(e.to_string().contains("FIFO"), "{e}");
    }

    #[test]
    fn a_module_dir_reached_through_a_link_is_refused() {
        let ws = tempfile::tempdir().expect("ws");
        std::fs::create_dir_all(ws.path().join("a")).expect("mkdir");
        std::os::unix::fs::symlink("a", ws.path().join("b")).expect("symlink");
        std::fs::create_dir_all(ws.path().join("c")).expect("mkdir");
        std::os::unix::fs::symlink("../a", ws.path().join("c/d")).expect("symlink");
        assert!(ModuleDir::open(ws.path(), "a").is_ok());
        for bad in ["b", "c/d", "../a", "/etc", "a/../a", ""] {
            assert!(ModuleDir::open(ws.path(), bad).is_err(), "{bad}");
        }
        let e = ModuleDir::open(ws.path(), "b")
            .expect_err("link")
            .to_string();
        assert!(e.contains("symbolic link"), "{e}");
        // Opened once: a swap afterwards does not move the call.
        let md = ModuleDir::open(ws.path(), "a").expect("open");
        std::fs::write(ws.path().join("a/main.tf"), "# a").expect("write");
        std::fs::rename(ws.path().join("a"), ws.path().join("a-old")).expect("mv");
        std::os::unix::fs::symlink("c", ws.path().join("a")).expect("symlink");
        let dest = tempfile::tempdir().expect("dest");
        md.copy_to(dest.path(), caps()).expect("copy");
        assert!(dest.path().join("main.tf").is_file());
    }

    #[test]
    fn state_is_written_back_by_rename_and_a_link_in_its_place_is_replaced() {
        let ws = tempfile::tempdir().expect("ws");
        let outside = tempfile::tempdir().expect("outside");
        std::fs::create_dir_all(ws.path().join("m")).expect("mkdir");
        std::fs::write(outside.path().join("victim"), "keep").expect("write");
        std::os::unix::fs::symlink(
            outside.path().join("victim"),
            ws.path().join("m/terraform.tfstate"),
        )
        .expect("symlink");
        let md = ModuleDir::open(ws.path(), "m").expect("open");
        assert!(
            md.read_state(1 << 20).is_err(),
            "a linked state is not read"
        );
        md.write_state("terraform.tfstate", b"{}").expect("write");
        assert_eq!(
            std::fs::read(outside.path().join("victim")).expect("r"),
            b"keep"
        );
        assert_eq!(
            std::fs::read(ws.path().join("m/terraform.tfstate")).expect("r"),
            b"{}"
        );
        assert!(md.write_state("main.tf", b"x").is_err());
    }

    #[test]
    fn only_terraform_state_passes_the_check() {
        let ok = br#"{"version":4,"terraform_version":"1.15.5","serial":3,"lineage":"l-1","outputs":{},
            "resources":[{"mode":"managed","type":"terraform_data","name":"a","instances":[{"attributes":{"id":"i-1"}}]},
                         {"module":"module.m","mode":"data","type":"x","name":"b","instances":[{"index_key":0},{"index_key":"k"}]}]}"#;
        let f = check_state(ok).expect("state");
        assert_eq!(f.lineage, "l-1");
        assert_eq!(f.serial, 3);
        assert_eq!(
            f.addresses,
            vec![
                "module.m.data.x.b[\"k\"]".to_string(),
                "module.m.data.x.b[0]".to_string(),
                "terraform_data.a".to_string()
            ]
        );
        assert_eq!(
            f.ids.get("terraform_data.a").map(String::as_str),
            Some("i-1")
        );
        for bad in [
            &b"not json"[..],
            b"{}",
            br#"{"version":4}"#,
            br#"{"version":3,"lineage":"x","serial":1,"resources":[]}"#,
        ] {
            assert!(check_state(bad).is_err());
        }
    }

    #[test]
    fn a_second_call_on_a_busy_module_waits_then_is_refused() {
        let ws = tempfile::tempdir().expect("ws");
        std::fs::create_dir_all(ws.path().join("m")).expect("mkdir");
        let locks = tempfile::tempdir().expect("locks");
        let a = ModuleDir::open(ws.path(), "m").expect("open");
        let b = ModuleDir::open(ws.path(), "m").expect("open");
        let held = a.lock(locks.path(), Duration::ZERO).expect("lock");
        let e = b
            .lock(locks.path(), Duration::from_millis(250))
            .expect_err("busy");
        assert!(e.to_string().contains("in use by another call"), "{e}");
        drop(held);
        b.lock(locks.path(), Duration::ZERO).expect("free again");
    }
}
