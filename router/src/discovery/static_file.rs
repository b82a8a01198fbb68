//! Discovery from a YAML file (`--config FILE`): the same multi-document YAML as the CRDs,
//! workers listed in each InferenceWorkerSet's `status.workers`, and the InferencePolicies in
//! force. GIE InferencePools (`inference.networking.k8s.io/v1`) in the file add the `v1` Pod
//! documents they select (with `status.podIP` and the `Ready` condition) as load-only
//! workers ([`super::gie`]); every such pool in the file is used. Read at start (a bad file or an invalid policy set fails start-up), then re-read
//! when its modification time changes; a bad edit is logged and the previous view kept, and
//! a policy set that does not compile is refused (counted, logged, in `/debug/policies`)
//! while the last good set stays in force.
//!
//! ```text
//! FILE --parse_documents--> WorkerSets, Pools --build_catalog(Status)--> RouterState::set_catalog
//!                        |  GIE InferencePools, Pods --add_gie_pools--^
//!                        |                    \--build_tokenizer_plan--> Tokenizers::set_plan
//!                        \--> InferencePolicies --------------------------> RouterState::set_policies
//! ```

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use kvroute_crds::{AnyResource, InferencePolicy, parse_documents};
use tokio_util::sync::CancellationToken;

use super::gie::{GieMetrics, GieOutcome, GieSelection, add_gie_pools, labeled_pod};
use super::tokenizers::build_tokenizer_plan;
use super::{WorkerSource, build_catalog};
use crate::state::{Catalog, RouterState};
use crate::tokenizer_registry::TokenizerPlan;

/// What the file holds for the router.
pub struct StaticView {
    /// Pools and workers.
    pub catalog: Catalog,
    /// Tokenizer sources.
    pub plan: TokenizerPlan,
    /// InferencePolicies (compiled by [`RouterState::set_policies`]).
    pub policies: Vec<InferencePolicy>,
    /// The GIE InferencePools used and skipped.
    pub gie: GieOutcome,
}

/// Reads and converts the file.
pub fn load(path: &Path) -> anyhow::Result<StaticView> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    parse(&text).with_context(|| format!("parse {}", path.display()))
}

/// Converts the YAML text. Kinds other than WorkerSets, Pools, Policies, GIE InferencePools
/// and Pods are accepted and ignored here.
pub fn parse(text: &str) -> anyhow::Result<StaticView> {
    let mut sets = Vec::new();
    let mut pools = Vec::new();
    let mut policies = Vec::new();
    let mut gie_pools = Vec::new();
    let mut pods = Vec::new();
    for doc in parse_documents(text)? {
        match doc {
            AnyResource::WorkerSet(s) => sets.push(s),
            AnyResource::Pool(p) => pools.push(p),
            AnyResource::Policy(p) => policies.push(p),
            AnyResource::GiePool(p) => gie_pools.push(p),
            AnyResource::Pod(p) => pods.push(labeled_pod(&p)),
            _ => {}
        }
    }
    let mut catalog = build_catalog(&sets, &pools, WorkerSource::Status);
    let gie = add_gie_pools(&mut catalog, &gie_pools, &pods, &GieSelection::all());
    let plan = build_tokenizer_plan(&sets, &pools, &catalog);
    Ok(StaticView {
        catalog,
        plan,
        policies,
        gie,
    })
}

/// Watches the file and republishes the catalog when it changes.
pub struct StaticDiscovery {
    path: PathBuf,
    state: RouterState,
    poll: Duration,
    providers: Option<crate::provider::Providers>,
    gie_metrics: Option<GieMetrics>,
    gie: GieOutcome,
}

impl StaticDiscovery {
    /// Loads the file once (errors, including a policy set that does not compile, fail
    /// start-up) and publishes it.
    pub fn start(path: PathBuf, state: RouterState) -> anyhow::Result<Self> {
        let StaticView {
            catalog,
            plan,
            policies,
            gie,
        } = load(&path)?;
        tracing::info!(
            file = %path.display(),
            workers = catalog.workers.len(),
            pools = catalog.pools.len(),
            policies = policies.len(),
            "static discovery loaded"
        );
        if let Err(issues) = state.set_policies(&policies) {
            let text: Vec<String> = issues.iter().map(ToString::to_string).collect();
            anyhow::bail!(
                "{}: invalid InferencePolicy set: {}",
                path.display(),
                text.join("; ")
            );
        }
        state.set_catalog(catalog);
        state.tokenizers().set_plan(plan);
        state.set_discovery_synced();
        Ok(Self {
            path,
            state,
            poll: Duration::from_secs(2),
            providers: None,
            gie_metrics: None,
            gie,
        })
    }

    /// Publishes the GIE InferencePools' states to `metrics` (now and on every change).
    pub fn with_gie_metrics(mut self, metrics: GieMetrics) -> Self {
        metrics.observe(&self.gie, None);
        self.gie_metrics = Some(metrics);
        self
    }

    /// Also feeds the file's InferenceProviders and GatewayBackends to `providers` (now and on
    /// every change).
    pub fn with_providers(mut self, providers: crate::provider::Providers) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(&self.path)
            .with_context(|| format!("read {}", self.path.display()))?;
        super::providers::apply_text(&providers, &text)?;
        self.providers = Some(providers);
        Ok(self)
    }

    fn mtime(&self) -> Option<SystemTime> {
        std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok()
    }

    /// Polls the file's modification time until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut last = self.mtime();
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.poll) => {}
            }
            let now = self.mtime();
            if now == last {
                continue;
            }
            last = now;
            match load(&self.path) {
                Ok(view) => {
                    tracing::info!(file = %self.path.display(), workers = view.catalog.workers.len(), "static discovery reloaded");
                    // A refused policy set is counted and logged there; the rest applies.
                    let _ = self.state.set_policies(&view.policies);
                    self.state.set_catalog(view.catalog);
                    self.state.tokenizers().set_plan(view.plan);
                    if let Some(m) = &self.gie_metrics {
                        m.observe(&view.gie, Some(&self.gie));
                    }
                    self.gie = view.gie;
                    if let Some(providers) = &self.providers
                        && let Ok(text) = std::fs::read_to_string(&self.path)
                    {
                        let _ = super::providers::apply_text(providers, &text);
                    }
                }
                Err(e) => tracing::warn!(
                    error = format!("{e:#}"),
                    "static discovery file invalid; keeping the previous view"
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::WorkerOrigin;

    #[test]
    fn a_gie_pool_and_its_pods_in_the_file_are_load_only_workers() {
        let view = parse(
            r#"
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: llama, annotations: {kvroute.dev/model: llama-8b}}
spec:
  selector: {matchLabels: {app: vllm-llama}}
  targetPorts: [{number: 8000}]
  endpointPickerRef: {name: kvroute-router, port: {number: 9002}}
---
apiVersion: v1
kind: Pod
metadata: {name: llama-0, labels: {app: vllm-llama}}
status:
  podIP: 127.0.0.1
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: v1
kind: Pod
metadata: {name: unrelated, labels: {app: web}}
status: {podIP: 127.0.0.2}
"#,
        )
        .expect("parses");
        let workers: Vec<(&str, &str, bool, WorkerOrigin)> = view
            .catalog
            .workers
            .iter()
            .map(|w| (w.id.as_str(), w.address.as_str(), w.ready, w.origin))
            .collect();
        assert_eq!(
            workers,
            vec![(
                "default/llama-0",
                "127.0.0.1:8000",
                true,
                WorkerOrigin::InferencePool
            )]
        );
        assert_eq!(view.gie.used, vec!["default/llama".to_string()]);
        assert_eq!(view.catalog.pools[0].name, "gie:default/llama");
        // No WorkerSet names a tokenizer source for the model: routed on load alone.
        assert!(view.plan.sources.is_empty());
    }
}
