//! A request's labels for policy rules: the classifiers' (`pii`, `pii:<kind>`, `size:<class>`,
//! crate `kvroute-classify`) over the prompt's text, plus the labels a client adds with
//! `x-kvroute-labels: a,b` (a client can add labels, never remove the classifiers'). Computed
//! once per decision inside the one decision path, so the gateway, the Pick API and explain
//! label alike. A Pick request that carries token ids instead of text has no text to classify:
//! only its header labels count.
//!
//! Metrics count the classifier labels only (a fixed set); client-added labels never become
//! a metric label.

use kvroute_classify::{Classifier, ClassifierConfig, ClassifyInput, Label, Labels, RequestTexts};

use super::pick::{PickInput, Prompt};

/// The header a client adds labels with.
pub const LABELS_HEADER: &str = "x-kvroute-labels";

/// Most labels a client may add (the rest are ignored).
const MAX_CLIENT_LABELS: usize = 16;

/// Longest client label, bytes.
const MAX_LABEL_LEN: usize = 63;

/// The labels of one request.
#[derive(Debug, Default)]
pub(crate) struct RequestLabels<'a> {
    /// The classifiers' labels.
    pub classified: Labels,
    /// Every label: the caller's own (`PickInput::labels`), the classifiers', the header's.
    pub all: Vec<&'a str>,
}

/// The router's classifier (default thresholds, docs/control-plane.md "Classifiers").
pub(crate) fn classifier() -> Classifier {
    Classifier::new(ClassifierConfig::default())
}

/// Labels `input`.
pub(crate) fn label<'a>(classifier: &Classifier, input: &PickInput<'a>) -> RequestLabels<'a> {
    let texts = match input.prompt {
        Prompt::Chat(body) => RequestTexts::of_body(body),
        Prompt::Completion(prompt) => completion_texts(prompt),
        Prompt::Tokens(_) | Prompt::Unavailable => RequestTexts::default(),
    };
    let classified = if texts.texts.is_empty() {
        Labels::default()
    } else {
        classifier
            .classify(&ClassifyInput {
                texts: &texts.texts,
                prompt_tokens: texts.estimated_tokens(),
                max_tokens: input.max_tokens,
                messages: texts.messages,
            })
            .labels
    };
    let mut all: Vec<&'a str> = input.labels.to_vec();
    all.extend(classified.iter_names().map(|l| -> &'a str { l }));
    if let Some(headers) = input.headers {
        let added = headers
            .get_all(LABELS_HEADER)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|l| valid_label(l))
            .take(MAX_CLIENT_LABELS);
        all.extend(added);
    }
    all.sort_unstable();
    all.dedup();
    RequestLabels { classified, all }
}

/// The texts of a completions `prompt` (a string or strings; token ids have none).
fn completion_texts(prompt: &serde_json::Value) -> RequestTexts<'_> {
    let mut out = RequestTexts::default();
    match prompt {
        serde_json::Value::String(s) => {
            out.messages = 1;
            out.texts.push(s);
        }
        serde_json::Value::Array(items) => {
            out.messages = items.len();
            out.texts
                .extend(items.iter().filter_map(serde_json::Value::as_str));
        }
        _ => {}
    }
    out
}

/// A client label: lowercase letters, digits, `-`, `_`, `.`, `:`; 1 to 63 bytes.
fn valid_label(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= MAX_LABEL_LEN
        && l.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.' | b':')
        })
}

/// Every classifier label's name (the metric label values).
pub(crate) fn classifier_label_names() -> impl Iterator<Item = &'static str> {
    Label::ALL.iter().map(|l| l.name())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::pick::{BodyKind, PickInput};

    #[test]
    fn classifier_and_header_labels_merge() {
        let body = serde_json::json!({"model": "m", "messages": [
            {"role": "user", "content": "mail me at jane.doe@example.org please"}]});
        let body = body.as_object().expect("object");
        let mut headers = http::HeaderMap::new();
        headers.insert(
            LABELS_HEADER,
            "team-x, BAD LABEL ,pii".parse().expect("value"),
        );
        let input = PickInput::from_body("m", BodyKind::Chat, body, Some(&headers), &[]);
        let l = label(&classifier(), &input);
        assert!(l.classified.contains("pii:email"), "{:?}", l.all);
        assert!(l.all.contains(&"pii") && l.all.contains(&"pii:email"));
        assert!(l.all.contains(&"team-x"));
        assert!(!l.all.iter().any(|x| x.contains(' ') || x.contains("BAD")));
        assert!(l.all.iter().any(|x| x.starts_with("size:")));
        // Sorted and unique: `pii` came from both.
        assert_eq!(l.all.iter().filter(|x| **x == "pii").count(), 1);
    }

    #[test]
    fn token_prompts_have_only_header_labels() {
        let ids = [1u32, 2, 3];
        let empty = serde_json::Map::new();
        let input = PickInput {
            prompt: Prompt::Tokens(&ids),
            ..PickInput::from_body("m", BodyKind::Other, &empty, None, &[])
        };
        let l = label(&classifier(), &input);
        assert!(l.all.is_empty());
    }
}
