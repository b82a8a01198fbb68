//! InferencePolicies loaded from the router's static file, over real sockets (127.0.0.1:0):
//! a tonic client plays the sidecars (so the listed workers are routable) and the Pick API
//! caller, reqwest the gateway's clients and the admin API. Each rule kind is observed
//! through the front door it matters for: reject (gateway, both API shapes, and explain),
//! restriction to local targets (Pick API, explain), a weighted alias split (Pick API,
//! counted within a binomial bound), SLO shedding (gateway 429 + Retry-After, counted), and
//! an invalid file that leaves the last good set in force. Every wait has a generous
//! deadline; nothing asserts how fast anything was.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kvroute_proto::v1::picker_client::PickerClient;
use kvroute_proto::v1::{
    Delta, DeltaOp, IngestControl, PickRequest, PickResponse, WorkerReport, delta_op, worker_report,
};
use kvroute_router::{Addrs, Args, Server};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;

#[path = "support/sidecar.rs"]
mod fake_sidecar;
use fake_sidecar::sidecar;

const DEADLINE: Duration = Duration::from_secs(30);

/// Three WorkerSets in one pool: `fast` and `other` serve `tiny`, `canary` serves `tiny-v2`;
/// the alias `chat` sends 20% of its requests to `tiny-v2`.
const WORKERS: &str = r#"
apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: fast}
spec:
  model: {name: tiny}
  replicas: 1
  engine: {mode: mock, port: 8000}
status:
  replicas: 1
  readyReplicas: 1
  workers:
    - {pod: w-fast, address: "127.0.0.1:21", ready: true}
---
apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: other}
spec:
  model: {name: tiny}
  replicas: 1
  engine: {mode: mock, port: 8000}
status:
  replicas: 1
  readyReplicas: 1
  workers:
    - {pod: w-other, address: "127.0.0.1:22", ready: true}
---
apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: canary}
spec:
  model: {name: tiny-v2}
  replicas: 1
  engine: {mode: mock, port: 8000}
status:
  replicas: 1
  readyReplicas: 1
  workers:
    - {pod: w-canary, address: "127.0.0.1:23", ready: true}
---
apiVersion: kvroute.dev/v1alpha1
kind: InferencePool
metadata: {name: chat}
spec:
  targets: [{workerSet: fast}, {workerSet: other}, {workerSet: canary}]
  routing: {allowLoadOnly: true}
  modelAliases:
    - {name: chat, model: tiny, split: [{model: tiny-v2, percent: 20}]}
"#;

/// The policy under test; `MESSAGE` is replaced to observe reloads.
const POLICY: &str = r#"
---
apiVersion: kvroute.dev/v1alpha1
kind: InferencePolicy
metadata: {name: rules}
spec:
  pool: chat
  rules:
    - name: blocked-team
      match: {headers: [{name: x-team, value: blocked}]}
      actions: {reject: {status: 451, message: MESSAGE}}
    - name: keep-local
      match: {headers: [{name: x-keep, value: local}]}
      actions: {route: {allowedTargets: [fast], localOnly: true}}
    - name: batch-sheddable
      match: {serviceClasses: [batch]}
      actions: {serviceClass: {sheddable: true, ttftTargetMs: 60000}}
"#;

/// A policy that does not compile: reject combined with route.
const BAD_POLICY: &str = r#"
---
apiVersion: kvroute.dev/v1alpha1
kind: InferencePolicy
metadata: {name: broken}
spec:
  rules:
    - name: both
      actions: {reject: {status: 403}, route: {localOnly: true}}
"#;

fn config(message: &str, extra: &str) -> String {
    format!(
        "{WORKERS}{}{extra}",
        POLICY.replace("MESSAGE", &format!("{message:?}"))
    )
}

/// A router on loopback with the static file, and the fake sidecars that keep its workers
/// routable; stopped when dropped.
struct Router {
    addrs: Addrs,
    stop: CancellationToken,
    _sidecars: Vec<(mpsc::Sender<WorkerReport>, Streaming<IngestControl>)>,
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Drop for Router {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn start(config_text: &str) -> Router {
    let r = launch(
        config_text,
        &[
            ("w-fast", 21, "tiny"),
            ("w-other", 22, "tiny"),
            ("w-canary", 23, "tiny-v2"),
        ],
    )
    .await;
    // Routable once every snapshot is in: the Pick API answers for both models.
    let end = Instant::now() + DEADLINE;
    loop {
        let fast = pick(&r, "tiny", &[]).await;
        let canary = pick(&r, "tiny-v2", &[]).await;
        if fast.is_ok() && canary.is_ok() {
            break;
        }
        assert!(
            Instant::now() < end,
            "workers never routable: {fast:?} {canary:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    r
}

/// A router on loopback with the static file and fake sidecars for `workers` (pod, port,
/// model), not waited for.
async fn launch(config_text: &str, workers: &[(&str, u16, &str)]) -> Router {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("router.yaml");
    std::fs::write(&path, config_text).expect("write config");
    let args = Args {
        http_addr: "127.0.0.1:0".parse().expect("addr"),
        grpc_addr: "127.0.0.1:0".parse().expect("addr"),
        admin_addr: "127.0.0.1:0".parse().expect("addr"),
        config: Some(path.clone()),
        seed: Some(7),
        max_retries: 0,
        ..Args::default()
    };
    let server = Server::bind(args).await.expect("bind router");
    let addrs = server.addrs().expect("addrs");
    let stop = CancellationToken::new();
    tokio::spawn(server.serve(stop.clone()));
    let mut sidecars = Vec::new();
    for &(pod, port, model) in workers {
        sidecars.push(sidecar(&addrs, "default", pod, port, model).await);
    }
    Router {
        addrs,
        stop,
        _sidecars: sidecars,
        _dir: dir,
        path,
    }
}

fn completion(model: &str) -> Vec<u8> {
    let prompt: Vec<u32> = (0..64).collect();
    serde_json::to_vec(&json!({"model": model, "prompt": prompt, "max_tokens": 4})).expect("json")
}

async fn pick(
    r: &Router,
    model: &str,
    headers: &[(&str, &str)],
) -> Result<PickResponse, tonic::Status> {
    let mut client = PickerClient::connect(format!("http://{}", r.addrs.grpc))
        .await
        .expect("picker");
    let headers: HashMap<String, String> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    client
        .pick(PickRequest {
            path: "/v1/completions".into(),
            headers,
            body: completion(model),
        })
        .await
        .map(tonic::Response::into_inner)
}

/// POSTs `body` to the gateway's `path` with `headers`: (status, Retry-After, JSON body).
async fn gateway(
    r: &Router,
    path: &str,
    body: Value,
    headers: &[(&str, &str)],
) -> (u16, Option<String>, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("http://{}{path}", r.addrs.http))
        .json(&body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("gateway answers");
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = resp.json().await.unwrap_or(Value::Null);
    (status, retry, body)
}

async fn explain(r: &Router, model: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("http://{}/debug/explain", r.addrs.admin))
        .body(completion(model));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("explain answers");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("explain json"))
}

async fn admin_json(r: &Router, path: &str) -> Value {
    reqwest::get(format!("http://{}{path}", r.addrs.admin))
        .await
        .expect("admin")
        .json()
        .await
        .expect("json")
}

/// The value of one series in `/metrics`, 0 when absent.
async fn metric(r: &Router, series: &str) -> f64 {
    let text = reqwest::get(format!("http://{}/metrics", r.addrs.admin))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// Rewrites the file so that its modification time surely changes.
fn rewrite(path: &Path, text: &str) {
    let before = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    loop {
        std::fs::write(path, text).expect("rewrite config");
        let after = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        if after != before {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn a_reject_rule_refuses_in_each_api_shape_and_explain_names_it() {
    let r = start(&config("blocked by policy", "")).await;
    let blocked = [("x-team", "blocked")];
    let chat = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, body) = gateway(&r, "/v1/chat/completions", chat, &blocked).await;
    assert_eq!(status, 451, "{body}");
    assert_eq!(body["error"]["message"], "blocked by policy");
    assert_eq!(body["error"]["code"], "policy_rejected");
    let messages =
        json!({"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, body) = gateway(&r, "/v1/messages", messages, &blocked).await;
    assert_eq!(status, 451, "{body}");
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["message"], "blocked by policy");

    let e = pick(&r, "tiny", &blocked).await.expect_err("rejected");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert_eq!(e.message(), "blocked by policy");

    let (status, body) = explain(&r, "tiny", &blocked).await;
    assert_eq!(status, 451, "{body}");
    assert_eq!(body["verdict"]["policy"], "default/rules");
    assert_eq!(body["verdict"]["rule"], "blocked-team");
    // Another team passes: explain shows the default verdict.
    let (status, body) = explain(&r, "tiny", &[("x-team", "red")]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["verdict"]["rule"], Value::Null);
    assert!(
        metric(
            &r,
            "kvroute_router_policy_rejected_total{rule=\"blocked-team\"}"
        )
        .await
            >= 3.0
    );
}

#[tokio::test]
async fn a_route_rule_restricts_to_local_targets() {
    let r = start(&config("no", "")).await;
    let local = [("x-keep", "local")];
    for _ in 0..12 {
        let p = pick(&r, "tiny", &local).await.expect("pick");
        assert_eq!(p.worker_id, "default/w-fast");
    }
    // Without the header the rule does not apply: both WorkerSets are candidates.
    let (status, body) = explain(&r, "tiny", &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["verdict"]["rule"], Value::Null);
    let mut names: Vec<&str> = body["candidates"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c["worker"].as_str()).collect())
        .unwrap_or_default();
    names.sort_unstable();
    assert_eq!(names, ["default/w-fast", "default/w-other"], "{body}");
    let (status, body) = explain(&r, "tiny", &local).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["verdict"]["rule"], "keep-local");
    assert_eq!(body["verdict"]["targets"], json!(["fast"]));
    assert_eq!(body["verdict"]["actions"], json!(["route", "local_only"]));
    assert_eq!(body["chosen"], "default/w-fast");
    assert_eq!(body["candidates"].as_array().map(Vec::len), Some(1));
}

/// A second policy: requests marked small move from `tiny` to `tiny-v2` (the smaller model
/// of the story), unless a `tiny` worker caches their prefix and answers first;
/// `x-size: always` moves them anyway.
const SWITCH: &str = r#"
---
apiVersion: kvroute.dev/v1alpha1
kind: InferencePolicy
metadata: {name: sizes}
spec:
  pool: chat
  rules:
    - name: small-to-v2
      match: {headers: [{name: x-size, value: small}]}
      actions: {route: {model: tiny-v2}}
    - name: always-v2
      match: {headers: [{name: x-size, value: always}]}
      actions: {route: {model: tiny-v2, keepWhenCached: false}}
"#;

/// Picks a completion of `prompt` for `model`.
async fn pick_prompt(
    r: &Router,
    model: &str,
    prompt: &[u32],
    headers: &[(&str, &str)],
) -> PickResponse {
    let mut client = PickerClient::connect(format!("http://{}", r.addrs.grpc))
        .await
        .expect("picker");
    let body = json!({"model": model, "prompt": prompt, "max_tokens": 4});
    client
        .pick(PickRequest {
            path: "/v1/completions".into(),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: serde_json::to_vec(&body).expect("json"),
        })
        .await
        .expect("pick")
        .into_inner()
}

#[tokio::test]
async fn a_route_model_moves_small_requests_unless_the_requested_model_caches_them() {
    let r = start(&config("no", SWITCH)).await;
    let small = [("x-size", "small")];
    // Nothing cached anywhere: the request moves (though an idle `tiny` worker would be as
    // fast), and the body the caller forwards names the model.
    let fresh: Vec<u32> = (1_000..1_064).collect();
    let p = pick_prompt(&r, "tiny", &fresh, &small).await;
    assert_eq!(p.worker_id, "default/w-canary");
    let body: Value =
        serde_json::from_slice(p.rewritten_body.as_deref().expect("body rewritten")).expect("json");
    assert_eq!(body["model"], "tiny-v2");
    // Without the mark the request stays on its model.
    let p = pick_prompt(&r, "tiny", &fresh, &[]).await;
    assert_ne!(p.worker_id, "default/w-canary");

    // `w-fast` (a `tiny` worker) caches the whole of another prompt: `tiny` is predicted
    // to answer first, so the small request stays there.
    let cached: Vec<u32> = (5_000..5_064).collect();
    let chain = kvroute_hash::chain(kvroute_hash::root_hash("tiny", None), &cached, 16, &[]);
    let stored = WorkerReport {
        seq: 1,
        body: Some(worker_report::Body::Delta(Delta {
            ops: vec![DeltaOp {
                kind: delta_op::Kind::Stored as i32,
                blocks: chain,
            }],
        })),
    };
    r._sidecars[0].0.send(stored).await.expect("send delta");
    let end = Instant::now() + DEADLINE;
    let explained = loop {
        let body = json!({"model": "tiny", "prompt": cached, "max_tokens": 4});
        let resp = reqwest::Client::new()
            .post(format!("http://{}/debug/explain", r.addrs.admin))
            .header("x-size", "small")
            .json(&body)
            .send()
            .await
            .expect("explain answers");
        let v: Value = resp.json().await.expect("explain json");
        if v["verdict"]["model_switch"]["outcome"] == "kept-cached" {
            break v;
        }
        assert!(Instant::now() < end, "the cached prefix never kept it: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The model stays; the worker is the routing policy's choice among `tiny`'s.
    assert_ne!(explained["chosen"], "default/w-canary", "{explained}");
    assert_eq!(explained["backend_model"], "tiny");
    let sw = &explained["verdict"]["model_switch"];
    assert_eq!(
        (&sw["requested"], &sw["alternative"]),
        (&json!("tiny"), &json!("tiny-v2"))
    );
    let (kept, alt) = (
        sw["requested_best_ttft_s"]
            .as_f64()
            .expect("requested ttft"),
        sw["alternative_best_ttft_s"]
            .as_f64()
            .expect("alternative ttft"),
    );
    assert!(kept < alt, "{sw}");
    let p = pick_prompt(&r, "tiny", &cached, &small).await;
    assert_ne!(p.worker_id, "default/w-canary");
    assert_eq!(p.rewritten_body, None);
    // `keepWhenCached: false` moves it even so.
    let p = pick_prompt(&r, "tiny", &cached, &[("x-size", "always")]).await;
    assert_eq!(p.worker_id, "default/w-canary");

    let text = reqwest::get(format!("http://{}/metrics", r.addrs.admin))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("metrics text");
    let count = |rule: &str, outcome: &str| {
        text.lines()
            .filter(|l| l.starts_with("kvroute_router_policy_model_switches_total{"))
            .filter(|l| l.contains(&format!("rule=\"{rule}\"")))
            .filter(|l| l.contains(&format!("outcome=\"{outcome}\"")))
            .find_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
            .unwrap_or(0.0)
    };
    assert_eq!(count("small-to-v2", "switched"), 1.0, "{text}");
    assert_eq!(count("small-to-v2", "kept-cached"), 1.0);
    assert_eq!(count("always-v2", "switched"), 1.0);
}

#[tokio::test]
async fn a_route_model_serves_a_model_without_ready_workers_from_the_alternative() {
    // Only the alternative model has a worker: `tiny` requests marked small still get one.
    let text = config("no", SWITCH)
        .replace(
            "\"127.0.0.1:21\", ready: true",
            "\"127.0.0.1:21\", ready: false",
        )
        .replace(
            "\"127.0.0.1:22\", ready: true",
            "\"127.0.0.1:22\", ready: false",
        );
    let r = launch(&text, &[("w-canary", 23, "tiny-v2")]).await;
    let prompt: Vec<u32> = (0..64).collect();
    let end = Instant::now() + DEADLINE;
    while pick(&r, "tiny-v2", &[]).await.is_err() {
        assert!(Instant::now() < end, "canary never routable");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let p = pick_prompt(&r, "tiny", &prompt, &[("x-size", "small")]).await;
    assert_eq!(p.worker_id, "default/w-canary");
    let e = pick(&r, "tiny", &[]).await.expect_err("no tiny worker");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
}

#[tokio::test]
async fn a_split_alias_divides_requests_by_weight_deterministically() {
    let r = start(&config("no", "")).await;
    const N: usize = 400;
    let mut canary = 0;
    for i in 0..N {
        let id = format!("req-{i}");
        let p = pick(&r, "chat", &[("x-request-id", &id)])
            .await
            .expect("pick");
        match p.worker_id.as_str() {
            "default/w-canary" => canary += 1,
            "default/w-fast" | "default/w-other" => {}
            other => panic!("unexpected worker {other}"),
        }
    }
    // Binomial(400, 0.2): mean 80, sd 8; 5 sd either side.
    assert!(
        (40..=120).contains(&canary),
        "{canary} of {N} went to the canary"
    );
    // The same request id resolves the same way every time.
    let first = pick(&r, "chat", &[("x-request-id", "sticky")])
        .await
        .expect("pick");
    for _ in 0..5 {
        let again = pick(&r, "chat", &[("x-request-id", "sticky")])
            .await
            .expect("pick");
        assert_eq!(
            again.worker_id == "default/w-canary",
            first.worker_id == "default/w-canary"
        );
    }
    let (status, body) = explain(&r, "chat", &[("x-request-id", "req-1")]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["alias"]["alias"], "chat");
    assert!(
        ["tiny", "tiny-v2"].contains(&body["alias"]["model"].as_str().unwrap_or_default()),
        "{body}"
    );
    assert_eq!(body["backend_model"], body["alias"]["model"]);
}

#[tokio::test]
async fn a_sheddable_request_that_every_worker_would_serve_late_gets_429() {
    let r = start(&config("no", "")).await;
    // A 1 ms target: every candidate's predicted TTFT (at least the predictor's overhead)
    // misses it.
    let late = [
        ("x-kvroute-service-class", "batch"),
        ("x-kvroute-ttft-target-ms", "1"),
    ];
    let prompt: Vec<u32> = (0..64).collect();
    let body = json!({"model": "tiny", "prompt": prompt, "max_tokens": 4});
    let (status, retry, answer) = gateway(&r, "/v1/completions", body, &late).await;
    assert_eq!(status, 429, "{answer}");
    assert_eq!(answer["error"]["code"], "slo_shed");
    let retry: u64 = retry.expect("Retry-After").parse().expect("seconds");
    assert!(retry >= 1);
    assert_eq!(
        metric(
            &r,
            "kvroute_router_slo_shed_total{rule=\"batch-sheddable\"}"
        )
        .await,
        1.0
    );
    let e = pick(&r, "tiny", &late).await.expect_err("shed");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    // The rule's own 60 s target is met: not shed. Another class is not sheddable.
    pick(&r, "tiny", &[("x-kvroute-service-class", "batch")])
        .await
        .expect("within the target");
    pick(
        &r,
        "tiny",
        &[
            ("x-kvroute-service-class", "interactive"),
            ("x-kvroute-ttft-target-ms", "1"),
        ],
    )
    .await
    .expect("not sheddable");
    let (status, body) = explain(&r, "tiny", &[("x-kvroute-service-class", "batch")]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["verdict"]["service_class"], "batch");
    assert_eq!(body["verdict"]["ttft_target_ms"], 60000);
    assert_eq!(body["verdict"]["sheddable"], true);
}

#[tokio::test]
async fn policies_hot_reload_and_an_invalid_file_keeps_the_last_good_set() {
    let r = start(&config("first message", "")).await;
    let blocked = [("x-team", "blocked")];
    let report = admin_json(&r, "/debug/policies").await;
    assert_eq!(report["policies"], json!(["default/rules"]), "{report}");
    assert_eq!(report["rules"], 3);

    // A good edit takes effect.
    rewrite(&r.path, &config("second message", ""));
    let end = Instant::now() + DEADLINE;
    loop {
        let e = pick(&r, "tiny", &blocked).await.expect_err("rejected");
        if e.message() == "second message" {
            break;
        }
        assert!(Instant::now() < end, "reload never applied: {e:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // An edit that adds a policy that does not compile is refused as a whole.
    rewrite(&r.path, &config("third message", BAD_POLICY));
    let end = Instant::now() + DEADLINE;
    let report = loop {
        let report = admin_json(&r, "/debug/policies").await;
        if report["refused"].as_u64() >= Some(1) {
            break report;
        }
        assert!(Instant::now() < end, "refusal never seen: {report}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let issues = report["last_refused"].to_string();
    assert!(issues.contains("policy default/broken"), "{issues}");
    assert!(issues.contains("reject cannot be combined"), "{issues}");
    assert_eq!(report["policies"], json!(["default/rules"]));
    let e = pick(&r, "tiny", &blocked)
        .await
        .expect_err("still rejected");
    assert_eq!(e.message(), "second message", "the last good set stays");
    assert_eq!(
        metric(
            &r,
            "kvroute_router_policy_reloads_total{result=\"refused\"}"
        )
        .await,
        1.0
    );
}

#[tokio::test]
async fn tenant_metrics_take_the_declared_class_and_fold_any_other_into_default() {
    let classes = r#"
---
apiVersion: kvroute.dev/v1alpha1
kind: InferencePolicy
metadata: {name: classes}
spec:
  pool: chat
  rules:
    - name: premium-team
      match: {headers: [{name: x-team, value: premium}]}
      actions: {serviceClass: {name: premium}}
"#;
    let r = start(&config("no", classes)).await;
    let series = |class: &str| {
        format!(
            "kvroute_router_tenant_requests_total{{class=\"{class}\",model=\"tiny\",tenant=\"anonymous\"}}"
        )
    };
    // The start-up's own picks (until the workers are routable) count as `default`.
    let before = metric(&r, &series("default")).await;
    // Declared by a match (batch) and by an action (premium); interactive and the rest are
    // client strings no policy declares.
    pick(&r, "tiny", &[("x-kvroute-service-class", "batch")])
        .await
        .expect("batch");
    pick(&r, "tiny", &[("x-team", "premium")])
        .await
        .expect("premium");
    for class in ["interactive", "attacker-chosen-1", "attacker-chosen-2"] {
        pick(&r, "tiny", &[("x-kvroute-service-class", class)])
            .await
            .expect("undeclared class");
    }
    pick(&r, "tiny", &[]).await.expect("no class");
    assert_eq!(metric(&r, &series("batch")).await, 1.0);
    assert_eq!(metric(&r, &series("premium")).await, 1.0);
    assert_eq!(metric(&r, &series("default")).await, before + 4.0);
    let text = reqwest::get(format!("http://{}/metrics", r.addrs.admin))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    for client_string in ["interactive", "attacker-chosen"] {
        assert!(
            !text.contains(&format!("class=\"{client_string}")),
            "a client's class became a label"
        );
    }
    // A request that ends before a decision counts as `default`, whatever its class.
    pick(
        &r,
        "tiny",
        &[("x-team", "blocked"), ("x-kvroute-service-class", "batch")],
    )
    .await
    .expect_err("rejected");
    assert_eq!(metric(&r, &series("default")).await, before + 5.0);
    assert_eq!(metric(&r, &series("batch")).await, 1.0);
}
