//! Passive health over real sockets: two mock vLLM workers, their sidecars and the router, as
//! real processes of the `kvroute` binary on loopback (build it first: `cargo build -p
//! kvroute-cli`). See docs/operations.md, "Passive health".
//!
//! ```text
//! test --HTTP--> router --> mock-vllm w0 (POST /mock/fault {"status": 500}: every request 500)
//!                       \-> mock-vllm w1 (healthy)
//!        sidecars --gRPC Ingest--> router
//! ```
//!
//! Asserts: once w0 answers 500, three failures in a row (`--outlier-consecutive-failures=3`)
//! eject it; while ejected every request is served by w1, `/debug/explain` lists w0 under
//! `ejected` with reason `http_5xx`, `/debug/workers` shows the ejection and the metrics count
//! it (`kvroute_router_outlier_ejections_total{reason="http_5xx"}`, the ejected gauge at 1);
//! when the fault ends and the back-off passes, w0 is a candidate again and serves requests.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use kvroute_e2e::procs::{self, Child, SpawnOptions};
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

struct Setup {
    router_http: u16,
    router_admin: u16,
    _procs: Vec<Child>,
    workers: Vec<Worker>,
}

fn opts(dir: &Path, name: &str) -> SpawnOptions {
    SpawnOptions {
        env: vec![("RUST_LOG".into(), "info".into())],
        log: Some(dir.join(format!("{name}.log"))),
    }
}

fn config_yaml(workers: &[Worker]) -> String {
    let mut s = format!(
        "apiVersion: kvroute.dev/v1alpha1\nkind: InferenceWorkerSet\nmetadata: {{name: tiny-set}}\nspec:\n  model: {{name: tiny}}\n  replicas: {n}\n  engine: {{mode: mock, port: 8000}}\nstatus:\n  replicas: {n}\n  readyReplicas: {n}\n  workers:\n",
        n = workers.len()
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

async fn start(dir: &Path) -> anyhow::Result<Setup> {
    let port = procs::free_local_port;
    let mut workers = Vec::new();
    for i in 0..2 {
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
    let mut children = Vec::new();
    let mut router = procs::spawn_kvroute(
        "router",
        "router",
        &[
            format!("--http-addr=127.0.0.1:{router_http}"),
            format!("--grpc-addr=127.0.0.1:{router_grpc}"),
            format!("--admin-addr=127.0.0.1:{router_admin}"),
            format!("--config={}", config.display()),
            "--seed=1".into(),
            "--expose-routing-headers".into(),
            // No retry elsewhere: each failure reaches the client, one per request.
            "--max-retries=0".into(),
            "--outlier-consecutive-failures=3".into(),
            "--outlier-base-ejection-s=2".into(),
            "--outlier-max-ejection-s=4".into(),
        ],
        &opts(dir, "router"),
    )?;
    procs::wait_http_ok(
        &format!("http://127.0.0.1:{router_admin}/healthz"),
        WAIT,
        Some(&mut router),
    )
    .await?;
    children.push(router);
    for (i, w) in workers.iter().enumerate() {
        let kv = json!({
            "enable_kv_cache_events": true, "publisher": "zmq",
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
                format!("--kv-events-config={kv}"),
            ],
            &opts(dir, &format!("mock-{i}")),
        )?;
        procs::wait_http_ok(
            &format!("http://127.0.0.1:{}/health", w.http),
            WAIT,
            Some(&mut mock),
        )
        .await?;
        children.push(mock);
    }
    for (i, w) in workers.iter().enumerate() {
        let mut sc = procs::spawn_kvroute(
            &format!("sidecar-{i}"),
            "sidecar",
            &[
                format!("--zmq-endpoint=tcp://127.0.0.1:{}", w.pub_port),
                format!("--replay-endpoint=tcp://127.0.0.1:{}", w.replay),
                format!("--vllm-url=http://127.0.0.1:{}", w.http),
                format!("--router=http://127.0.0.1:{router_grpc}"),
                format!("--worker-id={}", w.id),
                format!("--worker-address=127.0.0.1:{}", w.http),
                format!("--model={MODEL}"),
                format!("--block-size={BLOCK}"),
                format!("--admin-addr=127.0.0.1:{}", w.sidecar_admin),
                "--no-gpu".into(),
            ],
            &opts(dir, &format!("sidecar-{i}")),
        )?;
        procs::wait_http_ok(
            &format!("http://127.0.0.1:{}/healthz", w.sidecar_admin),
            WAIT,
            Some(&mut sc),
        )
        .await?;
        children.push(sc);
    }
    Ok(Setup {
        router_http,
        router_admin,
        _procs: children,
        workers,
    })
}

impl Setup {
    async fn workers_json(&self) -> anyhow::Result<Vec<Value>> {
        let url = format!("http://127.0.0.1:{}/debug/workers", self.router_admin);
        let v: Value = reqwest::get(&url).await?.error_for_status()?.json().await?;
        Ok(v["workers"].as_array().cloned().unwrap_or_default())
    }

    async fn worker(&self, id: &str) -> anyhow::Result<Value> {
        self.workers_json()
            .await?
            .into_iter()
            .find(|w| w["id"] == id)
            .with_context(|| format!("{id} not in /debug/workers"))
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

    async fn metrics(&self) -> anyhow::Result<String> {
        let url = format!("http://127.0.0.1:{}/metrics", self.router_admin);
        Ok(reqwest::get(&url).await?.error_for_status()?.text().await?)
    }

    /// One completion: (status, the worker that served or failed it).
    async fn complete(&self, prompt: &[u32]) -> anyhow::Result<(u16, Option<String>)> {
        let url = format!("http://127.0.0.1:{}/v1/completions", self.router_http);
        let resp = reqwest::Client::new()
            .post(&url)
            .json(&json!({"model": MODEL, "prompt": prompt, "max_tokens": 2}))
            .send()
            .await?;
        let worker = resp
            .headers()
            .get("x-kvroute-worker")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let status = resp.status().as_u16();
        let body = resp.bytes().await?;
        if status != 200 && status != 502 {
            eprintln!("status {status}: {}", String::from_utf8_lossy(&body));
        }
        Ok((status, worker))
    }

    async fn fault(&self, worker: usize, status: u16) -> anyhow::Result<()> {
        let url = format!("http://127.0.0.1:{}/mock/fault", self.workers[worker].http);
        let resp = reqwest::Client::new()
            .post(&url)
            .json(&json!({ "status": status }))
            .send()
            .await?;
        anyhow::ensure!(resp.status().is_success(), "fault: {}", resp.status());
        Ok(())
    }
}

/// The value of the series `name{labels}` (exact label text) in a scrape.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// A 64-token prompt of the tiny model's vocabulary (256 ids), different for each `i`.
fn prompt(i: u32) -> Vec<u32> {
    (0..64)
        .map(|t| 1 + (i * 31 + t * 7 + t * t * i) % 250)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_answering_500_is_ejected_then_readmitted() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let setup = start(dir.path()).await?;
    let (w0, w1) = (setup.workers[0].id.clone(), setup.workers[1].id.clone());
    procs::wait_for("both workers routable", WAIT, || async {
        let ws = setup.workers_json().await?;
        let ok = ws.iter().filter(|w| w["routable"] == true).count() == 2;
        Ok(ok.then_some(()))
    })
    .await?;

    setup.fault(0, 500).await?;
    // Requests until w0 has failed three in a row (w1's successes do not reset w0's run).
    let mut failed_on_w0 = 0;
    let mut i = 0;
    while setup.worker(&w0).await?["ejection"].is_null() {
        anyhow::ensure!(i < 200, "w0 not ejected after {i} requests");
        let (status, worker) = setup.complete(&prompt(i)).await?;
        i += 1;
        match worker.as_deref() {
            Some(w) if w == w0 => {
                assert_eq!(status, 502, "w0's 500 reaches the client as a 502");
                failed_on_w0 += 1;
            }
            Some(w) if w == w1 => assert_eq!(status, 200),
            other => anyhow::bail!("unexpected worker {other:?} (status {status})"),
        }
    }
    assert_eq!(failed_on_w0, 3, "the third failure in a row ejects");
    let row = setup.worker(&w0).await?;
    assert_eq!(row["ejection"]["reason"], "http_5xx", "{row}");
    assert_eq!(row["ejection"]["ejections"], 1, "{row}");
    assert_eq!(row["routable"], true, "ejected is not unroutable: {row}");

    let rec = setup.explain(&prompt(1_000)).await?;
    let ejected = rec["ejected"].as_array().cloned().unwrap_or_default();
    assert_eq!(ejected.len(), 1, "{rec}");
    assert_eq!(ejected[0]["worker"], w0.as_str());
    assert_eq!(ejected[0]["why"], "ejected");
    assert_eq!(ejected[0]["reason"], "http_5xx");
    assert_eq!(ejected[0]["kept"], false);
    let candidates: Vec<&str> = rec["candidates"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c["worker"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(candidates, vec![w1.as_str()], "{rec}");

    let text = setup.metrics().await?;
    assert_eq!(
        sample(
            &text,
            r#"kvroute_router_outlier_ejections_total{reason="http_5xx"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"kvroute_router_worker_failures_total{reason="http_5xx"}"#
        ),
        Some(3.0)
    );
    assert_eq!(
        sample(&text, "kvroute_router_outlier_ejected_workers"),
        Some(1.0)
    );

    // While w0 is ejected, requests go to w1 (the check stops once the ejection ends).
    for j in 0..5 {
        let (status, worker) = setup.complete(&prompt(2_000 + j)).await?;
        if setup.worker(&w0).await?["ejection"].is_null() {
            break;
        }
        assert_eq!((status, worker.as_deref()), (200, Some(w1.as_str())));
    }

    // The fault ends; after the back-off w0 is a candidate again and serves requests.
    setup.fault(0, 0).await?;
    procs::wait_for("w0 readmitted", WAIT, || async {
        let row = setup.worker(&w0).await?;
        Ok(row["ejection"].is_null().then_some(()))
    })
    .await?;
    let rec = setup.explain(&prompt(3_000)).await?;
    assert!(rec["ejected"].is_null(), "{rec}");
    assert_eq!(rec["candidates"].as_array().map(Vec::len), Some(2), "{rec}");
    let mut k = 0;
    procs::wait_for("w0 serving again", WAIT, || {
        k += 1;
        let p = prompt(4_000 + k);
        let setup = &setup;
        let w0 = w0.clone();
        async move {
            let (status, worker) = setup.complete(&p).await?;
            anyhow::ensure!(status == 200, "status {status} from {worker:?}");
            Ok((worker.as_deref() == Some(w0.as_str())).then_some(()))
        }
    })
    .await?;
    let text = setup.metrics().await?;
    assert_eq!(
        sample(&text, "kvroute_router_outlier_ejected_workers"),
        Some(0.0)
    );
    Ok(())
}
