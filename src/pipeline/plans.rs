//! Where saved plans live: HOME/plans/<request id>.tfplan (the binary plan
//! file an approval is bound to, by its SHA-256) and .json (its
//! `terraform show -json`, made from that file by trusted code). The one
//! place their paths are built.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::Stop;

#[derive(Debug, Clone)]
pub struct PlanStore {
    dir: PathBuf,
}

impl PlanStore {
    /// The store under `home`, created if missing (owner only: a plan's
    /// JSON can show values the plan read).
    pub fn in_home(home: &Path) -> std::io::Result<PlanStore> {
        let dir = home.join("plans");
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        Ok(PlanStore { dir })
    }

    /// Where the plan file of request `request_id` is (or would be).
    pub fn plan_file_path(&self, request_id: &str) -> PathBuf {
        self.path(request_id, "tfplan")
    }

    fn path(&self, request_id: &str, ext: &str) -> PathBuf {
        self.dir.join(format!("{request_id}.{ext}"))
    }

    /// Save a plan file and its JSON (new files, no link followed);
    /// returns the plan file's path.
    pub fn save(&self, request_id: &str, plan_file: &[u8], json: &[u8]) -> Result<PathBuf, Stop> {
        check_id(request_id)?;
        let saved = self.plan_file_path(request_id);
        write_new(&saved, plan_file)
            .map_err(|e| Stop::refused(format!("saving the plan file: {e}")))?;
        write_new(&self.path(request_id, "json"), json)
            .map_err(|e| Stop::refused(format!("saving the plan's JSON: {e}")))?;
        Ok(saved)
    }

    /// Remove the saved plans (file and JSON) older than `retention`;
    /// returns how many files went. Anything that is not a plan of ours
    /// is left alone.
    pub fn prune(&self, retention: std::time::Duration) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut removed = 0;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some((id, ext)) = name.rsplit_once('.') else {
                continue;
            };
            if !matches!(ext, "tfplan" | "json") || check_id(id).is_err() {
                continue;
            }
            let old = e
                .metadata()
                .ok()
                .filter(|m| m.is_file())
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > retention);
            if old && std::fs::remove_file(e.path()).is_ok() {
                removed += 1;
            }
        }
        removed
    }

    /// The plan file saved by request `request_id`.
    pub fn plan_file(&self, request_id: &str) -> Result<Vec<u8>, Stop> {
        check_id(request_id)?;
        read_regular(&self.plan_file_path(request_id)).map_err(|_| {
            Stop::refused(format!(
                "the saved plan file of request {request_id} is missing; plan and ask again"
            ))
        })
    }

    /// The plan's JSON saved with it, if it is there.
    pub fn plan_json(&self, request_id: &str) -> Option<Vec<u8>> {
        check_id(request_id).ok()?;
        read_regular(&self.path(request_id, "json")).ok()
    }
}

/// Request ids are `req-` and 32 hex digits; nothing else names a file here.
fn check_id(request_id: &str) -> Result<(), Stop> {
    let ok = request_id
        .strip_prefix("req-")
        .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    if ok {
        Ok(())
    } else {
        Err(Stop::refused(format!(
            "{request_id:?} is not a request id; no saved plan is read or written for it"
        )))
    }
}

fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut out = Vec::new();
    f.read_to_end(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_removes_only_old_plans_of_ours() {
        let home = tempfile::tempdir().expect("home");
        let store = PlanStore::in_home(home.path()).expect("store");
        let id = format!("req-{}", "a".repeat(32));
        store.save(&id, b"plan", b"{}").expect("save");
        std::fs::write(store.dir.join("notes.txt"), "mine").expect("write");
        assert_eq!(store.prune(std::time::Duration::from_secs(3600)), 0);
        assert!(store.plan_file(&id).is_ok());
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(store.prune(std::time::Duration::from_millis(1)), 2);
        assert!(store.plan_file(&id).is_err());
        assert!(store.dir.join("notes.txt").exists());
    }
}
