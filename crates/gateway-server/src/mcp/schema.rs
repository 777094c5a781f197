//! The schemas tools/list shows: each tool's input schema from its policy
//! param specs, and each tool's output schema from the result its runner
//! returns, so that a client can validate every `structuredContent`.

use serde_json::{Map, Value, json};

use gateway_core::pipeline::runners;

/// The input schema of a tool from its policy param specs: strings with
/// the policy's length limit and pattern, integers with their range,
/// booleans, each with its description and the values the policy allows
/// when it lists them (`enum`), and nothing else accepted.
pub fn input_schema(params: &Value) -> Map<String, Value> {
    let mut props = Map::new();
    let mut required = Vec::new();
    if let Some(p) = params.as_object() {
        for (name, spec) in p {
            let mut s = match spec.get("type").and_then(Value::as_str) {
                Some("integer") => {
                    let mut s = json!({"type": "integer"});
                    for (from, to) in [("minimum", "minimum"), ("maximum", "maximum")] {
                        if let Some(n) = spec.get(from).filter(|n| n.is_number()) {
                            s[to] = n.clone();
                        }
                    }
                    s
                }
                Some("boolean") => json!({"type": "boolean"}),
                _ => json!({"type": "string", "minLength": 1}),
            };
            if s["type"] == "string" {
                if let Some(max) = spec.get("max_length").and_then(Value::as_u64) {
                    s["maxLength"] = max.into();
                }
                if let Some(pattern) = spec.get("pattern").and_then(Value::as_str) {
                    s["pattern"] = pattern.into();
                }
            }
            if let Some(d) = spec.get("description").and_then(Value::as_str) {
                s["description"] = d.trim().into();
            }
            if let Some(choices) = spec.get("enum").and_then(Value::as_array) {
                let strings: Vec<Value> =
                    choices.iter().filter(|c| c.is_string()).cloned().collect();
                s["enum"] = Value::Array(strings);
            }
            props.insert(name.clone(), s);
            if spec
                .get("required")
                .and_then(Value::as_bool)
                .unwrap_or(false)
            {
                required.push(Value::String(name.clone()));
            }
        }
    }
    let mut schema = Map::new();
    schema.insert("type".into(), "object".into());
    schema.insert("properties".into(), Value::Object(props));
    schema.insert("required".into(), Value::Array(required));
    schema.insert("additionalProperties".into(), false.into());
    schema
}

/// The output schema of a tool whose catalog entry names `runner`: what
/// the gateway answers (denied, pending approval, refused, completed), with
/// the runner's own result for a completed call. A runner this gateway does
/// not have gets `{}` as its result (such a call is always refused).
pub fn output_schema(runner: Option<&str>) -> Map<String, Value> {
    let result = runner
        .and_then(runners::by_name)
        .map(|r| r.result_schema())
        .unwrap_or_else(|| json!({"description": "this gateway has no runner for the tool: its calls are refused"}));
    let v = json!({
        "type": "object",
        "required": ["request_id", "tool", "status"],
        "additionalProperties": false,
        "properties": {
            "request_id": {"type": "string", "description": "the call's id in the audit log"},
            "tool": {"type": "string"},
            "status": {"type": "string", "enum": ["denied", "pending_approval", "refused", "completed"]},
            "reasons": {"description": "why the policy denied the call", "type": "array", "items": {"type": "string"}},
            "violations": {"description": "what is wrong with the arguments, one per param",
                "type": "array", "items": {"type": "object", "required": ["param", "problem", "message"],
                "additionalProperties": false,
                "properties": {"param": {"type": "string"}, "problem": {"type": "string"}, "message": {"type": "string"}}}},
            "reason": {"description": "why a later check refused the call", "type": "string"},
            "approval_id": {"type": "string"},
            "approve_command": {"description": "what an operator runs to approve (never reachable over MCP)", "type": "string"},
            "review_url": {"description": "the approval page where a person reviews and decides this approval: show it to your user", "type": "string"},
            "signals": runners::signals_schema(),
            "changes": runners::changes_schema(),
            "ok": {"type": "boolean", "description": "false when the tool failed in its sandbox"},
            "summary": {"type": "string"},
            "result": result
        },
        "anyOf": [
            {"properties": {"status": {"const": "denied"}}, "required": ["reasons"]},
            {"properties": {"status": {"const": "pending_approval"}},
             "required": ["approval_id", "approve_command", "signals", "changes"]},
            {"properties": {"status": {"const": "refused"}}, "required": ["reason"]},
            {"properties": {"status": {"const": "completed"}}, "required": ["ok", "summary", "result"]}
        ]
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The input schema of an upstream MCP server's tool: the one the
/// operator locked, with the gateway's own params (approval_id) added as
/// optional properties.
pub fn pinned_input_schema(pinned: &Map<String, Value>, params: &Value) -> Map<String, Value> {
    let mut schema = pinned.clone();
    let ours = input_schema(params);
    if let Some(Value::Object(props)) = ours.get("properties") {
        let entry = schema
            .entry("properties")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(theirs) = entry.as_object_mut() {
            for (k, v) in props {
                theirs.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    schema
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_become_an_enum_of_strings_and_descriptions_are_kept() {
        let s = input_schema(&json!({
            "namespace": {"required": true, "max_length": 63, "description": " The ns. ", "enum": ["a", 5, "b"]},
            "approval_id": {"max_length": 100}
        }));
        assert_eq!(s["properties"]["namespace"]["enum"], json!(["a", "b"]));
        assert_eq!(s["properties"]["namespace"]["description"], "The ns.");
        assert_eq!(s["properties"]["namespace"]["maxLength"], 63);
        assert!(s["properties"]["approval_id"].get("enum").is_none());
        assert_eq!(s["required"], json!(["namespace"]));
        assert_eq!(s["additionalProperties"], false);
    }

    #[test]
    fn integers_booleans_and_patterns_keep_their_type_and_bounds() {
        let s = input_schema(&json!({
            "tail_lines": {"type": "integer", "minimum": 1, "maximum": 2000, "max_length": 9},
            "previous": {"type": "boolean", "pattern": "x"},
            "name": {"max_length": 253, "pattern": "^[a-z]+$"}
        }));
        let p = &s["properties"];
        assert_eq!(
            p["tail_lines"],
            json!({"type": "integer", "minimum": 1, "maximum": 2000})
        );
        assert_eq!(p["previous"], json!({"type": "boolean"}));
        assert_eq!(
            p["name"],
            json!({"type": "string", "minLength": 1, "maxLength": 253, "pattern": "^[a-z]+$"})
        );
    }

    #[test]
    fn each_runner_has_its_own_result_in_the_output_schema() {
        let plan = output_schema(Some("terraform_plan"));
        let apply = output_schema(Some("terraform_apply"));
        let pods = output_schema(Some("kubectl_get_pods"));
        assert_eq!(
            plan["properties"]["result"]["required"],
            json!(["changes", "signals", "plan_sha256", "sandbox_ms"])
        );
        assert!(apply["properties"]["result"]["properties"]["state"].is_object());
        assert_eq!(
            pods["properties"]["result"]["anyOf"]
                .as_array()
                .map(Vec::len),
            Some(3)
        );
        let none = output_schema(Some("rm_rf"));
        assert!(none["properties"]["result"].get("type").is_none());
    }
}
