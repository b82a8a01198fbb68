//! `GatewayBackend`: how to reach an external HTTP backend: URL, TLS and credentials from a
//! Secret. The router relays overflow requests through it (its Secrets are mounted into the
//! router from the router's namespace and read from `--secrets-dir`); the operator validates a
//! backend, checks its Secrets (conditions Accepted, ResolvedRefs) and reports Ready=True with
//! reason `Enforced`.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::condition::Condition;
use crate::validation::SpecIssue;

/// Desired state of a GatewayBackend.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "kvroute.dev",
    version = "v1alpha1",
    kind = "GatewayBackend",
    plural = "gatewaybackends",
    namespaced,
    status = "GatewayBackendStatus",
    shortname = "gwb",
    category = "kvroute",
    derive = "PartialEq",
    doc = "An external HTTP backend: URL, TLS settings and credentials from a Secret in the router's namespace. The router relays overflow requests through it (Ready=True, reason Enforced, once its Secrets resolve; TLSVerified=False with insecureSkipVerify).",
    printcolumn(name = "URL", type_ = "string", json_path = ".spec.url"),
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
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.tls) || self.url.startsWith('https://')", "message": "tls settings need an https:// url"}
]))]
pub struct GatewayBackendSpec {
    /// Base URL, e.g. `https://api.openai.com`.
    #[schemars(length(min = 8, max = 2048), regex(pattern = r"^https?://[^\s/]+"))]
    pub url: String,
    /// TLS settings for `https://` URLs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,
    /// Credentials sent with every request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthSpec>,
}

/// TLS settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!(has(self.insecureSkipVerify) && self.insecureSkipVerify) || !has(self.caSecretRef)", "message": "caSecretRef has no effect with insecureSkipVerify"}
]))]
pub struct TlsSpec {
    /// Secret key holding a PEM CA bundle to trust instead of the platform roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret_ref: Option<SecretKeyRef>,
    /// Server name for SNI and certificate checks, when it differs from the URL host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub sni: Option<String>,
    /// Skip certificate verification (testing only: the router logs a warning, sets
    /// `kvroute_router_provider_insecure` and the operator reports TLSVerified=False).
    #[serde(default)]
    pub insecure_skip_verify: bool,
}

/// How credentials are sent.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AuthType {
    /// `Authorization: Bearer <secret>`.
    #[default]
    Bearer,
    /// `<headerName>: <secret>` (e.g. Anthropic's `x-api-key`).
    Header,
}

/// Credentials from a Secret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.type != 'header' || has(self.headerName)", "message": "headerName is required when type is header"}
]))]
pub struct AuthSpec {
    /// The Secret key holding the credential.
    pub secret_ref: SecretKeyRef,
    /// `bearer` (default) or `header`.
    #[serde(default, rename = "type")]
    pub type_: AuthType,
    /// Header name for `type: header`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub header_name: Option<String>,
}

/// A key in a Secret of the router's namespace (the operator mounts it into the router; a pod
/// can mount only Secrets of its own namespace).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Secret name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key inside the Secret's data.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// Observed state of a GatewayBackend.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayBackendStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted` (the spec is valid), `ResolvedRefs` (its Secrets exist with their keys),
    /// `Ready` (True with reason `Enforced`: the router relays through it) and, with
    /// `insecureSkipVerify`, `TLSVerified` (False).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

impl GatewayBackendSpec {
    /// The CEL rules and URL shape, evaluated locally (see [`crate::validation`]).
    pub fn validate(&self) -> Vec<SpecIssue> {
        let mut issues = Vec::new();
        let https = self.url.starts_with("https://");
        let host = self
            .url
            .strip_prefix("https://")
            .or_else(|| self.url.strip_prefix("http://"));
        if host.is_none_or(|h| {
            h.is_empty() || h.starts_with('/') || h.chars().any(char::is_whitespace)
        }) {
            issues.push(SpecIssue::new(
                "spec.url",
                "url must look like http(s)://host[:port][/path]",
            ));
        }
        if let Some(tls) = &self.tls {
            if !https {
                issues.push(SpecIssue::new(
                    "spec.tls",
                    "tls settings need an https:// url",
                ));
            }
            if tls.insecure_skip_verify && tls.ca_secret_ref.is_some() {
                issues.push(SpecIssue::new(
                    "spec.tls.caSecretRef",
                    "caSecretRef has no effect with insecureSkipVerify",
                ));
            }
        }
        if let Some(auth) = &self.auth
            && auth.type_ == AuthType::Header
            && auth
                .header_name
                .as_deref()
                .is_none_or(|h| h.trim().is_empty())
        {
            issues.push(SpecIssue::new(
                "spec.auth.headerName",
                "headerName is required when type is header",
            ));
        }
        issues
    }

    /// Secrets this backend reads, with the key it needs from each.
    pub fn secret_refs(&self) -> Vec<(&'static str, &SecretKeyRef)> {
        let mut refs = Vec::new();
        if let Some(auth) = &self.auth {
            refs.push(("spec.auth.secretRef", &auth.secret_ref));
        }
        if let Some(ca) = self.tls.as_ref().and_then(|t| t.ca_secret_ref.as_ref()) {
            refs.push(("spec.tls.caSecretRef", ca));
        }
        refs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> GatewayBackendSpec {
        serde_saphyr::from_str(yaml).expect("spec parses")
    }

    #[test]
    fn backend_with_header_auth() {
        let s = spec(
            "url: https://api.anthropic.com\ntls: {sni: api.anthropic.com}\nauth: {secretRef: {name: anth, key: apiKey}, type: header, headerName: x-api-key}\n",
        );
        assert!(s.validate().is_empty(), "{:?}", s.validate());
        assert_eq!(s.secret_refs().len(), 1);
    }

    #[test]
    fn cel_twins() {
        let s = spec(
            "url: http://x\ntls: {insecureSkipVerify: true, caSecretRef: {name: c, key: ca.crt}}\nauth: {secretRef: {name: a, key: k}, type: header}\n",
        );
        let fields: Vec<String> = s.validate().into_iter().map(|i| i.field).collect();
        assert_eq!(
            fields,
            vec!["spec.tls", "spec.tls.caSecretRef", "spec.auth.headerName"]
        );
        assert_eq!(spec("url: ftp://x\n").validate()[0].field, "spec.url");
        assert_eq!(spec("url: https://\n").validate()[0].field, "spec.url");
    }
}
