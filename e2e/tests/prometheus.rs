//! The shipped Grafana dashboards against a real Prometheus (Debian's `prometheus` package,
//! installed by `bash e2e/k8s/setup.sh`): a local deployment on loopback (router, two mock
//! vLLM workers, a sidecar each with one simulated GPU) serves two waves of traffic while
//! Prometheus scrapes the router, the sidecars and the workers every second; then every
//! panel's PromQL, read from `deploy/grafana/*.json` with Grafana's variables substituted, is
//! evaluated through Prometheus's HTTP API and must return at least one finite sample. The
//! alerts of `deploy/monitoring/alerts.yaml` are checked with `promtool` and loaded into the
//! same Prometheus, where each must evaluate without error.
//!
//! ```text
//! traffic --> router --> mock workers            prometheus --scrape 1s--> router /metrics
//!                ^-- sidecars (KV events, load)              sidecars /metrics, workers /metrics
//! deploy/grafana/*.json --exprs--> /api/v1/query --> non-empty, finite
//! ```
//!
//! No figure is asserted: only that each query returns data. Deadlines are generous.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kvroute_e2e::local::{DeployConfig, Deployment};
use kvroute_e2e::procs::{self, Child, SpawnOptions};
use serde_json::{Value, json};

/// What to run when Prometheus is missing.
const SETUP: &str =
    "bash e2e/k8s/setup.sh (it runs `apt-get install -y --no-install-recommends prometheus`)";
/// Grafana's `$__rate_interval` for a 1 s scrape: wide enough to span both waves.
const RATE_INTERVAL: &str = "1m";
/// The served model name.
const MODEL: &str = "dash";
/// A model whose only worker is not ready: its requests are refused by the router
/// (`kvroute_router_pick_errors_total{error="no_ready_worker"}`).
const IDLE_MODEL: &str = "dash-idle";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `$<env>` or `name` on the PATH; a clear failure naming the set-up command otherwise
/// (never a silent skip).
fn find_tool(env: &str, name: &str) -> PathBuf {
    let found = match std::env::var_os(env) {
        Some(p) => Some(PathBuf::from(p)).filter(|p| p.is_file()),
        None => {
            let path = std::env::var_os("PATH").unwrap_or_default();
            std::env::split_paths(&path)
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
        }
    };
    found.unwrap_or_else(|| {
        panic!(
            "`{name}` not found (${env} or PATH): this test runs a real Prometheus. Install it with: {SETUP}"
        )
    })
}

/// The only tenant whose name the metrics carry (`--tenant-metrics-allow`).
const TENANT: &str = "team-a";

/// More router configuration: a pool over the served WorkerSet that believes
/// `x-kvroute-tenant` from loopback and serves anonymous requests too, and a WorkerSet whose
/// only worker is not ready.
fn extra_config() -> String {
    format!(
        "apiVersion: kvroute.dev/v1alpha1
kind: InferencePool
metadata: {{name: dash, namespace: dash}}
spec:
  targets: [{{workerSet: dash}}]
  auth: {{trustedPeers: [127.0.0.1/32], allowAnonymous: true}}
---
apiVersion: kvroute.dev/v1alpha1
kind: InferencePolicy
metadata: {{name: classes, namespace: dash}}
spec:
  pool: dash
  rules:
    - name: batch
      match: {{serviceClasses: [batch]}}
      actions: {{serviceClass: {{ttftTargetMs: 60000}}}}
---
apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {{name: idle, namespace: idle}}
spec:
  model: {{name: idle/model, servedName: {IDLE_MODEL}}}
  replicas: 1
  engine: {{mode: mock}}
status:
  replicas: 1
  readyReplicas: 0
  workers:
    - {{pod: idle-0, address: \"127.0.0.1:9\", ready: false}}
"
    )
}

fn host_port(url: &str) -> String {
    url.trim_start_matches("http://").to_string()
}

fn prometheus_config(d: &Deployment, rules: &Path) -> String {
    let list = |urls: &[String]| {
        urls.iter()
            .map(|u| format!("\"{}\"", host_port(u)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "global: {{scrape_interval: 1s, scrape_timeout: 900ms, evaluation_interval: 1s}}
rule_files: [\"{rules}\"]
scrape_configs:
  - job_name: kvroute-router
    static_configs: [{{targets: [\"{router}\"]}}]
  - job_name: kvroute-sidecar
    static_configs: [{{targets: [{sidecars}]}}]
  - job_name: vllm
    static_configs: [{{targets: [{workers}]}}]
",
        rules = rules.display(),
        router = host_port(&d.router_admin),
        sidecars = list(&d.sidecar_admin_urls),
        workers = list(&d.worker_urls),
    )
}

/// The `groups` of the shipped PrometheusRule, as a Prometheus rule file (JSON is YAML).
fn rule_file(dir: &Path) -> anyhow::Result<PathBuf> {
    let text = std::fs::read_to_string(root().join("deploy/monitoring/alerts.yaml"))?;
    let rule: Value = serde_saphyr::from_str(&text).context("alerts.yaml")?;
    let groups = rule["spec"]["groups"].clone();
    anyhow::ensure!(groups.is_array(), "alerts.yaml has no spec.groups");
    let path = dir.join("kvroute.rules.yml");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&json!({"groups": groups}))?,
    )?;
    Ok(path)
}

/// (dashboard uid, panel title or variable name, PromQL).
type Query = (String, String, String);

/// Every (dashboard, panel, expr) with Grafana's variables substituted as Grafana does for
/// "All" (`.*`) and `$__rate_interval`; and the template variables' `label_values` queries.
fn shipped_queries() -> (Vec<Query>, Vec<Query>) {
    let mut panels = Vec::new();
    let mut variables = Vec::new();
    let dir = root().join("deploy/grafana");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("deploy/grafana")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "dashboards in {}", dir.display());
    for file in files {
        let d: Value =
            serde_json::from_str(&std::fs::read_to_string(&file).expect("read")).expect("json");
        let name = d["uid"].as_str().unwrap_or_default().to_string();
        let mut subst: Vec<(String, String)> =
            vec![("$__rate_interval".to_string(), RATE_INTERVAL.to_string())];
        for v in d["templating"]["list"].as_array().into_iter().flatten() {
            let var = v["name"].as_str().unwrap_or_default();
            if v["type"] == "query" {
                subst.push((
                    format!("${var}"),
                    v["allValue"].as_str().unwrap_or(".*").to_string(),
                ));
                let q = v["definition"].as_str().unwrap_or_default().to_string();
                variables.push((name.clone(), var.to_string(), q));
            }
        }
        // Longest first: `$model` must not eat the front of a longer name.
        subst.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
        for p in d["panels"].as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                let mut expr = t["expr"].as_str().unwrap_or_default().to_string();
                for (k, v) in &subst {
                    expr = expr.replace(k, v);
                }
                assert!(!expr.contains('$'), "unsubstituted variable in {expr}");
                let title = p["title"].as_str().unwrap_or_default().to_string();
                panels.push((name.clone(), title, expr));
            }
        }
    }
    (panels, variables)
}

struct Prom {
    url: String,
    client: reqwest::Client,
}

impl Prom {
    async fn api(&self, path: &str, query: &[(&str, &str)]) -> anyhow::Result<Value> {
        let url = reqwest::Url::parse_with_params(&format!("{}{path}", self.url), query)?;
        let v: Value = self.client.get(url).send().await?.json().await?;
        if v["status"] != "success" {
            bail!("{path} {query:?}: {v}");
        }
        Ok(v["data"].clone())
    }

    async fn query(&self, expr: &str) -> anyhow::Result<Vec<Value>> {
        let data = self.api("/api/v1/query", &[("query", expr)]).await?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// The value of a one-number query (0 when it has no result yet).
    async fn scalar(&self, expr: &str) -> anyhow::Result<f64> {
        Ok(self
            .query(expr)
            .await?
            .first()
            .and_then(|s| s["value"][1].as_str())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0))
    }
}

fn finite_values(result: &[Value]) -> Vec<f64> {
    result
        .iter()
        .filter_map(|s| s["value"][1].as_str())
        .filter_map(|v| v.parse::<f64>().ok())
        .filter(|v| v.is_finite())
        .collect()
}

/// One wave: streaming and plain chat requests sharing a prefix (TTFT, ITL, e2e, cached
/// tokens), a prompt of invalid token ids (a degraded decision), a request for the idle
/// model (a pick error). Returns the routing decisions it made.
async fn wave(gateway: &str, wave: usize) -> anyhow::Result<u64> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    let prefix = "You are a careful assistant for the kvroute dashboards test. ".repeat(12);
    let mut decisions = 0;
    // Tenants: the allow-listed one, one outside the list (`other`), none (`anonymous`).
    let tenants = [Some(TENANT), Some("team-b"), None];
    for i in 0..6 {
        let stream = i % 2 == 0;
        let body = json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": format!("{prefix} Question {wave}-{i}: say something.")}],
            "max_tokens": 12,
            "stream": stream,
            "stream_options": {"include_usage": true},
        });
        let mut req = client
            .post(format!("{gateway}/v1/chat/completions"))
            .json(&body);
        if let Some(t) = tenants[i % tenants.len()] {
            req = req.header("x-kvroute-tenant", t);
        }
        // Classes: one a policy declares (`batch`), one it does not (folds into `default`).
        match i % 3 {
            1 => req = req.header("x-kvroute-service-class", "batch"),
            2 => req = req.header("x-kvroute-service-class", "not-declared"),
            _ => {}
        }
        let resp = req.send().await?;
        let status = resp.status();
        let text = resp.text().await?;
        anyhow::ensure!(status.is_success(), "chat {status}: {text}");
        decisions += 1;
    }
    let resp = client
        .post(format!("{gateway}/v1/completions"))
        .json(&json!({"model": MODEL, "prompt": [-1, 5], "max_tokens": 2}))
        .send()
        .await?;
    // The worker may refuse the ids; the decision was made (degraded) either way.
    let _ = resp.text().await;
    decisions += 1;
    let resp = client
        .post(format!("{gateway}/v1/chat/completions"))
        .json(&json!({"model": IDLE_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
        .send()
        .await?;
    anyhow::ensure!(
        resp.status().is_server_error(),
        "idle model answered {}",
        resp.status()
    );
    Ok(decisions)
}

async fn wait_scraped(prom: &Prom, expr: &str, at_least: f64) -> anyhow::Result<()> {
    procs::wait_for(
        &format!("Prometheus to see {expr} >= {at_least}"),
        Duration::from_secs(60),
        || async move { Ok((prom.scalar(expr).await? >= at_least).then_some(())) },
    )
    .await
}

fn logs(dir: &Path) -> String {
    let mut out = String::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "log") {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                out.push_str(&format!("== {}\n", p.display()));
                for l in tail.into_iter().rev() {
                    out.push_str(l);
                    out.push('\n');
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_panel_returns_data_from_a_real_prometheus() {
    let prometheus = find_tool("KVROUTE_PROMETHEUS", "prometheus");
    let promtool = find_tool("KVROUTE_PROMTOOL", "promtool");
    let dir = tempfile::tempdir().expect("tempdir");
    let result = run(dir.path(), &prometheus, &promtool).await;
    if let Err(e) = result {
        panic!("{e:#}\n{}", logs(dir.path()));
    }
}

async fn run(dir: &Path, prometheus: &Path, promtool: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let version = std::process::Command::new(prometheus)
        .arg("--version")
        .output()
        .context("prometheus --version")?;
    let version = String::from_utf8_lossy(&version.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&version.stderr).lines())
        .next()
        .unwrap_or_default()
        .to_string();
    println!("{version}");

    let rules = rule_file(dir)?;
    let check = std::process::Command::new(promtool)
        .arg("check")
        .arg("rules")
        .arg(&rules)
        .output()
        .context("promtool check rules")?;
    anyhow::ensure!(
        check.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );

    let tokenizer = root().join("testdata/tokenizers/qwen3");
    let logs = dir.join("logs");
    let cfg = DeployConfig {
        name: "dash",
        model: MODEL,
        workers: 2,
        speedup: 20.0,
        profile: "l40s-qwen3-32b-fp8",
        tokenizer: &tokenizer,
        log_dir: &logs,
    };
    let router_args = vec![format!("--tenant-metrics-allow={TENANT}")];
    let deployment = Deployment::start_with(&cfg, "kvroute", &extra_config(), &router_args).await?;
    let result = with_deployment(dir, prometheus, &rules, &deployment, started).await;
    deployment.stop().await;
    result
}

async fn with_deployment(
    dir: &Path,
    prometheus: &Path,
    rules: &Path,
    d: &Deployment,
    started: Instant,
) -> anyhow::Result<()> {
    let config = dir.join("prometheus.yml");
    std::fs::write(&config, prometheus_config(d, rules))?;
    let port = procs::free_local_port()?;
    let args: Vec<String> = vec![
        format!("--config.file={}", config.display()),
        format!("--storage.tsdb.path={}", dir.join("tsdb").display()),
        format!("--web.listen-address=127.0.0.1:{port}"),
        "--log.level=warn".into(),
    ];
    let mut child: Child = procs::spawn(
        "prometheus",
        prometheus,
        &args,
        &SpawnOptions {
            env: Vec::new(),
            log: Some(dir.join("logs/prometheus.log")),
        },
    )?;
    let url = format!("http://127.0.0.1:{port}");
    procs::wait_http_ok(
        &format!("{url}/-/ready"),
        Duration::from_secs(60),
        Some(&mut child),
    )
    .await?;
    let prom = Prom {
        url,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()?,
    };
    let result = evaluate(&prom, d, started).await;
    let _ = child.stop(Duration::from_secs(5)).await;
    result
}

async fn evaluate(prom: &Prom, d: &Deployment, started: Instant) -> anyhow::Result<()> {
    let targets = 1 + d.sidecar_admin_urls.len() + d.worker_urls.len();
    wait_scraped(prom, "sum(up)", targets as f64).await?;

    // Two waves, each scraped before the next: every counter and histogram then has two
    // different values inside the rate window.
    let mut decisions = 0;
    for n in 0..2 {
        decisions += wave(&d.gateway, n).await?;
        wait_scraped(prom, "sum(kvroute_router_requests_total)", decisions as f64).await?;
        wait_scraped(
            prom,
            "sum(kvroute_router_pick_errors_total)",
            (n + 1) as f64,
        )
        .await?;
    }
    // KV events travel engine -> ZeroMQ -> sidecar on their own schedule (the subscriber
    // may connect after the first wave): wait until some sidecar's counter has two samples
    // in the rate window, as the panel's rate() needs.
    wait_scraped(
        prom,
        "max(count_over_time(kvroute_sidecar_kv_events_total[1m]))",
        2.0,
    )
    .await?;
    // That wait can take most of a minute on a loaded machine, long enough for the samples
    // from before the second wave to leave the rate window: one more wave, scraped, puts a
    // change of every counter and histogram (and fresh KV events) back inside it.
    decisions += wave(&d.gateway, 2).await?;
    wait_scraped(prom, "sum(kvroute_router_requests_total)", decisions as f64).await?;
    wait_scraped(prom, "sum(kvroute_router_pick_errors_total)", 3.0).await?;
    // Every target scraped once more after the last wave.
    let after = prom.scalar("time()").await?;
    let expr = format!("min(timestamp(up)) > bool {after}");
    wait_scraped(prom, &expr, 1.0).await?;

    let (panels, variables) = shipped_queries();
    let mut failures = Vec::new();
    println!(
        "{:<18} {:<45} {:>6} {:>12}",
        "dashboard", "panel", "series", "first value"
    );
    for (dash, title, expr) in &panels {
        let result = prom.query(expr).await?;
        let values = finite_values(&result);
        println!(
            "{dash:<18} {:<45} {:>6} {:>12}",
            title.chars().take(45).collect::<String>(),
            result.len(),
            values
                .first()
                .map_or("-".to_string(), |v| format!("{v:.4}"))
        );
        if values.is_empty() {
            failures.push(format!("{dash} / {title}: {expr} -> {result:?}"));
        }
    }
    for (dash, var, query) in &variables {
        // label_values(metric, label)
        let inner = query
            .trim_start_matches("label_values(")
            .trim_end_matches(')');
        let (metric, label) = inner.split_once(',').context("label_values form")?;
        let data = prom
            .api(
                &format!("/api/v1/label/{}/values", label.trim()),
                &[("match[]", metric.trim())],
            )
            .await?;
        let n = data.as_array().map_or(0, Vec::len);
        println!("{dash:<18} variable ${var:<36} {n:>6} values");
        if n == 0 {
            failures.push(format!("{dash} / variable {var}: {query} has no values"));
        }
    }
    // Tenant labels: the allow-listed name, `other` and `anonymous`, never another name.
    let data = prom
        .api(
            "/api/v1/label/tenant/values",
            &[("match[]", "kvroute_router_tenant_requests_total")],
        )
        .await?;
    let mut seen: Vec<String> = serde_json::from_value(data)?;
    seen.sort();
    println!("tenant label values: {seen:?}");
    if seen != ["anonymous", "other", TENANT] {
        failures.push(format!("tenant labels {seen:?}"));
    }
    // Class labels: the declared class and `default`, never a client's undeclared one.
    let data = prom
        .api(
            "/api/v1/label/class/values",
            &[("match[]", "kvroute_router_tenant_requests_total")],
        )
        .await?;
    let mut classes: Vec<String> = serde_json::from_value(data)?;
    classes.sort();
    println!("class label values: {classes:?}");
    if classes != ["batch", "default"] {
        failures.push(format!("class labels {classes:?}"));
    }
    // Every shipped alert is loaded and evaluates without error.
    let rules = procs::wait_for(
        "every alert rule evaluated",
        Duration::from_secs(30),
        || async move {
            let data = prom.api("/api/v1/rules", &[]).await?;
            let rules: Vec<Value> = data["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                .collect();
            Ok(
                (!rules.is_empty() && rules.iter().all(|r| r["health"] != "unknown"))
                    .then_some(rules),
            )
        },
    )
    .await?;
    for r in &rules {
        if r["health"] != "ok" {
            failures.push(format!("alert {}: {}", r["name"], r["lastError"]));
        }
    }
    println!(
        "{} panel queries and {} variables returned data, {} alerts evaluated, in {:.1} s",
        panels.len(),
        variables.len(),
        rules.len(),
        started.elapsed().as_secs_f64()
    );
    anyhow::ensure!(
        failures.is_empty(),
        "queries without data:\n{}",
        failures.join("\n")
    );
    Ok(())
}
