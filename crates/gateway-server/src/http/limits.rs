//! What one identity may hold of the HTTP transport, so that a greedy or
//! hostile token (any team member's or agent's) cannot take the gateway
//! from everyone else: connections it has authenticated on, requests in
//! flight, legacy MCP sessions; and the time a request's body may take.
//!
//! An identity is a verified principal ([`gateway_policy::Principal::id`]),
//! whatever addresses it comes from. Each limit is counted here, under one
//! lock, and released by a guard's drop (a connection's end, a response's
//! last byte, a session's close), so that nothing is counted forever. The
//! sessions are this table's: it decides when an idle one is closed (a
//! session that never went past its handshake sooner) and closes it in
//! rmcp's session manager too, so the two never disagree.

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Frame, SizeHint};

/// The settings ([`gateway_core::config::http::HttpConfig`]).
#[derive(Debug, Clone)]
pub struct Quotas {
    pub request_timeout: Duration,
    pub connections_per_identity: usize,
    pub requests_per_identity: usize,
    pub sessions_per_identity: usize,
    pub sessions: usize,
    pub session_idle: Duration,
    pub session_unused: Duration,
}

/// A legacy session: whose, and how it is used.
#[derive(Debug)]
struct Session {
    owner: String,
    last_seen: Instant,
    /// Requests made on it (its handshake is two).
    requests: u64,
    /// Requests (and streams) open on it now.
    in_flight: usize,
}

#[derive(Debug, Default)]
struct Counts {
    conns: HashMap<String, usize>,
    requests: HashMap<String, usize>,
    /// Sessions per identity, those being opened included.
    sessions_of: HashMap<String, usize>,
    /// Sessions being opened (counted, not yet named by rmcp).
    opening: usize,
    sessions: HashMap<String, Session>,
}

/// A limit reached: which, and when to try again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Over {
    /// The metric's label (`connections_per_identity`, …).
    pub limit: &'static str,
    pub reason: String,
    pub retry_after: Duration,
}

/// The table of one listener.
#[derive(Debug)]
pub struct Limits {
    pub quotas: Quotas,
    counts: Mutex<Counts>,
}

fn dec(map: &mut HashMap<String, usize>, key: &str) {
    if let Some(n) = map.get_mut(key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            map.remove(key);
        }
    }
}

impl Limits {
    pub fn new(quotas: Quotas) -> Limits {
        Limits {
            quotas,
            counts: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The sessions gauge, from the table as it is now.
    fn gauge(c: &Counts) {
        gateway_telemetry::metrics().set_http_sessions(c.sessions.len());
    }

    /// Sessions open (or being opened) now.
    pub fn sessions_open(&self) -> usize {
        let c = self.lock();
        c.sessions.len() + c.opening
    }

    /// The identity that owns session `id`, if it is open.
    pub fn owner(&self, id: &str) -> Option<String> {
        self.lock().sessions.get(id).map(|s| s.owner.clone())
    }

    /// A request of `who` begins (on session `session`, which must be
    /// theirs: checked by the caller): counted until the guard drops.
    pub fn begin_request(
        self: &Arc<Self>,
        who: &str,
        session: Option<&str>,
    ) -> Result<RequestGuard, Over> {
        let mut c = self.lock();
        let n = c.requests.get(who).copied().unwrap_or(0);
        if n >= self.quotas.requests_per_identity {
            return Err(Over {
                limit: "requests_per_identity",
                reason: format!(
                    "you have {n} requests in flight, the most one identity may have ([http] max_requests_per_identity); wait for one to end"
                ),
                retry_after: Duration::from_secs(1),
            });
        }
        *c.requests.entry(who.to_string()).or_insert(0) += 1;
        if let Some(s) = session.and_then(|id| c.sessions.get_mut(id)) {
            s.in_flight += 1;
            s.requests += 1;
            s.last_seen = Instant::now();
        }
        Ok(RequestGuard {
            limits: Arc::clone(self),
            who: who.to_string(),
            session: session.map(str::to_string),
        })
    }

    /// `who` opens a new legacy session: counted now (so that a burst
    /// cannot pass the limit between checks), named by
    /// [`Opening::opened`] once rmcp has made it.
    pub fn open_session(self: &Arc<Self>, who: &str) -> Result<Opening, Over> {
        let mut c = self.lock();
        let total = c.sessions.len() + c.opening;
        let mine = c.sessions_of.get(who).copied().unwrap_or(0);
        if mine >= self.quotas.sessions_per_identity {
            // When the oldest idle one of theirs will be closed.
            let now = Instant::now();
            let soonest = c
                .sessions
                .values()
                .filter(|s| s.owner == who && s.in_flight == 0)
                .map(|s| self.idle_limit(s).saturating_sub(now - s.last_seen))
                .min()
                .unwrap_or(self.quotas.session_unused);
            return Err(Over {
                limit: "sessions_per_identity",
                reason: format!(
                    "you have {mine} MCP sessions open, the most one identity may have ([http] max_sessions_per_identity): end one (DELETE) or let an idle one close"
                ),
                retry_after: soonest.max(Duration::from_secs(1)),
            });
        }
        if total >= self.quotas.sessions {
            return Err(Over {
                limit: "sessions",
                reason: format!(
                    "the gateway holds {total} MCP sessions, the most it keeps ([http] max_sessions); try again shortly"
                ),
                retry_after: self.quotas.session_unused.max(Duration::from_secs(1)),
            });
        }
        c.opening += 1;
        *c.sessions_of.entry(who.to_string()).or_insert(0) += 1;
        Ok(Opening {
            limits: Arc::clone(self),
            who: who.to_string(),
            done: false,
        })
    }

    fn idle_limit(&self, s: &Session) -> Duration {
        if s.requests <= 2 {
            self.quotas.session_unused
        } else {
            self.quotas.session_idle
        }
    }

    /// Session `id` ended (DELETE, or rmcp no longer knows it).
    pub fn session_ended(&self, id: &str) {
        let mut c = self.lock();
        if let Some(s) = c.sessions.remove(id) {
            dec(&mut c.sessions_of, &s.owner);
        }
        Limits::gauge(&c);
    }

    /// The sessions idle past their limit, with nothing in flight: taken
    /// out of the table (the caller closes them in rmcp).
    pub fn take_idle(&self) -> Vec<String> {
        let now = Instant::now();
        let mut c = self.lock();
        let idle: Vec<String> = c
            .sessions
            .iter()
            .filter(|(_, s)| s.in_flight == 0 && now - s.last_seen >= self.idle_limit(s))
            .map(|(id, _)| id.clone())
            .collect();
        for id in &idle {
            if let Some(s) = c.sessions.remove(id) {
                dec(&mut c.sessions_of, &s.owner);
            }
        }
        Limits::gauge(&c);
        idle
    }

    /// A connection authenticated as `who` for the first time: counted
    /// until it closes; refused over the identity's limit.
    fn claim_connection(&self, who: &str) -> Result<(), Over> {
        let mut c = self.lock();
        let n = c.conns.get(who).copied().unwrap_or(0);
        if n >= self.quotas.connections_per_identity {
            return Err(Over {
                limit: "connections_per_identity",
                reason: format!(
                    "you hold {n} connections, the most one identity may hold ([http] max_connections_per_identity); reuse them or close some"
                ),
                retry_after: Duration::from_secs(1),
            });
        }
        *c.conns.entry(who.to_string()).or_insert(0) += 1;
        Ok(())
    }

    fn release_connection(&self, who: &str) {
        dec(&mut self.lock().conns, who);
    }
}

/// One request in flight, counted until dropped (kept by the response's
/// body, so a streamed answer counts until its end).
#[derive(Debug)]
pub struct RequestGuard {
    limits: Arc<Limits>,
    who: String,
    session: Option<String>,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let mut c = self.limits.lock();
        dec(&mut c.requests, &self.who);
        if let Some(s) = self.session.as_ref().and_then(|id| c.sessions.get_mut(id)) {
            s.in_flight = s.in_flight.saturating_sub(1);
            s.last_seen = Instant::now();
        }
    }
}

/// A session being opened; released unless [`Opening::opened`].
#[derive(Debug)]
pub struct Opening {
    limits: Arc<Limits>,
    who: String,
    done: bool,
}

impl Opening {
    /// rmcp made session `id` for this request.
    pub fn opened(mut self, id: &str) {
        let mut c = self.limits.lock();
        c.opening = c.opening.saturating_sub(1);
        c.sessions.insert(
            id.to_string(),
            Session {
                owner: self.who.clone(),
                last_seen: Instant::now(),
                // Its initialize.
                requests: 1,
                in_flight: 0,
            },
        );
        Limits::gauge(&c);
        self.done = true;
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut c = self.limits.lock();
        c.opening = c.opening.saturating_sub(1);
        dec(&mut c.sessions_of, &self.who);
    }
}

/// One connection: the identity it first authenticated as, counted
/// against that identity until the connection ends.
#[derive(Debug)]
pub struct ConnTag {
    limits: Arc<Limits>,
    who: Mutex<Option<String>>,
}

impl ConnTag {
    pub fn new(limits: &Arc<Limits>) -> ConnTag {
        ConnTag {
            limits: Arc::clone(limits),
            who: Mutex::new(None),
        }
    }

    /// A request on this connection authenticated as `who`. The first
    /// identity counts the connection; another identity on the same
    /// connection later is not counted again.
    pub fn claim(&self, who: &str) -> Result<(), Over> {
        let mut mine = self.who.lock().unwrap_or_else(|p| p.into_inner());
        if mine.is_some() {
            return Ok(());
        }
        self.limits.claim_connection(who)?;
        *mine = Some(who.to_string());
        Ok(())
    }
}

impl Drop for ConnTag {
    fn drop(&mut self) {
        let who = self.who.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(who) = who {
            self.limits.release_connection(&who);
        }
    }
}

/// Why a body could not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    /// Not complete by the request's deadline.
    TooSlow,
    /// Larger than the limit.
    TooLarge,
    /// The client broke it off.
    Broken(String),
}

/// The whole body of a request, at most `limit` bytes, by `deadline`.
pub async fn read_body<B>(
    body: B,
    limit: usize,
    deadline: tokio::time::Instant,
) -> Result<Bytes, BodyError>
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let limited = http_body_util::Limited::new(body, limit);
    match tokio::time::timeout_at(deadline, limited.collect()).await {
        Err(_) => Err(BodyError::TooSlow),
        Ok(Ok(b)) => Ok(b.to_bytes()),
        Ok(Err(e)) => {
            // The layers' errors arrive wrapped (axum's body error, boxed):
            // each cause is looked at.
            let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e.as_ref());
            while let Some(c) = cause {
                if c.is::<http_body_util::LengthLimitError>() {
                    return Err(BodyError::TooLarge);
                }
                if c.is::<tower_http::timeout::TimeoutError>() {
                    return Err(BodyError::TooSlow);
                }
                cause = c.source();
            }
            Err(BodyError::Broken(e.to_string()))
        }
    }
}

/// A response body that holds `held` until it is dropped (its last byte
/// sent, or the client gone).
pub struct Held<B> {
    inner: B,
    _held: Box<dyn Send + Sync>,
}

impl<B> Held<B> {
    pub fn new(inner: B, held: impl Send + Sync + 'static) -> Held<B> {
        Held {
            inner,
            _held: Box::new(held),
        }
    }
}

impl<B> hyper::body::Body for Held<B>
where
    B: hyper::body::Body<Data = Bytes, Error = Infallible> + Unpin,
{
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(per: usize) -> Arc<Limits> {
        Arc::new(Limits::new(Quotas {
            request_timeout: Duration::from_secs(30),
            connections_per_identity: per,
            requests_per_identity: per,
            sessions_per_identity: per,
            sessions: 3 * per,
            session_idle: Duration::from_secs(300),
            session_unused: Duration::from_millis(50),
        }))
    }

    /// A body as the routes get it: a stream, under tower-http's
    /// stall timeout, inside axum's body.
    fn routed(chunks: Vec<&'static [u8]>, then_stall: bool, stall: Duration) -> axum::body::Body {
        let frames = futures::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, std::io::Error>(hyper::body::Frame::data(Bytes::from_static(c)))),
        );
        let body = http_body_util::StreamBody::new(if then_stall {
            futures::StreamExt::boxed(futures::StreamExt::chain(
                frames,
                futures::stream::pending(),
            ))
        } else {
            futures::StreamExt::boxed(frames)
        });
        axum::body::Body::new(tower_http::timeout::TimeoutBody::new(stall, body))
    }

    #[tokio::test]
    async fn a_body_is_judged_by_what_cut_it_through_the_layers_wrapping() {
        let far = tokio::time::Instant::now() + Duration::from_secs(30);
        // Whole and within the limit.
        let b = read_body(
            routed(vec![b"ab", b"cd"], false, Duration::from_secs(5)),
            4,
            far,
        )
        .await
        .expect("read");
        assert_eq!(&b[..], b"abcd");
        // Past the limit while streaming: too large, not "broken off".
        let e = read_body(
            routed(vec![b"ab", b"cde"], false, Duration::from_secs(5)),
            4,
            far,
        )
        .await
        .expect_err("over");
        assert!(matches!(e, BodyError::TooLarge), "{e:?}");
        // Stalled past the layer's timeout: too slow, not "broken off".
        let e = read_body(routed(vec![b"a"], true, Duration::from_millis(50)), 4, far)
            .await
            .expect_err("stalled");
        assert!(matches!(e, BodyError::TooSlow), "{e:?}");
        // Crawling within the layer's timeout but past the whole deadline.
        let soon = tokio::time::Instant::now() + Duration::from_millis(100);
        let e = read_body(routed(vec![b"a"], true, Duration::from_secs(5)), 4, soon)
            .await
            .expect_err("deadline");
        assert!(matches!(e, BodyError::TooSlow), "{e:?}");
    }

    #[test]
    fn each_identity_has_its_own_share_and_guards_give_it_back() {
        let l = limits(2);
        let a1 = ConnTag::new(&l);
        let a2 = ConnTag::new(&l);
        let a3 = ConnTag::new(&l);
        a1.claim("alice").expect("1");
        a1.claim("alice").expect("the same connection again");
        a2.claim("alice").expect("2");
        let over = a3.claim("alice").expect_err("3");
        assert_eq!(over.limit, "connections_per_identity");
        ConnTag::new(&l).claim("bob").expect("bob has his own");
        drop(a1);
        a3.claim("alice").expect("given back");

        let r1 = l.begin_request("alice", None).expect("1");
        let _r2 = l.begin_request("alice", None).expect("2");
        assert_eq!(
            l.begin_request("alice", None).expect_err("3").limit,
            "requests_per_identity"
        );
        drop(r1);
        l.begin_request("alice", None).expect("given back");
    }

    #[test]
    fn sessions_are_bounded_per_identity_and_unused_ones_close_first() {
        let l = limits(2);
        let o1 = l.open_session("alice").expect("1");
        let o2 = l.open_session("alice").expect("2");
        assert_eq!(
            l.open_session("alice").expect_err("3").limit,
            "sessions_per_identity"
        );
        drop(o2);
        let o2 = l
            .open_session("alice")
            .expect("an abandoned opening is given back");
        o1.opened("s1");
        o2.opened("s2");
        assert_eq!(l.owner("s1").as_deref(), Some("alice"));
        // s2 is used past its handshake and has a request open.
        let g = l.begin_request("alice", Some("s2")).expect("r");
        let _ = l.begin_request("alice", Some("s2")).expect("r");
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(l.take_idle(), vec!["s1".to_string()]);
        drop(g);
        assert!(
            l.take_idle().is_empty(),
            "a used session has the long limit"
        );
        assert_eq!(l.sessions_open(), 1);
        l.session_ended("s2");
        assert_eq!(l.sessions_open(), 0);
        l.open_session("alice").expect("room again").opened("s3");
    }

    #[test]
    fn the_whole_gateway_has_a_cap_on_sessions_too() {
        let l = limits(2);
        for who in ["a", "b", "c"] {
            for i in 0..2 {
                l.open_session(who)
                    .expect("open")
                    .opened(&format!("{who}{i}"));
            }
        }
        assert_eq!(l.open_session("d").expect_err("full").limit, "sessions");
    }

    #[tokio::test]
    async fn a_slow_body_is_cut_at_its_deadline_and_a_large_one_at_its_size() {
        // One byte every 20 ms, a hundred of them: past a 100 ms deadline.
        let slow = futures::stream::unfold(0u32, |i| async move {
            if i == 100 {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            Some((
                Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(b"x"))),
                i + 1,
            ))
        });
        let body = http_body_util::StreamBody::new(Box::pin(slow));
        let deadline = tokio::time::Instant::now() + Duration::from_millis(100);
        assert_eq!(
            read_body(body, 1 << 20, deadline).await,
            Err(BodyError::TooSlow)
        );
        let full = http_body_util::Full::new(Bytes::from(vec![0u8; 100]));
        let far = tokio::time::Instant::now() + Duration::from_secs(5);
        assert_eq!(read_body(full, 10, far).await, Err(BodyError::TooLarge));
        let full = http_body_util::Full::new(Bytes::from(vec![0u8; 10]));
        assert_eq!(read_body(full, 10, far).await.map(|b| b.len()), Ok(10));
    }
}
