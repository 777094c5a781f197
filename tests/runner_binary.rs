//! What runs inside a sandbox is `gateway-runner` alone, and it carries
//! nothing of the gateway's heavy parts: checked on the dependency graph
//! (cargo metadata) and on the built binary itself.

mod common;

use std::collections::{BTreeMap, BTreeSet};

/// Crates that must never be inside a sandbox.
const FORBIDDEN: &[&str] = &[
    "rusqlite",
    "libsqlite3-sys",
    "vaultrs",
    "kube",
    "kube-client",
    "k8s-openapi",
    "regorus",
    "rmcp",
    "tokio",
    "gateway",
];

#[test]
fn the_runner_crate_depends_on_none_of_the_gateways_heavy_parts() {
    let out = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .current_dir(common::repo())
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let names: BTreeMap<String, String> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap_or_default().to_string(),
                p["name"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let nodes: BTreeMap<String, Vec<String>> = meta["resolve"]["nodes"]
        .as_array()
        .expect("resolve")
        .iter()
        .map(|n| {
            let deps = n["deps"]
                .as_array()
                .into_iter()
                .flatten()
                // Normal (not dev or build) dependencies: what is linked in.
                .filter(|d| {
                    d["dep_kinds"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|k| k["kind"].is_null())
                })
                .filter_map(|d| d["pkg"].as_str().map(str::to_string))
                .collect();
            (n["id"].as_str().unwrap_or_default().to_string(), deps)
        })
        .collect();
    let root = names
        .iter()
        .find(|(_, n)| *n == "gateway-runner")
        .map(|(id, _)| id.clone())
        .expect("the gateway-runner package");
    let mut seen = BTreeSet::new();
    let mut todo = vec![root];
    while let Some(id) = todo.pop() {
        if seen.insert(id.clone()) {
            todo.extend(nodes.get(&id).cloned().unwrap_or_default());
        }
    }
    let linked: BTreeSet<&str> = seen.iter().map(|id| names[id].as_str()).collect();
    for bad in FORBIDDEN {
        assert!(
            !linked.contains(bad),
            "gateway-runner links {bad}: {linked:?}"
        );
    }
    assert!(linked.contains("libloading") && linked.contains("serde_json"));
}

#[test]
fn the_runner_binary_carries_no_code_of_those_crates() {
    let bin = std::fs::read(common::runner_bin()).expect("read gateway-runner");
    // A debug build names the source file of every function it contains;
    // none of these crates' sources may be among them.
    for marker in [
        "rusqlite-",
        "libsqlite3-sys-",
        "vaultrs-",
        "kube-client-",
        "regorus-",
        "rmcp-",
        "tokio-1.",
    ] {
        assert!(
            !bin.windows(marker.len()).any(|w| w == marker.as_bytes()),
            "gateway-runner contains code of {marker}"
        );
    }
    // And it does contain what it is made of (the check can see crates).
    assert!(
        bin.windows(b"libloading-".len())
            .any(|w| w == b"libloading-"),
        "the binary names its own dependencies' sources"
    );
    let gateway = std::fs::read(env!("CARGO_BIN_EXE_gateway")).expect("read gateway");
    assert!(
        gateway.windows(b"regorus-".len()).any(|w| w == b"regorus-"),
        "the same check finds regorus in the gateway binary"
    );
}
