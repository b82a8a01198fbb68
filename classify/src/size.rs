//! The size/complexity classifier: `size:small`, `size:medium` or `size:large` from what the
//! router already knows about a request (prompt tokens, the output cap, message count) and
//! two signals the PII pass counts for free (code fences, the last message's length). It
//! feeds rules like "cheap requests to a smaller model": a policy matches `size:small` and
//! routes to the small model unless the large model's predicted TTFT is lower.
//!
//! ```text
//! large  if prompt >= large_min_prompt_tokens or output >= large_min_output_tokens
//!           or messages >= large_min_messages
//! small  if prompt <= small_max_prompt_tokens and output <= small_max_output_tokens
//!           and messages <= small_max_messages and code blocks <= small_max_code_blocks
//!           and last message <= small_max_instruction_bytes
//! medium otherwise
//! ```

use crate::Label;

/// Thresholds of the size classifier. The defaults are documented on each field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeConfig {
    /// Largest prompt (tokens) a small request may have. Default 1024.
    pub small_max_prompt_tokens: usize,
    /// Largest output cap (`max_tokens`) a small request may have. Default 1024.
    pub small_max_output_tokens: u32,
    /// Most messages a small request may have. Default 8.
    pub small_max_messages: usize,
    /// Most fenced code blocks a small request may contain. Default 0.
    pub small_max_code_blocks: usize,
    /// Longest last message (bytes) a small request may have: a long instruction is not a
    /// cheap request even when the conversation is short. Default 2048.
    pub small_max_instruction_bytes: usize,
    /// Prompt length (tokens) from which a request is large. Default 8192.
    pub large_min_prompt_tokens: usize,
    /// Output cap from which a request is large. Default 4096.
    pub large_min_output_tokens: u32,
    /// Message count from which a request is large. Default 64.
    pub large_min_messages: usize,
    /// Output cap assumed when the request sets none (the worker then stops at its context
    /// length or EOS). Default 1024.
    pub assumed_max_tokens: u32,
}

impl Default for SizeConfig {
    fn default() -> Self {
        SizeConfig {
            small_max_prompt_tokens: 1024,
            small_max_output_tokens: 1024,
            small_max_messages: 8,
            small_max_code_blocks: 0,
            small_max_instruction_bytes: 2048,
            large_min_prompt_tokens: 8192,
            large_min_output_tokens: 4096,
            large_min_messages: 64,
            assumed_max_tokens: 1024,
        }
    }
}

/// What the size classifier looks at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SizeSignals {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// The request's output cap, if it set one.
    pub max_tokens: Option<u32>,
    /// Messages (1 for a completions prompt).
    pub messages: usize,
    /// Fenced code blocks (pairs of "```", an unclosed one counts).
    pub code_blocks: usize,
    /// Bytes of the last message.
    pub last_message_bytes: usize,
}

impl SizeConfig {
    /// The size label for these signals.
    pub fn classify(&self, s: &SizeSignals) -> Label {
        let output = s.max_tokens.unwrap_or(self.assumed_max_tokens);
        if s.prompt_tokens >= self.large_min_prompt_tokens
            || output >= self.large_min_output_tokens
            || s.messages >= self.large_min_messages
        {
            Label::SizeLarge
        } else if s.prompt_tokens <= self.small_max_prompt_tokens
            && output <= self.small_max_output_tokens
            && s.messages <= self.small_max_messages
            && s.code_blocks <= self.small_max_code_blocks
            && s.last_message_bytes <= self.small_max_instruction_bytes
        {
            Label::SizeSmall
        } else {
            Label::SizeMedium
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signals(prompt_tokens: usize, max_tokens: Option<u32>, messages: usize) -> SizeSignals {
        SizeSignals {
            prompt_tokens,
            max_tokens,
            messages,
            code_blocks: 0,
            last_message_bytes: 100,
        }
    }

    #[test]
    fn thresholds() {
        let c = SizeConfig::default();
        assert_eq!(c.classify(&signals(50, Some(64), 1)), Label::SizeSmall);
        assert_eq!(c.classify(&signals(50, None, 1)), Label::SizeSmall);
        assert_eq!(c.classify(&signals(1024, Some(1024), 8)), Label::SizeSmall);
        assert_eq!(c.classify(&signals(1025, Some(64), 1)), Label::SizeMedium);
        assert_eq!(c.classify(&signals(50, Some(2000), 1)), Label::SizeMedium);
        assert_eq!(c.classify(&signals(50, Some(64), 9)), Label::SizeMedium);
        assert_eq!(c.classify(&signals(8192, Some(64), 1)), Label::SizeLarge);
        assert_eq!(c.classify(&signals(50, Some(4096), 1)), Label::SizeLarge);
        assert_eq!(c.classify(&signals(50, Some(64), 64)), Label::SizeLarge);
        let code = SizeSignals {
            code_blocks: 1,
            ..signals(50, Some(64), 1)
        };
        assert_eq!(c.classify(&code), Label::SizeMedium);
        let long = SizeSignals {
            last_message_bytes: 3000,
            ..signals(800, Some(64), 1)
        };
        assert_eq!(c.classify(&long), Label::SizeMedium);
        let lenient = SizeConfig {
            small_max_code_blocks: 2,
            ..c
        };
        assert_eq!(lenient.classify(&code), Label::SizeSmall);
    }
}
