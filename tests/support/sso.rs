//! The real OpenID provider (tests/oidc/provider.mjs, npm oidc-provider)
//! and an HTTPS client trusting the test CA, for the tests of the HTTP
//! transport (tests/http_sso.rs, tests/http_limits.rs).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

use super::common;
use super::daemon::APPROVER;

pub const CLIENT_ID: &str = "agent-cli";
pub const REDIRECT: &str = "http://127.0.0.1:53682/callback";
/// The gateway as a confidential client of the provider (a remote upstream's
/// client-credentials grant).
pub const UPSTREAM_CLIENT_ID: &str = "gateway-upstreams";
pub const UPSTREAM_CLIENT_SECRET: &str = "upstream-client-secret-5d1e8a";
/// A resource server that introspects the tokens it is shown.
pub const RESOURCE_CLIENT_ID: &str = "remote-mcp-server";
pub const RESOURCE_CLIENT_SECRET: &str = "resource-client-secret-91c4f0";

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

pub fn python() -> PathBuf {
    let p = common::repo().join(".tools/venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run scripts/install-tools.sh",
        p.display()
    );
    p
}

/// The test OpenID provider (tests/oidc/provider.mjs), on `port`.
pub struct Provider {
    child: Child,
    pub issuer: String,
}

impl Provider {
    pub fn start(
        dir: &Path,
        port: u16,
        keys: &[(&Path, &str)],
        resource: &str,
        tls: (&Path, &Path),
    ) -> Provider {
        Provider::launch(dir, port, keys, resource, tls, false)
    }

    /// [`Provider::start`], with opaque access tokens for `resource` (which
    /// checks them by introspection, and which the provider can revoke).
    pub fn start_opaque(
        dir: &Path,
        port: u16,
        keys: &[(&Path, &str)],
        resource: &str,
        tls: (&Path, &Path),
    ) -> Provider {
        Provider::launch(dir, port, keys, resource, tls, true)
    }

    fn launch(
        dir: &Path,
        port: u16,
        keys: &[(&Path, &str)],
        resource: &str,
        tls: (&Path, &Path),
        opaque: bool,
    ) -> Provider {
        let modules = common::repo().join("tests/oidc/node_modules/oidc-provider");
        assert!(
            modules.exists(),
            "{} is missing: run scripts/install-tools.sh oidc",
            modules.display()
        );
        let issuer = format!("https://127.0.0.1:{port}");
        let config = json!({
            "issuer": issuer,
            "port": port,
            "tls": {"cert": tls.0, "key": tls.1},
            "keys": keys.iter().map(|(p, _)| p).collect::<Vec<_>>(),
            "kids": keys.iter().map(|(_, k)| k).collect::<Vec<_>>(),
            "resource": resource,
            "other_resources": ["https://other.example/mcp"],
            "opaque_resources": if opaque { vec![resource] } else { vec![] },
            "users": {
                "alice": {"email": "alice@example.com", "groups": ["developers", "gateway-approvers"]},
                "bob": {"email": "bob@example.com", "groups": ["developers", "gateway-approvers"]},
                "carol": {"email": "carol@example.com", "groups": ["developers"]},
                // An SSO user who is also an approver's OS user on the host.
                "eve": {"email": format!("{APPROVER}@example.com"), "groups": ["developers"]},
            },
            "clients": [{
                "client_id": CLIENT_ID,
                "token_endpoint_auth_method": "none",
                "redirect_uris": [REDIRECT],
                "grant_types": ["authorization_code", "refresh_token"],
                "response_types": ["code"],
            }, {
                // The gateway itself, granted a token for a remote
                // upstream (tests/upstream_servers.rs).
                "client_id": UPSTREAM_CLIENT_ID,
                "client_secret": UPSTREAM_CLIENT_SECRET,
                "token_endpoint_auth_method": "client_secret_basic",
                "redirect_uris": [],
                "grant_types": ["client_credentials"],
                "response_types": [],
            }, {
                // A resource server that checks tokens by introspection.
                "client_id": RESOURCE_CLIENT_ID,
                "client_secret": RESOURCE_CLIENT_SECRET,
                "token_endpoint_auth_method": "client_secret_basic",
                "redirect_uris": [],
                "grant_types": [],
                "response_types": [],
            }, {
                // gateway login: the device grant, no redirect.
                "client_id": "gateway-cli",
                "token_endpoint_auth_method": "none",
                "redirect_uris": [],
                "grant_types": ["urn:ietf:params:oauth:grant-type:device_code"],
                "response_types": [],
            }],
            "access_token_ttl": 600,
        });
        let path = dir.join(format!("provider-{port}-{}.json", keys[0].1));
        std::fs::write(&path, config.to_string()).expect("provider config");
        let mut child = Command::new("node")
            .arg(common::repo().join("tests/oidc/provider.mjs"))
            .arg(&path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("node (scripts/bootstrap.sh installs nodejs)");
        let out = child.stdout.take().expect("stdout");
        let mut out = BufReader::new(out);
        let mut line = String::new();
        out.read_line(&mut line).expect("provider output");
        assert!(
            line.contains("ready"),
            "the provider did not start: {line:?}"
        );
        // What it says later is drained (a closed pipe would kill it).
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        Provider { child, issuer }
    }

    /// An access token for `user`, through the authorization-code flow.
    pub fn login(&self, user: &str, resource: &str, ca: &Path) -> String {
        let out = Command::new(python())
            .arg(common::repo().join("tests/oidc/login.py"))
            .args([
                "--issuer",
                &self.issuer,
                "--client-id",
                CLIENT_ID,
                "--redirect-uri",
                REDIRECT,
            ])
            .args(["--user", user, "--resource", resource])
            .arg("--ca")
            .arg(ca)
            .output()
            .expect("login.py");
        let said = common::stderr(&out);
        assert!(
            out.status.success(),
            "login of {user}: {}",
            said.lines()
                .filter(|l| l.contains("login.py") || l.contains("<pre>"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        let v: Value = serde_json::from_slice(&out.stdout).expect("token response");
        v["access_token"]
            .as_str()
            .expect("access_token")
            .to_string()
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Http {
    pub rt: tokio::runtime::Runtime,
    pub client: reqwest::Client,
    pub url: String,
}

pub struct Answer {
    pub status: u16,
    pub www_authenticate: String,
    pub body: String,
}

impl Http {
    /// A client trusting the CA at `ca` (PEM), for `url`.
    pub fn new(ca: &Path, url: &str) -> Http {
        let pem = std::fs::read(ca).expect("ca");
        Http {
            rt: tokio::runtime::Runtime::new().expect("runtime"),
            client: reqwest::Client::builder()
                .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("ca cert"))
                .build()
                .expect("client"),
            url: url.to_string(),
        }
    }

    pub fn post(
        &self,
        url: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: &Value,
    ) -> Answer {
        self.rt.block_on(async {
            let mut r = self
                .client
                .post(url)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream");
            if let Some(t) = token {
                r = r.bearer_auth(t);
            }
            for (k, v) in headers {
                r = r.header(*k, *v);
            }
            let resp = r.body(body.to_string()).send().await.expect("request");
            let status = resp.status().as_u16();
            let www_authenticate = resp
                .headers()
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let body = resp.text().await.unwrap_or_default();
            Answer {
                status,
                www_authenticate,
                body,
            }
        })
    }

    pub fn get(&self, url: &str) -> (u16, String) {
        self.rt.block_on(async {
            let r = self.client.get(url).send().await.expect("get");
            (r.status().as_u16(), r.text().await.unwrap_or_default())
        })
    }
}

pub fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "probe", "version": "1"}}})
}
