//! Tenant identity and limits through whole routers on loopback (static discovery file,
//! Secrets under `--secrets-dir`): the 401/403 shapes of both APIs, API keys and their
//! rotation, JWTs, what an unauthenticated caller can learn about models, the Pick API, and
//! a tenant limit held by two replicas together. No worker runs: an admitted request ends
//! in 503 (no ready worker), which is what tells it from a refused one.

use std::path::Path;
use std::time::Duration;

use kvroute_proto::v1::PickRequest;
use kvroute_proto::v1::picker_client::PickerClient;
use kvroute_router::tenant::apikeys::{new_key, secret_line};
use kvroute_router::{Addrs, Args, Server};
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[path = "support/jwt_keys.rs"]
#[allow(dead_code)]
mod jwt_keys;
use jwt_keys::{TestKey, jwks_of};

#[path = "support/sidecar.rs"]
mod fake_sidecar;

const DEADLINE: Duration = Duration::from_secs(30);

const WORKERS: &str = r#"
apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: qwen, namespace: ml}
spec:
  model: {name: tiny}
  replicas: 1
  engine: {mode: mock, port: 8000}
status:
  replicas: 1
  readyReplicas: 1
  workers:
    - {pod: qwen-0, address: "127.0.0.1:9", ready: true}
---
apiVersion: kvroute.dev/v1alpha1
kind: InferencePool
metadata: {name: chat, namespace: ml}
spec:
  targets: [{workerSet: qwen}]
  auth:
    apiKeySecrets: [{name: team-keys}]
    jwt: {issuer: "https://idp.test", audiences: [kvroute], jwksSecretRef: {name: idp, key: jwks.json}}
    trustedPeers: ["10.0.0.0/8"]
"#;

/// A second model whose pool has no auth block. (A model outside every pool is served
/// anonymously too, so the guarded-only setup leaves this WorkerSet out as well.)
const OPEN_POOL: &str = r#"
---
apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: open, namespace: ml}
spec:
  model: {name: small}
  replicas: 1
  engine: {mode: mock, port: 8000}
status:
  replicas: 1
  readyReplicas: 1
  workers:
    - {pod: open-0, address: "127.0.0.1:9", ready: true}
---
apiVersion: kvroute.dev/v1alpha1
kind: InferencePool
metadata: {name: public, namespace: ml}
spec:
  targets: [{workerSet: open}]
"#;

struct Router {
    addrs: Addrs,
    stop: CancellationToken,
}

impl Drop for Router {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn start(config: &Path, secrets: &Path, edit: impl FnOnce(&mut Args)) -> Router {
    let mut args = Args {
        http_addr: "127.0.0.1:0".parse().expect("addr"),
        grpc_addr: "127.0.0.1:0".parse().expect("addr"),
        admin_addr: "127.0.0.1:0".parse().expect("addr"),
        config: Some(config.to_path_buf()),
        secrets_dir: Some(secrets.to_path_buf()),
        seed: Some(7),
        ..Args::default()
    };
    edit(&mut args);
    let server = Server::bind(args).await.expect("bind router");
    let addrs = server.addrs().expect("addrs");
    let stop = CancellationToken::new();
    tokio::spawn(server.serve(stop.clone()));
    Router { addrs, stop }
}

/// A config file and a secrets dir with team-a's key and the IdP's JWKS.
struct Setup {
    _tmp: tempfile::TempDir,
    config: std::path::PathBuf,
    secrets: std::path::PathBuf,
    key: String,
    idp: TestKey,
}

fn setup(with_open_pool: bool) -> Setup {
    let tmp = tempfile::tempdir().expect("tmp");
    let config = tmp.path().join("router.yaml");
    let text = if with_open_pool {
        format!("{WORKERS}{OPEN_POOL}")
    } else {
        WORKERS.to_string()
    };
    std::fs::write(&config, text).expect("config");
    let secrets = tmp.path().join("secrets");
    std::fs::create_dir_all(secrets.join("team-keys")).expect("mkdir");
    std::fs::create_dir_all(secrets.join("idp")).expect("mkdir");
    let key = new_key();
    std::fs::write(secrets.join("team-keys/team-a"), secret_line(&key)).expect("key");
    let idp = TestKey::ec("idp-1");
    std::fs::write(secrets.join("idp/jwks.json"), jwks_of(&[&idp])).expect("jwks");
    Setup {
        _tmp: tmp,
        config,
        secrets,
        key,
        idp,
    }
}

/// POSTs `body` to `path` with `headers`; returns status, headers and JSON body.
async fn post(
    r: &Router,
    path: &str,
    body: Value,
    headers: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, Value) {
    let client = reqwest::Client::builder()
        .timeout(DEADLINE)
        .build()
        .expect("client");
    let mut req = client
        .post(format!("http://{}{path}", r.addrs.http))
        .json(&body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("send");
    let status = resp.status().as_u16();
    let h = resp.headers().clone();
    let v = resp.json().await.unwrap_or(Value::Null);
    (status, h, v)
}

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
}

async fn models(r: &Router, headers: &[(&str, &str)]) -> (u16, Vec<String>) {
    let client = reqwest::Client::new();
    let mut req = client.get(format!("http://{}/v1/models", r.addrs.http));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("models");
    let status = resp.status().as_u16();
    let v: Value = resp.json().await.expect("json");
    let mut ids: Vec<String> = v["data"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|m| m["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    ids.sort();
    (status, ids)
}

async fn metrics(r: &Router) -> String {
    reqwest::get(format!("http://{}/metrics", r.addrs.admin))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text")
}

async fn metric(r: &Router, series: &str) -> f64 {
    metrics(r)
        .await
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// Waits for the static file's first load (the model resolves).
async fn wait_loaded(r: &Router, key: &str) {
    let end = Instant::now() + DEADLINE;
    loop {
        let (status, _, _) = post(
            r,
            "/v1/chat/completions",
            chat("tiny"),
            &[("x-api-key", key)],
        )
        .await;
        if status == 503 {
            return;
        }
        assert!(
            Instant::now() < end,
            "discovery never loaded (last status {status})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn unauthenticated_and_forbidden_requests_in_both_shapes() {
    let s = setup(true);
    let r = start(&s.config, &s.secrets, |_| {}).await;
    wait_loaded(&r, &s.key).await;

    // No credential: 401 with a challenge, OpenAI and Anthropic bodies.
    let (status, h, body) = post(&r, "/v1/chat/completions", chat("tiny"), &[]).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(h["www-authenticate"], r#"Bearer realm="kvroute""#);
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["code"], "missing_api_key");
    let anthropic =
        json!({"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
    let (status, h, body) = post(&r, "/v1/messages", anthropic.clone(), &[]).await;
    assert_eq!(status, 401);
    assert!(h.contains_key("www-authenticate"));
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "authentication_error");

    // A wrong key, a forged token: 401, no internals.
    let (status, _, body) = post(
        &r,
        "/v1/chat/completions",
        chat("tiny"),
        &[("authorization", "Bearer kvr_wrong")],
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("invalid_api_key"))
    );
    let forged = TestKey::ec("idp-1").sign(json!({}), &json!({"iss": "https://idp.test", "aud": "kvroute", "exp": 4_000_000_000u64, "tenant": "team-a"}));
    let (status, h, body) = post(
        &r,
        "/v1/messages",
        anthropic.clone(),
        &[("authorization", &format!("Bearer {forged}"))],
    )
    .await;
    assert_eq!(
        (status, body["error"]["type"].as_str()),
        (401, Some("authentication_error"))
    );
    assert!(
        h["www-authenticate"]
            .to_str()
            .expect("ascii")
            .contains("invalid_token")
    );
    assert_eq!(
        body["error"]["message"],
        "the bearer token is not valid or has expired"
    );

    // A tenant header from a peer outside trustedPeers: 403 in both shapes.
    let (status, _, body) = post(
        &r,
        "/v1/chat/completions",
        chat("tiny"),
        &[("x-kvroute-tenant", "team-a")],
    )
    .await;
    assert_eq!(
        (status, body["error"]["type"].as_str()),
        (403, Some("permission_error"))
    );
    let (status, _, body) = post(
        &r,
        "/v1/messages",
        anthropic,
        &[("x-kvroute-tenant", "team-a")],
    )
    .await;
    assert_eq!(
        (status, body["error"]["type"].as_str()),
        (403, Some("permission_error"))
    );

    // The right key in either header, and a good JWT, pass (503: no worker runs).
    for h in [
        ("x-api-key", s.key.clone()),
        ("authorization", format!("Bearer {}", s.key)),
    ] {
        let (status, _, _) = post(&r, "/v1/chat/completions", chat("tiny"), &[(h.0, &h.1)]).await;
        assert_eq!(status, 503);
    }
    let good = s.idp.sign(json!({}), &json!({"iss": "https://idp.test", "aud": "kvroute", "exp": 4_000_000_000u64, "tenant": "team-j"}));
    let (status, _, _) = post(
        &r,
        "/v1/chat/completions",
        chat("tiny"),
        &[("authorization", &format!("Bearer {good}"))],
    )
    .await;
    assert_eq!(status, 503);

    // The open pool serves anonymous callers; an unknown model is indistinguishable from a
    // guarded one without credentials (401), and a 404 with them.
    let (status, _, _) = post(&r, "/v1/chat/completions", chat("small"), &[]).await;
    assert_eq!(status, 503);
    let (status, _, _) = post(&r, "/v1/chat/completions", chat("nope"), &[]).await;
    assert_eq!(status, 401);
    let (status, _, _) = post(
        &r,
        "/v1/chat/completions",
        chat("nope"),
        &[("x-api-key", &s.key)],
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(models(&r, &[]).await, (200, vec!["small".to_string()]));
    assert_eq!(
        models(&r, &[("x-api-key", &s.key)]).await,
        (200, vec!["small".to_string(), "tiny".to_string()])
    );

    // Counted by reason; the open pool is reported.
    assert!(
        metric(
            &r,
            "kvroute_router_tenant_auth_total{result=\"missing_credentials\"}"
        )
        .await
            >= 3.0
    );
    assert!(
        metric(
            &r,
            "kvroute_router_tenant_auth_total{result=\"untrusted_tenant_header\"}"
        )
        .await
            >= 2.0
    );
    assert!(metric(&r, "kvroute_router_tenant_auth_total{result=\"tenant\"}").await >= 3.0);
    let end = Instant::now() + DEADLINE;
    while metric(&r, "kvroute_router_tenant_open_pools").await != 1.0 {
        assert!(Instant::now() < end, "open pools never reported");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // pick_errors never carries the client's model string.
    assert!(!metrics(&r).await.contains("model=\"nope\""));
}

#[tokio::test]
async fn keys_rotate_without_a_restart() {
    let s = setup(false);
    let r = start(&s.config, &s.secrets, |_| {}).await;
    wait_loaded(&r, &s.key).await;
    let new = new_key();
    let file = s.secrets.join("team-keys/team-a");
    std::fs::write(
        &file,
        format!("{}\n{}\n", secret_line(&s.key), secret_line(&new)),
    )
    .expect("rotate");
    let status_of = |key: String| {
        let r = &r;
        async move {
            post(
                r,
                "/v1/chat/completions",
                chat("tiny"),
                &[("x-api-key", &key)],
            )
            .await
            .0
        }
    };
    let end = Instant::now() + DEADLINE;
    while status_of(new.clone()).await != 503 {
        assert!(Instant::now() < end, "the new key was never accepted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        status_of(s.key.clone()).await,
        503,
        "both keys during the overlap"
    );
    std::fs::write(&file, secret_line(&new)).expect("retire the old key");
    while status_of(s.key.clone()).await != 401 {
        assert!(Instant::now() < end, "the old key was never retired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A broken file keeps the last good keys.
    std::fs::write(&file, "garbage").expect("break");
    let end = Instant::now() + DEADLINE;
    while metric(
        &r,
        "kvroute_router_tenant_secret_errors_total{reason=\"invalid\"}",
    )
    .await
        < 1.0
    {
        assert!(Instant::now() < end, "the bad file was never counted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status_of(new).await, 503);
}

#[tokio::test]
async fn every_pool_needs_auth_so_models_stay_hidden() {
    let s = setup(false);
    let r = start(&s.config, &s.secrets, |_| {}).await;
    wait_loaded(&r, &s.key).await;
    let (status, _, _) = {
        let resp = reqwest::get(format!("http://{}/v1/models", r.addrs.http))
            .await
            .expect("get");
        (resp.status().as_u16(), (), ())
    };
    assert_eq!(status, 401);
    let (s1, _, known) = post(&r, "/v1/chat/completions", chat("tiny"), &[]).await;
    let (s2, _, unknown) = post(&r, "/v1/chat/completions", chat("does-not-exist"), &[]).await;
    assert_eq!((s1, s2), (401, 401));
    assert_eq!(
        known, unknown,
        "the same answer for a model that exists and one that does not"
    );
    assert_eq!(
        models(&r, &[("x-api-key", &s.key)]).await,
        (200, vec!["tiny".to_string()])
    );
}

#[tokio::test]
async fn pick_api_reads_credentials_from_the_request_headers() {
    let s = setup(false);
    let r = start(&s.config, &s.secrets, |_| {}).await;
    wait_loaded(&r, &s.key).await;
    let mut client = PickerClient::connect(format!("http://{}", r.addrs.grpc))
        .await
        .expect("connect");
    let pick = |headers: &[(&str, &str)]| PickRequest {
        path: "/v1/chat/completions".into(),
        headers: headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        body: chat("tiny").to_string().into_bytes(),
    };
    let code = |r: Result<tonic::Response<_>, tonic::Status>| r.err().map(|s| s.code());
    assert_eq!(
        code(client.pick(pick(&[])).await),
        Some(tonic::Code::Unauthenticated)
    );
    // A plaintext caller is no trusted picker: its tenant header is refused.
    assert_eq!(
        code(client.pick(pick(&[("x-kvroute-tenant", "team-a")])).await),
        Some(tonic::Code::PermissionDenied)
    );
    assert_eq!(
        code(
            client
                .pick(pick(&[("authorization", &format!("Bearer {}", s.key))]))
                .await
        ),
        Some(tonic::Code::Unavailable),
        "authenticated; no worker is routable"
    );
}

/// Two replicas with `--router-replicas 2` and a limit of L = 10 requests per minute for
/// every tenant: each admits 5 at once, so the two together admit the limit and no more than
/// the documented bound `L + L·T/60` over the T seconds the test ran (refill); the rest get 429
/// with Retry-After in both shapes. Tenant series carry allow-listed names only.
#[tokio::test]
async fn two_replicas_hold_a_tenant_limit_together() {
    let s = setup(false);
    let edit = |a: &mut Args| {
        a.router_replicas = 2;
        a.tenant_default_limits = Some("rpm=10".into());
        a.tenant_metrics_allow = vec!["team-a".into()];
    };
    let replicas = [
        start(&s.config, &s.secrets, edit).await,
        start(&s.config, &s.secrets, edit).await,
    ];
    for r in &replicas {
        wait_loaded(r, &s.key).await;
    }
    // wait_loaded used one request of each replica's share.
    let started = std::time::Instant::now();
    let mut admitted: u32 = 2;
    let mut refused: u32 = 0;
    for i in 0..40 {
        let r = &replicas[i % 2];
        let (status, h, body) = if i % 4 == 0 {
            let b = json!({"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
            post(r, "/v1/messages", b, &[("x-api-key", &s.key)]).await
        } else {
            post(
                r,
                "/v1/chat/completions",
                chat("tiny"),
                &[("x-api-key", &s.key)],
            )
            .await
        };
        match status {
            503 => admitted += 1,
            429 => {
                refused += 1;
                let wait: u64 = h["retry-after"]
                    .to_str()
                    .expect("ascii")
                    .parse()
                    .expect("seconds");
                assert!((1..=60).contains(&wait), "{wait}");
                if i % 4 == 0 {
                    assert_eq!(body["error"]["type"], "rate_limit_error");
                } else {
                    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
                }
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    let bound = 10.0 + 10.0 * started.elapsed().as_secs_f64() / 60.0;
    assert!(admitted >= 10, "each replica admits its share: {admitted}");
    assert!(
        f64::from(admitted) <= bound,
        "{admitted} admitted > the documented bound {bound}"
    );
    assert_eq!(admitted + refused, 42);
    // Another tenant has buckets of its own, and folds into `other` in the metrics.
    let other = new_key();
    std::fs::write(s.secrets.join("team-keys/team-b"), secret_line(&other)).expect("key");
    let end = Instant::now() + DEADLINE;
    while post(
        &replicas[0],
        "/v1/chat/completions",
        chat("tiny"),
        &[("x-api-key", &other)],
    )
    .await
    .0 != 503
    {
        assert!(Instant::now() < end, "team-b's key was never accepted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(metrics(&replicas[0]).await.contains("tenant=\"other\""));
    let mut total = 0.0;
    for r in &replicas {
        total += metric(
            r,
            "kvroute_router_tenant_limited_total{limit=\"requests_per_minute\"}",
        )
        .await;
        let text = metrics(r).await;
        assert!(
            text.contains("tenant=\"team-a\""),
            "allow-listed tenant keeps its name"
        );
        assert!(!text.contains("team-b"), "no name outside the allow-list");
    }
    assert_eq!(total, f64::from(refused));
}

/// On a TLS gRPC listener the pool's own picker identity is trusted to name the tenant in
/// `x-kvroute-tenant` (it has authenticated the client itself); without a credential it is
/// still refused, and a malformed tenant name too.
#[tokio::test]
async fn pick_api_trusts_the_pools_mtls_picker_for_the_tenant_header() {
    use kvroute_tls::testpki::{TestCa, write_dir};
    use kvroute_tls::{ClientTls, Identity, WatchedClient};

    let s = setup(false);
    let tmp = tempfile::tempdir().expect("tmp");
    let ca = TestCa::new("tenants");
    let router_id = Identity::Router {
        namespace: "ml".into(),
        pool: "chat".into(),
    };
    let server_dir = tmp.path().join("router");
    write_dir(
        &server_dir,
        &ca.leaf(Some(&router_id), &["localhost"]),
        &[&ca],
    );
    let picker_dir = tmp.path().join("picker");
    let picker = Identity::Picker {
        namespace: "ml".into(),
        pool: "chat".into(),
    };
    write_dir(&picker_dir, &ca.leaf(Some(&picker), &[]), &[&ca]);
    let r = start(&s.config, &s.secrets, |a| {
        a.grpc_tls_dir = Some(server_dir.clone());
        a.tls_reload_interval_ms = 50;
    })
    .await;
    wait_loaded(&r, &s.key).await;

    let config = WatchedClient::client(&picker_dir).expect("client TLS");
    let tls = ClientTls::new(config, Some("localhost"))
        .expect("server name")
        .bind("127.0.0.1".parse().expect("ip"));
    let endpoint = tonic::transport::Endpoint::from_shared(format!(
        "http://localhost:{}",
        r.addrs.grpc.port()
    ))
    .expect("endpoint")
    .connect_timeout(Duration::from_secs(5));
    let mut client = PickerClient::new(tls.channel(endpoint).await.expect("connect"));
    let pick = |headers: &[(&str, &str)]| PickRequest {
        path: "/v1/chat/completions".into(),
        headers: headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        body: chat("tiny").to_string().into_bytes(),
    };
    let code = |r: Result<tonic::Response<_>, tonic::Status>| r.err().map(|s| s.code());
    assert_eq!(
        code(client.pick(pick(&[("x-kvroute-tenant", "team-p")])).await),
        Some(tonic::Code::Unavailable),
        "the picker's tenant header is believed; no worker is routable"
    );
    assert_eq!(
        code(client.pick(pick(&[])).await),
        Some(tonic::Code::Unauthenticated)
    );
    assert_eq!(
        code(client.pick(pick(&[("x-kvroute-tenant", "Team P")])).await),
        Some(tonic::Code::Unauthenticated)
    );
    assert!(
        metric(&r, "kvroute_router_tenant_auth_total{result=\"tenant\"}").await >= 2.0,
        "wait_loaded's request and the picker's"
    );
}

/// A policy rule's per-tenant limits hold on the Pick API as in the gateway: the rule's
/// `requestsPerMinute: 2` for team-a admits two picks and refuses the third with
/// RESOURCE_EXHAUSTED (the refused pick's assignment is released), counted per limit.
#[tokio::test]
async fn pick_api_enforces_a_policy_rules_tenant_limits() {
    let s = setup(false);
    let policy = r#"
---
apiVersion: kvroute.dev/v1alpha1
kind: InferencePolicy
metadata: {name: limits, namespace: ml}
spec:
  pool: chat
  rules:
    - name: team-a-rpm
      match: {tenants: [team-a]}
      actions: {limits: {requestsPerMinute: 2}}
"#;
    let text = std::fs::read_to_string(&s.config).expect("config") + policy;
    std::fs::write(&s.config, text).expect("config");
    let r = start(&s.config, &s.secrets, |_| {}).await;
    wait_loaded(&r, &s.key).await;
    let _worker = fake_sidecar::sidecar(&r.addrs, "ml", "qwen-0", 9, "tiny").await;
    let mut client = PickerClient::connect(format!("http://{}", r.addrs.grpc))
        .await
        .expect("connect");
    let auth = format!("Bearer {}", s.key);
    let pick = || PickRequest {
        path: "/v1/chat/completions".into(),
        headers: [("authorization".to_string(), auth.clone())].into(),
        body: chat("tiny").to_string().into_bytes(),
    };
    // Routable once the stream's snapshot is in.
    let end = Instant::now() + DEADLINE;
    let first = loop {
        match client.pick(pick()).await {
            Ok(p) => break p.into_inner(),
            Err(e) if e.code() == tonic::Code::Unavailable && Instant::now() < end => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("first pick: {e}"),
        }
    };
    assert!(!first.decision_id.is_empty());
    client
        .pick(pick())
        .await
        .expect("second pick within the limit");
    let refused = client
        .pick(pick())
        .await
        .expect_err("third pick over the limit");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused}");
    assert_eq!(
        metric(
            &r,
            "kvroute_router_tenant_limited_total{limit=\"requests_per_minute\"}"
        )
        .await,
        1.0
    );
    // Two assignments outstanding, not three: the refused one was released.
    assert_eq!(
        metric(&r, "kvroute_router_in_flight{worker=\"ml/qwen-0\"}").await,
        2.0
    );
}
