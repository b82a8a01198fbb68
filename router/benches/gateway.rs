//! Gateway overhead on this machine: TTFT through the gateway minus TTFT straight to the
//! worker (p50, p99), and routed streaming requests per second.
//!
//! ```text
//! client --direct--------------------------------> fake worker (SSE, no think time)
//! client --> gateway (decode, pick, pooled upstream, SSE relay) --> same fake worker
//! ```
//!
//! The worker answers instantly, so the difference is what the gateway adds: body read and
//! decode, the routing call (a trivial in-process `Dispatch`: the routing decision itself is
//! measured by the `routing` bench), the upstream hop and the event-by-event relay.
//! First, without the network: what classifying one worker chunk costs (the relay does it for
//! every streamed token), the one-pass reading against the full JSON parse it replaced, over
//! the captured vLLM stream (`testdata/vllm-capture`).
//! Run: `cargo bench -p kvroute-router --bench gateway` (options after `--`:
//! `--requests N` sequential TTFT samples per path, `--concurrency C`, `--seconds S` of the
//! throughput phase, `--chunks K` content chunks per stream).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::response::Response;
use axum::routing::post;
use futures::StreamExt;
use kvroute_router::gateway::openai::{StreamItem, Usage, inspect_chunk, inspect_chunk_json};
use kvroute_router::gateway::{
    Dispatch, GatewayConfig, GatewayRequest, PickError, Picked, Resolved, router_with,
};
use kvroute_router::routing::AssignmentId;
use serde_json::json;

struct Opts {
    requests: usize,
    concurrency: usize,
    seconds: f64,
    chunks: usize,
}

fn opts() -> Opts {
    let mut o = Opts {
        requests: 2000,
        concurrency: 32,
        seconds: 5.0,
        chunks: 16,
    };
    let args: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--requests" => o.requests = value.parse().unwrap_or(o.requests),
            "--concurrency" => o.concurrency = value.parse().unwrap_or(o.concurrency),
            "--seconds" => o.seconds = value.parse().unwrap_or(o.seconds),
            "--chunks" => o.chunks = value.parse().unwrap_or(o.chunks),
            // `--bench` and anything else cargo passes.
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    o
}

struct OneWorker {
    url: String,
    next: AtomicU64,
}

impl Dispatch for OneWorker {
    fn model_names(&self) -> Vec<String> {
        vec!["m".into()]
    }
    fn resolve_model(&self, m: &str) -> Option<Resolved> {
        (m == "m").then(|| Resolved {
            backend_model: "m".to_string(),
            pool: None,
            alias: None,
            lora_base: None,
        })
    }
    fn pick(&self, _r: &GatewayRequest<'_>, _exclude: &[String]) -> Result<Picked, PickError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        Ok(Picked {
            assignment: AssignmentId(id),
            worker: "w0".into(),
            address: self.url.trim_start_matches("http://").to_string(),
            backend_model: "m".into(),
            predicted_ttft_s: 0.01,
            ttft_p90_bound_s: f64::NAN,
            reason: "lowest_predicted_ttft",
            degraded: false,
            fallbacks: Vec::new(),
            policy: Default::default(),
        })
    }
    fn first_token(&self, _p: &Picked, _ttft: Duration) {}
    fn inter_token(&self, _p: &Picked, _gap: Duration) {}
    fn done(&self, _p: &Picked, _u: Option<Usage>, _e2e: Duration) {}
    fn abort(&self, _p: &Picked) {}
}

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    // Small SSE writes must not wait for Nagle's algorithm.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

async fn fake_worker(chunks: usize) -> String {
    let chunk = |c: &str| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m",
                "choices": [{"index": 0, "delta": {"content": c}, "finish_reason": null}]})
        )
    };
    let mut events = vec![chunk("")];
    events.extend((0..chunks).map(|_| chunk("tok")));
    events.push(format!(
        "data: {}\n\ndata: [DONE]\n\n",
        json!({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": chunks,
            "prompt_tokens_details": {"cached_tokens": 0}}})
    ));
    let events = Arc::new(events);
    let app = Router::new().route(
        "/v1/chat/completions",
        post(move |_body: axum::body::Bytes| {
            let events = events.clone();
            async move {
                let stream = futures::stream::iter(
                    (0..events.len())
                        .map(move |i| Ok::<_, std::convert::Infallible>(events[i].clone())),
                );
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Body::from_stream(stream))
                    .expect("response")
            }
        }),
    );
    serve(app).await
}

/// One streaming request: (TTFT, complete).
async fn one(client: &reqwest::Client, url: &str, body: &bytes::Bytes) -> Option<Duration> {
    let start = Instant::now();
    let resp = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let mut stream = resp.bytes_stream();
    let mut ttft = None;
    let mut seen = String::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.ok()?;
        if ttft.is_none() {
            seen.push_str(&String::from_utf8_lossy(&chunk));
            if seen.contains("\"tok\"") {
                ttft = Some(start.elapsed());
            }
        }
    }
    ttft
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

async fn ttfts(client: &reqwest::Client, url: &str, body: &bytes::Bytes, n: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        if let Some(t) = one(client, url, body).await {
            out.push(t.as_secs_f64() * 1000.0);
        }
    }
    out.sort_by(f64::total_cmp);
    out
}

async fn throughput(
    url: &str,
    body: &bytes::Bytes,
    concurrency: usize,
    seconds: f64,
) -> (f64, u64) {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()
        .expect("client");
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, url, body, done, failed) = (
            client.clone(),
            url.to_string(),
            body.clone(),
            done.clone(),
            failed.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                if one(&client, &url, &body).await.is_some() {
                    done.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    (
        done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64(),
        failed.load(Ordering::Relaxed),
    )
}

/// ns per chunk of `f` over `chunks`, best of 5 rounds of `rounds` passes.
fn per_chunk(chunks: &[String], rounds: usize, f: impl Fn(&str) -> bool) -> f64 {
    (0..5)
        .map(|_| {
            let t = Instant::now();
            let mut n = 0usize;
            for _ in 0..rounds {
                for c in chunks {
                    n += usize::from(f(std::hint::black_box(c)));
                }
            }
            std::hint::black_box(n);
            t.elapsed().as_nanos() as f64 / (rounds * chunks.len()) as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn classify_phase() {
    let capture = include_str!("../../testdata/vllm-capture/requests.jsonl");
    let mut chunks = Vec::new();
    for line in capture.lines() {
        let r: serde_json::Value = serde_json::from_str(line).expect("capture line");
        for l in r["response_sse_lines"].as_array().into_iter().flatten() {
            if let Some(d) = l.as_str().and_then(|l| l.strip_prefix("data: ")) {
                chunks.push(d.to_string());
            }
        }
    }
    let content = |i: StreamItem| matches!(i, StreamItem::Chunk { content: true, .. });
    let one_pass = per_chunk(&chunks, 2000, |c| content(inspect_chunk(c)));
    let full = per_chunk(&chunks, 2000, |c| content(inspect_chunk_json(c).0));
    let bytes = chunks.iter().map(String::len).sum::<usize>() / chunks.len().max(1);
    println!(
        "chunk classification, {} captured vLLM stream events (mean {bytes} bytes)",
        chunks.len()
    );
    println!("  one pass     {one_pass:.0} ns per chunk");
    println!("  full parse   {full:.0} ns per chunk");
}

fn main() {
    let o = opts();
    classify_phase();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let worker = fake_worker(o.chunks).await;
        let dispatch = Arc::new(OneWorker { url: worker.clone(), next: AtomicU64::new(0) });
        let gateway = serve(router_with(dispatch, GatewayConfig::default()).expect("gateway")).await;
        let body = bytes::Bytes::from(
            json!({"model": "m", "messages": [{"role": "system", "content": "x".repeat(8000)},
                {"role": "user", "content": "hi"}], "stream": true, "max_tokens": o.chunks})
            .to_string(),
        );
        let client = reqwest::Client::new();
        let direct_url = format!("{worker}/v1/chat/completions");
        let routed_url = format!("{gateway}/v1/chat/completions");
        // Warm both paths (connections, allocator).
        ttfts(&client, &direct_url, &body, 200).await;
        ttfts(&client, &routed_url, &body, 200).await;
        // Interleave in blocks so drift on a shared machine hits both paths alike.
        let mut direct = Vec::new();
        let mut routed = Vec::new();
        let blocks = 10;
        for _ in 0..blocks {
            direct.extend(ttfts(&client, &direct_url, &body, o.requests / blocks).await);
            routed.extend(ttfts(&client, &routed_url, &body, o.requests / blocks).await);
        }
        direct.sort_by(f64::total_cmp);
        routed.sort_by(f64::total_cmp);
        println!("gateway overhead, {} sequential streaming requests per path, {} content chunks each, 8 kB prompt", direct.len(), o.chunks);
        println!("  TTFT direct   p50 {:.3} ms  p99 {:.3} ms", pct(&direct, 0.5), pct(&direct, 0.99));
        println!("  TTFT routed   p50 {:.3} ms  p99 {:.3} ms", pct(&routed, 0.5), pct(&routed, 0.99));
        println!(
            "  added         p50 {:.3} ms  p99 {:.3} ms",
            pct(&routed, 0.5) - pct(&direct, 0.5),
            pct(&routed, 0.99) - pct(&direct, 0.99)
        );
        let (direct_rps, direct_failed) = throughput(&direct_url, &body, o.concurrency, o.seconds).await;
        let (routed_rps, routed_failed) = throughput(&routed_url, &body, o.concurrency, o.seconds).await;
        println!("throughput, {} concurrent streams for {} s (client, gateway and worker share this machine)", o.concurrency, o.seconds);
        println!("  direct  {direct_rps:.0} req/s ({direct_failed} failed)");
        println!("  routed  {routed_rps:.0} req/s ({routed_failed} failed)");
    });
}
