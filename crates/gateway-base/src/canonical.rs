//! Canonical JSON and SHA-256 digests: the same value always hashes the same
//! (object keys sorted at every depth, no insignificant whitespace).

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Canonical JSON text of `value`: serde_json's compact text of the value
/// with the keys of every object sorted, written straight from the value
/// (no sorted copy of it is made first).
pub fn canonical_json(value: &Value) -> String {
    let mut out = Vec::new();
    write_canonical(value, &mut out);
    // Only serde_json's text (UTF-8) and ASCII punctuation were written.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Append the canonical JSON of `value` to `out`: the bytes serde_json's
/// compact serializer gives for a copy with every object's keys sorted.
pub fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    // Writing a serde_json value or string into a Vec cannot fail.
    match value {
        Value::Object(m) => write_canonical_object(m, |_| true, out),
        Value::Array(a) => {
            out.push(b'[');
            for (i, v) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(v, out);
            }
            out.push(b']');
        }
        scalar => {
            let _ = serde_json::to_writer(&mut *out, scalar);
        }
    }
}

/// Append the canonical JSON of the object `m` with only the keys `keep`
/// keeps (as [`write_canonical`] writes an object).
pub fn write_canonical_object(
    m: &serde_json::Map<String, Value>,
    keep: impl Fn(&str) -> bool,
    out: &mut Vec<u8>,
) {
    let mut entries: Vec<(&String, &Value)> = m.iter().filter(|(k, _)| keep(k)).collect();
    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    out.push(b'{');
    for (i, (k, v)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // Writing a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, k.as_str());
        out.push(b':');
        write_canonical(v, out);
    }
    out.push(b'}');
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

    /// The old way: a copy with every object's keys sorted, then serde_json.
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                Value::Object(
                    keys.into_iter()
                        .map(|k| (k.clone(), sorted(&m[k])))
                        .collect(),
                )
            }
            Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }

    proptest::proptest! {
        /// Written straight from the value, the text is byte for byte what
        /// serde_json gives for a sorted copy (as it was made before): every
        /// hash already in a log stays the same.
        #[test]
        fn the_writer_gives_serde_json_text_of_a_sorted_copy(v in json_tree()) {
            proptest::prop_assert_eq!(canonical_json(&v), serde_json::to_string(&sorted(&v)).expect("json"));
        }
    }

    fn json_tree() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            any::<String>().prop_map(Value::String),
            text().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::vec((prop_oneof![any::<String>(), text()], inner), 0..8)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// Short strings of what JSON escapes or sorts awkwardly (control
    /// characters, quotes, backslashes, U+2028, a BOM, letters that differ
    /// only in case, a prefix and its extension), which `any::<String>()`
    /// never makes (it leaves control characters out).
    fn text() -> impl proptest::strategy::Strategy<Value = String> {
        "[\\x00-\\x1f\\x7f\"\\\\aAbB_é\u{2028}\u{feff}😀]{0,6}"
    }

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
