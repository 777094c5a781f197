//! What a reviewer reads before deciding, in the order a careful one needs
//! it: the destructive signals first, then the planned changes grouped by
//! action with their counts, each with its attribute changes (before →
//! after). `gateway approvals show` and the approval page both render
//! these sections; neither decides anything from them.
//!
//! Everything here comes from the plan, which a hostile module shaped:
//! values are kept as text, folded when long, masked where Terraform marks
//! them sensitive, and bounded in number. Renderers escape them.

use serde_json::{Value, json};

/// Attribute changes kept per resource.
pub const MAX_DIFFS_PER_RESOURCE: usize = 64;
/// Characters of one value kept (the rest is counted, not shown).
pub const MAX_VALUE_CHARS: usize = 160;
/// Bytes of attribute changes kept for one plan in all; past it, further
/// resources show their actions only.
pub const MAX_DIFF_BYTES: usize = 2 * 1024 * 1024;
/// How deep nested attributes are followed.
const MAX_DEPTH: usize = 12;
/// Characters of one attribute name kept in a path.
const MAX_KEY_CHARS: usize = 100;

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
            omitted()
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
                omitted()
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

/// What one attribute shows: its value, or a marker in its place.
#[derive(Debug, Clone, PartialEq)]
enum Shown {
    Value(Value),
    Sensitive,
    Unknown,
}

/// What a resource shows when the plan's diffs passed [`MAX_DIFF_BYTES`].
fn omitted() -> Value {
    json!([{"path": "(attribute changes not shown: the plan's diffs passed their size budget; read the plan with terraform show)", "before": null, "after": null}])
}

/// The attribute paths whose values differ, before → after (values as
/// display text, folded; a `*_sensitive` value of `true` masks a side).
pub fn attribute_changes(
    before: &Value,
    after: &Value,
    before_sensitive: &Value,
    after_sensitive: &Value,
    after_unknown: &Value,
) -> Value {
    let mut b = std::collections::BTreeMap::new();
    let mut a = std::collections::BTreeMap::new();
    flatten(
        before,
        before_sensitive,
        &Value::Null,
        String::new(),
        0,
        &mut b,
    );
    flatten(
        after,
        after_sensitive,
        after_unknown,
        String::new(),
        0,
        &mut a,
    );
    let mut paths: Vec<&String> = b.keys().chain(a.keys()).collect();
    paths.sort();
    paths.dedup();
    let null = Shown::Value(Value::Null);
    // A path one side lacks takes the marker of an enclosing path on that
    // side (`output` known after apply covers `output.image`).
    let side = |m: &std::collections::BTreeMap<String, Shown>, p: &str| -> Shown {
        if let Some(v) = m.get(p) {
            return v.clone();
        }
        m.iter()
            .filter(|(k, v)| {
                matches!(v, Shown::Sensitive | Shown::Unknown)
                    && (k.is_empty()
                        || p.strip_prefix(k.as_str())
                            .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('[')))
            })
            .map(|(_, v)| v.clone())
            .next()
            .unwrap_or_else(|| null.clone())
    };
    let mut out = Vec::new();
    let mut hidden: Vec<&str> = Vec::new();
    for p in paths {
        let (bv, av) = (&side(&b, p), &side(&a, p));
        // Absent and null are the same to a reader; a sensitive value is
        // shown as changed whether it did or not (as Terraform does not
        // say either).
        if bv == av && !matches!(av, Shown::Sensitive | Shown::Unknown) {
            continue;
        }
        if out.len() >= MAX_DIFFS_PER_RESOURCE {
            hidden.push(p);
            continue;
        }
        let show = |v: &Shown| match v {
            Shown::Sensitive => json!("(sensitive value)"),
            Shown::Unknown => json!("(known after apply)"),
            Shown::Value(Value::Null) => Value::Null,
            Shown::Value(v) => json!(folded(v)),
        };
        out.push(json!({
            "path": if p.is_empty() { "(value)" } else { p.as_str() },
            "before": show(bv),
            "after": show(av),
        }));
    }
    if !hidden.is_empty() {
        // Never cut silently: what is not shown is named (a module could
        // pad a resource with changes to push one out of sight).
        let names: Vec<String> = hidden
            .iter()
            .take(200)
            .map(|n| {
                let mut s: String = n.chars().take(80).collect();
                if n.chars().count() > 80 {
                    s.push('…');
                }
                s
            })
            .collect();
        let more = hidden.len() - names.len();
        out.push(json!({
            "path": format!(
                "(and {} more changed attributes: {}{})",
                hidden.len(),
                names.join(", "),
                if more > 0 { format!(" and {more} others") } else { String::new() }
            ),
            "before": null,
            "after": null,
        }));
    }
    Value::Array(out)
}

/// Leaves by path (`tags.env`, `rule[0].port`, `data["db.password"]` for
/// a key that is not a plain name), walking the value and Terraform's
/// marker structures (`*_sensitive`, `after_unknown`: `true`, or
/// objects/arrays of them mirroring the value) together, so that a marked
/// subtree is one masked entry whatever its keys hold.
fn flatten(
    v: &Value,
    sensitive: &Value,
    unknown: &Value,
    path: String,
    depth: usize,
    out: &mut std::collections::BTreeMap<String, Shown>,
) {
    if sensitive == &Value::Bool(true) {
        out.insert(path, Shown::Sensitive);
        return;
    }
    if unknown == &Value::Bool(true) {
        out.insert(path, Shown::Unknown);
        return;
    }
    let child = |m: &Value, k: &str| m.get(k).cloned().unwrap_or(Value::Null);
    let item = |m: &Value, i: usize| m.get(i).cloned().unwrap_or(Value::Null);
    let nonempty_object = |m: &Value| m.as_object().is_some_and(|o| !o.is_empty());
    let nonempty_array = |m: &Value| m.as_array().is_some_and(|a| !a.is_empty());
    match v {
        // Deeper than this, the rest is one value (masked if anything
        // under it is marked).
        Value::Object(_) | Value::Array(_) if depth >= MAX_DEPTH => {
            let marked = |m: &Value| m.to_string().contains("true");
            let shown = if marked(sensitive) {
                Shown::Sensitive
            } else {
                Shown::Value(v.clone())
            };
            out.insert(path, shown);
        }
        // An object, or an attribute Terraform leaves out of `after` and
        // marks in `after_unknown` only (known after apply): the keys of
        // both are walked.
        Value::Object(_) | Value::Null
            if depth < MAX_DEPTH && (nonempty_object(v) || nonempty_object(unknown)) =>
        {
            let empty = serde_json::Map::new();
            let o = v.as_object().unwrap_or(&empty);
            let mut keys: Vec<&String> = o.keys().collect();
            if let Some(u) = unknown.as_object() {
                keys.extend(u.keys().filter(|k| !o.contains_key(*k)));
            }
            for k in keys {
                let name: String = k.chars().take(MAX_KEY_CHARS).collect();
                let name = if name.len() < k.len() {
                    format!("{name}…")
                } else {
                    name
                };
                let plain = !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_alphanumeric() || c == '_' || c == '-');
                let p = match (path.is_empty(), plain) {
                    (true, true) => name,
                    (false, true) => format!("{path}.{name}"),
                    (_, false) => format!("{path}[{}]", Value::String(name)),
                };
                flatten(
                    o.get(k).unwrap_or(&Value::Null),
                    &child(sensitive, k),
                    &child(unknown, k),
                    p,
                    depth + 1,
                    out,
                );
            }
        }
        Value::Array(_) | Value::Null
            if depth < MAX_DEPTH && (nonempty_array(v) || nonempty_array(unknown)) =>
        {
            let a = v.as_array().map(Vec::as_slice).unwrap_or_default();
            let n = a.len().max(unknown.as_array().map_or(0, Vec::len));
            for i in 0..n {
                flatten(
                    a.get(i).unwrap_or(&Value::Null),
                    &item(sensitive, i),
                    &item(unknown, i),
                    format!("{path}[{i}]"),
                    depth + 1,
                    out,
                );
            }
        }
        // No object at all (before a create, after a delete).
        Value::Null if path.is_empty() => {}
        v => {
            out.insert(path, Shown::Value(v.clone()));
        }
    }
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
    use serde_json::Map;

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
        let rest = diff[MAX_DIFFS_PER_RESOURCE]["path"].as_str().expect("path");
        assert!(
            rest.starts_with("(and 36 more changed attributes: k064, k065,")
                && rest.contains("k099"),
            "{rest}"
        );
    }

    #[test]
    fn a_sensitive_map_key_with_dots_or_a_marked_subtree_stays_masked() {
        let p = plan(json!({
            "actions": ["update"],
            "before": {"data": {"db.password": "hunter2", "user": "app"}, "nested": {"a": {"b": "s3cret"}}},
            "after": {"data": {"db.password": "swordfish", "user": "app2"}, "nested": {"a": {"b": "t0psecret"}}},
            "before_sensitive": {"data": {"db.password": true}, "nested": true},
            "after_sensitive": {"data": {"db.password": true}, "nested": {"a": true}},
        }));
        let d = with_diffs(&super::super::plan_summary(&p), &p);
        let text = d.to_string();
        for secret in ["hunter2", "swordfish", "s3cret", "t0psecret"] {
            assert!(!text.contains(secret), "{secret} shown: {text}");
        }
        let paths: Vec<&str> = d[0]["diff"]
            .as_array()
            .expect("diff")
            .iter()
            .filter_map(|x| x["path"].as_str())
            .collect();
        assert!(paths.contains(&"data[\"db.password\"]"), "{paths:?}");
        assert!(paths.contains(&"data.user"), "{paths:?}");
    }

    #[test]
    fn an_attribute_known_only_after_apply_says_so_and_never_reads_as_removed() {
        // As Terraform writes it: left out of `after`, marked in
        // `after_unknown` (here nested too).
        let p = plan(json!({
            "actions": ["update"],
            "before": {"output": {"image": "nginx:1.27"}, "id": "x", "tags": ["a"]},
            "after": {"id": "x", "tags": ["a"]},
            "after_unknown": {"output": true, "tags": [false, true]},
        }));
        let d = with_diffs(&super::super::plan_summary(&p), &p);
        assert_eq!(
            d[0]["diff"],
            json!([
                {"path": "output", "before": null, "after": "(known after apply)"},
                {"path": "output.image", "before": "nginx:1.27", "after": "(known after apply)"},
                {"path": "tags[1]", "before": null, "after": "(known after apply)"},
            ]),
        );
    }

    #[test]
    fn one_huge_attribute_name_is_cut_and_costs_the_others_nothing() {
        let key = "k".repeat(2 * 1024 * 1024);
        let p = plan(json!({"actions": ["create"], "before": null, "after": {key: "v"}}));
        let d = with_diffs(&super::super::plan_summary(&p), &p);
        let path = d[0]["diff"][0]["path"].as_str().expect("path");
        // `["kkk…"]`: the name cut, quoted as a name that is not plain.
        assert_eq!(path.chars().count(), MAX_KEY_CHARS + 5, "{}", &path[..20]);
        assert!(path.ends_with("…\"]"), "{}", &path[path.len() - 10..]);
    }

    #[test]
    fn past_the_budget_a_resource_says_its_diff_is_not_shown() {
        let big = "v".repeat(150);
        let mut rcs = Vec::new();
        for i in 0..5_000 {
            let after: Map<String, Value> = (0..4)
                .map(|k| (format!("k{k}"), json!(format!("{big}{i}"))))
                .collect();
            rcs.push(json!({"address": format!("r.x[{i}]"),
                            "change": {"actions": ["create"], "before": null, "after": after}}));
        }
        let p = regorus::Value::from(json!({"resource_changes": rcs}));
        let d = with_diffs(&super::super::plan_summary(&p), &p);
        let last = &d[4_999]["diff"][0]["path"];
        assert!(
            last.as_str().is_some_and(|s| s.contains("not shown")),
            "{last}"
        );
        assert!(
            d[0]["diff"][0]["after"]
                .as_str()
                .is_some_and(|s| s.starts_with("vvv"))
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
