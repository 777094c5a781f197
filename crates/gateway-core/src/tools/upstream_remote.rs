//! A remote upstream MCP server (MCP's streamable HTTP transport), spoken
//! to by the gateway itself with rmcp's client: the other transport of an
//! upstream besides the stdio server a sandbox runs
//! ([`super::upstream::list`], the `mcp_upstream` runner). It gives the same
//! [`McpReport`] the step runner gives for a stdio server, so that the
//! lock, the readings, the call's checks and its audit are one.
//!
//! What the server sends is hostile input, as from a stdio server: each
//! answer is capped at the upstream's `max_result_bytes` (rmcp's client
//! refuses a larger JSON body or SSE event before parsing it), the tool
//! list at as many pages and bytes, the whole exchange at
//! `timeout_seconds`; its requests (sampling, elicitation, roots) are
//! refused and counted, its notifications counted; the tool is called only
//! when its live definition is the locked one. TLS is verified (the
//! system's roots, or the declared `ca_file`'s); plain HTTP only to a
//! loopback address. No redirect is followed. The credential the gateway
//! presents (`bearer_token_file`, root's) is the operator's for that server,
//! never the agent's token, and is cut from anything the server returns.

use std::sync::{Arc, Mutex};
use std::time::Duration;

// Sampling and roots are deprecated in MCP (SEP-2577); a server may still
// ask for them, and is refused.
#[allow(deprecated)]
use rmcp::model::{
    CallToolRequestParams, ClientConfig, CreateMessageRequestParams, CreateMessageResult,
    ElicitRequestParams, ElicitResult, ErrorData, Implementation, ListRootsResult, NumberOrString,
    PaginatedRequestParams, ProgressNotificationParam, ProgressToken, RequestMetaObject,
};
use rmcp::service::{NotificationContext, RequestContext, RoleClient};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ServiceExt};
use serde_json::Value;
use zeroize::Zeroizing;

use gateway_runner::protocol::{McpExchange, McpReport};

use super::upstream::Server;

/// Pages of `tools/list` read at most (as the step runner does).
const MAX_PAGES: usize = 64;

/// What the server did besides answering, counted by the client's handler.
#[derive(Default)]
struct Seen {
    requests_refused: u64,
    refused_methods: Vec<String>,
    notifications: u64,
    progress: Option<Value>,
    list_changed: bool,
}

/// Told of each progress notification of the server's, as a line of text.
pub type OnProgress = Arc<dyn Fn(String) + Send + Sync>;

/// The client's side of the session: refuses every request of the
/// server's, counts its notifications, passes progress on.
#[derive(Clone)]
struct Watcher(
    Arc<Mutex<Seen>>,
    Option<OnProgress>,
    /// The token the gateway presents, cut from what progress says.
    Vec<gateway_base::secret::SecretFile>,
);

impl Watcher {
    fn refuse(&self, method: &str) {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        s.requests_refused += 1;
        if s.refused_methods.len() < 16 {
            s.refused_methods.push(method.to_string());
        }
    }
    fn notified(&self, f: impl FnOnce(&mut Seen)) {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        s.notifications += 1;
        f(&mut s);
    }
}

fn refused<T>(method: &str) -> Result<T, ErrorData> {
    Err(ErrorData::new(
        rmcp::model::ErrorCode::METHOD_NOT_FOUND,
        format!("{method} is not offered to upstream servers by this gateway"),
        None,
    ))
}

#[allow(deprecated)]
impl ClientHandler for Watcher {
    fn get_info(&self) -> ClientConfig {
        let mut info = ClientConfig::default();
        info.client_info = Implementation::new("gateway", env!("CARGO_PKG_VERSION"));
        info
    }

    async fn create_message(
        &self,
        _params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        self.refuse("sampling/createMessage");
        refused("sampling/createMessage")
    }

    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        self.refuse("roots/list");
        refused("roots/list")
    }

    async fn create_elicitation(
        &self,
        _request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        self.refuse("elicitation/create");
        refused("elicitation/create")
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if let (Some(tell), Ok(v)) = (&self.1, serde_json::to_value(&params)) {
            tell(super::upstream::progress_line(&v, &self.2));
        }
        self.notified(|s| s.progress = serde_json::to_value(&params).ok());
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.notified(|s| s.list_changed = true);
    }

    async fn on_logging_message(
        &self,
        _params: rmcp::model::LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.notified(|_| {});
    }
}

/// The most requests a remote server may make of the gateway in one
/// exchange (all are refused), and the most messages of any kind.
const MAX_SERVER_REQUESTS: u64 = 16;
const MAX_SERVER_MESSAGES: u64 = 1024;

type HttpTransport = StreamableHttpClientTransport<reqwest::Client>;

/// rmcp's streamable HTTP transport, bounded: it ends the session when the
/// server sends more than [`MAX_SERVER_REQUESTS`] requests or
/// [`MAX_SERVER_MESSAGES`] messages (rmcp spawns a task per request and
/// per reply), and its `close` never waits on rmcp's worker (which can
/// block for good on a server that keeps streaming once nobody reads):
/// it cancels the worker and drops it, which ends it.
struct Bounded {
    inner: Option<HttpTransport>,
    requests: u64,
    messages: u64,
    /// Why the transport ended the session, if it did.
    stopped: Arc<Mutex<Option<String>>>,
    /// Cancelled when it does: what waits on the server stops waiting.
    abort: tokio_util::sync::CancellationToken,
}

impl rmcp::transport::Transport<RoleClient> for Bounded {
    type Error = <HttpTransport as rmcp::transport::Transport<RoleClient>>::Error;

    fn send(
        &mut self,
        item: rmcp::service::TxJsonRpcMessage<RoleClient>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        let sent = self.inner.as_mut().map(|t| t.send(item));
        async move {
            match sent {
                Some(f) => f.await,
                None => Ok(()),
            }
        }
    }

    async fn receive(&mut self) -> Option<rmcp::service::RxJsonRpcMessage<RoleClient>> {
        let msg = self.inner.as_mut()?.receive().await?;
        self.messages += 1;
        if matches!(msg, rmcp::model::JsonRpcMessage::Request(_)) {
            self.requests += 1;
        }
        let over = if self.requests > MAX_SERVER_REQUESTS {
            Some(format!(
                "the server made more than {MAX_SERVER_REQUESTS} requests of the gateway"
            ))
        } else if self.messages > MAX_SERVER_MESSAGES {
            Some(format!(
                "the server sent more than {MAX_SERVER_MESSAGES} messages"
            ))
        } else {
            None
        };
        if let Some(why) = over {
            *self.stopped.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
            self.abort.cancel();
            return None;
        }
        Some(msg)
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        if let Some(t) = self.inner.take() {
            t.cancel_token().cancel();
            drop(t);
        }
        Ok(())
    }
}

/// Why the declared URL cannot be used, if it cannot: `https://`, or
/// `http://` to a loopback address only.
pub fn check_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("url {url:?}: {e}"))?;
    if !parsed.username().is_empty()
        || parsed.password().is_some()
        || parsed.query().is_some()
        || parsed.fragment().is_some()
    {
        return Err(format!(
            "url {url:?} carries a user, password, query or fragment: a URL is shown in errors and logs, so a credential goes in bearer_token_file or oauth"
        ));
    }
    match parsed.scheme() {
        "https" => Ok(()),
        "http" => {
            let host = parsed.host_str().unwrap_or_default();
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let loopback = host == "localhost"
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|a| a.is_loopback());
            if loopback {
                Ok(())
            } else {
                Err(format!(
                    "url {url:?}: a remote upstream is reached over https (plain http only on this host's loopback)"
                ))
            }
        }
        other => Err(format!("url {url:?}: scheme {other:?} is not https")),
    }
}

/// The HTTP client: TLS verified against the system's roots and the
/// declared CA, no redirect, no proxy from the environment.
fn http_client(server: &Server) -> Result<reqwest::Client, String> {
    // No request outlives the exchange (rmcp's worker does not watch its
    // cancellation while it starts a session).
    http_client_trusting(
        server.ca_file.as_deref(),
        Duration::from_secs(server.timeout_seconds.saturating_add(10)),
    )
}

/// The HTTP client trusting the system's roots and `ca_file`'s.
fn http_client_trusting(ca_file: Option<&str>, most: Duration) -> Result<reqwest::Client, String> {
    // The process's provider (ring, as the daemon installs it at start);
    // a no-op when one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut b = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .pool_max_idle_per_host(0)
        .connect_timeout(Duration::from_secs(10))
        .timeout(most);
    if let Some(ca) = ca_file {
        let pem = std::fs::read(ca).map_err(|e| format!("ca_file {ca}: {e}"))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("ca_file {ca}: {e}"))?;
        for c in certs {
            b = b.add_root_certificate(c);
        }
    }
    b.build().map_err(|e| format!("the HTTP client: {e}"))
}

/// The exchange `ex` (a listing, or a call made only when the tool's live
/// definition is the locked one) with the remote server `server`.
/// `token` is what the gateway presents to it, if anything.
pub async fn exchange(
    server: &Server,
    ex: &McpExchange,
    token: Option<&str>,
    progress: Option<OnProgress>,
) -> McpReport {
    let mut report = McpReport {
        max_bytes: ex.max_bytes,
        timeout_ms: ex.timeout_ms,
        ..McpReport::default()
    };
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stopped = Arc::new(Mutex::new(None));
    let abort = tokio_util::sync::CancellationToken::new();
    let mut session = None;
    let outcome = tokio::time::timeout(Duration::from_millis(ex.timeout_ms), async {
        tokio::select! {
            r = talk(
                server,
                ex,
                token,
                (
                    Watcher(
                        Arc::clone(&seen),
                        progress,
                        token
                            .map(|t| gateway_base::secret::SecretFile::new(t.as_bytes().to_vec()))
                            .into_iter()
                            .collect(),
                    ),
                    Arc::clone(&stopped),
                    abort.clone(),
                ),
                &mut report,
                &mut session,
            ) => r,
            _ = abort.cancelled() => Err(("protocol", String::new())),
        }
    })
    .await;
    let outcome = match (
        outcome,
        stopped.lock().unwrap_or_else(|p| p.into_inner()).take(),
    ) {
        (_, Some(why)) => Ok(Err(("protocol", why))),
        (o, None) => o,
    };
    // A session that ended well is closed (rmcp deletes it on the server),
    // outside the exchange's time and within a time of its own. One the
    // server would not let end is dropped: rmcp's tasks end in the
    // background, its worker with the transport ([`Bounded`]).
    if let Some(s) = session {
        if matches!(outcome, Ok(Ok(()))) {
            let _ = tokio::time::timeout(Duration::from_secs(2), s.cancel()).await;
        } else {
            drop(s);
        }
    }
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err((kind, why))) => {
            report.error_kind = Some(kind.into());
            report.error = Some(why);
        }
        Err(_) => {
            report.error_kind = Some("timeout".into());
            report.error = Some(format!(
                "the server did not finish within {} ms",
                ex.timeout_ms
            ));
        }
    }
    let s = seen.lock().unwrap_or_else(|p| p.into_inner());
    report.requests_refused = s.requests_refused;
    report.refused_methods = s.refused_methods.clone();
    report.notifications = s.notifications;
    report.progress = s.progress.clone();
    report.list_changed = s.list_changed;
    report
}

type Failed = (&'static str, String);

fn service_error(what: &str, e: rmcp::service::ServiceError) -> Failed {
    use rmcp::service::ServiceError as E;
    match e {
        E::McpError(err) => (
            "rpc_error",
            format!(
                "{what}: {}",
                err.message.chars().take(500).collect::<String>()
            ),
        ),
        other => {
            let text = other.to_string();
            let kind = if text.contains("exceeded the maximum size") || text.contains("too large") {
                "too_large"
            } else {
                "closed"
            };
            (
                kind,
                format!("{what}: {}", text.chars().take(500).collect::<String>()),
            )
        }
    }
}

type Session = rmcp::service::RunningService<RoleClient, Watcher>;

async fn talk(
    server: &Server,
    ex: &McpExchange,
    token: Option<&str>,
    (watcher, stopped, abort): (
        Watcher,
        Arc<Mutex<Option<String>>>,
        tokio_util::sync::CancellationToken,
    ),
    report: &mut McpReport,
    slot: &mut Option<Session>,
) -> Result<(), Failed> {
    let url = server.url.as_deref().unwrap_or_default();
    check_url(url).map_err(|e| ("protocol", e))?;
    let client = http_client(server).map_err(|e| ("closed", e))?;
    let cap = usize::try_from(ex.max_bytes).unwrap_or(usize::MAX);
    let mut config = StreamableHttpClientTransportConfig::with_uri(url);
    config.max_json_response_size = cap;
    config.max_sse_event_size = cap;
    // An error's body is the server's text: a little of it is enough.
    config.max_error_response_size = 512;
    if let Some(t) = token {
        config = config.auth_header(t.to_string());
    }
    let transport = Bounded {
        inner: Some(StreamableHttpClientTransport::with_client(client, config)),
        requests: 0,
        messages: 0,
        stopped,
        abort,
    };
    let session = slot.insert(watcher.serve(transport).await.map_err(|e| {
        (
            "closed",
            format!(
                "initialize: {}",
                e.to_string().chars().take(500).collect::<String>()
            ),
        )
    })?);
    {
        if let Some(info) = session.peer_info() {
            report.server = Some(serde_json::json!({
                "protocolVersion": info.protocol_version,
                "serverInfo": info.server_info,
            }));
        }
        // Every page, capped in pages and bytes.
        let mut tools: Vec<Value> = Vec::new();
        let mut bytes = 0usize;
        let mut cursor = None;
        for page in 0.. {
            if page == MAX_PAGES {
                return Err((
                    "protocol",
                    format!("tools/list has more than {MAX_PAGES} pages"),
                ));
            }
            let params = cursor.take().map(|c| {
                let mut p = PaginatedRequestParams::default();
                p.cursor = Some(c);
                p
            });
            let listed = session
                .list_tools(params)
                .await
                .map_err(|e| service_error("tools/list", e))?;
            for t in &listed.tools {
                let v = serde_json::to_value(t).unwrap_or(Value::Null);
                bytes = bytes.saturating_add(v.to_string().len());
                tools.push(v);
            }
            if bytes > cap {
                return Err((
                    "too_large",
                    format!("the tool list is more than {cap} bytes"),
                ));
            }
            match listed.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        let Some(call) = &ex.call else {
            report.tools = Some(tools);
            return Ok(());
        };
        let live = tools
            .into_iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some(call.name.as_str()));
        match live {
            None => {
                report.refused = Some(format!(
                    "the server no longer offers tool {:?}; nothing was called",
                    call.name
                ));
            }
            Some(live) if live != call.definition => {
                report.live_definition = Some(live);
                report.refused = Some(format!(
                    "tool {:?}'s definition is not the one locked (it changed on the server); nothing was called",
                    call.name
                ));
            }
            Some(_) => {
                let mut params = CallToolRequestParams::new(call.name.clone());
                if let Value::Object(args) = &call.arguments {
                    params = params.with_arguments(args.clone());
                }
                if call.progress_token.is_some() {
                    params.meta = Some(RequestMetaObject::with_progress_token(ProgressToken(
                        NumberOrString::String("gateway".into()),
                    )));
                }
                let result = session
                    .call_tool(params)
                    .await
                    .map_err(|e| service_error("tools/call", e))?;
                let value = serde_json::to_value(&result).unwrap_or(Value::Null);
                if value.to_string().len() > cap {
                    return Err(("too_large", format!("the result is more than {cap} bytes")));
                }
                report.result = Some(value);
            }
        }
        Ok(())
    }
}

/// `report` with `token` cut (also encoded) from everything it holds: a
/// server that echoes the token gives the agent nothing.
pub fn redacted(report: McpReport, token: Option<&str>) -> Result<McpReport, String> {
    let Some(t) = token else {
        return Ok(report);
    };
    // Each string (and key) of the report on its own: the report stays
    // JSON whatever the server put around the token.
    let secret = [gateway_base::secret::SecretFile::new(t.as_bytes().to_vec())];
    let mut v = serde_json::to_value(&report).map_err(|e| e.to_string())?;
    // The report's own field names stay; everything under them is cut.
    if let Value::Object(m) = &mut v {
        m.values_mut().for_each(|x| redact_strings(x, &secret));
    }
    serde_json::from_value(v).map_err(|e| format!("the server's answer, its token cut: {e}"))
}

fn redact_strings(v: &mut Value, secrets: &[gateway_base::secret::SecretFile]) {
    let cut = |s: &str| {
        let mut c = gateway_sandbox::Captured {
            bytes: s.as_bytes().to_vec(),
            truncated: false,
        };
        c.redact_all(secrets);
        String::from_utf8_lossy(&c.bytes).into_owned()
    };
    match v {
        Value::String(s) => *s = cut(s),
        Value::Array(a) => a.iter_mut().for_each(|x| redact_strings(x, secrets)),
        Value::Object(m) => {
            let old = std::mem::take(m);
            for (k, mut x) in old {
                redact_strings(&mut x, secrets);
                m.insert(cut(&k), x);
            }
        }
        _ => {}
    }
}

/// An exchange with no one to tell (a listing: lock, diff, the daemon's
/// readings): the token obtained, used, cut from the report, and a
/// granted one revoked.
pub async fn exchange_redacted(server: &Server, ex: &McpExchange) -> Result<McpReport, String> {
    let mut presented = Presented::obtain(server).await?;
    let report = exchange(server, ex, presented.token(), None).await;
    let report = redacted(report, presented.token());
    if let Err(e) = presented.revoke().await {
        tracing::warn!("revoking the token a listing was granted: {e}");
    }
    report
}

/// How the gateway obtains a token from an OAuth authorization server for
/// each exchange with a remote upstream: the client-credentials grant
/// (RFC 6749 §4.4) as the gateway's own client, revoked (RFC 7009) when
/// the exchange ends if the server has a revocation endpoint.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthClient {
    pub token_url: String,
    pub client_id: String,
    /// A root-owned file (closed to others) holding the client's secret.
    pub client_secret_file: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// PEM CAs the authorization server's TLS is also checked against
    /// (the upstream's `ca_file` is not: a CA trusted for the upstream is
    /// not trusted with the client's secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// The resource (RFC 8707) the token is for: the upstream's URL
    /// unless said otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revocation_url: Option<String>,
}

/// The token presented to a remote server for one exchange.
pub enum Presented {
    None,
    /// The operator's standing token (`bearer_token_file`).
    Standing(Zeroizing<String>),
    /// A token granted for this exchange.
    Granted(Box<Grant>),
}

/// A token granted for one exchange. Dropped before it was revoked (the
/// call was cancelled), it is revoked from a task.
pub struct Grant {
    token: Zeroizing<String>,
    /// Names the token in the audit: `oauth-` and the first 16 hex digits
    /// of its SHA-256 (not the token).
    pub id: String,
    pub expires_in: Option<u64>,
    /// Who granted it, to whom: where it is revoked.
    server: Server,
    revoked: bool,
}

impl Drop for Grant {
    fn drop(&mut self) {
        if self.revoked {
            return;
        }
        let Some(oauth) = self.server.oauth.clone() else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(token = %self.id, "a granted token could not be revoked (no runtime left): it lives until it expires");
            return;
        };
        tracing::warn!(token = %self.id, "the call ended before its granted token was revoked: revoking it now");
        let (token, id) = (self.token.clone(), self.id.clone());
        handle.spawn(async move {
            match revoke_at(&oauth, &token).await {
                Ok(_) => tracing::info!(token = %id, "revoked the token of a call that ended early"),
                Err(e) => tracing::warn!(token = %id, "revoking the token of a call that ended early: {e}"),
            }
        });
    }
}

/// Revoke `token` at `oauth`'s revocation endpoint (RFC 7009); `Ok(false)`:
/// it has none.
async fn revoke_at(oauth: &OAuthClient, token: &str) -> Result<bool, String> {
    let Some(url) = &oauth.revocation_url else {
        return Ok(false);
    };
    check_url(url).map_err(|e| format!("oauth revocation_url: {e}"))?;
    let secret = read_one_line(&oauth.client_secret_file, "oauth client_secret_file")?;
    let resp = http_client_trusting(oauth.ca_file.as_deref(), Duration::from_secs(15))?
        .post(url)
        .basic_auth(&oauth.client_id, Some(secret.as_str()))
        .form(&[("token", token), ("token_type_hint", "access_token")])
        .timeout(Duration::from_secs(15))
        .send()
        .await
        .map_err(|e| format!("revoking at {url}: {}", e.without_url()))?;
    let status = resp.status();
    if status.is_success() {
        return Ok(true);
    }
    let body = capped_body(resp, "the revocation's answer")
        .await
        .unwrap_or_default();
    let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    // The OAuth error code only: free text from the server could echo the
    // token, which is still live when its revocation failed.
    Err(format!(
        "revoking at {url}: {status} {}",
        gateway_base::text::escaped(
            &answer["error"]
                .as_str()
                .unwrap_or("")
                .chars()
                .take(64)
                .collect::<String>(),
            true
        )
    ))
}

/// What an OAuth endpoint may answer, at most.
const OAUTH_ANSWER_BYTES: usize = 64 * 1024;

async fn capped_body(mut resp: reqwest::Response, what: &str) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| format!("{what}: {e}"))? {
        if body.len() + chunk.len() > OAUTH_ANSWER_BYTES {
            return Err(format!(
                "{what}: the answer is more than {OAUTH_ANSWER_BYTES} bytes"
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

impl Presented {
    /// The token for `server`: granted now, read from its file, or none.
    pub async fn obtain(server: &Server) -> Result<Presented, String> {
        if let Some(t) = token(server)? {
            return Ok(Presented::Standing(t));
        }
        let Some(oauth) = &server.oauth else {
            return Ok(Presented::None);
        };
        check_url(&oauth.token_url).map_err(|e| format!("oauth token_url: {e}"))?;
        let secret = read_one_line(&oauth.client_secret_file, "oauth client_secret_file")?;
        let resource = oauth
            .resource
            .clone()
            .or_else(|| server.url.clone())
            .unwrap_or_default();
        let mut form: Vec<(&str, &str)> = vec![
            ("grant_type", "client_credentials"),
            ("resource", &resource),
        ];
        if let Some(scope) = &oauth.scope {
            form.push(("scope", scope));
        }
        let what = format!("the client-credentials grant at {}", oauth.token_url);
        let resp = http_client_trusting(oauth.ca_file.as_deref(), Duration::from_secs(15))?
            .post(&oauth.token_url)
            .basic_auth(&oauth.client_id, Some(secret.as_str()))
            .form(&form)
            .timeout(Duration::from_secs(15))
            .send()
            .await
            .map_err(|e| format!("{what}: {}", e.without_url()))?;
        let status = resp.status();
        let body = capped_body(resp, &what).await?;
        let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if !status.is_success() {
            return Err(format!(
                "{what}: {status} {}",
                gateway_base::text::escaped(
                    &answer["error"]
                        .as_str()
                        .unwrap_or("(no OAuth error)")
                        .chars()
                        .take(200)
                        .collect::<String>(),
                    true
                )
            ));
        }
        let token = answer["access_token"]
            .as_str()
            .filter(|t| {
                t.len() >= 8
                    && t.bytes()
                        .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
            })
            .ok_or_else(|| format!("{what}: no usable access_token in the answer"))?;
        let token = Zeroizing::new(token.to_string());
        let id = format!(
            "oauth-{}",
            &gateway_base::canonical::sha256_hex(token.as_bytes())[..16]
        );
        Ok(Presented::Granted(Box::new(Grant {
            token,
            id,
            expires_in: answer["expires_in"].as_u64(),
            server: server.clone(),
            revoked: false,
        })))
    }

    pub fn token(&self) -> Option<&str> {
        match self {
            Presented::None => None,
            Presented::Standing(t) => Some(t.as_str()),
            Presented::Granted(g) => Some(g.token.as_str()),
        }
    }

    /// Revoke a granted token (RFC 7009) when the authorization server
    /// has a revocation endpoint; `Ok(false)`: there was nothing to
    /// revoke, or nowhere to (it lives until it expires).
    pub async fn revoke(&mut self) -> Result<bool, String> {
        let Presented::Granted(g) = self else {
            return Ok(false);
        };
        let Some(oauth) = g.server.oauth.clone() else {
            return Ok(false);
        };
        // Tried a few times, whatever comes of it; not again on drop once
        // tried (a call dropped while trying leaves it to the drop).
        let mut last = Ok(false);
        for pause in [0u64, 200, 1000] {
            tokio::time::sleep(Duration::from_millis(pause)).await;
            last = revoke_at(&oauth, &g.token).await;
            if last.is_ok() {
                break;
            }
        }
        g.revoked = true;
        last
    }
}

/// Where this process may read a Secret volume's files besides its own
/// (the daemon's `[daemon] read_only_volumes`), set once at its start.
static SECRET_VOLUMES: std::sync::OnceLock<crate::config::store::SecretVolumes> =
    std::sync::OnceLock::new();

/// Read the upstreams' token and client-secret files as the daemon reads
/// its other secrets: a Kubernetes Secret volume (root's, group-readable)
/// on one of `volumes.read_only` is taken too.
pub fn use_secret_volumes(volumes: crate::config::store::SecretVolumes) {
    let _ = SECRET_VOLUMES.set(volumes);
}

fn secret_file(path: &str) -> Result<Zeroizing<String>, String> {
    let none = crate::config::store::SecretVolumes::default();
    crate::config::store::read_secret_file(
        std::path::Path::new(path),
        SECRET_VOLUMES.get().unwrap_or(&none),
    )
}

/// One line of a root-owned secret file (closed to others, no link).
fn read_one_line(path: &str, what: &str) -> Result<Zeroizing<String>, String> {
    let text = secret_file(path).map_err(|e| format!("{what} {path}: {e}"))?;
    let t = text.trim();
    if t.is_empty() || t.contains(['\n', '\r']) {
        return Err(format!("{what} {path}: must hold one line"));
    }
    Ok(Zeroizing::new(t.to_string()))
}

/// The bearer token the gateway presents to `server`, read from its
/// root-owned `bearer_token_file` (closed to others, no link followed).
pub fn token(server: &Server) -> Result<Option<Zeroizing<String>>, String> {
    let Some(path) = &server.bearer_token_file else {
        return Ok(None);
    };
    let text = secret_file(path).map_err(|e| format!("bearer_token_file {path}: {e}"))?;
    let t = text.trim();
    // Printable, without quotes or backslashes: so that it is found, and
    // cut, wherever the server puts it in a JSON answer.
    if t.len() < 8
        || !t
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
    {
        return Err(format!(
            "bearer_token_file {path}: must hold one token of at least 8 printable characters, without quotes or backslashes"
        ));
    }
    Ok(Some(Zeroizing::new(t.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_must_be_the_processs_own_closed_and_one_plain_token() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("gw-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let f = dir.join("token");
        let server = |path: &std::path::Path| Server {
            command: vec![],
            image: None,
            url: Some("https://mcp.example.com/mcp".into()),
            ca_file: None,
            bearer_token_file: Some(path.display().to_string()),
            oauth: None,
            env: Default::default(),
            read_only: vec![],
            writable: vec![],
            max_result_bytes: 1000,
            timeout_seconds: 5,
            egress: vec![],
            credential: None,
            warm: false,
        };
        let write = |text: &str, mode: u32| {
            let _ = std::fs::remove_file(&f);
            std::fs::write(&f, text).expect("write");
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).expect("chmod");
        };
        write("tok-0123456789abcdef\n", 0o600);
        assert_eq!(
            token(&server(&f))
                .expect("read")
                .as_deref()
                .map(|t| t.as_str()),
            Some("tok-0123456789abcdef")
        );
        write("tok-0123456789abcdef\n", 0o644);
        assert!(token(&server(&f)).is_err(), "a file others may read");
        for bad in ["short", "has \"quote\" in it", "two\nlines-of-token"] {
            write(bad, 0o600);
            assert!(token(&server(&f)).is_err(), "{bad:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn only_https_or_loopback_http_is_reached() {
        assert!(check_url("https://mcp.example.com/mcp").is_ok());
        assert!(check_url("http://127.0.0.1:8080/mcp").is_ok());
        assert!(check_url("http://[::1]:8080/mcp").is_ok());
        assert!(check_url("http://localhost/mcp").is_ok());
        assert!(check_url("http://mcp.example.com/mcp").is_err());
        assert!(check_url("http://10.0.0.1/mcp").is_err());
        assert!(check_url("ftp://127.0.0.1/x").is_err());
        assert!(check_url("https://user:pw@mcp.example.com/mcp").is_err());
        assert!(check_url("not a url").is_err());
    }
}
