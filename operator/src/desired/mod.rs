//! Desired state, computed without I/O: every object the operator writes and every status it
//! reports is a pure function of the resource, the operator's configuration and (for status)
//! what the API server returned. Unit tests call these directly; the controllers only fetch,
//! call, and apply.

pub mod hardening;
pub mod identity;
pub mod network_policy;
pub mod refs;
pub mod router;
pub mod secrets;
pub mod tls;
pub mod workerset;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// The one field manager for server-side apply.
pub const FIELD_MANAGER: &str = "kvroute-operator";
/// Label naming the InferenceWorkerSet a pod, Deployment or Service belongs to.
pub const WORKER_SET_LABEL: &str = "kvroute.dev/workerset";
/// Label naming the kvroute component (`worker`, `router`).
pub const COMPONENT_LABEL: &str = "kvroute.dev/component";
/// Annotation with the served model name (model names contain `/`, which labels cannot).
pub const MODEL_ANNOTATION: &str = "kvroute.dev/model";
/// Pod-template annotation carrying a hash of everything the pods are built from, so any spec
/// or operator-default change produces a new template and rolls the pods.
pub const TEMPLATE_HASH_ANNOTATION: &str = "kvroute.dev/template-hash";

/// What the operator knows that the resources do not say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorConfig {
    /// Image of the kvroute sidecar.
    pub sidecar_image: String,
    /// Image of the mock vLLM worker.
    pub mock_image: String,
    /// Image of the router.
    pub router_image: String,
    /// Router replicas.
    pub router_replicas: i32,
    /// Namespace the router runs in.
    pub router_namespace: String,
    /// Namespace the operator (and so the router) watches; empty = all.
    pub watch_namespace: String,
    /// Issue mTLS key pairs and pass the TLS flags to routers and sidecars
    /// (`kvroute-operator --mtls`; see [`tls`]).
    pub mtls: bool,
    /// Gateway API Inference Extension mode (`kvroute-operator --router-gie-inference-pool`):
    /// the GIE InferencePools the router takes workers from (`NAME`, `NAMESPACE/NAME`, `*`,
    /// comma-separated). Non-empty, the router also serves its endpoint picker (ext_proc)
    /// on the `epp` port ([`router::EPP_PORT`]) of its Service. Empty: off.
    pub gie_inference_pool: String,
}

impl OperatorConfig {
    /// `host:port` of the router's ingest (headless) Service that sidecars stream to; the
    /// sidecar re-resolves it to reach every router replica.
    pub fn router_ingest_dns(&self) -> String {
        format!(
            "{}.{}.svc:{}",
            router::INGEST_SERVICE,
            self.router_namespace,
            router::INGEST_PORT
        )
    }
}

/// Standard labels of an object managed by the operator.
pub fn common_labels(component: &str, instance: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            format!("kvroute-{component}"),
        ),
        (
            "app.kubernetes.io/instance".to_string(),
            instance.to_string(),
        ),
        (
            "app.kubernetes.io/managed-by".to_string(),
            FIELD_MANAGER.to_string(),
        ),
        (COMPONENT_LABEL.to_string(), component.to_string()),
    ])
}

/// Why a desired object could not be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DesiredError {
    /// The resource lacks metadata the children need (name, namespace or uid).
    #[error("resource has no {0}")]
    MissingMetadata(&'static str),
}

/// Severity of an event to publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Informational.
    Normal,
    /// Needs attention.
    Warning,
}

/// An event worth publishing: a condition that changed between two statuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notable {
    /// Normal or Warning.
    pub severity: Severity,
    /// PascalCase reason.
    pub reason: String,
    /// Human message.
    pub note: String,
}

/// Owner reference (controller, blocking deletion) for children of `owner`.
pub fn owner_ref<K: kube::Resource<DynamicType = ()>>(
    owner: &K,
) -> Result<OwnerReference, DesiredError> {
    owner
        .controller_owner_ref(&())
        .ok_or(DesiredError::MissingMetadata("name or uid"))
}
