//! kvroute's custom resources, defined once in Rust (group `kvroute.dev`, version
//! `v1alpha1`). The operator reconciles them, the router reads them (from the API server or
//! from a YAML file via [`parse_documents`]), and `kvroute crdgen` writes their
//! CustomResourceDefinitions from these types.
//!
//! ```text
//! InferencePool --targets--> InferenceWorkerSet (local vLLM pods + sidecars)
//!      |                \--> InferenceProvider --gatewayBackendRef--> GatewayBackend --> Secret
//!      '-- InferencePolicy (ordered rules: route / reject / overflow / limits / class)
//! ```
//!
//! The router acts on WorkerSets, Pools and Policies (a policy is Ready=True with reason
//! `Enforced` once it compiles and resolves). Providers and GatewayBackends are validated and
//! resolved by the operator but not yet enforced: their status says Accepted=True and
//! Ready=False with reason `NotEnforced`.
//!
//! Everything here is pure data plus validation: no client, no I/O.

// clippy reads the repeated `printcolumn(name = .., type_ = ..)` arguments inside one
// `#[kube(..)]` attribute as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

pub mod backend;
pub mod cel;
pub mod condition;
pub mod documents;
pub mod gie;
pub mod gpu;
pub mod policy;
pub mod pool;
pub mod provider;
pub mod reference;
pub mod validation;
pub mod workerset;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

pub use backend::{GatewayBackend, GatewayBackendSpec, GatewayBackendStatus};
pub use documents::{AnyResource, DocumentError, parse_documents};
pub use gie::GieInferencePool;
pub use policy::{InferencePolicy, InferencePolicySpec, InferencePolicyStatus};
pub use pool::{InferencePool, InferencePoolSpec, InferencePoolStatus};
pub use provider::{InferenceProvider, InferenceProviderSpec, InferenceProviderStatus};
pub use validation::SpecIssue;
pub use workerset::{InferenceWorkerSet, InferenceWorkerSetSpec, InferenceWorkerSetStatus};

/// API group of every kvroute resource.
pub const GROUP: &str = "kvroute.dev";
/// API version of every kvroute resource.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` field value.
pub const API_VERSION: &str = "kvroute.dev/v1alpha1";
/// Category that `kubectl get kvroute` lists.
pub const CATEGORY: &str = "kvroute";

/// The CustomResourceDefinitions of all five kinds, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        InferenceWorkerSet::crd(),
        InferencePool::crd(),
        InferencePolicy::crd(),
        InferenceProvider::crd(),
        GatewayBackend::crd(),
    ]
}

/// A copy of `crd` without `x-kubernetes-validations` (CEL rules), for API servers older than
/// 1.25: they refuse the field in server-side apply (and ignore it otherwise). The operator
/// enforces the same rules through each spec's `validate()`.
pub fn without_cel(crd: &CustomResourceDefinition) -> CustomResourceDefinition {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                map.remove("x-kubernetes-validations");
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(crd).unwrap_or_default();
    strip(&mut value);
    serde_json::from_value(value).unwrap_or_else(|_| crd.clone())
}

/// File name under `crds/` for a CRD (`<plural>.<group>.yaml`).
pub fn crd_file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or("unnamed"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn schema_of(crd: &CustomResourceDefinition) -> Value {
        serde_json::to_value(&crd.spec.versions[0].schema).expect("schema serializes")
    }

    #[test]
    fn every_crd_is_namespaced_with_status_category_and_short_name() {
        let crds = crds();
        assert_eq!(crds.len(), 5);
        for crd in &crds {
            assert_eq!(crd.spec.group, GROUP);
            assert_eq!(crd.spec.scope, "Namespaced");
            assert_eq!(
                crd.spec.names.categories.as_deref(),
                Some(&[CATEGORY.to_string()][..])
            );
            assert_eq!(crd.spec.names.short_names.as_ref().map(Vec::len), Some(1));
            let v = &crd.spec.versions[0];
            assert_eq!(v.name, VERSION);
            assert!(
                v.subresources
                    .as_ref()
                    .and_then(|s| s.status.as_ref())
                    .is_some()
            );
            assert!(
                v.additional_printer_columns
                    .as_ref()
                    .is_some_and(|c| c.len() >= 3)
            );
            let schema = schema_of(crd).to_string();
            assert!(schema.contains("\"conditions\""), "{}", crd.spec.names.kind);
        }
    }

    #[test]
    fn worker_set_has_scale_subresource_and_defaults() {
        let crd = InferenceWorkerSet::crd();
        let scale = crd.spec.versions[0]
            .subresources
            .as_ref()
            .and_then(|s| s.scale.as_ref())
            .expect("scale");
        assert_eq!(scale.spec_replicas_path, ".spec.replicas");
        assert_eq!(scale.status_replicas_path, ".status.replicas");
        assert_eq!(
            scale.label_selector_path.as_deref(),
            Some(".status.selector")
        );
        let schema = schema_of(&crd);
        let spec = &schema["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["properties"]["blockSize"]["default"], 16);
        assert_eq!(
            spec["properties"]["gpu"]["properties"]["product"]["default"],
            "NVIDIA-L40S"
        );
        assert_eq!(
            spec["properties"]["engine"]["properties"]["mode"]["enum"],
            serde_json::json!(["vllm", "mock"])
        );
        assert_eq!(spec["required"], serde_json::json!(["model"]));
        assert!(spec["x-kubernetes-validations"].is_array());
    }

    #[test]
    fn every_cel_rule_walks_only_bounded_lists_and_strings() {
        let mut total = 0;
        for crd in crds() {
            let root = &schema_of(&crd)["openAPIV3Schema"];
            total += cel::rules(root).len();
            let findings = cel::check_schema(root);
            assert!(
                findings.is_empty(),
                "{}:\n{}",
                crd.spec.names.kind,
                findings
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        assert!(total >= 16, "{total} rules");
    }

    #[test]
    fn docs_give_every_cel_rule_a_cost() {
        // Table cells escape `|` as `\|`.
        let docs = include_str!("../../docs/crds.md").replace("\\|", "|");
        for crd in crds() {
            for (at, rule) in cel::rules(&schema_of(&crd)["openAPIV3Schema"]) {
                assert!(
                    docs.contains(&format!("`{rule}`")),
                    "docs/crds.md lacks {} {at}: {rule}",
                    crd.spec.names.kind
                );
            }
        }
    }

    #[test]
    fn crds_stay_small_enough_for_client_side_apply() {
        // `kubectl apply` (client-side) copies the object into the last-applied-configuration
        // annotation, and annotations hold at most 256 KiB: keep each CRD well below.
        for crd in crds() {
            let size = serde_json::to_string(&crd).expect("serializes").len();
            assert!(size < 96 * 1024, "{} is {size} bytes", crd.spec.names.kind);
        }
    }

    #[test]
    fn without_cel_strips_every_rule_and_nothing_else() {
        for crd in crds() {
            let stripped = without_cel(&crd);
            let text = serde_json::to_string(&stripped).expect("serializes");
            assert!(!text.contains("x-kubernetes-validations"));
            assert_eq!(stripped.spec.names, crd.spec.names);
            assert!(text.contains("\"required\""), "{}", crd.spec.names.kind);
        }
    }

    #[test]
    fn cross_field_rules_are_in_the_schemas() {
        let all: String = crds().iter().map(|c| schema_of(c).to_string()).collect();
        for rule in [
            "self.port != self.replayPort",
            "has(self.workerSet) ? 1 : 0",
            "reject cannot be combined",
            "headerName is required when type is header",
            "preferredTargets must be a subset",
        ] {
            assert!(all.contains(rule), "missing CEL rule {rule}");
        }
    }
}
