//! `/metrics`: the daemon's Prometheus metrics ([`gateway_telemetry`]), on
//! the MCP listener or on an address of its own (`[telemetry]
//! metrics_listen`, plain HTTP, nothing else served there).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::http::{HeaderValue, Method, Response, StatusCode, header};
use tokio_util::sync::CancellationToken;

use gateway_core::pipeline::Pipeline;

type Body = BoxBody<Bytes, Infallible>;

/// How long a scrape's text is reused: scrapers that come faster, or many
/// at once, cost the store one count in this time.
const SCRAPE_REUSE: std::time::Duration = std::time::Duration::from_secs(5);

/// The last scrape's text and when it was made (one made at a time).
static LAST: tokio::sync::Mutex<Option<(std::time::Instant, String)>> =
    tokio::sync::Mutex::const_new(None);

/// Connections the metrics address serves at once.
const MAX_CONNECTIONS: usize = 16;

/// The answer to a scrape: the approvals in the store are counted (off
/// the async threads: the store may be a database across the network),
/// then every metric is written out; the text is reused for
/// [`SCRAPE_REUSE`].
pub async fn scrape(method: &Method, pipeline: Arc<Pipeline>) -> Response<Body> {
    if method != Method::GET && method != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "GET only\n".into(),
            "text/plain",
        );
    }
    let mut last = LAST.lock().await;
    let body = match last.as_ref() {
        Some((at, body)) if at.elapsed() < SCRAPE_REUSE => body.clone(),
        _ => {
            let body = tokio::task::spawn_blocking(move || pipeline.metrics_text())
                .await
                .unwrap_or_default();
            *last = Some((std::time::Instant::now(), body.clone()));
            body
        }
    };
    drop(last);
    text(
        StatusCode::OK,
        body,
        gateway_telemetry::metrics::CONTENT_TYPE,
    )
}

fn text(status: StatusCode, body: String, content_type: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// Bind `listen` for `/metrics` alone.
pub async fn bind(listen: &str) -> Result<tokio::net::TcpListener, String> {
    let addr: SocketAddr = listen
        .parse()
        .map_err(|e| format!("[telemetry] metrics_listen {listen:?}: {e} (ADDRESS:PORT)"))?;
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("[telemetry] metrics_listen {addr}: {e}"))
}

/// Serve `/metrics` on `listener` until `stop`; every other path is 404.
/// A scrape is small and quick: each connection gets 10 s.
pub async fn serve(
    listener: tokio::net::TcpListener,
    pipeline: Arc<Pipeline>,
    stop: CancellationToken,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => return,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("metrics listener: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let pipeline = Arc::clone(&pipeline);
        tokio::spawn(async move {
            let _slot = slot;
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let pipeline = Arc::clone(&pipeline);
                    async move {
                        Ok::<_, Infallible>(if req.uri().path() == "/metrics" {
                            scrape(req.method(), pipeline).await
                        } else {
                            text(StatusCode::NOT_FOUND, "not found\n".into(), "text/plain")
                        })
                    }
                });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let _ = tokio::time::timeout(std::time::Duration::from_secs(10), conn).await;
        });
    }
}
