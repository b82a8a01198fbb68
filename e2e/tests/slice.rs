//! The slice: 3 mock vLLM workers + 3 sidecars + the router, as real processes of the
//! `kvroute` binary on loopback (build it first: `cargo build -p kvroute-cli`).
//!
//! ```text
//! test --HTTP /v1/completions--> router --> mock-vllm x3 --ZMQ KV events--> sidecar x3
//!      --gRPC Picker (load)----^   ^------------- gRPC Ingest -----------------+
//! ```
//!
//! Asserts: a request with prefix P lands on worker X; the next request with P goes to X too;
//! once X is loaded (router-side assignments with long uncached suffixes) so that another
//! worker is predicted faster, a request with P goes elsewhere; a worker whose sidecar dies is
//! reported stale with its blocks kept and is no candidate; after everything is released the
//! router's in-flight count is zero.
//! Prompts are token ids (/v1/completions), so no tokenizer is needed on either side.
//!
//! Every gRPC link runs mTLS with certificates made here (one test CA): the router serves
//! with `--grpc-tls-dir`, each sidecar presents the WorkerSet's identity (`--router-tls-dir`),
//! and the test's Picker client a picker identity; `kvroute_router_grpc_unauthenticated` is 0.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use kvroute_e2e::procs::{self, Child, SpawnOptions};
use kvroute_proto::v1::picker_client::PickerClient;
use kvroute_proto::v1::{PickRequest, ReportAbortedRequest};
use kvroute_tls::testpki::{TestCa, write_dir};
use kvroute_tls::{ClientTls, Identity, WatchedClient};
use serde_json::{Value, json};

const MODEL: &str = "tiny";
const BLOCK: usize = 16;
const WAIT: Duration = Duration::from_secs(60);

struct Worker {
    id: String,
    http: u16,
    pub_port: u16,
    replay: u16,
    sidecar_admin: u16,
}

struct Slice {
    router_http: u16,
    router_grpc: u16,
    router_admin: u16,
    _router: Child,
    _mocks: Vec<Child>,
    sidecars: Vec<Option<Child>>,
    workers: Vec<Worker>,
    /// The Picker client's TLS directory.
    picker_tls: std::path::PathBuf,
}

fn log_opts(dir: &Path, name: &str) -> SpawnOptions {
    SpawnOptions {
        env: vec![("RUST_LOG".into(), "info".into())],
        log: Some(dir.join(format!("{name}.log"))),
    }
}

fn config_yaml(workers: &[Worker]) -> String {
    let mut s = String::from(
        "apiVersion: kvroute.dev/v1alpha1\nkind: InferenceWorkerSet\nmetadata: {name: tiny-set}\nspec:\n  model: {name: tiny}\n  replicas: 3\n  engine: {mode: mock, port: 8000}\nstatus:\n  replicas: 3\n  readyReplicas: 3\n  workers:\n",
    );
    for w in workers {
        let pod = w.id.trim_start_matches("default/");
        s.push_str(&format!(
            "    - {{pod: {pod}, address: \"127.0.0.1:{}\", ready: true}}\n",
            w.http
        ));
    }
    s
}

async fn start(dir: &Path) -> anyhow::Result<Slice> {
    let port = procs::free_local_port;
    let mut workers = Vec::new();
    for i in 0..3 {
        workers.push(Worker {
            id: format!("default/w{i}"),
            http: port()?,
            pub_port: port()?,
            replay: port()?,
            sidecar_admin: port()?,
        });
    }
    let (router_http, router_grpc, router_admin) = (port()?, port()?, port()?);
    let config = dir.join("router.yaml");
    std::fs::write(&config, config_yaml(&workers))?;
    let ca = TestCa::new("slice");
    let router_id = Identity::Router {
        namespace: "default".into(),
        pool: "slice".into(),
    };
    write_dir(
        &dir.join("tls/router"),
        &ca.leaf(Some(&router_id), &["localhost"]),
        &[&ca],
    );
    let sidecar_id = Identity::WorkerSet {
        namespace: "default".into(),
        name: "tiny-set".into(),
    };
    write_dir(
        &dir.join("tls/sidecar"),
        &ca.leaf(Some(&sidecar_id), &[]),
        &[&ca],
    );
    let picker_id = Identity::Picker {
        namespace: "default".into(),
        pool: "slice".into(),
    };
    write_dir(
        &dir.join("tls/picker"),
        &ca.leaf(Some(&picker_id), &[]),
        &[&ca],
    );

    let mut router = procs::spawn_kvroute(
        "router",
        "router",
        &[
            format!("--http-addr=127.0.0.1:{router_http}"),
            format!("--grpc-addr=127.0.0.1:{router_grpc}"),
            format!("--admin-addr=127.0.0.1:{router_admin}"),
            format!("--config={}", config.display()),
            format!("--grpc-tls-dir={}", dir.join("tls/router").display()),
            "--seed=1".into(),
            "--stale-after-s=5".into(),
            // The test reads `x-kvroute-worker`.
            "--expose-routing-headers".into(),
        ],
        &log_opts(dir, "router"),
    )?;
    procs::wait_http_ok(
        &format!("http://127.0.0.1:{router_admin}/healthz"),
        WAIT,
        Some(&mut router),
    )
    .await?;

    let mut mocks = Vec::new();
    for (i, w) in workers.iter().enumerate() {
        let kv = json!({
            "enable_kv_cache_events": true,
            "publisher": "zmq",
            "endpoint": format!("tcp://*:{}", w.pub_port),
            "replay_endpoint": format!("tcp://*:{}", w.replay),
            "topic": "",
        });
        let mut mock = procs::spawn_kvroute(
            &format!("mock-{i}"),
            "mock-vllm",
            &[
                "--host=127.0.0.1".into(),
                format!("--port={}", w.http),
                format!("--served-model-name={MODEL}"),
                "--profile=tiny".into(),
                "--enable-prompt-tokens-details".into(),
                format!("--kv-events-config={kv}"),
            ],
            &log_opts(dir, &format!("mock-{i}")),
        )?;
        procs::wait_http_ok(
            &format!("http://127.0.0.1:{}/health", w.http),
            WAIT,
            Some(&mut mock),
        )
        .await?;
        mocks.push(mock);
    }
    let mut sidecars = Vec::new();
    for (i, w) in workers.iter().enumerate() {
        let mut sc = procs::spawn_kvroute(
            &format!("sidecar-{i}"),
            "sidecar",
            &[
                format!("--zmq-endpoint=tcp://127.0.0.1:{}", w.pub_port),
                format!("--replay-endpoint=tcp://127.0.0.1:{}", w.replay),
                format!("--vllm-url=http://127.0.0.1:{}", w.http),
                format!("--router=http://127.0.0.1:{router_grpc}"),
                format!("--router-tls-dir={}", dir.join("tls/sidecar").display()),
                "--router-tls-server-name=localhost".into(),
                format!("--worker-id={}", w.id),
                format!("--worker-address=127.0.0.1:{}", w.http),
                format!("--model={MODEL}"),
                format!("--block-size={BLOCK}"),
                format!("--admin-addr=127.0.0.1:{}", w.sidecar_admin),
                "--no-gpu".into(),
            ],
            &log_opts(dir, &format!("sidecar-{i}")),
        )?;
        procs::wait_http_ok(
            &format!("http://127.0.0.1:{}/healthz", w.sidecar_admin),
            WAIT,
            Some(&mut sc),
        )
        .await?;
        sidecars.push(Some(sc));
    }
    Ok(Slice {
        router_http,
        router_grpc,
        router_admin,
        _router: router,
        _mocks: mocks,
        sidecars,
        workers,
        picker_tls: dir.join("tls/picker"),
    })
}

impl Slice {
    async fn get_json(&self, path: &str) -> anyhow::Result<Value> {
        let url = format!("http://127.0.0.1:{}{path}", self.router_admin);
        Ok(reqwest::get(&url).await?.error_for_status()?.json().await?)
    }

    async fn explain(&self, prompt: &[u32]) -> anyhow::Result<Value> {
        let url = format!("http://127.0.0.1:{}/debug/explain", self.router_admin);
        let resp = reqwest::Client::new()
            .post(&url)
            .json(&json!({"model": MODEL, "prompt": prompt}))
            .send()
            .await?;
        Ok(resp.error_for_status()?.json().await?)
    }

    async fn worker_rows(&self) -> anyhow::Result<Vec<Value>> {
        let v = self.get_json("/debug/workers").await?;
        Ok(v["workers"].as_array().cloned().unwrap_or_default())
    }

    /// Sends a completion through the gateway; returns the worker that served it.
    async fn complete(&self, prompt: &[u32]) -> anyhow::Result<String> {
        let url = format!("http://127.0.0.1:{}/v1/completions", self.router_http);
        let resp = reqwest::Client::new()
            .post(&url)
            .json(&json!({"model": MODEL, "prompt": prompt, "max_tokens": 4}))
            .send()
            .await?;
        let worker = resp
            .headers()
            .get("x-kvroute-worker")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .context("no x-kvroute-worker header")?;
        let status = resp.status();
        let body: Value = resp.json().await?;
        if !status.is_success() {
            bail!("gateway answered {status}: {body}");
        }
        Ok(worker)
    }
}

fn candidate<'a>(rec: &'a Value, worker: &str) -> Option<&'a Value> {
    rec["candidates"]
        .as_array()?
        .iter()
        .find(|c| c["worker"] == worker)
}

fn logs(dir: &Path) -> String {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let tail: Vec<&str> = text
            .lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        out.push(format!(
            "--- {}\n{}",
            entry.path().display(),
            tail.join("\n")
        ));
    }
    out.join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slice_prefix_affinity_load_spill_stale_and_release() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let result = async {
        let slice = start(dir.path()).await.context("slice did not start")?;
        run(slice).await
    }
    .await;
    result.map_err(|e| anyhow::anyhow!("{e:#}\n{}", logs(dir.path())))
}

async fn run(slice: Slice) -> anyhow::Result<()> {
    // Every worker routable (its sidecar has sent a snapshot).
    let s = &slice;
    procs::wait_for("3 routable workers", WAIT, || async move {
        let rows = s.worker_rows().await?;
        Ok((rows.iter().filter(|w| w["routable"] == true).count() == 3).then_some(()))
    })
    .await?;
    let metrics = reqwest::get(format!("http://127.0.0.1:{}/metrics", slice.router_admin))
        .await?
        .text()
        .await?;
    anyhow::ensure!(
        metrics.contains("kvroute_router_grpc_unauthenticated 0"),
        "the gRPC listener should run mTLS"
    );

    // A warm-up request: if a sidecar's subscription was not in place yet, its events are
    // lost, and the next batch's sequence jump makes the sidecar replay them.
    let warm: Vec<u32> = (0..64).map(|i| 1 + (i % 50)).collect();
    slice.complete(&warm).await?;

    // 1. A request with prefix P lands somewhere: X.
    // Without a tokenizer the mock's vocabulary is the 256 byte values.
    let p: Vec<u32> = (0..512).map(|i| 100 + (i % 150)).collect();
    let mut first = p.clone();
    first.extend([7, 7, 7]);
    let x = slice.complete(&first).await?;
    assert!(
        slice.workers.iter().any(|w| w.id == x),
        "unknown worker {x}"
    );

    // Its sidecar reports P's blocks: the router's index sees them on X.
    let want = p.len() / BLOCK;
    let (xr, pr) = (&x, &p);
    procs::wait_for("P indexed on X", WAIT, || async move {
        let rec = s.explain(pr).await?;
        let cached = candidate(&rec, xr)
            .and_then(|c| c["cached_blocks"].as_u64())
            .unwrap_or(0);
        Ok((cached as usize >= want).then_some(()))
    })
    .await?;

    // 2. The next request with P goes to X.
    let mut second = p.clone();
    second.extend([8, 8, 8]);
    assert_eq!(slice.complete(&second).await?, x, "prefix affinity");

    // 3. Load X through the Picker API: requests with P and long unique suffixes, never
    //    reported, until another worker is predicted clearly faster for P. The suffixes are
    //    long because X has learned from its first tokens how fast the (tiny, fast) mock is,
    //    while the others still predict from the L40S prior.
    let picker_tls = ClientTls::new(
        WatchedClient::client(slice.picker_tls.clone())?,
        Some("localhost"),
    )?;
    let endpoint =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", slice.router_grpc))?;
    let mut picker = PickerClient::new(picker_tls.channel(endpoint).await?);
    let mut held = Vec::new();
    let mut spilled = false;
    for i in 0..64u32 {
        let mut prompt = p.clone();
        prompt.extend((0..16_384).map(|j| 1 + ((i * 31 + j) % 90)));
        let body = serde_json::to_vec(&json!({"model": MODEL, "prompt": prompt}))?;
        let resp = picker
            .pick(PickRequest {
                path: "/v1/completions".into(),
                headers: Default::default(),
                body,
            })
            .await
            .map_err(|s| anyhow::anyhow!("pick: {s:?}"))?
            .into_inner();
        held.push(resp.decision_id);
        let rec = slice.explain(&p).await?;
        let on_x = candidate(&rec, &x)
            .and_then(|c| c["predicted_ttft"].as_f64())
            .unwrap_or(0.0);
        let best_other = rec["candidates"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["worker"] != x.as_str())
            .filter_map(|c| c["predicted_ttft"].as_f64())
            .fold(f64::INFINITY, f64::min);
        // Clear of the tie margin (0.02 s or 5%), so no tie-break can send it back to X.
        if on_x > best_other * 1.2 + 0.05 {
            spilled = true;
            break;
        }
    }
    assert!(
        spilled,
        "X never became slower than the others after {} held assignments",
        held.len()
    );
    let third = slice.complete(&second).await?;
    assert_ne!(third, x, "a loaded X must lose to an idle worker");

    // 4. Kill the sidecar of a worker: the router reports it stale with its blocks kept, and
    //    it is no candidate while its stream is closed.
    let victim = slice.workers.iter().position(|w| w.id != x).unwrap_or(0);
    let victim_id = slice.workers[victim].id.clone();
    let mut slice = slice;
    if let Some(mut sc) = slice.sidecars[victim].take() {
        sc.kill_group();
    }
    let (s, vr) = (&slice, &victim_id);
    procs::wait_for("victim stale", WAIT, || async move {
        let rows = s.worker_rows().await?;
        let row = rows.iter().find(|w| w["id"] == vr.as_str()).cloned();
        Ok(row
            .filter(|w| w["stale"] == true && w["sidecar_connected"] == false)
            .map(|_| ()))
    })
    .await?;
    let rows = slice.worker_rows().await?;
    let row = rows
        .iter()
        .find(|w| w["id"] == victim_id.as_str())
        .context("victim row")?;
    assert!(
        row["routable"] == false && row["index_blocks"].as_u64().unwrap_or(0) > 0,
        "{row}"
    );
    let rec = slice.explain(&p).await?;
    assert!(candidate(&rec, &victim_id).is_none(), "{rec}");

    // 5. Release the held assignments; nothing stays in flight.
    for id in held {
        let r = picker
            .report_aborted(ReportAbortedRequest {
                decision_id: id,
                reason: "test".into(),
            })
            .await
            .map_err(|s| anyhow::anyhow!("abort: {s:?}"))?
            .into_inner();
        assert!(r.known, "each held assignment is released exactly once");
    }
    procs::wait_for("in-flight zero", WAIT, || async move {
        let v = s.get_json("/debug/workers").await?;
        Ok((v["in_flight"] == 0).then_some(()))
    })
    .await?;
    let metrics = reqwest::get(format!("http://127.0.0.1:{}/metrics", slice.router_admin))
        .await?
        .text()
        .await?;
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("kvroute_router_in_flight{"))
    {
        assert!(line.ends_with(" 0"), "{line}");
    }
    Ok(())
}
