//! The approval page (`/approvals/…` on the HTTP listener): an approver on
//! any device reads a pending approval — the destructive signals first,
//! then the changes by action with their attribute diffs, who asked, when
//! it expires, who granted — and approves or denies it with a passkey.
//!
//! - Reading needs a session, opened with a passkey the policy lists
//!   (`data.gateway.approvals.passkeys`) with user verification. The
//!   session is an HMAC-tagged cookie (`HttpOnly`, `SameSite=Strict`,
//!   `Secure` over TLS, 15 minutes), checked again at every request against
//!   the list of now.
//! - A verdict is a passkey assertion over the SHA-256 of the approval's
//!   statement (the one an SSH key signs), checked by the daemon's verdict
//!   path like a signature, judged by the policy; the requester's session
//!   sees no grant button and its crafted post is refused there.
//! - Every state change is a JSON POST from this origin (`Origin`,
//!   `Sec-Fetch-Site`, `Content-Type`) carrying the session's CSRF token.
//! - Every page is server-rendered without inline script or style: a CSP of
//!   `default-src 'none'`, `frame-ancestors 'none'`, no referrer, no
//!   caching. Every string from the plan or the agent is escaped, control
//!   and format (bidi, zero-width) characters shown as `\u{..}`; no link
//!   on the page comes from them.
//!
//! Nothing is decided here: who may grant is the policy's verdict, asked
//! the same way as for `gateway approve`.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use hmac::{Hmac, Mac};
use http_body_util::{BodyExt, Full};
use hyper::http::{HeaderValue, Request, Response, StatusCode, header};
use maud::{DOCTYPE, Markup, html};
use serde_json::{Value, json};
use sha2::Sha256;

use super::Body;
use crate::daemon::{Asker, ControlHandler};
use gateway_audit::approvals::passkey::{self, Listed, RelyingParty, plain_name};
use gateway_audit::audit::{AuditLog, Event};

/// How long a page session lasts.
pub const SESSION: Duration = Duration::from_secs(15 * 60);
/// How long a sign-in or registration ceremony may take.
const CEREMONY: Duration = Duration::from_secs(180);
/// How long a statement made for the page may be signed and submitted.
const STATEMENT_VALID_FOR: u64 = 300;
/// The largest JSON body a page posts.
pub const MAX_BODY: usize = 64 * 1024;

/// A page request, its body read whole by the transport (within the
/// request's deadline and [`MAX_BODY`]).
pub type PageBody = http_body_util::Full<bytes::Bytes>;

const SESSION_COOKIE: &str = "gw_session";
/// Registration steps one address may take each minute (a registration
/// is two).
const REGISTRATIONS_PER_MINUTE: u32 = 20;
const LOGIN_COOKIE: &str = "gw_login";
const REGISTER_COOKIE: &str = "gw_register";

const PAGE_JS: &str = include_str!("page.js");
const PAGE_CSS: &str = include_str!("page.css");

/// A refusal: its status and reason (audited by the listener as
/// `http.refused`; the reason is shown to the browser as text).
pub type Refused = (StatusCode, String);

/// The approval page's state.
pub struct Pages {
    key: [u8; 32],
    rp: RelyingParty,
    secure: bool,
    policy: Arc<gateway_policy::PolicyStore>,
    control: ControlHandler,
    audit: Arc<AuditLog>,
    /// Its store holds the page's single-use marks (spent sign-ins,
    /// ended sessions), shared by replicas.
    pipeline: Arc<gateway_core::pipeline::Pipeline>,
    /// Registrations started per address in the current minute.
    registrations:
        std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, (std::time::Instant, u32)>>,
}

impl std::fmt::Debug for Pages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pages({:?})", self.rp)
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn unb64(s: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .ok()
}

fn now_ms() -> i64 {
    gateway_audit::approvals::now_ms()
}

impl Pages {
    /// For the listener whose resource URL is `resource` (its origin is the
    /// page's, and the passkeys' relying party).
    pub fn new(
        resource: &str,
        key: Option<[u8; 32]>,
        policy: Arc<gateway_policy::PolicyStore>,
        control: ControlHandler,
        audit: Arc<AuditLog>,
        pipeline: Arc<gateway_core::pipeline::Pipeline>,
    ) -> Result<Pages, String> {
        let rp = RelyingParty::new(resource).map_err(|e| e.to_string())?;
        let secure = rp.origin().starts_with("https://");
        let key = match key {
            Some(k) => k,
            None => {
                let mut k = [0u8; 32];
                getrandom::fill(&mut k)
                    .map_err(|e| format!("no random key for page sessions: {e}"))?;
                k
            }
        };
        Ok(Pages {
            key,
            rp,
            // From the origin browsers see (a TLS proxy in front of a
            // plain listener is still https to them).
            secure,
            policy,
            control,
            audit,
            pipeline,
            registrations: Default::default(),
        })
    }

    /// The page's origin (`https://host:port`).
    pub fn origin(&self) -> String {
        self.rp.origin()
    }

    fn tag(&self, what: &str, payload: &[u8]) -> Vec<u8> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("any key length");
        mac.update(what.as_bytes());
        mac.update(&[0]);
        mac.update(payload);
        mac.finalize().into_bytes().to_vec()
    }

    /// `payload` as a tagged cookie value for purpose `what`.
    fn seal(&self, what: &str, payload: &Value) -> String {
        let p = payload.to_string();
        format!(
            "{}.{}",
            b64(p.as_bytes()),
            b64(&self.tag(what, p.as_bytes()))
        )
    }

    /// A tagged value back, if its tag is right and it has not expired
    /// (its `e`, milliseconds).
    fn open(&self, what: &str, sealed: &str) -> Option<Value> {
        let (p, t) = sealed.split_once('.')?;
        let p = unb64(p)?;
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).ok()?;
        mac.update(what.as_bytes());
        mac.update(&[0]);
        mac.update(&p);
        mac.verify_slice(&unb64(t)?).ok()?;
        let v: Value = serde_json::from_slice(&p).ok()?;
        (v["e"].as_i64()? > now_ms()).then_some(v)
    }

    /// A cookie's name: over https with the `__Host-` prefix (the browser
    /// then takes it only from this origin's host, `Secure`, `Path=/`, no
    /// `Domain`: a sibling subdomain cannot plant one).
    fn cookie_name(&self, base: &str) -> String {
        if self.secure {
            format!("__Host-{base}")
        } else {
            base.to_string()
        }
    }

    fn cookie(&self, base: &str, value: &str, max_age: Duration) -> String {
        format!(
            "{}={value}; Path={}; Max-Age={}; HttpOnly; SameSite=Strict{}",
            self.cookie_name(base),
            if self.secure { "/" } else { "/approvals" },
            max_age.as_secs(),
            if self.secure { "; Secure" } else { "" }
        )
    }

    fn cookie_of(&self, req: &Request<PageBody>, base: &str) -> Option<String> {
        cookie(req, &self.cookie_name(base))
    }

    fn passkeys(&self) -> Vec<Listed> {
        match self.policy.current() {
            Ok(set) => gateway_core::pipeline::approval_proofs(&set).passkeys,
            Err(_) => Vec::new(),
        }
    }

    /// The session's approver, while the policy still lists a passkey of
    /// theirs.
    fn session(&self, req: &Request<PageBody>) -> Option<(String, String, i64)> {
        let v = self.open("session", &self.cookie_of(req, SESSION_COOKIE)?)?;
        let name = v["n"].as_str()?.to_string();
        let sid = v["s"].as_str()?.to_string();
        let until = v["e"].as_i64()?;
        // The passkey that opened it must still be listed, for this name.
        let credential = v["k"].as_str()?;
        self.passkeys()
            .iter()
            .any(|l| l.name == name && l.id == credential)
            .then_some((name, sid, until))
    }

    /// Mark `id` used until `until_ms`, in the store every replica shares:
    /// true the first time only. A store that cannot answer refuses.
    async fn once(&self, id: String, until_ms: i64) -> Result<bool, Refused> {
        let p = Arc::clone(&self.pipeline);
        tokio::task::spawn_blocking(move || p.approvals().spend_once(&id, until_ms))
            .await
            .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
            .map_err(|e| {
                tracing::warn!("the approval page's single-use marks: {e}");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the approval store cannot be reached; try again shortly".to_string(),
                )
            })
    }

    /// Whether page session `sid` was signed out (on any replica). A store
    /// that cannot answer counts as signed out.
    async fn signed_out(&self, sid: &str) -> bool {
        let p = Arc::clone(&self.pipeline);
        let id = format!("page-session:{sid}");
        tokio::task::spawn_blocking(move || p.approvals().is_spent(&id))
            .await
            .map(|r| r.unwrap_or(true))
            .unwrap_or(true)
    }

    fn csrf(&self, sid: &str) -> String {
        b64(&self.tag("csrf", sid.as_bytes()))
    }

    /// Serve one request under `/approvals`.
    pub async fn handle(
        &self,
        req: Request<PageBody>,
        remote: std::net::SocketAddr,
    ) -> Result<Response<Body>, Refused> {
        let path = req.uri().path().to_string();
        let method = req.method().clone();
        let get = method == hyper::Method::GET || method == hyper::Method::HEAD;
        let post = method == hyper::Method::POST;
        match path.as_str() {
            "/approvals/static/page.js" if get => {
                return Ok(asset(PAGE_JS, "text/javascript; charset=utf-8"));
            }
            "/approvals/static/page.css" if get => {
                return Ok(asset(PAGE_CSS, "text/css; charset=utf-8"));
            }
            "/approvals/login" if get => {
                return Ok(page_response(StatusCode::OK, self.login_page()));
            }
            "/approvals/passkeys/register" if get => {
                return Ok(page_response(StatusCode::OK, self.register_page()));
            }
            _ => {}
        }
        if post {
            self.same_origin(&req)?;
        }
        match path.as_str() {
            "/approvals/login/options" if post => {
                let body = json_body(req).await?;
                return self.login_options(&body);
            }
            "/approvals/login/finish" if post => {
                let login = self.cookie_of(&req, LOGIN_COOKIE);
                let body = json_body(req).await?;
                return self.login_finish(login.as_deref(), &body, remote).await;
            }
            "/approvals/passkeys/register/options" if post => {
                let body = json_body(req).await?;
                return self.register_options(&body, remote);
            }
            "/approvals/passkeys/register/finish" if post => {
                let state = self.cookie_of(&req, REGISTER_COOKIE);
                let body = json_body(req).await?;
                return self.register_finish(state.as_deref(), &body, remote);
            }
            _ => {}
        }
        // Everything else is a session's.
        let session = match self.session(&req) {
            Some((name, sid, until)) if !self.signed_out(&sid).await => Some((name, sid, until)),
            _ => None,
        };
        let Some((name, sid, until)) = session else {
            if get {
                let next = path
                    .strip_prefix("/approvals/")
                    .filter(|id| valid_id(id))
                    .map(|id| format!("?next={id}"))
                    .unwrap_or_default();
                return Ok(redirect(&format!("/approvals/login{next}")));
            }
            return Err((
                StatusCode::UNAUTHORIZED,
                "sign in with your passkey first (the session is missing or expired)".into(),
            ));
        };
        let asker = Asker::Passkey(name.clone());
        if post {
            let body = json_body(req).await?;
            if body["csrf"].as_str() != Some(self.csrf(&sid).as_str()) {
                return Err((
                    StatusCode::FORBIDDEN,
                    "the request does not carry this session's CSRF token".into(),
                ));
            }
            if path == "/approvals/logout" {
                // Ended on the server: the cookie, replayed, opens nothing.
                self.once(format!("page-session:{sid}"), until).await?;
                let mut r = json_response(StatusCode::OK, &json!({"ok": true}));
                set_cookie(&mut r, &self.cookie(SESSION_COOKIE, "", Duration::ZERO));
                return Ok(r);
            }
            let rest = path.strip_prefix("/approvals/").unwrap_or_default();
            return match rest.split_once('/') {
                Some((id, "statement")) if valid_id(id) => self.statement(&asker, id, &body).await,
                Some((id, "verdict")) if valid_id(id) => self.verdict(&asker, id, &body).await,
                _ => Err((StatusCode::NOT_FOUND, "no such action".into())),
            };
        }
        if !get {
            return Err((StatusCode::METHOD_NOT_ALLOWED, "GET or POST only".into()));
        }
        if path == "/approvals" || path == "/approvals/" {
            let list = self.ask(&asker, &["approvals", "--json"]).await?;
            return Ok(page_response(
                StatusCode::OK,
                self.list_page(
                    &name,
                    &sid,
                    list.as_array().map(Vec::as_slice).unwrap_or_default(),
                ),
            ));
        }
        let id = path.strip_prefix("/approvals/").unwrap_or_default();
        if !valid_id(id) {
            return Err((StatusCode::NOT_FOUND, "no such page".into()));
        }
        let approval = match self.ask(&asker, &["approvals", "show", id, "--json"]).await {
            Ok(a) => a,
            Err((_, why)) => {
                return Ok(page_response(
                    StatusCode::NOT_FOUND,
                    self.shell(
                        &name,
                        &sid,
                        "not found",
                        html! { p class="refused" { (shown(&why)) } },
                    ),
                ));
            }
        };
        let may = self.may_grant(&name, &approval);
        Ok(page_response(
            StatusCode::OK,
            self.approval_page(&name, &sid, &approval, &may),
        ))
    }

    /// A state change must come from this page: the browser says its
    /// origin (and, when it says, that the request is same-origin) and it
    /// is JSON (which no cross-site form can send without a preflight).
    fn same_origin(&self, req: &Request<PageBody>) -> Result<(), Refused> {
        let hv = |n: &str| {
            req.headers()
                .get(n)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
        };
        if hv("origin") != self.origin() {
            return Err((
                StatusCode::FORBIDDEN,
                format!(
                    "a state change must come from the approval page ({}), not Origin {:?}",
                    self.origin(),
                    super::clip(hv("origin"), 100)
                ),
            ));
        }
        let site = hv("sec-fetch-site");
        if !site.is_empty() && site != "same-origin" {
            return Err((StatusCode::FORBIDDEN, format!("Sec-Fetch-Site is {site:?}")));
        }
        if !hv("content-type").starts_with("application/json") {
            return Err((
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "a state change is JSON (Content-Type: application/json)".into(),
            ));
        }
        Ok(())
    }

    /// Run an operator command as the session's approver; its JSON output.
    async fn ask(&self, asker: &Asker, argv: &[&str]) -> Result<Value, Refused> {
        let reply = self
            .run(asker, argv.iter().map(|s| s.to_string()).collect())
            .await;
        if reply.code != 0 {
            return Err((StatusCode::FORBIDDEN, reply.stderr.trim().to_string()));
        }
        serde_json::from_str(&reply.stdout).map_err(|e| {
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the answer is not JSON: {e}"),
            )
        })
    }

    async fn run(&self, asker: &Asker, argv: Vec<String>) -> crate::daemon::wire::Reply {
        let control = Arc::clone(&self.control);
        let asker = asker.clone();
        tokio::task::spawn_blocking(move || control(&asker, argv))
            .await
            .unwrap_or_else(|e| {
                crate::daemon::wire::Reply::refused(format!("the command failed: {e}"))
            })
    }

    /// The policy's verdict on a grant by this passkey's approver, to show
    /// or hide the grant button (the verdict path asks it again).
    fn may_grant(&self, name: &str, a: &Value) -> Result<(), String> {
        let set = self.policy.current().map_err(|e| e.to_string())?;
        let verdicts: Vec<Value> = a["verdicts"]
            .as_array()
            .map(|v| {
                v.iter()
                    .map(|v| json!({"approver": v["approver"], "verdict": v["verdict"], "kind": v["kind"], "os_user": v["os_user"]}))
                    .collect()
            })
            .unwrap_or_default();
        let input = json!({
            "verdict": "grant", "channel": "web",
            "approver": {"name": name, "kind": "passkey", "os_user": "",
                         "key": {"type": "webauthn", "principals": [name], "user_presence": true}},
            "approval": {"id": a["id"], "tool": a["tool"], "params": a["params"],
                         "requested_by": a["requested_by"], "requester": a["requester"],
                         "signals": a["signals"], "state": a["state"], "verdicts": verdicts},
        });
        match set.eval_rule(
            "data.gateway.approvals.verdict",
            regorus::Value::from(input),
        ) {
            Ok(v) if v["allow"] == Value::Bool(true) => Ok(()),
            Ok(v) => Err(v["reasons"]
                .as_array()
                .map(|r| {
                    r.iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join("; ")
                })
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "the policy does not allow it".into())),
            Err(e) => Err(e.to_string()),
        }
    }

    fn login_options(&self, body: &Value) -> Result<Response<Body>, Refused> {
        let name = body["name"].as_str().unwrap_or_default().trim().to_string();
        let creds: Vec<Listed> = self
            .passkeys()
            .into_iter()
            .filter(|l| l.name == name)
            .collect();
        if creds.is_empty() {
            return Err((
                StatusCode::FORBIDDEN,
                "no passkey is listed for that name (data.config.approvers.passkeys)".into(),
            ));
        }
        let mut challenge = [0u8; 32];
        getrandom::fill(&mut challenge)
            .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let options = self
            .rp
            .request_options(&creds, &challenge)
            .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let sealed = self.seal(
            "login",
            &json!({"n": name, "c": b64(&challenge), "e": now_ms() + CEREMONY.as_millis() as i64}),
        );
        let mut r = json_response(StatusCode::OK, &options);
        set_cookie(&mut r, &self.cookie(LOGIN_COOKIE, &sealed, CEREMONY));
        Ok(r)
    }

    async fn login_finish(
        &self,
        login: Option<&str>,
        body: &Value,
        remote: std::net::SocketAddr,
    ) -> Result<Response<Body>, Refused> {
        let v = login.and_then(|l| self.open("login", l)).ok_or((
            StatusCode::FORBIDDEN,
            "the sign-in expired or did not start here; start again".to_string(),
        ))?;
        let name = v["n"].as_str().unwrap_or_default();
        let challenge = v["c"].as_str().and_then(unb64).unwrap_or_default();
        let creds: Vec<Listed> = self
            .passkeys()
            .into_iter()
            .filter(|l| l.name == name)
            .collect();
        let proven = self
            .rp
            .verify(&creds, &challenge, &body["assertion"])
            .map_err(|e| (StatusCode::FORBIDDEN, e.to_string()))?;
        // One session per sign-in: its challenge is spent here, for every
        // replica, until the ceremony would have expired anyway.
        let until = v["e"].as_i64().unwrap_or_else(now_ms);
        if !self
            .once(format!("page-login:{}", b64(&challenge)), until)
            .await?
        {
            return Err((
                StatusCode::FORBIDDEN,
                "this sign-in was already used; start again".into(),
            ));
        }
        let mut sid = [0u8; 16];
        getrandom::fill(&mut sid)
            .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let session = self.seal(
            "session",
            &json!({"n": proven.name, "k": proven.credential_id, "s": b64(&sid),
                    "e": now_ms() + SESSION.as_millis() as i64}),
        );
        let _ = self.audit.record(
            "",
            Event::ApprovalPageSignedIn {
                approver: proven.name.clone(),
                credential_id: format!("webauthn:{}", proven.credential_id),
                remote: remote.to_string(),
            },
        );
        let mut r = json_response(StatusCode::OK, &json!({"ok": true}));
        set_cookie(&mut r, &self.cookie(SESSION_COOKIE, &session, SESSION));
        set_cookie(&mut r, &self.cookie(LOGIN_COOKIE, "", Duration::ZERO));
        Ok(r)
    }

    fn register_options(
        &self,
        body: &Value,
        remote: std::net::SocketAddr,
    ) -> Result<Response<Body>, Refused> {
        let name = body["name"].as_str().unwrap_or_default().trim().to_string();
        if !plain_name(&name) {
            return Err((
                StatusCode::BAD_REQUEST,
                "the name must be 1 to 100 of A-Z a-z 0-9 . _ @ - (no look-alike letters)".into(),
            ));
        }
        self.admit_registration(remote)?;
        let (options, state) = self
            .rp
            .register_options(&name)
            .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let sealed = self.seal(
            "register",
            &json!({"n": name, "st": state, "e": now_ms() + CEREMONY.as_millis() as i64}),
        );
        let mut r = json_response(StatusCode::OK, &options);
        set_cookie(&mut r, &self.cookie(REGISTER_COOKIE, &sealed, CEREMONY));
        Ok(r)
    }

    /// Registration steps (options and finish, each counted) one address
    /// (an IPv6 /64) may take each minute.
    fn admit_registration(&self, remote: std::net::SocketAddr) -> Result<(), Refused> {
        let key = match remote.ip() {
            std::net::IpAddr::V6(v6) => {
                let mut o = v6.octets();
                o[8..].fill(0);
                std::net::IpAddr::V6(std::net::Ipv6Addr::from(o))
            }
            v4 => v4,
        };
        let mut seen = self.registrations.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() > 10_000 {
            seen.retain(|_, (at, _)| at.elapsed() < Duration::from_secs(60));
        }
        let e = seen.entry(key).or_insert((std::time::Instant::now(), 0));
        if e.0.elapsed() >= Duration::from_secs(60) {
            *e = (std::time::Instant::now(), 0);
        }
        if e.1 >= REGISTRATIONS_PER_MINUTE {
            return Err((
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "at most {REGISTRATIONS_PER_MINUTE} registration steps a minute from one address"
                ),
            ));
        }
        e.1 += 1;
        Ok(())
    }

    fn register_finish(
        &self,
        state: Option<&str>,
        body: &Value,
        remote: std::net::SocketAddr,
    ) -> Result<Response<Body>, Refused> {
        self.admit_registration(remote)?;
        let v = state.and_then(|s| self.open("register", s)).ok_or((
            StatusCode::FORBIDDEN,
            "the registration expired or did not start here; start again".to_string(),
        ))?;
        let name = v["n"].as_str().unwrap_or_default().to_string();
        let credential = self
            .rp
            .register_finish(v["st"].as_str().unwrap_or_default(), &body["response"])
            .map_err(|e| (StatusCode::FORBIDDEN, e.to_string()))?;
        let entry = json!({"name": name, "credential": credential});
        let id = passkey::listed(&json!([entry]))
            .ok()
            .and_then(|l| l.first().map(|l| l.id.clone()))
            .unwrap_or_default();
        let _ = self.audit.record(
            "",
            Event::ApprovalPagePasskeyRegistered {
                name: name.clone(),
                credential_id: format!("webauthn:{id}"),
                remote: remote.to_string(),
            },
        );
        let mut r = json_response(
            StatusCode::OK,
            &json!({"entry": format!("  - {entry}"), "name": name}),
        );
        set_cookie(&mut r, &self.cookie(REGISTER_COOKIE, "", Duration::ZERO));
        Ok(r)
    }

    /// The statement to sign for a verdict, and the passkey request whose
    /// challenge is its SHA-256.
    async fn statement(
        &self,
        asker: &Asker,
        id: &str,
        body: &Value,
    ) -> Result<Response<Body>, Refused> {
        let verdict = match body["verdict"].as_str() {
            Some(v @ ("grant" | "deny")) => v,
            _ => return Err((StatusCode::BAD_REQUEST, "verdict is grant or deny".into())),
        };
        let reason = body["reason"].as_str().unwrap_or_default();
        let argv = crate::daemon::wire::statement_argv(id, verdict, reason, STATEMENT_VALID_FOR);
        let reply = self.run(asker, argv).await;
        if reply.code != 0 {
            return Err((StatusCode::CONFLICT, reply.stderr.trim().to_string()));
        }
        let statement = reply.stdout;
        let creds: Vec<Listed> = self
            .passkeys()
            .into_iter()
            .filter(|l| l.name == asker.name())
            .collect();
        let options = self
            .rp
            .request_options(&creds, &passkey::statement_challenge(statement.as_bytes()))
            .map_err(|e| (StatusCode::FORBIDDEN, e.to_string()))?;
        Ok(json_response(
            StatusCode::OK,
            &json!({"statement": statement,
                    "statement_sha256": hex::encode(passkey::statement_challenge(statement.as_bytes())),
                    "options": options}),
        ))
    }

    async fn verdict(
        &self,
        asker: &Asker,
        id: &str,
        body: &Value,
    ) -> Result<Response<Body>, Refused> {
        let grant = match body["verdict"].as_str() {
            Some("grant") => true,
            Some("deny") => false,
            _ => return Err((StatusCode::BAD_REQUEST, "verdict is grant or deny".into())),
        };
        let statement = body["statement"].as_str().unwrap_or_default();
        let assertion = body["assertion"].to_string();
        // `--flag=value`: a value that starts with '-' is never read as a flag.
        let argv = vec![
            if grant { "approve" } else { "deny" }.to_string(),
            id.to_string(),
            format!("--signed-statement={statement}"),
            format!("--webauthn-assertion={assertion}"),
        ];
        let reply = self.run(asker, argv).await;
        let status = if reply.code == 0 {
            StatusCode::OK
        } else {
            StatusCode::FORBIDDEN
        };
        Ok(json_response(
            status,
            &json!({"ok": reply.code == 0, "message": format!("{}{}", reply.stdout, reply.stderr).trim()}),
        ))
    }

    fn shell(&self, name: &str, sid: &str, title: &str, main: Markup) -> Markup {
        document(title, Some((name, &self.csrf(sid))), main)
    }

    fn login_page(&self) -> Markup {
        document(
            "sign in",
            None,
            html! {
                h1 { "Sign in with your passkey" }
                form id="login" {
                    label { "Approver name " input name="name" autocomplete="username" required; }
                    button type="submit" { "Sign in with passkey" }
                }
                p id="status" role="status" {}
                p class="note" {
                    "Your passkey must be listed in the gateway's policy. "
                    a href="/approvals/passkeys/register" { "Register a passkey" } "."
                }
            },
        )
    }

    fn register_page(&self) -> Markup {
        document(
            "register a passkey",
            None,
            html! {
                h1 { "Register a passkey" }
                p {
                    "Creates a passkey for this gateway on your security key, phone or laptop \
                     (with a PIN or biometric) and prints the entry for the policy. \
                     It approves nothing until a policy author adds the entry to "
                    code { "config/approvers/data.yaml" } " under " code { "passkeys:" } "."
                }
                form id="register" {
                    label { "Approver name " input name="name" autocomplete="username" required; }
                    button type="submit" { "Create passkey" }
                }
                p id="status" role="status" {}
                pre id="entry" {}
            },
        )
    }

    fn list_page(&self, name: &str, sid: &str, list: &[Value]) -> Markup {
        let rows: Vec<&Value> = list
            .iter()
            .filter(|a| valid_id(a["id"].as_str().unwrap_or_default()))
            .collect();
        let field = |a: &Value, k: &str| shown(a[k].as_str().unwrap_or("?"));
        let main = html! {
            h1 { "Approvals" }
            @if rows.is_empty() {
                p { "No pending approvals." }
            } @else {
                table {
                    thead { tr {
                        th { "id" } th { "state" } th { "tool" } th { "requested by" }
                        th { "signals" } th { "expires" }
                    } }
                    tbody {
                        @for a in &rows {
                            @let id = a["id"].as_str().unwrap_or_default();
                            tr {
                                td { a href={ "/approvals/" (id) } { (id) } }
                                td { (field(a, "state")) }
                                td { (field(a, "tool")) }
                                td { (field(a, "requested_by")) }
                                td { (a["signals"].as_array().map(Vec::len).unwrap_or(0)) }
                                td { (field(a, "expires_at")) }
                            }
                        }
                    }
                }
            }
        };
        self.shell(name, sid, "approvals", main)
    }

    fn approval_page(&self, name: &str, sid: &str, a: &Value, may: &Result<(), String>) -> Markup {
        approval_html(name, &self.csrf(sid), a, may)
    }
}

/// Text from a plan, the agent, a cluster or a person as the page shows
/// it: secrets scrubbed, and every control or format character (bidi,
/// zero-width) and every word mixing look-alike scripts shown as
/// `\u{..}` ([`gateway_base::text::visible`]). The template escapes the
/// result for HTML; nothing here writes markup.
pub fn shown(s: &str) -> String {
    gateway_base::text::visible(&gateway_audit::audit::scrub::scrub_str(s))
}

/// A page: the head (the page's own script and style, no inline ones),
/// the header (who is signed in and the sign-out button, when someone is,
/// with the session's CSRF token for the script), `main`.
fn document(title: &str, signed_in: Option<(&str, &str)>, main: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width,initial-scale=1";
                title { (shown(title)) " · gateway" }
                link rel="stylesheet" href="/approvals/static/page.css";
                script src="/approvals/static/page.js" defer {}
            }
            body data-csrf=[signed_in.map(|(_, csrf)| csrf)] {
                header {
                    @if let Some((name, _)) = signed_in {
                        a href="/approvals/" { "gateway approvals" }
                        span {
                            "signed in as " b { (shown(name)) } " "
                            button id="logout" type="button" { "sign out" }
                        }
                    } @else {
                        span { "gateway approvals" }
                    }
                }
                main { (main) }
            }
        }
    }
}

/// Why Terraform replaces or deletes a change, and the attribute paths
/// that force it: the sentence, the code, the paths.
fn why(reason: Option<&str>, paths: Option<&Vec<Value>>) -> Markup {
    let paths = paths.filter(|p| !p.is_empty());
    html! {
        @if let Some(r) = reason {
            " " span class="why" { (shown(&reason_sentence(r, paths))) " " small { "(" (shown(r)) ")" } }
        }
        @if let Some(p) = paths {
            " " span class="why" { "forced by: " code { (shown(&Value::Array(p.clone()).to_string())) } }
        }
    }
}

/// The approval page of `a` (`approvals show --json`) for `name`, with the
/// policy's answer to whether `name` may grant it (`may`).
pub fn approval_html(name: &str, csrf: &str, a: &Value, may: &Result<(), String>) -> Markup {
    let s = |v: &Value| shown(v.as_str().unwrap_or(""));
    let id = a["id"].as_str().unwrap_or_default();
    let state = a["state"].as_str().unwrap_or("?");
    let signals = a["signals"].as_array().cloned().unwrap_or_default();
    let verdicts = a["verdicts"].as_array().cloned().unwrap_or_default();
    let grants = verdicts.iter().filter(|v| v["verdict"] == "grant").count();
    let reason_required = a["reason_required"] == true;
    let groups = gateway_audit::approvals::review::grouped(&a["plan_summary"]);
    let total: usize = groups.iter().map(|g| g.2.len()).sum();
    let main = html! {
        h1 {
            "Approval " code { (shown(id)) } " "
            span class={ "state state-" (shown(state)) } { (shown(state)) }
        }
        // 1. The destructive signals, each with its reason.
        @if signals.is_empty() {
            section class="signals none" { h2 { "No destructive signals" } }
        } @else {
            section class="signals" {
                h2 { "⚠ Destructive signals (" (signals.len()) ")" }
                ul {
                    @for sig in &signals {
                        li {
                            b class="kind" { (s(&sig["kind"])) } " "
                            code { (s(&sig["address"])) } ": " (s(&sig["message"]))
                            (why(sig["reason"].as_str(), sig["paths"].as_array()))
                        }
                    }
                }
            }
        }
        // 2. The call and its people.
        section class="facts" {
            h2 { "The call" }
            dl {
                dt { "tool" } dd { (s(&a["tool"])) }
                dt { "module" } dd { (shown(a["params"]["working_dir"].as_str().unwrap_or("-"))) }
                dt { "params" } dd { code { (shown(&a["params"].to_string())) } }
                dt { "requested by" } dd { (s(&a["requested_by"])) }
                dt { "client" } dd {
                    (s(&a["requested_client"])) " "
                    span class="note" { "(what the client calls itself)" }
                }
                dt { "requested at" } dd { (s(&a["created_at"])) }
                dt { "expires at" } dd { (s(&a["expires_at"])) }
                dt { "approvals" } dd {
                    (grants) " of " (a["approvers_required"].as_u64().unwrap_or(0)) " given"
                }
                dt { "verdicts" } dd {
                    @if verdicts.is_empty() {
                        "none yet"
                    }
                    @for (i, v) in verdicts.iter().enumerate() {
                        @if i > 0 { br; }
                        (s(&v["verdict"])) " by " (s(&v["approver"])) " (" (s(&v["kind"]))
                        ") at " (s(&v["at"])) ": " (s(&v["reason"]))
                    }
                }
                dt { "plan digest" } dd { code { (s(&a["plan_sha256"])) } }
                dt { "params digest" } dd { code { (s(&a["params_sha256"])) } }
            }
        }
        // 3. The decision (before the long list, after what it is about).
        section class="decide" {
            h2 { "Decide" }
            @if state != "pending" {
                p { "This approval is " (shown(state)) "; there is nothing to decide." }
            } @else {
                @match may {
                    Ok(()) => {
                        form id="verdict" data-id=(shown(id)) {
                            label {
                                "Reason" @if reason_required { " (required)" } " "
                                input name="reason" maxlength="4096" required[reason_required];
                            }
                            button type="submit" name="verdict" value="grant" class="grant" { "Approve with passkey" }
                            button type="submit" name="verdict" value="deny" class="deny" { "Deny with passkey" }
                        }
                        p id="status" role="status" {}
                        p class="note" {
                            "Your passkey signs the SHA-256 of this approval's statement: its id, \
                             tool, params and plan digests, your verdict and reason."
                        }
                        pre id="statement" {}
                    }
                    Err(why) => {
                        p class="refused" { "You cannot approve this call: " (shown(why)) }
                        form id="verdict" data-id=(shown(id)) {
                            input type="hidden" name="reason" value="";
                            button type="submit" name="verdict" value="deny" class="deny" { "Deny with passkey" }
                        }
                        p id="status" role="status" {}
                    }
                }
            }
        }
        // 4. The changes, grouped by action, with their attribute diffs.
        section class="changes" {
            h2 { "Planned changes (" (total) ")" }
            p {
                @for (i, (key, _, changes)) in groups.iter().enumerate() {
                    @if i > 0 { " " }
                    span class={ "count " (key) } { (changes.len()) " " (key) }
                }
            }
            @for (key, label, changes) in &groups {
                details class={ "group " (key) }
                    open[matches!(*key, "replace" | "delete" | "forget" | "other") || changes.len() <= 50] {
                    summary { (shown(label)) " (" (changes.len()) ")" }
                    @for c in changes {
                        div class="change" {
                            code class="addr" { (s(&c["address"])) }
                            (why(c["reason"].as_str(), c["paths"].as_array()))
                            @let diff = c["diff"].as_array().cloned().unwrap_or_default();
                            @if !diff.is_empty() {
                                table class="diff" { tbody {
                                    @for d in &diff {
                                        tr {
                                            th { (s(&d["path"])) }
                                            td class="before" { (side(&d["before"])) }
                                            td { "→" }
                                            td class="after" { (side(&d["after"])) }
                                        }
                                    }
                                } }
                            }
                        }
                    }
                }
            }
        }
    };
    document(&format!("approval {id}"), Some((name, csrf)), main)
}

/// One side of an attribute's diff: its value, or "(none)".
fn side(v: &Value) -> Markup {
    html! {
        @match v {
            Value::Null => i { "(none)" },
            v => (shown(v.as_str().unwrap_or("?"))),
        }
    }
}

/// An approval id as the store makes them (`ap-` and hex): nothing else is
/// put in a path, a link or a command line.
/// A Terraform plan's `action_reason` as a sentence for the approver
/// (Terraform's JSON output format documents each code); `paths` are the
/// plan's `replace_paths`, shown as attribute paths.
pub fn reason_sentence(code: &str, paths: Option<&Vec<Value>>) -> String {
    let what: Vec<String> = paths
        .map(|ps| {
            ps.iter()
                .filter_map(|p| p.as_array())
                .map(|steps| {
                    let mut out = String::new();
                    for step in steps {
                        match step {
                            Value::Number(n) => out.push_str(&format!("[{n}]")),
                            Value::String(k) if out.is_empty() => out.push_str(k),
                            Value::String(k) => out.push_str(&format!(".{k}")),
                            other => out.push_str(&format!("[{other}]")),
                        }
                    }
                    format!("`{out}`")
                })
                .collect()
        })
        .unwrap_or_default();
    let changed = if what.is_empty() {
        "an argument".to_string()
    } else {
        what.join(", ")
    };
    match code {
        "replace_because_tainted" => "Terraform must destroy and re-create it because it is tainted (an earlier apply failed part way, or someone tainted it)".into(),
        "replace_because_cannot_update" => format!(
            "Terraform must destroy and re-create it because {changed} changed and cannot be changed in place"
        ),
        "replace_by_request" => "Terraform will destroy and re-create it because the run asked for it (-replace)".into(),
        "replace_by_triggers" => "Terraform must destroy and re-create it because a resource named in its replace_triggered_by changed".into(),
        "delete_because_no_resource_config" => "Terraform will destroy it because its block is no longer in the configuration".into(),
        "delete_because_no_module" => "Terraform will destroy it because the module that held it is no longer in the configuration".into(),
        "delete_because_wrong_repetition" => "Terraform will destroy it because its block switched between count and for_each".into(),
        "delete_because_count_index" => "Terraform will destroy it because its count no longer reaches its index".into(),
        "delete_because_each_key" => "Terraform will destroy it because its key is no longer in its for_each".into(),
        "delete_because_no_move_target" => "Terraform will destroy it because a moved block sends it to an address that does not exist".into(),
        "read_because_config_unknown" => "Terraform will read it during the apply because its configuration depends on values known only then".into(),
        "read_because_dependency_pending" => "Terraform will read it during the apply because something it depends on has changes pending".into(),
        "read_because_check_nested" => "Terraform will read it during the apply because a check block reads it".into(),
        other => format!(
            "Terraform gave a reason this page does not know ({other}): read the plan before deciding"
        ),
    }
}

fn valid_id(id: &str) -> bool {
    id.len() <= 64
        && id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// The one cookie named `name`. Two of that name (one planted by another
/// page of the same site, beside the real one) count as none.
fn cookie(req: &Request<PageBody>, name: &str) -> Option<String> {
    let mut found = req
        .headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .filter(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string());
    let first = found.next()?;
    found.next().is_none().then_some(first)
}

async fn json_body(req: Request<PageBody>) -> Result<Value, Refused> {
    let bytes = http_body_util::Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|_| {
            (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("a request is at most {MAX_BODY} bytes"),
            )
        })?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| {
        (
            StatusCode::BAD_REQUEST,
            format!("the body is not JSON: {e}"),
        )
    })
}

/// The headers of every page answer.
pub fn secure_headers(r: &mut Response<Body>) {
    let hs = r.headers_mut();
    for (k, v) in [
        (
            "content-security-policy",
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
        ),
        ("x-frame-options", "DENY"),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        ("cache-control", "no-store"),
        ("cross-origin-opener-policy", "same-origin"),
        ("cross-origin-resource-policy", "same-origin"),
        (
            "permissions-policy",
            "publickey-credentials-get=(self), publickey-credentials-create=(self)",
        ),
    ] {
        hs.insert(k, HeaderValue::from_static(v));
    }
}

fn with_type(status: StatusCode, body: String, ty: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ty));
    secure_headers(&mut r);
    r
}

fn page_response(status: StatusCode, page: Markup) -> Response<Body> {
    with_type(status, page.into_string(), "text/html; charset=utf-8")
}

fn asset(body: &'static str, ty: &'static str) -> Response<Body> {
    with_type(StatusCode::OK, body.to_string(), ty)
}

fn json_response(status: StatusCode, v: &Value) -> Response<Body> {
    with_type(status, v.to_string(), "application/json")
}

/// A refusal as the page shows it: text, with the page's headers.
pub fn refused(status: StatusCode, why: &str) -> Response<Body> {
    let mut r = with_type(status, format!("{why}\n"), "text/plain; charset=utf-8");
    r.extensions_mut().insert(super::Answered);
    r
}

fn redirect(to: &str) -> Response<Body> {
    let mut r = with_type(
        StatusCode::SEE_OTHER,
        String::new(),
        "text/plain; charset=utf-8",
    );
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

fn set_cookie(r: &mut Response<Body>, c: &str) {
    if let Ok(v) = HeaderValue::from_str(c) {
        // (Several cookies: each its own header.)
        let _ = r.headers_mut().try_append(header::SET_COOKIE, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_text_is_escaped_for_html_with_bidi_and_zero_width_shown() {
        let hostile = "aws_s3_bucket.\u{202e}gol<script>alert(1)</script>\u{200b}\"x' onload=\"y";
        let page = approval_html(
            "bob<b>",
            "c\"srf",
            &json!({"id": "ap-1", "state": "pending", "tool": hostile, "signals": [
                {"kind": "delete", "address": hostile, "message": hostile}],
                "plan_summary": [{"address": hostile, "actions": ["delete"], "reason": null, "paths": [],
                                  "diff": [{"path": hostile, "before": hostile, "after": null}]}]}),
            &Err(hostile.to_string()),
        )
        .into_string();
        assert!(
            !page.contains("<script>") && !page.contains("bob<b>"),
            "{page}"
        );
        assert!(
            !page.contains("\" onload"),
            "an attribute is closed from outside: {page}"
        );
        assert!(page.contains("data-csrf=\"c&quot;srf\""), "{page}");
        assert!(
            !page.contains('\u{202e}') && !page.contains('\u{200b}'),
            "{page}"
        );
        // Each hostile string is shown, escaped, in each place it appears.
        let escaped = "aws_s3_bucket.\\u{202e}gol&lt;script&gt;alert(1)&lt;/script&gt;\\u{200b}&quot;x' onload=&quot;y";
        assert!(page.matches(escaped).count() >= 6, "{page}");
        // A literal `\u{202e}` typed by the agent is not mistaken for an
        // escaped character.
        assert_eq!(shown("a\\u{202e}b"), "a\\\\u{202e}b");
    }

    #[test]
    fn reason_codes_are_said_as_sentences_with_the_paths_that_force_them() {
        let paths = vec![
            json!(["triggers_replace"]),
            json!(["metadata", 0, "labels"]),
        ];
        let said = reason_sentence("replace_because_cannot_update", Some(&paths));
        assert_eq!(
            said,
            "Terraform must destroy and re-create it because `triggers_replace`, `metadata[0].labels` changed and cannot be changed in place"
        );
        assert!(
            reason_sentence("delete_because_no_resource_config", None)
                .contains("no longer in the configuration")
        );
        assert!(reason_sentence("made_up", None).contains("does not know (made_up)"));
        // Shown escaped: a hostile code stays text.
        let html = approval_html(
            "bob",
            "c",
            &json!({"id": "ap-1", "state": "pending", "signals": [
                {"kind": "replace", "address": "a.b", "message": "m",
                 "reason": "<script>x</script>", "paths": [["triggers_replace"]]}]}),
            &Ok(()),
        )
        .into_string();
        assert!(!html.contains("<script>x"), "{html}");
        assert!(html.contains("does not know (&lt;script&gt;"), "{html}");
    }

    #[test]
    fn only_store_shaped_ids_reach_a_path_or_a_command() {
        assert!(valid_id("ap-0123abcd"));
        assert!(!valid_id("../x"));
        assert!(!valid_id("a b"));
        assert!(!valid_id("--reason=x"));
        assert!(plain_name("bob.smith@corp-1"));
        assert!(!plain_name("b\u{043e}b"), "a Cyrillic o");
        assert!(!plain_name("bob\u{3164}"), "a Hangul filler");
        assert!(!plain_name(""));
        assert!(!valid_id("-x"));
        assert!(!valid_id(""));
    }
}
