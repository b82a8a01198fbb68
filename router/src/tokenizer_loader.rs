//! The task that loads discovered tokenizers: one sub-task per model, started when
//! discovery names a source for it, restarted when the source changes, stopped when the
//! model goes away. A failed attempt is logged, counted
//! (`kvroute_router_tokenizer_fetch_failures_total{model,reason}`) and retried after an
//! exponential backoff (capped); the sub-task ends once the tokenizer is loaded.
//!
//! ```text
//! Tokenizers::subscribe (plan) --> TokenizerLoader::run
//!     per model: fetch (tokenizer_source) --> Tokenizer::from_files (blocking pool)
//!        ok  --> Tokenizers::loaded
//!        err --> Tokenizers::failed + metric + log --> sleep(backoff) --> again
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use kvroute_crds::workerset::ResolvedTokenizer;
use kvroute_tokenization::Tokenizer;
use tokio::task::{AbortHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::state::RouterState;
use crate::tokenizer_registry::describe;
use crate::tokenizer_source::{FetchError, HubConfig, backoff, fetch};

/// Retry timing of failed attempts.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    /// Wait after the first failure.
    pub base: Duration,
    /// Longest wait.
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(300),
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
        let mut running: BTreeMap<String, (ResolvedTokenizer, AbortHandle)> = BTreeMap::new();
        loop {
            let wanted = plan.borrow_and_update().sources.clone();
            running.retain(|model, (source, handle)| {
                let keep = wanted.get(model) == Some(source);
                if !keep {
                    handle.abort();
                }
                keep
            });
            for (model, source) in wanted {
                if running.contains_key(&model) {
                    continue;
                }
                let span = tracing::info_span!("tokenizer", model = %model);
                let job = load_one(
                    self.state.clone(),
                    self.hub.clone(),
                    self.backoff,
                    model.clone(),
                    source.clone(),
                );
                let handle = tasks.spawn(job.instrument(span));
                running.insert(model, (source, handle));
            }
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                changed = plan.changed() => if changed.is_err() { break },
                // Reap finished sub-tasks; their models stay in `running` (loaded) until the
                // plan changes them.
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        }
        tasks.shutdown().await;
    }
}

/// Tries until loaded (or aborted by the loader).
async fn load_one(
    state: RouterState,
    hub: HubConfig,
    timing: Backoff,
    model: String,
    source: ResolvedTokenizer,
) {
    let what = describe(&source);
    tracing::info!(source = %what, "loading tokenizer");
    loop {
        match attempt(&hub, &source).await {
            Ok((tokenizer, origin)) => {
                if state
                    .tokenizers()
                    .loaded(&model, &source, tokenizer, origin)
                {
                    tracing::info!(source = %what, "tokenizer loaded");
                }
                return;
            }
            Err(e) => {
                let failures = state
                    .tokenizers()
                    .failed(&model, &source, e.label(), e.to_string());
                state
                    .metrics()
                    .tokenizer_fetch_failures
                    .with_label_values(&[model.as_str(), e.label()])
                    .inc();
                let wait = backoff(failures.max(1), timing.base, timing.cap);
                tracing::warn!(
                    source = %what,
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
) -> Result<(Tokenizer, String), FetchError> {
    let (files, origin) = fetch(hub, source).await?;
    // Parsing an 11 MB tokenizer.json takes a while: keep it off the async workers.
    let tokenizer = tokio::task::spawn_blocking(move || Tokenizer::from_files(files))
        .await
        .map_err(|e| FetchError::Invalid(format!("tokenizer build panicked: {e}")))?
        .map_err(|e| FetchError::Invalid(e.to_string()))?;
    Ok((tokenizer, origin))
}
