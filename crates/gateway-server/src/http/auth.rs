//! The OAuth 2.1 resource server's half (MCP authorization, RFC 9068 JWT
//! access tokens): a bearer token is accepted only when it is a JWT signed
//! by a key of a configured issuer's JWKS, with an allowed asymmetric
//! algorithm, that issuer as `iss`, this gateway's resource URI in `aud`
//! (RFC 8707: a token meant for another service is refused, never passed
//! on), and `exp`/`nbf` within a bounded leeway.
//!
//! Keys: each issuer's JWKS is found from its metadata (OpenID discovery,
//! else RFC 8414), kept, and fetched again only when a token names a `kid`
//! it does not have (a key rotation), at most once per
//! [`MIN_REFRESH`] — never per request.
//!
//! Parsing and signature checks are `jsonwebtoken`'s; the algorithm is the
//! one the key is for, never taken from the token alone.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;

use gateway_core::config::http::IssuerConfig;
use gateway_policy::{Principal, PrincipalKind};

/// The largest token looked at (bytes of the header value).
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// An unknown `kid` fetches an issuer's keys again at most this often.
pub const MIN_REFRESH: Duration = Duration::from_secs(30);
/// Keys are fetched again when older than this, on the next token.
pub const KEYS_MAX_AGE: Duration = Duration::from_secs(3600);

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// 401 `invalid_token`: the token is not one this gateway accepts.
    #[error("{0}")]
    InvalidToken(String),
    /// 403 `insufficient_scope`.
    #[error("{0}")]
    InsufficientScope(String),
    /// 503: an issuer's keys cannot be had now (the token may be fine).
    #[error("{0}")]
    Unavailable(String),
    /// The configuration is wrong (at start).
    #[error("{0}")]
    Config(String),
}

/// What a refused token said of itself, for the audit (never the token).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TokenFacts {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alg: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iss: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sub: Option<String>,
}

struct Issuer {
    config: IssuerConfig,
    audience: String,
    algorithms: Vec<Algorithm>,
    http: reqwest::Client,
    /// The keys held; read by every token, written only by a refresh.
    keys: std::sync::RwLock<Keys>,
    /// One refresh at a time, the network call made without `keys` held
    /// (tokens whose key is held keep being served meanwhile).
    refreshing: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Keys {
    by_kid: HashMap<String, (Jwk, DecodingKey)>,
    /// Keys without a `kid` (tried in turn when a token names none).
    unnamed: Vec<(Jwk, DecodingKey)>,
    fetched: Option<Instant>,
    jwks_uri: Option<String>,
    /// Counts the changes of the key set: a token verified under an older
    /// set is checked again (its key may have been withdrawn).
    generation: u64,
    /// The key set last fetched, as JSON (a fetch that brings the same
    /// keys changes nothing).
    fetched_set: String,
}

/// The most tokens kept verified (one a person, give or take).
pub const MAX_VERIFIED: usize = 4096;

/// A token that verified: what it proved, until when, under which keys.
#[derive(Clone)]
struct Verified {
    principal: Principal,
    /// The token's `exp` and `nbf`, in seconds since the epoch.
    exp: i64,
    nbf: Option<i64>,
    issuer: usize,
    generation: u64,
}

/// Every configured issuer.
#[derive(Clone)]
pub struct Verifier {
    issuers: Arc<Vec<Issuer>>,
    /// Tokens already verified, by the SHA-256 of the token: an agent
    /// sends the same token with every request, and an ES256 signature
    /// costs more to check than the policy does to decide. An entry is
    /// used only before the token's `exp` (with the issuer's leeway) and
    /// while the keys it verified under are the ones held and not too old.
    verified: Arc<std::sync::Mutex<HashMap<[u8; 32], Verified>>>,
}

impl Verifier {
    pub fn new(configs: &[IssuerConfig], resource: &str) -> Result<Verifier, AuthError> {
        let mut issuers = Vec::new();
        for c in configs {
            if !c.issuer.starts_with("https://") {
                return Err(AuthError::Config(format!(
                    "[[http.issuers]] issuer {:?} must be an https:// URL (its keys come from it)",
                    c.issuer
                )));
            }
            if c.leeway_seconds > 300 {
                return Err(AuthError::Config(format!(
                    "[[http.issuers]] {}: leeway_seconds is {}, at most 300",
                    c.issuer, c.leeway_seconds
                )));
            }
            let mut algorithms = Vec::new();
            for a in &c.algorithms {
                let alg: Algorithm = a.parse().map_err(|_| {
                    AuthError::Config(format!(
                        "[[http.issuers]] {}: unknown algorithm {a:?}",
                        c.issuer
                    ))
                })?;
                if matches!(alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512) {
                    return Err(AuthError::Config(format!(
                        "[[http.issuers]] {}: {a} is refused: a shared-secret algorithm would let anyone who holds the key (every resource server) mint tokens",
                        c.issuer
                    )));
                }
                algorithms.push(alg);
            }
            if algorithms.is_empty() {
                return Err(AuthError::Config(format!(
                    "[[http.issuers]] {}: no algorithms",
                    c.issuer
                )));
            }
            let mut b = reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .redirect(reqwest::redirect::Policy::none())
                .https_only(true);
            if let Some(ca) = &c.ca_file {
                let pem = std::fs::read(ca).map_err(|e| {
                    AuthError::Config(format!("[[http.issuers]] ca_file {}: {e}", ca.display()))
                })?;
                for cert in reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                    AuthError::Config(format!("[[http.issuers]] ca_file {}: {e}", ca.display()))
                })? {
                    b = b.add_root_certificate(cert);
                }
            }
            let http = b
                .build()
                .map_err(|e| AuthError::Config(format!("an HTTPS client: {e}")))?;
            issuers.push(Issuer {
                audience: c.audience.clone().unwrap_or_else(|| resource.to_string()),
                config: c.clone(),
                algorithms,
                http,
                keys: std::sync::RwLock::new(Keys {
                    jwks_uri: c.jwks_uri.clone(),
                    ..Keys::default()
                }),
                refreshing: tokio::sync::Mutex::new(()),
            });
        }
        Ok(Verifier {
            issuers: Arc::new(issuers),
            verified: Arc::default(),
        })
    }

    /// The issuers, for the protected resource metadata.
    pub fn issuer_ids(&self) -> Vec<String> {
        self.issuers
            .iter()
            .map(|i| i.config.issuer.clone())
            .collect()
    }

    /// Fetch every issuer's keys now (at start: a wrong issuer shows at
    /// once). Returns each failure.
    pub async fn warm(&self) -> Vec<String> {
        let mut errs = Vec::new();
        for i in self.issuers.iter() {
            let _gate = i.refreshing.lock().await;
            if let Err(e) = i.refresh().await {
                errs.push(e.to_string());
            }
        }
        errs
    }

    /// The principal `token` proves, or why it proves nothing.
    pub async fn verify(
        &self,
        token: &str,
        client: &str,
    ) -> Result<Principal, (AuthError, TokenFacts)> {
        use sha2::Digest;
        if token.len() > MAX_TOKEN_BYTES {
            return Err((
                AuthError::InvalidToken(format!(
                    "the token is {} bytes, more than the {MAX_TOKEN_BYTES} accepted",
                    token.len()
                )),
                TokenFacts::default(),
            ));
        }
        let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        if let Some(mut principal) = self.still_verified(&digest) {
            principal.client = client.to_string();
            return Ok(principal);
        }
        let v = self.verify_signed(token, client).await?;
        let principal = v.principal.clone();
        let mut kept = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() >= MAX_VERIFIED {
            let now = chrono::Utc::now().timestamp();
            kept.retain(|_, v| v.exp >= now);
            if kept.len() >= MAX_VERIFIED {
                kept.clear();
            }
        }
        kept.insert(digest, v);
        Ok(principal)
    }

    /// What a token verified before still proves: nothing once it has
    /// expired (by the issuer's leeway, as at its first check), or once its
    /// issuer's keys were fetched again or are old enough to be.
    fn still_verified(&self, digest: &[u8; 32]) -> Option<Principal> {
        let v = self
            .verified
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(digest)
            .cloned()?;
        let issuer = self.issuers.get(v.issuer)?;
        let now = chrono::Utc::now().timestamp();
        let leeway = issuer.config.leeway_seconds as i64;
        if v.exp.saturating_add(leeway) < now
            || v.nbf.is_some_and(|n| n > now.saturating_add(leeway))
        {
            return None;
        }
        let keys = issuer.keys.read().unwrap_or_else(|e| e.into_inner());
        (keys.generation == v.generation
            && keys.fetched.is_some_and(|t| t.elapsed() < KEYS_MAX_AGE))
        .then_some(v.principal)
    }

    /// The full check of a token: its signature, then its claims.
    async fn verify_signed(
        &self,
        token: &str,
        client: &str,
    ) -> Result<Verified, (AuthError, TokenFacts)> {
        let mut facts = TokenFacts::default();
        if token.len() > MAX_TOKEN_BYTES {
            return Err((
                AuthError::InvalidToken(format!(
                    "the token is {} bytes, more than the {MAX_TOKEN_BYTES} accepted",
                    token.len()
                )),
                facts,
            ));
        }
        let header = jsonwebtoken::decode_header(token).map_err(|e| {
            (
                AuthError::InvalidToken(format!("the token is not a JWT: {e}")),
                TokenFacts::default(),
            )
        })?;
        facts.alg = Some(format!("{:?}", header.alg));
        facts.kid = header.kid.as_deref().map(|k| truncate(k, 100));
        // The issuer it claims picks the keys (checked again below).
        let claimed = unverified_claims(token);
        facts.iss = claimed
            .get("iss")
            .and_then(Value::as_str)
            .map(|s| truncate(s, 200));
        facts.sub = claimed
            .get("sub")
            .and_then(Value::as_str)
            .map(|s| truncate(s, 200));
        let Some((index, issuer)) = self.issuers.iter().enumerate().find(|(_, i)| {
            Some(i.config.issuer.as_str()) == claimed.get("iss").and_then(Value::as_str)
        }) else {
            return Err((
                AuthError::InvalidToken(format!(
                    "the token's issuer {} is not one this gateway trusts",
                    facts
                        .iss
                        .as_deref()
                        .map_or("(none)".into(), |s| format!("{s:?}"))
                )),
                facts,
            ));
        };
        if issuer.config.require_at_jwt
            && !header.typ.as_deref().is_some_and(|t| {
                t.eq_ignore_ascii_case("at+jwt") || t.eq_ignore_ascii_case("application/at+jwt")
            })
        {
            return Err((
                AuthError::InvalidToken(format!(
                    "the token's type is {:?}, not an access token (at+jwt)",
                    header
                        .typ
                        .as_deref()
                        .map(|t| truncate(t, 40))
                        .unwrap_or_default()
                )),
                facts,
            ));
        }
        if !issuer.algorithms.contains(&header.alg) {
            return Err((
                AuthError::InvalidToken(format!(
                    "the token is signed with {:?}, which is not among the algorithms accepted for {}",
                    header.alg, issuer.config.issuer
                )),
                facts,
            ));
        }
        let (jwk, key, generation) = issuer
            .key_for(header.kid.as_deref())
            .await
            .map_err(|e| (e, facts.clone()))?;
        // The key decides the algorithm: a token may not pick another one
        // for it (an RSA key used as an HMAC secret, say).
        if let Some(ka) = jwk.common.key_algorithm
            && format!("{ka:?}") != format!("{:?}", header.alg)
        {
            return Err((
                AuthError::InvalidToken(format!(
                    "the token says {:?} but its key is for {ka:?}",
                    header.alg
                )),
                facts,
            ));
        }
        let mut v = Validation::new(header.alg);
        v.algorithms = vec![header.alg];
        v.leeway = issuer.config.leeway_seconds;
        v.validate_nbf = true;
        v.validate_exp = true;
        v.set_issuer(&[issuer.config.issuer.as_str()]);
        v.set_audience(&[issuer.audience.as_str()]);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let data = jsonwebtoken::decode::<Value>(token, &key, &v).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind as K;
            let why = match e.kind() {
                K::ExpiredSignature => "the token has expired".to_string(),
                K::ImmatureSignature => "the token is not valid yet (nbf)".to_string(),
                K::InvalidAudience => format!(
                    "the token is for another audience, not this gateway ({}); a token is used only where it was issued for",
                    issuer.audience
                ),
                K::InvalidIssuer => "the token's issuer does not match".to_string(),
                K::InvalidSignature => "the token's signature does not verify".to_string(),
                K::InvalidAlgorithm => "the token's algorithm does not fit its key".to_string(),
                K::MissingRequiredClaim(c) => format!("the token has no {c} claim"),
                other => format!("the token does not verify: {other:?}"),
            };
            (AuthError::InvalidToken(why), facts.clone())
        })?;
        let claims = data.claims;
        let subject = claims
            .get("sub")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                (
                    AuthError::InvalidToken("the token's sub is not a string".into()),
                    facts.clone(),
                )
            })?;
        let user = claim(&claims, &issuer.config.username_claim)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                (
                    AuthError::InvalidToken(format!(
                        "the token has no {} claim (the username claim configured for {})",
                        issuer.config.username_claim, issuer.config.issuer
                    )),
                    facts.clone(),
                )
            })?;
        // An e-mail the provider says it has not verified names nobody.
        if (issuer.config.username_claim == issuer.config.email_claim
            || issuer.config.username_claim == "email")
            && claims.get("email_verified") == Some(&Value::Bool(false))
        {
            return Err((
                AuthError::InvalidToken(
                    "the token's e-mail is not verified (email_verified: false), and it is the username"
                        .into(),
                ),
                facts,
            ));
        }
        let groups = match claim(&claims, &issuer.config.groups_claim) {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .map(|g| g.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    (
                        AuthError::InvalidToken(format!(
                            "the token's {} claim is not a list of strings",
                            issuer.config.groups_claim
                        )),
                        facts.clone(),
                    )
                })?,
            Some(_) => {
                return Err((
                    AuthError::InvalidToken(format!(
                        "the token's {} claim is not a list of strings",
                        issuer.config.groups_claim
                    )),
                    facts,
                ));
            }
        };
        if !issuer.config.required_scopes.is_empty() {
            let have: Vec<&str> = match claims.get("scope").or_else(|| claims.get("scp")) {
                Some(Value::String(s)) => s.split(' ').collect(),
                Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            let missing: Vec<&String> = issuer
                .config
                .required_scopes
                .iter()
                .filter(|s| !have.contains(&s.as_str()))
                .collect();
            if !missing.is_empty() {
                return Err((
                    AuthError::InsufficientScope(format!(
                        "the token lacks the scope(s) {}",
                        missing
                            .iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(" ")
                    )),
                    facts,
                ));
            }
        }
        let text = |name: &str| {
            claim(&claims, name)
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        // `exp` is there and a number: the validation required it.
        let exp = claims
            .get("exp")
            .and_then(|e| e.as_i64().or_else(|| e.as_f64().map(|f| f.floor() as i64)));
        let nbf = claims
            .get("nbf")
            .and_then(|e| e.as_i64().or_else(|| e.as_f64().map(|f| f.ceil() as i64)));
        let Some(exp) = exp else {
            return Err((
                AuthError::InvalidToken("the token's exp is not a number".into()),
                facts,
            ));
        };
        let principal = Principal {
            kind: PrincipalKind::Sso,
            client: client.to_string(),
            user: user.to_string(),
            os_user: None,
            uid: None,
            groups,
            issuer: Some(issuer.config.issuer.clone()),
            subject: Some(subject.to_string()),
            email: text(&issuer.config.email_claim),
            client_id: text("client_id").or_else(|| text("azp")),
        };
        Ok(Verified {
            principal,
            exp,
            nbf,
            issuer: index,
            generation,
        })
    }
}

/// A key held: the JWK, its decoding key, and the fetch it came from.
type Held = (Jwk, DecodingKey, u64);

impl Issuer {
    /// The key for `kid`: from the keys held, else (a rotation) from the
    /// issuer's JWKS fetched again, at most once per [`MIN_REFRESH`].
    async fn key_for(&self, kid: Option<&str>) -> Result<Held, AuthError> {
        let held = |this: &Self| {
            let k = this.keys.read().unwrap_or_else(|e| e.into_inner());
            (
                k.find(kid),
                k.fetched.is_none_or(|t| t.elapsed() >= KEYS_MAX_AGE),
                k.fetched.is_none_or(|t| t.elapsed() >= MIN_REFRESH),
            )
        };
        let (found, stale, may_fetch) = held(self);
        if let Some(k) = &found
            && !stale
        {
            return Ok(k.clone());
        }
        if !may_fetch {
            return found.ok_or_else(|| self.not_among(kid));
        }
        let _gate = match self.refreshing.try_lock() {
            Ok(g) => g,
            Err(_) => {
                // Another token is fetching: a key held (if stale) serves,
                // else wait for that fetch and look again.
                if let Some(k) = found {
                    return Ok(k);
                }
                drop(self.refreshing.lock().await);
                return held(self).0.ok_or_else(|| self.not_among(kid));
            }
        };
        // A refresh that ended while this one waited counts.
        let (found, _, may_fetch) = held(self);
        if !may_fetch {
            return found.ok_or_else(|| self.not_among(kid));
        }
        if let Err(e) = self.refresh().await {
            // Keys already held still serve while the issuer is away.
            if let Some(k) = found {
                tracing::warn!(issuer = %self.config.issuer, "its keys could not be fetched again: {e}");
                return Ok(k);
            }
            return Err(e);
        }
        held(self).0.ok_or_else(|| self.not_among(kid))
    }

    fn not_among(&self, kid: Option<&str>) -> AuthError {
        AuthError::InvalidToken(match kid {
            Some(k) => format!(
                "the token's key {:?} is not among {}'s keys",
                truncate(k, 100),
                self.config.issuer
            ),
            None => format!(
                "the token names no key and {} has no key without a name",
                self.config.issuer
            ),
        })
    }

    /// Fetch the issuer's keys (its caller holds `refreshing`); `keys` is
    /// locked only to read the JWKS address and to put the new keys in.
    async fn refresh(&self) -> Result<(), AuthError> {
        let known_uri = {
            let mut k = self.keys.write().unwrap_or_else(|e| e.into_inner());
            // Counted as a fetch even when it fails: an issuer that is down
            // is not asked again for every token.
            k.fetched = Some(Instant::now());
            k.jwks_uri.clone()
        };
        let unavailable =
            |m: String| AuthError::Unavailable(format!("{}: {m}", self.config.issuer));
        let jwks_uri = match known_uri {
            Some(u) => u,
            None => {
                let u = self.discover().await.map_err(unavailable)?;
                self.keys
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .jwks_uri = Some(u.clone());
                u
            }
        };
        let set: JwkSet = self
            .get_json(&jwks_uri)
            .await
            .and_then(|v| serde_json::from_value(v).map_err(|e| format!("its JWKS: {e}")))
            .map_err(unavailable)?;
        let fetched_set = serde_json::to_string(&set.keys).unwrap_or_default();
        let mut by_kid = HashMap::new();
        let mut unnamed = Vec::new();
        for jwk in set.keys {
            // Signing keys only; symmetric keys never.
            if matches!(
                jwk.common.public_key_use,
                Some(jsonwebtoken::jwk::PublicKeyUse::Encryption)
            ) || matches!(
                jwk.algorithm,
                jsonwebtoken::jwk::AlgorithmParameters::OctetKey(_)
            ) {
                continue;
            }
            let Ok(key) = DecodingKey::from_jwk(&jwk) else {
                continue;
            };
            match jwk.common.key_id.clone() {
                Some(kid) => {
                    by_kid.insert(kid, (jwk, key));
                }
                None => unnamed.push((jwk, key)),
            }
        }
        tracing::info!(issuer = %self.config.issuer, keys = by_kid.len() + unnamed.len(), "fetched the issuer's signing keys");
        let mut k = self.keys.write().unwrap_or_else(|e| e.into_inner());
        k.by_kid = by_kid;
        k.unnamed = unnamed;
        if k.fetched_set != fetched_set {
            k.generation += 1;
            k.fetched_set = fetched_set;
        }
        Ok(())
    }

    /// The issuer's `jwks_uri`, from its metadata (which must name it as
    /// the issuer: RFC 8414 §3.3).
    async fn discover(&self) -> Result<String, String> {
        let base = self.config.issuer.trim_end_matches('/');
        let mut last = String::new();
        for path in [
            "/.well-known/openid-configuration",
            "/.well-known/oauth-authorization-server",
        ] {
            match self.get_json(&format!("{base}{path}")).await {
                Ok(meta) => {
                    if meta.get("issuer").and_then(Value::as_str)
                        != Some(self.config.issuer.as_str())
                    {
                        return Err(format!(
                            "its metadata at {path} names another issuer ({:?})",
                            meta.get("issuer")
                        ));
                    }
                    return meta
                        .get("jwks_uri")
                        .and_then(Value::as_str)
                        .filter(|u| u.starts_with("https://"))
                        .map(str::to_string)
                        .ok_or_else(|| format!("its metadata at {path} has no https jwks_uri"));
                }
                Err(e) => last = e,
            }
        }
        Err(format!("no metadata: {last}"))
    }

    async fn get_json(&self, url: &str) -> Result<Value, String> {
        let r = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| format!("GET {url}: {}", e.without_url()))?;
        if !r.status().is_success() {
            return Err(format!("GET {url}: {}", r.status()));
        }
        let body = r
            .bytes()
            .await
            .map_err(|e| format!("GET {url}: {}", e.without_url()))?;
        if body.len() > 1024 * 1024 {
            return Err(format!("GET {url}: more than 1 MiB"));
        }
        serde_json::from_slice(&body).map_err(|e| format!("GET {url}: not JSON: {e}"))
    }
}

impl Keys {
    fn find(&self, kid: Option<&str>) -> Option<Held> {
        let found = match kid {
            Some(k) => self.by_kid.get(k),
            None if self.unnamed.len() == 1 => self.unnamed.first(),
            None if self.unnamed.is_empty() && self.by_kid.len() == 1 => {
                self.by_kid.values().next()
            }
            None => None,
        };
        found.map(|(j, d)| (j.clone(), d.clone(), self.generation))
    }
}

/// A claim by name, or by a dotted path into objects.
fn claim<'a>(claims: &'a Value, name: &str) -> Option<&'a Value> {
    if let Some(v) = claims.get(name) {
        return Some(v);
    }
    name.split('.').try_fold(claims, |v, part| v.get(part))
}

/// The payload of a JWT, unverified: only to pick the issuer whose keys
/// then verify it, to name a refused token in the audit, and (the CLI) to
/// decide which gateway a token may be sent to.
pub fn unverified_claims(token: &str) -> Value {
    use base64::Engine;
    token
        .split('.')
        .nth(1)
        .and_then(|p| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(p.trim_end_matches('='))
                .ok()
        })
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null)
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().filter(|c| !c.is_control()).take(n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issuer(algs: &[&str]) -> IssuerConfig {
        IssuerConfig {
            issuer: "https://idp.example".into(),
            audience: None,
            jwks_uri: None,
            ca_file: None,
            username_claim: gateway_core::config::http::default_username_claim(),
            groups_claim: gateway_core::config::http::default_groups_claim(),
            email_claim: gateway_core::config::http::default_email_claim(),
            algorithms: algs.iter().map(|s| s.to_string()).collect(),
            leeway_seconds: 60,
            required_scopes: vec![],
            require_at_jwt: true,
        }
    }

    #[test]
    fn shared_secret_algorithms_and_plain_http_issuers_are_refused_at_start() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        assert!(Verifier::new(&[issuer(&["RS256"])], "https://gw/mcp").is_ok());
        let e = Verifier::new(&[issuer(&["HS256"])], "https://gw/mcp")
            .err()
            .map(|e| e.to_string());
        assert!(
            e.as_deref().is_some_and(|e| e.contains("shared-secret")),
            "{e:?}"
        );
        let e = Verifier::new(&[issuer(&["none"])], "https://gw/mcp")
            .err()
            .map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("unknown algorithm")),
            "{e:?}"
        );
        let mut plain = issuer(&["RS256"]);
        plain.issuer = "http://idp.example".into();
        let e = Verifier::new(&[plain], "https://gw/mcp")
            .err()
            .map(|e| e.to_string());
        assert!(
            e.as_deref().is_some_and(|e| e.contains("https://")),
            "{e:?}"
        );
    }

    #[test]
    fn claims_are_found_by_name_or_dotted_path() {
        let c = serde_json::json!({"a.b": 1, "realm_access": {"roles": ["x"]}});
        assert_eq!(claim(&c, "a.b"), Some(&serde_json::json!(1)));
        assert_eq!(
            claim(&c, "realm_access.roles"),
            Some(&serde_json::json!(["x"]))
        );
        assert_eq!(claim(&c, "nope.x"), None);
    }
}
