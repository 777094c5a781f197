//! Where saved plans live: HOME/plans/<request id>.tfplan (the binary plan
//! file an approval is bound to, by its SHA-256) and .json (its
//! `terraform show -json`, made from that file by trusted code). The one
//! place their paths are built.

use std::path::{Path, PathBuf};

use super::Stop;

#[derive(Debug, Clone)]
pub struct PlanStore {
    dir: PathBuf,
}

impl PlanStore {
    /// The store under `home`, created if missing.
    pub fn in_home(home: &Path) -> std::io::Result<PlanStore> {
        let dir = home.join("plans");
        std::fs::create_dir_all(&dir)?;
        Ok(PlanStore { dir })
    }

    /// Where the plan file of request `request_id` is (or would be).
    pub fn plan_file_path(&self, request_id: &str) -> PathBuf {
        self.path(request_id, "tfplan")
    }

    fn path(&self, request_id: &str, ext: &str) -> PathBuf {
        self.dir.join(format!("{request_id}.{ext}"))
    }

    /// Save a plan file and its JSON; returns the plan file's path.
    pub fn save(&self, request_id: &str, plan_file: &[u8], json: &[u8]) -> Result<PathBuf, Stop> {
        let saved = self.plan_file_path(request_id);
        std::fs::write(&saved, plan_file)
            .map_err(|e| Stop::refused(format!("saving the plan file: {e}")))?;
        std::fs::write(self.path(request_id, "json"), json)
            .map_err(|e| Stop::refused(format!("saving the plan's JSON: {e}")))?;
        Ok(saved)
    }

    /// The plan file saved by request `request_id`.
    pub fn plan_file(&self, request_id: &str) -> Result<Vec<u8>, Stop> {
        std::fs::read(self.plan_file_path(request_id)).map_err(|_| {
            Stop::refused(format!(
                "the saved plan file of request {request_id} is missing; plan and ask again"
            ))
        })
    }

    /// The plan's JSON saved with it, if it is there.
    pub fn plan_json(&self, request_id: &str) -> Option<Vec<u8>> {
        std::fs::read(self.path(request_id, "json")).ok()
    }
}
