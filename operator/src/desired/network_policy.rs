//! One NetworkPolicy per component the operator runs, restricting who may open connections
//! to it (ingress). Egress stays open: workers download weights, the router downloads
//! tokenizers and both talk to the API server or each other at addresses no static policy
//! knows. The operator's own policy is static (deploy/operator.yaml, [`operator_policy`]).
//!
//! ```text
//! workers   engine port     <- router pods (the router's namespace)
//!           sidecar admin   <- anywhere (/metrics, probes)
//!           (vLLM's ZMQ sockets are bound to 127.0.0.1: nothing outside the pod reaches them)
//! router    gateway, gRPC (ingest + Pick, mTLS), admin (/metrics; /debug needs a token) <- anywhere
//! operator  admin (/metrics, /healthz) <- anywhere; egress: DNS and the API server
//! ```
//!
//! NetworkPolicies are additive: an external gateway that calls workers picked through the
//! Pick API, or a Prometheus that scrapes vLLM's `/metrics` on the engine port, gets its own
//! policy allowing it.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Label every namespace carries (Kubernetes 1.21+) with its own name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A TCP port of a policy rule.
pub fn tcp(port: i32) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".to_string()),
        ..Default::default()
    }
}

fn selector(labels: BTreeMap<String, String>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels),
        ..Default::default()
    }
}

/// An ingress rule: `ports` from `from` (anywhere when empty).
pub fn allow(
    ports: Vec<NetworkPolicyPort>,
    from: Vec<NetworkPolicyPeer>,
) -> NetworkPolicyIngressRule {
    NetworkPolicyIngressRule {
        ports: Some(ports),
        from: (!from.is_empty()).then_some(from),
    }
}

/// Pods matching `pod_labels` in the namespace `namespace`.
pub fn pods_in(namespace: &str, pod_labels: BTreeMap<String, String>) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(selector(BTreeMap::from([(
            NAMESPACE_NAME_LABEL.to_string(),
            namespace.to_string(),
        )]))),
        pod_selector: Some(selector(pod_labels)),
        ..Default::default()
    }
}

/// An ingress-only policy for the pods matching `pod_labels`.
pub fn ingress_policy(
    metadata: ObjectMeta,
    pod_labels: BTreeMap<String, String>,
    rules: Vec<NetworkPolicyIngressRule>,
) -> NetworkPolicy {
    NetworkPolicy {
        metadata,
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selector(pod_labels)),
            policy_types: Some(vec!["Ingress".to_string()]),
            ingress: Some(rules),
            ..Default::default()
        }),
    }
}

/// The operator's own policy: its admin port from anywhere; egress to DNS and to the API
/// server (port 443 or 6443: its address is the cluster's, not known to a static manifest).
pub fn operator_policy(
    metadata: ObjectMeta,
    pod_labels: BTreeMap<String, String>,
    admin_port: i32,
) -> NetworkPolicy {
    let udp = |p: i32| NetworkPolicyPort {
        port: Some(IntOrString::Int(p)),
        protocol: Some("UDP".to_string()),
        ..Default::default()
    };
    NetworkPolicy {
        metadata,
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selector(pod_labels)),
            policy_types: Some(vec!["Ingress".to_string(), "Egress".to_string()]),
            ingress: Some(vec![allow(vec![tcp(admin_port)], Vec::new())]),
            egress: Some(vec![
                NetworkPolicyEgressRule {
                    ports: Some(vec![udp(53), tcp(53)]),
                    to: None,
                },
                NetworkPolicyEgressRule {
                    ports: Some(vec![tcp(443), tcp(6443)]),
                    to: None,
                },
            ]),
        }),
    }
}
