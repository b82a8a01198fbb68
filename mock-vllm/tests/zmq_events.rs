//! KV events over real ZMQ sockets: a SUB sees `[topic, seq, payload]` with contiguous seqs,
//! a DEALER replay returns every buffered batch as `["", topic, seq, payload]` and then the end
//! marker `["", "", ff*8, ""]`, and a restart sends seq back to 0.

#![allow(clippy::unwrap_used)] // test helpers (outside #[test] fns): a panic is the failure report

use std::time::{Duration, Instant};

use kvroute_mock_vllm::driver::Cmd;
use kvroute_mock_vllm::{Args, RunningServer, start};
use serde_json::json;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

async fn server() -> RunningServer {
    let args = Args {
        profile: "tiny".into(),
        speedup: 100.0,
        kv_events_config: Some(
            json!({
                "enable_kv_cache_events": true,
                "publisher": "zmq",
                "endpoint": "tcp://127.0.0.1:0",
                "replay_endpoint": "tcp://127.0.0.1:0",
                "topic": "kv",
            })
            .to_string(),
        ),
        ..Args::default()
    };
    start(args).await.unwrap()
}

async fn complete(base: &str, prompt: &str) {
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/completions"))
        .json(&json!({"prompt": prompt, "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

fn seq_of(frame: &[u8]) -> u64 {
    u64::from_be_bytes(frame[..8].try_into().unwrap())
}

/// Sends requests until the subscriber sees a message (its subscription has landed).
async fn first_message(sub: &mut zeromq::SubSocket, base: &str) -> ZmqMessage {
    let deadline = Instant::now() + Duration::from_secs(10);
    for i in 0.. {
        assert!(
            Instant::now() < deadline,
            "no KV event reached the subscriber"
        );
        complete(
            base,
            &format!("warm-up prompt number {i} that fills a block or two"),
        )
        .await;
        if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(200), sub.recv()).await {
            return m;
        }
    }
    unreachable!()
}

async fn replay(endpoint: &str, from: u64) -> Vec<Vec<Vec<u8>>> {
    let mut dealer = zeromq::DealerSocket::new();
    dealer.connect(endpoint).await.unwrap();
    let req = ZmqMessage::try_from(vec![
        bytes::Bytes::new(),
        bytes::Bytes::copy_from_slice(&from.to_be_bytes()),
    ])
    .unwrap();
    dealer.send(req).await.unwrap();
    let mut replies = Vec::new();
    loop {
        let m = tokio::time::timeout(Duration::from_secs(10), dealer.recv())
            .await
            .expect("replay timed out")
            .unwrap();
        let frames: Vec<Vec<u8>> = m.into_vec().into_iter().map(|b| b.to_vec()).collect();
        let end = frames.get(2).is_some_and(|f| f == &[0xff; 8]);
        replies.push(frames);
        if end {
            return replies;
        }
    }
}

#[tokio::test]
async fn pub_stream_replay_and_restart() {
    let s = server().await;
    let base = format!("http://{}", s.http_addr);
    let pub_ep = s
        .endpoints
        .pub_endpoint
        .clone()
        .unwrap()
        .replace("0.0.0.0", "127.0.0.1");
    let replay_ep = s
        .endpoints
        .replay_endpoint
        .clone()
        .unwrap()
        .replace("0.0.0.0", "127.0.0.1");
    let mut sub = zeromq::SubSocket::new();
    sub.subscribe("").await.unwrap();
    sub.connect(&pub_ep).await.unwrap();

    let first = first_message(&mut sub, &base).await;
    assert_eq!(first.len(), 3);
    assert_eq!(first.get(0).unwrap().as_ref(), b"kv");
    let mut last = seq_of(first.get(1).unwrap());
    complete(
        &base,
        "another prompt that is long enough to fill at least one whole block",
    )
    .await;
    let next = tokio::time::timeout(Duration::from_secs(10), sub.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        seq_of(next.get(1).unwrap()),
        last + 1,
        "seqs are contiguous"
    );
    last += 1;
    let batch = kvroute_vllm_wire::decode_batch(next.get(2).unwrap()).unwrap();
    assert_eq!(batch.dp_rank, Some(0));
    assert!(!batch.events.is_empty());
    assert!(
        batch.events.iter().all(|e| e.skip_reason().is_none()),
        "{:?}",
        batch.events
    );

    // Replay everything: all batches 0..=last, then the end marker.
    let replies = replay(&replay_ep, 0).await;
    let (end, batches) = replies.split_last().unwrap();
    assert_eq!(end, &vec![vec![], vec![], vec![0xff; 8], vec![]]);
    let seqs: Vec<u64> = batches.iter().map(|f| seq_of(&f[2])).collect();
    assert_eq!(seqs, (0..=last).collect::<Vec<_>>());
    assert!(
        batches
            .iter()
            .all(|f| f.len() == 4 && f[0].is_empty() && f[1] == b"kv")
    );
    assert_eq!(
        batches.last().unwrap()[3],
        next.get(2).unwrap().to_vec(),
        "replay = live bytes"
    );
    // Past the end: only the end marker.
    assert_eq!(replay(&replay_ep, last + 100).await.len(), 1);

    // A restart sends seq back to 0.
    s.cmd.send(Cmd::Restart).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "no event after restart");
        complete(
            &base,
            "a prompt after the restart, long enough to fill a block",
        )
        .await;
        if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), sub.recv()).await {
            assert_eq!(seq_of(m.get(1).unwrap()), 0);
            break;
        }
    }
}

/// Binds a SUB socket on `endpoint`, retrying while the previous owner of the port lets go.
async fn bound_sub(endpoint: &str) -> zeromq::SubSocket {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut sub = zeromq::SubSocket::new();
        sub.subscribe("").await.unwrap();
        match sub.bind(endpoint).await {
            Ok(_) => return sub,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "cannot bind {endpoint} again: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The wiring of a kvroute worker pod: the subscriber (the sidecar) binds on 127.0.0.1 and
/// the publisher connects, as vLLM does for an endpoint without `*`. When the subscriber
/// restarts and binds again, the publisher reconnects (libzmq does this for vLLM).
#[tokio::test]
async fn connect_mode_follows_a_restarted_subscriber() {
    let mut sub = zeromq::SubSocket::new();
    sub.subscribe("").await.unwrap();
    let endpoint = sub.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
    let args = Args {
        profile: "tiny".into(),
        speedup: 100.0,
        kv_events_config: Some(
            json!({
                "enable_kv_cache_events": true,
                "publisher": "zmq",
                "endpoint": endpoint,
                "replay_endpoint": "tcp://127.0.0.1:0",
                "topic": "kv",
            })
            .to_string(),
        ),
        ..Args::default()
    };
    let s = start(args).await.unwrap();
    let base = format!("http://{}", s.http_addr);
    assert_eq!(s.endpoints.pub_endpoint.as_deref(), Some(endpoint.as_str()));

    let first = first_message(&mut sub, &base).await;
    let first_seq = seq_of(first.get(1).unwrap());
    drop(sub);
    let mut sub = bound_sub(&endpoint).await;
    let again = first_message(&mut sub, &base).await;
    assert_eq!(again.get(0).unwrap().as_ref(), b"kv");
    assert!(seq_of(again.get(1).unwrap()) > first_seq);
}

/// A subscriber that binds long after the publisher started is reached within about a
/// second, as libzmq reconnects every 100 ms: the zeromq crate's own retries within one
/// connect back off to 30 s (a subscriber binding at 7 s would be reached only at about
/// 12.8 s), which once left a worker pod's events unread for a whole e2e test.
#[tokio::test]
async fn connect_mode_reaches_a_subscriber_that_binds_late() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("tcp://127.0.0.1:{port}");
    let args = Args {
        profile: "tiny".into(),
        speedup: 100.0,
        kv_events_config: Some(
            json!({
                "enable_kv_cache_events": true,
                "publisher": "zmq",
                "endpoint": endpoint,
                "replay_endpoint": "tcp://127.0.0.1:0",
                "topic": "kv",
            })
            .to_string(),
        ),
        ..Args::default()
    };
    let s = start(args).await.unwrap();
    let base = format!("http://{}", s.http_addr);
    // Past the crate's retry points at 3.15 s and 6.35 s after start.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let mut sub = bound_sub(&endpoint).await;
    let bound = Instant::now();
    let deadline = bound + Duration::from_secs(4);
    let mut i = 0;
    loop {
        complete(
            &base,
            &format!("late subscriber prompt {i}, a block or two long"),
        )
        .await;
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(200), sub.recv()).await {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the publisher had not connected {:?} after the subscriber bound",
            bound.elapsed()
        );
        i += 1;
    }
}

async fn start_time(base: &str) -> f64 {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("process_start_time_seconds "))
        .and_then(|v| v.trim().parse().ok())
        .expect("process_start_time_seconds")
}

/// The fault suite's hooks (docs/faults.md): `POST /mock/drop-events` leaves batches off the
/// PUB socket (a seq gap the subscriber sees; replay still has them), `GET`/`POST /mock/cache`
/// report the cached blocks and a prompt's cached prefix, and an engine restart moves
/// `process_start_time_seconds` as a restarted vLLM's would.
#[tokio::test]
async fn drop_events_leaves_a_gap_and_mock_cache_reports_the_cache() {
    let s = server().await;
    let base = format!("http://{}", s.http_addr);
    let client = reqwest::Client::new();
    let pub_ep = s.endpoints.pub_endpoint.clone().unwrap();
    let replay_ep = s.endpoints.replay_endpoint.clone().unwrap();
    let mut sub = zeromq::SubSocket::new();
    sub.subscribe("").await.unwrap();
    sub.connect(&pub_ep).await.unwrap();
    let first = first_message(&mut sub, &base).await;
    let last = seq_of(first.get(1).unwrap());

    let r = client
        .post(format!("{base}/mock/drop-events"))
        .json(&json!({"count": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let bad = client
        .post(format!("{base}/mock/drop-events"))
        .json(&json!({"count": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    // Three more batches: two are dropped, the third arrives 3 after the last one seen.
    let mut got = None;
    for i in 0..3 {
        complete(
            &base,
            &format!("prompt {i} after the drop, long enough to fill a block of its own"),
        )
        .await;
        if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), sub.recv()).await {
            got = Some(seq_of(m.get(1).unwrap()));
            break;
        }
    }
    assert_eq!(got, Some(last + 3), "two batches left off the live stream");
    let seqs: Vec<u64> = replay(&replay_ep, last + 1)
        .await
        .iter()
        .filter(|f| f[2] != [0xff; 8])
        .map(|f| seq_of(&f[2]))
        .collect();
    assert_eq!(
        seqs.get(..3),
        Some(&[last + 1, last + 2, last + 3][..]),
        "replay has them"
    );

    // The cache as the engine holds it; a prompt's cached prefix.
    let prompt: Vec<u32> = (1..=40).collect();
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(&json!({"prompt": prompt, "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = client
        .post(format!("{base}/mock/cache"))
        .json(&json!({"prompts": [prompt, [9, 9, 9]]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let bs = v["block_size"].as_u64().unwrap();
    assert_eq!(v["prefix_tokens"][0].as_u64(), Some(39 / bs * bs), "{v}");
    assert_eq!(v["prefix_tokens"][1], 0);
    let n = v["cached_blocks"].as_u64().unwrap();
    assert!(n >= 40 / bs, "{v}");
    assert_eq!(v["block_hashes"].as_array().map(Vec::len), Some(n as usize));
    let bad = client
        .post(format!("{base}/mock/cache"))
        .json(&json!({"prompts": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);

    // An engine restart empties it and moves the start time.
    let before = start_time(&base).await;
    s.cmd.send(Cmd::Restart).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v: serde_json::Value = reqwest::get(format!("{base}/mock/cache"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if v["cached_blocks"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "cache not emptied: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(start_time(&base).await > before);
}
