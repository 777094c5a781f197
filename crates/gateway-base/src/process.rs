//! Naming a process so that state it leaves behind (issued leases, sandbox
//! bundles) can be told apart from another live gateway's: its pid and its
//! start time.

/// A process, named so that a reused pid is not mistaken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub pid: u32,
    /// Start time in clock ticks since boot (field 22 of /proc/PID/stat).
    pub start: u64,
}

impl Owner {
    pub fn current() -> Owner {
        let pid = std::process::id();
        Owner {
            pid,
            start: process_start(pid).unwrap_or(0),
        }
    }

    /// Whether this owner is still running (same pid *and* start time: a
    /// reused pid is another process).
    pub fn alive(&self) -> bool {
        process_start(self.pid).is_some_and(|s| s == self.start)
    }
}

fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parens: split after it.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}
