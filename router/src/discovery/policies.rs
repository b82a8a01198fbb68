//! InferencePolicies from the Kubernetes API (`--kubernetes`): a reflector over the policies
//! of the watched namespace(s); after the initial list and on every change the whole set is
//! compiled and put in force ([`RouterState::set_policies`]). A set that does not compile is
//! refused (counted, logged, shown in `/debug/policies`) and the last good set stays; the
//! operator reports the offending policy's condition.
//!
//! ```text
//! watcher(InferencePolicies) --reflector--> Store --(any event, once listed)--> set_policies
//! ```

use futures::{StreamExt, TryStreamExt};
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kvroute_crds::InferencePolicy;
use tokio_util::sync::CancellationToken;

use crate::state::RouterState;

/// Watches InferencePolicies and keeps the router's set current.
pub struct PolicyWatch {
    api: Api<InferencePolicy>,
    state: RouterState,
}

impl PolicyWatch {
    /// A watch over `api` (one namespace or all) publishing into `state`; the replica is
    /// not ready until the first list is in ([`RouterState::await_policies`]).
    pub fn new(api: Api<InferencePolicy>, state: RouterState) -> Self {
        state.await_policies();
        Self { api, state }
    }

    /// Runs until `shutdown`; watch errors are logged and retried with backoff.
    pub async fn run(self, shutdown: CancellationToken) {
        let (store, writer) = reflector::store::<InferencePolicy>();
        let mut events = reflector::reflector(
            writer,
            watcher(self.api.clone(), watcher::Config::default()),
        )
        .default_backoff()
        .map_ok(|_| ())
        .boxed();
        let mut last: Option<Vec<InferencePolicy>> = None;
        loop {
            let ev = tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                ev = events.next() => ev,
            };
            match ev {
                None => {
                    tracing::warn!("InferencePolicy watch ended");
                    return;
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "InferencePolicy watch error; retrying");
                    continue;
                }
                Some(Ok(())) => {}
            }
            if futures::FutureExt::now_or_never(store.wait_until_ready()).is_none() {
                continue;
            }
            let now = snapshot(&store);
            if last.as_ref() != Some(&now) {
                // A refused set is counted and logged by set_policies.
                let _ = self.state.set_policies(&now);
                last = Some(now);
            }
        }
    }
}

/// The policies in the store sorted by namespace and name, reduced to what compiling reads.
fn snapshot(store: &Store<InferencePolicy>) -> Vec<InferencePolicy> {
    let mut all: Vec<InferencePolicy> = store
        .state()
        .iter()
        .map(|p| {
            let mut p = InferencePolicy::clone(p);
            // Only what compiling reads: a status or resourceVersion change is no change.
            p.status = None;
            p.metadata = kube::api::ObjectMeta {
                name: p.metadata.name.clone(),
                namespace: p.metadata.namespace.clone(),
                ..Default::default()
            };
            p
        })
        .collect();
    all.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    all
}
