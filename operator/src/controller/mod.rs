//! Kubernetes adapters: one kube-runtime Controller per kind. Every reconciler has the same
//! shape: refuse to write unless leading, compute the desired objects and status with the pure
//! functions in [`crate::desired`], server-side apply them under one field manager, patch
//! status, publish Events for notable transitions, and requeue periodically. The four
//! status-only kinds share one generic reconciler ([`refs::reconcile`]).

pub mod pki;
pub mod refs;
pub mod router;
pub mod workerset;

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use parking_lot::Mutex;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::desired::{DesiredError, FIELD_MANAGER, OperatorConfig};
use crate::desired::{Notable, Severity};
use crate::metrics::OperatorMetrics;

/// Why a reconciliation failed. Variant names are the `error` label of
/// `kvroute_operator_reconcile_errors_total`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A desired object could not be built.
    #[error("desired state: {0}")]
    Desired(#[from] DesiredError),
    /// This replica lost the lease: it must not write.
    #[error("not the leader")]
    NotLeader,
    /// A certificate could not be read or made.
    #[error("pki: {0}")]
    Pki(String),
}

impl Error {
    /// Metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "Kube",
            Error::Desired(_) => "Desired",
            Error::NotLeader => "NotLeader",
            Error::Pki(_) => "Pki",
        }
    }
}

/// Shared by every reconciler.
pub struct Ctx {
    /// API client.
    pub client: Client,
    /// Images, router settings, watch scope.
    pub cfg: OperatorConfig,
    /// Metrics.
    pub metrics: OperatorMetrics,
    /// Event recorder.
    pub recorder: Recorder,
    /// Leadership, from the lease loop.
    pub leader: watch::Receiver<bool>,
    /// Periodic requeue after a successful reconcile.
    pub requeue: Duration,
    /// Where the CA lives and how long certificates last.
    pub pki: pki::PkiSettings,
    /// Wakes the PKI loop early (a WorkerSet or Pool appeared and needs its pair).
    pub pki_wake: tokio::sync::Notify,
    /// Wakes the router pass early (a resource names a Secret the router does not mount yet).
    pub router_wake: tokio::sync::Notify,
    failures: Mutex<HashMap<String, u32>>,
}

impl Ctx {
    /// Builds a context.
    pub fn new(
        client: Client,
        cfg: OperatorConfig,
        metrics: OperatorMetrics,
        recorder: Recorder,
        leader: watch::Receiver<bool>,
        requeue: Duration,
    ) -> Self {
        Self {
            client,
            cfg,
            metrics,
            recorder,
            leader,
            requeue,
            pki: pki::PkiSettings::default(),
            pki_wake: tokio::sync::Notify::new(),
            router_wake: tokio::sync::Notify::new(),
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Sets the PKI settings.
    pub fn with_pki(mut self, pki: pki::PkiSettings) -> Self {
        self.pki = pki;
        self
    }

    /// Fails unless this replica holds the lease (a second line of defence: controllers only
    /// run while leading, but a lease can be lost mid-reconcile).
    pub fn ensure_leader(&self) -> Result<(), Error> {
        if *self.leader.borrow() {
            Ok(())
        } else {
            Err(Error::NotLeader)
        }
    }

    /// Counts a reconcile start and returns a guard that records its duration.
    pub fn start(&self, kind: impl Into<Cow<'static, str>>) -> ReconcileTimer<'_> {
        let kind = kind.into();
        self.metrics
            .reconciliations
            .with_label_values(&[kind.as_ref()])
            .inc();
        ReconcileTimer {
            ctx: self,
            kind,
            started: Instant::now(),
        }
    }

    /// The object reconciled fine: its backoff starts over.
    pub fn succeeded(&self, key: &str) {
        self.failures.lock().remove(key);
    }

    /// Publishes events; failures to publish are logged, never fatal.
    pub async fn publish<K: Resource<DynamicType = ()>>(&self, obj: &K, notable: Vec<Notable>) {
        let reference = obj.object_ref(&());
        for n in notable {
            let ev = Event {
                type_: match n.severity {
                    Severity::Normal => EventType::Normal,
                    Severity::Warning => EventType::Warning,
                },
                reason: n.reason,
                note: Some(n.note.chars().take(1000).collect()),
                action: "Reconcile".to_string(),
                secondary: None,
            };
            if let Err(e) = self.recorder.publish(&ev, &reference).await {
                tracing::warn!(error = %e, "could not publish event");
            }
        }
    }
}

/// Records reconcile duration on drop.
pub struct ReconcileTimer<'a> {
    ctx: &'a Ctx,
    kind: Cow<'static, str>,
    started: Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.ctx
            .metrics
            .reconcile_duration
            .with_label_values(&[self.kind.as_ref()])
            .observe(self.started.elapsed().as_secs_f64());
    }
}

/// `kind/namespace/name`, the key of per-object backoff.
pub fn object_key<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    format!(
        "{}/{}/{}",
        K::kind(&()),
        obj.namespace().unwrap_or_default(),
        obj.name_any()
    )
}

/// Backoff after `failures` consecutive failures: 2 s doubling to 5 minutes.
pub fn backoff(failures: u32) -> Duration {
    let secs = 2u64.saturating_mul(1u64 << failures.min(8).saturating_sub(1));
    Duration::from_secs(secs.min(300))
}

/// The error policy of every controller: log, count, and retry with per-object exponential
/// backoff. Losing the lease is not an error worth backing off for.
pub fn error_policy<K: Resource<DynamicType = ()>>(
    obj: Arc<K>,
    err: &Error,
    ctx: Arc<Ctx>,
) -> Action {
    let kind = K::kind(&());
    ctx.metrics
        .reconcile_errors
        .with_label_values(&[kind.as_ref(), err.label()])
        .inc();
    if matches!(err, Error::NotLeader) {
        return Action::await_change();
    }
    let key = object_key(obj.as_ref());
    let n = {
        let mut failures = ctx.failures.lock();
        let n = failures.entry(key.clone()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    let delay = backoff(n);
    tracing::warn!(object = %key, error = %err, failures = n, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Server-side apply of `obj` under the operator's field manager (forcing ownership of the
/// fields it sets: the operator is the only intended writer of its children).
pub async fn apply<T>(api: &Api<T>, obj: &T) -> Result<T, Error>
where
    T: Resource + Serialize + DeserializeOwned + Clone + Debug,
{
    let name = obj
        .meta()
        .name
        .clone()
        .ok_or(DesiredError::MissingMetadata("name"))?;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    Ok(api.patch(&name, &params, &Patch::Apply(obj)).await?)
}

/// Server-side apply of a status (`{apiVersion, kind, status}`) on the status subresource.
pub async fn apply_status<K>(api: &Api<K>, name: &str, status: &impl Serialize) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Debug,
{
    let body = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch_status(name, &params, &Patch::Apply(&body))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(1), Duration::from_secs(2));
        assert_eq!(backoff(2), Duration::from_secs(4));
        assert_eq!(backoff(5), Duration::from_secs(32));
        assert_eq!(backoff(30), Duration::from_secs(256));
        assert!(backoff(u32::MAX) <= Duration::from_secs(300));
    }
}
