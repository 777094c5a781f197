//! The audit events are one typed enum (crates/gateway-audit/src/audit/events.rs):
//! README.md's table lists exactly its names, and nothing outside its audit/ writes an
//! event by name.

mod common;

use std::collections::BTreeSet;

#[test]
fn the_readme_lists_exactly_the_events_the_gateway_writes() {
    let readme = std::fs::read_to_string(common::repo().join("README.md")).expect("README");
    let start = readme
        .find("| event | when | data |")
        .expect("the events table");
    let listed: Vec<String> = readme[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.split('`').nth(1).map(str::to_string))
        .collect();
    let names: Vec<String> = gateway::audit::events::NAMES
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(listed, names, "README's table and events::NAMES differ");
}

#[test]
fn every_event_the_source_names_is_a_listed_one_and_only_the_log_appends_by_name() {
    let names: BTreeSet<&str> = gateway::audit::events::NAMES.iter().copied().collect();
    let rename = regex::Regex::new(r#"#\[serde\(rename = "([a-z_]+\.[a-z_]+)"\)\]"#).expect("re");
    let events =
        std::fs::read_to_string(common::repo().join("crates/gateway-audit/src/audit/events.rs"))
            .expect("read");
    let variants: BTreeSet<&str> = rename
        .captures_iter(&events)
        .map(|c| c.get(1).map(|m| m.as_str()).unwrap_or_default())
        .collect();
    assert!(variants.len() >= 20, "{variants:?}");
    for v in &variants {
        assert!(names.contains(v), "variant {v} is not in NAMES");
    }
    // The four written by the log itself.
    let own = [
        "policy.decision",
        "audit.recovered",
        "audit.head_lost",
        "audit.dropped",
    ];
    for own in own {
        assert!(names.contains(own) && !variants.contains(own));
    }
    assert_eq!(
        variants.len() + own.len(),
        names.len(),
        "NAMES lists an event no code writes"
    );
    let mut stack = vec![common::repo().join("src"), common::repo().join("crates")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("read_dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                if !p.ends_with("audit") {
                    stack.push(p);
                }
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).expect("read");
                let code = text.split("#[cfg(test)]").next().unwrap_or_default();
                assert!(
                    !code.contains(".append("),
                    "{} writes an audit event by name; use AuditLog::record(Event::…)",
                    p.display()
                );
            }
        }
    }
}
