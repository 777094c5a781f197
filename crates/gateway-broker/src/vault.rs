//! The Vault/OpenBao broker (vaultrs): `{mount}/creds/{role}` with the
//! decision's params, revocation with `sys/leases/revoke/{lease}` and
//! `sync: true`, the gateway's own token renewed while it runs (token auth
//! or AppRole), and the lease ledger that lets the next start revoke what a
//! crash left behind.
//!
//! The gateway's Vault token and every minted secret stay in
//! [`secrecy`]-style wrappers: they print `<redacted>` and are zeroed on
//! drop; errors carry Vault's message and status, never a token.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustify::Endpoint;
use secrecy::ExposeSecret;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::RwLock;
use vaultrs::client::{Client, VaultClient, VaultClientSettingsBuilder};
use zeroize::Zeroizing;

use super::leases::{Ledger, LocalLedger};
use super::{BoxFuture, Broker, BrokerError, CredentialMeta, IssuedCredential};
use gateway_audit::audit::{AuditLog, Event};
use gateway_base::secret::SecretFile;
use gateway_policy::CredentialScope;

/// A string that must never be printed (a Vault token, a secret id):
/// secrecy's, as kube uses — Debug prints `[REDACTED]`, no Display, zeroed
/// on drop.
pub type Secret = secrecy::SecretString;

/// How the gateway authenticates to Vault.
#[derive(Debug, Clone)]
pub enum VaultAuth {
    /// A token (`VAULT_TOKEN`, or a token file).
    Token(Secret),
    /// AppRole: role id and secret id (the secret id from a file).
    AppRole {
        mount: String,
        role_id: String,
        secret_id: Secret,
    },
    /// Kubernetes auth, for a gateway running in a cluster: its service
    /// account token (re-read at every login: projected tokens rotate).
    Kubernetes {
        mount: String,
        role: String,
        jwt_file: PathBuf,
    },
}

/// Where Vault is and how to reach it.
#[derive(Debug, Clone)]
pub struct VaultSettings {
    pub address: String,
    pub namespace: Option<String>,
    /// PEM file of the CA that signed Vault's certificate.
    pub ca_cert: Option<PathBuf>,
    pub auth: VaultAuth,
    /// Per-request timeout.
    pub timeout: Duration,
}

#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
/// The `[vault]` table of gateway.toml. Environment variables
/// (`VAULT_ADDR`, `VAULT_TOKEN`, `VAULT_NAMESPACE`, `VAULT_CACERT`) override
/// the file, as the Vault CLI does.
pub struct VaultConfig {
    pub address: Option<String>,
    pub namespace: Option<String>,
    pub ca_cert: Option<PathBuf>,
    /// `token` (default), `approle` or `kubernetes`.
    pub auth: Option<String>,
    /// A file holding the token (instead of `VAULT_TOKEN`).
    pub token_file: Option<PathBuf>,
    #[serde(default)]
    pub approle: AppRoleConfig,
    #[serde(default)]
    pub kubernetes: KubernetesAuthConfig,
    /// Per-request timeout in seconds (default 10).
    pub timeout_seconds: Option<u64>,
    /// How many copies of each Kubernetes secrets engine mount `gateway
    /// vault setup --lanes` made (default 1): Kubernetes credentials are
    /// spread over them ([`super::lane_mount`]).
    pub lanes: Option<usize>,
}

impl VaultConfig {
    /// `lanes`, checked (1 to [`super::MAX_LANES`]).
    pub fn lanes(&self) -> Result<usize, VaultConfigError> {
        match self.lanes.unwrap_or(1) {
            n @ 1..=super::MAX_LANES => Ok(n),
            n => Err(VaultConfigError::Invalid(format!(
                "lanes = {n}: give 1 to {} (as many as `gateway vault setup --lanes` made)",
                super::MAX_LANES
            ))),
        }
    }
}

#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppRoleConfig {
    /// Auth mount (default `approle`).
    pub mount: Option<String>,
    pub role_id: Option<String>,
    /// File holding the secret id (never the secret id itself in the config).
    pub secret_id_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesAuthConfig {
    /// Auth mount (default `kubernetes`).
    pub mount: Option<String>,
    /// The Vault role bound to the gateway's service account (default `gateway`).
    pub role: Option<String>,
    /// The service account token (default: the in-cluster one).
    pub jwt_file: Option<PathBuf>,
}

/// Where a pod's service account token is.
pub const IN_CLUSTER_JWT: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

#[derive(Debug, thiserror::Error)]
pub enum VaultConfigError {
    #[error("vault: {0}")]
    Invalid(String),
    #[error("vault: cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|s| !s.is_empty())
}

fn read_secret_file(path: &Path) -> Result<Secret, VaultConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| VaultConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let s = Secret::from(text.trim());
    if s.expose_secret().is_empty() {
        return Err(VaultConfigError::Invalid(format!(
            "{} is empty",
            path.display()
        )));
    }
    Ok(s)
}

impl VaultConfig {
    /// The settings, or `None` when no Vault is configured at all (then the
    /// gateway has no broker and refuses calls that need a credential).
    pub fn resolve(&self) -> Result<Option<VaultSettings>, VaultConfigError> {
        self.resolve_with(env)
    }

    /// [`VaultConfig::resolve`] with the environment given as a lookup.
    pub fn resolve_with(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<VaultSettings>, VaultConfigError> {
        let Some(address) = env("VAULT_ADDR")
            .or_else(|| env("BAO_ADDR"))
            .or_else(|| self.address.clone())
        else {
            return Ok(None);
        };
        let namespace = env("VAULT_NAMESPACE").or_else(|| self.namespace.clone());
        let ca_cert = env("VAULT_CACERT")
            .map(PathBuf::from)
            .or_else(|| self.ca_cert.clone());
        let method = self.auth.clone().unwrap_or_else(|| "token".into());
        let auth = match method.as_str() {
            "token" => {
                let token = match env("VAULT_TOKEN").or_else(|| env("BAO_TOKEN")) {
                    Some(t) => Secret::from(t),
                    None => match &self.token_file {
                        Some(f) => read_secret_file(f)?,
                        None => {
                            return Err(VaultConfigError::Invalid(format!(
                                "Vault at {address} is configured with token auth but no token: set VAULT_TOKEN or vault.token_file"
                            )));
                        }
                    },
                };
                VaultAuth::Token(token)
            }
            "approle" => {
                let role_id = self.approle.role_id.clone().ok_or_else(|| {
                    VaultConfigError::Invalid("auth = \"approle\" needs approle.role_id".into())
                })?;
                let file = self.approle.secret_id_file.clone().ok_or_else(|| {
                    VaultConfigError::Invalid(
                        "auth = \"approle\" needs approle.secret_id_file".into(),
                    )
                })?;
                VaultAuth::AppRole {
                    mount: self
                        .approle
                        .mount
                        .clone()
                        .unwrap_or_else(|| "approle".into()),
                    role_id,
                    secret_id: read_secret_file(&file)?,
                }
            }
            "kubernetes" => {
                let jwt_file = self
                    .kubernetes
                    .jwt_file
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(IN_CLUSTER_JWT));
                // Readable now, or the configuration is wrong.
                read_secret_file(&jwt_file)?;
                VaultAuth::Kubernetes {
                    mount: self
                        .kubernetes
                        .mount
                        .clone()
                        .unwrap_or_else(|| "kubernetes".into()),
                    role: self
                        .kubernetes
                        .role
                        .clone()
                        .unwrap_or_else(|| "gateway".into()),
                    jwt_file,
                }
            }
            other => {
                return Err(VaultConfigError::Invalid(format!(
                    "unknown auth method {other:?} (token, approle or kubernetes)"
                )));
            }
        };
        Ok(Some(VaultSettings {
            address,
            namespace,
            ca_cert,
            auth,
            timeout: Duration::from_secs(self.timeout_seconds.unwrap_or(10)),
        }))
    }
}

/// Any Vault API call: method, path under /v1, JSON body.
struct VaultCall {
    method: rustify::enums::RequestMethod,
    path: String,
    body: Option<Value>,
}

impl Endpoint for VaultCall {
    type Response = Value;
    const REQUEST_BODY_TYPE: rustify::enums::RequestType = rustify::enums::RequestType::JSON;
    const RESPONSE_BODY_TYPE: rustify::enums::ResponseType = rustify::enums::ResponseType::JSON;

    fn path(&self) -> String {
        self.path.clone()
    }
    fn method(&self) -> rustify::enums::RequestMethod {
        self.method.clone()
    }
    fn body(&self) -> Result<Option<Vec<u8>>, rustify::errors::ClientError> {
        Ok(self.body.as_ref().map(|b| b.to_string().into_bytes()))
    }
}

/// Vault's answer to a secret request (the parts the broker reads).
#[derive(Deserialize)]
struct SecretResponse {
    #[serde(default)]
    lease_id: String,
    #[serde(default)]
    lease_duration: u64,
    #[serde(default)]
    data: Option<serde_json::Map<String, Value>>,
}

/// What went wrong talking to Vault, as the call's refusal says it.
fn vault_error(e: rustify::errors::ClientError, what: &str) -> BrokerError {
    use rustify::errors::ClientError as E;
    match e {
        E::ServerResponseError { code, content } => {
            let errors: Vec<String> = content
                .as_deref()
                .and_then(|c| serde_json::from_str::<Value>(c).ok())
                .and_then(|v| v.get("errors").cloned())
                .and_then(|v| serde_json::from_value(v).ok())
                .unwrap_or_default();
            let detail = errors.join("; ");
            let msg = match code {
                403 => format!("{what}: permission denied by Vault ({detail})"),
                503 => format!("{what}: Vault is sealed or unavailable ({detail})"),
                404 => format!("{what}: not found in Vault ({detail})"),
                _ => format!("{what}: Vault answered {code} ({detail})"),
            };
            BrokerError::Refused(msg)
        }
        E::RequestError { source, url, .. } => BrokerError::Unreachable(format!(
            "{what}: Vault at {url} is unreachable: {}",
            gateway_base::error_chain(source.as_ref())
        )),
        other => BrokerError::Unreachable(format!("{what}: {}", gateway_base::error_chain(&other))),
    }
}

/// Revoke `client`'s own token (`auth/token/revoke-self`); `what` names
/// the step in an error.
async fn revoke_self(client: &VaultClient, what: &str) -> Result<(), BrokerError> {
    call(
        client,
        rustify::enums::RequestMethod::POST,
        "auth/token/revoke-self",
        None,
        what,
    )
    .await
    .map(|_| ())
}

/// One Vault API call (`/v1/{path}`) with `client`'s token and namespace;
/// `Ok(None)` for an empty (204) answer.
pub async fn call(
    client: &VaultClient,
    method: rustify::enums::RequestMethod,
    path: &str,
    body: Option<Value>,
    what: &str,
) -> Result<Option<Value>, BrokerError> {
    let call = VaultCall {
        method,
        // vaultrs's middleware adds the API version prefix (/v1).
        path: path.trim_start_matches('/').to_string(),
        body,
    };
    let resp = call
        .with_middleware(client.middle())
        .exec(client.http())
        .await
        .map_err(|e| vault_error(e, what))?;
    let raw = resp.raw();
    if raw.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice(&raw)
        .map(Some)
        .map_err(|e| BrokerError::Refused(format!("{what}: Vault's answer is not JSON: {e}")))
}

/// A vaultrs client for `settings` (token auth uses the token; AppRole
/// starts without one and logs in on first use).
pub fn client_for(settings: &VaultSettings) -> Result<VaultClient, BrokerError> {
    let mut b = VaultClientSettingsBuilder::default();
    b.address(settings.address.as_str())
        .timeout(Some(settings.timeout))
        .namespace(settings.namespace.clone());
    if let Some(ca) = &settings.ca_cert {
        b.ca_certs(vec![ca.display().to_string()]);
    }
    match &settings.auth {
        VaultAuth::Token(t) => b.token(t.expose_secret()),
        VaultAuth::AppRole { .. } | VaultAuth::Kubernetes { .. } => b.token(""),
    };
    let client_settings = b
        .build()
        .map_err(|e| BrokerError::Refused(format!("Vault settings: {e}")))?;
    VaultClient::new(client_settings)
        .map_err(|e| BrokerError::Refused(format!("Vault client: {e}")))
}

/// What [`VaultBroker::check_lanes`] found wrong.
#[derive(Debug, thiserror::Error)]
pub enum LaneCheck {
    /// A lane the gateway would mint on is not there to mint on.
    #[error("{0}")]
    Missing(String),
    /// Vault could not say (unreachable, sealed, the token refused).
    #[error("the lanes could not be checked: {0}")]
    Unknown(BrokerError),
}

pub struct VaultBroker {
    settings: VaultSettings,
    client: RwLock<VaultClient>,
    /// When the gateway's own token needs renewing (None: not renewable,
    /// or not logged in yet).
    token_ttl: Mutex<Option<(Duration, bool)>>,
    ledger: Arc<dyn Ledger>,
    lanes: Lanes,
    /// Its login token was revoked ([`VaultBroker::revoke_login`]): it
    /// logs in no more (a renewal or an orphan revocation still running
    /// would otherwise leave a new live token behind).
    closed: std::sync::atomic::AtomicBool,
}

/// Why a broker whose login was revoked does not log in again.
const STOPPED: &str =
    "the gateway is stopping: its Vault login was revoked, and it logs in no more";

/// The lanes of each Kubernetes secrets engine mount: each credential is
/// minted on a free lane, trying them in turn from the next, and at most
/// [`ISSUING_PER_LANE`] at a time on one lane (more would only queue in
/// OpenBao's rate limiter for that mount, until its requests time out).
#[derive(Debug)]
struct Lanes {
    count: usize,
    /// The next lane of each mount, and each lane's gate.
    mounts: Mutex<BTreeMap<String, (usize, Vec<Lane>)>>,
}

/// A lane's mount and the gate of what is minted on it at once.
type Lane = (String, Arc<tokio::sync::Semaphore>);

/// Credentials minted at once on one lane.
const ISSUING_PER_LANE: usize = 2;

impl Lanes {
    fn new(count: usize) -> Lanes {
        Lanes {
            count: count.clamp(1, super::MAX_LANES),
            mounts: Default::default(),
        }
    }

    /// A lane of `mount` to mint on, and the permit to: a free one from
    /// the next in turn, else the next one's when it frees.
    async fn acquire(
        &self,
        mount: &str,
    ) -> Result<(String, tokio::sync::OwnedSemaphorePermit), BrokerError> {
        let (start, lanes) = {
            let mut mounts = self.mounts.lock().unwrap_or_else(|p| p.into_inner());
            let (next, lanes) = mounts.entry(mount.to_string()).or_insert_with(|| {
                (
                    0,
                    (0..self.count)
                        .map(|lane| {
                            (
                                super::lane_mount(mount, lane),
                                Arc::new(tokio::sync::Semaphore::new(ISSUING_PER_LANE)),
                            )
                        })
                        .collect(),
                )
            });
            let start = *next;
            *next = (start + 1) % self.count;
            (start, lanes.clone())
        };
        for k in 0..lanes.len() {
            let (lane, gate) = &lanes[(start + k) % lanes.len()];
            if let Ok(permit) = Arc::clone(gate).try_acquire_owned() {
                return Ok((lane.clone(), permit));
            }
        }
        let (lane, gate) = &lanes[start];
        let permit = Arc::clone(gate)
            .acquire_owned()
            .await
            .map_err(|_| BrokerError::Unreachable("the broker is shutting down".into()))?;
        Ok((lane.clone(), permit))
    }
}

impl std::fmt::Debug for VaultBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VaultBroker")
            .field("address", &self.settings.address)
            .field("namespace", &self.settings.namespace)
            .finish_non_exhaustive()
    }
}

impl VaultBroker {
    /// A broker for `settings` keeping its lease ledger in `home`. Does not
    /// contact Vault (a Vault that is down at start refuses calls, it does
    /// not stop the gateway).
    pub fn new(settings: VaultSettings, home: &Path) -> Result<VaultBroker, BrokerError> {
        let ledger =
            LocalLedger::in_home(home).map_err(|e| BrokerError::Refused(format!("{e}")))?;
        VaultBroker::with_ledger(settings, Arc::new(ledger))
    }

    /// A broker for `settings` keeping its leases in `ledger` (the
    /// replicas' shared one).
    pub fn with_ledger(
        settings: VaultSettings,
        ledger: Arc<dyn Ledger>,
    ) -> Result<VaultBroker, BrokerError> {
        let client = client_for(&settings)?;
        Ok(VaultBroker {
            settings,
            client: RwLock::new(client),
            token_ttl: Mutex::new(None),
            ledger,
            lanes: Lanes::new(1),
            closed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Spread Kubernetes credentials over `count` lanes of each mount (as
    /// many as `gateway vault setup --lanes` made).
    pub fn with_lanes(mut self, count: usize) -> VaultBroker {
        self.lanes = Lanes::new(count);
        self
    }

    /// The ledger this broker records its leases in.
    pub fn ledger(&self) -> &Arc<dyn Ledger> {
        &self.ledger
    }

    pub fn address(&self) -> &str {
        &self.settings.address
    }

    async fn call(
        &self,
        method: rustify::enums::RequestMethod,
        path: &str,
        body: Option<Value>,
        what: &str,
    ) -> Result<Option<Value>, BrokerError> {
        self.ensure_login().await?;
        let client = self.client.read().await;
        call(&client, method, path, body, what).await
    }

    /// Log in (AppRole or Kubernetes auth) when there is no token yet.
    async fn ensure_login(&self) -> Result<(), BrokerError> {
        if matches!(self.settings.auth, VaultAuth::Token(_))
            || !self.client.read().await.settings.token.is_empty()
        {
            return Ok(());
        }
        let mut client = self.client.write().await;
        if !client.settings.token.is_empty() {
            return Ok(());
        }
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(BrokerError::Refused(STOPPED.into()));
        }
        if let Some((token, ttl)) = self.login_on(&client).await? {
            client.set_token(&token);
            self.set_token_ttl(ttl);
        }
        Ok(())
    }

    fn set_token_ttl(&self, ttl: (Duration, bool)) {
        if let Ok(mut t) = self.token_ttl.lock() {
            *t = Some(ttl);
        }
    }

    /// Log in with `client` (AppRole or Kubernetes auth): the new token,
    /// its TTL and whether it is renewable. `None` for token auth.
    #[allow(clippy::type_complexity)]
    async fn login_on(
        &self,
        client: &VaultClient,
    ) -> Result<Option<(Zeroizing<String>, (Duration, bool))>, BrokerError> {
        let (method, mount, result) = match &self.settings.auth {
            VaultAuth::Token(_) => return Ok(None),
            VaultAuth::AppRole {
                mount,
                role_id,
                secret_id,
            } => (
                "AppRole",
                mount,
                vaultrs::auth::approle::login(client, mount, role_id, secret_id.expose_secret())
                    .await,
            ),
            VaultAuth::Kubernetes {
                mount,
                role,
                jwt_file,
            } => {
                let jwt =
                    read_secret_file(jwt_file).map_err(|e| BrokerError::Refused(e.to_string()))?;
                (
                    "Kubernetes",
                    mount,
                    vaultrs::auth::kubernetes::login(client, mount, role, jwt.expose_secret())
                        .await,
                )
            }
        };
        let info = result.map_err(|e| login_error(e, method, mount))?;
        tracing::info!(mount = %mount, ttl = info.lease_duration, "logged in to Vault with {method} auth");
        let ttl = (Duration::from_secs(info.lease_duration), info.renewable);
        Ok(Some((Zeroizing::new(info.client_token), ttl)))
    }

    /// Revoke the token this gateway logged in for (AppRole or Kubernetes
    /// auth), when it holds one, and log in no more after: a daemon that refuses to start leaves no
    /// live Vault token behind it (one a start retried by its service
    /// manager would leave at every try). A token given to the gateway
    /// (`auth = "token"`) is the operator's and is never revoked. Vault
    /// revokes a token's leases with it: call this only before any
    /// credential was minted with the token. `Ok(false)`: there was none.
    pub async fn revoke_login(&self) -> Result<bool, BrokerError> {
        if matches!(self.settings.auth, VaultAuth::Token(_)) {
            return Ok(false);
        }
        let mut client = self.client.write().await;
        // No login after this one (under the lock a login takes).
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        if client.settings.token.is_empty() {
            return Ok(false);
        }
        revoke_self(&client, "revoking the gateway's own Vault login token").await?;
        // Nothing uses it again (and `closed` keeps a new one from coming).
        client.set_token("");
        Ok(true)
    }

    /// Look up the gateway's own token: checks that Vault is reachable,
    /// unsealed and the token valid. Returns (ttl, renewable).
    pub async fn check(&self) -> Result<(Duration, bool), BrokerError> {
        let v = self
            .call(
                rustify::enums::RequestMethod::GET,
                "auth/token/lookup-self",
                None,
                "checking the gateway's Vault token",
            )
            .await?
            .unwrap_or(Value::Null);
        let ttl = v["data"]["ttl"].as_u64().unwrap_or(0);
        let renewable = v["data"]["renewable"].as_bool().unwrap_or(false);
        if let Ok(mut t) = self.token_ttl.lock() {
            *t = Some((Duration::from_secs(ttl), renewable));
        }
        Ok((Duration::from_secs(ttl), renewable))
    }

    /// Check that every lane past the first of each Kubernetes secrets
    /// engine mount in `roles` (mount → the roles on it) is one this
    /// gateway can mint on: a mount of the `kubernetes` engine at exactly
    /// that path (OpenBao's and Vault's `sys/internal/ui/mounts/<path>`,
    /// which any token may ask of a mount it holds a grant under), where
    /// its token may `update` the `creds/` of every role it may on the
    /// first lane (`sys/capabilities-self`). Each lane `gateway vault setup
    /// --lanes N` made is; a `[vault] lanes` larger than that is refused
    /// here, at the start, rather than at the first call that lands on the
    /// missing lane. What is not set up on the first lane (the mount
    /// itself) either is no matter of lanes: it is returned as notes to
    /// log, and the calls that need it are refused when they come, as with
    /// one lane. With one lane nothing is asked.
    pub async fn check_lanes(
        &self,
        roles: &BTreeMap<String, std::collections::BTreeSet<String>>,
    ) -> Result<Vec<String>, LaneCheck> {
        let mut notes = Vec::new();
        if self.lanes.count < 2 || roles.is_empty() {
            return Ok(notes);
        }
        self.check().await.map_err(LaneCheck::Unknown)?;
        for (mount, names) in roles {
            let mount = mount.trim_matches('/');
            if let Err(why) = self.kubernetes_mount(mount).await? {
                notes.push(format!(
                    "the mount {mount} {why}: calls needing its roles are refused"
                ));
                continue;
            }
            let on_first = self.mintable(mount, names).await?;
            for r in names.difference(&on_first) {
                notes.push(format!(
                    "the gateway's Vault token may not mint {mount}/creds/{r}: calls needing that role are refused (`gateway vault setup` defines every role of vault_roles)"
                ));
            }
            if on_first.is_empty() {
                continue;
            }
            for lane in 1..self.lanes.count {
                let path = super::lane_mount(mount, lane);
                let missing = |why: String| {
                    LaneCheck::Missing(format!(
                        "[vault] lanes = {} but lane {} of the mount {mount}, {path}, {why}: `gateway vault setup --lanes {}` makes every lane (and the gateway's Vault policy for them); or give [vault] lanes as many as it made",
                        self.lanes.count,
                        lane + 1,
                        self.lanes.count
                    ))
                };
                if let Err(why) = self.kubernetes_mount(&path).await? {
                    return Err(missing(why));
                }
                let on_lane = self.mintable(&path, &on_first).await?;
                if let Some(r) = on_first.difference(&on_lane).next() {
                    return Err(missing(format!(
                        "does not let the gateway's token mint {path}/creds/{r}, which it may mint on {mount}"
                    )));
                }
            }
        }
        Ok(notes)
    }

    /// Whether `path` is a mount of the Kubernetes secrets engine, at
    /// exactly that path, that the token holds a grant under (`Err`: why
    /// not); [`LaneCheck::Unknown`] when Vault's answer does not say.
    async fn kubernetes_mount(&self, path: &str) -> Result<Result<(), String>, LaneCheck> {
        let found = match self
            .call(
                rustify::enums::RequestMethod::GET,
                &format!("sys/internal/ui/mounts/{path}"),
                None,
                &format!("looking up the mount {path}"),
            )
            .await
        {
            Ok(v) => v.unwrap_or(Value::Null),
            // Vault's answer for a path with no mount, or none the token
            // holds a grant under. Any other refusal (a proxy's, a token
            // that just expired) says nothing of the mount.
            Err(BrokerError::Refused(m)) if m.contains("preflight capability check") => {
                return Ok(Err(
                    "is not a mount this gateway's Vault token may mint on".into()
                ));
            }
            Err(e) => return Err(LaneCheck::Unknown(e)),
        };
        let (Some(at), Some(kind)) = (
            found["data"]["path"].as_str(),
            found["data"]["type"].as_str(),
        ) else {
            return Err(LaneCheck::Unknown(BrokerError::Refused(format!(
                "looking up the mount {path}: the answer names no mount path and type"
            ))));
        };
        // The mount that holds the path: this one, not one above it.
        let at = at.trim_matches('/');
        if at != path && !at.ends_with(&format!("/{path}")) {
            return Ok(Err(format!("is not a mount (the path is under {at:?})")));
        }
        if kind != "kubernetes" {
            return Ok(Err(format!(
                "is a mount of the {kind:?} engine, not the Kubernetes secrets engine"
            )));
        }
        Ok(Ok(()))
    }

    /// The roles of `roles` whose `creds/` on the mount `path` the token
    /// may `update` (mint).
    async fn mintable(
        &self,
        path: &str,
        roles: &std::collections::BTreeSet<String>,
    ) -> Result<std::collections::BTreeSet<String>, LaneCheck> {
        let paths: Vec<String> = roles
            .iter()
            .map(|r| format!("{path}/creds/{}", r.trim_matches('/')))
            .collect();
        let caps = self
            .call(
                rustify::enums::RequestMethod::POST,
                "sys/capabilities-self",
                Some(serde_json::json!({ "paths": paths })),
                &format!("asking what the gateway's token may do on {path}"),
            )
            .await
            .map_err(LaneCheck::Unknown)?
            .unwrap_or(Value::Null);
        Ok(roles
            .iter()
            .zip(&paths)
            .filter(|(_, p)| {
                caps["data"][p.as_str()]
                    .as_array()
                    .or_else(|| caps[p.as_str()].as_array())
                    // `sudo` adds to a grant; it is none by itself.
                    .is_some_and(|c| c.iter().any(|c| c == "update" || c == "root"))
            })
            .map(|(r, _)| r.clone())
            .collect())
    }

    /// Renew the gateway's own token once (or log in again with AppRole
    /// when it cannot be renewed). Returns the new TTL.
    pub async fn renew_once(&self) -> Result<Duration, BrokerError> {
        let renewed = self
            .call(
                rustify::enums::RequestMethod::POST,
                "auth/token/renew-self",
                Some(json!({})),
                "renewing the gateway's Vault token",
            )
            .await;
        match renewed {
            Ok(v) => {
                let v = v.unwrap_or(Value::Null);
                let ttl = v["auth"]["lease_duration"].as_u64().unwrap_or(0);
                let renewable = v["auth"]["renewable"].as_bool().unwrap_or(false);
                if let Ok(mut t) = self.token_ttl.lock() {
                    *t = Some((Duration::from_secs(ttl), renewable));
                }
                Ok(Duration::from_secs(ttl))
            }
            Err(e) if !matches!(self.settings.auth, VaultAuth::Token(_)) => {
                tracing::warn!("renewing the Vault token failed ({e}); logging in again");
                self.login_again().await.map(|(ttl, _)| ttl)
            }
            Err(e) => Err(e),
        }
    }

    /// Keep the gateway's own token alive while the process runs: renew at
    /// half its TTL (a root or non-expiring token needs nothing). A token
    /// from a login (Kubernetes auth, AppRole) that cannot be renewed, or
    /// whose renewal no longer gives it the TTL it had (its role's
    /// `token_max_ttl` is near), is replaced by logging in again at half
    /// its TTL: a pod's gateway never runs on an expired token, and the
    /// token it leaves outlives the credentials it minted by half a TTL.
    pub fn spawn_renewal(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let this = Arc::clone(self);
        let logs_in = !matches!(this.settings.auth, VaultAuth::Token(_));
        tokio::spawn(async move {
            let (mut ttl, mut renewable) = match this.check().await {
                Ok((ttl, _)) if ttl.is_zero() => {
                    tracing::info!("the gateway's Vault token does not expire; no renewal needed");
                    return;
                }
                Ok((ttl, false)) if !logs_in => {
                    tracing::warn!(
                        ttl_seconds = ttl.as_secs(),
                        "the gateway's Vault token is not renewable; calls will be refused once it expires"
                    );
                    return;
                }
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!(
                        "Vault is not usable now ({e}); calls needing a credential are refused until it is"
                    );
                    (Duration::ZERO, !logs_in)
                }
            };
            // The TTL a fresh token gets: a renewal giving much less means
            // the token is near its maximum.
            let mut full = ttl;
            loop {
                let wait = match (ttl.is_zero(), renewable) {
                    (true, _) => Duration::from_secs(30),
                    (false, true) => ttl / 2,
                    (false, false) => ttl / 2,
                };
                tokio::time::sleep(wait.max(Duration::from_secs(1))).await;
                let next = if renewable {
                    this.renew_once().await.map(|t| (t, true))
                } else {
                    this.login_again().await
                };
                match next {
                    Ok((t, _)) if t.is_zero() => return,
                    Ok((t, was_renewal)) => {
                        tracing::debug!(
                            ttl_seconds = t.as_secs(),
                            "renewed the gateway's Vault token"
                        );
                        if !was_renewal || t > full {
                            full = t;
                        }
                        ttl = t;
                        let token_renewable = this
                            .token_ttl
                            .lock()
                            .ok()
                            .and_then(|t| *t)
                            .is_some_and(|t| t.1);
                        renewable = if logs_in {
                            token_renewable && t * 2 > full
                        } else {
                            true
                        };
                    }
                    Err(e) => {
                        tracing::warn!("renewing the gateway's Vault token failed: {e}");
                        ttl = Duration::ZERO;
                        renewable = !logs_in;
                    }
                }
            }
        })
    }

    /// Log in again (Kubernetes auth, AppRole) for a fresh token, on a
    /// client of its own: the token in use stays in use until the new one
    /// exists (a failed login leaves it), then is left to run out (revoking
    /// it would revoke the credentials it minted). Returns the new token's
    /// TTL, and `false` (not a renewal).
    async fn login_again(&self) -> Result<(Duration, bool), BrokerError> {
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(BrokerError::Refused(STOPPED.into()));
        }
        let mut fresh = client_for(&self.settings)?;
        let Some((token, ttl)) = self.login_on(&fresh).await? else {
            return Ok((Duration::ZERO, false));
        };
        {
            // The TTL is the new token's, recorded with the swap (a check
            // of the old token meanwhile cannot overwrite it after).
            let mut client = self.client.write().await;
            if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
                // Revoked while this login ran: the new token goes too.
                drop(client);
                fresh.set_token(&token);
                revoke_self(
                    &fresh,
                    "revoking a Vault login token got as the gateway stopped",
                )
                .await?;
                return Err(BrokerError::Refused(STOPPED.into()));
            }
            client.set_token(&token);
            self.set_token_ttl(ttl);
        }
        tracing::info!(
            ttl_seconds = ttl.0.as_secs(),
            "logged in to Vault again for a fresh token"
        );
        Ok((ttl.0, false))
    }

    /// Revoke every lease a crashed gateway left open (owner gone), with the
    /// audit saying so. Returns (revoked, still open).
    pub async fn recover_orphans(&self, audit: &AuditLog) -> (usize, usize) {
        // Taken over earlier, and not revoked then (Vault was away): tried
        // again, their failure already audited.
        let retry = self.ledger.claimed_unrevoked().unwrap_or_else(|e| {
            tracing::error!("reading the lease ledger: {e}");
            Vec::new()
        });
        let orphans = match self.ledger.claim_orphans() {
            Ok(o) => o,
            Err(e) => {
                tracing::error!("reading the lease ledger: {e}");
                return (0, 0);
            }
        };
        // A call whose owner never tried to revoke its leases was cut off
        // mid-way, and never recorded its end: it is recorded for it (once,
        // after its credentials). One whose owner tried (its call ended,
        // the revocation failed) has its end already.
        let mut calls: Vec<(String, Option<String>)> = orphans
            .iter()
            .filter(|l| {
                orphans
                    .iter()
                    .filter(|o| o.request_id == l.request_id)
                    .all(|o| o.revoke_attempts == 0)
            })
            .map(|l| (l.request_id.clone(), l.owner_replica.clone()))
            .collect();
        calls.sort();
        calls.dedup_by(|a, b| a.0 == b.0);
        let reason = "left open by a gateway that stopped before revoking it";
        let (mut done, mut left) = self.revoke_records(audit, orphans, reason, true).await;
        let (again, still) = self.revoke_records(audit, retry, reason, false).await;
        done += again;
        left += still;
        for (rid, replica) in calls {
            let reason = match replica {
                Some(r) => format!(
                    "the replica running this call ({r}) stopped before it ended; another replica revoked its credential. What the call did before it stopped is unknown: look before calling again"
                ),
                None => "the gateway running this call stopped before it ended; its credential was revoked at the next start. What the call did before it stopped is unknown: look before calling again".into(),
            };
            let _ = audit.record(
                &rid,
                Event::ToolResult(json!({"status": "interrupted", "reason": reason})),
            );
        }
        if done + left > 0 {
            tracing::warn!(
                revoked = done,
                still_open = left,
                "revoked leases a previous gateway left open"
            );
        }
        (done, left)
    }

    /// Look for the leases of replicas that died every
    /// [`Ledger::watch_every`] (a shared ledger), and revoke them.
    pub fn spawn_orphan_watch(self: &Arc<Self>, audit: Arc<AuditLog>) {
        let Some(every) = self.ledger.watch_every() else {
            return;
        };
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                me.recover_orphans(&audit).await;
            }
        });
    }

    /// At shutdown: revoke every lease this process still holds (calls
    /// cancelled as the daemon stops, whose own revocation was started in
    /// the background and would die with the runtime). Returns (revoked,
    /// still open); what is left stays in the ledger for the next start.
    pub async fn revoke_own(&self, audit: &AuditLog) -> (usize, usize) {
        let own = match self.ledger.own() {
            Ok(o) => o,
            Err(e) => {
                tracing::error!("reading the lease ledger: {e}");
                return (0, 0);
            }
        };
        self.revoke_records(
            audit,
            own,
            "the gateway stopped while its call held it",
            true,
        )
        .await
    }

    /// [`VaultBroker::revoke_own`], given until `deadline`. Each lease not
    /// revoked by then gets a `credential.revoke_failed` saying that it
    /// stays in the ledger for the next start.
    pub async fn revoke_own_by(
        &self,
        audit: &AuditLog,
        deadline: tokio::time::Instant,
    ) -> (usize, usize) {
        // The dropped calls' own revocations first (each retries and marks
        // the ledger), then whatever they did not get to.
        let own = async {
            crate::abort_revocations_done().await;
            self.revoke_own(audit).await
        };
        if let Ok(counts) = tokio::time::timeout_at(deadline, own).await {
            return counts;
        }
        let left: Vec<_> = self.ledger.own().unwrap_or_default();
        for lease in &left {
            let _ = audit.record(
                &lease.request_id,
                Event::CredentialRevokeFailed {
                    lease_id: lease.lease_id.clone(),
                    error: format!(
                        "not revoked within the daemon's shutdown grace; it stays in the lease ledger and {}",
                        if self.ledger.watch_every().is_some() {
                            "a surviving replica revokes it once this one is gone"
                        } else {
                            "the next start revokes it"
                        }
                    ),
                    attempt: None,
                    of: None,
                    recovered: None,
                    expires_at: None,
                },
            );
        }
        (0, left.len())
    }

    async fn revoke_records(
        &self,
        audit: &AuditLog,
        leases: Vec<crate::leases::LeaseRecord>,
        reason: &str,
        report_failures: bool,
    ) -> (usize, usize) {
        // Who revokes what is left: a survivor (a replica stopping), this
        // replica again (one it took over), or the next start (one host).
        let then = match (
            self.ledger.watch_every().is_some(),
            reason.starts_with("the gateway stopped"),
        ) {
            (true, true) => "a surviving replica revokes it once this one is gone",
            (true, false) => "this replica tries again every few seconds",
            (false, _) => "the next start revokes it",
        };
        let (mut done, mut left) = (0, 0);
        for lease in leases {
            if self.ledger.is_revoked(&lease.lease_id).ok().flatten() == Some(true) {
                continue;
            }
            match self.revoke_lease(&lease.lease_id).await {
                Ok(()) => {
                    done += 1;
                    let _ = audit.record(
                        &lease.request_id,
                        Event::CredentialRevoked {
                            lease_id: lease.lease_id.clone(),
                            attempt: None,
                            recovered: Some(true),
                            reason: Some(reason.into()),
                            issued_at: Some(json!(lease.issued_at)),
                            owner_pid: lease
                                .owner_replica
                                .is_none()
                                .then(|| json!(lease.owner_pid)),
                            owner_replica: lease.owner_replica.clone(),
                        },
                    );
                }
                Err(_) if !report_failures => left += 1,
                Err(e) => {
                    left += 1;
                    let _ = audit.record(
                        &lease.request_id,
                        Event::CredentialRevokeFailed {
                            lease_id: lease.lease_id.clone(),
                            error: format!("{e}; it stays in the lease ledger and {then}"),
                            attempt: None,
                            of: None,
                            recovered: Some(true),
                            expires_at: Some(json!(lease.expires_at)),
                        },
                    );
                }
            }
        }
        (done, left)
    }

    async fn revoke_lease(&self, lease_id: &str) -> Result<(), BrokerError> {
        // The path form lets Vault's ACL limit the gateway to its own roles'
        // leases (sys/leases/revoke/MOUNT/creds/ROLE/*).
        let result = self
            .call(
                rustify::enums::RequestMethod::PUT,
                &format!("sys/leases/revoke/{lease_id}"),
                Some(json!({"sync": true})),
                "revoking the lease",
            )
            .await
            .map(|_| ());
        let recorded = match &result {
            Ok(()) => self.ledger.revoked(lease_id),
            Err(e) => self.ledger.revoke_failed(lease_id, &e.to_string()),
        };
        if let Err(e) = recorded {
            tracing::error!("lease ledger: {e}");
        }
        result
    }

    /// A Kubernetes credential goes to a lane of its mount (the same
    /// role, set up the same on every lane), when one has room.
    async fn turn_for(&self, scope: &CredentialScope) -> Result<super::Turn, BrokerError> {
        if scope.credential_type != "kubernetes" {
            return Ok(super::Turn::default());
        }
        let (mount, permit) = self.lanes.acquire(scope.mount.trim_matches('/')).await?;
        Ok(super::Turn {
            mount: Some(mount),
            permit: Some(permit),
        })
    }

    async fn issue_scope(
        &self,
        turn: super::Turn,
        request_id: &str,
        scope: &CredentialScope,
    ) -> Result<IssuedCredential, BrokerError> {
        // A Kubernetes credential is minted only with a lane's permit, also
        // when the caller brought no turn.
        let turn = match turn.permit {
            None if scope.credential_type == "kubernetes" => self.turn_for(scope).await?,
            _ => turn,
        };
        let _issuing = turn.permit;
        let mount = turn
            .mount
            .unwrap_or_else(|| scope.mount.trim_matches('/').to_string());
        let path = format!("{mount}/creds/{}", scope.role.trim_matches('/'));
        let body: serde_json::Map<String, Value> = scope
            .params
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        let what = format!("issuing {path}");
        // The database secrets engine mints a user on a read of its
        // creds path (no parameters: the role says everything); the
        // Kubernetes engine on a write with the request's parameters.
        let (method, body) = if scope.credential_type == "database" {
            (rustify::enums::RequestMethod::GET, None)
        } else {
            (
                rustify::enums::RequestMethod::POST,
                Some(Value::Object(body)),
            )
        };
        let raw = self
            .call(method, &path, body, &what)
            .await
            .map_err(|e| match e {
                BrokerError::Refused(m) if mount != scope.mount.trim_matches('/') => {
                    BrokerError::Refused(format!(
                        "{m} (mount {mount} is a lane of {}: if it was not set up, `gateway vault setup --lanes N` must have made at least the [vault] lanes the gateway uses)",
                        scope.mount.trim_matches('/')
                    ))
                }
                other => other,
            })?
            .ok_or_else(|| BrokerError::Refused(format!("{what}: Vault returned nothing")))?;
        let resp: SecretResponse = serde_json::from_value(raw)
            .map_err(|e| BrokerError::Refused(format!("{what}: unexpected answer: {e}")))?;
        let mut data = resp.data.unwrap_or_default();
        if resp.lease_id.is_empty() {
            return Err(BrokerError::Refused(format!(
                "{what}: Vault returned a secret without a lease; the gateway only uses revocable credentials"
            )));
        }
        let ttl = Duration::from_secs(resp.lease_duration);
        // A database user's lease is as long as the engine's role says; the
        // policy's ttl is the most the gateway takes (a role with no
        // default_ttl would give the system's default, a month).
        let too_long = match scope.params.get("ttl") {
            Some(t) if scope.credential_type == "database" => match ttl_seconds(t) {
                Some(most) if resp.lease_duration <= most => None,
                Some(most) => Some(format!(
                    "the lease is {} s, longer than the policy's ttl {t} ({most} s): set the role's default_ttl",
                    resp.lease_duration
                )),
                None => Some(format!(
                    "the policy's ttl {t:?} is not a duration (like 5m)"
                )),
            },
            None if scope.credential_type == "database" => {
                Some("the policy gave no ttl for a database credential".to_string())
            }
            _ => None,
        };
        // Record before anything uses it: a crash from here on is recovered.
        let recorded = self
            .ledger
            .issued(&resp.lease_id, request_id, &mount, &scope.role, ttl)
            .map_err(|e| tracing::error!("lease ledger: {e}"));
        let credential = match too_long {
            Some(why) => Err(why),
            None => credential_from(&data),
        };
        // The answer's copy of the secret is wiped as soon as the file holds it.
        data.values_mut().for_each(wipe);
        if recorded.is_err() || credential.is_err() {
            // Revoked at once, a few times: a lease the ledger does not
            // hold is one no survivor would revoke. If Vault still refuses,
            // the refusal names the lease (it goes to the audit with the
            // call's end), so that an operator can revoke it.
            let mut revoked = self.revoke_lease(&resp.lease_id).await;
            for pause in [200u64, 1000] {
                if revoked.is_ok() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(pause)).await;
                revoked = self.revoke_lease(&resp.lease_id).await;
            }
            let fate = match revoked {
                Ok(()) => "it was revoked".to_string(),
                Err(e) => format!(
                    "revoking lease {} failed too ({e}): it lives until Vault's TTL unless an operator revokes it",
                    resp.lease_id
                ),
            };
            return Err(match credential {
                Err(e) => BrokerError::Refused(format!("{what}: {e}; {fate}")),
                Ok(_) => BrokerError::Refused(format!(
                    "{what}: the lease could not be recorded in the ledger; {fate}"
                )),
            });
        }
        let (secret, meta) = credential.map_err(BrokerError::Refused)?;
        Ok(IssuedCredential {
            lease_id: resp.lease_id,
            secret,
            ttl,
            meta,
        })
    }
}

fn login_error(e: vaultrs::error::ClientError, method: &str, mount: &str) -> BrokerError {
    use vaultrs::error::ClientError as E;
    match e {
        E::APIError { code, errors } => {
            let said = errors.join("; ");
            // Vault's Kubernetes auth checks the login's JWT with a
            // TokenReview made as its own service account; a cluster that
            // does not let that account create TokenReviews makes every
            // login fail with 403 (Vault's log names the TokenReview).
            let hint = if method == "Kubernetes" && code == 403 {
                if said.contains("tokenreviews") {
                    "; the API server refused Vault's TokenReview: bind the ClusterRole system:auth-delegator to the service account Vault reviews tokens with (cluster/vault-rbac.yaml binds it to vault/openbao)"
                } else {
                    "; if Vault's log says tokenreviews.authentication.k8s.io is forbidden, bind the ClusterRole system:auth-delegator to the service account Vault reviews tokens with (cluster/vault-rbac.yaml binds it to vault/openbao); otherwise check the role's bound service account and namespace"
                }
            } else {
                ""
            };
            BrokerError::Refused(format!(
                "{method} login at auth/{mount}: Vault answered {code} ({said}){hint}"
            ))
        }
        other => BrokerError::Unreachable(format!(
            "{method} login at auth/{mount}: {}",
            gateway_base::error_chain(&other)
        )),
    }
}

/// Overwrite every string in `v` with zeros before it is freed.
fn wipe(v: &mut Value) {
    use zeroize::Zeroize;
    match v {
        Value::String(s) => s.zeroize(),
        Value::Array(a) => a.iter_mut().for_each(wipe),
        Value::Object(o) => o.values_mut().for_each(wipe),
        _ => {}
    }
}

/// The file a sandbox gets from a secret's data, by the secrets engine's
/// answer: a Kubernetes service account token (the file kubectl's
/// `tokenFile` reads), or AWS keys (a shared credentials file).
/// Seconds of a ttl as the policy writes it: `90`, `90s`, `5m`, `1h`.
fn ttl_seconds(t: &str) -> Option<u64> {
    let (n, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => (&t[..i], &t[i..]),
        None => (t, "s"),
    };
    let n: u64 = n.parse().ok()?;
    let unit = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return None,
    };
    n.checked_mul(unit)
}

fn credential_from(
    data: &serde_json::Map<String, Value>,
) -> Result<(SecretFile, CredentialMeta), String> {
    let s = |k: &str| data.get(k).and_then(Value::as_str).map(str::to_string);
    if let Some(token) = data.get("service_account_token").and_then(Value::as_str) {
        return Ok((
            SecretFile::new(token.as_bytes().to_vec()),
            CredentialMeta::KubernetesToken {
                namespace: s("service_account_namespace").unwrap_or_default(),
                service_account: s("service_account_name").unwrap_or_default(),
            },
        ));
    }
    if let (Some(key), Some(secret)) = (
        data.get("access_key").and_then(Value::as_str),
        data.get("secret_key").and_then(Value::as_str),
    ) {
        // Built in place in a buffer that is wiped on drop (no temporaries).
        let mut file = Zeroizing::new(String::new());
        for (name, value) in [
            ("aws_access_key_id", Some(key)),
            ("aws_secret_access_key", Some(secret)),
            (
                "aws_session_token",
                data.get("security_token").and_then(Value::as_str),
            ),
        ] {
            if let Some(v) = value {
                if file.is_empty() {
                    file.push_str("[default]\n");
                }
                file.push_str(name);
                file.push_str(" = ");
                file.push_str(v);
                file.push('\n');
            }
        }
        return Ok((
            SecretFile::new(file.as_bytes().to_vec()),
            CredentialMeta::AwsKeys {
                access_key_id: key.to_string(),
            },
        ));
    }
    if let (Some(user), Some(password)) = (
        data.get("username").and_then(Value::as_str),
        data.get("password").and_then(Value::as_str),
    ) {
        // `KEY = value` lines, as the step runner reads them (and as the
        // output redaction cuts each value out on its own).
        // Printable, no quote or backslash (so that it is found, and cut,
        // wherever a server puts it in a JSON answer), and a password long
        // enough to be cut at all.
        let plain = |v: &str| {
            v.bytes()
                .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
        };
        if !plain(user) || !plain(password) || user.is_empty() || password.len() < 16 {
            return Err("the database secrets engine answered with a username or password the gateway does not hand over (each must be printable ASCII without spaces, quotes or backslashes, the password at least 16 characters: see the engine's password_policy)".into());
        }
        let mut file = Zeroizing::new(String::new());
        file.push_str("username = ");
        file.push_str(user);
        file.push_str("\npassword = ");
        file.push_str(password);
        file.push('\n');
        return Ok((
            SecretFile::new(file.as_bytes().to_vec()),
            CredentialMeta::DatabaseUser {
                username: user.to_string(),
            },
        ));
    }
    let keys: BTreeMap<_, _> = data.keys().map(|k| (k.as_str(), ())).collect();
    Err(format!(
        "the secrets engine answered with fields the gateway does not know how to hand to a sandbox ({:?})",
        keys.keys().collect::<Vec<_>>()
    ))
}

impl Broker for VaultBroker {
    fn issue<'a>(
        &'a self,
        request_id: &'a str,
        scope: &'a CredentialScope,
    ) -> BoxFuture<'a, Result<IssuedCredential, BrokerError>> {
        Box::pin(async move {
            let turn = self.turn_for(scope).await?;
            self.issue_scope(turn, request_id, scope).await
        })
    }

    fn turn<'a>(
        &'a self,
        scope: &'a CredentialScope,
    ) -> BoxFuture<'a, Result<super::Turn, BrokerError>> {
        Box::pin(self.turn_for(scope))
    }

    fn issue_in_turn<'a>(
        &'a self,
        turn: super::Turn,
        request_id: &'a str,
        scope: &'a CredentialScope,
    ) -> BoxFuture<'a, Result<IssuedCredential, BrokerError>> {
        Box::pin(self.issue_scope(turn, request_id, scope))
    }

    fn revoke<'a>(&'a self, lease_id: &'a str) -> BoxFuture<'a, Result<(), BrokerError>> {
        Box::pin(self.revoke_lease(lease_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_print_redacted() {
        let s = Secret::from("hvs.very-secret");
        assert!(!format!("{s:?}").contains("very-secret"));
        let auth = VaultAuth::AppRole {
            mount: "approle".into(),
            role_id: "rid".into(),
            secret_id: Secret::from("sid-secret"),
        };
        assert!(!format!("{auth:?}").contains("sid-secret"));
        let t = VaultAuth::Token(Secret::from("hvs.very-secret"));
        assert!(!format!("{t:?}").contains("very-secret"));
    }

    #[test]
    fn an_answers_secrets_are_wiped_everywhere_in_it() {
        let mut v = serde_json::json!({"service_account_token": "aaa.bbb.ccc",
            "nested": [{"k": "secret-1"}, 7, "secret-2"], "n": 1});
        wipe(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"service_account_token": "", "nested": [{"k": ""}, 7, ""], "n": 1})
        );
    }

    #[test]
    fn kubernetes_and_aws_answers_become_files() {
        let k8s = serde_json::json!({"service_account_token": "aaa.bbb.ccc", "service_account_name": "sa", "service_account_namespace": "demo-app"});
        let (file, meta) = credential_from(k8s.as_object().expect("obj")).expect("k8s");
        assert_eq!(file.expose(), b"aaa.bbb.ccc");
        assert_eq!(
            meta,
            CredentialMeta::KubernetesToken {
                namespace: "demo-app".into(),
                service_account: "sa".into()
            }
        );
        let aws = serde_json::json!({"access_key": "AKIA1", "secret_key": "s3cr3t", "security_token": "tok"});
        let (file, meta) = credential_from(aws.as_object().expect("obj")).expect("aws");
        let text = String::from_utf8(file.expose().to_vec()).expect("utf8");
        assert!(text.contains("aws_secret_access_key = s3cr3t"));
        assert!(text.contains("aws_session_token = tok"));
        assert!(matches!(meta, CredentialMeta::AwsKeys { .. }));
        let db =
            serde_json::json!({"username": "v-token-app-read-x1", "password": "A1a-secretsecret"});
        let (file, meta) = credential_from(db.as_object().expect("obj")).expect("db");
        assert_eq!(
            file.expose(),
            b"username = v-token-app-read-x1\npassword = A1a-secretsecret\n"
        );
        assert_eq!(
            meta,
            CredentialMeta::DatabaseUser {
                username: "v-token-app-read-x1".into()
            }
        );
        for (user, password) in [
            ("u", "a\nusername = root-and-more"),
            ("u", "short-password"),
            ("u", "with \"quote\" inside it!"),
            ("u", "tab\there-is-long-enough"),
            ("", "A1a-secretsecret"),
        ] {
            let broken = serde_json::json!({"username": user, "password": password});
            assert!(
                credential_from(broken.as_object().expect("obj")).is_err(),
                "{password:?}"
            );
        }
        assert_eq!(ttl_seconds("5m"), Some(300));
        assert_eq!(ttl_seconds("90"), Some(90));
        assert_eq!(ttl_seconds("2h"), Some(7200));
        assert_eq!(ttl_seconds("5d"), None);
        assert_eq!(ttl_seconds("m"), None);
        let odd = serde_json::json!({"password": "x"});
        assert!(credential_from(odd.as_object().expect("obj")).is_err());
    }

    #[test]
    fn config_resolution_fails_closed_on_missing_auth() {
        let no_env = |_: &str| None;
        assert!(
            VaultConfig::default()
                .resolve_with(no_env)
                .expect("ok")
                .is_none()
        );
        // Token auth with no token anywhere is an error, not "no Vault".
        let addr_only = |k: &str| (k == "VAULT_ADDR").then(|| "http://127.0.0.1:1".to_string());
        assert!(
            VaultConfig::default()
                .resolve_with(addr_only)
                .expect_err("no token")
                .to_string()
                .contains("no token")
        );
        let with_token = |k: &str| match k {
            "VAULT_ADDR" => Some("http://127.0.0.1:1".to_string()),
            "VAULT_TOKEN" => Some("hvs.x".to_string()),
            _ => None,
        };
        let s = VaultConfig::default()
            .resolve_with(with_token)
            .expect("ok")
            .expect("configured");
        assert_eq!(s.address, "http://127.0.0.1:1");
        assert!(matches!(s.auth, VaultAuth::Token(_)));
        let dir = tempfile::tempdir().expect("tmp");
        let cfg = VaultConfig {
            address: Some("http://127.0.0.1:1".into()),
            auth: Some("approle".into()),
            ..VaultConfig::default()
        };
        assert!(
            cfg.resolve_with(no_env)
                .expect_err("no role id")
                .to_string()
                .contains("role_id")
        );
        let empty = dir.path().join("sid");
        std::fs::write(&empty, "\n").expect("write");
        let cfg = VaultConfig {
            address: Some("http://127.0.0.1:1".into()),
            auth: Some("approle".into()),
            approle: AppRoleConfig {
                mount: None,
                role_id: Some("r".into()),
                secret_id_file: Some(empty),
            },
            ..VaultConfig::default()
        };
        assert!(
            cfg.resolve_with(no_env)
                .expect_err("empty")
                .to_string()
                .contains("empty")
        );
        let cfg = VaultConfig {
            address: Some("http://127.0.0.1:1".into()),
            auth: Some("kerberos".into()),
            ..VaultConfig::default()
        };
        assert!(cfg.resolve_with(no_env).is_err());
    }
}
