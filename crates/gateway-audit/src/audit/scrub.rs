//! Scrubbing secrets out of audit data before it is written.
//!
//! Recursively through objects and arrays: the value of any key whose name
//! says it holds a secret (token, secret, password, authorization,
//! credential, client_key, …) is replaced when it is a string or number;
//! objects under such keys are scrubbed recursively (so a decision's
//! `credential: {mount, role, params}` keeps its scope). Anywhere in any
//! string (and in keys), JWT-shaped strings, Vault/OpenBao tokens (`hvs.`,
//! `hvb.`, `hvr.`, legacy `s.`/`b.`/`r.`), bearer credentials and PEM private
//! keys are cut out. Lease ids, scopes, TTLs and role names are kept.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

pub const REDACTED: &str = "<redacted>";

/// Key names (lowercased, substring match) whose scalar values are secrets.
const SECRET_KEY_PARTS: &[&str] = &[
    "token",
    "secret",
    "password",
    "passwd",
    "passphrase",
    "authorization",
    "credential",
    "client_key",
    "private_key",
    "api_key",
    "apikey",
    "cookie",
    "session",
];

/// Keys that contain a secret-sounding word but hold no secret.
const SAFE_KEYS: &[&str] = &[
    "lease_id",
    "token_ttl",
    "token_type",
    "token_policies",
    "lease_duration",
    // A WebAuthn credential id: public (every sign-in sends it to the
    // browser in allowCredentials); the audit names which passkey signed
    // in or registered by it. A secret-shaped value under it is still cut.
    "credential_id",
];

static SECRET_VALUE: LazyLock<Regex> = LazyLock::new(|| {
    // The patterns are constants; a failure here is a bug caught by the tests.
    Regex::new(concat!(
        r"eyJ[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]*", // JWT
        r"|\b(?:hv[sbr]|[sbr])\.[A-Za-z0-9_-]{20,}",                // Vault / OpenBao tokens
        r"|(?i:bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}",             // Authorization values
        r"|-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)", // PEM keys
    ))
    .expect("the secret patterns are valid regular expressions")
});

/// Whether `key`, lowercased (ASCII), holds one of [`SECRET_KEY_PARTS`]
/// and is none of [`SAFE_KEYS`]. Every key of every event is asked, so the
/// key is searched in place rather than lowercased into a new string.
fn is_secret_key(key: &str) -> bool {
    let k = key.as_bytes();
    let holds_part = (0..k.len()).any(|at| {
        SECRET_KEY_PARTS.iter().any(|part| {
            k.get(at..at + part.len())
                .is_some_and(|here| here.eq_ignore_ascii_case(part.as_bytes()))
        })
    });
    holds_part && !SAFE_KEYS.iter().any(|safe| key.eq_ignore_ascii_case(safe))
}

/// Whether `s` could hold a match of [`SECRET_VALUE`]: every match is 9
/// bytes or longer and holds a `.` (a JWT, a Vault token), white space (an
/// authorization value; the pattern's `\s` is Unicode White_Space, which
/// is what `char::is_whitespace` tests) or a `-` (a PEM key). Most keys and
/// values hold none of these and are passed by without a regex search.
fn may_hold_secret(s: &str) -> bool {
    s.len() >= 9 && s.chars().any(|c| c == '.' || c == '-' || c.is_whitespace())
}

/// Cut secret-shaped substrings out of a string.
pub fn scrub_str(s: &str) -> String {
    if !may_hold_secret(s) {
        return s.to_owned();
    }
    SECRET_VALUE.replace_all(s, REDACTED).into_owned()
}

/// A scrubbed copy of `value` ([`scrub_owned`] of a copy).
pub fn scrub(value: &Value) -> Value {
    scrub_owned(value.clone())
}

/// `value` scrubbed, in place: what needs no change is not copied.
pub fn scrub_owned(mut value: Value) -> Value {
    scrub_in_place(&mut value, false);
    value
}

fn scrub_in_place(value: &mut Value, secret_key: bool) {
    match value {
        Value::String(s) if secret_key && !s.is_empty() => *s = REDACTED.into(),
        Value::Number(_) if secret_key => *value = Value::String(REDACTED.into()),
        Value::String(s) => {
            if may_hold_secret(s)
                && let std::borrow::Cow::Owned(cut) = SECRET_VALUE.replace_all(s, REDACTED)
            {
                *s = cut;
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|v| scrub_in_place(v, secret_key)),
        Value::Object(m) => {
            if m.keys()
                .any(|k| may_hold_secret(k) && SECRET_VALUE.is_match(k))
            {
                // A key to cut (rare): the object is made again, in order.
                for (k, mut v) in std::mem::take(m) {
                    scrub_in_place(&mut v, is_secret_key(&k));
                    m.insert(scrub_str(&k), v);
                }
            } else {
                for (k, v) in m.iter_mut() {
                    scrub_in_place(v, is_secret_key(k));
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const JWT: &str = "eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ.c2lnbmF0dXJlLWJ5dGVz";
    const HVS: &str = "hvs.CAESIJ3kq2m9x0Zr7Yt5UvWbXcDeFgHiJkLmNoPqRsTuVwX";

    /// The search in place folds only the key's case: it finds what
    /// lowercasing finds only while every part and safe key is lowercase
    /// ASCII and not empty.
    #[test]
    fn the_key_lists_are_lowercase_ascii() {
        for k in SECRET_KEY_PARTS.iter().chain(SAFE_KEYS) {
            assert!(
                !k.is_empty() && k.bytes().all(|b| b.is_ascii() && !b.is_ascii_uppercase()),
                "{k:?}"
            );
        }
    }

    proptest! {
        /// The search in place says what lowercasing the key and looking
        /// for each part in it (as it was done before) says.
        #[test]
        fn a_secret_key_is_found_as_lowercasing_finds_it(
            key in prop_oneof![
                "[a-zA-Z_]{0,24}",
                "(?i)[a-z_]{0,6}(token|secret|passw(or)?d|session|client_key|api_?key|cookie)[a-z_]{0,6}",
                "(?i)(lease_id|token_ttl|token_type|token_policies|lease_duration|credential_id)",
                "\\PC{0,12}",
            ]
        ) {
            let lower = key.to_ascii_lowercase();
            let before = !SAFE_KEYS.contains(&lower.as_str())
                && SECRET_KEY_PARTS.iter().any(|p| lower.contains(p));
            prop_assert_eq!(is_secret_key(&key), before, "{}", key);
        }
    }

    #[test]
    fn keeps_scopes_lease_ids_and_ttls() {
        let v = json!({
            "credential": {"kind": "pod_reader", "type": "kubernetes", "mount": "kubernetes", "role": "gateway-pod-reader-demo-app", "params": {"kubernetes_namespace": "demo-app", "ttl": "10m"}},
            "lease_id": "kubernetes/creds/gateway-pod-reader-demo-app/AbCdEf123",
            "token_ttl": 600,
            "credential_id": "webauthn:mN3kP0aLq2Xv",
        });
        assert_eq!(scrub(&v), v);
        // A secret-shaped value under it is still cut.
        let hidden = scrub(&json!({"credential_id": HVS}));
        assert!(!hidden.to_string().contains(HVS), "{hidden}");
    }

    #[test]
    fn removes_secrets_by_key_and_by_shape() {
        let v = json!({
            "service_account_token": "opaque-but-secret",
            "Authorization": "Bearer abcdefghijklmnop",
            "nested": [{"password": 12345}, {"note": format!("token was {HVS} ok")}],
            "jwt_anywhere": format!("x {JWT} y"),
            JWT: "a JWT used as a key",
            "legacy": "s.AbCdEfGhIjKlMnOpQrStUvWx",
            "pem": "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----",
        });
        let out = serde_json::to_string(&scrub(&v)).expect("json");
        for secret in [
            "opaque-but-secret",
            "abcdefghijklmnop",
            "12345",
            HVS,
            JWT,
            "s.AbCdEf",
            "MIIE",
        ] {
            assert!(!out.contains(secret), "{secret} leaked: {out}");
        }
        assert!(out.contains("token was <redacted> ok"), "{out}");
    }

    fn secret() -> impl Strategy<Value = String> {
        prop_oneof![
            "[A-Za-z0-9_-]{20,40}".prop_map(|s| format!("hvs.{s}")),
            "[A-Za-z0-9_-]{24,40}".prop_map(|s| format!("s.{s}")),
            (
                "[A-Za-z0-9_-]{10,30}",
                "[A-Za-z0-9_-]{10,60}",
                "[A-Za-z0-9_-]{10,40}"
            )
                .prop_map(|(a, b, c)| format!("eyJ{a}.{b}.{c}")),
        ]
    }

    /// A JSON tree (plain keys and values) with one secret planted at a
    /// random place: as a value, inside a longer string, as a key, or as an
    /// opaque value under a secret-named key.
    fn tree_with_secret() -> impl Strategy<Value = (Value, String)> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            "[a-z ]{0,12}".prop_map(Value::String),
        ];
        let tree = leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("[a-z_]{1,8}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        });
        (
            tree,
            secret(),
            0usize..4,
            any::<prop::sample::Index>(),
            "[a-z]{1,6}",
            "[a-z ]{0,8}",
        )
            .prop_map(|(mut tree, secret, how, at, key, pad)| {
                let planted = match how {
                    0 => Value::String(secret.clone()),
                    1 => Value::String(format!("{pad} {secret} {pad}")),
                    2 => json!({ secret.clone(): pad }),
                    _ => json!({ format!("{key}_token"): format!("opaque{}", secret.len()) }),
                };
                let needle = if how == 3 {
                    format!("opaque{}", secret.len())
                } else {
                    secret
                };
                plant(&mut tree, planted, at);
                (tree, needle)
            })
    }

    fn containers(v: &Value) -> usize {
        match v {
            Value::Array(a) => 1 + a.iter().map(containers).sum::<usize>(),
            Value::Object(m) => 1 + m.values().map(containers).sum::<usize>(),
            _ => 0,
        }
    }

    /// Put `planted` into the n-th container (depth-first) of `v`.
    fn plant_at(v: &mut Value, planted: &Value, n: &mut usize) -> bool {
        let here = *n == 0;
        match v {
            Value::Array(a) => {
                if here {
                    a.push(planted.clone());
                    return true;
                }
                *n -= 1;
                a.iter_mut().any(|x| plant_at(x, planted, n))
            }
            Value::Object(m) => {
                if here {
                    m.insert("planted".into(), planted.clone());
                    return true;
                }
                *n -= 1;
                m.values_mut().any(|x| plant_at(x, planted, n))
            }
            _ => false,
        }
    }

    fn plant(tree: &mut Value, planted: Value, at: prop::sample::Index) {
        let count = containers(tree);
        if count == 0 {
            *tree = json!([planted]);
            return;
        }
        let mut n = at.index(count);
        plant_at(tree, &planted, &mut n);
    }

    /// Scrubbing as it was before [`may_hold_secret`] and
    /// [`scrub_owned`]: every key and string through the regex, a copy.
    fn reference(value: &Value, secret_key: bool) -> Value {
        let cut = |s: &str| SECRET_VALUE.replace_all(s, REDACTED).into_owned();
        match value {
            Value::String(s) if secret_key && !s.is_empty() => Value::String(REDACTED.into()),
            Value::Number(_) if secret_key => Value::String(REDACTED.into()),
            Value::String(s) => Value::String(cut(s)),
            Value::Array(a) => Value::Array(a.iter().map(|v| reference(v, secret_key)).collect()),
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, v)| (cut(k), reference(v, is_secret_key(k))))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    /// Strings near the patterns: pieces of them, with the separators the
    /// prefilter looks for (and some it does not) in any order.
    fn near_secret() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("eyJ".to_string()),
            Just("hvs".to_string()),
            Just("s".to_string()),
            Just("Bearer".to_string()),
            Just("BASIC".to_string()),
            Just("-----BEGIN RSA PRIVATE KEY-----".to_string()),
            Just("-----END RSA PRIVATE KEY-----".to_string()),
            "[A-Za-z0-9_]{1,24}",
            "[.\\- \t\n\u{a0}\u{2003}\u{3000}:/=~+]{1,2}",
            // The shortest matches (9 bytes), and one byte short of them.
            "eyJ[a-z]{2}\\.[a-z]{2}\\.[a-z]{0,2}",
            "eyJ[a-z]{1,2}\\.[a-z]{1,2}",
            "[sbr]\\.[A-Za-z0-9]{19,21}",
            "(bearer|Basic) [a-z]{7,9}",
        ];
        prop::collection::vec(piece, 0..8).prop_map(|p| p.concat())
    }

    proptest! {
        #[test]
        fn a_planted_secret_never_survives_scrubbing((tree, needle) in tree_with_secret()) {
            let out = serde_json::to_string(&scrub(&tree)).expect("json");
            prop_assert!(!out.contains(&needle), "secret {} leaked in {}", needle, out);
            let owned = serde_json::to_string(&scrub_owned(tree.clone())).expect("json");
            prop_assert!(!owned.contains(&needle), "secret {} leaked in {}", needle, owned);
        }

        #[test]
        fn the_prefilter_and_the_in_place_scrub_change_nothing(
            (tree, _) in tree_with_secret(),
            s in near_secret(),
            any_s in any::<String>(),
        ) {
            // As text: map equality would not see keys out of order.
            let text = |v: &Value| serde_json::to_string(v).expect("json");
            let want = text(&reference(&tree, false));
            prop_assert_eq!(text(&scrub(&tree)), want.clone());
            prop_assert_eq!(text(&scrub_owned(tree)), want);
            for s in [s, any_s] {
                prop_assert_eq!(scrub_str(&s), SECRET_VALUE.replace_all(&s, REDACTED).into_owned());
                // Two keys that scrub to the same one, around plain keys.
                let v = json!({"a": 1, s.clone(): [s.clone()], "k": s.clone(), format!("{s}{s}"): 2, "token": s.clone()});
                prop_assert_eq!(text(&scrub_owned(v.clone())), text(&reference(&v, false)));
            }
        }
    }
}
