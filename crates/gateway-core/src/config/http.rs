//! `[http]` and `[[http.issuers]]` of gateway.toml: the HTTP transport's
//! settings (gateway-server's http/ reads them; this is data only).

use std::path::PathBuf;

use serde::Deserialize;

/// Requests larger than this are refused (413) unless `[http]
/// max_request_bytes` says otherwise.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;
/// By default, at most this many refusals of one peer address are audited
/// one by one each minute; the rest are counted into the next one recorded.
pub const AUDITED_REFUSALS_PER_MINUTE: u32 = 30;

/// `[http]`: where and how the daemon serves remote MCP.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// `ADDRESS:PORT` to listen on.
    pub listen: String,
    /// This gateway's MCP endpoint as clients reach it, e.g.
    /// `https://gateway.example/mcp`: the resource identifier tokens must
    /// be issued for (their `aud`), and the path it is served at.
    pub resource: String,
    /// PEM certificate chain and key for TLS.
    #[serde(default)]
    pub tls_cert: Option<PathBuf>,
    #[serde(default)]
    pub tls_key: Option<PathBuf>,
    /// Serve plain HTTP (no TLS): only on a loopback address, for a TLS
    /// proxy in front of the gateway on the same host.
    #[serde(default)]
    pub plain_http: bool,
    /// `Host` values accepted (default: the resource's authority).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Browser `Origin`s accepted (`scheme://host:port`); a request with
    /// any other Origin is refused. Default: none (agents send no Origin).
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// The directory remote calls' `working_dir`s are resolved in (the
    /// team's modules, checked out on the gateway's host).
    pub workspace: PathBuf,
    /// Sessions for clients older than 2026-07-28 (their handshake);
    /// 2026-07-28 requests are stateless either way.
    #[serde(default = "yes")]
    pub legacy_sessions: bool,
    #[serde(default = "default_max_request_bytes")]
    pub max_request_bytes: usize,
    /// A name for the resource metadata's `resource_name`.
    #[serde(default)]
    pub resource_name: Option<String>,
    /// The OpenID providers whose access tokens are accepted.
    #[serde(default)]
    pub issuers: Vec<IssuerConfig>,
    /// Connections open at once, in all and from one address; more are
    /// closed at once.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    #[serde(default = "default_max_connections_per_address")]
    pub max_connections_per_address: usize,
    /// Refusals of one address audited one by one each minute; the rest
    /// are counted into the next one audited.
    #[serde(default = "default_audited_refusals")]
    pub audited_refusals_per_minute: u32,
    /// A file of at least 32 random bytes whose digest keys the approval
    /// page's session and CSRF tags, the same file for every replica (a
    /// Secret): a session opened on one replica then holds on the others.
    /// Without it each replica makes its own key at start.
    #[serde(default)]
    pub session_key_file: Option<PathBuf>,
    /// The whole of one request, headers and body, must arrive within this
    /// many seconds (answered 408 and closed past it). A streamed answer
    /// (a long call's progress) is not bounded by it.
    #[serde(default = "default_request_timeout")]
    pub request_timeout_seconds: u64,
    /// What one identity (one person's or agent's token, whatever address
    /// it comes from) may hold at once: connections it has authenticated
    /// on, requests in flight (a streamed answer counts until it ends) and
    /// legacy MCP sessions. Over any of them: 429 with `Retry-After`.
    #[serde(default = "default_connections_per_identity")]
    pub max_connections_per_identity: usize,
    #[serde(default = "default_requests_per_identity")]
    pub max_requests_per_identity: usize,
    #[serde(default = "default_sessions_per_identity")]
    pub max_sessions_per_identity: usize,
    /// Legacy sessions open at once, all identities together.
    #[serde(default = "default_max_sessions")]
    pub max_sessions: usize,
    /// A legacy session nobody used for this long is closed; one that
    /// never went past its handshake (`initialize`, `initialized`) is
    /// closed after `session_unused_seconds`. A session with a request or
    /// a stream open is never closed for idleness.
    #[serde(default = "default_session_idle")]
    pub session_idle_seconds: u64,
    #[serde(default = "default_session_unused")]
    pub session_unused_seconds: u64,
}

fn default_request_timeout() -> u64 {
    30
}
fn default_connections_per_identity() -> usize {
    32
}
fn default_requests_per_identity() -> usize {
    32
}
fn default_sessions_per_identity() -> usize {
    16
}
fn default_max_sessions() -> usize {
    // About 280 MiB of idle sessions at their measured 138 KiB each.
    2048
}
fn default_session_idle() -> u64 {
    300
}
fn default_session_unused() -> u64 {
    30
}

fn default_audited_refusals() -> u32 {
    AUDITED_REFUSALS_PER_MINUTE
}

fn default_max_connections() -> usize {
    1024
}
fn default_max_connections_per_address() -> usize {
    64
}

fn yes() -> bool {
    true
}
fn default_max_request_bytes() -> usize {
    DEFAULT_MAX_REQUEST_BYTES
}

/// `[[http.issuers]]`: one OpenID provider whose access tokens the gateway
/// accepts.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssuerConfig {
    /// The issuer identifier, exactly as its tokens' `iss` and its metadata
    /// say it (https://).
    pub issuer: String,
    /// The `aud` its tokens must carry (default: `[http] resource`).
    #[serde(default)]
    pub audience: Option<String>,
    /// Where its keys are (default: from its metadata).
    #[serde(default)]
    pub jwks_uri: Option<String>,
    /// A PEM file of CA certificates its HTTPS is checked against, besides
    /// the system's.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// The claim the policy knows the person by (`principal.user`).
    #[serde(default = "default_username_claim")]
    pub username_claim: String,
    /// The claim with the person's groups (a list of strings, or one
    /// string); a dotted path reaches into objects (`realm_access.roles`).
    #[serde(default = "default_groups_claim")]
    pub groups_claim: String,
    #[serde(default = "default_email_claim")]
    pub email_claim: String,
    /// Signature algorithms accepted (asymmetric only).
    #[serde(default = "default_algorithms")]
    pub algorithms: Vec<String>,
    /// Clock skew allowed on `exp` and `nbf`, at most 300 s.
    #[serde(default = "default_leeway")]
    pub leeway_seconds: u64,
    /// Scopes a token must carry (`scope` or `scp`); none by default.
    #[serde(default)]
    pub required_scopes: Vec<String>,
    /// Require the JWT access-token type (`typ: at+jwt`, RFC 9068), so
    /// that an ID token or another JWT of the issuer is never taken for
    /// one. Turn off only for a provider that types its access tokens
    /// otherwise (`JWT`).
    #[serde(default = "yes")]
    pub require_at_jwt: bool,
}

pub fn default_username_claim() -> String {
    "email".into()
}
pub fn default_groups_claim() -> String {
    "groups".into()
}
pub fn default_email_claim() -> String {
    "email".into()
}
pub fn default_algorithms() -> Vec<String> {
    ["RS256", "PS256", "ES256", "EdDSA"]
        .map(String::from)
        .to_vec()
}
pub fn default_leeway() -> u64 {
    60
}
