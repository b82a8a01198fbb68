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
    /// OTLP/gRPC collector of the router's traces (`kvroute-operator
    /// --router-otlp-endpoint`, the router's `--otlp-endpoint`). Empty: off.
    pub otlp_endpoint: String,
    /// How the router fetches tokenizers (`kvroute-operator
    /// --router-tokenizer-fetch-timeout-seconds`, `--router-tokenizer-retry-max-seconds`).
    pub tokenizer_fetch: TokenizerFetch,
}

/// The router's tokenizer download settings the operator passes on. The router's own
/// defaults are the same, so the operator sets its variables only where they differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenizerFetch {
    /// Longest one attempt may take, seconds (`KVROUTE_ROUTER_TOKENIZER_FETCH_TIMEOUT_S`).
    pub timeout_s: u64,
    /// Longest wait between attempts, seconds (`KVROUTE_ROUTER_TOKENIZER_RETRY_MAX_S`).
    pub retry_max_s: u64,
}

impl TokenizerFetch {
    /// The router's default for both (`kvroute-router --tokenizer-fetch-timeout-s`,
    /// `--tokenizer-retry-max-s`; e2e/tests/contracts.rs checks they agree).
    pub const DEFAULT_S: u64 = 300;
    /// The most either may be: a day. Longer leaves a model unready for days on one stall.
    pub const MAX_S: u64 = 86_400;
}

impl Default for TokenizerFetch {
    fn default() -> Self {
        Self {
            timeout_s: Self::DEFAULT_S,
            retry_max_s: Self::DEFAULT_S,
        }
    }
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

    /// The GIE InferencePools (namespace, name) whose gateways get a picker key pair, like
    /// a kvroute Pool's: each `NAMESPACE/NAME` of [`Self::gie_inference_pool`], and a bare
    /// `NAME` in the router's namespace (a GIE pool's `endpointPickerRef` names a Service of
    /// the pool's own namespace, so the pools a router picks for live where it runs). `*`
    /// names no pool to issue for: such pools' gateways need a pair of their own from the
    /// CA (docs/gateway-api.md, "Authentication").
    pub fn gie_picker_pools(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .gie_inference_pool
            .split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty() && *v != "*")
            .map(|v| match v.split_once('/') {
                Some((ns, name)) => (ns.to_string(), name.to_string()),
                None => (self.router_namespace.clone(), v.to_string()),
            })
            .collect();
        out.sort();
        out.dedup();
        out
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
