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
//!
//! [`Topology`] asks for more: several router replicas (each sidecar streams to every one,
//! optionally exchanging placements with `--peers`), and a [`FaultProxy`] in front of each
//! replica's gRPC port for the sidecars' streams. The fault suite (`faults.rs`) kills,
//! restarts and signals single processes through [`Deployment::kill_worker`] and its siblings;
//! a restarted process gets the same arguments and ports.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};

use crate::fault_proxy::FaultProxy;
use crate::procs::{self, Child, SpawnOptions};

/// The model the mock workers pretend to load (the served name is configurable).
const BACKEND_MODEL: &str = "Qwen/Qwen3-32B-FP8";
/// KV block size of the L40S profile (the sidecar must know it before vLLM's first event).
const BLOCK_SIZE: u32 = 16;

/// One running deployment: N workers, N sidecars, one router (or more, [`Topology`]).
pub struct Deployment {
    workers: Vec<Option<Child>>,
    sidecars: Vec<Option<Child>>,
    routers: Vec<Option<Child>>,
    /// The arguments each process was started with (a restart reuses them).
    worker_args: Vec<Vec<String>>,
    sidecar_args: Vec<Vec<String>>,
    router_args: Vec<Vec<String>>,
    /// Restarts so far of each process (names its next log file).
    generations: std::collections::HashMap<String, u32>,
    proxies: Vec<FaultProxy>,
    log_dir: PathBuf,
    /// The first router's OpenAI/Anthropic gateway, `http://127.0.0.1:PORT`.
    pub gateway: String,
    /// Every router replica's gateway, in replica order.
    pub gateways: Vec<String>,
    /// Every router replica's admin server, in replica order.
    pub router_admins: Vec<String>,
    /// Each worker's HTTP API, `http://127.0.0.1:PORT`.
    pub worker_urls: Vec<String>,
    /// Worker ids as the router names them (`x-kvroute-worker`).
    pub worker_ids: Vec<String>,
    /// The first router's admin server (`/metrics`, `/debug/*`), `http://127.0.0.1:PORT`.
    pub router_admin: String,
    /// Each sidecar's admin server (`/metrics`), `http://127.0.0.1:PORT`.
    pub sidecar_admin_urls: Vec<String>,
}

/// The InferenceWorkerSet of worker `i`: `<name>` for a pool of one profile; with several
/// (a heterogeneous pool), one set per profile, `<name>-<profile>`, as a cluster runs one
/// WorkerSet per GPU type. The router pools prefill rates only within a set.
pub fn worker_set_of(cfg: &DeployConfig<'_>, i: usize) -> String {
    let profiles = profile_list(cfg);
    let mut distinct = profiles.clone();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() <= 1 {
        return cfg.name.to_string();
    }
    let profile = profiles[i % profiles.len()];
    // A profile may be a file path: keep a name Kubernetes would accept.
    let stem = Path::new(profile)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or(profile);
    let slug: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    format!("{}-{}", cfg.name, slug.trim_matches('-'))
}

/// The entries of `cfg.profile` (comma-separated; worker i runs entry `i % len`).
fn profile_list<'a>(cfg: &DeployConfig<'a>) -> Vec<&'a str> {
    cfg.profile
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

/// The router's static worker file: an InferenceWorkerSet listing the workers, one per set
/// ([`worker_set_of`]).
fn static_config(cfg: &DeployConfig<'_>, worker_ports: &[u16]) -> String {
    let mut sets: Vec<(String, Vec<(usize, u16)>)> = Vec::new();
    for (i, &port) in worker_ports.iter().enumerate() {
        let set = worker_set_of(cfg, i);
        match sets.iter_mut().find(|(s, _)| *s == set) {
            Some((_, ws)) => ws.push((i, port)),
            None => sets.push((set, vec![(i, port)])),
        }
    }
    let docs: Vec<String> = sets
        .iter()
        .map(|(set, members)| {
            let mut workers = String::new();
            for (i, port) in members {
                let _ = writeln!(
                    workers,
                    "    - {{pod: worker-{i}, address: \"127.0.0.1:{port}\", ready: true}}"
                );
            }
            format!(
                "apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {{name: {set}, namespace: {name}}}
spec:
  model: {{name: {BACKEND_MODEL}, servedName: {model}}}
  replicas: {n}
  engine: {{mode: mock}}
status:
  replicas: {n}
  readyReplicas: {n}
  workers:
{workers}",
                n = members.len(),
                name = cfg.name,
                model = cfg.model,
            )
        })
        .collect();
    docs.join("---\n")
}

/// What to start.
pub struct DeployConfig<'a> {
    /// Namespace and WorkerSet name the router sees (worker ids are `<name>/worker-<i>`; a
    /// heterogeneous pool has one set per profile, [`worker_set_of`]).
    pub name: &'a str,
    /// Served model name.
    pub model: &'a str,
    /// Mock workers to start, each with a sidecar.
    pub workers: usize,
    /// Clock speed-up of the mock workers.
    pub speedup: f64,
    /// Mock worker profile (built-in name or file), or a comma-separated list that worker i
    /// takes entry `i % len` of (a heterogeneous pool, as `kvroute bench --mode sim` reads it).
    pub profile: &'a str,
    /// Tokenizer directory for the workers and the router.
    pub tokenizer: &'a Path,
    /// Logs go to `<log_dir>/<policy>/<process>.log`.
    pub log_dir: &'a Path,
}

/// How many router replicas, and what sits between them and the sidecars.
#[derive(Clone, Copy, Debug, Default)]
pub struct Topology {
    /// Router replicas (0 counts as 1). Every sidecar streams to each.
    pub routers: usize,
    /// With several replicas: each gets `--peers` naming the others (docs/replicas.md).
    pub peers: bool,
    /// Sidecars reach each replica's gRPC port through a [`FaultProxy`]
    /// ([`Deployment::proxy`]).
    pub fault_proxies: bool,
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
        Self::start_topology(
            cfg,
            policy,
            extra_config,
            extra_router_args,
            Topology::default(),
        )
        .await
    }

    /// [`Deployment::start_with`] with several router replicas and fault proxies
    /// ([`Topology`]); ready when every replica reports every worker routable.
    pub async fn start_topology(
        cfg: &DeployConfig<'_>,
        policy: &str,
        extra_config: &str,
        extra_router_args: &[String],
        topology: Topology,
    ) -> anyhow::Result<Self> {
        let dir = cfg.log_dir.join(policy);
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let log = |name: &str| log_options(&dir, name);
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
        let replicas = topology.routers.max(1);
        let mut router_ports = Vec::new();
        for _ in 0..replicas {
            router_ports.push((
                procs::free_local_port()?,
                procs::free_local_port()?,
                procs::free_local_port()?,
            ));
        }
        let mut routers = Vec::new();
        let mut all_router_args = Vec::new();
        let mut router_admins = Vec::new();
        let mut gateways = Vec::new();
        let mut proxies = Vec::new();
        let mut sidecar_routers = Vec::new();
        for (r, (gw_port, grpc_port, admin_port)) in router_ports.iter().enumerate() {
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
                // The bench reads the chosen worker and the prediction from the response
                // headers (bench/live.rs); a production router keeps them off.
                "--expose-routing-headers".into(),
                "--tokenizer".into(),
                tokenizer.clone(),
                // The workers run `speedup` times faster than the L40S they model: calibrate
                // the router's prior to them, as a user would for their GPU.
                "--prior-prefill-rate".into(),
                (4_800.0 * cfg.speedup).to_string(),
                "--prior-overhead-s".into(),
                (0.05 / cfg.speedup).to_string(),
                "--prior-itl-s".into(),
                (0.07 / cfg.speedup).to_string(),
            ];
            if topology.peers && replicas > 1 {
                let others: Vec<String> = router_ports
                    .iter()
                    .enumerate()
                    .filter(|(o, _)| *o != r)
                    .map(|(_, p)| format!("127.0.0.1:{}", p.1))
                    .collect();
                router_args.push("--peers".into());
                router_args.push(others.join(","));
            }
            router_args.extend(extra_router_args.iter().cloned());
            let name = router_name(replicas, r);
            let router = procs::spawn_kvroute(&name, "router", &router_args, &log(&name))?;
            let admin = format!("http://127.0.0.1:{admin_port}");
            routers.push(Some(router));
            all_router_args.push(router_args);
            router_admins.push(admin);
            gateways.push(format!("http://127.0.0.1:{gw_port}"));
            let grpc: std::net::SocketAddr = ([127, 0, 0, 1], *grpc_port).into();
            if topology.fault_proxies {
                let proxy = FaultProxy::start(grpc)
                    .await
                    .context("start a fault proxy")?;
                sidecar_routers.push(format!("http://{}", proxy.addr()));
                proxies.push(proxy);
            } else {
                sidecar_routers.push(format!("http://{grpc}"));
            }
        }

        // Started together, waited for together.
        for (r, router) in routers.iter_mut().enumerate() {
            procs::wait_http_ok(
                &format!("{}/healthz", router_admins[r]),
                Duration::from_secs(60),
                router.as_mut(),
            )
            .await
            .with_context(|| format!("{} did not start", router_name(replicas, r)))?;
        }

        let mut sidecars = Vec::new();
        let mut sidecar_args = Vec::new();
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
                sidecar_routers.join(","),
                "--worker-id".into(),
                id.clone(),
                "--worker-address".into(),
                format!("127.0.0.1:{port}"),
                "--model".into(),
                cfg.model.into(),
                "--block-size".into(),
                BLOCK_SIZE.to_string(),
                "--worker-set".into(),
                worker_set_of(cfg, i),
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
            sidecars.push(Some(procs::spawn_kvroute(
                &name,
                "sidecar",
                &args,
                &log(&name),
            )?));
            sidecar_args.push(args);
            worker_ids.push(id);
            sidecar_admin_urls.push(format!("http://127.0.0.1:{sidecar_admin}"));
        }

        let mut workers = Vec::new();
        let mut worker_args = Vec::new();
        let profiles = profile_list(cfg);
        for (i, (port, pub_port, replay_port)) in ports.iter().enumerate() {
            let profile = profiles
                .get(i % profiles.len().max(1))
                .copied()
                .unwrap_or(cfg.profile);
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
                profile.into(),
                "--speedup".into(),
                cfg.speedup.to_string(),
                "--seed".into(),
                i.to_string(),
                "--enable-prompt-tokens-details".into(),
                "--kv-events-config".into(),
                events.to_string(),
            ];
            let name = format!("worker-{i}");
            workers.push(Some(procs::spawn_kvroute(
                &name,
                "mock-vllm",
                &args,
                &log(&name),
            )?));
            worker_args.push(args);
        }
        let worker_urls: Vec<String> = http_ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect();
        for (i, (url, w)) in worker_urls.iter().zip(workers.iter_mut()).enumerate() {
            procs::wait_http_ok(
                &format!("{url}/health"),
                Duration::from_secs(60),
                w.as_mut(),
            )
            .await
            .with_context(|| format!("worker-{i} did not start"))?;
        }
        let d = Self {
            workers,
            sidecars,
            routers,
            worker_args,
            sidecar_args,
            router_args: all_router_args,
            generations: std::collections::HashMap::new(),
            proxies,
            log_dir: dir,
            gateway: gateways[0].clone(),
            router_admin: router_admins[0].clone(),
            gateways,
            router_admins,
            worker_urls,
            worker_ids,
            sidecar_admin_urls,
        };
        for admin in &d.router_admins {
            d.wait_routable(admin, cfg.workers).await?;
        }
        Ok(d)
    }

    /// Waits until the router at `admin` reports `want` workers routable.
    pub async fn wait_routable(&self, admin: &str, want: usize) -> anyhow::Result<()> {
        let client = reqwest::Client::new();
        let url = format!("{admin}/debug/workers");
        procs::wait_for("every worker routable", Duration::from_secs(60), || {
            let (client, url) = (client.clone(), url.clone());
            async move { Ok((routable_workers(&client, &url).await? >= want).then_some(())) }
        })
        .await
    }

    /// The fault proxy in front of router replica `r`'s gRPC port (with
    /// [`Topology::fault_proxies`]).
    pub fn proxy(&self, r: usize) -> Option<&FaultProxy> {
        self.proxies.get(r)
    }

    /// Every fault proxy, in replica order.
    pub fn proxies(&self) -> &[FaultProxy] {
        &self.proxies
    }

    /// The OS process id of router replica `r`, while it runs.
    pub fn router_pid(&self, r: usize) -> Option<u32> {
        self.routers.get(r)?.as_ref()?.id()
    }

    /// The OS process id of sidecar `i`, while it runs.
    pub fn sidecar_pid(&self, i: usize) -> Option<u32> {
        self.sidecars.get(i)?.as_ref()?.id()
    }

    /// Kills worker `i` (SIGKILL to its process group) and waits for it to exit.
    pub async fn kill_worker(&mut self, i: usize) {
        if let Some(c) = self.workers.get_mut(i).and_then(Option::take) {
            c.kill().await;
        }
    }

    /// Starts worker `i` again with its arguments and ports; waits for its `/health`.
    pub async fn start_worker(&mut self, i: usize) -> anyhow::Result<()> {
        let args = self.worker_args.get(i).context("no such worker")?.clone();
        let name = self.next_log_name(&format!("worker-{i}"));
        let mut c = procs::spawn_kvroute(
            &name,
            "mock-vllm",
            &args,
            &log_options(&self.log_dir, &name),
        )?;
        procs::wait_http_ok(
            &format!("{}/health", self.worker_urls[i]),
            Duration::from_secs(60),
            Some(&mut c),
        )
        .await
        .with_context(|| format!("{name} did not start"))?;
        self.workers[i] = Some(c);
        Ok(())
    }

    /// Sends `sig` (e.g. `"HUP"`: the mock restarts its engine) to worker `i`.
    pub fn signal_worker(&self, i: usize, sig: &str) -> anyhow::Result<()> {
        let c = self.workers.get(i).and_then(Option::as_ref);
        c.context("worker not running")?.signal(sig);
        Ok(())
    }

    /// Kills sidecar `i` and waits for it to exit.
    pub async fn kill_sidecar(&mut self, i: usize) {
        if let Some(c) = self.sidecars.get_mut(i).and_then(Option::take) {
            c.kill().await;
        }
    }

    /// Starts sidecar `i` again with its arguments; waits for its `/healthz`.
    pub async fn start_sidecar(&mut self, i: usize) -> anyhow::Result<()> {
        let args = self.sidecar_args.get(i).context("no such sidecar")?.clone();
        let name = self.next_log_name(&format!("sidecar-{i}"));
        let mut c =
            procs::spawn_kvroute(&name, "sidecar", &args, &log_options(&self.log_dir, &name))?;
        procs::wait_http_ok(
            &format!("{}/healthz", self.sidecar_admin_urls[i]),
            Duration::from_secs(60),
            Some(&mut c),
        )
        .await
        .with_context(|| format!("{name} did not start"))?;
        self.sidecars[i] = Some(c);
        Ok(())
    }

    /// Kills router replica `r` and waits for it to exit.
    pub async fn kill_router(&mut self, r: usize) {
        if let Some(c) = self.routers.get_mut(r).and_then(Option::take) {
            c.kill().await;
        }
    }

    /// Starts router replica `r` again with its arguments and ports; waits for `/healthz`.
    pub async fn start_router(&mut self, r: usize) -> anyhow::Result<()> {
        let args = self.router_args.get(r).context("no such router")?.clone();
        let base = router_name(self.routers.len(), r);
        let name = self.next_log_name(&base);
        let mut c =
            procs::spawn_kvroute(&name, "router", &args, &log_options(&self.log_dir, &name))?;
        procs::wait_http_ok(
            &format!("{}/healthz", self.router_admins[r]),
            Duration::from_secs(60),
            Some(&mut c),
        )
        .await
        .with_context(|| format!("{name} did not start"))?;
        self.routers[r] = Some(c);
        Ok(())
    }

    /// `base` for a first start, `base.restart<N>` after that (each start keeps its log).
    fn next_log_name(&mut self, base: &str) -> String {
        let n = self.generations.entry(base.to_string()).or_insert(0);
        *n += 1;
        format!("{base}.restart{n}")
    }

    /// Stops everything: routers first (no new work), then sidecars, then workers.
    pub async fn stop(self) {
        let grace = Duration::from_secs(3);
        for c in self.routers.into_iter().flatten() {
            let _ = c.stop(grace).await;
        }
        for c in self.sidecars.into_iter().flatten() {
            let _ = c.stop(grace).await;
        }
        for c in self.workers.into_iter().flatten() {
            let _ = c.stop(grace).await;
        }
    }
}

/// `router` for a single replica (the name its log always had), `router-<r>` for several.
fn router_name(replicas: usize, r: usize) -> String {
    if replicas == 1 {
        "router".into()
    } else {
        format!("router-{r}")
    }
}

/// Warnings only, to `<dir>/<name>.log`.
fn log_options(dir: &Path, name: &str) -> SpawnOptions {
    SpawnOptions {
        env: vec![("RUST_LOG".into(), "warn".into())],
        log: Some(dir.join(format!("{name}.log"))),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg<'a>(profile: &'a str, dir: &'a Path) -> DeployConfig<'a> {
        DeployConfig {
            name: "bench",
            model: "m",
            workers: 3,
            speedup: 2.0,
            profile,
            tokenizer: dir,
            log_dir: dir,
        }
    }

    #[test]
    fn a_heterogeneous_pool_is_one_worker_set_per_profile() {
        let dir = Path::new("/nonexistent");
        let sets = |profile: &str| -> Vec<(String, String)> {
            let view = kvroute_router::discovery::static_file::parse(&static_config(
                &cfg(profile, dir),
                &[8001, 8002, 8003],
            ))
            .expect("the router reads the file");
            let mut out: Vec<(String, String)> = view
                .catalog
                .workers
                .iter()
                .map(|w| (w.id.clone(), w.worker_set.clone()))
                .collect();
            out.sort();
            out
        };
        let one = sets("l40s-27b-fp8");
        assert_eq!(
            one,
            (0..3)
                .map(|i| (format!("bench/worker-{i}"), "bench".to_string()))
                .collect::<Vec<_>>()
        );
        // The same profile listed twice is still one GPU type.
        assert_eq!(sets("l40s-27b-fp8,l40s-27b-fp8"), one);
        let hetero = sets("l40s-27b-fp8,l40s-27b-fp8,h100-27b-fp8");
        let (l40s, h100) = ("bench-l40s-27b-fp8", "bench-h100-27b-fp8");
        assert_eq!(
            hetero,
            vec![
                ("bench/worker-0".into(), l40s.into()),
                ("bench/worker-1".into(), l40s.into()),
                ("bench/worker-2".into(), h100.into()),
            ]
        );
        // The sidecars name the same sets; a profile file's path gives a name like a
        // built-in's.
        let c = cfg("l40s-27b-fp8,/tmp/My_GPU.json", dir);
        assert_eq!(worker_set_of(&c, 0), "bench-l40s-27b-fp8");
        assert_eq!(worker_set_of(&c, 1), "bench-my-gpu");
        assert_eq!(worker_set_of(&c, 2), "bench-l40s-27b-fp8");
    }
}
