//! Serves an HTTP listener (the gateway, the admin port) with the limits that keep the router
//! answering while hostile or broken clients hold connections open: a cap on open
//! connections, deadlines on the TLS handshake, the request head and the request body, an
//! idle timeout, and a cap on requests per connection. Optional TLS ([`tls`]).
//!
//! ```text
//! accept --open < --max-connections? no: 503 (plain text) + close, refused{connection_limit}
//!   --> [TLS handshake within the head deadline (ALPN h2, http/1.1)]
//!   --> hyper (HTTP/1.1, or h2 with --max-concurrent-streams)
//!   --> each request: ConnectInfo(peer), its body must arrive within --request-body-timeout-s
//!   --> axum Router
//! watchdog per connection: a request head (the first, or an HTTP/1.1 one whose first byte
//!   came) not complete within --request-head-timeout-s --> dropped; no request in flight
//!   for --idle-timeout-s, --max-requests-per-connection served, or shutdown --> graceful
//!   close (h2: GOAWAY), dropped if still open a deadline later
//! ```
//!
//! Every refusal and forced close is counted by a fixed reason (`refused_total`,
//! `connections_closed_total`, label `listener` = gateway | admin).

pub mod tls;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::Bytes;
use http_body::Frame;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// Why a connection or request was refused (the `reason` label of `refused_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `--max-connections` were open.
    ConnectionLimit,
    /// Accepting failed (e.g. out of file descriptors).
    AcceptError,
    /// The TLS handshake failed or did not finish within the head deadline.
    TlsHandshake,
    /// The request head did not arrive within the head deadline (HTTP/1.1).
    HeadTimeout,
    /// The request body did not arrive within the body deadline.
    BodyTimeout,
    /// The body is larger than `--max-body-bytes`.
    BodyTooLarge,
    /// `--max-concurrent-requests` were in flight (503).
    ConcurrencyLimit,
    /// The client's address had `--max-concurrent-requests-per-client` in flight (429).
    ClientConcurrencyLimit,
    /// The routing decision pool was full (503).
    DecisionPoolFull,
}

impl Refusal {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::ConnectionLimit => "connection_limit",
            Refusal::AcceptError => "accept_error",
            Refusal::TlsHandshake => "tls_handshake",
            Refusal::HeadTimeout => "head_timeout",
            Refusal::BodyTimeout => "body_timeout",
            Refusal::BodyTooLarge => "body_too_large",
            Refusal::ConcurrencyLimit => "concurrency_limit",
            Refusal::ClientConcurrencyLimit => "client_concurrency_limit",
            Refusal::DecisionPoolFull => "decision_pool_full",
        }
    }
}

/// Why the router closed a connection that was working (`connections_closed_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Closed {
    Idle,
    MaxRequests,
}

impl Closed {
    fn label(self) -> &'static str {
        match self {
            Closed::Idle => "idle",
            Closed::MaxRequests => "max_requests",
        }
    }
}

/// Counters of the listeners. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ListenerMetrics {
    refused: IntCounterVec,
    closed: IntCounterVec,
    open: IntGaugeVec,
}

impl ListenerMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Self::unregistered()?;
        registry.register(Box::new(m.refused.clone()))?;
        registry.register(Box::new(m.closed.clone()))?;
        registry.register(Box::new(m.open.clone()))?;
        Ok(m)
    }

    /// Metrics that are not exported (tests).
    pub fn unregistered() -> prometheus::Result<Self> {
        Ok(Self {
            refused: IntCounterVec::new(
                Opts::new(
                    "kvroute_router_refused_total",
                    "Connections and requests refused or cut off by admission control, by listener and reason.",
                ),
                &["listener", "reason"],
            )?,
            closed: IntCounterVec::new(
                Opts::new(
                    "kvroute_router_connections_closed_total",
                    "Connections the router closed: idle past the timeout, or at the requests-per-connection cap.",
                ),
                &["listener", "reason"],
            )?,
            open: IntGaugeVec::new(
                Opts::new(
                    "kvroute_router_open_connections",
                    "Open client connections, by listener.",
                ),
                &["listener"],
            )?,
        })
    }

    /// Counts one refusal on `listener`.
    pub fn refuse(&self, listener: &str, why: Refusal) {
        self.refused
            .with_label_values(&[listener, why.label()])
            .inc();
    }

    /// Refusals so far (tests, the attack bench).
    pub fn refused(&self, listener: &str, why: Refusal) -> u64 {
        self.refused
            .with_label_values(&[listener, why.label()])
            .get()
    }

    /// Open connections now.
    pub fn open(&self, listener: &str) -> i64 {
        self.open.with_label_values(&[listener]).get()
    }

    fn close(&self, listener: &str, why: Closed) {
        self.closed
            .with_label_values(&[listener, why.label()])
            .inc();
    }
}

/// Limits of one listener.
#[derive(Clone, Debug)]
pub struct ListenerConfig {
    /// `gateway` or `admin`: the `listener` label.
    pub name: &'static str,
    /// Open connections at most; more are refused at once.
    pub max_connections: usize,
    /// The TLS handshake and each HTTP/1.1 request head must arrive within this.
    pub head_timeout: Duration,
    /// Each request body must arrive within this, from the request's start.
    pub body_timeout: Duration,
    /// A connection with no request in flight for this long is closed.
    pub idle_timeout: Duration,
    /// Requests served on one connection before it is closed gracefully (0: no cap).
    pub max_requests_per_connection: u64,
    /// Concurrent HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
}

impl ListenerConfig {
    /// The flag defaults for a listener named `name`.
    pub fn defaults(name: &'static str) -> Self {
        Self {
            name,
            max_connections: 4096,
            head_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(120),
            max_requests_per_connection: 10_000,
            max_concurrent_streams: 128,
        }
    }
}

/// The body did not arrive within the body deadline (the error a handler sees reading it).
#[derive(Clone, Copy, Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
pub struct BodyTimedOut;

/// True when `err` (from reading a request body) is the body deadline passing.
pub fn is_body_timeout(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if e.is::<BodyTimedOut>() {
            return true;
        }
        cur = e.source();
    }
    false
}

/// Everything a connection task needs.
struct Shared {
    app: axum::Router,
    cfg: ListenerConfig,
    tls: Option<tls::Acceptor>,
    metrics: ListenerMetrics,
    stop: CancellationToken,
    builder: auto::Builder<TokioExecutor>,
}

/// Serves `app` on `listener` until `stop` fires, then lets open connections finish their
/// requests (HTTP/1.1: close after the response; HTTP/2: GOAWAY) and returns when all closed.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    cfg: ListenerConfig,
    tls: Option<tls::Acceptor>,
    metrics: ListenerMetrics,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let max = cfg.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let permits = u32::try_from(max).unwrap_or(u32::MAX);
    let slots = Arc::new(Semaphore::new(permits as usize));
    // Deadlines are the connection watchdog's (serve_io), not hyper's: hyper's head timer
    // also runs between keep-alive requests, which would make every idle HTTP/1.1
    // connection look like a slow-loris after the head deadline.
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().header_read_timeout(None).keep_alive(true);
    builder
        .http2()
        .max_concurrent_streams(cfg.max_concurrent_streams)
        .keep_alive_interval(None);
    let name = cfg.name;
    let shared = Arc::new(Shared {
        app,
        cfg,
        tls,
        metrics,
        stop: stop.clone(),
        builder,
    });
    loop {
        let accepted = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            r = listener.accept() => r,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // EMFILE and friends: pause so the loop does not spin; others may free fds.
                shared.metrics.refuse(name, Refusal::AcceptError);
                tracing::warn!(listener = name, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            shared.metrics.refuse(name, Refusal::ConnectionLimit);
            if shared.tls.is_none() {
                // Best effort, without waiting: the socket's send buffer is empty.
                let _ = tcp.try_write(BUSY);
            }
            drop(tcp);
            continue;
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        tokio::spawn(connection(shared.clone(), tcp, peer, slot));
    }
    drop(listener);
    // Every connection holds a slot until it ends.
    let _all = slots.acquire_many(permits).await;
    Ok(())
}

/// What a client over the connection cap reads before the router closes.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\ncontent-type: text/plain\r\ncontent-length: 31\r\nconnection: close\r\n\r\ntoo many connections; retry later";

async fn connection(
    shared: Arc<Shared>,
    tcp: TcpStream,
    peer: SocketAddr,
    slot: OwnedSemaphorePermit,
) {
    let _slot = slot;
    let name = shared.cfg.name;
    let open = shared.metrics.open.with_label_values(&[name]);
    open.inc();
    match &shared.tls {
        None => serve_io(&shared, tcp, peer).await,
        Some(acceptor) => {
            let handshake = tokio::select! {
                biased;
                () = shared.stop.cancelled() => None,
                r = tokio::time::timeout(shared.cfg.head_timeout, acceptor.accept(tcp)) => Some(r),
            };
            match handshake {
                Some(Ok(Ok(stream))) => serve_io(&shared, stream, peer).await,
                Some(Ok(Err(e))) => {
                    tracing::debug!(listener = name, %peer, error = %e, "TLS handshake failed");
                    shared.metrics.refuse(name, Refusal::TlsHandshake);
                }
                Some(Err(_)) => shared.metrics.refuse(name, Refusal::TlsHandshake),
                None => {}
            }
        }
    }
    open.dec();
}

/// Milliseconds value meaning "no head is being read".
const NO_HEAD: u64 = u64::MAX;

/// What one connection is doing, as its watchdog sees it: requests in flight, when the last
/// one ended, and whether an HTTP/1.1 request head has started to arrive.
struct Activity {
    in_flight: AtomicUsize,
    /// Milliseconds since `base` when the last request ended (or the connection opened).
    last_ms: AtomicU64,
    /// Milliseconds since `base` of the first byte of a request head not yet complete
    /// (HTTP/1.1 only), or [`NO_HEAD`].
    head_ms: AtomicU64,
    base: Instant,
    served: AtomicU64,
    max_requests: u64,
    limit_reached: Notify,
    /// Wakes the watchdog: a request started or ended, or a head started.
    changed: Notify,
    /// The first bytes sniffed: 0 undecided, 1 HTTP/1.1, 2 HTTP/2 (frames arrive between
    /// requests, so bytes say nothing about heads).
    proto: AtomicU8,
    sniffed: parking_lot::Mutex<Vec<u8>>,
}

/// Why the watchdog ends a connection.
enum Expired {
    /// No complete request head within the head deadline: never sent one, or one started
    /// and did not finish.
    Head,
    /// No request in flight for the idle timeout.
    Idle,
}

impl Activity {
    fn new(max_requests: u64) -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
            head_ms: AtomicU64::new(NO_HEAD),
            base: Instant::now(),
            served: AtomicU64::new(0),
            max_requests,
            limit_reached: Notify::new(),
            changed: Notify::new(),
            proto: AtomicU8::new(0),
            sniffed: parking_lot::Mutex::new(Vec::new()),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(NO_HEAD - 1)
    }

    fn at(&self, ms: u64) -> Instant {
        self.base + Duration::from_millis(ms)
    }

    /// Bytes came from the client.
    fn received(&self, bytes: &[u8]) {
        if self.proto.load(Ordering::Relaxed) == 0 {
            let mut seen = self.sniffed.lock();
            let room = 3usize.saturating_sub(seen.len());
            seen.extend(bytes.iter().take(room));
            if seen.len() >= 3 || !b"PRI".starts_with(&seen) {
                let h2 = seen.as_slice() == b"PRI";
                self.proto.store(if h2 { 2 } else { 1 }, Ordering::Relaxed);
            }
        }
        if self.proto.load(Ordering::Relaxed) != 2
            && self.in_flight.load(Ordering::Relaxed) == 0
            && self
                .head_ms
                .compare_exchange(NO_HEAD, self.now_ms(), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.changed.notify_one();
        }
    }

    /// Resolves when the connection has been without a request too long.
    async fn expired(&self, head: Duration, idle: Duration) -> Expired {
        loop {
            if self.in_flight.load(Ordering::Relaxed) > 0 {
                self.changed.notified().await;
                continue;
            }
            let started = self.head_ms.load(Ordering::Relaxed);
            let (deadline, why) = if started != NO_HEAD {
                (self.at(started) + head, Expired::Head)
            } else if self.served.load(Ordering::Relaxed) == 0 {
                (self.base + head, Expired::Head)
            } else {
                (
                    self.at(self.last_ms.load(Ordering::Relaxed)) + idle,
                    Expired::Idle,
                )
            };
            if deadline <= Instant::now() {
                return why;
            }
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {}
                () = self.changed.notified() => {}
            }
        }
    }
}

/// The client's stream, telling [`Activity`] when bytes arrive.
struct Watched<I> {
    inner: I,
    activity: Arc<Activity>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &r
            && let Some(got) = buf.filled().get(before..)
            && !got.is_empty()
        {
            self.activity.received(got);
        }
        r
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Held from a request's start until its response body ends or is dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(a: &Arc<Activity>) -> Self {
        a.in_flight.fetch_add(1, Ordering::Relaxed);
        a.head_ms.store(NO_HEAD, Ordering::Relaxed);
        let served = a.served.fetch_add(1, Ordering::Relaxed) + 1;
        if a.max_requests > 0 && served == a.max_requests {
            a.limit_reached.notify_one();
        }
        a.changed.notify_one();
        Self(a.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        a.last_ms.store(a.now_ms(), Ordering::Relaxed);
        a.in_flight.fetch_sub(1, Ordering::Relaxed);
        a.changed.notify_one();
    }
}

async fn serve_io<I>(shared: &Arc<Shared>, io: I, peer: SocketAddr)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let name = shared.cfg.name;
    let activity = Arc::new(Activity::new(shared.cfg.max_requests_per_connection));
    let io = Watched {
        inner: io,
        activity: activity.clone(),
    };
    let service = {
        let (shared, activity) = (shared.clone(), activity.clone());
        hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            let (shared, activity) = (shared.clone(), activity.clone());
            async move { Ok::<_, Infallible>(handle(&shared, &activity, peer, req).await) }
        })
    };
    let conn = shared.builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    // Once closing gracefully, the connection gets a deadline to finish, then is dropped.
    let mut closing: Option<Instant> = None;
    loop {
        let hard_stop = async {
            match closing {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = conn.as_mut() => break,
            () = shared.stop.cancelled(), if closing.is_none() => {
                conn.as_mut().graceful_shutdown();
                closing = Some(Instant::now() + shared.cfg.idle_timeout);
            }
            () = activity.limit_reached.notified(), if closing.is_none() => {
                shared.metrics.close(name, Closed::MaxRequests);
                conn.as_mut().graceful_shutdown();
                closing = Some(Instant::now() + shared.cfg.idle_timeout);
            }
            why = activity.expired(shared.cfg.head_timeout, shared.cfg.idle_timeout), if closing.is_none() => {
                match why {
                    Expired::Head => {
                        // Nothing in flight to finish: an idle or slow-loris client.
                        shared.metrics.refuse(name, Refusal::HeadTimeout);
                        break;
                    }
                    Expired::Idle => {
                        shared.metrics.close(name, Closed::Idle);
                        conn.as_mut().graceful_shutdown();
                        closing = Some(Instant::now() + shared.cfg.head_timeout);
                    }
                }
            }
            () = hard_stop => break,
        }
    }
}

async fn handle(
    shared: &Arc<Shared>,
    activity: &Arc<Activity>,
    peer: SocketAddr,
    req: hyper::Request<Incoming>,
) -> axum::response::Response {
    let in_flight = InFlight::start(activity);
    let deadline = Instant::now() + shared.cfg.body_timeout;
    let (mut parts, body) = req.into_parts();
    parts.extensions.insert(ConnectInfo(peer));
    let body = Body::new(DeadlineBody {
        inner: body,
        deadline: Box::pin(tokio::time::sleep_until(deadline)),
        metrics: shared.metrics.clone(),
        listener: shared.cfg.name,
        timed_out: false,
    });
    let req = axum::http::Request::from_parts(parts, body);
    // The Router's error type is Infallible.
    let resp = match shared.app.clone().oneshot(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let (parts, body) = resp.into_parts();
    axum::response::Response::from_parts(
        parts,
        Body::new(Guarded {
            inner: body,
            _guard: in_flight,
        }),
    )
}

/// A request body that fails with [`BodyTimedOut`] once its deadline passes.
struct DeadlineBody {
    inner: Incoming,
    deadline: Pin<Box<Sleep>>,
    metrics: ListenerMetrics,
    listener: &'static str,
    timed_out: bool,
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.timed_out {
            return Poll::Ready(Some(Err(Box::new(BodyTimedOut))));
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(r) => Poll::Ready(r.map(|f| f.map_err(Into::into))),
            Poll::Pending => {
                if self.deadline.as_mut().poll(cx).is_ready() {
                    self.timed_out = true;
                    self.metrics.refuse(self.listener, Refusal::BodyTimeout);
                    return Poll::Ready(Some(Err(Box::new(BodyTimedOut))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that holds `_guard` until it ends or is dropped.
pub(crate) struct Guarded<G> {
    pub(crate) inner: Body,
    pub(crate) _guard: G,
}

impl<G: Send + Unpin + 'static> http_body::Body for Guarded<G> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
