//! The HTTP transport (`[http]`): remote MCP over HTTPS for a team's
//! agents, as the MCP specification 2026-07-28 describes it — streamable
//! HTTP (rmcp's server: stateless for 2026-07-28 clients, sessions for
//! older ones) behind an OAuth 2.1 resource server ([`auth`]).
//!
//! A request reaches the MCP server only after, in this order: its `Host`
//! is one this gateway is named by and its `Origin`, when it has one, is
//! allowed (DNS rebinding); it carries no token in its query string; its
//! bearer token verifies. Every refusal is an HTTP status with a reason
//! (and `WWW-Authenticate` for a 401) and an `http.refused` audit event;
//! nothing of the call has started. The principal the token proves goes
//! to the one pipeline as data for the policy; this transport decides
//! nothing else.
//!
//! Also served: the Protected Resource Metadata (RFC 9728) at
//! `/.well-known/oauth-protected-resource` (and the same with the
//! resource's path appended), `/healthz` (the process answers) and
//! `/readyz` (it can serve a call: its policy set loaded, and each
//! [`ReadyCheck`] the daemon gave — its database, its Vault token — passing).

pub mod auth;
pub mod limits;
pub mod metrics;
pub mod page;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::any;
use axum::{Extension, Router};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::http::{HeaderValue, Request, Response, StatusCode, header};
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::sensitive_headers::{
    SetSensitiveRequestHeadersLayer, SetSensitiveResponseHeadersLayer,
};
use tower_http::timeout::RequestBodyTimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::mcp::{GatewayServer, SsoPrincipal};
use gateway_audit::audit::{AuditLog, Event};
use gateway_core::pipeline::Pipeline;

pub use auth::{AuthError, Verifier};
pub use gateway_core::config::http::{
    AUDITED_REFUSALS_PER_MINUTE, DEFAULT_MAX_REQUEST_BYTES, HttpConfig, IssuerConfig,
};

/// A TLS handshake must end within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("[http] {0}")]
    Config(String),
    #[error("[http] listen {0}: {1}")]
    Bind(String, std::io::Error),
}

type Body = BoxBody<Bytes, Infallible>;

/// Where the Protected Resource Metadata is served (RFC 9728), also with
/// the resource's path appended.
const PRM_PATH: &str = "/.well-known/oauth-protected-resource";

/// The header a request's id travels in, both ways.
const REQUEST_ID: header::HeaderName = header::HeaderName::from_static("x-request-id");

/// The connection a request came on: its peer, and the identity it is
/// counted against once a request on it has authenticated.
#[derive(Clone)]
struct Conn {
    remote: SocketAddr,
    tag: Arc<limits::ConnTag>,
}

/// Marks a response this transport made and audited itself, so that the
/// refusal layer does not audit it again.
#[derive(Clone, Copy)]
pub(crate) struct Answered;

/// A client's `x-request-id` is kept when it is one plain token (at most
/// 64 letters, digits, `-`, `_`, `.`), so that it can be followed across
/// systems; anything else is dropped and a new id made, so that no client
/// writes what it likes into the logs.
async fn plain_request_id(mut req: Request<axum::body::Body>) -> Request<axum::body::Body> {
    let values = req.headers().get_all(&REQUEST_ID);
    let mut it = values.iter();
    let plain = match (it.next(), it.next()) {
        (Some(v), None) => v.to_str().is_ok_and(|v| {
            !v.is_empty()
                && v.len() <= 64
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }),
        _ => false,
    };
    if !plain {
        req.headers_mut().remove(&REQUEST_ID);
    }
    req
}

/// The listener's state: checks, then rmcp's service.
pub struct HttpServer {
    resource: String,
    resource_path: String,
    metadata_url: String,
    metadata: Bytes,
    allowed_hosts: Vec<String>,
    allowed_origins: Vec<String>,
    verifier: Verifier,
    audit: Arc<AuditLog>,
    mcp: StreamableHttpService<GatewayServer, LocalSessionManager>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    listen: SocketAddr,
    /// Refusals audited per peer address in the current minute.
    refusals: std::sync::Mutex<RefusalCounts>,
    /// Connections open, in all and per peer address.
    conns: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
    max_connections: usize,
    max_connections_per_address: usize,
    audited_refusals_per_minute: u32,
    /// What each identity holds (connections, requests, sessions) and the
    /// legacy sessions' owners ([`limits`]): every request naming a
    /// session must be its owner's, whatever its method.
    limits: Arc<limits::Limits>,
    /// rmcp's sessions, closed here when [`limits`] finds them idle.
    session_manager: Arc<LocalSessionManager>,
    max_request_bytes: usize,
    /// Operator commands (approvals, approve, deny) for SSO identities, at
    /// `<resource path>/control`.
    control: crate::daemon::ControlHandler,
    control_path: String,
    /// What `/readyz` checks besides the policy set.
    ready: Vec<ReadyCheck>,
    policy: Arc<gateway_policy::PolicyStore>,
    /// The approval page (`/approvals/…`), or why there is none.
    pages: Result<page::Pages, String>,
    /// The failing checks at the last `/readyz`, so that a change is
    /// logged once rather than at every probe.
    not_ready: Arc<std::sync::Mutex<Vec<&'static str>>>,
    /// The last `/readyz` answer and when it was made: answers within
    /// [`READY_CACHE`] of it are the same, and one check runs at a time,
    /// so that a flood of probes costs the database and Vault nothing more.
    ready_cache: Arc<tokio::sync::Mutex<Option<(std::time::Instant, StatusCode, String)>>>,
    /// Whose metrics `/metrics` shows, when this listener serves them.
    metrics: Option<Arc<Pipeline>>,
}

/// How long a `/readyz` answer is reused.
pub const READY_CACHE: Duration = Duration::from_secs(2);

/// One thing `/readyz` checks: a name a probe's answer shows, and the
/// check (its error goes to the daemon's log, never to the answer: it may
/// name a host).
#[derive(Clone)]
pub struct ReadyCheck {
    pub name: &'static str,
    pub check:
        Arc<dyn Fn() -> gateway_broker::BoxFuture<'static, Result<(), String>> + Send + Sync>,
}

/// How long one readiness check may take before it counts as failed (the
/// kubelet's probe gives up after its own `timeoutSeconds`).
pub const READY_CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// The largest operator command accepted (its JSON).
const MAX_CONTROL_BYTES: usize = 64 * 1024;

/// How long a refusal over one of an identity's limits is held before it
/// is answered (see [`HttpServer::limited`]): a client looping on its
/// refusals gets at most one a second for each connection it holds.
const REFUSAL_HOLD: Duration = Duration::from_secs(1);

/// How often idle sessions are looked for.
const SESSION_SWEEP: Duration = Duration::from_secs(2);

#[derive(Default)]
struct RefusalCounts {
    /// Per address: the minute's start, refusals audited in it, refusals
    /// not audited since the last one that was.
    by_address: std::collections::HashMap<std::net::IpAddr, (std::time::Instant, u32, u64)>,
}

impl HttpServer {
    /// Check `config` and build the server (nothing is bound yet).
    pub fn new(
        config: &HttpConfig,
        pipeline: Arc<Pipeline>,
        workspace: PathBuf,
        heartbeat: Duration,
        control: crate::daemon::ControlHandler,
        session_key: Option<[u8; 32]>,
        stop: CancellationToken,
    ) -> Result<HttpServer, HttpError> {
        let bad = |m: String| HttpError::Config(m);
        let listen: SocketAddr = config
            .listen
            .parse()
            .map_err(|e| bad(format!("listen {:?}: {e} (ADDRESS:PORT)", config.listen)))?;
        let url = reqwest::Url::parse(&config.resource)
            .map_err(|e| bad(format!("resource {:?}: {e}", config.resource)))?;
        if url.query().is_some() || url.fragment().is_some() {
            return Err(bad(format!(
                "resource {:?} must have no query or fragment (RFC 8707)",
                config.resource
            )));
        }
        let tls = match (&config.tls_cert, &config.tls_key, config.plain_http) {
            (Some(cert), Some(key), false) => Some(tls_acceptor(cert, key)?),
            (None, None, true) => {
                if !listen.ip().is_loopback() {
                    return Err(bad(format!(
                        "plain_http is only allowed on a loopback address, not {listen}: bearer tokens would cross the network in clear (name tls_cert and tls_key)"
                    )));
                }
                None
            }
            (_, _, true) => {
                return Err(bad(
                    "plain_http and tls_cert/tls_key both given: choose one".into(),
                ));
            }
            _ => {
                return Err(bad(
                    "tls_cert and tls_key are both needed (or plain_http = true on a loopback address)".into(),
                ));
            }
        };
        if url.scheme() != "https" && !(url.scheme() == "http" && tls.is_none()) {
            return Err(bad(format!(
                "resource {:?} must be an https:// URL",
                config.resource
            )));
        }
        if config.issuers.is_empty() {
            return Err(bad(
                "no [[http.issuers]]: name the OpenID provider whose tokens are accepted".into(),
            ));
        }
        let verifier =
            Verifier::new(&config.issuers, &config.resource).map_err(|e| bad(e.to_string()))?;
        let authority = match (url.host_str(), url.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_string(),
            _ => return Err(bad(format!("resource {:?} has no host", config.resource))),
        };
        let allowed_hosts = if config.allowed_hosts.is_empty() {
            vec![authority.clone()]
        } else {
            config.allowed_hosts.clone()
        };
        let resource_path = match url.path() {
            "" => "/".to_string(),
            p => p.to_string(),
        };
        if let Some(why) = unroutable(&resource_path) {
            return Err(bad(format!("resource {:?}: {why}", config.resource)));
        }
        let resource_path_for_control = resource_path.trim_end_matches('/').to_string();
        let origin = url.origin().ascii_serialization();
        let metadata_url = if resource_path == "/" {
            format!("{origin}/.well-known/oauth-protected-resource")
        } else {
            format!("{origin}/.well-known/oauth-protected-resource{resource_path}")
        };
        let mut meta = json!({
            "resource": config.resource,
            "authorization_servers": verifier.issuer_ids(),
            "bearer_methods_supported": ["header"],
        });
        if let Some(n) = &config.resource_name {
            meta["resource_name"] = json!(n);
        }
        let scopes: Vec<String> = config
            .issuers
            .iter()
            .flat_map(|i| i.required_scopes.clone())
            .collect();
        if !scopes.is_empty() {
            meta["scopes_supported"] = json!(scopes);
        }
        let quotas = limits::Quotas {
            request_timeout: Duration::from_secs(config.request_timeout_seconds),
            connections_per_identity: config.max_connections_per_identity,
            requests_per_identity: config.max_requests_per_identity,
            sessions_per_identity: config.max_sessions_per_identity,
            sessions: config.max_sessions,
            session_idle: Duration::from_secs(config.session_idle_seconds),
            session_unused: Duration::from_secs(config.session_unused_seconds),
        };
        for (key, v) in [
            (
                "request_timeout_seconds",
                config.request_timeout_seconds as usize,
            ),
            (
                "max_connections_per_identity",
                config.max_connections_per_identity,
            ),
            (
                "max_requests_per_identity",
                config.max_requests_per_identity,
            ),
            (
                "max_sessions_per_identity",
                config.max_sessions_per_identity,
            ),
            ("max_sessions", config.max_sessions),
            ("session_idle_seconds", config.session_idle_seconds as usize),
            (
                "session_unused_seconds",
                config.session_unused_seconds as usize,
            ),
        ] {
            if v == 0 {
                return Err(bad(format!("{key} is 0: it must be at least 1")));
            }
        }
        if config.request_timeout_seconds > 3600 {
            return Err(bad(format!(
                "request_timeout_seconds is {}: at most 3600 (a request's body that takes longer holds a connection for nothing)",
                config.request_timeout_seconds
            )));
        }
        if config.session_unused_seconds > config.session_idle_seconds {
            return Err(bad(format!(
                "session_unused_seconds ({}) is longer than session_idle_seconds ({}): a session never used past its handshake closes sooner, not later",
                config.session_unused_seconds, config.session_idle_seconds
            )));
        }
        // rmcp's own idle limit is only a net under this transport's (which
        // closes idle sessions itself, see `limits`).
        let mut session_manager = LocalSessionManager::default();
        session_manager.session_config.keep_alive =
            Some(quotas.session_idle + Duration::from_secs(60));
        let session_manager = Arc::new(session_manager);
        let mcp_config = StreamableHttpServerConfig::default()
            .with_legacy_session_mode(config.legacy_sessions)
            .with_allowed_hosts(allowed_hosts.clone())
            .with_allowed_origins(config.allowed_origins.clone())
            .enforce_origin_validation()
            .with_max_request_body_bytes(config.max_request_bytes)
            .with_cancellation_token(stop);
        let audit = Arc::clone(&pipeline.audit);
        let policy = Arc::clone(&pipeline.policy);
        // No page for a gateway named by an IP address (browsers refuse
        // passkeys there); said once here, and at every page request.
        let pages = page::Pages::new(
            &config.resource,
            session_key,
            Arc::clone(&policy),
            Arc::clone(&control),
            Arc::clone(&audit),
            Arc::clone(&pipeline),
        )
        .map_err(|e| {
            tracing::warn!("no approval page: {e}");
            e
        });
        let mcp = StreamableHttpService::new(
            move || {
                Ok(
                    GatewayServer::for_http(Arc::clone(&pipeline), workspace.clone())
                        .with_heartbeat(heartbeat),
                )
            },
            Arc::clone(&session_manager),
            mcp_config,
        );
        Ok(HttpServer {
            resource: config.resource.clone(),
            resource_path,
            metadata_url,
            metadata: Bytes::from(meta.to_string()),
            allowed_hosts,
            allowed_origins: config.allowed_origins.clone(),
            verifier,
            audit,
            mcp,
            tls,
            listen,
            refusals: Default::default(),
            conns: Default::default(),
            max_connections: config.max_connections,
            max_connections_per_address: config.max_connections_per_address,
            audited_refusals_per_minute: config.audited_refusals_per_minute,
            limits: Arc::new(limits::Limits::new(quotas)),
            session_manager,
            max_request_bytes: config.max_request_bytes,
            control,
            control_path: format!("{}/control", resource_path_for_control),
            ready: Vec::new(),
            policy,
            pages,
            not_ready: Default::default(),
            ready_cache: Default::default(),
            metrics: None,
        })
    }

    /// Add checks to `/readyz`.
    pub fn with_ready_checks(mut self, checks: Vec<ReadyCheck>) -> HttpServer {
        self.ready.extend(checks);
        self
    }

    /// Serve `/metrics` on this listener too ([`metrics::scrape`]).
    pub fn with_metrics(mut self, pipeline: Arc<Pipeline>) -> HttpServer {
        self.metrics = Some(pipeline);
        self
    }

    /// `/readyz`: 200 when the policy set is loaded and every check passes
    /// (each within [`READY_CHECK_TIMEOUT`], all at once), else 503. The
    /// answer names each check and `ok` or `failed`, nothing more.
    async fn readiness(&self) -> Response<Body> {
        let mut cache = Arc::clone(&self.ready_cache).lock_owned().await;
        if let Some((at, status, body)) = cache.as_ref()
            && at.elapsed() < READY_CACHE
        {
            return plain(*status, body);
        }
        // In a task of its own, which holds the lock and fills the cache:
        // a client that hangs up mid-check cancels nothing, and the next
        // probe gets this answer rather than starting another check.
        let (policy, ready, not_ready) = (
            Arc::clone(&self.policy),
            self.ready.clone(),
            Arc::clone(&self.not_ready),
        );
        let task = tokio::spawn(async move {
            let started = std::time::Instant::now();
            let (status, body) = check_readiness(&policy, &ready, &not_ready).await;
            *cache = Some((started, status, body.clone()));
            (status, body)
        });
        match task.await {
            Ok((status, body)) => plain(status, &body),
            Err(_) => plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "readiness: the check failed\n",
            ),
        }
    }
}

/// Run every readiness check at once (each within
/// [`READY_CHECK_TIMEOUT`]); the answer's status and body. A change in
/// what fails is logged, with the reasons, once.
async fn check_readiness(
    policy: &gateway_policy::PolicyStore,
    ready: &[ReadyCheck],
    not_ready: &std::sync::Mutex<Vec<&'static str>>,
) -> (StatusCode, String) {
    let mut lines = vec![(
        "policy",
        policy
            .current()
            .map(|_| ())
            .map_err(|_| "no policy set is loaded".to_string()),
    )];
    let runs = ready.iter().map(|c| {
        let f = (c.check)();
        async move {
            let r = match tokio::time::timeout(READY_CHECK_TIMEOUT, f).await {
                Ok(r) => r,
                Err(_) => Err(format!("no answer within {READY_CHECK_TIMEOUT:?}")),
            };
            (c.name, r)
        }
    });
    lines.extend(futures::future::join_all(runs).await);
    let failing: Vec<&'static str> = lines
        .iter()
        .filter(|(_, r)| r.is_err())
        .map(|(n, _)| *n)
        .collect();
    if let Ok(mut was) = not_ready.lock()
        && *was != failing
    {
        for (name, r) in &lines {
            if let Err(e) = r {
                tracing::warn!(check = name, "not ready: {e}");
            }
        }
        if failing.is_empty() {
            tracing::info!("ready: every readiness check passes");
        }
        *was = failing.clone();
    }
    let body: String = lines
        .iter()
        .map(|(n, r)| format!("{n}: {}\n", if r.is_ok() { "ok" } else { "failed" }))
        .collect();
    let status = if failing.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, body)
}

impl HttpServer {
    /// Bind the configured address.
    pub async fn bind(&self) -> Result<tokio::net::TcpListener, HttpError> {
        tokio::net::TcpListener::bind(self.listen)
            .await
            .map_err(|e| HttpError::Bind(self.listen.to_string(), e))
    }

    /// What the listener says it serves, for the daemon's start line.
    pub fn describe(&self) -> String {
        format!(
            "{} ({}), issuers {}",
            self.resource,
            if self.tls.is_some() {
                "TLS"
            } else {
                "plain HTTP on loopback"
            },
            self.verifier.issuer_ids().join(", ")
        )
    }

    /// The token verifier (to fetch the issuers' keys at start).
    pub fn verifier(&self) -> &Verifier {
        &self.verifier
    }

    /// Accept connections until `stop` is cancelled.
    pub async fn serve(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        stop: CancellationToken,
    ) {
        let mut conns = tokio::task::JoinSet::new();
        tokio::spawn(Arc::clone(&self).sweep_sessions(stop.clone()));
        let router = Self::routes(&self);
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, remote)) => {
                        let Some(slot) = ConnSlot::take(&self, remote.ip()) else {
                            // Over the caps: closed before the handshake.
                            drop(stream);
                            continue;
                        };
                        let me = Arc::clone(&self);
                        let stop = stop.clone();
                        let router = router.clone();
                        conns.spawn(async move {
                            let _slot = slot;
                            me.connection(stream, remote, stop, router).await
                        });
                    }
                    Err(e) => {
                        tracing::warn!("accepting an HTTP connection: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                _ = stop.cancelled() => break,
            }
        }
        conns.abort_all();
    }

    /// Close the sessions [`limits`] finds idle, in rmcp too; and close
    /// every session rmcp holds that the table does not count (seen so in
    /// two sweeps in a row, so that one being opened now is left alone):
    /// whatever path made one (a request dropped between rmcp making it
    /// and the table counting it), nobody holds an uncounted session.
    async fn sweep_sessions(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(SESSION_SWEEP);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut suspects: std::collections::HashSet<Arc<str>> = Default::default();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => return,
            }
            let held: Vec<Arc<str>> = self
                .session_manager
                .sessions
                .read()
                .await
                .keys()
                .cloned()
                .collect();
            let uncounted: std::collections::HashSet<Arc<str>> = held
                .into_iter()
                .filter(|id| self.limits.owner(id).is_none())
                .collect();
            for id in uncounted.intersection(&suspects) {
                tracing::warn!("closing an MCP session this transport does not count");
                let _ = rmcp::transport::streamable_http_server::session::SessionManager::close_session(
                    self.session_manager.as_ref(),
                    id,
                )
                .await;
            }
            suspects = uncounted.difference(&suspects).cloned().collect();
            for id in self.limits.take_idle() {
                let id: Arc<str> = Arc::from(id.as_str());
                if let Err(e) =
                    rmcp::transport::streamable_http_server::session::SessionManager::close_session(
                        self.session_manager.as_ref(),
                        &id,
                    )
                    .await
                {
                    tracing::debug!("closing an idle MCP session: {e}");
                }
            }
        }
    }

    async fn connection(
        self: Arc<Self>,
        stream: tokio::net::TcpStream,
        remote: SocketAddr,
        stop: CancellationToken,
        router: Router,
    ) {
        let _ = stream.set_nodelay(true);
        match &self.tls {
            Some(acceptor) => {
                let tls =
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(%remote, "TLS handshake failed: {e}");
                            return;
                        }
                        Err(_) => return,
                    };
                self.http1(hyper_util::rt::TokioIo::new(tls), remote, stop, router)
                    .await;
            }
            None => {
                self.http1(hyper_util::rt::TokioIo::new(stream), remote, stop, router)
                    .await
            }
        }
    }

    async fn http1<I>(
        self: Arc<Self>,
        io: I,
        remote: SocketAddr,
        stop: CancellationToken,
        router: Router,
    ) where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        // The identity this connection is counted against, once a request
        // on it has authenticated; each request carries it to the routes.
        let conn = Conn {
            remote,
            tag: Arc::new(limits::ConnTag::new(&self.limits)),
        };
        let service = hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(conn.clone());
            tower::ServiceExt::oneshot(router.clone(), req)
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(self.limits.quotas.request_timeout)
            .serve_connection(io, service);
        tokio::pin!(conn);
        tokio::select! {
            r = conn.as_mut() => if let Err(e) = r {
                tracing::debug!(%remote, "HTTP connection: {e}");
            },
            _ = stop.cancelled() => {
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
            }
        }
    }

    /// The routes, each with its body limit, under the layers every
    /// request goes through: a request id (the client's when it is plain,
    /// else a new one, returned in `x-request-id`), a trace span naming
    /// the method, the path without its query, and that id (never a
    /// header), `Authorization`, `Cookie` and the session id marked
    /// sensitive for whatever logs a request after, a body that stalls
    /// cut, and a body-size refusal made by a layer audited like the
    /// others.
    fn routes(server: &Arc<HttpServer>) -> Router {
        let s = server;
        let quotas = &s.limits.quotas;
        let mut r: Router<Arc<HttpServer>> = Router::new()
            .route("/healthz", any(|| async { plain(StatusCode::OK, "ok\n") }))
            .route(
                "/readyz",
                any(|State(s): State<Arc<HttpServer>>| async move { s.readiness().await }),
            )
            .route(PRM_PATH, any(Self::resource_metadata))
            .route(
                "/approvals",
                any(Self::page).layer(RequestBodyLimitLayer::new(page::MAX_BODY)),
            )
            // (A wildcard matches one character at least: the list's own
            // path is named apart.)
            .route(
                "/approvals/",
                any(Self::page).layer(RequestBodyLimitLayer::new(page::MAX_BODY)),
            )
            .route(
                "/approvals/{*rest}",
                any(Self::page).layer(RequestBodyLimitLayer::new(page::MAX_BODY)),
            )
            .route(
                &s.control_path,
                any(Self::control_request).layer(RequestBodyLimitLayer::new(MAX_CONTROL_BYTES)),
            )
            .route(
                &s.resource_path,
                any(Self::mcp_request).layer(RequestBodyLimitLayer::new(s.max_request_bytes)),
            );
        if s.resource_path != "/" {
            r = r.route(
                &format!("{PRM_PATH}{}", s.resource_path),
                any(Self::resource_metadata),
            );
        } else {
            r = r.route(&format!("{PRM_PATH}/"), any(Self::resource_metadata));
        }
        if s.metrics.is_some() {
            r = r.route(
                "/metrics",
                any(
                    |State(s): State<Arc<HttpServer>>, req: Request<axum::body::Body>| async move {
                        match &s.metrics {
                            Some(p) => metrics::scrape(req.method(), Arc::clone(p)).await,
                            None => plain(StatusCode::NOT_FOUND, "not found\n"),
                        }
                    },
                ),
            );
        }
        let sensitive: std::sync::Arc<[header::HeaderName]> = vec![
            header::AUTHORIZATION,
            header::PROXY_AUTHORIZATION,
            header::COOKIE,
            header::HeaderName::from_static("mcp-session-id"),
        ]
        .into();
        r.fallback(|| async { plain(StatusCode::NOT_FOUND, "not found\n") })
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(s),
                Self::audit_layer_refusals,
            ))
            .layer(RequestBodyTimeoutLayer::new(quotas.request_timeout))
            .layer(PropagateRequestIdLayer::x_request_id())
            .layer(
                TraceLayer::new_for_http()
                    .make_span_with(|req: &Request<axum::body::Body>| {
                        let id = req
                            .headers()
                            .get(REQUEST_ID)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default();
                        tracing::debug_span!(
                            "http",
                            method = %clip(req.method().as_str(), 16),
                            path = %clip(req.uri().path(), 200),
                            request_id = %id,
                        )
                    })
                    .on_request(())
                    .on_response(
                        tower_http::trace::DefaultOnResponse::new().level(tracing::Level::DEBUG),
                    )
                    .on_failure(
                        tower_http::trace::DefaultOnFailure::new().level(tracing::Level::DEBUG),
                    ),
            )
            .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
            .layer(axum::middleware::map_request(plain_request_id))
            .layer(SetSensitiveResponseHeadersLayer::new([header::SET_COOKIE]))
            .layer(SetSensitiveRequestHeadersLayer::from_shared(sensitive))
            .with_state(Arc::clone(s))
    }

    /// A body-size refusal a layer made (a `Content-Length` over the
    /// route's limit) is audited, says the limit, and closes the
    /// connection, as the ones the handlers make.
    async fn audit_layer_refusals(
        State(s): State<Arc<HttpServer>>,
        Extension(conn): Extension<Conn>,
        req: Request<axum::body::Body>,
        next: axum::middleware::Next,
    ) -> axum::response::Response {
        let method = clip(req.method().as_str(), 16);
        let path = req.uri().path().to_string();
        let response = next.run(req).await;
        if response.status() != StatusCode::PAYLOAD_TOO_LARGE
            || response.extensions().get::<Answered>().is_some()
        {
            return response;
        }
        let limit = if path == s.control_path {
            MAX_CONTROL_BYTES
        } else if path == s.resource_path {
            s.max_request_bytes
        } else {
            page::MAX_BODY
        };
        s.body_refused(
            limits::BodyError::TooLarge,
            conn.remote,
            &method,
            &path,
            "",
            limit,
        )
        .into_response()
    }

    async fn resource_metadata(
        State(s): State<Arc<HttpServer>>,
        req: Request<axum::body::Body>,
    ) -> Response<Body> {
        match *req.method() {
            hyper::Method::GET | hyper::Method::HEAD => {
                let mut r = Response::new(Full::new(s.metadata.clone()).boxed());
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                r
            }
            _ => plain(StatusCode::METHOD_NOT_ALLOWED, "GET only\n"),
        }
    }

    /// The approval page (`/approvals/…`): no bearer token; the page
    /// checks its own session and origin ([`page::Pages`]).
    async fn page(
        State(s): State<Arc<HttpServer>>,
        Extension(conn): Extension<Conn>,
        req: Request<axum::body::Body>,
    ) -> Response<Body> {
        let deadline = tokio::time::Instant::now() + s.limits.quotas.request_timeout;
        let (method, path) = (
            clip(req.method().as_str(), 16),
            req.uri().path().to_string(),
        );
        // A page elsewhere must not reach this gateway by a name of its
        // own (DNS rebinding); state changes also check their origin
        // (page::Pages::same_origin).
        if !s.host_allowed_in(&req) {
            let why = s.refuse(
                &conn,
                StatusCode::FORBIDDEN,
                "the Host is not a name of this gateway".into(),
                &method,
                &path,
                None,
            );
            return page::refused(StatusCode::FORBIDDEN, &why);
        }
        let pages = match &s.pages {
            Ok(p) => p,
            Err(why) => {
                return page::refused(
                    StatusCode::NOT_FOUND,
                    &format!("this gateway serves no approval page: {why}"),
                );
            }
        };
        let (parts, body) = req.into_parts();
        let body = match limits::read_body(body, page::MAX_BODY, deadline).await {
            Ok(b) => b,
            Err(e) => return s.body_refused(e, conn.remote, &method, &path, "", page::MAX_BODY),
        };
        let req = Request::from_parts(parts, Full::new(body));
        match pages.handle(req, conn.remote).await {
            Ok(r) => r,
            Err((status, why)) => {
                let why = s.refuse(&conn, status, why, &method, &path, None);
                page::refused(status, &why)
            }
        }
    }

    async fn control_request(
        State(s): State<Arc<HttpServer>>,
        Extension(conn): Extension<Conn>,
        req: Request<axum::body::Body>,
    ) -> Response<Body> {
        s.authenticated(&conn, req, true).await
    }

    async fn mcp_request(
        State(s): State<Arc<HttpServer>>,
        Extension(conn): Extension<Conn>,
        req: Request<axum::body::Body>,
    ) -> Response<Body> {
        s.authenticated(&conn, req, false).await
    }

    /// Audit a refusal of `conn`'s request; the reason, to answer with.
    fn refuse(
        &self,
        conn: &Conn,
        status: StatusCode,
        reason: String,
        method: &str,
        path: &str,
        token: Option<auth::TokenFacts>,
    ) -> String {
        self.audit_refusal(conn.remote, status, &reason, method, path, token);
        reason
    }

    /// Whether the request's `Host` is a name of this gateway.
    fn host_allowed_in<B>(&self, req: &Request<B>) -> bool {
        host_of(req).is_some_and(|h| self.host_allowed(&h))
    }

    /// A request to the MCP endpoint or the control API: the checks in
    /// order (Host, Origin, no token in the query, the bearer token, the
    /// identity's share, the body), then the operator command or MCP.
    async fn authenticated(
        self: &Arc<Self>,
        conn: &Conn,
        req: Request<axum::body::Body>,
        is_control: bool,
    ) -> Response<Body> {
        // The whole request by then: its headers were read already (within
        // the same limit, hyper's), its body must follow in the rest.
        let deadline = tokio::time::Instant::now() + self.limits.quotas.request_timeout;
        let remote = conn.remote;
        let tag = &conn.tag;
        let path = req.uri().path().to_string();
        let method = clip(req.method().as_str(), 16);
        let refuse = |status: StatusCode, reason: String, token: Option<auth::TokenFacts>| {
            self.refuse(conn, status, reason, &method, &path, token)
        };
        // DNS rebinding: a page elsewhere must not reach this gateway by a
        // name of its own, nor from a browser origin not allowed.
        if !self.host_allowed_in(&req) {
            let host = host_of(&req);
            let why = refuse(
                StatusCode::FORBIDDEN,
                format!(
                    "the Host {:?} is not a name of this gateway ([http] allowed_hosts)",
                    host.as_deref().map(|h| clip(h, 100)).unwrap_or_default()
                ),
                None,
            );
            return closing(plain(StatusCode::FORBIDDEN, &format!("{why}\n")));
        }
        if let Some(origin) = req.headers().get(header::ORIGIN) {
            let o = origin.to_str().unwrap_or("");
            if !self.allowed_origins.iter().any(|a| a == o) {
                let why = refuse(
                    StatusCode::FORBIDDEN,
                    format!(
                        "the Origin {:?} is not allowed ([http] allowed_origins)",
                        clip(o, 100)
                    ),
                    None,
                );
                return closing(plain(StatusCode::FORBIDDEN, &format!("{why}\n")));
            }
        }
        if req.uri().query().is_some_and(query_has_token) {
            let why = refuse(
                StatusCode::BAD_REQUEST,
                "a token in the URL's query is refused: URLs end up in logs and histories; send it in the Authorization header".into(),
                None,
            );
            return self.challenge(StatusCode::BAD_REQUEST, "invalid_request", &why);
        }
        let token = match bearer(req.headers()) {
            Ok(t) => t,
            Err(why) => {
                let why = refuse(StatusCode::UNAUTHORIZED, why, None);
                return self.challenge(StatusCode::UNAUTHORIZED, "", &why);
            }
        };
        let principal = match self.verifier.verify(&token, "").await {
            Ok(p) => p,
            Err((e, facts)) => {
                let (status, code) = match &e {
                    AuthError::InvalidToken(_) | AuthError::Config(_) => {
                        (StatusCode::UNAUTHORIZED, "invalid_token")
                    }
                    AuthError::InsufficientScope(_) => {
                        (StatusCode::FORBIDDEN, "insufficient_scope")
                    }
                    AuthError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, ""),
                };
                let why = refuse(status, e.to_string(), Some(facts));
                if status == StatusCode::SERVICE_UNAVAILABLE {
                    return closing(plain(status, &format!("{why}\n")));
                }
                return self.challenge(status, code, &why);
            }
        };
        // From here the request is an identity's, counted against its share.
        let who = principal.id();
        if let Err(over) = tag.claim(&who) {
            // Held too before the connection is closed: a client that
            // reconnects at once on this refusal would otherwise make the
            // gateway pay a TLS handshake per try, as fast as it can loop.
            tokio::time::sleep(REFUSAL_HOLD).await;
            return self.limited(over, remote, &method, &path, &who, true);
        }
        // A legacy session is its first identity's, for every method (its
        // event replay, its notifications, its DELETE).
        let session = req
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if let Some(id) = &session
            && self.limits.owner(id).as_deref() != Some(who.as_str())
        {
            let why = refuse(
                StatusCode::NOT_FOUND,
                "no session of yours has that Mcp-Session-Id; start a new one".into(),
                None,
            );
            return plain(StatusCode::NOT_FOUND, &format!("{why}\n"));
        }
        let guard = match self.limits.begin_request(&who, session.as_deref()) {
            Ok(g) => g,
            Err(over) => {
                // Held before it is answered: a client that loops on its
                // refusals gets one a second per connection it holds (at
                // most its share), not as many as the CPU can make.
                tokio::time::sleep(REFUSAL_HOLD).await;
                return self.limited(over, remote, &method, &path, &who, false);
            }
        };
        let limit = if is_control {
            MAX_CONTROL_BYTES
        } else {
            self.max_request_bytes
        };
        let (parts, body) = req.into_parts();
        let body = match limits::read_body(body, limit, deadline).await {
            Ok(b) => b,
            Err(e) => return self.body_refused(e, remote, &method, &path, &who, limit),
        };
        let opens =
            parts.method == hyper::Method::POST && session.is_none() && is_initialize(&body);
        let mut req = Request::from_parts(parts, Full::new(body));
        if is_control {
            return self.control(req, principal).await;
        }
        // 2026-07-28: every request names its method in a header that
        // proxies route on (rmcp checks that it matches the body).
        let modern = req
            .headers()
            .get("mcp-protocol-version")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v >= "2026-07-28");
        if modern
            && req.method() == hyper::Method::POST
            && !req.headers().contains_key("mcp-method")
        {
            let why = refuse(
                StatusCode::BAD_REQUEST,
                "a 2026-07-28 request must carry its Mcp-Method header".into(),
                None,
            );
            return plain(StatusCode::BAD_REQUEST, &format!("{why}\n"));
        }
        // A new legacy session is counted against its identity before rmcp
        // makes it (a 2026-07-28 request makes none).
        let opening = if opens && !modern {
            match self.limits.open_session(&who) {
                Ok(o) => Some(o),
                Err(over) => {
                    // Held, counted as in flight (see above).
                    tokio::time::sleep(REFUSAL_HOLD).await;
                    return self.limited(over, remote, &method, &path, &who, false);
                }
            }
        } else {
            None
        };
        let deleting = req.method() == hyper::Method::DELETE;
        // The token never goes further than this.
        req.headers_mut().remove(header::AUTHORIZATION);
        req.extensions_mut().insert(SsoPrincipal(principal));
        // The connection's facts stay here: rmcp keeps a request's
        // extensions for as long as its call runs, and the connection's
        // tag must be given back when the connection closes, not when a
        // call it started ends.
        req.extensions_mut().remove::<Conn>();
        let response = self.mcp.handle(req).await;
        match &session {
            // Ended by its DELETE.
            Some(id) if deleting && response.status().is_success() => {
                self.limits.session_ended(id);
            }
            // A 404 says so only when rmcp no longer has the session (a
            // method it does not know answers 404 too, and must not make
            // a live session uncounted).
            Some(id) if response.status() == StatusCode::NOT_FOUND => {
                let sid: Arc<str> = Arc::from(id.as_str());
                let known =
                    rmcp::transport::streamable_http_server::session::SessionManager::has_session(
                        self.session_manager.as_ref(),
                        &sid,
                    )
                    .await
                    .unwrap_or(true);
                if !known {
                    self.limits.session_ended(id);
                }
            }
            Some(_) => {}
            None => {
                let made = response
                    .headers()
                    .get("mcp-session-id")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                match (made, opening) {
                    (Some(id), Some(o)) => o.opened(&id),
                    (Some(id), None) => {
                        // Made by a request not seen as an initialize: not
                        // counted, so not kept.
                        tracing::warn!(
                            "closing an MCP session made by a request this transport did not count"
                        );
                        let id: Arc<str> = Arc::from(id.as_str());
                        let _ = rmcp::transport::streamable_http_server::session::SessionManager::close_session(
                            self.session_manager.as_ref(),
                            &id,
                        )
                        .await;
                    }
                    (None, _) => {}
                }
            }
        }
        // The request counts until its answer's last byte (a stream's end).
        let (parts, body) = response.into_parts();
        Response::from_parts(parts, limits::Held::new(body, guard).boxed())
    }

    /// A request refused at one of its identity's limits: 429 with
    /// `Retry-After` (and the connection closed when it is the connection
    /// that is over), audited, counted.
    fn limited(
        &self,
        over: limits::Over,
        remote: SocketAddr,
        method: &str,
        path: &str,
        who: &str,
        close: bool,
    ) -> Response<Body> {
        gateway_telemetry::metrics().http_limited(over.limit, who);
        self.audit_refusal_of(
            remote,
            StatusCode::TOO_MANY_REQUESTS,
            &over.reason,
            method,
            path,
            None,
            Some(who),
        );
        let mut r = plain(StatusCode::TOO_MANY_REQUESTS, &format!("{}\n", over.reason));
        let secs = over.retry_after.as_secs().max(1);
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        if close {
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        r
    }

    /// A body that could not be read: 408 (too slow), 413 (too large) or
    /// 400 (broken off), audited, and the connection closed.
    fn body_refused(
        &self,
        e: limits::BodyError,
        remote: SocketAddr,
        method: &str,
        path: &str,
        who: &str,
        limit: usize,
    ) -> Response<Body> {
        let (status, why) = match e {
            limits::BodyError::TooSlow => {
                gateway_telemetry::metrics().http_limited("request_timeout", who);
                (
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the request did not arrive whole within {} s ([http] request_timeout_seconds)",
                        self.limits.quotas.request_timeout.as_secs()
                    ),
                )
            }
            limits::BodyError::TooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("a request's body here is at most {limit} bytes"),
            ),
            limits::BodyError::Broken(e) => (
                StatusCode::BAD_REQUEST,
                format!("the request's body was broken off: {}", clip(&e, 200)),
            ),
        };
        self.audit_refusal_of(
            remote,
            status,
            &why,
            method,
            path,
            None,
            (!who.is_empty()).then_some(who),
        );
        let mut r = plain(status, &format!("{why}\n"));
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        r
    }

    /// Audit a refusal: one by one up to `audited_refusals_per_minute` per
    /// peer address each minute; past that they are counted, and the next
    /// one audited says how many were not (a client without a token must
    /// not be able to fill the disk with fsynced lines).
    fn audit_refusal(
        &self,
        remote: SocketAddr,
        status: StatusCode,
        reason: &str,
        method: &str,
        path: &str,
        token: Option<auth::TokenFacts>,
    ) {
        self.audit_refusal_of(remote, status, reason, method, path, token, None)
    }

    /// [`HttpServer::audit_refusal`] of a request whose identity is known.
    #[allow(clippy::too_many_arguments)]
    fn audit_refusal_of(
        &self,
        remote: SocketAddr,
        status: StatusCode,
        reason: &str,
        method: &str,
        path: &str,
        token: Option<auth::TokenFacts>,
        identity: Option<&str>,
    ) {
        let suppressed = {
            let mut r = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
            if r.by_address.len() > 10_000 {
                r.by_address.retain(|_, (start, _, skipped)| {
                    start.elapsed() < Duration::from_secs(60) || *skipped > 0
                });
            }
            let e = r.by_address.entry(address_key(remote.ip())).or_insert((
                std::time::Instant::now(),
                0,
                0,
            ));
            if e.0.elapsed() >= Duration::from_secs(60) {
                e.0 = std::time::Instant::now();
                e.1 = 0;
            }
            if e.1 >= self.audited_refusals_per_minute {
                e.2 += 1;
                return;
            }
            e.1 += 1;
            std::mem::take(&mut e.2)
        };
        let _ = self.audit.record(
            "",
            Event::HttpRefused {
                status: status.as_u16(),
                reason: reason.to_string(),
                remote: remote.to_string(),
                method: method.to_string(),
                path: clip(path, 200),
                token: token.map(|t| json!(t)),
                identity: identity.map(str::to_string),
                not_audited_before: (suppressed > 0).then_some(suppressed),
            },
        );
    }

    /// An operator command of an SSO identity (`gateway approve|deny|
    /// approvals` with `GATEWAY_URL`): `{"argv": [...]}` in, the reply
    /// (`{code, stdout, stderr}`) out. The command is parsed and judged as
    /// on the socket; the identity is the token's, never the argv's.
    async fn control(
        &self,
        req: Request<Full<Bytes>>,
        principal: gateway_policy::Principal,
    ) -> Response<Body> {
        if req.method() != hyper::Method::POST {
            return plain(StatusCode::METHOD_NOT_ALLOWED, "POST only\n");
        }
        let body = match http_body_util::Limited::new(req.into_body(), MAX_CONTROL_BYTES)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                return plain(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &format!("an operator command is at most {MAX_CONTROL_BYTES} bytes\n"),
                );
            }
        };
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Command {
            argv: Vec<String>,
        }
        let argv = match serde_json::from_slice::<Command>(&body) {
            Ok(c) => c.argv,
            Err(e) => {
                return plain(
                    StatusCode::BAD_REQUEST,
                    &format!("the body is not {{\"argv\": [strings]}}: {e}\n"),
                );
            }
        };
        let control = Arc::clone(&self.control);
        let asker = crate::daemon::Asker::Sso(principal);
        let reply = tokio::task::spawn_blocking(move || control(&asker, argv))
            .await
            .unwrap_or_else(|e| {
                crate::daemon::wire::Reply::refused(format!("the command failed: {e}"))
            });
        let mut r = Response::new(Full::new(Bytes::from(json!(reply).to_string())).boxed());
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    }

    fn host_allowed(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        self.allowed_hosts.iter().any(|a| {
            let a = a.to_ascii_lowercase();
            // An allowed name without a port allows it on any port.
            a == host || (!a.contains(':') && host.rsplit_once(':').is_some_and(|(h, _)| h == a))
        })
    }

    /// A 401/403/400 with `WWW-Authenticate` naming the resource metadata
    /// (MCP authorization; RFC 6750 §3).
    fn challenge(&self, status: StatusCode, error: &str, why: &str) -> Response<Body> {
        let quoted = |s: &str| {
            s.replace(['"', '\\'], "'")
                .replace(|c: char| c.is_control(), " ")
        };
        let mut v = format!("Bearer resource_metadata=\"{}\"", self.metadata_url);
        if !error.is_empty() {
            v.push_str(&format!(
                ", error=\"{error}\", error_description=\"{}\"",
                quoted(why)
            ));
        }
        let mut r = plain(status, &format!("{why}\n"));
        if let Ok(h) = HeaderValue::from_str(&v) {
            r.headers_mut().insert(header::WWW_AUTHENTICATE, h);
        }
        closing(r)
    }
}

/// The name a request is addressed to: its `Host`, else its URI's authority.
fn host_of<B>(req: &Request<B>) -> Option<String> {
    req.headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().authority().map(|a| a.to_string()))
}

/// `r` with the connection closed after it: a refusal before any identity
/// is known leaves no connection to be held (a client with no token, or a
/// bad one, cannot keep a slot by sending slow headers again and again).
fn closing(mut r: Response<Body>) -> Response<Body> {
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Why the resource's path cannot be routed beside the listener's own
/// paths, if it cannot: it would shadow or be shadowed by one of them, or
/// a segment would read as a route parameter (`{x}`, `:x`, `*x`).
fn unroutable(path: &str) -> Option<String> {
    let own = ["/healthz", "/readyz", "/metrics", "/approvals"];
    if own.contains(&path.trim_end_matches('/'))
        || path.starts_with("/approvals/")
        || path.starts_with(PRM_PATH)
    {
        return Some(format!(
            "its path {path:?} is one of the listener's own ({}, /approvals/…, {PRM_PATH}); choose another, e.g. /mcp",
            own[..3].join(", ")
        ));
    }
    if path
        .split('/')
        .any(|seg| seg.starts_with([':', '*']) || seg.contains(['{', '}']))
    {
        return Some(format!(
            "its path {path:?} has a segment starting with ':' or '*' or holding braces; choose a plain path, e.g. /mcp"
        ));
    }
    None
}

/// Whether a JSON-RPC body is (or, as a batch, holds) an `initialize`:
/// the request that opens a legacy session.
fn is_initialize(body: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Msg {
        #[serde(default)]
        method: Option<String>,
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Frame {
        One(Msg),
        Many(Vec<Msg>),
    }
    match serde_json::from_slice::<Frame>(body) {
        Ok(Frame::One(m)) => m.method.as_deref() == Some("initialize"),
        Ok(Frame::Many(ms)) => ms.iter().any(|m| m.method.as_deref() == Some("initialize")),
        Err(_) => false,
    }
}

/// The bearer token of `Authorization`, or why there is none.
fn bearer(headers: &hyper::http::HeaderMap) -> Result<String, String> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let Some(v) = values.next() else {
        return Err("no bearer token: sign in with the authorization server this gateway names in its resource metadata".into());
    };
    if values.next().is_some() {
        return Err("more than one Authorization header".into());
    }
    let v = v
        .to_str()
        .map_err(|_| "the Authorization header is not text".to_string())?;
    match v.split_once(' ') {
        Some((scheme, token))
            if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() =>
        {
            Ok(token.trim().to_string())
        }
        _ => Err("the Authorization header is not a Bearer token".into()),
    }
}

/// Whether a query string carries a token (`access_token`, RFC 6750 §2.3).
fn query_has_token(q: &str) -> bool {
    q.split('&').any(|kv| {
        let k = kv.split('=').next().unwrap_or("");
        k.eq_ignore_ascii_case("access_token") || k.eq_ignore_ascii_case("token")
    })
}

fn clip(s: &str, n: usize) -> String {
    s.chars().filter(|c| !c.is_control()).take(n).collect()
}

fn plain(status: StatusCode, text: &str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(text.to_string())).boxed());
    *r.status_mut() = status;
    r.extensions_mut().insert(Answered);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The TLS acceptor for `cert` and `key` (PEM).
fn tls_acceptor(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<tokio_rustls::TlsAcceptor, HttpError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |m: String| HttpError::Config(m);
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| bad(format!("tls_cert {}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(bad(format!("tls_cert {}: no certificate", cert.display())));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|_| {
        bad(format!(
            "tls_key {}: no private key could be read",
            key.display()
        ))
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(format!("TLS: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| bad(format!("tls_cert/tls_key: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// One open connection, counted until dropped.
struct ConnSlot {
    server: Arc<HttpServer>,
    ip: std::net::IpAddr,
}

/// The address a connection counts against: an IPv6 peer by its /64 (one
/// host is usually given a whole /64, so counting each address would give
/// it 2^64 shares), an IPv4 one (or a v4-mapped v6 one) by itself.
fn address_key(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => std::net::IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                std::net::IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

impl ConnSlot {
    fn take(server: &Arc<HttpServer>, ip: std::net::IpAddr) -> Option<ConnSlot> {
        let ip = address_key(ip);
        let mut c = server.conns.lock().unwrap_or_else(|e| e.into_inner());
        let total: usize = c.values().sum();
        let mine = c.get(&ip).copied().unwrap_or(0);
        if total >= server.max_connections || mine >= server.max_connections_per_address {
            return None;
        }
        *c.entry(ip).or_insert(0) += 1;
        gateway_telemetry::metrics().set_http_connections(total + 1);
        Some(ConnSlot {
            server: Arc::clone(server),
            ip,
        })
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut c = self.server.conns.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = c.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.remove(&self.ip);
            }
        }
        gateway_telemetry::metrics().set_http_connections(c.values().sum());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resource_path_that_would_clash_with_a_route_is_refused() {
        for ok in ["/", "/mcp", "/team/mcp", "/mcp/"] {
            assert_eq!(unroutable(ok), None, "{ok}");
            // And the router takes it (axum panics on a path it refuses).
            let _ = Router::<()>::new()
                .route(ok, any(|| async { "" }))
                .route("/healthz", any(|| async { "" }));
        }
        for bad in [
            "/healthz",
            "/metrics/",
            "/approvals",
            "/approvals/x",
            "/.well-known/oauth-protected-resource",
            "/:id",
            "/a/*rest",
            "/{x}",
        ] {
            assert!(unroutable(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn tokens_are_found_in_the_header_only() {
        let mut h = hyper::http::HeaderMap::new();
        assert!(bearer(&h).is_err());
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert!(bearer(&h).is_err());
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer abc.def"),
        );
        assert_eq!(bearer(&h).as_deref(), Ok("abc.def"));
        h.append(header::AUTHORIZATION, HeaderValue::from_static("Bearer x"));
        assert!(bearer(&h).is_err());
        assert!(query_has_token("a=1&access_token=x"));
        assert!(query_has_token("Access_Token=x"));
        assert!(!query_has_token("a=1&b=2"));
    }
}
