//! The task that loads discovered tokenizers: one sub-task per source (models that name the
//! same source share one download and one parsed tokenizer), started when discovery names a
//! source no model has loaded yet, stopped when no model wants it any more. A failed
//! attempt is logged, counted
//! (`kvroute_router_tokenizer_fetch_failures_total{model,reason}`) and retried after an
//! exponential backoff (capped); the sub-task ends once the tokenizer is loaded.
//!
//! ```text
//! Tokenizers::subscribe (plan) --> TokenizerLoader::run
//!     per source: fetch (tokenizer_source) --> Tokenizer::from_files (blocking pool)
//!        ok  --> Tokenizers::loaded
//!        err --> Tokenizers::failed + metric + log --> sleep(backoff) --> again
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kvroute_crds::workerset::ResolvedTokenizer;
use kvroute_tokenization::Tokenizer;
use tokio::task::{AbortHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::state::RouterState;
use crate::tokenizer_registry::describe;
use crate::tokenizer_source::{FetchError, HubConfig, backoff, fetch};

/// Timing of attempts: how long one may take, and the waits after failed ones.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    /// Wait after the first failure.
    pub base: Duration,
    /// Longest wait.
    pub cap: Duration,
    /// Longest one attempt's download (or directory read) may take before it counts as
    /// failed: the Hub client has no timeout of its own, so a stalled connection would
    /// otherwise leave the model loading for ever.
    pub attempt: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(300),
            attempt: Duration::from_secs(300),
        }
    }
}

/// Loads the tokenizers discovery names (see the module docs).
pub struct TokenizerLoader {
    state: RouterState,
    hub: HubConfig,
    backoff: Backoff,
}

impl TokenizerLoader {
    /// A loader for `state`'s tokenizer registry.
    pub fn new(state: RouterState, hub: HubConfig, backoff: Backoff) -> Self {
        Self {
            state,
            hub,
            backoff,
        }
    }

    /// Runs until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut plan = self.state.tokenizers().subscribe();
        let mut tasks: JoinSet<()> = JoinSet::new();
        let mut running: BTreeMap<ResolvedTokenizer, AbortHandle> = BTreeMap::new();
        loop {
            let wanted: BTreeSet<ResolvedTokenizer> =
                plan.borrow_and_update().sources.values().cloned().collect();
            running.retain(|source, handle| {
                let keep = wanted.contains(source);
                if !keep {
                    handle.abort();
                }
                // a finished sub-task is forgotten: its source starts again only if some
                // model still lacks it (it was dropped and named again meanwhile)
                keep && !handle.is_finished()
            });
            for source in self.state.tokenizers().pending_sources() {
                if running.contains_key(&source) || !wanted.contains(&source) {
                    continue;
                }
                let what = describe(&source);
                let span = tracing::info_span!("tokenizer", source = %what);
                let job = load_one(
                    self.state.clone(),
                    self.hub.clone(),
                    self.backoff,
                    source.clone(),
                );
                let handle = tasks.spawn(job.instrument(span));
                running.insert(source, handle);
            }
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                changed = plan.changed() => if changed.is_err() { break },
                // A sub-task ended (loaded, or no model wants its source any more).
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        }
        tasks.shutdown().await;
    }
}

/// Tries until loaded, or until no model wants `source` (or aborted by the loader). Models
/// that share a source share one download and one parsed tokenizer.
async fn load_one(state: RouterState, hub: HubConfig, timing: Backoff, source: ResolvedTokenizer) {
    tracing::info!("loading tokenizer");
    loop {
        match attempt(&hub, &source, timing.attempt).await {
            Ok((tokenizer, origin)) => {
                let models = state.tokenizers().loaded(&source, tokenizer, origin);
                if !models.is_empty() {
                    tracing::info!(models = %models.join(","), "tokenizer loaded");
                }
                return;
            }
            Err(e) => {
                let models = state.tokenizers().failed(&source, e.label(), e.to_string());
                if models.is_empty() {
                    return;
                }
                for (model, _) in &models {
                    state
                        .metrics()
                        .tokenizer_fetch_failures
                        .with_label_values(&[model.as_str(), e.label()])
                        .inc();
                }
                let failures = models.iter().map(|(_, n)| *n).max().unwrap_or(1);
                let wait = backoff(failures, timing.base, timing.cap);
                tracing::warn!(
                    error = %e,
                    failures,
                    retry_in_s = wait.as_secs_f64(),
                    "tokenizer not loaded; retrying"
                );
                tokio::time::sleep(wait).await;
            }
        }
    }
}

async fn attempt(
    hub: &HubConfig,
    source: &ResolvedTokenizer,
    limit: Duration,
) -> Result<(Tokenizer, String), FetchError> {
    let (files, origin) = tokio::time::timeout(limit, fetch(hub, source))
        .await
        .map_err(|_| FetchError::Timeout {
            what: describe(source),
            after: limit,
        })??;
    // Parsing an 11 MB tokenizer.json takes a while: keep it off the async workers.
    let tokenizer = tokio::task::spawn_blocking(move || Tokenizer::from_files(files))
        .await
        .map_err(|e| FetchError::Invalid(format!("tokenizer build panicked: {e}")))?
        .map_err(|e| FetchError::Invalid(e.to_string()))?;
    Ok((tokenizer, origin))
}
