//! Canonical JSON and SHA-256 digests: the same value always hashes the same
//! (object keys sorted at every depth, no insignificant whitespace).

use serde_json::Value;
use sha2::{Digest, Sha256};

/// `value` with the keys of every object sorted.
pub fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let mut out = serde_json::Map::with_capacity(m.len());
            for k in keys {
                out.insert(k.clone(), sorted(&m[k]));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// Canonical JSON text of `value`.
pub fn canonical_json(value: &Value) -> String {
    // Serializing a serde_json::Value cannot fail (all keys are strings).
    serde_json::to_string(&sorted(value)).unwrap_or_default()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The digest an approval is bound to: SHA-256 of the canonical JSON of
/// `{"params": …, "tool": …}`.
pub fn call_digest(tool: &str, params: &Value) -> String {
    sha256_hex(canonical_json(&serde_json::json!({"tool": tool, "params": params})).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_and_whitespace_do_not_change_the_digest() {
        let a: Value =
            serde_json::from_str(r#"{"b": 1, "a": {"y": [1, {"d": 2, "c": 3}], "x": null}}"#)
                .expect("json");
        let b: Value =
            serde_json::from_str(r#"{"a":{"x":null,"y":[1,{"c":3,"d":2}]},"b":1}"#).expect("json");
        assert_eq!(
            canonical_json(&a),
            r#"{"a":{"x":null,"y":[1,{"c":3,"d":2}]},"b":1}"#
        );
        assert_eq!(call_digest("t", &a), call_digest("t", &b));
        assert_ne!(call_digest("t", &a), call_digest("u", &a));
        assert_ne!(
            call_digest("t", &json!({"a": 1})),
            call_digest("t", &json!({"a": "1"}))
        );
    }
}
