//! Controllers of the status-only kinds (InferencePool, InferencePolicy, InferenceProvider,
//! GatewayBackend). One generic reconciler serves all four: it fetches what the kind's
//! [`RefStatus::needs`] asks for, lets the pure [`RefStatus::decide`] compute the status, and
//! writes it when it changed.
//!
//! ```text
//! K --needs()--> list/get in K's namespace --> Inventory --decide(now)--> status
//!     status != previous ? patch_status + events on Ready changes : nothing
//!     requeue: periodic when settled, within 15 s otherwise
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, ListParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use kvroute_crds::condition::Time;
use kvroute_crds::{
    GatewayBackend, InferencePolicy, InferencePool, InferenceProvider, InferenceWorkerSet,
};
use serde::de::DeserializeOwned;

use super::{Ctx, Error, apply_status, error_policy, object_key};
use crate::desired::DesiredError;
use crate::desired::refs::{Inventory, Needs, RefStatus, ready_events, settled};
use crate::desired::secrets::{mountable, mounted_secrets};
use crate::desired::tls::{self, TlsMode, TransportFacts};
use crate::permissions::ROUTER_NAME;
use crate::pki::MTLS_SECRET;

/// How soon an unsettled resource is re-checked (at most; never later than `ctx.requeue`).
const NOT_SETTLED_RECHECK: Duration = Duration::from_secs(15);

async fn list<K>(client: &Client, ns: &str) -> Result<Vec<K>, Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug,
{
    Ok(Api::<K>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?
        .items)
}

/// Fetches what `needs` names from `ns`; Secrets from the router's namespace (the router
/// mounts them from there), with the router Deployment's Secret mounts. Of a Secret only its
/// key names are kept.
async fn inventory(
    client: &Client,
    ns: &str,
    router_ns: &str,
    needs: Needs,
) -> Result<Inventory, Error> {
    let mut inv = Inventory {
        router_namespace: router_ns.to_string(),
        ..Inventory::default()
    };
    if needs.worker_sets {
        inv.worker_sets = list(client, ns).await?;
    }
    if needs.providers {
        inv.providers = list(client, ns).await?;
    }
    if needs.pools {
        inv.pools = list(client, ns).await?;
    }
    if needs.backends {
        inv.backends = list(client, ns).await?;
    }
    if !needs.secrets.is_empty() {
        inv.router_mounts = Api::<Deployment>::namespaced(client.clone(), router_ns)
            .get_opt(ROUTER_NAME)
            .await?
            .map(|d| mounted_secrets(&d));
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), router_ns);
    for name in needs.secrets {
        if let Some(s) = secrets.get_opt(&name).await? {
            for (secret, key) in needs.jwks.iter().filter(|(s, _)| *s == name) {
                if let Some(v) = s.data.as_ref().and_then(|d| d.get(key)) {
                    inv.jwks.insert((secret.clone(), key.clone()), v.0.clone());
                }
            }
            let keys: BTreeSet<String> = s.data.into_iter().flatten().map(|(k, _)| k).collect();
            inv.secrets.insert(name, keys);
        }
    }
    Ok(inv)
}

/// What a pool's transport conditions read: every pool in scope (for the installation's mode
/// and gateway Secret), the key names of the namespace's `kvroute-mtls`, the Ready state of
/// the pool's cert-manager Certificates, and the key names of the gateway Secret it names.
async fn transport_facts(
    ctx: &Ctx,
    ns: &str,
    stems: Vec<String>,
    gateway_secret: Option<String>,
) -> Result<TransportFacts, Error> {
    let client = &ctx.client;
    let pools = scoped::<InferencePool>(client, &ctx.cfg.watch_namespace)
        .list(&ListParams::default())
        .await?
        .items;
    let transport = tls::transport(&pools);
    let keys =
        |s: Secret| -> BTreeSet<String> { s.data.into_iter().flatten().map(|(k, _)| k).collect() };
    let mtls_keys = Api::<Secret>::namespaced(client.clone(), ns)
        .get_opt(MTLS_SECRET)
        .await?
        .map(keys);
    let mut certificates = BTreeMap::new();
    if let TlsMode::CertManager(_) = &transport.mode {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), ns, &tls::certificate_resource());
        for stem in &stems {
            let name = tls::certificate_name(stem);
            if let Some(c) = api.get_opt(&name).await? {
                certificates.insert(name, tls::certificate_ready(&c));
            }
        }
    }
    let router_ns = ctx.cfg.router_namespace.clone();
    let gateway_keys = match &gateway_secret {
        // The pool names this Secret, so this get cannot be narrowed by resourceNames.
        Some(name) => Api::<Secret>::namespaced(client.clone(), &router_ns)
            .get_opt(name)
            .await?
            .map(keys),
        None => None,
    };
    Ok(TransportFacts {
        transport,
        stems,
        router_namespace: router_ns,
        mtls_keys,
        certificates,
        gateway_keys,
    })
}

/// Reconciles one status-only resource: only the lease holder writes, the status is decided
/// by the kind's pure [`RefStatus::decide`] and written only when it changed.
pub async fn reconcile<K>(obj: Arc<K>, ctx: Arc<Ctx>) -> Result<Action, Error>
where
    K: RefStatus<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
{
    let _timer = ctx.start(K::kind(&()));
    ctx.ensure_leader()?;
    let ns = obj
        .namespace()
        .ok_or(DesiredError::MissingMetadata("namespace"))?;
    let needs = obj.needs();
    let transport = needs.transport.clone();
    let mut inv = inventory(&ctx.client, &ns, &ctx.cfg.router_namespace, needs).await?;
    if let (Some(gateway_secret), true) = (transport, ctx.cfg.mtls) {
        let stems = obj.identity_stems(&inv);
        inv.transport = Some(transport_facts(&ctx, &ns, stems, gateway_secret).await?);
    }
    let status = obj.decide(&inv, &Time(Timestamp::now()));
    let previous = obj.status().cloned().unwrap_or_default();
    if status != previous {
        ctx.ensure_leader()?;
        apply_status::<K>(
            &Api::namespaced(ctx.client.clone(), &ns),
            &obj.name_any(),
            &status,
        )
        .await?;
        ctx.publish(
            obj.as_ref(),
            ready_events(K::conditions(&previous), K::conditions(&status)),
        )
        .await;
    }
    ctx.succeeded(&object_key(obj.as_ref()));
    let unmounted = obj.secret_uses().iter().any(|u| {
        mountable(&u.name)
            && !inv
                .router_mounts
                .as_ref()
                .is_some_and(|m| m.contains(&u.name))
    });
    if unmounted {
        // A Secret this resource names (existing yet or not) is not in the router's pod
        // template: the router pass adds it now rather than at its next period.
        ctx.router_wake.notify_one();
    }
    // Certificates appear without an event this controller sees (it never watches Secrets).
    let tls_pending = inv.transport.is_some()
        && K::conditions(&status).iter().any(|c| {
            (c.type_ == tls::TRANSPORT_SECURITY || c.type_ == tls::GATEWAY_TLS)
                && c.status != "True"
        });
    if tls_pending {
        // A new pool's picker pair (or a changed mode) is the PKI loop's to issue.
        ctx.pki_wake.notify_one();
    }
    Ok(if settled(K::conditions(&status)) && !tls_pending {
        Action::requeue(ctx.requeue)
    } else {
        Action::requeue(ctx.requeue.min(NOT_SETTLED_RECHECK))
    })
}

fn scoped<K>(client: &Client, ns: &str) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
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

/// Runs the four status-only controllers until they end.
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
        .run(reconcile::<InferencePool>, error_policy, ctx.clone());

    let policies = Controller::new(scoped::<InferencePolicy>(&client, &ns), cfg.clone());
    let policy_store = policies.store();
    let policies = policies
        .watches(
            scoped::<InferencePool>(&client, &ns),
            cfg.clone(),
            move |p| same_namespace(&policy_store, p.namespace()),
        )
        .run(reconcile::<InferencePolicy>, error_policy, ctx.clone());

    let providers = Controller::new(scoped::<InferenceProvider>(&client, &ns), cfg.clone());
    let provider_store = providers.store();
    let providers = providers
        .watches(
            scoped::<GatewayBackend>(&client, &ns),
            cfg.clone(),
            move |b| same_namespace(&provider_store, b.namespace()),
        )
        .run(reconcile::<InferenceProvider>, error_policy, ctx.clone());

    let backends = Controller::new(scoped::<GatewayBackend>(&client, &ns), cfg).run(
        reconcile::<GatewayBackend>,
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
