//! Worker discovery: which workers exist, where they listen, which models and aliases the
//! pools expose. Two sources feed the same pure function, [`build_catalog`]:
//!
//! ```text
//! --config FILE (multi-doc YAML, the CRD documents) --static_file--+
//!                                                                  +--> build_catalog --> RouterState::set_catalog
//! --kubernetes (watch WorkerSets, Pools, Pods) ------kubernetes---+
//! ```
//!
//! Workers come from different places per source:
//! - **Static file**: an InferenceWorkerSet lists its workers in `status.workers` (`pod`,
//!   `address`, `ready`; the same shape the operator writes in Kubernetes). The worker id is
//!   `<namespace>/<pod>` (namespace `default` when the document has none); a sidecar must
//!   report the same id (or the same address) for its reports to count for that worker.
//! - **Kubernetes**: the Pods of each WorkerSet (label `kvroute.dev/workerset=<name>`, as the operator sets it); a pod
//!   is ready when its `Ready` condition is true; the address is `<podIP>:<engine port>`.
//!
//! Each worker also carries its WorkerSet's namespace and, when known, its pod IP (Kubernetes:
//! the pod's IP; static file: the IP literal of `address`): with mTLS the router accepts a
//! sidecar stream for a worker only from its WorkerSet's identity and that IP
//! ([`crate::auth`]).
//!
//! Either way a worker becomes routable only once its sidecar has reported a snapshot (see
//! [`crate::state`]). Both sources also publish each model's tokenizer source
//! ([`tokenizers::build_tokenizer_plan`]) for the tokenizer loader.

pub mod gie;
pub mod kubernetes;
pub mod policies;
pub mod providers;
pub mod static_file;
pub mod tokenizers;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kvroute_crds::{InferencePool, InferenceWorkerSet};

use crate::state::{Catalog, DiscoveredWorker, PoolView, ServedModel, WorkerOrigin};

/// Label the operator puts on every worker pod: the name of its InferenceWorkerSet.
pub const WORKER_SET_LABEL: &str = "kvroute.dev/workerset";

/// A worker pod as discovery sees it (Kubernetes mode).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodView {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Its WorkerSet (from [`WORKER_SET_LABEL`]).
    pub worker_set: String,
    /// Pod IP, when assigned.
    pub ip: Option<String>,
    /// The `Ready` condition is true.
    pub ready: bool,
}

/// Where workers come from.
#[derive(Clone, Copy, Debug)]
pub enum WorkerSource<'a> {
    /// Each WorkerSet's `status.workers`.
    Status,
    /// These pods.
    Pods(&'a [PodView]),
}

/// vLLM's flag for the most tokens one engine step computes.
const MAX_BATCHED_TOKENS_FLAG: &str = "--max-num-batched-tokens";

/// The step budget (tokens) of a WorkerSet's vLLM engines, which the TTFT model's
/// whole-steps line counts in (`routing::PredictorConfig::step_budget_tokens`): its
/// `--max-num-batched-tokens` in `engine.args` (the last one, as vLLM takes it; `=` or a
/// separate value; vLLM also reads underscores), else vLLM V1's default for the GPU product
/// (8,192 on H100, H200, GH200, B200; 2,048 on the others). `None` for `engine.mode: mock`
/// (the mock's profile decides, which the router does not know) and for a flag whose value
/// is no positive whole number (the router's `--step-budget-tokens` applies then).
pub fn step_budget_tokens(spec: &kvroute_crds::InferenceWorkerSetSpec) -> Option<f64> {
    if spec.engine.mode == kvroute_crds::workerset::EngineMode::Mock {
        return None;
    }
    let mut given: Option<Option<f64>> = None;
    let mut args = spec.engine.args.iter();
    while let Some(arg) = args.next() {
        let arg = arg.replace('_', "-");
        let value = if arg == MAX_BATCHED_TOKENS_FLAG {
            args.next().cloned()
        } else if let Some(v) = arg
            .strip_prefix(MAX_BATCHED_TOKENS_FLAG)
            .and_then(|r| r.strip_prefix('='))
        {
            Some(v.to_string())
        } else {
            continue;
        };
        given = Some(
            value
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|&v| v > 0)
                .map(|v| v as f64),
        );
    }
    given.unwrap_or_else(|| {
        Some(f64::from(kvroute_crds::gpu::vllm_default_step_budget(
            &spec.gpu.product,
        )))
    })
}

fn ns(namespace: Option<&String>) -> &str {
    namespace.map_or("default", String::as_str)
}

/// Builds the router's view from WorkerSets, Pools and workers. Pure.
pub fn build_catalog(
    sets: &[InferenceWorkerSet],
    pools: &[InferencePool],
    workers: WorkerSource<'_>,
) -> Catalog {
    let mut catalog = Catalog::default();
    for set in sets {
        let namespace = ns(set.metadata.namespace.as_ref());
        let name = set.metadata.name.clone().unwrap_or_default();
        let model = set.spec.model.served().to_string();
        let step_budget = step_budget_tokens(&set.spec);
        match workers {
            WorkerSource::Status => {
                for w in set.status.iter().flat_map(|s| s.workers.iter()) {
                    let address = w.address.clone().unwrap_or_default();
                    catalog.workers.push(DiscoveredWorker {
                        id: format!("{namespace}/{}", w.pod),
                        pod_ip: address
                            .parse::<std::net::SocketAddr>()
                            .ok()
                            .map(|a| a.ip().to_canonical()),
                        address,
                        model: model.clone(),
                        worker_set: name.clone(),
                        namespace: namespace.to_string(),
                        ready: w.ready && w.address.is_some(),
                        origin: WorkerOrigin::WorkerSet,
                        step_budget_tokens: step_budget,
                    });
                }
            }
            WorkerSource::Pods(pods) => {
                let port = set.spec.engine.port;
                for p in pods
                    .iter()
                    .filter(|p| p.namespace == namespace && p.worker_set == name)
                {
                    catalog.workers.push(DiscoveredWorker {
                        id: format!("{}/{}", p.namespace, p.name),
                        address: p
                            .ip
                            .as_ref()
                            .map(|ip| format!("{ip}:{port}"))
                            .unwrap_or_default(),
                        model: model.clone(),
                        worker_set: name.clone(),
                        namespace: namespace.to_string(),
                        pod_ip: p
                            .ip
                            .as_deref()
                            .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
                            .map(|ip| ip.to_canonical()),
                        ready: p.ready && p.ip.is_some(),
                        origin: WorkerOrigin::WorkerSet,
                        step_budget_tokens: step_budget,
                    });
                }
            }
        }
    }
    for pool in pools {
        let namespace = ns(pool.metadata.namespace.as_ref());
        let mut worker_sets = Vec::new();
        for t in &pool.spec.targets {
            if let Some(name) = &t.worker_set {
                worker_sets.push(name.clone());
            }
            if let Some(sel) = &t.worker_set_selector {
                for set in sets
                    .iter()
                    .filter(|s| ns(s.metadata.namespace.as_ref()) == namespace)
                {
                    let labels = set.metadata.labels.clone().unwrap_or_default();
                    if selector_matches(sel, &labels)
                        && let Some(n) = &set.metadata.name
                    {
                        worker_sets.push(n.clone());
                    }
                }
            }
        }
        worker_sets.sort();
        worker_sets.dedup();
        let mut models: Vec<ServedModel> = Vec::new();
        for set in sets.iter().filter(|s| {
            ns(s.metadata.namespace.as_ref()) == namespace
                && s.metadata
                    .name
                    .as_ref()
                    .is_some_and(|n| worker_sets.contains(n))
        }) {
            let served = set.spec.model.served().to_string();
            if !models.iter().any(|m| m.name == served) {
                models.push(ServedModel {
                    name: served.clone(),
                    backend_model: served,
                    split: Vec::new(),
                });
            }
        }
        for alias in &pool.spec.model_aliases {
            if !models.iter().any(|m| m.name == alias.name) {
                let shares = alias.shares();
                models.push(ServedModel {
                    name: alias.name.clone(),
                    backend_model: alias.model.clone(),
                    split: if alias.split.is_empty() {
                        Vec::new()
                    } else {
                        shares
                            .into_iter()
                            .map(|(m, p)| (m.to_string(), p))
                            .collect()
                    },
                });
            }
        }
        catalog.pools.push(PoolView {
            name: format!(
                "{namespace}/{}",
                pool.metadata.name.clone().unwrap_or_default()
            ),
            models,
            worker_sets,
            auth: pool
                .spec
                .auth
                .as_ref()
                .map(|a| std::sync::Arc::new(crate::tenant::PoolAuth::from_spec(a))),
        });
    }
    catalog
}

/// Kubernetes label selector semantics (matchLabels and matchExpressions: In, NotIn,
/// Exists, DoesNotExist). An unknown operator matches nothing.
pub fn selector_matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_exprs = sel.match_expressions.iter().flatten().all(|e| {
        let values = e.values.clone().unwrap_or_default();
        match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            _ => false,
        }
    });
    by_labels && by_exprs
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_crds::{AnyResource, parse_documents};

    const DOCS: &str = r#"
apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: qwen, namespace: ml, labels: {tier: gold}}
spec:
  model: {name: Qwen/Qwen3-0.6B, servedName: qwen3}
  replicas: 2
  engine: {mode: mock, port: 8000}
status:
  replicas: 2
  readyReplicas: 1
  workers:
    - {pod: qwen-0, address: "127.0.0.1:8001", ready: true}
    - {pod: qwen-1, address: "127.0.0.1:8002", ready: false}
---
apiVersion: kvroute.dev/v1alpha1
kind: InferencePool
metadata: {name: chat, namespace: ml}
spec:
  targets:
    - workerSetSelector: {matchLabels: {tier: gold}}
  modelAliases:
    - {name: chat-default, model: qwen3}
"#;

    fn parsed() -> (Vec<InferenceWorkerSet>, Vec<InferencePool>) {
        let mut sets = Vec::new();
        let mut pools = Vec::new();
        for doc in parse_documents(DOCS).expect("parse") {
            match doc {
                AnyResource::WorkerSet(s) => sets.push(s),
                AnyResource::Pool(p) => pools.push(p),
                _ => {}
            }
        }
        (sets, pools)
    }

    #[test]
    fn static_status_workers_and_pool_aliases() {
        let (sets, pools) = parsed();
        let c = build_catalog(&sets, &pools, WorkerSource::Status);
        let ids: Vec<(&str, &str, bool)> = c
            .workers
            .iter()
            .map(|w| (w.id.as_str(), w.address.as_str(), w.ready))
            .collect();
        assert_eq!(
            ids,
            vec![
                ("ml/qwen-0", "127.0.0.1:8001", true),
                ("ml/qwen-1", "127.0.0.1:8002", false)
            ]
        );
        assert!(
            c.workers
                .iter()
                .all(|w| w.model == "qwen3" && w.worker_set == "qwen" && w.namespace == "ml")
        );
        // The IP literal of a listed address is the pod's IP (the mTLS peer check).
        assert_eq!(c.workers[0].pod_ip, Some("127.0.0.1".parse().expect("ip")));
        assert_eq!(c.pools.len(), 1);
        assert_eq!(c.pools[0].name, "ml/chat");
        assert_eq!(c.pools[0].worker_sets, vec!["qwen".to_string()]);
        let models: Vec<(&str, &str)> = c.pools[0]
            .models
            .iter()
            .map(|m| (m.name.as_str(), m.backend_model.as_str()))
            .collect();
        assert_eq!(models, vec![("qwen3", "qwen3"), ("chat-default", "qwen3")]);
    }

    #[test]
    fn the_step_budget_is_the_engine_flag_else_vllms_default_for_the_gpu() {
        let (sets, pools) = parsed();
        // A mock engine: its profile decides, which the router does not know.
        let c = build_catalog(&sets, &pools, WorkerSource::Status);
        assert!(c.workers.iter().all(|w| w.step_budget_tokens.is_none()));
        let spec = |product: &str, args: &[&str]| {
            let mut spec = sets[0].spec.clone();
            spec.engine.mode = kvroute_crds::workerset::EngineMode::Vllm;
            spec.gpu.product = product.to_string();
            spec.engine.args = args.iter().map(|a| a.to_string()).collect();
            spec
        };
        let l40s = kvroute_crds::gpu::DEFAULT_GPU_PRODUCT;
        for (product, args, want) in [
            (l40s, &[][..], Some(2_048.0)),
            ("NVIDIA-H100-80GB-HBM3", &[][..], Some(8_192.0)),
            ("NVIDIA-H200", &[][..], Some(8_192.0)),
            // 80 GB, but vLLM keeps the smaller default on A100s.
            ("NVIDIA-A100-SXM4-80GB", &[][..], Some(2_048.0)),
            (
                l40s,
                &["--max-num-batched-tokens", "4096"][..],
                Some(4_096.0),
            ),
            (
                "NVIDIA-H100-80GB-HBM3",
                &["--max_num_batched_tokens=16384"][..],
                Some(16_384.0),
            ),
            // vLLM takes the last occurrence.
            (
                l40s,
                &[
                    "--max-num-batched-tokens=1024",
                    "--enforce-eager",
                    "--max-num-batched-tokens",
                    "512",
                ][..],
                Some(512.0),
            ),
            (l40s, &["--max-num-batched-tokens", "lots"][..], None),
            (l40s, &["--max-num-batched-tokens"][..], None),
            (l40s, &["--max-num-batched-tokens=0"][..], None),
            (l40s, &["--max-num-seqs", "64"][..], Some(2_048.0)),
        ] {
            assert_eq!(
                step_budget_tokens(&spec(product, args)),
                want,
                "{product} {args:?}"
            );
        }
        // The catalog carries it to every worker of the set.
        let mut vllm = sets.clone();
        vllm[0].spec = spec("NVIDIA-H100-80GB-HBM3", &[]);
        let c = build_catalog(&vllm, &pools, WorkerSource::Status);
        assert!(
            c.workers
                .iter()
                .all(|w| w.step_budget_tokens == Some(8_192.0))
        );
    }

    #[test]
    fn pods_give_addresses_from_ip_and_engine_port() {
        let (sets, pools) = parsed();
        let pods = vec![
            PodView {
                namespace: "ml".into(),
                name: "p1".into(),
                worker_set: "qwen".into(),
                ip: Some("10.0.0.1".into()),
                ready: true,
            },
            PodView {
                namespace: "ml".into(),
                name: "p2".into(),
                worker_set: "qwen".into(),
                ip: None,
                ready: true,
            },
            PodView {
                namespace: "other".into(),
                name: "p3".into(),
                worker_set: "qwen".into(),
                ip: Some("10.0.0.3".into()),
                ready: true,
            },
        ];
        let c = build_catalog(&sets, &pools, WorkerSource::Pods(&pods));
        let ids: Vec<(&str, &str, bool)> = c
            .workers
            .iter()
            .map(|w| (w.id.as_str(), w.address.as_str(), w.ready))
            .collect();
        assert_eq!(
            ids,
            vec![("ml/p1", "10.0.0.1:8000", true), ("ml/p2", "", false)]
        );
        let ips: Vec<Option<std::net::IpAddr>> = c.workers.iter().map(|w| w.pod_ip).collect();
        assert_eq!(ips, vec![Some("10.0.0.1".parse().expect("ip")), None]);
    }

    #[test]
    fn selector_semantics() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
        let labels: BTreeMap<String, String> =
            [("a".to_string(), "1".to_string())].into_iter().collect();
        let req = |op: &str, vals: &[&str]| LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "a".into(),
                operator: op.into(),
                values: Some(vals.iter().map(|s| s.to_string()).collect()),
            }]),
            match_labels: None,
        };
        assert!(selector_matches(&req("In", &["1", "2"]), &labels));
        assert!(!selector_matches(&req("NotIn", &["1"]), &labels));
        assert!(selector_matches(&req("Exists", &[]), &labels));
        assert!(!selector_matches(&req("DoesNotExist", &[]), &labels));
        assert!(!selector_matches(&req("Bogus", &[]), &labels));
        assert!(selector_matches(&LabelSelector::default(), &labels));
    }
}
