//! `gateway login`: sign a person in at the team's OpenID provider with the
//! device authorization grant (RFC 8628) — the terminal shows a code and an
//! address, the person signs in in any browser — and keep the access token
//! for the team gateway (the resource it is issued for) in a file only they
//! can read. `gateway approvals|approve|deny` with `GATEWAY_URL` send it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;

/// The token file when neither `--token-file` nor `GATEWAY_TOKEN_FILE`
/// names one: `$XDG_CONFIG_HOME/gateway/token`, else `~/.config/gateway/token`.
pub fn default_token_file() -> Option<PathBuf> {
    if let Some(c) = std::env::var_os("XDG_CONFIG_HOME").filter(|s| !s.is_empty()) {
        return Some(PathBuf::from(c).join("gateway/token"));
    }
    std::env::var_os("HOME")
        .filter(|s| !s.is_empty())
        .map(|h| PathBuf::from(h).join(".config/gateway/token"))
}

#[derive(Debug, clap::Args)]
pub struct LoginArgs {
    /// The OpenID provider (its issuer URL, https://).
    #[arg(long, env = "GATEWAY_ISSUER")]
    issuer: String,
    /// This command's client id at the provider (a public client allowed
    /// the device grant).
    #[arg(long, env = "GATEWAY_CLIENT_ID")]
    client_id: String,
    /// The gateway the token is for: its MCP endpoint [default: GATEWAY_URL].
    #[arg(long, env = "GATEWAY_URL")]
    resource: String,
    /// Scopes asked for.
    #[arg(long, default_value = "openid email groups")]
    scope: String,
    /// A PEM file of CA certificates the provider's HTTPS is checked
    /// against, besides the system's.
    #[arg(long, env = "GATEWAY_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// Where the token is kept [default: GATEWAY_TOKEN_FILE, else
    /// ~/.config/gateway/token].
    #[arg(long, env = "GATEWAY_TOKEN_FILE")]
    token_file: Option<PathBuf>,
}

pub fn run(a: &LoginArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        a.issuer.starts_with("https://"),
        "--issuer {:?}: an https:// URL",
        a.issuer
    );
    let file = a
        .token_file
        .clone()
        .or_else(default_token_file)
        .context("no home directory to keep the token in: pass --token-file")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (token, expires_in) = rt.block_on(device_flow(a))?;
    if let Some(d) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        if !d.exists() {
            // Made here: the user's own, 0700 (never a chmod of a directory
            // that was there already, such as a shared one).
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(d)
                .with_context(|| format!("creating {}", d.display()))?;
        }
        let meta = std::fs::symlink_metadata(d).with_context(|| format!("{}", d.display()))?;
        anyhow::ensure!(
            meta.is_dir()
                && meta.uid() == nix::unistd::getuid().as_raw()
                && meta.mode() & 0o022 == 0,
            "{} is not a directory of yours that only you can write: keep the token elsewhere (--token-file)",
            d.display()
        );
    }
    // Written whole, owner-only, in place of any older one.
    let tmp = file.with_extension("new");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("writing {}", tmp.display()))?;
        f.write_all(token.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &file).with_context(|| format!("writing {}", file.display()))?;
    eprintln!(
        "gateway login: signed in; the token for {} is in {}{}",
        a.resource,
        file.display(),
        expires_in
            .map(|s| format!(" (valid for {s} s)"))
            .unwrap_or_default()
    );
    Ok(ExitCode::SUCCESS)
}

async fn device_flow(a: &LoginArgs) -> anyhow::Result<(String, Option<u64>)> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut b = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none())
        .https_only(true);
    if let Some(ca) = &a.ca_file {
        let pem = std::fs::read(ca).with_context(|| format!("--ca-file {}", ca.display()))?;
        for cert in reqwest::Certificate::from_pem_bundle(&pem).context("--ca-file")? {
            b = b.add_root_certificate(cert);
        }
    }
    let http = b.build()?;
    let get = |r: reqwest::RequestBuilder| async move {
        let r = r
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("{}", e.without_url()))?;
        let status = r.status();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        anyhow::Ok((status, v))
    };
    let base = a.issuer.trim_end_matches('/');
    let (status, meta) = get(http.get(format!("{base}/.well-known/openid-configuration")))
        .await
        .with_context(|| format!("the provider's metadata at {base}"))?;
    anyhow::ensure!(
        status.is_success() && meta["issuer"].as_str() == Some(a.issuer.as_str()),
        "{base} has no OpenID metadata naming it as the issuer ({status})"
    );
    let device = meta["device_authorization_endpoint"]
        .as_str()
        .context("the provider offers no device sign-in (device_authorization_endpoint)")?;
    let token_endpoint = meta["token_endpoint"]
        .as_str()
        .context("the provider names no token_endpoint")?;
    let (status, started) = get(http.post(device).form(&[
        ("client_id", a.client_id.as_str()),
        ("scope", a.scope.as_str()),
        ("resource", a.resource.as_str()),
    ]))
    .await
    .context("asking the provider for a sign-in code")?;
    if !status.is_success() {
        bail!(
            "the provider refused the sign-in ({status}): {}",
            oauth_error(&started)
        );
    }
    let device_code = started["device_code"]
        .as_str()
        .context("no device_code in the provider's answer")?;
    let user_code = started["user_code"].as_str().unwrap_or("");
    let uri = started["verification_uri_complete"]
        .as_str()
        .or_else(|| started["verification_uri"].as_str())
        .context("no verification_uri in the provider's answer")?;
    eprintln!("gateway login: open {uri} in a browser and confirm the code {user_code}");
    let mut interval = Duration::from_secs(started["interval"].as_u64().unwrap_or(5).max(1));
    let deadline =
        Instant::now() + Duration::from_secs(started["expires_in"].as_u64().unwrap_or(600));
    loop {
        tokio::time::sleep(interval).await;
        anyhow::ensure!(
            Instant::now() < deadline,
            "the sign-in code expired; run gateway login again"
        );
        let (status, t) = get(http.post(token_endpoint).form(&[
            ("grant_type", "urn:ietf:params:oauth:grant-type:device_code"),
            ("device_code", device_code),
            ("client_id", a.client_id.as_str()),
            ("resource", a.resource.as_str()),
        ]))
        .await
        .context("asking the provider for the token")?;
        if status.is_success() {
            let token = t["access_token"]
                .as_str()
                .context("no access_token in the provider's answer")?;
            return Ok((token.to_string(), t["expires_in"].as_u64()));
        }
        match t["error"].as_str() {
            Some("authorization_pending") => {}
            Some("slow_down") => interval += Duration::from_secs(5),
            _ => bail!("the sign-in did not complete: {}", oauth_error(&t)),
        }
    }
}

fn oauth_error(v: &Value) -> String {
    let clip = |s: &str| {
        s.chars()
            .filter(|c| !c.is_control())
            .take(300)
            .collect::<String>()
    };
    match (v["error"].as_str(), v["error_description"].as_str()) {
        (Some(e), Some(d)) => format!("{} ({})", clip(e), clip(d)),
        (Some(e), None) => clip(e),
        _ => "no error given".into(),
    }
}
