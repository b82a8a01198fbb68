//! Precision and recall of the PII labeller on a labelled set: one JSON object a line,
//! `{"text": "...", "labels": ["pii", "pii:email"], "note": "..."}` (`note` optional, for
//! people). A sample's true labels are its `labels`; the predicted ones come from
//! [`Classifier::pii_labels`](crate::Classifier::pii_labels). Each PII label is scored over
//! all samples (a true positive is a sample that has it and is predicted to have it).
//!
//! `cargo run -p kvroute-classify --example eval [-- FILE]` prints the table.

use std::fmt;

use serde::Deserialize;

use crate::{Classifier, Label};

/// One labelled text.
#[derive(Clone, Debug, Deserialize)]
pub struct Sample {
    /// The text.
    pub text: String,
    /// Its true PII labels.
    #[serde(default)]
    pub labels: Vec<String>,
    /// Why it is in the set.
    #[serde(default)]
    pub note: Option<String>,
}

/// A line of the set that is not a sample.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub reason: String,
}

/// Parses a JSONL set (blank lines and lines starting with `#` are skipped). Unknown label
/// names are refused, so a typo cannot silently count as a negative.
pub fn parse_set(jsonl: &str) -> Result<Vec<Sample>, ParseError> {
    let mut out = Vec::new();
    for (k, line) in jsonl.lines().enumerate() {
        let line_no = k + 1;
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let sample: Sample = serde_json::from_str(trimmed).map_err(|e| ParseError {
            line: line_no,
            reason: e.to_string(),
        })?;
        if let Some(bad) = sample
            .labels
            .iter()
            .find(|l| !PII_LABELS.iter().any(|p| p.name() == l.as_str()))
        {
            return Err(ParseError {
                line: line_no,
                reason: format!("unknown label {bad:?}"),
            });
        }
        out.push(sample);
    }
    Ok(out)
}

/// The labels the set scores.
pub const PII_LABELS: [Label; 6] = [
    Label::Pii,
    Label::PiiEmail,
    Label::PiiPhone,
    Label::PiiIban,
    Label::PiiCard,
    Label::PiiNationalId,
];

/// Confusion counts of one label.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Score {
    /// Predicted and true.
    pub tp: usize,
    /// Predicted, not true.
    pub fp: usize,
    /// True, not predicted.
    pub fn_: usize,
}

impl Score {
    /// tp / (tp + fp); 1 when nothing was predicted.
    pub fn precision(&self) -> f64 {
        ratio(self.tp, self.tp + self.fp)
    }
    /// tp / (tp + fn); 1 when nothing was true.
    pub fn recall(&self) -> f64 {
        ratio(self.tp, self.tp + self.fn_)
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 { 1.0 } else { a as f64 / b as f64 }
}

/// Scores per label, and the samples that were wrong (by index).
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Samples scored.
    pub samples: usize,
    /// One score per [`PII_LABELS`] entry.
    pub scores: [Score; 6],
    /// (sample index, label, predicted) for each miss or false alarm.
    pub errors: Vec<(usize, Label, bool)>,
}

impl Report {
    /// The score of one label.
    pub fn score(&self, label: Label) -> Score {
        PII_LABELS
            .iter()
            .position(|l| *l == label)
            .map(|k| self.scores[k])
            .unwrap_or_default()
    }
}

/// Scores the classifier on the samples.
pub fn evaluate(classifier: &Classifier, samples: &[Sample]) -> Report {
    let mut report = Report {
        samples: samples.len(),
        ..Report::default()
    };
    for (idx, s) in samples.iter().enumerate() {
        let predicted = classifier.pii_labels(&s.text);
        for (k, label) in PII_LABELS.iter().enumerate() {
            let truth = s.labels.iter().any(|l| l == label.name());
            let pred = predicted.has(*label);
            let score = &mut report.scores[k];
            match (truth, pred) {
                (true, true) => score.tp += 1,
                (false, true) => score.fp += 1,
                (true, false) => score.fn_ += 1,
                (false, false) => {}
            }
            if truth != pred {
                report.errors.push((idx, *label, pred));
            }
        }
    }
    report
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} samples", self.samples)?;
        writeln!(
            f,
            "| label | true | predicted | tp | fp | fn | precision | recall |"
        )?;
        writeln!(f, "|---|---:|---:|---:|---:|---:|---:|---:|")?;
        for (label, s) in PII_LABELS.iter().zip(&self.scores) {
            writeln!(
                f,
                "| `{}` | {} | {} | {} | {} | {} | {:.3} | {:.3} |",
                label.name(),
                s.tp + s.fn_,
                s.tp + s.fp,
                s.tp,
                s.fp,
                s.fn_,
                s.precision(),
                s.recall()
            )?;
        }
        Ok(())
    }
}
