//! Opening the gateway's SQLite databases (approvals, the lease ledger) the
//! same way: the directory made, a busy timeout so the server and the CLI
//! can share the file, WAL, and the durability each asks for.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

/// `synchronous`: `NORMAL` (durable at checkpoints) or `FULL` (every
/// commit on disk before it returns).
pub fn open(path: &Path, synchronous: &str) -> rusqlite::Result<Connection> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let _ = std::fs::create_dir_all(dir);
    }
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", synchronous)?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(conn)
}
