//! InferenceWorkerSet controller: Deployment + headless Service + NetworkPolicy, status from the
//! Deployment and the worker pods.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use kvroute_crds::condition::Time;
use kvroute_crds::{InferencePool, InferenceWorkerSet};

use super::{Ctx, Error, apply, apply_status, error_policy, object_key};
use crate::desired::WORKER_SET_LABEL;
use crate::desired::tls::{secure_workerset, transport};
use crate::desired::workerset::deployment::desired_deployment;
use crate::desired::workerset::network_policy::desired_network_policy;
use crate::desired::workerset::selector_string;
use crate::desired::workerset::service::desired_service;
use crate::desired::workerset::status::{RolloutFacts, desired_status, notable_transitions};

const KIND: &str = "InferenceWorkerSet";

/// Reconciles one WorkerSet. A spec that fails validation gets conditions and no writes to its
/// children (running workers keep serving the last good spec).
pub async fn reconcile(ws: Arc<InferenceWorkerSet>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let _timer = ctx.start(KIND);
    ctx.ensure_leader()?;
    let ns = ws
        .namespace()
        .ok_or(crate::desired::DesiredError::MissingMetadata("namespace"))?;
    let name = ws.name_any();
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let issues = ws.spec.validate();
    let deployment = if issues.is_empty() {
        apply(
            &Api::<Service>::namespaced(ctx.client.clone(), &ns),
            &desired_service(&ws)?,
        )
        .await?;
        apply(
            &Api::<NetworkPolicy>::namespaced(ctx.client.clone(), &ns),
            &desired_network_policy(&ws, &ctx.cfg)?,
        )
        .await?;
        let mut desired = desired_deployment(&ws, &ctx.cfg)?;
        if ctx.cfg.mtls {
            let pools: Api<InferencePool> = if ctx.cfg.watch_namespace.is_empty() {
                Api::all(ctx.client.clone())
            } else {
                Api::namespaced(ctx.client.clone(), &ctx.cfg.watch_namespace)
            };
            let pools = pools.list(&ListParams::default()).await?.items;
            secure_workerset(&mut desired, &ws, &ctx.cfg, &transport(&pools).mode);
            // Its key pair: issued by the PKI loop, which this wakes.
            ctx.pki_wake.notify_one();
        }
        Some(apply(&deployments, &desired).await?)
    } else {
        tracing::info!(workerset = %name, namespace = %ns, issues = ?issues, "invalid spec; children left as they are");
        deployments.get_opt(&name).await?
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let pods = pods
        .list(&ListParams::default().labels(&selector_string(&name)))
        .await?
        .items;
    let now = Time(Timestamp::now());
    let status = desired_status(
        &ws,
        &issues,
        RolloutFacts::from_deployment(deployment.as_ref()),
        &pods,
        &now,
    );
    let previous = ws.status.clone().unwrap_or_default();
    if status != previous {
        ctx.ensure_leader()?;
        apply_status::<InferenceWorkerSet>(
            &Api::namespaced(ctx.client.clone(), &ns),
            &name,
            &status,
        )
        .await?;
        ctx.publish(
            ws.as_ref(),
            notable_transitions(&previous.conditions, &status.conditions),
        )
        .await;
    }
    ctx.succeeded(&object_key(ws.as_ref()));
    Ok(Action::requeue(ctx.requeue))
}

/// The WorkerSet controller: owns Deployments and Services, watches worker pods (readiness
/// changes update `status.workers`).
pub async fn run(client: Client, ctx: Arc<Ctx>) {
    let ns = ctx.cfg.watch_namespace.clone();
    let api = |c: Client| -> (
        Api<InferenceWorkerSet>,
        Api<Deployment>,
        Api<Service>,
        Api<Pod>,
    ) {
        if ns.is_empty() {
            (
                Api::all(c.clone()),
                Api::all(c.clone()),
                Api::all(c.clone()),
                Api::all(c),
            )
        } else {
            (
                Api::namespaced(c.clone(), &ns),
                Api::namespaced(c.clone(), &ns),
                Api::namespaced(c.clone(), &ns),
                Api::namespaced(c, &ns),
            )
        }
    };
    let (sets, deployments, services, pods) = api(client);
    let managed = watcher::Config::default().labels(WORKER_SET_LABEL);
    Controller::new(sets, watcher::Config::default())
        .owns(deployments, managed.clone())
        .owns(services, managed.clone())
        .watches(pods, managed, |pod: Pod| {
            let owner = pod.labels().get(WORKER_SET_LABEL)?.clone();
            Some(ObjectRef::<InferenceWorkerSet>::new(&owner).within(&pod.namespace()?))
        })
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "workerset controller event");
            }
        })
        .await;
}
