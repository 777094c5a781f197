//! How an approver is proven, at the verdict and again at every spend: an
//! SSH signature over the approval's statement, checked against the
//! policy's allowed signers, or the OS user the kernel named. What the
//! policy gets is the proven identity ([`identity_json`]), never a name
//! someone typed.

use serde_json::{Value, json};

use super::passkey::{self, Listed, PasskeyError, Proven, RelyingParty};
use super::signature::{AllowedSigners, SignatureError, Signed, Signer, Statement};
use super::{Approval, Approver, Verdict};

/// Why a signed verdict is not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    #[error(transparent)]
    Signature(#[from] SignatureError),
    #[error("the signed statement is for another {field} than approval {id}")]
    Mismatch { id: String, field: &'static str },
    #[error("the signed statement expired at {0}; sign again")]
    Expired(String),
    #[error("the policy's allowed signers do not parse: {0}")]
    Signers(SignatureError),
    #[error(
        "the signing key's principal {0:?} is not usable as a name (empty, or with control characters)"
    )]
    BadPrincipal(String),
    #[error(transparent)]
    Passkey(#[from] PasskeyError),
}

/// Check a signed verdict on `approval`: the statement is canonical and
/// names exactly this approval, tool, params, plan and verdict, has not
/// expired, and is signed by an allowed key. Returns the signer and the
/// reason that was signed.
pub fn check_signed(
    approval: &Approval,
    verdict: &str,
    signed: &Signed,
    signers: &str,
    now_ms: i64,
) -> Result<(Signer, Statement), ProofError> {
    let statement = Statement::parse(signed.statement.as_bytes())?;
    // The signature first: a statement nobody allowed signed tells its
    // sender nothing about the approval it names.
    let allowed = AllowedSigners::parse(signers).map_err(ProofError::Signers)?;
    let signer = allowed.verify(signed.statement.as_bytes(), &signed.signature, now_ms)?;
    statement_is_for(approval, verdict, &statement, now_ms)?;
    let name = &signer.principals[0];
    if name.trim().is_empty() || name.chars().any(char::is_control) {
        return Err(ProofError::BadPrincipal(name.clone()));
    }
    Ok((signer, statement))
}

/// The statement names exactly this approval, tool, params, plan and
/// verdict, and has not expired.
fn statement_is_for(
    approval: &Approval,
    verdict: &str,
    statement: &Statement,
    now_ms: i64,
) -> Result<(), ProofError> {
    let id = approval.id.clone();
    let mismatch = |field: &'static str, signed: &str, actual: &str| {
        // The values are not named: a caller who may not see the
        // approval learns nothing of it from a refusal.
        (signed != actual).then(|| ProofError::Mismatch {
            id: id.clone(),
            field,
        })
    };
    if let Some(e) = mismatch("approval id", &statement.approval_id, &approval.id)
        .or_else(|| mismatch("tool", &statement.tool, &approval.tool))
        .or_else(|| {
            mismatch(
                "params digest",
                &statement.params_sha256,
                &approval.params_sha256,
            )
        })
        .or_else(|| {
            // Compared as options: no plan is not any digest's spelling.
            (statement.plan_sha256 != approval.plan_sha256).then(|| ProofError::Mismatch {
                id: id.clone(),
                field: "plan digest",
            })
        })
        .or_else(|| mismatch("verdict", &statement.verdict, verdict))
    {
        return Err(e);
    }
    if statement.expires_at_ms()? <= now_ms {
        return Err(ProofError::Expired(statement.expires_at.clone()));
    }
    Ok(())
}

/// What proves approvers today, from the policy: the allowed signers
/// (SSH keys) and the listed passkeys.
#[derive(Debug, Clone, Default)]
pub struct Proofs {
    pub signers: String,
    pub passkeys: Vec<Listed>,
}

/// Check a passkey verdict on `approval`: the statement is canonical and
/// names exactly this approval, tool, params, plan and verdict, has not
/// expired, and the assertion (`navigator.credentials.get()`'s result, as
/// JSON) signs its SHA-256 by a listed passkey for the page's origin, with
/// user verification.
pub fn check_passkey(
    approval: &Approval,
    verdict: &str,
    statement: &str,
    assertion: &str,
    passkeys: &[Listed],
    rp: &RelyingParty,
    now_ms: i64,
) -> Result<(Approver, Statement), ProofError> {
    let st = Statement::parse(statement.as_bytes())?;
    if assertion.len() > passkey::MAX_RESPONSE_BYTES {
        return Err(ProofError::Passkey(PasskeyError::Malformed(
            "too long".into(),
        )));
    }
    let value: Value = serde_json::from_str(assertion)
        .map_err(|e| ProofError::Passkey(PasskeyError::Malformed(e.to_string())))?;
    let proven = rp.verify(
        passkeys,
        &passkey::statement_challenge(statement.as_bytes()),
        &value,
    )?;
    statement_is_for(approval, verdict, &st, now_ms)?;
    Ok((
        passkey_approver(&proven, statement, assertion, &rp.origin()),
        st,
    ))
}

/// The approver a passkey proves. It is kept like a signed verdict: the
/// credential stands for the key, the assertion for the signature.
pub fn passkey_approver(p: &Proven, statement: &str, assertion: &str, origin: &str) -> Approver {
    Approver {
        name: p.name.clone(),
        kind: "passkey",
        os_user: String::new(),
        signed: Some((
            Signer {
                principals: vec![p.name.clone()],
                fingerprint: format!("webauthn:{}", p.credential_id),
                key_type: "webauthn".into(),
                public_key: p.credential.clone(),
                user_presence: Some(p.user_verified),
            },
            Signed {
                statement: statement.to_string(),
                signature: assertion.to_string(),
            },
        )),
        // The credential id is in the fingerprint (`webauthn:ID`): bare,
        // the audit's scrubber takes it for a token and redacts it.
        identity: Some(json!({"origin": origin, "user_verified": p.user_verified})),
    }
}

/// The approver a signed verdict proves.
pub fn signed_approver(signer: Signer, signed: Signed, os_user: &str) -> Approver {
    Approver {
        name: signer.principals[0].clone(),
        identity: None,
        kind: "ssh_key",
        os_user: os_user.into(),
        signed: Some((signer, signed)),
    }
}

/// The identity as the policy reads it (`input.approver`, and the items of
/// `input.approval.identities`).
pub fn identity_json(a: &Approver, groups: &[String]) -> Value {
    if a.kind == "sso" {
        let mut id = a.identity.clone().unwrap_or_else(|| json!({}));
        id["name"] = json!(a.name);
        id["kind"] = json!("sso");
        id["os_user"] = json!("");
        return id;
    }
    match &a.signed {
        Some((s, _)) => json!({
            "name": a.name, "kind": a.kind, "os_user": a.os_user,
            "key": {"fingerprint": s.fingerprint, "type": s.key_type,
                    "principals": s.principals, "user_presence": s.user_presence},
        }),
        None => json!({"name": a.name, "kind": a.kind, "os_user": a.os_user, "groups": groups}),
    }
}

/// The grants of `approval`, each proven again now: a signed one is
/// re-checked against today's allowed signers (a key taken off the list,
/// or listed under another name, no longer counts); an OS user's groups
/// are looked up again (`groups_of`). A grant nobody proved (`legacy`) is
/// left out.
pub fn identities_now(
    approval: &Approval,
    proofs: &Proofs,
    now_ms: i64,
    groups_of: impl Fn(&str) -> Vec<String>,
) -> Vec<Value> {
    approval
        .verdicts
        .iter()
        .filter(|v| v.verdict == "grant")
        .filter_map(|v| proven_again(approval, v, proofs, now_ms, &groups_of))
        .collect()
}

fn proven_again(
    approval: &Approval,
    v: &Verdict,
    proofs: &Proofs,
    now_ms: i64,
    groups_of: &impl Fn(&str) -> Vec<String>,
) -> Option<Value> {
    let signers = proofs.signers.as_str();
    match v.kind.as_str() {
        // Verified again with the passkey as the policy lists it today (one
        // taken off the list, or listed under another name, no longer
        // counts), for the origin it was given at.
        "passkey" => {
            let (statement, assertion) = (v.statement.as_deref()?, v.signature.as_deref()?);
            let origin = v.identity.as_ref()?["origin"].as_str()?;
            let rp = RelyingParty::new(origin).ok()?;
            let st = Statement::parse(statement.as_bytes()).ok()?;
            let value: Value = serde_json::from_str(assertion).ok()?;
            let proven = rp
                .verify(
                    &proofs.passkeys,
                    &passkey::statement_challenge(statement.as_bytes()),
                    &value,
                )
                .map_err(|e| no_longer_proves(approval, v, &e))
                .ok()?;
            statement_is_for(approval, "grant", &st, signed_at(v)?.min(now_ms)).ok()?;
            (proven.name == v.approver && st.reason == v.reason).then(|| {
                identity_json(
                    &passkey_approver(&proven, statement, assertion, origin),
                    &[],
                )
            })
        }
        "ssh_key" => {
            let signed = Signed {
                statement: v.statement.clone()?,
                signature: v.signature.clone()?,
            };
            // The statement's own expiry bounded when it could be
            // submitted, not how long the grant counts (the approval's
            // expiry does that), so it is checked against its signing time.
            let statement = Statement::parse(signed.statement.as_bytes()).ok()?;
            let at = signed_at(v)?;
            let (signer, _) = check_signed(approval, "grant", &signed, signers, at.min(now_ms))
                .map_err(|e| no_longer_proves(approval, v, &e))
                .ok()?;
            // Valid-after/valid-before are checked for today too.
            AllowedSigners::parse(signers)
                .ok()?
                .verify(signed.statement.as_bytes(), &signed.signature, now_ms)
                .ok()?;
            (signer.principals[0] == v.approver && statement.reason == v.reason)
                .then(|| identity_json(&signed_approver(signer, signed, &v.os_user), &[]))
        }
        "os_user" => Some(
            json!({"name": v.approver, "kind": "os_user", "os_user": v.os_user,
                                  "groups": groups_of(&v.approver)}),
        ),
        // What its token proved when it was given (the provider cannot be
        // asked again without one), judged by the policy of now.
        "sso" => v.identity.as_ref().map(|i| {
            let mut id = i.clone();
            id["name"] = json!(v.approver);
            id["kind"] = json!("sso");
            id["os_user"] = json!("");
            id
        }),
        _ => None,
    }
}

/// When a verdict was given (a statement's own expiry bounded when it
/// could be submitted, so it is checked against this time).
fn signed_at(v: &Verdict) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(&v.at)
        .map(|t| t.timestamp_millis())
        .ok()
}

/// Say, once per spend, why a recorded grant no longer counts.
fn no_longer_proves(approval: &Approval, v: &Verdict, e: &dyn std::fmt::Display) {
    tracing::info!(
        "grant by {} of {} no longer proves: {e}",
        v.approver,
        approval.id
    )
}

/// The current groups of a user by name (none if the user is gone).
pub fn groups_of_user(name: &str) -> Vec<String> {
    match nix::unistd::User::from_name(name) {
        Ok(Some(u)) => {
            gateway_base::identity::Caller::from_ids(u.uid.as_raw(), u.gid.as_raw(), None).groups
        }
        _ => Vec::new(),
    }
}
