//! InferenceProvider + GatewayBackend objects -> the upstreams the relay can use (pure: no I/O).
//!
//! ```text
//! [InferenceProvider], [GatewayBackend] --resolve()--> [Resolved { name, kind, models, limits,
//!                                                        backend: BackendPlan }]
//!                                                   \-> [Unusable { name, reason, message }]
//! ```
//!
//! A provider is usable when its spec validates, its backend exists in the same namespace and
//! the backend validates. Secrets are not read here: the plan names them and the registry
//! ([`super::Providers`]) reads them from `--secrets-dir`. Providers are keyed by name; the
//! router normally watches one namespace, and when two namespaces hold a provider of the same
//! name the first (by namespace) wins and the other is reported unusable.

use std::collections::BTreeMap;

use kvroute_crds::backend::{AuthType, SecretKeyRef};
use kvroute_crds::provider::{ProviderKind, ProviderLimits};
use kvroute_crds::{GatewayBackend, InferenceProvider};

/// How credentials go on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthPlan {
    /// `Authorization: Bearer <secret>`.
    Bearer(SecretKeyRef),
    /// `<header>: <secret>` (e.g. `x-api-key`).
    Header {
        /// Header name, lowercase.
        name: String,
        /// Where the credential is.
        secret: SecretKeyRef,
    },
}

impl AuthPlan {
    /// The Secret key holding the credential.
    pub fn secret(&self) -> &SecretKeyRef {
        match self {
            Self::Bearer(s) | Self::Header { secret: s, .. } => s,
        }
    }
}

/// A GatewayBackend ready to build a client from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendPlan {
    /// Backend object name.
    pub name: String,
    /// Base URL without a trailing slash (`https://host[:port][/prefix]`).
    pub url: String,
    /// CA bundle to trust instead of the platform roots.
    pub ca: Option<SecretKeyRef>,
    /// Server name for SNI and the certificate check, when it differs from the URL host.
    pub sni: Option<String>,
    /// Certificate verification off (testing only; warned and surfaced in metrics).
    pub insecure_skip_verify: bool,
    /// Credentials.
    pub auth: Option<AuthPlan>,
}

/// A provider the relay can send to (once its Secrets are read).
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedProvider {
    /// Provider object name (operator-declared: usable as a metric label).
    pub name: String,
    /// Namespace of the object.
    pub namespace: String,
    /// API dialect.
    pub kind: ProviderKind,
    /// Models the provider serves.
    pub models: Vec<String>,
    /// Limits the relay keeps to.
    pub limits: ProviderLimits,
    /// How to reach it.
    pub backend: BackendPlan,
}

/// A provider the router cannot use, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unusable {
    /// Provider name.
    pub name: String,
    /// Short reason (CamelCase, a condition reason).
    pub reason: &'static str,
    /// What to fix.
    pub message: String,
}

/// The outcome of [`resolve`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resolution {
    /// Usable providers by name.
    pub providers: BTreeMap<String, ResolvedProvider>,
    /// The rest.
    pub unusable: Vec<Unusable>,
}

fn ns_of<K: kube::Resource>(o: &K) -> String {
    o.meta().namespace.clone().unwrap_or_default()
}

fn name_of<K: kube::Resource>(o: &K) -> String {
    o.meta().name.clone().unwrap_or_default()
}

/// The backend plan for one GatewayBackend, or why it cannot be used.
pub fn backend_plan(b: &GatewayBackend) -> Result<BackendPlan, (&'static str, String)> {
    let issues = b.spec.validate();
    if let Some(i) = issues.first() {
        return Err(("InvalidBackend", format!("{}: {}", i.field, i.message)));
    }
    let tls = b.spec.tls.clone().unwrap_or_default();
    let auth = match &b.spec.auth {
        None => None,
        Some(a) => Some(match a.type_ {
            AuthType::Bearer => AuthPlan::Bearer(a.secret_ref.clone()),
            AuthType::Header => {
                let name = a
                    .header_name
                    .as_deref()
                    .unwrap_or_default()
                    .trim()
                    .to_ascii_lowercase();
                if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                    return Err((
                        "InvalidBackend",
                        format!("spec.auth.headerName `{name}` is not a valid header name"),
                    ));
                }
                AuthPlan::Header {
                    name,
                    secret: a.secret_ref.clone(),
                }
            }
        }),
    };
    Ok(BackendPlan {
        name: name_of(b),
        url: b.spec.url.trim_end_matches('/').to_string(),
        ca: tls.ca_secret_ref,
        sni: tls.sni,
        insecure_skip_verify: tls.insecure_skip_verify,
        auth,
    })
}

/// Resolves every provider against the backends of its namespace.
pub fn resolve(providers: &[InferenceProvider], backends: &[GatewayBackend]) -> Resolution {
    let mut out = Resolution::default();
    let mut sorted: Vec<&InferenceProvider> = providers.iter().collect();
    sorted.sort_by_key(|p| (ns_of(*p), name_of(*p)));
    for p in sorted {
        let (name, namespace) = (name_of(p), ns_of(p));
        let unusable = |reason, message: String| Unusable {
            name: name.clone(),
            reason,
            message,
        };
        if out.providers.contains_key(&name) {
            out.unusable.push(unusable(
                "DuplicateName",
                format!("another namespace already has a provider named `{name}`"),
            ));
            continue;
        }
        if let Some(i) = p.spec.validate().first() {
            out.unusable.push(unusable(
                "InvalidSpec",
                format!("{}: {}", i.field, i.message),
            ));
            continue;
        }
        let backend_name = &p.spec.gateway_backend_ref.name;
        let Some(b) = backends
            .iter()
            .find(|b| &name_of(*b) == backend_name && ns_of(*b) == namespace)
        else {
            out.unusable.push(unusable(
                "BackendNotFound",
                format!("GatewayBackend `{backend_name}` does not exist"),
            ));
            continue;
        };
        match backend_plan(b) {
            Err((reason, message)) => out.unusable.push(unusable(reason, message)),
            Ok(backend) => {
                out.providers.insert(
                    name.clone(),
                    ResolvedProvider {
                        name,
                        namespace,
                        kind: p.spec.kind,
                        models: p.spec.models.clone(),
                        limits: p.spec.limits.clone().unwrap_or_default(),
                        backend,
                    },
                );
            }
        }
    }
    out
}

/// The model to ask the provider for: the backend model the client's name resolved to, or
/// the client's own name, when the provider lists it; else the provider's first model.
pub fn provider_model<'a>(
    models: &'a [String],
    backend_model: &str,
    client_model: &str,
) -> &'a str {
    models
        .iter()
        .find(|m| m.as_str() == backend_model)
        .or_else(|| models.iter().find(|m| m.as_str() == client_model))
        .or_else(|| models.first())
        .map_or("", String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_crds::{AnyResource, parse_documents};

    fn doc(kind: &str, ns: &str, name: &str, spec: &str) -> AnyResource {
        let spec: String = spec.lines().map(|l| format!("  {l}\n")).collect();
        let text = format!(
            "apiVersion: kvroute.dev/v1alpha1\nkind: {kind}\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n{spec}"
        );
        parse_documents(&text)
            .expect("parses")
            .pop()
            .expect("one document")
    }

    fn provider(ns: &str, name: &str, yaml: &str) -> InferenceProvider {
        match doc("InferenceProvider", ns, name, yaml) {
            AnyResource::Provider(p) => p,
            other => panic!("not a provider: {other:?}"),
        }
    }

    fn backend(ns: &str, name: &str, yaml: &str) -> GatewayBackend {
        match doc("GatewayBackend", ns, name, yaml) {
            AnyResource::GatewayBackend(b) => b,
            other => panic!("not a backend: {other:?}"),
        }
    }

    #[test]
    fn resolves_against_the_backend_of_its_namespace() {
        let providers = [
            provider(
                "a",
                "cloud",
                "kind: openai\nmodels: [gpt-4o-mini]\nlimits: {requestsPerMinute: 60}\ngatewayBackendRef: {name: oai}\n",
            ),
            provider(
                "a",
                "lost",
                "kind: openai\nmodels: [m]\ngatewayBackendRef: {name: other}\n",
            ),
            provider(
                "b",
                "cloud",
                "kind: openai\nmodels: [m]\ngatewayBackendRef: {name: oai}\n",
            ),
        ];
        let backends = [
            backend(
                "a",
                "oai",
                "url: https://api.example.com/\ntls: {sni: edge.example.com}\nauth: {secretRef: {name: k, key: apiKey}, type: header, headerName: X-Api-Key}\n",
            ),
            backend("b", "other", "url: https://b.example.com\n"),
        ];
        let r = resolve(&providers, &backends);
        let p = &r.providers["cloud"];
        assert_eq!(p.namespace, "a");
        assert_eq!(p.backend.url, "https://api.example.com");
        assert_eq!(p.backend.sni.as_deref(), Some("edge.example.com"));
        assert_eq!(
            p.backend.auth,
            Some(AuthPlan::Header {
                name: "x-api-key".into(),
                secret: SecretKeyRef {
                    name: "k".into(),
                    key: "apiKey".into()
                }
            })
        );
        assert_eq!(p.limits.requests_per_minute, Some(60));
        let reasons: Vec<(&str, &str)> = r
            .unusable
            .iter()
            .map(|u| (u.name.as_str(), u.reason))
            .collect();
        assert_eq!(
            reasons,
            vec![("lost", "BackendNotFound"), ("cloud", "DuplicateName")]
        );
    }

    #[test]
    fn invalid_backends_and_specs_are_unusable() {
        let providers = [
            provider(
                "a",
                "p",
                "kind: openai\nmodels: [m]\ngatewayBackendRef: {name: b}\n",
            ),
            provider(
                "a",
                "q",
                "kind: openai\nmodels: ['']\ngatewayBackendRef: {name: b}\n",
            ),
        ];
        let backends = [backend(
            "a",
            "b",
            "url: http://x\ntls: {insecureSkipVerify: true}\n",
        )];
        let r = resolve(&providers, &backends);
        assert!(r.providers.is_empty());
        assert_eq!(r.unusable[0].reason, "InvalidBackend");
        assert_eq!(r.unusable[1].reason, "InvalidSpec");
    }

    #[test]
    fn the_provider_model_is_chosen_predictably() {
        let models = vec!["small".to_string(), "big".to_string()];
        assert_eq!(provider_model(&models, "big", "alias"), "big");
        assert_eq!(provider_model(&models, "local-x", "small"), "small");
        assert_eq!(provider_model(&models, "local-x", "alias"), "small");
        assert_eq!(provider_model(&[], "a", "b"), "");
    }
}
