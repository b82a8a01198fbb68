//! Controller tests against a mocked API server (tower-test): the WorkerSet reconciler's
//! requests, the objects it applies, the status it writes, the events it publishes; the
//! generic status-only reconciler (pools, policies, backends); and that every call they make
//! is allowed by the RBAC the bundle grants.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use kvroute_crds::{GatewayBackend, InferencePolicy, InferenceWorkerSet};
use kvroute_operator::controller::{Ctx, Error, pki, refs, router, workerset};
use kvroute_operator::desired::OperatorConfig;
use kvroute_operator::metrics::OperatorMetrics;
use kvroute_operator::permissions::{
    OPERATOR_NAMESPACE_RULES, OPERATOR_RULES, allows, parse_path, verb_of,
};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::watch;

/// One request the reconciler made.
#[derive(Debug, Clone)]
struct Call {
    method: String,
    path: String,
    body: Value,
}

/// A fake API server: answers by path, records every call.
struct FakeApi {
    calls: Arc<Mutex<Vec<Call>>>,
    task: tokio::task::JoinHandle<()>,
}

fn respond(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap_or_default()))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

fn not_found(path: &str) -> Response<Body> {
    respond(
        StatusCode::NOT_FOUND,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                "message": format!("{path} not found"), "metadata": {}}),
    )
}

fn pod(name: &str, ip: &str, ready: bool, waiting: Option<&str>) -> Value {
    let mut engine =
        json!({"name": "engine", "ready": ready, "restartCount": 0, "image": "m", "imageID": ""});
    if let Some(reason) = waiting {
        engine["state"] = json!({"waiting": {"reason": reason}});
    }
    json!({
        "metadata": {"name": name, "namespace": "team-a", "labels": {"kvroute.dev/workerset": "qwen"}},
        "spec": {"containers": [{"name": "engine"}, {"name": "sidecar"}]},
        "status": {"podIP": ip, "containerStatuses": [engine,
            {"name": "sidecar", "ready": ready, "restartCount": 0, "image": "s", "imageID": ""}]}
    })
}

impl FakeApi {
    fn start(pods: Vec<Value>) -> (Client, Self) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let recorded = calls.clone();
        let task = tokio::spawn(async move {
            let mut handle = pin!(handle);
            while let Some((request, send)) = handle.next_request().await {
                let method = request.method().to_string();
                let uri = request.uri().to_string();
                let path = uri.split('?').next().unwrap_or_default().to_string();
                let bytes = request
                    .into_body()
                    .collect_bytes()
                    .await
                    .unwrap_or_default();
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                recorded.lock().push(Call {
                    method: method.clone(),
                    path: uri.clone(),
                    body: body.clone(),
                });
                let resp = match (method.as_str(), path.as_str()) {
                    ("PATCH", p) if p.contains("/deployments/") => {
                        let mut d = body.clone();
                        d["metadata"]["generation"] = json!(2);
                        d["status"] = json!({"observedGeneration": 2, "replicas": 2, "readyReplicas": 1, "updatedReplicas": 2});
                        respond(StatusCode::OK, &d)
                    }
                    ("PATCH", p) if p.ends_with("/status") => {
                        let mut o = body.clone();
                        o["metadata"] = json!({"name": "x", "namespace": "team-a"});
                        o["spec"] = match body["kind"].as_str() {
                            Some("InferencePool") => json!({"targets": []}),
                            Some("InferencePolicy") => {
                                json!({"rules": [{"name": "a", "actions": {"route": {"localOnly": true}}}]})
                            }
                            Some("InferenceProvider") => json!({"kind": "openai", "models": ["m"],
                                                                 "gatewayBackendRef": {"name": "b"}}),
                            Some("GatewayBackend") => json!({"url": "https://example.com"}),
                            _ => json!({"model": {"name": "m"}}),
                        };
                        respond(StatusCode::OK, &o)
                    }
                    ("PATCH", _) => respond(StatusCode::OK, &body),
                    ("GET", p) if p.ends_with("/pods") => respond(
                        StatusCode::OK,
                        &json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": pods}),
                    ),
                    ("POST", p) if p.contains("/events") || p.ends_with("/secrets") => {
                        respond(StatusCode::CREATED, &body)
                    }
                    ("GET", p)
                        if p.ends_with("/namespaces/kvroute-system/deployments/kvroute-router") =>
                    {
                        respond(
                            StatusCode::OK,
                            &json!({"apiVersion": "apps/v1", "kind": "Deployment",
                                "metadata": {"name": "kvroute-router", "namespace": "kvroute-system"},
                                "spec": {"selector": {}, "template": {"spec": {
                                    "containers": [{"name": "router", "volumeMounts": [
                                        {"name": "request-secret-0", "mountPath": "/var/run/kvroute/secrets/openai-credentials"}]}],
                                    "volumes": [{"name": "request-secret-0",
                                                 "secret": {"secretName": "openai-credentials", "optional": true}}]}}}}),
                        )
                    }
                    ("GET", p) if p.ends_with("/secrets/openai-credentials") => respond(
                        StatusCode::OK,
                        &json!({"apiVersion": "v1", "kind": "Secret",
                                "metadata": {"name": "openai-credentials", "namespace": "team-a"},
                                "data": {"apiKey": "eA=="}}),
                    ),
                    ("GET", p) if parse_path(p).is_some_and(|a| a.name.is_none()) => respond(
                        StatusCode::OK,
                        &json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": []}),
                    ),
                    (_, p) => not_found(p),
                };
                send.send_response(resp);
            }
        });
        (Client::new(service, "default"), Self { calls, task })
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().clone()
    }
}

fn ctx(client: Client, leading: bool) -> (Arc<Ctx>, watch::Sender<bool>) {
    let registry = prometheus::Registry::new();
    let metrics = OperatorMetrics::register(&registry).expect("metrics");
    let (tx, rx) = watch::channel(leading);
    let cfg = OperatorConfig {
        sidecar_image: "sidecar:test".into(),
        mock_image: "mock:test".into(),
        router_image: "router:test".into(),
        router_replicas: 2,
        router_namespace: "kvroute-system".into(),
        watch_namespace: String::new(),
        mtls: false,
        gie_inference_pool: String::new(),
        otlp_endpoint: String::new(),
        tokenizer_fetch: Default::default(),
    };
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "kvroute-operator".into(),
            instance: Some("t".into()),
        },
    );
    (
        Arc::new(
            Ctx::new(client, cfg, metrics, recorder, rx, Duration::from_secs(300)).with_pki(
                pki::PkiSettings {
                    ca_namespace: "kvroute-system".into(),
                    lifetimes: Default::default(),
                },
            ),
        ),
        tx,
    )
}

fn worker_set(spec: Value) -> Arc<InferenceWorkerSet> {
    let ws: InferenceWorkerSet = serde_json::from_value(json!({
        "apiVersion": "kvroute.dev/v1alpha1", "kind": "InferenceWorkerSet",
        "metadata": {"name": "qwen", "namespace": "team-a", "uid": "u-1", "generation": 2},
        "spec": spec
    }))
    .expect("worker set");
    Arc::new(ws)
}

fn policy(spec: Value) -> Arc<InferencePolicy> {
    let p: InferencePolicy = serde_json::from_value(json!({
        "apiVersion": "kvroute.dev/v1alpha1", "kind": "InferencePolicy",
        "metadata": {"name": "default", "namespace": "team-a", "generation": 4},
        "spec": spec
    }))
    .expect("policy");
    Arc::new(p)
}

fn backend(name: &str, secret: &str) -> Arc<GatewayBackend> {
    let b: GatewayBackend = serde_json::from_value(json!({
        "apiVersion": "kvroute.dev/v1alpha1", "kind": "GatewayBackend",
        "metadata": {"name": name, "namespace": "team-a", "generation": 1},
        "spec": {"url": "https://api.openai.com", "auth": {"secretRef": {"name": secret, "key": "apiKey"}}}
    }))
    .expect("backend");
    Arc::new(b)
}

/// The status body of the one status patch to `path_part`, if any.
fn written_status(calls: &[Call], path_part: &str) -> Option<Value> {
    calls
        .iter()
        .find(|c| c.method == "PATCH" && c.path.contains(path_part))
        .map(|c| c.body["status"].clone())
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"))
}

/// Every call is allowed by the ClusterRole, or, in the operator's own namespace (the router
/// namespace of [`ctx`]), by its Role. A server-side apply may create the object, which the
/// API server authorizes as `create` on the same name: both must be granted (the real API
/// server's check is e2e/tests/k8s_rbac_audit.rs).
fn assert_rbac_covers(calls: &[Call]) {
    for c in calls {
        let p = parse_path(&c.path).unwrap_or_else(|| panic!("unparsable path {}", c.path));
        let verb = verb_of(&c.method, p.name.is_some(), c.path.contains("watch=true"));
        let own_ns = p.namespace.as_deref() == Some("kvroute-system");
        let allowed = |verb: &str| {
            allows(
                OPERATOR_RULES,
                &p.group,
                &p.resource,
                verb,
                p.name.as_deref(),
            ) || (own_ns
                && allows(
                    OPERATOR_NAMESPACE_RULES,
                    &p.group,
                    &p.resource,
                    verb,
                    p.name.as_deref(),
                ))
        };
        // (A subresource is never created by an apply: its object must exist.)
        let applies =
            c.path.contains("fieldManager=") && c.method == "PATCH" && !p.resource.contains('/');
        for v in std::iter::once(verb).chain(applies.then_some("create")) {
            assert!(
                allowed(v),
                "RBAC does not allow {v} {}/{} ({})",
                p.group,
                p.resource,
                c.path
            );
        }
    }
}

#[tokio::test]
async fn worker_set_reconcile_applies_children_and_reports_status() {
    let (client, api) = FakeApi::start(vec![
        pod("qwen-a", "10.0.0.1", true, None),
        pod("qwen-b", "10.0.0.2", false, Some("CrashLoopBackOff")),
    ]);
    let (ctx, _leader) = ctx(client, true);
    let ws = worker_set(
        json!({"model": {"name": "Qwen/Qwen3-0.6B"}, "replicas": 2, "engine": {"mode": "mock", "speedup": 5}}),
    );
    let action = workerset::reconcile(ws, ctx).await.expect("reconciles");
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));

    let calls = api.calls();
    let service = calls
        .iter()
        .find(|c| c.method == "PATCH" && c.path.contains("/services/qwen"))
        .expect("service applied");
    assert!(
        service.path.contains("fieldManager=kvroute-operator")
            && service.path.contains("force=true"),
        "{}",
        service.path
    );
    assert_eq!(service.body["spec"]["clusterIP"], "None");
    let deployment = calls
        .iter()
        .find(|c| c.method == "PATCH" && c.path.contains("/deployments/qwen"))
        .expect("deployment applied");
    let containers = deployment
        .body
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .expect("containers");
    assert_eq!(containers.len(), 2);
    assert_eq!(containers[0]["command"], json!(["kvroute-mock-vllm"]));
    assert_eq!(containers[1]["image"], "sidecar:test");
    assert_eq!(
        deployment.body["metadata"]["ownerReferences"][0]["uid"],
        "u-1"
    );

    let status = calls
        .iter()
        .find(|c| c.path.contains("/inferenceworkersets/qwen/status"))
        .expect("status written");
    let st = &status.body["status"];
    assert_eq!(status.body["kind"], "InferenceWorkerSet");
    assert_eq!(st["readyReplicas"], 1);
    assert_eq!(st["replicas"], 2);
    assert_eq!(st["observedGeneration"], 2);
    assert_eq!(st["selector"], "kvroute.dev/workerset=qwen");
    assert_eq!(st["workers"][0]["address"], "10.0.0.1:8000");
    let degraded = st["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Degraded"))
        .expect("degraded");
    assert_eq!(
        (degraded["status"].as_str(), degraded["reason"].as_str()),
        (Some("True"), Some("WorkerCrashLoopBackOff"))
    );

    let event = calls
        .iter()
        .find(|c| c.method == "POST" && c.path.contains("/events"))
        .expect("event published");
    assert_eq!(event.body["reason"], "WorkerCrashLoopBackOff");
    assert_eq!(event.body["type"], "Warning");
    assert_rbac_covers(&calls);
    api.task.abort();
}

#[tokio::test]
async fn invalid_spec_touches_no_children_and_ends_as_a_condition() {
    let (client, api) = FakeApi::start(Vec::new());
    let (ctx, _leader) = ctx(client, true);
    let ws = worker_set(json!({"model": {"name": "m"}, "gpu": {"product": "NVIDIA-L40X"}}));
    let action = workerset::reconcile(ws, ctx)
        .await
        .expect("a bad spec is not an error");
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));
    let calls = api.calls();
    assert!(!calls.iter().any(|c| c.method == "PATCH"
        && (c.path.contains("/deployments/") || c.path.contains("/services/"))));
    let status = calls
        .iter()
        .find(|c| c.path.ends_with("/status") || c.path.contains("/status?"))
        .expect("status");
    let ready = status.body["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .expect("ready");
    assert_eq!(ready["reason"], "InvalidSpec");
    assert!(
        ready["message"]
            .as_str()
            .is_some_and(|m| m.contains("NVIDIA-L40X"))
    );
    let event = calls
        .iter()
        .find(|c| c.path.contains("/events"))
        .expect("event");
    assert_eq!(event.body["reason"], "InvalidSpec");
    assert_rbac_covers(&calls);
    api.task.abort();
}

#[tokio::test]
async fn a_replica_without_the_lease_makes_no_calls() {
    let (client, api) = FakeApi::start(Vec::new());
    let (ctx, _leader) = ctx(client, false);
    let ws = worker_set(json!({"model": {"name": "m"}}));
    let err = workerset::reconcile(ws, ctx.clone())
        .await
        .expect_err("must refuse");
    assert!(matches!(err, Error::NotLeader));
    assert!(router::reconcile(&ctx).await.is_err());
    let err = refs::reconcile(
        policy(json!({"rules": [{"name": "a", "actions": {"route": {"localOnly": true}}}]})),
        ctx.clone(),
    )
    .await
    .expect_err("must refuse");
    assert!(matches!(err, Error::NotLeader));
    tokio::task::yield_now().await;
    assert!(api.calls().is_empty(), "{:?}", api.calls());
    api.task.abort();
}

#[tokio::test]
async fn router_objects_are_applied_within_rbac() {
    let (client, api) = FakeApi::start(Vec::new());
    let (ctx, _leader) = ctx(client, true);
    router::reconcile(&ctx).await.expect("router applied");
    let calls = api.calls();
    let paths: Vec<&str> = calls
        .iter()
        .map(|c| c.path.split('?').next().unwrap_or_default())
        .collect();
    for expected in [
        "/api/v1/namespaces/kvroute-system/serviceaccounts/kvroute-router",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/kvroute-router",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/kvroute-router",
        "/apis/networking.k8s.io/v1/namespaces/kvroute-system/networkpolicies/kvroute-router",
        "/api/v1/namespaces/kvroute-system/services/kvroute-router",
        "/api/v1/namespaces/kvroute-system/services/kvroute-router-ingest",
        "/apis/apps/v1/namespaces/kvroute-system/deployments/kvroute-router",
    ] {
        assert!(paths.contains(&expected), "missing {expected}: {paths:?}");
    }
    assert_rbac_covers(&calls);
    api.task.abort();
}

#[tokio::test]
async fn pool_reconcile_reports_missing_targets() {
    let (client, api) = FakeApi::start(Vec::new());
    let (ctx, _leader) = ctx(client, true);
    let pool: kvroute_crds::InferencePool = serde_json::from_value(json!({
        "apiVersion": "kvroute.dev/v1alpha1", "kind": "InferencePool",
        "metadata": {"name": "chat", "namespace": "team-a", "generation": 1},
        "spec": {"targets": [{"workerSet": "ghost"}]}
    }))
    .expect("pool");
    // The namespace is empty: the pool points at nothing, which is a condition, not an error.
    let action = refs::reconcile(Arc::new(pool), ctx)
        .await
        .expect("reconciles");
    // Not settled: re-checked soon, since a WorkerSet appearing may not wake the pool.
    assert_eq!(action, Action::requeue(Duration::from_secs(15)));
    let calls = api.calls();
    let status = calls
        .iter()
        .find(|c| c.path.contains("/inferencepools/chat/status"))
        .expect("status");
    let ready = status.body["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .expect("ready");
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("False"), Some("RefNotFound"))
    );
    assert!(
        ready["message"]
            .as_str()
            .is_some_and(|m| m.contains("\"ghost\" not found"))
    );
    assert_rbac_covers(&calls);
    api.task.abort();
}

#[tokio::test]
async fn a_policy_that_compiles_is_ready_because_the_router_enforces_it() {
    let (client, api) = FakeApi::start(Vec::new());
    let (ctx, _leader) = ctx(client, true);
    let p = policy(json!({"rules": [
        {"name": "pii-stays-local", "match": {"labels": ["pii"]}, "actions": {"route": {"localOnly": true}}},
        {"name": "small", "actions": {"limits": {"tokensPerMinute": 1000}}}
    ]}));
    let action = refs::reconcile(p.clone(), ctx.clone())
        .await
        .expect("reconciles");
    // Nothing left to wait for: the periodic requeue, not the quick re-check.
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));
    let calls = api.calls();
    let status =
        written_status(&calls, "/inferencepolicies/default/status").expect("status written");
    assert_eq!(status["observedGeneration"], 4);
    let accepted = condition(&status, "Accepted");
    assert_eq!(accepted["status"], "True");
    assert_eq!(condition(&status, "ResolvedRefs")["status"], "True");
    let ready = condition(&status, "Ready");
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("True"), Some("Enforced"))
    );
    let message = ready["message"].as_str().unwrap_or_default();
    assert_eq!(message, "2 rules enforced by the router");
    let event = calls
        .iter()
        .find(|c| c.method == "POST" && c.path.contains("/events"))
        .expect("event");
    assert_eq!(event.body["reason"], "Enforced");
    assert_rbac_covers(&calls);

    // The same decision again writes nothing: the status is patched only when it changes.
    let mut unchanged = InferencePolicy::clone(&p);
    unchanged.status = Some(serde_json::from_value(status).expect("status parses"));
    let before = api.calls().len();
    refs::reconcile(Arc::new(unchanged), ctx)
        .await
        .expect("reconciles");
    let after = api.calls();
    assert!(
        !after[before..].iter().any(|c| c.method != "GET"),
        "{:?}",
        &after[before..]
    );
    api.task.abort();
}

#[tokio::test]
async fn backend_reads_only_the_secrets_it_names() {
    let (client, api) = FakeApi::start(Vec::new());
    let (ctx, _leader) = ctx(client, true);
    let action = refs::reconcile(backend("openai", "openai-credentials"), ctx.clone())
        .await
        .expect("reconciles");
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));
    let action = refs::reconcile(backend("other", "missing"), ctx)
        .await
        .expect("a missing Secret is a condition, not an error");
    assert_eq!(action, Action::requeue(Duration::from_secs(15)));
    let calls = api.calls();
    let gets: Vec<&str> = calls
        .iter()
        .filter(|c| c.method == "GET")
        .map(|c| c.path.split('?').next().unwrap_or_default())
        .collect();
    // Secrets are looked up where the router mounts them from: its own namespace.
    assert_eq!(
        gets,
        vec![
            "/apis/apps/v1/namespaces/kvroute-system/deployments/kvroute-router",
            "/api/v1/namespaces/kvroute-system/secrets/openai-credentials",
            "/apis/apps/v1/namespaces/kvroute-system/deployments/kvroute-router",
            "/api/v1/namespaces/kvroute-system/secrets/missing"
        ]
    );
    let found = written_status(&calls, "/gatewaybackends/openai/status").expect("status");
    assert_eq!(condition(&found, "Accepted")["status"], "True");
    assert_eq!(condition(&found, "Ready")["reason"], "Enforced");
    assert_eq!(condition(&found, "SecretsMounted")["reason"], "Mounted");
    let missing = written_status(&calls, "/gatewaybackends/other/status").expect("status");
    let refs = condition(&missing, "ResolvedRefs");
    assert_eq!(refs["status"], "False");
    assert!(
        refs["message"]
            .as_str()
            .is_some_and(|m| m.contains("Secret \"missing\" not found")),
        "{refs}"
    );
    assert_eq!(condition(&missing, "Ready")["reason"], "RefNotFound");
    assert_eq!(
        condition(&missing, "SecretsMounted")["reason"],
        "SecretNotFound"
    );
    assert_rbac_covers(&calls);
    api.task.abort();
}

#[tokio::test]
async fn pki_pass_creates_the_ca_and_applies_only_the_two_named_secrets() {
    let (client, api) = FakeApi::start(Vec::new());
    let (ctx, _leader) = ctx(client, true);
    let wake = pki::reconcile(&ctx).await.expect("reconciles");
    assert!(wake.is_some(), "the pass says when the next pair is due");
    let calls = api.calls();
    assert_rbac_covers(&calls);
    let secrets: Vec<&Call> = calls
        .iter()
        .filter(|c| c.path.contains("/secrets"))
        .collect();
    // Created once with POST (never overwritten), the namespace's pairs server-side applied.
    let create = secrets
        .iter()
        .find(|c| c.method == "POST")
        .expect("the CA is created");
    assert!(
        create
            .path
            .split('?')
            .next()
            .is_some_and(|p| p.ends_with("/namespaces/kvroute-system/secrets")),
        "{}",
        create.path
    );
    assert_eq!(create.body["metadata"]["name"], "kvroute-ca");
    assert!(create.body["data"]["ca.key"].is_string());
    let mtls = secrets
        .iter()
        .find(|c| c.method == "PATCH")
        .expect("kvroute-mtls applied");
    assert!(
        mtls.path.contains("fieldManager=kvroute-operator"),
        "{}",
        mtls.path
    );
    let keys: Vec<&str> = mtls.body["data"]
        .as_object()
        .expect("data")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["admin-token", "ca.crt", "router.crt", "router.key"]);
    // Every other Secret call names one of the two Secrets the rules allow by name; none
    // lists or watches.
    for c in &secrets {
        if c.method == "POST" {
            continue;
        }
        let parsed = parse_path(&c.path).expect("path");
        let name = parsed.name.unwrap_or_default();
        assert!(!name.is_empty(), "{} {}", c.method, c.path);
        let name = name.as_str();
        let rule = OPERATOR_RULES
            .iter()
            .find(|r| r.resources.contains(&"secrets") && !r.names.is_empty())
            .expect("a named secrets rule");
        assert!(rule.names.contains(&name), "{} {}", c.method, c.path);
        assert!(rule.verbs.contains(&verb_of(&c.method, true, false)));
    }
}
