//! A typed model of the Gateway API Inference Extension's `InferencePool`
//! (`inference.networking.k8s.io/v1`, GIE v1.0), the pool kind that Gateway API
//! implementations (Envoy Gateway, Istio, kgateway, ...) route to through an endpoint picker.
//! GIE owns this CRD: kvroute never generates or installs it (`crdgen` leaves it out); the
//! router only reads such pools to discover workers ([`GieInferencePool::selects`],
//! [`GieInferencePool::target_port`]) and the kvroute-specific annotation that names the model
//! the pool's pods serve ([`MODEL_ANNOTATION`]).
//!
//! ```text
//! InferencePool (GIE) --spec.selector.matchLabels--> Pods (same namespace, Ready)
//!        |               --spec.targetPorts[0].number--> <podIP>:<port>  (the workers)
//!        '--spec.endpointPickerRef {name, port.number}--> the EPP Service (kvroute's router)
//! ```
//!
//! Decoding is tolerant like the rest of this crate: unknown fields are ignored and an
//! unknown failure mode reads as [`FailureMode::Unknown`]; [`GieInferencePool::issues`] says
//! what keeps a pool from being used.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// API group of GIE's InferencePool.
pub const GIE_GROUP: &str = "inference.networking.k8s.io";
/// API version of GIE's InferencePool that kvroute reads.
pub const GIE_VERSION: &str = "v1";
/// `apiVersion` field value of a GIE InferencePool document.
pub const GIE_API_VERSION: &str = "inference.networking.k8s.io/v1";
/// Plural resource name (what RBAC rules name).
pub const GIE_PLURAL: &str = "inferencepools";
/// The EPP port GIE's documentation uses, and the one implementations infer for a Service
/// without a port.
pub const DEFAULT_EPP_PORT: u16 = 9002;
/// Annotation on a GIE InferencePool naming the model its pods serve (the `model` of
/// requests routed to them). GIE pools have no model field; without this annotation kvroute
/// does not use the pool.
pub const MODEL_ANNOTATION: &str = "kvroute.dev/model";

/// The spec of GIE's `InferencePool` (v1): which pods, on which port, and which endpoint
/// picker the gateway asks.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "inference.networking.k8s.io",
    version = "v1",
    kind = "InferencePool",
    root = "GieInferencePool",
    plural = "inferencepools",
    shortname = "infpool",
    namespaced,
    status = "GieInferencePoolStatus",
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct GieInferencePoolSpec {
    /// The pods of the pool: same namespace, labels matching `matchLabels`.
    #[serde(default)]
    pub selector: GieLabelSelector,
    /// Ports of the model servers on the selected pods (GIE v1 allows exactly one).
    #[serde(default)]
    pub target_ports: Vec<GiePort>,
    /// The endpoint picker the gateway calls for this pool.
    #[serde(default)]
    pub endpoint_picker_ref: EndpointPickerRef,
}

/// GIE's label selector: `matchLabels` only (as a Service selector).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GieLabelSelector {
    /// Every pair must be on a pod for it to be a member.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

/// A port number (1..=65535 when valid).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GiePort {
    /// The number.
    #[serde(default)]
    pub number: i32,
}

impl GiePort {
    /// The number when it is a valid port.
    pub fn valid(self) -> Option<u16> {
        u16::try_from(self.number).ok().filter(|p| *p > 0)
    }
}

/// What the gateway does when the endpoint picker does not answer.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailureMode {
    /// The gateway forwards to an endpoint of its own choosing.
    FailOpen,
    /// The gateway drops the request (GIE's default).
    #[default]
    FailClose,
    /// A value this version does not know.
    #[serde(other)]
    Unknown,
}

/// Reference to the endpoint picker extension (by default a Service).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPickerRef {
    /// API group of the referent (`""`, the core group, when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind of the referent (`Service` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name of the referent.
    #[serde(default)]
    pub name: String,
    /// The Service port (not the target port) of the picker; required for a Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<GiePort>,
    /// `FailOpen` or `FailClose` (GIE's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_mode: Option<FailureMode>,
}

impl EndpointPickerRef {
    /// The referent's kind, `Service` when absent.
    pub fn kind(&self) -> &str {
        self.kind.as_deref().unwrap_or("Service")
    }

    /// The picker's port: `port.number`, else [`DEFAULT_EPP_PORT`] for a Service.
    pub fn port(&self) -> Option<u16> {
        match self.port {
            Some(p) => p.valid(),
            None if self.kind() == "Service" => Some(DEFAULT_EPP_PORT),
            None => None,
        }
    }

    /// The failure mode, `FailClose` when absent.
    pub fn failure_mode(&self) -> FailureMode {
        self.failure_mode.unwrap_or_default()
    }

    /// True when this names the core-group Service `service` on `port`.
    pub fn names_service(&self, service: &str, port: u16) -> bool {
        self.group.as_deref().unwrap_or("").is_empty()
            && self.kind() == "Service"
            && self.name == service
            && self.port() == Some(port)
    }
}

/// Status of a GIE InferencePool: one entry per parent (Gateway) that uses it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GieInferencePoolStatus {
    /// Per-parent status (at most 32).
    #[serde(default)]
    pub parents: Vec<GieParentStatus>,
}

/// The pool's state as one parent sees it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GieParentStatus {
    /// `Accepted`, `ResolvedRefs`, ...
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The parent.
    #[serde(default)]
    pub parent_ref: GieParentReference,
}

/// A parent of the pool (a Gateway by default).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GieParentReference {
    /// Group (`gateway.networking.k8s.io` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind (`Gateway` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Namespace (the pool's when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Why kvroute does not use a GIE InferencePool. The variant names are metric labels
/// ([`GiePoolIssue::label`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GiePoolIssue {
    /// No [`MODEL_ANNOTATION`]: kvroute cannot tell which model the pods serve.
    #[error("no {MODEL_ANNOTATION} annotation naming the model its pods serve")]
    NoModel,
    /// `spec.targetPorts` has no valid port.
    #[error("spec.targetPorts has no port in 1..=65535")]
    NoTargetPort,
    /// `spec.selector.matchLabels` is empty (kvroute does not take a whole namespace).
    #[error("spec.selector.matchLabels is empty")]
    EmptySelector,
}

impl GiePoolIssue {
    /// Metric label.
    pub fn label(&self) -> &'static str {
        match self {
            GiePoolIssue::NoModel => "no_model",
            GiePoolIssue::NoTargetPort => "no_target_port",
            GiePoolIssue::EmptySelector => "empty_selector",
        }
    }
}

impl GieInferencePool {
    /// The model the pool's pods serve ([`MODEL_ANNOTATION`], trimmed; `None` when absent or
    /// blank).
    pub fn served_model(&self) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()?
            .get(MODEL_ANNOTATION)
            .map(|m| m.trim())
            .filter(|m| !m.is_empty())
    }

    /// The model servers' port: the first valid `spec.targetPorts` entry.
    pub fn target_port(&self) -> Option<u16> {
        self.spec.target_ports.iter().find_map(|p| p.valid())
    }

    /// True when a pod with `labels` is a member. An empty selector selects nothing.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        let want = &self.spec.selector.match_labels;
        !want.is_empty() && want.iter().all(|(k, v)| labels.get(k) == Some(v))
    }

    /// What keeps kvroute from using the pool (empty: usable).
    pub fn issues(&self) -> Vec<GiePoolIssue> {
        let mut out = Vec::new();
        if self.served_model().is_none() {
            out.push(GiePoolIssue::NoModel);
        }
        if self.target_port().is_none() {
            out.push(GiePoolIssue::NoTargetPort);
        }
        if self.spec.selector.match_labels.is_empty() {
            out.push(GiePoolIssue::EmptySelector);
        }
        out
    }

    /// True when some parent reports condition `type_` with status `True`.
    pub fn parent_condition_true(&self, type_: &str) -> bool {
        self.status.iter().flat_map(|s| &s.parents).any(|p| {
            p.conditions
                .iter()
                .any(|c| c.type_ == type_ && c.status == "True")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    const POOL: &str = r#"
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata:
  name: qwen-pool
  namespace: ml
  annotations: {kvroute.dev/model: " qwen3 "}
spec:
  selector:
    matchLabels: {app: vllm-qwen}
  targetPorts:
    - number: 8000
  endpointPickerRef:
    name: kvroute-router
    port: {number: 9002}
    failureMode: FailOpen
    someFutureField: 1
status:
  parents:
    - parentRef: {name: inference-gateway, kind: Gateway}
      conditions:
        - type: Accepted
          status: "True"
          reason: Accepted
          message: ""
          lastTransitionTime: "2025-09-01T00:00:00Z"
"#;

    fn pool(text: &str) -> GieInferencePool {
        let value: serde_json::Value = serde_saphyr::from_str(text).expect("yaml");
        serde_json::from_value(value).expect("pool")
    }

    #[test]
    fn resource_identity_is_gies_not_ours() {
        assert_eq!(GieInferencePool::group(&()), GIE_GROUP);
        assert_eq!(GieInferencePool::version(&()), GIE_VERSION);
        assert_eq!(GieInferencePool::kind(&()), "InferencePool");
        assert_eq!(GieInferencePool::plural(&()), GIE_PLURAL);
        assert_eq!(GieInferencePool::api_version(&()), GIE_API_VERSION);
    }

    #[test]
    fn parses_the_v1_shape() {
        let p = pool(POOL);
        assert_eq!(p.served_model(), Some("qwen3"));
        assert_eq!(p.target_port(), Some(8000));
        let epp = &p.spec.endpoint_picker_ref;
        assert_eq!(epp.kind(), "Service");
        assert_eq!(epp.port(), Some(9002));
        assert_eq!(epp.failure_mode(), FailureMode::FailOpen);
        assert!(epp.names_service("kvroute-router", 9002));
        assert!(!epp.names_service("kvroute-router", 9000));
        assert!(!epp.names_service("other", 9002));
        assert!(p.parent_condition_true("Accepted"));
        assert!(!p.parent_condition_true("ResolvedRefs"));
        assert!(p.issues().is_empty());
    }

    #[test]
    fn selector_matches_labels_and_empty_selects_nothing() {
        let p = pool(POOL);
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(p.selects(&labels(&[("app", "vllm-qwen"), ("x", "y")])));
        assert!(!p.selects(&labels(&[("app", "vllm-llama")])));
        assert!(!p.selects(&labels(&[])));
        let mut empty = p.clone();
        empty.spec.selector.match_labels.clear();
        assert!(!empty.selects(&labels(&[("app", "vllm-qwen")])));
        assert_eq!(empty.issues(), vec![GiePoolIssue::EmptySelector]);
    }

    #[test]
    fn defaults_and_issues() {
        let p = pool(
            r#"
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: bare}
spec:
  selector: {matchLabels: {app: a}}
  targetPorts: [{number: 0}]
  endpointPickerRef: {name: epp, failureMode: Sometimes}
"#,
        );
        let epp = &p.spec.endpoint_picker_ref;
        // A Service without a port: GIE's documented default.
        assert_eq!(epp.port(), Some(DEFAULT_EPP_PORT));
        assert_eq!(epp.failure_mode(), FailureMode::Unknown);
        assert_eq!(
            p.issues(),
            vec![GiePoolIssue::NoModel, GiePoolIssue::NoTargetPort]
        );
        let labels: Vec<&str> = p.issues().iter().map(GiePoolIssue::label).collect();
        assert_eq!(labels, vec!["no_model", "no_target_port"]);
        let no_ref = pool(
            r#"
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: x}
spec:
  endpointPickerRef: {name: epp, kind: Custom, group: example.com}
"#,
        );
        assert_eq!(no_ref.spec.endpoint_picker_ref.port(), None);
        assert_eq!(
            no_ref.spec.endpoint_picker_ref.failure_mode(),
            FailureMode::FailClose
        );
        assert!(!no_ref.spec.endpoint_picker_ref.names_service("epp", 9002));
    }
}
