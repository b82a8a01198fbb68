//! LoRA adapters over a real socket: `--lora-modules` in both spellings, the adapters' cards
//! in /v1/models, requests naming an adapter, runtime load/unload, and KV events that carry
//! `lora_name` with block hashes that keep each adapter's cache apart (a repeat hits the cache
//! within its adapter, never across).

#![allow(clippy::unwrap_used)] // test helpers (outside #[test] fns): a panic is the failure report

use std::time::{Duration, Instant};

use kvroute_mock_vllm::lora::parse_module;
use kvroute_mock_vllm::{Args, RunningServer, start};
use kvroute_vllm_wire::KvEvent;
use serde_json::{Value, json};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

async fn server() -> RunningServer {
    let args = Args {
        served_model_name: vec!["base".into()],
        profile: "tiny".into(),
        speedup: 100.0,
        enable_prompt_tokens_details: true,
        lora_modules: vec![
            parse_module("sql=/adapters/sql").unwrap(),
            parse_module(r#"{"name":"de","path":"/adapters/de","base_model_name":"base"}"#)
                .unwrap(),
        ],
        allow_runtime_lora_updating: true,
        kv_events_config: Some(
            json!({
                "enable_kv_cache_events": true, "publisher": "zmq",
                "endpoint": "tcp://127.0.0.1:0", "replay_endpoint": "tcp://127.0.0.1:0",
            })
            .to_string(),
        ),
        ..Args::default()
    };
    start(args).await.unwrap()
}

async fn complete(base: &str, model: &str, prompt: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/completions"))
        .json(&json!({"model": model, "prompt": prompt, "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

fn cached(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}

async fn replay_events(endpoint: &str) -> Vec<KvEvent> {
    let mut dealer = zeromq::DealerSocket::new();
    dealer.connect(endpoint).await.unwrap();
    let req = ZmqMessage::try_from(vec![
        bytes::Bytes::new(),
        bytes::Bytes::copy_from_slice(&0u64.to_be_bytes()),
    ])
    .unwrap();
    dealer.send(req).await.unwrap();
    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "replay did not end");
        let m = tokio::time::timeout(Duration::from_secs(10), dealer.recv())
            .await
            .expect("replay timed out")
            .unwrap();
        let frames: Vec<Vec<u8>> = m.into_vec().into_iter().map(|b| b.to_vec()).collect();
        if frames.get(2).is_some_and(|f| f == &[0xff; 8]) {
            return events;
        }
        let batch = kvroute_vllm_wire::decode_batch(frames.last().unwrap()).unwrap();
        events.extend(batch.events);
    }
}

#[tokio::test]
async fn adapters_are_served_listed_and_keep_their_cache_apart() {
    let s = server().await;
    let base = format!("http://{}", s.http_addr);
    let client = reqwest::Client::new();

    let models: Value = client
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let cards = models["data"].as_array().unwrap();
    let ids: Vec<&str> = cards.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["base", "sql", "de"]);
    assert_eq!(cards[0]["parent"], Value::Null);
    assert_eq!(
        (&cards[1]["root"], &cards[1]["parent"]),
        (&json!("/adapters/sql"), &json!("base"))
    );

    // 80 bytes: five 16-token blocks of byte ids; the repeat finds them within its adapter only.
    let prompt = "a prompt long enough to fill several sixteen token blocks of the mock's cache.";
    let (status, first) = complete(&base, "sql", prompt).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["model"], "sql");
    assert_eq!(cached(&first), 0);
    let (_, again) = complete(&base, "sql", prompt).await;
    assert!(
        cached(&again) >= 64,
        "a repeat within the adapter hits: {again}"
    );
    let (_, other) = complete(&base, "de", prompt).await;
    assert_eq!(cached(&other), 0, "another adapter never hits: {other}");
    let (_, plain) = complete(&base, "base", prompt).await;
    assert_eq!(cached(&plain), 0, "the base model never hits: {plain}");

    let (status, err) = complete(&base, "fr", prompt).await;
    assert_eq!(status, 404, "{err}");
    let r = client
        .post(format!("{base}/v1/load_lora_adapter"))
        .json(&json!({"lora_name": "fr", "lora_path": "/adapters/fr"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(complete(&base, "fr", prompt).await.0, 200);
    let r = client
        .post(format!("{base}/v1/unload_lora_adapter"))
        .json(&json!({"lora_name": "fr"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(complete(&base, "fr", prompt).await.0, 404);

    // The events name the adapter, and the same tokens get a different first hash under each.
    let replay = s.endpoints.replay_endpoint.clone().unwrap();
    let events = replay_events(&replay).await;
    let first_hash = |lora: Option<&str>| {
        events.iter().find_map(|e| match e {
            KvEvent::Stored(b) if b.parent.is_none() && b.lora_name.as_deref() == lora => Some((
                b.block_hashes[0],
                b.token_ids[..16].to_vec(),
                b.extra_keys.clone(),
            )),
            _ => None,
        })
    };
    let (sql, sql_tokens, sql_extra) = first_hash(Some("sql")).expect("a store under sql");
    let (de, de_tokens, _) = first_hash(Some("de")).expect("a store under de");
    let (plain, plain_tokens, _) = first_hash(None).expect("a store under the base");
    assert_eq!(sql_tokens, de_tokens);
    assert_eq!(sql_tokens, plain_tokens);
    assert!(sql != de && sql != plain && de != plain);
    assert_eq!(
        sql_extra[0],
        vec![kvroute_vllm_wire::RawExtraKey::Str("sql".into())],
        "the bare adapter name in extra_keys, as vLLM publishes it"
    );
}

#[tokio::test]
async fn runtime_updates_need_vllms_switch() {
    let args = Args {
        profile: "tiny".into(),
        lora_modules: vec![parse_module("sql=/a").unwrap()],
        ..Args::default()
    };
    let s = start(args).await.unwrap();
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/load_lora_adapter", s.http_addr))
        .json(&json!({"lora_name": "fr", "lora_path": "/fr"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        404,
        "not served without VLLM_ALLOW_RUNTIME_LORA_UPDATING"
    );
}
