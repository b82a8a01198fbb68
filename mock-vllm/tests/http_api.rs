//! The mock's HTTP API over a real socket with a real client (reqwest): vLLM's shapes for
//! streaming and non-streaming completions, /tokenize golden ids, errors, cache hits in usage,
//! and client disconnects aborting the request in the engine.

#![allow(clippy::unwrap_used)] // test helpers (outside #[test] fns): a panic is the failure report

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kvroute_mock_vllm::{Args, RunningServer, start};
use serde_json::{Value, json};

fn qwen_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/tokenizers/qwen3")
}

async fn server(speedup: f64, tokenizer: bool) -> (RunningServer, String) {
    let args = Args {
        served_model_name: vec!["qwen".into(), "alias".into()],
        tokenizer: tokenizer.then(qwen_dir),
        profile: "tiny".into(),
        speedup,
        enable_prompt_tokens_details: true,
        max_model_len: Some(1024),
        ..Args::default()
    };
    let s = start(args).await.unwrap();
    let base = format!("http://{}", s.http_addr);
    (s, base)
}

async fn post(client: &reqwest::Client, url: &str, body: Value) -> (u16, Value) {
    let r = client.post(url).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// The `data:` payloads of an SSE body, in order.
fn sse_events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

async fn metric(client: &reqwest::Client, base: &str, line_prefix: &str) -> f64 {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

#[tokio::test]
async fn tokenize_returns_vllms_golden_ids() {
    let (_s, base) = server(100.0, true).await;
    let client = reqwest::Client::new();
    let messages = json!([
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"}
    ]);
    let (status, body) = post(
        &client,
        &format!("{base}/tokenize"),
        json!({"model": "qwen", "messages": messages}),
    )
    .await;
    assert_eq!(status, 200);
    let golden = json!([
        151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198, 3838,
        374, 279, 6722, 315, 9625, 30, 151645, 198, 151644, 77091, 198
    ]);
    assert_eq!(body["tokens"], golden);
    assert_eq!(body["count"], 26);
    assert_eq!(body["max_model_len"], 1024);
    let (_, body) = post(
        &client,
        &format!("{base}/tokenize"),
        json!({"messages": messages, "chat_template_kwargs": {"enable_thinking": false}}),
    )
    .await;
    let ids = body["tokens"].as_array().unwrap();
    assert_eq!(ids.len(), 30);
    assert_eq!(
        ids[26..],
        [json!(151667), json!(271), json!(151668), json!(271)]
    );
}

#[tokio::test]
async fn streaming_chat_like_vllm_and_cache_hits_in_usage() {
    let (_s, base) = server(100.0, true).await;
    let client = reqwest::Client::new();
    let long = "Routing requests to the worker that holds the prefix saves prefill. ".repeat(12);
    let body = json!({
        "model": "alias",
        "messages": [{"role": "system", "content": long}, {"role": "user", "content": "Hi"}],
        "max_completion_tokens": 6,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true, "continuous_usage_stats": true},
    });
    let mut cached = Vec::new();
    for _ in 0..2 {
        let r = client
            .post(format!("{base}/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(
            r.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        let events = sse_events(&r.text().await.unwrap());
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        assert_eq!(chunks[0]["object"], "chat.completion.chunk");
        assert_eq!(chunks[0]["model"], "alias");
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let usage = chunks.last().unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["completion_tokens"], 6);
        let finishing: Vec<&Value> = chunks
            .iter()
            .filter(|c| c["choices"][0]["finish_reason"].is_string())
            .collect();
        assert_eq!(finishing.len(), 1);
        assert_eq!(finishing[0]["choices"][0]["finish_reason"], "length");
        // continuous_usage_stats: every content chunk carries usage.
        assert!(chunks.iter().all(|c| c.get("usage").is_some()));
        cached.push(
            usage["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        );
    }
    assert_eq!(cached[0], 0);
    assert!(
        cached[1] >= 128,
        "second request should hit the cache: {cached:?}"
    );
    assert!(metric(&client, &base, "vllm:prefix_cache_hits_total").await >= 128.0);
}

#[tokio::test]
async fn non_streaming_completions_and_errors() {
    let (_s, base) = server(100.0, false).await;
    let client = reqwest::Client::new();
    let (status, body) = post(
        &client,
        &format!("{base}/v1/completions"),
        json!({"model": "qwen", "prompt": "hello world", "max_tokens": 4, "return_token_ids": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["choices"][0]["token_ids"].as_array().unwrap().len(), 4);
    assert_eq!(body["usage"]["prompt_tokens"], 11);
    assert_eq!(body["usage"]["total_tokens"], 15);

    let r = client
        .post(format!("{base}/v1/chat/completions"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["type"], "BadRequestError");

    let (status, e) = post(
        &client,
        &format!("{base}/v1/completions"),
        json!({"model": "gpt-9", "prompt": "x"}),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(e["error"]["message"], "The model `gpt-9` does not exist.");

    let (status, e) = post(
        &client,
        &format!("{base}/v1/completions"),
        json!({"model": "qwen", "prompt": "x".repeat(1100)}),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length is 1024")
    );

    for path in [
        "/health",
        "/version",
        "/v1/models",
        "/server_info",
        "/model_info",
        "/get_load",
    ] {
        let r = client.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    let models: Value = client
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "qwen");
    assert_eq!(models["data"][1]["id"], "alias");
    let (status, body) = post(&client, &format!("{base}/reset_prefix_cache"), json!({})).await;
    assert_eq!((status, body), (200, json!({"success": true})));
}

#[tokio::test]
async fn client_disconnect_aborts_the_request() {
    // Speedup 1 with the tiny profile: ~1 ms steps, so 100k tokens take far longer than the test.
    let (_s, base) = server(1.0, false).await;
    let client = reqwest::Client::new();
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(
            &json!({"prompt": "abort me", "max_tokens": 1000, "ignore_eos": true, "stream": true}),
        )
        .send()
        .await
        .unwrap();
    let mut stream = r.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    drop(stream);
    let abort_line = "vllm:request_success_total{engine=\"0\",finished_reason=\"abort\"";
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let aborted = metric(&client, &base, abort_line).await;
        let running = metric(&client, &base, "vllm:num_requests_running").await;
        if aborted == 1.0 && running == 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "abort not seen: aborted={aborted} running={running}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
