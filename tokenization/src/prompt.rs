//! The `prompt` of a `/v1/completions` request.

use serde::{Deserialize, Serialize};

/// A completions prompt: text to encode, or token ids to pass through (after a vocabulary
/// check, see [`crate::Tokenizer::encode_prompt`]). Deserialises from the OpenAI field
/// (`"prompt": "text"` or `"prompt": [1, 2, 3]`). Ids are `i64` so that negative or oversized
/// ids from the wire become a typed error, not a decoding failure. Batched prompts (a list of
/// strings or of id lists) are not represented: callers split them first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    /// Text, encoded with the tokenizer.
    Text(String),
    /// Token ids, used as they are.
    TokenIds(Vec<i64>),
}

impl From<&str> for PromptInput {
    fn from(s: &str) -> Self {
        PromptInput::Text(s.to_string())
    }
}

impl From<Vec<u32>> for PromptInput {
    fn from(ids: Vec<u32>) -> Self {
        PromptInput::TokenIds(ids.into_iter().map(i64::from).collect())
    }
}
