//! The workspace's crates stand in layers, and each depends only on crates
//! of the layers below its own (checked on `cargo metadata`). Cargo refuses
//! a cycle between crates; this also refuses an arrow that runs back up,
//! e.g. the sandbox reaching for the pipeline, which Cargo would allow.

mod common;

/// The layers, lowest first (CONTRIBUTING.md draws them).
const LAYERS: &[&[&str]] = &[
    &["gateway-runner", "gateway-base", "gateway-store"],
    &["gateway-telemetry", "gateway-policy", "gateway-sandbox"],
    &["gateway-audit"],
    &["gateway-broker"],
    &["gateway-core"],
    &["gateway-server"],
    &["gateway"],
];

fn layer_of(name: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&name))
}

#[test]
fn every_crate_depends_only_on_crates_below_it() {
    let graph = common::Crates::of_workspace();
    for member in &graph.members {
        let Some(mine) = layer_of(member) else {
            panic!(
                "{member} is a workspace member in no layer: add it to LAYERS and CONTRIBUTING.md"
            )
        };
        for dep in graph.deps.get(member).into_iter().flatten() {
            if !graph.members.contains(dep) {
                continue;
            }
            let theirs = layer_of(dep).expect("a member");
            assert!(
                theirs < mine,
                "{member} (layer {mine}) depends on {dep} (layer {theirs}): only crates of lower layers may be used"
            );
        }
    }
    // The list is the workspace: no layer names a crate that is gone.
    for name in LAYERS.iter().flat_map(|l| l.iter()) {
        assert!(
            graph.members.contains(*name),
            "{name} is in LAYERS but not in the workspace"
        );
    }
}

#[test]
fn the_check_sees_the_crates_and_their_arrows() {
    // The test above passes vacuously if the graph reads empty.
    let graph = common::Crates::of_workspace();
    assert!(graph.members.len() >= LAYERS.iter().map(|l| l.len()).sum::<usize>());
    let core = graph.linked_by("gateway-core");
    for below in [
        "gateway-policy",
        "gateway-sandbox",
        "gateway-broker",
        "gateway-audit",
    ] {
        assert!(core.contains(below), "gateway-core links {below}: {core:?}");
    }
    assert!(!graph.linked_by("gateway-policy").contains("gateway-core"));
}
