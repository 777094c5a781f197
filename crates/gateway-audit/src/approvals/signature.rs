//! Signed verdicts: who approved is proven by an SSH signature, the same
//! mechanism as git's SSH commit signing (`ssh-keygen -Y sign`), checked
//! against allowed signers held in the policy's data, in git's
//! `allowed_signers` format.
//!
//! What is signed is a [`Statement`]: the approval id, the tool, the params
//! digest, the plan digest, the verdict, the reason and the statement's own
//! expiry, as canonical JSON followed by one newline, in the SSH signature
//! namespace [`NAMESPACE`]. Anyone can re-check one with stock OpenSSH:
//! `ssh-keygen -Y verify -f allowed_signers -I NAME -n gateway-approval -s
//! statement.json.sig < statement.json`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use ssh_key::{HashAlg, PublicKey, SshSig};

/// The SSH signature namespace of approval statements (`ssh-keygen -n`).
pub const NAMESPACE: &str = "gateway-approval";

/// The statement format's name and version.
pub const STATEMENT_TYPE: &str = "gateway-approval/v1";

/// The longest statement or signature accepted (both are small).
pub const MAX_BYTES: usize = 64 * 1024;

/// What an approver signs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Statement {
    #[serde(rename = "type")]
    pub kind: String,
    pub approval_id: String,
    pub tool: String,
    pub params_sha256: String,
    pub plan_sha256: Option<String>,
    /// `grant` or `deny`.
    pub verdict: String,
    pub reason: String,
    /// RFC 3339, UTC: the statement is refused after this instant.
    pub expires_at: String,
}

impl Statement {
    /// The exact bytes that are signed: canonical JSON and a newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        let v = serde_json::to_value(self).unwrap_or_default();
        let mut s = gateway_base::canonical::canonical_json(&v).into_bytes();
        s.push(b'\n');
        s
    }

    /// Parse signed bytes; only the canonical form of a statement is one
    /// (no other spelling of the same fields can carry a signature).
    pub fn parse(bytes: &[u8]) -> Result<Statement, SignatureError> {
        if bytes.len() > MAX_BYTES {
            return Err(SignatureError::Statement(format!(
                "longer than {MAX_BYTES} bytes"
            )));
        }
        let s: Statement =
            serde_json::from_slice(bytes).map_err(|e| SignatureError::Statement(e.to_string()))?;
        if s.to_bytes() != bytes {
            return Err(SignatureError::Statement(
                "not in canonical form (sorted keys, no spaces, one trailing newline): it was edited"
                    .into(),
            ));
        }
        if s.kind != STATEMENT_TYPE {
            return Err(SignatureError::Statement(format!(
                "type is {:?}, not {STATEMENT_TYPE}",
                s.kind
            )));
        }
        Ok(s)
    }

    /// Its expiry in milliseconds since the epoch.
    pub fn expires_at_ms(&self) -> Result<i64, SignatureError> {
        chrono::DateTime::parse_from_rfc3339(&self.expires_at)
            .map(|t| t.timestamp_millis())
            .map_err(|e| SignatureError::Statement(format!("expires_at: {e}")))
    }
}

/// A statement and its armored SSH signature, as submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signed {
    /// The signed bytes, exactly (canonical JSON and a newline).
    pub statement: String,
    /// `-----BEGIN SSH SIGNATURE-----` …
    pub signature: String,
}

/// The key that made a valid signature, as the allowed signers name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signer {
    /// The principals of the allowed-signers line that holds the key.
    pub principals: Vec<String>,
    /// `SHA256:…`, as `ssh-keygen -l` prints it.
    pub fingerprint: String,
    /// `ssh-ed25519`, `sk-ssh-ed25519@openssh.com`, …
    pub key_type: String,
    /// The public key in OpenSSH form (type and base64, no comment).
    pub public_key: String,
    /// For a security-key (`sk-`) signature: whether the key saw a touch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_presence: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the statement is not a gateway approval statement: {0}")]
    Statement(String),
    #[error("the signature is not an SSH signature: {0}")]
    Malformed(String),
    #[error("the signature's namespace is {0:?}, not {NAMESPACE}")]
    Namespace(String),
    #[error(
        "the key {0} is not one of the policy's allowed signers for gateway approvals (data.config.approvers)"
    )]
    UnknownKey(String),
    #[error("the allowed signers entry for key {0} is not valid now (valid-after/valid-before)")]
    NotValidNow(String),
    #[error(
        "the signature does not verify: the statement was changed after signing, or the signature was forged"
    )]
    Invalid,
    #[error(
        "the security key {0} signed without a touch (user presence), which the allowed signers entry requires"
    )]
    NoTouch(String),
    #[error("the allowed signers list is malformed at line {line}: {message}")]
    Signers { line: usize, message: String },
    #[error("cannot sign with ssh-keygen: {0}")]
    Sign(String),
}

/// One line of an allowed signers list.
#[derive(Debug, Clone)]
struct Entry {
    principals: Vec<String>,
    namespaces: Option<Vec<String>>,
    valid_after: Option<i64>,
    valid_before: Option<i64>,
    no_touch_required: bool,
    key: PublicKey,
}

/// Allowed signers in git's / OpenSSH's `allowed_signers` format:
/// `principals [options] keytype base64 [comment]`, `#` comments. Options
/// understood: `namespaces="…"`, `valid-after="…"`, `valid-before="…"`,
/// `no-touch-required`; a `cert-authority` line is refused (certificates
/// are not supported), as is any other option.
#[derive(Debug, Clone, Default)]
pub struct AllowedSigners {
    entries: Vec<Entry>,
}

/// Split on spaces, keeping double-quoted parts together.
fn fields(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            ' ' | '\t' if !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Split an options field on the commas outside double quotes.
fn split_options(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in s.chars() {
        match c {
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            _ => {
                if c == '"' {
                    quoted = !quoted;
                }
                cur.push(c);
            }
        }
    }
    out.push(cur);
    out
}

fn is_key_type(s: &str) -> bool {
    s.starts_with("ssh-") || s.starts_with("ecdsa-sha2-") || s.starts_with("sk-")
}

/// `YYYYMMDD[HHMM[SS]]` (UTC with a trailing `Z`, as ssh-keygen allows; a
/// time without it is read as UTC too, since the gateway has no local zone).
fn time_spec(s: &str) -> Option<i64> {
    let s = s.trim_end_matches(['Z', 'z']);
    let fmt = match s.len() {
        8 => format!("{s}000000"),
        12 => format!("{s}00"),
        14 => s.to_string(),
        _ => return None,
    };
    chrono::NaiveDateTime::parse_from_str(&fmt, "%Y%m%d%H%M%S")
        .ok()
        .map(|t| t.and_utc().timestamp_millis())
}

impl AllowedSigners {
    pub fn parse(text: &str) -> Result<AllowedSigners, SignatureError> {
        let mut entries = Vec::new();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |message: String| SignatureError::Signers {
                line: n + 1,
                message,
            };
            let f = fields(line);
            let principals: Vec<String> = f[0]
                .trim_matches('"')
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(String::from)
                .collect();
            if principals.is_empty() {
                return Err(bad("no principal".into()));
            }
            let mut i = 1;
            let mut namespaces = None;
            let (mut valid_after, mut valid_before) = (None, None);
            let mut no_touch_required = false;
            if f.len() > i && !is_key_type(&f[i]) {
                for opt in split_options(&f[i]).iter().filter(|o| !o.is_empty()) {
                    let (name, value) = match opt.split_once('=') {
                        Some((k, v)) => (k.to_ascii_lowercase(), Some(v.trim_matches('"'))),
                        None => (opt.to_ascii_lowercase(), None),
                    };
                    match (name.as_str(), value) {
                        ("namespaces", Some(v)) => {
                            namespaces = Some(v.split(',').map(String::from).collect())
                        }
                        ("valid-after", Some(v)) => {
                            valid_after = Some(time_spec(v).ok_or_else(|| {
                                bad(format!("valid-after {v:?} is not YYYYMMDD[HHMM[SS]]"))
                            })?)
                        }
                        ("valid-before", Some(v)) => {
                            valid_before = Some(time_spec(v).ok_or_else(|| {
                                bad(format!("valid-before {v:?} is not YYYYMMDD[HHMM[SS]]"))
                            })?)
                        }
                        ("no-touch-required", None) => no_touch_required = true,
                        ("cert-authority", _) => {
                            return Err(bad("cert-authority (SSH certificates) is not supported; list the keys themselves".into()));
                        }
                        _ => return Err(bad(format!("unknown option {opt:?}"))),
                    }
                }
                i += 1;
            }
            let Some(kind) = f.get(i) else {
                return Err(bad("no key".into()));
            };
            let Some(data) = f.get(i + 1) else {
                return Err(bad("the key has no data".into()));
            };
            let key = PublicKey::from_openssh(&format!("{kind} {data}"))
                .map_err(|err| bad(format!("the key does not parse: {err}")))?;
            entries.push(Entry {
                principals,
                namespaces,
                valid_after,
                valid_before,
                no_touch_required,
                key,
            });
        }
        Ok(AllowedSigners { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Check `signature` over `message` at `now_ms`: the key must be listed
    /// (for this namespace, valid now), and the signature must verify.
    pub fn verify(
        &self,
        message: &[u8],
        armored: &str,
        now_ms: i64,
    ) -> Result<Signer, SignatureError> {
        if armored.len() > MAX_BYTES {
            return Err(SignatureError::Malformed(format!(
                "longer than {MAX_BYTES} bytes"
            )));
        }
        let sig = parse_sig(armored)?;
        let key = PublicKey::from(sig.public_key().clone());
        let fingerprint = key.fingerprint(HashAlg::Sha256).to_string();
        let listed: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| e.key.key_data() == sig.public_key())
            .filter(|e| {
                e.namespaces
                    .as_ref()
                    .is_none_or(|ns| pattern_list_matches(ns, NAMESPACE))
            })
            .collect();
        if listed.is_empty() {
            return Err(SignatureError::UnknownKey(fingerprint));
        }
        let entry = listed
            .iter()
            .find(|e| {
                e.valid_after.is_none_or(|t| now_ms >= t)
                    && e.valid_before.is_none_or(|t| now_ms < t)
            })
            .ok_or_else(|| SignatureError::NotValidNow(fingerprint.clone()))?;
        key.verify(NAMESPACE, message, &sig)
            .map_err(|_| SignatureError::Invalid)?;
        // Whether a touch is needed is the key's kind, never a label the
        // signature carries ([`parse_sig`] refuses a mismatch anyway).
        let user_presence = match key.algorithm() {
            ssh_key::Algorithm::SkEd25519 | ssh_key::Algorithm::SkEcdsaSha2NistP256 => {
                // The flags byte precedes the 4-byte counter (PROTOCOL.u2f).
                let b = sig.signature_bytes();
                Some(b.len() >= 5 && b[b.len() - 5] & 0x01 == 0x01)
            }
            _ => None,
        };
        if user_presence == Some(false) && !entry.no_touch_required {
            return Err(SignatureError::NoTouch(fingerprint));
        }
        // Every name the key is listed under, so that the requester's name
        // on another line of the same key is seen too.
        let mut principals = entry.principals.clone();
        for e in &listed {
            for p in &e.principals {
                if !principals.contains(p) {
                    principals.push(p.clone());
                }
            }
        }
        Ok(Signer {
            principals,
            fingerprint,
            key_type: key.algorithm().as_str().to_string(),
            public_key: key.to_openssh().unwrap_or_default(),
            user_presence,
        })
    }
}

/// An armored SSH signature in the gateway's namespace, whose signature
/// algorithm is its key's own. (The algorithm name inside the blob is not
/// authenticated: relabelled, a security key's signature would verify
/// without its flags being read. OpenSSH refuses the mismatch too.)
fn parse_sig(armored: &str) -> Result<SshSig, SignatureError> {
    let sig = SshSig::from_pem(armored.trim().as_bytes())
        .map_err(|e| SignatureError::Malformed(e.to_string()))?;
    if sig.namespace() != NAMESPACE {
        return Err(SignatureError::Namespace(sig.namespace().to_string()));
    }
    let key_alg = sig.public_key().algorithm();
    if sig.algorithm() != key_alg {
        return Err(SignatureError::Malformed(format!(
            "its signature algorithm {} is not its key's ({})",
            sig.algorithm().as_str(),
            key_alg.as_str()
        )));
    }
    Ok(sig)
}

/// OpenSSH's pattern lists (`match_pattern_list`): a negated pattern
/// (`!p`) that matches refuses outright; otherwise some pattern must match.
fn pattern_list_matches(patterns: &[String], s: &str) -> bool {
    let mut positive = false;
    for p in patterns {
        match p.strip_prefix('!') {
            Some(neg) if glob_match(neg, s) => return false,
            Some(_) => {}
            None => positive |= glob_match(p, s),
        }
    }
    positive
}

/// The `*`/`?` patterns of an allowed signers `namespaces` list.
fn glob_match(pattern: &str, s: &str) -> bool {
    fn go(p: &[u8], s: &[u8]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(b'*'), _) => go(&p[1..], s) || (!s.is_empty() && go(p, &s[1..])),
            (Some(b'?'), Some(_)) => go(&p[1..], &s[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &s[1..]),
            _ => false,
        }
    }
    go(pattern.as_bytes(), s.as_bytes())
}

/// Check a signature made by the key `public_key` (OpenSSH form) alone,
/// without an allowed signers list: what `gateway audit verify` re-checks
/// with the key an audit event recorded.
pub fn verify_with_key(
    public_key: &str,
    message: &[u8],
    armored: &str,
) -> Result<String, SignatureError> {
    let key = PublicKey::from_openssh(public_key.trim())
        .map_err(|e| SignatureError::Malformed(format!("the recorded key: {e}")))?;
    let sig = parse_sig(armored)?;
    key.verify(NAMESPACE, message, &sig)
        .map_err(|_| SignatureError::Invalid)?;
    Ok(key.fingerprint(HashAlg::Sha256).to_string())
}

/// The key `gateway approve` signs with when none is named: the first of
/// the usual OpenSSH identity files that exists (security keys first).
pub fn default_key(home: &Path) -> Option<PathBuf> {
    ["id_ed25519_sk", "id_ecdsa_sk", "id_ed25519", "id_ecdsa"]
        .iter()
        .map(|n| home.join(".ssh").join(n))
        .find(|p| p.exists() || p.with_extension("pub").exists())
}

/// Sign `message` with `ssh-keygen -Y sign -n gateway-approval -f KEY`.
/// `KEY` may be a private key file, or a public key whose private half is
/// in the ssh-agent (so that `ssh-add -c` confirmations and security-key
/// touches happen as for any SSH use). ssh-keygen asks for a passphrase or
/// a touch on the terminal itself.
pub fn sign_with_ssh_keygen(key: &Path, message: &[u8]) -> Result<String, SignatureError> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    // The system's ssh-keygen where there is one, not whatever PATH names.
    let program = [
        "/usr/bin/ssh-keygen",
        "/bin/ssh-keygen",
        "/usr/local/bin/ssh-keygen",
    ]
    .into_iter()
    .find(|p| Path::new(p).is_file())
    .unwrap_or("ssh-keygen");
    let mut child = Command::new(program)
        .args(["-q", "-Y", "sign", "-n", NAMESPACE, "-f"])
        .arg(key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| SignatureError::Sign(format!("cannot run ssh-keygen: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(message)
            .map_err(|e| SignatureError::Sign(e.to_string()))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| SignatureError::Sign(e.to_string()))?;
    if !out.status.success() {
        return Err(SignatureError::Sign(format!(
            "ssh-keygen -Y sign -f {} failed ({})",
            key.display(),
            out.status
        )));
    }
    String::from_utf8(out.stdout)
        .map_err(|_| SignatureError::Sign("ssh-keygen's signature is not text".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keygen(dir: &Path, name: &str) -> (PathBuf, String) {
        let key = dir.join(name);
        let st = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
            .arg(&key)
            .status()
            .expect("ssh-keygen");
        assert!(st.success());
        let public = std::fs::read_to_string(key.with_extension("pub")).expect("pub");
        (key, public.trim().to_string())
    }

    fn statement() -> Statement {
        Statement {
            kind: STATEMENT_TYPE.into(),
            approval_id: "ap-1".into(),
            tool: "terraform_apply".into(),
            params_sha256: "aa".repeat(32),
            plan_sha256: Some("bb".repeat(32)),
            verdict: "grant".into(),
            reason: "checked".into(),
            expires_at: "2030-01-01T00:00:00Z".into(),
        }
    }

    #[test]
    fn a_real_ssh_keygen_signature_verifies_and_any_change_does_not() {
        let dir = tempfile::tempdir().expect("tmp");
        let (key, public) = keygen(dir.path(), "bob");
        let (_other, other_public) = keygen(dir.path(), "eve");
        let signers = AllowedSigners::parse(&format!(
            "# approvers\nbob namespaces=\"gateway-approval\" {public}\n"
        ))
        .expect("signers");
        let msg = statement().to_bytes();
        let sig = sign_with_ssh_keygen(&key, &msg).expect("sign");
        let who = signers.verify(&msg, &sig, 0).expect("valid");
        assert_eq!(who.principals, vec!["bob".to_string()]);
        assert!(
            who.fingerprint.starts_with("SHA256:"),
            "{}",
            who.fingerprint
        );
        assert_eq!(who.key_type, "ssh-ed25519");
        assert_eq!(Statement::parse(&msg).expect("parse"), statement());

        let mut edited = statement();
        edited.plan_sha256 = Some("cc".repeat(32));
        assert_eq!(
            signers.verify(&edited.to_bytes(), &sig, 0),
            Err(SignatureError::Invalid)
        );
        let only_eve = AllowedSigners::parse(&format!("eve {other_public}")).expect("signers");
        assert!(matches!(
            only_eve.verify(&msg, &sig, 0),
            Err(SignatureError::UnknownKey(_))
        ));
        let git_only =
            AllowedSigners::parse(&format!("bob namespaces=\"git\" {public}")).expect("signers");
        assert!(matches!(
            git_only.verify(&msg, &sig, 0),
            Err(SignatureError::UnknownKey(_))
        ));
        let expired = AllowedSigners::parse(&format!("bob valid-before=\"20200101\" {public}"))
            .expect("signers");
        assert!(matches!(
            expired.verify(&msg, &sig, chrono::Utc::now().timestamp_millis()),
            Err(SignatureError::NotValidNow(_))
        ));
        assert_eq!(
            verify_with_key(&public, &msg, &sig).expect("key"),
            who.fingerprint
        );
        // The same key on two lines: every name it is listed under is
        // reported (the first line's first name is the identity).
        let twice = AllowedSigners::parse(&format!("operator {public}\nalice {public}\n"))
            .expect("signers");
        assert_eq!(
            twice.verify(&msg, &sig, 0).expect("valid").principals,
            vec!["operator".to_string(), "alice".to_string()]
        );
        // A signature in another namespace (a git commit signature, say)
        // is not an approval.
        let out = std::process::Command::new("ssh-keygen")
            .args(["-q", "-Y", "sign", "-n", "git", "-f"])
            .arg(&key)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().expect("stdin").write_all(&msg)?;
                c.wait_with_output()
            })
            .expect("sign git");
        let git_sig = String::from_utf8(out.stdout).expect("utf8");
        assert_eq!(
            signers.verify(&msg, &git_sig, 0),
            Err(SignatureError::Namespace("git".into()))
        );
    }

    /// The signature's algorithm name relabelled (what would hide a
    /// security key's missing touch): refused before any check of flags.
    #[test]
    fn a_signature_relabelled_with_another_algorithm_is_refused() {
        use base64::Engine;
        let dir = tempfile::tempdir().expect("tmp");
        let (key, public) = keygen(dir.path(), "bob");
        let signers = AllowedSigners::parse(&format!("bob {public}")).expect("signers");
        let msg = statement().to_bytes();
        let sig = sign_with_ssh_keygen(&key, &msg).expect("sign");
        let b64: String = sig.lines().filter(|l| !l.starts_with("-----")).collect();
        let blob = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .expect("base64");
        // MAGIC(6) version(4), then strings: key, namespace, reserved, hash, signature.
        let mut at = 10;
        let string_at = |at: usize| -> (usize, usize) {
            let n = u32::from_be_bytes(blob[at..at + 4].try_into().expect("len")) as usize;
            (at + 4, n)
        };
        for _ in 0..4 {
            let (start, n) = string_at(at);
            at = start + n;
        }
        let (sig_start, _) = string_at(at);
        let (alg_start, alg_len) = string_at(sig_start);
        assert_eq!(&blob[alg_start..alg_start + alg_len], b"ssh-ed25519");
        let mut relabelled = blob[..sig_start].to_vec();
        let mut inner = Vec::new();
        inner.extend(3u32.to_be_bytes());
        inner.extend(b"x@y");
        inner.extend(&blob[alg_start + alg_len..]);
        relabelled.truncate(at);
        relabelled.extend((inner.len() as u32).to_be_bytes());
        relabelled.extend(inner);
        let encoded = base64::engine::general_purpose::STANDARD.encode(&relabelled);
        let wrapped: Vec<String> = encoded
            .as_bytes()
            .chunks(70)
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect();
        let armored = format!(
            "-----BEGIN SSH SIGNATURE-----\n{}\n-----END SSH SIGNATURE-----\n",
            wrapped.join("\n")
        );
        match signers.verify(&msg, &armored, 0) {
            Err(SignatureError::Malformed(m)) => assert!(m.contains("is not its key's"), "{m}"),
            other => panic!("a relabelled signature: {other:?}"),
        }
        assert!(verify_with_key(&public, &msg, &armored).is_err());
    }

    #[test]
    fn only_the_canonical_statement_is_accepted() {
        let good = statement().to_bytes();
        assert!(Statement::parse(&good).is_ok());
        let text = String::from_utf8(good.clone()).expect("utf8");
        let spaced = text.replace("\":", "\": ");
        assert!(Statement::parse(spaced.as_bytes()).is_err());
        assert!(Statement::parse(text.trim_end().as_bytes()).is_err());
        let extra = text.replacen('{', "{\"admin\":true,", 1);
        assert!(Statement::parse(extra.as_bytes()).is_err());
    }

    #[test]
    fn allowed_signers_lines_parse_as_openssh_reads_them() {
        let dir = tempfile::tempdir().expect("tmp");
        let (_k, public) = keygen(dir.path(), "a");
        let s = AllowedSigners::parse(&format!(
            "alice,bob {public} comment\n\n# c\ncarol namespaces=\"git,gateway-*\",valid-after=\"20200101\" {public}\n"
        ))
        .expect("parse");
        assert_eq!(s.entries.len(), 2);
        assert_eq!(s.entries[0].principals, vec!["alice", "bob"]);
        assert_eq!(
            s.entries[1].namespaces.as_deref(),
            Some(&["git".to_string(), "gateway-*".to_string()][..])
        );
        for bad in [
            format!("x cert-authority {public}"),
            format!("x frobnicate {public}"),
            "x ssh-ed25519".to_string(),
            "x ssh-ed25519 notbase64!".to_string(),
        ] {
            assert!(
                matches!(
                    AllowedSigners::parse(&bad),
                    Err(SignatureError::Signers { line: 1, .. })
                ),
                "{bad}"
            );
        }
        assert!(glob_match("gateway-*", NAMESPACE));
        assert!(!glob_match("git", NAMESPACE));
        let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(!pattern_list_matches(
            &list(&["!gateway-approval", "*"]),
            NAMESPACE
        ));
        assert!(pattern_list_matches(&list(&["!git", "*"]), NAMESPACE));
        assert!(!pattern_list_matches(&list(&["!git"]), NAMESPACE));
    }
}
