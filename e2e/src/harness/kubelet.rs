//! A fake kubelet: runs the Pods of mock workers as local processes and reports their status,
//! so Deployments, Services' endpoints and anything that watches Pods behave as on a real node.
//!
//! ```text
//! watch Pods (namespace, label selector) --new pod--> allocate 127.A.B.C, plan (podspec.rs),
//!     bind to the fake Node, spawn `kvroute <subcommand>` per container, status Running
//! tick (200 ms): readiness probes, restart exited containers (backoff), patch status on change
//! pod terminating: as a kubelet, in a task of its own: each container's preStop httpGet,
//!     then SIGTERM, SIGKILL once the pod's deletion grace has passed, then confirm the
//!     deletion (grace 0); pod deleted outright: stop its processes
//! Secret volumes (volumes.rs): written under the pod's directory before it starts (kubelet's
//!     `..data` layout), each mount root in args/env rewritten to a local directory linking
//!     them, re-synced from the API every second (a changed Secret swaps `..data` at once)
//! ```
//!
//! Pods it cannot run (a real vLLM image, an unknown container) stay Pending with a
//! `PodScheduled=False` condition that says why; a container that exits is reported waiting in
//! `CrashLoopBackOff` with the tail of its log and restarted with backoff.
//!
//! Cluster DNS ([`KubeletOptions::cluster_dns`]): there is no DNS server here, so the kubelet
//! plays the part of cluster DNS for headless Services the way a kubelet already manages each
//! pod's `/etc/hosts`. It keeps one hosts file with `<svc>.<ns>.svc` (and `.cluster.local`)
//! naming every address of the Service's Endpoints (as kube-dns answers for a headless
//! Service), re-read from the API every [`DNS_SYNC_TICKS`] ticks, and runs every container in
//! a user and mount namespace of its own (`unshare -rm`) where that file is bind-mounted over
//! `/etc/hosts`. glibc reads `/etc/hosts` on every lookup, so a process that re-resolves (the
//! sidecar's `--router-dns`, the router's `--peer-service`) follows pods as they come and go.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use serde_json::json;

use super::cluster::Reaper;
use super::podspec::{self, ContainerPlan, KeyRef, PodFacts, PodPlan, PreStop, Program, Readiness};
use super::volumes::{self, SecretVolume};
use crate::procs::{self, Child, SpawnOptions};

const TICK: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
const PROBE_TIMEOUT: Duration = Duration::from_millis(800);
/// Ticks between two syncs of the Secret volumes (kubelet syncs about once a minute; tests
/// want rotations to show within seconds).
const VOLUME_SYNC_TICKS: u64 = 5;
/// Ticks between two rewrites of the cluster-DNS hosts file.
pub const DNS_SYNC_TICKS: u64 = 2;
/// Deletion grace when a pod has none (Kubernetes' default `terminationGracePeriodSeconds`).
const DEFAULT_GRACE: Duration = Duration::from_secs(30);
/// Time SIGTERM gets when the preStop hooks used up the grace (a kubelet gives 2 s too).
const MIN_TERM_GRACE: Duration = Duration::from_secs(2);

/// What the fake kubelet watches and how it starts processes.
#[derive(Clone, Debug)]
pub struct KubeletOptions {
    /// Only Pods in this namespace (all namespaces when `None`).
    pub namespace: Option<String>,
    /// Only Pods matching this label selector (e.g. a WorkerSet's selector).
    pub label_selector: Option<String>,
    /// Name of the fake Node the pods are bound to (created if missing).
    pub node_name: String,
    /// Container logs go to `<log_dir>/<namespace>_<pod>/<container>.log`.
    pub log_dir: PathBuf,
    /// Extra environment for every process (e.g. `KUBECONFIG`, `RUST_LOG`).
    pub env: Vec<(String, String)>,
    /// Substring rewrites for args and env values, e.g. a Service DNS name to the local
    /// address of the process that plays it. More can be added with [`FakeKubelet::rewrite`].
    pub rewrites: Vec<(String, String)>,
    /// Process groups are registered here so they die with the test binary.
    pub reaper: Option<Reaper>,
    /// Run every pod as its service account, as a real kubelet's token mount does: its
    /// processes get a kubeconfig with that account's token (so RBAC applies to them), or,
    /// when the pod sets `automountServiceAccountToken: false`, a `KUBECONFIG` that does not
    /// exist. `None`: every process gets the `KUBECONFIG` of [`KubeletOptions::env`].
    pub service_accounts: Option<ServiceAccountAuth>,
    /// Resolve headless Services' names for the pods (see the module's "Cluster DNS"). Needs
    /// unprivileged user namespaces (`unshare -rm`).
    pub cluster_dns: bool,
}

/// Where the API server is, for the kubeconfigs of [`KubeletOptions::service_accounts`].
#[derive(Clone, Debug)]
pub struct ServiceAccountAuth {
    /// The API server's URL.
    pub server: String,
    /// Its CA certificate.
    pub ca_file: PathBuf,
    /// Where the kubeconfigs are written.
    pub dir: PathBuf,
}

/// A pod the fake kubelet runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningPod {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// The pod's loopback address (its `status.podIP`).
    pub ip: Ipv4Addr,
    /// All containers ready.
    pub ready: bool,
}

/// Handle of a running fake kubelet. Dropping it kills every process it started.
pub struct FakeKubelet {
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeKubelet {
    /// Creates the fake Node and starts watching Pods.
    pub async fn start(client: kube::Client, opts: KubeletOptions) -> anyhow::Result<Self> {
        ensure_node(&client, &opts.node_name).await?;
        let hosts = if opts.cluster_dns {
            Some(dns::prepare(&opts.log_dir, &opts.node_name).await?)
        } else {
            None
        };
        let state = Arc::new(State {
            pods: Mutex::new(HashMap::new()),
            terminating: Mutex::new(std::collections::HashSet::new()),
            problems: Mutex::new(BTreeMap::new()),
            journal: Mutex::new(std::collections::VecDeque::new()),
            rewrites: Mutex::new(opts.rewrites.clone()),
        });
        let kubelet = Kubelet {
            client,
            opts,
            state: Arc::clone(&state),
            probe: reqwest::Client::builder().timeout(PROBE_TIMEOUT).build()?,
            hooks: reqwest::Client::new(),
            pending: HashMap::new(),
            ticks: 0,
            hosts,
        };
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            // A bug here must show in failure messages, not as pods that silently stay Pending.
            use futures::FutureExt;
            if let Err(panic) = std::panic::AssertUnwindSafe(kubelet.run())
                .catch_unwind()
                .await
            {
                let what = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                lock(&shared.problems).insert("(fake kubelet)".into(), format!("panicked: {what}"));
            }
        });
        Ok(Self { state, task })
    }

    /// Adds a substring rewrite applied to args and env of pods started from now on.
    pub fn rewrite(&self, from: impl Into<String>, to: impl Into<String>) {
        lock(&self.state.rewrites).push((from.into(), to.into()));
    }

    /// The pods running now.
    pub fn running(&self) -> Vec<RunningPod> {
        let pods = lock(&self.state.pods);
        let mut out: Vec<RunningPod> = pods
            .values()
            .map(|p| RunningPod {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                ip: p.ip,
                ready: p.ready(),
            })
            .collect();
        out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        out
    }

    /// Where the running pod `namespace/name` finds `path` (a path inside its containers,
    /// e.g. a file of a mounted Secret) on this machine; `None` when no such pod runs.
    pub fn local_path(&self, namespace: &str, name: &str, path: &str) -> Option<PathBuf> {
        let pods = lock(&self.state.pods);
        let pod = pods
            .values()
            .find(|p| p.namespace == namespace && p.name == name)?;
        Some(PathBuf::from(podspec::rewrite(path, &pod.mount_rewrites)))
    }

    /// Pods that could not start, with the last reason (`namespace/name` -> error).
    pub fn problems(&self) -> BTreeMap<String, String> {
        lock(&self.state.problems).clone()
    }

    /// The last events handled (pods seen, started, stopped), oldest first.
    pub fn journal(&self) -> Vec<String> {
        lock(&self.state.journal).iter().cloned().collect()
    }

    /// Stops watching and stops every process (SIGTERM, then SIGKILL after `grace`).
    pub async fn stop(self, grace: Duration) {
        self.task.abort();
        let pods: Vec<PodRun> = lock(&self.state.pods).drain().map(|(_, p)| p).collect();
        for pod in pods {
            pod.stop(grace).await;
        }
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.task.abort();
        // Dropping the children kills their process groups.
        lock(&self.state.pods).clear();
    }
}

struct State {
    pods: Mutex<HashMap<String, PodRun>>,
    /// Pods (uids) whose termination task runs: their later watch events change nothing.
    terminating: Mutex<std::collections::HashSet<String>>,
    /// Why pods could not start (namespace/name -> last error), for failure messages.
    problems: Mutex<BTreeMap<String, String>>,
    /// The last events the kubelet handled, for failure messages.
    journal: Mutex<std::collections::VecDeque<String>>,
    rewrites: Mutex<Vec<(String, String)>>,
}

impl State {
    fn note(&self, line: String) {
        let mut j = lock(&self.journal);
        if j.len() >= 200 {
            j.pop_front();
        }
        j.push_back(line);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One pod's processes and what was last reported for it.
struct PodRun {
    namespace: String,
    name: String,
    ip: Ipv4Addr,
    started: String,
    containers: Vec<ContainerRun>,
    /// Ready condition and when it last changed.
    ready_since: (bool, String),
    /// The status last patched (to patch only on change).
    reported: Option<serde_json::Value>,
    /// Secret volumes and their local directories.
    volumes: Vec<(SecretVolume, PathBuf)>,
    /// Mount roots -> local directories (see [`volumes::mount_layout`]).
    mount_rewrites: Vec<(String, String)>,
}

struct ContainerRun {
    plan: ContainerPlan,
    child: Option<Child>,
    log: PathBuf,
    started_at: String,
    restarts: i32,
    ready: bool,
    /// Set while waiting to restart: when, and why it stopped.
    restart_at: Option<(Instant, String, i32)>,
    last_exit: Option<(i32, String)>,
}

impl PodRun {
    fn ready(&self) -> bool {
        self.containers.iter().all(|c| c.ready)
    }

    async fn stop(self, grace: Duration) {
        for c in self.containers {
            if let Some(child) = c.child {
                let _ = child.stop(grace).await;
            }
        }
    }

    /// A kubelet's pod termination: the preStop hooks (concurrently), then SIGTERM to every
    /// container and SIGKILL to those still running when `grace` (counted from the start) is
    /// over. Returns what happened, for the journal.
    async fn terminate(self, grace: Duration, hooks: &reqwest::Client) -> String {
        let deadline = Instant::now() + grace;
        let ip = self.ip;
        let calls = self
            .containers
            .iter()
            .filter(|c| c.child.is_some())
            .filter_map(|c| {
                let hook = c.plan.pre_stop.clone()?;
                let name = c.plan.name.clone();
                Some(async move {
                    match hook {
                        PreStop::Http { port, path } => {
                            let url = format!("http://{ip}:{port}{path}");
                            let answer =
                                tokio::time::timeout_at(deadline.into(), hooks.get(&url).send())
                                    .await;
                            match answer {
                                Ok(Ok(r)) => {
                                    format!("{name}: preStop {path} {}", r.status().as_u16())
                                }
                                Ok(Err(e)) => format!("{name}: preStop {path} failed: {e}"),
                                Err(_) => format!("{name}: preStop {path} ran past the grace"),
                            }
                        }
                        PreStop::Unsupported(kind) => format!("{name}: preStop {kind} skipped"),
                    }
                })
            });
        let mut notes = futures::future::join_all(calls).await;
        let term = deadline
            .saturating_duration_since(Instant::now())
            .max(MIN_TERM_GRACE);
        let started = Instant::now();
        let stops = self
            .containers
            .into_iter()
            .filter_map(|c| c.child)
            .map(|child| child.stop(term));
        futures::future::join_all(stops).await;
        notes.push(format!(
            "stopped {:.1} s after SIGTERM",
            started.elapsed().as_secs_f64()
        ));
        notes.join("; ")
    }

    /// The Pod status for what runs now.
    fn status(&mut self) -> serde_json::Value {
        let ready = self.ready();
        if self.ready_since.0 != ready {
            self.ready_since = (ready, now());
        }
        let ready_str = if ready { "True" } else { "False" };
        let since = &self.ready_since.1;
        let containers: Vec<serde_json::Value> =
            self.containers.iter().map(ContainerRun::status).collect();
        json!({
            "phase": "Running",
            "hostIP": self.ip.to_string(),
            "podIP": self.ip.to_string(),
            "podIPs": [{"ip": self.ip.to_string()}],
            "startTime": self.started,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": self.started},
                {"type": "Initialized", "status": "True", "lastTransitionTime": self.started},
                {"type": "ContainersReady", "status": ready_str, "lastTransitionTime": since},
                {"type": "Ready", "status": ready_str, "lastTransitionTime": since},
            ],
            "containerStatuses": containers,
        })
    }
}

impl ContainerRun {
    fn status(&self) -> serde_json::Value {
        let pid = self.child.as_ref().and_then(Child::id).unwrap_or(0);
        let state = match (&self.child, &self.restart_at) {
            (Some(_), _) => json!({"running": {"startedAt": self.started_at}}),
            (None, Some((_, why, _))) => {
                json!({"waiting": {"reason": "CrashLoopBackOff", "message": why}})
            }
            (None, None) => json!({"waiting": {"reason": "ContainerCreating"}}),
        };
        let mut s = json!({
            "name": self.plan.name,
            "image": self.plan.image,
            "imageID": format!("fake-kubelet://{}", self.plan.image),
            "containerID": format!("fake-kubelet://{pid}"),
            "ready": self.ready,
            "started": self.child.is_some(),
            "restartCount": self.restarts,
            "state": state,
        });
        if let Some((code, at)) = &self.last_exit {
            s["lastState"] =
                json!({"terminated": {"exitCode": code, "reason": "Error", "finishedAt": at}});
        }
        s
    }
}

/// The watch loop's own state (owned by its task).
struct Kubelet {
    client: kube::Client,
    opts: KubeletOptions,
    state: Arc<State>,
    probe: reqwest::Client,
    /// The client of preStop hooks (no timeout of its own: the pod's grace bounds them).
    hooks: reqwest::Client,
    /// The cluster-DNS hosts file, when [`KubeletOptions::cluster_dns`].
    hosts: Option<PathBuf>,
    /// Pods that could not start yet (a missing Secret key, no free address): retried.
    pending: HashMap<String, (Pod, Instant)>,
    /// Ticks so far (Secret volumes sync every [`VOLUME_SYNC_TICKS`]).
    ticks: u64,
}

impl Kubelet {
    async fn run(mut self) {
        let api: Api<Pod> = match &self.opts.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let mut cfg = watcher::Config::default();
        if let Some(sel) = &self.opts.label_selector {
            cfg = cfg.labels(sel);
        }
        let mut events = watcher(api, cfg).boxed();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                ev = events.next() => match ev {
                    Some(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))) => self.on_pod(pod).await,
                    Some(Ok(watcher::Event::Delete(pod))) => self.on_gone(&pod).await,
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "fake kubelet: pod watch failed; retrying");
                        lock(&self.state.problems).insert("(pod watch)".into(), format!("{e:#}"));
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    None => return,
                },
                _ = tick.tick() => self.on_tick().await,
            }
        }
    }

    async fn on_pod(&mut self, pod: Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let ours = lock(&self.state.pods).contains_key(&uid);
        self.state.note(format!(
            "pod {ns}/{name}: node {node:?}, phase {:?}, deleting {}, ours {ours}",
            pod.status.as_ref().and_then(|s| s.phase.clone()),
            pod.metadata.deletion_timestamp.is_some()
        ));
        if pod.metadata.deletion_timestamp.is_some() {
            self.pending.remove(&uid);
            if ours || node.as_deref() == Some(self.opts.node_name.as_str()) {
                let grace = pod
                    .metadata
                    .deletion_grace_period_seconds
                    .and_then(|s| u64::try_from(s).ok())
                    .map_or(DEFAULT_GRACE, Duration::from_secs);
                self.terminate(&ns, &name, &uid, grace);
            }
            return;
        }
        if ours || node.is_some() {
            return;
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            return;
        }
        self.pending.remove(&uid);
        if let Err(e) = self.start_pod(&pod).await {
            tracing::warn!(pod = %format!("{ns}/{name}"), error = %format!("{e:#}"), "fake kubelet: pod not started; retrying");
            self.pending
                .insert(uid, (pod, Instant::now() + Duration::from_secs(1)));
        }
    }

    async fn on_gone(&mut self, pod: &Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.pending.remove(&uid);
        let run = lock(&self.state.pods).remove(&uid);
        if let Some(run) = run {
            run.stop(Duration::from_millis(500)).await;
        }
    }

    /// Terminates the pod as a kubelet does ([`PodRun::terminate`]) in a task of its own, so
    /// other pods keep being served meanwhile, then confirms the deletion. Once per pod.
    fn terminate(&mut self, ns: &str, name: &str, uid: &str, grace: Duration) {
        if !lock(&self.state.terminating).insert(uid.to_string()) {
            return;
        }
        let run = lock(&self.state.pods).remove(uid);
        let (client, state, hooks) = (
            self.client.clone(),
            Arc::clone(&self.state),
            self.hooks.clone(),
        );
        let (ns, name, uid) = (ns.to_string(), name.to_string(), uid.to_string());
        state.note(format!(
            "pod {ns}/{name}: terminating (grace {} s)",
            grace.as_secs()
        ));
        tokio::spawn(async move {
            if let Some(run) = run {
                let what = run.terminate(grace, &hooks).await;
                state.note(format!("pod {ns}/{name}: {what}"));
            }
            let api: Api<Pod> = Api::namespaced(client, &ns);
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            if let Err(e) = api.delete(&name, &dp).await
                && !is_gone(&e)
            {
                tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "fake kubelet: confirming deletion failed");
            }
            lock(&state.terminating).remove(&uid);
        });
    }

    async fn start_pod(&mut self, pod: &Pod) -> anyhow::Result<()> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let keys = self.fetch_keys(&ns, pod).await?;
        let kubeconfig = self.service_account_kubeconfig(&ns, pod).await?;
        let pod_dir = self.opts.log_dir.join(format!("{ns}_{name}"));
        let mut mounted = Vec::new();
        let mut mount_paths = Vec::new();
        for vol in volumes::secret_volumes(pod) {
            let dir = pod_dir.join("volumes").join(&vol.volume);
            let data = self.secret_data(&ns, &vol.secret).await?;
            let files = volumes::files(&vol, data.as_ref())?;
            volumes::write_dir(&dir, &files)
                .with_context(|| format!("write volume {}", dir.display()))?;
            for path in &vol.mount_paths {
                mount_paths.push((path.clone(), dir.clone()));
            }
            mounted.push((vol, dir));
        }
        // Mount roots map to local directories holding a link per mount, so a flag that
        // names the parent of several mounts finds each of them.
        let layout = volumes::mount_layout(&mount_paths, &pod_dir);
        volumes::make_links(&layout).with_context(|| format!("link the mounts of {ns}/{name}"))?;
        let mount_rewrites = layout.rewrites.clone();
        let mut rewrites = layout.rewrites;
        rewrites.extend(lock(&self.state.rewrites).iter().cloned());
        let (ip, mut plan) = match self.plan(pod, &keys, &rewrites) {
            Ok(v) => v,
            Err(Unrunnable::Never(why)) => {
                tracing::warn!(pod = %format!("{ns}/{name}"), %why, "fake kubelet: pod left Pending");
                let status = json!({"status": {"phase": "Pending", "conditions": [{
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": format!("fake kubelet: {why}"), "lastTransitionTime": now(),
                }]}});
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .with_context(|| format!("report {ns}/{name} unschedulable"))?;
                return Ok(());
            }
            Err(Unrunnable::NotYet(e)) => return Err(e),
        };
        let binding = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": ns},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.opts.node_name},
        });
        api.create_subresource::<_, serde_json::Value>(
            "binding",
            &name,
            &PostParams::default(),
            &binding,
        )
        .await
        .with_context(|| format!("bind {ns}/{name} to {}", self.opts.node_name))?;
        if let Some(kc) = kubeconfig {
            for c in &mut plan.containers {
                c.env.push(("KUBECONFIG".to_string(), kc.clone()));
            }
        }
        // Pod networking: on a real node a pod's connections leave from its pod IP, which the
        // router checks against discovery for mTLS streams. Here every process shares the
        // host's loopback, so the sidecar is told to bind its router connections to the pod's
        // 127.x address (an env var only the sidecar reads).
        for c in &mut plan.containers {
            if !c
                .env
                .iter()
                .any(|(k, _)| k == "KVROUTE_SIDECAR_ROUTER_SOURCE_IP")
            {
                c.env.push((
                    "KVROUTE_SIDECAR_ROUTER_SOURCE_IP".to_string(),
                    ip.to_string(),
                ));
            }
        }
        let dir = self.opts.log_dir.join(format!("{ns}_{name}"));
        let mut containers = Vec::with_capacity(plan.containers.len());
        for c in plan.containers {
            let log = dir.join(format!("{}.log", c.name));
            let mut run = ContainerRun {
                plan: c,
                child: None,
                log,
                started_at: now(),
                restarts: 0,
                ready: false,
                restart_at: None,
                last_exit: None,
            };
            self.spawn_container(&ns, &name, &mut run);
            containers.push(run);
        }
        let started = now();
        tracing::info!(pod = %format!("{ns}/{name}"), %ip, "fake kubelet: pod started");
        self.state.note(format!("pod {ns}/{name}: started on {ip}"));
        let run = PodRun {
            namespace: ns,
            name,
            ip,
            ready_since: (false, started.clone()),
            started,
            containers,
            reported: None,
            volumes: mounted,
            mount_rewrites,
        };
        lock(&self.state.pods).insert(uid, run);
        Ok(())
    }

    /// The `KUBECONFIG` of the pod's processes in service-account mode (`None` otherwise).
    async fn service_account_kubeconfig(
        &self,
        ns: &str,
        pod: &Pod,
    ) -> anyhow::Result<Option<String>> {
        let Some(auth) = &self.opts.service_accounts else {
            return Ok(None);
        };
        let spec = pod.spec.as_ref();
        if spec.and_then(|s| s.automount_service_account_token) == Some(false) {
            return Ok(Some(
                auth.dir
                    .join("no-service-account-token")
                    .display()
                    .to_string(),
            ));
        }
        let sa = spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".to_string());
        let token = super::cluster::service_account_token(&self.client, ns, &sa).await?;
        let path = super::cluster::write_token_kubeconfig(auth, ns, &sa, &token)?;
        Ok(Some(path.display().to_string()))
    }

    fn spawn_container(&self, ns: &str, pod: &str, run: &mut ContainerRun) {
        let mut env = run.plan.env.clone();
        // The pod's own variables (and its service account's KUBECONFIG) win over the
        // harness-wide ones, as nothing else would set them in a real pod.
        env.extend(
            self.opts
                .env
                .iter()
                .filter(|(k, _)| !run.plan.env.iter().any(|(pk, _)| pk == k))
                .cloned(),
        );
        let opts = SpawnOptions {
            env,
            log: Some(run.log.clone()),
        };
        let label = format!("{ns}/{pod}/{}", run.plan.name);
        let spawned = match &self.hosts {
            None => match &run.plan.program {
                Program::Kvroute(sub) => procs::spawn_kvroute(&label, sub, &run.plan.args, &opts),
                Program::Exec(program) => {
                    procs::spawn(&label, Path::new(program), &run.plan.args, &opts)
                }
            },
            Some(hosts) => dns::command(hosts, &run.plan.program, &run.plan.args).and_then(
                |(program, args)| procs::spawn(&label, Path::new(&program), &args, &opts),
            ),
        };
        match spawned {
            Ok(child) => {
                if let (Some(reaper), Some(pid)) = (&self.opts.reaper, child.id()) {
                    reaper.register(pid);
                }
                run.child = Some(child);
                run.started_at = now();
                run.restart_at = None;
            }
            Err(e) => {
                let why = format!("{e:#}");
                tracing::warn!(container = %label, error = %why, "fake kubelet: cannot start container");
                run.restart_at = Some((Instant::now() + MAX_BACKOFF, why, 0));
            }
        }
    }

    /// Picks a loopback address whose ports are free and plans the pod for it.
    fn plan(
        &self,
        pod: &Pod,
        keys: &BTreeMap<KeyRef, String>,
        rewrites: &[(String, String)],
    ) -> Result<(Ipv4Addr, PodPlan), Unrunnable> {
        let mut last_busy = None;
        for _ in 0..64 {
            let ip = next_pod_ip();
            let facts = PodFacts {
                name: pod.metadata.name.clone().unwrap_or_default(),
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                ip,
                node_name: self.opts.node_name.clone(),
            };
            let plan = match podspec::plan_pod(pod, &facts, keys, rewrites) {
                Ok(p) => p,
                Err(e @ podspec::PlanError::MissingKey { .. }) => {
                    return Err(Unrunnable::NotYet(e.into()));
                }
                Err(e) => return Err(Unrunnable::Never(e.to_string())),
            };
            match plan
                .ports
                .iter()
                .find(|p| TcpListener::bind(SocketAddr::new(IpAddr::V4(ip), **p)).is_err())
            {
                Some(busy) => last_busy = Some(format!("{ip}:{busy}")),
                None => return Ok((ip, plan)),
            }
        }
        Err(Unrunnable::NotYet(anyhow::anyhow!(
            "no loopback address with all the pod's ports free (last busy: {})",
            last_busy.unwrap_or_default()
        )))
    }

    async fn fetch_keys(&self, ns: &str, pod: &Pod) -> anyhow::Result<BTreeMap<KeyRef, String>> {
        let mut out = BTreeMap::new();
        for r in podspec::key_refs(pod) {
            let value = match r.kind {
                "Secret" => {
                    let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
                    let s = api.get_opt(&r.name).await?;
                    s.and_then(|s| s.data).and_then(|d| {
                        d.get(&r.key)
                            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                    })
                }
                _ => {
                    let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
                    let c = api.get_opt(&r.name).await?;
                    c.and_then(|c| c.data).and_then(|d| d.get(&r.key).cloned())
                }
            };
            if let Some(v) = value {
                out.insert(r, v);
            }
        }
        Ok(out)
    }

    /// A Secret's data (`None` when it does not exist).
    async fn secret_data(
        &self,
        ns: &str,
        name: &str,
    ) -> anyhow::Result<Option<BTreeMap<String, Vec<u8>>>> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        let s = api
            .get_opt(name)
            .await
            .with_context(|| format!("get Secret {ns}/{name}"))?;
        Ok(s.map(|s| {
            s.data
                .into_iter()
                .flatten()
                .map(|(k, v)| (k, v.0))
                .collect()
        }))
    }

    /// Re-reads every mounted Secret and swaps in a new version of the volumes that changed,
    /// as kubelet's sync does. A Secret that went missing empties an optional volume and
    /// leaves a required one as it was.
    async fn sync_volumes(&self) {
        let targets: Vec<(String, String, SecretVolume, PathBuf)> = {
            let pods = lock(&self.state.pods);
            pods.values()
                .flat_map(|p| {
                    p.volumes
                        .iter()
                        .map(|(v, d)| (p.namespace.clone(), p.name.clone(), v.clone(), d.clone()))
                })
                .collect()
        };
        for (ns, pod, vol, dir) in targets {
            let files = match self.secret_data(&ns, &vol.secret).await {
                Ok(data) => volumes::files(&vol, data.as_ref()),
                Err(e) => {
                    tracing::debug!(error = %format!("{e:#}"), "fake kubelet: volume sync");
                    continue;
                }
            };
            match files.map(|f| volumes::write_dir(&dir, &f)) {
                Ok(Ok(true)) => self
                    .state
                    .note(format!("pod {ns}/{pod}: volume {} updated", vol.volume)),
                Ok(Ok(false)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(pod = %format!("{ns}/{pod}"), error = %e, "fake kubelet: writing volume failed")
                }
                Err(e) => {
                    tracing::debug!(pod = %format!("{ns}/{pod}"), error = %e, "fake kubelet: volume not synced")
                }
            }
        }
    }

    async fn on_tick(&mut self) {
        self.ticks = self.ticks.wrapping_add(1);
        if self.ticks.is_multiple_of(VOLUME_SYNC_TICKS) {
            self.sync_volumes().await;
        }
        if let Some(hosts) = &self.hosts
            && self.ticks.is_multiple_of(DNS_SYNC_TICKS)
            && let Err(e) = dns::sync(&self.client, self.opts.namespace.as_deref(), hosts).await
        {
            // Like cluster DNS during an API outage: the last answers stay.
            tracing::debug!(error = %format!("{e:#}"), "fake kubelet: cluster DNS not synced");
        }
        // Retry pods that could not start.
        let due: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, (_, at))| *at <= Instant::now())
            .map(|(k, _)| k.clone())
            .collect();
        for uid in due {
            if let Some((pod, _)) = self.pending.remove(&uid) {
                self.on_pod(pod).await;
            }
        }
        self.restart_exited();
        self.probe_all().await;
        self.report().await;
    }

    /// Notices exited containers and restarts those whose backoff has passed.
    fn restart_exited(&self) {
        let mut pods = lock(&self.state.pods);
        for pod in pods.values_mut() {
            let (ns, name) = (pod.namespace.clone(), pod.name.clone());
            for c in &mut pod.containers {
                if let Some(child) = &mut c.child
                    && let Ok(Some(status)) = child.try_wait()
                {
                    let tail = child.log_tail(15);
                    let why = format!(
                        "{} exited ({status}); log {}:\n{tail}",
                        c.plan.name,
                        c.log.display()
                    );
                    tracing::warn!(pod = %format!("{ns}/{name}"), container = %c.plan.name, %status, "fake kubelet: container exited; restarting with backoff");
                    c.last_exit = Some((status.code().unwrap_or(-1), now()));
                    c.child = None;
                    c.ready = false;
                    let backoff =
                        Duration::from_millis(250 << c.restarts.clamp(0, 5)).min(MAX_BACKOFF);
                    c.restart_at = Some((Instant::now() + backoff, why, c.restarts + 1));
                }
                if c.child.is_none()
                    && let Some((at, _, restarts)) = &c.restart_at
                    && *at <= Instant::now()
                {
                    c.restarts = *restarts;
                    self.spawn_container(&ns, &name, c);
                }
            }
        }
    }

    async fn probe_all(&self) {
        let targets: Vec<(String, usize, Ipv4Addr, Readiness)> = {
            let pods = lock(&self.state.pods);
            pods.iter()
                .flat_map(|(uid, p)| {
                    p.containers
                        .iter()
                        .enumerate()
                        .filter(|(_, c)| c.child.is_some())
                        .map(move |(i, c)| (uid.clone(), i, p.ip, c.plan.readiness.clone()))
                })
                .collect()
        };
        let results =
            futures::future::join_all(targets.into_iter().map(|(uid, i, ip, r)| async move {
                let ok =
                    match r {
                        Readiness::Running => true,
                        Readiness::Tcp { port } => {
                            let addr = SocketAddr::new(IpAddr::V4(ip), port);
                            matches!(
                                tokio::time::timeout(
                                    PROBE_TIMEOUT,
                                    tokio::net::TcpStream::connect(addr)
                                )
                                .await,
                                Ok(Ok(_))
                            )
                        }
                        Readiness::Http { port, path } => {
                            let url = format!("http://{ip}:{port}{path}");
                            self.probe.get(&url).send().await.is_ok_and(|r| {
                                r.status().is_success() || r.status().is_redirection()
                            })
                        }
                    };
                (uid, i, ok)
            }))
            .await;
        let mut pods = lock(&self.state.pods);
        for (uid, i, ok) in results {
            if let Some(c) = pods.get_mut(&uid).and_then(|p| p.containers.get_mut(i))
                && c.child.is_some()
            {
                c.ready = ok;
            }
        }
    }

    /// Patches the status of every pod whose status changed.
    async fn report(&self) {
        let changed: Vec<(String, String, String, serde_json::Value)> = {
            let mut pods = lock(&self.state.pods);
            pods.iter_mut()
                .filter_map(|(uid, p)| {
                    let status = p.status();
                    (p.reported.as_ref() != Some(&status))
                        .then(|| (uid.clone(), p.namespace.clone(), p.name.clone(), status))
                })
                .collect()
        };
        for (uid, ns, name, status) in changed {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            match api
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"status": status})),
                )
                .await
            {
                Ok(_) => {
                    if let Some(p) = lock(&self.state.pods).get_mut(&uid) {
                        p.reported = Some(status);
                    }
                }
                Err(e) if is_gone(&e) => {}
                Err(e) => {
                    tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "fake kubelet: status patch failed")
                }
            }
        }
    }
}

enum Unrunnable {
    /// The pod can never run here (reported as unschedulable).
    Never(String),
    /// It may run later (retried).
    NotYet(anyhow::Error),
}

fn is_gone(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404 || s.code == 409)
}

/// Now as an RFC 3339 timestamp with whole seconds (what Kubernetes stores).
fn now() -> String {
    let secs = k8s_openapi::jiff::Timestamp::now().as_second();
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Next pod address: 127.A.B.C with A derived from the process id, so concurrent test
/// binaries on one machine rarely try the same addresses (ports are checked anyway).
fn next_pod_ip() -> Ipv4Addr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let a = 20 + (std::process::id() % 200) as u8;
    let b = ((n / 250) % 256) as u8;
    let c = (n % 250) as u8 + 2;
    Ipv4Addr::new(127, a, b, c)
}

/// Creates (or updates) the fake Node with a Ready condition.
async fn ensure_node(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let pp = PatchParams::apply("kvroute-e2e-fake-kubelet").force();
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kvroute.dev/fake-kubelet": "true"}},
    });
    api.patch(name, &pp, &Patch::Apply(&node))
        .await
        .with_context(|| format!("create fake node {name}"))?;
    let t = now();
    let status = json!({"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kvroute e2e fake kubelet", "lastHeartbeatTime": t, "lastTransitionTime": t}],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
        "capacity": {"cpu": "16", "memory": "64Gi", "pods": "250"},
        "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "250"},
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("report fake node {name} ready"))?;
    Ok(())
}

/// The kubelet's stand-in for cluster DNS (see the module's "Cluster DNS").
mod dns {
    use std::path::{Path, PathBuf};

    use anyhow::Context;
    use k8s_openapi::api::core::v1::Service;
    use kube::api::{Api, ListParams};

    use super::Program;
    use crate::harness::endpoints::{endpoint_slices, ready_addresses};
    use crate::procs;

    /// Creates the hosts file (a copy of this machine's `/etc/hosts`, so `localhost` still
    /// resolves) and checks that a process can see it as its `/etc/hosts`.
    pub(super) async fn prepare(dir: &Path, node: &str) -> anyhow::Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let hosts = dir.join(format!("hosts-{node}"));
        std::fs::write(&hosts, base())?;
        let out = tokio::process::Command::new("unshare")
            .args(["-rm", "sh", "-c", MOUNT_AND_EXEC])
            .arg(&hosts)
            .args(["true"])
            .output()
            .await
            .context("run unshare (util-linux) for the fake cluster DNS")?;
        anyhow::ensure!(
            out.status.success(),
            "the fake cluster DNS needs unprivileged user namespaces (`unshare -rm`): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(hosts)
    }

    /// Bind-mounts `$0` over `/etc/hosts`, then becomes the container's process (same pid).
    const MOUNT_AND_EXEC: &str = r#"mount --bind "$0" /etc/hosts && exec "$@""#;

    fn base() -> String {
        let mut s = std::fs::read_to_string("/etc/hosts")
            .unwrap_or_else(|_| "127.0.0.1 localhost\n".into());
        if !s.ends_with('\n') {
            s.push('\n');
        }
        s + "# fake cluster DNS (kvroute e2e kubelet)\n"
    }

    /// The program and arguments that run `program args` with the hosts file as `/etc/hosts`.
    pub(super) fn command(
        hosts: &Path,
        program: &Program,
        args: &[String],
    ) -> anyhow::Result<(String, Vec<String>)> {
        let mut full = vec![
            "-rm".to_string(),
            "sh".to_string(),
            "-c".to_string(),
            MOUNT_AND_EXEC.to_string(),
            hosts.display().to_string(),
        ];
        match program {
            Program::Kvroute(sub) => {
                full.push(procs::kvroute_exe()?.display().to_string());
                full.push(sub.clone());
            }
            Program::Exec(p) => full.push(p.clone()),
        }
        full.extend(args.iter().cloned());
        Ok(("unshare".to_string(), full))
    }

    /// Rewrites the hosts file from the headless Services' EndpointSlices (in place, so the
    /// bind mounts see it, and only when it changed).
    pub(super) async fn sync(
        client: &kube::Client,
        namespace: Option<&str>,
        hosts: &Path,
    ) -> anyhow::Result<()> {
        let services: Api<Service> = match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let services = services.list(&ListParams::default()).await?.items;
        let slices = endpoint_slices(client, namespace).await?;
        let text = base() + &records(&services, &slices);
        if std::fs::read_to_string(hosts).ok().as_deref() != Some(text.as_str()) {
            std::fs::write(hosts, text)?;
        }
        Ok(())
    }

    /// `/etc/hosts` lines for every headless Service: each ready address (all of them when the
    /// Service publishes not-ready addresses, which the slice controller then marks ready),
    /// under `<svc>.<ns>.svc` and `<svc>.<ns>.svc.cluster.local`.
    pub(super) fn records(services: &[Service], slices: &[serde_json::Value]) -> String {
        let mut out = String::new();
        for svc in services {
            let (Some(name), Some(ns)) = (&svc.metadata.name, &svc.metadata.namespace) else {
                continue;
            };
            let headless = svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None");
            if !headless {
                continue;
            }
            for ip in ready_addresses(slices, ns, name) {
                out += &format!("{ip} {name}.{ns}.svc {name}.{ns}.svc.cluster.local\n");
            }
        }
        out
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn only_headless_services_get_records_one_line_per_address() {
            let services: Vec<Service> = serde_json::from_value(serde_json::json!([
                {"metadata": {"name": "ingest", "namespace": "a"}, "spec": {"clusterIP": "None"}},
                {"metadata": {"name": "web", "namespace": "a"}, "spec": {"clusterIP": "10.0.0.9"}},
            ]))
            .expect("services");
            let slice = |svc: &str, ips: &[&str]| {
                serde_json::json!({"metadata": {"namespace": "a",
                    "labels": {"kubernetes.io/service-name": svc}},
                    "endpoints": ips.iter().map(|ip| serde_json::json!({"addresses": [ip]})).collect::<Vec<_>>()})
            };
            let endpoints = vec![
                slice("ingest", &["127.9.0.3", "127.9.0.2"]),
                slice("web", &["127.9.0.5"]),
            ];
            assert_eq!(
                records(&services, &endpoints),
                "127.9.0.2 ingest.a.svc ingest.a.svc.cluster.local\n\
                 127.9.0.3 ingest.a.svc ingest.a.svc.cluster.local\n"
            );
        }
    }
}
