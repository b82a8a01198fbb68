//! Workers from Gateway API Inference Extension `InferencePool`s (`inference.networking.k8s.io/v1`):
//! the pods a pool selects join the same catalog as kvroute's own WorkerSets. Pure: the
//! Kubernetes watch ([`super::kubernetes`]) and the static file ([`super::static_file`]) call
//! [`add_gie_pools`] after [`super::build_catalog`].
//!
//! ```text
//! --gie-inference-pool NAME|NS/NAME|* --> GieSelection (which pools)
//! GIE InferencePool --annotation kvroute.dev/model--> model of its workers
//!                   --selector.matchLabels--> Pods (same namespace) --> <podIP>:<targetPorts[0]>
//!     --> Catalog.workers (origin InferencePool, worker set "gie:<pool>")
//!     --> Catalog.pools   (a PoolView "gie:<ns>/<pool>" serving that model)
//! ```
//!
//! Rules (docs/gateway-api.md, "Discovery from InferencePool"):
//! - A pool without the [`MODEL_ANNOTATION`], without a valid target port or with an empty
//!   selector is skipped, logged and counted (`kvroute_router_gie_inference_pools{state}`).
//! - A pod listed by a kvroute WorkerSet keeps that identity (its sidecar reports it); a pod
//!   two GIE pools select belongs to the first by `namespace/name`.
//! - Such workers have no kvroute sidecar: the router registers them itself and routes them
//!   on its own in-flight count (no cache view) until a sidecar reports them
//!   ([`crate::state::WorkerOrigin::InferencePool`]).
//! - The pool's view is named `gie:<namespace>/<name>` and restricted to its own pods, so the
//!   endpoint picker of one pool never picks another pool's pod. A kvroute InferencePool
//!   serving the same model name comes first and wins the name.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kvroute_crds::gie::{GieInferencePool, GiePoolIssue};
use prometheus::{IntGaugeVec, Opts, Registry};

use crate::state::{Catalog, DiscoveredWorker, PoolView, ServedModel, WorkerOrigin};

pub use kvroute_crds::gie::MODEL_ANNOTATION;

/// Prefix of the worker-set name of a GIE pool's workers: `gie:<pool name>` (a colon cannot
/// be in a Kubernetes name, so it never clashes with a WorkerSet).
pub const GIE_WORKER_SET_PREFIX: &str = "gie:";

/// The name of the pool view (in [`Catalog::pools`], and `pool` of `/v1/models` and of
/// decisions) of GIE InferencePool `namespace/name`: `gie:<namespace>/<name>`. The endpoint
/// picker answering for that pool resolves it by this name.
pub fn pool_view_name(namespace: &str, name: &str) -> String {
    format!("{GIE_WORKER_SET_PREFIX}{namespace}/{name}")
}

/// The worker-set name of GIE InferencePool `name`'s workers: `gie:<name>`.
pub fn worker_set_name(name: &str) -> String {
    format!("{GIE_WORKER_SET_PREFIX}{name}")
}

/// Which GIE InferencePools this router takes workers from (`--gie-inference-pool`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GieSelection {
    all: bool,
    /// `(namespace, name)`; no namespace: that name in any watched namespace.
    names: Vec<(Option<String>, String)>,
}

/// A `--gie-inference-pool` value that names no pool.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("--gie-inference-pool {0:?}: expected NAME, NAMESPACE/NAME or *")]
pub struct BadGieSelection(pub String);

impl GieSelection {
    /// Every pool (the static file's rule: the file lists what it means).
    pub fn all() -> Self {
        Self {
            all: true,
            names: Vec::new(),
        }
    }

    /// Parses the flag's values: `NAME`, `NAMESPACE/NAME` or `*` (every pool), each value
    /// possibly a comma-separated list. No value: the feature is off.
    pub fn parse(values: &[String]) -> Result<Self, BadGieSelection> {
        let mut out = Self::default();
        for v in values.iter().flat_map(|v| v.split(',')) {
            let v = v.trim();
            let ok = |s: &str| {
                !s.is_empty()
                    && s.len() <= 253
                    && s.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-.".contains(c))
            };
            match v.split_once('/') {
                _ if v == "*" => out.all = true,
                Some((ns, name)) if ok(ns) && ok(name) => {
                    out.names.push((Some(ns.to_string()), name.to_string()));
                }
                None if ok(v) => out.names.push((None, v.to_string())),
                _ => return Err(BadGieSelection(v.to_string())),
            }
        }
        Ok(out)
    }

    /// True when some pool is wanted (the watch runs only then).
    pub fn enabled(&self) -> bool {
        self.all || !self.names.is_empty()
    }

    /// True when pool `namespace/name` is wanted.
    pub fn wants(&self, namespace: &str, name: &str) -> bool {
        self.all
            || self
                .names
                .iter()
                .any(|(ns, n)| n == name && ns.as_deref().is_none_or(|ns| ns == namespace))
    }
}

/// A pod as GIE discovery needs it: labels, IP, readiness.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabeledPod {
    /// Namespace (`default` when the document has none).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Pod IP, when assigned.
    pub ip: Option<String>,
    /// The `Ready` condition is true and the pod is not being deleted.
    pub ready: bool,
}

/// The view of `pod` (any pod: the selector decides later).
pub fn labeled_pod(pod: &Pod) -> LabeledPod {
    let status = pod.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    LabeledPod {
        namespace: pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        name: pod.metadata.name.clone().unwrap_or_default(),
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        ip: status
            .and_then(|s| s.pod_ip.clone())
            .filter(|ip| !ip.is_empty()),
        ready: ready && pod.metadata.deletion_timestamp.is_none(),
    }
}

/// What [`add_gie_pools`] did: pools used and pools skipped (`namespace/name`, why).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GieOutcome {
    /// Pools whose pods joined the catalog.
    pub used: Vec<String>,
    /// Pools left out, with the first reason.
    pub skipped: Vec<(String, GiePoolIssue)>,
}

/// Adds the workers and pool views of the selected GIE pools to `catalog` (built from
/// kvroute's own resources first). Pools are taken in `namespace/name` order.
pub fn add_gie_pools(
    catalog: &mut Catalog,
    pools: &[GieInferencePool],
    pods: &[LabeledPod],
    selection: &GieSelection,
) -> GieOutcome {
    let mut outcome = GieOutcome::default();
    let key = |p: &GieInferencePool| {
        (
            p.metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            p.metadata.name.clone().unwrap_or_default(),
        )
    };
    let mut ordered: Vec<&GieInferencePool> = pools
        .iter()
        .filter(|p| {
            let (ns, name) = key(p);
            selection.wants(&ns, &name)
        })
        .collect();
    ordered.sort_by_key(|p| key(p));
    for pool in ordered {
        let (namespace, name) = key(pool);
        let full = format!("{namespace}/{name}");
        if let Some(issue) = pool.issues().into_iter().next() {
            outcome.skipped.push((full, issue));
            continue;
        }
        let (Some(model), Some(port)) = (pool.served_model(), pool.target_port()) else {
            continue;
        };
        let worker_set = worker_set_name(&name);
        for pod in pods
            .iter()
            .filter(|p| p.namespace == namespace && pool.selects(&p.labels))
        {
            let id = format!("{}/{}", pod.namespace, pod.name);
            if catalog.workers.iter().any(|w| w.id == id) {
                continue;
            }
            catalog.workers.push(DiscoveredWorker {
                id,
                address: pod
                    .ip
                    .as_ref()
                    .map(|ip| socket_addr(ip, port))
                    .unwrap_or_default(),
                model: model.to_string(),
                worker_set: worker_set.clone(),
                namespace: namespace.clone(),
                pod_ip: pod
                    .ip
                    .as_deref()
                    .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
                    .map(|ip| ip.to_canonical()),
                ready: pod.ready && pod.ip.is_some(),
                origin: WorkerOrigin::InferencePool,
                // A GIE pool says nothing of its engines' settings.
                step_budget_tokens: None,
            });
        }
        catalog.pools.push(PoolView {
            name: pool_view_name(&namespace, &name),
            models: vec![ServedModel {
                name: model.to_string(),
                backend_model: model.to_string(),
                split: Vec::new(),
            }],
            worker_sets: vec![worker_set],
            auth: None,
        });
        outcome.used.push(full);
    }
    outcome
}

/// `ip:port`, bracketing IPv6.
fn socket_addr(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// `kvroute_router_gie_inference_pools{state}`: selected GIE pools by state (`used`, or the
/// reason one is skipped: `no_model`, `no_target_port`, `empty_selector`).
#[derive(Clone)]
pub struct GieMetrics {
    pools: IntGaugeVec,
}

impl GieMetrics {
    /// Registers the gauge.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let pools = IntGaugeVec::new(
            Opts::new(
                "kvroute_router_gie_inference_pools",
                "Selected Gateway API Inference Extension InferencePools by state: used, or why skipped",
            ),
            &["state"],
        )?;
        registry.register(Box::new(pools.clone()))?;
        Ok(Self { pools })
    }

    /// Publishes an outcome, and logs the skipped pools when they changed.
    pub fn observe(&self, outcome: &GieOutcome, previous: Option<&GieOutcome>) {
        self.pools.reset();
        self.pools
            .with_label_values(&["used"])
            .set(i64::try_from(outcome.used.len()).unwrap_or(i64::MAX));
        for issue in [
            GiePoolIssue::NoModel,
            GiePoolIssue::NoTargetPort,
            GiePoolIssue::EmptySelector,
        ] {
            let n = outcome.skipped.iter().filter(|(_, i)| *i == issue).count();
            self.pools
                .with_label_values(&[issue.label()])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        if previous.is_none_or(|p| p.skipped != outcome.skipped) {
            for (pool, issue) in &outcome.skipped {
                tracing::warn!(%pool, reason = issue.label(), "GIE InferencePool skipped: {issue}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::{WorkerSource, build_catalog};
    use kvroute_crds::{AnyResource, parse_documents};

    const DOCS: &str = r#"
apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: qwen, namespace: ml}
spec:
  model: {name: Qwen/Qwen3-0.6B, servedName: qwen3}
  engine: {mode: mock, port: 8000}
status:
  workers:
    - {pod: shared-0, address: "10.0.0.9:8000", ready: true}
---
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: llama, namespace: ml, annotations: {kvroute.dev/model: llama-8b}}
spec:
  selector: {matchLabels: {app: vllm-llama}}
  targetPorts: [{number: 8001}]
  endpointPickerRef: {name: kvroute-router, port: {number: 9002}}
---
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: nomodel, namespace: ml}
spec:
  selector: {matchLabels: {app: vllm-llama}}
  targetPorts: [{number: 8001}]
  endpointPickerRef: {name: kvroute-router}
"#;

    fn pod(ns: &str, name: &str, app: &str, ip: Option<&str>, ready: bool) -> LabeledPod {
        LabeledPod {
            namespace: ns.into(),
            name: name.into(),
            labels: [("app".to_string(), app.to_string())].into_iter().collect(),
            ip: ip.map(str::to_string),
            ready,
        }
    }

    fn parsed() -> (Catalog, Vec<GieInferencePool>) {
        let mut sets = Vec::new();
        let mut gie = Vec::new();
        for doc in parse_documents(DOCS).expect("parse") {
            match doc {
                AnyResource::WorkerSet(s) => sets.push(s),
                AnyResource::GiePool(p) => gie.push(p),
                _ => {}
            }
        }
        (build_catalog(&sets, &[], WorkerSource::Status), gie)
    }

    #[test]
    fn selected_pods_become_load_only_workers_of_the_annotated_model() {
        let (mut catalog, gie) = parsed();
        let pods = vec![
            pod("ml", "llama-0", "vllm-llama", Some("10.0.0.1"), true),
            pod("ml", "llama-1", "vllm-llama", Some("10.0.0.2"), false),
            pod("ml", "llama-2", "vllm-llama", None, true),
            pod("ml", "other", "vllm-other", Some("10.0.0.3"), true),
            pod("prod", "llama-x", "vllm-llama", Some("10.0.0.4"), true),
            pod("ml", "v6", "vllm-llama", Some("fd00::5"), true),
        ];
        let out = add_gie_pools(&mut catalog, &gie, &pods, &GieSelection::all());
        assert_eq!(out.used, vec!["ml/llama".to_string()]);
        assert_eq!(
            out.skipped,
            vec![("ml/nomodel".to_string(), GiePoolIssue::NoModel)]
        );
        let gie_workers: Vec<(&str, &str, bool)> = catalog
            .workers
            .iter()
            .filter(|w| w.origin == WorkerOrigin::InferencePool)
            .map(|w| (w.id.as_str(), w.address.as_str(), w.ready))
            .collect();
        assert_eq!(
            gie_workers,
            vec![
                ("ml/llama-0", "10.0.0.1:8001", true),
                ("ml/llama-1", "10.0.0.2:8001", false),
                ("ml/llama-2", "", false),
                ("ml/v6", "[fd00::5]:8001", true),
            ]
        );
        let w = &catalog.workers[1];
        assert_eq!(
            (
                w.model.as_str(),
                w.worker_set.as_str(),
                w.namespace.as_str()
            ),
            ("llama-8b", "gie:llama", "ml")
        );
        assert_eq!(w.pod_ip, Some("10.0.0.1".parse().expect("ip")));
        let view = catalog.pools.last().expect("a pool view");
        assert_eq!(view.name, "gie:ml/llama");
        assert_eq!(view.name, pool_view_name("ml", "llama"));
        assert_eq!(view.worker_sets, vec!["gie:llama".to_string()]);
        assert_eq!(view.models[0].name, "llama-8b");
        // The WorkerSet's own worker is untouched.
        assert_eq!(catalog.workers[0].origin, WorkerOrigin::WorkerSet);
    }

    #[test]
    fn a_workerset_pod_keeps_its_identity_and_selection_filters_pools() {
        let (mut catalog, gie) = parsed();
        let pods = vec![pod("ml", "shared-0", "vllm-llama", Some("10.0.0.9"), true)];
        let none = GieSelection::parse(&[]).expect("empty");
        assert!(!none.enabled());
        let out = add_gie_pools(&mut catalog.clone(), &gie, &pods, &none);
        assert!(out.used.is_empty() && out.skipped.is_empty());
        let sel = GieSelection::parse(&["ml/llama".into()]).expect("parse");
        let out = add_gie_pools(&mut catalog, &gie, &pods, &sel);
        assert_eq!(out.used, vec!["ml/llama".to_string()]);
        assert!(out.skipped.is_empty(), "nomodel was not selected");
        assert_eq!(catalog.workers.len(), 1, "{:?}", catalog.workers);
        assert_eq!(catalog.workers[0].origin, WorkerOrigin::WorkerSet);
    }

    #[test]
    fn selection_parsing() {
        let sel = GieSelection::parse(&["a, ns/b".into(), "c".into()]).expect("parse");
        assert!(sel.enabled());
        assert!(sel.wants("any", "a"));
        assert!(sel.wants("ns", "b"));
        assert!(!sel.wants("other", "b"));
        assert!(!sel.wants("ns", "d"));
        assert!(
            GieSelection::parse(&["*".into()])
                .expect("all")
                .wants("x", "y")
        );
        for bad in ["", "A", "a/b/c", "ns/", "/b", "a b"] {
            assert!(GieSelection::parse(&[bad.into()]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn pod_view_from_the_api_object() {
        use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
        use kube::api::ObjectMeta;
        let mut p = Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                labels: Some([("app".to_string(), "x".to_string())].into()),
                ..Default::default()
            },
            status: Some(PodStatus {
                pod_ip: Some("10.1.1.1".into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = labeled_pod(&p);
        assert_eq!(
            (v.namespace.as_str(), v.name.as_str(), v.ready),
            ("default", "p", true)
        );
        assert_eq!(v.labels.get("app").map(String::as_str), Some("x"));
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        assert!(!labeled_pod(&p).ready, "a terminating pod is not ready");
    }
}
