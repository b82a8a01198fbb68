//! The texts of an OpenAI-shaped request body, borrowed, for [`ClassifyInput`]: what a client
//! wrote, wherever the format lets it write (message contents as a string or as text parts,
//! a tool call's arguments, a completions prompt). Anthropic bodies reach the router's pick
//! as OpenAI chat bodies, so one reader serves both front doors. Nothing is copied.
//!
//! ```text
//! {"messages": [{"content": "..."}, {"content": [{"type": "text", "text": "..."}]},
//!               {"tool_calls": [{"function": {"arguments": "..."}}]}]}   chat
//! {"prompt": "..." | ["...", "..."]}                                       completions
//! ```
//!
//! [`ClassifyInput`]: crate::ClassifyInput

use serde_json::{Map, Value};

/// Texts of a request body and its message count.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestTexts<'a> {
    /// Every text, in body order.
    pub texts: Vec<&'a str>,
    /// Messages (chat), or prompts (completions).
    pub messages: usize,
}

impl<'a> RequestTexts<'a> {
    /// Reads a chat (`messages`) or completions (`prompt`) body; anything else has no texts.
    /// Unexpected shapes are skipped, never an error: the body was validated upstream.
    pub fn of_body(body: &'a Map<String, Value>) -> Self {
        let mut out = RequestTexts::default();
        if let Some(messages) = body.get("messages").and_then(Value::as_array) {
            out.messages = messages.len();
            for m in messages {
                match m.get("content") {
                    Some(Value::String(s)) => out.texts.push(s),
                    Some(Value::Array(parts)) => out
                        .texts
                        .extend(parts.iter().filter_map(|p| p.get("text")?.as_str())),
                    _ => {}
                }
                if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
                    out.texts.extend(
                        calls
                            .iter()
                            .filter_map(|c| c.get("function")?.get("arguments")?.as_str()),
                    );
                }
            }
        } else {
            match body.get("prompt") {
                Some(Value::String(s)) => {
                    out.messages = 1;
                    out.texts.push(s);
                }
                Some(Value::Array(items)) => {
                    out.messages = items.len();
                    out.texts.extend(items.iter().filter_map(Value::as_str));
                }
                _ => {}
            }
        }
        out
    }

    /// A prompt-token estimate (4 bytes a token) for when the router has not tokenised yet.
    pub fn estimated_tokens(&self) -> usize {
        self.texts
            .iter()
            .map(|t| t.len())
            .sum::<usize>()
            .div_ceil(4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: serde_json::Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("an object"),
        }
    }

    #[test]
    fn chat_bodies() {
        let b = body(serde_json::json!({"model": "m", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "mail a@example.com"},
                                          {"type": "image_url", "image_url": {"url": "x"}}]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"type": "function", "function": {"name": "f", "arguments": "{\"iban\": \"x\"}"}}]},
            {"role": "tool", "content": 7}
        ]}));
        let t = RequestTexts::of_body(&b);
        assert_eq!(t.messages, 4);
        assert_eq!(
            t.texts,
            ["be brief", "mail a@example.com", "{\"iban\": \"x\"}"]
        );
        assert_eq!(t.estimated_tokens(), (8 + 18 + 13usize).div_ceil(4));
    }

    #[test]
    fn completion_bodies() {
        let t = body(serde_json::json!({"prompt": "hello"}));
        let t = RequestTexts::of_body(&t);
        assert_eq!((t.texts.as_slice(), t.messages), (&["hello"][..], 1));
        let many = body(serde_json::json!({"prompt": ["a", "b", [1, 2]]}));
        let t = RequestTexts::of_body(&many);
        assert_eq!((t.texts.as_slice(), t.messages), (&["a", "b"][..], 3));
        let other = body(serde_json::json!({"input": "x"}));
        assert_eq!(RequestTexts::of_body(&other), RequestTexts::default());
    }
}
