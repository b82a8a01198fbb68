//! LoRA-aware routing over real sockets: 3 mock vLLM workers serving different adapters, their
//! sidecars and the router, as real processes of the `kvroute` binary on loopback (build it
//! first: `cargo build -p kvroute-cli`). See docs/lora.md.
//!
//! ```text
//! w0: tiny + sql        w1: tiny + sql, de        w2: tiny (adapters loaded at runtime)
//! test --HTTP model=sql|de|tiny--> router --> mock-vllm x3 --ZMQ KV events (lora_name)--> sidecars
//!                                    ^---- gRPC Ingest (blocks + LoadSample.lora_adapters) ----+
//! ```
//!
//! Asserts: the router learns each worker's adapters (sidecars poll /v1/models) and lists them
//! in /v1/models; requests for an adapter land only on workers serving it; a repeated prefix
//! under an adapter goes back to the worker that cached it and hits its cache (router index and
//! vLLM's usage agree), while the same prefix under another adapter or the base model finds no
//! cached block; an unknown adapter is a 404 in the gateway's error shape; an adapter loaded at
//! runtime (`/v1/load_lora_adapter`) becomes routable by the next poll, and one unloaded stops
//! being a model.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
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
        env: vec![
            ("RUST_LOG".into(), "info".into()),
            ("VLLM_ALLOW_RUNTIME_LORA_UPDATING".into(), "True".into()),
        ],
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

async fn start(dir: &Path) -> anyhow::Result<Setup> {
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

    // Both spellings of vLLM's --lora-modules.
    let adapters: [&[&str]; 3] = [
        &["sql=/adapters/sql"],
        &[
            "sql=/adapters/sql",
            r#"{"name":"de","path":"/adapters/de","base_model_name":"tiny"}"#,
        ],
        &[],
    ];
    for (i, w) in workers.iter().enumerate() {
        let kv = json!({
            "enable_kv_cache_events": true, "publisher": "zmq",
            "endpoint": format!("tcp://*:{}", w.pub_port),
            "replay_endpoint": format!("tcp://*:{}", w.replay),
            "topic": "",
        });
        let mut args = vec![
            "--host=127.0.0.1".into(),
            format!("--port={}", w.http),
            format!("--served-model-name={MODEL}"),
            "--profile=tiny".into(),
            "--enable-prompt-tokens-details".into(),
            format!("--kv-events-config={kv}"),
            "--enable-lora".into(),
        ];
        if !adapters[i].is_empty() {
            args.push("--lora-modules".into());
            args.extend(adapters[i].iter().map(|a| a.to_string()));
        }
        let mut mock = procs::spawn_kvroute(
            &format!("mock-{i}"),
            "mock-vllm",
            &args,
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
                "--lora-poll-interval-ms=200".into(),
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

/// What the gateway answered: the worker that served it (if any), status, body.
struct Answer {
    worker: Option<String>,
    status: u16,
    body: Value,
}

impl Setup {
    async fn workers_json(&self) -> anyhow::Result<Vec<Value>> {
        let url = format!("http://127.0.0.1:{}/debug/workers", self.router_admin);
        let v: Value = reqwest::get(&url).await?.error_for_status()?.json().await?;
        Ok(v["workers"].as_array().cloned().unwrap_or_default())
    }

    async fn explain(&self, model: &str, prompt: &[u32]) -> anyhow::Result<Value> {
        let url = format!("http://127.0.0.1:{}/debug/explain", self.router_admin);
        let resp = reqwest::Client::new()
            .post(&url)
            .json(&json!({"model": model, "prompt": prompt}))
            .send()
            .await?;
        Ok(resp.error_for_status()?.json().await?)
    }

    async fn complete(&self, model: &str, prompt: &[u32]) -> anyhow::Result<Answer> {
        let url = format!("http://127.0.0.1:{}/v1/completions", self.router_http);
        let resp = reqwest::Client::new()
            .post(&url)
            .json(&json!({"model": model, "prompt": prompt, "max_tokens": 2}))
            .send()
            .await?;
        let worker = resp
            .headers()
            .get("x-kvroute-worker")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let status = resp.status().as_u16();
        let body: Value = resp.json().await?;
        Ok(Answer {
            worker,
            status,
            body,
        })
    }

    /// A successful completion: the worker that served it and the usage's cached tokens.
    async fn served(&self, model: &str, prompt: &[u32]) -> anyhow::Result<(String, u64)> {
        let a = self.complete(model, prompt).await?;
        if a.status != 200 {
            bail!("{model}: gateway answered {}: {}", a.status, a.body);
        }
        let cached = a.body["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        Ok((a.worker.context("no x-kvroute-worker header")?, cached))
    }

    async fn lora_admin(&self, worker: usize, verb: &str, body: Value) -> anyhow::Result<()> {
        let url = format!(
            "http://127.0.0.1:{}/v1/{verb}_lora_adapter",
            self.workers[worker].http
        );
        let resp = reqwest::Client::new().post(&url).json(&body).send().await?;
        anyhow::ensure!(resp.status().is_success(), "{verb}: {}", resp.status());
        Ok(())
    }
}

fn cached_on(rec: &Value, worker: &str) -> Option<u64> {
    rec["candidates"]
        .as_array()?
        .iter()
        .find(|c| c["worker"] == worker)
        .and_then(|c| c["cached_blocks"].as_u64())
}

fn candidates(rec: &Value) -> Vec<String> {
    let mut v: Vec<String> = rec["candidates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["worker"].as_str().map(str::to_owned))
        .collect();
    v.sort();
    v
}

fn logs(dir: &Path) -> String {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(30)..].join("\n");
        out.push(format!("--- {}\n{tail}", entry.path().display()));
    }
    out.join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapter_requests_land_on_serving_workers_and_reuse_cache_within_the_adapter()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let result = async {
        let setup = start(dir.path()).await.context("setup did not start")?;
        run(&setup).await
    }
    .await;
    result.map_err(|e| anyhow::anyhow!("{e:#}\n{}", logs(dir.path())))
}

async fn run(s: &Setup) -> anyhow::Result<()> {
    // The router learns every worker's adapters from its sidecar.
    procs::wait_for(
        "3 routable workers with their adapters",
        WAIT,
        || async move {
            let rows = s.workers_json().await?;
            let adapters = |id: &str| {
                rows.iter()
                    .find(|w| w["id"] == id)
                    .and_then(|w| w["lora_adapters"].as_array().cloned())
                    .unwrap_or_default()
            };
            let routable = rows.iter().filter(|w| w["routable"] == true).count();
            Ok((routable == 3
                && adapters("default/w0") == [json!("sql")]
                && adapters("default/w1") == [json!("de"), json!("sql")]
                && adapters("default/w2").is_empty())
            .then_some(()))
        },
    )
    .await?;
    let models: Value = reqwest::get(format!("http://127.0.0.1:{}/v1/models", s.router_http))
        .await?
        .json()
        .await?;
    let ids: Vec<&str> = models["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["id"].as_str())
        .collect();
    for want in [MODEL, "sql", "de"] {
        anyhow::ensure!(ids.contains(&want), "/v1/models lacks {want}: {ids:?}");
    }

    // 1. Adapter requests land only on workers serving the adapter.
    let serving_sql = ["default/w0", "default/w1"];
    for i in 0..6u32 {
        let prompt: Vec<u32> = (0..40).map(|t| 1 + (t * 7 + i * 31) % 200).collect();
        let (w, _) = s.served("sql", &prompt).await?;
        anyhow::ensure!(serving_sql.contains(&w.as_str()), "sql went to {w}");
        let (w, _) = s.served("de", &prompt).await?;
        anyhow::ensure!(w == "default/w1", "de went to {w}");
    }
    let rec = s.explain("sql", &[1, 2, 3]).await?;
    anyhow::ensure!(
        candidates(&rec) == serving_sql
            && rec["lora"] == json!({"adapter": "sql", "base_model": MODEL}),
        "explain for sql: {rec}"
    );

    // 2. A prefix cached under sql: the repeat goes back to the same worker and hits.
    let p: Vec<u32> = (0..256).map(|i| 20 + (i % 180)).collect();
    let mut first = p.clone();
    first.extend([5, 5, 5]);
    let (x, cached) = s.served("sql", &first).await?;
    anyhow::ensure!(cached == 0, "a fresh prefix hit {cached} tokens");
    let blocks = (p.len() / BLOCK) as u64;
    procs::wait_for("the sidecar reports the prefix under sql", WAIT, || async {
        let rec = s.explain("sql", &p).await?;
        Ok((cached_on(&rec, &x) == Some(blocks)).then_some(()))
    })
    .await?;
    let mut again = p.clone();
    again.extend([9, 9, 9]);
    let (y, cached) = s.served("sql", &again).await?;
    anyhow::ensure!(y == x, "the repeat went to {y}, not {x}");
    anyhow::ensure!(cached >= 240, "vLLM reused only {cached} tokens within sql");

    // 3. The same tokens under another adapter or the base model find nothing cached.
    let rec = s.explain("de", &p).await?;
    anyhow::ensure!(cached_on(&rec, "default/w1") == Some(0), "de: {rec}");
    let rec = s.explain(MODEL, &p).await?;
    anyhow::ensure!(candidates(&rec).len() == 3, "base: every worker: {rec}");
    for w in &s.workers {
        anyhow::ensure!(cached_on(&rec, &w.id) == Some(0), "base on {}: {rec}", w.id);
    }
    if x == "default/w1" {
        let (_, cached) = s.served("de", &again).await?;
        anyhow::ensure!(cached == 0, "de reused {cached} tokens cached under sql");
    }
    let mut base = p.clone();
    base.extend([3, 3, 3]);
    let a = s.complete(MODEL, &base).await?;
    anyhow::ensure!(a.status == 200, "base: {}", a.body);
    if a.worker.as_deref() == Some(x.as_str()) {
        let cached = a.body["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
        anyhow::ensure!(
            cached == Some(0),
            "base reused {cached:?} tokens cached under sql"
        );
    }

    // 4. An adapter nobody serves: the gateway's 404.
    let a = s.complete("fr", &p).await?;
    anyhow::ensure!(
        a.status == 404
            && a.body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("fr")),
        "unknown adapter: {} {}",
        a.status,
        a.body
    );

    // 5. Loaded at runtime on w2: routable by the next poll, and only there.
    s.lora_admin(
        2,
        "load",
        json!({"lora_name": "fr", "lora_path": "/adapters/fr"}),
    )
    .await?;
    procs::wait_for("the router routes fr", WAIT, || async {
        let a = s.complete("fr", &p).await?;
        Ok((a.status == 200).then_some(a.worker))
    })
    .await?
    .filter(|w| w == "default/w2")
    .context("fr served elsewhere than w2")?;
    // Unloaded: gone from the router's models once the poll sees it.
    s.lora_admin(1, "unload", json!({"lora_name": "de"}))
        .await?;
    procs::wait_for("de to disappear", WAIT, || async {
        Ok((s.complete("de", &p).await?.status == 404).then_some(()))
    })
    .await?;
    Ok(())
}
