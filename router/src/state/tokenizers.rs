//! Tokenizers by model, and turning a request's prompt into the token ids vLLM will see.
//!
//! ```text
//! --tokenizer DIR | MODEL=DIR --> TokenizerDirs --load--> Tokenizers (one per model, shared)
//! Prompt (tokens | chat body | completion prompt) --tokens_for--> ids, or why degraded
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use kvroute_tokenization::{ChatRequest, PromptInput, Tokenizer};
use serde::Deserialize;

use super::pick::{PickInput, Prompt};
use super::{RouterState, StateError};

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
}

impl Degraded {
    pub(super) fn label(self) -> &'static str {
        match self {
            Degraded::NoTokenizer => "no_tokenizer",
            Degraded::NoPrompt => "no_prompt",
            Degraded::Failed(l) => l,
        }
    }
}

/// Loaded tokenizers, shared by model.
pub(super) struct Tokenizers {
    default: Option<Arc<Tokenizer>>,
    per_model: BTreeMap<String, Arc<Tokenizer>>,
}

impl Tokenizers {
    pub(super) fn load(dirs: &TokenizerDirs) -> Result<Self, StateError> {
        let load = |dir: &PathBuf| {
            Tokenizer::from_dir(dir)
                .map(Arc::new)
                .map_err(|source| StateError::Tokenizer {
                    dir: dir.clone(),
                    source,
                })
        };
        let default = dirs.default.as_ref().map(load).transpose()?;
        let mut per_model = BTreeMap::new();
        for (model, dir) in &dirs.per_model {
            per_model.insert(model.clone(), load(dir)?);
        }
        Ok(Self { default, per_model })
    }

    /// The tokenizer for the client-facing name, else the backend model, else the default.
    pub(super) fn for_model(&self, name: &str, backend: &str) -> Option<&Tokenizer> {
        self.per_model
            .get(name)
            .or_else(|| self.per_model.get(backend))
            .or(self.default.as_ref())
            .map(Arc::as_ref)
    }
}

impl RouterState {
    /// The token ids of the request's prompt, or why there are none.
    pub(super) fn tokens_for(
        &self,
        input: &PickInput<'_>,
        backend_model: &str,
    ) -> Result<Vec<u32>, Degraded> {
        let tokenizer = || {
            self.0
                .tokenizers
                .for_model(input.model, backend_model)
                .ok_or(Degraded::NoTokenizer)
        };
        match input.prompt {
            Prompt::Tokens(t) => Ok(t.to_vec()),
            Prompt::Completion(v) => {
                let prompt =
                    PromptInput::deserialize(v).map_err(|_| Degraded::Failed("invalid_prompt"))?;
                if let PromptInput::TokenIds(ids) = &prompt {
                    // Token ids need no tokenizer; out-of-range ids fail at the worker.
                    return ids
                        .iter()
                        .map(|&i| {
                            u32::try_from(i).map_err(|_| Degraded::Failed("token_out_of_vocab"))
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
                    .map_err(|_| Degraded::Failed("invalid_request"))?;
                tok.encode_chat(&req, kvroute_tokenization::local_now())
                    .map(|e| e.token_ids)
                    .map_err(|e| Degraded::Failed(e.label()))
            }
            Prompt::Unavailable => Err(Degraded::NoPrompt),
        }
    }
}
