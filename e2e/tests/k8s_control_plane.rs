//! Issue 13 end to end on a real API server: policies, tenants, providers and limits applied as
//! users apply them, through the router the operator creates (what users install is what the
//! tests run), with the fake kubelet running the router and the mock workers from their pod
//! specs and materializing the Secrets the operator mounts.
//!
//! ```text
//! test: Secrets (API keys, provider key + CA) and the objects that name them, in one namespace
//!       (the router's), then the operator (--namespace ns --router-namespace ns)
//!   operator --> router Deployment (one optional Secret volume per name at
//!                /var/run/kvroute/secrets/<name>) --> fake kubelet --> `kvroute router`
//!   operator --> WorkerSet Deployment --> mock vLLM + sidecar --gRPC--> that router
//!   GatewayBackend https://127.0.0.1:<port> (SNI localhost, CA from a Secret, API key from a
//!   Secret) --> FakeProvider (this process, rustls, checks the key, counts requests)
//! each test: apply a policy (or change a Secret) --> the gateway's answer changes within a
//!            deadline; the time it took is printed
//! ```
//!
//! Every test starts its own plane with [`plane`] (one namespace, operator, router and worker
//! each), written against the user-facing YAML.
//!
//! Needs the binaries of `bash e2e/k8s/setup.sh` and `target/<profile>/kvroute`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kvroute_e2e::harness::{
    Cluster, FakeKubelet, IMAGE_TOKENIZERS, OperatorProcess, RunningPod,
    install::operator_kubeconfig, router_pod_options,
};
use kvroute_e2e::procs::wait_for;
use kvroute_operator::desired::router::{
    ADMIN_PORT, HF_HOME, HTTP_PORT, INGEST_PORT, INGEST_SERVICE,
};
use kvroute_operator::desired::secrets::{SECRETS_DIR, SECRETS_DIR_ENV};
use kvroute_tls::testpki::TestCa;
use serde_json::{Value, json};
use sha2::Digest as _;

const WAIT: Duration = Duration::from_secs(120);
/// How long a change may take to show through the gateway before a test fails. The issue
/// asks for 2 s; the deadline is generous so a loaded machine does not fail the test, and
/// every test prints how long the change really took.
const EFFECT: Duration = Duration::from_secs(10);
const SET: &str = "qwen";
const SERVED: &str = "qwen3-mock";
/// A second WorkerSet for the weighted alias split.
const CANARY_SET: &str = "qwen-canary";
const CANARY_SERVED: &str = "qwen3-canary";
const POOL: &str = "chat";
/// The pool's API-key Secret: one data key per tenant, `sha256:<hex>` lines.
const API_KEYS: &str = "chat-api-keys";
const KEY_A: &str = "kvr_team-a-e2e-key-0001";
const KEY_B: &str = "kvr_team-b-e2e-key-0002";
/// The provider's key and CA Secrets, and the key the fake provider accepts.
const PROVIDER_KEY_SECRET: &str = "fake-provider-key";
const PROVIDER_CA_SECRET: &str = "fake-provider-ca";
const PROVIDER_KEY: &str = "sk-fake-provider-0001";
/// A Secret a GatewayBackend names that the test creates only later.
const LATE_SECRET: &str = "created-later";
/// A JWKS Secret whose content is not a JWKS.
const BAD_JWKS_SECRET: &str = "bad-jwks";

// ------------------------------------------------------------------ fake provider

/// An OpenAI-compatible provider over HTTPS that accepts one API key (`Authorization:
/// Bearer`) and answers every chat completion with a fixed text; 401 for any other key.
struct FakeProvider {
    addr: SocketAddr,
    ca_pem: String,
    served: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct ProviderState {
    key: String,
    served: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
}

async fn provider_chat(
    State(st): State<ProviderState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if bearer != Some(st.key.as_str()) {
        st.refused.fetch_add(1, Ordering::Relaxed);
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"error": {"message": "bad key", "type": "invalid_request_error"}})),
        )
            .into_response();
    }
    st.served.fetch_add(1, Ordering::Relaxed);
    let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let model = req["model"].as_str().unwrap_or("unknown").to_string();
    let answer = json!({
        "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "from the provider"}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    });
    if req["stream"] == json!(true) {
        let chunk = json!({
            "id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": "from the provider"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
        });
        let sse = format!("data: {chunk}\n\ndata: [DONE]\n\n");
        return ([("content-type", "text/event-stream")], sse).into_response();
    }
    axum::Json(answer).into_response()
}

impl FakeProvider {
    async fn start(key: &str) -> anyhow::Result<Self> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let ca = TestCa::new("fake-provider-ca");
        let leaf = ca.leaf(None, &["localhost"]);
        let certs = vec![CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes())?];
        let key_der = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes())?;
        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let served = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        let app = axum::Router::new()
            .route("/v1/chat/completions", axum::routing::post(provider_chat))
            .with_state(ProviderState {
                key: key.to_string(),
                served: served.clone(),
                refused: refused.clone(),
            });
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, app) = (acceptor.clone(), app.clone());
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper_util::service::TowerToHyperService::new(app);
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
                });
            }
        });
        Ok(Self {
            addr,
            ca_pem: ca.pem().to_string(),
            served,
            refused,
            task,
        })
    }

    fn served(&self) -> usize {
        self.served.load(Ordering::Relaxed)
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ------------------------------------------------------------------ the plane

/// What a test adds to the common set-up.
#[derive(Default)]
struct Scenario {
    /// A second WorkerSet ([`CANARY_SET`]) in the pool, for the alias split.
    canary: bool,
    /// The pool's `spec.auth`; `None`: the default (API keys, no anonymous requests).
    pool_auth: Option<Value>,
    /// Mock worker options (e.g. `--max-num-seqs`) for saturation.
    engine_args: Vec<String>,
    /// Mock worker speed-up over the modelled GPU (default 50: fast tests).
    speedup: Option<f64>,
}

/// One namespace with everything issue 13 needs, running.
struct Plane {
    client: kube::Client,
    ns: String,
    kubelet: FakeKubelet,
    operator: OperatorProcess,
    provider: FakeProvider,
    router: RunningPod,
    gateway: String,
    admin: String,
    http: reqwest::Client,
    /// Where the fake kubelet keeps each pod's logs (`<ns>_<pod>/<container>.log`).
    pods_dir: std::path::PathBuf,
    _hub: kvroute_router::fake_hub::FakeHub,
}

fn resource(kind: &str) -> ApiResource {
    let plural = format!("{}s", kind.to_lowercase()).replace("policys", "policies");
    ApiResource {
        group: "kvroute.dev".into(),
        version: "v1alpha1".into(),
        api_version: "kvroute.dev/v1alpha1".into(),
        kind: kind.into(),
        plural,
    }
}

fn secret_line(key: &str) -> String {
    let digest = sha2::Sha256::digest(key.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

fn worker_set(name: &str, served: &str, args: &[String], speedup: f64) -> Value {
    let mut engine_args = vec![
        "--tokenizer".to_string(),
        format!("{IMAGE_TOKENIZERS}/qwen3"),
    ];
    engine_args.extend(args.iter().cloned());
    json!({"apiVersion": "kvroute.dev/v1alpha1", "kind": "InferenceWorkerSet",
           "metadata": {"name": name},
           "spec": {"model": {"name": "Qwen/Qwen3-0.6B", "servedName": served},
                    "replicas": 1,
                    "engine": {"mode": "mock", "speedup": speedup, "args": engine_args}}})
}

impl Plane {
    /// Applies (server-side) a kvroute object.
    async fn apply(&self, obj: &Value) -> anyhow::Result<()> {
        apply(&self.client, &self.ns, obj).await
    }

    /// The status conditions of `kind/name`, by type.
    async fn conditions(&self, kind: &str, name: &str) -> anyhow::Result<BTreeMap<String, Value>> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.ns, &resource(kind));
        let obj = api.get(name).await?;
        Ok(obj.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| Some((c["type"].as_str()?.to_string(), c.clone())))
            .collect())
    }

    /// Waits until condition `type_` of `kind/name` has `status` and `reason`.
    async fn wait_condition(
        &self,
        kind: &str,
        name: &str,
        type_: &str,
        status: &str,
        reason: &str,
    ) -> anyhow::Result<Value> {
        let what = format!("{kind}/{name} {type_}={status} ({reason})");
        wait_for(&what, WAIT, || async {
            let c = self.conditions(kind, name).await?;
            Ok(c.get(type_)
                .filter(|c| c["status"] == status && c["reason"] == reason)
                .cloned())
        })
        .await
        .with_context(|| format!("operator log:\n{}", self.operator.log()))
    }

    /// A chat request for `model` with `content`, as `key`'s tenant (no key: anonymous).
    async fn chat(
        &self,
        model: &str,
        content: &str,
        key: Option<&str>,
    ) -> anyhow::Result<(StatusCode, HeaderMap, Value)> {
        let mut req = self
            .http
            .post(format!("{}/v1/chat/completions", self.gateway))
            .json(&json!({"model": model, "max_tokens": 4,
                          "messages": [{"role": "user", "content": content}]}));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await?;
        let status = StatusCode::from_u16(resp.status().as_u16())?;
        let headers = resp.headers().clone();
        let text = resp.text().await?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, headers, body))
    }

    /// The router's metrics text.
    async fn metrics(&self) -> anyhow::Result<String> {
        Ok(self
            .http
            .get(format!("{}/metrics", self.admin))
            .send()
            .await?
            .text()
            .await?)
    }

    /// Applies `policy`, then sends `probe` until `done` accepts its answer; returns how long
    /// that took (printed, and failed past [`EFFECT`]).
    async fn takes_effect<F, Fut>(
        &self,
        what: &str,
        policy: &Value,
        mut probe: F,
    ) -> anyhow::Result<Duration>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<bool>>,
    {
        let start = Instant::now();
        self.apply(policy).await?;
        wait_for(what, EFFECT, || {
            let fut = probe();
            async move { Ok(fut.await?.then_some(())) }
        })
        .await?;
        let took = start.elapsed();
        println!("{what}: took effect after {} ms", took.as_millis());
        Ok(took)
    }

    /// The router's view of its workers and its log's tail, for failure messages.
    async fn debug(&self) -> String {
        let workers = match self
            .http
            .get(format!("{}/debug/workers", self.admin))
            .send()
            .await
        {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => e.to_string(),
        };
        let mut logs = format!("running: {:?}\n", self.kubelet.running());
        for pod in self.kubelet.running() {
            let dir = self
                .pods_dir
                .join(format!("{}_{}", pod.namespace, pod.name));
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "log") {
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    let lines: Vec<&str> = text.lines().collect();
                    let tail = lines[lines.len().saturating_sub(12)..].join("\n");
                    logs += &format!("--- {}:\n{tail}\n", path.display());
                }
            }
        }
        let pods: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(self.client.clone(), &self.ns);
        if let Ok(list) = pods.list(&Default::default()).await {
            for pod in list.items {
                let statuses = pod.status.and_then(|s| s.container_statuses);
                logs += &format!(
                    "pod {}: {}\n",
                    pod.metadata.name.unwrap_or_default(),
                    serde_json::to_string(&statuses).unwrap_or_default()
                );
            }
        }
        format!("/debug/workers: {workers}\n{logs}")
    }

    async fn stop(self) {
        self.kubelet.stop(Duration::from_secs(2)).await;
    }
}

/// Creates `obj`, or replaces it when it exists (create and update prune the fields a CRD
/// does not declare, as `kubectl apply` does; server-side apply would refuse them, and the
/// tests are written against the final shapes).
async fn apply(client: &kube::Client, ns: &str, obj: &Value) -> anyhow::Result<()> {
    let kind = obj["kind"].as_str().context("kind")?;
    let name = obj["metadata"]["name"].as_str().context("name")?;
    let ar = if kind == "Secret" {
        ApiResource::erase::<Secret>(&())
    } else {
        resource(kind)
    };
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar);
    let mut desired: DynamicObject = serde_json::from_value(obj.clone())?;
    match api.get_opt(name).await? {
        None => {
            api.create(&PostParams::default(), &desired)
                .await
                .with_context(|| format!("create {kind} {name}"))?;
        }
        Some(mut current) => {
            // The operator writes status meanwhile: retry a replace that lost that race.
            for attempt in 0.. {
                desired.metadata.resource_version = current.metadata.resource_version.clone();
                match api.replace(name, &PostParams::default(), &desired).await {
                    Ok(_) => break,
                    Err(kube::Error::Api(e)) if e.code == 409 && attempt < 5 => {
                        current = api.get(name).await?;
                    }
                    Err(e) => {
                        return Err(e).with_context(|| format!("replace {kind} {name}"));
                    }
                }
            }
        }
    }
    Ok(())
}

fn secret(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": data})
}

fn policy(name: &str, rules: Value) -> Value {
    json!({"apiVersion": "kvroute.dev/v1alpha1", "kind": "InferencePolicy",
           "metadata": {"name": name}, "spec": {"pool": POOL, "rules": rules}})
}

/// The shared set-up of every test: Secrets, the pool (with `spec.auth`), the provider and
/// its backend, WorkerSets; then the operator, its router and the workers, until the router
/// routes the model with its tokenizer loaded.
async fn plane(prefix: &str, scenario: Scenario) -> anyhow::Result<Plane> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let ns = cluster.namespace(&client, prefix).await?;
    let provider = FakeProvider::start(PROVIDER_KEY).await?;

    // Everything that names a Secret exists before the operator writes the router's pod
    // template, so the first router pod mounts them all.
    let mut objects = vec![
        secret(
            API_KEYS,
            json!({"team-a": secret_line(KEY_A), "team-b": secret_line(KEY_B)}),
        ),
        secret(PROVIDER_KEY_SECRET, json!({"apiKey": PROVIDER_KEY})),
        secret(PROVIDER_CA_SECRET, json!({"ca.crt": provider.ca_pem})),
        secret(BAD_JWKS_SECRET, json!({"jwks.json": "this is not a JWKS"})),
        json!({"apiVersion": "kvroute.dev/v1alpha1", "kind": "GatewayBackend",
               "metadata": {"name": "fake"},
               "spec": {"url": format!("https://127.0.0.1:{}", provider.addr.port()),
                        "tls": {"sni": "localhost",
                                "caSecretRef": {"name": PROVIDER_CA_SECRET, "key": "ca.crt"}},
                        "auth": {"secretRef": {"name": PROVIDER_KEY_SECRET, "key": "apiKey"},
                                 "type": "bearer"}}}),
        json!({"apiVersion": "kvroute.dev/v1alpha1", "kind": "GatewayBackend",
               "metadata": {"name": "late"},
               "spec": {"url": format!("https://127.0.0.1:{}", provider.addr.port()),
                        "auth": {"secretRef": {"name": LATE_SECRET, "key": "apiKey"}}}}),
        json!({"apiVersion": "kvroute.dev/v1alpha1", "kind": "InferenceProvider",
               "metadata": {"name": "fake"},
               "spec": {"kind": "openai", "models": [SERVED, CANARY_SERVED],
                        "gatewayBackendRef": {"name": "fake"}}}),
    ];
    let mut targets = vec![
        json!({"workerSet": SET}),
        json!({"provider": "fake", "role": "overflow"}),
    ];
    // The WorkerSets come once the router runs: their sidecars must find it.
    let speedup = scenario.speedup.unwrap_or(50.0);
    let mut sets = vec![worker_set(SET, SERVED, &scenario.engine_args, speedup)];
    if scenario.canary {
        sets.push(worker_set(
            CANARY_SET,
            CANARY_SERVED,
            &scenario.engine_args,
            speedup,
        ));
        targets.push(json!({"workerSet": CANARY_SET}));
    }
    let auth = scenario
        .pool_auth
        .unwrap_or_else(|| json!({"apiKeySecrets": [{"name": API_KEYS}], "allowAnonymous": false}));
    objects.push(
        json!({"apiVersion": "kvroute.dev/v1alpha1", "kind": "InferencePool",
                        "metadata": {"name": POOL},
                        "spec": {"targets": targets, "auth": auth}}),
    );
    for obj in &objects {
        apply(&client, &ns, obj).await?;
    }

    let (hub, opts) = router_pod_options(cluster, &ns, HF_HOME).await?;
    let kubelet = FakeKubelet::start(client.clone(), opts).await?;
    // Its Lease in the test's namespace: the tests of this file run at once, one operator
    // each. As its service account, with the shipped Role granted there too.
    let kubeconfig = operator_kubeconfig(cluster, &[ns.as_str()]).await?;
    let operator = OperatorProcess::start_as(
        cluster,
        &kubeconfig,
        &format!("operator-{ns}"),
        &format!("op-{prefix}"),
        &[
            format!("--namespace={ns}"),
            format!("--router-namespace={ns}"),
            format!("--lease-namespace={ns}"),
            "--router-replicas=1".to_string(),
            // Status re-checks come from watches and the 15 s re-check of unsettled objects.
            "--requeue-seconds=30".to_string(),
        ],
    )
    .await?;
    let router = wait_for("the operator's router pod runs", WAIT, || async {
        Ok(kubelet
            .running()
            .into_iter()
            .find(|p| p.name.starts_with("kvroute-router")))
    })
    .await
    .with_context(|| format!("kubelet problems: {:?}", kubelet.problems()))?;
    kubelet.rewrite(
        format!("{INGEST_SERVICE}.{ns}.svc:{INGEST_PORT}"),
        format!("{}:{INGEST_PORT}", router.ip),
    );
    for set in &sets {
        apply(&client, &ns, set).await?;
    }
    let gateway = format!("http://{}:{HTTP_PORT}", router.ip);
    let admin = format!("http://{}:{ADMIN_PORT}", router.ip);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let models = if scenario.canary {
        vec![SERVED, CANARY_SERVED]
    } else {
        vec![SERVED]
    };
    for model in models {
        wait_for(&format!("the router serves {model}"), WAIT, || async {
            let r = http
                .get(format!("{admin}/readyz?model={model}"))
                .send()
                .await?;
            Ok(r.status().is_success().then_some(()))
        })
        .await
        .with_context(|| {
            let log = cluster
                .dir()
                .join("pods")
                .join(format!("{ns}_{}", router.name))
                .join("router.log");
            let tail: String = std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .rev()
                .take(40)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            format!(
                "kubelet problems: {:?}\nrunning: {:?}\njournal:\n{}\nrouter log:\n{tail}\noperator log:\n{}",
                kubelet.problems(),
                kubelet.running(),
                kubelet.journal().join("\n"),
                operator.log()
            )
        })?;
    }
    Ok(Plane {
        client,
        ns,
        kubelet,
        operator,
        provider,
        router,
        gateway,
        admin,
        http,
        pods_dir: cluster.dir().join("pods"),
        _hub: hub,
    })
}

/// The value of the series `name{labels}` in a metrics text; 0 when absent.
fn metric(text: &str, name: &str, labels: &str) -> f64 {
    kvroute_e2e::harness::metric_sum(text, name, labels)
}

// ------------------------------------------------------------------ tests that run now

/// The operator mounts every Secret a GatewayBackend (and a pool's auth) names into its
/// router, read-only and optional, sets `--secrets-dir`, and reports `SecretsMounted`; the
/// fake kubelet keeps the files in step with the Secrets (kubelet's `..data` swap), so a
/// rotated key and a Secret created late reach the running router pod without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_mounted_into_the_operators_router_and_follow_rotation() -> anyhow::Result<()> {
    let p = plane("cp-secrets", Scenario::default()).await?;
    let deployments: Api<Deployment> = Api::namespaced(p.client.clone(), &p.ns);
    let d = deployments.get("kvroute-router").await?;
    let pod = d
        .spec
        .and_then(|s| s.template.spec)
        .context("router pod spec")?;
    let volumes: BTreeMap<String, (String, Option<bool>)> = pod
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| {
            let s = v.secret.as_ref()?;
            Some((
                v.name.clone(),
                (s.secret_name.clone().unwrap_or_default(), s.optional),
            ))
        })
        .collect();
    let c = &pod.containers[0];
    let mounted: BTreeMap<String, (String, Option<bool>)> = c
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| m.mount_path.starts_with(SECRETS_DIR))
        .filter_map(|m| {
            let (secret, optional) = volumes.get(&m.name)?;
            assert_eq!(*optional, Some(true), "{secret} must be optional");
            Some((secret.clone(), (m.mount_path.clone(), m.read_only)))
        })
        .collect();
    for name in [PROVIDER_KEY_SECRET, PROVIDER_CA_SECRET, LATE_SECRET] {
        assert_eq!(
            mounted.get(name),
            Some(&(format!("{SECRETS_DIR}/{name}"), Some(true))),
            "{mounted:?}"
        );
    }
    // The pool's API-key Secret is mounted once the pool's auth block is a known field.
    let pools: Api<DynamicObject> =
        Api::namespaced_with(p.client.clone(), &p.ns, &resource("InferencePool"));
    let auth_known = !pools.get(POOL).await?.data["spec"]["auth"].is_null();
    assert_eq!(mounted.contains_key(API_KEYS), auth_known, "{mounted:?}");
    assert!(
        c.env
            .iter()
            .flatten()
            .any(|e| e.name == SECRETS_DIR_ENV && e.value.as_deref() == Some(SECRETS_DIR))
    );

    // Conditions: a backend whose Secrets exist is mounted; one whose Secret is missing
    // says so (and the router keeps serving meanwhile).
    p.wait_condition(
        "GatewayBackend",
        "fake",
        "SecretsMounted",
        "True",
        "Mounted",
    )
    .await?;
    let late = p
        .wait_condition(
            "GatewayBackend",
            "late",
            "SecretsMounted",
            "False",
            "SecretNotFound",
        )
        .await?;
    assert!(
        late["message"]
            .as_str()
            .is_some_and(|m| m.contains(LATE_SECRET)),
        "{late}"
    );
    let refs = &p.conditions("GatewayBackend", "late").await?["ResolvedRefs"];
    assert_eq!(refs["status"], "False", "{refs}");
    let (status, _, body) = p.chat(SERVED, "hello", Some(KEY_A)).await?;
    assert!(status.is_success(), "{status}: {body}");

    // What the router pod reads, through the fake kubelet's mount of it.
    let file = |secret: &str, key: &str| {
        p.kubelet
            .local_path(
                &p.ns,
                &p.router.name,
                &format!("{SECRETS_DIR}/{secret}/{key}"),
            )
            .context("router pod")
    };
    let key_file = file(PROVIDER_KEY_SECRET, "apiKey")?;
    assert_eq!(std::fs::read_to_string(&key_file)?, PROVIDER_KEY);

    // Rotation: a new value reaches the running pod (one `..data` swap), no restart.
    p.apply(&secret(
        PROVIDER_KEY_SECRET,
        json!({"apiKey": "sk-rotated"}),
    ))
    .await?;
    wait_for("the rotated key reaches the router pod", WAIT, || async {
        Ok(
            (std::fs::read_to_string(&key_file).ok().as_deref() == Some("sk-rotated"))
                .then_some(()),
        )
    })
    .await?;

    // The missing Secret, created: the condition turns True and the file appears in the
    // same pod.
    p.apply(&secret(LATE_SECRET, json!({"apiKey": "sk-late"})))
        .await?;
    p.wait_condition(
        "GatewayBackend",
        "late",
        "SecretsMounted",
        "True",
        "Mounted",
    )
    .await?;
    let late_file = file(LATE_SECRET, "apiKey")?;
    wait_for("the late Secret reaches the router pod", WAIT, || async {
        Ok((std::fs::read_to_string(&late_file).ok().as_deref() == Some("sk-late")).then_some(()))
    })
    .await?;
    assert!(
        p.kubelet
            .running()
            .iter()
            .any(|r| r.name == p.router.name && r.ready),
        "the router pod was not replaced"
    );
    p.stop().await;
    Ok(())
}

/// Pool status says what the router does with the pool's requests: who its tenants are
/// (TenantIdentity) and whether its provider targets are acted on (ProviderTargets); bad
/// input (a malformed policy, an unknown provider, a missing Secret) is a False condition
/// with a reason while the router keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_conditions_tell_the_truth_about_pools_and_bad_input() -> anyhow::Result<()> {
    let p = plane("cp-status", Scenario::default()).await?;
    let pools: Api<DynamicObject> =
        Api::namespaced_with(p.client.clone(), &p.ns, &resource("InferencePool"));
    let auth_known = !pools.get(POOL).await?.data["spec"]["auth"].is_null();
    let (status, reason) = if auth_known {
        ("True", "Verified")
    } else {
        // The API server pruned a field its CRD does not know: the pool is anonymous.
        ("False", "Anonymous")
    };
    p.wait_condition("InferencePool", POOL, "TenantIdentity", status, reason)
        .await?;
    let conds = p.conditions("InferencePool", POOL).await?;
    assert!(conds.contains_key("ProviderTargets"), "{conds:?}");

    // A malformed policy: the API server accepts it (duplicate rule names are no CEL rule),
    // the operator refuses it.
    p.apply(&policy(
        "malformed",
        json!([{"name": "a", "actions": {"route": {"localOnly": true}}},
               {"name": "a", "actions": {"reject": {"status": 403}}}]),
    ))
    .await?;
    let c = p
        .wait_condition(
            "InferencePolicy",
            "malformed",
            "Accepted",
            "False",
            "InvalidSpec",
        )
        .await?;
    assert!(
        c["message"]
            .as_str()
            .is_some_and(|m| m.contains("duplicate rule name")),
        "{c}"
    );
    // An unknown provider.
    p.apply(&policy(
        "unknown-provider",
        json!([{"name": "out", "actions": {"overflow": {"provider": "nope", "queueThreshold": 1}}}]),
    ))
    .await?;
    let c = p
        .wait_condition(
            "InferencePolicy",
            "unknown-provider",
            "ResolvedRefs",
            "False",
            "RefNotFound",
        )
        .await?;
    assert!(
        c["message"].as_str().is_some_and(|m| m.contains("nope")),
        "{c}"
    );
    // A missing Secret (the `late` backend's).
    p.wait_condition(
        "GatewayBackend",
        "late",
        "SecretsMounted",
        "False",
        "SecretNotFound",
    )
    .await?;
    // The router keeps serving.
    let (status, _, body) = p.chat(SERVED, "still there?", Some(KEY_A)).await?;
    assert!(status.is_success(), "{status}: {body}\n{}", p.debug().await);
    p.stop().await;
    Ok(())
}

// ------------------------------------------------------------------ tests of merged parts

/// A reject rule takes effect through the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reject_rule_takes_effect() -> anyhow::Result<()> {
    let p = plane("cp-reject", Scenario::default()).await?;
    let (status, _, _) = p.chat(SERVED, "hello", Some(KEY_B)).await?;
    assert!(status.is_success());
    let rule = policy(
        "reject-b",
        json!([{"name": "no-team-b", "match": {"tenants": ["team-b"]},
                "actions": {"reject": {"status": 403, "message": "team-b is suspended"}}}]),
    );
    p.takes_effect("reject", &rule, || async {
        let (status, _, body) = p.chat(SERVED, "hello", Some(KEY_B)).await?;
        Ok(status == StatusCode::FORBIDDEN && body.to_string().contains("team-b is suspended"))
    })
    .await?;
    // Another tenant is not matched.
    let (status, _, body) = p.chat(SERVED, "hello", Some(KEY_A)).await?;
    assert!(status.is_success(), "{status}: {body}");
    p.wait_condition("InferencePolicy", "reject-b", "Ready", "True", "Enforced")
        .await?;
    p.stop().await;
    Ok(())
}

/// PII stays local: with a rule that overflows everything to the provider, a request with
/// an e-mail address is still answered by the local worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pii_request_stays_local() -> anyhow::Result<()> {
    let p = plane("cp-pii", Scenario::default()).await?;
    let rules = policy(
        "pii",
        json!([{"name": "pii-local", "match": {"labels": ["pii"]},
                "actions": {"route": {"localOnly": true}}},
               {"name": "all-out", "actions": {"overflow": {"provider": "fake", "ttftThresholdMs": 1}}}]),
    );
    p.takes_effect("overflow of plain requests", &rules, || async {
        let before = p.provider.served();
        let (status, _, _) = p.chat(SERVED, "what is a haiku?", Some(KEY_A)).await?;
        Ok(status.is_success() && p.provider.served() > before)
    })
    .await?;
    let before = p.provider.served();
    let (status, _, body) = p
        .chat(
            SERVED,
            "write to jane.doe@example.com about the invoice",
            Some(KEY_A),
        )
        .await?;
    assert!(status.is_success(), "{status}: {body}");
    assert_eq!(
        p.provider.served(),
        before,
        "a PII request left the cluster"
    );
    p.stop().await;
    Ok(())
}

/// Overflow: while the local worker is saturated, a request goes to the provider (over
/// HTTPS, with the key from the mounted Secret) and comes back through the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overflow_goes_to_the_provider_when_the_pool_is_saturated() -> anyhow::Result<()> {
    // One sequence at a time at the modelled GPU's speed: a burst queues.
    let scenario = Scenario {
        engine_args: vec!["--max-num-seqs".into(), "1".into()],
        speedup: Some(1.0),
        ..Scenario::default()
    };
    let p = plane("cp-overflow", scenario).await?;
    let rules = policy(
        "overflow",
        json!([{"name": "burst", "actions": {"overflow": {"provider": "fake", "queueThreshold": 1}}}]),
    );
    p.apply(&rules).await?;
    p.wait_condition("InferencePolicy", "overflow", "Ready", "True", "Enforced")
        .await?;
    // Saturate the one local worker, then the next request overflows.
    let start = Instant::now();
    let answered = wait_for("a request overflows to the provider", EFFECT, || async {
        let prompts: Vec<String> = (0..8).map(|i| format!("long story {i}")).collect();
        let burst = prompts.iter().map(|t| p.chat(SERVED, t, Some(KEY_A)));
        let answers = futures::future::join_all(burst).await;
        for a in &answers {
            match a {
                Ok((s, _, b)) => eprintln!("burst answer {s}: {:.120}", b.to_string()),
                Err(e) => eprintln!("burst error {e}"),
            }
        }
        let from_provider = answers
            .into_iter()
            .filter_map(Result::ok)
            .filter(|(s, _, b)| s.is_success() && b.to_string().contains("from the provider"))
            .count();
        Ok((from_provider > 0).then_some(from_provider))
    })
    .await;
    let answered = match answered {
        Ok(n) => n,
        Err(e) => {
            let m = p.metrics().await.unwrap_or_default();
            let lines: Vec<&str> = m
                .lines()
                .filter(|l| {
                    !l.starts_with('#') && (l.contains("provider") || l.contains("policy_verdicts"))
                })
                .collect();
            anyhow::bail!("{e}\nmetrics:\n{}\n{}", lines.join("\n"), p.debug().await);
        }
    };
    println!(
        "overflow: {answered} of 8 answered by the provider after {} ms",
        start.elapsed().as_millis()
    );
    assert_eq!(p.provider.refused.load(Ordering::Relaxed), 0);
    p.wait_condition("InferenceProvider", "fake", "Ready", "True", "Enforced")
        .await?;
    p.stop().await;
    Ok(())
}

/// A tenant at its limit gets 429 with Retry-After, shaped for OpenAI; another tenant does
/// not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_at_its_limit_gets_429() -> anyhow::Result<()> {
    let p = plane("cp-limits", Scenario::default()).await?;
    let rules = policy(
        "limits",
        json!([{"name": "team-a", "match": {"tenants": ["team-a"]},
                "actions": {"limits": {"requestsPerMinute": 2}}}]),
    );
    p.takes_effect("a 429 at team-a's limit", &rules, || async {
        let (status, headers, body) = p.chat(SERVED, "count me", Some(KEY_A)).await?;
        if status != StatusCode::TOO_MANY_REQUESTS {
            return Ok(false);
        }
        assert!(headers.contains_key("retry-after"), "{headers:?}");
        assert!(body["error"]["message"].is_string(), "{body}");
        Ok(true)
    })
    .await?;
    let (status, _, body) = p.chat(SERVED, "not limited", Some(KEY_B)).await?;
    assert!(status.is_success(), "{status}: {body}");
    let m = p.metrics().await?;
    assert!(
        metric(&m, "kvroute_router_tenant_limited_total", "") >= 1.0,
        "{m}"
    );
    p.stop().await;
    Ok(())
}

/// The tenant comes from the API key: no key is 401 (the pool allows no anonymous
/// requests), a wrong key is 401, a known key is its tenant; a rotated key works at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_comes_from_an_api_key() -> anyhow::Result<()> {
    let p = plane("cp-apikey", Scenario::default()).await?;
    p.wait_condition("InferencePool", POOL, "TenantIdentity", "True", "Verified")
        .await?;
    p.wait_condition("InferencePool", POOL, "SecretsMounted", "True", "Mounted")
        .await?;
    let (status, _, body) = p.chat(SERVED, "who am I?", None).await?;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, _, _) = p.chat(SERVED, "who am I?", Some("kvr_wrong")).await?;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, body) = p.chat(SERVED, "who am I?", Some(KEY_A)).await?;
    assert!(status.is_success(), "{status}: {body}");
    // Rotation: a new key for team-a replaces the old one without a restart.
    let new_key = "kvr_team-a-e2e-key-rotated";
    let rotated = secret(
        API_KEYS,
        json!({"team-a": secret_line(new_key), "team-b": secret_line(KEY_B)}),
    );
    let start = Instant::now();
    p.apply(&rotated).await?;
    wait_for("the rotated API key is accepted", WAIT, || async {
        let (status, _, _) = p.chat(SERVED, "rotated", Some(new_key)).await?;
        Ok(status.is_success().then_some(()))
    })
    .await?;
    println!("API key rotation: {} ms", start.elapsed().as_millis());
    let (status, _, _) = p.chat(SERVED, "old key", Some(KEY_A)).await?;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let m = p.metrics().await?;
    assert!(
        metric(&m, "kvroute_router_tenant_auth_total", "") >= 3.0,
        "{m}"
    );
    p.stop().await;
    Ok(())
}

/// A weighted alias split sends about its share of the alias's requests to the canary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weighted_alias_split_sends_its_share_to_the_canary() -> anyhow::Result<()> {
    let p = plane(
        "cp-split",
        Scenario {
            canary: true,
            ..Scenario::default()
        },
    )
    .await?;
    let pool = json!({"apiVersion": "kvroute.dev/v1alpha1", "kind": "InferencePool",
        "metadata": {"name": POOL},
        "spec": {"targets": [{"workerSet": SET}, {"workerSet": CANARY_SET},
                             {"provider": "fake", "role": "overflow"}],
                 "auth": {"apiKeySecrets": [{"name": API_KEYS}], "allowAnonymous": false},
                 "modelAliases": [{"name": "chat", "model": SERVED,
                                   "split": [{"model": CANARY_SERVED, "percent": 50}]}]}});
    let start = Instant::now();
    p.apply(&pool).await?;
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    wait_for("the alias splits between both models", EFFECT, || async {
        let (status, _, body) = p.chat("chat", "split me", Some(KEY_A)).await?;
        if !status.is_success() {
            return Ok(None);
        }
        let model = body["model"].as_str().unwrap_or_default().to_string();
        Ok((model == CANARY_SERVED).then_some(()))
    })
    .await?;
    println!(
        "alias split: took effect after {} ms",
        start.elapsed().as_millis()
    );
    for i in 0..200 {
        let (status, _, body) = p.chat("chat", &format!("request {i}"), Some(KEY_A)).await?;
        assert!(status.is_success(), "{status}: {body}");
        *counts
            .entry(body["model"].as_str().unwrap_or_default().to_string())
            .or_default() += 1;
    }
    let canary = counts.get(CANARY_SERVED).copied().unwrap_or(0);
    // 50 % of 200: a binomial 4-sigma band (100 ± 28).
    assert!((72..=128).contains(&canary), "{counts:?}");
    p.stop().await;
    Ok(())
}

/// "Cheap requests to a smaller model, unless the bigger one already caches their prefix":
/// a rule moves `size:small` requests from [`SERVED`] to [`CANARY_SERVED`] (served by its
/// own WorkerSet), and a prompt the requested model already caches stays there. The model
/// that answered is the one the worker names in its response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_request_moves_to_the_other_model_unless_its_own_caches_the_prefix()
-> anyhow::Result<()> {
    let p = plane(
        "cp-switch",
        Scenario {
            canary: true,
            ..Scenario::default()
        },
    )
    .await?;
    // Several blocks of prompt, served (so cached) by the requested model before the rule.
    let cached = "Here are my meeting notes from the weekly sync, please keep them in mind: \
                  the release moves to Thursday, the dashboard needs two more panels, and \
                  the on-call rota changes next month. Now answer briefly: which day?";
    let (status, _, body) = p.chat(SERVED, cached, Some(KEY_A)).await?;
    assert!(status.is_success(), "{status}: {body}");
    assert_eq!(body["model"], SERVED);
    let rule = policy(
        "small-to-canary",
        json!([{"name": "small-to-canary", "match": {"labels": ["size:small"]},
                "actions": {"route": {"model": CANARY_SERVED}}}]),
    );
    p.takes_effect("model switch", &rule, || async {
        let (status, _, body) = p.chat(SERVED, "what is a haiku?", Some(KEY_A)).await?;
        Ok(status.is_success() && body["model"] == CANARY_SERVED)
    })
    .await?;
    // The requested model caches this prompt and is predicted to answer first: it stays.
    let start = Instant::now();
    wait_for("a cached prompt stays on its model", EFFECT, || async {
        let (status, _, body) = p.chat(SERVED, cached, Some(KEY_A)).await?;
        anyhow::ensure!(status.is_success(), "{status}: {body}");
        Ok((body["model"] == SERVED).then_some(()))
    })
    .await
    .with_context(|| "the cached prompt kept moving to the canary")?;
    println!(
        "model switch: a cached prompt stayed after {} ms",
        start.elapsed().as_millis()
    );
    p.wait_condition(
        "InferencePolicy",
        "small-to-canary",
        "Ready",
        "True",
        "Enforced",
    )
    .await?;
    let text = p.metrics().await?;
    let switched = metric(
        &text,
        "kvroute_router_policy_model_switches_total",
        "outcome=\"switched\"",
    );
    let kept = metric(
        &text,
        "kvroute_router_policy_model_switches_total",
        "outcome=\"kept-cached\"",
    );
    assert!(
        switched >= 1.0 && kept >= 1.0,
        "switched {switched}, kept {kept}"
    );
    p.stop().await;
    Ok(())
}

/// Bad input is counted by the router and the last good configuration stays in force: a
/// malformed policy does not replace the good one, a bad JWKS keeps the pool's keys working,
/// a missing Secret is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_counted_and_the_last_good_configuration_stays() -> anyhow::Result<()> {
    let scenario = Scenario {
        pool_auth: Some(json!({
            "apiKeySecrets": [{"name": API_KEYS}, {"name": "missing-keys"}],
            "jwt": {"issuer": "https://issuer.example", "audiences": ["kvroute"],
                    "jwksSecretRef": {"name": BAD_JWKS_SECRET, "key": "jwks.json"}},
            "allowAnonymous": false})),
        ..Scenario::default()
    };
    let p = plane("cp-bad", scenario).await?;
    let good = policy(
        "rules",
        json!([{"name": "no-team-b", "match": {"tenants": ["team-b"]},
                "actions": {"reject": {"status": 403, "message": "no"}}}]),
    );
    p.takes_effect("the good policy", &good, || async {
        Ok(p.chat(SERVED, "x", Some(KEY_B)).await?.0 == StatusCode::FORBIDDEN)
    })
    .await?;
    let m0 = p.metrics().await?;
    // A malformed version of the same policy: refused, and the good one stays.
    // (An empty range: its CEL rule is not enforced by this API server, so the object is
    // stored and the operator's and router's own validation must refuse it.)
    let bad = policy(
        "rules",
        json!([{"name": "a", "match": {"poolState": {"bestTtftMs": {"atLeast": 500, "below": 100}}},
                "actions": {"reject": {"status": 403}}}]),
    );
    p.apply(&bad).await?;
    p.wait_condition(
        "InferencePolicy",
        "rules",
        "Accepted",
        "False",
        "InvalidSpec",
    )
    .await?;
    // An overflow to an unknown provider.
    p.apply(&policy(
        "unknown-provider",
        json!([{"name": "out", "actions": {"overflow": {"provider": "nope", "queueThreshold": 1}}}]),
    ))
    .await?;
    p.wait_condition(
        "InferencePolicy",
        "unknown-provider",
        "Ready",
        "False",
        "RefNotFound",
    )
    .await?;
    let counted = wait_for("the router counts the bad input", WAIT, || async {
        let m = p.metrics().await?;
        let missing = metric(&m, "kvroute_router_tenant_secret_errors_total", "");
        let jwks = metric(&m, "kvroute_router_tenant_jwks_errors_total", "");
        Ok((missing > 0.0 && jwks > 0.0).then_some(()))
    })
    .await;
    if let Err(e) = counted {
        let now = p.metrics().await.unwrap_or_default();
        let tenant: Vec<&str> = now
            .lines()
            .filter(|l| {
                l.starts_with("kvroute_router_tenant") || l.starts_with("kvroute_router_policy")
            })
            .collect();
        anyhow::bail!(
            "{e}\nbefore:\n{m0}\nnow:\n{}\n{}",
            tenant.join("\n"),
            p.debug().await
        );
    }
    let (status, _, _) = p.chat(SERVED, "x", Some(KEY_B)).await?;
    assert_eq!(status, StatusCode::FORBIDDEN, "the last good policy stays");
    let (status, _, body) = p.chat(SERVED, "x", Some(KEY_A)).await?;
    assert!(status.is_success(), "{status}: {body}");
    p.wait_condition(
        "InferencePool",
        POOL,
        "SecretsMounted",
        "False",
        "SecretNotFound",
    )
    .await?;
    // The bad JWKS is a condition too.
    p.wait_condition(
        "InferencePool",
        POOL,
        "TenantIdentity",
        "False",
        "InvalidJWKS",
    )
    .await?;
    p.stop().await;
    Ok(())
}
