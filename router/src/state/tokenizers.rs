//! Tokenizers by model, and turning a request's prompt into the token ids vLLM will see.
//!
//! ```text
//! --tokenizer DIR | MODEL=DIR --> TokenizerDirs --load--> Tokenizers (one per model, shared)
//! Prompt (tokens | chat body | completion prompt) --tokens_for--> ids, or why degraded
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;

use kvroute_tokenization::{ChatRequest, PromptInput};
use serde::Deserialize;

use super::RouterState;
use super::pick::{PickError, PickInput, Prompt};
use crate::reasons;
use crate::tokenizer_registry::{Lookup, Tokenizers};

/// Where each model's tokenizer lives.
#[derive(Clone, Debug, Default)]
pub struct TokenizerDirs {
    /// `--tokenizer DIR`: used for every model without its own entry.
    pub default: Option<PathBuf>,
    /// `--tokenizer MODEL=DIR`.
    pub per_model: BTreeMap<String, PathBuf>,
}

impl TokenizerDirs {
    /// The directory for `model`, if any.
    pub fn dir_for(&self, model: &str) -> Option<&PathBuf> {
        self.per_model.get(model).or(self.default.as_ref())
    }
}

/// Why a decision had no tokens. `label()` is the metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Degraded {
    /// No tokenizer configured for the model.
    NoTokenizer,
    /// The request carried no usable prompt.
    NoPrompt,
    /// Tokenization failed (label of the error).
    Failed(&'static str),
    /// The model's tokenizer is configured but not loaded, and load-only routing is not
    /// allowed: the request is refused, not degraded (see `tokens_for`).
    NotLoaded {
        /// At least one load attempt failed.
        failed: bool,
    },
}

impl Degraded {
    pub(super) fn label(self) -> &'static str {
        match self {
            Degraded::NoTokenizer => reasons::NO_TOKENIZER,
            Degraded::NoPrompt => reasons::NO_PROMPT,
            Degraded::Failed(l) => l,
            Degraded::NotLoaded { .. } => "tokenizer_not_ready",
        }
    }
}

impl RouterState {
    /// The tokenizer registry: the loader task fills it, discovery sets its plan.
    pub fn tokenizers(&self) -> &Tokenizers {
        &self.0.tokenizers
    }

    /// The prompt's token ids, or why the decision is degraded; a refusal when the model's
    /// tokenizer is needed but not loaded and its pool does not allow load-only routing.
    pub(super) fn tokens_for(
        &self,
        input: &PickInput<'_>,
        backend_model: &str,
    ) -> Result<Result<Vec<u32>, Degraded>, PickError> {
        match self.encode_prompt(input, backend_model) {
            Err(Degraded::NotLoaded { failed }) => Err(PickError::TokenizerNotReady {
                model: input.model.to_string(),
                failed,
            }),
            other => Ok(other),
        }
    }

    fn encode_prompt(
        &self,
        input: &PickInput<'_>,
        backend_model: &str,
    ) -> Result<Vec<u32>, Degraded> {
        let tokenizer = || match self.0.tokenizers.lookup(input.model, backend_model) {
            Lookup::Ready(t) => Ok(t),
            Lookup::NotConfigured
            | Lookup::NotLoaded {
                load_only: true, ..
            } => Err(Degraded::NoTokenizer),
            Lookup::NotLoaded { failed, .. } => Err(Degraded::NotLoaded { failed }),
        };
        match input.prompt {
            Prompt::Tokens(t) => Ok(t.to_vec()),
            Prompt::Completion(v) => {
                let prompt = PromptInput::deserialize(v)
                    .map_err(|_| Degraded::Failed(reasons::INVALID_PROMPT))?;
                if let PromptInput::TokenIds(ids) = &prompt {
                    // Token ids need no tokenizer; out-of-range ids fail at the worker.
                    return ids
                        .iter()
                        .map(|&i| {
                            u32::try_from(i)
                                .map_err(|_| Degraded::Failed(reasons::TOKEN_OUT_OF_VOCAB))
                        })
                        .collect();
                }
                tokenizer()?
                    .encode_prompt(&prompt, true)
                    .map_err(|e| Degraded::Failed(e.label()))
            }
            Prompt::Chat(body) => {
                let tok = tokenizer()?;
                let req = ChatRequest::deserialize(body)
                    .map_err(|_| Degraded::Failed(reasons::INVALID_REQUEST))?;
                tok.encode_chat(&req, kvroute_tokenization::local_now())
                    .map(|e| e.token_ids)
                    .map_err(|e| Degraded::Failed(e.label()))
            }
            Prompt::Unavailable => Err(Degraded::NoPrompt),
        }
    }
}
