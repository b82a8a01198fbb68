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
use kvroute_crds::{GatewayBackend, InferencePolicy, InferencePool, InferenceWorkerSet};
use tokio_util::sync::CancellationToken;

use super::{Ctx, Error, apply, backoff};
use crate::desired::router::{desired_router, tokenizer_mounts};
use crate::desired::secrets::{
    SecretUse, backend_secret_uses, mount_secrets, policy_secret_uses, pool_secret_uses,
    router_secrets,
};
use crate::desired::tls::{secure_router, transport};

/// Applies every router object once. The WorkerSets are listed for the tokenizer Secrets
/// and ConfigMaps the router pods mount; Pools, Policies and GatewayBackends for the Secrets
/// the router reads while serving (API keys, JWKS, backend credentials and CAs).
pub async fn reconcile(ctx: &Ctx) -> Result<(), Error> {
    let _timer = ctx.start("Router");
    ctx.ensure_leader()?;
    let c = &ctx.client;
    let sets: Vec<InferenceWorkerSet> = list(ctx).await?;
    let mut objs = desired_router(&ctx.cfg, &tokenizer_mounts(&sets));
    let pools: Vec<InferencePool> = list(ctx).await?;
    let policies: Vec<InferencePolicy> = list(ctx).await?;
    let backends: Vec<GatewayBackend> = list(ctx).await?;
    let uses: Vec<SecretUse> = pools
        .iter()
        .flat_map(|p| pool_secret_uses(&p.spec))
        .chain(policies.iter().flat_map(|p| policy_secret_uses(&p.spec)))
        .chain(backends.iter().flat_map(|b| backend_secret_uses(&b.spec)))
        .collect();
    mount_secrets(&mut objs.deployment, &router_secrets(&uses));
    if ctx.cfg.mtls {
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

/// Every `K` in the watched namespace (all namespaces when unset).
async fn list<K>(ctx: &Ctx) -> Result<Vec<K>, Error>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = if ctx.cfg.watch_namespace.is_empty() {
        Api::all(ctx.client.clone())
    } else {
        Api::namespaced(ctx.client.clone(), &ctx.cfg.watch_namespace)
    };
    Ok(api.list(&ListParams::default()).await?.items)
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
            _ = ctx.router_wake.notified(), if failures == 0 => {}
        }
    }
}
