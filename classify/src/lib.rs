//! Request classifiers for kvroute's policies: labels that `InferencePolicy` rules match on.
//! Pure (no I/O, no clocks, no allocation on the hot path): the router hands over a request's
//! message texts and token counts and gets a `Copy` set of labels back.
//!
//! ```text
//! ClassifyInput { texts, prompt_tokens, max_tokens, messages }
//!        │
//!        ├─► pii::scan (one pass per text: anchors '@', digits, '`')
//!        │      └─► pii, pii:email, pii:phone, pii:iban, pii:card, pii:national-id
//!        │          + per-kind counts; code-fence count for the size classifier
//!        └─► size::SizeConfig::classify ─► size:small | size:medium | size:large
//!                                              │
//!                                     Classification { labels, pii }
//! ```
//!
//! [`RequestTexts::of_body`] borrows the texts out of an OpenAI-shaped body (chat or
//! completions). `pii_findings(text)` returns the same findings with their byte spans, for tests and
//! `kvroute explain`; nothing here stores or logs matched text. The labelled test set in
//! `testdata/pii/labelled.jsonl` and [`eval`] measure precision and recall.

pub mod checksum;
pub mod eval;
mod labels;
mod pii;
mod size;
mod texts;

pub use labels::{Label, Labels};
pub use pii::{Finding, PiiConfig, PiiCounts, PiiKind, pii_findings};
pub use size::{SizeConfig, SizeSignals};
pub use texts::RequestTexts;

/// Classifier configuration: which PII kinds to report and the size thresholds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassifierConfig {
    /// PII kinds to report (all by default).
    pub pii: PiiConfig,
    /// Size thresholds.
    pub size: SizeConfig,
}

/// What the classifiers see of a request.
#[derive(Clone, Copy, Debug)]
pub struct ClassifyInput<'a> {
    /// Message contents in order (the prompt alone for completions).
    pub texts: &'a [&'a str],
    /// Prompt tokens as the router tokenised them, or
    /// [`RequestTexts::estimated_tokens`] before tokenisation.
    pub prompt_tokens: usize,
    /// The request's output cap, if it set one.
    pub max_tokens: Option<u32>,
    /// Number of messages.
    pub messages: usize,
}

/// The classifiers' result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Classification {
    /// Labels: `pii` and its kinds when any PII was found, and exactly one `size:*`.
    pub labels: Labels,
    /// PII findings per kind (counts only).
    pub pii: PiiCounts,
}

/// The classifiers, configured once and shared (`Send + Sync`, no interior state).
#[derive(Clone, Copy, Debug, Default)]
pub struct Classifier {
    config: ClassifierConfig,
}

impl Classifier {
    /// A classifier with this configuration.
    pub fn new(config: ClassifierConfig) -> Self {
        Classifier { config }
    }

    /// The configuration.
    pub fn config(&self) -> &ClassifierConfig {
        &self.config
    }

    /// Labels a request: PII over every text, then its size.
    pub fn classify(&self, input: &ClassifyInput<'_>) -> Classification {
        let mut counts = PiiCounts::default();
        let mut fences = 0;
        for text in input.texts {
            let stats = pii::scan(text, &self.config.pii, |kind, _, _| {
                counts.0[kind as usize] += 1;
            });
            fences += stats.fences;
        }
        let mut labels = pii_labels(&counts);
        let signals = SizeSignals {
            prompt_tokens: input.prompt_tokens,
            max_tokens: input.max_tokens,
            messages: input.messages,
            code_blocks: fences.div_ceil(2),
            last_message_bytes: input.texts.last().map_or(0, |t| t.len()),
        };
        labels.insert(self.config.size.classify(&signals));
        Classification {
            labels,
            pii: counts,
        }
    }

    /// The PII labels of one text alone (no size label).
    pub fn pii_labels(&self, text: &str) -> Labels {
        let mut counts = PiiCounts::default();
        pii::scan(text, &self.config.pii, |kind, _, _| {
            counts.0[kind as usize] += 1;
        });
        pii_labels(&counts)
    }
}

fn pii_labels(counts: &PiiCounts) -> Labels {
    let mut labels = Labels::EMPTY;
    for kind in PiiKind::ALL {
        if counts.get(kind) > 0 {
            labels.insert(Label::Pii);
            labels.insert(kind.label());
        }
    }
    labels
}

#[cfg(test)]
mod tests;
