//! One valid identity must not take the HTTP transport from the team.
//! Real components: `gateway daemon` (as root) serving `[http]` with TLS,
//! the certified `oidc-provider` issuing alice's and bob's access tokens,
//! real HTTPS clients. alice is the attacker: her token is valid, and she
//! uses it to send bodies one byte at a time, to hold connections and to
//! open sessions she never closes. bob must stay served throughout.
//!
//! Each attack failed before the limits existed: a slow body after
//! authentication was never cut (20 of 20 still open at 150 s), one token
//! held every connection slot, and sessions were kept until a hash-order
//! trim past 100,000.

mod common;
#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/sso.rs"]
mod sso;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use daemon::Daemon;
use serde_json::{Value, json};
use sso::{Http, Provider, free_port, initialize};

struct Team {
    _keys: tempfile::TempDir,
    _workspace: tempfile::TempDir,
    _provider: Provider,
    d: Daemon,
    ca: PathBuf,
    resource: String,
    alice: String,
    bob: String,
}

/// A daemon with `limits` in its `[http]`, and tokens for alice and bob.
fn team(limits: &str) -> Team {
    team_logging(limits, None)
}

/// [`team`], the daemon logging at `rust_log` when given.
fn team_logging(limits: &str, rust_log: Option<&str>) -> Team {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let keys = tempfile::tempdir().expect("dir");
    let (ca, cert, tls_key) = common::tls_files(keys.path());
    let signing = keys.path().join("sign.pem");
    let k = rcgen::KeyPair::generate().expect("key");
    std::fs::write(&signing, k.serialize_pem()).expect("write key");
    let gw_port = free_port();
    let resource = format!("https://127.0.0.1:{gw_port}/mcp");
    let provider = Provider::start(
        keys.path(),
        free_port(),
        &[(&signing, "key-0")],
        &resource,
        (&cert, &tls_key),
    );
    let workspace = tempfile::tempdir().expect("workspace");
    let extra = format!(
        "[http]\nlisten = \"127.0.0.1:{gw_port}\"\nresource = {resource:?}\ntls_cert = {cert:?}\ntls_key = {tls_key:?}\nworkspace = {ws:?}\n\
         {limits}\n\
         [[http.issuers]]\nissuer = {iss:?}\nca_file = {ca:?}\nleeway_seconds = 5\n",
        ws = workspace.path(),
        iss = provider.issuer,
    );
    let (dir, config) = Daemon::layout(&common::repo().join("policies"), &extra);
    let mut cmd = Daemon::command(dir.path(), &config);
    if let Some(filter) = rust_log {
        cmd.env("RUST_LOG", filter);
    }
    let d = Daemon::start_cmd(dir, config, cmd);
    let started = Instant::now();
    while !d.log().contains("serving MCP over HTTP") {
        assert!(started.elapsed() < Duration::from_secs(30), "{}", d.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let alice = provider.login("alice", &resource, &ca);
    let bob = provider.login("bob", &resource, &ca);
    Team {
        _keys: keys,
        _workspace: workspace,
        _provider: provider,
        d,
        ca,
        resource,
        alice,
        bob,
    }
}

fn client(ca: &Path) -> reqwest::Client {
    let pem = std::fs::read(ca).expect("ca");
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("ca cert"))
        // One connection per request: each slow body holds its own.
        .pool_max_idle_per_host(0)
        .build()
        .expect("client")
}

/// A POST whose `Content-Length` promises `len` bytes and whose body
/// comes one byte every `every` until it is cut (or `len` are sent).
async fn slow_post(
    c: reqwest::Client,
    url: String,
    token: String,
    len: usize,
    every: Duration,
) -> (u16, String, Duration) {
    let started = Instant::now();
    let body = futures::stream::unfold(0usize, move |i| async move {
        if i == len {
            return None;
        }
        tokio::time::sleep(every).await;
        Some((
            Ok::<_, std::io::Error>(hyper::body::Frame::data(bytes::Bytes::from_static(b" "))),
            i + 1,
        ))
    });
    let r = c
        .post(&url)
        .bearer_auth(token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("content-length", len.to_string())
        .body(reqwest::Body::wrap(http_body_util::StreamBody::new(
            Box::pin(body),
        )))
        .send()
        .await;
    match r {
        Ok(r) => {
            let status = r.status().as_u16();
            let text = r.text().await.unwrap_or_default();
            (status, text, started.elapsed())
        }
        Err(e) => (0, e.to_string(), started.elapsed()),
    }
}

fn refusals(d: &Daemon, status: u16) -> Vec<Value> {
    d.events()
        .into_iter()
        .filter(|e| e["event"] == "http.refused" && e["data"]["status"] == status)
        .collect()
}

/// `gateway_http_limited_total` of `limit`, summed over identities, from
/// one scrape (the listener reuses a scrape's text for 5 s: one scrape a
/// test, at its end).
fn limited_metric(text: &str, limit: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.starts_with("gateway_http_limited_total{")
                && l.contains(&format!("limit=\"{limit}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn scrape(http: &Http, origin: &str) -> String {
    let (status, text) = http.get(&format!("{origin}/metrics"));
    assert_eq!(status, 200, "{text}");
    text
}

/// A body that crawls after a valid token is cut at the request's
/// deadline with 408 (MCP endpoint and control API alike), audited with
/// the identity; while alice holds her whole share of connections with
/// such bodies, her next connection is refused 429 at once and bob is
/// served.
#[test]
fn a_slow_body_is_cut_and_one_identity_cannot_hold_every_connection() {
    daemon::os_user(daemon::AGENT);
    let t = team(
        "request_timeout_seconds = 4\nmax_connections_per_identity = 4\nmax_requests_per_identity = 16\n",
    );
    let http = Http::new(&t.ca, &t.resource);
    let origin = t.resource.trim_end_matches("/mcp").to_string();
    let rt = tokio::runtime::Runtime::new().expect("rt");

    // 1. Slow bodies, on the MCP endpoint and the control API.
    for path in ["/mcp", "/mcp/control"] {
        let (status, text, took) = rt.block_on(slow_post(
            client(&t.ca),
            format!("{origin}{path}"),
            t.alice.clone(),
            1000,
            Duration::from_millis(500),
        ));
        assert_eq!(status, 408, "{path}: {text}");
        assert!(
            text.contains("request_timeout_seconds"),
            "{path}: says which limit: {text}"
        );
        assert!(
            took < Duration::from_secs(10),
            "{path}: cut at its deadline, not later: {took:?}"
        );
    }
    let timeouts = refusals(&t.d, 408);
    assert_eq!(timeouts.len(), 2, "{timeouts:#?}");
    assert!(
        timeouts.iter().all(|e| e["data"]["identity"]
            .as_str()
            .is_some_and(|i| i.contains("alice"))),
        "{timeouts:#?}"
    );

    // 2. alice holds her four connections with slow bodies.
    let held: Vec<_> = (0..4)
        .map(|_| {
            rt.spawn(slow_post(
                client(&t.ca),
                t.resource.clone(),
                t.alice.clone(),
                1000,
                Duration::from_millis(300),
            ))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let fifth = http.post(&http.url, Some(&t.alice), &[], &initialize());
    assert_eq!(
        fifth.status, 429,
        "alice's fifth connection: {}",
        fifth.body
    );
    assert!(
        fifth.body.contains("max_connections_per_identity"),
        "{}",
        fifth.body
    );
    for _ in 0..4 {
        let b = http.post(&http.url, Some(&t.bob), &[], &initialize());
        assert_eq!(b.status, 200, "bob is served meanwhile: {}", b.body);
    }
    for h in held {
        let (status, text, _) = rt.block_on(h).expect("join");
        assert_eq!(status, 408, "{text}");
    }
    // Her share is hers again once they are cut.
    let again = http.post(&http.url, Some(&t.alice), &[], &initialize());
    assert_eq!(again.status, 200, "{}", again.body);
    let over = refusals(&t.d, 429);
    assert!(
        over.iter().any(|e| e["data"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("max_connections_per_identity"))
            && e["data"]["identity"]
                .as_str()
                .is_some_and(|i| i.contains("alice"))),
        "{over:#?}"
    );
    let text = scrape(&http, &origin);
    assert!(limited_metric(&text, "request_timeout") >= 2.0, "{text}");
    assert!(
        limited_metric(&text, "connections_per_identity") >= 1.0,
        "{text}"
    );
    t.d.assert_audit_verifies();
}

/// What the router's layers add, attacked: a body declared over the
/// limit is refused before anything else is done (no token is verified
/// for it), audited and the connection closed, like a refusal made by the
/// handlers; each answer carries a request id, a client's plain id is kept
/// and its junk replaced; and with every target logging at debug, no
/// token, cookie or query string reaches the daemon's log.
#[test]
fn the_routers_layers_refuse_big_bodies_audited_and_keep_secrets_out_of_the_log() {
    daemon::os_user(daemon::AGENT);
    let t = team_logging("max_request_bytes = 65536\n", Some("debug"));
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let c = client(&t.ca);
    let post = |token: Option<&str>, headers: &[(&str, &str)], body: Vec<u8>| {
        let mut r = c
            .post(&t.resource)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(tok) = token {
            r = r.bearer_auth(tok);
        }
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        rt.block_on(async move {
            let resp = r.body(body).send().await.expect("request");
            let status = resp.status().as_u16();
            let h = resp.headers().clone();
            (status, h, resp.text().await.unwrap_or_default())
        })
    };
    // 1. A declared body over the limit, with and without a token.
    for token in [None, Some(t.alice.as_str())] {
        let (status, h, text) = post(token, &[], vec![b' '; 65537]);
        assert_eq!(status, 413, "{text}");
        assert!(text.contains("at most 65536 bytes"), "{text}");
        assert_eq!(
            h.get("connection").and_then(|v| v.to_str().ok()),
            Some("close"),
            "{h:?}"
        );
    }
    let big = refusals(&t.d, 413);
    assert_eq!(big.len(), 2, "{big:#?}");
    // 2. Request ids: a new one when none is sent; a plain one kept; junk replaced.
    let (status, h, _) = post(Some(&t.alice), &[], initialize().to_string().into_bytes());
    assert_eq!(status, 200);
    let made = h
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .expect("a request id")
        .to_string();
    assert_eq!(made.len(), 36, "a UUID: {made}");
    let (_, h, _) = post(
        Some(&t.alice),
        &[("x-request-id", "agent-run-42.step_7")],
        initialize().to_string().into_bytes(),
    );
    assert_eq!(
        h.get("x-request-id").and_then(|v| v.to_str().ok()),
        Some("agent-run-42.step_7")
    );
    for junk in ["a b", "x\"y", &"z".repeat(65), "\u{1b}[2Jcleared"] {
        let Ok(_) = hyper::http::HeaderValue::from_str(junk) else {
            continue;
        };
        let (_, h, _) = post(
            Some(&t.alice),
            &[("x-request-id", junk)],
            initialize().to_string().into_bytes(),
        );
        let id = h
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        assert!(id.len() == 36 && id != junk, "{junk:?} -> {id:?}");
    }
    // 3. A token in the query is refused; nothing secret is in the log.
    let (status, _, _) = rt.block_on(async {
        let r = c
            .get(format!("{}?access_token={}", t.resource, t.bob))
            .header("cookie", "gw_session=cookie-secret-value")
            .send()
            .await
            .expect("get");
        (r.status().as_u16(), (), ())
    });
    assert_eq!(status, 400);
    let log = t.d.log();
    assert!(
        log.contains("request_id="),
        "the daemon logs requests at debug: {log}"
    );
    for secret in [t.alice.as_str(), t.bob.as_str(), "cookie-secret-value"] {
        assert!(!log.contains(secret), "a secret in the daemon's log");
    }
    t.d.assert_audit_verifies();
}

/// Sessions a client opens and never ends: alice's are bounded by her
/// share (429 with `Retry-After`), bob opens his all the same, and a
/// session never used past its handshake is closed after
/// `session_unused_seconds` (then refused 404, and alice may open again).
#[test]
fn sessions_one_identity_leaves_open_are_bounded_and_closed_when_idle() {
    daemon::os_user(daemon::AGENT);
    let t = team(
        "max_sessions_per_identity = 3\nsession_unused_seconds = 2\nsession_idle_seconds = 60\n",
    );
    let http = Http::new(&t.ca, &t.resource);
    let origin = t.resource.trim_end_matches("/mcp").to_string();
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let c = client(&t.ca);
    let open = |token: &str| -> (u16, Option<String>, Option<String>, String) {
        rt.block_on(async {
            let r = c
                .post(&t.resource)
                .bearer_auth(token)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .body(initialize().to_string())
                .send()
                .await
                .expect("send");
            let status = r.status().as_u16();
            let header = |n: &str| {
                r.headers()
                    .get(n)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            let (id, retry) = (header("mcp-session-id"), header("retry-after"));
            (status, id, retry, r.text().await.unwrap_or_default())
        })
    };
    let mut mine = Vec::new();
    for _ in 0..3 {
        let (status, id, _, body) = open(&t.alice);
        assert_eq!(status, 200, "{body}");
        // Tasks are served on the local socket only: not offered here.
        assert!(
            body.contains("\"capabilities\"") && !body.contains("\"tasks\""),
            "{body}"
        );
        mine.push(id.expect("a legacy session id"));
    }
    // A 2026-07-28 request naming one of her sessions, for a method the
    // gateway does not serve, is answered 404 while the session lives on:
    // that must not make the session uncounted (review finding: each such
    // round let her keep one more session than her share).
    for id in &mine {
        let a = http.post(
            &http.url,
            Some(&t.alice),
            &[
                ("mcp-session-id", id),
                ("mcp-protocol-version", "2026-07-28"),
                ("mcp-method", "resources/list"),
            ],
            &json!({"jsonrpc": "2.0", "id": 7, "method": "resources/list", "params": {
                "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                          "io.modelcontextprotocol/clientInfo": {"name": "probe", "version": "1"},
                          "io.modelcontextprotocol/clientCapabilities": {}}}}),
        );
        assert_ne!(a.status, 200, "{}", a.body);
    }
    let (status, _, retry, body) = open(&t.alice);
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("max_sessions_per_identity"), "{body}");
    let retry: u64 = retry.and_then(|r| r.parse().ok()).expect("Retry-After");
    assert!((1..=2).contains(&retry), "{retry}");
    for _ in 0..3 {
        let (status, id, _, body) = open(&t.bob);
        assert_eq!(status, 200, "bob's own share: {body}");
        assert!(id.is_some());
    }
    // Never used past the handshake: closed after 2 s (swept every 2 s).
    std::thread::sleep(Duration::from_secs(5));
    let old = http.post(
        &http.url,
        Some(&t.alice),
        &[("mcp-session-id", &mine[0])],
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    );
    assert_eq!(old.status, 404, "a closed session is gone: {}", old.body);
    let (status, _, _, body) = open(&t.alice);
    assert_eq!(status, 200, "room again: {body}");
    let text = scrape(&http, &origin);
    // bob's three closed as alice's did (never used); alice's new one is open.
    assert!(
        text.lines().any(|l| l == "gateway_http_sessions 1"),
        "{}",
        text.lines()
            .filter(|l| l.starts_with("gateway_http"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        limited_metric(&text, "sessions_per_identity") >= 1.0,
        "{text}"
    );
    t.d.assert_audit_verifies();
}

/// The daemon's open-file budget: its soft limit is raised to the hard
/// one at start, and a `max_connections` the limit cannot serve with room
/// for the daemon's own files is refused with the fix.
#[test]
fn the_daemon_raises_its_file_limit_and_refuses_connections_it_cannot_serve() {
    daemon::os_user(daemon::AGENT);
    let keys = tempfile::tempdir().expect("dir");
    let (ca, cert, tls_key) = common::tls_files(keys.path());
    let workspace = tempfile::tempdir().expect("workspace");
    let http = |max: usize| {
        format!(
            "[http]\nlisten = \"127.0.0.1:{p}\"\nresource = \"https://127.0.0.1:{p}/mcp\"\ntls_cert = {cert:?}\ntls_key = {tls_key:?}\nworkspace = {ws:?}\nmax_connections = {max}\n\
             [[http.issuers]]\nissuer = \"https://127.0.0.1:9\"\nca_file = {ca:?}\n",
            p = free_port(),
            ws = workspace.path(),
        )
    };
    let limited = |cmd: &mut std::process::Command, soft: u64, hard: u64| {
        use std::os::unix::process::CommandExt;
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::resource::setrlimit(
                    nix::sys::resource::Resource::RLIMIT_NOFILE,
                    soft,
                    hard,
                )
                .map_err(std::io::Error::from)
            });
        }
    };
    // 1,024 connections where 1,500 files may be open: refused, saying why.
    let (dir, config) = Daemon::layout(&common::repo().join("policies"), &http(1024));
    let mut cmd = Daemon::command(dir.path(), &config);
    limited(&mut cmd, 1500, 1500);
    let out = cmd.output().expect("daemon");
    assert!(!out.status.success());
    let said = common::stderr(&out);
    assert!(
        said.contains("max_connections is 1024") && said.contains("LimitNOFILE"),
        "{said}"
    );
    // A soft limit of 1,024 under a hard one of 4,096 (systemd's default
    // soft limit): raised, and the listener serves.
    let (dir, config) = Daemon::layout(&common::repo().join("policies"), &http(1024));
    let mut cmd = Daemon::command(dir.path(), &config);
    limited(&mut cmd, 1024, 4096);
    let d = Daemon::start_cmd(dir, config, cmd);
    let started = Instant::now();
    while !d.log().contains("serving MCP over HTTP") {
        assert!(started.elapsed() < Duration::from_secs(30), "{}", d.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", d.pid())).expect("limits");
    let open_files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files");
    let nums: Vec<&str> = open_files.split_whitespace().skip(3).take(2).collect();
    assert_eq!(nums, ["4096", "4096"], "{open_files}");
}

/// p50 and p99 of `samples`, in milliseconds.
fn percentiles(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[i].as_secs_f64() * 1000.0
    };
    (at(0.50), at(0.99))
}

/// bob's `tools/list` in his own legacy session, `n` times: the latency of each.
async fn tools_list_times(c: &reqwest::Client, url: &str, token: &str, n: usize) -> Vec<Duration> {
    let post = |body: Value, session: Option<String>| {
        let mut r = c
            .post(url)
            .bearer_auth(token)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(s) = session {
            r = r.header("mcp-session-id", s);
        }
        r.body(body.to_string()).send()
    };
    let r = post(initialize(), None).await.expect("initialize");
    assert_eq!(r.status().as_u16(), 200);
    let session = r
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .expect("session");
    let _ = r.text().await;
    let r = post(
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        Some(session.clone()),
    )
    .await
    .expect("initialized");
    let _ = r.text().await;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let started = Instant::now();
        let r = post(
            json!({"jsonrpc": "2.0", "id": i + 10, "method": "tools/list"}),
            Some(session.clone()),
        )
        .await
        .expect("tools/list");
        assert_eq!(r.status().as_u16(), 200);
        let text = r.text().await.unwrap_or_default();
        assert!(text.contains("terraform_plan"), "{text}");
        out.push(started.elapsed());
    }
    out
}

/// The fairness figure (README: "One identity cannot take the listener"):
/// bob's `tools/list` p99 alone, then while alice holds her whole share of
/// slow-body connections (opened again as each is cut) and opens sessions
/// as fast as her client can, from one run on one machine. Run by
/// `scripts/fairness.sh`, which prints the figures; it holds the loaded
/// p99 to within 2x of the unloaded one.
#[test]
#[ignore = "a measurement: scripts/fairness.sh runs it"]
fn fairness_while_one_identity_floods() {
    daemon::os_user(daemon::AGENT);
    let t = team("request_timeout_seconds = 30\n");
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let n = 300;
    let c = client(&t.ca);
    let quiet = rt.block_on(tools_list_times(&c, &t.resource, &t.bob, n));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let refused = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut flood = Vec::new();
    // alice's share of connections, each a body of one byte a second.
    let slow: usize = std::env::var("SLOW")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    let loops: usize = std::env::var("LOOPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    for _ in 0..slow {
        let (ca, url, token, stop) = (
            t.ca.clone(),
            t.resource.clone(),
            t.alice.clone(),
            stop.clone(),
        );
        flood.push(rt.spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = tokio::time::timeout(
                    Duration::from_secs(40),
                    slow_post(
                        client(&ca),
                        url.clone(),
                        token.clone(),
                        1000,
                        Duration::from_secs(1),
                    ),
                )
                .await;
            }
        }));
    }
    // Sessions as fast as her client goes (its connections kept alive).
    for _ in 0..loops {
        let (url, token, stop, refused) = (
            t.resource.clone(),
            t.alice.clone(),
            stop.clone(),
            refused.clone(),
        );
        let c = reqwest::Client::builder()
            .add_root_certificate(
                reqwest::Certificate::from_pem(&std::fs::read(&t.ca).expect("ca")).expect("ca"),
            )
            .build()
            .expect("client");
        flood.push(rt.spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(r) = c
                    .post(&url)
                    .bearer_auth(&token)
                    .header("content-type", "application/json")
                    .header("accept", "application/json, text/event-stream")
                    .body(initialize().to_string())
                    .send()
                    .await
                {
                    if r.status().as_u16() == 429 {
                        refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    let _ = r.text().await;
                }
            }
        }));
    }
    std::thread::sleep(Duration::from_secs(3));
    let loaded = rt.block_on(tools_list_times(&c, &t.resource, &t.bob, n));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for f in flood {
        f.abort();
    }
    let (q50, q99) = percentiles(quiet);
    let (l50, l99) = percentiles(loaded);
    let refused = refused.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "FAIRNESS tools/list n={n}: alone p50 {q50:.2} ms p99 {q99:.2} ms; during alice's flood p50 {l50:.2} ms p99 {l99:.2} ms ({:.2}x); alice's sessions refused 429: {refused}",
        l99 / q99
    );
    assert!(refused > 0, "the flood reached alice's session limit");
    assert!(
        l99 <= 2.0 * q99,
        "bob's p99 under alice's flood {l99:.2} ms is over 2x his p99 alone {q99:.2} ms"
    );
}

/// What an idle legacy session costs the daemon: its resident memory
/// before and after 2,000 sessions opened and left idle (the measure in
/// the README; `scripts/fairness.sh` runs it too).
#[test]
#[ignore = "a measurement: scripts/fairness.sh runs it"]
fn memory_of_an_idle_session() {
    daemon::os_user(daemon::AGENT);
    let t = team(
        "max_sessions_per_identity = 5000\nmax_sessions = 5000\nsession_unused_seconds = 300\n",
    );
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let rss = || {
        std::fs::read_to_string(format!("/proc/{}/status", t.d.pid()))
            .expect("status")
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .expect("VmRSS")
    };
    let c = reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(&t.ca).expect("ca")).expect("ca"),
        )
        .build()
        .expect("client");
    let open = |n: usize| {
        rt.block_on(async {
            for _ in 0..n {
                let r = c
                    .post(&t.resource)
                    .bearer_auth(&t.alice)
                    .header("content-type", "application/json")
                    .header("accept", "application/json, text/event-stream")
                    .body(initialize().to_string())
                    .send()
                    .await
                    .expect("initialize");
                assert_eq!(r.status().as_u16(), 200);
                let id = r
                    .headers()
                    .get("mcp-session-id")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
                    .expect("session");
                let _ = r.text().await;
                let r = c
                    .post(&t.resource)
                    .bearer_auth(&t.alice)
                    .header("content-type", "application/json")
                    .header("accept", "application/json, text/event-stream")
                    .header("mcp-session-id", id)
                    .body(
                        json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
                            .to_string(),
                    )
                    .send()
                    .await
                    .expect("initialized");
                let _ = r.text().await;
            }
        })
    };
    // Warm: allocator arenas, TLS, caches.
    open(200);
    std::thread::sleep(Duration::from_secs(1));
    let before = rss();
    let n = 2000;
    open(n);
    std::thread::sleep(Duration::from_secs(1));
    let after = rss();
    let per = (after.saturating_sub(before)) as f64 / n as f64;
    println!(
        "SESSION MEMORY: RSS {before} KiB -> {after} KiB over {n} idle sessions: {per:.1} KiB a session"
    );
    assert!(
        after > before,
        "sessions cost something: {before} -> {after}"
    );
}
