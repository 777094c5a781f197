//! Reading Terraform plan JSON (`terraform show -json PLANFILE`) for the
//! policy input. This only checks that the bytes are a plan document; what
//! the plan means is decided by the policy (`policies/signals.rego`).

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("cannot read plan {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "plan {path} is {encoding}; Terraform writes plain UTF-8 JSON (was it re-saved by an editor or a shell redirect?)"
    )]
    Encoding {
        path: String,
        encoding: &'static str,
    },
    #[error("plan {path} is not valid JSON: {message}")]
    Json { path: String, message: String },
    #[error(
        "{path} is not a Terraform plan: {message} (expected the output of `terraform show -json PLANFILE`)"
    )]
    NotAPlan { path: String, message: String },
}

/// Read and check a plan file.
pub fn read_plan_file(path: &Path) -> Result<serde_json::Value, PlanError> {
    parse_plan(&read_bytes(path)?, &path.display().to_string())
}

/// The bytes of a plan file, unchecked.
pub fn read_bytes(path: &Path) -> Result<Vec<u8>, PlanError> {
    std::fs::read(path).map_err(|source| PlanError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// Check and parse plan JSON bytes. `origin` names them in errors.
pub fn parse_plan(bytes: &[u8], origin: &str) -> Result<serde_json::Value, PlanError> {
    let value = parse_plan_value(bytes, origin)?;
    serde_json::to_value(&value).map_err(|e| PlanError::Json {
        path: origin.to_string(),
        message: e.to_string(),
    })
}

/// Check and parse plan JSON bytes straight into the policy's value: the
/// one parse of a plan the gateway acts on (what the policy decides on and
/// what the approver is shown come from the same parse, never from two
/// parsers that could read hostile bytes differently).
pub fn parse_plan_value(bytes: &[u8], origin: &str) -> Result<regorus::Value, PlanError> {
    let enc = |encoding| PlanError::Encoding {
        path: origin.to_string(),
        encoding,
    };
    if bytes.starts_with(&[0xEF, 0xBB, 0xBF]) {
        return Err(enc("UTF-8 with a byte order mark"));
    }
    if bytes.starts_with(&[0xFF, 0xFE]) || bytes.starts_with(&[0xFE, 0xFF]) {
        return Err(enc("UTF-16 (it starts with a UTF-16 byte order mark)"));
    }
    if bytes.iter().take(64).any(|b| *b == 0) {
        return Err(enc("UTF-16 or binary (it contains NUL bytes)"));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| enc("not valid UTF-8"))?;
    let value = regorus::Value::from_json_str(text).map_err(|e| PlanError::Json {
        path: origin.to_string(),
        message: e.to_string(),
    })?;
    let not_a_plan = |message: String| PlanError::NotAPlan {
        path: origin.to_string(),
        message,
    };
    let obj = value.as_object().map_err(|_| {
        not_a_plan(format!(
            "the document is {}, not an object",
            value_kind(&value)
        ))
    })?;
    let key = |k: &str| obj.get(&regorus::Value::from(k));
    match key("format_version") {
        Some(regorus::Value::String(_)) => {}
        Some(other) => {
            return Err(not_a_plan(format!(
                "format_version is {}, not a string",
                value_kind(other)
            )));
        }
        None => return Err(not_a_plan("it has no format_version".into())),
    }
    if key("planned_values").is_none() {
        let hint = if key("values").is_some() {
            "it has `values` but no `planned_values`: this looks like state (`terraform show -json` without a plan file)"
        } else {
            "it has no planned_values"
        };
        return Err(not_a_plan(hint.into()));
    }
    Ok(value)
}

/// What kind of JSON value `v` is, for messages.
fn value_kind(v: &regorus::Value) -> &'static str {
    match v {
        regorus::Value::Null => "null",
        regorus::Value::Bool(_) => "a boolean",
        regorus::Value::Number(_) => "a number",
        regorus::Value::String(_) => "a string",
        regorus::Value::Array(_) => "an array",
        regorus::Value::Object(_) => "an object",
        _ => "not JSON",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(bytes: &[u8]) -> String {
        parse_plan(bytes, "p.json")
            .expect_err("should be refused")
            .to_string()
    }

    #[test]
    fn accepts_a_minimal_plan() {
        let v = parse_plan(br#"{"format_version":"1.2","planned_values":{}}"#, "p").expect("plan");
        assert_eq!(v["format_version"], "1.2");
    }

    #[test]
    fn refuses_boms_utf16_and_bad_utf8_with_a_clear_error() {
        let plan = r#"{"format_version":"1.2","planned_values":{}}"#;
        let mut bom = vec![0xEF, 0xBB, 0xBF];
        bom.extend_from_slice(plan.as_bytes());
        assert!(err(&bom).contains("byte order mark"));
        let mut utf16le = vec![0xFF, 0xFE];
        utf16le.extend(plan.encode_utf16().flat_map(|u| u.to_le_bytes()));
        assert!(err(&utf16le).contains("UTF-16"));
        let no_bom: Vec<u8> = plan.encode_utf16().flat_map(|u| u.to_le_bytes()).collect();
        assert!(err(&no_bom).contains("NUL bytes"));
        assert!(err(b"{\"a\":\"\xff\"}").contains("not valid UTF-8"));
    }

    #[test]
    fn hostile_plan_json_is_refused_or_read_one_way() {
        // Nesting deep enough to overflow a recursive parser is refused.
        let deep = format!(
            r#"{{"format_version":"1.2","planned_values":{{}},"x":{}1{}}}"#,
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert!(err(deep.as_bytes()).contains("not valid JSON"));
        // Bytes after the document are refused, not ignored.
        assert!(
            err(br#"{"format_version":"1.2","planned_values":{}} {"x":1}"#)
                .contains("not valid JSON")
        );
        // A key given twice: the policy and the approver's summary read the
        // same value (one parse), never one each.
        let twice = br#"{"format_version":"1.2","planned_values":{},"resource_changes":[
            {"address":"a.b","change":{"actions":["no-op"],"actions":["delete"]}}]}"#;
        let v = parse_plan_value(twice, "p").expect("plan");
        assert_eq!(
            v["resource_changes"][0]["change"]["actions"],
            regorus::Value::from(vec![regorus::Value::from("delete")])
        );
        // (The approval's summary of the same plan, which reads the same
        // value: gateway-audit's `plan_summary_reads_the_one_parse`.)
    }

    #[test]
    fn refuses_documents_that_are_not_plans() {
        assert!(err(b"{not json").contains("not valid JSON"));
        assert!(err(b"[1,2]").contains("an array, not an object"));
        assert!(err(br#"{"planned_values":{}}"#).contains("no format_version"));
        assert!(
            err(br#"{"format_version":1,"planned_values":{}}"#)
                .contains("format_version is a number")
        );
        assert!(err(br#"{"format_version":"1.0","values":{}}"#).contains("looks like state"));
    }
}
