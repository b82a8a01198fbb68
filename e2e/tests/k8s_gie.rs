//! The Gateway API Inference Extension path end to end, through what the operator deploys: a
//! real API server with GIE's InferencePool CRD (the fixture
//! `e2e/k8s/gie-inferencepool-crd.yaml`), `kvroute operator --router-gie-inference-pool`, the
//! router Deployment it creates (its `epp` port and mTLS pair included) run by the fake kubelet
//! from its pod spec, plain Pods running the mock vLLM worker alone (no kvroute sidecar, no
//! WorkerSet) on 127.A.B.C, and the black-box endpoint-picker conformance suite
//! (`kvroute_e2e::epp_conformance`) speaking ext_proc to the router pod over mTLS with the
//! picker pair the operator issued for the GIE pool.
//!
//! ```text
//! test --create--> Pods gie-0..2 (label app=vllm-gie, mock vLLM on :8000)
//!      --create--> InferencePool "llama" (inference.networking.k8s.io/v1, annotation
//!                  kvroute.dev/model=llama-gie, selector app=vllm-gie, targetPorts 8000)
//!                  InferencePool "nomodel" (no annotation: skipped and counted)
//! operator --creates--> router Deployment (+ env KVROUTE_ROUTER_GIE_INFERENCE_POOL,
//!                       KVROUTE_ROUTER_EPP_LISTEN, port epp 9002), Secret kvroute-mtls with
//!                       picker-llama.{crt,key}
//! fake kubelet --runs--> the router pod on 127.A.B.C
//!      router <--watch-- API server (GIE pools, Pods)
//! test --HTTP /v1/chat/completions (model llama-gie)--> router pod :8080 --> a pod's mock vLLM
//! test --ext_proc over mTLS (picker-llama)--> router pod :9002 (conformance suite)
//! ```
//!
//! Asserts: the three pods become routable load-only workers (no sidecar); requests for the
//! annotated model answer 200; `/debug/explain` marks the candidates load-only; the pools
//! gauge counts one used and one skipped; every conformance check passes with the GIE pool's
//! picker pair, and the router's own pair (no picker identity) is refused and counted; relabelling
//! a pod out of the selector takes it out of the worker table; deleting the pool makes the
//! model unknown (404).
//!
//! Needs the binaries of `bash e2e/k8s/setup.sh` and `target/<profile>/kvroute`
//! (`cargo build -p kvroute-cli`); fails naming what is missing.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kvroute_crds::gie::GieInferencePool;
use kvroute_e2e::epp_conformance::{self, InFlightProbe};
use kvroute_e2e::harness::{Cluster, OperatorProcess, TestNamespace, install_gie_crd};
use kvroute_e2e::procs::wait_for;
use kvroute_operator::desired::router::{ADMIN_PORT, EPP_PORT, HTTP_PORT};
use kvroute_operator::pki::{CA_BUNDLE_KEY, MTLS_SECRET};
use kvroute_tls::{ClientTls, WatchedClient};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);
const MODEL: &str = "llama-gie";
const POOL: &str = "llama";
const LABEL: &str = "vllm-gie";
const PODS: [&str; 3] = ["gie-0", "gie-1", "gie-2"];

/// The operator's router pod, reached at its pod address.
struct RouterPod {
    ip: std::net::Ipv4Addr,
}

impl RouterPod {
    fn gateway(&self, path: &str) -> String {
        format!("http://{}:{HTTP_PORT}{path}", self.ip)
    }

    fn admin(&self, path: &str) -> String {
        format!("http://{}:{ADMIN_PORT}{path}", self.ip)
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
    async fn wait_routable(&self, env: &TestNamespace, pods: &[&str]) -> anyhow::Result<()> {
        let want: Vec<(String, bool)> = pods
            .iter()
            .map(|p| (format!("{}/{p}", env.ns), true))
            .collect();
        let result = wait_for(
            &format!("the router routes load-only to exactly {pods:?}"),
            WAIT,
            || async { Ok(self.routable().await.ok().filter(|r| *r == want)) },
        )
        .await;
        if let Err(e) = result {
            let workers = match reqwest::get(self.admin("/debug/workers")).await {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(e) => e.to_string(),
            };
            return Err(e.context(format!(
                "{}\n/debug/workers: {workers}",
                env.describe().await
            )));
        }
        Ok(())
    }

    /// A chat completion: status and body.
    async fn chat(&self, http: &reqwest::Client) -> anyhow::Result<(u16, Value)> {
        let resp = http
            .post(self.gateway("/v1/chat/completions"))
            .json(&chat_body())
            .send()
            .await?;
        let status = resp.status().as_u16();
        Ok((status, resp.json().await?))
    }
}

/// Writes key pair `stem` of the operator's Secret and its trust bundle as `tls.crt`,
/// `tls.key` and `ca.crt` into `dir`.
async fn pair_from_secret(secrets: &Api<Secret>, stem: &str, dir: &Path) -> anyhow::Result<()> {
    let secret = secrets.get(MTLS_SECRET).await?;
    let data = secret.data.unwrap_or_default();
    std::fs::create_dir_all(dir)?;
    for (key, file) in [
        (format!("{stem}.crt"), "tls.crt"),
        (format!("{stem}.key"), "tls.key"),
        (CA_BUNDLE_KEY.to_string(), "ca.crt"),
    ] {
        let v = data
            .get(&key)
            .with_context(|| format!("Secret {MTLS_SECRET} has no {key}"))?;
        std::fs::write(dir.join(file), &v.0)?;
    }
    Ok(())
}

/// An mTLS channel to the router pod's endpoint picker, with the pair in `dir`, checking the
/// router's certificate for `server_name`.
async fn epp_channel(
    dir: &Path,
    router: &RouterPod,
    server_name: &str,
) -> anyhow::Result<tonic::transport::Channel> {
    let tls = ClientTls::new(WatchedClient::client(dir.to_path_buf())?, Some(server_name))?;
    let endpoint =
        tonic::transport::Endpoint::from_shared(format!("http://{}:{EPP_PORT}", router.ip))?;
    Ok(tls.channel(endpoint).await?)
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
async fn the_operators_router_serves_a_gie_pool_and_its_endpoint_picker() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    install_gie_crd(&cluster.client().await?).await?;
    let env = TestNamespace::new(cluster, "gie").await?;
    let ns = env.ns.clone();
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &ns);
    let pools: Api<GieInferencePool> = Api::namespaced(env.client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &ns);
    for name in PODS {
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

    let _operator = OperatorProcess::start(
        cluster,
        &format!("operator-{ns}"),
        "op-gie-e2e",
        &[
            format!("--namespace={ns}"),
            format!("--router-namespace={ns}"),
            "--router-replicas=1".to_string(),
            format!("--router-gie-inference-pool={ns}/{POOL},{ns}/nomodel"),
        ],
    )
    .await?;
    let router = wait_for("the operator's router pod runs", WAIT, || async {
        Ok(env
            .kubelet
            .running()
            .into_iter()
            .find(|p| p.name.starts_with("kvroute-router")))
    })
    .await
    .with_context(|| format!("kubelet problems: {:?}", env.kubelet.problems()))?;
    let router = RouterPod { ip: router.ip };
    router.wait_routable(&env, &PODS).await?;

    let http = reqwest::Client::new();
    let (status, body) = router.chat(&http).await?;
    assert_eq!(status, 200, "{body}");
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
    assert_eq!(candidates.len(), PODS.len(), "{explained}");
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
    assert_eq!(
        metric(&metrics, "kvroute_router_epp_unauthenticated"),
        Some(0.0),
        "the operator's router serves its endpoint picker over mTLS"
    );

    // The endpoint picker, as a gateway of the pool reaches it: the pool's picker pair.
    let server_name = format!(
        "{}.{ns}.svc",
        kvroute_operator::desired::router::INGEST_SERVICE
    );
    let tls = tempfile::tempdir()?;
    pair_from_secret(
        &secrets,
        &format!("picker-{POOL}"),
        &tls.path().join("picker"),
    )
    .await?;
    let mut pod_ips = Vec::new();
    for name in PODS {
        let ip = pods
            .get(name)
            .await?
            .status
            .and_then(|s| s.pod_ip)
            .with_context(|| format!("pod {name} has no IP"))?;
        pod_ips.push(format!("{ip}:8000"));
    }
    let mut cfg = epp_conformance::Config::new(MODEL, &pod_ips);
    cfg.min_fallbacks = 2;
    cfg.in_flight = Some(InFlightProbe {
        url: router.admin("/metrics"),
        metric: "kvroute_router_in_flight".into(),
    });
    // The router's default request body limit (`--max-body-bytes`, 8 MiB).
    cfg.max_body_bytes = Some(8 << 20);
    cfg.deadline = Duration::from_secs(30);
    // The picker's readiness follows the router's (`/readyz`), which can lag the workers'
    // becoming routable by a moment: the health check wants SERVING.
    wait_for("the router is ready", WAIT, || async {
        let r = reqwest::get(router.admin("/readyz")).await?;
        Ok(r.status().is_success().then_some(()))
    })
    .await?;
    let channel = epp_channel(&tls.path().join("picker"), &router, &server_name).await?;
    let report = epp_conformance::run(channel, &cfg).await;
    println!("{report}");
    assert!(report.passed(), "{report}");
    for name in [
        "health",
        "fallback_list",
        "subset_hint_honoured",
        "served_fallback_is_accounted",
        "in_flight_zero_after_done",
        "in_flight_zero_after_abort",
        "oversized_body_is_413",
    ] {
        assert_eq!(
            report.outcome(name),
            Some(&epp_conformance::Outcome::Passed),
            "{name}: {report}"
        );
    }

    // The router's own pair is no picker's (with no kvroute Pool it names no identity at
    // all): every decision is refused, and counted.
    pair_from_secret(&secrets, "router", &tls.path().join("router")).await?;
    let channel = epp_channel(&tls.path().join("router"), &router, &server_name).await?;
    let refused = epp_conformance::run(channel, &cfg).await;
    match refused.outcome("destination_header_matches_metadata") {
        Some(epp_conformance::Outcome::Failed(why)) => {
            assert!(why.contains("identity"), "{why}")
        }
        other => panic!("the router's certificate picked: {other:?}"),
    }
    let metrics = reqwest::get(router.admin("/metrics")).await?.text().await?;
    assert!(
        metric(
            &metrics,
            "kvroute_router_pick_refused_total{reason=\"no_identity\"}"
        )
        .is_some_and(|n| n >= 1.0),
        "{metrics}"
    );

    // A pod relabelled out of the selector leaves the worker table.
    pods.patch(
        "gie-2",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "elsewhere"}}})),
    )
    .await?;
    router.wait_routable(&env, &PODS[..2]).await?;
    for _ in 0..3 {
        let (status, body) = router.chat(&http).await?;
        assert_eq!(status, 200, "{body}");
    }

    // The pool deleted, its model is gone.
    pools.delete(POOL, &DeleteParams::default()).await?;
    wait_for(
        "the router forgets the deleted pool's model",
        WAIT,
        || async {
            let (status, body) = router.chat(&http).await?;
            Ok((status == 404).then_some(body))
        },
    )
    .await
    .map(|body| assert_eq!(body["error"]["code"], "model_not_found", "{body}"))?;

    env.stop().await;
    Ok(())
}
