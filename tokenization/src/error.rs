//! The one error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong while loading a tokenizer directory or turning a request into
/// token ids. Variant names double as metric labels (see [`TokenizeError::label`]).
///
/// HTTP adapters map every variant except [`TokenizeError::Io`] and
/// [`TokenizeError::Load`] to a 400 (that is what vLLM answers for the same input).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizeError {
    /// A file of the tokenizer directory could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file of the tokenizer directory is not what we expect (bad JSON, wrong shape).
    #[error("loading the tokenizer: {0}")]
    Load(String),
    /// The tokenizer has no chat template (and the request gave none).
    #[error(
        "no chat template: the tokenizer defines none and the request gave none \
         (vLLM answers this with a 400 too)"
    )]
    TemplateMissing,
    /// The chat template does not compile.
    #[error("the chat template does not compile: {0}")]
    TemplateSyntax(String),
    /// The chat template failed while rendering (unknown filter, type error, ...).
    #[error("rendering the chat template: {0}")]
    Render(String),
    /// The chat template called `raise_exception(message)`; the message is the template's own.
    #[error("{0}")]
    TemplateRaised(String),
    /// A message of the request is malformed.
    #[error("messages[{index}]: {reason}")]
    InvalidMessage {
        /// Position of the message in the request.
        index: usize,
        /// What is wrong, in vLLM's words where vLLM has them.
        reason: String,
    },
    /// A request field other than the messages is malformed or contradicts another one.
    #[error("{0}")]
    InvalidRequest(String),
    /// The HuggingFace tokenizer failed to encode the text.
    #[error("encoding: {0}")]
    Encode(String),
    /// The HuggingFace tokenizer failed to decode the ids.
    #[error("decoding: {0}")]
    Decode(String),
    /// A token id given by the client is outside the vocabulary (vLLM's wording).
    #[error("Token id {id} is out of vocabulary")]
    TokenOutOfVocab {
        /// The offending id.
        id: i64,
    },
}

impl TokenizeError {
    /// Every [`TokenizeError::label`], in variant order (docs/troubleshooting.md explains each).
    pub const LABELS: &[&str] = &[
        "io",
        "load",
        "template_missing",
        "template_syntax",
        "render",
        "template_raised",
        "invalid_message",
        "invalid_request",
        "encode",
        "decode",
        "token_out_of_vocab",
    ];

    /// A short, stable, bounded label for metrics (`reason="..."`).
    pub fn label(&self) -> &'static str {
        match self {
            TokenizeError::Io { .. } => "io",
            TokenizeError::Load(_) => "load",
            TokenizeError::TemplateMissing => "template_missing",
            TokenizeError::TemplateSyntax(_) => "template_syntax",
            TokenizeError::Render(_) => "render",
            TokenizeError::TemplateRaised(_) => "template_raised",
            TokenizeError::InvalidMessage { .. } => "invalid_message",
            TokenizeError::InvalidRequest(_) => "invalid_request",
            TokenizeError::Encode(_) => "encode",
            TokenizeError::Decode(_) => "decode",
            TokenizeError::TokenOutOfVocab { .. } => "token_out_of_vocab",
        }
    }

    /// True when the error is the client's fault (vLLM answers 400), false when the server's
    /// tokenizer files are at fault.
    pub fn is_client_error(&self) -> bool {
        !matches!(self, TokenizeError::Io { .. } | TokenizeError::Load(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One error of each variant; the match has no wildcard, so a new variant fails to
    /// compile here until it is added to the samples (and its label to `LABELS`).
    fn samples() -> Vec<TokenizeError> {
        let all = vec![
            TokenizeError::Io {
                path: PathBuf::from("x"),
                source: std::io::Error::other("x"),
            },
            TokenizeError::Load(String::new()),
            TokenizeError::TemplateMissing,
            TokenizeError::TemplateSyntax(String::new()),
            TokenizeError::Render(String::new()),
            TokenizeError::TemplateRaised(String::new()),
            TokenizeError::InvalidMessage {
                index: 0,
                reason: String::new(),
            },
            TokenizeError::InvalidRequest(String::new()),
            TokenizeError::Encode(String::new()),
            TokenizeError::Decode(String::new()),
            TokenizeError::TokenOutOfVocab { id: 0 },
        ];
        for e in &all {
            match e {
                TokenizeError::Io { .. }
                | TokenizeError::Load(_)
                | TokenizeError::TemplateMissing
                | TokenizeError::TemplateSyntax(_)
                | TokenizeError::Render(_)
                | TokenizeError::TemplateRaised(_)
                | TokenizeError::InvalidMessage { .. }
                | TokenizeError::InvalidRequest(_)
                | TokenizeError::Encode(_)
                | TokenizeError::Decode(_)
                | TokenizeError::TokenOutOfVocab { .. } => {}
            }
        }
        all
    }

    #[test]
    fn labels_lists_every_variant_label_once() {
        let labels: Vec<&str> = samples().iter().map(TokenizeError::label).collect();
        assert_eq!(labels, TokenizeError::LABELS);
    }
}
