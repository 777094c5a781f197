//! The gateway's modules form a graph without cycles, across its crates:
//! a reader can follow one call down the pipeline without being sent back
//! up. In particular sandbox, tools and broker do not import each other in
//! a circle (tools uses sandbox; sandbox and broker use neither).
//! (`crate_layers.rs` checks the crates; this checks the modules inside
//! them too: pipeline, tools and config in gateway-core, mcp, daemon and
//! http in gateway-server, audit and approvals in gateway-audit.)
//!
//! The graph is read from the source: every `crate::MODULE` and
//! `gateway_CRATE::MODULE` a module's non-test code names.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each source root, and the module it is when it is one module alone
/// (a crate that is one module has its files at the root of `src/`).
fn roots() -> Vec<(PathBuf, Option<&'static str>)> {
    let repo = common::repo();
    let mut out = vec![(repo.join("src"), None)];
    for (krate, single) in [
        ("gateway-base", None),
        ("gateway-store", Some("db")),
        ("gateway-telemetry", Some("telemetry")),
        ("gateway-policy", Some("policy")),
        ("gateway-sandbox", Some("sandbox")),
        ("gateway-audit", None),
        ("gateway-broker", Some("broker")),
        ("gateway-core", None),
        ("gateway-server", None),
    ] {
        out.push((repo.join("crates").join(krate).join("src"), single));
    }
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let re = regex::Regex::new(r"crate::([a-z_]+)").expect("regex");
    // A crate of one module is named by the crate; the others' modules
    // by the crate and the module.
    let single =
        regex::Regex::new(r"gateway_(store|telemetry|policy|sandbox|broker)\b(?:::([a-z_]+))?")
            .expect("regex");
    let multi = regex::Regex::new(r"gateway_(base|audit|core|server)::([a-z_]+)").expect("regex");
    let crate_module = |c: &str| {
        match c {
            "store" => "db",
            other => other,
        }
        .to_string()
    };
    for (src, one) in roots() {
        let mut stack = vec![src.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("read src") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                    continue;
                }
                let rel = path.strip_prefix(&src).expect("under src");
                let first = rel
                    .components()
                    .next()
                    .and_then(|c| c.as_os_str().to_str())
                    .unwrap_or_default();
                let module = match one {
                    Some(m) => m.to_string(),
                    None => Path::new(first)
                        .file_stem()
                        .and_then(|s| s.to_str())
                        .unwrap_or_default()
                        .to_string(),
                };
                if one.is_none() && (module == "lib" || module == "main") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).expect("read");
                // Unit tests may reach anywhere; the code may not.
                let code = text.split("#[cfg(test)]").next().unwrap_or_default();
                // `super::super::x` would name a top-level module without
                // `crate::`; none is used, and none may be, so that every
                // edge is seen here.
                assert!(
                    !code.contains("super::super::"),
                    "{}: use crate:: paths, not super::super::",
                    path.display()
                );
                let mut names = if one.is_some() {
                    BTreeSet::new()
                } else {
                    referenced(&re, code)
                };
                for c in single.captures_iter(code) {
                    names.insert(crate_module(&c[1]));
                }
                for c in multi.captures_iter(code) {
                    names.insert(c[2].to_string());
                }
                let uses = g.entry(module.clone()).or_default();
                for name in names {
                    if name != module {
                        uses.insert(name);
                    }
                }
            }
        }
    }
    g
}

/// Every top-level module `code` names: `crate::x` and each first-level
/// item of `crate::{x, y::z, ...}`.
fn referenced(re: &regex::Regex, code: &str) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = re.captures_iter(code).map(|c| c[1].to_string()).collect();
    for (at, _) in code.match_indices("crate::{") {
        let mut depth = 0;
        let mut item = String::new();
        let mut items = Vec::new();
        for ch in code[at + "crate::".len()..].chars() {
            match ch {
                '{' => {
                    depth += 1;
                    if depth > 1 {
                        item.push(ch);
                    }
                }
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        items.push(std::mem::take(&mut item));
                        break;
                    }
                    item.push(ch);
                }
                ',' if depth == 1 => items.push(std::mem::take(&mut item)),
                _ => item.push(ch),
            }
        }
        for i in items {
            let head: String = i
                .trim()
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if !head.is_empty() && head != "self" {
                out.insert(head);
            }
        }
    }
    out
}

/// A cycle in `g`, if any.
fn cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        g: &BTreeMap<String, BTreeSet<String>>,
        node: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|n| n == node) {
            let mut c = path[i..].to_vec();
            c.push(node.to_string());
            return Some(c);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in g.get(node).into_iter().flatten() {
            if let Some(c) = visit(g, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for node in g.keys() {
        if let Some(c) = visit(g, node, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn the_top_level_modules_have_no_cycle() {
    let g = graph();
    assert!(
        g.contains_key("pipeline")
            && g.contains_key("sandbox")
            && g["pipeline"].contains("policy")
            && g["http"].contains("pipeline")
            && g["cli"].contains("daemon"),
        "{g:?}"
    );
    if let Some(c) = cycle(&g) {
        panic!("module cycle: {}", c.join(" -> "));
    }
}

#[test]
fn sandbox_tools_and_broker_depend_only_downwards() {
    let g = graph();
    let uses = |m: &str| g.get(m).cloned().unwrap_or_default();
    for m in ["tools", "broker", "pipeline", "policy"] {
        assert!(!uses("sandbox").contains(m), "sandbox uses {m}");
    }
    for m in ["sandbox", "tools", "pipeline"] {
        assert!(!uses("broker").contains(m), "broker uses {m}");
    }
    assert!(!uses("tools").contains("broker"), "tools uses broker");
}

#[test]
fn grouped_imports_are_edges_too() {
    let re = regex::Regex::new(r"crate::([a-z_]+)").expect("regex");
    let got = referenced(
        &re,
        "use crate::{audit::AuditLog, sandbox::{Bind, net}, tools};\n",
    );
    assert_eq!(
        got,
        BTreeSet::from([
            "audit".to_string(),
            "sandbox".to_string(),
            "tools".to_string()
        ])
    );
}

#[test]
fn the_cycle_check_finds_a_cycle() {
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    g.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(
        cycle(&g),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    g.insert("c".to_string(), BTreeSet::new());
    assert_eq!(cycle(&g), None);
}
