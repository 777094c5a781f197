//! Canonical JSON, over which the audit chain, approvals and policy
//! bundles compute their digests (`audit verify` recomputes them from a
//! log that may have been tampered with). Any JSON a parser accepts has
//! one canonical form: it parses back, and is its own canonical form (so
//! two readers of the same value always agree on its digest).
#![no_main]

use gateway_base::canonical::{canonical_json, sha256_hex};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let c = canonical_json(&v);
    let back: serde_json::Value = serde_json::from_str(&c)
        .unwrap_or_else(|e| panic!("the canonical form does not parse ({e}): {c:?}"));
    assert_eq!(back, v, "the canonical form is another value: {c:?}");
    assert_eq!(canonical_json(&back), c, "not its own canonical form");
    assert_eq!(
        sha256_hex(canonical_json(&back).as_bytes()),
        sha256_hex(c.as_bytes())
    );
});
