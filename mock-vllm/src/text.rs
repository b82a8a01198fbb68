//! Text <-> token ids for the HTTP layer: the real tokenizer (`kvroute-tokenization`, vLLM
//! parity) when `--tokenizer` is given, else a byte-level stand-in (one id per UTF-8 byte) so
//! the mock still runs without tokenizer files.

use std::ops::Range;
use std::sync::Arc;

use kvroute_tokenization::{ChatRequest, PromptInput, TokenizeError, Tokenizer};
use serde_json::Value;

use crate::openai::ApiError;

/// How the mock turns text into ids and back.
#[derive(Clone)]
pub enum TextModel {
    /// A HuggingFace tokenizer with its chat template.
    Hf(Arc<Tokenizer>),
    /// Ids are UTF-8 bytes; chat messages are rendered as `role: content\n` lines.
    Bytes,
}

fn tokenize_error(e: TokenizeError) -> ApiError {
    match e {
        TokenizeError::Io { .. } | TokenizeError::Load(_) => ApiError::internal(e.to_string()),
        other => ApiError::bad_request(other.to_string()),
    }
}

impl TextModel {
    /// Renders and encodes a chat body (`messages` plus template knobs).
    pub fn encode_chat(&self, body: &Value) -> Result<(String, Vec<u32>), ApiError> {
        let req: ChatRequest = serde_json::from_value(body.clone())
            .map_err(|e| ApiError::bad_request(format!("invalid messages: {e}")))?;
        match self {
            TextModel::Hf(tok) => {
                let enc = tok
                    .encode_chat(&req, kvroute_tokenization::local_now())
                    .map_err(tokenize_error)?;
                Ok((enc.prompt, enc.token_ids))
            }
            TextModel::Bytes => {
                let mut text = String::new();
                for m in &req.messages {
                    let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
                    let content = match m.get("content") {
                        Some(Value::String(s)) => s.clone(),
                        Some(other) => other.to_string(),
                        None => String::new(),
                    };
                    text.push_str(role);
                    text.push_str(": ");
                    text.push_str(&content);
                    text.push('\n');
                }
                if req.add_generation_prompt {
                    text.push_str("assistant: ");
                }
                let ids = text.bytes().map(u32::from).collect();
                Ok((text, ids))
            }
        }
    }

    /// Encodes a completions `prompt` (text or ids).
    pub fn encode_prompt(
        &self,
        prompt: &Value,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, ApiError> {
        let input: PromptInput = match prompt {
            // A batch of one is accepted; real batches are not supported (n=1 server).
            Value::Array(items) if items.len() == 1 && !items[0].is_number() => {
                serde_json::from_value(items[0].clone())
            }
            other => serde_json::from_value(other.clone()),
        }
        .map_err(|_| {
            ApiError::bad_request(
                "prompt must be a string, an array of token ids, or a batch of one",
            )
        })?;
        match self {
            TextModel::Hf(tok) => tok
                .encode_prompt(&input, add_special_tokens)
                .map_err(tokenize_error),
            TextModel::Bytes => match input {
                PromptInput::Text(s) => Ok(s.bytes().map(u32::from).collect()),
                PromptInput::TokenIds(ids) => ids
                    .into_iter()
                    .map(|id| {
                        u32::try_from(id).ok().filter(|&v| v < 256).ok_or_else(|| {
                            ApiError::bad_request(format!("Token id {id} is out of vocabulary"))
                        })
                    })
                    .collect(),
            },
        }
    }

    /// Decodes ids to text (special tokens skipped, as in vLLM outputs).
    pub fn decode(&self, ids: &[u32]) -> String {
        match self {
            TextModel::Hf(tok) => tok.decode(ids, true).unwrap_or_default(),
            TextModel::Bytes => {
                let bytes: Vec<u8> = ids.iter().map(|&i| (i & 0xff) as u8).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            }
        }
    }

    /// Ids the engine may generate: ordinary (non-special) tokens.
    pub fn sample_range(&self) -> Range<u32> {
        match self {
            TextModel::Hf(tok) => {
                // Special tokens sit at the top of the vocabulary in HF tokenizers; stay below
                // the lowest special id we know of.
                let mut top = tok.max_token_id();
                for id in tok
                    .eos_token_ids()
                    .iter()
                    .copied()
                    .chain(tok.bos_token_id())
                {
                    top = top.min(id);
                }
                0..top.max(1)
            }
            // Lowercase letters and space: readable output.
            TextModel::Bytes => 97..123,
        }
    }

    /// The end-of-sequence id, if any.
    pub fn eos_token_id(&self) -> Option<u32> {
        match self {
            TextModel::Hf(tok) => tok.eos_token_ids().first().copied(),
            TextModel::Bytes => None,
        }
    }
}

/// Turns a growing list of ids into text deltas without splitting UTF-8 sequences (the
/// prefix/read offset scheme of HF text-generation-inference).
#[derive(Default)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl IncrementalDecoder {
    /// Adds one id; returns the new text it completes (possibly empty).
    pub fn push(&mut self, model: &TextModel, id: u32) -> String {
        self.ids.push(id);
        let prefix = model.decode(&self.ids[self.prefix_offset..self.read_offset]);
        let full = model.decode(&self.ids[self.prefix_offset..]);
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') {
            let delta = full.get(prefix.len()..).unwrap_or("").to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            delta
        } else {
            String::new()
        }
    }

    /// Everything decoded so far plus anything held back.
    pub fn all_text(&self, model: &TextModel) -> String {
        model.decode(&self.ids)
    }
}
