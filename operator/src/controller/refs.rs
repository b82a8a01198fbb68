//! Controllers of the reference kinds (InferencePool, InferencePolicy, InferenceProvider,
//! GatewayBackend). They write nothing but status: each resolves the names in its spec against
//! the namespace and reports the result in conditions (and, for pools, the ready targets).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use kvroute_crds::backend::GatewayBackendStatus;
use kvroute_crds::condition::Time;
use kvroute_crds::policy::InferencePolicyStatus;
use kvroute_crds::pool::InferencePoolStatus;
use kvroute_crds::provider::InferenceProviderStatus;
use kvroute_crds::{
    GatewayBackend, InferencePolicy, InferencePool, InferenceProvider, InferenceWorkerSet,
};
use serde::de::DeserializeOwned;

use super::{Ctx, Error, apply_status, error_policy, object_key};
use crate::desired::DesiredError;
use crate::desired::refs::{
    Inventory, backend_conditions, policy_conditions, pool_status, provider_conditions,
};
use crate::desired::workerset::{Notable, Severity};

fn namespace<K: Resource>(obj: &K) -> Result<String, Error> {
    Ok(obj
        .meta()
        .namespace
        .clone()
        .ok_or(DesiredError::MissingMetadata("namespace"))?)
}

async fn list<K>(client: &Client, ns: &str) -> Result<Vec<K>, Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    Ok(Api::<K>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?
        .items)
}

fn now() -> Time {
    Time(Timestamp::now())
}

/// Not-ready resources are re-checked soon: what they wait for (a Secret, a WorkerSet becoming
/// ready in another controller's time) may not trigger a watch event on them.
fn requeue_for(ctx: &Ctx, conditions: &[kvroute_crds::condition::Condition]) -> Action {
    if kvroute_crds::condition::is_true(conditions, kvroute_crds::condition::READY) {
        Action::requeue(ctx.requeue)
    } else {
        Action::requeue(ctx.requeue.min(NOT_READY_RECHECK))
    }
}

const NOT_READY_RECHECK: std::time::Duration = std::time::Duration::from_secs(15);

/// Events when Ready flips.
fn ready_events(
    old: &[kvroute_crds::condition::Condition],
    new: &[kvroute_crds::condition::Condition],
) -> Vec<Notable> {
    use kvroute_crds::condition::{READY, find};
    let (Some(n), o) = (find(new, READY), find(old, READY)) else {
        return Vec::new();
    };
    if o.is_some_and(|o| o.status == n.status && o.reason == n.reason) {
        return Vec::new();
    }
    let severity = if n.status == "True" {
        Severity::Normal
    } else {
        Severity::Warning
    };
    vec![Notable {
        severity,
        reason: n.reason.clone(),
        note: n.message.clone(),
    }]
}

/// Reconciles an InferencePool.
pub async fn reconcile_pool(pool: Arc<InferencePool>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let _timer = ctx.start("InferencePool");
    ctx.ensure_leader()?;
    let ns = namespace(pool.as_ref())?;
    let inv = Inventory {
        worker_sets: list(&ctx.client, &ns).await?,
        providers: list(&ctx.client, &ns).await?,
        ..Default::default()
    };
    let previous = pool.status.clone().unwrap_or_default();
    let (models, conditions) = pool_status(
        &pool.spec,
        pool.metadata.generation,
        &previous.conditions,
        &inv,
        &now(),
    );
    let status = InferencePoolStatus {
        observed_generation: pool.metadata.generation,
        models,
        conditions,
    };
    if status != previous {
        apply_status::<InferencePool>(
            &Api::namespaced(ctx.client.clone(), &ns),
            &pool.name_any(),
            &status,
        )
        .await?;
        ctx.publish(
            pool.as_ref(),
            ready_events(&previous.conditions, &status.conditions),
        )
        .await;
    }
    ctx.succeeded(&object_key(pool.as_ref()));
    Ok(requeue_for(&ctx, &status.conditions))
}

/// Reconciles an InferencePolicy.
pub async fn reconcile_policy(
    policy: Arc<InferencePolicy>,
    ctx: Arc<Ctx>,
) -> Result<Action, Error> {
    let _timer = ctx.start("InferencePolicy");
    ctx.ensure_leader()?;
    let ns = namespace(policy.as_ref())?;
    let inv = Inventory {
        worker_sets: list(&ctx.client, &ns).await?,
        providers: list(&ctx.client, &ns).await?,
        pools: list(&ctx.client, &ns).await?,
        ..Default::default()
    };
    let previous = policy.status.clone().unwrap_or_default();
    let conditions = policy_conditions(
        &policy.spec,
        policy.metadata.generation,
        &previous.conditions,
        &inv,
        &now(),
    );
    let status = InferencePolicyStatus {
        observed_generation: policy.metadata.generation,
        conditions,
    };
    if status != previous {
        apply_status::<InferencePolicy>(
            &Api::namespaced(ctx.client.clone(), &ns),
            &policy.name_any(),
            &status,
        )
        .await?;
        ctx.publish(
            policy.as_ref(),
            ready_events(&previous.conditions, &status.conditions),
        )
        .await;
    }
    ctx.succeeded(&object_key(policy.as_ref()));
    Ok(requeue_for(&ctx, &status.conditions))
}

/// Reconciles an InferenceProvider.
pub async fn reconcile_provider(
    provider: Arc<InferenceProvider>,
    ctx: Arc<Ctx>,
) -> Result<Action, Error> {
    let _timer = ctx.start("InferenceProvider");
    ctx.ensure_leader()?;
    let ns = namespace(provider.as_ref())?;
    let inv = Inventory {
        backends: list(&ctx.client, &ns).await?,
        ..Default::default()
    };
    let previous = provider.status.clone().unwrap_or_default();
    let conditions = provider_conditions(
        &provider.spec,
        provider.metadata.generation,
        &previous.conditions,
        &inv,
        &now(),
    );
    let status = InferenceProviderStatus {
        observed_generation: provider.metadata.generation,
        conditions,
    };
    if status != previous {
        apply_status::<InferenceProvider>(
            &Api::namespaced(ctx.client.clone(), &ns),
            &provider.name_any(),
            &status,
        )
        .await?;
        ctx.publish(
            provider.as_ref(),
            ready_events(&previous.conditions, &status.conditions),
        )
        .await;
    }
    ctx.succeeded(&object_key(provider.as_ref()));
    Ok(requeue_for(&ctx, &status.conditions))
}

/// Reconciles a GatewayBackend. Only the Secrets it names are read, and only their key names
/// are kept.
pub async fn reconcile_backend(
    backend: Arc<GatewayBackend>,
    ctx: Arc<Ctx>,
) -> Result<Action, Error> {
    let _timer = ctx.start("GatewayBackend");
    ctx.ensure_leader()?;
    let ns = namespace(backend.as_ref())?;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let mut keys = BTreeMap::new();
    for (_, r) in backend.spec.secret_refs() {
        if let Some(s) = secrets.get_opt(&r.name).await? {
            let names: BTreeSet<String> = s.data.into_iter().flatten().map(|(k, _)| k).collect();
            keys.insert(r.name.clone(), names);
        }
    }
    let inv = Inventory {
        secrets: keys,
        ..Default::default()
    };
    let previous = backend.status.clone().unwrap_or_default();
    let conditions = backend_conditions(
        &backend.spec,
        backend.metadata.generation,
        &previous.conditions,
        &inv,
        &now(),
    );
    let status = GatewayBackendStatus {
        observed_generation: backend.metadata.generation,
        conditions,
    };
    if status != previous {
        apply_status::<GatewayBackend>(
            &Api::namespaced(ctx.client.clone(), &ns),
            &backend.name_any(),
            &status,
        )
        .await?;
        ctx.publish(
            backend.as_ref(),
            ready_events(&previous.conditions, &status.conditions),
        )
        .await;
    }
    ctx.succeeded(&object_key(backend.as_ref()));
    Ok(requeue_for(&ctx, &status.conditions))
}

fn scoped<K>(client: &Client, ns: &str) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    if ns.is_empty() {
        Api::all(client.clone())
    } else {
        Api::namespaced(client.clone(), ns)
    }
}

/// Every object of `store` in `ns`: a change in a namespace re-checks its dependents.
fn same_namespace<K: Resource<DynamicType = ()> + Clone>(
    store: &Store<K>,
    ns: Option<String>,
) -> Vec<ObjectRef<K>> {
    store
        .state()
        .iter()
        .filter(|o| o.meta().namespace == ns)
        .map(|o| ObjectRef::from_obj(o.as_ref()))
        .collect()
}

async fn drain<T, E: std::fmt::Display>(stream: impl futures::Stream<Item = Result<T, E>>) {
    stream
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "controller event");
            }
        })
        .await;
}

/// Runs the four reference controllers until they end.
pub async fn run(client: Client, ctx: Arc<Ctx>) {
    let ns = ctx.cfg.watch_namespace.clone();
    let cfg = watcher::Config::default();

    let pools = Controller::new(scoped::<InferencePool>(&client, &ns), cfg.clone());
    let pool_store = pools.store();
    let store2 = pool_store.clone();
    let pools = pools
        .watches(
            scoped::<InferenceWorkerSet>(&client, &ns),
            cfg.clone(),
            move |w| same_namespace(&pool_store, w.namespace()),
        )
        .watches(
            scoped::<InferenceProvider>(&client, &ns),
            cfg.clone(),
            move |p| same_namespace(&store2, p.namespace()),
        )
        .run(reconcile_pool, error_policy, ctx.clone());

    let policies = Controller::new(scoped::<InferencePolicy>(&client, &ns), cfg.clone());
    let policy_store = policies.store();
    let policies = policies
        .watches(
            scoped::<InferencePool>(&client, &ns),
            cfg.clone(),
            move |p| same_namespace(&policy_store, p.namespace()),
        )
        .run(reconcile_policy, error_policy, ctx.clone());

    let providers = Controller::new(scoped::<InferenceProvider>(&client, &ns), cfg.clone());
    let provider_store = providers.store();
    let providers = providers
        .watches(
            scoped::<GatewayBackend>(&client, &ns),
            cfg.clone(),
            move |b| same_namespace(&provider_store, b.namespace()),
        )
        .run(reconcile_provider, error_policy, ctx.clone());

    let backends = Controller::new(scoped::<GatewayBackend>(&client, &ns), cfg).run(
        reconcile_backend,
        error_policy,
        ctx,
    );

    tokio::join!(
        drain(pools),
        drain(policies),
        drain(providers),
        drain(backends)
    );
}
