//! Reading kvroute resources from plain YAML: the router's file mode (no Kubernetes) and the
//! examples shipped in the bundle use the very same documents `kubectl apply` takes.
//!
//! ```text
//! multi-doc YAML --serde-saphyr--> JSON values --dispatch on apiVersion/kind--> AnyResource
//! ```

use k8s_openapi::api::core::v1::{Pod, Secret};
use serde_json::Value;

use crate::gie::{GIE_API_VERSION, GieInferencePool};
use crate::{
    API_VERSION, GatewayBackend, InferencePolicy, InferencePool, InferenceProvider,
    InferenceWorkerSet,
};

/// Any document kvroute understands.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)]
pub enum AnyResource {
    /// `InferenceWorkerSet`.
    WorkerSet(InferenceWorkerSet),
    /// `InferencePool`.
    Pool(InferencePool),
    /// `InferencePolicy`.
    Policy(InferencePolicy),
    /// `InferenceProvider`.
    Provider(InferenceProvider),
    /// `GatewayBackend`.
    GatewayBackend(GatewayBackend),
    /// A core `v1` Secret (credentials for GatewayBackends in file mode).
    Secret(Secret),
    /// GIE's `InferencePool` (`inference.networking.k8s.io/v1`): workers from its pods.
    GiePool(GieInferencePool),
    /// A core `v1` Pod (file mode: the pods a GIE InferencePool selects, with
    /// `status.podIP` and the `Ready` condition as the API server would show them).
    Pod(Pod),
}

impl AnyResource {
    /// The document's `kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            AnyResource::WorkerSet(_) => "InferenceWorkerSet",
            AnyResource::Pool(_) => "InferencePool",
            AnyResource::Policy(_) => "InferencePolicy",
            AnyResource::Provider(_) => "InferenceProvider",
            AnyResource::GatewayBackend(_) => "GatewayBackend",
            AnyResource::Secret(_) => "Secret",
            AnyResource::GiePool(_) => "InferencePool",
            AnyResource::Pod(_) => "Pod",
        }
    }
}

/// Why a document could not be read. `index` counts non-empty documents from 0.
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    /// The text is not YAML.
    #[error("invalid YAML: {0}")]
    Yaml(String),
    /// A document is not a mapping with `apiVersion` and `kind`.
    #[error("document {index}: missing apiVersion or kind")]
    MissingKind {
        /// Document index.
        index: usize,
    },
    /// A kind kvroute does not read.
    #[error(
        "document {index}: unsupported {api_version}/{kind} (expected {expected}, {GIE_API_VERSION}/InferencePool, v1/Secret or v1/Pod)"
    )]
    UnknownKind {
        /// Document index.
        index: usize,
        /// Its apiVersion.
        api_version: String,
        /// Its kind.
        kind: String,
        /// The kvroute apiVersion.
        expected: &'static str,
    },
    /// The document has the right kind but the wrong shape.
    #[error("document {index} ({kind} {name:?}): {source}")]
    Invalid {
        /// Document index.
        index: usize,
        /// Its kind.
        kind: String,
        /// `metadata.name` when present.
        name: String,
        /// The decoding error.
        source: serde_json::Error,
    },
}

/// Parses a multi-document YAML stream of kvroute resources (and Secrets). Empty documents are
/// skipped; any other document that is not a kvroute kind is an error, so typos do not pass
/// silently.
pub fn parse_documents(text: &str) -> Result<Vec<AnyResource>, DocumentError> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(text).map_err(|e| DocumentError::Yaml(e.to_string()))?;
    docs.into_iter()
        .filter(|d| !d.is_null())
        .enumerate()
        .map(|(index, doc)| parse_value(index, doc))
        .collect()
}

fn parse_value(index: usize, doc: Value) -> Result<AnyResource, DocumentError> {
    let api_version = doc
        .get("apiVersion")
        .and_then(Value::as_str)
        .ok_or(DocumentError::MissingKind { index })?;
    let kind = doc
        .get("kind")
        .and_then(Value::as_str)
        .ok_or(DocumentError::MissingKind { index })?;
    let (api_version, kind) = (api_version.to_string(), kind.to_string());
    let name = doc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let invalid = |source| DocumentError::Invalid {
        index,
        kind: kind.clone(),
        name: name.clone(),
        source,
    };
    match (api_version.as_str(), kind.as_str()) {
        (API_VERSION, "InferenceWorkerSet") => {
            serde_json::from_value(doc).map(AnyResource::WorkerSet)
        }
        (API_VERSION, "InferencePool") => serde_json::from_value(doc).map(AnyResource::Pool),
        (API_VERSION, "InferencePolicy") => serde_json::from_value(doc).map(AnyResource::Policy),
        (API_VERSION, "InferenceProvider") => {
            serde_json::from_value(doc).map(AnyResource::Provider)
        }
        (API_VERSION, "GatewayBackend") => {
            serde_json::from_value(doc).map(AnyResource::GatewayBackend)
        }
        ("v1", "Secret") => serde_json::from_value(doc).map(AnyResource::Secret),
        (GIE_API_VERSION, "InferencePool") => serde_json::from_value(doc).map(AnyResource::GiePool),
        ("v1", "Pod") => serde_json::from_value(doc).map(AnyResource::Pod),
        _ => {
            return Err(DocumentError::UnknownKind {
                index,
                api_version,
                kind,
                expected: API_VERSION,
            });
        }
    }
    .map_err(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workerset::EngineMode;

    const STREAM: &str = r#"
apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: qwen, namespace: demo}
spec:
  model: {name: Qwen/Qwen3-0.6B}
  engine: {mode: mock, speedup: 5}
  replicas: 2
---
---
apiVersion: kvroute.dev/v1alpha1
kind: InferencePool
metadata: {name: chat}
spec:
  targets: [{workerSet: qwen}, {provider: openai, role: overflow}]
---
apiVersion: kvroute.dev/v1alpha1
kind: InferencePolicy
metadata: {name: p}
spec:
  rules: [{name: all, actions: {route: {localOnly: true}}}]
---
apiVersion: kvroute.dev/v1alpha1
kind: InferenceProvider
metadata: {name: openai}
spec: {kind: openai, models: [gpt-4o-mini], gatewayBackendRef: {name: openai}}
---
apiVersion: kvroute.dev/v1alpha1
kind: GatewayBackend
metadata: {name: openai}
spec: {url: "https://api.openai.com", auth: {secretRef: {name: openai, key: token}}}
---
apiVersion: v1
kind: Secret
metadata: {name: openai}
stringData: {token: sk-test}
---
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: gie, annotations: {kvroute.dev/model: qwen3}}
spec:
  selector: {matchLabels: {app: vllm}}
  targetPorts: [{number: 8000}]
  endpointPickerRef: {name: kvroute-router, port: {number: 9002}}
---
apiVersion: v1
kind: Pod
metadata: {name: vllm-0, labels: {app: vllm}}
status: {podIP: 10.0.0.7}
"#;

    #[test]
    fn parses_every_kind_in_order() {
        let docs = parse_documents(STREAM).expect("parses");
        let kinds: Vec<_> = docs.iter().map(AnyResource::kind).collect();
        assert_eq!(
            kinds,
            [
                "InferenceWorkerSet",
                "InferencePool",
                "InferencePolicy",
                "InferenceProvider",
                "GatewayBackend",
                "Secret",
                "InferencePool",
                "Pod"
            ]
        );
        let AnyResource::GiePool(gie) = &docs[6] else {
            panic!("the GIE pool is a GiePool, not a kvroute Pool")
        };
        assert_eq!(gie.served_model(), Some("qwen3"));
        let AnyResource::WorkerSet(ws) = &docs[0] else {
            panic!("first is a WorkerSet")
        };
        assert_eq!(ws.spec.engine.mode, EngineMode::Mock);
        assert_eq!(ws.spec.replicas, 2);
        assert_eq!(ws.metadata.namespace.as_deref(), Some("demo"));
    }

    #[test]
    fn unknown_kind_and_bad_shape_are_typed_errors() {
        let err =
            parse_documents("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n").unwrap_err();
        assert!(
            matches!(err, DocumentError::UnknownKind { index: 0, .. }),
            "{err}"
        );
        let err = parse_documents("apiVersion: kvroute.dev/v1alpha1\nkind: InferencePool\nmetadata: {name: x}\nspec: {targets: 3}\n")
            .unwrap_err();
        assert!(
            matches!(err, DocumentError::Invalid { ref name, .. } if name == "x"),
            "{err}"
        );
        assert!(matches!(
            parse_documents("- a\n- b\n"),
            Err(DocumentError::MissingKind { index: 0 })
        ));
        assert!(matches!(
            parse_documents("a: [\n"),
            Err(DocumentError::Yaml(_))
        ));
    }

    #[test]
    fn empty_stream_is_empty() {
        assert!(parse_documents("").expect("parses").is_empty());
        assert!(parse_documents("---\n---\n").expect("parses").is_empty());
    }
}
