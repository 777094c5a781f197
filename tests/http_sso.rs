//! Remote MCP over HTTPS with single sign-on, end to end with the real
//! components: `gateway daemon` (as root) serving `[http]` with TLS from a
//! CA made here, the certified `oidc-provider` (npm) issuing JWT access
//! tokens for the gateway's resource through the authorization-code flow,
//! the official MCP Python SDK as the agent (2026-07-28 stateless and the
//! legacy session), real gVisor and Terraform behind the pipeline.
//!
//! The attacker holds what an agent can get: its own person's token, and
//! tokens it forges or alters (expired, early, for another audience or
//! issuer, unsigned, HMAC-signed with the issuer's public key, with a key
//! id the issuer never had, oversized, malformed), sent in the query
//! string, from a foreign Origin or Host, or without the 2026-07-28 method
//! header. Each is refused with a status and a reason, audited as
//! `http.refused`, and starts no call.

mod common;
#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/postgres.rs"]
mod pg;
#[path = "support/sso.rs"]
mod sso;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use daemon::{APPROVER, Daemon};
use serde_json::{Value, json};
use sso::{CLIENT_ID, Http, Provider, free_port, initialize, python};

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A token signed with `key` (the issuer's own private key: what an
/// attacker cannot have, used here to vary one claim at a time).
fn forge(key_pem: &str, kid: &str, claims: &Value) -> String {
    forge_typed(key_pem, kid, "at+jwt", claims)
}

fn forge_typed(key_pem: &str, kid: &str, typ: &str, claims: &Value) -> String {
    let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    h.kid = Some(kid.into());
    h.typ = Some(typ.into());
    let k = jsonwebtoken::EncodingKey::from_ec_pem(key_pem.as_bytes()).expect("ec key");
    jsonwebtoken::encode(&h, claims, &k).expect("encode")
}

fn b64(v: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v)
}

fn sdk(
    url: &str,
    token: &str,
    ca: &Path,
    mode: &str,
    step: &str,
    approval: Option<&str>,
) -> (bool, String) {
    let mut c = Command::new(python());
    c.arg(common::repo().join("tests/mcp/http_scenarios.py"))
        .args([url, token])
        .arg(ca)
        .args([mode, step]);
    if let Some(a) = approval {
        c.arg(a);
    }
    let out = c.output().expect("http_scenarios.py");
    (
        out.status.success(),
        format!("{}{}", common::stdout(&out), common::stderr(&out)),
    )
}

fn last_json(out: &str) -> Value {
    out.lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .unwrap_or(Value::Null)
}

#[test]
fn remote_mcp_with_sso_serves_the_policy_to_real_clients_and_refuses_every_bad_token() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let keys = tempfile::tempdir().expect("dir");
    let (ca, cert, tls_key) = common::tls_files(keys.path());
    // The issuer's signing keys (P-256), the second for the rotation.
    let signing: Vec<(PathBuf, String)> = (0..2)
        .map(|i| {
            let k = rcgen::KeyPair::generate().expect("key");
            let p = keys.path().join(format!("sign-{i}.pem"));
            std::fs::write(&p, k.serialize_pem()).expect("write key");
            (p, k.serialize_pem())
        })
        .collect();
    let gw_port = free_port();
    let idp_port = free_port();
    let resource = format!("https://127.0.0.1:{gw_port}/mcp");
    let provider = Provider::start(
        keys.path(),
        idp_port,
        &[(&signing[0].0, "key-0")],
        &resource,
        (&cert, &tls_key),
    );

    // The remote workspace: the team's modules on the gateway's host.
    let workspace = tempfile::tempdir().expect("workspace");
    common::copy_dir(
        &common::repo().join("terraform/offline-demo"),
        &workspace.path().join("terraform/offline-demo"),
    );
    let extra = format!(
        "[http]\nlisten = \"127.0.0.1:{gw_port}\"\nresource = {resource:?}\ntls_cert = {cert:?}\ntls_key = {tls_key:?}\nworkspace = {ws:?}\n\
         audited_refusals_per_minute = 1000\n\
         [[http.issuers]]\nissuer = {iss:?}\nca_file = {ca:?}\nleeway_seconds = 5\n",
        ws = workspace.path(),
        iss = provider.issuer,
    );
    // SSO identities in the IdP group gateway-approvers may approve.
    let policies = common::policies_with(&[(
        "config/approvals/data.yaml",
        "  sso_groups: []\n  sso_clients: []\n",
        "  sso_groups: [gateway-approvers]\n  sso_clients: [gateway-cli]\n",
    )]);
    let (dir, config) = Daemon::layout(policies.path(), &extra);
    let d = Daemon::start_in(dir, config);
    let started = Instant::now();
    while !d.log().contains("serving MCP over HTTP") {
        assert!(started.elapsed() < Duration::from_secs(30), "{}", d.log());
        std::thread::sleep(Duration::from_millis(50));
    }

    let http = Http::new(&ca, &resource);

    // Discovery: the resource metadata names the issuer.
    let (status, body) = http.get(&format!(
        "https://127.0.0.1:{gw_port}/.well-known/oauth-protected-resource/mcp"
    ));
    assert_eq!(status, 200, "{body}");
    let meta: Value = serde_json::from_str(&body).expect("metadata");
    assert_eq!(meta["resource"], resource.as_str());
    assert_eq!(meta["authorization_servers"], json!([provider.issuer]));

    // A real token for alice, from the provider's sign-in.
    let alice = provider.login("alice", &resource, &ca);
    let ok = http.post(&http.url, Some(&alice), &[], &initialize());
    assert_eq!(ok.status, 200, "{}", ok.body);

    // Every bad token and request: a status, a reason, an audit event.
    let base = json!({
        "iss": provider.issuer, "sub": "alice", "aud": resource, "iat": now(),
        "exp": now() + 300, "email": "alice@example.com", "groups": ["developers"],
        "client_id": CLIENT_ID,
    });
    let with = |k: &str, v: Value| {
        let mut c = base.clone();
        c[k] = v;
        c
    };
    let key0 = &signing[0].1;
    let public_jwk = {
        let (_, body) = http.get(&format!("{}/jwks", provider.issuer));
        body
    };
    let hs256_with_public_key = {
        let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        h.kid = Some("key-0".into());
        h.typ = Some("at+jwt".into());
        jsonwebtoken::encode(
            &h,
            &base,
            &jsonwebtoken::EncodingKey::from_secret(public_jwk.as_bytes()),
        )
        .expect("hs256")
    };
    let unsigned = format!(
        "{}.{}.",
        b64(br#"{"alg":"none","typ":"at+jwt","kid":"key-0"}"#),
        b64(base.to_string().as_bytes())
    );
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("no token", String::new(), 401, "no bearer token"),
        (
            "expired",
            forge(key0, "key-0", &with("exp", json!(now() - 60))),
            401,
            "expired",
        ),
        (
            "not yet valid",
            forge(key0, "key-0", &with("nbf", json!(now() + 600))),
            401,
            "not valid yet",
        ),
        (
            "another audience",
            forge(
                key0,
                "key-0",
                &with("aud", json!("https://other.example/mcp")),
            ),
            401,
            "another audience",
        ),
        (
            "another issuer",
            forge(key0, "key-0", &with("iss", json!("https://evil.example"))),
            401,
            "not one this gateway trusts",
        ),
        ("alg none", unsigned, 401, "not a JWT"),
        (
            "HS256 with the public key",
            hs256_with_public_key,
            401,
            "HS256",
        ),
        ("unknown kid", forge(key0, "key-9", &base), 401, "not among"),
        (
            "not an access token (an ID token's typ)",
            forge_typed(key0, "key-0", "JWT", &base),
            401,
            "not an access token",
        ),
        (
            "an unverified e-mail as the username",
            forge(key0, "key-0", &with("email_verified", json!(false))),
            401,
            "not verified",
        ),
        (
            "oversized",
            format!("{}{}", forge(key0, "key-0", &base), "A".repeat(20_000)),
            401,
            "more than the",
        ),
        ("malformed", "not.a.jwt".into(), 401, "not a JWT"),
        (
            "no sub",
            forge(key0, "key-0", &{
                let mut c = base.clone();
                c.as_object_mut().map(|m| m.remove("sub"));
                c
            }),
            401,
            "sub",
        ),
        (
            "altered payload",
            {
                let t = forge(key0, "key-0", &base);
                let parts: Vec<&str> = t.split('.').collect();
                format!(
                    "{}.{}.{}",
                    parts[0],
                    b64(with("sub", json!("root")).to_string().as_bytes()),
                    parts[2]
                )
            },
            401,
            "signature",
        ),
    ];
    let refused_before = count(&d, "http.refused");
    let requests_before = count(&d, "tool.request");
    for (what, token, status, reason) in &cases {
        let a = http.post(
            &http.url,
            (!token.is_empty()).then_some(token.as_str()),
            &[],
            &initialize(),
        );
        assert_eq!(a.status, *status, "{what}: {}", a.body);
        assert!(
            a.body.contains(reason),
            "{what}: {:?} lacks {reason:?}",
            a.body
        );
        assert!(
            a.www_authenticate
                .starts_with("Bearer resource_metadata=\"https://127.0.0.1:"),
            "{what}: {:?}",
            a.www_authenticate
        );
        let ev = last(&d, "http.refused");
        assert!(
            ev["data"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains(reason)),
            "{what}: {ev:#}"
        );
        assert!(
            !ev.to_string().contains(token.get(..40).unwrap_or("-none-")) || token.len() < 40,
            "{what}: the audit holds the token"
        );
    }
    let keys_fetched = Instant::now();
    // A token in the URL, a foreign Origin, a foreign Host, a 2026-07-28
    // request without its method header.
    let a = http.post(
        &format!("{}?access_token={alice}", http.url),
        None,
        &[],
        &initialize(),
    );
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(a.body.contains("query"), "{}", a.body);
    let a = http.post(
        &http.url,
        Some(&alice),
        &[("origin", "https://evil.example")],
        &initialize(),
    );
    assert_eq!(a.status, 403, "{}", a.body);
    assert!(a.body.contains("Origin"), "{}", a.body);
    let a = http.post(
        &http.url,
        Some(&alice),
        &[("host", "evil.example")],
        &initialize(),
    );
    assert_eq!(a.status, 403, "{}", a.body);
    assert!(a.body.contains("Host"), "{}", a.body);
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "probe", "version": "1"}}}});
    let a = http.post(
        &http.url,
        Some(&alice),
        &[("mcp-protocol-version", "2026-07-28")],
        &list,
    );
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(a.body.contains("Mcp-Method"), "{}", a.body);
    assert_eq!(
        count(&d, "http.refused") - refused_before,
        cases.len() + 4,
        "one audit event per refusal"
    );
    assert_eq!(
        count(&d, "tool.request"),
        requests_before,
        "no refused request started a call"
    );
    // A token that expires while its call runs: the call, accepted when the
    // token was valid, ends; the same request replayed after the expiry
    // (and the leeway of 5 s) is refused and starts nothing.
    let short_exp = now() + 2;
    let short = forge(key0, "key-0", &with("exp", json!(short_exp)));
    let plan = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "terraform_plan", "arguments": {"working_dir": "terraform/offline-demo"},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {},
                  "io.modelcontextprotocol/clientInfo": {"name": "replayer", "version": "1"}}}});
    let modern = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "terraform_plan"),
    ];
    let first = http.post(&http.url, Some(&short), &modern, &plan);
    assert_eq!(first.status, 200, "{}", first.body);
    assert!(first.body.contains("\"completed\""), "{}", first.body);
    while now() <= short_exp + 5 + 1 {
        std::thread::sleep(Duration::from_millis(200));
    }
    let requests = count(&d, "tool.request");
    let again = http.post(&http.url, Some(&short), &modern, &plan);
    assert_eq!(again.status, 401, "{}", again.body);
    assert!(again.body.contains("expired"), "{}", again.body);
    assert_eq!(
        count(&d, "tool.request"),
        requests,
        "the replay started nothing"
    );

    // `gateway client install --url` writes the remote entry each client
    // expects, with no secret in it; the SDK below connects to the URL the
    // Claude Code entry names.
    let configs = tempfile::tempdir().expect("configs");
    let install = |client: &str, file: &str, url: &str| {
        Command::new(env!("CARGO_BIN_EXE_gateway"))
            .args(["client", "install", client, "--url", url, "--file"])
            .arg(configs.path().join(file))
            .output()
            .expect("client install")
    };
    let mut named = String::new();
    for (client, file, key, want) in [
        (
            "claude-code",
            "claude.json",
            "mcpServers",
            json!({"type": "http", "url": resource}),
        ),
        (
            "cursor",
            "cursor.json",
            "mcpServers",
            json!({"url": resource}),
        ),
        (
            "vscode",
            "vscode.json",
            "servers",
            json!({"type": "http", "url": resource}),
        ),
    ] {
        let out = install(client, file, &resource);
        assert!(out.status.success(), "{client}: {}", common::stderr(&out));
        let text = std::fs::read_to_string(configs.path().join(file)).expect("config");
        let doc: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(doc[key]["gateway"], want, "{client}: {text}");
        assert!(
            !text.contains(&alice[..20]) && !text.to_lowercase().contains("bearer"),
            "{text}"
        );
        if client == "claude-code" {
            named = doc[key]["gateway"]["url"]
                .as_str()
                .unwrap_or("")
                .to_string();
        }
    }
    let out = install("claude-desktop", "desktop.json", &resource);
    assert!(!out.status.success());
    assert!(
        common::stderr(&out).contains("Connectors"),
        "{}",
        common::stderr(&out)
    );
    let out = install("cursor", "plain.json", "http://gateway.example/mcp");
    assert!(!out.status.success());
    assert!(
        common::stderr(&out).contains("https://"),
        "{}",
        common::stderr(&out)
    );

    // The SDK's own OAuth client, given no token: it discovers, registers
    // and signs carol in by itself from the gateway's 401.
    let out = Command::new(python())
        .arg(common::repo().join("tests/mcp/http_oauth.py"))
        .arg(&named)
        .arg(&ca)
        .arg("carol")
        .output()
        .expect("http_oauth.py");
    let said = format!("{}{}", common::stdout(&out), common::stderr(&out));
    assert!(out.status.success(), "{said}");
    assert!(said.contains("PASS the SDK found the issuer"), "{said}");
    assert!(
        d.events().iter().any(|e| e["event"] == "tool.request"
            && e["data"]["principal"]["user"] == "carol@example.com"
            && e["data"]["principal"]["client"] == "sdk-oauth-client"),
        "carol's call is audited as hers"
    );

    // The official SDK, both eras, as alice: the policy's tools, a denial,
    // a plan and an apply that waits for a person.
    let (ok, out) = sdk(&resource, &alice, &ca, "legacy", "plan", None);
    assert!(ok, "{out}");
    let (ok, out) = sdk(&resource, &alice, &ca, "auto", "plan", None);
    assert!(ok, "{out}");
    let approval = last_json(&out)["approval_id"]
        .as_str()
        .expect("approval id")
        .to_string();
    let request_id = last_json(&out)["request_id"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let request = d
        .events()
        .into_iter()
        .find(|e| e["event"] == "tool.request" && e["request_id"] == request_id.as_str())
        .expect("the apply's tool.request");
    let p = &request["data"]["principal"];
    assert_eq!(p["kind"], "sso", "{request:#}");
    assert_eq!(p["user"], "alice@example.com", "{request:#}");
    assert_eq!(p["subject"], "alice", "{request:#}");
    assert_eq!(p["issuer"], provider.issuer.as_str(), "{request:#}");
    assert_eq!(
        p["groups"],
        json!(["developers", "gateway-approvers"]),
        "{request:#}"
    );
    assert_eq!(p["client"], "sdk-over-https", "{request:#}");
    assert!(
        p.get("os_user").is_none() && p.get("uid").is_none(),
        "{request:#}"
    );

    // eve, whose e-mail names the approver's OS user, asks for an apply:
    // that OS user is taken to be her and cannot approve it.
    let approver_home = daemon::owned_dir(APPROVER);
    let approve = |id: &str| {
        daemon::as_user(
            APPROVER,
            approver_home.path(),
            &[("GATEWAY_SOCKET", &d.socket)],
            &PathBuf::from(env!("CARGO_BIN_EXE_gateway")),
        )
        .args(["approve", id, "--reason", "reviewed"])
        .output()
        .expect("approve")
    };
    let eve = provider.login("eve", &resource, &ca);
    let (ok, out) = sdk(&resource, &eve, &ca, "auto", "plan", None);
    assert!(ok, "{out}");
    let eves = last_json(&out)["approval_id"]
        .as_str()
        .expect("approval id")
        .to_string();
    let out = approve(&eves);
    let said = format!("{}{}", common::stdout(&out), common::stderr(&out));
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("requested this call and cannot approve it"),
        "{said}"
    );

    let bob = provider.login("bob", &resource, &ca);
    // A legacy session is its first identity's: another token naming it,
    // for any method, finds no session.
    let session = http.rt.block_on(async {
        let r = http
            .client
            .post(&http.url)
            .bearer_auth(&alice)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(initialize().to_string())
            .send()
            .await
            .expect("initialize");
        r.headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .expect("a session id")
    });
    for method in ["POST", "DELETE"] {
        let a = http.rt.block_on(async {
            let r = http
                .client
                .request(method.parse().expect("method"), &http.url)
                .bearer_auth(&bob)
                .header("mcp-session-id", &session)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .body(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}).to_string())
                .send()
                .await
                .expect("request");
            (r.status().as_u16(), r.text().await.unwrap_or_default())
        });
        assert_eq!(a.0, 404, "{method} with another's session: {}", a.1);
        assert!(a.1.contains("no session of yours"), "{}", a.1);
    }

    // Approvals over the network, with each person's own token
    // (`gateway approve` with GATEWAY_URL): alice, an approver, cannot
    // approve her own call; carol is not an approver; bob is, and does.
    let remote = |token: &str, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_gateway"))
            .args(args)
            .env("GATEWAY_URL", &resource)
            .env("GATEWAY_TOKEN", token)
            .env("GATEWAY_CA_FILE", &ca)
            .env_remove("GATEWAY_HOME")
            .env_remove("GATEWAY_SOCKET")
            .output()
            .expect("gateway")
    };
    let said = |o: &std::process::Output| format!("{}{}", common::stdout(o), common::stderr(o));
    let out = remote(&alice, &["approve", &approval, "--reason", "mine"]);
    assert!(!out.status.success(), "{}", said(&out));
    assert!(
        said(&out).contains("requested this call and cannot approve it"),
        "{}",
        said(&out)
    );
    let carol = provider.login("carol", &resource, &ca);
    let out = remote(&carol, &["approve", &approval, "--reason", "sure"]);
    assert!(!out.status.success(), "{}", said(&out));
    assert!(said(&out).contains("is not an approver"), "{}", said(&out));
    let out = remote(&carol, &["approvals", "--json"]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(
        !common::stdout(&out).contains(&approval),
        "carol sees only her own: {}",
        said(&out)
    );
    // bob signs in with `gateway login` (the device grant: the code shown
    // on the terminal, confirmed in a browser), which keeps his token in a
    // file only he can read; approve reads it from there.
    let bob_token = configs.path().join("bob/token");
    let mut login = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args([
            "login",
            "--issuer",
            &provider.issuer,
            "--client-id",
            "gateway-cli",
        ])
        .args(["--resource", &resource, "--ca-file"])
        .arg(&ca)
        .arg("--token-file")
        .arg(&bob_token)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gateway login");
    let mut shown = BufReader::new(login.stderr.take().expect("stderr"));
    let mut line = String::new();
    while !line.contains(" open ") {
        line.clear();
        assert!(
            shown.read_line(&mut line).expect("login output") > 0,
            "gateway login ended"
        );
    }
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("https://"))
        .expect("a sign-in address")
        .to_string();
    let out = Command::new(python())
        .arg(common::repo().join("tests/oidc/login.py"))
        .args(["--device", &url, "--user", "bob", "--ca"])
        .arg(&ca)
        .output()
        .expect("device sign-in");
    assert!(out.status.success(), "{}", common::stderr(&out));
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut shown, &mut rest);
    assert!(login.wait().expect("login").success(), "{rest}");
    assert!(rest.contains("signed in"), "{rest}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&bob_token)
        .expect("token file")
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o077,
        0,
        "the token file is the user's alone: {mode:o}"
    );
    let remote_from_file = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_gateway"))
            .args(args)
            .env("GATEWAY_URL", &resource)
            .env("GATEWAY_TOKEN_FILE", &bob_token)
            .env("GATEWAY_CA_FILE", &ca)
            .env_remove("GATEWAY_TOKEN")
            .env_remove("GATEWAY_HOME")
            .env_remove("GATEWAY_SOCKET")
            .output()
            .expect("gateway")
    };
    // bob's agent holds bob's MCP token (issued to the agent's client):
    // with it the agent cannot approve anything, though bob is an approver.
    let out = remote(
        &bob,
        &["approve", &approval, "--reason", "my agent says so"],
    );
    assert!(!out.status.success(), "{}", said(&out));
    assert!(said(&out).contains("is not an approver"), "{}", said(&out));
    // Nor does a token go to a gateway it was not issued for (a GATEWAY_URL
    // someone planted): the command refuses before sending it.
    let out = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["approvals"])
        .env("GATEWAY_URL", "https://127.0.0.1:9/mcp")
        .env("GATEWAY_TOKEN_FILE", &bob_token)
        .env_remove("GATEWAY_TOKEN")
        .env_remove("GATEWAY_HOME")
        .output()
        .expect("gateway");
    assert!(!out.status.success());
    assert!(said(&out).contains("not sending it"), "{}", said(&out));
    let out = remote_from_file(&["approvals", "--json"]);
    assert!(common::stdout(&out).contains(&approval), "{}", said(&out));
    let out = remote_from_file(&["approve", &approval, "--reason", "reviewed over SSO"]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(said(&out).contains("approved"), "{}", said(&out));
    let granted = last(&d, "approval.granted");
    assert_eq!(granted["data"]["kind"], "sso", "{granted:#}");
    assert_eq!(
        granted["data"]["approver"], "bob@example.com",
        "{granted:#}"
    );
    assert_eq!(granted["data"]["identity"]["subject"], "bob", "{granted:#}");
    // A token in no good standing is refused before any command runs.
    let a = http.post(
        &format!("{resource}/control"),
        Some("not-a-token"),
        &[],
        &json!({"argv": ["approve", approval, "--reason", "x"]}),
    );
    assert_eq!(a.status, 401, "{}", a.body);

    // Another person's token cannot spend alice's approval, granted or not.
    let (_, out) = sdk(&resource, &bob, &ca, "auto", "apply", Some(&approval));
    let r = last_json(&out);
    assert_eq!(r["is_error"], true, "{out}");
    assert!(
        r["text"].as_str().is_some_and(|t| t.contains("request")),
        "{out}"
    );
    // Alice's own token spends it: the apply runs.
    let (ok, out) = sdk(&resource, &alice, &ca, "auto", "apply", Some(&approval));
    assert!(ok, "{out}");
    let r = last_json(&out);
    assert_eq!(r["result"]["status"], "completed", "{out}");

    // The MCP Inspector's CLI, with alice's token as a header: the same
    // tools, the same denial, and plan -> bob's approval over HTTPS ->
    // apply of a change that replaces a resource.
    let inspector = |args: &[&str]| {
        let bin = common::repo().join("tests/inspector/node_modules/.bin/mcp-inspector");
        assert!(
            bin.exists(),
            "{} is missing: run scripts/install-tools.sh inspector",
            bin.display()
        );
        let out = Command::new(bin)
            .args(["--cli", &resource, "--transport", "http", "--header"])
            .arg(format!("Authorization: Bearer {alice}"))
            .args(args)
            .env("NODE_EXTRA_CA_CERTS", &ca)
            .env("HOME", configs.path())
            .output()
            .expect("mcp-inspector");
        // (It exits non-zero for a result with isError, as it should.)
        let text = common::stdout(&out);
        serde_json::from_str::<Value>(&text)
            .unwrap_or_else(|e| panic!("inspector {args:?} printed no JSON ({e}): {text}"))
    };
    let listed = inspector(&["--method", "tools/list"]);
    assert!(listed.to_string().contains("terraform_apply"), "{listed}");
    let denied = inspector(&[
        "--method",
        "tools/call",
        "--tool-name",
        "k8s_get_pod_status",
        "--tool-arg",
        "namespace=kube-system",
    ]);
    assert_eq!(denied["isError"], true, "{denied}");
    assert!(
        denied.to_string().contains("not in the allowlist"),
        "{denied}"
    );
    let main_tf = workspace.path().join("terraform/offline-demo/main.tf");
    let text = std::fs::read_to_string(&main_tf).expect("main.tf");
    std::fs::write(
        &main_tf,
        text.replacen(
            "labels = \"app=web\"",
            "labels = \"app=web,via=inspector\"",
            1,
        ),
    )
    .expect("edit");
    let pending = inspector(&[
        "--method",
        "tools/call",
        "--tool-name",
        "terraform_apply",
        "--tool-arg",
        "working_dir=terraform/offline-demo",
    ]);
    assert_eq!(
        pending["structuredContent"]["status"], "pending_approval",
        "{pending}"
    );
    let second = pending["structuredContent"]["approval_id"]
        .as_str()
        .expect("approval id")
        .to_string();
    // The change replaces a resource: bob's token alone (which his agent
    // may hold) does not grant it. A proof a token cannot give does (here
    // the approver's OS user on the socket).
    let out = remote_from_file(&["approve", &second, "--reason", "the inspector's change"]);
    assert!(!out.status.success(), "{}", said(&out));
    assert!(
        said(&out).contains("approve it with a passkey"),
        "{}",
        said(&out)
    );
    let out = approve(&second);
    assert!(out.status.success(), "{}", said(&out));
    let applied = inspector(&[
        "--method",
        "tools/call",
        "--tool-name",
        "terraform_apply",
        "--tool-arg",
        "working_dir=terraform/offline-demo",
        &format!("approval_id={second}"),
    ]);
    assert_eq!(
        applied["structuredContent"]["status"], "completed",
        "{applied}"
    );
    assert!(applied.to_string().contains("replaced"), "{applied}");

    // The issuer rotates its signing key: a token under the new key is
    // accepted (the keys are fetched again for the unknown kid); one under
    // the retired key no longer is.
    let old = alice;
    while keys_fetched.elapsed() < Duration::from_secs(32) {
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(provider);
    let provider = Provider::start(
        keys.path(),
        idp_port,
        &[(&signing[1].0, "key-1")],
        &resource,
        (&cert, &tls_key),
    );
    let fresh = provider.login("alice", &resource, &ca);
    let a = http.post(&http.url, Some(&fresh), &[], &initialize());
    assert_eq!(a.status, 200, "a token under the new key: {}", a.body);
    let a = http.post(&http.url, Some(&old), &[], &initialize());
    assert_eq!(a.status, 401, "a token under the retired key: {}", a.body);
    assert!(a.body.contains("not among"), "{}", a.body);
    d.assert_audit_verifies();
}

fn count(d: &Daemon, event: &str) -> usize {
    d.events().iter().filter(|e| e["event"] == event).count()
}

fn last(d: &Daemon, event: &str) -> Value {
    d.events()
        .into_iter()
        .rev()
        .find(|e| e["event"] == event)
        .unwrap_or(Value::Null)
}

/// A client without a token cannot fill the audit log: past the per-minute
/// budget of one address its refusals are answered but not written one by
/// one.
#[test]
fn refusals_of_one_address_are_audited_up_to_a_budget() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let keys = tempfile::tempdir().expect("dir");
    let (ca, cert, tls_key) = common::tls_files(keys.path());
    let port = free_port();
    let resource = format!("https://127.0.0.1:{port}/mcp");
    let workspace = tempfile::tempdir().expect("workspace");
    // An issuer nobody serves: no token will verify, none is needed here.
    let extra = format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\nresource = {resource:?}\ntls_cert = {cert:?}\ntls_key = {tls_key:?}\nworkspace = {ws:?}\naudited_refusals_per_minute = 5\n\
         [[http.issuers]]\nissuer = \"https://127.0.0.1:9\"\n",
        ws = workspace.path(),
    );
    let (dir, config) = Daemon::layout(&common::repo().join("policies"), &extra);
    let d = Daemon::start_in(dir, config);
    let started = Instant::now();
    while !d.log().contains("serving MCP over HTTP") {
        assert!(started.elapsed() < Duration::from_secs(30), "{}", d.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let http = Http::new(&ca, &resource);
    for _ in 0..20 {
        let a = http.post(&http.url, None, &[], &initialize());
        assert_eq!(a.status, 401, "{}", a.body);
        assert!(a.body.contains("no bearer token"), "{}", a.body);
    }
    assert_eq!(count(&d, "http.refused"), 5, "{:#?}", d.events());
    d.assert_audit_verifies();
}

/// Two replicas of one team gateway behind one resource URL, sharing a
/// real PostgreSQL (`[store]`), each serving HTTPS on its own port (as
/// behind a load balancer that spreads requests): alice's apply asked for
/// through replica A with the official SDK (2026-07-28, stateless) is
/// approved through B's socket, and her call again with the approval id,
/// reaching B, applies; the one audit chain holds both halves.
#[test]
fn over_https_a_call_asked_on_one_replica_is_approved_and_applied_on_another() {
    use std::os::unix::fs::PermissionsExt;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let keys = tempfile::tempdir().expect("dir");
    let (ca, cert, tls_key) = common::tls_files(keys.path());
    let k = rcgen::KeyPair::generate().expect("key");
    let signing = keys.path().join("sign.pem");
    std::fs::write(&signing, k.serialize_pem()).expect("write key");
    let (port_a, port_b, idp_port) = (free_port(), free_port(), free_port());
    // The team's one resource URL (the load balancer's); each replica
    // accepts the hosts it is reached by.
    let resource = format!("https://127.0.0.1:{port_a}/mcp");
    let provider = Provider::start(
        keys.path(),
        idp_port,
        &[(&signing, "key-0")],
        &resource,
        (&cert, &tls_key),
    );
    let server = pg::Postgres::start();
    let url_file = keys.path().join("postgres.url");
    std::fs::write(&url_file, server.database("team")).expect("url");
    std::fs::set_permissions(&url_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let workspace = tempfile::tempdir().expect("workspace");
    common::copy_dir(
        &common::repo().join("terraform/offline-demo"),
        &workspace.path().join("terraform/offline-demo"),
    );
    let policies = common::policies_with(&[]);
    let replica = |port: u16| {
        let extra = format!(
            "[http]\nlisten = \"127.0.0.1:{port}\"\nresource = {resource:?}\nallowed_hosts = [\"127.0.0.1\"]\n\
             tls_cert = {cert:?}\ntls_key = {tls_key:?}\nworkspace = {ws:?}\n\
             [[http.issuers]]\nissuer = {iss:?}\nca_file = {ca:?}\nleeway_seconds = 5\n\
             [store]\nbackend = \"postgres\"\nurl_file = {url_file:?}\n",
            ws = workspace.path(),
            iss = provider.issuer,
        );
        let (dir, config) = Daemon::layout(policies.path(), &extra);
        let d = Daemon::start_in(dir, config);
        let started = Instant::now();
        while !d.log().contains("serving MCP over HTTP") {
            assert!(started.elapsed() < Duration::from_secs(30), "{}", d.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    };
    let (a, b) = (replica(port_a), replica(port_b));
    let alice = provider.login("alice", &resource, &ca);
    let url_b = format!("https://127.0.0.1:{port_b}/mcp");

    let (ok, out) = sdk(&resource, &alice, &ca, "auto", "plan", None);
    assert!(ok, "{out}\n{}", a.log());
    let approval = last_json(&out)["approval_id"]
        .as_str()
        .expect("approval id")
        .to_string();
    let approver_home = daemon::owned_dir(APPROVER);
    let out = daemon::as_user(
        APPROVER,
        approver_home.path(),
        &[("GATEWAY_SOCKET", &b.socket)],
        &PathBuf::from(env!("CARGO_BIN_EXE_gateway")),
    )
    .args(["approve", &approval, "--reason", "reviewed on B"])
    .output()
    .expect("approve");
    assert!(
        out.status.success(),
        "{}{}",
        common::stdout(&out),
        common::stderr(&out)
    );
    let (ok, out) = sdk(&url_b, &alice, &ca, "auto", "apply", Some(&approval));
    assert!(ok, "{out}\n{}", b.log());
    assert_eq!(last_json(&out)["result"]["status"], "completed", "{out}");
    let events = a.events();
    let with = |name: &str| {
        events
            .iter()
            .filter(|e| e["event"] == name && e["data"]["approval_id"] == approval.as_str())
            .count()
    };
    assert_eq!(
        (
            with("approval.requested"),
            with("approval.granted"),
            with("approval.spent")
        ),
        (1, 1, 1),
        "one chain holds what both replicas did"
    );
    assert!(
        !a.home.join("audit.jsonl").exists() && !b.home.join("audit.jsonl").exists(),
        "no audit log of its own is made in a replica's home"
    );
    a.assert_audit_verifies();

    // What a kubelet's probes see: ready with its policy set and its
    // database; alive but not ready while the database is away (the
    // answer names the check, never the database's address or error);
    // ready again once it is back.
    let probe = Http::new(&ca, &resource);
    let readyz = format!("https://127.0.0.1:{port_a}/readyz");
    assert_eq!(
        probe.get(&readyz),
        (200, "policy: ok\ndatabase: ok\n".to_string())
    );
    let mut server = server;
    server.kill();
    // (An answer is reused for 2 s: the first probes may still say ready.)
    let started = Instant::now();
    let (status, body) = loop {
        let got = probe.get(&readyz);
        if got.0 != 200 || started.elapsed() > Duration::from_secs(10) {
            break got;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(
        (status, body.as_str()),
        (503, "policy: ok\ndatabase: failed\n"),
        "{}",
        a.log()
    );
    assert_eq!(
        probe.get(&format!("https://127.0.0.1:{port_a}/healthz")).0,
        200
    );
    assert_eq!(
        a.log().matches("not ready").count(),
        1,
        "logged once, with its reason: {}",
        a.log()
    );
    let _ = probe.get(&readyz);
    assert_eq!(
        a.log().matches("not ready").count(),
        1,
        "not at every probe"
    );
    server.run();
    let started = Instant::now();
    while probe.get(&readyz).0 != 200 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "not ready again: {}",
            a.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// An approval with `changes` planned changes (and a diff each) and
/// `signals`, written to the daemon's store as the pipeline would.
fn seed_approval(home: &Path, changes: Vec<Value>, signals: Value) -> String {
    let store = gateway::approvals::ApprovalStore::in_home(home).expect("store");
    let (a, _) = store
        .create(&gateway::approvals::NewApproval {
            tool: "terraform_apply".into(),
            params: json!({"working_dir": "terraform/seeded"}),
            plan_sha256: Some("ab".repeat(32)),
            plan_summary: Value::Array(changes),
            signals,
            request_id: "seeded".into(),
            requested_by: "sso:https://idp.example#mallory".into(),
            requested_client: "agent <b>cli</b>".into(),
            requester: Value::Null,
            approvers_required: 1,
            ttl: Duration::from_secs(1800),
            reason_required: true,
        })
        .expect("create");
    a.id
}

/// The approval page in a real browser (Debian's Chromium, headless, driven
/// by playwright-core) with a virtual WebAuthn authenticator: an approver
/// registers a passkey, a policy author lists it, the approver signs in,
/// reads the page (signals first) and approves with user verification; the
/// agent's apply then runs. The attacks: an anonymous reader, forged posts
/// (another origin, no CSRF token, a form), a verdict without a passkey, an
/// assertion without user verification, the requester's own session and
/// its crafted grant, a hostile plan with markup and bidi characters. A
/// plan of 2,000 changes renders within the budget.
#[test]
fn an_approver_on_another_machine_approves_from_the_page_with_a_passkey() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let playwright = common::repo().join("tests/browser/node_modules/playwright-core");
    assert!(
        playwright.exists(),
        "{} is missing: run scripts/install-tools.sh browser",
        playwright.display()
    );
    assert!(
        Path::new("/usr/bin/chromium").exists(),
        "chromium is missing: scripts/bootstrap.sh installs it"
    );
    let keys = tempfile::tempdir().expect("dir");
    let (ca, cert, tls_key) = common::tls_files(keys.path());
    let k = rcgen::KeyPair::generate().expect("key");
    let signing = keys.path().join("sign.pem");
    std::fs::write(&signing, k.serialize_pem()).expect("write key");
    let (gw_port, idp_port) = (free_port(), free_port());
    // Named by a DNS name: browsers refuse passkeys on an IP address.
    let resource = format!("https://localhost:{gw_port}/mcp");
    let provider = Provider::start(
        keys.path(),
        idp_port,
        &[(&signing, "key-0")],
        &resource,
        (&cert, &tls_key),
    );
    let workspace = tempfile::tempdir().expect("workspace");
    common::copy_dir(
        &common::repo().join("terraform/offline-demo"),
        &workspace.path().join("terraform/offline-demo"),
    );
    let extra = format!(
        "[http]\nlisten = \"127.0.0.1:{gw_port}\"\nresource = {resource:?}\ntls_cert = {cert:?}\ntls_key = {tls_key:?}\nworkspace = {ws:?}\n\
         audited_refusals_per_minute = 1000\n\
         [[http.issuers]]\nissuer = {iss:?}\nca_file = {ca:?}\nleeway_seconds = 5\n",
        ws = workspace.path(),
        iss = provider.issuer,
    );
    daemon::os_user(APPROVER);
    let policies = common::policies_with(&[]);
    let (dir, config) = Daemon::layout(policies.path(), &extra);
    let d = Daemon::start_in(dir, config);
    let started = Instant::now();
    while !d.log().contains("serving MCP over HTTP") {
        assert!(started.elapsed() < Duration::from_secs(30), "{}", d.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    // alice's agent asks for an apply: it stops at the gate, and its result
    // carries the page's link for the agent's client to show alice.
    let alice = provider.login("alice", &resource, &ca);
    let (ok, out) = sdk(&resource, &alice, &ca, "auto", "plan", None);
    assert!(ok, "{out}\n{}", d.log());
    let pending = last_json(&out);
    let approval = pending["approval_id"]
        .as_str()
        .expect("approval id")
        .to_string();
    let base = format!("https://localhost:{gw_port}");
    assert_eq!(
        pending["review_url"],
        format!("{base}/approvals/{approval}"),
        "{pending:#}"
    );
    // Two more approvals: 2,000 changes, and a hostile module's.
    let big: Vec<Value> = (0..2000)
        .map(|i| {
            json!({"address": format!("terraform_data.item[{i}]"), "actions": ["update"],
                   "reason": null, "paths": [],
                   "diff": [{"path": "input.size", "before": format!("{i}"), "after": format!("{}", i + 1)},
                            {"path": "input.secret", "before": "(sensitive value)", "after": "(sensitive value)"}]})
        })
        .collect();
    let big = seed_approval(&d.home, big, json!([]));
    let evil = "<script>window.__pwned=true</script><a href=\"https://evil.example\">click</a>";
    let bidi = "terraform_data.\u{202e}gol\u{200b}.web";
    let hostile = seed_approval(
        &d.home,
        vec![
            json!({"address": format!("{bidi}{evil}"), "actions": ["delete"], "reason": evil,
                    "paths": [[evil]], "diff": [{"path": evil, "before": bidi, "after": null}]}),
        ],
        json!([{"address": format!("{bidi}{evil}"), "kind": "delete", "actions": ["delete"],
                "reason": null, "paths": [], "message": format!("{bidi}{evil} will be destroyed")}]),
    );
    let shots = common::repo().join("target/approval-page");
    std::fs::create_dir_all(&shots).expect("shots dir");
    let approvers_file = d
        .home
        .parent()
        .expect("layout")
        .join("policies/config/approvers/data.yaml");
    let out = Command::new("node")
        .arg(common::repo().join("tests/browser/approval_page.mjs"))
        .env("BASE", &base)
        .env("APPROVAL", &approval)
        .env("APPROVERS_FILE", &approvers_file)
        .env("BIG", &big)
        .env("HOSTILE", &hostile)
        .env("SHOTS", &shots)
        .output()
        .expect("node");
    let report = last_json(&common::stdout(&out));
    assert!(
        report.get("error").is_none() && report.is_object(),
        "{report:#}\n{}\n{}",
        common::stderr(&out),
        d.log()
    );
    assert_eq!(report["registered"], json!([true, true]), "{report:#}");
    assert!(
        report["unlisted_sign_in"]
            .as_str()
            .is_some_and(|s| s.contains("no passkey is listed")),
        "{report:#}"
    );
    assert_eq!(
        report["anonymous_url"],
        format!("/approvals/login?next={approval}"),
        "{report:#}"
    );
    // What a careful reviewer needs first comes first.
    assert_eq!(
        report["sections"],
        json!(["signals none", "facts", "decide", "changes"]),
        "{report:#}"
    );
    let csp = report["headers"]["content-security-policy"]
        .as_str()
        .unwrap_or_default();
    assert!(
        csp.contains("frame-ancestors 'none'")
            && csp.contains("script-src 'self'")
            && !csp.contains("unsafe-inline"),
        "{report:#}"
    );
    assert_eq!(report["headers"]["cache-control"], "no-store");
    assert_eq!(report["headers"]["x-frame-options"], "DENY");
    assert_eq!(report["headers"]["referrer-policy"], "no-referrer");
    assert_eq!(report["cookie"]["sameSite"], "Strict", "{report:#}");
    assert_eq!(report["cookie"]["httpOnly"], true, "{report:#}");
    assert_eq!(report["cookie"]["secure"], true, "{report:#}");
    assert_eq!(report["cookie"]["path"], "/", "{report:#}");
    for (forgery, status) in [
        ("forged_origin", 403),
        ("forged_no_csrf", 403),
        ("forged_form", 415),
        ("planted_cookie", 401),
        ("forged_verdict_without_passkey", 403),
    ] {
        assert_eq!(report[forgery]["status"], status, "{forgery}: {report:#}");
    }
    assert!(
        report["forged_verdict_without_passkey"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("passkey is not accepted")),
        "{report:#}"
    );
    // The requester's session: no grant button, and its crafted grant,
    // signed by its own listed passkey, is refused by the policy.
    assert_eq!(report["requester_grant_buttons"], 0, "{report:#}");
    assert!(
        report["requester_notice"]
            .as_str()
            .is_some_and(|t| t.contains("cannot approve it")),
        "{report:#}"
    );
    assert_eq!(report["requester_crafted"]["step"], "verdict", "{report:#}");
    assert!(
        report["requester_crafted"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("requested this call and cannot approve it")),
        "{report:#}"
    );
    // Without user verification: refused by the gateway (an assertion
    // asked without it) and by the browser (the page asks for it).
    assert_eq!(report["unverified"]["step"], "verdict", "{report:#}");
    assert!(
        report["unverified"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("passkey is not accepted")),
        "{report:#}"
    );
    assert!(
        report["unverified_click"]
            .as_str()
            .is_some_and(|t| t.starts_with("refused")),
        "{report:#}"
    );
    assert!(
        report["approved"]
            .as_str()
            .is_some_and(|t| t.contains(&format!("approved {approval} as bob"))),
        "{report:#}"
    );
    assert!(
        report["after"]
            .as_str()
            .is_some_and(|t| t.contains("approved")),
        "{report:#}"
    );
    // 2,000 changes: all rendered, within the budget (measured: see README).
    assert_eq!(report["big_changes"], 2000, "{report:#}");
    assert!(
        report["big_ms"].as_u64().is_some_and(|ms| ms < 5000),
        "{report:#}"
    );
    // The hostile plan: no script of its own, no link it chose, its
    // bidi and zero-width characters shown.
    assert_eq!(report["hostile_scripts"], 1, "{report:#}");
    assert_eq!(report["hostile_alerted"], false, "{report:#}");
    assert!(
        report["hostile_links"].as_array().is_some_and(|l| l
            .iter()
            .all(|h| h.as_str().is_some_and(|h| h.starts_with("/approvals")))),
        "{report:#}"
    );
    let shown = report["hostile_text"].as_str().unwrap_or_default();
    assert!(
        shown.contains("\\u{202e}") && shown.contains("<script>") && !shown.contains('\u{202e}'),
        "{shown}"
    );

    // The grant is a passkey's, kept whole; the agent's apply now runs.
    let granted = last(&d, "approval.granted");
    assert_eq!(granted["data"]["kind"], "passkey", "{granted:#}");
    assert_eq!(granted["data"]["approver"], "bob", "{granted:#}");
    assert!(
        granted["data"]["signature"]
            .as_str()
            .is_some_and(|s| s.contains("authenticatorData"))
    );
    let (ok, out) = sdk(&resource, &alice, &ca, "auto", "apply", Some(&approval));
    assert!(ok, "{out}\n{}", d.log());
    assert_eq!(last_json(&out)["result"]["status"], "completed", "{out}");
    assert_eq!(count(&d, "approval_page.signed_in"), 2);
    assert_eq!(count(&d, "approval_page.passkey_registered"), 2);
    // A captured sign-in replayed from another client opens no session.
    assert_eq!(report["replayed_sign_in"]["status"], 403, "{report:#}");
    assert!(
        report["replayed_sign_in"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("already used")),
        "{report:#}"
    );
    // Signing out ends the session on the server: the kept cookie, which
    // read the list just before, is sent to sign in again after.
    assert_eq!(report["before_sign_out"], 200, "{report:#}");
    assert_eq!(report["after_sign_out"]["status"], 303, "{report:#}");
    // The audit says which passkey signed in and registered (a credential
    // id is public, not a secret to scrub).
    for e in d.events().iter().filter(|e| {
        e["event"] == "approval_page.signed_in" || e["event"] == "approval_page.passkey_registered"
    }) {
        assert!(
            e["data"]["credential_id"]
                .as_str()
                .is_some_and(|c| c.starts_with("webauthn:") && c.len() > 20),
            "{e:#}"
        );
    }
    // `audit verify` checks the passkey's assertion again.
    let verify = common::gateway(&d.home)
        .args(["audit", "verify"])
        .output()
        .expect("verify");
    assert!(verify.status.success(), "{}", common::stdout(&verify));
    assert!(
        common::stdout(&verify).contains("(1 approval signature(s) checked)"),
        "{}",
        common::stdout(&verify)
    );
}
