//! The HTTP transport's cost, in one run beside the pipeline it fronts
//! (real policy, real SQLite, real audit file with fsync; TLS with a CA
//! made here; ES256 access tokens verified against an issuer's JWKS served
//! over HTTPS in-process):
//! - `http/pipeline_denied_call`: a k8s_get_pod_status call the policy
//!   denies, straight into the pipeline (what `pipeline/denied_call` is);
//! - `http/denied_call`: the same call over HTTPS from a client with a
//!   valid token (a 2026-07-28 stateless request), request to response;
//! - `http/sessions_200`: 200 clients at once, each its own person and TLS
//!   connection, each listing tools and making the denied call. Prints
//!   each round's p50/p99 request latency and the daemon's resident
//!   memory per client (growth over the round) on stderr.
//!
//! Run as root: `cargo bench --bench http`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use criterion::{Criterion, criterion_group, criterion_main};
use gateway::http::{HttpConfig, HttpServer};
use gateway::pipeline::{Outcome, Pipeline, ToolCall};
use gateway::policy::set::LoadOptions;
use gateway::policy::{PolicyStore, Principal};
use gateway::sandbox::local::{LocalConfig, LocalSandbox};
use gateway::tools::ToolPaths;
use serde_json::{Value, json};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port")
}

/// Serve `body` at every path over HTTPS (the issuer's JWKS).
async fn serve_jwks(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    body: String,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let acceptor = acceptor.clone();
        let body = body.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(stream).await else {
                return;
            };
            let service = hyper::service::service_fn(move |_req| {
                let body = body.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(
                        http_body_util::Full::new(bytes::Bytes::from(body)),
                    ))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await;
        });
    }
}

fn acceptor(cert: &std::path::Path, key: &std::path::Path) -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<_> = CertificateDer::pem_file_iter(cert)
        .expect("cert")
        .collect::<Result<_, _>>()
        .expect("certs");
    let key = PrivateKeyDer::from_pem_file(key).expect("key");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("config");
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn bench(c: &mut Criterion) {
    gateway::quiet_library_backtraces();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let repo = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("dir");
    let home = tempfile::tempdir().expect("home");
    let workspace = tempfile::tempdir().expect("workspace");
    // The default policies, with the per-user rates lifted (a bench makes
    // thousands of calls; 200 people call at once).
    let policies = tempfile::tempdir().expect("policies");
    common::copy_dir(&repo.join("policies"), policies.path());
    let calls = policies.path().join("config/calls/data.yaml");
    let text = std::fs::read_to_string(&calls).expect("calls");
    for from in [
        "\nrunning_per_user: 4\n",
        "\nrunning_total: 8\n",
        "\nper_minute_per_user: 60\n",
    ] {
        assert!(text.contains(from), "the calls table changed: {from}");
    }
    let text = text
        .replace("\nrunning_per_user: 4\n", "\nrunning_per_user: 1000\n")
        .replace("\nrunning_total: 8\n", "\nrunning_total: 100000\n")
        .replace(
            "\nper_minute_per_user: 60\n",
            "\nper_minute_per_user: 1000000000\n",
        );
    std::fs::write(&calls, text).expect("write");
    let policy = Arc::new(PolicyStore::open(
        vec![policies.path().to_path_buf()],
        LoadOptions::default(),
    ));
    let sandbox = Arc::new(LocalSandbox::new(LocalConfig::default()).expect("runsc, as root"));
    let mut tools = ToolPaths::discover(&repo);
    tools.runner = repo.join("target/release/gateway-runner");
    if !tools.runner.is_file() {
        tools.runner = repo.join("target/debug/gateway-runner");
    }
    let pipeline = Arc::new(
        Pipeline::new(
            policy,
            home.path().to_path_buf(),
            workspace.path().to_path_buf(),
            sandbox,
            tools,
        )
        .expect("pipeline"),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("rt");

    // The issuer: an ES256 key, its JWKS served over HTTPS.
    let (ca, cert, key) = common::tls_files(dir.path());
    let signing = rcgen::KeyPair::generate().expect("signing key");
    let point = signing.public_key_raw();
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let jwks = json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "k1", "use": "sig", "alg": "ES256",
        "x": b64(&point[1..33]), "y": b64(&point[33..65])}]});
    let idp_port = free_port();
    let issuer = format!("https://127.0.0.1:{idp_port}");
    {
        let acceptor = acceptor(&cert, &key);
        let body = jwks.to_string();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", idp_port)))
            .expect("bind");
        rt.spawn(serve_jwks(listener, acceptor, body));
    }
    let port = free_port();
    let resource = format!("https://127.0.0.1:{port}/mcp");
    let config: HttpConfig = toml::from_str(&format!(
        "listen = \"127.0.0.1:{port}\"\nresource = {resource:?}\ntls_cert = {cert:?}\ntls_key = {key:?}\nworkspace = {ws:?}\n\
         max_connections_per_address = 1000\n\
         [[issuers]]\nissuer = {issuer:?}\njwks_uri = \"{issuer}/jwks\"\nca_file = {ca:?}\n",
        ws = workspace.path(),
    ))
    .expect("config");
    let stop = tokio_util::sync::CancellationToken::new();
    let server = HttpServer::new(
        &config,
        Arc::clone(&pipeline),
        workspace.path().to_path_buf(),
        gateway::mcp::DEFAULT_HEARTBEAT,
        Arc::new(|_, _| {
            gateway::daemon::wire::Reply::refused("no operator commands in this bench")
        }),
        None,
        stop.clone(),
    )
    .expect("server");
    rt.block_on(async {
        assert!(server.verifier().warm().await.is_empty(), "the JWKS loads");
        let listener = server.bind().await.expect("bind");
        tokio::spawn(Arc::new(server).serve(listener, stop.clone()));
    });
    let encoding =
        jsonwebtoken::EncodingKey::from_ec_pem(signing.serialize_pem().as_bytes()).expect("key");
    let token = |who: &str| {
        let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        h.kid = Some("k1".into());
        h.typ = Some("at+jwt".into());
        let now = chrono::Utc::now().timestamp();
        jsonwebtoken::encode(
            &h,
            &json!({"iss": issuer, "sub": who, "aud": resource, "iat": now, "exp": now + 86_400,
                    "email": format!("{who}@example.com"), "groups": ["developers"]}),
            &encoding,
        )
        .expect("token")
    };
    let pem = std::fs::read(&ca).expect("ca");
    let client = || {
        reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("ca"))
            .build()
            .expect("client")
    };
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"}});
    let request = Request {
        url: resource.clone(),
        meta,
    };
    let principal = Principal::os_user("bench".into(), "bench".into(), 1000, vec![]);

    let mut g = c.benchmark_group("http");
    g.bench_function("pipeline_denied_call", |b| {
        b.iter(|| {
            let r = rt
                .block_on(pipeline.call(ToolCall {
                    trace: None,
                    tool: "k8s_get_pod_status".into(),
                    params: json!({"namespace": "kube-system"}),
                    principal: principal.clone(),
                    workspace: None,
                }))
                .expect("call");
            assert!(matches!(r.outcome, Outcome::Denied { .. }));
        })
    });
    let one = client();
    let alice = token("alice");
    g.bench_function("denied_call", |b| {
        b.iter(|| {
            rt.block_on(async {
                let r = request
                    .send(
                    &one,
                    &alice,
                    "tools/call",
                    Some("k8s_get_pod_status"),
                    json!({"name": "k8s_get_pod_status", "arguments": {"namespace": "kube-system"}}),
                )
                .await
                .expect("request");
                denied(r).await;
            })
        })
    });
    let people: Vec<(reqwest::Client, String)> = (0..200)
        .map(|i| (client(), token(&format!("user{i}"))))
        .collect();
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.bench_function("sessions_200", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let before = rss_bytes();
                let started = Instant::now();
                let mut latencies: Vec<Duration> = rt.block_on(async {
                    let mut set = tokio::task::JoinSet::new();
                    for (c, t) in &people {
                        let (c, t) = (c.clone(), t.clone());
                        let request = request.clone();
                        set.spawn(async move {
                            let t0 = Instant::now();
                            let r = request.send(&c, &t, "tools/list", None, json!({})).await.expect("list");
                            assert!(r.status().is_success(), "{}", r.status());
                            let _ = r.text().await;
                            let l1 = t0.elapsed();
                            let t1 = Instant::now();
                            let r = request
                                .send(
                                &c,
                                &t,
                                "tools/call",
                                Some("k8s_get_pod_status"),
                                json!({"name": "k8s_get_pod_status", "arguments": {"namespace": "kube-system"}}),
                            )
                            .await
                            .expect("call");
                            denied(r).await;
                            [l1, t1.elapsed()]
                        });
                    }
                    let mut all = Vec::new();
                    while let Some(r) = set.join_next().await {
                        all.extend(r.expect("client"));
                    }
                    all
                });
                total += started.elapsed();
                latencies.sort();
                let at = |q: f64| latencies[((latencies.len() as f64 - 1.0) * q) as usize];
                eprintln!(
                    "http/sessions_200: {} requests, p50 {:.1} ms, p99 {:.1} ms, memory growth {} KiB per client",
                    latencies.len(),
                    at(0.50).as_secs_f64() * 1e3,
                    at(0.99).as_secs_f64() * 1e3,
                    rss_bytes().saturating_sub(before) / 200 / 1024
                );
            }
            total
        })
    });
    g.finish();
    stop.cancel();
}

criterion_group!(benches, bench);
criterion_main!(benches);

/// A 2026-07-28 request to the gateway (stateless: its era and client in
/// its `_meta` and headers).
#[derive(Clone)]
struct Request {
    url: String,
    meta: Value,
}

impl Request {
    async fn send(
        &self,
        client: &reqwest::Client,
        token: &str,
        method: &str,
        name: Option<&str>,
        params: Value,
    ) -> reqwest::Result<reqwest::Response> {
        let mut r = client
            .post(&self.url)
            .bearer_auth(token)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", method);
        if let Some(n) = name {
            r = r.header("mcp-name", n);
        }
        let mut params = params;
        params["_meta"] = self.meta.clone();
        r.body(json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string())
            .send()
            .await
    }
}

/// A response that says the policy denied the call.
async fn denied(r: reqwest::Response) {
    let status = r.status();
    let text = r.text().await.expect("body");
    assert!(
        status.is_success() && text.contains("not in the allowlist"),
        "{status}: {text}"
    );
}
