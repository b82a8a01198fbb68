//! Admission control of a whole router over loopback (127.0.0.1:0): hostile clients on the
//! gateway (slow-loris heads and bodies, a flood of 10 MB bodies, thousands of idle
//! connections) are cut off by their deadlines and caps, each refusal is counted, and the
//! router keeps answering. Bounded in count and time; every wait has a generous deadline and
//! nothing asserts how fast anything was (`kvroute bench --mode attack` measures that).

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use kvroute_router::{Addrs, Args, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// Longest any step may take before the test fails (never reached when things work).
const DEADLINE: Duration = Duration::from_secs(60);

/// A router on loopback, stopped when dropped.
struct Router {
    addrs: Addrs,
    stop: CancellationToken,
}

impl Drop for Router {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn start(edit: impl FnOnce(&mut Args)) -> Router {
    let mut args = Args {
        http_addr: "127.0.0.1:0".parse().expect("addr"),
        grpc_addr: "127.0.0.1:0".parse().expect("addr"),
        admin_addr: "127.0.0.1:0".parse().expect("addr"),
        route_unlisted: true,
        seed: Some(7),
        ..Args::default()
    };
    edit(&mut args);
    let server = Server::bind(args).await.expect("bind router");
    let addrs = server.addrs().expect("addrs");
    let stop = CancellationToken::new();
    tokio::spawn(server.serve(stop.clone()));
    Router { addrs, stop }
}

/// The value of one series in the router's `/metrics`, 0 when absent.
async fn metric(r: &Router, series: &str) -> f64 {
    let text = reqwest::get(format!("http://{}/metrics", r.addrs.admin))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

fn refused(reason: &str) -> String {
    format!("kvroute_router_refused_total{{listener=\"gateway\",reason=\"{reason}\"}}")
}

/// Waits until `series` reaches `at_least`.
async fn metric_reaches(r: &Router, series: &str, at_least: f64) {
    let end = Instant::now() + DEADLINE;
    loop {
        let v = metric(r, series).await;
        if v >= at_least {
            return;
        }
        assert!(Instant::now() < end, "{series} stayed at {v} < {at_least}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads until the peer closes (Ok) or the deadline passes (Err); returns what was read.
async fn read_to_close(tcp: &mut TcpStream) -> Result<Vec<u8>, Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let end = Instant::now() + DEADLINE;
    loop {
        match tokio::time::timeout_at(end, tcp.read(&mut buf)).await {
            Err(_) => return Err(out),
            Ok(Ok(0) | Err(_)) => return Ok(out),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

async fn healthz(r: &Router) -> StatusCode {
    let client = reqwest::Client::builder()
        .timeout(DEADLINE)
        .build()
        .expect("client");
    client
        .get(format!("http://{}/healthz", r.addrs.admin))
        .send()
        .await
        .expect("healthz")
        .status()
}

#[tokio::test]
async fn slow_loris_heads_are_closed_after_the_deadline_and_counted() {
    let r = start(|a| a.request_head_timeout_s = 1.0).await;
    // One trickles its head a byte at a time; one connects and sends nothing.
    let mut trickler = TcpStream::connect(r.addrs.http).await.expect("connect");
    let mut silent = TcpStream::connect(r.addrs.http).await.expect("connect");
    trickler
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        .await
        .expect("write");
    // Once the router closed, a write fails (the peer answers data with a reset).
    let trickle = async {
        for _ in 0..600 {
            if trickler.write_all(b"x").await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    };
    let (trickler_closed, silent_closed) = tokio::join!(trickle, read_to_close(&mut silent));
    assert!(trickler_closed, "the trickling client was never closed");
    assert!(silent_closed.is_ok(), "the silent client was never closed");
    metric_reaches(&r, &refused("head_timeout"), 2.0).await;
    assert_eq!(healthz(&r).await, StatusCode::OK);
}

#[tokio::test]
async fn a_slow_body_gets_408_and_the_connection_closes() {
    let r = start(|a| a.request_body_timeout_s = 1.0).await;
    let mut tcp = TcpStream::connect(r.addrs.http).await.expect("connect");
    tcp.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"model\"",
    )
    .await
    .expect("head");
    let mut got = Vec::new();
    let end = Instant::now() + DEADLINE;
    // Trickle the body until the router answers.
    while Instant::now() < end && !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let _ = tcp.write_all(b" ").await;
        let mut buf = [0u8; 4096];
        if let Ok(Ok(n)) =
            tokio::time::timeout(Duration::from_millis(200), tcp.read(&mut buf)).await
        {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
    }
    let rest = read_to_close(&mut tcp).await.expect("closed after the 408");
    got.extend_from_slice(&rest);
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("request_timeout"), "{text}");
    metric_reaches(&r, &refused("body_timeout"), 1.0).await;
}

#[tokio::test]
async fn a_flood_of_10_mb_bodies_is_refused_with_413_before_it_is_read() {
    const DECLARED: usize = 10_000_000;
    let r = start(|_| {}).await;
    // 32 clients declare 10 MB and send only 64 KiB: the 413 must come anyway, so the router
    // cannot have waited for (or buffered) the rest.
    let declared = (0..32).map(|_| async {
        let mut tcp = TcpStream::connect(r.addrs.http).await.expect("connect");
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {DECLARED}\r\n\r\n"
        );
        tcp.write_all(head.as_bytes()).await.expect("head");
        let _ = tcp.write_all(&vec![b' '; 64 << 10]).await;
        let got = read_to_close(&mut tcp).await.unwrap_or_else(|partial| partial);
        String::from_utf8_lossy(&got).into_owned()
    });
    // 4 more stream chunked bodies with no declared length: cut off at the limit.
    let chunked = (0..4).map(|_| async {
        let mut tcp = TcpStream::connect(r.addrs.http).await.expect("connect");
        tcp.write_all(
            b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
        )
        .await
        .expect("head");
        let chunk = [format!("{:x}\r\n", 1 << 20).into_bytes(), vec![b' '; 1 << 20], b"\r\n".to_vec()].concat();
        for _ in 0..(DECLARED >> 20) + 1 {
            if tcp.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let got = read_to_close(&mut tcp).await.unwrap_or_else(|partial| partial);
        String::from_utf8_lossy(&got).into_owned()
    });
    let (declared, chunked) = tokio::join!(
        futures::future::join_all(declared),
        futures::future::join_all(chunked)
    );
    for text in declared.iter().chain(&chunked) {
        assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    }
    assert!(declared[0].contains("request_too_large"), "{}", declared[0]);
    metric_reaches(&r, &refused("body_too_large"), 36.0).await;
    assert_eq!(healthz(&r).await, StatusCode::OK);
}

/// The soft limit on open files of this process (`/proc/self/limits`), if known.
fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

#[tokio::test]
async fn ten_thousand_idle_connections_hit_the_cap_and_the_router_keeps_answering() {
    // 10,000 idle clients against a cap of 1,000 (client and server share this process, so
    // it needs ~11,000 descriptors; with a lower limit the count shrinks to fit, and says so).
    let limit = open_files_limit().unwrap_or(1024);
    let clients = 10_000.min(limit.saturating_sub(1_500));
    let cap = 1_000.min(clients / 4).max(1);
    if clients < 10_000 {
        eprintln!("open-file limit {limit}: {clients} idle clients against a cap of {cap}");
    }
    let r = start(|a| {
        a.max_connections = cap;
        // Idle clients are cut off after this; most are connected by then.
        a.request_head_timeout_s = 10.0;
    })
    .await;
    let mut idle = Vec::with_capacity(clients);
    let end = Instant::now() + DEADLINE;
    for _ in 0..clients {
        let tcp = tokio::time::timeout_at(end, TcpStream::connect(r.addrs.http))
            .await
            .expect("connect in time")
            .expect("connect");
        idle.push(tcp);
    }
    // The excess was refused; the admin port answers meanwhile.
    metric_reaches(&r, &refused("connection_limit"), 1.0).await;
    assert_eq!(healthz(&r).await, StatusCode::OK);
    let open = metric(&r, "kvroute_router_open_connections{listener=\"gateway\"}").await;
    assert!(
        open <= cap as f64,
        "{open} open connections over the cap {cap}"
    );
    // Refused clients read why (best effort on the router's side, so any of a few); those
    // just past the cap connected while it was full.
    let mut told = false;
    for tcp in idle.iter_mut().skip(cap).take(20) {
        if let Ok(got) = read_to_close(tcp).await
            && got.starts_with(b"HTTP/1.1 503")
        {
            told = true;
            break;
        }
    }
    assert!(told, "no refused client was told 503");
    // The idle ones are cut off at the head deadline; real requests get through again.
    let client = reqwest::Client::builder()
        .timeout(DEADLINE)
        .build()
        .expect("client");
    let end = Instant::now() + DEADLINE;
    loop {
        let answer = client
            .post(format!("http://{}/v1/chat/completions", r.addrs.http))
            .json(
                &serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
            )
            .send()
            .await;
        // The gateway routed it: no worker serves `m` here, so its answer is a shaped 404.
        if let Ok(resp) = answer
            && resp.status() == StatusCode::NOT_FOUND
        {
            let v: serde_json::Value = resp.json().await.expect("json");
            assert_eq!(v["error"]["code"], "model_not_found");
            break;
        }
        assert!(Instant::now() < end, "the gateway never answered again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every idle client was refused at the cap or, admitted, cut off at the head deadline.
    let end = Instant::now() + DEADLINE;
    loop {
        let cut = metric(&r, &refused("connection_limit")).await
            + metric(&r, &refused("head_timeout")).await;
        if cut >= clients as f64 {
            break;
        }
        assert!(
            Instant::now() < end,
            "only {cut} of {clients} idle clients cut off"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(idle);
}

#[tokio::test]
async fn debug_views_need_loopback_or_the_token_and_metrics_stay_open() {
    let dir = tempfile::tempdir().expect("dir");
    let token = dir.path().join("admin-token");
    std::fs::write(&token, "t0k3n\n").expect("write");
    let registry = prometheus::Registry::new();
    let metrics = kvroute_router::metrics::RouterMetrics::register(&registry).expect("metrics");
    let state = kvroute_router::state::RouterState::new(
        kvroute_router::state::RouterConfig::default(),
        metrics,
    )
    .expect("state");
    let auth = kvroute_router::admin_token::AdminAuth::new(Some(token), &registry).expect("auth");
    let pool = kvroute_router::blocking_pool::BlockingPool::unregistered(
        kvroute_router::blocking_pool::PoolConfig::new(1, 4),
    )
    .expect("pool");
    let app = kvroute_router::admin::router(state, auth.clone(), pool);
    let remote = SocketAddr::from(([10, 1, 2, 3], 40000));
    let call = |path: &str, bearer: Option<&str>| {
        let mut b = Request::get(path).extension(ConnectInfo(remote));
        if let Some(t) = bearer {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        app.clone().oneshot(b.body(Body::empty()).expect("request"))
    };
    for path in ["/debug/workers", "/debug/tokenizers"] {
        let resp = call(path, None).await.expect("response");
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(resp.headers()["www-authenticate"], "Bearer");
        let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .expect("body");
        let text = String::from_utf8_lossy(&body);
        assert!(
            text.contains("authentication_error") && !text.contains("index"),
            "{text}"
        );
        let resp = call(path, Some("wrong")).await.expect("response");
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{path}");
        let resp = call(path, Some("t0k3n")).await.expect("response");
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
    }
    let explain = Request::post("/debug/explain")
        .extension(ConnectInfo(remote))
        .header("content-type", "application/json")
        .body(Body::from(r#"{"model":"m","prompt":"hi"}"#))
        .expect("request");
    let resp = app.clone().oneshot(explain).await.expect("response");
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    for path in ["/metrics", "/healthz"] {
        let resp = call(path, None).await.expect("response");
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
    }
    use kvroute_router::admin_token::Unauthorized;
    assert_eq!(auth.refused(Unauthorized::MissingToken), 3);
    assert_eq!(auth.refused(Unauthorized::WrongToken), 2);
    let scraped = registry.gather();
    assert!(
        scraped
            .iter()
            .any(|f| f.name() == "kvroute_router_admin_unauthorized_total")
    );
}

#[tokio::test]
async fn routing_headers_and_admission_flags_default_safe() {
    let a = Args::default();
    assert!(!a.expose_routing_headers);
    assert!(
        a.max_body_bytes < 10_000_000,
        "a 10 MB body must be refused"
    );
    assert!(a.admin_token_file.is_none());
}

/// Sends one keep-alive `GET /v1/models` on `tcp` and reads its whole answer.
async fn get_models(tcp: &mut TcpStream) -> String {
    tcp.write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("request");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let end = Instant::now() + DEADLINE;
    // The models list is small: the answer is complete once its JSON closes.
    while !got.ends_with(b"]}") {
        let n = tokio::time::timeout_at(end, tcp.read(&mut buf))
            .await
            .expect("answer in time")
            .expect("read");
        assert!(n > 0, "closed before the answer");
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn connections_close_after_their_request_cap_and_when_idle() {
    let r = start(|a| {
        a.max_requests_per_connection = 2;
        a.idle_timeout_s = 1.0;
    })
    .await;
    let closed = |reason: &str| {
        format!(
            "kvroute_router_connections_closed_total{{listener=\"gateway\",reason=\"{reason}\"}}"
        )
    };
    // Two requests, then the router closes the connection.
    let mut tcp = TcpStream::connect(r.addrs.http).await.expect("connect");
    let first = get_models(&mut tcp).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    let second = get_models(&mut tcp).await;
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");
    assert!(
        read_to_close(&mut tcp).await.is_ok(),
        "still open after its request cap"
    );
    metric_reaches(&r, &closed("max_requests"), 1.0).await;
    // One request, then silence past the idle timeout.
    let mut tcp = TcpStream::connect(r.addrs.http).await.expect("connect");
    let only = get_models(&mut tcp).await;
    assert!(only.starts_with("HTTP/1.1 200"), "{only}");
    assert!(
        read_to_close(&mut tcp).await.is_ok(),
        "idle connection kept"
    );
    metric_reaches(&r, &closed("idle"), 1.0).await;
}

#[tokio::test]
async fn the_head_deadline_runs_from_a_heads_first_byte_not_between_requests() {
    let r = start(|a| {
        a.request_head_timeout_s = 1.0;
        a.idle_timeout_s = 600.0;
    })
    .await;
    let mut tcp = TcpStream::connect(r.addrs.http).await.expect("connect");
    assert!(get_models(&mut tcp).await.starts_with("HTTP/1.1 200"));
    // Idle past the head deadline (but not the idle timeout): a keep-alive client.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(get_models(&mut tcp).await.starts_with("HTTP/1.1 200"));
    assert_eq!(metric(&r, &refused("head_timeout")).await, 0.0);
    // Then a head that starts and never ends is cut off at the deadline.
    tcp.write_all(b"GET /v1/models HTTP/1.1\r\nho")
        .await
        .expect("partial head");
    assert!(read_to_close(&mut tcp).await.is_ok(), "slow head kept");
    metric_reaches(&r, &refused("head_timeout"), 1.0).await;
}
