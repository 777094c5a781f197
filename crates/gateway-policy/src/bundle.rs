//! Signed policy bundles, in OPA's bundle format.
//!
//! A bundle is a gzipped tar of the policy set's files (`.rego` modules,
//! `data.json` / `data.yaml` data, mounted at their directory's path), a
//! `.manifest` (JSON: `revision`, `roots`) and a `.signatures.json`:
//! `{"signatures": ["<JWT>"]}`, one compact JWS whose payload lists every
//! file with its digest (`{"files": [{"name", "hash", "algorithm"}]}`) and
//! whose header names the signing key (`kid`; the older `keyid` claim is
//! read too). A digest is SHA-256 of the file's bytes, except for the
//! structured files (`data.json`, `data.yaml`, `.manifest`): those are
//! hashed over a canonical JSON form (object keys sorted, no whitespace,
//! numbers as written), so that reformatting does not change them. This is
//! what `opa build --signing-key` and `opa sign` write and what OPA checks.
//!
//! The daemon loads a bundle only when the signature verifies with one of
//! the keys in its configuration (the algorithm comes from the key, never
//! from the token), every file in the bundle is listed with its digest and
//! every listed file is in the bundle. A half-written or tampered bundle
//! therefore never loads: its digests or its signature do not match.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::Digest;

/// The signature file at the bundle's root.
pub const SIGNATURES: &str = ".signatures.json";
/// The manifest at the bundle's root.
pub const MANIFEST: &str = ".manifest";
/// The most a bundle may hold, unpacked, and its most files: a bundle is
/// read whole into memory before it is verified.
pub const MAX_UNPACKED_BYTES: u64 = 64 << 20;
pub const MAX_FILES: usize = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("the bundle cannot be read as a gzipped tar: {0}")]
    Archive(String),
    #[error("the bundle is refused: {0}")]
    Refused(String),
    #[error("the bundle's signature does not verify: {0}")]
    Signature(String),
    #[error("{path}: {message}")]
    Key { path: PathBuf, message: String },
    #[error("{0}")]
    Io(String),
}

/// One file of a bundle: its name (relative, `/`-separated) and bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleFile {
    pub name: String,
    pub bytes: Vec<u8>,
}

/// A file's entry in the signature's payload (OPA's `FileInfo`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileInfo {
    pub name: String,
    pub hash: String,
    pub algorithm: String,
}

/// Read a gzipped tar: regular files only (a link, device or fifo is
/// refused), names taken relative (a leading `/` or `./` dropped, `..`
/// refused), no name twice, within [`MAX_UNPACKED_BYTES`] and
/// [`MAX_FILES`]. Directory entries are skipped.
pub fn unpack(gz: &[u8]) -> Result<Vec<BundleFile>, BundleError> {
    let archive_err = |e: std::io::Error| BundleError::Archive(e.to_string());
    // One byte more than allowed is read, so that too much is seen as such.
    let decoded = flate2::read::GzDecoder::new(gz).take(MAX_UNPACKED_BYTES + 1024 * 1024);
    let mut archive = tar::Archive::new(decoded);
    let mut files = Vec::new();
    let mut names = BTreeSet::new();
    let mut total = 0u64;
    for entry in archive.entries().map_err(archive_err)? {
        let mut entry = entry.map_err(archive_err)?;
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            continue;
        }
        let path = entry.path().map_err(archive_err)?.into_owned();
        let shown = path.display().to_string();
        if !kind.is_file() {
            return Err(BundleError::Refused(format!(
                "{shown:?} is not a regular file ({kind:?}): a bundle holds only files"
            )));
        }
        let name = relative_name(&path).ok_or_else(|| {
            BundleError::Refused(format!(
                "{shown:?} is not a relative path inside the bundle"
            ))
        })?;
        if !names.insert(name.clone()) {
            return Err(BundleError::Refused(format!(
                "{name:?} is in the bundle twice"
            )));
        }
        if names.len() > MAX_FILES {
            return Err(BundleError::Refused(format!("more than {MAX_FILES} files")));
        }
        total = total.saturating_add(entry.size());
        if total > MAX_UNPACKED_BYTES {
            return Err(BundleError::Refused(format!(
                "more than {} MiB unpacked",
                MAX_UNPACKED_BYTES >> 20
            )));
        }
        let mut bytes = Vec::new();
        (&mut entry)
            .take(MAX_UNPACKED_BYTES)
            .read_to_end(&mut bytes)
            .map_err(archive_err)?;
        files.push(BundleFile { name, bytes });
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(files)
}

/// `a/./b` -> `a/b`; a leading `/` dropped; `..` or an empty name: `None`.
fn relative_name(path: &Path) -> Option<String> {
    use std::path::Component;
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => parts.push(p.to_str()?.to_string()),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// Pack files into a gzipped tar, reproducibly: sorted by name, mode
/// 0644, owner 0, time 0.
pub fn pack(files: &[BundleFile]) -> Result<Vec<u8>, BundleError> {
    let io = |e: std::io::Error| BundleError::Io(format!("writing the bundle: {e}"));
    let mut sorted: Vec<&BundleFile> = files.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    tar.mode(tar::HeaderMode::Deterministic);
    for f in sorted {
        let mut h = tar::Header::new_gnu();
        h.set_size(f.bytes.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        h.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut h, &f.name, f.bytes.as_slice())
            .map_err(io)?;
    }
    tar.into_inner().map_err(io)?.finish().map_err(io)
}

/// Whether OPA hashes this file over its canonical JSON form.
fn structured(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    matches!(
        base,
        "data.json" | "data.yaml" | ".manifest" | "signatures.json"
    )
}

/// The digest OPA's signature lists for a file, in `algorithm`
/// (`SHA-256`, `SHA-384` or `SHA-512`), hex.
pub fn digest(name: &str, bytes: &[u8], algorithm: &str) -> Result<String, BundleError> {
    let canonical;
    let input: &[u8] = if structured(name) {
        canonical = canonical_form(name, bytes)?;
        &canonical
    } else {
        bytes
    };
    Ok(match algorithm {
        "SHA-256" => hex::encode(sha2::Sha256::digest(input)),
        "SHA-384" => hex::encode(sha2::Sha384::digest(input)),
        "SHA-512" => hex::encode(sha2::Sha512::digest(input)),
        other => {
            return Err(BundleError::Signature(format!(
                "{name}: hashing algorithm {other:?} is not accepted (SHA-256, SHA-384, SHA-512)"
            )));
        }
    })
}

/// The canonical JSON form of a structured file: objects with their keys
/// sorted (byte order) and no whitespace, arrays in order, strings as Go's
/// encoder writes them (without HTML escaping), numbers as written in
/// JSON, as Go writes them from YAML.
fn canonical_form(name: &str, bytes: &[u8]) -> Result<Vec<u8>, BundleError> {
    let bad = |m: String| BundleError::Refused(format!("{name} is not valid: {m}"));
    let mut out = Vec::with_capacity(bytes.len());
    if name.ends_with(".yaml") {
        let text = std::str::from_utf8(bytes).map_err(|e| bad(e.to_string()))?;
        let value = regorus::Value::from_yaml_str(text).map_err(|e| bad(e.to_string()))?;
        let json: serde_json::Value =
            serde_json::to_value(&value).map_err(|e| bad(e.to_string()))?;
        canonical_value(&json, &mut out);
    } else {
        let text = std::str::from_utf8(bytes).map_err(|e| bad(e.to_string()))?;
        let raw: &RawValue = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        canonical_raw(raw, &mut out).map_err(|e| bad(e.to_string()))?;
    }
    Ok(out)
}

fn canonical_raw(raw: &RawValue, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    let text = raw.get().trim();
    match text.as_bytes().first() {
        Some(b'{') => {
            // A key given twice: the last one counts (as in Go).
            let map: BTreeMap<String, &RawValue> = serde_json::from_str(text)?;
            out.push(b'{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                go_string(k, out);
                out.push(b':');
                canonical_raw(v, out)?;
            }
            out.push(b'}');
        }
        Some(b'[') => {
            let list: Vec<&RawValue> = serde_json::from_str(text)?;
            out.push(b'[');
            for (i, v) in list.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical_raw(v, out)?;
            }
            out.push(b']');
        }
        Some(b'"') => {
            let s: String = serde_json::from_str(text)?;
            go_string(&s, out);
        }
        // A number as written, true, false, null.
        _ => out.extend_from_slice(text.as_bytes()),
    }
    Ok(())
}

/// The same walk over a parsed value (YAML data): numbers as Go's encoder
/// writes a float64 (integers as integers).
fn canonical_value(v: &serde_json::Value, out: &mut Vec<u8>) {
    match v {
        serde_json::Value::Object(m) => {
            let sorted: BTreeMap<&String, &serde_json::Value> = m.iter().collect();
            out.push(b'{');
            for (i, (k, v)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                go_string(k, out);
                out.push(b':');
                canonical_value(v, out);
            }
            out.push(b'}');
        }
        serde_json::Value::Array(a) => {
            out.push(b'[');
            for (i, v) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical_value(v, out);
            }
            out.push(b']');
        }
        serde_json::Value::String(s) => go_string(s, out),
        serde_json::Value::Number(n) => {
            let text = match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => i.to_string(),
                (_, Some(u), _) => u.to_string(),
                (_, _, Some(f)) => go_float(f),
                _ => n.to_string(),
            };
            out.extend_from_slice(text.as_bytes());
        }
        other => out.extend_from_slice(other.to_string().as_bytes()),
    }
}

/// A string as Go's JSON encoder writes it with HTML escaping off: as
/// serde_json writes it, and U+2028, U+2029 escaped.
fn go_string(s: &str, out: &mut Vec<u8>) {
    let quoted = serde_json::to_string(s).unwrap_or_default();
    if quoted.contains(['\u{2028}', '\u{2029}']) {
        let fixed = quoted
            .replace('\u{2028}', "\\u2028")
            .replace('\u{2029}', "\\u2029");
        out.extend_from_slice(fixed.as_bytes());
    } else {
        out.extend_from_slice(quoted.as_bytes());
    }
}

/// A float64 as Go's encoding/json writes it: shortest digits, plain
/// between 1e-6 and 1e21, else exponent form with a signed exponent.
fn go_float(f: f64) -> String {
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        let e = format!("{f:e}");
        match e.split_once('e') {
            Some((m, exp)) if !exp.starts_with('-') => format!("{m}e+{exp}"),
            _ => e,
        }
    } else {
        format!("{f}")
    }
}

/// A verification key from the daemon's configuration (`[[policy_bundle.keys]]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// The key's id: the JWT's `kid` (or `keyid` claim) names it.
    pub id: String,
    /// RS256/384/512, PS256/384/512, ES256/384 or EdDSA. HMAC (HS*) is
    /// not accepted: its secret would sign as well as verify.
    pub algorithm: String,
    /// The public key, PEM.
    pub public_key: PathBuf,
    /// The `scope` claim a bundle signed with this key must carry
    /// (default: none).
    #[serde(default)]
    pub scope: String,
}

/// A key a bundle may be signed with.
#[derive(Clone)]
pub struct VerificationKey {
    pub id: String,
    pub algorithm: jsonwebtoken::Algorithm,
    key: jsonwebtoken::DecodingKey,
    pub scope: String,
}

impl std::fmt::Debug for VerificationKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerificationKey")
            .field("id", &self.id)
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}

/// An asymmetric signing algorithm by its JOSE name.
pub fn algorithm(name: &str) -> Result<jsonwebtoken::Algorithm, String> {
    use jsonwebtoken::Algorithm as A;
    Ok(match name {
        "RS256" => A::RS256,
        "RS384" => A::RS384,
        "RS512" => A::RS512,
        "PS256" => A::PS256,
        "PS384" => A::PS384,
        "PS512" => A::PS512,
        "ES256" => A::ES256,
        "ES384" => A::ES384,
        "EdDSA" => A::EdDSA,
        "HS256" | "HS384" | "HS512" => {
            return Err(format!(
                "{name} is an HMAC: its secret signs as well as verifies, so the daemon's copy could sign a bundle; use RS256, PS256, ES256 or EdDSA"
            ));
        }
        other => {
            return Err(format!(
                "unknown signing algorithm {other:?} (RS256/384/512, PS256/384/512, ES256/384, EdDSA)"
            ));
        }
    })
}

impl VerificationKey {
    pub fn load(c: &KeyConfig) -> Result<VerificationKey, BundleError> {
        let err = |message: String| BundleError::Key {
            path: c.public_key.clone(),
            message,
        };
        let alg = algorithm(&c.algorithm).map_err(err)?;
        let pem = std::fs::read(&c.public_key).map_err(|e| err(e.to_string()))?;
        VerificationKey::from_pem(&c.id, alg, &pem, &c.scope).map_err(err)
    }

    pub fn from_pem(
        id: &str,
        alg: jsonwebtoken::Algorithm,
        pem: &[u8],
        scope: &str,
    ) -> Result<VerificationKey, String> {
        use jsonwebtoken::{Algorithm as A, DecodingKey};
        let key = match alg {
            A::RS256 | A::RS384 | A::RS512 | A::PS256 | A::PS384 | A::PS512 => {
                DecodingKey::from_rsa_pem(pem)
            }
            A::ES256 | A::ES384 => DecodingKey::from_ec_pem(pem),
            A::EdDSA => DecodingKey::from_ed_pem(pem),
            _ => return Err(format!("{alg:?} is not accepted")),
        }
        .map_err(|e| format!("not a {alg:?} public key in PEM: {e}"))?;
        Ok(VerificationKey {
            id: id.to_string(),
            algorithm: alg,
            key,
            scope: scope.to_string(),
        })
    }
}

#[derive(Deserialize)]
struct SignaturesDoc {
    signatures: Vec<String>,
    #[serde(default)]
    plugin: Option<String>,
}

#[derive(Deserialize, Serialize)]
struct Payload {
    files: Vec<FileInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    keyid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scope: Option<String>,
    /// When it was signed (seconds since the epoch): `gateway policy sign`
    /// sets it; OPA's signer does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    iat: Option<i64>,
}

/// What a verified bundle is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verified {
    /// The key it was signed with.
    pub key_id: String,
    /// The manifest's `revision`, if it has one.
    pub revision: Option<String>,
    /// When it was signed (the JWT's `iat`), if the signer said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signed_at: Option<i64>,
}

/// Verify a bundle's signature and every file's digest against `keys`.
pub fn verify(files: &[BundleFile], keys: &[VerificationKey]) -> Result<Verified, BundleError> {
    let sig = |m: String| BundleError::Signature(m);
    let doc = files.iter().find(|f| f.name == SIGNATURES).ok_or_else(|| {
        sig(format!(
            "the bundle has no {SIGNATURES}: only signed bundles are loaded (gateway policy sign)"
        ))
    })?;
    let doc: SignaturesDoc = serde_json::from_slice(&doc.bytes)
        .map_err(|e| sig(format!("{SIGNATURES} is not valid: {e}")))?;
    if doc.plugin.as_deref().is_some_and(|p| !p.is_empty()) {
        return Err(sig(format!(
            "{SIGNATURES} names a signing plugin {:?}; only OPA's default signature format is known",
            doc.plugin.unwrap_or_default()
        )));
    }
    let [token] = doc.signatures.as_slice() else {
        return Err(sig(format!(
            "{SIGNATURES} must hold exactly one JWT (it holds {})",
            doc.signatures.len()
        )));
    };
    let header =
        jsonwebtoken::decode_header(token).map_err(|e| sig(format!("the JWT's header: {e}")))?;
    // The key id: the header's `kid`, else the payload's deprecated
    // `keyid` claim (read before verifying only to pick the key).
    let key_id = match header.kid.clone() {
        Some(k) => k,
        None => unverified_payload(token)?
            .keyid
            .ok_or_else(|| sig("the JWT names no key (kid, keyid)".into()))?,
    };
    let key = keys.iter().find(|k| k.id == key_id).ok_or_else(|| {
        sig(format!(
            "it is signed with key {key_id:?}, which is not one of the daemon's bundle keys"
        ))
    })?;
    let mut validation = jsonwebtoken::Validation::new(key.algorithm);
    validation.required_spec_claims.clear();
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    let payload = jsonwebtoken::decode::<Payload>(token, &key.key, &validation)
        .map_err(|e| sig(format!("with key {key_id:?} ({:?}): {e}", key.algorithm)))?
        .claims;
    if payload.scope.clone().unwrap_or_default() != key.scope {
        return Err(sig(format!(
            "its scope {:?} is not key {key_id:?}'s ({:?})",
            payload.scope.unwrap_or_default(),
            key.scope
        )));
    }
    let mut listed: BTreeMap<String, FileInfo> = BTreeMap::new();
    for f in payload.files {
        let name = f.name.trim_start_matches('/').to_string();
        if listed.insert(name.clone(), f).is_some() {
            return Err(sig(format!("{name} is listed twice in the signature")));
        }
    }
    for f in files.iter().filter(|f| f.name != SIGNATURES) {
        let info = listed.remove(&f.name).ok_or_else(|| {
            sig(format!(
                "{} is in the bundle but not in its signature",
                f.name
            ))
        })?;
        let got = digest(&f.name, &f.bytes, &info.algorithm)?;
        if !got.eq_ignore_ascii_case(&info.hash) {
            return Err(sig(format!(
                "{}: digest mismatch (signed {}, found {got})",
                f.name, info.hash
            )));
        }
    }
    if let Some(missing) = listed.keys().next() {
        return Err(sig(format!(
            "{missing} is in the signature but not in the bundle"
        )));
    }
    Ok(Verified {
        key_id,
        revision: manifest(files)?.and_then(|m| m.revision),
        signed_at: payload.iat,
    })
}

fn unverified_payload(token: &str) -> Result<Payload, BundleError> {
    use base64::Engine;
    let part = token
        .split('.')
        .nth(1)
        .ok_or_else(|| BundleError::Signature("not a compact JWT".into()))?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|e| BundleError::Signature(format!("the JWT's payload: {e}")))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| BundleError::Signature(format!("the JWT's payload: {e}")))
}

/// A bundle's `.manifest`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Manifest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roots: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
}

/// The bundle's manifest, if it has one.
pub fn manifest(files: &[BundleFile]) -> Result<Option<Manifest>, BundleError> {
    files
        .iter()
        .find(|f| f.name == MANIFEST)
        .map(|f| {
            serde_json::from_slice(&f.bytes)
                .map_err(|e| BundleError::Refused(format!("{MANIFEST} is not valid: {e}")))
        })
        .transpose()
}

/// A key a bundle is signed with: an asymmetric private key, PEM.
pub struct SigningKey {
    pub id: String,
    pub algorithm: jsonwebtoken::Algorithm,
    key: jsonwebtoken::EncodingKey,
}

impl SigningKey {
    pub fn from_pem(id: &str, algorithm: &str, pem: &[u8]) -> Result<SigningKey, String> {
        use jsonwebtoken::{Algorithm as A, EncodingKey};
        let alg = self::algorithm(algorithm)?;
        let key = match alg {
            A::RS256 | A::RS384 | A::RS512 | A::PS256 | A::PS384 | A::PS512 => {
                EncodingKey::from_rsa_pem(pem)
            }
            A::ES256 | A::ES384 => EncodingKey::from_ec_pem(pem),
            A::EdDSA => EncodingKey::from_ed_pem(pem),
            _ => return Err(format!("{alg:?} is not accepted")),
        }
        .map_err(|e| format!("not a {algorithm} private key in PEM (PKCS#8): {e}"))?;
        Ok(SigningKey {
            id: id.to_string(),
            algorithm: alg,
            key,
        })
    }
}

/// Sign `files` (every one but a `.signatures.json`, which is replaced):
/// the files with their new `.signatures.json`.
pub fn sign(files: &[BundleFile], key: &SigningKey) -> Result<Vec<BundleFile>, BundleError> {
    let mut kept: Vec<BundleFile> = files
        .iter()
        .filter(|f| f.name != SIGNATURES)
        .cloned()
        .collect();
    let mut listed = Vec::new();
    for f in &kept {
        listed.push(FileInfo {
            name: f.name.clone(),
            hash: digest(&f.name, &f.bytes, "SHA-256")?,
            algorithm: "SHA-256".into(),
        });
    }
    let mut header = jsonwebtoken::Header::new(key.algorithm);
    header.kid = Some(key.id.clone());
    let payload = Payload {
        files: listed,
        // The deprecated claim too, for OPA versions that read only it.
        keyid: Some(key.id.clone()),
        scope: None,
        iat: Some(chrono::Utc::now().timestamp()),
    };
    let token = jsonwebtoken::encode(&header, &payload, &key.key)
        .map_err(|e| BundleError::Signature(format!("signing: {e}")))?;
    let doc = serde_json::to_vec_pretty(&serde_json::json!({"signatures": [token]}))
        .map_err(|e| BundleError::Io(e.to_string()))?;
    kept.push(BundleFile {
        name: SIGNATURES.into(),
        bytes: doc,
    });
    kept.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(kept)
}

/// `[policy_bundle]` in gateway.toml: the daemon loads its policy set from
/// a signed bundle instead of a directory.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleConfig {
    /// A file path, or an `https://` URL the daemon polls.
    pub source: String,
    /// How often the bundle is read again, in seconds (default 2 for a
    /// file, 30 for a URL).
    pub poll_seconds: Option<u64>,
    /// A CA (PEM) the URL's server certificate may chain to, beside the
    /// system's roots.
    pub ca_file: Option<PathBuf>,
    /// The keys a bundle may be signed with; at least one.
    #[serde(default)]
    pub keys: Vec<KeyConfig>,
}

/// Where a bundle is read from.
#[derive(Debug, Clone)]
pub enum Location {
    File(PathBuf),
    Url(reqwest::Url),
}

/// A configured bundle: where it is, the keys it must be signed with.
#[derive(Debug, Clone)]
pub struct BundleSource {
    pub location: Location,
    pub keys: Vec<VerificationKey>,
    ca_pem: Option<Vec<u8>>,
    /// How often the daemon reads it again.
    pub poll: std::time::Duration,
    /// The newest signing time of a bundle this daemon has accepted: one
    /// signed before it is a rollback and refused.
    newest: std::sync::Arc<std::sync::Mutex<Option<i64>>>,
}

impl BundleSource {
    pub fn from_config(c: &BundleConfig) -> Result<BundleSource, BundleError> {
        if c.keys.is_empty() {
            return Err(BundleError::Refused(
                "[policy_bundle] names no keys: a bundle is loaded only when its signature verifies with one of them".into(),
            ));
        }
        let location = if c.source.starts_with("https://") {
            Location::Url(reqwest::Url::parse(&c.source).map_err(|e| {
                BundleError::Refused(format!("[policy_bundle] source {:?}: {e}", c.source))
            })?)
        } else if c.source.contains("://") {
            return Err(BundleError::Refused(format!(
                "[policy_bundle] source {:?}: only a file path or an https:// URL (plain HTTP would let the network replay an older signed bundle)",
                c.source
            )));
        } else {
            Location::File(PathBuf::from(&c.source))
        };
        let keys = c
            .keys
            .iter()
            .map(VerificationKey::load)
            .collect::<Result<Vec<_>, _>>()?;
        let mut ids = BTreeSet::new();
        if let Some(k) = keys.iter().find(|k| !ids.insert(k.id.as_str())) {
            return Err(BundleError::Refused(format!(
                "[policy_bundle] names key id {:?} twice: a signature's kid must name one key",
                k.id
            )));
        }
        let ca_pem = c
            .ca_file
            .as_ref()
            .map(|p| {
                std::fs::read(p).map_err(|e| BundleError::Key {
                    path: p.clone(),
                    message: e.to_string(),
                })
            })
            .transpose()?;
        let default = match location {
            Location::File(_) => 2,
            Location::Url(_) => 30,
        };
        Ok(BundleSource {
            location,
            keys,
            ca_pem,
            poll: std::time::Duration::from_secs(c.poll_seconds.unwrap_or(default).max(1)),
            newest: Default::default(),
        })
    }

    /// The file or URL, for messages (a URL without its query).
    pub fn name(&self) -> String {
        match &self.location {
            Location::File(p) => p.display().to_string(),
            Location::Url(u) => format!(
                "{}://{}{}",
                u.scheme(),
                u.host_str().unwrap_or("?"),
                u.path()
            ),
        }
    }

    /// The bundle's bytes as they are now.
    pub fn fetch(&self) -> Result<Vec<u8>, BundleError> {
        match &self.location {
            Location::File(p) => {
                let io = |e: std::io::Error| BundleError::Io(format!("{}: {e}", p.display()));
                let f = std::fs::File::open(p).map_err(io)?;
                let mut bytes = Vec::new();
                f.take(MAX_UNPACKED_BYTES + 1)
                    .read_to_end(&mut bytes)
                    .map_err(io)?;
                if bytes.len() as u64 > MAX_UNPACKED_BYTES {
                    return Err(BundleError::Refused(format!(
                        "{} is larger than {} MiB",
                        p.display(),
                        MAX_UNPACKED_BYTES >> 20
                    )));
                }
                Ok(bytes)
            }
            Location::Url(u) => {
                let url = u.clone();
                let ca = self.ca_pem.clone();
                // Its own thread and runtime: called from the watcher thread
                // and at start, never on the daemon's runtime.
                std::thread::scope(|s| {
                    s.spawn(move || fetch_url(url, ca))
                        .join()
                        .unwrap_or_else(|_| Err(BundleError::Io("the fetch panicked".into())))
                })
            }
        }
    }

    /// Unpack and verify `bytes`: the bundle's files and what signed them.
    /// A bundle signed before the newest one accepted is refused: putting
    /// an older signed policy back is a rollback (an operator who means it
    /// signs that policy again).
    pub fn open(&self, bytes: &[u8]) -> Result<(Vec<BundleFile>, Verified), BundleError> {
        let files = unpack(bytes)?;
        let verified = verify(&files, &self.keys)?;
        let mut newest = self.newest.lock().unwrap_or_else(|p| p.into_inner());
        match (verified.signed_at, *newest) {
            (Some(at), Some(seen)) if at < seen => {
                return Err(BundleError::Signature(format!(
                    "it was signed at {at}, before the bundle already accepted (signed at {seen}): an older policy put back is refused; sign it again to deploy it"
                )));
            }
            (Some(at), seen) => *newest = Some(seen.map_or(at, |s| s.max(at))),
            (None, _) => {}
        }
        Ok((files, verified))
    }
}

fn fetch_url(url: reqwest::Url, ca: Option<Vec<u8>>) -> Result<Vec<u8>, BundleError> {
    let shown = format!(
        "{}://{}{}",
        url.scheme(),
        url.host_str().unwrap_or("?"),
        url.path()
    );
    let err = |m: String| BundleError::Io(format!("{shown}: {m}"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| err(e.to_string()))?;
    rt.block_on(async {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut b = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none())
            .https_only(true);
        if let Some(pem) = &ca {
            for cert in reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| err(format!("the CA file: {}", e.without_url())))?
            {
                b = b.add_root_certificate(cert);
            }
        }
        let client = b
            .build()
            .map_err(|e| err(format!("no HTTP client: {}", e.without_url())))?;
        let mut r = client
            .get(url)
            .send()
            .await
            .map_err(|e| err(e.without_url().to_string()))?;
        if !r.status().is_success() {
            return Err(err(format!("the server answered {}", r.status())));
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = r
            .chunk()
            .await
            .map_err(|e| err(e.without_url().to_string()))?
        {
            bytes.extend_from_slice(&chunk);
            if bytes.len() as u64 > MAX_UNPACKED_BYTES {
                return Err(err(format!("larger than {} MiB", MAX_UNPACKED_BYTES >> 20)));
            }
        }
        Ok(bytes)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structured_files_hash_over_their_canonical_form_and_others_over_bytes() {
        // OPA's rule: keys sorted, no whitespace, numbers as written.
        let a = digest(
            "x/data.json",
            br#"{ "b": 1.50, "a": ["\u2028<&>", true, null] }"#,
            "SHA-256",
        )
        .expect("a");
        let canonical = "{\"a\":[\"\\u2028<&>\",true,null],\"b\":1.50}";
        assert_eq!(a, hex::encode(sha2::Sha256::digest(canonical.as_bytes())));
        let b = digest("data.yaml", b"b: 1.5\na: [x, 2]\nc: 1.0e+25\n", "SHA-256").expect("b");
        let canonical = "{\"a\":[\"x\",2],\"b\":1.5,\"c\":1e+25}";
        assert_eq!(b, hex::encode(sha2::Sha256::digest(canonical.as_bytes())));
        let rego = b"package x\n\nallow := true\n";
        assert_eq!(
            digest("p.rego", rego, "SHA-256").expect("rego"),
            hex::encode(sha2::Sha256::digest(rego))
        );
        assert!(digest("p.rego", rego, "MD5").is_err());
    }

    fn key_pair() -> (SigningKey, VerificationKey) {
        let kp = rcgen::KeyPair::generate().expect("key");
        let signing =
            SigningKey::from_pem("k1", "ES256", kp.serialize_pem().as_bytes()).expect("signing");
        let verifying = VerificationKey::from_pem(
            "k1",
            jsonwebtoken::Algorithm::ES256,
            kp.public_key_pem().as_bytes(),
            "",
        )
        .expect("verifying");
        (signing, verifying)
    }

    fn files() -> Vec<BundleFile> {
        vec![
            BundleFile {
                name: "gateway/a.rego".into(),
                bytes: b"package gateway.a\n\nallow := false\n".to_vec(),
            },
            BundleFile {
                name: "config/x/data.json".into(),
                bytes: br#"{"limit": 3}"#.to_vec(),
            },
            BundleFile {
                name: MANIFEST.into(),
                bytes: br#"{"revision": "r1", "roots": [""]}"#.to_vec(),
            },
        ]
    }

    #[test]
    fn a_signed_bundle_verifies_and_every_change_to_it_is_refused() {
        let (sk, vk) = key_pair();
        let keys = std::slice::from_ref(&vk);
        let signed = sign(&files(), &sk).expect("sign");
        let packed = pack(&signed).expect("pack");
        let v = verify(&unpack(&packed).expect("unpack"), keys).expect("verifies");
        assert_eq!(
            (v.key_id.as_str(), v.revision.as_deref()),
            ("k1", Some("r1"))
        );
        assert!(v.signed_at.is_some_and(|t| t > 1_700_000_000));
        // Reformatting a structured file keeps its digest (OPA's rule).
        let mut reformatted = signed.clone();
        reformatted[2].bytes = b"{\n  \"limit\" : 3\n}\n".to_vec();
        assert_eq!(reformatted[2].name, "config/x/data.json");
        verify(&reformatted, keys).expect("same document");

        let refused = |fs: &[BundleFile]| verify(fs, keys).expect_err("refused").to_string();
        // A changed module, a changed value.
        let mut t = signed.clone();
        t[3].bytes = b"package gateway.a\n\nallow := true\n".to_vec();
        assert!(refused(&t).contains("digest mismatch"), "{}", refused(&t));
        let mut t = signed.clone();
        t[2].bytes = br#"{"limit": 30}"#.to_vec();
        assert!(refused(&t).contains("digest mismatch"));
        // A file added, a file taken away.
        let mut t = signed.clone();
        t.push(BundleFile {
            name: "gateway/b.rego".into(),
            bytes: b"package gateway.b".to_vec(),
        });
        assert!(refused(&t).contains("not in its signature"));
        let t: Vec<BundleFile> = signed
            .iter()
            .filter(|f| f.name != "config/x/data.json")
            .cloned()
            .collect();
        assert!(refused(&t).contains("not in the bundle"));
        // No signature; another key; half a bundle.
        let t: Vec<BundleFile> = signed
            .iter()
            .filter(|f| f.name != SIGNATURES)
            .cloned()
            .collect();
        assert!(refused(&t).contains("only signed bundles"));
        let (other, _) = key_pair();
        let t = sign(&files(), &other).expect("sign");
        assert!(refused(&t).contains("with key \"k1\""), "{}", refused(&t));
        assert!(unpack(&packed[..packed.len() / 2]).is_err());
    }

    #[test]
    fn the_algorithm_comes_from_the_key_never_from_the_token() {
        // The classic confusion: an HS256 token whose secret is the public
        // key's PEM, which the attacker has.
        let (_, vk) = key_pair();
        let kp_pub = {
            let kp = rcgen::KeyPair::generate().expect("key");
            kp.public_key_pem()
        };
        let vk2 =
            VerificationKey::from_pem("k1", jsonwebtoken::Algorithm::ES256, kp_pub.as_bytes(), "")
                .expect("vk");
        for vk in [vk, vk2] {
            let fs = files();
            let listed: Vec<FileInfo> = fs
                .iter()
                .map(|f| FileInfo {
                    name: f.name.clone(),
                    hash: digest(&f.name, &f.bytes, "SHA-256").expect("d"),
                    algorithm: "SHA-256".into(),
                })
                .collect();
            let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
            header.kid = Some("k1".into());
            let token = jsonwebtoken::encode(
                &header,
                &Payload {
                    files: listed,
                    keyid: None,
                    scope: None,
                    iat: None,
                },
                &jsonwebtoken::EncodingKey::from_secret(kp_pub.as_bytes()),
            )
            .expect("hs256");
            let mut t = fs.clone();
            t.push(BundleFile {
                name: SIGNATURES.into(),
                bytes: serde_json::to_vec(&serde_json::json!({"signatures": [token]}))
                    .expect("json"),
            });
            let e = verify(&t, std::slice::from_ref(&vk))
                .expect_err("refused")
                .to_string();
            assert!(e.contains("does not verify"), "{e}");
        }
        assert!(algorithm("HS256").is_err());
        assert!(algorithm("none").is_err());
    }

    #[test]
    fn go_floats_are_written_as_go_writes_them() {
        assert_eq!(go_float(1.5), "1.5");
        assert_eq!(go_float(1e21), "1e+21");
        assert_eq!(go_float(1e-7), "1e-7");
        assert_eq!(go_float(123456789.0), "123456789");
    }

    #[test]
    fn unpack_refuses_links_escapes_and_duplicates() {
        let ok = pack(&[
            BundleFile {
                name: "a.rego".into(),
                bytes: b"package a".to_vec(),
            },
            BundleFile {
                name: "d/data.json".into(),
                bytes: b"{}".to_vec(),
            },
        ])
        .expect("pack");
        let files = unpack(&ok).expect("unpack");
        assert_eq!(
            files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
            ["a.rego", "d/data.json"]
        );

        type Tar = tar::Builder<flate2::write::GzEncoder<Vec<u8>>>;
        let with = |f: &dyn Fn(&mut Tar)| {
            let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            let mut t = tar::Builder::new(gz);
            f(&mut t);
            t.into_inner().expect("tar").finish().expect("gz")
        };
        let link = with(&|t| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            t.append_link(&mut h, "x.rego", "/etc/passwd")
                .expect("link");
        });
        assert!(
            unpack(&link)
                .unwrap_err()
                .to_string()
                .contains("not a regular file")
        );
        let twice = with(&|t| {
            for _ in 0..2 {
                let mut h = tar::Header::new_gnu();
                h.set_size(1);
                h.set_entry_type(tar::EntryType::Regular);
                t.append_data(&mut h, "./a.rego", &b"x"[..]).expect("file");
            }
        });
        assert!(unpack(&twice).unwrap_err().to_string().contains("twice"));
        let escape = with(&|t| {
            let mut h = tar::Header::new_gnu();
            h.set_size(1);
            h.set_entry_type(tar::EntryType::Regular);
            // Written raw: the tar crate refuses `..` in append_data.
            let name = b"../evil.rego";
            h.as_gnu_mut().expect("gnu").name[..name.len()].copy_from_slice(name);
            h.set_cksum();
            t.append(&h, &b"x"[..]).expect("file");
        });
        assert!(
            unpack(&escape)
                .unwrap_err()
                .to_string()
                .contains("not a relative path")
        );
        assert!(unpack(b"not a gzip").is_err());
    }
}
