//! Network for the local sandbox when a decision allows endpoints: a network
//! namespace of its own, a veth pair to the host, and nftables in the
//! namespace that drop everything except TCP to the allowed host ports.
//!
//! runsc then runs inside that namespace with `--network=host` (its network
//! syscalls go to this namespace's stack, so these nftables rules apply). The
//! Debian runsc (2022) refuses `--network=sandbox` in a non-root namespace on
//! current kernels (it misdetects the root namespace), which is why its own
//! netstack is not used here. Without endpoints, runsc runs with
//! `--network=none` and none of this is set up.

use std::net::Ipv4Addr;
use std::process::Command;

use sha2::{Digest, Sha256};

use super::{Endpoint, SandboxError};

/// A namespace with its veth pair and rules; removed on drop.
#[derive(Debug)]
pub struct NetNs {
    pub name: String,
    pub host_ip: Ipv4Addr,
    pub sandbox_ip: Ipv4Addr,
    host_if: String,
    removed: bool,
}

fn run(cmd: &mut Command) -> Result<(), SandboxError> {
    let out = cmd
        .output()
        .map_err(|e| SandboxError::Setup(format!("{cmd:?}: {e}")))?;
    if !out.status.success() {
        return Err(SandboxError::Setup(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

pub fn check_host_tools() -> Result<(), SandboxError> {
    for (tool, package) in [
        ("ip", "iproute2"),
        ("nft", "nftables"),
        ("nsenter", "util-linux"),
    ] {
        if which(tool).is_none() {
            return Err(SandboxError::HostToolMissing {
                tool,
                package,
                why: "to give a sandbox its allowed endpoints",
            });
        }
    }
    Ok(())
}

pub fn which(tool: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

impl NetNs {
    /// The namespace and host interface names of sandbox `id`.
    fn names(id: &str) -> (String, String, String) {
        let digest = Sha256::digest(id.as_bytes());
        let tag = hex::encode(&digest[..4]);
        (
            format!("gw-{tag}"),
            format!("gwh{tag}"),
            format!("gws{tag}"),
        )
    }

    /// Remove what sandbox `id` may have left (a namespace and host link),
    /// whether or not they exist.
    pub fn remove_leftover(id: &str) {
        let (name, host_if, _) = NetNs::names(id);
        let mut ns = NetNs {
            name,
            host_ip: Ipv4Addr::UNSPECIFIED,
            sandbox_ip: Ipv4Addr::UNSPECIFIED,
            host_if,
            removed: false,
        };
        ns.remove();
    }

    /// Create the namespace for sandbox `id` allowing only `endpoints`.
    pub fn create(id: &str, endpoints: &[Endpoint]) -> Result<NetNs, SandboxError> {
        check_host_tools()?;
        let digest = Sha256::digest(id.as_bytes());
        let (name, host_if, sb_if) = NetNs::names(id);
        // A /30 in 10.201.0.0/16 chosen from the id; retried on collision.
        let mut last_err = None;
        for attempt in 0u16..16 {
            let slot = (u16::from_be_bytes([digest[4], digest[5]])
                .wrapping_add(attempt.wrapping_mul(7919)))
                & 0x3fff;
            let base = (u32::from(Ipv4Addr::new(10, 201, 0, 0))) | (u32::from(slot) << 2);
            let host_ip = Ipv4Addr::from(base + 1);
            let sandbox_ip = Ipv4Addr::from(base + 2);
            let mut ns = NetNs {
                name: name.clone(),
                host_ip,
                sandbox_ip,
                host_if: host_if.clone(),
                removed: false,
            };
            match ns.setup(&sb_if, endpoints) {
                Ok(()) => return Ok(ns),
                Err(e) => {
                    ns.remove();
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| {
            SandboxError::Setup("no free address for the sandbox network".into())
        }))
    }

    fn setup(&self, sb_if: &str, endpoints: &[Endpoint]) -> Result<(), SandboxError> {
        let ns = self.name.as_str();
        let host = format!("{}/30", self.host_ip);
        let sb = format!("{}/30", self.sandbox_ip);
        run(Command::new("ip").args(["netns", "add", ns]))?;
        run(Command::new("ip").args([
            "link",
            "add",
            &self.host_if,
            "type",
            "veth",
            "peer",
            "name",
            sb_if,
        ]))?;
        run(Command::new("ip").args(["link", "set", sb_if, "netns", ns]))?;
        run(Command::new("ip").args(["addr", "add", &host, "dev", &self.host_if]))?;
        run(Command::new("ip").args(["link", "set", &self.host_if, "up"]))?;
        run(Command::new("ip").args(["-n", ns, "addr", "add", &sb, "dev", sb_if]))?;
        run(Command::new("ip").args(["-n", ns, "link", "set", sb_if, "up"]))?;
        run(Command::new("ip").args(["-n", ns, "link", "set", "lo", "up"]))?;
        // Rules first, route last: nothing can leave before the rules exist.
        let allow: String = endpoints
            .iter()
            .map(|e| {
                format!(
                    "    ip daddr {} tcp dport {} accept\n",
                    self.host_ip, e.port
                )
            })
            .collect();
        let rules = format!(
            "table inet gateway {{\n  chain output {{\n    type filter hook output priority 0; policy drop;\n    oifname \"lo\" accept\n{allow}  }}\n  chain input {{\n    type filter hook input priority 0; policy drop;\n    iifname \"lo\" accept\n    ct state established,related accept\n  }}\n}}\n"
        );
        let path = std::env::temp_dir().join(format!("{ns}.nft"));
        std::fs::write(&path, rules)?;
        let applied = run(Command::new("ip")
            .args(["netns", "exec", ns, "nft", "-f"])
            .arg(&path));
        let _ = std::fs::remove_file(&path);
        applied?;
        run(Command::new("ip").args([
            "-n",
            ns,
            "route",
            "add",
            "default",
            "via",
            &self.host_ip.to_string(),
        ]))?;
        Ok(())
    }

    /// The path `nsenter --net=` takes.
    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    /// Remove the namespace (its veth end goes with it, and so does the
    /// host end). Idempotent.
    pub fn remove(&mut self) {
        if self.removed {
            return;
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .output();
        self.removed = true;
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        self.remove();
    }
}
