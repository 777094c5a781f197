//! `[store]`: where approvals are kept. SQLite under the home (the
//! default: one host) or a PostgreSQL database that the replicas of a team
//! gateway share. The connection string, which may hold a password, is
//! read from a file only the daemon's user can read, never from the
//! configuration itself.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `sqlite` (the default) or `postgres`.
    pub backend: Option<String>,
    /// `postgres`: a file holding the connection string (libpq keywords or
    /// a `postgresql://` URL), mode 0600 and owned by the daemon's user.
    pub url_file: Option<PathBuf>,
    /// `postgres`: a PEM file of CA certificates the server's TLS
    /// certificate is checked against, beside the system's.
    pub ca_file: Option<PathBuf>,
    /// `postgres`: how many connections a replica keeps to the database at
    /// most (1 to 256; default 8), shared by its approvals, plans, leases
    /// and audit chain. LISTEN and the replica's presence lock have one
    /// each besides.
    pub pool_size: Option<usize>,
    /// `postgres`: how long a call waits for a connection when all are in
    /// use before it fails, with that reason (1 to 300 s; default 5).
    pub pool_wait_secs: Option<u64>,
}

/// Which store to open.
#[derive(Debug)]
pub enum Store {
    Sqlite,
    Postgres {
        /// The connection string (zeroed when dropped; never shown).
        url: Zeroizing<String>,
        ca_file: Option<PathBuf>,
        pool: gateway_store::postgres::PoolSettings,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum StoreConfigError {
    #[error("[store] backend is {0:?}: it is \"sqlite\" or \"postgres\"")]
    Backend(String),
    #[error("[store] backend = \"postgres\" needs url_file: the file with the connection string")]
    NoUrl,
    #[error("[store] url_file {path}: {message}")]
    UrlFile { path: PathBuf, message: String },
    #[error("[store] {0}")]
    Pool(String),
}

impl StoreConfig {
    /// The store the settings name, its connection string read and checked
    /// (a file its owner alone reads).
    pub fn resolve(&self) -> Result<Store, StoreConfigError> {
        self.resolve_in(&SecretVolumes::default())
    }

    /// [`StoreConfig::resolve`], where the connection string may also be a
    /// Secret volume's file (see [`check_secret_file`]).
    pub fn resolve_in(&self, volumes: &SecretVolumes) -> Result<Store, StoreConfigError> {
        match self.backend.as_deref().unwrap_or("sqlite") {
            "sqlite" => Ok(Store::Sqlite),
            "postgres" => {
                let path = self.url_file.clone().ok_or(StoreConfigError::NoUrl)?;
                let bad = |message: String| StoreConfigError::UrlFile {
                    path: path.clone(),
                    message,
                };
                let text = read_secret_file(&path, volumes).map_err(bad)?;
                let url = Zeroizing::new(text.trim().to_string());
                if url.is_empty() {
                    return Err(bad("empty".into()));
                }
                Ok(Store::Postgres {
                    url,
                    ca_file: self.ca_file.clone(),
                    pool: self.pool()?,
                })
            }
            other => Err(StoreConfigError::Backend(other.to_string())),
        }
    }
}

impl StoreConfig {
    /// The pool's bounds, defaults filled in and checked.
    fn pool(&self) -> Result<gateway_store::postgres::PoolSettings, StoreConfigError> {
        let default = gateway_store::postgres::PoolSettings::DEFAULT;
        let size = self.pool_size.unwrap_or(default.size);
        if !(1..=256).contains(&size) {
            return Err(StoreConfigError::Pool(format!(
                "pool_size is {size}: it is 1 to 256 connections"
            )));
        }
        let wait = self.pool_wait_secs.unwrap_or(default.wait.as_secs());
        if !(1..=300).contains(&wait) {
            return Err(StoreConfigError::Pool(format!(
                "pool_wait_secs is {wait}: it is 1 to 300 seconds"
            )));
        }
        Ok(gateway_store::postgres::PoolSettings {
            size,
            wait: std::time::Duration::from_secs(wait),
        })
    }
}

/// Read a file holding a secret: opened once, not through a link, judged
/// by what was opened ([`check_secret_file`]; no window between the check
/// and the read), at most 64 KiB.
pub fn read_secret_file(path: &Path, volumes: &SecretVolumes) -> Result<Zeroizing<String>, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| format!("{e} (a symbolic link is not followed)"))?;
    let meta = f.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    check_secret_file(&f, &meta, volumes)?;
    let mut text = Zeroizing::new(String::new());
    f.take(64 * 1024)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    Ok(text)
}

/// Where a Secret volume's files may be read by a group: the daemon's
/// pod's read-only volumes (`[daemon] read_only_volumes`), and the group
/// that must never be it (the socket's, the agents').
#[derive(Debug, Clone, Default)]
pub struct SecretVolumes {
    pub read_only: Vec<PathBuf>,
    pub not_group: Option<String>,
}

/// Who may read a file holding a password: its owner alone, and the
/// owner is this process's user. Or, only on one of the pod's read-only
/// volumes (a Kubernetes Secret, which the kubelet leaves root's, mode
/// 0440, group the pod's fsGroup), for a daemon that is not root: root
/// owns it and only a group of this process's, never the socket's, may
/// read it too. Nobody else may read it, and nobody but its owner write it.
pub fn check_secret_file(
    file: &std::fs::File,
    meta: &std::fs::Metadata,
    volumes: &SecretVolumes,
) -> Result<(), String> {
    let mode = meta.mode() & 0o777;
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() == me && mode & 0o077 == 0 {
        return Ok(());
    }
    let mine = nix::unistd::getegid().as_raw() == meta.gid()
        || nix::unistd::getgroups().is_ok_and(|g| g.iter().any(|g| g.as_raw() == meta.gid()));
    // The socket's group must be known to be another (an unknown one
    // could be this file's).
    let not_the_socket_group = match volumes.not_group.as_deref() {
        None => true,
        Some(n) => nix::unistd::Group::from_name(n)
            .ok()
            .flatten()
            .is_some_and(|g| g.gid.as_raw() != meta.gid()),
    };
    // Judged by the opened file itself: on a read-only file system, the
    // same one as a declared volume's (no path is looked up again).
    let on_volume = nix::sys::statvfs::fstatvfs(file)
        .is_ok_and(|s| s.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
        && volumes
            .read_only
            .iter()
            .any(|v| std::fs::metadata(v).is_ok_and(|v| v.dev() == meta.dev()));
    if meta.uid() == 0 && me != 0 && mine && on_volume && not_the_socket_group && mode & 0o037 == 0
    {
        return Ok(());
    }
    if meta.uid() != me && meta.uid() != 0 {
        return Err(format!(
            "owned by uid {}, not by this process's user (uid {me}) or root",
            meta.uid()
        ));
    }
    Err(format!(
        "its mode is {mode:o}: it may hold a password, so no one but its owner may read it (chmod 600)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_connection_string_comes_only_from_a_file_its_owner_alone_reads() {
        let dir = tempfile::tempdir().expect("tmp");
        let file = dir.path().join("pg.url");
        std::fs::write(&file, "postgresql://gw:s3cret-pw@db.internal/gateway\n").expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let c = StoreConfig {
            backend: Some("postgres".into()),
            url_file: Some(file.clone()),
            ca_file: None,
            pool_size: None,
            pool_wait_secs: None,
        };
        let e = c.resolve().expect_err("readable by others");
        assert!(e.to_string().contains("chmod 600"), "{e}");
        assert!(!e.to_string().contains("s3cret"), "{e}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        match c.resolve().expect("0600") {
            Store::Postgres { url, .. } => {
                assert_eq!(
                    url.as_str(),
                    "postgresql://gw:s3cret-pw@db.internal/gateway"
                )
            }
            Store::Sqlite => panic!("postgres expected"),
        }
        // A link (to a file someone else chose) is not followed.
        let link = dir.path().join("link.url");
        std::os::unix::fs::symlink(&file, &link).expect("symlink");
        let e = StoreConfig {
            backend: Some("postgres".into()),
            url_file: Some(link),
            ca_file: None,
            ..StoreConfig::default()
        }
        .resolve()
        .expect_err("a symlink");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(matches!(
            StoreConfig {
                backend: Some("postgres".into()),
                url_file: None,
                ..StoreConfig::default()
            }
            .resolve(),
            Err(StoreConfigError::NoUrl)
        ));
        assert!(matches!(
            StoreConfig {
                backend: Some("mysql".into()),
                url_file: None,
                ..StoreConfig::default()
            }
            .resolve(),
            Err(StoreConfigError::Backend(_))
        ));
        assert!(matches!(
            StoreConfig::default().resolve(),
            Ok(Store::Sqlite)
        ));
        // The pool's bounds: defaults, and a size or wait out of range
        // refused with the setting's name.
        match c.resolve().expect("0600") {
            Store::Postgres { pool, .. } => {
                assert_eq!(pool, gateway_store::postgres::PoolSettings::DEFAULT)
            }
            Store::Sqlite => panic!("postgres expected"),
        }
        for (size, wait, named) in [
            (Some(0), None, "pool_size"),
            (Some(257), None, "pool_size"),
            (None, Some(0), "pool_wait_secs"),
        ] {
            let e = StoreConfig {
                pool_size: size,
                pool_wait_secs: wait,
                ..c.clone()
            }
            .resolve()
            .expect_err("out of range");
            assert!(e.to_string().contains(named), "{e}");
        }
    }
}
