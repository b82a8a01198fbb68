//! Discovery from the Kubernetes API (`--kubernetes`): reflectors over InferenceWorkerSets,
//! InferencePools and the worker Pods (label `kvroute.dev/workerset`), in one namespace or
//! all. Any change rebuilds the whole catalog from the three stores (a few hundred objects:
//! cheaper to rebuild than to patch). Discovery counts as synced once all three initial
//! lists have arrived. InferencePolicies have their own watch ([`super::policies`]).
//!
//! With `--gie-inference-pool` two more reflectors run: GIE InferencePools
//! (`inference.networking.k8s.io/v1`) and every Pod of the watched namespace(s) (their
//! selectors are arbitrary labels); the selected pools' pods join the catalog through
//! [`super::gie::add_gie_pools`], and sync waits for those lists too.
//!
//! ```text
//! watcher(WorkerSets) --reflector--> Store --+
//! watcher(Pools) -------reflector--> Store --+--(any event)--> build_catalog(Pods) --> RouterState
//! watcher(Pods) --------reflector--> Store --+      |  \--> build_tokenizer_plan --> Tokenizers
//! watcher(GIE pools) ---reflector--> Store --+--> add_gie_pools (only with --gie-inference-pool)
//! watcher(all Pods) ----reflector--> Store --+
//! ```

use std::sync::Arc;

use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use kvroute_crds::{GieInferencePool, InferencePool, InferenceWorkerSet};
use tokio_util::sync::CancellationToken;

use super::gie::{GieMetrics, GieOutcome, GieSelection, add_gie_pools, labeled_pod};
use super::tokenizers::build_tokenizer_plan;
use super::{PodView, WORKER_SET_LABEL, WorkerSource, build_catalog};
use crate::state::RouterState;

/// Watches the API server and publishes the catalog.
pub struct KubernetesDiscovery {
    client: Client,
    namespace: Option<String>,
    state: RouterState,
    providers: Option<crate::provider::Providers>,
    gie: GieSelection,
    gie_metrics: Option<GieMetrics>,
}

/// The GIE side of the watch: InferencePools and all pods (`None` when the feature is off).
struct GieStores {
    pools: Store<GieInferencePool>,
    pods: Store<Pod>,
}

/// A pod as discovery needs it; `None` without the WorkerSet label.
pub fn pod_view(pod: &Pod) -> Option<PodView> {
    let worker_set = pod.metadata.labels.as_ref()?.get(WORKER_SET_LABEL)?.clone();
    let status = pod.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let deleting = pod.metadata.deletion_timestamp.is_some();
    Some(PodView {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        worker_set,
        ip: status
            .and_then(|s| s.pod_ip.clone())
            .filter(|ip| !ip.is_empty()),
        ready: ready && !deleting,
    })
}

impl KubernetesDiscovery {
    /// Connects with the in-cluster or kubeconfig credentials.
    pub async fn connect(namespace: Option<String>, state: RouterState) -> anyhow::Result<Self> {
        let client = Client::try_default().await?;
        Ok(Self {
            client,
            namespace,
            state,
            providers: None,
            gie: GieSelection::default(),
            gie_metrics: None,
        })
    }

    /// Also takes workers from the GIE InferencePools `selection` names (nothing is watched
    /// when it names none), publishing their states to `metrics`.
    pub fn with_gie(mut self, selection: GieSelection, metrics: GieMetrics) -> Self {
        self.gie = selection;
        self.gie_metrics = Some(metrics);
        self
    }

    /// Also watches InferenceProviders and GatewayBackends for `providers`.
    pub fn with_providers(mut self, providers: crate::provider::Providers) -> Self {
        self.providers = Some(providers);
        self
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        match &self.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        }
    }

    /// Runs the watches until `shutdown`. Watch errors are retried with backoff (logged);
    /// the function returns only on shutdown.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        // InferencePolicies: their own watch (super::policies), ended by the same token.
        let policies = super::policies::PolicyWatch::new(self.api(), self.state.clone());
        tokio::spawn(policies.run(shutdown.clone()));
        let (sets, sets_w) = reflector::store::<InferenceWorkerSet>();
        let (pools, pools_w) = reflector::store::<InferencePool>();
        let (pods, pods_w) = reflector::store::<Pod>();
        let pod_cfg = watcher::Config::default().labels(WORKER_SET_LABEL);
        let s1 = reflector::reflector(
            sets_w,
            watcher(self.api::<InferenceWorkerSet>(), watcher::Config::default()),
        )
        .default_backoff()
        .map_ok(|_| ())
        .boxed();
        let s2 = reflector::reflector(
            pools_w,
            watcher(self.api::<InferencePool>(), watcher::Config::default()),
        )
        .default_backoff()
        .map_ok(|_| ())
        .boxed();
        let s3 = reflector::reflector(pods_w, watcher(self.api::<Pod>(), pod_cfg))
            .default_backoff()
            .map_ok(|_| ())
            .boxed();
        let mut streams = vec![s1, s2, s3];
        let gie = if self.gie.enabled() {
            let (gie_pools, gie_pools_w) = reflector::store::<GieInferencePool>();
            let (all_pods, all_pods_w) = reflector::store::<Pod>();
            streams.push(
                reflector::reflector(
                    gie_pools_w,
                    watcher(self.api::<GieInferencePool>(), watcher::Config::default()),
                )
                .default_backoff()
                .map_ok(|_| ())
                .boxed(),
            );
            streams.push(
                reflector::reflector(
                    all_pods_w,
                    watcher(self.api::<Pod>(), watcher::Config::default()),
                )
                .default_backoff()
                .map_ok(|_| ())
                .boxed(),
            );
            Some(GieStores {
                pools: gie_pools,
                pods: all_pods,
            })
        } else {
            None
        };
        let mut events = futures::stream::select_all(streams);
        let mut last_gie: Option<GieOutcome> = None;
        let mut provider_watch = match self.providers.clone() {
            Some(p) => super::providers::watch(
                self.client.clone(),
                self.namespace.clone(),
                p,
                shutdown.clone(),
            )
            .boxed(),
            None => futures::future::pending().boxed(),
        };
        loop {
            let ev = tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(()),
                ended = &mut provider_watch => return ended,
                ev = events.next() => ev,
            };
            match ev {
                None => anyhow::bail!("Kubernetes watch streams ended"),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "Kubernetes watch error; retrying");
                    continue;
                }
                Some(Ok(())) => {}
            }
            // All three initial lists have arrived when their readiness futures are complete.
            let synced = futures::future::join3(
                sets.wait_until_ready(),
                pools.wait_until_ready(),
                pods.wait_until_ready(),
            );
            let gie_synced = match &gie {
                Some(g) => {
                    futures::future::join(g.pools.wait_until_ready(), g.pods.wait_until_ready())
                        .now_or_never()
                        .is_some()
                }
                None => true,
            };
            if futures::FutureExt::now_or_never(synced).is_some() && gie_synced {
                let outcome = self.publish(&sets, &pools, &pods, gie.as_ref());
                if let (Some(m), Some(o)) = (&self.gie_metrics, &outcome) {
                    m.observe(o, last_gie.as_ref());
                }
                last_gie = outcome;
            }
        }
    }

    fn publish(
        &self,
        sets: &Store<InferenceWorkerSet>,
        pools: &Store<InferencePool>,
        pods: &Store<Pod>,
        gie: Option<&GieStores>,
    ) -> Option<GieOutcome> {
        let sets: Vec<InferenceWorkerSet> = sets
            .state()
            .iter()
            .map(|s| InferenceWorkerSet::clone(s))
            .collect();
        let pools: Vec<InferencePool> = pools
            .state()
            .iter()
            .map(|p| InferencePool::clone(p))
            .collect();
        let pods: Vec<PodView> = pods
            .state()
            .iter()
            .filter_map(|p: &Arc<Pod>| pod_view(p))
            .collect();
        let mut catalog = build_catalog(&sets, &pools, WorkerSource::Pods(&pods));
        let outcome = gie.map(|g| {
            let gie_pools: Vec<GieInferencePool> = g
                .pools
                .state()
                .iter()
                .map(|p| GieInferencePool::clone(p))
                .collect();
            let all_pods: Vec<_> = g.pods.state().iter().map(|p| labeled_pod(p)).collect();
            add_gie_pools(&mut catalog, &gie_pools, &all_pods, &self.gie)
        });
        let plan = build_tokenizer_plan(&sets, &pools, &catalog);
        self.state.set_catalog(catalog);
        self.state.tokenizers().set_plan(plan);
        if !self.state.discovery_synced() {
            tracing::info!(
                worker_sets = sets.len(),
                pools = pools.len(),
                pods = pods.len(),
                "Kubernetes discovery synced"
            );
            self.state.set_discovery_synced();
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use kube::api::ObjectMeta;

    fn pod(ready: &str, ip: Option<&str>, label: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                labels: label.then(|| {
                    [(WORKER_SET_LABEL.to_string(), "ws".to_string())]
                        .into_iter()
                        .collect()
                }),
                ..Default::default()
            },
            status: Some(PodStatus {
                pod_ip: ip.map(str::to_string),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn pod_readiness_and_labels() {
        let v = pod_view(&pod("True", Some("10.1.2.3"), true)).expect("view");
        assert_eq!(
            (v.namespace.as_str(), v.name.as_str(), v.worker_set.as_str()),
            ("ns", "p", "ws")
        );
        assert_eq!(v.ip.as_deref(), Some("10.1.2.3"));
        assert!(v.ready);
        assert!(
            !pod_view(&pod("False", Some("10.1.2.3"), true))
                .expect("view")
                .ready
        );
        assert!(pod_view(&pod("True", None, false)).is_none());
    }
}
