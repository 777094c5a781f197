//! Passkey verdicts (WebAuthn): an approver's security key or platform
//! passkey, with user verification (a PIN, a fingerprint, a face), signs a
//! challenge that is the SHA-256 of the same canonical [`Statement`] an SSH
//! key signs. So a passkey grant is bound, like a signed one, to the
//! approval id, tool, params digest, plan digest, verdict, reason and the
//! statement's expiry, and it is kept (statement, assertion, credential)
//! so that `gateway audit verify` can check it again.
//!
//! Which passkeys identify approvers is the policy's data
//! (`data.config.approvers.passkeys`, read through
//! `data.gateway.approvals.passkeys`): a list of `{"name": APPROVER,
//! "credential": CREDENTIAL}`, where CREDENTIAL is what the approval
//! page's registration prints. Registering carries no authority: a passkey
//! counts once a policy author lists it, as with `allowed_signers`.
//!
//! The checks are webauthn-rs's ([`webauthn_rs_core`]): origin, RP id
//! hash, `webauthn.get`, the challenge, user presence and verification,
//! and the signature by the listed credential's key.
//!
//! [`Statement`]: super::signature::Statement

use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use url::Url;
use webauthn_rs_core::WebauthnCore;
use webauthn_rs_core::proto::{
    AuthenticationState, Credential, PublicKeyCredential, RegisterPublicKeyCredential,
    RegistrationState, UserVerificationPolicy,
};

/// How long a browser has to answer a WebAuthn request.
pub const CEREMONY_TIMEOUT: Duration = Duration::from_secs(120);

/// The largest assertion or registration response accepted (JSON).
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PasskeyError {
    #[error("the approval page's origin {0:?} is not an https:// (or loopback http://) origin")]
    Origin(String),
    #[error(
        "the approval page's host {0:?} is an IP address, and browsers refuse passkeys there: name the gateway by a DNS name (or localhost) in [http] resource"
    )]
    IpHost(String),
    #[error("the policy's passkey list (data.config.approvers.passkeys) is malformed: {0}")]
    Listed(String),
    #[error("the passkey is not one the policy lists for an approver")]
    Unknown,
    #[error("the passkey response is malformed: {0}")]
    Malformed(String),
    #[error("the passkey did not verify: {0}")]
    Invalid(String),
    #[error(
        "the passkey signed without user verification (PIN or biometric), which approving needs"
    )]
    NotVerified,
}

/// A passkey the policy lists, and whose it is.
#[derive(Debug, Clone)]
pub struct Listed {
    pub name: String,
    /// Its credential id, base64url (no padding).
    pub id: String,
    pub credential: Credential,
}

/// What a verified assertion proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proven {
    /// The approver the listing names.
    pub name: String,
    /// The credential id, base64url.
    pub credential_id: String,
    /// The credential as listed (JSON), kept with the verdict.
    pub credential: String,
    pub user_verified: bool,
}

/// An approver name a passkey is listed under: ASCII letters, digits and
/// `._@-`, so that no look-alike letter makes one name pass for another.
pub fn plain_name(name: &str) -> bool {
    (1..=100).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '@' | '-'))
}

/// The challenge of a verdict: the SHA-256 of the statement's exact bytes.
pub fn statement_challenge(statement: &[u8]) -> [u8; 32] {
    Sha256::digest(statement).into()
}

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Read the policy's list (`[{"name", "credential"}]`). An entry that does
/// not parse refuses the whole list: a typo must not silently drop (or
/// reassign) an approver.
pub fn listed(value: &Value) -> Result<Vec<Listed>, PasskeyError> {
    let items = match value {
        Value::Null => return Ok(Vec::new()),
        Value::Array(a) => a,
        _ => return Err(PasskeyError::Listed("not a list".into())),
    };
    let mut out: Vec<Listed> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let name = item["name"]
            .as_str()
            .filter(|n| plain_name(n))
            .ok_or_else(|| {
                PasskeyError::Listed(format!(
                    "entry {i}: \"name\" must be 1 to 100 of A-Z a-z 0-9 . _ @ - (no look-alike letters)"
                ))
            })?;
        let credential: Credential = serde_json::from_value(item["credential"].clone())
            .map_err(|e| PasskeyError::Listed(format!("entry {i} ({name}): credential: {e}")))?;
        let id = b64url(credential.cred_id.as_ref());
        if let Some(other) = out.iter().find(|l| l.id == id) {
            return Err(PasskeyError::Listed(format!(
                "entry {i} ({name}): the same passkey is already listed for {}",
                other.name
            )));
        }
        out.push(Listed {
            name: name.to_string(),
            id,
            credential,
        });
    }
    Ok(out)
}

/// The relying party: the approval page's origin and its RP id (the host).
pub struct RelyingParty {
    core: WebauthnCore,
    origin: Url,
}

impl std::fmt::Debug for RelyingParty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RelyingParty({})", self.origin)
    }
}

impl RelyingParty {
    /// For the page served at `origin` (`https://host[:port]`; a path is
    /// ignored). Plain http only on a loopback address or `localhost`
    /// (browsers allow WebAuthn there and nowhere else without TLS).
    pub fn new(origin: &str) -> Result<RelyingParty, PasskeyError> {
        let bad = || PasskeyError::Origin(origin.to_string());
        let mut url = Url::parse(origin).map_err(|_| bad())?;
        let host = url.host_str().ok_or_else(bad)?.to_string();
        let loopback = host == "localhost"
            || host
                .trim_matches(['[', ']'])
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if !(url.scheme() == "https" || (url.scheme() == "http" && loopback)) {
            return Err(bad());
        }
        // A WebAuthn RP id is a domain (browsers refuse an IP address).
        if host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok()
        {
            return Err(PasskeyError::IpHost(host));
        }
        url.set_path("");
        url.set_query(None);
        url.set_fragment(None);
        let core = WebauthnCore::new_unsafe_experts_only(
            "gateway approvals",
            host.trim_matches(['[', ']']),
            vec![url.clone()],
            CEREMONY_TIMEOUT,
            Some(false),
            Some(false),
        );
        Ok(RelyingParty { core, origin: url })
    }

    /// The origin, as a browser names it (`https://host:port`).
    pub fn origin(&self) -> String {
        self.origin.as_str().trim_end_matches('/').to_string()
    }

    /// Options for `navigator.credentials.create()` to register a passkey
    /// for `name` (user verification required), and the state to keep
    /// until the answer comes.
    pub fn register_options(&self, name: &str) -> Result<(Value, String), PasskeyError> {
        let mut handle = [0u8; 16];
        getrandom::fill(&mut handle).map_err(|e| PasskeyError::Invalid(e.to_string()))?;
        let builder = self
            .core
            .new_challenge_register_builder(&handle, name, name)
            .map_err(|e| PasskeyError::Malformed(format!("{e:?}")))?
            .user_verification_policy(UserVerificationPolicy::Required);
        let (options, state) = self
            .core
            .generate_challenge_register(builder)
            .map_err(|e| PasskeyError::Invalid(format!("{e:?}")))?;
        let state =
            serde_json::to_string(&state).map_err(|e| PasskeyError::Invalid(e.to_string()))?;
        Ok((json!(options), state))
    }

    /// Check a registration answer against its state: the credential to
    /// list (JSON), made with user verification.
    pub fn register_finish(&self, state: &str, response: &Value) -> Result<Value, PasskeyError> {
        let state: RegistrationState =
            serde_json::from_str(state).map_err(|e| PasskeyError::Malformed(e.to_string()))?;
        let reg: RegisterPublicKeyCredential = serde_json::from_value(response.clone())
            .map_err(|e| PasskeyError::Malformed(e.to_string()))?;
        let credential = self
            .core
            .register_credential(&reg, &state, None)
            .map_err(|e| PasskeyError::Invalid(format!("{e:?}")))?;
        if !credential.user_verified {
            return Err(PasskeyError::NotVerified);
        }
        serde_json::to_value(&credential).map_err(|e| PasskeyError::Invalid(e.to_string()))
    }

    /// Options for `navigator.credentials.get()`: `challenge`, any of
    /// `creds`, user verification required.
    pub fn request_options(
        &self,
        creds: &[Listed],
        challenge: &[u8],
    ) -> Result<Value, PasskeyError> {
        let (mut options, _) = self.state(creds, challenge)?;
        options["publicKey"]["challenge"] = json!(b64url(challenge));
        Ok(options)
    }

    /// The authentication state webauthn-rs checks an answer against, with
    /// `challenge` in place of the random one it makes. (Its state is
    /// plain serde data; the field is set through it, and
    /// [`RelyingParty::verify`] checks that it took.)
    fn state(
        &self,
        creds: &[Listed],
        challenge: &[u8],
    ) -> Result<(Value, AuthenticationState), PasskeyError> {
        if creds.is_empty() {
            return Err(PasskeyError::Unknown);
        }
        let builder = self
            .core
            .new_challenge_authenticate_builder(
                creds.iter().map(|l| l.credential.clone()).collect(),
                Some(UserVerificationPolicy::Required),
            )
            .map_err(|e| PasskeyError::Invalid(format!("{e:?}")))?;
        let (options, state) = self
            .core
            .generate_challenge_authenticate(builder)
            .map_err(|e| PasskeyError::Invalid(format!("{e:?}")))?;
        let mut v =
            serde_json::to_value(&state).map_err(|e| PasskeyError::Invalid(e.to_string()))?;
        v["challenge"] = json!(b64url(challenge));
        let state: AuthenticationState =
            serde_json::from_value(v).map_err(|e| PasskeyError::Invalid(e.to_string()))?;
        let again =
            serde_json::to_value(&state).map_err(|e| PasskeyError::Invalid(e.to_string()))?;
        if again["challenge"] != json!(b64url(challenge)) {
            return Err(PasskeyError::Invalid(
                "the WebAuthn library's state did not take the statement's challenge".into(),
            ));
        }
        Ok((json!(options), state))
    }

    /// Verify an assertion (the JSON of `navigator.credentials.get()`'s
    /// result) over `challenge` by one of `creds`, with user verification.
    pub fn verify(
        &self,
        creds: &[Listed],
        challenge: &[u8],
        assertion: &Value,
    ) -> Result<Proven, PasskeyError> {
        let rsp: PublicKeyCredential = serde_json::from_value(assertion.clone())
            .map_err(|e| PasskeyError::Malformed(e.to_string()))?;
        let used = b64url(rsp.raw_id.as_ref());
        let listed = creds
            .iter()
            .find(|l| l.id == used)
            .ok_or(PasskeyError::Unknown)?;
        let (_, state) = self.state(std::slice::from_ref(listed), challenge)?;
        let result = self
            .core
            .authenticate_credential(&rsp, &state)
            .map_err(|e| PasskeyError::Invalid(format!("{e:?}")))?;
        if !result.user_verified() {
            return Err(PasskeyError::NotVerified);
        }
        Ok(Proven {
            name: listed.name.clone(),
            credential_id: listed.id.clone(),
            credential: serde_json::to_string(&listed.credential)
                .map_err(|e| PasskeyError::Invalid(e.to_string()))?,
            user_verified: true,
        })
    }
}

/// Check a recorded passkey verdict again (`gateway audit verify`, and
/// every spend): the assertion over the statement's challenge verifies by
/// `credential` (the JSON recorded with it) for `origin`.
pub fn verify_recorded(
    origin: &str,
    name: &str,
    credential: &str,
    statement: &str,
    assertion: &str,
) -> Result<Proven, PasskeyError> {
    let rp = RelyingParty::new(origin)?;
    let credential: Credential =
        serde_json::from_str(credential).map_err(|e| PasskeyError::Malformed(e.to_string()))?;
    let id = b64url(credential.cred_id.as_ref());
    let listed = Listed {
        name: name.to_string(),
        id,
        credential,
    };
    let assertion: Value =
        serde_json::from_str(assertion).map_err(|e| PasskeyError::Malformed(e.to_string()))?;
    rp.verify(
        std::slice::from_ref(&listed),
        &statement_challenge(statement.as_bytes()),
        &assertion,
    )
}

/// A software authenticator for tests (here and in `audit::verify`).
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A software authenticator: one ES256 key, and assertions as a
    /// browser returns them.
    pub(crate) struct Authenticator {
        pub(crate) key: openssl::ec::EcKey<openssl::pkey::Private>,
        pub(crate) id: Vec<u8>,
    }

    impl Authenticator {
        pub(crate) fn new() -> Authenticator {
            let group = openssl::ec::EcGroup::from_curve_name(openssl::nid::Nid::X9_62_PRIME256V1)
                .expect("group");
            Authenticator {
                key: openssl::ec::EcKey::generate(&group).expect("key"),
                id: vec![7u8; 16],
            }
        }

        pub(crate) fn listed(&self, name: &str) -> Listed {
            use webauthn_rs_core::proto::*;
            let mut ctx = openssl::bn::BigNumContext::new().expect("ctx");
            let (mut x, mut y) = (
                openssl::bn::BigNum::new().expect("x"),
                openssl::bn::BigNum::new().expect("y"),
            );
            self.key
                .public_key()
                .affine_coordinates(self.key.group(), &mut x, &mut y, &mut ctx)
                .expect("coordinates");
            let credential = Credential {
                cred_id: self.id.clone().into(),
                cred: COSEKey {
                    type_: COSEAlgorithm::ES256,
                    key: COSEKeyType::EC_EC2(COSEEC2Key {
                        curve: ECDSACurve::SECP256R1,
                        x: x.to_vec_padded(32).expect("x").into(),
                        y: y.to_vec_padded(32).expect("y").into(),
                    }),
                },
                counter: 0,
                transports: None,
                user_verified: true,
                backup_eligible: false,
                backup_state: false,
                registration_policy: UserVerificationPolicy::Required,
                extensions: RegisteredExtensions::none(),
                attestation: ParsedAttestation {
                    data: ParsedAttestationData::None,
                    metadata: AttestationMetadata::None,
                },
                attestation_format: AttestationFormat::None,
            };
            listed(&json!([{"name": name, "credential": credential}]))
                .expect("listed")
                .remove(0)
        }

        /// An assertion over `challenge` for `origin`, with the UV flag
        /// `verified`.
        pub(crate) fn assert(
            &self,
            origin: &str,
            rp_id: &str,
            challenge: &[u8],
            verified: bool,
        ) -> Value {
            let client = json!({"type": "webauthn.get", "challenge": b64url(challenge),
                                "origin": origin, "crossOrigin": false})
            .to_string();
            let mut auth = Sha256::digest(rp_id.as_bytes()).to_vec();
            auth.push(if verified { 0x05 } else { 0x01 });
            auth.extend_from_slice(&1u32.to_be_bytes());
            let mut signed = auth.clone();
            signed.extend_from_slice(&Sha256::digest(client.as_bytes()));
            let digest = Sha256::digest(&signed);
            let sig = openssl::ecdsa::EcdsaSig::sign(&digest, &self.key)
                .expect("sign")
                .to_der()
                .expect("der");
            json!({"id": b64url(&self.id), "rawId": b64url(&self.id), "type": "public-key",
                   "extensions": {},
                   "response": {"authenticatorData": b64url(&auth),
                                "clientDataJSON": b64url(client.as_bytes()),
                                "signature": b64url(&sig), "userHandle": null}})
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::Authenticator;
    use super::*;

    #[test]
    fn only_https_or_loopback_origins_are_relying_parties() {
        assert!(RelyingParty::new("https://gateway.example.com").is_ok());
        assert!(matches!(
            RelyingParty::new("http://127.0.0.1:8443"),
            Err(PasskeyError::IpHost(_))
        ));
        assert!(RelyingParty::new("http://localhost:1").is_ok());
        assert!(RelyingParty::new("http://gateway.example.com").is_err());
        assert!(RelyingParty::new("ftp://127.0.0.1").is_err());
        assert_eq!(
            RelyingParty::new("https://g.example:8443/mcp?x#y")
                .expect("rp")
                .origin(),
            "https://g.example:8443"
        );
    }

    #[test]
    fn a_malformed_or_doubly_listed_passkey_refuses_the_list() {
        assert!(listed(&Value::Null).expect("none").is_empty());
        assert!(listed(&json!({})).is_err());
        assert!(listed(&json!([{"name": "alice", "credential": {}}])).is_err());
        assert!(listed(&json!([{"name": "", "credential": {}}])).is_err());
        // A look-alike of a name (a Cyrillic a) is refused in the list too,
        // whoever edited the entry.
        let a = Authenticator::new();
        let cred = serde_json::to_value(&a.listed("bob").credential).expect("json");
        assert!(listed(&json!([{"name": "\u{0430}lice", "credential": cred}])).is_err());
        assert!(plain_name("bob.smith@corp-1"));
        assert!(!plain_name("bob\u{3164}"), "a Hangul filler");
    }

    #[test]
    fn one_passkey_listed_for_two_names_refuses_the_list() {
        let a = Authenticator::new();
        let cred = serde_json::to_value(&a.listed("bob").credential).expect("json");
        let e = listed(&json!([{"name": "bob", "credential": cred},
                               {"name": "alice", "credential": cred}]))
        .expect_err("listed twice");
        assert!(e.to_string().contains("already listed for bob"), "{e}");
    }

    #[test]
    fn an_assertion_proves_its_statement_for_its_origin_with_user_verification() {
        let rp = RelyingParty::new("https://gw.example:8443").expect("rp");
        let a = Authenticator::new();
        let bob = a.listed("bob");
        let statement = b"{\"approval_id\":\"ap-1\"}\n";
        let challenge = statement_challenge(statement);
        let good = a.assert("https://gw.example:8443", "gw.example", &challenge, true);
        let proven = rp
            .verify(std::slice::from_ref(&bob), &challenge, &good)
            .expect("verifies");
        assert_eq!((proven.name.as_str(), proven.user_verified), ("bob", true));
        // Recorded and checked again, as audit verify does.
        let recorded = |st: &[u8]| {
            verify_recorded(
                "https://gw.example:8443",
                "bob",
                &proven.credential,
                std::str::from_utf8(st).expect("utf8"),
                &good.to_string(),
            )
        };
        assert!(recorded(statement).is_ok());
        // Another statement (another approval, verdict or reason): refused.
        assert!(matches!(
            recorded(b"{\"approval_id\":\"ap-2\"}\n"),
            Err(PasskeyError::Invalid(_))
        ));
        let other = statement_challenge(b"other");
        assert!(
            rp.verify(std::slice::from_ref(&bob), &other, &good)
                .is_err()
        );
        // Without user verification: refused.
        let unverified = a.assert("https://gw.example:8443", "gw.example", &challenge, false);
        assert!(
            rp.verify(std::slice::from_ref(&bob), &challenge, &unverified)
                .is_err()
        );
        // Made for another origin (a page the agent controls): refused.
        let phished = a.assert("https://evil.example", "gw.example", &challenge, true);
        assert!(
            rp.verify(std::slice::from_ref(&bob), &challenge, &phished)
                .is_err()
        );
        // The same host on another port (another program on the gateway's
        // host, or the agent's own server on localhost): another origin.
        let port = a.assert("https://gw.example:9443", "gw.example", &challenge, true);
        assert!(
            rp.verify(std::slice::from_ref(&bob), &challenge, &port)
                .is_err()
        );
        let other_rp = a.assert("https://gw.example:8443", "evil.example", &challenge, true);
        assert!(
            rp.verify(std::slice::from_ref(&bob), &challenge, &other_rp)
                .is_err()
        );
        // A passkey the policy does not list: unknown, whoever holds it.
        let mallory = Authenticator {
            id: vec![9u8; 16],
            ..Authenticator::new()
        };
        let theirs = mallory.assert("https://gw.example:8443", "gw.example", &challenge, true);
        assert_eq!(
            rp.verify(std::slice::from_ref(&bob), &challenge, &theirs),
            Err(PasskeyError::Unknown)
        );
        // Signed by another key under the listed id: refused.
        let forged = Authenticator {
            id: a.id.clone(),
            ..Authenticator::new()
        };
        let forged = forged.assert("https://gw.example:8443", "gw.example", &challenge, true);
        assert!(
            rp.verify(std::slice::from_ref(&bob), &challenge, &forged)
                .is_err()
        );
    }

    #[test]
    fn the_challenge_is_the_statements_digest() {
        let rp = RelyingParty::new("https://g.example").expect("rp");
        // No listed passkey: nothing can answer, and no options are made.
        assert_eq!(rp.request_options(&[], b"x"), Err(PasskeyError::Unknown));
        assert_eq!(
            hex::encode(statement_challenge(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
