//! `InferenceProvider`: a remote OpenAI- or Anthropic-compatible API, reached through a
//! GatewayBackend. The router relays overflow to it when a policy's overflow action says so
//! (see docs/control-plane.md, "Overflow to providers"); the operator validates it, resolves
//! its backend (conditions Accepted, ResolvedRefs) and reports Ready=True with reason
//! `Enforced` once the backend is Ready.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::condition::Condition;
use crate::validation::SpecIssue;

/// Desired state of an InferenceProvider.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "kvroute.dev",
    version = "v1alpha1",
    kind = "InferenceProvider",
    plural = "inferenceproviders",
    namespaced,
    status = "InferenceProviderStatus",
    shortname = "iprov",
    category = "kvroute",
    derive = "PartialEq",
    doc = "A remote OpenAI- or Anthropic-compatible inference API, its models and limits. The router relays overflow requests to it through its GatewayBackend (Ready=True, reason Enforced, once the backend is Ready); OpenAI-API requests are not translated to Anthropic providers (condition OpenAIClients=False).",
    printcolumn(name = "Kind", type_ = "string", json_path = ".spec.kind"),
    printcolumn(
        name = "Backend",
        type_ = "string",
        json_path = ".spec.gatewayBackendRef.name"
    ),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Accepted\")].status"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct InferenceProviderSpec {
    /// API dialect of the provider.
    pub kind: ProviderKind,
    /// Models the provider serves (names as the provider spells them). An overflowed request
    /// asks for the model its client's name resolved to, or the client's name, when listed
    /// here; otherwise the first one.
    #[schemars(length(min = 1, max = 256))]
    pub models: Vec<String>,
    /// Limits kvroute keeps to when sending to this provider, counted by each router replica
    /// (with N replicas the provider may see up to N times each). Over a limit the overflow
    /// is not taken: the request stays local, or gets 429 when no local worker can take it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ProviderLimits>,
    /// The GatewayBackend (URL, TLS, credentials) used to reach the provider.
    pub gateway_backend_ref: LocalObjectRef,
}

/// API dialect.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// OpenAI `/v1/chat/completions`.
    Openai,
    /// Anthropic `/v1/messages`.
    Anthropic,
}

/// Provider-side limits.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderLimits {
    /// Requests per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub requests_per_minute: Option<i64>,
    /// Tokens per minute (prompt estimate + output limit on admission, replaced by the
    /// provider's reported usage when the request ends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub tokens_per_minute: Option<i64>,
    /// Requests in flight at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_concurrency: Option<i32>,
}

/// A reference to an object in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalObjectRef {
    /// Object name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Observed state of an InferenceProvider.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferenceProviderStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted` (the spec is valid), `ResolvedRefs` (what it names exists), `Ready` (True with
    /// reason `Enforced` once its GatewayBackend is Ready) and, for Anthropic providers,
    /// `OpenAIClients` (False, `NotTranslated`: OpenAI-API requests stay local).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

impl InferenceProviderSpec {
    /// Checks what the schema states, for API servers or files that skip it.
    pub fn validate(&self) -> Vec<SpecIssue> {
        let mut issues = Vec::new();
        if self.models.is_empty() {
            issues.push(SpecIssue::new(
                "spec.models",
                "a provider needs at least one model",
            ));
        }
        if self.models.iter().any(|m| m.trim().is_empty()) {
            issues.push(SpecIssue::new(
                "spec.models",
                "model names must not be empty",
            ));
        }
        if self.gateway_backend_ref.name.trim().is_empty() {
            issues.push(SpecIssue::new(
                "spec.gatewayBackendRef.name",
                "backend name must not be empty",
            ));
        }
        issues
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_parses_and_validates() {
        let s: InferenceProviderSpec = serde_saphyr::from_str(
            "kind: anthropic\nmodels: [claude-sonnet-4]\nlimits: {requestsPerMinute: 60}\ngatewayBackendRef: {name: anthropic}\n",
        )
        .expect("parses");
        assert_eq!(s.kind, ProviderKind::Anthropic);
        assert!(s.validate().is_empty());
        let bad: InferenceProviderSpec =
            serde_saphyr::from_str("kind: openai\nmodels: ['']\ngatewayBackendRef: {name: ''}\n")
                .expect("parses");
        assert_eq!(bad.validate().len(), 2);
    }

    #[test]
    fn unknown_kind_is_a_parse_error() {
        let r: Result<InferenceProviderSpec, _> =
            serde_saphyr::from_str("kind: gemini\nmodels: [x]\ngatewayBackendRef: {name: b}\n");
        assert!(r.is_err());
    }
}
