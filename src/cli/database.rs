//! One pool of connections to the team's database for the whole process:
//! a replica's approvals, plans, leases, audit chain and audit export take
//! their connections from it, so that `[store] pool_size` bounds the
//! replica's connections, not each store's.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use secrecy::{ExposeSecret, SecretString};

use crate::db::DbError;
use crate::db::postgres::{PoolSettings, PostgresDb};

/// The pools opened so far, by connection string (kept as a secret: never
/// shown), CA file and bounds.
type Pools = Vec<(SecretString, Option<PathBuf>, PoolSettings, PostgresDb)>;

/// The process's pool for `url` (opened, and its database reached, on first
/// use).
pub fn postgres(
    url: &str,
    ca_file: Option<&Path>,
    pool: PoolSettings,
) -> Result<PostgresDb, DbError> {
    static POOLS: Mutex<Pools> = Mutex::new(Vec::new());
    let mut pools = POOLS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((.., db)) = pools
        .iter()
        .find(|(u, c, p, _)| u.expose_secret() == url && c.as_deref() == ca_file && *p == pool)
    {
        return Ok(db.clone());
    }
    let db = PostgresDb::connect_pooled(url, ca_file, pool)?;
    pools.push((
        SecretString::from(url.to_string()),
        ca_file.map(Path::to_path_buf),
        pool,
        db.clone(),
    ));
    Ok(db)
}
