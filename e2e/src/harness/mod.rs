//! The Kubernetes e2e harness: a real API server, the operator as a process, and a fake kubelet
//! that runs mock-worker pods as local processes.
//!
//! ```text
//! Cluster (etcd + kube-apiserver + kube-controller-manager, free ports, temp dir)
//!   |-- install_crds(crds/*.yaml)
//!   |-- OperatorProcess       `kvroute operator` as its service account with deploy/'s RBAC
//!   |                         (install.rs), or deploy/operator.yaml's Deployment, run by
//!   |                         the FakeKubelet (k8s_rbac_audit.rs)
//!   `-- FakeKubelet           Pods -> `kvroute mock-vllm` + `kvroute sidecar` (+ `router`,
//!                             `operator`) on 127.A.B.C,
//!                             Pod status Running/Ready, a fake Node, Secret volumes
//!                             as local directories (volumes.rs), kept in sync
//! ```
//!
//! Typical test (one shared API server per test binary, one namespace per test):
//!
//! ```no_run
//! # async fn t() -> anyhow::Result<()> {
//! use kvroute_e2e::harness::{Cluster, TestNamespace};
//! let cluster = Cluster::shared().await?;
//! let env = TestNamespace::new(cluster, "scale").await?; // namespace + fake kubelet for it
//! // create a WorkerSet in env.ns with env.client, wait for env.kubelet.running() ...
//! # Ok(()) }
//! ```
//!
//! Reaching a process outside the cluster from a pod (e.g. a router started by the test): the
//! fake kubelet rewrites wildcard and loopback hosts in args/env to the pod's own address, so
//! name the target by its Service DNS name (the operator's default for sidecars is
//! `kvroute-router-ingest.<router namespace>.svc:<port>`) and map it before the pods start:
//! `env.kubelet.rewrite("kvroute-router-ingest.default.svc:9000", "127.0.0.1:<router port>")`
//! (rewrites apply after the loopback rewriting). Pods are found by the router through their
//! `status.podIP` (127.A.B.C) and the container ports of the spec, which the processes bind.
//!
//! Everything started here dies with the test: children are killed on drop (also when a test
//! panics), and the shared cluster's watchdog kills what remains when the test binary exits.

mod cluster;
pub mod endpoints;
pub mod install;
mod kubelet;
mod operator;
pub mod podspec;
pub mod volumes;

use std::time::Duration;

pub use cluster::{
    Cluster, ClusterOptions, Reaper, check_binaries, check_binaries_in, crds_dir, gie_crd_path,
    install_crds, install_gie_crd, k8s_bin_dir, service_account_token,
};
pub use kubelet::{FakeKubelet, KubeletOptions, RunningPod, ServiceAccountAuth};
pub use operator::{OperatorProcess, shared_operator};

/// Where the images keep the Qwen3 tokenizer (bundle/images/mock-vllm.Dockerfile).
pub const IMAGE_TOKENIZERS: &str = "/opt/kvroute/tokenizers";

/// `rel` in this repository's checkout.
pub fn repo_path(rel: &str) -> String {
    format!("{}/../{rel}", env!("CARGO_MANIFEST_DIR"))
}

/// Kubelet options for running the operator's router and mock workers in `namespace`: the
/// router downloads its tokenizer from a local stand-in for the Hugging Face Hub (returned;
/// it serves `testdata/tokenizers/qwen3` while it lives; a stalled download is retried after
/// 20 s), its Hub cache `hf_home` (the
/// image's path, `kvroute_operator::desired::router::HF_HOME`) is a scratch directory, and
/// the images' [`IMAGE_TOKENIZERS`] is the checkout's `testdata/tokenizers`.
pub async fn router_pod_options(
    cluster: &Cluster,
    namespace: &str,
    hf_home: &str,
) -> anyhow::Result<(kvroute_router::fake_hub::FakeHub, KubeletOptions)> {
    use kvroute_router::fake_hub::{FakeHub, FakeHubConfig};
    let hub = FakeHub::start(FakeHubConfig {
        files: repo_path("testdata/tokenizers/qwen3").into(),
        public: None,
        gated: Vec::new(),
    })
    .await?;
    let cache = cluster.dir().join(format!("hf-{namespace}"));
    std::fs::create_dir_all(&cache)?;
    let mut opts = kubelet_options(cluster, namespace);
    opts.env
        .push(("HF_ENDPOINT".to_string(), hub.endpoint.clone()));
    // A download that stalls is retried well within the tests' waits (default 300 s).
    opts.env.push((
        "KVROUTE_ROUTER_TOKENIZER_FETCH_TIMEOUT_S".to_string(),
        "20".to_string(),
    ));
    opts.rewrites.push((
        IMAGE_TOKENIZERS.to_string(),
        repo_path("testdata/tokenizers"),
    ));
    opts.rewrites
        .push((hf_home.to_string(), cache.display().to_string()));
    Ok((hub, opts))
}

/// The sum of the series `name{labels}` (labels as written by the exporter, e.g.
/// `reason="missing"`, comma-separated; empty for none) in a Prometheus text page; 0 when
/// absent.
pub fn metric_sum(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            let (n, l) = series
                .split_once('{')
                .map_or((*series, ""), |(n, l)| (n, l.trim_end_matches('}')));
            n == name
                && labels
                    .split(',')
                    .all(|want| want.is_empty() || l.contains(want))
        })
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum()
}

/// Options for a fake kubelet serving one namespace of `cluster`.
pub fn kubelet_options(cluster: &Cluster, namespace: &str) -> KubeletOptions {
    KubeletOptions {
        namespace: Some(namespace.to_string()),
        label_selector: None,
        node_name: format!("fake-node-{namespace}"),
        log_dir: cluster.dir().join("pods"),
        env: vec![
            (
                "KUBECONFIG".to_string(),
                cluster.kubeconfig().display().to_string(),
            ),
            (
                "RUST_LOG".to_string(),
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            ),
        ],
        rewrites: Vec::new(),
        reaper: Some(cluster.reaper()),
        service_accounts: None,
        cluster_dns: false,
    }
}

/// A namespace of its own on a cluster, a client for the current runtime, and a fake kubelet
/// running that namespace's pods.
pub struct TestNamespace {
    /// Client bound to the current tokio runtime.
    pub client: kube::Client,
    /// The namespace's name.
    pub ns: String,
    /// The fake kubelet for `ns`.
    pub kubelet: FakeKubelet,
}

impl TestNamespace {
    /// Creates namespace `<prefix>-<n>` and starts its fake kubelet.
    pub async fn new(cluster: &Cluster, prefix: &str) -> anyhow::Result<Self> {
        let client = cluster.client().await?;
        let ns = cluster.namespace(&client, prefix).await?;
        let kubelet = FakeKubelet::start(client.clone(), kubelet_options(cluster, &ns)).await?;
        Ok(Self {
            client,
            ns,
            kubelet,
        })
    }

    /// Stops the kubelet's processes gracefully.
    pub async fn stop(self) {
        self.kubelet.stop(Duration::from_secs(2)).await;
    }
}

impl TestNamespace {
    /// A readable dump of the namespace for failure messages: kvroute resources' status,
    /// Deployments, pods (phase, conditions, container states) and the fake kubelet's view.
    pub async fn describe(&self) -> String {
        use k8s_openapi::api::apps::v1::Deployment;
        use k8s_openapi::api::core::v1::Pod;
        use kube::api::{Api, ListParams};
        let mut out = format!("--- namespace {} ---\n", self.ns);
        let lp = ListParams::default();
        let sets: Api<kvroute_crds::workerset::InferenceWorkerSet> =
            Api::namespaced(self.client.clone(), &self.ns);
        match sets.list(&lp).await {
            Ok(list) => {
                for ws in list.items {
                    let status = serde_json::to_string(&ws.status).unwrap_or_default();
                    out += &format!(
                        "iws/{}: gen {:?} status {status}\n",
                        ws.metadata.name.unwrap_or_default(),
                        ws.metadata.generation
                    );
                }
            }
            Err(e) => out += &format!("list WorkerSets: {e}\n"),
        }
        let deploys: Api<Deployment> = Api::namespaced(self.client.clone(), &self.ns);
        if let Ok(list) = deploys.list(&lp).await {
            for d in list.items {
                let status = serde_json::to_string(&d.status).unwrap_or_default();
                out += &format!("deploy/{}: {status}\n", d.metadata.name.unwrap_or_default());
            }
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        if let Ok(list) = pods.list(&lp).await {
            for p in list.items {
                let status = serde_json::to_string(&p.status).unwrap_or_default();
                out += &format!("pod/{}: {status}\n", p.metadata.name.unwrap_or_default());
            }
        }
        out += &format!("fake kubelet: running {:?}\n", self.kubelet.running());
        for line in self.kubelet.journal() {
            out += &format!("fake kubelet: {line}\n");
        }
        for (pod, why) in self.kubelet.problems() {
            out += &format!("fake kubelet: {pod} not started: {why}\n");
        }
        out
    }
}
