//! The tokenizer download path against a local stand-in for the Hugging Face Hub (axum on
//! 127.0.0.1:0), serving testdata/tokenizers/qwen3 the way huggingface.co does:
//! `/{repo}/resolve/{revision}/{file}` with `ETag` and `X-Repo-Commit`, byte ranges
//! (`Content-Range`), a 302 to a second server (the "CDN") for `tokenizer.json` with
//! `X-Linked-Etag`, 404 for files the repository lacks and 401 for a gated repository
//! without the right token. Nothing here reaches the internet.
//!
//! Then the router side: a model whose tokenizer is not loaded gets a 503 (OpenAI-style
//! error) and makes `/readyz` fail, the loader retries failed downloads with backoff and
//! counts them, and once loaded the model routes with token ids.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use kvroute_crds::workerset::ResolvedTokenizer;
use kvroute_router::fake_hub::{COMMIT, FakeHub, FakeHubConfig};
use kvroute_router::metrics::RouterMetrics;
use kvroute_router::state::{
    BodyKind, Catalog, DiscoveredWorker, PickError, PickInput, PoolView, Prompt, RouterConfig,
    RouterState, ServedModel, SidecarIdentity,
};
use kvroute_router::tokenizer_loader::{Backoff, TokenizerLoader};
use kvroute_router::tokenizer_registry::{Lookup, TokenizerPlan};
use kvroute_router::tokenizer_source::{HubConfig, fetch};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

const QWEN3: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tokenizers/qwen3");
const REPO: &str = "Qwen/Qwen3-0.6B";
const GATED: &str = "gated/qwen3";
const TOKEN: &str = "hf_test_token";

async fn fake_hub() -> FakeHub {
    FakeHub::start(FakeHubConfig {
        files: PathBuf::from(QWEN3),
        public: Some(vec![REPO.to_string()]),
        gated: vec![(GATED.to_string(), TOKEN.to_string())],
    })
    .await
    .expect("fake hub")
}

fn hub_config(hub: &FakeHub, cache: &Path, tokens: &Path) -> HubConfig {
    HubConfig {
        endpoint: Some(hub.endpoint.clone()),
        cache_dir: Some(cache.to_path_buf()),
        offline: false,
        token_dir: tokens.to_path_buf(),
        config_map_dir: PathBuf::from("/nonexistent"),
    }
}

fn source(repo: &str, revision: &str, token: Option<(&str, &str)>) -> ResolvedTokenizer {
    ResolvedTokenizer::Hub {
        repo: repo.into(),
        revision: revision.into(),
        token: token.map(|(s, k)| (s.into(), k.into())),
    }
}

#[tokio::test]
async fn download_follows_the_redirect_caches_and_skips_missing_files() {
    let hub = fake_hub().await;
    let cache = tempfile::tempdir().expect("cache");
    let cfg = hub_config(&hub, cache.path(), Path::new("/nonexistent"));
    let (files, origin) = fetch(&cfg, &source(REPO, "main", None))
        .await
        .expect("download");
    assert_eq!(origin, format!("hub {REPO}@main"));
    assert_eq!(
        files.tokenizer_json,
        std::fs::read(Path::new(QWEN3).join("tokenizer.json")).expect("read")
    );
    assert!(files.tokenizer_config_json.is_some());
    assert!(files.chat_template_jinja.is_none(), "404: absent");
    assert!(files.special_tokens_map_json.is_none());
    kvroute_tokenization::Tokenizer::from_files(files).expect("a usable tokenizer");
    let seen: Vec<String> = hub
        .log
        .requests
        .lock()
        .iter()
        .map(|r| r.0.clone())
        .collect();
    assert!(
        seen.iter().any(|p| p.starts_with("/cdn/")),
        "tokenizer.json came through the redirect: {seen:?}"
    );
    assert!(seen.contains(&format!("/{REPO}/resolve/main/chat_template.jinja")));
    // The cache has the layout huggingface_hub uses.
    let snapshot = cache
        .path()
        .join("models--Qwen--Qwen3-0.6B/snapshots")
        .join(COMMIT);
    assert!(snapshot.join("tokenizer.json").is_file());
    assert_eq!(
        std::fs::read_to_string(cache.path().join("models--Qwen--Qwen3-0.6B/refs/main"))
            .expect("ref"),
        COMMIT
    );

    // A second load reads the cached files: no request for them reaches the Hub.
    hub.log.requests.lock().clear();
    fetch(&cfg, &source(REPO, "main", None))
        .await
        .expect("from the cache");
    let seen: Vec<String> = hub
        .log
        .requests
        .lock()
        .iter()
        .map(|r| r.0.clone())
        .collect();
    assert!(
        !seen
            .iter()
            .any(|p| p.ends_with("/tokenizer.json") || p.starts_with("/cdn/")),
        "{seen:?}"
    );

    // Offline: the cache only.
    let offline = HubConfig {
        offline: true,
        ..cfg.clone()
    };
    fetch(&offline, &source(REPO, "main", None))
        .await
        .expect("offline from the cache");
    let empty = tempfile::tempdir().expect("empty cache");
    let offline_empty = HubConfig {
        cache_dir: Some(empty.path().to_path_buf()),
        ..offline
    };
    let e = fetch(&offline_empty, &source(REPO, "main", None))
        .await
        .expect_err("nothing cached");
    assert_eq!(e.label(), "offline_miss");

    // Unknown revision and repository: not found.
    for (repo, rev) in [(REPO, "v9"), ("nobody/none", "main")] {
        let e = fetch(&cfg, &source(repo, rev, None))
            .await
            .expect_err("missing");
        assert_eq!(e.label(), "not_found", "{repo}@{rev}: {e}");
    }
}

#[tokio::test]
async fn a_gated_repository_needs_the_mounted_token() {
    let hub = fake_hub().await;
    let cache = tempfile::tempdir().expect("cache");
    let tokens = tempfile::tempdir().expect("tokens");
    let cfg = hub_config(&hub, cache.path(), tokens.path());
    let gated = source(GATED, COMMIT, Some(("hf-token", "token")));

    let e = fetch(&cfg, &gated).await.expect_err("secret not mounted");
    assert_eq!(e.label(), "token_missing");
    let e = fetch(&cfg, &source(GATED, COMMIT, None))
        .await
        .expect_err("no token");
    assert_eq!(e.label(), "unauthorized");

    std::fs::create_dir_all(tokens.path().join("hf-token")).expect("mkdir");
    std::fs::write(tokens.path().join("hf-token/token"), "wrong\n").expect("write");
    let e = fetch(&cfg, &gated).await.expect_err("wrong token");
    assert_eq!(e.label(), "unauthorized");

    // Rotated in place (as the kubelet updates a mounted Secret): the next attempt reads it.
    std::fs::write(tokens.path().join("hf-token/token"), format!("{TOKEN}\n")).expect("write");
    let (files, _) = fetch(&cfg, &gated).await.expect("with the token");
    assert!(!files.tokenizer_json.is_empty());
    let log = hub.log.requests.lock();
    let hub_requests: Vec<&(String, bool)> = log
        .iter()
        .filter(|(p, _)| p.starts_with("/gated/"))
        .collect();
    assert!(hub_requests.iter().any(|(_, auth)| *auth));
}

fn router_state() -> RouterState {
    let metrics = RouterMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let cfg = RouterConfig {
        seed: 1,
        ..RouterConfig::default()
    };
    RouterState::new(cfg, metrics).expect("state")
}

/// One routable worker `ns/w0` serving `model`, in a pool that lists the model and `alias`.
fn add_worker(state: &RouterState, model: &str) {
    state.set_catalog(Catalog {
        pools: vec![PoolView {
            name: "ns/pool".into(),
            models: vec![ServedModel {
                name: model.into(),
                backend_model: model.into(),
                split: Vec::new(),
            }],
            worker_sets: vec!["ws".into()],
            auth: None,
        }],
        workers: vec![DiscoveredWorker {
            id: "ns/w0".into(),
            address: "127.0.0.1:1".into(),
            model: model.into(),
            worker_set: "ws".into(),
            namespace: String::new(),
            pod_ip: None,
            ready: true,
            ..Default::default()
        }],
    });
    state.set_discovery_synced();
    let identity = SidecarIdentity {
        worker_id: "ns/w0".into(),
        address: "127.0.0.1:1".into(),
        model: model.into(),
        block_size: 16,
        epoch: 1,
        worker_set: "ws".into(),
    };
    let now = Instant::now();
    state
        .sidecar_snapshot_start(1, &identity, &[], now)
        .expect("snapshot");
    assert!(state.sidecar_snapshot_chunk(1, "ns/w0", &[], true, now));
}

fn chat_body() -> serde_json::Map<String, serde_json::Value> {
    serde_json::json!({
        "model": "qwen3",
        "messages": [{"role": "user", "content": "Which worker holds my prefix?"}],
    })
    .as_object()
    .cloned()
    .unwrap_or_default()
}

fn chat_input(body: &serde_json::Map<String, serde_json::Value>) -> PickInput<'_> {
    PickInput::from_body("qwen3", BodyKind::Chat, body, None, &[])
}

async fn get(app: &Router, uri: &str) -> (StatusCode, String) {
    let resp = app
        .clone()
        .oneshot(
            Request::get(uri)
                // As from `kubectl port-forward`: `/debug/*` answers loopback callers.
                .extension(axum::extract::ConnectInfo(std::net::SocketAddr::from((
                    [127, 0, 0, 1],
                    1,
                ))))
                .body(Body::empty())
                .expect("request"),
        )
        .await
        .expect("response");
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .expect("body");
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// Polls `f` until true; fails after 30 s.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts the loader on `hub` with short retry waits and `attempt` as the fetch timeout.
fn start_loader(
    state: &RouterState,
    hub: &FakeHub,
    cache: &Path,
    attempt: Duration,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let loader = TokenizerLoader::new(
        state.clone(),
        hub_config(hub, cache, Path::new("/nonexistent")),
        Backoff {
            base: Duration::from_millis(10),
            cap: Duration::from_millis(40),
            attempt,
        },
    );
    (stop.clone(), tokio::spawn(loader.run(stop)))
}

#[tokio::test]
async fn the_router_refuses_until_the_tokenizer_loads_then_routes_with_tokens() {
    let hub = fake_hub().await;
    // The first two downloads of tokenizer.json fail: the loader retries with backoff.
    hub.log.fail_tokenizer_json.store(2, Ordering::SeqCst);
    let cache = tempfile::tempdir().expect("cache");
    let state = router_state();
    state.tokenizers().set_fetch_hub(true);
    add_worker(&state, "qwen3");
    let admin = admin_router(&state);
    let gateway = kvroute_router::gateway::router_with(
        Arc::new(state.clone()),
        kvroute_router::gateway::GatewayConfig::default(),
    )
    .expect("gateway");

    // Discovery names the source, for two models (one WorkerSet and its canary, say);
    // nothing loads it yet.
    state.tokenizers().set_plan(TokenizerPlan {
        sources: BTreeMap::from([
            ("qwen3".to_string(), source(REPO, "main", None)),
            ("qwen3-canary".to_string(), source(REPO, "main", None)),
        ]),
        load_only: Default::default(),
    });
    let body = chat_body();
    let refused = state
        .pick(&chat_input(&body), Instant::now())
        .expect_err("tokenizer not loaded");
    assert_eq!(
        refused,
        PickError::TokenizerNotReady {
            model: "qwen3".into(),
            failed: false
        }
    );
    // Token ids need no tokenizer.
    let ids: Vec<u32> = (0..64).collect();
    let by_ids = PickInput {
        prompt: Prompt::Tokens(&ids),
        ..chat_input(&body)
    };
    state
        .pick(&by_ids, Instant::now())
        .expect("token ids route");

    let (status, text) = get(&admin, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{text}");
    assert!(text.contains("qwen3"), "{text}");
    let (status, _) = get(&admin, "/readyz?model=qwen3").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

    let resp = gateway
        .clone()
        .oneshot(
            Request::post("/v1/chat/completions")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(serde_json::to_vec(&body).expect("json")))
                .expect("request"),
        )
        .await
        .expect("response");
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    let err: serde_json::Value = serde_json::from_slice(
        &axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .expect("body"),
    )
    .expect("json error");
    assert_eq!(err["error"]["code"], "tokenizer_not_ready");
    assert_eq!(err["error"]["type"], "service_unavailable_error");
    let message = err["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("qwen3") && message.contains("loading"),
        "{message}"
    );
    assert!(!message.contains("127.0.0.1"), "no internals: {message}");

    // The loader fetches (two failures, then success) and the model becomes servable.
    let (stop, task) = start_loader(&state, &hub, cache.path(), Duration::from_secs(30));
    eventually("the tokenizer loads", || {
        state.pick(&chat_input(&body), Instant::now()).is_ok()
    })
    .await;
    let chosen = state
        .explain(&chat_input(&body), Instant::now())
        .expect("routes");
    assert!(!chosen.degraded, "{chosen:?}");
    assert!(chosen.prompt_tokens > 0);

    let (status, _) = get(&admin, "/readyz?model=qwen3").await;
    assert_eq!(status, StatusCode::OK);
    // Both models took the one tokenizer from one download.
    let (Lookup::Ready(a), Lookup::Ready(b)) = (
        state.tokenizers().lookup("qwen3", "qwen3"),
        state.tokenizers().lookup("qwen3-canary", "qwen3-canary"),
    ) else {
        panic!("both models load");
    };
    assert!(Arc::ptr_eq(&a, &b), "one parsed tokenizer for one source");
    let (status, text) = get(&admin, "/debug/tokenizers").await;
    assert_eq!(status, StatusCode::OK);
    let rows: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(rows[0]["model"], "qwen3");
    assert_eq!(rows[0]["state"], "loaded");
    let (_, metrics) = get(&admin, "/metrics").await;
    assert!(
        metrics.contains("kvroute_router_tokenizer_loaded{model=\"qwen3\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "kvroute_router_tokenizer_fetch_failures_total{model=\"qwen3\",reason=\"http\"} 2"
        ),
        "{metrics}"
    );
    // Each failed attempt counts for every model that waits on the source.
    assert!(
        metrics.contains(
            "kvroute_router_tokenizer_fetch_failures_total{model=\"qwen3-canary\",reason=\"http\"} 2"
        ),
        "{metrics}"
    );

    // A new revision: the old tokenizer keeps serving (stale) until the new one is loaded.
    state.tokenizers().set_plan(TokenizerPlan {
        sources: BTreeMap::from([("qwen3".to_string(), source(REPO, COMMIT, None))]),
        load_only: Default::default(),
    });
    state
        .pick(&chat_input(&body), Instant::now())
        .expect("the previous revision still serves");
    eventually("the new revision loads", || {
        state.tokenizers().report()[0].loaded_from.as_deref()
            == Some(&format!("hub {REPO}@{COMMIT}")[..])
    })
    .await;
    assert_eq!(state.tokenizers().report()[0].state, "loaded");

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("loader stops")
        .expect("join");
}

/// A download that stalls (the Hub client has no timeout of its own) counts as a failed
/// attempt after `--tokenizer-fetch-timeout-s` and is retried, instead of leaving the model
/// loading for ever.
#[tokio::test]
async fn a_stalled_download_times_out_and_is_retried() {
    let hub = fake_hub().await;
    hub.log.stall_tokenizer_json.store(1, Ordering::SeqCst);
    let cache = tempfile::tempdir().expect("cache");
    let state = router_state();
    state.tokenizers().set_fetch_hub(true);
    add_worker(&state, "qwen3");
    let admin = admin_router(&state);
    state.tokenizers().set_plan(TokenizerPlan {
        sources: BTreeMap::from([("qwen3".to_string(), source(REPO, "main", None))]),
        load_only: Default::default(),
    });
    // far above a local download, even of a debug build under load
    let (stop, task) = start_loader(&state, &hub, cache.path(), Duration::from_secs(3));
    let body = chat_body();
    eventually("the tokenizer loads after the stalled attempt", || {
        state.pick(&chat_input(&body), Instant::now()).is_ok()
    })
    .await;
    let (_, metrics) = get(&admin, "/metrics").await;
    assert!(
        metrics.contains(
            "kvroute_router_tokenizer_fetch_failures_total{model=\"qwen3\",reason=\"timeout\"} 1"
        ),
        "{metrics}"
    );
    let rows = state.tokenizers().report();
    assert_eq!((rows[0].state, rows[0].failures), ("loaded", 1));
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("loader stops")
        .expect("join");
}

/// The whole wiring in file mode, without the network: a WorkerSet whose tokenizer is a path
/// is loaded by the server's own loader task, with no `--tokenizer` flag.
#[tokio::test]
async fn a_static_config_path_source_is_loaded_by_the_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("router.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kvroute.dev/v1alpha1\nkind: InferenceWorkerSet\nmetadata: {{name: ws}}\nspec:\n  model: {{name: Qwen/Qwen3-0.6B, servedName: qwen3, tokenizer: {{path: {QWEN3}}}}}\n  engine: {{mode: mock}}\nstatus:\n  workers:\n    - {{pod: w0, address: \"127.0.0.1:1\", ready: true}}\n"
        ),
    )
    .expect("write config");
    let args = kvroute_router::Args {
        http_addr: "127.0.0.1:0".parse().expect("addr"),
        grpc_addr: "127.0.0.1:0".parse().expect("addr"),
        admin_addr: "127.0.0.1:0".parse().expect("addr"),
        config: Some(config),
        seed: Some(1),
        ..kvroute_router::Args::default()
    };
    let server = kvroute_router::Server::bind(args).await.expect("bind");
    let state = server.state().clone();
    let stop = CancellationToken::new();
    let task = tokio::spawn(server.serve(stop.clone()));
    eventually("the path tokenizer loads", || {
        state
            .tokenizers()
            .report()
            .iter()
            .any(|r| r.model == "qwen3" && r.state == "loaded")
    })
    .await;
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("server stops")
        .expect("join")
        .expect("clean exit");
}

#[tokio::test]
async fn a_load_only_pool_routes_without_the_tokenizer() {
    let state = router_state();
    state.tokenizers().set_fetch_hub(true);
    add_worker(&state, "qwen3");
    state.tokenizers().set_plan(TokenizerPlan {
        sources: BTreeMap::from([("qwen3".to_string(), source(REPO, "main", None))]),
        load_only: ["qwen3".to_string()].into_iter().collect(),
    });
    let body = chat_body();
    let d = state
        .explain(&chat_input(&body), Instant::now())
        .expect("load-only routing");
    assert!(d.degraded);
    assert_eq!(d.degraded_reason.as_deref(), Some("no_tokenizer"));
    let admin = admin_router(&state);
    let (status, _) = get(&admin, "/readyz").await;
    assert_eq!(status, StatusCode::OK);
}

/// The admin routes as the router builds them (loopback-only `/debug/*`, default pool).
fn admin_router(state: &kvroute_router::state::RouterState) -> axum::Router {
    kvroute_router::admin::router(
        state.clone(),
        kvroute_router::admin_token::AdminAuth::unregistered(None).expect("auth"),
        kvroute_router::blocking_pool::BlockingPool::unregistered(
            kvroute_router::blocking_pool::PoolConfig::new(1, 16),
        )
        .expect("pool"),
    )
}
