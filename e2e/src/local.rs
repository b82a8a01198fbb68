//! A local kvroute deployment on loopback, for the demo and the live benchmark: N mock vLLM
//! workers, a sidecar each, and the router with a static worker file.
//!
//! ```text
//! router (--config workers.yaml) <--gRPC-- sidecar-i <--ZMQ KV events-- worker-i (mock vLLM)
//!    ^ gateway (OpenAI API)                     \--scrape /metrics--------/
//! ```
//!
//! Start order: router, then sidecars (they bind the KV-event sockets), then workers (they
//! connect, as vLLM does with a non-wildcard endpoint); ready when the router reports every
//! worker routable. Every process is a `kvroute` subcommand, killed on drop.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};

use crate::procs::{self, Child, SpawnOptions};

/// The model the mock workers pretend to load (the served name is configurable).
const BACKEND_MODEL: &str = "Qwen/Qwen3-32B-FP8";
/// KV block size of the L40S profile (the sidecar must know it before vLLM's first event).
const BLOCK_SIZE: u32 = 16;

/// One running deployment: N workers, N sidecars, one router.
pub struct Deployment {
    workers: Vec<Child>,
    sidecars: Vec<Child>,
    router: Child,
    /// The router's OpenAI/Anthropic gateway, `http://127.0.0.1:PORT`.
    pub gateway: String,
    /// Each worker's HTTP API, `http://127.0.0.1:PORT`.
    pub worker_urls: Vec<String>,
    /// Worker ids as the router names them (`x-kvroute-worker`).
    pub worker_ids: Vec<String>,
    /// The router's admin server (`/metrics`, `/debug/*`), `http://127.0.0.1:PORT`.
    pub router_admin: String,
    /// Each sidecar's admin server (`/metrics`), `http://127.0.0.1:PORT`.
    pub sidecar_admin_urls: Vec<String>,
}

/// The router's static worker file: one InferenceWorkerSet listing the workers.
fn static_config(cfg: &DeployConfig<'_>, worker_ports: &[u16]) -> String {
    let mut workers = String::new();
    for (i, port) in worker_ports.iter().enumerate() {
        let _ = writeln!(
            workers,
            "    - {{pod: worker-{i}, address: \"127.0.0.1:{port}\", ready: true}}"
        );
    }
    format!(
        "apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {{name: {name}, namespace: {name}}}
spec:
  model: {{name: {BACKEND_MODEL}, servedName: {model}}}
  replicas: {n}
  engine: {{mode: mock}}
status:
  replicas: {n}
  readyReplicas: {n}
  workers:
{workers}",
        n = worker_ports.len(),
        name = cfg.name,
        model = cfg.model,
    )
}

/// What to start.
pub struct DeployConfig<'a> {
    /// Namespace and WorkerSet name the router sees (worker ids are `<name>/worker-<i>`).
    pub name: &'a str,
    /// Served model name.
    pub model: &'a str,
    /// Mock workers to start, each with a sidecar.
    pub workers: usize,
    /// Clock speed-up of the mock workers.
    pub speedup: f64,
    /// Mock worker profile (built-in name or file).
    pub profile: &'a str,
    /// Tokenizer directory for the workers and the router.
    pub tokenizer: &'a Path,
    /// Logs go to `<log_dir>/<policy>/<process>.log`.
    pub log_dir: &'a Path,
}

impl Deployment {
    /// Router, then sidecars (they bind the event sockets), then workers; ready when the
    /// router reports every worker routable.
    pub async fn start(cfg: &DeployConfig<'_>, policy: &str) -> anyhow::Result<Self> {
        Self::start_with(cfg, policy, "", &[]).await
    }

    /// [`Deployment::start`] with `extra_config` (more YAML documents, e.g. another
    /// WorkerSet, a pool or a policy) appended to the router's worker file, and more router
    /// flags.
    pub async fn start_with(
        cfg: &DeployConfig<'_>,
        policy: &str,
        extra_config: &str,
        extra_router_args: &[String],
    ) -> anyhow::Result<Self> {
        let dir = cfg.log_dir.join(policy);
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let log = |name: &str| SpawnOptions {
            env: vec![("RUST_LOG".into(), "warn".into())],
            log: Some(dir.join(format!("{name}.log"))),
        };
        let tokenizer = cfg.tokenizer.display().to_string();
        let mut ports = Vec::new();
        for _ in 0..cfg.workers {
            ports.push((
                procs::free_local_port()?,
                procs::free_local_port()?,
                procs::free_local_port()?,
            ));
        }
        let http_ports: Vec<u16> = ports.iter().map(|p| p.0).collect();
        let config_path = dir.join("workers.yaml");
        let mut config = static_config(cfg, &http_ports);
        if !extra_config.trim().is_empty() {
            config.push_str("---\n");
            config.push_str(extra_config);
        }
        std::fs::write(&config_path, config).context("write the router's worker file")?;
        let (gw_port, grpc_port, admin_port) = (
            procs::free_local_port()?,
            procs::free_local_port()?,
            procs::free_local_port()?,
        );
        let mut router_args: Vec<String> = vec![
            "--http-addr".into(),
            format!("127.0.0.1:{gw_port}"),
            "--grpc-addr".into(),
            format!("127.0.0.1:{grpc_port}"),
            "--admin-addr".into(),
            format!("127.0.0.1:{admin_port}"),
            "--config".into(),
            config_path.display().to_string(),
            "--policy".into(),
            policy.into(),
            // The bench reads the chosen worker and the prediction from the response headers
            // (bench/live.rs); a production router keeps them off.
            "--expose-routing-headers".into(),
            "--tokenizer".into(),
            tokenizer.clone(),
            // The workers run `speedup` times faster than the L40S they model: calibrate the
            // router's prior to them, as a user would for their GPU.
            "--prior-prefill-rate".into(),
            (4_800.0 * cfg.speedup).to_string(),
            "--prior-overhead-s".into(),
            (0.05 / cfg.speedup).to_string(),
            "--prior-itl-s".into(),
            (0.07 / cfg.speedup).to_string(),
        ];
        router_args.extend(extra_router_args.iter().cloned());
        let mut router = procs::spawn_kvroute("router", "router", &router_args, &log("router"))?;
        let admin = format!("http://127.0.0.1:{admin_port}");
        procs::wait_http_ok(
            &format!("{admin}/healthz"),
            Duration::from_secs(60),
            Some(&mut router),
        )
        .await
        .context("the router did not start")?;

        let mut sidecars = Vec::new();
        let mut worker_ids = Vec::new();
        let mut sidecar_admin_urls = Vec::new();
        for (i, (port, pub_port, replay_port)) in ports.iter().enumerate() {
            let id = format!("{}/worker-{i}", cfg.name);
            let sidecar_admin = procs::free_local_port()?;
            let args: Vec<String> = vec![
                "--zmq-endpoint".into(),
                format!("tcp://127.0.0.1:{pub_port}"),
                "--zmq-bind".into(),
                "--replay-endpoint".into(),
                format!("tcp://127.0.0.1:{replay_port}"),
                "--vllm-url".into(),
                format!("http://127.0.0.1:{port}"),
                "--router".into(),
                format!("http://127.0.0.1:{grpc_port}"),
                "--worker-id".into(),
                id.clone(),
                "--worker-address".into(),
                format!("127.0.0.1:{port}"),
                "--model".into(),
                cfg.model.into(),
                "--block-size".into(),
                BLOCK_SIZE.to_string(),
                "--worker-set".into(),
                cfg.name.into(),
                "--admin-addr".into(),
                format!("127.0.0.1:{sidecar_admin}"),
                "--scrape-interval-ms".into(),
                "100".into(),
                // No NVML on loopback: one simulated, healthy GPU per worker, so GPU figures
                // flow to the router's metrics as they do in a cluster.
                "--mock-gpus".into(),
                "1".into(),
            ];
            let name = format!("sidecar-{i}");
            sidecars.push(procs::spawn_kvroute(&name, "sidecar", &args, &log(&name))?);
            worker_ids.push(id);
            sidecar_admin_urls.push(format!("http://127.0.0.1:{sidecar_admin}"));
        }

        let mut workers = Vec::new();
        for (i, (port, pub_port, replay_port)) in ports.iter().enumerate() {
            let events = json!({"enable_kv_cache_events": true, "publisher": "zmq",
                "endpoint": format!("tcp://127.0.0.1:{pub_port}"),
                "replay_endpoint": format!("tcp://127.0.0.1:{replay_port}"), "topic": ""});
            let args: Vec<String> = vec![
                "--host".into(),
                "127.0.0.1".into(),
                "--port".into(),
                port.to_string(),
                "--model".into(),
                BACKEND_MODEL.into(),
                "--served-model-name".into(),
                cfg.model.into(),
                "--tokenizer".into(),
                tokenizer.clone(),
                "--profile".into(),
                cfg.profile.into(),
                "--speedup".into(),
                cfg.speedup.to_string(),
                "--seed".into(),
                i.to_string(),
                "--enable-prompt-tokens-details".into(),
                "--kv-events-config".into(),
                events.to_string(),
            ];
            let name = format!("worker-{i}");
            workers.push(procs::spawn_kvroute(
                &name,
                "mock-vllm",
                &args,
                &log(&name),
            )?);
        }
        let worker_urls: Vec<String> = http_ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect();
        for (i, (url, w)) in worker_urls.iter().zip(workers.iter_mut()).enumerate() {
            procs::wait_http_ok(&format!("{url}/health"), Duration::from_secs(60), Some(w))
                .await
                .with_context(|| format!("worker-{i} did not start"))?;
        }
        let client = reqwest::Client::new();
        let want = cfg.workers;
        let url = format!("{admin}/debug/workers");
        procs::wait_for("every worker routable", Duration::from_secs(60), || {
            let (client, url) = (client.clone(), url.clone());
            async move { Ok((routable_workers(&client, &url).await? >= want).then_some(())) }
        })
        .await?;
        Ok(Self {
            workers,
            sidecars,
            router,
            gateway: format!("http://127.0.0.1:{gw_port}"),
            worker_urls,
            worker_ids,
            router_admin: admin,
            sidecar_admin_urls,
        })
    }

    /// Stops everything: router first (no new work), then sidecars, then workers.
    pub async fn stop(self) {
        let grace = Duration::from_secs(3);
        let _ = self.router.stop(grace).await;
        for c in self.sidecars {
            let _ = c.stop(grace).await;
        }
        for c in self.workers {
            let _ = c.stop(grace).await;
        }
    }
}

/// Number of workers `/debug/workers` says are routable.
pub async fn routable_workers(client: &reqwest::Client, url: &str) -> anyhow::Result<usize> {
    let v: Value = client
        .get(url)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let list = v
        .get("workers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    Ok(list
        .iter()
        .filter(|w| w.get("routable").and_then(Value::as_bool) == Some(true))
        .count())
}
