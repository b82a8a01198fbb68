//! Keeps the PKI's Secrets (or cert-manager Certificates) current. Like the router loop it
//! belongs to the installation, so it is a loop, not a watch: each pass reads the CA Secret and
//! each namespace's `kvroute-mtls` by name (the operator never lists or watches Secrets),
//! asks [`crate::pki`] what is due, and applies the result. It sleeps until the earliest
//! renewal or CA step, `ctx.requeue` at most, and wakes early when a WorkerSet or Pool
//! reconcile asks ([`Ctx::pki_wake`]).
//!
//! ```text
//! get kvroute-ca --ca_step/apply_ca_step--> create (first start) or apply (stage/promote/drop)
//! list WorkerSets, Pools --transport(), identities()--> namespace -> identities
//!   operator CA:   get kvroute-mtls --plan_mtls/render_mtls--> apply when changed
//!   cert-manager:  apply Certificate per identity; kvroute-mtls keeps only the admin token
//! sleep until min(next renewal, next CA step, requeue) or pki_wake
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kvroute_crds::{InferencePool, InferenceWorkerSet};
use tokio_util::sync::CancellationToken;

use super::{Ctx, Error, apply, backoff};
use crate::desired::tls::{self, TlsMode};
use crate::desired::{FIELD_MANAGER, common_labels};
use crate::pki::{self, CA_SECRET, CaSet, CaStep, Identity, Lifetimes, MTLS_SECRET, PkiError};

/// Where the CA lives and how long certificates last.
#[derive(Debug, Clone, Default)]
pub struct PkiSettings {
    /// Namespace of [`CA_SECRET`]: the operator's own.
    pub ca_namespace: String,
    /// Certificate lifetimes.
    pub lifetimes: Lifetimes,
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn pki_err(e: PkiError) -> Error {
    Error::Pki(e.to_string())
}

fn secret(name: &str, ns: &str, data: BTreeMap<String, Vec<u8>>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(ns.to_string()),
            labels: Some(common_labels("pki", name)),
            ..Default::default()
        },
        type_: Some("Opaque".to_string()),
        data: Some(data.into_iter().map(|(k, v)| (k, ByteString(v))).collect()),
        ..Default::default()
    }
}

fn data_of(s: &Secret) -> BTreeMap<String, Vec<u8>> {
    s.data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect()
}

/// Reads the CA Secret, creates or advances it when due, and returns the CA set with the time
/// of its next step.
async fn ensure_ca(ctx: &Ctx, now: i64) -> Result<(CaSet, Option<i64>), Error> {
    let ns = ctx.pki.ca_namespace.as_str();
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let existing = api.get_opt(CA_SECRET).await?;
    let set = match &existing {
        Some(s) => CaSet::from_data(&data_of(s)).map_err(pki_err)?,
        None => None,
    };
    let lifetimes = ctx.pki.lifetimes;
    let (step, wake) = pki::ca_step(now, set.as_ref(), &lifetimes);
    if step == CaStep::Keep
        && let Some(set) = set
    {
        return Ok((set, wake));
    }
    tracing::info!(?step, namespace = ns, "operator CA step");
    let next = pki::apply_ca_step(now, set, step, &lifetimes)
        .map_err(pki_err)?
        .ok_or_else(|| Error::Pki("CA step left no CA".to_string()))?;
    let obj = secret(CA_SECRET, ns, next.to_data());
    ctx.ensure_leader()?;
    if existing.is_none() {
        // Create, never overwrite: a CA another writer made a moment ago wins.
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let s = api.get(CA_SECRET).await?;
                let set = CaSet::from_data(&data_of(&s))
                    .map_err(pki_err)?
                    .ok_or_else(|| Error::Pki("CA Secret exists without a CA".to_string()))?;
                return Ok((set, None));
            }
            Err(e) => return Err(e.into()),
        }
    } else {
        apply(&api, &obj).await?;
    }
    ctx.metrics
        .ca_steps
        .with_label_values(&[match step {
            CaStep::Keep => "Keep",
            CaStep::Create => "Create",
            CaStep::StageNext => "StageNext",
            CaStep::PromoteNext => "PromoteNext",
            CaStep::DropPrevious => "DropPrevious",
        }])
        .inc();
    let (_, wake) = pki::ca_step(now, Some(&next), &lifetimes);
    Ok((next, wake))
}

/// Brings one namespace's `kvroute-mtls` up to date; returns when its next pair is due.
async fn ensure_mtls(
    ctx: &Ctx,
    ns: &str,
    wanted: &[Identity],
    cas: &CaSet,
    now: i64,
) -> Result<Option<i64>, Error> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let existing = api.get_opt(MTLS_SECRET).await?;
    let data = existing.as_ref().map(data_of).unwrap_or_default();
    let plan = pki::plan_mtls(now, &data, wanted, &cas.trusted(now));
    let next =
        pki::render_mtls(now, &data, wanted, &plan, cas, &ctx.pki.lifetimes).map_err(pki_err)?;
    if existing.is_none() || next != data {
        ctx.ensure_leader()?;
        apply(&api, &secret(MTLS_SECRET, ns, next)).await?;
        for (stem, reason) in &plan.reissue {
            tracing::info!(namespace = ns, identity = %stem, reason = reason.label(), "issued key pair");
            ctx.metrics
                .certificates_issued
                .with_label_values(&[reason.label()])
                .inc();
        }
    }
    Ok(plan.next_check)
}

/// One pass over the whole installation; returns when the next pass is due (unix seconds).
pub async fn reconcile(ctx: &Ctx) -> Result<Option<i64>, Error> {
    let _timer = ctx.start("Pki");
    ctx.ensure_leader()?;
    let now = unix_now();
    let (cas, mut wake) = ensure_ca(ctx, now).await?;
    let c = &ctx.client;
    let scope = ctx.cfg.watch_namespace.as_str();
    let (sets, pools) = if scope.is_empty() {
        (
            Api::<InferenceWorkerSet>::all(c.clone()),
            Api::<InferencePool>::all(c.clone()),
        )
    } else {
        (
            Api::<InferenceWorkerSet>::namespaced(c.clone(), scope),
            Api::<InferencePool>::namespaced(c.clone(), scope),
        )
    };
    let sets = sets.list(&ListParams::default()).await?.items;
    let pools = pools.list(&ListParams::default()).await?.items;
    let transport = tls::transport(&pools);
    let identities = tls::identities(&ctx.cfg, &sets, &transport);
    let mut earliest = |t: Option<i64>| {
        if let Some(t) = t {
            wake = Some(wake.map_or(t, |w| w.min(t)));
        }
    };
    match &transport.mode {
        TlsMode::CertManager(issuer) => {
            for (ns, ids) in &identities {
                let api: Api<DynamicObject> =
                    Api::namespaced_with(c.clone(), ns, &tls::certificate_resource());
                let params = PatchParams::apply(FIELD_MANAGER).force();
                for id in ids {
                    let cert = tls::desired_certificate(id, issuer, ctx.pki.lifetimes.leaf);
                    let name = tls::certificate_name(&id.stem);
                    ctx.ensure_leader()?;
                    api.patch(&name, &params, &Patch::Apply(&cert)).await?;
                }
            }
            // The admin token is the operator's in every mode.
            let rns = ctx.cfg.router_namespace.clone();
            earliest(ensure_mtls(ctx, &rns, &[], &cas, now).await?);
        }
        TlsMode::OperatorCa | TlsMode::Conflict(_) => {
            for (ns, ids) in &identities {
                earliest(ensure_mtls(ctx, ns, ids, &cas, now).await?);
            }
        }
    }
    Ok(wake)
}

/// Runs passes until `stop`: after each, sleeps until the earliest renewal (`ctx.requeue` at
/// most; with backoff after a failure) or until [`Ctx::pki_wake`].
pub async fn run(ctx: Arc<Ctx>, stop: CancellationToken) {
    let mut failures = 0u32;
    loop {
        let delay = match reconcile(&ctx).await {
            Ok(wake) => {
                failures = 0;
                let until = wake
                    .map(|w| w.saturating_sub(unix_now()).max(1))
                    .and_then(|s| u64::try_from(s).ok())
                    .map(Duration::from_secs)
                    .unwrap_or(ctx.requeue);
                until.min(ctx.requeue)
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                ctx.metrics
                    .reconcile_errors
                    .with_label_values(&["Pki", e.label()])
                    .inc();
                tracing::warn!(error = %e, failures, "pki reconcile failed");
                backoff(failures)
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
            _ = ctx.pki_wake.notified() => {}
        }
    }
}
