//! The host's cgroup hierarchy, as the local backend needs it: which
//! version (v1, one mount per controller; v2, one unified tree; hybrid,
//! v1 controllers beside an empty v2 mount), where each controller is
//! mounted, and the reads the sandbox's limits rely on (CPU time used, peak
//! memory and failed charges). Found from `/proc/self/mountinfo`, never by
//! assuming a path: a v1 host may mount `cpu,cpuacct` together, apart, or
//! with or without the symlinks systemd makes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The controllers the local backend's limits need: `memory` (the
/// sandbox's memory ceiling) and `cpu` (its quota); on v1 also `cpuacct`
/// (the CPU time the watch reads; v2's `cpu.stat` always has it).
pub const NEEDED_V1: &[&str] = &["memory", "cpu", "cpuacct"];
pub const NEEDED_V2: &[&str] = &["memory", "cpu"];

/// Where the cgroup filesystem is mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Version {
    /// One mount per controller (or per group of controllers).
    V1,
    /// The unified hierarchy holds the controllers.
    V2,
    /// v1 controllers, and a v2 mount that holds none of them.
    Hybrid,
    /// No cgroup filesystem mounted at all.
    None,
}

#[derive(Debug, Clone)]
pub struct Hierarchy {
    pub version: Version,
    /// v1: controller => its mount point.
    v1: BTreeMap<String, PathBuf>,
    /// v2: the unified mount and the controllers its root offers.
    v2: Option<(PathBuf, Vec<String>)>,
    /// v1 mounts of named hierarchies (`name=systemd`): no controller, but
    /// a cgroup may be left there too.
    named: Vec<PathBuf>,
}

/// mountinfo escapes spaces, tabs, newlines and backslashes as octal;
/// the rest are the path's own bytes.
fn unescape(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Some(v) = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// The controllers this kernel knows (`/proc/cgroups`' first column): a
/// v1 mount's options are these, plus options such as `xattr` or
/// `name=systemd` that name none.
pub fn kernel_controllers(proc_cgroups: &str) -> Vec<String> {
    proc_cgroups
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

impl Hierarchy {
    /// The hierarchy this process sees.
    pub fn detect() -> Hierarchy {
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let known =
            kernel_controllers(&std::fs::read_to_string("/proc/cgroups").unwrap_or_default());
        Hierarchy::from_mountinfo(&text, Path::new(CGROUP_ROOT), &known)
    }

    /// The hierarchy a mountinfo text describes, `root` being where the
    /// cgroup filesystem is expected (`/sys/fs/cgroup`) and `known` the
    /// kernel's controllers. A v2 mount's controllers are read from its
    /// `cgroup.controllers`. As runsc decides it: unified (v2) when `root`
    /// itself is a cgroup2 mount, whatever v1 mounts (a `net_cls` for a
    /// VPN, systemd's named one) sit elsewhere; otherwise v1, or hybrid
    /// when a v2 mount sits beside the v1 controllers.
    pub fn from_mountinfo(text: &str, root: &Path, known: &[String]) -> Hierarchy {
        let mut v1 = BTreeMap::new();
        let mut v2 = None;
        let mut named = Vec::new();
        for line in text.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let Some(sep) = fields.iter().position(|f| *f == "-") else {
                continue;
            };
            let (Some(mount), Some(fstype), Some(opts)) =
                (fields.get(4), fields.get(sep + 1), fields.get(sep + 3))
            else {
                continue;
            };
            let mount = unescape(mount);
            match *fstype {
                "cgroup" => {
                    if opts.split(',').any(|o| o.starts_with("name=")) {
                        named.push(mount.clone());
                    }
                    for c in opts.split(',') {
                        if known.iter().any(|k| k == c) {
                            v1.entry(c.to_string()).or_insert_with(|| mount.clone());
                        }
                    }
                }
                "cgroup2" if v2.is_none() || mount == root => {
                    let controllers: Vec<String> =
                        std::fs::read_to_string(mount.join("cgroup.controllers"))
                            .unwrap_or_default()
                            .split_whitespace()
                            .map(str::to_string)
                            .collect();
                    v2 = Some((mount, controllers));
                }
                _ => {}
            }
        }
        // Controllers mounted as v1 are v1's, whatever the v2 mount beside
        // them holds (systemd's hybrid layout leaves it the ones v1 has not
        // taken, such as hugetlb): runsc puts its cgroups in the v1 mounts.
        let unified_root = v2.as_ref().is_some_and(|(m, _)| m == root);
        let version = match (v1.is_empty(), v2.is_some()) {
            (_, true) if unified_root => Version::V2,
            (true, true) => Version::V2,
            (false, true) => Version::Hybrid,
            (false, false) => Version::V1,
            (true, false) => Version::None,
        };
        Hierarchy {
            version,
            v1,
            v2,
            named,
        }
    }

    /// The controllers that hold limits in this hierarchy.
    pub fn controllers(&self) -> Vec<String> {
        match self.version {
            Version::V2 => self.v2.as_ref().map(|(_, c)| c.clone()).unwrap_or_default(),
            Version::V1 | Version::Hybrid => self.v1.keys().cloned().collect(),
            Version::None => Vec::new(),
        }
    }

    /// Controllers the limits need that this hierarchy lacks.
    pub fn missing(&self) -> Vec<&'static str> {
        let have = self.controllers();
        let needed = if self.version == Version::V2 {
            NEEDED_V2
        } else {
            NEEDED_V1
        };
        needed
            .iter()
            .copied()
            .filter(|c| !have.iter().any(|h| h == c))
            .collect()
    }

    /// A one-line description: `v1 (cpu at /sys/fs/cgroup/cpu, …)`.
    pub fn describe(&self) -> String {
        match (&self.version, &self.v2) {
            (Version::V2, Some((m, c))) => {
                format!("v2 (unified, {}: {})", m.display(), c.join(" "))
            }
            (Version::None, _) => "none mounted".into(),
            (v, _) => format!(
                "{} ({})",
                if *v == Version::Hybrid {
                    "hybrid v1+v2"
                } else {
                    "v1"
                },
                self.v1
                    .iter()
                    .filter(|(c, _)| NEEDED_V1.contains(&c.as_str()) || c.as_str() == "pids")
                    .map(|(c, m)| format!("{c} at {}", m.display()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// The directory of cgroup `rel` (relative, e.g. `gateway/NAME`) for
    /// `controller`: its v1 mount, or the unified tree.
    fn dir(&self, controller: &str, rel: &Path) -> Option<PathBuf> {
        match self.version {
            Version::V2 => self.v2.as_ref().map(|(m, _)| m.join(rel)),
            _ => self.v1.get(controller).map(|m| m.join(rel)),
        }
    }

    /// Every directory cgroup `rel` may have: one per v1 mount, and the
    /// unified tree's.
    pub fn all_dirs(&self, rel: &Path) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = self.v1.values().map(|m| m.join(rel)).collect();
        dirs.extend(self.named.iter().map(|m| m.join(rel)));
        dirs.extend(self.v2.as_ref().map(|(m, _)| m.join(rel)));
        dirs.sort();
        dirs.dedup();
        dirs
    }

    /// CPU time cgroup `rel` has used (v1 `cpuacct.usage`, v2 `cpu.stat`).
    pub fn cpu_used(&self, rel: &Path) -> Option<Duration> {
        if self.version == Version::V2 {
            let s = std::fs::read_to_string(self.dir("cpu", rel)?.join("cpu.stat")).ok()?;
            return s
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_micros);
        }
        let s = std::fs::read_to_string(self.dir("cpuacct", rel)?.join("cpuacct.usage")).ok()?;
        s.trim().parse().ok().map(Duration::from_nanos)
    }

    /// Peak memory of cgroup `rel` and how often a charge failed at its
    /// limit (v1 `memory.max_usage_in_bytes`/`memory.failcnt`, v2
    /// `memory.peak`/`memory.events`' `max`).
    pub fn memory_pressure(&self, rel: &Path) -> Option<(u64, u64)> {
        let dir = self.dir("memory", rel)?;
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
        if self.version == Version::V2 {
            let peak = read("memory.peak")?.trim().parse().ok()?;
            let fails = read("memory.events")
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("max ").and_then(|v| v.trim().parse().ok()))
                })
                .unwrap_or(0);
            return Some((peak, fails));
        }
        let peak = read("memory.max_usage_in_bytes")?.trim().parse().ok()?;
        let fails = read("memory.failcnt")
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        Some((peak, fails))
    }
}

/// What to do about missing controllers, for the hierarchy's version.
pub fn fix_for_missing(h: &Hierarchy, missing: &[&str]) -> String {
    match h.version {
        Version::V2 => format!(
            "enable them in the unified hierarchy: echo '{}' > /sys/fs/cgroup/cgroup.subtree_control (a host whose kernel lacks them needs one built with CONFIG_MEMCG / CONFIG_CGROUP_SCHED)",
            missing
                .iter()
                .map(|c| format!("+{c}"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        Version::None => "mount a cgroup hierarchy (systemd does; without systemd: mount -t cgroup2 none /sys/fs/cgroup, or the cgroupfs-mount package for v1)".into(),
        _ => format!(
            "mount the v1 controller(s) {} (e.g. mkdir -p /sys/fs/cgroup/memory && mount -t cgroup -o memory cgroup /sys/fs/cgroup/memory; the cgroupfs-mount package mounts all), or boot with cgroup_enable=memory where the kernel disables it",
            missing.join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The controllers of a current kernel's /proc/cgroups.
    const PROC_CGROUPS: &str = "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpuset\t3\t1\t1\ncpu\t1\t60\t1\ncpuacct\t2\t60\t1\nblkio\t6\t60\t1\nmemory\t4\t90\t1\ndevices\t5\t60\t1\nfreezer\t7\t1\t1\nnet_cls\t9\t1\t1\nperf_event\t10\t1\t1\nnet_prio\t9\t1\t1\nhugetlb\t0\t1\t1\npids\t8\t66\t1\nrdma\t11\t1\t1\nmisc\t12\t1\t1\n";

    /// Parse `info` with `root` as /sys/fs/cgroup.
    fn parse(info: &str, root: &Path) -> Hierarchy {
        Hierarchy::from_mountinfo(info, root, &kernel_controllers(PROC_CGROUPS))
    }

    /// mountinfo lines as a kernel writes them, for mounts under `root`.
    fn line(id: u32, mount: &Path, fstype: &str, opts: &str) -> String {
        format!(
            "{id} 30 0:{id} / {} rw,nosuid,nodev,noexec,relatime shared:{id} - {fstype} {fstype} {opts}\n",
            mount.display()
        )
    }

    /// A faithful temporary v1 hierarchy of the kind issue 25's host had
    /// (a tmpfs with one dir per controller, cpuacct apart from cpu), with
    /// the files the kernel's v1 controllers show for cgroup gateway/x.
    #[test]
    fn a_v1_hierarchy_with_controllers_mounted_apart() {
        let t = tempfile::tempdir().expect("tmp");
        let mut info =
            String::from("25 1 0:22 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n");
        for (i, c) in ["cpu", "cpuacct", "memory", "pids", "systemd"]
            .iter()
            .enumerate()
        {
            let m = t.path().join(c);
            std::fs::create_dir_all(m.join("gateway/x")).expect("dir");
            let opts = if *c == "systemd" {
                "rw,xattr,name=systemd".to_string()
            } else {
                format!("rw,{c}")
            };
            info.push_str(&line(40 + i as u32, &m, "cgroup", &opts));
        }
        let x = Path::new("gateway/x");
        std::fs::write(
            t.path().join("cpuacct/gateway/x/cpuacct.usage"),
            "2500000000\n",
        )
        .expect("w");
        std::fs::write(
            t.path().join("memory/gateway/x/memory.max_usage_in_bytes"),
            "1048576\n",
        )
        .expect("w");
        std::fs::write(t.path().join("memory/gateway/x/memory.failcnt"), "3\n").expect("w");
        let h = parse(&info, t.path());
        assert_eq!(h.version, Version::V1);
        assert!(h.missing().is_empty(), "{:?}", h.missing());
        assert!(
            !h.controllers().contains(&"xattr".to_string()),
            "{:?}",
            h.controllers()
        );
        assert_eq!(h.cpu_used(x), Some(Duration::from_millis(2500)));
        assert_eq!(h.memory_pressure(x), Some((1_048_576, 3)));
        assert!(!h.controllers().contains(&"name=systemd".to_string()));
        assert_eq!(h.all_dirs(x).len(), 5);
        assert!(h.describe().starts_with("v1 (cpu at "), "{}", h.describe());
    }

    /// The usual systemd v1 layout: cpu and cpuacct in one mount.
    #[test]
    fn a_v1_hierarchy_with_cpu_and_cpuacct_together() {
        let t = tempfile::tempdir().expect("tmp");
        let both = t.path().join("cpu,cpuacct");
        let mem = t.path().join("memory");
        std::fs::create_dir_all(both.join("gateway/x")).expect("dir");
        std::fs::create_dir_all(&mem).expect("dir");
        std::fs::write(both.join("gateway/x/cpuacct.usage"), "7\n").expect("w");
        let info =
            line(40, &both, "cgroup", "rw,cpu,cpuacct") + &line(41, &mem, "cgroup", "rw,memory");
        let h = parse(&info, t.path());
        assert_eq!(h.version, Version::V1);
        assert!(h.missing().is_empty());
        assert_eq!(
            h.cpu_used(Path::new("gateway/x")),
            Some(Duration::from_nanos(7))
        );
        // Without memory, the limits cannot hold: reported, with the fix.
        let h = parse(&line(40, &both, "cgroup", "rw,cpu,cpuacct"), t.path());
        assert_eq!(h.missing(), vec!["memory"]);
        assert!(fix_for_missing(&h, &h.missing()).contains("mount -t cgroup -o memory"));
    }

    /// A faithful temporary v2 (unified) hierarchy: the controllers are
    /// what its root's cgroup.controllers lists.
    #[test]
    fn a_v2_unified_hierarchy() {
        let t = tempfile::tempdir().expect("tmp");
        let root = t.path().join("unified");
        std::fs::create_dir_all(root.join("gateway/x")).expect("dir");
        std::fs::write(
            root.join("cgroup.controllers"),
            "cpuset cpu io memory hugetlb pids rdma misc\n",
        )
        .expect("w");
        std::fs::write(
            root.join("gateway/x/cpu.stat"),
            "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n",
        )
        .expect("w");
        std::fs::write(root.join("gateway/x/memory.peak"), "4096\n").expect("w");
        std::fs::write(
            root.join("gateway/x/memory.events"),
            "low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n",
        )
        .expect("w");
        let info = line(30, &root, "cgroup2", "rw,nsdelegate,memory_recursiveprot");
        let h = parse(&info, &root);
        assert_eq!(h.version, Version::V2);
        assert!(h.missing().is_empty());
        let x = Path::new("gateway/x");
        assert_eq!(h.cpu_used(x), Some(Duration::from_millis(1500)));
        assert_eq!(h.memory_pressure(x), Some((4096, 2)));
        assert_eq!(h.all_dirs(x), vec![root.join("gateway/x")]);
        // A root that offers no memory controller is reported with the v2 fix.
        std::fs::write(root.join("cgroup.controllers"), "cpu pids\n").expect("w");
        let h = parse(&info, &root);
        assert_eq!(h.missing(), vec!["memory"]);
        assert!(
            fix_for_missing(&h, &h.missing())
                .contains("echo '+memory' > /sys/fs/cgroup/cgroup.subtree_control")
        );
    }

    /// systemd's hybrid layout: v1 controllers and a v2 mount holding
    /// what v1 has not taken (this machine's: hugetlb).
    #[test]
    fn a_hybrid_hierarchy_uses_its_v1_controllers() {
        let t = tempfile::tempdir().expect("tmp");
        let unified = t.path().join("unified");
        std::fs::create_dir_all(&unified).expect("dir");
        std::fs::write(unified.join("cgroup.controllers"), "hugetlb\n").expect("w");
        let mut info = line(30, &unified, "cgroup2", "rw,nsdelegate");
        for (i, c) in ["cpu,cpuacct", "memory"].iter().enumerate() {
            let m = t.path().join(c);
            std::fs::create_dir_all(&m).expect("dir");
            info.push_str(&line(40 + i as u32, &m, "cgroup", &format!("rw,{c}")));
        }
        let h = parse(&info, t.path());
        assert_eq!(h.version, Version::Hybrid);
        assert!(h.missing().is_empty());
        assert_eq!(parse("", t.path()).version, Version::None);
    }

    /// A unified host with stray v1 mounts beside it (a VPN client's
    /// net_cls, systemd's named compatibility hierarchy) is still v2:
    /// runsc uses the unified tree, and so must the limits' reads.
    #[test]
    fn a_v2_root_with_stray_v1_mounts_is_v2() {
        let t = tempfile::tempdir().expect("tmp");
        let root = t.path().join("cgroup");
        std::fs::create_dir_all(&root).expect("dir");
        std::fs::write(
            root.join("cgroup.controllers"),
            "cpuset cpu io memory pids\n",
        )
        .expect("w");
        let net_cls = t.path().join("net_cls");
        let named = t.path().join("systemd");
        std::fs::create_dir_all(&net_cls).expect("dir");
        std::fs::create_dir_all(&named).expect("dir");
        let info = line(30, &root, "cgroup2", "rw,nsdelegate")
            + &line(50, &net_cls, "cgroup", "rw,net_cls")
            + &line(51, &named, "cgroup", "rw,xattr,name=systemd");
        let h = parse(&info, &root);
        assert_eq!(h.version, Version::V2, "{}", h.describe());
        assert!(h.missing().is_empty(), "{:?}", h.missing());
        // The named hierarchy's dir is still cleaned up.
        assert!(
            h.all_dirs(Path::new("gateway/x"))
                .contains(&named.join("gateway/x"))
        );
    }

    #[test]
    fn mount_points_with_escaped_characters() {
        assert_eq!(unescape("/a\\040b"), PathBuf::from("/a b"));
        assert_eq!(unescape("/plain"), PathBuf::from("/plain"));
        // Bytes that are not ASCII stay the path's own bytes.
        assert_eq!(unescape("/caf\u{e9}\\011x"), PathBuf::from("/caf\u{e9}\tx"));
    }

    /// This host's own hierarchy: whatever it is, the limits' controllers
    /// are there (the sandbox tests need them).
    #[test]
    fn this_host_has_what_the_limits_need() {
        let h = Hierarchy::detect();
        assert!(
            h.missing().is_empty(),
            "{}: missing {:?}",
            h.describe(),
            h.missing()
        );
    }
}
