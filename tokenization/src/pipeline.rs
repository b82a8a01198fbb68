//! The `tokenizers` crate's own encoding pipeline: the reference that the faster paths
//! (`segments.rs`, `bpe.rs`) fall back to and are tested against. It sits below both so that
//! neither has to import the other for it.

use crate::TokenizeError;

/// Ids of `text` as the HuggingFace tokenizer computes them, with or without the
/// post-processor's special tokens.
pub(crate) fn encode(
    hf: &tokenizers::Tokenizer,
    text: &str,
    add_special_tokens: bool,
) -> Result<Vec<u32>, TokenizeError> {
    let encoding = hf
        .encode_fast(text, add_special_tokens)
        .map_err(|e| TokenizeError::Encode(e.to_string()))?;
    Ok(encoding.get_ids().to_vec())
}
