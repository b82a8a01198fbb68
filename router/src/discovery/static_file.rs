//! Discovery from a YAML file (`--config FILE`): the same multi-document YAML as the CRDs,
//! workers listed in each InferenceWorkerSet's `status.workers`, and the InferencePolicies in
//! force. Read at start (a bad file or an invalid policy set fails start-up), then re-read
//! when its modification time changes; a bad edit is logged and the previous view kept, and
//! a policy set that does not compile is refused (counted, logged, in `/debug/policies`)
//! while the last good set stays in force.
//!
//! ```text
//! FILE --parse_documents--> WorkerSets, Pools --build_catalog(Status)--> RouterState::set_catalog
//!                        |                    \--build_tokenizer_plan--> Tokenizers::set_plan
//!                        \--> InferencePolicies --------------------------> RouterState::set_policies
//! ```

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use kvroute_crds::{AnyResource, InferencePolicy, parse_documents};
use tokio_util::sync::CancellationToken;

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
}

/// Reads and converts the file.
pub fn load(path: &Path) -> anyhow::Result<StaticView> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    parse(&text).with_context(|| format!("parse {}", path.display()))
}

/// Converts the YAML text. Kinds other than WorkerSets, Pools and Policies are accepted and
/// ignored.
pub fn parse(text: &str) -> anyhow::Result<StaticView> {
    let mut sets = Vec::new();
    let mut pools = Vec::new();
    let mut policies = Vec::new();
    for doc in parse_documents(text)? {
        match doc {
            AnyResource::WorkerSet(s) => sets.push(s),
            AnyResource::Pool(p) => pools.push(p),
            AnyResource::Policy(p) => policies.push(p),
            _ => {}
        }
    }
    let catalog = build_catalog(&sets, &pools, WorkerSource::Status);
    let plan = build_tokenizer_plan(&sets, &pools, &catalog);
    Ok(StaticView {
        catalog,
        plan,
        policies,
    })
}

/// Watches the file and republishes the catalog when it changes.
pub struct StaticDiscovery {
    path: PathBuf,
    state: RouterState,
    poll: Duration,
    providers: Option<crate::provider::Providers>,
}

impl StaticDiscovery {
    /// Loads the file once (errors, including a policy set that does not compile, fail
    /// start-up) and publishes it.
    pub fn start(path: PathBuf, state: RouterState) -> anyhow::Result<Self> {
        let StaticView {
            catalog,
            plan,
            policies,
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
        })
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
    pub async fn run(self, shutdown: CancellationToken) {
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
