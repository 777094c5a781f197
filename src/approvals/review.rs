//! What a reviewer reads before deciding, in the order a careful one needs
//! it: the destructive signals first, then the planned changes grouped by
//! action with their counts, each with its attribute changes (before →
//! after). `gateway approvals show` and the approval page both render
//! these sections; neither decides anything from them.
//!
//! Everything here comes from the plan, which a hostile module shaped:
//! values are kept as text, folded when long, masked where Terraform marks
//! them sensitive, and bounded in number. Renderers escape them.

use serde_json::{Map, Value, json};

/// Attribute changes kept per resource.
pub const MAX_DIFFS_PER_RESOURCE: usize = 64;
/// Characters of one value kept (the rest is counted, not shown).
pub const MAX_VALUE_CHARS: usize = 160;
/// Bytes of attribute changes kept for one plan in all; past it, further
/// resources show their actions only.
pub const MAX_DIFF_BYTES: usize = 2 * 1024 * 1024;
/// How deep nested attributes are followed.
const MAX_DEPTH: usize = 12;

/// The groups of changes, in the order they are shown, with the label of
/// each: the destructive ones first.
pub const GROUPS: &[(&str, &str)] = &[
    ("replace", "replace (destroy and re-create)"),
    ("delete", "destroy"),
    ("forget", "forget (removed from state, left running)"),
    ("update", "update in place"),
    ("create", "create"),
    ("read", "read"),
    ("other", "other"),
];

/// The group a change's actions put it in.
pub fn group_of(actions: &Value) -> &'static str {
    let a: Vec<&str> = actions
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    match a.as_slice() {
        ["create"] => "create",
        ["update"] => "update",
        ["delete"] => "delete",
        ["read"] => "read",
        ["forget"] => "forget",
        ["delete", "create"] | ["create", "delete"] => "replace",
        _ => "other",
    }
}

/// The changes of `summary` by group, in [`GROUPS`] order, empty groups
/// left out.
pub fn grouped(summary: &Value) -> Vec<(&'static str, &'static str, Vec<&Value>)> {
    let changes: Vec<&Value> = summary
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    GROUPS
        .iter()
        .filter_map(|(key, label)| {
            let in_group: Vec<&Value> = changes
                .iter()
                .copied()
                .filter(|c| group_of(&c["actions"]) == *key)
                .collect();
            (!in_group.is_empty()).then_some((*key, *label, in_group))
        })
        .collect()
}

/// `plan_summary` (one entry per change, in plan order) with each entry's
/// attribute changes added as `diff`: `[{path, before, after}]`, values as
/// display text. Read from the plan's `resource_changes` in the same order
/// [`super::plan_summary`] reads them.
pub fn with_diffs(summary: &Value, plan: &regorus::Value) -> Value {
    use regorus::Value as R;
    let Ok(changes) = plan["resource_changes"].as_array() else {
        return summary.clone();
    };
    let no_op = R::from(vec![R::from("no-op")]);
    let json = |v: &R| match v {
        R::Undefined => Value::Null,
        v => serde_json::to_value(v).unwrap_or(Value::Null),
    };
    let mut budget = MAX_DIFF_BYTES;
    let mut out = Vec::new();
    let entries = summary.as_array().cloned().unwrap_or_default();
    let rcs = changes.iter().filter(|rc| rc["change"]["actions"] != no_op);
    for (mut entry, rc) in entries.into_iter().zip(rcs) {
        let c = &rc["change"];
        let diff = if budget == 0 {
            Value::Null
        } else {
            let d = attribute_changes(
                &json(&c["before"]),
                &json(&c["after"]),
                &json(&c["before_sensitive"]),
                &json(&c["after_sensitive"]),
                &json(&c["after_unknown"]),
            );
            let size = d.to_string().len();
            if size > budget {
                budget = 0;
                Value::Null
            } else {
                budget -= size;
                d
            }
        };
        if let Value::Object(o) = &mut entry {
            o.insert("diff".into(), diff);
        }
        out.push(entry);
    }
    Value::Array(out)
}

/// The attribute paths whose values differ, before → after.
fn attribute_changes(
    before: &Value,
    after: &Value,
    before_sensitive: &Value,
    after_sensitive: &Value,
    after_unknown: &Value,
) -> Value {
    let mut b = Map::new();
    let mut a = Map::new();
    flatten(before, "", 0, &mut b);
    flatten(after, "", 0, &mut a);
    let mut paths: Vec<&String> = b.keys().chain(a.keys()).collect();
    paths.sort();
    paths.dedup();
    let mut out = Vec::new();
    let mut more = 0usize;
    for p in paths {
        let (bv, av) = (b.get(p), a.get(p));
        let unknown = marked(after_unknown, p);
        // Absent and null are the same to a reader.
        if bv.unwrap_or(&Value::Null) == av.unwrap_or(&Value::Null) && !unknown {
            continue;
        }
        if out.len() >= MAX_DIFFS_PER_RESOURCE {
            more += 1;
            continue;
        }
        let show = |v: Option<&Value>, sensitive: bool| match v {
            _ if sensitive => json!("(sensitive value)"),
            None | Some(Value::Null) => Value::Null,
            Some(v) => json!(folded(v)),
        };
        let after_shown = if unknown {
            json!("(known after apply)")
        } else {
            show(av, marked(after_sensitive, p))
        };
        out.push(json!({
            "path": if p.is_empty() { "(value)" } else { p.as_str() },
            "before": show(bv, marked(before_sensitive, p)),
            "after": after_shown,
        }));
    }
    if more > 0 {
        out.push(
            json!({"path": format!("(and {more} more attributes)"), "before": null, "after": null}),
        );
    }
    Value::Array(out)
}

/// Leaves by dotted path (`tags.env`, `rule[0].port`).
fn flatten(v: &Value, path: &str, depth: usize, out: &mut Map<String, Value>) {
    if depth >= MAX_DEPTH {
        out.insert(path.to_string(), v.clone());
        return;
    }
    match v {
        Value::Object(o) if !o.is_empty() => {
            for (k, x) in o {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                flatten(x, &p, depth + 1, out);
            }
        }
        Value::Array(a) if !a.is_empty() => {
            for (i, x) in a.iter().enumerate() {
                flatten(x, &format!("{path}[{i}]"), depth + 1, out);
            }
        }
        // No object at all (before a create, after a delete).
        Value::Null if path.is_empty() => {}
        v => {
            out.insert(path.to_string(), v.clone());
        }
    }
}

/// Whether a Terraform marker structure (`after_sensitive`,
/// `after_unknown`: `true`, or objects/arrays of them mirroring the value)
/// marks `path` or a prefix of it.
fn marked(marker: &Value, path: &str) -> bool {
    if marker == &Value::Bool(true) {
        return true;
    }
    let mut m = marker;
    for part in split_path(path) {
        m = match (m, part) {
            (Value::Object(o), Part::Key(k)) => match o.get(k) {
                Some(x) => x,
                None => return false,
            },
            (Value::Array(a), Part::Index(i)) => match a.get(i) {
                Some(x) => x,
                None => return false,
            },
            _ => return false,
        };
        if m == &Value::Bool(true) {
            return true;
        }
    }
    false
}

enum Part<'a> {
    Key(&'a str),
    Index(usize),
}

fn split_path(path: &str) -> Vec<Part<'_>> {
    let mut out = Vec::new();
    for seg in path.split('.').filter(|s| !s.is_empty()) {
        let (key, rest) = seg.split_once('[').map_or((seg, ""), |(k, r)| (k, r));
        if !key.is_empty() {
            out.push(Part::Key(key));
        }
        for idx in rest.split('[') {
            if let Ok(i) = idx.trim_end_matches(']').parse() {
                out.push(Part::Index(i));
            }
        }
    }
    out
}

/// A value as one line of text, at most [`MAX_VALUE_CHARS`] characters.
fn folded(v: &Value) -> String {
    let s = match v {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    let n = s.chars().count();
    if n <= MAX_VALUE_CHARS {
        s
    } else {
        let head: String = s.chars().take(MAX_VALUE_CHARS).collect();
        format!("{head}… ({} more characters)", n - MAX_VALUE_CHARS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(change: Value) -> regorus::Value {
        regorus::Value::from(json!({"resource_changes": [
            {"address": "a.b", "change": {"actions": ["no-op"]}},
            {"address": "x.y", "change": change},
        ]}))
    }

    #[test]
    fn changed_attributes_are_shown_masked_where_terraform_marks_them() {
        let p = plan(json!({
            "actions": ["update"],
            "before": {"name": "web", "password": "hunter2", "tags": {"env": "dev", "team": "a"}, "same": 1},
            "after": {"name": "web2", "password": "swordfish", "tags": {"env": "prod", "team": "a"}, "same": 1, "id": null},
            "before_sensitive": {"password": true},
            "after_sensitive": {"password": true},
            "after_unknown": {"id": true},
        }));
        let summary = super::super::plan_summary(&p);
        let d = with_diffs(&summary, &p);
        let diff = &d[0]["diff"];
        let text = diff.to_string();
        assert!(
            !text.contains("hunter2") && !text.contains("swordfish"),
            "{text}"
        );
        assert_eq!(
            diff,
            &json!([
                {"path": "id", "before": null, "after": "(known after apply)"},
                {"path": "name", "before": "web", "after": "web2"},
                {"path": "password", "before": "(sensitive value)", "after": "(sensitive value)"},
                {"path": "tags.env", "before": "dev", "after": "prod"},
            ])
        );
    }

    #[test]
    fn long_values_are_folded_and_many_attributes_bounded() {
        let mut after = Map::new();
        for i in 0..100 {
            after.insert(format!("k{i:03}"), json!("v".repeat(1000)));
        }
        let p = plan(json!({"actions": ["create"], "before": null, "after": after}));
        let d = with_diffs(&super::super::plan_summary(&p), &p);
        let diff = d[0]["diff"].as_array().expect("diff");
        assert_eq!(diff.len(), MAX_DIFFS_PER_RESOURCE + 1);
        assert!(
            diff[0]["after"]
                .as_str()
                .expect("s")
                .ends_with("(840 more characters)")
        );
        assert_eq!(
            diff[MAX_DIFFS_PER_RESOURCE]["path"],
            "(and 36 more attributes)"
        );
    }

    #[test]
    fn changes_are_grouped_destructive_first() {
        let s = json!([
            {"address": "c", "actions": ["create"]},
            {"address": "r", "actions": ["delete", "create"]},
            {"address": "d", "actions": ["delete"]},
            {"address": "f", "actions": ["forget"]},
        ]);
        let g: Vec<(&str, usize)> = grouped(&s).iter().map(|(k, _, v)| (*k, v.len())).collect();
        assert_eq!(
            g,
            vec![("replace", 1), ("delete", 1), ("forget", 1), ("create", 1)]
        );
    }
}
