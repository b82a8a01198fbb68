//! Discovery from a Gateway API Inference Extension `InferencePool` end to end: a real API
//! server with GIE's InferencePool CRD (the fixture `e2e/k8s/gie-inferencepool-crd.yaml`),
//! plain Pods running the mock vLLM worker alone (no kvroute sidecar, no WorkerSet), the fake
//! kubelet running them on 127.A.B.C, and `kvroute router --kubernetes --gie-inference-pool`.
//!
//! ```text
//! test --create--> Pods gie-0, gie-1 (label app=vllm-gie, mock vLLM on :8000)
//!      --create--> InferencePool "llama" (inference.networking.k8s.io/v1, annotation
//!                  kvroute.dev/model=llama-gie, selector app=vllm-gie, targetPorts 8000)
//!                  InferencePool "nomodel" (no annotation: skipped and counted)
//!      router <--watch-- API server (GIE pools, Pods)
//! test --HTTP /v1/chat/completions (model llama-gie)--> router --> a pod's mock vLLM
//! ```
//!
//! Asserts: both pods become routable load-only workers (no sidecar), requests for the
//! annotated model answer 200 from one of them, `/debug/explain` marks the candidates
//! load-only, the pools gauge counts one used and one skipped; relabelling a pod out of the
//! selector takes it out of the worker table and requests land on the other; deleting the
//! pool makes the model unknown (404).
//!
//! Needs the binaries of `bash e2e/k8s/setup.sh` and `target/<profile>/kvroute`
//! (`cargo build -p kvroute-cli`); fails naming what is missing.

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kvroute_crds::gie::GieInferencePool;
use kvroute_e2e::harness::{Cluster, TestNamespace, install_gie_crd};
use kvroute_e2e::procs::{self, Child, SpawnOptions, wait_for};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
const MODEL: &str = "llama-gie";
const POOL: &str = "llama";
const LABEL: &str = "vllm-gie";

/// `kvroute router --kubernetes --gie-inference-pool` on loopback, watching one namespace.
struct Router {
    child: Child,
    http: u16,
    admin: u16,
}

impl Router {
    async fn start(cluster: &Cluster, ns: &str) -> anyhow::Result<Self> {
        let port = procs::free_local_port;
        let (http, grpc, admin) = (port()?, port()?, port()?);
        let env = vec![
            (
                "KUBECONFIG".to_string(),
                cluster.kubeconfig().display().to_string(),
            ),
            (
                "RUST_LOG".to_string(),
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info,kube=warn".into()),
            ),
        ];
        let log = Some(cluster.dir().join("log").join(format!("router-{ns}.log")));
        let mut child = procs::spawn_kvroute(
            "router",
            "router",
            &[
                format!("--http-addr=127.0.0.1:{http}"),
                format!("--grpc-addr=127.0.0.1:{grpc}"),
                format!("--admin-addr=127.0.0.1:{admin}"),
                "--kubernetes".into(),
                format!("--namespace={ns}"),
                format!("--gie-inference-pool={POOL},{ns}/nomodel"),
                "--seed=1".into(),
                "--expose-routing-headers".into(),
            ],
            &SpawnOptions { env, log },
        )?;
        if let Some(pid) = child.id() {
            cluster.reaper().register(pid);
        }
        procs::wait_http_ok(
            &format!("http://127.0.0.1:{admin}/healthz"),
            WAIT,
            Some(&mut child),
        )
        .await?;
        Ok(Self { child, http, admin })
    }

    fn gateway(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.http)
    }

    fn admin(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.admin)
    }

    /// `(id, load_only)` of the routable workers of the GIE pool in `/debug/workers`.
    async fn routable(&self) -> anyhow::Result<Vec<(String, bool)>> {
        let report: Value = reqwest::get(self.admin("/debug/workers"))
            .await?
            .error_for_status()?
            .json()
            .await?;
        let workers = report["workers"]
            .as_array()
            .context("/debug/workers has no workers array")?;
        let mut out: Vec<(String, bool)> = workers
            .iter()
            .filter(|w| w["routable"] == json!(true) && w["worker_set"] == json!("gie:llama"))
            .filter_map(|w| {
                let id = w["id"].as_str()?.to_string();
                Some((id, w["load_only"] == json!(true)))
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// Waits until the routable workers of the pool are exactly `pods` (pod names).
    async fn wait_routable(&mut self, env: &TestNamespace, pods: &[&str]) -> anyhow::Result<()> {
        let want: Vec<(String, bool)> = pods
            .iter()
            .map(|p| (format!("{}/{p}", env.ns), true))
            .collect();
        let result = wait_for(
            &format!("router routes load-only to exactly {pods:?}"),
            WAIT,
            || async { Ok(self.routable().await.ok().filter(|r| *r == want)) },
        )
        .await;
        if let Err(e) = result {
            let workers = reqwest::get(self.admin("/debug/workers"))
                .await
                .ok()
                .map(|r| r.text());
            let workers = match workers {
                Some(f) => f.await.unwrap_or_default(),
                None => String::new(),
            };
            return Err(e.context(format!(
                "{}\n/debug/workers: {workers}\nrouter log:\n{}",
                env.describe().await,
                self.child.log_tail(60)
            )));
        }
        Ok(())
    }

    /// A chat completion: status, the `x-kvroute-worker` header and the body.
    async fn chat(&self, http: &reqwest::Client) -> anyhow::Result<(u16, String, Value)> {
        let resp = http
            .post(self.gateway("/v1/chat/completions"))
            .json(&chat_body())
            .send()
            .await?;
        let status = resp.status().as_u16();
        let worker = resp
            .headers()
            .get("x-kvroute-worker")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        Ok((status, worker, resp.json().await?))
    }
}

fn chat_body() -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Name three prime numbers."}],
        "max_tokens": 8,
    })
}

/// A pod running the mock vLLM worker alone, as a model server that a GIE pool selects.
fn worker_pod(name: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": LABEL}},
        "spec": {"containers": [{
            "name": "engine",
            "image": "ghcr.io/kvroute/mock-vllm:test",
            "args": ["--host", "0.0.0.0", "--port", "8000", "--model", "meta-llama/Llama-3.1-8B",
                     "--served-model-name", MODEL, "--speedup", "50"],
            "ports": [{"name": "http", "containerPort": 8000}],
            "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}},
        }]},
    }))?)
}

fn gie_pool(name: &str, model: Option<&str>) -> anyhow::Result<GieInferencePool> {
    let annotations = match model {
        Some(m) => json!({"kvroute.dev/model": m}),
        None => json!({}),
    };
    Ok(serde_json::from_value(json!({
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "selector": {"matchLabels": {"app": LABEL}},
            "targetPorts": [{"number": 8000}],
            "endpointPickerRef": {"name": "kvroute-router", "port": {"number": 9002}},
        },
    }))?)
}

/// The value of the series `name{labels}` in a Prometheus text body.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_takes_workers_from_a_gie_inference_pool() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    install_gie_crd(&cluster.client().await?).await?;
    let env = TestNamespace::new(cluster, "gie").await?;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    let pools: Api<GieInferencePool> = Api::namespaced(env.client.clone(), &env.ns);
    for name in ["gie-0", "gie-1"] {
        pods.create(&PostParams::default(), &worker_pod(name)?)
            .await?;
    }
    // The API server keeps what the typed model writes, defaults included.
    let created = pools
        .create(&PostParams::default(), &gie_pool(POOL, Some(MODEL))?)
        .await?;
    assert_eq!(created.served_model(), Some(MODEL));
    assert_eq!(
        created.spec.endpoint_picker_ref.failure_mode(),
        kvroute_crds::gie::FailureMode::FailClose
    );
    pools
        .create(&PostParams::default(), &gie_pool("nomodel", None)?)
        .await?;

    let mut router = Router::start(cluster, &env.ns).await?;
    router.wait_routable(&env, &["gie-0", "gie-1"]).await?;

    let http = reqwest::Client::new();
    let (status, worker, body) = router.chat(&http).await?;
    assert_eq!(status, 200, "{body}");
    assert!(
        ["gie-0", "gie-1"].iter().any(|p| worker.ends_with(p)),
        "x-kvroute-worker {worker:?}"
    );
    let content = body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(!content.is_empty(), "no content in {body}");

    // Explain says the candidates have no cache view.
    let explained: Value = http
        .post(router.admin("/debug/explain"))
        .json(&chat_body())
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let candidates = explained["candidates"]
        .as_array()
        .context("explain has no candidates")?;
    assert_eq!(candidates.len(), 2, "{explained}");
    assert!(
        candidates.iter().all(|c| c["load_only"] == json!(true)),
        "{explained}"
    );

    let metrics = reqwest::get(router.admin("/metrics")).await?.text().await?;
    assert_eq!(
        metric(
            &metrics,
            "kvroute_router_gie_inference_pools{state=\"used\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            "kvroute_router_gie_inference_pools{state=\"no_model\"}"
        ),
        Some(1.0)
    );

    // A pod relabelled out of the selector leaves the worker table.
    pods.patch(
        "gie-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "elsewhere"}}})),
    )
    .await?;
    router.wait_routable(&env, &["gie-0"]).await?;
    for _ in 0..3 {
        let (status, worker, body) = router.chat(&http).await?;
        assert_eq!(status, 200, "{body}");
        assert!(worker.ends_with("gie-0"), "x-kvroute-worker {worker:?}");
    }

    // The pool deleted, its model is gone.
    pools.delete(POOL, &DeleteParams::default()).await?;
    wait_for("router forgets the deleted pool's model", WAIT, || async {
        let (status, _, body) = router.chat(&http).await?;
        Ok((status == 404).then_some(body))
    })
    .await
    .map(|body| assert_eq!(body["error"]["code"], "model_not_found", "{body}"))?;

    router.child.stop(Duration::from_secs(5)).await?;
    env.stop().await;
    Ok(())
}
