//! InferenceWorkerSet -> Deployment + headless Service, and the WorkerSet's status from what the
//! Deployment and its pods report.
//!
//! ```text
//! InferenceWorkerSet --deployment.rs--> Deployment (engine + sidecar containers, template hash)
//!                      (+ gpu_stats.rs: the sidecar's NVML sees the engine's GPUs)
//!                    --service.rs-----> headless Service (one DNS record per worker)
//!                    --network_policy.rs--> NetworkPolicy (engine port from the routers only)
//! Deployment + Pods  --status.rs------> InferenceWorkerSetStatus (+ events for transitions)
//! ```
//!
//! Why a Deployment and not a StatefulSet: a worker's only state is its KV cache, which lives in
//! GPU memory and dies with the process, so a stable pod name or volume buys nothing (the
//! sidecar reports whatever identity the pod has, and the router learns a new worker in one
//! snapshot). Deployments roll out in parallel with maxSurge/maxUnavailable, scale without
//! ordering, and replace a stuck pod without waiting for its predecessors; StatefulSet's ordered,
//! one-at-a-time rollout would make a model upgrade across dozens of GPUs needlessly slow.

// The children build on the shared names and labels below; this module imports nothing from
// them, so dependencies point one way (children -> mod).
pub mod deployment;
pub mod gpu_stats;
pub mod network_policy;
pub mod service;
pub mod status;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kvroute_crds::workerset::InferenceWorkerSet;

use super::{COMPONENT_LABEL, DesiredError, WORKER_SET_LABEL, common_labels};

/// Name of the engine container (vLLM or the mock).
pub const ENGINE_CONTAINER: &str = "engine";
/// Name of the sidecar container.
pub const SIDECAR_CONTAINER: &str = "sidecar";

/// Names and labels of one WorkerSet's children.
#[derive(Debug, Clone)]
struct Meta {
    name: String,
    namespace: String,
}

fn meta(ws: &InferenceWorkerSet) -> Result<Meta, DesiredError> {
    Ok(Meta {
        name: ws
            .metadata
            .name
            .clone()
            .ok_or(DesiredError::MissingMetadata("name"))?,
        namespace: ws
            .metadata
            .namespace
            .clone()
            .ok_or(DesiredError::MissingMetadata("namespace"))?,
    })
}

/// Labels selecting the worker pods of a WorkerSet (immutable once the Deployment exists).
pub fn selector_labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(WORKER_SET_LABEL.to_string(), name.to_string())])
}

/// The selector as the string the scale subresource reports (`status.selector`).
pub fn selector_string(name: &str) -> String {
    format!("{WORKER_SET_LABEL}={name}")
}

fn labels(name: &str) -> BTreeMap<String, String> {
    let mut l = common_labels("worker", name);
    l.extend(selector_labels(name));
    l
}

/// Label of a pod: which component (used by tests and the fake kubelet).
pub fn is_worker_pod(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(COMPONENT_LABEL))
        .is_some_and(|c| c == "worker")
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Builders shared by the tests of the WorkerSet's desired state.

    use k8s_openapi::jiff::Timestamp;
    use kvroute_crds::condition::Time;
    use kvroute_crds::workerset::{InferenceWorkerSet, InferenceWorkerSetSpec};

    use crate::desired::OperatorConfig;

    pub(crate) fn cfg() -> OperatorConfig {
        OperatorConfig {
            sidecar_image: "ghcr.io/kvroute/sidecar:test".into(),
            mock_image: "ghcr.io/kvroute/mock-vllm:test".into(),
            router_image: "ghcr.io/kvroute/router:test".into(),
            router_replicas: 2,
            router_namespace: "kvroute-system".into(),
            watch_namespace: String::new(),
            mtls: false,
            gie_inference_pool: String::new(),
            otlp_endpoint: String::new(),
            tokenizer_fetch: Default::default(),
        }
    }

    pub(crate) fn ws(spec_yaml: &str) -> InferenceWorkerSet {
        let spec: InferenceWorkerSetSpec = serde_saphyr::from_str(spec_yaml).expect("spec parses");
        let mut ws = InferenceWorkerSet::new("qwen", spec);
        ws.metadata.namespace = Some("team-a".into());
        ws.metadata.uid = Some("uid-1".into());
        ws.metadata.generation = Some(3);
        ws
    }

    pub(crate) fn now() -> Time {
        Time(Timestamp::from_second(1_700_000_000).expect("valid"))
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::ws;
    use super::*;

    #[test]
    fn missing_metadata_is_an_error_not_a_panic() {
        let mut w = ws("model: {name: m}\n");
        w.metadata.namespace = None;
        assert_eq!(
            meta(&w).unwrap_err(),
            DesiredError::MissingMetadata("namespace")
        );
        w.metadata.name = None;
        assert_eq!(meta(&w).unwrap_err(), DesiredError::MissingMetadata("name"));
    }
}
