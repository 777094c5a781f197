//! Where saved plans live: HOME/plans/<request id>.tfplan (the binary plan
//! file an approval is bound to, by its SHA-256) and .json (its
//! `terraform show -json`, made from that file by trusted code). The one
//! place their paths are built.
//!
//! Replicas of a team gateway also keep each plan in the database they
//! share ([`PlanStore::shared`]): an apply approved on one replica may run
//! on another, which takes the plan from there (into its own directory)
//! when it does not have it.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::Stop;
use gateway_store::{Db, End};

#[derive(Clone)]
pub struct PlanStore {
    dir: PathBuf,
    shared: Option<std::sync::Arc<dyn Db + Sync>>,
}

impl std::fmt::Debug for PlanStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanStore")
            .field("dir", &self.dir)
            .field("shared", &self.shared.as_ref().map(|d| d.describe()))
            .finish()
    }
}

/// A plan file and its JSON.
type FileAndJson = (Vec<u8>, Vec<u8>);

/// The shared plans' schema (refinery's versions).
pub const SHARED_MIGRATIONS: &[(&str, &str)] = &[(
    "V1__plans",
    "CREATE TABLE plans (
        request_id    TEXT PRIMARY KEY,
        plan_file     BYTEA NOT NULL,
        plan_json     BYTEA NOT NULL,
        created_at_ms BIGINT NOT NULL
    );
    CREATE INDEX plans_created ON plans(created_at_ms);",
)];

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
        Ok(PlanStore { dir, shared: None })
    }

    /// Keep every plan in `db` as well, and take from it a plan this
    /// replica does not have.
    pub fn shared(mut self, db: std::sync::Arc<dyn Db + Sync>) -> PlanStore {
        self.shared = Some(db);
        self
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
        if let Some(db) = &self.shared {
            // A plan only this replica holds could not be applied by
            // another: without the database, no plan.
            db.write(&mut |tx| {
                tx.execute(
                    "INSERT INTO plans (request_id, plan_file, plan_json, created_at_ms)
                     VALUES (?1, ?2, ?3, ?4)",
                    &[
                        request_id.into(),
                        plan_file.into(),
                        json.into(),
                        gateway_audit::approvals::now_ms().into(),
                    ],
                )?;
                Ok(End::Commit)
            })
            .map_err(|e| {
                tracing::warn!(db = %db.describe(), "saving a plan in the shared store: {e}");
                Stop::refused(format!(
                    "saving the plan in the shared store ({}): {e}",
                    db.label()
                ))
            })?;
        }
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
        if let Some(db) = &self.shared {
            let before = gateway_audit::approvals::now_ms()
                .saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX));
            let pruned = db.write(&mut |tx| {
                tx.execute(
                    "DELETE FROM plans WHERE created_at_ms < ?1",
                    &[before.into()],
                )?;
                Ok(End::Commit)
            });
            if let Err(e) = pruned {
                tracing::warn!("could not prune the shared plans: {e}");
            }
        }
        removed
    }

    /// The plan file saved by request `request_id`.
    pub fn plan_file(&self, request_id: &str) -> Result<Vec<u8>, Stop> {
        check_id(request_id)?;
        if let Ok(bytes) = read_regular(&self.plan_file_path(request_id)) {
            return Ok(bytes);
        }
        match self.fetch_shared(request_id) {
            Ok(Some((file, _))) => Ok(file),
            Ok(None) => Err(Stop::refused(format!(
                "the saved plan file of request {request_id} is missing; plan and ask again"
            ))),
            Err(e) => Err(Stop::refused(format!(
                "the saved plan file of request {request_id} is not on this replica, and the shared store cannot be read: {e}"
            ))),
        }
    }

    /// A plan another replica saved: read from the database and kept in
    /// this replica's directory (`None`: no database, or no such plan).
    fn fetch_shared(&self, request_id: &str) -> Result<Option<FileAndJson>, String> {
        let Some(db) = &self.shared else {
            return Ok(None);
        };
        let mut found = None;
        db.read(&mut |tx| {
            found = tx
                .query_opt(
                    "SELECT plan_file, plan_json FROM plans WHERE request_id = ?1",
                    &[request_id.into()],
                )?
                .map(|r| Ok::<_, gateway_store::DbError>((r.bytes(0)?, r.bytes(1)?)))
                .transpose()?;
            Ok(End::Rollback)
        })
        .map_err(|e| {
            tracing::warn!(db = %db.describe(), "reading a plan from the shared store: {e}");
            format!("{} ({})", e, db.label())
        })?;
        if let Some((file, json)) = &found {
            // Kept here too, whole or not at all: written aside, then
            // linked in (a copy a concurrent reader put there first stays).
            for (to, bytes) in [
                (self.plan_file_path(request_id), file),
                (self.path(request_id, "json"), json),
            ] {
                let mut tag = [0u8; 8];
                let _ = getrandom::fill(&mut tag);
                let aside = to.with_extension(format!("fetching-{}", hex::encode(tag)));
                if write_new(&aside, bytes).is_ok() {
                    let _ = std::fs::hard_link(&aside, &to);
                }
                let _ = std::fs::remove_file(&aside);
            }
        }
        Ok(found)
    }

    /// The plan's JSON saved with it, if it is there.
    pub fn plan_json(&self, request_id: &str) -> Option<Vec<u8>> {
        check_id(request_id).ok()?;
        read_regular(&self.path(request_id, "json"))
            .ok()
            .or_else(|| self.fetch_shared(request_id).ok().flatten().map(|(_, j)| j))
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
