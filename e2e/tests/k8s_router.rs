//! The router's Kubernetes discovery end to end: a real API server, the operator as a process,
//! the fake kubelet running a mock-engine WorkerSet's pods (mock vLLM + sidecar on 127.A.B.C),
//! and `kvroute router --kubernetes` started by the test on loopback. The operator runs as
//! installed, with mTLS: the sidecars stream with their WorkerSet's certificate and check the
//! router's, so the test gives its router a certificate from the operator's CA (Secret
//! `kvroute-ca`) for the address the sidecars dial, and `--grpc-tls-dir`.
//!
//! ```text
//! test --apply--> InferenceWorkerSet "mock" (2 mock workers) + InferencePool (alias)
//!      operator --> Deployment --> fake kubelet --> mock-vllm + sidecar per pod
//!      router <--watch-- API server (WorkerSets, Pools, Pods)
//!      router <--gRPC Ingest-- sidecars (sidecar.routerAddress, rewritten to 127.0.0.1)
//! test --HTTP /v1/chat/completions--> router --> a pod's mock vLLM
//! ```
//!
//! Asserts: both pods become routable; chat completions (plain and streaming) through the
//! gateway answer 200 with content and `x-kvroute-worker` naming a pod; `/v1/models` lists the
//! served name and the alias; scaling to 1 leaves one routable worker; scaled to 0 none is left
//! and a request gets an OpenAI-shaped 503; once the WorkerSet is deleted its model is unknown
//! (404 `model_not_found`); `/metrics` has `kvroute_router_*` and the in-flight gauge is 0.
//!
//! Needs the binaries of `bash e2e/k8s/setup.sh` and `target/<profile>/kvroute`
//! (`cargo build -p kvroute-cli`); fails naming what is missing.

use std::time::Duration;

use anyhow::{Context, bail};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kvroute_crds::pool::InferencePool;
use kvroute_crds::workerset::InferenceWorkerSet;
use kvroute_e2e::harness::{Cluster, TestNamespace, shared_operator};
use kvroute_e2e::procs::{self, Child, SpawnOptions, wait_for};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
const SERVED: &str = "qwen3-mock";
const ALIAS: &str = "chat";
const SET: &str = "mock";
/// Service-like name the sidecars are told to stream to; the fake kubelet maps it to the
/// test's router (a loopback address in the spec would be rewritten to the pod's own).
const INGEST_NAME: &str = "router-under-test.kvroute-e2e.svc";

/// `kvroute router --kubernetes` on loopback, watching one namespace.
struct Router {
    child: Child,
    http: u16,
    grpc: u16,
    admin: u16,
}

impl Router {
    async fn start(cluster: &Cluster, ns: &str, tls_dir: &std::path::Path) -> anyhow::Result<Self> {
        let port = procs::free_local_port;
        let (http, grpc, admin) = (port()?, port()?, port()?);
        let tokenizer = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tokenizers/qwen3");
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
                format!("--tokenizer={tokenizer}"),
                "--seed=1".into(),
                format!("--grpc-tls-dir={}", tls_dir.display()),
                // The test checks `x-kvroute-worker` names a pod.
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
        Ok(Self {
            child,
            http,
            grpc,
            admin,
        })
    }

    fn gateway(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.http)
    }

    async fn admin_get(&self, path: &str) -> anyhow::Result<String> {
        Ok(
            reqwest::get(format!("http://127.0.0.1:{}{path}", self.admin))
                .await?
                .error_for_status()?
                .text()
                .await?,
        )
    }

    /// Ids of the routable workers of WorkerSet [`SET`] in `/debug/workers`.
    async fn routable(&self) -> anyhow::Result<Vec<String>> {
        let report: Value = serde_json::from_str(&self.admin_get("/debug/workers").await?)?;
        let workers = report["workers"]
            .as_array()
            .context("/debug/workers has no workers array")?;
        Ok(workers
            .iter()
            .filter(|w| w["routable"] == json!(true) && w["worker_set"] == json!(SET))
            .filter_map(|w| w["id"].as_str().map(str::to_string))
            .collect())
    }

    /// Sum of the `kvroute_router_in_flight` series.
    async fn in_flight(&self) -> anyhow::Result<f64> {
        let text = self.admin_get("/metrics").await?;
        let mut sum = 0.0;
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("kvroute_router_in_flight") else {
                continue;
            };
            if !(rest.starts_with('{') || rest.starts_with(' ')) {
                continue;
            }
            let value = rest
                .rsplit(' ')
                .next()
                .context("metric line without value")?;
            sum += value
                .parse::<f64>()
                .with_context(|| format!("metric line {line:?}"))?;
        }
        Ok(sum)
    }

    /// Waits until exactly `n` workers of [`SET`] are routable; their ids.
    async fn wait_routable(
        &mut self,
        n: usize,
        env: &TestNamespace,
    ) -> anyhow::Result<Vec<String>> {
        let result = wait_for(
            &format!("router shows {n} routable workers of {SET}"),
            WAIT,
            || async { Ok(self.routable().await.ok().filter(|w| w.len() == n)) },
        )
        .await;
        match result {
            Ok(ids) => Ok(ids),
            Err(e) => {
                let workers = self.admin_get("/debug/workers").await.unwrap_or_default();
                let exited = self.child.try_wait().ok().flatten();
                Err(e.context(format!(
                    "{}\n/debug/workers: {workers}\nrouter exited: {exited:?}\nrouter log:\n{}",
                    env.describe().await,
                    self.child.log_tail(60)
                )))
            }
        }
    }
}

fn workerset(spec: Value) -> anyhow::Result<InferenceWorkerSet> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "kvroute.dev/v1alpha1", "kind": "InferenceWorkerSet",
        "metadata": {"name": SET}, "spec": spec,
    }))?)
}

fn pool() -> anyhow::Result<InferencePool> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "kvroute.dev/v1alpha1", "kind": "InferencePool",
        "metadata": {"name": "chat-pool"},
        "spec": {
            "targets": [{"workerSet": SET}],
            "modelAliases": [{"name": ALIAS, "model": SERVED}],
        },
    }))?)
}

fn chat_body(model: &str, stream: bool) -> Value {
    json!({
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name three prime numbers."},
        ],
        "max_tokens": 8,
        "stream": stream,
    })
}

/// A non-streaming chat completion through the gateway: status and JSON body.
async fn chat(
    http: &reqwest::Client,
    router: &Router,
    model: &str,
) -> anyhow::Result<(u16, Value)> {
    let resp = http
        .post(router.gateway("/v1/chat/completions"))
        .json(&chat_body(model, false))
        .send()
        .await?;
    let status = resp.status().as_u16();
    Ok((status, resp.json().await?))
}

/// The `x-kvroute-worker` header, checked to name one of `pods`.
fn worker_header(resp: &reqwest::Response, pods: &[String]) -> anyhow::Result<String> {
    let worker = resp
        .headers()
        .get("x-kvroute-worker")
        .context("no x-kvroute-worker header")?
        .to_str()?
        .to_string();
    if !pods.iter().any(|p| worker.ends_with(p.as_str())) {
        bail!("x-kvroute-worker {worker:?} names none of {pods:?}");
    }
    Ok(worker)
}

/// Content of the `choices[0].delta.content` fields of an SSE body; fails without `[DONE]`.
fn sse_content(body: &str) -> anyhow::Result<String> {
    let mut content = String::new();
    let mut done = false;
    for data in body.lines().filter_map(|l| l.strip_prefix("data:")) {
        let data = data.trim();
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let chunk: Value =
            serde_json::from_str(data).with_context(|| format!("SSE chunk {data:?}"))?;
        if let Some(c) = chunk["choices"][0]["delta"]["content"].as_str() {
            content.push_str(c);
        }
    }
    if !done {
        bail!("stream ended without [DONE]:\n{body}");
    }
    Ok(content)
}

/// Writes `tls.crt`/`tls.key` (a server certificate for 127.0.0.1, the address the sidecars
/// dial after the kubelet's rewrite, signed by the operator's CA) and `ca.crt` (the CA, which
/// signed the sidecars' certificates) into `dir`, once the shared operator has made its CA.
async fn router_tls_from_operator_ca(
    client: &kube::Client,
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Secret;
    // The shared operator's own namespace (`--lease-namespace default`).
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let data = wait_for(
        "the operator's CA (Secret default/kvroute-ca)",
        WAIT,
        || async {
            Ok(secrets
                .get_opt("kvroute-ca")
                .await?
                .and_then(|s| s.data)
                .filter(|d| d.contains_key("ca.crt") && d.contains_key("ca.key")))
        },
    )
    .await?;
    let text = |k: &str| -> anyhow::Result<String> {
        let v = data
            .get(k)
            .with_context(|| format!("kvroute-ca has no {k}"))?;
        Ok(String::from_utf8(v.0.clone())?)
    };
    let (ca_cert, ca_key) = (text("ca.crt")?, text("ca.key")?);
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_cert, rcgen::KeyPair::from_pem(&ca_key)?)?;
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(vec![INGEST_NAME.to_string()])?;
    params.subject_alt_names.push(rcgen::SanType::IpAddress(
        std::net::Ipv4Addr::LOCALHOST.into(),
    ));
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = params.signed_by(&key, &issuer)?;
    std::fs::write(dir.join("tls.crt"), cert.pem())?;
    std::fs::write(dir.join("tls.key"), key.serialize_pem())?;
    std::fs::write(dir.join("ca.crt"), ca_cert)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_discovers_mock_workerset_and_serves_through_gateway() -> anyhow::Result<()> {
    let (cluster, _operator) = shared_operator().await?;
    let env = TestNamespace::new(cluster, "route").await?;
    let tls = tempfile::tempdir()?;
    router_tls_from_operator_ca(&env.client, tls.path()).await?;
    let mut router = Router::start(cluster, &env.ns, tls.path()).await?;
    env.kubelet
        .rewrite(INGEST_NAME, format!("127.0.0.1:{}", router.grpc));

    let sets: Api<InferenceWorkerSet> = Api::namespaced(env.client.clone(), &env.ns);
    let pools: Api<InferencePool> = Api::namespaced(env.client.clone(), &env.ns);
    let spec = json!({
        "model": {"name": "Qwen/Qwen3-0.6B", "servedName": SERVED},
        "replicas": 2,
        "engine": {"mode": "mock", "speedup": 50.0},
        "sidecar": {"routerAddress": format!("http://{INGEST_NAME}")},
    });
    sets.create(&PostParams::default(), &workerset(spec)?)
        .await?;
    pools.create(&PostParams::default(), &pool()?).await?;

    let ids = router.wait_routable(2, &env).await?;
    let pods: Vec<String> = env.kubelet.running().into_iter().map(|p| p.name).collect();
    for id in &ids {
        assert!(
            pods.iter().any(|p| id.ends_with(p.as_str())),
            "routable worker {id} is none of the running pods {pods:?}"
        );
    }

    let http = reqwest::Client::new();
    // Plain chat completion, by served name and by alias.
    for model in [SERVED, ALIAS] {
        let resp = http
            .post(router.gateway("/v1/chat/completions"))
            .json(&chat_body(model, false))
            .send()
            .await?;
        let status = resp.status();
        let worker = worker_header(&resp, &pods);
        let body: Value = resp.json().await?;
        assert_eq!(status, 200, "{model}: {body}");
        worker?;
        let content = body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default();
        assert!(!content.is_empty(), "{model}: no content in {body}");
    }
    // Streaming.
    let resp = http
        .post(router.gateway("/v1/chat/completions"))
        .json(&chat_body(SERVED, true))
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    worker_header(&resp, &pods)?;
    let content = sse_content(&resp.text().await?)?;
    assert!(!content.is_empty(), "stream without content");

    // /v1/models lists the served name and the alias.
    let models: Value = http
        .get(router.gateway("/v1/models"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let names: Vec<&str> = models["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert!(names.contains(&SERVED), "{models}");
    assert!(names.contains(&ALIAS), "{models}");

    // Metrics: router series exist; nothing is left in flight.
    let metrics = router.admin_get("/metrics").await?;
    assert!(metrics.contains("kvroute_router_"), "{metrics}");
    wait_for("router in-flight back to 0", WAIT, || async {
        Ok((router.in_flight().await? == 0.0).then_some(()))
    })
    .await?;

    // `kubectl scale iws/mock --replicas=1`.
    sets.patch_scale(
        SET,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 1}})),
    )
    .await?;
    let left = router.wait_routable(1, &env).await?;
    assert!(ids.contains(&left[0]), "{left:?} not among {ids:?}");
    // Requests now land on the one worker left.
    let left_pod = left[0].rsplit('/').next().unwrap_or_default().to_string();
    let resp = http
        .post(router.gateway("/v1/chat/completions"))
        .json(&chat_body(SERVED, false))
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    worker_header(&resp, std::slice::from_ref(&left_pod))?;

    // Scaled to 0 the model is still known but has no worker: 503, OpenAI-shaped.
    sets.patch_scale(
        SET,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 0}})),
    )
    .await?;
    router.wait_routable(0, &env).await?;
    for model in [SERVED, ALIAS] {
        let (status, body) = chat(&http, &router, model).await?;
        assert_eq!(status, 503, "{model}: {body}");
        assert!(body["error"]["message"].is_string(), "{body}");
        assert_eq!(body["error"]["type"], "service_unavailable_error", "{body}");
    }

    // Deleted, the model is gone: 404 model_not_found once discovery has seen it.
    sets.delete(SET, &DeleteParams::default()).await?;
    wait_for(
        "router forgets the deleted WorkerSet's model",
        WAIT,
        || async {
            let (status, body) = chat(&http, &router, SERVED).await?;
            Ok((status == 404).then_some(body))
        },
    )
    .await
    .map(|body| assert_eq!(body["error"]["code"], "model_not_found", "{body}"))?;
    assert_eq!(router.in_flight().await?, 0.0);

    router.child.stop(Duration::from_secs(5)).await?;
    env.stop().await;
    Ok(())
}
