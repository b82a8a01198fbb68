//! Keeps the router's objects applied. They belong to the installation, not to one resource,
//! so this is a periodic loop rather than a watch-driven controller: every pass re-applies the
//! desired objects (server-side apply is idempotent and restores drift).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, ListParams};
use kvroute_crds::{InferencePool, InferenceWorkerSet};
use tokio_util::sync::CancellationToken;

use super::{Ctx, Error, apply, backoff};
use crate::desired::router::{desired_router, tokenizer_mounts};
use crate::desired::tls::{secure_router, transport};

/// Applies every router object once. The WorkerSets are listed for the tokenizer Secrets
/// and ConfigMaps the router pods mount.
pub async fn reconcile(ctx: &Ctx) -> Result<(), Error> {
    let _timer = ctx.start("Router");
    ctx.ensure_leader()?;
    let c = &ctx.client;
    let sets_api: Api<InferenceWorkerSet> = if ctx.cfg.watch_namespace.is_empty() {
        Api::all(c.clone())
    } else {
        Api::namespaced(c.clone(), &ctx.cfg.watch_namespace)
    };
    let sets = sets_api.list(&ListParams::default()).await?.items;
    let mut objs = desired_router(&ctx.cfg, &tokenizer_mounts(&sets));
    if ctx.cfg.mtls {
        let pools: Api<InferencePool> = if ctx.cfg.watch_namespace.is_empty() {
            Api::all(c.clone())
        } else {
            Api::namespaced(c.clone(), &ctx.cfg.watch_namespace)
        };
        let pools = pools.list(&ListParams::default()).await?.items;
        secure_router(&mut objs.deployment, &transport(&pools));
    }
    let ns = ctx.cfg.router_namespace.as_str();
    apply(
        &Api::<ServiceAccount>::namespaced(c.clone(), ns),
        &objs.service_account,
    )
    .await?;
    if let Some((role, binding)) = &objs.role {
        let wns = ctx.cfg.watch_namespace.as_str();
        apply(&Api::<Role>::namespaced(c.clone(), wns), role).await?;
        apply(&Api::<RoleBinding>::namespaced(c.clone(), wns), binding).await?;
    }
    if let Some((role, binding)) = &objs.cluster_role {
        apply(&Api::<ClusterRole>::all(c.clone()), role).await?;
        apply(&Api::<ClusterRoleBinding>::all(c.clone()), binding).await?;
    }
    let services = Api::<Service>::namespaced(c.clone(), ns);
    apply(&services, &objs.service).await?;
    apply(&services, &objs.ingest_service).await?;
    apply(
        &Api::<NetworkPolicy>::namespaced(c.clone(), ns),
        &objs.network_policy,
    )
    .await?;
    apply(
        &Api::<Deployment>::namespaced(c.clone(), ns),
        &objs.deployment,
    )
    .await?;
    Ok(())
}

/// Re-applies the router every `ctx.requeue` (sooner, with backoff, after a failure) until
/// `stop`.
pub async fn run(ctx: Arc<Ctx>, stop: CancellationToken) {
    let mut failures = 0u32;
    loop {
        let delay = match reconcile(&ctx).await {
            Ok(()) => {
                failures = 0;
                ctx.requeue.min(Duration::from_secs(60))
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                ctx.metrics
                    .reconcile_errors
                    .with_label_values(&["Router", e.label()])
                    .inc();
                tracing::warn!(error = %e, failures, "router reconcile failed");
                backoff(failures)
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}
