//! What users install is what the tests run: the router here is the Deployment the operator
//! creates, run by the fake kubelet from its pod spec (command, args, env), with the tokenizer
//! the WorkerSet names downloaded from a local stand-in for the Hugging Face Hub.
//!
//! ```text
//! operator (--namespace ns --router-namespace ns --router-replicas 1)
//!    --> router Deployment --> fake kubelet --> `kvroute router` on 127.A.B.C
//!          HF_ENDPOINT --> FakeHub (this process) serving testdata/tokenizers/qwen3
//!    --> WorkerSet Deployment --> mock vLLM + sidecar per pod --gRPC--> that router
//! test --HTTP--> router pod: a shared-prefix burst; the same burst (other prefixes) sent to
//!               random pods directly; a WorkerSet change rolls the pods under load
//! ```
//!
//! Asserts: the operator's router loads the tokenizer (its decisions are not degraded) and
//! routes the shared-prefix burst to a prompt-token cache-hit rate (from the workers' own
//! `cached_tokens`) well above random routing's on the same pool; a rolling update of the
//! WorkerSet replaces every pod while sequential requests through the router keep succeeding.
//!
//! Needs the binaries of `bash e2e/k8s/setup.sh` and `target/<profile>/kvroute`.

use std::time::Duration;

use anyhow::{Context, bail};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kvroute_crds::workerset::InferenceWorkerSet;
use kvroute_e2e::harness::{
    Cluster, FakeKubelet, IMAGE_TOKENIZERS, OperatorProcess, RunningPod, router_pod_options,
};
use kvroute_e2e::procs::wait_for;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);
const SET: &str = "qwen";
const SERVED: &str = "qwen3-mock";
const ENGINE_PORT: u16 = 8000;
/// Prefix groups per burst and requests per group.
const GROUPS: usize = 12;
const PER_GROUP: usize = 4;

/// A chat request whose system prompt is shared by its group (~1,000 tokens).
fn chat(arm: &str, group: usize, i: usize) -> Value {
    let context: Vec<String> = (0..220)
        .map(|k| format!("{arm}{group}x{}", (k * 7919 + group * 104_729) % 100_003))
        .collect();
    json!({
        "model": SERVED,
        "messages": [
            {"role": "system", "content": format!("Reference notes {arm} {group}: {}", context.join(" "))},
            {"role": "user", "content": format!("Question {i} about group {group}?")},
        ],
        "max_tokens": 4,
    })
}

/// (prompt tokens, cached prompt tokens) of one completion answer.
fn usage(body: &Value) -> anyhow::Result<(u64, u64)> {
    let u = &body["usage"];
    let prompt = u["prompt_tokens"]
        .as_u64()
        .context("no usage.prompt_tokens")?;
    let cached = u["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    Ok((prompt, cached))
}

/// Sends `bodies` (4 at a time) to the URL `target(i)` picks; the cache-hit rate of the
/// prompt tokens.
async fn burst(
    http: &reqwest::Client,
    bodies: Vec<Value>,
    target: impl Fn(usize) -> String,
) -> anyhow::Result<f64> {
    let (mut prompt, mut cached) = (0u64, 0u64);
    for (c, chunk) in bodies.chunks(4).enumerate() {
        let sends = chunk.iter().enumerate().map(|(k, b)| {
            let url = target(c * 4 + k);
            async move {
                let resp = http.post(url).json(b).send().await?;
                let status = resp.status();
                let body: Value = resp.json().await?;
                if !status.is_success() {
                    bail!("status {status}: {body}");
                }
                usage(&body)
            }
        });
        for r in futures::future::join_all(sends).await {
            let (p, h) = r?;
            prompt += p;
            cached += h;
        }
    }
    Ok(cached as f64 / prompt.max(1) as f64)
}

/// The burst's requests, groups interleaved (every group's first request comes first).
fn bodies(arm: &str) -> Vec<Value> {
    (0..PER_GROUP)
        .flat_map(|i| (0..GROUPS).map(move |g| (g, i)))
        .map(|(g, i)| chat(arm, g, i))
        .collect()
}

/// The `/metrics` text of `pod`'s sidecar (its admin port, the operator's default 9090).
async fn sidecar_metrics(http: &reqwest::Client, pod: &RunningPod) -> anyhow::Result<String> {
    Ok(http
        .get(format!("http://{}:9090/metrics", pod.ip))
        .send()
        .await?
        .text()
        .await?)
}

fn workers_of(kubelet: &FakeKubelet) -> Vec<RunningPod> {
    kubelet
        .running()
        .into_iter()
        .filter(|p| p.name.starts_with(SET) && p.ready)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_router_routes_cache_aware_and_survives_a_rollout() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let ns = cluster.namespace(&client, "oprouter").await?;
    let (_hub, opts) =
        router_pod_options(cluster, &ns, kvroute_operator::desired::router::HF_HOME).await?;
    let kubelet = FakeKubelet::start(client.clone(), opts).await?;
    let _operator = OperatorProcess::start(
        cluster,
        &format!("operator-{ns}"),
        "op-router-e2e",
        &[
            format!("--namespace={ns}"),
            format!("--router-namespace={ns}"),
            "--router-replicas=1".to_string(),
        ],
    )
    .await?;

    // The operator's router pod, run from its spec. It turns Ready only once a listed
    // worker streams to it, so the workers start before that.
    let router = wait_for("the operator's router pod runs", WAIT, || async {
        Ok(kubelet
            .running()
            .into_iter()
            .find(|p| p.name.starts_with("kvroute-router")))
    })
    .await
    .with_context(|| format!("kubelet problems: {:?}", kubelet.problems()))?;
    let ingest = format!(
        "{}.{ns}.svc:{}",
        kvroute_operator::desired::router::INGEST_SERVICE,
        kvroute_operator::desired::router::INGEST_PORT
    );
    kubelet.rewrite(
        ingest,
        format!(
            "{}:{}",
            router.ip,
            kvroute_operator::desired::router::INGEST_PORT
        ),
    );
    let gateway = format!(
        "http://{}:{}",
        router.ip,
        kvroute_operator::desired::router::HTTP_PORT
    );
    let admin = format!(
        "http://{}:{}",
        router.ip,
        kvroute_operator::desired::router::ADMIN_PORT
    );

    // Three mock workers whose tokenizer is the image's Qwen3; the router's comes from the
    // Hub (the model's own repo by default).
    let sets: Api<InferenceWorkerSet> = Api::namespaced(client.clone(), &ns);
    let ws: InferenceWorkerSet = serde_json::from_value(json!({
        "apiVersion": "kvroute.dev/v1alpha1", "kind": "InferenceWorkerSet",
        "metadata": {"name": SET},
        "spec": {
            "model": {"name": "Qwen/Qwen3-0.6B", "servedName": SERVED},
            "replicas": 3,
            "engine": {"mode": "mock", "speedup": 50.0, "port": ENGINE_PORT,
                       "args": ["--tokenizer", format!("{IMAGE_TOKENIZERS}/qwen3")]},
        },
    }))?;
    sets.create(&PostParams::default(), &ws).await?;

    let http = reqwest::Client::new();
    let routable = |n: usize| {
        let (http, admin) = (http.clone(), admin.clone());
        async move {
            let report: Value = http
                .get(format!("{admin}/debug/workers"))
                .send()
                .await?
                .json()
                .await?;
            let ids: Vec<String> = report["workers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|w| w["routable"] == json!(true))
                .filter_map(|w| w["id"].as_str().map(str::to_string))
                .collect();
            anyhow::Ok((ids.len() == n).then_some(ids))
        }
    };
    wait_for(
        "the operator's router sees 3 routable workers",
        WAIT,
        || routable(3),
    )
    .await
    .with_context(|| format!("kubelet problems: {:?}", kubelet.problems()))?;
    wait_for("the router's tokenizer is loaded", WAIT, || async {
        let r = http
            .get(format!("{admin}/readyz?model={SERVED}"))
            .send()
            .await?;
        Ok(r.status().is_success().then_some(()))
    })
    .await?;

    // Each sidecar tries one replay of vLLM's buffer when it starts and reads live events
    // after it; measuring before every sidecar is past that point would score a worker
    // whose cache the router cannot see yet.
    wait_for("every sidecar is past its initial replay", WAIT, || async {
        for pod in workers_of(&kubelet) {
            if !sidecar_metrics(&http, &pod)
                .await?
                .contains("kvroute_sidecar_replays_total{")
            {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await?;

    // The burst through the router, then the same shape (other prefixes) to random pods.
    let url = format!("{gateway}/v1/chat/completions");
    let routed = burst(&http, bodies("k"), |_| url.clone()).await?;
    let pods = workers_of(&kubelet);
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let picks: Vec<usize> = (0..GROUPS * PER_GROUP)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % pods.len() as u64) as usize
        })
        .collect();
    let random = burst(&http, bodies("r"), |i| {
        format!(
            "http://{}:{ENGINE_PORT}/v1/chat/completions",
            pods[picks[i]].ip
        )
    })
    .await?;
    let metrics = http
        .get(format!("{admin}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    println!("prompt-token cache hit: operator's router {routed:.3}, random {random:.3}");
    assert!(
        !metrics.contains("kvroute_router_degraded_decisions_total{"),
        "the operator's router made degraded (load-only) decisions:\n{metrics}"
    );
    // KVROUTE_E2E_DIAG=1 prints the diagnostics of a failure on success too.
    if routed < random + 0.15 || std::env::var_os("KVROUTE_E2E_DIAG").is_some() {
        let workers = http
            .get(format!("{admin}/debug/workers"))
            .send()
            .await?
            .text()
            .await?;
        let mut sidecars = String::new();
        for pod in workers_of(&kubelet) {
            let m = sidecar_metrics(&http, &pod).await?;
            for l in m.lines().filter(|l| {
                [
                    "kvroute_sidecar_resident_blocks",
                    "kvroute_sidecar_live_messages",
                    "kvroute_sidecar_seq_gaps",
                    "kvroute_sidecar_replays",
                    "kvroute_sidecar_resyncs",
                    "kvroute_sidecar_kv_events",
                ]
                .iter()
                .any(|p| l.starts_with(p))
            }) {
                sidecars += &format!("{} {l}\n", pod.name);
            }
            // What the KV-event path logged: connects, gaps, replays, resyncs.
            sidecars += &cluster.pod_log_lines(
                &ns,
                &pod.name,
                &[
                    "ZMQ", "zmq", "SUB", "PUB", "replay", "resync", "gap", "KV event",
                ],
                25,
            );
        }
        let report = format!(
            "cache-aware routing hit {routed:.3} of prompt tokens, random {random:.3}\n\
             sidecars:\n{sidecars}/debug/workers: {workers}"
        );
        if routed < random + 0.15 {
            bail!("{report}");
        }
        println!("{report}");
    }

    // A WorkerSet change rolls every pod while requests keep succeeding.
    let before: Vec<String> = workers_of(&kubelet).into_iter().map(|p| p.name).collect();
    let patch = json!({"spec": {"engine": {"args": [
        "--tokenizer", format!("{IMAGE_TOKENIZERS}/qwen3"), "--max-num-seqs", "128"]}}});
    sets.patch(SET, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let mut sent = 0usize;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let resp = http
            .post(&url)
            .json(&chat("roll", sent % 3, sent))
            .send()
            .await?;
        let status = resp.status();
        let body: Value = resp.json().await?;
        assert!(
            status.is_success(),
            "request {sent} during the rollout: {status} {body}"
        );
        sent += 1;
        let now: Vec<String> = workers_of(&kubelet).into_iter().map(|p| p.name).collect();
        if now.len() == 3 && now.iter().all(|p| !before.contains(p)) && routable(3).await?.is_some()
        {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("rollout did not finish: before {before:?}, now {now:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("{sent} requests succeeded during the rollout");
    kubelet.stop(Duration::from_secs(2)).await;
    Ok(())
}
