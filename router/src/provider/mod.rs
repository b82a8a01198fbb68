//! Overflow to upstream providers: the registry of InferenceProviders (each reached through a
//! GatewayBackend), the decision helpers, and the relay the gateway calls.
//!
//! ```text
//! discovery (reflector | static file) --apply(providers, backends)--> Providers
//!     resolve (config) + Secrets (--secrets-dir, re-read every 2 s) + TLS client (client)
//! gateway: should_overflow(local state, action) && !must_stay_local(...)      (decide)
//!     --Providers::admit(provider, api, stay_local, estimate)--> Admitted | NotTaken
//!     --Admitted::relay(request)--> Response (streamed event by event)       (relay)
//!     \-- InFlight guard: limiter slot back, usage -> metrics + UsageHook (tenant accounting)
//! ```
//!
//! A provider is usable (`ready`) once its spec and backend resolve, its Secrets are readable
//! and its TLS client builds; everything else is reported with a reason by [`Providers::status`]
//! and `kvroute_router_provider_ready`. Local-only and `pii` requests are refused by
//! [`Providers::admit`] whatever the caller decided (defence in depth).

pub mod client;
pub mod config;
pub mod decide;
pub mod limiter;
pub mod metrics;
pub mod relay;
pub mod secrets;

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::response::Response;
use kvroute_crds::{GatewayBackend, InferenceProvider};
use parking_lot::{Mutex, RwLock};
use tokio_util::sync::CancellationToken;

use crate::gateway::GatewayError;
pub use client::{BackendClient, ClientTimeouts};
pub use config::{ResolvedProvider, provider_model};
pub use decide::{OverflowAction, must_stay_local, should_overflow};
pub use limiter::{Limited, Limiter, estimate_tokens};
pub use metrics::ProviderMetrics;
pub use relay::{ClientApi, RelayRequest, TokenUsage};
use secrets::SecretsDir;

/// Usage of one relayed request, reported to the tenant accounting hook when it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderUsage {
    /// InferenceProvider name.
    pub provider: String,
    /// The verified tenant, if any.
    pub tenant: Option<String>,
    /// Prompt tokens the provider reported.
    pub prompt_tokens: u64,
    /// Completion tokens the provider reported.
    pub completion_tokens: u64,
    /// What was reserved for the request on admission (prompt estimate + output limit), so
    /// a limiter can replace its reservation with the real count.
    pub estimated_tokens: u64,
}

/// Called once per relayed request that reported usage: an observer for embedders and tests.
/// The gateway's tenant accounting (tokens, limit settlement, TTFT) goes through the request's
/// own tap instead ([`Admitted::with_tenant`]).
pub type UsageHook = Arc<dyn Fn(&ProviderUsage) + Send + Sync>;

/// Settings of the registry (router flags).
#[derive(Debug, Clone, Default)]
pub struct ProvidersConfig {
    /// `--secrets-dir`: `<dir>/<secret>/<key>`.
    pub secrets_dir: Option<PathBuf>,
    /// Upstream timeouts.
    pub timeouts: ClientTimeouts,
}

/// Whether a provider is usable now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderState {
    /// The router sends overflow to it.
    Ready {
        /// Its backend skips certificate verification.
        insecure: bool,
    },
    /// It cannot be used.
    NotReady {
        /// Condition reason (CamelCase).
        reason: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// One usable provider.
pub struct Entry {
    resolved: ResolvedProvider,
    client: BackendClient,
    limiter: Arc<Mutex<Limiter>>,
    metrics: ProviderMetrics,
}

impl Entry {
    fn name(&self) -> &str {
        &self.resolved.name
    }
}

/// Why an overflow is not taken. The request stays local when a local worker can take it;
/// otherwise [`NotTaken::error`] is the client's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotTaken {
    /// Local-only or `pii`: never leaves the cluster.
    StaysLocal,
    /// No provider of that name is configured.
    UnknownProvider,
    /// The provider is configured but unusable.
    NotReady(&'static str),
    /// The client's API cannot be sent to this provider's kind.
    Unsupported,
    /// The provider's `spec.limits` are reached in this replica.
    Limited(Limited),
}

impl NotTaken {
    /// Metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::StaysLocal => "stays_local",
            Self::UnknownProvider => "unknown_provider",
            Self::NotReady(_) => "not_ready",
            Self::Unsupported => "unsupported_api",
            Self::Limited(l) => l.label(),
        }
    }

    /// The client's error when no local worker can take the request either.
    pub fn error(&self, provider: &str) -> GatewayError {
        match self {
            Self::StaysLocal => GatewayError::NoLocalCapacity(
                "the request must stay on local workers (local-only or personal data) and none can take it now; retry later".into(),
            ),
            Self::UnknownProvider => {
                GatewayError::ProviderUnavailable(format!("provider `{provider}` is not configured"))
            }
            Self::NotReady(reason) => GatewayError::ProviderUnavailable(format!(
                "provider `{provider}` is not ready ({reason})"
            )),
            Self::Unsupported => GatewayError::ProviderUnavailable(format!(
                "provider `{provider}` speaks the Anthropic API; OpenAI requests are not translated to it"
            )),
            Self::Limited(l) => GatewayError::ProviderRateLimited(format!(
                "provider `{provider}` is at its {} limit",
                l.label().replace('_', " ")
            )),
        }
    }
}

/// An overflow admitted against the provider's limits: send it with [`Admitted::relay`].
/// Dropping it unsent gives the reservation back.
pub struct Admitted {
    entry: Arc<Entry>,
    flight: relay::InFlight,
    planned: relay::Planned,
    api: ClientApi,
}

impl std::fmt::Debug for Admitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted")
            .field("provider", &self.entry.name())
            .field("api", &self.api)
            .finish()
    }
}

impl Admitted {
    /// Reports the request's first token (timed from `received_at`, when the gateway got
    /// it) and its usage to its tenant tap, which also holds the tenant's limits until the
    /// answer ends and settles their token charge to the provider's usage.
    #[must_use]
    pub fn with_tenant(mut self, tap: crate::tenant::TenantTap, received_at: Instant) -> Self {
        self.flight.set_tenant(tap, received_at);
        self
    }

    /// Sends the request and returns the client's response (streamed when the client asked
    /// for a stream). Failures are client errors shaped for the client's API.
    pub async fn relay(self, headers: &http::HeaderMap) -> Response {
        let Self {
            entry,
            flight,
            planned,
            api,
        } = self;
        relay::send(entry, api, planned, headers, flight).await
    }
}

type LimiterSlot = (kvroute_crds::provider::ProviderLimits, Arc<Mutex<Limiter>>);

struct Inner {
    timeouts: ClientTimeouts,
    secrets: SecretsDir,
    metrics: ProviderMetrics,
    objects: Mutex<(Vec<InferenceProvider>, Vec<GatewayBackend>)>,
    table: RwLock<BTreeMap<String, Arc<Entry>>>,
    states: RwLock<BTreeMap<String, ProviderState>>,
    /// Limiters by provider name, kept across rebuilds while the limits stay the same.
    limiters: Mutex<HashMap<String, LimiterSlot>>,
    secret_fingerprint: Mutex<u64>,
    hook: RwLock<Option<UsageHook>>,
    /// Serialises rebuilds (discovery and the Secret poll may both trigger one): the table
    /// always reflects the latest objects.
    rebuilding: Mutex<()>,
}

/// The provider registry. Cheap to clone.
#[derive(Clone)]
pub struct Providers(Arc<Inner>);

impl std::fmt::Debug for Providers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Providers")
            .field("states", &*self.0.states.read())
            .finish()
    }
}

impl Providers {
    /// An empty registry.
    pub fn new(cfg: ProvidersConfig, metrics: ProviderMetrics) -> Self {
        Self(Arc::new(Inner {
            timeouts: cfg.timeouts,
            secrets: SecretsDir::new(cfg.secrets_dir),
            metrics,
            objects: Mutex::new((Vec::new(), Vec::new())),
            table: RwLock::new(BTreeMap::new()),
            states: RwLock::new(BTreeMap::new()),
            limiters: Mutex::new(HashMap::new()),
            secret_fingerprint: Mutex::new(0),
            hook: RwLock::new(None),
            rebuilding: Mutex::new(()),
        }))
    }

    /// Sets the tenant accounting hook.
    pub fn set_usage_hook(&self, hook: UsageHook) {
        *self.0.hook.write() = Some(hook);
    }

    /// The metrics.
    pub fn metrics(&self) -> &ProviderMetrics {
        &self.0.metrics
    }

    /// Replaces the Secrets given inline (file mode), used where no mounted file exists.
    pub fn set_inline_secrets(&self, secrets: &[k8s_openapi::api::core::v1::Secret]) {
        self.0.secrets.set_inline(secrets);
    }

    /// Replaces the objects (discovery calls this on every change) and rebuilds the table.
    pub fn apply(&self, providers: Vec<InferenceProvider>, backends: Vec<GatewayBackend>) {
        *self.0.objects.lock() = (providers, backends);
        self.rebuild();
    }

    /// Each provider's state, by name.
    pub fn status(&self) -> BTreeMap<String, ProviderState> {
        self.0.states.read().clone()
    }

    /// Re-reads the Secrets the providers use; rebuilds when any changed. Returns whether it
    /// rebuilt.
    pub fn refresh_secrets(&self) -> bool {
        let fp = self.fingerprint();
        if fp == *self.0.secret_fingerprint.lock() {
            return false;
        }
        self.rebuild();
        true
    }

    /// Polls the Secrets every `every` until `shutdown`.
    pub async fn run(self, every: Duration, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            if self.refresh_secrets() {
                tracing::info!("provider Secrets changed; clients rebuilt");
            }
        }
    }

    fn secret_refs(&self) -> Vec<kvroute_crds::backend::SecretKeyRef> {
        let objects = self.0.objects.lock();
        objects
            .1
            .iter()
            .flat_map(|b| b.spec.secret_refs().into_iter().map(|(_, r)| r.clone()))
            .collect()
    }

    fn fingerprint(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for r in self.secret_refs() {
            r.name.hash(&mut h);
            r.key.hash(&mut h);
            // Only successful reads count: a file that vanished keeps its last good value.
            if let (Ok(v), _) = self.0.secrets.read(&r) {
                v.hash(&mut h);
            }
        }
        h.finish()
    }

    fn read_secret(
        &self,
        r: Option<&kvroute_crds::backend::SecretKeyRef>,
    ) -> Result<Option<Vec<u8>>, secrets::SecretError> {
        let Some(r) = r else { return Ok(None) };
        let (value, fresh_error) = self.0.secrets.read(r);
        if let Some(e) = fresh_error {
            self.0
                .metrics
                .config_errors
                .with_label_values(&[e.label()])
                .inc();
            tracing::warn!(error = %e, "cannot read a provider Secret");
        }
        value.map(Some)
    }

    fn rebuild(&self) {
        let _one_at_a_time = self.0.rebuilding.lock();
        let (providers, backends) = self.0.objects.lock().clone();
        let resolution = config::resolve(&providers, &backends);
        let mut table = BTreeMap::new();
        let mut states = BTreeMap::new();
        let m = &self.0.metrics;
        for u in &resolution.unusable {
            m.config_errors.with_label_values(&[u.reason]).inc();
            tracing::warn!(provider = %u.name, reason = u.reason, message = %u.message, "provider unusable");
            states.insert(
                u.name.clone(),
                ProviderState::NotReady {
                    reason: u.reason,
                    message: u.message.clone(),
                },
            );
        }
        let mut limiters = self.0.limiters.lock();
        for (name, p) in resolution.providers {
            let secrets = self.read_secret(p.backend.ca.as_ref()).and_then(|ca| {
                Ok((
                    ca,
                    self.read_secret(p.backend.auth.as_ref().map(|a| a.secret()))?,
                ))
            });
            let built = match secrets {
                Err(e) => Err(("SecretUnavailable", e.to_string())),
                Ok((ca, key)) => {
                    BackendClient::build(&p.backend, ca.as_deref(), key.as_deref(), self.0.timeouts)
                        .map_err(|e| (e.reason(), e.to_string()))
                }
            };
            match built {
                Err((reason, message)) => {
                    m.config_errors.with_label_values(&[reason]).inc();
                    tracing::warn!(provider = %name, reason, %message, "provider unusable");
                    states.insert(name, ProviderState::NotReady { reason, message });
                }
                Ok(client) => {
                    if client.insecure() {
                        tracing::warn!(provider = %name, backend = %p.backend.name, "GatewayBackend skips TLS certificate verification (insecureSkipVerify): testing only");
                    }
                    let limiter = match limiters.get(&name) {
                        Some((limits, l)) if *limits == p.limits => l.clone(),
                        _ => {
                            let l = Arc::new(Mutex::new(Limiter::new(&p.limits, Instant::now())));
                            limiters.insert(name.clone(), (p.limits.clone(), l.clone()));
                            l
                        }
                    };
                    states.insert(
                        name.clone(),
                        ProviderState::Ready {
                            insecure: client.insecure(),
                        },
                    );
                    table.insert(
                        name,
                        Arc::new(Entry {
                            resolved: p,
                            client,
                            limiter,
                            metrics: m.clone(),
                        }),
                    );
                }
            }
        }
        limiters.retain(|name, _| table.contains_key(name));
        drop(limiters);
        // Series of providers that are gone leave the gauges.
        for old in self.0.states.read().keys() {
            if !states.contains_key(old) {
                let _ = m.ready.remove_label_values(&[old]);
                let _ = m.insecure.remove_label_values(&[old]);
            }
        }
        for (name, state) in &states {
            let (ready, insecure) = match state {
                ProviderState::Ready { insecure } => (1, i64::from(*insecure)),
                ProviderState::NotReady { .. } => (0, 0),
            };
            m.ready.with_label_values(&[name]).set(ready);
            m.insecure.with_label_values(&[name]).set(insecure);
        }
        *self.0.table.write() = table;
        *self.0.states.write() = states;
        *self.0.secret_fingerprint.lock() = self.fingerprint();
    }

    /// Admits an overflow of `request` to `provider`, or says why not (counted). `stay_local`
    /// is [`must_stay_local`] of the request: such requests are never admitted.
    pub fn admit(
        &self,
        provider: &str,
        request: &RelayRequest,
        stay_local: bool,
    ) -> Result<Admitted, NotTaken> {
        let refuse = |n: NotTaken| {
            // An unknown name comes from a policy (operator-declared), still folded to one
            // label so a typo cannot grow series.
            let label = if n == NotTaken::UnknownProvider {
                "unknown"
            } else {
                provider
            };
            self.0
                .metrics
                .refused
                .with_label_values(&[label, n.label()])
                .inc();
            n
        };
        if stay_local {
            return Err(refuse(NotTaken::StaysLocal));
        }
        let Some(entry) = self.0.table.read().get(provider).cloned() else {
            return Err(refuse(match self.0.states.read().get(provider) {
                Some(ProviderState::NotReady { reason, .. }) => NotTaken::NotReady(reason),
                _ => NotTaken::UnknownProvider,
            }));
        };
        if !request.api.supported_by(entry.resolved.kind) {
            return Err(refuse(NotTaken::Unsupported));
        }
        let model = provider_model(
            &entry.resolved.models,
            &request.backend_model,
            &request.client_model,
        );
        let planned = match relay::plan(entry.resolved.kind, request.api, &request.raw, model) {
            Ok(p) => p,
            Err(relay::PlanError::Unsupported) => return Err(refuse(NotTaken::Unsupported)),
            // The gateway decoded this body already; a body it accepted is not refused here.
            Err(relay::PlanError::Invalid(_)) => return Err(refuse(NotTaken::Unsupported)),
        };
        let estimate = estimate_tokens(request.raw.len(), planned.max_output);
        entry
            .limiter
            .lock()
            .try_acquire(Instant::now(), estimate)
            .map_err(|l| refuse(NotTaken::Limited(l)))?;
        let hook = self.0.hook.read().clone();
        let flight = relay::InFlight::new(entry.clone(), hook, request.tenant.clone(), estimate);
        Ok(Admitted {
            entry,
            flight,
            planned,
            api: request.api,
        })
    }

    /// The gateway's one-call entry point: admits and relays, or answers with the refusal as
    /// the client's error (for callers with no local fallback).
    pub async fn relay(&self, provider: &str, request: RelayRequest, stay_local: bool) -> Response {
        match self.admit(provider, &request, stay_local) {
            Ok(admitted) => admitted.relay(&request.headers).await,
            Err(n) => relay::error_response(request.api, &n.error(provider)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_crds::{AnyResource, parse_documents};

    const OBJECTS: &str = r#"
apiVersion: kvroute.dev/v1alpha1
kind: InferenceProvider
metadata: {name: cloud, namespace: ns}
spec:
  kind: openai
  models: [gpt-x]
  limits: {maxConcurrency: 1}
  gatewayBackendRef: {name: oai}
---
apiVersion: kvroute.dev/v1alpha1
kind: InferenceProvider
metadata: {name: claude, namespace: ns}
spec:
  kind: anthropic
  models: [claude-x]
  gatewayBackendRef: {name: anth}
---
apiVersion: kvroute.dev/v1alpha1
kind: GatewayBackend
metadata: {name: oai, namespace: ns}
spec:
  url: http://127.0.0.1:9
  auth: {secretRef: {name: oai-key, key: apiKey}}
---
apiVersion: kvroute.dev/v1alpha1
kind: GatewayBackend
metadata: {name: anth, namespace: ns}
spec:
  url: https://127.0.0.1:9
  tls: {caSecretRef: {name: anth-ca, key: ca.crt}}
  auth: {secretRef: {name: anth-key, key: apiKey}, type: header, headerName: x-api-key}
"#;

    fn objects() -> (Vec<InferenceProvider>, Vec<GatewayBackend>) {
        let (mut p, mut b) = (Vec::new(), Vec::new());
        for d in parse_documents(OBJECTS).expect("parse") {
            match d {
                AnyResource::Provider(x) => p.push(x),
                AnyResource::GatewayBackend(x) => b.push(x),
                _ => {}
            }
        }
        (p, b)
    }

    fn request(api: ClientApi) -> RelayRequest {
        let raw = match api {
            ClientApi::Messages => {
                r#"{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}"#
            }
            _ => r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        };
        RelayRequest {
            api,
            raw: bytes::Bytes::from(raw),
            client_model: "m".into(),
            backend_model: "m".into(),
            headers: http::HeaderMap::new(),
            tenant: Some("team-a".into()),
        }
    }

    #[test]
    fn secrets_gate_readiness_and_are_reread() {
        let dir = tempfile::tempdir().expect("tempdir");
        let providers = Providers::new(
            ProvidersConfig {
                secrets_dir: Some(dir.path().to_path_buf()),
                timeouts: ClientTimeouts::default(),
            },
            ProviderMetrics::unregistered(),
        );
        let (p, b) = objects();
        providers.apply(p, b);
        let s = providers.status();
        assert!(matches!(
            s["cloud"],
            ProviderState::NotReady {
                reason: "SecretUnavailable",
                ..
            }
        ));
        assert_eq!(
            providers
                .admit("cloud", &request(ClientApi::Chat), false)
                .err(),
            Some(NotTaken::NotReady("SecretUnavailable"))
        );
        std::fs::create_dir(dir.path().join("oai-key")).expect("mkdir");
        std::fs::write(dir.path().join("oai-key").join("apiKey"), "sk-1").expect("write");
        assert!(providers.refresh_secrets());
        assert!(!providers.refresh_secrets());
        assert_eq!(
            providers.status()["cloud"],
            ProviderState::Ready { insecure: false }
        );
        // A bad CA bundle is its own reason.
        for (name, key, value) in [("anth-ca", "ca.crt", "junk"), ("anth-key", "apiKey", "k")] {
            std::fs::create_dir(dir.path().join(name)).expect("mkdir");
            std::fs::write(dir.path().join(name).join(key), value).expect("write");
        }
        assert!(providers.refresh_secrets());
        assert!(matches!(
            providers.status()["claude"],
            ProviderState::NotReady {
                reason: "InvalidCaBundle",
                ..
            }
        ));
    }

    #[test]
    fn admission_refuses_pii_unknown_unsupported_and_over_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("oai-key")).expect("mkdir");
        std::fs::write(dir.path().join("oai-key").join("apiKey"), "sk-1").expect("write");
        let providers = Providers::new(
            ProvidersConfig {
                secrets_dir: Some(dir.path().to_path_buf()),
                timeouts: ClientTimeouts::default(),
            },
            ProviderMetrics::unregistered(),
        );
        let (p, b) = objects();
        providers.apply(p, b);
        let chat = request(ClientApi::Chat);
        assert_eq!(
            providers.admit("cloud", &chat, true).err(),
            Some(NotTaken::StaysLocal)
        );
        assert_eq!(
            providers.admit("nope", &chat, false).err(),
            Some(NotTaken::UnknownProvider)
        );
        let first = providers.admit("cloud", &chat, false).expect("admitted");
        assert_eq!(
            providers.admit("cloud", &chat, false).err(),
            Some(NotTaken::Limited(Limited::Concurrency))
        );
        // Dropped unsent: the slot comes back.
        drop(first);
        let again = providers
            .admit("cloud", &chat, false)
            .expect("admitted again");
        drop(again);
        let m = providers.metrics();
        assert_eq!(
            m.refused.with_label_values(&["cloud", "stays_local"]).get(),
            1
        );
        assert_eq!(
            m.refused
                .with_label_values(&["unknown", "unknown_provider"])
                .get(),
            1
        );
        assert_eq!(m.in_flight.with_label_values(&["cloud"]).get(), 0);
        assert_eq!(NotTaken::StaysLocal.error("cloud").status(), 503);
        assert_eq!(
            NotTaken::Limited(Limited::RequestsPerMinute)
                .error("cloud")
                .status(),
            429
        );
    }
}
